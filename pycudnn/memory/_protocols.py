"""Reading foreign device arrays: ``__cuda_array_interface__`` (v2/v3) and DLPack (internal).

:func:`view_of` turns a producer (torch, CuPy, JAX, Numba, a bare DLPack capsule) into the fields
of a :class:`~pycudnn.memory.DeviceArray` (a :class:`View`), after validating every field it
says (:func:`parse_cai`, :func:`pycudnn.memory._dlpack.from_dlpack`) and ordering its pending
work before the consumer's stream. It builds no array itself: :mod:`.array` (``copy_``,
``to_device``) and :mod:`.interop` (``asarray``) make the ``DeviceArray(*view)``, so this
module sits below both and the memory package has no import cycle.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from .._cuda import coerce_stream, stream_wait
from .._layout import packed_strides
from ..errors import NotDeviceMemoryError
from . import _dlpack
from ._checks import (
    ADDRESS_END,
    INT64_MAX,
    MAX_NDIM,
    check_device_pointer,
    check_view,
    checked_dtype,
    default_device,
    host_error,
    is_host_array,
)

__all__ = ["View", "parse_cai", "view_of"]


class View(NamedTuple):
    """The fields of a ``DeviceArray`` over foreign memory, in its constructor's order."""

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype
    strides: tuple[int, ...]
    device: int
    stream: int
    base: Any
    readonly: bool = False
    dl_device_type: int = _dlpack.KDL_CUDA


def view_of(
    obj: Any,
    stream: Any,
    device: int | None,
    check: bool,
    allow_managed: bool,
    argument: str,
) -> View:
    """The fields of a zero-copy view of *obj* (not a ``DeviceArray``: see ``asarray``).

    *device*, when given, is an already checked ordinal the view must be on. Raises as
    :func:`pycudnn.memory.asarray` documents.
    """
    if is_host_array(obj):
        raise host_error(obj, argument)
    sid = coerce_stream(stream)
    has_dlpack = hasattr(obj, "__dlpack__")
    if type(obj).__name__ == "PyCapsule":  # a bare DLPack capsule (torch.utils.dlpack.to_dlpack)
        return _from_dlpack(obj, sid, device, allow_managed, argument)
    cai_error: BaseException | None = None
    cai = None
    # torch labels bfloat16 '<f2' in its __cuda_array_interface__ (and others use '<V2'): for
    # bfloat16 only DLPack says the truth, so take that road whenever the object says bfloat16
    if not (has_dlpack and "bfloat16" in str(getattr(obj, "dtype", ""))):
        try:
            cai = obj.__cuda_array_interface__
        except AttributeError as exc:
            cai_error = exc if hasattr(type(obj), "__cuda_array_interface__") else None
        except Exception as exc:  # torch refuses tensors that require grad
            cai_error = exc
    if cai is not None:
        try:
            return _from_cai(obj, cai, sid, device, check, allow_managed, argument)
        except TypeError:
            if not has_dlpack:
                raise
            # an untyped CAI typestr ('<V2'): let DLPack say what the elements are
    if has_dlpack:
        return _from_dlpack(obj, sid, device, allow_managed, argument)
    if cai_error is not None:
        raise cai_error
    if hasattr(obj, "__array_interface__") or hasattr(obj, "__array__"):
        raise host_error(obj, argument)
    raise TypeError(
        f"{argument}: cannot view {type(obj).__name__} as a device array; pass a pycudnn "
        "DeviceArray or an object with __cuda_array_interface__ or __dlpack__ (torch, CuPy, JAX), "
        "or copy host data with pycudnn.to_device()"
    )


_CAI_DTYPES: dict[str, np.dtype] = {}  # typestr -> checked dtype (only accepted ones)


def _cai_dtype(typestr: Any, argument: str) -> np.dtype:
    if type(typestr) is str:
        dt = _CAI_DTYPES.get(typestr)
        if dt is not None:
            return dt
    if not isinstance(typestr, str):
        raise TypeError(
            f"{argument}: __cuda_array_interface__['typestr'] must be a str (like '<f4'), got "
            f"{_short(typestr)}"
        )
    try:
        dt = np.dtype(typestr)
    except (TypeError, ValueError):
        raise TypeError(f"{argument}: unknown typestr {typestr!r}") from None
    if dt.kind == "V":
        raise TypeError(
            f"{argument}: typestr {typestr!r} is an untyped {dt.itemsize}-byte type; "
            "__cuda_array_interface__ cannot say bfloat16 - pass the array through DLPack "
            "(its __dlpack__) instead"
        )
    if dt.byteorder == ">":
        raise TypeError(f"{argument}: big-endian data ({typestr!r}) is not supported")
    dt = checked_dtype(dt, argument=f"{argument}.dtype")
    if len(_CAI_DTYPES) < 64:
        _CAI_DTYPES[typestr] = dt
    return dt


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _cai_int(value: Any, field: str, argument: str, lo: int, hi: int) -> int:
    """An int field of a ``__cuda_array_interface__`` (Python or numpy int; never a bool, float
    or string), in [lo, hi]."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise TypeError(
            f"{argument}: __cuda_array_interface__ {field} must be an int, got {_short(value)}"
        )
    v = int(value)
    if not lo <= v <= hi:
        raise ValueError(
            f"{argument}: __cuda_array_interface__ {field}={v} is out of range ({lo} to {hi})"
        )
    return v


def _cai_ints(value: Any, field: str, argument: str, lo: int, hi: int) -> tuple[int, ...]:
    if type(value) is tuple and len(value) <= MAX_NDIM:
        for v in value:  # the common case: a tuple of Python ints in range
            if type(v) is not int or v < lo or v > hi:
                break
        else:
            return value
    if not isinstance(value, tuple | list):
        raise TypeError(
            f"{argument}: __cuda_array_interface__['{field}'] must be a tuple of ints, got "
            f"{_short(value)}"
        )
    if len(value) > MAX_NDIM:
        raise ValueError(
            f"{argument}: __cuda_array_interface__['{field}'] has {len(value)} entries; at most "
            f"{MAX_NDIM} dimensions are supported"
        )
    return tuple(_cai_int(v, f"{field}[{i}]", argument, lo, hi) for i, v in enumerate(value))


def parse_cai(cai: Any, argument: str = "array") -> tuple:
    """Validate a ``__cuda_array_interface__`` dict from an untrusted producer.

    Returns
    -------
    tuple
        ``(version, shape, dtype, ptr, readonly, strides_bytes, stream)``: *stream* is None
        when absent (or version 2).

    Raises
    ------
    TypeError
        A field of the wrong kind (``typestr=None``, a float stride, ``readonly='False'``, a
        list instead of a dict...), a missing field, or an unsupported dtype.
    ValueError
        A value out of range: version other than 2 or 3 (1 or less: too old), a negative size,
        a data pointer outside 64 bits or NULL for a non-empty array, strides that are not whole
        items or do not match the shape, a byte size or extent that overflows, stream 0.
    NotImplementedError
        A mask.
    """
    if not isinstance(cai, dict):
        raise TypeError(
            f"{argument}: __cuda_array_interface__ must be a dict, got {type(cai).__name__}"
        )
    for key in ("shape", "typestr", "data", "version"):
        if key not in cai:
            raise TypeError(f"{argument}: __cuda_array_interface__ has no {key!r} entry")
    version = cai["version"]
    if type(version) is not int and (
        isinstance(version, bool) or not isinstance(version, int | np.integer)
    ):
        raise TypeError(
            f"{argument}: __cuda_array_interface__['version'] must be an int, got {_short(version)}"
        )
    version = int(version)
    if version < 2:
        raise TypeError(f"{argument}: __cuda_array_interface__ version {version} is too old (< 2)")
    if version > 3:
        raise ValueError(
            f"{argument}: __cuda_array_interface__ version {version} is not supported (this "
            "reader knows versions 2 and 3)"
        )
    if cai.get("mask") is not None:
        raise NotImplementedError(f"{argument}: masked __cuda_array_interface__ arrays")
    shape = _cai_ints(cai["shape"], "shape", argument, 0, INT64_MAX)
    dt = _cai_dtype(cai["typestr"], argument)
    data = cai["data"]
    if not isinstance(data, tuple | list) or len(data) != 2:
        raise TypeError(
            f"{argument}: __cuda_array_interface__['data'] must be a (pointer, readonly) pair, "
            f"got {_short(data)}"
        )
    raw_ptr, readonly = data
    if type(raw_ptr) is int and 0 <= raw_ptr < ADDRESS_END:
        ptr = raw_ptr
    else:
        ptr = 0 if raw_ptr is None else _cai_int(raw_ptr, "data[0]", argument, 0, ADDRESS_END - 1)
    if type(readonly) is not bool and not isinstance(readonly, np.bool_):
        raise TypeError(
            f"{argument}: __cuda_array_interface__ data[1] (readonly) must be a bool, got "
            f"{_short(readonly)}"
        )
    raw_strides = cai.get("strides")
    if raw_strides is None:
        strides = packed_strides(shape, itemsize=dt.itemsize)
    else:
        strides = _cai_ints(raw_strides, "strides", argument, -INT64_MAX, INT64_MAX)
    if len(strides) != len(shape):
        raise ValueError(f"{argument}: strides {strides} do not match shape {shape}")
    check_view(ptr, shape, strides, dt.itemsize, argument)
    stream = cai.get("stream") if version >= 3 else None
    if stream is not None:
        stream = _cai_int(stream, "stream", argument, 0, ADDRESS_END - 1)
        if stream == 0:
            raise ValueError(
                f"{argument}: __cuda_array_interface__ stream 0 is not allowed (v3: use 1 for "
                "the legacy default stream, 2 for per-thread)"
            )
    return version, shape, dt, ptr, bool(readonly), strides, stream


def _from_cai(
    obj: Any,
    cai: Any,
    sid: int,
    device: int | None,
    check: bool,
    allow_managed: bool,
    argument: str,
) -> View:
    _version, shape, dt, ptr, readonly, strides, producer = parse_cai(cai, argument)
    size = math.prod(shape)
    dl = _dlpack.device_of(obj) if check and size else None
    if dl is not None and dl[0] == _dlpack.KDL_CUDA:
        if dl[1] < 0:
            raise ValueError(f"{argument}: __dlpack_device__() says device {dl[1]}")
        dev = dl[1]  # the producer says where it lives: no pointer query needed (torch, CuPy)
    elif dl is not None and dl[0] in (_dlpack.KDL_CPU, _dlpack.KDL_CUDA_HOST):
        raise host_error(obj, argument)
    elif check and size:
        dev = check_device_pointer(ptr, None, argument=argument, allow_managed=allow_managed)
    elif device is not None:
        dev = int(device)
    else:
        dev = default_device()
    if device is not None and dev != int(device):
        raise ValueError(f"{argument} is on device {dev}, expected device {int(device)}")
    if producer is not None and size:
        stream_wait(sid, producer, dev)
    return View(ptr, shape, dt, strides, dev, sid, obj, readonly)


def _from_dlpack(
    obj: Any, sid: int, device: int | None, allow_managed: bool, argument: str
) -> View:
    dev_type = _dlpack.device_type_of(obj)
    allowed = {_dlpack.KDL_CUDA} | ({_dlpack.KDL_CUDA_MANAGED} if allow_managed else set())
    if dev_type in (_dlpack.KDL_CPU, _dlpack.KDL_CUDA_HOST):
        raise host_error(obj, argument)
    if dev_type is not None and dev_type not in allowed:
        extra = " (pass allow_managed=True)" if dev_type == _dlpack.KDL_CUDA_MANAGED else ""
        raise NotDeviceMemoryError(
            f"{argument}: DLPack device {_dlpack.device_name(dev_type)} is not CUDA device "
            f"memory{extra}"
        )
    # a CUDA producer orders its work before our stream (1: the legacy default stream); one that
    # does not say where it lives gets no stream (CPU producers refuse any)
    cuda_like = dev_type in (_dlpack.KDL_CUDA, _dlpack.KDL_CUDA_MANAGED)
    imported = _dlpack.from_dlpack(obj, stream=(sid or 1) if cuda_like else None)
    claimed = _dlpack.device_of(obj) if dev_type is not None else None
    if claimed is not None and claimed != (imported.device_type, imported.device_id):
        got = (_dlpack.device_name(imported.device_type), imported.device_id)
        raise ValueError(
            f"{argument}: __dlpack_device__() says {(_dlpack.device_name(claimed[0]), claimed[1])}"
            f" but its capsule holds a tensor on {got}: the producer contradicts itself"
        )
    if imported.device_type in (_dlpack.KDL_CPU, _dlpack.KDL_CUDA_HOST):
        raise host_error(obj, argument)
    if imported.device_type not in allowed:
        raise NotDeviceMemoryError(
            f"{argument}: DLPack device {_dlpack.device_name(imported.device_type)} is not CUDA "
            "device memory"
        )
    dt = checked_dtype(imported.dtype, argument=f"{argument}.dtype")
    dev = imported.device_id
    if device is not None and dev != int(device):
        raise ValueError(f"{argument} is on device {dev}, expected device {int(device)}")
    shape = imported.shape
    strides = (
        imported.strides
        if imported.strides is not None
        else packed_strides(shape, itemsize=dt.itemsize)
    )
    base = (obj, imported.owner)  # the producer object and its deleter guard
    return View(
        imported.data,
        shape,
        dt,
        strides,
        dev,
        sid,
        base,
        imported.read_only,
        imported.device_type,
    )
