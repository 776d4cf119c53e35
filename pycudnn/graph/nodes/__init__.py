"""The builder's operations by family, in cudnn-frontend's ``node/`` shape: each module holds
its family's checks, output-shape inference and descriptor encoding, and its ``...Operations``
class: the graph methods users call, which :class:`pycudnn.graph.Graph` subclasses (one way for
every family; a family uses the graph through ``GraphBase``'s node protocol alone).

- :mod:`.conv` -- ``conv_fprop``, ``conv_dgrad``, ``conv_wgrad`` (:class:`.conv.ConvOperations`)
- :mod:`.pointwise` -- every pointwise mode; :mod:`.pointwise_methods` -- ``pointwise`` and the
  methods named after the modes (:class:`.pointwise_methods.PointwiseOperations`)
- :mod:`.matmul`, :mod:`.reduction`, :mod:`.rng_reshape` (``reshape``)
- :mod:`.norm` -- layer, RMS, instance and batch norm, forward and backward
- :mod:`.sdpa` -- scaled dot-product attention as composite graphs of the nodes above
- :mod:`.paged` -- the paged cache load (a paged KV cache in front of the attention)
- :mod:`.bn_fusion` -- ``genstats``, ``bn_finalize``, ``dbn_weight``: the conv-BN training
  fusion operations

:data:`KINDS` is the registry the frozen graph (:mod:`pycudnn.graph._key`) encodes nodes from:
each family contributes the kinds it records.
"""

from __future__ import annotations

from . import bn_fusion, conv, matmul, norm, paged, pointwise, reduction, rng_reshape, sdpa
from ._base import NodeKind

__all__ = [
    "KINDS",
    "bn_fusion",
    "conv",
    "matmul",
    "norm",
    "paged",
    "pointwise",
    "reduction",
    "rng_reshape",
    "sdpa",
]

#: node kind -> its encoding, from every family
KINDS: dict[str, NodeKind] = {
    **conv.KINDS,
    **matmul.KINDS,
    **pointwise.KINDS,
    **reduction.KINDS,
    **rng_reshape.KINDS,
    **norm.KINDS,
    **bn_fusion.KINDS,
    **paged.KINDS,
}
