"""Softmax (imports torch): ``Softmax(dim=1)`` and ``LogSoftmax(dim=1)`` on ``dnn_softmax`` /
``dnn_softmax_grad`` (``mode='channel'``), and the ``autograd.Function`` over them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..highlevel import dnn_softmax, dnn_softmax_grad
from ._compile import compiling, define, differentiable
from ._module import Converted
from ._runtime import FIRST_USE, HALVES, autocast_dtype, cuda_ok, dense, ready, stream_of

__all__ = [
    "LogSoftmax",
    "Softmax",
    "SoftmaxFn",
    "op_softmax",
    "op_softmax_grad",
    "softmax_forward",
    "softmax_grad_run",
    "softmax_run",
]


def softmax_run(x: torch.Tensor, algo: str) -> torch.Tensor:
    """``dnn_softmax`` over dim 1 of dense *x* into a new tensor like it."""
    ready()
    y = torch.empty_like(x)
    dnn_softmax(x, algo, "channel", out=y, stream=stream_of(x))
    return y


def softmax_grad_run(dy: torch.Tensor, y: torch.Tensor, algo: str) -> torch.Tensor:
    """``dnn_softmax_grad`` of the forward's output *y* and the gradient *dy*."""
    if dy.stride() != y.stride() or dy.dtype != y.dtype:  # one layout for both (no staging)
        dy = torch.empty_like(y).copy_(dy)
    return dnn_softmax_grad(dy, y, algo, "channel", out=torch.empty_like(y), stream=stream_of(dy))


# -- the operation, defined once: the eager Function and pycudnn::softmax ------------------------
def _op_softmax(x: torch.Tensor, algo: str) -> torch.Tensor:
    return softmax_run(dense(x), algo)


def _op_softmax_fake(x, algo):
    return torch.empty_like(x)


def _op_grad(dy: torch.Tensor, y: torch.Tensor, algo: str) -> torch.Tensor:
    if FIRST_USE[0]:  # the first use only (no call on the hot path)
        ready()
    return softmax_grad_run(dy, y, algo)


def _op_grad_fake(dy, y, algo):
    return torch.empty_like(y)


def _setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(output)
    ctx.algo = inputs[1]


def _backward(ctx, dy):
    (y,) = ctx.saved_tensors
    return ctx.gradient(op_softmax_grad, softmax_grad_run, dy, y, ctx.algo), None


#: ``SoftmaxFn.apply(x, algo)`` (eager) and ``pycudnn::softmax(x, algo)``: :func:`softmax_run`
#: over dim 1 (``algo`` ``'accurate'`` or ``'log'``), one backward
SoftmaxFn, op_softmax = differentiable("softmax", _op_softmax, _op_softmax_fake, _setup, _backward)
#: ``pycudnn::softmax_grad(dy, y, algo)``: :func:`softmax_grad_run`
op_softmax_grad = define("softmax_grad", _op_grad, _op_grad_fake)


def softmax_forward(x: torch.Tensor, algo: str, fallback: Callable) -> Any:
    """``dnn_softmax`` over dim 1 for CUDA inputs it takes, else *fallback* (torch's). Under
    ``torch.autocast`` a half input is computed in float32, as autocast runs softmax."""
    if not cuda_ok(x) or not 2 <= x.dim() <= 5:
        return fallback(x)
    if x.dtype in HALVES and autocast_dtype() is not None:
        x = x.float()
    if compiling():
        return op_softmax(dense(x), algo)
    return SoftmaxFn.apply(dense(x), algo)


class _SoftmaxRule(Converted):
    """Softmax's rule: over dim 1, cuDNN's channel softmax."""

    @classmethod
    def unsupported(cls, module: nn.Module) -> str | None:
        m: Any = module
        if m.dim != 1:
            return f"dim={m.dim} (cuDNN's channel softmax is over dim=1)"
        return None


class Softmax(_SoftmaxRule, nn.Softmax):
    """``torch.nn.Softmax(dim=1)`` on ``dnn_softmax(mode='channel')``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.Softmax.forward``."""
        return softmax_forward(input, "accurate", super().forward)


class LogSoftmax(_SoftmaxRule, nn.LogSoftmax):
    """``torch.nn.LogSoftmax(dim=1)`` on ``dnn_softmax(algo='log', mode='channel')``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.LogSoftmax.forward``."""
        return softmax_forward(input, "log", super().forward)
