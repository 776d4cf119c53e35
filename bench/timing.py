"""How bench/ times a call: host µs by ``perf_counter`` loops, GPU ms by NVIDIA's nvbench.

Host time (``TorchBackend.host_us_per_call``): n back-to-back calls without synchronisation,
divided by n; ``harness.measure_sides`` alternates the sides' repetitions so that a drift of the
host favours none.

GPU time (``GpuQueue``): nvbench's cold measurement, from the ``cuda-bench`` package. Each call
is timed alone: nvbench flushes the L2 cache, holds the stream with its blocking kernel while
the call is enqueued (so a host-bound call is timed by its GPU work only) and times the GPU work
with CUDA events; it takes samples until its stopping criterion (relative noise under 0.5 %, or
stable) or a per-call timeout, and reports median and quartiles. ``bench/timing_compare.py``
measured it against bench's former timer (CUDA events behind a ``torch.cuda._sleep`` spin
kernel) on the same cases: the same medians, a narrower IQR; so bench/ keeps nvbench alone.

nvbench runs once per process (its Python registry refuses a second run), so GPU timing is
queued: ``add`` takes the sides of one item while the item is built and checked, ``run`` times
every queued call in one nvbench run, on the stream the calls are issued to (torch's current
stream), and then calls what was given to ``then`` (ratios, log lines).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from .harness import SideResult, Stats

INSTALL = (
    "pip install cuda-bench (on a GPU machine without network, the carried wheel: "
    "python3 -m pip install --no-index --no-deps --target /tmp/site .whl/cuda_bench-*.whl "
    "and run with PYTHONPATH=.:/tmp/site)"
)
# nvbench's stopping criterion (stdrel) needs this much measured GPU time per call, and stops a
# call at the timeout whatever it has (a 5 us kernel would need 100,000 samples for its default
# 0.5 s). Estimates per call are for budgets only.
MIN_TIME_S = {False: 0.1, True: 0.02}  # by quick
TIMEOUT_S = {False: 3.0, True: 1.0}
ESTIMATE_S = {False: 0.8, True: 0.4}
# A call that synchronises waits for nvbench's blocking kernel, which gives up after this long
# and raises "Deadlock detected" for that call only (nvbench's default is 30 s).
BLOCKING_TIMEOUT_S = 5.0

Context = Callable[[], AbstractContextManager[Any]]


class NvbenchMissing(RuntimeError):
    """cuda-bench (NVIDIA's nvbench bindings) cannot be imported: no GPU time can be measured."""


def _missing(why: str) -> str:
    return f"bench/ times GPU work with NVIDIA's nvbench (cuda-bench): {why}. Install it: {INSTALL}"


def missing_reason() -> str | None:
    """Why cuda-bench cannot be found, or None; imports nothing (``run.py``'s parent process
    checks before it starts the GPU children)."""
    try:
        found = importlib.util.find_spec("cuda.bench") is not None
    except (ImportError, ValueError):  # no 'cuda' package at all
        found = False
    return None if found else _missing("the package cuda.bench is not installed")


def nvbench() -> Any:
    """``cuda.bench`` with its native module loaded, or NvbenchMissing with the install line."""
    try:
        import cuda.bench as nvb

        nvb.run_all_benchmarks  # noqa: B018 -- loads the native module for this CUDA major
    except (ImportError, AttributeError) as exc:
        raise NvbenchMissing(_missing(f"{type(exc).__name__}: {exc}")) from exc
    return nvb


class _Stream:
    """A raw stream handle under the CUDA stream protocol, for nvbench's ``State.set_stream``."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


@dataclass
class _Job:
    name: str
    fn: Callable[[], object]
    side: SideResult
    context: Context | None


def cold_stats(values: dict[str, Any]) -> Stats | None:
    """GPU ms per call from one nvbench state's summaries (``nv/cold/time/gpu/*`` in seconds,
    ``nv/cold/sample_size``), or None when it has no cold measurement."""
    try:
        ms = {k: float(values[f"nv/cold/time/gpu/{k}"]) * 1e3 for k in ("median", "q1", "q3")}
        lo, hi = (float(values[f"nv/cold/time/gpu/{k}"]) * 1e3 for k in ("min", "max"))
        n = int(float(values["nv/cold/sample_size"]))
    except (KeyError, TypeError, ValueError):
        return None
    return Stats(ms["median"], lo, hi, n, ms["q1"], ms["q3"])


def read_states(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """nvbench's JSON output -> {benchmark name: {"values": {summary tag: value}, "skip": reason
    or None}} for the first state of each benchmark (one device, no axes here)."""
    out: dict[str, dict[str, Any]] = {}
    for bench in data.get("benchmarks") or []:
        states = bench.get("states") or [{}]
        st = states[0]
        values = {}
        for summ in st.get("summaries") or []:
            for d in summ.get("data") or []:
                if d.get("name") == "value":
                    values[summ.get("tag")] = d.get("value")
        skip = (st.get("skip_reason") or "skipped") if st.get("is_skipped") else None
        out[bench.get("name")] = {"values": values, "skip": skip}
    return out


class GpuQueue:
    """GPU time per call of every queued call, in one nvbench run (see the module's text)."""

    def __init__(self, torch: Any, *, quick: bool = False, nvb: Any = None) -> None:
        self.torch = torch
        self.nvb = nvb if nvb is not None else nvbench()
        self.quick = quick
        self.jobs: list[_Job] = []
        self.after: list[Callable[[], None]] = []
        self.flip = False
        self.ran = False
        self.info: dict[str, Any] = {
            "tool": f"cuda-bench {getattr(self.nvb, '__version__', '?')} (nvbench), cold GPU "
            "time: each call alone, L2 flushed, behind nvbench's blocking kernel",
            "min_time_s": MIN_TIME_S[quick],
        }

    def add(
        self, sides: Sequence[tuple[str, Callable[[], object], SideResult]], context: Context | None
    ) -> None:
        """Queue the sides of one item, ``(name, call, side)``; ``side.gpu_ms`` is set by
        ``run``. *context* is entered around each call's timing (the math mode it was built
        under). Every other group is queued in reverse, so a drift over the run favours no side."""
        group = list(sides)
        if self.flip:
            group.reverse()
        self.flip = not self.flip
        self.jobs += [_Job(name, fn, side, context) for name, fn, side in group]

    def then(self, fn: Callable[[], None]) -> None:
        """Call *fn* after ``run`` (what needs the GPU times: ratios, throughput, log lines)."""
        self.after.append(fn)

    def seconds(self) -> float:
        """About how long ``run`` takes for the calls queued so far (for budgets); 0 once run."""
        return 0.0 if self.ran else len(self.jobs) * ESTIMATE_S[self.quick]

    def run(self, seconds: float | None = None) -> dict[str, Any]:
        """Time every queued call (once per process), within about *seconds* if given; then the
        ``then`` callbacks, each guarded. Returns ``info`` (tool, limits, failures, wall time)."""
        if self.ran:
            raise RuntimeError("GpuQueue.run: nvbench runs once per process")
        self.ran = True
        t0 = time.perf_counter()
        if self.jobs:
            try:
                self._nvbench(seconds)
            except Exception as exc:  # the host numbers and the other sections stay
                self.info["error"] = f"{type(exc).__name__}: {exc}"
                traceback.print_exc()
        self.info["wall_s"] = round(time.perf_counter() - t0, 1)
        for fn in self.after:
            try:
                fn()
            except Exception as exc:
                self.info.setdefault("after_errors", []).append(f"{type(exc).__name__}: {exc}")
                traceback.print_exc()
        return self.info

    def _nvbench(self, seconds: float | None) -> None:
        nvb, torch = self.nvb, self.torch
        timeout = TIMEOUT_S[self.quick]
        if seconds is not None:  # a tight budget shortens every call's measurement alike
            timeout = max(0.2, min(timeout, (seconds - 5.0) / len(self.jobs)))
        self.info.update(calls=len(self.jobs), timeout_s=round(timeout, 2))
        stream = _Stream(int(torch.cuda.current_stream().cuda_stream))
        names = [f"{i:04d} {job.name}" for i, job in enumerate(self.jobs)]
        errors: dict[str, str] = {}
        for name, job in zip(names, self.jobs, strict=True):
            nvb.register(self._bench(job, name, stream, errors)).set_name(name)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "nvbench.json")
            argv = ["bench", "--devices", str(torch.cuda.current_device()), "--json", path]
            argv += ["--quiet", "--timeout", f"{timeout:g}", "--min-time"]
            argv += [f"{MIN_TIME_S[self.quick]:g}"]
            nvb.run_all_benchmarks(argv)
            with open(path) as fh:
                states = read_states(json.load(fh))
        for name, job in zip(names, self.jobs, strict=True):
            st = states.get(name) or {"values": {}, "skip": "not in nvbench's output"}
            stats = None if name in errors else cold_stats(st["values"])
            job.side.gpu_ms = stats
            if stats is None:
                why = errors.get(name) or st["skip"] or "no cold GPU time in nvbench's output"
                job.side.extra["gpu_error"] = why
                self.info.setdefault("failed", {})[name] = why

    @staticmethod
    def _bench(
        job: _Job, name: str, stream: _Stream, errors: dict[str, str]
    ) -> Callable[[Any], None]:
        def bench(state: Any) -> None:
            # time the stream the call is issued on; a call that synchronises fails alone
            state.set_stream(stream)
            state.set_blocking_kernel_timeout(BLOCKING_TIMEOUT_S)
            try:
                with job.context() if job.context else contextlib.nullcontext():
                    job.fn()  # outside the timing: whatever a cache dropped since is rebuilt
                    state.exec(lambda _launch: job.fn(), batched=False)
            except Exception as exc:  # raised through nvbench: this call only, the run goes on
                errors[name] = f"{type(exc).__name__}: {exc}"

        return bench


class TorchBackend:
    """``harness.TimingBackend`` on torch's current stream: host loops here, GPU time queued on
    a ``GpuQueue``."""

    def __init__(self, torch: Any, gpu: GpuQueue | None = None) -> None:
        self.torch = torch
        self.gpu = gpu

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def host_us_per_call(self, fn: Callable[[], object], calls: int) -> float:
        self.sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        self.sync()
        return (t1 - t0) / calls * 1e6

    def queue_gpu(
        self, sides: Sequence[tuple[str, Callable[[], object], SideResult]], context: Context | None
    ) -> None:
        if self.gpu is None:
            raise RuntimeError("TorchBackend without a GpuQueue measures host time only")
        self.gpu.add(sides, context)
