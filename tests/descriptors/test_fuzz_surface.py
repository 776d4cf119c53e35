"""Property-based fuzzing of the public surface without a GPU (issue 16), each batch in a child.

Batches (``tests/support/_fuzz_surface_child.py GROUP``): ``backend`` (every backend attribute with
values of every kind, descriptor-valued ones against the documented types, finalize and read-back
through the stub ``libcuda.so.1`` of ``test_backend_descriptors.py``, graph -> engine -> config ->
plan chains, closes in random orders), ``arguments`` (handle, dtype and spatial arguments, the
``pycudnn.api`` guard with junk in every argument), ``interop`` (``__cuda_array_interface__``
records, hand-built DLPack capsules, exports), ``config`` (flags, ``PYCUDNN_FLAGS``). A crash is a
signal (negative return code) in the parent; every outcome must be a correct result or a documented
error; silent accepts, false refusals and wrong results must be 0. ``PYCUDNN_FUZZ_EXAMPLES`` sets
the examples per target (default 150; the figures in ``docs/RELIABILITY.md`` are printed with
``pytest -s``).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("hypothesis")

CHILD = pathlib.Path(__file__).resolve().parents[1] / "support" / "_fuzz_surface_child.py"
ROOT = CHILD.parents[2]


@pytest.fixture(scope="module")
def stub_dir(tmp_path_factory) -> str | None:
    """The stub libcuda.so.1 (cuDNN finalizes without a GPU); None without gcc."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        return None
    from test_backend_descriptors import STUB_C

    d = tmp_path_factory.mktemp("fuzz_stub_libcuda")
    (d / "stub.c").write_text(STUB_C)
    subprocess.run(
        [
            gcc,
            "-shared",
            "-fPIC",
            "-Wl,-soname,libcuda.so.1",
            "-o",
            str(d / "libcuda.so.1"),
            str(d / "stub.c"),
        ],
        check=True,
        capture_output=True,
    )
    return str(d)


@pytest.mark.slow
@pytest.mark.parametrize("group", ["backend", "arguments", "interop", "config"])
def test_fuzz_batch_in_child_process(group, stub_dir):
    examples = int(os.environ.get("PYCUDNN_FUZZ_EXAMPLES", "150"))
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="error::RuntimeWarning")
    if group == "backend" and stub_dir is not None:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (stub_dir, env.get("LD_LIBRARY_PATH")) if p
        )
    proc = subprocess.run(
        [sys.executable, str(CHILD), group, str(examples)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    # a negative return code is a signal: the child crashed
    assert proc.returncode == 0, (
        f"rc={proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-5000:]}"
    )
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    print(
        f"\nfuzz[{group}]: {out['cases']} cases, crashes 0, silent accepts "
        f"{out['n_silent_accepts']}, false refusals {out['n_false_refusals']}, wrong results "
        f"{out['n_wrong_results']}; outcomes {out['outcomes']}"
    )
    assert out["n_silent_accepts"] == 0, out["silent_accepts"]
    assert out["n_false_refusals"] == 0, out["false_refusals"]
    assert out["n_wrong_results"] == 0, out["wrong_results"]
    assert out["live"] == {}, out["live"]
    assert out["cases"] >= 2 * examples
    assert out["outcomes"].get("ok", 0) > 0  # the generators reach success as well as refusal


@pytest.mark.parametrize("value", [float("inf"), float("nan"), "1e400G"])
def test_config_infinite_workspace_limit_is_a_value_error(value):
    """Found by the config fuzzer: float('inf') made parse_size raise OverflowError (int(inf));
    the documented error is ValueError."""
    import pycudnn

    try:
        with pytest.raises(ValueError, match="workspace_limit"):
            pycudnn.config.workspace_limit = value
    finally:
        pycudnn.config.reset()
