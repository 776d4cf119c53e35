"""Softmax (imports torch): ``Softmax(dim=1)`` and ``LogSoftmax(dim=1)`` on ``dnn_softmax`` /
``dnn_softmax_grad`` (``mode='channel'``), and the ``autograd.Function`` over them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from ..highlevel import dnn_softmax, dnn_softmax_grad
from ._module import Converted
from ._runtime import HALVES, autocast_dtype, cuda_ok, dense, ready, stream_of

__all__ = ["LogSoftmax", "Softmax", "SoftmaxFn", "softmax_forward"]


class SoftmaxFn(torch.autograd.Function):
    """``dnn_softmax`` / ``dnn_softmax_grad`` over dim 1 (``algo`` ``'accurate'`` or ``'log'``)."""

    @staticmethod
    def forward(ctx, x, algo):
        ready()
        y = torch.empty_like(x)
        dnn_softmax(x, algo, "channel", out=y, stream=stream_of(x))
        ctx.save_for_backward(y)
        ctx.algo = algo
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        dy = dense(dy)
        dx = dnn_softmax_grad(
            dy, y, ctx.algo, "channel", out=torch.empty_like(y), stream=stream_of(dy)
        )
        return dx, None


def softmax_forward(x: torch.Tensor, algo: str, fallback: Callable) -> Any:
    """``dnn_softmax`` over dim 1 for CUDA inputs it takes, else *fallback* (torch's). Under
    ``torch.autocast`` a half input is computed in float32, as autocast runs softmax."""
    if not cuda_ok(x) or not 2 <= x.dim() <= 5:
        return fallback(x)
    if x.dtype in HALVES and autocast_dtype() is not None:
        x = x.float()
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
