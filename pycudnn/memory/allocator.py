"""Device allocations: raw CUDA allocation, the caching allocator behind arrays, and uncached
one-off allocations (the handles' workspaces).

Design decisions
----------------
* **A narrow allocate/free interface.** Array constructors allocate through
  ``memory_resource().allocate(nbytes, device, stream, keep)``, which returns a *block*: an
  object with ``ptr``, ``nbytes`` (at least what was asked), ``device`` and ``stream`` that every
  array over the memory keeps as its ``base``. Freeing is the block's business: its memory is
  given back when the block is garbage-collected (the last array over it is gone), by a
  finalizer that holds values only, never the block. The caching allocator's finalizer is a
  ``weakref.ref`` callback with the block's (pool, key, pointer) kept in a side table: measured,
  ``weakref.finalize`` cost four times as much to arm and run, on every array.
  :class:`MemoryResource` states that contract; :class:`CachingAllocator` is the
  implementation in use, and :func:`set_memory_resource` installs another (torch's allocator,
  a pool with other rules).
* **Raw allocation** (:func:`device_malloc`) is stream-ordered: ``cudaMallocAsync`` on the
  stream passed (``cudaMalloc`` where the device has no memory pools). Out of memory, the
  caching allocator's blocks on the device are released, the device synchronized (so frees still
  queued complete) and the allocation retried once before
  :class:`~pycudnn.errors.AllocationError` (a ``MemoryError`` naming the bytes asked for and
  free). Sizes of 1 TiB and more are refused at once: cuDNN has reported absurd sizes.
* **Caching allocator.** A freed block goes to a free list keyed by (stream, size class) of its
  device instead of ``cudaFreeAsync``; the next allocation of that class on the same device and
  stream takes it back with no CUDA call. Same-stream reuse is as safe as the stream-ordered free
  was (the stream orders the new work after the old); a block never moves to another stream (that
  would need an event per block). Classes: 512-byte multiples up to 1 MiB, then eight per power
  of two (< 12.5% rounding). At most :func:`get_cache_limit` idle bytes per device (default
  1 GiB, bounded because another library in the process cannot make pycudnn give memory back;
  oldest blocks freed first); blocks larger than the limit, and blocks on the per-thread default
  stream, are never cached. :func:`empty_cache`, :func:`cache_stats`.
* **One lock, and finalizers never wait for it.** Per-thread free lists would strand blocks: a
  finalizer runs on whichever thread drops the last reference (or the collector's). When the
  lock is taken (another thread, or this one with the collector running a finalizer in the middle
  of an allocation), the freed block waits in a queue that the next holder of the lock drains:
  no deadlock, no re-entrant list surgery.
* **Uncached allocations** (:class:`Allocation`) serve the handles' grow-only workspaces: the
  exact size, freed by ``close()``, by ``release(stream)`` (stream-ordered on the stream last used)
  or by their finalizer. When :func:`set_memory_resource` installed another resource (torch's
  caching allocator, through :mod:`pycudnn.torch`), workspaces come from it too
  (:func:`workspace_allocation`), so that one allocator sees all of pycudnn's device memory.
* **Finalizers** switch device through :func:`pycudnn._cuda.call_on_device` and do nothing at
  interpreter shutdown (``atexit=False``, ``sys.is_finalizing()``): the driver reclaims the
  memory with the process, and CUDA may already be gone. A stream *object* passed at allocation
  (``keep``) stays alive as long as the memory; a raw ``int`` stream must outlive it (call
  :func:`empty_cache` before destroying one you allocated on).
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from .. import _cuda, enums, errors
from .._cuda import DeviceContext, call_on_device, error_name, mem_get_info

__all__ = [
    "DEFAULT_CACHE_LIMIT",
    "Allocation",
    "Block",
    "CachingAllocator",
    "MemoryResource",
    "ResourceAllocation",
    "allocation_error",
    "cache_stats",
    "capture_allocation",
    "device_malloc",
    "empty_cache",
    "get_cache_limit",
    "get_workspace",
    "memory_resource",
    "release_workspace",
    "set_cache_limit",
    "set_memory_resource",
    "size_class",
    "workspace_allocation",
    "workspace_size",
]

ONE_TIB = 1 << 40
ASYNC, SYNC = 1, 0  # how a device allocates: cudaMallocAsync, or cudaMalloc (no memory pools)
DEFAULT_CACHE_LIMIT = 1 << 30


# -- the interface -------------------------------------------------------------------------------
@runtime_checkable
class Block(Protocol):
    """Memory handed out by a :class:`MemoryResource`; arrays over it keep it as their ``base``.

    The memory is given back when the block is garbage-collected: how (cached, freed on its
    stream) is the resource's choice, made in the block's own finalizer.
    """

    ptr: int  # device address
    nbytes: int  # usable bytes (at least what was asked)
    device: int
    stream: int  # the stream the memory is ordered on


@runtime_checkable
class MemoryResource(Protocol):
    """Where :func:`~pycudnn.memory.empty` and the other array constructors get memory."""

    def allocate(self, nbytes: int, device: int, stream: int, keep: Any = None) -> Block:
        """*nbytes* (> 0) on *device*, ordered on the int *stream*; keep *keep* (the caller's
        stream object, or None) alive as long as the memory. Raise
        :class:`~pycudnn.errors.AllocationError` when the device has no room."""
        ...


# -- raw allocation ------------------------------------------------------------------------------
def _fmt_bytes(n: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def allocation_error(
    nbytes: int, device: int, api_name: str, reason: str, *, limit: int | None = None
) -> errors.AllocationError:
    """The :class:`~pycudnn.errors.AllocationError` for *nbytes* on *device*: its message names
    the bytes asked for and free, and it carries ``requested``, ``free``, ``total`` and
    ``device`` (free/total -1 when the device cannot say); *limit* names the workspace limit."""
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
    exc = errors.OutOfMemoryError(
        enums.Status.INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED, api_name, detail
    )
    exc.requested = nbytes
    exc.free = free
    exc.total = total
    exc.device = device
    return exc


def device_malloc(
    nbytes: int, device: int, stream: int, mode: int = ASYNC, requested: int | None = None
) -> tuple[int, int]:
    """Allocate *nbytes* on *device*, ordered on *stream*: ``(ptr, mode)``.

    ``cudaMallocAsync`` (``cudaMalloc`` where the device has no memory pools: the returned
    *mode* is then :data:`SYNC`, for the caller to remember). Out of memory, the caching
    allocator's blocks on *device* are released and the device synchronized, and the allocation
    is retried once before :class:`~pycudnn.errors.AllocationError`. Errors name *requested*
    (the caller's size before rounding to a size class; default *nbytes*).
    """
    asked = nbytes if requested is None else requested
    if _cuda.is_capturing(stream):
        raise errors.StreamCaptureError(
            f"cannot allocate {_fmt_bytes(asked)} ({asked} bytes) on device {device}: stream "
            f"0x{stream:x} is capturing a CUDA graph, which cannot record pycudnn's allocation; "
            "run the call once before capturing (its plan, workspace and outputs then exist: "
            "pass out=), or install torch's allocator (pycudnn.torch.use_torch_allocator())"
        )
    if asked >= ONE_TIB:  # cuDNN has asked for > 2**63 before (see ATen's Conv_v7.cpp)
        raise allocation_error(asked, device, "cudaMallocAsync", "absurd size (>= 1 TiB)")
    rt = _cuda.runtime()
    with DeviceContext(device):
        err, ptr = rt.cudaMallocAsync(nbytes, stream) if mode else rt.cudaMalloc(nbytes)
        if mode and error_name(err) == "cudaErrorNotSupported":  # no memory pools here
            rt.cudaGetLastError()  # clears the error: its status is of no interest
            mode = SYNC
            err, ptr = rt.cudaMalloc(nbytes)
        if error_name(err) == "cudaErrorMemoryAllocation":
            rt.cudaGetLastError()
            _default.release(device, force_sync=True)
            err, ptr = rt.cudaMallocAsync(nbytes, stream) if mode else rt.cudaMalloc(nbytes)
            if error_name(err) == "cudaErrorMemoryAllocation":
                rt.cudaGetLastError()
                api_name = "cudaMallocAsync" if mode else "cudaMalloc"
                raise allocation_error(asked, device, api_name, "out of memory")
        _cuda.check((err, ptr), "cudaMallocAsync" if mode else "cudaMalloc")
    return int(ptr), mode


def _free_one(rt: Any, ptr: int, stream: int, mode: int, keep: Any) -> None:
    """Free *ptr* (run by ``call_on_device``); *keep* is only held until now. A free has no one
    to report a failure to: its status is dropped."""
    if mode == ASYNC:
        rt.cudaFreeAsync(ptr, stream)
    else:
        rt.cudaFree(ptr)


class Allocation:
    """One uncached device allocation of exactly *nbytes* (the handles' workspaces).

    Freed by :meth:`close`, :meth:`release` or its finalizer; ``free_sync=True`` makes the
    finalizer and :meth:`close` use ``cudaFree`` (safe whatever stream is alive then).
    """

    __slots__ = ("__weakref__", "_finalizer", "device", "is_async", "nbytes", "ptr", "stream")

    def __init__(
        self, nbytes: int, device: int, stream: int, keep: Any = None, *, free_sync: bool = False
    ):
        self.nbytes = nbytes
        self.device = device
        self.stream = stream
        ptr, mode = device_malloc(nbytes, device, stream)
        self.ptr = ptr
        self.is_async = mode == ASYNC
        free_mode = SYNC if free_sync else mode
        self._finalizer = weakref.finalize(
            self, call_on_device, device, _free_one, ptr, stream, free_mode, keep
        )
        self._finalizer.atexit = False

    def close(self) -> None:
        """Free now (as the finalizer would). Idempotent."""
        self._finalizer()

    def release(self, stream: int) -> None:
        """Free now, stream-ordered on *stream* (a live stream the memory was last used on)."""
        if self._finalizer.detach() is not None:
            mode = ASYNC if self.is_async else SYNC
            call_on_device(self.device, _free_one, self.ptr, stream, mode, None)


class ResourceAllocation:
    """A workspace taken from an installed :class:`MemoryResource`: :class:`Allocation`'s
    interface over a block of that resource (freed by dropping the block: the resource orders
    the free on the stream the block was allocated on)."""

    __slots__ = ("block", "device", "nbytes", "ptr", "stream")

    def __init__(self, block: Block, nbytes: int):
        self.block: Block | None = block
        self.ptr = block.ptr
        self.nbytes = nbytes
        self.device = block.device
        self.stream = block.stream

    def close(self) -> None:
        """Give the block back to its resource. Idempotent."""
        self.block = None

    def release(self, stream: int) -> None:
        """Give the block back (its resource orders the free on the block's stream)."""
        self.block = None


def capture_allocation(nbytes: int, device: int, stream: int) -> ResourceAllocation:
    """*nbytes* for one launch on *stream* while it captures a CUDA graph: a block of the
    resource :func:`set_memory_resource` installed (torch's allocator takes it from the graph's
    private pool). pycudnn's own allocations cannot be recorded by a capture: without such a
    resource, :class:`~pycudnn.errors.StreamCaptureError` saying what to do."""
    resource = _resource
    if resource is _default:
        raise errors.StreamCaptureError(
            f"cannot allocate {_fmt_bytes(nbytes)} ({nbytes} bytes) of workspace on device "
            f"{device}: stream 0x{stream:x} is capturing a CUDA graph, which cannot record "
            "pycudnn's own allocation; run the call once on this stream before capturing (its "
            "workspace then exists), or install an allocator that allocates under capture "
            "(pycudnn.torch.use_torch_allocator(): the graph's private pool)"
        )
    return ResourceAllocation(resource.allocate(nbytes, device, stream, None), nbytes)


def workspace_allocation(nbytes: int, device: int, stream: int) -> Allocation | ResourceAllocation:
    """A handle's workspace of exactly *nbytes* on (*device*, *stream*): an uncached
    :class:`Allocation` (freed with ``cudaFree``), or a block of the resource
    :func:`set_memory_resource` installed, when one is -- unless that resource has a
    ``workspace(nbytes, device, stream)`` method, which then makes it (a resource whose blocks
    must not outlive a call: torch's, whose CUDA-graph pools refuse live blocks)."""
    resource = _resource
    if resource is _default:
        return Allocation(nbytes, device, stream, free_sync=True)
    own = getattr(resource, "workspace", None)
    if own is not None:
        return own(nbytes, device, stream)
    return ResourceAllocation(resource.allocate(nbytes, device, stream, None), nbytes)


# -- caching allocator ---------------------------------------------------------------------------
_SMALL_MAX = 1 << 20  # up to 1 MiB: 512-byte classes
_SMALL_GRANULE = 512
# cudaStreamPerThread (2) is a different stream in every thread, and a finalizer runs on any
# thread: blocks on it are never cached. cuda-python can make 0 mean the per-thread stream too.
_UNCACHED_STREAMS = frozenset(
    {2, 0}
    if os.environ.get("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "0") not in ("", "0")
    else {2}
)


def size_class(nbytes: int) -> int:
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
        self.mode = ASYNC  # SYNC once the device refused cudaMallocAsync


class _Block:
    """A block of the caching allocator. When the last array over it is gone, its finalizer
    returns the memory to the cache (see :func:`_recycle`)."""

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


def _free_blocks_on(rt: Any, blocks: list[tuple[int, int]], mode: int) -> None:
    """``cudaFreeAsync`` each ``(ptr, stream)`` on its own stream (``cudaFree`` without pools).

    A free that fails (its int stream was destroyed, against the rules) falls back to a device
    synchronization and a free on the legacy default stream. Run by ``call_on_device``.
    """
    for ptr, stream in blocks:
        if mode == SYNC:
            rt.cudaFree(ptr)
            continue
        if int(rt.cudaFreeAsync(ptr, stream)[0]) != 0:
            rt.cudaGetLastError()
            rt.cudaDeviceSynchronize()
            rt.cudaFreeAsync(ptr, 0)


def _recycle(
    cache: CachingAllocator,
    pool: _Pool,
    key: tuple[int, int],
    ptr: int,
    keep: Any,
    _sys: Any = sys,
) -> None:
    """Finalizer of a :class:`_Block`: into the cache (or freed), never waiting for the lock.

    The ``sys`` module is bound at definition: a block whose last holder is released late at
    interpreter exit (e.g. a JAX array over it) runs this after the module's globals are
    gone."""
    if _sys.is_finalizing():
        return
    if not cache._lock.acquire(blocking=False):
        cache._pending.append((pool, key, ptr, keep))  # deque.append is atomic
        return
    try:
        if cache._pending:
            cache._drain()
        cache._put(pool, key, ptr, keep)
    except Exception:  # pragma: no cover - a finalizer has no one to raise to
        pass
    finally:
        cache._lock.release()


class CachingAllocator:
    """The default :class:`MemoryResource`: free lists per device, stream and size class.

    Parameters
    ----------
    limit : int
        The most idle bytes kept per device (default :data:`DEFAULT_CACHE_LIMIT`, 1 GiB).
    """

    def __init__(self, limit: int = DEFAULT_CACHE_LIMIT):
        self._pools: dict[int, _Pool] = {}
        self._limit = limit
        # one lock for all free lists, which finalizers never wait for (see the module docstring)
        self._lock = threading.Lock()
        self._pending: collections.deque[tuple[_Pool, tuple[int, int], int, Any]] = (
            collections.deque()
        )
        # live blocks: weakref -> (pool, key, ptr, keep) for their finalizer (dict operations are
        # atomic, so finalizers on any thread need no lock here)
        self._live: dict[weakref.ref, tuple[_Pool, tuple[int, int], int, Any]] = {}
        self._dead = self._block_dead  # bound once: the callback of every block's weakref

    def _pool(self, device: int) -> _Pool:
        pool = self._pools.get(device)
        if pool is None:
            pool = self._pools.setdefault(device, _Pool(device))  # one pool if threads race
        return pool

    # -- allocate --------------------------------------------------------------------------------
    def allocate(self, nbytes: int, device: int, stream: int, keep: Any = None) -> _Block:
        """A block for *nbytes* (> 0) on (*device*, *stream*): a cached one of its size class if
        there is one (no CUDA call), else a new one (:func:`device_malloc`)."""
        # size_class(nbytes), its small case inlined (the common one, on the hot path)
        cls = (nbytes + 511) & -512 if nbytes <= _SMALL_MAX else size_class(nbytes)
        pool = self._pools.get(device) or self._pool(device)
        lock = self._lock
        if cls > self._limit or stream in _UNCACHED_STREAMS:
            cls = nbytes  # never cached: allocate the exact size, no rounding to waste
            key = (stream, -nbytes)  # a negative class marks it for a direct free
            ptr = 0
            with lock:
                pool.misses += 1
                pool.used += nbytes
                pool.used_blocks += 1
        else:
            key = (stream, cls)
            with lock:
                if self._pending:
                    self._drain()
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
                ptr, mode = device_malloc(cls, device, stream, pool.mode, nbytes)
            except BaseException:
                with lock:
                    pool.used -= cls
                    pool.used_blocks -= 1
                raise
            pool.mode = mode
        blk = _Block(ptr, cls, device, stream)
        self._live[weakref.ref(blk, self._dead)] = (pool, key, ptr, keep)
        return blk

    def _block_dead(self, ref: weakref.ref, _recycle: Callable[..., None] = _recycle) -> None:
        """The finalizer of a block (a weakref callback): its memory back to the cache
        (``_recycle`` bound at definition, see :func:`_recycle`)."""
        info = self._live.pop(ref, None)
        if info is not None:
            _recycle(self, *info)

    # -- free (lock held) ------------------------------------------------------------------------
    def _drain(self) -> None:
        """Cache the blocks whose finalizers found the lock taken. Lock held."""
        pending = self._pending
        while pending:
            try:
                item = pending.popleft()
            except IndexError:  # pragma: no cover - another thread won the race
                break
            self._put(*item)

    def _put(self, pool: _Pool, key: tuple[int, int], ptr: int, keep: Any) -> None:
        """A freed block goes to its free list, the oldest ones out past the limit. Lock held."""
        stream, cls = key
        pool.used_blocks -= 1
        if cls < 0:  # allocated uncached (per-thread stream, or larger than the limit)
            pool.used += cls
            call_on_device(pool.device, _free_blocks_on, [(ptr, stream)], pool.mode)
            return
        pool.used -= cls
        lst = pool.free.get(key)
        if lst is None:
            lst = pool.free[key] = []
        lst.append(ptr)  # newest last: reused first (likeliest still in L2), evicted last
        pool.order[ptr] = (key, keep)  # keep: a stream object stays alive while cached
        pool.cached += cls
        if pool.cached > self._limit:
            self._trim(pool, self._limit)

    def _trim(self, pool: _Pool, limit: int) -> None:
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
            call_on_device(pool.device, _free_blocks_on, victims, pool.mode)

    # -- release, limit, counters ----------------------------------------------------------------
    def release(self, device: int, *, force_sync: bool = False) -> int:
        """Give *device*'s cached blocks back to CUDA; the bytes released.

        The device is synchronized first, so the blocks' last work (on any stream) is done and
        they can be freed on the legacy default stream, whichever stream they came from (it may
        have been destroyed since); then once more so the memory is back in the pool for every
        stream. *force_sync*: synchronize even with nothing cached (the out-of-memory path).
        """
        pool = self._pools.get(device)
        blocks: list[int] = []
        freed = 0
        if pool is not None:
            with self._lock:
                if self._pending:
                    self._drain()
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
        rt = _cuda.runtime()
        # a release is best effort: its statuses are dropped and the sticky error cleared, so
        # the caller's next check sees only its own failure
        with DeviceContext(device):
            rt.cudaDeviceSynchronize()
            if blocks:
                mode = pool.mode if pool is not None else ASYNC
                for ptr in blocks:
                    if mode == SYNC:
                        rt.cudaFree(ptr)
                    else:
                        rt.cudaFreeAsync(ptr, 0)
                rt.cudaDeviceSynchronize()
            rt.cudaGetLastError()
        return freed

    def empty_cache(self, device: int | None = None) -> int:
        """:func:`empty_cache` of this allocator."""
        devices = list(self._pools) if device is None else [int(device)]
        return sum(self.release(d) for d in devices)

    def stats(self, device: int | None = None) -> dict[str, int]:
        """:func:`cache_stats` of this allocator."""
        pools = list(self._pools.values()) if device is None else [self._pools.get(int(device))]
        out = dict.fromkeys(
            ("cached_bytes", "cached_blocks", "used_bytes", "used_blocks", "hits", "misses"), 0
        )
        out.update(released_blocks=0, oom_releases=0)
        with self._lock:
            if self._pending:
                self._drain()
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
        out["limit"] = self._limit
        return out

    @property
    def limit(self) -> int:
        """The most idle bytes kept per device."""
        return self._limit

    def set_limit(self, nbytes: int) -> int:
        """:func:`set_cache_limit` of this allocator."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"the cache limit must be an int >= 0 (bytes), not {nbytes!r}")
        previous, self._limit = self._limit, nbytes
        with self._lock:
            if self._pending:
                self._drain()
            for pool in list(self._pools.values()):
                self._trim(pool, nbytes)
        return previous


# The caching allocator that the functions below manage (and out of memory releases), and the
# resource arrays allocate from: the same object unless set_memory_resource installed another.
_default = CachingAllocator()
_resource: MemoryResource = _default


def memory_resource() -> MemoryResource:
    """The :class:`MemoryResource` array constructors allocate from (a
    :class:`CachingAllocator` unless :func:`set_memory_resource` installed another)."""
    return _resource


def set_memory_resource(resource: MemoryResource | None) -> MemoryResource:
    """Make array constructors allocate from *resource* (None: the caching allocator again);
    returns the previous one. Blocks already handed out go back to the resource they came
    from; :func:`empty_cache` and the other cache functions keep managing the caching
    allocator."""
    global _resource
    if resource is not None and not callable(getattr(resource, "allocate", None)):
        raise TypeError(f"{type(resource).__name__} has no allocate(nbytes, device, stream, keep)")
    previous, _resource = _resource, _default if resource is None else resource
    return previous


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
    return _default.empty_cache(device)


def cache_stats(device: int | None = None) -> dict[str, int]:
    """Counters of the caching allocator (all devices summed, or one *device*).

    Keys: ``cached_bytes`` / ``cached_blocks`` (idle in the cache), ``used_bytes`` /
    ``used_blocks`` (held by live arrays, counted by size class), ``hits`` (allocations served
    from the cache), ``misses`` (allocations that called CUDA), ``released_blocks`` (cached
    blocks given back: limit, :func:`empty_cache`, out of memory), ``oom_releases`` (cache
    releases forced by an out-of-memory error), ``limit`` (:func:`get_cache_limit`).
    """
    return _default.stats(device)


def get_cache_limit() -> int:
    """The most bytes of unused blocks the allocator keeps per device (default 1 GiB)."""
    return _default.limit


def set_cache_limit(nbytes: int) -> int:
    """Set the per-device limit of cached (unused) bytes; returns the previous one.

    ``0`` turns caching off (every free is a ``cudaFreeAsync`` again). Lowering it frees the
    oldest cached blocks at once. Blocks larger than the limit are never cached.
    """
    return _default.set_limit(nbytes)


# -- workspaces: the documented functions over Handle's methods ----------------------------------
def _handle_method(handle: Any, name: str, what: str) -> Any:
    method = getattr(handle, name, None)
    if method is None:
        raise TypeError(f"{what} needs a pycudnn Handle, not {type(handle).__name__}")
    return method


def get_workspace(handle: Any, nbytes: int, stream: Any = None) -> tuple[int, int]:
    """A device workspace of at least *nbytes* for *handle* on *stream*: ``(ptr, size)``.

    :meth:`pycudnn.handle.Handle.workspace`: one grow-only buffer per
    (handle, stream), freed with the handle.

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
    TypeError
        *handle* is not a pycudnn ``Handle``.
    """
    return _handle_method(handle, "workspace", "get_workspace")(nbytes, stream)


def workspace_size(handle: Any, stream: Any = None) -> int:
    """Bytes of the workspace *handle* holds for *stream* (default its stream); 0 if none."""
    return _handle_method(handle, "workspace_size", "workspace_size")(stream)


def release_workspace(handle: Any, stream: Any = None) -> None:
    """Free *handle*'s workspace for *stream* (default its stream), stream-ordered."""
    _handle_method(handle, "release_workspace", "release_workspace")(stream)
