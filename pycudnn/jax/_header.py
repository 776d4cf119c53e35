"""The installed jaxlib's XLA FFI header, read and held against the mirrors of :mod:`._capi`.

``jax.ffi.include_dir()/xla/ffi/api/c_api.h`` declares the structs XLA passes a handler. This
module parses the parts it needs -- the API version macros, the enums' names and the values of
their constants, the typedefs' names, each ``struct``'s fields and each
``XLA_FFI_DEFINE_STRUCT_TRAITS`` size -- lays every struct out as a ctypes ``Structure`` (so the
C layout rules are ctypes', the same as the mirrors'), selects the layout generation
(:data:`._capi.GENERATIONS`) whose distinguishing structs the header declares, and compares:

* ``XLA_FFI_API_MAJOR`` must be :data:`._capi.SUPPORTED_MAJOR`;
* every field of each of the generation's mirrors must be the header struct's field at the
  same position, with the same name, offset and size (the header may declare more fields after
  them);
* a struct the handler writes must end where the header's declared size ends;
* every enum constant the handler sends or compares must have the handler's value.

A header that declares no generation's structs, or differs from the selected generation's
mirrors anywhere, is refused with the jaxlib version and the struct named. Stdlib only.
"""

from __future__ import annotations

import ctypes
import os
import re
from dataclasses import dataclass

from . import _capi

__all__ = ["HEADER", "AbiReport", "UnsupportedJaxlibError", "check", "parse", "read", "select"]

#: the header's path below ``jax.ffi.include_dir()``
HEADER = os.path.join("xla", "ffi", "api", "c_api.h")


class UnsupportedJaxlibError(RuntimeError):
    """The installed jaxlib's XLA FFI (its header, or the API table a call receives) differs from
    what ``pycudnn.jax`` mirrors: another major version, or a struct laid out otherwise."""


@dataclass(frozen=True)
class AbiReport:
    """What :func:`pycudnn.jax.check_abi` checked, and found equal.

    Attributes
    ----------
    jaxlib_version : str
        The installed jaxlib's version.
    header : str
        The header read.
    api_version : tuple of int
        ``(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR)`` of that header.
    structs : dict
        Struct name -> its ``struct_size`` in the header, for each struct mirrored.
    generation : str
        The layout generation the header was found to be, by the API version that introduced
        it: ``"0.3"`` (jaxlib 0.10.x: ``XLA_FFI_Extension_Base``, ``XLA_FFI_Error_GetMessage``)
        or ``"0.4"`` (jaxlib 0.11.x: ``XLA_FFI_InternalExtension``,
        ``XLA_FFI_Error_GetDetails``); the handler uses that generation's mirrors.
    """

    jaxlib_version: str
    header: str
    api_version: tuple[int, int]
    structs: dict[str, int]
    generation: str


_C_TYPES: dict[str, type] = {
    "size_t": ctypes.c_size_t,
    "int": ctypes.c_int,
    "int32_t": ctypes.c_int32,
    "int64_t": ctypes.c_int64,
    "uint32_t": ctypes.c_uint32,
    "uint64_t": ctypes.c_uint64,
    "char": ctypes.c_char,
}
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_STRUCT = re.compile(r"(?:typedef\s+)?struct\s+(\w+)\s*\{(.*?)\}\s*\w*\s*;", re.S)
_ENUM = re.compile(r"typedef\s+enum\s*\{.*?\}\s*(\w+)\s*;", re.S)
_TYPEDEF = re.compile(r"typedef\s+(\w+)\s+(\w+)\s*;")
_TRAITS = re.compile(r"XLA_FFI_DEFINE_STRUCT_TRAITS\(\s*(\w+)\s*,\s*(\w+)\s*\)\s*;")
_API_FIELD = re.compile(r"_XLA_FFI_API_STRUCT_FIELD\((\w+)\)")
_FN_POINTER = re.compile(r"\(\s*\*\s*(\w+)\s*\)\s*\(.*\)$", re.S)
_ENUM_BODY = re.compile(r"\benum\s*\w*\s*\{(.*?)\}", re.S)
_CONSTANT = re.compile(r"\b(XLA_FFI_\w+)\s*=\s*(\d+)u?(?:\s*<<\s*(\d+))?\s*(?:,|$)")


@dataclass(frozen=True)
class _Header:
    version: tuple[int, int]
    structs: dict[str, type[ctypes.Structure]]
    sizes: dict[str, int]  # XLA_FFI_DEFINE_STRUCT_TRAITS: struct -> declared struct_size
    constants: dict[str, int]  # enum constant -> value (those given as a number or 1u << n)


def _field(decl: str, known: dict[str, type]) -> tuple[str, type]:
    """``(name, ctype)`` of one C member declaration."""
    decl = " ".join(decl.replace("const ", " ").split())
    fn = _FN_POINTER.search(decl)
    if fn:
        return fn.group(1), ctypes.c_void_p
    m = re.fullmatch(r"(?:struct\s+)?(\w+)\s*(\**)\s*(\w+)", decl)
    if not m:
        raise ValueError(f"cannot read the member declaration {decl!r}")
    ctype, stars, name = m.groups()
    if stars:
        return name, ctypes.c_void_p
    if ctype not in known:
        raise ValueError(f"member {name!r} has the unknown type {ctype!r}")
    return name, known[ctype]


def parse(text: str) -> _Header:
    """The API version, the structs (as ctypes types), their declared sizes and the enum
    constants of a header's text."""
    text = _COMMENT.sub("", text)
    version = []
    for part in ("MAJOR", "MINOR"):
        m = re.search(rf"#define\s+XLA_FFI_API_{part}\s+(\d+)", text)
        if not m:
            raise ValueError(f"no XLA_FFI_API_{part} in the header")
        version.append(int(m.group(1)))
    known: dict[str, type] = dict(_C_TYPES)
    for m in _ENUM.finditer(text):
        known[m.group(1)] = ctypes.c_int
    for m in _TYPEDEF.finditer(text):
        if m.group(1) in known:
            known[m.group(2)] = known[m.group(1)]
    structs: dict[str, type[ctypes.Structure]] = {}
    for m in _STRUCT.finditer(text):
        name, body = m.groups()
        body = _API_FIELD.sub(r"\1* \1", body)
        fields = [_field(d, known) for d in body.split(";") if d.strip()]
        cls = type(name, (ctypes.Structure,), {"_fields_": fields})
        structs[name] = known[name] = cls
    sizes = {}
    for m in _TRAITS.finditer(text):
        sname, last = m.groups()
        if sname in structs:
            sizes[sname] = getattr(structs[sname], last).offset + ctypes.sizeof(
                dict(structs[sname]._fields_)[last]
            )
    constants = {}
    for m in _ENUM_BODY.finditer(text):
        for item in m.group(1).split(","):
            c = _CONSTANT.search(item.strip())
            if c:
                constants[c.group(1)] = int(c.group(2)) << int(c.group(3) or 0)
    return _Header((version[0], version[1]), structs, sizes, constants)


def read(path: str) -> _Header:
    """:func:`parse` of the header file *path*."""
    with open(path, encoding="utf-8") as f:
        return parse(f.read())


def _layout(cls: type[ctypes.Structure]) -> list[tuple[str, int, int]]:
    return [(name, getattr(cls, name).offset, getattr(cls, name).size) for name, *_ in cls._fields_]


def _differences(header: _Header, generation: _capi.Generation) -> list[str]:
    """What *generation*'s mirrors get wrong against *header* (empty: nothing)."""
    found = []
    for name, mirror in generation.mirrors.items():
        theirs = header.structs.get(name)
        if theirs is None:
            found.append(f"{name} is not declared")
            continue
        ours, want = _layout(mirror), _layout(theirs)
        for i, field in enumerate(ours):
            if i >= len(want):
                found.append(f"{name}.{field[0]} is not declared (the struct ends before it)")
                break
            if field != want[i]:
                found.append(
                    f"{name} field {i}: ours is {field[0]} at offset {field[1]} ({field[2]} "
                    f"bytes), the header's is {want[i][0]} at offset {want[i][1]} "
                    f"({want[i][2]} bytes)"
                )
                break
        if name in generation.written and name in header.sizes:
            size = _capi.struct_size(mirror)
            if size != header.sizes[name]:
                found.append(
                    f"{name} is written with struct_size {size}, the header declares "
                    f"{header.sizes[name]}"
                )
    for name, value in generation.constants.items():
        theirs_value = header.constants.get(name)
        if theirs_value is None:
            found.append(f"the enum constant {name} is not declared")
        elif theirs_value != value:
            found.append(f"the enum constant {name} is {theirs_value}, pycudnn.jax's is {value}")
    return found


def select(header: _Header) -> tuple[_capi.Generation | None, list[str]]:
    """The layout generation of *header*, and an empty list; or None and why none fits.

    A generation is a candidate when the header declares its distinguishing structs (its
    ``markers``: the extension header's and the error getter's argument struct's names); the
    first candidate (newest first) whose every mirror, written size and constant matches the
    header is selected. Without a candidate, the reasons name each generation's missing
    structs; with candidates that all differ, each candidate's differences."""
    missing_by_generation, wrong_by_candidate = [], []
    for g in _capi.GENERATIONS:
        missing = [m for m in g.markers if m not in header.structs]
        if missing:
            missing_by_generation.append(
                f"not API {g.name}'s layout ({g.written_from}): "
                + ", ".join(f"{m} is not declared" for m in missing)
            )
            continue
        wrong = _differences(header, g)
        if not wrong:
            return g, []
        wrong_by_candidate.append(
            f"as API {g.name}'s layout ({g.written_from}): " + "; ".join(wrong)
        )
    return None, wrong_by_candidate or missing_by_generation


def check(where: str, jaxlib_version: str) -> AbiReport:
    """Hold the mirrors against the header ``where/xla/ffi/api/c_api.h`` (*where* an include
    directory, as ``jax.ffi.include_dir()``), or against the header file *where* itself (a path
    ending in ``.h``); select its layout generation and raise :class:`UnsupportedJaxlibError`
    (naming *jaxlib_version*) when it has none or differs from it."""
    path = where if where.endswith(".h") else os.path.join(where, HEADER)
    where_text = f"jaxlib {jaxlib_version} ({path})"
    try:
        header = read(path)
    except OSError as exc:
        raise UnsupportedJaxlibError(
            f"{where_text}: the XLA FFI header cannot be read ({exc}); pycudnn.jax checks the "
            "struct layouts against it before registering a handler"
        ) from exc
    except ValueError as exc:
        raise UnsupportedJaxlibError(
            f"{where_text}: the XLA FFI header cannot be parsed: {exc}"
        ) from exc
    major, minor = header.version
    if major != _capi.SUPPORTED_MAJOR:
        raise UnsupportedJaxlibError(
            f"{where_text} has XLA FFI API version {major}.{minor}; pycudnn.jax supports major "
            f"version {_capi.SUPPORTED_MAJOR} only"
        )
    generation, wrong = select(header)
    if generation is None:
        raise UnsupportedJaxlibError(
            f"{where_text} (XLA FFI API version {major}.{minor}): the XLA FFI structs differ "
            "from pycudnn.jax's mirrors of every layout it knows ("
            + ", ".join(f"API {g.name}: {g.written_from}" for g in _capi.GENERATIONS)
            + "): "
            + " | ".join(wrong)
        )
    return AbiReport(
        jaxlib_version,
        path,
        header.version,
        {
            name: header.sizes.get(name, ctypes.sizeof(header.structs[name]))
            for name in generation.mirrors
        },
        generation.name,
    )
