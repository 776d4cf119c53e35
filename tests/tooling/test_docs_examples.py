"""Examples in docs/ that say ``# GPU: runs as written`` run as written (on a GPU, with torch).

A page opts a Python block in by starting it with that comment; README.md's blocks are run by
``test_readme.py`` and docs/descriptors.md's (CPU only) by ``test_descriptors.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
MARK = "# GPU: runs as written"
BLOCKS = [
    (path.name, i, block)
    for path in sorted(DOCS.glob("*.md"))
    for i, block in enumerate(re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S))
    if block.startswith(MARK)
]


def test_some_pages_opt_in():
    assert BLOCKS, f"no docs block starts with {MARK!r}"


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("page", "index", "block"), BLOCKS, ids=[f"{p}[{i}]" for p, i, _b in BLOCKS]
)
def test_docs_example_runs(page, index, block):
    pytest.importorskip("torch")
    from pycudnn.memory import allocator

    resource = allocator.memory_resource()  # an example may install another (embedding.md)
    try:
        exec(compile(block, f"docs/{page}[{index}]", "exec"), {"__name__": "docs_example"})
    finally:
        allocator.set_memory_resource(resource)
