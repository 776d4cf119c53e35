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
from typing import Any, NamedTuple

from .. import _layout, errors, memory
from .._types import FLOATS, itemsize, scaling_type
from ..descriptors import BackendDescriptor
from ..enums import BackendAttributeName as A
from ..enums import BackendAttributeType as T
from ..enums import BackendHeurMode, DataType
from ._tensor import host_scalar
from .nodes import KINDS
from .nodes._base import SCALING

__all__ = ["GraphKey", "NodeSpec", "TensorSpec"]


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


class NodeSpec(NamedTuple):
    """One operation: its kind, its settings (sorted ``(name, value)`` pairs), and its tensor
    roles -- ``(BackendAttributeName member name, uid)`` pairs -- inputs first."""

    kind: str
    settings: tuple[tuple[str, Any], ...]
    tensors: tuple[tuple[str, int], ...]


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
        *,
        names: tuple[tuple[str, ...], tuple[str, ...]],
        dtype: int,
        device: int,
        cudnn_version: int,
        allow_tf32: bool,
        deterministic: bool,
        workspace_limit: int,
        algo: str,
        heur_modes: tuple[int, ...],
        deny_numerical: frozenset[int] = frozenset(),
        deny_behavior: frozenset[int] = frozenset(),
        label: str | None = None,
        api: str = "pycudnn.graph",
    ):
        self.tensors, self.nodes, self.uids = tensors, nodes, uids
        self.names = names  # (tensor names by position, node names by position)
        self.dtype, self.device, self.cudnn_version = dtype, device, cudnn_version
        self.allow_tf32, self.deterministic = allow_tf32, deterministic
        self.workspace_limit, self.algo = workspace_limit, algo
        self.heur_modes = tuple(BackendHeurMode(m) for m in heur_modes)
        self.deny_numerical, self.deny_behavior = deny_numerical, deny_behavior
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
        for i, t in enumerate(self.tensors):
            try:
                descs[t.uid] = BackendDescriptor.tensor(
                    t.dim,
                    t.stride,
                    DataType(t.data_type),
                    uid=t.uid,
                    alignment=t.alignment,
                    is_virtual=t.is_virtual,
                    is_by_value=t.is_by_value,
                )
            except errors.CudnnError as exc:
                what = f"its dims {t.dim} / strides {t.stride}"
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
