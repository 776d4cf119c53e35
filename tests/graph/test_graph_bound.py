"""CPU tests of :meth:`pycudnn.graph.Graph.execute` bound to its operands' signature
(:mod:`pycudnn.graph._variant`): no GPU, the plan's launch faked.

* a repeated call with the same signature skips the per-array checks (``check_array`` is
  counted), with the same arrays or fresh ones, and launches the new pointers;
* a changed shape, dtype, strides, device, alignment or mapping refuses the call with the same
  error as an unbound graph; an output overlapping an input is refused on the bound path too,
  and a valid call after it runs;
* by-value scalars are read on every call (and a bad one raises the checks' error);
* other mappings and other array types are checked on every call; a rebuild starts afresh; the
  bindings are bounded;
* torch tensors (a stand-in type named ``torch.Tensor``): bound on torch's default stream only.

The GPU side (fresh arrays, NaN-poisoned outputs, float64 references) is
``tests/graph/test_graph_bound_gpu.py``.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import sys
import time
import types

import numpy as np
import pytest

from pycudnn import _cuda, memory
from pycudnn.graph import Graph, _builder, _variant

SHAPE = (1, 1, 2, 3)
STRIDES = (6, 6, 3, 1)  # elements


class _Plan:
    workspace = 0

    def __init__(self):
        self.launched = []
        self.key = None

    def launch(self, ptrs, scratch=()):
        uids = self.key.uids
        spec = {s.uid: s for s in self.key.tensors}
        # the by-value scalars are read when the plan runs (float32 here)
        values = {
            i: ctypes.c_float.from_address(p).value
            for i, (uid, p) in enumerate(zip(uids, ptrs, strict=True))
            if spec[uid].is_by_value
        }
        self.launched.append((list(ptrs), values))


class _Handle:
    stream = 0
    device = 0

    def set_stream(self, stream):
        pass


@pytest.fixture
def fake(monkeypatch):
    """Plans and handles faked; ``check_array`` counted."""
    plans = []

    def plan(key, h):
        p = _Plan()
        p.key = key
        plans.append(p)
        return p

    monkeypatch.setattr(_builder._plans, "plan", plan)
    monkeypatch.setattr(_builder._handle, "get_handle", lambda device: _Handle())
    monkeypatch.setattr(_cuda, "DeviceContext", lambda device: contextlib.nullcontext())
    counted = collections.Counter()
    real = _variant.check_array

    def check_array(*args):
        counted["check_array"] += 1
        return real(*args)

    monkeypatch.setattr(_variant, "check_array", check_array)
    return types.SimpleNamespace(plans=plans, counted=counted)


def arr(ptr, shape=SHAPE, strides=STRIDES, dtype="float16", device=0):
    isz = np.dtype(dtype).itemsize
    return memory.DeviceArray.from_ptr(
        ptr, shape, dtype, tuple(s * isz for s in strides), device=device, check=False
    )


def _graph(name="bound"):
    """``y = (a + b) * bias * 2``: two inputs, an output, a by-value float and a constant."""
    g = Graph(io_data_type="float16", name=name)
    a = g.tensor(SHAPE, name="a")
    b = g.tensor(SHAPE, name="b")
    bias = g.tensor((1, 1, 1, 1), data_type="float32", is_pass_by_value=True, name="bias")
    y = g.mul(g.mul(g.add(a, b), bias), g.scalar(2.0, name="two")).set_output(True)
    y.set_name("y").set_alignment(2)  # so that an output can overlap part of an input
    g.build(device=0)
    return g, a, b, y


def _pack(a, b, y, base=0x10000, bias=0.5):
    return {a: arr(base), b: arr(base + 0x1000), y: arr(base + 0x2000), "bias": bias}


def _error(g, pack):
    """The exception a call raises (type and message)."""
    with pytest.raises(Exception) as info:
        g.execute(pack)
    return type(info.value), str(info.value)


def test_a_repeated_call_skips_the_checks_and_launches_the_new_pointers(fake):
    g, a, b, y = _graph()
    g.execute(_pack(a, b, y))
    assert fake.counted["check_array"] == 3
    g.execute(_pack(a, b, y))  # the same addresses
    g.execute(_pack(a, b, y, base=0x80000))  # fresh arrays, same signature
    assert fake.counted["check_array"] == 3
    (plan,) = fake.plans
    full = [
        ptrs for ptrs, _ in plan.launched
    ]  # the real tensors first (io order), then the by-value ones
    assert full[0][:3] == [0x10000, 0x11000, 0x12000] and full[0] == full[1]
    assert full[2][:3] == [0x80000, 0x81000, 0x82000]
    assert full[2][3:] != [0, 0]  # the scalars' host addresses
    # keys by name and uid are another signature: checked once, then bound too
    uid_a = g._key.tensors[a._index].uid
    pack = {uid_a: arr(0x10000), "b": arr(0x11000), "y": arr(0x12000), "bias": 1.0}
    g.execute(pack)
    g.execute(pack)
    assert fake.counted["check_array"] == 6
    assert len(g._bindings.data) == 2


def _unbound_error(pack_of):
    """The error a fresh graph (never bound) gives for the pack *pack_of(a, b, y)*."""
    g, a, b, y = _graph()
    return _error(g, pack_of(a, b, y))


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda a, b, y: {a: arr(0x10000, shape=(1, 1, 3, 2))}, id="shape"),
        pytest.param(lambda a, b, y: {a: arr(0x10000, dtype="float32")}, id="dtype"),
        pytest.param(lambda a, b, y: {b: arr(0x11000, strides=(6, 6, 1, 2))}, id="strides"),
        pytest.param(lambda a, b, y: {y: arr(0x12000, device=1)}, id="device"),
        pytest.param(lambda a, b, y: {a: arr(0x10002)}, id="alignment"),
        pytest.param(lambda a, b, y: {y: arr(0x10004)}, id="overlap"),
        pytest.param(lambda a, b, y: {y: arr(0x11000)}, id="aliased"),
        pytest.param(lambda a, b, y: {"bias": "x"}, id="scalar-type"),
        pytest.param(lambda a, b, y: {"bias": 1e300}, id="scalar-range"),
        pytest.param(lambda a, b, y: {"bias": True}, id="scalar-bool"),
        pytest.param(lambda a, b, y: {a: np.zeros(SHAPE, np.float16)}, id="host-array"),
    ],
)
def test_a_changed_call_is_refused_with_the_unbound_error(fake, change):
    def pack_of(a, b, y):
        pack = _pack(a, b, y)
        pack.update(change(a, b, y))
        return pack

    want = _unbound_error(pack_of)
    g, a, b, y = _graph()
    g.execute(_pack(a, b, y))
    g.execute(_pack(a, b, y, base=0x40000))  # bound
    assert _error(g, pack_of(a, b, y)) == want
    # and the bound signature still runs (the failed call bound nothing wrong)
    n = len(fake.plans[-1].launched)
    g.execute(_pack(a, b, y, base=0x50000))
    assert len(fake.plans[-1].launched) == n + 1


def test_the_overlap_check_runs_on_the_bound_path(fake, monkeypatch):
    g, a, b, y = _graph()
    g.execute(_pack(a, b, y))
    calls = collections.Counter()
    real = _variant._check_overlaps

    def check_overlaps(*args):
        calls["overlaps"] += 1
        return real(*args)

    monkeypatch.setattr(_variant, "_check_overlaps", check_overlaps)
    g.execute(_pack(a, b, y))  # the last checked addresses: nothing to check again
    assert calls["overlaps"] == 0
    g.execute(_pack(a, b, y, base=0x20000))  # new addresses: checked, without check_array
    assert calls["overlaps"] == 1 and fake.counted["check_array"] == 3
    # the output on an input: refused with the full checks' error
    bad = _pack(a, b, y)
    bad[y] = bad[a]
    with pytest.raises(ValueError, match=r"the array of output 'y' overlaps the array of input"):
        g.execute(bad)
    # partly overlapping (inside b's 12 bytes)
    bad = _pack(a, b, y)
    bad[y] = arr(0x11008)
    with pytest.raises(ValueError, match=r"output 'y' overlaps the array of input 'b'"):
        g.execute(bad)


def test_scalars_are_read_on_every_call(fake):
    g, a, b, y = _graph()
    for v in (0.5, 1.5, -3.0, 7):
        pack = _pack(a, b, y, bias=v)
        g.execute(pack)
    plan = fake.plans[-1]
    got = [sorted(values.values()) for _, values in plan.launched]
    assert got == [[0.5, 2.0], [1.5, 2.0], [-3.0, 2.0], [2.0, 7.0]]
    # 0.5 (float), then int 7: two signatures, each checked once
    assert fake.counted["check_array"] == 6


def test_other_mappings_and_arrays_are_checked_every_call(fake):
    g, a, b, y = _graph()
    pack = types.MappingProxyType(_pack(a, b, y))
    g.execute(pack)
    g.execute(pack)
    assert fake.counted["check_array"] == 6

    class Cai:  # an array read through __cuda_array_interface__ (CuPy, Numba...)
        def __init__(self, ptr):
            self.__cuda_array_interface__ = {
                "shape": SHAPE,
                "strides": None,
                "typestr": "<f2",
                "data": (ptr, False),
                "version": 2,
            }

    pack = _pack(a, b, y)
    pack[a] = Cai(0x10000)
    g.execute(pack)
    g.execute(pack)
    assert fake.counted["check_array"] == 12


def test_key_order_and_key_types_are_part_of_the_signature(fake):
    g, a, b, y = _graph()
    pack = _pack(a, b, y)
    g.execute(pack)
    reordered = {b: pack[b], a: pack[a], y: pack[y], "bias": 0.5}
    g.execute(reordered)
    assert fake.counted["check_array"] == 6
    first, second = (ptrs for ptrs, _ in fake.plans[-1].launched)
    assert first[:3] == second[:3]  # the plan's order, whatever the mapping's
    # True == 1 and hashes alike: a uid key bound does not serve the bool (refused by the checks)
    uid = g._key.tensors[a._index].uid
    by_uid = {uid: pack[a], b: pack[b], y: pack[y], "bias": 0.5}
    g.execute(by_uid)
    if uid == 1:
        with pytest.raises(TypeError, match="variant_pack keys are Tensors, names or uids"):
            g.execute({True: pack[a], b: pack[b], y: pack[y], "bias": 0.5})


def test_a_rebuild_starts_afresh_and_bindings_are_bounded(fake, monkeypatch):
    g, a, b, y = _graph()
    g.execute(_pack(a, b, y))
    first = g._bindings
    g.build(device=0)  # a new key: the bindings belong to the build
    g.execute(_pack(a, b, y))
    assert g._bindings is not first and g._bindings.key is g._key
    assert fake.counted["check_array"] == 6
    monkeypatch.setattr(_variant, "BINDINGS_PER_GRAPH", 3)
    for v in range(6):  # six signatures: the strides of a's size-1 dims (any value is valid)
        pack = _pack(a, b, y)
        pack[a] = arr(0x10000, strides=(v + 1, v + 1, 3, 1))
        g.execute(pack)
    assert fake.counted["check_array"] == 6 + 6 * 3
    assert len(g._bindings.data) == 3


def test_declared_alignment_is_pinned(fake):
    g = Graph(io_data_type="float16", name="aligned")
    a = g.tensor(SHAPE, name="a").set_alignment(64)
    y = g.relu(a).set_output(True).set_name("y")
    g.build(device=0)
    g.execute({a: arr(0x10000), y: arr(0x20000)})
    g.execute({a: arr(0x30000), y: arr(0x40000)})
    assert fake.counted["check_array"] == 2
    # 32-byte aligned, not 64: a new residue, so the checks run and refuse it
    with pytest.raises(ValueError, match=r"is not aligned to 64 B as declared"):
        g.execute({a: arr(0x10020), y: arr(0x20000)})


class _FakeTorchTensor:
    """Stands in for ``torch.Tensor`` (module ``torch``, name ``Tensor``)."""

    def __init__(self, ptr):
        self.ptr = ptr
        self.shape = SHAPE
        self.dtype = "torch.float16"
        self.requires_grad = False
        self.__cuda_array_interface__ = {
            "shape": SHAPE,
            "strides": None,
            "typestr": "<f2",
            "data": (ptr, False),
            "version": 2,
        }

    def data_ptr(self):
        return self.ptr

    def stride(self):
        return STRIDES

    def get_device(self):
        return 0


_FakeTorchTensor.__module__ = "torch"
_FakeTorchTensor.__name__ = "Tensor"


def test_torch_tensors_are_bound_on_the_default_stream_only(fake, monkeypatch):
    stream = {"raw": 0}
    torch_c = types.SimpleNamespace(
        _cuda_getDevice=lambda: 0, _cuda_getCurrentRawStream=lambda d: stream["raw"]
    )
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(_C=torch_c))
    monkeypatch.setattr(_variant, "_torch_tensor", None)
    monkeypatch.setattr(_variant, "_torch_getters", None)
    g, a, b, y = _graph()

    def pack(base):
        return {
            a: _FakeTorchTensor(base),
            b: _FakeTorchTensor(base + 0x1000),
            y: _FakeTorchTensor(base + 0x2000),
            "bias": 0.5,
        }

    g.execute(pack(0x10000))
    g.execute(pack(0x20000))
    assert fake.counted["check_array"] == 3
    stream["raw"] = 0x5555  # a side stream: read through the protocols, as before
    g.execute(pack(0x30000))
    assert fake.counted["check_array"] == 6
    stream["raw"] = 0
    g.execute(pack(0x30000))
    assert fake.counted["check_array"] == 6
    t = _FakeTorchTensor(0x10000)
    t.requires_grad = True  # another signature
    g.execute({**pack(0x10000), a: t})
    assert fake.counted["check_array"] == 9

    def no_strides():
        raise RuntimeError("sparse tensors do not have strides")

    t = _FakeTorchTensor(0x10000)
    t.stride = no_strides  # a tensor that cannot say its layout: checked in full, every call
    for _ in range(2):
        g.execute({**pack(0x10000), a: t})
    assert fake.counted["check_array"] == 15


def test_a_bound_call_costs_less_host_time(fake):
    """Not a benchmark: reading a bound call's pointers must cost less than the checks."""
    g, a, b, y = _graph()
    pack = _pack(a, b, y)

    def per_call(fn, n=300):
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best = min(best, (time.perf_counter() - t0) / n)
        return best

    g.execute(pack)
    assert per_call(lambda: _variant.pointers(g, pack)) < per_call(
        lambda: _variant._checked(g, pack)
    )
