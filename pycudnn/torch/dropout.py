"""Dropout (imports torch): ``Dropout`` on ``dnn_dropout`` / ``dnn_dropout_grad`` with a pool
of :class:`~pycudnn.DropoutState` objects per module, and the ``autograd.Function`` over them."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from ..highlevel import DropoutState, dnn_dropout, dnn_dropout_grad
from ._compile import compiling, define
from ._module import Converted, state
from ._runtime import NO_BF16, cuda_ok, dense, ready, stream_of

__all__ = ["Dropout", "DropoutFn", "DropoutPool", "op_dropout"]


class DropoutPool:
    """The :class:`~pycudnn.DropoutState` objects of one module: one per forward whose backward
    is pending (a state holds the mask of its last forward), reused afterwards (creating one
    initialises cuDNN's RNG states, ~20 ms). Seeds come from torch's CPU generator, so
    ``torch.manual_seed`` makes the masks reproducible."""

    def __init__(self) -> None:
        self.free: list[DropoutState] = []

    def take(self) -> DropoutState:
        if self.free:
            return self.free.pop()
        return DropoutState(seed=int(torch.randint(0, 2**62, (1,)).item()))

    def give(self, state: DropoutState) -> None:
        self.free.append(state)


class DropoutFn(torch.autograd.Function):
    """``dnn_dropout`` / ``dnn_dropout_grad`` with a state of the module's pool."""

    @staticmethod
    def forward(ctx, x, p, pool, inplace, keep):
        ready()
        state = pool.take()
        s = stream_of(x)
        if inplace:
            dnn_dropout(x, p, state=state, out=x, stream=s)
            ctx.mark_dirty(x)
            y = x
        else:
            y = torch.empty_like(x)
            dnn_dropout(x, p, state=state, out=y, stream=s)
        if keep:  # a backward will come: the state keeps its mask until then
            ctx.state, ctx.pool = state, pool
        else:
            pool.give(state)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        state = ctx.state
        dy = dense(dy)
        dx = dnn_dropout_grad(dy, state, out=torch.empty_like(dy), stream=stream_of(dy))
        ctx.pool.give(state)
        ctx.state = None
        return dx, None, None, None, None


# -- torch.compile: pycudnn::dropout -> (y, scale) -------------------------------------------------
_POOLS: dict[int, DropoutPool] = {}  # the op's states, per device (a module has no pool there)


def _op_dropout(x: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``dnn_dropout`` with a state of the device's pool, and the mask as a tensor: the scale
    ``mask / (1 - p)`` that ``dnn_dropout_grad`` applies (its gradient of ones), so the
    backward is ``dy * scale`` and the state goes back to the pool at once."""
    ready()
    pool = _POOLS.get(x.get_device())
    if pool is None:
        pool = _POOLS[x.get_device()] = DropoutPool()
    st = pool.take()
    try:
        s = stream_of(x)
        y = torch.empty_like(x)
        dnn_dropout(x, p, state=st, out=y, stream=s)
        scale = dnn_dropout_grad(torch.ones_like(x), st, out=torch.empty_like(x), stream=s)
    finally:
        pool.give(st)
    return y, scale


def _op_dropout_fake(x, p):
    return torch.empty_like(x), torch.empty_like(x)


def _setup(ctx, inputs, output) -> None:
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(output[1])


def _backward(ctx, dy, _dscale):
    (scale,) = ctx.saved_tensors
    return dy * scale, None


#: ``pycudnn::dropout(x, p) -> (y, scale)``: ``y = x * scale``
op_dropout = define("dropout", _op_dropout, _op_dropout_fake, autograd=(_backward, _setup))


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
        if compiling():
            y = op_dropout(dense(input), float(self.p))[0]
            return input.copy_(y) if self.inplace else y
        pools = state(self)
        pool = pools.get(("dropout", input.device))
        if pool is None:
            pool = pools[("dropout", input.device)] = DropoutPool()
        keep = torch.is_grad_enabled() and input.requires_grad
        if self.inplace:
            return DropoutFn.apply(input, float(self.p), pool, True, keep)
        return DropoutFn.apply(input, float(self.p), pool, False, keep)
