"""2-D and 3-D convolution as a JAX function on ``dnn_conv`` / ``dnn_gradinput`` /
``dnn_gradweight`` (cuDNN's graph API), with the fused epilogue ``act(conv + residual + bias)``.

Cross-correlation, as ``lax.conv_general_dilated`` and PyTorch's ``conv2d`` compute it:
``(N, C, spatial...)`` images and ``(K, C / groups, kernel...)`` filters, or with
``channels_last=True`` ``(N, spatial..., C)`` and ``(K, kernel..., C / groups)`` (the layout
cuDNN's channels-last engines read; Flax's ``HWIO`` kernels are ``w.transpose(3, 0, 1, 2)``).
cuDNN pads both sides of a dimension alike: asymmetric padding (``'SAME'`` with a stride or an
even kernel, Flax's default, or ``(lo, hi)`` pairs) gives cuDNN the smaller side and pads the
image's other side by the difference first (``jnp.pad``: one copy of the image per call, its
gradient a slice).

The gradient of the epilogue's activation comes from the output (``relu``, ``sigmoid``,
``tanh``: their gradients need only ``y``), then the data and filter gradients are cuDNN's
backward-data and backward-filter convolutions, the bias gradient XLA's sum over the batch and
spatial dims and the residual's the pre-activation gradient itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..highlevel import (
    dnn_conv,
    dnn_conv3d,
    dnn_gradinput,
    dnn_gradinput3d,
    dnn_gradweight,
    dnn_gradweight3d,
)
from . import _activation, _ops, _request
from ._operands import views
from ._padding import pairs, split

__all__ = ["ConvBackwardData", "ConvBackwardFilter", "ConvForward", "conv"]

_FUNC = "pycudnn.jax.conv"
#: the epilogue activations whose gradient needs only the output
EPILOGUES = ("relu", "sigmoid", "tanh")


@dataclasses.dataclass(frozen=True)
class _Geometry(_request.Request):
    """What every convolution direction shares: strides, symmetric padding, dilation, groups,
    the layout, and cuDNN's engine choice (*algo*: the forward's; *precision*: all three)."""

    strides: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    channels_last: bool
    algo: str | None
    precision: str | None

    family = "conv"

    def __post_init__(self) -> None:
        nd = len(self.strides) if isinstance(self.strides, tuple) else 0
        if nd not in (2, 3):
            raise ValueError(f"{_FUNC}: {nd} spatial dims; expected 2 or 3")
        object.__setattr__(self, "strides", _request.ints(self.strides, nd, "stride", _FUNC, 1))
        object.__setattr__(self, "padding", _request.ints(self.padding, nd, "padding", _FUNC, 0))
        object.__setattr__(self, "dilation", _request.ints(self.dilation, nd, "dilation", _FUNC, 1))
        object.__setattr__(self, "groups", _request.ints(self.groups, 1, "groups", _FUNC, 1)[0])
        object.__setattr__(self, "channels_last", bool(self.channels_last))
        for name in ("algo", "precision"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, str):
                raise TypeError(f"{_FUNC}: {name}={v!r}; expected None or a str")

    @property
    def geometry(self) -> tuple:
        """The shared fields, in order."""
        return tuple(getattr(self, f.name) for f in dataclasses.fields(_Geometry))

    def split(self, a: tuple[Any, ...]) -> tuple[Any, Any, tuple[Any, ...]]:
        """``(batch or out-channels, channels, spatial)`` of a shape in this layout."""
        if self.channels_last:
            return a[0], a[-1], a[1:-1]
        return a[0], a[1], a[2:]

    def join(self, lead: Any, channels: Any, spatial: Sequence[Any]) -> tuple[Any, ...]:
        """The shape of *lead*, *channels* and *spatial* in this layout."""
        if self.channels_last:
            return (lead, *spatial, channels)
        return (lead, channels, *spatial)

    def _check(self, x: Any, w: Any) -> tuple[Any, ...]:
        """Check *x* and *w*; the forward's output shape."""
        dt = _request.check_dtype(_FUNC, "x", x)
        if np.dtype(w.dtype) != dt:
            raise TypeError(f"{_FUNC}: w is {w.dtype}, x {dt}; expected one dtype")
        nd = len(self.strides)
        xs, ws = tuple(x.shape), tuple(w.shape)
        if len(xs) != nd + 2 or len(ws) != nd + 2:
            raise ValueError(
                f"{_FUNC}: x {xs} and w {ws} must both have {nd + 2} dims for a {nd}-D "
                f"convolution ({'channels last' if self.channels_last else 'channels first'})"
            )
        n, c, spatial = self.split(xs)
        k, cg, kernel = self.split(ws)
        g = self.groups
        if _request.known(c, cg, k) and (c != cg * g or k % g):
            raise ValueError(
                f"{_FUNC}: x has {c} channels and w {ws} takes {cg} per group with {k} filters; "
                f"expected channels == {cg} * groups ({g}) and filters divisible by groups"
            )
        out = []
        for i, (s_in, kk) in enumerate(zip(spatial, kernel, strict=True)):
            p, d, s = self.padding[i], self.dilation[i], self.strides[i]
            o = (s_in + 2 * p - d * (kk - 1) - 1) // s + 1
            if _request.known(o) and o < 1:
                raise ValueError(
                    f"{_FUNC}: the dilated kernel {kernel} (dilation {self.dilation}) is larger "
                    f"than the padded input {spatial} (padding {self.padding})"
                )
            out.append(o)
        return self.join(n, k, out)

    def batch_operands(self) -> tuple[bool, ...]:
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class ConvForward(_Geometry):
    """``y = act(conv(x, w) + residual + bias)``: operands ``x``, ``w`` (, ``bias``)
    (, ``residual``), in ``dnn_conv``'s pointer order; result ``y``."""

    activation: str | None = None
    bias: bool = False
    residual: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.activation is not None and self.activation not in EPILOGUES:
            raise ValueError(
                f"{_FUNC}: activation={self.activation!r}; expected None or one of {EPILOGUES} "
                "(the epilogues whose gradient needs only the output)"
            )
        object.__setattr__(self, "bias", bool(self.bias))
        object.__setattr__(self, "residual", bool(self.residual))

    def batch_operands(self) -> tuple[bool, ...]:
        return (True, False) + ((False,) if self.bias else ()) + ((True,) if self.residual else ())

    def results(self, *operands: Any) -> _ops.Results:
        x, w, *rest = operands
        out = self._check(x, w)
        dt = np.dtype(x.dtype)
        if self.bias:
            b = rest.pop(0)
            k = self.split(tuple(w.shape))[0]
            if tuple(b.shape) != (k,) or np.dtype(b.dtype) != dt:
                raise ValueError(f"{_FUNC}: bias is {b.dtype}{list(b.shape)}; expected {dt}[{k}]")
        if self.residual:
            z = rest.pop(0)
            if tuple(z.shape) != out or np.dtype(z.dtype) != dt:
                raise ValueError(
                    f"{_FUNC}: residual is {z.dtype}{list(z.shape)}; expected the output's "
                    f"{dt}{list(out)}"
                )
        return ((out, dt),)

    def run(self, args: Sequence[Any], rets: Sequence[Any], stream: int) -> None:
        ops = list(views(args, rets, (self.channels_last,) * (len(args) + len(rets))))
        x, w, y = ops[0], ops[1], ops[-1]
        bias = ops[2] if self.bias else None
        z = ops[-2] if self.residual else None
        fn = dnn_conv if len(self.strides) == 2 else dnn_conv3d
        fn(
            x,
            w,
            self.padding,
            self.strides,
            self.dilation,
            "cross",
            None,
            self.algo,
            self.precision,
            self.groups,
            bias=bias,
            activation=self.activation,
            z=z,
            out=y,
            stream=stream,
        )


def _given(request: _request.Request) -> _ops.Results:
    raise TypeError(f"{type(request).__name__}: its result's shape is given by the caller")


def _gradient(
    g: _Geometry, fns: tuple[Any, Any], args: Sequence[Any], rets: Sequence[Any], stream: int
) -> None:
    """One of the convolution's two gradients (``fns``: its 2-D and 3-D functions, which take
    ``(a, b, shape, padding, strides, dilation, mode, precision, algo, groups)``) of the two
    operands *args* into the result."""
    a, b, out = views(args, rets, (g.channels_last,) * 3)
    fn = fns[0] if len(g.strides) == 2 else fns[1]
    fn(a, b, None, g.padding, g.strides, g.dilation, "cross", g.precision, None, g.groups,
       out=out, stream=stream)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class ConvBackwardData(_Geometry):
    """``dx``: operands ``w``, ``dy`` (``dnn_gradinput``'s order); the result's shape (x's) is
    given by the caller (several input sizes give one output size)."""

    def batch_operands(self) -> tuple[bool, ...]:
        return (False, True)

    def results(self, *operands: Any) -> _ops.Results:
        return _given(self)

    def run(self, args: Sequence[Any], rets: Sequence[Any], stream: int) -> None:
        _gradient(self, (dnn_gradinput, dnn_gradinput3d), args, rets, stream)


@dataclasses.dataclass(frozen=True)
class ConvBackwardFilter(_Geometry):
    """``dw``: operands ``x``, ``dy`` (``dnn_gradweight``'s order); the result's shape (w's) is
    given by the caller. Sums over the batch: a vmapped call runs example by example."""

    batch_results = False

    def batch_operands(self) -> tuple[bool, ...]:
        return (True, True)

    def results(self, *operands: Any) -> _ops.Results:
        return _given(self)

    def run(self, args: Sequence[Any], rets: Sequence[Any], stream: int) -> None:
        _gradient(self, (dnn_gradweight, dnn_gradweight3d), args, rets, stream)


def _forward(request: ConvForward, *operands: Any) -> tuple[Any, Any]:
    (y,) = _ops.call(request, *operands)
    return y, (operands[0], operands[1], y, operands[2] if request.bias else None)


def _backward(request: ConvForward, residuals: Any, dy: Any) -> tuple:
    x, w, y, bias = residuals
    if request.activation is not None:  # its gradient from the output alone
        act = _activation.ActivationGrad(request.activation, 0.0)
        if y.dtype == jnp.bfloat16:
            dy = _activation.gradient_from_output(request.activation, 0.0, y, y, dy)
        else:
            (dy,) = _ops.call(act, y, dy, y)
    geo = request.geometry
    (dx,) = _ops.call(ConvBackwardData(*geo), w, dy, results=((tuple(x.shape), x.dtype),))
    (dw,) = _ops.call(ConvBackwardFilter(*geo), x, dy, results=((tuple(w.shape), w.dtype),))
    grads: list[Any] = [dx, dw]
    if request.bias:
        nd = len(request.strides)
        axes = (0, *range(1, nd + 1)) if request.channels_last else (0, *range(2, nd + 2))
        acc = jnp.promote_types(dy.dtype, jnp.float32)  # half types summed in float32
        grads.append(jnp.sum(dy, axis=axes, dtype=acc).astype(bias.dtype))
    if request.residual:
        grads.append(dy)
    return tuple(grads)


_conv = _ops.differentiable(_forward, _backward)


def _padding(padding: Any, x: Any, w: Any, geo: dict[str, Any]) -> tuple[tuple[int, int], ...]:
    """``(lo, hi)`` zero padding per spatial dim from an int, ints, ``(lo, hi)`` pairs,
    ``'VALID'`` or ``'SAME'`` (``lax.conv_general_dilated``'s: the odd one on the high side)."""
    nd = len(geo["strides"])
    if isinstance(padding, str):
        if padding.upper() == "VALID":
            return ((0, 0),) * nd
        if padding.upper() != "SAME":
            raise ValueError(f"{_FUNC}: padding={padding!r}; expected 'SAME', 'VALID' or ints")
        cl = geo["channels_last"]
        spatial = x.shape[1:-1] if cl else x.shape[2:]
        kernel = w.shape[1:-1] if cl else w.shape[2:]
        pads = []
        for n, k, s, d in zip(spatial, kernel, geo["strides"], geo["dilation"], strict=True):
            if not _request.known(n):
                raise ValueError(f"{_FUNC}: padding='SAME' needs concrete spatial dims, got {n}")
            total = max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
            pads.append((total // 2, total - total // 2))
        return tuple(pads)
    return pairs(padding, nd, _FUNC)


def conv(
    x: Any,
    w: Any,
    stride: int | Sequence[int] = 1,
    padding: int | str | Sequence[int] | Sequence[tuple[int, int]] = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
    *,
    bias: Any = None,
    activation: str | None = None,
    residual: Any = None,
    channels_last: bool = False,
    algo: str | None = None,
    precision: str | None = None,
) -> jax.Array:
    """2-D or 3-D convolution (cross-correlation) through cuDNN, with an optional fused
    epilogue ``activation(conv(x, w) + residual + bias)``; differentiable in *x*, *w*, *bias*
    and *residual*.

    Parameters
    ----------
    x : jax.Array
        ``(N, C, H, W)`` or ``(N, C, D, H, W)`` (with *channels_last*: ``(N, H, W, C)`` or
        ``(N, D, H, W, C)``); float16, bfloat16, float32 or float64.
    w : jax.Array
        ``(K, C / groups, kH, kW[, ...])`` (with *channels_last*: ``(K, kH, kW, C / groups)``),
        x's dtype. Its rank sets the convolution's.
    stride, dilation : int or tuple of int
        Per spatial dim.
    padding : int, tuple of int, tuple of (lo, hi) pairs, 'VALID' or 'SAME'
        Zero padding per spatial dim (``'SAME'`` as ``lax.conv_general_dilated``'s). Where the
        two sides differ, x is padded by the difference first (a copy of x per call).
    groups : int
        Grouped convolution (``C`` and ``K`` divisible by it; ``groups == C``: depthwise).
    bias : jax.Array, optional
        ``(K,)``, x's dtype, added per output channel.
    activation : {None, 'relu', 'sigmoid', 'tanh'}
        Applied last.
    residual : jax.Array, optional
        The output's shape and dtype, added before the bias's activation (ResNet's shortcut).
    channels_last : bool
        x, w, residual and the result in channels-last order.
    algo, precision : str, optional
        ``dnn_conv``'s (the forward's engine choice; the compute type of all three
        directions); default ``pycudnn.config``'s, as the executing thread sees it.

    Returns
    -------
    jax.Array
        ``(N, K, out...)`` (channels-last: ``(N, out..., K)``),
        ``out = (in + lo + hi - dilation * (k - 1) - 1) // stride + 1``.

    Raises
    ------
    TypeError, ValueError
        At trace time: mismatched ranks, channels, groups, dtypes or shapes, negative padding,
        an activation other than those above, a kernel larger than the padded input.
    """
    x, w = jnp.asarray(x), jnp.asarray(w)
    nd = w.ndim - 2
    if nd not in (2, 3):
        raise ValueError(f"{_FUNC}: w has shape {w.shape}; expected 4 (2-D) or 5 (3-D) dims")
    geo: dict[str, Any] = {
        "strides": _request.ints(stride, nd, "stride", _FUNC, 1),
        "dilation": _request.ints(dilation, nd, "dilation", _FUNC, 1),
        "channels_last": bool(channels_last),
    }
    x, pads = split(x, _padding(padding, x, w, geo), geo["channels_last"])
    request = ConvForward(
        geo["strides"],
        pads,
        geo["dilation"],
        groups,
        geo["channels_last"],
        algo,
        precision,
        activation,
        bias is not None,
        residual is not None,
    )
    operands = [x, w]
    if bias is not None:
        operands.append(jnp.asarray(bias))
    if residual is not None:
        operands.append(jnp.asarray(residual))
    return _conv(request, *operands)
