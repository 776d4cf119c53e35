"""Operands: any device array as the C calls see it.

Any device array -- torch tensor, CuPy/JAX array, pycudnn ``DeviceArray``, anything with
``__cuda_array_interface__`` or ``__dlpack__`` -- is read as an :class:`Operand` record (pointer,
shape, element strides, ``DataType``, device), as cheaply as its kind allows: one getter per type,
found once. Host arrays are refused with a ``TypeError`` naming ``to_device``. Hot paths read the
same five fields as a plain tuple (:func:`raw_operand`, or straight from a torch tensor through
:data:`FAST_T`): building a named record costs more than the rest of a cache hit's reading.

:func:`key_of` turns an operand into the part of a call key that validation depends on, so a
cached call entry can skip validation.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, NamedTuple

from .. import _layout, memory
from .._types import as_data_type, itemsize
from ..enums import DataType
from ..errors import NotDeviceMemoryError

__all__ = [
    "FAST_T",
    "Operand",
    "data_type",
    "key_of",
    "operand",
    "producer_stream",
    "raw_operand",
    "register_operand_type",
]


class Operand(NamedTuple):
    """A device array as the C calls see it."""

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    dtype: DataType | None  # None: a dtype cuDNN has no type for
    device: int

    @property
    def nbytes_span(self) -> int:
        """Bytes from the first to one past the last addressed element."""
        if self.dtype is None:
            return 0
        return _layout.span(self.shape, self.strides) * itemsize(self.dtype)


_dtype_cache: dict[Any, DataType | None] = {}


def data_type(dtype: Any) -> DataType | None:
    """DataType of a numpy/torch/ml_dtypes dtype object (None if cuDNN has none); memoised."""
    try:
        return _dtype_cache[dtype]
    except KeyError:
        pass
    except TypeError:  # unhashable dtype-like
        return _data_type(dtype)
    dt = _dtype_cache[dtype] = _data_type(dtype)
    return dt


def _data_type(dtype: Any) -> DataType | None:
    name = str(dtype)
    if name.startswith("torch."):
        name = name[6:]
    for candidate in (name, dtype):
        try:
            return as_data_type(candidate)
        except TypeError:
            pass
    return None


# The getters return the raw form of an Operand: ``(ptr, shape, strides, DataType, device)``.
def _from_torch(t: Any) -> tuple:
    dev = t.get_device()
    if dev < 0:
        raise _not_device_memory(t, "a CPU torch tensor", "tensor.cuda()")
    return (t.data_ptr(), t.shape, t.stride(), data_type(t.dtype), dev)


def _from_cupy(a: Any) -> tuple:
    # CuPy's own attributes, as torch's (a protocol round trip costs about 20 us a call on an
    # H200 machine: bench/interop.py): the call runs on CuPy's current stream by default, as
    # it does on torch's for torch tensors (producer_stream)
    size = a.itemsize
    strides = a.strides
    for st in strides:
        if st % size:
            raise ValueError(
                f"a CuPy array with byte strides {strides} that are not whole {size}-byte "
                "elements cannot be described to cuDNN"
            )
    return (
        a.data.ptr,
        a.shape,
        tuple(st // size for st in strides),
        data_type(a.dtype),
        a.device.id,
    )


def _from_device_array(a: Any) -> tuple:
    size = a.dtype.itemsize
    return (a.ptr, a.shape, tuple(s // size for s in a.strides), data_type(a.dtype), a.device)


def _from_other(obj: Any) -> tuple:
    return _from_device_array(memory.asarray(obj))


# The error path names the argument: the getters see only the object, so the frames of the call
# are read back for the outermost pycudnn function that took it (nothing of this runs on a call
# that succeeds).
def _argument_of(obj: Any) -> tuple[str, str] | None:
    """``(function, argument)`` of the outermost pycudnn call that was passed *obj*."""
    found = None
    frame = sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module != "pycudnn" and not module.startswith("pycudnn."):
            if found is not None:
                break  # the caller's own frame: the call into pycudnn was the last match
            frame = frame.f_back
            continue
        code = frame.f_code
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        local = frame.f_locals
        for name in names:
            value = local.get(name)
            if value is obj:
                found = (code.co_qualname, name)
                break
            if type(value) in (list, tuple):
                i = next((i for i, v in enumerate(value) if v is obj), None)
                if i is not None:
                    found = (code.co_qualname, f"{name}[{i}]")
                    break
        frame = frame.f_back
    return found


def _not_device_memory(obj: Any, what: str, fix: str) -> NotDeviceMemoryError:
    where = _argument_of(obj)
    if where is None:
        return NotDeviceMemoryError(
            f"{what} was passed; pycudnn's operations need device memory: {fix} (or pass a "
            "torch/CuPy/JAX device array)"
        )
    func, arg = where
    return NotDeviceMemoryError(
        f"{func}: {arg} is {what}; pycudnn's operations need device memory: "
        f"{fix.replace('(array)', f'({arg})')} (or pass a torch/CuPy/JAX device array)"
    )


def _host_array(obj: Any) -> tuple:
    kind = f"a host {type(obj).__module__}.{type(obj).__name__}"
    raise _not_device_memory(obj, kind, "copy it with pycudnn.to_device(array)")


def _not_an_array(obj: Any) -> tuple:
    raise TypeError(
        "expected a device array (torch tensor, CuPy/JAX array, pycudnn DeviceArray), got "
        f"{type(obj).__name__}"
    )


def _named(obj: Any, exc: BaseException) -> BaseException:
    """*exc*, raised while reading *obj*, with the function and the argument that took *obj*
    in front of its message (unless it names the function already)."""
    where = _argument_of(obj)
    if where is None or str(exc).startswith(f"{where[0]}: "):
        return exc
    try:
        return type(exc)(f"{where[0]}: {where[1]}: {exc}")
    except Exception:  # an error type with other constructor arguments
        return exc


_GETTERS: dict[type, Callable[[Any], tuple]] = {}
#: ``torch.Tensor`` once one was seen: the call keys then read tensors without a record
FAST_T: type | None = None


def _getter(tp: type) -> Callable[[Any], tuple]:
    global FAST_T
    getter = _GETTERS.get(tp)
    if getter is not None:
        return getter
    module = tp.__module__ or ""
    if module.startswith("torch") and hasattr(tp, "data_ptr") and hasattr(tp, "get_device"):
        getter = _from_torch
        if module == "torch" and tp.__name__ == "Tensor":
            FAST_T = tp
    elif issubclass(tp, memory.DeviceArray):
        getter = _from_device_array
    elif module.startswith("cupy") and tp.__name__ == "ndarray" and hasattr(tp, "data"):
        getter = _from_cupy
    elif module.startswith("numpy"):
        getter = _host_array
    elif tp in (int, float, complex, bool, str, bytes, list, tuple, type(None)):
        getter = _not_an_array
    else:
        getter = _from_other
    _GETTERS[tp] = getter
    return getter


def register_operand_type(tp: type, getter: Callable[[Any], tuple]) -> None:
    """Teach the high-level layer a device-array type: *getter(obj)* returns ``(ptr, shape,
    element_strides, DataType, device)``. Used by tests (fake arrays) and for fast paths."""
    _GETTERS[tp] = getter


def raw_operand(obj: Any) -> tuple:
    """*obj*'s :class:`Operand` fields as a plain tuple (for hot paths). An object that is no
    device array, or one that misreports itself, raises a ``TypeError``/``ValueError`` naming
    the function and the argument that took it (found on the error path only)."""
    try:
        return (_GETTERS.get(type(obj)) or _getter(type(obj)))(obj)
    except (TypeError, ValueError) as exc:
        raise _named(obj, exc) from None


def operand(obj: Any) -> Operand:
    """*obj* as an :class:`Operand` (raises ``TypeError`` for host data and non-arrays)."""
    ptr, shape, strides, dt, device = raw_operand(obj)
    return Operand(ptr, tuple(shape), tuple(strides), dt, device)


def key_of(obj: Any) -> tuple[int, tuple]:
    """``(ptr, key)`` of a device array: *key* pins what validation depends on (shape,
    strides, dtype, device, address residue mod 16)."""
    if type(obj) is FAST_T:
        p = obj.data_ptr()
        return p, (obj.shape, obj.stride(), obj.dtype, obj.get_device(), p & 15)
    g = raw_operand(obj)
    p = g[0]
    return p, (g[1], g[2], g[3], g[4], p & 15)


# -- the producer's stream ------------------------------------------------------------------------
#: by array type: a reader of the framework's current stream on the array's device, or None
_STREAMS: dict[type, Callable[[Any], int | None] | None] = {}


def producer_stream(obj: Any) -> int | None:
    """The current stream of *obj*'s framework on *obj*'s device -- torch's for a CUDA tensor,
    CuPy's for a CuPy array -- as a ``cudaStream_t`` int, or None for other arrays (pycudnn's
    ``DeviceArray``, JAX's: the call then keeps the handle's stream).

    The high-level functions call it when ``stream=`` is not given, so a call on torch tensors
    inside ``with torch.cuda.stream(s):`` runs on ``s``, as torch's own operations do. It reads
    torch's stream through torch's fast accessor (no ``torch.cuda.current_stream()`` object) and
    imports nothing: a type is only asked about when an object of it was passed."""
    tp = type(obj)
    try:
        reader = _STREAMS[tp]
    except KeyError:
        reader = _STREAMS[tp] = _stream_reader(tp)
    return None if reader is None else reader(obj)


def _stream_reader(tp: type) -> Callable[[Any], int | None] | None:
    module = tp.__module__ or ""
    if module.startswith("torch") and hasattr(tp, "get_device"):
        torch_c = getattr(sys.modules.get("torch"), "_C", None)
        raw = getattr(torch_c, "_cuda_getCurrentRawStream", None)
        if raw is None:  # a torch without CUDA: its tensors are refused as host data anyway
            return None

        def torch_stream(t: Any) -> int | None:
            d = t.get_device()
            return raw(d) if d >= 0 else None

        return torch_stream
    if module.startswith("cupy"):
        cuda = getattr(sys.modules.get("cupy"), "cuda", None)
        current = getattr(cuda, "get_current_stream", None)
        if current is None:
            return None

        def cupy_stream(a: Any) -> int:
            return current(a.device.id).ptr

        return cupy_stream
    return None
