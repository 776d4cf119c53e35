"""``python -m pycudnn`` on a GPU: the report lists the GPU and every self-test case passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pycudnn._selftest import _check as _orig

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.gpu
def test_report_and_self_test_on_gpu():
    r = subprocess.run(
        [sys.executable, "-m", "pycudnn"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
        check=False,
    )
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "GPU 0" in r.stdout and "supported" in r.stdout
    for case in ("conv", "pool", "batchnorm", "softmax", "lstm"):
        assert f"PASS  {case}" in r.stdout, case
    assert "FAIL" not in r.stdout


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["conv", "pool", "batchnorm", "softmax"])
def test_self_test_cases_detect_wrong_results(name, monkeypatch):
    """A case must fail when its reference disagrees: the check cannot pass vacuously."""
    from pycudnn import _selftest

    monkeypatch.setattr(_selftest, "_check", lambda n, got, want, tol: _orig(n, got, want + 1, tol))
    with pytest.raises(AssertionError):
        dict(_selftest.CASES)[name]()
