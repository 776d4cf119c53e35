"""Real models through ``pycudnn.torch`` against plain PyTorch (issue 25).

Run on the GPU machine from the repository root::

    PYTHONPATH=. python3 bench/torch_models.py [--quick] [--only CASE[,CASE]] [--batch 64]
    PYTHONPATH=. python3 bench/torch_models.py --smoke     # tiny shapes; CPU tensors too

The method is ``bench/torch_resnet50.py``'s (its helpers are imported): each model and its
converted twin (``pycudnn.torch.convert(copy.deepcopy(model), strict=True)``, the same weights)
live in one process; after untimed warm-up steps (plans, workspaces, allocator pools) their timed
repetitions alternate, the order flipping every repetition, each repetition a few steps between
two synchronizations; the medians are compared (ratio = pycudnn / torch). cuDNN's heuristics on
both sides (``torch.backends.cudnn.benchmark`` as torch leaves it, off).

Cases (``--only`` takes these groups or a prefix of a case name, e.g. ``train-resnet18``):

train   forward, ``F.cross_entropy``, backward, no optimizer (``set_to_none`` gradients between
        steps) of torchvision's ResNet-50 and ResNet-18 (``weights=None``) at ``--batch`` 224x224
        images, in two precisions: ``bf16`` (weights and data bfloat16, channels-last, batch-norm
        parameters and statistics float32) and ``autocast`` (float32 weights, channels-last,
        forward and loss inside ``torch.autocast(..., torch.bfloat16)``). Target <= 1.00x.
        Correctness after warm-up: the loss of both sides, the relative L2 difference of the whole
        gradient, and the noise floor of the precision (each side against a float32 copy).
infer   ResNet-50 ``eval()`` under ``torch.no_grad()``, bf16 channels-last, batch 1, 8 and 64.
        Target <= 1.00x. Correctness: the logits' relative difference and top-1 agreement.
lstm    a training step (forward, MSE loss, backward to the weights and the input) of the RNN
        configuration ``bench/ops.py`` measured on its own (``blstm-h512-fp32``: 2-layer
        bidirectional ``nn.LSTM``, hidden 512, batch 32, 50 steps, float32, time-major; torch's
        TF32 off there and here, pycudnn's off by default).
modules host microseconds per call of a torch module against its converted twin, on small
        tensors (batch 8, 28x28, bf16 channels-last) so that the GPU keeps up: the time to
        enqueue N calls (``time.perf_counter``, a synchronization only before and after the
        loop), medians. Three columns: forward under ``no_grad``; forward with autograd recording
        (the input requires grad; each call's graph is dropped at the next); backward of that
        module alone = (forward with grad, then ``torch.autograd.grad(y, (x, *parameters), dy)``
        on the graph just built, no ``retain_graph``) minus the forward with grad. In-place
        modules get a fresh clone of the input each call (its cost, timed alone, is subtracted;
        its backward node, a pass-through, stays in).

Prints one line per case at the end, ``case: torch X ms pycudnn Y ms ratio Z``, after the module
table and a line with the GPU, torch's and pycudnn's cuDNN versions; writes everything to
``$OUT/models.json`` when ``$OUT`` is set (``--json PATH`` too). ``--quick`` cuts the repetitions
(planned to keep the whole run under about 4 minutes on an H100 or H200; most of it is warm-up:
the first converted step of each model plans its convolutions). ``--smoke`` runs every case once
on tiny shapes; on a machine without CUDA on CPU tensors, where the converted modules fall back
to torch: a check of the script, not a measurement. Without torchvision the ResNet cases are
skipped, each with its reason; ``--own-resnet50`` (implied by ``--smoke``) then times
``bench/torch_resnet50.py``'s ResNet-50 (torchvision's v1.5 architecture; the JSON's ``source``
says which) and still skips ResNet-18.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import alternate_many  # noqa: E402  (no torch needed)

try:  # torch first: pycudnn then finds the libcudnn torch loaded
    import torch
    from torch import nn
except ImportError:  # --help and the argument checks work without torch
    torch = nn = None  # type: ignore[assignment]
if torch is not None:
    import pycudnn
    import pycudnn.torch as pt
    from bench import torch_resnet50 as rn

GROUPS = ("train", "infer", "lstm", "modules")
ARCHS = ("resnet50", "resnet18")
PRECISIONS = ("bf16", "autocast")
INFER_BATCHES = (1, 8, 64)
CASE_IDS = (
    *(f"train-{a}-{p}" for a in ARCHS for p in PRECISIONS),
    *(f"infer-resnet50-b{b}" for b in INFER_BATCHES),
    "lstm",
    "modules",
)
TARGET = 1.00  # pycudnn / torch step time, training and inference
# bench/ops.py's blstm-h512-fp32 (rnn_case("lstm", "fp32", 512, 32, 50, 2, True, True))
LSTM = {"hidden": 512, "batch": 32, "steps": 50, "layers": 2, "bidirectional": True}
LSTM_SMOKE = {"hidden": 16, "batch": 2, "steps": 4, "layers": 2, "bidirectional": True}


@dataclass(frozen=True)
class Plan:
    """How much to run: repetitions and the shapes that ``--smoke`` shrinks."""

    warm: int  # untimed steps of each side before timing
    reps: int  # timed repetitions of each side (the order flips every one)
    steps: int  # steps per repetition (training, LSTM, batch-64 inference; x4 for small batches)
    calls: int  # calls per repetition in the module table
    mod_reps: int  # repetitions in the module table
    image: int  # image side of the model cases
    mod_batch: int  # the module table's batch and spatial size
    mod_hw: int


PLANS = {
    "full": Plan(warm=3, reps=7, steps=5, calls=200, mod_reps=9, image=224, mod_batch=8, mod_hw=28),
    "quick": Plan(warm=2, reps=3, steps=3, calls=50, mod_reps=5, image=224, mod_batch=8, mod_hw=28),
    "smoke": Plan(warm=1, reps=1, steps=1, calls=2, mod_reps=1, image=32, mod_batch=2, mod_hw=8),
}


# ==================================================================================================
# Arguments, selection, reporting (no torch)
# ==================================================================================================
def parse_only(text: str | None) -> tuple[str, ...]:
    """The ``--only`` list: each item a group or a prefix of a case name (ValueError otherwise)."""
    if text is None:
        return GROUPS
    items = tuple(t.strip() for t in text.split(",") if t.strip())
    for t in items:
        if t not in GROUPS and not any(c.startswith(t) for c in CASE_IDS):
            raise ValueError(
                f"unknown --only item {t!r}: expected a group ({', '.join(GROUPS)}) or the "
                f"start of a case name ({', '.join(CASE_IDS)})"
            )
    if not items:
        raise ValueError(f"--only {text!r} names no case")
    return items


def wanted(case: str, only: tuple[str, ...]) -> bool:
    """Whether *case* runs under the ``--only`` items *only*."""
    return any(case.startswith(t) for t in only)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer repetitions (about 4 minutes)")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, one repetition, CPU too")
    p.add_argument("--only", default=None, help="CASE[,CASE]: groups or case-name prefixes")
    p.add_argument("--batch", type=int, default=None, help="training batch (default 64; smoke 2)")
    p.add_argument(
        "--own-resnet50",
        action="store_true",
        help="without torchvision, time bench/torch_resnet50.py's ResNet-50 (the same v1.5\n"
        "architecture) instead of skipping it (--smoke implies it)",
    )
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    try:
        args.only = parse_only(args.only)
    except ValueError as exc:
        p.error(str(exc))
    if args.batch is not None and args.batch < 1:
        p.error(f"--batch must be a positive integer, got {args.batch}")
    if args.batch is None:
        args.batch = 2 if args.smoke else 64
    args.plan = "smoke" if args.smoke else "quick" if args.quick else "full"
    args.own_resnet50 = args.own_resnet50 or args.smoke
    return args


def summary_line(res: dict[str, Any]) -> str:
    """One case's closing line: ``case: torch X ms pycudnn Y ms ratio Z`` (or why it has none)."""
    if "skipped" in res:
        return f"{res['case']}: skipped ({res['skipped']})"
    if "error" in res:
        return f"{res['case']}: error ({res['error']})"
    r = res["ratio"]
    verdict = "met" if r <= TARGET else "missed"
    return (
        f"{res['case']}: torch {res['torch_median_ms']:.2f} ms pycudnn "
        f"{res['pycudnn_median_ms']:.2f} ms ratio {r:.3f} (target <= {TARGET:.2f}: {verdict})"
    )


MODES = (("fwd", "forward, no_grad"), ("fwd_grad", "forward, grad"), ("bwd", "backward"))


def module_table(rows: list[dict[str, Any]]) -> list[str]:
    """The per-module host-cost table: us per call, torch / pycudnn / ratio for each column."""
    head = f"{'module':<28} " + " ".join(f"{t:>24}" for _m, t in MODES)
    out = [head, f"{'':<28} " + " ".join(f"{'torch / pycudnn  ratio':>24}" for _ in MODES)]
    for r in rows:
        cells = []
        for m, _t in MODES:
            c = r[m]
            cells.append(f"{c['torch_us']:7.1f} / {c['pycudnn_us']:7.1f} {c['ratio']:6.2f}")
        note = "" if r["converted"] else f"  (not converted: {r['why']})"
        out.append(f"{r['module']:<28} " + " ".join(f"{c:>24}" for c in cells) + note)
    return out


def modules_summary(rows: list[dict[str, Any]]) -> str:
    """The module table in one line: the median ratio of each column over converted modules."""
    conv = [r for r in rows if r["converted"]]
    if not conv:
        return "modules: no converted module measured"
    meds = [statistics.median(r[m]["ratio"] for r in conv) for m, _t in MODES]
    cols = ", ".join(f"{t} {v:.2f}" for (_m, t), v in zip(MODES, meds, strict=True))
    return f"modules: host us/call pycudnn/torch, median over {len(conv)} converted: {cols}"


# ==================================================================================================
# Models and timing (torch)
# ==================================================================================================
def free(device: Any) -> None:
    """Drop what the last case left behind (its models, its cached memory)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def make_model(arch: str, own: bool) -> tuple[Any, str]:
    """torchvision's *arch* (``weights=None``) and where it came from; without torchvision, with
    *own*, bench/torch_resnet50.py's ResNet-50 (LookupError: no such model here)."""
    try:
        import torchvision
    except ImportError:
        if own and arch == "resnet50":
            return rn.ResNet50(), "bench/torch_resnet50.py (torchvision absent)"
        raise LookupError("torchvision is not installed") from None
    return getattr(torchvision.models, arch)(weights=None), f"torchvision {torchvision.__version__}"


def kernel_times(prof: Any, steps: int) -> dict[str, list[float]]:
    """``{kernel name: [launches, µs]}`` per step of a ``torch.profiler`` run over *steps*."""
    got: dict[str, list[float]] = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time > 0:
            row = got.setdefault(ev.name, [0.0, 0.0])
            row[0] += 1 / steps
            row[1] += ev.device_time / steps
    return got


def profiled_kernels(fn: Callable[[], Any], calls: int) -> dict[str, list[float]]:
    """:func:`kernel_times` of *calls* calls of *fn* under ``torch.profiler`` (CUDA activity),
    the device synchronized before the profile ends."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return kernel_times(prof, calls)


def top_kernels(per: dict[str, list[float]], k: int) -> list[list]:
    """The *k* costliest kernels of :func:`kernel_times`' table as ``[µs, launches, name]``."""
    rows = sorted(per.items(), key=lambda kv: -kv[1][1])[:k]
    return [[round(us, 1), round(c, 2), name[:160]] for name, (c, us) in rows]


def print_top(side: str, rows: list[list]) -> None:
    for us, c, name in rows:
        print(f"  {side:8s} {us:8.1f} us {c:6.2f}x  {name[:100]}")


def image_batch(n: int, side: int, dtype: Any, device: Any) -> Any:
    x = torch.randn(n, 3, side, side, device=device, dtype=dtype)
    return x.contiguous(memory_format=torch.channels_last)


def timed_pair(ref_fn: Callable, mine_fn: Callable, n: int, reps: int, device: Any) -> dict:
    """ms per call of each side: *reps* repetitions of *n* calls, alternating."""
    t_ref, t_mine = alternate_many(
        [lambda: rn.time_calls(ref_fn, n, device), lambda: rn.time_calls(mine_fn, n, device)],
        reps,
    )
    t0, t1 = statistics.median(t_ref), statistics.median(t_mine)
    return {
        "torch_ms": t_ref,
        "pycudnn_ms": t_mine,
        "torch_median_ms": t0,
        "pycudnn_median_ms": t1,
        "ratio": t1 / t0,
        "calls_per_rep": n,
        "reps": reps,
    }


def train_case(arch: str, precision: str, args: argparse.Namespace, device: Any) -> dict:
    """A training step of *arch* in *precision*, torch against converted."""
    plan = PLANS[args.plan]
    torch.manual_seed(0)
    model, source = make_model(arch, args.own_resnet50)
    if precision == "bf16":
        ref, dtype, amp = rn.to_bf16_channels_last(model, device), torch.bfloat16, None
    else:
        ref = model.to(device, memory_format=torch.channels_last)
        dtype, amp = torch.float32, torch.bfloat16
    mine = pt.convert(copy.deepcopy(ref), strict=True)
    x = image_batch(args.batch, plan.image, dtype, device)
    y = torch.randint(0, 1000, (args.batch,), device=device)
    t0 = time.perf_counter()
    for _ in range(plan.warm):
        lr = rn.step(ref, x, y, amp)
        lm = rn.step(mine, x, y, amp)
    rn.sync(device)
    warm = time.perf_counter() - t0
    res = {
        "model": arch,
        "source": source,
        "precision": precision,
        "batch": args.batch,
        "image": plan.image,
        "converted_modules": rn.count_converted(mine),
        "warmup_s": warm,
        "loss_torch": lr.item(),
        "loss_pycudnn": lm.item(),
        "loss_abs_diff": abs(lr.item() - lm.item()),
        **rn.compare_grads(ref, mine, x, y),
    }
    step = rn.step
    res |= timed_pair(
        lambda: step(ref, x, y, amp), lambda: step(mine, x, y, amp), plan.steps, plan.reps, device
    )
    return res


def infer_cases(args: argparse.Namespace, device: Any, cases: list[str]) -> list[dict]:
    """ResNet-50 inference at each batch of *cases* (one model pair for all of them)."""
    plan = PLANS[args.plan]
    torch.manual_seed(0)
    model, source = make_model("resnet50", args.own_resnet50)
    ref = rn.to_bf16_channels_last(model, device).eval()
    mine = pt.convert(copy.deepcopy(ref), strict=True)
    out = []
    for case in cases:
        batch = int(case.rsplit("-b", 1)[1])
        n_img = min(batch, 2) if args.smoke else batch
        x = image_batch(n_img, plan.image, torch.bfloat16, device)
        with torch.no_grad():
            t0 = time.perf_counter()
            for _ in range(plan.warm):
                yr, ym = ref(x), mine(x)
            rn.sync(device)
            res = {
                "case": case,
                "model": "resnet50",
                "source": source,
                "precision": "bf16",
                "batch": n_img,
                "image": plan.image,
                "converted_modules": rn.count_converted(mine),
                "warmup_s": time.perf_counter() - t0,
                "logits_max_rel_diff": rn.rel_diff(ym, yr),
                "top1_agreement": (ym.argmax(1) == yr.argmax(1)).float().mean().item(),
            }
            n = plan.steps * 4 if batch <= 8 else plan.steps
            res |= timed_pair(lambda: ref(x), lambda: mine(x), n, plan.reps, device)  # noqa: B023
        out.append(res)
    return out


def lstm_step(m: Any, x: Any, target: Any) -> Any:
    """Forward, MSE loss, backward to the weights and to *x* (a leaf)."""
    m.zero_grad(set_to_none=True)
    x.grad = None
    out, _state = m(x)
    loss = nn.functional.mse_loss(out, target)
    loss.backward()
    return loss


def lstm_case(args: argparse.Namespace, device: Any) -> dict:
    """The LSTM training step, torch against converted, with torch's TF32 off as bench/ops.py
    had it (pycudnn's ``allow_tf32`` is off by default): both sides compute in float32."""
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        return lstm_measure(args, device) | {"torch_cudnn_tf32": False}
    finally:
        torch.backends.cudnn.allow_tf32 = tf32


def lstm_measure(args: argparse.Namespace, device: Any) -> dict:
    plan = PLANS[args.plan]
    cfg = LSTM_SMOKE if args.smoke else LSTM
    h, dirs = cfg["hidden"], 2 if cfg["bidirectional"] else 1
    torch.manual_seed(0)
    ref = nn.LSTM(h, h, num_layers=cfg["layers"], bidirectional=cfg["bidirectional"]).to(device)
    mine = pt.convert(copy.deepcopy(ref), strict=True)
    x0 = torch.randn(cfg["steps"], cfg["batch"], h, device=device)
    xr, xm = x0.clone().requires_grad_(True), x0.clone().requires_grad_(True)
    target = torch.randn(cfg["steps"], cfg["batch"], dirs * h, device=device)
    t0 = time.perf_counter()
    for _ in range(plan.warm):
        lr, lm = lstm_step(ref, xr, target), lstm_step(mine, xm, target)
    rn.sync(device)
    warm = time.perf_counter() - t0
    g_ref = [xr.grad, *(p.grad for p in ref.parameters())]
    g_mine = [xm.grad, *(p.grad for p in mine.parameters())]
    res = {
        "model": "nn.LSTM",
        **cfg,
        "dtype": "float32",
        "converted_modules": rn.count_converted(mine),
        "warmup_s": warm,
        "loss_torch": lr.item(),
        "loss_pycudnn": lm.item(),
        "loss_abs_diff": abs(lr.item() - lm.item()),
        "grad_rel_l2": rn.rel_l2(g_mine, g_ref),
        "max_rel_grad_diff": max(rn.rel_diff(a, b) for a, b in zip(g_mine, g_ref, strict=True)),
    }
    res |= timed_pair(
        lambda: lstm_step(ref, xr, target),
        lambda: lstm_step(mine, xm, target),
        plan.steps,
        plan.reps,
        device,
    )
    return res


# -- the per-module host-cost table ----------------------------------------------------------------
def module_specs(plan: Plan) -> list[tuple[str, Callable[[], Any], tuple[int, ...], bool]]:
    """(name, factory, input shape, training mode) of each row of the table."""
    n, hw = plan.mod_batch, plan.mod_hw
    return [
        (
            "Conv2d 3x3 64->64",
            lambda: nn.Conv2d(64, 64, 3, padding=1, bias=False),
            (n, 64, hw, hw),
            True,
        ),
        ("Conv2d 1x1 256->64", lambda: nn.Conv2d(256, 64, 1, bias=False), (n, 256, hw, hw), True),
        ("BatchNorm2d(64) train", lambda: nn.BatchNorm2d(64), (n, 64, hw, hw), True),
        ("BatchNorm2d(64) eval", lambda: nn.BatchNorm2d(64), (n, 64, hw, hw), False),
        ("ReLU(inplace=True)", lambda: nn.ReLU(inplace=True), (n, 64, hw, hw), True),
        ("ReLU()", nn.ReLU, (n, 64, hw, hw), True),
        ("MaxPool2d(3, 2, 1)", lambda: nn.MaxPool2d(3, 2, 1), (n, 64, hw, hw), True),
        ("Linear 2048->1000", lambda: nn.Linear(2048, 1000), (n, 2048), True),
    ]


def enqueue_us(fn: Callable[[], object], n: int, device: Any, waits: list[float]) -> float:
    """us per call to enqueue *n* calls of *fn*: the loop's wall time alone, with a
    synchronization before and after it (outside the timed span). The closing synchronization's
    wait goes to *waits* as a fraction of the loop's time: near 0 when the GPU kept up."""
    rn.sync(device)
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    rn.sync(device)
    waits.append((time.perf_counter() - t1) / max(t1 - t0, 1e-12))
    return (t1 - t0) / n * 1e6


def host_column(fns: list[Callable], plan: Plan, device: Any, waits: list[float]) -> dict:
    """One column of a row: the input's preparation alone, torch's module and the converted one
    (each call including the preparation), alternating; us per call, the preparation's median
    subtracted from each side's median."""
    for fn in fns[1:]:  # plans, caches, allocator pools
        fn()
        fn()
    # the preparation's own loop is too short for its closing wait to mean anything
    sinks: list[list[float]] = [[], waits, waits]
    timers = [
        lambda f=f, w=w: enqueue_us(f, plan.calls, device, w)
        for f, w in zip(fns, sinks, strict=True)
    ]
    vals = alternate_many(timers, plan.mod_reps)
    base, t_ref, t_mine = (statistics.median(v) for v in vals)
    ref_us, mine_us = t_ref - base, t_mine - base
    return {
        "torch_us": ref_us,
        "pycudnn_us": mine_us,
        "ratio": mine_us / ref_us,
        "prep_us": base,
        "torch_raw_us": vals[1],
        "pycudnn_raw_us": vals[2],
    }


def module_row(spec: tuple, plan: Plan, device: Any) -> dict:
    """A row of the host-cost table: forward without and with autograd, and backward."""
    name, make, shape, training = spec
    torch.manual_seed(0)
    ref = rn.to_bf16_channels_last(make(), device).train(training)
    mine = copy.deepcopy(ref)
    why = pt.unsupported_reason(mine)
    if why is None:
        pt.convert(mine, strict=True)
    x = torch.randn(shape, device=device, dtype=torch.bfloat16)
    if x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    xg = x.detach().clone().requires_grad_(True)
    # an in-place module needs a fresh tensor each call (a non-leaf one when autograd records)
    inplace = bool(getattr(ref, "inplace", False))
    prep = (lambda: x.clone()) if inplace else (lambda: x)
    prep_g = (lambda: xg.clone()) if inplace else (lambda: xg)
    with torch.no_grad():
        yr, ym = ref(prep()), mine(prep())
        dy = torch.randn_like(yr)
    row: dict[str, Any] = {
        "module": name,
        "converted": why is None,
        "why": why,
        "shape": list(shape),
        "training": training,
        "out_max_rel_diff": rn.rel_diff(ym, yr),
    }

    def fwd(m: Any) -> Callable:
        return lambda: m(prep())

    def fwd_grad(m: Any) -> Callable:
        return lambda: m(prep_g())

    def fwd_bwd(m: Any) -> Callable:
        inputs = (xg, *(p for p in m.parameters() if p.requires_grad))
        return lambda: torch.autograd.grad(m(prep_g()), inputs, dy)

    waits: list[float] = []
    with torch.no_grad():
        row["fwd"] = host_column([prep, fwd(ref), fwd(mine)], plan, device, waits)
    row["fwd_grad"] = host_column([prep_g, fwd_grad(ref), fwd_grad(mine)], plan, device, waits)
    row["fwd_bwd"] = host_column([prep_g, fwd_bwd(ref), fwd_bwd(mine)], plan, device, waits)
    t_ref = row["fwd_bwd"]["torch_us"] - row["fwd_grad"]["torch_us"]
    t_mine = row["fwd_bwd"]["pycudnn_us"] - row["fwd_grad"]["pycudnn_us"]
    row["bwd"] = {"torch_us": t_ref, "pycudnn_us": t_mine, "ratio": t_mine / t_ref}
    row["gpu_wait_max"] = max(waits)  # > ~0.1: the GPU fell behind, host times include waits
    return row


# ==================================================================================================
# The run
# ==================================================================================================
def guarded(cases: list[str], fn: Callable[[], list[dict]], smoke: bool, device: Any) -> list:
    """*fn*'s results, or for each of *cases* why there are none: a skip (LookupError: a model
    that cannot be had here) or the error (re-raised under ``--smoke``, whose purpose is to find
    it); the memory it left is freed either way."""
    print(f"# running {', '.join(cases)}", flush=True)
    try:
        out = fn()
    except LookupError as exc:
        out = [{"case": c, "skipped": str(exc).strip("'\"")} for c in cases]
    except Exception as exc:
        if smoke:
            raise
        out = [{"case": c, "error": f"{type(exc).__name__}: {exc}"[:300]} for c in cases]
    free(device)
    for res in out:
        print(summary_line(res), flush=True)
        if "loss_abs_diff" in res:
            floor = ""
            if "grad_rel_l2_torch_vs_fp32" in res:
                floor = (
                    f" (against a float32 copy: torch {res['grad_rel_l2_torch_vs_fp32']:.2e}, "
                    f"pycudnn {res['grad_rel_l2_pycudnn_vs_fp32']:.2e})"
                )
            print(
                f"#   loss torch {res['loss_torch']:.4f} pycudnn {res['loss_pycudnn']:.4f}; "
                f"gradient relative L2 diff {res['grad_rel_l2']:.2e}{floor}; "
                f"{res['converted_modules']} modules converted; warm-up {res['warmup_s']:.1f} s"
            )
        elif "logits_max_rel_diff" in res:
            print(
                f"#   logits max rel diff {res['logits_max_rel_diff']:.2e}, top-1 agreement "
                f"{res['top1_agreement']:.3f}; warm-up {res['warmup_s']:.1f} s"
            )
    return out


def run_cases(args: argparse.Namespace, device: Any) -> tuple[list[dict], list[dict]]:
    """The selected model cases' results and the module table's rows."""
    results: list[dict] = []
    for arch in ARCHS:
        for prec in PRECISIONS:
            case = f"train-{arch}-{prec}"
            if wanted(case, args.only):

                def one(case: str = case, arch: str = arch, prec: str = prec) -> list[dict]:
                    return [{"case": case, **train_case(arch, prec, args, device)}]

                results += guarded([case], one, args.smoke, device)
    infer = [c for c in CASE_IDS if c.startswith("infer-") and wanted(c, args.only)]
    if infer:
        results += guarded(infer, lambda: infer_cases(args, device, infer), args.smoke, device)
    if wanted("lstm", args.only):

        def lstm() -> list[dict]:
            return [{"case": "lstm", **lstm_case(args, device)}]

        results += guarded(["lstm"], lstm, args.smoke, device)
    rows: list[dict] = []
    if wanted("modules", args.only):
        print("# running the module table", flush=True)
        for spec in module_specs(PLANS[args.plan]):
            try:
                rows.append(module_row(spec, PLANS[args.plan], device))
            except Exception as exc:
                if args.smoke:
                    raise
                rows.append({"module": spec[0], "error": f"{type(exc).__name__}: {exc}"[:300]})
            free(device)
    return results, rows


def describe(args: argparse.Namespace, device: Any) -> dict[str, Any]:
    """The setup: GPU, versions (torch's cuDNN and pycudnn's), the plan."""
    cuda = device.type == "cuda"
    meta: dict[str, Any] = {
        "benchmark": "real models through pycudnn.torch against torch (issue 25)",
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if cuda else "none (CPU tensors)",
        "torch": torch.__version__,
        "torch_cudnn": torch.backends.cudnn.version() if cuda else None,
        "pycudnn": pycudnn.__version__,
        "pycudnn_cudnn": pycudnn.version(raises=False),
        "fused_conv_bias": True,  # dnn_conv(..., bias=) since issue 13
        "algorithms": "heuristics (torch.backends.cudnn.benchmark off, pycudnn's default)",
        "torch_cudnn_tf32": torch.backends.cudnn.allow_tf32,  # the LSTM case turns it off
        "pycudnn_tf32": pycudnn.config.allow_tf32,
        "plan": args.plan,
        **asdict(PLANS[args.plan]),
        "train_batch": args.batch,
        "only": list(args.only),
    }
    try:
        meta["libcudnn"] = str(pycudnn.library_info().path)
    except Exception as exc:
        meta["libcudnn"] = f"unavailable ({type(exc).__name__}: {exc})"[:300]
    return meta


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if torch is None:
        print("torch_models: torch is not installed", file=sys.stderr)
        return 2
    if torch.cuda.is_available():
        device = torch.device("cuda")
    elif args.smoke:
        device = torch.device("cpu")
    else:
        print("torch_models: no CUDA device (--smoke checks the script on CPU)", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    meta = describe(args, device)
    results, rows = run_cases(args, device)
    meta["wall_s"] = time.perf_counter() - t0
    print(
        f"# {meta['gpu']}, torch {meta['torch']} (cuDNN {meta['torch_cudnn']}), pycudnn "
        f"{meta['pycudnn']} on cuDNN {meta['pycudnn_cudnn']} ({meta['libcudnn']}); plan "
        f"{args.plan}; {meta['algorithms']}; {meta['wall_s']:.0f} s"
    )
    if rows:
        print("# host us per call (torch / pycudnn, ratio = pycudnn / torch):")
        good = [r for r in rows if "error" not in r]
        for line in module_table(good):
            print("#   " + line)
        for r in rows:
            if "error" in r:
                print(f"#   {r['module']}: error ({r['error']})")
        waits = [r["gpu_wait_max"] for r in good]
        if device.type == "cuda" and waits and max(waits) > 0.1:
            print(f"#   the GPU fell behind (wait {max(waits):.2f} of a loop): times include it")
    for res in results:
        print(summary_line(res))
    if rows and any("error" not in r for r in rows):
        print(modules_summary([r for r in rows if "error" not in r]))
    out = {"meta": meta, "cases": results, "modules": rows}
    out_env = os.environ.get("OUT")
    for path in filter(None, [args.json, out_env and os.path.join(out_env, "models.json")]):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(out, indent=2) + "\n")
    failed = any("error" in r for r in results) or any("error" in r for r in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
