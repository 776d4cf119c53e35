"""The benchmark harness (bench/) without a GPU or torch: statistics, peaks, FLOP counts, the
A/B measurement loop against a fake timing backend, kernel-name handling, targets and reports."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness as h  # noqa: E402
from bench.cases import GPU_CASES  # noqa: E402

# -- statistics -------------------------------------------------------------------------------


def test_stats_median_min_max_and_nan_dropped() -> None:
    s = h.Stats.of([3.0, 1.0, 2.0, float("nan"), 10.0])
    assert (s.median, s.min, s.max, s.n) == (2.5, 1.0, 10.0, 4)
    assert h.Stats.from_dict(s.to_dict()) == s
    assert h.Stats.from_dict(None) is None
    with pytest.raises(ValueError):
        h.Stats.of([float("nan")])


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
    """Each callable's 'cost' is its ``__defaults__``-free attribute ``gpu`` / ``host``."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str, int]] = []
        self.syncs = 0

    def sync(self) -> None:
        self.syncs += 1

    def gpu_ms_per_call(self, fn: Any, calls: int, host_us_hint: float) -> float:
        self.log.append(("gpu", fn.name, calls))
        return fn.gpu

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


def test_measure_pair_sizes_blocks_and_reports_both_sides() -> None:
    be = FakeBackend()
    a, b = fake_fn("a", 0.5, 12.0), fake_fn("b", 0.25, 17.0)
    ra, rb = h.measure_pair(be, a, b, reps=3, host_calls=20, target_ms=3.0)
    assert ra.gpu_ms.median == 0.5 and rb.gpu_ms.median == 0.25
    assert ra.host_us.median == 12.0 and rb.host_us.median == 17.0
    # probe 3 calls each, then blocks sized from the slower side: ceil(3.0 / 0.5) = 6
    assert ra.extra["calls_per_block"] == 6
    gpu_blocks = [entry for entry in be.log if entry[0] == "gpu" and entry[2] == 6]
    assert len(gpu_blocks) == 6
    assert all(entry[2] == 20 for entry in be.log if entry[0] == "host")
    ra2, _ = h.measure_pair(be, a, b, reps=2, gpu=False)
    assert ra2.gpu_ms is None and ra2.host_us is not None


def test_calls_for_clamps() -> None:
    assert h.calls_for(0.001) == 200
    assert h.calls_for(10.0) == 5
    assert h.calls_for(0.1, target_ms=3.0) == 30
    assert h.calls_for(float("nan")) == 200


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

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = tuple(shape)

    def contiguous(self, memory_format: Any = None) -> FakeTensor:
        return self

    def double(self) -> FakeTensor:
        return self

    def __sub__(self, other: FakeTensor) -> FakeTensor:
        return FakeTensor(self.shape)

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
    torch.randn = lambda *shape, device=None, dtype=None: FakeTensor(
        shape[0] if isinstance(shape[0], tuple) else shape
    )
    torch.empty = torch.randn
    cudnn = types.SimpleNamespace(
        version=lambda: 91900, enabled=True, benchmark=False, deterministic=False, allow_tf32=True
    )
    torch.backends = types.SimpleNamespace(cudnn=cudnn)

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            self.t = 0.0

        def record(self) -> None:
            import time

            self.t = time.perf_counter()

        def synchronize(self) -> None:
            pass

        def elapsed_time(self, other: Event) -> float:
            return max((other.t - self.t) * 1e3, 1e-6)

    launched: list[str] = []
    torch.cuda = types.SimpleNamespace(
        synchronize=lambda: None,
        current_stream=lambda: types.SimpleNamespace(cuda_stream=0),
        Event=Event,
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

    torch.nn = types.SimpleNamespace(functional=types.SimpleNamespace(conv2d=conv, conv3d=conv))
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


def test_runner_child_end_to_end_with_fakes(tmp_path, monkeypatch) -> None:
    import pycudnn
    import pycudnn._loader as loader
    from bench import runner

    torch = make_fake_torch(monkeypatch)
    seen: dict[str, list] = {"conv": [], "gi": [], "gw": []}

    def fake_conv(img, kerns, border_mode="valid", subsample=(1, 1), dilation=(1, 1),
                  conv_mode="conv", num_groups=1, algo=None, *, out=None, stream=None):  # fmt: skip
        assert conv_mode == "cross" and isinstance(img, FakeTensor)
        seen["conv"].append((len(img.shape), out is not None))
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
        algo_fwd="time_once", algo_bwd_data="time_once", algo_bwd_filter="time_once",
        allow_tf32=False,
    )  # fmt: skip
    assert {"allow_tf32": True} in overrides
    # heuristic mode: items slower than torch by > 5% are retried with algo='time_once'
    path2 = tmp_path / "child2.json"
    assert runner.child_main("heuristic", str(path2), 60.0, True, "3") == 0
    res2 = json.loads(path2.read_text())
    assert [it["case"] for it in res2["items"]] == ["3", "3", "3"]
    assert "tiny" not in res2 and "cold" not in res2
    retry = res2["items"][0]["pycudnn_time_once"]
    assert retry["ratio"] is not None and "error" not in retry
    # the report copes with every kind of tiny entry (gpu_us / wall_us hold plain floats)
    res["tiny"]["gpu_us"] = {"pycudnn": 4.9, "torch": 4.9}
    assert "tiny conv" in h.render_report({"modes": {"autotune": res}})
