"""ResNet-50 training step, plain torch vs converted with ``pycudnn.torch`` (issue 14).

Run on the GPU machine from the repository root::

    PYTHONPATH=. python3 bench/torch_resnet50.py [--quick] [--batch 64] [--autotune]

ResNet-50 is defined here (torchvision's v1.5 architecture: stride on the 3x3 convolution of a
bottleneck), not imported. Data and convolution/linear weights are bfloat16 in channels-last
memory; batch-norm parameters and statistics stay float32 (mixed precision's usual choice;
torch and cuDNN both take bfloat16 data with float32 batch-norm parameters). A step is forward,
cross-entropy loss and backward (no optimizer: both sides would run the same one). Both models
live in one process with the same weights; their steps alternate (the order flips every
repetition), each timed over several steps between synchronizations, and the medians are
compared. ``--autotune`` sets ``torch.backends.cudnn.benchmark`` and pycudnn's
``time_once`` algorithms; by default both use cuDNN's heuristics.

Prints one summary line ``resnet50 step ms: torch X pycudnn Y ratio Z`` (ratio = pycudnn /
torch; the target is <= 1.00) and writes the numbers to ``$OUT/resnet50.json`` when ``$OUT`` is
set (``--json PATH`` too).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402  (torch first: pycudnn then finds the libcudnn torch loaded)
from torch import nn  # noqa: E402

import pycudnn  # noqa: E402
import pycudnn.torch as pt  # noqa: E402
from bench.harness import alternate_many  # noqa: E402


# ==================================================================================================
# ResNet-50
# ==================================================================================================
class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample=None):
        super().__init__()
        width = planes
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet50(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._layer(64, 3)
        self.layer2 = self._layer(128, 4, stride=2)
        self.layer3 = self._layer(256, 6, stride=2)
        self.layer4 = self._layer(512, 3, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512 * Bottleneck.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * Bottleneck.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(
                    self.inplanes, planes * Bottleneck.expansion, 1, stride=stride, bias=False
                ),
                nn.BatchNorm2d(planes * Bottleneck.expansion),
            )
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * Bottleneck.expansion
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def to_bf16_channels_last(model: nn.Module, device: str | torch.device) -> nn.Module:
    """*model* on *device*, channels-last, its parameters bfloat16 except batch norms' (their
    parameters and statistics stay float32: mixed precision's usual choice)."""
    model = model.to(device, memory_format=torch.channels_last)
    for m in model.modules():
        if not isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)):
            for p in m.parameters(recurse=False):
                p.data = p.data.to(torch.bfloat16)
    return model


def build(device: str) -> nn.Module:
    """bfloat16 channels-last ResNet-50 with float32 batch-norm parameters and statistics."""
    return to_bf16_channels_last(ResNet50(), device)


def count_converted(model: nn.Module) -> int:
    """How many modules of *model* are pycudnn.torch's."""
    twins = set(pt.supported_modules().values())
    return sum(type(m) in twins for m in model.modules())


# ==================================================================================================
# Timing
# ==================================================================================================
def step(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, amp: torch.dtype | None = None
) -> torch.Tensor:
    """One training step without optimizer: forward and loss (under ``torch.autocast`` to *amp*
    when given), backward outside it."""
    model.zero_grad(set_to_none=True)
    ctx = torch.autocast(x.device.type, amp) if amp is not None else contextlib.nullcontext()
    with ctx:
        loss = nn.functional.cross_entropy(model(x).float(), y)
    loss.backward()
    return loss


def sync(device: torch.device) -> None:
    """Wait for *device*'s queued work (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn: Callable[[], object], n: int, device: torch.device) -> float:
    """Milliseconds per call of *fn* over *n* calls between synchronizations."""
    sync(device)
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / n * 1e3


def time_steps(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, n: int, amp: torch.dtype | None = None
) -> float:
    """Milliseconds per step over *n* steps between synchronizations."""
    return time_calls(lambda: step(model, x, y, amp), n, x.device)


def rel_diff(got: torch.Tensor, want: torch.Tensor) -> float:
    """``max |got - want| / max |want|``."""
    want = want.float()
    return ((got.float() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def rel_l2(xs: list[torch.Tensor], ys: list[torch.Tensor]) -> float:
    """``||xs - ys|| / ||ys||`` over all the tensors as one vector."""
    num = sum(float((a.float() - b.float()).square().sum()) for a, b in zip(xs, ys, strict=True))
    den = sum(float(b.float().square().sum()) for b in ys)
    return (num / max(den, 1e-30)) ** 0.5


def compare_grads(
    ref: nn.Module,
    mine: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
) -> dict[str, Any]:
    """The gradients the last :func:`step` left in *ref* and in its converted twin *mine* (same
    weights, same data): the largest per-tensor relative difference and its parameter, and the
    relative L2 difference of the whole gradient (one norm: a parameter whose gradient is near
    zero makes the per-tensor maximum large without the step being different). Then the noise
    floor of the precision: each side's gradient against a float32 copy of *ref* stepped once on
    the same data without autocast (a randomly initialised ResNet's bf16 step is chaotic: both
    sides sit near that floor when they are right)."""
    pairs = list(zip(mine.named_parameters(), ref.parameters(), strict=True))
    gdiff, worst = max((rel_diff(a.grad, b.grad), n) for (n, a), b in pairs)
    g_mine = [a.grad for (_n, a), _b in pairs]
    g_ref = [b.grad for _p, b in pairs]
    ref32 = copy.deepcopy(ref).float()
    step(ref32, x.float(), y)
    g32 = [p.grad for p in ref32.parameters()]
    return {
        "max_rel_grad_diff": gdiff,
        "max_rel_grad_diff_param": worst,
        "grad_rel_l2": rel_l2(g_mine, g_ref),
        "grad_rel_l2_torch_vs_fp32": rel_l2(g_ref, g32),
        "grad_rel_l2_pycudnn_vs_fp32": rel_l2(g_mine, g32),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--quick", action="store_true", help="fewer repetitions (about 30 s)")
    p.add_argument("--autotune", action="store_true", help="time algorithms on both sides")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument(
        "--profile",
        action="store_true",
        help="print each side's GPU time per kernel family for one step",
    )
    return p.parse_args(argv)


def profile_step(name: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    """One step under torch.profiler: the GPU time of the 10 costliest kernels (where the
    difference between the two sides is)."""
    import cProfile
    import io
    import pstats

    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    step(model, x, y)  # host time to queue one step (the GPU runs behind it)
    host = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    step(model, x, y)
    pr.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(8)
    print(f"# host {name}: {host:.2f} ms to queue one step; top functions by own time:")
    for line in out.getvalue().splitlines():
        if line.strip() and line.strip()[0].isdigit():
            print("#   " + line.strip()[:150])
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step(model, x, y)
        torch.cuda.synchronize()
    rows = {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", 0) or getattr(e, "cuda_time_total", 0)
        if t:
            rows[e.key] = (t, e.count)
    total = sum(t for t, _c in rows.values())
    print(f"# profile {name}: GPU total {total / 1e3:.2f} ms in {len(rows)} kernel kinds")
    for key, (t, c) in sorted(rows.items(), key=lambda kv: -kv[1][0])[:10]:
        print(f"#   {t / 1e3:7.3f} ms  x{c:<4d} {key[:110]}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("resnet50: no CUDA device", file=sys.stderr)
        return 2
    reps, per = (4, 3) if args.quick else (9, 5)
    torch.backends.cudnn.benchmark = args.autotune
    if args.autotune:
        pycudnn.config.algo_fwd = "time_once"
        pycudnn.config.algo_bwd_data = "time_once"
        pycudnn.config.algo_bwd_filter = "time_once"
    torch.manual_seed(0)
    dev = "cuda"
    ref = build(dev)
    mine = pt.convert(copy.deepcopy(ref), strict=True)
    converted = count_converted(mine)
    x = torch.randn(args.batch, 3, 224, 224, device=dev, dtype=torch.bfloat16)
    x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (args.batch,), device=dev)

    # warm up (plans, workspaces, allocator pools) and check both compute the same step
    t0 = time.perf_counter()
    for _ in range(3):
        lr = step(ref, x, y)
        lm = step(mine, x, y)
    torch.cuda.synchronize()
    warm = time.perf_counter() - t0
    loss_diff = abs(lr.item() - lm.item())
    g = compare_grads(ref, mine, x, y)
    gdiff, worst, gnorm = g["max_rel_grad_diff"], g["max_rel_grad_diff_param"], g["grad_rel_l2"]
    floor, mine32 = g["grad_rel_l2_torch_vs_fp32"], g["grad_rel_l2_pycudnn_vs_fp32"]

    # alternating, the order flipped every repetition
    t_ref, t_mine = alternate_many(
        [lambda: time_steps(ref, x, y, per), lambda: time_steps(mine, x, y, per)], reps
    )
    times = {"torch": t_ref, "pycudnn": t_mine}
    t_torch = statistics.median(times["torch"])
    t_mine = statistics.median(times["pycudnn"])
    ratio = t_mine / t_torch
    peak = torch.cuda.max_memory_allocated() / 2**30
    info = pycudnn.library_info()
    result = {
        "benchmark": "resnet50 training step (forward + loss + backward)",
        "batch": args.batch,
        "dtype": "bfloat16 channels-last (batch norm float32)",
        "algorithms": "autotuned" if args.autotune else "heuristics",
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "torch_cudnn": torch.backends.cudnn.version(),
        "pycudnn_cudnn": info.runtime_version,
        "libcudnn": str(info.path),
        "converted_modules": converted,
        "fused_conv_bias": True,  # dnn_conv(..., bias=) since issue 13
        "reps": reps,
        "steps_per_rep": per,
        "torch_ms": times["torch"],
        "pycudnn_ms": times["pycudnn"],
        "torch_median_ms": t_torch,
        "pycudnn_median_ms": t_mine,
        "ratio": ratio,
        "warmup_s": warm,
        "first_loss_abs_diff": loss_diff,
        "max_rel_grad_diff": gdiff,
        "max_rel_grad_diff_param": worst,
        "grad_rel_l2_diff": gnorm,
        "grad_rel_l2_torch_bf16_vs_fp32": floor,
        "grad_rel_l2_pycudnn_bf16_vs_fp32": mine32,
        "peak_memory_gib": peak,
    }
    print(
        f"# {result['gpu']}, torch {torch.__version__} (cuDNN {result['torch_cudnn']}), pycudnn "
        f"on cuDNN {info.runtime_version}; {converted} modules converted; batch {args.batch}; "
        f"{result['algorithms']}; loss diff {loss_diff:.2e}, gradient relative L2 diff {gnorm:.2e} "
        f"(max per tensor {gdiff:.2e}, {worst}); vs a float32 torch copy: torch bf16 {floor:.2e}, "
        f"pycudnn bf16 {mine32:.2e}; "
        f"warm-up {warm:.1f} s; peak memory {peak:.1f} GiB"
    )
    if args.profile:
        profile_step("torch", ref, x, y)
        profile_step("pycudnn", mine, x, y)
    print(f"resnet50 step ms: torch {t_torch:.2f} pycudnn {t_mine:.2f} ratio {ratio:.3f}")
    out_env = os.environ.get("OUT")
    targets = [args.json, out_env and os.path.join(out_env, "resnet50.json")]
    for path in filter(None, targets):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
