"""Device memory: ``DeviceArray``, host transfers, zero-copy interop, pointer checks, the caching
allocator, and the documented workspace functions.

Where things are
----------------
``allocator.py``
    Raw allocation (``cudaMallocAsync``/``cudaMalloc``, out of memory: release the cache and
    retry once), the allocate/free interface (:class:`~pycudnn.memory.allocator.MemoryResource`:
    ``allocate(nbytes, device, stream, keep) -> block``, the memory given back when the block is
    garbage-collected), the caching allocator behind it (:func:`empty_cache`,
    :func:`cache_stats`, :func:`get_cache_limit`, :func:`set_cache_limit`), uncached one-off
    allocations (workspaces), and :func:`get_workspace`, :func:`workspace_size`,
    :func:`release_workspace`, thin functions over the methods of
    :class:`~pycudnn.handle.Handle` that own the workspaces.
``array.py``
    :class:`DeviceArray` (metadata, views, both export protocols, transfers) and the
    constructors :func:`empty`, :func:`zeros`, :func:`empty_like`, :func:`to_device`.
``interop.py``
    :func:`asarray` over ``__cuda_array_interface__`` and DLPack producers, and the pointer
    checks :func:`check_device_pointer`, :func:`check_alignment`.
``_checks.py``, ``_protocols.py``
    The pointer and stream checks, and the readers of ``__cuda_array_interface__`` and DLPack
    producers (internal; below both ``array.py`` and ``interop.py``, so neither imports the
    other).
``_views.py``, ``_transfer.py``
    The arithmetic of views (reshape, indexing, transpose) and the copies one
    ``cudaMemcpyAsync`` cannot make (between devices; host data in a dense device layout).
``_dlpack.py``
    The DLPack C ABI in ctypes: capsule export and import (internal).

Design decisions
----------------
* **Ownership.** Memory pycudnn allocates comes from the CUDA runtime's stream-ordered pool
  (``cudaMallocAsync`` on the stream you pass, ``cudaMalloc`` where pools are unsupported) and is
  owned by a small block object whose ``weakref.finalize`` gives it back; every
  :class:`DeviceArray` over that memory references the block, so the memory lives as long as the
  last array. A stream *object* passed at allocation is kept alive with the memory; a raw ``int``
  stream must outlive the array (and its cached block: see :func:`empty_cache`). Finalizers do
  nothing at interpreter shutdown: the driver reclaims the memory with the process, and CUDA may
  already be gone.
* **Caching allocator** (arrays, not workspaces). A freed block goes to a free list keyed by
  (device, stream, size class) instead of ``cudaFreeAsync``; the next allocation of that class on
  the same device and stream takes it back with no CUDA call (the stream orders the new work after
  the old; a block never moves to another stream). At most :func:`get_cache_limit` idle bytes per
  device (default 1 GiB; oldest blocks freed first); out of memory releases the device's cache,
  synchronizes and retries once.
* **Zero-copy interop by protocol.** :func:`asarray` views anything with
  ``__cuda_array_interface__`` (v2/v3) or ``__dlpack__`` (torch, CuPy, JAX, Numba...) without a
  copy and keeps the producer alive; :class:`DeviceArray` exports both protocols. Host arrays
  are refused with :class:`NotDeviceMemoryError` naming :func:`to_device`: copies are explicit.
* **Checks before C.** :func:`check_device_pointer` asks CUDA where a pointer lives, once, when
  :func:`asarray` wraps an object that does not say its device; :func:`check_alignment` checks
  the element alignment cuDNN needs.
* **Strides are bytes** (numpy and ``__cuda_array_interface__`` convention), converted to element
  strides only for DLPack; dense layouts other than C order (NHWC viewed as NCHW) are kept.
* **Workspaces belong to the handle**: one grow-only allocation per (handle, stream), freed with
  the handle, never above ``pycudnn.config.workspace_limit``; exceeding it or the free memory
  raises :class:`~pycudnn.errors.AllocationError` (a ``MemoryError``) naming the bytes asked for
  and free, so a caller can retry with an algorithm that needs less.

Layering: this package imports neither :mod:`pycudnn.handle` nor the descriptor and high-level
layers (the handle imports it, for its workspaces); CUDA is reached through
:mod:`pycudnn._cuda` only.
"""

from __future__ import annotations

from .._cuda import mem_get_info
from ..errors import NotDeviceMemoryError
from .allocator import DEFAULT_CACHE_LIMIT as DEFAULT_CACHE_LIMIT  # documented, not in __all__
from .allocator import (
    cache_stats,
    empty_cache,
    get_cache_limit,
    get_workspace,
    release_workspace,
    set_cache_limit,
    workspace_size,
)
from .array import DeviceArray, empty, empty_like, to_device, zeros
from .interop import asarray, check_alignment, check_device_pointer

__all__ = [
    "DeviceArray",
    "NotDeviceMemoryError",
    "asarray",
    "cache_stats",
    "check_alignment",
    "check_device_pointer",
    "empty",
    "empty_cache",
    "empty_like",
    "get_cache_limit",
    "get_workspace",
    "mem_get_info",
    "release_workspace",
    "set_cache_limit",
    "to_device",
    "workspace_size",
    "zeros",
]
