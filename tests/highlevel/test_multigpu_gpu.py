"""Several GPUs, run for real (issue 28; markers ``gpu`` + ``multigpu``, skipped on fewer GPUs).

Beyond ``test_devices_gpu.py`` (every high-level function on device 1 while device 0 is current,
mixed devices refused, threads x devices): the fused convolution epilogue and the graph builder on
device 1; calls alternating between devices so that every per-device cache (call entries, plans,
descriptors, RNN workspaces, dropout states) is hit with the other device's entry beside it; the
caching allocator's pools and statistics per device; peer copies that keep their values without
a host synchronization between producer and copy; torch tensors on ``cuda:1`` (zero-copy, device
1's current stream orders the call, also through ``pycudnn.torch.convert``); the DDP example
(``examples/ddp_train.py``, two processes over NCCL). Only public names of the high level, the
graph builder and the adapter are used.

    PYTHONPATH=. python3 -m pytest -m multigpu -q tests/highlevel/test_multigpu_gpu.py
"""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_devices_gpu import CALLS, NOT_COMPARED, on, outputs

import pycudnn
from pycudnn import handle as hmod
from pycudnn import memory
from pycudnn.graph import Graph
from pycudnn.highlevel import DropoutState, RNNBlock
from pycudnn.memory import allocator

pytestmark = pytest.mark.gpu
multigpu = pytest.mark.multigpu
ROOT = Path(__file__).resolve().parents[2]
rng = np.random.default_rng(28)
#: NVLink multicast stays off in every process started here (the machines' rule)
NO_MULTICAST = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def nhwc(a: np.ndarray, device: int) -> pycudnn.DeviceArray:
    """*a* (NCHW) as a device array in NHWC memory, viewed NCHW (the fused path's layout)."""
    return pycudnn.to_device(
        np.ascontiguousarray(a.transpose(0, 2, 3, 1)), device=device
    ).transpose(0, 3, 1, 2)


def conv_ref(x: np.ndarray, w: np.ndarray, pad: int) -> np.ndarray:
    """Cross-correlation in float64 (NCHW, OIHW, stride 1)."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = np.lib.stride_tricks.sliding_window_view(xp, w.shape[2:], axis=(2, 3))
    return np.einsum("nchwij,kcij->nkhw", win, w.astype(np.float64))


# -- the fused epilogue and the graph builder on device 1 --------------------------------------
@multigpu
@pytest.mark.parametrize("with_z", [False, True])
def test_the_fused_conv_epilogue_runs_on_device_1(with_z):
    x = rng.standard_normal((2, 16, 8, 8)).astype(np.float16)
    w = (rng.standard_normal((32, 16, 3, 3)) * 0.1).astype(np.float16)
    b = rng.standard_normal((1, 32, 1, 1)).astype(np.float16)
    z = rng.standard_normal((2, 32, 8, 8)).astype(np.float16)

    def call(d):
        kw = dict(bias=pycudnn.to_device(b, device=d), activation="relu")
        if with_z:
            kw["z"] = nhwc(z, d)
        return pycudnn.dnn_conv(nhwc(x, d), nhwc(w, d), border_mode=1, conv_mode="cross", **kw)

    with hmod.DeviceContext(0):
        y1 = call(1)
        assert hmod.current_device() == 0 and y1.device == 1
        y0 = call(0)
    ref = conv_ref(x, w, 1) + b + (z if with_z else 0)
    ref = np.maximum(ref, 0)
    np.testing.assert_allclose(y1.get().astype(np.float32), y0.get().astype(np.float32))
    np.testing.assert_allclose(y1.get().astype(np.float64), ref, rtol=2e-2, atol=2e-2)
    assert hmod.current_device() == 0


def _conv_graph(x, w, b, y, device):
    g = Graph(io_data_type="float16")
    tx, tw, tb = g.tensor_like(x), g.tensor_like(w), g.tensor_like(b)
    ty = g.relu(g.add(g.conv_fprop(tx, tw, padding=1), tb)).set_output(True)
    ty.set_stride(tuple(s // 2 for s in y.strides))  # element strides of the NHWC output
    g.build(device=device)
    return g, (tx, tw, tb, ty)


@multigpu
def test_a_graph_built_and_executed_on_device_1_while_device_0_is_current():
    x = rng.standard_normal((4, 16, 8, 8)).astype(np.float16)
    w = (rng.standard_normal((32, 16, 3, 3)) * 0.1).astype(np.float16)
    b = rng.standard_normal((1, 32, 1, 1)).astype(np.float16)
    ref = np.maximum(conv_ref(x, w, 1) + b, 0)
    results = {}
    with hmod.DeviceContext(0):
        for d in (1, 0):  # device 1 first: nothing of device 0 may be borrowed
            xd, wd, bd = nhwc(x, d), nhwc(w, d), pycudnn.to_device(b, device=d)
            yd = nhwc(np.zeros((4, 32, 8, 8), np.float16), d)
            g, (tx, tw, tb, ty) = _conv_graph(xd, wd, bd, yd, d)
            g.execute({tx: xd, tw: wd, tb: bd, ty: yd})
            assert hmod.current_device() == 0
            results[d] = yd.get().astype(np.float64)
            if d == 1:  # a device-1 plan with device-0 arrays: refused, naming the devices
                x0 = nhwc(x, 0)
                with pytest.raises(ValueError, match="device"):
                    g.execute({tx: x0, tw: wd, tb: bd, ty: yd})
    np.testing.assert_array_equal(results[1], results[0])
    np.testing.assert_allclose(results[1], ref, rtol=2e-2, atol=2e-2)


# -- per-device caches, hit alternately ---------------------------------------------------------
ALTERNATED = [
    "dnn_conv",
    "dnn_gradweight",
    "dnn_batch_normalization_train",
    "dnn_softmax",
    "dnn_reduction",
    "dnn_ctc_loss",
    "dnn_matmul",
    "dnn_layer_norm_grad",
    "dnn_sdpa",
    "dnn_sdpa_grad",
    "RNNBlock",
]


@multigpu
@pytest.mark.parametrize("name", ALTERNATED)
def test_calls_alternating_between_devices_keep_per_device_caches(name):
    """The same call, same shapes, on 1, 0, 1, 0, ... with the *other* device current: each
    call hits the cache entry (plan, descriptors, workspace) of its own device."""
    first = {}
    for i in range(6):
        d = 1 - i % 2
        with hmod.DeviceContext(1 - d):
            r = outputs(CALLS[name](on(d), d))
            assert hmod.current_device() == 1 - d
        assert all(o.device == d for o in r), name
        got = [o.get() for o in r]
        if i < 2:
            first[d] = got
        for a, b in zip(got, first.get(d, got), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)  # the device repeats itself
    if name not in NOT_COMPARED:
        for a, b in zip(first[1], first[0], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@multigpu
def test_rnn_training_and_backward_use_each_devices_workspace():
    x_h = rng.standard_normal((5, 3, 8)).astype(np.float32)
    dy_h = rng.standard_normal((5, 3, 16)).astype(np.float32)
    grads = {}
    with RNNBlock("float32", 16, 2, "lstm", seed=1) as b:
        n = b.get_param_size(8, 0)
        w_h = (0.2 * rng.standard_normal(n)).astype(np.float32)
        for d in (1, 0, 1):
            with hmod.DeviceContext(1 - d):
                w, x = pycudnn.to_device(w_h, device=d), pycudnn.to_device(x_h, device=d)
                y, *_ = b.apply(w, x, training=True)
                dx, _dhx, _dcx, dw = b.backward(
                    w, x, None, None, y, pycudnn.to_device(dy_h, device=d)
                )
                assert {y.device, dx.device, dw.device} == {d}
            grads.setdefault(d, []).append((y.get(), dx.get(), dw.get()))
    for a, c in zip(grads[1][0], grads[1][1], strict=True):
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)
    for a, c in zip(grads[1][0], grads[0][0], strict=True):
        np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-5)


@multigpu
def test_dropout_states_stay_on_their_device():
    e = rng.standard_normal((64, 64)).astype(np.float32)
    st = {d: DropoutState(11) for d in (0, 1)}
    for d in (1, 0, 1):
        with hmod.DeviceContext(1 - d):
            x = pycudnn.to_device(e, device=d)
            y, s = pycudnn.dnn_dropout(x, 0.5, state=st[d])
            dx = pycudnn.dnn_dropout_grad(x, s)
        assert s.device == d and y.device == d and dx.device == d
        yh, dxh = y.get(), dx.get()
        kept = yh != 0
        assert 0.3 < kept.mean() < 0.7
        np.testing.assert_allclose(yh[kept], 2 * e[kept], rtol=1e-6)
        np.testing.assert_array_equal(dxh != 0, kept)  # the same mask backwards
    with pytest.raises(ValueError, match="device"):
        pycudnn.dnn_dropout(pycudnn.to_device(e, device=0), 0.5, state=st[1])


# -- the caching allocator, per device ---------------------------------------------------------
def _allocator_pools_and_statistics_per_device():
    gc.collect()
    for d in (0, 1):
        memory.empty_cache(d)
    s0, s1 = memory.cache_stats(0), memory.cache_stats(1)
    mib = 1 << 20
    with hmod.DeviceContext(1):
        a = memory.empty((mib,), np.float32, 0)  # 4 MiB on device 0 while device 1 is current
    with hmod.DeviceContext(0):
        b = memory.empty((2 * mib,), np.float32, 1)  # 8 MiB on device 1 while device 0 is
    t0, t1 = memory.cache_stats(0), memory.cache_stats(1)
    assert t0["used_bytes"] - s0["used_bytes"] == 4 * mib
    assert t1["used_bytes"] - s1["used_bytes"] == 8 * mib
    assert t0["misses"] - s0["misses"] == 1 and t1["misses"] - s1["misses"] == 1
    with hmod.DeviceContext(1):
        del a  # device 0's block, freed while device 1 is current: cached on device 0
        gc.collect()
    with hmod.DeviceContext(0):
        del b
        gc.collect()
    u0, u1 = memory.cache_stats(0), memory.cache_stats(1)
    assert u0["cached_bytes"] - s0["cached_bytes"] == 4 * mib
    assert u1["cached_bytes"] - s1["cached_bytes"] == 8 * mib
    with hmod.DeviceContext(0):
        c = memory.empty((2 * mib,), np.float32, 1)  # device 1's cached block comes back
    v0, v1 = memory.cache_stats(0), memory.cache_stats(1)
    assert v1["hits"] - u1["hits"] == 1 and v0["hits"] == u0["hits"]
    assert c.device == 1
    del c
    gc.collect()
    assert memory.empty_cache(1) >= 8 * mib and memory.cache_stats(1)["cached_bytes"] == 0
    assert memory.cache_stats(0)["cached_bytes"] >= 4 * mib  # device 0's cache untouched
    memory.empty_cache(0)
    assert hmod.current_device() == 0


@multigpu
def test_allocator_pools_and_statistics_are_per_device():
    before = allocator.set_memory_resource(None)  # the caching allocator (torch's may be in)
    try:
        _allocator_pools_and_statistics_per_device()
    finally:
        allocator.set_memory_resource(before)


# -- peer copies --------------------------------------------------------------------------------
@multigpu
@pytest.mark.parametrize(("src", "dst"), [(0, 1), (1, 0)])
def test_peer_copies_keep_values_without_a_host_sync(src, dst):
    shape = (16, 1024, 1024)  # 64 MiB: the producer is still running when the copy is queued
    x = rng.standard_normal(shape).astype(np.float32)
    with hmod.DeviceContext(dst):  # the destination's device current: the source still orders
        a = pycudnn.to_device(x, device=src)
        r = pycudnn.dnn_activation(a, "relu")  # queued on src's stream, not waited for
        b = memory.empty(shape, np.float32, dst)
        b.copy_(r)
        c = pycudnn.to_device(r, device=dst)  # to_device of device data onto another device
        back = memory.empty(shape, np.float32, src)
        back.copy_(c)
    want = np.maximum(x, 0)
    assert (b.device, c.device, back.device) == (dst, dst, src)
    np.testing.assert_array_equal(b.get(), want)
    np.testing.assert_array_equal(c.get(), want)
    np.testing.assert_array_equal(back.get(), want)
    assert r.copy().device == src


@multigpu
def test_peer_copies_of_torch_tensors_on_their_streams():
    torch = pytest.importorskip("torch")
    torch.cuda.set_device(0)
    s0, s1 = torch.cuda.Stream(device=0), torch.cuda.Stream(device=1)
    dst = memory.empty((4 << 20,), np.float32, 1, stream=s1)
    with torch.cuda.stream(s0):
        t0 = torch.randn(4 << 20, device="cuda:0")
        t0 = t0 * 2 + 1  # pending on s0
    s1.wait_stream(s0)  # torch's rule for a tensor used on another stream (no host sync)
    dst.copy_(t0)  # a peer copy on s1, dst's stream (device 1)
    out = torch.as_tensor(dst, device="cuda:1")
    s1.synchronize()
    s0.synchronize()
    torch.testing.assert_close(out.cpu(), t0.cpu())
    back = torch.empty_like(t0)
    pycudnn.asarray(back).copy_(dst)
    torch.cuda.synchronize(0)
    torch.testing.assert_close(back, t0)
    assert torch.cuda.current_device() == 0


# -- torch on cuda:1 -----------------------------------------------------------------------------
@multigpu
def test_torch_cuda_1_work_on_device_1s_current_stream_is_ordered_before_the_call():
    torch = pytest.importorskip("torch")
    torch.cuda.set_device(0)
    s1 = torch.cuda.Stream(device=1)
    a = torch.randn(2048, 2048, device="cuda:1")
    s1.wait_stream(torch.cuda.default_stream(1))
    with torch.cuda.stream(s1):
        x = (a @ a).reshape(64, 64, 32, 32)  # long work pending on s1, no sync
        y = pycudnn.dnn_softmax(x, stream=torch.cuda.current_stream(1))
        v = pycudnn.asarray(x)
        assert v.device == 1 and v.ptr == x.data_ptr()  # zero-copy
        t = torch.as_tensor(y, device="cuda:1")
        ref = torch.softmax(x, 1)
    s1.synchronize()
    torch.testing.assert_close(t, ref, rtol=1e-5, atol=1e-6)
    assert torch.cuda.current_device() == 0


@multigpu
def test_a_converted_model_on_cuda_1_while_cuda_0_is_current():
    torch = pytest.importorskip("torch")
    import pycudnn.torch as pt

    torch.manual_seed(0)
    nn = torch.nn

    def make():
        torch.manual_seed(0)
        layers = [nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2)]
        return nn.Sequential(*layers, nn.Flatten(), nn.Linear(8 * 8 * 8, 10))

    ref, conv = make(), make()
    pt.convert(conv)
    ref, conv = ref.to("cuda:1"), conv.to("cuda:1")
    torch.cuda.set_device(0)
    s1 = torch.cuda.Stream(device=1)
    x = torch.randn(4, 3, 16, 16, device="cuda:1")
    s1.wait_stream(torch.cuda.default_stream(1))
    with torch.cuda.stream(s1):  # device 1's current stream; device 0 stays current
        outs = []
        for m in (ref, conv):
            y = m(x)
            y.square().sum().backward()
            outs.append((y.detach(), m[0].weight.grad.detach().clone()))
    s1.synchronize()
    assert torch.cuda.current_device() == 0
    assert hmod.current_device() == 0
    assert outs[1][0].device == torch.device("cuda:1")
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(outs[1][1], outs[0][1], rtol=1e-3, atol=1e-3)


def test_convert_leaves_sync_batchnorm_alone():
    torch = pytest.importorskip("torch")
    import pycudnn.torch as pt

    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.SyncBatchNorm(4), nn.BatchNorm2d(4))
    pt.convert(model)
    assert type(model[1]) is nn.SyncBatchNorm  # torch's, with its statistics exchange
    assert type(model[0]).__module__.startswith("pycudnn")
    assert type(model[2]).__module__.startswith("pycudnn")
    synced = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # converted batch norms too
    assert type(synced[2]) is nn.SyncBatchNorm and type(synced[0]).__module__.startswith("pycudnn")


# -- DistributedDataParallel ---------------------------------------------------------------------
@multigpu
def test_the_ddp_example_trains_converted_models_like_torch_on_two_gpus(tmp_path):
    pytest.importorskip("torch")
    env = {**os.environ, **NO_MULTICAST, "PYTHONPATH": str(ROOT)}
    script = str(ROOT / "examples" / "ddp_train.py")
    cmd = [sys.executable, script, "--steps", "4", "--json", str(tmp_path / "ddp.json")]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=540)
    print(r.stdout)  # the summary lines, for -s or the junit report
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("ddp ")]
    assert len(lines) == 2, r.stdout  # the CNN and the sequence model
    for ln in lines:
        assert "world 2" in ln and "ranks equal yes" in ln and "agree yes" in ln, ln
        assert re.search(r"max \|param diff across ranks\| 0(\.0+)?(e\+00)? ", ln), ln
