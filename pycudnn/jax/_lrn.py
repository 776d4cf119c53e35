"""Cross-channel local response normalization as a JAX function on ``dnn_lrn`` /
``dnn_lrn_grad`` (``cudnnLRNCrossChannelForward`` / ``Backward``).

``y[:, c] = x[:, c] / (k + alpha / size * sum(x[:, j] ** 2 for j in window(c))) ** beta`` with
cuDNN's window ``[c - (size - 1) // 2, c + size // 2]`` clipped to the channels: PyTorch's
``F.local_response_norm`` for odd *size*; for even *size* PyTorch's window starts one channel
earlier. ``(N, C, spatial...)`` with 0 to 3 spatial dims, or channels last (read in place; 5-D
channels-last data goes through packed copies, cuDNN's rule, so its call is not bound). Data:
float16, float32, float64 (cuDNN's LRN has no bfloat16). The gradient is cuDNN's backward from
``x``, ``y`` and ``dy``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..highlevel import dnn_lrn, dnn_lrn_grad
from . import _ops, _request
from ._operands import views

__all__ = ["Lrn", "LrnGrad", "lrn"]

_FUNC = "pycudnn.jax.lrn"
_TYPES = ("float16", "float32", "float64")
#: cuDNN's bounds: CUDNN_LRN_MAX_N, CUDNN_LRN_MIN_BETA, CUDNN_LRN_MIN_K
_SIZE_MAX, _BETA_MIN, _K_MIN = 16, 0.01, 1e-5


@dataclasses.dataclass(frozen=True)
class Lrn(_request.Request):
    """``y = lrn(x)``: operand ``x``, result ``y``."""

    family = "lrn"
    size: int
    alpha: float
    beta: float
    k: float
    channels_last: bool

    def __post_init__(self) -> None:
        size = self.size
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
            raise TypeError(f"{_FUNC}: size={size!r}; expected an int")
        if not 1 <= size <= _SIZE_MAX:
            raise ValueError(f"{_FUNC}: size={size!r}; expected 1 to {_SIZE_MAX} channels")
        object.__setattr__(self, "size", int(size))
        for name, lo in (("alpha", None), ("beta", _BETA_MIN), ("k", _K_MIN)):
            v = _request.real(getattr(self, name), name, _FUNC)
            if lo is not None and v < lo:
                raise ValueError(f"{_FUNC}: {name}={v!r}; expected >= {lo} (cuDNN's minimum)")
            object.__setattr__(self, name, v)
        if not isinstance(self.channels_last, bool):
            raise TypeError(f"{_FUNC}: channels_last={self.channels_last!r}; expected a bool")

    def batch_operands(self) -> tuple[bool, ...]:
        return (True,)

    def check(self, x: Any) -> np.dtype:
        """Check *x*; its dtype."""
        dt = _request.check_dtype(_FUNC, "x", x, _TYPES)
        if not 2 <= x.ndim <= 5:
            raise ValueError(
                f"{_FUNC}: x has shape {tuple(x.shape)}; expected 2 to 5 dims "
                f"({'(N, spatial..., C)' if self.channels_last else '(N, C, spatial...)'})"
            )
        return dt

    def results(self, *operands: Any) -> _ops.Results:
        (x,) = operands
        return ((tuple(x.shape), self.check(x)),)

    @property
    def params(self) -> tuple[int, float, float, float]:
        """``(size, alpha, beta, k)``: ``dnn_lrn``'s ``n, alpha, beta, k``."""
        return self.size, self.alpha, self.beta, self.k

    def run(self, args: Sequence[Any], rets: Sequence[Any], stream: int) -> None:
        x, y = views(args, rets, (self.channels_last,) * 2)
        dnn_lrn(x, *self.params, out=y, stream=stream)


@dataclasses.dataclass(frozen=True)
class LrnGrad(Lrn):
    """The gradient: operands ``y``, ``dy``, ``x`` (``dnn_lrn_grad``'s order); result ``dx``."""

    def batch_operands(self) -> tuple[bool, ...]:
        return (True, True, True)

    def results(self, *operands: Any) -> _ops.Results:
        y, dy, x = operands
        dt = self.check(x)
        for name, a in (("y", y), ("dy", dy)):
            if tuple(a.shape) != tuple(x.shape) or np.dtype(a.dtype) != dt:
                raise ValueError(
                    f"{_FUNC} gradient: {name} is {a.dtype}{list(a.shape)}; expected x's "
                    f"{dt}{list(x.shape)}"
                )
        return ((tuple(x.shape), dt),)

    def run(self, args: Sequence[Any], rets: Sequence[Any], stream: int) -> None:
        y, dy, x, dx = views(args, rets, (self.channels_last,) * 4)
        dnn_lrn_grad(y, dy, x, *self.params, out=dx, stream=stream)


def _forward(request: Lrn, x: Any) -> tuple[Any, Any]:
    (y,) = _ops.call(request, x)
    return y, (x, y)


def _backward(request: Lrn, residuals: Any, dy: Any) -> tuple:
    x, y = residuals
    grad = LrnGrad(*(getattr(request, f.name) for f in dataclasses.fields(request)))
    (dx,) = _ops.call(grad, y, dy, x)
    return (dx,)


_lrn = _ops.differentiable(_forward, _backward)


def lrn(
    x: Any,
    size: int = 5,
    alpha: float = 1e-4,
    beta: float = 0.75,
    k: float = 2.0,
    *,
    channels_last: bool = False,
) -> jax.Array:
    """Cross-channel local response normalization through cuDNN (``dnn_lrn``),
    differentiable (``dnn_lrn_grad``): PyTorch's ``F.local_response_norm(x, size, alpha, beta,
    k)`` for odd *size*.

    ``y[:, c] = x[:, c] / (k + alpha / size * sum of x**2 over the window of c) ** beta``, the
    window ``[c - (size - 1) // 2, c + size // 2]`` clipped to the channels (for even *size*
    PyTorch's starts one channel earlier).

    Parameters
    ----------
    x : jax.Array
        ``(N, C, spatial...)``, 2 to 5 dims (with *channels_last*: ``(N, spatial..., C)``);
        float16, float32 or float64.
    size : int
        The window, 1 to 16 channels (cuDNN's limit).
    alpha : float
        Scale of the window's sum of squares (divided by *size*).
    beta : float
        Exponent, >= 0.01 (cuDNN's minimum).
    k : float
        Additive constant, >= 1e-5 (cuDNN's minimum).
    channels_last : bool
        x and the result have the channels last.

    Returns
    -------
    jax.Array
        x's shape and dtype.

    Raises
    ------
    TypeError, ValueError
        At trace time: a size outside 1..16 or not an int, beta < 0.01, k < 1e-5, non-finite
        parameters, a rank outside 2..5, a dtype cuDNN's LRN does not take (bfloat16).
    """
    request = Lrn(size, alpha, beta, k, channels_last)
    return _lrn(request, jnp.asarray(x))
