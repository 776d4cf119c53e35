"""Host µs per call of the attention functions, for an A/B of two trees (issue 39: the attention
package must not be slower than the modules it replaced).

Times, with the GPU kept busy (``bench/launch_floor.py``'s ``per_launch``), each call cached:
``dnn_sdpa`` (inference; training with ``out_stats``), ``dnn_sdpa_grad`` (with ``out_grads``),
``dnn_sdpa`` with an additive bias, and ``pycudnn.torch.scaled_dot_product_attention`` forward
plus backward (the adapter's eager route). bfloat16, batch 2, 16 query and 4 key heads, 256
tokens, head dim 64. Prints one JSON object (medians and quartiles per row).

An A/B runs it alternately from two trees, each its own process::

    for i in 1 2 3; do
        PYTHONPATH=old python3 bench/attention_calls.py --tag old
        PYTHONPATH=. python3 bench/attention_calls.py --tag new
    done

Self-contained: torch, pycudnn and ``bench/launch_floor.py`` (the script's directory).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from launch_floor import per_launch  # bench/ is the script's directory


def cases() -> dict[str, Any]:
    """The rows: name -> a no-argument callable (one call each)."""
    import torch

    import pycudnn
    import pycudnn.torch as pt

    bf, dev = torch.bfloat16, "cuda"
    b, hq, hk, s, d = 2, 16, 4, 256, 64
    q = torch.randn(b, hq, s, d, dtype=bf, device=dev)
    k, v = (torch.randn(b, hk, s, d, dtype=bf, device=dev) for _ in range(2))
    out = torch.empty_like(q)
    stats = torch.empty((b, hq, s, 1), dtype=torch.float32, device=dev)
    dout = torch.randn_like(q)
    grads = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    bias = torch.randn(1, hq, s, s, dtype=bf, device=dev)
    pycudnn.dnn_sdpa(q, k, v, is_causal=True, training=True, out=out, out_stats=stats)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))

    def route() -> None:
        o = pt.scaled_dot_product_attention(qg, kg, vg, is_causal=True, enable_gqa=True)
        torch.autograd.grad(o, (qg, kg, vg), dout)

    return {
        "dnn_sdpa inference": lambda: pycudnn.dnn_sdpa(q, k, v, is_causal=True, out=out),
        "dnn_sdpa training": lambda: pycudnn.dnn_sdpa(
            q, k, v, is_causal=True, training=True, out=out, out_stats=stats
        ),
        "dnn_sdpa_grad": lambda: pycudnn.dnn_sdpa_grad(
            q, k, v, out, dout, stats, is_causal=True, out_grads=grads
        ),
        "dnn_sdpa bias": lambda: pycudnn.dnn_sdpa(q, k, v, bias, out=out),
        "torch route fwd+bwd": route,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tag", default="this tree")
    ap.add_argument("--n", type=int, default=50, help="calls per timed run")
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args(argv)
    rows = {}
    for name, fn in cases().items():
        for _ in range(3):
            fn()
        r = per_launch(fn, args.n, args.reps)
        rows[name] = {k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}
    print(json.dumps({"tag": args.tag, "rows": rows}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
