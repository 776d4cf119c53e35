"""Issue 30's CPU fuzzer: random and adversarial builder programs, the attention and norm
operations' arguments and the strict booleans, each case in a forked child of one process that
imported pycudnn (``tests/support/_fuzz_builder_child.py``; its docstring has the oracles).

A crash or a hang is a signal in the parent; every case must end as its oracle says: a valid one
runs (a builder program records its operations with the expected dims, a high-level call
reaches its call entry), an invalid one is refused before any C call with a message naming the
graph or function and the argument. ``PYCUDNN_FUZZ_CASES`` / ``PYCUDNN_FUZZ_SEED`` change the
run (default 2,400 cases, seed 30); ``pytest -s`` prints the figures ``docs/RELIABILITY.md``
quotes.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

CHILD = pathlib.Path(__file__).resolve().parents[1] / "support" / "_fuzz_builder_child.py"
ROOT = CHILD.parents[2]


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="one fork per case")
def test_fuzz_builder_and_transformer_surface_in_child_processes():
    cases = int(os.environ.get("PYCUDNN_FUZZ_CASES", "2400"))
    seed = int(os.environ.get("PYCUDNN_FUZZ_SEED", "30"))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, str(CHILD), str(cases), str(seed)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, (
        f"rc={proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    )
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    outcomes = out["outcomes"]
    print(
        f"\nfuzz[builder+transformer, seed {seed}]: {out['cases']} cases, outcomes {outcomes}, "
        f"per generator {out['per_generator']}"
    )
    assert out["cases"] == cases
    bad = {k: v for k, v in outcomes.items() if k != "ok"}
    assert not bad, json.dumps(out["examples"], indent=1)[:6000]
