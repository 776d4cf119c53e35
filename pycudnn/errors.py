"""cuDNN status codes as Python exceptions, the checked-call namespace, and every other
exception pycudnn raises of its own (CUDA failures, no GPU, not device memory).

cuDNN 9 status codes are hierarchical: the category is ``code // 1000 * 1000`` (1000
uncategorised/sub-library, 2000 bad parameter, 3000 not supported, 4000 internal, 5000 execution
failed). Each category has an exception class that also derives from the matching builtin, so
``except ValueError`` catches a ``BadParamError``; codes unknown to these bindings (a newer cuDNN)
map by their category.

``checked(name)`` builds, once per function, a ctypes function object of its own (the raw ``_lib``
objects stay raw) whose ``errcheck`` raises on a non-zero status: the success path is one integer
comparison. ``pycudnn.api.<name>`` exposes them behind a thin generated guard (``checked(name)``
with the default ``warn=True``): a ``str``/``bytes`` (or ``bytearray``/``memoryview``) passed for
a descriptor, handle or stream parameter is refused before C is reached (ctypes would pass a
pointer to the object's own buffer, which cuDNN would write into or free), a ``str`` for any
``void *`` parameter too, and ctypes' own refusal of an argument (a descriptor of the wrong family,
a closed object) comes back as :class:`ArgumentTypeError` / :class:`ArgumentValueError`, which
are both ``ctypes.ArgumentError`` and ``TypeError`` / ``ValueError``. The guard costs one Python
frame per call (measured in ``docs/RELIABILITY.md``); pycudnn's own layers call the unguarded
objects (``warn=False``), whose arguments they have validated. A ``cudnnDestroy*`` (and
``cudnnBackendDestroyDescriptor``) refuses a pycudnn object that owns its C object (its finalizer
would free it a second time): ``.close()`` it, or ``.detach()`` it and destroy the address. Int
addresses pass unchecked: they are the raw layer's contract.
"""

from __future__ import annotations

import ctypes
import re
import threading
import warnings

from . import _loader, enums
from ._generated import lib as _lib
from ._loader import LibraryNotFoundError, SymbolNotFoundError, VersionMismatchError

__all__ = [
    "AllocationError",
    "ArgumentTypeError",
    "ArgumentValueError",
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
    "OutOfMemoryError",
    "StreamCaptureError",
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


class OutOfMemoryError(AllocationError):
    """Device memory ran out for an allocation pycudnn made (an array, a workspace, a plan's
    buffers): ``requested`` bytes asked for, ``free``/``total`` as CUDA reported them (-1 when it
    could not say), ``device``. After it the device and pycudnn's caches stay usable."""


class StreamCaptureError(RuntimeError):
    """A call would allocate device memory or plan a graph -- CUDA work a stream capture cannot
    record -- on a stream that is capturing a CUDA graph (``torch.cuda.graph``, ``cudaStream
    BeginCapture``). Raised before any such CUDA call, so the capture is left intact: warm the
    call up before capturing (its plan, workspace and outputs then exist; pass ``out=``), or
    allocate through torch (``pycudnn.torch.use_torch_allocator()``), whose graph pools can."""


class ExecutionFailedError(CudnnError, RuntimeError):
    """5xxx: a kernel or a library cuDNN calls (CUDA, cuBLAS) failed while running."""


class ArgumentTypeError(ctypes.ArgumentError, TypeError):
    """A ``pycudnn.api`` argument of the wrong kind: ``str``/``bytes`` for a descriptor, handle or
    stream, or an object ctypes refuses for the parameter (a descriptor of another family)."""


class ArgumentValueError(ctypes.ArgumentError, ValueError):
    """A ``pycudnn.api`` argument ctypes refused with a ``ValueError`` (a closed descriptor)."""


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


def _warn_deprecated(name: str, stacklevel: int = 3) -> None:
    if name not in _warned:
        _warned.add(name)
        warnings.warn(
            f"{name} is deprecated in cuDNN 9 (CUDNN_DEPRECATED); it may be removed in a "
            "future major version.",
            CudnnDeprecationWarning,
            stacklevel=stacklevel,
        )


def _deprecated(name: str, fn):
    def call(*args):
        _warn_deprecated(name)
        return fn(*args)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"Checked ``{name}`` (deprecated by cuDNN)."
    call._as_parameter_ = fn  # ctypes.cast(api.<name>, c_void_p) still gives the C address
    return call


# -- the api.* argument guard ----------------------------------------------------------------------
_TEXT = frozenset((str, bytes, bytearray, memoryview))
_ARG_RE = re.compile(r"argument (\d+): (\w+): ")


def _opaque(t) -> bool:
    """A cuDNN handle typedef (descriptor, handle, stream): a distinct c_void_p subclass."""
    return (
        isinstance(t, type)
        and issubclass(t, ctypes.c_void_p)
        and t is not ctypes.c_void_p
        and getattr(_lib, t.__name__, None) is t
    )


def _describe(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _refuse_text(name: str, argtypes, i: int, value) -> ArgumentTypeError:
    expected = argtypes[i].__name__
    return ArgumentTypeError(
        f"{name}: argument {i + 1}: a {type(value).__name__} is not a {expected} "
        f"({_describe(value)}): pass the pycudnn object or its int address; ctypes would hand "
        "cuDNN the object's own buffer"
    )


def _is_destroy(name: str) -> bool:
    """A C function that frees its first argument (``cudnnDestroy*``, the backend's destroy)."""
    return name.startswith("cudnnDestroy") or name == "cudnnBackendDestroyDescriptor"


def _owned_by_pycudnn(value) -> bool:
    """*value* is a pycudnn wrapper whose finalizer will destroy its C object (``.owned``)."""
    return getattr(value, "owned", False) is True and hasattr(value, "detach")


def _refuse_owned(name: str, value) -> ArgumentValueError:
    kind = type(value).__name__
    return ArgumentValueError(
        f"{name}: argument 1: this {kind} is owned by pycudnn (it destroys its C object when "
        f"closed or collected); destroying it here would free it twice. Call its .close(), or "
        f"take the address with .detach() and destroy that"
    )


def _converted(name: str, argtypes, exc: ctypes.ArgumentError, args) -> ctypes.ArgumentError:
    """ctypes' refusal of an argument, as a TypeError/ValueError naming the function."""
    text = str(exc)
    m = _ARG_RE.match(text)
    if m is None:  # pragma: no cover - ctypes always says which argument
        return ArgumentTypeError(f"{name}: {text}")
    i = int(m[1]) - 1
    cls = ArgumentValueError if m[2] == "ValueError" else ArgumentTypeError
    tail = ""
    if 0 <= i < len(args) and i < len(argtypes):
        got = _describe(args[i])
        tail = f" (expected {getattr(argtypes[i], '__name__', argtypes[i])}, got {got})"
    return cls(f"{name}: {text}{tail}")


def _guarded(name: str, fn, argtypes, deprecated: bool):
    """The ``api.<name>`` callable: *fn* behind the argument guard (see the module docstring)."""
    text_pos = [i for i, t in enumerate(argtypes) if _opaque(t)]
    str_pos = [i for i, t in enumerate(argtypes) if t is ctypes.c_void_p]
    destroy = _is_destroy(name) and bool(argtypes)
    if not (text_pos or str_pos or deprecated or destroy):
        return fn
    params = ", ".join(f"a{i}" for i in range(len(argtypes)))
    body = [f"def {name}({params}):"]
    refuse = "raise _refuse_text(_name, _argtypes, {0}, a{0})"
    for i in text_pos:
        body.append(f"    if a{i}.__class__ in _TEXT: " + refuse.format(i))
    for i in str_pos:
        body.append(f"    if a{i}.__class__ is str: " + refuse.format(i))
    if destroy:
        body.append("    if _owned_by_pycudnn(a0): raise _refuse_owned(_name, a0)")
    if deprecated:
        body.append(f"    _warn_deprecated({name!r})")
    body += [
        "    try:",
        f"        return _fn({params})",
        "    except _ArgumentError as exc:",
        f"        raise _converted(_name, _argtypes, exc, ({params}{',' if argtypes else ''})) "
        "from None",
    ]
    namespace = {
        **globals(),
        "_fn": fn,
        "_name": name,
        "_argtypes": argtypes,
        "_ArgumentError": ctypes.ArgumentError,
    }
    exec("\n".join(body), namespace)  # generated from the prototype table only
    call = namespace[name]
    call.__qualname__ = name
    call.__module__ = "pycudnn.api"
    call.__doc__ = f"Checked ``{name}``{' (deprecated by cuDNN)' if deprecated else ''}."
    call._as_parameter_ = fn  # ctypes.cast(api.<name>, c_void_p) still gives the C address
    return call


_quiet: dict[str, object] = {}


def checked(name: str, *, warn: bool = True):
    """The checked form of the C function *name*: raises on a non-zero status, returns None.

    With *warn* (the ``pycudnn.api`` form) the function sits behind the argument guard of the
    module docstring; ``warn=False`` gives the bare checked ctypes function (pycudnn's layers).
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
            if fn is raw:  # raw: a value-returning function, or one the library lacks
                _checked[name] = _deprecated(name, fn) if deprecated else fn
            else:
                _checked[name] = _guarded(name, fn, argtypes, deprecated)
    return (_checked if warn else _quiet)[name]
