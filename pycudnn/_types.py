"""The one dtype table, and the protocols pycudnn accepts instead of concrete types.

Every layer converts dtypes through :data:`DTYPES`: a cuDNN ``DataType``, its canonical name
(numpy's), element size, DLPack type code and scaling-parameter type. So a dtype is spelt, sized
and exchanged the same way everywhere. bfloat16 has no numpy dtype of its own: the ``ml_dtypes``
package provides one, and the string ``"bfloat16"`` always works.

Scaling parameters (``alpha``/``beta``) follow cuDNN's rule: ``double`` for double data,
``float`` for everything else.
"""

from __future__ import annotations

import ctypes
import enum
import sys
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from .enums import BackendAttributeType, DataType

__all__ = [
    "DTYPES",
    "FLOATS",
    "DType",
    "HasPtr",
    "as_data_type",
    "dtype_info",
    "dtype_name",
    "from_dlpack_code",
    "itemsize",
    "numpy_dtype",
    "scaling_ctype",
    "scaling_type",
]


@runtime_checkable
class HasPtr(Protocol):
    """Anything exposing an integer address as ``.ptr`` (descriptors, handles, device arrays)."""

    @property
    def ptr(self) -> int: ...


class DType(NamedTuple):
    """One row of the dtype table."""

    name: str  # numpy's name ("float32", "bfloat16")
    data_type: DataType
    itemsize: int  # bytes
    dlpack_code: int  # DLDataTypeCode: 0 int, 1 uint, 2 float, 4 bfloat, 6 bool
    scaling: type[ctypes.c_float] | type[ctypes.c_double]  # ctypes type of alpha/beta


_F, _D = ctypes.c_float, ctypes.c_double
#: Every data type cuDNN tensors support here, keyed by ``DataType``.
DTYPES: dict[DataType, DType] = {
    row.data_type: row
    for row in (
        DType("float32", DataType.FLOAT, 4, 2, _F),
        DType("float64", DataType.DOUBLE, 8, 2, _D),
        DType("float16", DataType.HALF, 2, 2, _F),
        DType("bfloat16", DataType.BFLOAT16, 2, 4, _F),
        DType("int8", DataType.INT8, 1, 0, _F),
        DType("uint8", DataType.UINT8, 1, 1, _F),
        DType("int32", DataType.INT32, 4, 0, _F),
        DType("int64", DataType.INT64, 8, 0, _F),
        DType("bool", DataType.BOOLEAN, 1, 6, _F),
    )
}
#: The floating-point data types (what "any float" means in checks and defaults).
FLOATS = (DataType.HALF, DataType.BFLOAT16, DataType.FLOAT, DataType.DOUBLE)
_BY_NAME = {row.name: row for row in DTYPES.values()}
_BY_DLPACK = {(row.dlpack_code, row.itemsize * 8): row for row in DTYPES.values()}
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


_NATIVE = "<" if sys.byteorder == "little" else ">"


def _dtype_name(dtype: Any) -> str | None:
    if isinstance(dtype, str):
        name = dtype.lower()
        return _ALIASES.get(name, name)
    if type(dtype).__module__.partition(".")[0] == "torch":
        # a torch.dtype: numpy cannot read it and it has no name attribute, but its str() is
        # "torch.float16" (torch.half and torch.float16 are one object)
        return str(dtype)
    try:
        # numpy dtypes and scalar types; ml_dtypes.bfloat16; CuPy's (numpy's own) and JAX's
        # (jnp.float32 and jnp.bfloat16 are types with a numpy .dtype)
        npd = np.dtype(dtype)
        if npd.byteorder not in ("=", "|") and npd.byteorder != _NATIVE:
            return f"{npd.name} (byte-swapped: {npd.str})"  # a name no row has: refused
        return npd.name
    except (TypeError, ValueError):
        return getattr(dtype, "name", None) or getattr(dtype, "__name__", None)


def as_data_type(dtype: Any, *, argument: str = "dtype") -> DataType:
    """Convert any framework's dtype to ``DataType``: a numpy dtype or scalar type (CuPy's are
    numpy's), ``ml_dtypes.bfloat16``, a JAX dtype (``jnp.bfloat16``), a ``torch.dtype``
    (``torch.float16``), a name (``"float16"``, ``"half"``, ``"torch.bfloat16"``) or a
    ``DataType``.

    Plain ints are ``DataType`` values. ``None``, bools and members of other enums are refused
    (``ActivationMode.RELU`` is the int 1, but not a dtype).

    Raises
    ------
    TypeError
        If *dtype* names no type cuDNN tensors support; the message names *argument*.
    """
    if isinstance(dtype, DataType):
        return dtype
    if dtype is None or isinstance(dtype, bool | enum.Enum):
        # np.dtype(None) is float64 and a member of another enum is an int: neither names a
        # dtype, so neither may silently become DOUBLE
        raise TypeError(
            f"{argument}={dtype!r} is not a dtype; expected one of {', '.join(_BY_NAME)} (a numpy, "
            "torch, CuPy, JAX or ml_dtypes dtype, its name, or a pycudnn.enums.DataType member)"
        )
    if isinstance(dtype, int):
        try:
            return DataType(dtype)
        except ValueError:
            pass
    name = _dtype_name(dtype)
    if name is not None and name.startswith("torch."):
        name = name[len("torch.") :]
    row = _BY_NAME.get(name) if name is not None else None
    if row is not None:
        return row.data_type
    if name is not None and "byte-swapped" in name:
        raise TypeError(
            f"{argument}={dtype!r} is byte-swapped; cuDNN reads "
            "data in this machine's byte order: convert it first (a.astype(a.dtype.newbyteorder"
            "('=')))"
        )
    raise TypeError(
        f"{argument}={dtype!r} is not a dtype cuDNN supports here; expected one of "
        f"{', '.join(_BY_NAME)} (a numpy, torch, CuPy, JAX or ml_dtypes dtype, its name, or "
        "pycudnn.enums.DataType)"
    )


def dtype_info(data_type: DataType) -> DType:
    """The table row of *data_type*; ``TypeError`` for a type without one (FP8, INT4...)."""
    row = DTYPES.get(data_type)
    if row is None:
        raise TypeError(f"{DataType(data_type).name} has no entry in pycudnn's dtype table")
    return row


def dtype_name(data_type: DataType) -> str:
    """numpy's name of *data_type* (``"float32"``), or the enum name for other types."""
    row = DTYPES.get(data_type)
    return row.name if row is not None else DataType(data_type).name


def numpy_dtype(data_type: DataType) -> np.dtype:
    """The numpy dtype for *data_type* (bfloat16 needs the ``ml_dtypes`` package)."""
    name = dtype_info(DataType(data_type)).name
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError as exc:  # pragma: no cover - ml_dtypes is in the [test] extra
            raise TypeError("bfloat16 on the host needs `pip install ml_dtypes`") from exc
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def itemsize(data_type: DataType) -> int:
    """Bytes per element of *data_type*."""
    return dtype_info(DataType(data_type)).itemsize


def scaling_ctype(data_type: DataType) -> type[ctypes.c_float] | type[ctypes.c_double]:
    """ctypes type of ``alpha``/``beta`` for data of *data_type*: double for DOUBLE, else float."""
    return _D if data_type == DataType.DOUBLE else _F


def scaling_type(compute_type: int) -> BackendAttributeType:
    """The backend attribute type of an operation's scaling factors for math in
    *compute_type*: double only for double compute, as :func:`scaling_ctype`."""
    return (
        BackendAttributeType.DOUBLE
        if compute_type == DataType.DOUBLE
        else BackendAttributeType.FLOAT
    )


def from_dlpack_code(code: int, bits: int) -> DType | None:
    """The row of a DLPack ``(code, bits)`` type, or None when cuDNN has no such type."""
    return _BY_DLPACK.get((code, bits))
