"""Convolution nodes: forward (``conv_fprop``), backward-data (``conv_dgrad``) and
backward-filter (``conv_wgrad``) -- their settings, output shapes and encoding.

The operation descriptors' attributes come from the descriptor layer's one table
(:data:`pycudnn.descriptors._conv_operation.CONV_OPERATIONS`); a node's tensor roles are those
attributes' names, inputs first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from ... import _layout
from ...descriptors import BackendDescriptor
from ...descriptors._conv_operation import CONV_OPERATIONS
from ...enums import ConvolutionMode, DataType
from .._tensor import GraphBase, Tensor, as_dims, finite
from ._base import SCALING, NodeKind, Scalar

__all__ = ["KINDS", "ConvOperations", "ConvOptions", "dgrad", "fprop", "wgrad"]

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
        "alpha": finite(o.alpha, f"{g.name}.{op}: alpha"),
        "beta": finite(o.beta, f"{g.name}.{op}: beta"),
    }


def _out_spatial(s: dict, x_dim: tuple, w_dim: tuple) -> tuple[int, ...] | None:
    """The forward's output spatial dims for image dims *x_dim* and filter dims *w_dim* (None
    when the padded image is smaller than the dilated kernel)."""
    out = []
    for i in range(len(x_dim) - 2):
        span = x_dim[2 + i] + s["pre_padding"][i] + s["post_padding"][i]
        eff = s["dilation"][i] * (w_dim[2 + i] - 1) + 1
        if span < eff:
            return None
        out.append((span - eff) // s["stride"][i] + 1)
    return tuple(out)


def _check_shapes(g: GraphBase, op: str, s: dict, dims: tuple, names: tuple) -> None:
    """The image, filter and output dims *dims* ``(x, w, y)`` of one convolution agree: one
    rank (at least 3), one batch, the filter's input channels dividing the image's (groups)
    and its output channels a multiple of the groups, the output's channels the filter's and
    its spatial dims what the forward computes. *names*: the three operands' names in *op*."""
    x, w, y = dims
    nx, nw, ny = names
    where = f"{g.name}.{op}"
    if not len(x) == len(w) == len(y) or len(x) < 3:
        raise ValueError(f"{where}: {nx} {x}, {nw} {w} and {ny} {y} must have one rank, at least 3")
    if x[1] % w[1]:
        raise ValueError(
            f"{where}: {nx} has {x[1]} channels, {nw} {w[1]} per group: the image's channels "
            "must be a multiple of the filter's (groups)"
        )
    groups = x[1] // w[1]
    if w[0] % groups:
        raise ValueError(
            f"{where}: {nw}'s {w[0]} output channels are not a multiple of the {groups} groups "
            f"({nx} {x[1]} channels / {nw} {w[1]})"
        )
    expected = _out_spatial(s, x, w)
    if expected is None:
        raise ValueError(f"{where}: the padded {nx} {x} is smaller than the dilated {nw} {w}")
    if y[0] != x[0] or y[1] != w[0] or tuple(y[2:]) != expected:
        raise ValueError(
            f"{where}: {ny} must have dims {(x[0], w[0], *expected)} for {nx} {x} and {nw} {w} "
            f"with these padding/stride/dilation, got {y}"
        )


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
    y_dim = (x._dim[0], w._dim[0], *out)
    if math.prod(y_dim) > _layout.INT64_MAX:
        raise ValueError(
            f"{g.name}.conv_fprop: padding {s['pre_padding']} (post {s['post_padding']}), "
            f"stride {s['stride']} and dilation {s['dilation']} give image {x._dim} an output "
            f"of dims {y_dim}, more elements than cuDNN's int64 counts (2**63 - 1)"
        )
    _check_shapes(g, "conv_fprop", s, (x._dim, w._dim, y_dim), ("image", "weight", "y"))
    y = g._out("conv_fprop", name and f"{name}::y", y_dim, x)
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
    _check_shapes(g, "conv_dgrad", s, (dim, w._dim, dy._dim), ("image_dim", "filter", "loss"))
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
    _check_shapes(g, "conv_wgrad", s, (x._dim, dim, dy._dim), ("image", "filter_dim", "loss"))
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


class ConvOperations(GraphBase):
    """The graph's convolution methods (a base of :class:`~pycudnn.graph.Graph`)."""

    def conv_fprop(
        self,
        image: Tensor,
        weight: Tensor,
        padding: Any = 0,
        stride: Any = 1,
        dilation: Any = 1,
        *,
        post_padding: Any = None,
        mode: str = "cross_correlation",
        compute_data_type: Any = None,
        alpha: float = 1.0,
        beta: float = 0.0,
        name: str | None = None,
    ) -> Tensor:
        """Convolution forward: ``y = alpha * conv(image, weight) + beta * y``; image
        (N, C, *spatial), weight (K, C/groups, *kernel) -> y (N, K, *out)."""
        o = ConvOptions(
            padding, stride, dilation, post_padding, mode, compute_data_type, alpha, beta
        )
        return fprop(self, image, weight, o, name)

    def conv_dgrad(
        self,
        loss: Tensor,
        filter: Tensor,
        padding: Any = 0,
        stride: Any = 1,
        dilation: Any = 1,
        *,
        image_dim: Sequence[int] | None = None,
        post_padding: Any = None,
        mode: str = "cross_correlation",
        compute_data_type: Any = None,
        alpha: float = 1.0,
        beta: float = 0.0,
        name: str | None = None,
    ) -> Tensor:
        """Convolution backward-data: the gradient of the image from ``loss`` (dy) and
        ``filter``; *image_dim* gives dx's shape where the stride makes it ambiguous."""
        o = ConvOptions(
            padding, stride, dilation, post_padding, mode, compute_data_type, alpha, beta
        )
        return dgrad(self, loss, filter, o, image_dim, name)

    def conv_wgrad(
        self,
        image: Tensor,
        loss: Tensor,
        padding: Any = 0,
        stride: Any = 1,
        dilation: Any = 1,
        *,
        filter_dim: Sequence[int] | None = None,
        post_padding: Any = None,
        mode: str = "cross_correlation",
        compute_data_type: Any = None,
        alpha: float = 1.0,
        beta: float = 0.0,
        name: str | None = None,
    ) -> Tensor:
        """Convolution backward-filter: the filter's gradient from ``image`` (x) and ``loss``
        (dy); *filter_dim* gives dw's shape where it is ambiguous."""
        o = ConvOptions(
            padding, stride, dilation, post_padding, mode, compute_data_type, alpha, beta
        )
        return wgrad(self, image, loss, o, filter_dim, name)
