"""Activations, forward and backward: cudnn.torch's ReLU, Sigmoid, Tanh, ClippedReLU (and ELU,
swish, identity) as Theano-style eager functions.

``dnn_activation(x, mode, coef)`` runs ``cudnnActivationForward`` and ``dnn_activation_grad(y, dy,
x, mode, coef)`` ``cudnnActivationBackward``, through the shared call path (:mod:`._call`): a
per-thread cache maps what was passed to a ready call with its descriptors, so a repeated call
makes one C call. Any strides are taken as they are (the legacy API reads strided descriptors);
a new output has the input's memory order. ``out=x`` computes in place (cudnn.torch's
``inplace=true``), as cuDNN allows for these two functions; any other overlap is refused.

``identity`` has no legacy activation kernel (cuDNN reserves it for fused convolutions), so it
runs as ``cudnnTransformTensor`` (``out = alpha * x + beta * out``; its gradient is ``dy``).
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any, Literal

from ..descriptors import ActivationDescriptor
from ..enums import ActivationMode
from . import _call, _checks, _operand, _staging

if TYPE_CHECKING:
    from ..typing import DeviceArrayLike, StreamLike
    from ._annotations import Out

__all__ = ["dnn_activation", "dnn_activation_grad"]

_MODES = {
    "relu": ActivationMode.RELU,
    "sigmoid": ActivationMode.SIGMOID,
    "tanh": ActivationMode.TANH,
    "clipped_relu": ActivationMode.CLIPPED_RELU,
    "elu": ActivationMode.ELU,
    "swish": ActivationMode.SWISH,
    "identity": ActivationMode.IDENTITY,
}
_FWD, _BWD = "activation", "activation_grad"


class _Activation(_call.Call):
    """``cudnnActivationForward`` (x, y) or ``cudnnActivationBackward`` (y, dy, x, dx);
    ``cudnnTransformTensor`` for ``identity`` (no activation descriptor)."""

    __slots__ = ("act", "alpha", "beta", "descs", "fn", "hp")

    def __init__(self, func, h, alloc, spans, inplace, act, descs, alpha, beta, name):
        # the descriptors and the factors byref() points into live as long as the entry
        super().__init__(
            func, h, (alloc,), spans, inplace=inplace, keepalive=(act, descs, alpha, beta)
        )
        self.act, self.descs = act, descs
        self.hp = h.ptr
        self.alpha, self.beta = ctypes.byref(alpha), ctypes.byref(beta)
        self.fn = _call.quiet("cudnnTransformTensor" if act is None else name)


class _Forward(_Activation):
    __slots__ = ()

    def launch(self, ptrs):
        x, y = ptrs
        xd, yd = self.descs
        if self.act is None:
            self.fn(self.hp, self.alpha, xd, x, self.beta, yd, y)
        else:
            self.fn(self.hp, self.act, self.alpha, xd, x, self.beta, yd, y)


class _Backward(_Activation):
    __slots__ = ()

    def launch(self, ptrs):
        y, dy, x, dx = ptrs
        yd, dyd, xd, dxd = self.descs
        if self.act is None:
            self.fn(self.hp, self.alpha, dyd, dy, self.beta, dxd, dx)
        else:
            self.fn(self.hp, self.act, self.alpha, yd, y, dyd, dy, xd, x, self.beta, dxd, dx)


def _descriptor(func: str, mode: Any, coef: Any) -> ActivationDescriptor | None:
    m = _checks.choose(mode, _MODES, "mode", func)
    c = _checks.real(coef, "coef", func)
    if m == ActivationMode.IDENTITY:
        return None
    if m == ActivationMode.CLIPPED_RELU and c <= 0:
        raise ValueError(f"{func}: coef={coef!r} is the clipped_relu ceiling; expected > 0")
    if m == ActivationMode.SWISH:
        return ActivationDescriptor(m, 0.0, nan_propagation=True, swish_beta=c)
    return ActivationDescriptor(m, c, nan_propagation=True)


def _output(func: str, out: Any, like: _operand.Operand):
    """(descriptor, alloc spec or None, the out operand or None, its byte span)."""
    if out is None:
        spec = _call.like_spec(like)
        if 0 in spec.shape:
            return None, spec, None, 0
        desc = _staging.tensor_descriptor(
            *_staging.padded(spec.shape, spec.element_strides), like.dtype
        )
        return desc, spec, None, spec.nbytes_span
    o = _operand.operand(out)
    _checks.same_dtype_and_device(func, (("x", like), ("out", o)))
    _checks.check_out(func, o, like.shape)
    return _staging.tensor_desc(func, "out", o), None, o, o.nbytes_span


def dnn_activation(
    x: DeviceArrayLike,
    mode: Literal["relu", "sigmoid", "tanh", "clipped_relu", "elu", "swish", "identity"] = "relu",
    coef: float = 0.0,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Out | None = None,
    stream: StreamLike = None,
) -> Out:
    """Element-wise activation ``out = alpha * act(x) + beta * out`` (``cudnnActivationForward``).

    Parameters
    ----------
    x : device array
        Any shape up to 8-D and any strides; float16, bfloat16, float32 or float64.
    mode : {'relu', 'sigmoid', 'tanh', 'clipped_relu', 'elu', 'swish', 'identity'}
        ``clipped_relu`` is ``min(max(x, 0), coef)``; ``elu`` is ``x`` for ``x > 0`` else
        ``coef * (exp(x) - 1)``; ``swish`` is ``x * sigmoid(coef * x)``.
    coef : float
        The ceiling of ``clipped_relu`` (> 0), the alpha of ``elu``, the beta of ``swish``;
        ignored by the others.
    alpha, beta : float
        Blend factors (*beta* != 0 accumulates into *out*).
    out : device array, optional
        Same shape and dtype as *x*; may be *x* itself (in place).
    stream : optional
        CUDA stream; default the operands' framework's current stream (torch, CuPy), else the
        handle's stream.

    Returns
    -------
    DeviceArray or the type of *out*
        A new array in *x*'s memory order, or *out*.

    Raises
    ------
    TypeError
        Host arrays, a dtype other than the four floating types, mixed dtypes.
    ValueError
        An unknown mode, a non-positive clipped_relu ceiling, a shape mismatch, an *out* that
        overlaps *x* without being *x*, negative or zero strides, operands on different devices.

    Examples
    --------
    >>> y = pycudnn.dnn_activation(x, "clipped_relu", coef=6.0)   # ReLU6
    >>> pycudnn.dnn_activation(x, "relu", out=x)                   # in place
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(x)
    px, kx = _operand.key_of(x)
    po, ko = (None, None) if out is None else _operand.key_of(out)
    key = (_FWD, kx, ko, mode, coef, alpha, beta, coef.__class__, alpha.__class__, beta.__class__)
    args = (x, out, mode, coef, alpha, beta, stream)
    return _call.run_cached(key, _build_forward, args, (px,), (out,), (po,), stream)[0]


def _build_forward(x, out, mode, coef, alpha, beta, stream) -> _call.Call:
    func = "dnn_activation"
    g = _operand.operand(x)
    dt, device = _checks.same_dtype_and_device(func, (("x", g),))
    act = _descriptor(func, mode, coef)
    a, b = _call.scales(dt, _checks.real(alpha, "alpha", func), _checks.real(beta, "beta", func))
    _checks.beta_needs_out(func, beta, out)
    xd = _staging.tensor_desc(func, "x", g)
    yd, spec, o, so = _output(func, out, g)
    h = _call.handle_for(device, stream, func)
    if any(n == 0 for n in g.shape):
        return _call.Call(func, h, (spec,), (0, so), noop=True)
    inplace = (0,) if o is not None and _staging.same_layout(g, o) else ()
    spans = (g.nbytes_span, so)
    return _Forward(func, h, spec, spans, inplace, act, (xd, yd), a, b, "cudnnActivationForward")


def dnn_activation_grad(
    y: DeviceArrayLike,
    dy: DeviceArrayLike,
    x: DeviceArrayLike,
    mode: Literal["relu", "sigmoid", "tanh", "clipped_relu", "elu", "swish", "identity"] = "relu",
    coef: float = 0.0,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Out | None = None,
    stream: StreamLike = None,
) -> Out:
    """Gradient of :func:`dnn_activation` w.r.t. *x* (``cudnnActivationBackward``):
    ``out = alpha * dact(x) * dy + beta * out``.

    Parameters
    ----------
    y : device array
        The forward output ``act(x)`` (computed with ``alpha=1, beta=0``).
    dy : device array
        Gradient w.r.t. *y*, same shape.
    x : device array
        The forward input, same shape.
    mode, coef
        As in the forward call.
    alpha, beta, stream
        As for :func:`dnn_activation`.
    out : device array, optional
        The gradient ``dx``; may be *dy* itself (in place).

    Returns
    -------
    DeviceArray or the type of *out*
        ``dx``, in *x*'s memory order when new.

    Raises
    ------
    TypeError, ValueError
        As for :func:`dnn_activation`; also when the shapes of *y*, *dy* and *x* differ.
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(y)
    py, ky = _operand.key_of(y)
    pdy, kdy = _operand.key_of(dy)
    px, kx = _operand.key_of(x)
    po, ko = (None, None) if out is None else _operand.key_of(out)
    key = (
        _BWD,
        ky,
        kdy,
        kx,
        ko,
        mode,
        coef,
        alpha,
        beta,
        coef.__class__,
        alpha.__class__,
        beta.__class__,
    )
    args = (y, dy, x, out, mode, coef, alpha, beta, stream)
    return _call.run_cached(key, _build_backward, args, (py, pdy, px), (out,), (po,), stream)[0]


def _build_backward(y, dy, x, out, mode, coef, alpha, beta, stream) -> _call.Call:
    func = "dnn_activation_grad"
    gy, gdy, gx = _operand.operand(y), _operand.operand(dy), _operand.operand(x)
    dt, device = _checks.same_dtype_and_device(func, (("y", gy), ("dy", gdy), ("x", gx)))
    _checks.shapes_of_x(func, gy, gdy, gx)
    act = _descriptor(func, mode, coef)
    a, b = _call.scales(dt, _checks.real(alpha, "alpha", func), _checks.real(beta, "beta", func))
    _checks.beta_needs_out(func, beta, out)
    yd, dyd, xd = (_staging.tensor_desc(func, n, g) for n, g in (("y", gy), ("dy", gdy), ("x", gx)))
    dxd, spec, o, so = _output(func, out, gx)
    h = _call.handle_for(device, stream, func)
    spans = (gy.nbytes_span, gdy.nbytes_span, gx.nbytes_span, so)
    if any(n == 0 for n in gx.shape):
        return _call.Call(func, h, (spec,), spans, noop=True)
    # cuDNN may write dx over dy (documented in place), never over y or x
    inplace = (1,) if o is not None and _staging.same_layout(gdy, o) else ()
    descs = (yd, dyd, xd, dxd)
    return _Backward(func, h, spec, spans, inplace, act, descs, a, b, "cudnnActivationBackward")
