"""Attention over a paged KV cache (inference): ``dnn_sdpa_paged``, one builder graph
(:mod:`pycudnn.graph.nodes.paged` in front of :mod:`pycudnn.graph.nodes.sdpa`'s forward)
planned and cached like every graph.

The cache layout is vLLM's and FlashInfer's: keys and values live in fixed-size blocks (pages)
of a shared pool, ``k_cache``/``v_cache`` ``(num_blocks, H_k, block_size, D)`` as logical dims
(vLLM's ``(num_blocks, block_size, H_k, D)`` storage is passed as its ``transpose(1, 2)`` view:
the strides carry the layout, nothing is copied), and an int32 ``page_table`` ``(B,
pages_per_sequence)`` says which block holds each sequence's tokens ``[i * block_size, (i + 1)
* block_size)``. One table serves K and V unless ``page_table_v`` is given (cuDNN reads each
through its own paged cache load). Decode is ``S_q = 1``; prefill and speculative decoding
``S_q > 1`` new queries, the last of each sequence's keys (causal masks are bottom-right
aligned, as ``flash_attn_with_kvcache``'s).

The table's entries, the lengths' values (``seq_lens_kv[b] <= max_seqlen_kv``, ``seq_lens_q[b]
<= S_q``) and the blocks' contents are not checked by default: they live on the device, and
checking them costs a copy and a synchronisation per call (flash-attn and vLLM leave them
unchecked too). An entry outside ``[0, num_blocks)`` within a sequence's length reads outside the
cache. ``check_indices=True`` (or ``pycudnn.config.check_indices``) checks them on the host
before the launch (:mod:`._index_checks`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import errors
from .._config import parse_bool
from .._types import dtype_name
from ..enums import DataType
from ..graph import Graph
from ..graph._tensor import alignment_of
from . import _call, _checks, _graphops, _index_checks, _operand, _sdpa_operands, _staging

if TYPE_CHECKING:
    from ..typing import DeviceArrayLike, StreamLike
    from ._annotations import Out

__all__ = ["dnn_sdpa_paged"]

_TYPES = (DataType.HALF, DataType.BFLOAT16)
_ALL = (DataType.HALF, DataType.BFLOAT16, DataType.FLOAT, DataType.DOUBLE)
#: a decode query (S_q = 1) with a causal mask: cuDNN 9.10 and newer (cudnn-frontend's check)
_DECODE_MASK_VERSION = 91000
#: where the default seq_lens_q (every sequence S_q queries) sits in the call's pointers
_LENS_Q_AT = 5


def dnn_sdpa_paged(
    q: DeviceArrayLike,
    k_cache: DeviceArrayLike,
    v_cache: DeviceArrayLike,
    page_table: DeviceArrayLike,
    seq_lens_kv: DeviceArrayLike,
    max_seqlen_kv: int | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    page_table_v: DeviceArrayLike | None = None,
    seq_lens_q: DeviceArrayLike | None = None,
    out: Out | None = None,
    stream: StreamLike = None,
    check_indices: bool | None = None,
) -> Out:
    """Scaled dot-product attention of new queries over a paged KV cache, ``softmax(scale * q
    k^T + mask) v`` with k and v gathered from their blocks, on cuDNN's fused flash-attention
    engines (forward only; cuDNN 9.5 or newer).

    Parameters
    ----------
    q : device array
        ``(B, H, S_q, D)``, float16 or bfloat16, any strides (``x.transpose(1, 2)`` of a (B,
        S_q, H, D) array); ``S_q = 1`` for decode.
    k_cache, v_cache : device array
        ``(num_blocks, H_k, block_size, D)`` and ``(num_blocks, H_k, block_size, D_v)``, q's
        dtype, head dim contiguous (vLLM's ``(num_blocks, block_size, H_k, D)`` storage as its
        ``transpose(1, 2)`` view); ``H`` a multiple of ``H_k`` (grouped-query attention); D and
        D_v multiples of 8, at most 256 (over 128: cuDNN 9.10 or newer).
    page_table : device array
        int32 ``(B, pages_per_sequence)``: ``page_table[b, i]`` is the block of k_cache (and of
        v_cache unless *page_table_v*) that holds tokens ``i * block_size`` to ``(i + 1) *
        block_size - 1`` of sequence ``b``. Any positive strides (a slice of a wider table).
    seq_lens_kv : device array
        int32 ``(B,)``: each sequence's number of cached keys (the new queries' included).
    max_seqlen_kv : int, optional
        The longest ``seq_lens_kv`` the graph serves, at most ``pages_per_sequence *
        block_size`` (the default); the graph reads ``ceil(max_seqlen_kv / block_size)`` pages
        per sequence. A smaller bound is a smaller graph.
    is_causal : bool
        Mask keys after each query, bottom-right aligned: query ``i`` of sequence ``b`` sees
        keys ``j <= i + seq_lens_kv[b] - seq_lens_q[b]`` (the queries are the sequence's last
        tokens). With ``S_q = 1`` the last query sees every key anyway (cuDNN 9.10 or newer
        runs the mask there; older ones refuse it: pass ``is_causal=False``).
    scale : float, optional
        Default ``1 / sqrt(D)``.
    page_table_v : device array, optional
        V's own int32 ``(B, pages)`` table (default: *page_table* serves both).
    seq_lens_q : device array, optional
        int32 ``(B,)`` valid queries per sequence (default: all ``S_q``); rows past a
        sequence's length are left as cuDNN writes them (zeros).
    out : device array, optional
        ``(B, H, S_q, D_v)``, q's dtype, head dim contiguous.
    stream : optional
        CUDA stream; default the operands' framework's current stream (torch, CuPy), else the
        handle's stream.
    check_indices : bool, optional
        Read the page tables and lengths back and refuse, before the launch, a length outside
        ``[0, S_q]`` / ``[0, max_seqlen_kv]`` or a page a sequence's length uses that names no
        block of the cache (a copy and a synchronisation per call). Default
        ``pycudnn.config.check_indices`` (False: unchecked, as flash-attn and vLLM leave them).

    Returns
    -------
    out
        ``(B, H, S_q, D_v)`` in q's memory order (or *out*).

    Raises
    ------
    NotSupportedError
        float32/float64 data, head dims not multiples of 8 or over 256, a GPU older than
        sm80, a cuDNN older than 9.5 (9.10 for head dims over 128 or a causal decode), or no
        engine in the loaded cuDNN for the case (the message says which).
    TypeError, ValueError
        Host arrays, a page table that is not int32 ``(B, pages)``, mismatched shapes,
        devices or dtypes, *max_seqlen_kv* beyond the table, bad options, a bad *out*
        (before any C call).

    Examples
    --------
    >>> o = pycudnn.dnn_sdpa_paged(q, k_cache, v_cache, block_table, cache_lens)  # decode
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(q)
    func = "dnn_sdpa_paged"
    for name, a in (("page_table", page_table), ("seq_lens_kv", seq_lens_kv)):
        if a is None:
            raise TypeError(f"{func}: {name} is required (an int32 device array), got None")
    if _index_checks.enabled(func, check_indices):
        tables = (("page_table", page_table),)
        if page_table_v is not None:
            tables += (("page_table_v", page_table_v),)
        lens = (seq_lens_q, seq_lens_kv)
        _index_checks.check_paged(func, q, k_cache, tables, lens, max_seqlen_kv, stream)
    pq, kq = _operand.key_of(q)
    pk, kk = _operand.key_of(k_cache)
    pv, kv = _operand.key_of(v_cache)
    pt, kt = _operand.key_of(page_table)
    ptv, ktv = (pt, None) if page_table_v is None else _operand.key_of(page_table_v)
    psq, ksq = (0, None) if seq_lens_q is None else _operand.key_of(seq_lens_q)
    pskv, kskv = _operand.key_of(seq_lens_kv)
    po, ko = (None, None) if out is None else _operand.key_of(out)
    if is_causal.__class__ is not bool:
        is_causal = parse_bool(is_causal, func, "is_causal")
    key = (
        func,
        kq,
        kk,
        kv,
        kt,
        ktv,
        ksq,
        kskv,
        max_seqlen_kv,
        max_seqlen_kv.__class__,  # True equals 1: the type keeps it from a valid entry
        is_causal,
        scale,
        scale.__class__,
        ko,
        _call.snapshot(),
    )
    args = (
        (q, k_cache, v_cache),
        (page_table, page_table_v),
        (seq_lens_q, seq_lens_kv),
        (max_seqlen_kv, is_causal, scale),
        out,
        stream,
    )
    ptrs = (pq, pk, pv, pt, ptv, psq, pskv)
    return _call.run_cached(key, _build, args, ptrs, (out,), (po,), stream)[0]


class _FixedLensQ(_call.GraphCall):
    """A paged attention without ``seq_lens_q``: the caller passes pointer 0 for it and
    :meth:`launch` puts in this entry's device array of ``S_q``'s (made once, kept alive)."""

    __slots__ = ("lens_q",)

    def launch(self, ptrs: Sequence[int]) -> None:
        ptrs = list(ptrs)
        ptrs[_LENS_Q_AT] = self.lens_q.ptr
        super().launch(ptrs)


def _operands(func: str, q: Any, k_cache: Any, v_cache: Any) -> tuple:
    """q and the caches checked: ``(gq, gk, gv, dtype, device)``."""
    gq, gk, gv = (_operand.operand(a) for a in (q, k_cache, v_cache))
    named = (("q", gq), ("k_cache", gk), ("v_cache", gv))
    dt, device = _checks.same_dtype_and_device(func, named, _ALL)
    if dt not in _TYPES:
        raise errors.NotSupportedError(
            3000,
            func,
            f"cuDNN's fused attention runs float16 and bfloat16 only, got {dtype_name(dt)}",
        )
    for name, g in named:
        if len(g.shape) != 4:
            want = "(B, H, S_q, D)" if name == "q" else "(num_blocks, H_k, block_size, D)"
            raise ValueError(f"{func}: {name} must have 4 dims {want}, got shape {g.shape}")
        _checks.check_strides(func, name, g)
        if 0 in g.shape:
            raise ValueError(f"{func}: {name} has an empty dim {g.shape}")
        if name != "q" and g.strides[3] != 1:
            raise ValueError(
                f"{func}: {name}'s head dim must be contiguous (stride 1), got strides "
                f"{g.strides} (a cache is never copied)"
            )
    _b, hq, _sq, d = gq.shape
    if gk.shape[:3] != gv.shape[:3]:
        raise ValueError(
            f"{func}: k_cache {gk.shape} and v_cache {gv.shape} must have the same "
            "(num_blocks, H_k, block_size)"
        )
    dims = (d, gk.shape[3], gv.shape[3])
    _sdpa_operands.check_heads(func, dims, (hq, gk.shape[1]), "k_cache's", "the caches'")
    _sdpa_operands.check_gpu(func, device)
    return gq, gk, gv, dt, device


def _table(func: str, name: str, obj: Any, b: int, device: int) -> _operand.Operand:
    g = _operand.operand(obj)
    if g.dtype != DataType.INT32:
        got = dtype_name(g.dtype) if g.dtype else "an unsupported dtype"
        raise TypeError(
            f"{func}: {name} must be an int32 device array of shape ({b}, pages per "
            f"sequence), got {got}"
        )
    if len(g.shape) != 2 or g.shape[0] != b or g.shape[1] == 0:
        raise ValueError(f"{func}: {name} must have shape ({b}, pages per sequence), got {g.shape}")
    if g.device != device:
        raise ValueError(f"{func}: {name} is on device {g.device}, q on device {device}")
    _checks.check_strides(func, name, g)
    return g


def _max_len(func: str, value: Any, pages: int, block: int) -> int:
    """*max_seqlen_kv* (None: every page of the narrower table) checked against the table."""
    most = pages * block
    if value is None:
        return most
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise ValueError(
            f"{func}: max_seqlen_kv must be an int in [1, {most}] (pages per sequence {pages} "
            f"* block_size {block}), got {value!r}"
        )
    return value


def _table_tensor(g: Graph, name: str, t: _operand.Operand, pages: int) -> Any:
    """The first *pages* columns of the ``(B, W)`` table *t*, as cuDNN's ``(B, 1, pages, 1)``
    (the table's own strides: a wider table is read in place)."""
    rows, cols = (max(s, 1) for s in t.strides)
    dims = (t.shape[0], 1, pages, 1)
    strides = (rows, rows, cols, 1)
    return g.tensor(dims, strides, DataType.INT32, name=name, alignment=alignment_of(t.ptr))


def _build(qkv, tables, seq_lens, options, out, stream) -> _call.GraphCall:
    """*qkv*: ``(q, k_cache, v_cache)``; *tables*: ``(k's, v's or None)``; *seq_lens*: ``(q's
    or None, kv's)``; *options*: ``(max_seqlen_kv, is_causal, scale)``."""
    func = "dnn_sdpa_paged"
    max_seqlen_kv, is_causal, scale = options
    gq, gk, gv, dt, device = _operands(func, *qkv)
    b, hq, sq, _d = gq.shape
    block = gk.shape[2]
    gt = _table(func, "page_table", tables[0], b, device)
    gtv = gt if tables[1] is None else _table(func, "page_table_v", tables[1], b, device)
    max_s = _max_len(func, max_seqlen_kv, min(gt.shape[1], gtv.shape[1]), block)
    causal = parse_bool(is_causal, func, "is_causal")
    sc = None if scale is None else _checks.real(scale, "scale", func)
    seq_lens_q, seq_lens_kv = seq_lens
    gsq = _sdpa_operands.lens(func, "seq_lens_q", seq_lens_q, b, device)
    gskv = _sdpa_operands.lens(func, "seq_lens_kv", seq_lens_kv, b, device)
    if causal and sq == 1 and _call.cudnn_version() < _DECODE_MASK_VERSION:
        raise errors.NotSupportedError(
            3000,
            func,
            f"is_causal=True with S_q = 1 (decode) needs cuDNN 9.10.0 or newer; the loaded "
            f"cuDNN is {_call.cudnn_version()} (the one query sees every key: pass "
            "is_causal=False)",
        )
    g = Graph(dt, DataType.FLOAT, DataType.FLOAT, name=func)
    stage: list = []
    st_q, aq = _sdpa_operands.layout_of(func, "q", gq, 0, stage)
    tq = g.tensor(gq.shape, st_q, dt, name="q", alignment=aq)
    tk = _graphops.declare(g, "k_cache", gk)
    tv = _graphops.declare(g, "v_cache", gv)
    pages = -(-max_s // block)
    # two tensors even on one table, as FlashInfer declares them (one load each)
    ttk = _table_tensor(g, "page_table_k", gt, pages)
    ttv = _table_tensor(g, "page_table_v", gtv, pages)
    # without seq_lens_q, the entry's own array of S_q's (made once the plan is found; a fresh
    # allocation is aligned to at least 16 bytes)
    tsq = _graphops.column(g, "seq_len_q", b, DataType.INT32, 16 if gsq is None else gsq.ptr)
    tskv = _graphops.column(g, "seq_len_kv", b, DataType.INT32, gskv.ptr)
    o, _stats = g.sdpa(
        tq,
        tk,
        tv,
        attn_scale=sc,
        use_causal_mask=causal,
        diagonal_alignment="bottom_right" if causal else "top_left",
        seq_len_q=tsq,
        seq_len_kv=tskv,
        paged_attention_k_table=ttk,
        paged_attention_v_table=ttv,
        paged_attention_max_seq_len_kv=max_s,
        name="sdpa",
    )
    alloc, so = _sdpa_operands.output(func, o, out, (b, hq, sq, gv.shape[3]), gq)
    g.set_io_order(tq, tk, tv, ttk, ttv, tsq, tskv, o)
    in_spans = [x.nbytes_span for x in (gq, gk, gv, gt, gtv)]
    in_spans += [0 if gsq is None else gsq.nbytes_span, gskv.nbytes_span]
    st = _staging.Stage(dt, stage, None, 1.0, 0.0) if stage else None
    what = (
        f"{dtype_name(dt)} paged attention forward q{gq.shape} k_cache{gk.shape} "
        f"(block size {block}, max_seqlen_kv {max_s}{', causal' if causal else ''})"
    )
    kind = _FixedLensQ if gsq is None else _call.GraphCall
    spans = [*in_spans, so]
    call = _graphops.entry(func, g, device, stream, [alloc], spans, what=what, stage=st, kind=kind)
    if gsq is None:  # every sequence S_q queries: a cached device array of them
        call.lens_q = _graphops.filled(b, DataType.INT32, device, sq)
    return call
