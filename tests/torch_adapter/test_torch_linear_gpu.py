"""GPU tests of ``pycudnn.torch.Linear`` (``dnn_matmul``; marker ``gpu``, skipped without a device
or without torch).

Run on the GPU machine:
``PYTHONPATH=. python3 -m pytest -m gpu -q tests/torch_adapter/test_torch_linear_gpu.py``.

* The converted twin (a deep copy: the same parameters) against ``torch.nn.Linear``: the output
  and the input, weight and bias gradients as max errors relative to max |torch's| (float16
  1e-2, bfloat16 4e-2), for 1-D inputs and leading dims ``(B,)``, ``(B, T)``, with and without
  bias; non-contiguous inputs (a transposed ``(T, B, K)`` view, a column-major ``x.t()``, rows
  of a wider buffer); odd feature counts; ``torch.no_grad``. Each checks that ``dnn_matmul``
  ran (a spy around it counts the calls).
* float32: without ``pycudnn.config.allow_tf32`` torch's ``F.linear`` runs (bitwise torch's
  results, no ``dnn_matmul`` call); with it cuDNN's TF32 product matches float64 and torch's own
  TF32 (``torch.backends.cuda.matmul.allow_tf32``) within 1e-2 of max |ref|.
* Autocast (bfloat16, float16) with float32 parameters, a float32 or bfloat16 input, the
  backward outside or inside the region: the output dtype is torch's, the values and gradients
  match torch's autocast, and the gradients come back in the parameters' dtypes.
* HuggingFace Llama (``transformers``; skipped without it): a small ``LlamaForCausalLM`` built
  from its config (no download) in bfloat16, ``convert`` turns every projection and the
  ``lm_head`` into ``pt.Linear``; the logits and every parameter's gradient of the loss are as
  close to a float32 copy's as torch's own bfloat16 run is (twice its relative L2 error, or
  2e-2).
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import torch_gpu  # noqa: E402  (tests/support)

import pycudnn  # noqa: E402  (torch first: both then use the same libcudnn)
import pycudnn.torch as pt  # noqa: E402
from pycudnn.torch import linear  # noqa: E402

pytestmark = pytest.mark.gpu

DEV = "cuda"
HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}
TOL = {torch.float16: 1e-2, torch.bfloat16: 4e-2}  # max error over max |torch's|
TF32_TOL = 1e-2  # TF32 products (10-bit mantissas): max error over max |ref|


@pytest.fixture(autouse=True)
def _settings():
    """TF32 off on torch's side and on pycudnn's (see ``torch_gpu.exact_math``)."""
    with torch_gpu.exact_math(), pycudnn.config.override(allow_tf32=False):
        yield


@pytest.fixture
def calls(monkeypatch):
    """The ``dnn_matmul`` calls the adapter makes (the real function runs). The caches are
    emptied first: a product whose signature an earlier test bound is launched without a call
    (the lean path), so only a fresh cache shows one call per product."""
    pycudnn.clear_caches()
    seen: list[tuple] = []
    real = linear.dnn_matmul

    def spy(*args, **kwargs):
        seen.append(tuple(args[0].shape))
        return real(*args, **kwargs)

    monkeypatch.setattr(linear, "dnn_matmul", spy)
    return seen


def _err(got, want):
    """max |got - want| / max |want|."""
    g, w = got.detach().double(), want.detach().double()
    assert g.shape == w.shape, (g.shape, w.shape)
    return ((g - w).abs().max() / w.abs().max().clamp_min(1e-30)).item()


def _rel_l2(got, want):
    g, w = got.detach().double(), want.detach().double()
    assert g.shape == w.shape, (g.shape, w.shape)
    return ((g - w).norm() / w.norm().clamp_min(1e-30)).item()


def _twin(ref):
    mine = pt.convert(copy.deepcopy(ref), strict=True)
    assert type(mine) is pt.Linear
    return mine


def _run(m, x, dy):
    """Output, input gradient and parameter gradients of *m* on a fresh leaf copy of *x*."""
    for p in m.parameters():
        p.grad = None
    x = x.detach().clone().requires_grad_()
    y = m(x)
    y.backward(dy)
    return [y, x.grad, *(p.grad for p in m.parameters())]


def _compare(ref, x, dy, tol, what):
    mine = _twin(ref)
    got, want = _run(mine, x, dy), _run(ref, x, dy)
    for name, g, w in zip(("y", "dx", "dw", "db"), got, want, strict=False):
        assert g.dtype == w.dtype, (what, name, g.dtype, w.dtype)
        assert _err(g, w) <= tol, f"{what} {name}: {_err(g, w):.3g}"


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("lead", [(), (7,), (4, 33)], ids=["1d", "B", "BT"])
@pytest.mark.parametrize("dt", list(HALF))
def test_matches_torch(dt, lead, bias, calls):
    dtype = HALF[dt]
    torch.manual_seed(0)
    ref = nn.Linear(64, 48, bias=bias).to(DEV, dtype)
    x = torch.randn(*lead, 64, device=DEV, dtype=dtype)
    dy = torch.randn(*lead, 48, device=DEV, dtype=dtype)
    _compare(ref, x, dy, TOL[dtype], f"{dt} {lead}")
    assert len(calls) == 3  # forward (bias fused), dx, dw


@pytest.mark.parametrize("layout", ["transposed-TBK", "column-major", "row-pitch"])
@pytest.mark.parametrize("dt", list(HALF))
def test_non_contiguous_inputs(dt, layout, calls):
    dtype = HALF[dt]
    torch.manual_seed(0)
    ref = nn.Linear(64, 40).to(DEV, dtype)
    if layout == "transposed-TBK":  # (T, B, K) seen as (B, T, K): reshape copies
        x = torch.randn(33, 4, 64, device=DEV, dtype=dtype).transpose(0, 1)
    elif layout == "column-major":  # x.t() of a (K, B) tensor: read as it is
        x = torch.randn(64, 20, device=DEV, dtype=dtype).t()
    else:  # rows 96 elements apart
        x = torch.randn(4, 8, 96, device=DEV, dtype=dtype)[..., :64]
    assert not x.is_contiguous()
    dy = torch.randn(*x.shape[:-1], 40, device=DEV, dtype=dtype)
    _compare(ref, x, dy, TOL[dtype], f"{dt} {layout}")
    assert len(calls) == 3


@pytest.mark.parametrize("dt", list(HALF))
def test_odd_feature_counts(dt, calls):
    """13 -> 7 features: rows not 16-byte aligned (a vocabulary of 50257 has such rows). If cuDNN
    has no engine for them, the adapter needs a rule that leaves them to torch."""
    dtype = HALF[dt]
    torch.manual_seed(0)
    ref = nn.Linear(13, 7).to(DEV, dtype)
    x = torch.randn(5, 13, device=DEV, dtype=dtype)
    dy = torch.randn(5, 7, device=DEV, dtype=dtype)
    _compare(ref, x, dy, TOL[dtype], f"{dt} odd")


def test_no_grad_and_an_expanded_gradient(calls):
    torch.manual_seed(0)
    ref = nn.Linear(32, 16).to(DEV, torch.bfloat16)
    mine = _twin(ref)
    x = torch.randn(3, 5, 32, device=DEV, dtype=torch.bfloat16)
    with torch.no_grad():
        y = mine(x)
    assert not y.requires_grad and len(calls) == 1
    assert _err(y, ref(x)) <= TOL[torch.bfloat16]
    xm, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    mine(xm).sum().backward()  # dy: an expanded (zero-stride) tensor
    ref(xr).sum().backward()
    assert _err(xm.grad, xr.grad) <= TOL[torch.bfloat16]
    assert _err(mine.weight.grad, ref.weight.grad) <= TOL[torch.bfloat16]


def test_float32_without_allow_tf32_is_torchs(calls):
    torch.manual_seed(0)
    ref = nn.Linear(64, 48).to(DEV)
    x = torch.randn(4, 33, 64, device=DEV)
    dy = torch.randn(4, 33, 48, device=DEV)
    got, want = _run(_twin(ref), x, dy), _run(ref, x, dy)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert calls == []


def test_float32_with_allow_tf32_runs_cudnn(calls):
    torch.manual_seed(0)
    ref = nn.Linear(64, 48).to(DEV)
    mine = _twin(ref)
    x = torch.randn(4, 33, 64, device=DEV)
    dy = torch.randn(4, 33, 48, device=DEV)
    with pycudnn.config.override(allow_tf32=True):  # thread-local; autograd's CUDA backward
        got = _run(mine, x, dy)  # runs on its own thread: the forward's choice must carry
    assert len(calls) == 3
    exact = _run(copy.deepcopy(ref).double(), x.double(), dy.double())
    torch.backends.cuda.matmul.allow_tf32 = True  # torch's own TF32 (the fixture restores it)
    tf32 = _run(ref, x, dy)
    for name, g, e, t in zip(("y", "dx", "dw", "db"), got, exact, tf32, strict=True):
        assert g.dtype == torch.float32
        assert _err(g, e) <= TF32_TOL, f"{name} vs float64: {_err(g, e):.3g}"
        assert _err(g, t) <= TF32_TOL, f"{name} vs torch's TF32: {_err(g, t):.3g}"


@pytest.mark.parametrize("backward_inside", [False, True], ids=["bwd-outside", "bwd-inside"])
@pytest.mark.parametrize("x_dt", ["fp32", "bf16"])
@pytest.mark.parametrize("dt", list(HALF))
def test_autocast(dt, x_dt, backward_inside, calls):
    dtype = HALF[dt]
    torch.manual_seed(0)
    ref = nn.Linear(64, 48).to(DEV)  # float32 parameters
    mine = _twin(ref)
    x = torch.randn(4, 16, 64, device=DEV, dtype=torch.float32 if x_dt == "fp32" else HALF[x_dt])
    res = []
    for m in (mine, ref):
        xi = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=dtype):
            y = m(xi)
            dy = torch.ones_like(y) + torch.arange(48, device=DEV, dtype=y.dtype) / 48
            if backward_inside:
                y.backward(dy)
        if not backward_inside:
            y.backward(dy)
        res.append([y, xi.grad, m.weight.grad, m.bias.grad])
    assert len(calls) == 3  # the twin ran on cuDNN
    (ym, *gm), (yr, *gr) = res
    assert ym.dtype == yr.dtype == dtype
    assert [g.dtype for g in gm] == [g.dtype for g in gr] == [x.dtype, torch.float32, torch.float32]
    for name, g, w in zip(("y", "dx", "dw", "db"), [ym, *gm], [yr, *gr], strict=True):
        assert _err(g, w) <= TOL[dtype], f"{name}: {_err(g, w):.3g}"


# ==================================================================================================
# HuggingFace Llama
# ==================================================================================================
PROJECTIONS = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def test_huggingface_llama(calls):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=128,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM(cfg).to(DEV, torch.bfloat16)
    f32 = copy.deepcopy(ref).float()
    mine = pt.convert(copy.deepcopy(ref))
    linears = {n: m for n, m in mine.named_modules() if isinstance(m, nn.Linear)}
    assert len(linears) == 7 * cfg.num_hidden_layers + 1
    assert all(type(m) is pt.Linear for m in linears.values()), linears
    assert {n.rsplit(".", 1)[-1] for n in linears} == PROJECTIONS | {"lm_head"}
    ids = torch.randint(0, cfg.vocab_size, (2, 32), device=DEV)
    res = {}
    for name, m in (("torch", ref), ("pycudnn", mine), ("fp32", f32)):
        out = m(input_ids=ids, labels=ids)
        out.loss.backward()
        res[name] = (out.logits, {n: p.grad for n, p in m.named_parameters()})
    assert calls, "no dnn_matmul call"
    (lt, gt), (lm, gm), (lf, gf) = res["torch"], res["pycudnn"], res["fp32"]
    assert lm.dtype == lt.dtype and torch.isfinite(lm).all()
    assert _rel_l2(lm, lf) <= max(2 * _rel_l2(lt, lf), 2e-2), (_rel_l2(lm, lf), _rel_l2(lt, lf))
    assert set(gm) == set(gt) == set(gf)
    for n in gf:
        assert gm[n].dtype == gt[n].dtype, n
        want = max(2 * _rel_l2(gt[n], gf[n]), 2e-2)
        assert _rel_l2(gm[n], gf[n]) <= want, (n, _rel_l2(gm[n], gf[n]), _rel_l2(gt[n], gf[n]))
