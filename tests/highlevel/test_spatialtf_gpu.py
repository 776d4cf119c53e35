"""GPU tests of the spatial transformer functions (marker ``gpu``; skipped without a device).

Run on the GPU machine:
``PYTHONPATH=. python3 -m pytest -m gpu -q tests/highlevel/test_spatialtf_gpu.py``.

float64 NumPy references: the affine grid over ``linspace(-1, 1)`` (align_corners=True), bilinear
sampling with zero padding where -1/1 are the edge pixels' centres, and the analytic gradients
(scattered bilinear weights for the image, the weights' slopes for the grid, the grid's outer
product for theta). Gradients are also checked by central finite differences in float64, and
everything equals PyTorch's ``F.affine_grid``/``F.grid_sample`` with ``align_corners=True``.
Every dtype cuDNN supports x image layouts (C order, channels last, a strided view); strided
theta and grids (staged through packed copies).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from references import grid_grad_ref, grid_ref, sample_grad_ref, sample_ref

import pycudnn
from pycudnn.highlevel.spatialtf import (
    dnn_spatialtf,
    dnn_spatialtf_grad,
    dnn_spatialtf_grid,
    dnn_spatialtf_grid_grad,
    dnn_spatialtf_sampler,
    dnn_spatialtf_sampler_grad,
)

pytestmark = pytest.mark.gpu

DTYPES = ("float16", "float32", "float64")
LAYOUTS = ("nchw", "nhwc", "sliced")
TOL = {"float64": 1e-10, "float32": 2e-5, "float16": 1e-2}
rng = np.random.default_rng()


# ==================================================================================================
# helpers
# ==================================================================================================
def thetas(n):
    """Rotations, scales and shifts: some points land outside the image (zero padding)."""
    a = rng.uniform(-0.5, 0.5, n)
    s = rng.uniform(0.7, 1.25, n)
    t = rng.uniform(-0.2, 0.2, (n, 2))
    th = np.empty((n, 2, 3))
    th[:, 0, :2] = np.stack([s * np.cos(a), -s * np.sin(a)], -1)
    th[:, 1, :2] = np.stack([s * np.sin(a), s * np.cos(a)], -1)
    th[:, :, 2] = t
    return th


def dev(x64, dtype, layout="nchw"):
    x = x64.astype(dtype)
    if layout == "nhwc":
        d = pycudnn.to_device(np.ascontiguousarray(x.transpose(0, 2, 3, 1))).transpose(0, 3, 1, 2)
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
    assert got.shape == want.shape
    assert not np.isnan(got).any(), "NaN in the output (an element was not written)"
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


# ==================================================================================================
# tests
# ==================================================================================================
@pytest.mark.parametrize("dtype", DTYPES)
def test_grid_and_its_gradient(dtype):
    n, h, w = 3, 5, 7
    theta, th64 = dev(thetas(n), dtype)
    out = poisoned((n, h, w, 2), dtype)
    assert dnn_spatialtf_grid(theta, (n, 4, h, w), out=out) is out
    assert err(out.get(), grid_ref(th64, h, w)) <= TOL[dtype]
    dgrid, dg64 = dev(rng.standard_normal((n, h, w, 2)), dtype)
    dtheta = poisoned((n, 2, 3), dtype)
    dnn_spatialtf_grid_grad(dgrid, out=dtheta)
    assert err(dtheta.get(), grid_grad_ref(dg64)) <= TOL[dtype]
    # strided theta and dgrid are copied to C order first
    tt = pycudnn.to_device(np.ascontiguousarray(th64.astype(dtype).transpose(1, 2, 0)))
    assert (
        err(dnn_spatialtf_grid(tt.transpose(2, 0, 1), (n, 1, h, w)).get(), grid_ref(th64, h, w))
        <= TOL[dtype]
    )
    dgt = pycudnn.to_device(np.ascontiguousarray(dg64.astype(dtype).transpose(3, 0, 1, 2)))
    got = dnn_spatialtf_grid_grad(dgt.transpose(1, 2, 3, 0)).get()
    assert err(got, grid_grad_ref(dg64)) <= TOL[dtype]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_sampler_and_its_gradients(dtype, layout):
    n, c, h, w, ho, wo = 2, 3, 6, 5, 4, 7
    img, img64 = dev(rng.standard_normal((n, c, h, w)), dtype, layout)
    grid, g64 = dev(grid_ref(thetas(n), ho, wo), dtype)
    out = poisoned((n, c, ho, wo), dtype)
    assert dnn_spatialtf_sampler(img, grid, out=out) is out
    assert err(out.get(), sample_ref(img64, g64)) <= TOL[dtype]
    y = dnn_spatialtf_sampler(img, grid)
    assert err(y.get(), sample_ref(img64, g64)) <= TOL[dtype]
    if layout == "nhwc":
        assert not y.is_c_contiguous and y.is_dense  # a new output in img's memory order
    dy, dy64 = dev(rng.standard_normal((n, c, ho, wo)), dtype, layout)
    dimg, dgrid = poisoned((n, c, h, w), dtype), poisoned((n, ho, wo, 2), dtype)
    got = dnn_spatialtf_sampler_grad(img, grid, dy, out=(dimg, dgrid))
    assert got[0] is dimg and got[1] is dgrid
    want_img, want_grid = sample_grad_ref(img64, g64, dy64)
    assert err(dimg.get(), want_img) <= 2 * TOL[dtype]
    assert err(dgrid.get(), want_grid) <= 2 * TOL[dtype]


def test_blending():
    n, c, h, w = 2, 3, 4, 5
    img, img64 = dev(rng.standard_normal((n, c, h, w)), "float64")
    grid, g64 = dev(grid_ref(thetas(n), 3, 4), "float64")
    prior = rng.standard_normal((n, c, 3, 4))
    out = pycudnn.to_device(prior)
    dnn_spatialtf_sampler(img, grid, alpha=2.0, beta=-0.5, out=out)
    assert err(out.get(), 2 * sample_ref(img64, g64) - 0.5 * prior) <= 1e-10
    dy = rng.standard_normal((n, c, 3, 4))
    p_img, p_grid = rng.standard_normal((n, c, h, w)), rng.standard_normal((n, 3, 4, 2))
    outs = (pycudnn.to_device(p_img), pycudnn.to_device(p_grid))
    dnn_spatialtf_sampler_grad(img, grid, pycudnn.to_device(dy), alpha=3.0, beta=1.0, out=outs)
    wi, wg = sample_grad_ref(img64, g64, dy)
    assert err(outs[0].get(), 3 * wi + p_img) <= 1e-10
    assert err(outs[1].get(), 3 * wg + p_grid) <= 1e-10


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("sw", "sh"), [(1, 1), (2, 0.5), (0.6, 1.7)])
def test_whole_transformer(dtype, sw, sh):
    n, c, h, w = 2, 3, 5, 6
    img, img64 = dev(rng.standard_normal((n, c, h, w)), dtype, "nhwc")
    theta, th64 = dev(thetas(n), dtype)
    ho, wo = math.ceil(h * sh - 1e-9), math.ceil(w * sw - 1e-9)
    y = dnn_spatialtf(img, theta, sw, sh)
    assert y.shape == (n, c, ho, wo)
    g64 = dnn_spatialtf_grid(theta, (n, c, ho, wo)).get().astype(np.float64)  # as cuDNN rounds
    assert err(g64, grid_ref(th64, ho, wo)) <= TOL[dtype]
    assert err(y.get(), sample_ref(img64, g64)) <= TOL[dtype]
    dy, dy64 = dev(rng.standard_normal((n, c, ho, wo)), dtype)
    dimg, dtheta = dnn_spatialtf_grad(img, theta, dy, sw, sh)
    want_img, want_grid = sample_grad_ref(img64, g64, dy64)
    assert err(dimg.get(), want_img) <= 2 * TOL[dtype]
    assert err(dtheta.get(), grid_grad_ref(want_grid)) <= 4 * TOL[dtype]


def test_gradients_by_finite_differences():
    n, c, h, w, ho, wo = 1, 2, 4, 5, 3, 4
    img64 = rng.standard_normal((n, c, h, w))
    th64 = thetas(n)
    dy64 = rng.standard_normal((n, c, ho, wo))
    img, theta, dy = (pycudnn.to_device(a) for a in (img64, th64, dy64))

    def loss(i, t):
        y = dnn_spatialtf(pycudnn.to_device(i), pycudnn.to_device(t), wo / w, ho / h)
        return float((y.get() * dy64).sum())

    dimg, dtheta = dnn_spatialtf_grad(img, theta, dy, wo / w, ho / h)
    eps = 1e-6
    for arr, got in ((img64, dimg.get()), (th64, dtheta.get())):
        fd = np.zeros_like(arr)
        for i in np.ndindex(arr.shape):
            e = np.zeros_like(arr)
            e[i] = eps
            if arr is img64:
                fd[i] = (loss(img64 + e, th64) - loss(img64 - e, th64)) / (2 * eps)
            else:
                fd[i] = (loss(img64, th64 + e) - loss(img64, th64 - e)) / (2 * eps)
        np.testing.assert_allclose(got, fd, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dtype", ("float32", "float64"))
def test_equal_to_torch(dtype):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    tdt = getattr(torch, dtype)
    n, c, h, w = 3, 4, 6, 5
    img = torch.randn(n, c, h, w, device="cuda", dtype=tdt).to(memory_format=torch.channels_last)
    theta = torch.as_tensor(thetas(n), device="cuda", dtype=tdt)
    img.requires_grad_()
    theta.requires_grad_()
    grid = F.affine_grid(theta, (n, c, 8, 7), align_corners=True)
    want = F.grid_sample(img, grid, "bilinear", "zeros", align_corners=True)
    dy = torch.randn_like(want)
    want_img, want_theta = torch.autograd.grad(want, (img, theta), dy)
    tol = 10 * TOL[dtype]

    def close(got, ref):
        got = torch.as_tensor(got, device="cuda")
        return ((got - ref).abs().max() / ref.abs().max()).item() <= tol

    assert close(dnn_spatialtf_grid(theta.detach(), (n, c, 8, 7)), grid)
    assert close(dnn_spatialtf(img.detach(), theta.detach(), 7 / 5, 8 / 6), want)
    dimg, dtheta = dnn_spatialtf_grad(img.detach(), theta.detach(), dy, 7 / 5, 8 / 6)
    assert close(dimg, want_img) and close(dtheta, want_theta)
    g = grid.detach().requires_grad_()
    ref = F.grid_sample(img, g, "bilinear", "zeros", align_corners=True)
    ri, rg = torch.autograd.grad(ref, (img, g), dy)
    si, sg = dnn_spatialtf_sampler_grad(img.detach(), grid.detach(), dy)
    assert close(si, ri) and close(sg, rg)
