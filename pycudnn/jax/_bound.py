"""The per-call path of ``pycudnn.jax``'s operations: each call site's launches bound once.

Every family's FFI target calls one :class:`Executor`, which the handler hands the call frame
itself (:meth:`Executor.on_frame`: no :class:`~._frame.Call` is built unless the call misses).
A call reads, from XLA's memory, only

* its ``op`` attribute's text (the request: :mod:`._request`), as bytes,
* the data pointers of its operands and results, with their dtypes, dims and pointer residues
  mod 16 (a straight-line reader per arity: :func:`~._frame.decoder`), and
* XLA's stream (the handler's getter of XLA's API table: :func:`~._frame.stream_getter`),

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

A family's *capturable* target (:mod:`._capture`) runs a :class:`CaptureExecutor`: its calls'
last result is their workspace, XLA's memory, which serves every workspace request of the call
(:data:`pycudnn.handle.workspace_scope`), and its launches are keyed on the current device, not
the stream: XLA records a command buffer by calling the handler on a stream of its own that
captures a CUDA graph, after a first execution on its compute stream bound the launches, so the
capture hits them and records one launch, allocating nothing.

No JAX here: this runs inside XLA's call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from .. import _cuda, errors, handle
from ..highlevel import _bound, _call
from . import _frame, _request
from ._frame import Call

__all__ = [
    "ATTR",
    "CaptureExecutor",
    "Executor",
    "Operands",
    "bound_count",
    "run_request",
    "xla_stream",
]

#: the one attribute of every operation's FFI call: the request's text
ATTR = "op"
_snapshot = _call.snapshot
_DECODERS = _frame._DECODERS  # arity -> signature reader (made by _frame.decoder)
# the readers of the op text (as _frame.sole_string's, inline on the per-call path)
_MEMORY = _frame.MEMORY
_INT32 = _frame._INT32.unpack_from
_ADDRESS = _frame._ADDRESS.unpack_from
_SPAN = _frame._SPAN.unpack_from
_STRING = _frame._STRING


def bound_count() -> int:
    """How many call signatures the calling thread has bound (tests and diagnostics)."""
    return _bound.bound_count()


def xla_stream(call: Call) -> int:
    """XLA's stream of *call* (the GPU platforms')."""
    return call.stream


class Operands(NamedTuple):
    """A capturable call's buffers without its workspace: what its slow path computes on."""

    args: tuple
    rets: tuple


def run_request(request: _request.Request, call: Call | Operands, stream: int) -> None:
    """The slow path's computation: the request's pycudnn call on XLA's buffers."""
    request.run(call.args, call.rets, stream)


class Executor(_frame.FrameFunction):
    """The function an operation family's FFI target calls with each call.

    The handler gives it the call frame itself (:meth:`on_frame`, the per-call path: no
    :class:`~._frame.Call` is built unless the call misses); called with a
    :class:`~._frame.Call`, it does the same through the Call's readers.

    Parameters
    ----------
    run : callable, optional
        ``run(request, call, stream)``: the slow path's computation (default
        :func:`run_request`: the request's pycudnn call). Tests give a host computation.
    stream : callable or int, optional
        ``stream(call) -> int``: the call's stream (default :func:`xla_stream`, read through
        the handler's getter of XLA's API table); or an int, the stream of every call (the CPU
        platform has none: 0). A getter other than :func:`xla_stream` is given a
        :class:`~._frame.Call` built for each call.
    """

    __slots__ = ("run", "stream")

    def __init__(
        self,
        run: Callable[[_request.Request, Call, int], None] = run_request,
        stream: Callable[[Call], int] | int = xla_stream,
    ) -> None:
        self.run = run
        self.stream = stream

    def __call__(self, call: Call) -> None:
        text = call.sole_string()
        ptrs, sig = call.signature()
        stream = self.stream if type(self.stream) is int else self.stream(call)
        self._run(text, ptrs, sig, stream, self._slow, text, call, stream)

    def on_frame(self, handler: Any, frame_addr: int, f: tuple) -> None:
        """:meth:`__call__` on the frame's header *f* (the handler's one read of it): the op
        text, the signature (one straight-line reader per arity) and the stream read from XLA's
        memory directly; a Call is built only on a miss, or for a missing or other attribute
        (whose error its reader raises) or a stream getter of a Call's."""
        stream = self.stream
        # the op text: the one attribute, a string (_frame.sole_string, inline)
        if (
            f[8] != 1
            or _INT32(_MEMORY, f[9])[0] != _STRING
            or (stream is not xla_stream and type(stream) is not int)
        ):
            handler.run_call(frame_addr, f)  # the Call's reader raises what is wrong
            return
        ptr, length = _SPAN(_MEMORY, _ADDRESS(_MEMORY, f[10])[0])
        text = _MEMORY[ptr : ptr + length].tobytes()
        try:
            decode = _DECODERS[f[4], f[6]]
        except KeyError:
            decode = _frame.decoder(f[4], f[6])
        ptrs, sig = decode(f[5], f[7])
        if stream is xla_stream:
            stream = handler.stream_of(f[2])
        self._run(text, ptrs, sig, stream, self._miss, handler, frame_addr, f, text, stream)

    def _run(
        self,
        text: bytes,
        ptrs: tuple,
        sig: tuple,
        stream: int,
        slow: Callable[..., Any],
        *args: Any,
    ) -> None:
        # the high level's one store of bound launches (pycudnn.torch's lean path's too): a hit
        # launches; a miss runs ``slow(*args)`` (the request), and binds its entry when lean
        _bound.run((text, sig, stream, _snapshot()), ptrs, stream, slow, *args)

    def _miss(self, handler: Any, frame_addr: int, f: tuple, text: bytes, stream: int) -> None:
        call = handler.call(frame_addr, f)
        try:
            self._slow(text, call, stream)
        finally:
            call.finish()

    def _slow(self, text: bytes, call: Call, stream: int) -> None:
        self.run(_request.decode(text), call, stream)


_SCOPE = handle.workspace_scope


class CaptureExecutor(Executor):
    """The function of a family's capturable target: :class:`Executor`'s, for calls whose last
    result is their workspace (see the module's docstring).

    Its *run* gets the call's buffers without the workspace (:class:`Operands`).
    """

    __slots__ = ()

    def _run(self, text: bytes, ptrs: tuple, sig: tuple, stream: int, *slow: Any) -> None:
        # the workspace: the last result, 1-D uint8, its one dim the signature's last dims
        _SCOPE.given = (ptrs[-1], int.from_bytes(sig[-2], "little"))
        try:
            # the device, not the stream: a capture's stream is not the one that bound the call
            device = None if _call.one_device else _bound.current_device()
            _bound.run((text, sig, device, _snapshot()), ptrs[:-1], stream, *slow)
        finally:
            _SCOPE.given = None

    def _slow(self, text: bytes, call: Call, stream: int) -> None:
        request = _request.decode(text)
        if stream and _cuda.is_capturing(stream):  # (a miss only: the launch was not bound)
            raise errors.StreamCaptureError(
                f"pycudnn.jax: XLA is recording its command buffer (a CUDA graph) on stream "
                f"0x{stream:x}, and this {type(request).__name__} call has no bound launch to "
                "record (pycudnn.clear_caches() ran, or the binding was evicted, since XLA's "
                "first run of the computation); planning it would be CUDA work a capture "
                "cannot record. Keep pycudnn's caches while XLA may record (no clear_caches(); "
                "PYCUDNN_PLAN_CACHE_SIZE above the calls' count), or trace the function anew "
                "with pycudnn.jax.use_command_buffers(False)"
            )
        rets = call.rets
        self.run(request, Operands(call.args, rets[:-1]), stream)
