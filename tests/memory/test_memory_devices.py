"""Copies between devices and the memory package's layers, without a GPU (issue 28).

A fake CUDA runtime with two devices records which device is current at each call: a copy
between devices is a peer copy (``cudaMemcpyPeerAsync``, which the stream-ordered pool's memory
needs: a plain ``cudaMemcpyAsync`` between two devices' pool blocks fails with
``cudaErrorInvalidValue``), issued with the destination's device current, after the source's
stream (on its own device) and the destination's; the source's stream then waits for the copy;
the caller's device is restored. The GPU side is ``tests/highlevel/test_multigpu_gpu.py``.

The memory package has no import cycle: no module of it imports another that (transitively)
imports it back, and none imports inside a function to hide one.
"""

from __future__ import annotations

import ast
import enum
from pathlib import Path

import numpy as np
import pytest

from pycudnn import _cuda
from pycudnn.memory import DeviceArray

MEMORY = Path(__file__).resolve().parents[2] / "pycudnn" / "memory"
A0, A1 = 0x7F0000000000, 0x7F1000000000


class _Err(enum.IntEnum):
    cudaSuccess = 0
    cudaErrorInvalidValue = 1


class FakeRuntime:
    """Records ``(call, current device, args...)``; a failing peer copy on request."""

    def __init__(self):
        self.dev = 0
        self.calls: list[tuple] = []
        self.events = 0
        self.peer_fails = False

    def _log(self, *entry):
        self.calls.append((entry[0], self.dev, *entry[1:]))

    def cudaGetDevice(self):
        return (_Err.cudaSuccess, self.dev)

    def cudaSetDevice(self, d):
        self.dev = d
        return (_Err.cudaSuccess,)

    def cudaEventCreateWithFlags(self, flags):
        self.events += 1
        return (_Err.cudaSuccess, self.events)

    def cudaEventRecord(self, event, stream):
        self._log("record", event, stream)
        return (_Err.cudaSuccess,)

    def cudaStreamWaitEvent(self, stream, event, flags):
        self._log("wait", stream, event)
        return (_Err.cudaSuccess,)

    def cudaEventDestroy(self, event):
        return (_Err.cudaSuccess,)

    def cudaMemcpyPeerAsync(self, dst, dst_dev, src, src_dev, n, stream):
        self._log("peer", dst, dst_dev, src, src_dev, n, stream)
        return (_Err.cudaErrorInvalidValue if self.peer_fails else _Err.cudaSuccess,)

    def cudaMemcpyAsync(self, dst, src, n, kind, stream):
        self._log("memcpy", dst, src, n, stream)
        return (_Err.cudaSuccess,)

    def cudaStreamSynchronize(self, stream):
        return (_Err.cudaSuccess,)

    def cudaGetLastError(self):
        return (_Err.cudaSuccess,)

    def cudaGetErrorName(self, err):
        return (_Err.cudaSuccess, _Err(int(err)).name.encode())

    def cudaGetErrorString(self, err):
        return (_Err.cudaSuccess, b"fake error")

    class cudaMemcpyKind(enum.IntEnum):
        cudaMemcpyHostToDevice = 1
        cudaMemcpyDeviceToHost = 2
        cudaMemcpyDefault = 4

    def of(self, kind):
        return [c for c in self.calls if c[0] == kind]


@pytest.fixture
def rt(monkeypatch):
    fake = FakeRuntime()
    monkeypatch.setattr(_cuda, "_rt", fake)
    monkeypatch.setattr(_cuda, "_device_count", 2)
    return fake


def view(ptr, device, stream):
    return DeviceArray.from_ptr(ptr, (256,), np.float32, device=device, stream=stream, check=False)


@pytest.mark.parametrize(("s0", "s1"), [(0, 0), (0x10, 0x20), (0x10, 0)])
def test_a_copy_between_devices_is_a_peer_copy_ordered_on_both_devices(rt, s0, s1):
    src, dst = view(A0, 0, s0), view(A1, 1, s1)
    rt.dev = 0  # the caller's device: neither the destination's nor restored wrongly
    dst.copy_(src)
    assert rt.dev == 0
    (peer,) = rt.of("peer")
    assert peer == ("peer", 1, A1, 1, A0, 0, 1024, s1)  # destination's device current
    records, waits = rt.of("record"), rt.of("wait")
    # the copy's stream (device 1) waits for the source's stream recorded on device 0, even
    # when both are "0": each device's legacy stream is another stream
    assert ("record", 0, records[0][2], s0) in records
    ev = next(r[2] for r in records if r[1] == 0 and r[3] == s0)
    assert ("wait", 1, s1, ev) in waits
    # ... and the source's stream waits for the copy (recorded on device 1, waited on device 0)
    back = next(r[2] for r in records if r[1] == 1 and r[3] == s1)
    assert ("wait", 0, s0, back) in waits
    i_peer = rt.calls.index(peer)
    assert rt.calls.index(("wait", 1, s1, ev)) < i_peer < rt.calls.index(("wait", 0, s0, back))


def test_a_copy_on_one_device_stays_a_plain_copy(rt):
    src, dst = view(A0, 1, 0x10), view(A1, 1, 0x10)
    dst.copy_(src)
    assert not rt.of("peer") and not rt.of("wait")  # one stream: nothing to order
    (cp,) = rt.of("memcpy")
    assert cp[:5] == ("memcpy", 1, A1, A0, 1024)
    assert rt.dev == 0


def test_same_stream_ids_on_two_devices_are_two_streams(rt):
    _cuda.stream_wait(0, 0, 0)  # one device, one stream: no event
    assert not rt.calls
    _cuda.stream_wait(0, 0, 0, 1)  # device 1's legacy stream waits for device 0's
    assert [c[:2] for c in rt.calls] == [("record", 0), ("wait", 1)]
    assert rt.dev == 0


def _imports(path: Path) -> tuple[set[str], list[int]]:
    """The sibling modules *path* imports at module level, and the lines of nested imports."""
    tree = ast.parse(path.read_text())
    top: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                top.add(node.module.split(".")[0])
            else:
                top.update(a.name for a in node.names)
    nested = [
        n.lineno
        for f in ast.walk(tree)
        if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
        for n in ast.walk(f)
        if isinstance(n, ast.Import | ast.ImportFrom)
    ]
    return top, nested


def test_the_memory_package_has_no_import_cycle_and_no_hidden_imports():
    modules = {p.stem: p for p in MEMORY.glob("*.py") if p.stem != "__init__"}
    graph = {}
    for name, path in modules.items():
        top, nested = _imports(path)
        graph[name] = top & set(modules)
        assert not nested, f"pycudnn/memory/{name}.py imports inside a function at {nested}"

    def reaches(a, b, seen=()):
        return any(n == b or (n not in seen and reaches(n, b, (*seen, n))) for n in graph[a])

    cycles = [m for m in modules if reaches(m, m)]
    assert not cycles, f"import cycle through {cycles}: {graph}"
    assert "interop" in graph and "array" in graph["interop"]  # interop sits above array


def test_empty_like_on_another_device_does_not_take_the_sources_stream(rt, monkeypatch):
    from pycudnn.memory import allocator, array

    seen = []

    class Block:
        def __init__(self, device, stream):
            self.ptr, self.nbytes, self.device, self.stream = A0, 1 << 20, device, stream

    class Resource:  # records where each allocation is asked for
        def allocate(self, nbytes, device, stream, keep):
            seen.append((device, stream))
            return Block(device, stream)

    monkeypatch.setattr(array, "_layouts", {})
    prev = allocator.set_memory_resource(Resource())
    try:
        src = view(A1, 1, 0x20)  # on device 1, ordered on a device-1 stream
        assert array.empty_like(src).stream == 0x20  # same device: its stream
        out = array.empty_like(src, device=0)
        assert (out.device, out.stream) == (0, 0)  # not device 1's stream
        assert seen == [(1, 0x20), (0, 0)]
    finally:
        allocator.set_memory_resource(prev)


def test_a_stream_object_of_another_device_is_refused_at_allocation(rt):
    from pycudnn import memory

    class TorchLikeStream:
        device_index = 1
        cuda_stream = 0x30

    with pytest.raises(ValueError, match="stream is on device 1 but the memory on device 0"):
        memory.empty((4,), np.float32, 0, TorchLikeStream())


def test_a_workspace_under_capture_comes_from_the_installed_resource():
    """``capture_allocation``: pycudnn's own allocator cannot be recorded by a capture (a clear
    error saying what to do); an installed resource (torch's: the graph's private pool) gives
    the block, and dropping the allocation gives it back."""
    from pycudnn import errors
    from pycudnn.memory import allocator

    prev = allocator.set_memory_resource(None)
    try:
        with pytest.raises(errors.StreamCaptureError, match=r"1\.0 MiB .* of workspace .*"
                           r"0x40 is capturing .*use_torch_allocator"):  # fmt: skip
            allocator.capture_allocation(1 << 20, 0, 0x40)
    finally:
        allocator.set_memory_resource(prev)
    seen, dropped = [], []

    class Block:
        def __init__(self, nbytes, device, stream):
            self.ptr, self.nbytes, self.device, self.stream = 0x7000, nbytes, device, stream

        def __del__(self):
            dropped.append(self.ptr)

    class Resource:
        def allocate(self, nbytes, device, stream, keep):
            seen.append((nbytes, device, stream))
            return Block(nbytes, device, stream)

    prev = allocator.set_memory_resource(Resource())
    try:
        got = allocator.capture_allocation(3 << 20, 0, 0x40)
        assert (got.ptr, got.nbytes) == (0x7000, 3 << 20) and seen == [(3 << 20, 0, 0x40)]
        got.release(0x40)
        assert dropped == [0x7000]
    finally:
        allocator.set_memory_resource(prev)
