"""ctypes mirrors of the XLA FFI C structs a handler reads and writes (XLA's ``ffi/api/c_api.h``),
one table per layout generation of that header.

Written by hand from jaxlib's headers and checked against the *installed* jaxlib's header before
any registration (:mod:`._header`): every field mirrored here must appear in the header's struct
at the same position, with the same name, offset and size. A struct may grow at its end in a
newer jaxlib (XLA's minor versions append), so each mirror holds only the fields the handler
uses: nothing after them is read.

XLA renamed structs and functions without bumping its major version, so the same major version
(0) comes in **generations**, told apart by what the header declares (:data:`GENERATIONS`):

* **API 0.3** (written from jaxlib 0.10.2's header): the call frame's extensions start with an
  ``XLA_FFI_Extension_Base``; the API table's sixth entry is ``XLA_FFI_Error_GetMessage``, whose
  arguments give the message only.
* **API 0.4** (written from jaxlib 0.11.2's header): the same extension header renamed
  ``XLA_FFI_InternalExtension`` (same fields; XLA now keeps it for the frame's metadata request,
  while backend extensions (``XLA_FFI_Extension``, an ``XLA_FFI_ExtensionId``) hang off the
  invoke context, found through the table's new last entry
  ``XLA_FFI_InvokeContext_FindExtension``, which the handler does not use); the sixth entry is
  ``XLA_FFI_Error_GetDetails``, whose arguments add the error code after the message; a fifth
  execution stage, ``RECORD``, called only for a bundle's record handler.

Everything else the handler touches -- the call frame, buffers, attributes, the error-creating,
error-destroying and stream-getting arguments, the metadata and its extension -- has the same
layout in both (pointer fields retyped, e.g. ``XLA_FFI_ExecutionContext*`` to
``XLA_FFI_InvokeContext*``, are pointers still) and one mirror serves both.

Stdlib only (no JAX): these are plain ctypes types.
"""

from __future__ import annotations

import ctypes
import enum
from dataclasses import dataclass, field

__all__ = [
    "API_0_3",
    "API_0_4",
    "GENERATIONS",
    "SUPPORTED_MAJOR",
    "Api03",
    "Api04",
    "ApiVersion",
    "Args",
    "Array",
    "AttrType",
    "Attrs",
    "Buffer",
    "ByteSpan",
    "CallFrame",
    "DataType",
    "ErrorCode",
    "ErrorCreateArgs",
    "ErrorDestroyArgs",
    "ErrorGetDetailsArgs",
    "ErrorGetMessageArgs",
    "Extension",
    "ExtensionType",
    "Generation",
    "Metadata",
    "MetadataExtension",
    "Rets",
    "Scalar",
    "Stage",
    "StreamGetArgs",
    "generation",
    "struct_size",
]

#: The major version of the XLA FFI API these mirrors follow (``XLA_FFI_API_MAJOR``); a jaxlib
#: whose header or runtime reports another major is refused (XLA bumps it on a breaking change).
SUPPORTED_MAJOR = 0

_size_t = ctypes.c_size_t
_ptr = ctypes.c_void_p
_enum = ctypes.c_int  # C enums: int-sized on the ABIs XLA supports


class ExtensionType(enum.IntEnum):
    """The type of an extension on a call frame's ``extension_start`` chain
    (``XLA_FFI_Extension_Type`` in API 0.3, ``XLA_FFI_InternalExtension_Type`` in API 0.4)."""

    METADATA = 1


class ErrorCode(enum.IntEnum):
    """``XLA_FFI_Error_Code`` (absl's status codes)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class DataType(enum.IntEnum):
    """``XLA_FFI_DataType`` (xla::PrimitiveType's numbers)."""

    INVALID = 0
    PRED = 1
    S8 = 2
    S16 = 3
    S32 = 4
    S64 = 5
    U8 = 6
    U16 = 7
    U32 = 8
    U64 = 9
    F16 = 10
    F32 = 11
    F64 = 12
    C64 = 15
    BF16 = 16
    TOKEN = 17
    C128 = 18
    F8E5M2 = 19
    F8E4M3FN = 20
    S4 = 21
    U4 = 22
    F8E4M3B11FNUZ = 23
    F8E5M2FNUZ = 24
    F8E4M3FNUZ = 25
    S2 = 26
    U2 = 27
    F8E4M3 = 28
    F8E3M4 = 29
    S1 = 30
    U1 = 31
    F4E2M1FN = 32
    F8E8M0FNU = 33


class AttrType(enum.IntEnum):
    """``XLA_FFI_AttrType``."""

    ARRAY = 1
    DICTIONARY = 2
    SCALAR = 3
    STRING = 4


class Stage(enum.IntEnum):
    """``XLA_FFI_ExecutionStage``."""

    INSTANTIATE = 0
    PREPARE = 1
    INITIALIZE = 2
    EXECUTE = 3
    RECORD = 4  # API 0.4 on: a command buffer's recording (only for a bundle's record handler)


class Extension(ctypes.Structure):
    """The head every extension on a call frame's ``extension_start`` chain begins with:
    ``XLA_FFI_Extension_Base`` (API 0.3) or ``XLA_FFI_InternalExtension`` (API 0.4), the same
    fields under two names."""


Extension._fields_ = [
    ("struct_size", _size_t),
    ("type", _enum),
    ("next", ctypes.POINTER(Extension)),
]


class ApiVersion(ctypes.Structure):
    """``XLA_FFI_Api_Version``."""

    _fields_ = [
        ("struct_size", _size_t),
        ("extension_start", _ptr),
        ("major_version", ctypes.c_int),
        ("minor_version", ctypes.c_int),
    ]


class ErrorCreateArgs(ctypes.Structure):
    """``XLA_FFI_Error_Create_Args``."""

    _fields_ = [
        ("struct_size", _size_t),
        ("extension_start", _ptr),
        ("message", ctypes.c_char_p),
        ("errc", _enum),
    ]


class ErrorGetMessageArgs(ctypes.Structure):
    """``XLA_FFI_Error_GetMessage_Args`` (API 0.3)."""

    _fields_ = [
        ("struct_size", _size_t),
        ("extension_start", _ptr),
        ("error", _ptr),
        ("message", ctypes.c_char_p),
    ]


class ErrorGetDetailsArgs(ctypes.Structure):
    """``XLA_FFI_Error_GetDetails_Args`` (API 0.4): GetMessage's arguments and the code."""

    _fields_ = [
        ("struct_size", _size_t),
        ("extension_start", _ptr),
        ("error", _ptr),
        ("message", ctypes.c_char_p),
        ("errc", _enum),
    ]


class ErrorDestroyArgs(ctypes.Structure):
    """``XLA_FFI_Error_Destroy_Args``."""

    _fields_ = [("struct_size", _size_t), ("extension_start", _ptr), ("error", _ptr)]


class StreamGetArgs(ctypes.Structure):
    """``XLA_FFI_Stream_Get_Args``."""

    _fields_ = [
        ("struct_size", _size_t),
        ("extension_start", _ptr),
        ("ctx", _ptr),
        ("stream", _ptr),
    ]


ErrorCreate = ctypes.CFUNCTYPE(_ptr, ctypes.POINTER(ErrorCreateArgs))
ErrorGetMessage = ctypes.CFUNCTYPE(None, ctypes.POINTER(ErrorGetMessageArgs))
ErrorGetDetails = ctypes.CFUNCTYPE(None, ctypes.POINTER(ErrorGetDetailsArgs))
ErrorDestroy = ctypes.CFUNCTYPE(None, ctypes.POINTER(ErrorDestroyArgs))
StreamGet = ctypes.CFUNCTYPE(_ptr, ctypes.POINTER(StreamGetArgs))


def _api_fields(getter: str, getter_type: type) -> list[tuple[str, type]]:
    """The head of ``XLA_FFI_Api`` up to the stream getter, with the error getter of a
    generation in the sixth place (the rest of the table is never read)."""
    return [
        ("struct_size", _size_t),
        ("extension_start", _ptr),
        ("api_version", ApiVersion),
        ("internal_api", _ptr),
        ("XLA_FFI_Error_Create", ErrorCreate),
        (getter, getter_type),
        ("XLA_FFI_Error_Destroy", ErrorDestroy),
        ("XLA_FFI_Handler_Register", _ptr),
        ("XLA_FFI_Stream_Get", StreamGet),
    ]


class Api03(ctypes.Structure):
    """``XLA_FFI_Api`` of API 0.3: the table of functions XLA hands every call (its first
    entries: the error functions and the stream getter)."""

    _fields_ = _api_fields("XLA_FFI_Error_GetMessage", ErrorGetMessage)


class Api04(ctypes.Structure):
    """``XLA_FFI_Api`` of API 0.4: as :class:`Api03`, with ``XLA_FFI_Error_GetDetails`` in
    ``XLA_FFI_Error_GetMessage``'s place."""

    _fields_ = _api_fields("XLA_FFI_Error_GetDetails", ErrorGetDetails)


class Buffer(ctypes.Structure):
    """``XLA_FFI_Buffer``: an argument or result (dense, row-major unless a layout was given)."""

    _fields_ = [
        ("struct_size", _size_t),
        ("extension_start", _ptr),
        ("dtype", _enum),
        ("data", _ptr),
        ("rank", ctypes.c_int64),
        ("dims", ctypes.POINTER(ctypes.c_int64)),
    ]


class ByteSpan(ctypes.Structure):
    """``XLA_FFI_ByteSpan``: a string attribute or a name (not NUL-terminated)."""

    _fields_ = [("ptr", _ptr), ("len", _size_t)]


class Scalar(ctypes.Structure):
    """``XLA_FFI_Scalar``."""

    _fields_ = [("dtype", _enum), ("value", _ptr)]


class Array(ctypes.Structure):
    """``XLA_FFI_Array``: a one-dimensional array attribute."""

    _fields_ = [("dtype", _enum), ("size", _size_t), ("data", _ptr)]


class Args(ctypes.Structure):
    """``XLA_FFI_Args``."""

    _fields_ = [
        ("struct_size", _size_t),
        ("extension_start", _ptr),
        ("size", ctypes.c_int64),
        ("types", ctypes.POINTER(_enum)),
        ("args", ctypes.POINTER(_ptr)),
    ]


class Rets(ctypes.Structure):
    """``XLA_FFI_Rets``."""

    _fields_ = [
        ("struct_size", _size_t),
        ("extension_start", _ptr),
        ("size", ctypes.c_int64),
        ("types", ctypes.POINTER(_enum)),
        ("rets", ctypes.POINTER(_ptr)),
    ]


class Attrs(ctypes.Structure):
    """``XLA_FFI_Attrs``: sorted by name; a dictionary attribute is one of these."""

    _fields_ = [
        ("struct_size", _size_t),
        ("extension_start", _ptr),
        ("size", ctypes.c_int64),
        ("types", ctypes.POINTER(_enum)),
        ("names", ctypes.POINTER(ctypes.POINTER(ByteSpan))),
        ("attrs", ctypes.POINTER(_ptr)),
    ]


class CallFrame(ctypes.Structure):
    """``XLA_FFI_CallFrame``: what a handler receives (its ``future``, after ``attrs``, is
    outside the struct's declared size and not mirrored)."""

    _fields_ = [
        ("struct_size", _size_t),
        ("extension_start", _ptr),  # an Extension*, read as an address
        ("api", _ptr),  # a const XLA_FFI_Api*, read as an address (the same on every call)
        ("ctx", _ptr),
        ("stage", _enum),
        ("args", Args),
        ("rets", Rets),
        ("attrs", Attrs),
    ]


class Metadata(ctypes.Structure):
    """``XLA_FFI_Metadata``: what a handler answers when XLA asks for its metadata (its
    ``state_type_id``, after ``traits``, is outside the struct's declared size and not written:
    XLA's request initialises it to zero, ``XLA_FFI_UNKNOWN_TYPE_ID``, a handler without state)."""

    _fields_ = [
        ("struct_size", _size_t),
        ("api_version", ApiVersion),
        ("traits", ctypes.c_uint32),
    ]


class MetadataExtension(ctypes.Structure):
    """``XLA_FFI_Metadata_Extension``: the extension that marks a metadata request (type
    :attr:`ExtensionType.METADATA`, first on the frame's chain)."""

    _fields_ = [("extension_base", Extension), ("metadata", ctypes.POINTER(Metadata))]


# the structs both generations declare alike: header name -> mirror
_COMMON: dict[str, type[ctypes.Structure]] = {
    "XLA_FFI_Api_Version": ApiVersion,
    "XLA_FFI_Error_Create_Args": ErrorCreateArgs,
    "XLA_FFI_Error_Destroy_Args": ErrorDestroyArgs,
    "XLA_FFI_Stream_Get_Args": StreamGetArgs,
    "XLA_FFI_Buffer": Buffer,
    "XLA_FFI_ByteSpan": ByteSpan,
    "XLA_FFI_Scalar": Scalar,
    "XLA_FFI_Array": Array,
    "XLA_FFI_Args": Args,
    "XLA_FFI_Rets": Rets,
    "XLA_FFI_Attrs": Attrs,
    "XLA_FFI_CallFrame": CallFrame,
    "XLA_FFI_Metadata": Metadata,
    "XLA_FFI_Metadata_Extension": MetadataExtension,
}

# the structs the handler fills in and hands to XLA, in both generations (their struct_size is
# ours, so the mirror must hold every field of the header's declared size, not just a prefix)
_COMMON_WRITTEN = (
    "XLA_FFI_Api_Version",
    "XLA_FFI_Error_Create_Args",
    "XLA_FFI_Error_Destroy_Args",
    "XLA_FFI_Stream_Get_Args",
    "XLA_FFI_Metadata",
)


def _constants(*extra: tuple[str, int]) -> dict[str, int]:
    """Header enum constant -> value, for each value the handler sends or compares."""
    out = {"XLA_FFI_Extension_Metadata": int(ExtensionType.METADATA)}
    for prefix, cls in (
        ("XLA_FFI_Error_Code_", ErrorCode),
        ("XLA_FFI_DataType_", DataType),
        ("XLA_FFI_AttrType_", AttrType),
    ):  # (every member: each may come from the frame)
        out.update({prefix + m.name: int(m) for m in cls})
    for stage in (Stage.INSTANTIATE, Stage.PREPARE, Stage.INITIALIZE, Stage.EXECUTE):
        out["XLA_FFI_ExecutionStage_" + stage.name] = int(stage)
    out["XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE"] = 1
    out.update({name: int(value) for name, value in extra})
    return out


@dataclass(frozen=True, eq=False)
class Generation:
    """One layout generation of XLA's FFI header: the mirrors the handler uses with it.

    Attributes
    ----------
    name : str
        The API version that introduced the layout (``"0.3"``, ``"0.4"``); a header of a later
        minor version may keep it (the check decides).
    written_from : str
        The jaxlib whose header the mirrors were written from.
    markers : tuple of str
        The structs only this generation's header declares: what selects it.
    mirrors : dict
        Header struct name -> mirror, for every struct the handler reads or writes.
    written : tuple of str
        The structs the handler writes (their ``struct_size`` must be the header's).
    constants : dict
        Header enum constant -> the value the handler uses.
    api : type
        The ``XLA_FFI_Api`` mirror.
    error_getter : str
        The API table's entry that reads an error (``XLA_FFI_Error_GetMessage`` or
        ``XLA_FFI_Error_GetDetails``).
    error_getter_args : type
        Its arguments' mirror.
    """

    name: str
    written_from: str
    markers: tuple[str, ...]
    mirrors: dict[str, type[ctypes.Structure]] = field(repr=False)
    written: tuple[str, ...] = field(repr=False)
    constants: dict[str, int] = field(repr=False)
    api: type[ctypes.Structure] = field(repr=False)
    error_getter: str = field(repr=False)
    error_getter_args: type[ctypes.Structure] = field(repr=False)

    def error_details(self, api: ctypes.Structure, error: int) -> tuple[str, int | None]:
        """The message and code (None where the generation gives none: API 0.3) of an
        ``XLA_FFI_Error*`` returned by an API function, read through the table *api*; the error
        stays alive (the caller destroys it)."""
        args = self.error_getter_args()
        args.struct_size = struct_size(self.error_getter_args)
        args.error = error
        has_code = hasattr(args, "errc")
        if has_code:
            args.errc = int(ErrorCode.INTERNAL)  # unless XLA writes another
        getattr(api, self.error_getter)(ctypes.byref(args))
        message = (args.message or b"").decode("utf-8", "replace")
        return message, (int(args.errc) if has_code else None)


def _generation(
    name: str,
    written_from: str,
    extension: str,
    getter: str,
    getter_args: type[ctypes.Structure],
    api: type[ctypes.Structure],
    constants: dict[str, int],
) -> Generation:
    args_name = getter + "_Args"
    mirrors = {extension: Extension, args_name: getter_args, "XLA_FFI_Api": api, **_COMMON}
    return Generation(
        name,
        written_from,
        (extension, args_name),
        mirrors,
        (*_COMMON_WRITTEN, args_name),
        constants,
        api,
        getter,
        getter_args,
    )


#: jaxlib 0.10.x's layout (API 0.3)
API_0_3 = _generation(
    "0.3",
    "jaxlib 0.10.2",
    "XLA_FFI_Extension_Base",
    "XLA_FFI_Error_GetMessage",
    ErrorGetMessageArgs,
    Api03,
    _constants(),
)

#: jaxlib 0.11.x's layout (API 0.4)
API_0_4 = _generation(
    "0.4",
    "jaxlib 0.11.2",
    "XLA_FFI_InternalExtension",
    "XLA_FFI_Error_GetDetails",
    ErrorGetDetailsArgs,
    Api04,
    _constants(("XLA_FFI_ExecutionStage_RECORD", Stage.RECORD)),
)

#: the generations known, newest first: the check selects the one whose markers the installed
#: header declares, then compares every mirror of it
GENERATIONS: tuple[Generation, ...] = (API_0_4, API_0_3)


def generation(name: str) -> Generation:
    """The generation called *name* (``AbiReport.generation``)."""
    for g in GENERATIONS:
        if g.name == name:
            return g
    raise KeyError(
        f"no XLA FFI layout generation {name!r} (known: {[g.name for g in GENERATIONS]})"
    )


def struct_size(cls: type[ctypes.Structure]) -> int:
    """XLA's ``struct_size`` of a mirror: the end of its last field (``XLA_FFI_STRUCT_SIZE``),
    which excludes the tail padding ``ctypes.sizeof`` counts."""
    name, ctype = cls._fields_[-1][:2]
    return getattr(cls, name).offset + ctypes.sizeof(ctype)
