"""Devices on the GPU machine (issue 18; marker ``gpu``, the two-GPU part also ``multigpu``).

With one GPU: every high-level function leaves the caller's current device as it was; each call
switches to its operands' device and back (shown by faking the "current device" the high level
reads: it must call ``set_device(operands' device)`` before the launch and restore the faked one
after); ``CUDA_VISIBLE_DEVICES`` is honoured (child processes); the call keys, plans and
per-device states hold the device. With two GPUs (``multigpu``, skipped with its reason on
fewer): every function with its operands on device 1 while device 0 is current runs on device 1
(outputs there, the same values as on device 0, the caller's device unchanged), mixed devices
are refused, caches stay per device, memory is freed on its own device, threads x devices, and
torch tensors on ``cuda:1`` ordered by device 1's current stream.

    PYTHONPATH=. python3 -m pytest -m gpu -q tests/highlevel/test_devices_gpu.py
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import pycudnn
from pycudnn import _cuda, memory
from pycudnn import handle as hmod
from pycudnn.highlevel import DropoutState, RNNBlock, _call, _operand, conv

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
multigpu = pytest.mark.multigpu
rng = np.random.default_rng(18)


def R(shape, positive=False):
    x = rng.standard_normal(shape)
    return (np.abs(x) + 0.5 if positive else x).astype(np.float32)


def log_softmax(x):
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def inputs():
    """Host inputs for :data:`CALLS` (one draw, used on every device)."""
    x4, w4, y4 = R((2, 4, 8, 8)), R((6, 4, 3, 3)), R((2, 6, 6, 6))
    x5, w5 = R((1, 2, 4, 4, 4)), R((2, 2, 1, 1, 1))
    theta = np.tile(np.array([[0.8, 0.1, 0.05], [-0.1, 0.9, 0.0]], np.float32), (2, 1, 1))
    grid = np.clip(R((2, 4, 4, 2)) * 0.5, -1, 1).astype(np.float32)
    lens = np.array([2, 3, 1], np.int32)
    return dict(
        x4=x4,
        w4=w4,
        y4=y4,
        x5=x5,
        w5=w5,
        p=R((2, 3, 8, 8)),
        pg=R((2, 3, 4, 4)),
        bx=R((4, 3, 5, 6)),
        bp=R((1, 3, 1, 1)),
        bv=R((1, 3, 1, 1), True),
        bdy=R((4, 3, 5, 6)),
        e=R((2, 3, 4)),
        edy=R((2, 3, 4)),
        a=R((1, 3, 1, 1)),
        c=R((2, 3, 4, 4)),
        theta=theta,
        img=R((2, 3, 5, 5)),
        grid=grid,
        sdy=R((2, 3, 4, 4)),
        dgrid=R((2, 4, 4, 2)),
        l=R((2, 8, 4, 4)),
        ldy=R((2, 8, 4, 4)),
        lp=log_softmax(R((12, 3, 6))),
        labels=np.array([1, 2, 3, 3, 4, 5], np.int32),
        lens=lens,
        ilens=np.array([12, 10, 7], np.int32),
        rx=R((3, 2, 5)),
        rh=R((1, 2, 4)) * 0.5,
        ma=R((4, 8)).astype(np.float16),
        mb=R((8, 6)).astype(np.float16),
        nx=R((4, 8)),
        ndy=R((4, 8)),
        ng=R((8,)),
        q=R((1, 2, 16, 64)).astype(np.float16),
        qdy=R((1, 2, 16, 64)).astype(np.float16),
        q1=R((1, 2, 1, 64)).astype(np.float16),
        kc=R((4, 2, 16, 64)).astype(np.float16),  # a paged cache: 4 blocks of 16
        pt=np.array([[2, 0]], np.int32),
        one=np.array([1], np.int32),
        pl=np.array([20], np.int32),
        vq=R((12, 2, 64)).astype(np.float16),  # packed: two sequences of 5 and 7 tokens
        vdy=R((12, 2, 64)).astype(np.float16),
        # (N, C, 1, 1): NCHW and NHWC at once, as the fused batch norm takes
        hx=R((8, 16, 1, 1)).astype(np.float16),
        hdy=R((8, 16, 1, 1)).astype(np.float16),
        hp=R((16,)),
    )


H = inputs()


def on(device):
    """``put(name)``: the host input *name* as a device array on *device*."""
    return lambda name: pycudnn.to_device(H[name], device=device)


def _pool_grad(d):
    img = d("p")
    y = pycudnn.dnn_pool(img, (2, 2), (2, 2))
    return pycudnn.dnn_pool_grad(img, y, d("pg"), (2, 2), (2, 2))


def _dropout_pair(d):
    y, st = pycudnn.dnn_dropout(d("e"), 0.5, 7)
    return y, pycudnn.dnn_dropout_grad(d("edy"), st)


def _ln_grad(d):
    _, mean, inv = pycudnn.dnn_layer_norm(d("nx"), (8,), d("ng"), d("ng"))
    return pycudnn.dnn_layer_norm_grad(d("ndy"), d("nx"), mean, inv, (8,), d("ng"))


def _rms_grad(d):
    _, inv = pycudnn.dnn_rms_norm(d("nx"), (8,), d("ng"))
    return pycudnn.dnn_rms_norm_grad(d("ndy"), d("nx"), inv, (8,), d("ng"))


def _sdpa_grad(d):
    q = d("q")
    o, st = pycudnn.dnn_sdpa(q, q, q, is_causal=True, training=True)
    return pycudnn.dnn_sdpa_grad(q, q, q, o, d("qdy"), st, is_causal=True)


CU = [0, 5, 12]  # the packed sequences' cumulative lengths


def _varlen_grad(d):
    q = d("vq")
    o, st = pycudnn.dnn_sdpa_varlen(q, q, q, CU, CU, 7, 7, is_causal=True, training=True)
    return pycudnn.dnn_sdpa_varlen_grad(q, q, q, o, d("vdy"), st, CU, CU, 7, 7, is_causal=True)


def _bn_act_grad(d):
    x, p = d("hx"), d("hp")
    y, mean, invstd, reserve = pycudnn.dnn_batch_normalization_act_train(x, p, p)
    return pycudnn.dnn_batch_normalization_act_grad(x, y, d("hdy"), p, p, mean, invstd, reserve)


def _rnn(d, device):
    with RNNBlock("float32", 4, 1, "lstm", seed=3) as b:
        nw = b.get_param_size(5, device)
        w64 = 0.3 * np.random.default_rng(nw).standard_normal(nw)  # the same on every device
        w = pycudnn.to_device(w64.astype(np.float32), device=device)
        return b.apply(w, d("rx"), d("rh"), d("rh"))


# name -> call(put, device): every high-level function on operands made by put (one device)
CALLS = {
    "dnn_conv": lambda d, _: pycudnn.dnn_conv(d("x4"), d("w4")),
    "dnn_conv3d": lambda d, _: pycudnn.dnn_conv3d(d("x5"), d("w5")),
    "dnn_gradinput": lambda d, _: pycudnn.dnn_gradinput(d("w4"), d("y4"), (2, 4, 8, 8)),
    "dnn_gradinput3d": lambda d, _: pycudnn.dnn_gradinput3d(d("w5"), d("x5"), (1, 2, 4, 4, 4)),
    "dnn_gradweight": lambda d, _: pycudnn.dnn_gradweight(d("x4"), d("y4"), (6, 4, 3, 3)),
    "dnn_gradweight3d": lambda d, _: pycudnn.dnn_gradweight3d(d("x5"), d("x5"), (2, 2, 1, 1, 1)),
    "dnn_pool": lambda d, _: pycudnn.dnn_pool(d("p"), (2, 2), (2, 2), "average_inc_pad"),
    "dnn_pool_grad": lambda d, _: _pool_grad(d),
    "dnn_batch_normalization_train": lambda d, _: pycudnn.dnn_batch_normalization_train(
        d("bx"), d("bp"), d("bp"), "spatial", running_mean=d("bp"), running_var=d("bv")
    ),
    "dnn_batch_normalization_test": lambda d, _: pycudnn.dnn_batch_normalization_test(
        d("bx"), d("bp"), d("bp"), d("bp"), d("bv"), "spatial"
    ),
    "dnn_batch_normalization_grad": lambda d, _: pycudnn.dnn_batch_normalization_grad(
        d("bx"), d("bdy"), d("bp"), d("bp"), d("bv"), "spatial"
    ),
    "dnn_batch_normalization_act_train": lambda d, _: pycudnn.dnn_batch_normalization_act_train(
        d("hx"), d("hp"), d("hp")
    ),
    "dnn_batch_normalization_act_grad": lambda d, _: _bn_act_grad(d),
    "dnn_activation": lambda d, _: pycudnn.dnn_activation(d("e"), "tanh"),
    "dnn_activation_grad": lambda d, _: pycudnn.dnn_activation_grad(
        pycudnn.dnn_activation(d("e"), "tanh"), d("edy"), d("e"), "tanh"
    ),
    "dnn_softmax": lambda d, _: pycudnn.dnn_softmax(d("e")),
    "dnn_softmax_grad": lambda d, _: pycudnn.dnn_softmax_grad(
        d("edy"), pycudnn.dnn_softmax(d("e"))
    ),
    "dnn_add_tensor": lambda d, _: pycudnn.dnn_add_tensor(d("a"), d("c"), 1.0, 1.0),
    "dnn_op_tensor": lambda d, _: pycudnn.dnn_op_tensor("mul", d("c"), d("a")),
    "dnn_dropout": lambda d, _: _dropout_pair(d)[0],
    "dnn_dropout_grad": lambda d, _: _dropout_pair(d)[1],
    "dnn_spatialtf_grid": lambda d, _: pycudnn.dnn_spatialtf_grid(d("theta"), (2, 3, 4, 4)),
    "dnn_spatialtf_grid_grad": lambda d, _: pycudnn.dnn_spatialtf_grid_grad(d("dgrid")),
    "dnn_spatialtf_sampler": lambda d, _: pycudnn.dnn_spatialtf_sampler(d("img"), d("grid")),
    "dnn_spatialtf_sampler_grad": lambda d, _: pycudnn.dnn_spatialtf_sampler_grad(
        d("img"), d("grid"), d("sdy")
    ),
    "dnn_spatialtf": lambda d, _: pycudnn.dnn_spatialtf(d("img"), d("theta")),
    "dnn_spatialtf_grad": lambda d, _: pycudnn.dnn_spatialtf_grad(d("img"), d("theta"), d("img")),
    "dnn_reduction": lambda d, _: pycudnn.dnn_reduction(d("c"), "add", 1),
    "dnn_lrn": lambda d, _: pycudnn.dnn_lrn(d("l")),
    "dnn_lrn_grad": lambda d, _: pycudnn.dnn_lrn_grad(pycudnn.dnn_lrn(d("l")), d("ldy"), d("l")),
    "dnn_ctc_loss": lambda d, _: pycudnn.dnn_ctc_loss(
        d("lp"), d("labels"), d("lens"), d("ilens"), "deterministic"
    ),
    "dnn_matmul": lambda d, _: pycudnn.dnn_matmul(d("ma"), d("mb")),
    "dnn_layer_norm": lambda d, _: pycudnn.dnn_layer_norm(d("nx"), (8,), d("ng"), d("ng")),
    "dnn_layer_norm_grad": lambda d, _: _ln_grad(d),
    "dnn_rms_norm": lambda d, _: pycudnn.dnn_rms_norm(d("nx"), (8,), d("ng")),
    "dnn_rms_norm_grad": lambda d, _: _rms_grad(d),
    "dnn_sdpa": lambda d, _: pycudnn.dnn_sdpa(d("q"), d("q"), d("q"), is_causal=True),
    "dnn_sdpa_grad": lambda d, _: _sdpa_grad(d),
    "dnn_sdpa_paged": lambda d, _: pycudnn.dnn_sdpa_paged(
        d("q1"), d("kc"), d("kc"), d("pt"), d("pl"), seq_lens_q=d("one")
    ),
    "dnn_sdpa_varlen": lambda d, _: pycudnn.dnn_sdpa_varlen(
        d("vq"), d("vq"), d("vq"), CU, CU, 7, 7, is_causal=True
    ),
    "dnn_sdpa_varlen_grad": lambda d, _: _varlen_grad(d),
    "RNNBlock": _rnn,
}
#: results compared across devices only where the same computation is deterministic
NOT_COMPARED = {"dnn_dropout", "dnn_dropout_grad"}


def outputs(result):
    """The device arrays of a result (an array or a tuple of arrays / None)."""
    items = result if isinstance(result, tuple) else (result,)
    return [r for r in items if r is not None]


def test_every_high_level_function_is_in_the_table():
    names = {n for n in pycudnn.highlevel.__all__ if n.startswith("dnn_")} | {"RNNBlock"}
    assert names == set(CALLS)


# -- one GPU ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(CALLS))
def test_the_callers_device_is_unchanged_and_outputs_are_on_the_operands(name):
    before = hmod.current_device()
    result = CALLS[name](on(before), before)
    assert hmod.current_device() == before
    for o in outputs(result):
        assert o.device == before
    _cuda.synchronize(0, before)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_call_makes_its_operands_device_current_then_restores_the_callers(name, monkeypatch):
    """One GPU cannot show a switch, so the "current device" the high level reads is faked (5):
    each launch must make device 0 current first and restore 5 after, in pairs."""
    put = on(0)
    CALLS[name](put, 0)  # warm: the cached path is the one run first below, then the build path
    switches: list[int] = []
    real_set = _cuda.set_device

    def record(d):
        switches.append(d)
        real_set(0)  # the only real device here

    for cached in (True, False):
        if not cached:
            pycudnn.highlevel.clear_caches()
        switches.clear()
        monkeypatch.setattr(_cuda, "device_now", lambda: 5)
        monkeypatch.setattr(_cuda, "set_device", record)
        monkeypatch.setattr(_call, "one_device", False)  # as with several GPUs
        try:
            result = CALLS[name](put, 0)
        finally:
            monkeypatch.undo()
        assert switches, "no launch switched to the operands' device"
        assert switches == [0, 5] * (len(switches) // 2), switches
        for o in outputs(result):
            assert o.device == 0
    assert hmod.current_device() == 0


def test_cuda_visible_devices_is_honoured_in_a_child_process():
    n = hmod.device_count()
    code = (
        "import numpy as np, pycudnn\n"
        "from pycudnn import handle\n"
        "print('count', handle.device_count())\n"
        "if handle.device_count():\n"
        "    x = pycudnn.to_device(np.array([-1.0, 2.0], np.float32))\n"
        "    print('relu', pycudnn.dnn_activation(x).get().tolist(), x.device)\n"
    )

    def child(visible):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": visible}
        r = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
        )
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
        return r.stdout

    last = str(n - 1)
    out = child(last)  # the last GPU alone: it is device 0 of the child
    assert "count 1" in out and "relu [0.0, 2.0] 0" in out
    assert "count 0" in child("")  # none visible: no GPU, no traceback
    assert "count 0" in child("99")  # an ordinal that does not exist: none visible
    doctor = subprocess.run(
        [sys.executable, "-m", "pycudnn", "--no-self-test"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": last},
        timeout=120,
    )
    assert "GPU 0 " in doctor.stdout and "GPU 1 " not in doctor.stdout, doctor.stdout


def test_call_keys_plans_and_states_hold_the_device():
    dev = hmod.current_device()
    x = pycudnn.to_device(H["e"])
    assert _operand.key_of(x)[1][3] == dev
    kx = _operand.key_of(x)[1]  # (shape, strides, dtype, device, address residue)
    pycudnn.highlevel.clear_caches()
    pycudnn.dnn_activation(x, "relu")
    keys = list(_call.calls().data)
    assert len(keys) == 1 and kx in keys[0]  # the call key holds the operand's device
    pycudnn.dnn_conv(pycudnn.to_device(H["x4"]), pycudnn.to_device(H["w4"]))
    info = conv.last_call()
    assert info is not None and info.problem.device == dev and info.handle.device == dev
    _y, st = pycudnn.dnn_dropout(x, 0.5, 1)
    assert st.device == dev
    with RNNBlock("float32", 4, 1, "gru") as b:
        b.get_param_size(5)
        assert list(b._devices) == [dev]


def test_a_torch_stream_of_another_device_is_refused_with_one_gpu_too():
    """A stream object that names device 1 (torch's form) on a device-0 call, before any C call."""

    class Stream:
        device_index = 1
        cuda_stream = 0x77

    x = pycudnn.to_device(H["e"])
    # a cached call of the same shape (an earlier test) is refused by Handle.set_stream instead:
    # either message names both devices
    with pytest.raises(ValueError, match=r"on device 1,? but the .*on device 0"):
        pycudnn.dnn_activation(x, stream=Stream())
    pycudnn.dnn_activation(x)  # and the cached path
    with pytest.raises(ValueError, match="on device 1, but the handle"):
        pycudnn.dnn_activation(x, stream=Stream())


def test_the_device_check_costs_one_cuda_get_device(capsys):
    """Prints what the per-call device check costs here (for docs/device.md)."""
    import time

    n = 20000
    t0 = time.perf_counter()
    for _ in range(n):
        _cuda.device_now()
    per = (time.perf_counter() - t0) / n * 1e9
    with capsys.disabled():
        print(f"\n_cuda.device_now(): {per:.0f} ns per call")
    assert per < 20_000


# -- two GPUs ----------------------------------------------------------------------------------
@multigpu
@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_call_follows_its_operands_to_device_1(name):
    _cuda.set_device(0)
    on1 = CALLS[name](on(1), 1)
    assert hmod.current_device() == 0, "the caller's current device changed"
    on0 = CALLS[name](on(0), 0)
    for a, b in zip(outputs(on1), outputs(on0), strict=True):
        assert a.device == 1 and b.device == 0
        if name not in NOT_COMPARED:
            np.testing.assert_allclose(a.get(), b.get(), rtol=1e-4, atol=1e-5)
    assert hmod.current_device() == 0


@multigpu
@pytest.mark.parametrize("name", sorted(n for n in CALLS if n != "RNNBlock"))
def test_operands_on_device_1_while_device_1_is_current(name):
    """No switch needed: the call runs, its outputs on device 1, device 1 still current."""
    with hmod.DeviceContext(1):
        r = CALLS[name](on(1), 1)
        assert hmod.current_device() == 1
    assert all(o.device == 1 for o in outputs(r))


@multigpu
def test_mixed_devices_are_refused_naming_both():
    x0, x1 = pycudnn.to_device(H["x4"], device=0), pycudnn.to_device(H["w4"], device=1)
    with pytest.raises(ValueError, match=r"device 0.*device 1|device 1.*device 0"):
        pycudnn.dnn_conv(x0, x1)
    e0, e1 = pycudnn.to_device(H["e"], device=0), pycudnn.to_device(H["e"], device=1)
    with pytest.raises(ValueError, match=r"device 0.*device 1|device 1.*device 0"):
        pycudnn.dnn_activation(e0, out=memory.empty(e0.shape, np.float32, 1))
    with pytest.raises(ValueError, match=r"device 0.*device 1|device 1.*device 0"):
        pycudnn.dnn_softmax_grad(e0, e1)
    _y, st = pycudnn.dnn_dropout(e0, 0.5, 1)
    with pytest.raises(ValueError, match="bound to device 0, the operands are on device 1"):
        pycudnn.dnn_dropout(e1, 0.5, state=st)


@multigpu
def test_caches_are_per_device():
    pycudnn.highlevel.clear_caches()
    x = {d: pycudnn.to_device(H["x4"], device=d) for d in (0, 1)}
    w = {d: pycudnn.to_device(H["w4"], device=d) for d in (0, 1)}
    for d in (0, 1):
        pycudnn.dnn_conv(x[d], w[d])
    devices = sorted(c.problem.device for c in conv.recent_calls())
    assert devices == [0, 1]
    assert {c.handle.device for c in conv.recent_calls()} == {0, 1}
    with RNNBlock("float32", 4, 1, "lstm") as b:
        sizes = [b.get_param_size(5, d) for d in (0, 1)]
        assert sizes[0] == sizes[1] and sorted(b._devices) == [0, 1]


@multigpu
def test_memory_is_freed_on_its_own_device_and_pools_are_per_device():
    gc.collect()
    memory.empty_cache()
    a = memory.empty((1 << 20,), np.float32, 1)
    used = memory.cache_stats(1)["used_bytes"]
    assert used >= 4 << 20
    with hmod.DeviceContext(0):
        del a
        gc.collect()
    assert memory.cache_stats(1)["used_bytes"] <= used - (4 << 20)
    assert memory.cache_stats(1)["cached_bytes"] >= 4 << 20  # cached on device 1
    assert memory.empty_cache(1) >= 4 << 20
    assert memory.cache_stats(1)["cached_bytes"] == 0


@multigpu
def test_a_copy_between_devices_keeps_its_values():
    x = np.arange(4096, dtype=np.float32)
    a0 = pycudnn.to_device(x, device=0)
    a1 = memory.empty(x.shape, np.float32, 1)
    a1.copy_(a0)
    np.testing.assert_array_equal(a1.get(), x)
    assert a1.device == 1


@multigpu
def test_threads_bound_to_different_devices_run_concurrently_and_correctly():
    ref = CALLS["dnn_conv"](on(0), 0).get()
    want = {0: ref, 1: ref}
    errors: list[str] = []

    def work(device):
        try:
            _cuda.set_device(device)
            for _ in range(20):
                y = CALLS["dnn_conv"](on(device), device)
                assert y.device == device
                np.testing.assert_allclose(y.get(), want[device], rtol=1e-4, atol=1e-5)
                assert hmod.current_device() == device
        except Exception as exc:  # collected, asserted below
            errors.append(f"{device}: {exc!r}")

    threads = [threading.Thread(target=work, args=(d % 2,)) for d in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@multigpu
def test_one_thread_switching_devices_between_calls():
    ref = CALLS["dnn_softmax"](on(0), 0).get()
    for i in range(10):
        d = i % 2
        with hmod.DeviceContext(1 - d):  # the other device current: the call follows its operands
            y = CALLS["dnn_softmax"](on(d), d)
            assert hmod.current_device() == 1 - d
        assert y.device == d
        np.testing.assert_allclose(y.get(), ref, rtol=1e-5, atol=1e-6)


@multigpu
def test_torch_tensors_on_cuda_1_go_zero_copy_on_device_1s_current_stream():
    torch = pytest.importorskip("torch")
    torch.cuda.set_device(0)
    x = torch.randn(2, 3, 4, device="cuda:1")
    s1 = torch.cuda.Stream(device=1)
    with torch.cuda.stream(s1):  # device 1's current stream (torch sets it per device)
        cur = torch.cuda.current_stream(1)
        assert cur == s1
        y = pycudnn.dnn_softmax(x, stream=cur)
        assert pycudnn.get_handle(1).stream == s1.cuda_stream
    s1.synchronize()
    t = torch.as_tensor(y, device="cuda:1")
    assert t.device.index == 1
    torch.testing.assert_close(t, torch.softmax(x, 1), rtol=1e-5, atol=1e-6)
    assert torch.cuda.current_device() == 0
    v = pycudnn.asarray(x)
    assert v.device == 1 and v.ptr == x.data_ptr()
    with pytest.raises(ValueError, match="device"):  # device 0's stream for device-1 operands
        pycudnn.dnn_softmax(x, stream=torch.cuda.current_stream(0))


@multigpu
def test_dropout_states_are_per_device():
    st0, st1 = DropoutState(5), DropoutState(5)
    pycudnn.dnn_dropout(pycudnn.to_device(H["e"], device=0), 0.5, state=st0)
    pycudnn.dnn_dropout(pycudnn.to_device(H["e"], device=1), 0.5, state=st1)
    assert (st0.device, st1.device) == (0, 1)
