"""Host cost of one convolution launch, from cuDNN's bare execute up to torch (issue 37, item 4).

Run on the GPU machine from the repository root::

    PYTHONPATH=. python3 bench/launch_floor.py --json OUT.json

It prints one table per case and writes the numbers to ``--json``. Each row is the host time to
*enqueue* one launch of the same convolution: channels-last bfloat16, batch 8, a ResNet-like
3x3 64->64 56x56 layer and a small 1x1 64->64 14x14 one. The rows:

``floor``
    ``cudnnBackendExecute(handle, plan, pack)`` through the bare ctypes prototype
    (:func:`pycudnn.graph._execution.execute_function`), on a variant pack built once: cuDNN's
    own host cost plus one ctypes call, the floor of any Python caller.
``plan.run``
    :meth:`GraphPlan.run`: the variant-pack cache lookup, then the same execute.
``entry``
    The high level's cached call entry launched with pointers read by ``data_ptr()`` each time:
    what a launch program pays per launch (``Call.launch``, :attr:`Call.lean`).
``lean``
    :func:`pycudnn.torch.conv.conv_into`: the adapter's lean path (a key from the tensors, a
    lookup, the bound entry's launch).
``dnn_conv``
    The high-level call ``dnn_conv(x, w, out=y, ...)``, cached.
``execute``
    ``Graph.execute({tx: x, tw: w, ty: y})`` on a built builder graph, repeated: the call bound
    to its signature (docs/graph.md, "Host cost").
``torch``
    ``torch.nn.functional.conv2d(x, w, padding=p)``: torch's per-operation host cost (it
    allocates its output, as it does in a model).

**How it is timed.** The GPU is kept busy so that the queue never drains and no launch waits
for the GPU: before each timed run a spin kernel (``torch.cuda._sleep``) is queued, long enough
to outlast the run (three times the run's unloaded host time plus 2 ms); an event recorded after
it tells whether it finished before the run did, and such a run is repeated with a longer spin
(``drained`` counts them). A run is ``--n`` launches (200) timed with ``time.perf_counter_ns``:
far from CUDA's launch queue limit (about a thousand pending launches, past which an enqueue
blocks). ``--reps`` runs (30) give the median and the interquartile range in microseconds per
launch; the loop's own cost (tens of nanoseconds) is included in every row.

**For whole steps.** :func:`enqueue_time(fn, warm=3, reps=20)` returns the median host time in
seconds of ``fn()`` while the GPU is kept busy the same way: the time to enqueue a model's step,
without the GPU's time. A step that enqueues more than about a thousand launches blocks on
CUDA's queue, and its time then includes that wait; compare such steps in parts.

Self-contained: numpy, torch and pycudnn only (nothing of bench/'s harness). torch is imported
by the functions that time, so the argument parsing and the table need no GPU (the CPU test
``tests/tooling/test_bench_launch_floor.py``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

#: (name, in channels, out channels, height = width, kernel, padding): batch is --batch
CASES = {
    "3x3 64->64 56x56": (64, 64, 56, 3, 1),
    "1x1 64->64 14x14": (64, 64, 14, 1, 0),
}
ROWS = ("floor", "plan.run", "entry", "lean", "dnn_conv", "execute", "torch")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="launch_floor.py",
        description="Host time per convolution launch: cuDNN's bare execute, pycudnn's paths, "
        "torch (GPU kept busy).",
    )
    p.add_argument("--json", metavar="OUT", help="write the results to this JSON file")
    p.add_argument("--n", type=int, default=200, help="launches per timed run (default 200)")
    p.add_argument("--reps", type=int, default=30, help="timed runs per row (default 30)")
    p.add_argument("--batch", type=int, default=8, help="batch size (default 8)")
    p.add_argument(
        "--dtype", choices=("bfloat16", "float16"), default="bfloat16", help="default bfloat16"
    )
    p.add_argument(
        "--case", action="append", choices=sorted(CASES), help="only these cases (repeatable)"
    )
    p.add_argument("--rows", help=f"comma-separated rows to run (default all: {','.join(ROWS)})")
    args = p.parse_args(argv)
    if not 1 <= args.n <= 400:
        p.error("--n must be 1..400 (CUDA's launch queue holds about a thousand launches)")
    if args.reps < 3:
        p.error("--reps must be at least 3")
    rows = ROWS if args.rows is None else tuple(r for r in args.rows.split(",") if r)
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        p.error(f"unknown rows {unknown}; known: {', '.join(ROWS)}")
    args.rows = rows
    args.case = args.case or list(CASES)
    return args


def summarize(samples_us: Sequence[float]) -> dict[str, float]:
    """Median and quartiles of per-launch times (microseconds)."""
    s = sorted(samples_us)
    if len(s) == 1:
        return {"median_us": s[0], "q1_us": s[0], "q3_us": s[0]}
    q1, _, q3 = statistics.quantiles(s, n=4, method="inclusive")
    return {"median_us": statistics.median(s), "q1_us": q1, "q3_us": q3}


def format_table(case: str, rows: dict[str, dict[str, Any]]) -> str:
    """One case's rows as a text table: median, IQR and the ratio to the floor row."""
    floor = rows.get("floor", {}).get("median_us")
    lines = [
        f"{case}",
        f"  {'row':<10} {'us/launch':>10} {'IQR':>14} {'x floor':>8} {'drained':>8}",
    ]
    for name, r in rows.items():
        if "error" in r:
            lines.append(f"  {name:<10} {'n/a':>10}   {r['error'][:60]}")
            continue
        iqr = f"{r['q1_us']:.2f}-{r['q3_us']:.2f}"
        ratio = f"{r['median_us'] / floor:.2f}" if floor else "-"
        lines.append(
            f"  {name:<10} {r['median_us']:>10.2f} {iqr:>14} {ratio:>8} {r.get('drained', 0):>8}"
        )
    return "\n".join(lines)


# -- keeping the GPU busy --------------------------------------------------------------------------
class Busy:
    """Queues a spin kernel (``torch.cuda._sleep``) before each timed run, long enough to outlast
    it, and says whether it did (an event after the spin, queried when the run ends)."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 20_000_000
        torch.cuda._sleep(1000)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        self.cycles_per_us = cycles / max(start.elapsed_time(end) * 1000.0, 1.0)

    def time(self, fn: Callable[[], Any], spin_us: float) -> tuple[int, bool]:
        """``(host ns of fn(), whether the spin ended before fn returned)``; synchronizes after."""
        torch = self.torch
        torch.cuda._sleep(int(spin_us * self.cycles_per_us))
        done = torch.cuda.Event()
        done.record()
        t0 = time.perf_counter_ns()
        fn()
        elapsed = time.perf_counter_ns() - t0
        drained = done.query()
        torch.cuda.synchronize()
        return elapsed, drained


def _timed_runs(busy: Busy, fn: Callable[[], Any], warm: int, reps: int) -> tuple[list[int], int]:
    """Host ns of *reps* busy runs of *fn* (a drained run is repeated with a longer spin, at most
    three times) and the number of drained runs."""
    torch = busy.torch
    unloaded = []
    for _ in range(max(warm, 1)):
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        fn()
        unloaded.append(time.perf_counter_ns() - t0)
        torch.cuda.synchronize()
    spin_us = 3 * min(unloaded) / 1000 + 2000
    times: list[int] = []
    drained = 0
    for _ in range(reps):
        for _attempt in range(4):
            elapsed, gone = busy.time(fn, spin_us)
            if not gone:
                break
            drained += 1
            spin_us *= 2
        times.append(elapsed)
    return times, drained


_BUSY: Busy | None = None


def _busy() -> Busy:
    global _BUSY
    if _BUSY is None:
        import torch

        _BUSY = Busy(torch)
    return _BUSY


def enqueue_time(fn: Callable[[], Any], warm: int = 3, reps: int = 20) -> float:
    """The median host time in seconds of ``fn()`` while the GPU is kept busy (a spin kernel
    queued first, outlasting the call): the time to enqueue *fn*'s work, not to run it.

    *warm* unloaded calls first (binding, caches, the spin's length: three times the fastest of
    them plus 2 ms); the device is synchronized between calls, outside the timing."""
    times, _ = _timed_runs(_busy(), fn, warm, reps)
    return statistics.median(times) / 1e9


def per_launch(op: Callable[[], Any], n: int, reps: int) -> dict[str, Any]:
    """Median and IQR in microseconds per launch of *op*, timed in runs of *n* launches."""

    def run() -> None:
        for _ in range(n):
            op()

    times, drained = _timed_runs(_busy(), run, warm=2, reps=reps)
    out: dict[str, Any] = summarize([t / n / 1000 for t in times])
    out["drained"] = drained
    return out


# -- the operations --------------------------------------------------------------------------------
def make_ops(case: tuple[int, int, int, int, int], batch: int, dtype: str) -> dict[str, Any]:
    """The rows' operations for one convolution (each a no-argument callable), or the error
    that made one unavailable (a string)."""
    import torch
    import torch.nn.functional as F

    from pycudnn.graph import Graph
    from pycudnn.graph._execution import execute_function
    from pycudnn.highlevel import _call, dnn_conv

    c, k, hw, ks, pad = case
    dt = getattr(torch, dtype)
    cl = torch.channels_last
    x = torch.randn(batch, c, hw, hw, device="cuda", dtype=dt).to(memory_format=cl)
    w = (torch.randn(k, c, ks, ks, device="cuda", dtype=dt) / (c * ks * ks) ** 0.5).to(
        memory_format=cl
    )
    y = torch.empty(batch, k, hw, hw, device="cuda", dtype=dt, memory_format=cl)
    stream = torch.cuda.current_stream().cuda_stream
    ops: dict[str, Any] = {}

    # the builder graph: the floor's plan, plan.run and execute
    try:
        g = Graph(io_data_type=dt, name="launch_floor")
        tx, tw = g.tensor_like(x, name="x"), g.tensor_like(w, name="w")
        ty = g.conv_fprop(tx, tw, padding=pad).set_output(True).set_name("y")
        ty.set_stride(tuple(y.stride()))
        g.build()
        g.execute({tx: x, tw: w, ty: y})
        plan = g.plan
        h = plan.handle
        h.set_stream(stream)
        ws = h.workspace(plan.workspace)[0] if plan.workspace else 0
        ptrs, _ = g._pointers({tx: x, tw: w, ty: y})  # the plan's order
        pack = plan.pack(*ptrs, ws)
        execute = execute_function()
        hc, pc = plan.handle_c, plan.plan_c
        rc = execute(hc, pc, pack)
        if rc:
            raise RuntimeError(f"cudnnBackendExecute returned {rc}")
        ops["floor"] = lambda: execute(hc, pc, pack)
        run_args = (*ptrs, ws)
        ops["plan.run"] = lambda: plan.run(*run_args)
        ops["execute"] = lambda: g.execute({tx: x, tw: w, ty: y})
    except Exception as exc:  # a missing engine: the rows say why
        for row in ("floor", "plan.run", "execute"):
            ops[row] = f"{type(exc).__name__}: {exc}"

    opts = {
        "border_mode": (pad, pad),
        "subsample": (1, 1),
        "dilation": (1, 1),
        "conv_mode": "cross",
        "stream": stream,
    }
    try:
        _call.take_last_entry()
        dnn_conv(x, w, out=y, **opts)
        entry = _call.take_last_entry()
        ops["dnn_conv"] = lambda: dnn_conv(x, w, out=y, **opts)
        if entry is None or not entry.lean:
            raise RuntimeError("dnn_conv's entry is not lean")
        ops["entry"] = lambda: entry.launch((x.data_ptr(), w.data_ptr(), y.data_ptr()))
    except Exception as exc:
        ops.setdefault("dnn_conv", f"{type(exc).__name__}: {exc}")
        ops["entry"] = f"{type(exc).__name__}: {exc}"

    try:
        from pycudnn.torch import conv as ptconv

        cfg = (2, (pad, pad), (1, 1), (1, 1), 1)
        ptconv.conv_into(x, w, None, y, cfg)
        ops["lean"] = lambda: ptconv.conv_into(x, w, None, y, cfg)
    except Exception as exc:
        ops["lean"] = f"{type(exc).__name__}: {exc}"

    ops["torch"] = lambda: F.conv2d(x, w, None, 1, pad)
    return ops


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    import torch

    import pycudnn

    if not torch.cuda.is_available():
        sys.exit("launch_floor.py needs a CUDA GPU (torch.cuda.is_available() is False)")
    torch.backends.cudnn.benchmark = False
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cudnn": pycudnn.version(),
        "n": args.n,
        "reps": args.reps,
        "batch": args.batch,
        "dtype": args.dtype,
        "cases": {},
    }
    _busy()
    for name in args.case:
        ops = make_ops(CASES[name], args.batch, args.dtype)
        rows: dict[str, dict[str, Any]] = {}
        for row in args.rows:
            op = ops.get(row)
            if isinstance(op, str):
                rows[row] = {"error": op}
                continue
            try:
                rows[row] = per_launch(op, args.n, args.reps)
            except Exception as exc:
                rows[row] = {"error": f"{type(exc).__name__}: {exc}"}
        result["cases"][name] = rows
        print(format_table(f"{name}, batch {args.batch}, {args.dtype}", rows), flush=True)
    print(f"({result['device']}, torch {result['torch']}, cuDNN {result['cudnn']}; ", end="")
    print(f"{args.reps} runs of {args.n} launches each, GPU kept busy)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
