"""What the attention calls (:mod:`.sdpa`, :mod:`.sdpa_varlen`, :mod:`.sdpa_paged`) share in
reading their operands: the head checks of cuDNN's fused attention, the per-batch sequence
lengths, q's layout for the graph (a packed copy when its head dim is not contiguous) and an
output packed in q's memory order."""

from __future__ import annotations

from typing import Any

from .. import _layout, errors
from .._types import dtype_name, itemsize, numpy_dtype
from ..enums import DataType
from ..graph._tensor import alignment_of, like_strides
from . import _call, _checks, _graphops, _operand

__all__ = ["check_gpu", "check_heads", "layout_of", "lens", "output", "spec_like"]


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
    g = _operand.operand(obj)
    if g.dtype != DataType.INT32:
        raise TypeError(
            f"{func}: {name} must be an int32 device array of shape ({b},), got "
            f"{dtype_name(g.dtype) if g.dtype else 'an unsupported dtype'}"
        )
    if tuple(g.shape) not in ((b,), (b, 1, 1, 1)):
        raise ValueError(
            f"{func}: {name} must have shape ({b},) (one length per batch), got {tuple(g.shape)}"
        )
    if g.device != device:
        raise ValueError(f"{func}: {name} is on device {g.device}, q on device {device}")
    _checks.check_aligned(func, name, g)
    return g


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
