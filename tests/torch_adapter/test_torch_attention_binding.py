"""Attention bindings (``pycudnn.torch.attention.bound_attention``) on the CPU: a mask-free,
dropout-free attention call with the signature of an earlier one that ran as one lean launch is
one launch of that call's entry, forward and backward, from every route (the function,
``use_cudnn_attention()``, transformers' ``"pycudnn"``); any other signature takes the checked
path and binds anew.

pycudnn's functions are the torch fakes of ``test_torch_compile_fakes.py`` with the pointer
entries of ``test_torch_binding.py``: a bound launch computes real numbers from the pointers it
is handed, so a stale or wrong pointer shows as a wrong result. cuDNN's own launches are the GPU
tier's (``test_torch_attention_binding_gpu.py``).
"""

from __future__ import annotations

import threading
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("numpy")
if not hasattr(torch.library, "custom_op"):
    pytest.skip("torch.library.custom_op needs torch >= 2.4", allow_module_level=True)
F = torch.nn.functional

from test_torch_binding import pointer_entries  # noqa: E402, F401  (the fixture)
from test_torch_compile_fakes import fakes  # noqa: E402, F401  (the autouse fixture)

import pycudnn  # noqa: E402
from pycudnn import torch as pt  # noqa: E402
from pycudnn.torch import _lean, attention, attention_scope  # noqa: E402


@pytest.fixture(autouse=True)
def made(pointer_entries):  # noqa: F811  (the pointer entries made, an empty store)
    attention._BOUND.clear()
    yield pointer_entries
    attention._BOUND.clear()


def _qkv(b=2, hq=4, hk=2, s=8, d=16, *, grad=False, seed=None):
    g = torch.Generator().manual_seed(seed) if seed is not None else None
    q = torch.randn(b, hq, s, d, generator=g, requires_grad=grad)
    k = torch.randn(b, hk, s, d, generator=g, requires_grad=grad)
    v = torch.randn(b, hk, s, d, generator=g, requires_grad=grad)
    return q, k, v


TORCH_SDPA = torch._C._nn.scaled_dot_product_attention  # (F's attribute is routed in scopes)


def _ref(q, k, v, causal=True, scale=None):
    return TORCH_SDPA(q, k, v, None, 0.0, causal, scale=scale, enable_gqa=True)


def _only_binding():
    (bd,) = attention._BOUND.values()
    return bd


def test_a_repeated_call_is_one_launch_of_the_bound_entry(made):
    with torch.no_grad():
        for i in range(4):
            q, k, v = _qkv()
            got = pt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            torch.testing.assert_close(got, _ref(q, k, v), rtol=1e-5, atol=1e-5)
            assert attention.bound_count() == 1 and _only_binding().hits == i
    (entry,) = made["sdpa"]  # the public function ran once
    assert entry is _only_binding().entry and entry.launches == 3


def test_forward_and_backward_bind_and_compute_from_the_pointers(made):
    for _ in range(4):
        q, k, v = _qkv(grad=True)
        out = pt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        dy = torch.randn_like(out)
        got = torch.autograd.grad(out, (q, k, v), dy)
        q2, k2, v2 = (t.detach().requires_grad_() for t in (q, k, v))
        ref = _ref(q2, k2, v2)
        want = torch.autograd.grad(ref, (q2, k2, v2), dy)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    bd = _only_binding()
    # call 1 binds the forward; call 2 launches it, and its backward (the lean store's hit)
    # binds the gradient's entry; calls 3 and 4 launch both
    assert bd.hits == 3 and len(made["sdpa"]) == 1
    ((_sig, entry),) = bd.grads.values()
    assert [entry] == made["sdpa_grad"] and entry.launches == 3


@pytest.mark.parametrize(
    ("kw", "change"),
    [
        ({}, lambda q, k, v: _qkv(s=6)),  # another shape
        ({}, lambda q, k, v: (q.transpose(1, 2).contiguous().transpose(1, 2), k, v)),  # strides
        ({"is_causal": False}, None),
        ({"scale": 0.5}, None),
        ({}, lambda q, k, v: (q.double(), k.double(), v.double())),  # another dtype
    ],
    ids=["shape", "strides", "causal", "scale", "dtype"],
)
def test_any_other_signature_takes_the_checked_path(made, kw, change):
    q, k, v = _qkv()
    with torch.no_grad():
        pt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        first = _only_binding()
        q, k, v = change(*_qkv()) if change else _qkv()
        args = {"is_causal": True, "enable_gqa": True, **kw}
        got = pt.scaled_dot_product_attention(q, k, v, **args)
    want = _ref(q, k, v, args["is_causal"], args.get("scale"))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert first.hits == 0 and attention.bound_count() == 2


def test_grouped_heads_without_enable_gqa_are_not_served_by_the_gqa_binding(made):
    q, k, v = _qkv()
    with torch.no_grad():
        pt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        with pytest.raises(RuntimeError):  # torch's own error: 4 query heads, 2 key heads
            pt.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert _only_binding().hits == 0


@pytest.mark.parametrize(
    "args",
    [
        {"dropout_p": 0.1},
        {"dropout_p": False},  # a bool is not a probability the binding takes
        {"is_causal": 1},
        {"scale": 1},
        {"enable_gqa": 1},
    ],
    ids=["dropout", "bool-dropout", "int-causal", "int-scale", "int-gqa"],
)
def test_arguments_of_other_types_are_never_bound(args):
    q, k, v = _qkv()
    a = {"dropout_p": 0.0, "is_causal": True, "scale": None, "enable_gqa": True, **args}
    sig = attention.attention_sig(q, k, v, a["dropout_p"], a["is_causal"], a["scale"],
                                  a["enable_gqa"])  # fmt: skip
    assert sig is None


def test_under_vmap_torchs_function_runs_and_nothing_binds(made):
    q, k, v = _qkv(hk=4)
    with torch.no_grad():
        pt.scaled_dot_product_attention(q, k, v, is_causal=True)  # a binding of this signature
        bd = _only_binding()

        def f(q, k, v):
            return pt.scaled_dot_product_attention(q, k, v, is_causal=True)

        qs, ks, vs = (torch.stack([t, t + 1]) for t in (q, k, v))
        got = torch.func.vmap(f)(qs, ks, vs)
    for i in range(2):
        want = TORCH_SDPA(qs[i], ks[i], vs[i], is_causal=True)
        torch.testing.assert_close(got[i], want, rtol=1e-5, atol=1e-5)
    assert bd.hits == 0 and attention.bound_count() == 1


def test_clear_caches_drops_the_bindings(made):
    with torch.no_grad():
        pt.scaled_dot_product_attention(*_qkv(), is_causal=True, enable_gqa=True)
        assert attention.bound_count() == 1
        pycudnn.clear_caches()
        q, k, v = _qkv()
        got = pt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(got, _ref(q, k, v), rtol=1e-5, atol=1e-5)
    assert len(made["sdpa"]) == 2  # the public function ran again
    assert _only_binding().entry is made["sdpa"][1]


def test_the_store_keeps_the_last_signatures(made):
    with torch.no_grad():  # a decode: the keys grow by one each step
        for s in range(1, attention.BOUND_MAX + 4):
            q = torch.randn(2, 4, 1, 16)
            k, v = torch.randn(2, 2, s, 16), torch.randn(2, 2, s, 16)
            got = pt.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            torch.testing.assert_close(got, _ref(q, k, v, False), rtol=1e-5, atol=1e-5)
    assert attention.bound_count() == attention.BOUND_MAX
    assert min(sig[11][2] for sig in attention._BOUND) == 4  # the oldest went first


def test_another_thread_binds_its_own(made):
    with torch.no_grad():
        pt.scaled_dot_product_attention(*_qkv(), is_causal=True, enable_gqa=True)
    first = _only_binding()
    out = []

    def other():
        with torch.no_grad():
            q, k, v = _qkv()
            got = pt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            out.append((got, _ref(q, k, v)))

    t = threading.Thread(target=other)
    t.start()
    t.join()
    torch.testing.assert_close(*out[0], rtol=1e-5, atol=1e-5)
    assert first.hits == 0 and attention.bound_count() == 2


def test_inside_a_recording_tape_a_call_only_runs(made):
    with torch.no_grad(), _lean.Tape() as tape:
        pt.scaled_dot_product_attention(*_qkv(), is_causal=True, enable_gqa=True)
    assert attention.bound_count() == 0 and len(tape.launches) == 1


def test_the_scope_and_transformers_routes_reach_the_same_bindings(made):
    attention_scope.attention_calls(reset=True)
    with torch.no_grad():
        with pt.use_cudnn_attention():
            for _ in range(3):
                q, k, v = _qkv()
                got = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                torch.testing.assert_close(got, _ref(q, k, v), rtol=1e-5, atol=1e-5)
        bd = _only_binding()
        assert bd.hits == 2
        layer = types.SimpleNamespace(num_key_value_groups=2, is_causal=True)
        for _ in range(2):
            q, k, v = _qkv()
            got, _ = attention_scope.transformers_attention(layer, q, k, v, None, 0.0, None)
            want = _ref(q, k, v).transpose(1, 2)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    calls = attention_scope.attention_calls(reset=True)
    assert calls.scope.cudnn == 3 and calls.transformers.cudnn == 2
    # transformers passes scaling=None here and causal as decided: the same signature
    assert _only_binding() is bd and bd.hits == 4


def test_compile_after_binding_reads_no_binding(made):
    def f(q, k, v):
        return pt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    with torch.no_grad():
        f(*_qkv())
        bd = _only_binding()
        q, k, v = _qkv()
        got = torch.compile(f, backend="eager", fullgraph=True)(q, k, v)
        torch.testing.assert_close(got, _ref(q, k, v), rtol=1e-5, atol=1e-5)
        assert bd.hits == 0
        f(*_qkv())  # eager again: bound
    assert bd.hits == 1
