"""CPU tests of :mod:`pycudnn.torch.bn_kernel`'s host side (needs torch, no GPU): which data the
kernels take, from tensors and from shapes alone, and what ``train_forward`` tells torch about
the running statistics it updates in place. The kernels' numerics are the GPU file's
(``test_torch_bn_kernel_gpu.py``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pycudnn.torch import bn_kernel  # noqa: E402


def test_fits_and_mask_bytes_from_shapes_alone():
    assert bn_kernel.fits((2, 16, 4, 6), torch.float16)
    assert bn_kernel.fits((2, 2048, 1, 1), torch.bfloat16)
    assert not bn_kernel.fits((2, 12, 4, 6), torch.float16)  # channels not a multiple of 8
    assert not bn_kernel.fits((2, 4096, 1, 1), torch.float16)  # more than a block covers
    assert not bn_kernel.fits((2, 16, 4, 6), torch.float32)
    assert not bn_kernel.fits((2, 16, 4), torch.float16)
    assert not bn_kernel.fits((0, 16, 4, 6), torch.float16)
    assert not bn_kernel.fits((2**16, 2048, 4, 4), torch.float16)  # 2**31 elements
    assert bn_kernel.mask_bytes((2, 16, 4, 6)) == 2 * 16 * 4 * 6 // 8
    x = torch.empty(2, 16, 4, 6, dtype=torch.float16).to(memory_format=torch.channels_last)
    assert not bn_kernel.takes(x)  # not on a CUDA device


def test_train_forward_bumps_the_running_statistics_versions(monkeypatch):
    """The finalize kernel moves the running mean and variance in place: as an in-place op,
    ``train_forward`` bumps their version counters, which the eval folds' caches key on (a
    stale fold after training otherwise)."""
    launched = []
    monkeypatch.setattr(bn_kernel, "_run", lambda x, name, *a, **k: launched.append(name))
    monkeypatch.setattr(bn_kernel, "device_info", lambda index: (90, 132))
    monkeypatch.setattr(bn_kernel, "stream_of", lambda t: 0)
    x = torch.zeros(2, 16, 4, 6, dtype=torch.float16).to(memory_format=torch.channels_last)
    gamma, beta = torch.ones(16), torch.zeros(16)
    rm, rv = torch.zeros(16), torch.ones(16)
    before = (rm._version, rv._version)
    out, mean, _invstd, mask = bn_kernel.train_forward(
        x, gamma, beta, None, (rm, rv), 1e-5, 0.1, True
    )
    assert launched == ["bn_stats_f16", "bn_finalize_f16", "bn_apply_f16"]
    assert rm._version > before[0] and rv._version > before[1]
    assert out.shape == x.shape and out.stride() == x.stride() and mean.shape == (16,)
    assert mask is not None and mask.numel() == bn_kernel.mask_bytes(tuple(x.shape))
    # without running statistics, nothing to bump (and no mask without the ReLU)
    assert bn_kernel.train_forward(x, gamma, beta, None, None, 1e-5, 0.1, False)[3] is None
