"""The backend (graph API) attribute codec: Python values to and from the C arrays of
``cudnnBackendSetAttribute`` / ``cudnnBackendGetAttribute``, by ``BackendAttributeType``.

* :func:`pack` turns one value or a sequence into ``(ctypes array, element count)``, validating
  each element (range-checked ints, real numbers, bools, enum members or names, numpy dtypes for
  ``DATA_TYPE``, ``Fraction`` or ``(num, den)``, ``str``/``bytes``, addresses). Plain ints, int
  sequences and sequences of raw addresses take fast paths: they are the hot case (dims,
  strides, uids, variant-pack pointers).
* :func:`from_c` turns what cuDNN wrote back into Python values (enum members where the value is
  known to these bindings, the int otherwise).
* ``BACKEND_DESCRIPTOR`` values must be instances of the descriptor class the caller passes (the
  codec sits below :class:`~pycudnn.descriptors.BackendDescriptor` and does not import it), of a
  descriptor type the attribute takes: :data:`TAKES`, from the table :mod:`._attrs` generated
  from cuDNN's documentation of each attribute (cuDNN itself does not check it: an engine
  descriptor set as a pointwise operation's input tensor crashes it).
* ``HANDLE`` values are ``pycudnn.Handle`` objects (or raw int addresses); ``VOID_PTR`` values are
  device buffers (objects with ``.ptr`` that are not descriptors or handles) or raw int
  addresses. Raw ints are range-checked (0 to 2**64 - 1) but otherwise trusted.

The tables are keyed by plain ints: enum members hash in Python, which costs on the hot path.
"""

from __future__ import annotations

import ctypes
import enum
import fractions
import math
from collections.abc import Iterable
from typing import Any

from .. import enums
from .._generated import backend_attrs as _attrs
from .._generated import lib as _lib
from .._layout import INT32_MAX, INT64_MAX
from .._types import as_data_type
from ..enums import BackendAttributeName, BackendAttributeType, BackendDescriptorType, DataType
from ._validate import (
    as_int,
    buffer_ptr,
    coerce_enum,
    describe,
    enum_table,
    is_handle,
    unordered,
)

__all__ = [
    "CTYPE_OF_TYPE",
    "OWNER",
    "REF_TYPES",
    "TAKES",
    "check_descriptor_type",
    "check_descriptor_values",
    "check_raw",
    "coerce_attr_name",
    "coerce_attr_type",
    "coerce_descriptor_type",
    "from_c",
    "pack",
    "to_c",
]

_T = BackendAttributeType


def _by_int(table: dict[Any, Any]) -> dict[int, Any]:
    """*table* keyed by plain ints: enum members hash by name (a Python-level ``__hash__``)."""
    return {int(k): v for k, v in table.items()}


#: attribute type -> the enum its elements are read back as (C ints on the wire)
_ENUM_OF_TYPE: dict[int, type[enums.CudnnEnum]] = _by_int(
    {
        _T.DATA_TYPE: enums.DataType,
        _T.CONVOLUTION_MODE: enums.ConvolutionMode,
        _T.HEUR_MODE: enums.BackendHeurMode,
        _T.KNOB_TYPE: enums.BackendKnobType,
        _T.NAN_PROPOGATION: enums.NanPropagation,
        _T.NUMERICAL_NOTE: enums.BackendNumericalNote,
        _T.LAYOUT_TYPE: enums.BackendLayoutType,
        _T.ATTRIB_NAME: enums.BackendAttributeName,
        _T.POINTWISE_MODE: enums.PointwiseMode,
        _T.GENSTATS_MODE: enums.GenStatsMode,
        _T.BN_FINALIZE_STATS_MODE: enums.BnFinalizeStatsMode,
        _T.REDUCTION_OPERATOR_TYPE: enums.ReduceTensorOp,
        _T.BEHAVIOR_NOTE: enums.BackendBehaviorNote,
        _T.TENSOR_REORDERING_MODE: enums.BackendTensorReordering,
        _T.RESAMPLE_MODE: enums.ResampleMode,
        _T.PADDING_MODE: enums.PaddingMode,
        _T.SIGNAL_MODE: enums.SignalMode,
        _T.NORM_MODE: enums.BackendNormMode,
        _T.NORM_FWD_PHASE: enums.BackendNormFwdPhase,
        _T.RNG_DISTRIBUTION: enums.RngDistribution,
        _T.MOE_GROUPED_MATMUL_MODE: enums.MoeGroupedMatmulMode,
        _T.RESHAPE_MODE: enums.BackendReshapeMode,
        _T.OPERATIONGRAPH_MODE: enums.BackendOperationGraphMode,
        _T.CUDA_GRAPH_RETENTION: enums.CudaGraphRetention,
    }
)
#: attribute type -> ctypes element type
CTYPE_OF_TYPE: dict[int, Any] = _by_int(
    {
        _T.HANDLE: ctypes.c_void_p,
        _T.BOOLEAN: ctypes.c_bool,
        _T.INT64: ctypes.c_int64,
        _T.FLOAT: ctypes.c_float,
        _T.DOUBLE: ctypes.c_double,
        _T.VOID_PTR: ctypes.c_void_p,
        _T.BACKEND_DESCRIPTOR: ctypes.c_void_p,
        _T.INT32: ctypes.c_int32,
        _T.CHAR: ctypes.c_char,
        _T.FRACTION: _lib.cudnnFraction_t,
        **dict.fromkeys(_ENUM_OF_TYPE, ctypes.c_int),
    }
)
#: types whose values are addresses cuDNN keeps: the descriptor keeps their objects alive
REF_TYPES = frozenset((int(_T.BACKEND_DESCRIPTOR), int(_T.HANDLE), int(_T.VOID_PTR)))
_FLT_MAX = 3.4028234663852886e38  # float32's largest finite value
_INT_RANGE = {int(_T.INT64): (-(2**63), INT64_MAX), int(_T.INT32): (-(2**31), INT32_MAX)}
_ADDRESS_END = 1 << 64


# -- the attribute table (generated from cuDNN's documentation: see _attrs.py) ------------------
def _descriptor_types(names: tuple[str, ...]) -> frozenset[BackendDescriptorType]:
    out: set[BackendDescriptorType] = set()
    for n in names:
        if n == "OPERATION_*":
            out |= {m for m in BackendDescriptorType if m.name.startswith("OPERATION_")}
        else:
            out.add(BackendDescriptorType[f"{n}_DESCRIPTOR"])
    return frozenset(out)


#: attribute (int) -> the descriptor type documenting it
OWNER: dict[int, BackendDescriptorType] = {
    int(BackendAttributeName[n]): BackendDescriptorType[f"{o}_DESCRIPTOR"]
    for o, names in _attrs.ATTRIBUTES.items()
    for n in names
    if n in BackendAttributeName.__members__
}
#: descriptor-valued attribute (int) -> the descriptor types it takes
TAKES: dict[int, frozenset[BackendDescriptorType]] = {
    int(BackendAttributeName[n]): _descriptor_types(t)
    for n, t in _attrs.TAKES.items()
    if n in BackendAttributeName.__members__
}


#: the same as plain ints (enum members hash in Python: slow on the hot path)
_TAKES_VALUES: dict[int, frozenset[int]] = {
    a: frozenset(int(m) for m in types) for a, types in TAKES.items()
}


def _takes_text(allowed: frozenset[BackendDescriptorType]) -> str:
    if len(allowed) > 8:
        return "an OPERATION_*_DESCRIPTOR"
    return " or ".join(sorted(m.name for m in allowed))


def check_descriptor_type(attribute: int, dtype: BackendDescriptorType, argument: str) -> None:
    """``TypeError`` unless *attribute* is descriptor-valued and takes *dtype* descriptors."""
    allowed = TAKES.get(attribute)
    name = BackendAttributeName(attribute).name
    if allowed is None:
        raise TypeError(
            f"{name} is not a descriptor-valued attribute: it takes no BACKEND_DESCRIPTOR values"
        )
    if dtype not in allowed:
        raise TypeError(f"{argument}: {name} takes {_takes_text(allowed)}, not {dtype.name}")


def check_descriptor_values(
    owner: Any, attribute: int, values: Any, descriptor_class: type
) -> list[Any]:
    """Validate the ``BACKEND_DESCRIPTOR`` values of *attribute* set on *owner*; return their
    typed handles (the caller keeps them: a value closed later is then destroyed only when
    *owner* lets go of it, see ``Resource.close``).

    Raises
    ------
    TypeError
        A value is not a *descriptor_class*, or of a descriptor type the attribute does not
        take (per :data:`TAKES`), or the attribute is not descriptor-valued.
    ValueError
        A value is *owner* itself, or closed.
    """
    if isinstance(values, descriptor_class) or not isinstance(values, list | tuple):
        items: Any = (values,)
    else:
        items = values
    for i, v in enumerate(items):
        if not isinstance(v, descriptor_class):
            raise TypeError(f"values[{i}] must be a {descriptor_class.__name__}, got {describe(v)}")
    allowed = _TAKES_VALUES.get(attribute)
    if allowed is None:
        name = BackendAttributeName(attribute).name
        raise TypeError(
            f"{name} is not a descriptor-valued attribute: it takes no BACKEND_DESCRIPTOR values"
        )
    handles = []
    for i, v in enumerate(items):
        if v is owner:
            name = BackendAttributeName(attribute).name
            raise ValueError(
                f"values[{i}]: a descriptor cannot be set as its own attribute value ({name})"
            )
        handles.append(v._h())  # closed -> ValueError
        vtype = v._type
        if vtype is not None and vtype._value_ not in allowed:
            name = BackendAttributeName(attribute).name
            raise TypeError(
                f"values[{i}]: {name} takes {_takes_text(TAKES[attribute])}, not {vtype.name}"
            )
    return handles


def coerce_descriptor_type(value: Any) -> BackendDescriptorType:
    """A ``BackendDescriptorType`` from a member, an int, or a name with or without the
    ``_DESCRIPTOR`` suffix (``"tensor"``, ``"TENSOR_DESCRIPTOR"``, the C name)."""
    if isinstance(value, str):
        key = value.strip().lower()
        if not key.endswith("_descriptor"):
            key += "_descriptor"  # BackendDescriptor("tensor") reads naturally
        value = key if key in enum_table(BackendDescriptorType) else value
    return coerce_enum(value, BackendDescriptorType, "descriptor_type")


def coerce_attr_name(value: Any) -> int:
    """A ``BackendAttributeName`` member or name, as int."""
    # hot path: members skip the coercion machinery
    if type(value) is BackendAttributeName:
        return int(value)
    return int(coerce_enum(value, BackendAttributeName, "attribute"))


def coerce_attr_type(value: Any) -> int:
    """A ``BackendAttributeType`` member or name, as int."""
    if type(value) is BackendAttributeType:
        return int(value)
    return int(coerce_enum(value, BackendAttributeType, "attr_type"))


def to_c(atype: int, v: Any, argument: str, descriptor_class: type) -> Any:
    """One Python value -> the C element of *atype* (validated); ``BACKEND_DESCRIPTOR`` values
    must be instances of *descriptor_class*."""
    if atype == _T.BACKEND_DESCRIPTOR:
        if isinstance(v, descriptor_class):
            return v.ptr
        raise TypeError(f"{argument} must be a {descriptor_class.__name__}, got {describe(v)}")
    if atype in _INT_RANGE:
        lo, hi = _INT_RANGE[atype]
        i = as_int(v, argument)
        if not lo <= i <= hi:
            raise OverflowError(
                f"{argument}={i} does not fit in {BackendAttributeType(atype).name}"
            )
        return i
    if atype == _T.FLOAT or atype == _T.DOUBLE:
        if isinstance(v, bool | str | bytes):
            raise TypeError(f"{argument} must be a real number, got {describe(v)}")
        name = BackendAttributeType(atype).name
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise TypeError(f"{argument} must be a real number, got {describe(v)}") from None
        except OverflowError:  # an int past a double's range
            raise OverflowError(f"{argument}={describe(v)} does not fit in {name}") from None
        if atype == _T.FLOAT and math.isfinite(f) and abs(f) > _FLT_MAX:
            # a finite value float32 cannot hold (explicit infinities are kept)
            raise OverflowError(f"{argument}={describe(v)} does not fit in {name}")
        return f
    if atype == _T.BOOLEAN:
        if isinstance(v, bool) or type(v).__name__ in ("bool_", "bool"):  # numpy 1 and 2
            return bool(v)
        if not isinstance(v, int) or v not in (0, 1):
            raise TypeError(f"{argument} must be a bool (True/False, or 0/1), got {describe(v)}")
        return bool(v)
    if atype == _T.HANDLE or atype == _T.VOID_PTR:
        if v is None:
            return None
        if isinstance(v, int) and not isinstance(v, bool):
            if not 0 <= v < _ADDRESS_END:
                raise OverflowError(f"{argument}={v} is not a 64-bit address")
            return v
        if atype == _T.HANDLE:
            if not is_handle(v):
                raise TypeError(
                    f"{argument} must be a pycudnn.Handle (or its int address), got {describe(v)}"
                )
            return v.ptr  # closed -> ValueError
        return buffer_ptr(v, argument)
    if atype == _T.FRACTION:
        if isinstance(v, _lib.cudnnFraction_t):
            return v
        if isinstance(v, tuple) and len(v) == 2:
            num, den = as_int(v[0], argument), as_int(v[1], argument)
        elif isinstance(v, fractions.Fraction | int) and not isinstance(v, bool):
            f = fractions.Fraction(v)
            num, den = f.numerator, f.denominator
        else:
            raise TypeError(
                f"{argument} must be a Fraction, an int or a (numerator, denominator) pair, "
                f"got {describe(v)}"
            )
        if den == 0:
            raise ValueError(f"{argument}={describe(v)} has a zero denominator")
        lo, hi = _INT_RANGE[_T.INT64]
        if not (lo <= num <= hi and lo <= den <= hi):
            raise OverflowError(
                f"{argument}={describe(v)}: numerator and denominator must fit in int64"
            )
        return _lib.cudnnFraction_t(num, den)
    if (
        atype == _T.DATA_TYPE
        and not isinstance(v, DataType)
        and not (isinstance(v, str) and v.strip().lower() in enum_table(DataType))
    ):
        # numpy dtypes and their names as well as DataType names ("float32", np.float16, "HALF")
        if isinstance(v, int) and not isinstance(v, bool | enum.Enum):
            return int(coerce_enum(v, DataType, argument))
        return int(as_data_type(v, argument=argument))
    cls = _ENUM_OF_TYPE.get(atype)
    if cls is not None:
        return int(coerce_enum(v, cls, argument))
    raise TypeError(
        f"{argument}: attribute type {atype} has no Python conversion"
    )  # pragma: no cover


def _element_name(t: Any) -> str:
    return getattr(t, "__name__", repr(t))


def check_raw(atype: int, values: Any) -> None:
    """Refuse prebuilt ctypes data whose element is not *atype*'s C element.

    cuDNN reads ``count * sizeof(element of atype)`` bytes from the address it is given: a
    ``(c_int8 * 2)`` passed as ``INT64`` would make it read 16 bytes from 2. The element must
    have the C element's size, and be the same kind (integer, floating, pointer, structure).
    """
    want = CTYPE_OF_TYPE[atype]
    got = values._type_ if isinstance(values, ctypes.Array) else type(values)
    if got is want:
        return
    ok = (
        isinstance(got, type)
        and issubclass(got, ctypes._SimpleCData)
        and issubclass(want, ctypes._SimpleCData)
        and ctypes.sizeof(got) == ctypes.sizeof(want)
        and _kind(got) == _kind(want)
    )
    if not ok:
        form = "array of " if isinstance(values, ctypes.Array) else ""
        raise TypeError(
            f"values: a ctypes {form}{_element_name(got)} cannot be passed as "
            f"{_T(atype).name}, whose C element is {_element_name(want)} "
            f"({ctypes.sizeof(want)} bytes): cuDNN would read past the data"
        )


def _kind(t: Any) -> str:
    """The kind of a ctypes simple type: 'f' floating, 'P' pointer, 'i' integer/bool/char."""
    code = t._type_
    if code in "fdg":
        return "f"
    if code in "PzZ":
        return "P"
    return "i"


def pack(atype: int, values: Any, descriptor_class: type) -> tuple[Any, int]:
    """Python value(s) -> (ctypes array, element count); see :func:`to_c`."""
    ctype = CTYPE_OF_TYPE[atype]
    rng = _INT_RANGE.get(atype)
    vt = type(values)
    if rng is not None:
        # fast paths for the common int cases (dims, strides, uids, counts)
        if vt is int:
            if not rng[0] <= values <= rng[1]:
                raise OverflowError(f"value {values} does not fit in {_T(atype).name}")
            return (ctype * 1)(values), 1
        if (vt is list or vt is tuple) and values and all(type(v) is int for v in values):
            if min(values) < rng[0] or max(values) > rng[1]:
                raise OverflowError(f"values {describe(values)} do not fit in {_T(atype).name}")
            return (ctype * len(values))(*values), len(values)
    elif (
        atype == _T.VOID_PTR
        and (vt is list or vt is tuple)
        and values
        and all(type(v) is int and 0 <= v < 2**64 for v in values)
    ):
        # variant-pack data pointers: plain int addresses go straight into the array
        return (ctype * len(values))(*values), len(values)
    if atype == _T.CHAR:
        data = values.encode() if isinstance(values, str) else values
        if not isinstance(data, bytes | bytearray):
            raise TypeError(f"values for CHAR must be str or bytes, got {describe(values)}")
        return ctypes.create_string_buffer(bytes(data), len(data)), len(data)
    if (vt is list or vt is tuple) and not (
        atype == _T.FRACTION and len(values) == 2 and isinstance(values[0], int)
    ):
        items = values
    elif (
        isinstance(values, str | bytes | int | float | enum.Enum)
        or not isinstance(values, Iterable)
        or (atype == _T.FRACTION and vt is tuple)  # one (numerator, denominator) pair
    ):
        items = (values,)
    elif unordered(values):
        raise TypeError(
            f"values must be one value or a sequence (a tuple or list), got {describe(values)}: "
            "a mapping or a set has no order"
        )
    else:
        items = tuple(values)
    n = len(items)
    arr = (ctype * n)()
    for i, v in enumerate(items):
        arr[i] = to_c(atype, v, f"values[{i}]", descriptor_class)
    return arr, n


def from_c(atype: int, arr: Any, n: int) -> list[Any]:
    """The first *n* elements cuDNN wrote into *arr*, as Python values of *atype*."""
    if atype == _T.FRACTION:
        return [fractions.Fraction(arr[i].numerator, arr[i].denominator or 1) for i in range(n)]
    if atype == _T.CHAR:
        return [ctypes.string_at(arr, n).split(b"\0", 1)[0].decode(errors="replace")]
    cls = _ENUM_OF_TYPE.get(atype)
    out = list(arr[:n])
    if cls is not None:
        conv = []
        for v in out:
            try:
                conv.append(cls(v))
            except ValueError:
                conv.append(v)  # a value newer than these bindings: keep the int
        return conv
    if atype in (_T.HANDLE, _T.VOID_PTR):
        return [v or 0 for v in out]
    return out
