"""pycudnn: the Python binding of NVIDIA cuDNN 9.x.

Three layers, each usable on its own: ``pycudnn.lib`` (the generated raw C API) with
``pycudnn.api`` (the same functions, checked) and ``pycudnn.enums``; the descriptor layer
(``TensorDescriptor``, ...); and the Theano-style high-level layer (``dnn_conv``, ...).

Importing this package loads nothing: libcudnn is found and opened on first use, and the public
names below are resolved lazily from their modules. ``python -m pycudnn`` prints what was found.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ._version import __version__

# public name -> module that defines it (resolved on first access; see __getattr__)
_EXPORTS: dict[str, str] = {
    # library, versions, diagnostics
    "version": "._info",
    "header_version": "._info",
    "cudart_version": "._info",
    "library_info": "._info",
    "LibraryInfo": "._info",
    "is_available": "._info",
    "show_config": "._info",
    "enable_logging": "._logging",
    "disable_logging": "._logging",
    # exceptions
    "CudnnError": ".errors",
    "BadParamError": ".errors",
    "NotSupportedError": ".errors",
    "InternalError": ".errors",
    "AllocationError": ".errors",
    "ArgumentTypeError": ".errors",
    "ArgumentValueError": ".errors",
    "ExecutionFailedError": ".errors",
    "SublibraryError": ".errors",
    "LibraryNotFoundError": ".errors",
    "SymbolNotFoundError": ".errors",
    "VersionMismatchError": ".errors",
    "CudnnDeprecationWarning": ".errors",
    # descriptor layer
    "TensorDescriptor": ".descriptors",
    "FilterDescriptor": ".descriptors",
    "ConvolutionDescriptor": ".descriptors",
    "PoolingDescriptor": ".descriptors",
    "ActivationDescriptor": ".descriptors",
    "LRNDescriptor": ".descriptors",
    "OpTensorDescriptor": ".descriptors",
    "ReduceTensorDescriptor": ".descriptors",
    "DropoutDescriptor": ".descriptors",
    "RNNDescriptor": ".descriptors",
    "RNNDataDescriptor": ".descriptors",
    "SpatialTransformerDescriptor": ".descriptors",
    "CTCLossDescriptor": ".descriptors",
    "BackendDescriptor": ".descriptors",
    # device runtime
    "Handle": ".handle",
    "get_handle": ".handle",
    "DeviceArray": ".memory",
    "to_device": ".memory",
    "empty": ".memory",
    "zeros": ".memory",
    "asarray": ".memory",
    "config": "._config",
}
# the high-level layer: every name of pycudnn.highlevel.__all__ (a test checks they agree)
_HIGHLEVEL = (
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
)
_EXPORTS.update(dict.fromkeys(_HIGHLEVEL, ".highlevel"))
# submodules reachable as attributes: pycudnn.lib is the public name of the generated _lib
_SUBMODULES = {
    "lib": "._lib",
    "api": ".api",
    "enums": ".enums",
    "errors": ".errors",
    "descriptors": ".descriptors",
    "handle": ".handle",
    "memory": ".memory",
    "graph": ".graph",
    "highlevel": ".highlevel",
}

__all__ = ["__version__", *_EXPORTS, *_SUBMODULES]

if TYPE_CHECKING:  # what a type checker sees of the lazily resolved names (kept equal to
    # the tables above by tests/tooling/test_typing.py)
    from . import (
        api as api,
        descriptors as descriptors,
        enums as enums,
        errors as errors,
        graph as graph,
        handle as handle,
        highlevel as highlevel,
        lib as lib,
        memory as memory,
    )
    from ._config import (
        config as config,
    )
    from ._info import (
        LibraryInfo as LibraryInfo,
        cudart_version as cudart_version,
        header_version as header_version,
        is_available as is_available,
        library_info as library_info,
        show_config as show_config,
        version as version,
    )
    from ._logging import (
        disable_logging as disable_logging,
        enable_logging as enable_logging,
    )
    from .descriptors import (
        ActivationDescriptor as ActivationDescriptor,
        BackendDescriptor as BackendDescriptor,
        ConvolutionDescriptor as ConvolutionDescriptor,
        CTCLossDescriptor as CTCLossDescriptor,
        DropoutDescriptor as DropoutDescriptor,
        FilterDescriptor as FilterDescriptor,
        LRNDescriptor as LRNDescriptor,
        OpTensorDescriptor as OpTensorDescriptor,
        PoolingDescriptor as PoolingDescriptor,
        ReduceTensorDescriptor as ReduceTensorDescriptor,
        RNNDataDescriptor as RNNDataDescriptor,
        RNNDescriptor as RNNDescriptor,
        SpatialTransformerDescriptor as SpatialTransformerDescriptor,
        TensorDescriptor as TensorDescriptor,
    )
    from .errors import (
        AllocationError as AllocationError,
        ArgumentTypeError as ArgumentTypeError,
        ArgumentValueError as ArgumentValueError,
        BadParamError as BadParamError,
        CudnnDeprecationWarning as CudnnDeprecationWarning,
        CudnnError as CudnnError,
        ExecutionFailedError as ExecutionFailedError,
        InternalError as InternalError,
        LibraryNotFoundError as LibraryNotFoundError,
        NotSupportedError as NotSupportedError,
        SublibraryError as SublibraryError,
        SymbolNotFoundError as SymbolNotFoundError,
        VersionMismatchError as VersionMismatchError,
    )
    from .handle import (
        Handle as Handle,
        get_handle as get_handle,
    )
    from .highlevel import (
        DropoutState as DropoutState,
        RNNBlock as RNNBlock,
        canonical_rnn_layout as canonical_rnn_layout,
        clear_caches as clear_caches,
        dnn_activation as dnn_activation,
        dnn_activation_grad as dnn_activation_grad,
        dnn_add_tensor as dnn_add_tensor,
        dnn_batch_normalization_grad as dnn_batch_normalization_grad,
        dnn_batch_normalization_test as dnn_batch_normalization_test,
        dnn_batch_normalization_train as dnn_batch_normalization_train,
        dnn_conv as dnn_conv,
        dnn_conv3d as dnn_conv3d,
        dnn_ctc_loss as dnn_ctc_loss,
        dnn_dropout as dnn_dropout,
        dnn_layer_norm as dnn_layer_norm,
        dnn_layer_norm_grad as dnn_layer_norm_grad,
        dnn_matmul as dnn_matmul,
        dnn_rms_norm as dnn_rms_norm,
        dnn_rms_norm_grad as dnn_rms_norm_grad,
        dnn_sdpa as dnn_sdpa,
        dnn_sdpa_grad as dnn_sdpa_grad,
        dnn_dropout_grad as dnn_dropout_grad,
        dnn_gradinput as dnn_gradinput,
        dnn_gradinput3d as dnn_gradinput3d,
        dnn_gradweight as dnn_gradweight,
        dnn_gradweight3d as dnn_gradweight3d,
        dnn_lrn as dnn_lrn,
        dnn_lrn_grad as dnn_lrn_grad,
        dnn_op_tensor as dnn_op_tensor,
        dnn_pool as dnn_pool,
        dnn_pool_grad as dnn_pool_grad,
        dnn_reduction as dnn_reduction,
        dnn_softmax as dnn_softmax,
        dnn_softmax_grad as dnn_softmax_grad,
        dnn_spatialtf as dnn_spatialtf,
        dnn_spatialtf_grad as dnn_spatialtf_grad,
        dnn_spatialtf_grid as dnn_spatialtf_grid,
        dnn_spatialtf_grid_grad as dnn_spatialtf_grid_grad,
        dnn_spatialtf_sampler as dnn_spatialtf_sampler,
        dnn_spatialtf_sampler_grad as dnn_spatialtf_sampler_grad,
        rnn_weights_from_torch as rnn_weights_from_torch,
        rnn_weights_to_torch as rnn_weights_to_torch,
        torch_rnn_param_names as torch_rnn_param_names,
    )
    from .memory import (
        DeviceArray as DeviceArray,
        asarray as asarray,
        empty as empty,
        to_device as to_device,
        zeros as zeros,
    )


def __getattr__(name: str):
    if name in _SUBMODULES:
        value = importlib.import_module(_SUBMODULES[name], __name__)
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    else:
        raise AttributeError(f"module 'pycudnn' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
