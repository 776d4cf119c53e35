"""cuDNN status codes as Python exceptions, the checked-call namespace, and every other
exception pycudnn raises of its own (CUDA failures, no GPU, not device memory).

cuDNN 9 status codes are hierarchical: the category is ``code // 1000 * 1000`` (1000
uncategorised/sub-library, 2000 bad parameter, 3000 not supported, 4000 internal, 5000 execution
failed). Each category has an exception class that also derives from the matching builtin, so
``except ValueError`` catches a ``BadParamError``; codes unknown to these bindings (a newer cuDNN)
map by their category.

``checked(name)`` builds, once per function, a ctypes function object of its own (the raw ``_lib``
objects stay raw) whose ``errcheck`` raises on a non-zero status: the success path is one integer
comparison. ``pycudnn.api.<name>`` exposes them.
"""

from __future__ import annotations

import ctypes
import threading
import warnings

from . import _lib, _loader, enums
from ._loader import LibraryNotFoundError, SymbolNotFoundError

__all__ = [
    "AllocationError",
    "BadParamError",
    "CudaError",
    "CudaUnavailableError",
    "CudnnDeprecationWarning",
    "CudnnError",
    "ExecutionFailedError",
    "InternalError",
    "LibraryNotFoundError",
    "NotDeviceMemoryError",
    "NotSupportedError",
    "SublibraryError",
    "SymbolNotFoundError",
    "VersionMismatchError",
    "check",
    "checked",
    "error_class",
    "error_for",
    "last_error_string",
    "status_name",
]


class CudnnError(Exception):
    """A cuDNN call returned a non-success status.

    Attributes
    ----------
    status : enums.Status or int
        The status (an ``int`` when this cuDNN is newer than the bindings and the code unknown).
    api : str
        The C function that failed.
    detail : str
        ``cudnnGetLastErrorString`` read when the error was raised ("" if cuDNN said nothing).
    """

    def __init__(self, status: int, api: str = "", detail: str = ""):
        try:
            status = enums.Status(status)
        except ValueError:
            status = int(status)
        self.status = status
        self.api = api
        self.detail = detail
        super().__init__(self._message())

    def _message(self) -> str:
        head = f"{self.api} failed: " if self.api else ""
        tail = f": {self.detail}" if self.detail else ""
        return f"{head}{status_name(self.status)} ({int(self.status)}){tail}"

    def __reduce__(self):
        return (type(self), (int(self.status), self.api, self.detail))


class SublibraryError(CudnnError, RuntimeError):
    """1xxx: uncategorised errors (not initialised, sub-library loading or version mismatch)."""


class BadParamError(CudnnError, ValueError):
    """2xxx: cuDNN rejected an argument."""


class NotSupportedError(CudnnError, NotImplementedError):
    """3xxx: valid, but this cuDNN/GPU cannot do it."""


class InternalError(CudnnError, RuntimeError):
    """4xxx: an error inside cuDNN."""


class AllocationError(InternalError, MemoryError):
    """4003/4004: cuDNN (or pycudnn on its behalf) could not allocate host or device memory."""


class ExecutionFailedError(CudnnError, RuntimeError):
    """5xxx: a kernel or a library cuDNN calls (CUDA, cuBLAS) failed while running."""


class VersionMismatchError(RuntimeError):
    """The loaded libcudnn cannot be used with these bindings (different major version, or a
    sub-library that does not match the dispatcher)."""


class CudnnDeprecationWarning(DeprecationWarning):
    """A ``CUDNN_DEPRECATED`` function was called through ``pycudnn.api`` (warned once each)."""


# -- CUDA (raised by pycudnn's own runtime/driver calls, never by cuDNN) ---------------------------
class CudaError(RuntimeError):
    """A CUDA runtime/driver call made by pycudnn failed.

    Attributes
    ----------
    api : str
        The CUDA function (``"cudaMemcpyAsync"``).
    code : int
        The ``cudaError_t``/``CUresult`` value.
    name : str
        Its name (``"cudaErrorInvalidValue"``).
    detail : str
        CUDA's description of the error.
    """

    def __init__(self, api: str, code: int, name: str = "", detail: str = ""):
        self.api = api
        self.code = int(code)
        self.name = name
        self.detail = detail
        text = f"{api} failed: {name or 'CUDA error'} ({self.code})"
        super().__init__(f"{text}: {detail}" if detail else text)

    def __reduce__(self):
        return (type(self), (self.api, self.code, self.name, self.detail))


class CudaUnavailableError(RuntimeError):
    """No usable CUDA GPU (no driver, no device, or cuda-python missing): pycudnn needs one here."""


class NotDeviceMemoryError(TypeError, ValueError):
    """A pointer or array is not device memory (host, unregistered, or managed unless allowed).

    Both a ``TypeError`` (wrong kind of argument) and a ``ValueError`` (bad pointer value).
    """


_BY_CATEGORY: dict[int, type[CudnnError]] = {
    1000: SublibraryError,
    2000: BadParamError,
    3000: NotSupportedError,
    4000: InternalError,
    5000: ExecutionFailedError,
}
_BY_CODE: dict[int, type[CudnnError]] = {
    enums.Status.INTERNAL_ERROR_HOST_ALLOCATION_FAILED: AllocationError,
    enums.Status.INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED: AllocationError,
}


def error_class(status: int) -> type[CudnnError]:
    """The exception class for a (non-zero) status code, known or not."""
    return _BY_CODE.get(int(status)) or _BY_CATEGORY.get(enums.category_of(status), CudnnError)


def status_name(status: int) -> str:
    """``CUDNN_STATUS_BAD_PARAM`` for 2000; ``CUDNN_STATUS_UNKNOWN`` for a code not in the enum."""
    try:
        return enums.Status(int(status)).c_name
    except ValueError:
        return "CUDNN_STATUS_UNKNOWN"


def last_error_string() -> str:
    """Read (and so clear: cuDNN hands each message out once) ``cudnnGetLastErrorString``."""
    if _loader.loaded() is None or not _lib.has("cudnnGetLastErrorString"):
        return ""
    buf = ctypes.create_string_buffer(1024)
    _lib.cudnnGetLastErrorString(buf, ctypes.sizeof(buf))
    return buf.value.decode(errors="replace").strip()


def error_for(status: int, api: str = "") -> CudnnError:
    """The exception for *status* returned by *api*, with cuDNN's last error text."""
    return error_class(status)(status, api, last_error_string())


def check(status: int, api: str = "") -> None:
    """Raise the matching :class:`CudnnError` unless *status* is 0."""
    if status:
        raise error_for(status, api)


def _errcheck(result, func, args):
    if result:
        raise error_for(result, func.__name__)


_checked: dict[str, object] = {}
_warned: set[str] = set()
_checked_lock = threading.Lock()


def _deprecated(name: str, fn):
    def call(*args):
        if name not in _warned:
            _warned.add(name)
            warnings.warn(
                f"{name} is deprecated in cuDNN 9 (CUDNN_DEPRECATED); it may be removed in a "
                "future major version.",
                CudnnDeprecationWarning,
                stacklevel=2,
            )
        return fn(*args)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"Checked ``{name}`` (deprecated by cuDNN)."
    return call


_quiet: dict[str, object] = {}


def checked(name: str, *, warn: bool = True):
    """The checked form of the C function *name*: raises on a non-zero status, returns None.

    Functions that return something other than a status (versions, strings) are returned as is.
    Calling a ``CUDNN_DEPRECATED`` one warns once per function with
    :class:`CudnnDeprecationWarning`; pycudnn's own layers pass ``warn=False`` where they call a
    legacy function on the user's behalf, which neither warns nor uses up that one warning.
    """
    fn = (_checked if warn else _quiet).get(name)
    if fn is not None:
        return fn
    proto = _lib.PROTOTYPES.get(name)
    if proto is None:
        raise AttributeError(f"cudnn.h has no function {name!r}")
    restype, argtypes, _where, deprecated = proto
    with _checked_lock:
        if name not in _quiet:
            raw = getattr(_lib, name)
            if getattr(raw, "missing", False) or restype is not _lib.cudnnStatus_t:
                fn = raw
            else:
                fn = _loader.load().cdll[name]  # a new function object: errcheck stays off _lib's
                fn.restype, fn.argtypes, fn.errcheck = restype, argtypes, _errcheck
            _quiet[name] = fn
            _checked[name] = _deprecated(name, fn) if deprecated else fn
    return (_checked if warn else _quiet)[name]
