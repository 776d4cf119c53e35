"""``pycudnn.torch.scaled_dot_product_attention`` with ``attn_mask`` on the GPU (issue 27's
adapter part): against torch's function in float32 on the same inputs (the reference), each side's
bfloat16/float16 error compared, outputs and gradients (q, k, v and a ``(1, H, S_q, S_kv)``
mask's). Marker ``gpu``."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import pycudnn.torch as pt  # noqa: E402

pytestmark = pytest.mark.gpu

B, H, SQ, SKV, E = 2, 4, 96, 160, 64


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def _run(fn, q, k, v, m, dy):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    if m is not None and m.is_floating_point():
        m = m.detach().clone().requires_grad_(m.requires_grad)
    y = fn(q, k, v, m)
    y.backward(dy)
    grads = [q.grad, k.grad, v.grad] + ([m.grad] if m is not None and m.requires_grad else [])
    return [y.detach(), *grads]


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(
    "kind", ["float-b1", "float-1h-grad", "float-2d", "bool-b1", "bool-expanded"]
)
def test_masks_against_torch(dt, kind):
    g = torch.Generator(device="cuda").manual_seed(7)
    q, k, v = (torch.randn(B, H, s, E, device="cuda", generator=g) for s in (SQ, SKV, SKV))
    dy = torch.randn(B, H, SQ, E, device="cuda", generator=g)
    if kind.startswith("float"):
        shape = {"float-b1": (B, 1, SQ, SKV), "float-1h-grad": (1, H, SQ, SKV)}.get(kind, (SQ, SKV))
        m = torch.randn(shape, device="cuda", generator=g)
        m.requires_grad_(kind.endswith("grad"))
    else:
        keep = torch.rand(B, 1, SQ, SKV, device="cuda", generator=g) > 0.3
        keep[..., 0] = True
        keep[1, 0, 5] = False  # a fully masked row: 0, as torch gives it
        m = keep.expand(B, H, SQ, SKV) if kind == "bool-expanded" else keep
    ref = _run(F.scaled_dot_product_attention, q, k, v, m, dy)  # float32
    low = [t.to(dt) for t in (q, k, v)]
    ml = m.to(dt) if m.is_floating_point() else m
    if m.is_floating_point():
        ml.requires_grad_(m.requires_grad)
    mine = _run(pt.scaled_dot_product_attention, *low, ml, dy.to(dt))
    theirs = _run(F.scaled_dot_product_attention, *low, ml, dy.to(dt))
    with pt.use_cudnn_attention() as route:  # the scope passes the mask on, and cuDNN runs it
        routed = _run(F.scaled_dot_product_attention, *low, ml, dy.to(dt))
    assert (route.cudnn, route.torch) == (1, 0)
    assert torch.equal(mine[0], routed[0])  # the forward is deterministic (dQ's may not be)
    for i, (a, r) in enumerate(zip(routed, ref, strict=True)):
        assert _rel(a, r) <= 1.01 * _rel(mine[i], r) + 1e-3, i
    assert len(mine) == len(ref) == len(theirs)
    for i, (a, b, r) in enumerate(zip(mine, theirs, ref, strict=True)):
        assert torch.isfinite(a).all(), i
        assert _rel(a, r) <= max(2 * _rel(b, r), 2e-2), (i, _rel(a, r), _rel(b, r))
