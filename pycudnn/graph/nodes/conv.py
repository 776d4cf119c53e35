"""Convolution nodes: forward (``conv_fprop``), backward-data (``conv_dgrad``) and
backward-filter (``conv_wgrad``) -- their settings, output shapes and encoding.

The operation descriptors' attributes come from the descriptor layer's one table
(:data:`pycudnn.descriptors._conv_operation.CONV_OPERATIONS`); a node's tensor roles are those
attributes' names, inputs first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from ...descriptors import BackendDescriptor
from ...descriptors._conv_operation import CONV_OPERATIONS
from ...enums import ConvolutionMode, DataType
from .._tensor import GraphBase, Tensor, as_dims
from ._base import SCALING, NodeKind, Scalar

__all__ = ["KINDS", "ConvOptions", "dgrad", "fprop", "wgrad"]

#: node kind -> the convolution operation it records
_OPERATION = {
    "conv_fprop": "forward",
    "conv_dgrad": "backward_data",
    "conv_wgrad": "backward_filter",
}
_MODES = {
    "cross_correlation": ConvolutionMode.CROSS_CORRELATION,
    "convolution": ConvolutionMode.CONVOLUTION,
}


class ConvOptions(NamedTuple):
    """A convolution node's options as given (one value for every spatial dim, or a sequence)."""

    padding: Any = 0
    stride: Any = 1
    dilation: Any = 1
    post_padding: Any = None
    mode: str = "cross_correlation"
    compute_data_type: Any = None
    alpha: float = 1.0
    beta: float = 0.0


def _settings(g: GraphBase, op: str, nd: int, o: ConvOptions) -> dict[str, Any]:
    def spatial(v: Any, arg: str, lo: int) -> tuple[int, ...]:
        if isinstance(v, int) and not isinstance(v, bool):
            v = (v,) * nd
        vals = as_dims(v, f"{g.name}.{op}: {arg}", lo)
        if len(vals) != nd:
            raise ValueError(
                f"{g.name}.{op}: {arg} must have {nd} values (one per spatial dim), got {v!r}"
            )
        return vals

    pre = spatial(o.padding, "padding", 0)
    post = pre if o.post_padding is None else spatial(o.post_padding, "post_padding", 0)
    if o.mode not in _MODES:
        raise ValueError(f"{g.name}.{op}: mode={o.mode!r} is not one of {tuple(_MODES)}")
    return {
        "pre_padding": pre,
        "post_padding": post,
        "stride": spatial(o.stride, "stride", 1),
        "dilation": spatial(o.dilation, "dilation", 1),
        "mode": int(_MODES[o.mode]),
        "compute_data_type": int(g._compute(o.compute_data_type, op)),
        "alpha": float(o.alpha),
        "beta": float(o.beta),
    }


def _record(g: GraphBase, kind: str, name: str | None, s: dict, tensors: tuple) -> None:
    """The node of *kind* over *tensors* in the operation's role order (inputs first)."""
    enc = CONV_OPERATIONS[_OPERATION[kind]]
    roles = [(attr.name, t) for (_role, attr), t in zip(enc.tensors, tensors, strict=True)]
    g._node(kind, name, s, roles)


def fprop(g: GraphBase, image: Any, weight: Any, o: ConvOptions, name: str | None) -> Tensor:
    """``y = alpha * conv(image, weight) + beta * y``: y (N, K, *out)."""
    x = g._check("conv_fprop", "image", image)
    w = g._check("conv_fprop", "weight", weight)
    nd = len(x._dim) - 2
    if nd < 1 or len(w._dim) != len(x._dim):
        raise ValueError(
            f"{g.name}.conv_fprop: image {x._dim} and weight {w._dim} must "
            "have the same rank, at least 3"
        )
    s = _settings(g, "conv_fprop", nd, o)
    out = []
    for i in range(nd):
        span = x._dim[2 + i] + s["pre_padding"][i] + s["post_padding"][i]
        eff = s["dilation"][i] * (w._dim[2 + i] - 1) + 1
        if span < eff:
            raise ValueError(
                f"{g.name}.conv_fprop: the padded image ({span}) is smaller "
                f"than the dilated kernel ({eff}) in spatial dim {i}"
            )
        out.append((span - eff) // s["stride"][i] + 1)
    y = g._out("conv_fprop", name and f"{name}::y", (x._dim[0], w._dim[0], *out), x)
    _record(g, "conv_fprop", name, s, (x, w, y))
    return y


def dgrad(
    g: GraphBase,
    loss: Any,
    filter: Any,
    o: ConvOptions,
    image_dim: Sequence[int] | None,
    name: str | None,
) -> Tensor:
    """The image's gradient dx from dy (*loss*) and *filter*; *image_dim* where ambiguous."""
    dy = g._check("conv_dgrad", "loss", loss)
    w = g._check("conv_dgrad", "filter", filter)
    nd = len(dy._dim) - 2
    s = _settings(g, "conv_dgrad", nd, o)
    if image_dim is None:
        sp = [
            (dy._dim[2 + i] - 1) * s["stride"][i]
            - s["pre_padding"][i]
            - s["post_padding"][i]
            + s["dilation"][i] * (w._dim[2 + i] - 1)
            + 1
            for i in range(nd)
        ]
        image_dim = (dy._dim[0], w._dim[1], *sp)
    dim = as_dims(image_dim, f"{g.name}.conv_dgrad: image_dim")
    dx = g._out("conv_dgrad", name and f"{name}::dx", dim, dy)
    _record(g, "conv_dgrad", name, s, (w, dy, dx))
    return dx


def wgrad(
    g: GraphBase,
    image: Any,
    loss: Any,
    o: ConvOptions,
    filter_dim: Sequence[int] | None,
    name: str | None,
) -> Tensor:
    """The filter's gradient dw from x (*image*) and dy (*loss*); *filter_dim* where
    ambiguous."""
    x = g._check("conv_wgrad", "image", image)
    dy = g._check("conv_wgrad", "loss", loss)
    nd = len(x._dim) - 2
    s = _settings(g, "conv_wgrad", nd, o)
    if filter_dim is None:
        k = []
        for i in range(nd):
            span = x._dim[2 + i] + s["pre_padding"][i] + s["post_padding"][i]
            eff = span - (dy._dim[2 + i] - 1) * s["stride"][i]
            k.append(max((eff - 1) // s["dilation"][i] + 1, 1))
        filter_dim = (dy._dim[1], x._dim[1], *k)
    dim = as_dims(filter_dim, f"{g.name}.conv_wgrad: filter_dim")
    dw = g._out("conv_wgrad", name and f"{name}::dw", dim, x)
    _record(g, "conv_wgrad", name, s, (x, dy, dw))
    return dw


def _conv_desc(s: dict[str, Any]) -> BackendDescriptor:
    return BackendDescriptor.convolution(
        s["pre_padding"],
        s["post_padding"],
        s["stride"],
        s["dilation"],
        mode=ConvolutionMode(s["mode"]),
        compute_type=DataType(s["compute_data_type"]),
    )


def _kind(operation: str) -> NodeKind:
    enc = CONV_OPERATIONS[operation]
    scalars = (Scalar(enc.alpha, "alpha", SCALING), Scalar(enc.beta, "beta", SCALING))
    return NodeKind(enc.descriptor, (enc.conv, _conv_desc), scalars)


KINDS = {kind: _kind(operation) for kind, operation in _OPERATION.items()}
