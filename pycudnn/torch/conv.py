"""Convolutions (imports torch): ``Conv1d``, ``Conv2d``, ``Conv3d`` on ``dnn_conv`` /
``dnn_gradinput`` / ``dnn_gradweight`` (their ``3d`` variants for ``Conv3d``), and the
``autograd.Function`` over them.

The route: ``Conv2d.forward`` -> :func:`conv_forward` (autocast's casts) -> :class:`ConvFn` (no
autograd node when no gradient is wanted) -> :func:`conv_run` -> the lean path (:mod:`._lean`):
the call entry bound to the signature, or ``dnn_conv(x, w, bias=b, out=y)`` once to bind it. The
output is a ``torch.empty`` in the input's memory format.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..highlevel import (
    dnn_conv,
    dnn_conv3d,
    dnn_gradinput,
    dnn_gradinput3d,
    dnn_gradweight,
    dnn_gradweight3d,
)
from . import _lean
from ._compile import compiling, define, differentiable
from ._module import Converted, float_params
from ._runtime import FIRST_USE, autocast_dtype, cuda_ok, dense, format_of, like, ready, stream_of

__all__ = [
    "conv_options",
    "conv_out_shape",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvFn",
    "DgradFn",
    "conv_forward",
    "conv_pad",
    "conv_dgrad",
    "conv_into",
    "conv_run",
    "conv_wgrad",
    "op_conv",
    "op_conv_dgrad",
    "op_conv_wgrad",
]

# the lean path's tags of the three directions (a part of each signature)
_FWD, _DGRAD, _WGRAD = "conv_fwd", "conv_dgrad", "conv_wgrad"


def conv_options(pad: Any, stride: Any, dil: Any, groups: int, stream: int) -> dict[str, Any]:
    """The keyword arguments of the ``dnn_conv`` family for PyTorch's convolution (no flip)."""
    return {
        "border_mode": pad,
        "subsample": stride,
        "dilation": dil,
        "conv_mode": "cross",
        "num_groups": groups,
        "stream": stream,
    }


def conv_out_shape(x: torch.Tensor, w: torch.Tensor, cfg: tuple) -> tuple[int, ...]:
    """The output shape of the convolution of *x* with *w*, *cfg* ``(nd, pad, stride, dilation,
    groups)``."""
    _, pad, stride, dil, _ = cfg
    spatial = (
        (n + 2 * p - d * (k - 1) - 1) // s + 1
        for n, k, p, s, d in zip(x.shape[2:], w.shape[2:], pad, stride, dil, strict=True)
    )
    return (x.shape[0], w.shape[0], *spatial)


def _forward_slow(x, w, b, cfg, y, s) -> None:
    nd, pad, stride, dil, groups = cfg
    fwd = dnn_conv if nd == 2 else dnn_conv3d
    if b is None:
        fwd(x, w, out=y, **conv_options(pad, stride, dil, groups, s))
    else:
        fwd(x, w, bias=b, out=y, **conv_options(pad, stride, dil, groups, s))


def _dgrad_slow(w, dy, cfg, dx, s, beta=0.0) -> None:
    nd, pad, stride, dil, groups = cfg
    gradinput = dnn_gradinput if nd == 2 else dnn_gradinput3d
    opts = conv_options(pad, stride, dil, groups, s)
    if beta:
        opts["beta"] = beta
    gradinput(w, dy, tuple(dx.shape), out=dx, **opts)


def _wgrad_slow(x, dy, cfg, dw, s) -> None:
    nd, pad, stride, dil, groups = cfg
    gradweight = dnn_gradweight if nd == 2 else dnn_gradweight3d
    gradweight(x, dy, tuple(dw.shape), out=dw, **conv_options(pad, stride, dil, groups, s))


def conv_run(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, cfg: tuple) -> torch.Tensor:
    """The convolution of dense *x* with *w* (plus *b*, fused), *cfg* ``(nd, pad, stride,
    dilation, groups)``, into a new tensor in *x*'s memory format, on the lean path
    (:mod:`._lean`): the entry bound to this signature, or ``dnn_conv`` once."""
    return conv_into(x, w, b, like(conv_out_shape(x, w, cfg), x), cfg)


def conv_into(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, out: torch.Tensor, cfg: tuple
) -> torch.Tensor:
    """:func:`conv_run` into *out* (a transposed convolution's input gradient); returns it."""
    s = stream_of(x)
    ops = (x, w, out) if b is None else (x, w, b, out)
    _lean.launch((_FWD, cfg), ops, s, _forward_slow, x, w, b, cfg, out, s)
    return out


def conv_dgrad(
    w: torch.Tensor, dy: torch.Tensor, out: torch.Tensor, cfg: tuple, beta: float = 0.0
) -> torch.Tensor:
    """The backward-data convolution of *dy* with *w* into *out* (whose shape is the image's;
    a transposed convolution's forward), on the lean path; returns *out*. *beta* 1.0 adds it
    to what *out* holds (a gradient accumulated in place, as a launch program does)."""
    s = stream_of(dy)
    tag = (_DGRAD, cfg) if not beta else (_DGRAD, cfg, float(beta))
    _lean.launch(tag, (w, dy, out), s, _dgrad_slow, w, dy, cfg, out, s, beta)
    return out


def conv_wgrad(x: torch.Tensor, dy: torch.Tensor, w: torch.Tensor, cfg: tuple) -> torch.Tensor:
    """The backward-filter convolution of image *x* and gradient *dy* into a new tensor like
    *w*, on the lean path."""
    dw = torch.empty_like(w)
    s = stream_of(dy)
    _lean.launch((_WGRAD, cfg), (x, dy, dw), s, _wgrad_slow, x, dy, cfg, dw, s)
    return dw


# -- torch.compile: the same three directions as pycudnn:: custom ops ------------------------------
def _options(pad: Any, stride: Any, dil: Any, groups: int) -> tuple:
    """The op's options (lists) as the lean path keys them (tuples)."""
    return (tuple(pad), tuple(stride), tuple(dil), groups)


def _cfg(nd: int, pad: Any, stride: Any, dil: Any, groups: int) -> tuple:
    return (nd, *_options(pad, stride, dil, groups))


def _last(t: torch.Tensor) -> bool:
    """Dense *t* is channels-last (4-D or 5-D, not C-contiguous)."""
    return format_of(t) is not torch.contiguous_format


def _empty(shape: Any, like_t: torch.Tensor, last: bool) -> torch.Tensor:
    fmt = torch.contiguous_format
    if last:
        fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
    return torch.empty(shape, dtype=like_t.dtype, device=like_t.device, memory_format=fmt)


def _op_conv(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    pad: list[int],
    stride: list[int],
    dil: list[int],
    groups: int,
) -> torch.Tensor:
    ready()
    return conv_run(dense(x), w, b, _cfg(x.dim() - 2, pad, stride, dil, groups))


def _op_conv_fake(x, w, b, pad, stride, dil, groups):
    return like(conv_out_shape(x, w, _cfg(x.dim() - 2, pad, stride, dil, groups)), x)


def _dgrad(w, dy, shape, last, pad, stride, dil, groups) -> torch.Tensor:
    """The data gradient's eager function: *dy* dense, the options tuples (a backward's)."""
    cfg = (len(pad), pad, stride, dil, groups)
    return conv_dgrad(w, dy, _empty(shape, dy, last), cfg)


def _op_dgrad(
    w: torch.Tensor,
    dy: torch.Tensor,
    shape: list[int],
    last: bool,
    pad: list[int],
    stride: list[int],
    dil: list[int],
    groups: int,
) -> torch.Tensor:
    if FIRST_USE[0]:  # the first use only (no call on the hot path)
        ready()
    return _dgrad(w, dense(dy), shape, last, tuple(pad), tuple(stride), tuple(dil), groups)


def _op_dgrad_fake(w, dy, shape, last, pad, stride, dil, groups):
    return _empty(shape, dy, last)


def _wgrad(x, dy, w, pad, stride, dil, groups) -> torch.Tensor:
    """The weight gradient's eager function: *dy* dense, the options tuples (a backward's)."""
    return conv_wgrad(x, dy, w, (len(pad), pad, stride, dil, groups))


def _op_wgrad(
    x: torch.Tensor,
    dy: torch.Tensor,
    w: torch.Tensor,
    pad: list[int],
    stride: list[int],
    dil: list[int],
    groups: int,
) -> torch.Tensor:
    if FIRST_USE[0]:  # the first use only (no call on the hot path)
        ready()
    return _wgrad(dense(x), dense(dy), w, tuple(pad), tuple(stride), tuple(dil), groups)


def _op_wgrad_fake(x, dy, w, pad, stride, dil, groups):
    return torch.empty_like(w)


def _conv_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0], inputs[1])
    # an eager call passes the module's cfg (tuples) whole; the op its lists
    ctx.cfg = inputs[3][1:] if len(inputs) == 4 else _options(*inputs[3:7])
    ctx.has_bias = inputs[2] is not None


def _conv_backward(ctx, dy):
    x, w = ctx.saved_tensors
    need, cfg = ctx.needs_input_grad, ctx.cfg
    dy = dense(dy)
    dx = ctx.gradient(op_conv_dgrad, _dgrad, w, dy, x.shape, _last(x), *cfg) if need[0] else None
    dw = ctx.gradient(op_conv_wgrad, _wgrad, x, dy, w, *cfg) if need[1] else None
    db = dy.sum(dim=(0, *range(2, dy.dim()))) if ctx.has_bias and need[2] else None
    return (dx, dw, db) + _NONES[len(need) - 3]  # (an eager call's cfg, or the op's options)


#: the trailing Nones of a backward's gradients, by count
_NONES = tuple((None,) * n for n in range(16))


def _dgrad_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.cfg = _options(*inputs[4:8])


def _conv_fwd(g, w, b, pad, stride, dil, groups) -> torch.Tensor:
    """The forward convolution's eager function for a backward: *g* dense, tuples."""
    return conv_run(g, w, b, (len(pad), pad, stride, dil, groups))


def _dgrad_backward(ctx, g):
    """The backward-data convolution is linear in *w* and *dy* (a transposed convolution's
    forward): its gradients are the forward convolution of *g* and the backward-filter one."""
    w, dy = ctx.saved_tensors
    need, cfg = ctx.needs_input_grad, ctx.cfg
    g = dense(g)
    ddy = ctx.gradient(op_conv, _conv_fwd, g, w, None, *cfg) if need[1] else None
    dw = ctx.gradient(op_conv_wgrad, _wgrad, g, dy, w, *cfg) if need[0] else None
    return dw, ddy, None, None, None, None, None, None


#: ``ConvFn.apply(x, w, b, cfg)`` (eager; *x* dense, *cfg* the module's) and
#: ``pycudnn::conv(...)``: :func:`conv_run` (cross-correlation, PyTorch's convolution; the bias
#: fused), one backward: the two gradient convolutions and ``db = dy`` summed over N and space
ConvFn, op_conv = differentiable(
    "conv", _op_conv, _op_conv_fake, _conv_setup, _conv_backward, eager_run=conv_run
)
#: ``DgradFn.apply(w, dy, shape, channels_last, ...)`` (eager) and ``pycudnn::conv_dgrad(...)``:
#: :func:`conv_dgrad` into a new tensor of *shape* (a transposed convolution's forward; the
#: convolution's data gradient), one backward: the forward and backward-filter convolutions
DgradFn, op_conv_dgrad = differentiable(
    "conv_dgrad", _op_dgrad, _op_dgrad_fake, _dgrad_setup, _dgrad_backward
)
#: ``pycudnn::conv_wgrad(x, dy, w, ...)``: :func:`conv_wgrad`
op_conv_wgrad = define("conv_wgrad", _op_wgrad, _op_wgrad_fake)


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


def _grad_wanted(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and (
        x.requires_grad or w.requires_grad or (b is not None and b.requires_grad)
    )


def conv_forward(m: nn.modules.conv._ConvNd, x: torch.Tensor, nd: int) -> torch.Tensor:
    """*m*'s forward on cuDNN for CUDA inputs it takes, else torch's ``_conv_forward``.

    Under ``torch.autocast`` the input, weight and bias are cast to the autocast dtype first
    (torch's policy for convolutions); without a gradient to record no autograd node is made."""
    w, b = m.weight, m.bias
    pad = conv_pad(m, nd)
    if pad is None or not cuda_ok(x) or m.padding_mode != "zeros":
        return m._conv_forward(x, w, b)
    dt = autocast_dtype()
    if dt is not None and x.dtype != torch.float64:
        x, w = x.to(dt), w.to(dt)
        b = None if b is None else b.to(dt)
    if x.dtype != w.dtype or (b is not None and b.dtype != w.dtype):
        return m._conv_forward(x, w, b)
    traced = compiling()
    if not traced:
        ready()
    unbatched = x.dim() == nd + 1
    if unbatched:
        x = x.unsqueeze(0)
    stride, dil = tuple(m.stride), tuple(m.dilation)
    if nd == 1:  # as a 2-D convolution over (N, C, 1, L)
        x, w = dense(x).unsqueeze(2), w.unsqueeze(2)
        cfg = (2, (0, *pad), (1, *stride), (1, *dil), m.groups)
    else:
        x = dense(x)
        cfg = (nd, pad, stride, dil, m.groups)
    if traced:  # torch.compile: the custom op (its autograd registered with it)
        y = op_conv(x, w, b, *cfg[1:])
    elif _grad_wanted(x, w, b):
        y = ConvFn.apply(x, w, b, cfg)
    else:
        y = conv_run(x, w, b, cfg)
    if nd == 1:
        y = y.squeeze(2)
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
