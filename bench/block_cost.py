"""Host µs to enqueue one transformer block (issue 37: transformer blocks as launch programs).

transformers' ``GPT2Block`` of ``bench/llm_profile.py``'s GPT-2 (hidden 1024, 16 heads,
bfloat16, 4x1024 tokens), three sides in one process, each timed with the GPU kept busy
(``bench/launch_floor.py``'s ``enqueue_time``: host time, not GPU time), forward alone and
forward plus ``torch.autograd.grad`` of the input and the block's parameters:

* ``torch``: transformers' block with ``attn_implementation="sdpa"``;
* ``converted``: ``pycudnn.torch.convert`` keeping transformers' block (its layer norms, GELU and
  the ``"pycudnn"`` attention route converted, each its own call);
* ``program``: ``convert`` whole: the block is one launch program
  (:mod:`pycudnn.torch.transformers_block`).

Rounds interleave the sides (a machine's drift hits each alike); medians over the rounds. The
forward outputs of ``converted`` and ``program`` are compared first (max absolute difference).
Run on the GPU machine::

    PYTHONPATH=. python3 bench/block_cost.py [--rounds 5] [--reps 15] [--json FILE]

Self-contained: torch, transformers, pycudnn and ``bench/launch_floor.py``.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from typing import Any

from launch_floor import enqueue_time  # bench/ is the script's directory

BATCH, SEQ, HIDDEN, HEADS = 4, 1024, 1024, 16


def _sides() -> dict[str, Any]:
    import torch
    import transformers as tf

    import pycudnn.torch as pt

    pt.register_transformers()
    cfg = tf.GPT2Config(
        n_embd=HIDDEN, n_layer=1, n_head=HEADS, n_positions=SEQ, vocab_size=8192,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    base = tf.GPT2LMHeadModel._from_config(cfg, attn_implementation="sdpa", dtype=torch.bfloat16)
    sides = {"torch": base.cuda()}
    for name in ("converted", "program"):
        m = tf.GPT2LMHeadModel._from_config(
            copy.deepcopy(cfg), attn_implementation="pycudnn", dtype=torch.bfloat16
        ).cuda()
        m.load_state_dict(base.state_dict())
        keep = name == "converted"
        pt.convert(m, exclude=lambda mod, keep=keep: keep and type(mod).__name__ == "GPT2Block")
        sides[name] = m
    return {k: m.transformer.h[0] for k, m in sides.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import torch

    blocks = _sides()
    x = torch.randn(BATCH, SEQ, HIDDEN, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    go = torch.randn_like(x)

    def fwd(b: Any) -> Any:
        out = b(x)
        return out[0] if isinstance(out, tuple) else out

    def fwd_bwd(b: Any) -> Any:
        return torch.autograd.grad(fwd(b), [x, *b.parameters()], go)

    for b in blocks.values():  # the programs' first calls record
        for _ in range(2):
            fwd_bwd(b)
    with torch.no_grad():
        diff = (fwd(blocks["program"]) - fwd(blocks["converted"])).abs().max().item()
    times: dict[str, dict[str, list[float]]] = {k: {"fwd": [], "fwd_bwd": []} for k in blocks}
    for _ in range(args.rounds):
        for k, b in blocks.items():
            times[k]["fwd"].append(enqueue_time(lambda b=b: fwd(b), reps=args.reps) * 1e6)
            times[k]["fwd_bwd"].append(enqueue_time(lambda b=b: fwd_bwd(b), reps=args.reps) * 1e6)
    rows = {k: {m: round(statistics.median(v), 1) for m, v in t.items()} for k, t in times.items()}
    base = rows["torch"]
    print(f"BLOCK program vs converted forward: max abs difference {diff:.3g}")
    for k, r in rows.items():
        print(
            f"BLOCK {k:10s} forward {r['fwd']:8.1f} us ({r['fwd'] / base['fwd']:.2f}x)  "
            f"forward+backward {r['fwd_bwd']:8.1f} us ({r['fwd_bwd'] / base['fwd_bwd']:.2f}x)"
        )
    if args.json:
        out = {
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "rounds": args.rounds,
            "reps": args.reps,
            "max_abs_diff_program_converted": diff,
            "us": rows,
        }
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
