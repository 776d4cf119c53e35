"""The one call protocol (:class:`pycudnn.highlevel._call.Call`) and the one cache-and-run helper
(:func:`pycudnn.highlevel._call.run_cached`), on the CPU with fake outputs and a fake handle."""

from __future__ import annotations

import itertools

import pytest

from pycudnn.highlevel import _call

_addr = itertools.count(0x10_0000, 0x1000)


class Array:
    """A fake output array."""

    def __init__(self):
        self.ptr = next(_addr)


class Spec:
    """A fake OutputSpec: ``new`` makes an :class:`Array`."""

    nbytes_span = 64

    def __init__(self):
        self.made = []

    def new(self, stream):
        a = Array()
        self.made.append((a, stream))
        return a


class Handle:
    device = 0
    stream = 7

    def __init__(self):
        self.bound = []

    def set_stream(self, s):
        self.bound.append(s)


class Recording(_call.Call):
    __slots__ = ("evicted", "launched")

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.launched = []
        self.evicted = 0

    def launch(self, ptrs):
        self.launched.append(tuple(ptrs))

    def evict(self):
        self.evicted += 1


@pytest.fixture
def store():
    s = _call.new_store()
    yield s
    s.clear()


def test_one_output_new_and_given():
    spec = Spec()
    call = Recording("f", Handle(), (spec,), (64, 64))
    (out,) = call.run((0x1000,), (None,), (None,), None)
    assert call.launched == [(0x1000, out.ptr)] and spec.made == [(out, 7)]
    given = Array()
    assert call.run((0x1000,), (given,), (given.ptr,), 3) == (given,)
    assert call.launched[-1] == (0x1000, given.ptr) and call.handle.bound == [3]
    assert call.lean


def test_given_output_overlapping_an_input_is_refused_unless_exactly_in_place():
    call = Recording("f", Handle(), (None,), (64, 64))
    with pytest.raises(ValueError, match="f: out overlaps an input"):
        call.run((0x1000,), (object(),), (0x1010,), None)
    inplace = Recording("f", Handle(), (None,), (64, 64), inplace=(0,))
    inplace.run((0x1000,), (object(),), (0x1000,), None)
    with pytest.raises(ValueError, match="exactly that input"):
        inplace.run((0x1000,), (object(),), (0x1008,), None)
    assert call.launched == [] and inplace.launched == [(0x1000, 0x1000)]


def test_several_outputs_new_ones_allocated_given_ones_checked():
    spec = Spec()
    call = Recording("g", Handle(), (spec, None, spec), (64, 64, 64, 64))
    given = Array()
    a, b, c = call.run((0x1000,), (None, given, None), (None, given.ptr, None), None)
    assert b is given and call.launched == [(0x1000, a.ptr, given.ptr, c.ptr)]
    with pytest.raises(ValueError, match="g: out overlaps an input"):
        call.run((0x1000,), (None, object(), None), (None, 0x1020, None), None)
    both = Recording("g", Handle(), (None, None), (64, 64, 64))
    with pytest.raises(ValueError, match="two outputs overlap"):
        both.run((0x1000,), (object(), object()), (0x9000, 0x9010), None)
    assert len(call.launched) == 1 and both.launched == []


def test_noop_allocates_and_launches_nothing():
    spec = Spec()
    call = Recording("f", Handle(), (spec, spec), (0, 64, 64), noop=True)
    outs = call.run((0x1000,), (None, None), (None, None), None)
    assert len(outs) == 2 and call.launched == [] and not call.lean


def test_staging_wraps_the_launch():
    events = []

    class Stage:
        def before(self, h, ptrs, keep):
            events.append(("before", list(ptrs)))
            ptrs[0] = 0xAAAA
            return 0xBBBB

        def after(self, h, ptrs, real_out):
            events.append(("after", real_out))

    call = Recording("f", Handle(), (None,), (64, 64), stage=Stage())
    call.run((0x1000,), (object(),), (0x9000,), None)
    assert events == [("before", [0x1000, 0x9000]), ("after", 0xBBBB)]
    assert call.launched == [(0xAAAA, 0x9000)] and not call.lean


@pytest.mark.parametrize("reflects", [True, False])
def test_runs_on_the_handles_device_and_restores_the_callers(monkeypatch, reflects):
    """One switch and one restore per run, also when ``device_now`` does not see the switch
    (the GPU tests fake it so)."""
    current, switches = [1], []
    monkeypatch.setattr(_call, "one_device", False)
    monkeypatch.setattr(_call._cuda, "device_now", lambda: current[0] if reflects else 1)

    def set_device(d):
        switches.append(d)
        current[0] = d

    monkeypatch.setattr(_call._cuda, "set_device", set_device)
    seen = []

    class Here(Recording):
        __slots__ = ()

        def launch(self, ptrs):
            seen.append(current[0])

    Here("f", Handle(), (None,), (64, 64)).run((0x1000,), (object(),), (0x9000,), None)
    assert seen == [0] and current == [1] and switches == [0, 1]


def test_run_cached_caches_after_the_first_successful_run(store):
    builds = []

    def build(tag):
        builds.append(tag)
        return Recording("f", Handle(), (None,), (64, 64))

    for _ in range(3):
        _call.run_cached(
            ("k",), build, ("a",), (0x1000,), (object(),), (0x9000,), None, store=store
        )
    assert builds == ["a"] and len(store.data) == 1
    entry = store.data[("k",)]
    assert len(entry.launched) == 3


def test_run_cached_unhashable_key_runs_uncached(store):
    builds = []

    def build():
        builds.append(1)
        return Recording("f", Handle(), (None,), (64, 64))

    for _ in range(2):
        _call.run_cached(
            ("k", [1]), build, (), (0x1000,), (object(),), (0x9000,), None, store=store
        )
    assert len(builds) == 2 and not store.data


def test_run_cached_a_failing_fresh_entry_is_evicted_and_not_cached(store):
    made = []

    def build():
        made.append(Recording("f", Handle(), (None,), (64, 64)))
        return made[-1]

    with pytest.raises(ValueError, match="overlaps"):
        _call.run_cached("k", build, (), (0x1000,), (object(),), (0x1000,), None, store=store)
    assert made[0].evicted == 1 and not store.data


def test_run_cached_a_stale_cached_entry_is_evicted_rebuilt_and_run(store):
    class Stale(Recording):
        __slots__ = ()

        def launch(self, ptrs):
            raise MemoryError("workspace")

    made = []

    def build():
        made.append(Recording("f", Handle(), (None,), (64, 64)))
        return made[-1]

    store.put("k", Stale("f", Handle(), (None,), (64, 64)))
    stale = store.data["k"]
    args = ("k", build, (), (0x1000,), (object(),), (0x9000,), None)
    _call.run_cached(*args, stale=(MemoryError,), store=store)
    assert stale.evicted == 1 and len(made) == 1 and store.data["k"] is made[0]
    # without stale=, the error reaches the caller and the entry stays
    store.put("k", stale)
    with pytest.raises(MemoryError):
        _call.run_cached(*args, store=store)
    assert store.data["k"] is stale


def test_run_cached_reports_hits():
    hits, store = [], _call.new_store()

    def build():
        return Recording("f", Handle(), (None,), (64, 64))

    args = ("k", build, (), (0x1000,), (object(),), (0x9000,), None)
    for _ in range(3):
        _call.run_cached(*args, on_hit=lambda: hits.append(1), store=store)
    assert len(hits) == 2


def test_cached_entry_for_a_caller_that_binds_once(store):
    def build():
        return Recording("f", Handle(), (None,), (64, 64))

    assert _call.cached_entry("k", store) is None
    _call.run_cached("k", build, (), (0x1000,), (object(),), (0x9000,), None, store=store)
    entry = _call.cached_entry("k", store)
    assert entry.lean
    entry.launch((0x1000, 0x9000))  # the lean path: outputs given, stream and device right
    assert entry.launched == [(0x1000, 0x9000)] * 2
    assert _call.cached_entry(["unhashable"], store) is None
