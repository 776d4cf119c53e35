"""How the operation families use a :class:`pycudnn.graph.Graph` (no GPU, no plan).

* The node protocol: the node modules use a graph only through the members
  :data:`~pycudnn.graph._tensor.NODE_PROTOCOL` names (read from the source: ``g.X`` and
  ``self.X``), each one a member of ``GraphBase``, none of them unused.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pycudnn.graph._tensor import NODE_PROTOCOL, GraphBase
from pycudnn.graph.nodes import pointwise

NODES = Path(pointwise.__file__).resolve().parent


def _graph_members(path: Path) -> set[str]:
    """The attributes a node module reads, calls or writes on a graph (``g.X``, ``self.X``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and getattr(node.value, "id", None) in ("g", "self"):
            out.add(node.attr)
    return out


@pytest.mark.parametrize("path", sorted(NODES.glob("*.py")), ids=lambda p: p.name)
def test_node_modules_use_only_the_protocol(path):
    private = {m for m in _graph_members(path) if m.startswith("_")}
    assert private <= NODE_PROTOCOL, f"{path.name} uses {sorted(private - NODE_PROTOCOL)}"


def test_the_protocol_is_graph_base_and_in_use():
    g = GraphBase(None, "float32", "float32", "g")
    assert all(hasattr(g, m) for m in NODE_PROTOCOL), sorted(
        m for m in NODE_PROTOCOL if not hasattr(g, m)
    )
    used = set().union(*(_graph_members(p) for p in NODES.glob("*.py")))
    assert used >= NODE_PROTOCOL, f"stale: {sorted(NODE_PROTOCOL - used)}"
