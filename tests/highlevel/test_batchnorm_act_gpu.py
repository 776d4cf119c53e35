"""GPU tests of the fused batch norm + ReLU (+ residual) (marker ``gpu``; skipped without a device
or torch): ``dnn_batch_normalization_act_train`` / ``_grad`` against float64 references of the same
rounded inputs, outputs poisoned with NaN first, float16 and bfloat16, with and without the
residual and the running averages; the reserve-size query against what the forward returns.

Run on the GPU machine:
``PYTHONPATH=. python3 -m pytest -m gpu -q tests/highlevel/test_batchnorm_act_gpu.py``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import pycudnn  # noqa: E402  (torch first: both then use the same libcudnn)

pytestmark = pytest.mark.gpu

CL = torch.channels_last
# max |got - ref| / max |ref|: one rounding of the output (bfloat16 8 bits, float16 11 bits)
TOL = {torch.float16: 4e-3, torch.bfloat16: 2e-2}
SHAPES = [(8, 64, 14, 14), (4, 256, 7, 7), (2, 32, 9, 5)]


def _rel(got, ref) -> float:
    got, ref = got.double(), ref.double()
    return float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def _nan(like, dtype=None, fmt=torch.contiguous_format):
    return torch.full_like(like, float("nan"), dtype=dtype).contiguous(memory_format=fmt)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("residual", [False, True], ids=["bn_relu", "bn_add_relu"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_forward_and_backward_against_float64(dtype, residual, shape):
    torch.manual_seed(0)
    n, c = shape[:2]
    x = (torch.randn(shape, device="cuda") * 2 + 0.5).to(dtype, memory_format=CL)
    z = torch.randn(shape, device="cuda").to(dtype, memory_format=CL) if residual else None
    gamma = torch.rand(c, device="cuda") + 0.5
    beta = torch.randn(c, device="cuda") * 0.5
    rm, rv = torch.randn(c, device="cuda"), torch.rand(c, device="cuda") + 0.5
    rm0, rv0 = rm.clone(), rv.clone()
    eps, factor = 1e-5, 0.25

    y, mean, invstd = _nan(x, fmt=CL), _nan(gamma), _nan(gamma)
    nres = pycudnn.batch_normalization_act_reserve_size(shape, dtype, residual)
    reserve = torch.empty(nres, dtype=torch.uint8, device="cuda")
    res = pycudnn.dnn_batch_normalization_act_train(
        x, gamma, beta, z, "relu", eps, factor, rm, rv,
        out=y, out_mean=mean, out_invstd=invstd, out_reserve=reserve,
    )  # fmt: skip
    assert res[0] is y and res[3] is reserve
    # a reserve the call allocates itself has the size the query gives
    assert pycudnn.dnn_batch_normalization_act_train(x, gamma, beta, z)[3].shape == (nres,)
    if not residual:
        assert nres == 0  # cuDNN takes the ReLU's mask from the output

    # float64 references from the same (rounded) inputs
    x64 = x.double().requires_grad_()
    g64, b64 = gamma.double().requires_grad_(), beta.double().requires_grad_()
    z64 = z.double().requires_grad_() if residual else None
    dims = (0, 2, 3)
    m_ref, var = x64.mean(dims), x64.var(dims, unbiased=False)
    inv_ref = torch.rsqrt(var + eps)
    t = (x64 - m_ref.view(1, -1, 1, 1)) * (inv_ref * g64).view(1, -1, 1, 1) + b64.view(1, -1, 1, 1)
    y_ref = F.relu(t if z64 is None else t + z64)
    tol = TOL[dtype]
    assert not torch.isnan(y).any()
    assert _rel(y, y_ref) <= tol
    assert _rel(mean, m_ref) <= 1e-5 and _rel(invstd, inv_ref) <= 1e-4
    m = n * shape[2] * shape[3]
    assert _rel(rm, rm0.double() * (1 - factor) + m_ref * factor) <= 1e-5
    unbiased = var * m / (m - 1)
    assert _rel(rv, rv0.double() * (1 - factor) + unbiased * factor) <= 1e-4

    dy = torch.randn(shape, device="cuda").to(dtype, memory_format=CL)
    y_ref.backward(dy.double())
    dx, dg, db = _nan(x, fmt=CL), _nan(gamma), _nan(gamma)
    dz = _nan(x, fmt=CL) if residual else None
    got = pycudnn.dnn_batch_normalization_act_grad(
        x, y, dy, gamma, beta, mean, invstd, reserve, "relu", eps,
        residual=residual, out=dx, out_dscale=dg, out_dbias=db, out_dz=dz,
    )  # fmt: skip
    assert len(got) == (4 if residual else 3) and got[0] is dx
    # the gradients go through the ReLU mask of the rounded output: elements whose float64
    # pre-activation is within rounding of 0 may fall on either side; they carry |dy| <~ 4
    assert _rel(dx, x64.grad) <= 4 * tol
    assert _rel(dg, g64.grad) <= 4 * tol and _rel(db, b64.grad) <= 4 * tol
    if residual:
        assert _rel(dz, z64.grad) <= tol


def test_refuses_what_cudnn_does_not_fuse():
    x = torch.randn(2, 8, 4, 4, device="cuda", dtype=torch.bfloat16)  # NCHW
    g = torch.ones(8, device="cuda")
    with pytest.raises(ValueError, match="packed channels-last"):
        pycudnn.dnn_batch_normalization_act_train(x, g, g)
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        pycudnn.dnn_batch_normalization_act_train(x.float().to(memory_format=CL), g, g)
