"""Faults of issue 30's surface on the GPU (marker ``gpu``), each in a child process.

Run on the GPU machine (serially, like ``test_faults_gpu.py``)::

    PYTHONPATH=. python3 -m pytest -m gpu -q -s tests/highlevel/test_faults_transformer_gpu.py

* out of memory, injected through the memory resource (``allocator.set_memory_resource``: a
  resource over pycudnn's caching allocator that raises ``AllocationError`` while armed): while
  building a graph (autotune's timing buffers; every workspace), while executing one (its
  workspace, released first), and during ``dnn_sdpa_grad`` (fresh caches and a cached entry);
  each raises ``AllocationError`` (a ``MemoryError``), the device stays healthy, and the next
  call, disarmed, gives the result of before, bit for bit;
* CUDA-graph capture with torch (``torch.cuda.graph``) of ``dnn_sdpa`` (forward, training),
  ``dnn_sdpa_grad`` (deterministic) and ``dnn_matmul`` with bias and GELU on torch tensors:
  warmed up on the capture stream, replayed after new data is copied into the captured inputs,
  equal bit for bit to eager calls on that data (the same plans).
"""

from __future__ import annotations

import json

import pytest
from test_faults_gpu import child_json

pytestmark = pytest.mark.gpu

INJECT = """
from pycudnn.memory import allocator

class Injector:
    '''pycudnn's caching allocator, or AllocationError while armed (counted).'''
    def __init__(self):
        self.armed, self.refused = False, 0
    def allocate(self, nbytes, device, stream, keep=None):
        if self.armed:
            self.refused += 1
            raise allocator.allocation_error(nbytes, device, "injected", "out of memory (test)")
        return allocator._default.allocate(nbytes, device, stream, keep)

inj = Injector()
allocator.set_memory_resource(inj)
h = pycudnn.get_handle()

def faulted(fn):
    '''The error type fn raises with the injector armed (None: it ran).'''
    h.release_workspace()
    inj.armed = True
    try:
        fn()
        return None
    except MemoryError as exc:
        named = isinstance(exc, errors.AllocationError)
        return type(exc).__name__ + (" (AllocationError)" if named else "")
    except Exception as exc:
        return f"OTHER {type(exc).__name__}: {exc}"
    finally:
        inj.armed = False
"""


def test_out_of_memory_building_and_executing_a_graph_and_in_sdpa_grad():
    out = child_json(
        INJECT
        + """
from pycudnn.graph import Graph
import ml_dtypes
bf = np.dtype(ml_dtypes.bfloat16)
res = {}
b, hh, s, d = 2, 4, 128, 64
q, k, v, do = (
    pycudnn.to_device(rng.standard_normal((b, hh, s, d)).astype(bf)) for _ in range(4)
)
o, stats = pycudnn.dnn_sdpa(q, k, v, is_causal=True, training=True)

def graph():
    g = Graph(io_data_type="bfloat16", name="oom")
    named = ((q, "q"), (k, "k"), (v, "v"), (o, "o"), (do, "do"))
    t = [g.tensor_like(a, name=n) for a, n in named]
    ts = g.tensor_like(stats, name="stats")
    dq, dk, dv = g.sdpa_backward(*t, ts, attn_scale=0.125, use_causal_mask=True)
    for x in (dq, dk, dv):
        x.set_output(True).set_stride((hh * s * d, s * d, d, 1))
    return g, t, ts, (dq, dk, dv)

def execute(g, t, ts, outs):
    arrs = [pycudnn.memory.empty((b, hh, s, d), bf) for _ in range(3)]
    g.execute({**dict(zip(t, (q, k, v, o, do))), ts: stats, **dict(zip(outs, arrs))})
    return [a.get() for a in arrs]

g, t, ts, outs = graph()
g.build()
want = execute(g, t, ts, outs)
res["workspace"] = g.get_workspace_size()
# executing: the workspace (released first) cannot be allocated
res["execute"] = faulted(lambda: execute(g, t, ts, outs))
res["execute_healthy"] = healthy()
res["execute_after"] = all(np.array_equal(a, w) for a, w in zip(execute(g, t, ts, outs), want))
# building: autotune's timing buffers and every engine's workspace
pycudnn.clear_caches()
g2, t2, ts2, outs2 = graph()
res["build_autotune"] = faulted(lambda: g2.build(policy="autotune"))
res["build_healthy"] = healthy()
g2.build(policy="autotune")
res["build_after"] = all(
    float(np.max(np.abs(a.astype(np.float64) - w.astype(np.float64)))) < 5e-2
    for a, w in zip(execute(g2, t2, ts2, outs2), want)
)
# dnn_sdpa_grad: fresh caches (plan search, outputs), then a cached entry (workspace, outputs)
pycudnn.clear_caches()
call = lambda: [x.get() for x in pycudnn.dnn_sdpa_grad(q, k, v, o, do, stats, is_causal=True,
                                                       deterministic=True)]
res["sdpa_grad_fresh"] = faulted(call)
before = call()
res["sdpa_grad_cached"] = faulted(call)
res["sdpa_grad_healthy"] = healthy()
res["sdpa_grad_after"] = all(np.array_equal(a, w) for a, w in zip(call(), before))
res["refused_allocations"] = inj.refused
allocator.set_memory_resource(None)
print(json.dumps(res))
"""
    )
    print(f"\ninjected OOM: {out}")
    assert out["workspace"] > 0  # the backward's scratch tensors live in the workspace
    for what in ("execute", "build_autotune", "sdpa_grad_fresh", "sdpa_grad_cached"):
        assert out[what] == "OutOfMemoryError (AllocationError)", (what, out[what])
    for what in ("execute_healthy", "build_healthy", "sdpa_grad_healthy"):
        assert out[what] is None, (what, out[what])
    assert out["execute_after"] and out["build_after"] and out["sdpa_grad_after"], out


CAPTURE = """
import torch
import pycudnn.torch as pt
pt.use_torch_allocator()  # captured allocations come from the graph's private pool
torch.manual_seed(0)
dev, bf = "cuda", torch.bfloat16
res = {}

def capture(name, run, inputs, fresh):
    '''Warm up on the capture stream, capture, copy new data in, replay; compare the captured
    outputs with an eager run on the new data, bit for bit.'''
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            run(s)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        captured = run(s)
    new = fresh()
    for dst, src in zip(inputs, new):
        dst.copy_(src)
    g.replay()
    torch.cuda.synchronize()
    eager = run(torch.cuda.current_stream())
    torch.cuda.synchronize()
    diffs = [float((torch.from_dlpack(a).double() - torch.from_dlpack(e).double()).abs().max())
             for a, e in zip(captured, eager)]
    same = all(torch.equal(torch.from_dlpack(a), torch.from_dlpack(e))
               for a, e in zip(captured, eager))
    moved = any(not torch.equal(torch.from_dlpack(a), b) for a, b in zip(captured, before[name]))
    res[name] = {"bitwise": same, "max_diff": max(diffs), "replay_changed_outputs": moved}
    pycudnn.get_handle().set_stream(0)
    assert healthy() is None, (name, healthy())

before = {}
B, H, S, D = 2, 8, 256, 64
q, k, v = (torch.randn(B, H, S, D, device=dev, dtype=bf) for _ in range(3))
o_static = torch.empty_like(q)

def sdpa(stream):
    o, st = pycudnn.dnn_sdpa(q, k, v, is_causal=True, training=True, out=o_static, stream=stream)
    return [o, st]

before["dnn_sdpa"] = [torch.from_dlpack(x).clone() for x in sdpa(torch.cuda.current_stream())]
capture("dnn_sdpa", sdpa, (q, k, v), lambda: [torch.randn_like(q) for _ in range(3)])

o, st = pycudnn.dnn_sdpa(q, k, v, is_causal=True, training=True)
o_t, st_t = torch.from_dlpack(o).clone(), torch.from_dlpack(st).clone()
do = torch.randn_like(q)

def sdpa_grad(stream):
    return list(pycudnn.dnn_sdpa_grad(q, k, v, o_t, do, st_t, is_causal=True,
                                      deterministic=True, stream=stream))

now = torch.cuda.current_stream()
before["dnn_sdpa_grad"] = [torch.from_dlpack(x).clone() for x in sdpa_grad(now)]
def fresh_grad():
    q2, k2, v2 = (torch.randn_like(q) for _ in range(3))
    o2, st2 = pycudnn.dnn_sdpa(q2, k2, v2, is_causal=True, training=True)
    torch.cuda.synchronize()
    o2, st2 = torch.from_dlpack(o2).clone(), torch.from_dlpack(st2).clone()
    return [q2, k2, v2, o2, torch.randn_like(q), st2]
capture("dnn_sdpa_grad", sdpa_grad, (q, k, v, o_t, do, st_t), fresh_grad)

x = torch.randn(4, 96, 256, device=dev, dtype=bf)
w = torch.randn(384, 256, device=dev, dtype=bf) / 16
bias = torch.randn(384, device=dev, dtype=bf)
y_static = torch.empty(4, 96, 384, device=dev, dtype=bf)

def matmul(stream):
    return [pycudnn.dnn_matmul(x, w.t(), bias, "gelu", out=y_static, stream=stream)]

before["dnn_matmul"] = [torch.from_dlpack(y).clone() for y in matmul(torch.cuda.current_stream())]
capture("dnn_matmul", matmul, (x, w, bias),
        lambda: [torch.randn_like(x), torch.randn_like(w) / 16, torch.randn_like(bias)])
print(json.dumps(res))
"""


def test_cuda_graph_capture_of_sdpa_and_matmul_replays_as_eager():
    pytest.importorskip("torch")
    out = child_json(CAPTURE)
    print(f"\ncapture replay vs eager: {json.dumps(out)}")
    for name in ("dnn_sdpa", "dnn_sdpa_grad", "dnn_matmul"):
        assert out[name]["bitwise"], (name, out[name])
        assert out[name]["replay_changed_outputs"], (name, "the replay did not write new data")
