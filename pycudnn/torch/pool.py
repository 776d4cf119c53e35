"""Pooling (imports torch): ``MaxPool2d``/``3d`` and ``AvgPool2d``/``3d`` on ``dnn_pool`` /
``dnn_pool_grad``, and the ``autograd.Function`` over them. 2-D max pooling of channels-last
data that :mod:`.pool_kernel` takes runs on pycudnn's own kernels instead (its backward keeps a
byte per pooled element, not the input and the output)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..highlevel import dnn_pool, dnn_pool_grad
from . import _lean, pool_kernel
from ._compile import compiling, constant, define, differentiable
from ._module import Converted
from ._runtime import FIRST_USE, as_tuple, cuda_ok, dense, like, ready, stream_of

__all__ = [
    "AvgPool2d",
    "AvgPool3d",
    "MaxPool2d",
    "MaxPool3d",
    "MaxPoolFn",
    "PoolFn",
    "op_max_pool",
    "op_max_pool_grad",
    "op_pool",
    "op_pool_grad",
    "pool_forward",
    "pool_grad_run",
    "pool_run",
]

_FWD, _BWD = "pool_fwd", "pool_bwd"  # the lean path's tags (a part of each signature)


def _forward_slow(x, cfg, y, s) -> None:
    ws, stride, pad, mode = cfg
    dnn_pool(x, ws, stride, mode, pad, out=y, stream=s)


def _backward_slow(x, y, dy, cfg, dx, s) -> None:
    ws, stride, pad, mode = cfg
    dnn_pool_grad(x, y, dy, ws, stride, mode, pad, img_grad=dx, stream=s)


def pool_run(x: torch.Tensor, cfg: tuple) -> torch.Tensor:
    """Pool dense *x* (*cfg* ``(window, stride, pad, mode)``) into a new tensor in *x*'s memory
    format, on the lean path (:mod:`._lean`)."""
    y = like(pool_kernel.out_shape(tuple(x.shape), cfg), x)
    s = stream_of(x)
    _lean.launch((_FWD, cfg), (x, y), s, _forward_slow, x, cfg, y, s)
    return y


def pool_grad_run(x: torch.Tensor, y: torch.Tensor, dy: torch.Tensor, cfg: tuple) -> torch.Tensor:
    """``dnn_pool_grad`` of the forward's *x* and *y* and the gradient *dy* into a new tensor
    like *x*, on the lean path."""
    dy = dense(dy)
    dx = torch.empty_like(x)
    s = stream_of(dy)
    _lean.launch((_BWD, cfg), (x, y, dy, dx), s, _backward_slow, x, y, dy, cfg, dx, s)
    return dx


# -- torch.compile: pycudnn::pool and pycudnn::pool_grad -------------------------------------------
def _cfg(ws: Any, stride: Any, pad: Any, mode: str) -> tuple:
    return (tuple(ws), tuple(stride), tuple(pad), mode)


def _op_pool(
    x: torch.Tensor, ws: list[int], stride: list[int], pad: list[int], mode: str
) -> torch.Tensor:
    ready()
    return pool_run(dense(x), _cfg(ws, stride, pad, mode))


def _op_pool_fake(x, ws, stride, pad, mode):
    return like(pool_kernel.out_shape(tuple(x.shape), (ws, stride, pad, mode)), x)


def _grad(x, y, dy, ws, stride, pad, mode) -> torch.Tensor:
    """The gradient's eager function (a backward's: the options tuples)."""
    return pool_grad_run(x, y, dy, (ws, stride, pad, mode))


def _op_grad(
    x: torch.Tensor,
    y: torch.Tensor,
    dy: torch.Tensor,
    ws: list[int],
    stride: list[int],
    pad: list[int],
    mode: str,
) -> torch.Tensor:
    if FIRST_USE[0]:  # the first use only (no call on the hot path)
        ready()
    return pool_grad_run(x, y, dy, _cfg(ws, stride, pad, mode))


def _op_grad_fake(x, y, dy, ws, stride, pad, mode):
    return torch.empty_like(x)


def _pool_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0], output)
    # an eager call passes the module's cfg (tuples) whole; the op its lists
    ctx.cfg = inputs[1] if len(inputs) == 2 else _cfg(*inputs[1:5])


def _pool_backward(ctx, dy):
    x, y = ctx.saved_tensors
    dx = ctx.gradient(op_pool_grad, _grad, x, y, dy, *ctx.cfg)
    return (dx, None, None, None, None)[: len(ctx.needs_input_grad)]


#: ``PoolFn.apply(x, cfg)`` (eager; *x* dense, *cfg* the module's) and ``pycudnn::pool(...)``:
#: :func:`pool_run`, one backward
PoolFn, op_pool = differentiable(
    "pool", _op_pool, _op_pool_fake, _pool_setup, _pool_backward, eager_run=pool_run
)
#: ``pycudnn::pool_grad(x, y, dy, window, stride, pad, mode)``: :func:`pool_grad_run`
op_pool_grad = define("pool_grad", _op_grad, _op_grad_fake)


# -- 2-D max pooling on pycudnn's kernels: pycudnn::max_pool and pycudnn::max_pool_grad ---------
def _aligned(t: torch.Tensor) -> torch.Tensor:
    """*t* channels-last and 16-byte aligned, as the kernels read it (a copy where it is not)."""
    if not t.is_contiguous(memory_format=torch.channels_last):
        return t.contiguous(memory_format=torch.channels_last)
    return t if t.data_ptr() % 16 == 0 else t.clone(memory_format=torch.channels_last)


def _max_eager(x: torch.Tensor, cfg: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """The eager training forward (*x* as :func:`.pool_kernel.takes` says, the module's cfg)."""
    return pool_kernel.forward(x, cfg, True)  # type: ignore[return-value]


def _op_max_pool(
    x: torch.Tensor, ws: list[int], stride: list[int], pad: list[int], train: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    ready()
    y, idx = pool_kernel.forward(_aligned(x), _cfg(ws, stride, pad, "max"), train)
    return y, x.new_empty((0,), dtype=torch.uint8) if idx is None else idx


def _op_max_pool_fake(x, ws, stride, pad, train):
    oshape = pool_kernel.out_shape(tuple(x.shape), _cfg(ws, stride, pad, "max"))
    y = torch.empty(oshape, dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    return y, x.new_empty((y.numel() if train else 0,), dtype=torch.uint8)


def _max_setup(ctx, inputs, output) -> None:
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(output[1])
    ctx.shape = tuple(inputs[0].shape)
    ctx.cfg = inputs[1][:3] if len(inputs) == 2 else tuple(tuple(v) for v in inputs[1:4])


def _max_grad(dy, idx, shape, ws, stride, pad) -> torch.Tensor:
    """The gradient's eager function (a backward's: the options tuples)."""
    return pool_kernel.backward(_aligned(dy), idx, tuple(shape), (ws, stride, pad, "max"))


def _op_max_grad(
    dy: torch.Tensor,
    idx: torch.Tensor,
    shape: list[int],
    ws: list[int],
    stride: list[int],
    pad: list[int],
) -> torch.Tensor:
    if FIRST_USE[0]:  # the first use only (no call on the hot path)
        ready()
    return _max_grad(dy, idx, shape, tuple(ws), tuple(stride), tuple(pad))


def _op_max_grad_fake(dy, idx, shape, ws, stride, pad):
    return dy.new_empty(shape).contiguous(memory_format=torch.channels_last)


def _max_backward(ctx, dy, _didx):
    (idx,) = ctx.saved_tensors
    dx = ctx.gradient(op_max_pool_grad, _max_grad, dy, idx, ctx.shape, *ctx.cfg)
    return (dx,) + (None,) * (len(ctx.needs_input_grad) - 1)


#: ``MaxPoolFn.apply(x, cfg) -> (y, idx)`` (eager; *x* as :func:`.pool_kernel.takes` says) and
#: ``pycudnn::max_pool(x, window, stride, pad, train) -> (y, idx)``: pycudnn's kernel with each
#: maximum's window position (a byte per element; empty unless *train*) for the one backward
MaxPoolFn, op_max_pool = differentiable(
    "max_pool",
    _op_max_pool,
    _op_max_pool_fake,
    _max_setup,
    _max_backward,
    eager_run=_max_eager,
    stats_outputs=1,
)
#: ``pycudnn::max_pool_grad(dy, idx, shape, window, stride, pad) -> dx``
op_max_pool_grad = define("max_pool_grad", _op_max_grad, _op_max_grad_fake)


@constant
def _kernels_build(index: int) -> bool:
    """:func:`.pool_kernel.usable` as traced code reads it: once, while dynamo traces."""
    return pool_kernel.usable(index)


def pool_forward(m: nn.Module, x: torch.Tensor, nd: int, mode: str, fallback: Callable) -> Any:
    """*m*'s forward on cuDNN for CUDA inputs it takes, else *fallback* (torch's). Pooling is
    not on autocast's lists: it runs in the input's dtype, as torch's."""
    if not cuda_ok(x) or x.dim() not in (nd + 1, nd + 2):
        return fallback(x)
    traced = compiling()
    if not traced:
        ready()
    ws = as_tuple(m.kernel_size, nd)  # type: ignore[attr-defined]
    stride = ws if not m.stride else as_tuple(m.stride, nd)  # type: ignore[attr-defined]
    pad = as_tuple(m.padding, nd)  # type: ignore[attr-defined]
    unbatched = x.dim() == nd + 1
    if unbatched:
        x = x.unsqueeze(0)
    x = dense(x)
    cfg = (ws, stride, pad, mode)
    if traced:
        if (
            op_max_pool is not None
            and pool_kernel.fits(tuple(x.shape), x.dtype, cfg)
            and x.is_contiguous(memory_format=torch.channels_last)
            and _kernels_build(x.get_device())
        ):
            grad = torch.is_grad_enabled() and x.requires_grad
            y = op_max_pool(x, ws, stride, pad, grad)[0]
        else:
            y = op_pool(x, ws, stride, pad, mode)
    elif torch.is_grad_enabled() and x.requires_grad:
        y = MaxPoolFn.apply(x, cfg)[0] if pool_kernel.takes(x, cfg, True) else PoolFn.apply(x, cfg)
    elif pool_kernel.takes(x, cfg, False):
        y = pool_kernel.forward(x, cfg, False)[0]
    else:
        y = pool_run(x, cfg)
    return y.squeeze(0) if unbatched else y


class _FloorRule(Converted):
    """The rule of both poolings: floor mode; :meth:`_unsupported` adds each one's own."""

    @classmethod
    def unsupported(cls, module: nn.Module) -> str | None:
        m: Any = module
        if m.ceil_mode:
            return "ceil_mode=True (cuDNN's output size rounds down)"
        return cls._unsupported(m)

    @classmethod
    def _unsupported(cls, m: Any) -> str | None:
        raise NotImplementedError


class _MaxRule(_FloorRule):
    """Max pooling's rule: floor mode, no indices, no dilation."""

    @classmethod
    def _unsupported(cls, m: Any) -> str | None:
        if m.return_indices:
            return "return_indices=True (cuDNN returns no indices)"
        if any(d != 1 for d in as_tuple(m.dilation, 3)):
            return f"dilation={m.dilation} (cuDNN pools without dilation)"
        return None


class _AvgRule(_FloorRule):
    """Average pooling's rule: floor mode, the window as divisor."""

    @classmethod
    def _unsupported(cls, m: Any) -> str | None:
        if m.divisor_override is not None:
            return f"divisor_override={m.divisor_override} (cuDNN divides by the window)"
        return None


def _avg_mode(m: nn.Module) -> str:
    return "average_inc_pad" if m.count_include_pad else "average_exc_pad"  # type: ignore[attr-defined]


class MaxPool2d(_MaxRule, nn.MaxPool2d):
    """``torch.nn.MaxPool2d`` on ``dnn_pool(mode='max')`` (no dilation, ceil mode or indices)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.MaxPool2d.forward``."""
        return pool_forward(self, input, 2, "max", super().forward)


class MaxPool3d(_MaxRule, nn.MaxPool3d):
    """``torch.nn.MaxPool3d`` on ``dnn_pool(mode='max')``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.MaxPool3d.forward``."""
        return pool_forward(self, input, 3, "max", super().forward)


class AvgPool2d(_AvgRule, nn.AvgPool2d):
    """``torch.nn.AvgPool2d`` on ``dnn_pool`` (``average_inc_pad`` / ``average_exc_pad`` by
    ``count_include_pad``; no ceil mode or ``divisor_override``)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.AvgPool2d.forward``."""
        return pool_forward(self, input, 2, _avg_mode(self), super().forward)


class AvgPool3d(_AvgRule, nn.AvgPool3d):
    """``torch.nn.AvgPool3d`` on ``dnn_pool``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.AvgPool3d.forward``."""
        return pool_forward(self, input, 3, _avg_mode(self), super().forward)
