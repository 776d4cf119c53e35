"""The high-level layer: eager functions modelled on Theano's ``theano.gpuarray.dnn``.

One module per family, all on the shared call path: :mod:`._operand` (operands and call keys),
:mod:`._checks` (validation), :mod:`._call` (one call protocol, outputs, the per-thread call cache
and one cache-and-run helper), :mod:`._staging` (descriptors per layout, staged copies):

- :mod:`.conv` -- ``dnn_conv``, ``dnn_conv3d``, ``dnn_gradinput``, ``dnn_gradinput3d``,
  ``dnn_gradweight``, ``dnn_gradweight3d`` (graph-API plans, :mod:`pycudnn.graph._plans`);
- :mod:`.pool` -- ``dnn_pool``, ``dnn_pool_grad``;
- :mod:`.batchnorm` -- ``dnn_batch_normalization_train``, ``dnn_batch_normalization_test``,
  ``dnn_batch_normalization_grad``;
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
- :mod:`.sdpa` -- ``dnn_sdpa``, ``dnn_sdpa_grad`` (cuDNN's fused flash attention);
- :mod:`.rnn` -- ``RNNBlock`` (the v8 RNN API), with the weight-layout converters of
  :mod:`.rnn_layout` (``rnn_weights_from_torch``, ``rnn_weights_to_torch``,
  ``canonical_rnn_layout``, ``torch_rnn_param_names``).

:func:`clear_caches` empties every cache of the layer (plans, call entries, descriptors).
"""

from __future__ import annotations

from ..graph import _plans
from .activation import dnn_activation, dnn_activation_grad
from .batchnorm import (
    dnn_batch_normalization_grad,
    dnn_batch_normalization_test,
    dnn_batch_normalization_train,
)
from .conv import (
    dnn_conv,
    dnn_conv3d,
    dnn_gradinput,
    dnn_gradinput3d,
    dnn_gradweight,
    dnn_gradweight3d,
)
from .ctc import dnn_ctc_loss
from .dropout import DropoutState, dnn_dropout, dnn_dropout_grad
from .lrn import dnn_lrn, dnn_lrn_grad
from .matmul import dnn_matmul
from .norms import dnn_layer_norm, dnn_layer_norm_grad, dnn_rms_norm, dnn_rms_norm_grad
from .pool import dnn_pool, dnn_pool_grad
from .reduction import dnn_reduction
from .rnn import RNNBlock
from .rnn_layout import (
    canonical_rnn_layout,
    rnn_weights_from_torch,
    rnn_weights_to_torch,
    torch_rnn_param_names,
)
from .sdpa import dnn_sdpa, dnn_sdpa_grad
from .softmax import dnn_softmax, dnn_softmax_grad
from .spatialtf import (
    dnn_spatialtf,
    dnn_spatialtf_grad,
    dnn_spatialtf_grid,
    dnn_spatialtf_grid_grad,
    dnn_spatialtf_sampler,
    dnn_spatialtf_sampler_grad,
)
from .tensor_ops import dnn_add_tensor, dnn_op_tensor

__all__ = [
    "DropoutState",
    "RNNBlock",
    "canonical_rnn_layout",
    "clear_caches",
    "dnn_activation",
    "dnn_activation_grad",
    "dnn_add_tensor",
    "dnn_batch_normalization_grad",
    "dnn_batch_normalization_test",
    "dnn_batch_normalization_train",
    "dnn_conv",
    "dnn_conv3d",
    "dnn_ctc_loss",
    "dnn_dropout",
    "dnn_dropout_grad",
    "dnn_gradinput",
    "dnn_gradinput3d",
    "dnn_gradweight",
    "dnn_gradweight3d",
    "dnn_lrn",
    "dnn_lrn_grad",
    "dnn_layer_norm",
    "dnn_layer_norm_grad",
    "dnn_matmul",
    "dnn_rms_norm",
    "dnn_rms_norm_grad",
    "dnn_sdpa",
    "dnn_sdpa_grad",
    "dnn_op_tensor",
    "dnn_pool",
    "dnn_pool_grad",
    "dnn_reduction",
    "dnn_softmax",
    "dnn_softmax_grad",
    "dnn_spatialtf",
    "dnn_spatialtf_grad",
    "dnn_spatialtf_grid",
    "dnn_spatialtf_grid_grad",
    "dnn_spatialtf_sampler",
    "dnn_spatialtf_sampler_grad",
    "rnn_weights_from_torch",
    "rnn_weights_to_torch",
    "torch_rnn_param_names",
]


def clear_caches() -> None:
    """Drop every cached plan, variant pack, call entry and descriptor of the high-level layer
    (all threads). The next call of each operation validates and searches again."""
    _plans.clear_caches()
