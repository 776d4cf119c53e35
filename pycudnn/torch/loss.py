"""Cross-entropy (imports torch): ``CrossEntropyLoss`` with class-index targets on
``dnn_softmax(algo='log', mode='channel')`` (cudnn.torch's CrossEntropyCriterion and its
Spatial/Volumetric variants), and the ``autograd.Function`` of the whole loss.

The log-softmax over the channels runs on cuDNN; the negative log-likelihood (the gather at the
targets, ``ignore_index``, the class weights, the reduction) is a few torch operations in the
same ``autograd.Function``, whose backward is the closed form
``dx = (softmax - onehot(target)) * weight[target] * dloss`` (divided by the summed weights of
the kept targets for ``reduction='mean'``), zero where the target is ignored. The weighted sums
accumulate in float32 (float64 for float64 inputs), as torch's kernels do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from ..highlevel import dnn_softmax
from ._compile import compiling, eager_only
from ._module import Converted
from ._runtime import HALVES, autocast_dtype, cuda_ok, dense, ready, stream_of

__all__ = ["CrossEntropyFn", "CrossEntropyLoss", "cross_entropy_forward"]

_REDUCTIONS = ("mean", "sum", "none")


class CrossEntropyFn(torch.autograd.Function):
    """``dnn_softmax(algo='log')`` over dim 1, then the negative log-likelihood of the class
    indices *target* (``(N, d...)`` int64) with class weights *weight* (``(C,)`` or None),
    *ignore_index* and *reduction*; the gradient of the input only."""

    @staticmethod
    def forward(ctx, x, target, weight, ignore_index, reduction):
        ready()
        logp = torch.empty_like(x)
        dnn_softmax(x, "log", "channel", out=logp, stream=stream_of(x))
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        keep = target != ignore_index
        t = torch.where(keep, target, 0).unsqueeze(1)  # ignored entries read class 0, weight 0
        wt = keep.to(acc) if weight is None else weight.to(acc)[t.squeeze(1)] * keep
        loss = logp.gather(1, t).squeeze(1).to(acc).mul_(wt).neg_()
        total = None
        if reduction == "none":
            out = loss
        elif reduction == "sum":
            out = loss.sum()
        else:  # torch's mean: over the weights of the kept targets (NaN when none is kept)
            total = wt.sum()
            out = loss.sum() / total
        ctx.save_for_backward(logp, t, wt, total)
        return out.to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, dloss):
        logp, t, wt, total = ctx.saved_tensors
        acc = wt.dtype
        g = dloss.to(acc) * wt
        if total is not None:
            g = g / total
        dx = logp.to(acc, copy=True).exp_()  # logp is saved: never in place
        dx.scatter_add_(1, t, torch.full_like(t, -1, dtype=acc))
        dx.mul_(g.unsqueeze(1))
        return dx.to(logp.dtype), None, None, None, None


def _target_ok(x: torch.Tensor, target: Any) -> bool:
    """*target* holds class indices for *x*: int64 on *x*'s device, shaped ``(N, d...)``."""
    return (
        isinstance(target, torch.Tensor)
        and target.dtype == torch.int64
        and target.device == x.device
        and target.shape == x.shape[:1] + x.shape[2:]
    )


def cross_entropy_forward(
    m: nn.CrossEntropyLoss,
    x: torch.Tensor,
    target: torch.Tensor,
    fallback: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """*m*'s loss on cuDNN for batched CUDA inputs with class-index targets, else *fallback*
    (torch's ``forward``): probability targets, ``label_smoothing``, CPU tensors, 1-D
    (unbatched) or over 5-D inputs, and whatever torch would refuse."""
    if m.label_smoothing != 0 or m.reduction not in _REDUCTIONS or not cuda_ok(x):
        return fallback(x, target)
    xc, w = x, m.weight
    if autocast_dtype() is not None and x.dtype in HALVES:  # cross-entropy autocasts to float32
        xc = x.float()
        w = w if w is None or w.dtype == torch.float64 else w.float()
    ok = 2 <= xc.dim() <= 5 and xc.numel() > 0 and _target_ok(xc, target)
    if w is not None:
        ok = ok and cuda_ok(w) and w.dtype == xc.dtype and w.shape == xc.shape[1:2]
    if not ok:
        return fallback(x, target)
    return CrossEntropyFn.apply(dense(xc), target, w, m.ignore_index, m.reduction)


#: the loss run by Python under torch.compile (dynamo breaks its graph around it)
_loss_eager = eager_only(cross_entropy_forward)


class _CrossEntropyRule(Converted):
    """Cross-entropy's rule: no label smoothing (its targets are not one-hot)."""

    @classmethod
    def unsupported(cls, module: nn.Module) -> str | None:
        m: Any = module
        if m.label_smoothing != 0:
            return f"label_smoothing={m.label_smoothing} (class-index targets only, unsmoothed)"
        return None


class CrossEntropyLoss(_CrossEntropyRule, nn.CrossEntropyLoss):
    """``torch.nn.CrossEntropyLoss`` on ``dnn_softmax(algo='log', mode='channel')`` for
    class-index targets (``(N, C)`` and ``(N, C, d1, ...)`` inputs up to 5-D)."""

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.CrossEntropyLoss.forward``."""
        fwd = _loss_eager if compiling() else cross_entropy_forward
        return fwd(self, input, target, super().forward)
