"""Handles on a real GPU: per-thread handles with their own streams, stream binding, lifetime.

Run on the GPU machine: ``PYTHONPATH=. python3 -m pytest -m gpu -q``.
"""

from __future__ import annotations

import ctypes
import gc
import threading
import warnings

import numpy as np
import pytest

import pycudnn
from pycudnn import _lib, api
from pycudnn import handle as hmod
from pycudnn.handle import DeviceContext, Handle, get_handle

pytestmark = pytest.mark.gpu


def _rt():
    from cuda.bindings import runtime

    return runtime


def _new_stream() -> int:
    err, s = _rt().cudaStreamCreateWithFlags(1)  # cudaStreamNonBlocking
    assert int(err) == 0
    return int(s)


def _destroy_stream(s: int) -> None:
    rt = _rt()
    rt.cudaStreamSynchronize(s)
    pycudnn.memory.empty_cache()  # cached blocks remember their stream: release before destroying
    rt.cudaStreamDestroy(s)


def _bound_stream(h: Handle) -> int:
    out = _lib.cudaStream_t()
    api.cudnnGetStream(h, ctypes.byref(out))
    return out.value or 0


@pytest.fixture(autouse=True)
def _quiet_deprecations():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def test_device_queries():
    assert hmod.gpu_unavailable_reason() is None
    assert hmod.device_count() >= 1
    assert 0 <= hmod.current_device() < hmod.device_count()


def test_get_handle_is_cached_per_thread_and_device():
    h = get_handle()
    assert isinstance(h, Handle)
    assert h is get_handle()
    assert h is get_handle(hmod.current_device())
    assert h.ptr != 0 and h.device == hmod.current_device()
    assert h.thread_id == threading.get_ident()
    assert "pycudnn.Handle" in repr(h)


def test_closed_handle_is_replaced():
    h = get_handle()
    h.close()
    h2 = get_handle()
    assert h2 is not h and h2.ptr != 0 and not h2.closed


def test_bad_device_ordinal():
    with pytest.raises(ValueError, match="does not exist"):
        get_handle(hmod.device_count())
    with pytest.raises(TypeError):
        get_handle("0")


def test_private_handle_lifecycle():
    get_handle(0)
    gc.collect()
    live = Handle.live_count()
    with Handle(0) as h:
        assert h.ptr and h is not get_handle(0)
        assert Handle.live_count() == live + 1
        fin = h._finalizer
    assert h.closed and not fin.alive
    assert Handle.live_count() == live
    h.close()  # idempotent
    h3 = Handle(0)
    fin = h3._finalizer
    del h3
    gc.collect()
    assert not fin.alive  # destroyed by the finalizer
    assert Handle.live_count() == live
    h4 = Handle(0)
    ptr = h4.detach()  # ours to destroy now
    assert h4.closed and Handle.live_count() == live
    api.cudnnDestroy(ptr)


def test_set_stream_binds_and_skips_unchanged(monkeypatch):
    real = api.cudnnSetStream
    calls = []

    def counting(handle, stream):
        calls.append(stream)
        return real(handle, stream)

    monkeypatch.setattr(api, "cudnnSetStream", counting)
    s = _new_stream()
    try:
        h = Handle(0)
        assert _bound_stream(h) == 0 and h.stream == 0
        assert h.set_stream(s) == s
        assert _bound_stream(h) == s and h.stream == s
        for _ in range(5):
            h.set_stream(s)
        assert calls == [s]  # one C call for six set_stream(s)
        h.set_stream(None)
        assert _bound_stream(h) == 0
        assert calls == [s, 0]
        h.close()
    finally:
        _destroy_stream(s)


def test_stream_objects_from_torch_cupy_and_cuda_core():
    h = Handle(0)
    seen = 0
    try:
        import torch

        ts = torch.cuda.Stream()
        assert h.set_stream(ts) == ts.cuda_stream
        assert _bound_stream(h) == ts.cuda_stream
        assert hmod.coerce_stream(torch.cuda.default_stream()) == 0
        seen += 1
    except ImportError:
        pass
    try:
        import cupy

        cs = cupy.cuda.Stream(non_blocking=True)
        assert h.set_stream(cs) == cs.ptr
        assert _bound_stream(h) == cs.ptr
        seen += 1
    except ImportError:
        pass
    try:
        try:
            from cuda.core import Device
        except ImportError:
            from cuda.core.experimental import Device
        dev = Device(0)
        dev.set_current()
        cc = dev.create_stream()
        expected = int(cc.handle)
        assert h.set_stream(cc) == expected
        assert _bound_stream(h) == expected
        seen += 1
    except ImportError:
        pass
    h.set_stream(0)
    h.close()
    if not seen:
        pytest.skip("none of torch, cupy, cuda.core is installed")


def test_device_context_restores():
    before = hmod.current_device()
    with DeviceContext(before) as d:
        assert d == before == hmod.current_device()
    assert hmod.current_device() == before


def _scale(h: Handle, desc, ptr: int, alpha: float) -> None:
    a = ctypes.c_float(alpha)
    api.cudnnScaleTensor(h, desc, ptr, ctypes.byref(a))


def _tensor_desc(n: int):
    desc = _lib.cudnnTensorDescriptor_t()
    api.cudnnCreateTensorDescriptor(ctypes.byref(desc))
    api.cudnnSetTensor4dDescriptor(desc, 0, 0, 1, 1, 1, n)  # NCHW, FLOAT, 1x1x1xn
    return desc


def test_eight_threads_get_their_own_handles_and_streams():
    n_threads, n = 8, 1 << 16
    barrier = threading.Barrier(n_threads)
    results: dict[int, dict] = {}
    errors: list[BaseException] = []

    def work(tid: int) -> None:
        try:
            s = _new_stream()
            desc = _tensor_desc(n)
            try:
                h = get_handle()
                assert get_handle() is h
                h.set_stream(s)
                x = pycudnn.to_device(np.full(n, tid + 1, np.float32), stream=s)
                barrier.wait(30)  # all threads run cuDNN at the same time
                for _ in range(50):
                    _scale(h, desc, x.ptr, 2.0)
                    _scale(h, desc, x.ptr, 0.5)
                _scale(h, desc, x.ptr, float(tid + 1))
                out = x.get()
                results[tid] = {
                    "ptr": h.ptr,
                    "thread": h.thread_id == threading.get_ident(),
                    "stream": (h.stream, _bound_stream(h), s),
                    "ok": bool(np.all(out == (tid + 1) ** 2)),
                }
                h.set_stream(0)
                del x
                gc.collect()
            finally:
                api.cudnnDestroyTensorDescriptor(desc)
                _destroy_stream(s)
        except BaseException as exc:  # reported below
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len(results) == n_threads
    assert len({r["ptr"] for r in results.values()}) == n_threads  # one handle per thread
    assert get_handle().ptr not in {r["ptr"] for r in results.values()}
    for r in results.values():
        assert r["thread"]
        own, bound, s = r["stream"]
        assert own == bound == s
        assert r["ok"]
    gc.collect()  # the threads' handles are destroyed with their thread-local storage


def test_one_handle_per_device():
    if hmod.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    before = hmod.current_device()
    h0, h1 = get_handle(0), get_handle(1)
    assert h0 is not h1 and (h0.device, h1.device) == (0, 1)
    assert get_handle(1) is h1
    assert hmod.current_device() == before  # creation restored the caller's device
