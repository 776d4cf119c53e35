"""Dropout (imports torch): ``Dropout`` on ``dnn_dropout`` / ``dnn_dropout_grad``, the mask
(cuDNN's reserve space) a uint8 tensor that travels with the output to the backward, and a pool of
:class:`~pycudnn.DropoutState` objects (the generators' states) per device, lent per launch."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..highlevel import DropoutState, dnn_dropout, dnn_dropout_grad, dropout_mask_bytes
from ._compile import compiling, define, differentiable
from ._module import Converted
from ._runtime import FIRST_USE, NO_BF16, bump_version, cuda_ok, dense, ready, stream_of

__all__ = ["Dropout", "DropoutFn", "DropoutPool", "op_dropout", "op_dropout_grad"]


class DropoutPool:
    """The :class:`~pycudnn.DropoutState` objects of one device: one per launch in flight on
    this thread (one, unless threads overlap), reused afterwards (creating one initialises
    cuDNN's RNG states, ~20 ms). Seeds come from torch's CPU generator, so ``torch.manual_seed``
    before the first dropout of a process makes its masks reproducible."""

    def __init__(self) -> None:
        self.free: list[DropoutState] = []

    def take(self) -> DropoutState:
        if self.free:
            return self.free.pop()
        return DropoutState(seed=int(torch.randint(0, 2**62, (1,)).item()))

    def give(self, state: DropoutState) -> None:
        self.free.append(state)


_POOLS: dict[int, DropoutPool] = {}  # the generators' states, per device


def _pool(device: int) -> DropoutPool:
    pool = _POOLS.get(device)
    if pool is None:
        pool = _POOLS[device] = DropoutPool()
    return pool


def _mask_for(x: torch.Tensor) -> torch.Tensor:
    """An empty mask (cuDNN's reserve space) for *x*, a uint8 tensor on its device."""
    n = dropout_mask_bytes(tuple(x.shape), x.dtype)
    return torch.empty((n,), dtype=torch.uint8, device=x.device)


def _dropout_into(x: torch.Tensor, p: float, y: torch.Tensor) -> torch.Tensor:
    """``dnn_dropout`` of *x* into *y* (*x* itself in place), its mask into a new tensor that is
    returned: a state of the device's pool is lent for the launch only, as the mask travels with
    the output (no state is held until the backward)."""
    ready()
    pool = _pool(x.get_device())
    st = pool.take()
    try:
        mask = _mask_for(x)
        dnn_dropout(x, p, state=st, out=y, out_mask=mask, stream=stream_of(x))
    finally:
        pool.give(st)
    return mask


def _op_dropout(x: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.empty_like(x)
    return y, _dropout_into(x, p, y)


def _op_dropout_fake(x, p):
    n = dropout_mask_bytes(tuple(int(d) for d in x.shape), x.dtype)
    return torch.empty_like(x), x.new_empty((n,), dtype=torch.uint8)


def _dropout_eager(x: torch.Tensor, p: float, inplace: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The eager forward: :func:`_op_dropout`, in place (into *x*) where *inplace*."""
    if not inplace:
        return _op_dropout(x, p)
    return x, _dropout_into(x, p, x)


def _setup(ctx, inputs, output) -> None:
    if inputs[2:] and inputs[2]:  # an eager in-place forward: x is the output now
        ctx.mark_dirty(inputs[0])
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(output[1])
    ctx.p = inputs[1]


def _op_grad(dy: torch.Tensor, mask: torch.Tensor, p: float) -> torch.Tensor:
    """``dnn_dropout_grad`` with the forward's *mask* and *p* (a state of the device's pool
    lends its descriptor)."""
    if FIRST_USE[0]:  # the first use only (no call on the hot path)
        ready()
    dy = dense(dy)
    pool = _pool(dy.get_device())
    st = pool.take()
    try:
        dx = torch.empty_like(dy)
        dnn_dropout_grad(dy, st, mask=mask, p=p, out=dx, stream=stream_of(dy))
    finally:
        pool.give(st)
    return dx


def _op_grad_fake(dy, mask, p):
    return torch.empty_like(dy)


def _backward(ctx, dy, _dmask):
    (mask,) = ctx.saved_tensors
    dx = ctx.gradient(op_dropout_grad, _op_grad, dy, mask, ctx.p)
    return (dx, None) + (None,) * (len(ctx.needs_input_grad) - 2)  # (an eager call's inplace)


#: ``DropoutFn.apply(x, p, inplace) -> (y, mask)`` (eager; in place where *inplace*) and
#: ``pycudnn::dropout(x, p) -> (y, mask)``: ``dnn_dropout`` with the mask (cuDNN's reserve space,
#: :func:`~pycudnn.dropout_mask_bytes`) as a uint8 tensor the backward reads; one backward
DropoutFn, op_dropout = differentiable(
    "dropout",
    _op_dropout,
    _op_dropout_fake,
    _setup,
    _backward,
    eager_run=_dropout_eager,
    stats_outputs=1,
)
#: ``pycudnn::dropout_grad(dy, mask, p) -> dx``: ``dnn_dropout_grad`` with that mask
op_dropout_grad = define("dropout_grad", _op_grad, _op_grad_fake)


class Dropout(Converted, nn.Dropout):
    """``torch.nn.Dropout`` on ``dnn_dropout`` / ``dnn_dropout_grad`` (float16, float32,
    float64; bfloat16 runs torch's dropout). Masks come from cuDNN's generator seeded from
    torch's, so they differ from torch's masks for the same seed."""

    @classmethod
    def unsupported(cls, module: nn.Module) -> str | None:
        m: Any = module
        if not 0.0 <= m.p < 1.0:
            return f"p={m.p} (cuDNN's dropout takes p in [0, 1))"
        return None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.Dropout.forward``."""
        if not self.training or self.p == 0.0:
            return input
        if not cuda_ok(input, NO_BF16) or input.dim() > 8:
            return super().forward(input)
        p = float(self.p)
        if compiling():
            y = op_dropout(dense(input), p)[0]
            return input.copy_(y) if self.inplace else y
        inplace = self.inplace
        if torch.is_grad_enabled() and (input.requires_grad or inplace):
            return DropoutFn.apply(input, p, inplace)[0]  # in place: mark_dirty bumps the version
        y = _dropout_eager(input, p, inplace)[0]  # no autograd node: the launch alone
        if inplace and not input.is_inference():
            bump_version(input)  # as torch's in-place ops do (a saved copy's check sees it)
        return y
