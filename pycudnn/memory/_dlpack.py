"""DLPack capsules in pure ctypes: export (``__dlpack__``) and import (``from_dlpack``).

Design decisions
----------------
* Hand-written against the DLPack C ABI (``dlpack.h`` v0.8 ``DLManagedTensor`` and v1.x
  ``DLManagedTensorVersioned``) rather than borrowed from ``cuda.core``: it needs no compiled
  extension, works with every ``cuda.bindings`` version, and its parsing is tested without a GPU
  (numpy's CPU capsules and our own CUDA capsules round-trip in CI).
* **Export.** A capsule named ``"dltensor"`` (or ``"dltensor_versioned"`` when the consumer asks
  for ``max_version >= (1, 0)``) points to a ctypes struct that we allocate. Its ``manager_ctx``
  is a key into :data:`_exports`, which holds the struct, the shape/strides arrays and the
  exporting object (so the memory outlives every consumer). The ``deleter`` removes that entry.
  The capsule destructor calls the deleter only if no consumer took the capsule (a consumer
  renames it to ``"used_dltensor"``/``"used_dltensor_versioned"`` and calls the deleter itself).
* **Import.** :func:`from_dlpack` asks the producer for a versioned capsule and falls back to a
  plain one, reads device, dtype, shape, strides and byte offset, renames the capsule to mark it
  used, and returns an :class:`Imported` record whose ``owner`` calls the producer's deleter when
  garbage-collected (a ``weakref.finalize``; skipped at interpreter shutdown, when the producer
  may already be gone).
* The C callbacks are module-level ``CFUNCTYPE`` objects, alive for the life of the process.
* **Capsules are untrusted.** Import checks everything it reads before reading further or
  taking ownership: ``ndim`` (0 to :data:`MAX_NDIM`, so a lying count cannot walk far past the
  shape array), a non-NULL shape array, sizes >= 0, a byte size and extent that fit in int64 and
  64-bit addresses, ``data + byte_offset`` below 2**64, non-NULL data for a non-empty tensor, a
  device id >= 0 -- a ``BufferError`` naming the field and value (a dtype cuDNN lacks stays a
  ``TypeError``). Export refuses what DLPack cannot represent (sizes or strides beyond int64,
  addresses beyond 64 bits, more than :data:`MAX_NDIM` dims) instead of letting ctypes wrap
  them.
* **dtypes** map through pycudnn's one dtype table (:data:`pycudnn._types.DTYPES`, each row's
  DLPack type code): exactly the types cuDNN takes travel, anything else is refused here.
"""

from __future__ import annotations

import ctypes
import itertools
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _types

__all__ = [
    "DLPACK_MAX_VERSION",
    "KDL_CPU",
    "KDL_CUDA",
    "KDL_CUDA_HOST",
    "KDL_CUDA_MANAGED",
    "MAX_NDIM",
    "Imported",
    "dtype_from_dl",
    "dtype_to_dl",
    "device_name",
    "device_of",
    "device_type_of",
    "export",
    "from_dlpack",
    "live_exports",
]

# DLDeviceType
KDL_CPU = 1
KDL_CUDA = 2
KDL_CUDA_HOST = 3
KDL_CUDA_MANAGED = 13
_DEVICE_NAMES = {
    1: "kDLCPU",
    2: "kDLCUDA",
    3: "kDLCUDAHost",
    4: "kDLOpenCL",
    7: "kDLVulkan",
    8: "kDLMetal",
    10: "kDLROCM",
    11: "kDLROCMHost",
    13: "kDLCUDAManaged",
    14: "kDLOneAPI",
}

DLPACK_MAX_VERSION = (1, 0)
#: most dimensions a capsule may have, either way (numpy's limit)
MAX_NDIM = 64
_INT64_MAX = 2**63 - 1
_ADDRESS_END = 1 << 64
_FLAG_READ_ONLY = 1 << 0
_FLAG_IS_COPIED = 1 << 1


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", _Deleter),
    ]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", _Deleter),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


# -- dtypes ------------------------------------------------------------------------------------
# The mapping is the dtype table's (pycudnn._types.DTYPES: each row's DLPack type code and size);
# these names only word the error for a type outside it
_CODE_NAMES = {0: "int", 1: "uint", 2: "float", 3: "opaque", 4: "bfloat", 5: "complex", 6: "bool"}


def dtype_to_dl(dtype: np.dtype) -> tuple[int, int]:
    """``(code, bits)`` of a numpy dtype cuDNN supports (bfloat16 from ``ml_dtypes``)."""
    try:
        row = _types.dtype_info(_types.as_data_type(np.dtype(dtype)))
    except TypeError:
        raise BufferError(f"dtype {dtype} has no DLPack equivalent here") from None
    return row.dlpack_code, row.itemsize * 8


def dtype_from_dl(code: int, bits: int, lanes: int) -> np.dtype:
    """The numpy dtype of a DLPack ``DLDataType`` (bfloat16 needs ``ml_dtypes``)."""
    if lanes != 1:
        raise TypeError(f"DLPack dtype with {lanes} lanes (vector types) is not supported")
    row = _types.from_dlpack_code(code, bits)
    if row is None:
        kind = _CODE_NAMES.get(code, "code")
        supported = ", ".join(r.name for r in _types.DTYPES.values())
        raise TypeError(
            f"DLPack dtype {kind}{bits} (code={code}, bits={bits}) is not a dtype cuDNN supports "
            f"here; expected one of {supported}"
        )
    return _types.numpy_dtype(row.data_type)


# -- Python C-API through ctypes ---------------------------------------------------------------
# Our own function objects, prototypes fixed here: ``ctypes.pythonapi.X`` is one object per
# process, whose ``argtypes`` any library may set (``jax.ffi.pycapsule`` sets PyCapsule_New's
# third argument to a CFUNCTYPE, which made every export here raise ctypes.ArgumentError).
def _c_api(name: str, restype: Any, *argtypes: Any) -> Any:
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))


_PyCapsule_New = _c_api("PyCapsule_New", ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p,
                        ctypes.c_void_p)  # fmt: skip
# capsules are passed as raw addresses: the destructor runs while the capsule is being freed, so
# no py_object (which would touch its reference count) may be made from it there.
_PyCapsule_IsValid = _c_api("PyCapsule_IsValid", ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)
_PyCapsule_GetPointer = _c_api(
    "PyCapsule_GetPointer", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p
)
_PyCapsule_SetName = _c_api("PyCapsule_SetName", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)
_PyCapsule_GetName = _c_api("PyCapsule_GetName", ctypes.c_char_p, ctypes.py_object)
_Py_IncRef = _c_api("Py_IncRef", None, ctypes.py_object)

# capsule names must outlive every capsule: module-level bytes objects are never freed
_NAME = b"dltensor"
_USED_NAME = b"used_dltensor"
_NAME_V = b"dltensor_versioned"
_USED_NAME_V = b"used_dltensor_versioned"


# -- export ------------------------------------------------------------------------------------
_exports: dict[int, tuple[Any, ...]] = {}  # manager_ctx key -> (struct, shape, strides, owner)
# re-entrant: a consumer's deleter (which removes an entry) may run from a garbage collection
# triggered while this thread is adding one
_exports_lock = threading.RLock()
_keys = itertools.count(1)


def _release(key: int) -> None:
    with _exports_lock:
        _exports.pop(key, None)


def _release_managed(struct: Any, managed: int) -> None:  # pragma: no cover - via consumers
    """A consumer's deleter: forget the export behind the *struct* at address *managed*."""
    try:
        _release(struct.from_address(managed).manager_ctx)
    except Exception:
        pass


@_Deleter
def _deleter(managed: int) -> None:  # pragma: no cover - exercised through consumers
    _release_managed(DLManagedTensor, managed)


@_Deleter
def _deleter_versioned(managed: int) -> None:  # pragma: no cover - exercised through consumers
    _release_managed(DLManagedTensorVersioned, managed)


_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@_CapsuleDestructor
def _capsule_destructor(capsule: int) -> None:  # pragma: no cover - exercised through GC
    try:
        if _PyCapsule_IsValid(capsule, _NAME):  # nobody consumed it: we release it
            _deleter(_PyCapsule_GetPointer(capsule, _NAME))
        elif _PyCapsule_IsValid(capsule, _NAME_V):
            _deleter_versioned(_PyCapsule_GetPointer(capsule, _NAME_V))
    except Exception:
        pass


# The C callbacks must outlive every consumer, including consumers freed while the interpreter
# shuts down (after this module's globals are cleared): give each an extra, never-released
# reference so its thunk is never freed.
for _callback in (_deleter, _deleter_versioned, _capsule_destructor):
    _Py_IncRef(_callback)
del _callback


def export(
    owner: Any,
    data: int,
    shape: tuple[int, ...],
    strides_bytes: tuple[int, ...] | None,
    dtype: np.dtype,
    device: tuple[int, int],
    *,
    versioned: bool = False,
    read_only: bool = False,
    copied: bool = False,
) -> Any:
    """A DLPack capsule viewing *data*; *owner* is kept alive until the consumer releases it.

    Parameters
    ----------
    strides_bytes
        Strides in bytes (numpy/CAI convention); converted to DLPack's element strides. Must be
        multiples of the item size.
    device
        ``(device_type, device_id)``.
    versioned
        Produce a ``dltensor_versioned`` capsule (DLPack >= 1.0) instead of ``dltensor``.
    """
    dtype = np.dtype(dtype)
    ndim = len(shape)
    code, bits = dtype_to_dl(dtype)
    itemsize = dtype.itemsize
    # ctypes would silently wrap what DLPack's int64/uint64/int32 fields cannot hold
    if ndim > MAX_NDIM:
        raise BufferError(f"{ndim} dimensions: DLPack export supports at most {MAX_NDIM}")
    for i, n in enumerate(shape):
        if not 0 <= n <= _INT64_MAX:
            raise BufferError(f"shape[{i}]={n} does not fit in DLPack's int64 shape")
    if not 0 <= int(data or 0) < _ADDRESS_END:
        raise BufferError(f"data pointer {data} does not fit in 64 bits")
    for i, d in enumerate(device):
        if not -(2**31) <= d <= 2**31 - 1:
            raise BufferError(f"device[{i}]={d} does not fit in DLPack's int32 device fields")
    shape_arr = (ctypes.c_int64 * max(ndim, 1))(*shape)
    strides_arr = None
    if strides_bytes is not None:
        if any(s % itemsize for s in strides_bytes):
            raise BufferError(
                f"strides {strides_bytes} are not multiples of the item size {itemsize}: "
                "DLPack cannot express them"
            )
        elements = tuple(s // itemsize for s in strides_bytes)
        for i, st in enumerate(elements):
            if not -_INT64_MAX <= st <= _INT64_MAX:
                raise BufferError(f"strides[{i}]={st} elements does not fit in DLPack's int64")
        strides_arr = (ctypes.c_int64 * max(ndim, 1))(*elements)
    # and nothing the import side would refuse (an extent past 64 bits, NULL data with elements)
    _check_imported(
        tuple(shape),
        None if strides_bytes is None else tuple(strides_bytes),
        int(data or 0),
        0,
        itemsize,
        max(device[1], 0),
    )
    if versioned:
        managed: Any = DLManagedTensorVersioned()
        managed.version = DLPackVersion(*DLPACK_MAX_VERSION)
        managed.flags = (_FLAG_READ_ONLY if read_only else 0) | (_FLAG_IS_COPIED if copied else 0)
        name = _NAME_V
    else:
        managed = DLManagedTensor()
        name = _NAME
    t = managed.dl_tensor
    t.data = data or None
    t.device = DLDevice(*device)
    t.ndim = ndim
    t.dtype = DLDataType(code, bits, 1)
    t.shape = ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64))
    t.strides = (
        ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64))
        if strides_arr is not None
        else ctypes.POINTER(ctypes.c_int64)()
    )
    t.byte_offset = 0
    key = next(_keys)
    managed.manager_ctx = key
    managed.deleter = _deleter_versioned if versioned else _deleter
    address = ctypes.addressof(managed)
    with _exports_lock:
        _exports[key] = (managed, shape_arr, strides_arr, owner)
    try:
        return _PyCapsule_New(address, name, ctypes.cast(_capsule_destructor, ctypes.c_void_p))
    except BaseException:
        _release(key)
        raise


def live_exports() -> int:
    """How many exported capsules (or their consumers) still hold memory (for leak tests)."""
    return len(_exports)


# -- import ------------------------------------------------------------------------------------
@dataclass
class Imported:
    """What a DLPack capsule describes; ``owner`` keeps the producer's memory alive."""

    data: int
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None  # bytes; None when the producer said C-contiguous
    dtype: np.dtype
    device_type: int
    device_id: int
    read_only: bool
    owner: Any


class _ImportedOwner:
    """Calls the producer's deleter when the last view of the imported memory goes away."""

    __slots__ = ("__weakref__", "_finalizer", "capsule_name")

    def __init__(self, managed: int, deleter: int, capsule_name: str):
        self.capsule_name = capsule_name
        self._finalizer = (
            weakref.finalize(self, _call_deleter, managed, deleter) if deleter else None
        )
        if self._finalizer is not None:
            self._finalizer.atexit = False  # the producer may be torn down already


def _call_deleter(managed: int, deleter: int) -> None:
    if sys.is_finalizing():
        return
    try:
        _Deleter(deleter)(managed)
    except Exception:  # pragma: no cover - nothing to do in a finalizer
        pass


def _check_imported(
    shape: tuple[int, ...],
    strides: tuple[int, ...] | None,
    base: int,
    offset: int,
    itemsize: int,
    device_id: int,
) -> None:
    """``BufferError`` unless what a capsule says is a tensor that can exist."""
    for i, n in enumerate(shape):
        if n < 0:
            raise BufferError(f"DLPack capsule: shape[{i}]={n} is negative")
    size = 1
    for n in shape:
        size *= n
    if size * itemsize > _INT64_MAX:
        raise BufferError(
            f"DLPack capsule: shape {shape} of {itemsize}-byte items overflows int64 bytes"
        )
    if base + offset >= _ADDRESS_END:
        raise BufferError(
            f"DLPack capsule: data 0x{base:x} + byte_offset {offset} is past the 64-bit "
            "address space"
        )
    if device_id < 0:
        raise BufferError(f"DLPack capsule: device_id={device_id} is negative")
    if not size:
        return
    if base == 0:
        raise BufferError(f"DLPack capsule: NULL data for a tensor of {size} elements")
    lo = hi = 0
    if strides is not None:
        for n, st in zip(shape, strides, strict=True):
            if st < 0:
                lo += st * (n - 1)
            else:
                hi += st * (n - 1)
    else:
        hi = (size - 1) * itemsize
    if base + offset + lo < 0 or base + offset + hi + itemsize > _ADDRESS_END:
        raise BufferError(
            f"DLPack capsule: shape {shape} with strides {strides} from 0x{base + offset:x} "
            "reaches outside the 64-bit address space"
        )


def device_name(device_type: int) -> str:
    """``"kDLCUDA"`` for 2, and so on."""
    return _DEVICE_NAMES.get(device_type, f"device type {device_type}")


def device_of(obj: Any) -> tuple[int, int] | None:
    """``obj.__dlpack_device__()`` as ints, or None when absent or failing."""
    fn = getattr(obj, "__dlpack_device__", None)
    if fn is None:
        return None
    try:
        value = fn()
    except Exception:
        return None
    ok = isinstance(value, tuple | list) and len(value) == 2
    ok = ok and all(hasattr(v, "__index__") and not isinstance(v, bool) for v in value)
    if not ok:
        raise TypeError(
            f"{type(obj).__name__}.__dlpack_device__() returned {value!r:.80}; the DLPack "
            "protocol says a (device_type, device_id) pair of ints"
        )
    return int(value[0]), int(value[1])


def device_type_of(obj: Any) -> int | None:
    """The DLPack device type *obj* says it lives on (``KDL_CUDA``...), or None."""
    dl = device_of(obj)
    return None if dl is None else dl[0]


def from_dlpack(obj: Any, *, stream: int | None) -> Imported:
    """Take a DLPack capsule from *obj* (``obj.__dlpack__``) and describe its tensor.

    Parameters
    ----------
    obj
        An object with ``__dlpack__``, or a bare ``dltensor`` capsule (consumed).
    stream
        The consumer's stream, passed to ``__dlpack__(stream=...)`` so the producer orders its
        pending work before it (``None`` asks for no synchronization by the producer's rules).

    Raises
    ------
    TypeError
        If *obj* has no ``__dlpack__``, the capsule is not a DLPack tensor, or its dtype is not
        one cuDNN supports.
    BufferError
        The capsule describes an impossible tensor (see the module docstring); it is left
        unconsumed, so its producer frees it.
    """
    if type(obj).__name__ == "PyCapsule":  # a bare capsule (to_dlpack): nothing to ask
        capsule = obj
    else:
        fn = getattr(obj, "__dlpack__", None)
        if fn is None:
            raise TypeError(f"{type(obj).__name__} has no __dlpack__")
        if not callable(fn):
            raise TypeError(
                f"{type(obj).__name__}.__dlpack__ is a {type(fn).__name__}, not a method "
                "returning a DLPack capsule"
            )
        kwargs: dict[str, Any] = {} if stream is None else {"stream": stream}
        try:
            capsule = fn(max_version=DLPACK_MAX_VERSION, **kwargs)
        except TypeError:  # a pre-1.0 producer: no max_version keyword
            capsule = fn(**kwargs)
        if type(capsule).__name__ != "PyCapsule":  # PyCapsule_GetName would say "invalid"
            raise TypeError(
                f"{type(obj).__name__}.__dlpack__ returned a {type(capsule).__name__}, not a "
                "DLPack capsule"
            )
    name = _PyCapsule_GetName(capsule)
    if name == _NAME_V:
        managed_addr = _PyCapsule_GetPointer(id(capsule), _NAME_V)
        managed: Any = DLManagedTensorVersioned.from_address(managed_addr)
        if managed.version.major > DLPACK_MAX_VERSION[0]:
            raise BufferError(
                f"{type(obj).__name__}.__dlpack__ returned DLPack {managed.version.major}."
                f"{managed.version.minor}; pycudnn reads up to {DLPACK_MAX_VERSION[0]}.x"
            )
        read_only = bool(managed.flags & _FLAG_READ_ONLY)
        used = _USED_NAME_V
    elif name == _NAME:
        managed_addr = _PyCapsule_GetPointer(id(capsule), _NAME)
        managed = DLManagedTensor.from_address(managed_addr)
        read_only = False
        used = _USED_NAME
    else:
        raise TypeError(
            f"{type(obj).__name__}.__dlpack__ returned a capsule named {name!r}, not a DLPack "
            "tensor (it may have been consumed already)"
        )
    t = managed.dl_tensor
    ndim = int(t.ndim)
    if not 0 <= ndim <= MAX_NDIM:
        raise BufferError(f"DLPack capsule: ndim={ndim} is out of range (0 to {MAX_NDIM})")
    if ndim and not t.shape:
        raise BufferError(f"DLPack capsule: NULL shape array for ndim={ndim}")
    dtype = dtype_from_dl(t.dtype.code, t.dtype.bits, t.dtype.lanes)
    shape = tuple(int(t.shape[i]) for i in range(ndim))
    strides = None
    if t.strides and ndim:
        strides = tuple(int(t.strides[i]) * dtype.itemsize for i in range(ndim))
    base, offset = int(t.data or 0), int(t.byte_offset)
    data = base + offset
    _check_imported(shape, strides, base, offset, dtype.itemsize, int(t.device.device_id))
    deleter = ctypes.cast(managed.deleter, ctypes.c_void_p).value or 0
    # from here on we own the managed tensor: mark the capsule used, arm the deleter
    _PyCapsule_SetName(capsule, used)
    owner = _ImportedOwner(managed_addr, deleter, name.decode())
    return Imported(
        data=data,
        shape=shape,
        strides=strides,
        dtype=dtype,
        device_type=int(t.device.device_type),
        device_id=int(t.device.device_id),
        read_only=read_only,
        owner=owner,
    )
