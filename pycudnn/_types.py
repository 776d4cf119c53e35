"""dtype rules and the protocols pycudnn accepts instead of concrete types.

One table maps numpy dtypes (and their names) to ``cudnnDataType_t``; every layer converts through
it, so a dtype is spelled the same everywhere. bfloat16 has no numpy dtype of its own: the
``ml_dtypes`` package provides one, and the string ``"bfloat16"`` always works.

Scaling parameters (``alpha``/``beta``) follow cuDNN's rule: ``double`` for double data, ``float``
for everything else.
"""

from __future__ import annotations

import ctypes
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .enums import DataType

__all__ = [
    "CudaStreamLike",
    "HasPtr",
    "as_data_type",
    "itemsize",
    "numpy_dtype",
    "scaling_ctype",
]


@runtime_checkable
class HasPtr(Protocol):
    """Anything exposing an integer address as ``.ptr`` (descriptors, handles, device arrays)."""

    @property
    def ptr(self) -> int: ...


@runtime_checkable
class CudaStreamLike(Protocol):
    """An object that can hand out a CUDA stream (the ``__cuda_stream__`` protocol)."""

    def __cuda_stream__(self) -> tuple[int, int]: ...


# name -> (DataType, itemsize in bytes)
_BY_NAME: dict[str, tuple[DataType, int]] = {
    "float32": (DataType.FLOAT, 4),
    "float64": (DataType.DOUBLE, 8),
    "float16": (DataType.HALF, 2),
    "bfloat16": (DataType.BFLOAT16, 2),
    "int8": (DataType.INT8, 1),
    "uint8": (DataType.UINT8, 1),
    "int32": (DataType.INT32, 4),
    "int64": (DataType.INT64, 8),
    "bool": (DataType.BOOLEAN, 1),
}
_ALIASES = {
    "float": "float32",
    "single": "float32",
    "double": "float64",
    "half": "float16",
    "bf16": "bfloat16",
    "fp32": "float32",
    "fp16": "float16",
    "fp64": "float64",
}
_NAME_BY_TYPE = {dt: name for name, (dt, _size) in _BY_NAME.items()}
_ITEMSIZE = {dt: size for _name, (dt, size) in _BY_NAME.items()}


def _dtype_name(dtype: Any) -> str | None:
    if isinstance(dtype, str):
        name = dtype.lower()
        return _ALIASES.get(name, name)
    try:
        return np.dtype(dtype).name
    except TypeError:
        return getattr(dtype, "name", None) or getattr(dtype, "__name__", None)


def as_data_type(dtype: Any, *, argument: str = "dtype") -> DataType:
    """Convert a numpy dtype, dtype name, torch-style name or ``DataType`` to ``DataType``.

    Raises
    ------
    TypeError
        If *dtype* names no type cuDNN tensors support; the message names *argument*.
    """
    if isinstance(dtype, DataType):
        return dtype
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        try:
            return DataType(dtype)
        except ValueError:
            pass
    name = _dtype_name(dtype)
    if name is not None and name.startswith("torch."):
        name = name[len("torch.") :]
    if name in _BY_NAME:
        return _BY_NAME[name][0]
    raise TypeError(
        f"{argument}={dtype!r} is not a dtype cuDNN supports here; expected one of "
        f"{', '.join(_BY_NAME)} (a numpy dtype, its name, or pycudnn.enums.DataType)"
    )


def numpy_dtype(data_type: DataType) -> np.dtype:
    """The numpy dtype for *data_type* (bfloat16 needs the ``ml_dtypes`` package)."""
    name = _NAME_BY_TYPE.get(DataType(data_type))
    if name is None:
        raise TypeError(f"{DataType(data_type).name} has no numpy dtype")
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError as exc:  # pragma: no cover - ml_dtypes is in the [test] extra
            raise TypeError("bfloat16 on the host needs `pip install ml_dtypes`") from exc
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def itemsize(data_type: DataType) -> int:
    """Bytes per element of *data_type*."""
    try:
        return _ITEMSIZE[DataType(data_type)]
    except KeyError:
        raise TypeError(f"no element size known for {DataType(data_type).name}") from None


def scaling_ctype(data_type: DataType) -> type[ctypes.c_float] | type[ctypes.c_double]:
    """ctypes type of ``alpha``/``beta`` for data of *data_type*: double for DOUBLE, else float."""
    return ctypes.c_double if DataType(data_type) == DataType.DOUBLE else ctypes.c_float
