"""What a type checker sees of the public surface (tier A; needs mypy, from the [typecheck] extra).

CI type-checks ``examples/`` with ``mypy --strict`` against the installed wheel. That passes, but
only says the examples are consistent with what mypy can see. The names ``pycudnn/__init__.py``
resolves lazily are declared in ``pycudnn/__init__.pyi``, which mypy reads: this test asks mypy
for the type of every public top-level function and class (``reveal_type``) and of a checked
``pycudnn.api`` function, so that a gap (``Any``) shows; and it checks that the runtime tables
derived from each stub agree with it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import pycudnn

ROOT = Path(__file__).resolve().parents[2]


def _top_level_api_names() -> list[str]:
    import inspect

    return [
        n
        for n in pycudnn.__all__
        if inspect.isclass(getattr(pycudnn, n)) or inspect.isroutine(getattr(pycudnn, n))
    ]


def _revealed(tmp_path: Path, lines: list[str]) -> dict[int, str]:
    api = pytest.importorskip("mypy.api", reason="mypy comes with the [typecheck] extra")
    src = tmp_path / "reveal.py"
    src.write_text("\n".join(lines) + "\n")
    out, err, _status = api.run(
        [
            "--cache-dir",
            str(tmp_path / "cache"),
            "--follow-imports=silent",
            "--ignore-missing-imports",
            "--no-error-summary",
            "--python-version",
            "3.11",
            "--config-file",
            "",
            str(src),
        ]
    )
    found = {}
    for m in re.finditer(rf"{re.escape(str(src))}:(\d+): note: Revealed type is \"(.*)\"", out):
        found[int(m[1])] = m[2]
    assert found, f"mypy revealed nothing:\n{out}\n{err}"
    return found


@pytest.fixture
def mypypath(monkeypatch):
    monkeypatch.setenv("MYPYPATH", str(ROOT))  # this tree's package, as the tests import it


def test_submodule_names_are_typed(tmp_path, mypypath):
    # the defining modules are fully typed: importing from them gives real types
    lines = [
        "from pycudnn.descriptors import TensorDescriptor",
        "from pycudnn import lib",
        "reveal_type(TensorDescriptor)",
        "reveal_type(lib.cudnnCreate)",
    ]
    types = _revealed(tmp_path, lines)
    assert "TensorDescriptor" in types[3] and types[3] != "Any", types
    assert types[4].startswith("def ("), types


def test_top_level_names_are_typed(tmp_path, mypypath):
    names = _top_level_api_names()
    lines = ["import pycudnn", "from pycudnn import api"]
    lines += [f"reveal_type(pycudnn.{n})" for n in names]
    lines += ["reveal_type(api.cudnnCreate)"]
    types = _revealed(tmp_path, lines)
    untyped = [
        (lines[i - 1].removeprefix("reveal_type(").removesuffix(")"), t)
        for i, t in sorted(types.items())
        if t == "Any"
    ]
    assert len(types) == len(names) + 1, types
    assert not untyped, f"type checkers see Any for {len(untyped)} public names: {untyped}"


# the packages whose public names are declared in their __init__.pyi (pycudnn._exports)
STUBBED = ("pycudnn", "pycudnn.highlevel", "pycudnn.torch")


def _defines(path: Path, name: str) -> bool:
    """*path* (a module, or a package's __init__) binds *name* at its top level."""
    if path.is_dir():
        if (path / "__init__.pyi").exists():  # a package declaring its names in its stub
            from pycudnn._exports import declared

            return name in declared(str(path / "__init__.pyi"))
        path = path / "__init__.py"
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):  # top-level and conditional (RMSNorm's torch-version branch)
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name == name:
            return True
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
        if isinstance(node, ast.ImportFrom | ast.Import) and any(
            (a.asname or a.name.split(".")[0]) == name for a in node.names
        ):
            return True
    return False


@pytest.mark.parametrize("package", STUBBED)
def test_the_stub_is_the_one_declaration(package):
    """``__all__``, ``dir()`` and the lazy table are the stub's names, in its order, and each
    name's module exists and defines it (read from the source: pycudnn.torch's need torch)."""
    import importlib

    from pycudnn._exports import declared

    mod = importlib.import_module(package)
    stub = Path(mod.__file__).with_suffix(".pyi")
    table = declared(str(stub))
    assert list(mod.__all__) == list(table)
    assert len(set(mod.__all__)) == len(mod.__all__), "a name declared twice"
    assert set(mod.__all__) <= set(dir(mod))
    here = Path(mod.__file__).parent
    for name, where in table.items():
        if where is None:  # defined by the package's __init__.py
            assert _defines(Path(mod.__file__), name), f"{package}.__init__ lacks {name}"
            continue
        path = here.joinpath(*where[0].lstrip(".").split("."))
        target = path if path.is_dir() else path.with_suffix(".py")
        assert target.exists(), f"{package}.{name}: no module {where[0]}"
        if where[1] is not None:
            assert _defines(target, where[1]), f"{package}.{name}: {target} does not define it"
            # a submodule of that name would be bound over the object once imported
            clash = here / name
            assert not (clash.with_suffix(".py").exists() or clash.is_dir()), f"{clash} shadows"
    assert not hasattr(mod, "no_such_name")  # undeclared names raise AttributeError


def test_every_declared_name_resolves_to_its_module():
    """The names of pycudnn and pycudnn.highlevel resolve (pycudnn.torch's: in the adapter's
    tests, with torch), to the objects of the modules the stub names."""
    import importlib

    from pycudnn._exports import declared

    for package in STUBBED[:2]:
        mod = importlib.import_module(package)
        for name, where in declared(str(Path(mod.__file__).with_suffix(".pyi"))).items():
            value = getattr(mod, name)
            if where is not None:
                source = importlib.import_module(where[0], package)
                assert value is (source if where[1] is None else getattr(source, where[1])), name


def _mypy_strict(tmp_path: Path, target: Path) -> list[str]:
    """The errors ``mypy --strict`` reports in *target* (the package's own are not asked about)."""
    api = pytest.importorskip("mypy.api", reason="mypy comes with the [typecheck] extra")
    out, err, _status = api.run(
        [
            "--strict",
            "--warn-unused-ignores",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--follow-imports=silent",
            "--no-error-summary",
            "--python-version",
            "3.11",
            "--config-file",
            "",
            str(target),
        ]
    )
    assert not err, err
    return [line for line in out.splitlines() if line.startswith(str(target))]


def test_typed_usage_checks_under_mypy_strict(tmp_path, mypypath, monkeypatch):
    """tests/tooling/typed_usage.py asserts what the high-level overloads give (``out=`` keeps its
    type, ``training=``/``return_indices=``/running averages shape the tuple) and that misuse is
    an error (each ``type: ignore`` must be needed)."""
    monkeypatch.chdir(ROOT)
    errors = _mypy_strict(tmp_path, Path("tests/tooling/typed_usage.py"))
    assert not errors, "\n".join(errors)


def test_high_level_functions_have_no_any_in_their_signatures(tmp_path, mypypath):
    """Every public ``dnn_*`` function: parameters and results typed (no ``Any`` left)."""
    import pycudnn.highlevel as hl

    names = [n for n in hl.__all__ if n.startswith("dnn_")]
    types = _revealed(tmp_path, ["import pycudnn", *(f"reveal_type(pycudnn.{n})" for n in names)])
    loose = {names[i - 2]: t for i, t in types.items() if "Any" in t}
    assert len(types) == len(names), types
    assert not loose, f"Any in {len(loose)} signatures: {loose}"
