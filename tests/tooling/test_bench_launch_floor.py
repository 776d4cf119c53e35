"""CPU tests of ``bench/launch_floor.py`` (issue 37's launch floor): it loads without torch or a
GPU and without bench/'s harness; its arguments, statistics, table and the busy-GPU timing loop
(with a fake spin) behave. The benchmark itself runs on the GPU machine:
``PYTHONPATH=. python3 bench/launch_floor.py --json OUT.json``.
"""

from __future__ import annotations

import importlib.util
import re
import types
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "bench" / "launch_floor.py"


@pytest.fixture(scope="module")
def lf():
    spec = importlib.util.spec_from_file_location("launch_floor", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_it_imports_nothing_of_bench_and_no_torch_at_import():
    text = PATH.read_text()
    assert not re.search(r"^\s*(from|import)\s+(bench\b|\.)", text, re.M)
    top_level = [line for line in text.splitlines() if re.match(r"(import|from) ", line)]
    assert not [line for line in top_level if "torch" in line or "pycudnn" in line]


def test_arguments(lf):
    args = lf.parse_args([])
    assert (args.n, args.reps, args.batch, args.dtype, args.json) == (200, 30, 8, "bfloat16", None)
    assert args.rows == lf.ROWS and args.case == list(lf.CASES)
    args = lf.parse_args(
        ["--json", "o.json", "--n", "50", "--rows", "floor,torch", "--case", "1x1 64->64 14x14"]
    )
    assert args.json == "o.json" and args.n == 50 and args.rows == ("floor", "torch")
    assert args.case == ["1x1 64->64 14x14"]
    for bad in (["--n", "0"], ["--n", "2000"], ["--reps", "1"], ["--rows", "floor,nope"]):
        with pytest.raises(SystemExit):
            lf.parse_args(bad)


def test_summary_and_table(lf):
    s = lf.summarize([4.0, 1.0, 3.0, 2.0, 5.0])
    assert s == {"median_us": 3.0, "q1_us": 2.0, "q3_us": 4.0}
    assert lf.summarize([7.0]) == {"median_us": 7.0, "q1_us": 7.0, "q3_us": 7.0}
    rows = {
        "floor": {"median_us": 2.0, "q1_us": 1.9, "q3_us": 2.1, "drained": 0},
        "execute": {"median_us": 5.0, "q1_us": 4.5, "q3_us": 5.5, "drained": 1},
        "lean": {"error": "ImportError: no torch adapter"},
    }
    text = lf.format_table("3x3 64->64 56x56", rows)
    lines = text.splitlines()
    assert lines[0] == "3x3 64->64 56x56" and "us/launch" in lines[1]
    assert re.search(r"floor\s+2\.00\s+1\.90-2\.10\s+1\.00\s+0$", lines[2])
    assert re.search(r"execute\s+5\.00\s+4\.50-5\.50\s+2\.50\s+1$", lines[3])
    assert "n/a" in lines[4] and "ImportError" in lines[4]
    # without a floor row: no ratio
    assert "-" in lf.format_table("c", {"torch": rows["floor"]}).splitlines()[2]


def test_a_drained_run_is_repeated_with_a_longer_spin(lf):
    cuda = types.SimpleNamespace(synchronize=lambda: None)

    class FakeBusy:
        torch = types.SimpleNamespace(cuda=cuda)

        def __init__(self):
            self.spins = []

        def time(self, fn, spin_us):
            fn()
            self.spins.append(spin_us)
            # the spin "ends too soon" on the second timed run's first attempt
            return 1000 * len(self.spins), len(self.spins) == 2

    busy = FakeBusy()
    calls = []
    times, drained = lf._timed_runs(busy, lambda: calls.append(1), warm=2, reps=3)
    assert drained == 1 and len(times) == 3 and len(calls) == 2 + 4
    assert busy.spins[2] == 2 * busy.spins[1] and busy.spins[0] >= 2000
    monkey_busy = FakeBusy()
    lf._BUSY = monkey_busy
    try:
        assert lf.enqueue_time(lambda: None, warm=1, reps=5) > 0
    finally:
        lf._BUSY = None
