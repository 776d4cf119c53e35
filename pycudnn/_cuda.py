"""The CUDA runtime, as pycudnn uses it: the one module that imports ``cuda.bindings``.

Design decisions
----------------
* **Lazy.** ``cuda.bindings`` is imported on first use, so ``import pycudnn`` stays light and works
  without cuda-python; :func:`runtime` raises :class:`~pycudnn.errors.CudaUnavailableError` when it
  is missing.
* **One way to check a result.** ``cuda.bindings`` returns ``(error, value...)`` tuples;
  :func:`check` unpacks them and raises :class:`~pycudnn.errors.CudaError` naming the function,
  the error's name and CUDA's description.
* **No GPU, clear error.** :func:`gpu_unavailable_reason` asks for the device count once (cached
  once a device was seen: the count cannot change); :func:`require_gpu` turns "none" into a
  ``CudaUnavailableError`` that says what needed the GPU and what was found.
* **Device switches** go through :class:`DeviceContext` (restores the caller's device), or, in
  finalizers, :func:`call_on_device`, which never raises: a finalizer has no one to raise to.
* **Streams by protocol.** :func:`coerce_stream` turns ``None``/``0`` (the legacy default stream),
  ints, ``cuda.core`` streams and anything with ``__cuda_stream__``, torch streams
  (``.cuda_stream``), CuPy streams (``.ptr``) and ``cuda.bindings`` stream objects into the
  integer ``cudaStream_t``, without importing any of those libraries.

This module sits just above :mod:`pycudnn.errors` (whose exceptions it raises) and imports
nothing else from pycudnn.
"""

from __future__ import annotations

import ctypes
import importlib
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import CudaError, CudaUnavailableError

__all__ = [
    "GPU",
    "DeviceContext",
    "call_on_device",
    "capture_id",
    "check",
    "coerce_stream",
    "current_device",
    "device_count",
    "device_now",
    "devices",
    "driver",
    "driver_versions",
    "error_name",
    "gpu_unavailable_reason",
    "mem_get_info",
    "nvrtc",
    "require_gpu",
    "runtime",
    "set_device",
    "stream_device",
    "stream_wait",
    "synchronize",
    "validate_device",
]

_rt: Any = None
_SUBMODULES: dict[str, Any] = {}


def runtime() -> Any:
    """``cuda.bindings.runtime``, imported on first use."""
    global _rt
    if _rt is None:
        try:
            from cuda.bindings import runtime as rt
        except ImportError as exc:
            raise CudaUnavailableError(
                "pycudnn needs a CUDA GPU and cuda-python: `cuda.bindings` is not importable "
                f"({exc}); install it with `pip install cuda-python`"
            ) from exc
        _rt = rt
    return _rt


def _bindings(name: str) -> Any:
    """``cuda.bindings.<name>``, imported on first use (after :func:`runtime`: the same package,
    so a missing cuda-python is its clear error)."""
    got = _SUBMODULES.get(name)
    if got is None:
        runtime()
        got = _SUBMODULES[name] = importlib.import_module(f"cuda.bindings.{name}")
    return got


def driver() -> Any:
    """``cuda.bindings.driver``, imported on first use."""
    return _bindings("driver")


def nvrtc() -> Any:
    """``cuda.bindings.nvrtc``, imported on first use (pycudnn's own kernels: :mod:`._nvrtc`)."""
    return _bindings("nvrtc")


def error_name(err: Any) -> str:
    """``"cudaErrorInvalidValue"`` for a ``cudaError_t`` (best effort, never raises)."""
    name = getattr(err, "name", None)
    if name:
        return str(name)
    try:
        return runtime().cudaGetErrorName(err)[1].decode()
    except Exception:  # pragma: no cover - best effort
        return "cudaError"


def _error_string(err: Any) -> str:
    try:
        return runtime().cudaGetErrorString(err)[1].decode()
    except Exception:  # pragma: no cover - best effort
        return ""


def check(result: Any, api_name: str) -> Any:
    """Unpack a ``cuda.bindings`` result tuple: raise :class:`CudaError` unless it succeeded.

    Returns the single value (or None / the tuple of values) that follows the status.
    """
    err = result[0]
    if int(err) != 0:
        raise CudaError(api_name, int(err), error_name(err), _error_string(err))
    if len(result) == 1:
        return None
    if len(result) == 2:
        return result[1]
    return result[1:]


# -- devices -------------------------------------------------------------------------------------
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
        rt = runtime()
    except CudaUnavailableError as exc:
        return str(exc)
    try:
        err, count = rt.cudaGetDeviceCount()
    except Exception as exc:  # cuda.bindings raises its own types when libcuda is absent
        return f"the CUDA runtime is unusable ({type(exc).__name__}: {exc})"
    if int(err) != 0:
        return _no_device_reason(error_name(err), _error_string(err))
    if not count:
        return "cudaGetDeviceCount found 0 CUDA devices"
    with _probe_lock:
        _device_count = int(count)
    return None


def _no_device_reason(name: str, text: str) -> str:
    """Why ``cudaGetDeviceCount`` found nothing, in words: the runtime says "driver version is
    insufficient" both when there is no driver at all and when the driver is too old for the
    runtime cuda.bindings links, so the driver's own version tells them apart."""
    probe = f"cudaGetDeviceCount: {name}"
    if name == "cudaErrorInsufficientDriver":
        drv, run = driver_versions()
        if drv <= 0:
            return (
                f"no NVIDIA driver was found (cudaDriverGetVersion reports none; {probe}), so "
                "there is no GPU"
            )
        return (
            f"the NVIDIA driver supports CUDA {drv // 1000}.{drv % 1000 // 10}, older than the "
            f"CUDA {run // 1000}.{run % 1000 // 10} runtime of the installed cuda-bindings "
            f"({probe}); `python -m pycudnn` names the extra to install"
        )
    if name == "cudaErrorNoDevice":
        return f"the NVIDIA driver found no GPU ({probe})"
    return f"cudaGetDeviceCount returned {name}: {text}".strip()


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


def validate_device(device: Any, what: str) -> int:
    """*device* as a checked ordinal: ``TypeError`` for a non-int, ``ValueError`` for one that
    does not exist, ``CudaUnavailableError`` without a GPU."""
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
    err, dev = runtime().cudaGetDevice()
    if int(err) != 0:
        require_gpu("cudaGetDevice")
        check((err, dev), "cudaGetDevice")
    return int(dev)


_get_device: Any = None


def device_now() -> int | None:
    """The calling thread's current device, or None when CUDA cannot say (no GPU, no
    cuda-bindings). One ``cudaGetDevice``; never raises. The high-level calls compare it with
    their operands' device before each launch (:class:`pycudnn.highlevel._call.on_device`)."""
    global _get_device
    fn = _get_device
    if fn is None:
        try:
            fn = _get_device = runtime().cudaGetDevice
        except CudaUnavailableError:
            return None
    err, dev = fn()
    return int(dev) if int(err) == 0 else None


def stream_device(stream: Any) -> int | None:
    """The device a stream *object* says it belongs to, read from its attributes without a CUDA
    call: ``device_index`` or ``device.index`` (torch), ``device_id`` (CuPy), ``device.device_id``
    (cuda.core). None for ``None``, ints and objects that do not say (a raw ``cudaStream_t``
    carries no device that Python can read for free)."""
    if stream is None or type(stream) is int:
        return None
    for attr in ("device_index", "device_id"):
        d = getattr(stream, attr, None)
        if type(d) is int:
            return d
    dev = getattr(stream, "device", None)
    if dev is None:
        return None
    if type(dev) is int:
        return dev
    for attr in ("index", "device_id"):
        d = getattr(dev, attr, None)
        if type(d) is int:
            return d
    return None


def set_device(device: int) -> None:
    """Make *device* the calling thread's current device (``cudaSetDevice``)."""
    check(runtime().cudaSetDevice(device), "cudaSetDevice")


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
            set_device(self.device)
        self._previous.append(previous)
        return self.device

    def __exit__(self, *exc: object) -> None:
        previous = self._previous.pop()
        if previous != self.device:
            set_device(previous)


def call_on_device(device: int, fn: Callable[..., Any], *args: Any) -> Any:
    """For finalizers: run ``fn(rt, *args)`` with *device* current, restoring the caller's device.

    Returns what *fn* returns (a status, say), or None when it did not run or raised. Never
    raises, and does nothing once the interpreter is shutting down (CUDA may be gone; the driver
    reclaims everything with the process).
    """
    if sys.is_finalizing():
        return None
    try:
        rt = runtime()
        err, previous = rt.cudaGetDevice()
        switch = int(err) == 0 and int(previous) != device
        if switch:
            rt.cudaSetDevice(device)
        try:
            return fn(rt, *args)
        finally:
            if switch:
                rt.cudaSetDevice(previous)
    except Exception:  # pragma: no cover - a finalizer has no one to raise to
        return None


def mem_get_info(device: int | None = None) -> tuple[int, int]:
    """``(free, total)`` bytes of *device* (default: the current device), per ``cudaMemGetInfo``."""
    dev = current_device() if device is None else validate_device(device, "mem_get_info")
    with DeviceContext(dev):
        free, total = check(runtime().cudaMemGetInfo(), "cudaMemGetInfo")
    return int(free), int(total)


@dataclass(frozen=True)
class GPU:
    """A CUDA device as :func:`devices` reports it."""

    index: int
    name: str
    capability: tuple[int, int]
    memory_bytes: int


def devices() -> tuple[list[GPU], str]:
    """(GPUs the CUDA runtime sees, a note); never raises (no GPU -> [], and why)."""
    try:
        rt = runtime()
    except CudaUnavailableError as exc:
        return [], str(exc)
    try:
        err, count = rt.cudaGetDeviceCount()
        if int(err) != 0:
            return [], f"cudaGetDeviceCount: {error_name(err)}"
        gpus = []
        for i in range(count):
            err, prop = rt.cudaGetDeviceProperties(i)
            if int(err) == 0:
                name = prop.name.decode(errors="replace") if isinstance(prop.name, bytes) else ""
                gpus.append(
                    GPU(i, name.rstrip("\0"), (prop.major, prop.minor), prop.totalGlobalMem)
                )
        return gpus, ""
    except Exception as exc:  # a broken driver install can raise from inside cuda.bindings
        return [], f"CUDA runtime error: {exc}"


def driver_versions() -> tuple[int, int]:
    """``(driver's CUDA version, cuda.bindings runtime's CUDA version)`` as CUDA encodes them
    (12080 for 12.8); 0 for one that is unknown (no driver). Never raises."""
    try:
        rt = runtime()
        err, drv = rt.cudaDriverGetVersion()
        err2, run = rt.cudaRuntimeGetVersion()
    except Exception:
        return 0, 0
    return (int(drv) if int(err) == 0 else 0), (int(run) if int(err2) == 0 else 0)


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
        if stream >= 1 << 64:
            raise ValueError(f"stream={stream} is not a cudaStream_t: an address is below 2**64")
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


def is_capturing(stream: int) -> bool:
    """Whether *stream* (a ``cudaStream_t``) is capturing a CUDA graph, or is the legacy stream
    while a blocking stream of the device captures (``cudaErrorStreamCaptureImplicit``: using it
    would join that capture). One ``cudaStreamIsCapturing``, which neither invalidates a capture
    nor leaves an error behind; False when CUDA cannot say."""
    try:
        rt = runtime()
        err, status = rt.cudaStreamIsCapturing(stream)
    except Exception:
        return False
    name = error_name(err)
    if name == "cudaSuccess":
        return int(status) != 0  # cudaStreamCaptureStatusActive or ...Invalidated
    rt.cudaGetLastError()  # not sticky: clear it
    return name == "cudaErrorStreamCaptureImplicit"


def capture_id(stream: int) -> int:
    """The id of the capture sequence *stream* (a ``cudaStream_t``) is in (unique over the
    process's lifetime), 0 when it is not capturing or CUDA cannot say
    (``cudaStreamGetCaptureInfo``, which leaves no error behind)."""
    try:
        rt = runtime()
        r = rt.cudaStreamGetCaptureInfo(stream)
    except Exception:
        return 0
    if error_name(r[0]) != "cudaSuccess":
        rt.cudaGetLastError()
        return 0
    return int(r[2]) if int(r[1]) != 0 else 0


def _same_stream(a: int, b: int) -> bool:
    return (0 if a == 1 else a) == (0 if b == 1 else b)  # 1: cudaStreamLegacy is stream 0


def stream_wait(
    consumer: int, producer: int, device: int, consumer_device: int | None = None
) -> None:
    """Make *consumer* wait for the work queued so far on *producer* (an event, no host sync).

    *producer* is a stream of *device*; *consumer* one of *consumer_device* (default the same).
    Across devices the event is recorded with the producer's device current and waited for with
    the consumer's (a raw 0 is each device's own legacy default stream, so equal ids there are
    still two streams).
    """
    if consumer_device is None or consumer_device == device:
        if _same_stream(consumer, producer):
            return
        consumer_device = device
    rt = runtime()
    with DeviceContext(device):
        event = check(rt.cudaEventCreateWithFlags(2), "cudaEventCreateWithFlags")  # no timing
        try:
            check(rt.cudaEventRecord(event, producer), "cudaEventRecord")
            if consumer_device == device:
                check(rt.cudaStreamWaitEvent(consumer, event, 0), "cudaStreamWaitEvent")
            else:
                with DeviceContext(consumer_device):
                    check(rt.cudaStreamWaitEvent(consumer, event, 0), "cudaStreamWaitEvent")
        finally:
            rt.cudaEventDestroy(event)


def synchronize(stream: int, device: int) -> None:
    """Wait on the host until the work queued on *stream* of *device* has finished."""
    with DeviceContext(device):
        check(runtime().cudaStreamSynchronize(stream), "cudaStreamSynchronize")
