"""The attention's masks and scores (dense and padded layouts): the options checked before any C
call, their part of the call key, and the device operands they add to the graph (an additive
bias, ALiBi slopes, sink logits).

A boolean ``attn_mask`` is not converted here: the high level takes the additive form (0 to
attend, ``-inf`` to mask, in q's dtype), which is the one mechanism cuDNN's engines run; a
caller with torch makes it as ``torch.zeros(shape, dtype=q.dtype).masked_fill_(~mask,
float("-inf"))``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from ... import errors, memory
from ..._config import parse_bool
from ..._types import dtype_name
from ...enums import DataType
from ...graph import _plans
from ...graph._tensor import alignment_of
from ...graph.nodes import sdpa_masks as _graph_masks
from ...graph.nodes.sdpa_masks import ALIGNMENTS
from .. import _checks, _graphops, _operand

__all__ = [
    "NONE",
    "SLOPES_SIZE",
    "Declared",
    "Spec",
    "alibi_slopes",
    "declare",
    "describe",
    "key",
    "slopes_array",
    "spec",
    "unused_sink",
]


class Spec(NamedTuple):
    """The checked scalar options (the operands stay the caller's objects)."""

    alignment: str
    left_bound: int | None
    right_bound: int | None
    alibi: bool
    sink: Any
    bias_grad: bool = False
    sink_grad: bool = False


def _bound(func: str, name: str, value: Any, lo: int) -> int | None:
    if value is None:
        return None
    if value.__class__ is not int or value < lo:
        raise ValueError(f"{func}: {name} must be None or an int >= {lo}, got {value!r}")
    return value


def spec(
    func: str,
    alignment: Any,
    bounds: tuple[Any, Any],
    alibi: Any,
    sink: Any,
    grads: tuple[Any, Any] = (False, False),
) -> Spec:
    """The options checked (before any C call): *bounds* ``(left, right)``, *grads*
    ``(bias_grad, sink_grad)``."""
    if alignment.__class__ is not str or alignment not in ALIGNMENTS:
        raise ValueError(
            f"{func}: diagonal_alignment must be 'top_left' or 'bottom_right', got {alignment!r}"
        )
    left = _bound(func, "left_bound", bounds[0], 1)
    right = _bound(func, "right_bound", bounds[1], 0)
    alibi = parse_bool(alibi, func, "alibi")
    bias_grad = parse_bool(grads[0], func, "bias_grad")
    sink_grad = parse_bool(grads[1], func, "sink_grad")
    if sink_grad and sink is None:
        raise ValueError(f"{func}: sink_grad=True needs a sink array")
    if sink_grad and not _graph_masks.DSINK_VERIFIED:
        raise errors.NotSupportedError(
            3000,
            func,
            "sink_grad=True: the sink's gradient is not yet verified on cuDNN 9.19; pass "
            "sink_grad=False (the sink still shapes dq, dk and dv)",
        )
    return Spec(alignment, left, right, alibi, sink, bias_grad, sink_grad)


def key(attn_mask: Any, s: Spec, qkey: tuple) -> tuple[tuple, tuple]:
    """``(ptrs, key)`` of the masks' operands (the bias, the sink, the ALiBi slopes: a cached
    array per head count and device, found from q's key *qkey*) and options."""
    ptrs: list[int] = []
    keys: list[Any] = [s._replace(sink=None)]
    for obj in (attn_mask, s.sink):
        if obj is None:
            keys.append(None)
        else:
            p, k = _operand.key_of(obj)
            ptrs.append(p)
            keys.append(k)
    if s.alibi:
        ptrs.append(slopes_array(qkey[0][1], qkey[3]).ptr)
    return tuple(ptrs), tuple(keys)


#: the ALiBi slopes, by (device, heads): in the registry (cleared by ``clear_caches()``,
#: counted by ``cache_info()``), bounded
SLOPES_SIZE = 64


def alibi_slopes(h: int) -> np.ndarray:
    """ALiBi's head slopes (Press et al.): ``2^(-8 i / n)`` for a power-of-two ``n`` heads,
    interleaved from ``2n`` heads otherwise (cudnn-frontend's and the paper's sequence)."""
    n = 2 ** math.floor(math.log2(h))
    base = [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
    extra = [2.0 ** (-4.0 * (2 * i + 1) / n) for i in range(h - n)]
    return np.array(base + extra, np.float32).reshape(1, h, 1, 1)


def slopes_array(h: int, device: int) -> memory.DeviceArray:
    """The float32 (1, H, 1, 1) ALiBi slopes on *device* (cached: the graph reads them)."""
    cache = _plans.device_cache("alibi_slopes", SLOPES_SIZE)
    k = (device, h)
    a = cache.get(k)
    if a is None:
        a = memory.to_device(alibi_slopes(h), device=device)
        a.synchronize()
        cache.put(k, a)
    return a


def _bias(func: str, obj: Any, dims: tuple, dt: DataType, device: int) -> _operand.Operand:
    g = _operand.operand(obj)
    b, h, sq, skv = dims
    if g.dtype == DataType.BOOLEAN or g.dtype is None or g.dtype != dt:
        got = "an unsupported dtype" if g.dtype is None else dtype_name(g.dtype)
        hint = (
            " (a boolean mask: pass its additive form, 0 to attend and -inf to mask, "
            "e.g. torch.zeros(shape, dtype=q.dtype).masked_fill_(~mask, float('-inf')))"
            if g.dtype in (DataType.BOOLEAN, None)
            else ""
        )
        raise TypeError(f"{func}: attn_mask must be {dtype_name(dt)} (q's dtype), got {got}{hint}")
    shape = tuple(g.shape)
    ok = len(shape) == 4 and shape[0] in (1, b) and shape[1] in (1, h)
    if not ok or shape[2:] != (sq, skv):
        raise ValueError(
            f"{func}: attn_mask must have shape ({b} or 1, {h} or 1, {sq}, {skv}), got {shape}"
        )
    for n, st in zip(shape, g.strides, strict=True):
        if n > 1 and st == 0:
            raise ValueError(
                f"{func}: attn_mask has a broadcast (stride 0) dim in {shape} with strides "
                f"{tuple(g.strides)}; pass that dim as size 1 instead (e.g. mask[:1])"
            )
    if g.strides[3] != 1 and skv > 1:
        raise ValueError(
            f"{func}: attn_mask's last dim must be contiguous (stride 1), got strides "
            f"{tuple(g.strides)}"
        )
    if g.device != device:
        raise ValueError(f"{func}: attn_mask is on device {g.device}, q on device {device}")
    _checks.check_strides(func, "attn_mask", g)
    return g


def unused_sink(func: str, s: Spec, q: Any) -> Spec:
    """*s* without its sink, checked first against *q*: the backward without ``sink_grad``
    reads no sink (the forward's statistics hold its softmax term), and cuDNN's plan takes no
    pointer for a tensor no operation reads (found on the GPU)."""
    gq = _operand.operand(q)
    if len(gq.shape) == 4:  # else the q checks that follow name the problem
        _sink(func, s.sink, gq.shape[1], gq.device)
    return s._replace(sink=None)


def _sink(func: str, obj: Any, h: int, device: int) -> _operand.Operand:
    g = _operand.operand(obj)
    if g.dtype != DataType.FLOAT:
        got = "an unsupported dtype" if g.dtype is None else dtype_name(g.dtype)
        raise TypeError(f"{func}: sink must be float32, got {got}")
    if tuple(g.shape) not in ((h,), (1, h, 1, 1)):
        raise ValueError(
            f"{func}: sink must have shape ({h},) or (1, {h}, 1, 1) (one logit per query "
            f"head), got {tuple(g.shape)}"
        )
    if g.device != device:
        raise ValueError(f"{func}: sink is on device {g.device}, q on device {device}")
    if g.strides[-1] != 1 and h > 1:
        raise ValueError(f"{func}: sink must be contiguous, got strides {tuple(g.strides)}")
    _checks.check_aligned(func, "sink", g)
    return g


class Declared(NamedTuple):
    """What :func:`declare` added: the builder's keyword arguments, the inputs, their spans."""

    kwargs: dict
    inputs: list
    spans: list


def declare(
    func: str, g: Any, attn_mask: Any, s: Spec | None, dims: tuple, dt: DataType, device: int
) -> Declared:
    """The masks' operands checked and declared on *g* (the bias, the sink, the ALiBi slopes,
    in that pointer order); nothing for the unmasked call (*s* None)."""
    if s is None:
        return NONE
    h = dims[1]
    kw: dict = {"diagonal_alignment": s.alignment}
    kw["left_bound"], kw["right_bound"] = s.left_bound, s.right_bound
    inputs: list = []
    spans: list = []
    if attn_mask is not None:
        gb = _bias(func, attn_mask, dims, dt, device)
        kw["bias"] = _graphops.declare(g, "bias", gb)
        inputs.append(kw["bias"])
        spans.append(gb.nbytes_span)
    if s.sink is not None:
        gs = _sink(func, s.sink, h, device)
        kw["sink"] = g.tensor((1, h, 1, 1), (h, 1, 1, 1), DataType.FLOAT, name="sink")
        kw["sink"].set_alignment(alignment_of(gs.ptr))
        inputs.append(kw["sink"])
        spans.append(gs.nbytes_span)
    if s.alibi:
        kw["alibi_slopes"] = g.tensor((1, h, 1, 1), (h, 1, 1, 1), DataType.FLOAT, name="alibi")
        inputs.append(kw["alibi_slopes"])
        spans.append(h * 4)
    return Declared(kw, inputs, spans)


#: what an unmasked call declares: nothing
NONE = Declared({}, [], [])


def describe(attn_mask: Any, s: Spec | None) -> str:
    """The options for an error message (empty for the unmasked call)."""
    if s is None:
        return ""
    parts = [
        w
        for w, on in (
            ("bias", attn_mask is not None),
            (s.alignment, s.alignment != "top_left"),
            (f"left_bound {s.left_bound}", s.left_bound is not None),
            (f"right_bound {s.right_bound}", s.right_bound is not None),
            ("alibi", s.alibi),
            ("sink", s.sink is not None),
            ("dbias", s.bias_grad),
        )
        if on
    ]
    return f" [{', '.join(parts)}]" if parts else ""
