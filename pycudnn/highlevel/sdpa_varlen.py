"""Attention over packed variable-length sequences (the "THD" layout): ``dnn_sdpa_varlen`` and
its gradient ``dnn_sdpa_varlen_grad``, as flash-attn's ``flash_attn_varlen_func`` and torch's
``varlen_attn`` take them, on cuDNN's ragged offsets (:meth:`pycudnn.graph.Tensor.
set_ragged_offset`).

Layout: the sequences of a batch are concatenated token after token, with no padding between
them: q ``(total_q, H, D)``, k ``(total_kv, H_k, D)``, v ``(total_kv, H_k, D_v)``, and
``cu_seqlens_q``/``cu_seqlens_kv`` the ``B + 1`` cumulative lengths (``[0, s_0, s_0 + s_1,
...]``). The graph sees each operand as ``(B, H, max_seqlen, D)`` with the token stride as the
sequence stride; cuDNN finds batch ``b``'s first row at the element offset ``cu_seqlens[b] *
token stride`` (one offset array per distinct token stride) and bounds its rows by the lengths
``cu_seqlens[b + 1] - cu_seqlens[b]`` (the padding mask, which cuDNN requires with ragged
offsets). The softmax statistics are float32 ``(total_q, H, 1)``, packed like q.

The cumulative lengths are checked on the host before any C call (they decide where cuDNN reads
and writes): a host sequence or NumPy array is read as is; a device array is copied to the host
first -- a small copy that **synchronises** the call's stream. The lengths and offsets the graph
reads are uploaded once per distinct content (cached), so a training loop that repeats its
batch shapes uploads nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np

from .. import _layout, errors
from .._config import parse_bool
from .._types import dtype_name
from ..enums import DataType
from ..graph import Graph
from ..graph._tensor import alignment_of
from . import _call, _checks, _operand, _sdpa_operands
from . import _cu_seqlens as _cu
from . import sdpa as _sdpa

if TYPE_CHECKING:
    from ..memory import DeviceArray
    from ..typing import DeviceArrayLike, StreamLike
    from ._annotations import Out

    #: cumulative lengths: host ints (a list, a NumPy array) or an int32 device array
    CuSeqlens = Sequence[int] | DeviceArrayLike

__all__ = ["dnn_sdpa_varlen", "dnn_sdpa_varlen_grad"]

#: packed attention needs Hopper (sm90) before cuDNN 9.18.1 (cudnn-frontend's check)
_THD_ANY_GPU_VERSION = 91801


# ==================================================================================================
# Operands
# ==================================================================================================
def _packed(func: str, named: Sequence[tuple[str, Any]]) -> tuple:
    """The packed ``(tokens, heads, head dim)`` operands checked: ``(operands, dtype,
    device)``."""
    gs = [_operand.operand(x) for _n, x in named]
    dt, device = _checks.same_dtype_and_device(
        func, list(zip((n for n, _x in named), gs, strict=True)), _sdpa._ALL
    )
    if dt not in _sdpa._TYPES:
        raise errors.NotSupportedError(
            3000,
            func,
            f"cuDNN's fused attention runs float16 and bfloat16 only, got {dtype_name(dt)}",
        )
    for (name, _x), g in zip(named, gs, strict=True):
        if len(g.shape) != 3 or 0 in g.shape:
            raise ValueError(
                f"{func}: {name} must have 3 non-empty dims (total tokens, heads, head dim), "
                f"got shape {tuple(g.shape)}"
            )
        _checks.check_strides(func, name, g)
        if g.strides[2] != 1 and g.shape[2] > 1:
            raise ValueError(
                f"{func}: {name}'s head dim must be contiguous (stride 1), got strides "
                f"{tuple(g.strides)}"
            )
        if not _layout.non_overlapping(g.shape, g.strides):
            raise ValueError(
                f"{func}: {name}'s strides {tuple(g.strides)} make tokens or heads overlap"
            )
    return gs, dt, device


def _qkv(func: str, q: Any, k: Any, v: Any) -> tuple:
    """q, k, v checked: ``(gq, gk, gv, dtype, device)``."""
    (gq, gk, gv), dt, device = _packed(func, (("q", q), ("k", k), ("v", v)))
    _tq, hq, d = gq.shape
    tk, hk, dk = gk.shape
    tv, hv, dv = gv.shape
    if tv != tk or hv != hk:
        raise ValueError(
            f"{func}: k {tuple(gk.shape)} and v {tuple(gv.shape)} must have the same tokens "
            "and heads"
        )
    _sdpa_operands.check_heads(func, (d, dk, dv), (hq, hk))
    cap = _sdpa_operands.check_gpu(func, device)
    if cap is not None and cap < (9, 0) and _call.cudnn_version() < _THD_ANY_GPU_VERSION:
        raise errors.NotSupportedError(
            3000,
            func,
            f"packed variable-length attention (ragged offsets) needs an sm90 (Hopper) or "
            f"newer GPU with cuDNN {_call.cudnn_version()}, or cuDNN 9.18.1 or newer; device "
            f"{device} is sm{cap[0]}{cap[1]}",
        )
    return gq, gk, gv, dt, device


def _shapes(func: str, named: Sequence[tuple[str, tuple]]) -> list[tuple[int, ...]]:
    """The shapes of packed operands from their call keys, each 3-D (the full checks come
    with the build)."""
    out = []
    for name, k in named:
        if len(k[0]) != 3:
            raise ValueError(
                f"{func}: {name} must have 3 dims (total tokens, heads, head dim), got shape "
                f"{tuple(k[0])}"
            )
        out.append(tuple(k[0]))
    return out


def _token_strides(keys: Sequence[tuple], sides: Sequence[int]) -> tuple:
    """``(side, token stride)`` of each ragged operand, in order, as its key says."""
    return tuple((side, int(k[1][0])) for k, side in zip(keys, sides, strict=True))


def _distinct(roles: tuple) -> tuple:
    """The distinct ``(side, token stride)`` pairs of *roles*, in first-seen order."""
    return tuple(dict.fromkeys(roles))


class _Ragged:
    """What the graph of a packed call declares: the (B, H, S, D) view of each packed
    operand, the sequence lengths and one offset tensor per distinct token stride."""

    def __init__(self, g: Graph, b: int, maxes: tuple[int, int], pairs: tuple, odt: DataType):
        self.g, self.b, self.maxes, self.pairs = g, b, maxes, pairs
        self.lens = [
            g.tensor((b, 1, 1, 1), (1, 1, 1, 1), DataType.INT32, name=f"seq_len_{s}")
            for s in ("q", "kv")
        ]
        self.offsets = [
            g.tensor((b + 1, 1, 1, 1), (1, 1, 1, 1), odt, name=f"offsets{i}")
            for i in range(len(pairs))
        ]

    def view(self, name: str, side: int, shape: tuple, strides: tuple, dt: Any, ptr: int) -> Any:
        """A packed ``(T, H, D)`` operand of token/head strides *strides* as a graph input."""
        t = self.g.tensor(
            self.dims(side, shape), self.strides(side, strides), dt, name=name
        ).set_alignment(alignment_of(ptr))
        return self.ragged(t, side, strides[0])

    def dims(self, side: int, shape: tuple) -> tuple[int, int, int, int]:
        return (self.b, shape[1], self.maxes[side], shape[2])

    def strides(self, side: int, strides: tuple) -> tuple[int, int, int, int]:
        st, sh = strides[0], strides[1]
        return (self.maxes[side] * st, max(sh, 1), st, 1)

    def ragged(self, t: Any, side: int, token_stride: int) -> Any:
        return t.set_ragged_offset(self.offsets[self.pairs.index((side, token_stride))])

    def inputs(self) -> list:
        return [*self.lens, *self.offsets]

    def spans(self, odt: DataType) -> list[int]:
        isz = 4 if odt == DataType.INT32 else 8
        return [self.b * 4, self.b * 4, *((self.b + 1) * isz for _ in self.offsets)]


def _odt(pairs: tuple, totals: tuple[int, int]) -> DataType:
    return DataType.INT32 if _cu.offsets_dtype(pairs, totals) is np.int32 else DataType.INT64


def _options(func: str, is_causal: Any, scale: Any, d: int) -> tuple[bool, float]:
    causal = parse_bool(is_causal, func, "is_causal")
    sc = 1.0 / math.sqrt(d) if scale is None else _checks.real(scale, "scale", func)
    return causal, sc


def _seed_pair(g: Graph, p: float, b: int) -> tuple:
    """``(dropout, inputs, spans)``: the graph's ``dropout=`` argument and the seed pair's
    inputs (none without dropout), as :func:`.sdpa.dnn_sdpa` declares them."""
    _sq, _skv, dropout, inputs, spans = _sdpa._declare_common(g, None, None, p, b, _sdpa._NO_MASKS)
    return dropout, inputs, spans


# ==================================================================================================
# Forward
# ==================================================================================================
@overload
def dnn_sdpa_varlen(
    q: DeviceArrayLike,
    k: DeviceArrayLike,
    v: DeviceArrayLike,
    cu_seqlens_q: CuSeqlens,
    cu_seqlens_kv: CuSeqlens,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    is_causal: bool = ...,
    scale: float | None = ...,
    dropout_p: float = ...,
    seed: int | None = ...,
    training: Literal[False] = ...,
    *,
    out: Out | None = ...,
    stream: StreamLike = ...,
) -> Out: ...
@overload
def dnn_sdpa_varlen(
    q: DeviceArrayLike,
    k: DeviceArrayLike,
    v: DeviceArrayLike,
    cu_seqlens_q: CuSeqlens,
    cu_seqlens_kv: CuSeqlens,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    is_causal: bool = ...,
    scale: float | None = ...,
    dropout_p: float = ...,
    seed: int | None = ...,
    training: Literal[True] = ...,
    *,
    out: Out | None = ...,
    stream: StreamLike = ...,
) -> tuple[Out, DeviceArray]: ...
@overload
def dnn_sdpa_varlen(
    q: DeviceArrayLike,
    k: DeviceArrayLike,
    v: DeviceArrayLike,
    cu_seqlens_q: CuSeqlens,
    cu_seqlens_kv: CuSeqlens,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    is_causal: bool = ...,
    scale: float | None = ...,
    dropout_p: float = ...,
    seed: int | None = ...,
    training: bool = ...,
    *,
    out: Out | None = ...,
    stream: StreamLike = ...,
) -> Out | tuple[Out, DeviceArray]: ...
def dnn_sdpa_varlen(
    q: DeviceArrayLike,
    k: DeviceArrayLike,
    v: DeviceArrayLike,
    cu_seqlens_q: CuSeqlens,
    cu_seqlens_kv: CuSeqlens,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    seed: int | None = None,
    training: bool = False,
    *,
    out: Out | None = None,
    stream: StreamLike = None,
) -> Any:
    """Attention over packed variable-length sequences (the "THD" layout of flash-attn's
    ``flash_attn_varlen_func``), on cuDNN's fused flash-attention engines.

    Parameters
    ----------
    q, k, v : device array
        ``(total_q, H, D)``, ``(total_kv, H_k, D)``, ``(total_kv, H_k, D_v)``: the sequences
        concatenated along the first dim; float16 or bfloat16; ``H`` a multiple of ``H_k``
        (grouped-query); D and D_v multiples of 8, at most 256; the head dim contiguous (any
        token and head strides: a slice of a packed qkv array is taken as is).
    cu_seqlens_q, cu_seqlens_kv : sequence of int, NumPy array or int32 device array
        ``(B + 1,)`` cumulative lengths ``[0, s_0, s_0 + s_1, ..., total]``; every sequence has
        at least one token. A device array is read back to the host to be checked (a small
        copy that synchronises the stream).
    max_seqlen_q, max_seqlen_kv : int
        At least the longest sequence (part of the plan: keep them fixed, e.g. the batch's
        bucket, so that one plan serves many batches).
    is_causal : bool
        Mask the keys after each query, within each sequence, top-left aligned (as ``torch``'s
        ``is_causal``; the same as flash-attn's bottom-right causal when each sequence's q
        and kv lengths are equal).
    scale : float, optional
        Default ``1 / sqrt(D)``.
    dropout_p : float
        Probability of zeroing an attention weight, in [0, 1).
    seed : int, optional
        Dropout's Philox seed (default random); pass the same to
        :func:`dnn_sdpa_varlen_grad`.
    training : bool
        Also return the softmax statistics the backward needs.
    out : device array, optional
        ``(total_q, H, D_v)``, q's dtype, head dim contiguous.
    stream : optional
        CUDA stream; default the operands' framework's current stream (torch, CuPy), else the
        handle's stream.

    Returns
    -------
    out, or (out, stats) when *training*
        ``out`` ``(total_q, H, D_v)``, packed; ``stats`` float32 ``(total_q, H, 1)``, each
        query row's log-sum-exp (natural log), packed like q's tokens.

    Raises
    ------
    NotSupportedError
        float32/float64 data, head dims not multiples of 8 or over 256, a GPU older than sm90
        before cuDNN 9.18.1, grouped-query heads before cuDNN 9.6, or no engine in the loaded
        cuDNN for the case.
    TypeError, ValueError
        Bad operands or options, cumulative lengths that do not start at 0, do not increase,
        do not end at the total tokens, or hold a sequence longer than its maximum (before any
        C call).

    Examples
    --------
    >>> cu = [0, 5, 12]  # two sequences of 5 and 7 tokens; q, k, v (12, H, D)
    >>> o = pycudnn.dnn_sdpa_varlen(q, k, v, cu, cu, 7, 7, is_causal=True)
    """
    if stream is None:
        stream = _operand.producer_stream(q)
    func = "dnn_sdpa_varlen"
    keys = [_operand.key_of(a) for a in (q, k, v)]
    po, ko = (None, None) if out is None else _operand.key_of(out)
    maxes = (
        _cu.max_len(func, "max_seqlen_q", max_seqlen_q),
        _cu.max_len(func, "max_seqlen_kv", max_seqlen_kv),
    )
    sq, sk, sv = _shapes(func, (("q", keys[0][1]), ("k", keys[1][1]), ("v", keys[2][1])))
    totals = (sq[0], sk[0])
    pk = _cu.packing(func, (cu_seqlens_q, cu_seqlens_kv), totals, maxes, (keys[0][1][3], stream))
    is_causal = parse_bool(is_causal, func, "is_causal")
    training = parse_bool(training, func, "training")
    dropout_p = _sdpa._probability(func, dropout_p)
    seedv = _sdpa._seed(func, seed, dropout_p)
    # out's token stride, or that of the packed (total_q, H, D_v) output allocated here
    o_stride = ko[1][0] if ko is not None and len(ko[1]) == 3 else sq[1] * sv[2]
    roles = (*_token_strides([kk for _p, kk in keys], (0, 1, 1)), (0, int(o_stride)))
    if training:
        roles += ((0, sq[1]),)  # the statistics (total_q, H, 1): H elements a token
    b = len(pk.cu_q) - 1
    key = (
        func,
        *(kk for _p, kk in keys),
        ko,
        b,
        maxes,
        is_causal,
        scale,
        scale.__class__,
        dropout_p,
        training,
        _call.snapshot(),
    )
    args = ((q, k, v), (is_causal, scale, dropout_p), (b, maxes, roles, totals), training, out)
    if _call.cached_entry(key) is None:  # a new case: its checks come before the upload
        device = _check_forward(*args)[4]
        _checks.check_stream(func, stream, device)
    ptrs = (*(p for p, _k in keys), *_cu.upload(pk, _distinct(roles), keys[0][1][3], stream))
    outs, pos = ((out, None), (po, None)) if training else ((out,), (po,))
    if seedv is None:
        result = _call.run_cached(key, _build_forward, (*args, stream), ptrs, outs, pos, stream)
    else:
        build_args = (*args, stream)
        result = _sdpa._run_seeded(seedv, key, _build_forward, build_args, ptrs, outs, pos, stream)
    return (result[0], result[1]) if training else result[0]


def _out_operand(func: str, out: Any, shape: tuple, dt: DataType, device: int) -> Any:
    """A given packed output: its shape, dtype, device, a contiguous head dim, no overlap."""
    go = _checks.out_operand(func, out, shape, dt, device)
    if go.strides[2] != 1 and shape[2] > 1:
        raise ValueError(
            f"{func}: out's head dim must be contiguous (stride 1), got strides {tuple(go.strides)}"
        )
    return go


def _check_forward(operands, options, packed, training, out) -> tuple:
    """The forward's checks (no C call): ``(gq, gk, gv, dtype, device, causal, scale,
    out)``."""
    del packed, training
    func = "dnn_sdpa_varlen"
    gq, gk, gv, dt, device = _qkv(func, *operands)
    causal, sc = _options(func, options[0], options[1], gq.shape[2])
    oshape = (gq.shape[0], gq.shape[1], gv.shape[2])
    go = None if out is None else _out_operand(func, out, oshape, dt, device)
    return gq, gk, gv, dt, device, causal, sc, go


def _build_forward(operands, options, packed, training, out, stream) -> _call.GraphCall:
    """*options*: ``(is_causal, scale, dropout_p)``; *packed*: ``(B, (max_seqlen_q,
    max_seqlen_kv), roles, totals)`` with the ``(side, token stride)`` of q, k, v, out (and
    the statistics)."""
    func = "dnn_sdpa_varlen"
    gq, gk, gv, dt, device, causal, sc, go = _check_forward(
        operands, options, packed, training, out
    )
    p = options[2]
    b, maxes, roles, totals = packed
    n_q, hq, _d = gq.shape
    oshape = (n_q, hq, gv.shape[2])
    pairs = _distinct(roles)
    odt = _odt(pairs, totals)
    g = Graph(dt, DataType.FLOAT, DataType.FLOAT, name=func)
    r = _Ragged(g, b, maxes, pairs, odt)
    ts = [
        r.view(name, side, tuple(x.shape), tuple(x.strides), dt, x.ptr)
        for name, side, x in (("q", 0, gq), ("k", 1, gk), ("v", 1, gv))
    ]
    dropout, seed_inputs, seed_spans = _seed_pair(g, p, b)
    tq, tk, tv = ts
    o, stats = g.sdpa(
        tq,
        tk,
        tv,
        attn_scale=sc,
        is_inference=not training,
        use_causal_mask=causal,
        seq_len_q=r.lens[0],
        seq_len_kv=r.lens[1],
        dropout=dropout,
        name="sdpa",
    )
    if go is not None:
        o_strides, alloc, o_span = tuple(go.strides), None, go.nbytes_span
        o.set_alignment(alignment_of(go.ptr))
    else:
        alloc = _call.output_spec(oshape, dt, device)
        o_strides, o_span = alloc.element_strides, alloc.nbytes_span
    o.set_stride(r.strides(0, o_strides))
    r.ragged(o, 0, o_strides[0])
    allocs, out_spans, outs = [alloc], [o_span], [o]
    if stats is not None:  # training
        sspec = _call.output_spec((n_q, hq, 1), DataType.FLOAT, device)
        stats.set_stride(r.strides(0, (hq, 1)))
        r.ragged(stats, 0, hq)
        allocs.append(sspec)
        out_spans.append(sspec.nbytes_span)
        outs.append(stats)
    g.set_io_order(*ts, *r.inputs(), *seed_inputs, *outs)
    spans = [gq.nbytes_span, gk.nbytes_span, gv.nbytes_span, *r.spans(odt), *seed_spans]
    what = _sdpa._describe(
        "packed variable-length attention forward", dt, gq, gk, causal, False, p, training
    )
    return _sdpa._entry(func, g, device, stream, allocs, [*spans, *out_spans], what, None, p)


# ==================================================================================================
# Backward
# ==================================================================================================
def dnn_sdpa_varlen_grad(
    q: DeviceArrayLike,
    k: DeviceArrayLike,
    v: DeviceArrayLike,
    out: DeviceArrayLike,
    dout: DeviceArrayLike,
    stats: DeviceArrayLike,
    cu_seqlens_q: CuSeqlens,
    cu_seqlens_kv: CuSeqlens,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    seed: int | None = None,
    *,
    deterministic: bool | None = None,
    stream: StreamLike = None,
) -> tuple[DeviceArray, DeviceArray, DeviceArray]:
    """Gradients ``(dq, dk, dv)`` of :func:`dnn_sdpa_varlen`.

    Parameters
    ----------
    q, k, v, out, dout : device array
        The forward's packed inputs and output, and the output's gradient (out's shape and
        dtype, head dim contiguous).
    stats : device array
        The forward's statistics (``training=True``), float32 ``(total_q, H, 1)``, contiguous.
    cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, is_causal, scale, dropout_p
        As in the forward.
    seed : int
        The forward's dropout seed (required when *dropout_p* > 0).
    deterministic : bool, optional
        cuDNN's deterministic variant (no float32 dQ accumulator); default
        ``pycudnn.config.deterministic``.
    stream : optional
        CUDA stream.

    Returns
    -------
    (dq, dk, dv)
        Packed ``(total_q, H, D)``, ``(total_kv, H_k, D)``, ``(total_kv, H_k, D_v)``; dk and
        dv summed over each group of query heads.

    Raises
    ------
    NotSupportedError
        As the forward, and a sequence of one query and one key everywhere (``max_seqlen_q =
        max_seqlen_kv = 1``, which cuDNN's backward does not run).
    TypeError, ValueError
        Bad operands, options or cumulative lengths (before any C call).
    """
    if stream is None:
        stream = _operand.producer_stream(q)
    func = "dnn_sdpa_varlen_grad"
    keys = [_operand.key_of(a) for a in (q, k, v, out, dout, stats)]
    names = ("q", "k", "v", "out", "dout", "stats")
    maxes = (
        _cu.max_len(func, "max_seqlen_q", max_seqlen_q),
        _cu.max_len(func, "max_seqlen_kv", max_seqlen_kv),
    )
    shapes = _shapes(func, [(n, kk) for n, (_p, kk) in zip(names, keys, strict=True)])
    totals = (shapes[0][0], shapes[1][0])
    pk = _cu.packing(func, (cu_seqlens_q, cu_seqlens_kv), totals, maxes, (keys[0][1][3], stream))
    det = _call.snapshot().deterministic if deterministic is None else deterministic
    det = parse_bool(det, func, "deterministic")
    is_causal = parse_bool(is_causal, func, "is_causal")
    dropout_p = _sdpa._probability(func, dropout_p)
    if dropout_p and seed is None:
        raise ValueError(
            f"{func}: dropout_p={dropout_p} needs the forward's seed (seed=None would draw "
            "another mask)"
        )
    seedv = _sdpa._seed(func, seed, dropout_p)
    sq, sk, sv = shapes[:3]
    # q, k, v, out, dout, stats as given; dq, dk, dv packed (allocated here)
    roles = _token_strides([kk for _p, kk in keys], (0, 1, 1, 0, 0, 0))
    roles += ((0, sq[1] * sq[2]), (1, sk[1] * sk[2]), (1, sv[1] * sv[2]))
    b = len(pk.cu_q) - 1
    key = (
        func,
        *(kk for _p, kk in keys),
        b,
        maxes,
        is_causal,
        scale,
        scale.__class__,
        dropout_p,
        det,
        _call.snapshot(),
    )
    args = (
        (q, k, v, out, dout, stats),
        (is_causal, scale, dropout_p),
        (b, maxes, roles, totals),
        det,
        stream,
    )
    if _call.cached_entry(key) is None:  # a new case: its checks come before the upload
        _check_backward(*args[:3])
        _checks.check_stream(func, stream, keys[0][1][3])
    ptrs = (*(p for p, _k in keys), *_cu.upload(pk, _distinct(roles), keys[0][1][3], stream))
    none = (None,) * 3
    if seedv is None:
        return _call.run_cached(key, _build_backward, args, ptrs, none, none, stream)
    return _sdpa._run_seeded(seedv, key, _build_backward, args, ptrs, none, none, stream)


def _saved(func: str, gq: Any, gv: Any, saved: tuple, dt: DataType, device: int) -> tuple:
    """out, dout and stats checked against q and v: ``(go, gdo, gs)``."""
    out, dout, stats = saved
    tq, hq, _d = gq.shape
    oshape = (tq, hq, gv.shape[2])
    (go, gdo), _dt, _dev = _packed(func, (("out", out), ("dout", dout)))
    for name, x in (("out", go), ("dout", gdo)):
        if tuple(x.shape) != oshape:
            raise ValueError(f"{func}: {name} must have shape {oshape}, got {tuple(x.shape)}")
        if x.dtype != dt:
            raise TypeError(f"{func}: {name} is {dtype_name(x.dtype)}, q is {dtype_name(dt)}")
        if x.device != device:
            raise ValueError(f"{func}: {name} is on device {x.device}, q on device {device}")
    gs = _operand.operand(stats)
    want = (tq, hq, 1)
    packed = _layout.packed_strides(want)
    if gs.dtype != DataType.FLOAT or tuple(gs.shape) != want:
        raise ValueError(
            f"{func}: stats must be the forward's float32 {want} statistics, got "
            f"{dtype_name(gs.dtype) if gs.dtype else 'an unsupported dtype'} {tuple(gs.shape)}"
        )
    if not _layout.matches(want, gs.strides, packed):
        raise ValueError(f"{func}: stats must be contiguous, got strides {tuple(gs.strides)}")
    _checks.check_aligned(func, "stats", gs)
    if gs.device != device:
        raise ValueError(f"{func}: stats is on device {gs.device}, q on device {device}")
    return go, gdo, gs


def _check_backward(operands, options, packed) -> tuple:
    """The backward's checks (no C call): ``(gq, gk, gv, go, gdo, gs, dtype, device, causal,
    scale)``."""
    func = "dnn_sdpa_varlen_grad"
    gq, gk, gv, dt, device = _qkv(func, *operands[:3])
    go, gdo, gs = _saved(func, gq, gv, operands[3:], dt, device)
    if packed[1] == (1, 1):
        raise errors.NotSupportedError(
            3000, func, "cuDNN's attention backward does not run max_seqlen_q = max_seqlen_kv = 1"
        )
    causal, sc = _options(func, options[0], options[1], gq.shape[2])
    return gq, gk, gv, go, gdo, gs, dt, device, causal, sc


def _build_backward(operands, options, packed, det, stream) -> _call.GraphCall:
    """*operands*: ``(q, k, v, out, dout, stats)``; the rest as :func:`_build_forward`'s."""
    func = "dnn_sdpa_varlen_grad"
    checked = _check_backward(operands, options, packed)
    gq, gk, gv, go, gdo, gs, dt, device, causal, sc = checked
    p = options[2]
    b, maxes, roles, totals = packed
    pairs = _distinct(roles)
    odt = _odt(pairs, totals)
    g = Graph(dt, DataType.FLOAT, DataType.FLOAT, name=func)
    r = _Ragged(g, b, maxes, pairs, odt)
    ins = (("q", 0, gq), ("k", 1, gk), ("v", 1, gv), ("out", 0, go), ("dout", 0, gdo))
    ts = [r.view(n, side, tuple(x.shape), tuple(x.strides), dt, x.ptr) for n, side, x in ins]
    hq, s_tok = gq.shape[1], gs.strides[0]  # (the call's roles read the same stride)
    tst = g.tensor(
        r.dims(0, (0, hq, 1)), r.strides(0, (s_tok, 1)), DataType.FLOAT, name="stats"
    ).set_alignment(alignment_of(gs.ptr))
    r.ragged(tst, 0, s_tok)
    dropout, seed_inputs, seed_spans = _seed_pair(g, p, b)
    tq, tk, tv, to, tdo = ts
    grads = g.sdpa_backward(
        tq,
        tk,
        tv,
        to,
        tdo,
        tst,
        attn_scale=sc,
        use_causal_mask=causal,
        seq_len_q=r.lens[0],
        seq_len_kv=r.lens[1],
        dropout=dropout,
        use_deterministic_algorithm=det,
    )
    allocs = []
    for t, (side, like) in zip(grads, ((0, gq), (1, gk), (1, gv)), strict=True):
        spec = _call.output_spec(tuple(like.shape), dt, device)
        st = spec.element_strides
        t.set_stride(r.strides(side, st))
        r.ragged(t, side, st[0])
        allocs.append(spec)
    g.set_io_order(*ts, tst, *r.inputs(), *seed_inputs, *grads)
    spans = [x.nbytes_span for _n, _s, x in ins] + [gs.nbytes_span, *r.spans(odt), *seed_spans]
    what = _sdpa._describe(
        "packed variable-length attention backward", dt, gq, gk, causal, False, p, False
    )
    spans += [a.nbytes_span for a in allocs]
    return _sdpa._entry(func, g, device, stream, allocs, spans, what, None, p)
