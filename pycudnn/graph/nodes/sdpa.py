"""Scaled dot-product attention as cuDNN's *composite* graphs: the matmul / pointwise /
reduction / RNG pattern that cuDNN's fused flash-attention engines recognise (the graph
cudnn-frontend builds for its ``CompositeSDPANode`` and ``CompositeSDPABackwardNode``; our
notes on it are in ``docs/graph.md``).

Forward::

    S = Q @ K^T                        (K described transposed: same memory, swapped dims)
    S = S * scale
    [+ bias] [+ ALiBi]                 (sdpa_masks.py: the score modifiers)
    [padding: rows >= seq_len_q or cols >= seq_len_kv -> -inf]
    [causal (top left): col > row -> -inf; or the band, either alignment]
    M = max_j S [max sink];  E = exp(S - M);  Z = sum_j E [+ exp(sink - M)]
    Stats = M + log Z                  (training: the log-sum-exp the backward needs)
    P = E / Z  [* Bernoulli(1-p) mask * 1/(1-p)]
    O = P @ V

A paged KV cache (:mod:`.paged`) puts a paged cache load in front of ``Q K^T`` (K) and ``P V``
(V): the matmuls read the gathered ``(B, H_k, max_s_kv, D)`` tensors (forward only).

Grouped-query attention is K and V with fewer heads (H_q a multiple of H_k): the engines
take the head counts as they are. The backward recomputes ``P = exp(scale * Q K^T - Stats)``
and needs two float32 tensors of its own: ``softmax_sum = rowsum(dO * O)`` and (unless
deterministic or with dBias) a float32 ``dQ`` accumulator; the graph keeps both in its workspace.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from ... import errors
from ..._config import parse_bool
from ..._types import dtype_name
from ...enums import DataType
from ...enums import PointwiseMode as P
from .._tensor import GraphBase, Tensor, check_type, finite, like_strides, own_or_io_type
from . import paged as _paged
from . import pointwise, sdpa_masks
from ._base import cudnn_version
from .matmul import matmul
from .reduction import reduction
from .rng_reshape import reshape, rng

__all__ = ["MASK_FIELDS", "SdpaOperations", "SdpaOptions", "backward", "forward"]


class SdpaOptions(NamedTuple):
    """What the forward and the backward share (``Graph.sdpa``'s keyword arguments)."""

    attn_scale: float | Tensor | None = None  #: default ``1 / sqrt(D)``
    use_causal_mask: bool = False
    seq_len_q: Tensor | None = None
    seq_len_kv: Tensor | None = None
    dropout: tuple[float, Tensor, Tensor] | None = None  #: (probability, seed, offset)
    diagonal_alignment: str = "top_left"  #: or "bottom_right" (the band's diagonal)
    left_bound: int | None = None  #: keys kept left of the diagonal (a sliding window)
    right_bound: int | None = None  #: keys kept right of the diagonal (causal: 0)
    bias: Tensor | None = None  #: additive (B|1, H|1, S_q, S_kv)
    alibi_slopes: Tensor | None = None  #: float32 (1, H, 1, 1)
    sink: Tensor | None = None  #: float32 (1, H, 1, 1) sink logits
    paged: tuple | None = None  #: (k table, v table, max_seq_len_kv): a paged cache (forward)


#: the options of the masks and scores (:mod:`.sdpa_masks`), in ``SdpaOptions``' order
MASK_FIELDS = ("diagonal_alignment", "left_bound", "right_bound", "bias", "alibi_slopes", "sink")


def _pw(
    g: GraphBase, mode: P, *inputs: Tensor, name: str, compute: Any = None, **params: Any
) -> Tensor:
    """A pointwise node of *mode* (alphas 1, the graph's compute type unless *compute*)."""
    return pointwise.apply(g, mode, inputs, compute, name=name, params=params)


def _mm(g: GraphBase, a: Tensor, b: Tensor, overrides: tuple, name: str) -> Tensor:
    """A matmul over grouped heads with the M, N, K valid sizes *overrides*."""
    return matmul(g, a, b, overrides=overrides, name=name, groups=True)


def _checks(g: GraphBase, op: str, qkv: tuple, o: SdpaOptions) -> tuple:
    """The checked operands and options: ``(q, k, v, seq_q, seq_kv, dropout, scale, io,
    masks)`` (dropout None at probability 0; the scale a tensor; masks a
    :class:`.sdpa_masks.Masks`)."""
    q = g._check(op, "q", qkv[0])
    k = g._check(op, "k", qkv[1])
    v = g._check(op, "v", qkv[2])
    for nm, t in (("q", q), ("k", k), ("v", v)):
        if len(t.dim) != 4:
            raise ValueError(f"{g.name}.{op}: {nm} must have 4 dims (B, H, S, D), got {t.dim}")
        if t.stride[3] != 1:
            raise ValueError(
                f"{g.name}.{op}: {nm}'s last dim (D) must have stride 1, got strides {t.stride}"
            )
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
        raise ValueError(
            f"{g.name}.{op}: q's heads ({hq}) must be a multiple of k's ({hk}) "
            f"and v's ({hv}) (grouped-query attention)"
        )
    _check_types_and_heads(g, op, (q, k, v))
    seq_q, seq_kv = _seq_lens(g, op, o, b)
    _check_ragged(g, op, (q, k, v), seq_q is not None)
    dropout = _dropout(g, op, o.dropout)
    scale = _scale(g, op, o.attn_scale, d)
    io = own_or_io_type(q)
    causal = parse_bool(o.use_causal_mask, f"{g.name}.{op}", "use_causal_mask")
    masks = sdpa_masks.check_masks(g, op, o, (b, hq, _sq, skv), causal)
    return q, k, v, seq_q, seq_kv, dropout, scale, io, masks


#: the head dims cuDNN's fused attention runs: multiples of 8, at most 256
_HEAD_DIM_MAX = 256


def _check_types_and_heads(g: GraphBase, op: str, qkv: tuple) -> None:
    """q, k and v of one data type (theirs or the graph's io type), and head dims cuDNN's
    attention engines take."""
    types = [own_or_io_type(t) for t in qkv]
    if len({t for t in types if t is not None}) > 1:
        names = ", ".join(
            f"{n} {dtype_name(t) if t is not None else 'unset'}"
            for n, t in zip("qkv", types, strict=True)
        )
        raise TypeError(f"{g.name}.{op}: q, k and v must have one data type, got {names}")
    for nm, size in (("q/k", qkv[0].dim[3]), ("v", qkv[2].dim[3])):
        if size % 8 or size > _HEAD_DIM_MAX:
            raise ValueError(
                f"{g.name}.{op}: {nm}'s head dim (D) is {size}; cuDNN's attention takes "
                f"multiples of 8 up to {_HEAD_DIM_MAX}"
            )


#: cuDNN 9.6 first runs grouped-query heads on ragged (packed) tensors (cudnn-frontend's check)
_RAGGED_GQA_VERSION = 90600


def _check_ragged(g: GraphBase, op: str, qkv: tuple, padded: bool) -> None:
    """Ragged (packed variable-length) q, k or v need the padding mask, whose lengths bound
    each batch's rows, and (grouped-query) cuDNN 9.6; the offsets' own checks are the
    tensors' (:meth:`Tensor.set_ragged_offset`)."""
    ragged = [n for n, t in zip("qkv", qkv, strict=True) if t._ragged is not None]
    if not ragged:
        return
    where = f"{g.name}.{op}"
    if not padded:
        raise errors.NotSupportedError(
            3000,
            where,
            f"ragged offsets on {', '.join(ragged)} (packed sequences) need the padding mask: "
            "give seq_len_q and seq_len_kv (cuDNN bounds each batch's rows by them)",
        )
    if qkv[0].dim[1] != qkv[1].dim[1] and cudnn_version() < _RAGGED_GQA_VERSION:
        what = "grouped-query heads with ragged offsets"
        raise sdpa_masks._unsupported(where, what, _RAGGED_GQA_VERSION)


def _check_index_tensor(g: GraphBase, op: str, nm: str, t: Tensor, dtype: DataType) -> None:
    """An index tensor (lengths, seed, offset) of *dtype*: one without a data type of its own
    would take the graph's io type (float16, say), so it must be declared."""
    check_type(f"{g.name}.{op}", nm, t, (dtype,))


def _seq_lens(g: GraphBase, op: str, o: SdpaOptions, b: int) -> tuple:
    seq_q = g._check(op, "seq_len_q", o.seq_len_q, optional=True)
    seq_kv = g._check(op, "seq_len_kv", o.seq_len_kv, optional=True)
    if (seq_q is None) != (seq_kv is None):
        raise ValueError(f"{g.name}.{op}: a padding mask needs both seq_len_q and seq_len_kv")
    for nm, t in (("seq_len_q", seq_q), ("seq_len_kv", seq_kv)):
        if t is not None and t.dim != (b, 1, 1, 1):
            raise ValueError(f"{g.name}.{op}: {nm} must have dims ({b}, 1, 1, 1), got {t.dim}")
        if t is not None:
            _check_index_tensor(g, op, nm, t, DataType.INT32)
    return seq_q, seq_kv


def _dropout(g: GraphBase, op: str, dropout: Any) -> tuple | None:
    if dropout is None:
        return None
    if not isinstance(dropout, tuple) or len(dropout) != 3:
        raise TypeError(f"{g.name}.{op}: dropout must be (probability, seed, offset)")
    p, seed, offset = dropout
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
        raise ValueError(f"{g.name}.{op}: dropout probability must be in [0, 1), got {p!r}")
    for nm, t in (("dropout seed", seed), ("dropout offset", offset)):
        t = g._check(op, nm, t)
        _check_index_tensor(g, op, nm, t, DataType.INT64)
        if t.dim != (1, 1, 1, 1):
            raise ValueError(f"{g.name}.{op}: {nm} must have dims (1, 1, 1, 1), got {t.dim}")
    return None if p == 0.0 else dropout


def _scale(g: GraphBase, op: str, attn_scale: Any, d: int) -> Tensor:
    if isinstance(attn_scale, Tensor):
        return g._check(op, "attn_scale", attn_scale)
    if attn_scale is None:
        attn_scale = 1.0 / math.sqrt(d)
    scale = finite(attn_scale, f"{g.name}.{op}: attn_scale")
    if abs(scale) > _F32_MAX:
        raise ValueError(f"{g.name}.{op}: attn_scale={attn_scale!r} does not fit in float32")
    return g._constant(scale, DataType.FLOAT, f"{op}::attn_scale")


_F32_MAX = 3.4028234663852886e38  # the attention's scale is a float32 constant


def _masks(
    g: GraphBase,
    s: Tensor,
    seq_lens: tuple[Tensor | None, Tensor | None],
    masks: sdpa_masks.Masks,
    neg_inf: Tensor | None,
    name: str,
    after_padding: Any = None,
) -> Tensor:
    """The bias and ALiBi, the padding mask, then *after_padding(s)* (the backward's Stats
    subtraction), then the causal mask or the band, each as cudnn-frontend orders them."""
    seq_q, seq_kv = seq_lens
    i32, b8 = DataType.INT32, DataType.BOOLEAN

    def padding(s: Tensor) -> Tensor:
        if seq_q is None:
            return s
        row = _pw(g, P.GEN_INDEX, s, axis=2, compute=i32, name=f"{name}::pad_row")
        col = _pw(g, P.GEN_INDEX, s, axis=3, compute=i32, name=f"{name}::pad_col")
        rm = _pw(g, P.CMP_LT, row, seq_q, compute=b8, name=f"{name}::lt_row")
        cm = _pw(g, P.CMP_LT, col, seq_kv, compute=b8, name=f"{name}::lt_col")
        pm = _pw(g, P.LOGICAL_AND, rm, cm, compute=b8, name=f"{name}::and")
        return _pw(g, P.BINARY_SELECT, s, neg_inf, pm, name=f"{name}::select_padding")

    s = sdpa_masks.apply_scores(g, s, masks, seq_lens, padding, after_padding, name)
    if masks.plain_causal:  # today's graph for torch's is_causal
        row = _pw(g, P.GEN_INDEX, s, axis=2, name=f"{name}::row")
        col = _pw(g, P.GEN_INDEX, s, axis=3, name=f"{name}::col")
        keep = _pw(g, P.CMP_GE, row, col, compute=b8, name=f"{name}::causal")
        s = _pw(g, P.BINARY_SELECT, s, neg_inf, keep, name=f"{name}::select_causal")
    elif sdpa_masks.needs_band(masks):
        s = sdpa_masks.band(g, s, masks, seq_lens, neg_inf, name)
    return s


def _rowdim(q: Tensor) -> tuple[int, int, int, int]:
    b, h, sq, _d = q.dim
    return (b, h, sq, 1)


def _neg_inf(
    g: GraphBase, seq_q: Tensor | None, masks: sdpa_masks.Masks, name: str
) -> Tensor | None:
    """The -inf a mask selects, when there is a mask."""
    if seq_q is None and masks.right_bound is None and masks.left_bound is None:
        return None
    return g._constant(float("-inf"), DataType.FLOAT, f"{name}::neg_inf")


def forward(
    g: GraphBase, qkv: tuple, o: SdpaOptions, is_inference: bool, name: str
) -> tuple[Tensor, Tensor | None]:
    """``(o, stats)`` of attention over ``qkv = (q, k, v)``: stats (the log-sum-exp) only in
    training."""
    qkv, loads = _paged.prepare(g, "sdpa", qkv, o, name)
    q, k, v, seq_q, seq_kv, dropout, scale, io, masks = _checks(g, "sdpa", qkv, o)
    is_inference = parse_bool(is_inference, f"{g.name}.sdpa", "is_inference")
    # bmm1 reads K^T: the same memory with the last two dims swapped (the graph records it;
    # the tensor k is left as declared)
    with g._reading_transposed("sdpa", name, {"k": k}, _operands(o, q=q, v=v)):
        return _forward(
            g, (q, k, v), (seq_q, seq_kv, dropout, scale, io, masks), loads, is_inference, name
        )


def _operands(opts: SdpaOptions, /, **given: Tensor) -> dict[str, Tensor | None]:
    """The attention's operands other than those it reads transposed, by argument name."""
    out: dict[str, Tensor | None] = dict(given)
    for nm in ("seq_len_q", "seq_len_kv", "bias", "alibi_slopes", "sink", "attn_scale"):
        t = getattr(opts, nm)
        if isinstance(t, Tensor):
            out[nm] = t
    if opts.dropout is not None and len(opts.dropout) == 3:
        out["dropout seed"], out["dropout offset"] = opts.dropout[1], opts.dropout[2]
    for nm, t in zip(
        ("paged_attention_k_table", "paged_attention_v_table"), (opts.paged or ())[:2], strict=False
    ):
        if isinstance(t, Tensor):
            out[nm] = t
    return out


def _forward(
    g: GraphBase, qkv: tuple, checked: tuple, loads: tuple, is_inference: bool, name: str
) -> tuple[Tensor, Tensor | None]:
    q, k, v = qkv
    seq_q, seq_kv, dropout, scale, io, masks = checked
    _paged.record(g, loads, seq_kv)
    neg_inf = _neg_inf(g, seq_q, masks, name)
    s = _mm(g, q, k, (seq_q, seq_kv, None), f"{name}::bmm1")
    s = _pw(g, P.MUL, s, scale, name=f"{name}::attn_scale")
    s = _masks(g, s, (seq_q, seq_kv), masks, neg_inf, name)
    e, z, stats = sdpa_masks.softmax(g, s, _rowdim(q), masks.sink, name)
    p = _pw(g, P.DIV, e, z, name=f"{name}::p")
    if dropout is not None:
        prob, seed, offset = dropout
        mask = rng(g, p.dim, p, 1.0 - prob, (seed, offset), f"{name}::rng")
        p = _pw(g, P.MUL, p, mask, name=f"{name}::dropout_mask")
        inv_keep = g._constant(1.0 / (1.0 - prob), DataType.FLOAT, f"{name}::dropout_scale")
        p = _pw(g, P.MUL, p, inv_keep, name=f"{name}::dropout_scale")
    if io is not None:
        p.set_data_type(io)
    out = _mm(g, p, v, (seq_q, None, seq_kv), f"{name}::bmm2")
    out._stride = like_strides(out.dim, q.dim, q.stride)
    out.set_output(True)
    if io is not None:
        out.set_data_type(io)
    if is_inference:
        return out, None
    stats.set_output(True).set_data_type(DataType.FLOAT)
    return out, stats


def _check_backward(g: GraphBase, q: Tensor, k: Tensor, v: Tensor, saved: tuple) -> tuple:
    """The forward's ``saved = (o, dO, stats)``, checked against q, k, v."""
    op = "sdpa_backward"
    o = g._check(op, "o", saved[0])
    do = g._check(op, "dO", saved[1])
    stats = g._check(op, "stats", saved[2])
    b, hq, sq, _d = q.dim
    skv, dv = k.dim[2], v.dim[3]
    if sq == 1 and skv == 1:
        raise ValueError(f"{g.name}.sdpa_backward: s_q = s_kv = 1 is not supported by cuDNN")
    if o.dim != (b, hq, sq, dv) or do.dim != o.dim:
        raise ValueError(
            f"{g.name}.sdpa_backward: o and dO must have dims {(b, hq, sq, dv)}, "
            f"got {o.dim} and {do.dim}"
        )
    if stats.dim != (b, hq, sq, 1):
        raise ValueError(
            f"{g.name}.sdpa_backward: stats must have dims {(b, hq, sq, 1)}, got {stats.dim}"
        )
    return o, do, stats


def backward(
    g: GraphBase,
    qkv: tuple,
    saved: tuple,
    o: SdpaOptions,
    name: str,
    deterministic: bool = False,
    want: tuple = (False, False),
) -> tuple[Tensor, ...]:
    """``(dq, dk, dv[, dbias][, dsink])`` of attention over ``qkv = (q, k, v)`` from the
    forward's ``saved = (o, dO, stats)``; *deterministic* (and dbias) writes dQ directly instead
    of through a float32 accumulator; *want*: ``(dbias, dsink)`` asked for (dsink refused until
    verified on the GPU: :data:`.sdpa_masks.DSINK_VERIFIED`)."""
    q, k, v, seq_q, seq_kv, dropout, scale, io, masks = _checks(g, "sdpa_backward", qkv, o)
    out, do, stats = _check_backward(g, q, k, v, saved)
    where = f"{g.name}.sdpa_backward"
    grads = _grad_flags(where, masks, want)
    dims = (q.dim[0], q.dim[1], q.dim[2], k.dim[2])
    sdpa_masks.check_backward(where, masks, dims, seq_q is not None, dropout is not None)
    deterministic = parse_bool(deterministic, where, "use_deterministic_algorithm")
    others = _operands(o, q=q, o=out, dO=do, stats=stats)
    with g._reading_transposed("sdpa_backward", name, {"k": k, "v": v}, others):
        return _backward(
            g,
            (q, k, v, out, do, stats),
            (seq_q, seq_kv, dropout, scale, io, masks),
            (grads, deterministic, where),
            name,
        )


def _backward(
    g: GraphBase, operands: tuple, checked: tuple, flags: tuple, name: str
) -> tuple[Tensor, ...]:
    q, k, v, out, do, stats = operands
    seq_q, seq_kv, dropout, scale, io, masks = checked
    grads, deterministic, where = flags
    b, hq, sq, d = q.dim
    _, hk, skv, _ = k.dim
    hv, dv = v.dim[1], v.dim[3]
    k_strides = k.stride
    neg_inf = _neg_inf(g, seq_q, masks, name)
    mask = None
    if dropout is not None:
        prob, seed, offset = dropout
        mask = rng(g, (b, hq, sq, skv), q, 1.0 - prob, (seed, offset), f"{name}::rng")
        keep = g._constant(1.0 - prob, DataType.FLOAT, f"{name}::dropout_scale_inv")
        dscale = g._constant(1.0 / (1.0 - prob), DataType.FLOAT, f"{name}::dropout_scale")
    else:
        keep = g._constant(1.0, DataType.FLOAT, f"{name}::one")
    rows = _rowdim(q)
    t = _pw(g, P.MUL, do, out, name=f"{name}::dO_O")
    r = reduction(g, t, "add", rows, name=f"{name}::rowsum_dO_O")
    dsink = None
    if grads[1]:
        dsink = sdpa_masks.dsink_of(g, masks.sink, stats, r, name)
    softmax_sum = _pw(g, P.MUL, r, keep, name=f"{name}::softmax_sum")
    g._to_scratch(softmax_sum, DataType.FLOAT, None)
    s = _mm(g, q, k, (seq_q, seq_kv, None), f"{name}::Q_KT")
    s = _pw(g, P.MUL, s, scale, name=f"{name}::attn_scale")

    def sub_stats(x: Tensor) -> Tensor:
        return _pw(g, P.SUB, x, stats, name=f"{name}::sub_stats")

    s = _masks(g, s, (seq_q, seq_kv), masks, neg_inf, name, after_padding=sub_stats)
    exp_s = _pw(g, P.EXP, s, name=f"{name}::exp_s")
    p = exp_s
    if mask is not None:
        p = _pw(g, P.MUL, p, mask, name=f"{name}::p_dropout_mask")
        p = _pw(g, P.MUL, p, dscale, name=f"{name}::p_dropout_scale")
    pt_stride = (hq * sq * skv, sq * skv, 1, skv)
    pt = reshape(g, p, (b, hq, skv, sq), pt_stride, io, f"{name}::reshape_p")
    dv_full = _mm(g, pt, do, (seq_kv, None, seq_q), f"{name}::pT_dO")
    dv_t = _head_sum(g, dv_full, (b, hv, skv, dv), v, io, f"{name}::dV")
    dp = _mm(g, do, v, (seq_q, seq_kv, None), f"{name}::dO_VT")
    if mask is not None:
        dp = _pw(g, P.MUL, dp, mask, name=f"{name}::dP_dropout_mask")
    dp = _pw(g, P.SUB, dp, softmax_sum, name=f"{name}::sub_softmax_sum")
    dp = _pw(g, P.MUL, dp, exp_s, name=f"{name}::mul_exp_s")
    if mask is not None:
        dp = _pw(g, P.MUL, dp, dscale, name=f"{name}::dS_dropout_scale")
    dbias = None
    if grads[0]:
        dbias = sdpa_masks.dbias_of(g, dp, masks.bias, io, where, name)
    ds = _pw(g, P.MUL, dp, scale, name=f"{name}::dS")
    dst = reshape(g, ds, (b, hq, skv, sq), pt_stride, io, f"{name}::reshape_dS")
    dk_full = _mm(g, dst, q, (seq_kv, None, seq_q), f"{name}::dST_Q")
    dk_t = _head_sum(g, dk_full, (b, hk, skv, d), k, io, f"{name}::dK")
    kv = reshape(g, k, (b, hk, skv, d), k_strides, name=f"{name}::reshape_k")
    kv._ragged = k._ragged  # the same rows (cudnn-frontend gives the view K's offsets)
    dq_acc = _mm(g, ds, kv, (seq_q, None, seq_kv), f"{name}::dS_K")
    if deterministic or dbias is not None:
        # dQ written directly (cuDNN's dP-workspace kernels): cudnn-frontend forces this form
        # with dBias, which the float32-accumulator kernels leave unwritten (zeros on the GPU)
        dq = dq_acc
    else:
        # cuDNN >= 9.6 initialises the accumulator itself (cudnn-frontend zeroes it before)
        g._to_scratch(dq_acc, DataType.FLOAT, "zero" if cudnn_version() < 90600 else None)
        dq_acc.set_data_type(DataType.FLOAT)
        dq = _pw(g, P.IDENTITY, dq_acc, name=f"{name}::dQ")
    dq._stride = like_strides(dq.dim, q.dim, q.stride)
    dq.set_output(True)
    if io is not None:
        dq.set_data_type(io)
    return (dq, dk_t, dv_t, *(t for t in (dbias, dsink) if t is not None))


def _grad_flags(where: str, masks: sdpa_masks.Masks, want: tuple) -> tuple[bool, bool]:
    """``(dbias, dsink)`` asked for (strict booleans), each needing its input."""
    flags = []
    for nm, on, given in (("dbias", want[0], masks.bias), ("dsink", want[1], masks.sink)):
        on = parse_bool(on, where, nm)
        if on and given is None:
            src = "bias" if nm == "dbias" else "sink"
            raise ValueError(f"{where}: {nm}=True needs a {src} tensor")
        flags.append(on)
    if flags[1] and not sdpa_masks.DSINK_VERIFIED:
        raise errors.NotSupportedError(
            3000,
            where,
            "dsink=True: the sink's gradient is not yet verified on cuDNN 9.19 (the GPU tests "
            "read it back unwritten); pass dsink=False (the sink still shapes dq, dk and dv)",
        )
    return flags[0], flags[1]


def _head_sum(
    g: GraphBase, full: Tensor, dim: tuple[int, ...], like: Tensor, io: Any, name: str
) -> Tensor:
    """The gradient of K or V: the matmul's output as is, or (grouped-query) summed over each
    group of query heads."""
    if full.dim != dim:
        if io is not None:
            full.set_data_type(io)
        full = reduction(g, full, "add", dim, name=f"{name}::head_sum")
    full._stride = like_strides(dim, like.dim, like.stride)
    full.set_output(True)
    if io is not None:
        full.set_data_type(io)
    return full


class SdpaOperations(GraphBase):
    """The graph's attention methods (a base of :class:`~pycudnn.graph.Graph`)."""

    def sdpa(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        attn_scale: float | Tensor | None = None,
        is_inference: bool = True,
        use_causal_mask: bool = False,
        seq_len_q: Tensor | None = None,
        seq_len_kv: Tensor | None = None,
        dropout: tuple[float, Tensor, Tensor] | None = None,
        diagonal_alignment: str = "top_left",
        left_bound: int | None = None,
        right_bound: int | None = None,
        bias: Tensor | None = None,
        alibi_slopes: Tensor | None = None,
        sink: Tensor | None = None,
        paged_attention_k_table: Tensor | None = None,
        paged_attention_v_table: Tensor | None = None,
        paged_attention_max_seq_len_kv: int | None = None,
        name: str | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Scaled dot-product attention ``softmax(scale * q k^T + mask) v``: q (B, H, S_q, D),
        k (B, H_k, S_kv, D), v (B, H_k, S_kv, D_v), H a multiple of H_k, any strides. Returns
        ``(o, stats)``; *stats* float32 (B, H, S_q, 1) log-sum-exp, only in training. Options
        (``docs/graph.md``): int32 (B, 1, 1, 1) *seq_len_q*/*seq_len_kv* (padding); *dropout*
        ``(probability, seed, offset)``, int64 (1, 1, 1, 1) seed and offset; the diagonal's
        alignment and the band's bounds (causal: ``right_bound=0``; a sliding window:
        *left_bound*); an additive (B|1, H|1, S_q, S_kv) *bias*; float32 (1, H, 1, 1)
        *alibi_slopes* and *sink* logits; a paged KV cache (k/v (num_blocks, H_k, block_size,
        D) read through int32 page tables)."""
        o = SdpaOptions(attn_scale, use_causal_mask, seq_len_q, seq_len_kv, dropout)
        masks = (diagonal_alignment, left_bound, right_bound, bias, alibi_slopes, sink)
        o = o._replace(**dict(zip(MASK_FIELDS, masks, strict=True)))
        tables = (paged_attention_k_table, paged_attention_v_table)
        o = o._replace(paged=(*tables, paged_attention_max_seq_len_kv))
        return forward(self, (q, k, v), o, is_inference, name or "sdpa")

    def sdpa_backward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        o: Tensor,
        dO: Tensor,
        stats: Tensor,
        *,
        attn_scale: float | Tensor | None = None,
        use_causal_mask: bool = False,
        seq_len_q: Tensor | None = None,
        seq_len_kv: Tensor | None = None,
        dropout: tuple[float, Tensor, Tensor] | None = None,
        use_deterministic_algorithm: bool = False,
        diagonal_alignment: str = "top_left",
        left_bound: int | None = None,
        right_bound: int | None = None,
        bias: Tensor | None = None,
        alibi_slopes: Tensor | None = None,
        sink: Tensor | None = None,
        dbias: bool = False,
        dsink: bool = False,
        name: str | None = None,
    ) -> tuple[Tensor, ...]:
        """Gradients ``(dq, dk, dv)`` of :meth:`sdpa` from its output, its statistics and the
        output's gradient *dO* (the same options as the forward), then ``dbias`` when *dbias*
        (a (1, H, S_q, S_kv) bias only) and ``dsink`` (float32 (1, H, 1, 1)) when *dsink*.
        The default form accumulates dQ in a float32 tensor the graph keeps in its workspace;
        ``use_deterministic_algorithm=True`` writes dQ directly (cuDNN's deterministic form)."""
        opts = SdpaOptions(attn_scale, use_causal_mask, seq_len_q, seq_len_kv, dropout)
        masks = (diagonal_alignment, left_bound, right_bound, bias, alibi_slopes, sink)
        opts = opts._replace(**dict(zip(MASK_FIELDS, masks, strict=True)))
        det = use_deterministic_algorithm
        saved = (o, dO, stats)
        name = name or "sdpa_backward"
        return backward(self, (q, k, v), saved, opts, name, det, (dbias, dsink))
