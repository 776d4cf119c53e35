"""The attention's graphs: one forward and one backward builder through the graph nodes
(:meth:`pycudnn.graph.Graph.sdpa`, :meth:`~pycudnn.graph.Graph.sdpa_backward`) for every layout.

:func:`build` is what the call cache runs on a miss: it makes the
:class:`._request.AttentionRequest` of the fields the hot path passed, reads it once
(:func:`._operands.read`) and builds the graph of its direction. Each layout declares its
operands its own way -- dense and padded ones as they are (a packed copy when a head dim is not
contiguous), with their masks and lengths; packed ones as ``(B, H, max_seqlen, D)`` views over
cuDNN's ragged offsets (:class:`Ragged`); a paged cache with its page tables -- and shares the
node, the dropout scalars, the outputs and the call entry (:func:`._calls.entry`). The
declaration order of each layout's tensors is fixed (it assigns their uids).
"""

from __future__ import annotations

from typing import Any

from ... import _layout
from ..._types import dtype_name
from ...enums import DataType
from ...graph import Graph
from ...graph._tensor import alignment_of
from .. import _call, _graphops, _operand
from . import _calls, _cu_seqlens, _masks, _operands
from ._request import PADDED, PAGED, RAGGED, AttentionRequest, Checked

__all__ = ["Ragged", "backward", "build", "forward"]


def build(*fields: Any) -> _call.GraphCall:
    """The call entry of the request made of *fields* (:class:`._request.AttentionRequest`'s,
    in order): read, then built in its direction."""
    c = _operands.read(AttentionRequest._make(fields))
    return backward(c) if c.req.backward else forward(c)


class Ragged:
    """What the graph of a packed call declares: the (B, H, S, D) view of each packed
    operand, the sequence lengths and one offset tensor per distinct token stride."""

    def __init__(self, g: Graph, packed: tuple):
        """*packed*: ``(B, (max_seqlen_q, max_seqlen_kv), roles, totals)``."""
        b, maxes, roles, totals = packed
        self.g, self.b, self.maxes = g, b, maxes
        self.pairs = _cu_seqlens.distinct(roles)
        self.odt = _cu_seqlens.offsets_type(self.pairs, totals)
        self.lens = [
            g.tensor((b, 1, 1, 1), (1, 1, 1, 1), DataType.INT32, name=f"seq_len_{s}")
            for s in ("q", "kv")
        ]
        self.offsets = [
            g.tensor((b + 1, 1, 1, 1), (1, 1, 1, 1), self.odt, name=f"offsets{i}")
            for i in range(len(self.pairs))
        ]

    def view(self, name: str, side: int, x: _operand.Operand, dt: Any) -> Any:
        """A packed ``(T, H, D)`` operand *x* of side *side* (0: q's, 1: kv's) as a graph
        input."""
        shape, strides = tuple(x.shape), tuple(x.strides)
        t = self.g.tensor(
            self.dims(side, shape), self.strides(side, strides), dt, name=name
        ).set_alignment(alignment_of(x.ptr))
        return self.ragged(t, side, strides[0])

    def dims(self, side: int, shape: tuple) -> tuple[int, int, int, int]:
        return (self.b, shape[1], self.maxes[side], shape[2])

    def strides(self, side: int, strides: tuple) -> tuple[int, int, int, int]:
        st, sh = strides[0], strides[1]
        return (self.maxes[side] * st, max(sh, 1), st, 1)

    def ragged(self, t: Any, side: int, token_stride: int) -> Any:
        return t.set_ragged_offset(self.offsets[self.pairs.index((side, token_stride))])

    def place(self, t: Any, side: int, strides: tuple) -> None:
        """An output *t* laid out with the packed *strides*, on its side's offsets."""
        t.set_stride(self.strides(side, strides))
        self.ragged(t, side, strides[0])

    def kwargs(self) -> dict:
        return {"seq_len_q": self.lens[0], "seq_len_kv": self.lens[1]}

    def inputs(self) -> list:
        return [*self.lens, *self.offsets]

    def spans(self) -> list[int]:
        isz = 4 if self.odt == DataType.INT32 else 8
        return [self.b * 4, self.b * 4, *((self.b + 1) * isz for _ in self.offsets)]


# ==================================================================================================
# Inputs
# ==================================================================================================
def _dense(c: Checked, g: Graph, named: tuple, stage: list) -> list:
    """Dense operands as they are (*stage* collects the ones whose head dim needs a packed
    copy)."""
    ts = []
    for i, (name, x) in enumerate(named):
        st, al = _operands.layout_of(c.req.func, name, x, i, stage)
        ts.append(g.tensor(tuple(x.shape), st, c.dt, name=name, alignment=al))
    return ts


def _dense_extras(c: Checked, g: Graph, skv: int) -> tuple[dict, list, list]:
    """A dense call's masks (declared first) and padding lengths: ``(node keyword arguments,
    inputs, their spans)``, the lengths' inputs before the masks'."""
    b, hq, sq = c.gq.shape[:3]
    req = c.req
    md = _masks.declare(req.func, g, req.attn_mask, req.masks, (b, hq, sq, skv), c.dt, c.device)
    kw = dict(md.kwargs)
    inputs: list = []
    spans: list = []
    if req.layout == PADDED:
        gsq, gskv = c.lens
        kw["seq_len_q"] = _graphops.column(g, "seq_len_q", b, DataType.INT32, gsq.ptr)
        kw["seq_len_kv"] = _graphops.column(g, "seq_len_kv", b, DataType.INT32, gskv.ptr)
        inputs += [kw["seq_len_q"], kw["seq_len_kv"]]
        spans += [gsq.nbytes_span, gskv.nbytes_span]
    return kw, inputs + md.inputs, spans + md.spans


def _paged(c: Checked, g: Graph, stage: list) -> tuple:
    """q, the two caches, the two page tables (two tensors even on one table, as FlashInfer
    declares them: one load each) and the lengths: ``(tensors, keyword arguments, spans)``."""
    gq, gk = c.gq, c.gk
    b, block = gq.shape[0], gk.shape[2]
    gt, gtv, max_s = c.tables
    gsq, gskv = c.lens
    st_q, aq = _operands.layout_of(c.req.func, "q", gq, 0, stage)
    ts = [g.tensor(gq.shape, st_q, c.dt, name="q", alignment=aq)]
    ts += [_graphops.declare(g, "k_cache", gk), _graphops.declare(g, "v_cache", c.gv)]
    pages = -(-max_s // block)
    for name, t in (("page_table_k", gt), ("page_table_v", gtv)):
        # the first pages of the (B, W) table, as cuDNN's (B, 1, pages, 1), read in place
        rows, cols = (max(s, 1) for s in t.strides)
        dims, strides = (t.shape[0], 1, pages, 1), (rows, rows, cols, 1)
        ts.append(g.tensor(dims, strides, DataType.INT32, name=name, alignment=alignment_of(t.ptr)))
    # without seq_lens_q, the entry's own array of S_q's (made once the plan is found; a fresh
    # allocation is aligned to at least 16 bytes)
    ts.append(_graphops.column(g, "seq_len_q", b, DataType.INT32, 16 if gsq is None else gsq.ptr))
    ts.append(_graphops.column(g, "seq_len_kv", b, DataType.INT32, gskv.ptr))
    kw = {
        "diagonal_alignment": "bottom_right" if c.causal else "top_left",
        "seq_len_q": ts[5],
        "seq_len_kv": ts[6],
        "paged_attention_k_table": ts[3],
        "paged_attention_v_table": ts[4],
        "paged_attention_max_seq_len_kv": max_s,
    }
    spans = [x.nbytes_span for x in (gq, gk, c.gv, gt, gtv)]
    spans += [0 if gsq is None else gsq.nbytes_span, gskv.nbytes_span]
    return ts, kw, spans


def _dropout(g: Graph, p: float) -> tuple | None:
    """The node's ``dropout=``: by-value seed and offset scalars (the seed's value is written by
    each launch, :class:`._calls.Seeded`), no inputs; None without dropout."""
    if not p:
        return None
    tseed = g.scalar(0, "int64", name="seed")
    return (p, tseed, g.scalar(0, "int64", name="offset"))


# ==================================================================================================
# Forward
# ==================================================================================================
def forward(c: Checked) -> _call.GraphCall:
    """The forward graph of *c* and its call entry: inputs in the pointer order of the hot
    path (q, k, v, then the layout's lengths, offsets, tables, masks), then out (and the
    statistics when training)."""
    req = c.req
    func, layout, training = req.func, req.layout, req.training
    gq, gk, gv, dt = c.gq, c.gk, c.gv, c.dt
    g = Graph(dt, DataType.FLOAT, DataType.FLOAT, name=func)
    stage: list = []
    named = (("q", gq), ("k", gk), ("v", gv))
    r = None
    if layout == RAGGED:
        r = Ragged(g, req.lengths)
        ts = [r.view(n, side, x, dt) for (n, x), side in zip(named, (0, 1, 1), strict=True)]
        kw, extra, in_spans = r.kwargs(), r.inputs(), r.spans()
        in_spans = [x.nbytes_span for _n, x in named] + in_spans
    elif layout == PAGED:
        ts, kw, in_spans = _paged(c, g, stage)
        ts, extra = ts[:3], ts[3:]
    else:
        ts = _dense(c, g, named, stage)
        kw, extra, more = _dense_extras(c, g, gk.shape[2])
        in_spans = [x.nbytes_span for _n, x in named] + more
    o, stats = g.sdpa(
        *ts,
        attn_scale=c.scale,
        is_inference=not training,
        use_causal_mask=c.causal,
        dropout=_dropout(g, c.p),
        name="sdpa",
        **kw,
    )
    outs, allocs, out_spans = _forward_outputs(c, r, o, stats)
    g.set_io_order(*ts, *extra, *outs)
    return _calls.entry(c, g, allocs, [*in_spans, *out_spans], _what(c, "forward"), stage)


def _forward_outputs(c: Checked, r: Ragged | None, o: Any, stats: Any) -> tuple:
    """out (and the statistics when training) laid out: ``(tensors, specs, byte spans)``."""
    req = c.req
    gq, device = c.gq, c.device
    if r is not None:  # packed: out as given, or packed (T, H, D_v); the statistics (T, H, 1)
        oshape = (gq.shape[0], gq.shape[1], c.gv.shape[2])
        if c.out is not None:
            alloc, o_strides, span = None, tuple(c.out.strides), c.out.nbytes_span
            o.set_alignment(alignment_of(c.out.ptr))
        else:
            alloc = _call.output_spec(oshape, c.dt, device)
            o_strides, span = alloc.element_strides, alloc.nbytes_span
        r.place(o, 0, o_strides)
        if stats is None:
            return [o], [alloc], [span]
        hq = gq.shape[1]
        sspec = _call.output_spec((gq.shape[0], hq, 1), DataType.FLOAT, device)
        r.place(stats, 0, (hq, 1))
        return [o, stats], [alloc, sspec], [span, sspec.nbytes_span]
    b, hq, sq = gq.shape[:3]
    given = req.outs[0] if req.outs else None
    alloc, span = _operands.output(req.func, o, given, (b, hq, sq, c.gv.shape[3]), gq)
    if not req.training:
        return [o], [alloc], [span]
    sspec, sspan = _graphops.packed_output(
        req.func, "out_stats", stats, req.outs[1], (b, hq, sq, 1), DataType.FLOAT, device
    )
    return [o, stats], [alloc, sspec], [span, sspan]


def _what(c: Checked, direction: str) -> str:
    """What the call computes, for the error of a graph cuDNN has no engine for."""
    req = c.req
    if req.layout == RAGGED:
        kind = f"packed variable-length attention {direction}"
        return _calls.describe(kind, c, False, req.training)
    if req.layout == PAGED:
        gk, (_gt, _gtv, max_s) = c.gk, c.tables
        return (
            f"{dtype_name(c.dt)} paged attention forward q{tuple(c.gq.shape)} "
            f"k_cache{tuple(gk.shape)} (block size {gk.shape[2]}, max_seqlen_kv {max_s}"
            f"{', causal' if c.causal else ''})"
        )
    kind = f"attention {direction}" + _masks.describe(req.attn_mask, req.masks)
    return _calls.describe(kind, c, req.layout == PADDED, req.training)


# ==================================================================================================
# Backward
# ==================================================================================================
def backward(c: Checked) -> _call.GraphCall:
    """The backward graph of *c* (dense, padded or packed) and its call entry: inputs q, k, v,
    out, dout, stats, then the layout's lengths and offsets or masks; outputs dq, dk, dv (and
    dbias, dsink when asked for)."""
    req = c.req
    func, layout = req.func, req.layout
    gq, gk, gv, dt = c.gq, c.gk, c.gv, c.dt
    go, gdo, gs = c.saved
    g = Graph(dt, DataType.FLOAT, DataType.FLOAT, name=func)
    stage: list = []
    named = (("q", gq), ("k", gk), ("v", gv), ("out", go), ("dout", gdo))
    r = None
    if layout == RAGGED:
        r = Ragged(g, req.lengths)
        sides = (0, 1, 1, 0, 0)
        ts = [r.view(n, side, x, dt) for (n, x), side in zip(named, sides, strict=True)]
        hq, s_tok = gq.shape[1], gs.strides[0]  # (the call's roles read the same stride)
        dims, strides = r.dims(0, (0, hq, 1)), r.strides(0, (s_tok, 1))
        tst = g.tensor(dims, strides, DataType.FLOAT, name="stats")
        tst.set_alignment(alignment_of(gs.ptr))
        r.ragged(tst, 0, s_tok)
        kw, extra, more = r.kwargs(), r.inputs(), r.spans()
    else:
        ts = _dense(c, g, named, stage)
        shape = tuple(gs.shape)
        tst = g.tensor(
            shape,
            _layout.packed_strides(shape),
            DataType.FLOAT,
            name="stats",
            alignment=alignment_of(gs.ptr),
        )
        kw, extra, more = _dense_extras(c, g, gk.shape[2])
    masks = req.masks
    want = (False, False) if masks is None else (masks.bias_grad, masks.sink_grad)
    grads = g.sdpa_backward(
        *ts,
        tst,
        attn_scale=c.scale,
        use_causal_mask=c.causal,
        dropout=_dropout(g, c.p),
        use_deterministic_algorithm=req.deterministic,
        dbias=want[0],
        dsink=want[1],
        **kw,
    )
    allocs, out_spans = _backward_outputs(c, r, grads)
    g.set_io_order(*ts, tst, *extra, *grads)
    in_spans = [x.nbytes_span for _n, x in named] + [gs.nbytes_span, *more]
    return _calls.entry(c, g, allocs, [*in_spans, *out_spans], _what(c, "backward"), stage)


def _backward_outputs(c: Checked, r: Ragged | None, grads: list) -> tuple[list, list]:
    """dq, dk, dv laid out -- as given (``out_grads``), packed like the packed operands, or
    in q's, k's and v's memory order -- then dbias, dsink packed: ``(specs, byte spans)``."""
    req = c.req
    gq, gk, gv, dt = c.gq, c.gk, c.gv, c.dt
    allocs: list = []
    given_spans: list = []
    for i, (t, side, like) in enumerate(zip(grads[:3], (0, 1, 1), (gq, gk, gv), strict=True)):
        shape = tuple(like.shape)
        if r is not None:
            spec = _call.output_spec(shape, dt, c.device)
            r.place(t, side, spec.element_strides)
        elif req.outs:  # given: laid out as given (checked: shape, dtype, device, head dim)
            name = f"out_grads[{i}]"
            spec, span = _operands.output(req.func, t, req.outs[i], shape, like, name)
            given_spans.append(span)
        else:
            spec = _operands.spec_like(like, shape, dt)
            t.set_stride(spec.element_strides)
        allocs.append(spec)
    for t in grads[3:]:  # dbias (io type), dsink (float32): packed
        spec = _call.output_spec(t.dim, dt if t.data_type is None else t.data_type, c.device)
        t.set_stride(_layout.packed_strides(t.dim))
        allocs.append(spec)
    return allocs, given_spans or [a.nbytes_span for a in allocs]
