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


#: operation name -> its encoding; the roles are the public constructors' argument names
CONV_OPERATIONS: dict[str, ConvOperation] = {
    "forward": ConvOperation(
        D.OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
        (
            ("x", A.OPERATION_CONVOLUTION_FORWARD_X),
            ("w", A.OPERATION_CONVOLUTION_FORWARD_W),
            ("y", A.OPERATION_CONVOLUTION_FORWARD_Y),
        ),
        A.OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
        A.OPERATION_CONVOLUTION_FORWARD_ALPHA,
        A.OPERATION_CONVOLUTION_FORWARD_BETA,
    ),
    "backward_data": ConvOperation(
        D.OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
        (
            ("w", A.OPERATION_CONVOLUTION_BWD_DATA_W),
            ("dy", A.OPERATION_CONVOLUTION_BWD_DATA_DY),
            ("dx", A.OPERATION_CONVOLUTION_BWD_DATA_DX),
        ),
        A.OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
        A.OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
        A.OPERATION_CONVOLUTION_BWD_DATA_BETA,
    ),
    "backward_filter": ConvOperation(
        D.OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
        (
            ("x", A.OPERATION_CONVOLUTION_BWD_FILTER_X),
            ("dy", A.OPERATION_CONVOLUTION_BWD_FILTER_DY),
            ("dw", A.OPERATION_CONVOLUTION_BWD_FILTER_DW),
        ),
        A.OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
        A.OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
        A.OPERATION_CONVOLUTION_BWD_FILTER_BETA,
    ),
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
