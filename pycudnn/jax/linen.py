"""``flax.linen`` layers on pycudnn: drop-in subclasses of Flax's own (imports Flax).

Each class **is** Flax's class (``isinstance(pycudnn.jax.linen.Conv(...), flax.linen.Conv)``)
with the same fields, defaults, parameter names, shapes, layouts and initializers -- a model's
variables load into either unchanged -- and a ``__call__`` that runs pycudnn's operation
(:mod:`pycudnn.jax`: cuDNN through XLA's FFI, jittable and differentiable) instead of XLA's.
What cuDNN does not take is refused with an error naming the field (a 1-D convolution,
``input_dilation``, a ``mask``, circular padding, normalization over other axes than the last):
use Flax's own class there.

Layers: :class:`Conv` (2-D and 3-D, channels-last as Flax's; the extra field ``activation``
fuses ``relu``/``sigmoid``/``tanh`` and ``__call__``'s ``residual`` is added in the
convolution's epilogue), :class:`BatchNorm`, :class:`LayerNorm`, :class:`RMSNorm`;
functions :func:`max_pool` and :func:`avg_pool` with Flax's signatures; :class:`LSTM` and
:class:`GRU`, Flax's ``nn.RNN(nn.LSTMCell(features))`` / ``GRUCell`` (the same variables) as
one cuDNN call over the sequence; and
:func:`dot_product_attention`, Flax's attention function with cuDNN's fused attention inside
(``nn.MultiHeadDotProductAttention(..., attention_fn=dot_product_attention)``).

Needs Flax (``pip install flax``); importing this module without it raises an ``ImportError``
saying so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

try:
    from flax import linen as nn
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "pycudnn.jax.linen needs Flax, which is not installed: pip install flax"
    ) from exc

import jax
import jax.numpy as jnp

from . import _layers
from ._attention import dot_product_attention as _attention
from ._pooling import avg_pool as _avg_pool
from ._pooling import max_pool as _max_pool

__all__ = [
    "GRU",
    "LSTM",
    "BatchNorm",
    "Conv",
    "LayerNorm",
    "RMSNorm",
    "avg_pool",
    "dot_product_attention",
    "max_pool",
]

_PROMOTE = nn.Conv.__dataclass_fields__["promote_dtype"].default


class Conv(nn.Conv):
    """``flax.linen.Conv`` through cuDNN (see the module docstring).

    Attributes
    ----------
    activation : {None, 'relu', 'sigmoid', 'tanh'}
        Applied in the convolution's epilogue, after the bias (pycudnn's addition to Flax's
        fields; default None).
    """

    activation: str | None = None

    @nn.compact
    def __call__(self, inputs: jax.Array, residual: jax.Array | None = None) -> jax.Array:
        """``activation(conv(inputs) + residual + bias)``; *inputs* ``(*batch, *spatial,
        in_features)``, *residual* of the result's shape (optional)."""
        name = type(self).__qualname__
        _layers.check_flags(name, use_bias=self.use_bias)
        if not self.shared_weights:
            raise NotImplementedError(f"{name}: unshared (ConvLocal) kernels are not supported")
        if self.conv_general_dilated is not None or self.conv_general_dilated_cls is not None:
            raise ValueError(f"{name}: conv_general_dilated replaces pycudnn's call: use nn.Conv")
        _layers.check_default(name, "promote_dtype", self.promote_dtype, _PROMOTE)
        ks = (self.kernel_size,) if isinstance(self.kernel_size, int) else tuple(self.kernel_size)
        groups = self.feature_group_count
        kernel_shape = (*ks, inputs.shape[-1] // groups, self.features)
        kernel = self.param("kernel", self.kernel_init, kernel_shape, self.param_dtype)
        bias = None
        if self.use_bias:
            bias = self.param("bias", self.bias_init, (self.features,), self.param_dtype)
        return _layers.conv_layer(
            name, inputs, kernel, bias, strides=self.strides, padding=self.padding,
            input_dilation=self.input_dilation, kernel_dilation=self.kernel_dilation,
            feature_group_count=groups, mask=self.mask, dtype=self.dtype,
            activation=self.activation, residual=residual,
        )  # fmt: skip


class LayerNorm(nn.LayerNorm):
    """``flax.linen.LayerNorm`` through cuDNN, over the last axis (see the module docstring)."""

    @nn.compact
    def __call__(self, x: jax.Array, *, mask: jax.Array | None = None) -> jax.Array:
        """Normalize *x* over its last axis (no *mask*)."""
        name = type(self).__qualname__
        _layers.check_flags(name, use_bias=self.use_bias, use_scale=self.use_scale)
        n = (x.shape[-1],)
        scale = bias = None
        if self.use_scale:
            scale = self.param("scale", self.scale_init, n, self.param_dtype)
        if self.use_bias:
            bias = self.param("bias", self.bias_init, n, self.param_dtype)
        return _layers.norm_layer(
            name, x, scale, bias, rms=False, epsilon=self.epsilon, dtype=self.dtype,
            reduction_axes=self.reduction_axes, feature_axes=self.feature_axes,
            axis_name=self.axis_name, mask=mask,
        )  # fmt: skip


class RMSNorm(nn.RMSNorm):
    """``flax.linen.RMSNorm`` through cuDNN, over the last axis (see the module docstring)."""

    @nn.compact
    def __call__(self, x: jax.Array, *, mask: jax.Array | None = None) -> jax.Array:
        """RMS-normalize *x* over its last axis (no *mask*)."""
        name = type(self).__qualname__
        _layers.check_flags(name, use_scale=self.use_scale)
        n = (x.shape[-1],)
        scale = None
        if self.use_scale:
            scale = self.param("scale", self.scale_init, n, self.param_dtype)
        return _layers.norm_layer(
            name, x, scale, None, rms=True, epsilon=self.epsilon, dtype=self.dtype,
            reduction_axes=self.reduction_axes, feature_axes=self.feature_axes,
            axis_name=self.axis_name, mask=mask,
        )  # fmt: skip


class BatchNorm(nn.BatchNorm):
    """``flax.linen.BatchNorm`` through cuDNN, per feature of the last axis (see the module
    docstring): the same ``params`` (``scale``, ``bias``) and ``batch_stats`` (``mean``,
    ``var``), Flax's running averages (biased variance, ``momentum`` the old value's weight)."""

    @nn.compact
    def __call__(
        self,
        x: jax.Array,
        use_running_average: bool | None = None,
        *,
        mask: jax.Array | None = None,
    ) -> jax.Array:
        """Normalize *x* (batch statistics unless *use_running_average*; no *mask*)."""
        name = type(self).__qualname__
        _layers.check_flags(name, use_bias=self.use_bias, use_scale=self.use_scale)
        use_ra = nn.module.merge_param(
            "use_running_average", self.use_running_average, use_running_average
        )
        c = x.shape[-1]
        sdt = jnp.float32 if self.force_float32_reductions else self.param_dtype
        ra_mean = self.variable("batch_stats", "mean", lambda s: jnp.zeros(s, sdt), (c,))
        ra_var = self.variable("batch_stats", "var", lambda s: jnp.ones(s, sdt), (c,))
        scale = bias = None
        if self.use_scale:
            scale = self.param("scale", self.scale_init, (c,), self.param_dtype)
        if self.use_bias:
            bias = self.param("bias", self.bias_init, (c,), self.param_dtype)
        y, new_mean, new_var = _layers.batch_norm_layer(
            name, x, scale, bias, ra_mean.value, ra_var.value, use_running_average=use_ra,
            axis=self.axis, momentum=self.momentum, epsilon=self.epsilon, dtype=self.dtype,
            axis_name=self.axis_name, mask=mask,
        )  # fmt: skip
        if not use_ra and not self.is_initializing():
            ra_mean.value, ra_var.value = new_mean, new_var
        return y


def _pool_args(
    func: str, x: jax.Array, window_shape: Sequence[int], strides: Any, padding: Any
) -> tuple[tuple[int, ...], tuple[int, ...], Any]:
    window = tuple(window_shape)
    strides = (1,) * len(window) if strides is None else tuple(strides)
    if x.ndim != len(window) + 2:
        raise ValueError(
            f"{func}: inputs of shape {x.shape}; expected (batch, {len(window)} spatial dims, "
            "features)"
        )
    if isinstance(padding, str):
        if padding.upper() not in ("VALID", "SAME"):
            raise NotImplementedError(
                f"{func}: padding={padding!r}; pycudnn takes 'SAME', 'VALID' or (lo, hi) pairs"
            )
        # Flax's (lax.padtype_to_pads'): the odd one on the high side
        padding = tuple(
            (t // 2, t - t // 2)
            for t in (
                max((-(-n // s) - 1) * s + w - n, 0) if padding.upper() == "SAME" else 0
                for n, w, s in zip(x.shape[1:-1], window, strides, strict=True)
            )
        )
    else:
        padding = tuple(tuple(p) for p in padding)
    return window, strides, padding


def max_pool(
    inputs: jax.Array,
    window_shape: Sequence[int],
    strides: Sequence[int] | None = None,
    padding: str | Sequence[tuple[int, int]] = "VALID",
) -> jax.Array:
    """``flax.linen.max_pool`` through cuDNN: *inputs* ``(batch, *spatial, features)``, 2-D or
    3-D windows, strides default 1 (Flax's), ``'VALID'``, ``'SAME'`` or ``(lo, hi)`` pairs
    (unequal sides pad the input by their difference first: a copy of it per call)."""
    w, s, p = _pool_args("pycudnn.jax.linen.max_pool", inputs, window_shape, strides, padding)
    return _max_pool(inputs, w, s, p, channels_last=True)


def avg_pool(
    inputs: jax.Array,
    window_shape: Sequence[int],
    strides: Sequence[int] | None = None,
    padding: str | Sequence[tuple[int, int]] = "VALID",
    count_include_pad: bool = True,
) -> jax.Array:
    """``flax.linen.avg_pool`` through cuDNN (arguments as :func:`max_pool`)."""
    _layers.check_flags("pycudnn.jax.linen.avg_pool", count_include_pad=count_include_pad)
    w, s, p = _pool_args("pycudnn.jax.linen.avg_pool", inputs, window_shape, strides, padding)
    return _avg_pool(inputs, w, s, p, count_include_pad=count_include_pad, channels_last=True)


class _Recurrent(nn.Module):
    """Flax's ``nn.RNN`` over one cell, as one cuDNN call (see :class:`LSTM`)."""

    features: int
    time_major: bool = False
    return_carry: bool = False
    _mode = ""  # class attributes, not fields: set by each layer below
    _cell = None

    @nn.compact
    def __call__(
        self,
        inputs: jax.Array,
        *,
        initial_carry: Any = None,
        seq_lengths: Sequence[int] | None = None,
    ) -> Any:
        """The outputs ``(batch, time, features)`` (time-major: ``(time, batch, ...)``), and
        the final carry first with *return_carry*. *seq_lengths*, if given, are concrete ints
        (cuDNN reads them on the host): steps past a sequence's length give zeros and its
        carry is its own last step's."""
        name = type(self).__qualname__
        _layers.check_flags(name, return_carry=self.return_carry)
        cell = self._cell(self.features, name="cell")
        x = jnp.asarray(inputs)
        if self.is_initializing() and x.ndim == 3:  # the cell's own parameters (XLA drops
            step = x[0] if self.time_major else x[:, 0]  # the unused step)
            cell(cell.initialize_carry(jax.random.key(0), step.shape), step)
        carry, y = _layers.recurrent_layer(
            name, x, self.variables["params"]["cell"], mode=self._mode,
            features=self.features, time_major=self.time_major, initial_carry=initial_carry,
            seq_lengths=seq_lengths,
        )  # fmt: skip
        return (carry, y) if self.return_carry else y


class LSTM(_Recurrent):
    """``flax.linen.RNN(flax.linen.LSTMCell(features))`` as **one** cuDNN call over the whole
    sequence (:func:`pycudnn.jax.rnn`), where Flax's scans the cell step by step.

    Its variables are ``nn.RNN``'s (``{"cell": {"ii": ..., "hi": ...}}``, Flax's
    ``LSTMCell`` names, shapes and initializers), so either loads the other's. (Inside a
    compact method, Flax's twin is ``nn.RNN(nn.LSTMCell(features, parent=None))``: a cell made
    there without ``parent=None`` belongs to the enclosing module, not to the RNN.) The cell's
    equations are Flax's defaults (sigmoid gates, tanh); Flax's cell has no input-side biases,
    which are zero in cuDNN's packed weights (:func:`pycudnn.jax.rnn_weights_from_flax`).

    Attributes
    ----------
    features : int
        The hidden size.
    time_major : bool
        Inputs ``(time, batch, features)`` (default False: ``(batch, time, features)``).
    return_carry : bool
        Return ``(carry, outputs)`` with ``carry = (c, h)``, as ``nn.RNN``.
    """

    _mode = "lstm"
    _cell = nn.LSTMCell


class GRU(_Recurrent):
    """``flax.linen.RNN(flax.linen.GRUCell(features))`` as one cuDNN call (see :class:`LSTM`;
    the carry is ``h``). Flax's GRU cell is cuDNN's (PyTorch's) with the reset and update
    gates' recurrent biases zero."""

    _mode = "gru"
    _cell = nn.GRUCell


def dot_product_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    bias: jax.Array | None = None,
    mask: jax.Array | None = None,
    broadcast_dropout: bool = True,
    dropout_rng: Any = None,
    dropout_rate: float = 0.0,
    deterministic: bool = False,
    dtype: Any = None,
    precision: Any = None,
    module: Any = None,
    is_causal: bool = False,
    **unused: Any,
) -> jax.Array:
    """``flax.linen.dot_product_attention``'s signature on cuDNN's fused attention
    (:func:`pycudnn.jax.dot_product_attention`): pass it as ``attention_fn`` to Flax's
    attention modules. *query*, *key*, *value* ``(batch, length, heads, head_dim)`` in float16
    or bfloat16 (give the module ``dtype=jnp.bfloat16``); a boolean *mask* (True: attend)
    becomes an additive bias, NNX's ``is_causal`` cuDNN's causal mask; dropout is refused
    (``dropout_rate`` 0 or ``deterministic``);
    *precision* and the einsum hooks are XLA's and do not apply."""
    func = "pycudnn.jax.linen.dot_product_attention"
    for opt, given in unused.items():  # Flax's einsum hooks and float32-softmax flag
        if given not in (None, False):
            raise NotImplementedError(f"{func}: {opt}={given!r} is XLA's; not supported")
    if dropout_rate and not deterministic:
        raise NotImplementedError(
            f"{func}: dropout_rate={dropout_rate!r}; attention dropout is not supported "
            "(use 0, or deterministic=True)"
        )
    if dtype is not None:
        query, key, value = (jnp.asarray(a, dtype) for a in (query, key, value))
    if bias is not None:
        bias = jnp.asarray(bias, query.dtype)
    mask = None if mask is None else jnp.asarray(mask, bool)  # (Flax's masks are 0/1 floats too)
    return _attention(query, key, value, bias, mask, is_causal=is_causal)
