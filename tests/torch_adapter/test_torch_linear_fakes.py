"""``pycudnn.torch.Linear``'s plumbing on the CPU: ``dnn_matmul`` replaced by a torch computation
behind its **real signature** (each call is bound to the real function's signature first, so a
wrong argument name, order or count fails here), CPU tensors let through.

What this proves without a GPU: the leading dims are flattened and restored, the output is the
``out=`` given, the bias is fused into the forward call, the backward makes one ``dnn_matmul`` per
gradient asked for (``dw`` from a transposed view of ``dy``, not a copy), the gradients come back
one per input and in the parameters' dtypes under autocast, and the fallbacks (float32 without
``allow_tf32``, float64, CPU tensors, empty inputs, mismatched dtypes) run torch's ``F.linear``.
cuDNN's numbers are the GPU tier's, ``test_torch_linear_gpu.py``.
"""

from __future__ import annotations

import copy
import inspect

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import pycudnn  # noqa: E402
from pycudnn import highlevel as hl  # noqa: E402
from pycudnn import torch as pt  # noqa: E402
from pycudnn.torch import _runtime, linear  # noqa: E402

CALLS: list[dict] = []
_SIG = inspect.signature(hl.dnn_matmul)


def _packed(t):
    """Rows or columns packed (what the adapter promises dnn_matmul): no zero strides."""
    (m, n), (s0, s1) = t.shape, t.stride()
    return (s1 == 1 and s0 >= max(n, 1)) or (s0 == 1 and s1 >= max(m, 1))


def fake_matmul(*args, **kwargs):
    """``dnn_matmul`` as torch computes it (in float64, rounded to the operands' dtype once)."""
    ba = _SIG.bind(*args, **kwargs)
    ba.apply_defaults()
    a, b, bias, act, out = (ba.arguments[k] for k in ("a", "b", "bias", "activation", "out"))
    assert act is None and out is not None and isinstance(ba.arguments["stream"], int)
    assert a.dim() == b.dim() == 2 and a.shape[1] == b.shape[0], (a.shape, b.shape)
    assert _packed(a) and _packed(b) and out.is_contiguous()
    assert out.shape == (a.shape[0], b.shape[1])
    assert a.dtype == b.dtype == out.dtype
    if a.dtype == torch.float32 and not pycudnn.config.snapshot().allow_tf32:
        raise pycudnn.errors.NotSupportedError(3000, "dnn_matmul", "float32 needs allow_tf32")
    r = a.double() @ b.double()
    if bias is not None:
        assert bias.shape == (b.shape[1],) and bias.dtype == a.dtype
        r = r + bias.double()
    out.copy_(r.to(out.dtype))
    CALLS.append({"a": a, "b": b, "bias": bias is not None, "out": out})
    return out


def _cuda_ok(x, dtypes=_runtime.FLOATS):
    return type(x) in (torch.Tensor, nn.Parameter) and x.dtype in dtypes


@pytest.fixture(autouse=True)
def fakes(monkeypatch):
    monkeypatch.setattr(linear, "dnn_matmul", fake_matmul)
    monkeypatch.setattr(linear, "cuda_ok", _cuda_ok)
    monkeypatch.setattr(_runtime, "raw_stream", lambda device: 0)
    monkeypatch.setattr(_runtime, "_AUTO", [False])  # no allocator to install on the CPU
    CALLS.clear()
    yield


def _pair(bias=True, dtype=torch.float32, k=8, n=5):
    torch.manual_seed(0)
    ref = nn.Linear(k, n, bias=bias).to(dtype)
    mine = pt.convert(copy.deepcopy(ref), strict=True)
    assert type(mine) is pt.Linear
    return ref, mine


def _run(m, x, dy):
    x = x.clone().requires_grad_()
    y = m(x)
    y.backward(dy)
    return y, x.grad, [p.grad for p in m.parameters()]


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("lead", [(), (3,), (2, 3), (2, 1, 3)], ids=str)
def test_forward_and_gradients_through_the_real_signature(lead, bias):
    ref, mine = _pair(bias)
    x = torch.randn(*lead, 8)
    dy = torch.randn(*lead, 5)
    with pycudnn.config.override(allow_tf32=True):
        ym, dxm, dpm = _run(mine, x, dy)
    yr, dxr, dpr = _run(ref, x, dy)
    assert ym.shape == yr.shape == (*lead, 5)
    torch.testing.assert_close(ym, yr)
    torch.testing.assert_close(dxm, dxr)
    for a, b in zip(dpm, dpr, strict=True):
        torch.testing.assert_close(a, b)
    fwd, gx, gw = CALLS  # one forward call, one per gradient
    assert fwd["bias"] is bias and not gx["bias"] and not gw["bias"]
    assert fwd["b"].stride(0) == 1 and fwd["b"].data_ptr() == mine.weight.data_ptr()  # w.t()
    assert gw["a"].stride(0) == 1 and gw["a"].t().is_contiguous()  # dy2.t(): a view, no copy
    assert gw["out"].shape == mine.weight.shape and gx["out"].shape == (x[..., 0].numel(), 8)


def test_bfloat16_runs_the_fake_in_its_dtype():
    ref, mine = _pair(dtype=torch.bfloat16)
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    dy = torch.randn(4, 5, dtype=torch.bfloat16)
    ym, dxm, dpm = _run(mine, x, dy)  # no flag needed: bfloat16 is cuDNN's
    yr, dxr, dpr = _run(ref, x, dy)
    assert ym.dtype == torch.bfloat16 and len(CALLS) == 3
    torch.testing.assert_close(ym, yr, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(dxm, dxr, rtol=2e-2, atol=2e-2)
    for a, b in zip(dpm, dpr, strict=True):
        assert a.dtype == torch.bfloat16
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)


def test_non_contiguous_inputs():
    ref, mine = _pair()
    with pycudnn.config.override(allow_tf32=True):
        # a transposed view of a (K, B) tensor: passed as it is (column-major)
        base = torch.randn(8, 6)
        x = base.t()
        torch.testing.assert_close(mine(x), ref(x))
        assert CALLS[-1]["a"].data_ptr() == base.data_ptr() and CALLS[-1]["a"].stride(0) == 1
        # (T, B, K) seen as (B, T, K): the leading dims do not flatten, reshape copies
        x3 = torch.randn(3, 2, 8).transpose(0, 1)
        dy = torch.randn(2, 3, 5)
        ym, dxm, dpm = _run(mine, x3, dy)
        yr, dxr, dpr = _run(ref, x3, dy)
        torch.testing.assert_close(ym, yr)
        torch.testing.assert_close(dxm, dxr)
        for a, b in zip(dpm, dpr, strict=True):
            torch.testing.assert_close(a, b)
        # an expanded gradient (zero strides, what sum().backward() sends): a packed copy
        x = torch.randn(2, 4, 8, requires_grad=True)
        mine(x).sum().backward()
        xr = x.detach().clone().requires_grad_()
        ref(xr).sum().backward()
        torch.testing.assert_close(x.grad, xr.grad)


@pytest.mark.parametrize("which", ["x", "weight", "bias"])
def test_only_the_gradients_asked_for(which):
    _ref, mine = _pair()
    x = torch.randn(4, 8, requires_grad=which == "x")
    for name, p in mine.named_parameters():
        p.requires_grad_(name == which)
    with pycudnn.config.override(allow_tf32=True):
        mine(x).backward(torch.randn(4, 5))
    grads = {"x": x.grad, "weight": mine.weight.grad, "bias": mine.bias.grad}
    assert [k for k, g in grads.items() if g is not None] == [which]
    # the forward call, then dnn_matmul only for dx or dw (db is a sum)
    assert len(CALLS) == (1 if which == "bias" else 2)


def test_the_backward_keeps_the_forwards_tf32_choice():
    """float32 on cuDNN under ``config.override(allow_tf32=True)``: the backward, which autograd
    may run outside the override (or on another thread), still runs on cuDNN."""
    ref, mine = _pair()
    x = torch.randn(4, 8)
    dy = torch.randn(4, 5)
    xm = x.clone().requires_grad_()
    with pycudnn.config.override(allow_tf32=True):
        ym = mine(xm)
    ym.backward(dy)  # outside the override
    _yr, dxr, dpr = _run(ref, x, dy)
    assert len(CALLS) == 3
    torch.testing.assert_close(xm.grad, dxr)
    for a, b in zip(mine.parameters(), dpr, strict=True):
        torch.testing.assert_close(a.grad, b)


def test_no_grad_saves_nothing_and_runs_one_call():
    _ref, mine = _pair()
    with torch.no_grad(), pycudnn.config.override(allow_tf32=True):
        y = mine(torch.randn(4, 8))
    assert not y.requires_grad and len(CALLS) == 1


def test_float32_without_allow_tf32_runs_torch():
    ref, mine = _pair()
    x = torch.randn(2, 3, 8)
    with pycudnn.config.override(allow_tf32=False):
        assert torch.equal(mine(x), ref(x))
    assert CALLS == []


@pytest.mark.parametrize(
    "case", ["cpu", "float64", "empty", "mixed-dtypes", "wrong-width", "fp32-autocast"]
)
def test_fallbacks_run_torch(case, monkeypatch):
    ref, mine = _pair()
    x = torch.randn(4, 8)
    if case == "cpu":  # the real check: CPU tensors are not cuDNN's
        monkeypatch.setattr(linear, "cuda_ok", _runtime.cuda_ok)
        ref, mine, x = ref.bfloat16(), mine.bfloat16(), x.bfloat16()
    elif case == "float64":
        ref, mine, x = ref.double(), mine.double(), x.double()
    elif case == "empty":
        ref, mine, x = ref.bfloat16(), mine.bfloat16(), torch.randn(0, 8).bfloat16()
    elif case == "mixed-dtypes":
        x = x.bfloat16()
    elif case == "wrong-width":
        ref, mine, x = ref.bfloat16(), mine.bfloat16(), torch.randn(4, 7).bfloat16()
    else:  # an autocast dtype other than float16/bfloat16: autocast's own rules
        monkeypatch.setattr(linear, "autocast_dtype", lambda: torch.float32)
    with pycudnn.config.override(allow_tf32=True):
        try:
            want = ref(x)
        except RuntimeError as exc:  # torch's error, raised by the twin as well
            with pytest.raises(type(exc)):
                mine(x)
        else:
            got = mine(x)
            assert got.shape == want.shape and torch.equal(got, want)
    assert CALLS == []


@pytest.mark.parametrize("ac", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_autocast_casts_the_operands_and_returns_gradients_in_the_parameters_dtype(
    ac, x_dtype, monkeypatch
):
    """As autocast casts F.linear: every floating operand to its dtype (an input already in
    another half dtype too); the ``.to`` casts are in the graph."""
    monkeypatch.setattr(linear, "autocast_dtype", lambda: ac)
    ref, mine = _pair()
    x0 = torch.randn(2, 3, 8).to(x_dtype)
    x = x0.clone().requires_grad_()
    y = mine(x)
    assert y.dtype == ac and len(CALLS) == 1
    assert all(CALLS[0][k].dtype == ac for k in ("a", "b", "out"))
    dy = torch.randn(2, 3, 5)
    y.backward(dy.to(ac))
    assert x.grad.dtype == x_dtype
    assert mine.weight.grad.dtype == mine.bias.grad.dtype == torch.float32
    # against the same product on the cast operands, in float64
    xr = x0.to(ac).double().requires_grad_()
    wr = ref.weight.detach().to(ac).double().requires_grad_()
    br = ref.bias.detach().to(ac).double().requires_grad_()
    yr = F.linear(xr, wr, br)
    yr.backward(dy.to(ac).double())
    tol = {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(y.double(), yr, **tol)
    torch.testing.assert_close(x.grad.double(), xr.grad, **tol)
    torch.testing.assert_close(mine.weight.grad.double(), wr.grad, **tol)
    torch.testing.assert_close(mine.bias.grad.double(), br.grad, **tol)


@pytest.mark.filterwarnings("ignore:Complex modules:UserWarning")
def test_convert_rule_and_back():
    m = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2, bias=False))
    keys = list(m.state_dict())
    pt.convert(m)
    assert [type(c) for c in m] == [pt.Linear, pt.Linear] and list(m.state_dict()) == keys
    assert pt.unsupported_reason(m[0]) is None
    bad = nn.Linear(2, 2).to(torch.complex64)
    assert "cuDNN computes on" in pt.unsupported_reason(bad)
    with pytest.warns(UserWarning, match="stays a torch module"):
        assert type(pt.convert(bad)) is nn.Linear
    assert repr(pt.Linear(4, 3)) == repr(nn.Linear(4, 3))
    pt.convert(m, back=True)
    assert [type(c) for c in m] == [nn.Linear, nn.Linear]
