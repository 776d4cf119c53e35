"""GPU tests of the activation, softmax and tensor-arithmetic functions (marker ``gpu``).

References are float64 NumPy written here, on inputs rounded to the tested dtype first; errors
are max |got - ref| / max(|ref|, 1). Outputs given with ``out=`` are poisoned with NaN first, so
an element cuDNN did not write shows up. Where torch has the operation, the result must equal
torch's within the same tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest
from references import act_grad_ref, act_ref

import pycudnn

pytestmark = pytest.mark.gpu

DTYPES = ("float16", "bfloat16", "float32", "float64")
TOL = {"float64": 1e-12, "float32": 2e-6, "float16": 2e-3, "bfloat16": 1.6e-2}
ACTS = ("relu", "sigmoid", "tanh", "clipped_relu", "elu", "swish", "identity")


def host_dtype(name):
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def dev(x64, dtype, layout="nchw"):
    """(device array in *layout*, the values it holds as float64)."""
    x = x64.astype(host_dtype(dtype))
    if layout == "nhwc" and x.ndim >= 3:
        perm = (0, *range(2, x.ndim), 1)
        inv = np.argsort(perm)
        x = np.ascontiguousarray(x.transpose(perm)).transpose(inv)
    d = pycudnn.to_device(x)
    if layout == "nhwc" and x.ndim >= 3:
        assert not d.is_c_contiguous and d.is_dense
    return d, x.astype(np.float64)


def poisoned(shape, dtype, like=None):
    out = pycudnn.empty(shape, host_dtype(dtype), strides=None if like is None else like.strides)
    out.fill_(float("nan"))
    return out


def err(got, ref):
    got = np.asarray(got, dtype=np.float64)
    assert not np.isnan(got).any(), "NaN in the output (an element was not written)"
    return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1.0))


COEF = {"clipped_relu": 0.8, "elu": 0.7, "swish": 1.3}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ACTS)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_activation_forward_backward(dtype, mode, layout):
    rng = np.random.default_rng()
    shape = (2, 5, 3, 4) if layout == "nchw" else (2, 5, 2, 3, 4)  # 4-D and 5-D
    coef = COEF.get(mode, 0.0)
    # keep x away from the kinks, where a rounding flips the gradient
    x64 = rng.uniform(0.05, 1.5, shape) * rng.choice([-1, 1], shape)
    xd, x = dev(x64, dtype, layout)
    out = poisoned(shape, dtype, like=xd)
    y_dev = pycudnn.dnn_activation(xd, mode, coef, out=out)
    assert y_dev is out
    y_ref = act_ref(x, mode, coef)
    tol = TOL[dtype]
    assert err(out.get(), y_ref) <= tol * 4, (mode, dtype)
    y_new = pycudnn.dnn_activation(xd, mode, coef)
    assert y_new.strides == xd.strides  # the input's memory order
    assert err(y_new.get(), y_ref) <= tol * 4
    # backward, on the values the forward produced
    y = np.asarray(y_new.get(), np.float64)
    dy_d, dy = dev(rng.standard_normal(shape), dtype, layout)
    dx = poisoned(shape, dtype, like=xd)
    pycudnn.dnn_activation_grad(y_new, dy_d, xd, mode, coef, out=dx)
    want = act_grad_ref(x, y, dy, mode, coef)
    assert err(dx.get(), want) <= tol * 8, (mode, dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_activation_alpha_beta_and_in_place(dtype):
    rng = np.random.default_rng()
    xd, x = dev(rng.standard_normal((3, 4, 5)), dtype)
    yd, y0 = dev(rng.standard_normal((3, 4, 5)), dtype)
    pycudnn.dnn_activation(xd, "tanh", alpha=2.0, beta=-0.5, out=yd)
    assert err(yd.get(), 2 * np.tanh(x) - 0.5 * y0) <= TOL[dtype] * 4
    pycudnn.dnn_activation(xd, "relu", out=xd)  # in place
    assert err(xd.get(), np.maximum(x, 0)) <= TOL[dtype]
    # dx over dy, in place
    dyd, dy = dev(rng.standard_normal((3, 4, 5)), dtype)
    y = pycudnn.dnn_activation(xd, "sigmoid")
    yv = np.asarray(y.get(), np.float64)
    pycudnn.dnn_activation_grad(y, dyd, xd, "sigmoid", out=dyd)
    assert err(dyd.get(), dy * yv * (1 - yv)) <= TOL[dtype] * 4


def test_activation_gradient_by_finite_differences():
    rng = np.random.default_rng()
    for mode in ("sigmoid", "tanh", "elu", "swish"):
        coef = COEF.get(mode, 0.0)
        x = rng.standard_normal((2, 3, 2))
        xd, _ = dev(x, "float64")
        y = pycudnn.dnn_activation(xd, mode, coef)
        dy = rng.standard_normal(x.shape)
        dyd, _ = dev(dy, "float64")
        dx = pycudnn.dnn_activation_grad(y, dyd, xd, mode, coef).get()
        h = 1e-6
        fd = np.zeros_like(x)
        for i in np.ndindex(x.shape):
            xp, xm = x.copy(), x.copy()
            xp[i] += h
            xm[i] -= h
            yp = pycudnn.dnn_activation(pycudnn.to_device(xp), mode, coef).get()
            ym = pycudnn.dnn_activation(pycudnn.to_device(xm), mode, coef).get()
            fd[i] = ((yp - ym) * dy).sum() / (2 * h)
        assert np.abs(dx - fd).max() < 1e-7, mode


def softmax_ref(x, algo, mode):
    axes = (1,) if mode == "channel" else tuple(range(1, x.ndim))
    m = x.max(axis=axes, keepdims=True)
    e = np.exp(x - m)
    s = e.sum(axis=axes, keepdims=True)
    return (x - m - np.log(s)) if algo == "log" else e / s


def softmax_grad_ref(y, dy, algo, mode):
    axes = (1,) if mode == "channel" else tuple(range(1, y.ndim))
    if algo == "log":
        return dy - np.exp(y) * dy.sum(axis=axes, keepdims=True)
    return y * (dy - (dy * y).sum(axis=axes, keepdims=True))


SHAPES = {2: (6, 10), 3: (3, 7, 5), 4: (2, 6, 3, 4), 5: (2, 5, 3, 2, 4)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("algo", ["accurate", "fast", "log"])
@pytest.mark.parametrize("mode", ["channel", "instance"])
@pytest.mark.parametrize(
    ("nd", "layout"), [(2, "nchw"), (3, "nchw"), (4, "nchw"), (4, "nhwc"), (5, "nchw"), (5, "nhwc")]
)
def test_softmax_forward_backward(dtype, algo, mode, nd, layout):
    rng = np.random.default_rng()
    shape = SHAPES[nd]
    xd, x = dev(rng.standard_normal(shape) * 2, dtype, layout)
    out = poisoned(shape, dtype, like=xd)
    pycudnn.dnn_softmax(xd, algo, mode, out=out)
    want = softmax_ref(x, algo, mode)
    tol = TOL[dtype] * (8 if algo != "log" else 16)
    assert err(out.get(), want) <= tol, (dtype, algo, mode, nd)
    y = pycudnn.dnn_softmax(xd, algo, mode)
    yv = np.asarray(y.get(), np.float64)
    dyd, dy = dev(rng.standard_normal(shape), dtype, layout)
    dx = poisoned(shape, dtype, like=xd)
    pycudnn.dnn_softmax_grad(dyd, y, algo, mode, out=dx)
    assert err(dx.get(), softmax_grad_ref(yv, dy, algo, mode)) <= tol * 2


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(("y_layout", "dy_layout"), [("nhwc", "nchw"), ("nchw", "nhwc")])
def test_softmax_grad_of_operands_in_two_layouts(dtype, y_layout, dy_layout):
    """cuDNN's backward reads sm and dy through one layout: differing ones are staged (a
    compiled graph's gradient arrives packed while the saved output is channels-last)."""
    rng = np.random.default_rng()
    shape = SHAPES[4]
    xd, _ = dev(rng.standard_normal(shape), dtype, y_layout)
    y = pycudnn.dnn_softmax(xd, "accurate", "channel")
    yv = np.asarray(y.get(), np.float64)
    dyd, dy = dev(rng.standard_normal(shape), dtype, dy_layout)
    dx = poisoned(shape, dtype, like=xd)
    pycudnn.dnn_softmax_grad(dyd, y, "accurate", "channel", out=dx)
    assert err(dx.get(), softmax_grad_ref(yv, dy, "accurate", "channel")) <= TOL[dtype] * 16


def test_softmax_staged_and_blended():
    rng = np.random.default_rng()
    base = rng.standard_normal((2, 3, 4, 5, 6))
    # a 5-D view whose spatial dims cannot be merged (memory order W, H, D reversed)
    host = np.ascontiguousarray(base.transpose(0, 1, 4, 3, 2)).transpose(0, 1, 4, 3, 2)
    xd = pycudnn.to_device(host)
    assert not xd.is_c_contiguous
    out = poisoned(base.shape, "float64")
    pycudnn.dnn_softmax(xd, out=out)
    assert err(out.get(), softmax_ref(base, "accurate", "channel")) <= 1e-12
    acc, acc0 = dev(rng.standard_normal((4, 9)), "float64")
    x2, x2v = dev(rng.standard_normal((4, 9)), "float64")
    pycudnn.dnn_softmax(x2, alpha=3.0, beta=0.25, out=acc)
    assert err(acc.get(), 3 * softmax_ref(x2v, "accurate", "channel") + 0.25 * acc0) <= 1e-12


def test_add_tensor_and_op_tensor():
    rng = np.random.default_rng()
    for dtype in DTYPES:
        tol = TOL[dtype] * 4
        cd, c = dev(rng.standard_normal((2, 4, 3, 5)), dtype, "nhwc")
        bd, b = dev(rng.standard_normal((1, 4, 1, 1)), dtype)
        assert pycudnn.dnn_add_tensor(bd, cd, alpha=2.0, beta=0.5) is cd
        assert err(cd.get(), 2 * b + 0.5 * c) <= tol, dtype
        ad, a = dev(rng.standard_normal((2, 4, 3, 5)), dtype)
        cases = {
            "add": lambda p, q: p + q,
            "mul": lambda p, q: p * q,
            "min": np.minimum,
            "max": np.maximum,
        }
        for op, f in cases.items():
            out = poisoned(a.shape, dtype)
            pycudnn.dnn_op_tensor(op, ad, bd, 1.5, -2.0, out=out)
            assert err(out.get(), f(1.5 * a, -2.0 * b)) <= tol, (op, dtype)
        pos, posv = dev(np.abs(rng.standard_normal((3, 5))) + 0.1, dtype)
        r = pycudnn.dnn_op_tensor("sqrt", pos, alpha1=4.0)
        assert err(r.get(), np.sqrt(4 * posv)) <= tol, dtype
        r = pycudnn.dnn_op_tensor("not", pos)
        assert err(r.get(), 1 - posv) <= tol, dtype
        # in place over a, beta accumulating
        pycudnn.dnn_op_tensor("add", ad, bd, beta=0.0, out=ad)
        assert err(ad.get(), a + b) <= tol, dtype


def test_equal_to_torch():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    x = torch.randn(4, 8, 5, 6, device="cuda").to(memory_format=torch.channels_last)
    pairs = [
        (pycudnn.dnn_activation(x, "relu"), F.relu(x)),
        (pycudnn.dnn_activation(x, "sigmoid"), torch.sigmoid(x)),
        (pycudnn.dnn_activation(x, "tanh"), torch.tanh(x)),
        (pycudnn.dnn_activation(x, "clipped_relu", 6.0), F.relu6(x)),
        (pycudnn.dnn_activation(x, "elu", 1.0), F.elu(x)),
        (pycudnn.dnn_activation(x, "swish", 1.0), F.silu(x)),
        (pycudnn.dnn_softmax(x), torch.softmax(x, 1)),
        (pycudnn.dnn_softmax(x, "log"), torch.log_softmax(x, 1)),
    ]
    for mine, theirs in pairs:
        t = torch.from_dlpack(mine)
        assert t.shape == theirs.shape
        torch.testing.assert_close(t, theirs, rtol=1e-5, atol=1e-6)
    # gradients against autograd
    xr = torch.randn(3, 7, device="cuda", requires_grad=True)
    y = torch.log_softmax(xr, 1)
    g = torch.randn_like(y)
    (gx,) = torch.autograd.grad(y, xr, g)
    mine = pycudnn.dnn_softmax_grad(g, y.detach(), "log")
    torch.testing.assert_close(torch.from_dlpack(mine), gx, rtol=1e-5, atol=1e-6)
    y = torch.nn.functional.elu(xr, 0.5)
    (gx,) = torch.autograd.grad(y, xr, g)
    mine = pycudnn.dnn_activation_grad(y.detach(), g, xr.detach(), "elu", 0.5)
    torch.testing.assert_close(torch.from_dlpack(mine), gx, rtol=1e-5, atol=1e-6)
    # the result lands in a torch tensor given as out, on torch's stream
    out = torch.full_like(x, float("nan"))
    pycudnn.dnn_activation(x, "relu", out=out)
    torch.testing.assert_close(out, F.relu(x))
