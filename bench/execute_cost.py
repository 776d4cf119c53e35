"""Host cost of one cuDNN launch per operation kind, against torch's operation (issue 37).

``bench/launch_floor.py`` measured the floor for a convolution: a bound entry's launch (the
variant pack's pointers set and ``cudnnBackendExecute``) at 11-12 µs on an H200, against torch's
``F.conv2d`` at 16-20 µs. A converted transformer's launches are matmuls, norms and attention;
this measures, per kind, with the GPU kept busy so the queue never drains
(``launch_floor.per_launch``):

* ``entry``: the bound entry's launch alone (what a launch program replays), its pointers
  from the tape of one adapter call (``pycudnn.torch._lean.Tape``);
* ``adapter``: the adapter's lean function (its outputs allocated with ``torch.empty``, the
  signature keyed and looked up, the entry launched): what a converted module's call costs
  below its ``autograd.Function``;
* ``torch``: torch's own operation (cuBLAS, its layer-norm kernel, its cuDNN/flash attention).

Shapes are a Llama-size layer at training size (4096 rows of 1024, 16 heads of 64, bfloat16)
and at decode size (4 rows; one query against 512 keys), and the language-model head of
``bench/llm_profile.py``'s GPT-2 (1024 -> 8192, no bias). Median µs per launch over runs of
200 launches (µs, IQR), one process.

    PYTHONPATH=. python3 bench/execute_cost.py [--reps 15] [--json FILE]

Run on the GPU machine (torch).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from launch_floor import per_launch  # bench/ is the script's directory


def cases() -> list[tuple[str, Callable[[], Any], Callable[[], Any]]]:
    import torch
    import torch.nn.functional as F

    from pycudnn.torch import attention, linear, norm

    dt, dev = torch.bfloat16, "cuda"
    out = []
    for rows, tag in ((4096, "training"), (4, "decode")):
        x = torch.randn(rows, 1024, device=dev, dtype=dt)
        w = torch.randn(1024, 1024, device=dev, dtype=dt) * 0.03
        b = torch.zeros(1024, device=dev, dtype=dt)
        g, beta = torch.ones(1024, device=dev, dtype=dt), torch.zeros(1024, device=dev, dtype=dt)
        out.append((f"Linear 1024->1024 +bias, {rows} rows",
                    lambda x=x, w=w, b=b: linear.linear_run(x, w, b),
                    lambda x=x, w=w, b=b: F.linear(x, w, b)))  # fmt: skip
        wh = torch.randn(8192, 1024, device=dev, dtype=dt) * 0.03
        out.append((f"Linear 1024->8192 (a language-model head, no bias), {rows} rows",
                    lambda x=x, w=wh: linear.linear_run(x, w, None),
                    lambda x=x, w=wh: F.linear(x, w)))  # fmt: skip
        out.append((f"LayerNorm 1024, {rows} rows, with statistics ({tag})",
                    lambda x=x, g=g, b=beta: norm.layer_norm_run(x, g, b, (1024,), 1e-5, True),
                    lambda x=x, g=g, b=beta: torch.native_layer_norm(x, (1024,), g, b,
                                                                     1e-5)))  # fmt: skip
        out.append((f"RMSNorm 1024, {rows} rows, inference",
                    lambda x=x, g=g: norm.rms_norm_run(x, g, (1024,), 1e-6, False),
                    lambda x=x, g=g: F.rms_norm(x, (1024,), g, 1e-6)))  # fmt: skip
    q = torch.randn(4, 16, 1024, 64, device=dev, dtype=dt)
    k, v = torch.randn_like(q), torch.randn_like(q)
    out.append(("attention b4 h16 t1024 d64 causal, training forward",
                lambda: attention.sdpa_run(q, k, v, None, True, None, 0.0, None, True),
                lambda: torch.ops.aten._scaled_dot_product_cudnn_attention(
                    q, k, v, None, True, 0.0, True, False)))  # fmt: skip
    o, st = attention.sdpa_run(q, k, v, None, True, None, 0.0, None, True)
    do = torch.randn_like(o)
    out.append(("attention b4 h16 t1024 d64 causal, backward",
                lambda: attention._op_grad(q, k, v, o, do, st, None, True, None, 0.0, None, False),
                None))  # fmt: skip
    qd = torch.randn(4, 16, 1, 64, device=dev, dtype=dt)
    kd = torch.randn(4, 16, 512, 64, device=dev, dtype=dt)
    vd = torch.randn_like(kd)
    out.append(("attention decode: 1 query, 512 keys",
                lambda: attention.sdpa_run(qd, kd, vd, None, False, None, 0.0, None, False),
                lambda: F.scaled_dot_product_attention(qd, kd, vd)))  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import torch

    from pycudnn.torch import _lean

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; µs per launch, median (IQR)")
    rows: dict[str, Any] = {}
    for name, ours, theirs in cases():
        ours()  # bind
        with _lean.Tape() as tape:
            ours()
        launches = [(e, tuple(t.data_ptr() for t in ts)) for e, ts in tape.launches]
        row: dict[str, Any] = {"launches": len(launches)}
        if len(launches) == 1 and launches[0][0] is not None:
            e, ptrs = launches[0]
            row["entry"] = per_launch(lambda e=e, ptrs=ptrs: e.launch(ptrs), a.n, a.reps)
        row["adapter"] = per_launch(ours, a.n, a.reps)
        if theirs is not None:
            theirs()
            row["torch"] = per_launch(theirs, a.n, a.reps)
        rows[name] = row
        cells = []
        for k in ("entry", "adapter", "torch"):
            if k in row:
                r = row[k]
                cells.append(f"{k} {r['median_us']:6.2f} ({r['q1_us']:.2f}-{r['q3_us']:.2f})")
        print(f"EXECCOST {name:58s} " + "  ".join(cells), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
