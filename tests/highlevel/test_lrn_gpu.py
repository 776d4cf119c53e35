"""GPU tests of dnn_lrn / dnn_lrn_grad (marker ``gpu``; skipped without a device).

Run on the GPU machine:
``PYTHONPATH=. python3 -m pytest -m gpu -q tests/highlevel/test_lrn_gpu.py``.

The float64 NumPy references implement cuDNN's documented formula (window
``[c - (n - 1) // 2, c + n // 2]``, ``alpha / n``) and its analytic gradient; the gradient is
also checked by central finite differences in float64, and both directions equal PyTorch's
``F.local_response_norm`` for odd windows (PyTorch's even windows are one channel earlier).
Every dtype cuDNN supports x layouts (C order, channels last, a strided view, 2-D to 5-D).
"""

from __future__ import annotations

import numpy as np
import pytest
from references import lrn_grad_ref, lrn_ref

import pycudnn
from pycudnn.highlevel.lrn import dnn_lrn, dnn_lrn_grad

pytestmark = pytest.mark.gpu

DTYPES = ("float16", "float32", "float64")
TOL = {"float64": 1e-12, "float32": 1e-5, "float16": 5e-3}
rng = np.random.default_rng()


def dev(x64, dtype, layout="nchw"):
    x = x64.astype(dtype)
    if layout == "nhwc":
        perm = (0, *range(2, x.ndim), 1)
        d = pycudnn.to_device(np.ascontiguousarray(x.transpose(perm))).transpose(*np.argsort(perm))
    elif layout == "sliced":
        big = np.zeros((*x.shape[:-1], 2 * x.shape[-1]), dtype)
        big[..., ::2] = x
        d = pycudnn.to_device(big)[..., ::2]
    else:
        d = pycudnn.to_device(x)
    return d, x.astype(np.float64)


def poisoned(shape, dtype):
    out = pycudnn.empty(shape, dtype)
    out.fill_(float("nan"))
    return out


def err(got, want):
    got = np.asarray(got, np.float64)
    assert not np.isnan(got).any(), "NaN in the output (an element was not written)"
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


CASES = [  # (shape, layout)
    ((2, 7, 5, 6), "nchw"),
    ((2, 7, 5, 6), "nhwc"),
    ((2, 7, 5, 6), "sliced"),
    ((3, 9, 4), "nchw"),
    ((2, 6, 3, 4, 2), "nhwc"),
    ((4, 10), "nchw"),
]


PARAMS = [(5, 1e-1, 0.75, 2.0), (4, 0.5, 0.5, 1.0), (1, 1e-4, 0.75, 2.0), (16, 2.0, 1.5, 1e-3)]


@pytest.mark.parametrize(("shape", "layout"), CASES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "alpha", "beta", "k"), PARAMS)
def test_forward_and_backward(shape, layout, dtype, n, alpha, beta, k):
    x, x64 = dev(rng.standard_normal(shape), dtype, layout)
    out = poisoned(shape, dtype)
    assert dnn_lrn(x, n, alpha, beta, k, out=out) is out
    want, _ = lrn_ref(x64, n, alpha, beta, k)
    assert err(out.get(), want) <= TOL[dtype]
    y = dnn_lrn(x, n, alpha, beta, k)  # a new output: x's memory order (5-D: packed NCDHW)
    assert y.shape == shape
    if len(shape) == 5:
        assert y.is_c_contiguous
    elif x.is_dense:
        assert y.strides == x.strides
    dy, dy64 = dev(rng.standard_normal(shape), dtype, layout)
    dx = poisoned(shape, dtype)
    dnn_lrn_grad(y, dy, x, n, alpha, beta, k, out=dx)
    want = lrn_grad_ref(x64, dy64, n, alpha, beta, k)
    assert err(dx.get(), want) <= 2 * TOL[dtype]


def test_5d_channels_last_goes_through_packed_copies():
    """cuDNN refuses 5-D operands whose spatial dims are not packed (BAD_PARAM)."""
    shape = (2, 5, 3, 4, 2)
    x, x64 = dev(rng.standard_normal(shape), "float32", "nhwc")
    dy, dy64 = dev(rng.standard_normal(shape), "float32", "nhwc")
    big = pycudnn.empty((2, 3, 4, 2, 5), np.float32)
    big.fill_(float("nan"))
    out = big.transpose(0, 4, 1, 2, 3)  # channels-last out: computed packed, then copied
    dnn_lrn(x, 3, 0.5, 0.75, 2.0, out=out)
    assert err(out.get(), lrn_ref(x64, 3, 0.5, 0.75, 2.0)[0]) <= TOL["float32"]
    dx = pycudnn.empty((2, 3, 4, 2, 5), np.float32).transpose(0, 4, 1, 2, 3)
    dnn_lrn_grad(out, dy, x, 3, 0.5, 0.75, 2.0, out=dx)
    assert err(dx.get(), lrn_grad_ref(x64, dy64, 3, 0.5, 0.75, 2.0)) <= 2 * TOL["float32"]


def test_gradient_by_finite_differences():
    shape, n, alpha, beta, k = (2, 6, 3, 2), 3, 0.8, 0.75, 1.5
    x64 = rng.standard_normal(shape)
    dy64 = rng.standard_normal(shape)
    x = pycudnn.to_device(x64)
    dx = dnn_lrn_grad(
        dnn_lrn(x, n, alpha, beta, k), pycudnn.to_device(dy64), x, n, alpha, beta, k
    ).get()
    eps = 1e-6
    fd = np.zeros_like(x64)
    for i in np.ndindex(shape):
        e = np.zeros_like(x64)
        e[i] = eps
        plus = dnn_lrn(pycudnn.to_device(x64 + e), n, alpha, beta, k).get()
        minus = dnn_lrn(pycudnn.to_device(x64 - e), n, alpha, beta, k).get()
        fd[i] = ((plus - minus) * dy64).sum() / (2 * eps)
    np.testing.assert_allclose(dx, fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("dtype", ("float32", "float64"))
@pytest.mark.parametrize("n", (1, 3, 5, 7))
def test_equal_to_torch(dtype, n):
    torch = pytest.importorskip("torch")
    tdt = getattr(torch, dtype)
    x = torch.randn(2, 9, 5, 4, device="cuda", dtype=tdt).to(memory_format=torch.channels_last)
    x.requires_grad_()
    want = torch.nn.functional.local_response_norm(x, n, 1e-2, 0.75, 2.0)
    dy = torch.randn_like(want)
    (want_dx,) = torch.autograd.grad(want, x, dy)
    y = dnn_lrn(x.detach(), n, 1e-2, 0.75, 2.0)
    tol = 10 * TOL[dtype]
    got = torch.as_tensor(y, device="cuda")
    assert ((got - want).abs().max() / want.abs().max()).item() <= tol
    dx = torch.full_like(x, float("nan"))
    dnn_lrn_grad(y, dy, x.detach(), n, 1e-2, 0.75, 2.0, out=dx)
    assert ((dx - want_dx).abs().max() / want_dx.abs().max()).item() <= tol
