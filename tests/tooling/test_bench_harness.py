"""The benchmark harness (bench/) without a GPU or torch: statistics, peaks, FLOP counts, the
A/B measurement loop against a fake timing backend, GPU timing (bench/timing.py) against a fake
cuda.bench, kernel-name handling, targets and reports."""

from __future__ import annotations

import contextlib
import importlib.machinery
import json
import math
import statistics
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness as h  # noqa: E402
from bench.cases import FUSION_CASES, GPU_CASES, Selection  # noqa: E402

# -- statistics -------------------------------------------------------------------------------


def test_stats_median_min_max_and_nan_dropped() -> None:
    s = h.Stats.of([3.0, 1.0, 2.0, float("nan"), 10.0])
    assert (s.median, s.min, s.max, s.n) == (2.5, 1.0, 10.0, 4)
    assert h.Stats.from_dict(s.to_dict()) == s
    assert h.Stats.from_dict(None) is None
    with pytest.raises(ValueError):
        h.Stats.of([float("nan")])


def test_the_benchmark_summary_is_up_to_date_with_the_committed_results() -> None:
    # docs/BENCHMARKS.md's summary table is what bench/plots.py renders from docs/benchmarks/
    from bench import plots

    assert plots.write_summary(check=True), "run: python -m bench.plots"
    rows = plots.summary_rows()
    assert len(rows) >= 10 and all(r["spread"][0] <= r["ratio"] <= r["spread"][1] for r in rows)
    for name in ("ratios", "conv_ratio", "host_us", "scaling"):
        assert (plots.PLOTS / f"{name}.svg").is_file(), name


def test_stats_keep_the_quartiles_and_read_results_without_them() -> None:
    s = h.Stats.of([3.0, 1.0, 2.0, 10.0])
    assert (s.q1, s.q3, s.iqr) == (1.75, 4.75, 3.0)  # inclusive quartiles, as torch's Timer
    assert h.Stats.of([5.0]).iqr == 0.0
    old = h.Stats.from_dict({"median": 2.0, "min": 1.0, "max": 3.0, "n": 3})
    assert old is not None and old.iqr is None and "q1" not in old.to_dict()


def test_ratio_guards() -> None:
    assert h.ratio(2.0, 4.0) == 0.5
    assert h.ratio(None, 1.0) is None
    assert h.ratio(1.0, 0.0) is None


# -- peaks ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected", "bf16"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.4),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", "H100 NVL", 835.5),
        ("NVIDIA H200", "H200 SXM", 989.4),
        ("NVIDIA H200 NVL", "H200 NVL", 835.5),
    ],
)
def test_peaks_for_known_gpus(name: str, expected: str, bf16: float) -> None:
    peaks, how = h.peaks_for(name)
    assert peaks.name == expected and peaks.bf16 == bf16
    assert "matched" in how


def test_peaks_for_unknown_gpu_says_assumed() -> None:
    peaks, how = h.peaks_for("Some Future GPU")
    assert peaks == h.DEFAULT_PEAKS and "assumed" in how


def test_math_mode_and_peak() -> None:
    p = h.peaks_for("NVIDIA H200")[0]
    assert h.math_mode("bfloat16") == "bf16"
    assert h.math_mode("float16") == "fp16"
    assert h.math_mode("float32") == "fp32"
    assert h.math_mode("float32", tf32=True) == "tf32"
    assert h.peak_tflops(p, "tf32") == 494.7
    assert h.peak_tflops(p, "fp32") == 66.9
    with pytest.raises(ValueError):
        h.math_mode("int8")


# -- geometry ---------------------------------------------------------------------------------


def test_conv_geometry_resnet_3x3() -> None:
    g = h.ConvGeom(256, 64, 64, (56, 56), (3, 3), pad=(1, 1))
    assert g.out_spatial == (56, 56)
    assert g.flops() == 2 * 256 * 64 * 56 * 56 * 64 * 9
    assert g.x_shape == (256, 64, 56, 56) and g.w_shape == (64, 64, 3, 3)
    assert g.min_bytes(2) == 2 * (256 * 64 * 56 * 56 * 2 + 64 * 64 * 9)


def test_conv_geometry_stem_depthwise_3d() -> None:
    stem = h.ConvGeom(256, 3, 64, (224, 224), (7, 7), (2, 2), (3, 3))
    assert stem.out_spatial == (112, 112)
    assert "s2" in stem.describe()
    dw = h.ConvGeom(64, 512, 512, (14, 14), (3, 3), pad=(1, 1), groups=512)
    assert dw.w_shape == (512, 1, 3, 3)
    assert dw.flops() == 2 * 64 * 512 * 14 * 14 * 1 * 9
    g3 = h.ConvGeom(2, 64, 64, (32, 32, 32), (3, 3, 3), pad=(1, 1, 1))
    assert g3.out_spatial == (32, 32, 32) and g3.nd == 3
    with pytest.raises(ValueError):
        h.ConvGeom(1, 6, 4, (8, 8), (3, 3), groups=4)
    with pytest.raises(ValueError):
        h.ConvGeom(1, 4, 4, (8, 8), (3,))


def test_cases_cover_the_issue() -> None:
    ids = [c.id for c in GPU_CASES]
    assert len(ids) == len(set(ids))
    assert {"2", "3", "4", "5", "6a", "6b", "7a", "7b", "8", "9", "10"} == set(ids)
    by_id = {c.id: c for c in GPU_CASES}
    assert by_id["7b"].tf32 and not by_id["7a"].tf32
    assert by_id["10"].layout == "NDHWC" and by_id["7a"].layout == "NCHW"
    assert by_id["3"].ops == ("fwd", "dgrad", "wgrad")
    for c in GPU_CASES:
        assert c.geom.flops() > 0 and c.title()


# -- measurement loop with a fake backend -----------------------------------------------------


class FakeBackend:
    """Each callable's 'cost' is its attribute ``gpu`` / ``host``; queued GPU time lands at
    once."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str, Any]] = []
        self.syncs = 0

    def sync(self) -> None:
        self.syncs += 1

    def queue_gpu(self, sides: list[tuple[str, Any, h.SideResult]], context: Any) -> None:
        for name, fn, side in sides:
            self.log.append(("gpu", fn.name, (name, context)))
            side.gpu_ms = h.Stats.of([fn.gpu])

    def host_us_per_call(self, fn: Any, calls: int) -> float:
        self.log.append(("host", fn.name, calls))
        return fn.host


def fake_fn(name: str, gpu: float, host: float) -> Any:
    def fn() -> None:
        return None

    fn.name, fn.gpu, fn.host = name, gpu, host  # type: ignore[attr-defined]
    return fn


def test_alternate_flips_order_every_repetition() -> None:
    order: list[str] = []

    def a() -> float:
        order.append("a")
        return 1.0

    def b() -> float:
        order.append("b")
        return 2.0

    av, bv = h.alternate(a, b, 4)
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert av == [1.0] * 4 and bv == [2.0] * 4


def test_measure_pair_times_the_host_now_and_queues_the_gpu() -> None:
    be = FakeBackend()
    a, b = fake_fn("a", 0.5, 12.0), fake_fn("b", 0.25, 17.0)
    ra, rb = h.measure_pair(be, a, b, reps=3, host_calls=20, names=("x a", "x b"), context="ctx")
    assert ra.gpu_ms.median == 0.5 and rb.gpu_ms.median == 0.25
    assert ra.host_us.median == 12.0 and rb.host_us.median == 17.0
    hosts = [e for e in be.log if e[0] == "host"]
    assert [e[1] for e in hosts] == ["a", "b", "b", "a", "a", "b"] and {e[2] for e in hosts} == {20}
    # one GPU entry per side, after the host loops, with its name and the caller's context
    assert be.log[len(hosts) :] == [("gpu", "a", ("x a", "ctx")), ("gpu", "b", ("x b", "ctx"))]
    ra2, _ = h.measure_pair(be, a, b, reps=2, gpu=False)
    assert ra2.gpu_ms is None and ra2.host_us is not None
    mine = [h.SideResult(), h.SideResult()]
    assert h.measure_sides(be, [a, b], reps=1, sides=mine) == mine and mine[1].host_us.n == 1


# -- kernel names -----------------------------------------------------------------------------


def test_split_by_marker_and_summaries() -> None:
    m = h.MARKER_KERNEL
    events = [
        (0.0, "warm_before_marker"),
        (1.0, m),
        (2.0, "void sm90_xmma_fprop_implicit_gemm_bf16<128, 64>(Params)"),
        (3.0, m),
        (4.0, "cudnn::ops::nchwToNhwcKernel(int)"),
        (5.0, "implicit_convolve_sgemm"),
        (6.0, m),
        (7.0, m),
    ]
    segs = h.split_by_marker(list(reversed(events)))
    assert segs == [
        ["void sm90_xmma_fprop_implicit_gemm_bf16<128, 64>(Params)"],
        ["cudnn::ops::nchwToNhwcKernel(int)", "implicit_convolve_sgemm"],
        [],
    ]
    assert h.short_kernel(segs[0][0]) == "sm90_xmma_fprop_implicit_gemm_bf16"
    assert h.summarize_kernels(["k<1>", "k<2>", "j"]) == "k x2 + j"
    assert h.summarize_kernels([]) == "-"
    assert len(h.short_kernel("x" * 100, width=10)) == 10
    assert h.split_by_marker([(0.0, "a")]) == []


# -- targets and reports ----------------------------------------------------------------------


def fake_item(case: str, op: str, py_ms: float, th_ms: float) -> dict[str, Any]:
    def side(ms: float) -> dict[str, Any]:
        return {
            "gpu_ms": h.Stats.of([ms]).to_dict(),
            "host_us": h.Stats.of([10.0]).to_dict(),
            "engine": "sm90_xmma",
            "error": None,
        }

    return {
        "case": case,
        "op": op,
        "label": f"case {case}",
        "pycudnn": side(py_ms),
        "torch": side(th_ms),
        "ratio": py_ms / th_ms,
        "tflops_pycudnn": 500.0,
        "pct_peak_pycudnn": 50.5,
        "tflops_torch": 400.0,
        "pct_peak_torch": 40.4,
    }


def fake_results(tiny_reuse: float = 0.5, worst: float = 1.02, cold: float = 0.8) -> dict:
    def entry(r: float) -> dict[str, Any]:
        return {
            "what": "x",
            "pycudnn": h.Stats.of([17.0 * r]).to_dict(),
            "torch": h.Stats.of([17.0]).to_dict(),
            "ratio": r,
        }

    mode = {
        "items": [fake_item("2", "fwd", 0.97, 1.0), fake_item("3", "wgrad", worst, 1.0)],
        "tiny": {"reuse": entry(tiny_reuse), "new_buffers": entry(0.9), "relerr": 0.0},
        "cold": {
            "pycudnn_ms": h.Stats.of([cold]).to_dict(),
            "torch_ms": h.Stats.of([1.0]).to_dict(),
            "ratio": cold,
        },
        "thrash": {
            "pycudnn_host_us": h.Stats.of([9.0]).to_dict(),
            "torch_host_us": h.Stats.of([17.0]).to_dict(),
            "ratio_host": 9 / 17,
        },
    }
    return {
        "meta": {"gpu": "NVIDIA H200", "cudnn_version": 91900, "peaks_source": "H200 SXM"},
        "modes": {"heuristic": mode, "autotune": json.loads(json.dumps(mode))},
    }


def verdicts(results: dict) -> dict[str, bool | None]:
    return {t.name: t.met for t in h.evaluate_targets(results)}


def test_targets_all_met() -> None:
    v = verdicts(fake_results())
    assert v["(1) tiny conv, reused buffers [heuristic]"] is True
    assert v["(1) tiny conv, reused buffers, stretch [heuristic]"] is True
    assert v["(1) tiny conv, new buffers each call [heuristic]"] is True
    assert v["GPU-bound median ratio pycudnn/torch [autotune]"] is True
    assert v["GPU-bound worst ratio [autotune]"] is True
    assert v["(11) cold first call of a new shape [heuristic]"] is True


def test_targets_missed_are_reported() -> None:
    res = fake_results(tiny_reuse=0.7, worst=1.2, cold=1.5)
    targets = {t.name: t for t in h.evaluate_targets(res)}
    assert targets["(1) tiny conv, reused buffers [heuristic]"].met is False
    worst = targets["GPU-bound worst ratio [heuristic]"]
    assert worst.met is False and "3 wgrad" in worst.measured and "above 1.05" in worst.measured
    # median of [0.97, 1.2] = 1.085
    assert targets["GPU-bound median ratio pycudnn/torch [heuristic]"].met is False
    assert targets["(11) cold first call of a new shape [autotune]"].met is False
    assert worst.verdict == "MISSED"


def test_targets_not_measured_when_missing() -> None:
    targets = h.evaluate_targets({"modes": {"heuristic": {"items": []}}})
    assert targets and all(t.met is None for t in targets)
    assert {t.verdict for t in targets} == {"NOT MEASURED"}


def test_render_report_text_and_markdown() -> None:
    res = fake_results(worst=1.2)
    res["modes"]["autotune"]["items"][0]["pycudnn"]["error"] = "NotSupportedError: no engine"
    text = h.render_report(res)
    assert "NVIDIA H200" in text and "91900" in text
    assert "autotuned vs autotuned" in text and "heuristic vs heuristic" in text
    assert "MISSED" in text and "ERROR: NotSupportedError" in text
    assert "(12) two shapes alternating" in text
    md = h.render_report(res, markdown=True)
    assert "| case | op |" in md and "|---|" in md


def test_report_cli_renders_a_results_file(tmp_path, capsys) -> None:
    from bench import report

    path = tmp_path / "r.json"
    path.write_text(json.dumps(fake_results()))
    assert report.main([str(path), "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "| engine pycudnn \\| torch |" in out and "### targets" in out


def test_format_table_aligns() -> None:
    t = h.format_table(["a", "bb"], [["xxx", 1], [None, "y"]])
    lines = t.splitlines()
    assert lines[0].startswith("a    bb") and set(lines[1]) <= {"-", " "}
    assert h.format_table(["a|b"], [["c|d"]], markdown=True).endswith("| c\\|d |")


# -- GPU time: bench/timing.py against a fake cuda.bench (nvbench's Python bindings) ----------


class FakeNvbench(types.ModuleType):
    """The surface of ``cuda.bench`` that bench/timing.py uses: ``register(fn)`` returns a
    benchmark to name; ``run_all_benchmarks(argv)`` (once per process, as nvbench) runs each
    registered function with a state whose ``exec`` calls the launcher a few times, and writes
    nvbench's JSON (cold GPU summaries in seconds, values as strings) to ``--json``. A sample's
    time is ``times[name]`` (the name without its index) or the launcher's host time."""

    def __init__(self, times: dict[str, list[float]] | None = None) -> None:
        super().__init__("cuda.bench")
        self.__spec__ = importlib.machinery.ModuleSpec("cuda.bench", None)
        self.__version__ = "0.3.0-fake"
        self.times = times or {}
        self.benches: list[Any] = []
        self.runs = 0
        self.argv: list[str] = []
        self.order: list[str] = []
        self.streams: set[tuple[int, int]] = set()
        self.tf32_seen: dict[str, Any] = {}

    def register(self, fn: Any) -> Any:
        bench = types.SimpleNamespace(fn=fn, name=fn.__name__)

        def set_name(name: str) -> Any:
            bench.name = name
            return bench

        bench.set_name = set_name
        self.benches.append(bench)
        return bench

    def run_all_benchmarks(self, argv: list[str]) -> None:
        if self.runs:
            raise RuntimeError("Benchmarks were already executed")
        self.runs += 1
        self.argv = list(argv)
        out = []
        for bench in self.benches:
            state = FakeState(self, bench.name.split(" ", 1)[1])
            bench.fn(state)
            out.append({"name": bench.name, "states": [state.json()]})
        with open(argv[argv.index("--json") + 1], "w") as fh:
            json.dump({"benchmarks": out}, fh)


class FakeState:
    def __init__(self, nvb: FakeNvbench, name: str) -> None:
        self.nvb, self.name, self.samples = nvb, name, []
        self.skip_reason: str | None = None

    def set_stream(self, provider: Any) -> None:
        self.nvb.streams.add(provider.__cuda_stream__())

    def set_blocking_kernel_timeout(self, seconds: float) -> None:
        assert 0 < seconds < 30

    def skip(self, reason: str) -> None:
        self.skip_reason = reason

    def exec(self, launcher: Any, *, batched: bool | None = None) -> None:
        import time

        assert batched is False  # cold only: no batch measurement
        self.nvb.order.append(self.name)
        torch = sys.modules.get("torch")
        if torch is not None and hasattr(torch, "backends"):
            self.nvb.tf32_seen[self.name] = torch.backends.cudnn.allow_tf32
        for _ in range(4):
            t0 = time.perf_counter()
            launcher(None)
            self.samples.append(max(time.perf_counter() - t0, 1e-7))
        self.samples = self.nvb.times.get(self.name, self.samples)

    def json(self) -> dict[str, Any]:
        if self.skip_reason is not None or not self.samples:
            return {"name": "Device=0", "is_skipped": True, "skip_reason": self.skip_reason}
        q1, med, q3 = statistics.quantiles(self.samples, n=4, method="inclusive")
        vals = {"median": med, "q1": q1, "q3": q3}
        vals |= {"min": min(self.samples), "max": max(self.samples)}
        summ = [
            {
                "tag": f"nv/cold/time/gpu/{k}",
                "data": [{"name": "value", "type": "float64", "value": repr(v)}],
            }
            for k, v in vals.items()
        ]
        summ.append(
            {
                "tag": "nv/cold/sample_size",
                "data": [{"name": "value", "type": "int64", "value": str(len(self.samples))}],
            }
        )
        return {"name": "Device=0", "is_skipped": False, "summaries": summ}


def install_fake_nvbench(monkeypatch, times: dict[str, list[float]] | None = None) -> FakeNvbench:
    nvb = FakeNvbench(times)
    monkeypatch.setitem(sys.modules, "cuda.bench", nvb)
    return nvb


def fake_torch_ns() -> Any:
    return types.SimpleNamespace(
        cuda=types.SimpleNamespace(
            current_stream=lambda: types.SimpleNamespace(cuda_stream=7),
            current_device=lambda: 0,
            synchronize=lambda: None,
        )
    )


def test_gpu_queue_times_every_call_in_one_nvbench_run(monkeypatch) -> None:
    from bench import timing

    us = 1e-6
    nvb = install_fake_nvbench(
        monkeypatch, {"x a": [10 * us, 11 * us, 12 * us, 13 * us, 30 * us], "x b": [5 * us] * 3}
    )
    q = timing.GpuQueue(fake_torch_ns(), quick=True)
    a, b, c, d = (h.SideResult() for _ in range(4))
    entered: list[str] = []

    @contextlib.contextmanager
    def ctx():
        entered.append("in")
        yield

    q.add([("x a", lambda: None, a), ("x b", lambda: None, b)], ctx)
    q.add([("y a", lambda: None, c), ("y b", lambda: 1 / 0, d)], None)
    done: list[str] = []
    q.then(lambda: done.append(f"{a.gpu_ms.median:.4f}"))
    q.then(lambda: 1 / 0)  # a failing callback does not stop the others
    q.then(lambda: done.append("last"))
    assert q.seconds() == 4 * timing.ESTIMATE_S[True]
    info = q.run()
    assert nvb.runs == 1 and done == ["0.0120", "last"] and q.seconds() == 0
    # seconds -> ms, nvbench's quartiles kept; every other group in reverse order
    g = a.gpu_ms
    assert g.n == 5 and (g.median, g.min, g.max, g.q1, g.q3) == pytest.approx(
        (0.012, 0.01, 0.03, 0.011, 0.013)
    )
    assert b.gpu_ms.median == pytest.approx(0.005) and b.gpu_ms.iqr == 0.0
    assert [b.name for b in nvb.benches] == ["0000 x a", "0001 x b", "0002 y b", "0003 y a"]
    assert nvb.order == ["x a", "x b", "y a"] and entered == ["in", "in"]  # y b raised first
    assert c.gpu_ms is not None and d.gpu_ms is None
    assert "ZeroDivisionError" in d.extra["gpu_error"] and list(info["failed"]) == ["0002 y b"]
    assert info["after_errors"] == ["ZeroDivisionError: division by zero"]
    # nvbench times torch's current stream on torch's device, cold only, quietly
    argv = nvb.argv
    assert nvb.streams == {(0, 7)} and argv[argv.index("--devices") + 1] == "0"
    assert "--quiet" in argv and argv[argv.index("--min-time") + 1] == "0.02"
    assert argv[argv.index("--timeout") + 1] == f"{timing.TIMEOUT_S[True]:g}"
    with pytest.raises(RuntimeError, match="once per process"):
        q.run()


def test_gpu_queue_fits_a_budget_and_reads_skips() -> None:
    from bench import timing

    nvb = FakeNvbench()
    q = timing.GpuQueue(fake_torch_ns(), nvb=nvb)
    sides = [h.SideResult() for _ in range(10)]
    q.add([(f"s{i}", lambda: None, sd) for i, sd in enumerate(sides)], None)
    q.run(seconds=15.0)  # (15 - 5) / 10 calls: 1 s each instead of 3
    assert nvb.argv[nvb.argv.index("--timeout") + 1] == "1"
    assert all(sd.gpu_ms is not None for sd in sides)
    states = timing.read_states(
        {"benchmarks": [{"name": "0000 s", "states": [{"is_skipped": True, "skip_reason": "x"}]}]}
    )
    assert states == {"0000 s": {"values": {}, "skip": "x"}}
    assert timing.cold_stats({"nv/cold/time/gpu/median": "1e-3"}) is None


def test_without_cuda_bench_the_message_names_the_install_line(monkeypatch, capsys) -> None:
    from bench import run, timing

    monkeypatch.setitem(sys.modules, "cuda.bench", None)
    with pytest.raises(timing.NvbenchMissing) as exc:
        timing.GpuQueue(fake_torch_ns())
    assert "pip install cuda-bench" in str(exc.value) and ".whl/cuda_bench-" in str(exc.value)
    monkeypatch.setattr(timing.importlib.util, "find_spec", lambda name: None)
    assert "not installed" in timing.missing_reason()
    # run.py stops before it starts any child process
    monkeypatch.setattr(run.subprocess, "run", lambda *a, **k: pytest.fail("child started"))
    assert run.main(["--results", "unused"]) == 2
    assert "pip install cuda-bench" in capsys.readouterr().err


def test_ops_and_transformer_stop_at_once_without_cuda_bench(monkeypatch, capsys) -> None:
    pytest.importorskip("torch")
    from bench import ops, transformer

    monkeypatch.setitem(sys.modules, "cuda.bench", None)
    assert ops.main(["--only", "pool"]) == 2
    assert transformer.main(["--only", "norm", "--no-frontend"]) == 2
    err = capsys.readouterr().err
    assert err.count("pip install cuda-bench") == 2


def test_report_says_how_the_gpu_time_was_measured() -> None:
    old = fake_results()
    assert "behind a spin kernel" in h.render_report(old)  # the committed runs before nvbench
    new = fake_results()
    new["meta"]["gpu_timer"] = {"tool": "cuda-bench 0.3.0 (nvbench), cold GPU time"}
    gpu = h.Stats(0.1295, 0.127, 0.135, 3872, 0.1290, 0.1300).to_dict()
    new["modes"]["heuristic"]["items"][0]["pycudnn"]["gpu_ms"] = gpu
    text = h.render_report(new)
    assert "GPU ms = median (IQR) per call by cuda-bench 0.3.0 (nvbench)" in text
    assert "0.1295 (0.0010)" in text


# -- the orchestrator, with a fake child process ----------------------------------------------


def test_run_main_merges_children_and_writes_reports(tmp_path, monkeypatch) -> None:
    from bench import run

    calls: list[list[str]] = []

    def fake_run(cmd: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
        calls.append(cmd)
        mode = cmd[cmd.index("--child") + 1]
        path = Path(cmd[cmd.index("--json") + 1])
        res = fake_results()["modes"][mode] | {"meta": {"gpu": "NVIDIA H100 80GB HBM3"}}
        path.write_text(json.dumps(res))
        assert float(cmd[cmd.index("--child-budget") + 1]) > 0
        return subprocess.CompletedProcess(cmd, 0 if mode == "heuristic" else 3)

    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setattr(run.subprocess, "run", fake_run)
    monkeypatch.setattr(run, "missing_reason", lambda: None)  # cuda-bench is the child's
    monkeypatch.setenv("OUT", str(out))
    assert run.main(["--results", str(tmp_path / "res"), "--budget", "100"]) == 0
    assert [c[c.index("--child") + 1] for c in calls] == ["heuristic", "autotune"]
    written = sorted(p.suffix for p in (tmp_path / "res").iterdir())
    assert {".json", ".txt", ".md"} <= set(written)
    assert sorted(p.suffix for p in out.iterdir()) == [".json", ".md", ".txt"]
    merged = json.loads(next(out.glob("*.json")).read_text())
    assert merged["meta"]["gpu"] == "NVIDIA H100 80GB HBM3"
    assert merged["modes"]["autotune"]["error"] == "child exited with 3"
    assert any(t["verdict"] == "MET" for t in merged["targets"])
    assert math.isfinite(merged["meta"]["total_s"])


# -- the per-mode child, end to end, against fake torch and fake pycudnn conv functions -------


class FakeTensor:
    """Just enough of a CUDA tensor for bench/runner.py: a shape and arithmetic stubs."""

    def __init__(self, shape: tuple[int, ...], dtype: str = "float32") -> None:
        self.shape = tuple(shape)
        self.dtype = dtype

    def contiguous(self, memory_format: Any = None) -> FakeTensor:
        return self

    def double(self) -> FakeTensor:
        return self

    def stride(self) -> tuple[int, ...]:
        out, acc = [], 1
        for d in reversed(self.shape):
            out.append(acc)
            acc *= d
        return tuple(reversed(out))

    def view(self, *shape: int) -> FakeTensor:
        assert math.prod(shape) == math.prod(self.shape)
        return FakeTensor(shape, self.dtype)

    def __sub__(self, other: FakeTensor) -> FakeTensor:
        return FakeTensor(self.shape)

    def __add__(self, other: FakeTensor) -> FakeTensor:
        return FakeTensor(self.shape, self.dtype)

    def norm(self) -> float:
        return 1.0

    def data_ptr(self) -> int:
        return id(self)

    def __dlpack__(self) -> object:
        return object()

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "data": (id(self), False), "version": 3}


def make_fake_torch(monkeypatch) -> Any:
    import types

    torch = types.ModuleType("torch")
    torch.__version__ = "0.0-fake"
    torch.float32, torch.float16, torch.bfloat16 = "float32", "float16", "bfloat16"
    torch.channels_last, torch.channels_last_3d = "cl", "cl3d"
    torch.version = types.SimpleNamespace(cuda="13.0")
    torch.uint8 = "uint8"
    torch.randn = lambda *shape, device=None, dtype=None: FakeTensor(
        shape[0] if isinstance(shape[0], tuple) else shape, dtype or "float32"
    )
    torch.empty = torch.randn
    torch.empty_like = lambda t: FakeTensor(t.shape, t.dtype)
    cudnn = types.SimpleNamespace(
        version=lambda: 91900, enabled=True, benchmark=False, deterministic=False, allow_tf32=True
    )
    torch.backends = types.SimpleNamespace(cudnn=cudnn)

    launched: list[str] = []
    torch.cuda = types.SimpleNamespace(
        synchronize=lambda: None,
        current_stream=lambda: types.SimpleNamespace(cuda_stream=0),
        current_device=lambda: 0,
        _sleep=lambda cycles: launched.append("spin_kernel"),
        get_device_properties=lambda i: types.SimpleNamespace(
            multi_processor_count=132, total_memory=80 * 2**30
        ),
        get_device_name=lambda i: "NVIDIA H100 80GB HBM3",
    )

    def conv(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
        launched.append("torch_conv_kernel<float>(Params)")
        return FakeTensor(x.shape)

    def convolution_backward(dy, x, w, *args):
        launched.append("torch_bwd_kernel")
        return FakeTensor(x.shape), FakeTensor(w.shape), None

    def relu(t):
        launched.append("torch_relu_kernel")
        return FakeTensor(t.shape, t.dtype)

    torch.nn = types.SimpleNamespace(
        functional=types.SimpleNamespace(conv2d=conv, conv3d=conv, relu=relu)
    )
    torch.ops = types.SimpleNamespace(
        aten=types.SimpleNamespace(convolution_backward=convolution_backward)
    )

    profiler = types.ModuleType("torch.profiler")
    profiler.ProfilerActivity = types.SimpleNamespace(CUDA="cuda")

    class Profile:
        def __init__(self, activities: Any) -> None:
            pass

        def __enter__(self) -> Profile:
            launched.clear()
            return self

        def __exit__(self, *exc: Any) -> None:
            self.names = list(launched)

        def events(self) -> list:
            return [
                types.SimpleNamespace(
                    device_type="DeviceType.CUDA", time_range=types.SimpleNamespace(start=i), name=n
                )
                for i, n in enumerate(self.names)
            ]

    profiler.profile = Profile
    torch.profiler = profiler
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.profiler", profiler)
    torch._launched = launched
    return torch


def install_fakes(monkeypatch) -> tuple[Any, dict[str, list], list[dict]]:
    """Fake torch and fake pycudnn conv functions: (torch, calls seen, config overrides)."""
    import pycudnn
    import pycudnn._loader as loader

    torch = make_fake_torch(monkeypatch)
    seen: dict[str, list] = {"conv": [], "gi": [], "gw": []}

    def fake_conv(
        img,
        kerns,
        border_mode="valid",
        subsample=(1, 1),
        dilation=(1, 1),
        conv_mode="conv",
        num_groups=1,
        algo=None,
        *,
        out=None,
        stream=None,
        **fused,
    ):
        assert conv_mode == "cross" and isinstance(img, FakeTensor)
        assert set(fused) <= {"bias", "activation", "z"}, fused
        seen["conv"].append((len(img.shape), out is not None))
        if fused:
            seen.setdefault("fused", []).append(sorted(fused))
        torch._launched.append("sm90_xmma_fprop<1>")
        return out if out is not None else FakeTensor(img.shape)

    def fake_gi(kerns, topgrad, img_shp, **kw):
        seen["gi"].append(tuple(img_shp))
        torch._launched.append("sm90_xmma_dgrad")
        return kw["out"]

    def fake_gw(img, topgrad, kerns_shp, **kw):
        seen["gw"].append(tuple(kerns_shp))
        return kw["out"]

    import contextlib
    import types

    overrides: list[dict] = []

    @contextlib.contextmanager
    def override(**kw: Any):
        overrides.append(kw)
        yield

    for name, fn in [
        ("config", types.SimpleNamespace(override=override)),
        ("dnn_conv", fake_conv),
        ("dnn_conv3d", fake_conv),
        ("dnn_gradinput", fake_gi),
        ("dnn_gradinput3d", fake_gi),
        ("dnn_gradweight", fake_gw),
        ("dnn_gradweight3d", fake_gw),
        ("asarray", lambda t: t),
        ("version", lambda raises=True: 91900),
    ]:
        monkeypatch.setitem(pycudnn.__dict__, name, fn)
    monkeypatch.setattr(loader, "libcudnn_files_in_process", lambda: ["/x/libcudnn.so.9"])
    monkeypatch.setattr(
        loader, "load", lambda: loader.LoadedLibrary("/x/libcudnn.so.9", "fake", None)
    )
    install_fake_nvbench(monkeypatch)
    return torch, seen, overrides


def test_runner_child_end_to_end_with_fakes(tmp_path, monkeypatch) -> None:
    from bench import runner

    monkeypatch.setitem(sys.modules, "cudnn", None)  # no frontend here: its column is skipped
    torch, seen, overrides = install_fakes(monkeypatch)
    path = tmp_path / "child.json"
    assert runner.child_main("autotune", str(path), 60.0, True, None) == 0
    res = json.loads(path.read_text())
    assert res["meta"]["gpu"] == "NVIDIA H100 80GB HBM3" and not res.get("errors"), res.get(
        "errors"
    )
    assert not res["skipped"]
    n_items = sum(len(c.ops) for c in GPU_CASES)
    assert len(res["items"]) == n_items
    assert all(it["ratio"] is not None and it["relerr"] == 1.0 for it in res["items"])
    first = res["items"][0]
    assert first["pycudnn"]["engine"] == "sm90_xmma_fprop"
    assert first["torch"]["engine"] == "torch_conv_kernel"
    assert res["items"][1]["pycudnn"]["engine"] == "sm90_xmma_dgrad"
    for key in ("reuse", "new_buffers", "new_x_out_reused", "no_stream_arg", "prewrapped"):
        assert res["tiny"][key]["ratio"] is not None, key
    assert res["tiny"]["cprofile_top"] and res["tiny"]["interop_us"]
    assert res["cold"]["ratio"] is not None and res["thrash"]["ratio_host"] is not None
    assert (5, True) in seen["conv"] and (4, False) in seen["conv"]
    assert (2, 64, 32, 32, 32) in seen["gi"] and (512, 1, 3, 3) in seen["gw"]
    assert torch.backends.cudnn.benchmark is True and torch.backends.cudnn.allow_tf32 is False
    assert overrides[0] == dict(
        algo_fwd="time_once",
        algo_bwd_data="time_once",
        algo_bwd_filter="time_once",
        allow_tf32=False,
    )
    assert {"allow_tf32": True} in overrides
    # the frontend column is skipped with its reason, everywhere
    fe = res["meta"]["frontend"]
    assert fe["available"] is False and "import cudnn failed" in fe["reason"]
    assert all("frontend" not in it for it in res["items"])
    assert "frontend" not in res["tiny"]["reuse"]
    # the fusion cases ran: torch eager and pycudnn's fused call (bias, relu, z for the 1x1s)
    fusion = res["fusion"]
    assert [it["case"] for it in fusion] == [c.id for c in FUSION_CASES]
    assert all(it["ratio"] is not None and it["relerr_pycudnn"] == 1.0 for it in fusion)
    assert ["activation", "bias", "z"] in seen["fused"] and ["activation", "bias"] in seen["fused"]
    assert fusion[0]["torch"]["n_kernels"] == 2  # conv (bias inside in this fake) + relu
    assert fusion[0]["pycudnn"]["engine"] == "sm90_xmma_fprop"
    summary = h.summary_lines({"meta": res["meta"], "modes": {"autotune": res}})
    assert summary[0].startswith("frontend: skipped (import cudnn failed")
    assert any(line.startswith("fusion [autotune]: median pycudnn/torch") for line in summary)
    # GPU time: every side of every item, the tiny conv's and the fusion cases' in one nvbench
    # run (before the engine capture), each with its quartiles
    nvb = sys.modules["cuda.bench"]
    calls = 2 * (n_items + 1 + len(FUSION_CASES))  # pycudnn and torch; items, tiny, fusion
    assert nvb.runs == 1 and res["meta"]["gpu_timer"]["calls"] == calls
    assert all(it["pycudnn"]["gpu_ms"]["q3"] >= it["pycudnn"]["gpu_ms"]["q1"] for it in fusion)
    assert res["tiny"]["gpu_us"]["pycudnn"] > 0
    assert res["meta"]["gpu_timer"]["tool"].startswith("cuda-bench 0.3.0-fake (nvbench)")
    # case 7b was timed with TF32 on, as it was built; everything else with TF32 off
    assert nvb.tf32_seen["7b fwd pycudnn"] is True and nvb.tf32_seen["7a fwd torch"] is False
    # heuristic mode, one case (a process of its own: a fresh nvbench)
    install_fake_nvbench(monkeypatch)
    path2 = tmp_path / "child2.json"
    assert runner.child_main("heuristic", str(path2), 60.0, True, "3") == 0
    res2 = json.loads(path2.read_text())
    assert [it["case"] for it in res2["items"]] == ["3", "3", "3"]
    assert "tiny" not in res2 and "cold" not in res2
    assert all(it["ratio"] is not None for it in res2["items"])
    # the report copes with every kind of tiny entry (gpu_us / wall_us hold plain floats)
    res["tiny"]["gpu_us"] = {"pycudnn": 4.9, "torch": 4.9}
    assert "tiny conv" in h.render_report({"modes": {"autotune": res}})


# -- the frontend column (bench/frontend.py) against a fake ``cudnn`` module ------------------


def make_fake_frontend(monkeypatch, torch: Any, backend_version: int = 91900) -> dict[str, list]:
    """A fake ``cudnn`` (nvidia-cudnn-frontend) with the pygraph surface bench/frontend.py uses;
    records graphs and executes."""
    import types

    log: dict[str, list] = {"graphs": [], "executes": [], "notes": []}

    class FeTensor:
        def __init__(self, name: str, dim: Any = None) -> None:
            self.name, self.dim, self.output = name, dim, False

        def set_output(self, v: bool) -> FeTensor:
            self.output = v
            return self

        def set_dim(self, d: list) -> FeTensor:
            self.dim = list(d)
            return self

        def set_stride(self, s: list) -> FeTensor:
            self.stride = list(s)
            return self

    class Graph:
        def __init__(self, **kw: Any) -> None:
            self.kw, self.ops, self.plan_index, self.built = kw, [], 0, False
            log["graphs"].append(self)

        def tensor(self, name, dim, stride, data_type):
            assert isinstance(dim, list) and isinstance(stride, list) and data_type
            return FeTensor(name, dim)

        def _op(self, op: str, name: str, **kw: Any) -> FeTensor:
            self.ops.append((op, sorted(kw)))
            return FeTensor(f"{name}::out")

        def conv_fprop(self, image, weight, name="", **kw):
            return self._op("conv_fprop", name, **kw)

        def conv_dgrad(self, loss, filter, name="", **kw):
            return self._op("conv_dgrad", name, **kw)

        def conv_wgrad(self, image, loss, name="", **kw):
            return self._op("conv_wgrad", name, **kw)

        def bias(self, name="", input=None, bias=None):
            return self._op("bias", name)

        def add(self, name="", a=None, b=None):
            return self._op("add", name)

        def relu(self, name="", input=None):
            return self._op("relu", name)

        def deselect_numeric_notes(self, notes):
            log["notes"].append(list(notes))
            self.barred = True

        def validate(self):
            pass

        def build_operation_graph(self):
            pass

        def create_execution_plans(self, modes):
            assert modes == ["A", "FALLBACK"]

        def check_support(self):
            pass

        def get_execution_plan_count(self):
            return 3

        def select_plan(self, i):
            self.plan_index = i

        def build_plans(self):
            if getattr(self, "barred", False) and self.plan_index == 0:
                raise RuntimeError("Chosen plan index has been deselected.")
            self.built = True

        def get_workspace_size(self):
            return 128

        def get_plan_name_at_index(self, i):
            return f"eng{62 + i}_k2=1"

        def execute(self, pack, ws, handle=None):
            assert self.built and handle == "handle" and ws.shape == (128,)
            assert all(isinstance(k, FeTensor) for k in pack)
            log["executes"].append(len(pack))
            torch._launched.append("fe_" + "_".join(op for op, _ in self.ops) + "_kernel")

    cudnn = types.ModuleType("cudnn")
    cudnn.__version__ = "1.32.0"
    cudnn.pygraph = Graph
    cudnn.backend_version = lambda: backend_version
    cudnn.create_handle = lambda: "handle"
    cudnn.set_stream = lambda handle, stream: log.setdefault("streams", []).append(stream)
    cudnn.data_type = types.SimpleNamespace(BFLOAT16="bf16", HALF="fp16", FLOAT="fp32")
    cudnn.heur_mode = types.SimpleNamespace(A="A", FALLBACK="FALLBACK")
    cudnn.numerical_note = types.SimpleNamespace(
        TENSOR_CORE="TENSOR_CORE", DOWN_CONVERT_INPUTS="DOWN_CONVERT_INPUTS"
    )
    monkeypatch.setitem(sys.modules, "cudnn", cudnn)
    return log


def test_runner_frontend_column_with_fakes(tmp_path, monkeypatch) -> None:
    from bench import runner

    torch, _seen, _ = install_fakes(monkeypatch)
    fe_log = make_fake_frontend(monkeypatch, torch)
    path = tmp_path / "child.json"
    assert runner.child_main("heuristic", str(path), 60.0, True, "1,7a,8,f4") == 0
    res = json.loads(path.read_text())
    assert not res.get("errors"), res.get("errors")
    fe = res["meta"]["frontend"]
    assert fe["available"] is True and fe["backend_version"] == 91900, fe
    # conv items: a frontend side with times, relerr, plan and its kernel
    items = {(it["case"], it["op"]): it for it in res["items"]}
    assert set(items) == {("7a", "fwd"), ("8", "fwd"), ("8", "dgrad"), ("8", "wgrad")}
    for it in items.values():
        assert it["frontend"]["gpu_ms"] and it["frontend"]["host_us"], it
        assert it["ratio_frontend"] is not None and it["relerr_frontend"] == 1.0
        assert it["frontend"]["error"] is None
    assert items[("8", "dgrad")]["frontend"]["engine"] == "fe_conv_dgrad_kernel"
    assert items[("8", "wgrad")]["frontend"]["plan"] == "eng62_k2=1"
    # fp32 without TF32 (7a): TENSOR_CORE and DOWN_CONVERT barred, plan 0 refused, plan 1 taken
    assert items[("7a", "fwd")]["frontend"]["plan"] == "eng63_k2=1"
    assert ["TENSOR_CORE", "DOWN_CONVERT_INPUTS"] in fe_log["notes"]
    # the tiny conv: reuse and new buffers timed for the frontend too
    tiny = res["tiny"]
    for key in ("reuse", "new_buffers"):
        assert tiny[key]["frontend"]["median"] > 0 and tiny[key]["ratio_frontend"] is not None
    assert "frontend" not in tiny["alloc_only"] and tiny["relerr_frontend"] == 1.0
    # fusion: the frontend's graph is conv -> bias -> add (z) -> relu for the residual case
    fusion = {it["case"]: it for it in res["fusion"]}
    assert set(fusion) == {"f4b", "f4h"}
    ops = [[op for op, _ in g.ops] for g in fe_log["graphs"]]
    assert ["conv_fprop", "bias", "add", "relu"] in ops
    assert fusion["f4b"]["frontend"]["engine"] == "fe_conv_fprop_bias_add_relu_kernel"
    assert fusion["f4b"]["ratio_frontend"] is not None and fusion["f4b"]["relerr_frontend"] == 1.0
    assert fusion["f4b"]["frontend"]["n_kernels"] == 1
    # reports: frontend columns, the fusion table, summary lines
    merged = {"meta": res["meta"], "modes": {"heuristic": res}}
    text = h.render_report(merged)
    assert "frontend column: nvidia-cudnn-frontend 1.32.0" in text
    assert "fe/th" in text and "kernels py/th/fe" in text
    md = h.render_report(merged, markdown=True)
    assert "| engine pycudnn \\| torch \\| frontend |" in md
    lines = h.summary_lines(merged)
    assert lines[0].startswith("conv [heuristic]: median pycudnn/torch")
    assert "frontend/torch" in lines[0]
    assert lines[1].startswith("tiny conv host us [heuristic]: reuse py ")
    assert " fe " in lines[1] and "| new py " in lines[1]
    assert lines[2].startswith("fusion [heuristic]: median pycudnn/torch")
    assert lines[-1].startswith("targets: ")


def test_frontend_skipped_on_version_mismatch(tmp_path, monkeypatch) -> None:
    from bench import frontend

    torch, _, _ = install_fakes(monkeypatch)
    make_fake_frontend(monkeypatch, torch, backend_version=90800)
    fe, info = frontend.load(torch, 91900, lambda: ["/x/libcudnn.so.9"], 0)
    assert fe is None and info["reason"] == "frontend runs on cuDNN 90800, torch on 91900"
    make_fake_frontend(monkeypatch, torch)
    fe, info = frontend.load(torch, 91900, lambda: ["/a/libcudnn.so.9", "/b/libcudnn.so.9"], 0)
    assert fe is None and "expected one libcudnn.so.9" in info["reason"]
    monkeypatch.setenv(frontend.ENV_DISABLE, "1")
    fe, info = frontend.load(torch, 91900, lambda: ["/x/libcudnn.so.9"], 0)
    assert fe is None and "disabled" in info["reason"]


def test_alternate_many_rotates_order() -> None:
    order: list[str] = []

    def side(name: str):
        def fn() -> float:
            order.append(name)
            return float(len(order))

        return fn

    vals = h.alternate_many([side("a"), side("b"), side("c")], 3)
    assert "".join(order) == "abccbaabc"
    assert [len(v) for v in vals] == [3, 3, 3]
    be = FakeBackend()
    sides = h.measure_sides(
        be, [fake_fn("a", 0.5, 12.0), fake_fn("b", 0.25, 9.0), fake_fn("c", 1.0, 30.0)], reps=2
    )
    assert [s.gpu_ms.median for s in sides] == [0.5, 0.25, 1.0]
    assert sides[2].host_us.median == 30.0
    assert [e[2][0] for e in be.log if e[0] == "gpu"] == ["side 0", "side 1", "side 2"]


def test_selection_of_cases_and_groups() -> None:
    every = Selection.parse(None, None)
    assert every.wants("1") and every.wants("f3h") and every.wants_any("fusion")
    s = Selection.parse("3,6,f1", None)
    assert [c for c in ("1", "3", "6a", "6b", "f1b", "f1h", "f2b") if s.wants(c)] == [
        "3",
        "6a",
        "6b",
        "f1b",
        "f1h",
    ]
    s = Selection.parse(None, "fusion,tiny")
    assert s.wants("1") and s.wants("f4h") and not s.wants("2") and not s.wants("11")
    s = Selection.parse("f", "conv")  # both given: a case must pass both
    assert not any(s.wants(c.id) for c in FUSION_CASES + GPU_CASES)
    with pytest.raises(ValueError, match="unknown --only"):
        Selection.parse(None, "fusoin")
    with pytest.raises(ValueError, match="unknown case id"):
        Selection.parse("99", None)
    assert {c.dtype for c in FUSION_CASES} == {"bfloat16", "float16"}
    assert sum(c.residual for c in FUSION_CASES) == 2


def fusion_results(py_ratios: list[float], fe: bool = True) -> dict[str, Any]:
    def item(i: int, r: float) -> dict[str, Any]:
        side = {"gpu_ms": h.Stats.of([r]).to_dict(), "host_us": h.Stats.of([10.0]).to_dict()}
        return {
            "case": f"f{i}b",
            "op": "fused",
            "label": f"fusion {i}",
            "pycudnn": side | {"fused": True, "plan": "engine 7 (ws 0 B)", "n_kernels": 1},
            "torch": {"gpu_ms": h.Stats.of([1.0]).to_dict(), "n_kernels": 3},
            **({"frontend": side | {"plan": "eng7"}} if fe else {}),
            "ratio": r,
            **({"ratio_frontend": r + 0.01} if fe else {}),
            "relerr_pycudnn": 1e-3,
        }

    res = fake_results()
    for mode in res["modes"].values():
        mode["fusion"] = [item(i, r) for i, r in enumerate(py_ratios, 1)]
    res["meta"]["frontend"] = {"available": fe, "version": "1.32.0", "reason": "absent"}
    return res


def test_fusion_target_report_and_summary() -> None:
    res = fusion_results([0.7, 0.8, 0.95])
    t = {x.name: x for x in h.evaluate_targets(res)}
    target = t["fusion: pycudnn fused / torch eager GPU time, median case [heuristic]"]
    assert target.met is True and target.measured == "0.800 over 3 cases"
    res_missed = fusion_results([0.9, 0.95])
    t = {x.name: x for x in h.evaluate_targets(res_missed)}
    assert t["fusion: pycudnn fused / torch eager GPU time, median case [autotune]"].met is False
    text = h.render_report(res)
    assert "fusion: y = relu(conv(x, w) + bias [+ z])" in text and "1/3/-" in text
    md = h.render_report(res, markdown=True)
    assert "| case | problem | pycudnn ms | torch ms | frontend ms |" in md
    lines = h.summary_lines(res)
    fusion = [ln for ln in lines if ln.startswith("fusion [heuristic]")]
    assert fusion == [
        "fusion [heuristic]: median pycudnn/torch 0.80 (3 cases), frontend/torch 0.81 "
        "(3 cases); pycudnn fused 3/3"
    ]


def test_report_frontend_skipped_reason_and_old_results_unchanged() -> None:
    res = fusion_results([0.7], fe=False)
    text = h.render_report(res)
    assert "frontend column: skipped (absent)" in text
    assert h.summary_lines(res)[0] == "frontend: skipped (absent)"
    # a results file from before the frontend column renders as it did
    old = fake_results()
    assert not h.has_frontend(old)
    md = h.render_report(old, markdown=True)
    assert "frontend" not in md and "| engine pycudnn \\| torch |" in md
    assert not any("fe " in ln for ln in h.summary_lines(old))


def test_tiny_frontend_targets() -> None:
    res = fake_results()
    for mode in res["modes"].values():
        mode["tiny"]["reuse"]["frontend"] = h.Stats.of([30.0]).to_dict()
        mode["tiny"]["new_buffers"]["frontend"] = h.Stats.of([10.0]).to_dict()
    t = {x.name: x for x in h.evaluate_targets(res)}
    assert t["(1) tiny conv, reused buffers, below the frontend [heuristic]"].met is True
    # new buffers: pycudnn 17*0.9 = 15.3 us against the frontend's 10 us
    assert t["(1) tiny conv, new buffers each call, below the frontend [autotune]"].met is False


def test_run_main_passes_only_and_no_frontend(tmp_path, monkeypatch, capsys) -> None:
    from bench import run

    cmds: list[list[str]] = []

    def fake_run(cmd: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
        cmds.append(cmd)
        path = Path(cmd[cmd.index("--json") + 1])
        mode = cmd[cmd.index("--child") + 1]
        path.write_text(json.dumps(fusion_results([0.7])["modes"][mode]))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(run.subprocess, "run", fake_run)
    monkeypatch.setattr(run, "missing_reason", lambda: None)
    monkeypatch.delenv("OUT", raising=False)
    args = ["--results", str(tmp_path), "--modes", "heuristic", "--only", "fusion,tiny"]
    assert run.main([*args, "--cases", "f1", "--no-frontend", "--quick"]) == 0
    cmd = cmds[0]
    assert cmd[cmd.index("--only") + 1] == "fusion,tiny" and "--no-frontend" in cmd
    assert cmd[cmd.index("--cases") + 1] == "f1"
    out = capsys.readouterr().out.rstrip().splitlines()
    assert out[-1].startswith("targets: ") and any(
        ln.startswith("fusion [heuristic]") for ln in out[-4:]
    )
    with pytest.raises(SystemExit):
        run.parse_args(["--only", "nope"])


# -- bench/torch_models.py (issue 25): its command line and reports, without torch or a GPU ----


def test_torch_models_help_and_bad_only_without_a_gpu() -> None:
    script = str(ROOT / "bench" / "torch_models.py")
    r = subprocess.run(
        [sys.executable, script, "--help"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert "issue 25" in r.stdout and "--smoke" in r.stdout and "--only" in r.stdout
    r = subprocess.run(
        [sys.executable, script, "--only", "train,nope"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "unknown --only item 'nope'" in r.stderr, r.stderr


def test_torch_models_selection_and_defaults() -> None:
    from bench import torch_models as tm

    a = tm.parse_args(["--quick", "--only", "train-resnet18,infer"])
    assert (a.plan, a.batch) == ("quick", 64)
    assert [c for c in tm.CASE_IDS if tm.wanted(c, a.only)] == [
        "train-resnet18-bf16",
        "train-resnet18-autocast",
        "infer-resnet50-b1",
        "infer-resnet50-b8",
        "infer-resnet50-b64",
    ]
    every = tm.parse_args([])
    assert every.plan == "full" and all(tm.wanted(c, every.only) for c in tm.CASE_IDS)
    assert every.own_resnet50 is False and tm.parse_args(["--own-resnet50"]).own_resnet50
    smoke = tm.parse_args(["--smoke", "--only", "lstm"])
    assert (smoke.plan, smoke.batch, smoke.own_resnet50) == ("smoke", 2, True)
    assert [c for c in tm.CASE_IDS if tm.wanted(c, smoke.only)] == ["lstm"]
    assert tm.parse_args(["--batch", "32"]).batch == 32
    with pytest.raises(SystemExit):
        tm.parse_args(["--batch", "0"])
    with pytest.raises(ValueError, match="names no case"):
        tm.parse_only(" , ")
    # the plans: --quick cuts repetitions, not shapes; --smoke shrinks both
    assert tm.PLANS["quick"].image == tm.PLANS["full"].image == 224
    assert tm.PLANS["quick"].reps < tm.PLANS["full"].reps and tm.PLANS["smoke"].reps == 1
    assert (tm.PLANS["full"].mod_batch, tm.PLANS["full"].mod_hw) == (8, 28)


def test_torch_models_summary_lines_and_module_table() -> None:
    from bench import torch_models as tm

    case = {"case": "train-resnet50-bf16", "torch_median_ms": 22.5, "pycudnn_median_ms": 45.0}
    assert tm.summary_line(case | {"ratio": 2.0}) == (
        "train-resnet50-bf16: torch 22.50 ms pycudnn 45.00 ms ratio 2.000 (target <= 1.00: missed)"
    )
    assert tm.summary_line(case | {"ratio": 0.98}).endswith("ratio 0.980 (target <= 1.00: met)")
    assert tm.summary_line(
        {"case": "train-resnet18-bf16", "skipped": "torchvision is not installed"}
    ) == ("train-resnet18-bf16: skipped (torchvision is not installed)")
    assert (
        tm.summary_line({"case": "lstm", "error": "RuntimeError: x"})
        == "lstm: error (RuntimeError: x)"
    )

    def cell(t: float, p: float) -> dict[str, float]:
        return {"torch_us": t, "pycudnn_us": p, "ratio": p / t}

    rows = [
        {"module": "Conv2d 3x3 64->64", "converted": True, "why": None}
        | {"fwd": cell(10, 20), "fwd_grad": cell(10, 15), "bwd": cell(20, 20)},
        {"module": "ReLU()", "converted": True, "why": None}
        | {"fwd": cell(4, 4), "fwd_grad": cell(5, 5), "bwd": cell(10, 30)},
        {"module": "Linear 2048->1000", "converted": False, "why": "not converted here"}
        | {"fwd": cell(9, 9), "fwd_grad": cell(9, 9), "bwd": cell(9, 9)},
    ]
    table = tm.module_table(rows)
    assert len(table) == 2 + len(rows)
    assert "forward, no_grad" in table[0] and "backward" in table[0]
    assert "  10.0 /    20.0   2.00" in table[2]
    assert table[4].endswith("(not converted: not converted here)")
    # the one-line form: median over the converted rows only
    assert tm.modules_summary(rows) == (
        "modules: host us/call pycudnn/torch, median over 2 converted: forward, no_grad 1.50, "
        "forward, grad 1.25, backward 2.00"
    )
    assert tm.modules_summary(rows[2:]) == "modules: no converted module measured"


# -- bench/torch_fusion.py (issue 26): its command line and summary lines, without a GPU --------


def test_torch_fusion_help_and_bad_arguments() -> None:
    script = str(ROOT / "bench" / "torch_fusion.py")
    r = subprocess.run(
        [sys.executable, script, "--help"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert "issue 26" in r.stdout and "--modes" in r.stdout and "fuse=True" in r.stdout
    for bad, says in ((["--only", "nope"], "unknown item 'nope'"), (["--modes", "max"], "'max'")):
        r = subprocess.run(
            [sys.executable, script, *bad], capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 2 and says in r.stderr, r.stderr


def test_torch_fusion_selection_targets_and_summary() -> None:
    from bench import torch_fusion as tf

    a = tf.parse_args(["--quick", "--only", "fuse-infer,mm", "--modes", "reduce-overhead"])
    assert (a.plan, a.modes) == ("quick", ("reduce-overhead",))
    assert [c for c in tf.CASE_IDS if tf.wanted(c, a.only)] == [
        "fuse-infer-b8",
        "fuse-infer-b64",
        *(f"mm-gelu-{m}x{n}x{k}" for m, n, k in tf.MM_SHAPES),
    ]
    assert tf.parse_args([]).modes == ("default", "reduce-overhead")
    assert tf.target_of("fuse-infer-b64") == 0.70 and tf.target_of("fuse-train") == 0.90
    assert tf.target_of("fuse-train-b128") == 0.90
    b = tf.parse_args(["--only", "fuse-train"])
    assert [c for c in tf.CASE_IDS if tf.wanted(c, b.only)] == ["fuse-train", "fuse-train-b128"]
    assert tf.target_of("compile-default-train") == tf.target_of("llm-gpt2") == 1.00
    row = {"case": "fuse-infer-b64", "torch_median_ms": 10.0, "pycudnn_median_ms": 6.0}
    line = tf.summary_line(row | {"ratio": 0.6, "unfused_ratio": 1.3})
    assert line.startswith("fuse-infer-b64: torch 10.000 ms pycudnn 6.000 ms ratio 0.600")
    assert "(target <= 0.70: met) (unfused converted 1.300)" in line
    assert "MISSED" in tf.summary_line(row | {"ratio": 0.8})
    assert tf.summary_line({"case": "llm-gpt2", "skipped": "no transformers"}) == (
        "llm-gpt2: skipped (no transformers)"
    )
