# The public names of ``pycudnn.highlevel`` (and, through ``from .highlevel import *``, of
# ``pycudnn``), declared once. Type checkers read this stub; ``pycudnn/highlevel/__init__.py``
# imports each name from the module named here (``pycudnn._exports``). Add a public name here only.

from .activation import dnn_activation as dnn_activation, dnn_activation_grad as dnn_activation_grad
from .attention import (
    dnn_sdpa as dnn_sdpa,
    dnn_sdpa_grad as dnn_sdpa_grad,
    dnn_sdpa_paged as dnn_sdpa_paged,
    dnn_sdpa_varlen as dnn_sdpa_varlen,
    dnn_sdpa_varlen_grad as dnn_sdpa_varlen_grad,
)
from .batchnorm import (
    dnn_batch_normalization_grad as dnn_batch_normalization_grad,
    dnn_batch_normalization_test as dnn_batch_normalization_test,
    dnn_batch_normalization_train as dnn_batch_normalization_train,
)
from .batchnorm_act import (
    batch_normalization_act_reserve_size as batch_normalization_act_reserve_size,
    dnn_batch_normalization_act_grad as dnn_batch_normalization_act_grad,
    dnn_batch_normalization_act_train as dnn_batch_normalization_act_train,
)
from .conv import (
    dnn_conv as dnn_conv,
    dnn_conv3d as dnn_conv3d,
    dnn_gradinput as dnn_gradinput,
    dnn_gradinput3d as dnn_gradinput3d,
    dnn_gradweight as dnn_gradweight,
    dnn_gradweight3d as dnn_gradweight3d,
)
from .ctc import dnn_ctc_loss as dnn_ctc_loss
from .dropout import (
    DropoutState as DropoutState,
    dnn_dropout as dnn_dropout,
    dnn_dropout_grad as dnn_dropout_grad,
    dropout_mask_bytes as dropout_mask_bytes,
)
from .lrn import dnn_lrn as dnn_lrn, dnn_lrn_grad as dnn_lrn_grad
from .matmul import dnn_matmul as dnn_matmul
from .norms import (
    dnn_layer_norm as dnn_layer_norm,
    dnn_layer_norm_grad as dnn_layer_norm_grad,
    dnn_rms_norm as dnn_rms_norm,
    dnn_rms_norm_grad as dnn_rms_norm_grad,
)
from .pool import dnn_pool as dnn_pool, dnn_pool_grad as dnn_pool_grad
from .reduction import dnn_reduction as dnn_reduction
from .rnn import RNNBlock as RNNBlock
from .rnn_layout import (
    canonical_rnn_layout as canonical_rnn_layout,
    rnn_weights_from_torch as rnn_weights_from_torch,
    rnn_weights_to_torch as rnn_weights_to_torch,
    torch_rnn_param_names as torch_rnn_param_names,
)
from .softmax import dnn_softmax as dnn_softmax, dnn_softmax_grad as dnn_softmax_grad
from .spatialtf import (
    dnn_spatialtf as dnn_spatialtf,
    dnn_spatialtf_grad as dnn_spatialtf_grad,
    dnn_spatialtf_grid as dnn_spatialtf_grid,
    dnn_spatialtf_grid_grad as dnn_spatialtf_grid_grad,
    dnn_spatialtf_sampler as dnn_spatialtf_sampler,
    dnn_spatialtf_sampler_grad as dnn_spatialtf_sampler_grad,
)
from .tensor_ops import dnn_add_tensor as dnn_add_tensor, dnn_op_tensor as dnn_op_tensor

def clear_caches() -> None: ...
