"""The attention's call entries (the high level's one :class:`._call.Call` protocol, run by
:func:`._call.run_cached`): a builder graph's :class:`._call.GraphCall`, a :class:`Seeded` one
for a call with dropout, a :class:`FixedLensQ` one for a paged call without ``seq_lens_q``;
:func:`entry` plans a graph into the entry its request needs, and :func:`run` runs a call
through the thread's call cache with the seed its launch reads."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from ..._types import dtype_name
from ...enums import DataType
from .. import _call, _graphops, _staging
from ._request import PAGED, Checked

__all__ = ["LENS_Q_AT", "FixedLensQ", "Seeded", "describe", "entry", "run"]

#: the per-call seed of an attention with dropout (not in the key; read by its launch)
_RUN = threading.local()
#: where the default seq_lens_q (every sequence S_q queries) sits in a paged call's pointers
LENS_Q_AT = 5


class Seeded(_call.GraphCall):
    """An attention graph with dropout: its Philox seed is a by-value graph scalar, and
    :meth:`launch` writes this call's seed (:func:`run`'s) into it before the plan runs. cuDNN
    reads by-value scalars when it enqueues the kernels, so no device copy and no
    synchronisation are needed (a CUDA graph captured with one seed replays that seed)."""

    __slots__ = ("seed",)
    lean = False  # launch reads the per-call seed

    def launch(self, ptrs: Sequence[int]) -> None:
        self.seed.value = _RUN.seed
        super().launch(ptrs)


class FixedLensQ(_call.GraphCall):
    """A paged attention without ``seq_lens_q``: the caller passes pointer 0 for it and
    :meth:`launch` puts in this entry's device array of ``S_q``'s (made once, kept alive)."""

    __slots__ = ("lens_q",)

    def launch(self, ptrs: Sequence[int]) -> None:
        ptrs = list(ptrs)
        ptrs[LENS_Q_AT] = self.lens_q.ptr
        super().launch(ptrs)


def run(
    seed: int | None,
    key: Any,
    build: Any,
    args: tuple,
    ptrs: tuple,
    outs: tuple,
    out_ptrs: tuple,
    stream: Any,
) -> tuple:
    """:func:`._call.run_cached`, with *seed* for a :class:`Seeded` launch (dropout; None:
    none)."""
    if seed is None:
        return _call.run_cached(key, build, args, ptrs, outs, out_ptrs, stream)
    _RUN.seed = seed
    try:
        return _call.run_cached(key, build, args, ptrs, outs, out_ptrs, stream)
    finally:
        _RUN.seed = None


def entry(c: Checked, g: Any, allocs: list, spans: list, what: str, stage: list) -> Any:
    """*g* planned into *c*'s call entry (*allocs*: the outputs' specs; *spans*: the inputs',
    then the outputs' byte spans; *stage*: the operands staged through packed copies)."""
    req = c.req
    default_lens = req.layout == PAGED and c.lens[0] is None
    kind = Seeded if c.p else FixedLensQ if default_lens else _call.GraphCall
    st = _staging.Stage(c.dt, stage, None, 1.0, 0.0) if stage else None
    call = _graphops.entry(
        req.func, g, c.device, req.stream, allocs, spans, what=what, stage=st, kind=kind
    )
    if c.p:  # the graph's host scalar of the seed (g.scalar's), written by each launch
        call.seed = next(t for t in g._tensors if t.name == "seed")._value
    if default_lens:  # every sequence S_q queries: a cached device array of them
        call.lens_q = _graphops.filled(c.gq.shape[0], DataType.INT32, c.device, c.gq.shape[2])
    return call


def describe(kind: str, c: Checked, padded: bool, training: bool) -> str:
    """What the call computes, for an error message: *kind* and the options."""
    opts = [
        o
        for o, on in (
            ("causal", c.causal),
            ("padding mask", padded),
            (f"dropout {c.p}", bool(c.p)),
            ("training", training),
        )
        if on
    ]
    return f"{dtype_name(c.dt)} {kind} q{tuple(c.gq.shape)} k{tuple(c.gk.shape)}" + (
        f" ({', '.join(opts)})" if opts else ""
    )
