# The public names of ``pycudnn.jax``, declared once. Type checkers read this stub;
# ``pycudnn/jax/__init__.py`` derives its lazy table, ``__all__`` and ``dir()`` from it
# (``pycudnn._exports``), checking on the first use of a name that JAX is installed.

from ._activation import (
    activation as activation,
    elu as elu,
    relu as relu,
    relu6 as relu6,
    sigmoid as sigmoid,
    silu as silu,
    tanh as tanh,
)
from ._attention import dot_product_attention as dot_product_attention
from ._batchnorm import batch_norm as batch_norm
from ._capture import use_command_buffers as use_command_buffers
from ._conv import conv as conv
from ._ctc import ctc_loss as ctc_loss
from ._dropout import dropout as dropout
from ._frame import (
    Buffer as Buffer,
    Call as Call,
    DeviceBuffer as DeviceBuffer,
    HostBuffer as HostBuffer,
)
from ._graph import (
    Port as Port,
    graph_call as graph_call,
    graph_io as graph_io,
    register_graph as register_graph,
    release_graph as release_graph,
)
from ._handler import (
    FfiTarget as FfiTarget,
    check_abi as check_abi,
    ffi_call as ffi_call,
    register_handler as register_handler,
    registered_targets as registered_targets,
)
from ._header import AbiReport as AbiReport, UnsupportedJaxlibError as UnsupportedJaxlibError
from ._lrn import lrn as lrn
from ._matmul import matmul as matmul
from ._norms import layer_norm as layer_norm, rms_norm as rms_norm
from ._pooling import avg_pool as avg_pool, max_pool as max_pool
from ._rnn import (
    rnn as rnn,
    rnn_pack_weights as rnn_pack_weights,
    rnn_unpack_weights as rnn_unpack_weights,
    rnn_weight_size as rnn_weight_size,
    rnn_weights_from_flax as rnn_weights_from_flax,
)
from ._softmax import log_softmax as log_softmax, softmax as softmax
from ._spatialtf import (
    affine_grid as affine_grid,
    grid_sample as grid_sample,
    spatial_transformer as spatial_transformer,
)

def is_available() -> bool: ...
