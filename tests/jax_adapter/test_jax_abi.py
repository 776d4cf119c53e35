"""The ctypes mirrors against jaxlib's XLA FFI headers, and the handler on call frames built here
(no XLA in between): each layout generation selected by what its header declares, refusals of
other layouts and versions, the metadata answer, the stages, the API table's stream and error
functions.

The headers: the installed jaxlib's, and verbatim copies in ``data/`` of the headers each
generation was written from (``xla/ffi/api/c_api.h`` of jaxlib 0.10.2, API 0.3, and of jaxlib
0.11.2, API 0.4; Apache-2.0, their license headers kept), so both generations are checked
whichever jaxlib is installed."""

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
INSTALLED = Path(jax.ffi.include_dir()) / _header.HEADER
DATA = Path(__file__).parent / "data"
# the copied headers: file -> (API version, generation)
COPIES = {
    DATA / "xla_ffi_c_api_jaxlib_0_10_2.h": ((0, 3), _capi.API_0_3),
    DATA / "xla_ffi_c_api_jaxlib_0_11_2.h": ((0, 4), _capi.API_0_4),
}
HEADERS = pytest.mark.parametrize("header", list(COPIES), ids=lambda p: p.stem[-6:])


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "c_api.h"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def _include(tmp_path: Path, text: str) -> str:
    path = tmp_path / _header.HEADER
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return str(tmp_path)


def test_the_installed_header_matches_a_generation():
    report = _header.check(jax.ffi.include_dir(), "x.y")
    generation = _capi.generation(report.generation)
    assert set(report.structs) == set(generation.mirrors)
    parsed = _header.read(str(INSTALLED))
    for name in generation.written:
        assert parsed.sizes[name] == _capi.struct_size(generation.mirrors[name]), name


@HEADERS
def test_each_copied_header_selects_its_generation_and_matches_it(header):
    version, generation = COPIES[header]
    report = _header.check(str(header), "x.y")
    assert report.api_version == version
    assert report.generation == generation.name
    assert report.header == str(header)
    assert set(report.structs) == set(generation.mirrors)
    parsed = _header.read(str(header))
    for name in generation.written:
        assert parsed.sizes[name] == _capi.struct_size(generation.mirrors[name]), name
    assert _header.select(parsed) == (generation, [])


def test_the_copies_differ_where_the_generations_do():
    """API 0.4's header held against API 0.3's mirrors fails as jaxlib 0.11.2 did before the
    generations (the GPU machine's check_abi()), and the other way round."""
    new = _header.read(str(DATA / "xla_ffi_c_api_jaxlib_0_11_2.h"))
    old = _header.read(str(DATA / "xla_ffi_c_api_jaxlib_0_10_2.h"))
    assert _header._differences(new, _capi.API_0_3) == [
        "XLA_FFI_Extension_Base is not declared",
        "XLA_FFI_Error_GetMessage_Args is not declared",
        "XLA_FFI_Api field 5: ours is XLA_FFI_Error_GetMessage at offset 56 (8 bytes), the "
        "header's is XLA_FFI_Error_GetDetails at offset 56 (8 bytes)",
    ]
    assert _header._differences(old, _capi.API_0_4) == [
        "XLA_FFI_InternalExtension is not declared",
        "XLA_FFI_Error_GetDetails_Args is not declared",
        "XLA_FFI_Api field 5: ours is XLA_FFI_Error_GetDetails at offset 56 (8 bytes), the "
        "header's is XLA_FFI_Error_GetMessage at offset 56 (8 bytes)",
        "the enum constant XLA_FFI_ExecutionStage_RECORD is not declared",
    ]


def test_a_header_of_no_known_generation_is_refused_naming_the_structs(tmp_path):
    text = (DATA / "xla_ffi_c_api_jaxlib_0_11_2.h").read_text()
    changed = text.replace("XLA_FFI_InternalExtension", "XLA_FFI_FrameExtension")
    with pytest.raises(UnsupportedJaxlibError) as info:
        _header.check(_write(tmp_path, changed), "9.9.9")
    message = str(info.value)
    assert message.startswith("jaxlib 9.9.9 (")
    assert "not API 0.4's layout (jaxlib 0.11.2): XLA_FFI_InternalExtension is not declared" in (
        message
    )
    assert "not API 0.3's layout (jaxlib 0.10.2): XLA_FFI_Extension_Base is not declared, " in (
        message
    )


def test_a_later_minor_version_that_appends_keeps_its_generation(tmp_path):
    text = (DATA / "xla_ffi_c_api_jaxlib_0_11_2.h").read_text()
    later = (
        text.replace("#define XLA_FFI_API_MINOR 4", "#define XLA_FFI_API_MINOR 5")
        .replace(
            "  _XLA_FFI_API_STRUCT_FIELD(XLA_FFI_InvokeContext_FindExtension);\n",
            "  _XLA_FFI_API_STRUCT_FIELD(XLA_FFI_InvokeContext_FindExtension);\n"
            "  _XLA_FFI_API_STRUCT_FIELD(XLA_FFI_Something_New);\n",
        )
        .replace(
            "XLA_FFI_DEFINE_STRUCT_TRAITS(XLA_FFI_Api, XLA_FFI_InvokeContext_FindExtension);",
            "XLA_FFI_DEFINE_STRUCT_TRAITS(XLA_FFI_Api, XLA_FFI_Something_New);",
        )
    )
    assert "XLA_FFI_Something_New" in later
    report = _header.check(_write(tmp_path, later), "9.9.9")
    assert (report.api_version, report.generation) == ((0, 5), "0.4")
    assert report.structs["XLA_FFI_Api"] == 208


@HEADERS
def test_a_field_inserted_in_a_mirrored_struct_is_refused(tmp_path, header):
    text = header.read_text()
    changed = re.sub(
        r"(struct XLA_FFI_Buffer \{\s*size_t struct_size;\s*\w+\* extension_start;)",
        r"\1\n  int64_t flags;",
        text,
    )
    assert changed != text
    name = COPIES[header][1].name
    with pytest.raises(
        UnsupportedJaxlibError, match=rf"jaxlib 9\.9\.9 .*API {name}'s .*XLA_FFI_Buffer field 2"
    ):
        _header.check(_include(tmp_path, changed), "9.9.9")


@HEADERS
def test_a_grown_struct_we_write_is_refused_and_a_grown_struct_we_read_is_not(tmp_path, header):
    text = header.read_text()
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


def test_a_grown_error_getter_is_refused():
    """API 0.4's getter arguments are written by the handler: one more field is refused."""
    text = (DATA / "xla_ffi_c_api_jaxlib_0_11_2.h").read_text()
    grown = text.replace(
        "  XLA_FFI_Error_Code errc;  // out\n};\n\n"
        "XLA_FFI_DEFINE_STRUCT_TRAITS(XLA_FFI_Error_GetDetails_Args, errc);",
        "  XLA_FFI_Error_Code errc;  // out\n  int64_t payload;\n};\n\n"
        "XLA_FFI_DEFINE_STRUCT_TRAITS(XLA_FFI_Error_GetDetails_Args, payload);",
    )
    assert grown != text
    parsed = _header.parse(grown)
    assert _header.select(parsed)[0] is None
    assert (
        "XLA_FFI_Error_GetDetails_Args is written with struct_size 36"
        in (_header.select(parsed)[1][0])
    )


@HEADERS
def test_a_changed_enum_value_is_refused(tmp_path, header):
    text = header.read_text()
    changed = text.replace("XLA_FFI_Extension_Metadata = 1,", "XLA_FFI_Extension_Metadata = 2,")
    assert changed != text
    with pytest.raises(
        UnsupportedJaxlibError, match="the enum constant XLA_FFI_Extension_Metadata is 2"
    ):
        _header.check(_write(tmp_path, changed), "9.9.9")


@HEADERS
def test_another_major_version_in_the_header_is_refused(tmp_path, header):
    text = re.sub(
        r"#define XLA_FFI_API_MAJOR \d+", "#define XLA_FFI_API_MAJOR 1", header.read_text()
    )
    with pytest.raises(UnsupportedJaxlibError, match=r"jaxlib 9\.9\.9 .*version 1\.\d+"):
        _header.check(_include(tmp_path, text), "9.9.9")


def test_a_missing_header_is_refused(tmp_path):
    with pytest.raises(UnsupportedJaxlibError, match=r"jaxlib 9\.9\.9 .*cannot be read"):
        _header.check(str(tmp_path), "9.9.9")
    with pytest.raises(UnsupportedJaxlibError, match=r"jaxlib 9\.9\.9 .*cannot be read"):
        _header.check(str(tmp_path / "c_api.h"), "9.9.9")


@HEADERS
def test_a_wrong_mirror_is_refused(monkeypatch, header):
    class Buffer(ctypes.Structure):
        _fields_ = [
            ("struct_size", ctypes.c_size_t),
            ("extension_start", ctypes.c_void_p),
            ("dtype", ctypes.c_int64),  # the header's is an enum (4 bytes)
        ]

    monkeypatch.setitem(COPIES[header][1].mirrors, "XLA_FFI_Buffer", Buffer)
    with pytest.raises(UnsupportedJaxlibError, match="XLA_FFI_Buffer field 2: ours is dtype"):
        _header.check(str(header), "x.y")


# -- the handler on frames built here ------------------------------------------------------------
GENERATIONS = pytest.mark.parametrize("gen", _capi.GENERATIONS, ids=lambda g: f"api{g.name}")


class FakeXla:
    """An ``XLA_FFI_Api`` table of a generation whose error and stream functions are Python
    callbacks."""

    def __init__(self, gen=_capi.API_0_3, major=0, minor=None, stream=0x5EED):
        self.gen = gen
        self.messages: list[tuple[int, str]] = []
        self.destroyed: list[int] = []
        self.getter_sizes: list[int] = []

        def create(args):
            self.messages.append((args.contents.errc, args.contents.message.decode()))
            return 0xE000 + len(self.messages)

        def get_message(args):
            self.getter_sizes.append(args.contents.struct_size)
            args.contents.message = b"no stream here"

        def get_details(args):
            get_message(args)
            args.contents.errc = _capi.ErrorCode.UNIMPLEMENTED

        def destroy(args):
            self.destroyed.append(args.contents.error)

        def stream_get(args):
            if stream is None:
                return 0xEEEE
            args.contents.stream = stream
            return None

        getter_type, getter = (
            (_capi.ErrorGetDetails, get_details)
            if gen is _capi.API_0_4
            else (_capi.ErrorGetMessage, get_message)
        )
        self._callbacks = [
            _capi.ErrorCreate(create),
            getter_type(getter),
            _capi.ErrorDestroy(destroy),
            _capi.StreamGet(stream_get),
        ]
        self.api = gen.api()
        self.api.struct_size = _capi.struct_size(gen.api)
        self.api.api_version.major_version = major
        self.api.api_version.minor_version = int(gen.name[2:]) if minor is None else minor
        self.api.XLA_FFI_Error_Create = self._callbacks[0]
        setattr(self.api, gen.error_getter, self._callbacks[1])
        self.api.XLA_FFI_Error_Destroy = self._callbacks[2]
        self.api.XLA_FFI_Stream_Get = self._callbacks[3]

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

    def handler(self, fn, version=None, traits=0):
        version = version or (0, int(self.gen.name[2:]))
        return _handler._Handler("fake", fn, _frame.HostBuffer, version, traits, self.gen)


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


def _one():
    return [np.ones(2, np.float32)], [np.ones(2, np.float32)]


@GENERATIONS
def test_a_frame_is_read_and_the_function_writes_the_result(gen):
    xla = FakeXla(gen)
    x, y = np.arange(6, dtype=np.float32).reshape(2, 3), np.zeros((2, 3), np.float32)
    seen = []

    def double(call):
        seen.append((call.args[0].shape, call.rets[0].dtype, call.stream))
        call.rets[0].numpy()[...] = call.args[0].numpy() * 2

    frame = xla.frame([x], [y])
    assert xla.handler(double)(ctypes.addressof(frame)) is None
    np.testing.assert_array_equal(y, x * 2)
    assert seen == [((2, 3), np.dtype("float32"), 0x5EED)]
    assert xla.messages == []


@pytest.mark.parametrize(
    "stage", [_capi.Stage.INSTANTIATE, _capi.Stage.PREPARE, _capi.Stage.RECORD]
)
def test_the_stages_other_than_execution_do_not_call_the_function(stage):
    calls = []
    xla = FakeXla(_capi.API_0_4)
    frame = xla.frame(*_one(), stage=stage)
    assert xla.handler(calls.append)(ctypes.addressof(frame)) is None
    assert calls == []


def _metadata_request(xla, before=None):
    """A frame as XLA's metadata request builds it (the extension first on the chain, or after
    *before*), and the metadata to be filled in."""
    metadata = _capi.Metadata()
    metadata.struct_size = _capi.struct_size(_capi.Metadata)
    ext = _capi.MetadataExtension()
    ext.extension_base.struct_size = _capi.struct_size(_capi.MetadataExtension)
    ext.extension_base.type = _capi.ExtensionType.METADATA
    ext.metadata = ctypes.pointer(metadata)
    frame = xla.frame()
    start = ext.extension_base
    if before is not None:
        before.next = ctypes.pointer(ext.extension_base)
        start = before
    frame.extension_start = ctypes.addressof(start)
    frame._keep.append((ext, before))
    return frame, metadata


@GENERATIONS
def test_the_metadata_request_is_answered_with_the_checked_version_and_traits(gen):
    xla = FakeXla(gen)
    frame, metadata = _metadata_request(xla)
    calls = []
    assert xla.handler(calls.append, (0, 7), traits=1)(ctypes.addressof(frame)) is None
    assert calls == []
    v = metadata.api_version
    assert (v.struct_size, v.major_version, v.minor_version) == (24, 0, 7)
    assert metadata.traits == 1
    assert xla.messages == []


def test_the_metadata_extension_is_found_behind_another_extension():
    xla = FakeXla(_capi.API_0_4)
    other = _capi.Extension(_capi.struct_size(_capi.Extension), 99, None)
    frame, metadata = _metadata_request(xla, before=other)
    calls = []
    assert xla.handler(calls.append, (0, 4))(ctypes.addressof(frame)) is None
    assert calls == [] and metadata.api_version.minor_version == 4


def test_an_unknown_extension_alone_is_passed_over():
    xla = FakeXla(_capi.API_0_4)
    other = _capi.Extension(_capi.struct_size(_capi.Extension), 99, None)
    frame = xla.frame(*_one())
    frame.extension_start = ctypes.addressof(other)
    calls = []
    assert xla.handler(calls.append)(ctypes.addressof(frame)) is None
    assert len(calls) == 1 and xla.messages == []


def test_a_looping_extension_chain_is_an_error():
    xla = FakeXla(_capi.API_0_4)
    other = _capi.Extension(_capi.struct_size(_capi.Extension), 99, None)
    other.next = ctypes.pointer(other)
    frame = xla.frame(*_one())
    frame.extension_start = ctypes.addressof(other)
    assert xla.handler(lambda call: None)(ctypes.addressof(frame)) == 0xE001
    assert "extension chain is longer than 16" in xla.messages[0][1]


def test_a_smaller_metadata_extension_is_refused():
    xla = FakeXla(_capi.API_0_4)
    frame, metadata = _metadata_request(xla)
    ctypes.cast(frame.extension_start, ctypes.POINTER(_capi.Extension))[0].struct_size = 24
    assert xla.handler(lambda call: None)(ctypes.addressof(frame)) == 0xE001
    assert "XLA_FFI_Metadata_Extension has 24 bytes" in xla.messages[0][1]
    assert metadata.api_version.major_version == 0 and metadata.traits == 0


@GENERATIONS
def test_another_major_version_at_call_time_is_an_error_not_a_call(gen):
    xla = FakeXla(gen, major=1, minor=0)
    calls = []
    frame = xla.frame(*_one())
    error = xla.handler(calls.append)(ctypes.addressof(frame))
    assert error == 0xE001 and calls == []
    ((code, message),) = xla.messages
    assert code == _capi.ErrorCode.INTERNAL
    assert "XLA's FFI API is version 1.0" in message and "UnsupportedJaxlibError" in message


@GENERATIONS
def test_a_smaller_api_table_is_refused(gen):
    xla = FakeXla(gen)
    xla.api.struct_size = 48  # a table without the stream getter
    frame = xla.frame(*_one())
    assert xla.handler(lambda call: None)(ctypes.addressof(frame)) == 0xE001
    assert "smaller than pycudnn.jax's mirrors" in xla.messages[0][1]


@GENERATIONS
def test_a_stream_error_is_read_with_the_generations_getter_destroyed_and_raised(gen):
    xla = FakeXla(gen, stream=None)
    frame = xla.frame(*_one())
    error = xla.handler(lambda call: call.stream)(ctypes.addressof(frame))
    assert error
    assert xla.destroyed == [0xEEEE]
    assert xla.getter_sizes == [_capi.struct_size(gen.error_getter_args)]
    expected = "XLA has no stream for fake: no stream here"
    if gen is _capi.API_0_4:  # GetDetails gives the code too
        expected += " [UNIMPLEMENTED]"
    assert xla.messages[0][1].endswith(expected)


def test_the_error_details_of_each_generation():
    for gen, code in ((_capi.API_0_3, None), (_capi.API_0_4, int(_capi.ErrorCode.UNIMPLEMENTED))):
        xla = FakeXla(gen)
        assert gen.error_details(xla.api, 0xEEEE) == ("no stream here", code)
        assert xla.destroyed == []  # read, not destroyed


@GENERATIONS
def test_an_error_that_cannot_be_reported_is_written_to_stderr(capfd, gen):
    xla = FakeXla(gen)
    frame = xla.frame()
    frame.api = None

    def fail(call):
        raise ValueError("lost")

    assert xla.handler(fail)(ctypes.addressof(frame)) is None
    assert "could not be reported to XLA" in capfd.readouterr().err


@GENERATIONS
def test_an_exception_in_the_function_is_reported_with_its_message(gen):
    xla = FakeXla(gen)

    def fail(call):
        raise ValueError("scale must be positive")

    frame = xla.frame(*_one())
    assert xla.handler(fail)(ctypes.addressof(frame)) == 0xE001
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

    frame = xla.frame(*_one())
    assert xla.handler(interrupted)(ctypes.addressof(frame)) == 0xE001
    assert xla.messages[0][0] == _capi.ErrorCode.CANCELLED
