"""Checks shared by the array constructors and the interop readers (internal).

Argument checks (shapes, device ordinals, dtypes, the limits of a view anything foreign may
describe) and the pointer checks :func:`check_device_pointer` and :func:`check_alignment`
(documented as ``pycudnn.memory.check_device_pointer`` / ``check_alignment``). Nothing here
builds a :class:`~pycudnn.memory.DeviceArray`: :mod:`.array` and :mod:`._protocols` both import
this module, and :mod:`.interop` imports all three, so the memory package has no import cycle.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from .. import _cuda, _types
from .._cuda import current_device, error_name, require_gpu
from ..errors import CudaUnavailableError, NotDeviceMemoryError


# -- argument helpers ------------------------------------------------------------------------------
def dimension(value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError("a bool is not a dimension")
    return operator.index(value)


def as_shape(shape: Any) -> tuple[int, ...]:
    """*shape* (an int or a sequence of ints) as a tuple of non-negative ints."""
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        out = tuple(int(dimension(s)) for s in shape)
    except TypeError:
        raise TypeError(f"shape must be an int or a sequence of ints, not {shape!r}") from None
    if any(s < 0 for s in out):
        raise ValueError(f"shape {out} has a negative dimension")
    return out


#: limits of a view anything foreign may describe (DLPack's int64 shapes and strides, 64-bit
#: addresses, numpy's 64 dimensions)
ADDRESS_END = 1 << 64
INT64_MAX = 2**63 - 1
MAX_NDIM = 64


def check_device(device: Any, argument: str) -> int:
    """A device ordinal: an int (not a bool) >= 0."""
    if isinstance(device, bool) or not isinstance(device, int | np.integer):
        raise TypeError(f"{argument}: device={device!r} is not a device ordinal (an int >= 0)")
    dev = int(device)
    if not 0 <= dev <= 2**31 - 1:
        raise ValueError(f"{argument}: device={dev} is not a device ordinal (an int >= 0)")
    return dev


def check_view(
    ptr: int,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    itemsize: int,
    argument: str,
    *,
    whole_elements: bool = True,
) -> None:
    """``ValueError`` unless an array view is representable: a 64-bit address (non-NULL when the
    array has elements), at most :data:`MAX_NDIM` dims, sizes and strides in int64, a byte size
    and a byte extent that do not overflow, and (if *whole_elements*) strides in whole items."""
    if not 0 <= ptr < ADDRESS_END:
        raise ValueError(f"{argument}: data pointer {ptr} is not a 64-bit address")
    if len(shape) > MAX_NDIM:
        raise ValueError(f"{argument}: {len(shape)} dimensions; at most {MAX_NDIM} are supported")
    if len(strides) != len(shape):
        raise ValueError(f"{argument}: strides {strides} do not match shape {shape}")
    size, lo, hi = 1, 0, 0
    for i, n in enumerate(shape):
        st = strides[i]
        if n < 0 or n > INT64_MAX:
            raise ValueError(f"{argument}: shape[{i}]={n} is out of range (0 to 2**63 - 1)")
        if st < -INT64_MAX or st > INT64_MAX:
            raise ValueError(f"{argument}: strides[{i}]={st} does not fit in int64")
        if whole_elements and st % itemsize:
            raise ValueError(
                f"{argument}: strides[{i}]={st} bytes is not a multiple of the item size "
                f"({itemsize} bytes)"
            )
        size *= n
        if st < 0:
            lo += st * (n - 1)
        else:
            hi += st * (n - 1)
    if size * itemsize > INT64_MAX:
        raise ValueError(
            f"{argument}: shape {shape} of {itemsize}-byte items is {size * itemsize} bytes, "
            "which overflows int64"
        )
    if not size:
        return
    if ptr == 0:
        raise ValueError(f"{argument}: NULL data pointer for an array of {size} elements")
    if ptr + lo < 0 or ptr + hi + itemsize > ADDRESS_END:
        raise ValueError(
            f"{argument}: shape {shape} with strides {strides} from 0x{ptr:x} reaches outside "
            "the 64-bit address space"
        )


def checked_dtype(dtype: Any, argument: str = "dtype") -> np.dtype:
    """Validate against cuDNN's dtype table and return the numpy dtype (bfloat16: ml_dtypes)."""
    if isinstance(dtype, np.dtype) and dtype.kind == "V" and dtype.name != "bfloat16":
        raise TypeError(
            f"{argument}={dtype!r} is an untyped void type; bfloat16 needs "
            "ml_dtypes.bfloat16 (or the string 'bfloat16')"
        )
    return _types.numpy_dtype(_types.as_data_type(dtype, argument=argument))


def is_host_array(obj: Any) -> bool:
    """numpy arrays and scalars, lists, tuples and Python numbers: data that lives on the host.

    A tuple whose type says it is device memory (a record such as ``pycudnn.jax``'s
    ``DeviceBuffer``, a ``NamedTuple`` with ``__cuda_array_interface__``) is not."""
    if isinstance(obj, np.ndarray | np.generic | int | float):
        return True
    return isinstance(obj, list | tuple) and not hasattr(type(obj), "__cuda_array_interface__")


def default_device() -> int:
    """The current device, or 0 when it cannot be asked (no GPU): for trusted views."""
    try:
        return current_device()
    except (CudaUnavailableError, RuntimeError):
        return 0


# -- pointer checks --------------------------------------------------------------------------------
_MEMTYPE_NAMES = {0: "unregistered host memory", 1: "page-locked host memory", 3: "managed memory"}


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


def host_error(obj: Any, argument: str) -> NotDeviceMemoryError:
    return NotDeviceMemoryError(
        f"{argument} is a host array ({type(obj).__module__}.{type(obj).__name__}); pycudnn "
        "works on GPU memory: copy it with pycudnn.to_device(x) first"
    )
