"""cuDNN handles, one per (thread, device), the streams they run on, and their workspaces.

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
* **Never rebind an unchanged stream.** ``cudnnSetStream`` has no early return of its own;
  :meth:`Handle.set_stream` compares first (identity, then the integer) and skips the C call when
  nothing changed. A stream *object* bound to a handle is kept referenced while bound, so a
  torch/CuPy stream cannot be destroyed under the handle.
* **Lifetime from** :class:`pycudnn._resource.Resource`, like every descriptor: a
  ``weakref.finalize`` armed right after ``cudnnCreate`` (never ``__del__``), ``close()``
  idempotent, ``with``, ``detach()``, non-owning ``from_ptr``, live counts. The destroy runs with
  the handle's device current (:func:`pycudnn._cuda.call_on_device`); at interpreter shutdown a
  garbage-collection-driven destroy is skipped, while the ``atexit`` pass still destroys handles.
* **Workspaces belong to the handle.** :meth:`Handle.workspace` keeps one grow-only device buffer
  per stream of the handle (uncached allocations of :mod:`pycudnn.memory.allocator`, or blocks of
  the resource :func:`~pycudnn.memory.allocator.set_memory_resource` installed), bounded by
  ``pycudnn.config.workspace_limit``; ``close()`` frees them. ``pycudnn.memory.get_workspace`` and
  friends are the documented functions over these methods. A framework that owns the memory of a
  call (XLA, whose CUDA graphs must replay a workspace whose life XLA manages) gives it for the
  calls it makes through :data:`workspace_scope`, per thread; the same scope measures what a call
  asks for.
* **CUDA access** (no GPU -> :class:`CudaUnavailableError`, device switches, stream coercion)
  lives in :mod:`pycudnn._cuda`; this module re-exports its public names, so the documented paths
  (``pycudnn.handle.CudaUnavailableError``, ``pycudnn.handle.coerce_stream``...) keep working.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Callable
from typing import Any

from . import _cuda, api
from ._config import config
from ._cuda import (
    DeviceContext,
    coerce_stream,
    current_device,
    device_count,
    gpu_unavailable_reason,
    require_gpu,
    validate_device,
)
from ._generated import lib as _lib
from ._resource import Resource
from .errors import AllocationError, CudaError, CudaUnavailableError
from .memory import allocator

__all__ = [
    "CudaError",
    "CudaUnavailableError",
    "DeviceContext",
    "Handle",
    "WorkspaceScope",
    "coerce_stream",
    "current_device",
    "device_count",
    "get_handle",
    "gpu_unavailable_reason",
    "require_gpu",
    "workspace_scope",
]

_create_lock = threading.Lock()
_WORKSPACE_GRANULE = 1 << 20  # workspaces grow in whole MiB (capped at the limit)


class WorkspaceScope(threading.local):
    """Per thread: where :meth:`Handle.workspace` takes the workspaces of the calls made now.

    Attributes
    ----------
    given : tuple of int or None
        ``(ptr, nbytes)``: device memory the caller owns (XLA's, for a call it may capture in a
        CUDA graph), which serves every request of the thread's handles until reset to None; a
        request larger than it raises :class:`~pycudnn.errors.AllocationError` (nothing is
        allocated). None (default): the handles' own per-stream workspaces.
    peak : int
        While >= 0, each request raises it to at least the bytes asked for (a caller measures
        the workspace a call needs); -1 (default): not measuring.
    """

    given: tuple[int, int] | None = None
    peak: int = -1


#: the calling thread's :class:`WorkspaceScope`
workspace_scope = WorkspaceScope()


def _destroy(rt: Any, destroy: Any, ptr: int) -> int:
    """Body of the handle's destroy, run by ``call_on_device`` with the handle's device current."""
    return destroy(ptr)  # raw call: its status goes to close(); a finalizer drops it


class Handle(Resource):
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

    _c_type = _lib.cudnnHandle_t
    _destroy_name = "cudnnDestroy"
    _atexit = True  # device state: destroyed by the atexit pass (CUDA is still up then)

    __slots__ = (
        "_captured", "_device", "_retired", "_stream", "_stream_obj", "_workspaces", "thread_id",
    )  # fmt: skip

    def __init__(self, device: int | None = None, stream: Any = None):
        if device is None:
            require_gpu("a cuDNN handle")
            dev = current_device()
        else:
            dev = validate_device(device, "a cuDNN handle")
        self._init_state(dev)
        handle = self._new_handle()
        with _create_lock, DeviceContext(dev):
            api.cudnnCreate(ctypes.byref(handle))
        self._adopt(handle)  # arms the finalizer before anything else can raise
        if stream is not None:
            self.set_stream(stream)

    def _init_state(self, device: int) -> None:
        self._device = device
        self._stream = 0
        self._stream_obj: Any = None
        self._workspaces: dict[int, Any] = {}  # stream -> Allocation or ResourceAllocation
        # capturing stream -> (capture id, the last launch's workspace); another capture's
        # blocks, given back outside any capture
        self._captured: dict[int, tuple[int, Any]] = {}
        self._retired: list[Any] = []
        self.thread_id = threading.get_ident()

    def _destroyer(self) -> Callable[[int], Any]:
        # values only (never self): the device and the early-bound raw cudnnDestroy
        return functools.partial(_cuda.call_on_device, self._device, _destroy, _lib.cudnnDestroy)

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
        self._init_state(int(device))
        self._adopt(cls._c_type(int(ptr)), owned=False, owner=owner)
        self._stream = coerce_stream(stream)
        return self

    # -- properties -----------------------------------------------------------------------------
    # ptr, closed, owned, live_count() and _as_parameter_ (the typed handle ctypes passes; a
    # closed handle's refuses with "Handle is closed") come from Resource.
    @property
    def device(self) -> int:
        """The CUDA device ordinal this handle belongs to."""
        return self._device

    @property
    def stream(self) -> int:
        """The integer ``cudaStream_t`` the handle is bound to (0: legacy default stream)."""
        return self._stream

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

        Raises
        ------
        ValueError
            When *stream* is an object that says it belongs to another device than the handle's
            (torch, CuPy and cuda.core streams say it; raw integers cannot be checked).
        """
        if stream is self._stream_obj and stream is not None:
            return self._stream
        if type(stream) is int and stream == self._stream:  # the common per-call case: no work
            return stream
        sid = coerce_stream(stream)
        if sid != self._stream:
            sdev = _cuda.stream_device(stream)
            if sdev is not None and sdev != self._device:
                raise ValueError(
                    f"stream {stream!r} is on device {sdev}, but the handle (and the operands) "
                    f"on device {self._device}"
                )
            api.cudnnSetStream(self._h(), sid)
            self._stream = sid
        # keep a stream object alive while it is bound (ints and None need nothing)
        self._stream_obj = None if stream is None or type(stream) is int else stream
        return sid

    def synchronize(self) -> None:
        """Wait until all work queued on the handle's stream has finished."""
        _cuda.synchronize(self._stream, self._device)

    # -- workspaces -----------------------------------------------------------------------------
    def workspace(self, nbytes: int, stream: Any = None) -> tuple[int, int]:
        """A device workspace of at least *nbytes* on *stream*: ``(ptr, size)``.

        One grow-only buffer per stream: a smaller request reuses it, a larger one frees it
        (stream-ordered) and allocates anew, rounded up to whole MiB and capped at the limit.
        Zero bytes gives ``(0, 0)`` unless a buffer exists. The pointer stays valid for work
        queued on *stream* until the next larger request for the same stream, or until the
        handle is closed. While *stream* captures a CUDA graph, a request the buffer cannot
        serve takes a block of the installed memory resource for that launch instead (torch's
        allocator: the graph's private pool), and the buffer is neither freed nor grown. While
        the thread's :data:`workspace_scope` has memory ``given``, every request is served from
        it instead (the same ``(ptr, size)``), and nothing is allocated.

        Parameters
        ----------
        nbytes : int
        stream : optional
            Default the handle's stream.

        Raises
        ------
        AllocationError
            A ``MemoryError`` when *nbytes* exceeds ``pycudnn.config.workspace_limit`` or the
            device is out of memory; the message names the bytes asked for and free, and the
            exception has ``requested``, ``free`` and ``total`` attributes. Catch it to fall
            back to an algorithm with a smaller workspace. Also a request larger than the
            scope's ``given`` memory.
        ValueError
            For a negative size.
        """
        nbytes = int(nbytes)
        if nbytes < 0:
            raise ValueError(f"workspace size {nbytes} is negative")
        scope = workspace_scope
        if scope.peak >= 0 and nbytes > scope.peak:
            scope.peak = nbytes
        given = scope.given
        if given is not None:
            if nbytes > given[1]:
                raise allocator.allocation_error(
                    nbytes, self._device, "workspace", f"more than the {given[1]} bytes given"
                )
            return given
        table = self._workspaces
        sid = self._stream if stream is None else coerce_stream(stream)
        ws = table.get(sid)
        if ws is not None and ws.nbytes >= nbytes:
            return ws.ptr, ws.nbytes
        if nbytes == 0:
            return 0, 0
        cid = _cuda.capture_id(sid)  # (only when the kept workspace is missing or too small)
        if cid:
            return self._capture_workspace(nbytes, sid, cid)
        self._retired.clear()
        device = self._device
        limit = config.workspace_limit
        if limit is not None and nbytes > limit:
            raise allocator.allocation_error(
                nbytes, device, "get_workspace", "more than the workspace limit", limit=limit
            )
        if ws is not None:  # grow: free the old one first, in order on the stream it was used on
            del table[sid]
            ws.release(sid)
        size = -(-nbytes // _WORKSPACE_GRANULE) * _WORKSPACE_GRANULE
        if limit is not None:
            size = min(size, limit)
        try:
            alloc = allocator.workspace_allocation(size, device, sid)
        except AllocationError:
            if size == nbytes:
                raise
            alloc = allocator.workspace_allocation(nbytes, device, sid)
        table[sid] = alloc
        return alloc.ptr, alloc.nbytes

    def _capture_workspace(self, nbytes: int, sid: int, cid: int) -> tuple[int, int]:
        """A workspace for one launch on *sid* while it captures CUDA graph sequence *cid*: a
        block of the installed memory resource (torch's allocator: the graph's private pool),
        held until the next such launch on *sid* asks for one. A block of the same capture is
        given back then (the capture orders its reuse after the launches that read it); one of
        an earlier capture only at the next workspace made outside a capture (its pool is
        another graph's). The kept workspace of *sid*, if any, is left alone: a graph captured
        earlier may read it. Without a resource that can allocate under capture,
        :class:`~pycudnn.errors.StreamCaptureError`."""
        alloc = allocator.capture_allocation(nbytes, self._device, sid)
        old = self._captured.pop(sid, None)
        self._captured[sid] = (cid, alloc)
        if old is not None:
            if old[0] == cid:
                old[1].release(sid)
            else:
                self._retired.append(old[1])
        return alloc.ptr, alloc.nbytes

    def workspace_size(self, stream: Any = None) -> int:
        """Bytes of the workspace held for *stream* (default the handle's stream); 0 if none."""
        sid = self._stream if stream is None else coerce_stream(stream)
        ws = self._workspaces.get(sid)
        return 0 if ws is None else ws.nbytes

    def release_workspace(self, stream: Any = None) -> None:
        """Free the workspace of *stream* (default the handle's stream), stream-ordered."""
        sid = self._stream if stream is None else coerce_stream(stream)
        ws = self._workspaces.pop(sid, None)
        if ws is not None:
            ws.release(sid)

    # -- lifetime -------------------------------------------------------------------------------
    def close(self) -> None:
        """Free the workspaces and destroy the handle (if owned) now. Idempotent.

        Raises
        ------
        CudnnError
            ``cudnnDestroy`` failed (the handle counts as closed regardless).
        """
        workspaces, self._workspaces = self._workspaces, {}
        captured, self._captured = self._captured, {}
        retired, self._retired = self._retired, []
        for ws in [*workspaces.values(), *(a for _, a in captured.values()), *retired]:
            close = getattr(ws, "close", None)
            if close is not None:
                close()
        super().close()

    def _mark_closed(self) -> None:
        super()._mark_closed()
        self._stream_obj = None

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
        require_gpu("a cuDNN handle")  # cheap once a device was seen
        device = current_device()
    h = handles.get(device)
    if h is None or not h._ptr:
        h = handles[device] = Handle(validate_device(device, "a cuDNN handle"))
    if stream is not None:
        h.set_stream(stream)
    return h
