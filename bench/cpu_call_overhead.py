"""ns per cached call on the CPU (issue 30's call-key checks): fake operands, a stub entry.

No GPU: the call entry is a stub that returns its outputs, so what is timed is the Python
path of a cached call (keying, the checks before the lookup, the lookup). Run from the
repository root: ``PYTHONPATH=. python bench/cpu_call_overhead.py``.
"""

from __future__ import annotations

import statistics
import sys
import time

sys.path.insert(0, "tests/support")

from _fake_device import Fake

import pycudnn
from pycudnn.enums import DataType
from pycudnn.highlevel import _graphops


class _Stub:
    def run(self, ptrs, outs, out_ptrs, stream):
        return ("a", "b", "c")[: len(outs)]

    def evict(self):
        pass

    def stand_in(self, *places):
        pass


class _OneOut(_Stub):
    def run(self, ptrs, outs, out_ptrs, stream):
        return ("y",)


def main(n: int = 20000, repeats: int = 15) -> None:
    from pycudnn.highlevel import pool, reduction
    from pycudnn.highlevel.conv import _prepare

    _graphops.entry = lambda *a, **k: _Stub()
    _graphops.capability = lambda device: (9, 0)
    _prepare.build = lambda *a: _OneOut()
    pool._build_forward = lambda *a: _OneOut()
    reduction._build = lambda *a: _OneOut()
    q, k, v = (Fake((2, 4, 64, 64), DataType.BFLOAT16) for _ in range(3))
    x, g, b = Fake((4, 6, 64)), Fake((64,)), Fake((64,))
    img, w = Fake((2, 4, 8, 8), DataType.HALF), Fake((6, 4, 3, 3), DataType.HALF)
    cases = {
        "dnn_sdpa": lambda: pycudnn.dnn_sdpa(q, k, v, is_causal=True),
        "dnn_layer_norm": lambda: pycudnn.dnn_layer_norm(x, 64, g, b, 1e-5),
        "dnn_conv": lambda: pycudnn.dnn_conv(img, w, border_mode=1),
        "dnn_conv stride 2": lambda: pycudnn.dnn_conv(img, w, subsample=(2, 2)),
        "dnn_pool": lambda: pycudnn.dnn_pool(img, (2, 2), (2, 2)),
        "dnn_reduction": lambda: pycudnn.dnn_reduction(img, "add", axis=(2, 3)),
    }
    for name, f in cases.items():
        f()
        runs = []
        for _ in range(repeats):
            t = time.perf_counter_ns()
            for _ in range(n):
                f()
            runs.append((time.perf_counter_ns() - t) / n)
        print(f"{name}: median {statistics.median(runs):.0f} ns/call, min {min(runs):.0f}")


if __name__ == "__main__":
    main()
