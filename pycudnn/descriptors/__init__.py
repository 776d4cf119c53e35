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
  user who asked for a ``ConvolutionDescriptor`` chose nothing deprecated. The layer calls
  every C function through ``errors.checked(name, warn=False)``, which neither warns nor uses
  up the one-time warning: code calling ``pycudnn.api`` directly is still warned, once per
  function.
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
from collections.abc import Iterable, Sequence
from typing import Any, Self

from .. import _lib, enums, errors
from .._layout import INT32_MAX, INT64_MAX, UINT64_MAX, packed_strides, span
from .._resource import Resource, live_counts
from .._types import HasPtr, as_data_type, dtype_name
from ..enums import (
    BackendAttributeName,
    BackendAttributeType,
    BackendDescriptorType,
    DataType,
)

__all__ = [
    "ActivationDescriptor",
    "BackendDescriptor",
    "CTCLossDescriptor",
    "ConvolutionDescriptor",
    "DropoutDescriptor",
    "FilterDescriptor",
    "LRNDescriptor",
    "OpTensorDescriptor",
    "PoolingDescriptor",
    "RNNDataDescriptor",
    "RNNDescriptor",
    "ReduceTensorDescriptor",
    "SpatialTransformerDescriptor",
    "TensorDescriptor",
    "live_counts",
]

DIM_MAX = _lib.CUDNN_DIM_MAX


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
        member = aliases.get(key) if aliases else None  # members may be 0: test `is None`
        if member is None:
            member = _enum_table(cls).get(key)
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
            f"{', '.join(dtype_name(a) for a in allowed)}"
        )
    return dt


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
_REF_TYPES = frozenset((int(_T.BACKEND_DESCRIPTOR), int(_T.HANDLE), int(_T.VOID_PTR)))
_INT_RANGE = {int(_T.INT64): (-(2**63), INT64_MAX), int(_T.INT32): (-(2**31), INT32_MAX)}
# Enum members hash by name (a Python-level __hash__): key the hot tables by plain ints
_ENUM_OF_TYPE = {int(k): v for k, v in _ENUM_OF_TYPE.items()}
_CTYPE_OF_TYPE = {int(k): v for k, v in _CTYPE_OF_TYPE.items()}


def _backend_type(value: Any) -> BackendDescriptorType:
    if isinstance(value, str):
        key = value.strip().lower()
        if not key.endswith("_descriptor"):
            key += "_descriptor"  # BackendDescriptor("tensor") reads naturally
        value = key if key in _enum_table(BackendDescriptorType) else value
    return _enum(value, BackendDescriptorType, "descriptor_type")


def _attr_name(value: Any) -> int:
    # hot path: members skip the coercion machinery
    if type(value) is BackendAttributeName:
        return int(value)
    return int(_enum(value, BackendAttributeName, "attribute"))


def _attr_type(value: Any) -> int:
    if type(value) is BackendAttributeType:
        return int(value)
    return int(_enum(value, BackendAttributeType, "attr_type"))


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
    if (
        atype == _T.DATA_TYPE
        and not isinstance(v, DataType)
        and not (isinstance(v, str) and v.strip().lower() in _enum_table(DataType))
    ):
        # numpy dtypes and their names as well as DataType names ("float32", np.float16, "HALF")
        if isinstance(v, int) and not isinstance(v, bool | enum.Enum):
            return int(_enum(v, DataType, argument))
        return int(as_data_type(v, argument=argument))
    cls = _ENUM_OF_TYPE.get(atype)
    if cls is not None:
        return int(_enum(v, cls, argument))
    raise TypeError(
        f"{argument}: attribute type {atype} has no Python conversion"
    )  # pragma: no cover


def _pack(atype: int, values: Any) -> tuple[Any, int]:
    """Python value(s) -> (ctypes array, element count)."""
    ctype = _CTYPE_OF_TYPE[atype]
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
                raise OverflowError(f"values {_describe(values)} do not fit in {_T(atype).name}")
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
            raise TypeError(f"values for CHAR must be str or bytes, got {_describe(values)}")
        return ctypes.create_string_buffer(bytes(data), len(data)), len(data)
    if (vt is list or vt is tuple) and not (
        atype == _T.FRACTION and len(values) == 2 and isinstance(values[0], int)
    ):
        items = values
    elif isinstance(values, str | bytes | int | float | enum.Enum) or not isinstance(
        values, Iterable
    ):
        items = (values,)
    else:
        items = tuple(values)
    n = len(items)
    arr = (ctype * n)()
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
        errors.checked("cudnnBackendCreateDescriptor", warn=False)(int(dtype), ctypes.byref(h))
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
        self._h()
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
            if atype in _REF_TYPES and not isinstance(values, int):
                # children keep their parents alive: cuDNN refers to these descriptors, handles
                # and buffers by address until this descriptor is gone (or the value replaced)
                self._attr_refs[int(name)] = values
        errors.checked("cudnnBackendSetAttribute", warn=False)(h, name, atype, n, arr)

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
        fn = errors.checked("cudnnBackendGetAttribute", warn=False)
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
        errors.checked("cudnnBackendFinalize", warn=False)(self._h())
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
            strides = packed_strides(shape)
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
        # set() keeps the handle object alive with the other attribute values
        return cls._build(BackendDescriptorType.OPERATIONGRAPH_DESCRIPTOR, attrs, finalize)


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


# ==================================================================================================
# Legacy descriptor families
# ==================================================================================================
_TENSOR_DTYPES = (
    DataType.FLOAT,
    DataType.DOUBLE,
    DataType.HALF,
    DataType.BFLOAT16,
    DataType.INT8,
    DataType.UINT8,
    DataType.INT32,
)
_FILTER_DTYPES = (
    DataType.FLOAT,
    DataType.DOUBLE,
    DataType.HALF,
    DataType.BFLOAT16,
    DataType.INT8,
    DataType.UINT8,
)
_CONV_COMPUTE_TYPES = (DataType.FLOAT, DataType.DOUBLE, DataType.HALF, DataType.INT32)
_FLOAT_TYPES = (DataType.FLOAT, DataType.DOUBLE, DataType.HALF, DataType.BFLOAT16)
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


def _layout(value: Any, argument: str = "layout") -> enums.TensorFormat:
    return _enum(
        value,
        enums.TensorFormat,
        argument,
        _LAYOUTS,
        allowed=(enums.TensorFormat.NCHW, enums.TensorFormat.NHWC),
    )


def _nan_opt(value: Any, argument: str = "nan_propagation") -> enums.NanPropagation:
    if isinstance(value, bool):
        return enums.NanPropagation(int(value))
    return _enum(value, enums.NanPropagation, argument, _NAN)


def _layout_strides(shape: Sequence[int], layout: enums.TensorFormat) -> tuple[int, ...]:
    """Packed strides of *shape* (given as N, C, spatial...) in *layout* (NCHW or NHWC)."""
    return packed_strides(shape, channels_last=layout == enums.TensorFormat.NHWC)


def _check_span(shape: Sequence[int], strides: Sequence[int], argument: str) -> None:
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


class TensorDescriptor(Resource):
    """``cudnnTensorDescriptor_t``: an N-d tensor's shape, strides and data type.

    Parameters
    ----------
    shape : sequence of int
        3 to 8 positive sizes, ``(N, C, spatial...)`` (``(N, C, H, W)`` for 4-D), whatever the
        layout.
    dtype : numpy dtype, str or DataType, default ``"float32"``
        float32, float64, float16, bfloat16, int8, uint8 or int32.
    strides : sequence of int, optional
        Element strides (>= 1), in the order of *shape*. Default: packed in *layout*.
    layout : {"NCHW", "NHWC"} or TensorFormat, optional
        Memory layout; default NCHW. With *strides* as well, the strides must be the packed
        strides of that layout (omit *layout* for arbitrary strides).

    Raises
    ------
    TypeError
        A size is not an int, or the dtype is not one of the above.
    ValueError
        Wrong rank, a size or stride < 1, strides inconsistent with *layout*.
    OverflowError
        A size, stride, the element count or the strided span exceeds 2**31 - 1.
    CudnnError
        cuDNN rejected the combination (e.g. ``BadParamError``).

    Examples
    --------
    >>> TensorDescriptor((2, 3, 4, 5), "float32")
    TensorDescriptor(shape=(2, 3, 4, 5), dtype=float32, layout=NCHW)
    """

    _c_type = _lib.cudnnTensorDescriptor_t
    _destroy_name = "cudnnDestroyTensorDescriptor"
    __slots__ = ()

    def __init__(
        self,
        shape: Sequence[int],
        dtype: Any = "float32",
        strides: Sequence[int] | None = None,
        layout: Any = None,
    ) -> None:
        shape = _int_seq(shape, "shape", lo=1, min_len=3, max_len=DIM_MAX)
        dt = _dtype(dtype, "dtype", _TENSOR_DTYPES)
        fmt = None if layout is None else _layout(layout)
        if strides is None:
            strides = _layout_strides(shape, fmt or enums.TensorFormat.NCHW)
        else:
            strides = _int_seq(strides, "strides", lo=1, length=len(shape))
            if fmt is not None and strides != _layout_strides(shape, fmt):
                raise ValueError(
                    f"strides={strides} are not the packed {fmt.name} strides of shape {shape} "
                    f"({_layout_strides(shape, fmt)}); omit layout to use arbitrary strides"
                )
        _check_span(shape, strides, "shape")
        h = self._new_handle()
        errors.checked("cudnnCreateTensorDescriptor", warn=False)(ctypes.byref(h))
        self._adopt(h)
        errors.checked("cudnnSetTensorNdDescriptor", warn=False)(
            h, dt, len(shape), _c_int_array(shape), _c_int_array(strides)
        )

    def _read(self) -> tuple[DataType, tuple[int, ...], tuple[int, ...]]:
        h = self._h()
        dt, n = ctypes.c_int(), ctypes.c_int()
        dims, strides = (ctypes.c_int * DIM_MAX)(), (ctypes.c_int * DIM_MAX)()
        errors.checked("cudnnGetTensorNdDescriptor", warn=False)(
            h, DIM_MAX, ctypes.byref(dt), ctypes.byref(n), dims, strides
        )
        k = min(n.value, DIM_MAX)
        return DataType(dt.value), tuple(dims[:k]), tuple(strides[:k])

    @property
    def shape(self) -> tuple[int, ...]:
        """Sizes, ``(N, C, spatial...)`` (read back with ``cudnnGetTensorNdDescriptor``)."""
        return self._read()[1]

    @property
    def strides(self) -> tuple[int, ...]:
        """Element strides in the order of :attr:`shape`."""
        return self._read()[2]

    @property
    def dtype(self) -> DataType:
        """The :class:`~pycudnn.enums.DataType`."""
        return self._read()[0]

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self._read()[1])

    @property
    def layout(self) -> enums.TensorFormat | None:
        """NCHW or NHWC when the strides are packed in that layout (NCHW wins when both
        match), else None."""
        _dt, shape, strides = self._read()
        for fmt in (enums.TensorFormat.NCHW, enums.TensorFormat.NHWC):
            if len(shape) >= 3 and strides == _layout_strides(shape, fmt):
                return fmt
        return None

    @property
    def size_in_bytes(self) -> int:
        """``cudnnGetTensorSizeInBytes``: bytes a buffer for this tensor needs."""
        size = ctypes.c_size_t()
        errors.checked("cudnnGetTensorSizeInBytes", warn=False)(self._h(), ctypes.byref(size))
        return size.value

    @classmethod
    def derive_bn(cls, x: TensorDescriptor, mode: Any = "spatial") -> TensorDescriptor:
        """``cudnnDeriveBNTensorDescriptor``: the scale/bias/mean/var descriptor for batch
        normalization of *x*.

        Parameters
        ----------
        x : TensorDescriptor
            A 4-D or 5-D input descriptor.
        mode : {"spatial", "per_activation", "spatial_persistent"} or BatchNormMode
        """
        if not isinstance(x, TensorDescriptor):
            raise TypeError(f"x must be a TensorDescriptor, got {_describe(x)}")
        mode = _enum(mode, enums.BatchNormMode, "mode", _BN_MODES)
        xh = x._h()
        if x.ndim not in (4, 5):
            # cuDNN batch normalization is defined for 4-D and 5-D tensors only
            raise ValueError(f"x must be 4-D or 5-D for batch normalization, got shape {x.shape}")
        self = cls.__new__(cls)
        h = cls._new_handle()
        errors.checked("cudnnCreateTensorDescriptor", warn=False)(ctypes.byref(h))
        self._adopt(h)
        errors.checked("cudnnDeriveBNTensorDescriptor", warn=False)(h, xh, mode)
        return self

    def _repr_fields(self) -> str:
        dt, shape, strides = self._read()
        layout = self.layout
        tail = f"layout={layout.name}" if layout is not None else f"strides={strides}"
        return f"shape={shape}, dtype={dtype_name(dt)}, {tail}"


_BN_MODES = {
    "spatial": enums.BatchNormMode.SPATIAL,
    "per_activation": enums.BatchNormMode.PER_ACTIVATION,
    "spatial_persistent": enums.BatchNormMode.SPATIAL_PERSISTENT,
}


class FilterDescriptor(Resource):
    """``cudnnFilterDescriptor_t``: convolution weights ``(K, C/groups, spatial...)``.

    Parameters
    ----------
    shape : sequence of int
        3 to 8 positive sizes: output channels, input channels per group, kernel sizes.
    dtype : numpy dtype, str or DataType, default ``"float32"``
        float32, float64, float16, bfloat16, int8 or uint8.
    layout : {"NCHW", "NHWC"} or TensorFormat, default ``"NCHW"``

    Raises
    ------
    TypeError, ValueError, OverflowError
        As for :class:`TensorDescriptor`.
    """

    _c_type = _lib.cudnnFilterDescriptor_t
    _destroy_name = "cudnnDestroyFilterDescriptor"
    __slots__ = ()

    def __init__(self, shape: Sequence[int], dtype: Any = "float32", layout: Any = "NCHW") -> None:
        shape = _int_seq(shape, "shape", lo=1, min_len=3, max_len=DIM_MAX)
        dt = _dtype(dtype, "dtype", _FILTER_DTYPES)
        fmt = _layout(layout)
        _check_span(shape, packed_strides(shape), "shape")
        h = self._new_handle()
        errors.checked("cudnnCreateFilterDescriptor", warn=False)(ctypes.byref(h))
        self._adopt(h)
        errors.checked("cudnnSetFilterNdDescriptor", warn=False)(
            h, dt, fmt, len(shape), _c_int_array(shape)
        )

    def _read(self) -> tuple[DataType, enums.TensorFormat, tuple[int, ...]]:
        h = self._h()
        dt, fmt, n = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        dims = (ctypes.c_int * DIM_MAX)()
        errors.checked("cudnnGetFilterNdDescriptor", warn=False)(
            h, DIM_MAX, ctypes.byref(dt), ctypes.byref(fmt), ctypes.byref(n), dims
        )
        return DataType(dt.value), enums.TensorFormat(fmt.value), tuple(dims[: n.value])

    @property
    def shape(self) -> tuple[int, ...]:
        """``(K, C/groups, spatial...)``."""
        return self._read()[2]

    @property
    def dtype(self) -> DataType:
        """The :class:`~pycudnn.enums.DataType`."""
        return self._read()[0]

    @property
    def layout(self) -> enums.TensorFormat:
        """The :class:`~pycudnn.enums.TensorFormat` (NCHW or NHWC)."""
        return self._read()[1]

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self._read()[2])

    @property
    def size_in_bytes(self) -> int:
        """``cudnnGetFilterSizeInBytes``."""
        size = ctypes.c_size_t()
        errors.checked("cudnnGetFilterSizeInBytes", warn=False)(self._h(), ctypes.byref(size))
        return size.value

    def _repr_fields(self) -> str:
        dt, fmt, shape = self._read()
        return f"shape={shape}, dtype={dtype_name(dt)}, layout={fmt.name}"


_MATH_TYPES = {
    "default": enums.MathType.DEFAULT_MATH,
    "tensor_op": enums.MathType.TENSOR_OP_MATH,
    "tensor_op_allow_conversion": enums.MathType.TENSOR_OP_MATH_ALLOW_CONVERSION,
    "fma": enums.MathType.FMA_MATH,
}


def _spatial_len(*values: Any, default: int) -> int:
    """The spatial rank implied by the sequence-valued arguments (or *default*)."""
    for v in values:
        if not isinstance(v, str | bytes) and isinstance(v, Iterable):
            return len(tuple(v))
    return default


class ConvolutionDescriptor(Resource):
    """``cudnnConvolutionDescriptor_t``: padding, stride, dilation, mode, groups, math type.

    Parameters
    ----------
    pad : int or sequence of int, default 0
        Zero padding per spatial dim (>= 0, symmetric).
    stride : int or sequence of int, default 1
        Filter stride per spatial dim (>= 1).
    dilation : int or sequence of int, default 1
        Filter dilation per spatial dim (>= 1).
    mode : {"cross_correlation", "convolution"} or ConvolutionMode
        ``"cross_correlation"`` (alias ``"cross"``, PyTorch's semantics) or ``"convolution"``
        (alias ``"conv"``, flipped kernel).
    compute_type : dtype, default ``"float32"``
        float32, float64, float16 or int32.
    groups : int, default 1
        Group count (>= 1); :meth:`forward_output_shape` checks it divides the channels.
    math_type : {"default", "tensor_op", "tensor_op_allow_conversion", "fma"} or MathType
    ndim : int, optional
        Number of spatial dims (1 to 6) when every one of pad/stride/dilation is a plain int;
        default 2. Sequence lengths must agree with each other and with *ndim*.
    """

    _c_type = _lib.cudnnConvolutionDescriptor_t
    _destroy_name = "cudnnDestroyConvolutionDescriptor"
    __slots__ = ()

    def __init__(
        self,
        pad: int | Sequence[int] = 0,
        stride: int | Sequence[int] = 1,
        dilation: int | Sequence[int] = 1,
        *,
        mode: Any = "cross_correlation",
        compute_type: Any = "float32",
        groups: int = 1,
        math_type: Any = "default",
        ndim: int | None = None,
    ) -> None:
        n = (
            _int_in(ndim, "ndim", 1, DIM_MAX - 2, "1 to 6 spatial dims")
            if ndim is not None
            else _spatial_len(pad, stride, dilation, default=2)
        )
        if n > DIM_MAX - 2:
            raise ValueError(f"{n} spatial dims given; cuDNN supports 1 to {DIM_MAX - 2}")
        pad = _spatial(pad, "pad", n, lo=0)
        stride = _spatial(stride, "stride", n, lo=1)
        dilation = _spatial(dilation, "dilation", n, lo=1)
        mode = _enum(mode, enums.ConvolutionMode, "mode", _CONV_MODES)
        ct = _dtype(compute_type, "compute_type", _CONV_COMPUTE_TYPES)
        groups = _int_in(groups, "groups", 1)
        math = _enum(math_type, enums.MathType, "math_type", _MATH_TYPES)
        h = self._new_handle()
        errors.checked("cudnnCreateConvolutionDescriptor", warn=False)(ctypes.byref(h))
        self._adopt(h)
        errors.checked("cudnnSetConvolutionNdDescriptor", warn=False)(
            h, n, _c_int_array(pad), _c_int_array(stride), _c_int_array(dilation), mode, ct
        )
        if groups != 1:
            errors.checked("cudnnSetConvolutionGroupCount", warn=False)(h, groups)
        if math != enums.MathType.DEFAULT_MATH:
            errors.checked("cudnnSetConvolutionMathType", warn=False)(h, math)

    def _read(self) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int, int]:
        h = self._h()
        n = ctypes.c_int()
        arrs = [(ctypes.c_int * DIM_MAX)() for _ in range(3)]
        mode, ct = ctypes.c_int(), ctypes.c_int()
        fn = errors.checked("cudnnGetConvolutionNdDescriptor", warn=False)
        # cuDNN fails (3000) when more dims are requested than were set: ask for 1, then n
        fn(h, 1, ctypes.byref(n), *arrs, ctypes.byref(mode), ctypes.byref(ct))
        k = n.value
        if k > 1:
            fn(h, k, ctypes.byref(n), *arrs, ctypes.byref(mode), ctypes.byref(ct))
        pad, stride, dil = (tuple(a[:k]) for a in arrs)
        return pad, stride, dil, mode.value, ct.value

    @property
    def pad(self) -> tuple[int, ...]:
        """Padding per spatial dim."""
        return self._read()[0]

    @property
    def stride(self) -> tuple[int, ...]:
        """Filter stride per spatial dim."""
        return self._read()[1]

    @property
    def dilation(self) -> tuple[int, ...]:
        """Dilation per spatial dim."""
        return self._read()[2]

    @property
    def ndim(self) -> int:
        """Number of spatial dims."""
        return len(self._read()[0])

    @property
    def mode(self) -> enums.ConvolutionMode:
        """CONVOLUTION or CROSS_CORRELATION."""
        return enums.ConvolutionMode(self._read()[3])

    @property
    def compute_type(self) -> DataType:
        """The compute :class:`~pycudnn.enums.DataType`."""
        return DataType(self._read()[4])

    @property
    def groups(self) -> int:
        """``cudnnGetConvolutionGroupCount``."""
        g = ctypes.c_int()
        errors.checked("cudnnGetConvolutionGroupCount", warn=False)(self._h(), ctypes.byref(g))
        return g.value

    @property
    def math_type(self) -> enums.MathType:
        """``cudnnGetConvolutionMathType``."""
        m = ctypes.c_int()
        errors.checked("cudnnGetConvolutionMathType", warn=False)(self._h(), ctypes.byref(m))
        return enums.MathType(m.value)

    @property
    def reorder_type(self) -> enums.ReorderType:
        """``cudnnGetConvolutionReorderType``."""
        r = ctypes.c_int()
        errors.checked("cudnnGetConvolutionReorderType", warn=False)(self._h(), ctypes.byref(r))
        return enums.ReorderType(r.value)

    @reorder_type.setter
    def reorder_type(self, value: Any) -> None:
        r = _enum(value, enums.ReorderType, "reorder_type")
        errors.checked("cudnnSetConvolutionReorderType", warn=False)(self._h(), r)

    def forward_output_shape(self, x: TensorDescriptor, w: FilterDescriptor) -> tuple[int, ...]:
        """``cudnnGetConvolutionNdForwardOutputDim``: the output shape for input *x* and
        filter *w*.

        Checks first (``ValueError``, no C call for these): ranks agree with this descriptor,
        ``x.C == w.C * groups``, ``w.K`` divisible by ``groups``, and every output size >= 1
        (``(in + 2*pad - dilation*(k-1) - 1) // stride + 1``).
        """
        if not isinstance(x, TensorDescriptor):
            raise TypeError(f"x must be a TensorDescriptor, got {_describe(x)}")
        if not isinstance(w, FilterDescriptor):
            raise TypeError(f"w must be a FilterDescriptor, got {_describe(w)}")
        h, xh, wh = self._h(), x._h(), w._h()
        pad, stride, dil, _mode, _ct = self._read()
        xs, ws = x.shape, w.shape
        n = len(pad)
        if len(xs) != n + 2 or len(ws) != n + 2:
            raise ValueError(
                f"x shape {xs} and w shape {ws} must both have {n + 2} dims for a {n}-d convolution"
            )
        g = self.groups
        if xs[1] != ws[1] * g:
            raise ValueError(
                f"x has {xs[1]} channels but w shape {ws} with groups={g} expects {ws[1] * g}"
            )
        if ws[0] % g:
            raise ValueError(f"w has {ws[0]} output channels, not divisible by groups={g}")
        for i in range(n):
            eff = dil[i] * (ws[i + 2] - 1) + 1
            o = (xs[i + 2] + 2 * pad[i] - eff) // stride[i] + 1
            if o < 1:
                raise ValueError(
                    f"dilated kernel size {eff} exceeds padded input size "
                    f"{xs[i + 2] + 2 * pad[i]} in spatial dim {i} (x {xs}, w {ws}, pad {pad}, "
                    f"dilation {dil})"
                )
        out = (ctypes.c_int * (n + 2))()
        errors.checked("cudnnGetConvolutionNdForwardOutputDim", warn=False)(h, xh, wh, n + 2, out)
        return tuple(out)

    def _repr_fields(self) -> str:
        pad, stride, dil, mode, ct = self._read()
        g = self.groups
        tail = f", groups={g}" if g != 1 else ""
        return (
            f"pad={pad}, stride={stride}, dilation={dil}, "
            f"mode={enums.ConvolutionMode(mode).name}, compute_type={dtype_name(DataType(ct))}"
            f"{tail}"
        )


_POOL_MODES = {
    "max": enums.PoolingMode.MAX,
    "average_inc_pad": enums.PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING,
    "average_exc_pad": enums.PoolingMode.AVERAGE_COUNT_EXCLUDE_PADDING,
    "average": enums.PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING,
    "avg": enums.PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING,
    "max_deterministic": enums.PoolingMode.MAX_DETERMINISTIC,
}


class PoolingDescriptor(Resource):
    """``cudnnPoolingDescriptor_t``: window, padding, stride and mode (2-D or 3-D, or any
    1 to 6 spatial dims).

    Parameters
    ----------
    window : int or sequence of int
        Window size per spatial dim (>= 1). A plain int means 2-D (square) unless *ndim*.
    stride : int or sequence of int, optional
        Default: the window (non-overlapping).
    pad : int or sequence of int, default 0
        Padding (>= 0).
    mode : {"max", "average_inc_pad", "average_exc_pad", "max_deterministic"} or PoolingMode
    nan_propagation : bool, default False
    ndim : int, optional
        Spatial dims when every size is a plain int (default 2).
    """

    _c_type = _lib.cudnnPoolingDescriptor_t
    _destroy_name = "cudnnDestroyPoolingDescriptor"
    __slots__ = ()

    def __init__(
        self,
        window: int | Sequence[int],
        stride: int | Sequence[int] | None = None,
        pad: int | Sequence[int] = 0,
        *,
        mode: Any = "max",
        nan_propagation: Any = False,
        ndim: int | None = None,
    ) -> None:
        n = (
            _int_in(ndim, "ndim", 1, DIM_MAX - 2, "1 to 6 spatial dims")
            if ndim is not None
            else _spatial_len(window, stride, pad, default=2)
        )
        if n > DIM_MAX - 2:
            raise ValueError(f"{n} spatial dims given; cuDNN supports 1 to {DIM_MAX - 2}")
        window = _spatial(window, "window", n, lo=1)
        stride = window if stride is None else _spatial(stride, "stride", n, lo=1)
        pad = _spatial(pad, "pad", n, lo=0)
        mode = _enum(mode, enums.PoolingMode, "mode", _POOL_MODES)
        nan = _nan_opt(nan_propagation)
        h = self._new_handle()
        errors.checked("cudnnCreatePoolingDescriptor", warn=False)(ctypes.byref(h))
        self._adopt(h)
        errors.checked("cudnnSetPoolingNdDescriptor", warn=False)(
            h, mode, nan, n, _c_int_array(window), _c_int_array(pad), _c_int_array(stride)
        )

    def _read(self) -> tuple[int, int, tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        h = self._h()
        mode, nan, n = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        arrs = [(ctypes.c_int * DIM_MAX)() for _ in range(3)]
        errors.checked("cudnnGetPoolingNdDescriptor", warn=False)(
            h, DIM_MAX - 2, ctypes.byref(mode), ctypes.byref(nan), ctypes.byref(n), *arrs
        )
        k = n.value
        win, pad, stride = (tuple(a[:k]) for a in arrs)
        return mode.value, nan.value, win, pad, stride

    @property
    def window(self) -> tuple[int, ...]:
        """Window size per spatial dim."""
        return self._read()[2]

    @property
    def pad(self) -> tuple[int, ...]:
        """Padding per spatial dim."""
        return self._read()[3]

    @property
    def stride(self) -> tuple[int, ...]:
        """Stride per spatial dim."""
        return self._read()[4]

    @property
    def ndim(self) -> int:
        """Number of spatial dims."""
        return len(self._read()[2])

    @property
    def mode(self) -> enums.PoolingMode:
        """The :class:`~pycudnn.enums.PoolingMode`."""
        return enums.PoolingMode(self._read()[0])

    @property
    def nan_propagation(self) -> enums.NanPropagation:
        """The :class:`~pycudnn.enums.NanPropagation`."""
        return enums.NanPropagation(self._read()[1])

    def forward_output_shape(self, x: TensorDescriptor) -> tuple[int, ...]:
        """``cudnnGetPoolingNdForwardOutputDim``: the output shape for input *x*.

        Checks first (``ValueError``): ``x`` has ``ndim + 2`` dims and every output size,
        ``(in + 2*pad - window) // stride + 1``, is >= 1.
        """
        if not isinstance(x, TensorDescriptor):
            raise TypeError(f"x must be a TensorDescriptor, got {_describe(x)}")
        h, xh = self._h(), x._h()
        _m, _nan, win, pad, stride = self._read()
        xs = x.shape
        n = len(win)
        if len(xs) != n + 2:
            raise ValueError(f"x shape {xs} must have {n + 2} dims for {n}-d pooling")
        for i in range(n):
            if (xs[i + 2] + 2 * pad[i] - win[i]) // stride[i] + 1 < 1:
                raise ValueError(
                    f"window {win[i]} exceeds padded input size {xs[i + 2] + 2 * pad[i]} in "
                    f"spatial dim {i} (x {xs}, window {win}, pad {pad})"
                )
        out = (ctypes.c_int * (n + 2))()
        errors.checked("cudnnGetPoolingNdForwardOutputDim", warn=False)(h, xh, n + 2, out)
        return tuple(out)

    def _repr_fields(self) -> str:
        mode, _nan, win, pad, stride = self._read()
        return f"window={win}, stride={stride}, pad={pad}, mode={enums.PoolingMode(mode).name}"


_ACT_MODES = {
    "sigmoid": enums.ActivationMode.SIGMOID,
    "relu": enums.ActivationMode.RELU,
    "tanh": enums.ActivationMode.TANH,
    "clipped_relu": enums.ActivationMode.CLIPPED_RELU,
    "elu": enums.ActivationMode.ELU,
    "identity": enums.ActivationMode.IDENTITY,
    "swish": enums.ActivationMode.SWISH,
}


def _finite(value: Any, argument: str) -> float:
    f = _as_float(value, argument)
    if math.isinf(f):
        raise ValueError(f"{argument}={f} must be finite")
    return f


class ActivationDescriptor(Resource):
    """``cudnnActivationDescriptor_t``.

    Parameters
    ----------
    mode : {"relu", "sigmoid", "tanh", "clipped_relu", "elu", "identity", "swish"} or
        ActivationMode
    coef : float, default 0.0
        The clipping threshold (clipped_relu) or alpha (elu); finite.
    nan_propagation : bool, default False
    swish_beta : float, optional
        Beta of swish (``cudnnSetActivationDescriptorSwishBeta``).
    """

    _c_type = _lib.cudnnActivationDescriptor_t
    _destroy_name = "cudnnDestroyActivationDescriptor"
    __slots__ = ()

    def __init__(
        self,
        mode: Any = "relu",
        coef: float = 0.0,
        *,
        nan_propagation: Any = False,
        swish_beta: float | None = None,
    ) -> None:
        mode = _enum(mode, enums.ActivationMode, "mode", _ACT_MODES)
        coef = _finite(coef, "coef")
        nan = _nan_opt(nan_propagation)
        beta = None if swish_beta is None else _finite(swish_beta, "swish_beta")
        h = self._new_handle()
        errors.checked("cudnnCreateActivationDescriptor", warn=False)(ctypes.byref(h))
        self._adopt(h)
        errors.checked("cudnnSetActivationDescriptor", warn=False)(h, mode, nan, coef)
        if beta is not None:
            errors.checked("cudnnSetActivationDescriptorSwishBeta", warn=False)(h, beta)

    def _read(self) -> tuple[int, int, float]:
        mode, nan, coef = ctypes.c_int(), ctypes.c_int(), ctypes.c_double()
        errors.checked("cudnnGetActivationDescriptor", warn=False)(
            self._h(), ctypes.byref(mode), ctypes.byref(nan), ctypes.byref(coef)
        )
        return mode.value, nan.value, coef.value

    @property
    def mode(self) -> enums.ActivationMode:
        """The :class:`~pycudnn.enums.ActivationMode`."""
        return enums.ActivationMode(self._read()[0])

    @property
    def coef(self) -> float:
        """Clipping threshold or elu alpha."""
        return self._read()[2]

    @property
    def nan_propagation(self) -> enums.NanPropagation:
        """The :class:`~pycudnn.enums.NanPropagation`."""
        return enums.NanPropagation(self._read()[1])

    @property
    def swish_beta(self) -> float:
        """``cudnnGetActivationDescriptorSwishBeta``."""
        b = ctypes.c_double()
        errors.checked("cudnnGetActivationDescriptorSwishBeta", warn=False)(
            self._h(), ctypes.byref(b)
        )
        return b.value

    def _repr_fields(self) -> str:
        mode, _nan, coef = self._read()
        return f"mode={enums.ActivationMode(mode).name}, coef={coef}"


class LRNDescriptor(Resource):
    """``cudnnLRNDescriptor_t``: local response normalization parameters.

    Parameters
    ----------
    n : int, default 5
        Window size, ``CUDNN_LRN_MIN_N`` (1) to ``CUDNN_LRN_MAX_N`` (16).
    alpha : float, default 1e-4
    beta : float, default 0.75
        At least ``CUDNN_LRN_MIN_BETA`` (0.01).
    k : float, default 2.0
        At least ``CUDNN_LRN_MIN_K`` (1e-5).
    """

    _c_type = _lib.cudnnLRNDescriptor_t
    _destroy_name = "cudnnDestroyLRNDescriptor"
    __slots__ = ()

    def __init__(self, n: int = 5, alpha: float = 1e-4, beta: float = 0.75, k: float = 2.0) -> None:
        n = _int_in(n, "n", _lib.CUDNN_LRN_MIN_N, what="1 to 16")
        if n > _lib.CUDNN_LRN_MAX_N:
            raise ValueError(f"n={n} is invalid; expected 1 to 16 (CUDNN_LRN_MAX_N)")
        alpha = _finite(alpha, "alpha")
        beta = _finite(beta, "beta")
        k = _finite(k, "k")
        if beta < _lib.CUDNN_LRN_MIN_BETA:
            raise ValueError(f"beta={beta} is below CUDNN_LRN_MIN_BETA ({_lib.CUDNN_LRN_MIN_BETA})")
        if k < _lib.CUDNN_LRN_MIN_K:
            raise ValueError(f"k={k} is below CUDNN_LRN_MIN_K ({_lib.CUDNN_LRN_MIN_K})")
        h = self._new_handle()
        errors.checked("cudnnCreateLRNDescriptor", warn=False)(ctypes.byref(h))
        self._adopt(h)
        errors.checked("cudnnSetLRNDescriptor", warn=False)(h, n, alpha, beta, k)

    def _read(self) -> tuple[int, float, float, float]:
        n, a, b, k = ctypes.c_uint(), ctypes.c_double(), ctypes.c_double(), ctypes.c_double()
        errors.checked("cudnnGetLRNDescriptor", warn=False)(
            self._h(), ctypes.byref(n), ctypes.byref(a), ctypes.byref(b), ctypes.byref(k)
        )
        return n.value, a.value, b.value, k.value

    @property
    def n(self) -> int:
        """Window size."""
        return self._read()[0]

    @property
    def alpha(self) -> float:
        """Alpha."""
        return self._read()[1]

    @property
    def beta(self) -> float:
        """Beta."""
        return self._read()[2]

    @property
    def k(self) -> float:
        """k."""
        return self._read()[3]

    def _repr_fields(self) -> str:
        n, a, b, k = self._read()
        return f"n={n}, alpha={a}, beta={b}, k={k}"


_OP_TENSOR_OPS = {m.name.lower(): m for m in enums.OpTensorOp}


class OpTensorDescriptor(Resource):
    """``cudnnOpTensorDescriptor_t``: the element-wise op of ``cudnnOpTensor``.

    Parameters
    ----------
    op : {"add", "mul", "min", "max", "sqrt", "not"} or OpTensorOp
    compute_type : dtype, default ``"float32"``
        float32, float64, float16 or bfloat16.
    nan_propagation : bool, default False
    """

    _c_type = _lib.cudnnOpTensorDescriptor_t
    _destroy_name = "cudnnDestroyOpTensorDescriptor"
    __slots__ = ()

    def __init__(
        self, op: Any = "add", compute_type: Any = "float32", *, nan_propagation: Any = False
    ) -> None:
        op = _enum(op, enums.OpTensorOp, "op", _OP_TENSOR_OPS)
        ct = _dtype(compute_type, "compute_type", _FLOAT_TYPES)
        nan = _nan_opt(nan_propagation)
        h = self._new_handle()
        errors.checked("cudnnCreateOpTensorDescriptor", warn=False)(ctypes.byref(h))
        self._adopt(h)
        errors.checked("cudnnSetOpTensorDescriptor", warn=False)(h, op, ct, nan)

    def _read(self) -> tuple[int, int, int]:
        op, ct, nan = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        errors.checked("cudnnGetOpTensorDescriptor", warn=False)(
            self._h(), ctypes.byref(op), ctypes.byref(ct), ctypes.byref(nan)
        )
        return op.value, ct.value, nan.value

    @property
    def op(self) -> enums.OpTensorOp:
        """The :class:`~pycudnn.enums.OpTensorOp`."""
        return enums.OpTensorOp(self._read()[0])

    @property
    def compute_type(self) -> DataType:
        """The compute :class:`~pycudnn.enums.DataType`."""
        return DataType(self._read()[1])

    @property
    def nan_propagation(self) -> enums.NanPropagation:
        """The :class:`~pycudnn.enums.NanPropagation`."""
        return enums.NanPropagation(self._read()[2])

    def _repr_fields(self) -> str:
        op, ct, _nan = self._read()
        return f"op={enums.OpTensorOp(op).name}, compute_type={dtype_name(DataType(ct))}"


_REDUCE_OPS = {m.name.lower(): m for m in enums.ReduceTensorOp}
_INDICES = {
    "none": enums.ReduceTensorIndices.NO_INDICES,
    "no_indices": enums.ReduceTensorIndices.NO_INDICES,
    "flattened": enums.ReduceTensorIndices.FLATTENED_INDICES,
}
_INDICES_TYPES = {
    "uint32": enums.IndicesType.CUDNN_32BIT_INDICES,
    "uint64": enums.IndicesType.CUDNN_64BIT_INDICES,
    "uint16": enums.IndicesType.CUDNN_16BIT_INDICES,
    "uint8": enums.IndicesType.CUDNN_8BIT_INDICES,
    "32bit": enums.IndicesType.CUDNN_32BIT_INDICES,
    "64bit": enums.IndicesType.CUDNN_64BIT_INDICES,
    "16bit": enums.IndicesType.CUDNN_16BIT_INDICES,
    "8bit": enums.IndicesType.CUDNN_8BIT_INDICES,
}


class ReduceTensorDescriptor(Resource):
    """``cudnnReduceTensorDescriptor_t``: the reduction of ``cudnnReduceTensor``.

    Parameters
    ----------
    op : {"add", "mul", "min", "max", "amax", "avg", "norm1", "norm2", "mul_no_zeros"} or
        ReduceTensorOp
    compute_type : dtype, default ``"float32"``
        float32, float64 or float16.
    nan_propagation : bool, default False
    indices : bool or {"none", "flattened"} or ReduceTensorIndices, default False
        Whether min/max/amax also compute (flattened) indices.
    indices_type : {"uint32", "uint64", "uint16", "uint8"} or IndicesType, default ``"uint32"``
    """

    _c_type = _lib.cudnnReduceTensorDescriptor_t
    _destroy_name = "cudnnDestroyReduceTensorDescriptor"
    __slots__ = ()

    def __init__(
        self,
        op: Any = "add",
        compute_type: Any = "float32",
        *,
        nan_propagation: Any = False,
        indices: Any = False,
        indices_type: Any = "uint32",
    ) -> None:
        op = _enum(op, enums.ReduceTensorOp, "op", _REDUCE_OPS)
        ct = _dtype(compute_type, "compute_type", (DataType.FLOAT, DataType.DOUBLE, DataType.HALF))
        nan = _nan_opt(nan_propagation)
        if isinstance(indices, bool):
            ind = enums.ReduceTensorIndices(int(indices))
        else:
            ind = _enum(indices, enums.ReduceTensorIndices, "indices", _INDICES)
        it = _enum(indices_type, enums.IndicesType, "indices_type", _INDICES_TYPES)
        h = self._new_handle()
        errors.checked("cudnnCreateReduceTensorDescriptor", warn=False)(ctypes.byref(h))
        self._adopt(h)
        errors.checked("cudnnSetReduceTensorDescriptor", warn=False)(h, op, ct, nan, ind, it)

    def _read(self) -> tuple[int, int, int, int, int]:
        vals = [ctypes.c_int() for _ in range(5)]
        errors.checked("cudnnGetReduceTensorDescriptor", warn=False)(
            self._h(), *(ctypes.byref(v) for v in vals)
        )
        return tuple(v.value for v in vals)  # type: ignore[return-value]

    @property
    def op(self) -> enums.ReduceTensorOp:
        """The :class:`~pycudnn.enums.ReduceTensorOp`."""
        return enums.ReduceTensorOp(self._read()[0])

    @property
    def compute_type(self) -> DataType:
        """The compute :class:`~pycudnn.enums.DataType`."""
        return DataType(self._read()[1])

    @property
    def nan_propagation(self) -> enums.NanPropagation:
        """The :class:`~pycudnn.enums.NanPropagation`."""
        return enums.NanPropagation(self._read()[2])

    @property
    def indices(self) -> enums.ReduceTensorIndices:
        """The :class:`~pycudnn.enums.ReduceTensorIndices`."""
        return enums.ReduceTensorIndices(self._read()[3])

    @property
    def indices_type(self) -> enums.IndicesType:
        """The :class:`~pycudnn.enums.IndicesType`."""
        return enums.IndicesType(self._read()[4])

    def _repr_fields(self) -> str:
        op, ct, _nan, ind, _it = self._read()
        return (
            f"op={enums.ReduceTensorOp(op).name}, compute_type={dtype_name(DataType(ct))}, "
            f"indices={enums.ReduceTensorIndices(ind).name}"
        )


class DropoutDescriptor(Resource):
    """``cudnnDropoutDescriptor_t``.

    Creating one needs no GPU; *configuring* it (``cudnnSetDropoutDescriptor``, which also
    initialises the random states on the device) needs a cuDNN handle and a states buffer.

    Parameters
    ----------
    handle : object with ``.ptr``, optional
        A cuDNN handle (``pycudnn.get_handle()``). Without it the descriptor stays unset (valid
        as "no dropout" for an :class:`RNNDescriptor`); call :meth:`set` later.
    dropout : float, default 0.0
        Probability in ``[0, 1)``.
    states : object with ``.ptr``, optional
        Device buffer of at least :meth:`states_size` bytes (required when *dropout* > 0).
    states_size : int, optional
        Size of *states* in bytes; default ``states.nbytes`` (required when *states* has no
        ``nbytes``). :meth:`states_size` tells how many bytes the GPU needs.
    seed : int, default 0
        0 to 2**64 - 1.

    Notes
    -----
    The descriptor keeps *handle* and *states* alive (cuDNN writes to the states on every
    dropout call).
    """

    _c_type = _lib.cudnnDropoutDescriptor_t
    _destroy_name = "cudnnDestroyDropoutDescriptor"
    __slots__ = ("_handle", "_states")

    def __init__(
        self,
        handle: HasPtr | None = None,
        dropout: float = 0.0,
        states: HasPtr | None = None,
        states_size: int | None = None,
        seed: int = 0,
    ) -> None:
        args = None
        if handle is not None:
            args = self._validate(handle, dropout, states, states_size, seed)
        elif states is not None or states_size is not None:
            raise TypeError("states need a handle: pass handle= as well")
        else:
            _dropout_p(dropout)
            _int_in(seed, "seed", 0, UINT64_MAX)
        h = self._new_handle()
        errors.checked("cudnnCreateDropoutDescriptor", warn=False)(ctypes.byref(h))
        self._adopt(h)
        self._handle = self._states = None
        if args is not None:
            self._set("cudnnSetDropoutDescriptor", handle, states, *args)

    def _init_from_ptr(self) -> None:
        self._handle = self._states = None

    def _mark_closed(self) -> None:
        super()._mark_closed()
        self._handle = self._states = None

    @staticmethod
    def _validate(
        handle: Any, dropout: Any, states: Any, states_size: Any, seed: Any
    ) -> tuple[float, int, int, int]:
        hptr = _keep_handle(handle, "handle")
        p = _dropout_p(dropout)
        seed = _int_in(seed, "seed", 0, UINT64_MAX)
        if states is None:
            if states_size not in (None, 0):
                raise ValueError(f"states_size={states_size} given without states")
            sptr, size = 0, 0
            if p > 0:
                raise ValueError(f"dropout={p} > 0 needs a states buffer (states=)")
        else:
            sptr = _keep_handle(states, "states")
            if states_size is None:
                states_size = getattr(states, "nbytes", None)
                if states_size is None:
                    raise TypeError("states_size is required: states has no .nbytes")
            size = _int_in(states_size, "states_size", 0, INT64_MAX)
        del hptr  # validated; the call re-reads handle.ptr
        return p, sptr, size, seed

    def _set(
        self, fn: str, handle: Any, states: Any, p: float, sptr: int, size: int, seed: int
    ) -> None:
        errors.checked(fn, warn=False)(
            self._h(), _keep_handle(handle, "handle"), p, sptr or None, size, seed
        )
        # children keep their parents alive: cuDNN uses the handle's stream and the states
        self._handle = handle
        self._states = states

    def set(
        self,
        handle: HasPtr,
        dropout: float,
        states: HasPtr | None,
        states_size: int | None = None,
        seed: int = 0,
    ) -> None:
        """``cudnnSetDropoutDescriptor``: configure and initialise the random states."""
        args = self._validate(handle, dropout, states, states_size, seed)
        self._set("cudnnSetDropoutDescriptor", handle, states, *args)

    def restore(
        self,
        handle: HasPtr,
        dropout: float,
        states: HasPtr,
        states_size: int | None = None,
        seed: int = 0,
    ) -> None:
        """``cudnnRestoreDropoutDescriptor``: reuse states initialised before (no re-init)."""
        args = self._validate(handle, dropout, states, states_size, seed)
        self._set("cudnnRestoreDropoutDescriptor", handle, states, *args)

    @staticmethod
    def states_size(handle: HasPtr) -> int:
        """``cudnnDropoutGetStatesSize``: bytes of random state this GPU needs (needs a handle)."""
        size = ctypes.c_size_t()
        errors.checked("cudnnDropoutGetStatesSize", warn=False)(
            _keep_handle(handle, "handle"), ctypes.byref(size)
        )
        return size.value

    @staticmethod
    def reserve_space_size(x: TensorDescriptor) -> int:
        """``cudnnDropoutGetReserveSpaceSize``: reserve-space bytes for input *x* (no GPU)."""
        if not isinstance(x, TensorDescriptor):
            raise TypeError(f"x must be a TensorDescriptor, got {_describe(x)}")
        size = ctypes.c_size_t()
        errors.checked("cudnnDropoutGetReserveSpaceSize", warn=False)(x._h(), ctypes.byref(size))
        return size.value

    def read(self, handle: HasPtr | None = None) -> tuple[float, int, int]:
        """``cudnnGetDropoutDescriptor``: ``(dropout, states pointer, seed)``.

        Needs a handle: *handle*, or the one given at construction / :meth:`set`.
        """
        h = self._h()
        handle = handle if handle is not None else self._handle
        if handle is None:
            raise ValueError("reading a DropoutDescriptor needs a cuDNN handle (pass handle=)")
        p, states, seed = ctypes.c_float(), ctypes.c_void_p(), ctypes.c_ulonglong()
        errors.checked("cudnnGetDropoutDescriptor", warn=False)(
            h,
            _keep_handle(handle, "handle"),
            ctypes.byref(p),
            ctypes.byref(states),
            ctypes.byref(seed),
        )
        return p.value, states.value or 0, seed.value

    @property
    def dropout(self) -> float:
        """Dropout probability (read back through cuDNN; needs the handle given at set time)."""
        return self.read()[0]

    @property
    def seed(self) -> int:
        """Seed (read back through cuDNN; needs the handle given at set time)."""
        return self.read()[2]

    @property
    def is_set(self) -> bool:
        """True once configured with a handle (by this wrapper)."""
        self._h()
        return self._handle is not None

    def _repr_fields(self) -> str:
        if self._handle is None:
            return "unset" if self._owned else f"ptr={self._ptr:#x}"
        p, _states, seed = self.read()
        return f"dropout={p:g}, seed={seed}"


def _dropout_p(value: Any) -> float:
    p = _as_float(value, "dropout")
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout={p} is invalid; expected a probability in [0, 1)")
    return p


_RNN_MODES = {
    "rnn_relu": enums.RNNMode.RNN_RELU,
    "relu": enums.RNNMode.RNN_RELU,
    "rnn_tanh": enums.RNNMode.RNN_TANH,
    "tanh": enums.RNNMode.RNN_TANH,
    "lstm": enums.RNNMode.LSTM,
    "gru": enums.RNNMode.GRU,
}
_RNN_BIAS = {
    "none": enums.RNNBiasMode.NO_BIAS,
    "no_bias": enums.RNNBiasMode.NO_BIAS,
    "single_inp": enums.RNNBiasMode.SINGLE_INP_BIAS,
    "single_rec": enums.RNNBiasMode.SINGLE_REC_BIAS,
    "double": enums.RNNBiasMode.DOUBLE_BIAS,
}
_DIRECTIONS = {
    "unidirectional": enums.DirectionMode.UNIDIRECTIONAL,
    "bidirectional": enums.DirectionMode.BIDIRECTIONAL,
}
_INPUT_MODES = {
    "linear": enums.RNNInputMode.LINEAR_INPUT,
    "skip": enums.RNNInputMode.SKIP_INPUT,
}
_RNN_ALGOS = {
    "standard": enums.RNNAlgo.STANDARD,
    "persist_static": enums.RNNAlgo.PERSIST_STATIC,
    "persist_dynamic": enums.RNNAlgo.PERSIST_DYNAMIC,
    "persist_static_small_h": enums.RNNAlgo.PERSIST_STATIC_SMALL_H,
}
_AUX_FLAGS = {"padded_io": _lib.CUDNN_RNN_PADDED_IO_ENABLED}
_RNN_MATH_PREC = {
    DataType.FLOAT: (DataType.FLOAT,),
    DataType.DOUBLE: (DataType.DOUBLE,),
    DataType.HALF: (DataType.FLOAT, DataType.HALF),
    DataType.BFLOAT16: (DataType.FLOAT, DataType.BFLOAT16),
}


class RNNDescriptor(Resource):
    """``cudnnRNNDescriptor_t`` configured with the cuDNN 8+ API (``cudnnSetRNNDescriptor_v8``).

    Parameters
    ----------
    hidden_size : int
        Hidden state size (>= 1).
    num_layers : int, default 1
    cell_mode : {"lstm", "gru", "rnn_tanh", "rnn_relu"} or RNNMode, default ``"lstm"``
    input_size : int, optional
        Input vector size; default *hidden_size*.
    proj_size : int, optional
        LSTM projection size (<= *hidden_size*; only LSTM may project); default *hidden_size*.
    bias_mode : {"double", "single_inp", "single_rec", "none"} or RNNBiasMode
    direction : {"unidirectional", "bidirectional"} or DirectionMode
    input_mode : {"linear", "skip"} or RNNInputMode (``"skip"`` needs input_size ==
        hidden_size)
    dtype : dtype, default ``"float32"``
        float32, float64, float16 or bfloat16.
    math_precision : dtype, optional
        Default: float64 for float64 data, else float32. float16/bfloat16 data may also use
        their own type.
    math_type : {"default", "tensor_op", "tensor_op_allow_conversion", "fma"} or MathType
    dropout : DropoutDescriptor, optional
        Applied between layers; kept alive by this descriptor. Default: no dropout.
    aux_flags : int or "padded_io", default 0
    algo : {"standard", "persist_static", "persist_dynamic", "persist_static_small_h"} or RNNAlgo
    """

    _c_type = _lib.cudnnRNNDescriptor_t
    _destroy_name = "cudnnDestroyRNNDescriptor"
    __slots__ = ()

    def __init__(
        self,
        hidden_size: int,
        num_layers: int = 1,
        *,
        cell_mode: Any = "lstm",
        input_size: int | None = None,
        proj_size: int | None = None,
        bias_mode: Any = "double",
        direction: Any = "unidirectional",
        input_mode: Any = "linear",
        dtype: Any = "float32",
        math_precision: Any = None,
        math_type: Any = "default",
        dropout: DropoutDescriptor | None = None,
        aux_flags: int | str = 0,
        algo: Any = "standard",
    ) -> None:
        hidden = _int_in(hidden_size, "hidden_size", 1)
        layers = _int_in(num_layers, "num_layers", 1)
        inp = hidden if input_size is None else _int_in(input_size, "input_size", 1)
        proj = hidden if proj_size is None else _int_in(proj_size, "proj_size", 1)
        cell = _enum(cell_mode, enums.RNNMode, "cell_mode", _RNN_MODES)
        if proj > hidden:
            raise ValueError(f"proj_size={proj} must not exceed hidden_size={hidden}")
        if proj != hidden and cell != enums.RNNMode.LSTM:
            raise ValueError(f"proj_size={proj} != hidden_size={hidden} is only valid for LSTM")
        bias = _enum(bias_mode, enums.RNNBiasMode, "bias_mode", _RNN_BIAS)
        dirm = _enum(direction, enums.DirectionMode, "direction", _DIRECTIONS)
        inm = _enum(input_mode, enums.RNNInputMode, "input_mode", _INPUT_MODES)
        if inm == enums.RNNInputMode.SKIP_INPUT and inp != hidden:
            raise ValueError(
                f"input_mode='skip' needs input_size == hidden_size, got {inp} and {hidden}"
            )
        dt = _dtype(dtype, "dtype", _FLOAT_TYPES)
        if math_precision is None:
            mp = DataType.DOUBLE if dt == DataType.DOUBLE else DataType.FLOAT
        else:
            mp = _dtype(math_precision, "math_precision", _RNN_MATH_PREC[dt])
        math = _enum(math_type, enums.MathType, "math_type", _MATH_TYPES)
        if dropout is not None and not isinstance(dropout, DropoutDescriptor):
            raise TypeError(
                f"dropout must be a DropoutDescriptor or None, got {_describe(dropout)}"
            )
        dh = dropout._h() if dropout is not None else None
        if isinstance(aux_flags, str):
            key = aux_flags.strip().lower()
            if key not in _AUX_FLAGS:
                raise ValueError(
                    f"aux_flags={aux_flags!r} is invalid; expected 'padded_io' or an int"
                )
            flags = _AUX_FLAGS[key]
        else:
            flags = _int_in(aux_flags, "aux_flags", 0, 2**32 - 1)
        algo = _enum(algo, enums.RNNAlgo, "algo", _RNN_ALGOS)
        h = self._new_handle()
        errors.checked("cudnnCreateRNNDescriptor", warn=False)(ctypes.byref(h))
        self._adopt(h)
        errors.checked("cudnnSetRNNDescriptor_v8", warn=False)(
            h, algo, cell, bias, dirm, inm, dt, mp, math, inp, hidden, proj, layers, dh, flags
        )
        if dropout is not None:
            self._refs.append(dropout)  # cuDNN keeps the dropout descriptor's pointer

    def _read(self) -> dict[str, Any]:
        ints = [ctypes.c_int() for _ in range(8)]
        sizes = [ctypes.c_int32() for _ in range(4)]
        drop, flags = _lib.cudnnDropoutDescriptor_t(), ctypes.c_uint32()
        errors.checked("cudnnGetRNNDescriptor_v8", warn=False)(
            self._h(),
            *(ctypes.byref(v) for v in ints),
            *(ctypes.byref(v) for v in sizes),
            ctypes.byref(drop),
            ctypes.byref(flags),
        )
        algo, cell, bias, dirm, inm, dt, mp, math = (v.value for v in ints)
        inp, hidden, proj, layers = (v.value for v in sizes)
        return {
            "algo": enums.RNNAlgo(algo),
            "cell_mode": enums.RNNMode(cell),
            "bias_mode": enums.RNNBiasMode(bias),
            "direction": enums.DirectionMode(dirm),
            "input_mode": enums.RNNInputMode(inm),
            "dtype": DataType(dt),
            "math_precision": DataType(mp),
            "math_type": enums.MathType(math),
            "input_size": inp,
            "hidden_size": hidden,
            "proj_size": proj,
            "num_layers": layers,
            "dropout_ptr": drop.value or 0,
            "aux_flags": flags.value,
        }

    def config(self) -> dict[str, Any]:
        """Everything ``cudnnGetRNNDescriptor_v8`` reports, as a dict."""
        return self._read()

    algo = property(lambda self: self._read()["algo"], doc="The :class:`~pycudnn.enums.RNNAlgo`.")
    cell_mode = property(lambda self: self._read()["cell_mode"], doc="The RNNMode.")
    bias_mode = property(lambda self: self._read()["bias_mode"], doc="The RNNBiasMode.")
    direction = property(lambda self: self._read()["direction"], doc="The DirectionMode.")
    input_mode = property(lambda self: self._read()["input_mode"], doc="The RNNInputMode.")
    dtype = property(lambda self: self._read()["dtype"], doc="Data type.")
    math_precision = property(lambda self: self._read()["math_precision"], doc="Math precision.")
    math_type = property(lambda self: self._read()["math_type"], doc="The MathType.")
    input_size = property(lambda self: self._read()["input_size"], doc="Input vector size.")
    hidden_size = property(lambda self: self._read()["hidden_size"], doc="Hidden size.")
    proj_size = property(lambda self: self._read()["proj_size"], doc="Projection size.")
    num_layers = property(lambda self: self._read()["num_layers"], doc="Number of layers.")
    aux_flags = property(lambda self: self._read()["aux_flags"], doc="Auxiliary flags.")

    def set_clip(self, mode: Any = "minmax", lclip: float = 0.0, rclip: float = 0.0) -> None:
        """``cudnnRNNSetClip_v9``: LSTM cell clipping (``mode="none"`` turns it off)."""
        m = _enum(mode, enums.RNNClipMode, "mode")
        lo, hi = _finite(lclip, "lclip"), _finite(rclip, "rclip")
        if m == enums.RNNClipMode.MINMAX and lo > hi:
            raise ValueError(f"lclip={lo} must not exceed rclip={hi}")
        errors.checked("cudnnRNNSetClip_v9", warn=False)(self._h(), m, lo, hi)

    @property
    def clip(self) -> tuple[enums.RNNClipMode, float, float]:
        """``cudnnRNNGetClip_v9``: ``(mode, lclip, rclip)``."""
        m, lo, hi = ctypes.c_int(), ctypes.c_double(), ctypes.c_double()
        errors.checked("cudnnRNNGetClip_v9", warn=False)(
            self._h(), ctypes.byref(m), ctypes.byref(lo), ctypes.byref(hi)
        )
        return enums.RNNClipMode(m.value), lo.value, hi.value

    def weight_space_size(self, handle: HasPtr) -> int:
        """``cudnnGetRNNWeightSpaceSize`` (needs a handle)."""
        size = ctypes.c_size_t()
        errors.checked("cudnnGetRNNWeightSpaceSize", warn=False)(
            _keep_handle(handle, "handle"), self._h(), ctypes.byref(size)
        )
        return size.value

    def temp_space_sizes(
        self, handle: HasPtr, x: RNNDataDescriptor, training: bool = True
    ) -> tuple[int, int]:
        """``cudnnGetRNNTempSpaceSizes``: ``(workspace, reserve space)`` bytes for input *x*."""
        if not isinstance(x, RNNDataDescriptor):
            raise TypeError(f"x must be an RNNDataDescriptor, got {_describe(x)}")
        ws, rs = ctypes.c_size_t(), ctypes.c_size_t()
        mode = enums.ForwardMode.TRAINING if training else enums.ForwardMode.INFERENCE
        errors.checked("cudnnGetRNNTempSpaceSizes", warn=False)(
            _keep_handle(handle, "handle"),
            self._h(),
            mode,
            x._h(),
            ctypes.byref(ws),
            ctypes.byref(rs),
        )
        return ws.value, rs.value

    def _repr_fields(self) -> str:
        c = self._read()
        return (
            f"cell_mode={c['cell_mode'].name}, hidden_size={c['hidden_size']}, "
            f"num_layers={c['num_layers']}, input_size={c['input_size']}, "
            f"direction={c['direction'].name}, dtype={dtype_name(c['dtype'])}"
        )


_RNN_LAYOUTS = {
    "seq_major_unpacked": enums.RNNDataLayout.SEQ_MAJOR_UNPACKED,
    "seq_major_packed": enums.RNNDataLayout.SEQ_MAJOR_PACKED,
    "batch_major_unpacked": enums.RNNDataLayout.BATCH_MAJOR_UNPACKED,
}


def _fill_bytes(dt: DataType, value: float) -> ctypes.Array:
    """*value* encoded as one element of *dt* in a host buffer (cuDNN reads dataType bytes)."""
    import numpy as np

    from .._types import numpy_dtype

    buf = ctypes.create_string_buffer(8)
    with np.errstate(over="ignore"):
        arr = np.array([value], dtype=numpy_dtype(dt))
    if math.isfinite(value) and not np.isfinite(arr[0].astype(np.float64)):
        raise OverflowError(f"padding_fill={value} does not fit in {dtype_name(dt)}")
    raw = arr.tobytes()
    ctypes.memmove(buf, raw, len(raw))
    return buf


class RNNDataDescriptor(Resource):
    """``cudnnRNNDataDescriptor_t``: a batch of variable-length sequences.

    Parameters
    ----------
    seq_lengths : sequence of int
        Length of each sequence (0 to *max_seq_length*); its length is the batch size.
    vector_size : int
        Size of each input/output vector (>= 1).
    max_seq_length : int, optional
        Default ``max(seq_lengths)``.
    dtype : dtype, default ``"float32"``
        float32, float64, float16 or bfloat16.
    layout : {"seq_major_unpacked", "seq_major_packed", "batch_major_unpacked"} or
        RNNDataLayout, default ``"seq_major_packed"``
    padding_fill : float, default 0.0
        Written into padding positions of outputs (unpacked layouts).
    """

    _c_type = _lib.cudnnRNNDataDescriptor_t
    _destroy_name = "cudnnDestroyRNNDataDescriptor"
    __slots__ = ()

    def __init__(
        self,
        seq_lengths: Sequence[int],
        vector_size: int,
        max_seq_length: int | None = None,
        *,
        dtype: Any = "float32",
        layout: Any = "seq_major_packed",
        padding_fill: float = 0.0,
    ) -> None:
        lengths = _int_seq(seq_lengths, "seq_lengths", lo=0, min_len=1, max_len=INT32_MAX)
        vec = _int_in(vector_size, "vector_size", 1)
        max_len = (
            max(lengths) if max_seq_length is None else _int_in(max_seq_length, "max_seq_length", 1)
        )
        if max_len < 1:
            raise ValueError("max_seq_length must be >= 1 (all seq_lengths are 0)")
        longest = max(lengths)
        if longest > max_len:
            raise ValueError(f"seq_lengths contains {longest}, more than max_seq_length={max_len}")
        batch = len(lengths)
        total = max_len * batch * vec
        if total > INT32_MAX:
            raise OverflowError(
                f"max_seq_length * batch * vector_size = {total} exceeds cuDNN's limit of "
                f"{INT32_MAX}"
            )
        dt = _dtype(dtype, "dtype", _FLOAT_TYPES)
        lay = _enum(layout, enums.RNNDataLayout, "layout", _RNN_LAYOUTS)
        fill = _fill_bytes(dt, _as_float(padding_fill, "padding_fill"))
        h = self._new_handle()
        errors.checked("cudnnCreateRNNDataDescriptor", warn=False)(ctypes.byref(h))
        self._adopt(h)
        errors.checked("cudnnSetRNNDataDescriptor", warn=False)(
            h, dt, lay, max_len, batch, vec, _c_int_array(lengths), fill
        )

    def _read(self) -> dict[str, Any]:
        h = self._h()
        dt, lay, mx, b, v = (ctypes.c_int() for _ in range(5))
        fill = ctypes.create_string_buffer(8)
        fn = errors.checked("cudnnGetRNNDataDescriptor", warn=False)
        refs = [ctypes.byref(x) for x in (dt, lay, mx, b, v)]
        fn(h, *refs, 0, None, fill)
        n = b.value
        lengths = (ctypes.c_int * max(n, 1))()
        fn(h, *refs, n, lengths, fill)
        import numpy as np

        from .._types import numpy_dtype

        dtype = DataType(dt.value)
        npdt = numpy_dtype(dtype)
        pad = float(np.frombuffer(fill.raw[: npdt.itemsize], dtype=npdt)[0])
        return {
            "dtype": dtype,
            "layout": enums.RNNDataLayout(lay.value),
            "max_seq_length": mx.value,
            "batch_size": n,
            "vector_size": v.value,
            "seq_lengths": tuple(lengths[:n]),
            "padding_fill": pad,
        }

    def config(self) -> dict[str, Any]:
        """Everything ``cudnnGetRNNDataDescriptor`` reports, as a dict."""
        return self._read()

    dtype = property(lambda self: self._read()["dtype"], doc="Data type.")
    layout = property(lambda self: self._read()["layout"], doc="The RNNDataLayout.")
    max_seq_length = property(lambda self: self._read()["max_seq_length"], doc="Max length.")
    batch_size = property(lambda self: self._read()["batch_size"], doc="Batch size.")
    vector_size = property(lambda self: self._read()["vector_size"], doc="Vector size.")
    seq_lengths = property(lambda self: self._read()["seq_lengths"], doc="Sequence lengths.")
    padding_fill = property(lambda self: self._read()["padding_fill"], doc="Padding fill.")

    def _repr_fields(self) -> str:
        c = self._read()
        return (
            f"batch_size={c['batch_size']}, max_seq_length={c['max_seq_length']}, "
            f"vector_size={c['vector_size']}, dtype={dtype_name(c['dtype'])}, "
            f"layout={c['layout'].name}"
        )


class SpatialTransformerDescriptor(Resource):
    """``cudnnSpatialTransformerDescriptor_t``: the output grid of a spatial transformer.

    Parameters
    ----------
    shape : sequence of int
        Output shape ``(N, C, H, W)`` (4 positive sizes).
    dtype : dtype, default ``"float32"``
        float32, float64 or float16.
    sampler : {"bilinear"} or SamplerType

    Notes
    -----
    cuDNN has no getter for this descriptor, so :attr:`shape`, :attr:`dtype` and
    :attr:`sampler` are the constructor's (validated) arguments; on a ``from_ptr`` wrapper they
    are None.
    """

    _c_type = _lib.cudnnSpatialTransformerDescriptor_t
    _destroy_name = "cudnnDestroySpatialTransformerDescriptor"
    __slots__ = ("_cfg",)

    def __init__(
        self, shape: Sequence[int], dtype: Any = "float32", sampler: Any = "bilinear"
    ) -> None:
        shape = _int_seq(shape, "shape", lo=1, length=4)
        _check_span(shape, packed_strides(shape), "shape")
        dt = _dtype(dtype, "dtype", (DataType.FLOAT, DataType.DOUBLE, DataType.HALF))
        smp = _enum(sampler, enums.SamplerType, "sampler")
        h = self._new_handle()
        errors.checked("cudnnCreateSpatialTransformerDescriptor", warn=False)(ctypes.byref(h))
        self._adopt(h)
        self._cfg: tuple[Any, Any, Any] = (None, None, None)
        errors.checked("cudnnSetSpatialTransformerNdDescriptor", warn=False)(
            h, smp, dt, 4, _c_int_array(shape)
        )
        self._cfg = (shape, dt, smp)

    def _init_from_ptr(self) -> None:
        self._cfg = (None, None, None)

    @property
    def shape(self) -> tuple[int, ...] | None:
        """Output shape ``(N, C, H, W)`` (None when wrapped with ``from_ptr``)."""
        self._h()
        return self._cfg[0]

    @property
    def dtype(self) -> DataType | None:
        """Data type (None when wrapped with ``from_ptr``)."""
        self._h()
        return self._cfg[1]

    @property
    def sampler(self) -> enums.SamplerType | None:
        """Sampler type (None when wrapped with ``from_ptr``)."""
        self._h()
        return self._cfg[2]

    def _repr_fields(self) -> str:
        shape, dt, smp = self._cfg
        if shape is None:
            return f"ptr={self._ptr:#x}"
        return f"shape={shape}, dtype={dtype_name(dt)}, sampler={smp.name}"


_CTC_NORM = {
    "none": enums.LossNormalizationMode.NONE,
    "softmax": enums.LossNormalizationMode.SOFTMAX,
}
_CTC_GRAD = {
    "zero_oob": enums.CTCGradMode.ZERO_OOB_GRADIENTS,
    "skip_oob": enums.CTCGradMode.SKIP_OOB_GRADIENTS,
}


class CTCLossDescriptor(Resource):
    """``cudnnCTCLossDescriptor_t`` (set with ``cudnnSetCTCLossDescriptor_v9``).

    Parameters
    ----------
    compute_type : dtype, default ``"float32"``
        float32 or float64.
    normalization : {"softmax", "none"} or LossNormalizationMode, default ``"softmax"``
    grad_mode : {"zero_oob", "skip_oob"} or CTCGradMode, default ``"zero_oob"``
    max_label_length : int, default 255
        Longest label sequence (>= 1).
    """

    _c_type = _lib.cudnnCTCLossDescriptor_t
    _destroy_name = "cudnnDestroyCTCLossDescriptor"
    __slots__ = ()

    def __init__(
        self,
        compute_type: Any = "float32",
        *,
        normalization: Any = "softmax",
        grad_mode: Any = "zero_oob",
        max_label_length: int = 255,
    ) -> None:
        ct = _dtype(compute_type, "compute_type", (DataType.FLOAT, DataType.DOUBLE))
        norm = _enum(normalization, enums.LossNormalizationMode, "normalization", _CTC_NORM)
        grad = _enum(grad_mode, enums.CTCGradMode, "grad_mode", _CTC_GRAD)
        mll = _int_in(max_label_length, "max_label_length", 1)
        h = self._new_handle()
        errors.checked("cudnnCreateCTCLossDescriptor", warn=False)(ctypes.byref(h))
        self._adopt(h)
        errors.checked("cudnnSetCTCLossDescriptor_v9", warn=False)(h, ct, norm, grad, mll)

    def _read(self) -> tuple[int, int, int, int]:
        vals = [ctypes.c_int() for _ in range(4)]
        errors.checked("cudnnGetCTCLossDescriptor_v9", warn=False)(
            self._h(), *(ctypes.byref(v) for v in vals)
        )
        return tuple(v.value for v in vals)  # type: ignore[return-value]

    @property
    def compute_type(self) -> DataType:
        """The compute :class:`~pycudnn.enums.DataType`."""
        return DataType(self._read()[0])

    @property
    def normalization(self) -> enums.LossNormalizationMode:
        """The :class:`~pycudnn.enums.LossNormalizationMode`."""
        return enums.LossNormalizationMode(self._read()[1])

    @property
    def grad_mode(self) -> enums.CTCGradMode:
        """The :class:`~pycudnn.enums.CTCGradMode`."""
        return enums.CTCGradMode(self._read()[2])

    @property
    def max_label_length(self) -> int:
        """Longest label sequence."""
        return self._read()[3]

    def _repr_fields(self) -> str:
        ct, norm, grad, mll = self._read()
        return (
            f"compute_type={dtype_name(DataType(ct))}, "
            f"normalization={enums.LossNormalizationMode(norm).name}, "
            f"grad_mode={enums.CTCGradMode(grad).name}, max_label_length={mll}"
        )
