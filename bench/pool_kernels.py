"""ResNet's stem max pooling (3x3, stride 2, padding 1, 64 channels, 112x112 images,
channels-last) forward and backward: pycudnn's own kernels (:mod:`pycudnn.torch.pool_kernel`)
against cuDNN's NHWC pooling (what a converted ``MaxPool2d`` ran before them) and torch's
``max_pool2d_with_indices``, GPU µs per call from ``torch.profiler`` (all kernels of ``--calls``
calls), and each direction's bytes at the rate torch's addition of two such tensors reaches (the
memory's rate here).

Run on the GPU machine from the repository root::

    PYTHONPATH=. python3 bench/pool_kernels.py [--batches 32,64] [--dtypes bf16,fp16]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import pycudnn  # noqa: E402  (after torch: one libcudnn)
from bench import torch_models as tm  # noqa: E402
from pycudnn.torch import pool, pool_kernel  # noqa: E402

CL = torch.channels_last
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
CFG = ((3, 3), (2, 2), (1, 1), "max")


def _us(fn, calls: int) -> float:
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    return sum(us for _, us in tm.profiled_kernels(fn, calls).values())


def case(batch: int, dtype: torch.dtype, calls: int) -> dict:
    """Each side's forward and backward µs per call for one batch and dtype."""
    x = torch.randn(batch, 64, 112, 112, device="cuda").to(dtype, memory_format=CL)
    y, idx = pool_kernel.forward(x, CFG, True)
    dy = torch.randn_like(y)
    yt, it = F.max_pool2d_with_indices(x, 3, 2, 1)
    aten = torch.ops.aten.max_pool2d_with_indices_backward
    add_in, add_out = torch.empty_like(x), torch.empty_like(x)
    t = {
        "own_fwd": _us(lambda: pool_kernel.forward(x, CFG, True), calls),
        "own_fwd_eval": _us(lambda: pool_kernel.forward(x, CFG, False), calls),
        "own_bwd": _us(lambda: pool_kernel.backward(dy, idx, tuple(x.shape), CFG), calls),
        "cudnn_fwd": _us(lambda: pool.pool_run(x, CFG), calls),
        "cudnn_bwd": _us(lambda: pool.pool_grad_run(x, y, dy, CFG), calls),
        "torch_fwd": _us(lambda: F.max_pool2d_with_indices(x, 3, 2, 1), calls),
        "torch_bwd": _us(lambda: aten(dy, x, [3, 3], [2, 2], [1, 1], [1, 1], False, it), calls),
        # the memory's rate: read two input-sized tensors, write one
        "add_traffic": _us(lambda: torch.add(x, add_in, out=add_out), calls),
    }
    del yt
    return {k: round(v, 1) for k, v in t.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="32,64")
    p.add_argument("--dtypes", default="bf16,fp16")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    dts = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    for d in dts:
        if d not in DTYPES:
            p.error(f"--dtypes: unknown dtype {d!r} (of {', '.join(DTYPES)})")
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cudnn": pycudnn.version()}  # fmt: skip
    print(f"# {meta['gpu']}, torch {meta['torch']}, cuDNN {meta['cudnn']}")
    rows = []
    for b in batches:
        for d in dts:
            t = case(b, DTYPES[d], args.calls)
            rows.append({"batch": b, "dtype": d, "us": t})
            print(
                f"POOLK b{b} {d}: forward own {t['own_fwd']} (eval {t['own_fwd_eval']}) / cuDNN "
                f"{t['cudnn_fwd']} / torch {t['torch_fwd']} us; backward own {t['own_bwd']} / "
                f"cuDNN {t['cudnn_bwd']} / torch {t['torch_bwd']} us; add of two inputs "
                f"{t['add_traffic']} us",
                flush=True,
            )
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
