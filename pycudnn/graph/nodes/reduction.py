"""Reduction nodes: reduce a tensor to an output shape (1 where a dim is reduced, a divisor to
reduce consecutive groups) -- checks, settings and encoding."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..._config import parse_bool
from ...descriptors import BackendDescriptor
from ...descriptors._validate import coerce_enum
from ...enums import BackendAttributeName as A
from ...enums import BackendAttributeType as T
from ...enums import BackendDescriptorType as D
from ...enums import DataType, ReduceTensorOp
from .._tensor import GraphBase, Tensor, as_dims
from ._base import NodeKind

__all__ = ["KINDS", "ReductionOperations", "reduction"]


def reduction(
    g: GraphBase,
    input: Any,
    mode: Any,
    dim: Sequence[int],
    compute: Any = None,
    deterministic: bool | None = None,
    name: str | None = None,
) -> Tensor:
    """Reduce *input* to the shape *dim* with *mode* (a ``ReduceTensorOp`` or its name)."""
    x = g._check("reduction", "input", input)
    m = coerce_enum(mode, ReduceTensorOp, "mode")
    d = as_dims(dim, f"{g.name}.reduction: dim")
    if len(d) != len(x._dim) or any(i % o for o, i in zip(d, x._dim, strict=True)):
        raise ValueError(
            f"{g.name}.reduction: dim {d} must have the input's rank with "
            f"each size 1, the input's ({x._dim}) or a divisor of it (sums "
            "over consecutive groups)"
        )
    y = g._out("reduction", name and f"{name}::y", d, x)
    s: dict[str, Any] = {
        "mode": int(m),
        "compute_data_type": int(g._compute(compute, "reduction")),
    }
    if deterministic is not None:
        s["deterministic"] = parse_bool(deterministic, f"{g.name}.reduction", "deterministic")
    g._node(
        "reduction", name, s, [("OPERATION_REDUCTION_XDESC", x), ("OPERATION_REDUCTION_YDESC", y)]
    )
    return y


def _reduction_desc(s: dict[str, Any]) -> BackendDescriptor:
    d = BackendDescriptor(D.REDUCTION_DESCRIPTOR)
    d.set(A.REDUCTION_OPERATOR, T.REDUCTION_OPERATOR_TYPE, ReduceTensorOp(s["mode"]))
    d.set(A.REDUCTION_COMP_TYPE, T.DATA_TYPE, DataType(s["compute_data_type"]))
    if s.get("deterministic") is not None:
        d.set(A.REDUCTION_IS_DETERMINISTIC, T.BOOLEAN, bool(s["deterministic"]))
    return d.finalize()


KINDS = {
    "reduction": NodeKind(
        D.OPERATION_REDUCTION_DESCRIPTOR, (A.OPERATION_REDUCTION_DESC, _reduction_desc)
    )
}


class ReductionOperations(GraphBase):
    """The graph's reduction method (a base of :class:`~pycudnn.graph.Graph`)."""

    def reduction(
        self,
        input: Tensor,
        mode: Any = "add",
        *,
        dim: Sequence[int],
        compute_data_type: Any = None,
        deterministic: bool | None = None,
        name: str | None = None,
    ) -> Tensor:
        """Reduce *input* to the output shape *dim* (1 where a dim is reduced, the input's size
        where it is kept, a divisor to reduce consecutive groups): ``mode`` ``'add'``,
        ``'mul'``, ``'min'``, ``'max'``, ``'amax'``, ``'avg'``,
        ``'norm1'``, ``'norm2'``, ``'mul_no_zeros'``."""
        return reduction(self, input, mode, dim, compute_data_type, deterministic, name)
