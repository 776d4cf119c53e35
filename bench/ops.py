"""pycudnn vs PyTorch on the operations other than convolution (pooling, batch norm, softmax,
activations, tensor arithmetic, RNNs): GPU time, bandwidth, host time per call.

Run on the GPU machine from the repository root::

    PYTHONPATH=. python3 bench/ops.py [--only pool,bn,...] [--quick] [--json FILE]

Each case builds its inputs once, checks that pycudnn's result equals torch's (relative max
error printed), then times both as ``bench/timing.py`` does: host microseconds per call
(back-to-back calls, no synchronisation, the two libraries alternating) now, and GPU
milliseconds per call (median and IQR of nvbench's cold measurement, ``cuda-bench``) for every
case in one nvbench run at the end. Both use torch's current stream and the same libcudnn. GB/s
counts the bytes each call must read and write once (inputs + outputs); % is of the datasheet
memory bandwidth.

Host-time cases (``host-*``) are tiny (1x8x8x8 fp32): they measure the per-call overhead, with
a new output each call (what torch's functional API does) and, for pycudnn, also with ``out=``.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import GpuPeaks, SideResult, measure_pair, peaks_for, ratio  # noqa: E402
from bench.timing import GpuQueue, NvbenchMissing, TorchBackend  # noqa: E402


def log(msg: str) -> None:
    print(f"[ops {time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass
class OpCase:
    """One comparison: ``make(torch)`` returns ``(pycudnn_fn, torch_fn, bytes, check)`` where
    ``check()`` returns ``(mine, theirs)`` tensors to compare."""

    id: str
    group: str
    title: str
    make: Callable[[Any], tuple[Callable[[], object], Callable[[], object], int, Callable]]
    host: bool = False  # a host-overhead case (tiny shapes)
    tol: float = 1e-2


def _dt(torch: Any, name: str) -> Any:
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def _x(torch: Any, shape, dt: str, cl: bool = False):
    t = torch.randn(*shape, device="cuda", dtype=_dt(torch, dt))
    if cl:
        t = t.contiguous(memory_format=torch.channels_last)
    return t


def _nbytes(*ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


# -- case builders ------------------------------------------------------------------------------
def pool_case(shape, dt, cl, k, s, p, mode, direction):
    def make(torch):
        import pycudnn

        F = torch.nn.functional
        x = _x(torch, shape, dt, cl)
        pmode = "max" if mode == "max" else "average_inc_pad"
        if mode == "max":
            y_t = F.max_pool2d(x, k, s, p)
        else:
            y_t = F.avg_pool2d(x, k, s, p, count_include_pad=True)
        if direction == "fwd":

            def py():
                return pycudnn.dnn_pool(x, (k, k), (s, s), pmode, (p, p))

            def th():
                if mode == "max":
                    return F.max_pool2d(x, k, s, p)
                return F.avg_pool2d(x, k, s, p, count_include_pad=True)

            return py, th, _nbytes(x, y_t), lambda: (torch.from_dlpack(py()), th())
        xr = x.detach().requires_grad_(True)
        yr = F.max_pool2d(xr, k, s, p) if mode == "max" else F.avg_pool2d(xr, k, s, p)
        dy = torch.randn_like(yr)
        y = yr.detach()

        def py():
            return pycudnn.dnn_pool_grad(x, y, dy, (k, k), (s, s), pmode, (p, p))

        def th():
            return torch.autograd.grad(yr, xr, dy, retain_graph=True)[0]

        return py, th, _nbytes(x, y, dy, x), lambda: (torch.from_dlpack(py()), th())

    return make


def bn_case(shape, dt, cl, direction):
    def make(torch):
        import pycudnn

        F = torch.nn.functional
        x = _x(torch, shape, dt, cl)
        c = shape[1]
        w = torch.rand(c, device="cuda") + 0.5
        b = torch.randn(c, device="cuda")
        rm, rv = torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")
        w4, b4, rm4, rv4 = (t.view(1, c, 1, 1) for t in (w, b, rm, rv))
        eps = 1e-5
        if direction == "train":

            def py():
                return pycudnn.dnn_batch_normalization_train(
                    x, w4, b4, "spatial", eps, 0.1, rm4, rv4, inplace_running=True
                )[0]

            def th():
                return F.batch_norm(x, rm, rv, w, b, True, 0.1, eps)

            return py, th, _nbytes(x, x), lambda: (torch.from_dlpack(py()), th())
        if direction == "test":

            def py():
                return pycudnn.dnn_batch_normalization_test(x, w4, b4, rm4, rv4, "spatial", eps)

            def th():
                return F.batch_norm(x, rm, rv, w, b, False, 0.1, eps)

            return py, th, _nbytes(x, x), lambda: (torch.from_dlpack(py()), th())
        # backward: torch's autograd of batch_norm in training mode vs dnn_batch_normalization_grad
        xr = x.detach().requires_grad_(True)
        wr = w.detach().requires_grad_(True)
        br = b.detach().requires_grad_(True)
        yr = F.batch_norm(xr, None, None, wr, br, True, 0.1, eps)
        dy = torch.randn_like(yr)
        _y, mean, invstd = pycudnn.dnn_batch_normalization_train(x, w4, b4, "spatial", eps)

        def py():
            return pycudnn.dnn_batch_normalization_grad(x, dy, w4, mean, invstd, "spatial", eps)[0]

        def th():
            return torch.autograd.grad(yr, (xr, wr, br), dy, retain_graph=True)[0]

        return py, th, _nbytes(x, dy, x), lambda: (torch.from_dlpack(py()), th())

    return make


def softmax_case(shape, dt, log_):
    def make(torch):
        import pycudnn

        x = _x(torch, shape, dt)
        algo = "log" if log_ else "accurate"

        def py():
            return pycudnn.dnn_softmax(x, algo, "channel")

        def th():
            return torch.log_softmax(x, 1) if log_ else torch.softmax(x, 1)

        return py, th, _nbytes(x, x), lambda: (torch.from_dlpack(py()), th())

    return make


def softmax_grad_case(shape, dt):
    def make(torch):
        import pycudnn

        x = _x(torch, shape, dt).requires_grad_(True)
        y = torch.softmax(x, 1)
        dy = torch.randn_like(y)
        yd = y.detach()

        def py():
            return pycudnn.dnn_softmax_grad(dy, yd)

        def th():
            return torch._softmax_backward_data(dy, yd, 1, x.dtype)

        return py, th, _nbytes(dy, yd, dy), lambda: (torch.from_dlpack(py()), th())

    return make


def act_case(shape, dt, cl, mode):
    def make(torch):
        import pycudnn

        F = torch.nn.functional
        x = _x(torch, shape, dt, cl)
        tf = {"relu": F.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh}[mode]

        def py():
            return pycudnn.dnn_activation(x, mode)

        def th():
            return tf(x)

        return py, th, _nbytes(x, x), lambda: (torch.from_dlpack(py()), th())

    return make


def rnn_case(mode, dt, hidden, batch, steps, layers, bidir, backward):
    """An RNN of torch.nn (cuDNN inside) against RNNBlock with the same weights (from_torch)."""

    def make(torch):
        import pycudnn

        cls = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[mode]
        net = cls(hidden, hidden, num_layers=layers, bidirectional=bidir).cuda().to(_dt(torch, dt))
        dirs = 2 if bidir else 1
        x = _x(torch, (steps, batch, hidden), dt)
        h0 = torch.zeros(layers * dirs, batch, hidden, device="cuda", dtype=x.dtype)
        c0 = h0.clone() if mode == "lstm" else None
        rnn = pycudnn.RNNBlock(
            dt.replace("fp", "float"),
            hidden,
            layers,
            mode,
            direction_mode="bidirectional" if bidir else "unidirectional",
        )
        w = rnn.from_torch(net, hidden)
        state = (h0, c0) if mode == "lstm" else h0
        if not backward:

            def py():
                return rnn.apply(w, x, h0, c0)[0]

            def th():
                with torch.no_grad():
                    return net(x, state)[0]

            return py, th, 0, lambda: (torch.from_dlpack(py()), th())
        xr = x.detach().requires_grad_(True)
        dy = torch.randn(steps, batch, dirs * hidden, device="cuda", dtype=x.dtype)

        def py():
            y = rnn.apply(w, x, h0, c0, training=True)[0]
            return rnn.backward(w, x, h0, c0, y, dy)[0]

        def th():
            y = net(xr, state)[0]
            return torch.autograd.grad(y, (xr, *net.parameters()), dy)[0]

        return py, th, 0, lambda: (torch.from_dlpack(py()), th())

    return make


def host_case(kind):
    """Tiny fp32 (1, 8, 8, 8): per-call host overhead, new outputs each call."""

    def make(torch):
        import pycudnn

        F = torch.nn.functional
        x = torch.randn(1, 8, 8, 8, device="cuda")
        c = torch.ones(1, 8, 1, 1, device="cuda")
        w4, b4 = c * 1.5, c * 0.5
        rm4, rv4 = torch.zeros(1, 8, 1, 1, device="cuda"), torch.ones(1, 8, 1, 1, device="cuda")
        w, b, rm, rv = (t.view(8) for t in (w4, b4, rm4, rv4))
        table = {
            "pool": (lambda: pycudnn.dnn_pool(x, (2, 2), (2, 2)), lambda: F.max_pool2d(x, 2, 2)),
            "softmax": (lambda: pycudnn.dnn_softmax(x), lambda: torch.softmax(x, 1)),
            "relu": (lambda: pycudnn.dnn_activation(x, "relu"), lambda: torch.relu(x)),
            "bn_test": (
                lambda: pycudnn.dnn_batch_normalization_test(x, w4, b4, rm4, rv4, "spatial", 1e-5),
                lambda: F.batch_norm(x, rm, rv, w, b, False, 0.1, 1e-5),
            ),
            "bn_train": (
                lambda: pycudnn.dnn_batch_normalization_train(
                    x, w4, b4, "spatial", 1e-5, 0.1, rm4, rv4, inplace_running=True
                )[0],
                lambda: F.batch_norm(x, rm, rv, w, b, True, 0.1, 1e-5),
            ),
            "add_bias": (
                lambda: pycudnn.dnn_add_tensor(c, x, beta=1.0),
                lambda: x.add_(c),
            ),
        }
        y = torch.empty(1, 8, 8, 8, device="cuda")
        yp = torch.empty(1, 8, 4, 4, device="cuda")
        table.update(
            {  # pycudnn writing into a given out= (torch's functional calls allocate)
                "pool_out": (
                    lambda: pycudnn.dnn_pool(x, (2, 2), (2, 2), out=yp),
                    lambda: F.max_pool2d(x, 2, 2),
                ),
                "softmax_out": (lambda: pycudnn.dnn_softmax(x, out=y), lambda: torch.softmax(x, 1)),
                "relu_out": (
                    lambda: pycudnn.dnn_activation(x, "relu", out=y),
                    lambda: torch.relu(x),
                ),
                "bn_test_out": (
                    lambda: pycudnn.dnn_batch_normalization_test(
                        x, w4, b4, rm4, rv4, "spatial", 1e-5, out=y
                    ),
                    lambda: F.batch_norm(x, rm, rv, w, b, False, 0.1, 1e-5),
                ),
            }
        )
        py, th = table[kind]

        def check():
            mine = py()
            mine = x if kind == "add_bias" else mine
            return torch.from_dlpack(mine) if not isinstance(mine, torch.Tensor) else mine, th()

        return py, th, 0, check

    return make


RN50 = (64, 256, 56, 56)
CASES: list[OpCase] = (
    [
        OpCase(
            "pool-max-fwd",
            "pool",
            "maxpool 3x3/2 (64,64,112,112) bf16 NHWC",
            pool_case((64, 64, 112, 112), "bf16", True, 3, 2, 1, "max", "fwd"),
        ),
        OpCase(
            "pool-max-bwd",
            "pool",
            "maxpool 3x3/2 bwd (64,64,112,112) bf16 NHWC",
            pool_case((64, 64, 112, 112), "bf16", True, 3, 2, 1, "max", "bwd"),
        ),
        OpCase(
            "pool-avg-fwd",
            "pool",
            "avgpool 2x2/2 (64,256,56,56) fp16 NHWC",
            pool_case(RN50, "fp16", True, 2, 2, 0, "avg", "fwd"),
        ),
        OpCase(
            "pool-max-fp32",
            "pool",
            "maxpool 2x2/2 (64,256,56,56) fp32 NCHW",
            pool_case(RN50, "fp32", False, 2, 2, 0, "max", "fwd"),
        ),
        OpCase(
            "bn-train-bf16",
            "bn",
            "BN train spatial (64,256,56,56) bf16 NHWC",
            bn_case(RN50, "bf16", True, "train"),
        ),
        OpCase(
            "bn-test-bf16",
            "bn",
            "BN test spatial (64,256,56,56) bf16 NHWC",
            bn_case(RN50, "bf16", True, "test"),
        ),
        OpCase(
            "bn-bwd-bf16",
            "bn",
            "BN backward spatial (64,256,56,56) bf16 NHWC",
            bn_case(RN50, "bf16", True, "bwd"),
        ),
        OpCase(
            "bn-train-fp32",
            "bn",
            "BN train spatial (64,64,112,112) fp32 NCHW",
            bn_case((64, 64, 112, 112), "fp32", False, "train"),
            tol=1e-4,
        ),
        OpCase(
            "bn-bwd-fp16",
            "bn",
            "BN backward spatial (32,512,28,28) fp16 NHWC",
            bn_case((32, 512, 28, 28), "fp16", True, "bwd"),
        ),
        OpCase(
            "softmax-attn",
            "softmax",
            "softmax rows (32768,512) fp16 (attention scores)",
            softmax_case((32768, 512), "fp16", False),
        ),
        OpCase(
            "softmax-attn-bf16",
            "softmax",
            "softmax rows (32768,1024) bf16",
            softmax_case((32768, 1024), "bf16", False),
        ),
        OpCase(
            "logsoftmax-vocab",
            "softmax",
            "log-softmax (4096,32000) fp32 (LM head)",
            softmax_case((4096, 32000), "fp32", True),
            tol=1e-4,
        ),
        OpCase(
            "softmax-bwd",
            "softmax",
            "softmax backward (32768,512) fp16",
            softmax_grad_case((32768, 512), "fp16"),
        ),
        OpCase(
            "relu-bf16",
            "act",
            "relu (64,256,56,56) bf16 NHWC",
            act_case(RN50, "bf16", True, "relu"),
        ),
        OpCase(
            "sigmoid-fp32",
            "act",
            "sigmoid (64,256,56,56) fp32",
            act_case(RN50, "fp32", False, "sigmoid"),
            tol=1e-5,
        ),
    ]
    + [
        OpCase(
            "lstm-h1024-fwd",
            "rnn",
            "LSTM H1024 N64 T25 fp16 fwd",
            rnn_case("lstm", "fp16", 1024, 64, 25, 1, False, False),
            tol=3e-2,
        ),
        OpCase(
            "lstm-h1024-fwdbwd",
            "rnn",
            "LSTM H1024 N64 T25 fp16 fwd+bwd (dx)",
            rnn_case("lstm", "fp16", 1024, 64, 25, 1, False, True),
            tol=3e-2,
        ),
        OpCase(
            "gru-h2816",
            "rnn",
            "GRU H2816 N32 T187 fp16 fwd (DeepBench)",
            rnn_case("gru", "fp16", 2816, 32, 187, 1, False, False),
            tol=3e-2,
        ),
        OpCase(
            "blstm-h512-fp32",
            "rnn",
            "2-layer bidirectional LSTM H512 N32 T50 fp32 fwd+bwd (dx)",
            rnn_case("lstm", "fp32", 512, 32, 50, 2, True, True),
            tol=1e-4,
        ),
    ]
    + [
        OpCase(f"host-{k}", "host", f"host: {k} (1,8,8,8) fp32", host_case(k), host=True, tol=1e-4)
        for k in (
            "pool",
            "softmax",
            "relu",
            "bn_test",
            "bn_train",
            "add_bias",
            "pool_out",
            "softmax_out",
            "relu_out",
            "bn_test_out",
        )
    ]
)


def run(only: set[str] | None, quick: bool) -> dict[str, Any]:
    import torch

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    import pycudnn

    queue = GpuQueue(torch, quick=quick)
    backend = TorchBackend(torch, queue)
    gpu = torch.cuda.get_device_name()
    peaks, how = peaks_for(gpu)
    meta = {
        "gpu_timer": queue.info,
        "gpu": gpu,
        "peaks": how,
        "mem_tbs": peaks.mem_tbs,
        "torch": torch.__version__,
        "cudnn_torch": torch.backends.cudnn.version(),
        "cudnn_pycudnn": pycudnn.version(raises=False),
        "libcudnn": pycudnn.library_info().path,
    }
    log(f"{gpu}; torch {torch.__version__}; cuDNN {meta['cudnn_pycudnn']}")
    items = []
    for case in CASES:
        if only and case.group not in only and case.id not in only:
            continue
        item: dict[str, Any] = {"id": case.id, "group": case.group, "title": case.title}
        try:
            py, th, nbytes, check = case.make(torch)
            for _ in range(3):
                py()
                th()
            mine, theirs = check()
            torch.cuda.synchronize()
            diff = (mine.double() - theirs.double()).abs().max().item()
            scale = max(theirs.double().abs().max().item(), 1.0)
            item["relerr"] = diff / scale
            item["match"] = bool(diff / scale <= case.tol) and not math.isnan(diff)
            a, b = measure_pair(
                backend,
                py,
                th,
                reps=3 if quick else 7,
                host_calls=50 if case.host else 20,
                gpu=not case.host,
                names=(f"{case.id} pycudnn", f"{case.id} torch"),
            )
            item["pycudnn"] = {"host_us": a.host_us.median}
            item["torch"] = {"host_us": b.host_us.median}
            item["host_ratio"] = ratio(a.host_us.median, b.host_us.median)
            if case.host:
                log(_line(item))
            else:
                queue.then(functools.partial(_gpu_numbers, item, a, b, nbytes, peaks))
        except Exception as exc:  # one failing case must not hide the others
            item["error"] = f"{type(exc).__name__}: {exc}"
            log(f"{case.id}: ERROR {item['error']}")
        items.append(item)
    log(f"GPU time of {len(queue.jobs)} calls: {queue.info['tool']}")
    queue.run()
    return {"meta": meta, "items": items}


def _gpu_numbers(
    item: dict[str, Any], a: SideResult, b: SideResult, nbytes: int, peaks: GpuPeaks
) -> None:
    """An item's GPU numbers once the queue ran: median and IQR per side, ratio, GB/s."""
    if a.gpu_ms is None or b.gpu_ms is None:
        why = a.extra.get("gpu_error") or b.extra.get("gpu_error")
        item["error"] = f"no GPU time: {why}"
        log(f"{item['id']}: ERROR {item['error']}")
        return
    for side, r in (("pycudnn", a), ("torch", b)):
        item[side]["gpu_ms"] = r.gpu_ms.median
        item[side]["gpu_iqr_ms"] = r.gpu_ms.iqr
        if nbytes:
            gbs = nbytes / (r.gpu_ms.median * 1e-3) / 1e9
            item[side]["GBs"] = gbs
            item[side]["pct_bw"] = 100 * gbs / (peaks.mem_tbs * 1e3)
    item["gpu_ratio"] = ratio(a.gpu_ms.median, b.gpu_ms.median)
    log(_line(item))


def _line(it: dict[str, Any]) -> str:
    p, t = it.get("pycudnn", {}), it.get("torch", {})
    head = f"{it['id']:<20} err {it.get('relerr', float('nan')):.1e}"
    host = f"host {p.get('host_us', 0):6.2f} vs {t.get('host_us', 0):6.2f} us"
    if "gpu_ratio" not in it:
        return f"{head}  {host} (x{it.get('host_ratio') or float('nan'):.2f})"
    bw = f", {p['GBs']:.0f} GB/s {p['pct_bw']:.0f}%" if "GBs" in p else ""
    return (
        f"{head}  gpu {p['gpu_ms']:.4f} (IQR {p['gpu_iqr_ms']:.4f}) vs {t['gpu_ms']:.4f} "
        f"(IQR {t['gpu_iqr_ms']:.4f}) ms (x{it['gpu_ratio']:.3f}){bw}  {host}"
    )


def summary(res: dict[str, Any]) -> list[str]:
    """The target lines: per group, the GPU-time median and worst ratio; the tiny cases' host
    ratios; how many results equal torch's."""
    items = [i for i in res["items"] if "error" not in i]
    lines = []
    for group in dict.fromkeys(i["group"] for i in items if i.get("gpu_ratio")):
        rows = [i for i in items if i["group"] == group and i.get("gpu_ratio")]
        ratios = sorted(i["gpu_ratio"] for i in rows)
        mid = len(ratios) // 2
        med = ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2
        worst = max(rows, key=lambda i: i["gpu_ratio"])
        hosts = ", ".join(f"{i['id']} x{i['host_ratio']:.2f}" for i in rows)
        lines.append(
            f"ops {group}: GPU-time ratio pycudnn/torch median {med:.3f} over {len(rows)} "
            f"(target <= 1.00), worst {worst['gpu_ratio']:.3f} ({worst['id']}; target <= 1.05); "
            f"host ratio {hosts}"
        )
    for i in (i for i in items if i["group"] == "host"):
        lines.append(
            f"ops host {i['id']}: {i['pycudnn']['host_us']:.2f} vs {i['torch']['host_us']:.2f} "
            f"us (x{i['host_ratio']:.2f}; target <= 1.00)"
        )
    bad = [i["id"] for i in res["items"] if "error" in i or not i.get("match", False)]
    lines.append(
        f"ops results equal to torch: {len(res['items']) - len(bad)}/{len(res['items'])}"
        + (f" (not: {', '.join(bad)})" if bad else "")
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--only", default=None, help="comma list of groups or case ids")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", default=None, help="write the results here (also $OUT/ops.json)")
    args = p.parse_args(argv)
    only = set(args.only.split(",")) if args.only else None
    try:
        res = run(only, args.quick)
    except NvbenchMissing as exc:
        print(f"[ops] {exc}", file=sys.stderr, flush=True)
        return 2
    res["summary"] = summary(res)
    text = json.dumps(res, indent=1)
    for path in filter(
        None, (args.json, os.environ.get("OUT") and f"{os.environ['OUT']}/ops.json")
    ):
        Path(path).write_text(text)
    print("\n".join(res["summary"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
