"""Device memory: ``DeviceArray``, host transfers, zero-copy interop, pointer checks, workspaces.

Design decisions
----------------
* **Ownership.** Memory pycudnn allocates comes from the CUDA runtime's stream-ordered pool
  (``cudaMallocAsync`` on the stream you pass, ``cudaMalloc`` where pools are unsupported) and is
  owned by a small block object whose ``weakref.finalize`` gives it back; every
  :class:`DeviceArray` over that memory references the block, so the memory lives as long as the
  last array. A stream *object* passed at allocation is kept alive with the memory; a raw ``int``
  stream must outlive the array (and its cached block: see :func:`empty_cache`). Finalizers do
  nothing at interpreter shutdown (``atexit=False``, ``sys.is_finalizing()``): the driver
  reclaims the memory with the process, and CUDA may already be gone.
* **Caching allocator** (arrays, not workspaces). A freed block goes to a free list keyed by
  (device, stream, size class) instead of ``cudaFreeAsync``; the next allocation of that class
  on the same device and stream takes it back with no CUDA call (the stream orders the new work
  after the old; a block never moves to another stream). Classes: 512-byte multiples up to
  1 MiB, then eight per power of two (< 12.5% rounding). At most :func:`get_cache_limit` idle
  bytes per device (default 1 GiB; oldest blocks freed first); out of memory releases the
  device's cache, synchronizes and retries once. :func:`empty_cache`, :func:`cache_stats`.
* **Zero-copy interop by protocol.** :func:`asarray` views anything with
  ``__cuda_array_interface__`` (v2/v3) or ``__dlpack__`` (torch, CuPy, JAX, Numba...) without a
  copy and keeps the producer (or its DLPack deleter) alive. ``__cuda_array_interface__`` is tried
  first (no capsule to build); DLPack is used when it is absent or refuses (torch's bfloat16).
  :class:`DeviceArray` exports both protocols, with stream synchronization as the protocols say.
  Host arrays are refused with a ``TypeError`` that names :func:`to_device`: copies are explicit.
* **Checks before C.** :func:`check_device_pointer` asks ``cudaPointerGetAttributes`` where a
  pointer lives (host, unregistered and, unless allowed, managed memory are refused; a pointer on
  another device than the handle is refused); :func:`check_alignment` and :func:`check_operand`
  add alignment (to the element size) and contiguity. :func:`asarray` runs the pointer check once
  when it wraps a ``__cuda_array_interface__`` object (that protocol carries no device), so a
  ``DeviceArray`` needs no query per call.
* **Strides are bytes** (numpy and ``__cuda_array_interface__`` convention), converted to element
  strides only for DLPack. Dense layouts other than C order (NHWC viewed as NCHW) are kept by
  :func:`to_device`, :meth:`DeviceArray.get` and :func:`empty_like`.
* **Workspaces.** :func:`get_workspace` keeps one grow-only allocation per (handle, stream) on the
  handle itself, so it dies with the handle; it never exceeds ``pycudnn.config.workspace_limit``
  and raises :class:`~pycudnn.errors.AllocationError` (a ``MemoryError``) naming the bytes asked
  for and free, so a caller can retry with an algorithm that needs less.
* **bfloat16.** On the device it is just 2-byte data; on the host it needs the ``ml_dtypes``
  package (``np.dtype(ml_dtypes.bfloat16)``). ``__cuda_array_interface__`` has no bfloat16 type
  string (it shows as ``'<V2'``), so bfloat16 travels through DLPack.
"""

from __future__ import annotations

import collections
import math
import operator
import os
import sys
import threading
import weakref
from collections.abc import Iterable
from typing import Any

import numpy as np

from . import _dlpack, _types, enums, errors
from ._config import config
from .handle import (
    CudaError,
    CudaUnavailableError,
    DeviceContext,
    _check,
    _driver,
    _error_name,
    _runtime,
    _validate_device,
    coerce_stream,
    current_device,
    require_gpu,
)

__all__ = [
    "DeviceArray",
    "NotDeviceMemoryError",
    "asarray",
    "cache_stats",
    "check_alignment",
    "check_device_pointer",
    "check_operand",
    "empty",
    "empty_cache",
    "empty_like",
    "get_cache_limit",
    "get_workspace",
    "mem_get_info",
    "pointer_alignment",
    "release_workspace",
    "set_cache_limit",
    "to_device",
    "workspace_size",
    "zeros",
]

_ONE_TIB = 1 << 40
_WORKSPACE_GRANULE = 1 << 20  # workspaces grow in whole MiB (capped at the limit)
_MEMTYPE_NAMES = {0: "unregistered host memory", 1: "page-locked host memory", 3: "managed memory"}


class NotDeviceMemoryError(TypeError, ValueError):
    """A pointer or array is not device memory (host, unregistered, or managed unless allowed).

    Both a ``TypeError`` (wrong kind of argument) and a ``ValueError`` (bad pointer value).
    """


# -- layout helpers ------------------------------------------------------------------------------
def _as_shape(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        out = tuple(int(operator_index(s)) for s in shape)
    except TypeError:
        raise TypeError(f"shape must be an int or a sequence of ints, not {shape!r}") from None
    if any(s < 0 for s in out):
        raise ValueError(f"shape {out} has a negative dimension")
    return out


def operator_index(value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError("a bool is not a dimension")
    return operator.index(value)


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides = []
    acc = itemsize
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def _is_c_contiguous(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> bool:
    if 0 in shape:
        return True
    expected = itemsize
    for n, s in zip(reversed(shape), reversed(strides), strict=True):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


def _is_dense(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> bool:
    """No gaps, no overlap, no negative strides: the elements fill ``size * itemsize`` bytes."""
    if 0 in shape:
        return True
    dims = sorted(((s, n) for n, s in zip(shape, strides, strict=True) if n != 1), reverse=True)
    expected = itemsize
    for s, n in reversed(dims):
        if s != expected:
            return False
        expected *= n
    return True


def _extent(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> tuple[int, int]:
    """Byte offsets ``[lo, hi)`` (relative to the pointer) that the elements touch."""
    if 0 in shape:
        return 0, 0
    lo = hi = 0
    for n, s in zip(shape, strides, strict=True):
        if s < 0:
            lo += s * (n - 1)
        else:
            hi += s * (n - 1)
    return lo, hi + itemsize


def _numpy_dtype(dtype: Any, argument: str = "dtype") -> np.dtype:
    """Validate against cuDNN's dtype table and return the numpy dtype (bfloat16: ml_dtypes)."""
    if isinstance(dtype, np.dtype) and dtype.kind == "V" and dtype.name != "bfloat16":
        raise TypeError(
            f"{argument}={dtype!r} is an untyped void type; bfloat16 needs "
            "ml_dtypes.bfloat16 (or the string 'bfloat16')"
        )
    return _types.numpy_dtype(_types.as_data_type(dtype, argument=argument))


# -- allocation ----------------------------------------------------------------------------------
def mem_get_info(device: int | None = None) -> tuple[int, int]:
    """``(free, total)`` bytes of *device* (default: the current device), per ``cudaMemGetInfo``."""
    dev = current_device() if device is None else _validate_device(device, "mem_get_info")
    with DeviceContext(dev):
        free, total = _check(_runtime().cudaMemGetInfo(), "cudaMemGetInfo")
    return int(free), int(total)


def _fmt_bytes(n: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _allocation_error(
    nbytes: int, device: int, api_name: str, reason: str, *, limit: int | None = None
) -> errors.AllocationError:
    try:
        free, total = mem_get_info(device)
        mem = f"{_fmt_bytes(free)} ({free} bytes) free of {_fmt_bytes(total)}"
    except Exception:  # the device may be in a bad state: still raise the allocation error
        free = total = -1
        mem = "free memory unknown"
    detail = (
        f"cannot allocate {_fmt_bytes(nbytes)} ({nbytes} bytes) on device {device}: {reason}; {mem}"
    )
    if limit is not None:
        detail += f"; pycudnn.config.workspace_limit={limit}"
    exc = errors.AllocationError(
        enums.Status.INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED, api_name, detail
    )
    exc.requested = nbytes
    exc.free = free
    exc.total = total
    exc.device = device
    return exc


_ASYNC, _SYNC = 1, 0


def _device_malloc(
    nbytes: int, device: int, stream: int, mode: int = _ASYNC, requested: int | None = None
) -> tuple[int, int]:
    """Allocate *nbytes* on *device*, ordered on *stream*: ``(ptr, mode)``.

    ``cudaMallocAsync`` (``cudaMalloc`` where the device has no memory pools: *mode* becomes
    ``_SYNC``). Out of memory: the caching allocator's blocks on *device* are released and the
    device synchronized (frees still queued then complete), and the allocation is retried once
    before :class:`~pycudnn.errors.AllocationError` is raised. Errors name *requested* (the
    caller's size before rounding to a size class; default *nbytes*).
    """
    asked = nbytes if requested is None else requested
    if asked >= _ONE_TIB:  # cuDNN has asked for > 2**63 before (see ATen's Conv_v7.cpp)
        raise _allocation_error(asked, device, "cudaMallocAsync", "absurd size (>= 1 TiB)")
    rt = _runtime()
    with DeviceContext(device):
        err, ptr = rt.cudaMallocAsync(nbytes, stream) if mode else rt.cudaMalloc(nbytes)
        if mode and _error_name(err) == "cudaErrorNotSupported":  # no memory pools here
            rt.cudaGetLastError()
            mode = _SYNC
            err, ptr = rt.cudaMalloc(nbytes)
        if _error_name(err) == "cudaErrorMemoryAllocation":
            rt.cudaGetLastError()
            _release_device(device, force_sync=True)
            err, ptr = rt.cudaMallocAsync(nbytes, stream) if mode else rt.cudaMalloc(nbytes)
            if _error_name(err) == "cudaErrorMemoryAllocation":
                rt.cudaGetLastError()
                api_name = "cudaMallocAsync" if mode else "cudaMalloc"
                raise _allocation_error(asked, device, api_name, "out of memory")
        _check((err, ptr), "cudaMallocAsync" if mode else "cudaMalloc")
    return int(ptr), mode


def _free(ptr: int, device: int, stream: int, mode: int, keep: Any) -> None:
    """Finalizer body (values only): free *ptr* on *device*; ``keep`` is the stream object."""
    if sys.is_finalizing():
        return
    try:
        rt = _runtime()
        err, previous = rt.cudaGetDevice()
        switch = int(err) == 0 and int(previous) != device
        if switch:
            rt.cudaSetDevice(device)
        try:
            if mode == _ASYNC:
                rt.cudaFreeAsync(ptr, stream)
            else:
                rt.cudaFree(ptr)
        finally:
            if switch:
                rt.cudaSetDevice(previous)
    except Exception:  # pragma: no cover - a finalizer has no one to raise to
        pass


class _Allocation:
    """One uncached device allocation (workspaces); freed by its finalizer, :meth:`close` or
    :meth:`release`."""

    __slots__ = ("__weakref__", "_finalizer", "device", "is_async", "nbytes", "ptr", "stream")

    def __init__(
        self, nbytes: int, device: int, stream: int, keep: Any = None, *, free_sync: bool = False
    ):
        self.nbytes = nbytes
        self.device = device
        self.stream = stream
        ptr, mode = _device_malloc(nbytes, device, stream)
        self.ptr = ptr
        self.is_async = mode == _ASYNC
        free_mode = _SYNC if free_sync else mode
        self._finalizer = weakref.finalize(self, _free, ptr, device, stream, free_mode, keep)
        self._finalizer.atexit = False

    def close(self) -> None:
        """Free now (as the finalizer would). Idempotent."""
        self._finalizer()

    def release(self, stream: int) -> None:
        """Free now, stream-ordered on *stream* (a live stream the memory was last used on)."""
        info = self._finalizer.detach()
        if info is not None:
            _obj, _fn, args, _kw = info
            ptr, device, _stream, _mode, _keep = args
            _free(ptr, device, stream, _ASYNC if self.is_async else _SYNC, None)


# -- caching allocator ---------------------------------------------------------------------------
# The arrays of empty()/zeros()/to_device() come from here. A block freed by its arrays'
# finalizer goes to a free list keyed by (device, stream, size class) instead of cudaFreeAsync;
# the next allocation of that class on the same (device, stream) takes it back with no CUDA call.
# Same-stream reuse is safe because the stream orders the new work after the old; a block is
# never handed to another stream (that would need an event per block).
_SMALL_MAX = 1 << 20  # up to 1 MiB: 512-byte classes
_SMALL_GRANULE = 512
DEFAULT_CACHE_LIMIT = 1 << 30
_cache_limit = DEFAULT_CACHE_LIMIT  # idle bytes kept per device (set_cache_limit)
# cudaStreamPerThread (2) is a different stream in every thread, and a finalizer runs on any
# thread: blocks on it are never cached. cuda-python can make 0 mean the per-thread stream too.
_UNCACHED_STREAMS = frozenset(
    {2, 0}
    if os.environ.get("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "0") not in ("", "0")
    else {2}
)
# One lock for all free lists (a threading.Lock round trip costs ~0.1-0.2 us). Per-thread lists
# would strand blocks: a finalizer runs on whichever thread drops the last reference (or the
# garbage collector's), so frees and the next allocation are often on different threads.
# Finalizers never wait for the lock: when it is taken (another thread, or this one, with the
# collector running a finalizer in the middle of an allocation) the block waits in _pending,
# which the next holder of the lock drains. So no deadlock and no re-entrant list surgery.
_lock = threading.Lock()
_pending: collections.deque[tuple[Any, tuple[int, int], int, Any]] = collections.deque()


def _size_class(nbytes: int) -> int:
    """Bytes actually allocated for a request of *nbytes* (> 0).

    Up to 1 MiB: a multiple of 512 B. Above: eight classes per power of two (a multiple of
    1/8 of the power of two below), so rounding wastes less than 12.5%.
    """
    if nbytes <= _SMALL_MAX:
        return (nbytes + _SMALL_GRANULE - 1) & -_SMALL_GRANULE
    step = 1 << ((nbytes - 1).bit_length() - 4)
    return (nbytes + step - 1) & -step


class _Pool:
    """The cache of one device: free lists, eviction order, byte counts and counters."""

    __slots__ = (
        "cached",
        "device",
        "free",
        "hits",
        "misses",
        "mode",
        "oom_releases",
        "order",
        "released",
        "used",
        "used_blocks",
    )

    def __init__(self, device: int):
        self.device = device
        self.free: dict[tuple[int, int], list[int]] = {}  # (stream, class) -> ptrs, newest last
        self.order: dict[int, tuple[tuple[int, int], Any]] = {}  # ptr -> (key, stream object)
        self.cached = 0  # bytes in the free lists
        self.used = 0  # bytes of live blocks
        self.used_blocks = 0
        self.hits = 0
        self.misses = 0
        self.released = 0  # cached blocks given back to CUDA (limit, empty_cache, OOM)
        self.oom_releases = 0
        self.mode = _ASYNC  # _SYNC once the device refused cudaMallocAsync


_pools: dict[int, _Pool] = {}


def _pool(device: int) -> _Pool:
    pool = _pools.get(device)
    if pool is None:
        pool = _pools.setdefault(device, _Pool(device))  # setdefault: one pool if threads race
    return pool


class _Block:
    """A cached-allocator block: the ``base`` of the arrays over it. When the last of them is
    gone, its finalizer returns the memory to the cache (see :func:`_recycle`)."""

    __slots__ = ("__weakref__", "device", "nbytes", "ptr", "stream")

    def __init__(self, ptr: int, nbytes: int, device: int, stream: int):
        self.ptr = ptr
        self.nbytes = nbytes
        self.device = device
        self.stream = stream

    def __repr__(self) -> str:
        return (
            f"<pycudnn block 0x{self.ptr:x}, {self.nbytes} bytes, device {self.device}, "
            f"stream 0x{self.stream:x}>"
        )


def _new_block(device: int, stream: int, nbytes: int, cls: int, keep: Any) -> _Block:
    """A block of class *cls* (for *nbytes*) on (*device*, *stream*): cached if one fits."""
    pool = _pools.get(device) or _pool(device)
    if cls > _cache_limit or stream in _UNCACHED_STREAMS:
        cls = nbytes  # never cached: allocate the exact size, no rounding to waste
        key = (stream, -nbytes)  # a negative class marks it for a direct free
        ptr = 0
        with _lock:
            pool.misses += 1
            pool.used += nbytes
            pool.used_blocks += 1
    else:
        key = (stream, cls)
        with _lock:
            if _pending:
                _drain()
            lst = pool.free.get(key)
            if lst:
                ptr = lst.pop()
                del pool.order[ptr]
                pool.cached -= cls
                pool.hits += 1
            else:
                ptr = 0
                pool.misses += 1
            pool.used += cls
            pool.used_blocks += 1
    if not ptr:
        try:
            ptr, mode = _device_malloc(cls, device, stream, pool.mode, nbytes)
        except BaseException:
            with _lock:
                pool.used -= cls
                pool.used_blocks -= 1
            raise
        pool.mode = mode
    blk = _Block(ptr, cls, device, stream)
    fin = weakref.finalize(blk, _recycle, pool, key, ptr, keep)
    fin.atexit = False  # at exit nothing is freed: the driver reclaims it, CUDA may be gone
    return blk


def _recycle(pool: _Pool, key: tuple[int, int], ptr: int, keep: Any) -> None:
    """Finalizer of a :class:`_Block`: into the cache (or freed), never waiting for the lock."""
    if sys.is_finalizing():
        return
    if not _lock.acquire(blocking=False):
        _pending.append((pool, key, ptr, keep))  # deque.append is atomic
        return
    try:
        if _pending:
            _drain()
        _put(pool, key, ptr, keep)
    except Exception:  # pragma: no cover - a finalizer has no one to raise to
        pass
    finally:
        _lock.release()


def _drain() -> None:
    """Cache the blocks whose finalizers found the lock taken. Lock held."""
    while _pending:
        try:
            item = _pending.popleft()
        except IndexError:  # pragma: no cover - another thread won the race
            break
        _put(*item)


def _put(pool: _Pool, key: tuple[int, int], ptr: int, keep: Any) -> None:
    """A freed block goes to its free list, the oldest ones out past the limit. Lock held."""
    stream, cls = key
    pool.used_blocks -= 1
    if cls < 0:  # allocated uncached (per-thread stream, or larger than the limit)
        pool.used += cls
        _free_blocks(pool, [(ptr, stream)])
        return
    pool.used -= cls
    lst = pool.free.get(key)
    if lst is None:
        lst = pool.free[key] = []
    lst.append(ptr)  # newest last: reused first (likeliest still in L2), evicted last
    pool.order[ptr] = (key, keep)  # keep: a stream object stays alive while its block is cached
    pool.cached += cls
    if pool.cached > _cache_limit:
        _trim(pool, _cache_limit)


def _trim(pool: _Pool, limit: int) -> None:
    """Free the oldest cached blocks until at most *limit* bytes are cached. Lock held."""
    victims = []
    order = pool.order
    while pool.cached > limit and order:
        ptr = next(iter(order))
        (stream, cls), _keep_obj = order.pop(ptr)
        lst = pool.free[(stream, cls)]
        lst.remove(ptr)
        if not lst:
            del pool.free[(stream, cls)]
        pool.cached -= cls
        victims.append((ptr, stream))
    pool.released += len(victims)
    if victims:
        _free_blocks(pool, victims)


def _free_blocks(pool: _Pool, blocks: list[tuple[int, int]]) -> None:
    """``cudaFreeAsync`` each ``(ptr, stream)`` on its own stream (``cudaFree`` without pools).

    A free that fails (its int stream was destroyed, against the rules) falls back to a device
    synchronization and a free on the legacy default stream.
    """
    rt = _runtime()
    err, previous = rt.cudaGetDevice()
    switch = int(err) == 0 and int(previous) != pool.device
    if switch:
        rt.cudaSetDevice(pool.device)
    try:
        for ptr, stream in blocks:
            if pool.mode == _SYNC:
                rt.cudaFree(ptr)
                continue
            if int(rt.cudaFreeAsync(ptr, stream)[0]) != 0:
                rt.cudaGetLastError()
                rt.cudaDeviceSynchronize()
                rt.cudaFreeAsync(ptr, 0)
    finally:
        if switch:
            rt.cudaSetDevice(previous)


def _release_device(device: int, *, force_sync: bool = False) -> int:
    """Give *device*'s cached blocks back to CUDA; the bytes released.

    The device is synchronized first, so the blocks' last work (on any stream) is done and they
    can be freed on the legacy default stream, whichever stream they came from (it may have been
    destroyed since); then once more so the memory is back in the pool for every stream.
    """
    pool = _pools.get(device)
    blocks: list[int] = []
    freed = 0
    if pool is not None:
        with _lock:
            if _pending:
                _drain()
            blocks = list(pool.order)
            freed = pool.cached
            pool.order.clear()  # drops the stream objects the blocks kept alive
            pool.free.clear()
            pool.cached = 0
            pool.released += len(blocks)
            if force_sync:
                pool.oom_releases += 1
    if not blocks and not force_sync:
        return 0
    rt = _runtime()
    with DeviceContext(device):
        rt.cudaDeviceSynchronize()
        if blocks:
            mode = pool.mode if pool is not None else _ASYNC
            for ptr in blocks:
                if mode == _SYNC:
                    rt.cudaFree(ptr)
                else:
                    rt.cudaFreeAsync(ptr, 0)
            rt.cudaDeviceSynchronize()
        rt.cudaGetLastError()  # leave no error behind for the caller's next check
    return freed


def empty_cache(device: int | None = None) -> int:
    """Give the cached (unused) device memory back to CUDA; returns the bytes released.

    Blocks held by live arrays are untouched. Synchronizes each device that had cached blocks
    (then frees them stream-ordered, whatever stream they came from). Call it before destroying
    a raw ``int`` stream you allocated on, or to leave memory to another library.

    Parameters
    ----------
    device : int, optional
        Only this device (default: all of them).
    """
    devices = list(_pools) if device is None else [int(device)]
    return sum(_release_device(d) for d in devices)


def cache_stats(device: int | None = None) -> dict[str, int]:
    """Counters of the caching allocator (all devices summed, or one *device*).

    Keys: ``cached_bytes`` / ``cached_blocks`` (idle in the cache), ``used_bytes`` /
    ``used_blocks`` (held by live arrays, counted by size class), ``hits`` (allocations served
    from the cache), ``misses`` (allocations that called CUDA), ``released_blocks`` (cached
    blocks given back: limit, :func:`empty_cache`, out of memory), ``oom_releases`` (cache
    releases forced by an out-of-memory error), ``limit`` (:func:`get_cache_limit`).
    """
    pools = list(_pools.values()) if device is None else [_pools.get(int(device))]
    out = dict.fromkeys(
        ("cached_bytes", "cached_blocks", "used_bytes", "used_blocks", "hits", "misses"), 0
    )
    out.update(released_blocks=0, oom_releases=0)
    with _lock:
        if _pending:
            _drain()
        for p in pools:
            if p is None:
                continue
            out["cached_bytes"] += p.cached
            out["cached_blocks"] += len(p.order)
            out["used_bytes"] += p.used
            out["used_blocks"] += p.used_blocks
            out["hits"] += p.hits
            out["misses"] += p.misses
            out["released_blocks"] += p.released
            out["oom_releases"] += p.oom_releases
    out["limit"] = _cache_limit
    return out


def get_cache_limit() -> int:
    """The most bytes of unused blocks the allocator keeps per device (default 1 GiB)."""
    return _cache_limit


def set_cache_limit(nbytes: int) -> int:
    """Set the per-device limit of cached (unused) bytes; returns the previous one.

    ``0`` turns caching off (every free is a ``cudaFreeAsync`` again). Lowering it frees the
    oldest cached blocks at once. Blocks larger than the limit are never cached.
    """
    global _cache_limit
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"the cache limit must be an int >= 0 (bytes), not {nbytes!r}")
    previous, _cache_limit = _cache_limit, nbytes
    with _lock:
        if _pending:
            _drain()
        for pool in list(_pools.values()):
            _trim(pool, nbytes)
    return previous


# -- pointer checks ------------------------------------------------------------------------------
def pointer_alignment(ptr: int) -> int:
    """The largest power of two (up to 256) dividing *ptr*: for plan-cache keys."""
    ptr = int(ptr)
    return 256 if ptr == 0 else min(ptr & -ptr, 256)


def check_alignment(ptr: int, alignment: int, *, argument: str = "ptr") -> None:
    """Raise ``ValueError`` unless *ptr* is a multiple of *alignment* bytes."""
    if alignment > 1 and int(ptr) % alignment:
        raise ValueError(
            f"{argument}: device pointer 0x{int(ptr):x} is not aligned to {alignment} bytes "
            "(cuDNN needs at least the element size); copy it into a fresh array"
        )


def check_device_pointer(
    ptr: int, device: int | None = None, *, argument: str = "ptr", allow_managed: bool = False
) -> int:
    """Check with ``cudaPointerGetAttributes`` that *ptr* is device memory; return its device.

    Parameters
    ----------
    ptr : int
        The address.
    device : int, optional
        If given, the pointer must be on this device (the handle's).
    argument : str
        The argument name used in error messages.
    allow_managed : bool
        Accept managed (unified) memory. Default False.

    Raises
    ------
    NotDeviceMemoryError
        Host memory (pageable or page-locked), a pointer CUDA does not know, or managed memory
        without *allow_managed*. A ``TypeError`` and a ``ValueError``; the message names
        *argument* and ``pycudnn.to_device``.
    ValueError
        A null pointer, or a pointer on another device than *device*.
    CudaUnavailableError
        When no GPU is usable.
    """
    ptr = int(ptr)
    if ptr == 0:
        raise ValueError(f"{argument}: null device pointer")
    require_gpu(f"checking {argument}")
    rt = _runtime()
    err, attrs = rt.cudaPointerGetAttributes(ptr)
    if int(err) != 0:
        rt.cudaGetLastError()  # do not leave the error for the next caller of cudaGetLastError
        raise NotDeviceMemoryError(
            f"{argument}: 0x{ptr:x} is not memory CUDA knows ({_error_name(err)}); pass device "
            "memory, or copy host data to the GPU with pycudnn.to_device()"
        )
    mtype = int(attrs.type)
    if mtype == 3 and not allow_managed:
        raise NotDeviceMemoryError(
            f"{argument}: 0x{ptr:x} is managed (unified) memory; pass allow_managed=True to use "
            "it, or copy it with pycudnn.to_device()"
        )
    if mtype not in (2, 3):
        raise NotDeviceMemoryError(
            f"{argument}: 0x{ptr:x} is {_MEMTYPE_NAMES.get(mtype, 'not device memory')}, not GPU "
            "memory; copy it to the GPU with pycudnn.to_device()"
        )
    dev = int(attrs.device)
    if device is not None and dev != int(device):
        raise ValueError(
            f"{argument} is on device {dev}, but the handle is on device {int(device)}; "
            "use the handle of that device (pycudnn.get_handle(device)) or move the data"
        )
    return dev


# -- stream ordering between producer and consumer -----------------------------------------------
def _norm_stream(s: int) -> int:
    return 0 if s == 1 else s  # cudaStreamLegacy is the legacy default stream 0


def _stream_wait(consumer: int, producer: int, device: int) -> None:
    """Make *consumer* wait for the work queued so far on *producer* (an event, no host sync)."""
    if _norm_stream(consumer) == _norm_stream(producer):
        return
    rt = _runtime()
    with DeviceContext(device):
        event = _check(rt.cudaEventCreateWithFlags(2), "cudaEventCreateWithFlags")  # no timing
        try:
            _check(rt.cudaEventRecord(event, producer), "cudaEventRecord")
            _check(rt.cudaStreamWaitEvent(consumer, event, 0), "cudaStreamWaitEvent")
        finally:
            rt.cudaEventDestroy(event)


# -- DeviceArray ---------------------------------------------------------------------------------
class DeviceArray:
    """An n-dimensional array in GPU memory (owned by pycudnn, or a zero-copy view).

    Make one with :func:`empty`, :func:`zeros`, :func:`to_device`, :func:`asarray` or
    :meth:`from_ptr`.

    Attributes
    ----------
    ptr : int
        Device address of element ``[0, ..., 0]``.
    shape : tuple of int
    dtype : numpy.dtype
        bfloat16 is ``ml_dtypes.bfloat16``.
    strides : tuple of int
        In bytes, like numpy and ``__cuda_array_interface__``.
    device : int
        CUDA device ordinal.
    stream : int
        The stream the data is ordered on (allocation/last transfer; 0 = legacy default).
    nbytes : int
        ``size * itemsize``.

    Notes
    -----
    The array supports ``__cuda_array_interface__`` (v3) and ``__dlpack__``, so
    ``torch.as_tensor(a, device="cuda")``, ``cupy.asarray(a)`` and ``torch.from_dlpack(a)`` view
    it without a copy. There is no implicit conversion to numpy: call :meth:`get`.
    """

    __slots__ = (
        "__weakref__",
        "_base",
        "_device",
        "_dl_device_type",
        "_dtype",
        "_ptr",
        "_readonly",
        "_shape",
        "_stream",
        "_strides",
    )

    def __init__(
        self,
        ptr: int,
        shape: tuple[int, ...],
        dtype: np.dtype,
        strides: tuple[int, ...],
        device: int,
        stream: int,
        base: Any,
        readonly: bool = False,
        dl_device_type: int = _dlpack.KDL_CUDA,
    ):
        # internal: the public constructors validate; see from_ptr
        self._ptr = ptr
        self._shape = shape
        self._dtype = dtype
        self._strides = strides
        self._device = device
        self._stream = stream
        self._base = base
        self._readonly = readonly
        self._dl_device_type = dl_device_type

    @classmethod
    def from_ptr(
        cls,
        ptr: int,
        shape: Any,
        dtype: Any,
        strides: Iterable[int] | None = None,
        *,
        device: int | None = None,
        stream: Any = None,
        owner: Any = None,
        readonly: bool = False,
        check: bool = True,
        allow_managed: bool = False,
    ) -> DeviceArray:
        """View existing device memory at *ptr* (not owned: nothing is freed here).

        Parameters
        ----------
        ptr : int
            Device address.
        shape, dtype
            Array shape and element type (a cuDNN-supported dtype).
        strides : sequence of int, optional
            In bytes; default C-contiguous.
        device : int, optional
            Device ordinal; found from the pointer when *check* (else the current device).
        stream : optional
            The stream the data is ordered on (default 0).
        owner : object, optional
            Kept alive as long as the view (whatever owns the memory).
        check : bool
            Check the pointer with :func:`check_device_pointer` (needs a GPU).
        """
        dt = _numpy_dtype(dtype)
        shp = _as_shape(shape)
        st = _c_strides(shp, dt.itemsize) if strides is None else tuple(int(s) for s in strides)
        if len(st) != len(shp):
            raise ValueError(f"strides {st} do not match shape {shp}")
        ptr = int(ptr)
        size = math.prod(shp)
        if check and size:
            dev = check_device_pointer(ptr, device, argument="ptr", allow_managed=allow_managed)
        elif device is not None:
            dev = int(device)
        else:
            dev = _default_device()
        return cls(ptr, shp, dt, st, dev, coerce_stream(stream), owner, bool(readonly))

    # -- metadata -------------------------------------------------------------------------------
    @property
    def ptr(self) -> int:
        return self._ptr

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def strides(self) -> tuple[int, ...]:
        return self._strides

    @property
    def device(self) -> int:
        return self._device

    @property
    def stream(self) -> int:
        return self._stream

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def size(self) -> int:
        return math.prod(self._shape)

    @property
    def itemsize(self) -> int:
        return self._dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self._dtype.itemsize

    @property
    def readonly(self) -> bool:
        return self._readonly

    @property
    def base(self) -> Any:
        """What keeps the memory alive (pycudnn's allocation, or the viewed object)."""
        return self._base

    @property
    def data_type(self) -> enums.DataType:
        """The cuDNN ``DataType`` of the elements."""
        return _types.as_data_type(self._dtype)

    @property
    def is_c_contiguous(self) -> bool:
        return _is_c_contiguous(self._shape, self._strides, self._dtype.itemsize)

    @property
    def is_dense(self) -> bool:
        """No gaps, overlaps or negative strides, in any dimension order (C, NHWC, F, ...)."""
        return _is_dense(self._shape, self._strides, self._dtype.itemsize)

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d DeviceArray")
        return self._shape[0]

    def __repr__(self) -> str:
        layout = "" if self.is_c_contiguous else f", strides={self._strides}"
        return (
            f"DeviceArray(shape={self._shape}, dtype={self._dtype.name}{layout}, "
            f"device={self._device}, ptr=0x{self._ptr:x})"
        )

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError(
            "implicit conversion of a DeviceArray to numpy is not allowed; call .get() to copy "
            "it to the host"
        )

    def reshape(self, *shape: Any) -> DeviceArray:
        """A view with a new shape (C-contiguous arrays only; one dimension may be -1)."""
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = tuple(shape[0])
        shape = tuple(int(s) for s in shape)
        if shape.count(-1) > 1:
            raise ValueError("only one dimension can be -1")
        if -1 in shape:
            rest = math.prod(s for s in shape if s != -1)
            if rest == 0 or self.size % rest:
                raise ValueError(f"cannot reshape size {self.size} into {shape}")
            shape = tuple(self.size // rest if s == -1 else s for s in shape)
        new = _as_shape(shape)
        if math.prod(new) != self.size:
            raise ValueError(f"cannot reshape size {self.size} into {new}")
        if not self.is_c_contiguous:
            raise ValueError("reshape needs a C-contiguous array; copy it first")
        return self._view(self._ptr, new, _c_strides(new, self.itemsize))

    def _view(self, ptr: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> DeviceArray:
        """A view of the same memory (keeps the allocation, or this array, alive)."""
        return DeviceArray(
            ptr,
            shape,
            self._dtype,
            strides,
            self._device,
            self._stream,
            self._base if self._base is not None else self,
            self._readonly,
            self._dl_device_type,
        )

    def __getitem__(self, key: Any) -> DeviceArray:
        """Basic indexing, as in numpy: ints, slices (any step), ``...`` and ``None``.

        Returns a view (no copy); an int removes its dimension. Boolean and array indexing are
        not supported.
        """
        if not isinstance(key, tuple):
            key = (key,)
        if sum(k is Ellipsis for k in key) > 1:
            raise IndexError("an index can only have a single ellipsis ('...')")
        ndim = len(self._shape)
        n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
        if n_real > ndim:
            raise IndexError(f"too many indices: array is {ndim}-dimensional, {n_real} given")
        fill = (slice(None),) * (ndim - n_real)
        if Ellipsis in key:
            at = next(i for i, k in enumerate(key) if k is Ellipsis)
            key = key[:at] + fill + key[at + 1 :]
        else:
            key = key + fill
        ptr = self._ptr
        shape: list[int] = []
        strides: list[int] = []
        dim = 0
        for k in key:
            if k is None:
                shape.append(1)
                strides.append(0)
                continue
            n, st = self._shape[dim], self._strides[dim]
            dim += 1
            if isinstance(k, slice):
                start, stop, step = k.indices(n)
                length = len(range(start, stop, step))
                if length:
                    ptr += start * st
                shape.append(length)
                strides.append(st * step)
                continue
            if isinstance(k, (bool, np.bool_)) or not hasattr(k, "__index__"):
                raise IndexError(
                    f"only integers, slices, '...' and None index a DeviceArray, not {k!r}"
                )
            i = operator.index(k)
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for axis {dim - 1} with size {n}")
            ptr += (i % n) * st
        return self._view(ptr, tuple(shape), tuple(strides))

    def transpose(self, *axes: Any) -> DeviceArray:
        """A view with the dimensions permuted (default: reversed), as ``numpy.transpose``.

        ``x.transpose(0, 3, 1, 2)`` views NHWC-ordered data as NCHW without a copy.
        """
        if len(axes) == 1 and not isinstance(axes[0], (int, np.integer)):
            axes = tuple(axes[0])
        ndim = len(self._shape)
        order = tuple(reversed(range(ndim))) if not axes else tuple(operator.index(a) for a in axes)
        order = tuple(a + ndim if a < 0 else a for a in order)
        if sorted(order) != list(range(ndim)):
            raise ValueError(f"axes {axes} are not a permutation of {ndim} dimensions")
        return self._view(
            self._ptr,
            tuple(self._shape[a] for a in order),
            tuple(self._strides[a] for a in order),
        )

    @property
    def T(self) -> DeviceArray:
        """The transposed view (dimensions reversed)."""
        return self.transpose()

    # -- protocols ------------------------------------------------------------------------------
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """Version 3: the stream is this array's (1 for the legacy default stream)."""
        return {
            "shape": self._shape,
            "typestr": self._dtype.str,
            "descr": [("", self._dtype.str)],
            "data": (self._ptr, self._readonly),
            "version": 3,
            "strides": None if self.is_c_contiguous else self._strides,
            "stream": self._stream or 1,
        }

    def __dlpack_device__(self) -> tuple[int, int]:
        return (self._dl_device_type, self._device)

    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """Export as a DLPack capsule (``dltensor``, or ``dltensor_versioned`` if asked).

        Parameters
        ----------
        stream : int, optional
            The consumer's stream: ``None`` or ``1`` the legacy default stream, ``2`` the
            per-thread default stream, another int a ``cudaStream_t``, ``-1`` no
            synchronization. The consumer's stream is made to wait for this array's stream.
        max_version : (int, int), optional
            The highest DLPack version the consumer reads; ``>= (1, 0)`` gives a versioned
            capsule.
        dl_device : (int, int), optional
            Must be this array's device.
        copy : bool, optional
            True exports a fresh copy; False/None never copies.
        """
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(
                f"cannot export to device {tuple(dl_device)}: the array is on "
                f"{self.__dlpack_device__()} and __dlpack__ does not copy across devices"
            )
        if (
            stream is not None
            and stream != -1
            and (isinstance(stream, bool) or not isinstance(stream, int) or stream < 0)
        ):
            raise ValueError(f"__dlpack__: stream={stream!r} is not a CUDA stream integer")
        src = self.copy() if copy else self  # queued on our stream, so the wait covers it
        if stream != -1 and src.size:
            _stream_wait(1 if stream is None or stream == 0 else stream, src._stream, src._device)
        versioned = max_version is not None and int(max_version[0]) >= 1
        return _dlpack.export(
            src,
            src._ptr,
            src._shape,
            None if src.is_c_contiguous else src._strides,
            src._dtype,
            src.__dlpack_device__(),
            versioned=versioned,
            read_only=src._readonly,
            copied=bool(copy),
        )

    # -- transfers ------------------------------------------------------------------------------
    def _stream_of(self, stream: Any) -> int:
        return self._stream if stream is None else coerce_stream(stream)

    def get(self, stream: Any = None) -> np.ndarray:
        """Copy to a new numpy array (waits for the copy to finish).

        Parameters
        ----------
        stream : optional
            Stream to copy on; default the array's stream.

        Returns
        -------
        numpy.ndarray
            Same shape and dtype; same strides when the array is dense (C, NHWC, ...), else
            C-contiguous.
        """
        sid = self._stream_of(stream)
        itemsize = self.itemsize
        if self.size == 0:
            return np.empty(self._shape, self._dtype)
        lo, hi = _extent(self._shape, self._strides, itemsize)
        host = np.empty(hi - lo, np.uint8)
        host_ptr = host.ctypes.data
        rt = _runtime()
        with DeviceContext(self._device):
            _stream_wait(sid, self._stream, self._device)
            _check(
                rt.cudaMemcpyAsync(
                    host_ptr, self._ptr + lo, hi - lo, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost, sid
                ),
                "cudaMemcpyAsync",
            )
            _check(rt.cudaStreamSynchronize(sid), "cudaStreamSynchronize")
        out = np.ndarray(self._shape, self._dtype, buffer=host, offset=-lo, strides=self._strides)
        if self.is_dense:
            return out
        return np.array(out, copy=True)

    def copy_(self, src: Any, stream: Any = None) -> DeviceArray:
        """Copy *src* (a numpy array or any device array) into this array, in place.

        Shapes and dtypes must match. Both layouts must be dense; a device source must have
        the same strides (a host source may have any layout). Returns ``self``.
        """
        if self._readonly:
            raise ValueError("the array is read-only")
        sid = self._stream_of(stream)
        if not self.is_dense:
            raise NotImplementedError(
                "copy_ into a non-dense view (gaps or overlaps) is not supported; copy into a "
                "dense array instead"
            )
        rt = _runtime()
        if _is_host_array(src):
            host = np.asarray(src)
            if host.dtype != self._dtype or host.shape != self._shape:
                raise ValueError(
                    f"copy_: source {host.shape} {host.dtype} does not match the array "
                    f"{self._shape} {self._dtype}"
                )
            host = _host_in_layout(host, self._strides)
            lo, hi = _extent(self._shape, self._strides, self.itemsize)
            if hi > lo:
                with DeviceContext(self._device):
                    _stream_wait(sid, self._stream, self._device)
                    _check(
                        rt.cudaMemcpyAsync(
                            self._ptr,
                            host.ctypes.data,
                            hi - lo,
                            rt.cudaMemcpyKind.cudaMemcpyHostToDevice,
                            sid,
                        ),
                        "cudaMemcpyAsync",
                    )
            return self
        other = asarray(src, stream=sid)
        if other.dtype != self._dtype or other.shape != self._shape:
            raise ValueError(
                f"copy_: source {other.shape} {other.dtype} does not match the array "
                f"{self._shape} {self._dtype}"
            )
        if self.size == 0:
            return self
        if not other.is_dense or not _same_layout(other, self):
            raise NotImplementedError(
                f"copy_ between different device layouts (strides {other.strides} -> "
                f"{self._strides}) is not supported; make the source contiguous first"
            )
        with DeviceContext(self._device):
            _stream_wait(sid, self._stream, self._device)
            _stream_wait(sid, other._stream, other._device)
            _check(
                rt.cudaMemcpyAsync(
                    self._ptr, other._ptr, self.nbytes, rt.cudaMemcpyKind.cudaMemcpyDefault, sid
                ),
                "cudaMemcpyAsync",
            )
        return self

    def copy(self, stream: Any = None) -> DeviceArray:
        """A new array with the same contents and (dense) layout."""
        out = empty_like(self, stream=self._stream_of(stream))
        return out.copy_(self, stream=out._stream)

    def fill_(self, value: Any, stream: Any = None) -> DeviceArray:
        """Set every element to *value* (stream-ordered memset; the array must be dense)."""
        if self._readonly:
            raise ValueError("the array is read-only")
        if not self.is_dense:
            raise NotImplementedError("fill_ of a non-dense view is not supported")
        sid = self._stream_of(stream)
        pattern = np.array(value, dtype=self._dtype).tobytes()  # numpy checks range and kind
        n = self.size
        if n == 0:
            return self
        rt = _runtime()
        with DeviceContext(self._device):
            _stream_wait(sid, self._stream, self._device)
            if pattern == pattern[:1] * len(pattern):  # one repeated byte (0, any 1-byte type)
                _check(rt.cudaMemsetAsync(self._ptr, pattern[0], self.nbytes, sid), "cudaMemset")
                return self
            # the driver memsets need the primary context current on this thread
            _check(rt.cudaSetDevice(self._device), "cudaSetDevice")
            dr = _driver()
            word = int.from_bytes(pattern[:4].ljust(4, b"\0"), "little")
            if len(pattern) == 2:
                res = dr.cuMemsetD16Async(self._ptr, word & 0xFFFF, n, sid)
            elif len(pattern) == 4:
                res = dr.cuMemsetD32Async(self._ptr, word, n, sid)
            else:  # 8 bytes: two strided 32-bit memsets
                high = int.from_bytes(pattern[4:8], "little")
                res = dr.cuMemsetD2D32Async(self._ptr, 8, word, 1, n, sid)
                if int(res[0]) == 0:
                    res = dr.cuMemsetD2D32Async(self._ptr + 4, 8, high, 1, n, sid)
            if int(res[0]) != 0:
                raise CudaError("cuMemsetAsync", int(res[0]), getattr(res[0], "name", ""))
        return self

    def synchronize(self) -> None:
        """Wait for the work queued on the array's stream."""
        with DeviceContext(self._device):
            _check(_runtime().cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")


def _same_layout(a: DeviceArray, b: DeviceArray) -> bool:
    if a.is_c_contiguous and b.is_c_contiguous:
        return True
    return all(n == 1 or sa == sb for n, sa, sb in zip(a.shape, a.strides, b.strides, strict=True))


def _is_host_array(obj: Any) -> bool:
    return isinstance(obj, np.ndarray | np.generic | list | tuple | int | float)


def _host_in_layout(host: np.ndarray, strides: tuple[int, ...]) -> np.ndarray:
    """*host*'s elements laid out with the dense byte *strides* (copied only if needed)."""
    itemsize = host.itemsize
    if host.strides == strides and _is_dense(host.shape, strides, itemsize):
        return host
    if host.flags.c_contiguous and _is_c_contiguous(host.shape, strides, itemsize):
        return host
    buf = np.empty(host.size, host.dtype)
    np.ndarray(host.shape, host.dtype, buffer=buf, strides=strides)[...] = host
    return buf


def _default_device() -> int:
    try:
        return current_device()
    except (CudaUnavailableError, RuntimeError):
        return 0


def _resolve(device: Any, stream: Any, what: str) -> tuple[int, int]:
    if device is None:
        require_gpu(what)
        dev = current_device()
    else:
        dev = _validate_device(device, what)
    return dev, coerce_stream(stream)


# A validated layout: (shape, numpy dtype, byte strides, nbytes, size class).
_Layout = tuple[tuple[int, ...], np.dtype, tuple[int, ...], int, int]
# empty()'s arguments (shape, dtype, strides, device) as given -> their validated layout, so a
# repeated call (the convolution's output) skips the validation: one dict lookup. The device is
# in the key, so a hit also means the device was validated. Cleared when it grows past the cap.
_layouts: dict[Any, _Layout] = {}
_LAYOUTS_MAX = 4096


def _layout(shape: tuple[int, ...], dtype: np.dtype, strides: tuple[int, ...] | None) -> _Layout:
    itemsize = dtype.itemsize
    if strides is None:
        strides = _c_strides(shape, itemsize)
    elif len(strides) != len(shape) or not _is_dense(shape, strides, itemsize):
        raise ValueError(
            f"strides {strides} are not a dense layout of shape {shape} with itemsize {itemsize}"
        )
    nbytes = math.prod(shape) * itemsize
    return shape, dtype, strides, nbytes, _size_class(nbytes) if nbytes else 0


def _new_array(lay: _Layout, device: int, sid: int, keep: Any) -> DeviceArray:
    shape, dtype, strides, nbytes, cls = lay
    if not nbytes:
        return DeviceArray(0, shape, dtype, strides, device, sid, None)
    blk = _new_block(device, sid, nbytes, cls, keep)
    return DeviceArray(blk.ptr, shape, dtype, strides, device, sid, blk)


def _allocate(
    shape: tuple[int, ...],
    dtype: np.dtype,
    strides: tuple[int, ...] | None,
    device: int,
    sid: int,
    keep: Any,
) -> DeviceArray:
    return _new_array(_layout(shape, dtype, strides), device, sid, keep)


# -- public constructors -------------------------------------------------------------------------
def empty(
    shape: Any,
    dtype: Any = np.float32,
    device: int | None = None,
    stream: Any = None,
    *,
    strides: Iterable[int] | None = None,
) -> DeviceArray:
    """A new, uninitialized device array.

    Parameters
    ----------
    shape : int or sequence of int
    dtype : dtype-like
        float16, bfloat16, float32 (default), float64, int8, int32, int64, uint8 or bool.
    device : int, optional
        Default the current device.
    stream : optional
        Stream the allocation is ordered on (and later freed on); default 0.
    strides : sequence of int, optional
        A dense layout in bytes (e.g. NHWC strides for an NCHW shape); default C order.

    Raises
    ------
    CudaUnavailableError
        Without a usable GPU (a ``RuntimeError`` saying one is needed and what was found).
    AllocationError
        Out of device memory (a ``MemoryError``), naming the bytes asked for and free.

    Notes
    -----
    The memory comes from the caching allocator (see :func:`cache_stats`). A call repeating
    earlier arguments with an int *device* and an int (or no) *stream* skips the argument
    validation: a cache hit then makes no CUDA call and costs a few microseconds.
    """
    if device is None and _layouts:  # entries exist only once a GPU was validated
        device = current_device()
    if type(device) is int and (stream is None or type(stream) is int):
        # fast path: arguments seen before, a device ordinal and an int stream (no object to
        # keep alive): the validated layout is a dict lookup away
        try:
            lay = _layouts.get((shape, dtype, strides, device))
        except TypeError:  # unhashable (a list): the slow path validates it
            lay = None
        if lay is not None and (stream is None or stream >= 0):
            shp, dt, st, nbytes, cls = lay  # _new_array, inlined
            sid = stream or 0
            if not nbytes:
                return DeviceArray(0, shp, dt, st, device, sid, None)
            blk = _new_block(device, sid, nbytes, cls, None)
            return DeviceArray(blk.ptr, shp, dt, st, device, sid, blk)
    dt = _numpy_dtype(dtype)
    shp = _as_shape(shape)
    st = None if strides is None else tuple(int(s) for s in strides)
    dev, sid = _resolve(device, stream, "pycudnn.empty")
    lay = _layout(shp, dt, st)
    if type(device) is int:
        if len(_layouts) >= _LAYOUTS_MAX:
            _layouts.clear()
        try:
            _layouts[(shape, dtype, strides, device)] = lay
        except TypeError:
            pass
        _layouts[(shp, dt, st, dev)] = lay
    return _new_array(lay, dev, sid, _keep(stream))


def _keep(stream: Any) -> Any:
    return None if stream is None or isinstance(stream, int) else stream


def zeros(
    shape: Any,
    dtype: Any = np.float32,
    device: int | None = None,
    stream: Any = None,
    *,
    strides: Iterable[int] | None = None,
) -> DeviceArray:
    """Like :func:`empty`, filled with zeros (a stream-ordered memset)."""
    out = empty(shape, dtype, device, stream, strides=strides)
    if out.nbytes:
        rt = _runtime()
        with DeviceContext(out.device):
            _check(rt.cudaMemsetAsync(out.ptr, 0, out.nbytes, out.stream), "cudaMemsetAsync")
    return out


def empty_like(
    a: Any, dtype: Any = None, *, device: int | None = None, stream: Any = None
) -> DeviceArray:
    """A new array with *a*'s shape and (if dense) layout; dtype and device default to *a*'s."""
    shape = tuple(a.shape)
    dt = _numpy_dtype(a.dtype if dtype is None else dtype)
    src_strides = tuple(getattr(a, "strides", None) or ())
    src_dt = np.dtype(a.dtype) if not isinstance(a, DeviceArray) else a.dtype
    strides = None
    if (
        len(src_strides) == len(shape)
        and _is_dense(shape, src_strides, src_dt.itemsize)
        and not _is_c_contiguous(shape, src_strides, src_dt.itemsize)
    ):
        # same dimension order, rescaled to the new item size
        strides = tuple(s // src_dt.itemsize * dt.itemsize for s in src_strides)
    if device is None:
        device = getattr(a, "device", None)
        device = device if isinstance(device, int) else None
    if stream is None and isinstance(a, DeviceArray):
        stream = a.stream
    return empty(shape, dt, device, stream, strides=strides)


def to_device(
    array: Any, stream: Any = None, *, device: int | None = None, dtype: Any = None
) -> DeviceArray:
    """Copy a host array (numpy, or anything ``numpy.asarray`` accepts) to a new device array.

    Parameters
    ----------
    array : array-like
        Host data. A dense layout (C, Fortran, NHWC-as-NCHW transposes) is kept; any other is
        made C-contiguous first. bfloat16 host arrays use ``ml_dtypes.bfloat16``.
    stream : optional
        Stream to copy on (and that the new array is ordered on); default 0.
    device : int, optional
        Default the current device.
    dtype : dtype-like, optional
        Convert on the host first.

    Returns
    -------
    DeviceArray

    Examples
    --------
    >>> x = pycudnn.to_device(np.ones((2, 3), np.float32))
    >>> x.get()
    array([[1., 1., 1.],
           [1., 1., 1.]], dtype=float32)
    """
    if isinstance(array, DeviceArray) or (
        not _is_host_array(array)
        and (hasattr(array, "__cuda_array_interface__") or _dlpack_device_type(array) == 2)
    ):
        src = asarray(array, stream=stream)
        if dtype is not None and _numpy_dtype(dtype) != src.dtype:
            raise TypeError("to_device copies device data as is; it cannot convert its dtype")
        return src.copy(stream=stream)
    host = np.asarray(array, dtype=None if dtype is None else _numpy_dtype(dtype))
    dt = _numpy_dtype(host.dtype, argument="array.dtype")
    if host.dtype != dt:
        host = host.astype(dt)
    strides: tuple[int, ...] | None
    if _is_dense(host.shape, host.strides, host.itemsize) and not host.flags.c_contiguous:
        strides = host.strides
    else:
        host = np.array(host, order="C", copy=not host.flags.c_contiguous)  # keeps 0-d
        strides = None
    dev, sid = _resolve(device, stream, "pycudnn.to_device")
    out = _allocate(host.shape, dt, strides, dev, sid, _keep(stream))
    if out.nbytes:
        rt = _runtime()
        base = host.ctypes.data + _extent(host.shape, host.strides, host.itemsize)[0]
        with DeviceContext(dev):
            _check(
                rt.cudaMemcpyAsync(
                    out.ptr, base, out.nbytes, rt.cudaMemcpyKind.cudaMemcpyHostToDevice, sid
                ),
                "cudaMemcpyAsync",
            )
    return out


def _dlpack_device(obj: Any) -> tuple[int, int] | None:
    """``obj.__dlpack_device__()`` as ints, or None when absent or failing."""
    fn = getattr(obj, "__dlpack_device__", None)
    if fn is None:
        return None
    try:
        kind, ordinal = fn()
        return int(kind), int(ordinal)
    except Exception:
        return None


def _dlpack_device_type(obj: Any) -> int | None:
    dl = _dlpack_device(obj)
    return None if dl is None else dl[0]


def _host_error(obj: Any, argument: str) -> NotDeviceMemoryError:
    return NotDeviceMemoryError(
        f"{argument} is a host array ({type(obj).__module__}.{type(obj).__name__}); pycudnn "
        "works on GPU memory: copy it with pycudnn.to_device(x) first"
    )


def asarray(
    obj: Any,
    *,
    stream: Any = None,
    device: int | None = None,
    check: bool = True,
    allow_managed: bool = False,
    argument: str = "array",
) -> DeviceArray:
    """View *obj* as a :class:`DeviceArray` without copying.

    Parameters
    ----------
    obj
        A ``DeviceArray`` (returned as is), or any object with ``__cuda_array_interface__`` or
        ``__dlpack__``: torch tensors, CuPy arrays, JAX arrays, Numba device arrays...
    stream : optional
        The stream the view will be used on; the producer's pending work is ordered before it
        (protocol stream / ``__dlpack__(stream=...)``). Default 0, the legacy default stream.
    device : int, optional
        Expected device: a view on another device raises ``ValueError``.
    check : bool
        Query the pointer's attributes (``__cuda_array_interface__`` carries no device): needs a
        GPU. ``check=False`` trusts the producer and takes *device* (or the current device).
    allow_managed : bool
        Accept managed (unified) memory.
    argument : str
        Name used in error messages.

    Raises
    ------
    NotDeviceMemoryError
        For host arrays (numpy, CPU tensors): a ``TypeError`` naming :func:`to_device`.
    TypeError
        For objects that expose no device-array protocol, or unsupported dtypes.
    ValueError
        For a view on another device than *device*.

    Notes
    -----
    The view keeps *obj* (or, for DLPack, the producer's deleter) alive. Writes through the view
    are visible to *obj* and the other way round.
    """
    if isinstance(obj, DeviceArray):
        if device is not None and obj.device != int(device):
            raise ValueError(f"{argument} is on device {obj.device}, expected device {device}")
        return obj
    if _is_host_array(obj):
        raise _host_error(obj, argument)
    sid = coerce_stream(stream)
    has_dlpack = hasattr(obj, "__dlpack__")
    if type(obj).__name__ == "PyCapsule":  # a bare DLPack capsule (torch.utils.dlpack.to_dlpack)
        return _from_dlpack(obj, sid, device, check, allow_managed, argument)
    cai_error: BaseException | None = None
    cai = None
    # torch labels bfloat16 '<f2' in its __cuda_array_interface__ (and others use '<V2'): for
    # bfloat16 only DLPack says the truth, so take that road whenever the object says bfloat16
    if not (has_dlpack and "bfloat16" in str(getattr(obj, "dtype", ""))):
        try:
            cai = obj.__cuda_array_interface__
        except AttributeError as exc:
            cai_error = exc if hasattr(type(obj), "__cuda_array_interface__") else None
        except Exception as exc:  # torch refuses tensors that require grad
            cai_error = exc
    if cai is not None:
        try:
            return _from_cai(obj, cai, sid, device, check, allow_managed, argument)
        except TypeError:
            if not has_dlpack:
                raise
            # an untyped CAI typestr ('<V2'): let DLPack say what the elements are
    if has_dlpack:
        return _from_dlpack(obj, sid, device, check, allow_managed, argument)
    if cai_error is not None:
        raise cai_error
    if hasattr(obj, "__array_interface__") or hasattr(obj, "__array__"):
        raise _host_error(obj, argument)
    raise TypeError(
        f"{argument}: cannot view {type(obj).__name__} as a device array; pass a pycudnn "
        "DeviceArray or an object with __cuda_array_interface__ or __dlpack__ (torch, CuPy, JAX), "
        "or copy host data with pycudnn.to_device()"
    )


def _cai_dtype(typestr: str, descr: Any, argument: str) -> np.dtype:
    try:
        dt = np.dtype(typestr)
    except TypeError:
        raise TypeError(f"{argument}: unknown typestr {typestr!r}") from None
    if dt.kind == "V":
        raise TypeError(
            f"{argument}: typestr {typestr!r} is an untyped {dt.itemsize}-byte type; "
            "__cuda_array_interface__ cannot say bfloat16 - pass the array through DLPack "
            "(its __dlpack__) instead"
        )
    if dt.byteorder == ">":
        raise TypeError(f"{argument}: big-endian data ({typestr!r}) is not supported")
    return _numpy_dtype(dt, argument=f"{argument}.dtype")


def _from_cai(
    obj: Any,
    cai: dict[str, Any],
    sid: int,
    device: int | None,
    check: bool,
    allow_managed: bool,
    argument: str,
) -> DeviceArray:
    version = int(cai.get("version", 0))
    if version < 2:
        raise TypeError(f"{argument}: __cuda_array_interface__ version {version} is too old (< 2)")
    if cai.get("mask") is not None:
        raise NotImplementedError(f"{argument}: masked __cuda_array_interface__ arrays")
    shape = _as_shape(cai["shape"])
    dt = _cai_dtype(cai["typestr"], cai.get("descr"), argument)
    ptr, readonly = cai["data"]
    ptr = int(ptr or 0)
    raw_strides = cai.get("strides")
    strides = (
        _c_strides(shape, dt.itemsize)
        if raw_strides is None
        else tuple(int(s) for s in raw_strides)
    )
    if len(strides) != len(shape):
        raise ValueError(f"{argument}: strides {strides} do not match shape {shape}")
    size = math.prod(shape)
    dl = _dlpack_device(obj) if check and size else None
    if dl is not None and dl[0] == _dlpack.KDL_CUDA:
        dev = dl[1]  # the producer says where it lives: no pointer query needed (torch, CuPy)
    elif dl is not None and dl[0] in (_dlpack.KDL_CPU, _dlpack.KDL_CUDA_HOST):
        raise _host_error(obj, argument)
    elif check and size:
        dev = check_device_pointer(ptr, None, argument=argument, allow_managed=allow_managed)
    elif device is not None:
        dev = int(device)
    else:
        dev = _default_device()
    if device is not None and dev != int(device):
        raise ValueError(f"{argument} is on device {dev}, expected device {int(device)}")
    producer = cai.get("stream") if version >= 3 else None
    if producer is not None:
        producer = int(producer)
        if producer == 0:
            raise ValueError(
                f"{argument}: __cuda_array_interface__ stream 0 is not allowed (v3: use 1 for "
                "the legacy default stream, 2 for per-thread)"
            )
        if size:
            _stream_wait(sid, producer, dev)
    return DeviceArray(ptr, shape, dt, strides, dev, sid, obj, bool(readonly))


def _from_dlpack(
    obj: Any, sid: int, device: int | None, check: bool, allow_managed: bool, argument: str
) -> DeviceArray:
    dev_type = _dlpack_device_type(obj)
    allowed = {_dlpack.KDL_CUDA} | ({_dlpack.KDL_CUDA_MANAGED} if allow_managed else set())
    if dev_type in (_dlpack.KDL_CPU, _dlpack.KDL_CUDA_HOST):
        raise _host_error(obj, argument)
    if dev_type is not None and dev_type not in allowed:
        extra = " (pass allow_managed=True)" if dev_type == _dlpack.KDL_CUDA_MANAGED else ""
        raise NotDeviceMemoryError(
            f"{argument}: DLPack device {_dlpack.device_name(dev_type)} is not CUDA device "
            f"memory{extra}"
        )
    # a CUDA producer orders its work before our stream (1: the legacy default stream); one that
    # does not say where it lives gets no stream (CPU producers refuse any)
    cuda_like = dev_type in (_dlpack.KDL_CUDA, _dlpack.KDL_CUDA_MANAGED)
    imported = _dlpack.from_dlpack(obj, stream=(sid or 1) if cuda_like else None)
    if imported.device_type in (_dlpack.KDL_CPU, _dlpack.KDL_CUDA_HOST):
        raise _host_error(obj, argument)
    if imported.device_type not in allowed:
        raise NotDeviceMemoryError(
            f"{argument}: DLPack device {_dlpack.device_name(imported.device_type)} is not CUDA "
            "device memory"
        )
    dt = _numpy_dtype(imported.dtype, argument=f"{argument}.dtype")
    dev = imported.device_id
    if device is not None and dev != int(device):
        raise ValueError(f"{argument} is on device {dev}, expected device {int(device)}")
    shape = imported.shape
    strides = imported.strides if imported.strides is not None else _c_strides(shape, dt.itemsize)
    base = (obj, imported.owner)  # the producer object and its deleter guard
    return DeviceArray(
        imported.data,
        shape,
        dt,
        strides,
        dev,
        sid,
        base,
        imported.read_only,
        imported.device_type,
    )


def check_operand(
    obj: Any,
    device: Any,
    *,
    argument: str,
    c_contiguous: bool = False,
    dense: bool = False,
    dtype: Any = None,
    allow_managed: bool = False,
    stream: Any = None,
) -> DeviceArray:
    """Validate an operand of a cuDNN call and return it as a :class:`DeviceArray`.

    Parameters
    ----------
    obj
        Any device array (see :func:`asarray`). Host arrays raise ``TypeError`` naming
        :func:`to_device`.
    device : int or Handle
        The handle's device: the operand must live there.
    argument : str
        The argument name for error messages (``"img"``).
    c_contiguous, dense : bool
        Require a C-contiguous / dense (any dimension order) layout.
    dtype : dtype-like, optional
        Require this dtype.

    Raises
    ------
    NotDeviceMemoryError, TypeError, ValueError
        Host data, wrong device, misalignment (pointer not a multiple of the item size),
        wrong dtype, or a layout the operation cannot use.
    """
    dev = int(getattr(device, "device", device))
    arr = asarray(obj, stream=stream, allow_managed=allow_managed, argument=argument)
    if arr.device != dev:
        raise ValueError(
            f"{argument} is on device {arr.device}, but the handle is on device {dev}; use "
            f"pycudnn.get_handle({arr.device}) or move the data"
        )
    if arr.size:
        check_alignment(arr.ptr, arr.itemsize, argument=argument)
    if dtype is not None and arr.dtype != _numpy_dtype(dtype):
        raise TypeError(
            f"{argument} has dtype {arr.dtype}, expected {np.dtype(_numpy_dtype(dtype))}"
        )
    if c_contiguous and not arr.is_c_contiguous:
        raise ValueError(
            f"{argument} must be C-contiguous; got shape {arr.shape} with strides {arr.strides} "
            "bytes (make it contiguous, e.g. tensor.contiguous())"
        )
    if dense and not arr.is_dense:
        raise ValueError(
            f"{argument} must be dense (no gaps, overlaps or negative strides); got shape "
            f"{arr.shape} with strides {arr.strides} bytes"
        )
    return arr


# -- workspaces ----------------------------------------------------------------------------------
def _workspaces(handle: Any) -> dict[int, _Allocation]:
    try:
        return handle._workspaces
    except AttributeError:
        raise TypeError(
            f"get_workspace needs a pycudnn Handle, not {type(handle).__name__}"
        ) from None


def get_workspace(handle: Any, nbytes: int, stream: Any = None) -> tuple[int, int]:
    """A device workspace of at least *nbytes* for *handle* on *stream*: ``(ptr, size)``.

    One grow-only buffer per (handle, stream): a smaller request reuses it, a larger one frees
    it (stream-ordered) and allocates anew. Zero bytes gives ``(0, 0)`` unless a buffer exists.
    The pointer stays valid for work queued on *stream* until the next larger request for the
    same (handle, stream), or until the handle is closed.

    Parameters
    ----------
    handle : Handle
    nbytes : int
    stream : optional
        Default the handle's stream.

    Raises
    ------
    AllocationError
        A ``MemoryError`` when *nbytes* exceeds ``pycudnn.config.workspace_limit`` or the device
        is out of memory; the message names the bytes asked for and free, and the exception has
        ``requested``, ``free`` and ``total`` attributes. Catch it to fall back to an algorithm
        with a smaller workspace.
    """
    nbytes = int(nbytes)
    if nbytes < 0:
        raise ValueError(f"workspace size {nbytes} is negative")
    table = _workspaces(handle)
    sid = handle.stream if stream is None else coerce_stream(stream)
    ws = table.get(sid)
    if ws is not None and ws.nbytes >= nbytes:
        return ws.ptr, ws.nbytes
    if nbytes == 0:
        return 0, 0
    device = handle.device
    limit = config.workspace_limit
    if limit is not None and nbytes > limit:
        raise _allocation_error(
            nbytes, device, "get_workspace", "more than the workspace limit", limit=limit
        )
    if ws is not None:  # grow: free the old one first, in order on the stream it was used on
        del table[sid]
        ws.release(sid)
    size = -(-nbytes // _WORKSPACE_GRANULE) * _WORKSPACE_GRANULE
    if limit is not None:
        size = min(size, limit)
    try:
        alloc = _Allocation(size, device, sid, free_sync=True)
    except errors.AllocationError:
        if size == nbytes:
            raise
        alloc = _Allocation(nbytes, device, sid, free_sync=True)
    table[sid] = alloc
    return alloc.ptr, alloc.nbytes


def workspace_size(handle: Any, stream: Any = None) -> int:
    """Bytes of the workspace *handle* holds for *stream* (default its stream); 0 if none."""
    sid = handle.stream if stream is None else coerce_stream(stream)
    ws = _workspaces(handle).get(sid)
    return 0 if ws is None else ws.nbytes


def release_workspace(handle: Any, stream: Any = None) -> None:
    """Free *handle*'s workspace for *stream* (default its stream), stream-ordered."""
    sid = handle.stream if stream is None else coerce_stream(stream)
    ws = _workspaces(handle).pop(sid, None)
    if ws is not None:
        ws.release(sid)
