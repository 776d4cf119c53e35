"""GPU tests of fused regions' launch programs (marker ``gpu``; skipped without a device, torch
or torchvision).

Run on the GPU machine:
``PYTHONPATH=. python3 -m pytest -m gpu -q tests/torch_adapter/test_torch_program_gpu.py``.

torchvision's resnet18 and resnet50 (random init) converted with ``fuse=True`` in bfloat16
channels-last with float32 batch norms: several training steps (the first records the
programs, the later ones replay them), each within twice torch's own distance to a float32
copy (output, input gradient, parameter gradients, running statistics); ``fuse.programs``
says that forward and backward programs ran; with programs turned off the same steps give the
same numbers to rounding; eval replays give the chains' own numbers, also after every
parameter changed in place (the weights are folded again).
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
nn = torch.nn

import test_torch_fuse_gpu as fg  # noqa: E402  (tests/torch_adapter)
from torch_gpu import model_named, own_kernels  # noqa: E402, F401  (tests/support; fixture)

import pycudnn.torch as pt  # noqa: E402
from pycudnn.torch import fuse, region  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("own_kernels")]
DEV = "cuda"
CL = torch.channels_last


def _models(name, bn_float=True, dtype=torch.bfloat16):
    torch.manual_seed(0)
    base = fg._stats(getattr(torchvision.models, name)(weights=None, num_classes=10))
    base = base.to(DEV, dtype).to(memory_format=CL)
    if bn_float:  # batch norm in float32, as apex O2's keep_batchnorm_fp32
        for m in base.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.float()
    return base, pt.convert(copy.deepcopy(base), fuse=True)


def _zero(*models):
    for m in models:
        for p in m.parameters():
            p.grad = None


@pytest.mark.parametrize("name", ["resnet18", "resnet50", "resnet18-plain-own"])
def test_training_steps_replay_programs_within_noise(name, monkeypatch):
    """(``-plain-own``: :func:`torch_gpu.model_named`.)"""
    name = model_named(name, monkeypatch)
    base, mine = _models(name)
    x = torch.randn(8, 3, 64, 64, device=DEV, dtype=torch.bfloat16).to(memory_format=CL)
    for _ in range(3):  # the first step records, the later ones replay
        _zero(base, mine)
        fg._within_noise(base, mine, x, 1e-2)
    progs = [what for _, _, what in fuse.programs(mine)]
    assert progs and any("backward program" in w for w in progs), progs


@pytest.mark.parametrize("case", ["bf16-whole", "autocast"])
def test_casting_programs_within_noise(case):
    """The model moved to bfloat16 whole (batch norm cast to float32 once per step), and
    float32 weights under autocast (the convolution weights cast once per step)."""
    if case == "autocast":
        base, mine = _models("resnet18", bn_float=False, dtype=torch.float32)
        ref32 = copy.deepcopy(base)
        x = torch.randn(8, 3, 64, 64, device=DEV).to(memory_format=CL)
        dy = None
        for _ in range(3):
            _zero(base, mine, ref32)
            got = {}
            for k, m in (("base", base), ("mine", mine), ("f32", ref32)):
                if dy is None:
                    with torch.no_grad():
                        dy = torch.randn(m(x).shape, device=DEV)
                got[k] = fg._step(m, x, dy, None if k == "f32" else torch.bfloat16)
            for i in range(4):
                err_base = fg._rel(got["base"][i], got["f32"][i])
                assert fg._rel(got["mine"][i], got["f32"][i]) <= 2 * err_base + 1e-2, i
    else:
        base, mine = _models("resnet18", bn_float=False)
        x = torch.randn(8, 3, 64, 64, device=DEV, dtype=torch.bfloat16).to(memory_format=CL)
        for _ in range(3):
            _zero(base, mine)
            fg._within_noise(base, mine, x, 1e-2)
    progs = [what for _, _, what in fuse.programs(mine)]
    assert progs and all("backward program" in w for w in progs), progs


def test_programs_give_the_chains_numbers():
    """Programs on and off: the same kernels but for the accumulated gradients (added by the
    data-gradient convolution instead of by autograd), so the same step to rounding (relative
    L2 distance; a few ReLU masks flip on elements within rounding of zero)."""
    base, mine = _models("resnet18")
    twin = pt.convert(copy.deepcopy(base), fuse=True)
    x = torch.randn(4, 3, 64, 64, device=DEV, dtype=torch.bfloat16).to(memory_format=CL)
    dy = None
    outs = []
    for enabled, model in ((True, mine), (False, twin)):
        region.use_programs(enabled)
        try:
            for _ in range(3):
                _zero(model)
                y = model(x.clone().requires_grad_())
                dy = torch.randn_like(y) if dy is None else dy
                y.backward(dy)
        finally:
            region.use_programs(True)
        grads = torch.cat([p.grad.flatten().float() for p in model.parameters()])
        stats = torch.cat([b.flatten().float() for b in model.buffers()])
        outs.append((y.detach().float(), grads, stats))
    for a, b in zip(*outs, strict=True):
        assert fg._rel(a, b) < 1e-2


def _chains(model, x):
    region.use_programs(False)
    try:
        return model(x)
    finally:
        region.use_programs(True)


def test_eval_replays_and_follows_an_optimizer_step():
    _, mine = _models("resnet50")
    mine.eval()
    x = torch.randn(8, 3, 64, 64, device=DEV, dtype=torch.bfloat16).to(memory_format=CL)
    with torch.no_grad():  # (the fused eval against torch: test_torch_fuse_gpu.py)
        mine(x)  # records
        for _ in range(3):  # replays: the very kernels of the chains
            torch.testing.assert_close(mine(x), _chains(mine, x), rtol=0, atol=0)
        for p in mine.parameters():  # an in-place change of every parameter: folded again
            p.mul_(0.9)
        torch.testing.assert_close(mine(x), _chains(mine, x), rtol=0, atol=0)
    progs = [what for _, _, what in fuse.programs(mine)]
    # the stem (convolution, batch norm, ReLU, max pooling): two launches, no program
    stem = [w for w in progs if w.startswith("eval: the convolution without an epilogue")]
    assert len(stem) == 1, progs
    assert all(w.startswith("forward program") for w in progs if w not in stem), progs


def test_no_grad_training_updates_statistics_like_torch():
    base, mine = _models("resnet18")
    x = torch.randn(8, 3, 64, 64, device=DEV, dtype=torch.bfloat16).to(memory_format=CL)
    with torch.no_grad():
        for _ in range(3):
            y, want = mine(x), base(x)
    rtol, atol = fg.TOL[torch.bfloat16]
    torch.testing.assert_close(y, want, rtol=rtol, atol=atol)
    for a, b in zip(mine.buffers(), base.buffers(), strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)
