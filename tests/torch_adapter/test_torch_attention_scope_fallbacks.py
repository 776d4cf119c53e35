"""Every fallback inside ``pycudnn.torch.use_cudnn_attention()`` on the CPU (issue 39, item 6).

Inside the scope ``torch.nn.functional.scaled_dot_product_attention`` is pycudnn's router, so a
fallback that looked the function up there would call the router again (the ``RecursionError``
of a mask with ``is_causal=True``, fixed before this file). Here each condition under which a
call is handed back to torch's function is made the *only* reason on tensors pycudnn would
otherwise run -- the fakes tier of ``test_torch_compile_fakes.py`` lets CPU float tensors through
and replaces ``dnn_sdpa`` / ``dnn_sdpa_grad`` by torch computations -- and the call is made inside
the scope both through the routed attribute and through pycudnn's own function. Each must give
exactly torch's answer (its result, or its error with the same type and message), never reach
``dnn_sdpa``, and count once as ``torch``.

Not here: a mask on another device than the query (the CPU has one device, and torch's CPU
kernel computes with a ``meta`` mask instead of refusing it); query, key and value on different
devices are covered with a ``meta`` key.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import test_torch_compile_fakes as cf  # noqa: E402  (tests/torch_adapter is on sys.path)
from test_torch_compile_fakes import fakes  # noqa: E402, F401  (autouse: the fakes tier)

import pycudnn.torch as pt  # noqa: E402
from pycudnn import highlevel as hl  # noqa: E402
from pycudnn.torch import _runtime, attention, attention_scope  # noqa: E402

TORCH_SDPA = torch._C._nn.scaled_dot_product_attention  # what F's attribute is, unpatched
B, H, S, D = 2, 4, 8, 16
SEEN: list[str] = []


def _attn(q, k, v, bias, causal, scale):
    # torch's own function by its C name: inside the scope F's attribute is the router
    gqa = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
    return TORCH_SDPA(q, k, v, bias, 0.0, causal, scale=scale, **gqa)


@cf._bound(hl.dnn_sdpa)
def fake_sdpa(q, k, v, attn_mask, is_causal, scale, training, out, out_stats, **_):
    SEEN.append("sdpa")
    out.copy_(_attn(q, k, v, attn_mask, is_causal, scale))
    if not training:
        return out
    stats = torch.zeros((*q.shape[:3], 1), dtype=torch.float32)
    return out, stats if out_stats is None else out_stats.copy_(stats)


@pytest.fixture(autouse=True)
def _spied(fakes, monkeypatch):  # noqa: F811  (after the tier's own fakes)
    """pycudnn's attention forwards recorded in SEEN (masks taken; no case reaches a backward)."""
    monkeypatch.setattr(attention, "dnn_sdpa", fake_sdpa)
    SEEN.clear()
    assert F.scaled_dot_product_attention is TORCH_SDPA
    yield
    assert F.scaled_dot_product_attention is TORCH_SDPA
    assert attention_scope._ROUTES == ()
    SEEN.clear()


def _t(*shape, dtype=torch.float64, seed=0):
    return torch.randn(shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def _qkv(sq=S, skv=S, hq=H, hk=H, d=D, dv=D):
    return _t(B, hq, sq, d), _t(B, hk, skv, d, seed=1), _t(B, hk, skv, dv, seed=2)


class Sub(torch.Tensor):
    """A tensor subclass (pycudnn's path takes plain tensors only)."""


def _sub(t):
    return t.as_subclass(Sub)


def test_the_fakes_run_these_calls_on_pycudnn():
    """The baseline the cases below depart from by one condition each: these run pycudnn's."""
    q, k, v = _qkv()
    with pt.use_cudnn_attention() as route:
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
        F.scaled_dot_product_attention(q, k, v, attn_mask=torch.rand(B, 1, S, S) > 0.2)
        F.scaled_dot_product_attention(q, *_qkv(hk=2)[1:], enable_gqa=True)
    assert (route.cudnn, route.torch) == (3, 0)
    assert SEEN == ["sdpa"] * 3


def _native_capable_false(monkeypatch):
    monkeypatch.setattr(attention, "_attention_capable", lambda t: False)


def _halves_only(monkeypatch):
    monkeypatch.setattr(attention, "HALVES", _runtime.HALVES)  # float64 is not run


# name -> (q, k, v, keyword arguments, patch or None, requires_grad): one reason each
CASES = {
    "dropout_p_a_tensor": (*_qkv(), {"dropout_p": torch.tensor(0.0)}, None, False),
    "dropout_p_one": (*_qkv(), {"dropout_p": 1.0}, None, False),
    "dropout_p_negative": (*_qkv(), {"dropout_p": -0.5}, None, False),
    "query_a_tensor_subclass": (_sub(_qkv()[0]), *_qkv()[1:], {}, None, False),
    "dtype_cudnn_lacks": (*_qkv(), {}, _halves_only, False),
    "dtypes_differ": (_qkv()[0].float(), *_qkv()[1:], {}, None, False),
    "devices_differ": (_qkv()[0], _qkv()[1].to("meta"), _qkv()[2], {}, None, False),
    "two_dims": (*(t[0, 0] for t in _qkv()), {}, None, False),
    "ranks_differ": (_qkv()[0], *(t[0] for t in _qkv()[1:]), {}, None, False),
    "leading_dims_differ": (_qkv()[0], *(t[:1] for t in _qkv()[1:]), {}, None, False),
    "key_head_dim_differs": (_qkv()[0], _qkv(d=8)[1], _qkv()[2], {}, None, False),
    "value_heads_differ": (*_qkv()[:2], _qkv(hk=2)[2], {}, None, False),
    "value_length_differs": (*_qkv()[:2], _qkv(skv=6)[2], {}, None, False),
    "heads_differ_without_gqa": (_qkv()[0], *_qkv(hk=2)[1:], {}, None, False),
    "gqa_heads_not_a_multiple": (_qkv()[0], *_qkv(hk=3)[1:], {"enable_gqa": True}, None, False),
    "head_dim_not_a_multiple_of_8": (*_qkv(d=12, dv=12), {}, None, False),
    "head_dim_over_256": (*_qkv(sq=2, skv=2, d=264, dv=264), {}, None, False),
    "value_head_dim_not_a_multiple_of_8": (*_qkv(dv=12), {}, None, False),
    "empty": (*_qkv(sq=0), {}, None, False),
    "backward_of_one_query_one_key": (*_qkv(sq=1, skv=1), {}, None, True),
    "gpu_before_sm80": (*_qkv(), {}, _native_capable_false, False),
    "mask_of_another_dtype": (*_qkv(), {"attn_mask": _t(S, S, dtype=torch.float32)}, None, False),
    "mask_over_the_queries": (*_qkv(), {"attn_mask": _t(B, 1, 1, S)}, None, False),
    "mask_over_the_keys": (*_qkv(), {"attn_mask": _t(B, 1, S, 1)}, None, False),
    "mask_of_one_dim": (*_qkv(), {"attn_mask": _t(S)}, None, False),
    "mask_of_five_dims": (*_qkv(), {"attn_mask": _t(1, B, H, S, S)}, None, False),
    "mask_a_tensor_subclass": (*_qkv(), {"attn_mask": _sub(_t(S, S))}, None, False),
    "mask_wanting_a_gradient_cudnn_lacks": (
        *_qkv(),
        {"attn_mask": _t(B, H, S, S).requires_grad_()},
        None,
        False,
    ),
    "mask_with_is_causal": (*_qkv(), {"attn_mask": _t(S, S), "is_causal": True}, None, False),
}


def _outcome(fn, q, k, v, kw, grad):
    """``('value', output, gradients)`` or ``('error', type, message)`` of one call."""
    ins = [t.detach().requires_grad_(grad) if t.device.type != "meta" else t for t in (q, k, v)]
    torch.manual_seed(7)  # the dropout cases draw the same mask on both sides
    try:
        out = fn(*ins, **kw)
    except Exception as exc:  # torch's error is the expected answer
        return ("error", type(exc), str(exc))
    grads = ()
    if grad:
        grads = torch.autograd.grad(out.sum(), ins)
    return ("value", out.detach(), grads)


def _same(got, want):
    assert got[0] == want[0], (got, want)
    if want[0] == "error":
        assert got[1] is want[1] and got[2] == want[2]
        return
    torch.testing.assert_close(got[1], want[1], equal_nan=True)
    for a, b in zip(got[2], want[2], strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("entry", ["routed_attribute", "pycudnn_function"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_every_fallback_gives_torchs_answer_without_recursion(name, entry, monkeypatch):
    q, k, v, kw, patch, grad = CASES[name]
    if patch is not None:
        patch(monkeypatch)
    want = _outcome(TORCH_SDPA, q, k, v, kw, grad)
    with pt.use_cudnn_attention() as route:
        fn = F.scaled_dot_product_attention  # the router, looked up inside the scope
        if entry == "pycudnn_function":
            fn = pt.scaled_dot_product_attention
        got = _outcome(fn, q, k, v, kw, grad)
    assert not (got[0] == "error" and issubclass(got[1], RecursionError)), got
    _same(got, want)
    assert SEEN == []  # neither direction reached pycudnn's attention
    # one call, handed to torch once (pycudnn's own function through the routed attribute)
    assert (route.cudnn, route.torch) == (0, 1)


def test_every_branch_of_the_decision_has_a_case():
    """The decision's early returns, read from its source, against the cases above: a new
    condition in ``_attention_native`` fails here until it gets a fallback case."""
    import inspect

    src = inspect.getsource(attention._attention_native)
    returns = src.count("return False") + src.count("return _attention_capable")
    # dropout type, mask not taken, dropout range, dtype or subclass, dtypes or
    # devices, ranks, leading dims, head dims or lengths, heads, head dim sizes, empties,
    # backward of 1 x 1, the GPU's capability
    assert returns == 13, src
    assert len(CASES) >= returns
