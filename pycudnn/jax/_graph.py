"""A :class:`pycudnn.graph.Graph` called from JAX code: :func:`graph_call` runs a builder graph
on XLA's buffers and stream, inside ``jax.jit``.

**Identity.** XLA's call carries text, not Python objects: a graph is put in a process-wide
registry (:func:`register_graph`) and the call's request names its registry id, with the
signature the graph had then (its inputs' and outputs' shapes and dtypes); a graph whose
structure (``Graph.to_json()``) changed gets a new id, and one changed after a program was
traced with it is refused when that program first runs it, so a compiled program runs the
graph it was traced with. The registry holds the graph **strongly**: a
registered graph lives as long as it is registered, and a program traced with it runs only
while it is; :func:`release_graph` drops it (a later run of such a program fails, saying so).

**Operands and results.** The graph's real input tensors, in the order they were declared,
are the operands; its outputs (``set_output(True)``), in declaration order, are the results,
allocated by XLA (:func:`graph_io` lists both). A JAX array is dense: its shape is the
tensor's dims **in memory order** -- the dims themselves for a row-major tensor, ``(N, H, W,
C)`` for dims ``(N, C, H, W)`` with channels-last strides -- and tensors whose strides are not a
dense permutation cannot be called. By-value tensors other than :meth:`Graph.scalar`
constants take a Python number per call, which a compiled program has not: refused.

**Running.** The graph's key (its frozen structure and search policy: the one
:meth:`Graph.build` made when the graph was built for that device, else the default policy's)
is planned once per executing thread with that thread's handle (pycudnn's plan cache), and
each call launches the plan on XLA's stream with pycudnn's per-stream workspace (the graph's
scratch tensors carved from it). The caller's graph is not modified. No ``custom_vjp``: a
graph's gradient is another graph, and a user pairs the two with ``jax.custom_vjp``. Under
``vmap`` the graph runs once per example.
"""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import _cuda
from .._types import numpy_dtype
from ..enums import DataType
from ..graph import Graph, _plans
from ..graph._key import freeze
from ..highlevel import _call
from . import _ops, _request
from ._operands import device_of

__all__ = [
    "GraphCall",
    "Port",
    "graph_call",
    "graph_io",
    "register_graph",
    "registered",
    "release_graph",
]

_FUNC = "pycudnn.jax.graph_call"
_LOCK = threading.Lock()
_IDS = itertools.count(1)
_local = threading.local()


class Port(NamedTuple):
    """One operand or result of a graph call."""

    name: str
    uid: int
    shape: tuple[int, ...]  # the tensor's dims in memory order (the JAX array's shape)
    dtype: np.dtype


class _Entry(NamedTuple):
    graph: Graph
    inputs: tuple[Port, ...]
    outputs: tuple[Port, ...]
    uids: tuple[int, ...]  # the plan's pointer order (the graph's real tensors)
    structure: str  # Graph.to_json() when registered: a graph changed since is refused


_REGISTRY: dict[int, _Entry] = {}  # registry id -> entry (holds the graph)
_BY_GRAPH: dict[tuple[int, str], int] = {}  # (id(graph), structure) -> registry id


def _memory_shape(name: str, dim: Sequence[int], stride: Sequence[int]) -> tuple[int, ...]:
    """The dims of a dense tensor in memory order (outermost first)."""
    order = sorted(range(len(dim)), key=lambda i: (-stride[i], i))
    expect = 1
    for i in reversed(order):
        if dim[i] != 1 and stride[i] != expect:
            raise ValueError(
                f"{_FUNC}: tensor {name!r} has dims {tuple(dim)} and strides {tuple(stride)}; "
                "expected a dense layout (a permutation of packed strides): a JAX array is one"
            )
        expect *= dim[i]
    return tuple(dim[i] for i in order)


def _ports(graph: Graph) -> tuple[tuple[Port, ...], tuple[Port, ...], tuple[int, ...]]:
    """The graph's inputs and outputs (declaration order) and its pointer order."""
    specs, uids = freeze(graph)
    real = set(uids)
    inputs: list[Port] = []
    outputs: list[Port] = []
    for t, s in zip(graph._tensors, specs, strict=True):
        if s.is_virtual or s.scratch or s.uid not in real:
            continue
        if s.is_by_value:
            if t._value is None:
                raise ValueError(
                    f"{_FUNC}: tensor {t._name!r} is passed by value (a number per call, which "
                    "a compiled program has not); make it a constant with Graph.scalar(), or "
                    "an input array"
                )
            continue
        port = Port(
            t._name,
            s.uid,
            _memory_shape(t._name, s.dim, s.stride),
            np.dtype(numpy_dtype(DataType(s.data_type))),
        )
        (outputs if t._producer is not None else inputs).append(port)
    return tuple(inputs), tuple(outputs), tuple(uids)


def register_graph(graph: Graph) -> int:
    """Put *graph* in the registry (strongly held) and return its registry id; the same graph
    with the same structure (``Graph.to_json()``) keeps its id, a changed one gets a new id.
    :func:`graph_call` registers on its own.

    Raises
    ------
    TypeError
        *graph* is not a :class:`pycudnn.graph.Graph`.
    ValueError
        The graph does not freeze (no operation, no output, a tensor without a data type), a
        by-value tensor that is not a constant, a non-dense tensor.
    """
    if not isinstance(graph, Graph):
        raise TypeError(
            f"{_FUNC}: graph is a {type(graph).__name__}; expected a pycudnn.graph.Graph"
        )
    inputs, outputs, uids = _ports(graph)
    structure = graph.to_json()
    with _LOCK:
        rid = _BY_GRAPH.get((id(graph), structure))
        if rid is None or _REGISTRY.get(rid, (None,))[0] is not graph:
            rid = next(_IDS)
            _REGISTRY[rid] = _Entry(graph, inputs, outputs, uids, structure)
            _BY_GRAPH[(id(graph), structure)] = rid
    return rid


def release_graph(graph: Graph) -> int:
    """Drop *graph* from the registry (every signature it was registered with); returns how
    many entries were dropped. A program traced with it fails when it runs afterwards."""
    with _LOCK:
        gone = [rid for rid, e in _REGISTRY.items() if e.graph is graph]
        for rid in gone:
            del _REGISTRY[rid]
        for k in [k for k, rid in _BY_GRAPH.items() if rid in gone]:
            del _BY_GRAPH[k]
    return len(gone)


def registered(rid: int) -> Graph:
    """The graph registered under *rid* (a ``ValueError`` when it was released)."""
    entry = _REGISTRY.get(rid)
    if entry is None:
        raise ValueError(
            f"{_FUNC}: graph {rid} is not registered (released with release_graph?); a "
            "program runs a graph only while it is registered"
        )
    return entry.graph


def graph_io(graph: Graph) -> tuple[tuple[Port, ...], tuple[Port, ...]]:
    """``(inputs, outputs)`` of *graph* as :func:`graph_call` takes and returns them: each a
    ``Port(name, uid, shape, dtype)``, in declaration order."""
    if not isinstance(graph, Graph):
        raise TypeError(
            f"{_FUNC}: graph is a {type(graph).__name__}; expected a pycudnn.graph.Graph"
        )
    inputs, outputs, _uids = _ports(graph)
    return inputs, outputs


@dataclasses.dataclass(frozen=True)
class GraphCall(_request.Request):
    """A registered graph's run: operands its inputs, results its outputs. *signature*: the
    ports' ``(name, shape, dtype name)`` when traced (the text says what it runs)."""

    family = "graph"
    batch_results = False

    graph: int
    signature: tuple[Any, ...]

    def batch_operands(self) -> tuple[bool, ...]:
        return (False,) * len(_REGISTRY[self.graph].inputs) if self.graph in _REGISTRY else ()

    def results(self, *operands: Any) -> _ops.Results:
        entry = _REGISTRY.get(self.graph)
        if entry is None:
            registered(self.graph)
        assert entry is not None
        if len(operands) != len(entry.inputs):
            names = [p.name for p in entry.inputs]
            raise TypeError(
                f"{_FUNC}: {len(operands)} operands for graph {entry.graph.name!r}; expected "
                f"{len(entry.inputs)}, its inputs {names} in declaration order"
            )
        for i, (a, p) in enumerate(zip(operands, entry.inputs, strict=True)):
            if tuple(a.shape) != p.shape or np.dtype(a.dtype) != p.dtype:
                raise ValueError(
                    f"{_FUNC}: operands[{i}] (tensor {p.name!r}) is "
                    f"{np.dtype(a.dtype).name}{list(a.shape)}; expected "
                    f"{p.dtype.name}{list(p.shape)} (the tensor's dims in memory order)"
                )
        return tuple((p.shape, p.dtype) for p in entry.outputs)

    def run(self, args: Sequence[Any], rets: Sequence[Any], stream: int) -> None:
        entry = _REGISTRY.get(self.graph)
        if entry is None:
            registered(self.graph)
        assert entry is not None
        device = device_of((*args, *rets))
        h = _call.handle_for(device, stream, _FUNC)
        plan, key, ptrs, scratch = _planned(self.graph, entry, device, h)
        by_uid = {p.uid: b.ptr for p, b in zip(entry.inputs, args, strict=True)}
        by_uid.update((p.uid, b.ptr) for p, b in zip(entry.outputs, rets, strict=True))
        full = [by_uid.get(uid, ptr) for uid, ptr in zip(key.uids, ptrs, strict=True)]
        plan.launch(full, scratch)


def _planned(
    rid: int, entry: _Entry, device: int, h: Any
) -> tuple[Any, Any, list[int], tuple[Any, ...]]:
    """``(plan, key, pointer template, scratch tensors)`` of a registered graph on *device* for
    the calling thread (its handle): planned once per thread, graph and device. The template
    holds the constants' host addresses and 0 for the scratch tensors (and the arrays' slots)."""
    try:
        plans = _local.plans
    except AttributeError:
        plans = _local.plans = {}
    got = plans.get((rid, device))
    if got is not None and got[4] is entry.graph:
        return got[:4]
    graph = entry.graph
    if graph.to_json() != entry.structure:  # nodes or tensors changed after tracing
        raise ValueError(
            f"{_FUNC}: graph {graph.name!r} changed since it was traced (registry id {rid}); "
            "trace the call again"
        )
    key = graph._key
    if key is None or key.device != device:
        key = graph.key(device=device)  # the default policy, this thread's pycudnn.config
    with _cuda.DeviceContext(device):
        plan = _plans.plan(key, h)
    values = {s.uid: t for t, s in zip(graph._tensors, key.tensors, strict=True)}
    template = []
    for uid in key.uids:
        t = values[uid]
        spec = key.tensors[t._index]
        template.append(ctypes.addressof(t._value) if spec.is_by_value else 0)
    scratch = tuple(key.scratch)  # a property that builds it: read once
    plans[(rid, device)] = (plan, key, template, scratch, graph)
    return plan, key, template, scratch


def graph_call(graph: Graph, *operands: Any) -> tuple[jax.Array, ...]:
    """Run a :class:`pycudnn.graph.Graph` on JAX arrays, inside ``jax.jit`` or not.

    Parameters
    ----------
    graph : pycudnn.graph.Graph
        Its tensors' dims, strides and data types fixed (it freezes: ``graph.validate()``);
        built or not (built: its plan's policy is kept; not built: the default policy, planned
        on the first run). Registered (:func:`register_graph`) and held by the registry until
        :func:`release_graph`.
    *operands : jax.Array
        One per real input tensor, in declaration order (:func:`graph_io`), each of the
        tensor's dims in memory order and its dtype.

    Returns
    -------
    tuple of jax.Array
        One per output tensor, in declaration order, allocated by XLA.

    Raises
    ------
    TypeError, ValueError
        At trace time, before any C call: *graph* not a Graph or not freezable, an operand
        count, shape or dtype not the graph's (named), a by-value input, a non-dense tensor.

    Notes
    -----
    Not differentiable by itself (pair a forward and a backward graph with
    ``jax.custom_vjp``); ``vmap`` runs it once per example. The graph's build options
    (``policy='autotune'``...) apply when it was built before tracing, for that device.
    """
    rid = register_graph(graph)
    entry = _REGISTRY[rid]
    signature = tuple((p.name, p.shape, p.dtype.name) for p in (*entry.inputs, *entry.outputs))
    request = GraphCall(rid, signature)
    ops = [jnp.asarray(a) for a in operands]
    request.results(*ops)  # checked here: a clear error before tracing the call
    return tuple(_ops.call(request, *ops))
