"""Tensor and filter descriptors: ``cudnnTensorDescriptor_t`` (an N-d shape, element strides and
data type; also the batch-normalization parameter descriptor derived from one) and
``cudnnFilterDescriptor_t`` (convolution weights).

Shapes are ``(N, C, spatial...)`` whatever the memory layout; a layout name (NCHW, NHWC) stands
for the packed strides of that layout.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

from .. import enums, errors
from .._generated import lib as _lib
from .._layout import packed_strides
from .._resource import Resource
from .._types import dtype_name
from ..enums import DataType
from ._validate import (
    DIM_MAX,
    c_int_array,
    check_span,
    coerce_enum,
    describe,
    int_seq,
    restrict_dtype,
    tensor_format,
)

__all__ = ["FilterDescriptor", "TensorDescriptor"]

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


def _layout_strides(shape: Sequence[int], layout: enums.TensorFormat) -> tuple[int, ...]:
    """Packed strides of *shape* (given as N, C, spatial...) in *layout* (NCHW or NHWC)."""
    return packed_strides(shape, channels_last=layout == enums.TensorFormat.NHWC)


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
        shape = int_seq(shape, "shape", lo=1, min_len=3, max_len=DIM_MAX)
        dt = restrict_dtype(dtype, "dtype", _TENSOR_DTYPES)
        fmt = None if layout is None else tensor_format(layout)
        if strides is None:
            strides = _layout_strides(shape, fmt or enums.TensorFormat.NCHW)
        else:
            strides = int_seq(strides, "strides", lo=1, length=len(shape))
            if fmt is not None and strides != _layout_strides(shape, fmt):
                raise ValueError(
                    f"strides={strides} are not the packed {fmt.name} strides of shape {shape} "
                    f"({_layout_strides(shape, fmt)}); omit layout to use arbitrary strides"
                )
        check_span(shape, strides, "shape")
        h = self._new_handle()
        errors.checked("cudnnCreateTensorDescriptor", warn=False)(ctypes.byref(h))
        self._adopt(h)
        errors.checked("cudnnSetTensorNdDescriptor", warn=False)(
            h, dt, len(shape), c_int_array(shape), c_int_array(strides)
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
            raise TypeError(f"x must be a TensorDescriptor, got {describe(x)}")
        mode = coerce_enum(mode, enums.BatchNormMode, "mode", _BN_MODES)
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


#: ``CUDNN_BN_MIN_EPSILON``: the smallest epsilon cuDNN's batch normalization accepts
BN_MIN_EPSILON: float = float(_lib.CUDNN_BN_MIN_EPSILON)

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
        shape = int_seq(shape, "shape", lo=1, min_len=3, max_len=DIM_MAX)
        dt = restrict_dtype(dtype, "dtype", _FILTER_DTYPES)
        fmt = tensor_format(layout)
        check_span(shape, packed_strides(shape), "shape")
        h = self._new_handle()
        errors.checked("cudnnCreateFilterDescriptor", warn=False)(ctypes.byref(h))
        self._adopt(h)
        errors.checked("cudnnSetFilterNdDescriptor", warn=False)(
            h, dt, fmt, len(shape), c_int_array(shape)
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
