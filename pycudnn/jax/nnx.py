"""``flax.nnx`` layers on pycudnn: drop-in subclasses of Flax's own (imports Flax).

As :mod:`pycudnn.jax.linen`, for Flax's NNX API: each class is Flax's (same constructor, same
``nnx.Param`` names, shapes, layouts and initializers: a model's state loads into either) with
a ``__call__`` that runs :mod:`pycudnn.jax`'s operation; what cuDNN does not take is refused
with an error naming the argument. Layers: :class:`Conv` (2-D and 3-D; the extra keyword
``activation`` and ``__call__``'s ``residual`` are fused into the convolution's epilogue),
:class:`BatchNorm`, :class:`LayerNorm`, :class:`RMSNorm`, :class:`LSTM` and :class:`GRU`
(``nnx.RNN`` over Flax's ``LSTMCell`` / ``GRUCell`` as one cuDNN call over the sequence).
Flax's attention modules take :func:`pycudnn.jax.linen.dot_product_attention` as their
``attention_fn`` (NNX's too).

Needs Flax (``pip install flax``); importing this module without it raises an ``ImportError``
saying so.
"""

from __future__ import annotations

import inspect
from typing import Any

try:
    from flax import nnx
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "pycudnn.jax.nnx needs Flax, which is not installed: pip install flax"
    ) from exc

import jax

from . import _layers

__all__ = ["GRU", "LSTM", "BatchNorm", "Conv", "LayerNorm", "RMSNorm"]


_DEFAULTS = inspect.signature(nnx.Conv.__init__).parameters
_PROMOTE = _DEFAULTS["promote_dtype"].default
_CONV_GENERAL = _DEFAULTS["conv_general_dilated"].default


class Conv(nnx.Conv):
    """``flax.nnx.Conv`` through cuDNN (see the module docstring).

    Parameters
    ----------
    *args, **kwargs
        ``flax.nnx.Conv``'s.
    activation : {None, 'relu', 'sigmoid', 'tanh'}, keyword
        Applied in the convolution's epilogue, after the bias (default None).
    """

    def __init__(self, *args: Any, activation: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.activation = activation

    def __call__(  # type: ignore[override]
        self, inputs: jax.Array, residual: jax.Array | None = None, out_sharding: Any = None
    ) -> jax.Array:
        """``activation(conv(inputs) + residual + bias)``; *inputs* ``(*batch, *spatial,
        in_features)``, *residual* of the result's shape (optional)."""
        name = type(self).__qualname__
        _layers.check_flags(name, use_bias=self.use_bias)
        _layers.check_default(name, "promote_dtype", self.promote_dtype, _PROMOTE)
        if out_sharding is not None:
            raise NotImplementedError(f"{name}: out_sharding is not supported by pycudnn")
        _layers.check_default(
            name, "conv_general_dilated", self.conv_general_dilated, _CONV_GENERAL
        )
        return _layers.conv_layer(
            name, inputs, self.kernel[...], _value(self.bias),
            strides=self.strides, padding=self.padding, input_dilation=self.input_dilation,
            kernel_dilation=self.kernel_dilation, feature_group_count=self.feature_group_count,
            mask=self.mask, dtype=self.dtype, activation=self.activation, residual=residual,
        )  # fmt: skip


def _value(v: Any) -> Any:
    """A variable's array (None stays None)."""
    return None if v is None else v[...]


def _norm(m: Any, x: jax.Array, mask: Any, rms: bool) -> jax.Array:
    """:class:`LayerNorm`'s and :class:`RMSNorm`'s call."""
    name = type(m).__qualname__
    _layers.check_default(name, "promote_dtype", m.promote_dtype, _PROMOTE)
    return _layers.norm_layer(
        name, x, _value(m.scale), None if rms else _value(m.bias), rms=rms, epsilon=m.epsilon,
        dtype=m.dtype, reduction_axes=m.reduction_axes, feature_axes=m.feature_axes,
        axis_name=m.axis_name, mask=mask,
    )  # fmt: skip


class LayerNorm(nnx.LayerNorm):
    """``flax.nnx.LayerNorm`` through cuDNN, over the last axis (see the module docstring)."""

    def __call__(self, x: jax.Array, *, mask: jax.Array | None = None) -> jax.Array:
        """Normalize *x* over its last axis (no *mask*)."""
        return _norm(self, x, mask, rms=False)


class RMSNorm(nnx.RMSNorm):
    """``flax.nnx.RMSNorm`` through cuDNN, over the last axis (see the module docstring)."""

    def __call__(self, x: jax.Array, *, mask: jax.Array | None = None) -> jax.Array:
        """RMS-normalize *x* over its last axis (no *mask*)."""
        return _norm(self, x, mask, rms=True)


class BatchNorm(nnx.BatchNorm):
    """``flax.nnx.BatchNorm`` through cuDNN, per feature of the last axis (see the module
    docstring): the same ``Param`` s and ``BatchStat`` s, Flax's running averages."""

    def __call__(
        self,
        x: jax.Array,
        use_running_average: bool | None = None,
        *,
        mask: jax.Array | None = None,
    ) -> jax.Array:
        """Normalize *x* (batch statistics unless *use_running_average*; no *mask*)."""
        name = type(self).__qualname__
        _layers.check_default(name, "promote_dtype", self.promote_dtype, _PROMOTE)
        use_ra = self.use_running_average if use_running_average is None else use_running_average
        if use_ra is None:
            raise ValueError(f"{name}: use_running_average is None; pass True or False")
        y, new_mean, new_var = _layers.batch_norm_layer(
            name, x, _value(self.scale), _value(self.bias), self.mean[...], self.var[...],
            use_running_average=use_ra, axis=self.axis, momentum=self.momentum,
            epsilon=self.epsilon, dtype=self.dtype, axis_name=self.axis_name, mask=mask,
        )  # fmt: skip
        if not use_ra:
            self.mean[...] = new_mean
            self.var[...] = new_var
        return y


_GATES = ("ii", "if_", "ig", "io", "hi", "hf", "hg", "ho")


class _Recurrent(nnx.RNN):
    """``nnx.RNN`` over one of Flax's cells as one cuDNN call (:class:`LSTM`, :class:`GRU`):
    each layer names its cell, cuDNN's mode and how the cell's ``Param`` s read as
    :func:`pycudnn.jax.rnn_weights_from_flax`'s (linen's) names."""

    _mode = ""  # class attributes, not state: set by each layer below
    _cell: Any = None

    def __init__(
        self,
        in_features: int,
        hidden_features: int,
        *,
        rngs: Any,
        time_major: bool = False,
        return_carry: bool = False,
    ) -> None:
        name = type(self).__name__
        _layers.check_flags(name, time_major=time_major, return_carry=return_carry)
        cell = self._cell(in_features, hidden_features, rngs=rngs)
        super().__init__(cell, time_major=time_major, return_carry=return_carry)

    def _params(self) -> dict[str, Any]:
        raise NotImplementedError

    def __call__(  # type: ignore[override]
        self,
        inputs: jax.Array,
        *,
        initial_carry: Any = None,
        seq_lengths: Any = None,
    ) -> Any:
        """The outputs (and the final carry first with ``return_carry``); *seq_lengths*, if
        given, concrete ints (cuDNN reads them on the host)."""
        carry, y = _layers.recurrent_layer(
            type(self).__name__, inputs, self._params(), mode=self._mode,
            features=self.cell.hidden_features, time_major=self.time_major,
            initial_carry=initial_carry, seq_lengths=seq_lengths,
        )  # fmt: skip
        return (carry, y) if self.return_carry else y


class LSTM(_Recurrent):
    """``flax.nnx.RNN(flax.nnx.LSTMCell(in_features, hidden_features))`` as **one** cuDNN call
    over the whole sequence (:func:`pycudnn.jax.rnn`), where Flax's scans the cell: the same
    cell (``self.cell``, Flax's ``LSTMCell`` with its ``Param`` s), so either's state loads
    into the other. Called as ``nnx.RNN`` is (``initial_carry=(c, h)``, ``seq_lengths`` as
    concrete ints: cuDNN reads them on the host).

    Parameters
    ----------
    in_features, hidden_features : int
        The cell's sizes.
    rngs : flax.nnx.Rngs
        For the cell's initializers.
    time_major, return_carry : bool, keyword
        ``nnx.RNN``'s (inputs ``(time, batch, features)``; return ``(carry, outputs)`` with
        ``carry = (c, h)``).
    """

    _mode = "lstm"
    _cell = nnx.LSTMCell

    def _params(self) -> dict[str, Any]:
        cell = self.cell
        return {
            name.rstrip("_"): {
                "kernel": getattr(cell, name).kernel[...],
                **({"bias": getattr(cell, name).bias[...]} if name[0] == "h" else {}),
            }
            for name in _GATES
        }


class GRU(_Recurrent):
    """``flax.nnx.RNN(flax.nnx.GRUCell(in_features, hidden_features))`` as **one** cuDNN call
    over the whole sequence (:func:`pycudnn.jax.rnn`), as :class:`LSTM` (the carry is ``h``).

    NNX's cell is cuDNN's (PyTorch's) GRU with the recurrent biases zero: its input projection
    ``dense_i`` (the three gates' kernels side by side, ``r, z, n``, with a bias) and its
    recurrent ``dense_h`` (no bias) are split per gate for
    :func:`pycudnn.jax.rnn_weights_from_flax`.

    Parameters
    ----------
    in_features, hidden_features : int
        The cell's sizes.
    rngs : flax.nnx.Rngs
        For the cell's initializers.
    time_major, return_carry : bool, keyword
        ``nnx.RNN``'s.
    """

    _mode = "gru"
    _cell = nnx.GRUCell

    def _params(self) -> dict[str, Any]:
        cell = self.cell
        h = cell.hidden_features
        ki, bi, kh = cell.dense_i.kernel[...], cell.dense_i.bias[...], cell.dense_h.kernel[...]
        params: dict[str, Any] = {}
        for g, gate in enumerate("rzn"):
            part = slice(g * h, (g + 1) * h)
            params["i" + gate] = {"kernel": ki[:, part], "bias": bi[part]}
            params["h" + gate] = {"kernel": kh[:, part]}
        params["hn"]["bias"] = jax.numpy.zeros((h,), kh.dtype)  # linen's GRU names: hn has one
        return params
