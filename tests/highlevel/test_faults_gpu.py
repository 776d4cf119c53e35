"""Faults on the GPU (issue 16; marker ``gpu``), each in a child process.

Run on the GPU machine::

    PYTHONPATH=. python3 -m pytest -m gpu -q -s tests/test_faults_gpu.py

* workspace OOM with device memory pre-filled: a convolution either falls back to an engine that
  fits, or raises a ``MemoryError`` (``AllocationError``) / ``NotSupportedError``; never a crash,
  the device stays healthy, and the same call works once memory is free again;
* engines that fail to build: every engine index of a convolution graph finalized through the
  backend API, and a legacy algorithm on a shape it does not support; failures are categorised
  ``CudnnError``s;
* CUDA graph capture of a pre-tuned call (dnn_conv, dnn_activation, dnn_softmax with ``out=``
  on a non-default stream), replayed: same result as the eager call;
* interpreter exit with live handles, arrays, plans, an RNN block and an unconsumed DLPack
  capsule, through every way out (end of script, ``sys.exit``, an uncaught exception, a daemon
  thread still calling in), each with the expected exit code and no crash or "Exception ignored".
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu

ROOT = pathlib.Path(__file__).resolve().parents[2]

PRELUDE = """
import json, math, os, sys, threading, time
import numpy as np
import pycudnn
from pycudnn import _cuda, errors

rt = _cuda.runtime()

def healthy():
    err = rt.cudaDeviceSynchronize()[0]
    if int(err):
        return _cuda.error_name(err)
    err = rt.cudaGetLastError()[0]
    return _cuda.error_name(err) if int(err) else None

rng = np.random.default_rng(0)
"""


def run_child(code: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        check=False,
    )


def child_json(code: str) -> dict:
    r = run_child(code)
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_workspace_oom_with_memory_prefilled():
    out = child_json(
        """
        x = pycudnn.to_device(rng.standard_normal((16, 64, 64, 64)).astype(np.float32))
        w = pycudnn.to_device(rng.standard_normal((64, 64, 5, 5)).astype(np.float32) * 0.05)
        ref = pycudnn.dnn_conv(x, w, border_mode="half", conv_mode="cross").get()
        results = {}
        # fill the device: big blocks, then smaller ones, until nothing more fits
        hog, size = [], 1 << 30
        while size >= 1 << 20:
            try:
                hog.append(pycudnn.memory.empty((size,), np.uint8))
            except MemoryError:
                size //= 2
        free, total = pycudnn.memory.mem_get_info()
        results["free_after_fill_mib"] = free / 2**20
        for algo in ("guess_once", "fft", "fft_tiling", "time_once", "none"):
            pycudnn.clear_caches()
            try:
                y = pycudnn.dnn_conv(x, w, border_mode="half", conv_mode="cross", algo=algo)
                err = float(np.max(np.abs(y.get() - ref)) / np.max(np.abs(ref)))
                results[algo] = f"ok err={err:.2e}"
                assert err < 1e-3, (algo, err)
                del y
            except (MemoryError, errors.NotSupportedError, errors.CudnnError) as exc:
                results[algo] = type(exc).__name__
            assert healthy() is None, (algo, healthy())
        with pycudnn.config.override(workspace_limit=0):
            pycudnn.clear_caches()
            try:
                y = pycudnn.dnn_conv(x, w, border_mode="half", conv_mode="cross")
                results["workspace_limit=0"] = "ok"
                del y
            except (MemoryError, errors.NotSupportedError) as exc:
                results["workspace_limit=0"] = type(exc).__name__
        del hog
        pycudnn.memory.empty_cache()
        pycudnn.clear_caches()
        y = pycudnn.dnn_conv(x, w, border_mode="half", conv_mode="cross", algo="fft")
        results["after_free"] = float(np.max(np.abs(y.get() - ref)) / np.max(np.abs(ref)))
        results["healthy"] = healthy()
        print(json.dumps(results))
        """
    )
    print(f"\nworkspace OOM: {out}")
    assert out["healthy"] is None
    assert out["after_free"] < 1e-3


def test_engines_that_fail_to_build_are_categorised():
    out = child_json(
        """
        from pycudnn.descriptors import BackendDescriptor as B
        h = pycudnn.get_handle()
        x = B.tensor((2, 8, 16, 16), uid=1)
        w = B.tensor((8, 8, 3, 3), uid=2)
        y = B.tensor((2, 8, 14, 14), uid=3)
        conv = B.convolution((0, 0))
        op = B.operation_convolution_forward(x, w, y, conv)
        g = B.operation_graph([op], h)
        count = g.get("OPERATIONGRAPH_ENGINE_GLOBAL_COUNT", "INT64", 1)[0]
        built, failed, other = 0, {}, []
        for index in range(count + 3):  # and a few indices past the end
            made = []
            try:
                e = B("engine"); made.append(e)
                e.set("ENGINE_OPERATION_GRAPH", "BACKEND_DESCRIPTOR", g)
                e.set("ENGINE_GLOBAL_INDEX", "INT64", index)
                e.finalize()
                c = B("enginecfg"); made.append(c)
                c.set("ENGINECFG_ENGINE", "BACKEND_DESCRIPTOR", e)
                c.finalize()
                p = B("execution_plan"); made.append(p)
                p.set("EXECUTION_PLAN_HANDLE", "HANDLE", h)
                p.set("EXECUTION_PLAN_ENGINE_CONFIG", "BACKEND_DESCRIPTOR", c)
                p.finalize()
                built += 1
            except errors.CudnnError as exc:
                failed[type(exc).__name__] = failed.get(type(exc).__name__, 0) + 1
            except Exception as exc:
                other.append(f"{index}: {type(exc).__name__}: {exc}")
            for d in reversed(made):
                d.close()
            assert healthy() is None, (index, healthy())
        # a legacy algorithm on a shape it does not support
        xs = pycudnn.to_device(rng.standard_normal((2, 3, 17, 17)).astype(np.float32))
        ws = pycudnn.to_device(rng.standard_normal((4, 3, 5, 5)).astype(np.float32))
        legacy = {}
        for algo in ("winograd", "fft", "fft_tiling", "winograd_non_fused", "large"):
            try:
                pycudnn.dnn_conv(xs, ws, subsample=(2, 2), dilation=(2, 2), algo=algo)
                legacy[algo] = "ok"
            except (errors.NotSupportedError, errors.CudnnError, ValueError) as exc:
                legacy[algo] = type(exc).__name__
            assert healthy() is None, (algo, healthy())
        print(json.dumps({"engines": count, "built": built, "failed": failed, "other": other,
                          "legacy": legacy}))
        """
    )
    print(f"\nengines: {out}")
    assert out["other"] == [], out["other"]
    assert out["built"] >= 1 and sum(out["failed"].values()) >= 3  # the indices past the end


def test_graph_capture_of_a_pretuned_call():
    out = child_json(
        """
        err, s = rt.cudaStreamCreateWithFlags(1)  # non-blocking
        sid = int(s)
        x = pycudnn.to_device(rng.standard_normal((4, 8, 16, 16)).astype(np.float32))
        w = pycudnn.to_device(rng.standard_normal((16, 8, 3, 3)).astype(np.float32))
        calls = {
            "dnn_conv": (lambda o: pycudnn.dnn_conv(x, w, border_mode="half", out=o, stream=sid),
                         (4, 16, 16, 16)),
            "dnn_activation": (lambda o: pycudnn.dnn_activation(x, "tanh", out=o, stream=sid),
                               (4, 8, 16, 16)),
            "dnn_softmax": (lambda o: pycudnn.dnn_softmax(x, out=o, stream=sid), (4, 8, 16, 16)),
        }
        result = {}
        for name, (call, shape) in calls.items():
            o = pycudnn.memory.empty(shape, np.float32, stream=sid)
            call(o)  # pre-tune: plan, workspace, descriptors on this stream
            rt.cudaStreamSynchronize(s)
            eager = o.get()
            o.fill_(float("nan"), stream=sid)
            rt.cudaStreamSynchronize(s)
            mode = rt.cudaStreamCaptureMode.cudaStreamCaptureModeGlobal
            assert int(rt.cudaStreamBeginCapture(s, mode)[0]) == 0
            try:
                call(o)
            finally:
                err, graph = rt.cudaStreamEndCapture(s)
            assert int(err) == 0, (name, _cuda.error_name(err))
            err, gexec = rt.cudaGraphInstantiate(graph, 0)
            assert int(err) == 0, (name, _cuda.error_name(err))
            for _ in range(3):
                assert int(rt.cudaGraphLaunch(gexec, s)[0]) == 0
            rt.cudaStreamSynchronize(s)
            got = o.get()
            result[name] = float(np.max(np.abs(got - eager)))
            rt.cudaGraphExecDestroy(gexec)
            rt.cudaGraphDestroy(graph)
            assert healthy() is None, (name, healthy())
        pycudnn.memory.empty_cache()
        rt.cudaStreamDestroy(s)
        print(json.dumps(result))
        """
    )
    print(f"\ngraph capture replay max |diff| vs eager: {out}")
    assert all(v == 0.0 for v in out.values()), out


EXIT_SETUP = """
h = pycudnn.get_handle()
x = pycudnn.to_device(rng.standard_normal((2, 4, 8, 8)).astype(np.float32))
w = pycudnn.to_device(rng.standard_normal((4, 4, 3, 3)).astype(np.float32))
y = pycudnn.dnn_conv(x, w)                                   # a cached plan and workspace
a = pycudnn.dnn_activation(x, "relu")
block = pycudnn.RNNBlock("float32", 8, 1, "lstm")
wr = pycudnn.to_device(rng.standard_normal(block.get_param_size(4)).astype(np.float32) * 0.1)
xr = pycudnn.to_device(rng.standard_normal((3, 2, 4)).astype(np.float32))
out = block.apply(wr, xr, training=True)
capsule = y.__dlpack__()                                     # exported, never consumed
desc = pycudnn.TensorDescriptor((1, 2, 3, 4))
own = pycudnn.Handle()                                       # a private handle, never closed
"""

EXITS = {
    "end": ("", 0),
    "sys_exit": ("sys.exit(3)", 3),
    "exception": ("raise RuntimeError('boom')", 1),
    "daemon_thread": (
        """
        def spin():
            while True:
                pycudnn.dnn_activation(x, "tanh")
                pycudnn.dnn_conv(x, w)
        threading.Thread(target=spin, daemon=True).start()
        time.sleep(0.5)
        """,
        0,
    ),
    "thread_handles": (
        """
        def work():
            pycudnn.dnn_conv(x, w)  # the thread's own handle, left alive
        t = threading.Thread(target=work); t.start(); t.join()
        """,
        0,
    ),
}


@pytest.mark.parametrize("how", sorted(EXITS))
def test_interpreter_exit_with_live_handles_arrays_and_plans(how):
    tail, rc = EXITS[how]
    r = run_child(EXIT_SETUP + textwrap.dedent(tail), timeout=300)
    assert r.returncode == rc, f"rc={r.returncode} (expected {rc})\n{r.stderr[-5000:]}"
    assert "Exception ignored" not in r.stderr, r.stderr
    assert "Segmentation" not in r.stderr and "core dumped" not in r.stderr, r.stderr
