"""pycudnn's own batch-norm training kernels on the GPU (marker ``gpu``): forward (output, saved
mean and inverse standard deviation, running statistics) and backward (input, scale, bias and
residual gradients) against float64 references, float16 and bfloat16 channels-last, with and
without the ReLU and the residual, channel counts from 8 to 2048 (and 24, whose rows do not fill
a block's threads evenly), data whose mean is far from zero.

Tolerance: twice the distance of torch's own batch norm in the same dtype (autograd of
``F.batch_norm`` on the half tensors, float32 statistics) to the float64 reference, plus one
unit of the dtype's rounding of the reference's largest value.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from pycudnn.torch import _lean, bn_kernel, program  # noqa: E402

pytestmark = pytest.mark.gpu

CL = torch.channels_last
EPS, MOMENTUM = 1e-5, 0.1


@pytest.fixture(autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    torch.manual_seed(0)


def _reference(x, gamma, beta, z, rm, rv, relu, dy):
    """float64 forward and backward of ``act(bn(x) [+ z])``: outputs, stats, gradients."""
    xd = x.double().requires_grad_(True)
    gd = gamma.double().requires_grad_(True)
    bd = beta.double().requires_grad_(True)
    zd = None if z is None else z.double().requires_grad_(True)
    rmd, rvd = rm.double().clone(), rv.double().clone()
    y = F.batch_norm(xd, rmd, rvd, gd, bd, True, MOMENTUM, EPS)
    if zd is not None:
        y = y + zd
    if relu:
        y = torch.relu(y)
    y.backward(dy.double())
    mean = xd.detach().mean((0, 2, 3))
    inv = 1 / torch.sqrt(xd.detach().var((0, 2, 3), unbiased=False) + EPS)
    grads = (xd.grad, gd.grad, bd.grad, None if zd is None else zd.grad)
    return y.detach(), mean, inv, rmd, rvd, grads


def _torch_half(x, gamma, beta, z, relu, dy):
    """torch's own batch norm in *x*'s dtype (the tolerance's yardstick)."""
    xh = x.clone().requires_grad_(True)
    gh, bh = gamma.clone().requires_grad_(True), beta.clone().requires_grad_(True)
    zh = None if z is None else z.clone().requires_grad_(True)
    y = F.batch_norm(xh, None, None, gh, bh, True, MOMENTUM, EPS)
    if zh is not None:
        y = y + zh
    if relu:
        y = torch.relu(y)
    y.backward(dy)
    return y.detach(), (xh.grad, gh.grad, bh.grad, None if zh is None else zh.grad)


def _err(got, ref) -> float:
    return (got.double() - ref).abs().max().item()


@pytest.mark.parametrize("c", [8, 24, 64, 256, 2048])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize(("relu", "residual"), [(True, False), (True, True), (False, False)])
def test_forward_and_backward_against_float64(c, dtype, relu, residual):
    n, hw = (4, 14) if c < 2048 else (2, 7)
    dev = torch.device("cuda")
    x = (torch.randn(n, c, hw, hw, device=dev) * 3 + 100).to(dtype, memory_format=CL)
    z = torch.randn(n, c, hw, hw, device=dev).to(dtype, memory_format=CL) if residual else None
    dy = torch.randn(n, c, hw, hw, device=dev).to(dtype, memory_format=CL)
    gamma = torch.rand(c, device=dev) + 0.5
    beta = torch.randn(c, device=dev)
    rm, rv = torch.randn(c, device=dev), torch.rand(c, device=dev) + 0.5
    assert bn_kernel.takes(x)
    ref_y, ref_mean, ref_inv, ref_rm, ref_rv, ref_g = _reference(
        x, gamma, beta, z, rm, rv, relu, dy
    )
    th_y, th_g = _torch_half(x, gamma, beta, z, relu, dy)
    running = (rm.clone(), rv.clone())
    out, mean, inv, mask = bn_kernel.train_forward(x, gamma, beta, z, running, EPS, MOMENTUM, relu)
    assert (mask is None) == (not relu)
    dx, dg, db, dz = bn_kernel.train_backward(dy, mask, x, gamma, mean, inv, residual)
    torch.cuda.synchronize()
    unit = torch.finfo(dtype).eps

    def ok(got, ref, th, what):
        tol = 2 * _err(th, ref) + unit * ref.abs().max().item()
        err = _err(got, ref)
        assert err <= tol, f"{what}: max error {err:.3e} > {tol:.3e} (torch's {_err(th, ref):.3e})"

    ok(out, ref_y, th_y, "out")
    assert _err(mean, ref_mean) <= 1e-4 * 100 and _err(inv, ref_inv) <= 1e-3 * ref_inv.max()
    assert _err(running[0], ref_rm) <= 1e-3 * 100 and _err(running[1], ref_rv) <= 1e-3
    names = ("dx", "dgamma", "dbeta", "dz")
    for got, ref, th, what in zip((dx, dg, db, dz), ref_g, th_g, names, strict=True):
        if ref is None:
            assert got is None, what
        else:
            ok(got, ref, th, what)


def test_a_launch_program_replays_the_kernels_bit_for_bit():
    """The kernels recorded on a launch tape replay as a program (new operands in the same
    slots) with the eager calls' results, forward and backward."""
    dev, c = torch.device("cuda"), 64

    def act():
        return torch.randn(4, c, 14, 14, device=dev).to(torch.float16, memory_format=CL)

    x, z, dy = act(), act(), act()
    gamma, beta = torch.rand(c, device=dev) + 0.5, torch.randn(c, device=dev)
    rm, rv = torch.zeros(c, device=dev), torch.ones(c, device=dev)
    with _lean.Tape() as tape:
        saved = bn_kernel.train_forward(x, gamma, beta, z, (rm, rv), EPS, MOMENTUM, True)
    fwd, _ = program.record(tape.launches, [x, z, gamma, beta, rm, rv], list(saved), True)
    _, mean, inv, mask = saved
    with _lean.Tape() as tape:
        grads = bn_kernel.train_backward(dy, mask, x, gamma, mean, inv, True)
    bwd, _ = program.record(tape.launches, [dy, mask, x, gamma, mean, inv], list(grads), True)
    assert len(fwd) == 3 and len(bwd) == 3

    x2, z2, dy2 = act(), act(), act()
    r_eager = (torch.zeros(c, device=dev), torch.ones(c, device=dev))
    r_prog = (torch.zeros(c, device=dev), torch.ones(c, device=dev))
    want = bn_kernel.train_forward(x2, gamma, beta, z2, r_eager, EPS, MOMENTUM, True)
    stream = torch.cuda.current_stream().cuda_stream
    ptrs = [t.data_ptr() for t in (x2, z2, gamma, beta, *r_prog)]
    _, got, _ = fwd.run(ptrs, dev, stream)
    want_g = bn_kernel.train_backward(dy2, want[3], x2, gamma, want[1], want[2], True)
    ptrs = [t.data_ptr() for t in (dy2, got[3], x2, gamma, got[1], got[2])]
    _, got_g, _ = bwd.run(ptrs, dev, stream)
    torch.cuda.synchronize()
    for a, b in zip((*got, *r_prog, *got_g), (*want, *r_eager, *want_g), strict=True):
        assert torch.equal(a, b)
