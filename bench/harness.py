"""Benchmark harness logic that needs neither a GPU nor torch.

Statistics, the peak-throughput table, convolution FLOP/byte counts, the A/B measurement loop
(against an abstract timing backend, so it can be unit-tested with fakes), kernel-name handling
for the "engine chosen" column, target evaluation and the text/Markdown report.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

# --------------------------------------------------------------------------------------------
# statistics


@dataclass(frozen=True)
class Stats:
    """Median, quartiles, minimum and maximum of repeated measurements (one value per
    repetition, or per nvbench sample for GPU times); the spread reported is the IQR
    (``q3 - q1``: the stdlib's inclusive quartiles, as torch.utils.benchmark's
    ``Measurement.iqr``; nvbench's own for GPU times, ``bench.timing.cold_stats``)."""

    median: float
    min: float
    max: float
    n: int
    q1: float | None = None  # None in results written before the quartiles were kept
    q3: float | None = None

    @classmethod
    def of(cls, values: Iterable[float]) -> Stats:
        vals = [float(v) for v in values if v is not None and math.isfinite(v)]
        if not vals:
            raise ValueError("Stats.of needs at least one finite value")
        if len(vals) > 1:
            q1, _, q3 = statistics.quantiles(vals, n=4, method="inclusive")
        else:
            q1 = q3 = vals[0]
        return cls(statistics.median(vals), min(vals), max(vals), len(vals), q1, q3)

    @property
    def iqr(self) -> float | None:
        """The interquartile range, or None for results without quartiles."""
        return None if self.q1 is None or self.q3 is None else self.q3 - self.q1

    def to_dict(self) -> dict[str, float]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Stats | None:
        if not d:
            return None
        return cls(d["median"], d["min"], d["max"], int(d["n"]), d.get("q1"), d.get("q3"))


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b``, or None when either is missing or ``b`` is not positive."""
    if a is None or b is None or not b > 0:
        return None
    return a / b


# --------------------------------------------------------------------------------------------
# peaks


@dataclass(frozen=True)
class GpuPeaks:
    """Dense (no sparsity) datasheet peaks in TFLOP/s, and memory bandwidth in TB/s."""

    name: str
    bf16: float
    fp16: float
    tf32: float
    fp32: float
    fp64: float
    mem_tbs: float


# Most specific names first: "H100 PCIe" and "H100 NVL" must match before plain "H100".
PEAK_TABLE: tuple[tuple[str, GpuPeaks], ...] = (
    ("H200 NVL", GpuPeaks("H200 NVL", 835.5, 835.5, 417.5, 60.0, 30.0, 4.8)),
    ("H200", GpuPeaks("H200 SXM", 989.4, 989.4, 494.7, 66.9, 66.9, 4.8)),
    ("H100 NVL", GpuPeaks("H100 NVL", 835.5, 835.5, 417.5, 60.0, 30.0, 3.9)),
    ("H100 PCIe", GpuPeaks("H100 PCIe", 756.0, 756.0, 378.0, 51.2, 51.2, 2.0)),
    ("H100", GpuPeaks("H100 SXM", 989.4, 989.4, 494.7, 66.9, 66.9, 3.35)),
    ("A100", GpuPeaks("A100 SXM", 312.0, 312.0, 156.0, 19.5, 19.5, 2.0)),
)
DEFAULT_PEAKS = PEAK_TABLE[4][1]  # H100 SXM


def peaks_for(gpu_name: str) -> tuple[GpuPeaks, str]:
    """Peaks for *gpu_name* (``torch.cuda.get_device_name``) and how they were chosen."""
    upper = gpu_name.upper()
    for key, peaks in PEAK_TABLE:
        if key.upper() in upper:
            return peaks, f"{peaks.name} datasheet (matched {key!r} in {gpu_name!r})"
    return DEFAULT_PEAKS, f"unknown GPU {gpu_name!r}: assumed {DEFAULT_PEAKS.name} datasheet"


def math_mode(dtype: str, tf32: bool = False) -> str:
    """The throughput class of a conv: ``bf16``, ``fp16``, ``tf32``, ``fp32`` or ``fp64``."""
    if dtype in ("bfloat16", "bf16"):
        return "bf16"
    if dtype in ("float16", "fp16", "half"):
        return "fp16"
    if dtype in ("float32", "fp32", "float"):
        return "tf32" if tf32 else "fp32"
    if dtype in ("float64", "fp64", "double"):
        return "fp64"
    raise ValueError(f"no throughput class for dtype {dtype!r}")


def peak_tflops(peaks: GpuPeaks, mode: str) -> float:
    return float(getattr(peaks, mode))


# --------------------------------------------------------------------------------------------
# convolution geometry


@dataclass(frozen=True)
class ConvGeom:
    """A convolution problem in PyTorch's terms (cross-correlation, symmetric padding)."""

    n: int
    c: int
    k: int
    spatial: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: tuple[int, ...] = ()
    pad: tuple[int, ...] = ()
    dilation: tuple[int, ...] = ()
    groups: int = 1

    def __post_init__(self) -> None:
        nd = len(self.spatial)
        for name in ("stride", "dilation"):
            if not getattr(self, name):
                object.__setattr__(self, name, (1,) * nd)
        if not self.pad:
            object.__setattr__(self, "pad", (0,) * nd)
        if not len(self.kernel) == len(self.stride) == len(self.pad) == len(self.dilation) == nd:
            raise ValueError(f"inconsistent spatial ranks in {self}")
        if self.c % self.groups or self.k % self.groups:
            raise ValueError(f"groups={self.groups} must divide C={self.c} and K={self.k}")

    @property
    def nd(self) -> int:
        return len(self.spatial)

    @property
    def out_spatial(self) -> tuple[int, ...]:
        return tuple(
            (i + 2 * p - d * (r - 1) - 1) // s + 1
            for i, r, s, p, d in zip(
                self.spatial, self.kernel, self.stride, self.pad, self.dilation, strict=True
            )
        )

    @property
    def x_shape(self) -> tuple[int, ...]:
        return (self.n, self.c, *self.spatial)

    @property
    def w_shape(self) -> tuple[int, ...]:
        return (self.k, self.c // self.groups, *self.kernel)

    @property
    def y_shape(self) -> tuple[int, ...]:
        return (self.n, self.k, *self.out_spatial)

    def flops(self) -> float:
        """Direct-convolution FLOPs (multiply and add counted): same for fwd, dgrad and wgrad."""
        return (
            2.0
            * self.n
            * self.k
            * math.prod(self.out_spatial)
            * (self.c // self.groups)
            * math.prod(self.kernel)
        )

    def min_bytes(self, itemsize: int) -> int:
        """Fewest bytes moved: x, w and y each touched once."""
        elems = math.prod(self.x_shape) + math.prod(self.w_shape) + math.prod(self.y_shape)
        return elems * itemsize

    def describe(self) -> str:
        sp = "x".join(map(str, self.spatial))
        ker = "x".join(map(str, self.kernel))
        s = f"N{self.n} C{self.c}->{self.k} {sp} k{ker}"
        if any(v != 1 for v in self.stride):
            s += f" s{self.stride[0]}"
        if self.groups != 1:
            s += f" g{self.groups}"
        return s


# --------------------------------------------------------------------------------------------
# measurement loop (backend-agnostic)


class TimingBackend(Protocol):
    """What the measurement loop needs from the device side (``bench.timing.TorchBackend`` on
    the GPU, fakes in tests)."""

    def host_us_per_call(self, fn: Callable[[], object], calls: int) -> float:
        """Host time per call (µs) of *calls* back-to-back calls, no synchronisation inside."""
        ...

    def queue_gpu(
        self, sides: Sequence[tuple[str, Callable[[], object], SideResult]], context: Any
    ) -> None:
        """Queue the GPU time per call of each ``(name, call, side)``: ``side.gpu_ms`` is set
        when the queue runs (once, at the end: nvbench runs once per process)."""
        ...

    def sync(self) -> None: ...


@dataclass
class SideResult:
    """One library's numbers for one benchmark item."""

    gpu_ms: Stats | None = None
    host_us: Stats | None = None
    first_call_ms: float | None = None
    engine: str = ""
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu_ms": self.gpu_ms.to_dict() if self.gpu_ms else None,
            "host_us": self.host_us.to_dict() if self.host_us else None,
            "first_call_ms": self.first_call_ms,
            "engine": self.engine,
            "error": self.error,
            **self.extra,
        }


def alternate(
    fn_a: Callable[[], float], fn_b: Callable[[], float], reps: int
) -> tuple[list[float], list[float]]:
    """Run A and B alternately *reps* times each (A,B, B,A, A,B, ...: the order flips every
    repetition so a slow drift favours neither); return both lists of results."""
    a_vals: list[float] = []
    b_vals: list[float] = []
    for i in range(reps):
        if i % 2 == 0:
            a_vals.append(fn_a())
            b_vals.append(fn_b())
        else:
            b_vals.append(fn_b())
            a_vals.append(fn_a())
    return a_vals, b_vals


def alternate_many(fns: Sequence[Callable[[], float]], reps: int) -> list[list[float]]:
    """``alternate`` for any number of sides: forward order in even repetitions, reversed in
    odd ones (A,B,C, C,B,A, ...); for two sides the same order as ``alternate``."""
    vals: list[list[float]] = [[] for _ in fns]
    order = list(range(len(fns)))
    for i in range(reps):
        for j in order if i % 2 == 0 else reversed(order):
            vals[j].append(fns[j]())
    return vals


def measure_pair(
    backend: TimingBackend,
    fn_a: Callable[[], object],
    fn_b: Callable[[], object],
    *,
    reps: int = 5,
    host_calls: int = 30,
    gpu: bool = True,
    names: Sequence[str] = ("a", "b"),
    context: Any = None,
) -> tuple[SideResult, SideResult]:
    """``measure_sides`` of two sides."""
    a, b = measure_sides(
        backend,
        [fn_a, fn_b],
        reps=reps,
        host_calls=host_calls,
        gpu=gpu,
        names=names,
        context=context,
    )
    return a, b


def measure_sides(
    backend: TimingBackend,
    fns: Sequence[Callable[[], object]],
    *,
    reps: int = 5,
    host_calls: int = 30,
    gpu: bool = True,
    names: Sequence[str] | None = None,
    context: Any = None,
    sides: Sequence[SideResult] | None = None,
) -> list[SideResult]:
    """Host time of every side now, alternating (``alternate_many``); GPU time queued on the
    backend (*names* label the calls, *context* is entered around their timing), so
    ``gpu_ms`` is set when the backend's queue runs. Fills *sides* if given, else new ones.
    The callables must already be warm."""
    sides = list(sides) if sides is not None else [SideResult() for _ in fns]
    host = alternate_many(
        [(lambda fn=fn: backend.host_us_per_call(fn, host_calls)) for fn in fns], reps
    )
    backend.sync()
    for side, vals in zip(sides, host, strict=True):
        side.host_us = Stats.of(vals)
    if gpu:
        labels = list(names) if names is not None else [f"side {i}" for i in range(len(fns))]
        backend.queue_gpu(list(zip(labels, fns, sides, strict=True)), context)
    return sides


# --------------------------------------------------------------------------------------------
# kernel names -> "engine chosen"

MARKER_KERNEL = "spin_kernel"  # the kernel torch.cuda._sleep launches


def split_by_marker(
    kernels: Sequence[tuple[float, str]], marker: str = MARKER_KERNEL
) -> list[list[str]]:
    """Kernel names in start order, cut at every marker kernel; the part before the first
    marker is dropped, so segment i holds what ran between marker i and marker i+1."""
    segments: list[list[str]] | None = None
    for _start, name in sorted(kernels, key=lambda kv: kv[0]):
        if marker in name:
            segments = [] if segments is None else segments
            segments.append([])
        elif segments is not None:
            segments[-1].append(name)
    if not segments:
        return []
    return segments[:-1] if not segments[-1] else segments


def short_kernel(name: str, width: int = 64) -> str:
    """A kernel's base name without template or argument lists, cut to *width*."""
    base = name
    for cut in ("(", "<"):
        idx = base.find(cut)
        if idx > 0:
            base = base[:idx]
    base = base.removeprefix("void ").strip()
    return base if len(base) <= width else base[: width - 1] + "~"


def summarize_kernels(names: Sequence[str], width: int = 64) -> str:
    """``k1 + k2`` with repeats folded (``k1 x2``); ``-`` for none."""
    if not names:
        return "-"
    parts: list[str] = []
    counts: dict[str, int] = {}
    for n in names:
        s = short_kernel(n, width)
        if s not in counts:
            parts.append(s)
        counts[s] = counts.get(s, 0) + 1
    return " + ".join(p if counts[p] == 1 else f"{p} x{counts[p]}" for p in parts)


# --------------------------------------------------------------------------------------------
# targets


@dataclass(frozen=True)
class Target:
    """One target from the issue, with the measured value and whether it was met."""

    name: str
    goal: str
    measured: str
    met: bool | None  # None: not measured

    @property
    def verdict(self) -> str:
        return {True: "MET", False: "MISSED", None: "NOT MEASURED"}[self.met]


GPU_RATIO_MEDIAN_GOAL = 1.00
GPU_RATIO_MAX_GOAL = 1.05
TINY_REUSE_GOAL = 0.6
TINY_REUSE_STRETCH = 0.5
TINY_NEW_GOAL = 1.0
FUSION_MEDIAN_GOAL = 0.85  # issue 13: pycudnn fused <= 0.85x torch eager, median case


def _fmt(v: float | None, spec: str = ".3f") -> str:
    return "n/a" if v is None else format(v, spec)


def gpu_ratios(mode_result: dict[str, Any]) -> list[tuple[str, float]]:
    """(label, pycudnn/torch median GPU-time ratio) for every GPU-bound item with both sides."""
    out = []
    for item in mode_result.get("items", []):
        r = item.get("ratio")
        if r is not None:
            out.append((f"{item['case']} {item['op']}", float(r)))
    return out


def fusion_ratios(mode_result: dict[str, Any], key: str = "ratio") -> list[tuple[str, float]]:
    """(case, side/torch-eager median GPU-time ratio) of every fusion case with both sides;
    *key* ``ratio`` for pycudnn, ``ratio_frontend`` for the frontend."""
    out = []
    for item in mode_result.get("fusion") or []:
        r = item.get(key)
        if r is not None:
            out.append((str(item["case"]), float(r)))
    return out


def frontend_ratios(mode_result: dict[str, Any]) -> list[tuple[str, float]]:
    """(label, frontend/torch median GPU-time ratio) for every conv item with both sides."""
    out = []
    for item in mode_result.get("items", []):
        r = item.get("ratio_frontend")
        if r is not None:
            out.append((f"{item['case']} {item['op']}", float(r)))
    return out


def evaluate_targets(results: dict[str, Any]) -> list[Target]:
    """The issue's targets, measured, from a merged results dict (see ``run.py``)."""
    modes: dict[str, Any] = results.get("modes", {})
    targets: list[Target] = []
    # the tiny conv is measured in every mode (its plan is the same heuristic pick in both)
    for tiny_mode in modes or ("heuristic",):
        tiny = (modes.get(tiny_mode) or {}).get("tiny") or {}

        def tiny_target(key: str, goal: float, label: str, tiny: dict = tiny) -> None:
            entry = tiny.get(key) or {}
            r = entry.get("ratio")
            py = (entry.get("pycudnn") or {}).get("median")
            th = (entry.get("torch") or {}).get("median")
            meas = f"{_fmt(r, '.2f')}x ({_fmt(py, '.1f')} us vs torch {_fmt(th, '.1f')} us)"
            met = None if r is None else r <= goal
            targets.append(Target(label, f"<= {goal:.2f}x torch F.conv2d host us/call", meas, met))

        tiny_target("reuse", TINY_REUSE_GOAL, f"(1) tiny conv, reused buffers [{tiny_mode}]")
        r = (tiny.get("reuse") or {}).get("ratio")
        targets.append(
            Target(
                f"(1) tiny conv, reused buffers, stretch [{tiny_mode}]",
                f"<= {TINY_REUSE_STRETCH:.2f}x torch",
                f"{_fmt(r, '.2f')}x",
                None if r is None else r <= TINY_REUSE_STRETCH,
            )
        )
        tiny_target(
            "new_buffers", TINY_NEW_GOAL, f"(1) tiny conv, new buffers each call [{tiny_mode}]"
        )

    for mode, res in modes.items():
        ratios = gpu_ratios(res)
        if not ratios:
            targets.append(Target(f"GPU-bound median ratio [{mode}]", "<= 1.00", "n/a", None))
            targets.append(Target(f"GPU-bound max ratio [{mode}]", "<= 1.05", "n/a", None))
            continue
        med = statistics.median(r for _, r in ratios)
        worst_label, worst = max(ratios, key=lambda lr: lr[1])
        over = [f"{lbl} {r:.2f}" for lbl, r in ratios if r > GPU_RATIO_MAX_GOAL]
        targets.append(
            Target(
                f"GPU-bound median ratio pycudnn/torch [{mode}]",
                f"<= {GPU_RATIO_MEDIAN_GOAL:.2f}",
                f"{med:.3f} over {len(ratios)} items",
                med <= GPU_RATIO_MEDIAN_GOAL,
            )
        )
        targets.append(
            Target(
                f"GPU-bound worst ratio [{mode}]",
                f"<= {GPU_RATIO_MAX_GOAL:.2f} for every item",
                f"{worst:.3f} ({worst_label})"
                + (f"; above 1.05: {', '.join(over)}" if over else ""),
                worst <= GPU_RATIO_MAX_GOAL,
            )
        )
    for mode, res in modes.items():
        tiny = res.get("tiny") or {}
        for key, what in (("reuse", "reused buffers"), ("new_buffers", "new buffers each call")):
            entry = tiny.get(key) or {}
            py = (entry.get("pycudnn") or {}).get("median")
            fe = (entry.get("frontend") or {}).get("median")
            if fe is None:
                continue  # no frontend column in this run: no target row
            targets.append(
                Target(
                    f"(1) tiny conv, {what}, below the frontend [{mode}]",
                    "pycudnn host us/call < cudnn-frontend's",
                    f"{_fmt(py, '.1f')} us vs frontend {_fmt(fe, '.1f')} us",
                    None if py is None else py < fe,
                )
            )
        fusion = fusion_ratios(res)
        if res.get("fusion") is not None:
            med = statistics.median(r for _, r in fusion) if fusion else None
            targets.append(
                Target(
                    f"fusion: pycudnn fused / torch eager GPU time, median case [{mode}]",
                    f"<= {FUSION_MEDIAN_GOAL:.2f}",
                    "n/a" if med is None else f"{med:.3f} over {len(fusion)} cases",
                    None if med is None else med <= FUSION_MEDIAN_GOAL,
                )
            )
    for mode, res in modes.items():
        cold = res.get("cold") or {}
        r = cold.get("ratio")
        py = (cold.get("pycudnn_ms") or {}).get("median")
        th = (cold.get("torch_ms") or {}).get("median")
        targets.append(
            Target(
                f"(11) cold first call of a new shape [{mode}]",
                "<= torch (ratio <= 1.00)",
                f"{_fmt(py, '.2f')} ms vs torch {_fmt(th, '.2f')} ms ({_fmt(r, '.2f')}x)",
                None if r is None else r <= 1.0,
            )
        )
    return targets


# --------------------------------------------------------------------------------------------
# report


def format_table(
    headers: Sequence[str], rows: Sequence[Sequence[Any]], markdown: bool = False
) -> str:
    """A fixed-width text table, or a GitHub Markdown table."""
    cells = [[("" if c is None else str(c)) for c in row] for row in rows]
    if markdown:
        head = " | ".join(h.replace("|", "\\|") for h in headers)
        lines = ["| " + head + " |", "|" + "---|" * len(headers)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in cells]
        return "\n".join(lines)
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*headers), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*row) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def _gpu_cell(d: dict[str, Any] | None) -> str:
    """A GPU ms cell: the median and, where the run kept quartiles, the IQR in brackets."""
    if not d:
        return "-"
    iqr = Stats.from_dict(d).iqr  # type: ignore[union-attr]
    return format(d["median"], ".4f") + ("" if iqr is None else f" ({iqr:.4f})")


def gpu_method(results: dict[str, Any]) -> str:
    """How a results dict's GPU ms were measured: nvbench since bench.timing, events behind a
    spin kernel before (the committed older runs)."""
    metas = [results.get("meta") or {}]
    metas += [r.get("meta") or {} for r in (results.get("modes") or {}).values()]
    timer = next((m["gpu_timer"] for m in metas if m.get("gpu_timer")), None)
    if timer:
        return f"GPU ms = median (IQR) per call by {timer.get('tool', 'nvbench')}"
    return (
        "GPU ms = median per call by CUDA events over back-to-back calls queued behind a spin "
        "kernel"
    )


def _stat(d: dict[str, Any] | None, key: str = "median", spec: str = ".4f") -> str:
    if not d:
        return "-"
    return format(d[key], spec)


MODE_TITLES = {
    "heuristic": "heuristic vs heuristic (pycudnn algo='guess_once', torch cudnn.benchmark=False)",
    "autotune": "autotuned vs autotuned (pycudnn algo='time_once', torch cudnn.benchmark=True)",
}


def has_frontend(results: dict[str, Any]) -> bool:
    """Whether a results dict comes from a run with the frontend column (taken or skipped):
    older runs render exactly as before."""
    if (results.get("meta") or {}).get("frontend") is not None:
        return True
    for res in (results.get("modes") or {}).values():
        if (res.get("meta") or {}).get("frontend") is not None:
            return True
        if any("frontend" in it for it in res.get("items", [])):
            return True
    return False


def frontend_info(results: dict[str, Any]) -> dict[str, Any]:
    info = (results.get("meta") or {}).get("frontend")
    if info is None:
        for res in (results.get("modes") or {}).values():
            info = (res.get("meta") or {}).get("frontend")
            if info is not None:
                break
    return info or {}


def _plan_short(plan: str | None) -> str:
    """``engine 62 (ws 0 B)`` -> ``e62``; other descriptions cut short."""
    if not plan:
        return ""
    return str(plan).split(" (")[0].replace("engine ", "e")[:48]


def item_rows(
    mode_result: dict[str, Any], engines: bool = True, frontend: bool = False
) -> list[list[str]]:
    rows = []
    for it in mode_result.get("items", []):
        py, th = it.get("pycudnn") or {}, it.get("torch") or {}
        fe = it.get("frontend") or {}
        err = py.get("error") or th.get("error")
        if frontend:
            row = [
                it["case"],
                it["op"],
                it["label"],
                _gpu_cell(py.get("gpu_ms")),
                _gpu_cell(th.get("gpu_ms")),
                _gpu_cell(fe.get("gpu_ms")),
                _fmt(it.get("ratio"), ".3f"),
                _fmt(it.get("ratio_frontend"), ".3f"),
                _fmt(it.get("pct_peak_pycudnn"), ".0f"),
                _fmt(it.get("relerr"), ".1e"),
                _fmt(it.get("relerr_frontend"), ".1e"),
                _stat(py.get("host_us"), spec=".1f"),
                _stat(th.get("host_us"), spec=".1f"),
                _stat(fe.get("host_us"), spec=".1f"),
            ]
            if engines:
                plan = _plan_short(py.get("plan"))
                eng = (
                    f"{plan + ': ' if plan else ''}{py.get('engine') or '-'} | "
                    f"{th.get('engine') or '-'} | "
                    f"{fe.get('plan') or ''}{': ' if fe.get('plan') else ''}"
                    f"{fe.get('engine') or '-'}"
                )
                errs = [f"{n}: {d['error'][:100]}" for n, d in _sides(it) if d.get("error")]
                row.append(eng if not errs else "ERROR " + "; ".join(errs))
            rows.append(row)
            continue
        row = [
            it["case"],
            it["op"],
            it["label"],
            _gpu_cell(py.get("gpu_ms")),
            _gpu_cell(th.get("gpu_ms")),
            _fmt(it.get("ratio"), ".3f"),
            _fmt(it.get("tflops_pycudnn"), ".0f"),
            _fmt(it.get("pct_peak_pycudnn"), ".0f"),
            _fmt(it.get("tflops_torch"), ".0f"),
            _fmt(it.get("pct_peak_torch"), ".0f"),
            _stat(py.get("host_us"), spec=".1f"),
            _stat(th.get("host_us"), spec=".1f"),
        ]
        if engines:
            plan = py.get("plan") or ""
            plan = plan.split(" (")[0].replace("engine ", "e") + ": " if plan else ""
            eng = f"{plan}{py.get('engine') or '-'} | {th.get('engine') or '-'}"
            row.append(eng if not err else f"ERROR: {err[:120]}")
        rows.append(row)
    return rows


def _sides(it: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(n, it.get(n) or {}) for n in ("pycudnn", "torch", "frontend")]


ITEM_HEADERS_FE = [
    "case",
    "op",
    "problem",
    "pycudnn ms",
    "torch ms",
    "frontend ms",
    "py/th",
    "fe/th",
    "%pk py",
    "relerr py",
    "relerr fe",
    "host us py",
    "host us th",
    "host us fe",
    "engine pycudnn | torch | frontend",
]

FUSION_HEADERS = [
    "case",
    "problem",
    "pycudnn ms",
    "torch ms",
    "frontend ms",
    "py/th",
    "fe/th",
    "fused",
    "kernels py/th/fe",
    "relerr py",
    "relerr th",
    "relerr fe",
    "host us py",
    "host us th",
    "host us fe",
    "engine pycudnn | frontend",
]


def _yes_no(v: Any) -> str:
    return "?" if v is None else ("yes" if v else "no")


def fusion_rows(mode_result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for it in mode_result.get("fusion") or []:
        py, th, fe = (it.get(n) or {} for n in ("pycudnn", "torch", "frontend"))
        nk = "/".join(str(d.get("n_kernels", "-")) for d in (py, th, fe))
        errs = [f"{n}: {d['error'][:100]}" for n, d in _sides(it) if d.get("error")]
        eng = (
            f"{_plan_short(py.get('plan')) or '-'}: {py.get('engine') or '-'} | "
            f"{fe.get('plan') or '-'}: {fe.get('engine') or '-'}"
        )
        rows.append(
            [
                it["case"],
                it["label"],
                _gpu_cell(py.get("gpu_ms")),
                _gpu_cell(th.get("gpu_ms")),
                _gpu_cell(fe.get("gpu_ms")),
                _fmt(it.get("ratio"), ".3f"),
                _fmt(it.get("ratio_frontend"), ".3f"),
                _yes_no(py.get("fused")),
                nk,
                _fmt(it.get("relerr_pycudnn"), ".1e"),
                _fmt(it.get("relerr_torch"), ".1e"),
                _fmt(it.get("relerr_frontend"), ".1e"),
                _stat(py.get("host_us"), spec=".1f"),
                _stat(th.get("host_us"), spec=".1f"),
                _stat(fe.get("host_us"), spec=".1f"),
                eng if not errs else "ERROR " + "; ".join(errs),
            ]
        )
    return rows


ITEM_HEADERS = [
    "case",
    "op",
    "problem",
    "pycudnn ms",
    "torch ms",
    "ratio",
    "TF/s py",
    "%pk py",
    "TF/s th",
    "%pk th",
    "host us py",
    "host us th",
    "engine pycudnn | torch",
]


def render_report(results: dict[str, Any], markdown: bool = False) -> str:
    """The summary printed last and pasted into docs/BENCHMARKS.md."""
    meta = results.get("meta", {})
    out: list[str] = []
    h = "### " if markdown else "== "
    blank = "\n" if markdown else ""  # Markdown tables need an empty line before them
    out.append(
        f"{h}pycudnn vs torch on {meta.get('gpu', '?')} | cuDNN {meta.get('cudnn_version', '?')}"
        f" | torch {meta.get('torch_version', '?')} | peaks: {meta.get('peaks_source', '?')}"
    )
    fe_cols = has_frontend(results)
    if fe_cols:
        info = frontend_info(results)
        if info.get("available"):
            out.append(
                f"frontend column: nvidia-cudnn-frontend {info.get('version', '?')} (import "
                f"cudnn, pygraph) on cuDNN {info.get('backend_version', '?')}, heuristics "
                f"{info.get('heuristics', 'A')}"
            )
        else:
            out.append(f"frontend column: skipped ({info.get('reason', 'no reason recorded')})")
    for mode, res in results.get("modes", {}).items():
        out.append("")
        out.append(f"{h}{MODE_TITLES.get(mode, mode)}")
        if res.get("error"):
            out.append(f"mode failed: {res['error']}")
        if fe_cols:
            out.append(
                f"{gpu_method(results)}; py/th, fe/th = pycudnn/torch and frontend/torch "
                "medians; %pk = % of dense peak for the dtype; relerr = ||side - torch|| / "
                "||torch|| in fp64"
            )
            out.append(
                blank + format_table(ITEM_HEADERS_FE, item_rows(res, frontend=True), markdown)
            )
        else:
            out.append(
                f"{gpu_method(results)}; ratio = pycudnn/torch medians; %pk = % of dense "
                "peak for the dtype"
            )
            out.append(blank + format_table(ITEM_HEADERS, item_rows(res), markdown))
        tiny = res.get("tiny") or {}
        if tiny:
            tiny_fe = fe_cols or any(isinstance(e, dict) and "frontend" in e for e in tiny.values())
            rows = []
            for key, entry in tiny.items():
                if not isinstance(entry, dict) or not isinstance(entry.get("pycudnn"), dict):
                    continue
                row = [
                    key,
                    entry.get("what", ""),
                    _stat(entry.get("pycudnn"), spec=".2f"),
                    _stat(entry.get("pycudnn"), "min", ".2f"),
                    _stat(entry.get("torch"), spec=".2f"),
                    _stat(entry.get("torch"), "min", ".2f"),
                    _fmt(entry.get("ratio"), ".2f"),
                ]
                if tiny_fe:
                    row += [
                        _stat(entry.get("frontend"), spec=".2f"),
                        _stat(entry.get("frontend"), "min", ".2f"),
                        _fmt(entry.get("ratio_frontend"), ".2f"),
                    ]
                rows.append(row)
            headers = ["variant", "what", "pycudnn", "(min)", "torch", "(min)", "ratio"]
            if tiny_fe:
                headers += ["frontend", "(min)", "fe/th"]
            out.append("")
            out.append("(1) tiny conv x=(1,8,8,8) w=(8,8,3,3) pad 1 fp32 NCHW, us per call")
            if tiny_fe:
                rel = tiny.get("relerr_frontend")
                note = (
                    f"frontend: same variant pack dict every call (reuse) or a new dict with "
                    f"a new output each call (new_buffers); relerr vs torch {_fmt(rel, '.1e')}"
                )
                if tiny.get("frontend_error"):
                    note = f"frontend failed: {tiny['frontend_error']}"
                out.append(note)
            out.append(blank + format_table(headers, rows, markdown))
        cold, thrash = res.get("cold") or {}, res.get("thrash") or {}
        if cold or thrash:
            rows = []
            if cold:
                rows.append(
                    [
                        "(11) cold first call, new shape (ms incl. sync)",
                        _stat(cold.get("pycudnn_ms"), spec=".2f"),
                        _stat(cold.get("torch_ms"), spec=".2f"),
                        _fmt(cold.get("ratio"), ".2f"),
                    ]
                )
            for key, what in (("host", "host us/call"), ("wall", "wall us/call")):
                if thrash.get(f"pycudnn_{key}_us"):
                    rows.append(
                        [
                            f"(12) two shapes alternating, {what}",
                            _stat(thrash.get(f"pycudnn_{key}_us"), spec=".2f"),
                            _stat(thrash.get(f"torch_{key}_us"), spec=".2f"),
                            _fmt(thrash.get(f"ratio_{key}"), ".2f"),
                        ]
                    )
            out.append("")
            out.append(blank + format_table(["case", "pycudnn", "torch", "ratio"], rows, markdown))
        if res.get("fusion"):
            out.append("")
            out.append(
                "fusion: y = relu(conv(x, w) + bias [+ z]); torch eager F.relu(F.conv2d(x, w, b) "
                "[+ z]); pycudnn one dnn_conv(bias=, activation='relu', z=, out=); frontend "
                "conv_fprop -> bias [-> add] -> relu graph. GPU ms as above; relerr vs float64; "
                "fused = pycudnn's plan says so; kernels = per call, from the profiler"
            )
            out.append(blank + format_table(FUSION_HEADERS, fusion_rows(res), markdown))
    out.append("")
    out.append(f"{h}targets")
    trows = [[t.name, t.goal, t.measured, t.verdict] for t in evaluate_targets(results)]
    out.append(blank + format_table(["target", "goal", "measured", "verdict"], trows, markdown))
    return "\n".join(out)


def _median_txt(ratios: list[tuple[str, float]], spec: str = ".3f") -> str:
    if not ratios:
        return "n/a"
    return f"{statistics.median(r for _, r in ratios):{spec}}"


def summary_lines(results: dict[str, Any]) -> list[str]:
    """One line per group and mode, printed last by ``run.py`` (and pasted in the issue)."""
    lines: list[str] = []
    fe_cols = has_frontend(results)
    info = frontend_info(results)
    if fe_cols and not info.get("available"):
        lines.append(f"frontend: skipped ({info.get('reason', 'no reason recorded')})")
    for mode, res in (results.get("modes") or {}).items():
        if res.get("error"):
            lines.append(f"[{mode}] mode failed: {res['error']}")
        ratios = gpu_ratios(res)
        if ratios:
            worst_label, worst = max(ratios, key=lambda lr: lr[1])
            line = (
                f"conv [{mode}]: median pycudnn/torch {_median_txt(ratios)} ({len(ratios)} "
                f"items), worst {worst:.3f} ({worst_label})"
            )
            if fe_cols:
                fr = frontend_ratios(res)
                line += f"; frontend/torch {_median_txt(fr)} ({len(fr)} items)"
            lines.append(line)
        tiny = res.get("tiny") or {}
        if tiny:
            parts = []
            for key, short in (("reuse", "reuse"), ("new_buffers", "new")):
                e = tiny.get(key) or {}
                txt = (
                    f"{short} py {_stat(e.get('pycudnn'), spec='.1f')} "
                    f"torch {_stat(e.get('torch'), spec='.1f')}"
                )
                if fe_cols:
                    txt += f" fe {_stat(e.get('frontend'), spec='.1f')}"
                parts.append(txt)
            lines.append(f"tiny conv host us [{mode}]: " + " | ".join(parts))
        if res.get("fusion") is not None:
            fr_py, fr_fe = fusion_ratios(res), fusion_ratios(res, "ratio_frontend")
            fused = [(it.get("pycudnn") or {}).get("fused") for it in res["fusion"]]
            line = (
                f"fusion [{mode}]: median pycudnn/torch {_median_txt(fr_py, '.2f')} "
                f"({len(fr_py)} cases), frontend/torch {_median_txt(fr_fe, '.2f')} "
                f"({len(fr_fe)} cases); pycudnn fused {sum(1 for f in fused if f)}/{len(fused)}"
            )
            if any(f is None for f in fused):
                line += f" ({sum(1 for f in fused if f is None)} unknown)"
            lines.append(line)
    targets = evaluate_targets(results)
    counts = {v: sum(1 for t in targets if t.verdict == v) for v in ("MET", "MISSED")}
    lines.append(
        f"targets: {counts['MET']} met, {counts['MISSED']} missed, "
        f"{len(targets) - counts['MET'] - counts['MISSED']} not measured"
    )
    return lines
