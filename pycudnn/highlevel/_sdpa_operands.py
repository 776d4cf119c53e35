"""What the attention calls (:mod:`.sdpa`, :mod:`.sdpa_paged`) share in reading their operands:
the per-batch sequence lengths, q's layout for the graph (a packed copy when its head dim is not
contiguous) and an output packed in q's memory order."""

from __future__ import annotations

from typing import Any

from .. import _layout
from .._types import dtype_name, itemsize, numpy_dtype
from ..enums import DataType
from ..graph._tensor import alignment_of, like_strides
from . import _call, _checks, _operand

__all__ = ["layout_of", "lens", "output", "spec_like"]


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
    func: str, o: Any, out: Any, shape: tuple[int, ...], gq: _operand.Operand
) -> tuple[_call.OutputSpec | None, int]:
    """The attention's output tensor *o* laid out as *out* (checked: *shape*, q's dtype and
    device, head dim contiguous) or, *out* None, as a new array in q's memory order:
    ``(the new array's spec or None, the output's byte span)``."""
    dt = gq.dtype
    if out is not None:
        go = _checks.out_operand(func, out, shape, dt, gq.device)
        if go.strides[3] != 1:
            raise ValueError(
                f"{func}: out's head dim must be contiguous (stride 1), got "
                f"strides {tuple(go.strides)}"
            )
        o.set_stride(tuple(max(s, 1) for s in go.strides)).set_alignment(alignment_of(go.ptr))
        return None, go.nbytes_span
    alloc = spec_like(gq, shape, dt)
    o.set_stride(alloc.element_strides)
    return alloc, alloc.nbytes_span
