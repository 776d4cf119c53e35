"""cuDNN's softmax backward in channel mode against instance mode, on inputs without spatial
extent ``(N, C, 1, 1)`` (where the two compute the same thing) and one with, against torch's
own softmax backward. Prints ``SM2`` lines: µs per call, 10 calls after one warm-up, the
device synchronized around them.

    PYTHONPATH=. python3 bench/softmax_modes.py

Run on the GPU machine (torch). The figures in docs/BENCHMARKS.md ("Softmax backward") came
from this code (torch's row then without its warm-up call), run from the git-excluded .gpu/
folder before it was committed, before
pycudnn started asking for instance mode by itself (``pycudnn.highlevel.softmax``): since then
both of its rows for a shape without spatial extent run instance mode.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

import pycudnn


def _us(fn: Callable[[], Any]) -> float:
    """µs per call of *fn*: one warm-up, then 10 calls between device synchronizations."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / 10 * 1e6


def main() -> None:
    for shape in ((8192, 1024, 1, 1), (1024, 8192, 1, 1), (64, 1024, 1, 1), (64, 32, 16, 16)):
        for dt in (torch.float32, torch.bfloat16):
            y = torch.softmax(torch.randn(shape, device="cuda", dtype=dt), 1)
            dy = torch.randn_like(y)
            dx = torch.empty_like(y)
            rows = []
            for mode in ("channel", "instance") if shape[2] * shape[3] == 1 else ("channel",):
                for algo in ("accurate", "log"):
                    f = partial(pycudnn.dnn_softmax_grad, y, dy, algo=algo, mode=mode, out=dx)
                    rows.append((f"{mode:8s} {algo:8s}", _us(f)))
            rows.append(
                ("torch            ", _us(partial(torch._softmax_backward_data, dy, y, 1, dt)))
            )
            for what, us in rows:
                print(f"SM2 {shape!s:20s} {dt!s:15s} {what} grad {us:9.1f} us")


if __name__ == "__main__":
    main()
