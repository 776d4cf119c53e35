"""RNG and reshape nodes: a Bernoulli mask from Philox seed/offset tensors (attention's
dropout), and a view of a tensor with other dims and strides -- checks and encoding."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ...descriptors import BackendDescriptor
from ...enums import BackendAttributeName as A
from ...enums import BackendAttributeType as T
from ...enums import BackendDescriptorType as D
from ...enums import RngDistribution
from .._tensor import GraphBase, Tensor, as_dims, as_dtype, finite
from ._base import NodeKind, Scalar

__all__ = ["KINDS", "RngReshapeOperations", "reshape", "rng"]


def rng(
    g: GraphBase,
    dim: tuple[int, ...],
    like: Tensor,
    probability: float,
    seed_offset: tuple[Tensor, Tensor],
    name: str,
) -> Tensor:
    """A Bernoulli(*probability*) mask of shape *dim* (in *like*'s memory order) from the
    Philox ``(seed, offset)`` tensors."""
    seed, offset = seed_offset
    p = finite(probability, f"{g.name}.rng: probability")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{g.name}.rng: probability must be in [0, 1], got {probability!r}")
    y = g._out("rng", f"{name}::mask", dim, like)
    roles = [
        ("OPERATION_RNG_SEED", seed),
        ("OPERATION_RNG_OFFSET_DESC", offset),
        ("OPERATION_RNG_YDESC", y),
    ]
    g._node("rng", name, {"probability": p}, roles)
    return y


def reshape(
    g: GraphBase,
    input: Any,
    dim: Sequence[int],
    stride: Sequence[int],
    data_type: Any = None,
    name: str | None = None,
) -> Tensor:
    """A view of *input* with other dims/strides (cuDNN's reshape operation, view only)."""
    x = g._check("reshape", "input", input)
    d = as_dims(dim, f"{g.name}.reshape: dim")
    st = as_dims(stride, f"{g.name}.reshape: stride")
    if len(st) != len(d):
        raise ValueError(
            f"{g.name}.reshape: stride {st} has {len(st)} values, dim {d} has {len(d)} (one "
            "stride per dim)"
        )
    if math.prod(d) != math.prod(x._dim):
        raise ValueError(
            f"{g.name}.reshape: dims {d} do not hold the input's "
            f"{math.prod(x._dim)} elements ({x._dim})"
        )
    layout = (d, st, as_dtype(data_type, "data_type", True))
    y = g._new(name and f"{name}::y", layout, True, producer="reshape")
    g._node("reshape", name, {}, [("OPERATION_RESHAPE_XDESC", x), ("OPERATION_RESHAPE_YDESC", y)])
    return y


def _rng_desc(s: dict[str, Any]) -> BackendDescriptor:
    d = BackendDescriptor(D.RNG_DESCRIPTOR)
    d.set(A.RNG_DISTRIBUTION, T.RNG_DISTRIBUTION, RngDistribution.BERNOULLI)
    d.set(A.RNG_BERNOULLI_DIST_PROBABILITY, T.DOUBLE, float(s["probability"]))
    return d.finalize()


KINDS = {
    # a constant seed (settings "seed") instead of a seed tensor
    "rng": NodeKind(
        D.OPERATION_RNG_DESCRIPTOR,
        (A.OPERATION_RNG_DESC, _rng_desc),
        (Scalar(A.OPERATION_RNG_SEED, "seed", T.INT64, int),),
    ),
    "reshape": NodeKind(D.OPERATION_RESHAPE_DESCRIPTOR, None),
}


class RngReshapeOperations(GraphBase):
    """The graph's reshape method (a base of :class:`~pycudnn.graph.Graph`; the RNG node is
    the attention's dropout's, :mod:`.sdpa`)."""

    def reshape(
        self,
        input: Tensor,
        dim: Sequence[int],
        stride: Sequence[int],
        *,
        data_type: Any = None,
        name: str | None = None,
    ) -> Tensor:
        """A view of *input* with other dims/strides (cuDNN's reshape operation, view only)."""
        return reshape(self, input, dim, stride, data_type, name)
