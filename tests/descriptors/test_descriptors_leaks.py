"""Leak soak: 100,000 descriptor create/destroy cycles across all families (no GPU).

Runs in a child process so the RSS reading is not disturbed by other tests. After a warm-up,
resident memory may grow by less than 1 MiB and every live counter must be back to zero. Half of
the objects are closed explicitly, half dropped and freed by their finalizers. A short run that
detaches (never destroys) shows that the measurement does see a real leak.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

CHILD = pathlib.Path(__file__).resolve().parents[1] / "support" / "_desc_leak_child.py"
MiB = 1 << 20


def _soak(*args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, str(CHILD), *args], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_100k_create_destroy_cycles_do_not_grow_rss():
    result = _soak("100000")
    print(
        f"\n100k cycles in {result['seconds']} s: RSS {result['rss_before'] / MiB:.1f} -> "
        f"{result['rss_after'] / MiB:.1f} MiB (growth {result['growth']} bytes)"
    )
    assert result["live"] == {}, result
    assert result["growth"] < MiB, result


def test_leak_detector_is_sensitive():
    result = _soak("40000", "leak")
    assert result["growth"] >= MiB, result
