"""pycudnn's own work raises nothing under ``python -W error`` (tier B: libcudnn, no GPU).

Each case runs in a child process started with ``-W error``, so a warning anywhere — pycudnn's
legacy descriptor calls, a ``DeprecationWarning`` from the import of a dependency, a
``ResourceWarning`` at exit — fails it. The one warning pycudnn issues by design for *user* code
(``CudnnDeprecationWarning`` on a direct ``pycudnn.api`` call of a deprecated function) is checked
to still fire, once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

WORK = """
import io, logging
import pycudnn
from pycudnn import (
    ActivationDescriptor, BackendDescriptor, ConvolutionDescriptor, CTCLossDescriptor,
    FilterDescriptor, LRNDescriptor, OpTensorDescriptor, PoolingDescriptor,
    ReduceTensorDescriptor, RNNDataDescriptor, SpatialTransformerDescriptor, TensorDescriptor,
)

# versions and diagnostics
assert pycudnn.version() == pycudnn.header_version() or pycudnn.version() > 0
pycudnn.library_info(); pycudnn.cudart_version(); pycudnn.is_available()
buf = io.StringIO()
pycudnn.show_config(file=buf)
assert "cuDNN" in buf.getvalue()

# the descriptor layer: every family that needs no GPU, set and read back
x = TensorDescriptor((8, 3, 32, 32), "float16", layout="NHWC")
w = FilterDescriptor((16, 3, 3, 3), "float16", layout="NHWC")
with ConvolutionDescriptor(pad=1, stride=1, compute_type="float32") as conv:
    y = TensorDescriptor(conv.forward_output_shape(x, w), "float16")
    assert (y.shape, y.strides, y.dtype) and (conv.pad, conv.stride, conv.dilation)
pool = PoolingDescriptor(2, stride=2, mode="max")
assert pool.forward_output_shape(y) == (8, 16, 16, 16)
descs = [
    x, w, y, pool,
    ActivationDescriptor("relu"),
    LRNDescriptor(5, 1e-4, 0.75, 2.0),
    OpTensorDescriptor("add", "float32"),
    ReduceTensorDescriptor("add", "float32"),
    RNNDataDescriptor([3, 2], 4, dtype="float32"),
    SpatialTransformerDescriptor((2, 3, 8, 8), "float32", "bilinear"),
    CTCLossDescriptor("float32"),
]
for d in descs:
    repr(d)
    d.close()
t = BackendDescriptor("TENSOR_DESCRIPTOR")
t.set("TENSOR_DIMENSIONS", "INT64", [1, 8, 16, 16])
t.close()

# flags, logging
with pycudnn.config.override(algo_fwd="time_once"):
    assert pycudnn.config.algo_fwd == "time_once"
pycudnn.enable_logging(logging.INFO)
pycudnn.disable_logging()
print("clean")
"""


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONWARNINGS", None)
    return subprocess.run(
        [sys.executable, "-W", "error", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )


def test_import_descriptors_versions_config_logging_under_W_error():
    r = _run("-c", textwrap.dedent(WORK))
    assert r.returncode == 0 and r.stdout.strip().endswith("clean"), r.stdout + r.stderr
    assert r.stderr == "", r.stderr


def test_python_m_pycudnn_under_W_error():
    r = _run("-m", "pycudnn", "--no-self-test")
    assert "Traceback" not in r.stderr, r.stderr
    assert r.stderr == "", r.stderr
    assert "pycudnn " in r.stdout and "cuDNN" in r.stdout
    # healthy here (pinned cuDNN, no GPU is not a failure): exit 0
    assert r.returncode == 0, r.stdout


def test_import_alone_under_W_error():
    r = _run("-c", "import pycudnn, pycudnn.lib, pycudnn.api, pycudnn.enums, pycudnn.highlevel")
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_a_users_deprecated_call_still_warns_once():
    code = """
    import ctypes, warnings
    from pycudnn import CudnnDeprecationWarning, api, lib
    d = lib.cudnnTensorDescriptor_t()
    api.cudnnCreateTensorDescriptor(ctypes.byref(d))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            api.cudnnSetTensor4dDescriptor(d, 0, 0, 1, 2, 3, 4)
    api.cudnnDestroyTensorDescriptor(d)
    dep = [w for w in caught if issubclass(w.category, CudnnDeprecationWarning)]
    deprecated = "cudnnSetTensor4dDescriptor" in lib.DEPRECATED_FUNCTIONS
    assert len(dep) == (1 if deprecated else 0), [str(w.message) for w in caught]
    print("ok")
    """
    r = _run("-c", textwrap.dedent(code))
    if r.returncode and "SymbolNotFoundError" in r.stderr:  # pragma: no cover
        pytest.skip(r.stderr.strip().splitlines()[-1])
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
