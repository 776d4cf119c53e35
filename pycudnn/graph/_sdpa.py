"""Scaled dot-product attention as cuDNN's *composite* graphs: the matmul / pointwise /
reduction / RNG pattern that cuDNN's fused flash-attention engines recognise (the graph
cudnn-frontend builds for its ``CompositeSDPANode`` and ``CompositeSDPABackwardNode``; our
notes on it are in ``docs/graph.md``).

Forward::

    S = Q @ K^T                        (K described transposed: same memory, swapped dims)
    S = S * scale
    [padding: rows >= seq_len_q or cols >= seq_len_kv -> -inf]
    [causal (top left): col > row -> -inf]
    M = max_j S;  E = exp(S - M);  Z = sum_j E
    Stats = M + log Z                  (training: the log-sum-exp the backward needs)
    P = E / Z  [* Bernoulli(1-p) mask * 1/(1-p)]
    O = P @ V

Grouped-query attention is K and V with fewer heads (H_q a multiple of H_k): the engines
take the head counts as they are. The backward recomputes ``P = exp(scale * Q K^T - Stats)``
and needs two float32 tensors of its own: ``softmax_sum = rowsum(dO * O)`` and (unless
deterministic) a float32 ``dQ`` accumulator; the graph keeps both in its workspace.
"""

from __future__ import annotations

import math
from typing import Any

from ..enums import DataType
from ._builder import Graph, Tensor, cudnn_version, like_strides

__all__ = ["backward", "forward"]


def _checks(g: Graph, op: str, q: Any, k: Any, v: Any, seq_q: Any, seq_kv: Any,
            dropout: Any, attn_scale: Any) -> tuple:  # fmt: skip
    q = g._check(op, "q", q)
    k = g._check(op, "k", k)
    v = g._check(op, "v", v)
    for nm, t in (("q", q), ("k", k), ("v", v)):
        if len(t.dim) != 4:
            raise ValueError(f"{g.name}.{op}: {nm} must have 4 dims (B, H, S, D), got {t.dim}")
        if t.stride[3] != 1:
            raise ValueError(f"{g.name}.{op}: {nm}'s last dim (D) must have stride 1, got "
                             f"strides {t.stride}")  # fmt: skip
    b, hq, _sq, d = q.dim
    _, hk, skv, dk = k.dim
    _, hv, skv2, _dv = v.dim
    if k.dim[0] != b or v.dim[0] != b:
        raise ValueError(f"{g.name}.{op}: q, k, v batch sizes differ: {q.dim}, {k.dim}, {v.dim}")
    if dk != d:
        raise ValueError(f"{g.name}.{op}: q and k head dims differ ({d} vs {dk})")
    if skv2 != skv:
        raise ValueError(f"{g.name}.{op}: k and v sequence lengths differ ({skv} vs {skv2})")
    if hq % hk or hq % hv:
        raise ValueError(f"{g.name}.{op}: q's heads ({hq}) must be a multiple of k's ({hk}) "
                         f"and v's ({hv}) (grouped-query attention)")  # fmt: skip
    seq_q = g._check(op, "seq_len_q", seq_q, optional=True)
    seq_kv = g._check(op, "seq_len_kv", seq_kv, optional=True)
    if (seq_q is None) != (seq_kv is None):
        raise ValueError(f"{g.name}.{op}: a padding mask needs both seq_len_q and seq_len_kv")
    for nm, t in (("seq_len_q", seq_q), ("seq_len_kv", seq_kv)):
        if t is not None and t.dim != (b, 1, 1, 1):
            raise ValueError(f"{g.name}.{op}: {nm} must have dims ({b}, 1, 1, 1), got {t.dim}")
    if dropout is not None:
        if not isinstance(dropout, tuple) or len(dropout) != 3:
            raise TypeError(f"{g.name}.{op}: dropout must be (probability, seed, offset)")
        p, seed, offset = dropout
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
            raise ValueError(f"{g.name}.{op}: dropout probability must be in [0, 1), got {p!r}")
        g._check(op, "dropout seed", seed)
        g._check(op, "dropout offset", offset)
        if p == 0.0:
            dropout = None
    if isinstance(attn_scale, Tensor):
        g._check(op, "attn_scale", attn_scale)
        scale = attn_scale
    else:
        if attn_scale is None:
            attn_scale = 1.0 / math.sqrt(d)
        if (
            isinstance(attn_scale, bool)
            or not isinstance(attn_scale, (int, float))
            or not (math.isfinite(attn_scale))
        ):
            raise ValueError(f"{g.name}.{op}: attn_scale must be a finite number, got "
                             f"{attn_scale!r}")  # fmt: skip
        scale = g.scalar(float(attn_scale), name=f"{op}::attn_scale")
    io = q.data_type or g.io_data_type
    return q, k, v, seq_q, seq_kv, dropout, scale, io


def _masks(g: Graph, s: Tensor, seq_q: Tensor | None, seq_kv: Tensor | None, causal: bool,
           neg_inf: Tensor | None, name: str, after_padding: Any = None) -> Tensor:  # fmt: skip
    """The padding mask, then *after_padding(s)* (the backward's Stats subtraction), then the
    causal mask, each as cudnn-frontend orders them."""
    if seq_q is not None:
        row = g.gen_index(s, axis=2, compute_data_type=DataType.INT32, name=f"{name}::pad_row")
        col = g.gen_index(s, axis=3, compute_data_type=DataType.INT32, name=f"{name}::pad_col")
        rm = g.cmp_lt(row, seq_q, compute_data_type=DataType.BOOLEAN, name=f"{name}::lt_row")
        cm = g.cmp_lt(col, seq_kv, compute_data_type=DataType.BOOLEAN, name=f"{name}::lt_col")
        pm = g.logical_and(rm, cm, compute_data_type=DataType.BOOLEAN, name=f"{name}::and")
        s = g.binary_select(s, neg_inf, pm, name=f"{name}::select_padding")
    if after_padding is not None:
        s = after_padding(s)
    if causal:
        row = g.gen_index(s, axis=2, name=f"{name}::row")
        col = g.gen_index(s, axis=3, name=f"{name}::col")
        keep = g.cmp_ge(row, col, compute_data_type=DataType.BOOLEAN, name=f"{name}::causal")
        s = g.binary_select(s, neg_inf, keep, name=f"{name}::select_causal")
    return s


def _rowdim(q: Tensor) -> tuple[int, int, int, int]:
    b, h, sq, _d = q.dim
    return (b, h, sq, 1)


def forward(g: Graph, q: Any, k: Any, v: Any, attn_scale: Any, is_inference: bool,
            causal: bool, seq_q: Any, seq_kv: Any, dropout: Any, name: str
            ) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    q, k, v, seq_q, seq_kv, dropout, scale, io = _checks(g, "sdpa", q, k, v, seq_q, seq_kv,
                                                         dropout, attn_scale)  # fmt: skip
    k._swap_last = True  # bmm1 reads K^T: the same memory with the last two dims swapped
    neg_inf = g.scalar(float("-inf"), name=f"{name}::neg_inf") if (seq_q or causal) else None
    s = g._matmul(q, k, None, None, (seq_q, seq_kv, None), f"{name}::bmm1", groups=True)
    s = g.mul(s, scale, name=f"{name}::attn_scale")
    s = _masks(g, s, seq_q, seq_kv, causal, neg_inf, name)
    rows = _rowdim(q)
    m = g.reduction(s, "max", dim=rows, name=f"{name}::max")
    e = g.exp(g.sub(s, m, name=f"{name}::sub"), name=f"{name}::exp")
    z = g.reduction(e, "add", dim=rows, name=f"{name}::sum")
    stats = g.add(m, g.log(z, name=f"{name}::log"), name=f"{name}::stats")
    p = g.div(e, z, name=f"{name}::p")
    if dropout is not None:
        prob, seed, offset = dropout
        mask = g._rng(p.dim, p, 1.0 - prob, seed, offset, f"{name}::rng")
        p = g.mul(p, mask, name=f"{name}::dropout_mask")
        p = g.mul(p, g.scalar(1.0 / (1.0 - prob), name=f"{name}::dropout_scale"),
                  name=f"{name}::dropout_scale")  # fmt: skip
    if io is not None:
        p.set_data_type(io)
    o = g._matmul(p, v, None, None, (seq_q, None, seq_kv), f"{name}::bmm2", groups=True)
    o._stride = _like(o.dim, q)
    o.set_output(True)
    if io is not None:
        o.set_data_type(io)
    if is_inference:
        return o, None
    stats.set_output(True).set_data_type(DataType.FLOAT)
    return o, stats


def _like(dim: tuple[int, ...], ref: Tensor) -> tuple[int, ...]:
    return like_strides(dim, ref.dim, ref.stride)


def backward(g: Graph, q: Any, k: Any, v: Any, o: Any, do: Any, stats: Any, attn_scale: Any,
             causal: bool, seq_q: Any, seq_kv: Any, dropout: Any, name: str,
             deterministic: bool = False) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    q, k, v, seq_q, seq_kv, dropout, scale, io = _checks(g, "sdpa_backward", q, k, v, seq_q,
                                                         seq_kv, dropout, attn_scale)  # fmt: skip
    o = g._check("sdpa_backward", "o", o)
    do = g._check("sdpa_backward", "dO", do)
    stats = g._check("sdpa_backward", "stats", stats)
    b, hq, sq, d = q.dim
    _, hk, skv, _ = k.dim
    hv, dv = v.dim[1], v.dim[3]
    if sq == 1 and skv == 1:
        raise ValueError(f"{g.name}.sdpa_backward: s_q = s_kv = 1 is not supported by cuDNN")
    if o.dim != (b, hq, sq, dv) or do.dim != o.dim:
        raise ValueError(f"{g.name}.sdpa_backward: o and dO must have dims {(b, hq, sq, dv)}, "
                         f"got {o.dim} and {do.dim}")  # fmt: skip
    if stats.dim != (b, hq, sq, 1):
        raise ValueError(f"{g.name}.sdpa_backward: stats must have dims {(b, hq, sq, 1)}, got "
                         f"{stats.dim}")  # fmt: skip
    k_strides = k.stride
    k._swap_last = True
    v._swap_last = True
    neg_inf = g.scalar(float("-inf"), name=f"{name}::neg_inf") if (seq_q or causal) else None
    mask = None
    if dropout is not None:
        prob, seed, offset = dropout
        mask = g._rng((b, hq, sq, skv), q, 1.0 - prob, seed, offset, f"{name}::rng")
        keep = g.scalar(1.0 - prob, name=f"{name}::dropout_scale_inv")
        dscale = g.scalar(1.0 / (1.0 - prob), name=f"{name}::dropout_scale")
    else:
        keep = g.scalar(1.0, name=f"{name}::one")
    rows = _rowdim(q)
    t = g.mul(do, o, name=f"{name}::dO_O")
    r = g.reduction(t, "add", dim=rows, name=f"{name}::rowsum_dO_O")
    softmax_sum = g.mul(r, keep, name=f"{name}::softmax_sum")
    _to_scratch(softmax_sum, None)
    s = g._matmul(q, k, None, None, (seq_q, seq_kv, None), f"{name}::Q_KT", groups=True)
    s = g.mul(s, scale, name=f"{name}::attn_scale")
    s = _masks(g, s, seq_q, seq_kv, causal, neg_inf, name,
               after_padding=lambda x: g.sub(x, stats, name=f"{name}::sub_stats"))  # fmt: skip
    exp_s = g.exp(s, name=f"{name}::exp_s")
    p = exp_s
    if mask is not None:
        p = g.mul(p, mask, name=f"{name}::p_dropout_mask")
        p = g.mul(p, dscale, name=f"{name}::p_dropout_scale")
    pt_stride = (hq * sq * skv, sq * skv, 1, skv)
    pt = g.reshape(p, (b, hq, skv, sq), pt_stride, data_type=io, name=f"{name}::reshape_p")
    dv_t = _head_sum(g, g._matmul(pt, do, None, None, (seq_kv, None, seq_q),
                                  f"{name}::pT_dO", groups=True), (b, hv, skv, dv), v, io,
                     f"{name}::dV")  # fmt: skip
    dp = g._matmul(do, v, None, None, (seq_q, seq_kv, None), f"{name}::dO_VT", groups=True)
    if mask is not None:
        dp = g.mul(dp, mask, name=f"{name}::dP_dropout_mask")
    dp = g.sub(dp, softmax_sum, name=f"{name}::sub_softmax_sum")
    dp = g.mul(dp, exp_s, name=f"{name}::mul_exp_s")
    if mask is not None:
        dp = g.mul(dp, dscale, name=f"{name}::dS_dropout_scale")
    ds = g.mul(dp, scale, name=f"{name}::dS")
    dst = g.reshape(ds, (b, hq, skv, sq), pt_stride, data_type=io, name=f"{name}::reshape_dS")
    dk_t = _head_sum(g, g._matmul(dst, q, None, None, (seq_kv, None, seq_q),
                                  f"{name}::dST_Q", groups=True), (b, hk, skv, d), k, io,
                     f"{name}::dK")  # fmt: skip
    kv = g.reshape(k, (b, hk, skv, d), k_strides, name=f"{name}::reshape_k")
    dq_acc = g._matmul(ds, kv, None, None, (seq_q, None, seq_kv), f"{name}::dS_K", groups=True)
    if deterministic:
        dq = dq_acc
    else:
        # cuDNN >= 9.6 initialises the accumulator itself (cudnn-frontend zeroes it before)
        _to_scratch(dq_acc, "zero" if cudnn_version() < 90600 else None)
        dq_acc.set_data_type(DataType.FLOAT)
        dq = g.identity(dq_acc, name=f"{name}::dQ")
    dq._stride = _like(dq.dim, q)
    dq.set_output(True)
    if io is not None:
        dq.set_data_type(io)
    return dq, dk_t, dv_t


def _to_scratch(t: Tensor, fill: str | None) -> None:
    """An operation output the graph keeps in its workspace (float32, packed)."""
    from .. import _layout

    t._virtual = False
    t._scratch = fill or "keep"
    t._dtype = DataType.FLOAT
    t._stride = _layout.packed_strides(t.dim)


def _head_sum(g: Graph, full: Tensor, dim: tuple[int, ...], like: Tensor, io: Any, name: str
              ) -> Tensor:  # fmt: skip
    """The gradient of K or V: the matmul's output as is, or (grouped-query) summed over each
    group of query heads."""
    if full.dim != dim:
        if io is not None:
            full.set_data_type(io)
        full = g.reduction(full, "add", dim=dim, name=f"{name}::head_sum")
    full._stride = _like(dim, like)
    full.set_output(True)
    if io is not None:
        full.set_data_type(io)
    return full
