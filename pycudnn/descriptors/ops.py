"""Descriptors of the single-call legacy operations: pooling (with its forward output shape),
activation, local response normalization, ``cudnnOpTensor`` and ``cudnnReduceTensor``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

from .. import enums, errors
from .._generated import lib as _lib
from .._resource import Resource
from .._types import dtype_name
from ..enums import DataType
from ._validate import (
    DIM_MAX,
    FLOAT_TYPES,
    c_int_array,
    coerce_enum,
    describe,
    finite,
    int_in,
    nan_mode,
    restrict_dtype,
    spatial,
    spatial_rank,
)
from .tensor import TensorDescriptor

__all__ = [
    "ActivationDescriptor",
    "LRNDescriptor",
    "OpTensorDescriptor",
    "PoolingDescriptor",
    "ReduceTensorDescriptor",
]

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
        n = spatial_rank(ndim, window, stride, pad)
        window = spatial(window, "window", n, lo=1)
        stride = window if stride is None else spatial(stride, "stride", n, lo=1)
        pad = spatial(pad, "pad", n, lo=0)
        for i, (p, w) in enumerate(zip(pad, window, strict=True)):
            if p >= w:
                raise ValueError(
                    f"pad={pad} is not smaller than window={window} in spatial dim {i}: a "
                    "window could lie wholly in the padding (cuDNN computes no such output)"
                )
        mode = coerce_enum(mode, enums.PoolingMode, "mode", _POOL_MODES)
        nan = nan_mode(nan_propagation)
        h = self._new_handle()
        errors.checked("cudnnCreatePoolingDescriptor", warn=False)(ctypes.byref(h))
        self._adopt(h)
        errors.checked("cudnnSetPoolingNdDescriptor", warn=False)(
            h, mode, nan, n, c_int_array(window), c_int_array(pad), c_int_array(stride)
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
            raise TypeError(f"x must be a TensorDescriptor, got {describe(x)}")
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
        mode = coerce_enum(mode, enums.ActivationMode, "mode", _ACT_MODES)
        coef = finite(coef, "coef")
        if mode == enums.ActivationMode.CLIPPED_RELU and coef < 0:
            raise ValueError(
                f"coef={coef!r} is the clipped ReLU's ceiling, min(max(x, 0), coef); expected a "
                "value >= 0"
            )
        nan = nan_mode(nan_propagation)
        beta = None if swish_beta is None else finite(swish_beta, "swish_beta")
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
        n = int_in(n, "n", _lib.CUDNN_LRN_MIN_N, what="1 to 16")
        if n > _lib.CUDNN_LRN_MAX_N:
            raise ValueError(f"n={n} is invalid; expected 1 to 16 (CUDNN_LRN_MAX_N)")
        alpha = finite(alpha, "alpha")
        beta = finite(beta, "beta")
        k = finite(k, "k")
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
        op = coerce_enum(op, enums.OpTensorOp, "op", _OP_TENSOR_OPS)
        ct = restrict_dtype(compute_type, "compute_type", FLOAT_TYPES)
        nan = nan_mode(nan_propagation)
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
        op = coerce_enum(op, enums.ReduceTensorOp, "op", _REDUCE_OPS)
        ct = restrict_dtype(
            compute_type, "compute_type", (DataType.FLOAT, DataType.DOUBLE, DataType.HALF)
        )
        nan = nan_mode(nan_propagation)
        if isinstance(indices, bool):
            ind = enums.ReduceTensorIndices(int(indices))
        else:
            ind = coerce_enum(indices, enums.ReduceTensorIndices, "indices", _INDICES)
        it = coerce_enum(indices_type, enums.IndicesType, "indices_type", _INDICES_TYPES)
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
