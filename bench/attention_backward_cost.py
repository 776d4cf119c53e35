"""Where a bound attention call's host time goes, forward and backward (issue 37).

A bound attention forward + backward (``pycudnn.torch.attention.bound_attention``) still costs
more host time than torch's. This splits it: per call, the forward with a gradient plus the
``ones_like`` of its output, then ``torch.autograd.grad``, and for pycudnn the time spent inside
the bound backward (``pycudnn.torch._binding.backward``, timed on autograd's thread: the
gradient's signature, the outputs' allocation, the entry's launch). b4, 16/4 heads of 64, 1024
tokens, causal, bfloat16; 7 runs of 20 calls behind a 60 ms spin kernel (the queue never
drains); medians in µs. torch's ``F.scaled_dot_product_attention`` measured the same way.

Run on the GPU machine::

    PYTHONPATH=. python3 bench/attention_backward_cost.py

First run as ``.gpu/bwd_probe.py`` (sixth session), committed with the same measurement.
"""

from __future__ import annotations

import collections
import statistics
import time
from typing import Any

from launch_floor import _busy  # bench/ is the script's directory


def main() -> None:
    import torch
    import torch.nn.functional as F

    import pycudnn.torch as pt
    from pycudnn.torch import _binding

    bf = torch.bfloat16
    q = torch.randn(4, 16, 1024, 64, dtype=bf, device="cuda", requires_grad=True)
    k, v = (
        torch.randn(4, 4, 1024, 64, dtype=bf, device="cuda", requires_grad=True) for _ in range(2)
    )
    inside: list[float] = []
    real = _binding.backward

    def timed(*a: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return real(*a, **kw)
        finally:
            inside.append(time.perf_counter() - t)

    _binding.backward = timed
    sides = (
        ("pycudnn", pt.scaled_dot_product_attention),
        ("torch", F.scaled_dot_product_attention),
    )
    for name, f in sides:
        for _ in range(5):  # the first call binds; the rest warm up
            o = f(q, k, v, is_causal=True, enable_gqa=True)
            torch.autograd.grad(o, (q, k, v), torch.ones_like(o))
        torch.cuda.synchronize()
        inside.clear()
        times: dict[str, list[float]] = collections.defaultdict(list)
        for _ in range(7):
            torch.cuda._sleep(int(60_000 * _busy().cycles_per_us))
            for _ in range(20):
                t0 = time.perf_counter()
                o = f(q, k, v, is_causal=True, enable_gqa=True)
                g = torch.ones_like(o)
                t1 = time.perf_counter()
                torch.autograd.grad(o, (q, k, v), g)
                t2 = time.perf_counter()
                times["fwd"].append(t1 - t0)
                times["grad"].append(t2 - t1)
            torch.cuda.synchronize()

        def med(x: list[float]) -> float:
            return 1e6 * statistics.median(x)

        extra = f" | inside _binding.backward {med(inside):.1f}" if inside else ""
        print(
            f"{name:8s} forward+ones_like {med(times['fwd']):.1f} us | autograd.grad "
            f"{med(times['grad']):.1f} us{extra}",
            flush=True,
        )
    _binding.backward = real


if __name__ == "__main__":
    main()
