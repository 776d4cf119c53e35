"""GPU tests of batch normalization (marker ``gpu``; skipped without a device).

Run on the GPU machine:
``PYTHONPATH=. python3 -m pytest -m gpu -q tests/highlevel/test_batchnorm_gpu.py``.

References are float64 NumPy, written here from Theano's formulas (batch statistics, the biased
variance in ``invstd``, running averages with the unbiased variance ``m / (m - 1)``, the
backward at the given ``x_mean``/``x_invstd``), on fresh random inputs rounded to the tested
dtypes first; errors are ``max |got - ref| / max |ref|``. Outputs are poisoned with NaN before
every call. Then: finite differences in float64, equality with ``torch.nn.functional.batch_norm``
(training with running statistics, eval) and its autograd gradients, staging, streams, and the
host cost of a repeated call.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from references import bn_grad_ref, bn_test_ref, bn_train_ref  # noqa: E402
from test_pool_gpu import (  # noqa: E402  (helpers shared with the pooling tests)
    DTYPES,
    TOL,
    _fresh_stream,  # noqa: F401  (autouse fixture: the handle back on the default stream)
    _per_call,
    check,
    dev,
    host,
)

from pycudnn.highlevel.batchnorm import (  # noqa: E402  (torch first: one libcudnn)
    dnn_batch_normalization_grad,
    dnn_batch_normalization_test,
    dnn_batch_normalization_train,
)

pytestmark = pytest.mark.gpu

PARAM = {"fp16": "fp32", "bf16": "fp32", "fp32": "fp32", "fp64": "fp64"}
rng = np.random.default_rng()


# ==================================================================================================
# Helpers (the float64 references, Theano's formulas, are in tests/support/references.py)
# ==================================================================================================
def full_shape(shape, mode):
    """Theano's parameter shape: the inputs' rank, 1 on the normalized axes."""
    if mode == "spatial":
        return (1, shape[1]) + (1,) * (len(shape) - 2)
    return (1, *shape[1:])


def param_shape(shape, mode, form):
    full = full_shape(shape, mode)
    if form == "full":
        return full
    return (shape[1],) if mode == "spatial" else tuple(shape[1:])


def params(shape, mode, form, dt):
    """gamma, beta, running mean, running var: float64 host values (rounded to the parameters'
    dtype), their device tensors in the given form, and the full (broadcastable) shape."""
    pdt = PARAM[dt]
    ps = param_shape(shape, mode, form)
    vals = [
        rng.uniform(0.5, 1.5, ps),
        rng.standard_normal(ps),
        rng.standard_normal(ps),
        rng.uniform(0.5, 1.5, ps),
    ]
    tensors = [dev(v, pdt) for v in vals]
    full = full_shape(shape, mode)
    return [host(t).reshape(full) for t in tensors], tensors


SHAPES = {4: (4, 3, 5, 6), 5: (3, 3, 4, 5, 2)}


# ==================================================================================================
# Train, test and grad: every dtype x layout x rank x mode x parameter form
# ==================================================================================================
@pytest.mark.parametrize("form", ["full", "squeezed"])
@pytest.mark.parametrize("mode", ["spatial", "per-activation"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("rank", [4, 5])
def test_against_reference(rank, dt, layout, mode, form):
    shape = SHAPES[rank]
    pdt = PARAM[dt]
    eps, factor = 1e-3, 0.3
    xt = dev(rng.standard_normal(shape) * 2.0 + 0.5, dt, layout)
    x = host(xt)
    (g, b, rm, rv), (gt, bt, rmt, rvt) = params(shape, mode, form, dt)
    pshape = tuple(gt.shape)
    want = bn_train_ref(x, g, b, mode, eps, factor, rm, rv)

    out = dev(np.full(shape, np.nan), dt, layout)
    res = dnn_batch_normalization_train(xt, gt, bt, mode, eps, factor, rmt, rvt, out=out)
    assert len(res) == 5 and res[0] is out
    names = ("out", "mean", "invstd", "running_mean", "running_var")
    tols = (TOL[dt], TOL[pdt], TOL[pdt], TOL[pdt], TOL[pdt])
    for name, got, ref, tol in zip(names, res, want, tols, strict=True):
        if name != "out":
            assert tuple(got.shape) == pshape, f"{name} has shape {got.shape}"
        check(host(got).reshape(ref.shape), ref, tol, name)
    assert np.array_equal(host(rmt).reshape(rm.shape), rm)  # left untouched
    assert np.array_equal(host(rvt).reshape(rv.shape), rv)

    # new output (in the inputs' layout), running averages updated in place
    res2 = dnn_batch_normalization_train(
        xt, gt, bt, mode, eps, factor, rmt, rvt, inplace_running=True
    )
    assert res2[3] is rmt and res2[4] is rvt
    y = res2[0]
    assert y.shape == shape and (layout == "nhwc") == (y.strides[1] == y.itemsize)
    check(host(y), want[0], TOL[dt], "new out")
    check(host(rmt).reshape(rm.shape), want[3], TOL[pdt], "running_mean in place")
    check(host(rvt).reshape(rv.shape), want[4], TOL[pdt], "running_var in place")

    # inference with the updated running averages
    out = dev(np.full(shape, np.nan), dt, layout)
    dnn_batch_normalization_test(xt, gt, bt, rmt, rvt, mode, eps, out=out)
    rm1, rv1 = host(rmt).reshape(rm.shape), host(rvt).reshape(rv.shape)
    check(host(out), bn_test_ref(x, g, b, rm1, rv1, eps), TOL[dt], "test")

    # backward at the returned statistics
    mean, invstd = res[1], res[2]
    dyt = dev(rng.standard_normal(shape), dt, layout)
    dx_out = dev(np.full(shape, np.nan), dt, layout)
    dx, dscale, dbias = dnn_batch_normalization_grad(
        xt, dyt, gt, mean, invstd, mode, eps, out=dx_out
    )
    assert dx is dx_out and tuple(dscale.shape) == tuple(dbias.shape) == pshape
    full = full_shape(shape, mode)
    wdx, wds, wdb = bn_grad_ref(
        x, host(dyt), g, host(mean).reshape(full), host(invstd).reshape(full), mode
    )
    check(host(dx), wdx, TOL[dt], "dx")
    check(host(dscale).reshape(full), wds, TOL[pdt], "dscale")
    check(host(dbias).reshape(full), wdb, TOL[pdt], "dbias")


@pytest.mark.parametrize("mode", ["spatial", "per-activation"])
@pytest.mark.parametrize("shape", [(16, 3), (6, 3, 7)])
def test_rank_2_and_3_inputs(shape, mode):
    eps, factor = 1e-5, 0.1
    xt = dev(rng.standard_normal(shape), "fp32")
    x = host(xt)
    (g, b, rm, rv), (gt, bt, rmt, rvt) = params(shape, mode, "squeezed", "fp32")
    want = bn_train_ref(x, g, b, mode, eps, factor, rm, rv)
    res = dnn_batch_normalization_train(xt, gt, bt, mode, eps, factor, rmt, rvt)
    for got, ref in zip(res, want, strict=True):
        check(host(got).reshape(ref.shape), ref, 1e-5, f"rank {len(shape)}")
    assert res[0].shape == shape
    got = dnn_batch_normalization_test(xt, gt, bt, rmt, rvt, mode, eps)
    check(host(got), bn_test_ref(x, g, b, rm, rv, eps), 1e-5, "test")


def test_epsilon_zero_is_allowed():
    xt = dev(rng.standard_normal((4, 2, 3, 3)), "fp64")
    x = host(xt)
    (g, b, rm, rv), (gt, bt, _, _) = params(x.shape, "spatial", "full", "fp64")
    out, _, invstd = dnn_batch_normalization_train(xt, gt, bt, "spatial", 0.0)
    want = bn_train_ref(x, g, b, "spatial", 0.0, 0.1, rm, rv)
    check(host(out), want[0], 1e-12, "out")
    check(host(invstd), want[2], 1e-12, "invstd")


# ==================================================================================================
# Gradients against finite differences (float64, tiny shapes)
# ==================================================================================================
@pytest.mark.parametrize("mode", ["spatial", "per-activation"])
def test_gradient_finite_differences(mode):
    shape, eps = (3, 2, 2, 2), 1e-3
    x = rng.standard_normal(shape)
    (g, b, _, _), (gt, bt, _, _) = params(shape, mode, "full", "fp64")
    dy = rng.standard_normal(shape)
    xt, dyt = dev(x, "fp64"), dev(dy, "fp64")
    _, mean, invstd = dnn_batch_normalization_train(xt, gt, bt, mode, eps)
    dx, dscale, dbias = dnn_batch_normalization_grad(xt, dyt, gt, mean, invstd, mode, eps)

    def loss(xv, gv, bv):
        out = dnn_batch_normalization_train(
            dev(xv, "fp64"), dev(gv, "fp64"), dev(bv, "fp64"), mode, eps
        )[0]
        return float(np.sum(host(out) * dy))

    def numeric(which):
        args = [x, g, b]
        base = args[which]
        grad = np.zeros(base.size)
        h = 1e-6
        for i in range(base.size):
            e = np.zeros(base.size)
            e[i] = h
            up = list(args)
            down = list(args)
            up[which] = base + e.reshape(base.shape)
            down[which] = base - e.reshape(base.shape)
            grad[i] = (loss(*up) - loss(*down)) / (2 * h)
        return grad.reshape(base.shape)

    check(host(dx), numeric(0), 1e-6, "dx")
    check(host(dscale), numeric(1), 1e-6, "dscale")
    check(host(dbias), numeric(2), 1e-6, "dbias")


# ==================================================================================================
# Equal to PyTorch
# ==================================================================================================
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("dt", ["fp32", "fp16"])
@pytest.mark.parametrize("rank", [2, 4, 5])
def test_equals_torch(rank, dt, layout):
    shape = {2: (32, 5), 4: (4, 5, 6, 7), 5: (3, 5, 4, 3, 2)}[rank]
    if rank == 2 and layout == "nhwc":
        pytest.skip("a 2-D input has one layout")
    mode = "per-activation" if rank == 2 else "spatial"  # torch's statistics per feature/channel
    eps, factor = 1e-5, 0.2
    xt = dev(rng.standard_normal(shape) * 3 + 1, dt, layout)
    C = shape[1]
    w = torch.rand(C, device="cuda") + 0.5
    bias = torch.randn(C, device="cuda")
    rm, rv = torch.randn(C, device="cuda"), torch.rand(C, device="cuda") + 0.5
    trm, trv = rm.clone(), rv.clone()

    xr = xt.detach().clone().requires_grad_()
    wr, br = w.clone().requires_grad_(), bias.clone().requires_grad_()
    ref = F.batch_norm(xr, trm, trv, wr, br, training=True, momentum=factor, eps=eps)
    out, mean, invstd, nrm, nrv = dnn_batch_normalization_train(
        xt, w, bias, mode, eps, factor, rm, rv, inplace_running=True
    )
    assert nrm is rm and nrv is rv
    check(host(out), host(ref), TOL[dt], "train out")
    check(host(rm), host(trm), 1e-5, "running_mean")  # updated in place, as torch does
    check(host(rv), host(trv), 1e-5, "running_var")

    dy = dev(rng.standard_normal(shape), dt, layout)
    ref.backward(dy)
    dx, dw, db = dnn_batch_normalization_grad(xt, dy, w, mean, invstd, mode, eps)
    check(host(dx), host(xr.grad), TOL[dt], "dx")
    check(host(dw), host(wr.grad), 1e-4, "dweight")
    check(host(db), host(br.grad), 1e-5, "dbias")

    ref = F.batch_norm(xt, trm, trv, w, bias, training=False, eps=eps)
    check(
        host(dnn_batch_normalization_test(xt, w, bias, rm, rv, mode, eps)),
        host(ref),
        TOL[dt],
        "eval",
    )


# ==================================================================================================
# Staging, streams
# ==================================================================================================
@pytest.mark.parametrize("dt", ["fp32", "bf16"])
def test_other_strides_are_staged(dt):
    mode, eps = "spatial", 1e-4
    big = dev(rng.standard_normal((4, 3, 5, 9)), dt)
    sliced = big[..., :6]
    cn = dev(rng.standard_normal((3, 4, 5, 6)), dt).transpose(0, 1)
    gbig = dev(rng.uniform(0.5, 1.5, 6), "fp32")
    gt = gbig[::2]  # a strided (C,) view
    bt = dev(rng.standard_normal(3), "fp32")
    g, b = host(gt).reshape(1, 3, 1, 1), host(bt).reshape(1, 3, 1, 1)
    for xt in (sliced, cn):
        x = host(xt)
        want = bn_train_ref(x, g, b, mode, eps, 0.1, 0 * g, 0 * g + 1)
        obig = dev(np.full((4, 3, 5, 8), np.nan), dt)
        out = obig[..., 1:7]
        _, mean, invstd = dnn_batch_normalization_train(xt, gt, bt, mode, eps, out=out)
        check(host(out), want[0], TOL[dt], "staged out")
        assert np.isnan(host(obig)[..., 0]).all() and np.isnan(host(obig)[..., 7]).all()
        check(host(mean).reshape(g.shape), want[1], 1e-5, "mean")
        dy = dev(rng.standard_normal((4, 3, 5, 6)), dt, "nhwc")
        dx, ds, db = dnn_batch_normalization_grad(xt, dy, gt, mean, invstd, mode, eps)
        check(host(db).reshape(g.shape), host(dy).sum((0, 2, 3), keepdims=True), 1e-5, "dbias")
        wdx, wds, _ = bn_grad_ref(
            x, host(dy), g, host(mean).reshape(g.shape), host(invstd).reshape(g.shape), mode
        )
        check(host(dx), wdx, TOL[dt], "staged dx")
        check(host(ds).reshape(g.shape), wds, 1e-5, "staged dscale")
        # strided running averages are copied (never written), so any strides do
        rmbig, rvbig = dev(np.zeros(6), "fp32"), dev(np.ones(6), "fp32")
        res = dnn_batch_normalization_train(xt, gt, bt, mode, eps, 0.5, rmbig[1::2], rvbig[::2])
        check(host(res[3]).reshape(g.shape), want[1] * 0.5, 1e-5, "running mean from a view")
        assert np.array_equal(host(rmbig), np.zeros(6))


def test_on_a_torch_stream():
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        xt = torch.randn(8, 4, 6, 6, device="cuda")
        w, b = torch.ones(4, device="cuda"), torch.zeros(4, device="cuda")
        out, _, _ = dnn_batch_normalization_train(xt, w, b, "spatial", 1e-5, stream=s)
        ref = F.batch_norm(xt, None, None, w, b, training=True, eps=1e-5)
    s.synchronize()
    check(host(torch.from_dlpack(out)), host(ref), 1e-5, "on a stream")


# ==================================================================================================
# Host cost of a repeated call (printed with -s; a loose bound only)
# ==================================================================================================
def test_repeated_call_is_cheap():
    x = torch.randn(8, 16, 16, 16, device="cuda")
    w, b = torch.ones(16, device="cuda"), torch.zeros(16, device="cuda")
    rm, rv = torch.zeros(16, device="cuda"), torch.ones(16, device="cuda")
    out = torch.empty_like(x)
    dy = torch.randn_like(x)
    _, mean, invstd = dnn_batch_normalization_train(x, w, b, "spatial", 1e-5)
    t = {
        "train": _per_call(lambda: dnn_batch_normalization_train(x, w, b, "spatial", 1e-5)),
        "train out=": _per_call(
            lambda: dnn_batch_normalization_train(x, w, b, "spatial", 1e-5, out=out)
        ),
        "train running in place": _per_call(
            lambda: dnn_batch_normalization_train(
                x, w, b, "spatial", 1e-5, 0.1, rm, rv, inplace_running=True, out=out
            )
        ),
        "train running copied": _per_call(
            lambda: dnn_batch_normalization_train(x, w, b, "spatial", 1e-5, 0.1, rm, rv, out=out)
        ),
        "test out=": _per_call(
            lambda: dnn_batch_normalization_test(x, w, b, rm, rv, "spatial", 1e-5, out=out)
        ),
        "grad": _per_call(
            lambda: dnn_batch_normalization_grad(x, dy, w, mean, invstd, "spatial", 1e-5)
        ),
        "torch train": _per_call(lambda: F.batch_norm(x, rm, rv, w, b, True, 0.1, 1e-5)),
        "torch eval": _per_call(lambda: F.batch_norm(x, rm, rv, w, b, False, 0.1, 1e-5)),
    }
    print("\nhost us/call: " + ", ".join(f"{k} {v:.1f}" for k, v in t.items()))
    assert t["train running in place"] < 3 * t["torch train"] + 20
