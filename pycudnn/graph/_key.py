"""The frozen form of a builder graph: :class:`GraphKey`, a graph key of the plan engine
(:mod:`._plans`), and how it turns into backend descriptors.

A key holds plain data only -- the tensors (uid, dims, strides, data type, virtual, by value,
alignment) and the nodes (kind, settings, tensor roles -> uids) -- plus the search policy. It is
hashable and compares by structure (node and tensor *names* are kept for error messages but do
not take part), so two graphs built the same way share one cached plan. ``build_graph(handle)``
makes the descriptors: one tensor descriptor per uid, shared by the operations that use it, then
one operation per node; a refusal by cuDNN is re-raised naming the node, its kind and the
attribute (or ``finalize``), with cuDNN's last error text.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .. import errors
from ..descriptors import BackendDescriptor
from ..enums import (
    BackendAttributeName as A,
)
from ..enums import (
    BackendAttributeType as T,
)
from ..enums import (
    BackendDescriptorType as D,
)
from ..enums import (
    BackendHeurMode,
    BackendNormFwdPhase,
    BackendNormMode,
    ConvolutionMode,
    DataType,
    PointwiseMode,
    ReduceTensorOp,
    RngDistribution,
)

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


def _scaling(compute: int) -> T:
    return T.DOUBLE if compute == DataType.DOUBLE else T.FLOAT


def _conv_desc(s: dict[str, Any]) -> BackendDescriptor:
    return BackendDescriptor.convolution(
        s["pre_padding"],
        s["post_padding"],
        s["stride"],
        s["dilation"],
        mode=ConvolutionMode(s["mode"]),
        compute_type=DataType(s["compute_data_type"]),
    )


def _pointwise_desc(s: dict[str, Any]) -> BackendDescriptor:
    params = {k: s[k] for k in _PW_PARAMS if k in s}
    return BackendDescriptor.pointwise(
        PointwiseMode(s["mode"]), DataType(s["compute_data_type"]), **params
    )


_PW_PARAMS = (
    "relu_lower_clip",
    "relu_upper_clip",
    "relu_lower_clip_slope",
    "elu_alpha",
    "softplus_beta",
    "swish_beta",
    "axis",
)


def _matmul_desc(s: dict[str, Any]) -> BackendDescriptor:
    d = BackendDescriptor(D.MATMUL_DESCRIPTOR)
    d.set(A.MATMUL_COMP_TYPE, T.DATA_TYPE, DataType(s["compute_data_type"]))
    if s.get("padding_value") is not None:
        d.set(A.MATMUL_PADDING_VALUE, T.DOUBLE, float(s["padding_value"]))
    return d.finalize()


def _reduction_desc(s: dict[str, Any]) -> BackendDescriptor:
    d = BackendDescriptor(D.REDUCTION_DESCRIPTOR)
    d.set(A.REDUCTION_OPERATOR, T.REDUCTION_OPERATOR_TYPE, ReduceTensorOp(s["mode"]))
    d.set(A.REDUCTION_COMP_TYPE, T.DATA_TYPE, DataType(s["compute_data_type"]))
    if s.get("deterministic") is not None:
        d.set(A.REDUCTION_IS_DETERMINISTIC, T.BOOLEAN, bool(s["deterministic"]))
    return d.finalize()


def _rng_desc(s: dict[str, Any]) -> BackendDescriptor:
    d = BackendDescriptor(D.RNG_DESCRIPTOR)
    d.set(A.RNG_DISTRIBUTION, T.RNG_DISTRIBUTION, RngDistribution.BERNOULLI)
    d.set(A.RNG_BERNOULLI_DIST_PROBABILITY, T.DOUBLE, float(s["probability"]))
    return d.finalize()


# kind -> (operation descriptor type, the sub-descriptor attribute and its maker, scalar
# attributes written from the settings: (attribute, settings key, type or "scaling"))
_KINDS: dict[str, tuple[D, tuple[A, Any] | None, tuple[tuple[A, str, Any], ...]]] = {
    "conv_fprop": (
        D.OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
        (A.OPERATION_CONVOLUTION_FORWARD_CONV_DESC, _conv_desc),
        (
            (A.OPERATION_CONVOLUTION_FORWARD_ALPHA, "alpha", "scaling"),
            (A.OPERATION_CONVOLUTION_FORWARD_BETA, "beta", "scaling"),
        ),
    ),
    "conv_dgrad": (
        D.OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
        (A.OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, _conv_desc),
        (
            (A.OPERATION_CONVOLUTION_BWD_DATA_ALPHA, "alpha", "scaling"),
            (A.OPERATION_CONVOLUTION_BWD_DATA_BETA, "beta", "scaling"),
        ),
    ),
    "conv_wgrad": (
        D.OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
        (A.OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, _conv_desc),
        (
            (A.OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, "alpha", "scaling"),
            (A.OPERATION_CONVOLUTION_BWD_FILTER_BETA, "beta", "scaling"),
        ),
    ),
    "matmul": (D.OPERATION_MATMUL_DESCRIPTOR, (A.OPERATION_MATMUL_DESC, _matmul_desc), ()),
    "pointwise": (
        D.OPERATION_POINTWISE_DESCRIPTOR,
        (A.OPERATION_POINTWISE_PW_DESCRIPTOR, _pointwise_desc),
        (
            (A.OPERATION_POINTWISE_ALPHA1, "alpha1", "scaling"),
            (A.OPERATION_POINTWISE_ALPHA2, "alpha2", "scaling"),
        ),
    ),
    "reduction": (
        D.OPERATION_REDUCTION_DESCRIPTOR,
        (A.OPERATION_REDUCTION_DESC, _reduction_desc),
        (),
    ),
    "rng": (D.OPERATION_RNG_DESCRIPTOR, (A.OPERATION_RNG_DESC, _rng_desc), ()),
    "reshape": (D.OPERATION_RESHAPE_DESCRIPTOR, None, ()),
    "norm_forward": (
        D.OPERATION_NORM_FORWARD_DESCRIPTOR,
        None,
        (
            (A.OPERATION_NORM_FWD_MODE, "mode", T.NORM_MODE),
            (A.OPERATION_NORM_FWD_PHASE, "phase", T.NORM_FWD_PHASE),
        ),
    ),
    "norm_backward": (
        D.OPERATION_NORM_BACKWARD_DESCRIPTOR,
        None,
        ((A.OPERATION_NORM_BWD_MODE, "mode", T.NORM_MODE),),
    ),
}
_ENUM_OF = {T.NORM_MODE: BackendNormMode, T.NORM_FWD_PHASE: BackendNormFwdPhase}


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
        return f"graph of {len(self.nodes)} operations ({kinds})" if not self.label else (
            f"{self.label} graph ({kinds})"
        )  # fmt: skip

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
                raise _refused(exc, tnames[i], "tensor", f"its dims {t.dim} / strides {t.stride}"
                               ) from None  # fmt: skip
        ops = [self._operation(n, nnames[i], descs) for i, n in enumerate(self.nodes)]
        try:
            return BackendDescriptor.operation_graph(ops, handle)
        except errors.CudnnError as exc:
            raise _refused(exc, self.label or "graph", "operation graph", "the graph") from None

    @staticmethod
    def _operation(n: NodeSpec, name: str, descs: dict[int, BackendDescriptor]
                   ) -> BackendDescriptor:  # fmt: skip
        s = dict(n.settings)
        kind = n.kind
        dtype, sub, scalars = _KINDS[kind]
        op = BackendDescriptor(dtype)
        what = "its settings"
        try:
            if sub is not None:
                attr, make = sub
                what = f"its {attr.name} settings {s}"
                op.set(attr, T.BACKEND_DESCRIPTOR, make(s))
            for role, uid in n.tensors:
                what = f"{role} (tensor uid {uid})"
                op.set(A[role], T.BACKEND_DESCRIPTOR, descs[uid])
            for attr, key, atype in scalars:
                if key not in s:
                    continue
                what = f"{attr.name}={s[key]!r}"
                if atype == "scaling":
                    op.set(attr, _scaling(s.get("compute_data_type", DataType.FLOAT)), s[key])
                else:
                    op.set(attr, atype, _ENUM_OF[atype](s[key]))
            if kind == "rng" and "seed" in s:
                what = f"OPERATION_RNG_SEED={s['seed']!r}"
                op.set(A.OPERATION_RNG_SEED, T.INT64, int(s["seed"]))
            what = "finalize"
            return op.finalize()
        except errors.CudnnError as exc:
            raise _refused(exc, name, kind, what) from None
