"""Fused regions whose residual chains run pycudnn's own batch-norm kernels
(:mod:`pycudnn.torch.bn_kernel`), on the CPU: each kernel launch is replaced by a float64 torch
computation of what the kernel does, behind a fake entry that, like the lean fakes of
``test_torch_program.py``, runs **from pointers alone** (a replayed launch rebuilds its operands
at the addresses it is given). So the programs that replay these launches -- an eager region's,
and a compiled region's forward with its fixed arena layout and the scratch buffer for the
kernels' partial sums -- really read and write their places: a wrong slot, offset or lifetime
gives a wrong number. The fakes keep the statistics in float64 (as batch norm's parameters are
here; on a GPU both are float32); results are compared with programs off (the chains one by
one, the same fakes) and with torch's model (to 1e-5: the kernels take eps and the momentum as
float32). The kernels' own numerics are the GPU tier's
(``test_torch_bn_kernel_gpu.py``).
"""

from __future__ import annotations

import ctypes
import gc
import weakref

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch.library, "custom_op") or not hasattr(torch, "compiler"):
    pytest.skip("torch.library.custom_op needs torch >= 2.4", allow_module_level=True)
nn = torch.nn

import test_torch_fuse as tf  # noqa: E402  (tests/torch_adapter is on sys.path)
import test_torch_program as tp  # noqa: E402
from test_torch_fuse import bn_act, fakes  # noqa: E402, F401  (fixtures)
from test_torch_program import lean  # noqa: E402, F401  (fixture)

from pycudnn.torch import _lean, bn_kernel, fuse, fused_train, region_ops  # noqa: E402

#: the kernels launched while a fake was bound (replays do not add to it)
CALLS: list[str] = []
_BASES = ("bn_stats", "bn_finalize", "bn_apply", "bn_grad_stats", "bn_grad_finalize")
_BASES += ("bn_grad_apply",)


def _bits(v: torch.Tensor) -> torch.Tensor:
    """The ReLU's mask of channels-last *v*: a byte per 8 elements in memory order."""
    flat = (v.permute(0, 2, 3, 1).reshape(-1, 8) > 0).to(torch.int64)
    return (flat << torch.arange(8)).sum(1).to(torch.uint8)


def _unbits(m: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    n, c, h, w = like.shape
    bits = (m.to(torch.int64)[:, None] >> torch.arange(8)) & 1
    return bits.reshape(n, h, w, c).permute(0, 3, 1, 2).bool()


def _masked(ins: list, p: list) -> tuple:
    """A gradient kernel's ``(dy masked by the ReLU's mask when given, x, last input)``."""
    dy, *rest = ins
    g = dy if p[1] is None else dy * _unbits(rest[0], dy)
    return g, rest[-2], rest[-1]


def _kernel(base: str, p: list, ins: list, outs: list) -> None:
    """What kernel *base* writes into *outs*, from *ins* and its parameters *p* (as
    ``bn_kernel.train_forward``/``train_backward`` pass them)."""
    dims = (0, 2, 3)
    if base == "bn_stats":
        outs[0].zero_()  # (the finalize below reads the input itself)
    elif base == "bn_finalize":
        _, x, gamma, beta, *run = ins
        mean, invstd, ss = outs
        eps, m = p[-2].value, p[-1].value
        c, n = x.shape[1], x.numel() // x.shape[1]
        mu, var = x.mean(dims), x.var(dims, unbiased=False)
        mean.copy_(mu)
        invstd.copy_((var + eps).rsqrt())
        ss[:c].copy_(gamma * invstd)
        ss[c:].copy_(beta - mean * ss[:c])
        if run:
            run[0].mul_(1 - m).add_(m * mu)
            run[1].mul_(1 - m).add_(m * var * n / (n - 1))
    elif base == "bn_apply":
        x, *rest = ins
        z = rest[0] if p[1] is not None else None
        ss = rest[-1]
        c = x.shape[1]
        y = x * ss[:c].view(1, c, 1, 1) + ss[c:].view(1, c, 1, 1)
        if z is not None:
            y = y + z
        if p[7].value:
            y = y.clamp_min(0)
        outs[0].copy_(y)
        if p[4] is not None:
            outs[1].copy_(_bits(y))
    elif base == "bn_grad_stats":
        g, x, mean = _masked(ins, p)
        c = x.shape[1]
        part = outs[0]
        blocks = part.numel() // (2 * c)
        part.zero_()
        part[:c].copy_(g.sum(dims))
        part[blocks * c : blocks * c + c].copy_((g * (x - mean.view(1, c, 1, 1))).sum(dims))
    elif base == "bn_grad_finalize":
        part, gamma, mean, invstd = ins
        dgamma, dbeta, coef = outs
        c, n = gamma.shape[0], p[3].value
        blocks = part.numel() // (2 * c)
        s = part[: blocks * c].view(blocks, c).double().sum(0)
        t = part[blocks * c :].view(blocks, c).double().sum(0)
        inv = invstd.double()
        dg, kg = t * inv, gamma.double() * inv
        kx = -kg * inv * dg / n
        dbeta.copy_(s)
        dgamma.copy_(dg)
        coef[:c].copy_(kg)
        coef[c : 2 * c].copy_(kx)
        coef[2 * c :].copy_(-kg * s / n - kx * mean.double())
    elif base == "bn_grad_apply":
        g, x, coef = _masked(ins, p)
        c = x.shape[1]
        if p[5] is not None:
            outs[1].copy_(g)
        k = [coef[i * c : (i + 1) * c].view(1, c, 1, 1) for i in range(3)]
        outs[0].copy_(k[0] * g + k[1] * x + k[2])
    else:
        raise AssertionError(base)


class KernelFake:
    """A bound kernel launch that computes from operands rebuilt at the given pointers."""

    handle = tp._Handle()

    def __init__(self, base: str, params: list, tensors: tuple, n_in: int) -> None:
        self.base, self.params, self.n_in = base, params, n_in
        self.metas = [(tuple(t.shape), t.stride(), t.dtype) for t in tensors]

    def run(self, tensors) -> None:
        _kernel(self.base, self.params, list(tensors[: self.n_in]), list(tensors[self.n_in :]))

    def launch(self, ptrs) -> None:
        self.run([tp._at(p, *m) for p, m in zip(ptrs, self.metas, strict=True)])


def _fake_run(x, name, grid, params, ins, outs, stream, block=256):
    base = name if name in _BASES else name.rsplit("_", 1)[0]
    entry = KernelFake(base, params, ins + outs, len(ins))
    entry.run(ins + outs)
    CALLS.append(base)
    _lean.tape_append(entry, ins + outs)


def _cpu_takes(t) -> bool:
    return (
        bn_kernel.fits(tuple(t.shape), t.dtype)
        and t.is_contiguous(memory_format=torch.channels_last)
        and t.data_ptr() % 16 == 0
    )


@pytest.fixture
def own(lean, monkeypatch):  # noqa: F811
    """The residual chains on pycudnn's kernels, faked for float64 CPU tensors."""
    monkeypatch.setattr(bn_kernel, "_KINDS", {**bn_kernel._KINDS, torch.float64: "f64"})
    monkeypatch.setattr(bn_kernel, "_run", _fake_run)
    monkeypatch.setattr(bn_kernel, "device_info", lambda index: (90, 4))
    monkeypatch.setattr(bn_kernel, "stream_of", lambda t: 0)
    real_setup = bn_kernel._setup

    def setup(x):  # the statistics in float64, as batch norm's parameters here (and the layout)
        rows, c, kind, blocks, _, _ = real_setup(x)
        f64 = {"dtype": torch.float64, "device": x.device}
        return rows, c, kind, blocks, torch.empty(2 * blocks * c, **f64), f64

    monkeypatch.setattr(bn_kernel, "_setup", setup)
    monkeypatch.setattr(fused_train, "OWN_MIN_ELEMENTS", 0)
    real = fused_train.chain_path

    def path(y, pdt, act, residual, device=None):  # float32 parameters, a device: as on a GPU
        return real(y, torch.float32 if pdt == torch.float64 else pdt, act, residual, 0)

    for module in (fused_train, region_ops):
        monkeypatch.setattr(module, "chain_path", path)
    monkeypatch.setattr(fused_train, "takes", _cpu_takes)
    CALLS.clear()
    yield


def _residual_chains(model) -> int:
    return sum(r.pattern == "conv_bn_add_act" for _, r in fuse.fusions(model))


def _close_to_torch(ref, mine, x, fwd=None) -> None:
    """One training step of each: outputs, gradients and buffers to 1e-5 (the kernels take eps
    and the momentum as float32)."""
    xr, xm = x.clone().requires_grad_(), x.clone().requires_grad_()
    yr, ym = ref(xr), (mine if fwd is None else fwd)(xm)
    tol = {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(ym, yr, **tol)
    dy = torch.randn_like(yr)
    yr.backward(dy)
    ym.backward(dy)
    torch.testing.assert_close(xm.grad, xr.grad, **tol)
    for (n, a), b in zip(mine.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, msg=n, **tol)
        a.grad, b.grad = None, None
    for (n, a), b in zip(mine.named_buffers(), ref.buffers(), strict=True):
        torch.testing.assert_close(a, b, msg=n, **tol)


@pytest.mark.usefixtures("own")
@pytest.mark.parametrize("make", [tf.Bottleneck, tp.Two], ids=lambda f: f.__name__)
def test_eager_regions_replay_pycudnns_kernels(make):
    """An eager region's programs replay pycudnn's kernels: from the second step no kernel is
    bound again, the steps equal the chains one by one's exactly and torch's to float32's
    precision, and ``programs`` counts the chains on pycudnn's kernels."""
    ref, mine = tf._pair(make)
    x = tp._x(8 if make is tf.Bottleneck else 3)
    for step in range(3):
        n = len(CALLS)
        _close_to_torch(ref, mine, x)
        if step:
            assert len(CALLS) == n  # every kernel launch a replay
    assert {"bn_stats", "bn_apply", "bn_grad_stats", "bn_grad_apply"} <= set(CALLS)
    progs = tp._programs(mine)
    assert progs and all("backward program" in w for w in progs), progs
    said = sum(int(w.split(" on pycudnn's kernels")[0].rsplit(" ", 1)[1]) for w in progs if
               "on pycudnn's kernels" in w)  # fmt: skip
    assert said == _residual_chains(mine) >= 1, progs
    # the programs against the chains one by one (the same fakes)
    tp._same_with_and_without_programs(make, x, lambda m: m.double())


@pytest.mark.usefixtures("own")
@pytest.mark.parametrize("plain", [False, True], ids=["residual", "every"])
@pytest.mark.parametrize("make", [tf.Bottleneck, tp.Two], ids=lambda f: f.__name__)
def test_compiled_regions_replay_pycudnns_kernels_in_their_fixed_arena(make, plain, monkeypatch):
    """A compiled region's forward, whose arena the fake lays out, records and replays pycudnn's
    kernels (their partial sums in the program's scratch buffer), and its backward reads the
    ReLU's mask from that arena: torch's numbers at every step, no kernel bound after the
    first; the residual chains on them, or (*plain*) every ReLU chain."""
    if plain:
        monkeypatch.setattr(fused_train, "OWN_PLAIN_MIN_ELEMENTS", 0)
    torch._dynamo.reset()
    ref, mine = tf._pair(make)
    compiled = torch.compile(mine, backend="aot_eager", fullgraph=True)
    x = tp._x(8 if make is tf.Bottleneck else 3)
    for step in range(3):
        n = len(CALLS)
        _close_to_torch(ref, mine, x, compiled)
        if step:
            assert len(CALLS) == n
    assert "bn_stats" in CALLS
    for r in tp._regions(mine):
        for progs in region_ops.spec_of(r.op_key).train.values():
            assert progs.fwd is not None and not progs.reason, progs.reason
            assert all(isinstance(v, tuple) for v in progs.bwd.values()), progs.bwd
    scratch = [
        p.fwd.scratch_bytes
        for r in tp._regions(mine)
        for p in region_ops.spec_of(r.op_key).train.values()
    ]
    assert any(scratch), scratch  # the partial sums and scale/shift went there
    compiled = [w for w in tp._programs(mine) if w.startswith("compiled, training: ")]
    assert compiled and all("backward program of" in w for w in compiled), tp._programs(mine)
    for r in tp._regions(mine):  # a spec not registered (unpickled elsewhere): eager runs only
        r.op_key = -1
        assert not any(w.startswith("compiled") for _, w in r.programs())
    torch._dynamo.reset()


def test_the_fake_kernels_are_torchs_batch_norm():
    """The fakes above against torch's batch norm + add + ReLU and its gradients (float64, the
    statistics rounded to float32 as the kernels keep them)."""
    torch.manual_seed(0)
    x = torch.randn(2, 8, 4, 6, dtype=torch.float64).to(memory_format=torch.channels_last)
    z = torch.randn_like(x)
    gamma, beta = torch.rand(8) + 0.5, torch.randn(8)
    rm, rv = torch.zeros(8), torch.ones(8)
    f32 = {"dtype": torch.float32}
    mean, invstd, ss = torch.empty(8, **f32), torch.empty(8, **f32), torch.empty(16, **f32)
    eps, mom = ctypes.c_float(1e-5), ctypes.c_float(0.1)
    _kernel("bn_finalize", [None] * 12 + [eps, mom], [None, x, gamma, beta, rm, rv],
            [mean, invstd, ss])  # fmt: skip
    out, mask = torch.empty_like(x), torch.empty(x.numel() // 8, dtype=torch.uint8)
    one = ctypes.c_uint32(1)
    _kernel("bn_apply", [0, 1, 2, 3, 4, 0, 0, one], [x, z, ss], [out, mask])
    xr = x.clone().requires_grad_()
    gr, br = gamma.double().requires_grad_(), beta.double().requires_grad_()
    rmr, rvr = torch.zeros(8, dtype=torch.float64), torch.ones(8, dtype=torch.float64)
    want = (nn.functional.batch_norm(xr, rmr, rvr, gr, br, True, 0.1, 1e-5) + z).relu()
    torch.testing.assert_close(out, want.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rm.double(), rmr, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(rv.double(), rvr, rtol=1e-6, atol=1e-6)
    assert torch.equal(_unbits(mask, x), want.detach() > 0)
    dy = torch.randn_like(x)
    want.backward(dy)
    part = torch.empty(2 * 8, **f32)
    _kernel("bn_grad_stats", [0, 1], [dy, mask, x, mean], [part])
    dgamma, dbeta, coef = torch.empty(8, **f32), torch.empty(8, **f32), torch.empty(24, **f32)
    rows = ctypes.c_uint32(x.numel() // 8)
    _kernel("bn_grad_finalize", [0, 0, 0, rows], [part, gamma, mean, invstd],
            [dgamma, dbeta, coef])  # fmt: skip
    dx, dz = torch.empty_like(x), torch.empty_like(x)
    _kernel("bn_grad_apply", [0, 1, 2, 3, 4, 5], [dy, mask, x, coef], [dx, dz])
    torch.testing.assert_close(dx, xr.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dgamma.double(), gr.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dbeta.double(), br.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dz, dy * (want.detach() > 0))


class _Stem(nn.Module):
    """Two plain conv -> bn -> relu chains (no residual): one region whose output is a plain
    chain's."""

    def __init__(self):
        super().__init__()
        self.a = tf.ConvBNAct(nn.ReLU(), c=8)
        self.conv = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(self.a(x))))


@pytest.mark.usefixtures("own")
@pytest.mark.parametrize("plain_own", [True, False], ids=["own_kernels", "cudnn_kernel"])
def test_plain_chains_on_pycudnns_kernels_keep_no_output_for_the_backward(plain_own, monkeypatch):
    """From ``OWN_PLAIN_MIN_ELEMENTS`` a plain chain runs pycudnn's kernels too, whose backward
    reads the ReLU's mask, not the chain's output: the region's program then keeps no output
    for its backward, so the output goes once its readers are done (on cuDNN's fused kernel,
    whose backward reads it, the region keeps it). Torch's numbers either way."""
    if plain_own:
        monkeypatch.setattr(fused_train, "OWN_PLAIN_MIN_ELEMENTS", 0)
    ref, mine = tf._pair(_Stem)
    x = tp._x(3)
    for _ in range(3):  # the first step records, the later ones replay
        _close_to_torch(ref, mine, x)
    progs = tp._programs(mine)
    assert progs and all("backward program" in w for w in progs), progs
    assert any("2 on pycudnn's kernels" in w for w in progs) == plain_own, progs
    y = mine(x.clone().requires_grad_())
    gone = weakref.ref(y)
    loss = y.sum()  # (its backward keeps no input)
    del y
    gc.collect()
    assert (gone() is None) == plain_own
    loss.backward()
    for n, a in mine.named_parameters():
        assert a.grad is not None, n
