"""Data-parallel scaling: one GPU vs two under DistributedDataParallel, torch vs pycudnn (issue 28).

Run on a machine with two GPUs from the repository root::

    PYTHONPATH=. python3 bench/ddp_scaling.py [--quick] [--batch 64] [--model resnet50]

The training step of ``bench/torch_resnet50.py`` (its ResNet-50: bfloat16 channels-last data and
weights, float32 batch norm; forward, cross-entropy, backward) plus an SGD update, for the
model as torch.nn and converted with ``pycudnn.torch.convert``. Two processes (one per GPU,
NCCL, started with ``torch.multiprocessing.spawn``, NVLink multicast off) each hold both models
twice: a plain copy (the one-GPU step, timed on rank 0 while rank 1 waits) and a
``DistributedDataParallel`` copy (the two-GPU step, ``--batch`` images per GPU, the time of the
slower rank), and the DDP step without its all-reduce (``no_sync``, to split DDP's cost into
its host/copy part and the exposed communication). The six (model, mode) cases alternate within
one run (the order turns every repetition), each timed over several steps between
synchronizations; the medians are compared. The gradients' all-reduce alone (one flat buffer of
their size) is timed too.

Throughput ratio = two-GPU images/s / one-GPU images/s = 2 * t1 / t2; scaling efficiency =
ratio / 2. Target: pycudnn's efficiency >= 90 % and within 2 points of torch's. Prints one
summary line ``ddp scaling ...`` (after two ``#`` lines: the setup, and DDP's cost split) and
writes the numbers to ``$OUT/ddp_scaling_b<batch>[_bucketview].json`` when ``$OUT`` is set
(``--json PATH`` too).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402  (torch first: pycudnn then finds the libcudnn torch loaded)
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402

import pycudnn  # noqa: E402
import pycudnn.torch as pt  # noqa: E402
from bench.torch_resnet50 import build  # noqa: E402

NO_MULTICAST = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
SIDES = ("torch", "pycudnn")


def step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    opt.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(model(x).float(), y).backward()
    opt.step()


def timed(model, opt, x, y, n: int, group_max: bool, nosync: bool = False) -> float:
    """Milliseconds per step over *n* steps (the slowest rank's when *group_max*); *nosync*:
    the DDP model's step without its gradient all-reduce (``no_sync``)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        if nosync:
            with model.no_sync():
                step(model, opt, x, y)
        else:
            step(model, opt, x, y)
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) / n * 1e3
    if group_max:
        t = torch.tensor([ms], device="cuda")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        ms = float(t)
    return ms


def worker(rank: int, world: int, args: argparse.Namespace, result: str) -> None:
    os.environ.update(NO_MULTICAST)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    try:
        run(rank, world, args, result)
    finally:
        dist.destroy_process_group()


def run(rank: int, world: int, args: argparse.Namespace, result: str) -> None:
    dev = torch.device("cuda", rank)
    torch.manual_seed(0)
    base = build(str(dev))
    models = {"torch": base, "pycudnn": pt.convert(copy.deepcopy(base), strict=True)}
    cases = {}
    for side in SIDES:
        if rank == 0:
            single = copy.deepcopy(models[side])
            cases[(side, 1)] = (single, torch.optim.SGD(single.parameters(), lr=1e-3))
        ddp = nn.parallel.DistributedDataParallel(
            copy.deepcopy(models[side]),
            device_ids=[rank],
            gradient_as_bucket_view=args.bucket_view,
        )
        cases[(side, world)] = (ddp, torch.optim.SGD(ddp.parameters(), lr=1e-3))
    del models, base
    g = torch.Generator(device=dev).manual_seed(rank)
    x = torch.randn(args.batch, 3, 224, 224, device=dev, dtype=torch.bfloat16, generator=g)
    x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (args.batch,), device=dev, generator=g)
    reps, per = (3, 3) if args.quick else (7, 6)
    order = [(s, n) for s in SIDES for n in (1, world, 0)]  # 0: DDP without the all-reduce
    times: dict[str, list[float]] = {f"{s}_{n}gpu" if n else f"{s}_nosync": [] for s, n in order}
    t_warm = time.perf_counter()
    for r in range(reps + 1):  # repetition 0 warms up (plans, workspaces, NCCL buckets)
        for side, n in order if r % 2 == 0 else order[::-1]:
            dist.barrier()
            k = per if r else 2
            if n == 1:
                if rank == 0:
                    ms = timed(*cases[(side, 1)], x, y, k, group_max=False)
            else:
                ms = timed(*cases[(side, world)], x, y, k, group_max=True, nosync=n == 0)
            dist.barrier()
            if r and rank == 0:
                times[f"{side}_{n}gpu" if n else f"{side}_nosync"].append(ms)
        if r == 0:
            torch.cuda.synchronize()
            t_warm = time.perf_counter() - t_warm
    # the gradients' all-reduce alone: one flat buffer of all of them (bf16 + the float32 ones)
    nbytes = sum(p.numel() * p.element_size() for p in cases[("torch", world)][0].parameters())
    buf = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=dev)
    ar = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        torch.cuda.synchronize()
        ar.append((time.perf_counter() - t0) * 1e3)
    if rank != 0:
        return
    med = {k: statistics.median(v) for k, v in times.items()}
    out: dict = {
        "benchmark": f"{args.model} training step (forward + loss + backward + SGD), DDP scaling",
        "batch_per_gpu": args.batch,
        "world": world,
        "dtype": "bfloat16 channels-last (batch norm float32)",
        "gpu": torch.cuda.get_device_name(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(world)],
        "torch": torch.__version__,
        "torch_cudnn": torch.backends.cudnn.version(),
        "pycudnn_cudnn": pycudnn.library_info().runtime_version,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "reps": reps,
        "steps_per_rep": per,
        "gradient_as_bucket_view": args.bucket_view,
        "warmup_s": t_warm,
        "gradient_bytes": nbytes,
        "allreduce_ms": ar,
        "allreduce_median_ms": statistics.median(ar[1:]),
        "ms": times,
        "median_ms": med,
    }
    for side in SIDES:
        t1, tn = med[f"{side}_1gpu"], med[f"{side}_{world}gpu"]
        out[f"{side}_throughput_ratio"] = world * t1 / tn
        out[f"{side}_efficiency"] = t1 / tn
    with open(result, "w") as f:
        json.dump(out, f)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batch", type=int, default=64, help="images per GPU (default 64)")
    p.add_argument("--model", default="resnet50", choices=["resnet50"])
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    p.add_argument(
        "--bucket-view",
        action="store_true",
        help="DDP(gradient_as_bucket_view=True): gradients are views of the all-reduce buckets",
    )
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if torch.cuda.device_count() < args.world_size:
        print(f"ddp scaling: needs {args.world_size} GPUs, {torch.cuda.device_count()} visible")
        return 2
    os.environ.update(NO_MULTICAST)  # inherited by the spawned processes
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "result.json")
        mp.spawn(worker, args=(args.world_size, args, path), nprocs=args.world_size)
        with open(path) as f:
            out = json.load(f)
    w, med = out["world"], out["median_ms"]
    eff_t, eff_p = out["torch_efficiency"], out["pycudnn_efficiency"]
    gap = (eff_t - eff_p) * 100
    out["efficiency_gap_points"] = gap
    out["target_met"] = eff_p >= 0.90 and gap <= 2.0
    print(
        f"# {' + '.join(out['gpus'])}, torch {out['torch']} (cuDNN {out['torch_cudnn']}, NCCL "
        f"{out['nccl']}), pycudnn on cuDNN {out['pycudnn_cudnn']}; {out['batch_per_gpu']} images "
        f"per GPU; {out['reps']} reps x {out['steps_per_rep']} steps; "
        f"warm-up {out['warmup_s']:.1f} s"
    )
    ov = {
        s: (med[f"{s}_nosync"] - med[f"{s}_1gpu"], med[f"{s}_{w}gpu"] - med[f"{s}_nosync"])
        for s in SIDES
    }
    out["ddp_overhead_ms"] = {
        s: {"without_allreduce": a, "allreduce_exposed": b} for s, (a, b) in ov.items()
    }
    print(
        "# DDP cost over the one-GPU step, ms (without the all-reduce / the all-reduce exposed): "
        + "; ".join(f"{s} {a:+.2f} / {b:+.2f}" for s, (a, b) in ov.items())
        + f"; all-reduce of the {out['gradient_bytes'] / 2**20:.0f} MiB of gradients alone "
        f"{out['allreduce_median_ms']:.2f} ms"
    )
    print(
        f"ddp scaling {args.model} step ms 1-GPU/{w}-GPU: torch {med['torch_1gpu']:.2f}/"
        f"{med[f'torch_{w}gpu']:.2f} ratio {out['torch_throughput_ratio']:.3f} eff "
        f"{eff_t:.1%}; pycudnn {med['pycudnn_1gpu']:.2f}/{med[f'pycudnn_{w}gpu']:.2f} ratio "
        f"{out['pycudnn_throughput_ratio']:.3f} eff {eff_p:.1%}; gap {gap:+.1f} points; "
        f"target {'met' if out['target_met'] else 'MISSED'}"
    )
    name = f"ddp_scaling_b{args.batch}{'_bucketview' if args.bucket_view else ''}.json"
    targets = [args.json, os.environ.get("OUT") and os.path.join(os.environ["OUT"], name)]
    for target in filter(None, targets):
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
