"""Module bindings (imports no torch): a converted module's last call, bound to its signature, so
that the next call with the same signature is one launch of a bound entry (issue 37).

The lean path (:mod:`._lean`) already launches a bound call entry per call, but each call still
climbs the module's checks, the family's functions and the lean key (every operand's shape,
strides, dtype, device and alignment, built and looked up per launch): on a slow host about as
much Python as the launch itself. A :class:`Binding` is what a module keeps of its last call
that ran as one lean launch: the call's *signature* -- everything its checks and that key read,
as the family builds it (the operands' properties and types, the module's options, whether a
gradient is wanted, ``pycudnn.config``, the thread) -- and the entry it ran. A call whose
signature equals the binding's allocates its outputs and launches the entry on their pointers:
nothing is checked or keyed twice, because an equal signature pins every property the first
call validated. Any other call takes the family's path (which validates everything) and binds
anew. A backward binds its gradients' entries the same way, per thread (autograd runs a
device's backward on its own thread, whose handle the entries hold), keyed on the incoming
gradient's signature.

A module keeps its last :data:`MAX_BINDINGS` signatures bound (the least recently used is
dropped for a new one): a decoder's layers see one signature for a prompt and another for every
token after it, generation after generation, and both stay bound. A module whose calls keep
changing signature -- :data:`COLD_LIMIT` new bindings in a row while none of its bindings was
ever reused -- stops binding (binding costs a tape and a signature per call). A signature includes
how many times ``pycudnn.clear_caches()`` ran (``graph._plans.stats.clears``), so a
clear sends the next call through the public function as it does for every other cache; until
then a binding holds its entries, as a launch program does.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from threading import get_ident
from typing import Any

from ..graph import _plans
from ..highlevel import _bound, _call
from . import _lean

__all__ = [
    "COLD_LIMIT",
    "MAX_BINDINGS",
    "Binding",
    "backward",
    "find",
    "keep",
    "latest",
    "launch",
    "record",
]

#: bindings a module may make in a row while none of its bindings was reused, before it stops
COLD_LIMIT = 4
#: signatures a module keeps bound at once
MAX_BINDINGS = 4


class Binding:
    """A module's last call bound to its signature (see the module docstring).

    Attributes
    ----------
    sig : tuple
        The call's signature, as the family builds it.
    entry : object
        The forward's bound entry (:class:`~pycudnn.highlevel._call.Call` with ``lean``).
    index : int
        The CUDA device the call ran on (its stream is read per launch).
    meta : object
        What the family keeps to allocate the outputs (shapes, devices, options).
    hits : int
        Calls that launched the entry (tests and diagnostics).
    grads : dict
        Per ``(thread ident, tag)`` (a backward may launch several entries: a product's input
        and weight gradients), ``(gradient signature, entry)``; entry None where that
        signature's backward did not bind.
    """

    __slots__ = ("entry", "grads", "hits", "index", "meta", "sig")

    def __init__(self, sig: tuple, entry: Any, index: int, meta: Any) -> None:
        self.sig = sig
        self.entry = entry
        self.index = index
        self.meta = meta
        self.hits = 0
        self.grads: dict[tuple[int, Any], tuple[tuple, Any]] = {}


def launch(entry: Any, inputs: tuple, outputs: tuple, stream: int) -> bool:
    """Launch a bound *entry* on the *inputs*' pointers, then the new *outputs*' (the lean
    path's order), on *stream*, as :func:`~pycudnn.highlevel._bound.run` does on a hit. False
    when it cannot run here: an output not 16-byte aligned (the entry was bound on aligned
    ones), another device current, or a failed launch (say its workspace no longer fits); the
    caller then takes its family's path, which rebinds or raises the public function's
    error."""
    outs = tuple([t.data_ptr() for t in outputs])
    odd = 0
    for p in outs:
        odd |= p
    if odd & 15:
        return False
    h = entry.handle
    if not (_call.one_device or _bound.current_device() == h.device):
        return False
    h.set_stream(stream)
    try:
        entry.launch(tuple([t.data_ptr() for t in inputs]) + outs)
    except Exception:
        return False
    return True


def record(run: Callable[..., Any], inputs: tuple, *args: Any) -> tuple[Any, Any]:
    """``run(*args)`` under a tape: ``(its result, the entry)`` where the run was exactly one
    lean launch on *inputs* (the same objects: no copy made on the way) and new outputs, each
    16-byte aligned, else ``(result, None)``. Under a tape already recording (a launch
    program's first run) it only runs: tapes do not nest, and that tape records the launch."""
    if _lean.recording():
        return run(*args), None
    with _lean.Tape() as tape:
        out = run(*args)
    launches = tape.launches
    if len(launches) != 1:
        return out, None
    entry, seen = launches[0]
    n = len(inputs)
    if entry is None or len(seen) <= n:
        return out, None
    for a, b in zip(seen[:n], inputs, strict=True):
        if a is not b:
            return out, None
    for t in seen[n:]:
        if t.data_ptr() & 15:
            return out, None
    return out, entry


def backward(
    bd: Binding,
    tag: Any,
    dy: Any,
    stream: int,
    inputs: tuple,
    outputs: Callable[..., tuple],
    run: Callable[..., Any],
    *args: Any,
) -> Any:
    """A bound module's backward launch *tag* on *inputs* (*dy* among them) on *stream*: where
    this thread bound its entry for a gradient of *dy*'s signature, ``outputs(bd, *inputs)``
    allocates the new outputs and the entry launches on them (returned as that tuple); else the
    family's own path ``run(*args)`` runs under a tape (:func:`record`), binding its entry for
    the next backward, and its result is returned. A gradient signature whose run did not bind
    (a gradient the family copies first, say an expanded one) is remembered as such: its next
    backwards run the family's path with no tape."""
    sig = (type(dy), dy.shape, dy.stride(), dy.dtype, dy.get_device(), dy.data_ptr() & 15,
           _call.snapshot(), _plans.stats.clears)  # fmt: skip
    key = (get_ident(), tag)
    g = bd.grads.get(key)
    if g is not None and g[0] == sig:
        if g[1] is None:
            return run(*args)
        outs = outputs(bd, *inputs)
        if launch(g[1], inputs, outs, stream):
            return outs
    nested = _lean.recording()  # (under a program's tape nothing binds: not the signature's doing)
    out, entry = record(run, inputs, *args)
    if entry is not None or not nested:
        bd.grads[key] = (sig, entry)
    return out


def find(bound: OrderedDict, sig: tuple) -> Binding | None:
    """The binding of *sig* among a module's *bound* (``store["bound"]``), made the most
    recently used, or None."""
    bd = bound.get(sig)
    if bd is not None:
        bound.move_to_end(sig)
    return bd


def latest(store: dict) -> Binding | None:
    """The module's most recently made or used binding in *store* (its side table), or None."""
    bound = store.get("bound")
    return next(reversed(bound.values())) if bound else None


def keep(store: dict, sig: tuple, entry: Any, index: int, meta: Any) -> None:
    """Add ``Binding(sig, entry, index, meta)`` to the module's bindings in *store* (its side
    table; the least recently used of :data:`MAX_BINDINGS` is dropped). A new binding while
    the module has bindings none of which was ever reused counts as cold; :data:`COLD_LIMIT`
    of those in a row and the module stops binding."""
    bound = store.get("bound")
    if bound is None:
        bound = store["bound"] = OrderedDict()
    elif bound:
        cold = 0 if any(b.hits for b in bound.values()) else store.get("cold", 0) + 1
        store["cold"] = cold
        if cold >= COLD_LIMIT:
            store["bound"] = None
            store["nobind"] = True
            return
    if len(bound) >= MAX_BINDINGS:
        bound.popitem(last=False)
    bound[sig] = Binding(sig, entry, index, meta)
