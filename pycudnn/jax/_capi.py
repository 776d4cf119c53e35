"""ctypes mirrors of the XLA FFI C structs a handler reads and writes (XLA's ``ffi/api/c_api.h``).

Written by hand from jaxlib's header (API version 0.3, jaxlib 0.10.2) and checked against the
*installed* jaxlib's header before any registration (:mod:`._header`): every field mirrored here
must appear in the header's struct at the same position, with the same name, offset and size.
A struct may grow at its end in a newer jaxlib (XLA's minor versions only append), so each
mirror holds only the fields the handler uses: nothing after them is read.

Stdlib only (no JAX): these are plain ctypes types.
"""

from __future__ import annotations

import ctypes
import enum

__all__ = [
    "MIRRORS",
    "SUPPORTED_MAJOR",
    "WRITTEN",
    "Api",
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
    "ErrorGetMessageArgs",
    "ExtensionBase",
    "ExtensionType",
    "Metadata",
    "MetadataExtension",
    "Rets",
    "Scalar",
    "Stage",
    "StreamGetArgs",
    "struct_size",
]

#: The major version of the XLA FFI API these mirrors follow (``XLA_FFI_API_MAJOR``); a jaxlib
#: whose header or runtime reports another major is refused (XLA bumps it on a breaking change).
SUPPORTED_MAJOR = 0

_size_t = ctypes.c_size_t
_ptr = ctypes.c_void_p
_enum = ctypes.c_int  # C enums: int-sized on the ABIs XLA supports


class ExtensionType(enum.IntEnum):
    """``XLA_FFI_Extension_Type``."""

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


class ExtensionBase(ctypes.Structure):
    """``XLA_FFI_Extension_Base``."""


ExtensionBase._fields_ = [
    ("struct_size", _size_t),
    ("type", _enum),
    ("next", ctypes.POINTER(ExtensionBase)),
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
    """``XLA_FFI_Error_GetMessage_Args``."""

    _fields_ = [
        ("struct_size", _size_t),
        ("extension_start", _ptr),
        ("error", _ptr),
        ("message", ctypes.c_char_p),
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
ErrorDestroy = ctypes.CFUNCTYPE(None, ctypes.POINTER(ErrorDestroyArgs))
StreamGet = ctypes.CFUNCTYPE(_ptr, ctypes.POINTER(StreamGetArgs))


class Api(ctypes.Structure):
    """``XLA_FFI_Api``: the table of functions XLA hands every call (its first entries: the
    error functions and the stream getter; the rest of the table is never read)."""

    _fields_ = [
        ("struct_size", _size_t),
        ("extension_start", _ptr),
        ("api_version", ApiVersion),
        ("internal_api", _ptr),
        ("XLA_FFI_Error_Create", ErrorCreate),
        ("XLA_FFI_Error_GetMessage", ErrorGetMessage),
        ("XLA_FFI_Error_Destroy", ErrorDestroy),
        ("XLA_FFI_Handler_Register", _ptr),
        ("XLA_FFI_Stream_Get", StreamGet),
    ]


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
        ("extension_start", _ptr),  # an XLA_FFI_Extension_Base*, read as an address
        ("api", _ptr),  # a const XLA_FFI_Api*, read as an address (the same on every call)
        ("ctx", _ptr),
        ("stage", _enum),
        ("args", Args),
        ("rets", Rets),
        ("attrs", Attrs),
    ]


class Metadata(ctypes.Structure):
    """``XLA_FFI_Metadata``: what a handler answers when XLA asks for its metadata."""

    _fields_ = [
        ("struct_size", _size_t),
        ("api_version", ApiVersion),
        ("traits", ctypes.c_uint32),
    ]


class MetadataExtension(ctypes.Structure):
    """``XLA_FFI_Metadata_Extension``: the extension that marks a metadata request."""

    _fields_ = [("extension_base", ExtensionBase), ("metadata", ctypes.POINTER(Metadata))]


#: header struct name -> mirror; each is checked against the installed jaxlib's header
MIRRORS: dict[str, type[ctypes.Structure]] = {
    "XLA_FFI_Extension_Base": ExtensionBase,
    "XLA_FFI_Api_Version": ApiVersion,
    "XLA_FFI_Error_Create_Args": ErrorCreateArgs,
    "XLA_FFI_Error_GetMessage_Args": ErrorGetMessageArgs,
    "XLA_FFI_Error_Destroy_Args": ErrorDestroyArgs,
    "XLA_FFI_Stream_Get_Args": StreamGetArgs,
    "XLA_FFI_Api": Api,
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

#: the structs the handler fills in and hands to XLA (their ``struct_size`` is ours, so the
#: mirror must hold every field of the header's declared size, not just a prefix)
WRITTEN = (
    "XLA_FFI_Api_Version",
    "XLA_FFI_Error_Create_Args",
    "XLA_FFI_Error_GetMessage_Args",
    "XLA_FFI_Error_Destroy_Args",
    "XLA_FFI_Stream_Get_Args",
    "XLA_FFI_Metadata",
)


def struct_size(cls: type[ctypes.Structure]) -> int:
    """XLA's ``struct_size`` of a mirror: the end of its last field (``XLA_FFI_STRUCT_SIZE``),
    which excludes the tail padding ``ctypes.sizeof`` counts."""
    name, ctype = cls._fields_[-1][:2]
    return getattr(cls, name).offset + ctypes.sizeof(ctype)
