"""Backend (graph API) descriptors: :class:`BackendDescriptor` wraps
``cudnnBackendCreateDescriptor`` / ``SetAttribute`` / ``GetAttribute`` / ``Finalize`` for every
``BackendDescriptorType``, with thin validated constructors for the building blocks the
high-level layer uses (tensor, convolution, pointwise, the convolution and pointwise operations,
the operation graph).

Attribute values are converted by :mod:`._codec`. A descriptor keeps alive every descriptor,
handle or buffer object set as an attribute value: cuDNN refers to them by address.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any, Self

from .. import enums, errors
from .._generated import lib as _lib
from .._layout import INT32_MAX, INT64_MAX, packed_strides
from .._resource import Resource
from .._types import as_data_type
from ..enums import BackendAttributeName, BackendAttributeType, BackendDescriptorType, DataType
from ._codec import (
    CTYPE_OF_TYPE,
    REF_TYPES,
    check_descriptor_type,
    check_descriptor_values,
    check_raw,
    coerce_attr_name,
    coerce_attr_type,
    coerce_descriptor_type,
    from_c,
    pack,
)
from ._conv_operation import CONV_OPERATIONS, conv_operation_attributes
from ._validate import (
    CONV_MODES,
    DIM_MAX,
    as_float,
    as_handle,
    coerce_enum,
    describe,
    int_in,
    int_seq,
    is_handle,
    restrict_dtype,
    spatial,
)

__all__ = ["BackendDescriptor"]

_T = BackendAttributeType
# descriptor-valued attributes cuDNN 9.28 dereferences unchecked in cudnnBackendFinalize: empty, or
# holding an unfinalized descriptor, they crash the process (found by the surface fuzzer,
# tests/support/_fuzz_surface_child.py)
_FINALIZE_NEEDS: dict[BackendDescriptorType, tuple[BackendAttributeName, ...]] = {
    BackendDescriptorType.ENGINECFG_DESCRIPTOR: (BackendAttributeName.ENGINECFG_ENGINE,),
    BackendDescriptorType.EXECUTION_PLAN_DESCRIPTOR: (
        BackendAttributeName.EXECUTION_PLAN_ENGINE_CONFIG,
    ),
}
_GET_DIRECT = 1 << 16  # get(count=...) up to this many elements allocates at once
_PLAN_JSON = int(BackendAttributeName.EXECUTION_PLAN_JSON_REPRESENTATION)
# plain ints: comparing with an enum member costs a class attribute lookup on the hot path
_BACKEND_DESCRIPTOR, _CHAR = int(_T.BACKEND_DESCRIPTOR), int(_T.CHAR)
_COMPUTE_TYPES = (DataType.FLOAT, DataType.DOUBLE, DataType.HALF, DataType.BFLOAT16, DataType.INT32)
# pointwise comparisons and logic compute in BOOLEAN (the attention masks)
_POINTWISE_TYPES = (*_COMPUTE_TYPES, DataType.BOOLEAN)


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
        dtype = coerce_descriptor_type(descriptor_type)
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
        dtype = None if descriptor_type is None else coerce_descriptor_type(descriptor_type)
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
            A value cannot be converted to *attr_type* (no C call is made). For
            ``BACKEND_DESCRIPTOR``: a value that is not a :class:`BackendDescriptor`, or of a
            descriptor type the attribute does not take (``TypeError``; the table is generated
            from cuDNN's documentation, see ``pycudnn/_generated/backend_attrs.py``), the descriptor
            itself or a closed one (``ValueError``), raw ctypes data (``TypeError``). For
            ``HANDLE``: an object that is not a ``pycudnn.Handle``. For ``VOID_PTR``: a
            descriptor or handle (not a device buffer).
        ValueError
            The descriptor is closed.
        BadParamError
            cuDNN rejected the attribute (e.g. ``CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE`` for a
            wrong *attr_type*, or any set after :meth:`finalize`).
        """
        h = self._h()
        name = coerce_attr_name(attribute)
        atype = coerce_attr_type(attr_type)
        if atype == _BACKEND_DESCRIPTOR:
            # cuDNN does not check what a descriptor value is (a wrong type crashes it): only
            # descriptors of a type the attribute takes (the documented table), never itself
            if isinstance(values, ctypes.Array | ctypes._SimpleCData | ctypes.Structure):
                raise TypeError(
                    "BACKEND_DESCRIPTOR values must be BackendDescriptor objects, not raw ctypes "
                    "data: cuDNN would take any address for a descriptor"
                )
            handles = check_descriptor_values(self, name, values, BackendDescriptor)
            arr, n = pack(atype, values, BackendDescriptor)
            # children keep their parents alive: cuDNN refers to these descriptors by address
            # until this descriptor is gone (or the value replaced); holding their typed
            # handles also defers their destroy if they are closed first (Resource.close)
            self._attr_refs[int(name)] = (values, handles)
        elif isinstance(values, ctypes.Array):
            check_raw(atype, values)
            arr, n = values, len(values)
        elif isinstance(values, ctypes._SimpleCData | ctypes.Structure):
            check_raw(atype, values)
            arr, n = ctypes.byref(values), 1
        else:
            arr, n = pack(atype, values, BackendDescriptor)
            if atype == _CHAR:
                self._attr_refs[int(name)] = values  # a plan from JSON needs no engine config
            elif atype in REF_TYPES and not isinstance(values, int):
                # handles and buffers: kept alive as long as cuDNN may use their addresses (a
                # Handle's typed handle as well: closing it first defers its destroy)
                keep = (values, values._as_parameter_) if is_handle(values) else values
                self._attr_refs[int(name)] = keep
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
        name = coerce_attr_name(attribute)
        atype = coerce_attr_type(attr_type)
        fn = errors.checked("cudnnBackendGetAttribute", warn=False)
        got = ctypes.c_int64(0)
        if count is None:
            fn(h, name, atype, 0, ctypes.byref(got), None)
            count = got.value
        count = int_in(count, "count", 0, INT32_MAX)
        if atype == _T.BACKEND_DESCRIPTOR:
            if descriptor_type is None:
                raise TypeError("descriptor_type is required to read BACKEND_DESCRIPTOR values")
            dtype = coerce_descriptor_type(descriptor_type)
            # cuDNN writes into the descriptors we pass: they must be of the attribute's type
            check_descriptor_type(name, dtype, "descriptor_type")
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
        ctype = CTYPE_OF_TYPE[atype]
        if count > _GET_DIRECT:
            # a large count is trusted only up to what the attribute holds: ask cuDNN first
            # instead of zeroing count elements (2**31 - 1 INT64s: 16 GiB) it may refuse
            fn(h, name, atype, 0, ctypes.byref(got), None)
            count = min(count, got.value)
        arr = (ctype * max(count, 1))()
        fn(h, name, atype, count, ctypes.byref(got), arr)
        return from_c(atype, arr, min(got.value, count))

    def finalize(self) -> Self:
        """``cudnnBackendFinalize``: validate and freeze the attributes. Returns ``self``.

        Raises
        ------
        ValueError
            An engine configuration without a finalized engine, or an execution plan without a
            finalized engine configuration (cuDNN crashes finalizing those; checked for
            descriptors this wrapper owns, whose attributes it saw being set).
        CudnnError
            cuDNN rejected the configuration (without a GPU driver every finalize returns
            ``CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED``, a :class:`~pycudnn.errors.SublibraryError`).
        """
        h = self._h()
        needs = _FINALIZE_NEEDS.get(self._type) if self._owned else None
        if needs is not None and _PLAN_JSON not in self._attr_refs:  # (from JSON: no config)
            self._check_finalize_needs(needs)
        errors.checked("cudnnBackendFinalize", warn=False)(h)
        self._finalized = True
        return self

    def _check_finalize_needs(self, needs: tuple[BackendAttributeName, ...]) -> None:
        kind = self._type.name if self._type is not None else "descriptor"
        for attr in needs:
            ref = self._attr_refs.get(int(attr))
            if ref is None:
                raise ValueError(
                    f"{kind}: set {attr.name} before finalize (cuDNN 9 crashes finalizing a "
                    f"{kind} without it)"
                )
            values = ref[0] if isinstance(ref[0], list | tuple) else (ref[0],)
            for v in values:
                if v._finalized is False:
                    raise ValueError(
                        f"{kind}: the {v._type.name if v._type else 'descriptor'} set as "
                        f"{attr.name} is not finalized; finalize it first (cuDNN 9 crashes "
                        "finalizing on top of an unfinalized one)"
                    )

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
        shape = int_seq(shape, "shape", lo=1, hi=INT64_MAX, min_len=1, max_len=DIM_MAX)
        if strides is None:
            strides = packed_strides(shape)
        else:
            strides = int_seq(strides, "strides", lo=1, hi=INT64_MAX, length=len(shape))
        dt = as_data_type(dtype, argument="dtype") if not isinstance(dtype, DataType) else dtype
        uid = int_in(uid, "uid", 0, INT64_MAX)
        alignment = int_in(alignment, "alignment", 1, INT64_MAX)
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
        pre = int_seq(pre_padding, "pre_padding", lo=0, hi=INT64_MAX, min_len=1, max_len=6)
        n = len(pre)
        post = (
            pre
            if post_padding is None
            else int_seq(post_padding, "post_padding", lo=0, hi=INT64_MAX, length=n)
        )
        stride = spatial(stride, "stride", n, lo=1, hi=INT64_MAX)
        dilation = spatial(dilation, "dilation", n, lo=1, hi=INT64_MAX)
        mode = coerce_enum(mode, enums.ConvolutionMode, "mode", CONV_MODES)
        ct = restrict_dtype(compute_type, "compute_type", _COMPUTE_TYPES)
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
        mode = coerce_enum(mode, enums.PointwiseMode, "mode")
        ct = restrict_dtype(compute_type, "compute_type", _POINTWISE_TYPES)
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
                attrs.append((attr, _T.DOUBLE, as_float(value, arg)))
        if axis is not None:
            attrs.append((BackendAttributeName.POINTWISE_AXIS, _T.INT64, int_in(axis, "axis", 0)))
        return cls._build(BackendDescriptorType.POINTWISE_DESCRIPTOR, attrs, finalize)

    @classmethod
    def _conv_op(
        cls,
        operation: str,
        tensors: dict[str, Any],
        conv: Any,
        alpha: float,
        beta: float,
        finalize: bool,
    ) -> Self:
        for arg, desc in tensors.items():
            _require_backend(desc, arg, BackendDescriptorType.TENSOR_DESCRIPTOR)
        _require_backend(conv, "conv", BackendDescriptorType.CONVOLUTION_DESCRIPTOR)
        # alpha and beta as doubles: cuDNN takes either type whatever the compute type
        scaling = (_T.DOUBLE, as_float(alpha, "alpha"), as_float(beta, "beta"))
        attrs = conv_operation_attributes(operation, tensors, conv, scaling)
        return cls._build(CONV_OPERATIONS[operation].descriptor, attrs, finalize)

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
        return cls._conv_op("forward", {"x": x, "w": w, "y": y}, conv, alpha, beta, finalize)

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
        tensors = {"dx": dx, "w": w, "dy": dy}
        return cls._conv_op("backward_data", tensors, conv, alpha, beta, finalize)

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
        tensors = {"x": x, "dw": dw, "dy": dy}
        return cls._conv_op("backward_filter", tensors, conv, alpha, beta, finalize)

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
        attrs.append((A.OPERATION_POINTWISE_ALPHA1, _T.DOUBLE, as_float(alpha1, "alpha1")))
        attrs.append((A.OPERATION_POINTWISE_ALPHA2, _T.DOUBLE, as_float(alpha2, "alpha2")))
        return cls._build(BackendDescriptorType.OPERATION_POINTWISE_DESCRIPTOR, attrs, finalize)

    @classmethod
    def operation_graph(
        cls, ops: Sequence[BackendDescriptor], handle: Any = None, *, finalize: bool = True
    ) -> Self:
        """``OPERATIONGRAPH_DESCRIPTOR`` over the operation descriptors *ops*; *handle* (a
        ``pycudnn.Handle``) is optional in cuDNN 9 and kept alive when given."""
        if isinstance(ops, BackendDescriptor) or not isinstance(ops, Sequence) or not ops:
            raise TypeError(f"ops must be a non-empty sequence of BackendDescriptor, got {ops!r}")
        for i, op in enumerate(ops):
            _require_backend(op, f"ops[{i}]", None)
        attrs: list[tuple] = [
            (BackendAttributeName.OPERATIONGRAPH_OPS, _T.BACKEND_DESCRIPTOR, list(ops))
        ]
        if handle is not None:
            as_handle(handle)
            attrs.append((BackendAttributeName.OPERATIONGRAPH_HANDLE, _T.HANDLE, handle))
        # set() keeps the handle object alive with the other attribute values
        return cls._build(BackendDescriptorType.OPERATIONGRAPH_DESCRIPTOR, attrs, finalize)


def _require_backend(value: Any, argument: str, dtype: BackendDescriptorType | None) -> None:
    if not isinstance(value, BackendDescriptor):
        raise TypeError(f"{argument} must be a BackendDescriptor, got {describe(value)}")
    value._h()
    if dtype is not None and value._type is not None and value._type != dtype:
        raise ValueError(f"{argument} must be a {dtype.name}, got a {value._type.name}")
