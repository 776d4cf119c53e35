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
from .array import DeviceArray, as_shape, checked_dtype, default_device, is_host_array

__all__ = ["asarray", "check_alignment", "check_device_pointer"]

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


def _cai_dtype(typestr: str, argument: str) -> np.dtype:
    try:
        dt = np.dtype(typestr)
    except TypeError:
        raise TypeError(f"{argument}: unknown typestr {typestr!r}") from None
    if dt.kind == "V":
        raise TypeError(
            f"{argument}: typestr {typestr!r} is an untyped {dt.itemsize}-byte type; "
            "__cuda_array_interface__ cannot say bfloat16 - pass the array through DLPack "
            "(its __dlpack__) instead"
        )
    if dt.byteorder == ">":
        raise TypeError(f"{argument}: big-endian data ({typestr!r}) is not supported")
    return checked_dtype(dt, argument=f"{argument}.dtype")


def _from_cai(
    obj: Any,
    cai: dict[str, Any],
    sid: int,
    device: int | None,
    check: bool,
    allow_managed: bool,
    argument: str,
) -> DeviceArray:
    version = int(cai.get("version", 0))
    if version < 2:
        raise TypeError(f"{argument}: __cuda_array_interface__ version {version} is too old (< 2)")
    if cai.get("mask") is not None:
        raise NotImplementedError(f"{argument}: masked __cuda_array_interface__ arrays")
    shape = as_shape(cai["shape"])
    dt = _cai_dtype(cai["typestr"], argument)
    ptr, readonly = cai["data"]
    ptr = int(ptr or 0)
    raw_strides = cai.get("strides")
    strides = (
        packed_strides(shape, itemsize=dt.itemsize)
        if raw_strides is None
        else tuple(int(s) for s in raw_strides)
    )
    if len(strides) != len(shape):
        raise ValueError(f"{argument}: strides {strides} do not match shape {shape}")
    size = math.prod(shape)
    dl = _dlpack.device_of(obj) if check and size else None
    if dl is not None and dl[0] == _dlpack.KDL_CUDA:
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
    producer = cai.get("stream") if version >= 3 else None
    if producer is not None:
        producer = int(producer)
        if producer == 0:
            raise ValueError(
                f"{argument}: __cuda_array_interface__ stream 0 is not allowed (v3: use 1 for "
                "the legacy default stream, 2 for per-thread)"
            )
        if size:
            stream_wait(sid, producer, dev)
    return DeviceArray(ptr, shape, dt, strides, dev, sid, obj, bool(readonly))


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
