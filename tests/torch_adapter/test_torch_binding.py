"""Module bindings (:mod:`pycudnn.torch._binding`) on the CPU: a converted ``LayerNorm``'s call
with the signature of its last lean call is one launch of the entry that call bound, forward and
backward; any other signature goes through the family's path and binds anew.

pycudnn's functions are the torch fakes of ``test_torch_compile_fakes.py`` (its autouse fixture),
and each fake also leaves the call cache a *pointer entry*: a lean entry whose launch rebuilds
float32 CPU tensors over the pointers it is given and runs the fake on them. So a bound launch
computes real numbers from the pointers it was handed, and a wrong or stale pointer shows as a
wrong result, not only as a wrong count. cuDNN's own launches are the GPU tier's
(``test_torch_modules_gpu.py``).
"""

from __future__ import annotations

import copy
import ctypes

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
if not hasattr(torch.library, "custom_op"):
    pytest.skip("torch.library.custom_op needs torch >= 2.4", allow_module_level=True)
nn = torch.nn
F = torch.nn.functional

from test_torch_compile_fakes import (  # noqa: E402
    assert_same_grads,
    fakes,  # noqa: F401  (the autouse fixture)
)

import pycudnn  # noqa: E402
from pycudnn import torch as pt  # noqa: E402
from pycudnn.highlevel import _call  # noqa: E402
from pycudnn.torch import _binding, _lean, _module, _runtime, attention, linear, norm  # noqa: E402


class _Handle:
    device = 0

    def set_stream(self, s: int) -> int:
        return s


def _over(ptr: int, layout: tuple) -> torch.Tensor:
    """A float32 CPU tensor of *layout* ``(shape, strides)`` over *ptr* (no copy)."""
    shape, strides = layout
    n = 1 + sum((d - 1) * st for d, st in zip(shape, strides, strict=True))
    flat = torch.from_numpy(np.ctypeslib.as_array((ctypes.c_float * n).from_address(ptr)))
    return flat.as_strided(shape, strides)


class _PtrEntry:
    """A lean call entry that runs *fn* on tensors rebuilt over the pointers it is launched on
    (*shapes*: their ``(shape, strides)`` in the lean path's pointer order)."""

    lean = True

    def __init__(self, fn, shapes) -> None:
        self.fn = fn
        self.shapes = shapes
        self.spans = (0,) * len(shapes)
        self.handle = _Handle()
        self.launches = 0

    def launch(self, ptrs: tuple) -> None:
        self.launches += 1
        self.fn([_over(p, s) for p, s in zip(ptrs, self.shapes, strict=True)])


def _leave(made: dict, kind: str, run, ts: tuple) -> None:
    """Leave the call cache a pointer entry running *run* over tensors laid out as *ts*."""
    e = _PtrEntry(run, [(tuple(t.shape), t.stride()) for t in ts])
    made[kind].append(e)
    _call.local.last = e


@pytest.fixture
def pointer_entries(monkeypatch):
    """The norms', the product's and attention's fakes leave a pointer entry; launches on one
    device; no CUDA stream."""
    made = {"fwd": [], "bwd": []}
    fwd, bwd = norm.dnn_layer_norm, norm.dnn_layer_norm_grad

    def layer_norm(x, ns, w, b, eps, training=True, out=None, out_mean=None, out_invstd=None,
                   **kw):  # fmt: skip
        r = fwd(
            x, ns, w, b, eps, training=training, out=out, out_mean=out_mean, out_invstd=out_invstd
        )
        stats = training and out_mean is not None

        def run(t):
            fwd(t[0], ns, t[1], t[2], eps, training=training, out=t[3],
                out_mean=t[4] if stats else None, out_invstd=t[5] if stats else None)  # fmt: skip

        ts = (x, w, b, out) + ((out_mean, out_invstd) if stats else ())
        _leave(made, "fwd", run, ts)
        return r

    def layer_norm_grad(dy, x, mean, inv, ns, w, out_grads=None, **kw):
        r = bwd(dy, x, mean, inv, ns, w, out_grads=out_grads)

        def run(t):
            bwd(t[0], t[1], t[3], t[4], ns, t[2], out_grads=tuple(t[5:]))

        ts = (dy, x, w, mean, inv, *out_grads)
        _leave(made, "bwd", run, ts)
        return r

    rfwd, rbwd = norm.dnn_rms_norm, norm.dnn_rms_norm_grad
    made["rms_fwd"], made["rms_bwd"] = [], []

    def rms_norm(x, ns, w, eps, training=True, out=None, out_invrms=None, **kw):
        r = rfwd(x, ns, w, eps, training=training, out=out, out_invrms=out_invrms)
        stats = training and out_invrms is not None

        def run(t):
            rfwd(t[0], ns, t[1], eps, training=training, out=t[2],
                 out_invrms=t[3] if stats else None)  # fmt: skip

        ts = (x, w, out) + ((out_invrms,) if stats else ())
        _leave(made, "rms_fwd", run, ts)
        return r

    def rms_norm_grad(dy, x, inv, ns, w, out_grads=None, **kw):
        r = rbwd(dy, x, inv, ns, w, out_grads=out_grads)

        def run(t):
            rbwd(t[0], t[1], t[3], ns, t[2], out_grads=tuple(t[4:]))

        ts = (dy, x, w, inv, *out_grads)
        _leave(made, "rms_bwd", run, ts)
        return r

    mm = linear.dnn_matmul
    made["mm"] = []

    def matmul(a, b, bias=None, out=None, **kw):
        r = mm(a, b, bias=bias, out=out)
        ts = (a, b, out) if bias is None else (a, b, bias, out)

        def run(t):
            mm(t[0], t[1], bias=None if bias is None else t[2], out=t[-1])

        _leave(made, "mm", run, ts)
        return r

    sd, sdg = attention.dnn_sdpa, attention.dnn_sdpa_grad
    made["sdpa"], made["sdpa_grad"] = [], []

    def sdpa(q, k, v, mask, causal, scale, p, seed, training, out=None, out_stats=None, **kw):
        r = sd(q, k, v, mask, causal, scale, p, seed, training, out=out, out_stats=out_stats)
        stats = out_stats is not None

        def run(t):
            sd(t[0], t[1], t[2], None, causal, scale, 0.0, None, training, out=t[3],
               out_stats=t[4] if stats else None)  # fmt: skip

        ts = (q, k, v, out) + ((out_stats,) if stats else ())
        _leave(made, "sdpa", run, ts)
        return r

    def sdpa_grad(q, k, v, out, dout, stats, mask, causal, scale, out_grads=None, **kw):
        r = sdg(q, k, v, out, dout, stats, mask, causal, scale, out_grads=out_grads)

        def run(t):
            sdg(*t[:6], None, causal, scale, out_grads=tuple(t[6:]))

        ts = (q, k, v, out, dout, stats, *out_grads)
        _leave(made, "sdpa_grad", run, ts)
        return r

    monkeypatch.setattr(attention, "dnn_sdpa", sdpa)
    monkeypatch.setattr(attention, "dnn_sdpa_grad", sdpa_grad)
    monkeypatch.setattr(norm, "dnn_layer_norm", layer_norm)
    monkeypatch.setattr(norm, "dnn_layer_norm_grad", layer_norm_grad)
    monkeypatch.setattr(norm, "dnn_rms_norm", rms_norm)
    monkeypatch.setattr(norm, "dnn_rms_norm_grad", rms_norm_grad)
    monkeypatch.setattr(linear, "dnn_matmul", matmul)
    for module in (norm, linear, attention):
        monkeypatch.setattr(module, "raw_stream", lambda index: 0)
    monkeypatch.setattr(_call, "one_device", True)
    pycudnn.clear_caches()
    yield made
    pycudnn.clear_caches()


def _pair(**kw):
    torch.manual_seed(0)
    ref = nn.LayerNorm(16, **kw)
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_()
    mine = pt.convert(nn.LayerNorm(16, **kw), strict=True)
    mine.load_state_dict(ref.state_dict())
    return ref, mine


def _bound(m):
    """The module's most recently made or used binding."""
    return _binding.latest(_module.state(m))


def test_a_repeated_call_is_one_launch_of_the_bound_entry(pointer_entries):
    ref, mine = _pair()
    with torch.no_grad():
        for i in range(4):
            x = torch.randn(3, 4, 16)
            torch.testing.assert_close(mine(x), ref(x), rtol=1e-5, atol=1e-5)
            bd = _bound(mine)
            assert bd is not None and bd.hits == i
    (entry,) = pointer_entries["fwd"]  # the public function ran once
    assert entry is bd.entry and entry.launches == 3


def test_forward_and_backward_bind_and_compute_from_the_pointers(pointer_entries):
    ref, mine = _pair()
    for _ in range(4):
        x = torch.randn(3, 4, 16, requires_grad=True)
        assert_same_grads(ref, mine, x, torch.randn(3, 4, 16))
    bd = _bound(mine)
    # call 1 binds the forward; call 2 launches it, and its backward (the lean store's hit)
    # binds the gradient's entry; calls 3 and 4 launch both
    assert bd.hits == 3 and len(pointer_entries["fwd"]) == 1
    ((_sig, entry),) = bd.grads.values()
    assert [entry] == pointer_entries["bwd"] and entry.launches == 3


def test_rms_norm_binds_forward_and_backward_and_computes_from_the_pointers(pointer_entries):
    if not hasattr(nn, "RMSNorm"):
        pytest.skip("torch.nn.RMSNorm needs torch >= 2.4")
    torch.manual_seed(0)
    ref = nn.RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        ref.weight.normal_()
    mine = pt.convert(copy.deepcopy(ref), strict=True)
    assert_rms_binds(ref, mine, mine, pointer_entries)


def assert_rms_binds(ref: nn.Module, mine: nn.Module, norm: nn.Module, entries: dict) -> None:
    """Four calls of *mine* with a gradient, then three without, give *ref*'s numbers and
    gradients; its RMS norm *norm* bound both signatures: the no-grad binding hit twice, the
    forward entries launched 3 and 2 times, the backward's 3."""
    for _ in range(4):
        x = torch.randn(3, 4, 16, requires_grad=True)
        assert_same_grads(ref, mine, x, torch.randn(3, 4, 16))
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(3, 4, 16)
            torch.testing.assert_close(mine(x), ref(x), rtol=1e-5, atol=1e-5)
    assert _bound(norm).hits == 2
    grad_fwd, nograd_fwd = entries["rms_fwd"]
    assert grad_fwd.launches == 3 and nograd_fwd.launches == 2
    (grad_bwd,) = entries["rms_bwd"]
    assert grad_bwd.launches == 3


@pytest.mark.parametrize(
    ("change", "grad"),
    [
        (lambda x, m: torch.randn(5, 16), False),  # another shape
        (lambda x, m: x.transpose(0, 1).contiguous().transpose(0, 1), False),  # other strides
        (lambda x, m: x.half(), False),  # another dtype
        (lambda x, m: x.requires_grad_(True), True),  # a gradient wanted now
        (lambda x, m: setattr(m, "eps", 1e-3) or x, False),  # the module's options
    ],
    ids=["shape", "strides", "dtype", "grad", "eps"],
)
def test_any_other_signature_takes_the_checked_path(pointer_entries, change, grad):
    ref, mine = _pair()
    with torch.no_grad():
        mine(torch.randn(3, 4, 16))
    first = _bound(mine)
    x = change(torch.randn(3, 4, 16), mine)
    ref.eps = mine.eps
    with torch.set_grad_enabled(grad):
        got = mine(x)
    torch.testing.assert_close(got.float(), ref(x.float()).to(x.dtype).float(), rtol=2e-3,
                               atol=2e-3)  # fmt: skip
    assert first.hits == 0  # never launched for a call of another signature


def test_a_module_whose_signature_keeps_changing_stops_binding(pointer_entries):
    _, mine = _pair()
    with torch.no_grad():
        for n in range(2, 2 + _binding.COLD_LIMIT + 2):
            mine(torch.randn(n, 16))
    st = _module.state(mine)
    assert st.get("nobind") is True and st.get("bound") is None
    made = len(pointer_entries["fwd"])
    with torch.no_grad():
        mine(torch.randn(2, 16))
        mine(torch.randn(2, 16))
    assert _module.state(mine).get("bound") is None
    assert len(pointer_entries["fwd"]) == made  # (the lean store still hits: no public call)


@pytest.mark.parametrize("prompts", ["same", "varying"])
def test_a_decoders_prompt_and_token_signatures_stay_bound(pointer_entries, prompts):
    """A decoder's layer sees a prompt's signature once per generation and a token's at every
    step after it: generation after generation the token's binding keeps launching (the
    module never stops binding, prompts of one length hit their own binding too)."""
    ref, mine = _pair()
    with torch.no_grad():
        for g in range(3 * _binding.COLD_LIMIT):
            n = 7 if prompts == "same" else 7 + g  # the prompt's length
            torch.testing.assert_close(mine(x := torch.randn(2, n, 16)), ref(x), rtol=1e-5,
                                       atol=1e-5)  # fmt: skip
            for _ in range(5):  # the tokens
                torch.testing.assert_close(mine(x := torch.randn(2, 1, 16)), ref(x), rtol=1e-5,
                                           atol=1e-5)  # fmt: skip
    st = _module.state(mine)
    assert not st.get("nobind") and len(st["bound"]) <= _binding.MAX_BINDINGS
    token = _binding.latest(st)
    assert token.sig[1] == (2, 1, 16) and token.hits == 3 * _binding.COLD_LIMIT * 5 - 1
    prompt = [b for b in st["bound"].values() if b.sig[1] == (2, 7, 16)]
    assert [b.hits for b in prompt] == ([3 * _binding.COLD_LIMIT - 1] if prompts == "same" else [])


def test_a_gradient_the_family_copies_is_recorded_once(pointer_entries, monkeypatch):
    """``loss.sum()`` hands the layer norm an expanded gradient, which its backward copies
    dense first: that backward cannot bind, and after its first try its gradient signature
    runs the family's path with no tape."""
    tapes = []

    class Counted(_lean.Tape):
        def __enter__(self):
            tapes.append(self)
            return super().__enter__()

    monkeypatch.setattr(_lean, "Tape", Counted)
    ref, mine = _pair()
    for _ in range(4):
        x = torch.randn(3, 4, 16, requires_grad=True)
        xr = x.detach().clone().requires_grad_()
        mine(x).sum().backward()
        ref(xr).sum().backward()
        torch.testing.assert_close(x.grad, xr.grad, rtol=1e-5, atol=1e-5)
        for a, b in zip(mine.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-5)
            a.grad = b.grad = None
    bd = _bound(mine)
    ((_sig, entry),) = bd.grads.values()
    assert entry is None and bd.hits == 3
    assert len(tapes) == 2  # the first forward's and the first backward's


def test_a_strided_input_binds_with_its_layout(pointer_entries):
    """A strided input (a transposed view) is taken as it is: the binding's output is laid out
    as the lean path lays it out (packed), not as the input."""
    ref, mine = _pair()
    for _ in range(3):
        x = torch.randn(3, 16, 4).transpose(1, 2)
        with torch.no_grad():
            y = mine(x)
        assert y.is_contiguous()
        torch.testing.assert_close(y, ref(x), rtol=1e-5, atol=1e-5)
    assert _bound(mine).hits == 2


def test_a_call_that_copies_its_input_binds_nothing(pointer_entries):
    """An expanded input is copied on the way (cuDNN takes no zero strides): the launch is not
    on the module's own tensors, so nothing is bound."""
    ref, mine = _pair()
    x = torch.randn(1, 16).expand(4, 16)
    with torch.no_grad():
        torch.testing.assert_close(mine(x), ref(x), rtol=1e-5, atol=1e-5)
    assert _bound(mine) is None


@pytest.mark.parametrize("bias", [True, False])
def test_linear_binds_its_product_and_both_gradient_products(pointer_entries, bias):
    """A converted Linear (float32 under ``allow_tf32``, so it runs on the product): the
    forward's product, then the input and weight gradients' products, each bound once and
    launched from then on; the bias gradient stays torch's sum."""
    torch.manual_seed(0)
    ref = nn.Linear(16, 8, bias=bias)
    mine = pt.convert(nn.Linear(16, 8, bias=bias), strict=True)
    mine.load_state_dict(ref.state_dict())
    with pycudnn.config.override(allow_tf32=True):
        with torch.no_grad():
            for _ in range(3):
                x = torch.randn(2, 5, 16)
                torch.testing.assert_close(mine(x), ref(x), rtol=1e-5, atol=1e-5)
        assert _bound(mine).hits == 2
        for _ in range(4):
            x = torch.randn(2, 5, 16, requires_grad=True)
            assert_same_grads(ref, mine, x, torch.randn(2, 5, 8))
    bd = _bound(mine)
    assert bd.hits == 3  # (the gradient's signature bound anew at the first call with grad)
    tags = sorted(tag for (_t, tag) in bd.grads)
    assert tags == ["linear_dw", "linear_dx"]
    # products the public function ran: the forward once (with or without a gradient: one lean
    # key) and each gradient once; the gradients' entries launched from the second backward on
    fwd, *grads = pointer_entries["mm"]
    assert len(grads) == 2 and fwd.launches == 6
    assert [e.launches for e in grads] == [3, 3]


def test_inside_a_recording_tape_a_call_only_runs(pointer_entries):
    """A launch program's first run records on its own tape: a module called inside it binds
    nothing (tapes do not nest) and its launch lands on that tape."""
    ref, mine = _pair()
    with torch.no_grad(), _lean.Tape() as tape:
        x = torch.randn(3, 4, 16)
        torch.testing.assert_close(mine(x), ref(x), rtol=1e-5, atol=1e-5)
    assert _bound(mine) is None and len(tape.launches) == 1


def test_bound_modules_compile_and_still_run_bound_after(pointer_entries):
    """``torch.compile`` of modules that hold bindings: dynamo never reads the side table (a
    guard on its weak dict's contents broke the compile of a bound model, seen on the GPU
    under ``reduce-overhead``), the compiled model gives eager's results, and eager calls
    afterwards still launch the bindings."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 8))
    mine = pt.convert(copy.deepcopy(ref), strict=True)
    x = torch.randn(3, 4, 16)
    with pycudnn.config.override(allow_tf32=True), torch.no_grad():
        for _ in range(2):
            mine(x)
        hits = [_bound(m).hits for m in mine]
        assert hits == [1, 1]
        compiled = torch.compile(mine, fullgraph=True)
        for _ in range(2):
            torch.testing.assert_close(compiled(x), ref(x), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(mine(x), ref(x), rtol=1e-4, atol=1e-4)
        assert [_bound(m).hits for m in mine] == [2, 2]


def test_clear_caches_reaches_the_bindings(pointer_entries):
    """``pycudnn.clear_caches()`` sends a bound module's next call through the public function,
    as it does for every cached entry; the call after that is bound again."""
    ref, mine = _pair()
    x = torch.randn(3, 4, 16)
    with torch.no_grad():
        mine(x)
        mine(x)
        assert len(pointer_entries["fwd"]) == 1 and _bound(mine).hits == 1
        pycudnn.clear_caches()
        torch.testing.assert_close(mine(x), ref(x), rtol=1e-5, atol=1e-5)
        assert len(pointer_entries["fwd"]) == 2  # the public function ran again
        mine(x)
    assert _bound(mine).entry is pointer_entries["fwd"][1] and _bound(mine).hits == 1


@pytest.mark.parametrize("kind", ["layer_norm", "linear"])
def test_a_bound_module_under_vmap_takes_torchs_path(pointer_entries, kind):
    """A functorch tensor has no storage to point at: a bound module asks an operand's type
    before its pointer, and ``torch.func.vmap`` runs torch's own forward (as unbound)."""
    torch.manual_seed(0)
    if kind == "linear":
        ref = nn.Linear(16, 8)
        mine = pt.convert(copy.deepcopy(ref), strict=True)
    else:
        ref, mine = _pair()
    with pycudnn.config.override(allow_tf32=True), torch.no_grad():
        x = torch.randn(3, 4, 16)
        mine(x)
        mine(x)
        assert _bound(mine).hits == 1
        xb = torch.randn(2, 3, 4, 16)
        got = torch.func.vmap(mine)(xb)
        torch.testing.assert_close(got, torch.func.vmap(ref)(xb), rtol=1e-5, atol=1e-5)
        assert _bound(mine).hits == 1


def test_transforming_is_asked_inside_torch_func_transforms():
    """``cuda_ok`` sends calls under ``torch.func`` transforms to torch's own implementation:
    their wrapped tensors look plain but have no storage to point at."""
    seen = []
    torch.func.vmap(lambda t: seen.append(_runtime.transforming()) or t)(torch.randn(2, 3))
    assert seen == [True] and not _runtime.transforming()
