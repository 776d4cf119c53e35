"""CPU tests of the device caches of the one registry (issue 39, item 2): the ALiBi slopes
(``attention._masks``), the packed attention's uploaded lengths and offsets
(``attention._cu_seqlens``) and the filled vectors (``_graphops.filled``) are bounded, counted by
``cache_info()`` and freed by ``clear_caches()`` -- and an array one of them lets go of is dropped
only after its device was synchronized (a launch queued on any stream may still read it). No GPU:
the arrays are fakes, the synchronisation is recorded."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
from _fake_device import Fake

import pycudnn
from pycudnn import _cuda, memory
from pycudnn.enums import DataType
from pycudnn.graph import _plans
from pycudnn.highlevel import _graphops
from pycudnn.highlevel.attention import _cu_seqlens, _masks

U8, F32 = DataType.UINT8, DataType.FLOAT


class _Array(Fake):
    """A fake device array that can be synchronized (what the caches call after an upload)."""

    def synchronize(self):
        pass


@pytest.fixture
def fake_memory(monkeypatch):
    """Uploads and allocations make fakes; device synchronisations are recorded as
    ``("sync", device, [the arrays still alive then])``."""
    made: list = []
    events: list = []

    def to_device(a, stream=None, *, device=0):
        arr = _Array((np.asarray(a).nbytes,), U8, device=device)
        made.append(weakref.ref(arr))
        return arr

    def empty(shape, dtype, device=0, stream=None, strides=None):
        arr = _Array(shape, F32, device=device)
        made.append(weakref.ref(arr))
        return arr

    def call_on_device(device, fn, *args):
        gc.collect()
        events.append(("sync", device, [r for r in made if r() is not None]))

    monkeypatch.setattr(memory, "to_device", to_device)
    monkeypatch.setattr(memory, "empty", empty)
    monkeypatch.setattr(_cuda, "call_on_device", call_on_device)
    pycudnn.clear_caches()
    events.clear()
    yield made, events
    pycudnn.clear_caches()


def _slopes(i: int, device: int = 0):
    return _masks.slopes_array(i + 1, device)


def _filled(i: int, device: int = 0):
    return _graphops.filled(i + 1, DataType.FLOAT, device, 1.0)


def _uploads(i: int, device: int = 0):
    cu = [0, i + 1, 2 * i + 3]
    p = _cu_seqlens.packing("f", (cu, cu), (cu[-1], cu[-1]), (i + 2, i + 2), (device, None))
    return _cu_seqlens.upload(p, ((0, 8), (1, 8)), device, None)


CACHES = [
    ("alibi_slopes", _slopes, _masks.SLOPES_SIZE),
    ("filled", _filled, _graphops.FILLED_SIZE),
    ("cu_seqlens", _uploads, _cu_seqlens.UPLOADS_SIZE),
]


@pytest.mark.parametrize(("name", "make", "size"), CACHES, ids=[c[0] for c in CACHES])
def test_cache_is_registered_counted_and_cleared(fake_memory, name, make, size):
    made, events = fake_memory
    before = pycudnn.highlevel.conv.cache_info()
    assert before.device_entries == 0 and before.device_bytes == 0
    first = make(0)
    assert make(0) == first if isinstance(first, tuple) else make(0) is first  # served again
    make(1, device=1)
    info = pycudnn.highlevel.conv.cache_info()
    assert info.device_entries == 2 and info.device_bytes > 0
    cache = _plans.device_cache(name, size)
    assert cache in set(_plans._registry) and len(cache) == 2
    del first
    pycudnn.clear_caches()
    after = pycudnn.highlevel.conv.cache_info()
    assert after.device_entries == 0 and after.device_bytes == 0
    # both devices synchronized, each once, while the arrays were still alive; then dropped
    assert [(e[0], e[1]) for e in events] == [("sync", 0), ("sync", 1)]
    assert len(events[0][2]) == 2
    gc.collect()
    assert all(r() is None for r in made)


@pytest.mark.parametrize(("name", "make", "size"), CACHES, ids=[c[0] for c in CACHES])
def test_cache_is_bounded_and_frees_after_a_sync(fake_memory, name, make, size):
    made, events = fake_memory
    cache = _plans.device_cache(name, size)
    n = size + _plans.PENDING_LIMIT - 1
    for i in range(n):
        make(i)
    gc.collect()
    # the bound holds; the evicted arrays wait, alive, for a synchronisation
    assert len(cache) == size and len(cache.pending) == n - size and not events
    assert sum(r() is not None for r in made) == n
    make(n)  # one more eviction: PENDING_LIMIT wait, so the device is synchronized first
    assert [(e[0], e[1]) for e in events] == [("sync", 0)]
    assert len(events[0][2]) == n + 1  # nothing was dropped before the synchronisation
    gc.collect()
    assert sum(r() is not None for r in made) == size and not cache.pending
    info = pycudnn.highlevel.conv.cache_info()
    assert info.device_entries == size


def test_set_cache_size_leaves_the_device_caches_bounds(fake_memory):
    cache = _plans.device_cache("filled", _graphops.FILLED_SIZE)
    old = _plans._maxsize
    try:
        pycudnn.highlevel.conv.set_cache_size(0)  # unbounded plan and call caches
        assert cache.maxsize == _graphops.FILLED_SIZE
        pycudnn.highlevel.conv.set_cache_size(2)
        assert cache.maxsize == _graphops.FILLED_SIZE
    finally:
        pycudnn.highlevel.conv.set_cache_size(old)


def test_no_module_keeps_device_memory_outside_the_registry():
    """The caches that issue 39 found outside the registry are gone from their modules."""
    from pycudnn.highlevel import attention

    for mod, name in (
        (_masks, "_SLOPES"),
        (_cu_seqlens, "_AUX"),
        (_graphops, "_FILLED"),
    ):
        assert not hasattr(mod, name), f"{mod.__name__}.{name}"
    assert attention.dnn_sdpa is pycudnn.dnn_sdpa


def test_host_caches_are_registered_bounded_and_counted():
    """The caches of host values that grow with the inputs (checked packed lengths, reserve
    sizes) are registry caches: bounded by their own size (set_cache_size leaves it), counted
    by cache_info().host_entries and emptied by clear_caches()."""
    from pycudnn.highlevel import batchnorm_act

    for cache in (_cu_seqlens._CHECKED, batchnorm_act._RESERVES):
        assert isinstance(cache, _plans.HostCache)
    cache = _plans.host_cache("test_host", 3)
    assert _plans.host_cache("test_host", 99) is cache
    for i in range(5):
        cache.put(i, i)
    assert list(cache.data) == [2, 3, 4] and cache.lookup(0) is None and cache.lookup(4) == 4
    before = _plans._maxsize
    _plans.set_cache_size(1)
    try:
        assert len(cache.data) == 3
    finally:
        _plans.set_cache_size(before)
    assert pycudnn.highlevel.conv.cache_info().host_entries >= 3
    pycudnn.clear_caches()
    assert not cache.data and pycudnn.highlevel.conv.cache_info().host_entries == 0
