"""GPU tests of pooling (marker ``gpu``; skipped without a device).

Run on the GPU machine:
``PYTHONPATH=. python3 -m pytest -m gpu -q tests/highlevel/test_pool_gpu.py``.

References are float64 NumPy, written here (forward and backward, padding and strides), on small
fresh random inputs rounded to the tested dtype first, so only cuDNN's own rounding is measured,
as ``max |got - ref| / max |ref|``. Max-pooling inputs are distinct within each image plane and
exactly representable in every dtype (no ties, so the gradient's route is unique). Outputs are
poisoned with NaN before every call. Then: finite differences in float64, equality with
``torch.nn.functional.max_pool*``/``avg_pool*`` and their autograd gradients, staging of other
strides, NaN propagation, blending, streams, and the host cost of a repeated call.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from references import pool_grad_ref, pool_ref  # noqa: E402  (float64 references)

import pycudnn  # noqa: E402  (torch first: both then use the same libcudnn)
from pycudnn import memory  # noqa: E402
from pycudnn.highlevel import _call  # noqa: E402
from pycudnn.highlevel.pool import dnn_pool, dnn_pool_grad  # noqa: E402

pytestmark = pytest.mark.gpu

DTYPES = {
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp32": torch.float32,
    "fp64": torch.float64,
}
TOL = {"fp16": 5e-3, "bf16": 2e-2, "fp32": 1e-5, "fp64": 1e-12}
MODES = ("max", "max_deterministic", "average_inc_pad", "average_exc_pad", "sum")
rng = np.random.default_rng()


@pytest.fixture(autouse=True)
def _fresh_stream():
    yield
    pycudnn.get_handle().set_stream(0)


# ==================================================================================================
# float64 NumPy references
# ==================================================================================================
def distinct(shape):
    """Values distinct within each (n, c) plane, exact in fp16/bf16 (integers * 1/8 below 256),
    half of them negative (padding must never win a max)."""
    plane = math.prod(shape[2:])
    assert plane <= 256
    v = np.stack([rng.permutation(plane) for _ in range(shape[0] * shape[1])])
    return ((v - plane // 2) * 0.125).reshape(shape)


# ==================================================================================================
# Helpers
# ==================================================================================================
def dev(a, dt, layout="nchw"):
    """A torch device tensor of dtype *dt* in *layout* ('nchw' | 'nhwc')."""
    t = torch.from_numpy(np.ascontiguousarray(a)).to("cuda", DTYPES[dt])
    if layout == "nhwc":
        t = t.contiguous(
            memory_format=torch.channels_last if t.dim() == 4 else torch.channels_last_3d
        )
    return t


def nan_like(shape, dt, layout="nchw"):
    return dev(np.full(shape, np.nan), dt, layout)


def host(a):
    """float64 NumPy copy of a device array (torch tensor or pycudnn DeviceArray)."""
    if isinstance(a, torch.Tensor):
        torch.cuda.synchronize()
        return a.detach().double().cpu().numpy()
    return np.asarray(a.get(), dtype=np.float64)


def rel_err(got, want):
    scale = max(float(np.max(np.abs(want))), 1e-30)
    return float(np.max(np.abs(got - want))) / scale


def check(got, want, tol, what):
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert np.isfinite(got).all(), f"{what}: non-finite values (unwritten output?)"
    err = rel_err(got, want)
    assert err <= tol, f"{what}: max rel error {err:.3g} > {tol:g}"


def poison_cache(shape, dt):
    """Leave a NaN-filled block of this size in the allocator's cache, so a new output that
    reuses it and is not written shows up."""
    np_dt = {"fp16": np.float16, "bf16": np.float16, "fp32": np.float32, "fp64": np.float64}
    a = memory.empty(shape, np_dt[dt])
    a.fill_(np.nan)
    del a


GEOMETRY = {
    # nd: (input shape, window, stride, pad): overlapping windows, padding, uneven sizes
    2: ((2, 3, 7, 6), (3, 2), (2, 1), (1, 1)),
    3: ((2, 3, 5, 6, 4), (3, 2, 2), (2, 2, 1), (1, 0, 1)),
}


# ==================================================================================================
# Every mode x dtype x layout x rank against the float64 references
# ==================================================================================================
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("nd", [2, 3])
def test_against_reference(nd, dt, layout, mode):
    shape, ws, stride, pad = GEOMETRY[nd]
    x = distinct(shape) if mode.startswith("max") else rng.standard_normal(shape)
    xt = dev(x, dt, layout)
    x = host(xt)  # rounded to dt
    want = pool_ref(x, ws, stride, pad, mode)
    out = nan_like(want.shape, dt, layout)
    res = dnn_pool(xt, ws, stride, mode, pad, out=out)
    assert res is out
    check(host(out), want, 0.0 if mode.startswith("max") else TOL[dt], f"forward {mode}")

    poison_cache(want.shape, dt)
    y = dnn_pool(xt, ws, stride, mode, pad)  # a new output, in the input's layout
    assert y.shape == want.shape
    assert y.is_dense and (layout == "nhwc") == (y.strides[1] == y.itemsize)
    check(host(y), want, 0.0 if mode.startswith("max") else TOL[dt], f"new output {mode}")

    dy = host(dev(rng.standard_normal(want.shape), dt))
    dyt = dev(dy, dt, layout)
    yt = dev(want, dt, layout)  # the forward output (exact for max)
    want_dx = pool_grad_ref(x, dy, ws, stride, pad, mode)
    dx = nan_like(shape, dt, layout)
    res = dnn_pool_grad(xt, yt, dyt, ws, stride, mode, pad, img_grad=dx)
    assert res is dx
    check(host(dx), want_dx, TOL[dt], f"backward {mode}")
    poison_cache(shape, dt)
    check(host(dnn_pool_grad(xt, yt, dyt, ws, stride, mode, pad)), want_dx, TOL[dt], "new dx")


@pytest.mark.parametrize("dt", ["fp32", "fp64"])
def test_theano_defaults_stride_one_no_padding(dt):
    xt = dev(rng.standard_normal((2, 2, 6, 5)), dt)
    for mode, ref_mode in (("max", "max"), ("average", "average_inc_pad")):
        got = host(dnn_pool(xt, (3, 2), mode=mode))
        assert got.shape == (2, 2, 4, 4)
        check(got, pool_ref(host(xt), (3, 2), (1, 1), (0, 0), ref_mode), TOL[dt], mode)


def test_sum_is_average_times_the_window():
    x = dev(rng.standard_normal((2, 3, 6, 6)), "fp64")
    s = host(dnn_pool(x, (2, 3), (2, 1), "sum", (1, 1)))
    a = host(dnn_pool(x, (2, 3), (2, 1), "average_inc_pad", (1, 1)))
    check(s, a * 6, 1e-14, "sum")


# ==================================================================================================
# Gradients against finite differences (float64, tiny shapes)
# ==================================================================================================
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("nd", [2, 3])
def test_gradient_finite_differences(nd, mode):
    shape = (1, 2, 5, 4) if nd == 2 else (1, 1, 4, 3, 3)
    ws, stride, pad = ((3, 2), (2, 1), (1, 1)) if nd == 2 else ((2, 2, 3), (1, 2, 1), (1, 0, 1))
    # well-separated distinct values: a small step never changes which element is the max
    x = distinct(shape) * 8.0 if mode.startswith("max") else rng.standard_normal(shape)
    xt = dev(x, "fp64")
    y = dnn_pool(xt, ws, stride, mode, pad)
    dy = rng.standard_normal(y.shape)
    dyt = dev(dy, "fp64")
    got = host(dnn_pool_grad(xt, torch.from_dlpack(y), dyt, ws, stride, mode, pad))
    h = 1e-6
    num = np.zeros(x.size)
    for i in range(x.size):
        e = np.zeros(x.size)
        e[i] = h
        e = e.reshape(shape)
        up = host(dnn_pool(dev(x + e, "fp64"), ws, stride, mode, pad))
        down = host(dnn_pool(dev(x - e, "fp64"), ws, stride, mode, pad))
        num[i] = np.sum((up - down) * dy) / (2 * h)
    check(got, num.reshape(shape), 1e-7, f"finite differences {mode}")


# ==================================================================================================
# Equal to PyTorch
# ==================================================================================================
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("dt", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("nd", [2, 3])
def test_equals_torch(nd, dt, layout):
    shape = (2, 4, 9, 8) if nd == 2 else (2, 3, 7, 6, 5)
    ws, stride, pad = (3,) * nd, (2,) * nd, (1,) * nd
    xt = dev(distinct(shape), dt, layout)  # no ties: torch and cuDNN route max gradients alike
    mp = F.max_pool2d if nd == 2 else F.max_pool3d
    ap = F.avg_pool2d if nd == 2 else F.avg_pool3d
    cases = {
        "max": lambda t: mp(t, ws, stride, pad),
        "average_inc_pad": lambda t: ap(t, ws, stride, pad, count_include_pad=True),
        "average_exc_pad": lambda t: ap(t, ws, stride, pad, count_include_pad=False),
    }
    for mode, fn in cases.items():
        ref = fn(xt)
        got = host(dnn_pool(xt, ws, stride, mode, pad))
        if mode == "max":
            assert np.array_equal(got, host(ref)), "max pooling must equal torch's exactly"
        else:
            check(got, host(ref), TOL[dt], f"torch {mode}")
        dy = dev(rng.standard_normal(ref.shape), dt, layout)
        # torch's gradient computed on NCHW copies: torch 2.11's channels-last avg_pool2d
        # backward is wrong with padding or overlapping windows (checked against float64 NumPy)
        xr = xt.detach().contiguous().requires_grad_()
        fn(xr).backward(dy.contiguous())
        y = dnn_pool(xt, ws, stride, mode, pad)
        dx = host(dnn_pool_grad(xt, torch.from_dlpack(y), dy, ws, stride, mode, pad))
        check(dx, host(xr.grad), TOL[dt], f"torch grad {mode}")


def test_nan_propagates_through_max_like_torch():
    x = torch.randn(1, 2, 6, 6, device="cuda")
    x[0, 0, 2, 3] = float("nan")
    got = host(dnn_pool(x, (2, 2), (2, 2)))
    want = host(F.max_pool2d(x, 2))
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.isnan(got).sum() == 1
    assert np.array_equal(got[~np.isnan(got)], want[~np.isnan(want)])


# ==================================================================================================
# Staging, blending, streams
# ==================================================================================================
@pytest.mark.parametrize("dt", ["fp32", "bf16"])
def test_other_strides_are_staged(dt):
    ws, stride, pad = (3, 2), (2, 1), (1, 1)
    big = dev(rng.standard_normal((2, 3, 7, 9)), dt)
    sliced = big[..., :6]  # a view with a gap
    cn = dev(rng.standard_normal((3, 2, 7, 6)), dt).transpose(0, 1)  # N and C transposed
    for xt in (sliced, cn):
        x = host(xt)
        want = pool_ref(x, ws, stride, pad, "average_exc_pad")
        out = nan_like(want.shape, dt, "nhwc")[..., :]  # the other layout
        dnn_pool(xt, ws, stride, "average_exc_pad", pad, out=out)
        check(host(out), want, TOL[dt], "staged forward")
        outbig = nan_like((2, 3, 4, 10), dt)
        out_view = outbig[..., 2:9]
        dnn_pool(xt, ws, stride, "average_exc_pad", pad, out=out_view)
        check(host(out_view), want, TOL[dt], "into a view")
        assert np.isnan(host(outbig)[..., :2]).all() and np.isnan(host(outbig)[..., 9:]).all()
        dy = dev(rng.standard_normal(want.shape), dt)[..., :]
        dxbig = nan_like((2, 3, 7, 10), dt)
        dnn_pool_grad(
            xt, dev(want, dt), dy, ws, stride, "average_exc_pad", pad, img_grad=dxbig[..., 1:7]
        )
        want_dx = pool_grad_ref(x, host(dy), ws, stride, pad, "average_exc_pad")
        check(host(dxbig[..., 1:7]), want_dx, TOL[dt], "staged backward")


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_alpha_beta_blend(layout):
    shape, ws, stride, pad = (2, 3, 8, 8), (2, 2), (2, 2), (0, 0)
    xt = dev(rng.standard_normal(shape), "fp64", layout)
    old = rng.standard_normal((2, 3, 4, 4))
    out = dev(old, "fp64", layout)
    dnn_pool(xt, ws, stride, "average_inc_pad", pad, alpha=2.0, beta=-0.5, out=out)
    want = 2.0 * pool_ref(host(xt), ws, stride, pad, "average_inc_pad") - 0.5 * old
    check(host(out), want, 1e-12, "blend")
    # a staged output (the other layout) is blended by the final copy
    out2 = dev(old, "fp64", "nhwc" if layout == "nchw" else "nchw")
    dnn_pool(xt, ws, stride, "sum", pad, alpha=0.5, beta=2.0, out=out2)
    want = 0.5 * pool_ref(host(xt), ws, stride, pad, "sum") + 2.0 * old
    check(host(out2), want, 1e-12, "staged blend")
    dold = rng.standard_normal(shape)
    dx = dev(dold, "fp64", layout)
    dy = dev(rng.standard_normal((2, 3, 4, 4)), "fp64", layout)
    y = dnn_pool(xt, ws, stride, "max", pad)
    dnn_pool_grad(
        xt, torch.from_dlpack(y), dy, ws, stride, "max", pad, alpha=3.0, beta=1.0, img_grad=dx
    )
    want = 3.0 * pool_grad_ref(host(xt), host(dy), ws, stride, pad, "max") + dold
    check(host(dx), want, 1e-12, "backward blend")


def test_on_a_torch_stream():
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        xt = torch.randn(4, 8, 32, 32, device="cuda")
        y = dnn_pool(xt, (2, 2), (2, 2), stream=s)
        ref = F.max_pool2d(xt, 2)
    s.synchronize()
    assert np.array_equal(host(torch.from_dlpack(y)), host(ref))


def test_pool_accepts_every_device_array():
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    want = pool_ref(x.astype(np.float64), (2, 2), (2, 2), (0, 0), "max")
    check(host(dnn_pool(memory.to_device(x), (2, 2), (2, 2))), want, 0, "DeviceArray")
    cupy = pytest.importorskip("cupy")
    check(host(dnn_pool(cupy.asarray(x), (2, 2), (2, 2))), want, 0, "CuPy")


# ==================================================================================================
# Host cost of a repeated call (printed with -s; a loose bound only)
# ==================================================================================================
def _per_call(fn, batches=30, n=100):
    """Median host time of a call (us), in batches of *n* back-to-back calls with the GPU
    drained between batches (so the launch queue never fills and GPU time is not measured)."""
    for _ in range(100):
        fn()
    times = []
    for _ in range(batches):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t) / n)
    torch.cuda.synchronize()
    return float(np.median(times)) * 1e6


def test_repeated_call_is_cheap():
    x = torch.randn(8, 16, 16, 16, device="cuda")
    out = torch.empty(8, 16, 8, 8, device="cuda")
    y = F.max_pool2d(x, 2)
    dy = torch.randn_like(y)
    dx = torch.empty_like(x)
    calls = [
        lambda: dnn_pool(x, (2, 2), (2, 2), out=out),
        lambda: dnn_pool(x, (2, 2), (2, 2)),
        lambda: dnn_pool_grad(x, y, dy, (2, 2), (2, 2), img_grad=dx),
    ]
    for c in calls:
        c()
    entries = set(_call.calls().data)
    t_out, t_new, t_bwd = (_per_call(c) for c in calls)
    t_torch = _per_call(lambda: F.max_pool2d(x, 2))
    assert set(_call.calls().data) == entries  # repeats are cache hits: no new entry
    print(
        f"\nhost us/call: dnn_pool out= {t_out:.1f}, new output {t_new:.1f}, dnn_pool_grad "
        f"{t_bwd:.1f}; torch F.max_pool2d {t_torch:.1f}"
    )
    assert t_out < 3 * t_torch + 20
