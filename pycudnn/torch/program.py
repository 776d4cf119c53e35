"""Launch programs (imports torch): the cuDNN launches of a region's first run with one input
signature, recorded once and replayed as a straight line.

A :class:`Program` is a list of *steps*, each a bound call entry of the high level
(:attr:`~pycudnn.highlevel._call.Call.lean`: its plan, descriptors and variant packs ready) and
the positions of its operands in a table of pointer *slots*:

* the external tensors' pointers (the region's inputs, the modules' parameters and buffers, a
  backward's incoming gradients and the forward's slots), filled by the caller on each run;
* places in one *arena*, a ``torch.empty`` per run on torch's current stream (or a few: its
  *chunks*), for every intermediate result; where lifetimes allow (``reuse=True``), results
  whose last reader has run share bytes, as a compiler's memory planner would;
* the results that leave the program (returned to autograd, read by torch), allocated each run
  as tensors of their own.

A backward program runs in its forward's arena (:func:`held`): its results take the bytes of
forward results it has read for the last time, and it gives each of the forward's chunks back
after the last launch that uses it while making its gradients as it first writes them, as
autograd frees saved tensors and allocates gradients as it goes, so that a training step's
peak is not the whole arena plus every gradient (:attr:`Program.plan`).

Running a program is a few allocations, the pointer arithmetic, and per step one tuple and the
entry's launch: no key, no lookup, no validation, no output object. Everything the validation
read is pinned by the caller's signature (shapes, strides, dtypes, devices, alignments, modes),
and a new signature records a new program. :func:`record` builds one from a :class:`~._lean.Tape`
of a real run, or says why it cannot: a launch that was not lean, or an operand that is neither
external nor produced by an earlier launch (a torch operation between the launches, which a
program would not replay).
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["ALIGN", "Held", "Program", "held", "record"]

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
        Slots after the arena's in a scratch buffer of its own, made per run (the stream orders
        its reuse): each one's byte offset there. Where the arena's layout is fixed
        (:func:`record`'s *places*), the results no later party reads go there.
    scratch_bytes : int
        The scratch buffer's size.
    cuts : sequence of int
        Where the arena's chunks start (0 first): each chunk is a ``torch.empty`` of its own,
        so that a backward can give back the ones it has done with (no place straddles a cut).
    plan : dict, optional
        A backward's schedule (:func:`record` with *busy*), ``step -> (chunks given back,
        results given back, results made, outputs made)`` before that step: the forward's
        chunks go back after the last launch that uses them; the results it keeps outside the
        arena (*temps*) and the outputs are made just before the launch that first writes
        them, as autograd frees saved tensors and allocates gradients as it goes. Without it
        everything is made as the run starts.
    temps : sequence of int
        With *plan*: the bytes of each result kept in a tensor of its own (the slots after
        the arena's).
    """

    __slots__ = (
        "arena_bytes",
        "chunk_bytes",
        "cuts",
        "handles",
        "n_ext",
        "offsets",
        "outs",
        "places",
        "plan",
        "scratch",
        "scratch_bytes",
        "steps",
        "temps",
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
        cuts: Sequence[int] = (0,),
        plan: dict[int, tuple] | None = None,
        temps: Sequence[int] = (),
    ) -> None:
        self.n_ext = n_ext
        self.offsets = tuple(offsets)
        self.arena_bytes = arena_bytes
        self.cuts = tuple(cuts)
        ends = (*self.cuts[1:], arena_bytes)
        self.chunk_bytes = tuple(e - c for c, e in zip(self.cuts, ends, strict=True))
        # each arena slot as (chunk, offset in it)
        self.places = tuple(
            (c, o - self.cuts[c]) for o in self.offsets for c in (bisect.bisect(self.cuts, o) - 1,)
        )
        self.scratch = tuple(scratch)
        self.scratch_bytes = scratch_bytes
        self.outs = tuple(outs)
        self.plan = plan or {}
        self.temps = tuple(temps)
        # itemgetter of two or more slots returns the tuple the launch takes, in C
        self.steps = tuple((entry.launch, operator.itemgetter(*idx)) for entry, idx in steps)
        self.handles = tuple({id(e.handle): e.handle for e, _ in steps}.values())

    def __len__(self) -> int:
        return len(self.steps)

    def own_peak(self) -> int:
        """The most bytes of the results a backward keeps outside the arena (:attr:`temps`)
        alive at once, as its :attr:`plan` makes and gives them back."""
        alive = peak = 0
        for _, gone, make, _ in self.plan.values():
            alive += sum(self.temps[j] for j in make) - sum(self.temps[j] for j in gone)
            peak = max(peak, alive)
        return peak

    def run(
        self,
        ext: list[int],
        device: torch.device,
        stream: int,
        arena: list[torch.Tensor | None] | None = None,
    ) -> tuple[list[torch.Tensor | None], list[torch.Tensor], list[int]]:
        """Launch every step on *stream* (torch's current stream on *device*, the entries'
        device) with the external pointers *ext*; returns ``(arena, outputs, slots)``: the
        arena's chunks and the outputs must live until the launches that read them have run
        (the stream orders their reuse), *slots* are every slot's pointer (a backward
        program's external slots). *arena*: the chunks to place the intermediate results in
        instead of new ones (a backward program recorded with :func:`record`'s *busy* runs in
        its forward's arena, and with a :attr:`plan` sets each chunk to None as it gives it
        back), used where they have :attr:`chunk_bytes`."""
        for h in self.handles:
            h.set_stream(stream)  # no C call when bound to it already
        sizes = self.chunk_bytes
        if not self.arena_bytes:
            arena = []
        elif (
            arena is None
            or len(arena) != len(sizes)
            or any(t is None or t.numel() < n for t, n in zip(arena, sizes, strict=True))
        ):
            arena = [torch.empty(n, dtype=torch.uint8, device=device) for n in sizes]
        if arena:
            bases = [t.data_ptr() for t in arena]
            ext = ext + [bases[c] + o for c, o in self.places]
        plan = self.plan
        if not plan:
            return self._run_all(ext, device, arena)
        n = len(ext)
        m = n + len(self.temps)
        slots = ext + [0] * (len(self.temps) + len(self.outs))
        temps: list[torch.Tensor | None] = [None] * len(self.temps)
        outs: list[torch.Tensor] = [None] * len(self.outs)  # type: ignore[list-item]
        u8 = torch.uint8
        for i, (launch, get) in enumerate(self.steps):
            todo = plan.get(i)
            if todo is not None:  # (given back first: what is made next may take the bytes)
                chunks, gone, make, out = todo
                for c in chunks:
                    arena[c] = None
                for j in gone:
                    temps[j] = None
                for j in make:
                    t = temps[j] = torch.empty(self.temps[j], dtype=u8, device=device)
                    slots[n + j] = t.data_ptr()
                for j in out:
                    s, st, dt = self.outs[j]
                    t = outs[j] = torch.empty_strided(s, st, dtype=dt, device=device)
                    slots[m + j] = t.data_ptr()
            launch(get(slots))
        del temps  # (after every launch is enqueued: the stream orders their reuse)
        return arena, outs, slots

    def _run_all(
        self, ext: list[int], device: torch.device, arena: list
    ) -> tuple[list, list[torch.Tensor], list[int]]:
        """:meth:`run` with everything made as the run starts."""
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


@dataclass(frozen=True)
class Held:
    """The forward's arena a backward program runs in (:func:`held`, :func:`record`'s *busy*).

    Attributes
    ----------
    places : tuple of (offset, size, first, last)
        The forward's places the backward's launches read or write, busy from launch 0 to
        *last*, the last of them using it.
    arena_bytes : int
        The forward's arena size.
    cuts : tuple of int
        Where the forward's arena chunks start (:attr:`Program.cuts`).
    """

    places: tuple[tuple[int, int, int, int], ...]
    arena_bytes: int
    cuts: tuple[int, ...] = (0,)


def record(
    launches: Sequence[tuple[Any, tuple]],
    ext: Sequence[torch.Tensor],
    outputs: Sequence[torch.Tensor | None],
    reuse: bool,
    places: dict[int, int] | None = None,
    arena_bytes: int = 0,
    busy: Held | None = None,
    live: Collection[int] = (),
    chunks: int = 1,
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
        The fixed layout's arena size (with *places*).
    busy : Held, optional
        The forward's arena this program (a backward, with *reuse*) runs in
        (:meth:`Program.run`'s *arena*): its intermediate results take the bytes of the
        forward's once their last reader has run, within a chunk the forward's results keep
        anyway, or else are made as tensors of their own as they are first written and given
        back after their last reader; the program gets a :attr:`Program.plan` that gives each
        forward chunk back after its last reader and makes the outputs as they are first
        written, as autograd frees saved tensors and allocates gradients as it goes. The
        forward's arena is never grown for what only its backward needs.
    live : collection of int
        The ``id`` of each intermediate result that must outlive the last launch (with *reuse*: a
        forward's results that its backward reads); the others share bytes by lifetime.
    chunks : int
        Split the arena into up to this many chunks (a forward whose backward gives them back).

    Returns
    -------
    (Program, slots) or str
        The program and the tensors of its slots in slot order (external, arena, scratch or
        own results, outputs), or the reason it cannot replay the tape.
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
    inner = [k for k in order if k not in keep]
    sized = {k: (_up(_span(produced[k][0]) or 0), *produced[k][1:]) for k in inner}
    got = _place(inner, sized, reuse, places, arena_bytes, busy)
    if isinstance(got, str):
        return got
    offsets, spare, top, placed = got
    inner = [k for k in inner if k in offsets]
    scratch: list[tuple[int, int, int, int]] = []
    if busy is None:  # the scratch buffer (a fixed layout's unplaced results)
        for k in spare:
            size, first, last = sized[k]
            off = _first_fit(scratch, size, first, last)
            scratch.append((off, size, first, last))
            offsets[k] = off
    tensors = list(ext)
    for k in inner + spare:
        slot[k] = len(tensors)
        tensors.append(produced[k][0])
    outs, made = [], []
    for t in outputs:
        if t is None or id(t) in slot:
            continue
        slot[id(t)] = len(tensors)
        tensors.append(t)
        outs.append((tuple(t.shape), t.stride(), t.dtype))
        made.append(produced[id(t)][1])
    steps = []
    for entry, ts in launches:
        idx = [slot[id(t)] for t in ts]
        if len(idx) < 2:
            return "a launch with fewer than two operands"
        steps.append((entry, idx))
    arena = [offsets[k] for k in inner]
    if busy is not None:
        own = [sized[k] for k in spare]
        plan = _plan(busy, placed, own, made, len(launches))
        temps = [n for n, _, _ in own]
        prog = Program(len(ext), arena, top, outs, steps, cuts=busy.cuts, plan=plan, temps=temps)
        return prog, tensors
    cuts = _cuts(placed, top, chunks) if reuse and chunks > 1 else (0,)
    spare_top = max((o + n for o, n, _, _ in scratch), default=0)
    offs = [offsets[k] for k in spare]
    return Program(len(ext), arena, top, outs, steps, offs, spare_top, cuts), tensors


def _place(
    inner: list[int],
    sized: dict[int, tuple[int, int, int]],
    reuse: bool,
    places: dict[int, int] | None,
    arena_bytes: int,
    busy: Held | None,
) -> tuple[dict[int, int], list[int], int, list[tuple[int, int, int, int]]] | str:
    """Arena places for the results *inner* (``sized``: their bytes, first and last launch):
    ``(offsets, the results left to the scratch buffer or to tensors of their own, the arena's
    size, every place as (offset, size, first, last))``, or why not."""
    placed: list[tuple[int, int, int, int]] = list(busy.places) if busy is not None else []
    offsets: dict[int, int] = {}
    spare: list[int] = []
    top = max((o + n for o, n, _, _ in placed), default=0)
    lives = _lives(busy) if busy is not None else []
    for k in inner:
        size, first, last = sized[k]
        if places is not None:
            if k not in places:
                spare.append(k)
                continue
            off = places[k]
        elif busy is not None:
            fit = _fit_chunks(placed, size, first, last, busy, lives)
            if fit is None:
                spare.append(k)
                continue
            off = fit
        elif reuse:
            off = _first_fit(placed, size, first, last)
        else:
            off = top
        placed.append((off, size, first, last))
        offsets[k] = off
        top = max(top, off + size)
    if places is not None:
        if top > arena_bytes:
            return f"the fixed layout's arena ({arena_bytes} bytes) is smaller than its places"
        top = arena_bytes
    if busy is not None:
        if top > busy.arena_bytes:
            return f"the forward's arena ({busy.arena_bytes} bytes) is smaller than its places"
        top = busy.arena_bytes
    return offsets, spare, top, placed


def _cuts(placed: Sequence[tuple[int, int, int, int]], top: int, n: int) -> tuple[int, ...]:
    """Up to *n* chunk starts (0 first) that split ``[0, top)`` where no place straddles, each
    the allowed offset nearest an n-th of the arena."""
    ok, end = [], 0
    for o, size in sorted((o, size) for o, size, _, _ in placed):
        if 0 < o >= end:
            ok.append(o)
        end = max(end, o + size)
    cuts = [0]
    for i in range(1, n):
        want = top * i // n
        c = min((o for o in ok if cuts[-1] < o < top), key=lambda o: abs(o - want), default=0)
        if c:
            cuts.append(c)
    return tuple(sorted(set(cuts)))


def _chunk_lives(places: Sequence[tuple[int, int, int, int]], cuts: Sequence[int]) -> list[int]:
    """Per chunk (starting at *cuts*), the last launch that uses one of *places* in it (-1:
    none)."""
    lives = [-1] * len(cuts)
    for o, _, _, last in places:
        c = bisect.bisect(cuts, o) - 1
        lives[c] = max(lives[c], last)
    return lives


def _lives(busy: Held) -> list[int]:
    """:func:`_chunk_lives` of *busy*'s forward places, where the chunk given back last keeps
    the run's whole length (a backward result placed there holds nothing longer)."""
    lives = _chunk_lives(busy.places, busy.cuts)
    longest = max(range(len(lives)), key=lives.__getitem__)
    lives[longest] = 2**62
    return lives


def _fit_chunks(
    placed: Sequence[tuple[int, int, int, int]],
    size: int,
    first: int,
    last: int,
    busy: Held,
    lives: list[int],
) -> int | None:
    """The lowest offset of *busy*'s arena where *size* bytes fit from launch *first* to *last*
    within one chunk that its forward places keep at least that long, or None."""
    ends = (*busy.cuts[1:], busy.arena_bytes)
    for lo, hi, life in zip(busy.cuts, ends, lives, strict=True):
        if life < last or hi - lo < size:
            continue
        off = lo
        # (no place straddles a cut: the forward's were cut around, the backward's fit within)
        for o, n in sorted(
            (o, n) for o, n, f, la in placed if lo <= o < hi and not (la < first or last < f)
        ):
            if off + size <= o:
                break
            off = max(off, o + n)
        if off + size <= hi:
            return off
    return None


def _plan(
    busy: Held,
    placed: Sequence[tuple[int, int, int, int]],
    own: Sequence[tuple[int, int, int]],
    made: Sequence[int],
    n: int,
) -> dict[int, tuple]:
    """A backward's :attr:`Program.plan`: each forward chunk given back after the last launch
    using one of its places (*placed*, the backward's own places too), each of its *own*
    results ``(bytes, first, last)`` made before its first launch and given back after its
    last, each output made before the launch *made* that writes it first."""
    todo: dict[int, tuple[list, list, list, list]] = {}

    def at(i: int) -> tuple[list, list, list, list]:
        return todo.setdefault(i, ([], [], [], []))

    if len(busy.cuts) > 1:
        for c, life in enumerate(_chunk_lives(placed, busy.cuts)):
            if life + 1 < n:
                at(life + 1)[0].append(c)
    for j, (_, first, last) in enumerate(own):
        at(first)[2].append(j)
        if last + 1 < n:
            at(last + 1)[1].append(j)
    for j, first in enumerate(made):
        at(first)[3].append(j)
    return {i: tuple(map(tuple, v)) for i, v in sorted(todo.items())}


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
) -> Held:
    """The *forward* program's arena as a backward's *launches* (a tape's) find it, for
    :func:`record`'s *busy*: the places they read or write, each ``(offset, size, 0, last
    launch using it)`` (a place no launch uses is free from the backward's start), the arena's
    size and chunks. *tensors* are the forward's slot tensors (``record``'s second result)."""
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
    return Held(tuple(out), forward.arena_bytes, forward.cuts)
