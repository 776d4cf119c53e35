"""GPU tests of the conv-BN training fusion graphs (marker ``gpu``; skipped without a device or
without torch), torch as the oracle.

Run on the GPU machine:
``PYTHONPATH=. python3 -m pytest -m gpu -q -s tests/graph/nodes/test_bn_fusion_gpu.py``.

NVIDIA's ResNet training fusion, pattern by pattern, NHWC (channels-last) float16 and bfloat16,
N=8, C=K=64, 16x16, 3x3 convolutions with padding 1:

* ``conv_genstats``: conv fprop -> genstats: y equals torch's convolution, sum / sq_sum the
  float64 sums of cuDNN's own y;
* ``sbr_conv_genstats``: the same after the scale-bias-ReLU prologue ``relu(x * scale + bias)``;
* ``bn_finalize`` (float32): saved mean and inverse std, the running statistics moved by the
  momentum (torch's unbiased variance), the equivalent scale and bias, against
  ``torch.native_batch_norm``, every channel (outputs poisoned with NaN);
* ``dgrad_drelu_dbn_weight``: dgrad -> ReLU backward (against the batch norm's output,
  recomputed in the graph from its input and statistics) -> dbn_weight: the ReLU backward's
  output against torch autograd of conv -> bn -> relu -> conv, and dscale, dbias and the input
  gradient ``eq_scale_dy * dy + eq_scale_x * x + eq_bias`` against torch autograd of the batch
  norm given cuDNN's ReLU backward output.

cuDNN runs these only on the engines it has for each pattern on this GPU: a graph with none is
skipped with cuDNN's message. Each pattern prints one summary line, ``convbn pattern NAME:
engines N, result ok|refused: ...`` (``-s`` shows them).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import pycudnn  # noqa: E402  (torch first: both then use the same libcudnn)
from pycudnn import errors  # noqa: E402
from pycudnn.graph import Graph, _plans  # noqa: E402

pytestmark = pytest.mark.gpu

N, C, K, H, W = 8, 64, 64, 16, 16
DT = {"fp16": torch.float16, "bf16": torch.bfloat16}
TOL = {"fp16": 1e-2, "bf16": 2e-2}  # max |got - ref| / max |ref|
CL = torch.channels_last


@pytest.fixture(autouse=True)
def _exact_torch():
    old = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old
    pycudnn.get_handle().set_stream(0)


def _engines(g: Graph) -> str:
    """How many engines the heuristics offer for *g* and how many of them build here."""
    try:
        key = g.key()
        found = _plans.engine_plans(key, pycudnn.get_handle(key.device))
    except errors.CudnnError as exc:
        return f"0 (operation graph refused: {errors.status_name(exc.status)})"
    built = sum(not isinstance(gp, str) for _info, gp in found)
    return f"{built} of {len(found)} built"


def build(g: Graph, pattern: str, **kw) -> str:
    """*g* built, or the test skipped with cuDNN's reason (and the summary line printed);
    returns the summary line's head."""
    head = f"convbn pattern {pattern}: engines {_engines(g)}"
    try:
        g.build(**kw)
    except errors.NotSupportedError as exc:
        line = f"{head}, result refused: {exc}"
        print(line)
        pytest.skip(line)
    return f"{head} ({g.describe()})"


def run(g: Graph, pack: dict) -> None:
    g.execute(pack, stream=torch.cuda.current_stream())
    torch.cuda.synchronize()


def done(head: str, checks: dict) -> None:
    """Print the summary line: ok, or the checks that failed (then fail)."""
    bad = {k: v for k, v in checks.items() if not v[0]}
    status = "ok" if not bad else "mismatch " + ", ".join(f"{k} {v[1]}" for k, v in bad.items())
    print(f"{head}, result {status}")
    assert not bad, status


def close(got, ref, tol) -> tuple[bool, str]:
    """``(max |got - ref| <= tol * max |ref|, the relative error)``."""
    got, ref = got.double(), ref.double()
    scale = ref.abs().max().item() or 1.0
    err = (got - ref).abs().max().item() / scale
    return err <= tol, f"{err:.2e} (tol {tol:g})"


def channels(t):
    """A (C,) float32 vector as the (1, C, 1, 1) tensor the graph takes."""
    return t.float().reshape(1, -1, 1, 1).contiguous()


def nan_like(t, dtype=None):
    return torch.full_like(t, float("nan"), dtype=dtype)


# ==================================================================================================
# ConvBNfprop: [scale-bias-ReLU] -> conv fprop -> genstats
# ==================================================================================================
@pytest.mark.parametrize("prologue", [False, True], ids=["conv", "sbr_conv"])
@pytest.mark.parametrize("dt", ["fp16", "bf16"])
def test_conv_genstats(dt, prologue):
    dtype = DT[dt]
    x = torch.randn(N, C, H, W, device="cuda").to(dtype, memory_format=CL)
    w = (torch.randn(K, C, 3, 3, device="cuda") * 0.1).to(dtype, memory_format=CL)
    scale = (torch.rand(1, C, 1, 1, device="cuda") + 0.5).to(dtype)
    bias = (torch.randn(1, C, 1, 1, device="cuda") * 0.5).to(dtype)
    pattern = ("sbr_conv_genstats" if prologue else "conv_genstats") + f" {dt}"

    def graph(math):
        g = Graph(io_data_type=dtype, name=pattern)
        tx, tw = g.tensor_like(x, name="x"), g.tensor_like(w, name="w")
        inp, ts, tb = tx, None, None
        if prologue:
            ts, tb = g.tensor_like(scale, name="scale"), g.tensor_like(bias, name="bias")
            inp = g.relu(g.add(g.mul(tx, ts), tb))
        ty = g.conv_fprop(inp, tw, padding=1, name="conv").set_output(True)
        tsum, tsq = g.genstats(ty, compute_data_type=math, name="stats")
        tsum.set_output(True)
        tsq.set_output(True)
        return g, (tx, tw, ts, tb, ty, tsum, tsq)

    # genstats' math precision: the graph's (float32) first, then the activation's type,
    # which is what cudnn-frontend sets; the line says which one cuDNN took
    g, (tx, tw, ts, tb, ty, tsum, tsq) = graph(None)
    try:
        g.build()
    except errors.NotSupportedError as exc:
        g, (tx, tw, ts, tb, ty, tsum, tsq) = graph(dtype)
        pattern += f" (genstats math {dt}; float32 refused: {str(exc)[:200]})"
    head = build(g, pattern)

    y = torch.full((N, K, H, W), float("nan"), device="cuda", dtype=dtype).to(memory_format=CL)
    s = torch.full((1, K, 1, 1), float("nan"), device="cuda")
    sq = torch.full_like(s, float("nan"))
    pack = {tx: x, tw: w, ty: y, tsum: s, tsq: sq}
    if prologue:
        pack |= {ts: scale, tb: bias}
    run(g, pack)

    a = x.float()
    if prologue:  # cuDNN's prologue in float32, its output rounded to the convolution's type
        a = torch.relu(a * scale.float() + bias.float()).to(dtype).float()
    y_ref = F.conv2d(a, w.float(), padding=1)
    y64 = y.double()
    s_ref, sq_ref = y64.sum((0, 2, 3)), (y64 * y64).sum((0, 2, 3))
    # the sums of cuDNN's own y (float64): within its rounding of each element
    s_scale = y64.abs().sum((0, 2, 3))
    done(
        head,
        {
            "y": close(y, y_ref, TOL[dt]),
            "sum": (
                bool(((s.flatten().double() - s_ref).abs() <= TOL[dt] * s_scale).all()),
                f"{((s.flatten().double() - s_ref).abs() / s_scale).max().item():.2e}",
            ),
            "sq_sum": close(sq.flatten(), sq_ref, TOL[dt]),
        },
    )


# ==================================================================================================
# BN finalize
# ==================================================================================================
@pytest.mark.parametrize(("n", "hw"), [(N, H), (2, 3)], ids=["8x16x16", "2x3x3"])
def test_bn_finalize(n, hw):
    """The small batch (18 values a channel) tells the unbiased running variance (torch's)
    from the biased one. The inputs are described by ``tensor_like`` (every stride of a
    ``(1, C, 1, 1)`` tensor 1), which the operation redescribes as cudnn-frontend does."""
    eps, momentum = 1e-5, 0.3
    y = torch.randn(n, K, hw, hw, device="cuda", dtype=torch.float64) * 2 + 0.5
    total, sq = y.sum((0, 2, 3)), (y * y).sum((0, 2, 3))
    gamma = torch.rand(K, device="cuda") + 0.5
    beta = torch.randn(K, device="cuda")
    rmean = torch.randn(K, device="cuda")
    rvar = torch.rand(K, device="cuda") + 0.5

    g = Graph(io_data_type="float32", name="bn_finalize")
    ins = [channels(t) for t in (total, sq, gamma, beta, rmean, rvar)]
    t_in = [
        g.tensor_like(t, name=nm)
        for t, nm in zip(ins, ("sum", "sq", "g", "b", "rm", "rv"), strict=True)
    ]
    outs = g.bn_finalize(
        *t_in[:4],
        g.scalar(eps),
        g.scalar(n * hw * hw, "int64"),
        prev_running_mean=t_in[4],
        prev_running_var=t_in[5],
        momentum=g.scalar(momentum),
        name="fin",
    )
    for o in outs:
        o.set_output(True)
    head = build(g, f"bn_finalize {n}x{hw}x{hw}")
    got = [torch.full((1, K, 1, 1), float("nan"), device="cuda") for _ in outs]
    run(g, dict(zip(t_in, ins, strict=True)) | dict(zip(outs, got, strict=True)))
    eq_scale, eq_bias, mean, inv_std, nrm, nrv = (t.flatten().double() for t in got)

    ref_rm, ref_rv = rmean.clone(), rvar.clone()
    y32 = y.float()
    _out, ref_mean, ref_inv = torch.native_batch_norm(
        y32, gamma, beta, ref_rm, ref_rv, True, momentum, eps
    )
    ref_eq_scale = gamma.double() * ref_inv.double()
    ref_eq_bias = beta.double() - ref_mean.double() * ref_eq_scale
    biased_rv = (1 - momentum) * rvar.double() + momentum * y.var((0, 2, 3), unbiased=False)
    rv_ok = torch.allclose(nrv, ref_rv.double(), rtol=1e-4, atol=1e-5)
    rv_note = (
        ""
        if rv_ok
        else (
            "(the biased variance's update)"
            if torch.allclose(nrv, biased_rv, rtol=1e-4, atol=1e-5)
            else "(neither torch's unbiased nor the biased update)"
        )
    )

    def near(a, b):
        return bool(torch.allclose(a, b.double(), rtol=1e-4, atol=1e-5)), (
            f"{(a - b.double()).abs().max().item():.2e}"
        )

    done(
        head,
        {
            "mean": near(mean, ref_mean),
            "inv_std": near(inv_std, ref_inv),
            "eq_scale": near(eq_scale, ref_eq_scale),
            "eq_bias": near(eq_bias, ref_eq_bias),
            "next_running_mean": near(nrm, ref_rm),
            "next_running_var": (
                rv_ok,
                f"{(nrv - ref_rv.double()).abs().max().item():.2e} {rv_note}",
            ),
        },
    )


# ==================================================================================================
# DgradDreluBNBwdWeight
# ==================================================================================================
@pytest.mark.parametrize("dt", ["fp16", "bf16"])
def test_dgrad_drelu_dbn_weight(dt):
    dtype, eps = DT[dt], 1e-5
    z = torch.randn(N, C, H, W, device="cuda").to(dtype, memory_format=CL)  # the BN's input
    w2 = (torch.randn(K, C, 3, 3, device="cuda") * 0.1).to(dtype, memory_format=CL)
    dout = torch.randn(N, K, H, W, device="cuda").to(dtype, memory_format=CL)
    gamma = torch.rand(C, device="cuda") + 0.5
    beta = torch.randn(C, device="cuda") * 0.5
    z64 = z.double()
    mean = z64.mean((0, 2, 3))
    inv = 1 / torch.sqrt(z64.var((0, 2, 3), unbiased=False) + eps)

    pattern = f"dgrad_drelu_dbn_weight {dt}"
    g = Graph(io_data_type=dtype, name=pattern)
    tdy, tw, tx = (
        g.tensor_like(dout, name="dy"),
        g.tensor_like(w2, name="w"),
        g.tensor_like(z, name="x"),
    )
    per = [channels(t) for t in (mean, inv, gamma, beta)]
    tm, tinv, tg, tb = (
        g.tensor_like(t, name=nm) for t, nm in zip(per, ("mean", "inv", "g", "b"), strict=True)
    )
    dx = g.conv_dgrad(tdy, tw, padding=1, image_dim=(N, C, H, W), name="dgrad")
    bn_y = g.add(g.mul(g.mul(g.sub(tx, tm), tinv), tg), tb)
    tdrelu = g.relu_backward(dx, bn_y).set_output(True)
    outs = g.dbn_weight(tdrelu, tx, tm, tinv, tg, name="dbn")
    for o in outs:
        o.set_output(True)
    head = build(g, pattern)

    drelu = nan_like(z)
    got = [torch.full((1, C, 1, 1), float("nan"), device="cuda") for _ in outs]
    pack = {tdy: dout, tw: w2, tx: z, tm: per[0], tinv: per[1], tg: per[2], tb: per[3]}
    run(g, pack | {tdrelu: drelu} | dict(zip(outs, got, strict=True)))
    dscale, dbias, eq_dy, eq_x, eq_b = (t.reshape(1, C, 1, 1).double() for t in got)

    # torch autograd of conv -> bn -> relu -> conv, in float32 from the same rounded inputs
    zf = z.float().requires_grad_(True)
    gf, bf = gamma.clone().requires_grad_(True), beta.clone().requires_grad_(True)
    bn = F.batch_norm(zf, None, None, gf, bf, training=True, eps=eps)
    bn.retain_grad()
    F.conv2d(torch.relu(bn), w2.float(), padding=1).backward(dout.float())
    # elements whose batch-norm output is near 0 may take the other side of the ReLU
    away = bn.detach().abs() > 1e-3
    drelu_ok = close(drelu.float()[away], bn.grad[away], TOL[dt])

    # the batch norm's backward given cuDNN's ReLU backward output
    zb = z.float().requires_grad_(True)
    gb, bb = gamma.clone().requires_grad_(True), beta.clone().requires_grad_(True)
    F.batch_norm(zb, None, None, gb, bb, training=True, eps=eps).backward(drelu.float())
    dx_got = eq_dy * drelu.double() + eq_x * z64 + eq_b
    done(
        head,
        {
            "drelu": drelu_ok,
            "dscale": close(dscale.flatten(), gb.grad, TOL[dt]),
            "dbias": close(dbias.flatten(), bb.grad, TOL[dt]),
            "dx": close(dx_got, zb.grad, TOL[dt]),
        },
    )
