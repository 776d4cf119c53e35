"""The builder's operations by family, in cudnn-frontend's ``node/`` shape: each module holds
its family's checks, output-shape inference and descriptor encoding.

- :mod:`.conv` -- ``conv_fprop``, ``conv_dgrad``, ``conv_wgrad``
- :mod:`.pointwise` -- every pointwise mode and the methods named after them
- :mod:`.matmul`, :mod:`.reduction`, :mod:`.rng_reshape`
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
