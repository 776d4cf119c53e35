"""``DeviceArray`` and its constructors: ``empty``, ``zeros``, ``empty_like``, ``to_device``.

Design decisions
----------------
* **Ownership.** An array pycudnn allocates keeps the allocator's block as its ``base``, and every
  view keeps that base (or the viewed object), so the memory lives as long as the last array
  over it (see :mod:`pycudnn.memory.allocator`).
* **Strides are bytes** (numpy and ``__cuda_array_interface__`` convention), converted to element
  strides only for DLPack. Dense layouts other than C order (NHWC viewed as NCHW) are kept by
  :func:`to_device`, :meth:`DeviceArray.get` and :func:`empty_like`. Stride arithmetic comes
  from :mod:`pycudnn._layout`.
* **Validated once.** :func:`empty` remembers the layouts it has validated, keyed by its
  arguments as given, so a repeated call (a convolution's output) skips the validation; on a
  cache hit of the allocator it then makes no CUDA call.
* **Explicit copies.** There is no implicit conversion to numpy (:meth:`DeviceArray.get`
  copies); host data reaches the GPU only through :func:`to_device` or :meth:`DeviceArray.copy_`.
* **Exports both protocols**: ``__cuda_array_interface__`` (v3) and ``__dlpack__`` (the capsule
  ABI is :mod:`pycudnn.memory._dlpack`), with stream synchronization as the protocols say.
* **bfloat16.** On the device it is just 2-byte data; on the host it needs the ``ml_dtypes``
  package (``np.dtype(ml_dtypes.bfloat16)``). ``__cuda_array_interface__`` has no bfloat16 type
  string (it shows as ``'<V2'``), so bfloat16 travels through DLPack.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from .. import _cuda, _types, enums
from .._cuda import (
    DeviceContext,
    coerce_stream,
    current_device,
    require_gpu,
    stream_wait,
    validate_device,
)
from .._layout import extent, is_c_contiguous, is_dense, packed_strides
from . import _dlpack, _transfer, _views, allocator
from ._checks import (
    as_shape,
    check_device,
    check_device_pointer,
    check_view,
    checked_dtype,
    default_device,
    dimension,
    is_host_array,
)
from ._protocols import view_of

__all__ = ["DeviceArray", "empty", "empty_like", "to_device", "zeros"]


# -- DeviceArray ---------------------------------------------------------------------------------
def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class DeviceArray:
    """An n-dimensional array in GPU memory (owned by pycudnn, or a zero-copy view).

    Make one with :func:`empty`, :func:`zeros`, :func:`to_device`, :func:`asarray` or
    :meth:`from_ptr`.

    Attributes
    ----------
    ptr : int
        Device address of element ``[0, ..., 0]``.
    shape : tuple of int
    dtype : numpy.dtype
        bfloat16 is ``ml_dtypes.bfloat16``.
    strides : tuple of int
        In bytes, like numpy and ``__cuda_array_interface__``.
    device : int
        CUDA device ordinal.
    stream : int
        The stream the data is ordered on (allocation/last transfer; 0 = legacy default).
    nbytes : int
        ``size * itemsize``.

    Notes
    -----
    The array supports ``__cuda_array_interface__`` (v3) and ``__dlpack__``, so
    ``torch.as_tensor(a, device="cuda")``, ``cupy.asarray(a)`` and ``torch.from_dlpack(a)`` view
    it without a copy. There is no implicit conversion to numpy: call :meth:`get`.
    """

    __slots__ = (
        "__weakref__",
        "_base",
        "_device",
        "_dl_device_type",
        "_dtype",
        "_ptr",
        "_readonly",
        "_shape",
        "_stream",
        "_strides",
    )

    def __init__(
        self,
        ptr: int,
        shape: tuple[int, ...] | None = None,
        dtype: np.dtype | None = None,
        strides: tuple[int, ...] | None = None,
        device: int | None = None,
        stream: int | None = None,
        base: Any = None,
        readonly: bool = False,
        dl_device_type: int = _dlpack.KDL_CUDA,
    ):
        # internal: the public constructors validate; see from_ptr
        if device is None or strides is None:
            raise TypeError(
                "DeviceArray is not made directly: use pycudnn.empty/zeros/to_device/asarray, "
                "or DeviceArray.from_ptr(ptr, shape, dtype, strides, device=...) for memory you "
                f"own (got DeviceArray({', '.join(_short(a) for a in (ptr, shape, dtype))}, ...))"
            )
        self._ptr = ptr
        self._shape = shape
        self._dtype = dtype
        self._strides = strides
        self._device = device
        self._stream = stream
        self._base = base
        self._readonly = readonly
        self._dl_device_type = dl_device_type

    @classmethod
    def from_ptr(
        cls,
        ptr: int,
        shape: Any,
        dtype: Any,
        strides: Iterable[int] | None = None,
        *,
        device: int | None = None,
        stream: Any = None,
        owner: Any = None,
        readonly: bool = False,
        check: bool = True,
        allow_managed: bool = False,
    ) -> DeviceArray:
        """View existing device memory at *ptr* (not owned: nothing is freed here).

        Parameters
        ----------
        ptr : int
            Device address.
        shape, dtype
            Array shape and element type (a cuDNN-supported dtype).
        strides : sequence of int, optional
            In bytes; default C-contiguous.
        device : int, optional
            Device ordinal; found from the pointer when *check* (else the current device).
        stream : optional
            The stream the data is ordered on (default 0).
        owner : object, optional
            Kept alive as long as the view (whatever owns the memory).
        check : bool
            Check the pointer with :func:`check_device_pointer` (needs a GPU).
        """
        dt = checked_dtype(dtype)
        shp = as_shape(shape)
        st = (
            packed_strides(shp, itemsize=dt.itemsize)
            if strides is None
            else tuple(int(dimension(s)) for s in strides)
        )
        if len(st) != len(shp):
            raise ValueError(f"strides {st} do not match shape {shp}")
        if isinstance(ptr, bool) or not isinstance(ptr, int | np.integer):
            raise TypeError(f"ptr must be an int address, got {ptr!r}")
        ptr = int(ptr)
        check_view(ptr, shp, st, dt.itemsize, "ptr", whole_elements=False)
        if device is not None:
            device = check_device(device, "from_ptr")
        size = math.prod(shp)
        if check and size:
            dev = check_device_pointer(ptr, device, argument="ptr", allow_managed=allow_managed)
        elif device is not None:
            dev = int(device)
        else:
            dev = default_device()
        return cls(ptr, shp, dt, st, dev, coerce_stream(stream), owner, bool(readonly))

    # -- metadata -------------------------------------------------------------------------------
    @property
    def ptr(self) -> int:
        """Device address of element ``[0, ..., 0]``."""
        return self._ptr

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape, a tuple of ints."""
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        """The numpy dtype (``ml_dtypes.bfloat16`` for bfloat16)."""
        return self._dtype

    @property
    def strides(self) -> tuple[int, ...]:
        """Strides in bytes (numpy's and ``__cuda_array_interface__``'s convention)."""
        return self._strides

    @property
    def device(self) -> int:
        """The CUDA device ordinal the memory lives on."""
        return self._device

    @property
    def stream(self) -> int:
        """The stream the data is ordered on (its allocation or last transfer; 0 is the legacy
        default stream)."""
        return self._stream

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self._shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self._shape)

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return self._dtype.itemsize

    @property
    def nbytes(self) -> int:
        """``size * itemsize``."""
        return self.size * self._dtype.itemsize

    @property
    def readonly(self) -> bool:
        """True for a read-only view (a producer said so through its protocol)."""
        return self._readonly

    @property
    def base(self) -> Any:
        """What keeps the memory alive (pycudnn's allocation, or the viewed object)."""
        return self._base

    @property
    def data_type(self) -> enums.DataType:
        """The cuDNN ``DataType`` of the elements."""
        return _types.as_data_type(self._dtype)

    @property
    def is_c_contiguous(self) -> bool:
        """True when packed in C order."""
        return is_c_contiguous(self._shape, self._strides, self._dtype.itemsize)

    @property
    def is_dense(self) -> bool:
        """No gaps, overlaps or negative strides, in any dimension order (C, NHWC, F, ...)."""
        return is_dense(self._shape, self._strides, self._dtype.itemsize)

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d DeviceArray")
        return self._shape[0]

    def __repr__(self) -> str:
        layout = "" if self.is_c_contiguous else f", strides={self._strides}"
        return (
            f"DeviceArray(shape={self._shape}, dtype={self._dtype.name}{layout}, "
            f"device={self._device}, ptr=0x{self._ptr:x})"
        )

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError(
            "implicit conversion of a DeviceArray to numpy is not allowed; call .get() to copy "
            "it to the host"
        )

    # -- views ----------------------------------------------------------------------------------
    def reshape(self, *shape: Any) -> DeviceArray:
        """A view with a new shape (C-contiguous arrays only; one dimension may be -1)."""
        new = _views.reshaped(self.size, shape)
        if not self.is_c_contiguous:
            raise ValueError("reshape needs a C-contiguous array; copy it first")
        return self._view(self._ptr, new, packed_strides(new, itemsize=self.itemsize))

    def _view(self, ptr: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> DeviceArray:
        """A view of the same memory (keeps the allocation, or this array, alive)."""
        return DeviceArray(
            ptr,
            shape,
            self._dtype,
            strides,
            self._device,
            self._stream,
            self._base if self._base is not None else self,
            self._readonly,
            self._dl_device_type,
        )

    def __getitem__(self, key: Any) -> DeviceArray:
        """Basic indexing, as in numpy: ints, slices (any step), ``...`` and ``None``.

        Returns a view (no copy); an int removes its dimension. Boolean and array indexing are
        not supported.
        """
        return self._view(*_views.indexed(self._ptr, self._shape, self._strides, key))

    def transpose(self, *axes: Any) -> DeviceArray:
        """A view with the dimensions permuted (default: reversed), as ``numpy.transpose``.

        ``x.transpose(0, 3, 1, 2)`` views NHWC-ordered data as NCHW without a copy.
        """
        return self._view(self._ptr, *_views.transposed(self._shape, self._strides, axes))

    @property
    def T(self) -> DeviceArray:
        """The transposed view (dimensions reversed)."""
        return self.transpose()

    # -- protocols ------------------------------------------------------------------------------
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """Version 3: the stream is this array's (1 for the legacy default stream)."""
        return {
            "shape": self._shape,
            "typestr": self._dtype.str,
            "descr": [("", self._dtype.str)],
            "data": (self._ptr, self._readonly),
            "version": 3,
            "strides": None if self.is_c_contiguous else self._strides,
            "stream": self._stream or 1,
        }

    def __dlpack_device__(self) -> tuple[int, int]:
        return (self._dl_device_type, self._device)

    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """Export as a DLPack capsule (``dltensor``, or ``dltensor_versioned`` if asked).

        Parameters
        ----------
        stream : int, optional
            The consumer's stream: ``None`` or ``1`` the legacy default stream, ``2`` the
            per-thread default stream, another int a ``cudaStream_t``, ``-1`` no
            synchronization. The consumer's stream is made to wait for this array's stream.
        max_version : (int, int), optional
            The highest DLPack version the consumer reads; ``>= (1, 0)`` gives a versioned
            capsule.
        dl_device : (int, int), optional
            Must be this array's device.
        copy : bool, optional
            True exports a fresh copy; False/None never copies.
        """
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(
                f"cannot export to device {tuple(dl_device)}: the array is on "
                f"{self.__dlpack_device__()} and __dlpack__ does not copy across devices"
            )
        if (
            stream is not None
            and stream != -1
            and (isinstance(stream, bool) or not isinstance(stream, int) or stream < 0)
        ):
            raise ValueError(f"__dlpack__: stream={stream!r} is not a CUDA stream integer")
        src = self.copy() if copy else self  # queued on our stream, so the wait covers it
        if stream != -1 and src.size:
            stream_wait(1 if stream is None or stream == 0 else stream, src._stream, src._device)
        versioned = max_version is not None and int(max_version[0]) >= 1
        return _dlpack.export(
            src,
            src._ptr,
            src._shape,
            None if src.is_c_contiguous else src._strides,
            src._dtype,
            src.__dlpack_device__(),
            versioned=versioned,
            read_only=src._readonly,
            copied=bool(copy),
        )

    # -- transfers ------------------------------------------------------------------------------
    def _stream_of(self, stream: Any) -> int:
        return self._stream if stream is None else coerce_stream(stream)

    def get(self, stream: Any = None) -> np.ndarray:
        """Copy to a new numpy array (waits for the copy to finish).

        Parameters
        ----------
        stream : optional
            Stream to copy on; default the array's stream.

        Returns
        -------
        numpy.ndarray
            Same shape and dtype; same strides when the array is dense (C, NHWC, ...), else
            C-contiguous.
        """
        sid = self._stream_of(stream)
        if self.size == 0:
            return np.empty(self._shape, self._dtype)
        lo, hi = extent(self._shape, self._strides, self.itemsize)
        host = np.empty(hi - lo, np.uint8)
        rt = _cuda.runtime()
        with DeviceContext(self._device):
            stream_wait(sid, self._stream, self._device)
            _cuda.check(
                rt.cudaMemcpyAsync(
                    host.ctypes.data,
                    self._ptr + lo,
                    hi - lo,
                    rt.cudaMemcpyKind.cudaMemcpyDeviceToHost,
                    sid,
                ),
                "cudaMemcpyAsync",
            )
            _cuda.check(rt.cudaStreamSynchronize(sid), "cudaStreamSynchronize")
        out = np.ndarray(self._shape, self._dtype, buffer=host, offset=-lo, strides=self._strides)
        if self.is_dense:
            return out
        return np.array(out, copy=True)

    def copy_(self, src: Any, stream: Any = None) -> DeviceArray:
        """Copy *src* (a numpy array or any device array) into this array, in place.

        Shapes and dtypes must match. Both layouts must be dense; a device source must have
        the same strides (a host source may have any layout). Returns ``self``.
        """
        if self._readonly:
            raise ValueError("the array is read-only")
        sid = self._stream_of(stream)
        if not self.is_dense:
            raise NotImplementedError(
                "copy_ into a non-dense view (gaps or overlaps) is not supported; copy into a "
                "dense array instead"
            )
        rt = _cuda.runtime()
        if is_host_array(src):
            host = np.asarray(src)
            if host.dtype != self._dtype or host.shape != self._shape:
                raise ValueError(
                    f"copy_: source {host.shape} {host.dtype} does not match the array "
                    f"{self._shape} {self._dtype}"
                )
            host = _transfer.host_in_layout(host, self._strides)
            lo, hi = extent(self._shape, self._strides, self.itemsize)
            if hi > lo:
                with DeviceContext(self._device):
                    stream_wait(sid, self._stream, self._device)
                    _cuda.check(
                        rt.cudaMemcpyAsync(
                            self._ptr,
                            host.ctypes.data,
                            hi - lo,
                            rt.cudaMemcpyKind.cudaMemcpyHostToDevice,
                            sid,
                        ),
                        "cudaMemcpyAsync",
                    )
            return self
        other = _foreign(src, sid if _device_said(src) == self._device else 0)
        if other.dtype != self._dtype or other.shape != self._shape:
            raise ValueError(
                f"copy_: source {other.shape} {other.dtype} does not match the array "
                f"{self._shape} {self._dtype}"
            )
        if self.size == 0:
            return self
        if not other.is_dense or not _same_layout(other, self):
            raise NotImplementedError(
                f"copy_ between different device layouts (strides {other.strides} -> "
                f"{self._strides}) is not supported; make the source contiguous first"
            )
        if other._device == self._device:
            with DeviceContext(self._device):
                stream_wait(sid, self._stream, self._device)
                stream_wait(sid, other._stream, other._device)
                _cuda.check(
                    rt.cudaMemcpyAsync(
                        self._ptr, other._ptr, self.nbytes, rt.cudaMemcpyKind.cudaMemcpyDefault, sid
                    ),
                    "cudaMemcpyAsync",
                )
            return self
        _transfer.copy_peer(self, other, sid)
        return self

    def copy(self, stream: Any = None) -> DeviceArray:
        """A new array with the same contents and (dense) layout."""
        out = empty_like(self, stream=self._stream_of(stream))
        return out.copy_(self, stream=out._stream)

    def fill_(self, value: Any, stream: Any = None) -> DeviceArray:
        """Set every element to *value* (stream-ordered memset; the array must be dense)."""
        if self._readonly:
            raise ValueError("the array is read-only")
        if not self.is_dense:
            raise NotImplementedError("fill_ of a non-dense view is not supported")
        sid = self._stream_of(stream)
        pattern = np.array(value, dtype=self._dtype).tobytes()  # numpy checks range and kind
        n = self.size
        if n == 0:
            return self
        rt = _cuda.runtime()
        with DeviceContext(self._device):
            stream_wait(sid, self._stream, self._device)
            if pattern == pattern[:1] * len(pattern):  # one repeated byte (0, any 1-byte type)
                _cuda.check(
                    rt.cudaMemsetAsync(self._ptr, pattern[0], self.nbytes, sid), "cudaMemsetAsync"
                )
                return self
            # the driver memsets need the primary context current on this thread
            _cuda.set_device(self._device)
            dr = _cuda.driver()
            word = int.from_bytes(pattern[:4].ljust(4, b"\0"), "little")
            if len(pattern) == 2:
                _cuda.check(
                    dr.cuMemsetD16Async(self._ptr, word & 0xFFFF, n, sid), "cuMemsetD16Async"
                )
            elif len(pattern) == 4:
                _cuda.check(dr.cuMemsetD32Async(self._ptr, word, n, sid), "cuMemsetD32Async")
            else:  # 8 bytes: two strided 32-bit memsets
                high = int.from_bytes(pattern[4:8], "little")
                for ptr, half in ((self._ptr, word), (self._ptr + 4, high)):
                    _cuda.check(
                        dr.cuMemsetD2D32Async(ptr, 8, half, 1, n, sid), "cuMemsetD2D32Async"
                    )
        return self

    def synchronize(self) -> None:
        """Wait for the work queued on the array's stream."""
        _cuda.synchronize(self._stream, self._device)


def _same_layout(a: DeviceArray, b: DeviceArray) -> bool:
    if a.is_c_contiguous and b.is_c_contiguous:
        return True
    return all(n == 1 or sa == sb for n, sa, sb in zip(a.shape, a.strides, b.strides, strict=True))


def _device_said(obj: Any) -> int | None:
    """The device *obj* says it is on (a ``DeviceArray``, ``__dlpack_device__``), else None."""
    if isinstance(obj, DeviceArray):
        return obj._device
    dl = _dlpack.device_of(obj)
    return dl[1] if dl is not None and dl[0] == _dlpack.KDL_CUDA else None


def _foreign(obj: Any, stream: Any) -> DeviceArray:
    """*obj* as a ``DeviceArray`` (itself, or a zero-copy view; ``asarray`` without options)."""
    if isinstance(obj, DeviceArray):
        return obj
    return DeviceArray(*view_of(obj, stream, None, True, False, "array"))


# -- constructors --------------------------------------------------------------------------------
def _resolve(device: Any, stream: Any, what: str) -> tuple[int, int]:
    if device is None:
        require_gpu(what)
        dev = current_device()
    else:
        dev = validate_device(device, what)
    said = _cuda.stream_device(stream)
    if said is not None and said != dev:  # its pool would be the stream's device's
        raise ValueError(f"{what}: stream is on device {said} but the memory on device {dev}")
    return dev, coerce_stream(stream)


def _keep(stream: Any) -> Any:
    """The stream object the memory must keep alive (None for ints and the default)."""
    return None if stream is None or isinstance(stream, int) else stream


# A validated layout: (shape, numpy dtype, byte strides, nbytes).
_Layout = tuple[tuple[int, ...], np.dtype, tuple[int, ...], int]
# empty()'s arguments (shape, dtype, strides, device) as given -> their validated layout, so a
# repeated call (the convolution's output) skips the validation: one dict lookup. The device is
# in the key, so a hit also means the device was validated. Cleared when it grows past the cap.
_layouts: dict[Any, _Layout] = {}
_LAYOUTS_MAX = 4096


def _layout(shape: tuple[int, ...], dtype: np.dtype, strides: tuple[int, ...] | None) -> _Layout:
    itemsize = dtype.itemsize
    if strides is None:
        strides = packed_strides(shape, itemsize=itemsize)
    elif len(strides) != len(shape) or not is_dense(shape, strides, itemsize):
        raise ValueError(
            f"strides {strides} are not a dense layout of shape {shape} with itemsize {itemsize}"
        )
    return shape, dtype, strides, math.prod(shape) * itemsize


def _new_array(lay: _Layout, device: int, sid: int, keep: Any) -> DeviceArray:
    shape, dtype, strides, nbytes = lay
    if not nbytes:
        return DeviceArray(0, shape, dtype, strides, device, sid, None)
    blk = allocator.memory_resource().allocate(nbytes, device, sid, keep)
    return DeviceArray(blk.ptr, shape, dtype, strides, device, sid, blk)


def empty(
    shape: Any,
    dtype: Any = np.float32,
    device: int | None = None,
    stream: Any = None,
    *,
    strides: Iterable[int] | None = None,
) -> DeviceArray:
    """A new, uninitialized device array.

    Parameters
    ----------
    shape : int or sequence of int
    dtype : dtype-like
        float16, bfloat16, float32 (default), float64, int8, int32, int64, uint8 or bool.
    device : int, optional
        Default the current device.
    stream : optional
        Stream the allocation is ordered on (and later freed on); default 0.
    strides : sequence of int, optional
        A dense layout in bytes (e.g. NHWC strides for an NCHW shape); default C order.

    Raises
    ------
    CudaUnavailableError
        Without a usable GPU (a ``RuntimeError`` saying one is needed and what was found).
    AllocationError
        Out of device memory (a ``MemoryError``), naming the bytes asked for and free.

    Notes
    -----
    The memory comes from the caching allocator (see :func:`cache_stats`). A call repeating
    earlier arguments with an int *device* and an int (or no) *stream* skips the argument
    validation: a cache hit then makes no CUDA call and costs a few microseconds.
    """
    if device is None and _layouts:  # entries exist only once a GPU was validated
        device = current_device()
    if type(device) is int and (stream is None or type(stream) is int):
        # fast path: arguments seen before, a device ordinal and an int stream (no object to
        # keep alive): the validated layout is a dict lookup away
        try:
            lay = _layouts.get((shape, dtype, strides, device))
        except TypeError:  # unhashable (a list): the slow path validates it
            lay = None
        if lay is not None and (stream is None or stream >= 0):
            shp, dt, st, nbytes = lay  # _new_array, inlined
            sid = stream or 0
            if not nbytes:
                return DeviceArray(0, shp, dt, st, device, sid, None)
            blk = allocator.memory_resource().allocate(nbytes, device, sid, None)
            return DeviceArray(blk.ptr, shp, dt, st, device, sid, blk)
    dt = checked_dtype(dtype)
    shp = as_shape(shape)
    st = None if strides is None else tuple(int(s) for s in strides)
    dev, sid = _resolve(device, stream, "pycudnn.empty")
    lay = _layout(shp, dt, st)
    if type(device) is int:
        if len(_layouts) >= _LAYOUTS_MAX:
            _layouts.clear()
        try:
            _layouts[(shape, dtype, strides, device)] = lay
        except TypeError:
            pass
        _layouts[(shp, dt, st, dev)] = lay
    return _new_array(lay, dev, sid, _keep(stream))


def zeros(
    shape: Any,
    dtype: Any = np.float32,
    device: int | None = None,
    stream: Any = None,
    *,
    strides: Iterable[int] | None = None,
) -> DeviceArray:
    """Like :func:`empty`, filled with zeros (a stream-ordered memset)."""
    out = empty(shape, dtype, device, stream, strides=strides)
    if out.nbytes:
        rt = _cuda.runtime()
        with DeviceContext(out.device):
            _cuda.check(rt.cudaMemsetAsync(out.ptr, 0, out.nbytes, out.stream), "cudaMemsetAsync")
    return out


def empty_like(
    a: Any, dtype: Any = None, *, device: int | None = None, stream: Any = None
) -> DeviceArray:
    """A new array with *a*'s shape and (if dense) layout; dtype and device default to *a*'s.

    The stream defaults to *a*'s when the new array is on *a*'s device, else to 0 (that
    device's legacy default stream): a stream belongs to one device, and memory allocated on
    another device's stream would come from that device's pool.
    """
    shape = tuple(a.shape)
    dt = checked_dtype(a.dtype if dtype is None else dtype)
    src_strides = tuple(getattr(a, "strides", None) or ())
    src_dt = np.dtype(a.dtype) if not isinstance(a, DeviceArray) else a.dtype
    strides = None
    if (
        len(src_strides) == len(shape)
        and is_dense(shape, src_strides, src_dt.itemsize)
        and not is_c_contiguous(shape, src_strides, src_dt.itemsize)
    ):
        # same dimension order, rescaled to the new item size
        strides = tuple(s // src_dt.itemsize * dt.itemsize for s in src_strides)
    if device is None:
        device = getattr(a, "device", None)
        device = device if isinstance(device, int) else None
    if stream is None and isinstance(a, DeviceArray) and device in (None, a.device):
        stream = a.stream
    return empty(shape, dt, device, stream, strides=strides)


def to_device(
    array: Any, stream: Any = None, *, device: int | None = None, dtype: Any = None
) -> DeviceArray:
    """Copy a host array (numpy, or anything ``numpy.asarray`` accepts) to a new device array.

    Parameters
    ----------
    array : array-like
        Host data. A dense layout (C, Fortran, NHWC-as-NCHW transposes) is kept; any other is
        made C-contiguous first. bfloat16 host arrays use ``ml_dtypes.bfloat16``. A device
        array is copied as is (same dtype), onto *device* when given (a peer copy from another
        device), else on its own device.
    stream : optional
        Stream to copy on (and that the new array is ordered on); default 0.
    device : int, optional
        Default the current device (for device data: the data's device).
    dtype : dtype-like, optional
        Convert on the host first.

    Returns
    -------
    DeviceArray

    Examples
    --------
    >>> x = pycudnn.to_device(np.ones((2, 3), np.float32))
    >>> x.get()
    array([[1., 1., 1.],
           [1., 1., 1.]], dtype=float32)
    """
    if isinstance(array, DeviceArray) or (
        not is_host_array(array)
        and (
            hasattr(array, "__cuda_array_interface__")
            or _dlpack.device_type_of(array) == _dlpack.KDL_CUDA
        )
    ):
        dev = None if device is None else check_device(device, "pycudnn.to_device")
        said = _device_said(array)
        src = _foreign(array, stream if dev is None or said == dev else 0)
        if dtype is not None and checked_dtype(dtype) != src.dtype:
            raise TypeError("to_device copies device data as is; it cannot convert its dtype")
        if dev is None or dev == src.device:
            return src.copy(stream=stream)
        out = empty_like(src, device=dev, stream=stream)  # another device: a peer copy
        return out.copy_(src, stream=out.stream)
    host = np.asarray(array, dtype=None if dtype is None else checked_dtype(dtype))
    dt = checked_dtype(host.dtype, argument="array.dtype")
    if host.dtype != dt:
        host = host.astype(dt)
    strides: tuple[int, ...] | None
    if is_dense(host.shape, host.strides, host.itemsize) and not host.flags.c_contiguous:
        strides = host.strides
    else:
        host = np.array(host, order="C", copy=not host.flags.c_contiguous)  # keeps 0-d
        strides = None
    dev, sid = _resolve(device, stream, "pycudnn.to_device")
    out = _new_array(_layout(host.shape, dt, strides), dev, sid, _keep(stream))
    if out.nbytes:
        rt = _cuda.runtime()
        base = host.ctypes.data + extent(host.shape, host.strides, host.itemsize)[0]
        with DeviceContext(dev):
            _cuda.check(
                rt.cudaMemcpyAsync(
                    out.ptr, base, out.nbytes, rt.cudaMemcpyKind.cudaMemcpyHostToDevice, sid
                ),
                "cudaMemcpyAsync",
            )
    return out
