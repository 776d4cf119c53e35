"""The per-call path of ``pycudnn.jax``'s operations: each call site's launches bound once.

Every family's FFI target calls one :class:`Executor`. A call reads, from XLA's frame, only

* its ``op`` attribute's text (the request: :mod:`._request`), as bytes,
* the data pointers of its operands and results, with their dtypes, dims and pointer residues
  mod 16 (:meth:`~._frame.Call.signature`), and
* XLA's stream,

and looks ``(text, signature, stream, pycudnn.config snapshot)`` up in the calling thread's
store of bound launches (:mod:`pycudnn.highlevel._bound`, the one ``pycudnn.torch``'s lean path
uses too). A hit is the whole call: the entry's handle bound to the stream (no C
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

from collections.abc import Callable

from ..highlevel import _bound, _call
from . import _request
from ._frame import Call

__all__ = ["ATTR", "Executor", "bound_count", "run_request", "xla_stream"]

#: the one attribute of every operation's FFI call: the request's text
ATTR = "op"
_snapshot = _call.snapshot


def bound_count() -> int:
    """How many call signatures the calling thread has bound (tests and diagnostics)."""
    return _bound.bound_count()


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
        # the high level's one store of bound launches (pycudnn.torch's lean path's too): a hit
        # launches; a miss decodes the request and runs it, and binds its entry when lean
        _bound.run((text, sig, stream, _snapshot()), ptrs, stream, self._slow, text, call, stream)

    def _slow(self, text: bytes, call: Call, stream: int) -> None:
        self.run(_request.decode(text), call, stream)
