"""Convolutions (imports torch): ``Conv1d``, ``Conv2d``, ``Conv3d`` on ``dnn_conv`` /
``dnn_gradinput`` / ``dnn_gradweight`` (their ``3d`` variants for ``Conv3d``), and the
``autograd.Function`` over them.

The route is direct: ``Conv2d.forward`` -> :func:`conv_forward` -> :class:`ConvFn` ->
``dnn_conv`` (``dnn_conv3d`` for 3-D), the output back to torch by ``to_torch``.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from ..highlevel import (
    dnn_conv,
    dnn_conv3d,
    dnn_gradinput,
    dnn_gradinput3d,
    dnn_gradweight,
    dnn_gradweight3d,
)
from ._module import Converted, float_params
from ._runtime import cuda_ok, dense, ready, stream_of, to_torch

__all__ = ["FUSED_BIAS", "Conv1d", "Conv2d", "Conv3d", "ConvFn", "conv_forward", "conv_pad"]

# dnn_conv fuses the bias into the convolution once it takes bias= (the fused-epilogue work)
FUSED_BIAS = "bias" in inspect.signature(dnn_conv).parameters


def _options(pad: Any, stride: Any, dil: Any, groups: int, t: torch.Tensor) -> dict[str, Any]:
    """The keyword arguments of the ``dnn_conv`` family for PyTorch's convolution (no flip), on
    *t*'s stream."""
    return {
        "border_mode": pad,
        "subsample": stride,
        "dilation": dil,
        "conv_mode": "cross",
        "num_groups": groups,
        "stream": stream_of(t),
    }


conv_options = _options  # public for the transposed convolutions (conv_transpose.py)


class ConvFn(torch.autograd.Function):
    """``dnn_conv`` (cross-correlation, PyTorch's convolution) with its two gradients, on 2-D
    (*nd* 2) or 3-D (*nd* 3) inputs; the bias is fused when ``dnn_conv`` takes ``bias=``, its
    gradient is ``dy`` summed over N and space."""

    @staticmethod
    def forward(ctx, x, w, b, nd, pad, stride, dil, groups):
        ready()
        fwd = dnn_conv if nd == 2 else dnn_conv3d
        kw = _options(pad, stride, dil, groups, x)
        if b is not None and FUSED_BIAS:
            y = to_torch(fwd(x, w, bias=b, **kw))
        else:
            y = to_torch(fwd(x, w, **kw))
            if b is not None:
                y.add_(b.view((1, -1) + (1,) * nd))
        ctx.save_for_backward(x, w)
        ctx.cfg = (nd, pad, stride, dil, groups, b is not None)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        nd, pad, stride, dil, groups, has_bias = ctx.cfg
        dy = dense(dy)
        kw = _options(pad, stride, dil, groups, dy)
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            gradinput = dnn_gradinput if nd == 2 else dnn_gradinput3d
            dx = gradinput(w, dy, tuple(x.shape), out=torch.empty_like(x), **kw)
        if ctx.needs_input_grad[1]:
            gradweight = dnn_gradweight if nd == 2 else dnn_gradweight3d
            dw = gradweight(x, dy, tuple(w.shape), out=torch.empty_like(w), **kw)
        if has_bias and ctx.needs_input_grad[2]:
            db = dy.sum(dim=(0, *range(2, 2 + nd)))
        return dx, dw, db, None, None, None, None, None


def conv_pad(m: nn.modules.conv._ConvNd, nd: int) -> tuple[int, ...] | None:
    """Symmetric padding of *m* (None: torch's 'same' would be asymmetric)."""
    pad = m.padding
    if isinstance(pad, str):
        if pad == "valid":
            return (0,) * nd
        total = [d * (k - 1) for d, k in zip(m.dilation, m.kernel_size, strict=True)]
        if any(t % 2 for t in total):
            return None
        return tuple(t // 2 for t in total)
    return tuple(pad)


def conv_forward(m: nn.modules.conv._ConvNd, x: torch.Tensor, nd: int) -> torch.Tensor:
    """*m*'s forward on cuDNN for CUDA inputs it takes, else torch's ``_conv_forward``."""
    w, b = m.weight, m.bias
    pad = conv_pad(m, nd)
    if pad is None or not cuda_ok(x) or x.dtype != w.dtype or m.padding_mode != "zeros":
        return m._conv_forward(x, w, b)
    unbatched = x.dim() == nd + 1
    if unbatched:
        x = x.unsqueeze(0)
    stride, dil = tuple(m.stride), tuple(m.dilation)
    if nd == 1:  # as a 2-D convolution over (N, C, 1, L)
        x2, w2 = dense(x).unsqueeze(2), w.unsqueeze(2)
        y = ConvFn.apply(x2, w2, b, 2, (0, *pad), (1, *stride), (1, *dil), m.groups)
        y = y.squeeze(2)
    else:
        y = ConvFn.apply(dense(x), w, b, nd, pad, stride, dil, m.groups)
    return y.squeeze(0) if unbatched else y


class _ConvRule(Converted):
    """The convolutions' rule: zero padding, symmetric, floating-point parameters."""

    @classmethod
    def unsupported(cls, module: nn.Module) -> str | None:
        m: nn.modules.conv._ConvNd = module  # type: ignore[assignment]
        if m.padding_mode != "zeros":
            return f"padding_mode={m.padding_mode!r} (cuDNN pads with zeros only)"
        if conv_pad(m, len(m.kernel_size)) is None:
            return "padding='same' with an even dilated kernel pads asymmetrically"
        return float_params(m)


class Conv1d(_ConvRule, nn.Conv1d):
    """``torch.nn.Conv1d`` on ``dnn_conv`` (as a 2-D convolution over ``(N, C, 1, L)``)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.Conv1d.forward``."""
        return conv_forward(self, input, 1)


class Conv2d(_ConvRule, nn.Conv2d):
    """``torch.nn.Conv2d`` on ``dnn_conv`` / ``dnn_gradinput`` / ``dnn_gradweight``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.Conv2d.forward``."""
        return conv_forward(self, input, 2)


class Conv3d(_ConvRule, nn.Conv3d):
    """``torch.nn.Conv3d`` on ``dnn_conv3d`` and its gradients."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.Conv3d.forward``."""
        return conv_forward(self, input, 3)
