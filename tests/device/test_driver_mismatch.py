"""``python -m pycudnn`` on a driver too old for the installed cuda-bindings names the extra to
install (tier B for the report, which loads libcudnn; the CUDA side is faked: no GPU needed).

The case the extras exist for: ``cuda.bindings.runtime`` 13.x links the CUDA 13 runtime
statically, so on a CUDA 12 driver (R525-R575) ``cudaGetDeviceCount`` answers
``cudaErrorInsufficientDriver`` although a driver is there and reports its version.
"""

from __future__ import annotations

import pytest

import pycudnn
from pycudnn import _cuda, _info
from pycudnn.__main__ import main

INSUFFICIENT = "cudaGetDeviceCount: cudaErrorInsufficientDriver"


@pytest.fixture
def fake_cuda(monkeypatch):
    """Set what the CUDA probes answer: ``fake_cuda(driver, runtime, gpus=(), note='')``."""

    def set_(driver: int, runtime: int, gpus=(), note: str = "") -> None:
        monkeypatch.setattr(_cuda, "driver_versions", lambda: (driver, runtime))
        monkeypatch.setattr(_cuda, "devices", lambda: (list(gpus), note))

    return set_


def test_cuda12_driver_with_cuda13_bindings_names_the_cu12_extra(fake_cuda):
    fake_cuda(12040, 13000, note=INSUFFICIENT)
    msg = _info.driver_mismatch(INSUFFICIENT)
    assert msg is not None
    assert "CUDA 12.4" in msg and "CUDA 13.0" in msg
    assert 'pip install "cuda-bindings==12.*" "nvidia-cudnn-cu12==9.*"' in msg
    assert "R580" in msg  # what the installed bindings would need instead


def test_report_shows_the_mismatch_and_is_unhealthy(fake_cuda, capsys):
    fake_cuda(12080, 13000, note=INSUFFICIENT)
    text, healthy = _info.report(self_test=False)
    assert not healthy
    cuda = text[text.index("\nCUDA\n") :]
    assert "driver supports CUDA 12.8; cuda.bindings runtime 13.0" in cuda
    assert "DRIVER" in cuda
    # never split across lines: it is to be copied
    assert 'pip install "cuda-bindings==12.*" "nvidia-cudnn-cu12==9.*"' in cuda
    assert "No GPU was found" not in cuda  # the driver is there; the bindings are wrong for it

    assert main(["--no-self-test"]) == 1
    assert 'pip install "cuda-bindings==12.*" "nvidia-cudnn-cu12==9.*"' in capsys.readouterr().out


def test_show_config_prints_it_too(fake_cuda, capsys):
    fake_cuda(12020, 13010, note=INSUFFICIENT)
    assert pycudnn.show_config() is False
    assert 'pip install "cuda-bindings==12.*" "nvidia-cudnn-cu12==9.*"' in capsys.readouterr().out


@pytest.mark.parametrize(
    ("driver", "runtime", "note"),
    [
        (0, 13000, INSUFFICIENT),  # no driver at all (CI): "no GPU", not a mismatch
        (0, 0, "cuda.bindings is not importable"),
        (13000, 12090, "cudaGetDeviceCount: cudaErrorNoDevice"),  # newer driver: fine
        (13020, 13000, "cudaGetDeviceCount: cudaErrorNoDevice"),
        (12080, 12090, ""),  # minor-version compatibility within CUDA 12
    ],
)
def test_no_mismatch(fake_cuda, driver, runtime, note):
    fake_cuda(driver, runtime, note=note)
    assert _info.driver_mismatch(note) is None
    text, _healthy = _info.report(self_test=False)
    assert "DRIVER" not in text
    assert "pycudnn[cu12]" not in text


def test_no_gpu_without_a_driver_is_not_a_failure(fake_cuda):
    fake_cuda(0, 13000, note=INSUFFICIENT)
    text, healthy = _info.report(self_test=False)
    assert "No GPU was found" in text
    # the cuDNN checks alone decide: the same verdict as on a machine with a usable GPU
    fake_cuda(13000, 13000, gpus=[_cuda.GPU(0, "Fake GPU", (9, 0), 80 * 2**30)])
    assert healthy == _info.report(self_test=False)[1]


def test_driver_older_than_cuda12_asks_for_a_driver_update(fake_cuda):
    fake_cuda(11080, 12090, note=INSUFFICIENT)
    msg = _info.driver_mismatch(INSUFFICIENT)
    assert msg is not None
    assert "update the NVIDIA driver" in msg and "R525" in msg
    assert "pycudnn[cu" not in msg  # no extra runs on it


def test_same_major_but_insufficient_asks_for_a_driver_update(fake_cuda):
    fake_cuda(12020, 12090, note=INSUFFICIENT)
    msg = _info.driver_mismatch(INSUFFICIENT)
    assert msg is not None
    assert "supports CUDA 12.9" in msg
    assert "pycudnn[cu" not in msg


def test_gpus_found_means_no_mismatch(fake_cuda):
    gpu = _cuda.GPU(0, "Fake GPU", (9, 0), 80 * 2**30)
    fake_cuda(12040, 13000, gpus=[gpu])  # whatever the versions say, the GPU is usable
    text, _ = _info.report(self_test=False)
    assert "DRIVER" not in text
    assert "GPU 0       Fake GPU, sm_90" in text


@pytest.mark.parametrize(
    ("name", "driver", "runtime", "expected"),
    [
        ("cudaErrorInsufficientDriver", 0, 13050, "no NVIDIA driver was found"),
        ("cudaErrorInsufficientDriver", 12040, 13000, "driver supports CUDA 12.4, older than the"),
        ("cudaErrorNoDevice", 13000, 13000, "the NVIDIA driver found no GPU"),
    ],
)
def test_no_gpu_reason_tells_no_driver_from_an_old_one(
    monkeypatch, name, driver, runtime, expected
):
    # the runtime's own text ("driver version is insufficient") says the same for both
    monkeypatch.setattr(_cuda, "driver_versions", lambda: (driver, runtime))
    reason = _cuda._no_device_reason(name, "CUDA driver version is insufficient for CUDA runtime")
    assert expected in reason and name in reason
    assert "insufficient" not in reason
