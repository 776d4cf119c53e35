"""The spatial transformer as JAX functions on cuDNN's grid generator and bilinear sampler
(``dnn_spatialtf_grid`` / ``dnn_spatialtf_sampler`` and their gradients).

:func:`affine_grid` ``(theta (N, 2, 3), (H, W)) -> grid (N, H, W, 2)``: ``grid[n, h, w] =
theta[n] @ (x_w, y_h, 1)`` over ``x_w = -1 + 2 w / (W - 1)``, ``y_h = -1 + 2 h / (H - 1)``.
:func:`grid_sample` ``(x (N, C, Hi, Wi), grid) -> (N, C, H, W)``: bilinear sampling at ``grid[...,
0]`` (x, along the width) and ``grid[..., 1]`` (y), -1 and 1 the centres of the edge pixels,
zeros outside (PyTorch's ``affine_grid``/``grid_sample`` with ``align_corners=True``,
``padding_mode='zeros'``). :func:`spatial_transformer` is both; JAX chains their gradients
(``dx`` and ``dgrid`` from the sampler's one backward call, ``dtheta`` from the grid
generator's). Images NCHW or, with ``channels_last``, NHWC (cuDNN reads either in place).
float16, float32, float64 (cuDNN's descriptor refuses bfloat16). The sampler's backward
accumulates with atomics: not bitwise reproducible.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..highlevel import (
    dnn_spatialtf_grid,
    dnn_spatialtf_grid_grad,
    dnn_spatialtf_sampler,
    dnn_spatialtf_sampler_grad,
)
from . import _ops, _request
from ._operands import views

__all__ = [
    "AffineGrid",
    "AffineGridGrad",
    "GridSample",
    "GridSampleGrad",
    "affine_grid",
    "grid_sample",
    "spatial_transformer",
]

_TYPES = ("float16", "float32", "float64")


@dataclasses.dataclass(frozen=True)
class AffineGrid(_request.Request):
    """The grid generator: operand ``theta`` ``(N, 2, 3)``, result ``grid`` ``(N, H, W, 2)``."""

    family = "spatialtf"
    height: int
    width: int

    def __post_init__(self) -> None:
        func = "pycudnn.jax.affine_grid"
        size = _request.ints((self.height, self.width), 2, "size", func, 1)
        object.__setattr__(self, "height", size[0])
        object.__setattr__(self, "width", size[1])

    def batch_operands(self) -> tuple[bool, ...]:
        return (True,)

    def results(self, *operands: Any) -> _ops.Results:
        (theta,) = operands
        dt = _request.check_dtype("pycudnn.jax.affine_grid", "theta", theta, _TYPES)
        _theta_shape(theta)
        return (((theta.shape[0], self.height, self.width, 2), dt),)

    def run(self, args: Sequence[Any], rets: Sequence[Any], stream: int) -> None:
        theta, grid = views(args, rets)
        shape = (theta.shape[0], 1, self.height, self.width)
        dnn_spatialtf_grid(theta, shape, out=grid, stream=stream)


@dataclasses.dataclass(frozen=True)
class AffineGridGrad(AffineGrid):
    """The grid generator's backward: operand ``dgrid``, result ``dtheta`` ``(N, 2, 3)``."""

    def results(self, *operands: Any) -> _ops.Results:
        (dgrid,) = operands
        dt = _request.check_dtype("pycudnn.jax.affine_grid", "dgrid", dgrid, _TYPES)
        want = (dgrid.shape[0], self.height, self.width, 2)
        if tuple(dgrid.shape) != want:
            raise ValueError(
                f"pycudnn.jax.affine_grid gradient: dgrid has shape {tuple(dgrid.shape)}; "
                f"expected {want}"
            )
        return (((dgrid.shape[0], 2, 3), dt),)

    def run(self, args: Sequence[Any], rets: Sequence[Any], stream: int) -> None:
        dgrid, dtheta = views(args, rets)
        dnn_spatialtf_grid_grad(dgrid, out=dtheta, stream=stream)


def _theta_shape(theta: Any) -> None:
    if len(theta.shape) != 3 or tuple(theta.shape[1:]) != (2, 3):
        raise ValueError(
            f"pycudnn.jax.affine_grid: theta has shape {tuple(theta.shape)}; expected (N, 2, 3)"
        )


@dataclasses.dataclass(frozen=True)
class GridSample(_request.Request):
    """The sampler: operands ``x``, ``grid``; result ``y`` ``(N, C, H, W)`` (or NHWC)."""

    family = "spatialtf"
    channels_last: bool

    def __post_init__(self) -> None:
        if self.channels_last.__class__ is not bool:
            raise TypeError(
                f"pycudnn.jax.grid_sample: channels_last={self.channels_last!r}; expected a bool"
            )

    def batch_operands(self) -> tuple[bool, ...]:
        return (True, True)

    def out_shape(self, x: Any, grid: Any) -> tuple[Any, ...]:
        """Check *x* and *grid*; the output's shape."""
        func = "pycudnn.jax.grid_sample"
        dt = _request.check_dtype(func, "x", x, _TYPES)
        if np.dtype(grid.dtype) != dt:
            raise TypeError(f"{func}: grid is {grid.dtype}; expected x's {dt}")
        if len(x.shape) != 4:
            layout = "(N, H, W, C)" if self.channels_last else "(N, C, H, W)"
            raise ValueError(f"{func}: x has shape {tuple(x.shape)}; expected 4 dims {layout}")
        n = x.shape[0]
        if len(grid.shape) != 4 or grid.shape[0] != n or grid.shape[3] != 2:
            raise ValueError(
                f"{func}: grid has shape {tuple(grid.shape)}; expected ({n}, H, W, 2) (N of x)"
            )
        h, w = grid.shape[1:3]
        return (n, h, w, x.shape[3]) if self.channels_last else (n, x.shape[1], h, w)

    def results(self, *operands: Any) -> _ops.Results:
        x, grid = operands
        return ((self.out_shape(x, grid), np.dtype(x.dtype)),)

    def run(self, args: Sequence[Any], rets: Sequence[Any], stream: int) -> None:
        cl = self.channels_last
        x, grid, y = views(args, rets, (cl, False, cl))
        dnn_spatialtf_sampler(x, grid, out=y, stream=stream)


@dataclasses.dataclass(frozen=True)
class GridSampleGrad(GridSample):
    """The sampler's backward: operands ``x``, ``grid``, ``dy``; results ``dx``, ``dgrid``."""

    def batch_operands(self) -> tuple[bool, ...]:
        return (True, True, True)

    def results(self, *operands: Any) -> _ops.Results:
        x, grid, dy = operands
        shape = self.out_shape(x, grid)
        if tuple(dy.shape) != shape or dy.dtype != x.dtype:
            raise ValueError(
                f"pycudnn.jax.grid_sample gradient: dy is {dy.dtype}{list(dy.shape)}; expected "
                f"{x.dtype}{list(shape)}"
            )
        dt = np.dtype(x.dtype)
        return ((tuple(x.shape), dt), (tuple(grid.shape), dt))

    def run(self, args: Sequence[Any], rets: Sequence[Any], stream: int) -> None:
        cl = self.channels_last
        x, grid, dy, dx, dgrid = views(args, rets, (cl, False, cl, cl, False))
        dnn_spatialtf_sampler_grad(x, grid, dy, out=(dx, dgrid), stream=stream)


def _grid_forward(request: AffineGrid, theta: Any) -> tuple[Any, Any]:
    (grid,) = _ops.call(request, theta)
    return grid, None


def _grid_backward(request: AffineGrid, _residuals: Any, dgrid: Any) -> tuple:
    (dtheta,) = _ops.call(AffineGridGrad(request.height, request.width), dgrid)
    return (dtheta,)


def _sample_forward(request: GridSample, x: Any, grid: Any) -> tuple[Any, Any]:
    (y,) = _ops.call(request, x, grid)
    return y, (x, grid)


def _sample_backward(request: GridSample, residuals: Any, dy: Any) -> tuple:
    x, grid = residuals
    dx, dgrid = _ops.call(GridSampleGrad(request.channels_last), x, grid, dy)
    return dx, dgrid


_grid = _ops.differentiable(_grid_forward, _grid_backward)
_sample = _ops.differentiable(_sample_forward, _sample_backward)


def _size(func: str, value: Any) -> tuple[int, int]:
    if isinstance(value, (int, np.integer)) or not isinstance(value, Sequence):
        raise TypeError(f"{func}: out_shape={value!r}; expected (H, W), two ints")
    h, w = _request.ints(value, 2, "out_shape", func, 1)
    return h, w


def affine_grid(theta: Any, out_shape: Sequence[int]) -> jax.Array:
    """The sampling grid of affine transformations through cuDNN
    (``dnn_spatialtf_grid``), differentiable in *theta*.

    Parameters
    ----------
    theta : jax.Array
        ``(N, 2, 3)`` matrices mapping output to input coordinates; float16, float32 or
        float64.
    out_shape : (int, int)
        ``(H, W)`` of the grid (the output image).

    Returns
    -------
    jax.Array
        ``(N, H, W, 2)``: ``(x, y)`` in normalized input coordinates (PyTorch's
        ``affine_grid(..., align_corners=True)``).

    Raises
    ------
    TypeError, ValueError
        At trace time: a dtype cuDNN does not take, theta not ``(N, 2, 3)``, a bad size.
    """
    h, w = _size("pycudnn.jax.affine_grid", out_shape)
    theta = jnp.asarray(theta)
    return _grid(AffineGrid(h, w), theta)


def grid_sample(x: Any, grid: Any, *, channels_last: bool = False) -> jax.Array:
    """Bilinear sampling of *x* at *grid* through cuDNN (``dnn_spatialtf_sampler``),
    differentiable in *x* and *grid*.

    Parameters
    ----------
    x : jax.Array
        ``(N, C, Hi, Wi)``, or ``(N, Hi, Wi, C)`` with *channels_last*; float16, float32 or
        float64.
    grid : jax.Array
        ``(N, H, W, 2)`` normalized ``(x, y)`` coordinates (-1 and 1: the centres of the edge
        pixels; outside reads zeros), x's dtype.
    channels_last : bool
        The channels are x's (and the output's) last dim.

    Returns
    -------
    jax.Array
        ``(N, C, H, W)`` (or ``(N, H, W, C)``), x's dtype.

    Raises
    ------
    TypeError, ValueError
        At trace time: dtypes, shapes, a non-bool *channels_last*.
    """
    func = "pycudnn.jax.grid_sample"
    if channels_last.__class__ not in (bool, np.bool_):
        raise TypeError(f"{func}: channels_last={channels_last!r}; expected a bool")
    return _sample(GridSample(bool(channels_last)), jnp.asarray(x), jnp.asarray(grid))


def spatial_transformer(
    theta: Any, x: Any, out_shape: Sequence[int], *, channels_last: bool = False
) -> jax.Array:
    """The spatial transformer through cuDNN: :func:`grid_sample` of *x* at
    :func:`affine_grid` ``(theta, out_shape)``, differentiable in *theta* and *x*.

    Parameters
    ----------
    theta : jax.Array
        ``(N, 2, 3)``, x's dtype.
    x : jax.Array
        ``(N, C, Hi, Wi)`` (or ``(N, Hi, Wi, C)`` with *channels_last*); float16, float32 or
        float64.
    out_shape : (int, int)
        ``(H, W)`` of the output.
    channels_last : bool
        x's and the output's layout.

    Returns
    -------
    jax.Array
        ``(N, C, H, W)`` (or ``(N, H, W, C)``), x's dtype.

    Raises
    ------
    TypeError, ValueError
        As :func:`affine_grid` and :func:`grid_sample`; theta's dtype not x's.
    """
    func = "pycudnn.jax.spatial_transformer"
    x, theta = jnp.asarray(x), jnp.asarray(theta)
    if theta.dtype != x.dtype:
        raise TypeError(f"{func}: theta is {theta.dtype}; expected x's {x.dtype}")
    if x.ndim != 4 or theta.shape[:1] != x.shape[:1]:
        raise ValueError(
            f"{func}: theta {theta.shape} and x {x.shape}; expected (N, 2, 3) and 4-D x of N"
        )
    return grid_sample(x, affine_grid(theta, out_shape), channels_last=channels_last)
