"""The convolution descriptor, ``cudnnConvolutionDescriptor_t``: padding, stride, dilation,
mode, compute type, groups and math type, and the forward output shape for a tensor and filter.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

from .. import enums, errors
from .._generated import lib as _lib
from .._layout import INT32_MAX
from .._resource import Resource
from .._types import dtype_name
from ..enums import DataType
from ._validate import (
    CONV_MODES,
    DIM_MAX,
    MATH_TYPES,
    c_int_array,
    coerce_enum,
    describe,
    int_in,
    restrict_dtype,
    spatial,
    spatial_rank,
)
from .tensor import FilterDescriptor, TensorDescriptor

__all__ = ["ConvolutionDescriptor"]

_CONV_COMPUTE_TYPES = (DataType.FLOAT, DataType.DOUBLE, DataType.HALF, DataType.INT32)


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
        n = spatial_rank(ndim, pad, stride, dilation)
        # cuDNN adds 2 * pad to an input size in 32-bit ints
        pad = spatial(pad, "pad", n, lo=0, hi=INT32_MAX // 2)
        stride = spatial(stride, "stride", n, lo=1)
        dilation = spatial(dilation, "dilation", n, lo=1)
        mode = coerce_enum(mode, enums.ConvolutionMode, "mode", CONV_MODES)
        ct = restrict_dtype(compute_type, "compute_type", _CONV_COMPUTE_TYPES)
        groups = int_in(groups, "groups", 1)
        math = coerce_enum(math_type, enums.MathType, "math_type", MATH_TYPES)
        h = self._new_handle()
        errors.checked("cudnnCreateConvolutionDescriptor", warn=False)(ctypes.byref(h))
        self._adopt(h)
        errors.checked("cudnnSetConvolutionNdDescriptor", warn=False)(
            h, n, c_int_array(pad), c_int_array(stride), c_int_array(dilation), mode, ct
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
        r = coerce_enum(value, enums.ReorderType, "reorder_type")
        errors.checked("cudnnSetConvolutionReorderType", warn=False)(self._h(), r)

    def forward_output_shape(self, x: TensorDescriptor, w: FilterDescriptor) -> tuple[int, ...]:
        """``cudnnGetConvolutionNdForwardOutputDim``: the output shape for input *x* and
        filter *w*.

        Checks first (``ValueError``, no C call for these): ranks agree with this descriptor,
        ``x.C == w.C * groups``, ``w.K`` divisible by ``groups``, and every output size >= 1
        (``(in + 2*pad - dilation*(k-1) - 1) // stride + 1``).
        """
        if not isinstance(x, TensorDescriptor):
            raise TypeError(f"x must be a TensorDescriptor, got {describe(x)}")
        if not isinstance(w, FilterDescriptor):
            raise TypeError(f"w must be a FilterDescriptor, got {describe(w)}")
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
            if xs[i + 2] + 2 * pad[i] > INT32_MAX or eff > INT32_MAX:
                raise ValueError(
                    f"x {xs} padded by pad {pad} (or w {ws} dilated by {dil}) is larger than "
                    f"cuDNN's 32-bit sizes ({INT32_MAX}) in spatial dim {i}"
                )
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
