"""The high-level layer: eager functions modelled on Theano's ``theano.gpuarray.dnn``.

One module per family, all on the shared call path: :mod:`._operand` (operands and call keys),
:mod:`._checks` (validation), :mod:`._call` (one call protocol, outputs, the per-thread call cache
and one cache-and-run helper), :mod:`._staging` (descriptors per layout, staged copies):

- :mod:`.conv` -- ``dnn_conv``, ``dnn_conv3d``, ``dnn_gradinput``, ``dnn_gradinput3d``,
  ``dnn_gradweight``, ``dnn_gradweight3d`` (graph-API plans, :mod:`pycudnn.graph._plans`);
- :mod:`.pool` -- ``dnn_pool``, ``dnn_pool_grad``;
- :mod:`.batchnorm` -- ``dnn_batch_normalization_train``, ``dnn_batch_normalization_test``,
  ``dnn_batch_normalization_grad``;
- :mod:`.batchnorm_act` -- ``dnn_batch_normalization_act_train``,
  ``dnn_batch_normalization_act_grad`` (batch norm with a fused ReLU and residual addition),
  ``batch_normalization_act_reserve_size``;
- :mod:`.activation` -- ``dnn_activation``, ``dnn_activation_grad``;
- :mod:`.softmax` -- ``dnn_softmax``, ``dnn_softmax_grad``;
- :mod:`.tensor_ops` -- ``dnn_add_tensor``, ``dnn_op_tensor``;
- :mod:`.dropout` -- ``dnn_dropout``, ``dnn_dropout_grad`` and their ``DropoutState``;
- :mod:`.spatialtf` -- ``dnn_spatialtf`` and its grid/sampler pieces, with gradients;
- :mod:`.reduction` -- ``dnn_reduction``;
- :mod:`.lrn` -- ``dnn_lrn``, ``dnn_lrn_grad``;
- :mod:`.ctc` -- ``dnn_ctc_loss``;
- :mod:`.matmul` -- ``dnn_matmul`` (with a fused bias and activation);
- :mod:`.norms` -- ``dnn_layer_norm``, ``dnn_rms_norm`` and their ``_grad``s;
- :mod:`.attention` -- ``dnn_sdpa``, ``dnn_sdpa_grad`` (cuDNN's fused flash attention),
  ``dnn_sdpa_varlen``, ``dnn_sdpa_varlen_grad`` (packed variable-length sequences) and
  ``dnn_sdpa_paged`` (attention over a paged KV cache): a package around one frozen request
  (:mod:`.sdpa`, :mod:`.sdpa_varlen` and :mod:`.sdpa_paged` keep the first module paths);
- :mod:`.rnn` -- ``RNNBlock`` (the v8 RNN API), with the weight-layout converters of
  :mod:`.rnn_layout` (``rnn_weights_from_torch``, ``rnn_weights_to_torch``,
  ``canonical_rnn_layout``, ``torch_rnn_param_names``).

:func:`clear_caches` empties every cache of the layer (plans, call entries, descriptors, and the
device arrays launches read: ALiBi slopes, packed lengths, filled vectors).
"""

from __future__ import annotations

from .. import _exports
from ..graph import _plans

# the names are declared once, in __init__.pyi (what type checkers read); every module it names is
# imported now, in its order, as plain imports would
_exports.attach_stub(globals(), eager=True)  # also sets __all__


def clear_caches() -> None:
    """Drop every cached plan, variant pack, call entry and descriptor of the high-level layer
    (all threads), and the device arrays its launches read (once the work queued on their
    devices finished). The next call of each operation validates and searches again."""
    _plans.clear_caches()
