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

Process-to-process noise on a shared machine can exceed the difference looked for, so
``--against DIR`` also imports DIR's ``pycudnn`` under another name (the package's imports are all
relative) and alternates the two trees' high-level rows run by run in this one process (the
adapter's row stays this tree's: both adapters would register the same torch ops);
``--profile`` prints each row's Python function calls per call (``cProfile``; deterministic, so
a difference in Python steps shows without noise) and its heaviest functions.

Self-contained: torch, pycudnn and ``bench/launch_floor.py`` (the script's directory).
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import json
import pstats
import statistics
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from launch_floor import per_launch  # bench/ is the script's directory


def other_tree(root: str) -> ModuleType:
    """*root*'s ``pycudnn`` package imported as ``pycudnn_ab``."""
    init = Path(root) / "pycudnn" / "__init__.py"
    spec = importlib.util.spec_from_file_location("pycudnn_ab", init)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--against: no pycudnn package at {init}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["pycudnn_ab"] = mod
    spec.loader.exec_module(mod)
    return mod


def cases(pycudnn: ModuleType | None = None) -> dict[str, Any]:
    """The rows: name -> a no-argument callable (one call each); *pycudnn*: another tree's
    package (its high-level rows only), default this tree's with the adapter's row."""
    import torch

    other = pycudnn is not None
    if pycudnn is None:
        import pycudnn

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
        import pycudnn.torch as pt

        o = pt.scaled_dot_product_attention(qg, kg, vg, is_causal=True, enable_gqa=True)
        torch.autograd.grad(o, (qg, kg, vg), dout)

    rows = {
        "dnn_sdpa inference": lambda: pycudnn.dnn_sdpa(q, k, v, is_causal=True, out=out),
        "dnn_sdpa training": lambda: pycudnn.dnn_sdpa(
            q, k, v, is_causal=True, training=True, out=out, out_stats=stats
        ),
        "dnn_sdpa_grad": lambda: pycudnn.dnn_sdpa_grad(
            q, k, v, out, dout, stats, is_causal=True, out_grads=grads
        ),
        "dnn_sdpa bias": lambda: pycudnn.dnn_sdpa(q, k, v, bias, out=out),
    }
    if not other:
        rows["torch route fwd+bwd"] = route
    return rows


def profile(fn: Any, calls: int = 200, top: int = 8) -> tuple[float, list[str]]:
    """Python function calls per call of *fn* and its *top* functions by own time."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    st = pstats.Stats(prof)
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:top]  # type: ignore[attr-defined]
    heavy = [f"{f[2]} ({Path(f[0]).name}:{f[1]}) {v[1] / calls:.1f}x" for f, v in rows]
    return st.total_calls / calls, heavy  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tag", default="this tree")
    ap.add_argument("--n", type=int, default=50, help="calls per timed run")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--against", metavar="DIR", help="also time DIR's pycudnn, alternating")
    ap.add_argument("--profile", action="store_true", help="Python calls per call (cProfile)")
    args = ap.parse_args(argv)
    trees = {args.tag: cases()}
    if args.against:
        trees[args.against] = cases(other_tree(args.against))
    for rows in trees.values():
        for fn in rows.values():
            for _ in range(3):
                fn()
    if args.profile:
        for tag, rows in trees.items():
            for name, fn in rows.items():
                per_call, heavy = profile(fn)
                print(f"# {tag}: {name}: {per_call:.0f} Python calls per call", flush=True)
                for h in heavy:
                    print(f"#     {h}", flush=True)
    if not args.against:
        rows_out = {}
        for name, fn in trees[args.tag].items():
            r = per_launch(fn, args.n, args.reps)
            rows_out[name] = {k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}
        print(json.dumps({"tag": args.tag, "rows": rows_out}), flush=True)
        return 0
    # one run of each tree in turn, the order flipping every repetition
    tags = list(trees)
    got: dict[str, dict[str, list[float]]] = {t: {} for t in tags}
    for name in trees[tags[1]]:
        for rep in range(args.reps):
            for tag in tags if rep % 2 == 0 else tags[::-1]:
                r = per_launch(trees[tag][name], args.n, 1)
                got[tag].setdefault(name, []).append(r["median_us"])
    out = {
        tag: {n: round(statistics.median(v), 3) for n, v in rows.items()}
        for tag, rows in got.items()
    }
    print(json.dumps({"in_process": out}), flush=True)
    for name in got[tags[0]]:
        a, b = out[tags[0]][name], out[tags[1]][name]
        print(f"{name:22s} {tags[1]} {b:8.2f} | {tags[0]} {a:8.2f} us | ratio {a / b:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
