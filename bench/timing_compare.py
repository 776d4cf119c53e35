"""bench/'s timing against other maintained tools, on the same cases (GPU machine).

Two cases, each timed for pycudnn and for torch by every method:

* **gpu**: a GPU-bound convolution (case 2 of ``bench/cases.py``: ResNet-50's 3x3 at 56², N256,
  bfloat16, channels-last, forward), GPU ms per call;
* **host**: the tiny convolution (1x8x8x8 float32, 3x3, ``out=`` reused), host µs per call.

Methods: bench's (``bench/timing.py``: a ``perf_counter`` loop for host time, repetitions
alternated by ``harness.alternate_many``; nvbench's cold measurement, ``cuda-bench``, for GPU
time); ``torch.utils.benchmark.Timer.blocked_autorange`` (synchronises at each block's edges, so
it times wall per call); pyperf (host time, worker processes, ``bench_time_func``). Each prints
median and IQR (q3 - q1) with the sample count.

The first run (docs/benchmarks/timing-compare.*) also timed bench's former GPU timer, CUDA
events behind a ``torch.cuda._sleep`` spin kernel: nvbench's cold time matched it with a
narrower IQR, so bench/ adopted nvbench and removed that timer.

Run: ``PYTHONPATH=. python3 bench/timing_compare.py`` (pyperf and cuda-bench from carried
wheels when the machine lacks them; see docs/BENCHMARKS.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import Stats, measure_sides

RESULTS: dict[str, Any] = {}


def spread(vals: list[float] | Stats) -> dict[str, float]:
    """Median, IQR (q3 - q1), min, max and count of *vals*."""
    s = vals if isinstance(vals, Stats) else Stats.of(vals)
    return {"median": s.median, "iqr": s.iqr or 0.0, "min": s.min, "max": s.max, "n": s.n}


def show(case: str, method: str, side: str, unit: str, s: dict[str, float]) -> None:
    RESULTS.setdefault(case, {}).setdefault(method, {})[side] = {**s, "unit": unit}
    print(
        f"{case:5} {method:30} {side:8} median {s['median']:10.4f} {unit}  IQR {s['iqr']:8.4f}"
        f"  min {s['min']:10.4f}  max {s['max']:10.4f}  n {int(s['n'])}",
        flush=True,
    )


def setup(case: str) -> tuple[Callable[[], object], Callable[[], object]]:
    """(pycudnn call, torch call) of *case*, warmed up, on torch's current stream."""
    import torch
    import torch.nn.functional as F

    import pycudnn

    stream = torch.cuda.current_stream().cuda_stream
    if case == "gpu":
        cl = torch.channels_last
        x = torch.randn(256, 64, 56, 56, device="cuda", dtype=torch.bfloat16).to(memory_format=cl)
        w = torch.randn(64, 64, 3, 3, device="cuda", dtype=torch.bfloat16).to(memory_format=cl)
        y = torch.empty(256, 64, 56, 56, device="cuda", dtype=torch.bfloat16).to(memory_format=cl)
    else:
        x = torch.randn(1, 8, 8, 8, device="cuda")
        w = torch.randn(8, 8, 3, 3, device="cuda")
        y = torch.empty(1, 8, 8, 8, device="cuda")
    conv = pycudnn.dnn_conv

    def py() -> object:
        return conv(x, w, border_mode=(1, 1), conv_mode="cross", out=y, stream=stream)

    def th() -> object:
        return F.conv2d(x, w, None, 1, 1)

    for _ in range(20):
        py()
        th()
    torch.cuda.synchronize()
    torch.testing.assert_close(y.float(), th().float(), atol=5e-2, rtol=5e-2)
    return py, th


def ours(case: str, fns: dict[str, Callable[[], object]], reps: int, queue: Any | None) -> None:
    """bench's timing (bench/timing.py): host loops alternated now; with *queue*, the GPU time
    of each side queued for the one nvbench run at the end."""
    import torch

    from bench.timing import TorchBackend

    be = TorchBackend(torch, queue)
    names = list(fns)
    sides = measure_sides(
        be,
        list(fns.values()),
        reps=reps,
        host_calls=300 if case == "host" else 30,
        gpu=queue is not None,
        names=[f"{case} {n}" for n in names],
    )
    for n, side in zip(names, sides, strict=True):
        if side.host_us is not None:
            show(case, "bench host loop", n, "us", spread(side.host_us))
    if queue is not None:

        def gpu() -> None:
            for n, side in zip(names, sides, strict=True):
                if side.gpu_ms is None:
                    print(f"{case:5} bench gpu {n}: {side.extra.get('gpu_error')}", flush=True)
                else:
                    show(case, "bench gpu (nvbench cold)", n, "ms", spread(side.gpu_ms))

        queue.then(gpu)


def timer(case: str, fns: dict[str, Callable[[], object]], min_run_time: float) -> None:
    """torch.utils.benchmark.Timer.blocked_autorange: wall per call, synchronised per block."""
    from torch.utils import benchmark

    for n, f in fns.items():
        m = benchmark.Timer(stmt="f()", globals={"f": f}).blocked_autorange(
            min_run_time=min_run_time
        )
        scale = 1e6 if case == "host" else 1e3
        vals = [t * scale for t in m.times]
        s = spread(vals)
        s["iqr"] = m.iqr * scale  # the Measurement's own IQR (same definition)
        show(case, f"torch Timer x{m.number_per_run}", n, "us" if case == "host" else "ms", s)


# -- pyperf: host time in worker processes ---------------------------------------------------------
def pyperf_main() -> None:
    """Run as pyperf's script (``--pyperf-run``): one benchmark per side of the host case."""
    import pyperf

    # the workers run this file in this mode too (pyperf's default would rerun main())
    runner = pyperf.Runner(program_args=(__file__, "--pyperf-run"))
    cache: dict[str, Any] = {}

    def timed(side: str) -> Callable[[int], float]:
        def time_func(loops: int) -> float:
            import torch

            if "fns" not in cache:
                py, th = setup("host")
                cache["fns"] = {"pycudnn": py, "torch": th}
            f = cache["fns"][side]
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(loops):
                f()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            return t1 - t0

        return time_func

    for side in ("pycudnn", "torch"):
        runner.bench_time_func(f"host-{side}", timed(side))


def pyperf_case(processes: int, values: int, loops: int) -> None:
    import pyperf

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "pyperf.json"
        cmd = [sys.executable, __file__, "--pyperf-run", "--copy-env", "-p", str(processes)]
        cmd += ["-n", str(values), "-w", "1", "-l", str(loops), "-q", "-o", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
        if proc.returncode != 0:
            print(f"pyperf failed: {proc.stdout[-800:]}{proc.stderr[-1500:]}", flush=True)
            return
        suite = pyperf.BenchmarkSuite.load(str(out))
        for bench in suite.get_benchmarks():
            vals = [v * 1e6 for v in bench.get_values()]
            side = bench.get_name().removeprefix("host-")
            show("host", f"pyperf p{processes}xn{values}xl{loops}", side, "us", spread(vals))


def main(argv: list[str]) -> int:
    if "--pyperf-run" in argv:
        sys.argv = [sys.argv[0], *[a for a in argv if a != "--pyperf-run"]]
        pyperf_main()
        return 0
    import torch

    from bench.timing import GpuQueue

    t0 = time.time()
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}", flush=True)
    queue = GpuQueue(torch)  # no cuda-bench: NvbenchMissing names the install line
    for case, reps, min_run in (("gpu", 9, 1.0), ("host", 9, 1.0)):
        py, th = setup(case)
        fns = {"pycudnn": py, "torch": th}
        ours(case, fns, reps, queue if case == "gpu" else None)
        timer(case, fns, min_run)
        ours(case, fns, reps, None)  # again after the Timer: drift shows as a change
    try:
        pyperf_case(processes=4, values=5, loops=2000)
    except Exception as exc:
        print(f"pyperf: not measured: {type(exc).__name__}: {exc}", flush=True)
    queue.run()
    out = os.environ.get("OUT")
    if out:
        Path(out, "timing_compare.json").write_text(json.dumps(RESULTS, indent=1))
    print(f"done in {time.time() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
