"""pycudnn's max-pooling kernels on the GPU (marker ``gpu``): forward values equal to torch's
max pooling and positions equal to the float64 twin's (``tests/support/pool_reference.py``),
gradients against the float64 twin and torch's autograd, float16, bfloat16 and float32,
channels-last, ties and NaNs, outputs poisoned with NaN first; the converted module's routes
(training, no gradient, data the kernels do not take), under ``torch.cuda.graph`` (and its rule
for kernels not yet loaded) and ``torch.compile``.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import pool_reference as pr  # noqa: E402  (tests/support)

import pycudnn.torch as pt  # noqa: E402
from pycudnn.torch import kernel_launch, pool, pool_kernel  # noqa: E402

pytestmark = pytest.mark.gpu

CL = torch.channels_last
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
#: rounding unit of each dtype: a gradient sums at most a few values in float32, rounded once
ULP = {torch.float16: 2**-10, torch.bfloat16: 2**-7, torch.float32: 2**-22}
CFGS = [((3, 3), (2, 2), (1, 1)), ((2, 2), (2, 2), (0, 0)), ((3, 3), (1, 1), (1, 1))]
CFGS += [((5, 3), (3, 2), (2, 1)), ((7, 7), (3, 3), (3, 3))]


@pytest.fixture(autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if not pool_kernel.usable(torch.cuda.current_device()):
        pytest.skip(f"pycudnn's pooling kernels do not run here: {pool_kernel.SOURCE.failed}")
    torch.manual_seed(0)


def _poison(nbytes: int) -> None:
    """Leave NaN in the bytes torch's caching allocator hands out next."""
    torch.full((nbytes // 4 + 1024,), float("nan"), device="cuda")


def _data(shape, dtype, ties=False) -> torch.Tensor:
    x = torch.randint(-3, 4, shape, device="cuda") if ties else torch.randn(shape, device="cuda")
    return x.to(dtype).contiguous(memory_format=CL)


@pytest.mark.parametrize("c", CFGS, ids=str)
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("ties", [False, True], ids=["randn", "ties"])
def test_against_torch_and_float64(c, dtype, ties):
    cfg = (*c, "max")
    x = _data((3, 24, 23, 17), dtype, ties)
    x[0, 5, 4, 4] = x[2, 16, 0, 0] = float("nan")
    assert pool_kernel.takes(x, cfg, True)
    _poison(8 * x.numel())
    y, idx = pool_kernel.forward(x, cfg, True)
    xr = x.clone().requires_grad_(True)
    yr = F.max_pool2d(xr, *c)
    torch.testing.assert_close(y, yr.detach(), rtol=0, atol=0, equal_nan=True)
    ref, pos = pr.max_pool_ref(x, cfg)
    torch.testing.assert_close(y.double(), ref, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(pr.positions_of(idx, tuple(y.shape)), pos)
    dy = _data(tuple(y.shape), dtype)
    _poison(8 * x.numel())
    dx = pool_kernel.backward(dy, idx, tuple(x.shape), cfg)
    want = pr.max_pool_grad_ref(dy, pos, tuple(x.shape), cfg)
    assert not dx.isnan().any()
    # rounded once to the dtype; a float32 sum of a few terms that cancel is off by their ulps
    tol = {"rtol": 2 * ULP[dtype], "atol": 8 * ULP[torch.float32] * dy.abs().max().item()}
    torch.testing.assert_close(dx.double(), want, **tol)
    yr.backward(dy)
    torch.testing.assert_close(dx.double(), xr.grad.double(), **tol)


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_converted_module_trains_and_evaluates_like_torch(dtype):
    """``convert``'s MaxPool2d: training through the kernels' autograd function, no-gradient
    calls through the forward alone, each equal to torch's module."""
    ref = nn.Sequential(nn.MaxPool2d(3, 2, 1))
    m = pt.convert(nn.Sequential(nn.MaxPool2d(3, 2, 1)))
    x = _data((4, 64, 56, 56), dtype).requires_grad_(True)
    xr = x.detach().clone().requires_grad_(True)
    y, yr = m(x), ref(xr)
    assert type(y.grad_fn).__name__ == "MaxPoolFnBackward"
    torch.testing.assert_close(y, yr, rtol=0, atol=0)
    dy = _data(tuple(y.shape), dtype)
    y.backward(dy)
    yr.backward(dy)
    atol = 8 * ULP[torch.float32] * dy.abs().max().item()
    torch.testing.assert_close(x.grad, xr.grad, rtol=2 * ULP[dtype], atol=atol)
    with torch.no_grad():
        torch.testing.assert_close(m(x), ref(xr), rtol=0, atol=0)


def test_data_the_kernels_do_not_take_runs_on_cudnn():
    """NCHW data, a misaligned view and 12 channels go to cuDNN's pooling, equal to torch's."""
    m = pt.convert(nn.Sequential(nn.MaxPool2d(3, 2, 1)))
    base = torch.randn(2 * 64 * 20 * 20 + 8, device="cuda", dtype=torch.float16)
    odd = base[1:].as_strided((2, 64, 20, 20), (64 * 400, 1, 20 * 64, 64))  # 2-byte offset
    cases = [
        _data((2, 64, 20, 20), torch.float16).contiguous(),
        odd,
        _data((2, 12, 20, 20), torch.float16),
    ]
    for x in cases:
        assert not pool_kernel.takes(x, ((3, 3), (2, 2), (1, 1), "max"), True)
        x = x.detach().requires_grad_(True)
        y = m(x)
        assert type(y.grad_fn).__name__ == "PoolFnBackward"
        torch.testing.assert_close(y, F.max_pool2d(x, 3, 2, 1), rtol=0, atol=0)


def test_captured_step_replays_and_unloaded_kernels_stay_out(monkeypatch):
    """Forward and backward under ``torch.cuda.graph`` after an eager warm-up replay equal to
    eager; kernels not yet run on the device are not taken inside a capture (which cannot
    load a kernel: cuDNN's pooling runs, once run before the capture as any cached call)."""
    m = pt.convert(nn.Sequential(nn.MaxPool2d(3, 2, 1)))
    x = _data((8, 64, 32, 32), torch.bfloat16).requires_grad_(True)
    dy = _data((8, 64, 16, 16), torch.bfloat16)

    def step():
        x.grad = None
        y = m(x)
        y.backward(dy)
        return y

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = step()
    assert type(y.grad_fn).__name__ == "MaxPoolFnBackward"
    x.data.copy_(_data(tuple(x.shape), torch.bfloat16))
    g.replay()
    torch.cuda.synchronize()
    xr = x.detach().clone().requires_grad_(True)
    yr = F.max_pool2d(xr, 3, 2, 1)
    yr.backward(dy)
    torch.testing.assert_close(y, yr, rtol=0, atol=0)
    torch.testing.assert_close(x.grad, xr.grad, rtol=2 * ULP[torch.bfloat16], atol=1e-6)
    # kernels not yet run on the device are not taken inside a capture (the capture could not
    # load them); training needs the backward's too
    cfg = ((3, 3), (2, 2), (1, 1), "max")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert pool_kernel.takes(x, cfg, True)
    monkeypatch.setattr(kernel_launch, "_WARM", set())
    assert not pool_kernel.takes(x, cfg, True) and not pool_kernel.takes(x, cfg, False)
    kernel_launch._WARM.add((x.device.index, pool_kernel.SOURCE.name, "max_pool_fwd_bf16"))
    assert pool_kernel.takes(x, cfg, False) and not pool_kernel.takes(x, cfg, True)


def test_compiled_model_runs_the_kernels(monkeypatch):
    """``torch.compile`` of a converted model runs ``pycudnn::max_pool`` (the kernels) forward
    and backward, equal to eager torch."""
    calls = []
    real_fwd, real_bwd = pool_kernel.forward, pool_kernel.backward
    monkeypatch.setattr(pool_kernel, "forward", lambda *a: calls.append("fwd") or real_fwd(*a))
    monkeypatch.setattr(pool_kernel, "backward", lambda *a: calls.append("bwd") or real_bwd(*a))
    m = pt.convert(nn.Sequential(nn.MaxPool2d(3, 2, 1)))
    cm = torch.compile(m)
    x = _data((4, 64, 28, 28), torch.float16).requires_grad_(True)
    y = cm(x)
    dy = _data(tuple(y.shape), torch.float16)
    y.backward(dy)
    assert calls == ["fwd", "bwd"]
    xr = x.detach().clone().requires_grad_(True)
    yr = F.max_pool2d(xr, 3, 2, 1)
    yr.backward(dy)
    torch.testing.assert_close(y, yr, rtol=0, atol=0)
    torch.testing.assert_close(x.grad, xr.grad, rtol=2 * ULP[torch.float16], atol=1e-6)
    assert pool.op_max_pool is not None


# -- the eval stem: batch norm and ReLU inside the pooling kernel (region_pool.FusedPool) -------
def _vectors(c: int, dtype, affine: bool = True) -> tuple:
    mean = torch.randn(c, device="cuda").to(dtype)
    var = (torch.rand(c, device="cuda") + 0.25).to(dtype)
    if not affine:
        return mean, var, None, None
    gamma, beta = torch.randn(2, c, device="cuda").to(dtype).unbind()
    return mean, var, gamma.clone(), beta.clone()


@pytest.mark.parametrize("c", CFGS[:4], ids=str)
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("vdtype", [torch.float32, "data"], ids=["f32-vectors", "data-vectors"])
def test_bn_kernel_against_torch_and_float64(c, dtype, vdtype):
    """``forward_bn``: torch's eval batch norm, ReLU and max pooling (within one rounding of
    the dtype: torch rounds the batch norm's output before its ReLU and pooling, the same
    value) and the float64 twin, with gammas of both signs and one of 0; a NaN propagates,
    infinities go through as torch's (0 * inf a NaN); absent affine parameters are
    ones/zeros."""
    cfg = (*c, "max")
    x = _data((3, 24, 23, 17), dtype)
    x[0, 5, 4, 4] = float("nan")
    x[1, 3, 2, 2] = float("inf")  # with gamma 0 below: 0 * inf, a NaN as torch's
    x[2, 7, 5, 5] = x[2, 9, 6, 6] = float("-inf")
    for affine in (True, False):
        vectors = _vectors(24, dtype if vdtype == "data" else vdtype, affine)
        if affine:
            vectors[2][3] = 0.0
        assert pool_kernel.takes_bn(x, cfg) and pool_kernel.bn_vectors_ok(vectors, x)
        _poison(4 * x.numel())
        y = pool_kernel.forward_bn(x, cfg, vectors, 1e-5)
        mean, var, gamma, beta = vectors
        ref = F.max_pool2d(F.relu(F.batch_norm(x, mean, var, gamma, beta, False, 0.0, 1e-5)), *c)
        tol = {"rtol": 2 * ULP[dtype], "atol": 2 * ULP[dtype], "equal_nan": True}
        torch.testing.assert_close(y, ref, **tol)
        want = pr.max_pool_ref(pr.bn_relu_ref(x, vectors, 1e-5), cfg)[0]
        torch.testing.assert_close(y.double(), want, **tol)
        assert y.isnan().sum() == ref.isnan().sum() > 0


def _resnet_stem(dtype):
    m = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                      nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1),
                      nn.Conv2d(64, 64, 3, padding=1, bias=False))  # fmt: skip
    with torch.no_grad():
        m[1].running_mean.normal_()
        m[1].running_var.uniform_(0.5, 2)
        m[1].weight.normal_()
        m[1].bias.normal_()
    m = m.to("cuda", memory_format=CL).eval()
    m[0].to(dtype)
    m[4].to(dtype)
    return m


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_fused_stem_eval_eager_and_captured(dtype, monkeypatch):
    """A converted stem (float32 batch norm, half convolutions) in eval: the plain convolution
    and the batch-norm pooling kernel (2 launches: no fold; recorded as a program on the first
    call, replayed after), torch's result within the dtype's rounding; captured with
    ``torch.cuda.graph`` its replay reads the statistics of its moment (changed in place
    between replays), as torch's captured model does."""
    ref = _resnet_stem(dtype)
    m = pt.convert(copy.deepcopy(ref), fuse=True)
    ran = []
    real = pool_kernel.forward_bn
    monkeypatch.setattr(pool_kernel, "forward_bn", lambda *a: ran.append(1) or real(*a))
    x = torch.randn(8, 3, 64, 64, device="cuda").to(dtype).contiguous(memory_format=CL)
    with torch.no_grad():
        got, want = m(x), ref(x)
    assert ran == [1]
    (what,) = [w for _, _, w in pt.programs(m) if "pooling kernel" in w]
    assert what.endswith("(a program of 2 launches)"), what
    tol = {"rtol": 4 * ULP[dtype], "atol": 4 * ULP[dtype] * want.abs().max().item()}
    torch.testing.assert_close(got, want, **tol)
    # captured: warm-up on a side stream, capture, change the statistics, replay
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(2):
            m(x)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g), torch.no_grad():
        y = m(x)
    with torch.no_grad():  # (eager again: the program's replay, torch's result)
        torch.testing.assert_close(m(x), ref(x), **tol)
    assert len(ran) == 1  # the warm-ups and the capture replayed the program
    bn = next(b for b in m.modules() if isinstance(b, nn.BatchNorm2d))
    with torch.no_grad():
        for b in (bn, ref[1]):
            b.running_mean.add_(0.5)
            b.weight.mul_(-1.0)
        x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    with torch.no_grad():
        want = ref(x)
    torch.testing.assert_close(y, want, **tol)


def test_torchvision_resnet_eval_takes_the_stem_kernel():
    """torchvision's ResNet-18 (bfloat16 channels-last, float32 batch norms) converted and
    fused: its stem becomes one FusedPool, the eval logits agree with torch's."""
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    ref = tv.models.resnet18(weights=None).to("cuda", memory_format=CL).eval()
    for mod in ref.modules():
        if isinstance(mod, nn.BatchNorm2d):
            with torch.no_grad():
                mod.running_mean.normal_(0, 0.1)
                mod.running_var.uniform_(0.5, 1.5)
        elif isinstance(mod, (nn.Conv2d, nn.Linear)):
            mod.to(torch.bfloat16)
    m = pt.convert(copy.deepcopy(ref), fuse=True)
    x = torch.randn(4, 3, 224, 224, device="cuda").to(torch.bfloat16)
    x = x.contiguous(memory_format=CL)
    with torch.no_grad():
        got, want = m(x).float(), ref(x).float()
    whats = [w for _, _, w in pt.programs(m)]
    assert any("pooling kernel" in w for w in whats), whats
    rel = ((got - want).abs().max() / want.abs().max()).item()
    assert rel < 5e-2, rel
    assert torch.equal(got.argmax(1), want.argmax(1))
