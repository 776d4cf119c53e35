"""Scaled dot-product attention on cuDNN's fused flash-attention engines: ``dnn_sdpa`` and its
gradient ``dnn_sdpa_grad``, each one builder graph (:mod:`pycudnn.graph.nodes.sdpa`) planned and
cached like every graph.

Layout: q ``(B, H, S_q, D)``, k ``(B, H_k, S_kv, D)``, v ``(B, H_k, S_kv, D_v)`` as logical
dims; a ``(B, S, H, D)`` array is passed as its ``transpose(1, 2)`` view (strides carry the
layout, nothing is copied). ``H`` a multiple of ``H_k``: grouped-query (and, ``H_k = 1``,
multi-query) attention. The head dim must be contiguous (stride 1); other operands go through
a packed copy. float16 and bfloat16 (cuDNN's fused attention has no float32 engine).

Masks: ``is_causal`` (top-left aligned, as torch's, or bottom-right), a band
(``left_bound``/``right_bound``: sliding windows), an additive ``attn_mask`` (a bias, with its
gradient), ALiBi, sink tokens (:mod:`._sdpa_masks`), and per-batch valid lengths
``seq_lens_q``/``seq_lens_kv`` (int32 device arrays of shape (B,)): rows and columns past a
batch's lengths are masked (padding).

Dropout: ``dropout_p`` with a ``seed`` (Philox; the same seed gives the same mask, and
``dnn_sdpa_grad`` with the same seed regenerates it). Without a seed a random one is drawn,
and the backward cannot reproduce the mask: pass a seed when training with dropout.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

from .. import _layout, errors
from .._config import parse_bool
from .._types import dtype_name
from ..enums import DataType
from ..graph import Graph
from ..graph._tensor import alignment_of
from . import (
    _call,
    _checks,
    _graphops,
    _index_checks,
    _operand,
    _sdpa_masks,
    _sdpa_operands,
    _staging,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ..memory import DeviceArray
    from ..typing import DeviceArrayLike, StreamLike
    from ._annotations import Out, SdpaOptions

__all__ = ["dnn_sdpa", "dnn_sdpa_grad"]

_TYPES = (DataType.HALF, DataType.BFLOAT16)
_ALL = (DataType.HALF, DataType.BFLOAT16, DataType.FLOAT, DataType.DOUBLE)


def _qkv(func: str, q: Any, k: Any, v: Any) -> tuple:
    gq, gk, gv = _operand.operand(q), _operand.operand(k), _operand.operand(v)
    named = (("q", gq), ("k", gk), ("v", gv))
    dt, device = _checks.same_dtype_and_device(func, named, _ALL)
    if dt not in _TYPES:
        raise errors.NotSupportedError(
            3000,
            func,
            f"cuDNN's fused attention runs float16 and bfloat16 only, got "
            f"{dtype_name(dt)}: cast q, k, v (e.g. .to(torch.bfloat16))",
        )
    for name, g in named:
        if len(g.shape) != 4:
            raise ValueError(
                f"{func}: {name} must have 4 dims (B, H, S, D), got shape {tuple(g.shape)}"
            )
        _checks.check_strides(func, name, g)
        if 0 in g.shape:
            raise ValueError(f"{func}: {name} has an empty dim {tuple(g.shape)}")
    b, hq, _sq, d = gq.shape
    _, hk, skv, dk = gk.shape
    _, hv, skv2, dv = gv.shape
    if gk.shape[0] != b or gv.shape[0] != b:
        raise ValueError(
            f"{func}: q, k, v have different batch sizes: {tuple(gq.shape)}, "
            f"{tuple(gk.shape)}, {tuple(gv.shape)}"
        )
    if skv2 != skv or hv != hk:
        raise ValueError(
            f"{func}: k {tuple(gk.shape)} and v {tuple(gv.shape)} must have the "
            "same batch, heads and sequence length"
        )
    _sdpa_operands.check_heads(func, (d, dk, dv), (hq, hk))
    _sdpa_operands.check_gpu(func, device)
    return gq, gk, gv, dt, device


def _options(
    func: str, attn_mask: Any, is_causal: Any, scale: Any, dropout_p: Any, d: int
) -> tuple[bool, float, float]:
    is_causal = parse_bool(is_causal, func, "is_causal")
    sc = 1.0 / math.sqrt(d) if scale is None else _checks.real(scale, "scale", func)
    p = _checks.real(dropout_p, "dropout_p", func, lo=0.0, hi=1.0, hi_open=True)
    return is_causal, sc, p


#: the per-call seed of an attention with dropout (not in the key; read by its launch)
_RUN = threading.local()


class _Seeded(_call.GraphCall):
    """An attention graph with dropout: its Philox seed is a by-value graph scalar, and
    :meth:`launch` writes this call's seed (:data:`_RUN`) into it before the plan runs. cuDNN
    reads by-value scalars when it enqueues the kernels, so no device copy and no
    synchronisation are needed (a CUDA graph captured with one seed replays that seed)."""

    __slots__ = ("seed",)
    lean = False  # launch reads the per-call seed

    def launch(self, ptrs: Sequence[int]) -> None:
        self.seed.value = _RUN.seed
        super().launch(ptrs)


def _run_seeded(
    seed: int,
    key: Any,
    build: Any,
    args: tuple,
    ptrs: tuple,
    outs: tuple,
    out_ptrs: tuple,
    stream: Any,
) -> tuple:
    """:func:`._call.run_cached` with *seed* for the :class:`_Seeded` launch (dropout)."""
    _RUN.seed = seed
    try:
        return _call.run_cached(key, build, args, ptrs, outs, out_ptrs, stream)
    finally:
        _RUN.seed = None


def _probability(func: str, dropout_p: Any) -> float:
    """*dropout_p* as a float in [0, 1) before the call key (any real: a NumPy float or a
    ``Fraction`` is as valid as a float, and decides whether the call needs a seed)."""
    if dropout_p.__class__ is float and 0.0 <= dropout_p < 1.0:
        return dropout_p
    return _checks.real(dropout_p, "dropout_p", func, lo=0.0, hi=1.0, hi_open=True)


def _seed(func: str, seed: Any, p: float) -> int | None:
    if p == 0.0:
        return None
    if seed is None:
        return random.getrandbits(63)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ValueError(f"{func}: seed must be an int in [0, 2**63), got {seed!r}")
    return seed


def _seq_lens(func: str, seq_lens_q: Any, seq_lens_kv: Any, b: int, device: int) -> tuple:
    """The two sequence-length operands (both or neither), checked: ``(q's, kv's)``."""
    if (seq_lens_q is None) != (seq_lens_kv is None):
        raise ValueError(f"{func}: give both seq_lens_q and seq_lens_kv (or neither)")
    gsq = _sdpa_operands.lens(func, "seq_lens_q", seq_lens_q, b, device)
    return gsq, _sdpa_operands.lens(func, "seq_lens_kv", seq_lens_kv, b, device)


def _declare_common(g: Graph, gsq: Any, gskv: Any, p: float, b: int, masks: Any) -> tuple:
    """The inputs both directions add after their own: the sequence lengths (when given) and
    the masks' operands (*masks*, a :class:`._sdpa_masks.Declared`);
    ``(seq_len_q, seq_len_kv, dropout, inputs, spans)`` with the graph's ``dropout=`` argument
    (when *p*: by-value seed and offset scalars, no inputs) and the extra inputs' byte spans."""
    tsq = tskv = dropout = None
    inputs: list = []
    spans: list = []
    if gsq is not None:
        tsq = _graphops.column(g, "seq_len_q", b, DataType.INT32, gsq.ptr)
        tskv = _graphops.column(g, "seq_len_kv", b, DataType.INT32, gskv.ptr)
        inputs += [tsq, tskv]
        spans += [gsq.nbytes_span, gskv.nbytes_span]
    inputs += masks.inputs
    spans += masks.spans
    if p:  # by-value scalars: the seed's value is written by each launch (_Seeded)
        tseed = g.scalar(0, "int64", name="seed")
        dropout = (p, tseed, g.scalar(0, "int64", name="offset"))
    return tsq, tskv, dropout, inputs, spans


# training decides between out and (out, stats)
@overload
def dnn_sdpa(
    q: DeviceArrayLike,
    k: DeviceArrayLike,
    v: DeviceArrayLike,
    attn_mask: DeviceArrayLike | None = ...,
    is_causal: bool = ...,
    scale: float | None = ...,
    dropout_p: float = ...,
    seed: int | None = ...,
    training: Literal[False] = ...,
    *,
    out: Out | None = ...,
    out_stats: DeviceArrayLike | None = ...,
    **options: Unpack[SdpaOptions],
) -> Out: ...
@overload
def dnn_sdpa(
    q: DeviceArrayLike,
    k: DeviceArrayLike,
    v: DeviceArrayLike,
    attn_mask: DeviceArrayLike | None = ...,
    is_causal: bool = ...,
    scale: float | None = ...,
    dropout_p: float = ...,
    seed: int | None = ...,
    training: Literal[True] = ...,
    *,
    out: Out | None = ...,
    out_stats: DeviceArrayLike | None = ...,
    **options: Unpack[SdpaOptions],
) -> tuple[Out, DeviceArray]: ...
@overload
def dnn_sdpa(
    q: DeviceArrayLike,
    k: DeviceArrayLike,
    v: DeviceArrayLike,
    attn_mask: DeviceArrayLike | None = ...,
    is_causal: bool = ...,
    scale: float | None = ...,
    dropout_p: float = ...,
    seed: int | None = ...,
    training: bool = ...,
    *,
    out: Out | None = ...,
    out_stats: DeviceArrayLike | None = ...,
    **options: Unpack[SdpaOptions],
) -> Out | tuple[Out, DeviceArray]: ...
def dnn_sdpa(
    q: DeviceArrayLike,
    k: DeviceArrayLike,
    v: DeviceArrayLike,
    attn_mask: DeviceArrayLike | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    seed: int | None = None,
    training: bool = False,
    *,
    seq_lens_q: DeviceArrayLike | None = None,
    seq_lens_kv: DeviceArrayLike | None = None,
    diagonal_alignment: Literal["top_left", "bottom_right"] = "top_left",
    left_bound: int | None = None,
    right_bound: int | None = None,
    alibi: bool = False,
    sink: DeviceArrayLike | None = None,
    out: Out | None = None,
    out_stats: DeviceArrayLike | None = None,
    check_indices: bool | None = None,
    stream: StreamLike = None,
) -> Any:
    """Scaled dot-product attention, ``softmax(scale * q k^T + mask) v``, on cuDNN's fused
    flash-attention engines.

    Parameters
    ----------
    q, k, v : device array
        ``(B, H, S_q, D)``, ``(B, H_k, S_kv, D)``, ``(B, H_k, S_kv, D_v)``; float16 or
        bfloat16; ``H`` a multiple of ``H_k``; D and D_v multiples of 8, at most 256. Any
        strides (``x.transpose(1, 2)`` of a (B, S, H, D) array).
    attn_mask : device array, optional
        An additive mask (a bias) of q's dtype, ``(B or 1, H or 1, S_q, S_kv)``: 0 to
        attend, ``-inf`` to mask, any value to bias. A boolean mask is refused
        (``TypeError``): pass its additive form (see ``docs/graph.md``).
    is_causal : bool
        Mask keys after each query (top-left aligned, as ``torch``'s ``is_causal``;
        bottom-right with *diagonal_alignment*); the same as ``right_bound=0``.
    scale : float, optional
        Default ``1 / sqrt(D)``.
    dropout_p : float
        Probability of zeroing an attention weight, in [0, 1).
    seed : int, optional
        Dropout's Philox seed (default random); pass the same to :func:`dnn_sdpa_grad`.
    training : bool
        Also return the softmax statistics the backward needs.
    seq_lens_q, seq_lens_kv : device array, optional
        int32 ``(B,)`` valid lengths per batch (both or neither): padding masks.
    diagonal_alignment : {"top_left", "bottom_right"}
        The diagonal of the causal mask and the band: through the first query and key, or
        through the last query and key (decode, ``S_q < S_kv``).
    left_bound, right_bound : int, optional
        The band (sliding window): query ``i`` sees keys ``j`` with ``i - left_bound < j <=
        i + right_bound`` (shifted by ``S_kv - S_q`` bottom-right); left_bound >= 1,
        right_bound >= 0.
    alibi : bool
        Add ALiBi's ``slope_h * (j - i)`` (the paper's slopes for H heads); needs a causal
        mask for the backward.
    sink : device array, optional
        float32 ``(H,)`` or ``(1, H, 1, 1)`` sink logits: one extra softmax term per head
        with no value (cuDNN 9.13+).
    out : device array, optional
        ``(B, H, S_q, D_v)``, q's dtype, head dim contiguous.
    out_stats : device array, optional
        Where to write the statistics (``training=True`` only): float32 ``(B, H, S_q, 1)``,
        contiguous. With *out* and *out_stats* given, a repeated call launches with no
        allocation (how a framework binds the call once: ``pycudnn.torch``'s lean path).
    stream : optional
        CUDA stream; default the operands' framework's current stream (torch, CuPy), else the
        handle's stream.
    check_indices : bool, optional
        Read *seq_lens_q*/*seq_lens_kv* back and refuse a length outside ``[0, S_q]`` /
        ``[0, S_kv]`` before the launch (a copy and a synchronisation per call); default
        ``pycudnn.config.check_indices`` (False: unchecked, as flash-attn leaves them).

    Returns
    -------
    out, or (out, stats) when *training*
        ``stats``: float32 ``(B, H, S_q, 1)``, each row's log-sum-exp.

    Raises
    ------
    NotSupportedError
        float32/float64 data, head dims not multiples of 8 or over 256, a GPU older than
        sm80, or no engine in the loaded cuDNN for the case (the message says which).
    TypeError, ValueError
        Host arrays, mismatched shapes, bad options, a bad *out* (before any C call).

    Examples
    --------
    >>> o = pycudnn.dnn_sdpa(q, k, v, is_causal=True)
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(q)
    func = "dnn_sdpa"
    if seq_lens_q is not None and _index_checks.enabled(func, check_indices):
        _lens_in_range(func, q, k, (seq_lens_q, seq_lens_kv), stream)
    pq, kq = _operand.key_of(q)
    pk, kk = _operand.key_of(k)
    pv, kv = _operand.key_of(v)
    psq, ksq = (0, None) if seq_lens_q is None else _operand.key_of(seq_lens_q)
    pskv, kskv = (0, None) if seq_lens_kv is None else _operand.key_of(seq_lens_kv)
    po, ko = (None, None) if out is None else _operand.key_of(out)
    pst, kst = (None, None) if out_stats is None else _operand.key_of(out_stats)
    if is_causal.__class__ is not bool:  # (the common case skips a call: the hot path)
        is_causal = parse_bool(is_causal, func, "is_causal")
    if training.__class__ is not bool:
        training = parse_bool(training, func, "training")
    if out_stats is not None and not training:
        raise ValueError(f"{func}: out_stats is written only with training=True")
    if dropout_p.__class__ is not float or not 0.0 <= dropout_p < 1.0:
        dropout_p = _probability(func, dropout_p)
    seedv = _seed(func, seed, dropout_p) if dropout_p else None
    mptrs, mkey = (), None
    if not (
        attn_mask is None
        and diagonal_alignment == "top_left"
        and left_bound is None
        and right_bound is None
        and alibi is False
        and sink is None
    ):  # (the unmasked call skips this: the hot path)
        bounds = (left_bound, right_bound)
        masks = _sdpa_masks.spec(func, diagonal_alignment, bounds, alibi, sink)
        mptrs, mkey = _sdpa_masks.key(attn_mask, masks, kq)
    else:
        masks = None
    key = (
        func,
        kq,
        kk,
        kv,
        mkey,
        is_causal,
        scale,
        scale.__class__,  # scale=True equals 1.0: the type keeps it from a valid entry
        dropout_p,
        training,
        ksq,
        kskv,
        ko,
        kst,
        _call.snapshot(),
    )
    args = (
        q,
        k,
        v,
        (attn_mask, is_causal, scale, dropout_p, masks),
        training,
        (seq_lens_q, seq_lens_kv),
        (out, out_stats),
        stream,
    )
    ptrs = (pq, pk, pv) if seq_lens_q is None else (pq, pk, pv, psq, pskv)
    if mptrs:
        ptrs += mptrs
    outs, pos = ((out, out_stats), (po, pst)) if training else ((out,), (po,))
    if seedv is None:
        result = _call.run_cached(key, _build_forward, args, ptrs, outs, pos, stream)
    else:
        result = _run_seeded(seedv, key, _build_forward, args, ptrs, outs, pos, stream)
    return (result[0], result[1]) if training else result[0]


def _build_forward(q, k, v, options, training, seq_lens, outs, stream) -> _call.GraphCall:
    """*options*: ``(attn_mask, is_causal, scale, dropout_p, masks)``; *seq_lens*: ``(q's,
    kv's)``; *outs*: ``(out, out_stats)`` as given."""
    out, out_stats = outs
    func = "dnn_sdpa"
    attn_mask, is_causal, scale, dropout_p, masks = options
    seq_lens_q, seq_lens_kv = seq_lens
    gq, gk, gv, dt, device = _qkv(func, q, k, v)
    causal, sc, p = _options(func, attn_mask, is_causal, scale, dropout_p, gq.shape[3])
    b, hq, sq, _d = gq.shape
    dv = gv.shape[3]
    gsq, gskv = _seq_lens(func, seq_lens_q, seq_lens_kv, b, device)
    g = Graph(dt, DataType.FLOAT, DataType.FLOAT, name=func)
    stage: list = []
    st_q, aq = _sdpa_operands.layout_of(func, "q", gq, 0, stage)
    st_k, ak = _sdpa_operands.layout_of(func, "k", gk, 1, stage)
    st_v, av = _sdpa_operands.layout_of(func, "v", gv, 2, stage)
    tq = g.tensor(tuple(gq.shape), st_q, dt, name="q", alignment=aq)
    tk = g.tensor(tuple(gk.shape), st_k, dt, name="k", alignment=ak)
    tv = g.tensor(tuple(gv.shape), st_v, dt, name="v", alignment=av)
    dims = (b, hq, sq, gk.shape[2])
    md = _declare_masks(func, g, attn_mask, masks, dims, dt, device)
    tsq, tskv, dropout, extra, extra_spans = _declare_common(g, gsq, gskv, p, b, md)
    o, stats = g.sdpa(
        tq,
        tk,
        tv,
        attn_scale=sc,
        is_inference=not training,
        use_causal_mask=causal,
        seq_len_q=tsq,
        seq_len_kv=tskv,
        dropout=dropout,
        name="sdpa",
        **md.kwargs,
    )
    alloc, so = _sdpa_operands.output(func, o, out, (b, hq, sq, dv), gq)
    allocs, out_spans = [alloc], [so]
    outs = [o]
    if training:
        sspec, sspan = _stats_output(func, stats, out_stats, (b, hq, sq, 1), device)
        allocs.append(sspec)
        out_spans.append(sspan)
        outs.append(stats)
    g.set_io_order(tq, tk, tv, *extra, *outs)
    in_spans = [gq.nbytes_span, gk.nbytes_span, gv.nbytes_span, *extra_spans]
    st = _staging.Stage(dt, stage, None, 1.0, 0.0) if stage else None
    kind = "attention forward" + _sdpa_masks.describe(attn_mask, masks)
    what = _describe(kind, dt, gq, gk, causal, gsq is not None, p, training)
    return _entry(func, g, device, stream, allocs, [*in_spans, *out_spans], what, st, p)


_NO_MASKS = _sdpa_masks.Declared({}, [], [])


def _stats_output(
    func: str, stats: Any, out_stats: Any, shape: tuple[int, ...], device: int
) -> tuple[_call.OutputSpec | None, int]:
    """The statistics laid out packed: a new array's spec, or *out_stats* checked (float32,
    *shape*, contiguous, on *device*); ``(spec or None, byte span)``."""
    if out_stats is None:
        spec = _call.output_spec(shape, DataType.FLOAT, device)
        return spec, spec.nbytes_span
    g = _checks.out_operand(func, out_stats, shape, DataType.FLOAT, device, name="out_stats")
    if not _layout.matches(g.shape, g.strides, _layout.packed_strides(shape)):
        raise ValueError(
            f"{func}: out_stats must be contiguous {shape}, got strides {tuple(g.strides)}"
        )
    _checks.check_aligned(func, "out_stats", g)
    stats.set_alignment(alignment_of(g.ptr))
    return None, g.nbytes_span


def _declare_masks(func, g, attn_mask, masks, dims, dt, device) -> _sdpa_masks.Declared:
    """The masks' graph operands (none for the unmasked call)."""
    if masks is None:
        return _NO_MASKS
    return _sdpa_masks.declare(func, g, attn_mask, masks, dims, dt, device)


def _entry(func, g, device, stream, allocs, spans, what, stage, p) -> _call.GraphCall:
    """The attention's call entry: a :class:`_Seeded` one with dropout (*p*)."""
    call = _graphops.entry(
        func,
        g,
        device,
        stream,
        allocs,
        spans,
        what=what,
        stage=stage,
        kind=_Seeded if p else _call.GraphCall,
    )
    if p:  # the graph's host scalar of the seed (g.scalar's), written by each launch
        call.seed = next(t for t in g._tensors if t.name == "seed")._value
    return call


def _describe(
    kind: str, dt: DataType, gq: Any, gk: Any, causal: bool, padded: bool, p: float, training: bool
) -> str:
    opts = [
        o
        for o, on in (
            ("causal", causal),
            ("padding mask", padded),
            (f"dropout {p}", bool(p)),
            ("training", training),
        )
        if on
    ]
    return f"{dtype_name(dt)} {kind} q{tuple(gq.shape)} k{tuple(gk.shape)}" + (
        f" ({', '.join(opts)})" if opts else ""
    )


def dnn_sdpa_grad(
    q: DeviceArrayLike,
    k: DeviceArrayLike,
    v: DeviceArrayLike,
    out: DeviceArrayLike,
    dout: DeviceArrayLike,
    stats: DeviceArrayLike,
    attn_mask: DeviceArrayLike | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    seed: int | None = None,
    *,
    seq_lens_q: DeviceArrayLike | None = None,
    seq_lens_kv: DeviceArrayLike | None = None,
    diagonal_alignment: Literal["top_left", "bottom_right"] = "top_left",
    left_bound: int | None = None,
    right_bound: int | None = None,
    alibi: bool = False,
    sink: DeviceArrayLike | None = None,
    bias_grad: bool = False,
    sink_grad: bool = False,
    deterministic: bool | None = None,
    out_grads: tuple[DeviceArrayLike, DeviceArrayLike, DeviceArrayLike] | None = None,
    check_indices: bool | None = None,
    stream: StreamLike = None,
) -> tuple[DeviceArray, ...]:
    """Gradients ``(dq, dk, dv)`` of :func:`dnn_sdpa`.

    Parameters
    ----------
    q, k, v, out, dout : device array
        The forward's inputs and output, and the output's gradient (out's shape and dtype).
    stats : device array
        The forward's statistics (``training=True``), float32 ``(B, H, S_q, 1)``.
    attn_mask, is_causal, scale, dropout_p, seq_lens_q, seq_lens_kv
        As in the forward.
    diagonal_alignment, left_bound, right_bound, alibi, sink
        As in the forward.
    bias_grad : bool
        Also return the gradient of *attn_mask* (cuDNN computes it only for a ``(1, H, S_q,
        S_kv)`` mask; other shapes raise ``NotSupportedError``).
    sink_grad : bool
        Also return the gradient of *sink* (float32 ``(1, H, 1, 1)``). Not yet verified on
        cuDNN 9.19: ``True`` raises ``NotSupportedError``.
    seed : int
        The forward's dropout seed (required when *dropout_p* > 0).
    deterministic : bool, optional
        cuDNN's deterministic variant (no float32 dQ accumulator); default
        ``pycudnn.config.deterministic``.
    out_grads : (dq, dk, dv) device arrays, optional
        Where to write the three gradients (shapes and dtype of q, k, v; head dim contiguous);
        not with *bias_grad* or *sink_grad*. With them given, a repeated call launches with no
        allocation (``pycudnn.torch``'s lean path binds the call so).
    stream : optional
        CUDA stream.
    check_indices : bool, optional
        As for :func:`dnn_sdpa`: the lengths checked on the host before the launch.

    Returns
    -------
    (dq, dk, dv[, dbias][, dsink])
        In q's, k's and v's memory order; dk and dv summed over each group of query heads;
        ``dbias`` (q's dtype) when *bias_grad*, ``dsink`` when *sink_grad*.
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(q)
    func = "dnn_sdpa_grad"
    if seq_lens_q is not None and _index_checks.enabled(func, check_indices):
        _lens_in_range(func, q, k, (seq_lens_q, seq_lens_kv), stream)
    keys = [_operand.key_of(a) for a in (q, k, v, out, dout, stats)]
    given = _out_grads(func, out_grads, bias_grad, sink_grad)
    gkeys = [_operand.key_of(a) for a in given]
    psq, ksq = (0, None) if seq_lens_q is None else _operand.key_of(seq_lens_q)
    pskv, kskv = (0, None) if seq_lens_kv is None else _operand.key_of(seq_lens_kv)
    det = _call.snapshot().deterministic if deterministic is None else deterministic
    det = parse_bool(det, func, "deterministic")
    is_causal = parse_bool(is_causal, func, "is_causal")
    dropout_p = _probability(func, dropout_p)
    if dropout_p and seed is None:
        raise ValueError(
            f"{func}: dropout_p={dropout_p} needs the forward's seed (seed=None "
            "would draw another mask)"
        )
    mptrs, mkey, masks = (), None, None
    if not (
        attn_mask is None
        and diagonal_alignment == "top_left"
        and left_bound is None
        and right_bound is None
        and alibi is False
        and sink is None
        and bias_grad is False
        and sink_grad is False
    ):
        bounds, grads = (left_bound, right_bound), (bias_grad, sink_grad)
        masks = _sdpa_masks.spec(func, diagonal_alignment, bounds, alibi, sink, grads)
        if masks.sink is not None and not masks.sink_grad:
            masks = _sdpa_masks.unused_sink(func, masks, q)
        if masks.bias_grad and attn_mask is None:
            raise ValueError(f"{func}: bias_grad=True needs an attn_mask (the bias)")
        mptrs, mkey = _sdpa_masks.key(attn_mask, masks, keys[0][1])
    key = (
        func,
        *(kk for _p, kk in keys),
        mkey,
        is_causal,
        scale,
        scale.__class__,
        dropout_p,
        ksq,
        kskv,
        det,
        tuple(kk for _p, kk in gkeys),
        _call.snapshot(),
    )
    args = (
        (q, k, v, out, dout, stats),
        (attn_mask, is_causal, scale, dropout_p, masks),
        (seq_lens_q, seq_lens_kv),
        det,
        stream,
        given,
    )
    ptrs = tuple(p for p, _k in keys)
    if seq_lens_q is not None:
        ptrs += (psq, pskv)
    ptrs += mptrs
    seedv = _seed(func, seed, dropout_p)
    extra = 0 if masks is None else masks.bias_grad + masks.sink_grad
    if given:
        outs, pos = given, tuple(p for p, _k in gkeys)
    else:
        outs = pos = (None,) * (3 + extra)
    if seedv is None:
        return _call.run_cached(key, _build_backward, args, ptrs, outs, pos, stream)
    return _run_seeded(seedv, key, _build_backward, args, ptrs, outs, pos, stream)


def _out_grads(func: str, out_grads: Any, bias_grad: Any, sink_grad: Any) -> tuple:
    """*out_grads* as a tuple of three arrays, or ``()`` when not given."""
    if out_grads is None:
        return ()
    if not isinstance(out_grads, (tuple, list)) or len(out_grads) != 3:
        raise TypeError(f"{func}: out_grads must be None or (dq, dk, dv), got {out_grads!r}")
    if bias_grad is not False or sink_grad is not False:
        raise ValueError(f"{func}: out_grads is dq, dk, dv only: not with bias_grad/sink_grad")
    return tuple(out_grads)


def _build_backward(operands, options, seq_lens, det, stream, grads=()) -> _call.GraphCall:
    """*operands*: ``(q, k, v, out, dout, stats)``; *options*: ``(attn_mask, is_causal, scale,
    dropout_p)``; *seq_lens*: ``(q's, kv's)``; *grads*: the given ``(dq, dk, dv)`` or ``()``."""
    func = "dnn_sdpa_grad"
    q, k, v, out, dout, stats = operands
    attn_mask, is_causal, scale, dropout_p, masks = options
    seq_lens_q, seq_lens_kv = seq_lens
    gq, gk, gv, dt, device = _qkv(func, q, k, v)
    causal, sc, p = _options(func, attn_mask, is_causal, scale, dropout_p, gq.shape[3])
    b, hq, sq, d = gq.shape
    _, hk, skv, dv = gv.shape
    if sq == 1 and skv == 1:
        raise errors.NotSupportedError(
            3000, func, "cuDNN's attention backward does not run S_q = S_kv = 1"
        )
    oshape = (b, hq, sq, dv)
    go, gdo = _operand.operand(out), _operand.operand(dout)
    for name, g_ in (("out", go), ("dout", gdo)):
        if tuple(g_.shape) != oshape:
            raise ValueError(f"{func}: {name} must have shape {oshape}, got {tuple(g_.shape)}")
        if g_.dtype != dt:
            raise TypeError(
                f"{func}: {name} is {dtype_name(g_.dtype) if g_.dtype else '?'}, "
                f"q is {dtype_name(dt)}"
            )
        if g_.device != device:
            raise ValueError(f"{func}: {name} is on device {g_.device}, q on device {device}")
        _checks.check_strides(func, name, g_)
    gs = _operand.operand(stats)
    if gs.dtype != DataType.FLOAT or tuple(gs.shape) != (b, hq, sq, 1):
        raise ValueError(
            f"{func}: stats must be the forward's float32 ({b}, {hq}, {sq}, 1) "
            f"statistics, got shape {tuple(gs.shape)}"
        )
    if not _layout.matches(gs.shape, gs.strides, _layout.packed_strides((b, hq, sq, 1))):
        raise ValueError(f"{func}: stats must be contiguous, got strides {tuple(gs.strides)}")
    _checks.check_aligned(func, "stats", gs)
    if gs.device != device:
        raise ValueError(f"{func}: stats is on device {gs.device}, q on device {device}")
    gsq, gskv = _seq_lens(func, seq_lens_q, seq_lens_kv, b, device)
    g = Graph(dt, DataType.FLOAT, DataType.FLOAT, name=func)
    stage: list = []
    ops = (("q", gq), ("k", gk), ("v", gv), ("out", go), ("dout", gdo))
    ts = []
    for i, (name, g_) in enumerate(ops):
        st_, al = _sdpa_operands.layout_of(func, name, g_, i, stage)
        ts.append(g.tensor(tuple(g_.shape), st_, dt, name=name, alignment=al))
    tq, tk, tv, to, tdo = ts
    tst = g.tensor(
        (b, hq, sq, 1),
        _layout.packed_strides((b, hq, sq, 1)),
        DataType.FLOAT,
        name="stats",
        alignment=alignment_of(gs.ptr),
    )
    md = _declare_masks(func, g, attn_mask, masks, (b, hq, sq, skv), dt, device)
    tsq, tskv, dropout, extra, extra_spans = _declare_common(g, gsq, gskv, p, b, md)
    want = (False, False) if masks is None else (masks.bias_grad, masks.sink_grad)
    dq, dk, dv_, *more = g.sdpa_backward(
        tq,
        tk,
        tv,
        to,
        tdo,
        tst,
        attn_scale=sc,
        use_causal_mask=causal,
        seq_len_q=tsq,
        seq_len_kv=tskv,
        dropout=dropout,
        use_deterministic_algorithm=det,
        dbias=want[0],
        dsink=want[1],
        **md.kwargs,
    )
    allocs: list = []
    given_spans = []
    targets = ((dq, gq, (b, hq, sq, d)), (dk, gk, (b, hk, skv, d)), (dv_, gv, (b, hk, skv, dv)))
    for i, (t, like, shape) in enumerate(targets):
        if grads:  # given: laid out as given (checked: shape, dtype, device, head dim)
            name = f"out_grads[{i}]"
            spec, span = _sdpa_operands.output(func, t, grads[i], shape, like, name)
            given_spans.append(span)
        else:
            spec = _sdpa_operands.spec_like(like, shape, dt)
            t.set_stride(spec.element_strides)
        allocs.append(spec)
    for t in more:  # dbias (io type), dsink (float32): packed
        spec = _call.output_spec(t.dim, dt if t.data_type is None else t.data_type, device)
        t.set_stride(_layout.packed_strides(t.dim))
        allocs.append(spec)
    g.set_io_order(tq, tk, tv, to, tdo, tst, *extra, dq, dk, dv_, *more)
    in_spans = [x.nbytes_span for _n, x in ops] + [gs.nbytes_span, *extra_spans]
    st = _staging.Stage(dt, stage, None, 1.0, 0.0) if stage else None
    kind = "attention backward" + _sdpa_masks.describe(attn_mask, masks)
    what = _describe(kind, dt, gq, gk, causal, gsq is not None, p, False)
    out_spans = given_spans or [a.nbytes_span for a in allocs]
    return _entry(func, g, device, stream, allocs, [*in_spans, *out_spans], what, st, p)


def _lens_in_range(func: str, q: Any, k: Any, lens: tuple[Any, Any], stream: Any) -> None:
    """``check_indices``: the padding mask's lengths within the sequence dims, read back to the
    host (:mod:`._index_checks`; shapes and dtypes are the call's own checks)."""
    try:
        gq, gk = _operand.operand(q), _operand.operand(k)
    except (TypeError, ValueError):
        return
    if len(gq.shape) != 4 or len(gk.shape) != 4:
        return
    b, sq, skv = gq.shape[0], gq.shape[2], gk.shape[2]
    _index_checks.check_lengths(func, "seq_lens_q", lens[0], b, sq, f"S_q = {sq}", stream)
    _index_checks.check_lengths(func, "seq_lens_kv", lens[1], b, skv, f"S_kv = {skv}", stream)
