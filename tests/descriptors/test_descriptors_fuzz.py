"""Property-based fuzzing of every descriptor constructor and helper, in a child process.

The child (``tests/support/_desc_fuzz_child.py``) feeds hypothesis-generated arguments --
plausible ones and arbitrary garbage -- to all constructors, the output-shape helpers,
``derive_bn`` and the backend ``set``/``get``/``finalize``. It must never crash, and every
outcome must be a result or a documented exception (``TypeError``/``ValueError``/
``OverflowError``/``CudnnError``). The number of cases is printed (``pytest -s``) and
checked. ``PYCUDNN_FUZZ_EXAMPLES`` sets the examples per target (default 150).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("hypothesis")

CHILD = pathlib.Path(__file__).resolve().parents[1] / "support" / "_desc_fuzz_child.py"


@pytest.mark.slow
def test_fuzz_all_constructors_in_child_process():
    examples = int(os.environ.get("PYCUDNN_FUZZ_EXAMPLES", "150"))
    env = dict(os.environ, PYTHONWARNINGS="error::RuntimeWarning")
    proc = subprocess.run(
        [sys.executable, str(CHILD), str(examples)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    # a negative return code is a signal: the child crashed (e.g. SIGSEGV in cuDNN)
    assert proc.returncode == 0, (
        f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"\nfuzz: {result['cases']} cases, outcomes {result['outcomes']}")
    assert result["live"] == {}, result
    targets = {k for k in result["per_target"] if "rejected" not in k}
    assert len(targets) >= 20, targets
    assert result["cases"] >= 20 * examples
    # the generators reach cuDNN: many cases succeed, and cuDNN itself rejects some
    assert result["outcomes"].get("ok", 0) >= 2 * examples  # typically ~5x
    assert set(result["outcomes"]) <= {
        "ok",
        "TypeError",
        "ValueError",
        "OverflowError",
        "BadParamError",
        "NotSupportedError",
        "SublibraryError",
        "InternalError",
        "AllocationError",
        "CudnnError",
    }
