"""Launch programs against torch eager on a real model (issue 37): torchvision's ResNet-50
(random init) in bfloat16 channels-last, torch eager against ``convert(fuse=True)`` with launch
programs and with them turned off (``region.use_programs(False)``: each chain one by one, as
before programs), all in one process, interleaved, on the same GPU.

Cases: inference (``torch.no_grad``, eval; the model in bfloat16) at batch 8 and 64; a training
step (forward, backward, ``SGD.step``) at batch 64 with the model in bfloat16 (``train``), with
float32 batch norms (``o2``: apex O2's ``keep_batchnorm_fp32``), and under
``torch.autocast(bf16)`` with float32 weights (``autocast``).

Per case and side: the median wall time of a step (``--reps`` timed blocks of ``--iters``
steps, each block synchronised) with its interquartile range, and, with ``--profile``, the GPU
kernel time per step and the host time until the step's last launch was enqueued
(``torch.profiler``), which tells a GPU-bound step from a host-bound one.

``--stem-ab`` adds a side with the stems' pooling kernel off
(``region_pool.use_pool_kernel(False)``: the stem's region and pooling module, as before the
sixteenth session).

``--per-launch`` adds the host cost of one launch inside a program (a program of 200 launches
of a bound 3x3 64->64 convolution, bfloat16 channels-last, batch 8, 56x56, enqueued while the
GPU is kept busy: ``bench/launch_floor.py``'s ``enqueue_time``), to set beside that script's
bare-execute floor for the same convolution.

Run on the GPU machine: ``PYTHONPATH=. python3 bench/program_step.py --json out.json``.
Self-contained: numpy, torch, torchvision, pycudnn and ``bench/launch_floor.py``.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return q[1], q[0], q[2]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--cases", default="eval-b8,eval-b64,train-b64,o2-b64,autocast-b64")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--per-launch", action="store_true")
    ap.add_argument("--json")
    ap.add_argument(
        "--stem-ab", action="store_true",
        help="a fourth side: programs with the stem's pooling kernel off (region_pool)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    results = []
    if args.per_launch:
        results.append(_per_launch())

    import torch
    import torchvision

    import pycudnn.torch as pt
    from pycudnn.torch import fuse, region, region_pool

    dev = "cuda"
    cl = torch.channels_last
    torch.backends.cudnn.benchmark = True
    for case in args.cases.split(","):
        mode, b = case.split("-b")
        batch = int(b)
        torch.manual_seed(0)
        wdt = torch.float32 if mode == "autocast" else torch.bfloat16
        base = torchvision.models.resnet50(weights=None).to(dev, wdt).to(memory_format=cl)
        if mode == "o2":  # batch norm kept in float32, as apex's O2 (keep_batchnorm_fp32)
            for m in base.modules():
                if isinstance(m, torch.nn.BatchNorm2d):
                    m.float()
        fused = pt.convert(copy.deepcopy(base), fuse=True)
        x = torch.randn(batch, 3, 224, 224, device=dev, dtype=wdt).to(memory_format=cl)
        target = torch.randint(0, 1000, (batch,), device=dev)

        def make(model, programs, mode=mode, x=x, target=target, stem=True):
            opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

            def step():
                region.use_programs(programs)
                region_pool.use_pool_kernel(stem)
                if mode == "eval":
                    model.eval()
                    with torch.no_grad():
                        model(x)
                    return
                model.train()  # "train", "o2", "autocast"
                with torch.autocast("cuda", torch.bfloat16, enabled=mode == "autocast"):
                    loss = torch.nn.functional.cross_entropy(model(x), target)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

            return step

        sides = {
            "torch": make(base, True),
            "programs": make(fused, True),
            "chains": make(pt.convert(copy.deepcopy(base), fuse=True), False),
        }
        if args.stem_ab:
            sides["no-stem-kernel"] = make(
                pt.convert(copy.deepcopy(base), fuse=True), True, stem=False
            )
        for fn in sides.values():
            for _ in range(3):
                fn()
        torch.cuda.synchronize()
        times: dict[str, list[float]] = {k: [] for k in sides}
        for _ in range(args.reps):
            for k, fn in sides.items():
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(args.iters):
                    fn()
                torch.cuda.synchronize()
                times[k].append((time.perf_counter() - t0) / args.iters * 1e3)
        row = {"case": case, "gpu": torch.cuda.get_device_name()}
        for k, ts in times.items():
            med, q1, q3 = _quartiles(ts)
            row[k] = {"median_ms": med, "iqr_ms": q3 - q1}
        if args.profile:
            row["profile"] = {k: _profile(torch, fn) for k, fn in sides.items()}
        row["program_status"] = sorted({w for _, _, w in fuse.programs(fused)})
        region.use_programs(True)
        region_pool.use_pool_kernel(True)
        results.append(row)
        t = row["torch"]["median_ms"]
        line = f"{case:14s} torch {t:7.2f} ms"
        for k in [k for k in sides if k != "torch"]:
            m = row[k]["median_ms"]
            line += f" | {k} {m:7.2f} ms ({m / t:.2f}x, IQR {row[k]['iqr_ms']:.2f})"
        if args.profile:
            p = row["profile"]
            line += " | kernel/host-enqueue ms: " + ", ".join(
                f"{k} {v['kernel_ms']:.2f}/{v['host_ms']:.2f}" for k, v in p.items()
            )
        print(line, flush=True)
        del base, fused, sides
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def _per_launch(n: int = 200) -> dict[str, float]:
    """Host µs per launch inside a program of *n* launches of one bound convolution."""
    import torch
    from launch_floor import enqueue_time  # bench/ is the script's directory

    from pycudnn.torch import _lean, conv, program

    cl = torch.channels_last
    x = torch.randn(8, 64, 56, 56, device="cuda", dtype=torch.bfloat16).to(memory_format=cl)
    w = torch.randn(64, 64, 3, 3, device="cuda", dtype=torch.bfloat16).to(memory_format=cl)
    y = torch.empty_like(x)
    cfg = (2, (1, 1), (1, 1), (1, 1), 1)
    conv.conv_into(x, w, None, y, cfg)
    with _lean.Tape() as tape:
        conv.conv_into(x, w, None, y, cfg)
    entry = tape.launches[0][0]
    prog = program.Program(3, [], 0, [], [(entry, (0, 1, 2))] * n)
    ptrs = [x.data_ptr(), w.data_ptr(), y.data_ptr()]
    stream = torch.cuda.current_stream().cuda_stream
    t = enqueue_time(lambda: prog.run(ptrs, x.device, stream), warm=3, reps=15)
    row = {"case": "program-per-launch", "us_per_launch": t / n * 1e6}
    print(f"program-per-launch {row['us_per_launch']:.2f} us (n={n})", flush=True)
    return row


def _profile(torch, fn, steps: int = 3) -> dict[str, float]:
    """GPU kernel ms per step and host ms per step until the last launch was enqueued."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        host = (time.perf_counter() - t0) / steps * 1e3
        torch.cuda.synchronize()
    kern = 0.0
    for e in prof.events():
        if getattr(e, "device_type", None) is not None and str(e.device_type).endswith("CUDA"):
            kern += e.device_time if hasattr(e, "device_time") else e.cuda_time
    return {"kernel_ms": kern / 1e3 / steps, "host_ms": host}


if __name__ == "__main__":
    sys.exit(main())
