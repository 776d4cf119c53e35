"""The import rules of DESIGN.md, checked on the source (AST) and for cycles."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "pycudnn"

# module -> pycudnn modules it may import (None: anything not listed in FORBIDDEN)
ALLOWED: dict[str, set[str] | None] = {
    "_version": set(),
    "_loader": set(),
    "_exports": set(),  # reads a package's __init__.pyi: stdlib only
    "typing": set(),  # the protocols users annotate with: stdlib only
    # generated code (tools/ writes it, tests/tooling/test_generator.py seals it): loader only
    "_generated": {"_loader"},
    # the public faces of the generated modules, and the raw layer's old private name
    "lib": {"_generated"},
    "enums": {"_generated"},
    "_lib": {"_generated"},
    "errors": {"_generated", "_loader", "enums"},
    "api": {"_generated", "errors"},
    "_types": {"enums"},
    "_logging": {"_generated", "api", "errors"},
    "_config": {"_types", "enums", "errors"},
    "_layout": set(),
    "_cuda": {"errors"},
    "_resource": {"_generated", "errors"},
    "memory": {"_cuda", "_layout", "_types", "enums", "errors"},
    "handle": {"_cuda", "_generated", "_config", "_resource", "api", "errors", "memory"},
}
FORBIDDEN: dict[str, set[str]] = {
    "_resource": {"descriptors", "handle", "memory", "highlevel"},
    "descriptors": {"handle", "memory", "highlevel", "lib", "_lib"},
    "handle": {"descriptors", "highlevel"},
    "memory": {"handle", "descriptors", "highlevel"},
    # the graph engine and builder (floor 6) sit under the high level
    "graph": {"highlevel", "_generated", "_lib", "lib"},
    "highlevel": {"_generated", "_lib", "lib"},
}


def _from_target(node: ast.ImportFrom, path: Path) -> list[str] | None:
    """The module parts a ``from X import ...`` in *path* reads from, if inside pycudnn."""
    pkg_parts = path.relative_to(PKG.parent).with_suffix("").parts[:-1]
    if node.level:
        base = list(pkg_parts[: len(pkg_parts) - node.level + 1])
        return [*base, *(node.module.split(".") if node.module else [])]
    if node.module and node.module.split(".")[0] == "pycudnn":
        return node.module.split(".")
    return None


def pycudnn_imports(path: Path) -> set[str]:
    """Top-level pycudnn modules imported by *path* (relative or absolute imports)."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = _from_target(node, path)
            if target is None:
                continue
            if node.level and not node.module:
                names = [[*target, a.name] for a in node.names]
            else:
                names = [target]
            for parts in names:
                if len(parts) > 1 and parts[0] == "pycudnn":
                    found.add(parts[1])
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "pycudnn" and len(parts) > 1:
                    found.add(parts[1])
    return found


def modules():
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG).with_suffix("").parts
        yield (rel[0] if rel[0] != "highlevel" else "highlevel"), p


@pytest.mark.parametrize(("name", "path"), list(modules()), ids=lambda x: str(x))
def test_imports_follow_layers(name, path):
    imported = pycudnn_imports(path) - {name}
    if name in ALLOWED:
        assert imported <= ALLOWED[name], f"{path.name} imports {imported - ALLOWED[name]}"
    bad = imported & FORBIDDEN.get(name, set())
    assert not bad, f"{path.relative_to(PKG)} must not import {bad}"


@pytest.mark.parametrize(("name", "path"), list(modules()), ids=lambda x: str(x))
def test_no_underscore_names_from_other_modules(name, path):
    """``from .x import _name`` only for private *modules*: private names stay in their module."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        target = _from_target(node, path)
        if target is None:
            continue
        for alias in node.names:
            if not alias.name.startswith("_") or alias.name.startswith("__"):
                continue
            mod = PKG.parent.joinpath(*target, alias.name)
            if not (mod.with_suffix(".py").exists() or (mod / "__init__.py").exists()):
                bad.append(f"{'.'.join(target)}.{alias.name} (line {node.lineno})")
    assert not bad, f"{path.relative_to(PKG)} imports private names: {bad}"


# the high level's shared modules, lowest first: each may import only those before it (and no op
# module)
HIGHLEVEL_SHARED: dict[str, set[str]] = {
    "_operand": set(),
    "_checks": {"_operand"},
    "_call": {"_operand", "_checks"},
    "_staging": {"_operand", "_checks", "_call"},
}


def highlevel_imports(path: Path) -> set[str]:
    """The ``pycudnn.highlevel`` modules that *path* (a module of it) imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            target = _from_target(node, path)
            if not target or target[:2] != ["pycudnn", "highlevel"]:
                continue
            if len(target) > 2:
                found.add(target[2])
            else:
                found.update(a.name for a in node.names)
    return found


@pytest.mark.parametrize("path", sorted((PKG / "highlevel").glob("*.py")), ids=lambda p: p.name)
def test_highlevel_shared_modules_follow_their_order(path):
    name = path.stem
    imported = highlevel_imports(path) - {name}
    if name in HIGHLEVEL_SHARED:
        assert imported <= HIGHLEVEL_SHARED[name], f"{path.name} imports {imported}"


# the convolution package, lowest first: each module may import only those before it, so a call
# goes one way (public function -> key -> prepare -> call entry)
CONV_ORDER = ("_problem", "_request", "_calls", "_epilogue", "_prepare", "_key", "__init__")
CONV = PKG / "highlevel" / "conv"


def conv_imports(path: Path) -> set[str]:
    """The modules of the conv package that *path* (one of them) imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found.update([node.module] if node.module else [a.name for a in node.names])
    return found


@pytest.mark.parametrize("name", CONV_ORDER)
def test_conv_package_modules_import_only_those_below(name, order=CONV_ORDER, package=CONV):
    below = set(order[: order.index(name)])
    imported = conv_imports(package / f"{name}.py")
    assert imported <= below, f"{package.name}/{name}.py imports {imported - below}"
    assert {p.stem for p in package.glob("*.py")} == set(order)


@pytest.mark.parametrize("package", ["conv", "attention"])
def test_conv_package_has_no_imports_in_functions_and_short_signatures(package):
    """Imports at module level only (an import inside a function hides a circle); private
    functions take at most 8 parameters (the public ones keep Theano's and cudnn-frontend's
    signatures). The attention package follows the convolution package's rules."""
    bad = []
    for path in sorted((PKG / "highlevel" / package).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            inner = [n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))]
            if inner:
                bad.append(f"{path.name}:{inner[0].lineno} imports inside {node.name}")
            a = node.args
            n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)
            n += (a.vararg is not None) + (a.kwarg is not None)
            if n > 8 and not (path.name == "__init__.py" and not node.name.startswith("_")):
                bad.append(f"{path.name}:{node.lineno} {node.name} takes {n} parameters")
    assert not bad, bad


# the attention package, lowest first (the same rules as the convolution package's): a call goes
# one way (public function -> key -> graph builders -> operand reader -> request)
ATTENTION_ORDER = (
    "_request",
    "_options",
    "_masks",
    "_cu_seqlens",
    "_operands",
    "_calls",
    "_graph",
    "_key",
    "__init__",
)
ATTENTION = PKG / "highlevel" / "attention"


@pytest.mark.parametrize("name", ATTENTION_ORDER)
def test_attention_package_modules_import_only_those_below(name):
    test_conv_package_modules_import_only_those_below(name, ATTENTION_ORDER, ATTENTION)


# the optional torch adapter's modules (all of pycudnn.torch but its lazy __init__): imported only
# where torch is installed
TORCH_ONLY = tuple(
    f"pycudnn.torch.{p.stem}" for p in sorted((PKG / "torch").glob("*.py")) if p.stem != "__init__"
)


def _imports_jax_at_top(path: Path) -> bool:
    for node in ast.parse(path.read_text()).body:
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        if any(n == "jax" or n.startswith("jax.") for n in names):
            return True
    return False


# the optional JAX adapter's modules that import JAX at their top (its operations; the handler
# and the run side import it lazily or not at all): imported only where JAX is installed
JAX_ONLY = tuple(
    f"pycudnn.jax.{p.stem}" for p in sorted((PKG / "jax").glob("*.py")) if _imports_jax_at_top(p)
)


def test_no_import_cycles_at_package_import():
    code = (
        "import pycudnn, importlib, importlib.util, pkgutil\n"
        "skip = {'pycudnn.__main__'}\n"
        "if importlib.util.find_spec('torch') is None:\n"
        f"    skip.update({TORCH_ONLY!r})\n"
        "if importlib.util.find_spec('jax') is None:\n"
        f"    skip.update({JAX_ONLY!r})\n"
        "for m in pkgutil.walk_packages(pycudnn.__path__, 'pycudnn.'):\n"
        "    if m.name not in skip:\n"
        "        importlib.import_module(m.name)\n"
        "print('ok')\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=PKG.parent
    )
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_only_the_torch_adapter_imports_torch():
    """torch is an optional peer: only the modules of ``pycudnn.torch`` import it (the tests and
    benchmarks may use it as an oracle), and its ``__init__`` only inside the function that checks
    it is installed."""
    bad = []
    for p in sorted(PKG.rglob("*.py")):
        if p.parent == PKG / "torch" and p.name != "__init__.py":
            continue
        tree = ast.parse(p.read_text())
        # pycudnn/torch/__init__.py: nothing at import (its check for torch runs on first use)
        nodes = tree.body if p == PKG / "torch" / "__init__.py" else ast.walk(tree)
        for node in nodes:
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            if any(n == "torch" or n.startswith("torch.") for n in names):
                bad.append(f"{p.relative_to(PKG)}:{node.lineno}")
    assert not bad, f"modules importing torch outside the adapter: {bad}"


def test_public_names_resolve():
    import pycudnn

    missing = []
    for name in pycudnn.__all__:
        try:
            getattr(pycudnn, name)
        except (AttributeError, ImportError) as exc:
            missing.append(f"{name}: {exc}")
    assert not missing, "public names in pycudnn.__all__ that do not resolve:\n" + "\n".join(
        missing
    )


def test_every_high_level_name_is_exported_from_pycudnn():
    import pycudnn
    import pycudnn.highlevel as hl

    assert set(hl.__all__) <= set(pycudnn.__all__)
    for name in hl.__all__:
        assert getattr(pycudnn, name) is getattr(hl, name)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """pycudnn module -> the pycudnn modules it imports, from the source: imports inside
    functions count (a deferred import is still a dependency), and so do the names a package's
    ``__init__.pyi`` declares (its ``__init__`` imports their modules, now or on first use)."""
    known = {_module_name(p) for p in PKG.rglob("*.py")}

    def resolve(target: list[str], names: list[str]) -> set[str]:
        base = ".".join(target)
        subs = {f"{base}.{n}" for n in names if f"{base}.{n}" in known}
        return subs if subs and len(subs) == len(names) else {base} | subs

    graph: dict[str, set[str]] = {}
    for p in sorted(PKG.rglob("*.py")):
        deps: set[str] = set()
        trees = [(ast.parse(p.read_text()), p)]
        stub = p.with_suffix(".pyi")
        if p.name == "__init__.py" and stub.exists():
            trees.append((ast.parse(stub.read_text()), p))
        for tree, where in trees:
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom):
                    target = _from_target(node, where)
                    if target is not None and target[0] == "pycudnn":
                        deps |= resolve(target, [a.name for a in node.names])
                elif isinstance(node, ast.Import):
                    deps |= {a.name for a in node.names if a.name.split(".")[0] == "pycudnn"}
        graph[_module_name(p)] = {d for d in deps if d in known} - {_module_name(p)}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


# circles other items of issue 24 remove (graph nodes by family; memory's array/interop split):
# listed so that no new one appears meanwhile; delete each line when its circle is gone
KNOWN_CYCLES: list[list[str]] = []


def test_no_import_cycles_in_the_source():
    cycles = [c for c in _cycles(_import_graph()) if c not in KNOWN_CYCLES]
    assert not cycles, f"import circles (function-level imports included): {cycles}"
