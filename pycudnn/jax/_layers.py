"""Flax's layer semantics on pycudnn's operations (imports JAX, not Flax): what
:mod:`pycudnn.jax.linen` and :mod:`pycudnn.jax.nnx` share.

Each function takes a layer's options and parameters **in Flax's layouts** (a convolution's
kernel ``(*kernel_size, in // groups, out)`` and channels-last inputs; a norm's ``scale`` and
``bias`` of the feature dim), checks what pycudnn does not take with an error naming the
option, and calls :mod:`pycudnn.jax`'s function; the dtype rules are Flax's
(``flax.linen.dtypes.promote_dtype``: the computation, and the result, in *dtype* or else the
promoted dtype of the input and the parameters).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ._batchnorm import BatchNorm, BatchNormInference, inference_call, train_call
from ._conv import conv as _conv
from ._norms import layer_norm as _layer_norm
from ._norms import rms_norm as _rms_norm
from ._rnn import rnn as _rnn
from ._rnn import rnn_weights_from_flax

__all__ = [
    "batch_norm_layer",
    "check_default",
    "check_flags",
    "conv_layer",
    "norm_layer",
    "recurrent_layer",
]


def check_flags(layer: str, **flags: Any) -> None:
    """Booleans strictly: ``use_bias=1`` is refused, not read as True."""
    for name, value in flags.items():
        if type(value) is not bool:
            raise TypeError(f"{layer}: {name}={value!r}; expected True or False")


def check_default(layer: str, name: str, value: Any, default: Any) -> None:
    """An option pycudnn implements only as Flax's default (a custom promotion rule or XLA
    call replaces what pycudnn computes): anything else refused, naming it."""
    if value is not default:
        raise ValueError(f"{layer}: {name}={value!r}; only Flax's default is supported")


def _promote(dtype: Any, *arrays: Any) -> tuple[Any, ...]:
    dt = jnp.result_type(*(a for a in arrays if a is not None)) if dtype is None else dtype
    return tuple(None if a is None else jnp.asarray(a, dt) for a in arrays)


def _per_dim(layer: str, name: str, value: Any, nd: int) -> tuple[int, ...]:
    if value is None:
        value = 1
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,) * nd
    out = tuple(value)
    if len(out) != nd or not all(isinstance(v, int) and not isinstance(v, bool) for v in out):
        raise ValueError(f"{layer}: {name}={value!r}; expected an int or {nd} ints")
    return out


def conv_layer(
    layer: str,
    x: Any,
    kernel: Any,
    bias: Any,
    *,
    strides: Any,
    padding: Any,
    input_dilation: Any,
    kernel_dilation: Any,
    feature_group_count: int,
    mask: Any,
    dtype: Any,
    activation: str | None = None,
    residual: Any = None,
) -> jax.Array:
    """Flax's ``Conv.__call__`` on :func:`pycudnn.jax.conv`: *x* ``(*batch, *spatial, in)``
    (any number of batch dims, or none), *kernel* ``(*kernel_size, in // groups, out)``;
    ``activation(conv + residual + bias)`` fused into the convolution's epilogue."""
    kernel = jnp.asarray(kernel)
    nd = kernel.ndim - 2
    if nd not in (2, 3):
        raise ValueError(
            f"{layer}: a kernel of {nd} spatial dims {kernel.shape}; pycudnn's convolution is "
            "2-D or 3-D (kernel_size a tuple of 2 or 3 ints)"
        )
    if mask is not None:
        raise NotImplementedError(f"{layer}: mask (a masked kernel) is not supported by pycudnn")
    if _per_dim(layer, "input_dilation", input_dilation, nd) != (1,) * nd:
        raise NotImplementedError(
            f"{layer}: input_dilation={input_dilation!r}; pycudnn's convolution has no input "
            "(lhs) dilation: use 1"
        )
    if isinstance(padding, str) and padding.upper() not in ("SAME", "VALID"):
        raise NotImplementedError(
            f"{layer}: padding={padding!r}; pycudnn takes 'SAME', 'VALID', ints or (lo, hi) pairs"
        )
    x, kernel, bias, residual = _promote(dtype, x, kernel, bias, residual)
    if x.ndim < nd + 1:
        raise ValueError(
            f"{layer}: input of shape {x.shape}; expected (*batch, {nd} spatial dims, features)"
        )
    batch = x.shape[: x.ndim - nd - 1]
    x = x.reshape((-1, *x.shape[x.ndim - nd - 1 :]))  # Flax's flattening of the batch dims
    if residual is not None:
        residual = residual.reshape((-1, *residual.shape[residual.ndim - nd - 1 :]))
    w = jnp.moveaxis(kernel, -1, 0)  # (*k, in/g, out) -> (out, *k, in/g): channels-last
    pad = padding.upper() if isinstance(padding, str) else padding
    y = _conv(
        x, w, _per_dim(layer, "strides", strides, nd), pad,
        _per_dim(layer, "kernel_dilation", kernel_dilation, nd), feature_group_count,
        bias=bias, activation=activation, residual=residual, channels_last=True,
    )  # fmt: skip
    return y.reshape((*batch, *y.shape[1:]))


def _no_mask(layer: str, mask: Any) -> None:
    if mask is not None:  # Flax's masked statistics
        raise NotImplementedError(f"{layer}: mask is not supported by pycudnn")


def _feature_axes(layer: str, reduction_axes: Any, feature_axes: Any) -> None:
    for name, value in (("reduction_axes", reduction_axes), ("feature_axes", feature_axes)):
        if value not in (-1, (-1,)):
            raise NotImplementedError(
                f"{layer}: {name}={value!r}; pycudnn normalizes over the last axis (-1) only"
            )


def norm_layer(
    layer: str,
    x: Any,
    scale: Any,
    bias: Any,
    *,
    rms: bool,
    epsilon: float,
    dtype: Any,
    reduction_axes: Any,
    feature_axes: Any,
    axis_name: Any,
    mask: Any = None,
) -> jax.Array:
    """Flax's ``LayerNorm`` (or, *rms*, ``RMSNorm``) over the last axis on
    :func:`pycudnn.jax.layer_norm` / :func:`~pycudnn.jax.rms_norm`."""
    _no_mask(layer, mask)
    _feature_axes(layer, reduction_axes, feature_axes)
    if axis_name is not None:
        raise NotImplementedError(
            f"{layer}: axis_name={axis_name!r}; statistics across devices are not supported"
        )
    x, scale, bias = _promote(dtype, x, scale, bias)
    n = x.shape[-1:]
    if rms:
        return _rms_norm(x, n, scale, epsilon)
    return _layer_norm(x, n, scale, bias, epsilon)


def batch_norm_layer(
    layer: str,
    x: Any,
    scale: Any,
    bias: Any,
    mean: Any,
    var: Any,
    *,
    use_running_average: bool,
    axis: Any,
    momentum: float,
    epsilon: float,
    dtype: Any,
    axis_name: Any,
    mask: Any = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Flax's ``BatchNorm`` over every axis but the last (the features) on
    :func:`pycudnn.jax.batch_norm`'s calls; returns ``(y, new_mean, new_var)`` with Flax's
    running averages: ``momentum * old + (1 - momentum) * batch`` with the batch's biased
    variance (cuDNN's own update is PyTorch's, unbiased: so it is computed here, from the mean
    and inverse std cuDNN saved). The statistics and parameters compute in float32 (cuDNN's
    rule for half data), x in *dtype* or the promoted dtype."""
    check_flags(layer, use_running_average=use_running_average)
    _no_mask(layer, mask)
    if axis not in (-1, (-1,)):
        raise NotImplementedError(
            f"{layer}: axis={axis!r}; pycudnn normalizes per feature of the last axis (-1) only"
        )
    if axis_name is not None:
        raise NotImplementedError(
            f"{layer}: axis_name={axis_name!r}; statistics across devices are not supported"
        )
    x = jnp.asarray(x)
    (x,) = _promote(dtype if dtype is not None else jnp.result_type(x, mean), x)
    c = x.shape[-1]
    f32 = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
    gamma = jnp.ones((c,), f32) if scale is None else jnp.asarray(scale, f32)
    beta = jnp.zeros((c,), f32) if bias is None else jnp.asarray(bias, f32)
    cl = x.ndim > 2  # (N, ..., C): cuDNN's channels-last; (N, C) is already channels first
    if use_running_average:
        request = BatchNormInference("spatial", epsilon, cl)
        y = inference_call(request, x, gamma, beta, jnp.asarray(mean, f32), jnp.asarray(var, f32))
        return y, mean, var
    y, bmean, invstd = train_call(BatchNorm("spatial", epsilon, cl), x, gamma, beta)
    bmean, invstd = jax.lax.stop_gradient(bmean), jax.lax.stop_gradient(invstd)
    bvar = invstd.astype(f32) ** -2 - epsilon  # the biased variance cuDNN normalized with
    new_mean = momentum * mean + (1 - momentum) * bmean.reshape(c).astype(mean.dtype)
    new_var = momentum * var + (1 - momentum) * bvar.reshape(c).astype(var.dtype)
    return y, new_mean, new_var


def recurrent_layer(
    layer: str,
    x: Any,
    cell_params: Any,
    *,
    mode: str,
    features: int,
    time_major: bool,
    initial_carry: Any,
    seq_lengths: Any,
) -> tuple[Any, jax.Array]:
    """Flax's ``RNN`` over one cell (``LSTMCell``: *mode* ``'lstm'``, ``GRUCell``: ``'gru'``)
    as one :func:`pycudnn.jax.rnn` call; *cell_params* the cell's variables by Flax's names.
    Returns ``(carry, outputs)``, the carry Flax's (``(c, h)`` for an LSTM, ``h`` else)."""
    check_flags(layer, time_major=time_major)
    x = jnp.asarray(x)
    if x.ndim != 3:
        raise ValueError(f"{layer}: inputs of shape {x.shape}; expected 3 dims")
    w = rnn_weights_from_flax(
        [cell_params], mode=mode, input_size=x.shape[-1], hidden_size=features
    ).astype(x.dtype)
    h0 = c0 = None
    if initial_carry is not None:
        if mode == "lstm":
            c0, h0 = (jnp.asarray(a, x.dtype)[None] for a in initial_carry)
        else:
            h0 = jnp.asarray(initial_carry, x.dtype)[None]
    lengths = None if seq_lengths is None else tuple(int(v) for v in seq_lengths)
    y, h, c = _rnn(
        x, h0, c0, w, mode=mode, hidden_size=features, batch_first=not time_major,
        seq_lengths=lengths,
    )  # fmt: skip
    carry = (c[0], h[0]) if c is not None else h[0]
    return carry, y
