"""Softmax and log-softmax over one axis as JAX functions on ``dnn_softmax`` /
``dnn_softmax_grad``.

cuDNN normalizes over the channel axis of an ``(N, C, ...)`` tensor: axis 1 of a 2-D to 5-D
array is passed as it is. Any other axis of a row-major array is that axis of its ``(outer, n,
inner)`` reshape (the product of the dims before it, the axis, the product of those after it):
a free reshape in XLA, so :func:`softmax` and :func:`log_softmax` take any one axis, as
``jax.nn.softmax`` does.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from ..highlevel import dnn_softmax, dnn_softmax_grad
from . import _ops, _request
from ._operands import views

__all__ = ["Softmax", "SoftmaxGrad", "log_softmax", "softmax"]


@dataclasses.dataclass(frozen=True)
class Softmax(_request.Request):
    """Softmax over axis 1 of a 2-D to 5-D operand (``(N, C, ...)``, or the ``(outer, n,
    inner)`` reshape of another axis); *algo* ``'accurate'`` (softmax) or ``'log'``
    (log-softmax)."""

    family = "softmax"
    algo: str

    def __post_init__(self) -> None:
        if self.algo not in ("accurate", "log"):
            raise ValueError(
                f"pycudnn.jax.softmax: algo={self.algo!r}; expected 'accurate' or 'log'"
            )

    def batch_operands(self) -> tuple[bool, ...]:
        return (True,)

    def results(self, *operands: Any) -> _ops.Results:
        x = operands[0]
        dt = _request.check_dtype(self._func, "x", x)
        if not 2 <= len(x.shape) <= 5:
            raise ValueError(
                f"{self._func}: the operand has shape {tuple(x.shape)}; expected 2 to 5 dims"
            )
        return ((tuple(x.shape), dt),)

    @property
    def _func(self) -> str:
        return "pycudnn.jax.log_softmax" if self.algo == "log" else "pycudnn.jax.softmax"

    def run(self, args: Sequence[Any], rets: Sequence[Any], stream: int) -> None:
        x, y = views(args, rets)
        dnn_softmax(x, self.algo, "channel", out=y, stream=stream)


@dataclasses.dataclass(frozen=True)
class SoftmaxGrad(Softmax):
    """The gradient: operands the forward's output ``sm`` and ``dy`` (the order of
    ``dnn_softmax_grad``'s pointers), result ``dx``."""

    def batch_operands(self) -> tuple[bool, ...]:
        return (True, True)

    def results(self, *operands: Any) -> _ops.Results:
        sm, dy = operands
        if tuple(sm.shape) != tuple(dy.shape) or sm.dtype != dy.dtype:
            raise ValueError(
                f"{self._func} gradient: dy is {dy.dtype}{list(dy.shape)}, the output "
                f"{sm.dtype}{list(sm.shape)}; expected one shape and dtype"
            )
        return super().results(sm)

    def run(self, args: Sequence[Any], rets: Sequence[Any], stream: int) -> None:
        sm, dy, dx = views(args, rets)
        dnn_softmax_grad(dy, sm, self.algo, "channel", out=dx, stream=stream)


def _forward(request: Softmax, x: Any) -> tuple[Any, Any]:
    (y,) = _ops.call(request, x)
    return y, y


def _backward(request: Softmax, y: Any, dy: Any) -> tuple:
    (dx,) = _ops.call(SoftmaxGrad(request.algo), y, dy)
    return (dx,)


_softmax = _ops.differentiable(_forward, _backward)


def _over_axis(func: str, algo: str, x: Any, axis: Any) -> jax.Array:
    x = jnp.asarray(x)
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"{func}: axis={axis!r}; expected one int")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"{func}: axis={axis} is out of range for x of shape {x.shape}")
    axis %= x.ndim
    shape = x.shape
    if axis == 1 and 2 <= x.ndim <= 5:  # cuDNN's own (N, C, ...): no reshape (a reshape of
        return _softmax(Softmax(algo), x)  # symbolic image dims can be inconclusive in export)
    three = (math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :]))
    return _softmax(Softmax(algo), x.reshape(three)).reshape(shape)


def softmax(x: Any, axis: int = -1) -> jax.Array:
    """``exp(x) / sum(exp(x))`` over *axis* through cuDNN (``dnn_softmax``, accurate: the
    maximum subtracted first), differentiable; ``jax.nn.softmax``'s result.

    Parameters
    ----------
    x : jax.Array
        Any shape with at least one dim; float16, bfloat16, float32 or float64.
    axis : int
        The axis normalized (one axis; negative counts from the end).

    Returns
    -------
    jax.Array
        x's shape and dtype.

    Raises
    ------
    TypeError, ValueError
        At trace time: *axis* not an int in range, a dtype cuDNN does not take.
    """
    return _over_axis("pycudnn.jax.softmax", "accurate", x, axis)


def log_softmax(x: Any, axis: int = -1) -> jax.Array:
    """``x - log(sum(exp(x)))`` over *axis* through cuDNN (``dnn_softmax`` with ``algo='log'``),
    differentiable; ``jax.nn.log_softmax``'s result. Arguments as :func:`softmax`."""
    return _over_axis("pycudnn.jax.log_softmax", "log", x, axis)
