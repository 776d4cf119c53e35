"""Where a compiled fused ResNet-50's eval replay spends its GPU time (issue 37, the
``torch.compile`` target): ``torch.compile(mode=...)`` of torchvision's ResNet-50 (bf16
channels-last, float32 batch norms, eval, ``no_grad``) against the same of
``convert(copy, fuse=True)``, ``torch.profiler`` over timed calls after warm-up (and, under
``reduce-overhead``, capture); per call: kernels, their summed time, and the kernels that take
it, by name. A third side is the converted model with batch norm's scale folded into the weights
by torch's multiply, one launch per convolution (``fold_kernel.ENABLED = False`` while it warms up
and is captured), instead of pycudnn's fold kernel, one launch for all.

Run on the GPU machine from the repository root::

    PYTHONPATH=. python3 bench/region_fold_profile.py [--batch 8] [--mode reduce-overhead]
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import pycudnn.torch as pt  # noqa: E402
from bench import torch_models as tm  # noqa: E402
from bench import torch_resnet50 as rn  # noqa: E402
from pycudnn.torch import fold_kernel  # noqa: E402

CALLS = 20


def _kernels(fn, x) -> tuple[dict, int]:
    """``{kernel name: (count, µs)}`` per call of *fn(x)*, and the calls profiled."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn(x)
        torch.cuda.synchronize()
    got: dict = defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time > 0:
            got[ev.name][0] += 1
            got[ev.name][1] += ev.device_time
    return {k: (n / CALLS, us / CALLS) for k, (n, us) in got.items()}, CALLS


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--mode", default="reduce-overhead", choices=("default", "reduce-overhead"))
    p.add_argument("--top", type=int, default=14)
    args = p.parse_args()
    model, _ = tm.make_model("resnet50", own=True)
    ref = rn.to_bf16_channels_last(model, "cuda").eval()
    mine = pt.convert(copy.deepcopy(ref), fuse=True).eval()
    plain = pt.convert(copy.deepcopy(ref), fuse=True).eval()
    x = torch.randn(args.batch, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
    x = x.to(memory_format=torch.channels_last)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, batch {args.batch}, "
          f"mode {args.mode}")  # fmt: skip
    sides = (("torch", ref, True), ("pycudnn", mine, True), ("pycudnn, torch's fold", plain, False))
    for name, m, kernel in sides:
        fn = torch.compile(m, mode=args.mode)
        fold_kernel.ENABLED = kernel  # read while the warm-up and the capture fold
        with torch.no_grad():
            for _ in range(5):
                fn(x)
        torch.cuda.synchronize()
        fold_kernel.ENABLED = True
        per, _ = _kernels(fn, x)
        n = sum(c for c, _ in per.values())
        us = sum(t for _, t in per.values())
        print(f"{name}: {n:.0f} kernels, {us:.1f} us of kernels per call")
        for k, (c, t) in sorted(per.items(), key=lambda kv: -kv[1][1])[: args.top]:
            print(f"  {t:8.1f} us  {c:5.1f}x  {k[:110]}")


if __name__ == "__main__":
    main()
