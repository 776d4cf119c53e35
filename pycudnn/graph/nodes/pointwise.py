"""Pointwise nodes: any cuDNN pointwise mode, and pygraph's names for them (``add``, ``relu``,
``gelu``, ``cmp_gt``, ``binary_select``...; :data:`POINTWISE_NAMES`) -- arity, parameters,
broadcasting, output types and encoding. The graph's methods are :mod:`.pointwise_methods`'."""

from __future__ import annotations

import math
from typing import Any

from ... import errors
from ...descriptors import BackendDescriptor
from ...descriptors._validate import coerce_enum
from ...enums import BackendAttributeName as A
from ...enums import BackendDescriptorType as D
from ...enums import DataType, PointwiseMode
from .._tensor import GraphBase, Tensor, check_type, finite
from ._base import SCALING, NodeKind, Scalar

__all__ = ["KINDS", "PARAM_NAMES", "POINTWISE_NAMES", "apply", "arity", "pointwise"]

#: the optional parameters of a pointwise operation (``axis``: ``gen_index``'s)
PARAM_NAMES = (
    "relu_lower_clip",
    "relu_upper_clip",
    "relu_lower_clip_slope",
    "elu_alpha",
    "softplus_beta",
    "swish_beta",
    "axis",
)
#: the comparisons and the binary logical operations: two operands, a boolean result
_COMPARE = {
    PointwiseMode.CMP_EQ,
    PointwiseMode.CMP_NEQ,
    PointwiseMode.CMP_GT,
    PointwiseMode.CMP_GE,
    PointwiseMode.CMP_LT,
    PointwiseMode.CMP_LE,
    PointwiseMode.LOGICAL_AND,
    PointwiseMode.LOGICAL_OR,
}
_BINARY = {
    PointwiseMode.ADD,
    PointwiseMode.ADD_SQUARE,
    PointwiseMode.DIV,
    PointwiseMode.MAX,
    PointwiseMode.MIN,
    PointwiseMode.MOD,
    PointwiseMode.MUL,
    PointwiseMode.POW,
    PointwiseMode.SUB,
    PointwiseMode.ATAN2,
    PointwiseMode.FLOOR_MOD,
    *_COMPARE,
}
_BOOL_OUT = {*_COMPARE, PointwiseMode.LOGICAL_NOT}

#: pygraph's pointwise names -> mode
POINTWISE_NAMES: dict[str, PointwiseMode] = {
    "add": PointwiseMode.ADD,
    "add_square": PointwiseMode.ADD_SQUARE,
    "div": PointwiseMode.DIV,
    "max": PointwiseMode.MAX,
    "min": PointwiseMode.MIN,
    "mod": PointwiseMode.MOD,
    "mul": PointwiseMode.MUL,
    "pow": PointwiseMode.POW,
    "sub": PointwiseMode.SUB,
    "abs": PointwiseMode.ABS,
    "ceil": PointwiseMode.CEIL,
    "cos": PointwiseMode.COS,
    "exp": PointwiseMode.EXP,
    "floor": PointwiseMode.FLOOR,
    "log": PointwiseMode.LOG,
    "neg": PointwiseMode.NEG,
    "rsqrt": PointwiseMode.RSQRT,
    "sin": PointwiseMode.SIN,
    "sqrt": PointwiseMode.SQRT,
    "tan": PointwiseMode.TAN,
    "erf": PointwiseMode.ERF,
    "identity": PointwiseMode.IDENTITY,
    "reciprocal": PointwiseMode.RECIPROCAL,
    "relu": PointwiseMode.RELU_FWD,
    "tanh": PointwiseMode.TANH_FWD,
    "sigmoid": PointwiseMode.SIGMOID_FWD,
    "elu": PointwiseMode.ELU_FWD,
    "gelu": PointwiseMode.GELU_FWD,
    "softplus": PointwiseMode.SOFTPLUS_FWD,
    "swish": PointwiseMode.SWISH_FWD,
    "gelu_approx_tanh": PointwiseMode.GELU_APPROX_TANH_FWD,
    "relu_backward": PointwiseMode.RELU_BWD,
    "tanh_backward": PointwiseMode.TANH_BWD,
    "sigmoid_backward": PointwiseMode.SIGMOID_BWD,
    "elu_backward": PointwiseMode.ELU_BWD,
    "gelu_backward": PointwiseMode.GELU_BWD,
    "softplus_backward": PointwiseMode.SOFTPLUS_BWD,
    "swish_backward": PointwiseMode.SWISH_BWD,
    "gelu_approx_tanh_backward": PointwiseMode.GELU_APPROX_TANH_BWD,
    "cmp_eq": PointwiseMode.CMP_EQ,
    "cmp_neq": PointwiseMode.CMP_NEQ,
    "cmp_gt": PointwiseMode.CMP_GT,
    "cmp_ge": PointwiseMode.CMP_GE,
    "cmp_lt": PointwiseMode.CMP_LT,
    "cmp_le": PointwiseMode.CMP_LE,
    "logical_and": PointwiseMode.LOGICAL_AND,
    "logical_or": PointwiseMode.LOGICAL_OR,
    "logical_not": PointwiseMode.LOGICAL_NOT,
    "gen_index": PointwiseMode.GEN_INDEX,
    "binary_select": PointwiseMode.BINARY_SELECT,
}


def _backward(m: PointwiseMode) -> bool:
    """A backward mode (``*_BWD``): dy, x -> dx."""
    return 200 <= m < 300


def arity(m: PointwiseMode) -> int:
    """How many tensors a pointwise mode takes."""
    if m == PointwiseMode.BINARY_SELECT:
        return 3
    if m in _BINARY or _backward(m):
        return 2
    return 1


def _inputs(g: GraphBase, op: str, n: int, inputs: tuple) -> list[Tensor]:
    x, b, c = (*inputs, None, None)[:3]
    x = g._check(op, "input0", x)
    b = g._check(op, "input1", b, optional=n < 2)
    c = g._check(op, "input2", c, optional=n < 3)
    if n >= 2 and b is None:
        raise TypeError(f"{g.name}.{op} takes {n} inputs, got 1")
    if (n < 2 and b is not None) or (n < 3 and c is not None):
        raise TypeError(f"{g.name}.{op} takes {n} input(s)")
    return [t for t in (x, b, c) if t is not None]


def _scalars_to_rank(g: GraphBase, op: str, ins: list[Tensor]) -> None:
    """A by-value scalar takes the rank of the operation (as cudnn-frontend's). A constant
    (:meth:`Graph.scalar`) used at another rank is copied, never changed; a by-value input (its
    value given to ``execute``) takes the rank of the first operation it feeds, and one already
    used at another rank is refused (it would be described at two ranks)."""
    rank = len(ins[0]._dim)
    for i, t in enumerate(ins):
        if i == 0 or not t._by_value or math.prod(t._dim) != 1 or len(t._dim) == rank:
            continue
        if t._value is not None:
            c = g._new(f"{t._name}::rank{rank}", ((1,) * rank, (1,) * rank, t._dtype), False, True)
            c._value = t._value
            ins[i] = c
        elif g._uses(t):
            raise ValueError(
                f"{g.name}.{op}: by-value tensor {t._name!r} is used at rank {len(t._dim)} "
                f"already; this operation's inputs have rank {rank}: declare another by-value "
                f"tensor of dims {(1,) * rank} for it"
            )
        else:
            t._dim = t._stride = (1,) * rank


def _broadcast(g: GraphBase, op: str, ins: list[Tensor]) -> tuple[int, ...]:
    dims = [t._dim for t in ins]
    if len({len(d) for d in dims}) != 1:
        raise ValueError(
            f"{g.name}.{op}: inputs of different ranks {dims}; give size-1 dims to broadcast"
        )
    out_dim = []
    for i, sizes in enumerate(zip(*dims, strict=True)):
        big = max(sizes)
        if any(s not in (1, big) for s in sizes):
            raise ValueError(f"{g.name}.{op}: dim {i} of the inputs {dims} does not broadcast")
        out_dim.append(big)
    return tuple(out_dim)


def _params(g: GraphBase, op: str, params: dict[str, Any], rank: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in params.items():
        if k == "axis":
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < rank:
                raise ValueError(f"{g.name}.{op}: axis must be an int in [0, {rank}), got {v!r}")
            out[k] = v
        else:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
                raise ValueError(f"{g.name}.{op}: {k} must be a real number, got {v!r}")
            out[k] = float(v)
    return out


def apply(
    g: GraphBase,
    m: PointwiseMode,
    inputs: tuple,
    compute: Any = None,
    alphas: tuple[float, float] = (1.0, 1.0),
    name: str | None = None,
    params: dict[str, Any] | None = None,
) -> Tensor:
    """``y = op(alpha1 * inputs[0][, alpha2 * inputs[1][, inputs[2]]])`` for mode *m*; a
    backward mode takes ``(dy, x)`` and gives dx."""
    params = params or {}
    op = m.name.lower()
    n = arity(m)
    ins = _inputs(g, op, n, inputs)
    for k in params:
        if k not in PARAM_NAMES:
            raise TypeError(
                f"{g.name}.{op}: unknown parameter {k!r}; expected one of {', '.join(PARAM_NAMES)}"
            )
    if m == PointwiseMode.RELU_FWD and "relu_upper_clip" in params and ins[0]._producer == "matmul":
        # measured on an H200 with cuDNN 9.19 (the GPU fuzzer, through dnn_matmul): the matmul
        # engines run this graph but ignore the upper clip -- wrong results, not an error
        raise errors.NotSupportedError(
            3000,
            f"{g.name}.{op}",
            "relu_upper_clip on a matmul's output: cuDNN 9.19's matmul engines ignore the upper "
            "clip there (measured: wrong results); add a bias (zeros) between them, or clamp "
            "the result outside the graph",
        )
    _scalars_to_rank(g, op, ins)
    if m == PointwiseMode.BINARY_SELECT:
        check_type(f"{g.name}.{op}", "input2 (the mask)", ins[2], (DataType.BOOLEAN,))
    out_dim = _broadcast(g, op, ins)
    like = max(ins, key=lambda t: math.prod(t._dim))
    out_dtype = None
    if m in _BOOL_OUT:
        out_dtype = DataType.BOOLEAN
    elif m == PointwiseMode.GEN_INDEX:
        out_dtype = DataType.INT32
    a1 = finite(alphas[0], f"{g.name}.{op}: alpha1")
    a2 = finite(alphas[1], f"{g.name}.{op}: alpha2")
    y = g._out(op, name and f"{name}::y", out_dim, like, out_dtype)
    s: dict[str, Any] = {
        "mode": int(m),
        "compute_data_type": int(g._compute(compute, op)),
        "alpha1": a1,
        "alpha2": a2,
    }
    s.update(_params(g, op, params, len(out_dim)))
    lo, hi = s.get("relu_lower_clip"), s.get("relu_upper_clip")
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(
            f"{g.name}.{op}: relu_lower_clip={params['relu_lower_clip']!r} is above "
            f"relu_upper_clip={params['relu_upper_clip']!r}; the lower clip must not exceed the "
            "upper"
        )
    if m == PointwiseMode.GEN_INDEX and "axis" not in s:
        raise TypeError(f"{g.name}.gen_index needs axis=")
    if _backward(m):  # dy, x -> dx
        roles = [
            ("OPERATION_POINTWISE_DYDESC", ins[0]),
            ("OPERATION_POINTWISE_XDESC", ins[1]),
            ("OPERATION_POINTWISE_DXDESC", y),
        ]
    else:
        tags = (
            "OPERATION_POINTWISE_XDESC",
            "OPERATION_POINTWISE_BDESC",
            "OPERATION_POINTWISE_TDESC",
        )
        roles = [*zip(tags, ins, strict=False), ("OPERATION_POINTWISE_YDESC", y)]
    g._node("pointwise", name or op, s, roles)
    return y


def pointwise(
    g: GraphBase,
    mode: Any,
    inputs: tuple,
    compute: Any,
    alphas: tuple[float, float],
    name: str | None,
    params: dict[str, Any],
) -> Tensor:
    """:func:`apply` for a mode given as a ``PointwiseMode`` or its name."""
    return apply(g, coerce_enum(mode, PointwiseMode, "mode"), inputs, compute, alphas, name, params)


def _pointwise_desc(s: dict[str, Any]) -> BackendDescriptor:
    params = {k: s[k] for k in PARAM_NAMES if k in s}
    return BackendDescriptor.pointwise(
        PointwiseMode(s["mode"]), DataType(s["compute_data_type"]), **params
    )


KINDS = {
    "pointwise": NodeKind(
        D.OPERATION_POINTWISE_DESCRIPTOR,
        (A.OPERATION_POINTWISE_PW_DESCRIPTOR, _pointwise_desc),
        (
            Scalar(A.OPERATION_POINTWISE_ALPHA1, "alpha1", SCALING),
            Scalar(A.OPERATION_POINTWISE_ALPHA2, "alpha2", SCALING),
        ),
    )
}
