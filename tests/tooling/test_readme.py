"""The README's Python examples run as written (GPU ones only where a GPU is usable)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_example_runs(block, request):
    if "# GPU" in block:
        from conftest import gpu_unavailable_reason

        reason = gpu_unavailable_reason()
        if reason:
            pytest.skip(f"needs a GPU: {reason}")
        if "torch" in block:
            pytest.importorskip("torch")
    exec(compile(block, "README.md", "exec"), {"__name__": "readme"})
