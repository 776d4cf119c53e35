"""Local response normalization (imports torch): ``LocalResponseNorm`` on ``dnn_lrn`` /
``dnn_lrn_grad``, and the ``autograd.Function`` over them."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from ..highlevel import dnn_lrn, dnn_lrn_grad
from ._compile import compiling, eager_only
from ._module import Converted
from ._runtime import NO_BF16, cuda_ok, dense, ready, stream_of

__all__ = ["LRNFn", "LocalResponseNorm", "lrn_forward"]


class LRNFn(torch.autograd.Function):
    """``dnn_lrn`` / ``dnn_lrn_grad``."""

    @staticmethod
    def forward(ctx, x, n, alpha, beta, k):
        ready()
        y = torch.empty_like(x)
        dnn_lrn(x, n, alpha, beta, k, out=y, stream=stream_of(x))
        ctx.save_for_backward(x, y)
        ctx.cfg = (n, alpha, beta, k)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, y = ctx.saved_tensors
        dy = dense(dy)
        dx = dnn_lrn_grad(y, dy, x, *ctx.cfg, out=torch.empty_like(x), stream=stream_of(dy))
        return dx, None, None, None, None


class LocalResponseNorm(Converted, nn.LocalResponseNorm):
    """``torch.nn.LocalResponseNorm`` on ``dnn_lrn`` (odd sizes up to 16; float16, float32,
    float64)."""

    @classmethod
    def unsupported(cls, module: nn.Module) -> str | None:
        m: Any = module
        if m.size % 2 == 0 or not 1 <= m.size <= 16:
            return (
                f"size={m.size} (cuDNN's window matches torch's for odd sizes 1 to 15; even "
                "sizes are one channel off)"
            )
        if m.beta < 0.01 or m.k < 1e-5:
            return f"beta={m.beta}, k={m.k} (cuDNN needs beta >= 0.01 and k >= 1e-5)"
        if not all(math.isfinite(float(v)) for v in (m.alpha, m.beta, m.k)):
            return "non-finite alpha, beta or k"
        return None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.LocalResponseNorm.forward`` (eager only: under ``torch.compile`` dynamo
        breaks its graph around the call)."""
        fwd = _lrn_eager if compiling() else lrn_forward
        return fwd(self, input, super().forward)


def lrn_forward(m: nn.LocalResponseNorm, x: torch.Tensor, fallback: Any) -> torch.Tensor:
    """*m*'s forward on cuDNN for CUDA inputs it takes, else *fallback* (torch's)."""
    if not cuda_ok(x, NO_BF16) or not 3 <= x.dim() <= 5:
        return fallback(x)
    return LRNFn.apply(dense(x), int(m.size), float(m.alpha), float(m.beta), float(m.k))


_lrn_eager = eager_only(lrn_forward)
