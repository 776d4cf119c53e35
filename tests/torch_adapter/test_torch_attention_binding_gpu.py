"""GPU tests of attention bindings (``pycudnn.torch.attention.bound_attention``; marker ``gpu``,
skipped without a device or without torch): mask-free attention called again and again with
fresh inputs of one signature runs its bound cuDNN launches (forward, and the backward's) and
gives the float64 reference's results every time, through the function and through
``use_cudnn_attention()``.

Run on the GPU machine:
``PYTHONPATH=. python3 -m pytest -m gpu -q``
``tests/torch_adapter/test_torch_attention_binding_gpu.py``.

Before each call the caching allocator's free blocks are filled with NaN, so an output the
bound launch left unwritten shows. Outputs and gradients are compared with torch's attention
in float64 on the same inputs: within 2x the distance of torch's own bfloat16/float16 call to
that reference, plus a small floor.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import torch_gpu  # noqa: E402  (tests/support)

import pycudnn  # noqa: E402  (torch first: both then use the same libcudnn)
import pycudnn.torch as pt  # noqa: E402
from pycudnn.torch import attention  # noqa: E402

pytestmark = pytest.mark.gpu

DEV = "cuda"


@pytest.fixture(autouse=True)
def _settings():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("cuDNN's fused attention needs an sm80 or newer GPU")
    with torch_gpu.exact_math():
        pycudnn.clear_caches()
        yield


def _poison() -> None:
    """Fill the allocator's free memory with NaN: a fresh output that is not written shows."""
    free = torch.cuda.mem_get_info()[0]
    blk = torch.full((min(free // 8, 256 << 20) // 4,), float("nan"), device=DEV)
    del blk


def _ref(q, k, v, causal, dy=None):
    """float64 attention (and its gradients for *dy*) on the same values."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    if dy is None:
        return out, None
    return out, torch.autograd.grad(out, (q, k, v), dy.double())


def _torch_dist(q, k, v, causal, want, dy, want_g):
    """torch's own low-precision call's distance to the reference (output, each gradient)."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    d = [(out.double() - want).abs().max().item()]
    if dy is not None:
        g = torch.autograd.grad(out, (q, k, v), dy)
        d += [(a.double() - b).abs().max().item() for a, b in zip(g, want_g, strict=True)]
    return d


def _check(got, want, torch_dist):
    assert torch.isfinite(got).all()
    err = (got.double() - want).abs().max().item()
    assert err <= 2 * torch_dist + 1e-3, (err, torch_dist)


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_training_calls_run_bound_and_equal_the_reference(dt):
    for _ in range(4):
        q = torch.randn(2, 8, 256, 64, device=DEV, dtype=dt, requires_grad=True)
        k, v = (torch.randn(2, 2, 256, 64, device=DEV, dtype=dt, requires_grad=True)
                for _ in range(2))  # fmt: skip
        dy = torch.randn(2, 8, 256, 64, device=DEV, dtype=dt)
        want, want_g = _ref(q, k, v, True, dy)
        dist = _torch_dist(q, k, v, True, want, dy, want_g)
        _poison()
        out = pt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        _poison()
        got_g = torch.autograd.grad(out, (q, k, v), dy)
        _check(out, want, dist[0])
        for g, w, d in zip(got_g, want_g, dist[1:], strict=True):
            _check(g, w, d)
    (bd,) = attention._BOUND.values()
    assert bd.hits == 3
    ((_sig, _entry),) = bd.grads.values()  # the backward's entry, bound on this thread


def test_decode_steps_bind_per_key_length_and_layers_hit():
    layers, steps = 4, 6
    pycudnn.clear_caches()
    with torch.no_grad():
        for s in range(100, 100 + steps):
            for _ in range(layers):  # each layer: its own cache of the same length
                q = torch.randn(4, 16, 1, 64, device=DEV, dtype=torch.bfloat16)
                k, v = (torch.randn(4, 4, s, 64, device=DEV, dtype=torch.bfloat16)
                        for _ in range(2))  # fmt: skip
                want, _ = _ref(q, k, v, False)
                dist = _torch_dist(q, k, v, False, want, None, None)
                _poison()
                got = pt.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                _check(got, want, dist[0])
    assert attention.bound_count() == steps
    assert all(bd.hits == layers - 1 for bd in attention._BOUND.values())


def test_the_scope_route_runs_bound():
    with torch.no_grad(), pt.use_cudnn_attention() as route:
        for _ in range(3):
            q, k, v = (torch.randn(2, 8, 128, 64, device=DEV, dtype=torch.bfloat16)
                       for _ in range(3))  # fmt: skip
            want, _ = _ref(q, k, v, True)
            _poison()
            got = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            assert torch.isfinite(got).all()
            assert (got.double() - want).abs().max().item() <= 2e-2
    assert route.cudnn == 3
    (bd,) = attention._BOUND.values()
    assert bd.hits == 2
