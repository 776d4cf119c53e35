"""Where a small HF decoder's time goes with pycudnn (issue 37): transformers'
``LlamaForCausalLM`` (4 layers, hidden 1024, 16/4 heads, vocab 8192) and ``GPT2LMHeadModel`` (4
layers, hidden 1024, 16 heads, dropout 0), bfloat16, random init, each side built from its own
copy of the config (transformers 5 writes the attention choice on the config it is given).

Sides: ``attn_implementation="sdpa"`` twice (the control pair), ``"pycudnn"`` (the attention
route alone), and ``"pycudnn"`` plus :func:`pycudnn.torch.convert` (Linear, norms and the
rest on cuDNN); ``--without NAMES`` adds that side again with convert keeping the named classes
(``--without NewGELUActivation``: what the GELU twin buys, in the same process). Per side and
mode -- a training step (batch 4x1024 tokens) and a greedy decode (batch 4, prompt 128, 32 new
tokens, KV cache) -- the median wall time over interleaved rounds, its IQR, and from
``torch.profiler`` the GPU kernel time, the host self time and the number of pycudnn ``SDPAFn``
calls; for training also the host time to enqueue one step with the GPU kept busy
(``bench/launch_floor.py``'s ``enqueue_time``: the step's host cost without its GPU time)
where the step has fewer than 900 launches (more fill CUDA's queue, which then blocks).
``--tables`` adds the profiler's top host operations per side. ``--calls`` first times, per call,
the host cost of the operations a decoder runs (Linear, attention, layer norm; the decode and the
training shapes; forward alone and forward plus backward), torch's and the converted module's,
with the GPU kept busy (``launch_floor.per_launch``). Run on the GPU machine::

    PYTHONPATH=. python3 bench/llm_profile.py [--arch llama,gpt2] [--modes train,decode]
                                              [--calls] [--tables] [--without NAMES]
                                              [--json FILE]

``--calls --arch ""`` runs the per-call table alone.

Self-contained: torch, transformers, pycudnn and ``bench/launch_floor.py``.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from typing import Any

from launch_floor import enqueue_time, per_launch  # bench/ is the script's directory

BATCH, SEQ = 4, 1024  # training tokens per step
_LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC")
PROMPT, NEW = 128, 32  # decode


def _config(tf: Any, arch: str) -> tuple[Any, Any]:
    if arch == "llama":
        cfg = tf.LlamaConfig(
            hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
            num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=SEQ,
            vocab_size=8192,
        )  # fmt: skip
        return cfg, tf.LlamaForCausalLM
    cfg = tf.GPT2Config(
        n_embd=1024, n_layer=4, n_head=16, n_positions=SEQ, vocab_size=8192,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    return cfg, tf.GPT2LMHeadModel


def _sides(arch: str, without: frozenset[str] = frozenset()) -> dict[str, Any]:
    import torch
    import transformers as tf

    import pycudnn.torch as pt

    pt.register_transformers()
    cfg, cls = _config(tf, arch)
    torch.manual_seed(0)
    sides: dict[str, Any] = {}
    kinds = [
        ("sdpa", "sdpa", False),
        ("sdpa-again", "sdpa", False),
        ("pycudnn", "pycudnn", False),
        ("pycudnn+convert", "pycudnn", True),
    ]
    if without:  # what the named classes' conversion buys, in the same process
        kinds.append(("pycudnn+convert-without", "pycudnn", True))
    for name, impl, conv in kinds:
        m = cls._from_config(copy.deepcopy(cfg), attn_implementation=impl, dtype=torch.bfloat16)
        m = m.cuda()
        if sides:
            m.load_state_dict(sides["sdpa"].state_dict())
        if conv:
            skip = without if name.endswith("-without") else frozenset()
            m = pt.convert(m, exclude=lambda mod, skip=skip: type(mod).__name__ in skip)
        sides[name] = m
    return sides


def _steps(arch: str, mode: str, vocab: int) -> Any:
    import torch

    if mode == "train":
        ids = torch.randint(0, vocab, (BATCH, SEQ), device="cuda")

        def step(m: Any) -> Any:
            loss = m(input_ids=ids, labels=ids).loss
            loss.backward()
            for p in m.parameters():
                p.grad = None
            return loss.detach()

        return step
    prompt = torch.randint(0, vocab, (BATCH, PROMPT), device="cuda")

    def decode(m: Any) -> Any:
        with torch.no_grad():
            return m.generate(
                prompt, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                use_cache=True, pad_token_id=0,
            )  # fmt: skip

    return decode


def _measure(sides: dict[str, Any], step: Any, rounds: int, tables: bool) -> list[dict]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    outs = {k: step(m) for k, m in sides.items()}
    for _ in range(2):
        for m in sides.values():
            step(m)
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(rounds):  # interleaved rounds: a machine's drift hits every side alike
        for k, m in sides.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step(m)
            torch.cuda.synchronize()
            times[k].append((time.perf_counter() - t0) * 1e3)
    base = statistics.median(times["sdpa"])
    rows = []
    for k, m in sides.items():
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step(m)
            torch.cuda.synchronize()
        ka = prof.key_averages()
        med = statistics.median(times[k])
        q = statistics.quantiles(times[k], n=4)
        same = bool(torch.equal(outs[k], outs["sdpa"])) if outs[k].dtype == torch.long else None
        launches = sum(e.count for e in ka if e.key in _LAUNCHES)
        # a step of more launches than CUDA's queue holds (about a thousand) blocks on the
        # queue while the GPU is kept busy: its enqueue time would be the spin's
        enq = None
        if same is None and launches < 900:
            enq = enqueue_time(lambda m=m: step(m), warm=2, reps=7) * 1e3
        row = {
            "side": k,
            "ms": round(med, 3),
            "ratio": round(med / base, 3),
            "iqr_ms": round(q[2] - q[0], 3),
            # (the autograd node is named after the family since issue 39: SdpaFn)
            "sdpafn_calls": sum(e.count for e in ka if e.key in ("SDPAFn", "SdpaFn")),
            "gpu_kernel_ms": round(sum(e.self_device_time_total for e in ka) / 1e3, 3),
            "host_self_ms": round(sum(e.self_cpu_time_total for e in ka) / 1e3, 3),
            "launches": launches,
            "enqueue_ms": None if enq is None else round(enq, 3),
            "tokens_equal_sdpa": same,
        }
        rows.append(row)
        print(
            f"  {k:16s} {med:8.2f} ms ({med / base:.2f}x, IQR {row['iqr_ms']:.2f}) | SDPAFn "
            f"{row['sdpafn_calls']:3d} | launches {launches:5d} | GPU kernels "
            f"{row['gpu_kernel_ms']:7.2f} ms | host self "
            f"{row['host_self_ms']:7.2f} ms"
            + ("" if same is None else f" | tokens = sdpa: {same}")
            + ("" if enq is None else f" | enqueue {enq:6.2f} ms"),
            flush=True,
        )
        if tables:
            print(ka.table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=50))
    return rows


def _call_cases(torch: Any, shape: str) -> list[tuple[str, str, Any, Any]]:
    """``(op, mode, torch's callable, pycudnn's callable)`` at the decode or training shape."""
    from torch import nn
    from torch.nn import functional as F

    import pycudnn.torch as pt

    bf, dev = torch.bfloat16, "cuda"
    tokens = (BATCH, 1) if shape == "decode" else (BATCH, SEQ)
    x = torch.randn(*tokens, 1024, dtype=bf, device=dev)
    xg = x.clone().requires_grad_()
    dy = torch.randn_like(x)

    def module_pair(m: Any) -> tuple[Any, Any]:
        return m, pt.convert(copy.deepcopy(m))

    def fwd(m: Any) -> Any:
        def run() -> None:
            with torch.no_grad():
                m(x)

        return run

    def fwd_bwd(m: Any) -> Any:
        return lambda: torch.autograd.grad(m(xg), (xg, *m.parameters()), dy)

    sq, skv = (1, 512) if shape == "decode" else (SEQ, SEQ)
    q = torch.randn(BATCH, 16, sq, 64, dtype=bf, device=dev)
    k, v = (torch.randn(BATCH, 4, skv, 64, dtype=bf, device=dev) for _ in range(2))
    qkv = tuple(t.clone().requires_grad_() for t in (q, k, v))

    def attn(f: Any) -> Any:
        def run() -> None:
            with torch.no_grad():
                f(q, k, v, is_causal=sq > 1, enable_gqa=True)

        return run

    def attn_bwd(f: Any) -> Any:
        def run() -> None:
            o = f(*qkv, is_causal=sq > 1, enable_gqa=True)
            torch.autograd.grad(o, qkv, torch.ones_like(o))

        return run

    cases = []
    for name, m in (
        ("linear", nn.Linear(1024, 1024, bias=False, dtype=bf, device=dev)),
        ("layer_norm", nn.LayerNorm(1024, dtype=bf, device=dev)),
    ):
        ref, mine = module_pair(m)
        cases.append((name, "fwd", fwd(ref), fwd(mine)))
        if shape == "train":
            cases.append((name, "fwd+bwd", fwd_bwd(ref), fwd_bwd(mine)))
    sdpa = (F.scaled_dot_product_attention, pt.scaled_dot_product_attention)
    cases.append(("sdpa", "fwd", *(attn(f) for f in sdpa)))
    if shape == "train":
        cases.append(("sdpa", "fwd+bwd", *(attn_bwd(f) for f in sdpa)))
    return cases


def calls(n: int = 100, reps: int = 15) -> list[dict]:
    """Host µs per call, torch's module or function against the converted one (bfloat16, the
    GPU kept busy), for the decoder's operations at the decode and the training shapes."""
    import torch

    rows = []
    print("host µs per call, GPU kept busy (median, IQR):")
    for shape in ("decode", "train"):
        for op, mode, ref, mine in _call_cases(torch, shape):
            runs = n if shape == "decode" or op != "sdpa" else 20  # long kernels: fewer
            a, b = per_launch(ref, runs, reps), per_launch(mine, runs, reps)
            rows.append({"op": op, "shape": shape, "mode": mode, "torch": a, "pycudnn": b})
            ia, ib = a["q3_us"] - a["q1_us"], b["q3_us"] - b["q1_us"]
            print(
                f"  {op:10s} {shape:6s} {mode:8s} torch {a['median_us']:7.2f} ({ia:.2f}) | "
                f"pycudnn {b['median_us']:7.2f} ({ib:.2f}) | "
                f"{b['median_us'] / a['median_us']:.2f}x",
                flush=True,
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="llama,gpt2")
    ap.add_argument("--modes", default="train,decode")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--tables", action="store_true")
    ap.add_argument("--calls", action="store_true", help="per-call host cost first")
    ap.add_argument("--json", default=None, help="write the rows to this file")
    ap.add_argument(
        "--without",
        default="",
        help="class names (comma-separated) convert keeps in a fifth side, "
        "'pycudnn+convert-without' (e.g. NewGELUActivation: what its twin buys)",
    )
    args = ap.parse_args(argv)
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": []}
    if args.calls:
        results["calls"] = calls()
    for arch in filter(None, args.arch.split(",")):  # (--arch "": the per-call table alone)
        sides = _sides(arch, frozenset(filter(None, args.without.split(","))))
        vocab = sides["sdpa"].config.vocab_size
        for mode in args.modes.split(","):
            what = f"{BATCH}x{SEQ} step" if mode == "train" else f"b{BATCH}, {NEW} new tokens"
            print(f"{arch} {mode} ({what}):", flush=True)
            rounds = args.rounds if mode == "train" else max(3, args.rounds // 3)
            rows = _measure(sides, _steps(arch, mode, vocab), rounds, args.tables)
            results["cases"].append({"arch": arch, "mode": mode, "rows": rows})
        del sides
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
