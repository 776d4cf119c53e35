"""Attention bindings on and off, in one process (issue 37).

A mask-free, dropout-free eager attention call whose signature repeats launches the entry its
first call bound (``pycudnn.torch.attention.bound_attention``). This measures what that buys
with the rest of the code equal: the same process, the binding switched off by replacing
``attention.attention_sig`` with a function that answers None (every call then takes the
checked path, as before bindings), runs interleaved so the machine's drift hits every side
alike:

* per call, µs to enqueue with the GPU kept busy (``launch_floor.per_launch``, median of 9
  interleaved runs of 20 calls): attention at the decode shape (1 query, 512 keys) and at the
  training shape (1024 tokens, forward with a gradient, forward + backward), b4, 16/4 heads of
  64, bfloat16; torch's ``F.scaled_dot_product_attention`` beside;
* whole steps, ms (median, IQR; interleaved rounds): ``bench/llm_profile.py``'s Llama and GPT-2
  (4 layers, hidden 1024, bfloat16, from configs), a training step and a 32-token greedy decode,
  with ``attn_implementation="pycudnn"`` and also converted (``pt.convert``), bound and unbound,
  against ``attn_implementation="sdpa"``.

Run on the GPU machine::

    PYTHONPATH=. python3 bench/attention_bindings.py [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import llm_profile as L  # bench/ is the script's directory
from launch_floor import per_launch


@contextlib.contextmanager
def bindings(on: bool) -> Iterator[None]:
    """Attention bindings on (as shipped) or off (every call takes the checked path)."""
    from pycudnn.torch import attention

    real = attention.attention_sig
    if not on:
        attention.attention_sig = lambda *a: None
    try:
        yield
    finally:
        attention.attention_sig = real


def _switched(fn: Callable[[], Any], on: bool) -> Callable[[], None]:
    def run() -> None:
        with bindings(on):
            fn()

    return run


def _call_cases() -> list[tuple[str, Callable[[Any], Callable[[], None]]]]:
    import torch

    bf, out = torch.bfloat16, []
    for shape in ("decode", "train"):
        sq, skv = (1, 512) if shape == "decode" else (1024, 1024)
        q = torch.randn(4, 16, sq, 64, dtype=bf, device="cuda")
        k, v = (torch.randn(4, 4, skv, 64, dtype=bf, device="cuda") for _ in range(2))
        qkv = tuple(t.clone().requires_grad_() for t in (q, k, v))

        def fwd(f: Any, q: Any = q, k: Any = k, v: Any = v, causal: bool = sq > 1) -> Any:
            def run() -> None:
                with torch.no_grad():
                    f(q, k, v, is_causal=causal, enable_gqa=True)

            return run

        out.append((f"attention {shape} forward", fwd))
        if shape == "train":

            def fwd_grad(f: Any, qkv: tuple = qkv) -> Any:
                return lambda: f(*qkv, is_causal=True, enable_gqa=True)

            def fwd_bwd(f: Any, qkv: tuple = qkv) -> Any:
                def run() -> None:
                    o = f(*qkv, is_causal=True, enable_gqa=True)
                    torch.autograd.grad(o, qkv, torch.ones_like(o))

                return run

            out.append((f"attention {shape} forward (grad)", fwd_grad))
            out.append((f"attention {shape} forward + backward", fwd_bwd))
    return out


def calls(reps: int = 9) -> dict[str, dict[str, float]]:
    import torch.nn.functional as F

    import pycudnn.torch as pt

    rows: dict[str, dict[str, float]] = {}
    print("µs per call, GPU kept busy (median of interleaved runs of 20 calls):", flush=True)
    for name, make in _call_cases():
        sides = {
            "torch": make(F.scaled_dot_product_attention),
            "bound": _switched(make(pt.scaled_dot_product_attention), True),
            "unbound": _switched(make(pt.scaled_dot_product_attention), False),
        }
        got: dict[str, list[float]] = {k: [] for k in sides}
        for _ in range(reps):
            for k, fn in sides.items():
                got[k].append(per_launch(fn, 20, 1)["median_us"])
        m = {k: round(statistics.median(v), 2) for k, v in got.items()}
        rows[name] = m
        print(
            f"  {name:38s} torch {m['torch']:7.1f} | bound {m['bound']:7.1f} "
            f"({m['bound'] / m['torch']:.2f}x) | unbound {m['unbound']:7.1f} "
            f"({m['unbound'] / m['torch']:.2f}x)",
            flush=True,
        )
    return rows


def steps(rounds: dict[str, int]) -> dict[str, dict[str, Any]]:
    import torch
    import transformers as tf

    out: dict[str, dict[str, Any]] = {}
    for arch in ("llama", "gpt2"):
        cfg, _ = L._config(tf, arch)
        models = L._sides(arch)  # (its "sdpa-again" control is not timed here)
        models["convert"] = models["pycudnn+convert"]
        for mode, n in rounds.items():
            step = L._steps(arch, mode, cfg.vocab_size)
            sides = {
                "sdpa": (models["sdpa"], True),
                "pycudnn bound": (models["pycudnn"], True),
                "pycudnn unbound": (models["pycudnn"], False),
                "convert bound": (models["convert"], True),
                "convert unbound": (models["convert"], False),
            }
            first = {}
            for k, (m, on) in sides.items():  # the first call binds; one more warms up
                with bindings(on):
                    first[k] = step(m)
                    step(m)
            torch.cuda.synchronize()
            t: dict[str, list[float]] = {k: [] for k in sides}
            for _ in range(n):
                for k, (m, on) in sides.items():
                    with bindings(on):
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        step(m)
                        torch.cuda.synchronize()
                    t[k].append((time.perf_counter() - t0) * 1e3)
            base = statistics.median(t["sdpa"])
            case = out[f"{arch} {mode}"] = {"rounds": n}
            print(f"{arch} {mode} ({n} interleaved rounds), ms (ratio to sdpa, IQR):", flush=True)
            for k in sides:
                med, q = statistics.median(t[k]), statistics.quantiles(t[k], n=4)
                row = {
                    "ms": round(med, 2),
                    "ratio": round(med / base, 3),
                    "iqr_ms": round(q[2] - q[0], 2),
                }
                tokens = ""
                if mode == "decode":
                    row["tokens_equal_sdpa"] = bool(torch.equal(first[k], first["sdpa"]))
                    tokens = f" tokens = sdpa: {row['tokens_equal_sdpa']}"
                case[k] = row
                ms, ratio, iqr = row["ms"], row["ratio"], row["iqr_ms"]
                print(f"  {k:16s} {ms:8.2f} ({ratio:.3f}x, IQR {iqr:.2f}){tokens}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None, help="write the results to this file")
    args = ap.parse_args(argv)
    res = {"per_call_us": calls(), "steps_ms": steps({"train": 21, "decode": 9})}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
