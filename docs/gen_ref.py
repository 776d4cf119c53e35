"""Write the API reference pages at build time (run by mkdocs-gen-files; nothing here is committed).

* Python layers: one page per public namespace (``docs/surface.py`` derives them from the
  package's ``__all__``s), each object rendered by mkdocstrings from its docstring on its owner
  page, with a table of every name the namespace exports.
* Raw layer: every function of ``cudnn.h`` (one page per header, with the C prototype, each
  parameter's C and Python type, the header line and cuDNN's own brief), every enum with its
  members, and the structs, handle types, callback type and ``#define`` constants, from
  ``tools/cudnn_api.json`` (the manifest the bindings are generated from). The build fails if the
  manifest and the importable package disagree.

So a name added to an ``__all__`` or a function added by regenerating the bindings appears in the
reference without touching the docs.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs"))
sys.path.insert(0, str(ROOT))  # the checkout's pycudnn (also what mkdocstrings reads)

import surface  # noqa: E402

import pycudnn  # noqa: E402
from pycudnn import enums  # noqa: E402
from pycudnn import lib as _lib  # noqa: E402  (pycudnn._generated.lib)

MANIFEST = json.loads((ROOT / "tools" / "cudnn_api.json").read_text())
REF = Path("reference")
nav: list[tuple[int, str, str]] = []  # (depth, title, path relative to reference/)


def write(path: str, text: str) -> None:
    with mkdocs_gen_files.open(REF / path, "w") as f:
        f.write(text)


ROLE = re.compile(r":(?:py:)?[a-z]+:`~?(?:[\w.]*\.)?(?P<short>[^`.]+)`")


def summary(obj: object) -> str:
    """The first paragraph of *obj*'s docstring, on one line, Sphinx roles as code."""
    doc = inspect.getdoc(obj) if surface.is_api_object(obj) or inspect.ismodule(obj) else None
    line = (doc or "").strip().split("\n\n", 1)[0].replace("\n", " ")
    return ROLE.sub(lambda m: f"`{m['short']}`", line).replace("|", "\\|")


def kind(obj: object) -> str:
    if inspect.isclass(obj):
        if issubclass(obj, BaseException):
            return "exception" if not issubclass(obj, Warning) else "warning"
        return "class"
    if inspect.isroutine(obj):
        return "function"
    if inspect.ismodule(obj):
        return "module"
    return "instance" if surface._is_instance_export(obj) else "constant"


def page_of(name: str) -> str:
    return f"{name}.md"


# -- Python layers ---------------------------------------------------------------------------------
python, raw = surface.modules()
objects = surface.objects(python)
by_id = {id(o.obj): o for o in objects}
module_pages = {m.name: m for m in python}
spellings: dict[int, list[str]] = defaultdict(list)  # id(obj) -> "pycudnn.errors.CudnnError", ...
for m in python:
    for name in m.names:
        value = getattr(m.module, name)
        if id(value) in by_id:
            spellings[id(value)].append(f"{m.name}.{name}")
raw_pages = {
    "pycudnn.lib": "lib/index.md",
    "pycudnn.api": "lib/index.md",
    "pycudnn.enums": "enums/index.md",
}
for name, _mod in raw:
    if name not in raw_pages:
        raise SystemExit(f"gen_ref: public module {name} has no __all__ and no raw-layer page")


def link(name: str, value: object) -> str:
    """Markdown for one exported name: a link to wherever it is documented."""
    if inspect.ismodule(value):
        target = next(
            (m for m in python if m.module is value),
            None,
        )
        if target is not None:
            return f"[`{name}`]({page_of(target.name)})"
        mod_name = next(n for n, m in raw if m is value)
        return f"[`{name}`]({raw_pages[mod_name]})"
    if id(value) in by_id:
        return f"[`{name}`][{by_id[id(value)].canonical}]"
    if surface._is_instance_export(value):
        for m in python:
            if m.module.__name__ == type(value).__module__ and m.name != "pycudnn":
                return f"[`{name}`]({page_of(m.name)})"
    return f"`{name}`"


def constant_value(value: object) -> str:
    if surface._is_instance_export(value):
        cls = type(value)
        ref = by_id.get(id(cls))
        return f"instance of [`{cls.__name__}`][{ref.canonical}]" if ref else cls.__name__
    text = repr(value)
    if len(text) > 90:
        text = text[:87] + "..."
    return f"`{text}`"


OPTIONS = """    options:
      show_root_heading: true
      show_root_full_path: false
      heading_level: 2
"""


# classes whose page lists the members they inherit: the builder's Graph takes its operation
# methods from one ...Operations class per family (pycudnn/graph/nodes/)
INHERITED = {"pycudnn.graph._builder.Graph"}


def python_page(m: surface.PublicModule) -> str:
    display = m.name
    lines = [f"# `{display}`", ""]
    if m.module.__doc__:
        lines += [
            f"::: {m.module.__name__}",
            "    options:",
            "      show_root_heading: false",
            "      show_root_toc_entry: false",
            "      members: false",
            "",
        ]
    if display != m.module.__name__:
        lines += [
            f"`{display}` is the public name; the code lives in `{m.module.__name__}`.",
            "",
        ]
    lines += ["## Contents", "", "| name | kind | summary |", "|---|---|---|"]
    for name in m.names:
        value = getattr(m.module, name)
        where = ""
        if id(value) in by_id and by_id[id(value)].owner != m.name:
            where = f" (from `{by_id[id(value)].owner}`)"
        lines.append(f"| {link(name, value)} | {kind(value)}{where} | {summary(value)} |")
    lines.append("")
    consts = [n for n in surface.constants(m) if not n.startswith("__") or n == "__version__"]
    if consts:
        lines += ["## Constants", "", "| name | value |", "|---|---|"]
        for name in consts:
            value = getattr(m.module, name)
            lines.append(f"| `{display}.{name}` | {constant_value(value)} |")
        lines.append("")
    for name in m.owned:
        obj = by_id[id(getattr(m.module, name))]
        # every public spelling links here: [x][pycudnn.TensorDescriptor] whatever file defines it
        lines += [f"[](){{#{alias}}}" for alias in spellings[id(obj.obj)] if alias != obj.canonical]
        options = OPTIONS
        if obj.canonical in INHERITED:  # its methods live in base classes of their own
            options += "      inherited_members: true\n"
        lines += [f"::: {obj.canonical}", options]
    return "\n".join(lines)


for m in python:
    write(page_of(m.name), python_page(m))


# -- the PyTorch adapter: from its stub and sources, without importing torch ---------------------
from pycudnn import _exports  # noqa: E402

TORCH_PKG = ROOT / "pycudnn" / "torch"
TORCH_NAMES = _exports.declared(str(TORCH_PKG / "__init__.pyi"))


def _source_docs(module: str) -> dict[str, tuple[str, str]]:
    """name -> (kind, first docstring paragraph) of a module's top-level classes and functions,
    read from its source (the adapter's modules import torch)."""
    path = TORCH_PKG / (module.removeprefix(".").replace(".", "/") + ".py")
    if not module.removeprefix("."):
        path = TORCH_PKG / "__init__.py"
    tree = ast.parse(path.read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            doc = (ast.get_docstring(node) or "").strip().split("\n\n", 1)[0].replace("\n", " ")
            doc = ROLE.sub(lambda m: f"`{m['short']}`", doc).replace("|", "\\|")
            out[node.name] = ("class" if isinstance(node, ast.ClassDef) else "function", doc)
    return out


def _example_body(name: str) -> str:
    """An ``examples/*.py`` script without its docstring (the docs home page's quick starts)."""
    text = (ROOT / "examples" / name).read_text()
    tree = ast.parse(text)
    first = tree.body[0]
    return "".join(text.splitlines(keepends=True)[first.end_lineno :]).lstrip("\n")


def torch_page() -> str:
    lines = [
        "# `pycudnn.torch`",
        "",
        "The optional PyTorch adapter: `torch.nn`-compatible modules that run on pycudnn,",
        "`convert(model)` to swap them into a model in place (and `fuse=True` to fuse chains of",
        "them into single cuDNN graphs), and cuDNN's fused attention for torch's",
        "`scaled_dot_product_attention`. Guide: [PyTorch adapter](../embedding.md).",
        "",
        "## Example",
        "",
        "```python",
        _example_body("torch_quickstart.py").rstrip("\n"),
        "```",
        "",
        "## Contents",
        "",
        "| name | kind | summary |",
        "|---|---|---|",
    ]
    entries = []
    for name, where in TORCH_NAMES.items():
        module, attr = where if where is not None else ("", name)
        kind_, doc = _source_docs(module).get(attr or name, ("", ""))
        canonical = f"pycudnn.torch{module if module != '.' else ''}.{attr or name}"
        entries.append((name, canonical))
        lines.append(f"| [`{name}`][{canonical}] | {kind_} | {doc} |")
    lines += [
        "",
        "## How it works",
        "",
        "::: pycudnn.torch",
        "    options:",
        "      show_root_heading: false",
        "      show_root_toc_entry: false",
        "      members: false",
        "",
    ]
    for name, canonical in entries:
        public = f"pycudnn.torch.{name}"
        if public != canonical:
            lines.append(f"[](){{#{public}}}")
        lines += [f"::: {canonical}", OPTIONS]
    return "\n".join(lines)


write("pycudnn.torch.md", torch_page())


# -- raw layer: types ------------------------------------------------------------------------------
ENUM_BY_C = {e.c_type(): e for e in surface.raw_enums()}
TYPE_ANCHOR = {h["name"]: f"pycudnn.lib.{h['name']}" for h in MANIFEST["handles"]}
TYPE_ANCHOR.update({s["name"]: f"pycudnn.lib.{s['name']}" for s in MANIFEST["structs"]})
TYPE_ANCHOR.update({c["name"]: f"pycudnn.lib.{c['name']}" for c in MANIFEST["callbacks"]})
TYPE_ANCHOR.update({o["name"]: f"pycudnn.lib.{o['name']}" for o in MANIFEST["opaque_structs"]})
TYPE_ANCHOR.update({c: f"pycudnn.enums.{e.__name__}" for c, e in ENUM_BY_C.items()})


def c_type(t: dict) -> str:
    k = t["kind"]
    if k in ("named", "builtin"):
        return ("const " if t.get("const") else "") + t["name"]
    if k == "pointer":
        return c_type(t["to"]) + " *" + (" const" if t.get("const") else "")
    if k == "array":
        return c_type(t["of"]) + f"[{t.get('len') or ''}]"
    raise SystemExit(f"gen_ref: unknown type kind {k!r} in the manifest")


def base_name(t: dict) -> str:
    while t["kind"] in ("pointer", "array"):
        t = t.get("to") or t["of"]
    return t["name"]


def c_type_md(t: dict) -> str:
    """The C type as code, linked to its page when it is one of cuDNN's types."""
    text = f"`{c_type(t)}`"
    anchor = TYPE_ANCHOR.get(base_name(t))
    return f"[{text}][{anchor}]" if anchor else text


def c_decl(t: dict, name: str) -> str:
    if t["kind"] == "array":
        return f"{c_type(t['of'])} {name}[{t.get('len') or ''}]"
    sep = "" if c_type(t).endswith("*") else " "
    return f"{c_type(t)}{sep}{name}"


def stub_signatures() -> dict[str, ast.FunctionDef]:
    tree = ast.parse((Path(_lib.__file__).with_suffix(".pyi")).read_text())
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


STUBS = stub_signatures()
FUNCTIONS = {f["name"]: f for f in MANIFEST["functions"]}
if list(FUNCTIONS) != surface.raw_functions():
    diff = set(FUNCTIONS) ^ set(surface.raw_functions())
    raise SystemExit(f"gen_ref: tools/cudnn_api.json and pycudnn.lib disagree: {sorted(diff)}")
if set(FUNCTIONS) - set(STUBS):
    raise SystemExit(f"gen_ref: lib.pyi lacks {sorted(set(FUNCTIONS) - set(STUBS))}")
MANIFEST_ENUMS = {e["name"]: e for e in MANIFEST["enums"]}
if set(MANIFEST_ENUMS) != set(ENUM_BY_C):
    raise SystemExit(
        f"gen_ref: manifest and pycudnn.enums disagree: {set(MANIFEST_ENUMS) ^ set(ENUM_BY_C)}"
    )


def where_of(item: dict) -> str:
    return f"`{item['where']}`"


def deprecated_note(item: dict) -> str:
    if item.get("deprecated"):
        return "**Deprecated** (`CUDNN_DEPRECATED`): `pycudnn.api` warns once when it is called."
    if item.get("doc_deprecated"):
        return "**Deprecated** in cuDNN's documentation."
    return ""


def ctypes_name(t: type, c: dict) -> str:
    """How ``pycudnn.lib`` spells a parameter's ctypes type (*c*: its manifest type)."""
    import ctypes

    if issubclass(t, ctypes._Pointer):
        inner = c.get("to") or c.get("of") or c
        return f"POINTER({ctypes_name(t._type_, inner)})"
    if issubclass(t, ctypes._CFuncPtr):
        return base_name(c)
    return t.__name__ if t.__module__ == _lib.__name__ else f"ctypes.{t.__name__}"


def function_entry(f: dict) -> list[str]:
    name = f["name"]
    stub = STUBS[name]
    py_types = {a.arg: ast.unparse(a.annotation) for a in stub.args.args if a.annotation}
    argtypes = _lib.PROTOTYPES[name][1]
    if len(argtypes) != len(f["params"]):
        raise SystemExit(f"gen_ref: {name} has {len(argtypes)} argtypes, manifest {f['params']}")
    params = ", ".join(c_decl(p["type"], p["name"]) for p in f["params"]) or "void"
    lines = [
        f"[](){{#pycudnn.lib.{name}}}",
        f"[](){{#pycudnn.api.{name}}}",
        f"### `{name}`",
        "",
        f["summary"] or "",
        "",
        "```c",
        f"{c_type(f['result'])} {name}({params})",
        "```",
        "",
    ]
    if f["params"]:
        lines += ["| parameter | C type | ctypes | accepts |", "|---|---|---|---|"]
        for p, t in zip(f["params"], argtypes, strict=True):
            py = py_types.get(p["name"], "")
            lines.append(
                f"| `{p['name']}` | {c_type_md(p['type'])} | `{ctypes_name(t, p['type'])}` | "
                f"`{py}` |"
            )
        lines.append("")
    result = c_type(f["result"])
    if result == "cudnnStatus_t":
        ret = (
            "Returns the status: `pycudnn.lib` returns it as an `int`; `pycudnn.api` returns None "
            "and raises the [exception of its category][pycudnn.errors.CudnnError] on failure."
        )
    else:
        ret = f"Returns `{result}` (the same through `pycudnn.lib` and `pycudnn.api`)."
    facts = [where_of(f)]
    if f.get("since"):
        facts.append(f"since cuDNN {f['since']}")
    lines += [ret, "", ", ".join(facts) + ".", ""]
    note = deprecated_note(f)
    if note:
        lines += [note, ""]
    return lines


by_header: dict[str, list[dict]] = defaultdict(list)
for f in MANIFEST["functions"]:
    by_header[f["header"]].append(f)

HEADER_TITLES = {
    "cudnn_graph.h": "graph API, handles, versions, errors, callbacks",
    "cudnn_ops.h": "tensors, pooling, activation, normalization, softmax, dropout, ...",
    "cudnn_cnn.h": "convolutions and fused ops",
    "cudnn_adv.h": "RNNs, multi-head attention, CTC loss",
    "cudnn_subquadratic_ops.h": "subquadratic (state-space) operations",
    "cudnn_gnn_ops.h": "graph neural network operations",
}

for header, fns in by_header.items():
    stem = header.removesuffix(".h")
    deprecated = sum(1 for f in fns if f["deprecated"])
    lines = [
        f"# `{header}`",
        "",
        f"{len(fns)} functions of `{header}` ({HEADER_TITLES.get(header, '')}), in header order"
        f"{f'; {deprecated} deprecated' if deprecated else ''}. Each is "
        f"`pycudnn.lib.<name>` (raw status) and `pycudnn.api.<name>` (checked); see "
        "[the raw layer](index.md) for how to call them.",
        "",
        "| function | summary |",
        "|---|---|",
    ]
    for f in fns:
        mark = " *(deprecated)*" if f["deprecated"] else ""
        lines.append(f"| [`{f['name']}`][pycudnn.lib.{f['name']}]{mark} | {f['summary']} |")
    lines.append("")
    for f in fns:
        lines += function_entry(f)
    write(f"lib/{stem}.md", "\n".join(lines))


# -- raw layer: index, types and constants ---------------------------------------------------------
def struct_entry(s: dict) -> list[str]:
    lines = [
        f"[](){{#pycudnn.lib.{s['name']}}}",
        f"### `{s['name']}`",
        "",
        s.get("summary") or "",
        "",
        f"`ctypes.Structure`, {s['size']} bytes, aligned to {s['align']}; {where_of(s)}. "
        "Field offsets are checked against the header by the tests.",
        "",
        "| field | C type | offset | size |",
        "|---|---|---|---|",
    ]
    for fld in s["fields"]:
        lines.append(
            f"| `{fld['name']}` | {c_type_md(fld['type'])} | {fld['offset']} | {fld['size']} |"
        )
    return [*lines, ""]


types_md = [
    "# Types and constants",
    "",
    "The C types of `cudnn.h` as `pycudnn.lib` defines them. Each opaque handle type is its own "
    "`ctypes.c_void_p` subclass, so ctypes refuses a filter descriptor where a tensor descriptor "
    "is expected; enum types are `ctypes.c_int` ([their members](../enums/index.md)).",
    "",
    "## Handle and descriptor types",
    "",
    "| type | summary | declared |",
    "|---|---|---|",
]
for h in MANIFEST["handles"]:
    dep = " *(deprecated)*" if h.get("deprecated") else ""
    types_md.append(
        f"| [](){{#pycudnn.lib.{h['name']}}}`{h['name']}`{dep} | {h.get('summary') or ''} | "
        f"{where_of(h)} |"
    )
for o in MANIFEST["opaque_structs"]:
    dep = " *(deprecated)*" if o.get("deprecated") else ""
    types_md.append(
        f"| [](){{#pycudnn.lib.{o['name']}}}`{o['name']}`{dep} | opaque structure | {where_of(o)} |"
    )
types_md += ["", "## Structures", ""]
for s in MANIFEST["structs"]:
    types_md += struct_entry(s)
types_md += ["## Callback types", ""]
for c in MANIFEST["callbacks"]:
    params = ", ".join(c_decl(p["type"], p["name"]) for p in c["params"])
    types_md += [
        f"[](){{#pycudnn.lib.{c['name']}}}",
        f"### `{c['name']}`",
        "",
        c.get("summary") or "",
        "",
        "```c",
        f"typedef {c_type(c['result'])} (*{c['name']})({params});",
        "```",
        "",
        f"A `ctypes.CFUNCTYPE`; {where_of(c)}. Keep the Python callback object alive for as long "
        "as cuDNN may call it ([`enable_logging`][pycudnn.enable_logging] does this for "
        "the log callback).",
        "",
    ]
types_md += [
    "## Constants (`#define`)",
    "",
    "Module-level constants of `pycudnn.lib` under their C names. Every enum member is also "
    "there under its C name (`pycudnn.lib.CUDNN_DATA_FLOAT`).",
    "",
    "| name | value | defined as | declared |",
    "|---|---|---|---|",
]
for d in MANIFEST["defines"]:
    if "value" not in d:
        continue
    if not hasattr(_lib, d["name"]):
        raise SystemExit(f"gen_ref: pycudnn.lib lacks the constant {d['name']}")
    types_md.append(f"| `{d['name']}` | `{d['value']}` | `{d['expr']}` | {where_of(d)} |")
write("lib/types.md", "\n".join(types_md) + "\n")

macros = [n for n, v in vars(_lib).items() if n.startswith("CUDNN_") and inspect.isfunction(v)]
lib_index = [
    "# Raw layer: `pycudnn.lib` and `pycudnn.api`",
    "",
    f"Generated from the cuDNN **{_lib.HEADER_VERSION_STRING}** headers by "
    f"`tools/gen_bindings.py`: {len(FUNCTIONS)} functions, {len(ENUM_BY_C)} enums with "
    f"{sum(len(e) for e in ENUM_BY_C.values())} distinct members, {len(MANIFEST['structs'])} "
    f"structures, {len(MANIFEST['handles'])} handle types. "
    "[Regenerating the bindings](../../regenerating.md) explains how a new cuDNN release is "
    "taken in.",
    "",
    "* `pycudnn.lib.<C name>` is the ctypes function with the header's exact prototype; it "
    "returns what C returns (a `cudnnStatus_t` as an `int` for most) and never raises on a bad "
    "status. Symbols bind on first call: a function that the loaded cuDNN lacks (an older 9.x) "
    "raises [`SymbolNotFoundError`][pycudnn.errors.SymbolNotFoundError] when called, and "
    "`pycudnn.lib.has(name)` probes without raising.",
    "* `pycudnn.api.<C name>` is the same function checked: a failing status raises the "
    "exception of its category ([`BadParamError`][pycudnn.errors.BadParamError] is also a "
    "`ValueError`, ...) with cuDNN's last error text, and a `CUDNN_DEPRECATED` function warns "
    "once with [`CudnnDeprecationWarning`][pycudnn.errors.CudnnDeprecationWarning].",
    "* Enum parameters are plain ints: pass a member of [`pycudnn.enums`](../enums/index.md) "
    "(an `IntEnum`) or `pycudnn.lib.CUDNN_*`.",
    "* Type stubs (`pycudnn/_generated/lib.pyi`) carry every signature, for IDEs and type "
    "checkers.",
    "",
    "## Functions by header",
    "",
    "| header | functions | deprecated |",
    "|---|---|---|",
]
for header, fns in by_header.items():
    lib_index.append(
        f"| [`{header}`]({header.removesuffix('.h')}.md) — {HEADER_TITLES.get(header, '')} | "
        f"{len(fns)} | {sum(1 for f in fns if f['deprecated'])} |"
    )
lib_index += [
    "",
    "[Types and constants](types.md): handle types, structures, the callback type and the "
    "`#define` constants.",
    "",
    "## Module attributes",
    "",
    "| name | what |",
    "|---|---|",
    f"| `HEADER_VERSION` | `{_lib.HEADER_VERSION}`: the headers' `CUDNN_VERSION` |",
    f"| `HEADER_VERSION_STRING` | `{_lib.HEADER_VERSION_STRING!r}` |",
    "| `PROTOTYPES` | C name → (restype, argtypes, header:line, deprecated) for every function |",
    f"| `DEPRECATED_FUNCTIONS` | the {len(_lib.DEPRECATED_FUNCTIONS)} functions marked "
    "`CUDNN_DEPRECATED` |",
    "| `has(name)` | True when *name* is a `cudnn.h` function and the loaded library exports it |",
]
for name in macros:
    lib_index.append(f"| `{name}(...)` | the `cudnn_graph.h` macro of that name, in Python |")
lib_index += [
    "",
    "## Example",
    "",
    "```python",
    "import ctypes",
    "from pycudnn import lib, api, enums",
    "",
    "desc = lib.cudnnTensorDescriptor_t()",
    "api.cudnnCreateTensorDescriptor(ctypes.byref(desc))",
    "api.cudnnSetTensor4dDescriptor(",
    "    desc, enums.TensorFormat.NCHW, enums.DataType.FLOAT, 2, 3, 4, 5",
    ")",
    "api.cudnnDestroyTensorDescriptor(desc)",
    "```",
    "",
]
write("lib/index.md", "\n".join(lib_index))


# -- raw layer: enums ------------------------------------------------------------------------------
def enum_entry(cls: type[enums.CudnnEnum]) -> list[str]:
    info = MANIFEST_ENUMS[cls.c_type()]
    aliases = {}
    for mem in info["members"]:
        if "alias_of" in mem:
            aliases[mem["name"]] = mem["alias_of"]
    lines = [
        f"[](){{#pycudnn.enums.{cls.__name__}}}",
        f"### `{cls.__name__}`",
        "",
        f"`{cls.c_type()}`: {info.get('summary') or ''}",
        "",
        f"{where_of(info)}" + (f", since cuDNN {info['since']}" if info.get("since") else "") + ".",
        "",
    ]
    note = deprecated_note(info)
    if note:
        lines += [note.replace("`pycudnn.api` warns once when it is called", "kept"), ""]
    lines += ["| member | value | C name |", "|---|---|---|"]
    for member in cls:
        dep = " *(deprecated)*" if member.deprecated else ""
        lines.append(f"| `{member.name}`{dep} | {int(member)} | `{member.c_name}` |")
    for c_alias, target in aliases.items():
        lines.append(f"| *alias* | | `{c_alias}` = `{target}` *(deprecated)* |")
    return [*lines, ""]


enums_by_header: dict[str, list[type]] = defaultdict(list)
for cls in surface.raw_enums():
    enums_by_header[MANIFEST_ENUMS[cls.c_type()]["where"].split(":")[0]].append(cls)

for header, classes in enums_by_header.items():
    stem = header.removesuffix(".h")
    lines = [
        f"# Enums of `{header}`",
        "",
        f"{len(classes)} enums, each a [`CudnnEnum`][pycudnn.enums.CudnnEnum] (an `IntEnum`) in "
        "`pycudnn.enums`: class names drop `cudnn` and `_t`, member names the common prefix.",
        "",
        "| enum | C type | members |",
        "|---|---|---|",
    ]
    for cls in classes:
        lines.append(
            f"| [`{cls.__name__}`][pycudnn.enums.{cls.__name__}] | `{cls.c_type()}` | {len(cls)} |"
        )
    lines.append("")
    for cls in classes:
        lines += enum_entry(cls)
    write(f"enums/{stem}.md", "\n".join(lines))

GENERATED_ENUMS = enums.CudnnEnum.__module__  # pycudnn.enums is the face of this module
helpers = [
    n
    for n, v in vars(enums).items()
    if not n.startswith("_") and inspect.isfunction(v) and v.__module__ == GENERATED_ENUMS
]
enums_index = [
    "# `pycudnn.enums`",
    "",
    "::: pycudnn.enums",
    "    options:",
    "      show_root_heading: false",
    "      show_root_toc_entry: false",
    "      members: false",
    "",
    "| header | enums |",
    "|---|---|",
]
for header, classes in enums_by_header.items():
    enums_index.append(f"| [`{header}`]({header.removesuffix('.h')}.md) | {len(classes)} |")
enums_index += [
    "",
    "| set | what |",
    "|---|---|",
    f"| `DEPRECATED_MEMBERS` | C names of the {len(enums.DEPRECATED_MEMBERS)} deprecated members |",
    f"| `DEPRECATED_TYPES` | C names of the {len(enums.DEPRECATED_TYPES)} deprecated enum types |",
    "",
    "::: pycudnn.enums.CudnnEnum",
    OPTIONS,
]
for n in helpers:
    enums_index += [f"::: pycudnn.enums.{n}", OPTIONS]
write("enums/index.md", "\n".join(enums_index))


# -- overview and navigation -----------------------------------------------------------------------
# The public API first (pycudnn.torch at the top), each package's family pages under it; the
# internals after it: the graph builder's operation nodes, which Graph's methods delegate to.
INTERNAL_PREFIXES = ("pycudnn.graph.nodes",)


def is_internal(name: str) -> bool:
    return name.startswith(INTERNAL_PREFIXES)


def parent_of(name: str) -> str | None:
    """The public package page a family page sits under (pycudnn.highlevel.conv ->
    pycudnn.highlevel), or None for a top-level namespace."""
    head = name.rsplit(".", 1)[0]
    return head if head in module_pages and head != "pycudnn" else None


# the packages in the order a reader meets them (a new one goes last), each followed by its pages
TOP_ORDER = (
    "pycudnn.highlevel",
    "pycudnn.graph",
    "pycudnn.descriptors",
    "pycudnn.memory",
    "pycudnn.handle",
    "pycudnn.config",
    "pycudnn.errors",
)


def reading_order(m: surface.PublicModule) -> tuple[int, int, str]:
    root = parent_of(m.name) or m.name
    rank = TOP_ORDER.index(root) if root in TOP_ORDER else len(TOP_ORDER)
    return (rank, m.name != root, m.name)


top = module_pages["pycudnn"]
public = sorted(
    (m for m in python if m.name != "pycudnn" and not is_internal(m.name)), key=reading_order
)
internal = [m for m in python if is_internal(m.name)]
index = [
    "# API reference",
    "",
    "Every public name of every layer, generated from the docstrings and from the manifest the raw "
    "bindings are generated from. Search (top of the page) finds any of them by name.",
    "",
    "## Public API",
    "",
    "What you import. A package's page lists its names; each family page below it documents them.",
    "",
    "| page | what | names |",
    "|---|---|---|",
    f"| [`pycudnn.torch`](pycudnn.torch.md) | the optional PyTorch adapter (`torch.nn` modules, "
    f"`convert`, attention), with an example first | {len(TORCH_NAMES)} |",
    f"| [`pycudnn`](pycudnn.md) | the top-level names (re-exports and versions, diagnostics, "
    f"logging) | {len(top.names)} |",
]
for m in public:
    # a family page under its package, by its last name (the package's row is just above)
    text = f"&nbsp;&nbsp;`.{m.name.rsplit('.', 1)[1]}`" if parent_of(m.name) else f"`{m.name}`"
    index.append(f"| [{text}]({page_of(m.name)}) | {summary(m.module)} | {len(m.names)} |")
index += [
    f"| [`pycudnn.lib`, `pycudnn.api`](lib/index.md) | the raw C API, by header | "
    f"{len(FUNCTIONS)} functions |",
    f"| [`pycudnn.enums`](enums/index.md) | every C enum as an `IntEnum` | "
    f"{len(ENUM_BY_C)} enums |",
    "",
    "## Internals",
    "",
    "The graph builder's operation families: `pycudnn.graph.Graph`'s methods are thin delegates "
    "to these (their checks, shape inference and descriptor encoding). Documented for "
    "contributors and for reading a method's rules; import `pycudnn.graph`, not these.",
    "",
    "| page | what | names |",
    "|---|---|---|",
]
for m in internal:
    index.append(f"| [`{m.name}`]({page_of(m.name)}) | {summary(m.module)} | {len(m.names)} |")
index.append("")
write("index.md", "\n".join(index))

summary_md = [
    "* [Overview](index.md)",
    "* Public API",
    "    * [pycudnn.torch](pycudnn.torch.md)",
    "    * [pycudnn](pycudnn.md)",
]
for m in public:
    pad = "        " if parent_of(m.name) else "    "
    summary_md.append(f"{pad}* [{m.name}]({page_of(m.name)})")
summary_md.append("    * [pycudnn.lib / api](lib/index.md)")
summary_md += [f"        * [{h}](lib/{h.removesuffix('.h')}.md)" for h in by_header]
summary_md.append("        * [Types and constants](lib/types.md)")
summary_md.append("    * [pycudnn.enums](enums/index.md)")
summary_md += [f"        * [{h}](enums/{h.removesuffix('.h')}.md)" for h in enums_by_header]
summary_md.append("* Internals")
for m in internal:
    pad = "        " if m.name != INTERNAL_PREFIXES[0] else "    "
    summary_md.append(f"{pad}* [{m.name}]({page_of(m.name)})")
write("SUMMARY.md", "\n".join(summary_md) + "\n")

# the changelog, as a page of the site
with mkdocs_gen_files.open("changelog.md", "w") as f:
    f.write((ROOT / "CHANGELOG.md").read_text())

importlib.invalidate_caches()
assert pycudnn.__all__  # imported above: the reference was built from this package
