"""``pycudnn.graph``: cuDNN's graph (backend) API made scriptable from Python, and the plan
engine under every graph the library runs.

:class:`Graph` and :class:`Tensor` are the builder: declare tensors, add operations
(convolutions, matmul, pointwise, reduction, norms, scaled dot-product attention),
:meth:`Graph.build` a plan (heuristics or autotuned, engine filters), and :meth:`Graph.execute`
it on device arrays; :meth:`Graph.serialize` / :meth:`Graph.deserialize` keep a chosen plan
across processes, and :func:`load_plan` reads one. :class:`GraphKey` is the frozen graph plans
are cached under. :mod:`.nodes` documents the operations by family (their checks, output shapes
and descriptor encodings).

See ``docs/graph.md``.

Internals
---------
- :class:`Graph` / :class:`Tensor` -- the public builder (:mod:`._builder`).
- :mod:`._tensor` -- :class:`Tensor` and ``GraphBase``, the record of tensors and nodes every
  family adds to through its node protocol (``NODE_PROTOCOL``).
- :mod:`.nodes` -- the operations by family (convolutions, pointwise, matmul, reduction,
  norms, RNG and reshape, and the composite attention graphs cuDNN's fused flash-attention
  engines run), each with its checks, output shapes, descriptor encoding and its
  ``...Operations`` class: the methods :class:`Graph` inherits.
- :mod:`._key` -- the frozen graph (:class:`GraphKey`): what plans are cached under.
- :mod:`._plans` -- the engine, one entry ``plan(key, handle)``: heuristics search, numerics
  filters, timing, the per-thread plan LRU, variant packs. The high level's convolutions (fused
  or not), matmul, norms and attention are graph keys planned here: one mechanism.
"""

from __future__ import annotations

from ._builder import POINTWISE_NAMES, Graph, Tensor, load_plan
from ._key import GraphKey

__all__ = ["POINTWISE_NAMES", "Graph", "GraphKey", "Tensor", "load_plan"]
