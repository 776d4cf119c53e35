"""GPU tests of dnn_ctc_loss (marker ``gpu``; skipped without a device).

Run on the GPU machine:
``PYTHONPATH=. python3 -m pytest -m gpu -q tests/highlevel/test_ctc_gpu.py``.

The float64 NumPy reference is the CTC forward-backward recursion in log space written here:
the loss ``-log p(labels | x)`` and the gradient w.r.t. the softmax input,
``exp(log_probs) - posterior occupancy`` (0 past a sample's input length; a sample that cannot
fit its labels gets loss 0 and gradient 0, cuDNN's zero_oob mode). The gradient is also
checked by finite differences of the loss of ``log_softmax(logits)`` in float64, and loss and
gradient equal PyTorch's ``F.ctc_loss`` (float64, its own kernels) for every reduction.
"""

from __future__ import annotations

import numpy as np
import pytest
from references import ctc_ref, log_softmax

import pycudnn
from pycudnn.highlevel.ctc import dnn_ctc_loss

pytestmark = pytest.mark.gpu

TOL = {"float32": 1e-5, "float64": 1e-10}
rng = np.random.default_rng()


def problem(t=16, n=4, c=6, dtype="float32", lens=None, ilens=None, repeats=True):
    lens = rng.integers(1, 5, n) if lens is None else np.asarray(lens)
    ilens = rng.integers(lens * 2 + 1, t + 1) if ilens is None else np.asarray(ilens)
    labels = rng.integers(1, c, lens.sum())
    if repeats and lens[0] >= 2:
        labels[1] = labels[0]  # a repeated label needs a blank between
    lp = log_softmax(rng.standard_normal((t, n, c))).astype(dtype)
    i32 = [pycudnn.to_device(a.astype(np.int32)) for a in (labels, lens, ilens)]
    return pycudnn.to_device(lp), *i32, lp.astype(np.float64), labels, lens, ilens


def poisoned(shape, dtype):
    out = pycudnn.empty(shape, dtype)
    out.fill_(float("nan"))
    return out


def err(got, want):
    got = np.asarray(got, np.float64)
    assert not np.isnan(got).any(), "NaN in the output (an element was not written)"
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


@pytest.mark.parametrize("dtype", ("float32", "float64"))
@pytest.mark.parametrize("algo", ("deterministic", "non_deterministic"))
def test_loss_and_gradient(dtype, algo):
    lp, labels, lens, ilens, lp64, lab, ln, il = problem(dtype=dtype)
    outs = (poisoned((4,), dtype), poisoned(lp.shape, dtype))
    loss, grad = dnn_ctc_loss(lp, labels, lens, ilens, algo, out=outs)
    assert loss is outs[0] and grad is outs[1]
    want_loss, want_grad = ctc_ref(lp64, lab, ln, il)
    assert err(loss.get(), want_loss) <= TOL[dtype]
    assert err(grad.get(), want_grad) <= 10 * TOL[dtype]
    g = grad.get()
    for b in range(4):
        assert (g[il[b] :, b] == 0).all()  # past the input length


@pytest.mark.parametrize("dtype", ("float32", "float64"))
@pytest.mark.parametrize("reduction", ("sum", "mean"))
def test_reductions(dtype, reduction):
    lp, labels, lens, ilens, lp64, lab, ln, il = problem(dtype=dtype, n=5)
    loss, grad = dnn_ctc_loss(lp, labels, lens, ilens, reduction=reduction)
    assert loss.shape == () and grad.shape == lp.shape
    per, g = ctc_ref(lp64, lab, ln, il)
    w = np.ones(5) if reduction == "sum" else 1 / (5 * ln)
    assert err(loss.get(), (per * w).sum()) <= TOL[dtype]
    assert err(grad.get(), g * w[None, :, None]) <= 10 * TOL[dtype]
    # a batch of one: no reduction kernel, a copy
    lp1, labels1, lens1, ilens1, lp164, lab1, ln1, il1 = problem(dtype=dtype, n=1, lens=[3])
    loss1, _ = dnn_ctc_loss(lp1, labels1, lens1, ilens1, reduction=reduction)
    want = ctc_ref(lp164, lab1, ln1, il1)[0][0] / (1 if reduction == "sum" else 3)
    assert err(loss1.get(), np.float64(want)) <= TOL[dtype]


def test_strided_log_probs_and_gradient():
    t, n, c = 12, 3, 5
    lp64 = log_softmax(rng.standard_normal((n, t, c)))
    lp = pycudnn.to_device(lp64.astype(np.float32)).transpose(1, 0, 2)  # (T, N, C), strided
    lens, ilens = np.array([2, 3, 1]), np.array([12, 9, 5])
    labels = rng.integers(1, c, lens.sum())
    ints = [pycudnn.to_device(a.astype(np.int32)) for a in (labels, lens, ilens)]
    big = poisoned((n, t, c), np.float32)
    gout = big.transpose(1, 0, 2)
    loss, grad = dnn_ctc_loss(lp, *ints, out=(None, gout))
    want_loss, want_grad = ctc_ref(lp64.transpose(1, 0, 2), labels, lens, ilens)
    assert err(loss.get(), want_loss) <= 1e-5
    assert err(grad.get(), want_grad) <= 1e-4 and grad is gout


def test_infeasible_sample_is_zeroed():
    # labels (1, 1, 1) need 5 steps (blanks between repeats): 4 are too few
    lens, ilens = np.array([3, 2]), np.array([4, 10])
    labels = np.array([1, 1, 1, 2, 3])
    lp64 = log_softmax(rng.standard_normal((10, 2, 4)))
    ints = [pycudnn.to_device(a.astype(np.int32)) for a in (labels, lens, ilens)]
    loss, grad = dnn_ctc_loss(pycudnn.to_device(lp64), *ints)
    want_loss, want_grad = ctc_ref(lp64, labels, lens, ilens)
    assert loss.get()[0] == 0 and (grad.get()[:, 0] == 0).all()
    assert err(loss.get(), want_loss) <= 1e-10 and err(grad.get(), want_grad) <= 1e-9


def test_gradient_by_finite_differences():
    t, n, c = 7, 2, 4
    u = rng.standard_normal((t, n, c))
    lens, ilens = np.array([2, 1]), np.array([7, 5])
    labels = np.array([1, 3, 2])
    ints = [pycudnn.to_device(a.astype(np.int32)) for a in (labels, lens, ilens)]

    def total(v):
        return float(
            dnn_ctc_loss(
                pycudnn.to_device(log_softmax(v)), *ints, reduction="sum", compute_grad=False
            )[0].get()
        )

    _, grad = dnn_ctc_loss(pycudnn.to_device(log_softmax(u)), *ints)
    eps = 1e-6
    fd = np.zeros_like(u)
    for i in np.ndindex(u.shape):
        e = np.zeros_like(u)
        e[i] = eps
        fd[i] = (total(u + e) - total(u - e)) / (2 * eps)
    np.testing.assert_allclose(grad.get(), fd, rtol=1e-5, atol=1e-8)


def test_value_checks_read_device_data():
    lp, labels, lens, ilens, *_ = problem(n=2, lens=[2, 3], ilens=[16, 16])
    bad = pycudnn.to_device(np.array([1, 2, 0, 3, 4], np.int32))
    with pytest.raises(ValueError, match=r"labels\[2\]=0 is out of range"):
        dnn_ctc_loss(lp, bad, lens, ilens)
    short = pycudnn.to_device(np.array([16, 2], np.int32))
    with pytest.raises(ValueError, match=r"label_lengths\[1\]=3 exceeds input_lengths\[1\]=2"):
        dnn_ctc_loss(lp, labels, lens, short)


@pytest.mark.parametrize("reduction", ("none", "sum", "mean"))
def test_equal_to_torch(reduction):
    torch = pytest.importorskip("torch")
    t, n, c = 20, 4, 7
    lp = torch.randn(t, n, c, device="cuda", dtype=torch.float64).log_softmax(2)
    lens = torch.tensor([3, 5, 1, 4], device="cuda")
    ilens = torch.tensor([20, 14, 9, 11], device="cuda")
    labels = torch.randint(1, c, (int(lens.sum()),), device="cuda")
    labels[1] = labels[0]
    leaf = lp.detach().requires_grad_()
    want = torch.nn.functional.ctc_loss(leaf, labels, ilens, lens, 0, reduction, True)
    (want_grad,) = torch.autograd.grad(want.sum(), leaf)
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 1e-5)):
        loss, grad = dnn_ctc_loss(
            lp.to(dtype), labels.int(), lens.int(), ilens.int(), reduction=reduction
        )
        loss = torch.as_tensor(loss, device="cuda").double()
        grad = torch.as_tensor(grad, device="cuda").double()
        assert ((loss - want).abs().max() / want.abs().max()).item() <= tol
        assert ((grad - want_grad).abs().max() / want_grad.abs().max()).item() <= 10 * tol
