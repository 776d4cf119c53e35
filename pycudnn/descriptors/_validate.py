"""The descriptor layer's argument checks: Python values in, C-ready values out.

Each function takes the value and the argument's name, and returns the value converted (an int,
a tuple of ints, a float, an enum member, a ``DataType``) or raises ``TypeError`` (wrong kind of
value), ``ValueError`` (wrong value) or ``OverflowError`` (beyond cuDNN's int range), naming the
argument, the value and what was expected. Nothing here calls cuDNN: checking happens before
the first C call, because several cuDNN calls crash the process on bad input instead of
returning an error.

The option tables several families share (convolution modes, math types, layouts, NaN
propagation) live here as well, so a name means the same everywhere.
"""

from __future__ import annotations

import ctypes
import enum
import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from .. import enums
from .._generated import lib as _lib
from .._layout import INT32_MAX, span
from .._resource import Resource
from .._types import HasPtr, as_data_type, dtype_name
from ..enums import DataType

__all__ = [
    "CONV_MODES",
    "DIM_MAX",
    "FLOAT_TYPES",
    "MATH_TYPES",
    "as_float",
    "as_handle",
    "as_int",
    "buffer_ptr",
    "c_int_array",
    "check_span",
    "coerce_enum",
    "describe",
    "enum_table",
    "finite",
    "int_in",
    "int_seq",
    "is_handle",
    "nan_mode",
    "ptr_of",
    "restrict_dtype",
    "spatial",
    "spatial_rank",
    "tensor_format",
    "unordered",
]

DIM_MAX = _lib.CUDNN_DIM_MAX  # most dims of a tensor or filter descriptor (8)


def describe(value: Any) -> str:
    """``repr(value)``, cut to 80 characters for error messages."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def as_int(value: Any, argument: str) -> int:
    """An int (anything with ``__index__``); bools, enum members and floats are refused."""
    if isinstance(value, bool | enum.Enum | float):
        raise TypeError(f"{argument} must be an integer, got {describe(value)}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{argument} must be an integer, got {describe(value)}") from None


def int_in(value: Any, argument: str, lo: int, hi: int = INT32_MAX, what: str = "") -> int:
    """An int in [lo, hi]; ValueError below *lo*, OverflowError above *hi* (cuDNN's int range)."""
    v = as_int(value, argument)
    if v < lo:
        raise ValueError(f"{argument}={v} is invalid; expected {what or f'an integer >= {lo}'}")
    if v > hi:
        raise OverflowError(f"{argument}={v} exceeds cuDNN's limit of {hi}")
    return v


def int_seq(
    value: Any,
    argument: str,
    *,
    lo: int,
    hi: int = INT32_MAX,
    length: int | None = None,
    min_len: int = 1,
    max_len: int = DIM_MAX,
    what: str = "",
) -> tuple[int, ...]:
    """A tuple of ints, validated element-wise, of the given length (or length range)."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable) or unordered(value):
        raise TypeError(
            f"{argument} must be a sequence of integers (a tuple or list), got {describe(value)}"
        )
    items = tuple(value)
    if length is not None and len(items) != length:
        raise ValueError(
            f"{argument}={describe(items)} has {len(items)} entries; expected {length}"
        )
    if length is None and not min_len <= len(items) <= max_len:
        raise ValueError(
            f"{argument}={describe(items)} has {len(items)} entries; expected "
            f"{min_len} to {max_len}"
        )
    out = []
    for i, v in enumerate(items):
        out.append(int_in(v, f"{argument}[{i}]", lo, hi, what))
    return tuple(out)


def spatial(
    value: Any, argument: str, n: int, *, lo: int, what: str = "", hi: int = INT32_MAX
) -> tuple[int, ...]:
    """An int broadcast to *n* spatial dims, or a sequence of exactly *n* ints (at least one:
    an empty sequence would make a 0-d operation)."""
    if not isinstance(value, str | bytes) and isinstance(value, Iterable):
        if unordered(value):
            raise TypeError(
                f"{argument} must be an int or a sequence of ints (a tuple or list), got "
                f"{describe(value)}"
            )
        items = tuple(value)
        if not items:
            raise ValueError(
                f"{argument}={items!r} is empty; expected 1 to {DIM_MAX - 2} spatial sizes "
                "(or one int for all of them)"
            )
        return int_seq(items, argument, lo=lo, hi=hi, length=n, what=what)
    v = int_in(value, argument, lo, hi, what)
    return (v,) * n


def spatial_rank(ndim: Any, *values: Any) -> int:
    """The spatial rank of a descriptor: *ndim* (1 to 6) when given, else the length of the
    first sequence-valued one of *values* (2 when every one is a plain int)."""
    n = 2
    if ndim is not None:
        n = int_in(ndim, "ndim", 1, DIM_MAX - 2, "1 to 6 spatial dims")
    else:
        for v in values:
            if not isinstance(v, str | bytes) and isinstance(v, Iterable):
                n = len(tuple(v))
                break
    if n > DIM_MAX - 2:
        raise ValueError(f"{n} spatial dims given; cuDNN supports 1 to {DIM_MAX - 2}")
    return n


def unordered(value: Any) -> bool:
    """A mapping or a set: iterable, but not a sequence of values in an order (a dict as a
    shape would give its keys)."""
    return isinstance(value, Mapping | AbstractSet)


def as_float(value: Any, argument: str) -> float:
    """A real number as float; bools and strings are refused, NaN is a ``ValueError``, an int
    beyond a double's range an ``OverflowError`` naming *argument*."""
    if isinstance(value, bool | str | bytes):
        raise TypeError(f"{argument} must be a real number, got {describe(value)}")
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{argument} must be a real number, got {describe(value)}") from None
    except OverflowError:
        raise OverflowError(
            f"{argument}={describe(value)} does not fit in a double (the largest is about 1.8e308)"
        ) from None
    if math.isnan(f):
        raise ValueError(f"{argument} must not be NaN")
    return f


def finite(value: Any, argument: str) -> float:
    """:func:`as_float`, and not infinite."""
    f = as_float(value, argument)
    if math.isinf(f):
        raise ValueError(f"{argument}={f} must be finite")
    return f


_ENUM_TABLES: dict[type, dict[str, enum.Enum]] = {}


def enum_table(cls: type[enums.CudnnEnum]) -> dict[str, enum.Enum]:
    """Lower-case member names and C names of *cls* -> member (built once per class)."""
    table = _ENUM_TABLES.get(cls)
    if table is None:
        table = {}
        for m in cls:
            table[m.name.lower()] = m
            table[m.c_name.lower()] = m
        _ENUM_TABLES[cls] = table
    return table


def coerce_enum(
    value: Any,
    cls: type[enums.CudnnEnum],
    argument: str,
    aliases: dict[str, enum.Enum] | None = None,
    allowed: Iterable[enum.Enum] | None = None,
) -> Any:
    """Coerce a member, a (C or Python, any case) name, an alias or a valid int to *cls*."""
    member: Any = None
    if isinstance(value, cls):
        member = value
    elif isinstance(value, str):
        key = value.strip().lower().replace("-", "_")
        member = aliases.get(key) if aliases else None  # members may be 0: test `is None`
        if member is None:
            member = enum_table(cls).get(key)
        if member is None:
            names = sorted(aliases) if aliases else [m.name.lower() for m in cls]
            raise ValueError(
                f"{argument}={value!r} is not a valid {cls.__name__}; expected one of "
                f"{', '.join(repr(n) for n in names)} or a pycudnn.enums.{cls.__name__} member"
            )
    elif isinstance(value, enum.Enum | bool):
        raise TypeError(
            f"{argument}={describe(value)} is not a {cls.__name__}; expected a "
            f"pycudnn.enums.{cls.__name__} member or its name"
        )
    elif isinstance(value, int):
        try:
            member = cls(value)
        except ValueError:
            raise ValueError(
                f"{argument}={value} is not a valid {cls.__name__} value; expected one of "
                f"{', '.join(str(int(m)) for m in cls)}"
            ) from None
    else:
        raise TypeError(
            f"{argument}={describe(value)} is not a {cls.__name__}; expected a "
            f"pycudnn.enums.{cls.__name__} member or its name"
        )
    if allowed is not None and member not in allowed:
        raise ValueError(
            f"{argument}={member.name} is not supported here; expected one of "
            f"{', '.join(m.name for m in allowed)}"
        )
    return member


def restrict_dtype(value: Any, argument: str, allowed: Iterable[DataType]) -> DataType:
    """A numpy dtype / name / DataType, restricted to what the descriptor supports."""
    if isinstance(value, bool):
        raise TypeError(f"{argument}={value!r} is not a dtype")
    dt = as_data_type(value, argument=argument)
    allowed = tuple(allowed)
    if dt not in allowed:
        raise TypeError(
            f"{argument}={dt.name} is not supported by this descriptor; expected one of "
            f"{', '.join(dtype_name(a) for a in allowed)}"
        )
    return dt


def c_int_array(values: Sequence[int]) -> ctypes.Array:
    """A ``c_int`` array holding *values* (checked before: they fit in an int)."""
    return (ctypes.c_int * len(values))(*values)


def ptr_of(value: Any, argument: str) -> Any:
    """Check that *value* exposes an int ``.ptr`` (``HasPtr``) that is a 64-bit address, and
    return the int."""
    if not isinstance(value, HasPtr):
        raise TypeError(
            f"{argument} must be an object with an int .ptr (a pycudnn Handle or device buffer), "
            f"got {describe(value)}"
        )
    ptr = value.ptr
    if isinstance(ptr, bool) or not isinstance(ptr, int):
        raise TypeError(f"{argument}.ptr must be an int, got {describe(ptr)}")
    if not 0 <= ptr < 1 << 64:
        raise ValueError(f"{argument}.ptr={ptr} is not a 64-bit address")
    return ptr


def is_handle(value: Any) -> bool:
    """True for a ``pycudnn.Handle`` (open or closed), recognised by its C type.

    The descriptor layer never imports :mod:`pycudnn.handle`: a ``Handle`` is the one
    :class:`~pycudnn._resource.Resource` whose C type is ``cudnnHandle_t``, so the check is a
    type test against the generated handle class, with no import cycle and no protocol that
    any object with ``.ptr`` could satisfy.
    """
    return isinstance(value, Resource) and value._c_type is _lib.cudnnHandle_t


def as_handle(value: Any, argument: str = "handle") -> Any:
    """Check that *value* is an open ``pycudnn.Handle`` and return it.

    Raises
    ------
    TypeError
        Anything else: an int, a descriptor, a device array, another object with ``.ptr``.
    ValueError
        The handle is closed.
    """
    if is_handle(value):
        value._h()  # closed -> ValueError, no C call
        return value
    if not isinstance(value, HasPtr):
        raise TypeError(
            f"{argument} must be an object with an int .ptr that is a cuDNN handle: a "
            f"pycudnn.Handle (pycudnn.get_handle()), got {describe(value)}"
        )
    raise TypeError(
        f"{argument} must be a pycudnn.Handle (pycudnn.get_handle()), got {describe(value)}: "
        "only a cuDNN handle may be passed where cuDNN expects one"
    )


def buffer_ptr(value: Any, argument: str) -> int:
    """The device address of a buffer argument (``DeviceArray``, allocation...): an object
    with an int ``.ptr`` that is not a descriptor or handle (cuDNN would write into those)."""
    if isinstance(value, Resource):
        raise TypeError(
            f"{argument} must be a device buffer (a pycudnn DeviceArray or allocation), got "
            f"{describe(value)}"
        )
    return ptr_of(value, argument)


# -- options shared by several families ------------------------------------------------------------
FLOAT_TYPES = (DataType.FLOAT, DataType.DOUBLE, DataType.HALF, DataType.BFLOAT16)
CONV_MODES = {
    "cross_correlation": enums.ConvolutionMode.CROSS_CORRELATION,
    "cross": enums.ConvolutionMode.CROSS_CORRELATION,
    "convolution": enums.ConvolutionMode.CONVOLUTION,
    "conv": enums.ConvolutionMode.CONVOLUTION,
}
MATH_TYPES = {
    "default": enums.MathType.DEFAULT_MATH,
    "tensor_op": enums.MathType.TENSOR_OP_MATH,
    "tensor_op_allow_conversion": enums.MathType.TENSOR_OP_MATH_ALLOW_CONVERSION,
    "fma": enums.MathType.FMA_MATH,
}
_LAYOUTS = {
    "nchw": enums.TensorFormat.NCHW,
    "nhwc": enums.TensorFormat.NHWC,
    "ncdhw": enums.TensorFormat.NCHW,
    "ndhwc": enums.TensorFormat.NHWC,
    "channels_first": enums.TensorFormat.NCHW,
    "channels_last": enums.TensorFormat.NHWC,
}
_NAN = {
    "propagate": enums.NanPropagation.PROPAGATE_NAN,
    "not_propagate": enums.NanPropagation.NOT_PROPAGATE_NAN,
}


def tensor_format(value: Any, argument: str = "layout") -> enums.TensorFormat:
    """NCHW or NHWC, from a layout name (``"NHWC"``, ``"channels_last"``...) or member."""
    return coerce_enum(
        value,
        enums.TensorFormat,
        argument,
        _LAYOUTS,
        allowed=(enums.TensorFormat.NCHW, enums.TensorFormat.NHWC),
    )


def nan_mode(value: Any, argument: str = "nan_propagation") -> enums.NanPropagation:
    """A ``NanPropagation`` from a bool (True: propagate), a name or a member."""
    if isinstance(value, bool):
        return enums.NanPropagation(int(value))
    return coerce_enum(value, enums.NanPropagation, argument, _NAN)


def check_span(shape: Sequence[int], strides: Sequence[int], argument: str) -> None:
    """``OverflowError`` when the element count or the strided span (``_layout.span``) of
    *shape* exceeds cuDNN's int32 limit."""
    count = math.prod(shape)
    if count > INT32_MAX:
        raise OverflowError(
            f"{argument}={tuple(shape)} has {count} elements; cuDNN's limit is {INT32_MAX}"
        )
    extent = span(shape, strides)
    if extent > INT32_MAX:
        raise OverflowError(
            f"shape {tuple(shape)} with strides {tuple(strides)} spans {extent} elements; "
            f"cuDNN's limit is {INT32_MAX}"
        )
