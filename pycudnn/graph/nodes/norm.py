"""Normalization nodes: layer, RMS, instance and batch norm, forward (training or inference,
batch norm's running statistics) and backward -- checks, statistics shapes and encoding."""

from __future__ import annotations

import math
from typing import Any

from ... import _layout
from ..._config import parse_bool
from ...enums import BackendAttributeName as A
from ...enums import BackendAttributeType as T
from ...enums import BackendDescriptorType as D
from ...enums import BackendNormFwdPhase, BackendNormMode, DataType
from .._tensor import GraphBase, Tensor
from ._base import NodeKind, Scalar, channel_strides

__all__ = ["KINDS", "MODES", "NormOperations", "backward", "forward", "phase"]

_RMS = BackendNormMode.RMS_NORM
#: the graph's norm methods -> the mode they record
MODES = {
    "layernorm": BackendNormMode.LAYER_NORM,
    "rmsnorm": _RMS,
    "instancenorm": BackendNormMode.INSTANCE_NORM,
    "batchnorm": BackendNormMode.BATCH_NORM,
}


def phase(value: Any, where: str) -> BackendNormFwdPhase:
    """A forward phase given as the enum or ``'training'`` / ``'inference'``."""
    if isinstance(value, BackendNormFwdPhase):
        return value
    if isinstance(value, str) and value.upper() in ("TRAINING", "INFERENCE"):
        return BackendNormFwdPhase[value.upper()]
    raise ValueError(f"{where}: norm_forward_phase={value!r} is not 'training' or 'inference'")


def _stats_dim(mode: BackendNormMode, x: Tensor) -> tuple[int, ...]:
    n = len(x._dim)
    if mode in (BackendNormMode.LAYER_NORM, _RMS):
        return (x._dim[0], *(1,) * (n - 1))
    if mode == BackendNormMode.INSTANCE_NORM:
        return (x._dim[0], x._dim[1], *(1,) * (n - 2))
    return (1, x._dim[1], *(1,) * (n - 2))  # batch norm


def _param_dim(mode: BackendNormMode, x: Tensor) -> tuple[int, ...]:
    """The dims of a norm's scale and bias: per feature (layer and RMS norm: x's dims with
    batch 1), or per channel (instance and batch norm)."""
    if mode in (BackendNormMode.LAYER_NORM, _RMS):
        return (1, *x._dim[1:])
    return (1, x._dim[1], *(1,) * (len(x._dim) - 2))


def _check_operands(g: GraphBase, op: str, mode: BackendNormMode, x: Tensor, named: tuple) -> None:
    """The parameters and statistics *named* ``((name, tensor or None, expected dims or
    'scalar'), ...)`` of the norm *op* over *x* have the dims cuDNN takes."""
    for nm, t, want in named:
        if t is None:
            continue
        if want == "scalar":
            if math.prod(t._dim) != 1:
                raise ValueError(f"{g.name}.{op}: {nm} must be a scalar (all dims 1), got {t._dim}")
            continue
        if t._dim != want:
            raise ValueError(
                f"{g.name}.{op}: {nm} must have dims {want} for input {x._dim}, got {t._dim}"
            )


def _stat(g: GraphBase, op: str, name: str | None, dim: tuple[int, ...]) -> Tensor:
    """A float32 statistics output (mean, inverse variance)."""
    layout = (dim, _layout.packed_strides(dim), DataType.FLOAT)
    return g._new(name, layout, True, producer=op)


def _running(g: GraphBase, op: str, name: str | None, running: tuple) -> tuple[list, list]:
    """The roles and outputs of batch norm's running statistics ``(mean, var, momentum)``."""
    in_mean, in_var, momentum = running
    roles = [
        ("OPERATION_NORM_FWD_INPUT_RUNNING_MEAN_DESC", in_mean),
        ("OPERATION_NORM_FWD_INPUT_RUNNING_VAR_DESC", in_var),
        ("OPERATION_NORM_FWD_EXP_AVG_FACTOR_DESC", momentum),
    ]
    # (the next statistics in the previous ones' data type: an output's default, the graph's
    # io type, made cuDNN refuse the graph as unlike the float32 mean)
    nm = g._out(op, name and f"{name}::next_running_mean", in_mean._dim, in_mean, in_mean._dtype)
    nv = g._out(op, name and f"{name}::next_running_var", in_var._dim, in_var, in_var._dtype)
    roles += [
        ("OPERATION_NORM_FWD_OUTPUT_RUNNING_MEAN_DESC", nm),
        ("OPERATION_NORM_FWD_OUTPUT_RUNNING_VAR_DESC", nv),
    ]
    return roles, [nm, nv]


def _per_channel(roles: list, *data: str) -> None:
    """Batch norm's per-channel tensors (every role but the data's *data*; a scalar's strides
    do not change) described as cudnn-frontend describes them
    (:func:`~._base.channel_strides`), so that the statistics it makes and the running
    statistics a caller gives (``tensor_like``: every stride 1) are alike, as cuDNN compares
    them."""
    for role, t in roles:
        if role not in data and len(t._dim) > 1 and math.prod(t._dim) == t._dim[1]:
            channel_strides(t)


def forward(
    g: GraphBase,
    op: str,
    norm_phase: Any,
    inputs: tuple,
    name: str | None,
    running: tuple | None = None,
) -> tuple:
    """The forward norm *op* (a key of :data:`MODES`) over ``inputs = (x, scale, bias,
    epsilon)``: ``(y, [mean,] inv_variance[, next_running_mean, next_running_var])`` (the
    statistics None in inference; RMS norm has no mean)."""
    mode = MODES[op]
    x, scale, bias, epsilon = inputs
    x = g._check(op, "input", x)
    scale = g._check(op, "scale", scale, optional=mode == _RMS)
    bias = g._check(op, "bias", bias, optional=True)
    eps = g._check(op, "epsilon", epsilon)
    ph = phase(norm_phase, f"{g.name}.{op}")
    if len(x._dim) < 2:
        raise ValueError(f"{g.name}.{op}: input needs at least 2 dims, got {x._dim}")
    pdim = _param_dim(mode, x)
    named = [("scale", scale, pdim), ("bias", bias, pdim), ("epsilon", eps, "scalar")]
    if running is not None:
        named += [
            ("running mean", running[0], pdim),
            ("running var", running[1], pdim),
            ("momentum", running[2], "scalar"),
        ]
    _check_operands(g, op, mode, x, tuple(named))
    sdim = _stats_dim(mode, x)
    y = g._out(op, name and f"{name}::y", x._dim, x)
    roles: list[tuple[str, Tensor]] = [("OPERATION_NORM_FWD_XDESC", x)]
    if scale is not None:
        roles.append(("OPERATION_NORM_FWD_SCALE_DESC", scale))
    if bias is not None:
        roles.append(("OPERATION_NORM_FWD_BIAS_DESC", bias))
    roles.append(("OPERATION_NORM_FWD_EPSILON_DESC", eps))
    outs: list[Tensor | None] = [y]
    if ph == BackendNormFwdPhase.TRAINING:
        if mode != _RMS:
            mean = _stat(g, op, name and f"{name}::mean", sdim)
            roles.append(("OPERATION_NORM_FWD_MEAN_DESC", mean))
            outs.append(mean)
        inv = _stat(g, op, name and f"{name}::inv_variance", sdim)
        roles.append(("OPERATION_NORM_FWD_INV_VARIANCE_DESC", inv))
        outs.append(inv)
    else:  # inference: no statistics
        outs += [None] if mode == _RMS else [None, None]
    if running is not None:
        more_roles, more_outs = _running(g, op, name, running)
        roles += more_roles
        outs += more_outs
    roles.append(("OPERATION_NORM_FWD_YDESC", y))
    if mode == BackendNormMode.BATCH_NORM:
        _per_channel(roles, "OPERATION_NORM_FWD_XDESC", "OPERATION_NORM_FWD_YDESC")
    g._node("norm_forward", name or op, {"mode": int(mode), "phase": int(ph)}, roles)
    return tuple(outs)


def backward(
    g: GraphBase,
    norm_op: str,
    inputs: tuple,
    saved: tuple,
    name: str | None,
    has_dbias: bool = True,
) -> tuple:
    """``(dx, dscale, dbias)`` of the norm *norm_op* (a key of :data:`MODES`) from ``inputs =
    (dy, x, scale)`` and the forward's ``saved = (mean, inv_variance)`` (no mean for RMS
    norm); dbias None unless *has_dbias*."""
    op, mode = f"{norm_op}_backward", MODES[norm_op]
    has_dbias = parse_bool(has_dbias, f"{g.name}.{op}", "has_dbias")
    grad, x, scale = inputs
    mean, inv_variance = saved
    dy = g._check(op, "grad", grad)
    x = g._check(op, "input", x)
    scale = g._check(op, "scale", scale)
    mean = g._check(op, "mean", mean, optional=mode == _RMS)
    inv = g._check(op, "inv_variance", inv_variance)
    if len(x._dim) < 2 or dy._dim != x._dim:
        raise ValueError(f"{g.name}.{op}: grad {dy._dim} and input {x._dim} must have one shape")
    sdim, pdim = _stats_dim(mode, x), _param_dim(mode, x)
    named = (("scale", scale, pdim), ("mean", mean, sdim), ("inv_variance", inv, sdim))
    _check_operands(g, op, mode, x, named)
    dx = g._out(op, name and f"{name}::dx", x._dim, x)
    # batch norm's parameter gradients in the parameters' type (float32 beside half data, as
    # its statistics); the other norms' keep the graph's io type
    pdt = scale._dtype if mode == BackendNormMode.BATCH_NORM else None
    dscale = g._out(op, name and f"{name}::dscale", scale._dim, scale, pdt)
    roles: list[tuple[str, Tensor]] = [("OPERATION_NORM_BWD_XDESC", x)]
    if mean is not None:
        roles.append(("OPERATION_NORM_BWD_MEAN_DESC", mean))
    roles += [
        ("OPERATION_NORM_BWD_INV_VARIANCE_DESC", inv),
        ("OPERATION_NORM_BWD_DYDESC", dy),
        ("OPERATION_NORM_BWD_SCALE_DESC", scale),
        ("OPERATION_NORM_BWD_DSCALE_DESC", dscale),
    ]
    dbias = None
    if has_dbias:
        dbias = g._out(op, name and f"{name}::dbias", scale._dim, scale, pdt)
        roles.append(("OPERATION_NORM_BWD_DBIAS_DESC", dbias))
    roles.append(("OPERATION_NORM_BWD_DXDESC", dx))
    if mode == BackendNormMode.BATCH_NORM:
        _per_channel(roles, "OPERATION_NORM_BWD_XDESC", "OPERATION_NORM_BWD_DYDESC",
                     "OPERATION_NORM_BWD_DXDESC")  # fmt: skip
    g._node("norm_backward", name or op, {"mode": int(mode)}, roles)
    return dx, dscale, dbias


KINDS = {
    "norm_forward": NodeKind(
        D.OPERATION_NORM_FORWARD_DESCRIPTOR,
        None,
        (
            Scalar(A.OPERATION_NORM_FWD_MODE, "mode", T.NORM_MODE, BackendNormMode),
            Scalar(A.OPERATION_NORM_FWD_PHASE, "phase", T.NORM_FWD_PHASE, BackendNormFwdPhase),
        ),
    ),
    "norm_backward": NodeKind(
        D.OPERATION_NORM_BACKWARD_DESCRIPTOR,
        None,
        (Scalar(A.OPERATION_NORM_BWD_MODE, "mode", T.NORM_MODE, BackendNormMode),),
    ),
}


class NormOperations(GraphBase):
    """The graph's normalization methods, forward and backward (a base of
    :class:`~pycudnn.graph.Graph`)."""

    def layernorm(
        self,
        input: Tensor,
        scale: Tensor,
        bias: Tensor,
        epsilon: Tensor,
        norm_forward_phase: Any = "training",
        *,
        name: str | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Layer norm over every dim but the first: ``(y, mean, inv_variance)`` (the
        statistics are None in inference). *scale*/*bias* are shaped like one sample
        (1, *input.dim[1:]); *epsilon* a scalar tensor (:meth:`scalar`)."""
        inputs = (input, scale, bias, epsilon)
        return forward(self, "layernorm", norm_forward_phase, inputs, name)  # type: ignore[return-value]

    def rmsnorm(
        self,
        input: Tensor,
        scale: Tensor,
        bias: Tensor | None = None,
        epsilon: Tensor | None = None,
        norm_forward_phase: Any = "training",
        *,
        name: str | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """RMS norm over every dim but the first: ``(y, inv_variance)`` (None in inference)."""
        outs = forward(self, "rmsnorm", norm_forward_phase, (input, scale, bias, epsilon), name)
        return outs[0], (outs[1] if len(outs) > 1 else None)

    def instancenorm(
        self,
        input: Tensor,
        scale: Tensor,
        bias: Tensor,
        epsilon: Tensor,
        norm_forward_phase: Any = "training",
        *,
        name: str | None = None,
    ) -> tuple:
        """Instance norm (per sample and channel): ``(y, mean, inv_variance)``."""
        return forward(
            self, "instancenorm", norm_forward_phase, (input, scale, bias, epsilon), name
        )

    def batchnorm(
        self,
        input: Tensor,
        scale: Tensor,
        bias: Tensor,
        epsilon: Tensor,
        *,
        in_running_mean: Tensor | None = None,
        in_running_var: Tensor | None = None,
        momentum: Tensor | None = None,
        norm_forward_phase: Any = "training",
        name: str | None = None,
    ) -> tuple:
        """Batch norm (per channel) in training: ``(y, mean, inv_variance[,
        next_running_mean, next_running_var])`` -- the running statistics when
        *in_running_mean*, *in_running_var* and *momentum* (a scalar) are given."""
        if phase(norm_forward_phase, f"{self.name}.batchnorm") != BackendNormFwdPhase.TRAINING:
            raise ValueError(
                f"{self.name}.batchnorm: only the training phase is built here (an "
                "inference batch norm is a scale and shift: use mul/add)"
            )
        running = None
        if any(v is not None for v in (in_running_mean, in_running_var, momentum)):
            running = (
                self._check("batchnorm", "in_running_mean", in_running_mean),
                self._check("batchnorm", "in_running_var", in_running_var),
                self._check("batchnorm", "momentum", momentum),
            )
        inputs = (input, scale, bias, epsilon)
        return forward(self, "batchnorm", norm_forward_phase, inputs, name, running)

    def layernorm_backward(
        self,
        grad: Tensor,
        input: Tensor,
        scale: Tensor,
        mean: Tensor,
        inv_variance: Tensor,
        *,
        name: str | None = None,
    ) -> tuple:
        """``(dx, dscale, dbias)`` of :meth:`layernorm` from its saved statistics."""
        return backward(self, "layernorm", (grad, input, scale), (mean, inv_variance), name)

    def rmsnorm_backward(
        self,
        grad: Tensor,
        input: Tensor,
        scale: Tensor,
        inv_variance: Tensor,
        has_dbias: bool = False,
        *,
        name: str | None = None,
    ) -> tuple:
        """``(dx, dscale, dbias)`` of :meth:`rmsnorm` (dbias None unless *has_dbias*)."""
        inputs = (grad, input, scale)
        return backward(self, "rmsnorm", inputs, (None, inv_variance), name, has_dbias)

    def instancenorm_backward(
        self,
        grad: Tensor,
        input: Tensor,
        scale: Tensor,
        mean: Tensor,
        inv_variance: Tensor,
        *,
        name: str | None = None,
    ) -> tuple:
        """``(dx, dscale, dbias)`` of :meth:`instancenorm`."""
        inputs = (grad, input, scale)
        return backward(self, "instancenorm", inputs, (mean, inv_variance), name)

    def batchnorm_backward(
        self,
        grad: Tensor,
        input: Tensor,
        scale: Tensor,
        mean: Tensor,
        inv_variance: Tensor,
        *,
        name: str | None = None,
    ) -> tuple:
        """``(dx, dscale, dbias)`` of :meth:`batchnorm`."""
        return backward(self, "batchnorm", (grad, input, scale), (mean, inv_variance), name)
