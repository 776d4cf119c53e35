"""bench/'s own timing loops against maintained tools, on the same cases (GPU machine).

Two cases, each timed for pycudnn and for torch by every method:

* **gpu**: a GPU-bound convolution (case 2 of ``bench/cases.py``: ResNet-50's 3x3 at 56², N256,
  bfloat16, channels-last, forward), GPU ms per call;
* **host**: the tiny convolution (1x8x8x8 float32, 3x3, ``out=`` reused), host µs per call.

Methods: bench's own (``runner.TorchBackend``: CUDA events behind a spin kernel for GPU time, a
``perf_counter`` loop for host time, repetitions alternated by ``harness.alternate_many``);
``torch.utils.benchmark.Timer.blocked_autorange`` (synchronises at each block's edges, so it
times wall per call); pyperf (host time, worker processes, ``bench_time_func``); NVIDIA's
nvbench bindings (``cuda-bench``: its batched GPU time and its cold GPU time) when importable.
Each prints median and IQR (q3 - q1) with the sample count.

Run: ``PYTHONPATH=. python3 bench/timing_compare.py`` (pyperf and cuda-bench from carried
wheels when the machine lacks them; see docs/BENCHMARKS.md).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import alternate_many

RESULTS: dict[str, Any] = {}


def spread(vals: list[float]) -> dict[str, float]:
    """Median, IQR (q3 - q1), min, max and count of *vals*."""
    q = statistics.quantiles(vals, n=4, method="inclusive") if len(vals) > 1 else [vals[0]] * 3
    return {
        "median": statistics.median(vals),
        "iqr": q[2] - q[0],
        "min": min(vals),
        "max": max(vals),
        "n": len(vals),
    }


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


def ours(case: str, fns: dict[str, Callable[[], object]], reps: int) -> None:
    """bench's own loops: runner.TorchBackend, alternated repetitions."""
    import torch

    from bench.harness import calls_for
    from bench.runner import TorchBackend

    be = TorchBackend(torch)
    names = list(fns)
    host_calls = 300 if case == "host" else 30
    host = alternate_many(
        [lambda f=fns[n]: be.host_us_per_call(f, host_calls) for n in names], reps
    )
    for n, vals in zip(names, host, strict=True):
        show(case, "bench TorchBackend host", n, "us", spread(vals))
    hint = max(statistics.median(v) for v in host)
    calls = calls_for(max(be.gpu_ms_per_call(fns[n], 3, hint) for n in names), 3.0, hi=200)
    dev = alternate_many([lambda f=fns[n]: be.gpu_ms_per_call(f, calls, hint) for n in names], reps)
    for n, vals in zip(names, dev, strict=True):
        show(case, f"bench TorchBackend gpu x{calls}", n, "ms", spread(vals))


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


# -- cuda-bench (nvbench): GPU time on its own stream ----------------------------------------------
def nvbench_case(case: str, fns_on_stream: dict[str, Callable[[Any], object]]) -> None:
    import cuda.bench as nvb
    import torch

    for side, fn in fns_on_stream.items():

        def bench(state: Any, fn: Callable[[Any], object] = fn) -> None:
            def launch(lch: Any) -> None:
                s = torch.cuda.ExternalStream(lch.get_stream().addressof())
                with torch.cuda.stream(s):
                    fn(s)

            state.exec(launch)

        nvb.register(bench).set_name(f"{case}-{side}")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "nvbench.json"
        argv = ["nvbench", "--json", str(out), "--timeout", "4", "--quiet"]
        try:
            nvb.run_all_benchmarks(argv)
        except SystemExit:
            pass
        data = json.loads(out.read_text())
    for b in data.get("benchmarks", []):
        for st in b.get("states", []):
            for summ in st.get("summaries", []):
                tag = summ.get("tag", "")
                if "time" not in tag and "sample_size" not in tag:
                    continue
                vals = {d.get("name"): d.get("value") for d in summ.get("data", [])}
                print(f"{case:5} cuda-bench {b.get('name'):12} {tag:40} {vals}", flush=True)
                RESULTS.setdefault(case, {}).setdefault("cuda-bench", {}).setdefault(
                    b.get("name"), {}
                )[tag] = vals


def on_stream(case: str) -> dict[str, Callable[[Any], object]]:
    """The case's two calls, issued on the stream nvbench gives."""
    import torch
    import torch.nn.functional as F

    import pycudnn

    setup(case)  # warm (plans cached) and checked
    x = torch.randn(256, 64, 56, 56, device="cuda", dtype=torch.bfloat16)
    x = x.to(memory_format=torch.channels_last)
    w = torch.randn(64, 64, 3, 3, device="cuda", dtype=torch.bfloat16)
    w = w.to(memory_format=torch.channels_last)
    y = torch.empty_like(x)
    return {
        "pycudnn": lambda s: pycudnn.dnn_conv(
            x, w, border_mode=(1, 1), conv_mode="cross", out=y, stream=s.cuda_stream
        ),
        "torch": lambda s: F.conv2d(x, w, None, 1, 1),
    }


def main(argv: list[str]) -> int:
    if "--pyperf-run" in argv:
        sys.argv = [sys.argv[0], *[a for a in argv if a != "--pyperf-run"]]
        pyperf_main()
        return 0
    import torch

    t0 = time.time()
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}", flush=True)
    for case, reps, min_run in (("gpu", 9, 1.0), ("host", 9, 1.0)):
        py, th = setup(case)
        fns = {"pycudnn": py, "torch": th}
        ours(case, fns, reps)
        timer(case, fns, min_run)
        ours(case, fns, reps)  # again after the Timer: drift shows as a change between the two
    for name, step in (
        ("pyperf", lambda: pyperf_case(processes=4, values=5, loops=2000)),
        ("cuda-bench", lambda: nvbench_case("gpu", on_stream("gpu"))),
    ):
        try:
            step()
        except Exception as exc:
            print(f"{name}: not measured: {type(exc).__name__}: {exc}", flush=True)
    out = os.environ.get("OUT")
    if out:
        Path(out, "timing_compare.json").write_text(json.dumps(RESULTS, indent=1))
    print(f"done in {time.time() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
