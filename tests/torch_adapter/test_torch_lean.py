"""The adapter's lean path (:mod:`pycudnn.torch._lean`) on the CPU, with fake call entries: a
signature binds the entry its first call ran, the same signature launches it without the public
function, any other signature (shape, strides, dtype, device, alignment: each a part of the key
the adapter builds) goes through the public function, entries that are not lean are never bound,
a failing launch unbinds, and ``clear_caches`` empties the store. Imports no torch."""

from __future__ import annotations

import threading

import pytest

import pycudnn
from pycudnn.highlevel import _bound, _call
from pycudnn.torch import _lean


class _Handle:
    device = 0

    def __init__(self) -> None:
        self.streams: list[int] = []

    def set_stream(self, s: int) -> int:
        self.streams.append(s)
        return s


class _Entry:
    def __init__(self, lean: bool = True, fail: bool = False, n: int = 3) -> None:
        self.lean = lean
        self.fail = fail
        self.spans = (0,) * n  # the pointers it takes (three, as most tests' calls pass)
        self.handle = _Handle()
        self.launched: list[tuple] = []

    def launch(self, ptrs: tuple) -> None:
        if self.fail:
            raise MemoryError("workspace no longer fits")
        self.launched.append(ptrs)


class _Public:
    """Stands for a public high-level function: each call 'runs' a new entry through the call
    cache (what run_cached leaves for take_last_entry)."""

    def __init__(self, **entry_kw) -> None:
        self.calls = 0
        self.entries: list[_Entry] = []
        self.kw = entry_kw

    def __call__(self, *args) -> None:
        self.calls += 1
        e = _Entry(**self.kw)
        self.entries.append(e)
        _call.local.last = e


@pytest.fixture(autouse=True)
def _one_device(monkeypatch):
    monkeypatch.setattr(_call, "one_device", True)
    pycudnn.clear_caches()
    yield
    pycudnn.clear_caches()


def _key(shape=(8, 64, 28, 28), strides=(50176, 1, 1792, 64), dtype="bf16", device=0, align=0):
    return ("conv_fwd", (2, (1, 1), (1, 1), (1, 1), 1), shape, strides, dtype, device, align)


def test_same_signature_launches_the_bound_entry():
    public = _Public()
    _lean.run(_key(), (1, 2, 3), 7, public, "args")
    assert public.calls == 1 and _lean.bound_count() == 1
    entry = public.entries[0]
    _lean.run(_key(), (10, 20, 30), 9, public, "args")
    assert public.calls == 1, "a hit must not call the public function"
    assert entry.launched == [(10, 20, 30)]
    assert entry.handle.streams == [9], "the caller's stream is bound before the launch"


@pytest.mark.parametrize(
    "other",
    [
        {"shape": (16, 64, 28, 28)},
        {"strides": (50176, 784, 28, 1)},
        {"dtype": "fp16"},
        {"device": 1},
        {"align": 8},
    ],
)
def test_another_signature_misses(other):
    public = _Public()
    _lean.run(_key(), (1, 2, 3), 0, public)
    _lean.run(_key(**other), (1, 2, 3), 0, public)
    assert public.calls == 2
    assert _lean.bound_count() == 2
    assert public.entries[0].launched == []


def test_an_entry_that_is_not_lean_is_never_bound():
    public = _Public(lean=False)
    for _ in range(3):
        _lean.run(_key(), (1, 2, 3), 0, public)
    assert public.calls == 3 and _lean.bound_count() == 0


def test_an_entry_taking_another_pointer_count_is_never_bound():
    """The call's pointers must be the entry's (inputs then outputs): a count that differs is
    a caller's mistake the bound launch would not see, so it keeps the public function."""
    public = _Public()
    for _ in range(2):
        _lean.run(_key(), (1, 2), 0, public)
    assert public.calls == 2 and _lean.bound_count() == 0


def test_no_entry_left_by_the_call_binds_nothing():
    """A public call that ran no cached entry (say an empty problem, or an unhashable key) must
    not bind the entry of an earlier, unrelated call."""
    stale = _Entry()
    _call.local.last = stale
    calls = []
    _lean.run(_key(), (1, 2, 3), 0, lambda: calls.append(1))
    assert calls == [1] and _lean.bound_count() == 0


def test_a_failing_launch_unbinds_and_goes_through_the_public_function():
    public = _Public()
    _lean.run(_key(), (1, 2, 3), 0, public)
    public.entries[0].fail = True
    _lean.run(_key(), (1, 2, 3), 0, public)
    assert public.calls == 2
    assert public.entries[1].launched == []  # the public call itself ran it
    _lean.run(_key(), (4, 5, 6), 0, public)
    assert public.entries[1].launched == [(4, 5, 6)], "the rebuilt entry is bound"


def test_another_current_device_goes_through_the_public_function(monkeypatch):
    monkeypatch.setattr(_call, "one_device", False)
    public = _Public()
    _lean.run(_key(), (1, 2, 3), 0, public)
    monkeypatch.setattr(_bound, "current_device", lambda: 1)  # the entry's handle is device 0
    _lean.run(_key(), (1, 2, 3), 0, public)
    assert public.calls == 2
    monkeypatch.setattr(_bound, "current_device", lambda: 0)
    _lean.run(_key(), (1, 2, 3), 0, public)
    assert public.calls == 2


def test_clear_caches_empties_the_store():
    public = _Public()
    _lean.run(_key(), (1, 2, 3), 0, public)
    assert _lean.bound_count() == 1
    pycudnn.clear_caches()
    assert _lean.bound_count() == 0


def test_the_store_is_per_thread():
    public = _Public()
    _lean.run(_key(), (1, 2, 3), 0, public)
    seen = []

    def other() -> None:
        seen.append(_lean.bound_count())

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen == [0], "entries hold the thread's handle: another thread binds its own"


class _Tensor:
    """What launch reads of a tensor."""

    def __init__(self, ptr, shape=(2, 3), strides=(3, 1), dtype="bf16", device=0):
        self.ptr, self.shape, self.strides, self.dtype, self.device = (
            ptr,
            shape,
            strides,
            dtype,
            device,
        )

    def data_ptr(self):
        return self.ptr

    def stride(self):
        return self.strides

    def get_device(self):
        return self.device


def test_launch_keys_on_every_tensor_property_and_passes_the_pointers_in_order():
    public = _Public(n=2)
    a, b = _Tensor(4096), _Tensor(8192)
    _lean.launch(("op", 1), (a, b), 0, public)
    _lean.launch(("op", 1), (_Tensor(512), _Tensor(1024)), 0, public)  # same signature
    assert public.calls == 1 and public.entries[0].launched == [(512, 1024)]
    for other in (
        _Tensor(512, shape=(3, 3)),
        _Tensor(512, strides=(1, 2)),
        _Tensor(512, dtype="fp16"),
        _Tensor(512, device=1),
        _Tensor(514),  # another alignment
    ):
        _lean.launch(("op", 1), (other, b), 0, public)
    _lean.launch(("op", 2), (a, b), 0, public)  # another configuration
    assert public.calls == 7


def test_launch_fresh_keys_the_inputs_fully_and_the_new_outputs_by_their_alignment():
    """The adapter's own new outputs are laid out from the inputs' signature: only their
    alignment is keyed; the pointers still go inputs first, then outputs."""
    public = _Public(n=3)
    a, b = _Tensor(4096), _Tensor(8192)
    _lean.launch_fresh(("op", 1), (a, b), (_Tensor(256),), 0, public)
    _lean.launch_fresh(("op", 1), (_Tensor(512), _Tensor(1024)), (_Tensor(2048),), 0, public)
    assert public.calls == 1 and public.entries[0].launched == [(512, 1024, 2048)]
    # an output of another shape is the same key (its shape follows from the inputs') ...
    _lean.launch_fresh(("op", 1), (a, b), (_Tensor(4096, shape=(3, 3)),), 0, public)
    assert public.calls == 1
    # ... but not one of another alignment, nor any other input signature
    _lean.launch_fresh(("op", 1), (a, b), (_Tensor(258),), 0, public)
    _lean.launch_fresh(("op", 1), (_Tensor(512, dtype="fp16"), b), (_Tensor(256),), 0, public)
    assert public.calls == 3
    # a launch keyed on every tensor is another entry, never a launch_fresh one
    _lean.launch(("op", 1), (a, b, _Tensor(256)), 0, public)
    assert public.calls == 4


def test_launch_fresh_records_on_a_tape_in_pointer_order():
    public = _Public(n=3)
    a, b, y = _Tensor(4096), _Tensor(8192), _Tensor(256)
    with _lean.Tape() as tape:
        _lean.launch_fresh(("op", 1), (a, b), (y,), 0, public)
    ((entry, tensors),) = tape.launches
    assert entry is public.entries[0] and tensors == (a, b, y)
