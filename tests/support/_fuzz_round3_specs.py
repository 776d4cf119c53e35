"""GPU fuzz specs of issue 42: the surface the GPU fuzzer did not reach yet, registered into
``_fuzz_highlevel_child``'s ``SPECS`` (one mechanism, one set of figures). Groups:

* ``varlen``: ``dnn_sdpa_varlen`` over packed sequences (1 to 4 sequences of 1 to 80 tokens,
  grouped heads, causal within each sequence, head dims 64/128, float16/bfloat16), against a
  float64 reference per sequence; invalid: cumulative lengths that decrease or do not end at
  the total, a max_seqlen below the longest sequence, float32 data, a head dim of 72;
* ``paged``: ``dnn_sdpa_paged`` over a paged KV cache (block sizes 16/32/64, shuffled blocks,
  decode and 2-4 new queries, causal bottom-right, grouped heads, one table or two), against a
  float64 reference on the gathered keys; half the valid calls run with ``check_indices=True``
  (the check must let them through); invalid: a page a sequence uses naming no block and a
  length past max_seqlen_kv under ``check_indices=True`` (refused before the launch: out-of-range
  entries are never launched), a float table, a max_seqlen_kv past the table;
* ``adapter``: ``pycudnn.torch``'s ``Linear``, ``LayerNorm``, ``RMSNorm`` and
  ``scaled_dot_product_attention`` against torch's own in float64 (forward and input gradient),
  float16/bfloat16.

Cases where the loaded cuDNN may have no engine (grouped heads on packed or paged operands,
sequences of one token) are ``either``: a ``NotSupportedError`` or a result that matches.
"""

from __future__ import annotations

import math
import os
from typing import Any

import _fuzz_transformer_specs
import numpy as np
from _fuzz_highlevel_child import Case, spec
from _fuzz_transformer_specs import _NP, HALF, L2, l2rel, rounded
from hypothesis import strategies as st

import pycudnn

if os.environ.get("PYCUDNN_GPU_FUZZ_SEED") is not None:  # the values too, not only the cases
    _fuzz_transformer_specs._rng = np.random.default_rng(int(os.environ["PYCUDNN_GPU_FUZZ_SEED"]))

L2_LOOSE = {k: 1.5 * v for k, v in L2.items()}


def _attend(q, k, v, causal_shift=None, scale=None):
    """float64 attention of one sequence: q (H, S_q, D), k/v (H_k, S_kv, D); *causal_shift*:
    query i sees keys j <= i + shift (None: every key)."""
    h, sq, d = q.shape
    group = h // k.shape[0]
    kr, vr = np.repeat(k, group, axis=0), np.repeat(v, group, axis=0)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    s = scale * q @ kr.transpose(0, 2, 1)
    if causal_shift is not None:
        keep = np.arange(kr.shape[1])[None, :] <= np.arange(sq)[:, None] + causal_shift
        s = np.where(keep[None], s, -np.inf)
    m = s.max(-1, keepdims=True)
    e = np.exp(s - m)
    return (e / e.sum(-1, keepdims=True)) @ vr


# -- dnn_sdpa_varlen -------------------------------------------------------------------------------
_VARLEN_BAD = ["decreasing", "total", "max_small", "float32", "head_dim"]


@spec("dnn_sdpa_varlen", "varlen")
def gen_varlen(draw):
    dt = draw(st.sampled_from(HALF))
    nseq = draw(st.integers(1, 4))
    h = draw(st.sampled_from([1, 2, 4]))
    hk = draw(st.sampled_from([x for x in (1, 2, 4) if h % x == 0]))
    d = draw(st.sampled_from([64, 128]))
    causal = draw(st.booleans())
    lq = [draw(st.integers(1, 80)) for _ in range(nseq)]
    lkv = list(lq) if causal else [draw(st.integers(1, 80)) for _ in range(nseq)]
    kind = draw(st.sampled_from(["valid", "invalid", "valid"]))
    if kind == "valid" and (hk != h or min(lq + lkv) < 2):
        kind = "either"
    bad = draw(st.sampled_from(_VARLEN_BAD)) if kind == "invalid" else None
    tq, tkv = sum(lq), sum(lkv)
    q64, k64, v64 = rounded((tq, h, d), dt), rounded((tkv, hk, d), dt), rounded((tkv, hk, d), dt)
    cu_q = [0, *np.cumsum(lq).tolist()]
    cu_kv = [0, *np.cumsum(lkv).tolist()]
    mq, mkv = max(lq) + draw(st.integers(0, 8)), max(lkv) + draw(st.integers(0, 8))
    npdt = _NP[dt]
    if bad == "decreasing" and nseq >= 2:
        cu_q[1], cu_q[2] = cu_q[2], cu_q[1]
    elif bad in ("decreasing", "total"):
        cu_q[-1] += 1
    elif bad == "max_small":
        mq = max(lq) - 1 if max(lq) > 1 else 0
    elif bad == "float32":
        npdt = np.dtype(np.float32)
    elif bad == "head_dim":  # 68: not a multiple of 8
        q64, k64, v64 = (
            rounded((tq, h, 68), dt),
            rounded((tkv, hk, 68), dt),
            rounded((tkv, hk, 68), dt),
        )
    q, k, v = (pycudnn.to_device(np.ascontiguousarray(a.astype(npdt))) for a in (q64, k64, v64))
    label = f"{dt} lq={lq} lkv={lkv} h={h} hk={hk} d={d} causal={causal} bad={bad}"

    def call():
        return pycudnn.dnn_sdpa_varlen(q, k, v, cu_q, cu_kv, mq, mkv, is_causal=causal)

    def check(o):
        got = np.asarray(o.get(), np.float64)
        want = np.empty_like(got)
        for s in range(nseq):
            qs = q64[cu_q[s] : cu_q[s + 1]].transpose(1, 0, 2)
            ks = k64[cu_kv[s] : cu_kv[s + 1]].transpose(1, 0, 2)
            vs = v64[cu_kv[s] : cu_kv[s + 1]].transpose(1, 0, 2)
            o_s = _attend(qs, ks, vs, 0 if causal else None)
            want[cu_q[s] : cu_q[s + 1]] = o_s.transpose(1, 0, 2)
        l2rel(got, want, L2_LOOSE[dt], "out")

    return Case(kind, call, check, label)


# -- dnn_sdpa_paged --------------------------------------------------------------------------------
_PAGED_BAD = ["entry", "entry_v", "len_past_max", "float_table", "max_past_table"]


@spec("dnn_sdpa_paged", "paged")
def gen_paged(draw):
    dt = draw(st.sampled_from(HALF))
    b = draw(st.integers(1, 4))
    h = draw(st.sampled_from([2, 4, 8]))
    hk = draw(st.sampled_from([x for x in (1, 2, 4, 8) if h % x == 0]))
    d = draw(st.sampled_from([64, 128]))
    block = draw(st.sampled_from([16, 32, 64]))
    sq = draw(st.sampled_from([1, 1, 2, 4]))
    causal = draw(st.booleans())
    pages = draw(st.integers(1, 4))
    lens_kv = [draw(st.integers(sq, pages * block)) for _ in range(b)]
    num_blocks = b * pages + draw(st.integers(0, 6))
    kind = draw(st.sampled_from(["valid", "invalid", "valid"]))
    if kind == "valid" and hk != h:
        kind = "either"
    bad = draw(st.sampled_from(_PAGED_BAD)) if kind == "invalid" else None
    two_tables = draw(st.booleans()) or bad == "entry_v"
    check = kind == "invalid" or draw(st.booleans())
    perm = np.random.default_rng(draw(st.integers(0, 2**31))).permutation(num_blocks)
    table = perm[: b * pages].reshape(b, pages).astype(np.int32)
    table_v = np.ascontiguousarray(table[:, ::-1]) if two_tables else None  # other blocks
    kc64, vc64 = rounded((num_blocks, hk, block, d), dt), rounded((num_blocks, hk, block, d), dt)
    q64 = rounded((b, h, sq, d), dt)
    max_s = None
    if bad in ("entry", "entry_v"):
        s = draw(st.integers(0, b - 1))
        p = draw(st.integers(0, -(-lens_kv[s] // block) - 1))  # a page the length uses
        target = table if bad == "entry" else table_v
        target[s, p] = draw(st.sampled_from([num_blocks, num_blocks + 7, -1, 2**31 - 1]))
    elif bad == "len_past_max":
        max_s = max(sq, lens_kv[0] - 1)
        lens_kv[0] = max_s + 1
    elif bad == "max_past_table":
        max_s = pages * block + 1
    tab = pycudnn.to_device(table.astype(np.float32) if bad == "float_table" else table)
    tab_v = None if table_v is None else pycudnn.to_device(table_v)
    lkv = pycudnn.to_device(np.asarray(lens_kv, np.int32))
    npdt = _NP[dt]
    q = pycudnn.to_device(q64.astype(npdt))
    kc, vc = (pycudnn.to_device(a.astype(npdt)) for a in (kc64, vc64))
    label = (
        f"{dt} b={b} h={h} hk={hk} d={d} block={block} sq={sq} pages={pages} lens={lens_kv} "
        f"blocks={num_blocks} causal={causal} two_tables={two_tables} check={check} bad={bad}"
    )

    def call():
        return pycudnn.dnn_sdpa_paged(
            q,
            kc,
            vc,
            tab,
            lkv,
            max_s,
            is_causal=causal,
            page_table_v=tab_v,
            check_indices=check,
        )

    def check_result(o):
        got = np.asarray(o.get(), np.float64)
        want = np.empty_like(got)
        tv = table if table_v is None else table_v
        for s in range(b):
            n = lens_kv[s]
            ks = np.concatenate([kc64[table[s, i]] for i in range(pages)], axis=1)[:, :n]
            vs = np.concatenate([vc64[tv[s, i]] for i in range(pages)], axis=1)[:, :n]
            want[s] = _attend(q64[s], ks, vs, n - sq if causal else None)
        l2rel(got, want, L2_LOOSE[dt], "out")

    return Case(kind, call, check_result, label)


# -- the torch adapter -----------------------------------------------------------------------------
_ADAPTER = ["linear", "layer_norm", "rms_norm", "sdpa"]


@spec("pycudnn.torch modules", "adapter")
def gen_adapter(draw):
    import torch

    import pycudnn.torch as pt

    what = draw(st.sampled_from(_ADAPTER))
    dt = draw(st.sampled_from(HALF))
    tdt = getattr(torch, dt)
    seed = draw(st.integers(0, 2**31))
    gen = torch.Generator(device="cpu").manual_seed(seed)
    kind = "valid"
    rows = draw(st.sampled_from([1, 7, 64, 130]))
    feat = draw(st.sampled_from([16, 64, 96, 256]))

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(tdt)

    if what == "linear":
        out_f = draw(st.sampled_from([8, 64, 200]))
        bias = draw(st.booleans())
        mod = pt.Linear(feat, out_f, bias=bias, device="cuda", dtype=tdt)
        ref_mod = torch.nn.Linear(feat, out_f, bias=bias, dtype=torch.float64)
        x = rnd(rows, feat)
        tol = {"float16": 5e-3, "bfloat16": 2e-2}[dt] * max(1.0, math.sqrt(feat) / 8)
    elif what in ("layer_norm", "rms_norm"):
        cls = pt.LayerNorm if what == "layer_norm" else pt.RMSNorm
        ref_cls = torch.nn.LayerNorm if what == "layer_norm" else torch.nn.RMSNorm
        mod = cls(feat, device="cuda", dtype=tdt)
        ref_mod = ref_cls(feat, dtype=torch.float64)
        x = rnd(rows, feat, scale=3.0)
        tol = {"float16": 5e-3, "bfloat16": 2e-2}[dt] * 2
    else:
        b, h, s, dh = draw(st.integers(1, 2)), draw(st.sampled_from([1, 4])), rows, 64
        causal = draw(st.booleans())
        q, k, v = (rnd(b, h, s, dh) for _ in range(3))
        if s < 2:
            kind = "either"
    if what != "sdpa":
        with torch.no_grad():
            for (name, p), rp in zip(mod.named_parameters(), ref_mod.parameters(), strict=True):
                scale = 1.0 / math.sqrt(feat) if (what, name) == ("linear", "weight") else 0.3
                value = rnd(*p.shape, scale=scale)
                if what != "linear" and name == "weight":
                    value = (value.double() + 1.0).to(tdt)  # a scale near 1
                p.copy_(value.cuda())
                rp.copy_(value.double())
    label = f"{what} {dt} rows={rows} feat={feat} seed={seed}"
    box: dict[str, Any] = {}  # the upstream gradient, drawn by the call (its output's shape)

    def call():
        if what == "sdpa":
            ins = [t.cuda().requires_grad_() for t in (q, k, v)]
            y = pt.scaled_dot_product_attention(*ins, is_causal=causal)
        else:
            ins = [x.cuda().requires_grad_()]
            y = mod(ins[0])
        box["gy"] = torch.randn(y.shape, generator=gen, dtype=torch.float64)
        (y.float() * box["gy"].float().cuda()).sum().backward()
        return y, ins[0].grad

    def check(r):
        y, gx = r
        if what == "sdpa":
            xd = q.double().requires_grad_()
            want = torch.nn.functional.scaled_dot_product_attention(
                xd, k.double(), v.double(), is_causal=causal
            )
        else:
            xd = x.double().requires_grad_()
            want = ref_mod(xd)
        (want * box["gy"]).sum().backward()
        tols = (L2_LOOSE[dt], 2 * L2_LOOSE[dt]) if what == "sdpa" else (tol, 3 * tol)
        for got, ref, nm, t in ((y, want.detach(), "out", tols[0]), (gx, xd.grad, "dx", tols[1])):
            g = got.detach().double().cpu().numpy()
            if what == "sdpa":
                l2rel(g, ref.numpy(), t, nm)
                continue
            assert np.all(np.isfinite(g)), f"{nm}: non-finite"
            err = float(np.max(np.abs(g - ref.numpy()))) / max(float(ref.abs().max()), 1e-6)
            assert err <= t, f"{nm}: error {err:.3g} > {t:.3g}"

    return Case(kind, call, check, label)
