"""pycudnn vs PyTorch (and NVIDIA's cudnn-frontend) on the transformer operations: scaled
dot-product attention, matmul (plain and fused with bias + GELU) and layer / RMS norm.

Run on the GPU machine from the repository root::

    PYTHONPATH=.:/tmp/site python3 bench/transformer.py [--quick] [--only sdpa,matmul,norm]
        [--no-frontend] [--json FILE]

Everything runs on torch's current stream (pycudnn gets it as ``stream=``, the frontend's handle
is set to it) and on the one libcudnn torch loaded. Method, as in ``bench/ops.py``:

* Every pycudnn result is first checked against torch's (relative error = max |mine - ref| /
  max |ref|, printed); a failing check marks the case FAIL (it is still timed, but left out of
  the target ratios) and the run goes on. Every case is wrapped, so an exception prints its text
  and the next case runs.
* GPU ms = median (and IQR) per call of nvbench's cold measurement (``cuda-bench``, see
  ``bench/timing.py``): every case's calls are queued and timed in one nvbench run at the end,
  after which the ratios and each case's line are printed.
* Host us per call = wall time of n back-to-back calls / n with the GPU idle at start
  (``TorchBackend.host_us_per_call``), repetitions alternating between the sides.

SDPA (``sdpa``): (B, H, S, D) in {(8,16,1024,64), (4,32,4096,128), (1,16,8192,128)} x causal or
not, bf16 and fp16 (``--quick``: bf16, first two shapes). Peers: ``F.scaled_dot_product_attention``
under ``sdpa_kernel`` with FLASH_ATTENTION, EFFICIENT_ATTENTION and CUDNN_ATTENTION (the context
is entered inside each timed call), the frontend's pygraph SDPA (forward, inference: built once,
timed call = ``graph.execute(pack, workspace)``), and ``pycudnn.dnn_sdpa`` (forward with
``training=False, out=``). Forward+backward: torch via autograd (``torch.autograd.grad(out,
(q, k, v), dout)``, the same backward as ``out.backward(dout)`` without accumulating into
``.grad``), pycudnn ``dnn_sdpa(training=True)`` + ``dnn_sdpa_grad``; the frontend column is
forward only. FLOPs: forward 4*B*H*S*S*D (halved when causal), backward 2.5x forward. Reference
for the errors: torch's math backend in float32 on the smallest shape, the torch cuDNN backend's
result (its autograd grads for the backward) on the larger ones. ``host``: a tiny (1,1,128,64)
bf16 SDPA, host us per call for torch default, torch cudnn / flash backends (context entered
outside the loop), frontend execute (prebuilt variant pack and workspace) and pycudnn with and
without ``out=``.

matmul (``matmul``): bf16 (M,N,K) in {(8192,4096,4096), (4096,4096,16384), (2048,1024,1024)}:
``dnn_matmul(a, b, out=)`` vs ``torch.matmul(a, b)``, and fused ``dnn_matmul(x, w.t(),
bias=bias, activation='gelu', out=)`` vs eager ``F.gelu(F.linear(x, w, bias))`` (erf GELU on
both; ``w.t()`` is a strided view). TFLOP/s counts 2*M*N*K.

norms (``norm``): bf16 (rows, hidden) in {(8192,4096), (32768,1024)}: ``dnn_layer_norm`` /
``dnn_rms_norm`` (training, ``out=``) vs ``F.layer_norm`` / ``F.rms_norm``; backward
``dnn_layer_norm_grad`` / ``dnn_rms_norm_grad`` vs ``torch.autograd.grad`` of a prebuilt torch
graph (retain_graph) w.r.t. (x, gamma[, beta]). GB/s counts the bytes each call must read and
write once (x/dy/dx/y, the parameters and their grads, the float32 row statistics); % is of the
datasheet memory bandwidth (``peaks_for``).

The summary block at the end gives the median pycudnn/best-torch and worst pycudnn/torch-cudnn
SDPA GPU ratios, the tiny SDPA host us of pycudnn vs the frontend, the matmul and norm medians,
and one ``targets:`` line per target with MET / MISSED.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import Stats, alternate_many, measure_sides, peaks_for, ratio  # noqa: E402
from bench.timing import GpuQueue, NvbenchMissing, TorchBackend  # noqa: E402

GROUPS = ("sdpa", "host", "matmul", "norm")
_null = contextlib.nullcontext
SDPA_SHAPES = ((8, 16, 1024, 64), (4, 32, 4096, 128), (1, 16, 8192, 128))
TORCH_SDPA = ("flash", "efficient", "cudnn")
MATMUL_SHAPES = ((8192, 4096, 4096), (4096, 4096, 16384), (2048, 1024, 1024))
NORM_SHAPES = ((8192, 4096), (32768, 1024))

TOL_SDPA_FWD = 2e-2
TOL_SDPA_BWD = 5e-2
TOL_MATMUL = 2e-2
TOL_NORM = 2e-2
TOL_NORM_BWD = 5e-2

GOAL_SDPA_MEDIAN = 1.00  # pycudnn <= best torch backend, median case
GOAL_SDPA_WORST = 1.05  # no case above 1.05x torch's cuDNN backend
GOAL_SDPA_HOST = 0.50  # tiny SDPA host us <= 0.5x the frontend's
GOAL_FUSED = 0.90  # matmul+bias+gelu <= 0.9x torch eager, median over shapes
GOAL_NORM = 1.00  # norms <= torch, median case


def log(msg: str) -> None:
    print(f"[transformer {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _err_text(exc: BaseException, width: int = 300) -> str:
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _median(vals: list[float]) -> float | None:
    return statistics.median(vals) if vals else None


def _f(v: float | None, spec: str = ".3f") -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def _verdict(v: float | None, goal: float) -> str:
    return "NOT MEASURED" if v is None else ("MET" if v <= goal else "MISSED")


class Bench:
    """Shared state: torch, pycudnn, the timing backend, the frontend (or None), the results."""

    def __init__(self, quick: bool, want_frontend: bool) -> None:
        import torch  # first: pycudnn must find the libcudnn torch loaded

        self.torch = torch
        self.F = torch.nn.functional
        torch.backends.cudnn.enabled = True
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        import pycudnn
        import pycudnn._loader as loader

        self.pc = pycudnn
        self.quick = quick
        self.reps = 3 if quick else 5
        self.queue = GpuQueue(torch, quick=quick)
        self.backend = TorchBackend(torch, self.queue)
        self.s = int(torch.cuda.current_stream().cuda_stream)
        gpu = torch.cuda.get_device_name()
        self.peaks, how = peaks_for(gpu)
        tv = torch.backends.cudnn.version()
        self.meta: dict[str, Any] = {
            "gpu": gpu,
            "peaks": how,
            "mem_tbs": self.peaks.mem_tbs,
            "bf16_tflops": self.peaks.bf16,
            "torch": torch.__version__,
            "cudnn_torch": tv,
            "cudnn_pycudnn": pycudnn.version(raises=False),
            "pycudnn": getattr(pycudnn, "__version__", "?"),
            "stream": self.s,
            "quick": quick,
            "gpu_timer": self.queue.info,
            "matmul_bf16_reduced_precision_reduction": bool(
                torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
            ),
        }
        try:
            self.meta["libcudnn"] = pycudnn.library_info().path
        except Exception as exc:
            self.meta["libcudnn"] = _err_text(exc)
        log(
            f"{gpu}; torch {torch.__version__}; cuDNN torch {tv} pycudnn "
            f"{self.meta['cudnn_pycudnn']}; peaks {how}"
        )
        self.fe: Any = None
        if want_frontend:
            from bench import frontend

            self.fe, fe_info = frontend.load(torch, tv, loader.libcudnn_files_in_process, self.s)
        else:
            fe_info = {"available": False, "reason": "disabled by --no-frontend"}
        self.meta["frontend"] = fe_info
        if self.fe is None:
            log(f"frontend column skipped: {fe_info.get('reason')}")
        else:
            log(
                f"frontend: cudnn {fe_info.get('version')} on cuDNN "
                f"{fe_info.get('backend_version')}"
            )
        self.results: dict[str, Any] = {
            "meta": self.meta,
            "sdpa": [],
            "host": {},
            "matmul": [],
            "norm": [],
        }

    # -- helpers --------------------------------------------------------------------------------
    def t(self, x: Any) -> Any:
        """A torch tensor view of a pycudnn result (DLPack), or x itself."""
        return x if isinstance(x, self.torch.Tensor) else self.torch.from_dlpack(x)

    def relerr(self, mine: Any, ref: Any) -> float:
        a, b = self.t(mine).float(), self.t(ref).float()
        if a.shape != b.shape:
            if a.numel() != b.numel():
                raise ValueError(f"shape {tuple(a.shape)} vs reference {tuple(b.shape)}")
            a = a.reshape(b.shape)
        d = (a - b).abs().max().item()
        s = b.abs().max().item()
        return d / s if s > 0 else d

    def relerr_many(self, mine: Any, refs: Any) -> float:
        return max(self.relerr(m, r) for m, r in zip(mine, refs, strict=True))

    def time_sides(
        self,
        fns: dict[str, Callable[[], object]],
        label: str,
        then: Callable[[dict[str, dict[str, Any]]], None],
        host_calls: int = 3,
        warm: int = 2,
    ) -> None:
        """Host us per call of every side now, alternating; GPU ms queued. After the queue's
        one nvbench run, *then* gets {side: {"gpu_ms", "gpu_iqr_ms", "gpu_ms_min", "host_us"}}
        (a side without a GPU time: {"gpu_error"}). Errors before the queue raise through."""
        if not fns:
            return
        for fn in fns.values():
            for _ in range(warm):
                fn()
        self.backend.sync()
        res = measure_sides(
            self.backend,
            list(fns.values()),
            reps=self.reps,
            host_calls=host_calls,
            names=[f"{label} {n}" for n in fns],
        )

        def done() -> None:
            out: dict[str, dict[str, Any]] = {}
            for name, r in zip(fns, res, strict=True):
                if r.gpu_ms is None:
                    out[name] = {"gpu_error": str(r.extra.get("gpu_error"))}
                    continue
                out[name] = {
                    "gpu_ms": r.gpu_ms.median,
                    "gpu_iqr_ms": r.gpu_ms.iqr,
                    "gpu_ms_min": r.gpu_ms.min,
                    "host_us": r.host_us.median if r.host_us else None,
                }
            then(out)

        self.queue.then(done)

    def done_case(self) -> None:
        self.backend.sync()
        self.torch.cuda.empty_cache()

    # ==========================================================================================
    # SDPA
    # ==========================================================================================
    def sdpa_backends(self) -> dict[str, Any]:
        from torch.nn.attention import SDPBackend

        return {
            "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION,
            "math": SDPBackend.MATH,
        }

    def torch_sdpa_fns(
        self,
        kind: Any,
        q: Any,
        k: Any,
        v: Any,
        qr: Any,
        kr: Any,
        vr: Any,
        dout: Any,
        causal: bool,
        scale: float,
    ) -> tuple[Callable, Callable]:
        from torch.nn.attention import sdpa_kernel

        F, torch = self.F, self.torch

        def fwd() -> Any:
            with sdpa_kernel(kind):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)

        def fwdbwd() -> Any:
            with sdpa_kernel(kind):
                o = F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal, scale=scale)
            return torch.autograd.grad(o, (qr, kr, vr), dout)

        return fwd, fwdbwd

    def frontend_sdpa(self, q: Any, k: Any, v: Any, o: Any, causal: bool, scale: float) -> Any:
        """The frontend's inference SDPA graph on (q, k, v) -> o, built once (FeCall)."""
        fe = self.fe
        g = fe.new_graph(q)
        Q, K, V = fe.tensor(g, "Q", q), fe.tensor(g, "K", k), fe.tensor(g, "V", v)
        kw = dict(name="sdpa", q=Q, k=K, v=V, attn_scale=scale, use_causal_mask=causal)
        try:
            o_t, _stats = g.sdpa(is_inference=True, **kw)
        except TypeError:  # newer frontends: generate_stats replaces is_inference
            o_t, _stats = g.sdpa(generate_stats=False, **kw)
        o_t.set_output(True).set_dim(list(o.shape)).set_stride(list(o.stride()))
        call = fe.finish(g, {Q: q, K: k, V: v, o_t: o}, [])
        call.extra["out"] = o_t
        return call

    def sdpa_case(
        self, dtype: str, shape: tuple[int, int, int, int], causal: bool, math_ref: bool
    ) -> dict[str, Any]:
        torch, F, pc, s = self.torch, self.F, self.pc, self.s
        B, H, S, D = shape
        dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
        label = f"SDPA {dtype} B{B} H{H} S{S} D{D} causal={int(causal)}"
        flops = 4.0 * B * H * S * S * D / (2 if causal else 1)
        item: dict[str, Any] = {
            "case": label,
            "dtype": dtype,
            "shape": list(shape),
            "causal": causal,
            "flops_fwd": flops,
            "flops_fwdbwd": 3.5 * flops,
            "sides": {},
        }
        sides: dict[str, dict[str, Any]] = item["sides"]
        scale = 1.0 / math.sqrt(D)
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=dt) for _ in range(3))
        dout = torch.randn(B, H, S, D, device="cuda", dtype=dt)
        qr, kr, vr = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        kinds = self.sdpa_backends()

        # -- reference ----------------------------------------------------------------------
        from torch.nn.attention import sdpa_kernel

        ref_src = "math fp32" if math_ref else "torch cudnn backend"
        try:
            if math_ref:
                qf, kf, vf = (t.detach().float().requires_grad_(True) for t in (q, k, v))
                with sdpa_kernel(kinds["math"]):
                    of = F.scaled_dot_product_attention(qf, kf, vf, is_causal=causal, scale=scale)
                ref_g = torch.autograd.grad(of, (qf, kf, vf), dout.float())
                ref_o = of.detach()
                del qf, kf, vf, of
            else:
                ref_o, ref_g = None, None
                for name in ("cudnn", "flash"):
                    try:
                        fwd, fb = self.torch_sdpa_fns(
                            kinds[name], q, k, v, qr, kr, vr, dout, causal, scale
                        )
                        ref_o, ref_g = fwd(), fb()
                        ref_src = f"torch {name} backend"
                        break
                    except Exception as exc:
                        item[f"ref_{name}_error"] = _err_text(exc)
                if ref_o is None:
                    raise RuntimeError("no torch backend for the reference")
        except Exception as exc:
            item["ref_error"] = _err_text(exc)
            ref_o, ref_g, ref_src = None, None, "none"
        item["ref"] = ref_src

        # -- build and check every side -----------------------------------------------------
        fwd_fns: dict[str, Callable[[], object]] = {}
        fb_fns: dict[str, Callable[[], object]] = {}
        for name in TORCH_SDPA:
            side: dict[str, Any] = {}
            sides[name] = side
            fwd, fb = self.torch_sdpa_fns(kinds[name], q, k, v, qr, kr, vr, dout, causal, scale)
            try:
                o = fwd()
                if ref_o is not None:
                    side["err_fwd"] = self.relerr(o, ref_o)
                fwd_fns[name] = fwd
            except Exception as exc:
                side["error"] = _err_text(exc)
                continue
            try:
                g = fb()
                if ref_g is not None:
                    side["err_bwd"] = self.relerr_many(g, ref_g)
                fb_fns[name] = fb
            except Exception as exc:
                side["error_bwd"] = _err_text(exc)
            del o

        fe_side: dict[str, Any] = {}
        sides["frontend"] = fe_side
        if self.fe is None:
            fe_side["error"] = "frontend skipped: " + str(self.meta["frontend"].get("reason"))
        else:
            try:
                o_fe = torch.empty_like(q)
                call = self.frontend_sdpa(q, k, v, o_fe, causal, scale)
                call.run()
                fe_side["plan"] = call.plan
                fe_side["build_ms"] = call.build_ms
                if ref_o is not None:
                    fe_side["err_fwd"] = self.relerr(o_fe, ref_o)
                fwd_fns["frontend"] = call.run
            except Exception as exc:
                fe_side["error"] = _err_text(exc)
            fe_side["error_bwd"] = "not measured (frontend column is forward only)"

        py: dict[str, Any] = {}
        sides["pycudnn"] = py
        ok = True
        o_py = torch.empty_like(q)

        def py_fwd() -> Any:
            return pc.dnn_sdpa(
                q, k, v, is_causal=causal, scale=scale, training=False, out=o_py, stream=s
            )

        def py_fb() -> Any:
            o, st = pc.dnn_sdpa(q, k, v, is_causal=causal, scale=scale, training=True, stream=s)
            return pc.dnn_sdpa_grad(q, k, v, o, dout, st, is_causal=causal, scale=scale, stream=s)

        try:
            py_fwd()
            if ref_o is not None:
                py["err_fwd"] = self.relerr(o_py, ref_o)
                ok = ok and py["err_fwd"] <= TOL_SDPA_FWD
            fwd_fns["pycudnn"] = py_fwd
        except Exception as exc:
            py["error"] = _err_text(exc)
            ok = False
        try:
            o_tr, st = pc.dnn_sdpa(q, k, v, is_causal=causal, scale=scale, training=True, stream=s)
            st_t = self.t(st)
            py["stats"] = f"{tuple(st_t.shape)} {str(st_t.dtype).removeprefix('torch.')}"
            if ref_o is not None:
                py["err_fwd_training"] = self.relerr(o_tr, ref_o)
                ok = ok and py["err_fwd_training"] <= TOL_SDPA_FWD
            grads = pc.dnn_sdpa_grad(
                q, k, v, o_tr, dout, st, is_causal=causal, scale=scale, stream=s
            )
            if ref_g is not None:
                py["err_bwd"] = self.relerr_many(grads, ref_g)
                ok = ok and py["err_bwd"] <= TOL_SDPA_BWD
            del o_tr, st, st_t, grads
            fb_fns["pycudnn"] = py_fb
        except Exception as exc:
            py["error_bwd"] = _err_text(exc)
            ok = False
        if ref_o is None:
            ok = False
        item["check"] = "ok" if ok else "FAIL"
        self.backend.sync()

        # -- time: host now, GPU in the one nvbench run at the end; ratios and the line after
        for phase, fns in (("fwd", fwd_fns), ("fwdbwd", fb_fns)):
            fl = item["flops_fwd"] if phase == "fwd" else item["flops_fwdbwd"]

            def got(timed: dict[str, dict[str, Any]], phase: str = phase, fl: float = fl) -> None:
                for name, r in timed.items():
                    if "gpu_ms" not in r:
                        sides[name]["time_error"] = r["gpu_error"]
                        continue
                    sides[name][f"{phase}_ms"] = r["gpu_ms"]
                    sides[name][f"{phase}_iqr_ms"] = r["gpu_iqr_ms"]
                    sides[name][f"{phase}_ms_min"] = r["gpu_ms_min"]
                    sides[name][f"{phase}_tflops"] = fl / (r["gpu_ms"] * 1e-3) / 1e12

            try:
                self.time_sides(fns, f"{label} {phase}", got)
            except Exception as exc:
                item[f"time_error_{phase}"] = _err_text(exc)
                log(f"{label} {phase}: timing failed: {traceback.format_exc(limit=3)}")
        self.queue.then(lambda: self.sdpa_ratios(item))
        return item

    def sdpa_ratios(self, item: dict[str, Any]) -> None:
        """An SDPA case's ratios from its GPU times, and its line."""
        sides = item["sides"]
        py, fe_side = sides["pycudnn"], sides["frontend"]
        for phase in ("fwd", "fwdbwd"):
            mine = py.get(f"{phase}_ms")
            torch_ms = [sides[n].get(f"{phase}_ms") for n in TORCH_SDPA]
            best = min((m for m in torch_ms if m), default=None)
            item[f"best_torch_{phase}"] = next(
                (n for n in TORCH_SDPA if best and sides[n].get(f"{phase}_ms") == best), None
            )
            item[f"ratio_best_{phase}"] = ratio(mine, best)
            item[f"ratio_cudnn_{phase}"] = ratio(mine, sides["cudnn"].get(f"{phase}_ms"))
            if phase == "fwd":
                item["ratio_frontend_fwd"] = ratio(mine, fe_side.get("fwd_ms"))
        log(self.sdpa_line(item))

    @staticmethod
    def sdpa_line(it: dict[str, Any]) -> str:
        parts = [f"{it['case']}:"]
        for name in (*TORCH_SDPA, "frontend", "pycudnn"):
            sd = it["sides"].get(name) or {}
            if "fwd_ms" not in sd:
                why = sd.get("error") or sd.get("time_error") or it.get("time_error_fwd") or "?"
                parts.append(f"| {name} n/a ({why[:160]})")
                continue
            txt = (
                f"| {name} fwd {sd['fwd_ms']:.3f} ms (IQR {sd['fwd_iqr_ms']:.3f}, "
                f"{sd['fwd_tflops']:.0f} TF/s)"
            )
            if "fwdbwd_ms" in sd:
                txt += (
                    f" fwd+bwd {sd['fwdbwd_ms']:.3f} ms (IQR {sd['fwdbwd_iqr_ms']:.3f}, "
                    f"{sd['fwdbwd_tflops']:.0f} TF/s)"
                )
            elif name != "frontend":
                why = sd.get("error_bwd") or it.get("time_error_fwdbwd") or "?"
                txt += f" fwd+bwd n/a ({why[:120]})"
            txt += f" err {_f(sd.get('err_fwd'), '.1e')}"
            if "err_bwd" in sd:
                txt += f"/{sd['err_bwd']:.1e}"
            parts.append(txt)
        parts.append(
            f"|| py/best fwd {_f(it.get('ratio_best_fwd'))} ({it.get('best_torch_fwd') or '-'})"
            f" fwd+bwd {_f(it.get('ratio_best_fwdbwd'))} ({it.get('best_torch_fwdbwd') or '-'})"
            f"; py/cudnn fwd {_f(it.get('ratio_cudnn_fwd'))} fwd+bwd "
            f"{_f(it.get('ratio_cudnn_fwdbwd'))}; py/fe fwd {_f(it.get('ratio_frontend_fwd'))}"
            f"; ref {it.get('ref')}; check {it.get('check')}"
        )
        return " ".join(parts)

    def run_sdpa(self) -> None:
        dtypes = ("bf16",) if self.quick else ("bf16", "fp16")
        shapes = SDPA_SHAPES[:2] if self.quick else SDPA_SHAPES
        for dtype in dtypes:
            for shape in shapes:
                for causal in (False, True):
                    label = f"SDPA {dtype} {shape} causal={int(causal)}"
                    try:  # its line is printed once the GPU times are in
                        it = self.sdpa_case(dtype, shape, causal, shape == SDPA_SHAPES[0])
                    except Exception as exc:
                        it = {"case": label, "error": _err_text(exc), "check": "FAIL"}
                        log(f"{label}: ERROR {it['error']}\n{traceback.format_exc(limit=4)}")
                    self.results["sdpa"].append(it)
                    self.done_case()

    # -- tiny SDPA: host us per call ------------------------------------------------------------
    def run_host(self) -> None:
        torch, F, pc, s = self.torch, self.F, self.pc, self.s
        from torch.nn.attention import sdpa_kernel

        kinds = self.sdpa_backends()
        shape = (1, 1, 128, 64)
        res: dict[str, Any] = {"shape": list(shape), "dtype": "bf16", "sides": {}}
        self.results["host"] = res
        n = 200
        reps = 5 if self.quick else 9
        res["calls"], res["reps"] = n, reps
        try:
            q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            o_py = torch.empty_like(q)
            o_fe = torch.empty_like(q)
            scale = 1.0 / math.sqrt(shape[-1])
            ref = F.scaled_dot_product_attention(q, k, v)

            def th() -> Any:
                return F.scaled_dot_product_attention(q, k, v)

            # (name, fn, context entered around the whole timed loop, output to check)
            variants: list[tuple[str, Callable[[], object], Callable[[], Any], Any]] = [
                ("torch_default", th, contextlib.nullcontext, None),
                ("torch_cudnn", th, lambda: sdpa_kernel(kinds["cudnn"]), None),
                ("torch_flash", th, lambda: sdpa_kernel(kinds["flash"]), None),
            ]
            if self.fe is not None:
                try:
                    call = self.frontend_sdpa(q, k, v, o_fe, False, scale)
                    res["frontend_plan"] = call.plan
                    variants.append(("frontend", call.run, contextlib.nullcontext, o_fe))
                except Exception as exc:
                    res["sides"]["frontend"] = {"error": _err_text(exc)}
            else:
                res["sides"]["frontend"] = {"error": str(self.meta["frontend"].get("reason"))}
            variants += [
                (
                    "pycudnn_out",
                    lambda: pc.dnn_sdpa(q, k, v, out=o_py, stream=s),
                    contextlib.nullcontext,
                    o_py,
                ),
                ("pycudnn", lambda: pc.dnn_sdpa(q, k, v, stream=s), contextlib.nullcontext, None),
            ]
            try:  # cuDNN's own share: the bare execute of the plan pycudnn's out= call runs
                variants.append(("cudnn_execute", self._bare_execute(q, k, v, o_py), _null, o_py))
            except Exception as exc:
                res["sides"]["cudnn_execute"] = {"error": _err_text(exc)}
            timers = []
            names = []
            for name, fn, ctx, out in variants:
                side: dict[str, Any] = {}
                res["sides"][name] = side
                try:
                    with ctx():
                        got = fn()
                        for _ in range(20):
                            fn()
                    self.backend.sync()
                    side["relerr"] = self.relerr(out if out is not None else got, ref)
                    if name.startswith("pycudnn") and side["relerr"] > TOL_SDPA_FWD:
                        side["check"] = "FAIL"
                except Exception as exc:
                    side["error"] = _err_text(exc)
                    continue
                timers.append(self._host_timer(fn, ctx, n))
                names.append(name)
            vals = alternate_many(timers, reps)
            for name, vv in zip(names, vals, strict=True):
                st = Stats.of(vv)
                res["sides"][name].update({"host_us": st.median, "host_us_min": st.min})
            fe_us = (res["sides"].get("frontend") or {}).get("host_us")
            for key in ("pycudnn_out", "pycudnn"):
                res[f"ratio_{key}_frontend"] = ratio(
                    (res["sides"].get(key) or {}).get("host_us"), fe_us
                )
            parts = []
            for name, side in res["sides"].items():
                if "host_us" in side:
                    parts.append(f"{name} {side['host_us']:.2f}")
                else:
                    parts.append(f"{name} n/a ({str(side.get('error'))[:120]})")
            log(
                f"SDPA tiny {shape} bf16 host us/call: "
                + " | ".join(parts)
                + f" || pycudnn(out=)/frontend {_f(res['ratio_pycudnn_out_frontend'], '.2f')}"
                f" pycudnn/frontend {_f(res['ratio_pycudnn_frontend'], '.2f')}"
            )
        except Exception as exc:
            res["error"] = _err_text(exc)
            log(f"SDPA tiny host: ERROR {res['error']}\n{traceback.format_exc(limit=4)}")
        self.done_case()

    def _bare_execute(self, q: Any, k: Any, v: Any, o: Any) -> Callable[[], object]:
        """``cudnnBackendExecute`` alone, on the plan and the cached variant pack of
        ``dnn_sdpa(q, k, v, out=o)`` (its handle and stream already bound by that call): the
        floor of any binding's host time for this graph."""
        from pycudnn.graph import _execution
        from pycudnn.highlevel import _call

        self.pc.dnn_sdpa(q, k, v, out=o, stream=self.s)
        entries = [e for e in _call.calls().data.values() if getattr(e, "func", "") == "dnn_sdpa"]
        plan = entries[-1].plan
        keys = [key for key in plan.packs if o.data_ptr() in key]
        if len(keys) != 1:
            raise RuntimeError(f"expected one variant pack holding the output, got {len(keys)}")
        run = _execution.execute_function()
        args = (plan.handle_c, plan.plan_c, plan.packs[keys[0]])

        def execute() -> None:
            rc = run(*args)
            if rc:
                raise RuntimeError(f"cudnnBackendExecute returned {rc}")

        return execute

    def _host_timer(self, fn: Callable[[], object], ctx: Callable[[], Any], n: int):
        backend = self.backend

        def timer() -> float:
            with ctx():
                return backend.host_us_per_call(fn, n)

        return timer

    # ==========================================================================================
    # matmul
    # ==========================================================================================
    def matmul_case(self, shape: tuple[int, int, int]) -> dict[str, Any]:
        torch, F, pc, s = self.torch, self.F, self.pc, self.s
        M, N, K = shape
        dt = torch.bfloat16
        flops = 2.0 * M * N * K
        item: dict[str, Any] = {
            "case": f"matmul bf16 {M}x{N}x{K}",
            "shape": list(shape),
            "flops": flops,
        }
        a = torch.randn(M, K, device="cuda", dtype=dt)
        b = (torch.randn(K, N, device="cuda") / math.sqrt(K)).to(dt)
        w = (torch.randn(N, K, device="cuda") / math.sqrt(K)).to(dt)
        bias = (torch.randn(N, device="cuda") * 0.5).to(dt)
        c_py = torch.empty(M, N, device="cuda", dtype=dt)
        y_py = torch.empty(M, N, device="cuda", dtype=dt)
        wt = w.t()  # (K, N) strided view
        item["fused_b_strides"] = list(wt.stride())

        def py_mm() -> Any:
            return pc.dnn_matmul(a, b, out=c_py, stream=s)

        def th_mm() -> Any:
            return torch.matmul(a, b)

        def py_fused() -> Any:
            return pc.dnn_matmul(a, wt, bias=bias, activation="gelu", out=y_py, stream=s)

        def th_fused() -> Any:
            return F.gelu(F.linear(a, w, bias))

        for key, py, th, out in (
            ("matmul", py_mm, th_mm, c_py),
            ("fused", py_fused, th_fused, y_py),
        ):
            sub: dict[str, Any] = {}
            item[key] = sub
            try:
                ref = th()
                py()
                sub["relerr"] = self.relerr(out, ref)
                sub["check"] = "ok" if sub["relerr"] <= TOL_MATMUL else "FAIL"
                del ref

                def got(timed: dict[str, dict[str, Any]], sub: dict[str, Any] = sub) -> None:
                    for side, r in timed.items():
                        if "gpu_ms" not in r:
                            sub["error"] = f"{side}: no GPU time: {r['gpu_error']}"
                            continue
                        sub[f"{side}_ms"] = r["gpu_ms"]
                        sub[f"{side}_iqr_ms"] = r["gpu_iqr_ms"]
                        sub[f"{side}_tflops"] = flops / (r["gpu_ms"] * 1e-3) / 1e12
                        sub[f"{side}_pct_peak"] = 100 * sub[f"{side}_tflops"] / self.peaks.bf16
                    if "error" not in sub:
                        sub["ratio"] = ratio(sub["pycudnn_ms"], sub["torch_ms"])

                self.time_sides({"pycudnn": py, "torch": th}, f"{item['case']} {key}", got)
            except Exception as exc:
                sub["error"] = _err_text(exc)
                sub["check"] = "FAIL"
                log(f"{item['case']} {key}: ERROR {traceback.format_exc(limit=4)}")
        self.queue.then(lambda: log(self.matmul_line(item)))
        return item

    @staticmethod
    def matmul_line(it: dict[str, Any]) -> str:
        parts = [f"{it['case']}:"]
        for key, what in (("matmul", "matmul"), ("fused", "linear+bias+gelu")):
            sub = it.get(key) or {}
            if "ratio" not in sub:
                parts.append(f"| {what} n/a ({str(sub.get('error'))[:200]})")
                continue
            parts.append(
                f"| {what} py {sub['pycudnn_ms']:.3f} ms (IQR {sub['pycudnn_iqr_ms']:.3f}, "
                f"{sub['pycudnn_tflops']:.0f} TF/s, {sub['pycudnn_pct_peak']:.0f}%) torch "
                f"{sub['torch_ms']:.3f} ms (IQR {sub['torch_iqr_ms']:.3f}, "
                f"{sub['torch_tflops']:.0f} TF/s) x{sub['ratio']:.3f} err {sub['relerr']:.1e} "
                f"{sub['check']}"
            )
        return " ".join(parts)

    def run_matmul(self) -> None:
        for shape in MATMUL_SHAPES:
            try:  # its line is printed once the GPU times are in
                it = self.matmul_case(shape)
            except Exception as exc:
                it = {"case": f"matmul bf16 {shape}", "error": _err_text(exc)}
                log(f"{it['case']}: ERROR {it['error']}\n{traceback.format_exc(limit=4)}")
            self.results["matmul"].append(it)
            self.done_case()

    # ==========================================================================================
    # norms
    # ==========================================================================================
    def norm_case(self, kind: str, shape: tuple[int, int]) -> dict[str, Any]:
        torch, F, pc, s = self.torch, self.F, self.pc, self.s
        rows, hidden = shape
        dt = torch.bfloat16
        ln = kind == "layer_norm"
        eps = 1e-5 if ln else 1e-6
        item: dict[str, Any] = {
            "case": f"{kind} bf16 {rows}x{hidden}",
            "kind": kind,
            "shape": list(shape),
        }
        x = torch.randn(rows, hidden, device="cuda", dtype=dt)
        gamma = (torch.rand(hidden, device="cuda") + 0.5).to(dt)
        beta = (torch.randn(hidden, device="cuda") * 0.1).to(dt)
        dy = torch.randn(rows, hidden, device="cuda", dtype=dt)
        y_py = torch.empty_like(x)
        esz = x.element_size()
        act = rows * hidden * esz  # one activation-sized tensor
        par = hidden * esz  # one parameter vector
        stat = rows * 4  # one float32 statistic per row
        nstat, npar = (2, 2) if ln else (1, 1)
        bytes_fwd = 2 * act + npar * par + nstat * stat  # x, params -> y, stats
        bytes_bwd = 3 * act + (1 + npar) * par + nstat * stat  # dy, x, gamma, stats -> dx, dparams
        item["bytes_fwd"], item["bytes_bwd"] = bytes_fwd, bytes_bwd

        # torch forward / autograd graph for the backward
        xr = x.detach().requires_grad_(True)
        gr = gamma.detach().requires_grad_(True)
        br = beta.detach().requires_grad_(True)
        if ln:

            def th_fwd() -> Any:
                return F.layer_norm(x, (hidden,), gamma, beta, eps)

            yr = F.layer_norm(xr, (hidden,), gr, br, eps)
            wrt: tuple[Any, ...] = (xr, gr, br)

            def py_fwd() -> Any:
                return pc.dnn_layer_norm(x, (hidden,), gamma, beta, eps, out=y_py, stream=s)

        else:

            def th_fwd() -> Any:
                return F.rms_norm(x, (hidden,), gamma, eps)

            yr = F.rms_norm(xr, (hidden,), gr, eps)
            wrt = (xr, gr)

            def py_fwd() -> Any:
                return pc.dnn_rms_norm(x, (hidden,), gamma, eps, out=y_py, stream=s)

        def th_bwd() -> Any:
            return torch.autograd.grad(yr, wrt, dy, retain_graph=True)

        fwd: dict[str, Any] = {}
        bwd: dict[str, Any] = {}
        item["fwd"], item["bwd"] = fwd, bwd
        stats: tuple[Any, ...] = ()
        try:
            ref = th_fwd()
            res = py_fwd()
            stats = tuple(res[1:])
            fwd["relerr"] = self.relerr(y_py, ref)
            fwd["check"] = "ok" if fwd["relerr"] <= TOL_NORM else "FAIL"
            del ref
            self.time_norm(fwd, py_fwd, th_fwd, bytes_fwd, f"{item['case']} fwd")
        except Exception as exc:
            fwd["error"] = _err_text(exc)
            fwd["check"] = "FAIL"
            log(f"{item['case']} fwd: ERROR {traceback.format_exc(limit=4)}")
        try:
            if not stats:
                res = py_fwd()
                stats = tuple(res[1:])
            if ln:
                mean, inv = stats

                def py_bwd() -> Any:
                    return pc.dnn_layer_norm_grad(dy, x, mean, inv, (hidden,), gamma, stream=s)

            else:
                (inv,) = stats

                def py_bwd() -> Any:
                    return pc.dnn_rms_norm_grad(dy, x, inv, (hidden,), gamma, stream=s)

            ref_g = th_bwd()
            got = py_bwd()
            errs = [self.relerr(m, r) for m, r in zip(got, ref_g, strict=True)]
            bwd["relerr_parts"] = errs  # dx, dgamma[, dbeta]
            bwd["relerr"] = max(errs)
            bwd["check"] = "ok" if bwd["relerr"] <= TOL_NORM_BWD else "FAIL"
            del ref_g, got
            self.time_norm(bwd, py_bwd, th_bwd, bytes_bwd, f"{item['case']} bwd")
        except Exception as exc:
            bwd["error"] = _err_text(exc)
            bwd["check"] = "FAIL"
            log(f"{item['case']} bwd: ERROR {traceback.format_exc(limit=4)}")
        self.queue.then(lambda: log(self.norm_line(item)))
        return item

    def time_norm(
        self, sub: dict[str, Any], py: Callable, th: Callable, nbytes: int, label: str
    ) -> None:
        peak_gbs = self.peaks.mem_tbs * 1e3

        def got(timed: dict[str, dict[str, Any]]) -> None:
            for side, r in timed.items():
                if "gpu_ms" not in r:
                    sub["error"] = f"{side}: no GPU time: {r['gpu_error']}"
                    continue
                gbs = nbytes / (r["gpu_ms"] * 1e-3) / 1e9
                sub[f"{side}_ms"] = r["gpu_ms"]
                sub[f"{side}_iqr_ms"] = r["gpu_iqr_ms"]
                sub[f"{side}_GBs"] = gbs
                sub[f"{side}_pct_bw"] = 100 * gbs / peak_gbs
            if "error" not in sub:
                sub["ratio"] = ratio(sub["pycudnn_ms"], sub["torch_ms"])

        self.time_sides({"pycudnn": py, "torch": th}, label, got)

    @staticmethod
    def norm_line(it: dict[str, Any]) -> str:
        parts = [f"norm {it['case']}:"]
        for key in ("fwd", "bwd"):
            sub = it.get(key) or {}
            if "ratio" not in sub:
                parts.append(f"| {key} n/a ({str(sub.get('error'))[:200]})")
                continue
            parts.append(
                f"| {key} py {sub['pycudnn_ms']:.4f} ms (IQR {sub['pycudnn_iqr_ms']:.4f}, "
                f"{sub['pycudnn_GBs']:.0f} GB/s {sub['pycudnn_pct_bw']:.0f}%) torch "
                f"{sub['torch_ms']:.4f} ms (IQR {sub['torch_iqr_ms']:.4f}, "
                f"{sub['torch_GBs']:.0f} GB/s {sub['torch_pct_bw']:.0f}%) x{sub['ratio']:.3f} "
                f"err {sub['relerr']:.1e} {sub['check']}"
            )
        return " ".join(parts)

    def run_norm(self) -> None:
        for shape in NORM_SHAPES:
            for kind in ("layer_norm", "rms_norm"):
                try:  # its line is printed once the GPU times are in
                    it = self.norm_case(kind, shape)
                except Exception as exc:
                    it = {"case": f"{kind} bf16 {shape}", "error": _err_text(exc)}
                    log(f"{it['case']}: ERROR {it['error']}\n{traceback.format_exc(limit=4)}")
                self.results["norm"].append(it)
                self.done_case()


# ==============================================================================================
# summary
# ==============================================================================================
def summary(res: dict[str, Any]) -> list[str]:
    """The short block printed last: medians, worst cases, host ratio, the target lines."""
    lines: list[str] = []
    targets: list[str] = []
    meta = res.get("meta") or {}
    fe = meta.get("frontend") or {}
    lines.append(
        f"on {meta.get('gpu', '?')} | torch {meta.get('torch', '?')} | cuDNN "
        f"{meta.get('cudnn_torch', '?')} | frontend "
        + (fe.get("version", "?") if fe.get("available") else f"skipped ({fe.get('reason')})")
    )
    # -- SDPA
    sdpa = res.get("sdpa") or []
    if sdpa:
        ok = [it for it in sdpa if it.get("check") == "ok"]
        nfail = len(sdpa) - len(ok)
        pooled: list[tuple[str, float]] = []
        worst: list[tuple[str, float]] = []
        for phase in ("fwd", "fwdbwd"):
            rs = [
                (it["case"], it[f"ratio_best_{phase}"])
                for it in ok
                if it.get(f"ratio_best_{phase}") is not None
            ]
            pooled += [(f"{c} {phase}", r) for c, r in rs]
            worst += [
                (f"{it['case']} {phase}", it[f"ratio_cudnn_{phase}"])
                for it in ok
                if it.get(f"ratio_cudnn_{phase}") is not None
            ]
            lines.append(
                f"SDPA {phase}: median pycudnn/best-torch "
                f"{_f(_median([r for _, r in rs]))} over {len(rs)} cases"
            )
        med = _median([r for _, r in pooled])
        w = max(worst, key=lambda lr: lr[1]) if worst else None
        fe_r = [it["ratio_frontend_fwd"] for it in ok if it.get("ratio_frontend_fwd")]
        lines.append(
            f"SDPA all: median pycudnn/best-torch {_f(med)} ({len(pooled)} case-phases); worst "
            f"pycudnn/torch-cudnn {_f(w[1] if w else None)} ({w[0] if w else '-'}); median "
            f"pycudnn/frontend fwd {_f(_median(fe_r))}; checks FAIL {nfail}/{len(sdpa)}"
            + (" (FAIL cases left out of the ratios)" if nfail else "")
        )
        targets.append(
            f"targets: SDPA GPU time <= best torch backend, median case: {_f(med)} "
            f"(goal <= {GOAL_SDPA_MEDIAN:.2f}) {_verdict(med, GOAL_SDPA_MEDIAN)}"
        )
        wv = w[1] if w else None
        targets.append(
            f"targets: SDPA no case above {GOAL_SDPA_WORST:.2f}x torch's cuDNN backend: worst "
            f"{_f(wv)} ({w[0] if w else '-'}) {_verdict(wv, GOAL_SDPA_WORST)}"
        )
    host = res.get("host") or {}
    if host:
        sides = host.get("sides") or {}

        def us(name: str) -> str:
            return _f((sides.get(name) or {}).get("host_us"), ".2f")

        r_out, r_new = host.get("ratio_pycudnn_out_frontend"), host.get("ratio_pycudnn_frontend")
        bad = [n for n, sd in sides.items() if sd.get("check") == "FAIL"]
        lines.append(
            f"SDPA tiny host us/call: pycudnn(out=) {us('pycudnn_out')} pycudnn {us('pycudnn')} "
            f"cuDNN's bare execute {us('cudnn_execute')} "
            f"frontend {us('frontend')} torch default {us('torch_default')} torch cudnn "
            f"{us('torch_cudnn')}; pycudnn(out=)/frontend {_f(r_out, '.2f')}, pycudnn/frontend "
            f"{_f(r_new, '.2f')}"
            + (f"; check FAIL: {', '.join(bad)}" if bad else "")
            + (f"; error {host['error']}" if host.get("error") else "")
        )
        targets.append(
            f"targets: SDPA host us <= {GOAL_SDPA_HOST:.2f}x the frontend's (pycudnn out=): "
            f"{_f(r_out, '.2f')} {_verdict(None if bad else r_out, GOAL_SDPA_HOST)}"
        )
    # -- matmul
    mm = res.get("matmul") or []
    if mm:
        for key, what in (("matmul", "matmul"), ("fused", "matmul+bias+gelu")):
            subs = [(it["case"], it.get(key) or {}) for it in mm]
            rs = [
                sub["ratio"]
                for _, sub in subs
                if sub.get("ratio") is not None and sub.get("check") == "ok"
            ]
            nfail = sum(1 for _, sub in subs if sub.get("check") != "ok")
            med = _median(rs)
            lines.append(
                f"{what}: median pycudnn/torch {_f(med)} over {len(rs)} shapes "
                f"(max {_f(max(rs) if rs else None)}); checks FAIL {nfail}/{len(subs)}"
            )
            if key == "fused":
                targets.append(
                    f"targets: fused matmul+bias+gelu <= {GOAL_FUSED:.2f}x torch eager, median "
                    f"over shapes: {_f(med)} {_verdict(med, GOAL_FUSED)}"
                )
    # -- norms
    nm = res.get("norm") or []
    if nm:
        all_r: list[float] = []
        nfail = ntot = 0
        for kind in ("layer_norm", "rms_norm"):
            for phase in ("fwd", "bwd"):
                subs = [it.get(phase) or {} for it in nm if it.get("kind") == kind]
                ntot += len(subs)
                nfail += sum(1 for sub in subs if sub.get("check") != "ok")
                rs = [
                    sub["ratio"]
                    for sub in subs
                    if sub.get("ratio") is not None and sub.get("check") == "ok"
                ]
                all_r += rs
                pct = [sub["pycudnn_pct_bw"] for sub in subs if "pycudnn_pct_bw" in sub]
                lines.append(
                    f"{kind} {phase}: median pycudnn/torch {_f(_median(rs))} over {len(rs)} "
                    f"shapes; pycudnn median {_f(_median(pct), '.0f')} % of peak bandwidth"
                )
        med = _median(all_r)
        lines.append(f"norms all: median pycudnn/torch {_f(med)}; checks FAIL {nfail}/{ntot}")
        targets.append(
            f"targets: norms <= {GOAL_NORM:.2f}x torch GPU time, median case: {_f(med)} "
            f"{_verdict(med, GOAL_NORM)}"
        )
    return lines + targets


def run(only: set[str] | None, quick: bool, frontend: bool) -> dict[str, Any]:
    bench = Bench(quick, frontend)  # no cuda-bench: NvbenchMissing before any case
    t0 = time.perf_counter()
    for group, fn in (
        ("sdpa", bench.run_sdpa),
        ("host", bench.run_host),
        ("matmul", bench.run_matmul),
        ("norm", bench.run_norm),
    ):
        if only and group not in only and not (group == "host" and "sdpa" in only):
            continue
        g0 = time.perf_counter()
        try:
            fn()
        except Exception as exc:  # a whole group failing must not hide the others
            bench.results[f"{group}_error"] = _err_text(exc)
            log(f"{group}: ERROR {traceback.format_exc(limit=6)}")
        log(f"{group} built and host-timed in {time.perf_counter() - g0:.1f} s")
    log(f"GPU time of {len(bench.queue.jobs)} calls: {bench.queue.info['tool']}")
    bench.queue.run()
    bench.meta["total_s"] = time.perf_counter() - t0
    return bench.results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--only",
        default=None,
        help=f"comma list of groups: {', '.join(GROUPS)} (sdpa includes host)",
    )
    p.add_argument("--quick", action="store_true", help="bf16 SDPA on two shapes, fewer repeats")
    p.add_argument("--no-frontend", action="store_true", help="skip the cudnn-frontend column")
    p.add_argument(
        "--json", default=None, help="write all numbers here (also $OUT/transformer.json)"
    )
    args = p.parse_args(argv)
    only = {g.strip() for g in args.only.split(",") if g.strip()} if args.only else None
    if only and not only <= set(GROUPS):
        p.error(f"unknown group(s) {sorted(only - set(GROUPS))}; choose from {', '.join(GROUPS)}")
    try:
        res = run(only, args.quick, not args.no_frontend)
    except NvbenchMissing as exc:
        print(f"[transformer] {exc}", file=sys.stderr, flush=True)
        return 2
    res["summary"] = summary(res)
    text = json.dumps(res, indent=1, default=str)
    for path in filter(
        None, (args.json, os.environ.get("OUT") and f"{os.environ['OUT']}/transformer.json")
    ):
        Path(path).write_text(text)
    print("== transformer summary")
    print("\n".join(res["summary"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
