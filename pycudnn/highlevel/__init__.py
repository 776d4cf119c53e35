"""The high-level layer: eager functions modelled on Theano's ``theano.gpuarray.dnn``.

One module per family, all on the shared op path (:mod:`._op`: operands, call keys and the
per-thread call cache, validation, outputs, staging, one execute path):

- :mod:`.conv` -- ``dnn_conv``, ``dnn_conv3d``, ``dnn_gradinput``, ``dnn_gradinput3d``,
  ``dnn_gradweight``, ``dnn_gradweight3d`` (graph-API plans, :mod:`._plans`);
- :mod:`.pool` -- ``dnn_pool``, ``dnn_pool_grad``;
- :mod:`.batchnorm` -- ``dnn_batch_normalization_train``, ``dnn_batch_normalization_test``,
  ``dnn_batch_normalization_grad``;
- :mod:`.activation` -- ``dnn_activation``, ``dnn_activation_grad``;
- :mod:`.softmax` -- ``dnn_softmax``, ``dnn_softmax_grad``;
- :mod:`.tensor_ops` -- ``dnn_add_tensor``, ``dnn_op_tensor``;
- :mod:`.rnn` -- ``RNNBlock`` (the v8 RNN API), with the weight-layout converters of
  :mod:`.rnn_layout` (``rnn_weights_from_torch``, ``rnn_weights_to_torch``,
  ``canonical_rnn_layout``, ``torch_rnn_param_names``).

:func:`clear_caches` empties every cache of the layer (plans, call entries, descriptors).
"""

from __future__ import annotations

from . import _plans
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
from .pool import dnn_pool, dnn_pool_grad
from .rnn import RNNBlock
from .rnn_layout import (
    canonical_rnn_layout,
    rnn_weights_from_torch,
    rnn_weights_to_torch,
    torch_rnn_param_names,
)
from .softmax import dnn_softmax, dnn_softmax_grad
from .tensor_ops import dnn_add_tensor, dnn_op_tensor

__all__ = [
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
    "dnn_gradinput",
    "dnn_gradinput3d",
    "dnn_gradweight",
    "dnn_gradweight3d",
    "dnn_op_tensor",
    "dnn_pool",
    "dnn_pool_grad",
    "dnn_softmax",
    "dnn_softmax_grad",
    "rnn_weights_from_torch",
    "rnn_weights_to_torch",
    "torch_rnn_param_names",
]


def clear_caches() -> None:
    """Drop every cached plan, variant pack, call entry and descriptor of the high-level layer
    (all threads). The next call of each operation validates and searches again."""
    _plans.clear_caches()
