"""Fused convolution epilogues: ``act(alpha * conv(x, w) + z_alpha * z + bias)`` as one graph.

A :class:`FusedProblem` is a graph key of the plan engine (:mod:`pycudnn.graph._plans`): the
convolution's :class:`._plans.Problem` plus the epilogue -- a bias of shape ``(1, K, 1, 1)``, a
residual ``z`` of the output's shape scaled by ``z_alpha``, and an activation. Its graph is

    conv(x, w) -> [add bias] -> [add z_alpha * z] -> [activation] -> y

built with the public graph builder (:class:`pycudnn.graph.Graph`), with the intermediate
results in virtual tensors of the compute type (float32, or float64 for double data): cuDNN's
runtime-fusion engines run it as one kernel where they can (NHWC
fp16/bf16 on sm80+), rounding to the output's type once. The order is that of cuDNN's
``cudnnConvolutionBiasActivationForward`` (``act(alpha1 * conv + alpha2 * z + bias)``).

When no engine runs the graph, :mod:`.conv` computes the same thing as separate steps: the
plain convolution, then ``cudnnAddTensor`` for the bias and ``z`` and
``cudnnActivationForward`` in place (:data:`SEPARATE` lists the activations those have). The
GELUs have no legacy kernel: without a fused engine they raise ``NotSupportedError`` (an
epilogue-only pointwise graph was tried and dropped: cuDNN 9.19 on an H100 had no engine for
it).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..descriptors import BackendDescriptor
from ..enums import (
    ActivationMode,
    ConvolutionMode,
    DataType,
    PointwiseMode,
)
from ..graph import Graph, _plans
from ..graph._plans import Problem

__all__ = ["ACTIVATIONS", "SEPARATE", "FusedProblem", "activation", "epilogue"]

#: unique ids of the epilogue's tensors (x, w, y are the convolution's 1, 2, 3)
BIAS_UID, Z_UID = 4, 5

#: activation name -> (pointwise mode, the parameter it takes or None, its default)
ACTIVATIONS: dict[str, tuple[PointwiseMode, str | None, float | None]] = {
    "relu": (PointwiseMode.RELU_FWD, None, None),
    "clipped_relu": (PointwiseMode.RELU_FWD, "upper clip", None),
    "gelu": (PointwiseMode.GELU_FWD, None, None),
    "gelu_tanh": (PointwiseMode.GELU_APPROX_TANH_FWD, None, None),
    "silu": (PointwiseMode.SWISH_FWD, None, None),
    "swish": (PointwiseMode.SWISH_FWD, None, None),
    "sigmoid": (PointwiseMode.SIGMOID_FWD, None, None),
    "tanh": (PointwiseMode.TANH_FWD, None, None),
    "elu": (PointwiseMode.ELU_FWD, "alpha", 1.0),
}
#: activation name -> the legacy activation mode of the separate-steps fallback (the GELUs have
#: none: a GELU epilogue needs a fused engine)
SEPARATE: dict[str, ActivationMode] = {
    "relu": ActivationMode.RELU,
    "clipped_relu": ActivationMode.CLIPPED_RELU,
    "silu": ActivationMode.SWISH,
    "swish": ActivationMode.SWISH,
    "sigmoid": ActivationMode.SIGMOID,
    "tanh": ActivationMode.TANH,
    "elu": ActivationMode.ELU,
}


def activation(value: Any, func: str) -> tuple[str, float | None] | None:
    """Parse ``activation=``: None, a name, or ``(name, coef)`` (``clipped_relu`` needs its upper
    bound, e.g. ``("clipped_relu", 6.0)``; ``elu`` takes alpha, default 1.0)."""
    if value is None:
        return None
    coef: Any = None
    name = value
    if isinstance(value, tuple) and len(value) == 2:
        name, coef = value
    names = ", ".join(repr(n) for n in ACTIVATIONS)
    if not isinstance(name, str) or name.lower() not in ACTIVATIONS:
        raise ValueError(
            f"{func}: activation={value!r} is not one of {names} (or a (name, coef) tuple)"
        )
    name = name.lower()
    _mode, param, default = ACTIVATIONS[name]
    if param is None:
        if coef is not None:
            raise ValueError(f"{func}: activation {name!r} takes no parameter, got {value!r}")
        return name, None
    if coef is None:
        coef = default
    if coef is None:
        raise ValueError(
            f"{func}: activation {name!r} needs its {param}: pass ({name!r}, value), "
            f"e.g. ({name!r}, 6.0)"
        )
    if isinstance(coef, bool) or not isinstance(coef, (int, float)) or coef != coef:
        raise ValueError(f"{func}: the {param} of activation {name!r} must be a real number, "
                         f"got {coef!r}")  # fmt: skip
    if name == "clipped_relu" and not coef > 0:
        raise ValueError(f"{func}: the upper clip of 'clipped_relu' must be > 0, got {coef!r}")
    return name, float(coef)


class Tensor(NamedTuple):
    """An epilogue operand: shape and element strides as the graph sees them, byte alignment."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    align: int


class FusedProblem(NamedTuple):
    """The graph key of a fused convolution: its :class:`Problem` and its epilogue."""

    conv: Problem
    bias: Tensor | None
    z: Tensor | None
    z_alpha: float
    act: str | None
    act_coef: float | None

    # -- the graph-key protocol of _plans ------------------------------------------------------
    @property
    def dtype(self) -> int:
        return self.conv.dtype

    @property
    def allow_tf32(self) -> bool:
        return self.conv.allow_tf32

    @property
    def deterministic(self) -> bool:
        return self.conv.deterministic

    @property
    def workspace_limit(self) -> int:
        return self.conv.workspace_limit

    @property
    def algo(self) -> str:
        return self.conv.algo

    @property
    def device(self) -> int:
        return self.conv.device

    @property
    def uids(self) -> tuple[int, ...]:
        """Pointer order of a call: x, w, [bias], [z], y -- the order ``dnn_conv`` passes them."""
        x, w, y = _plans.UIDS
        return (x, w, *((BIAS_UID,) if self.bias else ()), *((Z_UID,) if self.z else ()), y)

    @property
    def label(self) -> str:
        parts = ["conv"]
        if self.bias is not None:
            parts.append("bias")
        if self.z is not None:
            parts.append("add")
        if self.act is not None:
            parts.append(self.act)
        return "fused " + "+".join(parts)

    def what(self) -> str:
        return f"{self.label} ({self.conv.what()})"

    def build_graph(self, handle: Any) -> BackendDescriptor:
        """conv -> [add bias] -> [add z_alpha * z] -> [activation] -> y (module docstring), a
        :class:`pycudnn.graph.Graph` like any other."""
        return self.graph().key(device=self.device).build_graph(handle)

    def graph(self) -> Graph:
        """The builder graph: x, w, y, bias, z with the unique ids 1, 2, 3, 4, 5."""
        p = self.conv
        dt = DataType(p.dtype)
        inter = DataType.DOUBLE if dt == DataType.DOUBLE else DataType.FLOAT
        g = Graph(dt, inter, inter, name="dnn_conv")
        x = g.tensor(p.x_shape, p.x_strides, uid=_plans.UIDS[0], alignment=p.x_align, name="x")
        w = g.tensor(p.w_shape, p.w_strides, uid=_plans.UIDS[1], alignment=p.w_align, name="w")
        b = z = None
        if self.bias is not None:
            b = g.tensor(self.bias.shape, self.bias.strides, uid=BIAS_UID,
                         alignment=self.bias.align, name="bias")  # fmt: skip
        if self.z is not None:
            z = g.tensor(self.z.shape, self.z.strides, uid=Z_UID, alignment=self.z.align,
                         name="z")  # fmt: skip
        cur = g.conv_fprop(
            x,
            w,
            p.pads,
            p.strides,
            p.dilations,
            mode=ConvolutionMode(p.mode).name.lower(),
            compute_data_type=DataType(p.compute),
            alpha=p.alpha,
            name="conv",
        )
        cur.set_dim(p.y_shape).set_stride(p.y_strides)
        y = epilogue(g, cur, b, z, self.z_alpha, self.act, self.act_coef)
        y.set_output(True).set_uid(_plans.UIDS[2]).set_alignment(p.y_align).set_stride(p.y_strides)
        y.set_name("y")
        return g


def epilogue(g: Graph, cur: Any, bias: Any, z: Any, z_alpha: float, act: str | None,
             act_coef: float | None) -> Any:  # fmt: skip
    """Append ``cur -> [+ bias] -> [+ z_alpha * z] -> [act]`` to the builder graph *g* and
    return the last tensor (the fused convolution's and ``dnn_matmul``'s epilogue)."""
    if bias is not None:
        cur = g.add(cur, bias, name="add_bias")
    if z is not None:
        cur = g.add(cur, z, alpha2=z_alpha, name="add_z")
    if act is not None:
        mode, _param, _default = ACTIVATIONS[act]
        kw: dict[str, float] = {}
        if act == "clipped_relu":
            kw = {"relu_lower_clip": 0.0, "relu_upper_clip": float(act_coef or 0.0)}
        elif act == "relu":
            kw = {"relu_lower_clip": 0.0}
        elif act == "elu":
            kw = {"elu_alpha": float(act_coef if act_coef is not None else 1.0)}
        elif mode == PointwiseMode.SWISH_FWD:
            kw = {"swish_beta": 1.0}
        cur = g.pointwise(mode, cur, name=act, **kw)
    return cur
