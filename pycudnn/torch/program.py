"""Launch programs (imports torch): the cuDNN launches of a region's first run with one input
signature, recorded once and replayed as a straight line.

A :class:`Program` is a list of *steps*, each a bound call entry of the high level
(:attr:`~pycudnn.highlevel._call.Call.lean`: its plan, descriptors and variant packs ready) and
the positions of its operands in a table of pointer *slots*:

* the external tensors' pointers (the region's inputs, the modules' parameters and buffers, a
  backward's incoming gradients and the forward's slots), filled by the caller on each run;
* places in one *arena*, a single ``torch.empty`` per run on torch's current stream, for every
  intermediate result; where lifetimes allow (``reuse=True``), results whose last reader has run
  share bytes, as a compiler's memory planner would;
* the results that leave the program (returned to autograd, read by torch), allocated each run
  as tensors of their own.

Running a program is one allocation, the pointer arithmetic, and per step one tuple and the
entry's launch: no key, no lookup, no validation, no output object. Everything the validation
read is pinned by the caller's signature (shapes, strides, dtypes, devices, alignments, modes),
and a new signature records a new program. :func:`record` builds one from a :class:`~._lean.Tape`
of a real run, or says why it cannot: a launch that was not lean, or an operand that is neither
external nor produced by an earlier launch (a torch operation between the launches, which a
program would not replay).
"""

from __future__ import annotations

import operator
from collections.abc import Collection, Sequence
from typing import Any

import torch

__all__ = ["ALIGN", "Program", "held", "record"]

#: arena places are aligned to this many bytes (cuDNN's plans were chosen for 16-byte aligned
#: operands; torch's own allocations are 512-byte aligned)
ALIGN = 256


def _up(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class Program:
    """A straight line of bound launches over pointer slots (see the module docstring).

    Parameters
    ----------
    n_ext : int
        External slots (filled by the caller, in :func:`record`'s *ext* order).
    offsets : sequence of int
        The arena's slots: each one's byte offset.
    arena_bytes : int
        The arena's size.
    outs : sequence of (shape, strides, dtype)
        The results allocated as tensors of their own, in *outputs* order.
    steps : sequence of (entry, slot indices)
        The launches.
    scratch : sequence of int
        Slots after the arena's in a scratch buffer of its own, made per run and dropped as the
        run returns (the stream orders its reuse): each one's byte offset there. Where the
        arena's layout is fixed (:func:`record`'s *places*), the results no later party reads
        go there.
    scratch_bytes : int
        The scratch buffer's size.
    """

    __slots__ = (
        "arena_bytes",
        "handles",
        "n_ext",
        "offsets",
        "outs",
        "scratch",
        "scratch_bytes",
        "steps",
    )

    def __init__(
        self,
        n_ext: int,
        offsets: Sequence[int],
        arena_bytes: int,
        outs: Sequence[tuple],
        steps: Sequence[tuple[Any, Sequence[int]]],
        scratch: Sequence[int] = (),
        scratch_bytes: int = 0,
    ) -> None:
        self.n_ext = n_ext
        self.offsets = tuple(offsets)
        self.arena_bytes = arena_bytes
        self.scratch = tuple(scratch)
        self.scratch_bytes = scratch_bytes
        self.outs = tuple(outs)
        # itemgetter of two or more slots returns the tuple the launch takes, in C
        self.steps = tuple((entry.launch, operator.itemgetter(*idx)) for entry, idx in steps)
        self.handles = tuple({id(e.handle): e.handle for e, _ in steps}.values())

    def __len__(self) -> int:
        return len(self.steps)

    def run(
        self,
        ext: list[int],
        device: torch.device,
        stream: int,
        arena: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor | None, list[torch.Tensor], list[int]]:
        """Launch every step on *stream* (torch's current stream on *device*, the entries'
        device) with the external pointers *ext*; returns ``(arena, outputs, slots)``: the
        arena and the outputs must live until the launches that read them have run (the
        stream orders their reuse), *slots* are every slot's pointer (a backward program's
        external slots). *arena*: an arena to place the intermediate results in instead of a
        new one (a backward program recorded with :func:`record`'s *busy* runs in its
        forward's arena), used where it has :attr:`arena_bytes`."""
        for h in self.handles:
            h.set_stream(stream)  # no C call when bound to it already
        if not self.arena_bytes:
            arena = None
        else:
            if arena is None or arena.numel() < self.arena_bytes:
                arena = torch.empty(self.arena_bytes, dtype=torch.uint8, device=device)
            base = arena.data_ptr()
            ext = ext + [base + o for o in self.offsets]
        scratch = None
        if self.scratch_bytes:  # held until every launch is enqueued (the stream orders reuse)
            scratch = torch.empty(self.scratch_bytes, dtype=torch.uint8, device=device)
            base = scratch.data_ptr()
            ext = ext + [base + o for o in self.scratch]
        outs = [torch.empty_strided(s, st, dtype=dt, device=device) for s, st, dt in self.outs]
        slots = ext + [t.data_ptr() for t in outs]
        for launch, get in self.steps:
            launch(get(slots))
        del scratch
        return arena, outs, slots


def _span(t: torch.Tensor) -> int | None:
    """The bytes of a tensor that owns its storage from its first byte, else None."""
    st = t.untyped_storage()
    if t.data_ptr() != st.data_ptr():
        return None
    return st.nbytes()


def record(
    launches: Sequence[tuple[Any, tuple]],
    ext: Sequence[torch.Tensor],
    outputs: Sequence[torch.Tensor | None],
    reuse: bool,
    places: dict[int, int] | None = None,
    arena_bytes: int = 0,
    busy: Sequence[tuple[int, int, int, int]] = (),
    live: Collection[int] = (),
) -> tuple[Program, list[torch.Tensor]] | str:
    """A :class:`Program` replaying *launches* (a tape's ``(entry, tensors)``), or why not.

    Parameters
    ----------
    launches : sequence of (entry, tensors)
        What a :class:`~._lean.Tape` recorded: the entry (None: not lean) and its operands,
        the inputs' then the outputs' (``entry.n_in`` inputs).
    ext : sequence of torch.Tensor
        The tensors whose pointers the caller gives on each run, in that order.
    outputs : sequence of torch.Tensor or None
        Results to allocate as tensors of their own, each produced by a launch, in the order
        :meth:`Program.run` returns them (None: skipped).
    reuse : bool
        Let intermediate results whose last reader has run share arena bytes (a forward's
        results that a backward reads: only with *live*).
    places : dict, optional
        A fixed arena layout instead of one planned here: ``id(tensor) -> byte offset`` for
        the intermediate results a later party reads, in an arena of *arena_bytes* (a layout
        another party computes too, e.g. a custom op's fake, which hands the arena on as one
        tensor); the results with no place (read by later launches only: a kernel's partial
        sums) go to the program's scratch buffer, sharing bytes by lifetime.
    arena_bytes : int
        The fixed layout's arena size (with *places*); with *busy*, the size of the arena the
        program runs in (the forward's).
    busy : sequence of (offset, size, first, last)
        Arena bytes already in use during launches *first* to *last* (with *reuse*): a
        backward's forward results, from :func:`held`, so that the backward's intermediate
        results take the bytes of the forward's once their last reader has run, and the
        program runs in the forward's arena (:meth:`Program.run`'s *arena*), as autograd
        frees a saved tensor after its last use. A result that fits nowhere below
        *arena_bytes* goes to the scratch buffer instead (made as the backward runs), so the
        forward's arena is never grown for what only its backward needs.
    live : collection of int
        The ``id`` of each intermediate result that must outlive the last launch (with *reuse*: a
        forward's results that its backward reads); the others share bytes by lifetime.

    Returns
    -------
    (Program, slots) or str
        The program and the tensors of its slots in slot order (external, arena, outputs),
        or the reason it cannot replay the tape.
    """
    slot: dict[int, int] = {id(t): i for i, t in enumerate(ext)}
    keep = {id(t) for t in outputs if t is not None and id(t) not in slot}
    produced: dict[int, list] = {}  # id -> [tensor, first step, last step]
    order: list[int] = []
    for i, (entry, tensors) in enumerate(launches):
        if entry is None:
            return f"launch {i} is not a bound (lean) call"
        n_in = entry.n_in
        for j, t in enumerate(tensors):
            k = id(t)
            if k in slot:
                continue
            p = produced.get(k)
            if p is not None:
                p[2] = i
            elif j >= n_in:
                if _span(t) is None:
                    return f"launch {i} writes a view (operand {j}), not a tensor of its own"
                produced[k] = [t, i, i]
                order.append(k)
            else:
                return (
                    f"launch {i} reads an operand ({j}: {tuple(t.shape)} {t.dtype}) that no "
                    "launch produced and the caller does not give (a torch operation between "
                    "launches)"
                )
    for t in outputs:
        if t is not None and id(t) not in produced:
            return f"an output ({tuple(t.shape)} {t.dtype}) is produced by no launch"
    for k in live:
        p = produced.get(k)
        if p is not None:
            p[2] = len(launches)  # (past every launch: no later result takes its bytes)
    # arena places: first fit over the live intervals (or one after the other); the results a
    # fixed layout does not place, or that a backward cannot fit into its forward's arena, go
    # to the scratch buffer
    inner = [k for k in order if k not in keep]
    spare = [] if places is None else [k for k in inner if k not in places]
    if spare:
        inner = [k for k in inner if k in places]
    placed: list[tuple[int, int, int, int]] = list(busy)  # (offset, size, first, last)
    offsets: dict[int, int] = {}
    top = max((o + n for o, n, _, _ in busy), default=0)
    for k in inner:
        t, first, last = produced[k]
        size = _up(_span(t) or 0)
        off = 0
        if places is not None:
            off = places[k]
        elif reuse:
            off = _first_fit(placed, size, first, last)
            if busy and off + size > arena_bytes:
                spare.append(k)
                continue
        else:
            off = top
        placed.append((off, size, first, last))
        offsets[k] = off
        top = max(top, off + size)
    if busy:
        if top > arena_bytes:
            return f"the forward's arena ({arena_bytes} bytes) is smaller than its busy places"
        inner = [k for k in inner if k in offsets]
    if places is not None:
        if top > arena_bytes:
            return f"the fixed layout's arena ({arena_bytes} bytes) is smaller than its places"
        top = arena_bytes
    scratch: list[tuple[int, int, int, int]] = []
    for k in spare:
        t, first, last = produced[k]
        size = _up(_span(t) or 0)
        off = _first_fit(scratch, size, first, last)
        scratch.append((off, size, first, last))
        offsets[k] = off
    tensors = list(ext)
    for k in inner + spare:
        slot[k] = len(tensors)
        tensors.append(produced[k][0])
    outs = []
    for t in outputs:
        if t is None or id(t) in slot:
            continue
        slot[id(t)] = len(tensors)
        tensors.append(t)
        outs.append((tuple(t.shape), t.stride(), t.dtype))
    steps = []
    for entry, ts in launches:
        idx = [slot[id(t)] for t in ts]
        if len(idx) < 2:
            return "a launch with fewer than two operands"
        steps.append((entry, idx))
    spare_top = max((o + n for o, n, _, _ in scratch), default=0)
    arena = [offsets[k] for k in inner]
    prog = Program(len(ext), arena, top, outs, steps, [offsets[k] for k in spare], spare_top)
    return prog, tensors


def _first_fit(
    placed: Sequence[tuple[int, int, int, int]], size: int, first: int, last: int
) -> int:
    """The lowest offset where *size* bytes live from launch *first* to *last* overlap none of
    the *placed* ``(offset, size, first, last)`` that live at the same time."""
    off = 0
    for o, s in sorted((o, s) for o, s, f, la in placed if not (la < first or last < f)):
        if off + size <= o:
            break
        off = max(off, o + s)
    return off


def held(
    forward: Program, tensors: Sequence[torch.Tensor], launches: Sequence[tuple[Any, tuple]]
) -> list[tuple[int, int, int, int]]:
    """The *forward* program's arena places that a backward's *launches* (a tape's) read or
    write, as :func:`record`'s *busy*: ``(offset, size, 0, last launch using it)``. *tensors*
    are the forward's slot tensors (``record``'s second result); a place no launch uses is
    free from the backward's start."""
    inner = tensors[forward.n_ext : forward.n_ext + len(forward.offsets)]
    last: dict[int, int] = {}
    ids = {id(t) for t in inner}
    for i, (_, ts) in enumerate(launches):
        for t in ts:
            if id(t) in ids:
                last[id(t)] = i
    out = []
    for t, off in zip(inner, forward.offsets, strict=True):
        i = last.get(id(t))
        if i is not None:
            out.append((off, _up(_span(t) or 0), 0, i))
    return out
