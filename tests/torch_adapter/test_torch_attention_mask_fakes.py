"""``pycudnn.torch.scaled_dot_product_attention`` with ``attn_mask`` (issue 27's adapter part) on
CPU: ``dnn_sdpa`` / ``dnn_sdpa_grad`` replaced by torch computations behind their signatures (the
fakes tier of ``test_torch_compile_fakes.py``), so what the adapter hands cuDNN -- the additive
bias's shape, dtype and layout, ``bias_grad`` -- and when it leaves a mask to torch are checked.
The GPU file ``test_torch_attention_mask_gpu.py`` compares with torch on cuDNN."""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import test_torch_compile_fakes as cf  # noqa: E402  (tests/torch_adapter is on sys.path)
from test_torch_compile_fakes import fakes  # noqa: E402, F401  (autouse: the fakes tier)

from pycudnn import highlevel as hl  # noqa: E402
from pycudnn import torch as pt  # noqa: E402
from pycudnn.torch import attention  # noqa: E402

SEEN: list[dict] = []


def _attn(q, k, v, bias, causal, scale):
    return F.scaled_dot_product_attention(q, k, v, bias, 0.0, causal, scale=scale)


@cf._bound(hl.dnn_sdpa)
def fake_sdpa(q, k, v, attn_mask, is_causal, scale, dropout_p, seed, training, out, out_stats, **_):
    assert dropout_p == 0.0
    SEEN.append({"fn": "sdpa", "mask": attn_mask})
    out.copy_(_attn(q, k, v, attn_mask, is_causal, scale))
    if not training:
        return out
    stats = torch.zeros((*q.shape[:3], 1), dtype=torch.float32)  # the fake grad ignores it
    return out, stats if out_stats is None else out_stats.copy_(stats)


@cf._bound(hl.dnn_sdpa_grad)
def fake_sdpa_grad(
    q, k, v, out, dout, stats, attn_mask, is_causal, scale, bias_grad, out_grads, **_
):
    SEEN.append({"fn": "sdpa_grad", "mask": attn_mask, "bias_grad": bias_grad})
    if bias_grad:
        f = lambda a, b, c, m: _attn(a, b, c, m, is_causal, scale)  # noqa: E731
        return cf._vjp(f, (q, k, v, attn_mask), dout)
    g = cf._vjp(lambda a, b, c: _attn(a, b, c, attn_mask, is_causal, scale), (q, k, v), dout)
    return g if out_grads is None else tuple(o.copy_(x) for o, x in zip(out_grads, g, strict=True))


@pytest.fixture(autouse=True)
def _mask_fakes(fakes, monkeypatch):  # noqa: F811  (after the tier's own fakes)
    monkeypatch.setattr(attention, "dnn_sdpa", fake_sdpa)
    monkeypatch.setattr(attention, "dnn_sdpa_grad", fake_sdpa_grad)
    SEEN.clear()


B, H, SQ, SKV, E = 2, 3, 5, 7, 8


def _qkv(grad=True):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, SQ, E, dtype=torch.float64, generator=g)
    k = torch.randn(B, H, SKV, E, dtype=torch.float64, generator=g)
    v = torch.randn(B, H, SKV, E, dtype=torch.float64, generator=g)
    return [t.requires_grad_(grad) for t in (q, k, v)]


def _both(mask, grad_mask=False):
    """pycudnn's call and torch's on twin inputs: outputs and every gradient."""
    res = []
    for fn in (pt.scaled_dot_product_attention, F.scaled_dot_product_attention):
        q, k, v = _qkv()
        m = mask.clone().requires_grad_(grad_mask) if grad_mask else mask
        y = fn(q, k, v, m)
        y.backward(torch.ones_like(y))
        res.append([y.detach(), q.grad, k.grad, v.grad] + ([m.grad] if grad_mask else []))
    return res


@pytest.mark.parametrize(
    "shape", [(B, 1, SQ, SKV), (1, H, SQ, SKV), (B, H, SQ, SKV), (SQ, SKV), (H, SQ, SKV)]
)
def test_a_float_mask_is_cudnns_bias(shape):
    mask = torch.randn(shape, dtype=torch.float64)
    mine, theirs = _both(mask)
    for a, b in zip(mine, theirs, strict=True):
        torch.testing.assert_close(a, b)
    fwd = [s for s in SEEN if s["fn"] == "sdpa"]
    assert len(fwd) == 1 and fwd[0]["mask"].dim() == 4
    assert tuple(fwd[0]["mask"].shape[2:]) == (SQ, SKV)
    assert [s["bias_grad"] for s in SEEN if s["fn"] == "sdpa_grad"] == [False]


def test_a_boolean_mask_becomes_zero_or_the_lowest_finite_value():
    keep = torch.rand(SQ, SKV, generator=torch.Generator().manual_seed(1)) > 0.3
    keep[:, 0] = True
    mine, theirs = _both(keep)
    for a, b in zip(mine, theirs, strict=True):
        torch.testing.assert_close(a, b)
    bias = SEEN[0]["mask"]
    assert bias.dtype == torch.float64 and tuple(bias.shape) == (1, 1, SQ, SKV)
    low = torch.finfo(torch.float64).min
    assert torch.equal(bias[0, 0] == 0, keep) and (bias[0, 0][~keep] == low).all()


def test_fully_masked_rows_are_zero_with_zero_gradients_as_torchs():
    """A NaN there would reach every row of the next layer (0 * NaN): finite bias, then the
    row mask."""
    keep = torch.rand(B, 1, SQ, SKV, generator=torch.Generator().manual_seed(2)) > 0.3
    keep[..., 0] = True
    keep[1, 0, 2] = False  # one query position attends to nothing
    mine, theirs = _both(keep)
    assert (mine[0][1, :, 2] == 0).all() and (mine[1][1, :, 2] == 0).all()
    for a, b in zip(mine, theirs, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b)


def test_an_expanded_mask_is_read_through_one_slice():
    base = torch.randn(B, 1, SQ, SKV, dtype=torch.float64)
    mine, theirs = _both(base.expand(B, H, SQ, SKV))
    for a, b in zip(mine, theirs, strict=True):
        torch.testing.assert_close(a, b)
    bias = SEEN[0]["mask"]
    assert tuple(bias.shape) == (B, 1, SQ, SKV) and bias.data_ptr() == base.data_ptr()


def test_the_mask_gradient_for_a_one_by_heads_mask():
    mine, theirs = _both(torch.randn(1, H, SQ, SKV, dtype=torch.float64), grad_mask=True)
    for a, b in zip(mine, theirs, strict=True):
        torch.testing.assert_close(a, b)
    assert [s["bias_grad"] for s in SEEN if s["fn"] == "sdpa_grad"] == [True]


@pytest.mark.parametrize(
    ("shape", "grad"),
    [
        ((B, H, SQ, SKV), True),  # a gradient cuDNN does not compute (batch-wide bias)
        ((B, 1, 1, SKV), False),  # broadcast over the query positions
        ((B, 1, SQ, 1), False),  # ... over the keys
    ],
)
def test_masks_cudnn_cannot_take_run_torchs(shape, grad):
    mine, theirs = _both(torch.randn(shape, dtype=torch.float64), grad_mask=grad)
    for a, b in zip(mine, theirs, strict=True):
        torch.testing.assert_close(a, b)
    assert SEEN == []  # torch's function ran


def test_other_dtypes_devices_and_causal_run_torchs():
    q, k, v = _qkv(grad=False)
    # a mask with is_causal=True: whatever torch does, pycudnn's function does (torch 2.14.1
    # raises RuntimeError, the CPU-only 2.13.0+cpu computes it), through torch's own function
    mask = torch.zeros(SQ, SKV, dtype=q.dtype)
    try:
        ref = F.scaled_dot_product_attention(q, k, v, mask, 0.0, True)
    except RuntimeError as e:
        with pytest.raises(RuntimeError, match=re.escape(str(e)[:40])):
            pt.scaled_dot_product_attention(q, k, v, mask, 0.0, True)
    else:
        torch.testing.assert_close(pt.scaled_dot_product_attention(q, k, v, mask, 0.0, True), ref)
    assert SEEN == []
    y = pt.scaled_dot_product_attention(q, k, v, torch.zeros(SQ, SKV, dtype=torch.float32))
    torch.testing.assert_close(
        y, F.scaled_dot_product_attention(q, k, v, torch.zeros(SQ, SKV, dtype=torch.float32))
    )
    assert SEEN == []  # a mask of another dtype: torch's function
