"""The one XLA FFI handler: a ctypes callback ``XLA_FFI_Error* handler(XLA_FFI_CallFrame*)``.

Every target registered through :func:`register_handler` is one :class:`_Handler`: a ctypes
function pointer (kept alive for the process, as XLA keeps calling it) around a Python function.
On each call the handler

1. answers XLA's metadata request (a frame whose ``extension_start`` chain holds the metadata
   extension): the API version of the header the handler was checked against and its traits,
   nothing else; other extensions on the chain are passed over, as XLA's own handlers do;
2. checks the API table the frame points to (major version, size) the first time it sees it;
3. returns at once for the stages other than execution (instantiate, prepare, initialize; API
   0.4's record stage is called for a bundle's record handler only, which is not registered);
4. calls the Python function with a :class:`~._frame.Call`, which reads the frame
   (:mod:`._frame`) as the function asks for its parts, while the call lasts; a
   :class:`~._frame.FrameFunction` (the operations' executor) is handed the frame's header as
   read instead (``on_frame``), and builds a Call only when it needs one;
5. turns any Python exception into an ``XLA_FFI_Error`` carrying the exception's type and
   message, made through the API table's ``XLA_FFI_Error_Create`` (XLA raises it in the caller
   as a ``JaxRuntimeError``). An exception never crosses the C boundary.

The per-call path is one ``unpack`` of the frame's header (:data:`_FRAME`: what both kinds of
function need, the attributes' arrays included) and three comparisons (no extension, the table
checked before, the execute stage); anything else takes :meth:`_Handler._other`.

The structs are read through the mirrors of the layout generation :func:`check_abi` selected
for the installed header (:data:`._capi.GENERATIONS`): API 0.3 (jaxlib 0.10.x) or API 0.4
(jaxlib 0.11.x). What a call does is the same in both; the API table's error getter differs
(``XLA_FFI_Error_GetMessage`` or ``XLA_FFI_Error_GetDetails``), read where the stream getter
fails (:func:`._frame.take_error`).

JAX is imported only by :func:`register_handler`, :func:`ffi_call` and :func:`check_abi`.
"""

from __future__ import annotations

import atexit
import ctypes
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import _capi, _frame, _header
from ._header import AbiReport, UnsupportedJaxlibError

__all__ = [
    "HANDLER",
    "FfiTarget",
    "check_abi",
    "error_code",
    "ffi_call",
    "register_handler",
    "registered_targets",
]

#: ``XLA_FFI_Handler``: the C type of the callback
HANDLER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)

_FRAME_SIZE = _capi.struct_size(_capi.CallFrame)
_METADATA_SIZE = _capi.struct_size(_capi.Metadata)
_METADATA_EXTENSION_SIZE = _capi.struct_size(_capi.MetadataExtension)
_VERSION_SIZE = _capi.struct_size(_capi.ApiVersion)
_ERROR_ARGS_SIZE = _capi.struct_size(_capi.ErrorCreateArgs)
_EXECUTE = int(_capi.Stage.EXECUTE)
# what a call reads of its frame, in one unpack of its bytes (FrameFunction.on_frame's fields)
_FRAME = _frame.unpacker(
    _capi.CallFrame,
    [
        "extension_start",
        "api",
        "ctx",
        "stage",
        "args.size",
        "args.args",
        "rets.size",
        "rets.rets",
        "attrs.size",
        "attrs.types",
        "attrs.attrs",
    ],
)
_ATTRS_OFFSET = _capi.CallFrame.attrs.offset
_MEMORY = _frame.MEMORY
_METADATA = int(_capi.ExtensionType.METADATA)
_MAX_EXTENSIONS = 16  # the longest extension chain followed (XLA's has one entry)

# Python exception -> XLA error code (the first base class found; otherwise INTERNAL)
_CODES: tuple[tuple[type[BaseException], _capi.ErrorCode], ...] = (
    (NotImplementedError, _capi.ErrorCode.UNIMPLEMENTED),
    (MemoryError, _capi.ErrorCode.RESOURCE_EXHAUSTED),
    (ValueError, _capi.ErrorCode.INVALID_ARGUMENT),
    (TypeError, _capi.ErrorCode.INVALID_ARGUMENT),
    (IndexError, _capi.ErrorCode.OUT_OF_RANGE),
    (KeyboardInterrupt, _capi.ErrorCode.CANCELLED),
)


def error_code(exc: BaseException) -> _capi.ErrorCode:
    """The XLA error code a Python exception is reported with."""
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code
    return _capi.ErrorCode.INTERNAL


class _Handler:
    """The ctypes callback of one target (see the module's docstring for what a call does)."""

    def __init__(
        self,
        target: str,
        fn: Callable[[_frame.Call], object],
        buffer: type[_frame.Buffer],
        version: tuple[int, int],
        traits: int,
        generation: _capi.Generation,
    ):
        self.target = target
        self.fn = fn
        self.buffer = buffer
        self.version = version
        self.traits = traits
        self.generation = generation
        self.calls = 0  # invocations, stages and metadata requests included
        self._api_addr: int | None = None  # the API table checked last
        self._api: ctypes.Structure | None = None
        #: ``stream_of(ctx) -> int``: XLA's stream of a call, through the table checked last
        self.stream_of: Callable[[int | None], int] | None = None
        # a function that reads the frame itself is given it (no Call built per call)
        self._on_frame = fn.on_frame if isinstance(fn, _frame.FrameFunction) else None
        self._api_size = _capi.struct_size(generation.api)
        self.c_function = HANDLER(self)
        self.address: int = ctypes.cast(self.c_function, ctypes.c_void_p).value or 0

    def __call__(self, frame_addr: int) -> int | None:
        self.calls += 1  # (read at exit: see _drain_at_exit)
        try:
            f = _FRAME.unpack_from(_MEMORY, frame_addr)
            # the per-call path: no extension, the table checked before, the execute stage
            if f[0] or f[1] != self._api_addr or f[3] != _EXECUTE:
                return self._other(frame_addr, f)
            on_frame = self._on_frame
            if on_frame is not None:
                on_frame(self, frame_addr, f)
                return None
            call = _frame.Call(
                self.target,
                (f[4], f[5], f[6], f[7], frame_addr + _ATTRS_OFFSET),
                self.buffer,
                self._api,
                f[2],
                self.generation,
            )
            try:
                self.fn(call)
            finally:
                call.finish()
            return None
        except BaseException as exc:
            return self._error(frame_addr, exc)

    def _other(self, frame_addr: int, f: tuple) -> int | None:
        """A metadata request, a table not checked yet, a stage before execution, or an
        execution whose frame has extensions (passed over)."""
        ext, api_addr, _ctx, stage = f[:4]
        if ext:
            metadata = self._find_metadata(ext)
            if metadata:
                return self._metadata(metadata)
        if api_addr != self._api_addr:
            self._check_api(frame_addr, api_addr)
        if stage != _EXECUTE:
            return None
        if self._on_frame is not None:
            self._on_frame(self, frame_addr, f)
        else:
            self.run_call(frame_addr, f)
        return None

    def call(self, frame_addr: int, f: tuple) -> _frame.Call:
        """The :class:`~._frame.Call` of the frame at *frame_addr* (*f*: its header as read);
        its maker calls ``finish()`` when the call returns."""
        frame = (f[4], f[5], f[6], f[7], frame_addr + _ATTRS_OFFSET)
        return _frame.Call(self.target, frame, self.buffer, self._api, f[2], self.generation)

    def run_call(self, frame_addr: int, f: tuple) -> None:
        """Call the function with the frame's :class:`~._frame.Call`."""
        call = self.call(frame_addr, f)
        try:
            self.fn(call)
        finally:
            call.finish()

    def _check_api(self, frame_addr: int, api_addr: int) -> ctypes.Structure:
        frame = _capi.CallFrame.from_address(frame_addr)
        if not api_addr:
            raise UnsupportedJaxlibError(f"{self.target}: the call frame has no XLA_FFI_Api")
        api = self.generation.api.from_address(api_addr)
        major, minor = api.api_version.major_version, api.api_version.minor_version
        self._api = api  # the error path reports through this table (when it has the entry)
        if major != _capi.SUPPORTED_MAJOR:
            raise UnsupportedJaxlibError(
                f"{self.target}: XLA's FFI API is version {major}.{minor}; pycudnn.jax supports "
                f"major version {_capi.SUPPORTED_MAJOR} only"
            )
        if api.struct_size < self._api_size or frame.struct_size < _FRAME_SIZE:
            raise UnsupportedJaxlibError(
                f"{self.target}: XLA's FFI structs are smaller than pycudnn.jax's mirrors "
                f"(XLA_FFI_Api {api.struct_size} < {self._api_size} bytes or XLA_FFI_CallFrame "
                f"{frame.struct_size} < {_FRAME_SIZE} bytes; API version {major}.{minor})"
            )
        self.stream_of = _frame.stream_getter(self.target, api, self.generation)
        self._api_addr = api_addr
        return api

    def _find_metadata(self, ext_addr: int) -> int | None:
        """The address of the metadata extension on the chain starting at *ext_addr* (an
        ``XLA_FFI_Extension_Base*`` or ``XLA_FFI_InternalExtension*``: the same head), or None:
        the call is then an ordinary one, its other extensions passed over."""
        for _ in range(_MAX_EXTENSIONS):
            if not ext_addr:
                return None
            ext = _capi.Extension.from_address(ext_addr)
            if ext.type == _METADATA:
                return ext_addr
            ext_addr = ctypes.cast(ext.next, ctypes.c_void_p).value or 0
        raise UnsupportedJaxlibError(
            f"{self.target}: the call frame's extension chain is longer than {_MAX_EXTENSIONS}"
        )

    def _metadata(self, ext_addr: int) -> int | None:
        ext = _capi.MetadataExtension.from_address(ext_addr)
        if ext.extension_base.struct_size < _METADATA_EXTENSION_SIZE or not ext.metadata:
            raise UnsupportedJaxlibError(
                f"{self.target}: XLA's XLA_FFI_Metadata_Extension has "
                f"{ext.extension_base.struct_size} bytes, fewer than the "
                f"{_METADATA_EXTENSION_SIZE} pycudnn.jax reads, or no XLA_FFI_Metadata"
            )
        metadata = ext.metadata.contents
        if metadata.struct_size < _METADATA_SIZE:
            raise UnsupportedJaxlibError(
                f"{self.target}: XLA's XLA_FFI_Metadata has {metadata.struct_size} bytes, "
                f"fewer than the {_METADATA_SIZE} pycudnn.jax writes"
            )
        metadata.api_version.struct_size = _VERSION_SIZE
        metadata.api_version.major_version, metadata.api_version.minor_version = self.version
        metadata.traits = self.traits
        return None

    def _error(self, frame_addr: int, exc: BaseException) -> int | None:
        """An ``XLA_FFI_Error*`` carrying *exc*; never raises (a failure to make one is written
        to stderr, and the call then returns success: the only answer left)."""
        try:
            addr = _capi.CallFrame.from_address(frame_addr).api if frame_addr else None
            if not addr:
                raise RuntimeError("the call frame has no XLA_FFI_Api to report it through")
            text = f"pycudnn.jax target {self.target!r}: {type(exc).__name__}: {exc}"
            args = _capi.ErrorCreateArgs(
                _ERROR_ARGS_SIZE, None, text.encode("utf-8", "replace"), int(error_code(exc))
            )
            api = self.generation.api.from_address(addr)
            return api.XLA_FFI_Error_Create(ctypes.byref(args))  # type: ignore[attr-defined]
        except BaseException as inner:
            try:
                sys.stderr.write(
                    f"pycudnn.jax target {self.target!r}: {type(exc).__name__}: {exc} could not "
                    f"be reported to XLA ({type(inner).__name__}: {inner})\n"
                )
            except BaseException:
                pass
            return None


@dataclass(frozen=True)
class FfiTarget:
    """An XLA FFI target registered by :func:`register_handler`.

    Attributes
    ----------
    name : str
        The target's name (what ``jax.ffi.ffi_call`` names).
    platform : str
        The platform it was registered for (``"cpu"``, ``"CUDA"``, ...).
    function : callable
        The Python function each execution calls with a :class:`Call`.
    address : int
        The C function pointer XLA calls.
    api_version : tuple of int
        The XLA FFI API version the handler was checked against and reports to XLA.
    """

    name: str
    platform: str
    function: Callable[[_frame.Call], object]
    address: int
    api_version: tuple[int, int]
    _handler: _Handler = field(repr=False, compare=False)


_LOCK = threading.Lock()
_TARGETS: dict[tuple[str, str], FfiTarget] = {}  # (name, platform) -> target: alive for good


def _drain_at_exit() -> None:
    """Before JAX's own exit handlers (registered after them, it runs first): wait for the work
    that computes the live arrays. A computation still in flight may yet call a registered
    handler, which needs the interpreter's lock, while JAX's exit handler tears the backends
    down holding that lock: the process would hang at exit (seen on the CPU platform)."""
    try:
        import jax

        platforms = {d.platform for d in jax.devices()} | {"cpu"}
    except Exception:  # no backend: nothing in flight
        return
    for platform in platforms:
        try:
            arrays = jax.live_arrays(platform)
        except Exception:
            continue
        for a in arrays:
            try:
                a.block_until_ready()
            except Exception:  # deleted meanwhile, or its computation failed: not in flight
                pass
    # a computation whose results were all dropped is in no live array: wait (the lock released)
    # until the handlers have been called no more for a while, at most _SETTLE_MAX seconds
    seen, quiet, waited = _call_count(), 0.0, 0.0
    while quiet < _SETTLE_QUIET and waited < _SETTLE_MAX:
        time.sleep(_SETTLE_STEP)
        waited += _SETTLE_STEP
        now = _call_count()
        quiet = quiet + _SETTLE_STEP if now == seen else 0.0
        seen = now


_SETTLE_STEP, _SETTLE_QUIET, _SETTLE_MAX = 0.01, 0.05, 2.0


def _call_count() -> int:
    with _LOCK:
        return sum(t._handler.calls for t in _TARGETS.values())


def check_abi() -> AbiReport:
    """Check the XLA FFI of the installed jaxlib against ``pycudnn.jax``'s struct mirrors.

    Reads ``jax.ffi.include_dir()``'s ``xla/ffi/api/c_api.h``: the API's major version must be
    the one mirrored; the header's layout generation is selected by the structs it declares
    (API 0.3, jaxlib 0.10.x: ``XLA_FFI_Extension_Base`` and ``XLA_FFI_Error_GetMessage``; API
    0.4, jaxlib 0.11.x: ``XLA_FFI_InternalExtension`` and ``XLA_FFI_Error_GetDetails``); every
    struct of that generation the handler reads or writes must have the mirror's fields first,
    at the same offsets, with the same sizes, and the enum values the handler uses must be the
    header's (:func:`register_handler` runs this check first).

    Returns
    -------
    AbiReport
        The jaxlib version, the header, its API version, the checked structs' sizes and the
        layout generation selected.

    Raises
    ------
    UnsupportedJaxlibError
        On any difference, naming the jaxlib version and the struct.
    """
    import jax
    import jaxlib

    return _header.check(jax.ffi.include_dir(), jaxlib.__version__)


def _is_cpu(platform: str) -> bool:
    return platform.lower() in ("cpu", "host")


def register_handler(
    name: str,
    function: Callable[[_frame.Call], object],
    *,
    platform: str = "CUDA",
    command_buffer_compatible: bool = False,
) -> FfiTarget:
    """Register *function* as the XLA FFI target *name*, through pycudnn's one ctypes handler.

    Each execution of a ``jax.ffi.ffi_call(name, ...)`` (jitted or not) calls
    ``function(call)`` with a :class:`Call`: the operand and result buffers (dtypes, dims,
    pointers), the attributes, and XLA's stream on a GPU. The function writes the results; an
    exception it raises fails the JAX computation with a ``JaxRuntimeError`` carrying the
    exception's type and message (the process goes on).

    Parameters
    ----------
    name : str
        The target's name, unique per platform in the process.
    function : callable
        ``function(call) -> None``; it runs on the thread XLA executes on.
    platform : str
        ``"CUDA"`` (default), or ``"cpu"`` (buffers are then host memory: :class:`HostBuffer`).
    command_buffer_compatible : bool
        Tell XLA the function always launches the same device work for the same attributes, so
        XLA may capture it in a CUDA graph. Default False.

    Returns
    -------
    FfiTarget
        The target (kept alive for the process: XLA keeps the function pointer).

    Raises
    ------
    UnsupportedJaxlibError
        The installed jaxlib's XLA FFI is not the one mirrored (:func:`check_abi`).
    ValueError
        *name* is already registered by ``pycudnn.jax`` for *platform*.
    """
    if not callable(function):
        raise TypeError(f"register_handler: function must be callable, got {function!r}")
    if not isinstance(name, str) or not name:
        raise TypeError(f"register_handler: name must be a non-empty str, got {name!r}")
    report = check_abi()
    import jax

    key = (name, platform.lower())
    with _LOCK:
        if key in _TARGETS:
            raise ValueError(
                f"register_handler: {name!r} is already registered for platform {platform!r} "
                "(XLA keeps the first handler of a name: register another name)"
            )
        buffer = _frame.HostBuffer if _is_cpu(platform) else _frame.DeviceBuffer
        traits = 1 if command_buffer_compatible else 0
        generation = _capi.generation(report.generation)
        handler = _Handler(name, function, buffer, report.api_version, traits, generation)
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(handler.c_function), platform=platform)
        target = FfiTarget(name, platform, function, handler.address, report.api_version, handler)
        if not _TARGETS:
            atexit.register(_drain_at_exit)
        _TARGETS[key] = target
    return target


def registered_targets() -> tuple[FfiTarget, ...]:
    """The targets :func:`register_handler` registered in this process, oldest first."""
    with _LOCK:
        return tuple(_TARGETS.values())


def ffi_call(
    target: FfiTarget | str,
    result_shape_dtypes: Any | Sequence[Any],
    **kwargs: Any,
) -> Callable[..., Any]:
    """``jax.ffi.ffi_call`` of a target registered by :func:`register_handler`.

    Parameters
    ----------
    target : FfiTarget or str
        The target, or its name.
    result_shape_dtypes
        As ``jax.ffi.ffi_call``'s: a ``jax.ShapeDtypeStruct`` (one result) or a sequence.
    **kwargs
        ``jax.ffi.ffi_call``'s keywords (``vmap_method``, ``input_output_aliases``, ...).

    Returns
    -------
    callable
        ``f(*operands, **attributes)``: the attributes reach the function as ``call.attrs``.

    Raises
    ------
    ValueError
        *target* names no target registered by ``pycudnn.jax``.
    """
    name = target.name if isinstance(target, FfiTarget) else target
    with _LOCK:
        known = any(n == name for n, _ in _TARGETS)
    if not known:
        raise ValueError(
            f"ffi_call: {name!r} is not a target registered by pycudnn.jax.register_handler "
            f"(registered: {sorted({n for n, _ in _TARGETS})})"
        )
    import jax

    return jax.ffi.ffi_call(name, result_shape_dtypes, **kwargs)
