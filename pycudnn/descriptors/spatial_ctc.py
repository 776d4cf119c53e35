"""Two single-purpose descriptors: the spatial transformer's output grid
(``cudnnSpatialTransformerDescriptor_t``) and the CTC loss (``cudnnCTCLossDescriptor_t``).
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
from ._validate import c_int_array, check_span, coerce_enum, int_in, int_seq, restrict_dtype

__all__ = ["CTCLossDescriptor", "SpatialTransformerDescriptor"]


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
        shape = int_seq(shape, "shape", lo=1, length=4)
        check_span(shape, packed_strides(shape), "shape")
        dt = restrict_dtype(dtype, "dtype", (DataType.FLOAT, DataType.DOUBLE, DataType.HALF))
        smp = coerce_enum(sampler, enums.SamplerType, "sampler")
        h = self._new_handle()
        errors.checked("cudnnCreateSpatialTransformerDescriptor", warn=False)(ctypes.byref(h))
        self._adopt(h)
        self._cfg: tuple[Any, Any, Any] = (None, None, None)
        errors.checked("cudnnSetSpatialTransformerNdDescriptor", warn=False)(
            h, smp, dt, 4, c_int_array(shape)
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
        ct = restrict_dtype(compute_type, "compute_type", (DataType.FLOAT, DataType.DOUBLE))
        norm = coerce_enum(normalization, enums.LossNormalizationMode, "normalization", _CTC_NORM)
        grad = coerce_enum(grad_mode, enums.CTCGradMode, "grad_mode", _CTC_GRAD)
        mll = int_in(max_label_length, "max_label_length", 1)
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
