"""The conv-BN training fusion operations of NVIDIA's ResNet recipe: statistics generation
(``genstats``), batch-norm finalize (``bn_finalize``) and the batch-norm backward weights
(``dbn_weight``) -- their checks, per-channel output shapes and encoding -- and
:class:`ConvBnOperations`, the builder methods that add them.

cuDNN runs them only inside its fused patterns (``docs/graph.md``, "Conv-BN training fusion
operations"): a convolution whose output feeds ``genstats`` (optionally after a scale-bias-ReLU
prologue on its input), ``bn_finalize`` alone, and a data gradient followed by a ReLU backward
and ``dbn_weight``. Every per-channel tensor is ``(1, C, 1, ...)`` float32.
"""

from __future__ import annotations

import math
from typing import Any

from ... import errors
from ...enums import BackendAttributeName as A
from ...enums import BackendAttributeType as T
from ...enums import BackendDescriptorType as D
from ...enums import BnFinalizeStatsMode, DataType, GenStatsMode
from .._tensor import GraphBase, Tensor
from ._base import NodeKind, Scalar, channel_strides

__all__ = [
    "BN_FINALIZE_VERIFIED",
    "KINDS",
    "ConvBnOperations",
    "bn_finalize",
    "dbn_weight",
    "genstats",
]

#: Whether the builder serves ``bn_finalize``: verified against torch on cuDNN 9.19 (H200) once
#: its per-channel tensors are described with cudnn-frontend's strides
#: (:func:`~._base.channel_strides`); with every stride 1 -- what ``Graph.tensor_like`` gives a
#: ``(1, C, 1, 1)`` tensor, whose size-1 dims address nothing -- its engine read and wrote 1 of
#: C channels (docs/graph.md). Set it to False to refuse the operation again
BN_FINALIZE_VERIFIED = True

_F32 = DataType.FLOAT


def _channels_dim(x: Tensor) -> tuple[int, ...]:
    """The per-channel dims ``(1, C, 1, ...)`` of an ``(N, C, *spatial)`` tensor."""
    return (1, x._dim[1], *(1,) * (len(x._dim) - 2))


def _check_activation(g: GraphBase, op: str, argument: str, x: Tensor) -> None:
    """*x* is an ``(N, C, *spatial)`` activation: 3 to 8 dims."""
    if len(x._dim) < 3:
        raise ValueError(
            f"{g.name}.{op}: {argument} must have dims (N, C, *spatial) (at least 3), got {x._dim}"
        )


def _check_channels(g: GraphBase, op: str, named: tuple, want: tuple[int, ...]) -> None:
    """Each ``(argument, tensor)`` of *named* has the per-channel dims *want*."""
    for argument, t in named:
        if t._dim != want:
            raise ValueError(
                f"{g.name}.{op}: {argument} ({t._name!r}) must have the per-channel dims "
                f"{want}, got {t._dim}"
            )


def _check_scalar(g: GraphBase, op: str, argument: str, t: Tensor) -> None:
    if math.prod(t._dim) != 1:
        raise ValueError(
            f"{g.name}.{op}: {argument} ({t._name!r}) must be a scalar (all dims 1), got {t._dim}"
        )


def _stat(g: GraphBase, op: str, name: str | None, like: Tensor) -> Tensor:
    """A float32 per-channel output of *op*, in *like*'s memory order (NHWC: (C, 1, C, C))."""
    return g._out(op, name, _channels_dim(like), like, _F32)


def genstats(g: GraphBase, input: Any, compute: Any, name: str | None) -> tuple[Tensor, Tensor]:
    """``(sum, sq_sum)`` per channel of ``input`` (N, C, *spatial): float32 (1, C, 1, ...)."""
    op = "genstats"
    x = g._check(op, "input", input)
    _check_activation(g, op, "input", x)
    s = {"mode": int(GenStatsMode.SQSUM), "compute_data_type": int(g._compute(compute, op))}
    total = _stat(g, op, name and f"{name}::sum", x)
    sq = _stat(g, op, name and f"{name}::sq_sum", x)
    roles = [
        ("OPERATION_GENSTATS_XDESC", x),
        ("OPERATION_GENSTATS_SUMDESC", total),
        ("OPERATION_GENSTATS_SQSUMDESC", sq),
    ]
    g._node(op, name or op, s, roles)
    return total, sq


def bn_finalize(
    g: GraphBase, stats: tuple, params: tuple, running: tuple, name: str | None
) -> tuple[Tensor, ...]:
    """Batch-norm statistics from per-channel sums: ``stats = (sum, sq_sum, accum_count)``,
    ``params = (scale, bias, epsilon)``, ``running = (prev_running_mean, prev_running_var,
    momentum)``. Returns ``(eq_scale, eq_bias, saved_mean, saved_inv_std, next_running_mean,
    next_running_var)``, float32 per channel."""
    op = "bn_finalize"
    names = "sum sq_sum accum_count scale bias epsilon prev_running_mean prev_running_var momentum"
    given = (*stats, *params, *running)
    total, sq, count, scale, bias, eps, r_mean, r_var, momentum = (
        g._check(op, nm, t) for nm, t in zip(names.split(), given, strict=True)
    )
    if not BN_FINALIZE_VERIFIED:
        raise errors.NotSupportedError(
            3000,
            f"{g.name}.{op}",
            "refused (pycudnn.graph.nodes.bn_fusion.BN_FINALIZE_VERIFIED is False)",
        )
    if len(total._dim) < 2 or any(d != 1 for i, d in enumerate(total._dim) if i != 1):
        raise ValueError(
            f"{g.name}.{op}: sum ({total._name!r}) must have per-channel dims (1, C, 1, ...), "
            f"got {total._dim}"
        )
    per_channel = (
        ("sq_sum", sq),
        ("scale", scale),
        ("bias", bias),
        ("prev_running_mean", r_mean),
        ("prev_running_var", r_var),
    )
    _check_channels(g, op, per_channel, total._dim)
    for argument, t in (("accum_count", count), ("epsilon", eps), ("momentum", momentum)):
        _check_scalar(g, op, argument, t)
    for t in (total, sq, scale, bias, r_mean, r_var):
        channel_strides(t)
    if count._dtype != DataType.INT64:
        got = count._dtype.name if count._dtype is not None else "unset"
        raise TypeError(
            f"{g.name}.{op}: accum_count ({count._name!r}) must be an int64 scalar (how many "
            f"values each channel's sums add up, N*H*W: g.scalar(n, 'int64')), got data type {got}"
        )
    for t in (count, eps, momentum):  # a by-value scalar takes the operation's rank
        if t._by_value and len(t._dim) != len(total._dim):
            t._dim = t._stride = (1,) * len(total._dim)
    outs = tuple(
        _stat(g, op, name and f"{name}::{out}", total)
        for out in ("eq_scale", "eq_bias", "mean", "inv_variance")
    )
    nxt_mean = _stat(g, op, name and f"{name}::next_running_mean", total)
    nxt_var = _stat(g, op, name and f"{name}::next_running_var", total)
    roles = [
        ("OPERATION_BN_FINALIZE_Y_SUM_DESC", total),
        ("OPERATION_BN_FINALIZE_Y_SQ_SUM_DESC", sq),
        ("OPERATION_BN_FINALIZE_SCALE_DESC", scale),
        ("OPERATION_BN_FINALIZE_BIAS_DESC", bias),
        ("OPERATION_BN_FINALIZE_PREV_RUNNING_MEAN_DESC", r_mean),
        ("OPERATION_BN_FINALIZE_PREV_RUNNING_VAR_DESC", r_var),
        ("OPERATION_BN_FINALIZE_EPSILON_DESC", eps),
        ("OPERATION_BN_FINALIZE_EXP_AVERATE_FACTOR_DESC", momentum),
        ("OPERATION_BN_FINALIZE_ACCUM_COUNT_DESC", count),
        ("OPERATION_BN_FINALIZE_EQ_SCALE_DESC", outs[0]),
        ("OPERATION_BN_FINALIZE_EQ_BIAS_DESC", outs[1]),
        ("OPERATION_BN_FINALIZE_SAVED_MEAN_DESC", outs[2]),
        ("OPERATION_BN_FINALIZE_SAVED_INV_STD_DESC", outs[3]),
        ("OPERATION_BN_FINALIZE_UPDATED_RUNNING_MEAN_DESC", nxt_mean),
        ("OPERATION_BN_FINALIZE_UPDATED_RUNNING_VAR_DESC", nxt_var),
    ]
    s = {"mode": int(BnFinalizeStatsMode.TRAINING), "compute_data_type": int(_F32)}
    g._node(op, name or op, s, roles)
    return (*outs, nxt_mean, nxt_var)


def dbn_weight(g: GraphBase, inputs: tuple, saved: tuple, name: str | None) -> tuple[Tensor, ...]:
    """Batch-norm backward weights from ``inputs = (dy, x)`` (the gradient of the batch norm's
    output and its input, (N, C, *spatial)) and ``saved = (mean, inv_variance, scale)`` (per
    channel). Returns ``(dscale, dbias, eq_scale_dy, eq_scale_x, eq_bias)``, float32 per
    channel: ``dx = eq_scale_dy * dy + eq_scale_x * x + eq_bias``."""
    op = "dbn_weight"
    dy = g._check(op, "grad", inputs[0])
    x = g._check(op, "input", inputs[1])
    mean = g._check(op, "mean", saved[0])
    inv = g._check(op, "inv_variance", saved[1])
    scale = g._check(op, "scale", saved[2])
    _check_activation(g, op, "input", x)
    if dy._dim != x._dim:
        raise ValueError(
            f"{g.name}.{op}: grad {dy._dim} and input {x._dim} must have the same dims"
        )
    per_channel = (("mean", mean), ("inv_variance", inv), ("scale", scale))
    _check_channels(g, op, per_channel, _channels_dim(x))
    outs = tuple(
        _stat(g, op, name and f"{name}::{out}", x)
        for out in ("dscale", "dbias", "eq_scale_dy", "eq_scale_x", "eq_bias")
    )
    roles = [
        ("OPERATION_BN_BWD_WEIGHTS_X_DESC", x),
        ("OPERATION_BN_BWD_WEIGHTS_DY_DESC", dy),
        ("OPERATION_BN_BWD_WEIGHTS_MEAN_DESC", mean),
        ("OPERATION_BN_BWD_WEIGHTS_INVSTD_DESC", inv),
        ("OPERATION_BN_BWD_WEIGHTS_BN_SCALE_DESC", scale),
        ("OPERATION_BN_BWD_WEIGHTS_DBN_SCALE_DESC", outs[0]),
        ("OPERATION_BN_BWD_WEIGHTS_DBN_BIAS_DESC", outs[1]),
        ("OPERATION_BN_BWD_WEIGHTS_EQ_DY_SCALE_DESC", outs[2]),
        ("OPERATION_BN_BWD_WEIGHTS_EQ_X_SCALE_DESC", outs[3]),
        ("OPERATION_BN_BWD_WEIGHTS_EQ_BIAS", outs[4]),
    ]
    g._node(op, name or op, {"compute_data_type": int(_F32)}, roles)
    return outs


class ConvBnOperations(GraphBase):
    """The builder methods of the conv-BN training fusion operations (a base of
    :class:`~pycudnn.graph.Graph`; cudnn-frontend's names and argument order)."""

    def genstats(
        self, input: Tensor, *, compute_data_type: Any = None, name: str | None = None
    ) -> tuple[Tensor, Tensor]:
        """Per-channel sum and sum of squares of *input* (N, C, *spatial), cuDNN's statistics
        generation (``SUM_SQSUM``) fused after a convolution.

        Parameters
        ----------
        input : Tensor
            Usually a :meth:`conv_fprop` output.
        compute_data_type : dtype-like, optional
            The operation's math precision; default the graph's.
        name : str, optional
            Names the node and its outputs (``name::sum``, ``name::sq_sum``).

        Returns
        -------
        tuple of Tensor
            ``(sum, sq_sum)``, float32 (1, C, 1, ...), virtual until ``set_output(True)``.
        """
        return genstats(self, input, compute_data_type, name)

    def bn_finalize(
        self,
        sum: Tensor,
        sq_sum: Tensor,
        scale: Tensor,
        bias: Tensor,
        epsilon: Tensor,
        accum_count: Tensor,
        *,
        prev_running_mean: Tensor,
        prev_running_var: Tensor,
        momentum: Tensor,
        name: str | None = None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Batch-norm training statistics from :meth:`genstats`' sums (cuDNN's BN finalize):
        ``mean = sum / accum_count``, ``inv_std = 1 / sqrt(sq_sum / accum_count - mean**2 +
        epsilon)``, ``eq_scale = scale * inv_std``, ``eq_bias = bias - mean * eq_scale`` and
        the running statistics moved by *momentum*.

        Parameters
        ----------
        sum, sq_sum : Tensor
            Per-channel (1, C, 1, ...) float32 sums.
        scale, bias : Tensor
            The batch norm's weight and bias, per channel.
        epsilon : Tensor
            Scalar added to the variance (:meth:`scalar`).
        accum_count : Tensor
            int64 scalar: how many values each channel's sums add up (N * H * W):
            ``g.scalar(n, "int64")``.
        prev_running_mean, prev_running_var : Tensor
            The running statistics before this step, per channel.
        momentum : Tensor
            Scalar exponential-average factor of the running statistics.
        name : str, optional
            Names the node and its outputs.

        Returns
        -------
        tuple of Tensor
            ``(eq_scale, eq_bias, saved_mean, saved_inv_std, next_running_mean,
            next_running_var)``, float32 per channel, virtual until ``set_output(True)``.
        """
        stats = (sum, sq_sum, accum_count)
        running = (prev_running_mean, prev_running_var, momentum)
        return bn_finalize(self, stats, (scale, bias, epsilon), running, name)  # type: ignore[return-value]

    def dbn_weight(
        self,
        grad: Tensor,
        input: Tensor,
        mean: Tensor,
        inv_variance: Tensor,
        scale: Tensor,
        *,
        name: str | None = None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Batch-norm backward weights (cuDNN's BN backward weights): the gradients of the
        batch norm's scale and bias and the per-channel coefficients of its input gradient.

        Parameters
        ----------
        grad : Tensor
            The gradient of the batch norm's output (N, C, *spatial), e.g. a ReLU backward
            of a :meth:`conv_dgrad` output.
        input : Tensor
            The batch norm's input (the forward convolution's output), *grad*'s dims.
        mean, inv_variance : Tensor
            The forward's saved statistics (:meth:`bn_finalize`), per channel.
        scale : Tensor
            The batch norm's weight, per channel.
        name : str, optional
            Names the node and its outputs.

        Returns
        -------
        tuple of Tensor
            ``(dscale, dbias, eq_scale_dy, eq_scale_x, eq_bias)``, float32 per channel:
            ``dx = eq_scale_dy * grad + eq_scale_x * input + eq_bias``.
        """
        return dbn_weight(self, (grad, input), (mean, inv_variance, scale), name)  # type: ignore[return-value]


_MATH = Scalar(A.OPERATION_GENSTATS_MATH_PREC, "compute_data_type", T.DATA_TYPE, DataType)

KINDS = {
    "genstats": NodeKind(
        D.OPERATION_GEN_STATS_DESCRIPTOR,
        None,
        (Scalar(A.OPERATION_GENSTATS_MODE, "mode", T.GENSTATS_MODE, GenStatsMode), _MATH),
    ),
    "bn_finalize": NodeKind(
        D.OPERATION_BN_FINALIZE_STATISTICS_DESCRIPTOR,
        None,
        (
            Scalar(
                A.OPERATION_BN_FINALIZE_STATS_MODE,
                "mode",
                T.BN_FINALIZE_STATS_MODE,
                BnFinalizeStatsMode,
            ),
            _MATH._replace(attribute=A.OPERATION_BN_FINALIZE_MATH_PREC),
        ),
    ),
    "dbn_weight": NodeKind(
        D.OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR,
        None,
        (_MATH._replace(attribute=A.OPERATION_BN_BWD_WEIGHTS_MATH_PREC),),
    ),
}
