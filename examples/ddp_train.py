"""Converted models trained under DistributedDataParallel, compared step by step with torch's."""

# GPU: one process per GPU (NCCL), a ResNet and an LSTM + attention model, pycudnn vs torch
#
#     python examples/ddp_train.py [--steps N] [--world-size N] [--json out.json]
#
# Each process trains the same model twice from the same seed and data, once as torch.nn and
# once converted with pycudnn.torch.convert, each wrapped in DistributedDataParallel. After
# every step it checks that the parameters are equal on every rank (all_gather); rank 0 then
# compares the two runs' losses. torch.nn.SyncBatchNorm, if a model has one, stays torch's.
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import socket
import sys
import tempfile
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import pycudnn.torch

# NVLink multicast off in this process and the ones it starts (set before NCCL starts)
NO_MULTICAST = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
BATCH = 16  # per GPU
LOSS_RTOL = 5e-3  # |loss(pycudnn) - loss(torch)| <= LOSS_RTOL * max(1, |loss(torch)|)


class SeqNet(nn.Module):  # type: ignore[misc,unused-ignore]
    """An LSTM, a layer norm, one self-attention block and a classifier head."""

    def __init__(self, features: int = 32, hidden: int = 64, classes: int = 10) -> None:
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, num_layers=2, batch_first=True)
        self.norm = nn.LayerNorm(hidden)
        self.attn = nn.MultiheadAttention(hidden, 4, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: Any) -> Any:
        h, _ = self.lstm(x)
        h = self.norm(h)
        a, _ = self.attn(h, h, h, need_weights=False)
        return self.head((h + a).mean(dim=1))


def make_model(kind: str) -> Any:
    """The model, initialised from seed 0 (the same on every rank and for both runs)."""
    torch.manual_seed(0)
    if kind == "seq":
        return SeqNet()
    try:
        models = importlib.import_module("torchvision.models")
        return models.resnet18(num_classes=10)
    except ImportError:  # a small ResNet-style CNN with batch norm
        layers = [nn.Conv2d(3, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU()]
        layers += [nn.Conv2d(32, 64, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(64)]
        layers += [nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)]
        return nn.Sequential(*layers)


def batch(kind: str, step: int, rank: int, device: Any) -> tuple[Any, Any]:
    """This rank's data for *step* (the same for both runs)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    shape = (BATCH, 12, 32) if kind == "seq" else (BATCH, 3, 32, 32)
    x = torch.randn(shape, generator=g)
    y = torch.randint(0, 10, (BATCH,), generator=g)
    return x.to(device), y.to(device)


def train(kind: str, convert: bool, steps: int, rank: int, world: int) -> dict[str, Any]:
    device = torch.device("cuda", rank)
    model = make_model(kind)
    if convert:
        pycudnn.torch.convert(model)
    ddp = nn.parallel.DistributedDataParallel(model.to(device), device_ids=[rank])
    # a step size that keeps the random-label loss near ln(10): larger ones make the four steps
    # chaotic, so that rounding alone (even torch against itself) moves the loss by percents
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    losses: list[float] = []
    spread: list[float] = []
    for step in range(steps):
        x, y = batch(kind, step, rank, device)
        loss = nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)  # the global batch's loss
        losses.append(float(mean) / world)
        flat = torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])
        every = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(every, flat)
        spread.append(max(float((e - every[0]).abs().max()) for e in every))
    return {"losses": losses, "param_diff": spread}


def worker(rank: int, world: int, steps: int, kinds: list[str], result: str) -> None:
    os.environ.update(NO_MULTICAST)
    torch.cuda.set_device(rank)
    torch.backends.cudnn.allow_tf32 = False  # pycudnn's default: compare like with like
    torch.backends.cuda.matmul.allow_tf32 = False
    # deterministic engines on both sides: each run is then reproducible, and what is left
    # between the two is the engines' rounding, not atomics' order from run to run
    torch.backends.cudnn.deterministic = True
    pycudnn.config.deterministic = True
    dist.init_process_group("nccl", rank=rank, world_size=world)
    try:
        out = {k: {v: train(k, v == "pycudnn", steps, rank, world) for v in RUNS} for k in kinds}
        if rank == 0:
            with open(result, "w") as f:
                json.dump(out, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


RUNS = ("torch", "pycudnn")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--world-size", type=int, default=torch.cuda.device_count())
    p.add_argument("--models", default="cnn,seq")
    p.add_argument("--json", default=None, help="write the losses and differences here")
    args = p.parse_args()
    world, kinds = int(args.world_size), str(args.models).split(",")
    os.environ.update(NO_MULTICAST)  # the spawned processes inherit the environment
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        mp.spawn(worker, args=(world, int(args.steps), kinds, result), nprocs=world)
        with open(result) as f:
            out: dict[str, Any] = json.load(f)
    ok = True
    for kind in kinds:
        ref, got = out[kind]["torch"], out[kind]["pycudnn"]
        diff = max(abs(a - b) for a, b in zip(got["losses"], ref["losses"], strict=True))
        agree = all(
            abs(a - b) <= LOSS_RTOL * max(1.0, abs(b))
            for a, b in zip(got["losses"], ref["losses"], strict=True)
        )
        spread = max(got["param_diff"] + ref["param_diff"])
        ok = ok and agree and spread == 0
        name = "resnet18" if kind == "cnn" and importlib.util.find_spec("torchvision") else kind
        print(
            f"ddp {name}: world {world}, {len(ref['losses'])} steps, final loss pycudnn "
            f"{got['losses'][-1]:.5f} torch {ref['losses'][-1]:.5f}, max |loss diff| {diff:.2e} "
            f"(tol {LOSS_RTOL:g} rel) agree {'yes' if agree else 'NO'}, "
            f"max |param diff across ranks| {spread:.3g} ranks equal "
            f"{'yes' if spread == 0 else 'NO'}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"world": world, "loss_rtol": LOSS_RTOL, "models": out}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
