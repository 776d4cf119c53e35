"""The per-call path of ``pycudnn.jax``'s operations: each call site's launches bound once.

Every family's FFI target calls one :class:`Executor`. A call reads, from XLA's frame, only

* its ``op`` attribute's text (the request: :mod:`._request`), as bytes,
* the data pointers of its operands and results, with their dtypes, dims and pointer residues
  mod 16 (:meth:`~._frame.Call.signature`), and
* XLA's stream,

and looks ``(text, signature, stream, pycudnn.config snapshot)`` up in the calling thread's
store of bound launches. A hit is the whole call: the entry's handle bound to the stream (no C
call when it is already), then :meth:`~pycudnn.highlevel._call.Call.launch` on the pointers --
the high level's lean path (its plan, descriptors and scaling factors ready), with no request
decoded, no operand read, no output made and no check repeated. The key pins everything the
entry depends on: XLA compiles shapes and dtypes into each call site, the text carries the
static options, the stream fixes the device, the residues the alignment the plan was built for.

A miss (a call site's first run, or a new signature) decodes the request and runs it
(:meth:`~._request.Request.run`: the public pycudnn function on XLA's buffers, every output
given, which validates everything and caches a ready entry); when that entry is lean (nothing
staged, no per-call argument) it is bound under the key. Entries that are not lean keep going
through the public function, correct and slower. A bound entry whose launch fails (its plan was
evicted and closed, its workspace no longer fits) is unbound and the call takes the slow path,
which rebuilds it or raises the public function's error.

The store is per thread (entries hold the thread's handle), bounded by pycudnn's cache size
and emptied by ``pycudnn.clear_caches()``. The workspace a plan needs is pycudnn's per-stream
workspace of the handle (allocated once per stream and grown when a larger plan needs it), not
XLA's memory.

No JAX here: this runs inside XLA's call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .. import _cuda
from ..graph import _plans
from ..highlevel import _call
from . import _request
from ._frame import Call

__all__ = ["ATTR", "Executor", "bound_count", "run_request", "xla_stream"]

#: the one attribute of every operation's FFI call: the request's text
ATTR = "op"

_local = threading.local()
_snapshot = _call.snapshot
_device_now = _cuda.device_now


def _store() -> Any:
    try:
        return _local.store
    except AttributeError:
        # owns=False: the entries belong to the high level's call cache; this only refers to them
        store = _local.store = _plans.new_lru(owns=False)
        return store


def bound_count() -> int:
    """How many call signatures the calling thread has bound (tests and diagnostics)."""
    return len(_store())


def xla_stream(call: Call) -> int:
    """XLA's stream of *call* (the GPU platforms')."""
    return call.stream


def run_request(request: _request.Request, call: Call, stream: int) -> None:
    """The slow path's computation: the request's pycudnn call on XLA's buffers."""
    request.run(call.args, call.rets, stream)


class Executor:
    """The function an operation family's FFI target calls with each :class:`~._frame.Call`.

    Parameters
    ----------
    run : callable, optional
        ``run(request, call, stream)``: the slow path's computation (default
        :func:`run_request`: the request's pycudnn call). Tests give a host computation.
    stream : callable, optional
        ``stream(call) -> int``: the call's stream (default :func:`xla_stream`; the CPU
        platform has none).
    """

    __slots__ = ("run", "stream")

    def __init__(
        self,
        run: Callable[[_request.Request, Call, int], None] = run_request,
        stream: Callable[[Call], int] = xla_stream,
    ) -> None:
        self.run = run
        self.stream = stream

    def __call__(self, call: Call) -> None:
        text = call.sole_string()
        ptrs, sig = call.signature()
        stream = self.stream(call)
        key = (text, sig, stream, _snapshot())
        try:
            store = _local.store
        except AttributeError:
            store = _store()
        entry = store.data.get(key)
        if entry is not None:
            h = entry.handle
            if _call.one_device or _device_now() == h.device:
                h.set_stream(stream)  # no C call when it is bound to it already
                try:
                    entry.launch(ptrs)
                    return
                except Exception:
                    store.pop(key)  # the slow path rebuilds it, or raises the public error
        self._slow(key, call, stream, len(ptrs))

    def _slow(self, key: tuple, call: Call, stream: int, n_ptrs: int) -> None:
        request = _request.decode(key[0])
        _call.take_last_entry()  # forget an earlier call's entry
        self.run(request, call, stream)
        entry = _call.take_last_entry()
        # the entry's pointers are the inputs' then the outputs', in the public function's
        # order, which each request keeps as its operands' order: the count is checked here
        if entry is not None and entry.lean and len(entry.spans) == n_ptrs:
            _store().put(key, entry)
