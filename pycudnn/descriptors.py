"""The descriptor layer: one RAII Python class per cuDNN descriptor family.

Design decisions:

* **Validate in Python, before any C call.** Constructors take Python values (shapes, strides,
  numpy dtypes or ``enums.DataType``, layout names, mode names or enum members) and reject bad
  ones with ``TypeError`` (wrong kind of value), ``ValueError`` (wrong value) or
  ``OverflowError`` (beyond cuDNN's int32 limit), each naming the argument, the value and what
  was expected. Several cuDNN calls segfault on bad input (``research/headers.md`` §7.3), so
  validation is what keeps them unreachable. What only cuDNN can judge comes back as the
  categorised :class:`~pycudnn.errors.CudnnError` of the failing call.
* **Properties read back through ``cudnnGet*``**, never from a Python-side copy, so a descriptor
  wrapped with ``from_ptr`` reads correctly. (The spatial-transformer descriptor has no getter in
  cuDNN; it is the one family that remembers its arguments.)
* **Lifecycle** comes from :class:`pycudnn._resource.Resource`: finalizer armed right after
  ``cudnnCreate*``, idempotent ``close()``, ``with``, ``from_ptr``/``detach``, live counters.
* **No cuDNN deprecation warnings from this layer.** Most legacy descriptor functions are
  ``CUDNN_DEPRECATED`` in cuDNN 9, but they are the only way to build these descriptors, and a
  user who asked for a ``ConvolutionDescriptor`` chose nothing deprecated. The layer calls them
  through :func:`_api`, which silences ``CudnnDeprecationWarning`` for its own calls (only the
  first call of each function can warn, so only that one is wrapped). Code calling
  ``pycudnn.api`` directly is still warned -- unless this layer already made the first call of
  that function in the process (the warning is once per function).
* **Handles and device buffers are protocols.** Descriptors that need them (dropout states, RNN)
  accept any object with ``.ptr`` (``_types.HasPtr``) and keep a strong reference; this module
  never imports ``handle`` or ``memory``.
"""

from __future__ import annotations

import ctypes
import enum
import fractions
import math
import operator
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Self

from . import _lib, enums, errors
from ._resource import Resource, live_counts
from ._types import HasPtr, as_data_type
from .enums import (
    BackendAttributeName,
    BackendAttributeType,
    BackendDescriptorType,
    DataType,
)

__all__ = [
    "BackendDescriptor",
    "live_counts",
]

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
DIM_MAX = 8  # CUDNN_DIM_MAX

# -- calling cuDNN ---------------------------------------------------------------------------------
_API: dict[str, Callable[..., Any]] = {}


def _api(name: str) -> Callable[..., Any]:
    """The checked C function *name*, without cuDNN deprecation warnings for this layer's calls."""
    fn = _API.get(name)
    if fn is None:
        checked = errors.checked(name)
        if _lib.PROTOTYPES[name][3]:  # CUDNN_DEPRECATED: only its first call can warn

            def first_call(*args: Any, _checked: Any = checked, _name: str = name) -> Any:
                _API[_name] = _checked  # later calls never warn (errors warns once per function)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", errors.CudnnDeprecationWarning)
                    return _checked(*args)

            fn = first_call
        else:
            fn = checked
        _API[name] = fn
    return fn


# -- argument validation (pure Python, no C calls) -------------------------------------------------
def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _as_int(value: Any, argument: str) -> int:
    if isinstance(value, bool | enum.Enum | float):
        raise TypeError(f"{argument} must be an integer, got {_describe(value)}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{argument} must be an integer, got {_describe(value)}") from None


def _int_in(value: Any, argument: str, lo: int, hi: int = INT32_MAX, what: str = "") -> int:
    """An int in [lo, hi]; ValueError below *lo*, OverflowError above *hi* (cuDNN's int range)."""
    v = _as_int(value, argument)
    if v < lo:
        raise ValueError(f"{argument}={v} is invalid; expected {what or f'an integer >= {lo}'}")
    if v > hi:
        raise OverflowError(f"{argument}={v} exceeds cuDNN's limit of {hi}")
    return v


def _int_seq(
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
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise TypeError(f"{argument} must be a sequence of integers, got {_describe(value)}")
    items = tuple(value)
    if length is not None and len(items) != length:
        raise ValueError(
            f"{argument}={_describe(items)} has {len(items)} entries; expected {length}"
        )
    if length is None and not min_len <= len(items) <= max_len:
        raise ValueError(
            f"{argument}={_describe(items)} has {len(items)} entries; expected "
            f"{min_len} to {max_len}"
        )
    out = []
    for i, v in enumerate(items):
        out.append(_int_in(v, f"{argument}[{i}]", lo, hi, what))
    return tuple(out)


def _spatial(
    value: Any, argument: str, n: int, *, lo: int, what: str = "", hi: int = INT32_MAX
) -> tuple[int, ...]:
    """An int broadcast to *n* spatial dims, or a sequence of exactly *n* ints."""
    if not isinstance(value, str | bytes) and isinstance(value, Iterable):
        return _int_seq(value, argument, lo=lo, hi=hi, length=n, what=what)
    v = _int_in(value, argument, lo, hi, what)
    return (v,) * n


def _as_float(value: Any, argument: str) -> float:
    if isinstance(value, bool | str | bytes):
        raise TypeError(f"{argument} must be a real number, got {_describe(value)}")
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{argument} must be a real number, got {_describe(value)}") from None
    if math.isnan(f):
        raise ValueError(f"{argument} must not be NaN")
    return f


_ENUM_TABLES: dict[type, dict[str, enum.Enum]] = {}


def _enum_table(cls: type[enums.CudnnEnum]) -> dict[str, enum.Enum]:
    table = _ENUM_TABLES.get(cls)
    if table is None:
        table = {}
        for m in cls:
            table[m.name.lower()] = m
            table[m.c_name.lower()] = m
        _ENUM_TABLES[cls] = table
    return table


def _enum(
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
        member = (aliases or {}).get(key) or _enum_table(cls).get(key)
        if member is None:
            names = sorted(aliases) if aliases else [m.name.lower() for m in cls]
            raise ValueError(
                f"{argument}={value!r} is not a valid {cls.__name__}; expected one of "
                f"{', '.join(repr(n) for n in names)} or a pycudnn.enums.{cls.__name__} member"
            )
    elif isinstance(value, enum.Enum | bool):
        raise TypeError(
            f"{argument}={_describe(value)} is not a {cls.__name__}; expected a "
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
            f"{argument}={_describe(value)} is not a {cls.__name__}; expected a "
            f"pycudnn.enums.{cls.__name__} member or its name"
        )
    if allowed is not None and member not in allowed:
        raise ValueError(
            f"{argument}={member.name} is not supported here; expected one of "
            f"{', '.join(m.name for m in allowed)}"
        )
    return member


def _dtype(value: Any, argument: str, allowed: Iterable[DataType]) -> DataType:
    """A numpy dtype / name / DataType, restricted to what the descriptor supports."""
    if isinstance(value, bool):
        raise TypeError(f"{argument}={value!r} is not a dtype")
    dt = as_data_type(value, argument=argument)
    allowed = tuple(allowed)
    if dt not in allowed:
        raise TypeError(
            f"{argument}={dt.name} is not supported by this descriptor; expected one of "
            f"{', '.join(_DTYPE_NAME.get(a, a.name) for a in allowed)}"
        )
    return dt


_DTYPE_NAME = {
    DataType.FLOAT: "float32",
    DataType.DOUBLE: "float64",
    DataType.HALF: "float16",
    DataType.BFLOAT16: "bfloat16",
    DataType.INT8: "int8",
    DataType.UINT8: "uint8",
    DataType.INT32: "int32",
    DataType.INT64: "int64",
    DataType.BOOLEAN: "bool",
}


def _dtype_str(dt: DataType) -> str:
    return _DTYPE_NAME.get(dt, dt.name)


def _c_int_array(values: Sequence[int]) -> ctypes.Array:
    return (ctypes.c_int * len(values))(*values)


def _keep_handle(value: Any, argument: str) -> Any:
    """Check that *value* exposes an int ``.ptr`` (``HasPtr``) and return the int."""
    if not isinstance(value, HasPtr):
        raise TypeError(
            f"{argument} must be an object with an int .ptr (a pycudnn Handle or device buffer), "
            f"got {_describe(value)}"
        )
    ptr = value.ptr
    if isinstance(ptr, bool) or not isinstance(ptr, int):
        raise TypeError(f"{argument}.ptr must be an int, got {_describe(ptr)}")
    return ptr


# ==================================================================================================
# Backend (graph API) descriptors
# ==================================================================================================
_T = BackendAttributeType
# attribute type -> (ctypes element type, Python -> C converter name, enum class for read-back)
_ENUM_OF_TYPE: dict[int, type[enums.CudnnEnum]] = {
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
_CTYPE_OF_TYPE: dict[int, Any] = {
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
    **{t: ctypes.c_int for t in _ENUM_OF_TYPE},
}
_INT_RANGE = {_T.INT64: (-(2**63), INT64_MAX), _T.INT32: (-(2**31), INT32_MAX)}


def _backend_type(value: Any) -> BackendDescriptorType:
    if isinstance(value, str):
        key = value.strip().lower()
        if not key.endswith("_descriptor"):
            key += "_descriptor"  # BackendDescriptor("tensor") reads naturally
        value = key if key in _enum_table(BackendDescriptorType) else value
    return _enum(value, BackendDescriptorType, "descriptor_type")


def _attr_name(value: Any) -> int:
    # hot path: members and ints skip the coercion machinery
    if type(value) is BackendAttributeName:
        return value
    return _enum(value, BackendAttributeName, "attribute")


def _attr_type(value: Any) -> int:
    if type(value) is BackendAttributeType:
        return value
    return _enum(value, BackendAttributeType, "attr_type")


def _to_c(atype: int, v: Any, argument: str) -> Any:
    """One Python value -> the C element of *atype* (validated)."""
    if atype == _T.BACKEND_DESCRIPTOR:
        if isinstance(v, BackendDescriptor):
            return v.ptr
        raise TypeError(f"{argument} must be a BackendDescriptor, got {_describe(v)}")
    if atype in _INT_RANGE:
        lo, hi = _INT_RANGE[atype]
        i = _as_int(v, argument)
        if not lo <= i <= hi:
            raise OverflowError(
                f"{argument}={i} does not fit in {BackendAttributeType(atype).name}"
            )
        return i
    if atype == _T.FLOAT or atype == _T.DOUBLE:
        if isinstance(v, bool | str | bytes):
            raise TypeError(f"{argument} must be a real number, got {_describe(v)}")
        try:
            return float(v)
        except (TypeError, ValueError):
            raise TypeError(f"{argument} must be a real number, got {_describe(v)}") from None
    if atype == _T.BOOLEAN:
        if not isinstance(v, bool | int):
            raise TypeError(f"{argument} must be a bool, got {_describe(v)}")
        return bool(v)
    if atype == _T.HANDLE or atype == _T.VOID_PTR:
        if v is None:
            return None
        if isinstance(v, int) and not isinstance(v, bool):
            return v
        return _keep_handle(v, argument)
    if atype == _T.FRACTION:
        if isinstance(v, _lib.cudnnFraction_t):
            return v
        if isinstance(v, tuple) and len(v) == 2:
            num, den = _as_int(v[0], argument), _as_int(v[1], argument)
        elif isinstance(v, fractions.Fraction | int) and not isinstance(v, bool):
            f = fractions.Fraction(v)
            num, den = f.numerator, f.denominator
        else:
            raise TypeError(
                f"{argument} must be a Fraction, an int or a (numerator, denominator) pair, "
                f"got {_describe(v)}"
            )
        return _lib.cudnnFraction_t(num, den)
    cls = _ENUM_OF_TYPE.get(atype)
    if cls is not None:
        return int(_enum(v, cls, argument))
    raise TypeError(
        f"{argument}: attribute type {atype} has no Python conversion"
    )  # pragma: no cover


def _pack(atype: int, values: Any) -> tuple[Any, int]:
    """Python value(s) -> (ctypes array, element count)."""
    ctype = _CTYPE_OF_TYPE[atype]
    if atype == _T.CHAR:
        data = values.encode() if isinstance(values, str) else values
        if not isinstance(data, bytes | bytearray):
            raise TypeError(f"values for CHAR must be str or bytes, got {_describe(values)}")
        return ctypes.create_string_buffer(bytes(data), len(data)), len(data)
    if isinstance(values, list | tuple) and not (
        atype == _T.FRACTION and len(values) == 2 and isinstance(values[0], int)
    ):
        items = values
    elif isinstance(values, Iterable) and not isinstance(values, str | bytes):
        items = tuple(values)
    else:
        items = (values,)
    n = len(items)
    arr = (ctype * n)()
    if atype in _INT_RANGE and n and all(type(v) is int for v in items):
        lo, hi = _INT_RANGE[atype]
        if min(items) < lo or max(items) > hi:
            raise OverflowError(f"values {_describe(items)} do not fit in {_T(atype).name}")
        arr[:] = items  # fast path for plain int lists (dims, strides, uids)
        return arr, n
    for i, v in enumerate(items):
        arr[i] = _to_c(atype, v, f"values[{i}]")
    return arr, n


def _from_c(atype: int, arr: Any, n: int) -> list[Any]:
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


class BackendDescriptor(Resource):
    """A cuDNN graph-API (backend) descriptor: ``cudnnBackendCreateDescriptor`` and friends.

    Parameters
    ----------
    descriptor_type : BackendDescriptorType or str
        A member of :class:`pycudnn.enums.BackendDescriptorType`, its name
        (``"TENSOR_DESCRIPTOR"``, ``"CUDNN_BACKEND_TENSOR_DESCRIPTOR"``) or the name without the
        ``_DESCRIPTOR`` suffix (``"tensor"``, ``"operation_convolution_forward"``).

    Notes
    -----
    Attributes are set with :meth:`set`, the descriptor is frozen with :meth:`finalize`, and
    (after finalisation) read with :meth:`get`. Descriptors passed as attribute values are kept
    alive by this one. The thin constructors (:meth:`tensor`, :meth:`convolution`,
    :meth:`pointwise`, :meth:`operation_convolution_forward`, ...) validate their arguments in
    Python and finalize by default.

    Examples
    --------
    >>> t = BackendDescriptor("tensor")
    >>> t.set("TENSOR_DIMENSIONS", "INT64", [1, 8, 16, 16])
    """

    _c_type = _lib.cudnnBackendDescriptor_t
    _destroy_name = "cudnnBackendDestroyDescriptor"
    __slots__ = ("_attr_refs", "_finalized", "_type")

    def __init__(self, descriptor_type: BackendDescriptorType | str | int) -> None:
        dtype = _backend_type(descriptor_type)
        h = self._new_handle()
        _api("cudnnBackendCreateDescriptor")(int(dtype), ctypes.byref(h))
        self._adopt(h)
        self._type = dtype
        self._finalized = False
        self._attr_refs: dict[int, Any] = {}

    def _init_from_ptr(self) -> None:
        self._type = None
        self._finalized = None
        self._attr_refs = {}

    @classmethod
    def from_ptr(
        cls,
        ptr: int,
        *,
        owner: Any = None,
        descriptor_type: BackendDescriptorType | str | None = None,
        finalized: bool | None = None,
    ) -> Self:
        """Wrap a backend descriptor made elsewhere (never destroyed by the wrapper).

        cuDNN cannot report a backend descriptor's type or state, so pass them if known.
        """
        dtype = None if descriptor_type is None else _backend_type(descriptor_type)
        self = super().from_ptr(ptr, owner=owner)
        self._type = dtype
        self._finalized = finalized
        return self

    def _mark_closed(self) -> None:
        super()._mark_closed()
        self._attr_refs = {}

    @property
    def descriptor_type(self) -> BackendDescriptorType | None:
        """The :class:`~pycudnn.enums.BackendDescriptorType` (None if wrapped and unknown)."""
        return self._type

    @property
    def is_finalized(self) -> bool | None:
        """True after :meth:`finalize` succeeded (None if wrapped and unknown)."""
        self._h()
        return self._finalized

    def set(self, attribute: Any, attr_type: Any, values: Any) -> None:
        """``cudnnBackendSetAttribute``: set *attribute* to *values* of type *attr_type*.

        Parameters
        ----------
        attribute : BackendAttributeName or str
            Member or name (``"TENSOR_DIMENSIONS"`` or ``"CUDNN_ATTR_TENSOR_DIMENSIONS"``).
        attr_type : BackendAttributeType or str
            Member or name (``"INT64"`` or ``"CUDNN_TYPE_INT64"``).
        values : scalar, sequence, or ctypes data
            One value or a sequence of them, converted according to *attr_type*: ints (INT64,
            INT32), floats (FLOAT, DOUBLE), bools, enum members or names (DATA_TYPE,
            CONVOLUTION_MODE, POINTWISE_MODE, ...), :class:`BackendDescriptor` objects
            (BACKEND_DESCRIPTOR; kept alive by this descriptor), objects with ``.ptr`` or ints
            (HANDLE, VOID_PTR), ``str``/``bytes`` (CHAR), ``Fraction`` or ``(num, den)``
            (FRACTION). A prebuilt ctypes array is passed through as is (its length is the
            element count), and so is a single ctypes scalar or structure (count 1) -- the
            cheapest form for hot paths.

        Raises
        ------
        TypeError, ValueError, OverflowError
            A value cannot be converted to *attr_type* (no C call is made).
        ValueError
            The descriptor is closed.
        BadParamError
            cuDNN rejected the attribute (e.g. ``CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE`` for a
            wrong *attr_type*, or any set after :meth:`finalize`).
        """
        h = self._h()
        name = _attr_name(attribute)
        atype = _attr_type(attr_type)
        if isinstance(values, ctypes.Array):
            arr, n = values, len(values)
        elif isinstance(values, ctypes._SimpleCData | ctypes.Structure):
            arr, n = ctypes.byref(values), 1
        else:
            arr, n = _pack(atype, values)
            if atype == _T.BACKEND_DESCRIPTOR:
                # children keep their parents alive: cuDNN may refer to them until we are gone
                self._attr_refs[int(name)] = values
        _api("cudnnBackendSetAttribute")(h, name, atype, n, arr)

    def get(
        self,
        attribute: Any,
        attr_type: Any,
        count: int | None = None,
        *,
        descriptor_type: Any = None,
    ) -> list[Any]:
        """``cudnnBackendGetAttribute``: read up to *count* elements of *attribute*.

        Parameters
        ----------
        attribute, attr_type
            As in :meth:`set`.
        count : int, optional
            How many elements to read; by default cuDNN is asked for the count first.
        descriptor_type : BackendDescriptorType or str, optional
            For ``BACKEND_DESCRIPTOR`` attributes: the type of the descriptors cuDNN fills in
            (e.g. ``"ENGINECFG_DESCRIPTOR"`` for ``ENGINEHEUR_RESULTS``). Required then.

        Returns
        -------
        list
            The elements cuDNN returned: ints, floats, bools, enum members, ``Fraction``s, a
            one-element list holding the string for CHAR, or new :class:`BackendDescriptor`
            objects for BACKEND_DESCRIPTOR.

        Raises
        ------
        CudnnError
            cuDNN refused (reading a non-finalized descriptor gives ``SublibraryError``
            ``CUDNN_STATUS_NOT_INITIALIZED``; a wrong type gives ``BadParamError``).
        """
        h = self._h()
        name = _attr_name(attribute)
        atype = _attr_type(attr_type)
        fn = _api("cudnnBackendGetAttribute")
        got = ctypes.c_int64(0)
        if count is None:
            fn(h, name, atype, 0, ctypes.byref(got), None)
            count = got.value
        count = _int_in(count, "count", 0, INT32_MAX)
        if atype == _T.BACKEND_DESCRIPTOR:
            if descriptor_type is None:
                raise TypeError("descriptor_type is required to read BACKEND_DESCRIPTOR values")
            dtype = _backend_type(descriptor_type)
            descs = [BackendDescriptor(dtype) for _ in range(count)]
            arr = (ctypes.c_void_p * max(count, 1))(*[d.ptr for d in descs])
            try:
                fn(h, name, atype, count, ctypes.byref(got), arr)
            except BaseException:
                for d in descs:
                    d.close()
                raise
            for d in descs[got.value :]:
                d.close()
            out = descs[: got.value]
            for d in out:
                d._finalized = True  # cuDNN hands out finalized copies
            return out
        ctype = _CTYPE_OF_TYPE[atype]
        arr = (ctype * max(count, 1))()
        fn(h, name, atype, count, ctypes.byref(got), arr)
        return _from_c(atype, arr, min(got.value, count))

    def finalize(self) -> Self:
        """``cudnnBackendFinalize``: validate and freeze the attributes. Returns ``self``.

        Raises
        ------
        CudnnError
            cuDNN rejected the configuration (without a GPU driver every finalize returns
            ``CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED``, a :class:`~pycudnn.errors.SublibraryError`).
        """
        _api("cudnnBackendFinalize")(self._h())
        self._finalized = True
        return self

    def _repr_fields(self) -> str:
        kind = self._type.name if self._type is not None else "unknown"
        state = {True: "finalized", False: "not finalized", None: "state unknown"}[self._finalized]
        return f"{kind}, {state}"

    # -- thin constructors used by the high-level layer -----------------------------------------
    @classmethod
    def _build(cls, dtype: BackendDescriptorType, attrs: list[tuple], finalize: bool) -> Self:
        self = cls(dtype)
        for name, atype, values in attrs:
            self.set(name, atype, values)
        if finalize:
            self.finalize()
        return self

    @classmethod
    def tensor(
        cls,
        shape: Sequence[int],
        strides: Sequence[int] | None = None,
        dtype: Any = "float32",
        *,
        uid: int,
        alignment: int = 16,
        is_virtual: bool = False,
        is_by_value: bool = False,
        finalize: bool = True,
    ) -> Self:
        """A ``TENSOR_DESCRIPTOR`` with dims, strides (packed row-major by default), data type,
        unique id and byte alignment.

        Raises
        ------
        TypeError, ValueError, OverflowError
            Invalid shape, strides, dtype, uid or alignment (before any C call).
        """
        shape = _int_seq(shape, "shape", lo=1, hi=INT64_MAX, min_len=1, max_len=DIM_MAX)
        if strides is None:
            strides = _packed_strides(shape)
        else:
            strides = _int_seq(strides, "strides", lo=1, hi=INT64_MAX, length=len(shape))
        dt = as_data_type(dtype, argument="dtype") if not isinstance(dtype, DataType) else dtype
        uid = _int_in(uid, "uid", 0, INT64_MAX)
        alignment = _int_in(alignment, "alignment", 1, INT64_MAX)
        return cls._build(
            BackendDescriptorType.TENSOR_DESCRIPTOR,
            [
                (BackendAttributeName.TENSOR_DATA_TYPE, _T.DATA_TYPE, dt),
                (BackendAttributeName.TENSOR_DIMENSIONS, _T.INT64, list(shape)),
                (BackendAttributeName.TENSOR_STRIDES, _T.INT64, list(strides)),
                (BackendAttributeName.TENSOR_UNIQUE_ID, _T.INT64, uid),
                (BackendAttributeName.TENSOR_BYTE_ALIGNMENT, _T.INT64, alignment),
                (BackendAttributeName.TENSOR_IS_VIRTUAL, _T.BOOLEAN, bool(is_virtual)),
                (BackendAttributeName.TENSOR_IS_BY_VALUE, _T.BOOLEAN, bool(is_by_value)),
            ],
            finalize,
        )

    @classmethod
    def convolution(
        cls,
        pre_padding: Sequence[int],
        post_padding: Sequence[int] | None = None,
        stride: Sequence[int] | int = 1,
        dilation: Sequence[int] | int = 1,
        *,
        mode: Any = "cross_correlation",
        compute_type: Any = "float32",
        finalize: bool = True,
    ) -> Self:
        """A ``CONVOLUTION_DESCRIPTOR``; the number of spatial dims is ``len(pre_padding)``.

        *mode* is ``"cross_correlation"`` (PyTorch semantics) or ``"convolution"`` (flipped
        kernel), or a :class:`~pycudnn.enums.ConvolutionMode`.
        """
        pre = _int_seq(pre_padding, "pre_padding", lo=0, hi=INT64_MAX, min_len=1, max_len=6)
        n = len(pre)
        post = (
            pre
            if post_padding is None
            else _int_seq(post_padding, "post_padding", lo=0, hi=INT64_MAX, length=n)
        )
        stride = _spatial(stride, "stride", n, lo=1, hi=INT64_MAX)
        dilation = _spatial(dilation, "dilation", n, lo=1, hi=INT64_MAX)
        mode = _enum(mode, enums.ConvolutionMode, "mode", _CONV_MODES)
        ct = _dtype(compute_type, "compute_type", _COMPUTE_TYPES)
        return cls._build(
            BackendDescriptorType.CONVOLUTION_DESCRIPTOR,
            [
                (BackendAttributeName.CONVOLUTION_COMP_TYPE, _T.DATA_TYPE, ct),
                (BackendAttributeName.CONVOLUTION_CONV_MODE, _T.CONVOLUTION_MODE, mode),
                (BackendAttributeName.CONVOLUTION_SPATIAL_DIMS, _T.INT64, n),
                (BackendAttributeName.CONVOLUTION_PRE_PADDINGS, _T.INT64, list(pre)),
                (BackendAttributeName.CONVOLUTION_POST_PADDINGS, _T.INT64, list(post)),
                (BackendAttributeName.CONVOLUTION_FILTER_STRIDES, _T.INT64, list(stride)),
                (BackendAttributeName.CONVOLUTION_DILATIONS, _T.INT64, list(dilation)),
            ],
            finalize,
        )

    @classmethod
    def pointwise(
        cls,
        mode: Any,
        compute_type: Any = "float32",
        *,
        relu_lower_clip: float | None = None,
        relu_upper_clip: float | None = None,
        relu_lower_clip_slope: float | None = None,
        elu_alpha: float | None = None,
        softplus_beta: float | None = None,
        swish_beta: float | None = None,
        axis: int | None = None,
        finalize: bool = True,
    ) -> Self:
        """A ``POINTWISE_DESCRIPTOR`` (*mode*: a :class:`~pycudnn.enums.PointwiseMode` or its
        name, e.g. ``"add"``, ``"relu_fwd"``); optional parameters are set only when given."""
        mode = _enum(mode, enums.PointwiseMode, "mode")
        ct = _dtype(compute_type, "compute_type", _COMPUTE_TYPES)
        attrs: list[tuple] = [
            (BackendAttributeName.POINTWISE_MODE, _T.POINTWISE_MODE, mode),
            (BackendAttributeName.POINTWISE_MATH_PREC, _T.DATA_TYPE, ct),
        ]
        for attr, value, arg in (
            (BackendAttributeName.POINTWISE_RELU_LOWER_CLIP, relu_lower_clip, "relu_lower_clip"),
            (BackendAttributeName.POINTWISE_RELU_UPPER_CLIP, relu_upper_clip, "relu_upper_clip"),
            (
                BackendAttributeName.POINTWISE_RELU_LOWER_CLIP_SLOPE,
                relu_lower_clip_slope,
                "relu_lower_clip_slope",
            ),
            (BackendAttributeName.POINTWISE_ELU_ALPHA, elu_alpha, "elu_alpha"),
            (BackendAttributeName.POINTWISE_SOFTPLUS_BETA, softplus_beta, "softplus_beta"),
            (BackendAttributeName.POINTWISE_SWISH_BETA, swish_beta, "swish_beta"),
        ):
            if value is not None:
                attrs.append((attr, _T.DOUBLE, _as_float(value, arg)))
        if axis is not None:
            attrs.append((BackendAttributeName.POINTWISE_AXIS, _T.INT64, _int_in(axis, "axis", 0)))
        return cls._build(BackendDescriptorType.POINTWISE_DESCRIPTOR, attrs, finalize)

    @classmethod
    def _conv_op(
        cls,
        dtype: BackendDescriptorType,
        names: tuple[BackendAttributeName, ...],
        tensors: tuple[tuple[str, Any], ...],
        conv: Any,
        alpha: float,
        beta: float,
        finalize: bool,
    ) -> Self:
        alpha_name, beta_name, conv_name, *tensor_names = names
        attrs: list[tuple] = []
        for (arg, desc), attr in zip(tensors, tensor_names, strict=True):
            _require_backend(desc, arg, BackendDescriptorType.TENSOR_DESCRIPTOR)
            attrs.append((attr, _T.BACKEND_DESCRIPTOR, desc))
        _require_backend(conv, "conv", BackendDescriptorType.CONVOLUTION_DESCRIPTOR)
        attrs.append((conv_name, _T.BACKEND_DESCRIPTOR, conv))
        attrs.append((alpha_name, _T.DOUBLE, _as_float(alpha, "alpha")))
        attrs.append((beta_name, _T.DOUBLE, _as_float(beta, "beta")))
        return cls._build(dtype, attrs, finalize)

    @classmethod
    def operation_convolution_forward(
        cls,
        x: BackendDescriptor,
        w: BackendDescriptor,
        y: BackendDescriptor,
        conv: BackendDescriptor,
        *,
        alpha: float = 1.0,
        beta: float = 0.0,
        finalize: bool = True,
    ) -> Self:
        """``OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR``: ``y = alpha * conv(x, w) + beta * y``."""
        A = BackendAttributeName
        return cls._conv_op(
            BackendDescriptorType.OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
            (
                A.OPERATION_CONVOLUTION_FORWARD_ALPHA,
                A.OPERATION_CONVOLUTION_FORWARD_BETA,
                A.OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                A.OPERATION_CONVOLUTION_FORWARD_X,
                A.OPERATION_CONVOLUTION_FORWARD_W,
                A.OPERATION_CONVOLUTION_FORWARD_Y,
            ),
            (("x", x), ("w", w), ("y", y)),
            conv,
            alpha,
            beta,
            finalize,
        )

    @classmethod
    def operation_convolution_backward_data(
        cls,
        dx: BackendDescriptor,
        w: BackendDescriptor,
        dy: BackendDescriptor,
        conv: BackendDescriptor,
        *,
        alpha: float = 1.0,
        beta: float = 0.0,
        finalize: bool = True,
    ) -> Self:
        """``OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR`` (gradient w.r.t. the input)."""
        A = BackendAttributeName
        return cls._conv_op(
            BackendDescriptorType.OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
            (
                A.OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                A.OPERATION_CONVOLUTION_BWD_DATA_BETA,
                A.OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
                A.OPERATION_CONVOLUTION_BWD_DATA_DX,
                A.OPERATION_CONVOLUTION_BWD_DATA_W,
                A.OPERATION_CONVOLUTION_BWD_DATA_DY,
            ),
            (("dx", dx), ("w", w), ("dy", dy)),
            conv,
            alpha,
            beta,
            finalize,
        )

    @classmethod
    def operation_convolution_backward_filter(
        cls,
        x: BackendDescriptor,
        dw: BackendDescriptor,
        dy: BackendDescriptor,
        conv: BackendDescriptor,
        *,
        alpha: float = 1.0,
        beta: float = 0.0,
        finalize: bool = True,
    ) -> Self:
        """``OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR`` (gradient w.r.t. the filter)."""
        A = BackendAttributeName
        return cls._conv_op(
            BackendDescriptorType.OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
            (
                A.OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
                A.OPERATION_CONVOLUTION_BWD_FILTER_BETA,
                A.OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
                A.OPERATION_CONVOLUTION_BWD_FILTER_X,
                A.OPERATION_CONVOLUTION_BWD_FILTER_DW,
                A.OPERATION_CONVOLUTION_BWD_FILTER_DY,
            ),
            (("x", x), ("dw", dw), ("dy", dy)),
            conv,
            alpha,
            beta,
            finalize,
        )

    @classmethod
    def operation_pointwise(
        cls,
        pointwise: BackendDescriptor,
        x: BackendDescriptor,
        y: BackendDescriptor,
        b: BackendDescriptor | None = None,
        *,
        alpha1: float = 1.0,
        alpha2: float = 1.0,
        finalize: bool = True,
    ) -> Self:
        """``OPERATION_POINTWISE_DESCRIPTOR``: ``y = op(alpha1 * x[, alpha2 * b])``."""
        A = BackendAttributeName
        _require_backend(pointwise, "pointwise", BackendDescriptorType.POINTWISE_DESCRIPTOR)
        attrs: list[tuple] = [
            (A.OPERATION_POINTWISE_PW_DESCRIPTOR, _T.BACKEND_DESCRIPTOR, pointwise)
        ]
        for arg, desc, attr in (
            ("x", x, A.OPERATION_POINTWISE_XDESC),
            ("y", y, A.OPERATION_POINTWISE_YDESC),
            ("b", b, A.OPERATION_POINTWISE_BDESC),
        ):
            if desc is None and arg == "b":
                continue
            _require_backend(desc, arg, BackendDescriptorType.TENSOR_DESCRIPTOR)
            attrs.append((attr, _T.BACKEND_DESCRIPTOR, desc))
        attrs.append((A.OPERATION_POINTWISE_ALPHA1, _T.DOUBLE, _as_float(alpha1, "alpha1")))
        attrs.append((A.OPERATION_POINTWISE_ALPHA2, _T.DOUBLE, _as_float(alpha2, "alpha2")))
        return cls._build(BackendDescriptorType.OPERATION_POINTWISE_DESCRIPTOR, attrs, finalize)

    @classmethod
    def operation_graph(
        cls, ops: Sequence[BackendDescriptor], handle: Any = None, *, finalize: bool = True
    ) -> Self:
        """``OPERATIONGRAPH_DESCRIPTOR`` over the operation descriptors *ops*; *handle* (an
        object with ``.ptr``) is optional in cuDNN 9 and kept alive when given."""
        if isinstance(ops, BackendDescriptor) or not isinstance(ops, Sequence) or not ops:
            raise TypeError(f"ops must be a non-empty sequence of BackendDescriptor, got {ops!r}")
        for i, op in enumerate(ops):
            _require_backend(op, f"ops[{i}]", None)
        attrs: list[tuple] = [
            (BackendAttributeName.OPERATIONGRAPH_OPS, _T.BACKEND_DESCRIPTOR, list(ops))
        ]
        if handle is not None:
            _keep_handle(handle, "handle")
            attrs.append((BackendAttributeName.OPERATIONGRAPH_HANDLE, _T.HANDLE, handle))
        self = cls._build(BackendDescriptorType.OPERATIONGRAPH_DESCRIPTOR, attrs, finalize)
        if handle is not None:
            self._refs.append(handle)
        return self


_CONV_MODES = {
    "cross_correlation": enums.ConvolutionMode.CROSS_CORRELATION,
    "cross": enums.ConvolutionMode.CROSS_CORRELATION,
    "convolution": enums.ConvolutionMode.CONVOLUTION,
    "conv": enums.ConvolutionMode.CONVOLUTION,
}
_COMPUTE_TYPES = (DataType.FLOAT, DataType.DOUBLE, DataType.HALF, DataType.BFLOAT16, DataType.INT32)


def _require_backend(value: Any, argument: str, dtype: BackendDescriptorType | None) -> None:
    if not isinstance(value, BackendDescriptor):
        raise TypeError(f"{argument} must be a BackendDescriptor, got {_describe(value)}")
    value._h()
    if dtype is not None and value._type is not None and value._type != dtype:
        raise ValueError(f"{argument} must be a {dtype.name}, got a {value._type.name}")


def _packed_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return tuple(strides)
