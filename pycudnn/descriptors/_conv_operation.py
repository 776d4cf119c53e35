"""The one encoding of cuDNN's three convolution operations as backend attributes.

A convolution operation descriptor (forward, backward-data, backward-filter) holds three tensor
descriptors in fixed roles, a ``CONVOLUTION_DESCRIPTOR`` and the scaling factors ``alpha`` and
``beta``. :data:`CONV_OPERATIONS` names, for each operation, its descriptor type and the
attribute of each of those. Everything that makes a convolution operation reads it: the public
``BackendDescriptor.operation_convolution_*`` constructors, the graph builder's convolution
nodes (``pycudnn.graph.nodes.conv``) and the high level's convolution problems.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..enums import BackendAttributeName as A
from ..enums import BackendAttributeType as T
from ..enums import BackendDescriptorType as D

__all__ = ["CONV_OPERATIONS", "ConvOperation", "conv_operation_attributes"]


class ConvOperation(NamedTuple):
    """The backend encoding of one convolution operation."""

    descriptor: D  #: the operation descriptor's type
    tensors: tuple[tuple[str, A], ...]  #: (role, attribute) of its three tensors, inputs first
    conv: A  #: the attribute holding the ``CONVOLUTION_DESCRIPTOR``
    alpha: A
    beta: A


def _encoding(descriptor: str, prefix: str, roles: tuple[str, str, str]) -> ConvOperation:
    """The encoding of an operation whose descriptor type is
    ``OPERATION_CONVOLUTION_<descriptor>_DESCRIPTOR`` and whose attributes are
    ``OPERATION_CONVOLUTION_<prefix>_<ROLE>`` for each tensor role, then ``..._CONV_DESC``,
    ``..._ALPHA`` and ``..._BETA``."""

    def attr(name: str) -> A:
        return A[f"OPERATION_CONVOLUTION_{prefix}_{name}"]

    tensors = tuple((role, attr(role.upper())) for role in roles)
    return ConvOperation(
        D[f"OPERATION_CONVOLUTION_{descriptor}_DESCRIPTOR"],
        tensors,
        attr("CONV_DESC"),
        attr("ALPHA"),
        attr("BETA"),
    )


#: operation name -> its encoding; the roles are the public constructors' argument names
CONV_OPERATIONS: dict[str, ConvOperation] = {
    "forward": _encoding("FORWARD", "FORWARD", ("x", "w", "y")),
    "backward_data": _encoding("BACKWARD_DATA", "BWD_DATA", ("w", "dy", "dx")),
    "backward_filter": _encoding("BACKWARD_FILTER", "BWD_FILTER", ("x", "dy", "dw")),
}


def conv_operation_attributes(
    operation: str,
    tensors: dict[str, Any],
    conv: Any,
    scaling: tuple[T, float, float],
) -> list[tuple[A, T, Any]]:
    """The ``(attribute, type, value)`` list of convolution *operation*: *tensors* maps each
    role (``"x"``, ``"w"``, ``"dy"``...) to its tensor descriptor, *conv* is the convolution
    descriptor, *scaling* is ``(attribute type, alpha, beta)``."""
    enc = CONV_OPERATIONS[operation]
    scaling_type, alpha, beta = scaling
    attrs: list[tuple[A, T, Any]] = [
        (attr, T.BACKEND_DESCRIPTOR, tensors[role]) for role, attr in enc.tensors
    ]
    attrs.append((enc.conv, T.BACKEND_DESCRIPTOR, conv))
    attrs.append((enc.alpha, scaling_type, alpha))
    attrs.append((enc.beta, scaling_type, beta))
    return attrs
