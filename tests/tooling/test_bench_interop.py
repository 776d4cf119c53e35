"""The interop benchmarks (bench/interop.py, bench/interop_strictness.py) without a GPU: they
import without cuda.core, time and tabulate, read a fake device array both ways, and the
strictness probe builds every case and classifies outcomes (one case run end to end in a
subprocess when cuda.core is importable)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import interop, interop_strictness  # noqa: E402
from pycudnn.memory.array import DeviceArray  # noqa: E402

ADDR = 0x7F00_0000_0000


def _fake(shape=(1, 8, 8, 8)):
    return DeviceArray.from_ptr(ADDR, shape, np.float32, None, device=0, check=False)


def test_timing_helpers():
    stats = interop.per_call_us(lambda: None, batches=3, calls=10)
    assert stats["batches"] == 3 and 0 <= stats["min"] <= stats["median"]
    assert "ZeroDivisionError" in interop.timed(lambda: 1 / 0, 3, 10)["error"]


def test_our_readers_on_a_fake_array():
    readers = interop.ours_readers(_fake())
    ptr, shape, strides, _dt, device = readers["hot path read"]()
    assert (ptr, tuple(shape), tuple(strides), device) == (ADDR, (1, 8, 8, 8), (512, 64, 8, 1), 0)
    assert readers["producer_stream"]() is None  # a pycudnn array keeps the handle's stream


def test_cuda_core_reads_the_same_fake_array():
    smv = interop.strided_memory_view()
    if smv is None:
        pytest.skip("cuda.core is not importable")
    x = _fake()
    for name, fn in interop.cuda_core_readers(smv, x).items():
        if "cuda_array_interface" in name:
            continue  # asks the driver where the pointer lives: GPU machines only
        ptr, shape, _strides, dtype, device, readonly = fn()
        assert (ptr, tuple(shape), str(dtype), device, readonly) == (
            ADDR,
            (1, 8, 8, 8),
            "float32",
            0,
            False,
        ), name
    assert interop.check_same_view(smv, x)["same"] is True


def test_table_of_a_synthetic_result():
    m = {"median": 2.0, "min": 1.0, "batches": 3}
    result = {
        "read": {
            "cupy": {
                "ours": {"hot path read": m, "producer_stream": m},
                "cuda.core": {"from_dlpack(obj, -1)": {"median": 1.0}, "x": {"error": "E: no"}},
                "same_view": {"same": True},
            }
        },
        "call": {"cupy": {"median": 20.0}},
        "export": {"torch.from_dlpack": {"pycudnn DeviceArray": m, "cuda.core Buffer": m}},
        "skipped": {"jax": "not installed or no GPU"},
    }
    text = interop.table(result)
    assert "cupy: read one operand" in text and "0.500" in text and "from_dlpack" in text
    assert "cupy cuda.core x: E: no" in text and "skipped jax" in text


def test_strictness_cases_build_and_verdicts():
    mod = interop_strictness.load_tests()
    table = interop_strictness.cases(mod)
    assert len(table) > 60
    for _name, kind, spec, _valid in table:
        interop_strictness.build(mod, kind, spec, mod.ADDR)
    v = interop_strictness.verdict
    rejected, accepted = {"outcome": "rejected"}, {"outcome": "accepted", "view": {"shape": [2]}}
    assert v(False, False, rejected, rejected) == "as strict"
    assert v(False, False, rejected, accepted) == "LAX"
    assert v(False, True, rejected, accepted) == "accepts(policy)"
    assert v(False, False, rejected, {"outcome": "crashed"}) == "CRASH"
    assert v(True, False, accepted, rejected) == "stricter"
    assert v(True, False, accepted, accepted) == "same view"
    assert v(True, False, accepted, {"outcome": "accepted", "view": {"shape": [3]}}) == "WRONG VIEW"


def test_strictness_child_runs_one_capsule_case():
    if interop.strided_memory_view() is None:
        pytest.skip("cuda.core is not importable")
    table = interop_strictness.cases(interop_strictness.load_tests())
    index = next(i for i, c in enumerate(table) if c[0] == "valid dlpack {}")
    res = interop_strictness.run_case(index, timeout=120)
    assert res["pycudnn"]["outcome"] == "accepted"
    assert res["cuda.core"]["outcome"] == "accepted", res
