"""A ResNet stem's convolution with its input channels padded (issue 38's captured-inference
target): the 7x7 stride-2 convolution of a 3-channel image, batch norm and ReLU, eval, bfloat16
channels-last, torch eager against ``convert(fuse=True)`` (one fused cuDNN launch), with the
input's 3 channels as they are and zero-padded to 4 and 8 (16-byte pixels: the alignment
cuDNN's vectorized convolution kernels want), and the cost of that padding (a copy of the
input); the plain convolution alone on each side (``STEM C=3 plain convolution``); with
``--engines`` the convolution as cuDNN graphs (plain, + bias + ReLU, * scale + bias + ReLU) on
their heuristics' first engine and autotuned (``STEMENG``); and the stem with its max pooling
(``STEMPOOL``: ``convert(fuse=True)`` runs the plain convolution, then batch norm and ReLU inside
pycudnn's pooling kernel). GPU kernel µs per call from ``torch.profiler`` (median call of
``--calls``), and the kernels' names.

Run on the GPU machine from the repository root::

    PYTHONPATH=. python3 bench/stem_pad.py [--batch 32] [--calls 20] [--engines]
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
from pycudnn import errors  # noqa: E402
from pycudnn.graph import Graph  # noqa: E402

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
    p.add_argument("--engines", action="store_true", help="the convolution's cuDNN engines too")
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
    ref = _stem(3)
    conv = pt.convert(copy.deepcopy(ref[0]))  # the convolution alone, pycudnn's plain call
    for name, fn in (("torch", lambda: ref[0](x3)), ("pycudnn", lambda: conv(x3))):
        us, top = _kernels(fn, args.calls)
        print(f"STEM C=3 plain convolution, {name:8s} {us:7.1f} us per call: " + "; ".join(top))
    if args.engines:
        _engines(x3, ref[0].weight.detach(), args.calls)
    # the stem with its max pooling: pycudnn's FusedPool runs the plain convolution, then the
    # batch norm and ReLU inside its pooling kernel
    full = nn.Sequential(*_stem(3), nn.MaxPool2d(3, 2, 1)).eval()
    with torch.no_grad():
        full[1].float()
    mine = pt.convert(copy.deepcopy(full), fuse=True).eval()
    with torch.no_grad():
        want, got = full(x3).float(), mine(x3).float()
    rel = float((want - got).abs().max() / want.abs().max())
    for name, m in (("torch", full), ("pycudnn", mine)):
        us, top = _kernels(lambda m=m: m(x3), args.calls)
        print(f"STEMPOOL {name:8s} {us:7.1f} us per call (max rel diff {rel:.1e}): "
              + "; ".join(top))  # fmt: skip
    return 0


def _engines(x: torch.Tensor, w: torch.Tensor, calls: int) -> None:
    """The stem's convolution as cuDNN graphs (plain; + bias + ReLU; * scale + bias + ReLU),
    each on its heuristics' first engine and on the fastest engine of modes A, B and
    fallback: GPU µs per call and the engine."""
    dev, dtype = x.device, x.dtype
    vec = torch.rand(1, 64, 1, 1, device=dev, dtype=dtype) + 0.5
    y = torch.empty(x.shape[0], 64, 112, 112, device=dev, dtype=dtype).to(memory_format=CL)
    for epi in ("plain", "bias-relu", "scale-bias-relu"):
        for build in ({}, {"policy": "autotune", "heur_mode": ("a", "b", "fallback")}):
            g = Graph(io_data_type=dtype, name=f"stem-{epi}")
            tx, tw = g.tensor_like(x, name="x"), g.tensor_like(w, name="w")
            pack = {tx: x, tw: w}
            t = g.conv_fprop(tx, tw, padding=3, stride=2)
            if epi != "plain":
                if epi.startswith("scale"):
                    ts = g.tensor_like(vec, name="s")
                    pack[ts] = vec
                    t = g.mul(t, ts)
                tb = g.tensor_like(vec, name="b")
                pack[tb] = vec
                t = g.relu(g.add(t, tb))
            pack[t.set_output(True)] = y
            try:
                g.build(**build)
            except errors.CudnnError as exc:
                print(f"STEMENG {epi} {build.get('policy', 'heuristics')}: no engine ({exc})"[:200])
                continue
            s = torch.cuda.current_stream()
            us, top = _kernels(lambda g=g, pack=pack, s=s: g.execute(pack, stream=s), calls)
            print(f"STEMENG {epi:16s} {build.get('policy', 'heuristics'):10s} {us:7.1f} us "
                  f"{g.describe()}: " + "; ".join(top[:1]))  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
