"""Activations as JAX functions on ``dnn_activation`` / ``dnn_activation_grad``.

:func:`activation` takes the high level's modes (``relu``, ``sigmoid``, ``tanh``,
``clipped_relu``, ``elu``, ``swish``, ``identity``; no GELU: cuDNN's legacy activations have
none) and :func:`relu`, :func:`sigmoid`, :func:`tanh`, :func:`elu`, :func:`silu` and
:func:`relu6` name the common ones. The gradient is ``dnn_activation_grad(y, dy, x)``; for
bfloat16 it is computed by XLA from the same residuals (cuDNN's legacy activation backward has no
bfloat16 kernel), as ``pycudnn.torch`` does with torch's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from ..highlevel import dnn_activation, dnn_activation_grad
from . import _ops, _request
from ._operands import views

__all__ = [
    "MODES",
    "Activation",
    "ActivationGrad",
    "activation",
    "elu",
    "gradient_from_output",
    "relu",
    "relu6",
    "sigmoid",
    "silu",
    "tanh",
]

MODES = ("relu", "sigmoid", "tanh", "clipped_relu", "elu", "swish", "identity")


@dataclasses.dataclass(frozen=True)
class Activation(_request.Request):
    """``y = act(x)``: operand ``x``, result ``y``."""

    family = "activation"
    mode: str
    coef: float

    def __post_init__(self) -> None:
        func = "pycudnn.jax.activation"
        if self.mode not in MODES:
            raise ValueError(f"{func}: mode={self.mode!r}; expected one of {MODES}")
        coef = _request.real(self.coef, "coef", func)
        if self.mode == "clipped_relu" and coef <= 0:
            raise ValueError(
                f"{func}: coef={self.coef!r} is the clipped_relu ceiling; expected > 0"
            )
        object.__setattr__(self, "coef", coef)

    def batch_operands(self) -> tuple[bool, ...]:
        return (True,)

    def results(self, *operands: Any) -> _ops.Results:
        x = operands[0]
        dt = _request.check_dtype("pycudnn.jax.activation", "x", x)
        if not 1 <= len(x.shape) <= 8:
            raise ValueError(
                f"pycudnn.jax.activation: x has shape {tuple(x.shape)}; expected 1 to 8 dims"
            )
        return ((tuple(x.shape), dt),)

    def run(self, args: Sequence[Any], rets: Sequence[Any], stream: int) -> None:
        x, y = views(args, rets)
        dnn_activation(x, self.mode, self.coef, out=y, stream=stream)

    def grad(self) -> ActivationGrad:
        """The request of this activation's gradient."""
        return ActivationGrad(self.mode, self.coef)


@dataclasses.dataclass(frozen=True)
class ActivationGrad(Activation):
    """``dx = act'(x) * dy``: operands ``y``, ``dy``, ``x`` (``dnn_activation_grad``'s order),
    result ``dx``."""

    def batch_operands(self) -> tuple[bool, ...]:
        return (True, True, True)

    def results(self, *operands: Any) -> _ops.Results:
        y, dy, x = operands
        out = super().results(x)
        for name, a in (("y", y), ("dy", dy)):
            if tuple(a.shape) != tuple(x.shape) or a.dtype != x.dtype:
                raise ValueError(
                    f"pycudnn.jax.activation gradient: {name} is {a.dtype}{list(a.shape)}; "
                    f"expected x's {x.dtype}{list(x.shape)}"
                )
        return out

    def run(self, args: Sequence[Any], rets: Sequence[Any], stream: int) -> None:
        y, dy, x, dx = views(args, rets)
        dnn_activation_grad(y, dy, x, self.mode, self.coef, out=dx, stream=stream)


def gradient_from_output(mode: str, coef: float, x: Any, y: Any, dy: Any) -> Any:
    """The activation's input gradient computed by XLA (for bfloat16, which cuDNN's legacy
    backward lacks)."""
    if mode == "relu":
        return jnp.where(y > 0, dy, jnp.zeros_like(dy))
    if mode == "clipped_relu":
        return jnp.where((x > 0) & (x < coef), dy, jnp.zeros_like(dy))
    if mode == "sigmoid":
        return dy * y * (1 - y)
    if mode == "tanh":
        return dy * (1 - y * y)
    if mode == "elu":
        return jnp.where(x > 0, dy, dy * (y + coef))
    if mode == "swish":
        s = jax.nn.sigmoid(coef * x)
        return dy * (s + coef * x * s * (1 - s))
    return dy


def _forward(request: Activation, x: Any) -> tuple[Any, Any]:
    (y,) = _ops.call(request, x)
    return y, (x, y)


def _backward(request: Activation, residuals: Any, dy: Any) -> tuple:
    x, y = residuals
    if x.dtype == jnp.bfloat16:
        return (gradient_from_output(request.mode, request.coef, x, y, dy),)
    (dx,) = _ops.call(request.grad(), y, dy, x)
    return (dx,)


_activation = _ops.differentiable(_forward, _backward)


def activation(x: Any, mode: str = "relu", coef: float = 0.0) -> jax.Array:
    """Element-wise activation through cuDNN (``dnn_activation``), differentiable.

    Parameters
    ----------
    x : jax.Array
        1 to 8 dims (a 0-d array is taken as 1-d); float16, bfloat16, float32 or float64.
    mode : {'relu', 'sigmoid', 'tanh', 'clipped_relu', 'elu', 'swish', 'identity'}
        ``clipped_relu`` is ``min(max(x, 0), coef)``, ``elu`` is ``x`` for ``x > 0`` else
        ``coef * (exp(x) - 1)``, ``swish`` is ``x * sigmoid(coef * x)``.
    coef : float
        The ceiling of ``clipped_relu`` (> 0), the alpha of ``elu``, the beta of ``swish``;
        ignored by the others.

    Returns
    -------
    jax.Array
        ``act(x)``, x's shape and dtype.

    Raises
    ------
    TypeError, ValueError
        At trace time: an unknown mode, a bad coef, a dtype or rank cuDNN does not take.
    """
    request = Activation(mode, coef)
    x = jnp.asarray(x)
    if x.ndim == 0:
        return _activation(request, x.reshape(1)).reshape(())
    return _activation(request, x)


def relu(x: Any) -> jax.Array:
    """``max(x, 0)`` (:func:`activation` ``'relu'``)."""
    return activation(x, "relu")


def relu6(x: Any) -> jax.Array:
    """``min(max(x, 0), 6)`` (:func:`activation` ``'clipped_relu'`` with ``coef=6``)."""
    return activation(x, "clipped_relu", 6.0)


def sigmoid(x: Any) -> jax.Array:
    """``1 / (1 + exp(-x))`` (:func:`activation` ``'sigmoid'``)."""
    return activation(x, "sigmoid")


def tanh(x: Any) -> jax.Array:
    """``tanh(x)`` (:func:`activation` ``'tanh'``)."""
    return activation(x, "tanh")


def elu(x: Any, alpha: float = 1.0) -> jax.Array:
    """``x`` for ``x > 0``, else ``alpha * (exp(x) - 1)`` (:func:`activation` ``'elu'``)."""
    return activation(x, "elu", alpha)


def silu(x: Any) -> jax.Array:
    """``x * sigmoid(x)`` (:func:`activation` ``'swish'`` with ``coef=1``; ``jax.nn.silu``)."""
    return activation(x, "swish", 1.0)
