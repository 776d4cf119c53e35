#!/usr/bin/env python3
"""Generate pycudnn's raw layer from cuDNN's headers.

Pipeline: ``cudnn.h`` --libclang--> manifest (JSON) --render--> ``pycudnn/_generated/``:
``lib.py``, ``lib.pyi`` and ``enums.py`` (with the folder's ``__init__.py``). ``pycudnn.lib`` and
``pycudnn.enums`` are their hand-written public faces; ``tools/gen_backend_attrs.py`` writes the
folder's fourth module, ``backend_attrs.py``. Nothing else in the package is generated, and
nothing in that folder is written by hand.

The header is parsed hermetically (``-nostdinc``, the stubs in ``tools/stubs``) and with
``-DCUDNN_WARN_DEPRECATED`` so deprecation is visible to clang. Any error diagnostic aborts:
when clang cannot see ``size_t`` it silently types it as ``int``, which would corrupt memory
through ctypes.

Usage::

    python tools/gen_bindings.py                 # regenerate from the installed headers
    python tools/gen_bindings.py --check         # exit 1 if the checked-in files are stale
    python tools/gen_bindings.py --include DIR   # headers from DIR instead of cuda.pathfinder

This script imports nothing from pycudnn.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import keyword
import re
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

GENERATOR_VERSION = "1"
ROOT = Path(__file__).resolve().parent.parent
STUBS = Path(__file__).resolve().parent / "stubs"
SEAL_PREFIX = "# content-sha256: "
REGEN_COMMAND = "python tools/gen_bindings.py"

# ---------------------------------------------------------------------------------------------
# Type mapping
# ---------------------------------------------------------------------------------------------

# Typedef names mapped as written, never through their canonical type (LLP64 differs, and the
# stub libc is LP64 only).
NAMED_TYPES = {
    "size_t": "ctypes.c_size_t",
    "int8_t": "ctypes.c_int8",
    "int16_t": "ctypes.c_int16",
    "int32_t": "ctypes.c_int32",
    "int64_t": "ctypes.c_int64",
    "uint8_t": "ctypes.c_uint8",
    "uint16_t": "ctypes.c_uint16",
    "uint32_t": "ctypes.c_uint32",
    "uint64_t": "ctypes.c_uint64",
    "libraryPropertyType": "ctypes.c_int",
}

# CUDA types cudnn.h borrows: distinct c_void_p subclasses that still accept raw ints.
EXTERNAL_HANDLES = {"cudaStream_t": "CUstream_st", "cudaGraph_t": "CUgraph_st"}

BUILTIN_TYPES = {
    "void": None,
    "char": "ctypes.c_char",
    "signed char": "ctypes.c_byte",
    "unsigned char": "ctypes.c_ubyte",
    "short": "ctypes.c_short",
    "unsigned short": "ctypes.c_ushort",
    "int": "ctypes.c_int",
    "unsigned int": "ctypes.c_uint",
    "long": "ctypes.c_long",
    "unsigned long": "ctypes.c_ulong",
    "long long": "ctypes.c_longlong",
    "unsigned long long": "ctypes.c_ulonglong",
    "float": "ctypes.c_float",
    "double": "ctypes.c_double",
}

PY_TYPES = {  # ctypes name -> annotation used in the .pyi
    "ctypes.c_size_t": "int",
    "ctypes.c_char_p": "bytes | ctypes.Array[ctypes.c_char] | None",
    "ctypes.c_void_p": "int | ctypes.c_void_p | None",
    "ctypes.c_float": "float",
    "ctypes.c_double": "float",
}


class GenerationError(RuntimeError):
    """The headers could not be turned into bindings without guessing."""


# ---------------------------------------------------------------------------------------------
# Parsing (libclang)
# ---------------------------------------------------------------------------------------------


@dataclass
class Parsed:
    include_dir: Path
    functions: list = field(default_factory=list)
    enums: list = field(default_factory=list)
    structs: list = field(default_factory=list)
    handles: list = field(default_factory=list)
    opaque_structs: list = field(default_factory=list)
    callbacks: list = field(default_factory=list)
    defines: list = field(default_factory=list)


def _summary(raw: str | None) -> str:
    """First sentence of a Doxygen comment's ``@brief`` (or of its first paragraph)."""
    if not raw:
        return ""
    text = re.sub(r"^\s*/\*\*?<?|\*/\s*$", "", raw.strip())
    lines = [re.sub(r"^\s*\*\s?", "", ln).strip() for ln in text.splitlines()]
    body = []
    for ln in lines:
        if ln.startswith("@brief"):
            ln = ln[len("@brief") :].strip()
        elif ln.startswith("@") or (not ln and body):
            if body:
                break
            continue
        if ln:
            body.append(ln)
    s = " ".join(body).strip()
    m = re.match(r"(.+?\.)(\s|$)", s)
    return (m.group(1) if m else s).replace('"""', "'''")


def _since(raw: str | None) -> str | None:
    m = re.search(r"@since\s+cuDNN\s+([0-9.]+)", raw or "")
    return m.group(1) if m else None


def _doc_deprecated(raw: str | None) -> bool:
    return "@deprecated" in (raw or "")


def parse_headers(include_dir: Path, libclang_path: str | None = None) -> Parsed:
    import clang.cindex as ci

    if libclang_path:
        ci.Config.set_library_file(libclang_path)
    include_dir = include_dir.resolve()
    header = include_dir / "cudnn.h"
    if not header.is_file():
        raise GenerationError(f"{header} not found")
    args = [
        "-x",
        "c",
        "-std=c99",
        "-nostdinc",
        "-I",
        str(STUBS / "libc"),
        "-I",
        str(STUBS / "cuda"),
        "-I",
        str(include_dir),
        "-DCUDNN_WARN_DEPRECATED",
    ]
    opts = ci.TranslationUnit.PARSE_DETAILED_PROCESSING_RECORD | (
        ci.TranslationUnit.PARSE_SKIP_FUNCTION_BODIES
    )
    tu = ci.Index.create().parse(str(header), args=args, options=opts)
    errors = [d for d in tu.diagnostics if d.severity >= ci.Diagnostic.Error]
    if errors:
        msg = "\n".join(f"  {d.location.file}:{d.location.line}: {d.spelling}" for d in errors)
        raise GenerationError(
            f"libclang reported {len(errors)} error(s); refusing to guess:\n{msg}"
        )
    is_fn_like = ci.conf.lib.clang_Cursor_isMacroFunctionLike
    is_fn_like.argtypes, is_fn_like.restype = [ci.Cursor], ctypes.c_uint

    out = Parsed(include_dir)
    TK, CK = ci.TypeKind, ci.CursorKind
    DEPRECATED = ci.AvailabilityKind.DEPRECATED

    def ours(cur) -> bool:
        f = cur.location.file
        return f is not None and Path(f.name).resolve().parent == include_dir

    def where(cur) -> str:
        return f"{Path(cur.location.file.name).name}:{cur.location.line}"

    def deprecated(cur) -> bool:
        return cur.availability == DEPRECATED

    enum_names: set[str] = set()
    struct_names: set[str] = set()
    handle_names: set[str] = set()
    callback_names: set[str] = set()

    def type_ref(t) -> dict:
        """A JSON description of a type as written: {kind, name|to|of, const, len}."""
        const = t.is_const_qualified()
        k = t.kind
        if k == TK.ELABORATED:
            inner = type_ref(t.get_named_type())
            inner["const"] = inner.get("const", False) or const
            return inner
        if k == TK.TYPEDEF:
            return {"kind": "named", "name": t.get_declaration().spelling, "const": const}
        if k in (TK.POINTER,):
            return {"kind": "pointer", "to": type_ref(t.get_pointee()), "const": const}
        if k == TK.INCOMPLETEARRAY:
            return {"kind": "array", "of": type_ref(t.element_type), "const": const}
        if k == TK.CONSTANTARRAY:
            return {"kind": "array", "of": type_ref(t.element_type), "len": t.element_count}
        if k in (TK.RECORD, TK.ENUM):
            return {"kind": "named", "name": t.get_declaration().spelling, "const": const}
        spelling = t.spelling.replace("const ", "").strip()
        if spelling in BUILTIN_TYPES:
            return {"kind": "builtin", "name": spelling, "const": const}
        raise GenerationError(f"unsupported type {t.spelling!r} (kind {k})")

    for cur in tu.cursor.get_children():
        if not ours(cur):
            continue
        raw = cur.raw_comment
        if cur.kind == CK.MACRO_DEFINITION:
            toks = [t.spelling for t in cur.get_tokens()][1:]
            out.defines.append(
                {
                    "name": cur.spelling,
                    "where": where(cur),
                    "function_like": bool(is_fn_like(cur)),
                    "tokens": toks,
                }
            )
        elif cur.kind == CK.TYPEDEF_DECL:
            under = cur.underlying_typedef_type
            name = cur.spelling
            decl = under.get_declaration()
            canon = under.get_canonical()
            if canon.kind == TK.ENUM:
                members = []
                for m in decl.get_children():
                    if m.kind != CK.ENUM_CONSTANT_DECL:
                        continue
                    toks = [t.spelling for t in m.get_tokens()]
                    expr = toks[toks.index("=") + 1 :] if "=" in toks else []
                    mem = {
                        "name": m.spelling,
                        "value": m.enum_value,
                        "where": where(m),
                        "deprecated": deprecated(m),
                    }
                    if len(expr) == 1 and re.match(r"[A-Za-z_]", expr[0]):
                        mem["alias_of"] = expr[0]
                    members.append(mem)
                tokens = [t.spelling for t in decl.get_tokens()][:2]
                draw = decl.raw_comment or raw
                out.enums.append(
                    {
                        "name": name,
                        "tag": None if tokens[1:2] == ["{"] else decl.spelling,
                        "where": where(cur),
                        "deprecated": deprecated(cur) or deprecated(decl),
                        "doc_deprecated": _doc_deprecated(draw),
                        "since": _since(draw),
                        "summary": _summary(draw),
                        "members": members,
                    }
                )
                enum_names.add(name)
            elif canon.kind == TK.RECORD and decl.is_definition():
                fields = []
                for f in canon.get_fields():
                    fields.append(
                        {
                            "name": f.spelling,
                            "type": type_ref(f.type),
                            "offset": canon.get_offset(f.spelling) // 8,
                            "size": f.type.get_size(),
                        }
                    )
                draw = decl.raw_comment or raw
                out.structs.append(
                    {
                        "name": name,
                        "tag": decl.spelling if decl.spelling != name else None,
                        "where": where(cur),
                        "deprecated": deprecated(cur),
                        "summary": _summary(draw),
                        "size": canon.get_size(),
                        "align": canon.get_align(),
                        "fields": fields,
                    }
                )
                struct_names.add(name)
            elif canon.kind == TK.RECORD:
                out.opaque_structs.append(
                    {"name": name, "where": where(cur), "deprecated": deprecated(cur)}
                )
            elif canon.kind == TK.POINTER and canon.get_pointee().kind == TK.FUNCTIONPROTO:
                proto = canon.get_pointee()
                params = [c for c in cur.get_children() if c.kind == CK.PARM_DECL]
                out.callbacks.append(
                    {
                        "name": name,
                        "where": where(cur),
                        "summary": _summary(raw),
                        "result": type_ref(proto.get_result()),
                        "params": [{"name": p.spelling, "type": type_ref(p.type)} for p in params],
                    }
                )
                callback_names.add(name)
            elif canon.kind == TK.POINTER and canon.get_pointee().kind in (TK.RECORD, TK.VOID):
                pointee = under.get_pointee()
                target = None
                if pointee.kind != TK.VOID:
                    target = pointee.get_declaration().spelling
                out.handles.append(
                    {
                        "name": name,
                        "struct": target,
                        "where": where(cur),
                        "deprecated": deprecated(cur),
                        "summary": _summary(raw),
                    }
                )
                handle_names.add(name)
            else:
                raise GenerationError(f"unclassified typedef {name} at {where(cur)}")
        elif cur.kind == CK.FUNCTION_DECL:
            params = []
            for p in cur.get_arguments():
                params.append({"name": p.spelling, "type": type_ref(p.type)})
            out.functions.append(
                {
                    "name": cur.spelling,
                    "where": where(cur),
                    "header": Path(cur.location.file.name).name,
                    "deprecated": deprecated(cur),
                    "doc_deprecated": _doc_deprecated(raw),
                    "since": _since(raw),
                    "summary": _summary(raw),
                    "result": type_ref(cur.result_type),
                    "params": params,
                }
            )
    return out


# ---------------------------------------------------------------------------------------------
# Manifest
# ---------------------------------------------------------------------------------------------


def _eval_define(tokens: list[str], env: dict) -> int | float | None:
    expr = []
    for t in tokens:
        if re.fullmatch(r"[0-9]+[uUlL]*", t):
            expr.append(re.sub(r"[uUlL]+$", "", t))
        elif re.fullmatch(r"[0-9.]+([eE][-+]?[0-9]+)?[fF]?", t):
            expr.append(t.rstrip("fF"))
        elif t in env:
            expr.append(repr(env[t]))
        elif t in {"(", ")", "+", "-", "*", "/", "<<", ">>", "|", "&"}:
            expr.append(" // " if t == "/" else t)
        else:
            return None
    if not expr:
        return None
    try:
        # Only digits, operators and already-evaluated names reach eval.
        return eval("".join(expr), {"__builtins__": {}}, {})
    except (SyntaxError, ArithmeticError, TypeError, ValueError):
        return None


def classify_define(name: str, function_like: bool, tokens: list[str]) -> str:
    if function_like:
        return "function_like"
    if name in {"CUDNNWINAPI", "CUDNN_DEPRECATED", "CUDNN_DEPRECATED_ENUM"}:
        return "decoration"
    if name.endswith(("_H_", "_H")):
        return "include_guard"
    if re.fullmatch(r"CUDNN_(MAJOR|MINOR|PATCHLEVEL|VERSION|MAX_SM_\w+|MAX_DEVICE_VERSION)", name):
        return "version"
    if re.fullmatch(r"CUDNN_[A-Z]+_(MAJOR|MINOR|PATCH)", name):
        return "sublibrary_version"
    return "constant"


def build_manifest(p: Parsed) -> dict:
    env: dict = {}
    for e in p.enums:
        for m in e["members"]:
            env[m["name"]] = m["value"]
    defines = []
    seen = set()
    for d in p.defines:
        if d["name"] in seen:  # an #if branch already taken (CUDNN_DEPRECATED etc.)
            continue
        seen.add(d["name"])
        kind = classify_define(d["name"], d["function_like"], d["tokens"])
        entry = {
            "name": d["name"],
            "where": d["where"],
            "kind": kind,
            "expr": " ".join(d["tokens"]),
        }
        if kind in ("version", "sublibrary_version", "constant"):
            value = _eval_define(d["tokens"], env)
            if value is None:
                raise GenerationError(f"cannot evaluate #define {d['name']} = {entry['expr']}")
            entry["value"] = value
            env[d["name"]] = value
        defines.append(entry)
    version = {k: env.get(k) for k in ("CUDNN_MAJOR", "CUDNN_MINOR", "CUDNN_PATCHLEVEL")}
    if None in version.values():
        raise GenerationError("cudnn_version.h did not define CUDNN_MAJOR/MINOR/PATCHLEVEL")
    headers = sorted({f["header"] for f in p.functions} | {"cudnn.h"})
    sha = {}
    for h in sorted(set(headers) | {Path(d["where"].split(":")[0]).name for d in p.defines}):
        path = p.include_dir / h
        if path.is_file():
            sha[h] = hashlib.sha256(path.read_bytes()).hexdigest()
    members = sum(len(e["members"]) for e in p.enums)
    return {
        "generator_version": GENERATOR_VERSION,
        "header_version": "{CUDNN_MAJOR}.{CUDNN_MINOR}.{CUDNN_PATCHLEVEL}".format(**version),
        "header_version_int": env.get("CUDNN_VERSION"),
        "header_sha256": sha,
        "counts": {
            "functions": len(p.functions),
            "deprecated_functions": sum(f["deprecated"] for f in p.functions),
            "enums": len(p.enums),
            "enum_members": members,
            "structs": len(p.structs),
            "handles": len(p.handles),
            "opaque_structs": len(p.opaque_structs),
            "callbacks": len(p.callbacks),
            "defines": len(defines),
        },
        "functions": p.functions,
        "enums": p.enums,
        "structs": p.structs,
        "handles": p.handles,
        "opaque_structs": p.opaque_structs,
        "callbacks": p.callbacks,
        "defines": defines,
    }


# ---------------------------------------------------------------------------------------------
# Rendering helpers
# ---------------------------------------------------------------------------------------------


class Types:
    """Turns manifest type references into ctypes expressions and .pyi annotations."""

    def __init__(self, m: dict):
        self.enums = {e["name"] for e in m["enums"]}
        self.structs = {s["name"] for s in m["structs"]}
        self.handles = {h["name"] for h in m["handles"]}
        self.opaque = {s["name"] for s in m["opaque_structs"]}
        self.callbacks = {c["name"] for c in m["callbacks"]}

    def ctype(self, t: dict, *, param: bool = False) -> str | None:
        k = t["kind"]
        if k == "builtin":
            return BUILTIN_TYPES[t["name"]]
        if k == "named":
            n = t["name"]
            if n in NAMED_TYPES:
                return NAMED_TYPES[n]
            if n in self.enums or n in self.structs or n in self.handles or n in self.callbacks:
                return n
            if n in EXTERNAL_HANDLES:
                return n
            if n in self.opaque:
                return n
            raise GenerationError(f"unknown type name {n!r}")
        if k in ("pointer", "array") and "len" not in t:
            inner = t["to"] if k == "pointer" else t["of"]
            if inner["kind"] == "builtin" and inner["name"] == "void":
                return "ctypes.c_void_p"
            if inner["kind"] == "builtin" and inner["name"] == "char":
                return "ctypes.c_char_p"
            return f"POINTER({self.ctype(inner)})"
        if k == "array":
            return f"{self.ctype(t['of'])} * {t['len']}"
        raise GenerationError(f"cannot map {t}")

    def pytype(self, t: dict) -> str:
        c = self.ctype(t)
        if c is None:
            return "None"
        if c in PY_TYPES:
            return PY_TYPES[c]
        if c.startswith("ctypes.c_") or (t["kind"] == "named" and t["name"] in self.enums):
            return "int"
        if t["kind"] == "named" and t["name"] in self.handles | set(EXTERNAL_HANDLES):
            return f"{c} | int | None"
        if c.startswith("POINTER("):
            return "_Pointer"
        return c

    def restype_py(self, t: dict) -> str:
        c = self.ctype(t)
        if c == "ctypes.c_char_p":
            return "bytes | None"
        return self.pytype(t)

    @staticmethod
    def c_spelling(t: dict) -> str:
        k = t["kind"]
        const = "const " if t.get("const") else ""
        if k in ("builtin", "named"):
            return f"{const}{t['name']}"
        if k == "pointer":
            return f"{Types.c_spelling(t['to'])} *{'const' if t.get('const') else ''}".rstrip()
        if "len" in t:
            return f"{Types.c_spelling(t['of'])}[{t['len']}]"
        return f"{Types.c_spelling(t['of'])}[]"


def _enum_class_name(c_name: str) -> str:
    n = re.sub(r"^cudnn", "", c_name)
    n = re.sub(r"_t$", "", n)
    return n[0].upper() + n[1:]


# Members whose prefix-stripped name would be unusable or misleading.
MEMBER_OVERRIDES: dict[str, str] = {}


def _member_prefix(enum: dict) -> tuple[str, dict[str, str]]:
    """The C prefix stripped from *enum*'s members, and {C name: Python name}."""
    names = [m["name"] for m in enum["members"]]
    parts = [n.split("_") for n in names]
    common = 0
    if len(parts) > 1:
        for i in range(min(len(p) for p in parts)):
            if len({p[i] for p in parts}) == 1:
                common = i + 1
            else:
                break
    else:
        common = max(len(parts[0]) - 1, 0)
    common = min(common, min(len(p) for p in parts) - 1)

    def ok(n: str) -> bool:
        return bool(n) and n.isidentifier() and not keyword.iskeyword(n) and not n[0].isdigit()

    while common > 0 and not all(ok("_".join(p[common:])) for p in parts):
        common -= 1
    result = {}
    for n, p in zip(names, parts, strict=True):
        result[n] = MEMBER_OVERRIDES.get(n, "_".join(p[common:]))
    if len(set(result.values())) != len(result):
        raise GenerationError(f"member names of {enum['name']} collide after prefix stripping")
    prefix = "_".join(parts[0][:common]) + "_" if common else ""
    return prefix, result


def _banner(m: dict, what: str) -> list[str]:
    return [
        f"# {what}",
        f"# Generated by tools/gen_bindings.py (generator v{GENERATOR_VERSION}) "
        + f"from the cuDNN {m['header_version']} headers.",
        "# DO NOT EDIT: changes are lost on regeneration and the seal test fails.",
        f"# Regenerate: {REGEN_COMMAND}  (check: {REGEN_COMMAND} --check)",
    ]


def seal(text: str) -> str:
    """Insert the content-sha256 line (hash of the text without it) after the banner."""
    lines = text.split("\n")
    body = "\n".join(ln for ln in lines if not ln.startswith(SEAL_PREFIX))
    digest = hashlib.sha256(body.encode()).hexdigest()
    idx = next(i for i, ln in enumerate(lines) if ln.startswith("# Regenerate:")) + 1
    lines.insert(idx, SEAL_PREFIX + digest)
    return "\n".join(lines)


def verify_seal(text: str) -> bool:
    """True when a generated file's seal matches its content."""
    lines = text.split("\n")
    found = [ln for ln in lines if ln.startswith(SEAL_PREFIX)]
    if len(found) != 1:
        return False
    body = "\n".join(ln for ln in lines if not ln.startswith(SEAL_PREFIX))
    return found[0][len(SEAL_PREFIX) :] == hashlib.sha256(body.encode()).hexdigest()


def _py_literal(v) -> str:
    return repr(v)


def _section(title: str) -> str:
    return f"# -- {title} ".ljust(99, "-")


def _docstring(summary: str, ref: str, indent: str = "    ") -> list[str]:
    """A one-line docstring when it fits in 100 columns, else summary + blank line + reference."""
    one = f'{indent}"""{summary + " " if summary else ""}{ref}"""'
    if len(one) <= 100:
        return [one]
    body = textwrap.wrap(summary, 96 - len(indent)) or [""]
    first, rest = body[0], [f"{indent}{ln}" for ln in body[1:]]
    return [f'{indent}"""{first}', *rest, "", f"{indent}{ref}", f'{indent}"""']


# ---------------------------------------------------------------------------------------------
# _generated/enums.py
# ---------------------------------------------------------------------------------------------

ENUMS_HEAD = '''"""Every cuDNN C enum as an ``IntEnum`` (generated).

Class names drop the ``cudnn`` prefix and ``_t`` suffix (``cudnnDataType_t`` -> ``DataType``);
member names drop the enum's common prefix (``CUDNN_DATA_FLOAT`` -> ``DataType.FLOAT``).
Aliases (two C names with one value) resolve to the first name, as in C. Deprecated members are
kept and listed in ``DEPRECATED_MEMBERS``; ``by_c_name`` finds a member by its C name.
"""

import enum


class CudnnEnum(enum.IntEnum):
    """Base of the generated enums: adds the C spellings."""

    @property
    def c_name(self) -> str:
        """The C name of this member (``CUDNN_DATA_FLOAT``)."""
        cls = type(self).__name__
        for c_name, (owner, name) in _C_NAME_OVERRIDES.items():
            if owner == cls and name == self.name:
                return c_name
        return _C_PREFIXES[cls] + self.name

    @classmethod
    def c_type(cls) -> str:
        """The C enum type (``cudnnDataType_t``)."""
        return _C_TYPES[cls.__name__]

    @property
    def deprecated(self) -> bool:
        """True when cuDNN marks this member ``CUDNN_DEPRECATED_ENUM`` (or its type deprecated)."""
        return self.c_name in DEPRECATED_MEMBERS

'''

STATUS_EXTRA = '''
    @property
    def category(self) -> int:
        """The status category (``code // 1000 * 1000``): 0, 1000, 2000, 3000, 4000 or 5000."""
        return category_of(int(self))
'''

ENUMS_TAIL = '''

def category_of(code: int) -> int:
    """``CUDNN_STATUS_CATEGORY`` for any status code, known or not."""
    return int(code) // 1000 * 1000


def by_c_name(name: str) -> CudnnEnum:
    """Return the member whose C name is *name* (``by_c_name("CUDNN_DATA_FLOAT")``)."""
    if name in _C_NAME_OVERRIDES:
        cls_name, member = _C_NAME_OVERRIDES[name]
        return globals()[cls_name][member]
    # the longest matching prefix wins (CUDNN_ATTR_ vs CUDNN_ATTR_POINTWISE_, say)
    for cls_name, prefix in sorted(_C_PREFIXES.items(), key=lambda kv: -len(kv[1])):
        if name.startswith(prefix):
            member = globals()[cls_name].__members__.get(name[len(prefix) :])
            if member is not None:
                return member
    raise KeyError(f"no cuDNN enum member is named {name!r}")
'''


def render_enums(m: dict) -> str:
    out = [*_banner(m, "cuDNN enums."), ENUMS_HEAD.rstrip("\n"), ""]
    prefixes: dict[str, str] = {}
    overrides: dict[str, tuple[str, str]] = {}
    deprecated: list[str] = []
    for e in m["enums"]:
        cls = _enum_class_name(e["name"])
        prefix, names = _member_prefix(e)
        prefixes[cls] = prefix
        out.append("")
        out.append(f"class {cls}(CudnnEnum):")
        dep = " Deprecated." if e["deprecated"] else ""
        out += _docstring(e["summary"], f"See ``{e['name']}`` ({e['where']}).{dep}")
        out.append("")
        for mem in e["members"]:
            py = names[mem["name"]]
            note = " (deprecated)" if mem["deprecated"] or e["deprecated"] else ""
            line = f"    {py} = {mem['value']}"
            comment = f"  # {mem['name']}{note}"
            if len(line + comment) > 100:  # ruff would wrap it: put the C name above instead
                out.append(f"    #{comment[3:]}")
                comment = ""
            out.append(line + comment)
            if prefix + py != mem["name"]:
                overrides[mem["name"]] = (cls, py)
            if mem["deprecated"] or e["deprecated"]:
                deprecated.append(mem["name"])
        if e["name"] == "cudnnStatus_t":
            out.append(STATUS_EXTRA.rstrip("\n"))
        out.append("")
    out.append("")
    out.append("_C_TYPES = {")
    for e in m["enums"]:
        out.append(f'    "{_enum_class_name(e["name"])}": "{e["name"]}",')
    out.append("}")
    out.append("# C name = prefix + Python name, except for the overrides below")
    out.append("_C_PREFIXES = {")
    for cls, prefix in prefixes.items():
        out.append(f'    "{cls}": "{prefix}",')
    out.append("}")
    out.append("_C_NAME_OVERRIDES: dict[str, tuple[str, str]] = {" + ("" if overrides else "}"))
    if overrides:
        out.extend(f'    "{c}": ("{cls}", "{py}"),' for c, (cls, py) in overrides.items())
        out.append("}")
    out.append("DEPRECATED_MEMBERS = frozenset(")
    out.append("    {")
    for c in deprecated:
        out.append(f'        "{c}",')
    out.append("    }")
    out.append(")")
    out.append("DEPRECATED_TYPES = frozenset(")
    out.append("    {")
    for e in m["enums"]:
        if e["deprecated"]:
            out.append(f'        "{_enum_class_name(e["name"])}",')
    out.append("    }")
    out.append(")")
    out.append(ENUMS_TAIL.rstrip("\n"))
    out.append("")
    return seal("\n".join(out))


# ---------------------------------------------------------------------------------------------
# _generated/lib.py
# ---------------------------------------------------------------------------------------------

LIB_DOC = '''"""Raw ctypes binding of the cuDNN C API (``cudnn.h``), generated from the headers.

Every function keeps its C name and exact prototype, and returns what C returns (a raw
``cudnnStatus_t`` int for most); nothing here raises on a bad status (``pycudnn.api`` does).
Symbols resolve lazily on first use, so importing this module loads nothing; a function the
loaded library lacks raises ``SymbolNotFoundError`` when called. ``has(name)`` probes.

Each opaque handle typedef is a distinct ``c_void_p`` subclass: ctypes rejects a filter
descriptor where a tensor descriptor is expected, while raw integer addresses still pass.
Enum parameters are ``c_int`` (every cuDNN enum is int-sized; one is signed).
"""

import ctypes
from ctypes import POINTER

from .. import _loader
'''

LIB_TAIL = '''

def __getattr__(name: str):
    """Bind ``name`` on first access (loading libcudnn if needed) and cache it here."""
    proto = PROTOTYPES.get(name)
    if proto is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    fn = _loader.bind(name, proto[0], proto[1])
    globals()[name] = fn
    return fn


def has(name: str) -> bool:
    """True when ``name`` is a cudnn.h function and the loaded library exports it."""
    return name in PROTOTYPES and _loader.has_symbol(name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(PROTOTYPES))
'''


def _wrap_tuple(items: list[str], indent: str) -> list[str]:
    """A tuple literal, one item per line (ruff keeps it expanded thanks to the trailing comma)."""
    if not items:
        return [f"{indent}(),"]
    if len(items) == 1 and len(indent) + len(items[0]) + 4 <= 100:
        return [f"{indent}({items[0]},),"]
    return [f"{indent}("] + [f"{indent}    {it}," for it in items] + [f"{indent}),"]


def render_lib(m: dict) -> str:
    T = Types(m)
    out = [*_banner(m, "cuDNN raw API (ctypes)."), LIB_DOC.rstrip("\n"), ""]
    hv = m["header_version"]
    out.append(f'HEADER_VERSION_STRING = "{hv}"')
    out.append(f"HEADER_VERSION = {m['header_version_int']}")
    out.append("")
    out.append(_section("#define constants"))
    for d in m["defines"]:
        if "value" in d:
            out.append(f"{d['name']} = {_py_literal(d['value'])}  # {d['where']}")
    out.append("")
    out.append("")
    out.append("# The function-like status macros of cudnn_graph.h.")
    out.append("def CUDNN_STATUS_FULL_ERROR_CODE(category: int, specific_err: int) -> int:")
    out.append("    return category + specific_err")
    out.append("")
    out.append("")
    out.append("def CUDNN_STATUS_CATEGORY(full_error_code: int) -> int:")
    out.append("    return full_error_code // 1000 * 1000")
    out.append("")
    out.append("")
    out.append("def CUDNN_STATUS_SPECIFIC_ERROR(full_error_code: int) -> int:")
    out.append("    return full_error_code % 1000")
    out.append("")
    out.append("")
    out.append(_section("enum members under their C names"))
    for e in m["enums"]:
        out.append(f"# {e['name']} ({e['where']})")
        for mem in e["members"]:
            out.append(f"{mem['name']} = {mem['value']}")
    out.append("")
    out.append(_section("enum types: every cuDNN enum is int-sized"))
    for e in m["enums"]:
        out.append(f"{e['name']} = ctypes.c_int")
    out.append("")
    out.append("")
    out.append(_section("opaque handles"))
    ext = [
        {"name": n, "struct": s, "where": "CUDA", "summary": "CUDA type used by cudnn.h."}
        for n, s in EXTERNAL_HANDLES.items()
    ]
    for h in ext + m["handles"]:
        target = f"``struct {h['struct']} *``" if h["struct"] else "``void *``"
        out.append(f"class {h['name']}(ctypes.c_void_p):")
        out += _docstring(f"Opaque {target}.", f"See ``{h['name']}`` ({h['where']}).")
        out.append("")
        out.append("    __slots__ = ()")
        out.append("")
        out.append("")
    for s in m["opaque_structs"]:
        out.append(f"class {s['name']}(ctypes.Structure):")
        out.append(f'    """Incomplete struct, used only by pointer ({s["where"]})."""')
        out.append("")
        out.append("")
    out.append(_section("structs"))
    for s in m["structs"]:
        out.append(f"class {s['name']}(ctypes.Structure):")
        out += _docstring(s["summary"], f"See ``{s['name']}`` ({s['where']}), {s['size']} bytes.")
        out.append("")
        out.append("    _fields_ = (")
        for f in s["fields"]:
            out.append(f'        ("{f["name"]}", {T.ctype(f["type"])}),')
        out.append("    )")
        out.append("")
        out.append("")
    out.append(_section("callbacks"))
    for c in m["callbacks"]:
        args = [T.ctype(c["result"]) or "None"] + [T.ctype(p["type"]) for p in c["params"]]
        out.append(f"# {c['where']}")
        out.append(f"{c['name']} = ctypes.CFUNCTYPE(")
        out.extend(f"    {a}," for a in args)
        out.append(")")
    out.append("")
    out.append(_section("prototypes: C name -> (restype, argtypes, header:line, deprecated)"))
    out.append("PROTOTYPES = {")
    for f in m["functions"]:
        out.append(f'    "{f["name"]}": (')
        out.append(f"        {T.ctype(f['result'])},")
        out.extend(_wrap_tuple([T.ctype(p["type"], param=True) for p in f["params"]], " " * 8))
        out.append(f'        "{f["where"]}",')
        out.append(f"        {f['deprecated']},")
        out.append("    ),")
    out.append("}")
    out.append("DEPRECATED_FUNCTIONS = frozenset(")
    out.append("    {")
    for f in m["functions"]:
        if f["deprecated"]:
            out.append(f'        "{f["name"]}",')
    out.append("    }")
    out.append(")")
    out.append(LIB_TAIL.rstrip("\n"))
    out.append("")
    return seal("\n".join(out))


# ---------------------------------------------------------------------------------------------
# _generated/lib.pyi
# ---------------------------------------------------------------------------------------------


def render_pyi(m: dict) -> str:
    T = Types(m)
    out = _banner(m, "Type stubs for pycudnn.lib (pycudnn._generated.lib).")
    out += [
        '"""Type stubs for the generated raw cuDNN binding."""',
        "",
        "import ctypes",
        "from ctypes import _Pointer",
        "from typing import Any, Final",
        "",
        "HEADER_VERSION_STRING: Final[str]",
        "HEADER_VERSION: Final[int]",
        "PROTOTYPES: Final[dict[str, tuple[Any, tuple[Any, ...], str, bool]]]",
        "DEPRECATED_FUNCTIONS: Final[frozenset[str]]",
        "",
    ]
    for d in m["defines"]:
        if "value" in d:
            out.append(f"{d['name']}: Final[{type(d['value']).__name__}]")
    out.append("")
    for e in m["enums"]:
        for mem in e["members"]:
            out.append(f"{mem['name']}: Final[int]")
    out.append("")
    for e in m["enums"]:
        out.append(f"{e['name']} = ctypes.c_int")
    out.append("")
    for h in [{"name": n} for n in EXTERNAL_HANDLES] + m["handles"]:
        out.append(f"class {h['name']}(ctypes.c_void_p): ...")
    for s in m["opaque_structs"]:
        out.append(f"class {s['name']}(ctypes.Structure): ...")
    out.append("")
    for s in m["structs"]:
        out.append(f"class {s['name']}(ctypes.Structure):")
        for f in s["fields"]:
            out.append(f"    {f['name']}: Any")
        out.append("")
    for c in m["callbacks"]:
        out.append(f"{c['name']}: type[ctypes._CFuncPtr]")
    out.append("")
    out.append("def has(name: str) -> bool: ...")
    out.append("def CUDNN_STATUS_FULL_ERROR_CODE(category: int, specific_err: int) -> int: ...")
    out.append("def CUDNN_STATUS_CATEGORY(full_error_code: int) -> int: ...")
    out.append("def CUDNN_STATUS_SPECIFIC_ERROR(full_error_code: int) -> int: ...")
    for f in m["functions"]:
        params = [
            f"{p['name'] or f'arg{i}'}: {T.pytype(p['type'])}" for i, p in enumerate(f["params"])
        ]
        ret = T.restype_py(f["result"])
        sig = ", ".join(Types.c_spelling(p["type"]) + " " + p["name"] for p in f["params"])
        if params:
            out.append(f"def {f['name']}(")
            out.extend(f"    {p}," for p in params)
            out.append(f") -> {ret}:")
        else:
            out.append(f"def {f['name']}() -> {ret}:")
        summary = f["summary"] or "(no summary in the header)"
        dep = " Deprecated in cuDNN." if f["deprecated"] else ""
        out.append(f'    """{summary}')
        out.append("")
        out.append(f"    C: ``{Types.c_spelling(f['result'])} {f['name']}({sig or 'void'})``")
        since = f" Since cuDNN {f['since']}." if f["since"] else ""
        out.append(f"    See ``{f['name']}`` ({f['where']}).{since}{dep}")
        out.append('    """')
        out.append("")
    return seal("\n".join(out).rstrip("\n") + "\n")


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def find_include_dir() -> Path:
    try:
        from cuda.pathfinder import find_nvidia_header_directory
    except ImportError as exc:  # pragma: no cover - cuda-pathfinder is a runtime dependency
        raise GenerationError("cuda-pathfinder is not installed; pass --include DIR") from exc
    found = find_nvidia_header_directory("cudnn")
    if not found:
        raise GenerationError(
            "cuDNN headers not found by cuda.pathfinder; install the pinned wheel "
            '(pip install -e ".[test]") or pass --include DIR'
        )
    return Path(found)


def generate(include_dir: Path) -> dict[str, str]:
    """Return {relative output path: text} for the headers in *include_dir*."""
    manifest = build_manifest(parse_headers(include_dir))
    return render_all(manifest)


GENERATED_DIR = "pycudnn/_generated"
OTHER_GENERATED = "backend_attrs.py"  # the folder's module written by tools/gen_backend_attrs.py
PACKAGE_DOC = '''"""Generated code, apart from the hand-written package: never edit a file here.

``lib.py`` / ``lib.pyi`` (the raw ctypes binding, public as ``pycudnn.lib``) and ``enums.py``
(public as ``pycudnn.enums``) come from ``tools/gen_bindings.py``; ``backend_attrs.py`` (the
backend attribute table) from ``tools/gen_backend_attrs.py``. Each carries its seal or source
hash, and ``--check`` of its tool says whether it is up to date.
"""
'''


def render_package(m: dict) -> str:
    return seal("\n".join([*_banner(m, "pycudnn._generated: the generated modules."), PACKAGE_DOC]))


def render_all(manifest: dict) -> dict[str, str]:
    return {
        "tools/cudnn_api.json": json.dumps(manifest, indent=1, sort_keys=False) + "\n",
        f"{GENERATED_DIR}/__init__.py": render_package(manifest),
        f"{GENERATED_DIR}/lib.py": render_lib(manifest),
        f"{GENERATED_DIR}/lib.pyi": render_pyi(manifest),
        f"{GENERATED_DIR}/enums.py": render_enums(manifest),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--include", type=Path, help="directory holding cudnn.h")
    ap.add_argument("--out", type=Path, default=ROOT, help="repository root to write into")
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    args = ap.parse_args(argv)
    try:
        include = args.include or find_include_dir()
        files = generate(include)
    except GenerationError as exc:
        print(f"gen_bindings: error: {exc}", file=sys.stderr)
        return 2
    stale = []
    for rel, text in files.items():
        path = args.out / rel
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(rel)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if args.check:
        if stale:
            print(f"gen_bindings: stale (regenerate with `{REGEN_COMMAND}`): " + ", ".join(stale))
            return 1
        folder = args.out / GENERATED_DIR
        ours = {*files, f"{GENERATED_DIR}/{OTHER_GENERATED}"}
        stray = sorted(
            p.relative_to(args.out).as_posix()
            for p in folder.iterdir()
            if p.name != "__pycache__" and p.relative_to(args.out).as_posix() not in ours
        )
        if stray:  # the folder holds generated code only
            print(f"gen_bindings: {GENERATED_DIR}/ holds files no generator writes: {stray}")
            return 1
        print(f"gen_bindings: up to date with the cuDNN headers in {include}")
        return 0
    m = json.loads(files["tools/cudnn_api.json"])
    c = m["counts"]
    print(
        f"gen_bindings: cuDNN {m['header_version']} from {include}: {c['functions']} functions, "
        f"{c['enums']} enums ({c['enum_members']} members), {c['structs']} structs, "
        f"{c['handles']} handles, {c['callbacks']} callbacks, {c['defines']} defines"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
