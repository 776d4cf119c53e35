"""2-D and 3-D max and average pooling as JAX functions on ``dnn_pool`` / ``dnn_pool_grad``.

The window's length sets the rank (2: ``(N, C, H, W)``, 3: ``(N, C, D, H, W)``), or with
``channels_last=True`` ``(N, H, W, C)`` / ``(N, D, H, W, C)`` (Flax's layout; cuDNN reads it in
place). Output size ``(in + lo + hi - window) // stride + 1`` (no ceil mode). cuDNN pads both
sides of a dimension alike, by less than the window; asymmetric padding (``(lo, hi)`` pairs:
``flax.linen``'s ``'SAME'`` with a stride) gives cuDNN the smaller side and pads the input's
other side by the difference first (``jnp.pad``, a copy of the input per call: with ``-inf``
for max pooling, zeros for an average that counts the padding). Max pooling propagates NaN
and padding never wins a max; average pooling counts the padding (``count_include_pad=True``,
Flax's and PyTorch's default) or not (symmetric padding only).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from ..highlevel import dnn_pool, dnn_pool_grad
from . import _ops, _request
from ._operands import views
from ._padding import pairs, split

__all__ = ["Pool", "PoolGrad", "avg_pool", "max_pool"]

_MODES = ("max", "average_inc_pad", "average_exc_pad")


@dataclasses.dataclass(frozen=True)
class Pool(_request.Request):
    """``y = pool(x)``: operand ``x``, result ``y``."""

    family = "pool"
    mode: str
    window: tuple[int, ...]
    strides: tuple[int, ...]
    padding: tuple[int, ...]
    channels_last: bool

    def __post_init__(self) -> None:
        func = self.func
        if self.mode not in _MODES:
            raise ValueError(f"{func}: mode={self.mode!r}; expected one of {_MODES}")
        if not isinstance(self.window, tuple) or len(self.window) not in (2, 3):
            raise ValueError(f"{func}: window={self.window!r}; expected 2 or 3 ints (the rank)")
        nd = len(self.window)
        window = _request.ints(self.window, nd, "window", func, 1)
        strides = _request.ints(self.strides, nd, "strides", func, 1)
        padding = _request.ints(self.padding, nd, "padding", func, 0)
        if any(p >= w for p, w in zip(padding, window, strict=True)):
            raise ValueError(
                f"{func}: padding={padding} must be smaller than the window {window} in every "
                "dim (every window then covers an input element)"
            )
        for name, v in (("window", window), ("strides", strides), ("padding", padding)):
            object.__setattr__(self, name, v)
        object.__setattr__(self, "channels_last", bool(self.channels_last))

    @property
    def func(self) -> str:
        """The public function's name (error messages)."""
        return "pycudnn.jax.max_pool" if self.mode == "max" else "pycudnn.jax.avg_pool"

    def batch_operands(self) -> tuple[bool, ...]:
        return (True,)

    def results(self, *operands: Any) -> _ops.Results:
        x = operands[0]
        dt = _request.check_dtype(self.func, "x", x)
        nd = len(self.window)
        shape = tuple(x.shape)
        if len(shape) != nd + 2:
            raise ValueError(
                f"{self.func}: x has shape {shape}; a {nd}-D window needs {nd + 2} dims "
                f"({'(N, spatial..., C)' if self.channels_last else '(N, C, spatial...)'})"
            )
        spatial = shape[1:-1] if self.channels_last else shape[2:]
        out = []
        for n, w, s, p in zip(spatial, self.window, self.strides, self.padding, strict=True):
            if _request.known(n) and n + 2 * p < w:
                raise ValueError(
                    f"{self.func}: the window {self.window} is larger than the padded input "
                    f"(x shape {shape}, padding {self.padding})"
                )
            out.append((n + 2 * p - w) // s + 1)
        if self.channels_last:
            return (((shape[0], *out, shape[-1]), dt),)
        return (((shape[0], shape[1], *out), dt),)

    def run(self, args: Sequence[Any], rets: Sequence[Any], stream: int) -> None:
        x, y = views(args, rets, (self.channels_last,) * 2)
        dnn_pool(x, self.window, self.strides, self.mode, self.padding, out=y, stream=stream)


@dataclasses.dataclass(frozen=True)
class PoolGrad(Pool):
    """The gradient: operands ``x``, ``y``, ``dy`` (``dnn_pool_grad``'s order), result ``dx``."""

    def batch_operands(self) -> tuple[bool, ...]:
        return (True, True, True)

    def results(self, *operands: Any) -> _ops.Results:
        x, y, dy = operands
        ((shape, dt),) = super().results(x)
        for name, a in (("y", y), ("dy", dy)):
            if tuple(a.shape) != tuple(shape) or a.dtype != dt:
                raise ValueError(
                    f"{self.func} gradient: {name} is {a.dtype}{list(a.shape)}; expected "
                    f"{dt}{list(shape)}"
                )
        return ((tuple(x.shape), dt),)

    def run(self, args: Sequence[Any], rets: Sequence[Any], stream: int) -> None:
        x, y, dy, dx = views(args, rets, (self.channels_last,) * 4)
        dnn_pool_grad(
            x,
            y,
            dy,
            self.window,
            self.strides,
            self.mode,
            self.padding,
            img_grad=dx,
            stream=stream,
        )


def _forward(request: Pool, x: Any) -> tuple[Any, Any]:
    (y,) = _ops.call(request, x)
    return y, (x, y)


def _backward(request: Pool, residuals: Any, dy: Any) -> tuple:
    x, y = residuals
    grad = PoolGrad(
        request.mode, request.window, request.strides, request.padding, request.channels_last
    )
    (dx,) = _ops.call(grad, x, y, dy)
    return (dx,)


_pool = _ops.differentiable(_forward, _backward)


def _pooled(mode: str, x: Any, window: Any, strides: Any, padding: Any, cl: bool) -> jax.Array:
    """The pooling of *x*: what cuDNN's symmetric padding leaves of asymmetric *padding* padded
    onto *x* first (``-inf`` for max pooling, zeros for an average counting the padding)."""
    func = "pycudnn.jax.max_pool" if mode == "max" else "pycudnn.jax.avg_pool"
    if isinstance(window, int) or not isinstance(window, Sequence):
        raise TypeError(f"{func}: window={window!r}; expected a tuple of 2 or 3 ints (the rank)")
    nd = len(window)
    strides = window if strides is None else strides
    pads = pairs(padding, nd, func)
    x = jnp.asarray(x)
    if any(lo != hi for lo, hi in pads):
        _request.check_dtype(func, "x", x)  # (before the pad: -inf is no int)
        if mode == "average_exc_pad":
            raise ValueError(
                f"{func}: padding={padding!r} with count_include_pad=False; cuDNN excludes only "
                "symmetric padding from the count: use equal (lo, hi) or count_include_pad=True"
            )
    x, sym = split(x, pads, cl, -jnp.inf if mode == "max" else 0.0)
    request = Pool(mode, tuple(window), _request.ints(strides, nd, "strides", func, 1), sym, cl)
    return _pool(request, x)


def max_pool(
    x: Any,
    window: Sequence[int],
    strides: int | Sequence[int] | None = None,
    padding: int | Sequence[int] | Sequence[tuple[int, int]] = 0,
    *,
    channels_last: bool = False,
) -> jax.Array:
    """Max pooling through cuDNN (``dnn_pool``), differentiable.

    Parameters
    ----------
    x : jax.Array
        ``(N, C, H, W)`` or ``(N, C, D, H, W)``; with *channels_last* ``(N, H, W, C)`` or
        ``(N, D, H, W, C)``. float16, bfloat16, float32 or float64.
    window : tuple of 2 or 3 ints
        The window; its length is the number of spatial dims.
    strides : int or tuple of int, optional
        Default: the window (PyTorch's and Keras' default; Flax's is 1).
    padding : int, tuple of int or tuple of (lo, hi) pairs
        Per spatial dim; it never wins a max. Equal sides must be smaller than the window;
        unequal ones pad the input by their difference first (a copy of x per call).
    channels_last : bool
        The channels are the last dim.

    Returns
    -------
    jax.Array
        ``(N, C, out...)`` (or channels-last), ``out = (in + lo + hi - window) // stride + 1``.

    Raises
    ------
    TypeError, ValueError
        At trace time: bad window/strides/padding, a rank that does not match the window, a
        window larger than the padded input, a dtype cuDNN does not take.
    """
    return _pooled("max", x, window, strides, padding, channels_last)


def avg_pool(
    x: Any,
    window: Sequence[int],
    strides: int | Sequence[int] | None = None,
    padding: int | Sequence[int] | Sequence[tuple[int, int]] = 0,
    *,
    count_include_pad: bool = True,
    channels_last: bool = False,
) -> jax.Array:
    """Average pooling through cuDNN (``dnn_pool``), differentiable. Arguments as
    :func:`max_pool`, and *count_include_pad*: divide by the window's size (True, the default)
    or by the number of input elements in it (False; symmetric padding only)."""
    mode = "average_inc_pad" if count_include_pad else "average_exc_pad"
    return _pooled(mode, x, window, strides, padding, channels_last)
