"""The cumulative sequence lengths of packed attention (the ragged layout): checked on the host
before any C call, then the sequence lengths and the element offsets cuDNN reads uploaded once
per content.

``cu_seqlens`` are ``B + 1`` token counts ``[0, s_0, s_0 + s_1, ..., total]``; cuDNN wants the
lengths ``s_b`` (int32, the padding mask) and, per packed tensor, the *element* offset of each
batch's first row: ``cu_seqlens * token stride`` (a tensor's token stride is ``H * D`` when
packed; the statistics' is ``H``). Tensors with the same side (q or kv) and token stride share
one offset array.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ... import errors, memory
from ..._types import dtype_name
from ...enums import DataType
from ...graph import _plans
from .. import _operand

__all__ = [
    "UPLOADS_SIZE",
    "Packing",
    "distinct",
    "max_len",
    "offsets_dtype",
    "offsets_type",
    "packing",
    "shapes",
    "token_strides",
    "upload",
]


# ==================================================================================================
class Packing(NamedTuple):
    """The checked cumulative lengths of q and kv (int64 host arrays of B + 1 values) and
    their content (the key of the upload)."""

    cu_q: np.ndarray
    cu_kv: np.ndarray
    content: tuple


def _host_lengths(func: str, name: str, obj: Any, device: int, stream: Any) -> np.ndarray:
    """*obj* (a host sequence of ints, an integer host array, or an int32 device array of
    shape (B + 1,)) as an int64 host array; a device array is read back (synchronising)."""
    host = None
    if isinstance(obj, (list, tuple)):
        for v in obj:
            if isinstance(v, bool) or not hasattr(v, "__index__"):
                raise TypeError(f"{func}: {name} must hold ints, got {v!r} in {obj!r}")
        host = np.array([operator.index(v) for v in obj], np.int64)
    elif not isinstance(obj, np.ndarray):
        try:
            g = _operand.operand(obj)
        except errors.NotDeviceMemoryError:  # a host array of another kind (a CPU tensor)
            obj = np.asarray(obj)
        else:
            if g.dtype != DataType.INT32:
                got = "an unsupported dtype" if g.dtype is None else dtype_name(g.dtype)
                raise TypeError(f"{func}: {name} must be an int32 device array, got {got}")
            if g.device != device:
                raise ValueError(f"{func}: {name} is on device {g.device}, q on device {device}")
            if len(g.shape) != 1:
                raise ValueError(f"{func}: {name} must have shape (B + 1,), got {tuple(g.shape)}")
            host = np.asarray(memory.asarray(obj).get(stream))  # synchronises the stream
    if host is None:
        if obj.dtype.kind not in "iu":
            raise TypeError(f"{func}: {name} must hold integers, got dtype {obj.dtype}")
        host = obj
    if host.ndim != 1 or host.shape[0] < 2:
        raise ValueError(
            f"{func}: {name} must be 1-D with B + 1 >= 2 values, got shape {host.shape}"
        )
    return host.astype(np.int64, copy=False)


def _check_lengths(func: str, name: str, cu: np.ndarray, total: int, max_len: int) -> None:
    """*cu* starts at 0, ends at *total*, and each sequence has 1 to *max_len* tokens."""
    side = name.removeprefix("cu_seqlens_")
    tokens = "q.shape[0]" if side == "q" else "k.shape[0]"
    if cu[0] != 0:
        raise ValueError(f"{func}: {name} must start at 0, got {int(cu[0])}")
    if cu[-1] != total:
        raise ValueError(
            f"{func}: {name} must end at the total number of tokens {total} ({tokens}), "
            f"got {int(cu[-1])}"
        )
    lens = np.diff(cu)
    bad = np.flatnonzero(lens < 1)
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{func}: {name} must increase (every sequence has at least one token): "
            f"{name}[{i + 1}] - {name}[{i}] = {int(lens[i])}"
        )
    longest = int(lens.max())
    if longest > max_len:
        i = int(np.argmax(lens))
        raise ValueError(
            f"{func}: sequence {i} has {longest} tokens ({name}), more than max_seqlen_{side}="
            f"{max_len}"
        )


def max_len(func: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__") or operator.index(value) < 1:
        raise ValueError(f"{func}: {name} must be an int >= 1, got {value!r}")
    return operator.index(value)


_INT = {int}
#: checked lengths given as lists or tuples of ints, by content: a training loop that repeats
#: its batches' lengths skips the checks (tens of microseconds of NumPy calls); a host cache of
#: the registry (bounded, emptied by clear_caches(), counted by cache_info())
CHECKED_SIZE = 256
_CHECKED = _plans.host_cache("checked_lengths", CHECKED_SIZE)


def _plain(seq: Any) -> tuple | None:
    """*seq* as a tuple when it is a list or tuple of exact ints (``True`` hashes as ``1``: a
    boolean's spelling must not be served a valid entry), else None."""
    if type(seq) not in (list, tuple):
        return None
    t = tuple(seq)
    return t if set(map(type, t)) == _INT else None


def packing(func: str, cu: tuple[Any, Any], totals: tuple, maxes: tuple, where: tuple) -> Packing:
    """The cumulative lengths checked against the total tokens and the maximum lengths
    (*where*: ``(device, stream)`` for a device array's read)."""
    tq, tkv = _plain(cu[0]), _plain(cu[1])
    memo = None if tq is None or tkv is None else (tq, tkv, totals, maxes)
    if memo is not None:
        hit = _CHECKED.lookup(memo)
        if hit is not None:
            return hit
    p = _checked(func, cu, totals, maxes, where)
    if memo is not None:
        _CHECKED.put(memo, p)
    return p


def _checked(func: str, cu: tuple[Any, Any], totals: tuple, maxes: tuple, where: tuple) -> Packing:
    cu_q = _host_lengths(func, "cu_seqlens_q", cu[0], *where)
    cu_kv = _host_lengths(func, "cu_seqlens_kv", cu[1], *where)
    if cu_q.shape != cu_kv.shape:
        raise ValueError(
            f"{func}: cu_seqlens_q and cu_seqlens_kv must both have B + 1 values, got "
            f"{cu_q.shape[0]} and {cu_kv.shape[0]}"
        )
    _check_lengths(func, "cu_seqlens_q", cu_q, totals[0], maxes[0])
    _check_lengths(func, "cu_seqlens_kv", cu_kv, totals[1], maxes[1])
    return Packing(cu_q, cu_kv, (cu_q.tobytes(), cu_kv.tobytes()))


#: the uploaded lengths and offsets, by device and content (the graph reads them): in the registry
#: (cleared by ``clear_caches()``, counted by ``cache_info()``), bounded
UPLOADS_SIZE = 256


def offsets_dtype(strides: Sequence[tuple[int, int]], totals: tuple[int, int]) -> type:
    """int32 offsets when every one fits (torch's choice), else int64."""
    top = max(totals[side] * stride for side, stride in strides)
    return np.int32 if top < 2**31 else np.int64


def upload(p: Packing, strides: tuple, device: int, stream: Any) -> tuple[int, ...]:
    """Device pointers of the sequence lengths of q and kv (int32, B each), then of one offset
    array (B + 1 values) per ``(side, token stride)`` of *strides* (side 0: q, 1: kv); uploaded
    once per content and kept (one buffer, each part 16-byte aligned)."""
    totals = (int(p.cu_q[-1]), int(p.cu_kv[-1]))
    odt = offsets_dtype(strides, totals)
    key = (device, p.content, strides, odt)
    cache = _plans.device_cache("cu_seqlens", UPLOADS_SIZE)
    hit = cache.get(key)
    if hit is not None:
        return hit[1]
    cus = (p.cu_q, p.cu_kv)
    parts = [np.diff(p.cu_q).astype(np.int32), np.diff(p.cu_kv).astype(np.int32)]
    parts += [(cus[side] * stride).astype(odt) for side, stride in strides]
    blob = bytearray()
    where = []
    for a in parts:
        where.append(len(blob))
        blob += a.tobytes()
        blob += bytes(-len(blob) % 16)
    buf = memory.to_device(np.frombuffer(bytes(blob), np.uint8), stream, device=device)
    buf.synchronize()  # the host bytes are temporary; the graph reads them on any stream
    ptrs = tuple(buf.ptr + w for w in where)
    cache.put(key, (buf, ptrs))
    return ptrs


def offsets_type(pairs: tuple, totals: tuple[int, int]) -> DataType:
    """The graph's data type of the offsets :func:`upload` lays out for *pairs*."""
    return DataType.INT32 if offsets_dtype(pairs, totals) is np.int32 else DataType.INT64


# -- the call key's part (the hot path) ------------------------------------------------------------
def shapes(func: str, named: Sequence[tuple[str, tuple]]) -> list[tuple[int, ...]]:
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


def token_strides(keys: Sequence[tuple], sides: Sequence[int]) -> tuple:
    """``(side, token stride)`` of each ragged operand, in order, as its key says."""
    return tuple((side, int(k[1][0])) for k, side in zip(keys, sides, strict=True))


def distinct(roles: tuple) -> tuple:
    """The distinct ``(side, token stride)`` pairs of *roles*, in first-seen order."""
    return tuple(dict.fromkeys(roles))
