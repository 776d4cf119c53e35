"""Paged KV caches: cuDNN's paged cache load, which gathers each sequence's keys or values out of
fixed-size blocks (pages) addressed by a per-sequence page table -- the vLLM/FlashInfer cache
layout -- in front of the attention's ``Q K^T`` and ``P V`` matmuls (cudnn-frontend's
``PagedCacheLoadNode``, used by its SDPA node when given ``paged_attention_k_table`` /
``paged_attention_v_table``; our notes are in ``docs/graph.md``).

Operands::

    container   (num_blocks, H_k, block_size, D)   the cache: any strides, D contiguous
    page_table  (B, 1, ceil(max_s_kv / block_size), 1) int32: block index of each page
    seq_len_kv  (B, 1, 1, 1) int32                  (the padding mask's: required)
    y           (B, H_k, max_s_kv, D)               virtual; K's is read transposed (K^T)

Token ``t`` of sequence ``b`` lives in block ``page_table[b, 0, t // block_size, 0]`` at row
``t % block_size``. Keys past ``seq_len_kv[b]`` are masked, so their pages are never read; the
table's entries are not checked on the device (an index outside the container reads outside it).
Forward only: cuDNN has no paged backward.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ... import _layout, errors
from ...enums import BackendDescriptorType as D
from ...enums import DataType
from .._tensor import GraphBase, Tensor, check_type, own_or_io_type
from ._base import NodeKind, cudnn_version

__all__ = ["KINDS", "PAGED_VERSION", "Paged", "prepare", "record"]

#: the first cuDNN with the paged cache load (cudnn-frontend's check)
PAGED_VERSION = 90500
#: head dims over 128 with a paged cache: cuDNN 9.10 and newer (9.9 and older refuse them)
_PAGED_WIDE_HEADS = 91000


class Paged(NamedTuple):
    """``Graph.sdpa``'s paged-cache options as given (any may be None)."""

    k_table: Any = None
    v_table: Any = None
    max_seq_len_kv: Any = None


class Load(NamedTuple):
    """One paged cache load, checked and ready to record."""

    container: Tensor
    table: Tensor
    y: Tensor


def _unsupported(where: str, what: str, version: int) -> errors.NotSupportedError:
    need = f"{version // 10000}.{version // 100 % 100}.{version % 100}"
    return errors.NotSupportedError(
        3000, where, f"{what} needs cuDNN {need} or newer; the loaded cuDNN is {cudnn_version()}"
    )


def _max_len(where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"{where}: paged_attention_max_seq_len_kv must be an int >= 1 (the longest key "
            f"sequence), got {value!r}"
        )
    return value


def _container(g: GraphBase, op: str, nm: str, t: Any) -> Tensor:
    t = g._check(op, nm, t)
    if len(t.dim) != 4:
        raise ValueError(
            f"{g.name}.{op}: a paged {nm} is the cache container (num_blocks, H_k, block_size, "
            f"D), 4 dims; got {t.dim}"
        )
    if t.stride[3] != 1:
        raise ValueError(
            f"{g.name}.{op}: {nm}'s last dim (D) must have stride 1, got strides {t.stride}"
        )
    return t


def _table(g: GraphBase, op: str, nm: str, t: Any, b: int, width: int) -> Tensor:
    t = g._check(op, nm, t)
    if t.dim != (b, 1, width, 1):
        raise ValueError(
            f"{g.name}.{op}: {nm} must have dims ({b}, 1, {width}, 1) (B, 1, ceil("
            f"max_seq_len_kv / block_size), 1), got {t.dim}"
        )
    check_type(f"{g.name}.{op}", nm, t, (DataType.INT32,))
    return t


def prepare(g: GraphBase, op: str, qkv: tuple, o: Any, name: str) -> tuple[tuple, tuple]:
    """``(qkv, loads)``: with a page table for k and/or v (``o.paged``: a :class:`Paged`'s
    fields), that operand replaced by the virtual tensor its load yields, ``(B, H_k,
    max_seq_len_kv, D)``; *loads* are recorded by :func:`record` once the attention's own
    checks passed. Without a table, *qkv* as given and no loads."""
    p = Paged(*o.paged) if o.paged is not None else None
    if p is None or (p.k_table is None and p.v_table is None):
        if p is not None and p.max_seq_len_kv is not None:
            raise ValueError(
                f"{g.name}.{op}: paged_attention_max_seq_len_kv needs a page table "
                "(paged_attention_k_table and/or paged_attention_v_table)"
            )
        return qkv, ()
    where = f"{g.name}.{op}"
    if cudnn_version() < PAGED_VERSION:
        what = "a paged KV cache (paged_attention_k_table/v_table)"
        raise _unsupported(where, what, PAGED_VERSION)
    if o.seq_len_q is None or o.seq_len_kv is None:
        raise ValueError(
            f"{where}: a paged KV cache needs seq_len_q and seq_len_kv (cuDNN reads each "
            "sequence's length from them; its padding mask is required)"
        )
    max_s = _max_len(where, p.max_seq_len_kv)
    q = g._check(op, "q", qkv[0])
    if len(q.dim) != 4:
        raise ValueError(f"{where}: q must have 4 dims (B, H, S, D), got {q.dim}")
    b = q.dim[0]
    out = list(qkv)
    loads = []
    for i, nm, table in ((1, "k", p.k_table), (2, "v", p.v_table)):
        if table is None:
            t = g._check(op, nm, qkv[i])
            if len(t.dim) == 4 and t.dim[2] != max_s:
                raise ValueError(
                    f"{where}: {nm} is not paged, so its sequence length ({t.dim[2]}) must "
                    f"equal paged_attention_max_seq_len_kv ({max_s})"
                )
            continue
        c = _container(g, op, nm, qkv[i])
        _n, hk, block, d = c.dim
        if d > 128 and cudnn_version() < _PAGED_WIDE_HEADS:
            raise _unsupported(where, f"a paged {nm} with head dim {d} > 128", _PAGED_WIDE_HEADS)
        width = -(-max_s // block)
        tab = _table(g, op, f"paged_attention_{nm}_table", table, b, width)
        dim = (b, hk, max_s, d)
        dt = own_or_io_type(c)
        if dt is None:
            raise ValueError(f"{where}: a paged {nm} needs a data type (its own or the graph's io)")
        layout = (dim, _layout.packed_strides(dim), dt)
        y = g._new(f"{name}::paged_{nm}", layout, True, producer="paged_cache_load")
        out[i] = y
        loads.append(Load(c, tab, y))
    return tuple(out), tuple(loads)


def record(g: GraphBase, loads: tuple, seq_kv: Tensor) -> None:
    """The paged cache loads of :func:`prepare` as nodes (inputs first)."""
    for ld in loads:
        roles = [
            ("OPERATION_PAGED_CACHE_LOAD_CONTAINER_DESC", ld.container),
            ("OPERATION_PAGED_CACHE_LOAD_SEQUENCE_DESC", seq_kv),
            ("OPERATION_PAGED_CACHE_LOAD_PAGE_TABLE_DESC", ld.table),
            ("OPERATION_PAGED_CACHE_LOAD_YDESC", ld.y),
        ]
        g._node("paged_cache_load", f"{ld.y.name}::load", {}, roles)


KINDS = {"paged_cache_load": NodeKind(D.OPERATION_PAGED_CACHE_LOAD_DESCRIPTOR, None)}
