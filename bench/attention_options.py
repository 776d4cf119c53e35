"""Attention options (issue 27): GPU time per mask option on the GPU machine.

Each case runs one option of ``dnn_sdpa`` -- causal bottom-right, a sliding window, an additive
bias, ALiBi, padding lengths -- three ways in the same process, alternating:

* **pycudnn**: ``dnn_sdpa`` with the option (forward; and forward + ``dnn_sdpa_grad``);
* **torch**: ``torch.nn.functional.scaled_dot_product_attention`` with the same mask spelled
  as torch takes it (``causal_lower_right``, an explicit boolean or float mask), on each of
  torch's fused backends that accepts it, the fastest one reported (forward; forward +
  autograd backward);
* **frontend**: cudnn-frontend's ``pygraph.sdpa`` with the same option (forward only), when the
  wheel is importable and runs on torch's cuDNN (``bench/frontend.py``).

pycudnn's output is checked against torch's (max relative error <= 2e-2) before timing; a case
that fails the check is reported, not timed. GPU ms per call is nvbench's cold measurement
(``cuda-bench``, ``bench/timing.py``): every case's calls are queued and timed in one nvbench
run at the end, then the ratios are computed. The sliding window case also times pycudnn's full
causal call at the same size, for the window's speedup. Run from the repository root::

    PYTHONPATH=. python bench/attention_options.py [--quick] [--no-frontend] [--json PATH]

The summary printed last names the GPU; the JSON (``--json``, or ``$OUT/attention_options.json``)
has every number.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import ratio
from bench.timing import NvbenchMissing
from bench.transformer import Bench, _err_text, _f, log

TOL = 2e-2
TORCH_BACKENDS = ("cudnn", "flash", "efficient")


class Case:
    """One option: the three sides' callables, built on the same inputs."""

    def __init__(self, name: str, b: Any, shape: tuple[int, int, int, int, int]) -> None:
        self.name, self.b = name, b
        torch = b.torch
        B, H, SQ, SKV, D = shape
        self.shape = shape
        g = torch.Generator(device="cuda").manual_seed(0)
        dt = torch.bfloat16
        self.q = torch.randn(B, H, SQ, D, device="cuda", dtype=dt, generator=g)
        self.k, self.v = (
            torch.randn(B, H, SKV, D, device="cuda", dtype=dt, generator=g) for _ in range(2)
        )
        self.dout = torch.randn(B, H, SQ, D, device="cuda", dtype=dt, generator=g)
        self.scale = 1.0 / math.sqrt(D)
        self.out = torch.empty_like(self.q)
        self.pc_kw: dict[str, Any] = {}  # dnn_sdpa's and dnn_sdpa_grad's option arguments
        self.torch_mask: Any = None  # attn_mask as torch takes it
        self.torch_causal = False
        self.fe_kw: dict[str, Any] = {}  # pygraph.sdpa's option arguments (tensors built later)
        self.fe_tensors: dict[str, Any] = {}  # name -> torch tensor for a frontend graph input
        self.valid_rows: Any = None  # padding: rows compared (the others are unspecified)

    # -- pycudnn ----------------------------------------------------------------------------
    def pycudnn_fwd(self) -> Callable[[], object]:
        pc, s = self.b.pc, self.b.s
        q, k, v, o, kw = self.q, self.k, self.v, self.out, self.pc_kw

        def fwd() -> object:
            return pc.dnn_sdpa(q, k, v, scale=self.scale, out=o, stream=s, **kw)

        return fwd

    def pycudnn_fwdbwd(self) -> Callable[[], object]:
        pc, s = self.b.pc, self.b.s
        q, k, v, dout, kw = self.q, self.k, self.v, self.dout, self.pc_kw
        o2 = self.b.torch.empty_like(self.out)
        grad_kw = {n: x for n, x in kw.items() if n != "attn_mask"}
        mask = kw.get("attn_mask")

        def fwdbwd() -> object:
            out, stats = pc.dnn_sdpa(
                q, k, v, scale=self.scale, training=True, out=o2, stream=s, **kw
            )
            return pc.dnn_sdpa_grad(
                q, k, v, out, dout, stats, mask, scale=self.scale, stream=s, **grad_kw
            )

        return fwdbwd

    # -- torch ------------------------------------------------------------------------------
    def torch_fns(self, kind: Any) -> tuple[Callable[[], Any], Callable[[], Any]]:
        from torch.nn.attention import sdpa_kernel

        torch, F = self.b.torch, self.b.F
        q, k, v, dout = self.q, self.k, self.v, self.dout
        qr, kr, vr = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        m, causal, sc = self.torch_mask, self.torch_causal, self.scale

        def fwd() -> Any:
            with sdpa_kernel(kind):
                return F.scaled_dot_product_attention(q, k, v, m, is_causal=causal, scale=sc)

        def fwdbwd() -> Any:
            with sdpa_kernel(kind):
                o = F.scaled_dot_product_attention(qr, kr, vr, m, is_causal=causal, scale=sc)
            return torch.autograd.grad(o, (qr, kr, vr), dout)

        return fwd, fwdbwd

    # -- frontend ---------------------------------------------------------------------------
    def frontend_fwd(self) -> Callable[[], object]:
        fe = self.b.fe
        cudnn = fe.cudnn
        g = fe.new_graph(self.q)
        Q, K, V = (fe.tensor(g, n, t) for n, t in (("Q", self.q), ("K", self.k), ("V", self.v)))
        pack = {Q: self.q, K: self.k, V: self.v}
        kw = dict(self.fe_kw)
        for name, t in self.fe_tensors.items():
            dt = cudnn.data_type.INT32 if t.dtype == self.b.torch.int32 else fe.data_type(t)
            T = g.tensor(name=name, dim=list(t.shape), stride=list(t.stride()), data_type=dt)
            pack[T] = t
            kw[name] = T
        if "diagonal_alignment" in kw:
            kw["diagonal_alignment"] = getattr(cudnn.diagonal_alignment, kw["diagonal_alignment"])
        o_t, _ = g.sdpa(
            name="sdpa", q=Q, k=K, v=V, attn_scale=self.scale, generate_stats=False, **kw
        )
        fo = self.b.torch.empty_like(self.out)
        o_t.set_output(True).set_dim(list(fo.shape)).set_stride(list(fo.stride()))
        pack[o_t] = fo
        call = fe.finish(g, pack, [])
        call.extra["out"] = fo
        self.fe_out = fo
        return call.run


def _relerr(b: Any, got: Any, ref: Any, rows: Any) -> float:
    a, r = got.float(), ref.float()
    if rows is not None:
        a, r = a[rows], r[rows]
    s = r.abs().max().item()
    d = (a - r).abs().max().item()
    return d / s if s > 0 else d


def cases(b: Any, quick: bool) -> list[Case]:
    """The options, each on a shape where it matters (bf16, H 16, D 128)."""
    torch = b.torch
    from torch.nn.attention.bias import causal_lower_right

    out: list[Case] = []
    B, H, D = 2, 16, 128
    s = 1024 if quick else 2048

    c = Case("causal top-left (baseline)", b, (B, H, s, s, D))
    c.pc_kw = {"is_causal": True}
    c.torch_causal = True
    c.fe_kw = {"diagonal_band_right_bound": 0}
    out.append(c)

    c = Case("causal bottom-right (S_q = S_kv / 4)", b, (B, H, s // 4, s, D))
    c.pc_kw = {"is_causal": True, "diagonal_alignment": "bottom_right"}
    c.torch_mask = causal_lower_right(s // 4, s)
    c.fe_kw = {"diagonal_alignment": "BOTTOM_RIGHT", "diagonal_band_right_bound": 0}
    out.append(c)

    sw, win = (4096 if quick else 8192), 1024
    c = Case(f"sliding window {win}, causal", b, (1, H, sw, sw, D))
    c.pc_kw = {"is_causal": True, "left_bound": win}
    i = torch.arange(sw, device="cuda")
    c.torch_mask = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - win)
    c.fe_kw = {"diagonal_band_left_bound": win, "diagonal_band_right_bound": 0}
    out.append(c)
    full = Case(f"full causal at the window's size (S {sw})", b, (1, H, sw, sw, D))
    full.pc_kw = {"is_causal": True}
    full.torch_causal = True
    full.fe_kw = {"diagonal_band_right_bound": 0}
    out.append(full)

    c = Case("additive bias (1, H, S, S)", b, (B, H, s, s, D))
    bias = torch.randn(1, H, s, s, device="cuda", dtype=torch.bfloat16)
    c.pc_kw = {"attn_mask": bias}
    c.torch_mask = bias
    c.fe_tensors = {"bias": bias}
    out.append(c)

    c = Case("ALiBi, causal", b, (B, H, s, s, D))
    c.pc_kw = {"is_causal": True, "alibi": True}
    slopes = torch.tensor(
        [2.0 ** (-8.0 * (h + 1) / H) for h in range(H)], device="cuda", dtype=torch.float32
    )
    j = torch.arange(s, device="cuda", dtype=torch.float32)
    ali = slopes[:, None, None] * (j[None, None, :] - j[None, :, None])
    ali = ali.masked_fill(j[None, None, :] > j[None, :, None], float("-inf"))
    c.torch_mask = ali[None].to(torch.bfloat16)
    c.fe_kw = {"use_alibi_mask": True, "diagonal_band_right_bound": 0}
    out.append(c)

    c = Case("padding lengths (B 4, 1/2..1 of S)", b, (4, H, s, s, D))
    lens = torch.tensor([s, s // 2, 3 * s // 4, s // 2 + 7], device="cuda", dtype=torch.int32)
    c.pc_kw = {"seq_lens_q": lens, "seq_lens_kv": lens}
    j = torch.arange(s, device="cuda")
    keep = (j[None, None, :] < lens[:, None, None]) & (j[None, :, None] < lens[:, None, None])
    c.torch_mask = keep[:, None]
    c.valid_rows = (j[None, None, :, None] < lens[:, None, None, None]).expand(4, H, s, D)
    sl = lens.reshape(4, 1, 1, 1)
    c.fe_tensors = {"seq_len_q": sl, "seq_len_kv": sl.clone()}
    c.fe_kw = {"use_padding_mask": True}
    out.append(c)
    return out


def run_case(b: Any, c: Case) -> dict[str, Any]:
    """Check pycudnn against torch, then time every side that runs (GPU ms per call)."""
    torch = b.torch
    kinds = b.sdpa_backends()
    item: dict[str, Any] = {"case": c.name, "shape": list(c.shape), "sides": {}}
    fns: dict[str, Callable[[], object]] = {}
    try:
        fns["pycudnn"] = c.pycudnn_fwd()
        fns["pycudnn"]()
        fns["pycudnn fwd+bwd"] = c.pycudnn_fwdbwd()
        fns["pycudnn fwd+bwd"]()
    except Exception as exc:
        item["sides"]["pycudnn"] = {"error": _err_text(exc)}
        return item
    ref = None
    for name in TORCH_BACKENDS:
        try:
            fwd, fb = c.torch_fns(kinds[name])
            got = fwd()
            fb()
        except Exception as exc:  # torch's backend does not take this mask
            item["sides"][f"torch {name}"] = {"error": _err_text(exc, 120)}
            continue
        ref = got if ref is None else ref
        fns[f"torch {name}"], fns[f"torch {name} fwd+bwd"] = fwd, fb
    if ref is None:  # no fused backend: the math one in float32 as the reference only
        from torch.nn.attention import sdpa_kernel

        with sdpa_kernel(kinds["math"]):
            q, k, v = (t.float() for t in (c.q, c.k, c.v))
            m = c.torch_mask
            m = m.float() if m is not None and m.is_floating_point() else m
            ref = b.F.scaled_dot_product_attention(
                q, k, v, m, is_causal=c.torch_causal, scale=c.scale
            )
    torch.cuda.synchronize()
    err = _relerr(b, c.out, ref, c.valid_rows)
    item["relerr_vs_torch"] = err
    if not err <= TOL:
        item["check"] = "FAIL"
        log(f"{c.name}: pycudnn vs torch relative error {err:.3g} > {TOL}: not timed")
        return item
    if b.fe is not None:
        try:
            fe_run = c.frontend_fwd()
            fe_run()
            torch.cuda.synchronize()
            item["relerr_frontend_vs_pycudnn"] = _relerr(b, c.fe_out, c.out, c.valid_rows)
            fns["frontend"] = fe_run
        except Exception as exc:
            item["sides"]["frontend"] = {"error": _err_text(exc, 200)}

    def got(timed: dict[str, dict[str, Any]]) -> None:  # after the one nvbench run
        item["sides"].update(timed)
        ms = {n: r["gpu_ms"] for n, r in timed.items() if "gpu_ms" in r}
        mine = ms.get("pycudnn")
        torch_fwd = [t for n, t in ms.items() if n.startswith("torch") and "+" not in n]
        torch_fb = [t for n, t in ms.items() if n.startswith("torch") and "+" in n]
        item["ratio_torch_best_fwd"] = ratio(mine, min(torch_fwd)) if torch_fwd else None
        item["ratio_torch_best_fwdbwd"] = (
            ratio(ms.get("pycudnn fwd+bwd"), min(torch_fb)) if torch_fb else None
        )
        item["ratio_frontend_fwd"] = ratio(mine, ms.get("frontend"))

    b.time_sides(fns, c.name, got, host_calls=1)
    b.done_case()
    return item


def run_varlen(b: Any, quick: bool) -> dict[str, Any]:
    """Packed variable-length sequences against the same batch padded to the longest (both
    pycudnn, causal, forward and forward + backward), and torch's ``varlen_attn`` where it
    exists: bf16, 8 sequences of random lengths, H 16, D 128."""
    torch, pc, s = b.torch, b.pc, b.s
    gen = torch.Generator().manual_seed(1)
    B, H, D, smax = 8, 16, 128, (1024 if quick else 2048)
    lens = torch.randint(smax // 8, smax + 1, (B,), generator=gen).tolist()
    lens[0] = smax
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    bf = torch.bfloat16
    q, k, v, dout = (torch.randn(cu[-1], H, D, device="cuda", dtype=bf) for _ in range(4))

    def pad(x: Any) -> Any:  # (T, H, D) -> (B, H, smax, D), a view of (B, smax, H, D)
        p = torch.zeros(B, smax, H, D, device="cuda", dtype=bf)
        for i in range(B):
            p[i, : lens[i]] = x[cu[i] : cu[i + 1]]
        return p.transpose(1, 2)

    qp, kp, vp, dp = (pad(x) for x in (q, k, v, dout))
    lt = torch.tensor(lens, device="cuda", dtype=torch.int32)
    ov, op_ = torch.empty_like(q), torch.empty_like(qp)
    ov2, op2 = torch.empty_like(q), torch.empty_like(qp)
    vl = (cu, cu, smax, smax)

    def var_fb() -> object:
        o, st = pc.dnn_sdpa_varlen(q, k, v, *vl, True, training=True, out=ov2, stream=s)
        return pc.dnn_sdpa_varlen_grad(q, k, v, o, dout, st, *vl, True, stream=s)

    def pad_fb() -> object:
        kw = {"seq_lens_q": lt, "seq_lens_kv": lt}
        o, st = pc.dnn_sdpa(qp, kp, vp, None, True, training=True, out=op2, stream=s, **kw)
        return pc.dnn_sdpa_grad(qp, kp, vp, o, dp, st, None, True, stream=s, **kw)

    fns: dict[str, Callable[[], object]] = {
        "varlen fwd": lambda: pc.dnn_sdpa_varlen(q, k, v, *vl, True, out=ov, stream=s),
        "padded fwd": lambda: pc.dnn_sdpa(
            qp, kp, vp, None, True, seq_lens_q=lt, seq_lens_kv=lt, out=op_, stream=s
        ),
        "varlen fwd+bwd": var_fb,
        "padded fwd+bwd": pad_fb,
    }
    item: dict[str, Any] = {"case": f"varlen vs padded: B {B}, lengths {lens}", "sides": {}}
    try:
        from torch.nn.attention.varlen import varlen_attn

        cut = torch.tensor(cu, device="cuda", dtype=torch.int32)

        def tv() -> Any:
            return varlen_attn(q, k, v, cut, cut, smax, smax, is_causal=True)

        tv()
        fns["torch varlen_attn fwd"] = tv
    except Exception as exc:  # absent in this torch, or it refuses the case
        item["sides"]["torch varlen_attn fwd"] = {"error": _err_text(exc, 120)}
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    got = torch.cat([op_[i, :, : lens[i]].transpose(0, 1) for i in range(B)])
    item["relerr_varlen_vs_padded"] = _relerr(b, ov, got, None)

    def timed(sides: dict[str, dict[str, Any]]) -> None:  # after the one nvbench run
        sd = item["sides"]
        sd.update(sides)
        for ph in ("fwd", "fwd+bwd"):
            item[f"ratio_varlen_padded_{ph}"] = ratio(
                sd[f"varlen {ph}"].get("gpu_ms"), sd[f"padded {ph}"].get("gpu_ms")
            )

    b.time_sides(fns, "varlen", timed, host_calls=1)
    b.done_case()
    return item


def run_paged(b: Any, quick: bool) -> dict[str, Any]:
    """Decode (S_q = 1) over a paged KV cache against the same keys gathered contiguous (both
    pycudnn, with the lengths as a padding mask) and torch's attention on the gathered cache
    with a key-padding mask: bf16, 32 sequences, H 32 over H_k 8, D 128, blocks of 64."""
    torch, pc, F, s = b.torch, b.pc, b.F, b.s
    gen = torch.Generator().manual_seed(2)
    B, H, HK, D, block = 32, 32, 8, 128, 64
    smax = 2048 if quick else 4096
    pages = smax // block
    lens = torch.randint(smax // 4, smax + 1, (B,), generator=gen)
    bf = torch.bfloat16
    kc, vc = (torch.randn(B * pages, HK, block, D, device="cuda", dtype=bf) for _ in range(2))
    table = torch.randperm(B * pages, generator=gen).view(B, pages).to("cuda", torch.int32)
    lt = lens.to("cuda", torch.int32)
    q = torch.randn(B, H, 1, D, device="cuda", dtype=bf)

    def gather(c: Any) -> Any:  # (B, H_k, smax, D) contiguous
        return c[table.long()].permute(0, 2, 1, 3, 4).reshape(B, HK, smax, D).contiguous()

    kg, vg = gather(kc), gather(vc)
    ones = torch.ones(B, device="cuda", dtype=torch.int32)
    o1, o2 = torch.empty_like(q), torch.empty_like(q)
    keep = (torch.arange(smax, device="cuda")[None, :] < lt[:, None])[:, None, None, :]
    fns: dict[str, Callable[[], object]] = {
        "paged": lambda: pc.dnn_sdpa_paged(q, kc, vc, table, lt, smax, out=o1, stream=s),
        "contiguous": lambda: pc.dnn_sdpa(
            q, kg, vg, seq_lens_q=ones, seq_lens_kv=lt, out=o2, stream=s
        ),
    }
    item: dict[str, Any] = {"case": f"paged decode: B {B}, S_kv <= {smax}", "sides": {}}
    kinds = b.sdpa_backends()
    from torch.nn.attention import sdpa_kernel

    for name in TORCH_BACKENDS:

        def th(kind: Any = kinds[name]) -> Any:
            with sdpa_kernel(kind):
                return F.scaled_dot_product_attention(q, kg, vg, keep, enable_gqa=True)

        try:
            th()
            fns[f"torch {name}"] = th
        except Exception as exc:
            item["sides"][f"torch {name}"] = {"error": _err_text(exc, 120)}
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    item["relerr_paged_vs_contiguous"] = _relerr(b, o1, o2, None)

    def timed(sides: dict[str, dict[str, Any]]) -> None:  # after the one nvbench run
        sd = item["sides"]
        sd.update(sides)
        item["tokens_per_s"] = {n: B / (r["gpu_ms"] / 1e3) for n, r in sd.items() if "gpu_ms" in r}
        item["ratio_paged_contiguous"] = ratio(
            sd["paged"].get("gpu_ms"), sd["contiguous"].get("gpu_ms")
        )

    b.time_sides(fns, "paged", timed, host_calls=1)
    b.done_case()
    return item


def summary(b: Any, items: list[dict[str, Any]]) -> list[str]:
    meta = b.meta
    fe = meta.get("frontend") or {}
    lines = [
        f"on {meta['gpu']} | torch {meta['torch']} | cuDNN {meta['cudnn_torch']} | frontend "
        + (fe.get("version", "?") if fe.get("available") else f"skipped ({fe.get('reason')})")
    ]
    for it in items:
        if it["case"].startswith(("varlen", "paged")):
            if "error" in it.get("sides", {}).get("pycudnn", {}):
                lines.append(f"{it['case']}: error {it['sides']['pycudnn']['error']}")
            continue
        sides = it["sides"]

        def ms(name: str, sides: dict = sides) -> str:
            return _f((sides.get(name) or {}).get("gpu_ms"), ".3f")

        best = [n for n in sides if n.startswith("torch") and "gpu_ms" in sides[n] and "+" not in n]
        tb = min(best, key=lambda n: sides[n]["gpu_ms"]) if best else None
        fe_txt = ms("frontend")
        if "frontend" in sides and "error" in sides["frontend"]:
            fe_txt = "n/a (" + sides["frontend"]["error"][:80] + ")"
        lines.append(
            f"{it['case']}: pycudnn fwd {ms('pycudnn')} ms, fwd+bwd {ms('pycudnn fwd+bwd')} | "
            f"torch best fwd {ms(tb) if tb else 'n/a'} ({tb or '-'}) | frontend fwd {fe_txt} | "
            f"pycudnn/torch fwd {_f(it.get('ratio_torch_best_fwd'))} fwd+bwd "
            f"{_f(it.get('ratio_torch_best_fwdbwd'))} | pycudnn/frontend fwd "
            f"{_f(it.get('ratio_frontend_fwd'))}"
            + (f" | check {it['check']} ({it['relerr_vs_torch']:.3g})" if it.get("check") else "")
            + (
                f" | error {sides['pycudnn']['error']}"
                if "error" in sides.get("pycudnn", {})
                else ""
            )
        )
    win = [it for it in items if it["case"].startswith("sliding window")]
    full = [it for it in items if it["case"].startswith("full causal")]
    if win and full:
        w = (win[0]["sides"].get("pycudnn") or {}).get("gpu_ms")
        f = (full[0]["sides"].get("pycudnn") or {}).get("gpu_ms")
        lines.append(
            f"sliding window speedup over full causal (pycudnn fwd): "
            f"{_f(ratio(f, w), '.2f')}x ({full[0]['case']})"
        )
    for it in items:
        sd = it.get("sides", {})
        if it["case"].startswith("varlen"):
            lines.append(
                f"{it['case']}: varlen fwd {_f(sd.get('varlen fwd', {}).get('gpu_ms'))} ms vs "
                f"padded {_f(sd.get('padded fwd', {}).get('gpu_ms'))} "
                f"({_f(it.get('ratio_varlen_padded_fwd'))}x); fwd+bwd "
                f"{_f(sd.get('varlen fwd+bwd', {}).get('gpu_ms'))} vs "
                f"{_f(sd.get('padded fwd+bwd', {}).get('gpu_ms'))} "
                f"({_f(it.get('ratio_varlen_padded_fwd+bwd'))}x); torch varlen_attn fwd "
                f"{_f(sd.get('torch varlen_attn fwd', {}).get('gpu_ms'))}; max rel diff "
                f"{_f(it.get('relerr_varlen_vs_padded'), '.2g')}"
            )
        if it["case"].startswith("paged"):
            tps = it.get("tokens_per_s", {})
            lines.append(
                f"{it['case']}: tokens/s "
                + ", ".join(f"{n} {v:,.0f}" for n, v in tps.items())
                + f"; paged/contiguous GPU time {_f(it.get('ratio_paged_contiguous'))}; max rel "
                f"diff {_f(it.get('relerr_paged_vs_contiguous'), '.2g')}"
            )
    fe_r = [it["ratio_frontend_fwd"] for it in items if it.get("ratio_frontend_fwd")]
    if fe_r:
        lines.append(
            f"targets: GPU time <= 1.00x the frontend per option: worst {max(fe_r):.3f} "
            + ("MET" if max(fe_r) <= 1.0 else "MISSED")
            + f" (median {sorted(fe_r)[len(fe_r) // 2]:.3f}, {len(fe_r)} options)"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    p.add_argument("--no-frontend", action="store_true", help="skip the cudnn-frontend column")
    p.add_argument("--json", default=None, help="write all numbers here")
    args = p.parse_args(argv)
    try:
        b = Bench(args.quick, not args.no_frontend)
    except NvbenchMissing as exc:
        print(f"[attention_options] {exc}", file=sys.stderr, flush=True)
        return 2
    items = []
    runs: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        (c.name, lambda c=c: run_case(b, c)) for c in cases(b, args.quick)
    ]
    runs += [
        ("varlen", lambda: run_varlen(b, args.quick)),
        ("paged", lambda: run_paged(b, args.quick)),
    ]
    for name, run in runs:
        try:
            items.append(run())
        except Exception as exc:
            items.append({"case": name, "sides": {"pycudnn": {"error": _err_text(exc)}}})
            log(f"{name}: ERROR {_err_text(exc)}\n{traceback.format_exc(limit=4)}")
        log(f"{name}: built, checked, queued")
    log(f"GPU time of {len(b.queue.jobs)} calls: {b.queue.info['tool']}")
    b.queue.run()
    lines = summary(b, items)
    text = json.dumps({"meta": b.meta, "items": items, "summary": lines}, indent=1, default=str)
    for path in filter(
        None, (args.json, os.environ.get("OUT") and f"{os.environ['OUT']}/attention_options.json")
    ):
        Path(path).write_text(text)
    print("== attention options summary")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
