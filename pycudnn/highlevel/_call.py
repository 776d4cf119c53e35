"""The call protocol: one :class:`Call` for every high-level operation, and one cache-and-run
helper (:func:`run_cached`).

A high-level function keys what was passed (:func:`._operand.key_of`), then hands the key, its
build function and the build's arguments to :func:`run_cached`. On a hit the cached entry runs at
once; on a miss the build function validates (before any C call), makes the descriptors and
returns a :class:`Call`, which runs and is cached once it ran. Every entry runs the same way
(:meth:`Call.run`): on the handle's device, the handle bound to ``stream=`` (no C call when
unchanged), the outputs that were not given allocated from their :class:`OutputSpec`, the given
ones refused when they overlap an input or each other, the operands the C call cannot take staged
through packed copies, then :meth:`Call.launch` -- the one method an operation implements.

Pass the builder and its arguments rather than a closure: a closure would make every variable it
captures a cell in the caller, on the hot path too.

**The lean path.** A caller that has bound an entry to a signature once (for example a framework
module that always passes the same shapes: it runs the first call through :func:`run_cached`,
then takes the entry with :func:`cached_entry`) may skip :meth:`Call.run` when :attr:`Call.lean`
is true: with every output given (and known not to overlap the inputs), the handle's stream
already the caller's and the handle's device current, ``call.launch((*input_ptrs,
*output_ptrs))`` is the whole call -- a key lookup, the pointer writes and the C call. Entries
whose launch reads per-call arguments (dropout's state, CTC's values, an attention's seed) and
staged or empty ones are not lean.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

from .. import _config, _cuda, _layout, errors, memory
from .. import handle as _handle
from .._layout import overlaps
from .._types import itemsize, numpy_dtype, scaling_ctype
from ..enums import DataType
from ..graph import _plans
from ..graph.nodes._base import cudnn_version
from ._checks import check_stream
from ._operand import Operand

__all__ = [
    "Call",
    "GraphCall",
    "OutputSpec",
    "cached_entry",
    "calls",
    "check_overlap",
    "cudnn_version",
    "empty_result",
    "handle_for",
    "take_last_entry",
    "like_spec",
    "local",
    "new_store",
    "on_device",
    "output_spec",
    "overlaps",
    "quiet",
    "run_cached",
    "scales",
    "snapshot",
    "workspace",
]

#: the thread's hashable snapshot of ``pycudnn.config`` (a part of the keys of configurable calls)
snapshot = _config.config.snapshot


# ==================================================================================================
# Outputs
# ==================================================================================================
class OutputSpec(NamedTuple):
    """How to allocate an output that was not given: ``memory.empty`` arguments."""

    shape: tuple[int, ...]
    dtype: Any  # numpy dtype
    device: int
    strides: tuple[int, ...]  # bytes

    def new(self, stream: int) -> memory.DeviceArray:
        return memory.empty(self.shape, self.dtype, self.device, stream, strides=self.strides)

    @property
    def nbytes_span(self) -> int:
        """Bytes the new array's elements span (as :attr:`Operand.nbytes_span`)."""
        return _layout.extent(self.shape, self.strides, self.dtype.itemsize)[1]

    @property
    def element_strides(self) -> tuple[int, ...]:
        """The strides in elements."""
        return tuple(s // self.dtype.itemsize for s in self.strides)


def output_spec(
    shape: Sequence[int], dt: DataType, device: int, channels_last: bool = False
) -> OutputSpec:
    """A new output of *shape*, packed NCHW (or channels last) like the inputs."""
    isz = itemsize(dt)
    shape = tuple(shape)
    return OutputSpec(
        shape, numpy_dtype(dt), device, _layout.packed_strides(shape, channels_last, isz)
    )


def like_spec(
    g: Operand, dt: DataType | None = None, shape: Sequence[int] | None = None
) -> OutputSpec:
    """A new output shaped like *g* (or *shape*), in *g*'s memory order when *g* is dense (as
    ``torch.empty_like``), else packed NCHW or, for an unambiguously channels-last *g*, NHWC."""
    dt = g.dtype if dt is None else dt
    isz = itemsize(dt)
    if shape is None or tuple(shape) == tuple(g.shape):
        shape = tuple(g.shape)
        if _layout.is_dense(shape, g.strides) and all(s > 0 for s in g.strides):
            return OutputSpec(shape, numpy_dtype(dt), g.device, tuple(s * isz for s in g.strides))
    nchw, nhwc = _layout.layout_of(g.shape, g.strides)
    return output_spec(shape, dt, g.device, nhwc and not nchw and len(shape) == len(g.shape))


def empty_result(func: str, out: Any, spec: OutputSpec, beta: float, fill: bool) -> Any:
    """Zero-size problems, no cuDNN call: nothing to compute (an empty output), or a sum over
    nothing (``alpha * 0 + beta * out``) when only a reduced dimension is empty."""
    if out is None:
        make = memory.zeros if fill else memory.empty
        return make(spec.shape, spec.dtype, spec.device, strides=spec.strides)
    if fill:
        if float(beta) == 0.0:
            memory.asarray(out).fill_(0)
        elif float(beta) != 1.0:
            raise NotImplementedError(
                f"{func}: scaling out by beta={beta} for an empty reduction is not supported"
            )
    return out


# ==================================================================================================
# C functions, scaling factors, handles, devices, workspaces
# ==================================================================================================
def quiet(name: str) -> Callable[..., Any]:
    """The checked C function *name*, without ``CudnnDeprecationWarning``: pycudnn's own use of
    a legacy function is not the user's."""
    return errors.checked(name, warn=False)


def scales(dt: DataType, *values: float) -> tuple:
    """ctypes scaling factors for data of *dt* (double for double data, else float)."""
    ct = scaling_ctype(dt)
    return tuple(ct(float(v)) for v in values)


def workspace(h: Any, nbytes: int) -> int:
    """Device pointer of at least *nbytes* of the handle's workspace on its current stream
    (grow-only, per (handle, stream); raises ``AllocationError``, a ``MemoryError``): the high
    level's one way to a workspace (tests replace it to run without a device)."""
    return h.workspace(nbytes)[0]


#: True once a handle was made in a process that sees exactly one GPU: the device switch of
#: :meth:`Call.run` is then skipped (the visible devices are fixed when CUDA starts)
one_device = False
_devices_counted = False


def handle_for(device: int, stream: Any, func: str = "pycudnn") -> Any:
    """The calling thread's handle of *device*, bound to *stream* (when given; a stream object
    of another device is a ``ValueError`` naming both, before any C call)."""
    global one_device, _devices_counted
    if stream is not None and type(stream) is not int:
        check_stream(func, stream, device)
    if stream is not None:
        try:  # what the handle will do with it, before the first CUDA call
            _cuda.coerce_stream(stream)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{func}: stream: {exc}") from None
    h = _handle.get_handle(device)
    if not _devices_counted:  # once: the visible devices are fixed when CUDA starts
        one_device = _cuda.device_count() == 1
        _devices_counted = True
    if stream is not None:
        h.set_stream(stream)
    refuse_capture(
        func, getattr(h, "stream", 0), "plan a new call (its plan, workspace and outputs)"
    )
    return h


def refuse_capture(func: str, stream: int, what: str) -> None:
    """A :class:`~pycudnn.errors.StreamCaptureError` when *stream* is capturing a CUDA graph:
    *what* (a plan build, an allocation) needs CUDA calls a capture cannot record, and failing
    inside CUDA would invalidate the capture. Called on the slow paths only (a call's first
    run, a graph's build), never on a cached call's launch."""
    if _cuda.is_capturing(stream):
        raise errors.StreamCaptureError(
            f"{func}: stream 0x{stream:x} is capturing a CUDA graph; this call would {what}, "
            "CUDA work a capture cannot record. Run the call once before capturing (with out= "
            "for its outputs), so that the capture replays a cached call; or allocate through "
            "torch (pycudnn.torch.use_torch_allocator()), whose graph pools can"
        )


class on_device:
    """``with on_device(d):`` makes device *d* current for the block when another one is (one
    ``cudaGetDevice``; nothing else when *d* is current already, or when CUDA cannot say), and
    restores the caller's device after it. Builds that make C calls on a device (plans, RNN
    descriptors) run inside one; :meth:`Call.run` switches by itself."""

    __slots__ = ("device", "previous")

    def __init__(self, device: int):
        self.device = device
        self.previous: int | None = None

    def __enter__(self) -> None:
        if one_device:
            return
        cur = _cuda.device_now()
        if cur is not None and cur != self.device:
            _cuda.set_device(self.device)
            self.previous = cur

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None:
            _cuda.set_device(self.previous)
            self.previous = None


# ==================================================================================================
# Overlap checks
# ==================================================================================================
def check_overlap(
    func: str,
    ptrs: Sequence[int],
    spans: Sequence[int],
    out_ptr: int,
    out_span: int,
    inplace: tuple[int, ...] = (),
) -> None:
    """Refuse an output ``[out_ptr, out_ptr + out_span)`` that overlaps an input, except the
    inputs listed in *inplace* when at the very same address (cuDNN documents them as in-place
    capable, and the call's builder checked that they have the output's layout)."""
    end = out_ptr + out_span
    for i, (in_ptr, in_span) in enumerate(zip(ptrs, spans)):  # noqa: B905 (spans: outputs too)
        exactly = in_ptr == out_ptr and i in inplace
        if in_ptr < end and out_ptr < in_ptr + in_span and not exactly:
            raise ValueError(
                f"{func}: out overlaps an input; cuDNN's outputs may not alias its inputs"
                + (" (in place, out may only be exactly that input)" if inplace else "")
            )


# ==================================================================================================
# The call protocol
# ==================================================================================================
class Staging(Protocol):
    """What :meth:`Call.run` needs of a staging (:class:`._staging.Stage`): copies in before the
    launch (returning the real output pointer when the output is staged), and the copy out."""

    def before(self, h: Any, ptrs: list[int], keep: list) -> int | None: ...

    def after(self, h: Any, ptrs: list[int], real_out: int | None) -> None: ...


_NOTHING: Any = object()  # the stage of a noop entry: nothing to launch


class Call:
    """A validated call, ready to run.

    Parameters
    ----------
    func : str
        The user-facing function (error messages).
    handle : Handle
        The calling thread's handle of the operands' device.
    allocs : tuple of OutputSpec or None
        One entry per output, in the order :meth:`run` returns them: how to allocate it when it
        is not given (None: it is given, as the call key says).
    spans : tuple of int
        Byte spans of the inputs, then of the outputs (the overlap checks).
    stage : Stage, optional
        Copies of the operands whose strides the C call cannot take (outputs: the last one only).
    inplace : tuple of int
        Inputs that a given output may be exactly (same address; the builder checked that they
        have the output's layout).
    keepalive : object
        What must live as long as the entry (descriptors the C call gets by address, stand-in
        buffers, scaling factors that ``byref`` points into).
    noop : bool
        An empty problem: the outputs are allocated (or taken), nothing is launched.

    Subclasses implement :meth:`launch` only.
    """

    __slots__ = (
        "allocs",
        "func",
        "handle",
        "inplace",
        "keepalive",
        "n_in",
        "noop",
        "single",
        "spans",
        "stage",
    )

    def __init__(
        self,
        func: str,
        handle: Any,
        allocs: tuple[OutputSpec | None, ...],
        spans: tuple[int, ...],
        stage: Staging | None = None,
        inplace: tuple[int, ...] = (),
        keepalive: Any = None,
        noop: bool = False,
    ):
        self.func = func
        self.handle = handle
        self.allocs = tuple(allocs)
        self.spans = tuple(spans)
        self.n_in = len(self.spans) - len(self.allocs)
        self.stage = stage
        self.inplace = inplace
        self.keepalive = keepalive
        self.noop = noop
        self.single = len(self.allocs) == 1  # the common case, without lists
        if noop:  # checked on the staged path only: the unstaged one reads nothing more
            self.stage = _NOTHING

    @property
    def lean(self) -> bool:
        """:meth:`launch` alone is the whole call when the caller gives every output (not
        overlapping the inputs), has bound the stream and sits on the handle's device: nothing
        is staged, something is launched, and the launch needs no per-call arguments."""
        return self.stage is None

    def run(
        self,
        ptrs: tuple[int, ...],
        outs: tuple,
        out_ptrs: tuple,
        stream: Any,
        *,
        here: bool = False,
    ) -> tuple:
        """Run on the handle's device (the caller's device restored after; nothing to switch
        when one GPU is visible): bind *stream* (no C call when unchanged), allocate the outputs
        given as None, refuse given outputs that overlap an input or each other, stage, launch.

        *ptrs* are the inputs' pointers, *outs* the outputs (None: allocate) and *out_ptrs*
        their pointers (read for the given ones only), all three tuples; *here*: the handle's
        device is current (the switch's own rerun). Returns the outputs as a tuple.
        """
        if not one_device and not here:
            previous = _cuda.device_now()
            device = self.handle.device
            if previous is not None and previous != device:
                _cuda.set_device(device)
                try:  # Call.run: a subclass may wrap run
                    return Call.run(self, ptrs, outs, out_ptrs, stream, here=True)
                finally:
                    _cuda.set_device(previous)
        h = self.handle
        if stream is not None:
            h.set_stream(stream)  # no C call when unchanged
        if self.single:
            out = outs[0]
            if out is None:
                out = self.allocs[0].new(h.stream)
                outs, out_ptrs = (out,), (out.ptr,)
            else:  # a new array overlaps nothing: only a given one is checked
                out_ptr = out_ptrs[0]
                spans = self.spans
                end = out_ptr + spans[-1]
                i = 0
                for in_ptr in ptrs:
                    if in_ptr < end and out_ptr < in_ptr + spans[i]:  # unless exactly in place
                        check_overlap(self.func, ptrs, spans, out_ptr, spans[-1], self.inplace)
                        break
                    i += 1  # noqa: SIM113 (enumerate costs more on the hot path)
        else:
            outs, out_ptrs = self._outputs(h, ptrs, outs, out_ptrs)
        stage = self.stage
        if stage is None:
            self.launch(ptrs + out_ptrs)  # tuples: concatenating beats unpacking
            return outs
        if stage is _NOTHING:
            return outs
        keep: list = []  # staged copies, freed stream-ordered after the launch was queued
        all_ptrs = list(ptrs + out_ptrs)
        real_out = stage.before(h, all_ptrs, keep)
        self.launch(all_ptrs)
        stage.after(h, all_ptrs, real_out)
        return outs

    def _outputs(self, h: Any, ptrs: tuple, outs: tuple, out_ptrs: tuple) -> tuple[tuple, tuple]:
        """Several outputs: allocate the missing ones; check the given ones against the inputs
        and each other (a new array overlaps nothing)."""
        spans, n_in = self.spans, self.n_in
        objs = places = None
        given = 0
        i = 0
        for out in outs:
            if out is None:
                if objs is None:
                    objs, places = list(outs), list(out_ptrs)
                    stream = h.stream  # a property of the handle: read once
                new = self.allocs[i].new(stream)
                objs[i], places[i] = new, new.ptr
            else:
                given += 1
                out_ptr, out_span = out_ptrs[i], spans[n_in + i]
                end = out_ptr + out_span
                k = 0
                for in_ptr in ptrs:
                    if in_ptr < end and out_ptr < in_ptr + spans[k]:  # unless exactly in place
                        check_overlap(self.func, ptrs, spans, out_ptr, out_span, self.inplace)
                        break
                    k += 1  # noqa: SIM113 (enumerate costs more on the hot path)
            i += 1  # noqa: SIM113
        if given > 1:
            self._check_given(outs, out_ptrs)
        if objs is None:
            return outs, out_ptrs
        return tuple(objs), tuple(places)

    def _check_given(self, outs: tuple, out_ptrs: tuple) -> None:
        """Given outputs may not overlap each other."""
        spans, n_in = self.spans, self.n_in
        placed: list[tuple[int, int]] = []
        for i, out in enumerate(outs):
            if out is None:
                continue
            out_ptr, out_span = out_ptrs[i], spans[n_in + i]
            for other_ptr, other_span in placed:
                if out_span and other_span and overlaps(out_ptr, out_span, other_ptr, other_span):
                    raise ValueError(f"{self.func}: two outputs overlap; give separate arrays")
            placed.append((out_ptr, out_span))

    def launch(self, ptrs: Sequence[int]) -> None:  # pragma: no cover - abstract
        """The C call(s) on the final pointers: the inputs', then the outputs'."""
        raise NotImplementedError

    def evict(self) -> None:
        """Forget what made this entry stale (:func:`run_cached`); a plan-holding entry
        overrides it to drop its plan."""


class GraphCall(Call):
    """A builder graph's plan as a call entry (:mod:`pycudnn.graph`): ``launch`` runs the plan
    on the inputs' and outputs' pointers (the graph's io order), its constants' host
    addresses, the scratch tensors' places in the workspace, and the workspace."""

    __slots__ = ("consts", "graph", "key", "plan", "scratch")

    def __init__(
        self,
        func: str,
        handle: Any,
        allocs: tuple[OutputSpec | None, ...],
        spans: tuple[int, ...],
        graph: Any,
        stage: Staging | None = None,
        keepalive: Any = None,
    ) -> None:
        super().__init__(func, handle, allocs, spans, stage, keepalive=keepalive)
        self.graph = graph
        self.key = graph._key
        self.plan = graph.plan
        self.consts = tuple(graph.constant_pointers())
        self.scratch = self.key.scratch  # read once: the key's property builds a tuple

    def launch(self, ptrs: Sequence[int]) -> None:
        scratch = self.scratch
        if scratch:  # placeholders that GraphPlan.launch points into the workspace
            self.plan.launch((*ptrs, *self.consts, *(0,) * len(scratch)), scratch)
        else:
            self.plan.launch((*ptrs, *self.consts))


def has_bool(*values: Any) -> bool:
    """Whether any of *values* is a bool, or a tuple or list holding one.

    ``True == 1`` and ``(True, True) == (1, 1)`` with equal hashes: a call key alone would
    serve such a spelling (which the checks refuse) the valid call's cached entry. Callers put
    this in the key only where the argument is not its default object (the common case costs
    an identity test)."""
    for v in values:
        c = v.__class__
        if c is bool or ((c is tuple or c is list) and bool in map(type, v)):
            return True
    return False


# ==================================================================================================
# The call cache and the one way to run a call
# ==================================================================================================
#: per-thread state: ``local.calls`` is the thread's call cache once :func:`calls` made it (hot
#: paths read the attribute and fall back to :func:`calls`)
local = threading.local()


def calls() -> Any:
    """The calling thread's call-entry cache (an LRU cleared by ``clear_caches()``)."""
    try:
        return local.calls
    except AttributeError:
        lru = local.calls = _plans.new_lru()
        return lru


def cached_entry(key: Any, store: Any = None) -> Call | None:
    """The cached entry of *key* (None: none, or an unhashable key), for a caller that binds an
    entry once and then launches it itself (see :attr:`Call.lean`); the LRU order is left as is.
    """
    if store is None:
        store = calls()
    try:
        return store.data.get(key)
    except TypeError:
        return None


def new_store() -> Any:
    """A call-entry store for :func:`run_cached` besides the thread's (an LRU bounded and
    cleared as the thread's call cache; entries are dropped, never closed)."""
    return _plans.new_lru(owns=False)


def run_cached(
    key: Any,
    build: Callable[..., Call],
    args: tuple,
    ptrs: tuple[int, ...],
    outs: tuple,
    out_ptrs: tuple,
    stream: Any,
    stale: tuple[type[BaseException], ...] = (),
    on_hit: Callable[[], None] | None = None,
    store: Any = None,
) -> tuple:
    """Run the cached call entry of *key*, or ``build(*args)`` it (validation, descriptors), run
    it and cache it once it ran; returns the outputs as a tuple (:meth:`Call.run`).

    Parameters
    ----------
    key : hashable
        What was passed (:func:`._operand.key_of` of each operand, the arguments as given). An
        unhashable key (a list argument) runs uncached.
    build, args
        The builder and its arguments: a closure would make every variable it captures a cell
        in the caller, on the hot path too.
    ptrs, outs, out_ptrs, stream
        As for :meth:`Call.run`.
    stale : tuple of exception types
        Errors that mean a *cached* entry went stale (e.g. ``MemoryError``: its plan's workspace
        no longer fits): its :meth:`Call.evict` hook runs, it is dropped, rebuilt once and run.
    on_hit : callable, optional
        Called after each run of a cached entry (the plan engine's
        :func:`pycudnn.graph._plans.served_cached`: the engine alone keeps its counters).
    store : LRU, optional
        Where the entries live (default the thread's :func:`calls`).

    A fresh entry whose run fails is never cached, and its :meth:`Call.evict` hook runs (a plan
    that cannot run is not kept either).
    """
    if store is None:
        try:
            store = local.calls
        except AttributeError:
            store = calls()
    try:
        call = store.data.get(key)
    except TypeError:  # unhashable: built every time
        call = key = None
    if call is not None:
        try:
            result = call.run(ptrs, outs, out_ptrs, stream)
        except stale:
            call.evict()
            store.pop(key)
        else:
            if on_hit is not None:
                on_hit()
            local.last = call
            return result
    call = build(*args)
    try:
        result = call.run(ptrs, outs, out_ptrs, stream)
    except BaseException:
        call.evict()
        raise
    if key is not None:
        store.put(key, call)
    local.last = call if key is not None else None
    return result


def take_last_entry() -> Call | None:
    """The cached entry that the calling thread's latest successful :func:`run_cached` ran, and
    forget it (None: none since the last take, or that call was unhashable, hence uncached).

    How a framework adapter binds an entry to its own call signature (:attr:`Call.lean`): take
    (to forget a stale one), run the public function once with that signature, take again."""
    call = getattr(local, "last", None)
    local.last = None
    return call
