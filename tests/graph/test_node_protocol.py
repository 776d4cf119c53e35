"""How the operation families attach to :class:`pycudnn.graph.Graph` (no GPU, no plan).

* One way: each family of :mod:`pycudnn.graph.nodes` has one ``...Operations`` class, a subclass of
  :class:`~pycudnn.graph._tensor.GraphBase` holding the methods users call; ``Graph`` is all of
  them (its own body: tensors, build, execute, JSON). No method is set on ``Graph`` from outside.
* The node protocol: the node modules use a graph only through the members
  :data:`~pycudnn.graph._tensor.NODE_PROTOCOL` names (read from the source: ``g.X``,
  ``self.X``, ``t._graph.X``), each one a member of ``GraphBase``, none of them unused.
* The pointwise methods: one per :data:`~pycudnn.graph.POINTWISE_NAMES` entry, with its mode's
  arity's signature and docstring; ``bias`` is ``add`` and ``scale`` is ``mul``.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from pycudnn.enums import PointwiseMode
from pycudnn.graph import POINTWISE_NAMES, Graph
from pycudnn.graph._tensor import NODE_PROTOCOL, GraphBase
from pycudnn.graph.nodes import pointwise

NODES = Path(pointwise.__file__).resolve().parent


def _graph_members(path: Path) -> set[str]:
    """The attributes a node module reads, calls or writes on a graph (``g.X``, ``self.X``,
    ``t._graph.X``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        if getattr(node.value, "id", None) in ("g", "self") or (
            getattr(node.value, "attr", None) == "_graph"
        ):
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


def test_graph_is_its_families():
    families = [b for b in Graph.__mro__[1:] if b.__name__.endswith("Operations")]
    assert {b.__module__.rsplit(".", 1)[0] for b in families} == {"pycudnn.graph.nodes"}
    assert all(issubclass(b, GraphBase) for b in families)
    assert Graph.__mro__[len(families) + 1] is GraphBase
    # every public method is defined in a class body: Graph's or one family's, once
    owners: dict[str, list[str]] = {}
    for cls in (Graph, *families):
        for name, value in vars(cls).items():
            if not name.startswith("_") and inspect.isfunction(value):
                owners.setdefault(name, []).append(cls.__name__)
                assert value.__qualname__.split(".")[0] == cls.__name__, (name, value.__qualname__)
    assert not [n for n, o in owners.items() if len(o) > 1]


_UNARY = ["self", "input", "compute_data_type", "name", "params"]
_BINARY = ["self", "a", "b", "compute_data_type", "alpha1", "alpha2", "name", "params"]
_TERNARY = ["self", "input0", "input1", "mask", "compute_data_type", "name"]


@pytest.mark.parametrize("name", list(POINTWISE_NAMES))
def test_pointwise_methods_follow_the_modes(name):
    mode = POINTWISE_NAMES[name]
    method = getattr(Graph, name)
    n = pointwise.arity(mode)
    params = inspect.signature(method).parameters
    assert list(params) == {1: _UNARY, 2: _BINARY, 3: _TERNARY}[n]
    kinds = {p.name: p.kind for p in params.values()}
    assert kinds["compute_data_type"] is inspect.Parameter.KEYWORD_ONLY
    assert kinds.get("params", inspect.Parameter.VAR_KEYWORD) is inspect.Parameter.VAR_KEYWORD
    defaults = {p.name: p.default for p in params.values() if p.default is not p.empty}
    want = {"compute_data_type": None, "name": None}
    if n == 2:
        want |= {"alpha1": 1.0, "alpha2": 1.0}
    assert defaults == want
    backward = 200 <= mode < 300
    kind = "backward (loss, input) -> dx" if backward else f"{n}-input"
    assert method.__doc__ == f"Pointwise ``{mode.name}`` ({kind}); see :meth:`pointwise`."


def test_pointwise_methods_record_their_mode():
    g = Graph(io_data_type="float32")
    x, y, m = g.tensor((2, 3)), g.tensor((2, 3)), g.tensor((2, 3), data_type="bool")
    g.relu(x, relu_upper_clip=6.0, name="r")
    g.sub(x, y, alpha2=-1.0)
    g.gen_index(x, axis=1)
    g.binary_select(x, y, m)
    g.bias(x, y)
    g.scale(x, y)
    modes = [PointwiseMode(n[2]["mode"]) for n in g._nodes]
    assert modes == [
        PointwiseMode.RELU_FWD,
        PointwiseMode.SUB,
        PointwiseMode.GEN_INDEX,
        PointwiseMode.BINARY_SELECT,
        PointwiseMode.ADD,
        PointwiseMode.MUL,
    ]
    assert g._nodes[0][1] == "r" and g._nodes[0][2]["relu_upper_clip"] == 6.0
    assert g._nodes[1][2]["alpha2"] == -1.0
    assert Graph.bias is Graph.add and Graph.scale is Graph.mul
