"""The ctypes mirrors against jaxlib's XLA FFI header, and the handler on call frames built here
(no XLA in between): refusals of other layouts and versions, the metadata answer, the stages,
the API table's stream and error functions."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from pycudnn.jax import (  # noqa: E402
    UnsupportedJaxlibError,
    _capi,
    _frame,
    _handler,
    _header,
)

pytestmark = pytest.mark.jax
HEADER = Path(jax.ffi.include_dir()) / _header.HEADER


def _include(tmp_path: Path, text: str) -> str:
    path = tmp_path / _header.HEADER
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return str(tmp_path)


def test_the_installed_header_matches_the_mirrors():
    report = _header.check(jax.ffi.include_dir(), "x.y")
    assert set(report.structs) == set(_capi.MIRRORS)
    parsed = _header.parse(HEADER.read_text())
    for name in _capi.WRITTEN:
        assert parsed.sizes[name] == _capi.struct_size(_capi.MIRRORS[name]), name


def test_a_field_inserted_in_a_mirrored_struct_is_refused(tmp_path):
    text = HEADER.read_text()
    changed = re.sub(
        r"(struct XLA_FFI_Buffer \{\s*size_t struct_size;\s*XLA_FFI_Extension_Base\* "
        r"extension_start;)",
        r"\1\n  int64_t flags;",
        text,
    )
    assert changed != text
    with pytest.raises(UnsupportedJaxlibError, match=r"jaxlib 9\.9\.9 .*XLA_FFI_Buffer field 2"):
        _header.check(_include(tmp_path, changed), "9.9.9")


def test_a_grown_struct_we_write_is_refused_and_a_grown_struct_we_read_is_not(tmp_path):
    text = HEADER.read_text()
    grown_read = text.replace("XLA_FFI_DEFINE_STRUCT_TRAITS(XLA_FFI_Buffer, dims);", "").replace(
        "  int64_t* dims;  // length == rank\n", "  int64_t* dims;\n  int64_t* strides;\n"
    )
    assert "strides" in grown_read
    _header.check(_include(tmp_path / "a", grown_read), "9.9.9")  # appended: still readable
    grown_written = text.replace(
        "  XLA_FFI_Error_Code errc;\n};\n\nXLA_FFI_DEFINE_STRUCT_TRAITS(XLA_FFI_Error_Create_Args,"
        " errc);",
        "  XLA_FFI_Error_Code errc;\n  int64_t payload;\n};\n\n"
        "XLA_FFI_DEFINE_STRUCT_TRAITS(XLA_FFI_Error_Create_Args, payload);",
    )
    assert "payload" in grown_written
    with pytest.raises(UnsupportedJaxlibError, match="XLA_FFI_Error_Create_Args is written"):
        _header.check(_include(tmp_path / "b", grown_written), "9.9.9")


def test_another_major_version_in_the_header_is_refused(tmp_path):
    text = re.sub(
        r"#define XLA_FFI_API_MAJOR \d+", "#define XLA_FFI_API_MAJOR 1", HEADER.read_text()
    )
    with pytest.raises(UnsupportedJaxlibError, match=r"jaxlib 9\.9\.9 .*version 1\.\d+"):
        _header.check(_include(tmp_path, text), "9.9.9")


def test_a_missing_header_is_refused(tmp_path):
    with pytest.raises(UnsupportedJaxlibError, match=r"jaxlib 9\.9\.9 .*cannot be read"):
        _header.check(str(tmp_path), "9.9.9")


def test_a_wrong_mirror_is_refused(monkeypatch):
    class Buffer(ctypes.Structure):
        _fields_ = [
            ("struct_size", ctypes.c_size_t),
            ("extension_start", ctypes.c_void_p),
            ("dtype", ctypes.c_int64),  # the header's is an enum (4 bytes)
        ]

    monkeypatch.setitem(_capi.MIRRORS, "XLA_FFI_Buffer", Buffer)
    with pytest.raises(UnsupportedJaxlibError, match="XLA_FFI_Buffer field 2: ours is dtype"):
        _header.check(jax.ffi.include_dir(), "x.y")


# -- the handler on frames built here ------------------------------------------------------------
class FakeXla:
    """An ``XLA_FFI_Api`` table whose error and stream functions are Python callbacks."""

    def __init__(self, major=0, minor=3, stream=0x5EED):
        self.messages: list[tuple[int, str]] = []
        self.destroyed: list[int] = []

        def create(args):
            self.messages.append((args.contents.errc, args.contents.message.decode()))
            return 0xE000 + len(self.messages)

        def get_message(args):
            args.contents.message = b"no stream here"

        def destroy(args):
            self.destroyed.append(args.contents.error)

        def stream_get(args):
            if stream is None:
                return 0xEEEE
            args.contents.stream = stream
            return None

        self._callbacks = [
            _capi.ErrorCreate(create),
            _capi.ErrorGetMessage(get_message),
            _capi.ErrorDestroy(destroy),
            _capi.StreamGet(stream_get),
        ]
        self.api = _capi.Api()
        self.api.struct_size = _capi.struct_size(_capi.Api)
        self.api.api_version.major_version = major
        self.api.api_version.minor_version = minor
        (
            self.api.XLA_FFI_Error_Create,
            self.api.XLA_FFI_Error_GetMessage,
            self.api.XLA_FFI_Error_Destroy,
            self.api.XLA_FFI_Stream_Get,
        ) = self._callbacks

    def frame(self, args=(), rets=(), stage=_capi.Stage.EXECUTE):
        """A call frame over numpy arrays (kept alive on the returned frame)."""
        frame = _capi.CallFrame()
        frame.struct_size = _capi.struct_size(_capi.CallFrame)
        frame.api = ctypes.addressof(self.api)
        frame.stage = stage
        keep = []
        for side, arrays in (("args", args), ("rets", rets)):
            bufs = [_buffer(a, keep) for a in arrays]
            ptrs = (ctypes.c_void_p * max(len(bufs), 1))(*[ctypes.addressof(b) for b in bufs])
            kinds = (ctypes.c_int * max(len(bufs), 1))(*[1] * len(bufs))
            part = getattr(frame, side)
            part.size = len(bufs)
            part.types = ctypes.cast(kinds, ctypes.POINTER(ctypes.c_int))
            setattr(part, side, ctypes.cast(ptrs, ctypes.POINTER(ctypes.c_void_p)))
            keep += [bufs, ptrs, kinds]
        frame._keep = keep  # type: ignore[attr-defined]
        return frame


def _buffer(a: np.ndarray, keep: list) -> _capi.Buffer:
    dims = (ctypes.c_int64 * max(a.ndim, 1))(*a.shape)
    keep.append(dims)
    code = {np.dtype("float32"): _capi.DataType.F32, np.dtype("int64"): _capi.DataType.S64}
    return _capi.Buffer(
        _capi.struct_size(_capi.Buffer),
        None,
        code[a.dtype],
        a.ctypes.data,
        a.ndim,
        ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64)),
    )


def _handler_for(fn, version=(0, 3), traits=0):
    return _handler._Handler("fake", fn, _frame.HostBuffer, version, traits)


def test_a_frame_is_read_and_the_function_writes_the_result():
    xla = FakeXla()
    x, y = np.arange(6, dtype=np.float32).reshape(2, 3), np.zeros((2, 3), np.float32)
    seen = []

    def double(call):
        seen.append((call.args[0].shape, call.rets[0].dtype, call.stream))
        call.rets[0].numpy()[...] = call.args[0].numpy() * 2

    frame = xla.frame([x], [y])
    assert _handler_for(double)(ctypes.addressof(frame)) is None
    np.testing.assert_array_equal(y, x * 2)
    assert seen == [((2, 3), np.dtype("float32"), 0x5EED)]
    assert xla.messages == []


@pytest.mark.parametrize("stage", [_capi.Stage.INSTANTIATE, _capi.Stage.PREPARE])
def test_the_stages_before_execution_do_not_call_the_function(stage):
    calls = []
    frame = FakeXla().frame([np.ones(2, np.float32)], [np.ones(2, np.float32)], stage=stage)
    assert _handler_for(calls.append)(ctypes.addressof(frame)) is None
    assert calls == []


def test_the_metadata_request_is_answered_with_the_checked_version_and_traits():
    metadata = _capi.Metadata()
    metadata.struct_size = _capi.struct_size(_capi.Metadata)
    ext = _capi.MetadataExtension()
    ext.extension_base.struct_size = _capi.struct_size(_capi.MetadataExtension)
    ext.extension_base.type = _capi.ExtensionType.METADATA
    ext.metadata = ctypes.pointer(metadata)
    frame = FakeXla().frame()
    frame.extension_start = ctypes.addressof(ext)
    calls = []
    assert _handler_for(calls.append, (0, 7), traits=1)(ctypes.addressof(frame)) is None
    assert calls == []
    v = metadata.api_version
    assert (v.struct_size, v.major_version, v.minor_version) == (24, 0, 7)
    assert metadata.traits == 1


def test_another_major_version_at_call_time_is_an_error_not_a_call():
    xla = FakeXla(major=1, minor=0)
    calls = []
    frame = xla.frame([np.ones(2, np.float32)], [np.ones(2, np.float32)])
    error = _handler_for(calls.append)(ctypes.addressof(frame))
    assert error == 0xE001 and calls == []
    ((code, message),) = xla.messages
    assert code == _capi.ErrorCode.INTERNAL
    assert "XLA's FFI API is version 1.0" in message and "UnsupportedJaxlibError" in message


def test_a_smaller_api_table_is_refused():
    xla = FakeXla()
    xla.api.struct_size = 48  # a table without the stream getter
    frame = xla.frame([np.ones(2, np.float32)], [np.ones(2, np.float32)])
    assert _handler_for(lambda call: None)(ctypes.addressof(frame)) == 0xE001
    assert "smaller than pycudnn.jax's mirrors" in xla.messages[0][1]


def test_a_stream_error_is_read_destroyed_and_raised():
    xla = FakeXla(stream=None)
    frame = xla.frame([np.ones(2, np.float32)], [np.ones(2, np.float32)])
    error = _handler_for(lambda call: call.stream)(ctypes.addressof(frame))
    assert error
    assert xla.destroyed == [0xEEEE]
    assert "XLA has no stream for fake: no stream here" in xla.messages[0][1]


def test_an_error_that_cannot_be_reported_is_written_to_stderr(capfd):
    frame = FakeXla().frame()
    frame.api = None

    def fail(call):
        raise ValueError("lost")

    assert _handler_for(fail)(ctypes.addressof(frame)) is None
    assert "could not be reported to XLA" in capfd.readouterr().err


def test_an_exception_in_the_function_is_reported_with_its_message():
    xla = FakeXla()

    def fail(call):
        raise ValueError("scale must be positive")

    frame = xla.frame([np.ones(2, np.float32)], [np.ones(2, np.float32)])
    assert _handler_for(fail)(ctypes.addressof(frame)) == 0xE001
    assert xla.messages == [
        (
            _capi.ErrorCode.INVALID_ARGUMENT,
            "pycudnn.jax target 'fake': ValueError: scale must be positive",
        )
    ]


def test_a_keyboard_interrupt_is_reported_as_cancelled():
    xla = FakeXla()

    def interrupted(call):
        raise KeyboardInterrupt

    frame = xla.frame([np.ones(2, np.float32)], [np.ones(2, np.float32)])
    assert _handler_for(interrupted)(ctypes.addressof(frame)) == 0xE001
    assert xla.messages[0][0] == _capi.ErrorCode.CANCELLED
