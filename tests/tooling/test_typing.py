"""What a type checker sees of the public surface (tier A; needs mypy, from the [typecheck] extra).

CI type-checks ``examples/`` with ``mypy --strict`` against the installed wheel. That passes, but
only says the examples are consistent with what mypy can see — and for the names that
``pycudnn/__init__.py`` resolves lazily through a module ``__getattr__`` it sees ``Any``. This test
asks mypy for the type of every public top-level function and class (``reveal_type``) and of a
checked ``pycudnn.api`` function, so that the gap is measured, not hidden.
"""

from __future__ import annotations

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
            "--cache-dir", str(tmp_path / "cache"), "--follow-imports=silent",
            "--ignore-missing-imports", "--no-error-summary", "--python-version", "3.11",
            "--config-file", "", str(src),
        ]
    )  # fmt: skip
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


def test_type_checking_imports_match_the_lazy_tables():
    """``pycudnn/__init__.py``'s ``if TYPE_CHECKING:`` block declares exactly ``__all__`` (less
    ``__version__``), each from the module its lazy table resolves it from."""
    import ast

    tree = ast.parse((ROOT / "pycudnn" / "__init__.py").read_text())
    block = next(
        n for n in tree.body
        if isinstance(n, ast.If) and getattr(n.test, "id", None) == "TYPE_CHECKING"
    )  # fmt: skip
    declared = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom)
        for alias in node.names:
            assert alias.asname == alias.name, f"{alias.name}: use 'X as X' (a re-export)"
            declared[alias.name] = "." + (node.module or alias.name)
    expected = {**pycudnn._EXPORTS, **{k: "." + k for k in pycudnn._SUBMODULES}}
    assert declared == expected
