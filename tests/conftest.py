"""Test tiers: pure Python; needs libcudnn (CI); needs a GPU (marker ``gpu``, skipped without one).

Run the GPU tier on the GPU machine with ``PYTHONPATH=. python3 -m pytest -m gpu -q``.
"""

from __future__ import annotations

import functools

import pytest


@functools.cache
def gpu_unavailable_reason() -> str | None:
    """None when a CUDA device is usable, else why not (never raises)."""
    try:
        from cuda.bindings import runtime
    except ImportError as exc:
        return f"cuda.bindings not importable: {exc}"
    try:
        err, count = runtime.cudaGetDeviceCount()
    except Exception as exc:  # cuda.bindings raises its own types when libcuda is absent
        return f"CUDA runtime unusable: {exc}"
    if int(err) != 0 or not count:
        return f"no CUDA device (cudaGetDeviceCount: {getattr(err, 'name', err)})"
    return None


def pytest_collection_modifyitems(config, items):
    reason = gpu_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs a GPU: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
