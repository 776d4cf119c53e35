"""pycudnn: the Python binding of NVIDIA cuDNN 9.x.

Three layers, each usable on its own: ``pycudnn.lib`` (the generated raw C API) with
``pycudnn.api`` (the same functions, checked) and ``pycudnn.enums``; the descriptor layer
(``TensorDescriptor``, ...); and the Theano-style high-level layer (``dnn_conv``, ...).

Importing this package loads nothing: libcudnn is found and opened on first use, and the public
names below are resolved lazily from their modules. ``python -m pycudnn`` prints what was found.
"""

from __future__ import annotations

import importlib

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
    "highlevel": ".highlevel",
}

__all__ = ["__version__", *_EXPORTS, *_SUBMODULES]


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
