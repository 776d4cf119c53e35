"""Activations (imports torch): ``ReLU``, ``Sigmoid``, ``Tanh``, ``ELU``, ``SiLU``, ``Hardtanh``
(as a clipped ReLU) and ``ReLU6`` on ``dnn_activation`` / ``dnn_activation_grad``, and the
``autograd.Function`` over them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..highlevel import dnn_activation, dnn_activation_grad
from . import _lean
from ._compile import compiling, define, differentiable
from ._module import Converted
from ._runtime import FIRST_USE, bump_version, cuda_ok, dense, format_of, ready, stream_of

__all__ = [
    "ELU",
    "ActFn",
    "Hardtanh",
    "ReLU",
    "ReLU6",
    "SiLU",
    "Sigmoid",
    "Tanh",
    "Y_ONLY",
    "act_forward",
    "act_grad_run",
    "act_run",
    "op_act",
    "op_act_grad",
]

_FWD, _BWD = "act_fwd", "act_bwd"  # the lean path's tags (a part of each signature)

# modes whose gradient cuDNN reads from y alone: in place, y stands in for x
Y_ONLY = ("relu", "sigmoid", "tanh", "clipped_relu")


def _forward_slow(x, mode, coef, y, s) -> None:
    dnn_activation(x, mode, coef, out=y, stream=s)


def _backward_slow(y, dy, x, mode, coef, dx, s) -> None:
    dnn_activation_grad(y, dy, x, mode, coef, out=dx, stream=s)


def act_run(x: torch.Tensor, mode: str, coef: float, inplace: bool) -> torch.Tensor:
    """``dnn_activation`` of dense *x* into a new tensor in its memory format (or into *x*, with
    *inplace*), on the lean path (:mod:`._lean`)."""
    y = x if inplace else torch.empty_like(x)
    s = stream_of(x)
    _lean.launch((_FWD, mode, coef, inplace), (x, y), s, _forward_slow, x, mode, coef, y, s)
    return y


def _torch_grad(mode: str, coef: float, x: Any, y: Any, dy: Any) -> Any:
    """The activations' gradients as torch computes them (its own kernels; from y where the mode
    allows it): for what cuDNN's legacy activation backward has no kernel for."""
    if mode == "relu":
        return torch.ops.aten.threshold_backward(dy, y, 0)
    if mode == "clipped_relu":
        return dy * ((y > 0) & (y < coef))
    if mode == "sigmoid":
        return torch.ops.aten.sigmoid_backward(dy, y)
    if mode == "tanh":
        return torch.ops.aten.tanh_backward(dy, y)
    if mode == "elu":
        return dy * torch.where(x > 0, torch.ones_like(y), y + coef)
    if mode == "swish":
        if coef == 1.0:  # SiLU: torch's one fused kernel (the formula below is eight launches)
            return torch.ops.aten.silu_backward(dy, x)
        sg = torch.sigmoid(coef * x)
        return dy * (sg + coef * x * sg * (1 - sg))
    return dy


def act_grad_run(x: torch.Tensor, y: torch.Tensor, dy: torch.Tensor, cfg: tuple) -> torch.Tensor:
    """The activation's input gradient from the forward's *x* and *y* and the gradient *dy*,
    *cfg* ``(mode, coef, inplace)``: ``dnn_activation_grad`` on the lean path, or torch's
    computation where cuDNN has no kernel."""
    mode, coef, inplace = cfg
    if dy.dtype != y.dtype or y.dtype == torch.bfloat16 or (mode == "clipped_relu" and inplace):
        # cuDNN's legacy activation backward has no bfloat16 kernel (NOT_SUPPORTED on an
        # H100, cuDNN 9.19) and takes one dtype; its clipped-ReLU gradient keeps dy where
        # x == coef: after an in-place forward x is the clipped output, equal to coef
        # exactly where it clipped
        return _torch_grad(mode, coef, x, y, dy)
    dy = dense(dy)
    if dy.stride() != y.stride():  # cuDNN's activation backward takes one layout
        dy = dy.contiguous(memory_format=format_of(y))
    dx = torch.empty_like(y)
    s = stream_of(dy)
    ops = (y, dy, x, dx)
    _lean.launch((_BWD, mode, coef), ops, s, _backward_slow, y, dy, x, mode, coef, dx, s)
    return dx


# -- torch.compile: pycudnn::act and pycudnn::act_grad (out of place) ------------------------------
def _op_act(x: torch.Tensor, mode: str, coef: float) -> torch.Tensor:
    ready()
    return act_run(dense(x), mode, coef, False)


def _op_act_fake(x, mode, coef):
    return torch.empty_like(x)


def _op_grad(
    x: torch.Tensor, y: torch.Tensor, dy: torch.Tensor, mode: str, coef: float, y_only: bool
) -> torch.Tensor:
    """*y_only*: *x* is the output too (the modes whose gradient reads only y, as after an
    in-place forward)."""
    if FIRST_USE[0]:  # the first use only (no call on the hot path)
        ready()
    dx = act_grad_run(x, y, dy, (mode, coef, y_only))
    if dx.dtype != y.dtype or dx.stride() != y.stride():  # torch's gradient: the fake's layout
        dx = torch.empty_like(y).copy_(dx)
    return dx


def _op_grad_fake(x, y, dy, mode, coef, y_only):
    return torch.empty_like(y)


def _grad(x, y, dy, mode, coef, y_only) -> torch.Tensor:
    """The gradient's eager function: :func:`act_grad_run` (autograd takes its layout)."""
    return act_grad_run(x, y, dy, (mode, coef, y_only))


def _act_eager(x: torch.Tensor, mode: str, coef: float, inplace: bool) -> torch.Tensor:
    """The eager forward: :func:`act_run`, in place (into *x*) where *inplace*."""
    return act_run(x, mode, coef, inplace)


def _act_setup(ctx, inputs, output) -> None:
    x, mode, coef = inputs[:3]
    if inputs[3:] and inputs[3]:  # an eager in-place forward: x is the output now
        ctx.mark_dirty(x)
    # the modes whose gradient reads y alone keep y only: the forward's input may then be
    # overwritten (an in-place module copies the output into it)
    y_only = mode in Y_ONLY
    ctx.save_for_backward(output if y_only else x, output)
    ctx.cfg = (mode, coef, y_only)


def _act_backward(ctx, dy):
    x, y = ctx.saved_tensors
    grads = (ctx.gradient(op_act_grad, _grad, x, y, dy, *ctx.cfg), None, None)
    return grads + (None,) * (len(ctx.needs_input_grad) - 3)  # (an eager call's inplace flag)


#: ``ActFn.apply(x, mode, coef, inplace)`` (eager; in place where *inplace*) and
#: ``pycudnn::act(x, mode, coef)`` (:func:`act_run` out of place): one backward
ActFn, op_act = differentiable(
    "act", _op_act, _op_act_fake, _act_setup, _act_backward, eager_run=_act_eager
)
#: ``pycudnn::act_grad(x, y, dy, mode, coef, y_only)``: :func:`act_grad_run`
op_act_grad = define("act_grad", _op_grad, _op_grad_fake)


def act_forward(x: torch.Tensor, mode: str, coef: float, inplace: bool, fallback: Callable) -> Any:
    """``dnn_activation`` for CUDA inputs it takes (in place where the gradient allows), else
    *fallback* (torch's). Activations are not on autocast's lists: they run in the input's
    dtype, as torch's."""
    if not cuda_ok(x) or x.dim() > 8:
        return fallback(x)
    if compiling():  # out of place, copied back for in-place modules (functionalized)
        y = op_act(dense(x), mode, coef)
        return x.copy_(y) if inplace and mode in Y_ONLY else y
    ready()
    inplace = inplace and mode in Y_ONLY
    if not inplace:
        x = dense(x)
    elif not (x.is_contiguous() or x.is_contiguous(memory_format=format_of(x))):
        return fallback(x)  # in place on a strided view: torch's
    if torch.is_grad_enabled() and (x.requires_grad or inplace):
        return ActFn.apply(x, mode, coef, inplace)  # in place: mark_dirty bumps the version
    y = act_run(x, mode, coef, inplace)
    if inplace and not x.is_inference():
        bump_version(x)  # as torch's in-place ops do (a saved copy's check sees it)
    return y


class ReLU(Converted, nn.ReLU):
    """``torch.nn.ReLU`` on ``dnn_activation('relu')`` (in place with ``inplace=True``)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.ReLU.forward``."""
        return act_forward(input, "relu", 0.0, self.inplace, super().forward)


class Sigmoid(Converted, nn.Sigmoid):
    """``torch.nn.Sigmoid`` on ``dnn_activation('sigmoid')``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.Sigmoid.forward``."""
        return act_forward(input, "sigmoid", 0.0, False, super().forward)


class Tanh(Converted, nn.Tanh):
    """``torch.nn.Tanh`` on ``dnn_activation('tanh')``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.Tanh.forward``."""
        return act_forward(input, "tanh", 0.0, False, super().forward)


class ELU(Converted, nn.ELU):
    """``torch.nn.ELU`` on ``dnn_activation('elu', coef=alpha)`` (``inplace`` computes out of
    place: cuDNN's ELU gradient reads the input)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.ELU.forward``."""
        return act_forward(input, "elu", float(self.alpha), False, super().forward)


class SiLU(Converted, nn.SiLU):
    """``torch.nn.SiLU`` on ``dnn_activation('swish', coef=1)`` (``inplace`` computes out of
    place: the gradient reads the input)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.SiLU.forward``."""
        return act_forward(input, "swish", 1.0, False, super().forward)


class Hardtanh(Converted, nn.Hardtanh):
    """``torch.nn.Hardtanh(0, max_val)`` on ``dnn_activation('clipped_relu', coef=max_val)``;
    other ``min_val`` are not clipped ReLUs (left unconverted)."""

    @classmethod
    def unsupported(cls, module: nn.Module) -> str | None:
        m: Any = module
        if m.min_val != 0 or m.max_val <= 0:
            return (
                f"Hardtanh(min_val={m.min_val}, max_val={m.max_val}) is a clipped ReLU only for "
                "min_val=0 and max_val > 0"
            )
        return None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.Hardtanh.forward``."""
        return act_forward(
            input, "clipped_relu", float(self.max_val), self.inplace, super().forward
        )


class ReLU6(Converted, nn.ReLU6):
    """``torch.nn.ReLU6`` on ``dnn_activation('clipped_relu', coef=6)``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.ReLU6.forward``."""
        return act_forward(input, "clipped_relu", 6.0, self.inplace, super().forward)
