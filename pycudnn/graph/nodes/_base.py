"""What every node family shares: :class:`NodeKind`, the row of the node registry that says how
a recorded node becomes an operation descriptor, and the loaded cuDNN's version (cached)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ... import errors
from ...descriptors import BackendDescriptor
from ...enums import BackendAttributeName, BackendDescriptorType

__all__ = ["SCALING", "NodeKind", "Scalar", "channel_strides", "cudnn_version"]

#: the type of a scalar attribute that carries a scaling factor (float, or double for double
#: compute: ``pycudnn._types.scaling_type``)
SCALING = "scaling"


class Scalar(NamedTuple):
    """A scalar attribute of an operation written from a node's settings."""

    attribute: BackendAttributeName
    key: str  #: the settings key; the attribute is left unset when the settings lack it
    type: Any  #: :data:`SCALING` or a ``BackendAttributeType``
    convert: Callable[[Any], Any] | None = None  #: settings value -> attribute value


class NodeKind(NamedTuple):
    """How one kind of node is encoded: the operation descriptor's type, the sub-descriptor it
    holds (its attribute and its maker from the node's settings; None: none), and the scalar
    attributes written from the settings."""

    descriptor: BackendDescriptorType
    sub: tuple[BackendAttributeName, Callable[[dict[str, Any]], BackendDescriptor]] | None
    scalars: tuple[Scalar, ...] = ()


def channel_strides(t: Any) -> None:
    """Describe the per-channel graph tensor *t* ``(1, C, 1, ...)`` with cudnn-frontend's
    strides ``(C, 1, C, ...)``: the same memory (only size-1 dims' strides change).
    ``Graph.tensor_like`` gives a ``(1, C, 1, 1)`` tensor every stride 1 (its size-1 dims
    address nothing), which cuDNN's BN finalize engine read 1 channel of
    (``docs/graph.md``)."""
    c = t._dim[1]
    t._stride = (c, 1, *(c,) * (len(t._dim) - 2))


_cached_version: int | None = None


def cudnn_version() -> int:
    """The loaded cuDNN's version (cached)."""
    global _cached_version
    if _cached_version is None:
        _cached_version = int(errors.checked("cudnnGetVersion", warn=False)())
    return _cached_version
