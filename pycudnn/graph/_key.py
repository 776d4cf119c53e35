"""The frozen form of a builder graph: :class:`GraphKey`, a graph key of the plan engine
(:mod:`._plans`), and how it turns into backend descriptors.

A key holds plain data only -- the tensors (uid, dims, strides, data type, virtual, by value,
alignment) and the nodes (kind, settings, tensor roles -> uids) -- plus the search policy. It is
hashable and compares by structure (node and tensor *names* are kept for error messages but do
not take part), so two graphs built the same way share one cached plan. ``build_graph(handle)``
makes the descriptors: one tensor descriptor per uid, shared by the operations that use it, then
one operation per node, encoded as its family's registry row says (:data:`.nodes.KINDS`); a
refusal by cuDNN is re-raised naming the node, its kind and the attribute (or ``finalize``),
with cuDNN's last error text. ``timing_buffers`` gives the engine zero-filled buffers to time an
autotuned graph on, and ``scratch`` the tensors the graph keeps in its workspace.
"""

from __future__ import annotations

import ctypes
import enum
from collections.abc import Sequence
from typing import Any, NamedTuple

from .. import _layout, errors, memory
from .._types import FLOATS, itemsize, scaling_type
from ..descriptors import BackendDescriptor
from ..descriptors._validate import coerce_enum
from ..enums import BackendAttributeName as A
from ..enums import BackendAttributeType as T
from ..enums import BackendBehaviorNote, BackendHeurMode, BackendNumericalNote, DataType
from ._tensor import (
    GraphBase,
    Tensor,
    check_extent,
    check_ragged,
    described_dim,
    described_stride,
    host_scalar,
)
from .nodes import KINDS
from .nodes._base import SCALING

__all__ = [
    "GraphKey",
    "NodeSpec",
    "Policy",
    "TensorSpec",
    "device_of",
    "freeze",
    "main_data_type",
    "node_specs",
    "search_policy",
    "structure",
    "unnamed",
]


class TensorSpec(NamedTuple):
    """One tensor of a frozen graph (element strides; ``scratch``: a non-virtual tensor the
    graph places in its own workspace, ``'zero'`` when it must be zero-filled before a run)."""

    uid: int
    dim: tuple[int, ...]
    stride: tuple[int, ...]
    data_type: int
    is_virtual: bool
    is_by_value: bool
    alignment: int
    scratch: str | None = None
    ragged_offset: int | None = None  #: the uid of its ragged offset tensor


class NodeSpec(NamedTuple):
    """One operation: its kind, its settings (sorted ``(name, value)`` pairs), and its tensor
    roles -- ``(BackendAttributeName member name, uid)`` pairs -- inputs first."""

    kind: str
    settings: tuple[tuple[str, Any], ...]
    tensors: tuple[tuple[str, int], ...]


class Policy(NamedTuple):
    """What changes a graph's plan beside its structure: the main data type, the device and
    cuDNN, the numerics filters and the search (:func:`search_policy` checks the last five)."""

    dtype: int
    device: int
    cudnn_version: int
    allow_tf32: bool
    deterministic: bool
    workspace_limit: int  #: bytes; -1: no limit
    algo: str  #: ``'guess'`` (the first engine that builds) or ``'time'`` (the fastest)
    heur_modes: tuple[int, ...]
    deny_numerical: frozenset[int] = frozenset()
    deny_behavior: frozenset[int] = frozenset()


_HEUR = {
    "a": BackendHeurMode.MODE_A,
    "b": BackendHeurMode.MODE_B,
    "instant": BackendHeurMode.MODE_INSTANT,
    "fallback": BackendHeurMode.MODE_FALLBACK,
}


def node_specs(g: GraphBase, tensors: Sequence[TensorSpec]) -> tuple[NodeSpec, ...]:
    """The frozen nodes of *g* (settings sorted, tensors by uid) given its frozen *tensors*."""
    return tuple(
        NodeSpec(
            kind,
            tuple(sorted(s.items())),
            tuple((role, tensors[t._index].uid) for role, t in roles),
        )
        for kind, _name, s, roles in g._nodes
    )


_NOTE_ARGS = ("deny_numerical_notes", "deny_behavior_notes")


def _notes(where: str, notes: Any, argument: str) -> tuple:
    """*notes* as a tuple of notes: one note (a member or a name) or a sequence of them (a
    string is one name, not its characters)."""
    if isinstance(notes, str | enum.Enum):
        return (notes,)
    try:
        return tuple(notes)
    except TypeError:
        raise TypeError(
            f"{where}: {argument} must be a note or a sequence of notes, got {notes!r}"
        ) from None


def device_of(where: str, device: Any) -> int:
    """A device ordinal given to ``Graph.key``/``build``: an int >= 0 (not a bool or a str)."""
    if isinstance(device, bool) or not hasattr(device, "__index__"):
        raise TypeError(f"{where}: device must be a device ordinal (an int >= 0), got {device!r}")
    if device.__index__() < 0:
        raise ValueError(f"{where}: device must be a device ordinal (an int >= 0), got {device!r}")
    return device.__index__()


def search_policy(
    where: str, policy: str, heur_mode: Any, workspace_limit: Any, deny_notes: tuple
) -> dict[str, Any]:
    """The search fields of a :class:`Policy` from ``Graph.key``'s arguments, checked
    (errors start with *where*): *policy* ``'heuristics'`` or ``'autotune'``, heuristics modes
    by name or member, the workspace limit (None: no limit), ``deny_notes`` the numerical and
    the behavior notes (members or names) an engine must not have."""
    if policy not in ("heuristics", "autotune"):
        raise ValueError(f"{where}: policy={policy!r} is not 'heuristics' or 'autotune'")
    try:
        modes = (heur_mode,) if isinstance(heur_mode, str) else tuple(heur_mode)
        hm = tuple(_HEUR[m.lower()] if isinstance(m, str) else BackendHeurMode(m) for m in modes)
    except (KeyError, ValueError, AttributeError, TypeError):
        raise ValueError(
            f"{where}: heur_mode={heur_mode!r}: expected names from {tuple(_HEUR)}"
        ) from None
    if not hm:
        raise ValueError(f"{where}: heur_mode is empty")
    numerical, behavior = (_notes(where, n, a) for n, a in zip(deny_notes, _NOTE_ARGS, strict=True))
    deny_n = frozenset(
        int(coerce_enum(n, BackendNumericalNote, "deny_numerical_notes")) for n in numerical
    )
    deny_b = frozenset(
        int(coerce_enum(n, BackendBehaviorNote, "deny_behavior_notes")) for n in behavior
    )
    wl = workspace_limit
    if wl is not None and (isinstance(wl, bool) or not isinstance(wl, int) or wl < 0):
        raise ValueError(f"{where}: workspace_limit must be None or an int >= 0, got {wl!r}")
    return {
        "algo": "time" if policy == "autotune" else "guess",
        "heur_modes": hm,
        "workspace_limit": -1 if wl is None else wl,
        "deny_numerical": deny_n,
        "deny_behavior": deny_b,
    }


def freeze(
    g: GraphBase, order: Sequence[Tensor] = ()
) -> tuple[tuple[TensorSpec, ...], tuple[int, ...]]:
    """``(the tensors' specs in declaration order, the uids in a call's pointer order)`` of the
    graph *g*: uids assigned (those set by ``set_uid`` kept), data types resolved from the
    graph's defaults, the dims and strides as cuDNN sees them. *order*: the tensors
    ``set_io_order`` put first."""
    if not g._nodes:
        raise ValueError(f"{g.name}: the graph has no operations")
    if not any(not t._virtual and t._producer for t in g._tensors):
        raise ValueError(f"{g.name}: no operation output is marked set_output(True)")
    used: set[int] = {t._uid for t in g._tensors if t._uid is not None}
    if len(used) != sum(t._uid is not None for t in g._tensors):
        raise ValueError(f"{g.name}: two tensors were given the same uid")
    nxt = 1
    uids = []
    for t in g._tensors:
        if t._uid is None:
            while nxt in used:
                nxt += 1
            used.add(nxt)
            uids.append(nxt)
        else:
            uids.append(t._uid)
    specs = []
    for t, uid in zip(g._tensors, uids, strict=True):
        ragged = None
        if t._ragged is not None:
            check_ragged(t, t._ragged)  # again: dims and types may have been set since
            ragged = uids[t._ragged._index]
        dt = t._dtype
        if dt is None:
            dt = g.intermediate_data_type if t._virtual else g.io_data_type
            if dt is None:
                raise ValueError(
                    f"{g.name}: tensor {t._name!r} has no data type: call "
                    "set_data_type(...) or give the Graph an io_data_type"
                )
        check_extent(f"{g.name}: tensor {t._name!r}", t._dim, t._stride, DataType(dt))
        spec = TensorSpec(
            uid,
            described_dim(t),
            described_stride(t),
            int(dt),
            t._virtual,
            t._by_value,
            t._alignment,
            t._scratch,
            ragged,
        )
        specs.append((t, spec))
    return tuple(s for _t, s in specs), _pointer_order(g, specs, order)


def _pointer_order(
    g: GraphBase, specs: list[tuple[Tensor, TensorSpec]], order: Sequence[Tensor]
) -> tuple[int, ...]:
    """A call's pointer order: real data tensors as declared (those of
    ``set_io_order`` first), then the by-value constants, then the scratch tensors."""
    used = {id(t) for _k, _n, _s, roles in g._nodes for _r, t in roles}
    used |= {id(t._ragged) for t in g._tensors if t._ragged is not None and id(t) in used}
    real = [
        (t, s)
        for t, s in specs
        if not s.is_virtual and not s.is_by_value and not s.scratch and id(t) in used
    ]
    if order:
        rank = {id(t): i for i, t in enumerate(order)}
        real.sort(key=lambda ts: rank.get(id(ts[0]), len(rank) + ts[0]._index))
    byv = [s for t, s in specs if s.is_by_value and id(t) in used]
    scr = [s for _t, s in specs if s.scratch]
    return tuple(s.uid for s in (*(s for _t, s in real), *byv, *scr))


def main_data_type(tensors: Sequence[TensorSpec]) -> DataType:
    """The data type a graph without an io data type is planned for (the engines' numerics
    filters): its first real floating-point tensor's, float32 without one."""
    for t in tensors:
        if not t.is_virtual and not t.is_by_value and not t.scratch and t.data_type in FLOATS:
            return DataType(t.data_type)
    return DataType.FLOAT


def structure(g: GraphBase, tensors: Sequence[TensorSpec]) -> dict[str, Any]:
    """The document ``Graph.to_json`` writes: the frozen *tensors* and *g*'s nodes, with their
    names."""
    return {
        "format": "pycudnn.graph/1",
        "name": g.name,
        "tensors": [_tensor_doc(t, spec) for t, spec in zip(g._tensors, tensors, strict=True)],
        "nodes": [
            {
                "kind": kind,
                "name": name,
                "settings": s,
                "tensors": [[role, tensors[t._index].uid] for role, t in roles],
            }
            for kind, name, s, roles in g._nodes
        ],
    }


def _tensor_doc(t: Tensor, spec: TensorSpec) -> dict[str, Any]:
    """One tensor of ``Graph.to_json`` (``ragged_offset`` only when set: the documents of
    graphs without one are as before)."""
    doc = dict(spec._asdict(), name=t._name)
    if spec.ragged_offset is None:
        del doc["ragged_offset"]
    return doc


def unnamed(graph: Any) -> Any:
    """A ``Graph.to_json`` structure without its names (they only label messages)."""
    if not isinstance(graph, dict):
        return graph
    return {
        "tensors": [{k: v for k, v in t.items() if k != "name"} for t in graph.get("tensors", [])],
        "nodes": [{k: v for k, v in n.items() if k != "name"} for n in graph.get("nodes", [])],
    }


def _refused(exc: errors.CudnnError, node: str, kind: str, what: str) -> errors.CudnnError:
    detail = f"node {node!r} ({kind}): cuDNN refused {what}"
    if exc.detail:
        detail += f": {exc.detail}"
    new = type(exc)(int(exc.status), exc.api, detail)
    return new


class GraphKey:
    """A frozen builder graph and its search policy: a graph key of :mod:`._plans`.

    Equal (and equally hashed) when the structure and the policy are; the names of nodes and
    tensors only label error messages.
    """

    __slots__ = (
        "_hash",
        "algo",
        "allow_tf32",
        "api",
        "cudnn_version",
        "deny_behavior",
        "deny_numerical",
        "deterministic",
        "device",
        "dtype",
        "heur_modes",
        "label",
        "names",
        "nodes",
        "tensors",
        "uids",
        "workspace_limit",
    )

    def __init__(
        self,
        tensors: tuple[TensorSpec, ...],
        nodes: tuple[NodeSpec, ...],
        uids: tuple[int, ...],
        policy: Policy,
        *,
        names: tuple[tuple[str, ...], tuple[str, ...]],
        label: str | None = None,
        api: str = "pycudnn.graph",
    ):
        self.tensors, self.nodes, self.uids = tensors, nodes, uids
        self.names = names  # (tensor names by position, node names by position)
        self.dtype, self.device, self.cudnn_version = (
            policy.dtype,
            policy.device,
            policy.cudnn_version,
        )
        self.allow_tf32, self.deterministic = policy.allow_tf32, policy.deterministic
        self.workspace_limit, self.algo = policy.workspace_limit, policy.algo
        self.heur_modes = tuple(BackendHeurMode(m) for m in policy.heur_modes)
        self.deny_numerical, self.deny_behavior = policy.deny_numerical, policy.deny_behavior
        self.label = label
        self.api = api  # the function named by errors
        self._hash = hash(self._fields())

    def _fields(self) -> tuple:
        return (
            self.tensors,
            self.nodes,
            self.uids,
            self.dtype,
            self.device,
            self.cudnn_version,
            self.allow_tf32,
            self.deterministic,
            self.workspace_limit,
            self.algo,
            self.heur_modes,
            self.deny_numerical,
            self.deny_behavior,
        )

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, GraphKey)
            and self._hash == other._hash
            and self._fields() == other._fields()
        )

    def __repr__(self) -> str:
        return f"<GraphKey {self.what()}>"

    def what(self) -> str:
        """A phrase naming the graph, for error messages."""
        kinds = "+".join(n.kind for n in self.nodes)
        if self.label:
            return f"{self.label} graph ({kinds})"
        return f"graph of {len(self.nodes)} operations ({kinds})"

    @property
    def scratch(self) -> tuple[TensorSpec, ...]:
        """The tensors the graph places in its workspace, in uid order of a call."""
        return tuple(t for t in self.tensors if t.scratch)

    def build_graph(self, handle: Any) -> BackendDescriptor:
        """The finalized operation graph (module docstring)."""
        tnames, nnames = self.names
        descs: dict[int, BackendDescriptor] = {}
        # the ragged tensors last: each holds its offset tensor's descriptor
        order = sorted(range(len(self.tensors)), key=lambda i: self.tensors[i].ragged_offset or 0)
        for i in order:
            t = self.tensors[i]
            what = f"its dims {t.dim} / strides {t.stride}"
            try:
                d = BackendDescriptor.tensor(
                    t.dim,
                    t.stride,
                    DataType(t.data_type),
                    uid=t.uid,
                    alignment=t.alignment,
                    is_virtual=t.is_virtual,
                    is_by_value=t.is_by_value,
                    finalize=t.ragged_offset is None,
                )
                if t.ragged_offset is not None:
                    what = f"its ragged offset (tensor uid {t.ragged_offset})"
                    d.set(A.TENSOR_RAGGED_OFFSET_DESC, T.BACKEND_DESCRIPTOR, descs[t.ragged_offset])
                    d.finalize()
                descs[t.uid] = d
            except errors.CudnnError as exc:
                raise _refused(exc, tnames[i], "tensor", what) from None
        ops = [self._operation(n, nnames[i], descs) for i, n in enumerate(self.nodes)]
        try:
            return BackendDescriptor.operation_graph(ops, handle)
        except errors.CudnnError as exc:
            raise _refused(exc, self.label or "graph", "operation graph", "the graph") from None

    def timing_buffers(self, handle: Any, given_ptrs: Any = None) -> tuple[list[int], list[Any]]:
        """``(ptrs, keepalive)`` to time candidate plans on (the engine's ``algo == 'time'``):
        a zero-filled buffer for every real tensor (zero lengths keep a variable-length graph
        in bounds), a host scalar for every by-value one (1 for floats, else 0), a placeholder
        for every scratch tensor (carved from the workspace). The caller's pointers are not
        used: an output may alias an input."""
        del given_ptrs
        by_uid = {t.uid: t for t in self.tensors}
        ptrs: list[int] = []
        keep: list[Any] = []
        for uid in self.uids:
            spec = by_uid[uid]
            dt = DataType(spec.data_type)
            if spec.scratch:
                ptrs.append(0)
            elif spec.is_by_value:
                c = host_scalar(1.0 if dt in FLOATS else 0, dt)
                keep.append(c)
                ptrs.append(ctypes.addressof(c))
            else:
                n = max(_layout.span(spec.dim, spec.stride), 1) * itemsize(dt)
                buf = memory.zeros((n,), "uint8", self.device, handle.stream)
                keep.append(buf)
                ptrs.append(buf.ptr)
        return ptrs, keep

    @staticmethod
    def _operation(
        n: NodeSpec, name: str, descs: dict[int, BackendDescriptor]
    ) -> BackendDescriptor:
        s = dict(n.settings)
        kind = n.kind
        enc = KINDS[kind]
        op = BackendDescriptor(enc.descriptor)
        what = "its settings"
        try:
            if enc.sub is not None:
                attr, make = enc.sub
                what = f"its {attr.name} settings {s}"
                op.set(attr, T.BACKEND_DESCRIPTOR, make(s))
            for role, uid in n.tensors:
                what = f"{role} (tensor uid {uid})"
                op.set(A[role], T.BACKEND_DESCRIPTOR, descs[uid])
            for attr, key, atype, convert in enc.scalars:
                if key not in s:
                    continue
                what = f"{attr.name}={s[key]!r}"
                if atype == SCALING:
                    atype = scaling_type(s.get("compute_data_type", DataType.FLOAT))
                op.set(attr, atype, s[key] if convert is None else convert(s[key]))
            what = "finalize"
            return op.finalize()
        except errors.CudnnError as exc:
            raise _refused(exc, name, kind, what) from None
