"""cuDNN handles, one per (thread, device), the CUDA streams they run on, and device helpers.

Design decisions
----------------
* **One handle per (thread, device).** cuDNN is thread-safe only "so long as the threads do not
  share the same cuDNN handle simultaneously", and a handle is bound to the device that was current
  at ``cudnnCreate`` until ``cudnnDestroy``. :func:`get_handle` therefore keeps a thread-local
  ``{device: Handle}`` map and creates each handle lazily with its device made current (then
  restores the caller's device). Handle creation is serialized by a process-wide lock, which also
  gives the "first ``cudnnCreate`` synchronous" order cuDNN's documentation recommends. A handle
  never crosses devices; a handle of :func:`get_handle` never crosses threads (its thread is
  recorded in :attr:`Handle.thread_id`). A ``Handle`` you make yourself is yours to keep on one
  thread at a time.
* **Streams by protocol.** :func:`coerce_stream` turns ``None``/``0`` (the legacy default
  stream), ints, ``cuda.core`` streams and anything with ``__cuda_stream__``, torch streams
  (``.cuda_stream``), CuPy streams (``.ptr``) and ``cuda.bindings`` stream objects into the
  integer ``cudaStream_t``, without importing any of those libraries.
* **Never rebind an unchanged stream.** ``cudnnSetStream`` costs about 0.8 µs and has no early
  return; :meth:`Handle.set_stream` compares first (identity, then the integer) and skips the C
  call when nothing changed. A stream *object* bound to a handle is kept referenced while bound,
  so a torch/CuPy stream cannot be destroyed under the handle.
* **Release with ``weakref.finalize``** (never ``__del__``), armed right after ``cudnnCreate``;
  it holds only the raw pointer, the device and an early-bound destroy function. ``close()`` runs
  it (idempotent); at interpreter shutdown a garbage-collection-driven destroy is skipped.
* **No GPU, clear error.** Every entry point that needs a device first asks the CUDA runtime for
  the device count; without a usable GPU it raises :class:`CudaUnavailableError` (a
  ``RuntimeError``) that says a CUDA GPU is needed and what was found. ``cuda.bindings`` is
  imported on first use only, so ``import pycudnn`` stays light.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import weakref
from typing import Any

from . import _lib, api

__all__ = [
    "CudaError",
    "CudaUnavailableError",
    "DeviceContext",
    "Handle",
    "coerce_stream",
    "current_device",
    "device_count",
    "get_handle",
    "gpu_unavailable_reason",
    "require_gpu",
]


# -- CUDA runtime access (lazy) ------------------------------------------------------------------
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


_rt: Any = None
_dr: Any = None


def _runtime():
    """``cuda.bindings.runtime``, imported on first use."""
    global _rt
    if _rt is None:
        try:
            from cuda.bindings import runtime
        except ImportError as exc:
            raise CudaUnavailableError(
                "pycudnn needs a CUDA GPU and cuda-python: `cuda.bindings` is not importable "
                f"({exc}); install it with `pip install cuda-python`"
            ) from exc
        _rt = runtime
    return _rt


def _driver():
    """``cuda.bindings.driver``, imported on first use."""
    global _dr
    if _dr is None:
        from cuda.bindings import driver

        _dr = driver
    return _dr


def _error_name(err: Any) -> str:
    name = getattr(err, "name", None)
    if name:
        return str(name)
    try:
        res = _runtime().cudaGetErrorName(err)
        return res[1].decode()
    except Exception:  # pragma: no cover - best effort
        return "cudaError"


def _error_string(err: Any) -> str:
    try:
        res = _runtime().cudaGetErrorString(err)
        return res[1].decode()
    except Exception:  # pragma: no cover - best effort
        return ""


def _check(result: Any, api_name: str) -> Any:
    """Unpack a ``cuda.bindings`` result tuple: raise :class:`CudaError` unless it succeeded.

    Returns the single value (or None / the tuple of values) that follows the status.
    """
    err = result[0]
    if int(err) != 0:
        raise CudaError(api_name, int(err), _error_name(err), _error_string(err))
    if len(result) == 1:
        return None
    if len(result) == 2:
        return result[1]
    return result[1:]


_probe_lock = threading.Lock()
_device_count: int | None = None  # cached once a device was seen (the count cannot change)


def gpu_unavailable_reason() -> str | None:
    """None when at least one CUDA device is usable, else a sentence saying why not.

    Never raises.
    """
    global _device_count
    if _device_count:
        return None
    try:
        rt = _runtime()
    except CudaUnavailableError as exc:
        return str(exc)
    try:
        err, count = rt.cudaGetDeviceCount()
    except Exception as exc:  # cuda.bindings raises its own types when libcuda is absent
        return f"the CUDA runtime is unusable ({type(exc).__name__}: {exc})"
    if int(err) != 0:
        hint = ""
        if _error_name(err) in ("cudaErrorInsufficientDriver", "cudaErrorNoDevice"):
            hint = " (is an NVIDIA GPU with its driver installed?)"
        return (
            f"cudaGetDeviceCount returned {_error_name(err)}: {_error_string(err)}{hint}"
        ).strip()
    if not count:
        return "cudaGetDeviceCount found 0 CUDA devices"
    with _probe_lock:
        _device_count = int(count)
    return None


def device_count() -> int:
    """The number of usable CUDA devices (0 when there is none or no driver). Never raises."""
    return 0 if gpu_unavailable_reason() is not None else int(_device_count or 0)


def require_gpu(what: str = "this operation") -> int:
    """Return the device count, or raise :class:`CudaUnavailableError` saying *what* needs a GPU."""
    reason = gpu_unavailable_reason()
    if reason is not None:
        raise CudaUnavailableError(
            f"pycudnn needs a CUDA GPU ({what}), but none is usable: {reason}"
        )
    return int(_device_count or 0)


def _validate_device(device: Any, what: str) -> int:
    count = require_gpu(what)
    if isinstance(device, bool) or not isinstance(device, int):
        try:
            device = device.__index__()
        except AttributeError:
            raise TypeError(
                f"device must be an int (a CUDA device ordinal), not {device!r}"
            ) from None
    if not 0 <= device < count:
        raise ValueError(
            f"device={device} does not exist: {count} CUDA device(s) visible "
            f"(ordinals 0..{count - 1})"
        )
    return int(device)


def current_device() -> int:
    """The calling thread's current CUDA device (``cudaGetDevice``).

    Raises
    ------
    CudaUnavailableError
        When no GPU is usable.
    """
    err, dev = _runtime().cudaGetDevice()
    if int(err) != 0:
        require_gpu("cudaGetDevice")
        _check((err, dev), "cudaGetDevice")
    return int(dev)


def _set_device(device: int) -> None:
    _check(_runtime().cudaSetDevice(device), "cudaSetDevice")


class DeviceContext:
    """``with DeviceContext(d):`` makes device *d* current, then restores the previous device.

    Cheap when *d* is already current (one ``cudaGetDevice``). Re-entrant and reusable.
    """

    __slots__ = ("_previous", "device")

    def __init__(self, device: int):
        self.device = int(device)
        self._previous: list[int] = []

    def __enter__(self) -> int:
        previous = current_device()
        if previous != self.device:
            _set_device(self.device)
        self._previous.append(previous)
        return self.device

    def __exit__(self, *exc: object) -> None:
        previous = self._previous.pop()
        if previous != self.device:
            _set_device(previous)


# -- streams -------------------------------------------------------------------------------------
def coerce_stream(stream: Any) -> int:
    """The integer ``cudaStream_t`` of *stream*.

    Parameters
    ----------
    stream : None, int, or a stream object
        ``None`` or ``0``: the legacy default stream (0). An ``int``: a ``cudaStream_t`` value
        (``1`` = ``cudaStreamLegacy``, ``2`` = ``cudaStreamPerThread``). Objects, by protocol:
        ``__cuda_stream__()`` (``cuda.core.Stream`` and others; returns ``(version, handle)``),
        ``.cuda_stream`` (``torch.cuda.Stream``), ``.ptr`` (``cupy.cuda.Stream``), ``int()`` of
        ``cuda.bindings`` ``CUstream``/``cudaStream_t``, ``ctypes.c_void_p`` values.

    Returns
    -------
    int

    Raises
    ------
    TypeError
        If *stream* is none of these.
    ValueError
        For a negative integer.
    """
    if stream is None:
        return 0
    if type(stream) is int:  # the fast path
        if stream < 0:
            raise ValueError(f"stream={stream} is negative; a cudaStream_t is an address")
        return stream
    if isinstance(stream, bool):
        raise TypeError("stream must be a CUDA stream or an int, not a bool")
    if isinstance(stream, int):
        return coerce_stream(int(stream))
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        value = proto() if callable(proto) else proto  # early cuda.core made it a property
        try:
            _version, handle = value
            handle = int(handle)
        except (TypeError, ValueError):
            raise TypeError(
                f"{type(stream).__name__}.__cuda_stream__() returned {value!r}; expected a "
                "(version, handle) tuple"
            ) from None
        return coerce_stream(handle)
    if isinstance(stream, ctypes.c_void_p):
        return stream.value or 0
    for attr in ("cuda_stream", "ptr"):  # torch.cuda.Stream, cupy.cuda.Stream
        value = getattr(stream, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return coerce_stream(value)
    index = getattr(stream, "__index__", None)  # numpy integers
    if index is not None:
        return coerce_stream(int(index()))
    module = type(stream).__module__ or ""
    if module.startswith("cuda.") and hasattr(stream, "__int__"):  # CUstream, cudaStream_t
        return coerce_stream(int(stream))
    raise TypeError(
        f"cannot use {type(stream).__name__} as a CUDA stream: pass an int (cudaStream_t), None "
        "for the default stream, or an object with __cuda_stream__ (cuda.core), .cuda_stream "
        "(torch) or .ptr (CuPy)"
    )


# -- handles -------------------------------------------------------------------------------------
_create_lock = threading.Lock()
_live = [0]  # owned handles not yet destroyed (Handle.live_count)
# re-entrant: a finalizer (which counts) may run while this thread holds the lock
_live_lock = threading.RLock()


def _count(n: int) -> None:
    with _live_lock:
        _live[0] += n


def _destroy_handle(ptr: int, device: int, destroy: Any) -> None:
    """Finalizer body: only values and an early-bound function, never the Handle itself."""
    if sys.is_finalizing():  # too late: CUDA may already be torn down; the OS reclaims it
        return
    _count(-1)
    try:
        rt = _runtime()
        err, previous = rt.cudaGetDevice()
        switch = int(err) == 0 and int(previous) != device
        if switch:
            rt.cudaSetDevice(device)
        try:
            destroy(ptr)  # raw call: a finalizer has no one to raise to
        finally:
            if switch:
                rt.cudaSetDevice(previous)
    except Exception:  # pragma: no cover - nothing useful to do in a finalizer
        pass


class Handle:
    """A cuDNN handle (``cudnnHandle_t``) bound to one CUDA device and a current stream.

    Most code should call :func:`get_handle`, which returns the calling thread's handle for a
    device. Constructing ``Handle(device)`` creates a new, private one.

    Parameters
    ----------
    device : int, optional
        CUDA device ordinal; default the calling thread's current device.
    stream : optional
        Initial stream (anything :func:`coerce_stream` accepts); default the legacy default
        stream 0.

    Raises
    ------
    CudaUnavailableError
        When no GPU is usable.
    ValueError
        For a device ordinal that does not exist.

    Notes
    -----
    Use from one thread at a time (cuDNN's rule). ``with Handle() as h:`` closes it at the end.
    """

    __slots__ = (
        "__weakref__",
        "_device",
        "_finalizer",
        "_owner",
        "_param",
        "_ptr",
        "_stream",
        "_stream_obj",
        "_workspaces",
        "thread_id",
    )

    def __init__(self, device: int | None = None, stream: Any = None):
        if device is None:
            require_gpu("a cuDNN handle")
            dev = current_device()
        else:
            dev = _validate_device(device, "a cuDNN handle")
        handle = _lib.cudnnHandle_t()
        with _create_lock, DeviceContext(dev):
            api.cudnnCreate(ctypes.byref(handle))
        ptr = int(handle.value or 0)
        self._finalizer = weakref.finalize(self, _destroy_handle, ptr, dev, _lib.cudnnDestroy)
        _count(1)
        self._init(ptr, dev, None)
        if stream is not None:
            self.set_stream(stream)

    def _init(self, ptr: int, device: int, owner: Any) -> None:
        self._ptr = ptr
        self._param = _lib.cudnnHandle_t(ptr)
        self._device = device
        self._stream = 0
        self._stream_obj: Any = None
        self._owner = owner
        self._workspaces: dict[int, Any] = {}  # stream -> workspace allocation (see memory.py)
        self.thread_id = threading.get_ident()

    @classmethod
    def from_ptr(cls, ptr: int, device: int, *, owner: Any = None, stream: int = 0) -> Handle:
        """Wrap an existing ``cudnnHandle_t`` without owning it (it is never destroyed here).

        Parameters
        ----------
        ptr : int
            The handle's address.
        device : int
            The device it was created on.
        owner : object, optional
            Kept alive as long as this wrapper (whatever owns the handle).
        stream : int
            The stream it is known to be bound to (default 0); no C call is made.
        """
        self = cls.__new__(cls)
        self._finalizer = None
        self._init(int(ptr), int(device), owner)
        self._stream = coerce_stream(stream)
        return self

    # -- properties -----------------------------------------------------------------------------
    @property
    def ptr(self) -> int:
        """The ``cudnnHandle_t`` address."""
        if not self._ptr:
            raise ValueError("Handle is closed")
        return self._ptr

    @property
    def _as_parameter_(self) -> _lib.cudnnHandle_t:
        if not self._ptr:
            raise ValueError("Handle is closed")
        return self._param

    @property
    def device(self) -> int:
        """The CUDA device ordinal this handle belongs to."""
        return self._device

    @property
    def stream(self) -> int:
        """The integer ``cudaStream_t`` the handle is bound to (0: legacy default stream)."""
        return self._stream

    @property
    def closed(self) -> bool:
        """True after :meth:`close` or :meth:`detach`."""
        return not self._ptr

    @classmethod
    def live_count(cls) -> int:
        """How many handles pycudnn created and has not destroyed yet (for leak tests)."""
        return _live[0]

    def set_stream(self, stream: Any) -> int:
        """Bind the handle to *stream* (``cudnnSetStream``) unless it is already bound to it.

        Parameters
        ----------
        stream
            Anything :func:`coerce_stream` accepts.

        Returns
        -------
        int
            The integer stream now bound.
        """
        if stream is self._stream_obj and stream is not None:
            return self._stream
        if type(stream) is int and stream == self._stream:  # the common per-call case: no work
            return stream
        sid = coerce_stream(stream)
        if sid != self._stream:
            api.cudnnSetStream(self._as_parameter_, sid)
            self._stream = sid
        # keep a stream object alive while it is bound (ints and None need nothing)
        self._stream_obj = None if stream is None or type(stream) is int else stream
        return sid

    def synchronize(self) -> None:
        """Wait until all work queued on the handle's stream has finished."""
        with DeviceContext(self._device):
            _check(_runtime().cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")

    # -- lifetime -------------------------------------------------------------------------------
    def close(self) -> None:
        """Destroy the handle (and free its workspaces) now. Idempotent."""
        workspaces, self._workspaces = self._workspaces, {}
        for ws in workspaces.values():
            close = getattr(ws, "close", None)
            if close is not None:
                close()
        if self._finalizer is not None:
            self._finalizer()
        self._ptr = 0
        self._stream_obj = None
        self._owner = None

    def detach(self) -> int:
        """Give up ownership: return the pointer; this object will no longer destroy it."""
        ptr = self.ptr
        if self._finalizer is not None and self._finalizer.detach() is not None:
            _count(-1)
        self._finalizer = None
        self._ptr = 0
        self._stream_obj = None
        return ptr

    def __enter__(self) -> Handle:
        if not self._ptr:
            raise ValueError("Handle is closed")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if not self._ptr:
            return f"<pycudnn.Handle closed, device={self._device}>"
        return f"<pycudnn.Handle 0x{self._ptr:x} device={self._device} stream=0x{self._stream:x}>"


_local = threading.local()


def get_handle(device: int | None = None, *, stream: Any = None) -> Handle:
    """The calling thread's cuDNN handle for *device*, created on first use.

    Parameters
    ----------
    device : int, optional
        CUDA device ordinal; default the calling thread's current device.
    stream : optional
        If given, the handle is bound to this stream first (no C call when unchanged).

    Returns
    -------
    Handle
        The same object on every call from this thread for this device (a closed one is
        replaced). Other threads get their own.

    Raises
    ------
    CudaUnavailableError
        When no GPU is usable: the message says a CUDA GPU is needed and what was found.
    """
    handles: dict[int, Handle] | None = getattr(_local, "handles", None)
    if handles is None:
        handles = _local.handles = {}
    if device is None:
        if _device_count is None:
            require_gpu("a cuDNN handle")
        device = current_device()
    h = handles.get(device)
    if h is None or not h._ptr:
        h = handles[device] = Handle(_validate_device(device, "a cuDNN handle"))
    if stream is not None:
        h.set_stream(stream)
    return h
