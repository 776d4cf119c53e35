"""Argument checks (pure Python, before any C call): every message names the function, the
argument, the value and what was expected.

The checks take the user-facing function's name (*func*) so that one error text serves every
operation; they read :class:`._operand.Operand` records and raise ``TypeError`` (a wrong type or
dtype) or ``ValueError`` (a wrong value, shape, stride or device).
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from .. import _cuda, _layout
from .._types import FLOATS, dtype_name, itemsize
from ..enums import DataType
from ._operand import Operand, operand

__all__ = [
    "FLOATS",
    "check_aligned",
    "check_operand",
    "check_out",
    "check_stream",
    "check_strides",
    "choose",
    "ints",
    "out_operand",
    "out_pair",
    "real",
    "same_dtype_and_device",
    "shapes_of_x",
]


def ints(value: Any, nd: int, name: str, lo: int, func: str) -> tuple[int, ...]:
    """An int broadcast to *nd* values, or a sequence of exactly *nd* ints, each >= *lo*."""
    if isinstance(value, bool):
        raise TypeError(f"{func}: {name} must be an int or a tuple of {nd} ints, got {value!r}")
    if isinstance(value, int):
        vals: tuple = (value,) * nd
    else:
        if isinstance(value, Mapping | AbstractSet | str | bytes):
            raise TypeError(
                f"{func}: {name} must be an int or a tuple of {nd} ints, got {value!r} "
                f"(a {type(value).__name__})"
            )
        try:
            vals = tuple(value)
        except TypeError:
            raise TypeError(
                f"{func}: {name} must be an int or a tuple of {nd} ints, got {value!r}"
            ) from None
        if len(vals) != nd:
            raise ValueError(
                f"{func}: {name} must have {nd} values (one per spatial dim), got {value!r}"
            )
    out = []
    for v in vals:
        if isinstance(v, bool) or not hasattr(v, "__index__"):
            raise TypeError(f"{func}: {name} must contain ints, got {value!r}")
        v = v.__index__()
        if v < lo:
            what = "negative" if lo == 0 else "non-positive" if lo == 1 else f"< {lo}"
            raise ValueError(f"{func}: {what} {name} is not supported, got {value!r}")
        out.append(v)
    return tuple(out)


def real(
    value: Any,
    name: str,
    func: str,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
) -> float:
    """A finite real number, optionally within ``[lo, hi]`` (``(`` / ``)`` when open)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{func}: {name} must be a real number, got {value!r}")
    try:
        v = float(value)
    except OverflowError:  # an int beyond any float
        v = float("inf")
    if v != v or v in (float("inf"), float("-inf")):
        raise ValueError(f"{func}: {name} must be finite, got {value!r}")
    low = lo is not None and (v <= lo if lo_open else v < lo)
    high = hi is not None and (v >= hi if hi_open else v > hi)
    if low or high:
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        rng = f"{left}{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}{right}"
        raise ValueError(f"{func}: {name}={value!r} is out of range; expected a value in {rng}")
    return v


def beta_needs_out(func: str, beta: Any, out: Any) -> None:
    """``out = alpha * op + beta * out`` reads *out*: a nonzero *beta* with no ``out=`` would
    blend a new, uninitialized buffer into the result."""
    if out is None and beta != 0:
        raise ValueError(
            f"{func}: beta={beta!r} blends out's previous values into the result, but no out= "
            "was given (a new output holds no values): pass out=, or beta=0"
        )


def choose(value: Any, table: dict[str, Any], name: str, func: str) -> Any:
    """The entry of *table* for the string *value* (case-insensitive)."""
    if not isinstance(value, str):
        raise TypeError(f"{func}: {name} must be a string, got {value!r}")
    try:
        return table[value.lower()]
    except KeyError:
        raise ValueError(
            f"{func}: {name}={value!r} is not one of {', '.join(map(repr, table))}"
        ) from None


def same_dtype_and_device(
    func: str, named: Sequence[tuple[str, Operand | None]], allowed: Iterable[DataType] = FLOATS
) -> tuple[DataType, int]:
    """The common dtype and device of the named operands (None entries skipped).

    Raises ``TypeError`` for an unsupported or a mixed dtype and ``ValueError`` for operands on
    different devices, naming both.
    """
    allowed = tuple(allowed)
    first_name, first = next((n, g) for n, g in named if g is not None)
    dt, device = first.dtype, first.device
    for name, g in named:
        if g is None:
            continue
        if g.dtype not in allowed:
            raise TypeError(
                f"{func}: {name} has an unsupported dtype; supported: "
                f"{', '.join(dtype_name(a) for a in allowed)}"
            )
        if g.dtype != dt:
            raise TypeError(
                f"{func}: {first_name} is {dtype_name(dt)} but {name} is {dtype_name(g.dtype)}; "
                "all operands must have the same dtype"
            )
        if g.device != device:
            raise ValueError(
                f"{func}: {first_name} is on device {device} but {name} on device {g.device}"
            )
    return dt, device


def shapes_of_x(func: str, gy: Operand, gdy: Operand, gx: Operand) -> None:
    """A backward call's *y* and *dy* have the shape of the forward input *x*."""
    for name, g in (("y", gy), ("dy", gdy)):
        if tuple(g.shape) != tuple(gx.shape):
            raise ValueError(
                f"{func}: {name} has shape {tuple(g.shape)} but x has {tuple(gx.shape)}; the "
                "forward input, output and their gradients have one shape"
            )


def check_aligned(func: str, name: str, g: Operand) -> None:
    """*g*'s address is a multiple of its element size (cuDNN reads whole elements)."""
    isz = itemsize(g.dtype)
    if g.ptr % isz:
        raise ValueError(
            f"{func}: {name}'s address 0x{g.ptr:x} is not a multiple of its element size ({isz} B)"
        )


def check_strides(func: str, name: str, g: Operand) -> None:
    """Aligned to the element size; no negative strides; no zero (broadcast) strides."""
    check_aligned(func, name, g)
    for s, st in zip(g.shape, g.strides, strict=True):
        if st < 0:
            raise ValueError(
                f"{func}: {name} has a negative stride {tuple(g.strides)}; cuDNN does not support "
                "them"
            )
        if st == 0 and s > 1:
            raise ValueError(
                f"{func}: {name} has a zero (broadcast) stride {tuple(g.strides)}; make it "
                "contiguous first"
            )


def check_out(func: str, o: Operand, shape: tuple[int, ...], name: str = "out") -> None:
    """``out`` has the expected shape and elements that do not overlap."""
    if tuple(o.shape) != tuple(shape):
        raise ValueError(f"{func}: {name} has shape {tuple(o.shape)}, expected {tuple(shape)}")
    if not _layout.non_overlapping(o.shape, o.strides):
        raise ValueError(
            f"{func}: {name}'s strides {tuple(o.strides)} make elements overlap; cuDNN cannot "
            "write it"
        )


def check_operand(func: str, name: str, g: Operand) -> None:
    """Strides cuDNN can describe: aligned, positive (or size-1), within its 32-bit limits."""
    check_strides(func, name, g)
    _layout.check_int32(f"{func}: {name}", g.shape, g.strides)


def out_operand(
    func: str, out: Any, shape: Sequence[int], dt: DataType, device: int, name: str = "out"
) -> Operand:
    """*out* checked against the expected *shape*, dtype and device."""
    o = operand(out)
    if o.dtype != dt:
        got = "an unsupported dtype" if o.dtype is None else dtype_name(o.dtype)
        raise TypeError(f"{func}: {name} is {got}, expected {dtype_name(dt)}")
    if o.device != device:
        raise ValueError(f"{func}: {name} is on device {o.device}, the inputs on device {device}")
    check_out(func, o, shape, name)
    check_strides(func, name, o)
    return o


def out_pair(func: str, out: Any, names: str) -> tuple[Any, Any]:
    """The ``out=`` of a call with two outputs (*names*, for the message): None or a pair."""
    if out is None:
        return None, None
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError(f"{func}: out must be None or a pair ({names}), got {out!r}")
    return out[0], out[1]


def check_stream(func: str, stream: Any, device: int) -> None:
    """Refuse a *stream* object that says it belongs to another device than the operands'
    (torch, CuPy and cuda.core streams say it; ints cannot be checked without a CUDA call)."""
    sdev = _cuda.stream_device(stream)
    if sdev is not None and device is not None and sdev != device:
        raise ValueError(
            f"{func}: stream is on device {sdev} but the operands on device {device}; pass a "
            f"stream of device {device} (or none)"
        )
