"""GPU test of a fused model's training over a few hundred steps (marker ``gpu``; skipped without
a device, torch or torchvision): torchvision's ResNet-18 (random init, bfloat16 channels-last,
batch norm in float32) converted with ``fuse=True`` trains on a small synthetic task from the
same initial weights as torch's model, and its loss curve stays within torch's own
seed-to-seed spread (torch's model trained from three initializations). Both batch-norm paths
of the residual chains are taken: pycudnn's own kernels (the size threshold lowered to 0 for
these 32x32 images) and cuDNN's fused kernel. A ``FUSECURVE`` line prints the curves' ends.

Run on the GPU machine:
``PYTHONPATH=. python3 -m pytest -m gpu -q -s tests/torch_adapter/test_torch_fuse_curve_gpu.py``.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
nn = torch.nn
F = nn.functional

import pycudnn.torch as pt  # noqa: E402
from pycudnn.torch import fused_train  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = "cuda"
CL = torch.channels_last
STEPS = 200
BATCH = 32
CLASSES = 10


@pytest.fixture(autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


def _task(seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """:data:`STEPS` batches of 32x32 images: a class's fixed random pattern plus noise, so
    the task is learnable and the curve falls."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    patterns = torch.randn(CLASSES, 3, 32, 32, device=DEV, generator=g)
    out = []
    for _ in range(STEPS):
        y = torch.randint(0, CLASSES, (BATCH,), device=DEV, generator=g)
        x = patterns[y] + 1.5 * torch.randn(BATCH, 3, 32, 32, device=DEV, generator=g)
        out.append((x.to(torch.bfloat16).contiguous(memory_format=CL), y))
    return out


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    m = torchvision.models.resnet18(weights=None, num_classes=CLASSES).to(DEV, memory_format=CL)
    for mod in m.modules():  # bfloat16, batch norm in float32 (mixed precision's usual choice)
        if not isinstance(mod, nn.BatchNorm2d):
            for p in mod.parameters(recurse=False):
                p.data = p.data.to(torch.bfloat16)
    return m.train()


def _curve(model: nn.Module, batches) -> torch.Tensor:
    """The loss per step of SGD with momentum over *batches*, smoothed over 10 steps."""
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    losses = []
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    raw = torch.stack(losses).float().cpu()
    return F.avg_pool1d(raw[None, None], 10, 1)[0, 0]


@pytest.mark.parametrize("own", [True, False], ids=["own_kernels", "cudnn_kernel"])
def test_fused_resnet18_tracks_torchs_loss_curve(own, monkeypatch):
    if own:
        monkeypatch.setattr(fused_train, "OWN_MIN_ELEMENTS", 0)
    batches = _task()
    curves = [_curve(_model(seed), batches) for seed in (0, 1, 2)]
    mine = pt.convert(copy.deepcopy(_model(0)), fuse=True)
    kernels = []
    real = fused_train.train_forward
    monkeypatch.setattr(
        fused_train, "train_forward", lambda *a, **k: kernels.append(1) or real(*a, **k)
    )
    ours = _curve(mine, batches)
    twin = curves[0]
    spread = (torch.stack(curves).amax(0) - torch.stack(curves).amin(0)).clamp_min(0.05)
    gap = (ours - twin).abs()
    print(
        f"FUSECURVE {'own' if own else 'cudnn'}: first loss {twin[0]:.4f} torch / {ours[0]:.4f} "
        f"pycudnn, after {STEPS} steps {twin[-1]:.4f} / {ours[-1]:.4f}; max |gap| "
        f"{gap.max():.4f}, torch's seed spread at the end {spread[-1]:.4f}"
    )
    assert bool(kernels) == own  # the residual chains ran the path asked for
    assert torch.isfinite(ours).all()
    assert ours[-1] < 0.5 * ours[0]  # it learns
    assert gap[0] < 0.05  # same weights, same first batches
    assert bool((gap <= 2 * spread).all()), (gap.max(), spread.min())
