"""The hot path of an attention call: the call key, the pointers, and the cached call entry.

Each public function hands its arguments here as a few plain tuples. A call first builds a *call
key* -- each operand's shape, element strides, dtype, device and pointer residue mod 16
(:func:`._operand.key_of`), the options exactly as given (with the types that tell ``True`` from
``1``), the masks' checked options, and the thread's ``pycudnn.config.snapshot()`` -- and the
pointers in the graph's input order. The high level's one cache-and-run helper
(:func:`._call.run_cached`, through :func:`._calls.run` for the dropout seed) maps the key to a
ready call entry; a miss passes the :class:`._request.AttentionRequest`'s fields, as one plain
tuple, to :func:`._graph.build`. A packed call also uploads its lengths and offsets
(:mod:`._cu_seqlens`, once per content); its checks run first on a miss, before the upload.
"""

from __future__ import annotations

from typing import Any

from ..._config import parse_bool
from .. import _call, _checks, _index_checks, _operand
from . import _calls, _cu_seqlens, _graph, _masks, _operands, _options
from ._request import DENSE, PADDED, PAGED, RAGGED, AttentionRequest

__all__ = ["dense_backward", "dense_forward", "paged_forward", "ragged_backward", "ragged_forward"]


def _masks_of(func: str, attn_mask: Any, masks: tuple, grads: tuple = (False, False)) -> Any:
    """The checked mask options (:class:`._masks.Spec`), or None for the unmasked call (the hot
    path: no call). *masks*: ``(diagonal_alignment, left_bound, right_bound, alibi, sink)``."""
    alignment, left, right, alibi, sink = masks
    if (
        attn_mask is None
        and alignment == "top_left"
        and left is None
        and right is None
        and alibi is False
        and sink is None
        and grads[0] is False
        and grads[1] is False
    ):
        return None
    return _masks.spec(func, alignment, (left, right), alibi, sink, grads)


def _lens_keys(lens: tuple) -> tuple:
    """``(ptr, key)`` of each of the two lengths (``(0, None)`` when not given)."""
    return tuple((0, None) if x is None else _operand.key_of(x) for x in lens)


# ==================================================================================================
# Dense and padded
# ==================================================================================================
def dense_forward(
    qkv: tuple, opts: tuple, lens: tuple, masks: tuple, outs: tuple, check: Any, stream: Any
) -> Any:
    """``dnn_sdpa``: *opts* ``(attn_mask, is_causal, scale, dropout_p, seed, training)``;
    *lens* ``(seq_lens_q, seq_lens_kv)``; *masks* as :func:`_masks_of`; *outs* ``(out,
    out_stats)``; *check* ``check_indices``."""
    q, k, v = qkv
    attn_mask, is_causal, scale, dropout_p, seed, training = opts
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(q)
    func = "dnn_sdpa"
    if lens[0] is not None and _index_checks.enabled(func, check):
        _index_checks.check_dense(func, q, k, lens, stream)
    pq, kq = _operand.key_of(q)
    pk, kk = _operand.key_of(k)
    pv, kv = _operand.key_of(v)
    if lens[0] is None and lens[1] is None:  # (the hot path: no call)
        psq, ksq, pskv, kskv = 0, None, 0, None
    else:
        (psq, ksq), (pskv, kskv) = _lens_keys(lens)
    out, out_stats = outs
    po, ko = (None, None) if out is None else _operand.key_of(out)
    pst, kst = (None, None) if out_stats is None else _operand.key_of(out_stats)
    if is_causal.__class__ is not bool:  # (the common case skips a call: the hot path)
        is_causal = parse_bool(is_causal, func, "is_causal")
    if training.__class__ is not bool:
        training = parse_bool(training, func, "training")
    if out_stats is not None and not training:
        raise ValueError(f"{func}: out_stats is written only with training=True")
    if dropout_p.__class__ is not float or not 0.0 <= dropout_p < 1.0:
        dropout_p = _options.probability(func, dropout_p)
    seedv = _options.seed(func, seed, dropout_p) if dropout_p else None
    # the defaults (identity checks: alibi=0 is not False, a sink array never compared)
    if (
        attn_mask is None
        and masks[1] is None
        and masks[2] is None
        and masks[4] is None
        and (masks[3] is False and masks[0] == "top_left")
    ):
        spec = None
        mptrs, mkey = (), None
    else:
        spec = _masks_of(func, attn_mask, masks)
        mptrs, mkey = ((), None) if spec is None else _masks.key(attn_mask, spec, kq)
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
    layout = DENSE if lens[0] is None and lens[1] is None else PADDED
    options = (attn_mask, is_causal, scale, dropout_p, spec)
    fields = (func, layout, qkv, options, training, False, lens, (), outs, stream)
    ptrs = (pq, pk, pv) if lens[0] is None else (pq, pk, pv, psq, pskv)
    if mptrs:
        ptrs += mptrs
    given, pos = ((out, out_stats), (po, pst)) if training else ((out,), (po,))
    if seedv is None:  # (the hot path: one call less)
        result = _call.run_cached(key, _graph.build, fields, ptrs, given, pos, stream)
    else:
        result = _calls.run(seedv, key, _graph.build, fields, ptrs, given, pos, stream)
    return (result[0], result[1]) if training else result[0]


def dense_backward(
    operands: tuple, opts: tuple, lens: tuple, masks: tuple, grads: tuple, given: Any, how: tuple
) -> Any:
    """``dnn_sdpa_grad``: *operands* ``(q, k, v, out, dout, stats)``; *opts* ``(attn_mask,
    is_causal, scale, dropout_p, seed, deterministic)``; *grads* ``(bias_grad, sink_grad)``;
    *given* ``out_grads``; *how* ``(check_indices, stream)``."""
    q, k = operands[:2]
    attn_mask, is_causal, scale, dropout_p, seed, deterministic = opts
    check, stream = how
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(q)
    func = "dnn_sdpa_grad"
    if lens[0] is not None and _index_checks.enabled(func, check):
        _index_checks.check_dense(func, q, k, lens, stream)
    keys = [_operand.key_of(a) for a in operands]
    outs = _options.out_grads(func, given, *grads)
    gkeys = [_operand.key_of(a) for a in outs]
    if lens[0] is None and lens[1] is None:  # (the hot path: no call)
        psq, ksq, pskv, kskv = 0, None, 0, None
    else:
        (psq, ksq), (pskv, kskv) = _lens_keys(lens)
    det = _call.snapshot().deterministic if deterministic is None else deterministic
    det = parse_bool(det, func, "deterministic")
    is_causal = parse_bool(is_causal, func, "is_causal")
    dropout_p = _options.probability(func, dropout_p)
    _options.needs_seed(func, dropout_p, seed)
    mptrs, mkey = (), None
    spec = _masks_of(func, attn_mask, masks, grads)
    if spec is not None:
        if spec.sink is not None and not spec.sink_grad:
            spec = _masks.unused_sink(func, spec, q)
        if spec.bias_grad and attn_mask is None:
            raise ValueError(f"{func}: bias_grad=True needs an attn_mask (the bias)")
        mptrs, mkey = _masks.key(attn_mask, spec, keys[0][1])
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
    layout = DENSE if lens[0] is None and lens[1] is None else PADDED
    options = (attn_mask, is_causal, scale, dropout_p, spec)
    fields = (func, layout, operands, options, False, det, lens, (), outs, stream)
    ptrs = tuple(p for p, _k in keys)
    if lens[0] is not None:
        ptrs += (psq, pskv)
    ptrs += mptrs
    seedv = _options.seed(func, seed, dropout_p)
    if outs:
        pos = tuple(p for p, _k in gkeys)
    else:
        outs = pos = (None,) * (3 + (0 if spec is None else spec.bias_grad + spec.sink_grad))
    if seedv is None:  # (the hot path: one call less)
        return _call.run_cached(key, _graph.build, fields, ptrs, outs, pos, stream)
    return _calls.run(seedv, key, _graph.build, fields, ptrs, outs, pos, stream)


# ==================================================================================================
# Packed (ragged)
# ==================================================================================================
def _packing(func: str, keys: list, names: tuple, cu: tuple, maxes: tuple, stream: Any) -> tuple:
    """The checked maxima, the operands' shapes and the cumulative lengths' packing."""
    maxes = (
        _cu_seqlens.max_len(func, "max_seqlen_q", maxes[0]),
        _cu_seqlens.max_len(func, "max_seqlen_kv", maxes[1]),
    )
    shapes = _cu_seqlens.shapes(func, [(n, kk) for n, (_p, kk) in zip(names, keys, strict=False)])
    totals = (shapes[0][0], shapes[1][0])
    pk = _cu_seqlens.packing(func, cu, totals, maxes, (keys[0][1][3], stream))
    return maxes, shapes, totals, pk


def _ragged_key(func: str, keys: list, out: tuple, packed: tuple, opts: tuple) -> tuple:
    """A packed call's key: the operands' keys (and *out*'s), the batch and the maxima (not the
    lengths: one entry serves every batch of those), the options as given (*opts*: the causal
    flag, the scale, the dropout probability, then training or determinism)."""
    is_causal, scale, dropout_p, flag = opts
    kk = (k for _p, k in keys)
    snap = _call.snapshot()
    return (func, *kk, *out, *packed, is_causal, scale, scale.__class__, dropout_p, flag, snap)


def _ragged_run(fields: tuple, key: tuple, keys: list, pk: Any, seed: Any, outs: tuple) -> Any:
    """Check a new case before the upload, upload the lengths and offsets, run."""
    func, roles, stream = fields[0], fields[6][2], fields[9]
    device = keys[0][1][3]
    if _call.cached_entry(key) is None:  # a new case: its checks come before the upload
        device = _operands.read(AttentionRequest._make(fields)).device
        _checks.check_stream(func, stream, device)
    up = _cu_seqlens.upload(pk, _cu_seqlens.distinct(roles), keys[0][1][3], stream)
    ptrs = (*(p for p, _k in keys), *up)
    return _calls.run(seed, key, _graph.build, fields, ptrs, outs[0], outs[1], stream)


def ragged_forward(qkv: tuple, cu: tuple, maxes: tuple, opts: tuple, out: Any, stream: Any) -> Any:
    """``dnn_sdpa_varlen``: *cu* the cumulative lengths, *maxes* the maxima, *opts*
    ``(is_causal, scale, dropout_p, seed, training)``."""
    is_causal, scale, dropout_p, seed, training = opts
    if stream is None:
        stream = _operand.producer_stream(qkv[0])
    func = "dnn_sdpa_varlen"
    keys = [_operand.key_of(a) for a in qkv]
    po, ko = (None, None) if out is None else _operand.key_of(out)
    maxes, (sq, _sk, sv), totals, pk = _packing(func, keys, ("q", "k", "v"), cu, maxes, stream)
    is_causal = parse_bool(is_causal, func, "is_causal")
    training = parse_bool(training, func, "training")
    dropout_p = _options.probability(func, dropout_p)
    seedv = _options.seed(func, seed, dropout_p)
    # out's token stride, or that of the packed (total_q, H, D_v) output allocated here
    o_stride = ko[1][0] if ko is not None and len(ko[1]) == 3 else sq[1] * sv[2]
    roles = (*_cu_seqlens.token_strides([kk for _p, kk in keys], (0, 1, 1)), (0, int(o_stride)))
    if training:
        roles += ((0, sq[1]),)  # the statistics (total_q, H, 1): H elements a token
    b = len(pk.cu_q) - 1
    key = _ragged_key(func, keys, (ko,), (b, maxes), (is_causal, scale, dropout_p, training))
    options = (None, is_causal, scale, dropout_p, None)
    packed = (b, maxes, roles, totals)
    fields = (func, RAGGED, qkv, options, training, False, packed, (), (out,), stream)
    outs = ((out, None), (po, None)) if training else ((out,), (po,))
    result = _ragged_run(fields, key, keys, pk, seedv, outs)
    return (result[0], result[1]) if training else result[0]


def ragged_backward(
    operands: tuple, cu: tuple, maxes: tuple, opts: tuple, deterministic: Any, stream: Any
) -> Any:
    """``dnn_sdpa_varlen_grad``: *operands* ``(q, k, v, out, dout, stats)``; *opts*
    ``(is_causal, scale, dropout_p, seed)``."""
    is_causal, scale, dropout_p, seed = opts
    if stream is None:
        stream = _operand.producer_stream(operands[0])
    func = "dnn_sdpa_varlen_grad"
    keys = [_operand.key_of(a) for a in operands]
    names = ("q", "k", "v", "out", "dout", "stats")
    maxes, shapes, totals, pk = _packing(func, keys, names, cu, maxes, stream)
    det = _call.snapshot().deterministic if deterministic is None else deterministic
    det = parse_bool(det, func, "deterministic")
    is_causal = parse_bool(is_causal, func, "is_causal")
    dropout_p = _options.probability(func, dropout_p)
    _options.needs_seed(func, dropout_p, seed)
    seedv = _options.seed(func, seed, dropout_p)
    sq, sk, sv = shapes[:3]
    # q, k, v, out, dout, stats as given; dq, dk, dv packed (allocated here)
    roles = _cu_seqlens.token_strides([kk for _p, kk in keys], (0, 1, 1, 0, 0, 0))
    roles += ((0, sq[1] * sq[2]), (1, sk[1] * sk[2]), (1, sv[1] * sv[2]))
    b = len(pk.cu_q) - 1
    key = _ragged_key(func, keys, (), (b, maxes), (is_causal, scale, dropout_p, det))
    options = (None, is_causal, scale, dropout_p, None)
    packed = (b, maxes, roles, totals)
    fields = (func, RAGGED, operands, options, False, det, packed, (), (), stream)
    none = (None,) * 3
    return _ragged_run(fields, key, keys, pk, seedv, (none, none))


# ==================================================================================================
# Paged
# ==================================================================================================
def paged_forward(
    qkv: tuple, tables: tuple, lens: tuple, opts: tuple, out: Any, check: Any, stream: Any
) -> Any:
    """``dnn_sdpa_paged``: *tables* ``(page_table, page_table_v, max_seqlen_kv)``; *lens*
    ``(seq_lens_q, seq_lens_kv)``; *opts* ``(is_causal, scale)``; *check* ``check_indices``."""
    q, k_cache, v_cache = qkv
    page_table, page_table_v, max_seqlen_kv = tables
    seq_lens_q, seq_lens_kv = lens
    is_causal, scale = opts
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(q)
    func = "dnn_sdpa_paged"
    for name, a in (("page_table", page_table), ("seq_lens_kv", seq_lens_kv)):
        if a is None:
            raise TypeError(f"{func}: {name} is required (an int32 device array), got None")
    if _index_checks.enabled(func, check):
        named = (("page_table", page_table),)
        if page_table_v is not None:
            named += (("page_table_v", page_table_v),)
        _index_checks.check_paged(func, q, k_cache, named, lens, max_seqlen_kv, stream)
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
    options = (None, is_causal, scale, 0.0, None)
    fields = (func, PAGED, qkv, options, False, False, lens, tables, (out,), stream)
    ptrs = (pq, pk, pv, pt, ptv, psq, pskv)
    return _calls.run(None, key, _graph.build, fields, ptrs, (out,), (po,), stream)[0]
