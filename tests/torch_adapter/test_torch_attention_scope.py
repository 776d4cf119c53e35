"""``pycudnn.torch.use_cudnn_attention`` and ``register_transformers`` on the CPU (torch needed,
transformers not: a fake ``transformers`` module stands in for it).

* The scope puts its function in ``torch.nn.functional`` and back: nested, entered again,
  ended out of order, ended by an exception; torch's function object itself comes back.
* CPU tensors (what pycudnn does not run) reach torch's function with the same arguments:
  results equal torch's, including masks, ``scale``, ``enable_gqa``, keyword calls and
  ``nn.MultiheadAttention``; the route counts them as ``torch``.
* With pycudnn's decision and function replaced by fakes (the real signature bound, as in
  ``test_torch_adapter_fakes.py``), the calls it runs reach ``scaled_dot_product_attention``
  and count as ``cudnn``; a masked call inside it does not recurse.
* ``torch.compile(fullgraph=True)`` traces the routed function (CPU tensors, aot_eager).
* ``register_transformers``: a clear ImportError without transformers (or without
  ``AttentionInterface``); with a fake one it registers ``"pycudnn"`` and ``"sdpa"``'s mask
  function, idempotently. ``transformers_attention`` computes transformers' ``"sdpa"``: the
  ``(B, S, H, D)`` contiguous output, grouped-query heads (``enable_gqa`` without a mask,
  repeated heads with one), causal from ``module.is_causal`` only without a mask and
  ``S_q > 1``, the ``is_causal`` argument overriding the module.
"""

from __future__ import annotations

import inspect
import sys
import threading
import types
from typing import ClassVar

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import pycudnn.torch as pt  # noqa: E402
from pycudnn.torch import attention, attention_scope  # noqa: E402

TORCH_SDPA = torch._C._nn.scaled_dot_product_attention  # what F's attribute is, unpatched


def _qkv(b=2, hq=4, hk=4, s=8, d=16, *, grad=False):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, hq, s, d, generator=g, requires_grad=grad)
    k = torch.randn(b, hk, s, d, generator=g, requires_grad=grad)
    v = torch.randn(b, hk, s, d, generator=g, requires_grad=grad)
    return q, k, v


@pytest.fixture(autouse=True)
def _unpatched():
    assert F.scaled_dot_product_attention is TORCH_SDPA
    yield
    assert F.scaled_dot_product_attention is TORCH_SDPA
    assert attention_scope._ROUTES == ()


# -- the patch ---------------------------------------------------------------------------------
def test_scope_installs_and_restores():
    with pt.use_cudnn_attention() as route:
        assert F.scaled_dot_product_attention is attention_scope._routed
        assert isinstance(route, attention_scope.AttentionRoute)
        assert (route.cudnn, route.torch) == (0, 0)
    assert F.scaled_dot_product_attention is TORCH_SDPA
    assert repr(route) == "AttentionRoute(cudnn=0, torch=0)"


def test_scopes_nest_and_count_in_each():
    q, k, v = _qkv()
    with pt.use_cudnn_attention() as outer:
        F.scaled_dot_product_attention(q, k, v)
        with pt.use_cudnn_attention() as inner:
            assert F.scaled_dot_product_attention is attention_scope._routed
            F.scaled_dot_product_attention(q, k, v)
        assert F.scaled_dot_product_attention is attention_scope._routed
        F.scaled_dot_product_attention(q, k, v)
    assert (outer.torch, inner.torch) == (3, 1)
    F.scaled_dot_product_attention(q, k, v)  # after the scope: counted nowhere
    assert (outer.torch, inner.torch, outer.cudnn) == (3, 1, 0)


def test_scopes_ended_out_of_order():
    a, b = pt.use_cudnn_attention(), pt.use_cudnn_attention()
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)
    assert F.scaled_dot_product_attention is attention_scope._routed
    b.__exit__(None, None, None)
    assert F.scaled_dot_product_attention is TORCH_SDPA


def test_scope_restores_after_an_exception():
    with pytest.raises(KeyError, match="boom"), pt.use_cudnn_attention(), pt.use_cudnn_attention():
        raise KeyError("boom")
    assert F.scaled_dot_product_attention is TORCH_SDPA
    # a call torch rejects raises torch's error, unchanged
    with pytest.raises(RuntimeError) as want:
        TORCH_SDPA(torch.randn(2, 3, 4), torch.randn(2, 5, 6), torch.randn(2, 5, 6))
    with pt.use_cudnn_attention(), pytest.raises(RuntimeError) as got:
        F.scaled_dot_product_attention(
            torch.randn(2, 3, 4), torch.randn(2, 5, 6), torch.randn(2, 5, 6)
        )
    assert str(got.value) == str(want.value)


def test_scope_restores_a_function_found_there():
    """Another patch in place when the scope begins is what comes back (and what torch's
    fallback calls meanwhile)."""
    calls = []

    def other(*args, **kwargs):
        calls.append(1)
        return TORCH_SDPA(*args, **kwargs)

    F.scaled_dot_product_attention = other
    try:
        with pt.use_cudnn_attention() as route:
            F.scaled_dot_product_attention(*_qkv())
        assert F.scaled_dot_product_attention is other
        assert calls == [1] and route.torch == 1
    finally:
        F.scaled_dot_product_attention = TORCH_SDPA


def test_scope_is_process_wide():
    """A thread's call is routed while another thread's scope is active."""
    seen = []
    with pt.use_cudnn_attention() as route:
        t = threading.Thread(
            target=lambda: seen.append(F.scaled_dot_product_attention is attention_scope._routed)
        )
        t.start()
        t.join()
        t = threading.Thread(target=lambda: F.scaled_dot_product_attention(*_qkv()))
        t.start()
        t.join()
    assert seen == [True] and route.torch == 1


# -- what torch's function gets ----------------------------------------------------------------
CPU_CALLS = {
    "plain": ((), {}),
    "causal": ((None, 0.0, True), {}),
    "scale": ((), {"scale": 0.3, "is_causal": True}),
    "bool_mask": ((torch.rand(8, 8) > 0.3,), {}),
    "float_mask": ((), {"attn_mask": torch.randn(2, 1, 8, 8)}),
}


@pytest.mark.parametrize("name", sorted(CPU_CALLS))
def test_cpu_calls_get_torchs_results(name):
    args, kwargs = CPU_CALLS[name]
    q, k, v = _qkv()
    want = TORCH_SDPA(q, k, v, *args, **kwargs)
    with pt.use_cudnn_attention() as route:
        got = F.scaled_dot_product_attention(q, k, v, *args, **kwargs)
    assert torch.equal(got, want)
    assert (route.cudnn, route.torch) == (0, 1)


def test_cpu_gqa_keywords_and_gradients():
    q, k, v = _qkv(hq=8, hk=2, grad=True)
    want = TORCH_SDPA(q, k, v, is_causal=True, enable_gqa=True)
    gw = torch.autograd.grad(want.square().sum(), (q, k, v))
    with pt.use_cudnn_attention() as route:
        got = F.scaled_dot_product_attention(
            query=q, key=k, value=v, is_causal=True, enable_gqa=True
        )
        with pytest.raises(TypeError):  # scale is keyword-only, as in torch's
            F.scaled_dot_product_attention(q, k, v, None, 0.0, False, 0.5)
    gg = torch.autograd.grad(got.square().sum(), (q, k, v))
    assert torch.equal(got, want)
    assert all(torch.equal(a, b) for a, b in zip(gg, gw, strict=True))
    assert route.torch == 1


def test_multihead_attention_goes_through_the_scope():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(32, 4, batch_first=True).train()
    x = torch.randn(2, 8, 32)
    want = mha(x, x, x, need_weights=False)[0]
    with pt.use_cudnn_attention() as route:
        got = mha(x, x, x, need_weights=False)[0]
    assert torch.equal(got, want)
    assert route.torch == 1


def test_compile_traces_the_routed_function():
    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)

    q, k, v = _qkv(grad=True)
    with pt.use_cudnn_attention() as route:
        y = torch.compile(f, backend="aot_eager", fullgraph=True)(q, k, v)
    assert torch.allclose(y, TORCH_SDPA(q, k, v, is_causal=True, scale=0.3))
    assert (route.cudnn, route.torch) == (0, 0)  # compiled calls are not counted
    y.sum().backward()
    assert q.grad is not None


def test_no_provider_registered():
    """pycudnn stays out of torch's flash-attention provider registry (where torch has one)."""
    registry = getattr(torch.nn.attention, "list_flash_attention_impls", None)
    if registry is None:
        pytest.skip(f"torch {torch.__version__} has no flash-attention provider registry")
    with pt.use_cudnn_attention():
        impls = registry()
    assert not any("cudnn" in i.lower() for i in impls)


# -- the cuDNN route, faked ----------------------------------------------------------------------
SPY: list[dict] = []
_PYCUDNN_SDPA = attention.scaled_dot_product_attention  # (the fixtures replace the attribute)


def _fake_sdpa(real):
    """pycudnn's function bound to its real signature, computed by torch's."""
    sig = inspect.signature(real)

    def fake(*args, **kwargs):
        ba = sig.bind(*args, **kwargs)
        ba.apply_defaults()
        a = ba.arguments
        SPY.append(a)
        kw = {"scale": a["scale"]}
        if a["enable_gqa"]:
            kw["enable_gqa"] = True
        return TORCH_SDPA(
            a["query"], a["key"], a["value"], a["attn_mask"], a["dropout_p"], a["is_causal"], **kw
        )

    return fake


def _fake_cudnn_attention(q, k, v, grad, attn_mask, dropout_p, is_causal, scale, sig=None,
                          given=()):  # fmt: skip
    """pycudnn's run-on-cuDNN step (``attention.cudnn_attention``, the routes' call once they
    decided), computed by torch's function; recorded as the function's arguments (grouped
    heads: a key with fewer heads). It binds nothing (*sig*, *given*)."""
    gqa = q.shape[-3] != k.shape[-3]
    return _fake_sdpa(_PYCUDNN_SDPA)(q, k, v, attn_mask, dropout_p, is_causal, scale, gqa)


@pytest.fixture
def fake_cudnn(monkeypatch):
    """CPU float32 calls without a mask count as ones pycudnn runs (its decision's real
    signature kept); its function computes torch's result and records its arguments."""
    real = attention._attention_native
    sig = inspect.signature(real)

    def native(*args, **kwargs):
        a = sig.bind(*args, **kwargs).arguments
        return a["attn_mask"] is None and a["q"].dtype == torch.float32

    monkeypatch.setattr(attention, "_attention_native", native)
    monkeypatch.setattr(
        attention,
        "scaled_dot_product_attention",
        _fake_sdpa(attention.scaled_dot_product_attention),
    )
    monkeypatch.setattr(attention, "cudnn_attention", _fake_cudnn_attention)
    SPY.clear()
    yield SPY
    SPY.clear()


def test_native_calls_reach_pycudnn(fake_cudnn):
    q, k, v = _qkv(hq=8, hk=2)
    want = TORCH_SDPA(q, k, v, is_causal=True, scale=0.25, enable_gqa=True)
    with pt.use_cudnn_attention() as route:
        got = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.25, enable_gqa=True)
        masked = F.scaled_dot_product_attention(q[:, :2], k, v, attn_mask=torch.zeros(8, 8))
    assert torch.equal(got, want)
    assert torch.equal(masked, TORCH_SDPA(q[:, :2], k, v, attn_mask=torch.zeros(8, 8)))
    assert (route.cudnn, route.torch) == (1, 1)
    (a,) = fake_cudnn
    assert a["query"] is q and a["attn_mask"] is None
    assert (a["is_causal"], a["scale"], a["enable_gqa"], a["dropout_p"]) == (True, 0.25, True, 0.0)


def test_a_mask_with_is_causal_does_what_torch_does_inside_the_scope(monkeypatch):
    """A mask pycudnn would take, with ``is_causal=True``: torch's answer (its error, or its
    result where a torch computes it), not a RecursionError through the routed attribute --
    also when pycudnn's own function is called inside the scope."""
    monkeypatch.setattr(attention, "_attention_native", lambda *a, **k: True)
    q, k, v = _qkv()
    mask = torch.zeros(8, 8)
    try:
        want = TORCH_SDPA(q, k, v, attn_mask=mask, is_causal=True)
    except RuntimeError as exc:
        want = type(exc)
    for call in (F.scaled_dot_product_attention, pt.scaled_dot_product_attention):
        with pt.use_cudnn_attention() as route:
            if isinstance(want, type):
                with pytest.raises(want):
                    call(q, k, v, attn_mask=mask, is_causal=True)
            else:
                torch.testing.assert_close(call(q, k, v, attn_mask=mask, is_causal=True), want)
        assert route.cudnn == 0


def test_float64_calls_skip_pycudnn(fake_cudnn):
    q, k, v = (t.double() for t in _qkv())
    with pt.use_cudnn_attention() as route:
        F.scaled_dot_product_attention(q, k, v)
    assert (route.cudnn, route.torch) == (0, 1) and not fake_cudnn


# -- transformers ------------------------------------------------------------------------------
class _Interface:
    """transformers' GeneralInterface as far as registration goes: a class-wide mapping that
    ``register`` (a classmethod) updates, read through instances."""

    _global_mapping: ClassVar[dict] = {}

    def get(self, key, default=None):
        return self._global_mapping.get(key, default)

    @classmethod
    def register(cls, key, value):
        cls._global_mapping.update({key: value})


def _sdpa_mask(*args, **kwargs):
    return None


@pytest.fixture
def fake_transformers(monkeypatch):
    mod = types.ModuleType("transformers")
    mod.__version__ = "0.fake"
    mod.AttentionInterface = type("AttentionInterface", (_Interface,), {"_global_mapping": {}})
    mod.AttentionMaskInterface = type(
        "AttentionMaskInterface", (_Interface,), {"_global_mapping": {"sdpa": _sdpa_mask}}
    )
    monkeypatch.setitem(sys.modules, "transformers", mod)
    return mod


def test_register_transformers_without_transformers(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import raises ImportError
    with pytest.raises(ImportError, match=r"needs HuggingFace transformers.*pip install"):
        pt.register_transformers()


def test_register_transformers_too_old(monkeypatch):
    old = types.ModuleType("transformers")
    old.__version__ = "4.40.0"
    monkeypatch.setitem(sys.modules, "transformers", old)
    with pytest.raises(ImportError, match=r"AttentionInterface.*4\.40\.0"):
        pt.register_transformers()


def test_register_transformers_registers(fake_transformers):
    assert pt.register_transformers() == "pycudnn"
    assert pt.register_transformers() == "pycudnn"  # again: the same entries
    fns = fake_transformers.AttentionInterface._global_mapping
    masks = fake_transformers.AttentionMaskInterface._global_mapping
    assert fns == {"pycudnn": attention_scope.transformers_attention}
    assert masks == {"sdpa": _sdpa_mask, "pycudnn": _sdpa_mask}


def test_register_transformers_without_mask_interface(fake_transformers):
    del fake_transformers.AttentionMaskInterface
    assert pt.register_transformers() == "pycudnn"
    assert "pycudnn" in fake_transformers.AttentionInterface._global_mapping


class _Layer(nn.Module):
    def __init__(self, groups=None, causal=None):
        super().__init__()
        if groups is not None:
            self.num_key_value_groups = groups
        if causal is not None:
            self.is_causal = causal


def _hf_sdpa(module, q, k, v, mask, dropout=0.0, scaling=None, is_causal=None):
    """transformers' "sdpa" function, written out for the CPU (heads repeated, torch>=2.5)."""
    n = getattr(module, "num_key_value_groups", 1)
    k, v = (t.repeat_interleave(n, dim=1) for t in (k, v))
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    causal = q.shape[2] > 1 and mask is None and causal
    return TORCH_SDPA(q, k, v, mask, dropout, causal, scale=scaling).transpose(1, 2).contiguous()


HF_CASES = {
    "gqa_causal": (dict(groups=4, causal=True), dict(hk=2), {}, False),
    "mha_module_without_flags": (dict(), dict(), {}, False),
    "encoder": (dict(causal=False), dict(), {"scaling": 0.2}, False),
    "masked_gqa": (dict(groups=4, causal=True), dict(hk=2), {}, True),
    "decode_step": (dict(groups=2, causal=True), dict(hk=4, s=1), {}, False),
    "is_causal_argument": (dict(causal=True), dict(), {"is_causal": False}, False),
}


@pytest.mark.parametrize("name", sorted(HF_CASES))
def test_transformers_attention_matches_sdpa(name, fake_cudnn):
    layer_kw, shape_kw, kw, masked = HF_CASES[name]
    layer = _Layer(**layer_kw)
    shape = {"hq": 8, "hk": 8, **shape_kw}
    q, k, v = _qkv(**shape)
    mask = torch.randn(2, 1, q.shape[2], k.shape[2]) if masked else None
    out, weights = attention_scope.transformers_attention(layer, q, k, v, mask, **kw)
    want = _hf_sdpa(layer, q, k, v, mask, **kw)
    assert weights is None
    assert out.shape == (2, q.shape[2], 8, 16) and out.is_contiguous()
    torch.testing.assert_close(out, want)
    (a,) = fake_cudnn
    groups = layer_kw.get("groups", 1)
    assert a["enable_gqa"] == (groups > 1 and not masked)
    assert a["key"].shape[1] == (8 if masked or groups == 1 else 8 // groups)
    assert a["is_causal"] == (
        q.shape[2] > 1 and not masked and kw.get("is_causal", layer_kw.get("causal", True))
    )


def test_transformers_attention_inside_the_scope():
    """pycudnn's (real) function hands a call it does not run to
    ``torch.nn.functional.scaled_dot_product_attention``, which the scope sends to torch's own
    (no recursion)."""
    q, k, v = _qkv(hq=8, hk=2)
    mask = torch.randn(2, 1, 8, 8)
    layer = _Layer(groups=4, causal=True)
    with pt.use_cudnn_attention() as route:
        masked, _ = attention_scope.transformers_attention(layer, q, k, v, mask)
        causal, _ = attention_scope.transformers_attention(layer, q, k, v, None)
    torch.testing.assert_close(masked, _hf_sdpa(layer, q, k, v, mask))
    torch.testing.assert_close(causal, _hf_sdpa(layer, q, k, v, None))
    assert (route.cudnn, route.torch) == (0, 2)
