"""Scratch tensors carved from a plan's workspace.

Some builder graphs need device buffers that no caller provides: the float32 ``softmax_sum``
and the dQ accumulator of the attention backward, for instance. They are declared as *scratch*
tensors of the graph and placed after the engine's own workspace, each at a 256-byte boundary,
so that one workspace allocation serves the engine and the scratch alike. Tensors marked
``scratch == "zero"`` are zeroed (stream-ordered) before each run.

A scratch tensor is anything with ``dim``, ``stride``, ``data_type`` and ``scratch`` (the
builder's ``TensorSpec``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import _cuda, _layout
from .._types import itemsize
from ..enums import DataType

__all__ = ["fill_scratch", "workspace_layout"]

_ALIGN = 256  # bytes between scratch tensors (cudaMalloc's alignment)


def _nbytes(spec: Any) -> int:
    return _layout.span(spec.dim, spec.stride) * itemsize(DataType(spec.data_type))


def workspace_layout(engine_ws: int, scratch: Sequence[Any]) -> tuple[int, list[int]]:
    """``(total bytes, offset of each scratch tensor)``: the engine's workspace first, each
    scratch tensor after it at a 256-byte boundary."""
    off = -(-engine_ws // _ALIGN) * _ALIGN
    offsets = []
    for spec in scratch:
        offsets.append(off)
        off += -(-_nbytes(spec) // _ALIGN) * _ALIGN
    return (off if scratch else engine_ws), offsets


def fill_scratch(
    scratch: Sequence[Any], ptrs: list[int], wsp: int, offsets: Sequence[int], stream: int
) -> None:
    """Point the scratch slots of *ptrs* (its last ``len(scratch)`` entries) into the workspace
    at *wsp*; zero those that must start at zero (stream-ordered)."""
    if not scratch:
        return
    first = len(ptrs) - len(scratch)
    rt = None
    for i, (spec, off) in enumerate(zip(scratch, offsets, strict=True)):
        ptrs[first + i] = wsp + off
        if spec.scratch == "zero":
            rt = rt or _cuda.runtime()
            _cuda.check(rt.cudaMemsetAsync(wsp + off, 0, _nbytes(spec), stream), "cudaMemsetAsync")
