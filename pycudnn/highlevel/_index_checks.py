"""Opt-in checks of the index data attention reads on the device: page tables and sequence
lengths (``pycudnn.config.check_indices``, or ``check_indices=`` per call).

cuDNN reads a paged cache's page table and the padding mask's lengths on the device and checks
none of them: an entry outside ``[0, num_blocks)`` within a sequence's length reads outside the
cache (a silent finite result in the GPU tests), and a length beyond the cache or the sequence
dim is read as it is. flash-attn (``flash_attn_with_kvcache``'s ``block_table`` and
``cache_seqlens``) and vLLM leave them unchecked for the same reason: checking costs a copy to
the host and a synchronisation of the stream per call. pycudnn does the same by default; with
the check on, each call copies the tables and lengths to the host on its stream (the work
queued before it finishes first) and refuses, before the launch, a length outside
``[0, bound]`` or a page a sequence uses that names no block, naming the argument, the
sequence, the page and the value. Only the pages a sequence's length reaches are checked (the
rest of a table row is never read: vLLM pads its block tables).

Shapes and dtypes are the call's own checks; this module checks values only, and leaves an
operand it cannot read as an int32 array of the expected shape to them (they raise first).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import memory
from .._config import parse_bool
from ..enums import DataType
from . import _call, _operand

__all__ = ["check_dense", "check_lengths", "check_paged", "enabled"]


def enabled(func: str, value: Any) -> bool:
    """Whether to check: *value* (a call's ``check_indices``), or the config flag when None."""
    if value is None:
        return _call.snapshot().check_indices
    return parse_bool(value, func, "check_indices")


def _ints(obj: Any, shape: tuple[int, ...], stream: Any) -> np.ndarray | None:
    """*obj* read back to the host as int64 when it is an int32 device array of *shape* (None:
    leave it to the call's own checks)."""
    try:
        g = _operand.operand(obj)
    except (TypeError, ValueError):
        return None
    if g.dtype != DataType.INT32 or tuple(g.shape) != shape:
        return None
    host = memory.asarray(obj).get(stream)  # waits for the stream's queued work and the copy
    return np.asarray(host).astype(np.int64, copy=False)


def check_lengths(
    func: str, name: str, obj: Any, b: int, bound: int, what: str, stream: Any
) -> np.ndarray | None:
    """The int32 ``(B,)`` lengths *obj* (None: not given) within ``[0, bound]``; returned as
    int64 host values (None when not read)."""
    if obj is None:
        return None
    lens = _ints(obj, (b,), stream)
    if lens is None:
        return None
    bad = np.flatnonzero((lens < 0) | (lens > bound))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{func}: {name}[{i}] = {int(lens[i])} is outside [0, {bound}] ({what}); "
            f"{bad.size} of {b} sequences are (check_indices)"
        )
    return lens


def _four_dims(q: Any, k: Any) -> tuple | None:
    """q's and k's operands when both read as 4-D arrays, else None (the call's own checks
    name the problem)."""
    try:
        gq, gk = _operand.operand(q), _operand.operand(k)
    except (TypeError, ValueError):
        return None
    if len(gq.shape) != 4 or len(gk.shape) != 4:
        return None
    return gq, gk


def check_dense(func: str, q: Any, k: Any, lens: tuple[Any, Any], stream: Any) -> None:
    """A dense attention's padding lengths (``seq_lens_q`` within S_q, ``seq_lens_kv`` within
    S_kv), read back to the host (shapes and dtypes are the call's own checks)."""
    both = _four_dims(q, k)
    if both is None:
        return
    gq, gk = both
    b, sq, skv = gq.shape[0], gq.shape[2], gk.shape[2]
    check_lengths(func, "seq_lens_q", lens[0], b, sq, f"S_q = {sq}", stream)
    check_lengths(func, "seq_lens_kv", lens[1], b, skv, f"S_kv = {skv}", stream)


def check_paged(
    func: str,
    q: Any,
    k_cache: Any,
    tables: tuple[tuple[str, Any], ...],
    lens: tuple[Any, Any],
    max_seqlen_kv: Any,
    stream: Any,
) -> None:
    """A paged attention's lengths (``seq_lens_q`` within S_q, ``seq_lens_kv`` within the
    cache a sequence can address) and the pages they use, in each of *tables* (``(name,
    array)``), within the cache's blocks."""
    both = _four_dims(q, k_cache)
    if both is None:
        return
    gq, gk = both
    b, sq = gq.shape[0], gq.shape[2]
    num_blocks, block = gk.shape[0], gk.shape[2]
    widths = []
    for _name, t in tables:
        try:
            gt = _operand.operand(t)
        except (TypeError, ValueError):
            return
        if len(gt.shape) != 2 or gt.shape[0] != b:
            return
        widths.append(gt.shape[1])
    most = min(widths) * block
    max_s = most if max_seqlen_kv is None else max_seqlen_kv
    if isinstance(max_s, bool) or not isinstance(max_s, int) or not 1 <= max_s <= most:
        return  # the call refuses max_seqlen_kv itself
    check_lengths(func, "seq_lens_q", lens[0], b, sq, f"S_q = {sq} queries", stream)
    what = f"max_seqlen_kv = {max_s}: the keys the graph reads"
    lens_kv = check_lengths(func, "seq_lens_kv", lens[1], b, max_s, what, stream)
    if lens_kv is None:
        return
    used = -(-lens_kv // block)  # pages each sequence's length reaches
    for (name, t), width in zip(tables, widths, strict=True):
        table = _ints(t, (b, width), stream)
        if table is None:
            return
        reached = np.arange(width)[None, :] < used[:, None]
        bad = np.argwhere(reached & ((table < 0) | (table >= num_blocks)))
        if bad.size:
            s, p = (int(v) for v in bad[0])
            raise ValueError(
                f"{func}: {name}[{s}, {p}] = {int(table[s, p])} is not a block of the cache "
                f"[0, {num_blocks}) (sequence {s}'s {int(lens_kv[s])} keys use its first "
                f"{int(used[s])} pages of {block} tokens); {len(bad)} such entries "
                "(check_indices)"
            )
