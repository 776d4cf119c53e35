"""GPU tests of dnn_dropout / dnn_dropout_grad and DropoutState (marker ``gpu``).

Run on the GPU machine:
``PYTHONPATH=. python3 -m pytest -m gpu -q tests/highlevel/test_dropout_gpu.py``.

Checked against the definition, in float64 NumPy on the values read back: every element is
either 0 or ``x / (1 - p)`` (p as a float32, as cuDNN takes it); the keep rate is within 5 sigma
of ``1 - p``; the backward pass applies the very mask of the forward pass (same zeros, same
scale), whatever the layout of ``dy``; the same seed gives the same mask; a reused state gives a
new mask without re-initialising its RNG.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import pycudnn
from pycudnn.highlevel.dropout import DropoutState, dnn_dropout, dnn_dropout_grad

pytestmark = pytest.mark.gpu

DTYPES = ("float16", "float32", "float64")
LAYOUTS = ("nchw", "nhwc", "sliced")
TOL = {"float64": 1e-6, "float32": 1e-6, "float16": 2e-3}  # p is a float32 in cuDNN
rng = np.random.default_rng()


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


def positive(shape):
    return rng.uniform(0.5, 2.0, shape)  # no zeros: a zero output means dropped


def check_mask(y, x, p, dtype):
    """The kept mask of y = dropout(x); asserts the values and the keep rate."""
    assert not np.isnan(y).any()
    keep = y != 0
    scale = 1.0 / (1.0 - float(np.float32(p)))
    np.testing.assert_allclose(y[keep], x[keep] * scale, rtol=TOL[dtype])
    n = keep.size
    sigma = np.sqrt(n * p * (1 - p))
    assert abs(keep.sum() - n * (1 - p)) <= 5 * sigma + 1, (keep.mean(), 1 - p)
    return keep


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", (0.3, 0.75))
def test_forward_backward_same_mask(p, dtype, layout):
    shape = (8, 16, 12, 10)
    x, x64 = dev(positive(shape), dtype, layout)
    y, st = dnn_dropout(x, p, seed=int(rng.integers(2**63)))
    assert y.shape == shape and y.dtype == np.dtype(dtype) and st.mask_shape == shape
    keep = check_mask(y.get().astype(np.float64), x64, p, dtype)
    dy, dy64 = dev(positive(shape), dtype, layout)
    out = poisoned(shape, dtype)
    assert dnn_dropout_grad(dy, st, out=out) is out
    dx = out.get().astype(np.float64)
    np.testing.assert_array_equal(dx != 0, keep)  # the very mask of the forward call
    scale = 1.0 / (1.0 - float(np.float32(p)))
    np.testing.assert_allclose(dx[keep], dy64[keep] * scale, rtol=TOL[dtype])
    st.close()


def test_mask_follows_the_logical_order():
    """Forward on C-order data, backward on channels-last (and the other way round)."""
    shape = (4, 6, 5, 3)
    x, x64 = dev(positive(shape), "float32", "nchw")
    y, st = dnn_dropout(x, 0.5, seed=3)
    keep = y.get() != 0
    dy, _ = dev(positive(shape), "float32", "nhwc")
    np.testing.assert_array_equal(dnn_dropout_grad(dy, st).get() != 0, keep)
    xn, _ = dev(x64, "float32", "nhwc")
    yn, _ = dnn_dropout(xn, 0.5, seed=3)  # same seed, another layout: the same logical mask
    np.testing.assert_array_equal(yn.get() != 0, keep)


def test_same_seed_same_mask_and_reuse_advances():
    x, _ = dev(positive((64, 32, 8)), "float32")
    y1, st1 = dnn_dropout(x, 0.4, seed=1234)
    y2, st2 = dnn_dropout(x, 0.4, seed=1234)
    m1 = y1.get() != 0
    np.testing.assert_array_equal(y2.get() != 0, m1)
    y3, _ = dnn_dropout(x, 0.4, state=st1)  # the next mask of st1's stream
    m3 = y3.get() != 0
    assert (m3 != m1).any()
    y4, _ = dnn_dropout(x, 0.4, seed=1234, state=st1)  # restarted: the first mask again
    np.testing.assert_array_equal(y4.get() != 0, m1)
    y5, _ = dnn_dropout(x, 0.4, state=st2)  # st2 continues like st1 did
    np.testing.assert_array_equal(y5.get() != 0, m3)
    y6, _ = dnn_dropout(x, 0.4)  # a fresh random seed
    assert (y6.get() != 0).mean() != pytest.approx(0.0)
    y7, _st7 = dnn_dropout(x, 0.4, seed=99)
    assert ((y7.get() != 0) != m1).any()


def test_p_changes_reuse_the_state():
    x, x64 = dev(positive((32, 32, 16)), "float32")
    st = DropoutState(seed=8)
    for p in (0.1, 0.6, 0.0, 0.9):
        y, _ = dnn_dropout(x, p, state=st)
        assert st.p == p
        if p == 0.0:
            np.testing.assert_array_equal(y.get(), x64.astype(np.float32))
        else:
            check_mask(y.get().astype(np.float64), x64, p, "float32")


def test_reserve_space_grows_and_shapes_are_checked():
    st = DropoutState(seed=5)
    small, _ = dev(positive((2, 3, 4)), "float64")
    big, big64 = dev(positive((64, 64, 32)), "float64")
    dnn_dropout(small, 0.5, state=st)
    n0 = st.nbytes
    y, _ = dnn_dropout(big, 0.5, state=st)
    assert st.nbytes > n0 and st.mask_shape == (64, 64, 32)
    keep = check_mask(y.get(), big64, 0.5, "float64")
    with pytest.raises(ValueError, match="but the state's mask"):
        dnn_dropout_grad(small, st)
    dy, _dy64 = dev(positive((64, 64, 32)), "float64")
    np.testing.assert_array_equal(dnn_dropout_grad(dy, st).get() != 0, keep)
    dnn_dropout(small, 0.5, state=st)
    assert st.nbytes > n0  # kept for the next large input


def test_in_place():
    x, x64 = dev(positive((16, 8, 8)), "float32")
    y, st = dnn_dropout(x, 0.5, seed=2, out=x)
    assert y is x
    keep = check_mask(x.get().astype(np.float64), x64, 0.5, "float32")
    dy, _dy64 = dev(positive((16, 8, 8)), "float32")
    dnn_dropout_grad(dy, st, out=dy)
    np.testing.assert_array_equal(dy.get() != 0, keep)


def test_reuse_does_not_reinitialise_the_rng():
    x, _ = dev(positive((4, 64)), "float32")
    st = DropoutState(seed=1)
    dnn_dropout(x, 0.5, state=st)
    pycudnn.get_handle().synchronize()
    t0 = time.perf_counter()
    for _ in range(50):
        dnn_dropout(x, 0.5, state=st)
    pycudnn.get_handle().synchronize()
    per_call = (time.perf_counter() - t0) / 50
    assert per_call < 2e-3, f"{per_call * 1e3:.2f} ms per call: the RNG is re-initialised?"


def test_empty_and_torch_operands():
    torch = pytest.importorskip("torch")
    y, st = dnn_dropout(pycudnn.empty((0, 5), np.float32), 0.5)
    assert y.shape == (0, 5) and dnn_dropout_grad(pycudnn.empty((0, 5), np.float32), st).shape
    t = torch.rand(32, 16, 8, device="cuda") + 0.5
    out = torch.full_like(t, float("nan"))
    y, st = dnn_dropout(t, 0.25, seed=11, out=out)
    assert y is out
    keep = check_mask(out.double().cpu().numpy(), t.double().cpu().numpy(), 0.25, "float32")
    dx = torch.as_tensor(dnn_dropout_grad(torch.ones_like(t), st), device="cuda")
    np.testing.assert_array_equal(dx.cpu().numpy() != 0, keep)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_given_mask_gives_the_states_mask(dtype):
    """``out_mask``: the same seed gives the same output as the state's own reserve, and the
    gradient through the given mask (another state lending its descriptor, with another p until
    restored) equals the state's, element for element."""
    shape = (6, 10, 9, 7)
    x, x64 = dev(positive(shape), dtype)
    dy, _ = dev(positive(shape), dtype, "nhwc")
    y_ref, st = dnn_dropout(x, 0.3, seed=99)
    dx_ref = dnn_dropout_grad(dy, st).get()
    mask = pycudnn.empty((pycudnn.dropout_mask_bytes(shape, dtype),), "uint8")
    y = poisoned(shape, dtype)
    st2 = DropoutState(seed=99)
    dnn_dropout(x, 0.3, state=st2, out=y, out_mask=mask)
    np.testing.assert_array_equal(y.get(), y_ref.get())
    check_mask(y.get().astype(np.float64), x64, 0.3, dtype)
    lender = DropoutState(seed=5)
    dnn_dropout(x, 0.6, state=lender)  # bound, with another p
    out = poisoned(shape, dtype)
    dnn_dropout_grad(dy, lender, mask=mask, p=0.3, out=out)
    np.testing.assert_array_equal(out.get(), dx_ref)
    for s in (st, st2, lender):
        s.close()
