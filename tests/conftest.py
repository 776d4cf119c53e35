"""Test tiers: pure Python; needs libcudnn (CI); needs a GPU (marker ``gpu``, skipped without one).

Run the GPU tier on the GPU machine with ``PYTHONPATH=. python3 -m pytest -m gpu -q``.

The tests are grouped by layer: ``raw/`` (generated bindings, errors, loader, versions, logging),
``descriptors/``, ``device/`` (CUDA runtime, handles, memory, config), ``highlevel/`` (one file per
operation family, ``*_gpu.py`` beside each) and ``tooling/`` (layering, generator, packaging, docs,
benchmark harness, examples). ``support/`` holds what several of them share: the child-process
scripts, the C-call counting shim, the fake device arrays, the mini header fixture; it is put on
``sys.path`` here, so tests import those modules by name.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest

SUPPORT = Path(__file__).resolve().parent / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))


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
