"""Batch normalization's shared validation (:mod:`.batchnorm` and :mod:`.batchnorm_act`): the
problem a call describes (its inputs padded to 4-D, the parameters' dtype and accepted shapes,
the elements per statistic), the parameters' and outputs' checks, the call keys' pieces. Every
check raises before any C call."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from .. import _layout
from .._types import dtype_name
from ..descriptors import BN_MIN_EPSILON
from ..enums import BatchNormMode, DataType
from . import _checks, _operand, _staging

__all__ = [
    "MODES",
    "PARAM_DT",
    "Problem",
    "check_not_empty",
    "check_stat_outs",
    "key",
    "main_output",
    "packed",
    "param",
    "params",
    "problem",
    "reshaped",
    "spans",
]

MODES = {
    "per-activation": BatchNormMode.PER_ACTIVATION,
    "per_activation": BatchNormMode.PER_ACTIVATION,
    "peractivation": BatchNormMode.PER_ACTIVATION,  # theano.sandbox.cuda.dnn's spelling
    "spatial": BatchNormMode.SPATIAL,
}
# cuDNN's rule: float scale/bias/statistics for half, bfloat16 and float data, double for double
PARAM_DT = {
    DataType.HALF: DataType.FLOAT,
    DataType.BFLOAT16: DataType.FLOAT,
    DataType.FLOAT: DataType.FLOAT,
    DataType.DOUBLE: DataType.DOUBLE,
}


class Problem(NamedTuple):
    func: str
    x: _operand.Operand  # padded to >= 4 dims
    shape: tuple[int, ...]  # the inputs' own shape
    dt: DataType
    pdt: DataType  # the parameters' dtype
    mode: BatchNormMode
    mode_name: str
    eps: float
    full: tuple[int, ...]  # accepted parameter shapes: (1, C, 1, ...) or (1, C, H, W, ...)
    squeezed: tuple[int, ...]  # (C,) or (C, H, W, ...)
    pshape: tuple[int, ...]  # the parameters as cuDNN sees them (>= 4 dims)
    m: int  # elements per statistic
    nhwc: bool


def problem(func: str, name: str, x: Any, mode: Any, epsilon: Any) -> Problem:
    g = _operand.operand(x)
    dt, _device = _checks.same_dtype_and_device(func, ((name, g),))
    shape = tuple(g.shape)
    if not 2 <= len(shape) <= 5:
        raise ValueError(
            f"{func}: {name} has shape {shape}; cuDNN normalizes 4-D (N, C, H, W) and 5-D "
            "(N, C, D, H, W) inputs (2-D and 3-D ones are padded with size-1 dims, as Theano did)"
        )
    _checks.check_operand(func, name, g)
    m = _checks.choose(mode, MODES, "mode", func)
    eps = _checks.real(epsilon, "epsilon", func)
    if eps < BN_MIN_EPSILON:
        raise ValueError(
            f"{func}: epsilon={epsilon!r} is below cuDNN's minimum CUDNN_BN_MIN_EPSILON = "
            f"{BN_MIN_EPSILON}"
        )
    xp = _operand.Operand(g.ptr, *_staging.padded(shape, g.strides, 4), dt, g.device)
    if m == BatchNormMode.SPATIAL:
        full, squeezed = (1, shape[1]) + (1,) * (len(shape) - 2), (shape[1],)
        count = shape[0] * math.prod(shape[2:])
    else:
        full, squeezed, count = (1, *shape[1:]), shape[1:], shape[0]
    pshape = _staging.padded(full, full, 4)[0]
    mode_name = "spatial" if m == BatchNormMode.SPATIAL else "per-activation"
    return Problem(
        func,
        xp,
        shape,
        dt,
        PARAM_DT[dt],
        m,
        mode_name,
        eps,
        full,
        squeezed,
        pshape,
        count,
        _staging.channels_last(xp),
    )


def reshaped(g: _operand.Operand, shape: tuple[int, ...]) -> _operand.Operand:
    """*g* seen with *shape*, which differs from ``g.shape`` by size-1 dimensions only."""
    big = iter(st for n, st in zip(g.shape, g.strides, strict=True) if n != 1)
    strides = tuple(next(big) if n != 1 else 1 for n in shape)
    return _operand.Operand(g.ptr, shape, strides, g.dtype, g.device)


def param(p: Problem, name: str, obj: Any) -> tuple[_operand.Operand, tuple[int, ...]]:
    """A scale/bias/statistics operand as cuDNN sees it, and its own shape."""
    g = _operand.operand(obj)
    if g.device != p.x.device:
        raise ValueError(f"{p.func}: inputs are on device {p.x.device} but {name} on {g.device}")
    if g.dtype != p.pdt:
        got = dtype_name(g.dtype) if g.dtype is not None else "an unsupported dtype"
        raise TypeError(
            f"{p.func}: {name} is {got} but inputs are {dtype_name(p.dt)}; cuDNN takes "
            f"{dtype_name(p.pdt)} scale, bias and statistics for {dtype_name(p.dt)} data "
            "(float32 for float16/bfloat16/float32 data, float64 for float64 data)"
        )
    shape = tuple(g.shape)
    if shape not in (p.full, p.squeezed):
        raise ValueError(
            f"{p.func}: {name} has shape {shape}; for mode={p.mode_name!r} and inputs of shape "
            f"{p.shape} expected {p.full} or {p.squeezed}"
        )
    _checks.check_operand(p.func, name, g)
    return reshaped(g, p.pshape), shape


def params(p: Problem, named: Sequence[tuple[str, Any]]) -> list[tuple[_operand.Operand, tuple]]:
    return [param(p, name, obj) for name, obj in named]


def main_output(p: Problem, name: str, out: Any) -> _operand.Operand | None:
    """``out=`` (shaped like the inputs) as cuDNN sees it, or None."""
    if out is None:
        return None
    o = _operand.operand(out)
    _checks.same_dtype_and_device(p.func, (("inputs", p.x), (name, o)))
    _checks.check_operand(p.func, name, o)
    _checks.check_out(p.func, o, p.shape, name)
    return _operand.Operand(o.ptr, *_staging.padded(o.shape, o.strides, 4), o.dtype, o.device)


def check_stat_outs(p: Problem, named: Sequence[tuple[str, Any]]) -> None:
    """Given statistics outputs: parameters' shape and dtype, packed (cuDNN writes C values)."""
    for name, obj in named:
        if obj is not None:
            g = param(p, name, obj)[0]
            if not _layout.matches(g.shape, g.strides, packed(g.shape)):
                raise ValueError(f"{p.func}: {name} must be contiguous, got strides {g.strides}")


def spans(*ops: Any) -> tuple[int, ...]:
    """Byte spans of operands (Operand) and new outputs (OutputSpec)."""
    return tuple(o.nbytes_span for o in ops)


def check_not_empty(p: Problem, what: str) -> None:
    if 0 in p.shape:
        raise ValueError(
            f"{p.func}: inputs of shape {p.shape} are empty; {what} of an empty batch are undefined"
        )


def key(obj: Any) -> tuple[int | None, Any]:
    return (None, None) if obj is None else _operand.key_of(obj)


def packed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return _layout.packed_strides(shape)
