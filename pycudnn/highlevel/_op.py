"""The shared op path: what every high-level function needs besides its own descriptors and call.

A high-level call goes through the same steps whatever the operation:

1. **Read the operands** (:func:`operand`): any device array -- torch tensor, CuPy/JAX array,
   pycudnn ``DeviceArray``, anything with ``__cuda_array_interface__`` or ``__dlpack__`` -- as an
   :class:`Operand` record (pointer, shape, element strides, ``DataType``, device), read as cheaply
   as its kind allows. Host arrays are refused with a ``TypeError`` naming ``to_device``. Hot
   paths read the same five fields as a plain tuple (:func:`raw_operand`, or straight from a
   torch tensor): building a named record costs more than the rest of a cache hit's reading.
2. **Key the call** (:func:`key_of`): a flat, hashable tuple of what was passed (each operand's
   shape, strides, dtype, device and address residue mod 16, the arguments as given). A per-thread
   bounded cache (:func:`calls`) maps keys to ready *call entries*; a hit skips validation, which
   the key pins.
3. **On a miss, validate before any C call**, with the helpers here (:func:`ints`,
   :func:`real`, :func:`choose`, :func:`same_dtype_and_device`, :func:`check_strides`,
   :func:`check_out`) so every error names the function, the argument, the value and what was
   expected; build descriptors (cached per layout: :func:`tensor_descriptor`); cache the entry.
4. **Run the entry** (:class:`Call`): bind the handle to ``stream=`` (no C call when unchanged),
   allocate outputs that were not given (``out=``) in the inputs' layout, refuse outputs that
   overlap inputs, stage operands whose strides the C call cannot take through packed copies
   (:class:`Stage`), then make the C call with scaling factors typed by cuDNN's rule.

An operation module is then its validation, its descriptors and its C call; see ``conv.py`` (graph
API plans) and the legacy-API operations.
"""

from __future__ import annotations

import ctypes
import numbers
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from .. import _config, _cuda, _layout, errors, memory
from .. import handle as _handle
from .._types import as_data_type, dtype_name, itemsize, numpy_dtype, scaling_ctype
from ..enums import DataType
from ..graph import _builder, _plans

__all__ = [
    "FLOATS",
    "Call",
    "GraphCall",
    "MultiOutputCall",
    "NoOp",
    "Packed",
    "Operand",
    "Stage",
    "calls",
    "channels_last",
    "check_operand",
    "check_out",
    "check_overlap",
    "check_stream",
    "check_strides",
    "choose",
    "cudnn_version",
    "dispatch",
    "empty_result",
    "handle_for",
    "ints",
    "key_of",
    "like_spec",
    "lookup",
    "on_device",
    "local",
    "operand",
    "out_operand",
    "output_spec",
    "packed_operands",
    "padded",
    "same_layout",
    "quiet",
    "raw_operand",
    "real",
    "remember",
    "register_operand_type",
    "same_dtype_and_device",
    "scales",
    "snapshot",
    "tensor_desc",
    "tensor_descriptor",
    "workspace",
]

#: the floating types cuDNN's operations compute on
FLOATS = (DataType.HALF, DataType.BFLOAT16, DataType.FLOAT, DataType.DOUBLE)
snapshot = _config.config.snapshot


# ==================================================================================================
# Operands
# ==================================================================================================
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
        raise TypeError(
            "a CPU torch tensor was passed; pycudnn needs device memory: move it with "
            "tensor.cuda() or pycudnn.to_device(...)"
        )
    return (t.data_ptr(), t.shape, t.stride(), data_type(t.dtype), dev)


def _from_device_array(a: Any) -> tuple:
    size = a.dtype.itemsize
    return (a.ptr, a.shape, tuple(s // size for s in a.strides), data_type(a.dtype), a.device)


def _from_other(obj: Any) -> tuple:
    return _from_device_array(memory.asarray(obj))


def _host_array(obj: Any) -> tuple:
    raise TypeError(
        f"a host {type(obj).__module__}.{type(obj).__name__} was passed; pycudnn's operations "
        "need device memory: copy it with pycudnn.to_device(array) (or pass a torch/CuPy/JAX "
        "device array)"
    )


def _not_an_array(obj: Any) -> tuple:
    raise TypeError(
        f"expected a device array (torch tensor, CuPy/JAX array, pycudnn DeviceArray), got "
        f"{type(obj).__name__}"
    )


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
    """*obj*'s :class:`Operand` fields as a plain tuple (for hot paths)."""
    return (_GETTERS.get(type(obj)) or _getter(type(obj)))(obj)


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


# ==================================================================================================
# Validation (pure Python); every message names the function and the argument
# ==================================================================================================
def ints(value: Any, nd: int, name: str, lo: int, func: str) -> tuple[int, ...]:
    """An int broadcast to *nd* values, or a sequence of exactly *nd* ints, each >= *lo*."""
    if isinstance(value, bool):
        raise TypeError(f"{func}: {name} must be an int or a tuple of {nd} ints, got {value!r}")
    if isinstance(value, int):
        vals: tuple = (value,) * nd
    else:
        try:
            vals = tuple(value)
        except TypeError:
            raise TypeError(
                f"{func}: {name} must be an int or a tuple of {nd} ints, got {value!r}"
            ) from None
        if len(vals) != nd:
            raise ValueError(
                f"{func}: {name} must have {nd} values (one per spatial dim), got {value!r}"
            )
    out = []
    for v in vals:
        if isinstance(v, bool) or not hasattr(v, "__index__"):
            raise TypeError(f"{func}: {name} must contain ints, got {value!r}")
        v = v.__index__()
        if v < lo:
            what = "negative" if lo == 0 else "non-positive" if lo == 1 else f"< {lo}"
            raise ValueError(f"{func}: {what} {name} is not supported, got {value!r}")
        out.append(v)
    return tuple(out)


def real(
    value: Any,
    name: str,
    func: str,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
) -> float:
    """A finite real number, optionally within ``[lo, hi]`` (``(`` / ``)`` when open)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{func}: {name} must be a real number, got {value!r}")
    v = float(value)
    if v != v or v in (float("inf"), float("-inf")):
        raise ValueError(f"{func}: {name} must be finite, got {value!r}")
    low = lo is not None and (v <= lo if lo_open else v < lo)
    high = hi is not None and (v >= hi if hi_open else v > hi)
    if low or high:
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        rng = f"{left}{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}{right}"
        raise ValueError(f"{func}: {name}={value!r} is out of range; expected a value in {rng}")
    return v


def choose(value: Any, table: dict[str, Any], name: str, func: str) -> Any:
    """The entry of *table* for the string *value* (case-insensitive)."""
    if not isinstance(value, str):
        raise TypeError(f"{func}: {name} must be a string, got {value!r}")
    try:
        return table[value.lower()]
    except KeyError:
        raise ValueError(
            f"{func}: {name}={value!r} is not one of {', '.join(map(repr, table))}"
        ) from None


def same_dtype_and_device(
    func: str, named: Sequence[tuple[str, Operand | None]], allowed: Iterable[DataType] = FLOATS
) -> tuple[DataType, int]:
    """The common dtype and device of the named operands (None entries skipped).

    Raises ``TypeError`` for an unsupported or a mixed dtype and ``ValueError`` for operands on
    different devices, naming both.
    """
    allowed = tuple(allowed)
    first_name, first = next((n, g) for n, g in named if g is not None)
    dt, device = first.dtype, first.device
    for name, g in named:
        if g is None:
            continue
        if g.dtype not in allowed:
            raise TypeError(
                f"{func}: {name} has an unsupported dtype; supported: "
                f"{', '.join(dtype_name(a) for a in allowed)}"
            )
        if g.dtype != dt:
            raise TypeError(
                f"{func}: {first_name} is {dtype_name(dt)} but {name} is {dtype_name(g.dtype)}; "
                "all operands must have the same dtype"
            )
        if g.device != device:
            raise ValueError(
                f"{func}: {first_name} is on device {device} but {name} on device {g.device}"
            )
    return dt, device


def check_strides(func: str, name: str, g: Operand) -> None:
    """Aligned to the element size; no negative strides; no zero (broadcast) strides."""
    isz = itemsize(g.dtype)
    if g.ptr % isz:
        raise ValueError(
            f"{func}: {name}'s address 0x{g.ptr:x} is not a multiple of its element size ({isz} B)"
        )
    for s, st in zip(g.shape, g.strides, strict=True):
        if st < 0:
            raise ValueError(
                f"{func}: {name} has a negative stride {tuple(g.strides)}; cuDNN does not support "
                "them"
            )
        if st == 0 and s > 1:
            raise ValueError(
                f"{func}: {name} has a zero (broadcast) stride {tuple(g.strides)}; make it "
                "contiguous first"
            )


def check_out(func: str, o: Operand, shape: tuple[int, ...], name: str = "out") -> None:
    """``out`` has the expected shape and elements that do not overlap."""
    if tuple(o.shape) != tuple(shape):
        raise ValueError(f"{func}: {name} has shape {tuple(o.shape)}, expected {tuple(shape)}")
    if not _layout.non_overlapping(o.shape, o.strides):
        raise ValueError(
            f"{func}: {name}'s strides {tuple(o.strides)} make elements overlap; cuDNN cannot "
            "write it"
        )


# ==================================================================================================
# Outputs, scaling, handles, workspaces
# ==================================================================================================
class OutputSpec(NamedTuple):
    """How to allocate an output that was not given: ``memory.empty`` arguments."""

    shape: tuple[int, ...]
    dtype: Any  # numpy dtype
    device: int
    strides: tuple[int, ...]  # bytes

    def new(self, stream: int) -> memory.DeviceArray:
        return memory.empty(self.shape, self.dtype, self.device, stream, strides=self.strides)

    @property
    def nbytes_span(self) -> int:
        """Bytes the new array's elements span (as :attr:`Operand.nbytes_span`)."""
        return _layout.extent(self.shape, self.strides, self.dtype.itemsize)[1]

    @property
    def element_strides(self) -> tuple[int, ...]:
        """The strides in elements."""
        return tuple(s // self.dtype.itemsize for s in self.strides)


def output_spec(
    shape: Sequence[int], dt: DataType, device: int, channels_last: bool = False
) -> OutputSpec:
    """A new output of *shape*, packed NCHW (or channels last) like the inputs."""
    isz = itemsize(dt)
    shape = tuple(shape)
    return OutputSpec(
        shape, numpy_dtype(dt), device, _layout.packed_strides(shape, channels_last, isz)
    )


def like_spec(g: Operand, dt: DataType | None = None, shape: Sequence[int] | None = None
              ) -> OutputSpec:  # fmt: skip
    """A new output shaped like *g* (or *shape*), in *g*'s memory order when *g* is dense (as
    ``torch.empty_like``), else packed NCHW or, for an unambiguously channels-last *g*, NHWC."""
    dt = g.dtype if dt is None else dt
    isz = itemsize(dt)
    if shape is None or tuple(shape) == tuple(g.shape):
        shape = tuple(g.shape)
        if _layout.is_dense(shape, g.strides) and all(s > 0 for s in g.strides):
            return OutputSpec(shape, numpy_dtype(dt), g.device, tuple(s * isz for s in g.strides))
    nchw, nhwc = _layout.layout_of(g.shape, g.strides)
    return output_spec(shape, dt, g.device, nhwc and not nchw and len(shape) == len(g.shape))


def check_overlap(func: str, ptrs: Sequence[int], spans: Sequence[int], po: int, so: int,
                  inplace: tuple[int, ...] = ()) -> None:  # fmt: skip
    """Refuse an output ``[po, po + so)`` that overlaps an input, except the inputs listed in
    *inplace* when at the very same address (cuDNN documents them as in-place capable, and the
    call's builder checked that they have the output's layout)."""
    end = po + so
    for i, (p, s) in enumerate(zip(ptrs, spans)):  # noqa: B905 (spans lists the output too)
        if p < end and po < p + s and not (p == po and i in inplace):
            raise ValueError(
                f"{func}: out overlaps an input; cuDNN's outputs may not alias its inputs"
                + (" (in place, out may only be exactly that input)" if inplace else "")
            )


def same_layout(a: Operand, b: Operand) -> bool:
    """Same shape and strides (size-1 dimensions aside): one may be computed in place of the
    other."""
    return tuple(a.shape) == tuple(b.shape) and _layout.matches(a.shape, a.strides, b.strides)


def scales(dt: DataType, *values: float) -> tuple:
    """ctypes scaling factors for data of *dt* (double for double data, else float)."""
    ct = scaling_ctype(dt)
    return tuple(ct(float(v)) for v in values)


def check_stream(func: str, stream: Any, device: int) -> None:
    """Refuse a *stream* object that says it belongs to another device than the operands'
    (torch, CuPy and cuda.core streams say it; ints cannot be checked without a CUDA call)."""
    sdev = _cuda.stream_device(stream)
    if sdev is not None and device is not None and sdev != device:
        raise ValueError(
            f"{func}: stream is on device {sdev} but the operands on device {device}; pass a "
            f"stream of device {device} (or none)"
        )


#: True once a handle was made in a process that sees exactly one GPU: the device switch of
#: :meth:`Call.run` is then skipped (the visible devices are fixed when CUDA starts)
one_device = False
_devices_counted = False


def handle_for(device: int, stream: Any, func: str = "pycudnn") -> Any:
    """The calling thread's handle of *device*, bound to *stream* (when given; a stream object
    of another device is a ``ValueError`` naming both, before any C call)."""
    global one_device, _devices_counted
    if stream is not None and type(stream) is not int:
        check_stream(func, stream, device)
    h = _handle.get_handle(device)
    if not _devices_counted:  # once: the visible devices are fixed when CUDA starts
        one_device = _cuda.device_count() == 1
        _devices_counted = True
    if stream is not None:
        h.set_stream(stream)
    return h


class on_device:
    """``with on_device(d):`` makes device *d* current for the block when another one is (one
    ``cudaGetDevice``; nothing else when *d* is current already, or when CUDA cannot say), and
    restores the caller's device after it. Every launch of the high level runs inside one, so a
    call runs on its operands' device whatever the caller's current device is."""

    __slots__ = ("device", "previous")

    def __init__(self, device: int):
        self.device = device
        self.previous: int | None = None

    def __enter__(self) -> None:
        if one_device:
            return
        cur = _cuda.device_now()
        if cur is not None and cur != self.device:
            _cuda.set_device(self.device)
            self.previous = cur

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None:
            _cuda.set_device(self.previous)
            self.previous = None


def workspace(h: Any, nbytes: int) -> int:
    """Device pointer of at least *nbytes* of the handle's workspace on its current stream
    (grow-only, per (handle, stream); raises ``AllocationError``, a ``MemoryError``)."""
    return h.workspace(nbytes)[0]


def quiet(name: str) -> Callable[..., Any]:
    """The checked C function *name*, without ``CudnnDeprecationWarning``: pycudnn's own use of
    a legacy function is not the user's."""
    return errors.checked(name, warn=False)


_version: int | None = None


def cudnn_version() -> int:
    """The loaded cuDNN's version (cached)."""
    global _version
    if _version is None:
        _version = int(quiet("cudnnGetVersion")())
    return _version


def overlaps(p1: int, n1: int, p2: int, n2: int) -> bool:
    """Byte ranges ``[p1, p1 + n1)`` and ``[p2, p2 + n2)`` intersect."""
    return p1 < p2 + n2 and p2 < p1 + n1


# ==================================================================================================
# Descriptors, cached per layout
# ==================================================================================================
_descs = threading.local()


def tensor_descriptor(shape: Sequence[int], strides: Sequence[int], dt: DataType) -> Any:
    """A ``TensorDescriptor`` of (*shape*, element *strides*, *dt*), one per thread and layout.

    Size-1 dimensions may carry any stride (or 0): they are given stride 1, which cuDNN accepts.
    """
    key = (tuple(shape), tuple(strides), dt)
    cache = getattr(_descs, "cache", None)
    if cache is None:
        cache = _descs.cache = _plans.new_lru(owns=False)
    d = cache.get(key)
    if d is None:
        from ..descriptors import TensorDescriptor

        fixed = tuple(st if s > 1 else max(st, 1) for s, st in zip(shape, strides, strict=True))
        d = TensorDescriptor(tuple(shape), dt, fixed)
        cache.put(key, d)
    return d


# ==================================================================================================
# Staging: operands the C call cannot take as they are go through packed copies
# ==================================================================================================
class Stage:
    """Copies around a C call for operands whose strides it cannot take: inputs are copied into
    packed buffers before the call; a staged output is computed into a packed buffer and then
    written into ``out`` with ``alpha``/``beta`` (``cudnnTransformTensor``)."""

    __slots__ = ("inputs", "output", "scales", "transform")

    def __init__(
        self,
        dt: DataType,
        inputs: list[tuple[int, Operand, tuple[int, ...]]],
        output: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None,
        alpha: float,
        beta: float,
    ):
        """*inputs*: ``(index, operand, packed strides)``; *output*: ``(shape, its strides,
        packed strides)`` (element strides)."""
        isz = itemsize(dt)
        npdt = numpy_dtype(dt)
        self.inputs = [
            (
                i,
                g.shape,
                npdt,
                tuple(s * isz for s in packed),
                tensor_descriptor(g.shape, g.strides, dt),
                tensor_descriptor(g.shape, packed, dt),
            )
            for i, g, packed in inputs
        ]
        self.output = None
        if output is not None:
            shape, strides, packed = output
            self.output = (
                shape,
                npdt,
                tuple(s * isz for s in packed),
                tensor_descriptor(shape, packed, dt),
                tensor_descriptor(shape, strides, dt),
            )
        self.scales = scales(dt, 1.0, 0.0, alpha, beta)
        self.transform = quiet("cudnnTransformTensor")

    def before(self, h: Any, ptrs: list[int], keep: list) -> int | None:
        """Copy the staged inputs; replace their pointers in *ptrs* (a list indexed like the
        operands, the output last); return the real output pointer when it is staged."""
        one, zero = self.scales[0], self.scales[1]
        device, stream = h.device, h.stream
        for idx, shape, npdt, strides, src, dst in self.inputs:
            tmp = memory.empty(shape, npdt, device, stream, strides=strides)
            self.transform(
                h.ptr, ctypes.byref(one), src, ptrs[idx], ctypes.byref(zero), dst, tmp.ptr
            )
            keep.append(tmp)  # freed stream-ordered, after the call was queued
            ptrs[idx] = tmp.ptr
        if self.output is None:
            return None
        shape, npdt, strides, _src, _dst = self.output
        final = memory.empty(shape, npdt, device, stream, strides=strides)
        keep.append(final)
        real_out, ptrs[-1] = ptrs[-1], final.ptr
        return real_out

    def after(self, h: Any, ptrs: list[int], real_out: int | None) -> None:
        """Write a staged output into ``out`` (``alpha * result + beta * out``)."""
        if real_out is None:
            return
        _shape, _npdt, _strides, src, dst = self.output
        alpha, beta = self.scales[2], self.scales[3]
        self.transform(h.ptr, ctypes.byref(alpha), src, ptrs[-1], ctypes.byref(beta), dst, real_out)


def padded(shape: Sequence[int], strides: Sequence[int], rank: int = 4
           ) -> tuple[tuple[int, ...], tuple[int, ...]]:  # fmt: skip
    """*shape*/*strides* with trailing size-1 dims up to *rank* (cuDNN's legacy descriptors take
    3 to 8 dims; element-wise operations do not care how many)."""
    extra = max(rank - len(shape), 0)
    return tuple(shape) + (1,) * extra, tuple(strides) + (1,) * extra


def dispatch(key: Any, build: Callable[..., Call], ptrs: tuple[int, ...], out: Any,
             po: int | None, stream: Any, *args: Any) -> Any:  # fmt: skip
    """Run the cached call of *key*, or ``build(*args)`` it (validation, descriptors), run it
    and cache it once it ran. An unhashable key (a list argument) runs uncached.

    Pass the builder and its arguments rather than a closure: a closure would make every
    variable it captures a cell in the caller, on the hot path too.
    """
    try:
        cache = local.calls
    except AttributeError:
        cache = calls()
    try:
        call = cache.data.get(key)
    except TypeError:
        call = key = None
    if call is not None:
        return call.run(ptrs, out, po, stream)
    call = build(*args)
    result = call.run(ptrs, out, po, stream)
    if key is not None:
        cache.put(key, call)
    return result


# ==================================================================================================
# Layout planning for legacy calls: packed NCHW or NHWC, the rest staged
# ==================================================================================================
class Packed(NamedTuple):
    """How a legacy call sees its operands: descriptors (inputs in order, then the output when
    there is one), the staging of the operands that are not packed, and the new output's spec."""

    descs: tuple
    stage: Stage | None
    spec: OutputSpec | None


def channels_last(g: Operand) -> bool:
    """*g* is unambiguously packed channels-last (NHWC / NDHWC)."""
    nchw, nhwc = _layout.layout_of(g.shape, g.strides)
    return nhwc and not nchw


def check_operand(func: str, name: str, g: Operand) -> None:
    """Strides cuDNN can describe: aligned, positive (or size-1), within its 32-bit limits."""
    check_strides(func, name, g)
    _layout.check_int32(f"{func}: {name}", g.shape, g.strides)


def packed_operands(
    dt: DataType,
    inputs: Sequence[Operand],
    out: Operand | None,
    out_shape: Sequence[int] | None,
    nhwc: bool,
    alpha: float = 1.0,
    beta: float = 0.0,
    first: int = 0,
) -> Packed:
    """Descriptors of *inputs* (and of the output of *out_shape*, unless it is None) packed NCHW
    (or channels-last with *nhwc*); inputs and a given *out* with other strides are staged through
    packed copies. *first* is the index of ``inputs[0]`` in the call's pointer list (the output
    is last); *alpha*/*beta* blend a staged output into *out*. All operands have dtype *dt*.

    A new output (``out is None``) gets :attr:`Packed.spec`, packed in that layout.
    """
    staged, descs = [], []
    for i, g in enumerate(inputs):
        can = _layout.packed_strides(g.shape, nhwc)
        if not _layout.matches(g.shape, g.strides, can):
            staged.append((first + i, g, can))
        descs.append(tensor_descriptor(g.shape, can, dt))
    staged_out = spec = None
    if out_shape is not None:
        can = _layout.packed_strides(out_shape, nhwc)
        if out is None:
            spec = output_spec(out_shape, dt, inputs[0].device, nhwc)
        elif not _layout.matches(out.shape, out.strides, can):
            staged_out = (tuple(out_shape), tuple(out.strides), can)
        descs.append(tensor_descriptor(out_shape, can, dt))
    stage = Stage(dt, staged, staged_out, alpha, beta) if staged or staged_out else None
    return Packed(tuple(descs), stage, spec)


# ==================================================================================================
# Call entries and their cache
# ==================================================================================================
class Call:
    """A validated call, ready to run: the handle, how to allocate its output, the byte spans of
    its operands (for the overlap check), and its staging. Subclasses implement :meth:`launch`
    (the C call on the final pointers, output last)."""

    __slots__ = ("alloc", "func", "handle", "inplace", "spans", "stage")

    def __init__(
        self,
        func: str,
        handle: Any,
        alloc: OutputSpec | None,
        spans: tuple[int, ...],
        stage: Stage | None = None,
        inplace: tuple[int, ...] = (),
    ):
        self.func = func  # the user-facing function (error messages)
        self.handle = handle
        self.alloc = alloc  # None: out= was given
        self.spans = spans  # byte spans of the inputs, then the output
        self.stage = stage
        # inputs that out may be exactly (same address; the builder checked their layout)
        self.inplace = inplace

    def run(self, ptrs: Any, out: Any, po: Any, stream: Any) -> Any:
        """:meth:`_run` with the handle's device current (the caller's device restored after):
        the call follows its operands' device. Subclasses override :meth:`_run`."""
        if one_device:  # the only visible GPU is always the current one: no cudaGetDevice
            return self._run(ptrs, out, po, stream)
        dev = self.handle.device
        cur = _cuda.device_now()
        if cur is None or cur == dev:
            return self._run(ptrs, out, po, stream)
        _cuda.set_device(dev)
        try:
            return self._run(ptrs, out, po, stream)
        finally:
            _cuda.set_device(cur)

    def _run(self, ptrs: tuple[int, ...], out: Any, po: int | None, stream: Any) -> Any:
        """Bind the stream, allocate or check ``out``, stage, and launch. Returns ``out``."""
        h = self.handle
        if stream is not None:
            h.set_stream(stream)  # no C call when unchanged
        if out is None:
            out = self.alloc.new(h.stream)
            po = out.ptr
        spans = self.spans
        end = po + spans[-1]
        i = 0
        for p in ptrs:
            if p < end and po < p + spans[i]:  # overlap: refused unless exactly in place
                check_overlap(self.func, ptrs, spans, po, spans[-1], self.inplace)
                break
            i += 1  # noqa: SIM113 (enumerate costs more on the hot path)
        if self.stage is None:
            self.launch((*ptrs, po))
            return out
        stage = self.stage
        keep: list = []
        all_ptrs = [*ptrs, po]
        real_out = stage.before(h, all_ptrs, keep)
        self.launch(all_ptrs)
        stage.after(h, all_ptrs, real_out)
        return out

    def launch(self, ptrs: Sequence[int]) -> None:  # pragma: no cover - abstract
        """The C call on the final pointers: the inputs', then the output's."""
        raise NotImplementedError


class NoOp(Call):
    """An empty problem: the output is allocated (or taken), nothing is computed."""

    __slots__ = ()

    def launch(self, ptrs: Sequence[int]) -> None:
        pass


#: per-thread state: ``local.calls`` is the thread's call cache once :func:`calls` made it (hot
#: paths read the attribute and fall back to :func:`calls`)
local = threading.local()


def calls() -> Any:
    """The calling thread's call-entry cache (an LRU cleared by ``clear_caches()``)."""
    try:
        return local.calls
    except AttributeError:
        lru = local.calls = _plans.new_lru()
        return lru


# ==================================================================================================
# Calls with several outputs, and the pieces of a build step
# ==================================================================================================
class MultiOutputCall(Call):
    """A validated call with several outputs: ``run(ptrs, outs, pos, stream)`` takes the output
    arrays (None: allocate from ``allocs``) and their pointers, refuses outputs that overlap an
    input or each other, stages inputs (``stage``; outputs are never staged) and launches
    ``launch((*input_ptrs, *output_ptrs))`` (on the handle's device, as :meth:`Call.run`).
    Returns the outputs as a tuple. ``noop``: allocate
    only (empty problems)."""

    __slots__ = ("allocs", "n_in", "noop")

    def __init__(
        self,
        func: str,
        handle: Any,
        allocs: Sequence[Any],
        in_spans: Sequence[int],
        out_spans: Sequence[int],
        stage: Stage | None = None,
        noop: bool = False,
    ):
        super().__init__(func, handle, None, (*in_spans, *out_spans), stage)
        self.allocs = tuple(allocs)
        self.n_in = len(in_spans)
        self.noop = noop

    def _run(self, ptrs: Sequence[int], outs: Sequence[Any], pos: Sequence[Any], stream: Any
             ) -> tuple:  # fmt: skip
        h = self.handle
        if stream is not None:
            h.set_stream(stream)
        outs, pos = list(outs), list(pos)
        given = []
        for i, spec in enumerate(self.allocs):
            if outs[i] is None:
                outs[i] = spec.new(h.stream)
                pos[i] = outs[i].ptr
            else:
                given.append(i)
        # a new array overlaps nothing: only the given ones are checked, against the inputs
        # and each other
        spans, n = self.spans, self.n_in
        for k, i in enumerate(given):
            p, s = pos[i], spans[n + i]
            check_overlap(self.func, ptrs, spans, p, s)
            for j in given[:k]:
                if s and spans[n + j] and overlaps(p, s, pos[j], spans[n + j]):
                    raise ValueError(f"{self.func}: two outputs overlap; give separate arrays")
        if not self.noop:
            if self.stage is None:
                self.launch((*ptrs, *pos))
            else:
                keep: list = []
                all_ptrs = [*ptrs, *pos]
                self.stage.before(self.handle, all_ptrs, keep)
                self.launch(all_ptrs)
        return tuple(outs)


class GraphCall(MultiOutputCall):
    """A builder graph's plan as a call entry (:mod:`pycudnn.graph`): ``launch`` runs the plan
    on the inputs' and outputs' pointers (the graph's io order), its constants' host
    addresses, the scratch tensors' places in the workspace, and the workspace."""

    __slots__ = ("consts", "extra", "graph", "key", "plan", "scratch")

    def __init__(
        self,
        func: str,
        handle: Any,
        allocs: Sequence[Any],
        in_spans: Sequence[int],
        out_spans: Sequence[int],
        graph: Any,
        stage: Stage | None = None,
    ) -> None:
        super().__init__(func, handle, allocs, in_spans, out_spans, stage)
        self.graph = graph
        self.key = graph._key
        self.plan = graph.plan
        self.consts = graph.constant_pointers()
        self.scratch = bool(self.key.scratch)
        self.extra: tuple = ()  # buffers the operation keeps with its entry (stand-ins)

    def launch(self, ptrs: Sequence[int]) -> None:
        plan = self.plan
        h = self.handle
        if self.scratch:
            full = [*ptrs, *self.consts, *(0,) * len(self.key.scratch)]
            total, offsets = _builder.workspace_layout(plan.workspace, self.key.scratch)
            wsp = h.workspace(total)[0]
            _builder.fill_scratch(self.key, full, wsp, offsets, h.stream)
            plan.run(*full, wsp if plan.workspace else 0)
            return
        ws = plan.workspace
        plan.run(*ptrs, *self.consts, h.workspace(ws)[0] if ws else 0)


def lookup(key: Any, build: Callable[[], Any]) -> tuple[Any, bool]:
    """``(call entry, cached)``: the calling thread's entry of *key*, or ``build()`` (validation,
    descriptors) for the caller to run and then :func:`remember` (as ``_op.dispatch`` does).
    An unhashable *key* (a list argument) builds every time."""
    try:
        call = calls().data.get(key)
    except TypeError:
        return build(), True  # never cached
    if call is not None:
        return call, True
    return build(), False


def remember(key: Any, call: Any) -> None:
    """Cache *call* under *key* (after it ran once)."""
    calls().put(key, call)


def tensor_desc(func: str, name: str, g: Operand, rank: int = 4) -> Any:
    """The (cached) descriptor of *g* after the stride checks, padded with trailing size-1 dims
    to *rank* (cuDNN's legacy descriptors take 3 to 8 dims); None for an empty *g* (nothing to
    compute, and cuDNN's descriptors take no 0-size dims)."""
    if len(g.shape) > 8:
        raise ValueError(f"{func}: {name} has {len(g.shape)} dims; cuDNN supports at most 8")
    check_strides(func, name, g)
    if 0 in g.shape:
        return None
    return tensor_descriptor(*padded(g.shape, g.strides, rank), g.dtype)


def out_operand(func: str, out: Any, shape: Sequence[int], dt: DataType, device: int,
                name: str = "out") -> Operand:  # fmt: skip
    """*out* checked against the expected *shape*, dtype and device."""
    o = operand(out)
    if o.dtype != dt:
        got = "an unsupported dtype" if o.dtype is None else dtype_name(o.dtype)
        raise TypeError(f"{func}: {name} is {got}, expected {dtype_name(dt)}")
    if o.device != device:
        raise ValueError(f"{func}: {name} is on device {o.device}, the inputs on device {device}")
    check_out(func, o, shape, name)
    check_strides(func, name, o)
    return o


def empty_result(func: str, out: Any, spec: OutputSpec, beta: float, fill: bool) -> Any:
    """Zero-size problems, no cuDNN call: nothing to compute (an empty output), or a sum over
    nothing (``alpha * 0 + beta * out``) when only a reduced dimension is empty."""
    if out is None:
        make = memory.zeros if fill else memory.empty
        return make(spec.shape, spec.dtype, spec.device, strides=spec.strides)
    if fill:
        if float(beta) == 0.0:
            memory.asarray(out).fill_(0)
        elif float(beta) != 1.0:
            raise NotImplementedError(
                f"{func}: scaling out by beta={beta} for an empty reduction is not supported"
            )
    return out
