"""Library loading, in child processes (dlopen state is per process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_child(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    for k, v in list(full_env.items()):
        if v is None:
            del full_env[k]
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=ROOT,
        timeout=120,
        check=False,
    )


def child_json(code: str, env: dict | None = None) -> dict:
    r = run_child(code, env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_import_loads_nothing_and_is_fast():
    out = child_json(
        """
        import json, sys, time
        t = time.perf_counter()
        import pycudnn
        dt = time.perf_counter() - t
        maps = open("/proc/self/maps").read()
        print(json.dumps({
            "dt": dt,
            "mapped": "libcudnn" in maps,
            "lib_imported": "pycudnn._generated.lib" in sys.modules,
            "loaded": "pycudnn._loader" in sys.modules
                      and sys.modules["pycudnn._loader"].loaded() is not None,
        }))
        """
    )
    assert out["mapped"] is False and out["lib_imported"] is False and not out["loaded"]
    assert out["dt"] < 0.5, f"import pycudnn took {out['dt']:.3f} s"


def test_first_call_loads_via_pathfinder_and_records_path():
    out = child_json(
        """
        import json, pycudnn
        from pycudnn import _loader
        v = pycudnn.lib.cudnnGetVersion()
        lib = _loader.loaded()
        print(json.dumps({"v": v, "path": lib.path, "via": lib.found_via,
                          "files": _loader.libcudnn_files_in_process()}))
        """,
        env={"PYCUDNN_LIBRARY": None},
    )
    assert out["v"] >= 90000
    assert os.path.isabs(out["path"]) and out["path"] in out["files"]
    assert out["via"].startswith("cuda.pathfinder") or out["via"] == "system loader"


def test_env_override_wins(tmp_path):
    real = child_json(
        "import json, pycudnn; pycudnn.version(); print(json.dumps(pycudnn.library_info().path))"
    )
    link = tmp_path / "libcudnn.so.9"
    link.symlink_to(real)
    out = child_json(
        "import json, pycudnn; i = pycudnn.library_info(); "
        "print(json.dumps({'via': i.found_via, 'path': i.path}))",
        env={"PYCUDNN_LIBRARY": str(link)},
    )
    assert out == {"via": "PYCUDNN_LIBRARY", "path": real}


def test_env_override_to_fake_directory_is_a_clear_error(tmp_path):
    fake = tmp_path / "nowhere" / "libcudnn.so.9"
    r = run_child(
        "import pycudnn; pycudnn.version()",
        env={"PYCUDNN_LIBRARY": str(fake)},
    )
    assert r.returncode != 0
    assert "LibraryNotFoundError" in r.stderr
    assert "PYCUDNN_LIBRARY" in r.stderr and str(fake) in r.stderr


def test_nothing_found_lists_every_place_tried():
    r = run_child(
        """
        import cuda.pathfinder as pf
        from cuda.pathfinder import DynamicLibNotFoundError
        def nope(name):
            raise DynamicLibNotFoundError("no cudnn in site-packages, conda or CUDNN_PATH")
        pf.load_nvidia_dynamic_lib = nope
        from pycudnn import _loader
        _loader.SONAME = "libcudnn_pycudnn_test_absent.so.9"
        import pycudnn
        try:
            pycudnn.version()
        except ImportError as e:
            print(type(e).__name__)
            print(e)
        """,
        env={"PYCUDNN_LIBRARY": None},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("LibraryNotFoundError")
    for needle in (
        "PYCUDNN_LIBRARY: not set",
        "cuda.pathfinder",
        "system loader",
        'pip install "nvidia-cudnn-cu12==9.*"',
    ):
        assert needle in r.stdout, needle


def test_is_available_false_and_report_without_library():
    r = run_child(
        """
        import cuda.pathfinder as pf
        def nope(name):
            raise RuntimeError("absent")
        pf.load_nvidia_dynamic_lib = nope
        from pycudnn import _loader
        _loader.SONAME = "libcudnn_pycudnn_test_absent.so.9"
        import pycudnn
        from pycudnn.__main__ import main
        print("available", pycudnn.is_available())
        raise SystemExit(main([]))
        """,
        env={"PYCUDNN_LIBRARY": None},
    )
    assert "available False" in r.stdout
    assert "NOT FOUND" in r.stdout and r.returncode == 1


def test_concurrent_first_use_loads_once():
    out = child_json(
        """
        import json, threading, pycudnn
        from pycudnn import _loader
        seen = []
        def work():
            seen.append(id(_loader.load()))
        ts = [threading.Thread(target=work) for _ in range(16)]
        [t.start() for t in ts]; [t.join() for t in ts]
        files = _loader.libcudnn_files_in_process()
        print(json.dumps({"distinct": len(set(seen)), "files": files}))
        """
    )
    assert out["distinct"] == 1
    assert len([f for f in out["files"] if os.path.basename(f) == "libcudnn.so.9"]) == 1


@pytest.mark.parametrize("flag", ["", "--no-self-test"])
def test_python_m_pycudnn_report(flag):
    r = subprocess.run(
        [sys.executable, "-m", "pycudnn", *([flag] if flag else [])],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    for needle in (
        "pycudnn ",
        "library ",
        "found via",
        "runtime ",
        "headers ",
        "check       OK",
        "sub-libs    graph OK",
        "cudart ",
        "CUDA",
    ):
        assert needle in r.stdout, needle
    from conftest import gpu_unavailable_reason

    if gpu_unavailable_reason() is not None:
        assert "No GPU was found" in r.stdout


def test_nothing_found_leads_with_cudnn_not_its_cublas_dependency():
    # without any CUDA wheel, cuda.pathfinder fails on cuDNN's dependency libcublasLt first
    r = run_child(
        """
        import cuda.pathfinder as pf
        from cuda.pathfinder import DynamicLibNotFoundError
        def nope(name):
            raise DynamicLibNotFoundError(
                'Failure finding "libcublasLt.so.13 or libcublasLt.so.12": No such file'
            )
        pf.load_nvidia_dynamic_lib = nope
        from pycudnn import _loader
        _loader.SONAME = "libcudnn_pycudnn_test_absent.so.9"
        import pycudnn
        try:
            pycudnn.version()
        except ImportError as e:
            print(e)
        """,
        env={"PYCUDNN_LIBRARY": None},
    )
    assert r.returncode == 0, r.stderr
    first, rest = r.stdout.split("\n", 1)
    assert first.startswith("cuDNN (libcudnn_pycudnn_test_absent.so.9) was not found."), first
    assert 'pip install "nvidia-cudnn-cu12==9.*"' in first and "cublas" not in first.lower()
    assert "no cuDNN found (the search stopped at a library cuDNN needs: Failure finding" in rest
