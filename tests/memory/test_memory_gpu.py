"""Device memory on a real GPU: round trips for every dtype, zero-copy with torch and CuPy both
ways (same pointer, writes visible), DLPack consumer/producer, workspaces and the OOM path,
rejection of host / wrong-device / misaligned pointers.

Run on the GPU machine: ``PYTHONPATH=. python3 -m pytest -m gpu -q``.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref

import numpy as np
import pytest

import pycudnn
from pycudnn import errors
from pycudnn import memory as mem
from pycudnn.handle import Handle, get_handle
from pycudnn.memory import DeviceArray, NotDeviceMemoryError, _dlpack

pytestmark = pytest.mark.gpu

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)

DTYPES = [np.float16, BF16, np.float32, np.float64, np.int8, np.int32, np.uint8, np.bool_, np.int64]


def _rt():
    from cuda.bindings import runtime

    return runtime


def _sample(dtype, shape=(3, 5, 7)) -> np.ndarray:
    dtype = np.dtype(dtype)
    n = int(np.prod(shape))
    if dtype == np.bool_:
        return (np.arange(n) % 3 == 0).reshape(shape)
    if dtype.kind in "iu":
        return (np.arange(n) % 100 - (0 if dtype.kind == "u" else 50)).astype(dtype).reshape(shape)
    return (np.arange(n, dtype=np.float32) / 8 - 3).astype(dtype).reshape(shape)


@pytest.fixture
def torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    return torch


@pytest.fixture
def cupy():
    return pytest.importorskip("cupy")


# -- allocation and host round trips -------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_round_trip_every_dtype(dtype):
    x = _sample(dtype)
    d = pycudnn.to_device(x)
    assert isinstance(d, DeviceArray)
    assert d.shape == x.shape and d.dtype == x.dtype and d.strides == x.strides
    assert d.nbytes == x.nbytes and d.ptr != 0 and d.device == 0
    mem.check_device_pointer(d.ptr, 0)
    y = d.get()
    assert y.dtype == x.dtype
    np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_fill_zeros_empty_every_dtype(dtype):
    value = {np.dtype(np.bool_): True, np.dtype(np.uint8): 200}.get(np.dtype(dtype), -1.5)
    if np.dtype(dtype).kind == "i":
        value = -7
    a = pycudnn.empty((4, 33), dtype)
    assert a.shape == (4, 33) and a.dtype == np.dtype(dtype)
    a.fill_(value)
    np.testing.assert_array_equal(a.get(), np.full((4, 33), value, dtype))
    z = pycudnn.zeros((4, 33), dtype)
    np.testing.assert_array_equal(z.get(), np.zeros((4, 33), dtype))


def test_round_trip_on_a_stream_and_dense_layouts(torch):
    s = torch.cuda.Stream()
    x = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 4, 5, 3).transpose(0, 3, 1, 2)
    d = pycudnn.to_device(x, stream=s)  # NHWC memory viewed as NCHW: the layout is kept
    assert d.stream == s.cuda_stream
    assert d.__cuda_array_interface__["stream"] == s.cuda_stream
    assert d.strides == x.strides and d.is_dense and not d.is_c_contiguous
    y = d.get()
    assert y.strides == x.strides
    np.testing.assert_array_equal(y, x)
    like = mem.empty_like(d, np.float16)
    assert like.strides == tuple(st // 2 for st in x.strides)
    c = d.copy()
    assert c.ptr != d.ptr and c.strides == d.strides
    np.testing.assert_array_equal(c.get(), x)
    s.synchronize()


def test_copy_in_place_and_scalar_arrays():
    a = pycudnn.empty((3, 4), np.float64)
    a.copy_(np.arange(12.0).reshape(3, 4))
    b = pycudnn.empty((3, 4), np.float64).copy_(a)
    np.testing.assert_array_equal(b.get(), np.arange(12.0).reshape(3, 4))
    f = np.asfortranarray(np.arange(12.0).reshape(3, 4))
    a.copy_(f)  # host source in another layout: reordered on the host
    np.testing.assert_array_equal(a.get(), f)
    with pytest.raises(ValueError, match="does not match"):
        a.copy_(np.zeros((4, 3)))
    s = pycudnn.to_device(np.float32(2.5))
    assert s.shape == () and s.get() == np.float32(2.5)
    e = pycudnn.zeros((0, 5))
    assert e.ptr == 0 and e.get().shape == (0, 5)


def test_memory_is_freed_with_the_last_view():
    a = pycudnn.empty((1024,), np.float32)
    v = a.reshape(32, 32)
    ref = weakref.ref(a.base)
    del a
    gc.collect()
    assert ref() is not None  # the reshaped view keeps the allocation
    del v
    gc.collect()
    assert ref() is None


# -- zero copy with torch --------------------------------------------------------------------------
def test_torch_tensor_viewed_without_copy(torch):
    t = torch.arange(24, dtype=torch.float32, device="cuda").reshape(4, 6)
    v = pycudnn.asarray(t)
    assert v.ptr == t.data_ptr()
    assert v.shape == (4, 6) and v.dtype == np.float32 and v.strides == (24, 4)
    t.mul_(2)  # torch writes, we see them
    np.testing.assert_array_equal(v.get(), np.arange(24, dtype=np.float32).reshape(4, 6) * 2)
    v.fill_(7.0)  # we write, torch sees them
    torch.cuda.synchronize()
    assert bool((t == 7).all())


def test_torch_views_our_array_without_copy(torch):
    a = pycudnn.to_device(np.arange(12, dtype=np.float32).reshape(3, 4))
    t = torch.as_tensor(a, device="cuda")  # __cuda_array_interface__
    assert t.data_ptr() == a.ptr and tuple(t.shape) == (3, 4)
    t.add_(1)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(a.get(), np.arange(12, dtype=np.float32).reshape(3, 4) + 1)
    t2 = torch.from_dlpack(a)  # DLPack
    assert t2.data_ptr() == a.ptr
    a.fill_(3.0)
    torch.cuda.synchronize()
    assert bool((t2 == 3).all())


def test_torch_layouts_and_dtypes(torch):
    x = torch.randn(2, 3, 4, 5, device="cuda").contiguous(memory_format=torch.channels_last)
    v = pycudnn.asarray(x)
    assert v.strides == tuple(s * 4 for s in x.stride())
    assert v.is_dense and not v.is_c_contiguous
    np.testing.assert_array_equal(v.get(), x.cpu().numpy())
    for tdt, ndt in [
        (torch.float16, np.float16),
        (torch.bfloat16, BF16),
        (torch.float64, np.float64),
        (torch.int8, np.int8),
        (torch.int32, np.int32),
        (torch.uint8, np.uint8),
        (torch.bool, np.bool_),
    ]:
        t = (torch.arange(10, device="cuda") % 3).to(tdt)
        v = pycudnn.asarray(t)
        assert v.dtype == ndt, tdt  # bfloat16 must not come out as float16 (torch's CAI says <f2)
        assert v.ptr == t.data_ptr()
        expected = t.cpu().float().numpy().astype(ndt) if tdt == torch.bfloat16 else t.cpu().numpy()
        np.testing.assert_array_equal(v.get(), expected)
    bf = torch.full((4,), 1.5, dtype=torch.bfloat16, device="cuda")
    t2 = torch.from_dlpack(pycudnn.asarray(bf))
    assert t2.dtype == torch.bfloat16 and t2.data_ptr() == bf.data_ptr()


def test_torch_strided_and_cpu_tensors(torch):
    base = torch.arange(48, dtype=torch.float32, device="cuda").reshape(6, 8)
    view = base[1:5, ::2]  # gaps: not dense
    v = pycudnn.asarray(view)
    assert not v.is_dense
    np.testing.assert_array_equal(v.get(), view.cpu().numpy())
    with pytest.raises(TypeError, match="to_device"):
        pycudnn.asarray(torch.zeros(3))  # a CPU tensor


def test_torch_owner_kept_alive(torch):
    t = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    ptr = t.data_ptr()
    v = pycudnn.asarray(t)
    via_dlpack = pycudnn.asarray(torch.utils.dlpack.to_dlpack(t))  # a bare capsule
    assert via_dlpack.ptr == ptr
    del t
    gc.collect()
    torch.cuda.empty_cache()
    junk = torch.full((1 << 20,), -1.0, device="cuda")  # would reuse the block if it were freed
    np.testing.assert_array_equal(v.get()[:5], np.arange(5, dtype=np.float32))
    np.testing.assert_array_equal(via_dlpack.get()[-3:], np.arange((1 << 20) - 3, 1 << 20))
    del junk


# -- zero copy with CuPy ---------------------------------------------------------------------------
def test_cupy_both_ways(cupy):
    c = cupy.arange(20, dtype=cupy.float32).reshape(4, 5)
    v = pycudnn.asarray(c)
    assert v.ptr == c.data.ptr and v.strides == c.strides
    c *= 3
    np.testing.assert_array_equal(v.get(), cupy.asnumpy(c))
    v.fill_(1.0)
    assert float(c.sum()) == 20.0
    a = pycudnn.to_device(np.arange(6, dtype=np.int32))
    c2 = cupy.asarray(a)  # __cuda_array_interface__
    assert c2.data.ptr == a.ptr
    c2 += 10
    np.testing.assert_array_equal(a.get(), np.arange(6) + 10)
    c3 = cupy.from_dlpack(a)  # DLPack
    assert c3.data.ptr == a.ptr
    np.testing.assert_array_equal(cupy.asnumpy(c3), np.arange(6) + 10)


def test_cupy_strided_and_negative_strides(cupy):
    c = cupy.arange(60, dtype=cupy.float64).reshape(6, 10)
    for view in (c[:, ::3], c[::-1], c.T, c[2:4, 1:9:2]):
        v = pycudnn.asarray(view)
        assert v.ptr == view.data.ptr and v.strides == view.strides
        np.testing.assert_array_equal(v.get(), cupy.asnumpy(view))


def test_cupy_stream_protocol(cupy):
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        c = cupy.ones(1000, dtype=cupy.float32)
        v = pycudnn.asarray(c, stream=s)
    assert v.stream == s.ptr
    np.testing.assert_array_equal(v.get(), np.ones(1000, np.float32))
    s.synchronize()


# -- our own DLPack round trip on real memory ----------------------------------------------------
def test_dlpack_round_trip_on_device():
    a = pycudnn.to_device(np.arange(10, dtype=np.float16))
    gc.collect()
    before = _dlpack.live_exports()
    b = pycudnn.asarray(a.__dlpack__(max_version=(1, 0)))
    assert b.ptr == a.ptr and b.dtype == np.float16
    c = a.__dlpack__(copy=True)
    cc = pycudnn.asarray(c)
    assert cc.ptr != a.ptr
    np.testing.assert_array_equal(cc.get(), a.get())
    del b, c, cc
    gc.collect()
    assert _dlpack.live_exports() == before


# -- pointer checks --------------------------------------------------------------------------------
def test_host_pointers_are_rejected():
    host = np.zeros(16, np.float32)
    with pytest.raises(NotDeviceMemoryError, match=r"img: .*host memory.*to_device") as info:
        mem.check_device_pointer(host.ctypes.data, argument="img")
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)
    with pytest.raises(NotDeviceMemoryError, match="to_device"):
        DeviceArray.from_ptr(host.ctypes.data, (16,), np.float32)
    rt = _rt()
    err, pinned = rt.cudaMallocHost(4096)
    assert int(err) == 0
    try:
        with pytest.raises(NotDeviceMemoryError, match="page-locked host memory"):
            mem.check_device_pointer(pinned, argument="w")
    finally:
        rt.cudaFreeHost(pinned)
    assert int(rt.cudaGetLastError()[0]) == 0  # the failed queries left no error behind


def test_managed_memory_needs_opt_in():
    rt = _rt()
    err, ptr = rt.cudaMallocManaged(4096, 1)  # cudaMemAttachGlobal; small on purpose
    assert int(err) == 0
    try:
        with pytest.raises(NotDeviceMemoryError, match="allow_managed=True"):
            mem.check_device_pointer(ptr, argument="x")
        assert mem.check_device_pointer(ptr, argument="x", allow_managed=True) == 0
    finally:
        rt.cudaFree(ptr)


def test_wrong_device_and_misaligned_pointers():
    a = pycudnn.to_device(np.arange(8, dtype=np.float32))
    assert mem.check_device_pointer(a.ptr, 0) == 0
    with pytest.raises(ValueError, match="x is on device 0, but the handle is on device 1"):
        mem.check_device_pointer(a.ptr, 1, argument="x")
    h = get_handle()
    assert mem.check_device_pointer(a.ptr, h.device, argument="img") == 0
    odd = DeviceArray.from_ptr(a.ptr + 2, (4,), np.float32, owner=a)  # an interior pointer
    assert odd.device == 0
    with pytest.raises(ValueError, match=r"img: device pointer .* not aligned to 4 bytes"):
        mem.check_alignment(odd.ptr, odd.itemsize, argument="img")
    mem.check_alignment(a.ptr, 16, argument="a")  # pool allocations are well aligned


# -- workspaces and out-of-memory ------------------------------------------------------------------
def test_workspace_grows_per_stream():
    rt = _rt()
    h = Handle(0)
    err, s2 = rt.cudaStreamCreateWithFlags(1)
    assert int(err) == 0
    s2 = int(s2)
    try:
        ptr, size = mem.get_workspace(h, 1000)
        assert ptr and size >= 1000
        assert mem.get_workspace(h, 10) == (ptr, size)  # smaller: reused
        assert h.workspace(10) == (ptr, size) and h.workspace_size() == size  # the same buffer
        assert mem.workspace_size(h) == size
        ptr2, size2 = mem.get_workspace(h, size + 1)
        assert size2 > size and mem.workspace_size(h) == size2
        mem.check_device_pointer(ptr2, 0)
        p3, s3 = mem.get_workspace(h, 5000, stream=s2)  # a different stream: its own buffer
        assert p3 != ptr2 and mem.workspace_size(h, s2) == s3
        assert mem.get_workspace(h, 0) == (ptr2, size2)
        with pycudnn.config.override(workspace_limit=size2 + 10):
            assert mem.get_workspace(h, size2 + 5)[1] <= size2 + 10  # capped at the limit
            with pytest.raises(errors.AllocationError, match="workspace_limit"):
                mem.get_workspace(h, size2 + 11)
        mem.release_workspace(h, s2)
        assert mem.workspace_size(h, s2) == 0
    finally:
        h.close()  # frees the workspaces before the stream goes
        rt.cudaStreamSynchronize(s2)
        rt.cudaStreamDestroy(s2)


def test_out_of_memory_raises_allocation_error_and_recovers():
    h = Handle(0)
    free, total = mem.mem_get_info()
    ask = free + (1 << 30)
    with pytest.raises(errors.AllocationError) as info:
        mem.get_workspace(h, ask)
    exc = info.value
    assert isinstance(exc, MemoryError)
    assert exc.requested == ask and exc.total == total and exc.free > 0
    text = str(exc)
    assert f"({ask} bytes)" in text and "free of" in text
    with pytest.raises(MemoryError, match="out of memory"):
        pycudnn.empty((ask // 4,), np.float32)
    with pytest.raises(MemoryError, match="absurd"):
        pycudnn.empty((1 << 41,), np.uint8)
    # nothing sticky: allocation and cuDNN still work
    assert int(_rt().cudaGetLastError()[0]) == 0
    ptr, size = mem.get_workspace(h, 1 << 20)  # the caller's fallback: a smaller workspace
    assert ptr and size >= 1 << 20
    np.testing.assert_array_equal(pycudnn.to_device(np.ones(3)).get(), np.ones(3))
    h.close()


# -- caching allocator ----------------------------------------------------------------------------
def test_cache_reuses_blocks_on_the_same_stream_with_real_data():
    mem.empty_cache()
    x = np.arange(1000, dtype=np.float32)
    a = pycudnn.to_device(x)
    ptr = a.ptr
    np.testing.assert_array_equal(a.get(), x)
    before = mem.cache_stats()
    del a
    gc.collect()
    assert mem.cache_stats()["cached_blocks"] == before["cached_blocks"] + 1
    b = pycudnn.empty((10, 100), np.float32, 0, 0)  # same class, same stream: a's block
    assert b.ptr == ptr and mem.cache_stats()["hits"] == before["hits"] + 1
    y = (x[::-1] * 2).reshape(10, 100)
    b.copy_(y)
    np.testing.assert_array_equal(b.get(), y)
    # work queued on the block, the block freed and reused at once: the stream orders them
    big = 1 << 22
    c = pycudnn.zeros((big,), np.float32)
    c.fill_(3.0)
    pc = c.ptr
    del c
    d = pycudnn.empty((big,), np.float32, 0, 0)
    assert d.ptr == pc
    d.fill_(5.0)
    np.testing.assert_array_equal(d.get()[::4096], np.full(big // 4096, 5.0, np.float32))
    del b  # cached on stream 0 ...
    rt = _rt()
    err, s2 = rt.cudaStreamCreateWithFlags(1)
    assert int(err) == 0
    s2 = int(s2)
    try:
        e = pycudnn.empty((1000,), np.float32, stream=s2)  # ... never handed to another stream
        assert e.ptr != ptr and e.stream == s2
        e.copy_(x, stream=s2)
        np.testing.assert_array_equal(e.get(), x)
        del e
        gc.collect()
        assert mem.cache_stats()["cached_bytes"] > 0
        assert mem.empty_cache() > 0  # before the stream goes (an int stream must outlive them)
        assert mem.cache_stats()["cached_bytes"] == 0
    finally:
        rt.cudaStreamSynchronize(s2)
        rt.cudaStreamDestroy(s2)
    assert int(rt.cudaGetLastError()[0]) == 0
    np.testing.assert_array_equal(pycudnn.to_device(x).get(), x)


def test_cache_limit_on_the_device():
    mem.empty_cache()
    previous = mem.set_cache_limit(1 << 20)
    try:
        arrays = [pycudnn.empty((1 << 18,), np.float32) for _ in range(3)]  # 1 MiB each
        del arrays
        gc.collect()
        assert mem.cache_stats(0)["cached_bytes"] <= 1 << 20
        big = pycudnn.empty((1 << 20,), np.float32)  # 4 MiB: above the limit, never cached
        del big
        gc.collect()
        assert mem.cache_stats(0)["cached_bytes"] <= 1 << 20
    finally:
        mem.set_cache_limit(previous)
        mem.empty_cache()
    assert int(_rt().cudaGetLastError()[0]) == 0


def test_out_of_memory_releases_the_cache_then_raises():
    mem.empty_cache()
    blocks = [pycudnn.empty((64 << 20,), np.uint8) for _ in range(4)]
    del blocks
    gc.collect()
    stats = mem.cache_stats(0)
    assert stats["cached_bytes"] >= 4 * (64 << 20)
    free, total = mem.mem_get_info()
    ask = free + (1 << 30)
    with pytest.raises(errors.AllocationError) as info:
        pycudnn.empty((ask,), np.uint8)
    exc = info.value
    assert isinstance(exc, MemoryError) and "out of memory" in str(exc)
    assert exc.requested == ask and exc.total == total and exc.device == 0
    after = mem.cache_stats(0)
    assert after["oom_releases"] == stats["oom_releases"] + 1 and after["cached_bytes"] == 0
    assert int(_rt().cudaGetLastError()[0]) == 0  # nothing sticky
    x = np.arange(10, dtype=np.float64)
    np.testing.assert_array_equal(pycudnn.to_device(x).get(), x)


def test_exit_with_cached_blocks_is_clean():
    code = """
import gc, numpy as np, pycudnn
keep = pycudnn.to_device(np.ones(1000, np.float32))
for n in (10, 1000, 100000):
    pycudnn.empty((n,), np.float32)
gc.collect()
assert pycudnn.memory.cache_stats()["cached_blocks"] == 3
print("done")
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().endswith("done")
    assert "Traceback" not in res.stderr and "Exception ignored" not in res.stderr


# -- interpreter shutdown --------------------------------------------------------------------------
def test_exit_with_live_arrays_handles_and_exports_is_clean():
    code = """
import numpy as np, pycudnn
h = pycudnn.get_handle()
a = pycudnn.to_device(np.ones(1000, np.float32))
ws = pycudnn.memory.get_workspace(h, 1 << 20)
cap = a.__dlpack__()
try:
    import torch
    t = torch.from_dlpack(pycudnn.empty((10,)))
    v = pycudnn.asarray(torch.ones(5, device="cuda"))
except ImportError:
    pass
print("done")
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().endswith("done")
    assert "Traceback" not in res.stderr and "Exception ignored" not in res.stderr


# -- several devices (skipped on one-GPU machines) -------------------------------------------------
def _two_devices():
    from pycudnn import handle as hmod

    if hmod.device_count() < 2:
        pytest.skip("needs 2 GPUs")


def test_arrays_on_another_device_are_placed_and_checked():
    _two_devices()
    from pycudnn import handle as hmod

    before = hmod.current_device()
    x = np.arange(10, dtype=np.float32)
    a1 = pycudnn.to_device(x, device=1)
    assert a1.device == 1 and hmod.current_device() == before
    assert mem.check_device_pointer(a1.ptr) == 1
    np.testing.assert_array_equal(a1.get(), x)
    a1.fill_(2.0)
    np.testing.assert_array_equal(a1.get(), np.full(10, 2.0, np.float32))
    with pytest.raises(ValueError, match="a is on device 1, but the handle is on device 0"):
        mem.check_device_pointer(a1.ptr, get_handle(0).device, argument="a")
    assert mem.check_device_pointer(a1.ptr, get_handle(1).device, argument="a") == 1
    h1 = get_handle(1)
    ptr, _size = mem.get_workspace(h1, 1 << 20)
    assert mem.check_device_pointer(ptr) == 1
    assert hmod.current_device() == before


def test_views_read_and_write_the_right_elements():
    x = np.arange(6 * 8, dtype=np.float32).reshape(6, 8)
    a = pycudnn.to_device(x)
    for key in [(slice(1, None), slice(None, None, 2)), slice(None, None, -1), (2,), (Ellipsis, 3)]:
        np.testing.assert_array_equal(a[key].get(), x[key])
    np.testing.assert_array_equal(a.T.get(), x.T)
    a[2].fill_(-1.0)  # a dense row of a bigger array
    a[4:].copy_(np.zeros((2, 8), np.float32))
    x[2] = -1.0
    x[4:] = 0.0
    np.testing.assert_array_equal(a.get(), x)
    with pytest.raises(NotImplementedError):
        a[:, ::2].fill_(0.0)


# -- the README snippets of this issue, run as written ---------------------------------------------
README_NUMPY = """
# GPU: move a numpy array to the GPU and back
import numpy as np
import pycudnn

x = pycudnn.to_device(np.arange(12, dtype=np.float32).reshape(3, 4))
print(x)                    # DeviceArray(shape=(3, 4), dtype=float32, device=0, ptr=0x...)
y = x.get()                 # a new numpy array
assert (y == np.arange(12).reshape(3, 4)).all()
"""

README_TORCH = """
# GPU: view a torch tensor without a copy, and the other way round
import torch
import pycudnn

t = torch.ones(2, 3, device="cuda")
v = pycudnn.asarray(t)      # no copy: the same memory
assert v.ptr == t.data_ptr()
t.mul_(5)                   # written through torch ...
assert (v.get() == 5).all() # ... read through pycudnn
u = torch.from_dlpack(v)    # back to torch, still no copy
assert u.data_ptr() == t.data_ptr()
"""


def test_readme_numpy_snippet():
    exec(compile(README_NUMPY, "README.md", "exec"), {"__name__": "readme"})


def test_readme_torch_snippet(torch):
    exec(compile(README_TORCH, "README.md", "exec"), {"__name__": "readme"})
