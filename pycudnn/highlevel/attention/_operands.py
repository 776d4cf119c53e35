"""The attention's one operand reader: :func:`read` checks a request's operands and options
(before any C call) into a :class:`._request.Checked` call, whatever its layout -- q, k, v (4-D
dense, 3-D packed, or q with the two caches of a paged one), a backward's saved out, dout and
statistics, the per-batch lengths, the page tables -- and the pieces the graph builders share:
the head checks of cuDNN's fused attention, q's layout for the graph (a packed copy when its head
dim is not contiguous) and the outputs laid out in q's memory order."""

from __future__ import annotations

from typing import Any

from ... import _layout, errors
from ..._types import dtype_name, itemsize, numpy_dtype
from ...enums import DataType
from ...graph._tensor import alignment_of, like_strides
from .. import _call, _checks, _graphops, _operand
from . import _options
from ._request import ALL, DENSE, PADDED, PAGED, RAGGED, TYPES, AttentionRequest, Checked

__all__ = [
    "check_gpu",
    "check_heads",
    "layout_of",
    "lens",
    "output",
    "read",
    "spec_like",
]

#: packed attention needs Hopper (sm90) before cuDNN 9.18.1 (cudnn-frontend's check)
THD_ANY_GPU_VERSION = 91801
#: a paged decode query (S_q = 1) with a causal mask: cuDNN 9.10 and newer (cudnn-frontend's)
DECODE_MASK_VERSION = 91000


def check_heads(
    func: str,
    d: tuple[int, int, int],
    heads: tuple[int, int],
    k: str = "k's",
    kv: str = "k's and v's",
) -> None:
    """*d* ``(q's, k's, v's)`` head dims and *heads* ``(H_q, H_k)`` as cuDNN's fused attention
    takes them: q and k alike, H_q a multiple of H_k, head dims multiples of 8 up to 256 (*k*,
    *kv*: the messages' possessive names of k and of the key/value operands)."""
    if d[1] != d[0]:
        raise ValueError(f"{func}: q's head dim ({d[0]}) and {k} ({d[1]}) differ")
    if heads[0] % heads[1]:
        raise ValueError(
            f"{func}: q's heads ({heads[0]}) must be a multiple of {kv} ({heads[1]}) "
            "(grouped-query attention)"
        )
    for name, size in (("q/k", d[0]), ("v", d[2])):
        if size % 8 or size > 256:
            raise errors.NotSupportedError(
                3000,
                func,
                f"cuDNN's fused attention needs head dims that are multiples of 8, at most "
                f"256; {name} has {size}",
            )


def check_gpu(func: str, device: int) -> tuple[int, int] | None:
    """Refuse a GPU older than sm80 (cuDNN's fused attention); returns its capability."""
    cap = _graphops.capability(device)
    if cap is not None and cap < (8, 0):
        raise errors.NotSupportedError(
            3000,
            func,
            f"cuDNN's fused attention needs an sm80 (Ampere) or newer GPU; device {device} is "
            f"sm{cap[0]}{cap[1]}",
        )
    return cap


def lens(func: str, name: str, obj: Any, b: int, device: int) -> _operand.Operand | None:
    """*obj* (None: None) checked as an int32 ``(B,)`` (or ``(B, 1, 1, 1)``) device array of
    one length per batch on *device*."""
    if obj is None:
        return None
    g = _int32(func, name, obj, f"({b},)")
    if tuple(g.shape) not in ((b,), (b, 1, 1, 1)):
        raise ValueError(
            f"{func}: {name} must have shape ({b},) (one length per batch), got {tuple(g.shape)}"
        )
    _device(func, name, g, device)
    _checks.check_aligned(func, name, g)
    return g


def _int32(func: str, name: str, obj: Any, shape: str) -> _operand.Operand:
    """*obj*'s operand, refused unless int32 (*shape*: the shape it must have, for the
    message)."""
    g = _operand.operand(obj)
    if g.dtype != DataType.INT32:
        got = dtype_name(g.dtype) if g.dtype else "an unsupported dtype"
        raise TypeError(f"{func}: {name} must be an int32 device array of shape {shape}, got {got}")
    return g


def _device(func: str, name: str, g: _operand.Operand, device: int) -> None:
    if g.device != device:
        raise ValueError(f"{func}: {name} is on device {g.device}, q on device {device}")


def layout_of(
    func: str, name: str, g: _operand.Operand, index: int, stage: list
) -> tuple[tuple[int, ...], int]:
    """*g*'s strides for the graph (a packed copy when its head dim is not contiguous)."""
    if g.strides[3] == 1 or g.shape[3] == 1:
        return tuple(g.strides), alignment_of(g.ptr)
    packed = _layout.packed_strides(tuple(g.shape))
    stage.append((index, g, packed))
    return packed, 16


def spec_like(g: _operand.Operand, shape: tuple[int, ...], dt: DataType) -> _call.OutputSpec:
    """A new output of *shape* packed in *g*'s stride order (a (B, S, H, D) q gives a
    (B, S, H, D) output)."""
    el = like_strides(shape, tuple(g.shape), tuple(g.strides))
    isz = itemsize(dt)
    return _call.OutputSpec(shape, numpy_dtype(dt), g.device, tuple(s * isz for s in el))


def output(
    func: str, o: Any, out: Any, shape: tuple[int, ...], gq: _operand.Operand, name: str = "out"
) -> tuple[_call.OutputSpec | None, int]:
    """The attention's output tensor *o* laid out as *out* (checked: *shape*, q's dtype and
    device, head dim contiguous; *name* in messages) or, *out* None, as a new array in q's
    memory order: ``(the new array's spec or None, the output's byte span)``."""
    dt = gq.dtype
    if out is not None:
        go = _checks.out_operand(func, out, shape, dt, gq.device, name=name)
        if go.strides[3] != 1:
            raise ValueError(
                f"{func}: {name}'s head dim must be contiguous (stride 1), got "
                f"strides {tuple(go.strides)}"
            )
        o.set_stride(tuple(max(s, 1) for s in go.strides)).set_alignment(alignment_of(go.ptr))
        return None, go.nbytes_span
    alloc = spec_like(gq, shape, dt)
    o.set_stride(alloc.element_strides)
    return alloc, alloc.nbytes_span


# ==================================================================================================
# The reader
# ==================================================================================================
def read(req: AttentionRequest) -> Checked:
    """*req* checked, in each layout's order: q, k, v; the page tables (paged); the saved
    operands (packed, before the options); the options; the saved operands (dense); the
    lengths; a given packed output."""
    func, layout = req.func, req.layout
    gq, gk, gv, dt, device = _qkv(func, layout, req.operands[:3])
    tables: tuple = ()
    if layout == PAGED:
        tables = _tables(func, req.tables, gq.shape[0], gk.shape[2], device)
    saved: tuple = ()
    if req.backward and layout == RAGGED:
        saved = _saved_packed(func, gq, gv, req.saved, dt, device)
        if req.lengths[1] == (1, 1):
            raise errors.NotSupportedError(
                3000,
                func,
                "cuDNN's attention backward does not run max_seqlen_q = max_seqlen_kv = 1",
            )
    _mask, is_causal, scale, dropout_p, _spec = req.options
    causal, sc, p = _options.options(func, is_causal, scale, dropout_p, gq.shape[-1])
    if req.backward and layout != RAGGED:
        if gq.shape[2] == 1 and gk.shape[2] == 1:
            raise errors.NotSupportedError(
                3000, func, "cuDNN's attention backward does not run S_q = S_kv = 1"
            )
        saved = _saved_dense(func, gq, gv, req.saved, dt, device)
    found: tuple = ()
    if layout in (PADDED, PAGED):
        found = _lengths(func, layout, req.lengths, gq.shape[0], device)
    out = None
    if layout == RAGGED and req.outs and req.outs[0] is not None:
        oshape = (gq.shape[0], gq.shape[1], gv.shape[2])
        out = _checks.out_operand(func, req.outs[0], oshape, dt, device)
        if out.strides[2] != 1 and oshape[2] > 1:
            raise ValueError(
                f"{func}: out's head dim must be contiguous (stride 1), got strides "
                f"{tuple(out.strides)}"
            )
    if layout == PAGED and causal and gq.shape[2] == 1:
        _needs(
            func,
            DECODE_MASK_VERSION,
            "is_causal=True with S_q = 1 (decode) needs cuDNN 9.10.0 or newer; the loaded cuDNN "
            "is {version} (the one query sees every key: pass is_causal=False)",
        )
    return Checked(req, gq, gk, gv, dt, device, causal, sc, p, saved, found, tables, out)


def _needs(func: str, least: int, why: str) -> None:
    """Refuse the call when the loaded cuDNN is older than *least* (*why*: the message, with
    ``{version}`` for the loaded one)."""
    version = _call.cudnn_version()
    if version < least:
        raise errors.NotSupportedError(3000, func, why.replace("{version}", str(version)))


def _dtype(func: str, named: list, hint: str) -> tuple[DataType, int]:
    """The operands' common dtype and device; float16 or bfloat16 (*hint*: what to do else)."""
    dt, device = _checks.same_dtype_and_device(func, named, ALL)
    if dt not in TYPES:
        raise errors.NotSupportedError(
            3000,
            func,
            f"cuDNN's fused attention runs float16 and bfloat16 only, got {dtype_name(dt)}{hint}",
        )
    return dt, device


def _dims(func: str, layout: str, name: str, g: _operand.Operand) -> None:
    """One operand's rank, strides and emptiness (4-D, or 3-D packed when *layout* is
    RAGGED; a paged cache's head dim contiguous, as it is never copied)."""
    if layout == RAGGED:
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
        return
    cache = layout == PAGED and name != "q"
    if len(g.shape) != 4:
        want = "(num_blocks, H_k, block_size, D)" if cache else "(B, H, S, D)"
        if layout == PAGED and not cache:
            want = "(B, H, S_q, D)"
        raise ValueError(f"{func}: {name} must have 4 dims {want}, got shape {tuple(g.shape)}")
    _checks.check_strides(func, name, g)
    if 0 in g.shape:
        raise ValueError(f"{func}: {name} has an empty dim {tuple(g.shape)}")
    if cache and g.strides[3] != 1:
        raise ValueError(
            f"{func}: {name}'s head dim must be contiguous (stride 1), got strides "
            f"{tuple(g.strides)} (a cache is never copied)"
        )


def _qkv(func: str, layout: str, operands: tuple) -> tuple:
    """q, k, v (or k_cache, v_cache) checked: ``(gq, gk, gv, dtype, device)``."""
    names = ("q", "k_cache", "v_cache") if layout == PAGED else ("q", "k", "v")
    gs = [_operand.operand(x) for x in operands]
    named = list(zip(names, gs, strict=True))
    hint = ": cast q, k, v (e.g. .to(torch.bfloat16))" if layout in (DENSE, PADDED) else ""
    dt, device = _dtype(func, named, hint)
    for name, g in named:
        _dims(func, layout, name, g)
    gq, gk, gv = gs
    hq, d = gq.shape[1], gq.shape[-1]
    hk, dk, dv = gk.shape[1], gk.shape[-1], gv.shape[-1]
    if layout == RAGGED:
        if gv.shape[0] != gk.shape[0] or gv.shape[1] != hk:
            raise ValueError(
                f"{func}: k {tuple(gk.shape)} and v {tuple(gv.shape)} must have the same tokens "
                "and heads"
            )
    elif layout == PAGED:
        if gk.shape[:3] != gv.shape[:3]:
            raise ValueError(
                f"{func}: k_cache {tuple(gk.shape)} and v_cache {tuple(gv.shape)} must have the "
                "same (num_blocks, H_k, block_size)"
            )
    else:
        if gk.shape[0] != gq.shape[0] or gv.shape[0] != gq.shape[0]:
            raise ValueError(
                f"{func}: q, k, v have different batch sizes: {tuple(gq.shape)}, "
                f"{tuple(gk.shape)}, {tuple(gv.shape)}"
            )
        if gv.shape[2] != gk.shape[2] or gv.shape[1] != hk:
            raise ValueError(
                f"{func}: k {tuple(gk.shape)} and v {tuple(gv.shape)} must have the "
                "same batch, heads and sequence length"
            )
    if layout == PAGED:
        check_heads(func, (d, dk, dv), (hq, hk), "k_cache's", "the caches'")
    else:
        check_heads(func, (d, dk, dv), (hq, hk))
    cap = check_gpu(func, device)
    if layout == RAGGED and cap is not None and cap < (9, 0):
        _needs(
            func,
            THD_ANY_GPU_VERSION,
            "packed variable-length attention (ragged offsets) needs an sm90 (Hopper) or newer "
            "GPU with cuDNN {version}, or cuDNN 9.18.1 or newer; "
            f"device {device} is sm{cap[0]}{cap[1]}",
        )
    return gq, gk, gv, dt, device


def _pair(func: str, named: tuple, shape: tuple, dt: DataType, device: int, unknown: str) -> None:
    """out and dout: *shape*, q's dtype (*unknown*: what an unsupported one reads as), q's
    device."""
    for name, g in named:
        if tuple(g.shape) != shape:
            raise ValueError(f"{func}: {name} must have shape {shape}, got {tuple(g.shape)}")
        if g.dtype != dt:
            got = dtype_name(g.dtype) if g.dtype else unknown
            raise TypeError(f"{func}: {name} is {got}, q is {dtype_name(dt)}")
        if g.device != device:
            raise ValueError(f"{func}: {name} is on device {g.device}, q on device {device}")


def _stats(func: str, gs: _operand.Operand, want: tuple, device: int, packed: bool) -> None:
    """The forward's statistics: float32 *want*, contiguous, aligned, on q's device."""
    if gs.dtype != DataType.FLOAT or tuple(gs.shape) != want:
        got = f"shape {tuple(gs.shape)}"
        if packed:
            dtn = dtype_name(gs.dtype) if gs.dtype else "an unsupported dtype"
            got = f"{dtn} {tuple(gs.shape)}"
        raise ValueError(
            f"{func}: stats must be the forward's float32 {want} statistics, got {got}"
        )
    if not _layout.matches(want, gs.strides, _layout.packed_strides(want)):
        raise ValueError(f"{func}: stats must be contiguous, got strides {tuple(gs.strides)}")
    _checks.check_aligned(func, "stats", gs)
    if gs.device != device:
        raise ValueError(f"{func}: stats is on device {gs.device}, q on device {device}")


def _saved_dense(func: str, gq: Any, gv: Any, saved: tuple, dt: DataType, device: int) -> tuple:
    """A dense backward's out, dout and statistics checked: ``(go, gdo, gs)``."""
    b, hq, sq, _d = gq.shape
    go, gdo = _operand.operand(saved[0]), _operand.operand(saved[1])
    for name, g in (("out", go), ("dout", gdo)):
        _pair(func, ((name, g),), (b, hq, sq, gv.shape[3]), dt, device, "?")
        _checks.check_strides(func, name, g)
    gs = _operand.operand(saved[2])
    _stats(func, gs, (b, hq, sq, 1), device, False)
    return go, gdo, gs


def _saved_packed(func: str, gq: Any, gv: Any, saved: tuple, dt: DataType, device: int) -> tuple:
    """A packed backward's out, dout and statistics checked: ``(go, gdo, gs)``."""
    tq, hq, _d = gq.shape
    go, gdo = (_operand.operand(x) for x in saved[:2])
    named = (("out", go), ("dout", gdo))
    _dtype(func, list(named), "")
    for name, g in named:
        _dims(func, RAGGED, name, g)
    _pair(func, named, (tq, hq, gv.shape[2]), dt, device, "None")
    gs = _operand.operand(saved[2])
    _stats(func, gs, (tq, hq, 1), device, True)
    return go, gdo, gs


def _lengths(func: str, layout: str, given: tuple, b: int, device: int) -> tuple:
    """The per-batch lengths ``(q's, kv's)``: both or neither (padded), kv's required
    (paged)."""
    if layout == PADDED and (given[0] is None) != (given[1] is None):
        raise ValueError(f"{func}: give both seq_lens_q and seq_lens_kv (or neither)")
    return (
        lens(func, "seq_lens_q", given[0], b, device),
        lens(func, "seq_lens_kv", given[1], b, device),
    )


def _table(func: str, name: str, obj: Any, b: int, device: int) -> _operand.Operand:
    """A page table: int32 ``(B, pages per sequence)`` on *device*, any positive strides."""
    g = _int32(func, name, obj, f"({b}, pages per sequence)")
    if len(g.shape) != 2 or g.shape[0] != b or g.shape[1] == 0:
        raise ValueError(
            f"{func}: {name} must have shape ({b}, pages per sequence), got {tuple(g.shape)}"
        )
    _device(func, name, g, device)
    _checks.check_strides(func, name, g)
    return g


def _tables(func: str, given: tuple, b: int, block: int, device: int) -> tuple:
    """The page tables and the bound of the keys they serve: ``(k's, v's, max_seqlen_kv)``
    (*max_seqlen_kv* None: every page of the narrower table)."""
    table, table_v, value = given
    gt = _table(func, "page_table", table, b, device)
    gtv = gt if table_v is None else _table(func, "page_table_v", table_v, b, device)
    pages = min(gt.shape[1], gtv.shape[1])
    most = pages * block
    if value is None:
        return gt, gtv, most
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise ValueError(
            f"{func}: max_seqlen_kv must be an int in [1, {most}] (pages per sequence {pages} "
            f"* block_size {block}), got {value!r}"
        )
    return gt, gtv, value
