"""Child process for the leak soak: create/destroy descriptors of every family, report RSS.

Run as ``python _desc_leak_child.py CYCLES [leak]``; prints one JSON line. Half of the objects are
closed explicitly, the other half dropped (freed by their finalizer when the last reference
goes). Resident memory is read from ``/proc/self/statm`` after a warm-up.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time

from pycudnn import _resource
from pycudnn.descriptors import (
    ActivationDescriptor,
    BackendDescriptor,
    ConvolutionDescriptor,
    CTCLossDescriptor,
    DropoutDescriptor,
    FilterDescriptor,
    LRNDescriptor,
    OpTensorDescriptor,
    PoolingDescriptor,
    ReduceTensorDescriptor,
    RNNDataDescriptor,
    RNNDescriptor,
    SpatialTransformerDescriptor,
    TensorDescriptor,
)

MAKERS = [
    lambda: TensorDescriptor((2, 3, 4, 5), "float16", layout="NHWC"),
    lambda: FilterDescriptor((8, 3, 3, 3)),
    lambda: ConvolutionDescriptor((1, 1), (2, 2), groups=2),
    lambda: PoolingDescriptor((2, 2, 2), mode="average_exc_pad"),
    lambda: ActivationDescriptor("swish", swish_beta=1.0),
    lambda: LRNDescriptor(),
    lambda: OpTensorDescriptor("mul"),
    lambda: ReduceTensorDescriptor("max", indices=True),
    lambda: DropoutDescriptor(),
    lambda: RNNDescriptor(16, 2, dropout=DropoutDescriptor()),
    lambda: RNNDataDescriptor([5, 3, 1], 8, layout="seq_major_unpacked"),
    lambda: SpatialTransformerDescriptor((1, 2, 3, 4)),
    lambda: CTCLossDescriptor(),
    lambda: BackendDescriptor.tensor((1, 8, 16, 16), uid=1, finalize=False),
]


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run(cycles: int, leak: bool = False) -> None:
    n = len(MAKERS)
    for i in range(cycles):
        d = MAKERS[i % n]()
        if leak:
            d.detach()  # sensitivity check: disarmed and never destroyed
        elif i & 1:
            d.close()
        del d


def main() -> None:
    cycles = int(sys.argv[1])
    leak = len(sys.argv) > 2 and sys.argv[2] == "leak"
    run(max(cycles // 10, 2000))  # warm-up: library sub-loads, caches, allocator arenas
    gc.collect()
    before = rss()
    t0 = time.perf_counter()
    run(cycles, leak)
    elapsed = time.perf_counter() - t0
    gc.collect()
    after = rss()
    print(
        json.dumps(
            {
                "cycles": cycles,
                "rss_before": before,
                "rss_after": after,
                "growth": after - before,
                "live": _resource.live_counts(),
                "seconds": round(elapsed, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
