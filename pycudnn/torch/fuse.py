"""Fusion across modules, ``convert(model, fuse=True)`` (imports torch): a ``torch.fx`` pass that
finds chains of converted modules and runs each as one fused cuDNN call (:mod:`.fused`).

The patterns (:func:`match`, a pure function over a traced graph):

* ``conv_bn`` / ``conv_bn_act``: ``Conv2d``/``Conv3d`` -> ``BatchNorm2d``/``3d`` (the
  convolution's output used by nothing else) -> optional ReLU, ReLU6, Hardtanh(0, m), SiLU,
  GELU, Sigmoid, Tanh or ELU, as a module or a function (``F.relu``, ``torch.relu``,
  ``Tensor.relu``, their in-place forms);
* ``conv_bn_add_act``: the residual ``act(bn(conv(x)) + identity)`` of torchvision's blocks
  (``operator.add``/``iadd``, ``torch.add``, ``Tensor.add``/``add_``), the identity becoming the
  convolution's ``z`` operand;
* ``linear_act``: ``Linear`` -> ReLU, GELU or SiLU.

Each chain becomes one :class:`~.fused.FusedConv` / :class:`~.fused.FusedLinear` call in the
traced graph; the graph's code (a ``torch.fx.GraphModule`` that holds the fused modules and
refers to the original ones) becomes the traced module's instance ``forward``. The module keeps
its class, its submodules at their paths, its parameters, buffers and hooks: ``state_dict`` is
unchanged and ``convert(model, back=True)`` (which deletes the instance ``forward``) gives the
same object back. A module that does not trace is left unfused, with a ``UserWarning``, and its
children are tried instead.
"""

from __future__ import annotations

import operator
import warnings
import weakref
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import torch
from torch import fx, nn
from torch.nn import functional as F

from . import activation, batchnorm, conv, linear
from ._module import Converted
from .fused import Act, Add, FusedConv, FusedLinear, Step
from .pool import MaxPool2d
from .region import FusedRegion
from .region_pool import FusedPool, pools_after

__all__ = [
    "FusedGraph",
    "Match",
    "fuse_model",
    "fusions",
    "match",
    "programs",
    "regions",
    "unfuse_model",
]

#: why a fused conv chain may still run unfused (the match record says it)
CONV_NOTE = (
    "fused in eval mode without a gradient (batch norm folded into the convolution, the rest as "
    "its epilogue); in training one autograd node (custom ops under torch.compile: one per "
    "region and direction), batch norm + "
    "residual + ReLU as cuDNN's one kernel for channels-last float16/bfloat16 (separate calls "
    "otherwise; SiLU/GELU/ELU and hooks run the modules unfused); eval with a gradient runs the "
    "modules unfused"
)
LINEAR_NOTE = (
    "fused without a gradient; with one, Linear then the activation (the backward needs the "
    "pre-activation)"
)

_CONVS = {conv.Conv2d: batchnorm.BatchNorm2d, conv.Conv3d: batchnorm.BatchNorm3d}
_TORCH_CONVS = {nn.Conv1d, nn.Conv2d, nn.Conv3d, conv.Conv1d}
_BNS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)

# function or tensor method -> the epilogue's activation name (the other arguments decide coef)
_FUNCS: dict[Any, str] = {
    F.relu: "relu",
    torch.relu: "relu",
    torch.relu_: "relu",
    F.relu_: "relu",
    F.relu6: "relu6",
    F.silu: "silu",
    F.gelu: "gelu",
    F.elu: "elu",
    torch.sigmoid: "sigmoid",
    F.sigmoid: "sigmoid",
    torch.tanh: "tanh",
    F.tanh: "tanh",
}
_METHODS = {"relu": "relu", "relu_": "relu", "sigmoid": "sigmoid", "sigmoid_": "sigmoid"}
_METHODS |= {"tanh": "tanh", "tanh_": "tanh"}
_ADDS = (operator.add, operator.iadd, torch.add)
_LINEAR_ACTS = ("relu", "gelu", "gelu_tanh", "silu")


@dataclass(frozen=True)
class Match:
    """One chain the matcher found: its *pattern*, the names of its graph nodes in order,
    whether it is *fused* and why not (or when it runs unfused) in *reason*, and per node the
    module it calls in *modules* (its qualified name in the traced module; ``""`` for a
    function, a method or the residual addition)."""

    pattern: str
    nodes: tuple[str, ...]
    fused: bool
    reason: str = ""
    modules: tuple[str, ...] = ()


class _Plan(NamedTuple):
    """What the rewrite needs of a fused match (graph nodes and modules: internal)."""

    nodes: tuple[fx.Node, ...]
    inputs: tuple[fx.Node, ...]
    module: nn.Module


def _module_act(m: nn.Module) -> Act | str | None:
    """The epilogue of activation module *m*, a reason it is none, or None (no activation)."""
    t = type(m)
    if t is activation.ReLU:
        return Act("relu")
    if t is activation.ReLU6:
        return Act("clipped_relu", 6.0)
    if t is activation.Hardtanh:
        return Act("clipped_relu", float(m.max_val))
    if t is activation.SiLU:
        return Act("silu")
    if t is activation.Sigmoid:
        return Act("sigmoid")
    if t is activation.Tanh:
        return Act("tanh")
    if t is activation.ELU:
        return Act("elu", float(m.alpha))
    if t is nn.GELU:  # no twin to convert to: torch's own module
        return Act("gelu_tanh" if m.approximate == "tanh" else "gelu")
    if t in (nn.ReLU, nn.ReLU6, nn.Hardtanh, nn.SiLU, nn.Sigmoid, nn.Tanh, nn.ELU):
        return f"the activation {t.__name__} was left a torch module (excluded or unsupported)"
    return None


def _call_act(name: str, args: tuple, kwargs: dict) -> Act | str:
    """The epilogue of a traced activation call with the *args* after its input."""
    params = {"relu6": ("inplace",), "silu": ("inplace",), "gelu": ("approximate",)}
    params |= {"elu": ("alpha", "inplace"), "relu": ("inplace",)}
    names = params.get(name, ())
    if len(args) > len(names) or set(kwargs) - set(names):
        return f"{name} is called with arguments the epilogue does not take"
    given = dict(zip(names, args, strict=False)) | kwargs
    if any(isinstance(v, fx.Node) for v in given.values()):
        return f"{name}'s arguments are computed in the graph"
    if name == "relu6":
        return Act("clipped_relu", 6.0)
    if name == "gelu":
        approx = given.get("approximate", "none")
        return Act("gelu_tanh" if approx == "tanh" else "gelu")
    if name == "elu":
        return Act("elu", float(given.get("alpha", 1.0)))
    return Act(name)


def _act_of(node: fx.Node, src: fx.Node, modules: dict) -> tuple[Act, Step] | str | None:
    """*node* as an activation of *src* (its only tensor input): the epilogue and the call to
    replay, a reason it cannot be one, or None when *node* is no activation."""
    if not node.args or node.args[0] is not src:
        return None
    rest, kw = tuple(node.args[1:]), dict(node.kwargs)
    if node.op == "call_module":
        m = modules.get(node.target)
        act = None if m is None else _module_act(m)
        if act is None or isinstance(act, str):
            return act
        if rest or kw:
            return f"the activation module {node.target} is called with more than its input"
        return act, Step("call_module", m)
    if node.op == "call_function" and node.target in _FUNCS:
        act = _call_act(_FUNCS[node.target], rest, kw)
        return act if isinstance(act, str) else (act, Step("call_function", node.target, rest, kw))
    if node.op == "call_method" and node.target in _METHODS:
        if rest or kw:
            return f"Tensor.{node.target} is called with arguments"
        return Act(_METHODS[node.target]), Step("call_method", node.target)
    return None


def _add_of(node: fx.Node, src: fx.Node) -> tuple[Add, fx.Node] | str | None:
    """*node* as ``src + identity``: the addition to replay and the identity, a reason it cannot
    be the residual, or None (no addition)."""
    if node.op == "call_function" and node.target in _ADDS:
        kind = "call_function"
    elif node.op == "call_method" and node.target in ("add", "add_"):
        kind = "call_method"
    else:
        return None
    if node.kwargs or len(node.args) != 2:
        return "the addition scales its operand (alpha=) or takes other arguments"
    a, b = node.args
    bn_first = a is src
    other = b if bn_first else a
    if not isinstance(other, fx.Node) or other is src:
        return "the residual is no tensor of the graph"
    if not bn_first and (kind == "call_method" or node.target is operator.iadd):
        return "the in-place addition writes into the residual, not the batch norm's output"
    return Add(kind, node.target, bn_first), other


def _only_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _conv_chain(
    node: fx.Node, m: nn.Module, modules: dict, taken: set
) -> tuple[Match, _Plan | None] | None:
    users = list(node.users)
    bn_users = [
        u for u in users if u.op == "call_module" and isinstance(modules.get(u.target), _BNS)
    ]
    if not bn_users:
        return None
    bn_node = bn_users[0]
    names = (node.name, bn_node.name)
    bn = modules[bn_node.target]

    def no(reason: str) -> tuple[Match, None]:
        return Match("conv_bn", names, False, reason), None

    if type(m) in _TORCH_CONVS or type(m) not in _CONVS:
        return no(f"{type(m).__name__} is not a converted Conv2d/Conv3d")
    if type(bn) is not _CONVS[type(m)]:
        return no(f"{type(bn).__name__} is not the converted batch norm of {type(m).__name__}")
    if len(users) != 1:
        return no(
            f"the convolution's output has {len(users)} users (the batch norm must be its only one)"
        )
    if len(node.args) != 1 or node.kwargs or len(bn_node.args) != 1 or bn_node.kwargs:
        return no("the convolution or batch norm is called with more than its input")
    nxt, pattern, chain = _only_user(bn_node), "conv_bn", [node, bn_node]
    act = add = identity = step = None
    why = ""
    if nxt is not None and nxt not in taken:  # a residual add of two branches is taken once
        res = _add_of(nxt, bn_node)
        after = _only_user(nxt) if isinstance(res, tuple) else None
        found = None if after is None else _act_of(after, nxt, modules)
        if isinstance(found, tuple):
            add, identity = res
            act, step = found
            pattern, chain = "conv_bn_add_act", [*chain, nxt, after]
        else:
            why = res if isinstance(res, str) else (found or "")
            found = _act_of(nxt, bn_node, modules)
            if isinstance(found, tuple):
                act, step = found
                pattern, chain = "conv_bn_act", [*chain, nxt]
            elif isinstance(found, str):
                why = found
    fm = FusedConv(m, bn, act, step, add)
    reason = CONV_NOTE + (f"; not fused after the batch norm: {why}" if why else "")
    inputs = (node.args[0],) if identity is None else (node.args[0], identity)
    rec = Match(pattern, tuple(n.name for n in chain), True, reason)
    return rec, _Plan(tuple(chain), inputs, fm)


def _linear_chain(node: fx.Node, m: nn.Module, modules: dict) -> tuple[Match, _Plan | None] | None:
    users = list(node.users)
    acts = [(u, _act_of(u, node, modules)) for u in users]
    acts = [(u, a) for u, a in acts if a is not None]
    if not acts:
        return None
    u, found = acts[0]
    names = (node.name, u.name)
    if len(users) != 1:
        return Match(
            "linear_act", names, False, f"the Linear's output has {len(users)} users"
        ), None
    if isinstance(found, str):
        return Match("linear_act", names, False, found), None
    act, step = found
    if act.name not in _LINEAR_ACTS:
        why = f"the {act.name} epilogue of a Linear is not fused (relu, gelu, silu are)"
        return Match("linear_act", names, False, why), None
    if len(node.args) != 1 or node.kwargs:
        return Match(
            "linear_act", names, False, "the Linear is called with more than its input"
        ), None
    rec = Match("linear_act", names, True, LINEAR_NOTE)
    return rec, _Plan((node, u), (node.args[0],), FusedLinear(m, act, step))


def _find(graph: fx.Graph, modules: dict) -> list[tuple[Match, _Plan | None]]:
    found: list[tuple[Match, _Plan | None]] = []
    taken: set[fx.Node] = set()
    for node in graph.nodes:
        if node.op != "call_module":
            continue
        m = modules.get(node.target)
        if isinstance(m, (nn.Conv2d, nn.Conv3d, nn.Conv1d)):
            r = _conv_chain(node, m, modules, taken)
        elif type(m) is linear.Linear:
            r = _linear_chain(node, m, modules)
        else:
            r = None
        if r is not None:
            found.append(r)
            if r[1] is not None:
                taken.update(r[1].nodes)
    targets = {n.name: str(n.target) for n in graph.nodes if n.op == "call_module"}
    return [
        (replace(rec, modules=tuple(targets.get(n, "") for n in rec.nodes)), plan)
        for rec, plan in found
    ]


def match(graph: fx.Graph, modules: dict[str, nn.Module]) -> tuple[Match, ...]:
    """The fusable (and the near-miss) chains of a traced *graph* whose ``call_module`` targets
    are the qualified names of *modules* (``dict(root.named_modules())``).

    Parameters
    ----------
    graph : torch.fx.Graph
        A traced graph (converted modules as leaves).
    modules : dict of str to torch.nn.Module
        The modules the graph's ``call_module`` nodes name.

    Returns
    -------
    tuple of Match
        In graph order: each chain's pattern, node names, whether it fuses and why not.
    """
    return tuple(rec for rec, _ in _find(graph, modules))


# the chains found in traced modules where none fused (the others keep theirs in FusedGraph)
_UNFUSED: weakref.WeakKeyDictionary[nn.Module, tuple[Match, ...]] = weakref.WeakKeyDictionary()


class FusedGraph(fx.GraphModule):
    """The rewritten graph of a traced module: its ``forward`` is installed as that module's
    instance ``forward``; ``matches`` holds the :class:`Match` records."""

    matches: tuple[Match, ...] = ()


class _Tracer(fx.Tracer):
    """Converted modules (and *leaves*) are leaves; the rest as torch's tracer decides."""

    def __init__(self, leaves: tuple[nn.Module, ...] = ()) -> None:
        super().__init__()
        self.leaves = leaves

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if isinstance(m, Converted) or any(m is leaf for leaf in self.leaves):
            return True
        return super().is_leaf_module(m, module_qualified_name)


def _attr(root: nn.Module, target: str) -> Any:
    obj: Any = root
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _fuse_root(root: nn.Module, leaves: tuple[nn.Module, ...]) -> None:
    """Trace *root* (raises what the tracer raises), rewrite its chains, install the result."""
    graph = _Tracer(leaves).trace(root)
    modules = dict(root.named_modules())
    found = _find(graph, modules)
    plans = [(rec, plan) for rec, plan in found if plan is not None]
    if not plans:
        if found:  # near misses only: fusions() still lists them
            _UNFUSED[root] = tuple(rec for rec, _ in found)
        return
    fused: dict[str, nn.Module] = {}
    now: dict[fx.Node, fx.Node] = {}  # a chain's last node -> the fused node replacing it
    for rec, plan in plans:
        name = f"fused_{rec.nodes[0]}"
        fused[name] = plan.module
        last = plan.nodes[-1]
        with graph.inserting_before(last):
            new = graph.call_module(name, tuple(now.get(n, n) for n in plan.inputs))
        last.replace_all_uses_with(new)
        now[last] = new
        for n in reversed(plan.nodes):
            graph.erase_node(n)
    _group(graph, fused)
    _pool_stems(graph, fused, root)
    graph.lint()
    attrs: dict[str, Any] = {}
    for n in graph.nodes:
        if n.op in ("call_module", "get_attr") and n.target not in fused:
            attrs[n.target] = _attr(root, n.target)
    gm = FusedGraph({**attrs, **fused}, graph, class_name=type(root).__name__)
    gm.matches = tuple(rec for rec, _ in found)
    root.forward = gm.forward  # an instance attribute: the class's forward stays


def _group(graph: fx.Graph, fused: dict[str, nn.Module]) -> None:
    """Replace each connected group of fused convolution chains with one :class:`FusedRegion`
    node (launch programs) placed at the group's first chain. A chain joins (and so merges)
    the groups that produced its operands when every operand the merged group takes from
    outside is defined before its first chain (else it joins the one group for which that
    holds, or starts its own)."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    where: dict[fx.Node, list[fx.Node]] = {}

    def closed(members: list[fx.Node]) -> bool:
        first = min(order[m] for m in members)
        inside = set(members)
        return all(
            a in inside or order[a] < first
            for m in members
            for a in m.args
            if isinstance(a, fx.Node)
        )

    for n in list(graph.nodes):
        if n.op != "call_module" or not isinstance(fused.get(n.target), FusedConv):
            continue
        ins = [a for a in n.args if isinstance(a, fx.Node)]
        cands: list[list[fx.Node]] = []
        for a in reversed(ins):  # the residual's group first: the block's end joins its start
            g = where.get(a)
            if g is not None and all(g is not c for c in cands):
                cands.append(g)
        merged = sorted({m for c in cands for m in c} | {n}, key=order.__getitem__)
        if len(cands) > 1 and closed(merged):
            group = merged
        else:
            group = next((sorted([*c, n], key=order.__getitem__) for c in cands
                          if closed([*c, n])), [n])  # fmt: skip
        for m in group:
            where[m] = group
    groups: list[list[fx.Node]] = []
    for g in where.values():
        if all(g is not h for h in groups):
            groups.append(g)
    for group in groups:
        members = set(group)
        inputs: list[fx.Node] = []
        wiring = []
        for n in group:
            refs = []
            for a in n.args:
                if a in members:
                    refs.append(group.index(a))
                else:
                    if a not in inputs:
                        inputs.append(a)
                    refs.append(-1 - inputs.index(a))
            wiring.append((refs[0], refs[1] if len(refs) > 1 else None))
        outs = [i for i, n in enumerate(group) if any(u not in members for u in n.users)]
        name = f"region_{group[0].target}"
        fused[name] = FusedRegion([fused[n.target] for n in group], wiring, outs)
        with graph.inserting_before(group[0]):
            node = graph.call_module(name, tuple(inputs))
            items = [graph.call_function(operator.getitem, (node, k)) for k in range(len(outs))]
        for k, i in enumerate(outs):
            group[i].replace_all_uses_with(items[k])
        for n in reversed(group):
            graph.erase_node(n)
            del fused[n.target]


def _pool_stems(graph: fx.Graph, fused: dict[str, nn.Module], root: nn.Module) -> None:
    """Replace each one-chain region whose output only a converted ``MaxPool2d`` reads (a
    ResNet's stem) and that pooling with one :class:`FusedPool` node."""
    for node in list(graph.nodes):
        region = fused.get(node.target) if node.op == "call_module" else None
        if not isinstance(region, FusedRegion) or len(node.users) != 1:
            continue
        (item,) = node.users
        if item.target is not operator.getitem or item.args[1] != 0 or len(item.users) != 1:
            continue
        (p,) = item.users
        if p.op != "call_module" or p.args != (item,) or p.kwargs:
            continue
        pool = _attr(root, p.target)
        if not (isinstance(pool, MaxPool2d) and pools_after(region, pool)):
            continue
        name = f"pooled_{node.target}"
        fused[name] = FusedPool(region, pool)
        with graph.inserting_before(node):
            new = graph.call_module(name, node.args)
        p.replace_all_uses_with(new)
        for n in (p, item, node):
            graph.erase_node(n)
        del fused[node.target]


def _plain_leaf(m: nn.Module) -> bool:
    """Nothing to trace: a converted or torch.nn leaf, or a container with no forward."""
    if type(m).forward is nn.Module.forward:
        return True
    return isinstance(m, Converted) or _Tracer().is_leaf_module(m, "")


def _fuse_tree(m: nn.Module, path: str) -> None:
    if _plain_leaf(m):
        for name, child in m.named_children():
            _fuse_tree(child, f"{path}.{name}" if path else name)
        return
    try:
        _fuse_root(m, ())
        return
    except Exception:
        pass
    children = tuple(m.children())
    for name, child in m.named_children():
        _fuse_tree(child, f"{path}.{name}" if path else name)
    try:  # the children as leaves: the error may have been theirs
        _fuse_root(m, children)
    except Exception as exc:
        where = path or "the model"
        warnings.warn(
            f"pycudnn.torch.convert(fuse=True): {where} ({type(m).__name__}) does not trace with "
            f"torch.fx ({type(exc).__name__}: {exc}); it runs its converted modules unfused and "
            "its traceable children are fused",
            UserWarning,
            stacklevel=4,
        )


def unfuse_model(model: nn.Module) -> nn.Module:
    """Remove the fused ``forward`` of every module of *model* (``convert(..., back=True)``)."""
    for m in model.modules():
        _UNFUSED.pop(m, None)
        fwd = m.__dict__.get("forward")
        if isinstance(getattr(fwd, "__self__", None), FusedGraph):
            del m.__dict__["forward"]
    return model


def fuse_model(model: nn.Module) -> nn.Module:
    """Fuse the chains of converted modules of *model* in place (:func:`match`'s patterns)."""
    unfuse_model(model)
    _fuse_tree(model, "")
    return model


def _fused_graphs(model: nn.Module) -> list[tuple[str, FusedGraph]]:
    """``(path, FusedGraph)`` of every traced module of *model* that runs fused code."""
    out = []
    for path, m in model.named_modules():
        gm = getattr(m.__dict__.get("forward"), "__self__", None)
        if isinstance(gm, FusedGraph):
            out.append((path, gm))
    return out


def programs(model: nn.Module) -> list[tuple[str, Any, str]]:
    """What each fused region of *model* runs, per input signature it has seen.

    A region is a group of connected fused convolution chains (a ResNet's blocks) that
    ``convert(model, fuse=True)`` runs as one module; from its second run with a signature on,
    it replays the launches its first run recorded (a launch program), or says why it runs its
    chains one by one instead.

    Parameters
    ----------
    model : torch.nn.Module
        A model passed to ``convert(..., fuse=True)`` (any module: one without fused regions
        gives an empty list).

    Returns
    -------
    list of (str, tuple, str)
        ``(path, signature, what runs)``: the region's path (the traced module's path, then
        ``region_<first chain>``), the input signature (the inputs' shapes, strides, dtypes,
        devices and alignments, training or eval, gradient or not, autocast's dtype,
        ``pycudnn.config``) and what runs for it, e.g. ``'forward program of 104 launches,
        backward program of 156 launches, one arena of N MiB'`` (N: the bytes of a step's
        intermediate results, allocated per run; in eval ``'forward program of 52 launches,
        arena of N MiB'``) or ``'the chains one by one: <reason>'``; in training followed by
        the kernels the chains' batch norms (with their addition and ReLU) run on, e.g.
        ``'; batch norms: 4 on pycudnn's kernels, 9 on cuDNN's fused kernel, 4 on cuDNN's
        separate calls'`` (``fused_train.chain_path`` chooses per signature). Empty before a
        region's first run.

    Notes
    -----
    :func:`fusions` lists the chains the pass found; ``use_programs(False)`` turns replays
    off (the chains then run one by one).
    """
    return [(where, sig, what) for where, sub in _runners(model) for sig, what in sub.programs()]


def _runners(model: nn.Module) -> list[tuple[str, FusedRegion | FusedPool]]:
    """Every fused region of *model* and every stem (:class:`FusedPool`) with its region
    first, ``(path, module)`` in model then graph order."""
    out: list[tuple[str, Any]] = []
    for path, gm in _fused_graphs(model):
        for name, sub in gm.named_children():
            where = f"{path}.{name}" if path else name
            if isinstance(sub, FusedPool):  # (a stem's region, with the pooling after it)
                out += [(f"{where}.region", sub.region), (where, sub)]
            elif isinstance(sub, FusedRegion):
                out.append((where, sub))
    return out


def regions(model: nn.Module) -> list[tuple[str, FusedRegion]]:
    """The fused regions of *model* (``convert(model, fuse=True)``): ``(path, region)`` in
    model then graph order, the path as :func:`programs` gives it (an empty list for a model
    without regions)."""
    return [(w, sub) for w, sub in _runners(model) if isinstance(sub, FusedRegion)]


def fusions(model: nn.Module) -> list[tuple[str, Match]]:
    """The chains ``convert(model, fuse=True)`` found in *model*: fused, and the near misses
    with the reason they did not fuse.

    Parameters
    ----------
    model : torch.nn.Module
        A model passed to ``convert(..., fuse=True)`` (any module: an unfused one gives an
        empty list).

    Returns
    -------
    list of (str, Match)
        ``(path of the traced module, Match)`` in model then graph order. A
        :class:`Match` has the chain's ``pattern`` (``'conv_bn'``, ``'conv_bn_act'``,
        ``'conv_bn_add_act'``, ``'linear_act'``), its graph ``nodes``, the ``modules`` they call
        (qualified names inside the traced module; ``''`` for a function or the addition),
        whether it is ``fused``, and ``reason``: when a fused chain still runs its modules one
        by one (training with some activations, a gradient in eval, CPU tensors), or why a
        chain did not fuse.

    Notes
    -----
    :func:`programs` says what each fused region runs per input signature;
    ``conversion_report(model)`` lists every module with what ``convert`` did to it.

    Examples
    --------
    >>> for path, m in pycudnn.torch.fusions(model):  # doctest: +SKIP
    ...     print(path or "(model)", m.pattern, m.modules, m.fused)
    (model) conv_bn_act ('0', '1', '2') True
    """
    out = []
    for path, m in model.named_modules():
        gm = getattr(m.__dict__.get("forward"), "__self__", None)
        recs = gm.matches if isinstance(gm, FusedGraph) else _UNFUSED.get(m, ())
        out.extend((path, rec) for rec in recs)
    return out
