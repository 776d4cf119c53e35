"""pycudnn's own kernels (``pycudnn.torch.fold_kernel``, ``pycudnn.torch.bn_kernel``,
``pycudnn._nvrtc``) without a GPU: NVRTC compiles them (no GPU needed) for every architecture
pycudnn runs on, a newer one than NVRTC knows gets PTX, a compilation error names NVRTC's call
and its log, the fold kernel's parameter table fits the 4 KiB every driver takes, and which
tensors each kernel takes and which it leaves to others. Their numbers (the fold kernel bit for
bit torch's multiply, also inside a CUDA graph capture; batch norm against float64) are the GPU
tier's (``test_torch_fold_kernel_gpu.py``, ``test_torch_bn_kernel_gpu.py``)."""

from __future__ import annotations

import ctypes

import pytest

torch = pytest.importorskip("torch")

from pycudnn import _nvrtc  # noqa: E402
from pycudnn.errors import CudaError  # noqa: E402
from pycudnn.torch import bn_kernel, fold_kernel  # noqa: E402


def _nvrtc_or_skip() -> None:
    try:
        _nvrtc.nvrtc_version()
    except Exception as exc:  # no cuda-python or no libnvrtc here
        pytest.skip(f"NVRTC unavailable: {exc}")


@pytest.mark.parametrize("arch", [75, 80, 86, 89, 90])  # (NVRTC 13 dropped sm_70)
def test_the_kernels_compile_to_a_cubin_for_each_architecture(arch):
    _nvrtc_or_skip()
    image, cubin = fold_kernel.SOURCE.compile(arch)
    assert cubin and image[:4] == b"\x7fELF"  # a cubin is an ELF image
    assert fold_kernel.SOURCE.compile(arch)[0] is image  # compiled once


def test_an_architecture_newer_than_nvrtc_gets_ptx():
    _nvrtc_or_skip()
    image, cubin = fold_kernel.SOURCE.compile(990)
    assert not cubin
    text = image.rstrip(b"\x00").decode()
    assert ".target sm_" in text
    for a in ("f16", "bf16", "f32"):
        assert f".entry fold_vectors_{a}(" in text
        for b in ("f16", "bf16", "f32"):
            assert f".entry fold_{a}_{b}(" in text
    # each step rounded as torch's operations round it: nothing contracted into an fma
    assert "fma" not in text.split(".entry fold_vectors_f16(")[1]


def test_an_architecture_older_than_nvrtc_knows_is_a_clear_error():
    _nvrtc_or_skip()
    with pytest.raises(
        CudaError, match=r"nvrtcGetSupportedArchs.*knows no architecture up to sm_30"
    ):
        _nvrtc.Source("old.cu", 'extern "C" __global__ void k() {}').compile(30)


def test_a_compilation_error_names_nvrtc_and_its_log():
    _nvrtc_or_skip()
    bad = _nvrtc.Source("broken.cu", 'extern "C" __global__ void k() { undeclared_name(); }')
    with pytest.raises(CudaError, match=r"nvrtcCompileProgram.*broken\.cu.*undeclared_name"):
        bad.compile(90)


def test_the_tables_fit_a_kernels_parameter_block():
    assert ctypes.sizeof(fold_kernel._Job) == 32
    assert ctypes.sizeof(fold_kernel._Jobs) == 32 * fold_kernel.MAX_JOBS
    assert ctypes.sizeof(fold_kernel._Jobs) + 8 <= 4096  # (and the scale's address)
    assert ctypes.sizeof(fold_kernel._Vec) == 56  # the CUDA struct's size, 8-byte aligned
    assert ctypes.sizeof(fold_kernel._Vecs) + 8 + 8 + 4 <= 4096  # (scale, bias, flags)


def test_which_weights_the_kernel_takes():
    cpu = torch.device("cpu")
    cl = torch.channels_last
    w = torch.randn(8, 4, 3, 3, dtype=torch.bfloat16)
    takes = fold_kernel._takes
    assert takes(w, torch.empty_like(w), cpu)
    assert takes(w.to(memory_format=cl), torch.empty_like(w).to(memory_format=cl), cpu)
    assert takes(w.float(), torch.empty_like(w, dtype=torch.float16), cpu)  # (autocast's)
    assert not takes(w, torch.empty_like(w).to(memory_format=cl), cpu)  # other memory order
    assert not takes(w.double(), torch.empty_like(w, dtype=torch.float64), cpu)
    assert not takes(w[:, :, ::2], torch.empty(8, 4, 2, 3, dtype=torch.bfloat16), cpu)
    assert not takes(w, torch.empty_like(w), torch.device("meta"))  # another device
    assert not takes(w[:0], torch.empty_like(w[:0]), cpu)  # nothing to do


def test_cpu_tensors_and_the_switch_leave_every_weight_to_torch(monkeypatch):
    ws = [torch.randn(4, 2, 1, 1), torch.randn(3, 2, 3, 3)]
    scale = torch.rand(7)
    outs = [torch.empty_like(w) for w in ws]
    assert fold_kernel.fold_weights(ws, scale, outs, 0) == [0, 1]
    monkeypatch.setattr(fold_kernel, "ENABLED", False)
    assert fold_kernel.fold_weights(ws, scale, outs, 0) == [0, 1]


def test_the_vectors_kernel_leaves_cpu_tensors_to_torch():
    params = [torch.randn(4, 2, 1, 1), None, torch.rand(4), torch.rand(4), torch.rand(4),
              torch.rand(4)]  # fmt: skip
    bias = torch.empty(4)
    assert fold_kernel.fold_vectors(params, [1e-5], [4], bias, 0, 6) is None


# -- the batch-norm kernels (their numbers: test_torch_bn_kernel_gpu.py) -----------------------
@pytest.mark.parametrize("arch", [75, 80, 86, 89, 90])
def test_the_batch_norm_kernels_compile_to_a_cubin_for_each_architecture(arch):
    _nvrtc_or_skip()
    image, cubin = bn_kernel.SOURCE.compile(arch)
    assert cubin and image[:4] == b"\x7fELF"


def test_the_batch_norm_kernels_take_only_channels_last_half_cuda_data():
    x = torch.empty(2, 64, 4, 4, dtype=torch.float16).to(memory_format=torch.channels_last)
    assert not bn_kernel.takes(x)  # (a host tensor)
    assert not bn_kernel.takes(torch.empty(2, 64, 4, 4, dtype=torch.float32))
    assert not bn_kernel.takes(torch.empty(2, 64, 4, dtype=torch.float16))
