"""GPU tests of the adapter's speed path and autocast (issue 25; marker ``gpu``): the lean path
binds and re-launches the same entries (results equal to torch's on the hit as on the miss),
channels-last batch norm on cuDNN's NHWC kernels against torch, every converted module under
``torch.autocast`` against torch's autocast, and torchvision's models converted against the
unconverted ones.

Run on the GPU machine: ``PYTHONPATH=. python3 -m pytest -m gpu -q
tests/torch_adapter/test_torch_models_gpu.py``.

Half-precision models are compared through a float32 copy: a random network's bf16 forward and
backward amplify rounding (a ResNet's step is chaotic at bf16), so each side's distance to the
float32 result is measured and the converted one may be at most a little farther than torch's.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import torch_gpu  # noqa: E402  (tests/support)

import pycudnn  # noqa: E402  (torch first: both then use the same libcudnn)
import pycudnn.torch as pt  # noqa: E402
from pycudnn.torch import _lean  # noqa: E402

pytestmark = pytest.mark.gpu

DEV = "cuda"
TOL = {torch.float16: 1e-2, torch.bfloat16: 4e-2, torch.float32: 2e-4}


@pytest.fixture(autouse=True)
def _exact_math():
    with torch_gpu.exact_math():
        yield


def _close(got, want, tol, what):
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
    g, w = got.detach().double(), want.detach().double()
    assert not torch.isnan(g).any(), f"{what}: NaN"
    err = (g - w).abs().max().item() if g.numel() else 0.0
    scale = max(1.0, w.abs().max().item() if w.numel() else 0.0)
    assert err <= tol * scale, f"{what}: max error {err:.3g} (scale {scale:.3g})"


def _rel(got, want) -> float:
    g, w = got.detach().double(), want.detach().double()
    return ((g - w).norm() / w.norm().clamp_min(1e-30)).item()


# ==================================================================================================
# The lean path
# ==================================================================================================
def _block(cl: bool, dtype):
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Conv2d(8, 16, 3, padding=1, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1),
        nn.Conv2d(16, 16, 1, bias=True),
        nn.ReLU(),
    ).to(DEV)
    m = m.to(memory_format=torch.channels_last) if cl else m
    for mod in m.modules():
        if isinstance(mod, nn.Conv2d):
            mod.to(dtype)
    return m


@pytest.mark.parametrize("cl", [False, True], ids=["nchw", "nhwc"])
def test_lean_path_binds_and_hits_with_torchs_results(cl):
    """The first step binds each module's calls; the next steps launch the bound entries (the
    store does not grow) and still equal torch's step, gradients and running statistics."""
    dt = torch.bfloat16
    ref = _block(cl, dt)
    mine = pt.convert(copy.deepcopy(ref), strict=True)
    fmt = torch.channels_last if cl else torch.contiguous_format
    pycudnn.clear_caches()
    counts = []
    for step in range(3):
        torch.manual_seed(step)
        x = torch.randn(4, 8, 12, 12, device=DEV, dtype=dt).contiguous(memory_format=fmt)
        xr, xm = x.clone().requires_grad_(), x.clone().requires_grad_()
        yr, ym = ref(xr), mine(xm)
        _close(ym, yr, TOL[dt], f"step {step} forward")
        dy = torch.randn_like(yr)
        yr.backward(dy)
        ym.backward(dy)
        _close(xm.grad, xr.grad, TOL[dt], f"step {step} input grad")
        for (n, pr), (_, pm) in zip(ref.named_parameters(), mine.named_parameters(), strict=True):
            _close(pm.grad, pr.grad, TOL[dt], f"step {step} grad {n}")
            pr.grad = pm.grad = None
        counts.append(_lean.bound_count())
    for (n, br), (_, bm) in zip(ref.named_buffers(), mine.named_buffers(), strict=True):
        _close(bm.to(br.dtype), br, TOL[dt], f"buffer {n}")
    # this thread binds the forwards (conv x2, batch norm, ReLU x2, pool); autograd runs the
    # backwards on its own device thread, which binds them in its own store
    assert counts[0] >= 6, counts
    assert counts[1] == counts[0] == counts[2], f"hits must not bind again: {counts}"


def test_lean_path_misses_on_a_new_signature():
    m = pt.convert(nn.Conv2d(4, 8, 3, padding=1).to(DEV, torch.float16))
    pycudnn.clear_caches()
    with torch.no_grad():
        m(torch.randn(2, 4, 8, 8, device=DEV, dtype=torch.float16))
        n1 = _lean.bound_count()
        m(torch.randn(2, 4, 8, 8, device=DEV, dtype=torch.float16))
        assert _lean.bound_count() == n1
        m(torch.randn(3, 4, 8, 8, device=DEV, dtype=torch.float16))  # shape
        assert _lean.bound_count() == n1 + 1
        x = torch.randn(2, 4, 8, 8, device=DEV, dtype=torch.float16)
        y = m(x.contiguous(memory_format=torch.channels_last))  # strides
        assert _lean.bound_count() == n1 + 2
        assert y.is_contiguous(memory_format=torch.channels_last)
        ref = F.conv2d(x, m.weight, m.bias, padding=1)
        _close(y, ref, TOL[torch.float16], "channels-last forward")
        # an input at an odd 2-byte offset: another alignment, another entry, same values
        buf = torch.randn(2 * 4 * 8 * 8 + 1, device=DEV, dtype=torch.float16)
        xo = buf[1:].view(2, 4, 8, 8)
        _close(m(xo), F.conv2d(xo, m.weight, m.bias, padding=1), 1e-2, "offset input")
        assert _lean.bound_count() >= n1 + 2


# ==================================================================================================
# Channels-last batch norm (no staging copies)
# ==================================================================================================
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_channels_last_batchnorm_matches_torch(dtype, train):
    torch.manual_seed(1)
    ref = nn.BatchNorm2d(32).to(DEV)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
        ref.bias.uniform_(-0.5, 0.5)
        ref.running_mean.uniform_(-0.2, 0.2)
        ref.running_var.uniform_(0.5, 1.5)
    ref.train(train)
    mine = pt.convert(copy.deepcopy(ref), strict=True)
    x = (torch.randn(8, 32, 14, 14, device=DEV) * 2 + 0.5).to(dtype)
    x = x.contiguous(memory_format=torch.channels_last)
    xr, xm = x.clone().requires_grad_(), x.clone().requires_grad_()
    yr, ym = ref(xr), mine(xm)
    assert ym.is_contiguous(memory_format=torch.channels_last)
    tol = TOL[dtype]
    _close(ym, yr, tol, "forward")
    dy = torch.randn_like(yr)
    yr.backward(dy)
    ym.backward(dy)
    _close(xm.grad, xr.grad, tol, "dx")
    _close(mine.weight.grad, ref.weight.grad, tol, "dweight")
    _close(mine.bias.grad, ref.bias.grad, tol, "dbias")
    _close(mine.running_mean, ref.running_mean, 1e-3, "running_mean")
    _close(mine.running_var, ref.running_var, 1e-3, "running_var")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_channels_last_batchnorm_high_level_against_float64(dtype):
    """dnn_batch_normalization_train / _grad on NHWC half data (the Ex calls) against a float64
    reference, outputs poisoned with NaN first."""
    torch.manual_seed(2)
    n, c, h, w = 4, 24, 9, 7
    x = (torch.randn(n, c, h, w, device=DEV) * 3 + 1).to(dtype)
    x = x.contiguous(memory_format=torch.channels_last)
    g = torch.rand(c, device=DEV) + 0.5
    b = torch.randn(c, device=DEV)
    y = torch.full_like(x, float("nan"))
    out_mean = torch.full((c,), float("nan"), device=DEV)
    out_invstd = torch.full((c,), float("nan"), device=DEV)
    eps = 1e-5
    y2, mean, invstd = pycudnn.dnn_batch_normalization_train(
        x, g, b, "spatial", eps, out=y, out_mean=out_mean, out_invstd=out_invstd
    )
    assert y2 is y and mean is out_mean and invstd is out_invstd
    x64 = x.double()
    m64 = x64.mean((0, 2, 3))
    v64 = x64.var((0, 2, 3), unbiased=False)
    i64 = 1 / torch.sqrt(v64 + eps)
    want = (x64 - m64.view(1, -1, 1, 1)) * (g.double() * i64).view(1, -1, 1, 1) + b.double().view(
        1, -1, 1, 1
    )
    _close(mean.double(), m64, 1e-3, "mean")
    _close(invstd.double(), i64, 1e-3, "invstd")
    _close(y.double(), want, TOL[dtype], "y")
    dy = torch.randn_like(x)
    dx, dg, db = pycudnn.dnn_batch_normalization_grad(
        x, dy, g, mean, invstd, "spatial", eps, out=torch.full_like(x, float("nan"))
    )
    dy64 = dy.double()
    xhat = (x64 - m64.view(1, -1, 1, 1)) * i64.view(1, -1, 1, 1)
    db64 = dy64.sum((0, 2, 3))
    dg64 = (dy64 * xhat).sum((0, 2, 3))
    m = n * h * w
    dx64 = (
        (g.double() * i64).view(1, -1, 1, 1)
        / m
        * (m * dy64 - db64.view(1, -1, 1, 1) - xhat * dg64.view(1, -1, 1, 1))
    )
    _close(torch.as_tensor(db).double(), db64, 2e-2, "dbias")
    _close(torch.as_tensor(dg).double(), dg64, 2e-2, "dscale")
    _close(torch.as_tensor(dx).double(), dx64, TOL[dtype], "dx")


# ==================================================================================================
# Autocast
# ==================================================================================================
class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu1 = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.relu2 = nn.ReLU(inplace=True)
        self.avg = nn.AvgPool2d(2)
        self.sm = nn.LogSoftmax(dim=1)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = self.pool(self.relu1(self.bn1(self.conv1(x))))
        x = self.avg(self.relu2(self.bn2(self.conv2(x))))
        return self.sm(self.fc(x.flatten(1)))


@pytest.mark.parametrize("cl", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_autocast_matches_torchs_autocast(dtype, cl):
    """float32 parameters inside torch.autocast: output dtype, values, input and parameter
    gradients and running statistics against torch's autocast of the same model, each side's
    error measured against the float32 model (the dtype's noise)."""
    torch.manual_seed(3)
    ref = _Net().to(DEV)
    fmt = torch.channels_last if cl else torch.contiguous_format
    ref = ref.to(memory_format=fmt)
    f32 = copy.deepcopy(ref)
    mine = pt.convert(copy.deepcopy(ref))
    x = torch.randn(8, 3, 16, 16, device=DEV).contiguous(memory_format=fmt)
    xs = [x.clone().requires_grad_() for _ in range(3)]
    outs = []
    for model, xi, ac in ((f32, xs[0], False), (ref, xs[1], True), (mine, xs[2], True)):
        with torch.autocast("cuda", dtype=dtype, enabled=ac):
            y = model(xi)
        outs.append(y)
        y.float().square().sum().backward()
    y32, yr, ym = outs
    assert ym.dtype == yr.dtype, (ym.dtype, yr.dtype)
    names = [n for n, _ in ref.named_parameters()]
    pairs = [("output", y32, yr, ym), ("input grad", xs[0].grad, xs[1].grad, xs[2].grad)]
    for n, p32, pr, pm in zip(
        names, f32.parameters(), ref.parameters(), mine.parameters(), strict=True
    ):
        pairs.append((f"grad {n}", p32.grad, pr.grad, pm.grad))
        assert pm.grad.dtype == pr.grad.dtype == torch.float32, n
    for what, want, r, m in pairs:
        er, em = _rel(r, want), _rel(m, want)
        assert em <= 2 * er + 2e-2, f"{what}: converted {em:.3g} vs torch {er:.3g} from float32"
    for (n, br), (_, bm) in zip(ref.named_buffers(), mine.named_buffers(), strict=True):
        if br.dtype.is_floating_point:
            _close(bm, br, 2e-2, f"buffer {n}")


# ==================================================================================================
# torchvision's models, converted against the originals
# ==================================================================================================
def _torchvision():
    return pytest.importorskip("torchvision")


def _models():
    return [
        ("resnet18", "train", torch.bfloat16, True, (4, 3, 64, 64)),
        ("resnet50", "train", torch.bfloat16, True, (4, 3, 64, 64)),
        ("mobilenet_v2", "train", torch.float16, False, (4, 3, 64, 64)),
        ("densenet121", "eval", torch.float16, False, (2, 3, 64, 64)),
        ("vgg11_bn", "train", torch.bfloat16, True, (2, 3, 64, 64)),
        ("r3d_18", "train", torch.float16, False, (2, 3, 8, 32, 32)),
    ]


@pytest.mark.parametrize(("name", "mode", "dtype", "cl", "shape"), _models(), ids=lambda v: str(v))
def test_torchvision_model_matches_the_original(name, mode, dtype, cl, shape):
    tv = _torchvision()
    builder = getattr(tv.models.video, name) if name == "r3d_18" else getattr(tv.models, name)
    torch.manual_seed(4)
    base = builder(weights=None).to(DEV)
    base.train(mode == "train")
    for mod in base.modules():  # dropout masks would differ between the three copies
        if isinstance(mod, nn.Dropout):
            mod.eval()
    if cl:
        base = base.to(memory_format=torch.channels_last)
    f32 = copy.deepcopy(base)
    ref = copy.deepcopy(base)
    # half weights, float32 batch norms (mixed precision's usual choice)
    for m in (ref,):
        m.to(dtype)
        for mod in m.modules():
            if isinstance(mod, nn.modules.batchnorm._BatchNorm):
                mod.float()
    mine = pt.convert(copy.deepcopy(ref))
    n_conv = sum(type(m) in set(pt.supported_modules().values()) for m in mine.modules())
    assert n_conv > 5, f"{name}: only {n_conv} modules converted"
    x = torch.randn(shape, device=DEV)
    if cl and len(shape) == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    results = []
    for model, dt in ((f32, torch.float32), (ref, dtype), (mine, dtype)):
        xi = x.detach().to(dt).clone().requires_grad_()
        y = model(xi)
        y.float().square().mean().backward()
        grads = torch.cat([p.grad.float().flatten() for p in model.parameters()])
        results.append((y.float(), xi.grad.float(), grads))
    (y32, dx32, g32), (yr, dxr, gr), (ym, dxm, gm) = results
    for what, want, r, m in (
        ("output", y32, yr, ym),
        ("input grad", dx32, dxr, dxm),
        ("parameter grads", g32, gr, gm),
    ):
        er, em = _rel(r, want), _rel(m, want)
        print(f"MODEL {name} {what}: torch {er:.3g} pycudnn {em:.3g} (rel. L2 to float32)")
        assert em <= 1.5 * er + 3e-2, f"{name} {what}: converted {em:.3g} vs torch {er:.3g}"
