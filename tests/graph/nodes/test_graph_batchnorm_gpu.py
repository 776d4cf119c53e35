"""GPU tests of the builder's batch norm (``Graph.batchnorm`` / ``batchnorm_backward``, cuDNN's
NORM_FORWARD / NORM_BACKWARD in BATCH_NORM mode) with the running statistics and a fused
residual addition and ReLU (marker ``gpu``; skipped without a device, torch or an engine),
against torch in float64 from the same rounded inputs.

Run on the GPU machine:
``PYTHONPATH=. python3 -m pytest -m gpu -q -s tests/graph/nodes/test_graph_batchnorm_gpu.py``; each
case prints ``batchnorm graph NAME: ok|refused: ...``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import pycudnn  # noqa: E402  (torch first: both then use the same libcudnn)
from pycudnn import errors  # noqa: E402
from pycudnn.graph import Graph  # noqa: E402

pytestmark = pytest.mark.gpu

N, C, H, W = 8, 64, 16, 16
EPS, MOMENTUM = 1e-5, 0.1
DT = {"fp16": torch.float16, "bf16": torch.bfloat16}
CL = torch.channels_last


@pytest.fixture(autouse=True)
def _seeded():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    torch.manual_seed(0)
    yield
    pycudnn.get_handle().set_stream(0)


def _build(g: Graph, what: str) -> None:
    try:
        g.build()
    except errors.NotSupportedError as exc:
        print(f"batchnorm graph {what}: refused: {str(exc)[:200]}")
        pytest.skip(str(exc)[:200])


def _rel(got, ref) -> float:
    got, ref = got.double(), ref.double()
    return (got - ref).abs().max().item() / (ref.abs().max().item() or 1.0)


def _vec(t):
    return t.reshape(1, -1, 1, 1).contiguous()


def _inputs(dt):
    dtype = DT[dt]
    x = (torch.randn(N, C, H, W, device="cuda") * 2 + 1).to(dtype, memory_format=CL)
    z = torch.randn(N, C, H, W, device="cuda").to(dtype, memory_format=CL)
    dy = torch.randn(N, C, H, W, device="cuda").to(dtype, memory_format=CL)
    gamma, beta = torch.rand(C, device="cuda") + 0.5, torch.randn(C, device="cuda")
    rm, rv = torch.randn(C, device="cuda"), torch.rand(C, device="cuda") + 0.5
    return x, z, dy, gamma, beta, rm, rv


def _reference(x, z, dy, gamma, beta, rm, rv):
    """float64 ``relu(bn(x) + z)``, its statistics and gradients."""
    xd = x.double().requires_grad_(True)
    zd = z.double().requires_grad_(True)
    gd, bd = gamma.double().requires_grad_(True), beta.double().requires_grad_(True)
    rmd, rvd = rm.double(), rv.double()
    ref = torch.relu(F.batch_norm(xd, rmd, rvd, gd, bd, True, MOMENTUM, EPS) + zd)
    ref.backward(dy.double())
    x64 = x.double()
    mean = x64.mean((0, 2, 3))
    inv = 1 / torch.sqrt(x64.var((0, 2, 3), unbiased=False) + EPS)
    return ref.detach(), mean, inv, rmd, rvd, (xd.grad, zd.grad, gd.grad, bd.grad)


def _done(what: str, checks: dict, dt: str) -> None:
    tol = {"fp16": 1e-2, "bf16": 2e-2}[dt]
    bad = {k: f"{v:.2e}" for k, v in checks.items() if not v <= tol}
    print(f"batchnorm graph {what}: " + ("ok" if not bad else f"mismatch {bad}"))
    assert not bad


@pytest.mark.parametrize("dt", ["fp16", "bf16"])
def test_training_forward_with_running_statistics_residual_and_relu(dt):
    x, z, dy, gamma, beta, rm, rv = _inputs(dt)
    vecs = [_vec(t) for t in (gamma, beta, rm, rv)]
    g = Graph(io_data_type=DT[dt], name=f"bn {dt}")
    tx, tz = g.tensor_like(x, name="x"), g.tensor_like(z, name="z")
    ts, tb, trm, trv = (g.tensor_like(t) for t in vecs)
    y, mean, inv, nrm, nrv = g.batchnorm(
        tx, ts, tb, g.scalar(EPS), in_running_mean=trm, in_running_var=trv,
        momentum=g.scalar(MOMENTUM),
    )  # fmt: skip
    out = g.relu(g.add(y, tz)).set_output(True)
    for t in (mean, inv, nrm, nrv):
        t.set_output(True)
    _build(g, f"forward {dt}")
    got = torch.full_like(x, float("nan"))
    stats = [torch.full((1, C, 1, 1), float("nan"), device="cuda") for _ in range(4)]
    pack = {tx: x, tz: z, ts: vecs[0], tb: vecs[1], trm: vecs[2], trv: vecs[3], out: got}
    pack |= dict(zip((mean, inv, nrm, nrv), stats, strict=True))
    g.execute(pack, stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    ref, rmean, rinv, rrm, rrv, _ = _reference(x, z, dy, gamma, beta, rm, rv)
    checks = {
        "out": _rel(got, ref),
        "mean": _rel(stats[0].flatten(), rmean),
        "inv_variance": _rel(stats[1].flatten(), rinv),
        "next_running_mean": _rel(stats[2].flatten(), rrm),
        "next_running_var": _rel(stats[3].flatten(), rrv),
    }
    _done(f"forward {dt}", checks, dt)


@pytest.mark.parametrize("relu", [True, False], ids=["drelu", "alone"])
@pytest.mark.parametrize("dt", ["fp16", "bf16"])
def test_training_backward(dt, relu):
    """The norm backward, after the ReLU's backward in the same graph (``drelu``) or on its own
    (``alone``, the gradient given after the ReLU); a graph with no engine here is skipped
    with cuDNN's message (cuDNN 9.19 on an H200 has none for ``drelu``)."""
    x, z, dy, gamma, beta, rm, rv = _inputs(dt)
    ref, rmean, rinv, _, _, (gx, gz, gg, gb) = _reference(x, z, dy, gamma, beta, rm, rv)
    out = ref.to(DT[dt]).contiguous(memory_format=CL)
    vecs = [_vec(t.float()) for t in (gamma, rmean, rinv)]
    what = f"backward {'after the relu' if relu else 'alone'} {dt}"
    b = Graph(io_data_type=DT[dt], name=what)
    ts, tm, ti = (b.tensor_like(t) for t in vecs)
    tx = b.tensor_like(x)
    gdz, gdx = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
    if relu:
        tdy, tout = b.tensor_like(dy), b.tensor_like(out)
        d = b.relu_backward(tdy, tout).set_output(True)
        pack = {tdy: dy, tout: out, d: gdz}
    else:  # the ReLU's gradient given (the residual's, dz = it)
        gdz = gz.to(DT[dt]).contiguous(memory_format=CL)
        d = b.tensor_like(gdz)
        pack = {d: gdz}
    dx, dscale, dbias = b.batchnorm_backward(d, tx, ts, tm, ti)
    for t in (dx, dscale, dbias):
        t.set_output(True)
    _build(b, what)
    gds, gdb = (torch.full((1, C, 1, 1), float("nan"), device="cuda") for _ in range(2))
    pack |= {tx: x, ts: vecs[0], tm: vecs[1], ti: vecs[2], dx: gdx, dscale: gds, dbias: gdb}
    b.execute(pack, stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    checks = {
        "dz": _rel(gdz, gz),
        "dx": _rel(gdx, gx),
        "dscale": _rel(gds.flatten(), gg),
        "dbias": _rel(gdb.flatten(), gb),
    }
    _done(what, checks, dt)
