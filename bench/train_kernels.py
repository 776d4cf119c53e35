"""GPU kernel time and peak memory of one ResNet-50 training step (issue 38's targets): torch
eager, inductor (``torch.compile`` default mode of the original, with ``--inductor``) and
``convert(copy, fuse=True)`` (launch programs), all in one process on the same GPU.

torchvision's ``resnet50(weights=None)``, 224x224, channels-last, batch 64; a step is forward,
cross-entropy (in float32), backward and ``SGD(momentum=0.9).step()``. Cases: the whole model in
bfloat16 or float16 (``train-bf16``, ``train-fp16``), and float32 weights under
``torch.autocast`` (``autocast-bf16``, ``autocast-fp16``).

Per side: the summed GPU kernel time per step and the launches (``torch.profiler`` over
``--steps`` steps after three warm-up steps; per kernel family, :data:`FAMILIES`; ``--top N``
prints the N costliest kernels); the
peak memory of a step (torch's ``max_memory_allocated`` during one step less what was allocated
before it), what the forward left allocated, and what a step's graph still holds once its
backward has run (its loss kept, as a loop keeps it until the next forward has run). pycudnn's
workspaces and saved results are torch memory under ``pycudnn.torch``'s allocator, so they
count; the fused regions' arenas are added as ``pycudnn.torch.programs`` reports them.

Run on the GPU machine from the repository root::

    PYTHONPATH=. python3 bench/train_kernels.py [--cases train-bf16,autocast-bf16] [--inductor]
        [--top 12] [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import pycudnn.torch as pt  # noqa: E402
from bench import torch_models as tm  # noqa: E402

CASES = ("train-bf16", "autocast-bf16", "train-fp16", "autocast-fp16")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _step_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor, ac: torch.dtype | None):
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step(marks: list | None = None) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=ac, enabled=ac is not None):
            out = model(x)
        if marks is not None:  # what the forward left allocated (saved for the backward)
            marks.append(torch.cuda.memory_allocated())
        loss = nn.functional.cross_entropy(out.float(), y)
        loss.backward()
        opt.step()
        return loss

    return step


#: kernel families by name (first match): cuDNN's and cuBLAS's convolution and matmul kernels,
#: batch norm's forward and backward (cuDNN's NHWC kernels, torch's), inductor's generated
#: kernels (its fusions of batch norm, ReLU, the additions, pooling's backward), pooling,
#: copies, torch's elementwise kernels (additions, ReLU and its backward, fills), and the rest
FAMILIES = (
    ("inductor (triton)", ("triton_",)),
    ("conv/matmul", ("xmma", "nvjet", "cutlass", "gemm", "cask", "splitkreduce")),
    ("batch norm forward", ("batchnorm_fw", "batch_norm_collect", "batch_norm_transform",
                            "bn_fw", "batch_norm_elemt", "bn_stats_", "bn_finalize_",
                            "bn_apply_")),
    ("batch norm backward", ("batchnorm_bw", "batchnorm_add_relu_bw", "batchnorm_relu_bw",
                             "batch_norm_backward", "bn_bw", "bn_grad_")),
    ("pooling", ("pool",)),
    ("copies and casts", ("copy", "memcpy", "cat")),
    ("memset", ("memset",)),
    ("optimizer", ("multi_tensor_apply",)),
    ("elementwise (torch)", ("elementwise_kernel",)),
)  # fmt: skip


def families(per: dict[str, list[float]]) -> dict[str, float]:
    """:func:`~bench.torch_models.kernel_times`' table as ms per :data:`FAMILIES` (and
    ``other``)."""
    out = dict.fromkeys([f for f, _ in FAMILIES] + ["other"], 0.0)
    for name, (_, us) in per.items():
        low = name.lower()
        fam = next((f for f, keys in FAMILIES if any(k in low for k in keys)), "other")
        out[fam] += us / 1e3
    return out


def _measure(step, steps: int, top: int) -> dict:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    marks: list[int] = []
    step(marks)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    # what a step's graph still holds after its backward (a loop's ``loss`` is reassigned only
    # after the next forward has run): torch frees the saved tensors as the backward ends
    loss = step()
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    del loss
    gc.collect()
    held -= torch.cuda.memory_allocated()
    per = tm.profiled_kernels(step, steps)
    return {"kernel_ms": sum(us for _, us in per.values()) / 1e3,
            "launches": sum(c for c, _ in per.values()), "peak_step_mib": peak / 2**20,
            "after_forward_mib": (marks[0] - before) / 2**20, "resident_mib": before / 2**20,
            "held_after_backward_mib": held / 2**20, "families_ms": families(per),
            "top": tm.top_kernels(per, top)}  # fmt: skip


def run_case(case: str, inductor: bool, steps: int, top: int, device: torch.device) -> dict:
    mode, tag = case.split("-")
    dt = DTYPES[tag]
    ac = dt if mode == "autocast" else None
    wdt = torch.float32 if ac is not None else dt
    cl = torch.channels_last
    torch.manual_seed(0)
    model, source = tm.make_model("resnet50", own=False)
    base = model.to(device, wdt).to(memory_format=cl).train()
    x = torch.randn(64, 3, 224, 224, device=device, dtype=wdt).to(memory_format=cl)
    y = torch.randint(0, 1000, (64,), device=device)
    res: dict = {"case": case, "source": source, "batch": 64}
    sides = [("torch", lambda: copy.deepcopy(base))]
    if inductor:
        sides.append(("inductor", lambda: torch.compile(copy.deepcopy(base))))
    sides.append(("pycudnn", lambda: pt.convert(copy.deepcopy(base), fuse=True)))
    for name, make in sides:
        m = make()
        res[name] = _measure(_step_fn(m, x, y, ac), steps, top)
        if name == "pycudnn":  # the regions' arenas (pt.programs says them), of the peak
            res[name]["arenas_mib"] = sum(
                float(re.search(r"arena of ([\d.]+) MiB", what).group(1))
                for _, _, what in pt.programs(m)
                if "arena of" in what
            )
        del m
        tm.free(device)
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default=",".join(CASES[:2]), help=f"of {', '.join(CASES)}")
    p.add_argument("--inductor", action="store_true", help="also torch.compile the original")
    p.add_argument("--steps", type=int, default=3, help="steps profiled per side")
    p.add_argument("--top", type=int, default=0, help="print each side's N costliest kernels")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    for c in cases:
        if c not in CASES:
            p.error(f"--cases: unknown case {c!r} (cases: {', '.join(CASES)})")
    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "torch_cudnn": torch.backends.cudnn.version()}  # fmt: skip
    print(f"# {meta['gpu']}, torch {meta['torch']} (cuDNN {meta['torch_cudnn']})")
    results = []
    for case in cases:
        r = run_case(case, args.inductor, args.steps, args.top, device)
        results.append(r)
        cells = []
        for side in ("torch", "inductor", "pycudnn"):
            if side in r:
                s = r[side]
                cells.append(f"{side} {s['kernel_ms']:.2f} ms / {s['launches']:.0f} launches / "
                             f"peak +{s['peak_step_mib']:.0f} MiB (forward "
                             f"+{s['after_forward_mib']:.0f}, held after the backward "
                             f"{s['held_after_backward_mib']:.0f})")  # fmt: skip
        ours = r["pycudnn"]
        for side in ("torch", "inductor"):
            if side in r:
                cells.append(
                    f"kernels pycudnn/{side} {ours['kernel_ms'] / r[side]['kernel_ms']:.3f}"
                )
        cells.append(
            f"peak pycudnn/torch {ours['peak_step_mib'] / r['torch']['peak_step_mib']:.3f} "
            f"(pycudnn's regions' arenas {ours['arenas_mib']:.0f} MiB)"
        )
        print(f"TRAINKERN {case}: " + "; ".join(cells), flush=True)
        for side in ("torch", "inductor", "pycudnn"):
            if side in r:
                fam = ", ".join(f"{k} {v:.2f}" for k, v in r[side]["families_ms"].items() if v)
                print(f"  families {side}: {fam} ms", flush=True)
        for side in ("torch", "inductor", "pycudnn") if args.top else ():
            tm.print_top(side, r[side]["top"] if side in r else [])
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "cases": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
