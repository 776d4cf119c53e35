"""pycudnn's max-pooling kernels (:mod:`pycudnn.torch.pool_kernel`) on the CPU: what they take,
the float64 twins against torch's own max pooling (values, which maximum a tie or a NaN picks,
gradients), and the Python around the kernels with each launch replaced by its twin: the
operands and parameters the wrappers pass, the autograd function (a byte per pooled element
kept for the backward), the converted module's routes and the compiled op's fake. The kernels
themselves run on the GPU: ``test_torch_pool_kernel_gpu.py``."""

from __future__ import annotations

import contextlib
import copy

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import pool_reference as pr  # noqa: E402  (tests/support)

import pycudnn.torch as pt  # noqa: E402
from pycudnn import _nvrtc  # noqa: E402
from pycudnn.torch import _lean, fuse, kernel_launch, pool, pool_kernel, region_pool  # noqa: E402

CL = torch.channels_last
#: (window, stride, pad): ResNet's stem pool, a plain 2x2, overlapping stride 1, wide padding
CFGS = [((3, 3), (2, 2), (1, 1)), ((2, 2), (2, 2), (0, 0)), ((3, 3), (1, 1), (1, 1))]
CFGS += [((5, 3), (3, 2), (2, 1))]
CALLS: list[str] = []


def _cfg(c) -> tuple:
    return (*c, "max")


def _ties(shape, dtype=torch.float32) -> torch.Tensor:
    """Small integers (many ties in every window), channels-last."""
    return torch.randint(-3, 4, shape).to(dtype).contiguous(memory_format=CL)


class _Twin:
    """A launch replaced by its float64 twin (what ``run_kernel`` records on a tape)."""

    def __init__(self, name: str, params: list, n_in: int) -> None:
        self.name, self.geo, self.n_in, self.params = name, params[-1], n_in, params
        self.handle = None

    def run(self, tensors: tuple) -> None:
        g = self.geo
        cfg = ((g.kh, g.kw), (g.sh, g.sw), (g.ph, g.pw), "max")
        if self.name.startswith("max_pool_bn_fwd"):
            x, y = tensors[0], tensors[-1]
            at, kinds, eps = self.params[2:6], self.params[6].value, self.params[7].value
            vectors = tuple(None if k is None else tensors[k] for k in at)
            for k, v in enumerate(vectors):  # the kinds the kernel reads each vector as
                want = 0 if v is None else {torch.float32: 1, torch.float16: 2}.get(v.dtype, 3)
                assert (kinds >> (2 * k)) & 3 == want, (k, kinds)
            y.copy_(pr.max_pool_ref(pr.bn_relu_ref(x, vectors, eps), cfg)[0])
        elif self.name.startswith("max_pool_fwd"):
            x, y, *idx = tensors
            ref, pos = pr.max_pool_ref(x, cfg)
            y.copy_(ref)
            if idx:
                idx[0].copy_(pos.permute(0, 2, 3, 1).reshape(-1).to(torch.uint8))
        else:
            dy, idx, dx = tensors
            pos = pr.positions_of(idx, tuple(dy.shape))
            dx.copy_(pr.max_pool_grad_ref(dy, pos, tuple(dx.shape), cfg))


def twin_run(x, name, grid, params, ins, outs, stream):
    """``pool_kernel._run`` with the launch replaced by its float64 twin (the compile tests'
    fakes use it too)."""
    # a thread per 8 elements of the output (forward) or of the input's gradient (backward)
    assert grid == (-(-(outs[0].numel() // 8) // 256), 1, 1), (name, grid)
    if name.startswith("max_pool_bn_fwd"):
        assert params[:2] == [0, len(ins)] and len(params) == 9, params
    elif name.startswith("max_pool_fwd"):
        assert params[:2] == [0, 1] and params[2] == (2 if len(outs) == 2 else None), params
    else:
        assert params[:3] == [0, 1, 2], params
    _Twin(name, params, len(ins)).run(ins + outs)
    CALLS.append(name)


@pytest.fixture
def twins(monkeypatch):
    """The kernels replaced by their float64 twins on CPU tensors."""
    monkeypatch.setattr(pool_kernel, "_run", twin_run)
    monkeypatch.setattr(pool_kernel, "stream_of", lambda t: 0)
    CALLS.clear()
    yield


@pytest.mark.parametrize("c", CFGS, ids=str)
def test_twin_picks_as_torch_does(c):
    """The twin's maxima and positions are torch's (first maximum of a tie; the last NaN),
    and its gradient is torch's, on data full of ties and with NaNs."""
    torch.manual_seed(0)
    cfg = _cfg(c)
    x = _ties((2, 8, 9, 11), torch.float64)
    x[0, 1, 2, 3] = x[1, 4, 0, 0] = x[1, 4, 0, 1] = float("nan")
    xr = x.clone().requires_grad_(True)
    yr, ir = F.max_pool2d(xr, c[0], c[1], c[2], return_indices=True)
    y, pos = pr.max_pool_ref(x, cfg)
    torch.testing.assert_close(y, yr.detach(), equal_nan=True, rtol=0, atol=0)
    # torch's flat index (h * w_in + w) of each maximum, from the window position
    oh = torch.arange(y.shape[2]).view(1, 1, -1, 1) * c[1][0] - c[2][0]
    ow = torch.arange(y.shape[3]).view(1, 1, 1, -1) * c[1][1] - c[2][1]
    flat = (oh + pos // c[0][1]) * x.shape[3] + ow + pos % c[0][1]
    assert torch.equal(flat, ir)
    dy = torch.randn_like(yr)
    yr.backward(dy)
    torch.testing.assert_close(pr.max_pool_grad_ref(dy, pos, tuple(x.shape), cfg), xr.grad)


@pytest.mark.parametrize("c", CFGS, ids=str)
def test_forward_and_backward_through_the_wrappers(twins, c):
    """``forward``/``backward`` pass the kernels their operands and geometry: the output and
    gradient are torch's, the positions a byte per element in the output's memory order."""
    cfg = _cfg(c)
    x = _ties((2, 16, 10, 7))
    y, idx = pool_kernel.forward(x, cfg, True)
    assert y.is_contiguous(memory_format=CL) and idx.dtype == torch.uint8
    assert idx.numel() == y.numel()
    xr = x.clone().requires_grad_(True)
    yr = F.max_pool2d(xr, *c)
    torch.testing.assert_close(y, yr.detach(), rtol=0, atol=0)
    dy = torch.randn_like(yr).contiguous(memory_format=CL)
    yr.backward(dy)
    dx = pool_kernel.backward(dy, idx, tuple(x.shape), cfg)
    assert dx.is_contiguous(memory_format=CL)
    torch.testing.assert_close(dx, xr.grad)
    y2, none = pool_kernel.forward(x, cfg, False)
    assert none is None and torch.equal(y2, y)
    assert CALLS == ["max_pool_fwd_f32", "max_pool_bwd_f32", "max_pool_fwd_f32"]


def _bn_vectors(c: int, dtype=torch.float32, affine: bool = True) -> tuple:
    g = torch.Generator().manual_seed(3)
    mean = torch.randn(c, generator=g).to(dtype)
    var = (torch.rand(c, generator=g) + 0.5).to(dtype)
    if not affine:
        return mean, var, None, None
    return mean, var, torch.randn(c, generator=g).to(dtype), torch.randn(c, generator=g).to(dtype)


@pytest.mark.parametrize("c", CFGS, ids=str)
@pytest.mark.parametrize(("vdtype", "affine"), [(torch.float32, True), (torch.bfloat16, True),
                                                (torch.float16, False)])  # fmt: skip
def test_forward_bn_passes_the_vectors_and_gives_torchs_eval_stem(twins, c, vdtype, affine):
    """``forward_bn`` passes the kernel the input, each vector (or a null pointer) with its
    kind, and eps: the output is torch's eval batch norm, ReLU and max pooling."""
    cfg = _cfg(c)
    x = _ties((2, 16, 10, 7))
    vectors = _bn_vectors(16, vdtype, affine)
    assert pool_kernel.bn_vectors_ok(vectors, x)
    y = pool_kernel.forward_bn(x, cfg, vectors, 1e-3)
    assert y.is_contiguous(memory_format=CL) and y.dtype == x.dtype
    mean, var, gamma, beta = (None if v is None else v.float() for v in vectors)
    ref = F.max_pool2d(F.relu(F.batch_norm(x, mean, var, gamma, beta, False, 0.0, 1e-3)), *c)
    torch.testing.assert_close(y, ref)
    assert CALLS == ["max_pool_bn_fwd_f32"]


def test_bn_vectors_ok_refuses():
    x = _ties((2, 16, 10, 7))
    mean, var, gamma, beta = _bn_vectors(16)
    assert pool_kernel.bn_vectors_ok((mean, var, None, None), x)
    for bad in (
        (None, var, gamma, beta),  # no statistics
        (mean, None, gamma, beta),
        (mean.double(), var, gamma, beta),  # a dtype the kernel does not read
        (mean, var, torch.ones(8), beta),  # not a value per channel
        (mean, var, gamma, torch.ones(17)[1:]),  # off 16 bytes
        (mean, var, torch.ones(32)[::2], beta),  # not contiguous
    ):
        assert not pool_kernel.bn_vectors_ok(bad, x)


def _stem() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 16, 7, 2, 3, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                      nn.MaxPool2d(3, 2, 1), nn.Conv2d(16, 8, 3, padding=1))  # fmt: skip
    with torch.no_grad():
        m[1].running_mean.normal_()
        m[1].running_var.uniform_(0.5, 2)
        m[1].weight.normal_()
        m[1].bias.normal_()
    return m.eval()


def test_a_fused_stem_runs_the_convolution_then_the_bn_pool_kernel(twins, monkeypatch):
    """``convert(fuse=True)`` makes a stem (a one-chain region and the max pooling that alone
    reads it) one :class:`~pycudnn.torch.region_pool.FusedPool`; in eval without a gradient it
    runs the plain convolution, then the batch norm, ReLU and pooling in one kernel, and gives
    torch's result; with a gradient or in training the region and the pooling module run."""
    ref = _stem()
    m = pt.convert(copy.deepcopy(ref), fuse=True)
    gm = m.__dict__["forward"].__self__
    (fp,) = [c for c in gm.children() if isinstance(c, region_pool.FusedPool)]
    assert fp.parts[0] is m[3] and len(fp.region.parts) == 1
    convs = []

    def conv_into(x, w, b, y, cfg):
        convs.append(cfg)
        return y.copy_(F.conv2d(x, w, b, cfg[2], cfg[1]))

    monkeypatch.setattr(region_pool, "cuda_ok", lambda t: True)
    monkeypatch.setattr(region_pool, "conv_into", conv_into)
    monkeypatch.setattr(region_pool, "ready", lambda: None)
    monkeypatch.setattr(pool_kernel, "takes_bn", lambda y, cfg: pool_kernel.fits(
        tuple(y.shape), y.dtype, cfg))  # fmt: skip
    x = torch.randn(2, 3, 32, 32).contiguous(memory_format=CL)
    with torch.no_grad():
        got, want = m(x), ref(x)
        torch.testing.assert_close(m(x), want, rtol=1e-4, atol=1e-4)  # the signature's 2nd call
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert CALLS == ["max_pool_bn_fwd_f32"] * 2 and convs == [(2, (3, 3), (2, 2), (1, 1), 1)] * 2
    (what,) = [w for _, _, w in fuse.programs(m) if "kernel" in w]
    assert what.startswith("eval: the convolution without an epilogue")
    # (the twins record no launch on a tape: the two launches run unrecorded, each call)
    assert what.endswith("(unrecorded: an output ((2, 16, 8, 8) torch.float32) is produced by "
                         "no launch)")  # fmt: skip
    CALLS.clear()
    region_pool.use_pool_kernel(False)  # switched off: the region and the pooling module
    try:
        with torch.no_grad():
            torch.testing.assert_close(m(x), want, rtol=1e-4, atol=1e-4)
    finally:
        region_pool.use_pool_kernel(True)
    assert CALLS == []
    CALLS.clear()
    m(x).sum().backward()  # a gradient wanted: the region and the pooling module
    with torch.no_grad():
        pt.convert(copy.deepcopy(ref), fuse=True).train()(x)  # training: the same
    assert CALLS == [] and len(convs) == 2
    for hooked in (m[3], m[1]):  # a hook on the pooling or the batch norm: the modules run
        h = hooked.register_forward_hook(lambda *a: None)
        with torch.no_grad():
            torch.testing.assert_close(m(x), ref(x), rtol=1e-4, atol=1e-4)
        h.remove()
    assert CALLS == []


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_use_pool_kernel_takes_a_bool_only(bad):
    with pytest.raises(TypeError, match="use_pool_kernel: enabled must be a bool"):
        region_pool.use_pool_kernel(bad)


def test_autograd_function_keeps_only_the_positions(twins):
    """``MaxPoolFn`` keeps the byte per pooled element for its backward, not the input or the
    output (what cuDNN's pooling backward reads), and gives torch's gradient."""
    c = CFGS[0]
    x = _ties((2, 8, 12, 12)).requires_grad_(True)
    y, idx = pool.MaxPoolFn.apply(x, _cfg(c))
    saved = y.grad_fn.saved_tensors
    assert len(saved) == 1 and saved[0].dtype == torch.uint8 and saved[0].numel() == y.numel()
    assert not idx.requires_grad
    xr = x.detach().clone().requires_grad_(True)
    dy = torch.randn_like(y)
    y.backward(dy)
    F.max_pool2d(xr, *c).backward(dy)
    torch.testing.assert_close(x.grad, xr.grad)


def test_converted_module_routes(twins, monkeypatch):
    """A converted ``MaxPool2d`` takes pycudnn's kernels where ``takes`` says so (training: the
    autograd function; no gradient: the forward alone, no positions), cuDNN's pooling where
    not."""
    m = pt.convert(nn.Sequential(nn.MaxPool2d(3, 2, 1)))
    assert isinstance(m[0], pt.MaxPool2d)
    monkeypatch.setattr(pool, "cuda_ok", lambda t: True)
    monkeypatch.setattr(pool_kernel, "takes", lambda x, cfg, grad: True)
    x = _ties((2, 8, 12, 12)).requires_grad_(True)
    y = m(x)
    assert type(y.grad_fn).__name__ == "MaxPoolFnBackward"
    y.sum().backward()
    xr = x.detach().clone().requires_grad_(True)
    F.max_pool2d(xr, 3, 2, 1).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad)
    assert CALLS == ["max_pool_fwd_f32", "max_pool_bwd_f32"]
    CALLS.clear()
    with torch.no_grad():
        m(x)
    assert CALLS == ["max_pool_fwd_f32"]
    ran = []
    monkeypatch.setattr(pool_kernel, "takes", lambda x, cfg, grad: False)
    monkeypatch.setattr(pool, "pool_run", lambda x, cfg: ran.append(cfg) or x)
    with torch.no_grad():
        m(x)
    assert ran == [((3, 3), (2, 2), (1, 1), "max")]


def test_run_kernel_binds_once_and_records(monkeypatch):
    """``run_kernel`` binds a kernel once per signature (the geometry, passed by value, is part
    of it), records each launch on the calling thread's tape and marks the kernel warm (run
    outside a capture) for its device."""
    made, launched = [], []

    class Bound:
        def __init__(self, source, device, name, grid, params, n_in, block):
            made.append((name, bytes(params[-1])))
            self.n_in, self.handle = n_in, type("Box", (), {"set_stream": lambda s, v: None})()

        def launch(self, ptrs):
            launched.append(ptrs)

    monkeypatch.setattr(kernel_launch, "KernelLaunch", Bound)
    monkeypatch.setattr(kernel_launch, "_STORE", {})
    monkeypatch.setattr(kernel_launch, "_WARM", set())
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(pool_kernel, "stream_of", lambda t: 0)
    x = _ties((1, 8, 6, 6))
    with _lean.Tape() as tape:
        for _ in range(2):
            pool_kernel.forward(x, _cfg(CFGS[0]), True)
        pool_kernel.forward(x, _cfg(CFGS[1]), True)
    assert [m[0] for m in made] == ["max_pool_fwd_f32"] * 2  # two geometries, bound once each
    assert made[0][1] != made[1][1]
    assert len(launched) == 3 and len(tape.launches) == 3
    assert [t.data_ptr() for t in tape.launches[0][1][:1]] == [x.data_ptr()]
    assert kernel_launch.warm(pool_kernel.SOURCE, x.device.index, ("max_pool_fwd_f32",))
    assert not kernel_launch.warm(pool_kernel.SOURCE, x.device.index, ("max_pool_bwd_f32",))


@pytest.mark.parametrize(
    ("shape", "dtype", "cfg", "why"),
    [
        ((2, 12, 8, 8), torch.float16, CFGS[0], "channels not a multiple of 8"),
        ((2, 8, 8, 8), torch.float64, CFGS[0], "float64"),
        ((2, 8, 8, 8, 8), torch.float16, CFGS[0], "3-D data"),
        ((2, 8, 40, 40), torch.float16, ((16, 16), (1, 1), (0, 0)), "256 positions"),
        ((2, 8, 8, 8), torch.float16, ((3, 3), (2, 2), (2, 2)), "padding over half the window"),
        ((2, 8, 2, 2), torch.float16, ((3, 3), (1, 1), (0, 0)), "an empty output"),
        ((2, 8, 8, 8), torch.float16, ((3, 3), (0, 2), (1, 1)), "a zero stride"),
        ((2, 8, 8, 8), torch.float16, ((0, 3), (1, 1), (0, 0)), "an empty window"),
    ],
)
def test_fits_refuses(shape, dtype, cfg, why):
    assert not pool_kernel.fits(shape, dtype, (*cfg, "max")), why


def test_fits_takes_the_stem_pool_and_refuses_averages():
    cfg = _cfg(CFGS[0])
    for dt in (torch.float16, torch.bfloat16, torch.float32):
        assert pool_kernel.fits((64, 64, 112, 112), dt, cfg)
    assert not pool_kernel.fits((64, 64, 112, 112), torch.float16, (*CFGS[0], "average_inc_pad"))
    assert not pool_kernel.takes(_ties((2, 8, 8, 8)), cfg, True)  # a CPU tensor


def test_compiled_ops_fakes():
    """``pycudnn::max_pool``'s fake: the output channels-last, the positions a byte per output
    element in training and empty without; ``max_pool_grad``'s: the input's shape."""
    if pool.op_max_pool is None:
        pytest.skip("torch.library.custom_op needs torch >= 2.4")
    x = torch.empty(2, 16, 9, 9, device="meta").contiguous(memory_format=CL)
    y, idx = pool._op_max_pool_fake(x, [3, 3], [2, 2], [1, 1], True)
    assert y.shape == (2, 16, 5, 5) and y.is_contiguous(memory_format=CL)
    assert idx.shape == (y.numel(),) and idx.dtype == torch.uint8
    assert pool._op_max_pool_fake(x, [3, 3], [2, 2], [1, 1], False)[1].numel() == 0
    dx = pool._op_max_grad_fake(y, idx, [2, 16, 9, 9], [3, 3], [2, 2], [1, 1])
    assert dx.shape == x.shape and dx.is_contiguous(memory_format=CL)


@pytest.mark.parametrize("arch", [75, 80, 90])  # (NVRTC 13 dropped sm_70)
def test_the_kernels_compile_for_each_architecture(arch):
    try:
        _nvrtc.nvrtc_version()
    except Exception as exc:  # no cuda-python or no libnvrtc here
        pytest.skip(f"NVRTC unavailable: {exc}")
    image, cubin = pool_kernel.SOURCE.compile(arch)
    assert cubin and image[:4] == b"\x7fELF"
    text = pool_kernel.SOURCE.compile(990)[0].rstrip(b"\x00").decode()  # PTX: the entries
    for kind in ("f16", "bf16", "f32"):
        for k in ("fwd", "bwd"):
            assert f".entry max_pool_{k}_{kind}(" in text
