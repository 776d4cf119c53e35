"""GPU tests of the transformer pieces of the PyTorch adapter ``pycudnn.torch`` (marker ``gpu``;
skipped without a device or without torch).

Run on the GPU machine:
``PYTHONPATH=. python3 -m pytest -m gpu -q -s tests/torch_adapter/test_torch_transformer_gpu.py``.

* ``pt.scaled_dot_product_attention`` (``dnn_sdpa`` / ``dnn_sdpa_grad``) against torch's
  ``F.scaled_dot_product_attention`` on its MATH backend in float32 (the inputs cast to float32):
  the output and the three gradients as relative L2 errors, in bfloat16 (forward 2e-2, gradients
  5e-2) and float16 (5e-3, 1e-2) -- or, where torch's own half-precision kernel is further off
  the float32 reference, within twice its error; causal and not, grouped-query and multi-query
  attention (``enable_gqa=True``), ``(B, S, H, D)`` projections passed as ``transpose(1, 2)``
  views (the output laid out the same way), 3-D and 5-D inputs, ``torch.no_grad``, autocast;
  the calls pycudnn leaves to torch (``attn_mask``, float32, head dim 20, CPU, heads mismatched
  without ``enable_gqa``) give torch's results.
* Dropout: the same torch seed gives the same output, another seed another one, the mean is
  kept (the 1/(1-p) scaling), and the backward regenerates the forward's mask (the output is
  linear in v, so ``<dout, out> = <dv, v>`` holds only with the same mask).
* ``LayerNorm`` / ``RMSNorm`` twins against torch's modules with the same ``state_dict``:
  forward and the input, weight and bias gradients, in float32 (relative L2 1e-4 against
  torch) and bfloat16 (1e-2 against torch's module in float32, or twice torch's own bfloat16
  error), LayerNorm's bfloat16-input/float32-parameter case, a strided input; ``convert``
  swaps them and back; float64 runs torch's forward.
* A training: a 2-block pre-norm transformer (width 256, 4 heads, causal attention computed in
  bfloat16 on float32 weights) learning to copy random token sequences (vocab 32, length 64,
  batch 32), 150 AdamW steps from the same weights and batches, once with torch
  (``F.scaled_dot_product_attention``, ``nn.LayerNorm``) and once with pycudnn
  (``pt.scaled_dot_product_attention``, the converted norms): the loss curves agree (0.1 at
  every step, 0.02 on 10-step running means) and both losses fall below half the first one. It
  prints ``TRAIN transformer ...`` (run with ``-s`` to see it).
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import torch_gpu  # noqa: E402  (tests/support)

import pycudnn.torch as pt  # noqa: E402

pytestmark = pytest.mark.gpu

DEV = "cuda"
HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}
# relative L2 errors against the float32 reference: (forward, gradients)
SDPA_TOL = {torch.bfloat16: (2e-2, 5e-2), torch.float16: (5e-3, 1e-2)}
HAS_RMSNORM = hasattr(nn, "RMSNorm")


@pytest.fixture(autouse=True)
def _exact_math():
    with torch_gpu.exact_math():
        yield


def _rel_l2(got, want):
    g, w = got.detach().double(), want.detach().double()
    assert g.shape == w.shape, (g.shape, w.shape)
    return ((g - w).norm() / w.norm().clamp_min(1e-30)).item()


def _math_backend():
    """torch's MATH attention backend as a context manager (torch >= 2.3), else a no-op."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # older torch: the float32 inputs below run its math path anyway
        import contextlib

        return contextlib.nullcontext()
    return sdpa_kernel(SDPBackend.MATH)


# ==================================================================================================
# scaled_dot_product_attention
# ==================================================================================================
def _reference(q, k, v, causal, dout):
    """torch's MATH attention in float32 (k and v heads repeated for grouped-query attention):
    the output and the gradients of q, k, v (k's and v's summed over each group)."""
    q, k, v = (t.detach().float().requires_grad_() for t in (q, k, v))
    rep = q.shape[-3] // k.shape[-3]
    kk = k.repeat_interleave(rep, dim=-3) if rep > 1 else k
    vv = v.repeat_interleave(rep, dim=-3) if rep > 1 else v
    with _math_backend():
        o = F.scaled_dot_product_attention(q, kk, vv, is_causal=causal)
    grads = torch.autograd.grad(o, (q, k, v), dout.float())
    return o, grads


def _torch_half(q, k, v, causal, dout):
    """torch's own half-precision attention (its default backend): output and gradients."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    rep = q.shape[-3] // k.shape[-3]
    kk = k.repeat_interleave(rep, dim=-3) if rep > 1 else k
    vv = v.repeat_interleave(rep, dim=-3) if rep > 1 else v
    o = F.scaled_dot_product_attention(q, kk, vv, is_causal=causal)
    return o, torch.autograd.grad(o, (q, k, v), dout)


SDPA_CASES = [
    # name, batch dims, Hq, Hk, Sq, Skv, D, causal, layout
    ("mha", (2,), 4, 4, 128, 128, 64, False, "bhsd"),
    ("mha-causal", (2,), 4, 4, 128, 128, 64, True, "bhsd"),
    ("gqa-causal", (2,), 8, 2, 96, 96, 64, True, "bhsd"),
    ("cross-lengths", (2,), 4, 4, 64, 160, 128, False, "bhsd"),
    ("bshd-views-causal", (2,), 4, 4, 128, 128, 64, True, "bshd"),
    ("mqa-bshd", (3,), 4, 1, 80, 80, 32, False, "bshd"),
    ("3d", (), 4, 4, 64, 64, 64, True, "bhsd"),
    ("5d", (2, 3), 2, 2, 48, 48, 16, False, "bhsd"),
]


def _qkv(batch, hq, hk, sq, skv, d, layout, dtype):
    """Leaf tensors and the (..., H, S, D) operands over them (views for the bshd layout)."""
    leaves, ops = [], []
    for h, s in ((hq, sq), (hk, skv), (hk, skv)):
        if layout == "bshd":
            leaf = torch.randn(*batch, s, h, d, device=DEV, dtype=dtype).requires_grad_()
            ops.append(leaf.transpose(-3, -2))
        else:
            leaf = torch.randn(*batch, h, s, d, device=DEV, dtype=dtype).requires_grad_()
            ops.append(leaf)
        leaves.append(leaf)
    return leaves, ops


@pytest.mark.parametrize("dt", list(HALF), ids=list(HALF))
@pytest.mark.parametrize(
    ("name", "batch", "hq", "hk", "sq", "skv", "d", "causal", "layout"),
    SDPA_CASES,
    ids=[c[0] for c in SDPA_CASES],
)
def test_sdpa_matches_torch_math_float32(name, batch, hq, hk, sq, skv, d, causal, layout, dt):
    dtype = HALF[dt]
    torch.manual_seed(0)
    leaves, (q, k, v) = _qkv(batch, hq, hk, sq, skv, d, layout, dtype)
    out = pt.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hq != hk)
    assert out.shape == (*batch, hq, sq, d) and out.dtype == dtype
    if layout == "bshd":  # the output laid out as the inputs: a (B, S, H, D) tensor's view
        assert out.transpose(-3, -2).is_contiguous(), out.stride()
    dout = torch.randn_like(out)
    grads = [
        g.transpose(-3, -2) if layout == "bshd" else g
        for g in torch.autograd.grad(out, leaves, dout)
    ]
    want, want_grads = _reference(q, k, v, causal, dout)
    tout, tgrads = _torch_half(q, k, v, causal, dout)
    tol_f, tol_b = SDPA_TOL[dtype]
    errs = {"out": (_rel_l2(out, want), _rel_l2(tout, want), tol_f)}
    for n, g, w, t in zip(("dq", "dk", "dv"), grads, want_grads, tgrads, strict=True):
        errs[n] = (_rel_l2(g, w), _rel_l2(t, w), tol_b)
    print(
        f"\nSDPA {name} {dt}: "
        + ", ".join(f"{n} {e:.1e} (torch {te:.1e})" for n, (e, te, _t) in errs.items())
    )
    bad = {n: e for n, (e, te, tol) in errs.items() if not e <= max(tol, 2 * te)}
    assert not bad, bad
    with torch.no_grad():  # cuDNN's inference variant: the same output (to a last-bit flip)
        again = pt.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hq != hk)
    assert _rel_l2(again, out) <= 5e-3


def test_sdpa_scale_and_single_query_row():
    torch.manual_seed(0)
    q = torch.randn(2, 4, 1, 64, device=DEV, dtype=torch.bfloat16)  # one query (decoding)
    k = torch.randn(2, 4, 40, 64, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(2, 4, 40, 64, device=DEV, dtype=torch.bfloat16)
    got = pt.scaled_dot_product_attention(q, k, v, scale=0.3)
    with _math_backend():
        want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=0.3)
    assert _rel_l2(got, want) <= 2e-2


def test_sdpa_leaves_what_cudnn_cannot_run_to_torch():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 32, 64, device=DEV, dtype=torch.float16) for _ in range(3))
    mask = torch.rand(32, 32, device=DEV) > 0.3
    mask[:, 0] = True
    for args, kwargs in (
        ((q, k, v), {"attn_mask": mask}),  # a mask tensor
        ((q.float(), k.float(), v.float()), {"is_causal": True}),  # float32
        ((q[..., :20], k[..., :20], v[..., :20]), {}),  # head dim 20
        ((q.cpu().float(), k.cpu().float(), v.cpu().float()), {}),  # CPU
    ):
        got = pt.scaled_dot_product_attention(*args, **kwargs)
        want = F.scaled_dot_product_attention(*args, **kwargs)
        torch.testing.assert_close(got, want)
    with pytest.raises(RuntimeError):  # heads 4 and 2 without enable_gqa: torch's error
        pt.scaled_dot_product_attention(q, k[:, :2], v[:, :2])


def test_sdpa_dropout_seeded_scaled_and_the_backward_uses_the_forwards_mask():
    torch.manual_seed(0)
    dtype, p = torch.float16, 0.3
    q, k, v = (
        torch.randn(2, 4, 128, 64, device=DEV, dtype=dtype).requires_grad_() for _ in range(3)
    )
    torch.manual_seed(5)
    o1 = pt.scaled_dot_product_attention(q, k, v, dropout_p=p)
    torch.manual_seed(5)
    o2 = pt.scaled_dot_product_attention(q, k, v, dropout_p=p)
    o3 = pt.scaled_dot_product_attention(q, k, v, dropout_p=p)  # another seed
    o0 = pt.scaled_dot_product_attention(q, k, v)
    assert torch.equal(o1, o2), "the same torch seed must give the same mask"
    assert not torch.equal(o1, o3)
    assert _rel_l2(o1, o0) > 0.1, "dropout changed nothing"
    # the mean is kept: with v = 1 every row of the output is 1 without dropout
    ones = torch.ones_like(v)
    r = pt.scaled_dot_product_attention(q, k, ones, dropout_p=p).float()
    assert abs(r.mean().item() - 1.0) < 0.02 and r.std().item() > 0.05, (r.mean(), r.std())
    # out = dropout(P) v is linear in v: <dout, out> = <dv, v> holds with the forward's mask
    dout = torch.randn_like(o1)
    dq, dk, dv = torch.autograd.grad(o1, (q, k, v), dout)
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv))
    assert dq.abs().max() > 0 and dk.abs().max() > 0
    terms = dout.double() * o1.double()
    lhs, rhs = terms.sum().item(), (dv.double() * v.double()).sum().item()
    assert abs(lhs - rhs) <= 0.02 * terms.norm().item(), (lhs, rhs, terms.norm().item())


def test_autocast_casts_the_attention_and_leaves_the_norms_to_torch():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 64, 64, device=DEV).requires_grad_() for _ in range(3))
    ln = nn.LayerNorm(64).to(DEV)
    mine = pt.convert(copy.deepcopy(ln))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got = pt.scaled_dot_product_attention(q, k, v, is_causal=True)
        want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert got.dtype == want.dtype == torch.bfloat16
        y, yt = mine(got), ln(want)
        assert y.dtype == yt.dtype
    assert _rel_l2(got, want) <= 2e-2 and _rel_l2(y, yt) <= 2e-2
    y.float().sum().backward()
    assert q.grad is not None and q.grad.dtype == torch.float32 and torch.isfinite(q.grad).all()


# ==================================================================================================
# LayerNorm and RMSNorm
# ==================================================================================================
NORMS = [
    ("ln", lambda: nn.LayerNorm(256), (4, 32, 256)),
    ("ln-no-bias", lambda: nn.LayerNorm(256, bias=False), (4, 32, 256)),
    ("ln-no-affine", lambda: nn.LayerNorm(256, elementwise_affine=False), (64, 256)),
    ("ln-2d-shape", lambda: nn.LayerNorm((8, 64), eps=1e-3), (16, 8, 64)),
    ("rms", lambda: nn.RMSNorm(256), (4, 32, 256)),
    ("rms-eps", lambda: nn.RMSNorm(256, eps=1e-6), (4, 32, 256)),
    ("rms-no-affine", lambda: nn.RMSNorm(256, elementwise_affine=False), (64, 256)),
]
NORM_DTYPES = {
    "fp32": (torch.float32, torch.float32),
    "bf16": (torch.bfloat16, torch.bfloat16),
    "bf16-x-fp32-params": (torch.bfloat16, torch.float32),  # LayerNorm only
}


def _randomize(m):
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.copy_(torch.randn_like(p) * (0.1 if name == "bias" else 0.5) + (name == "weight"))
    return m


def _norm_run(m, x, dy):
    x = x.detach().clone().requires_grad_()
    y = m(x)
    y.backward(dy.to(y.dtype))
    return y, [x.grad] + [p.grad for p in m.parameters()]


@pytest.mark.parametrize("dts", list(NORM_DTYPES), ids=list(NORM_DTYPES))
@pytest.mark.parametrize(("name", "make", "shape"), NORMS, ids=[n[0] for n in NORMS])
def test_norm_twins_match_torch(name, make, shape, dts):
    if name.startswith("rms") and not HAS_RMSNORM:
        pytest.skip("torch.nn.RMSNorm needs PyTorch >= 2.4")
    if name.startswith("rms") and dts == "bf16-x-fp32-params":
        pytest.skip("RMSNorm with mixed dtypes runs torch's forward (torch promotes)")
    xdt, pdt = NORM_DTYPES[dts]
    torch.manual_seed(0)
    ref32 = _randomize(make().to(DEV))
    ref = copy.deepcopy(ref32).to(pdt)
    mine = pt.convert(copy.deepcopy(ref), strict=True)
    assert type(mine) in (pt.LayerNorm, getattr(pt, "RMSNorm", None))
    assert list(mine.state_dict()) == list(ref.state_dict())
    x = (torch.randn(shape, device=DEV) * 2 + 0.5).to(xdt)
    dy = torch.randn(shape, device=DEV)
    ym, gm = _norm_run(mine, x, dy)
    try:
        yt, gt = _norm_run(ref, x, dy)
    except RuntimeError:  # torch 2.11's LayerNorm refuses bf16 input with float32 parameters
        yt, gt = ym, gm  # then only the float32 reference below judges
        torch_ran = False
    else:
        torch_ran = True
        assert ym.dtype == yt.dtype and ym.shape == yt.shape
    names = ["y", "dx"] + [f"d{n}" for n, _ in ref.named_parameters()]
    if xdt == torch.float32:
        errs = {
            n: (_rel_l2(a, b), 0.0) for n, a, b in zip(names, [ym, *gm], [yt, *gt], strict=True)
        }
        tol = 1e-4
    else:  # both against torch in float32 (eps as the half-precision module has it)
        r32 = copy.deepcopy(ref32)
        if getattr(r32, "eps", 0) is None:
            r32.eps = torch.finfo(xdt).eps
        y32, g32 = _norm_run(r32, x.float(), dy)
        errs = {
            n: (_rel_l2(a, w), _rel_l2(b, w) if torch_ran else 0.0)
            for n, a, b, w in zip(names, [ym, *gm], [yt, *gt], [y32, *g32], strict=True)
        }
        tol = 1e-2
    print(
        f"\nNORM {name} {dts}: "
        + ", ".join(f"{n} {e:.1e} (torch {t:.1e})" for n, (e, t) in errs.items())
    )
    bad = {n: e for n, (e, t) in errs.items() if not e <= max(tol, 2 * t)}
    assert not bad, bad
    with torch.no_grad():  # cuDNN's inference phase: the same output (to a last-bit flip)
        assert _rel_l2(mine(x), ym) <= (1e-5 if xdt == torch.float32 else 5e-3)


def test_layernorm_strided_input_and_float64_fallback():
    torch.manual_seed(0)
    ref = _randomize(nn.LayerNorm(256).to(DEV))
    mine = pt.convert(copy.deepcopy(ref))
    big = torch.randn(4, 32, 512, device=DEV)
    x = big[..., 128:384]  # rows 512 apart
    dy = torch.randn(4, 32, 256, device=DEV)
    ym, gm = _norm_run(mine, x, dy)
    yt, gt = _norm_run(ref, x, dy)
    for a, b in zip([ym, *gm], [yt, *gt], strict=True):
        assert _rel_l2(a, b) <= 1e-4
    ref64, mine64 = ref.double(), copy.deepcopy(mine).double()  # float64: torch's forward
    x64 = torch.randn(8, 256, device=DEV, dtype=torch.float64)
    torch.testing.assert_close(mine64(x64), ref64(x64), rtol=0, atol=0)
    with pytest.warns(UserWarning, match="stays a torch module"):
        assert type(pt.convert(nn.LayerNorm(8).double())) is nn.LayerNorm


def test_convert_swaps_the_norms_and_back():
    mods = [nn.LayerNorm(16), nn.Linear(16, 16)] + ([nn.RMSNorm(16)] if HAS_RMSNORM else [])
    model = nn.Sequential(*mods).to(DEV)
    keys = list(model.state_dict())
    pt.convert(model)
    assert type(model[0]) is pt.LayerNorm and type(model[1]) is pt.Linear
    if HAS_RMSNORM:
        assert type(model[2]) is pt.RMSNorm
    assert list(model.state_dict()) == keys
    model(torch.randn(3, 16, device=DEV)).sum().backward()
    pt.convert(model, back=True)
    assert type(model[0]) is nn.LayerNorm
    if HAS_RMSNORM:
        assert type(model[2]) is nn.RMSNorm


# ==================================================================================================
# Training a small transformer
# ==================================================================================================
VOCAB, SEQ, BATCH, WIDTH, HEADS, DEPTH = 32, 64, 32, 256, 4, 2


class _Block(nn.Module):
    """Pre-norm block: x + attention(LayerNorm(x)), then x + MLP(LayerNorm(x)); the attention
    (causal) in bfloat16 on float32 weights."""

    def __init__(self, attend):
        super().__init__()
        self.attend = attend
        self.ln1 = nn.LayerNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.ln2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)
        )

    def forward(self, x):
        b, s, w = x.shape
        qkv = self.qkv(self.ln1(x)).to(torch.bfloat16).view(b, s, 3, HEADS, w // HEADS)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))  # (B, H, S, D) views
        a = self.attend(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, w).float())
        return x + self.mlp(self.ln2(x))


class _TinyLM(nn.Module):
    def __init__(self, attend):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Embedding(SEQ, WIDTH)
        self.blocks = nn.ModuleList(_Block(attend) for _ in range(DEPTH))
        self.ln = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, idx):
        x = self.tok(idx) + self.pos.weight[: idx.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def _copy_batches(steps):
    """Random first halves (tokens 1..31) followed by their copy; the same for both runs."""
    g = torch.Generator().manual_seed(1)
    half = torch.randint(1, VOCAB, (steps, BATCH, SEQ // 2), generator=g)
    return torch.cat([half, half], dim=2).to(DEV)


def _train_lm(model, batches):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    losses = []
    h = SEQ // 2
    for seq in batches:
        logits = model(seq)
        # predict the copied half: positions h-1 .. SEQ-2 predict tokens h .. SEQ-1
        loss = F.cross_entropy(logits[:, h - 1 : -1].reshape(-1, VOCAB), seq[:, h:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses).cpu().numpy()


def test_transformer_training_matches_torch():
    steps = 150
    torch.manual_seed(0)
    ref = _TinyLM(F.scaled_dot_product_attention).to(DEV)
    mine = pt.convert(copy.deepcopy(ref), strict=True)
    for blk in mine.blocks:
        blk.attend = pt.scaled_dot_product_attention
    converted = [m for m in mine.modules() if type(m) is pt.LayerNorm]
    assert len(converted) == 2 * DEPTH + 1
    batches = _copy_batches(steps)
    lt = _train_lm(ref, batches)
    lp = _train_lm(mine, batches)
    diff = np.abs(lt - lp)
    window = np.ones(10) / 10
    smooth = np.abs(np.convolve(lt, window, "valid") - np.convolve(lp, window, "valid"))
    print(
        f"\nTRAIN transformer steps={steps} torch_loss={lt[-1]:.4f} pycudnn_loss={lp[-1]:.4f} "
        f"max_loss_diff={diff.max():.2e} max_mean10_diff={smooth.max():.2e} "
        f"first_loss={lt[0]:.4f} (ln {VOCAB} = {math.log(VOCAB):.4f})"
    )
    assert np.isfinite(lp).all()
    assert diff.max() <= 0.1, f"losses differ by {diff.max():.3g} at step {diff.argmax()}"
    assert smooth.max() <= 0.02, f"running means differ by {smooth.max():.3g}"
    assert lt[-10:].mean() < 0.5 * lt[0] and lp[-10:].mean() < 0.5 * lp[0], (lt[-10:], lp[-10:])
