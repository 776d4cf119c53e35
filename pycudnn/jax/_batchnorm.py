"""Batch normalization as a JAX function on ``dnn_batch_normalization_train`` / ``_test`` /
``_grad`` (cuDNN's legacy batch-norm calls).

Training normalizes with the batch's statistics (biased variance) and returns new running
averages, PyTorch's way: ``new = (1 - momentum) * running + momentum * batch``, with the
batch's **unbiased** variance (``m / (m - 1)``) in the running variance, as the high level's
``running_average_factor`` does. cuDNN's training call writes the batch mean and ``invstd =
1 / sqrt(var + epsilon)`` (float32, or float64 for float64 data), which the backward reads; the
running averages are updated by XLA from those two (``var = invstd**-2 - epsilon``), so the FFI
call takes and writes no running buffers and its entry is lean (a running update inside
cuDNN's call needs the running buffers aliased in and out, which the bound launch's pointer
count refuses). Inference normalizes with the running averages (cuDNN's inference call); its
gradient is XLA's (cuDNN has no inference backward): elementwise products and per-channel sums.

Layouts: ``(N, C, spatial...)`` (2 to 5 dims), or with ``channels_last=True`` ``(N, spatial...,
C)`` (read in place). ``'spatial'`` normalizes each channel over the batch and spatial dims
(``BatchNorm2d``); ``'per-activation'`` each element of ``x.shape[1:]`` over the batch
(``BatchNorm1d`` on ``(N, C)``; channels first only). Data: float16, bfloat16, float32, float64;
the parameters and running averages float32 (float64 for float64 data): cuDNN's rule.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..descriptors import BN_MIN_EPSILON
from ..highlevel import (
    dnn_batch_normalization_grad,
    dnn_batch_normalization_test,
    dnn_batch_normalization_train,
)
from . import _ops, _request
from ._operands import views

__all__ = ["BatchNorm", "BatchNormGrad", "BatchNormInference", "batch_norm"]

_FUNC = "pycudnn.jax.batch_norm"
_MODES = ("spatial", "per-activation")


@dataclasses.dataclass(frozen=True)
class BatchNorm(_request.Request):
    """Training forward: operands ``x``, ``gamma``, ``beta``; results ``mean``, ``invstd``,
    ``y`` (``dnn_batch_normalization_train``'s output order: the bound launch's pointers)."""

    family = "batchnorm"
    batch_results = False  # the statistics are per channel: a vmapped call runs per example
    mode: str
    epsilon: float
    channels_last: bool

    def __post_init__(self) -> None:
        if self.mode not in _MODES:
            raise ValueError(f"{_FUNC}: mode={self.mode!r}; expected one of {_MODES}")
        eps = _request.real(self.epsilon, "epsilon", _FUNC)
        if eps < BN_MIN_EPSILON:
            raise ValueError(
                f"{_FUNC}: epsilon={self.epsilon!r}; expected >= {BN_MIN_EPSILON} "
                "(CUDNN_BN_MIN_EPSILON)"
            )
        object.__setattr__(self, "epsilon", eps)
        if not isinstance(self.channels_last, bool):
            raise TypeError(f"{_FUNC}: channels_last={self.channels_last!r}; expected a bool")
        if self.channels_last and self.mode != "spatial":
            raise ValueError(
                f"{_FUNC}: mode='per-activation' with channels_last=True; per-activation "
                "normalization takes channels-first data"
            )

    def batch_operands(self) -> tuple[bool, ...]:
        return (False, False, False)

    @property
    def spatial(self) -> bool:
        """Whether each channel is normalized over the batch and the spatial dims."""
        return self.mode == "spatial"

    def param_shape(self, shape: tuple[Any, ...]) -> tuple[Any, ...]:
        """The parameters' (and statistics') shape for data of *shape*."""
        if not self.spatial:
            return tuple(shape[1:])
        return (shape[-1],) if self.channels_last else (shape[1],)

    def check(self, x: Any, params: Sequence[tuple[str, Any]]) -> tuple[np.dtype, np.dtype]:
        """Check *x* and the named parameters; ``(data dtype, parameter dtype)``."""
        dt = _request.check_dtype(_FUNC, "x", x)
        shape = tuple(x.shape)
        if not 2 <= len(shape) <= 5:
            raise ValueError(
                f"{_FUNC}: x has shape {shape}; expected 2 to 5 dims "
                f"({'(N, spatial..., C)' if self.channels_last else '(N, C, spatial...)'})"
            )
        pdt = np.dtype("float64") if dt == np.dtype("float64") else np.dtype("float32")
        ps = self.param_shape(shape)
        for name, p in params:
            if tuple(p.shape) != ps or np.dtype(p.dtype) != pdt:
                # a wrong dtype is a TypeError (cuDNN's rule: not converted), a shape a ValueError
                error = TypeError if np.dtype(p.dtype) != pdt else ValueError
                raise error(
                    f"{_FUNC}: {name} is {np.dtype(p.dtype).name}{list(p.shape)}; expected "
                    f"{pdt.name}{list(ps)} (cuDNN's parameters are float32, float64 for "
                    "float64 data)"
                )
        return dt, pdt

    def results(self, *operands: Any) -> _ops.Results:
        x, gamma, beta = operands
        dt, pdt = self.check(x, (("gamma", gamma), ("beta", beta)))
        stat = (self.param_shape(tuple(x.shape)), pdt)
        return (stat, stat, (tuple(x.shape), dt))

    def _views(self, args: Sequence[Any], rets: Sequence[Any], data: Sequence[bool]) -> tuple:
        """The operands, the data ones (*data* flags) in this request's layout."""
        return views(args, rets, tuple(self.channels_last and d for d in data))

    def run(self, args: Sequence[Any], rets: Sequence[Any], stream: int) -> None:
        x, gamma, beta, mean, invstd, y = self._views(args, rets, (1, 0, 0, 0, 0, 1))
        dnn_batch_normalization_train(
            x,
            gamma,
            beta,
            self.mode,
            self.epsilon,
            out=y,
            out_mean=mean,
            out_invstd=invstd,
            stream=stream,
        )


@dataclasses.dataclass(frozen=True)
class BatchNormGrad(BatchNorm):
    """The training backward: operands ``x``, ``dy``, ``gamma``, ``mean``, ``invstd``
    (``dnn_batch_normalization_grad``'s order); results ``dgamma``, ``dbeta``, ``dx``."""

    def batch_operands(self) -> tuple[bool, ...]:
        return (False,) * 5

    def results(self, *operands: Any) -> _ops.Results:
        x, dy, gamma, mean, invstd = operands
        dt, pdt = self.check(x, (("gamma", gamma), ("mean", mean), ("invstd", invstd)))
        if tuple(dy.shape) != tuple(x.shape) or np.dtype(dy.dtype) != dt:
            raise ValueError(
                f"{_FUNC} gradient: dy is {dy.dtype}{list(dy.shape)}; expected x's "
                f"{dt}{list(x.shape)}"
            )
        stat = (tuple(gamma.shape), pdt)
        return (stat, stat, (tuple(x.shape), dt))

    def run(self, args: Sequence[Any], rets: Sequence[Any], stream: int) -> None:
        ops = self._views(args, rets, (1, 1, 0, 0, 0, 0, 0, 1))
        x, dy, gamma, mean, invstd, dgamma, dbeta, dx = ops
        dnn_batch_normalization_grad(
            x,
            dy,
            gamma,
            mean,
            invstd,
            self.mode,
            self.epsilon,
            out=dx,
            out_dscale=dgamma,
            out_dbias=dbeta,
            stream=stream,
        )


@dataclasses.dataclass(frozen=True)
class BatchNormInference(BatchNorm):
    """Inference: operands ``x``, ``gamma``, ``beta``, ``mean``, ``var`` (the running
    averages); result ``y``. Elementwise per channel: a vmapped batch of x folds."""

    batch_results = True

    def batch_operands(self) -> tuple[bool, ...]:
        return (True, False, False, False, False)

    def results(self, *operands: Any) -> _ops.Results:
        x, *params = operands
        names = ("gamma", "beta", "running_mean", "running_var")
        dt, _ = self.check(x, tuple(zip(names, params, strict=True)))
        return ((tuple(x.shape), dt),)

    def run(self, args: Sequence[Any], rets: Sequence[Any], stream: int) -> None:
        x, gamma, beta, mean, var, y = self._views(args, rets, (1, 0, 0, 0, 0, 1))
        dnn_batch_normalization_test(
            x, gamma, beta, mean, var, self.mode, self.epsilon, out=y, stream=stream
        )


def _forward_train(request: BatchNorm, x: Any, gamma: Any, beta: Any) -> tuple[Any, Any]:
    mean, invstd, y = _ops.call(request, x, gamma, beta)
    return (y, mean, invstd), (x, gamma, mean, invstd)


def _backward_train(request: BatchNorm, residuals: Any, cotangents: Any) -> tuple:
    x, gamma, mean, invstd = residuals
    # the statistics leave the primal through stop_gradient (batch_norm): their cotangents are
    # zeros, and only dy reaches cuDNN's backward
    dy = cotangents[0]
    grad = BatchNormGrad(request.mode, request.epsilon, request.channels_last)
    dgamma, dbeta, dx = _ops.call(grad, x, dy, gamma, mean, invstd)
    return dx, dgamma, dbeta


#: the training call (differentiable): ``(y, mean, invstd)``; also the Flax layers'
train_call = _ops.differentiable(_forward_train, _backward_train)


def _axes(request: BatchNorm, ndim: int) -> tuple[int, ...]:
    """The axes the statistics average over for data of *ndim* dims (also where a parameter
    is broadcast: it has the other dims)."""
    if not request.spatial:
        return (0,)
    channel = ndim - 1 if request.channels_last else 1
    return tuple(a for a in range(ndim) if a != channel)


def _forward_inference(request: BatchNorm, x: Any, *params: Any) -> tuple[Any, Any]:
    (y,) = _ops.call(request, x, *params)
    return y, (x, *params)


def _backward_inference(request: BatchNorm, residuals: Any, dy: Any) -> tuple:
    # cuDNN has no inference backward; y = (x - mean) * gamma * rsqrt(var + eps) + beta is
    # elementwise per channel, so XLA's products and sums are the gradient
    x, gamma, beta, mean, var = residuals
    axes = _axes(request, x.ndim)
    acc = gamma.dtype  # float32 (float64 for float64 data): half types accumulate there

    def b(p: Any) -> Any:
        return jnp.expand_dims(p, axes)

    inv = jax.lax.rsqrt(var + jnp.asarray(request.epsilon, acc))
    dyf, xc = dy.astype(acc), x.astype(acc) - b(mean)
    dx = (dyf * b(gamma * inv)).astype(x.dtype)
    dbeta = jnp.sum(dyf, axis=axes)
    dxhat = jnp.sum(dyf * xc, axis=axes)
    dgamma = dxhat * inv
    dmean = -dbeta * gamma * inv
    dvar = -0.5 * gamma * dxhat * inv**3
    return dx, dgamma, dbeta.astype(beta.dtype), dmean, dvar


#: the inference call (differentiable): ``y``; also the Flax layers'
inference_call = _ops.differentiable(_forward_inference, _backward_inference)


def _array(func: str, name: str, value: Any) -> jax.Array:
    if value is None or isinstance(value, (bool, str, bytes)):
        raise TypeError(f"{func}: {name}={value!r}; expected an array")
    return jnp.asarray(value)


def batch_norm(
    x: Any,
    gamma: Any,
    beta: Any,
    running_mean: Any = None,
    running_var: Any = None,
    *,
    training: bool,
    momentum: float = 0.1,
    epsilon: float = 1e-5,
    mode: str = "spatial",
    channels_last: bool = False,
) -> tuple[jax.Array, jax.Array | None, jax.Array | None]:
    """Batch normalization through cuDNN, PyTorch's ``F.batch_norm`` as a pure function:
    returns the output and the new running averages; differentiable in *x*, *gamma* and
    *beta* (and, in inference, the running averages).

    Training: ``y = (x - mean) / sqrt(var + epsilon) * gamma + beta`` with the batch's mean and
    biased variance (``dnn_batch_normalization_train``; its backward
    ``dnn_batch_normalization_grad`` from the saved mean and ``invstd``), and
    ``new_running = (1 - momentum) * running + momentum * batch_stat`` with the unbiased
    variance in the running variance (computed by XLA from cuDNN's mean and ``invstd``; not
    differentiated through the batch statistics, as PyTorch's buffers are not). Inference: the
    same formula with the running averages (``dnn_batch_normalization_test``; the gradient is
    XLA's), which are returned unchanged.

    Parameters
    ----------
    x : jax.Array
        ``(N, C, spatial...)`` with 0 to 3 spatial dims, or with *channels_last*
        ``(N, spatial..., C)``; float16, bfloat16, float32 or float64.
    gamma, beta : jax.Array
        ``(C,)`` (``'spatial'``) or ``x.shape[1:]`` (``'per-activation'``); float32, or float64
        for float64 *x* (cuDNN's rule: not converted for you).
    running_mean, running_var : jax.Array, optional
        Shaped and typed as *gamma*; both or neither. Required for inference; in training
        without them no running averages are kept (``None`` is returned for them).
    training : bool
        Batch statistics (True) or the running averages (False). Keyword only.
    momentum : float
        In ``[0, 1]``: the batch's weight in the new running averages (PyTorch's).
    epsilon : float
        Added to the variance; >= ``CUDNN_BN_MIN_EPSILON`` (0 in cuDNN 9) and finite.
    mode : {'spatial', 'per-activation'}
        Per channel over the batch and spatial dims, or per element of ``x.shape[1:]`` over
        the batch (channels first only).
    channels_last : bool
        x (and the result) in channels-last order; ``'spatial'`` only.

    Returns
    -------
    (jax.Array, jax.Array or None, jax.Array or None)
        ``y`` (x's shape and dtype), the new ``running_mean`` and ``running_var`` (as given in
        inference; None in training without running averages).

    Raises
    ------
    TypeError, ValueError
        At trace time: a non-bool *training* or *channels_last*, parameters of the wrong shape
        or dtype, one running average without the other, inference without them, a momentum
        outside ``[0, 1]``, a bad epsilon or mode, a rank outside 2..5, a dtype cuDNN does not
        take, a running variance over one element per statistic (no unbiased variance).
    """
    if not isinstance(training, bool):
        raise TypeError(f"{_FUNC}: training={training!r}; expected a bool")
    request = BatchNorm(mode, epsilon, channels_last)
    momentum = _request.real(momentum, "momentum", _FUNC)
    if not 0.0 <= momentum <= 1.0:
        raise ValueError(f"{_FUNC}: momentum={momentum!r}; expected a number in [0, 1]")
    x = _array(_FUNC, "x", x)
    gamma, beta = _array(_FUNC, "gamma", gamma), _array(_FUNC, "beta", beta)
    if (running_mean is None) != (running_var is None):
        given = "running_mean" if running_var is None else "running_var"
        raise ValueError(f"{_FUNC}: only {given} was given; expected both or neither")
    running = running_mean is not None
    if running:
        running_mean = _array(_FUNC, "running_mean", running_mean)
        running_var = _array(_FUNC, "running_var", running_var)
    if not training:
        if not running:
            raise ValueError(
                f"{_FUNC}: training=False normalizes with the running averages; pass "
                "running_mean and running_var"
            )
        inf = BatchNormInference(mode, request.epsilon, channels_last)
        y = inference_call(inf, x, gamma, beta, running_mean, running_var)
        return y, running_mean, running_var
    if running:  # checked here so that the error names them, before the call's own checks
        request.check(x, (("running_mean", running_mean), ("running_var", running_var)))
    y, mean, invstd = train_call(request, x, gamma, beta)
    if not running:
        return y, None, None
    axes = _axes(request, x.ndim)
    m = math.prod(x.shape[a] for a in axes)
    if _request.known(m) and m < 2:
        raise ValueError(
            f"{_FUNC}: each statistic averages m = {m} element of x {tuple(x.shape)} "
            f"(mode={mode!r}); the running variance's unbiased variance m / (m - 1) * var "
            "is undefined for m = 1"
        )
    mean, invstd = jax.lax.stop_gradient(mean), jax.lax.stop_gradient(invstd)
    var = invstd**-2 - request.epsilon  # the biased batch variance cuDNN normalized with
    unbiased = var * (m / (m - 1))
    new_mean = (1 - momentum) * running_mean + momentum * mean
    new_var = (1 - momentum) * running_var + momentum * unbiased
    return y, new_mean.astype(running_mean.dtype), new_var.astype(running_var.dtype)
