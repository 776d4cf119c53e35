"""Bound launches: a call signature bound to the high level's ready call entry, per thread (no
framework here: the adapters read their arrays and key their calls).

A framework's first call with a given signature -- its operands' shapes, strides, dtypes, device
and pointer alignment, its own options and ``pycudnn.config`` -- runs the public high-level
function with every output given, which validates everything and caches a ready call entry
(:mod:`._call`). :func:`run` then binds that entry to the signature; later calls with the same
signature launch it directly (:attr:`._call.Call.lean`): the pointers into the plan's variant pack
and the execute, with no key of the high level's, no argument parsing and no output object.
Nothing is validated twice, and nothing is keyed on ``id()``: a signature pins every property
the validation read.

Entries that are not lean (staged operands, per-call arguments) are never bound, nor is one whose
pointer count is not the call's (the pointers are the inputs', then the outputs', in the public
function's order): those calls keep going through the public function. The store is per thread
(entries hold the thread's handle), bounded and emptied with every other cache by
``pycudnn.clear_caches()``. ``pycudnn.torch``'s lean path and ``pycudnn.jax``'s executor use it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .. import _cuda
from ..graph import _plans
from . import _call

__all__ = ["bound_count", "current_device", "run", "set_device_getter"]

_local = threading.local()
#: the calling thread's current CUDA device (a framework may install its own, faster getter)
current_device: Callable[[], int | None] = _cuda.device_now


def set_device_getter(getter: Callable[[], int | None]) -> None:
    """Read the current device with *getter* (torch's, ~0.2 us, instead of ``cudaGetDevice``)."""
    global current_device
    current_device = getter


def _store() -> Any:
    try:
        return _local.store
    except AttributeError:
        # owns=False: entries belong to the high level's call cache; this only references them
        store = _local.store = _plans.new_lru(owns=False)
        return store


def bound_count() -> int:
    """How many signatures the calling thread has bound (tests and diagnostics)."""
    return len(_store())


def run(
    key: tuple, ptrs: tuple[int, ...], stream: int, slow: Callable[..., Any], *args: Any
) -> Any:
    """Launch the entry bound to *key* on *ptrs* (the inputs', then the outputs' pointers, as
    the high-level function orders them) on *stream*; on a miss run ``slow(*args)`` -- the
    public function with every output given -- and bind the entry it ran when that is lean and
    takes as many pointers.

    A bound entry whose launch fails (say its workspace no longer fits) is unbound and the call
    goes through *slow*, which rebuilds or raises the public function's error. Returns the
    entry that ran when it is lean (bound now or before), else None.
    """
    try:
        store = _local.store
    except AttributeError:
        store = _store()
    entry = store.data.get(key)
    if entry is not None:
        h = entry.handle
        if _call.one_device or current_device() == h.device:
            h.set_stream(stream)  # no C call when it is bound to it already
            try:
                entry.launch(ptrs)
                return entry
            except Exception:
                store.pop(key)
    _call.take_last_entry()  # forget an earlier call's entry
    slow(*args)
    entry = _call.take_last_entry()
    if entry is not None and entry.lean and len(entry.spans) == len(ptrs):
        store.put(key, entry)
        return entry
    return None
