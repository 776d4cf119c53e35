"""Transposed convolutions (imports torch): ``ConvTranspose1d``, ``ConvTranspose2d``,
``ConvTranspose3d`` on ``dnn_gradinput`` / ``dnn_conv`` / ``dnn_gradweight`` (their ``3d``
variants for ``ConvTranspose3d``), and the ``autograd.Function`` over them.

A transposed convolution is the backward-data pass of the convolution whose filters are its
weight ``(C_in, C_out / groups, k...)``: that convolution maps an "image" of the transposed
convolution's *output* shape to an "output" of its *input* shape. So the forward is
``y = dnn_gradinput(w, x, y_shape)``, the input gradient the forward convolution
``dx = dnn_conv(dy, w)`` and the weight gradient ``dw = dnn_gradweight(dy, x, w.shape)`` (the
image is ``dy``, the gradient ``x``); all cross-correlations with the module's padding, stride,
dilation and groups. ``output_padding`` (and ``forward(x, output_size=...)``) only lengthens the
image: ``y_shape`` carries it, and the convolution of that image still has ``x``'s size while
each ``output_padding`` is below its stride.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ._compile import compiling
from ._module import Converted, float_params
from ._runtime import autocast_dtype, cuda_ok, dense
from .conv import DgradFn, op_conv_dgrad

__all__ = [
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
    "conv_transpose_forward",
]

_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}


def _is_last(shape: tuple[int, ...], x: torch.Tensor, w: torch.Tensor) -> bool:
    """The output of *shape* is channels-last: *x* or *w* is."""
    fmt = _LAST.get(len(shape))
    return fmt is not None and any(
        t.dim() == len(shape) and not t.is_contiguous() and t.is_contiguous(memory_format=fmt)
        for t in (x, w)
    )


def _run(x, w, b, y_shape, cfg) -> torch.Tensor:
    """The transposed convolution: the backward-data convolution of *x* with *w* into the full
    output shape *y_shape* (``output_padding`` included) -- ``pycudnn::conv_dgrad`` while
    compiling, its eager Function (:data:`~.conv.DgradFn`, the same definition and backward:
    the forward and backward-filter convolutions) otherwise -- and the bias added after it;
    *cfg* is ``(nd, pad, stride, dilation, groups)`` with *nd* 2 or 3."""
    args = (w, x, list(y_shape), _is_last(y_shape, x, w), *cfg[1:])
    y = op_conv_dgrad(*args) if compiling() else DgradFn.apply(*args)
    return y if b is None else y + b.view((1, -1) + (1,) * cfg[0])


def _autocast(t: torch.Tensor | None, dt: torch.dtype | None) -> torch.Tensor | None:
    """*t* as autocast casts a lower-precision op's operand (float64 stays)."""
    if t is None or dt is None or t.dtype in (dt, torch.float64):
        return t
    return t.to(dt)


def conv_transpose_forward(
    m: nn.modules.conv._ConvTransposeNd,
    x: torch.Tensor,
    output_size: Sequence[int] | None,
    nd: int,
    fallback: Callable[[torch.Tensor, Any], torch.Tensor],
) -> torch.Tensor:
    """*m*'s forward (``output_size`` as torch's) on cuDNN for CUDA inputs it takes, else
    *fallback* (torch's ``forward(x, output_size)``)."""
    if not cuda_ok(x) or not nd + 1 <= x.dim() <= nd + 2 or m.padding_mode != "zeros":
        return fallback(x, output_size)
    dt = autocast_dtype()  # the operands in autocast's dtype first (torch's rule for the op)
    xc, w, b = _autocast(x, dt), _autocast(m.weight, dt), _autocast(m.bias, dt)
    if xc.dtype != w.dtype or x.shape[-nd - 1] != w.shape[0]:
        return fallback(x, output_size)  # torch's error
    pad, stride, dil, k = (list(v) for v in (m.padding, m.stride, m.dilation, m.kernel_size))
    opad = m._output_padding(x, output_size, stride, pad, k, nd, dil)
    spatial = tuple(
        (i - 1) * s - 2 * p + d * (kk - 1) + o + 1
        for i, s, p, d, kk, o in zip(xc.shape[-nd:], stride, pad, dil, k, opad, strict=True)
    )
    # torch pads past the last stride step there (output_padding < dilation), or raises
    if any(o >= s for o, s in zip(opad, stride, strict=True)) or min(spatial) < 1:
        return fallback(x, output_size)
    unbatched = x.dim() == nd + 1
    if unbatched:
        xc = xc.unsqueeze(0)
    y_shape = (xc.shape[0], w.shape[1] * m.groups, *spatial)
    pad, stride, dil = tuple(pad), tuple(stride), tuple(dil)
    if nd == 1:  # as a 2-D transposed convolution over (N, C, 1, L)
        x2, w2 = dense(xc).unsqueeze(2), w.unsqueeze(2)
        y4 = (*y_shape[:2], 1, *spatial)
        cfg = (2, (0, *pad), (1, *stride), (1, *dil), m.groups)
        y = _run(x2, w2, b, y4, cfg).squeeze(2)
    else:
        cfg = (nd, pad, stride, dil, m.groups)
        y = _run(dense(xc), w, b, y_shape, cfg)
    return y.squeeze(0) if unbatched else y


class _ConvTransposeRule(Converted):
    """The transposed convolutions' rule: zero padding, floating-point parameters."""

    @classmethod
    def unsupported(cls, module: nn.Module) -> str | None:
        m: nn.modules.conv._ConvTransposeNd = module  # type: ignore[assignment]
        if m.padding_mode != "zeros":
            return f"padding_mode={m.padding_mode!r} (cuDNN pads with zeros only)"
        if not all(isinstance(p, int) for p in m.padding):
            return f"padding={m.padding!r} (explicit integer padding only)"
        return float_params(m)


class ConvTranspose1d(_ConvTransposeRule, nn.ConvTranspose1d):
    """``torch.nn.ConvTranspose1d`` on ``dnn_gradinput`` (as a 2-D transposed convolution over
    ``(N, C, 1, L)``)."""

    def forward(self, input: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
        """As ``torch.nn.ConvTranspose1d.forward``."""
        return conv_transpose_forward(self, input, output_size, 1, super().forward)


class ConvTranspose2d(_ConvTransposeRule, nn.ConvTranspose2d):
    """``torch.nn.ConvTranspose2d`` on ``dnn_gradinput`` / ``dnn_conv`` / ``dnn_gradweight``."""

    def forward(self, input: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
        """As ``torch.nn.ConvTranspose2d.forward``."""
        return conv_transpose_forward(self, input, output_size, 2, super().forward)


class ConvTranspose3d(_ConvTransposeRule, nn.ConvTranspose3d):
    """``torch.nn.ConvTranspose3d`` on ``dnn_gradinput3d`` and its gradients."""

    def forward(self, input: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
        """As ``torch.nn.ConvTranspose3d.forward``."""
        return conv_transpose_forward(self, input, output_size, 3, super().forward)
