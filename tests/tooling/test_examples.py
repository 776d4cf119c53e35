"""``examples/``: the README's examples as scripts, run where they can run.

Every ```` ```python ```` block of the README is, verbatim, the body of one ``examples/*.py``
(after the script's one-line docstring), so the README and the scripts cannot drift apart. Each
script then runs in a child process against this tree's package: the ones marked ``# GPU`` only
where a GPU is usable, the ones importing torch only where torch is installed. CI also type-checks
them (``mypy --strict``, against the installed wheel).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
README_BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


def _body(path: Path) -> str:
    """The script without its leading docstring (and the blank line after it)."""
    text = path.read_text()
    tree = ast.parse(text)
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        lines = text.splitlines(keepends=True)[first.end_lineno :]
        return "".join(lines).lstrip("\n")
    return text


def test_there_are_examples():
    assert len(EXAMPLES) >= len(README_BLOCKS) > 0


@pytest.mark.parametrize("index", range(len(README_BLOCKS)), ids=lambda i: f"readme-block{i}")
def test_readme_block_is_an_example_script(index):
    block = README_BLOCKS[index]
    matches = [p.name for p in EXAMPLES if _body(p) == block]
    assert matches, (
        f"README block {index} is in no examples/*.py (copy it there verbatim, after a one-line "
        f"docstring):\n{block}"
    )


HOME_BLOCKS = re.findall(
    r"```python\n(.*?)```", (ROOT / "docs" / "index.md").read_text(), flags=re.S
)


@pytest.mark.parametrize("index", range(len(HOME_BLOCKS)), ids=lambda i: f"home-block{i}")
def test_docs_home_page_block_is_an_example_script(index):
    # the quick starts are type-checked (mypy --strict, with torch) and run as examples too
    block = HOME_BLOCKS[index]
    assert [p.name for p in EXAMPLES if _body(p) == block], (
        f"docs/index.md block {index} is in no examples/*.py:\n{block}"
    )


def test_every_example_has_a_docstring():
    for path in EXAMPLES:
        assert ast.get_docstring(ast.parse(path.read_text())), f"{path.name} has no docstring"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs(path):
    source = path.read_text()
    if "# GPU" in source:
        from conftest import gpu_unavailable_reason

        reason = gpu_unavailable_reason()
        if reason:
            pytest.skip(f"needs a GPU: {reason}")
    if re.search(r"^\s*import torch\b", source, flags=re.M) and not importlib.util.find_spec(
        "torch"
    ):
        pytest.skip("needs torch")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600
    )
    assert r.returncode == 0, f"{path.name} failed:\n{r.stdout}\n{r.stderr}"
    if "print(" in source:  # a script that shows something must show it (versions.py once did not)
        assert r.stdout.strip(), f"{path.name} printed nothing"


def test_the_versions_example_prints_what_it_found():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = str(ROOT / "examples" / "versions.py")
    r = subprocess.run(
        [sys.executable, script], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300
    )
    assert r.returncode == 0, r.stderr
    version, where, available = r.stdout.strip().splitlines()
    assert version.isdigit() and int(version) >= 90000
    assert "libcudnn" in where and where.split()[1]  # the path and how it was found
    assert available in ("True", "False")
