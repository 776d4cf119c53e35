"""Layouts the legacy C calls can take: descriptors cached per layout, and staging.

cuDNN's legacy calls read packed NCHW or NHWC operands best, and some read nothing else. A call's
builder describes its operands with :func:`tensor_descriptor` (one per thread and layout) and
plans, with :func:`packed_operands`, which operands go through packed copies (a :class:`Stage`,
run by :meth:`._call.Call.run` around the launch).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

from .. import _layout, memory
from .._types import itemsize, numpy_dtype
from ..descriptors import TensorDescriptor
from ..enums import DataType
from ..graph import _plans
from . import _call
from ._checks import check_strides
from ._operand import Operand

__all__ = [
    "Packed",
    "Stage",
    "channels_last",
    "packed_operands",
    "padded",
    "same_layout",
    "tensor_desc",
    "tensor_descriptor",
]


_descs = threading.local()


def tensor_descriptor(shape: Sequence[int], strides: Sequence[int], dt: DataType) -> Any:
    """A ``TensorDescriptor`` of (*shape*, element *strides*, *dt*), one per thread and layout.

    Size-1 dimensions may carry any stride (or 0): they are given stride 1, which cuDNN accepts.
    """
    key = (tuple(shape), tuple(strides), dt)
    cache = getattr(_descs, "cache", None)
    if cache is None:
        cache = _descs.cache = _plans.new_lru(owns=False)
    d = cache.get(key)
    if d is None:
        fixed = tuple(st if s > 1 else max(st, 1) for s, st in zip(shape, strides, strict=True))
        d = TensorDescriptor(tuple(shape), dt, fixed)
        cache.put(key, d)
    return d


class Stage:
    """Copies around a C call for operands whose strides it cannot take: inputs are copied into
    packed buffers before the call; a staged output is computed into a packed buffer and then
    written into ``out`` with ``alpha``/``beta`` (``cudnnTransformTensor``)."""

    __slots__ = ("inputs", "output", "scales", "transform")

    def __init__(
        self,
        dt: DataType,
        inputs: list[tuple[int, Operand, tuple[int, ...]]],
        output: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None,
        alpha: float,
        beta: float,
    ):
        """*inputs*: ``(index, operand, packed strides)``; *output*: ``(shape, its strides,
        packed strides)`` (element strides)."""
        isz = itemsize(dt)
        npdt = numpy_dtype(dt)
        self.inputs = [
            (
                i,
                g.shape,
                npdt,
                tuple(s * isz for s in packed),
                tensor_descriptor(g.shape, g.strides, dt),
                tensor_descriptor(g.shape, packed, dt),
            )
            for i, g, packed in inputs
        ]
        self.output = None
        if output is not None:
            shape, strides, packed = output
            self.output = (
                shape,
                npdt,
                tuple(s * isz for s in packed),
                tensor_descriptor(shape, packed, dt),
                tensor_descriptor(shape, strides, dt),
            )
        self.scales = _call.scales(dt, 1.0, 0.0, alpha, beta)
        self.transform = _call.quiet("cudnnTransformTensor")

    def before(self, h: Any, ptrs: list[int], keep: list) -> int | None:
        """Copy the staged inputs; replace their pointers in *ptrs* (a list indexed like the
        operands, the output last); return the real output pointer when it is staged."""
        one, zero = self.scales[0], self.scales[1]
        device, stream = h.device, h.stream
        for idx, shape, npdt, strides, src, dst in self.inputs:
            tmp = memory.empty(shape, npdt, device, stream, strides=strides)
            self.transform(
                h.ptr, ctypes.byref(one), src, ptrs[idx], ctypes.byref(zero), dst, tmp.ptr
            )
            keep.append(tmp)  # freed stream-ordered, after the call was queued
            ptrs[idx] = tmp.ptr
        if self.output is None:
            return None
        shape, npdt, strides, _src, _dst = self.output
        final = memory.empty(shape, npdt, device, stream, strides=strides)
        keep.append(final)
        real_out, ptrs[-1] = ptrs[-1], final.ptr
        return real_out

    def after(self, h: Any, ptrs: list[int], real_out: int | None) -> None:
        """Write a staged output into ``out`` (``alpha * result + beta * out``)."""
        if real_out is None:
            return
        _shape, _npdt, _strides, src, dst = self.output
        alpha, beta = self.scales[2], self.scales[3]
        self.transform(h.ptr, ctypes.byref(alpha), src, ptrs[-1], ctypes.byref(beta), dst, real_out)


def padded(
    shape: Sequence[int], strides: Sequence[int], rank: int = 4
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """*shape*/*strides* with trailing size-1 dims up to *rank* (cuDNN's legacy descriptors take
    3 to 8 dims; element-wise operations do not care how many)."""
    extra = max(rank - len(shape), 0)
    return tuple(shape) + (1,) * extra, tuple(strides) + (1,) * extra


class Packed(NamedTuple):
    """How a legacy call sees its operands: descriptors (inputs in order, then the output when
    there is one), the staging of the operands that are not packed, and the new output's spec."""

    descs: tuple
    stage: Stage | None
    spec: _call.OutputSpec | None


def channels_last(g: Operand) -> bool:
    """*g* is unambiguously packed channels-last (NHWC / NDHWC)."""
    nchw, nhwc = _layout.layout_of(g.shape, g.strides)
    return nhwc and not nchw


def packed_operands(
    dt: DataType,
    inputs: Sequence[Operand],
    out: Operand | None,
    out_shape: Sequence[int] | None,
    nhwc: bool,
    alpha: float = 1.0,
    beta: float = 0.0,
    first: int = 0,
) -> Packed:
    """Descriptors of *inputs* (and of the output of *out_shape*, unless it is None) packed NCHW
    (or channels-last with *nhwc*); inputs and a given *out* with other strides are staged through
    packed copies. *first* is the index of ``inputs[0]`` in the call's pointer list (the output
    is last); *alpha*/*beta* blend a staged output into *out*. All operands have dtype *dt*.

    A new output (``out is None``) gets :attr:`Packed.spec`, packed in that layout.
    """
    staged, descs = [], []
    for i, g in enumerate(inputs):
        can = _layout.packed_strides(g.shape, nhwc)
        if not _layout.matches(g.shape, g.strides, can):
            staged.append((first + i, g, can))
        descs.append(tensor_descriptor(g.shape, can, dt))
    staged_out = spec = None
    if out_shape is not None:
        can = _layout.packed_strides(out_shape, nhwc)
        if out is None:
            spec = _call.output_spec(out_shape, dt, inputs[0].device, nhwc)
        elif not _layout.matches(out.shape, out.strides, can):
            staged_out = (tuple(out_shape), tuple(out.strides), can)
        descs.append(tensor_descriptor(out_shape, can, dt))
    stage = Stage(dt, staged, staged_out, alpha, beta) if staged or staged_out else None
    return Packed(tuple(descs), stage, spec)


def tensor_desc(func: str, name: str, g: Operand, rank: int = 4) -> Any:
    """The (cached) descriptor of *g* after the stride checks, padded with trailing size-1 dims
    to *rank* (cuDNN's legacy descriptors take 3 to 8 dims); None for an empty *g* (nothing to
    compute, and cuDNN's descriptors take no 0-size dims)."""
    if len(g.shape) > 8:
        raise ValueError(f"{func}: {name} has {len(g.shape)} dims; cuDNN supports at most 8")
    check_strides(func, name, g)
    if 0 in g.shape:
        return None
    return tensor_descriptor(*padded(g.shape, g.strides, rank), g.dtype)


def same_layout(a: Operand, b: Operand) -> bool:
    """Same shape and strides (size-1 dimensions aside): one may be computed in place of the
    other."""
    return tuple(a.shape) == tuple(b.shape) and _layout.matches(a.shape, a.strides, b.strides)
