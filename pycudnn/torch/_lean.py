"""The adapter's lean call path: a converted module's call signature bound to the high level's
call entry (imports no torch: the callers read their tensors).

A module's first call with a given signature -- its tensors' shapes, strides, dtypes, device and
pointer alignment, its own configuration and ``pycudnn.config`` -- runs the public high-level
function (``dnn_conv(x, w, out=y, ...)``), which validates everything and caches a ready call
entry (:mod:`pycudnn.highlevel._call`). The adapter then binds that entry to the signature; later
calls with the same signature launch it directly (:attr:`~pycudnn.highlevel._call.Call.lean`):
the tensors' ``data_ptr()`` into the plan's variant pack and the execute, with no key of the
high level's, no argument parsing and no output object. Nothing is validated twice, and nothing
is keyed on ``id()``: a signature pins every property the validation read.

Entries that are not lean (staged operands, per-call arguments) are never bound: those calls keep
going through the public function. The store is per thread (entries hold the thread's handle),
bounded and emptied with every other cache by ``pycudnn.clear_caches()``.

**Tapes.** While a :class:`Tape` is recording on the calling thread, every :func:`launch` appends
the entry it ran and its tensors (None for the entry when the call was not lean): how a launch
program (:mod:`.program`) learns the launches of a region's first run, to replay them later with
no key, lookup or check per launch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..highlevel import _bound, _call

__all__ = [
    "Tape",
    "bound_count",
    "launch",
    "launch_fresh",
    "recording",
    "run",
    "set_device_getter",
    "tape_append",
]

_local = threading.local()  # the calling thread's tape
_recording = 0  # tapes recording in any thread
_recording_lock = threading.Lock()
#: the store of bound launches (:mod:`pycudnn.highlevel._bound`, which pycudnn.jax shares)
run = _bound.run
bound_count = _bound.bound_count
set_device_getter = _bound.set_device_getter


def launch(tag: Any, tensors: tuple, stream: int, slow: Callable[..., Any], *args: Any) -> None:
    """:func:`run` with the signature read from *tensors*: the operands in the entry's pointer
    order (the inputs', then the outputs', as the public function takes them). The key is *tag*
    (the operation and the module's configuration), ``pycudnn.config``'s snapshot and each
    tensor's shape, strides, dtype, device and pointer residue mod 16 (its alignment)."""
    launch_fresh(tag, tensors, (), stream, slow, *args)


def launch_fresh(
    tag: Any, inputs: tuple, outputs: tuple, stream: int, slow: Callable[..., Any], *args: Any
) -> None:
    """:func:`launch` for a call whose *outputs* the caller has just allocated, each laid out
    as a function of *tag* and the *inputs*' signatures alone (``torch.empty_like(x)``, or a
    shape computed from the inputs' on their device): their shapes, strides, dtypes and device
    are then pinned by the key already, and only their alignment is keyed (one tensor's
    signature read costs about a microsecond on a slow host; a norm's call has three such
    outputs). Never pass an output a user gave: its layout is its own (:func:`launch` keys it
    as an input)."""
    key: list[Any] = [tag, _call.snapshot()]
    ptrs = []
    for t in inputs:
        p = t.data_ptr()
        ptrs.append(p)
        key.append((t.shape, t.stride(), t.dtype, t.get_device(), p & 15))
    for t in outputs:
        p = t.data_ptr()
        ptrs.append(p)
        key.append(p & 15)
    entry = run(tuple(key), tuple(ptrs), stream, slow, *args)
    if _recording:  # a module global: no call while no tape records
        tape_append(entry, inputs + outputs if outputs else inputs)


def tape_append(entry: Any, tensors: tuple) -> None:
    """Record a launch made outside :func:`launch` on the calling thread's tape, if one records:
    one of pycudnn's own kernels, whose *entry* has what a program replays (``n_in``,
    ``handle``, ``launch(pointers)``), *tensors* its operands, the inputs' then the outputs'."""
    if _recording:  # (no thread-local lookup while no tape records)
        tape = getattr(_local, "tape", None)
        if tape is not None:
            tape.append((entry, tensors))


def recording() -> bool:
    """Whether a :class:`Tape` records on the calling thread."""
    return _recording > 0 and getattr(_local, "tape", None) is not None


class Tape:
    """``with Tape() as tape:`` records the calling thread's :func:`launch` calls in the block:
    ``tape.launches`` holds ``(entry, tensors)`` in launch order, *entry* None where the call
    was not lean (it cannot be replayed). Tapes do not nest."""

    def __init__(self) -> None:
        self.launches: list[tuple[Any, tuple]] = []

    def __enter__(self) -> Tape:
        global _recording
        if getattr(_local, "tape", None) is not None:
            raise RuntimeError("pycudnn.torch: a launch tape is already recording on this thread")
        with _recording_lock:
            _recording += 1
        _local.tape = self.launches
        return self

    def __exit__(self, *exc: object) -> None:
        global _recording
        _local.tape = None
        with _recording_lock:
            _recording -= 1
