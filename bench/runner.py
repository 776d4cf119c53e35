"""One benchmark mode in one process: torch first, then pycudnn on the same libcudnn.

``run.py`` starts this once per mode (``heuristic``, ``autotune``) in a fresh process, because
torch keeps one plan per problem whatever ``cudnn.benchmark`` says (its v8 plan cache key has no
benchmark flag), so the two modes cannot share a process. The child writes its results as JSON
after every section, so a timeout still leaves what was measured. Each item is built, checked
and host-timed in turn; its GPU time is queued, and every queued call is timed in one nvbench
run after the last section (``bench/timing.py``: nvbench runs once per process), which fills in
the GPU times, ratios and throughput, before the engine capture.
"""

from __future__ import annotations

import contextlib
import cProfile
import json
import math
import os
import pstats
import sys
import time
import traceback
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from .cases import FUSION_CASES, GPU_CASES, Case, FusionCase, Selection
from .harness import (
    MARKER_KERNEL,
    ConvGeom,
    SideResult,
    Stats,
    alternate,
    alternate_many,
    math_mode,
    measure_sides,
    peak_tflops,
    peaks_for,
    ratio,
    split_by_marker,
    summarize_kernels,
)
from .timing import GpuQueue, TorchBackend

PY_ALGO = {"heuristic": "guess_once", "autotune": "time_once"}


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Child:
    """Everything one mode measures."""

    def __init__(
        self, mode: str, json_path: str, deadline: float, quick: bool, frontend: bool = True
    ) -> None:
        self.mode = mode
        self.json_path = json_path
        self.deadline = deadline
        self.quick = quick
        self.want_frontend = frontend
        self.fe: Any = None  # bench.frontend.Frontend when the frontend column runs
        self.result: dict[str, Any] = {"mode": mode, "items": [], "skipped": []}
        self.meta: dict[str, Any] = {}
        # (label, [pycudnn call, torch call, frontend call], tf32) of every item, for the
        # engine capture (a side that did not run has a no-op)
        self.keep: list[tuple[str, list[Callable[[], object]], bool]] = []
        # the tensors of the last build(): the frontend runs on the same inputs
        self.built: dict[str, Any] = {}

    # -- setup ----------------------------------------------------------------------------------
    def setup(self) -> None:
        import torch  # first: pycudnn must find the libcudnn torch loaded

        self.torch = torch
        tv = torch.backends.cudnn.version()
        import pycudnn
        import pycudnn._loader as loader

        self.pc = pycudnn
        pv = pycudnn.version()
        files = [
            f for f in loader.libcudnn_files_in_process() if os.path.basename(f) == "libcudnn.so.9"
        ]
        info = loader.load()
        assert pv == tv, f"pycudnn sees cuDNN {pv}, torch {tv}: not the same library"
        assert len(files) == 1, f"expected one libcudnn.so.9 mapped, found {files}"
        torch.backends.cudnn.enabled = True
        torch.backends.cudnn.benchmark = self.mode == "autotune"
        torch.backends.cudnn.deterministic = False
        torch.backends.cudnn.allow_tf32 = False
        self.stream = torch.cuda.current_stream()
        self.stream_int = int(self.stream.cuda_stream)
        self.gpu = GpuQueue(torch, quick=self.quick)  # no cuda-bench: NvbenchMissing, here
        self.backend = TorchBackend(torch, self.gpu)
        props = torch.cuda.get_device_properties(0)
        gpu = torch.cuda.get_device_name(0)
        self.peaks, peaks_source = peaks_for(gpu)
        self.meta = {
            "gpu": gpu,
            "sm_count": props.multi_processor_count,
            "gpu_mem_gib": round(props.total_memory / 2**30, 1),
            "cudnn_version": tv,
            "pycudnn_cudnn_version": pv,
            "libcudnn_path": files[0],
            "libcudnn_found_via": info.found_via,
            "torch_version": torch.__version__,
            "torch_cuda": torch.version.cuda,
            "torch_benchmark_limit": getattr(torch.backends.cudnn, "benchmark_limit", None),
            "pycudnn_version": getattr(pycudnn, "__version__", "?"),
            "python": sys.version.split()[0],
            "peaks_source": peaks_source,
            "peaks": self.peaks.__dict__,
            "stream": self.stream_int,
            "cuda_module_loading": os.environ.get("CUDA_MODULE_LOADING", "(default)"),
            "gpu_timer": self.gpu.info,
        }
        self.result["meta"] = self.meta
        log(f"{self.mode}: {gpu}, cuDNN {tv} at {files[0]} ({info.found_via})")
        self.setup_frontend(tv, loader.libcudnn_files_in_process)

    def setup_frontend(self, torch_version: int, libcudnn_files: Callable[[], list[str]]) -> None:
        """The third column: NVIDIA's cudnn-frontend (``import cudnn``), or the reason not."""
        if not self.want_frontend:
            fe_info: dict[str, Any] = {"available": False, "reason": "disabled by --no-frontend"}
        else:
            from . import frontend

            self.fe, fe_info = frontend.load(
                self.torch, torch_version, libcudnn_files, self.stream_int
            )
        self.meta["frontend"] = fe_info
        if self.fe is None:
            log(f"frontend column skipped: {fe_info.get('reason')}")
        else:
            log(
                f"frontend: cudnn {fe_info.get('version')} on cuDNN "
                f"{fe_info.get('backend_version')} (same libcudnn as torch and pycudnn)"
            )

    def flush(self) -> None:
        tmp = self.json_path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(self.result, fh, indent=1, default=str)
        os.replace(tmp, self.json_path)

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def out_of_time(self, margin: float) -> bool:
        """Whether less than *margin* seconds are left besides what the queued GPU timing needs."""
        return self.time_left() < margin + self.gpu.seconds()

    # -- tensors and calls ----------------------------------------------------------------------
    def tensor(self, shape: tuple[int, ...], dtype: str, channels_last: bool, empty: bool = False):
        torch = self.torch
        tdt = getattr(torch, dtype)
        t = (torch.empty if empty else torch.randn)(shape, device="cuda", dtype=tdt)
        if channels_last:
            fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
            t = t.contiguous(memory_format=fmt)
        return t

    def pc_fns(self, nd: int) -> tuple[Callable, Callable, Callable]:
        pc = self.pc
        if nd == 3:
            return pc.dnn_conv3d, pc.dnn_gradinput3d, pc.dnn_gradweight3d
        return pc.dnn_conv, pc.dnn_gradinput, pc.dnn_gradweight

    def build(self, g: ConvGeom, dtype: str, cl: bool, op: str, **extra: Any):
        """(pycudnn call, torch call, pycudnn result, torch result) for one op of one problem."""
        torch = self.torch
        F = torch.nn.functional
        conv, gradinput, gradweight = self.pc_fns(g.nd)
        kw = dict(
            border_mode=g.pad,
            subsample=g.stride,
            dilation=g.dilation,
            conv_mode="cross",
            num_groups=g.groups,
            stream=self.stream_int,
            **extra,
        )
        x = self.tensor(g.x_shape, dtype, cl)
        w = self.tensor(g.w_shape, dtype, cl)
        stride, pad, dil = list(g.stride), list(g.pad), list(g.dilation)
        tconv = F.conv2d if g.nd == 2 else F.conv3d
        bwd = torch.ops.aten.convolution_backward
        zeros = [0] * g.nd
        if op == "fwd":
            y = self.tensor(g.y_shape, dtype, cl, empty=True)

            def py() -> object:
                return conv(x, w, out=y, **kw)

            def th() -> object:
                return tconv(x, w, None, g.stride, g.pad, g.dilation, g.groups)

            self.built = {"x": x, "w": w, "y": y}
            return py, th, lambda: y, th
        dy = self.tensor(g.y_shape, dtype, cl)
        self.built = {"x": x, "w": w, "y": dy}
        if op == "dgrad":
            dx = self.tensor(g.x_shape, dtype, cl, empty=True)
            mask = [True, False, False]

            def py() -> object:
                return gradinput(w, dy, g.x_shape, out=dx, **kw)

            def th() -> object:
                return bwd(dy, x, w, None, stride, pad, dil, False, zeros, g.groups, mask)

            return py, th, lambda: dx, lambda: th()[0]
        if op == "wgrad":
            dw = self.tensor(g.w_shape, dtype, cl, empty=True)
            mask = [False, True, False]

            def py() -> object:
                return gradweight(x, dy, g.w_shape, out=dw, **kw)

            def th() -> object:
                return bwd(dy, x, w, None, stride, pad, dil, False, zeros, g.groups, mask)

            return py, th, lambda: dw, lambda: th()[1]
        raise ValueError(op)

    def pc_last_plan(self) -> str | None:
        """pycudnn's most recently used plan in this thread (engine index, workspace)."""
        try:
            from pycudnn.highlevel import conv as pconv

            info = pconv.last_call()
            return info.plan.describe() if info is not None else None
        except Exception as exc:  # diagnostics only
            return f"? ({type(exc).__name__})"

    def pc_cache_info(self) -> dict[str, Any] | None:
        try:
            from pycudnn.graph import _plans

            return _plans.cache_info()._asdict()
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}

    def relerr(self, a: Any, b: Any) -> float:
        a64, b64 = a.double(), b.double()
        return float((a64 - b64).norm() / max(float(b64.norm()), 1e-30))

    def math(self, tf32: bool) -> Callable[[], AbstractContextManager[None]]:
        """The math mode an item was built under, for its calls run again later (GPU timing,
        engine capture): the call caches of both libraries key on it."""

        @contextlib.contextmanager
        def ctx():
            self.torch.backends.cudnn.allow_tf32 = tf32
            try:
                with self.pc.config.override(allow_tf32=tf32):
                    yield
            finally:
                self.torch.backends.cudnn.allow_tf32 = False

        return ctx

    def first_call_ms(self, fn: Callable[[], object]) -> float:
        self.backend.sync()
        t0 = time.perf_counter()
        fn()
        self.backend.sync()
        return (time.perf_counter() - t0) * 1e3

    # -- GPU-bound cases ------------------------------------------------------------------------
    def run_case(self, case: Case) -> None:
        for op in case.ops:
            label = f"case {case.id} {op}"
            if self.out_of_time(20):
                self.result["skipped"].append(f"{label}: out of time")
                log(f"SKIP {label}: out of time")
                continue
            item: dict[str, Any] = {
                "case": case.id,
                "op": op,
                "label": case.title(),
                "dtype": case.dtype,
                "layout": case.layout,
                "math": math_mode(case.dtype, case.tf32),
                "flops": case.geom.flops(),
                "min_bytes": case.geom.min_bytes(case.itemsize),
            }
            t_item = time.perf_counter()
            py_side, th_side = SideResult(), SideResult()
            fe_side = SideResult() if self.fe is not None else None
            try:
                with self.math(case.tf32)():
                    built = self.build(case.geom, case.dtype, case.channels_last, op)
                    py, th, py_out, th_out = built
                    # first calls build (heuristic) or autotune the plans
                    try:
                        py_side.first_call_ms = self.first_call_ms(py)
                    except Exception as exc:
                        py_side.error = f"{type(exc).__name__}: {exc}"
                        log(f"{label}: pycudnn failed: {py_side.error}")
                    th_side.first_call_ms = self.first_call_ms(th)
                    fe_call = self.frontend_conv(case, op, fe_side, label)
                    if py_side.error is None:
                        item["relerr"] = self.relerr(py_out(), th_out())
                    if fe_call is not None:
                        item["relerr_frontend"] = self.relerr(fe_call.extra["result"], th_out())
                    fns = [py if py_side.error is None else None, th]
                    if fe_call is not None:
                        fns.append(fe_call.run)
                    sides = [py_side, th_side] + ([fe_side] if fe_call is not None else [])
                    names = [f"{case.id} {op} {n}" for n in ("pycudnn", "torch", "frontend")]
                    named = zip(names[: len(fns)], fns, sides, strict=True)
                    live = [(n, fn, sd) for n, fn, sd in named if fn is not None]
                    for _ in range(3):
                        for _n, fn, _sd in live:
                            fn()
                    reps = 3 if self.quick else 7
                    measure_sides(
                        self.backend,
                        [fn for _n, fn, _sd in live],
                        reps=reps,
                        host_calls=20,
                        names=[n for n, _fn, _sd in live],
                        context=self.math(case.tf32),
                        sides=[sd for _n, _fn, sd in live],
                    )
                    keep = [fn if fn is not None else _noop for fn in fns]
                    keep += [_noop] * (3 - len(keep))
                    self.keep.append((f"{case.id} {op}", keep, case.tf32))
                    if py_side.error is None:
                        py_side.extra["plan"] = self.pc_last_plan()
            except Exception as exc:
                th_side.error = th_side.error or f"{type(exc).__name__}: {exc}"
                log(f"{label}: failed: {traceback.format_exc(limit=3)}")
            item["seconds"] = round(time.perf_counter() - t_item, 2)
            self.result["items"].append(item)
            sides3 = (py_side, th_side, fe_side)
            self.finish_item(item, *sides3, log_it=False)  # the host numbers, saved now
            log(
                f"{label} {case.title()}: relerr {fmt(item.get('relerr'), '.1e')}, host us "
                f"pycudnn {fmt_stat(py_side.host_us)} torch {fmt_stat(th_side.host_us)}; GPU "
                f"time queued ({item['seconds']} s)"
            )
            self.gpu.then(lambda item=item, sides3=sides3: self.finish_item(item, *sides3))

    def finish_item(
        self,
        item: dict[str, Any],
        py_side: SideResult,
        th_side: SideResult,
        fe_side: SideResult | None,
        log_it: bool = True,
    ) -> None:
        """The item's sides and what follows from their GPU times (throughput, ratios)."""
        item["pycudnn"], item["torch"] = py_side.to_dict(), th_side.to_dict()
        if fe_side is not None:
            item["frontend"] = fe_side.to_dict()
        peak = peak_tflops(self.peaks, item["math"])
        for side, res in (("pycudnn", py_side), ("torch", th_side), ("frontend", fe_side)):
            if res is not None and res.gpu_ms:
                tf = item["flops"] / (res.gpu_ms.median * 1e-3) / 1e12
                item[f"tflops_{side}"] = tf
                item[f"pct_peak_{side}"] = 100.0 * tf / peak
                item[f"gbs_{side}"] = item["min_bytes"] / (res.gpu_ms.median * 1e-3) / 1e9
        th_ms = th_side.gpu_ms
        item["ratio"] = ratio(
            py_side.gpu_ms.median if py_side.gpu_ms else None,
            th_ms.median if th_ms else None,
        )
        item["ratio_min"] = ratio(
            py_side.gpu_ms.min if py_side.gpu_ms else None,
            th_ms.min if th_ms else None,
        )
        if fe_side is not None:
            item["ratio_frontend"] = ratio(
                fe_side.gpu_ms.median if fe_side.gpu_ms else None,
                th_ms.median if th_ms else None,
            )
        self.flush()
        if not log_it:
            return
        fe_txt = ""
        if fe_side is not None:
            fe_txt = (
                f" frontend {fmt_ms(fe_side.gpu_ms)} ({fmt(item.get('ratio_frontend'))}x, "
                f"relerr {fmt(item.get('relerr_frontend'), '.1e')})"
            )
        log(
            f"case {item['case']} {item['op']} {item['label']}: pycudnn {fmt_ms(py_side.gpu_ms)} "
            f"torch {fmt_ms(th_side.gpu_ms)} ratio {fmt(item['ratio'])} relerr "
            f"{fmt(item.get('relerr'), '.1e')}{fe_txt}"
        )

    def frontend_conv(self, case: Case, op: str, side: SideResult | None, label: str):
        """The frontend's graph for one op on the tensors of the last build(), with its own
        output buffer; None (and the error on *side*) when it cannot run."""
        if self.fe is None or side is None:
            return None
        t = self.built
        try:
            x, w, y = t["x"], t["w"], t["y"]
            empty = self.torch.empty_like
            if op == "fwd":
                out = empty(y)
                call = self.fe.conv(op, case.geom, case.dtype, case.tf32, x, w, out)
            elif op == "dgrad":
                out = empty(x)
                call = self.fe.conv(op, case.geom, case.dtype, case.tf32, out, w, y)
            else:
                out = empty(w)
                call = self.fe.conv(op, case.geom, case.dtype, case.tf32, x, out, y)
            call.extra["result"] = out
            side.first_call_ms = self.first_call_ms(call.run) + call.build_ms
            side.extra["build_ms"] = call.build_ms
            side.extra["plan"] = call.plan
            side.extra["workspace"] = call.extra.get("workspace")
            return call
        except Exception as exc:
            side.error = f"{type(exc).__name__}: {exc}"
            log(f"{label}: frontend failed: {side.error}")
            return None

    # -- (1) tiny conv: host cost per call ------------------------------------------------------
    def run_tiny(self) -> None:
        torch, pc = self.torch, self.pc
        F = torch.nn.functional
        s = self.stream_int
        x = torch.randn(1, 8, 8, 8, device="cuda")
        w = torch.randn(8, 8, 3, 3, device="cuda")
        y = torch.empty(1, 8, 8, 8, device="cuda")
        n = 300
        pool = [torch.randn(1, 8, 8, 8, device="cuda") for _ in range(n)]
        conv = pc.dnn_conv
        reps = 5 if self.quick else 9

        def py_reuse() -> object:
            return conv(x, w, border_mode=(1, 1), conv_mode="cross", out=y, stream=s)

        def th_reuse() -> object:
            return F.conv2d(x, w, None, 1, 1)

        py_reuse()
        y_ref = F.conv2d(x, w, None, 1, 1)
        tiny: dict[str, Any] = {"relerr": self.relerr(y, y_ref)}
        self.result["tiny"] = tiny

        same = [x] * n
        variants: list[tuple] = [
            (
                "reuse",
                "same x, w; pycudnn out= preallocated, stream= int; torch F.conv2d",
                lambda xi: conv(xi, w, border_mode=(1, 1), conv_mode="cross", out=y, stream=s),
                lambda xi: F.conv2d(xi, w, None, 1, 1),
                same,
            ),
            (
                "new_buffers",
                "new x every call (pool of 300), pycudnn allocates its output",
                lambda xi: conv(xi, w, border_mode=(1, 1), conv_mode="cross", stream=s),
                lambda xi: F.conv2d(xi, w, None, 1, 1),
                pool,
            ),
            (
                "new_x_out_reused",
                "new x every call, pycudnn out= preallocated",
                lambda xi: conv(xi, w, border_mode=(1, 1), conv_mode="cross", out=y, stream=s),
                lambda xi: F.conv2d(xi, w, None, 1, 1),
                pool,
            ),
            (
                "no_stream_arg",
                "as reuse, but no stream= (pycudnn follows torch's current stream)",
                lambda xi: conv(xi, w, border_mode=(1, 1), conv_mode="cross", out=y),
                lambda xi: F.conv2d(xi, w, None, 1, 1),
                same,
            ),
        ]
        variants.insert(
            2,
            (
                "alloc_only",
                "same x, no out=: pycudnn allocates its output (torch always does)",
                lambda xi: conv(xi, w, border_mode=(1, 1), conv_mode="cross", stream=s),
                lambda xi: F.conv2d(xi, w, None, 1, 1),
                same,
            ),
        )
        self.tiny_inputs = (x, w, y, pool)
        try:
            xd, wd, yd = pc.asarray(x), pc.asarray(w), pc.asarray(y)
            variants.append(
                (
                    "prewrapped",
                    "as reuse, inputs pre-wrapped once with pycudnn.asarray (no per-call interop)",
                    lambda xi: conv(
                        xd, wd, border_mode=(1, 1), conv_mode="cross", out=yd, stream=s
                    ),
                    lambda xi: F.conv2d(xi, w, None, 1, 1),
                    same,
                )
            )
        except Exception as exc:
            tiny["prewrapped_error"] = f"{type(exc).__name__}: {exc}"
        self.fe_tiny = self.frontend_tiny(x, w, tiny)
        self.measure_tiny_variants(variants, tiny, reps)
        # wall per call (2000 calls then one sync) and GPU time per call
        wall: dict[str, float] = {}
        for name, fn in (("pycudnn", py_reuse), ("torch", th_reuse)):
            self.backend.sync()
            t0 = time.perf_counter()
            for _ in range(2000):
                fn()
            self.backend.sync()
            wall[name] = (time.perf_counter() - t0) / 2000 * 1e6
        tiny["wall_us"] = wall
        a, b = SideResult(), SideResult()
        self.gpu.add([("tiny pycudnn", py_reuse, a), ("tiny torch", th_reuse, b)], None)

        def gpu_us() -> None:
            us = {n: s.gpu_ms.median * 1e3 for n, s in (("pycudnn", a), ("torch", b)) if s.gpu_ms}
            tiny["gpu_us"] = us or {"error": str(a.extra.get("gpu_error"))}

        self.gpu.then(gpu_us)
        self.interop_costs(x, tiny)
        self.profile_tiny(py_reuse, tiny)
        self.flush()

    def host_loop(self, fn: Callable[[Any], object], inputs: list[Any]) -> Callable[[], float]:
        """A timer: host µs per call of fn(x) over *inputs*, no sync inside."""

        def run() -> float:
            self.backend.sync()
            t0 = time.perf_counter()
            for xi in inputs:
                fn(xi)
            t1 = time.perf_counter()
            self.backend.sync()
            return (t1 - t0) / len(inputs) * 1e6

        return run

    def frontend_tiny(self, x: Any, w: Any, tiny: dict[str, Any]) -> dict[str, Callable]:
        """The frontend's tiny-conv variants (``reuse``, ``new_buffers``), checked against
        torch; {} when the frontend column is skipped or fails here."""
        if self.fe is None:
            return {}
        try:
            F = self.torch.nn.functional
            y_fe = self.torch.empty(1, 8, 8, 8, device="cuda")
            call, reuse, new_buffers = self.fe.tiny(x, w, y_fe)
            call.run()
            tiny["relerr_frontend"] = self.relerr(y_fe, F.conv2d(x, w, None, 1, 1))
            tiny["frontend_plan"] = call.plan
            tiny["frontend_build_ms"] = call.build_ms
            return {"reuse": reuse, "new_buffers": new_buffers}
        except Exception as exc:
            tiny["frontend_error"] = f"{type(exc).__name__}: {exc}"
            log(f"tiny frontend: {traceback.format_exc(limit=4)}")
            return {}

    def measure_tiny_variants(self, variants: list[tuple], tiny: dict[str, Any], reps: int) -> None:
        """(key, what, pycudnn fn(x), torch fn(x), inputs[, prepare]) -> tiny[key]; the
        frontend's fn(x) for the same key (``self.fe_tiny``) is timed in the same rotation."""
        host_loop = self.host_loop
        fe_fns = getattr(self, "fe_tiny", None) or {}
        for key, what, fpy, fth, inputs, *prepare in variants:
            entry: dict[str, Any] = {"what": what}
            fns = [fpy, fth] + ([fe_fns[key]] if key in fe_fns else [])
            try:
                for fn in prepare:
                    fn()
                for _ in range(2):  # warm: plans and variant packs for every pointer in the pool
                    for fn in fns:
                        host_loop(fn, inputs)()
                vals = alternate_many([host_loop(fn, inputs) for fn in fns], reps)
                entry["pycudnn"] = Stats.of(vals[0]).to_dict()
                entry["torch"] = Stats.of(vals[1]).to_dict()
                entry["ratio"] = ratio(entry["pycudnn"]["median"], entry["torch"]["median"])
                entry["ratio_min"] = ratio(entry["pycudnn"]["min"], entry["torch"]["min"])
                if len(vals) == 3:
                    entry["frontend"] = Stats.of(vals[2]).to_dict()
                    entry["ratio_frontend"] = ratio(
                        entry["frontend"]["median"], entry["torch"]["median"]
                    )
                    entry["ratio_py_frontend"] = ratio(
                        entry["pycudnn"]["median"], entry["frontend"]["median"]
                    )
            except Exception as exc:
                entry["error"] = f"{type(exc).__name__}: {exc}"
                log(f"tiny {key}: {traceback.format_exc(limit=4)}")
            tiny[key] = entry
            fe_txt = ""
            if "frontend" in entry:
                fe_txt = f", frontend {fmt(entry['frontend']['median'], '.2f')} us"
            log(
                f"(1) tiny {key}: pycudnn {fmt((entry.get('pycudnn') or {}).get('median'), '.2f')}"
                f" us, torch {fmt((entry.get('torch') or {}).get('median'), '.2f')} us{fe_txt}, "
                f"ratio {fmt(entry.get('ratio'))}"
            )

    def tiny_floor_variants(self, x: Any, w: Any, y: Any, F: Any) -> list[tuple]:
        """Diagnostics below dnn_conv: the cached plan's run() (variant-pack lookup + execute)
        and the bare cudnnBackendExecute with a prebuilt pack (pycudnn internals)."""
        try:
            from pycudnn.graph import _plans
            from pycudnn.highlevel import conv as pconv

            # the diagnostics hook: the tiny conv's cached call with out= given
            call = next(
                c
                for c in pconv.recent_calls()
                if c.problem.x_shape == (1, 8, 8, 8) and not c.staged and not c.allocates_output
            )
            ptrs = (x.data_ptr(), w.data_ptr(), y.data_ptr())
            px, pw, py_ = (ptrs[i] for i in call.perm)
            wsp = call.workspace_ptr()
            plan = call.plan
            execute = _plans.execute_function()
            hc, pc_ = plan.handle_c, plan.plan_c
            state: dict[str, Any] = {}

            def prepare() -> None:
                # fetched right before use: the pack cache evicts (and destroys) packs when
                # other pointers come by, so a pack fetched earlier may be gone
                state["pack"] = plan.pack(px, pw, py_, wsp)

            raw = self.raw_pack_executor(call, _plans, pw, py_, wsp)
            pool = self.tiny_inputs[3]
            return [
                (
                    "raw_pack_per_call",
                    "new x every call: variant pack built, executed and destroyed per call by "
                    "bare ctypes calls with prebuilt arguments (what a leaner pack path costs)",
                    raw,
                    lambda xi: F.conv2d(xi, w, None, 1, 1),
                    pool,
                ),
                (
                    "plan_run_only",
                    "pycudnn internals: cached plan.run() = variant-pack lookup + execute",
                    lambda xi: plan.run(px, pw, py_, wsp),
                    lambda xi: F.conv2d(xi, w, None, 1, 1),
                    [x] * 300,
                ),
                (
                    "execute_only",
                    "bare ctypes cudnnBackendExecute with a prebuilt variant pack (the floor)",
                    lambda xi: execute(hc, pc_, state["pack"]),
                    lambda xi: F.conv2d(xi, w, None, 1, 1),
                    [x] * 300,
                    prepare,
                ),
            ]
        except Exception as exc:
            self.result.setdefault("tiny", {})["floor_error"] = f"{type(exc).__name__}: {exc}"
            return []

    @staticmethod
    def raw_pack_executor(call: Any, _plans: Any, pw: int, py_: int, wsp: int):
        """fn(x): create, fill, finalize, execute and destroy a variant pack with bare ctypes
        calls and prebuilt arguments (forward plans, operands in x, w, y order only)."""
        import ctypes

        from pycudnn.enums import BackendAttributeName as A
        from pycudnn.enums import BackendAttributeType as T
        from pycudnn.enums import BackendDescriptorType as D
        from pycudnn.highlevel.conv._problem import UIDS

        if tuple(call.perm) != (0, 1, 2) or tuple(UIDS) != (1, 2, 3):
            raise RuntimeError(f"unexpected operand order {call.perm} / uids {UIDS}")
        create = _plans.raw_function("cudnnBackendCreateDescriptor")
        set_attr = _plans.raw_function("cudnnBackendSetAttribute")
        finalize = _plans.raw_function("cudnnBackendFinalize")
        destroy = _plans.raw_function("cudnnBackendDestroyDescriptor")
        execute = _plans.execute_function()
        c_int, c_int64, c_void_p = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p
        vp_type = c_int(int(D.VARIANT_PACK_DESCRIPTOR))
        a_uids = c_int(int(A.VARIANT_PACK_UNIQUE_IDS))
        a_ptrs = c_int(int(A.VARIANT_PACK_DATA_POINTERS))
        a_ws = c_int(int(A.VARIANT_PACK_WORKSPACE))
        t_i64, t_ptr = c_int(int(T.INT64)), c_int(int(T.VOID_PTR))
        n3, n1 = c_int64(3), c_int64(1)
        uids = (c_int64 * 3)(1, 2, 3)
        ptrs = (c_void_p * 3)(0, pw, py_)
        ws = c_void_p(wsp or None)
        desc = c_void_p()
        ref_desc, ref_ws = ctypes.byref(desc), ctypes.byref(ws)
        hc, pc_ = call.plan.handle_c, call.plan.plan_c

        def run(xi: Any) -> None:
            ptrs[0] = xi.data_ptr()
            rc = create(vp_type, ref_desc)
            if rc:
                raise RuntimeError(f"cudnnBackendCreateDescriptor: {rc}")
            try:
                rc = (
                    set_attr(desc, a_uids, t_i64, n3, uids)
                    or set_attr(desc, a_ptrs, t_ptr, n3, ptrs)
                    or set_attr(desc, a_ws, t_ptr, n1, ref_ws)
                    or finalize(desc)
                    or execute(hc, pc_, desc)
                )
            finally:
                destroy(desc)
            if rc:
                raise RuntimeError(f"raw variant pack: status {rc}")

        return run

    def run_tiny_floor(self) -> None:
        """pycudnn internals below dnn_conv (last: it calls the C API by hand)."""
        tiny = self.result.get("tiny")
        if tiny is None or not hasattr(self, "tiny_inputs"):
            return
        x, w, y, pool = self.tiny_inputs
        F = self.torch.nn.functional
        variants = self.tiny_floor_variants(x, w, y, F)
        self.measure_tiny_variants(variants, tiny, 5 if self.quick else 9)
        if variants and "raw_pack_per_call" in tiny:
            try:  # the hand-built pack computed the same convolution
                variants[0][2](pool[-1])
                self.backend.sync()
                tiny["raw_pack_relerr"] = self.relerr(y, F.conv2d(pool[-1], w, None, 1, 1))
            except Exception as exc:
                tiny["raw_pack_relerr"] = f"{type(exc).__name__}: {exc}"
        self.flush()

    def interop_costs(self, x: Any, tiny: dict[str, Any]) -> None:
        """Host cost of the zero-copy views pycudnn takes of torch tensors, per call."""
        pc, torch = self.pc, self.torch
        costs: dict[str, float] = {}
        probes: list[tuple[str, Callable[[], object]]] = [
            ("torch __cuda_array_interface__", lambda: x.__cuda_array_interface__),
            ("torch __dlpack__()", lambda: x.__dlpack__()),
            ("torch data_ptr()", lambda: x.data_ptr()),
            ("torch current_stream().cuda_stream", lambda: torch.cuda.current_stream().cuda_stream),
            ("pycudnn.asarray(torch tensor)", lambda: pc.asarray(x)),
        ]
        for name, fn in probes:
            try:
                fn()
                t0 = time.perf_counter()
                for _ in range(2000):
                    fn()
                costs[name] = (time.perf_counter() - t0) / 2000 * 1e6
            except Exception as exc:
                costs[name] = float("nan")
                tiny.setdefault("interop_errors", {})[name] = str(exc)
        tiny["interop_us"] = costs
        log("interop us/call: " + ", ".join(f"{k} {v:.2f}" for k, v in costs.items()))

    def profile_tiny(
        self, fn: Callable[[], object], tiny: dict[str, Any], calls: int = 2000
    ) -> None:
        """cProfile of the reused-buffer tiny call: where pycudnn's host time goes."""
        prof = cProfile.Profile()
        self.backend.sync()
        prof.enable()
        for _ in range(calls):
            fn()
        prof.disable()
        self.backend.sync()
        st = pstats.Stats(prof)
        rows = []
        for (file, line, func), (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
            rows.append(
                {
                    "func": f"{os.path.basename(file)}:{line}({func})",
                    "calls_per_conv": nc / calls,
                    "tottime_us": tt / calls * 1e6,
                    "cumtime_us": ct / calls * 1e6,
                }
            )
        rows.sort(key=lambda r: -r["tottime_us"])
        tiny["cprofile_top"] = rows[:20]
        total = sum(r["tottime_us"] for r in rows)
        tiny["cprofile_total_us"] = total
        log(f"cProfile of pycudnn tiny call (inflated by the profiler): {total:.1f} us/call; top:")
        for r in rows[:12]:
            log(f"   {r['tottime_us']:7.2f} us  x{r['calls_per_conv']:.1f}  {r['func']}")

    # -- (11) cold first call of a new shape ----------------------------------------------------
    def run_cold(self) -> None:
        torch, pc = self.torch, self.pc
        F = torch.nn.functional
        s = self.stream_int
        reps = 4 if self.quick else 6
        # distinct shapes never seen elsewhere in this process, one per call
        geoms = [_cold_geom(i, self.mode) for i in range(2 * reps)]

        def make(i: int):
            g = geoms[i]
            return self.tensor(g.x_shape, "float16", True), self.tensor(g.w_shape, "float16", True)

        inputs = [make(i) for i in range(2 * reps)]
        it_py = iter(range(0, 2 * reps, 2))
        it_th = iter(range(1, 2 * reps, 2))

        search_ms: list[float] = []

        def py_cold() -> float:
            x, w = inputs[next(it_py)]
            before = (self.pc_cache_info() or {}).get("search_seconds") or 0.0
            ms = self.first_call_ms(
                lambda: pc.dnn_conv(x, w, border_mode=(1, 1), conv_mode="cross", stream=s)
            )
            after = (self.pc_cache_info() or {}).get("search_seconds") or 0.0
            search_ms.append((after - before) * 1e3)
            return ms

        def th_cold() -> float:
            x, w = inputs[next(it_th)]
            return self.first_call_ms(lambda: F.conv2d(x, w, None, 1, 1))

        cold: dict[str, Any] = {
            "what": "first call of a never-seen fp16 NHWC 3x3 shape (N=8, 20x20, C=K varies), "
            "host wall time to completion incl. sync; outputs allocated by each library",
        }
        try:
            a, b = alternate(py_cold, th_cold, reps)
            cold["pycudnn_ms"], cold["torch_ms"] = Stats.of(a).to_dict(), Stats.of(b).to_dict()
            cold["pycudnn_all_ms"], cold["torch_all_ms"] = a, b
            cold["ratio"] = ratio(cold["pycudnn_ms"]["median"], cold["torch_ms"]["median"])
            cold["pycudnn_search_ms"] = search_ms
        except Exception as exc:
            cold["error"] = f"{type(exc).__name__}: {exc}"
            log(f"cold: {traceback.format_exc(limit=4)}")
        self.result["cold"] = cold
        self.flush()
        log(
            f"(11) cold: pycudnn {fmt((cold.get('pycudnn_ms') or {}).get('median'), '.2f')} ms, "
            f"torch {fmt((cold.get('torch_ms') or {}).get('median'), '.2f')} ms"
        )

    # -- (12) two shapes alternating every call -------------------------------------------------
    def run_thrash(self) -> None:
        torch, pc = self.torch, self.pc
        F = torch.nn.functional
        s = self.stream_int
        w = torch.randn(8, 8, 3, 3, device="cuda")
        xa, xb = torch.randn(1, 8, 8, 8, device="cuda"), torch.randn(1, 8, 10, 10, device="cuda")
        ya, yb = torch.empty(1, 8, 8, 8, device="cuda"), torch.empty(1, 8, 10, 10, device="cuda")
        conv = pc.dnn_conv

        def py_ab() -> None:
            conv(xa, w, border_mode=(1, 1), conv_mode="cross", out=ya, stream=s)
            conv(xb, w, border_mode=(1, 1), conv_mode="cross", out=yb, stream=s)

        def th_ab() -> None:
            F.conv2d(xa, w, None, 1, 1)
            F.conv2d(xb, w, None, 1, 1)

        thrash: dict[str, Any] = {
            "what": "fp32 NCHW tiny convs on 8x8 and 10x10 inputs, alternating every call"
        }
        try:
            for _ in range(20):
                py_ab()
                th_ab()
            reps = 5 if self.quick else 9
            a, b = alternate(
                lambda: self.backend.host_us_per_call(py_ab, 150) / 2,
                lambda: self.backend.host_us_per_call(th_ab, 150) / 2,
                reps,
            )
            thrash["pycudnn_host_us"], thrash["torch_host_us"] = (
                Stats.of(a).to_dict(),
                Stats.of(b).to_dict(),
            )
            thrash["ratio_host"] = ratio(
                thrash["pycudnn_host_us"]["median"], thrash["torch_host_us"]["median"]
            )

            def wall(fn: Callable[[], None]) -> float:
                self.backend.sync()
                t0 = time.perf_counter()
                for _ in range(500):
                    fn()
                self.backend.sync()
                return (time.perf_counter() - t0) / 1000 * 1e6

            a, b = alternate(lambda: wall(py_ab), lambda: wall(th_ab), 3)
            thrash["pycudnn_wall_us"], thrash["torch_wall_us"] = (
                Stats.of(a).to_dict(),
                Stats.of(b).to_dict(),
            )
            thrash["ratio_wall"] = ratio(
                thrash["pycudnn_wall_us"]["median"], thrash["torch_wall_us"]["median"]
            )
        except Exception as exc:
            thrash["error"] = f"{type(exc).__name__}: {exc}"
            log(f"thrash: {traceback.format_exc(limit=4)}")
        self.result["thrash"] = thrash
        self.flush()
        log(
            f"(12) thrash host us/call: pycudnn "
            f"{fmt((thrash.get('pycudnn_host_us') or {}).get('median'), '.2f')}, torch "
            f"{fmt((thrash.get('torch_host_us') or {}).get('median'), '.2f')}"
        )

    # -- fusion: conv + bias (+ z) + relu, one fused call against torch eager --------------------
    def run_fusion(self, sel: Selection) -> None:
        self.result.setdefault("fusion", [])
        for case in FUSION_CASES:
            if not sel.wants(case.id):
                continue
            if self.out_of_time(20):
                self.result["skipped"].append(f"fusion {case.id}: out of time")
                log(f"SKIP fusion {case.id}: out of time")
                continue
            self.run_fusion_case(case)

    def run_fusion_case(self, case: FusionCase) -> None:
        """torch eager ``F.relu(F.conv2d(x, w, b) (+ z))``, pycudnn ``dnn_conv(..., bias=b,
        activation='relu', z=z, out=y)``, the frontend's conv_fprop -> bias (-> add z) -> relu
        graph; each checked against a float64 reference; GPU and host time alternating."""
        torch, pc = self.torch, self.pc
        F = torch.nn.functional
        g = case.geom
        label = f"fusion {case.id}"
        item: dict[str, Any] = {
            "case": case.id,
            "op": "fused",
            "label": case.title(),
            "dtype": case.dtype,
            "layout": case.layout,
            "epilogue": case.epilogue,
            "math": math_mode(case.dtype),
            "flops": g.flops(),
        }
        t_item = time.perf_counter()
        sides = {"pycudnn": SideResult(), "torch": SideResult()}
        if self.fe is not None:
            sides["frontend"] = SideResult()
        fns: dict[str, Callable[[], object]] = {}
        outs: dict[str, Callable[[], Any]] = {}
        try:
            x = self.tensor(g.x_shape, case.dtype, True)
            w = self.tensor(g.w_shape, case.dtype, True)
            b = torch.randn(g.k, device="cuda", dtype=getattr(torch, case.dtype))
            z = self.tensor(g.y_shape, case.dtype, True) if case.residual else None
            y = self.tensor(g.y_shape, case.dtype, True, empty=True)
            stride, pad = g.stride, g.pad

            def th() -> Any:
                t = F.conv2d(x, w, b, stride, pad)
                return F.relu(t + z) if z is not None else F.relu(t)

            kw: dict[str, Any] = dict(
                border_mode=pad,
                subsample=stride,
                conv_mode="cross",
                bias=b,
                activation="relu",
                out=y,
                stream=self.stream_int,
            )
            if z is not None:
                kw["z"] = z

            def py() -> Any:
                return pc.dnn_conv(x, w, **kw)

            fns["torch"], outs["torch"] = th, th
            sides["torch"].first_call_ms = self.first_call_ms(th)
            try:
                sides["pycudnn"].first_call_ms = self.first_call_ms(py)
                fns["pycudnn"], outs["pycudnn"] = py, lambda: y
                info = self.pc_last_call_info()
                sides["pycudnn"].extra.update(info)
            except Exception as exc:
                sides["pycudnn"].error = f"{type(exc).__name__}: {exc}"
                log(f"{label}: pycudnn failed: {sides['pycudnn'].error}")
            if "frontend" in sides:
                fe_side = sides["frontend"]
                try:
                    y_fe = torch.empty_like(y)
                    b4 = b.view(1, g.k, 1, 1)
                    call = self.fe.fused(x, w, b4, z, y_fe, pad, stride, case.dtype)
                    fe_side.first_call_ms = self.first_call_ms(call.run) + call.build_ms
                    fe_side.extra.update(
                        build_ms=call.build_ms,
                        plan=call.plan,
                        workspace=call.extra.get("workspace"),
                    )
                    fns["frontend"], outs["frontend"] = call.run, lambda: y_fe
                except Exception as exc:
                    fe_side.error = f"{type(exc).__name__}: {exc}"
                    log(f"{label}: frontend failed: {fe_side.error}")
            # correctness: every side against float64 (NCHW, so torch's fp64 path is plain)
            d = [t.double().contiguous() if t is not None else None for t in (x, w, b, z)]
            benchmark = torch.backends.cudnn.benchmark
            torch.backends.cudnn.benchmark = False  # no autotuning of the fp64 reference
            try:
                ref = F.conv2d(d[0], d[1], d[2], stride, pad)
            finally:
                torch.backends.cudnn.benchmark = benchmark
            ref = F.relu(ref + d[3]) if d[3] is not None else F.relu(ref)
            for name, get in outs.items():
                item[f"relerr_{name}"] = self.relerr(get(), ref)
            if "pycudnn" in outs:
                item["relerr_pycudnn_vs_torch"] = self.relerr(y, th())
            del ref, d
            order = [n for n in ("pycudnn", "torch", "frontend") if n in fns]
            live = [fns[n] for n in order]
            for _ in range(3):
                for fn in live:
                    fn()
            reps = 3 if self.quick else 7
            measure_sides(
                self.backend,
                live,
                reps=reps,
                host_calls=20,
                names=[f"{case.id} {n}" for n in order],
                sides=[sides[n] for n in order],
            )
            self.keep.append(
                (
                    f"{case.id} fused",
                    [fns.get(n, _noop) for n in ("pycudnn", "torch", "frontend")],
                    False,
                )
            )
        except Exception as exc:
            sides["torch"].error = sides["torch"].error or f"{type(exc).__name__}: {exc}"
            log(f"{label}: failed: {traceback.format_exc(limit=3)}")
        item["seconds"] = round(time.perf_counter() - t_item, 2)
        self.result["fusion"].append(item)
        self.finish_fusion(item, sides, log_it=False)  # the host numbers, saved now
        self.gpu.then(lambda: self.finish_fusion(item, sides))

    def finish_fusion(
        self, item: dict[str, Any], sides: dict[str, SideResult], log_it: bool = True
    ) -> None:
        """The fusion item's sides and what follows from their GPU times."""
        for n, side in sides.items():
            item[n] = side.to_dict()
            if side.gpu_ms:
                item[f"tflops_{n}"] = item["flops"] / (side.gpu_ms.median * 1e-3) / 1e12
        th_ms = sides["torch"].gpu_ms.median if sides["torch"].gpu_ms else None
        for n in ("pycudnn", "frontend"):
            side = sides.get(n)
            if side is not None:
                key = "ratio" if n == "pycudnn" else "ratio_frontend"
                item[key] = ratio(side.gpu_ms.median if side.gpu_ms else None, th_ms)
        self.flush()
        if not log_it:
            return
        fe = sides.get("frontend")
        fe_txt = ""
        if fe is not None:
            fe_txt = f" frontend {fmt_ms(fe.gpu_ms)} ({fmt(item.get('ratio_frontend'))}x)"
        log(
            f"fusion {item['case']} {item['label']}: pycudnn {fmt_ms(sides['pycudnn'].gpu_ms)} "
            f"torch {fmt_ms(sides['torch'].gpu_ms)} ratio {fmt(item.get('ratio'))}{fe_txt} fused "
            f"{sides['pycudnn'].extra.get('fused')} relerr py "
            f"{fmt(item.get('relerr_pycudnn'), '.1e')}"
        )

    def pc_last_call_info(self) -> dict[str, Any]:
        """pycudnn's last cached call: ``plan`` (describe()), ``fused`` (``CallInfo.fused``:
        one fused graph ran it, else separate steps; the plan's ``fused`` where the call info
        has none) and ``epilogue``. The engine capture's kernel count tells as well."""
        out: dict[str, Any] = {"plan": None, "fused": None}
        try:
            from pycudnn.highlevel import conv as pconv

            info = pconv.last_call()
            if info is None:
                return out
            plan = info.plan
            out["plan"] = plan.describe()
            # CallInfo.fused: one fused graph ran the epilogue; else the plan's own flag
            fused = getattr(info, "fused", None)
            if fused is None:
                fused = getattr(plan, "fused", None)
            out["fused"] = None if fused is None else bool(fused)
            out["epilogue"] = getattr(info, "epilogue", None)
        except Exception as exc:  # diagnostics only
            out["plan"] = f"? ({type(exc).__name__}: {exc})"
        return out

    # -- engines: kernel names of one call of each side, from the torch profiler ---------------
    def capture_engines(self) -> None:
        if not self.keep:
            return
        torch = self.torch
        from torch.profiler import ProfilerActivity, profile

        sides = ("pycudnn", "torch", "frontend")
        try:
            self.backend.sync()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _label, fns, tf32 in self.keep:
                    with self.math(tf32)():  # the same math mode as when timed
                        for fn in fns:
                            torch.cuda._sleep(1)  # a marker kernel between the calls, not a timer
                            try:
                                fn()
                            except Exception:
                                pass
                torch.cuda._sleep(1)
                self.backend.sync()
            kernels = _kernel_events(prof)
            segments = split_by_marker(kernels, MARKER_KERNEL)
            by_label = {}
            at = 0
            for label, fns, _tf32 in self.keep:
                by_label[label] = [
                    segments[at + j] if at + j < len(segments) else [] for j in range(len(fns))
                ]
                at += len(fns)
            for item in self.result["items"] + self.result.get("fusion", []):
                segs = by_label.get(f"{item['case']} {item['op']}")
                if not segs:
                    continue
                for side, seg in zip(sides, segs, strict=False):
                    if isinstance(item.get(side), dict):
                        item[side]["engine"] = summarize_kernels(seg)
                        item[side]["kernels"] = list(seg)  # full names
                        item[side]["n_kernels"] = len(seg)
            self.result["engine_capture"] = f"{len(kernels)} kernels, {len(segments)} segments"
        except Exception as exc:
            self.result["engine_capture"] = f"failed: {type(exc).__name__}: {exc}"
            log(f"engine capture: {traceback.format_exc(limit=4)}")
        self.flush()

    # -- main -----------------------------------------------------------------------------------
    def run(self, sel: Selection | set[str] | None) -> None:
        if not isinstance(sel, Selection):  # a plain set of case ids (older callers)
            sel = Selection.parse(",".join(sorted(sel)) if sel else None, None)
        t0 = time.perf_counter()
        self.setup()
        self.flush()
        algo = PY_ALGO[self.mode]
        with self.pc.config.override(
            algo_fwd=algo, algo_bwd_data=algo, algo_bwd_filter=algo, allow_tf32=False
        ):
            if sel.wants("1"):
                self.section("tiny", self.run_tiny)
                # pycudnn internals below dnn_conv; before the profiler runs (CUPTI, once
                # attached, slows every later launch), after the tiny results are saved
                with self.pc.config.override(algo_fwd="guess_once"):
                    self.section("tiny_floor", self.run_tiny_floor)
            if sel.wants("11"):
                self.section("cold", self.run_cold)
            if sel.wants("12"):
                self.section("thrash", self.run_thrash)
            # fusion (issue 13) before the conv cases: a tight budget skips the latter first
            if sel.wants_any("fusion"):
                self.section("fusion", lambda: self.run_fusion(sel))
            for case in GPU_CASES:
                if sel.wants(case.id):
                    self.run_case(case)
            # every queued GPU time in one nvbench run; before the profiler (CUPTI) attaches
            self.section("gpu", lambda: self.gpu.run(self.time_left() - 10), reserve=False)
            self.section("engines", self.capture_engines)
        self.result["pycudnn_plan_cache"] = self.pc_cache_info()
        self.result["seconds"] = round(time.perf_counter() - t0, 1)
        self.flush()
        log(f"{self.mode}: done in {self.result['seconds']} s")

    def section(self, name: str, fn: Callable[[], object], reserve: bool = True) -> None:
        if self.out_of_time(15) if reserve else self.time_left() < 15:
            self.result["skipped"].append(f"{name}: out of time")
            return
        try:
            fn()
        except Exception as exc:
            self.result.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"
            log(f"{name} failed: {traceback.format_exc(limit=5)}")
            self.flush()


def _noop() -> None:
    return None


def _cold_geom(i: int, mode: str) -> ConvGeom:
    base = 24 if mode == "heuristic" else 28  # each mode has its own process; shapes differ anyway
    c = base + 8 * i
    return ConvGeom(8, c, c, (20, 20), (3, 3), (1, 1), (1, 1), (1, 1))


def _kernel_events(prof: Any) -> list[tuple[float, str]]:
    """(start, name) of every GPU kernel the profiler recorded."""
    out: list[tuple[float, str]] = []
    try:
        for ev in prof.profiler.kineto_results.events():
            if "cuda" in str(ev.device_type()).lower():
                start = ev.start_ns() if hasattr(ev, "start_ns") else ev.start_us() * 1e3
                out.append((float(start), ev.name()))
    except Exception:
        out = []
    if not out:
        for ev in prof.events():
            if "cuda" in str(getattr(ev, "device_type", "")).lower():
                out.append((float(ev.time_range.start), ev.name))
    return out


def fmt(v: float | None, spec: str = ".3f") -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def fmt_ms(s: Stats | None) -> str:
    if s is None:
        return "n/a"
    return f"{s.median:.4f} ms" + ("" if s.iqr is None else f" (IQR {s.iqr:.4f})")


def fmt_stat(s: Stats | None, spec: str = ".1f") -> str:
    return "n/a" if s is None else format(s.median, spec)


def child_main(
    mode: str,
    json_path: str,
    budget_s: float,
    quick: bool,
    cases: str | None,
    only: str | None = None,
    frontend: bool = True,
) -> int:
    deadline = time.monotonic() + budget_s
    child = Child(mode, json_path, deadline, quick, frontend=frontend)
    try:
        child.run(Selection.parse(cases, only))
    except Exception as exc:
        child.result["error"] = f"{type(exc).__name__}: {exc}"
        child.result["traceback"] = traceback.format_exc()
        log(f"{mode} failed: {traceback.format_exc()}")
        child.flush()
        return 1
    return 0
