"""Whether attention ran cuDNN (issue 39, item 5) on the CPU: the process-wide counters of both
routes -- ``use_cudnn_attention()`` and transformers' ``attn_implementation="pycudnn"`` --
through ``attention_calls()``, resettable, next to each scope's own ``AttentionRoute``.

Where a call must count as cuDNN's, pycudnn's decision and function are faked with their real
signatures (the pattern of ``test_torch_attention_scope.py``); CPU calls pycudnn does not run
count as torch's for real.
"""

from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import pycudnn.torch as pt  # noqa: E402
from pycudnn.torch import attention, attention_scope  # noqa: E402

TORCH_SDPA = torch._C._nn.scaled_dot_product_attention


# -- attention counters ---------------------------------------------------------------------------
@pytest.fixture
def counts():
    """The process-wide counters from zero, and zero again after the test."""
    pt.attention_calls(reset=True)
    yield
    pt.attention_calls(reset=True)


@pytest.fixture
def fake_cudnn(monkeypatch):
    """CPU float32 calls without a mask count as ones pycudnn runs; its function computes
    torch's result (the real signatures kept)."""
    sig = inspect.signature(attention._attention_native)

    def native(*args, **kwargs):
        a = sig.bind(*args, **kwargs).arguments
        return a["attn_mask"] is None and a["q"].dtype == torch.float32

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, gqa=False):
        kw = {"enable_gqa": True} if gqa else {}
        return TORCH_SDPA(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, **kw)

    def run(q, k, v, grad, attn_mask, dropout_p, is_causal, scale, sig=None, given=()):
        # the routes' cuDNN step (binding nothing)
        return sdpa(q, k, v, attn_mask, dropout_p, is_causal, scale, q.shape[1] != k.shape[1])

    monkeypatch.setattr(attention, "_attention_native", native)
    monkeypatch.setattr(attention, "scaled_dot_product_attention", sdpa)
    monkeypatch.setattr(attention, "cudnn_attention", run)


def _qkv(dtype=torch.float32, hk=4):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 8, 16, generator=g, dtype=dtype)
    k, v = (torch.randn(2, hk, 8, 16, generator=g, dtype=dtype) for _ in range(2))
    return q, k, v


def _layer(groups=1):
    layer = nn.Module()
    layer.num_key_value_groups, layer.is_causal = groups, True
    return layer


@pytest.mark.usefixtures("counts", "fake_cudnn")
def test_transformers_calls_are_counted_by_route():
    q, k, v = _qkv()
    attention_scope.transformers_attention(_layer(), q, k, v, None)
    attention_scope.transformers_attention(_layer(2), q, k[:, :2], v[:, :2], None)
    attention_scope.transformers_attention(_layer(), q, k, v, torch.zeros(2, 1, 8, 8))
    attention_scope.transformers_attention(_layer(), *_qkv(torch.float64), None)
    calls = pt.attention_calls()
    assert calls.transformers == pt.AttentionRoute(cudnn=2, torch=2)
    assert calls.scope == pt.AttentionRoute()
    assert isinstance(calls, pt.AttentionCalls)


@pytest.mark.usefixtures("counts", "fake_cudnn")
def test_scope_calls_are_counted_once_however_many_scopes():
    q, k, v = _qkv()
    with pt.use_cudnn_attention() as outer, pt.use_cudnn_attention() as inner:
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
        F.scaled_dot_product_attention(*_qkv(torch.float64))
    assert outer == inner == pt.AttentionRoute(1, 1)
    assert pt.attention_calls().scope == pt.AttentionRoute(1, 1)
    F.scaled_dot_product_attention(q, k, v)  # outside any scope: counted nowhere
    assert pt.attention_calls().scope == pt.AttentionRoute(1, 1)


@pytest.mark.usefixtures("counts")
def test_a_transformers_fallback_inside_a_scope_counts_in_both():
    """pycudnn's (real) function hands a call it does not run (CPU) to the routed attribute."""
    with pt.use_cudnn_attention() as route:
        attention_scope.transformers_attention(_layer(), *_qkv(), None)
    calls = pt.attention_calls()
    assert calls.transformers == pt.AttentionRoute(0, 1) == calls.scope == route


@pytest.mark.usefixtures("counts", "fake_cudnn")
def test_attention_calls_reset_and_print():
    attention_scope.transformers_attention(_layer(), *_qkv(), None)
    first = pt.attention_calls(reset=True)
    assert first.transformers.cudnn == 1
    assert pt.attention_calls() == pt.AttentionCalls(pt.AttentionRoute(), pt.AttentionRoute())
    first.transformers.cudnn = 99  # a snapshot: the counters are not touched
    assert pt.attention_calls().transformers.cudnn == 0
    assert str(first).splitlines() == [
        "route                          cudnn  torch",
        "use_cudnn_attention()              0      0",
        'attn_implementation="pycudnn"     99      0',
    ]
    assert repr(first) == (
        "AttentionCalls(scope=AttentionRoute(cudnn=0, torch=0), "
        "transformers=AttentionRoute(cudnn=99, torch=0))"
    )
    with pytest.raises(TypeError):
        pt.attention_calls(True)  # reset is keyword-only


@pytest.mark.usefixtures("counts", "fake_cudnn")
def test_compiled_calls_are_not_counted(monkeypatch):
    monkeypatch.setattr(attention_scope, "_compiling", lambda: True)
    attention_scope.transformers_attention(_layer(), *_qkv(), None)
    with pt.use_cudnn_attention() as route:
        F.scaled_dot_product_attention(*_qkv())
    assert route == pt.AttentionRoute() and pt.attention_calls().transformers.cudnn == 0


def test_attention_route_compares_by_counts():
    assert pt.AttentionRoute(1, 2) == pt.AttentionRoute(cudnn=1, torch=2)
    assert pt.AttentionRoute(1, 2) != pt.AttentionRoute(2, 1)
    assert pt.AttentionRoute() != (0, 0)
    with pytest.raises(TypeError):
        hash(pt.AttentionRoute())  # mutable counts
