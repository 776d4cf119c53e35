"""A ResNet stem's convolution with its input channels padded (issue 38's captured-inference
target): the 7x7 stride-2 convolution of a 3-channel image, batch norm and ReLU, eval, bfloat16
channels-last, torch eager against ``convert(fuse=True)`` (one fused cuDNN launch), with the
input's 3 channels as they are and zero-padded to 4 and 8 (16-byte pixels: the alignment
cuDNN's vectorized convolution kernels want), and the cost of that padding (a copy of the
input). GPU kernel µs per call from ``torch.profiler`` (median call of ``--calls``), and the
kernels' names.

Run on the GPU machine from the repository root::

    PYTHONPATH=. python3 bench/stem_pad.py [--batch 32] [--calls 20]
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import pycudnn.torch as pt  # noqa: E402
from bench import torch_models as tm  # noqa: E402

CL = torch.channels_last


def _stem(c: int) -> nn.Module:
    m = nn.Sequential(
        nn.Conv2d(c, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True)
    )
    with torch.no_grad():
        m[0].weight[:, 3:] = 0  # (padded channels: zero weights, the 3-channel result)
        m[1].running_var.uniform_(0.5, 2)
        m[1].running_mean.normal_()
    m = m.to("cuda", memory_format=CL).eval()
    m[0].weight.data = m[0].weight.data.to(torch.bfloat16)
    return m


def _kernels(fn, calls: int) -> tuple[float, list[str]]:
    with torch.no_grad():
        per = tm.profiled_kernels(fn, calls)
    names: dict[str, float] = {}
    for name, (_, us) in per.items():
        names[name[:90]] = names.get(name[:90], 0.0) + us
    top = sorted(names.items(), key=lambda kv: -kv[1])[:3]
    return sum(names.values()), [f"{t:.1f} us {n}" for n, t in top]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--calls", type=int, default=20)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    x3 = torch.randn(args.batch, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
    x3 = x3.contiguous(memory_format=CL)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, batch {args.batch}")
    for c in (3, 4, 8):
        ref = _stem(c)
        with torch.no_grad():
            ref[1].float()
        mine = pt.convert(copy.deepcopy(ref), fuse=True).eval()
        x = x3 if c == 3 else F.pad(x3, (0, 0, 0, 0, 0, c - 3)).contiguous(memory_format=CL)
        with torch.no_grad():
            want, got = ref(x).float(), mine(x).float()
            for _ in range(3):
                ref(x), mine(x)
        rel = float((want - got).abs().max() / want.abs().max())
        for name, m in (("torch", ref), ("pycudnn", mine)):
            us, top = _kernels(lambda m=m, x=x: m(x), args.calls)
            print(f"STEM C={c} {name:8s} {us:7.1f} us per call (max rel diff {rel:.1e}): "
                  + "; ".join(top))  # fmt: skip
    pad_us, _ = _kernels(
        lambda: F.pad(x3, (0, 0, 0, 0, 0, 5)).contiguous(memory_format=CL), args.calls
    )
    print(f"STEM padding 3 -> 8 channels (a copy of the input): {pad_us:.1f} us per call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
