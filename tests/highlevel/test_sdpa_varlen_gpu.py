"""GPU tests of packed variable-length attention (marker ``gpu``; skipped without a device or
without torch). Run on the GPU machine:
``PYTHONPATH=. python3 -m pytest -m gpu -q -s tests/highlevel/test_sdpa_varlen_gpu.py``.

``dnn_sdpa_varlen`` / ``dnn_sdpa_varlen_grad`` on random batches of packed sequences (random
lengths, a length-1 sequence in each, q and kv lengths apart; fp16 and bf16; causal and not;
grouped-query heads; D 64 and 128), each checked two ways:

* against a float32 torch reference computed sequence by sequence (matmul-softmax-matmul,
  autograd for the gradients), as relative L2 errors: < 5e-3 (fp16) / 2e-2 (bf16) forward,
  < 1e-2 / 2e-2 backward (``test_transformer_gpu.py``'s bounds), the log-sum-exp statistics
  within 1e-2 absolute;
* against the padded equivalent: the same sequences padded into ``(B, S_max, H, D)`` and run
  through ``dnn_sdpa`` / ``dnn_sdpa_grad`` with ``seq_lens_q`` / ``seq_lens_kv`` (valid rows
  only), within the same bounds.

There are no padding tokens between packed sequences, so every token must be written: ``out``
is NaN-poisoned before the forward, and every result is checked for NaN. Kept small (< 30 s).
"""

from __future__ import annotations

import itertools
import math

import pytest

torch = pytest.importorskip("torch")

import pycudnn  # noqa: E402

pytestmark = pytest.mark.gpu
FWD = {torch.float16: 5e-3, torch.bfloat16: 2e-2}
BWD = {torch.float16: 1e-2, torch.bfloat16: 2e-2}


def _t(x):
    return x if isinstance(x, torch.Tensor) else torch.from_dlpack(x)


def _rel(got, ref):
    got, ref = _t(got).float(), ref.float()
    assert not torch.isnan(got).any(), "an element was not written (NaN)"
    return ((got - ref).norm() / ref.norm().clamp_min(1e-6)).item()


def _lengths(gen, b, top):
    """Random lengths in [1, top], with a 1 and a *top* among them."""
    n = torch.randint(1, top + 1, (b,), generator=gen).tolist()
    n[0], n[-1] = 1, top
    return n


def _lens(cu):
    return [b - a for a, b in itertools.pairwise(cu)]


def _cu(lens):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return out


def _case(dt, h, hk, d, seed, b=5, sq=96, skv=80):
    gen = torch.Generator().manual_seed(seed)
    lq, lk = _lengths(gen, b, sq), _lengths(gen, b, skv)
    cq, ck = _cu(lq), _cu(lk)

    def rnd(t, heads):
        return (torch.randn(t, heads, d, generator=gen) * 0.5).to("cuda", dt)

    return rnd(cq[-1], h), rnd(ck[-1], hk), rnd(ck[-1], hk), cq, ck


def _reference(q, k, v, cq, ck, causal, dout=None):
    """float32 attention sequence by sequence: ``(out, lse, grads)`` (grads None without
    *dout*); top-left causal within each sequence."""
    qf, kf, vf = (x.detach().float().requires_grad_(dout is not None) for x in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    scale = 1.0 / math.sqrt(q.shape[2])
    outs, lses = [], []
    for i in range(len(cq) - 1):
        qs = qf[cq[i] : cq[i + 1]].transpose(0, 1)
        ks = kf[ck[i] : ck[i + 1]].transpose(0, 1).repeat_interleave(rep, 0)
        vs = vf[ck[i] : ck[i + 1]].transpose(0, 1).repeat_interleave(rep, 0)
        s = qs @ ks.transpose(-1, -2) * scale
        if causal:
            above = torch.ones(s.shape[-2:], dtype=torch.bool, device="cuda").triu(1)
            s = s.masked_fill(above, float("-inf"))
        lses.append(torch.logsumexp(s, -1).transpose(0, 1))
        outs.append((torch.softmax(s, -1) @ vs).transpose(0, 1))
    out, lse = torch.cat(outs), torch.cat(lses)
    grads = None
    if dout is not None:
        out.backward(dout.float())
        grads = (qf.grad, kf.grad, vf.grad)
    return out.detach(), lse.detach(), grads


def _pad(x, cu, s):
    """Packed (T, H, D) -> zero-padded (B, S, H, D)."""
    xp = torch.zeros(len(cu) - 1, s, *x.shape[1:], dtype=x.dtype, device=x.device)
    for i in range(len(cu) - 1):
        xp[i, : cu[i + 1] - cu[i]] = x[cu[i] : cu[i + 1]]
    return xp


def _unpad(xp, cu):
    """(B, S, H, D) -> packed (T, H, D), valid rows only."""
    return torch.cat([xp[i, : cu[i + 1] - cu[i]] for i in range(len(cu) - 1)])


CASES = [  # dtype, heads, kv heads, head dim, causal
    (torch.bfloat16, 8, 2, 128, True),
    (torch.float16, 4, 4, 64, False),
    (torch.bfloat16, 4, 1, 64, False),
    (torch.float16, 4, 4, 128, True),
]


@pytest.mark.parametrize(("dt", "h", "hk", "d", "causal"), CASES)
def test_varlen_forward_and_backward(dt, h, hk, d, causal):
    q, k, v, cq, ck = _case(dt, h, hk, d, seed=h * 1000 + d + causal)
    mq, mk = max(_lens(cq)), max(_lens(ck))
    out = torch.full((q.shape[0], h, d), float("nan"), dtype=dt, device="cuda")
    o, stats = pycudnn.dnn_sdpa_varlen(
        q, k, v, cq, ck, mq, mk, is_causal=causal, training=True, out=out
    )
    assert _t(o).data_ptr() == out.data_ptr()
    dout = (torch.randn(out.shape, device="cuda") * 0.1).to(dt)
    ref, lse, grads = _reference(q, k, v, cq, ck, causal, dout)
    assert _rel(out, ref) < FWD[dt]
    st = _t(stats)
    assert st.shape == (q.shape[0], h, 1) and st.dtype == torch.float32
    assert not torch.isnan(st).any()
    assert (st[..., 0] - lse).abs().max().item() < 1e-2
    dq, dk, dv = pycudnn.dnn_sdpa_varlen_grad(
        q, k, v, out, dout, stats, cq, ck, mq, mk, is_causal=causal
    )
    for got, want in zip((dq, dk, dv), grads, strict=True):
        assert _t(got).shape == want.shape
        assert _rel(got, want) < BWD[dt]

    # the padded equivalent: dnn_sdpa with seq_lens over (B, S, H, D) arrays
    lens_q = torch.tensor(_lens(cq), dtype=torch.int32, device="cuda")
    lens_k = torch.tensor(_lens(ck), dtype=torch.int32, device="cuda")
    qp, kp, vp, dop = (
        _pad(x, c, s) for x, c, s in ((q, cq, mq), (k, ck, mk), (v, ck, mk), (dout, cq, mq))
    )
    bhsd = [x.transpose(1, 2) for x in (qp, kp, vp)]
    lens = dict(seq_lens_q=lens_q, seq_lens_kv=lens_k)
    op, sp = pycudnn.dnn_sdpa(*bhsd, is_causal=causal, training=True, **lens)
    op = _t(op)
    assert _rel(out, _unpad(op.transpose(1, 2), cq)) < FWD[dt]
    pgrads = pycudnn.dnn_sdpa_grad(*bhsd, op, dop.transpose(1, 2), sp, is_causal=causal, **lens)
    for got, pad, cu in zip((dq, dk, dv), pgrads, (cq, ck, ck), strict=True):
        assert _rel(got, _unpad(_t(pad).transpose(1, 2), cu)) < BWD[dt]


def test_device_lengths_larger_maxima_and_new_lengths_reuse_the_plan():
    """cu_seqlens as int32 device tensors (read back) give the host lists' result; maxima above
    the longest sequence are fine; other lengths of the same shapes run the cached entry."""
    dt = torch.bfloat16
    q, k, v, cq, ck = _case(dt, 4, 2, 64, seed=7, b=4, sq=40, skv=40)
    dev_q = torch.tensor(cq, dtype=torch.int32, device="cuda")
    dev_k = torch.tensor(ck, dtype=torch.int32, device="cuda")
    a = _t(pycudnn.dnn_sdpa_varlen(q, k, v, cq, ck, 64, 64))
    b = _t(pycudnn.dnn_sdpa_varlen(q, k, v, dev_q, dev_k, 64, 64))
    assert torch.equal(a, b)
    ref, _lse, _g = _reference(q, k, v, cq, ck, False)
    assert _rel(a, ref) < FWD[dt]
    # other lengths, the same totals: the same plan, other offsets
    t_q, t_k = cq[-1], ck[-1]
    cq2, ck2 = [0, 1, 2, 3, t_q], [0, t_k - 3, t_k - 2, t_k - 1, t_k]
    if max(t_q - 3, t_k - 3) <= 64:
        c = _t(pycudnn.dnn_sdpa_varlen(q, k, v, cq2, ck2, 64, 64, is_causal=True))
        ref2, _lse, _g = _reference(q, k, v, cq2, ck2, True)
        assert _rel(c, ref2) < FWD[dt]
