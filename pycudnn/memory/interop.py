"""Zero-copy interop and pointer checks: ``asarray`` over ``__cuda_array_interface__`` and DLPack
producers, ``check_device_pointer``, ``check_alignment``.

Design decisions
----------------
* **By protocol, not by type.** :func:`asarray` views anything with
  ``__cuda_array_interface__`` (v2/v3) or ``__dlpack__`` (torch, CuPy, JAX, Numba...) without a
  copy and keeps the producer (or its DLPack deleter) alive. ``__cuda_array_interface__`` is tried
  first (no capsule to build); DLPack is used when it is absent or refuses, and whenever the
  object says bfloat16 (torch labels it ``'<f2'`` in its ``__cuda_array_interface__``).
* **Streams as the protocols say.** The producer's pending work is ordered before the consumer's
  stream: CAI v3's ``stream`` (an event, no host sync), ``__dlpack__(stream=...)``.
* **Host data is refused**, with a :class:`~pycudnn.errors.NotDeviceMemoryError` (a
  ``TypeError`` and a ``ValueError``) that names :func:`~pycudnn.memory.to_device`: copies are
  explicit.
* **Foreign objects are untrusted.** Every ``__cuda_array_interface__`` field is type-, range-
  and overflow-checked before anything is built from it (:func:`parse_cai`: a dict; ``version`` 2
  or 3; ``shape`` a tuple of ints in int64; ``typestr`` a string; ``data`` an ``(int, bool)``
  pair with a 64-bit, non-NULL-when-non-empty address; ``strides`` None or ints, whole items;
  ``stream`` None or a positive int; a byte size and extent that do not overflow), and the same
  for DLPack capsules (:func:`pycudnn.memory._dlpack.from_dlpack`). Each error names the field
  and its value: ``TypeError`` for a wrong kind, ``ValueError`` for a wrong value, ``BufferError``
  for a capsule that lies. This holds with ``check=False`` too: that flag only skips asking CUDA
  where the pointer lives.
* **Checks before C.** :func:`check_device_pointer` asks ``cudaPointerGetAttributes`` where a
  pointer lives (host, unregistered and, unless allowed, managed memory are refused; a pointer on
  another device than the handle is refused). :func:`asarray` runs it once when it wraps a
  ``__cuda_array_interface__`` object that does not say its device (that protocol carries none),
  so a ``DeviceArray`` needs no query per call.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import _cuda
from .._cuda import coerce_stream, error_name, require_gpu, stream_wait
from .._layout import packed_strides
from ..errors import NotDeviceMemoryError
from . import _dlpack
from .array import (
    ADDRESS_END,
    INT64_MAX,
    MAX_NDIM,
    DeviceArray,
    check_device,
    check_view,
    checked_dtype,
    default_device,
    is_host_array,
)

__all__ = ["asarray", "check_alignment", "check_device_pointer", "parse_cai"]

_MEMTYPE_NAMES = {0: "unregistered host memory", 1: "page-locked host memory", 3: "managed memory"}


# -- pointer checks ------------------------------------------------------------------------------
def check_alignment(ptr: int, alignment: int, *, argument: str = "ptr") -> None:
    """Raise ``ValueError`` unless *ptr* is a multiple of *alignment* bytes."""
    if alignment > 1 and int(ptr) % alignment:
        raise ValueError(
            f"{argument}: device pointer 0x{int(ptr):x} is not aligned to {alignment} bytes "
            "(cuDNN needs at least the element size); copy it into a fresh array"
        )


def check_device_pointer(
    ptr: int, device: int | None = None, *, argument: str = "ptr", allow_managed: bool = False
) -> int:
    """Check with ``cudaPointerGetAttributes`` that *ptr* is device memory; return its device.

    Parameters
    ----------
    ptr : int
        The address.
    device : int, optional
        If given, the pointer must be on this device (the handle's).
    argument : str
        The argument name used in error messages.
    allow_managed : bool
        Accept managed (unified) memory. Default False.

    Raises
    ------
    NotDeviceMemoryError
        Host memory (pageable or page-locked), a pointer CUDA does not know, or managed memory
        without *allow_managed*. A ``TypeError`` and a ``ValueError``; the message names
        *argument* and ``pycudnn.to_device``.
    ValueError
        A null pointer, or a pointer on another device than *device*.
    CudaUnavailableError
        When no GPU is usable.
    """
    ptr = int(ptr)
    if ptr == 0:
        raise ValueError(f"{argument}: null device pointer")
    require_gpu(f"checking {argument}")
    rt = _cuda.runtime()
    err, attrs = rt.cudaPointerGetAttributes(ptr)
    if int(err) != 0:  # an answer, not a failure: the pointer is none of CUDA's
        rt.cudaGetLastError()  # do not leave the error for the next caller of cudaGetLastError
        raise NotDeviceMemoryError(
            f"{argument}: 0x{ptr:x} is not memory CUDA knows ({error_name(err)}); pass device "
            "memory, or copy host data to the GPU with pycudnn.to_device()"
        )
    mtype = int(attrs.type)
    if mtype == 3 and not allow_managed:
        raise NotDeviceMemoryError(
            f"{argument}: 0x{ptr:x} is managed (unified) memory; pass allow_managed=True to use "
            "it, or copy it with pycudnn.to_device()"
        )
    if mtype not in (2, 3):
        raise NotDeviceMemoryError(
            f"{argument}: 0x{ptr:x} is {_MEMTYPE_NAMES.get(mtype, 'not device memory')}, not GPU "
            "memory; copy it to the GPU with pycudnn.to_device()"
        )
    dev = int(attrs.device)
    if device is not None and dev != int(device):
        raise ValueError(
            f"{argument} is on device {dev}, but the handle is on device {int(device)}; "
            "use the handle of that device (pycudnn.get_handle(device)) or move the data"
        )
    return dev


# -- asarray -------------------------------------------------------------------------------------
def _host_error(obj: Any, argument: str) -> NotDeviceMemoryError:
    return NotDeviceMemoryError(
        f"{argument} is a host array ({type(obj).__module__}.{type(obj).__name__}); pycudnn "
        "works on GPU memory: copy it with pycudnn.to_device(x) first"
    )


def asarray(
    obj: Any,
    *,
    stream: Any = None,
    device: int | None = None,
    check: bool = True,
    allow_managed: bool = False,
    argument: str = "array",
) -> DeviceArray:
    """View *obj* as a :class:`DeviceArray` without copying.

    Parameters
    ----------
    obj
        A ``DeviceArray`` (returned as is), or any object with ``__cuda_array_interface__`` or
        ``__dlpack__``: torch tensors, CuPy arrays, JAX arrays, Numba device arrays...
    stream : optional
        The stream the view will be used on; the producer's pending work is ordered before it
        (protocol stream / ``__dlpack__(stream=...)``). Default 0, the legacy default stream.
    device : int, optional
        Expected device: a view on another device raises ``ValueError``.
    check : bool
        Query the pointer's attributes (``__cuda_array_interface__`` carries no device): needs a
        GPU. ``check=False`` trusts the producer and takes *device* (or the current device).
    allow_managed : bool
        Accept managed (unified) memory.
    argument : str
        Name used in error messages.

    Raises
    ------
    NotDeviceMemoryError
        For host arrays (numpy, CPU tensors): a ``TypeError`` naming :func:`to_device`.
    TypeError
        For objects that expose no device-array protocol, or unsupported dtypes.
    ValueError
        For a view on another device than *device*.

    Notes
    -----
    The view keeps *obj* (or, for DLPack, the producer's deleter) alive. Writes through the view
    are visible to *obj* and the other way round.
    """
    if device is not None:
        device = check_device(device, argument)
    if isinstance(obj, DeviceArray):
        if device is not None and obj.device != int(device):
            raise ValueError(f"{argument} is on device {obj.device}, expected device {device}")
        return obj
    if is_host_array(obj):
        raise _host_error(obj, argument)
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
        raise _host_error(obj, argument)
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
) -> DeviceArray:
    _version, shape, dt, ptr, readonly, strides, producer = parse_cai(cai, argument)
    size = math.prod(shape)
    dl = _dlpack.device_of(obj) if check and size else None
    if dl is not None and dl[0] == _dlpack.KDL_CUDA:
        if dl[1] < 0:
            raise ValueError(f"{argument}: __dlpack_device__() says device {dl[1]}")
        dev = dl[1]  # the producer says where it lives: no pointer query needed (torch, CuPy)
    elif dl is not None and dl[0] in (_dlpack.KDL_CPU, _dlpack.KDL_CUDA_HOST):
        raise _host_error(obj, argument)
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
    return DeviceArray(ptr, shape, dt, strides, dev, sid, obj, readonly)


def _from_dlpack(
    obj: Any, sid: int, device: int | None, allow_managed: bool, argument: str
) -> DeviceArray:
    dev_type = _dlpack.device_type_of(obj)
    allowed = {_dlpack.KDL_CUDA} | ({_dlpack.KDL_CUDA_MANAGED} if allow_managed else set())
    if dev_type in (_dlpack.KDL_CPU, _dlpack.KDL_CUDA_HOST):
        raise _host_error(obj, argument)
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
    if imported.device_type in (_dlpack.KDL_CPU, _dlpack.KDL_CUDA_HOST):
        raise _host_error(obj, argument)
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
    return DeviceArray(
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
