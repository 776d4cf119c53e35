"""GPU test of a fused model's training over a few hundred steps (marker ``gpu``; skipped without
a device, torch or torchvision): torchvision's ResNet-18 (random init, bfloat16 channels-last,
batch norm in float32) converted with ``fuse=True`` trains on a small synthetic task from the
same initial weights as torch's model seeded 0, and its loss curve lands within torch's own
seed-to-seed spread (torch's model trained from :data:`SEEDS` initializations on the same
batches). Both batch-norm paths of the residual chains are taken: pycudnn's own kernels (the
size threshold lowered to 0 for these 32x32 images) and cuDNN's fused kernel; and every chain,
the plain ones too, on pycudnn's kernels. The max pooling runs pycudnn's kernels throughout.

A few hundred steps of SGD in bfloat16 are chaotic: two runs whose first steps agree to a few
units in the last place part ways step by step (as torch's own runs from different seeds do),
so the curves are compared as levels, not point by point: the mean loss over the whole run and
over its last :data:`TAIL` steps must lie within the range torch's seeds span, widened by that
range on each side. A ``FUSECURVE`` line prints the levels and the curves every 20 steps.

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
TAIL = 50
SEEDS = (0, 1, 2, 3)
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
    """The loss per step of SGD with momentum over *batches*."""
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    losses = []
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses).float().cpu()


def _levels(curve: torch.Tensor) -> tuple[float, float]:
    """The mean loss over the whole run and over its last :data:`TAIL` steps."""
    return float(curve.mean()), float(curve[-TAIL:].mean())


def _within(value: float, spread: list[float]) -> bool:
    """Whether *value* lies in *spread*'s range widened by that range on each side."""
    lo, hi = min(spread), max(spread)
    return lo - (hi - lo) <= value <= hi + (hi - lo)


@pytest.fixture(scope="module")
def torch_curves() -> list[torch.Tensor]:
    batches = _task()
    return [_curve(_model(seed), batches) for seed in SEEDS]


def _every20(curve: torch.Tensor) -> str:
    smooth = F.avg_pool1d(curve[None, None], 10, 1)[0, 0]
    return " ".join(f"{v:.3f}" for v in smooth[::20])


@pytest.mark.parametrize(
    ("own", "plain"),
    [(True, False), (False, False), (True, True)],
    ids=["own_kernels", "cudnn_kernel", "every_chain_own"],
)
def test_fused_resnet18_tracks_torchs_loss_curve(own, plain, torch_curves, monkeypatch):
    """(*plain*: the plain chains on pycudnn's kernels too, whose region outputs the backward
    does not keep; the max pooling runs pycudnn's kernels in every case.)"""
    if own:
        monkeypatch.setattr(fused_train, "OWN_MIN_ELEMENTS", 0)
    if plain:
        monkeypatch.setattr(fused_train, "OWN_PLAIN_MIN_ELEMENTS", 0)
    mine = pt.convert(copy.deepcopy(_model(0)), fuse=True)
    kernels = []
    real = fused_train.train_forward
    monkeypatch.setattr(
        fused_train, "train_forward", lambda *a, **k: kernels.append(1) or real(*a, **k)
    )
    ours = _curve(mine, _task())
    means, tails = zip(*(_levels(c) for c in torch_curves), strict=True)
    mean, tail = _levels(ours)
    which = "every chain own" if plain else "own" if own else "cudnn"
    print(
        f"FUSECURVE {which}: mean loss {mean:.4f} pycudnn, torch's seeds "
        f"{' '.join(f'{m:.4f}' for m in means)}; last {TAIL} steps {tail:.4f} pycudnn, torch's "
        f"{' '.join(f'{t:.4f}' for t in tails)}\n  pycudnn every 20 steps: {_every20(ours)}\n"
        + "".join(
            f"  torch seed {s}: {_every20(c)}\n" for s, c in zip(SEEDS, torch_curves, strict=True)
        )
    )
    assert bool(kernels) == own  # the residual chains ran the path asked for
    assert torch.isfinite(ours).all()
    assert tail < 0.5 * float(ours[:10].mean())  # it learns
    # same weights and batches: the first steps agree before the runs part ways
    assert abs(float(ours[:5].mean()) - float(torch_curves[0][:5].mean())) < 0.05
    assert _within(mean, list(means)), (mean, means)
    assert _within(tail, list(tails)), (tail, tails)
