"""``python -m pycudnn`` with several GPUs, on the CPU (issue 18): every visible GPU is listed, the
self-test runs on each supported one or only on ``--device N``, and the option is parsed
strictly. The CUDA side is faked (``_cuda.devices``; the self-test records the device it was
asked to run on); the report loads libcudnn (tier B).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pycudnn import _cuda, _info
from pycudnn.__main__ import main

ROOT = Path(__file__).resolve().parents[2]
H100 = _cuda.GPU(0, "NVIDIA H100 80GB HBM3", (9, 0), 80 * 2**30)
H200 = _cuda.GPU(1, "NVIDIA H200", (9, 0), 141 * 2**30)
FUTURE = _cuda.GPU(2, "Some future GPU", (19, 0), 256 * 2**30)


@pytest.fixture
def gpus(monkeypatch):
    """``gpus(*GPU)`` fakes the visible GPUs; returns the list of devices the self-test ran on."""
    ran: list[int] = []

    def fake_self_test(device=0):
        ran.append(device)
        return [("conv", "PASS", f"on {device}"), ("pool", "PASS", "ok")]

    def set_(*found):
        monkeypatch.setattr(_cuda, "devices", lambda: (list(found), ""))
        monkeypatch.setattr(_info, "_self_test", fake_self_test)
        return ran

    return set_


def test_every_gpu_is_listed_with_capability_memory_and_support(gpus):
    gpus(H100, H200, FUTURE)
    text, _healthy = _info.report(self_test=False)
    assert "GPU 0       NVIDIA H100 80GB HBM3, sm_90, 80 GiB: supported" in text
    assert "GPU 1       NVIDIA H200, sm_90, 141 GiB: supported" in text
    assert "GPU 2       Some future GPU, sm_190, 256 GiB: NEWER than this cuDNN supports" in text
    assert "3 GPUs visible" in text
    assert "Self-test" not in text


def test_the_self_test_runs_on_every_supported_gpu(gpus):
    ran = gpus(H100, H200, FUTURE)
    text, _healthy = _info.report()
    assert ran == [0, 1]
    assert "Self-test (GPU 0, against float64 NumPy references)" in text
    assert "Self-test (GPU 1, against float64 NumPy references)" in text
    assert "Self-test (GPU 2): skipped, this cuDNN does not support it" in text
    assert "PASS  conv       on 1" in text
    assert text.index("(GPU 0,") < text.index("on 0") < text.index("(GPU 1,") < text.index("on 1")


def test_device_option_runs_the_self_test_on_that_gpu_only(gpus, capsys):
    ran = gpus(H100, H200)
    assert main(["--device", "1"]) == 0
    out = capsys.readouterr().out
    assert ran == [1]
    assert "Self-test (GPU 1," in out and "Self-test (GPU 0," not in out
    assert "GPU 0       NVIDIA H100" in out  # still listed


def test_device_option_naming_a_gpu_that_is_not_visible_is_unhealthy(gpus, capsys):
    ran = gpus(H100, H200)
    assert main(["--device", "2"]) == 1
    out = capsys.readouterr().out
    assert "--device 2: no such GPU (visible: 0, 1)" in out
    assert ran == []


def test_device_option_without_any_gpu_is_unhealthy(gpus, capsys, monkeypatch):
    monkeypatch.setattr(_cuda, "driver_versions", lambda: (0, 13000))
    monkeypatch.setattr(_cuda, "devices", lambda: ([], "cudaGetDeviceCount: cudaErrorNoDevice"))
    assert main(["--device", "0"]) == 1
    out = capsys.readouterr().out
    assert "No GPU was found" in out and "--device 0: no such GPU (none visible)" in out


def test_a_failing_case_on_one_gpu_makes_the_report_unhealthy(gpus, monkeypatch):
    gpus(H100, H200)
    monkeypatch.setattr(
        _info,
        "_self_test",
        lambda device=0: [("conv", "FAIL" if device == 1 else "PASS", f"on {device}")],
    )
    text, healthy = _info.report()
    assert not healthy
    assert "FAIL  conv       on 1" in text


@pytest.mark.parametrize("bad", ["-1", "one", "1.5", ""])
def test_device_option_must_be_an_ordinal(bad, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--device", bad])
    assert exc.value.code == 2
    assert "expected a GPU ordinal" in capsys.readouterr().err


def test_help_mentions_the_option():
    r = subprocess.run(
        [sys.executable, "-m", "pycudnn", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
        check=False,
    )
    assert r.returncode == 0
    assert "--device N" in r.stdout and "run the self-test on GPU N only" in r.stdout
    assert "``" not in r.stdout  # plain text, not the module docstring's RST
    assert "--version" in r.stdout and "--json" in r.stdout and "Exit status" in r.stdout


def test_version_option(capsys):
    from pycudnn import __version__, lib

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert f"pycudnn {__version__}" in out and "pycudnn9" in out
    assert lib.HEADER_VERSION_STRING in out


def test_json_option_prints_the_facts(capsys):
    import json

    code = main(["--json", "--no-self-test"])
    data = json.loads(capsys.readouterr().out)
    assert code == (0 if data["healthy"] else 1)
    assert data["pycudnn"] and data["header_version"] == int(
        __import__("pycudnn").lib.HEADER_VERSION
    )
    assert data["cudnn"]["runtime_version"] // 10000 == 9 and data["cudnn"]["path"]
    assert data["cudnn"]["compatibility_kind"] in ("same", "older", "newer")
    assert set(data["cuda"]) >= {"driver_version", "gpus", "no_gpu_reason", "driver_mismatch"}
    assert (data["cuda"]["no_gpu_reason"] is None) == bool(data["cuda"]["gpus"])
    assert data["self_test"] == []
    nv = data["cuda"]["nvrtc_version"]  # (None where cuda.bindings loads no libnvrtc)
    assert nv is None or nv.split(".")[0].isdigit()


def test_the_report_names_nvrtc_or_says_why_it_is_missing(monkeypatch):
    """pycudnn's own kernels compile with NVRTC: the report gives its version, or, where it does
    not load, says so and what falls back, without failing the report."""
    version, line = _info.nvrtc_line()
    if version is not None:
        assert line.startswith(version) and "own kernels" in line

    def missing():
        raise OSError("libnvrtc.so.12: cannot open shared object file")

    monkeypatch.setattr(_info._nvrtc, "nvrtc_version", missing)
    version, line = _info.nvrtc_line()
    assert version is None
    assert "not loadable (OSError: libnvrtc.so.12" in line and "fall back" in line
    text, _ = _info.report(self_test=False)
    assert "  NVRTC       not loadable (OSError" in text


class _FakeTorchDist:
    version = "2.9.1"
    requires = (
        "filelock",
        'nvidia-cudnn-cu12==9.10.2.21; platform_system == "Linux" and platform_machine == "x86_64"',
        'opt-einsum>=3.3; extra == "opt-einsum"',
    )


@pytest.fixture
def fake_torch_installed(monkeypatch):
    from importlib import metadata

    real = metadata.distribution

    def distribution(name):
        return _FakeTorchDist() if name == "torch" else real(name)

    monkeypatch.setattr(metadata, "distribution", distribution)


def test_report_names_the_cudnn_torch_would_load(fake_torch_installed, monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # another test may have imported it
    info = _info.torch_cudnn()
    assert info is not None and info["cudnn_pin"] == "nvidia-cudnn-cu12==9.10.2.21"
    assert info["version"] == "2.9.1" and info["loaded_by_torch"] is False
    text, _ = _info.report(self_test=False)
    line = text[text.index("  torch ") :]
    assert "torch 2.9.1 pins nvidia-cudnn-cu12==9.10.2.21" in " ".join(text.split())
    assert "older than the 9.28.0 headers" in " ".join(text.split()), line


def test_report_says_when_torch_loaded_the_cudnn_in_use(fake_torch_installed, monkeypatch):
    from pycudnn import _loader

    lib = _loader.load()
    fake = _loader.LoadedLibrary(lib.path, "cuda.pathfinder (already loaded in process)", lib.cdll)
    monkeypatch.setattr(_loader, "loaded", lambda: fake)
    monkeypatch.setitem(sys.modules, "torch", object())
    assert _info.torch_cudnn(lib.path)["loaded_by_torch"] is True
    text, _ = _info.report(self_test=False)
    assert "this process's torch 2.9.1 loaded this cuDNN" in " ".join(text.split())


def test_no_torch_no_torch_line(monkeypatch):
    from importlib import metadata

    def distribution(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", distribution)
    assert _info.torch_cudnn() is None
    text, _ = _info.report(self_test=False)
    assert "\n  torch " not in text


def test_without_a_gpu_the_device_option_prints_no_traceback():
    r = subprocess.run(
        [sys.executable, "-m", "pycudnn", "--device", "1"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""},
        timeout=120,
        check=False,
    )
    assert "Traceback" not in r.stdout + r.stderr
    assert "--device 1: no such GPU" in r.stdout
    assert r.returncode == 1
