"""Property-based fuzzing of the high-level layer on the GPU (issue 16; marker ``gpu``).

Run on the GPU machine::

    PYTHONPATH=. python3 -m pytest -m gpu -q -s tests/highlevel/test_fuzz_highlevel_gpu.py

Each group runs in a child process (``tests/support/_fuzz_highlevel_child.py GROUP EXAMPLES``; a
crash is a signal here, attributed to the function that was running): ``conv``
(dnn_conv/conv3d/gradinput(3d)/gradweight(3d)), ``elementwise`` (activation, softmax and their
gradients, add_tensor, op_tensor), ``rnn`` (RNNBlock shapes, finiteness, repeatability, invalid
inputs), ``pool`` (dnn_pool, dnn_pool_grad), ``batchnorm`` (training, inference, backward),
``lrn`` (dnn_lrn, dnn_lrn_grad), ``reduction``, ``dropout`` (the mask property: kept elements
scaled by 1/(1-p), the gradient through the same mask), ``spatialtf`` (grid, sampler, the whole
transformer and their gradients), ``ctc`` (loss and gradient, every reduction) -- all against
float64 NumPy references (``tests/support/references.py``) --, issue 30's ``matmul``
(dnn_matmul: batch broadcast, transposed views, bias, activations, float16/bfloat16, float32
under TF32 against a float32 reference), ``norms`` (dnn_layer_norm, dnn_rms_norm and their
gradients), ``sdpa`` (dnn_sdpa, dnn_sdpa_grad: causal, GQA, padding lengths, head dims 64/128,
S 1..300; dropout for shape, finiteness and determinism with a seed) and ``graph`` (random
builder graphs run with ``Graph.execute``: conv+bias+activation, matmul+pointwise chains,
matmul+reduction; specs in ``tests/support/_fuzz_transformer_specs.py``), and ``generic`` (junk
arguments to every ``dnn_*`` of ``pycudnn.highlevel.__all__``). Valid cases must match the
reference, invalid ones raise documented errors, and the device must stay healthy
(``cudaDeviceSynchronize``/``cudaGetLastError`` clean) after every case. With ``-s`` it prints
one figures line per function and a total line last (for docs/RELIABILITY.md).
``PYCUDNN_GPU_FUZZ_EXAMPLES`` sets the examples per function (default 30).
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

pytest.importorskip("hypothesis")

pytestmark = pytest.mark.gpu

CHILD = pathlib.Path(__file__).resolve().parents[1] / "support" / "_fuzz_highlevel_child.py"
ROOT = CHILD.parents[2]
GROUPS = [
    "conv",
    "elementwise",
    "rnn",
    "pool",
    "batchnorm",
    "lrn",
    "reduction",
    "dropout",
    "spatialtf",
    "ctc",
    "matmul",
    "norms",
    "sdpa",
    "graph",
    "generic",
]
FINDINGS = ("silent_accepts", "false_refusals", "wrong_results", "undocumented")
#: figures summed over the groups that ran (the total line printed after the last)
TOTAL: collections.Counter[str] = collections.Counter()


def figures_line(name: str, f: dict, crashes: int) -> str:
    """One line per function, for docs/RELIABILITY.md's GPU table."""
    return (
        f"gpu fuzz {name}: {f.get('cases', 0)} cases (valid {f.get('valid', 0)}, invalid "
        f"{f.get('invalid', 0)}, either {f.get('either', 0)}; {f.get('checked', 0)} checked "
        f"against the reference, {f.get('refused', 0)} refused with a documented error), "
        f"crashes {crashes}, silent accepts {f.get('silent_accepts', 0)}, false refusals "
        f"{f.get('false_refusals', 0)}, wrong results {f.get('wrong_results', 0)}, undocumented "
        f"errors {f.get('undocumented', 0)}"
    )


@pytest.fixture(scope="module", autouse=True)
def total_line():
    yield
    if TOTAL:
        print(
            "\n"
            + figures_line(
                f"TOTAL ({TOTAL.pop('functions', 0)} functions)", TOTAL, TOTAL.pop("crashes", 0)
            )
        )


@pytest.mark.parametrize("group", GROUPS)
def test_highlevel_fuzz_batch_in_child_process(group):
    examples = os.environ.get("PYCUDNN_GPU_FUZZ_EXAMPLES", "30")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(CHILD), group, examples],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
    )
    seconds = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.startswith("{")]
    out = json.loads(lines[-1]) if lines else {}
    started = [ln[6:] for ln in proc.stdout.splitlines() if ln.startswith("START ")]
    crashed = started[-1] if proc.returncode != 0 and started else None
    figures = out.get("figures", {})
    if group == "generic":  # one line for the junk-argument pass over every function
        summed: collections.Counter[str] = collections.Counter()
        for f in figures.values():
            summed.update(f)
        figures = {f"generic ({len(started)} functions, junk arguments)": dict(summed)}
    print()
    for name in sorted(set(figures) | ({crashed} if crashed else set())):
        crashes = int(name == crashed)
        print(figures_line(name, figures.get(name, {}), crashes))
        TOTAL.update(figures.get(name, {}))
        TOTAL["functions"] += 1
        TOTAL["crashes"] += crashes
    print(
        f"gpu fuzz[{group}]: rc={proc.returncode}, {out.get('cases')} cases in {seconds:.1f} s, "
        f"problems {out.get('n_problems')}, outcomes {out.get('outcomes')}, not yet written: "
        f"{out.get('skipped_not_yet_written')}, device healthy {out.get('device_healthy')}"
    )
    # a negative return code is a signal: the child crashed; 3: a sticky CUDA error
    assert proc.returncode == 0, f"rc={proc.returncode} in {crashed}\n{out}\n{proc.stderr[-5000:]}"
    assert out["n_problems"] == 0, "\n".join(out["problems"])
    assert out["device_healthy"]
    assert out["cases"] > 0
    assert not out["skipped_not_yet_written"]
