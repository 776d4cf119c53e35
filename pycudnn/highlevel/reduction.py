"""Tensor reductions: Theano's ``GpuDnnReduction`` as the eager ``dnn_reduction``
(``cudnnReduceTensor``).

``dnn_reduction(x, op, axis, keepdims, return_indices, dtype)`` reduces *x* over any set of axes
with one of cuDNN's nine operations, through the shared call path (:mod:`._call`): a per-thread
cache maps what was passed to a ready call (descriptors, workspace size), so a repeated call
makes one C call. Facts measured on cuDNN 9.19 (H100) that shape this module:

* cuDNN reduces the dimensions where the output descriptor has 1 and the input does not; it
  refuses a "reduction" in which no dimension shrinks (``BAD_PARAM: !dims_differ``), which is
  what reducing size-1 axes (or ``axis=()``) asks for. Such a call runs as a reduction over a
  2-long leading axis of a temporary ``[x, identity]`` (``[x, x]`` for min/max/amax/avg), which
  gives exactly the element-wise result (``|x|`` for amax/norm1/norm2, ``x`` or 1 for
  mul_no_zeros).
* Input and output take any strides. dtypes: float16/float32 in, float16 or float32 out
  (float32 compute); float64 in and out (float64 compute). bfloat16 and float16 compute are
  ``NOT_SUPPORTED``.
* The result is ``alpha * op(x) + beta * out`` (``alpha`` outside the op: ``mul`` gives
  ``alpha * prod(x)``).
* Indices (min, max, amax) are 32-bit, one per output element, the position of the selected
  element *within its reduced block*, flattened in C order over the reduced axes only; they are
  returned as int32 (the values are the same: a block holds < 2**31 elements; pycudnn's arrays
  have no uint32).
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

from .. import _layout, memory
from .._config import parse_bool
from .._types import dtype_name, numpy_dtype
from ..descriptors import ReduceTensorDescriptor
from ..enums import DataType, ReduceTensorOp
from . import _call, _checks, _operand, _staging

if TYPE_CHECKING:
    from ..memory import DeviceArray
    from ..typing import DeviceArrayLike, StreamLike
    from ._annotations import Out, ReduceOp

__all__ = ["dnn_reduction"]

_OPS = {
    "add": ReduceTensorOp.ADD,
    "sum": ReduceTensorOp.ADD,
    "mul": ReduceTensorOp.MUL,
    "prod": ReduceTensorOp.MUL,
    "min": ReduceTensorOp.MIN,
    "minimum": ReduceTensorOp.MIN,
    "max": ReduceTensorOp.MAX,
    "maximum": ReduceTensorOp.MAX,
    "amax": ReduceTensorOp.AMAX,
    "avg": ReduceTensorOp.AVG,
    "mean": ReduceTensorOp.AVG,
    "norm1": ReduceTensorOp.NORM1,
    "norm2": ReduceTensorOp.NORM2,
    "mul_no_zeros": ReduceTensorOp.MUL_NO_ZEROS,
}
_INDEXED = (ReduceTensorOp.MIN, ReduceTensorOp.MAX, ReduceTensorOp.AMAX)
_IN_TYPES = (DataType.HALF, DataType.FLOAT, DataType.DOUBLE)
# input dtype -> output dtypes cuDNN computes (measured; see the module docstring)
_OUT_TYPES = {
    DataType.HALF: (DataType.HALF, DataType.FLOAT),
    DataType.FLOAT: (DataType.FLOAT, DataType.HALF),
    DataType.DOUBLE: (DataType.DOUBLE,),
}
# the second row of the degenerate path's [x, second] temporary: a constant, or x itself
_SECOND = {
    ReduceTensorOp.ADD: 0.0,
    ReduceTensorOp.NORM1: 0.0,
    ReduceTensorOp.NORM2: 0.0,
    ReduceTensorOp.MUL: 1.0,
    ReduceTensorOp.MUL_NO_ZEROS: 1.0,
}
# the value of a reduction over zero elements (min/max/amax have none)
_EMPTY = {
    ReduceTensorOp.ADD: 0.0,
    ReduceTensorOp.NORM1: 0.0,
    ReduceTensorOp.NORM2: 0.0,
    ReduceTensorOp.MUL: 1.0,
    ReduceTensorOp.MUL_NO_ZEROS: 1.0,
    ReduceTensorOp.AVG: math.nan,
}
_KEY = "reduction"


# ==================================================================================================
# dnn_reduction
# ==================================================================================================
def _axes(func: str, axis: Any, nd: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(nd))
    if isinstance(axis, bool):
        raise TypeError(f"{func}: axis must be None, an int or a tuple of ints, got {axis!r}")
    if hasattr(axis, "__index__"):
        items: tuple = (axis,)
    else:
        try:
            items = tuple(axis)
        except TypeError:
            raise TypeError(
                f"{func}: axis must be None, an int or a tuple of ints, got {axis!r}"
            ) from None
    out: list[int] = []
    for a in items:
        if isinstance(a, bool) or not hasattr(a, "__index__"):
            raise TypeError(f"{func}: axis must contain ints, got {axis!r}")
        a = a.__index__()
        if not -nd <= a < nd:
            raise ValueError(f"{func}: axis {a} is out of range for x with {nd} dims")
        a %= nd
        if a in out:
            raise ValueError(f"{func}: axis {axis!r} repeats axis {a}")
        out.append(a)
    return tuple(sorted(out))


def _out_dtype(func: str, dtype: Any, dt: DataType) -> DataType:
    if dtype is None:
        return dt
    odt = _operand.data_type(dtype)
    allowed = _OUT_TYPES[dt]
    if odt not in allowed:
        raise TypeError(
            f"{func}: dtype={dtype!r} is not an output type cuDNN reduces {dtype_name(dt)} to; "
            f"expected one of {', '.join(dtype_name(a) for a in allowed)}"
        )
    return odt


def result_shape(shape: Sequence[int], axis: Any = None, keepdims: bool = False) -> tuple[int, ...]:
    """The shape :func:`dnn_reduction` returns for an input of *shape*."""
    axes = _axes("dnn_reduction", axis, len(shape))
    if keepdims:
        return tuple(1 if i in axes else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in axes)


class _Reduce(_call.Call):
    """``cudnnReduceTensor``: x, then the values[, the indices]."""

    __slots__ = ("ad", "alpha", "beta", "cd", "fn", "hp", "isz", "rd", "ws")

    def __init__(self, func, h, allocs, spans, rd, descs, ws, isz, factors):
        # the descriptors and the factors byref() points into live as long as the entry
        super().__init__(func, h, allocs, spans, keepalive=(rd, descs, factors))
        self.rd, (self.ad, self.cd) = rd, descs
        self.ws, self.isz = ws, isz
        self.hp = h.ptr
        self.alpha, self.beta = (ctypes.byref(f) for f in factors)
        self.fn = _call.quiet("cudnnReduceTensor")

    def launch(self, ptrs):
        x, y = ptrs[0], ptrs[1]
        ind = ptrs[2] if len(ptrs) > 2 else None
        wp = _call.workspace(self.handle, self.ws) if self.ws else None
        self.fn(
            self.hp,
            self.rd,
            ind,
            self.isz if ind is not None else 0,
            wp,
            self.ws,
            self.alpha,
            self.ad,
            x,
            self.beta,
            self.cd,
            y,
        )


class _ReduceDegenerate(_call.Call):
    """No axis shrinks: reduce the leading 2-long axis of a temporary ``[x, second]``
    (``second``: a constant, or x again when None); indices, when asked for, are all 0 (a block
    of one element)."""

    __slots__ = (
        "alpha",
        "beta",
        "cd",
        "copy",
        "fn",
        "hp",
        "m",
        "npdt",
        "one",
        "rd",
        "second",
        "set",
        "td",
        "tdh",
        "ws",
        "xd",
        "zero",
    )

    def __init__(self, func, h, allocs, spans, rd, descs, ws, values, factors):
        dt, m, second = values  # data type, elements of x, the constant second operand or None
        one, zero = _call.scales(dt, 1.0, 0.0)
        second = None if second is None else _call.scales(dt, second)[0]
        super().__init__(func, h, allocs, spans, keepalive=(rd, descs, factors, one, zero, second))
        self.rd, (self.xd, self.tdh, self.td, self.cd) = rd, descs
        self.ws, self.m = ws, m
        self.npdt = numpy_dtype(dt)
        self.hp = h.ptr
        self.alpha, self.beta = (ctypes.byref(f) for f in factors)
        self.one, self.zero = ctypes.byref(one), ctypes.byref(zero)
        self.second = None if second is None else ctypes.byref(second)
        self.fn = _call.quiet("cudnnReduceTensor")
        self.copy = _call.quiet("cudnnTransformTensor")
        self.set = _call.quiet("cudnnSetTensor")

    def launch(self, ptrs):
        x, y = ptrs[0], ptrs[1]
        h = self.handle
        tmp = memory.empty((2 * self.m,), self.npdt, h.device, h.stream)
        second = tmp.ptr + self.m * self.npdt.itemsize
        one, zero = self.one, self.zero
        self.copy(self.hp, one, self.xd, x, zero, self.tdh, tmp.ptr)
        if self.second is None:
            self.copy(self.hp, one, self.xd, x, zero, self.tdh, second)
        else:
            self.set(self.hp, self.tdh, second, self.second)
        wp = _call.workspace(h, self.ws) if self.ws else None
        self.fn(
            self.hp,
            self.rd,
            None,
            0,
            wp,
            self.ws,
            self.alpha,
            self.td,
            tmp.ptr,
            self.beta,
            self.cd,
            y,
        )
        del tmp  # freed stream-ordered, after the queued calls (the indices: a _ZeroSpec)


class _ReduceEmpty(_call.Call):
    """Reduced axes of size 0: the op's value over nothing, ``alpha * v + beta * out``."""

    __slots__ = ("blend", "cd", "copy", "hp", "kshape", "npdt", "set", "tmpd", "value")

    def __init__(self, func, h, allocs, spans, cd, dt, kshape, value, beta):
        value = _call.scales(dt, value)[0]
        blend = tmpd = None
        if beta != 0.0:
            blend = _call.scales(dt, 1.0, beta)
            tmpd = _staging.tensor_descriptor(
                *_staging.padded(kshape, _layout.packed_strides(kshape)), dt
            )
        super().__init__(func, h, allocs, spans, keepalive=(cd, value, blend, tmpd))
        self.cd, self.hp, self.kshape, self.tmpd = cd, h.ptr, kshape, tmpd
        self.npdt = numpy_dtype(dt)
        self.value = ctypes.byref(value)
        self.blend = None if blend is None else tuple(ctypes.byref(f) for f in blend)
        self.set = _call.quiet("cudnnSetTensor")
        self.copy = _call.quiet("cudnnTransformTensor")

    def launch(self, ptrs):
        y = ptrs[1]
        if self.blend is None:
            self.set(self.hp, self.cd, y, self.value)
            return
        h = self.handle
        tmp = memory.empty(self.kshape, self.npdt, h.device, h.stream)
        self.set(self.hp, self.tmpd, tmp.ptr, self.value)
        self.copy(self.hp, self.blend[0], self.tmpd, tmp.ptr, self.blend[1], self.cd, y)
        del tmp


class _ZeroSpec(_call.OutputSpec):
    """An output allocated zeroed: the indices of a reduction over blocks of one element."""

    __slots__ = ()

    def new(self, stream: int) -> memory.DeviceArray:
        return super().new(stream).fill_(0)


# return_indices decides between the values and (values, indices)
@overload
def dnn_reduction(
    x: DeviceArrayLike,
    op: ReduceOp = ...,
    axis: int | Sequence[int] | None = ...,
    keepdims: bool = ...,
    return_indices: Literal[False] = ...,
    dtype: object = ...,
    *,
    alpha: float = ...,
    beta: float = ...,
    out: Out | None = ...,
    stream: StreamLike = ...,
) -> Out: ...
@overload
def dnn_reduction(
    x: DeviceArrayLike,
    op: ReduceOp = ...,
    axis: int | Sequence[int] | None = ...,
    keepdims: bool = ...,
    return_indices: Literal[True] = ...,
    dtype: object = ...,
    *,
    alpha: float = ...,
    beta: float = ...,
    out: Out | None = ...,
    stream: StreamLike = ...,
) -> tuple[Out, DeviceArray]: ...
@overload
def dnn_reduction(
    x: DeviceArrayLike,
    op: ReduceOp = ...,
    axis: int | Sequence[int] | None = ...,
    keepdims: bool = ...,
    return_indices: bool = ...,
    dtype: object = ...,
    *,
    alpha: float = ...,
    beta: float = ...,
    out: Out | None = ...,
    stream: StreamLike = ...,
) -> Out | tuple[Out, DeviceArray]: ...
def dnn_reduction(
    x: DeviceArrayLike,
    op: ReduceOp = "add",
    axis: int | Sequence[int] | None = None,
    keepdims: bool = False,
    return_indices: bool = False,
    dtype: object = None,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Out | None = None,
    stream: StreamLike = None,
) -> Any:
    """Reduce *x* over *axis* with one of cuDNN's reductions (``cudnnReduceTensor``):
    ``out = alpha * op(x) + beta * out``.

    Parameters
    ----------
    x : device array
        1 to 8 dims, any strides; float16, float32 or float64.
    op : str
        ``'add'`` (alias ``'sum'``), ``'mul'`` (``'prod'``), ``'min'`` (``'minimum'``),
        ``'max'`` (``'maximum'``), ``'amax'`` (max of ``|x|``), ``'avg'`` (``'mean'``),
        ``'norm1'`` (sum of ``|x|``), ``'norm2'`` (``sqrt(sum(x**2))``) or ``'mul_no_zeros'``
        (product of the non-zero elements; 1 for a block of zeros).
    axis : None, int or tuple of int
        The axes to reduce (negative ones count from the end); None: all.
    keepdims : bool
        Keep the reduced axes as size-1 dims (as numpy).
    return_indices : bool
        Also return the position of the selected element (``'min'``, ``'max'``, ``'amax'``
        only): int32, shaped like the result, the index within the reduced block flattened in
        C order over the reduced axes (``np.argmax`` of ``x`` moved to ``(kept..., reduced...)``
        and reshaped to ``(kept..., -1)``).
    dtype : dtype, optional
        Output dtype: the input's by default; float16 input may give float32 and float32 input
        float16 (compute is float32); float64 stays float64.
    alpha, beta : float
        Blend factors (``beta != 0`` accumulates into *out*).
    out : device array, optional
        The result, any strides (not the indices: those are always new).
    stream : optional
        CUDA stream; default the operands' framework's current stream (torch, CuPy), else the
        handle's stream.

    Returns
    -------
    DeviceArray, or (values, indices)
        The values (*out* when given) and, with *return_indices*, the int32 indices.

    Raises
    ------
    TypeError
        Host arrays, an unsupported dtype or output dtype, a non-int axis, non-bool flags.
    ValueError
        An unknown op, an axis out of range or repeated, indices for an op without them, more
        than 8 dims, a bad *out* (shape, device, overlap), negative or zero strides, min/max/amax
        over zero elements.

    Examples
    --------
    >>> s = pycudnn.dnn_reduction(x, "add", axis=(2, 3))            # sum over H, W
    >>> m, i = pycudnn.dnn_reduction(x, "max", axis=1, return_indices=True)
    >>> n = pycudnn.dnn_reduction(x, "norm2", axis=None, dtype="float32")
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(x)
    px, kx = _operand.key_of(x)
    po, ko = (None, None) if out is None else _operand.key_of(out)
    keepdims = parse_bool(keepdims, "dnn_reduction", "keepdims")
    return_indices = parse_bool(return_indices, "dnn_reduction", "return_indices")
    key = (_KEY, kx, ko, op, axis, keepdims, return_indices, dtype, alpha, beta)
    # True == 1.0 and (True, 1) == (1, 1), but only one is valid: the types in the key
    key += (
        alpha.__class__,
        beta.__class__,
        axis.__class__ is not int and axis is not None and _call.has_bool(axis),
    )
    args = (x, out, op, axis, keepdims, return_indices, dtype, alpha, beta, stream)
    if return_indices:
        return _call.run_cached(key, _build, args, (px,), (out, None), (po, None), stream)
    return _call.run_cached(key, _build, args, (px,), (out,), (po,), stream)[0]


def _build(x, out, op, axis, keepdims, return_indices, dtype, alpha, beta, stream):
    func = "dnn_reduction"
    g = _operand.operand(x)
    dt, device = _checks.same_dtype_and_device(func, (("x", g),), _IN_TYPES)
    nd = len(g.shape)
    if not 1 <= nd <= 8:
        raise ValueError(f"{func}: x has {nd} dims; expected 1 to 8")
    _checks.check_strides(func, "x", g)
    red = _checks.choose(op, _OPS, "op", func)
    axes = _axes(func, axis, nd)
    keepdims = parse_bool(keepdims, func, "keepdims")
    with_indices = parse_bool(return_indices, func, "return_indices")
    if with_indices and red not in _INDEXED:
        raise ValueError(
            f"{func}: return_indices=True needs op 'min', 'max' or 'amax', got op={op!r}"
        )
    odt = _out_dtype(func, dtype, dt)
    a = _checks.real(alpha, "alpha", func)
    b = _checks.real(beta, "beta", func)
    if b != 0.0 and out is None:
        raise ValueError(f"{func}: beta={beta!r} blends into out, but no out was given")
    kshape = tuple(1 if i in axes else s for i, s in enumerate(g.shape))
    rshape = kshape if keepdims else tuple(s for i, s in enumerate(g.shape) if i not in axes)
    if out is None:
        spec = _call.output_spec(rshape, odt, device)
        rstrides, so = spec.element_strides, spec.nbytes_span
    else:
        spec = None
        o = _checks.out_operand(func, out, rshape, odt, device)
        rstrides, so = tuple(o.strides), o.nbytes_span
    # the output's strides in the keepdims shape cuDNN sees (reduced dims: size 1, any stride)
    if keepdims:
        kstrides = tuple(rstrides)
    else:
        it = iter(rstrides)
        kstrides = tuple(1 if i in axes else next(it) for i in range(nd))
    allocs: list[Any] = [spec]
    out_spans = [so]
    if with_indices:
        ispec = _call.output_spec(rshape, DataType.INT32, device)
        allocs.append(ispec)
        out_spans.append(ispec.nbytes_span)
    spans = (g.nbytes_span, *out_spans)
    n_red = math.prod(g.shape[i] for i in axes)
    n_out = math.prod(rshape)
    if n_red == 0 and n_out and red not in _EMPTY:
        raise ValueError(
            f"{func}: op={op!r} over zero elements (x has shape {tuple(g.shape)}, axis {axis!r}) "
            "has no value"
        )
    h = _call.handle_for(device, stream, func)
    if n_out == 0:
        return _call.Call(func, h, allocs, spans, noop=True)
    cd = _staging.tensor_descriptor(*_staging.padded(kshape, kstrides), odt)
    if n_red == 0:
        return _ReduceEmpty(func, h, allocs, spans, cd, odt, kshape, a * _EMPTY[red], b)
    compute = DataType.DOUBLE if dt == DataType.DOUBLE else DataType.FLOAT
    sa, sb = _call.scales(dt, a, b)
    if n_red > 1:
        rd = ReduceTensorDescriptor(red, compute, nan_propagation=True, indices=with_indices)
        ad = _staging.tensor_descriptor(*_staging.padded(g.shape, g.strides), dt)
        ws, isz = _sizes(h, rd, ad, cd, with_indices)
        if with_indices and isz > 4 * n_out:  # never seen: cuDNN asks for one uint32 per output
            raise NotImplementedError(f"{func}: cuDNN asks for {isz} bytes of indices")
        return _Reduce(func, h, allocs, spans, rd, (ad, cd), ws, isz, (sa, sb))
    return _build_degenerate((func, h, allocs, spans), g, dt, red, kstrides, odt, compute, (sa, sb))


def _sizes(h, rd, ad, cd, with_indices) -> tuple[int, int]:
    size = ctypes.c_size_t()
    _call.quiet("cudnnGetReductionWorkspaceSize")(h.ptr, rd, ad, cd, ctypes.byref(size))
    ws = size.value
    isz = 0
    if with_indices:
        _call.quiet("cudnnGetReductionIndicesSize")(h.ptr, rd, ad, cd, ctypes.byref(size))
        isz = size.value
    return ws, isz


def _build_degenerate(entry, g, dt, red, kstrides, odt, compute, factors) -> _call.Call:
    """Every reduced axis has size 1: element-wise, through a 2-long leading axis. *entry*:
    the call's ``(func, handle, allocs, spans)``."""
    func, h, allocs, spans = entry
    if len(allocs) > 1:  # the indices: all 0
        allocs = (allocs[0], _ZeroSpec(*allocs[1]))
    keep = [i for i, s in enumerate(g.shape) if s != 1]
    shape = tuple(g.shape[i] for i in keep) or (1,)
    xstrides = tuple(g.strides[i] for i in keep) or (1,)
    cstrides = tuple(kstrides[i] for i in keep) or (1,)
    if len(shape) >= 8:
        raise NotImplementedError(
            f"{func}: reducing no element of an 8-D x without size-1 dims is not supported"
        )
    m = math.prod(shape)
    packed = _layout.packed_strides(shape)
    xd = _staging.tensor_descriptor(*_staging.padded(shape, xstrides), dt)
    tdh = _staging.tensor_descriptor(*_staging.padded(shape, packed), dt)
    td = _staging.tensor_descriptor(*_staging.padded((2, *shape), (m, *packed)), dt)
    cd = _staging.tensor_descriptor(*_staging.padded((1, *shape), (1, *cstrides)), odt)
    rd = ReduceTensorDescriptor(red, compute, nan_propagation=True)
    ws, _ = _sizes(h, rd, td, cd, False)
    descs = (xd, tdh, td, cd)
    values = (dt, m, _SECOND.get(red))
    return _ReduceDegenerate(func, h, allocs, spans, rd, descs, ws, values, factors)
