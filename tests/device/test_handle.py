"""Handle and stream logic that needs no GPU: stream coercion, no-GPU errors, rebinding rules."""

from __future__ import annotations

import ctypes
import pickle

import pytest

import pycudnn
from pycudnn import _cuda, _lib, api
from pycudnn import handle as hmod
from pycudnn.handle import CudaError, CudaUnavailableError, Handle, coerce_stream

no_gpu = pytest.mark.skipif(
    hmod.gpu_unavailable_reason() is None, reason="a GPU is present: the no-GPU path is not taken"
)


# -- stream coercion -----------------------------------------------------------------------------
class CoreStream:
    """cuda.core-style: __cuda_stream__() -> (version, handle)."""

    def __init__(self, handle):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


class OldCoreStream:
    """Early cuda.core made __cuda_stream__ a property."""

    @property
    def __cuda_stream__(self):
        return (0, 0x5000)


class TorchLikeStream:
    cuda_stream = 0x7F00


class CupyLikeStream:
    ptr = 0x7E00


class BadProtocol:
    def __cuda_stream__(self):
        return "nope"


@pytest.mark.parametrize(
    ("stream", "expected"),
    [
        (None, 0),
        (0, 0),
        (1, 1),
        (2, 2),
        (0xDEAD0000, 0xDEAD0000),
        (CoreStream(0x1234), 0x1234),
        (CoreStream(0), 0),
        (OldCoreStream(), 0x5000),
        (TorchLikeStream(), 0x7F00),
        (CupyLikeStream(), 0x7E00),
        (ctypes.c_void_p(0x42), 0x42),
        (ctypes.c_void_p(None), 0),
        (_lib.cudaStream_t(0x43), 0x43),
    ],
)
def test_coerce_stream(stream, expected):
    assert coerce_stream(stream) == expected
    assert type(coerce_stream(stream)) is int


def test_coerce_stream_int_subclasses_and_numpy_ints():
    np = pytest.importorskip("numpy")

    class MyInt(int):
        pass

    assert coerce_stream(MyInt(7)) == 7
    assert type(coerce_stream(MyInt(7))) is int
    assert coerce_stream(np.uint64(9)) == 9


def test_coerce_stream_cuda_bindings_objects():
    from cuda.bindings import driver, runtime

    assert coerce_stream(driver.CUstream(0x99)) == 0x99
    assert coerce_stream(runtime.cudaStream_t(0x98)) == 0x98


@pytest.mark.parametrize("bad", [-1, True, "0", 1.0, object(), BadProtocol()])
def test_coerce_stream_rejects(bad):
    with pytest.raises((TypeError, ValueError)) as info:
        coerce_stream(bad)
    if isinstance(bad, object) and type(bad) is object:
        assert "__cuda_stream__" in str(info.value)


def test_coerce_stream_nested_protocol_value_is_checked():
    with pytest.raises(ValueError, match="negative"):
        coerce_stream(CoreStream(-5))


# -- handles without a GPU -------------------------------------------------------------------------
@no_gpu
def test_no_gpu_reason_and_count():
    reason = hmod.gpu_unavailable_reason()
    assert isinstance(reason, str) and reason
    assert hmod.device_count() == 0


@no_gpu
@pytest.mark.parametrize(
    "call",
    [
        lambda: pycudnn.get_handle(),
        lambda: pycudnn.get_handle(0),
        lambda: Handle(),
        lambda: Handle(0),
        lambda: hmod.require_gpu("dnn_conv"),
    ],
)
def test_no_gpu_raises_a_runtime_error_saying_a_gpu_is_needed(call):
    with pytest.raises(CudaUnavailableError) as info:
        call()
    assert isinstance(info.value, RuntimeError)
    text = str(info.value)
    assert "needs a CUDA GPU" in text
    assert "none is usable" in text
    assert hmod.gpu_unavailable_reason() in text  # says what was found


@no_gpu
def test_is_available_false_without_gpu():
    info = pytest.importorskip("pycudnn._info")
    assert info.is_available() is False


def test_handle_is_exported():
    assert pycudnn.Handle is Handle
    assert pycudnn.get_handle is hmod.get_handle


# -- handle logic on a wrapped (non-owned) pointer: no C call is made ------------------------------
@pytest.fixture
def set_stream_calls(monkeypatch):
    calls = []
    monkeypatch.setattr(api, "cudnnSetStream", lambda h, s: calls.append((h, s)), raising=False)
    return calls


def test_set_stream_skips_unchanged(set_stream_calls):
    h = Handle.from_ptr(0x1000, 0)
    assert h.stream == 0
    assert h.set_stream(None) == 0
    assert h.set_stream(0) == 0
    assert set_stream_calls == []  # already on stream 0
    assert h.set_stream(0x5000) == 0x5000
    assert h.set_stream(0x5000) == 0x5000
    assert h.set_stream(CoreStream(0x5000)) == 0x5000
    assert len(set_stream_calls) == 1
    handle_arg, stream_arg = set_stream_calls[0]
    assert isinstance(handle_arg, _lib.cudnnHandle_t) and handle_arg.value == 0x1000
    assert stream_arg == 0x5000
    assert h.set_stream(TorchLikeStream()) == 0x7F00
    assert h.stream == 0x7F00
    assert len(set_stream_calls) == 2


def test_bound_stream_object_is_kept_alive_and_fast_pathed(set_stream_calls):
    import weakref

    h = Handle.from_ptr(0x1000, 0)
    s = CoreStream(0x2000)
    ref = weakref.ref(s)
    h.set_stream(s)
    del s
    assert ref() is not None  # bound: referenced by the handle
    assert h.set_stream(ref()) == 0x2000  # identity fast path
    h.set_stream(0)
    assert ref() is None
    assert len(set_stream_calls) == 2


def test_from_ptr_is_not_owning_and_close_is_idempotent():
    owner = object()
    h = Handle.from_ptr(0x1000, 3, owner=owner, stream=0x10)
    assert (h.ptr, h.device, h.stream) == (0x1000, 3, 0x10)
    assert "0x1000" in repr(h) and "device=3" in repr(h)
    assert h._as_parameter_.value == 0x1000
    h.close()
    h.close()
    assert h.closed
    with pytest.raises(ValueError, match="Handle is closed"):
        h.ptr  # noqa: B018
    with pytest.raises(ValueError, match="Handle is closed"):
        h.set_stream(5)
    with pytest.raises(ValueError, match="Handle is closed"), h:
        pass
    assert "closed" in repr(h)


def test_detach_returns_pointer():
    n = Handle.live_count()
    h = Handle.from_ptr(0x1000, 0)
    assert h.detach() == 0x1000
    assert h.closed and Handle.live_count() == n  # borrowed wrappers are not counted


def test_close_frees_workspaces():
    closed = []

    class FakeWorkspace:
        def close(self):
            closed.append(True)

    h = Handle.from_ptr(0x1000, 0)
    h._workspaces[0] = FakeWorkspace()
    with h:
        pass
    assert closed == [True]
    assert h._workspaces == {}


def test_cuda_error_message_and_pickle():
    exc = CudaError("cudaMemcpyAsync", 1, "cudaErrorInvalidValue", "invalid argument")
    assert str(exc) == "cudaMemcpyAsync failed: cudaErrorInvalidValue (1): invalid argument"
    assert isinstance(exc, RuntimeError)
    again = pickle.loads(pickle.dumps(exc))
    assert str(again) == str(exc) and again.code == 1


def test_check_unpacks_results():
    from cuda.bindings import runtime

    ok = runtime.cudaError_t.cudaSuccess
    assert _cuda.check((ok,), "f") is None
    assert _cuda.check((ok, 5), "f") == 5
    assert _cuda.check((ok, 5, 6), "f") == (5, 6)
    with pytest.raises(CudaError, match="f failed: cudaErrorInvalidValue"):
        _cuda.check((runtime.cudaError_t.cudaErrorInvalidValue, None), "f")


def test_importing_the_runtime_modules_loads_nothing():
    import subprocess
    import sys

    code = (
        "import sys, pycudnn.handle, pycudnn.memory, pycudnn._config;"
        "from pycudnn import _loader;"
        "assert _loader.loaded() is None, 'libcudnn was loaded';"
        "assert 'cuda.bindings.runtime' not in sys.modules, 'cuda.bindings imported eagerly';"
        "assert 'torch' not in sys.modules and 'cupy' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@no_gpu
def test_high_level_call_without_gpu_says_a_gpu_is_needed():
    np = pytest.importorskip("numpy")
    highlevel = pytest.importorskip("pycudnn.highlevel")
    from pycudnn.memory import DeviceArray

    x = DeviceArray.from_ptr(0x7F0000000000, (1, 3, 8, 8), np.float32, device=0, check=False)
    w = DeviceArray.from_ptr(0x7F0000100000, (4, 3, 3, 3), np.float32, device=0, check=False)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        highlevel.dnn_conv(x, w)


# -- the destroy runs on the handle's device (a fake runtime, a fake cudnnDestroy) ---------------
class _DeviceRuntime:
    """``cudaGetDevice``/``cudaSetDevice`` only, logging the switches."""

    def __init__(self):
        self.dev = 0
        self.log = []

    def cudaGetDevice(self):
        return (0, self.dev)

    def cudaSetDevice(self, d):
        self.log.append(("set", d))
        self.dev = d
        return (0,)


@pytest.fixture
def owned_handle(monkeypatch):
    """A factory of owned Handles on device 1 around fake addresses, with no GPU: what
    ``Handle(1)`` builds after ``cudnnCreate``; destroys are logged with the device current."""
    fake_rt = _DeviceRuntime()
    destroyed = []
    monkeypatch.setattr(_cuda, "_rt", fake_rt)
    monkeypatch.setattr(
        _lib, "cudnnDestroy", lambda p: destroyed.append((p, fake_rt.dev)) or 0, raising=False
    )

    def make(ptr):
        h = Handle.__new__(Handle)
        h._init_state(1)
        h._adopt(_lib.cudnnHandle_t(ptr))
        return h

    make.rt, make.destroyed = fake_rt, destroyed
    return make


def test_close_destroys_on_the_handles_device(owned_handle):
    n = Handle.live_count()
    h = owned_handle(0x2000)
    assert Handle.live_count() == n + 1 and h.owned
    fin = h._finalizer
    _obj, _func, (destroy, ptr, _counter), _kw = fin.peek()
    assert ptr == 0x2000 and not isinstance(destroy, Handle)  # values only, never the Handle
    h.close()
    assert owned_handle.destroyed == [(0x2000, 1)]  # device 1 current during cudnnDestroy
    assert owned_handle.rt.log == [("set", 1), ("set", 0)] and owned_handle.rt.dev == 0
    assert Handle.live_count() == n and h.closed and not fin.alive
    h.close()  # idempotent
    assert len(owned_handle.destroyed) == 1


def test_garbage_collected_handle_is_destroyed_on_its_device(owned_handle):
    import gc

    n = Handle.live_count()
    h = owned_handle(0x3000)
    del h
    gc.collect()
    assert owned_handle.destroyed == [(0x3000, 1)] and Handle.live_count() == n


def test_gc_destroy_is_skipped_at_interpreter_shutdown(owned_handle):
    from pycudnn import _resource

    n = Handle.live_count()
    h = owned_handle(0x4000)
    fin = h._finalizer
    assert fin.atexit  # device state: the atexit pass (before finalization) destroys handles
    _obj, func, (destroy, ptr, counter), _kw = fin.peek()
    assert func is _resource._release
    func(destroy, ptr, counter, lambda: True)  # what the collector runs once finalizing
    assert owned_handle.destroyed == [] and Handle.live_count() == n + 1  # left to the OS
    h.close()  # an explicit close never skips
    assert owned_handle.destroyed == [(0x4000, 1)] and Handle.live_count() == n


def test_detach_disarms_the_destroy(owned_handle):
    n = Handle.live_count()
    h = owned_handle(0x5000)
    assert h.detach() == 0x5000 and h.closed
    assert Handle.live_count() == n
    del h
    import gc

    gc.collect()
    assert owned_handle.destroyed == []


def test_workspace_methods_on_a_closed_or_borrowed_handle_need_no_gpu():
    h = Handle.from_ptr(0x1000, 0, stream=0x50)
    assert h.workspace(0) == (0, 0) and h.workspace_size() == 0 and h.workspace_size(0x60) == 0
    h.release_workspace()  # nothing held: a no-op
    with pytest.raises(ValueError, match="negative"):
        h.workspace(-1)
