"""Whole steps in a CUDA graph (issue 38's capture targets): torchvision's ResNet-18/50 (bf16
channels-last, float32 batch norms) captured with ``torch.cuda.graph`` as torch's documentation
says, against ``convert(copy, fuse=True)`` captured the same way, replays timed in the same
process (alternating, medians).

* ``infer-*``: the eval forward (``no_grad``); target <= 0.65x torch's captured model. Each of
  our replays folds batch norm into the convolutions from the parameters of its moment (two
  launches of pycudnn's fold kernels per region), as a captured torch model reads its own.
* ``train-*``: forward, cross-entropy, backward and ``SGD`` (momentum) as one graph; target
  <= 0.75x torch's captured step.

Run on the GPU machine from the repository root::

    PYTHONPATH=. python3 bench/capture.py [--quick] [--only infer,train-resnet18] [--kernels 12]
        [--json out.json]

``--kernels N`` also prints each side's N costliest kernels per replay (name, launches, µs):
where a captured step's GPU time goes. ``--tuned`` lets both sides time their convolution
engines before the capture (``torch.backends.cudnn.benchmark = True``; pycudnn's
``config.algo_fwd = "time_once"``) instead of taking cuDNN's heuristics' first choice.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import pycudnn  # noqa: E402
import pycudnn.torch as pt  # noqa: E402
from bench import torch_models as tm  # noqa: E402
from bench import torch_resnet50 as rn  # noqa: E402

#: (case, model, batch, image side, train)
CASES = (
    ("infer-resnet18-b32", "resnet18", 32, 224, False),
    ("infer-resnet50-b8", "resnet50", 8, 224, False),
    ("infer-resnet50-b64", "resnet50", 64, 224, False),
    ("train-resnet18-b32", "resnet18", 32, 224, True),
    ("train-resnet50-b64", "resnet50", 64, 224, True),
)
TARGET = {False: 0.65, True: 0.75}


def _warm(fn, times: int = 3) -> None:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(times):
            fn()
    torch.cuda.current_stream().wait_stream(s)


def _captured(model: nn.Module, x: torch.Tensor, y: torch.Tensor, train: bool):
    """``(graph, its output, the optimizer)`` of *model*'s step on the static *x* (*y*: the
    labels). The optimizer (training) must outlive the graph: its step reads and writes the
    momentum buffers the warm-up made."""
    if not train:
        with torch.no_grad():
            _warm(lambda: model(x))
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                out = model(x)
        return g, out, None
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        loss = nn.functional.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        return loss

    def warm_step():
        opt.zero_grad(set_to_none=True)
        step()

    _warm(warm_step)
    opt.zero_grad(set_to_none=True)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = step()
    return g, out, opt


def _kernels(g: torch.cuda.CUDAGraph, n: int = 10) -> dict[str, list[float]]:
    """``{kernel name: [launches, µs]}`` per replay of *g*."""
    return tm.profiled_kernels(g.replay, n)


def run_case(case: tuple, quick: bool, device: torch.device, top: int = 0) -> dict:
    name, arch, batch, side, train = case
    torch.manual_seed(0)
    model, source = tm.make_model(arch, own=False)
    ref = rn.to_bf16_channels_last(model, device).train(train)
    mine = pt.convert(copy.deepcopy(ref), fuse=True).train(train)
    x = tm.image_batch(batch, side, torch.bfloat16, device)
    y = torch.randint(0, 1000, (batch,), device=device)
    t0 = time.perf_counter()
    g_ref, out_ref, opt_ref = _captured(ref, x, y, train)
    g_mine, out_mine, opt_mine = _captured(mine, x, y, train)
    capture_s = time.perf_counter() - t0
    g_ref.replay()
    g_mine.replay()
    torch.cuda.synchronize()
    res = {"case": name, "model": arch, "source": source, "batch": batch, "image": side,
           "train": train, "capture_s": capture_s}  # fmt: skip
    if train:  # the same data and start: the first replay's losses agree
        res["loss_torch"], res["loss_pycudnn"] = float(out_ref), float(out_mine)
    else:
        a, b = out_ref.float(), out_mine.float()
        res["logits_max_rel_diff"] = float((a - b).abs().max() / a.abs().max())
        res["top1_agreement"] = float((a.argmax(1) == b.argmax(1)).float().mean())
    n, reps = (20, 5) if quick else (50, 9)
    res |= tm.timed_pair(g_ref.replay, g_mine.replay, n, reps, device)
    res["target"] = TARGET[train]
    for side, g in (("torch", g_ref), ("pycudnn", g_mine)):
        per = _kernels(g)
        res[f"kernels_us_{side}"] = sum(us for _, us in per.values())
        res[f"launches_{side}"] = sum(c for c, _ in per.values())
        if top:
            res[f"top_kernels_{side}"] = tm.top_kernels(per, top)
    res["fold_kernels_us_pycudnn"] = sum(us for k, (_, us) in per.items() if k.startswith("fold_"))
    del g_ref, g_mine, out_ref, out_mine, ref, mine, opt_ref, opt_mine
    tm.free(device)
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--only", default="", help="case-name prefixes, comma-separated")
    p.add_argument("--kernels", type=int, default=0, help="print each side's N costliest kernels")
    p.add_argument("--tuned", action="store_true", help="both sides time their conv engines")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    if args.tuned:
        torch.backends.cudnn.benchmark = True
        pycudnn.config.algo_fwd = "time_once"
    only = tuple(s.strip() for s in args.only.split(",") if s.strip())
    for o in only:
        if not any(c[0].startswith(o) for c in CASES):
            p.error(f"--only: no case starts with {o!r} (cases: {', '.join(c[0] for c in CASES)})")
    device = torch.device("cuda")
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "torch_cudnn": torch.backends.cudnn.version(), "quick": args.quick,
            "tuned": args.tuned}  # fmt: skip
    print(f"# {meta['gpu']}, torch {meta['torch']} (cuDNN {meta['torch_cudnn']})")
    results = []
    for case in CASES:
        if only and not any(case[0].startswith(o) for o in only):
            continue
        r = run_case(case, args.quick, device, args.kernels)
        results.append(r)
        check = (
            f"losses {r['loss_torch']:.4f} / {r['loss_pycudnn']:.4f}"
            if r["train"]
            else f"logits rel {r['logits_max_rel_diff']:.1e} top1 {r['top1_agreement']:.2f}"
        )
        verdict = "met" if r["ratio"] <= r["target"] else "missed"
        print(f"{r['case']}: torch {r['torch_median_ms']:.3f} ms pycudnn "
              f"{r['pycudnn_median_ms']:.3f} ms ratio {r['ratio']:.3f} (target <= "
              f"{r['target']:.2f}: {verdict}) {check}; kernels per replay "
              f"{r['kernels_us_torch']:.0f} / {r['kernels_us_pycudnn']:.0f} us in "
              f"{r['launches_torch']:.0f} / {r['launches_pycudnn']:.0f} launches (folds "
              f"{r['fold_kernels_us_pycudnn']:.0f})", flush=True)  # fmt: skip
        for side in ("torch", "pycudnn") if args.kernels else ():
            tm.print_top(side, r[f"top_kernels_{side}"])
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "cases": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
