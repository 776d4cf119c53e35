"""Test tiers: pure Python; needs libcudnn (CI); needs a GPU (marker ``gpu``, skipped without one);
needs two GPUs (marker ``multigpu`` on top of ``gpu``, skipped with the count seen on fewer).

Run the GPU tier on the GPU machine with ``PYTHONPATH=. python3 -m pytest -m gpu -q``. Tests
marked ``slow`` (leak soaks, fuzzing in child processes: minutes) are opt-in: ``--slow`` adds them
to a run, ``-m slow`` runs them alone (CI does, as a step of its own).

The tests are grouped by layer: ``raw/`` (generated bindings, errors, loader, versions, logging),
``descriptors/``, ``device/`` (CUDA runtime, handles, config), ``memory/`` (device arrays,
interop), ``highlevel/`` (one file per operation family, ``*_gpu.py`` beside each), ``graph/``
(the graph builder; ``nodes/`` its operation families), ``torch_adapter/`` (the PyTorch adapter
``pycudnn.torch``: fakes, models, compile, fusion, programs) and ``tooling/`` (layering,
generator, packaging, docs, benchmark harness, examples). ``support/`` holds what several of
them share: the child-process scripts, the C-call counting shim, the fake device arrays, the
mini header fixture; it is put on ``sys.path`` here, so tests import those modules by name.
No folder here is named after a package the tests import (``torch``, ``jax``, ...): pytest puts
``tests/`` on ``sys.path``, and where the package is not installed the folder would be imported
in its place, as an empty namespace package.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import pytest

# JAX preallocates most of a GPU's memory when its CUDA backend starts: on the GPU machine that
# would starve the other tests of the process (the JAX adapter's tests, tests/jax_adapter)
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

SUPPORT = Path(__file__).resolve().parent / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))


@functools.cache
def gpu_unavailable_reason() -> str | None:
    """None when a CUDA device is usable, else why not (never raises): pycudnn's own diagnosis,
    which tells no driver from a driver too old for the installed cuda-bindings."""
    try:
        from pycudnn import _cuda
    except ImportError as exc:
        return f"pycudnn._cuda not importable: {exc}"
    return _cuda.gpu_unavailable_reason()


@functools.cache
def gpu_count() -> int:
    """The number of visible CUDA devices (0 when none is usable)."""
    if gpu_unavailable_reason() is not None:
        return 0
    from cuda.bindings import runtime

    return int(runtime.cudaGetDeviceCount()[1])


def pytest_addoption(parser):
    parser.addoption(
        "--slow",
        action="store_true",
        help="also run the tests marked slow (leak soaks, fuzzing); -m slow runs only those",
    )


def _deselect_slow(config, items):
    """The ``slow`` tests are opt-in: ``--slow`` adds them, and a ``-m`` expression that names
    ``slow`` decides for itself (CI runs ``-m slow`` as a step of its own)."""
    if config.getoption("--slow") or "slow" in (config.getoption("markexpr") or ""):
        return
    slow = [item for item in items if "slow" in item.keywords]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if "slow" not in item.keywords]


def pytest_collection_modifyitems(config, items):
    _deselect_slow(config, items)
    reason = gpu_unavailable_reason()
    if reason is None and gpu_count() >= 2:
        return
    skip = pytest.mark.skip(reason=f"needs a GPU: {reason}")
    multi = pytest.mark.skip(
        reason=f"needs two GPUs (multigpu): {gpu_count()} visible"
        + ("" if reason is None else f" ({reason})")
    )
    for item in items:
        if "multigpu" in item.keywords:
            item.add_marker(multi)
        elif reason is not None and "gpu" in item.keywords:
            item.add_marker(skip)
