# The public surface of ``pycudnn``, declared once. Type checkers read this stub; at import,
# ``pycudnn/__init__.py`` derives its lazy table, ``__all__`` and ``dir()`` from it
# (``pycudnn._exports``). Add or move a public name here, nowhere else. The high-level names are
# those that ``pycudnn/highlevel/__init__.pyi`` declares.

from ._version import __version__ as __version__

# library, versions, diagnostics
from ._info import (
    version as version,
    header_version as header_version,
    cudart_version as cudart_version,
    library_info as library_info,
    LibraryInfo as LibraryInfo,
    is_available as is_available,
    show_config as show_config,
)
from ._logging import enable_logging as enable_logging, disable_logging as disable_logging

# exceptions
from .errors import (
    CudnnError as CudnnError,
    BadParamError as BadParamError,
    NotSupportedError as NotSupportedError,
    InternalError as InternalError,
    AllocationError as AllocationError,
    OutOfMemoryError as OutOfMemoryError,
    StreamCaptureError as StreamCaptureError,
    ArgumentTypeError as ArgumentTypeError,
    ArgumentValueError as ArgumentValueError,
    ExecutionFailedError as ExecutionFailedError,
    SublibraryError as SublibraryError,
    LibraryNotFoundError as LibraryNotFoundError,
    SymbolNotFoundError as SymbolNotFoundError,
    VersionMismatchError as VersionMismatchError,
    CudnnDeprecationWarning as CudnnDeprecationWarning,
)

# descriptor layer
from .descriptors import (
    TensorDescriptor as TensorDescriptor,
    FilterDescriptor as FilterDescriptor,
    ConvolutionDescriptor as ConvolutionDescriptor,
    PoolingDescriptor as PoolingDescriptor,
    ActivationDescriptor as ActivationDescriptor,
    LRNDescriptor as LRNDescriptor,
    OpTensorDescriptor as OpTensorDescriptor,
    ReduceTensorDescriptor as ReduceTensorDescriptor,
    DropoutDescriptor as DropoutDescriptor,
    RNNDescriptor as RNNDescriptor,
    RNNDataDescriptor as RNNDataDescriptor,
    SpatialTransformerDescriptor as SpatialTransformerDescriptor,
    CTCLossDescriptor as CTCLossDescriptor,
    BackendDescriptor as BackendDescriptor,
)

# device runtime
from .handle import Handle as Handle, get_handle as get_handle
from .memory import (
    DeviceArray as DeviceArray,
    to_device as to_device,
    empty as empty,
    zeros as zeros,
    asarray as asarray,
)
from ._config import config as config

# the high-level layer: every name of pycudnn.highlevel
from .highlevel import *  # noqa: F403

# submodules (pycudnn.lib is the public face of the generated raw layer)
from . import (
    lib as lib,
    api as api,
    enums as enums,
    errors as errors,
    descriptors as descriptors,
    handle as handle,
    memory as memory,
    graph as graph,
    highlevel as highlevel,
)
