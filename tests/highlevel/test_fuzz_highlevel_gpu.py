"""Property-based fuzzing of the high-level layer on the GPU (issue 16; marker ``gpu``).

Run on the GPU machine::

    PYTHONPATH=. python3 -m pytest -m gpu -q -s tests/highlevel/test_fuzz_highlevel_gpu.py

Each group runs in a child process (``tests/support/_fuzz_highlevel_child.py GROUP EXAMPLES``; a
crash is a signal here): ``conv`` (dnn_conv/conv3d/gradinput(3d)/gradweight(3d) against float64
NumPy references), ``elementwise`` (activation, softmax and their gradients, add_tensor, op_tensor),
``rnn`` (RNNBlock shapes, finiteness, repeatability, invalid inputs), ``pending`` (functions being
written now -- dnn_pool has a spec; names that do not exist yet are skipped and listed) and
``generic`` (junk arguments to every ``dnn_*`` of ``pycudnn.highlevel.__all__``). Valid cases must
match the reference, invalid ones raise documented errors, and the device must stay healthy
(``cudaDeviceSynchronize``/``cudaGetLastError`` clean) after every case.
``PYCUDNN_GPU_FUZZ_EXAMPLES`` sets the examples per function (default 30).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("hypothesis")

pytestmark = pytest.mark.gpu

CHILD = pathlib.Path(__file__).resolve().parents[1] / "support" / "_fuzz_highlevel_child.py"
ROOT = CHILD.parents[2]


@pytest.mark.parametrize("group", ["conv", "elementwise", "rnn", "pending", "generic"])
def test_highlevel_fuzz_batch_in_child_process(group):
    examples = os.environ.get("PYCUDNN_GPU_FUZZ_EXAMPLES", "30")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, str(CHILD), group, examples],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
    )
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.startswith("{")]
    out = json.loads(lines[-1]) if lines else {}
    print(
        f"\ngpu fuzz[{group}]: rc={proc.returncode}, {out.get('cases')} cases, "
        f"problems {out.get('n_problems')}, outcomes {out.get('outcomes')}, "
        f"not yet written: {out.get('skipped_not_yet_written')}, device healthy "
        f"{out.get('device_healthy')}"
    )
    # a negative return code is a signal: the child crashed; 3: a sticky CUDA error
    assert proc.returncode == 0, f"rc={proc.returncode}\n{out}\n{proc.stderr[-5000:]}"
    assert out["n_problems"] == 0, "\n".join(out["problems"])
    assert out["device_healthy"]
    if group != "pending":
        assert out["cases"] > 0
