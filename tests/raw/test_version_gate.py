"""The version gate of first use (issue 16), with fake libraries in child processes.

A tiny ``libcudnn.so.9`` is compiled with gcc into a temporary directory: its ``cudnnGetVersion``
returns 8907 (cuDNN 8.9.7) or 100000 (a future 10.0.0), and nothing else is exported. Loaded
through ``PYCUDNN_LIBRARY``, every entry point must raise ``VersionMismatchError`` -- a descriptor,
``pycudnn.api``, ``pycudnn.lib``, the high level, ``library_info`` -- not only ``version()``;
``libz`` (a file that is not cuDNN) must give ``LibraryNotFoundError`` everywhere.
``version(raises=False)`` never raises, and ``python -m pycudnn`` never prints a traceback and
says the mismatch once. ``PYCUDNN_SKIP_VERSION_CHECK=1`` opens the gate.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pycudnn import _loader, errors
from pycudnn import lib as _lib

ROOT = Path(__file__).resolve().parents[2]
LIBZ = "/lib/x86_64-linux-gnu/libz.so.1"

FAKE_C = """
unsigned long cudnnGetVersion(void) { return %dUL; }
unsigned long cudnnGetCudartVersion(void) { return 12020UL; }
"""


@pytest.fixture(scope="module")
def fakes(tmp_path_factory) -> dict[str, str]:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("needs gcc to build the fake libcudnn.so.9")
    out = {}
    for name, version in (("v8", 8907), ("v10", 100000)):
        d = tmp_path_factory.mktemp(f"fake_cudnn_{name}")
        (d / "fake.c").write_text(FAKE_C % version)
        lib = d / "libcudnn.so.9"
        src = str(d / "fake.c")
        subprocess.run(
            [gcc, "-shared", "-fPIC", "-Wl,-soname,libcudnn.so.9", "-o", str(lib), src],
            check=True,
            capture_output=True,
        )
        out[name] = str(lib)
    return out


ENTRY_POINTS = """
import ctypes, json
import pycudnn
from pycudnn import errors
from pycudnn.enums import DataType
from pycudnn.highlevel import _operand

class Fake:  # a device array the high level accepts without a GPU (see tests/test_conv.py)
    shape, strides, ptr, dt, device = (1, 2, 3, 4), (24, 12, 4, 1), 1 << 32, DataType.FLOAT, 0

_operand.register_operand_type(Fake, lambda f: (f.ptr, f.shape, f.strides, f.dt, f.device))
calls = {
    "descriptor": lambda: pycudnn.TensorDescriptor((1, 2, 3, 4)),
    "backend": lambda: pycudnn.BackendDescriptor("tensor"),
    "api": lambda: pycudnn.api.cudnnGetErrorString(0),
    "api_status": lambda: pycudnn.api.cudnnCreateTensorDescriptor(None),
    "lib": lambda: pycudnn.lib.cudnnGetErrorString(0),
    "lib_has": lambda: pycudnn.lib.has("cudnnCreate"),
    "checked": lambda: errors.checked("cudnnCreate"),
    "highlevel": lambda: pycudnn.dnn_activation(Fake()),
    "version": pycudnn.version,
    "library_info": pycudnn.library_info,
}
out = {}
for name, call in calls.items():
    try:
        call()
        out[name] = "ok"
    except Exception as exc:
        out[name] = type(exc).__name__
out["version_no_raise"] = pycudnn.version(raises=False)
out["is_available"] = pycudnn.is_available()
print(json.dumps(out))
"""


def _run(code: str, env: dict) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    for k, v in list(full.items()):
        if v is None:
            del full[k]
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full,
        timeout=120,
        check=False,
    )


def _entry_points(env: dict) -> dict:
    r = _run(ENTRY_POINTS, env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("which", ["v8", "v10"])
def test_other_major_is_refused_by_every_entry_point(fakes, which):
    out = _entry_points({"PYCUDNN_LIBRARY": fakes[which], "PYCUDNN_SKIP_VERSION_CHECK": None})
    for name in (
        "descriptor",
        "backend",
        "api",
        "api_status",
        "lib",
        "lib_has",
        "checked",
        "highlevel",
        "version",
        "library_info",
    ):
        assert out[name] == "VersionMismatchError", (name, out)
    assert out["version_no_raise"] == -1
    assert out["is_available"] is False


def test_a_file_that_is_not_cudnn_is_refused_by_every_entry_point():
    if not os.path.exists(LIBZ):
        pytest.skip(f"{LIBZ} not present")
    out = _entry_points({"PYCUDNN_LIBRARY": LIBZ, "PYCUDNN_SKIP_VERSION_CHECK": None})
    for name in ("descriptor", "api", "lib", "lib_has", "checked", "highlevel", "version"):
        assert out[name] == "LibraryNotFoundError", (name, out)
    assert out["version_no_raise"] == -1
    assert out["is_available"] is False
    # the skip flag opens the version gate only, not the "is it cuDNN" check
    out = _entry_points({"PYCUDNN_LIBRARY": LIBZ, "PYCUDNN_SKIP_VERSION_CHECK": "1"})
    assert out["descriptor"] == "LibraryNotFoundError"


def test_skip_flag_opens_the_gate(fakes):
    out = _entry_points({"PYCUDNN_LIBRARY": fakes["v8"], "PYCUDNN_SKIP_VERSION_CHECK": "1"})
    assert out["version"] == "ok"
    # past the gate the fake has no functions: a SymbolNotFoundError, not a mismatch
    assert out["descriptor"] == "SymbolNotFoundError"
    assert out["version_no_raise"] == 8907


def test_gate_message_names_versions_paths_and_fixes(fakes):
    r = _run(
        "import pycudnn\ntry:\n    pycudnn.TensorDescriptor((1, 2, 3))\n"
        "except pycudnn.VersionMismatchError as e:\n    print(e)\n",
        {"PYCUDNN_LIBRARY": fakes["v8"], "PYCUDNN_SKIP_VERSION_CHECK": None},
    )
    assert r.returncode == 0, r.stderr
    msg = r.stdout
    for needle in (
        "cuDNN 8.9.7",
        fakes["v8"],
        "PYCUDNN_LIBRARY",
        "need cuDNN 9.x",
        "pip install",
        "PYCUDNN_SKIP_VERSION_CHECK=1",
    ):
        assert needle in msg, needle


@pytest.mark.parametrize("case", ["v8", "libz", "v8_skipped"])
def test_doctor_never_prints_a_traceback(fakes, case):
    lib = LIBZ if case == "libz" else fakes["v8"]
    if not os.path.exists(lib):
        pytest.skip(f"{lib} not present")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PYCUDNN_LIBRARY": lib,
        "PYCUDNN_SKIP_VERSION_CHECK": "1" if case == "v8_skipped" else "",
    }
    r = subprocess.run(
        [sys.executable, "-m", "pycudnn", "--no-self-test"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert r.returncode == 1
    assert "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    if case == "v8":
        assert "check       MISMATCH: cuDNN 8.9.7" in r.stdout
        assert r.stdout.count("was loaded from") == 1, r.stdout  # the message, once
        assert "runtime     8.9.7 (8907)" in r.stdout
    if case == "libz":
        assert "NOT FOUND" in r.stdout and "not a cuDNN library" in r.stdout


def test_gate_constants_and_the_real_library():
    assert _lib.CUDNN_MAJOR == _loader.REQUIRED_MAJOR
    assert errors.VersionMismatchError is _loader.VersionMismatchError
    assert _loader.load() is _loader.load_unchecked()  # the real 9.x library passes the gate
