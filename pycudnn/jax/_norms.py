"""Layer norm and RMS norm over trailing dims as JAX functions on ``dnn_layer_norm`` /
``dnn_rms_norm`` and their gradients (cuDNN's graph API).

PyTorch's arguments: ``normalized_shape`` is the trailing dims normalized together. The forward
also writes the statistics the backward reads (float32 ``mean`` and ``inv_std``, or
``inv_rms``, of shape ``(*lead, 1, ..., 1)``): they are residuals, not results. A missing
``gamma`` (``beta``) is ones (zeros) made by XLA and its gradient dropped. Data: float16,
bfloat16 or float32 (cuDNN's norms have no float64); ``gamma``/``beta``: x's dtype or float32.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..highlevel import dnn_layer_norm, dnn_layer_norm_grad, dnn_rms_norm, dnn_rms_norm_grad
from . import _ops, _request
from ._operands import views

__all__ = ["Norm", "NormGrad", "layer_norm", "rms_norm"]

_TYPES = ("float16", "bfloat16", "float32")


@dataclasses.dataclass(frozen=True)
class Norm(_request.Request):
    """The forward: operands ``x``, ``gamma`` (, ``beta``); results ``y``, (``mean``,)
    ``inv_std``/``inv_rms``. *ndim*: how many trailing dims are normalized."""

    family = "norm"
    rms: bool
    ndim: int
    epsilon: float

    def __post_init__(self) -> None:
        eps = _request.real(self.epsilon, "epsilon", self.func)
        if eps <= 0:
            raise ValueError(f"{self.func}: epsilon={self.epsilon!r}; expected > 0")
        object.__setattr__(self, "epsilon", eps)
        object.__setattr__(self, "rms", bool(self.rms))

    @property
    def func(self) -> str:
        """The public function's name (error messages)."""
        return "pycudnn.jax.rms_norm" if self.rms else "pycudnn.jax.layer_norm"

    def batch_operands(self) -> tuple[bool, ...]:
        return (True, False) if self.rms else (True, False, False)

    def check(self, x: Any, params: Sequence[tuple[str, Any]]) -> tuple[Any, ...]:
        """Check *x* and the parameters; returns the statistics' shape."""
        dt = _request.check_dtype(self.func, "x", x, _TYPES)
        shape = tuple(x.shape)
        if len(shape) <= self.ndim:
            raise ValueError(
                f"{self.func}: x has shape {shape}; normalizing {self.ndim} trailing dims needs "
                "at least one leading (row) dim"
            )
        ns = shape[len(shape) - self.ndim :]
        for name, p in params:
            if tuple(p.shape) != ns:
                raise ValueError(f"{self.func}: {name} has shape {tuple(p.shape)}; expected {ns}")
            if np.dtype(p.dtype) not in (dt, np.dtype("float32")):
                raise TypeError(f"{self.func}: {name} is {p.dtype}; expected {dt} or float32")
        return (*shape[: len(shape) - self.ndim], *(1,) * self.ndim)

    def results(self, *operands: Any) -> _ops.Results:
        x, *params = operands
        stat = self.check(x, list(zip(("gamma", "beta"), params, strict=False)))
        f32 = np.dtype("float32")
        stats = ((stat, f32),) if self.rms else ((stat, f32), (stat, f32))
        return ((tuple(x.shape), np.dtype(x.dtype)), *stats)

    def run(self, args: Sequence[Any], rets: Sequence[Any], stream: int) -> None:
        ops = views(args, rets)
        x = ops[0]
        ns = x.shape[len(x.shape) - self.ndim :]
        if self.rms:
            x, gamma, y, inv = ops
            dnn_rms_norm(x, ns, gamma, self.epsilon, out=y, out_invrms=inv, stream=stream)
        else:
            x, gamma, beta, y, mean, inv = ops
            dnn_layer_norm(
                x,
                ns,
                gamma,
                beta,
                self.epsilon,
                out=y,
                out_mean=mean,
                out_invstd=inv,
                stream=stream,
            )


@dataclasses.dataclass(frozen=True)
class NormGrad(Norm):
    """The backward: operands ``dy``, ``x``, ``gamma``, (``mean``,) ``inv`` (the order of the
    gradient functions' pointers); results ``dx``, ``dgamma`` (, ``dbeta``)."""

    batch_results = False  # dgamma and dbeta sum over the rows: no batch to fold

    def batch_operands(self) -> tuple[bool, ...]:
        return (True, True, False, True) if self.rms else (True, True, False, True, True)

    def results(self, *operands: Any) -> _ops.Results:
        dy, x, gamma, *stats = operands
        stat = self.check(x, [("gamma", gamma)])
        if tuple(dy.shape) != tuple(x.shape) or dy.dtype != x.dtype:
            raise ValueError(
                f"{self.func} gradient: dy is {dy.dtype}{list(dy.shape)}; expected "
                f"x's {x.dtype}{list(x.shape)}"
            )
        for s in stats:
            if tuple(s.shape) != stat:
                raise ValueError(
                    f"{self.func} gradient: a statistic has shape {s.shape}; expected {stat}"
                )
        g = (tuple(gamma.shape), np.dtype(gamma.dtype))
        return ((tuple(x.shape), np.dtype(x.dtype)), g) + (() if self.rms else (g,))

    def run(self, args: Sequence[Any], rets: Sequence[Any], stream: int) -> None:
        ops = views(args, rets)
        x = ops[1]
        ns = x.shape[len(x.shape) - self.ndim :]
        if self.rms:
            dy, x, gamma, inv, dx, dgamma = ops
            dnn_rms_norm_grad(dy, x, inv, ns, gamma, out_grads=(dx, dgamma), stream=stream)
        else:
            dy, x, gamma, mean, inv, dx, dgamma, dbeta = ops
            dnn_layer_norm_grad(
                dy, x, mean, inv, ns, gamma, out_grads=(dx, dgamma, dbeta), stream=stream
            )


def _forward(request: Norm, x: Any, *params: Any) -> tuple[Any, Any]:
    y, *stats = _ops.call(request, x, *params)
    return y, (x, params[0], tuple(stats))


def _backward(request: Norm, residuals: Any, dy: Any) -> tuple:
    x, gamma, stats = residuals
    grad = NormGrad(request.rms, request.ndim, request.epsilon)
    return tuple(_ops.call(grad, dy, x, gamma, *stats))


_norm = _ops.differentiable(_forward, _backward)


def _normalized(func: str, x: Any, normalized_shape: Any) -> tuple[int, ...]:
    ns = (
        (normalized_shape,) if isinstance(normalized_shape, (int, np.integer)) else normalized_shape
    )
    try:
        if isinstance(ns, (str, bytes)) or any(isinstance(d, bool) for d in ns):
            raise TypeError
        ns = tuple(ns)
    except TypeError:
        raise TypeError(
            f"{func}: normalized_shape={normalized_shape!r}; expected an int or a tuple of ints"
        ) from None
    if not ns or tuple(x.shape[x.ndim - len(ns) :]) != ns or len(ns) >= x.ndim:
        raise ValueError(
            f"{func}: normalized_shape={ns} must be trailing dims of x's shape "
            f"{x.shape}, leaving at least one leading dim"
        )
    return ns


def layer_norm(
    x: Any,
    normalized_shape: int | Sequence[int],
    gamma: Any = None,
    beta: Any = None,
    epsilon: float = 1e-5,
) -> jax.Array:
    """Layer normalization over the trailing *normalized_shape* dims through cuDNN
    (``dnn_layer_norm``), differentiable in *x*, *gamma* and *beta*.

    ``y = (x - mean) / sqrt(var + epsilon) * gamma + beta`` per row (biased variance), as
    ``torch.nn.functional.layer_norm`` and Flax's ``LayerNorm``.

    Parameters
    ----------
    x : jax.Array
        ``(*lead, *normalized_shape)``, at least one leading dim; float16, bfloat16 or float32.
    normalized_shape : int or tuple of int
        The trailing dims normalized together.
    gamma, beta : jax.Array, optional
        Of shape *normalized_shape*, x's dtype or float32 (default ones and zeros).
    epsilon : float
        > 0.

    Returns
    -------
    jax.Array
        x's shape and dtype.

    Raises
    ------
    TypeError, ValueError
        At trace time: *normalized_shape* not trailing dims of x, bad gamma/beta shapes or
        dtypes, epsilon <= 0, a dtype cuDNN's norms do not take (float64).
    """
    func = "pycudnn.jax.layer_norm"
    x = jnp.asarray(x)
    ns = _normalized(func, x, normalized_shape)
    request = Norm(False, len(ns), epsilon)
    gamma = jnp.ones(ns, x.dtype) if gamma is None else jnp.asarray(gamma)
    beta = jnp.zeros(ns, gamma.dtype) if beta is None else jnp.asarray(beta)
    return _norm(request, x, gamma, beta)


def rms_norm(
    x: Any,
    normalized_shape: int | Sequence[int],
    gamma: Any = None,
    epsilon: float = 1e-6,
) -> jax.Array:
    """RMS normalization over the trailing *normalized_shape* dims through cuDNN
    (``dnn_rms_norm``), differentiable in *x* and *gamma*: ``y = x / sqrt(mean(x**2) + epsilon)
    * gamma`` per row. Arguments and errors as :func:`layer_norm` (no *beta*)."""
    func = "pycudnn.jax.rms_norm"
    x = jnp.asarray(x)
    ns = _normalized(func, x, normalized_shape)
    request = Norm(True, len(ns), epsilon)
    gamma = jnp.ones(ns, x.dtype) if gamma is None else jnp.asarray(gamma)
    return _norm(request, x, gamma)
