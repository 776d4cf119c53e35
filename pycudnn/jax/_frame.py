"""A call frame read into Python: buffers with dtypes and dims, attributes, the stream.

XLA hands a handler an ``XLA_FFI_CallFrame*`` (:mod:`._capi`); :func:`read` turns its arguments
and results into :class:`HostBuffer` (the CPU platform) or :class:`DeviceBuffer` records and its
attributes into Python values, and :class:`Call` carries them to the Python function. The
frame's memory is XLA's and lives for the call only: buffers are views (their data pointer),
attributes are copies.

The operations' per-call path reads less, straight from XLA's memory (:data:`MEMORY`): the one
string attribute (:func:`sole_string`), the pointers and signature (:func:`decoder`: one reader
per arity, made once) and the stream (:func:`stream_getter`); a :class:`FrameFunction` is how a
registered function asks the handler for the frame itself.

Stdlib and numpy only (no JAX).
"""

from __future__ import annotations

import ctypes
import math
import struct
import sys
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from . import _capi

__all__ = [
    "Buffer",
    "Call",
    "DeviceBuffer",
    "FrameFunction",
    "HostBuffer",
    "decoder",
    "ffi_code",
    "numpy_dtype",
    "read_attrs",
    "read_buffers",
    "signature",
    "sole_string",
    "stream_getter",
    "take_error",
    "unpacker",
]

# XLA_FFI_DataType -> numpy dtype name (bfloat16 and the float8s: ml_dtypes', which JAX needs)
_NAMES = {
    _capi.DataType.PRED: "bool",
    _capi.DataType.S8: "int8",
    _capi.DataType.S16: "int16",
    _capi.DataType.S32: "int32",
    _capi.DataType.S64: "int64",
    _capi.DataType.U8: "uint8",
    _capi.DataType.U16: "uint16",
    _capi.DataType.U32: "uint32",
    _capi.DataType.U64: "uint64",
    _capi.DataType.F16: "float16",
    _capi.DataType.F32: "float32",
    _capi.DataType.F64: "float64",
    _capi.DataType.C64: "complex64",
    _capi.DataType.C128: "complex128",
    _capi.DataType.BF16: "bfloat16",
    _capi.DataType.F8E5M2: "float8_e5m2",
    _capi.DataType.F8E4M3FN: "float8_e4m3fn",
}
_DTYPES: dict[int, np.dtype | None] = {}


def ffi_code(dtype: Any) -> int:
    """The ``XLA_FFI_DataType`` of a numpy dtype (``ValueError`` when XLA's FFI has none)."""
    name = np.dtype(dtype).name
    for code, n in _NAMES.items():
        if n == name:
            return int(code)
    raise ValueError(f"numpy dtype {name} has no XLA_FFI_DataType")


def numpy_dtype(code: int) -> np.dtype | None:
    """The numpy dtype of an ``XLA_FFI_DataType`` (None when numpy has none, e.g. a token)."""
    try:
        return _DTYPES[code]
    except KeyError:
        pass
    name = _NAMES.get(code)  # type: ignore[call-overload]
    dt = None
    if name is not None:
        try:
            dt = np.dtype(name)
        except TypeError:
            try:
                import ml_dtypes

                dt = np.dtype(getattr(ml_dtypes, name))
            except (ImportError, AttributeError):
                dt = None
    _DTYPES[code] = dt
    return dt


class Buffer(NamedTuple):
    """An argument or result of an FFI call: XLA's memory, dense and row-major (the layouts
    ``jax.ffi.ffi_call`` gives by default), valid during the call only.

    Attributes
    ----------
    ptr : int
        Address of the first element (0 for an empty buffer).
    shape : tuple of int
        The dims XLA passed.
    dtype : numpy.dtype or None
        None for a type numpy has no dtype for (see ``ffi_dtype``).
    ffi_dtype : int
        The ``XLA_FFI_DataType`` code.
    """

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype | None
    ffi_dtype: int

    @property
    def nbytes(self) -> int:
        """Bytes of the buffer (0 when its dtype is unknown)."""
        if self.dtype is None:
            return 0
        return math.prod(self.shape) * self.dtype.itemsize


class HostBuffer(Buffer):
    """A :class:`Buffer` in host memory (a handler registered for the ``"cpu"`` platform)."""

    __slots__ = ()

    def numpy(self) -> np.ndarray:
        """A writable numpy view of the buffer (no copy; valid during the call only)."""
        if self.dtype is None:
            raise TypeError(f"XLA data type {self.ffi_dtype} has no numpy dtype")
        n = self.nbytes
        if n == 0 or not self.ptr:
            return np.empty(self.shape, self.dtype)
        flat = np.frombuffer((ctypes.c_char * n).from_address(self.ptr), self.dtype)
        return flat if len(self.shape) == 1 else flat.reshape(self.shape)


class DeviceBuffer(Buffer):
    """A :class:`Buffer` in device memory (a handler registered for a GPU platform); exposes
    ``__cuda_array_interface__`` (v3, no stream to wait for: the call runs on XLA's), so
    pycudnn's functions take it as an operand or an ``out=``."""

    __slots__ = ()

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        if self.dtype is None:
            raise TypeError(f"XLA data type {self.ffi_dtype} has no numpy dtype")
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.ptr, False),
            "strides": None,
            "version": 3,
            "stream": None,
        }


def _scalar(addr: int) -> Any:
    s = _capi.Scalar.from_address(addr)
    dt = numpy_dtype(s.dtype)
    if dt is None:
        raise TypeError(f"a scalar attribute of XLA data type {s.dtype} has no numpy dtype")
    value = np.frombuffer(ctypes.string_at(s.value, dt.itemsize), dt)[0]
    return value if dt.kind == "f" and dt.itemsize <= 2 else value.item()


def _array(addr: int) -> np.ndarray:
    a = _capi.Array.from_address(addr)
    dt = numpy_dtype(a.dtype)
    if dt is None:
        raise TypeError(f"an array attribute of XLA data type {a.dtype} has no numpy dtype")
    if not a.size:
        return np.empty(0, dt)
    return np.frombuffer(ctypes.string_at(a.data, a.size * dt.itemsize), dt).copy()


def _span(addr: int) -> bytes:
    s = _capi.ByteSpan.from_address(addr)
    return ctypes.string_at(s.ptr, s.len) if s.len else b""


def read_attrs(attrs: _capi.Attrs) -> dict[str, Any]:
    """The attributes of a call (``XLA_FFI_Attrs``) as a dict: scalars as Python ``bool``,
    ``int`` and ``float`` (float16/bfloat16 as numpy scalars), strings as ``str``, arrays as
    one-dimensional numpy arrays (copies), dictionaries as dicts."""
    n = attrs.size
    if not n:
        return {}
    types, names, values = attrs.types[:n], attrs.names[:n], attrs.attrs[:n]
    out: dict[str, Any] = {}
    for kind, name, addr in zip(types, names, values, strict=True):
        key = ctypes.string_at(name.contents.ptr, name.contents.len).decode()
        if kind == _capi.AttrType.SCALAR:
            out[key] = _scalar(addr)
        elif kind == _capi.AttrType.STRING:
            out[key] = _span(addr).decode("utf-8", "replace")
        elif kind == _capi.AttrType.ARRAY:
            out[key] = _array(addr)
        elif kind == _capi.AttrType.DICTIONARY:
            out[key] = read_attrs(_capi.Attrs.from_address(addr))
        else:
            raise TypeError(f"attribute {key!r} has the XLA attribute type {kind}, unknown here")
    return out


def unpacker(cls: type[ctypes.Structure], paths: list[str]) -> struct.Struct:
    """A ``struct.Struct`` reading the fields *paths* (``"args.size"``: a nested field) of the
    mirror *cls* from its raw bytes, in that order, at the mirror's offsets (one ``unpack`` is
    cheaper than a ctypes attribute per field)."""
    codes = {ctypes.c_int: "i", ctypes.c_int64: "q", ctypes.c_size_t: "Q", ctypes.c_uint32: "I"}
    found = []
    for path in paths:
        owner, offset = cls, 0
        for part in path.split("."):
            desc = getattr(owner, part)
            offset += desc.offset
            ctype = dict(owner._fields_)[part]
            owner = ctype
        code = codes.get(ctype, "Q")  # pointers and function pointers: an address
        if code == "Q" and ctypes.sizeof(ctype) != 8:
            raise TypeError(f"{cls.__name__}.{path}: only 64-bit addresses are read")
        found.append((offset, code))
    fmt, at = "=", 0
    for offset, code in sorted(found):
        if offset < at:
            raise ValueError(f"{cls.__name__}: overlapping fields {paths}")
        fmt += "x" * (offset - at) + code
        at = offset + struct.calcsize("=" + code)
    order = [sorted(found).index(f) for f in found]
    if order != list(range(len(found))):
        raise ValueError(f"{cls.__name__}: give the fields {paths} in memory order")
    return struct.Struct(fmt)


#: an XLA_FFI_Buffer's dtype, data, rank, dims
_BUFFER = unpacker(_capi.Buffer, ["dtype", "data", "rank", "dims"])
_BUFFER_SIZE = _BUFFER.size
_ADDRESSES: dict[int, struct.Struct] = {}  # count -> "=nQ"
_new = tuple.__new__

#: the process's memory as one read-only-by-use buffer: ``struct.unpack_from(MEMORY, address)``
#: reads a frame's fields at a quarter of ``ctypes.string_at``'s cost (a foreign call each), on
#: the per-call path; like ``string_at`` it trusts the address XLA passed
MEMORY = memoryview((ctypes.c_char * sys.maxsize).from_address(0)).cast("B")


def _addresses(addr: int, count: int) -> tuple[int, ...]:
    """*count* 64-bit words at *addr*."""
    s = _ADDRESSES.get(count)
    if s is None:
        s = _ADDRESSES[count] = struct.Struct(f"={count}q")
    return s.unpack_from(MEMORY, addr)


def read_buffers(count: int, pointers: int, kind: type[Buffer]) -> tuple[Buffer, ...]:
    """The *count* ``XLA_FFI_Buffer*`` of an args or rets array at address *pointers*, as *kind*
    records."""
    if not count:
        return ()
    out = []
    for addr in _addresses(pointers, count):
        code, data, rank, dims = _BUFFER.unpack_from(MEMORY, addr)
        shape = _addresses(dims, rank) if rank else ()
        out.append(_new(kind, (data, shape, _DTYPES.get(code) or numpy_dtype(code), code)))
    return tuple(out)


#: an XLA_FFI_Attrs' size and its three arrays (types, names, values)
_ATTRS = unpacker(_capi.Attrs, ["size", "types", "names", "attrs"])
_SPAN = unpacker(_capi.ByteSpan, ["ptr", "len"])
_STRING = int(_capi.AttrType.STRING)


def signature(count: int, pointers: int, ptrs: list[int], sig: list[Any]) -> None:
    """Append the data pointers of the *count* ``XLA_FFI_Buffer*`` at *pointers* to *ptrs*, and
    to *sig* what a call specialized on them depends on: per buffer its dtype code, its dims
    (raw bytes: hashable, no unpack) and its pointer's residue mod 16 (the alignment cuDNN's
    plans are built for). :func:`decoder`'s functions read the same, faster."""
    if not count:
        return
    for addr in _addresses(pointers, count):
        code, data, rank, dims = _BUFFER.unpack_from(MEMORY, addr)
        ptrs.append(data)
        sig.append(code)
        sig.append(MEMORY[dims : dims + 8 * rank].tobytes())
        sig.append(data & 15)


_DECODERS: dict[tuple[int, int], Callable[[int, int], tuple[tuple[int, ...], tuple]]] = {}
_MAX_UNROLLED = 16  # buffers per call: more are read by the loop of signature()


def decoder(n_args: int, n_rets: int) -> Callable[[int, int], tuple[tuple[int, ...], tuple]]:
    """``decode(args, rets) -> (pointers, signature)`` for calls of *n_args* operands and
    *n_rets* results (the addresses of their ``XLA_FFI_Buffer*`` arrays): what
    :func:`signature` appends for both, as tuples, read by straight-line code made once per
    arity (the per-call path: no loop, no list, one ``unpack`` per array and per buffer)."""
    key = (n_args, n_rets)
    fn = _DECODERS.get(key)
    if fn is None:
        fn = _DECODERS.setdefault(key, _make_decoder(n_args, n_rets))
    return fn


def _make_decoder(n_args: int, n_rets: int) -> Callable[[int, int], tuple[tuple[int, ...], tuple]]:
    if n_args < 0 or n_rets < 0:
        raise ValueError(f"a call frame with {n_args} operands and {n_rets} results")
    if n_args + n_rets > _MAX_UNROLLED:

        def looped(args: int, rets: int) -> tuple[tuple[int, ...], tuple]:
            ptrs: list[int] = []
            sig: list[Any] = []
            signature(n_args, args, ptrs, sig)
            signature(n_rets, rets, ptrs, sig)
            return tuple(ptrs), tuple(sig)

        return looped
    # generated from fixed names only (the counts are ints): e.g. for one operand and one result
    #   b0, = A1(M, args); b1, = A1(M, rets)
    #   c0, p0, r0, d0 = B(M, b0); c1, p1, r1, d1 = B(M, b1)
    #   return (p0, p1), (c0, M[d0:d0 + 8 * r0].tobytes(), p0 & 15, c1, ...)
    env: dict[str, Any] = {"M": MEMORY, "B": _BUFFER.unpack_from}
    lines = ["def decode(args, rets):"]
    names = []
    for base, count, at in ((0, n_args, "args"), (n_args, n_rets, "rets")):
        if count:
            env[f"A{count}"] = struct.Struct(f"={count}Q").unpack_from
            got = ", ".join(f"b{base + i}" for i in range(count))
            lines.append(f"    {got}, = A{count}(M, {at})")
            names += range(base, base + count)
    for i in names:
        lines.append(f"    c{i}, p{i}, r{i}, d{i} = B(M, b{i})")
    ptrs = "".join(f"p{i}, " for i in names)
    sig = "".join(f"c{i}, M[d{i} : d{i} + 8 * r{i}].tobytes(), p{i} & 15, " for i in names)
    lines.append(f"    return ({ptrs}), ({sig})")
    exec("\n".join(lines), env)  # our own text, of fixed names and counts
    return env["decode"]


def sole_string(n: int, types: int, values: int) -> bytes | None:
    """The value of an ``XLA_FFI_Attrs``' one attribute (*n*, and its ``types`` and ``attrs``
    arrays' addresses) as bytes when it is a string, else None (other attributes, or none)."""
    if n != 1 or _INT32.unpack_from(MEMORY, types)[0] != _STRING:
        return None
    ptr, length = _SPAN.unpack_from(MEMORY, _ADDRESS.unpack_from(MEMORY, values)[0])
    return MEMORY[ptr : ptr + length].tobytes()


def stream_getter(
    target: str, api: ctypes.Structure, generation: _capi.Generation
) -> Callable[[int | None], int]:
    """``get(ctx) -> int``: XLA's stream of a call, through the API table *api*'s
    ``XLA_FFI_Stream_Get`` (the handler makes one per table when it checks the table); a
    ``RuntimeError`` carrying XLA's message where it has none (the CPU platform).

    The per-call path: a closure (cheaper to call than an object's ``__call__``); the arguments
    are a per-thread struct filled in place (no allocation), and the function is called without
    releasing the interpreter's lock (a ``PYFUNCTYPE``: the getter is a lookup in XLA's context,
    and releasing and retaking the lock costs more).
    """
    offset = type(api).XLA_FFI_Stream_Get.offset  # type: ignore[attr-defined]
    address = ctypes.c_void_p.from_address(ctypes.addressof(api) + offset).value
    if not address:
        raise RuntimeError(f"{target}: XLA's API table has no XLA_FFI_Stream_Get")
    xla_get = _STREAM_GET(address)
    local = _LOCAL

    def get(ctx: int | None) -> int:
        try:
            args, ref = local.stream_args
        except AttributeError:
            args, ref = _thread_stream_args()
        args.ctx = ctx
        error = xla_get(ref)
        if error:
            message = take_error(api, error, generation)
            raise RuntimeError(f"XLA has no stream for {target}: {message}")
        return args.stream or 0

    return get


# no argtypes: ctypes passes the byref() as it is, at half the cost of checking it against a
# POINTER argtype (the getter only ever passes its own StreamGetArgs)
_STREAM_GET = ctypes.PYFUNCTYPE(ctypes.c_void_p)
_LOCAL = threading.local()


def _thread_stream_args() -> tuple[ctypes.Structure, Any]:
    args = _capi.StreamGetArgs(_capi.struct_size(_capi.StreamGetArgs), None, None, None)
    _LOCAL.stream_args = (args, ctypes.byref(args))
    return _LOCAL.stream_args


class FrameFunction:
    """A registered function that reads the call frame itself (the operations' executor): the
    handler calls :meth:`on_frame` instead of building a :class:`Call`, and a function that
    needs one builds it through the handler (``handler.call(frame_addr, fields)``, or
    ``handler.run_call(frame_addr, fields)`` to run the function on it)."""

    __slots__ = ()

    def __call__(self, call: Call) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def on_frame(self, handler: Any, frame_addr: int, fields: tuple) -> None:
        """Run the call whose frame is at *frame_addr*; *fields* are the frame's header as the
        handler read it (``_handler._FRAME``: extension, API table, context, stage, operand
        count and array, result count and array, attribute count, types and values)."""
        raise NotImplementedError


class Call:
    """One execution of a registered handler, as its Python function sees it.

    What the frame holds is read when first asked for (an operation that needs only its
    pointers pays for nothing else), and only while the call runs: a read after the function
    returned raises ``RuntimeError`` (XLA's frame is gone by then).

    Attributes
    ----------
    target : str
        The FFI target's name.
    """

    __slots__ = (
        "_api",
        "_args",
        "_attrs",
        "_ctx",
        "_frame",
        "_generation",
        "_kind",
        "_live",
        "_rets",
        "_stream",
        "target",
    )

    def __init__(
        self,
        target: str,
        frame: tuple[int, int, int, int, int],
        kind: type[Buffer],
        api: ctypes.Structure,
        ctx: int | None,
        generation: _capi.Generation,
    ):
        self.target = target
        self._frame = frame  # n_args, args, n_rets, rets, the address of XLA_FFI_Attrs
        self._kind = kind
        self._api = api  # the generation's XLA_FFI_Api mirror over XLA's table
        self._ctx = ctx
        self._generation = generation
        self._args: tuple[Buffer, ...] | None = None
        self._rets: tuple[Buffer, ...] | None = None
        self._attrs: dict[str, Any] | None = None
        self._stream: int | None = None
        self._live = True

    def finish(self) -> None:
        """Mark the call returned: the frame is XLA's no longer (the handler calls this)."""
        self._live = False

    def _check_live(self) -> None:
        if not self._live:
            raise RuntimeError(
                f"{self.target}: the call frame was read after the call returned (XLA's frame "
                "lives for the call only: read what is needed inside the function)"
            )

    @property
    def args(self) -> tuple[Buffer, ...]:
        """The operands, in ``ffi_call`` order (:class:`HostBuffer` on the CPU platform,
        :class:`DeviceBuffer` on a GPU)."""
        if self._args is None:
            self._check_live()
            self._args = read_buffers(self._frame[0], self._frame[1], self._kind)
        return self._args

    @property
    def rets(self) -> tuple[Buffer, ...]:
        """The results, to be written."""
        if self._rets is None:
            self._check_live()
            self._rets = read_buffers(self._frame[2], self._frame[3], self._kind)
        return self._rets

    @property
    def attrs(self) -> dict[str, Any]:
        """The keyword attributes given to the ``ffi_call``'d function (copies)."""
        if self._attrs is None:
            self._check_live()
            self._attrs = read_attrs(_capi.Attrs.from_address(self._frame[4]))
        return self._attrs

    def signature(self) -> tuple[tuple[int, ...], tuple]:
        """``(pointers, signature)``: the data pointers of the operands then the results, and a
        hashable record of their dtypes, dims and pointer residues mod 16 (:func:`signature`),
        read without building buffer records (an operation's per-call path reads these, the
        one attribute's text (:meth:`sole_string`) and the stream, and nothing else)."""
        self._check_live()
        n_args, args, n_rets, rets, _attrs = self._frame
        return decoder(n_args, n_rets)(args, rets)

    def sole_string(self) -> bytes:
        """The value of the call's one attribute, a string, as bytes, read alone (its name is
        not read: one string attribute is how ``pycudnn.jax``'s operations carry their static
        options); a ``TypeError`` when the call has other attributes or a non-string one."""
        self._check_live()
        n, types, _names, values = _ATTRS.unpack_from(MEMORY, self._frame[4])
        text = sole_string(n, types, values)
        if text is None:
            raise TypeError(
                f"{self.target}: expected one string attribute, got the attributes "
                f"{sorted(self.attrs)}"
            )
        return text

    @property
    def stream(self) -> int:
        """XLA's stream for this call (a ``cudaStream_t`` as an int on CUDA), asked of XLA's API
        table on first use; a ``RuntimeError`` carrying XLA's message where it has none (the
        CPU platform)."""
        if self._stream is None:
            self._check_live()
            args = _capi.StreamGetArgs(_STREAM_ARGS_SIZE, None, self._ctx, None)
            error = self._api.XLA_FFI_Stream_Get(ctypes.byref(args))  # type: ignore[attr-defined]
            if error:
                message = take_error(self._api, error, self._generation)
                raise RuntimeError(f"XLA has no stream for {self.target}: {message}")
            self._stream = args.stream or 0
        return self._stream

    def __repr__(self) -> str:
        if not self._live:
            return f"Call({self.target!r}, returned)"
        return f"Call({self.target!r}, args={self.args}, rets={self.rets}, attrs={self.attrs})"


_INT32 = struct.Struct("=i")
_ADDRESS = struct.Struct("=Q")
_STREAM_ARGS_SIZE = _capi.struct_size(_capi.StreamGetArgs)


def take_error(api: ctypes.Structure, error: int, generation: _capi.Generation) -> str:
    """The message of an ``XLA_FFI_Error*`` returned by an API function, read through the
    table *api* with *generation*'s getter (API 0.4's also gives the code, appended as
    `` [CODE]``); destroys the error."""
    try:
        message, code = generation.error_details(api, error)
    finally:
        api.XLA_FFI_Error_Destroy(  # type: ignore[attr-defined]
            ctypes.byref(
                _capi.ErrorDestroyArgs(_capi.struct_size(_capi.ErrorDestroyArgs), None, error)
            )
        )
    if code is not None:
        try:
            message += f" [{_capi.ErrorCode(code).name}]"
        except ValueError:
            message += f" [code {code}]"
    return message
