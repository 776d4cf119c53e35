"""What the high level's graph operations (:mod:`.matmul`, :mod:`.norms`, :mod:`.sdpa`) share:
their operands declared as builder tensors, the plan found under the operands' device, and the
call entry that runs it (:class:`._call.GraphCall`).

An operation module validates its arguments (before any C call), builds a
:class:`pycudnn.graph.Graph` whose real tensors are its operands and outputs, and hands it to
:func:`entry`, which plans it (cached per thread by the graph's structure) and returns the call
entry that ``_call.lookup`` caches under the call's key.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import _layout, errors, memory
from .._types import numpy_dtype
from ..enums import DataType
from ..graph import Graph, _plans
from ..graph._tensor import alignment_of
from . import _call, _checks, _operand, _staging

__all__ = ["capability", "column", "declare", "entry", "filled", "packed_output"]


def declare(
    g: Graph,
    name: str,
    o: _operand.Operand,
    shape: tuple[int, ...] | None = None,
    strides: tuple[int, ...] | None = None,
) -> Any:
    """*o* as a graph input named *name* (its shape/strides unless given; size-1 dims get a
    positive stride, which cuDNN requires)."""
    shape = tuple(o.shape) if shape is None else shape
    strides = tuple(o.strides) if strides is None else strides
    fixed = tuple(max(st, 1) for st in strides)
    return g.tensor(shape, fixed, o.dtype, name=name, alignment=alignment_of(o.ptr))


def column(g: Graph, name: str, rows: int, dt: DataType, ptr: int) -> Any:
    """A graph input of one value per row at *ptr*: a packed ``(rows, 1, 1, 1)`` tensor of *dt*
    (the norms' saved statistics, the attention's sequence lengths)."""
    return g.tensor((rows, 1, 1, 1), (1, 1, 1, 1), dt, name=name, alignment=alignment_of(ptr))


def packed_output(
    func: str, name: str, t: Any, a: Any, shape: tuple[int, ...], dt: DataType, device: int
) -> tuple[_call.OutputSpec | None, int]:
    """Graph output *t* of *shape* and *dt*, packed: a new array's spec, or the given array *a*
    (an ``out_*`` argument named *name*) checked -- shape, dtype, device, contiguous, aligned --
    with *t* aligned to it; ``(spec or None, byte span)``."""
    if a is None:
        spec = _call.output_spec(shape, dt, device)
        return spec, spec.nbytes_span
    o = _checks.out_operand(func, a, shape, dt, device, name=name)
    if not _layout.matches(o.shape, o.strides, _layout.packed_strides(shape)):
        raise ValueError(
            f"{func}: {name} must be contiguous {shape}, got strides {tuple(o.strides)}"
        )
    _checks.check_aligned(func, name, o)
    t.set_alignment(alignment_of(o.ptr))
    return None, o.nbytes_span


def entry(
    func: str,
    g: Graph,
    device: int,
    stream: Any,
    allocs: Sequence[_call.OutputSpec | None],
    spans: Sequence[int],
    *,
    what: str,
    stage: _staging.Stage | None = None,
    kind: type[_call.GraphCall] = _call.GraphCall,
) -> _call.GraphCall:
    """Plan *g* on *device* (its handle bound to *stream*) and make its call entry (a *kind*;
    *spans*: the inputs', then the outputs'). cuDNN having no engine becomes a
    ``NotSupportedError`` that names *what* was asked for."""
    h = _call.handle_for(device, stream, func)
    g._api = func
    g._label = what
    with _call.on_device(device):
        try:
            g.build(device=device)
        except errors.NotSupportedError as exc:
            raise errors.NotSupportedError(
                int(exc.status),
                func,
                f"cuDNN {_call.cudnn_version()} has no engine for {what} on this GPU "
                f"(compute capability {_capability(device)}): {exc.detail or exc}",
            ) from None
    return kind(func, h, tuple(allocs), tuple(spans), g, stage)


_CAPS: dict[int, tuple[int, int] | None] = {}


def capability(device: int) -> tuple[int, int] | None:
    """The GPU's compute capability (cached; None when CUDA cannot say)."""
    if device not in _CAPS:
        from .. import _cuda

        _CAPS[device] = next((g.capability for g in _cuda.devices()[0] if g.index == device), None)
    return _CAPS[device]


def _capability(device: int) -> str:
    cap = capability(device)
    return "unknown" if cap is None else f"{cap[0]}.{cap[1]}"


#: the filled vectors, by (n, dtype, device, value): in the registry (cleared by
#: ``clear_caches()``, counted by ``cache_info()``), bounded
FILLED_SIZE = 64


def filled(n: int, dt: DataType, device: int, value: float) -> memory.DeviceArray:
    """A cached device vector of *n* elements equal to *value* (a missing scale is ones, a
    missing bias zeros: cuDNN's norm operations need both; the paged attention's default
    query lengths)."""
    cache = _plans.device_cache("filled", FILLED_SIZE)
    key = (n, int(dt), device, value)
    a = cache.get(key)
    if a is None:
        a = memory.empty((n,), numpy_dtype(dt), device)
        a.fill_(value)
        a.synchronize()
        cache.put(key, a)
    return a
