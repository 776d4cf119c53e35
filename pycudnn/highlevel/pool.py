"""Pooling, forward and backward: Theano's ``dnn_pool`` / ``GpuDnnPoolGrad`` as eager functions.

``dnn_pool(img, ws, stride, mode, pad)`` runs ``cudnnPoolingForward`` and ``dnn_pool_grad(img,
out, out_grad, ws, stride, mode, pad)`` ``cudnnPoolingBackward`` through the shared call path
(:mod:`._call`): a per-thread cache maps what was passed to a ready call with its descriptors, so a
repeated call makes one C call.

Theano's semantics, kept exactly
--------------------------------
* The rank follows ``len(ws)``: 2 (``img`` is ``(N, C, H, W)``) or 3 (``(N, C, D, H, W)``).
* **The default stride is 1 in every dimension** (Theano's ``stride=None``), not the window as
  in PyTorch; the default padding is 0. Pass ``stride=ws`` for PyTorch's default.
* The output size is Theano's ``ignore_border=True`` one: ``(in + 2*pad - ws) // stride + 1``
  (no ceil mode).
* ``'average'`` is Theano's old name of ``'average_inc_pad'``; ``'sum'`` is
  ``'average_inc_pad'`` scaled by the window volume (cuDNN's ``alpha``, so it costs nothing).

Decisions
---------
* **Padding must be smaller than the window** in every dimension (Theano's rule; PyTorch's
  ``pad <= ws // 2`` is stricter, so every call PyTorch accepts is accepted here). It is the
  weakest rule under which every window covers at least one input element: cuDNN accepts larger
  padding but then returns ``-FLT_MAX`` (max) or divides by zero (``average_exc_pad``) for
  windows that lie wholly in the padding. The padded input must hold one window.
* Max pooling **propagates NaN** (``CUDNN_PROPAGATE_NAN``), as ``torch.nn.functional.max_pool*``
  does; cuDNN's default would skip NaNs. Padding never wins a max (it acts as ``-inf``, as in
  PyTorch), and ``average_exc_pad`` divides by the number of input elements in the window.
* Layouts: the call computes in one layout, packed channels-last (NHWC / NDHWC) when ``img`` is
  unambiguously so, else packed NCHW / NCDHW; a new output has that layout. Operands with any
  other strides (sliced views, transposed N/C, an ``out``/``img_grad`` of the other layout) are
  staged through packed copies (``cudnnTransformTensor``). That is the conservative rule: cuDNN
  9.19 did compute sliced and N/C-transposed views correctly in our probes, but the documentation
  promises only "best performance" for packed tensors, and the convolutions' graph engines were
  seen to compute garbage for such strides. (PyTorch 2.11's own channels-last ``avg_pool2d``
  backward is wrong with padding or overlapping windows; cuDNN's NHWC one is right: the GPU
  tests check both layouts against float64 references.)
* dtypes: float16, bfloat16, float32, float64 (all four checked on cuDNN 9.19); ``alpha``/``beta``
  are ``double`` for float64 data, else ``float`` (cuDNN's rule).

The backward's destination keyword is ``img_grad=`` (the gradient w.r.t. ``img``): Theano's
``dnn_pool_grad`` already takes the forward output as its positional ``out``.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from .. import _layout
from ..descriptors import PoolingDescriptor
from ..enums import PoolingMode
from . import _call, _checks, _operand, _staging

if TYPE_CHECKING:
    from ..typing import DeviceArrayLike, StreamLike
    from ._annotations import Out, PoolMode

__all__ = ["dnn_pool", "dnn_pool_grad", "get_pool_output_shape"]

# mode -> (cuDNN mode, is Theano's 'sum')
_MODES = {
    "max": (PoolingMode.MAX, False),
    "max_deterministic": (PoolingMode.MAX_DETERMINISTIC, False),
    "average_inc_pad": (PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING, False),
    "average_exc_pad": (PoolingMode.AVERAGE_COUNT_EXCLUDE_PADDING, False),
    "average": (PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING, False),
    "sum": (PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING, True),
}
_FWD, _BWD = "pool", "pool_grad"


# ==================================================================================================
# Geometry
# ==================================================================================================
class _Geometry(NamedTuple):
    ws: tuple[int, ...]
    stride: tuple[int, ...]
    pad: tuple[int, ...]
    out_shape: tuple[int, ...]


def _window(func: str, ws: Any, ndim: int) -> tuple[int, ...]:
    """``ws`` as 2 or 3 ints (an int is broadcast to the image's spatial rank)."""
    if isinstance(ws, bool):
        raise TypeError(f"{func}: ws must be a tuple of 2 or 3 ints, got {ws!r}")
    if isinstance(ws, int) or hasattr(ws, "__index__"):
        nd = ndim - 2
        if nd not in (2, 3):
            raise ValueError(
                f"{func}: img has {ndim} dims; 2-D pooling needs (N, C, H, W), 3-D pooling "
                "(N, C, D, H, W)"
            )
        return _checks.ints(ws, nd, "ws", 1, func)
    try:
        nd = len(ws)
    except TypeError:
        raise TypeError(f"{func}: ws must be a tuple of 2 or 3 ints, got {ws!r}") from None
    if nd not in (2, 3):
        raise ValueError(
            f"{func}: ws={ws!r} has {nd} values; cuDNN pools in 2 or 3 spatial dims (its length "
            "sets the rank)"
        )
    return _checks.ints(ws, nd, "ws", 1, func)


def _geometry(func: str, shape: Sequence[int], ws: Any, stride: Any, pad: Any) -> _Geometry:
    shape = tuple(shape)
    w = _window(func, ws, len(shape))
    nd = len(w)
    if len(shape) != nd + 2:
        raise ValueError(
            f"{func}: img has shape {shape} ({len(shape)} dims) but ws={ws!r} asks for {nd}-D "
            f"pooling, which needs {nd + 2} dims (N, C, {'D, H, W' if nd == 3 else 'H, W'})"
        )
    s = (1,) * nd if stride is None else _checks.ints(stride, nd, "stride", 1, func)
    p = (0,) * nd if pad is None else _checks.ints(pad, nd, "pad", 0, func)
    if any(pi >= wi for pi, wi in zip(p, w, strict=True)):
        raise ValueError(
            f"{func}: pad={p} must be smaller than the window ws={w} in every dimension "
            "(Theano's rule: then every window covers at least one input element)"
        )
    spatial = shape[2:]
    if any(n == 0 for n in spatial):
        raise ValueError(f"{func}: img has an empty spatial dimension, shape {shape}")
    if any(n + 2 * pi < wi for n, pi, wi in zip(spatial, p, w, strict=True)):
        raise ValueError(
            f"{func}: the window ws={w} is larger than the padded input {spatial} + 2 * pad {p} "
            f"(img shape {shape})"
        )
    out = tuple((n + 2 * pi - wi) // si + 1 for n, pi, wi, si in zip(spatial, p, w, s, strict=True))
    out_shape = (*shape[:2], *out)
    _layout.check_int32(f"{func}: the output", out_shape, _layout.packed_strides(out_shape))
    return _Geometry(w, s, p, out_shape)


def get_pool_output_shape(
    img_shape: Sequence[int], ws: Any, stride: Any = None, pad: Any = None
) -> tuple[int, ...]:
    """The shape :func:`dnn_pool` returns for an input of *img_shape* (Theano's
    ``ignore_border=True``: ``(in + 2*pad - ws) // stride + 1``; default stride 1, pad 0).

    Raises ``ValueError``/``TypeError`` as :func:`dnn_pool` does for the same arguments.

    Examples
    --------
    >>> get_pool_output_shape((8, 3, 32, 32), (2, 2), stride=(2, 2))
    (8, 3, 16, 16)
    """
    return _geometry("get_pool_output_shape", img_shape, ws, stride, pad).out_shape


def _geometry_key(ws: Any, stride: Any, pad: Any) -> tuple:
    """*ws*, *stride* and *pad* for a call key: lists (a common spelling) as tuples, so the call
    can be cached, and whether any holds a bool (``(True, True) == (1, 1)``, but only the ints
    are valid: the bool spelling gets a key of its own and reaches the checks)."""
    if ws.__class__ is list:
        ws = tuple(ws)
    if stride.__class__ is list:
        stride = tuple(stride)
    if pad.__class__ is list:
        pad = tuple(pad)
    return ws, stride, pad, _call.has_bool(ws, stride, pad)


# ==================================================================================================
# Call entries
# ==================================================================================================
class _Pooling(_call.Call):
    """``cudnnPoolingForward`` (pointers x, y) or ``cudnnPoolingBackward`` (x, y, dy, dx)."""

    __slots__ = ("alpha", "beta", "d", "fn", "hp", "pp")

    def __init__(self, func, h, plan: _staging.Packed, spans, pool, alpha, beta, backward):
        # the descriptors and the factors byref() points into live as long as the entry
        super().__init__(
            func, h, (plan.spec,), spans, plan.stage, keepalive=(pool, plan.descs, alpha, beta)
        )
        # their addresses: ctypes converts an int faster than an object's _as_parameter_
        self.hp, self.pp, self.d = h.ptr, pool.ptr, tuple(d.ptr for d in plan.descs)
        self.alpha, self.beta = ctypes.byref(alpha), ctypes.byref(beta)
        self.fn = _call.quiet("cudnnPoolingBackward" if backward else "cudnnPoolingForward")

    def launch(self, ptrs: Sequence[int]) -> None:
        a, b = self.alpha, self.beta
        d = self.d
        if len(ptrs) == 2:  # forward: x, y
            self.fn(self.hp, self.pp, a, d[0], ptrs[0], b, d[1], ptrs[1])
        else:  # backward: x, y, dy, dx
            x, y, dy, dx = ptrs
            self.fn(self.hp, self.pp, a, d[1], y, d[2], dy, d[0], x, b, d[3], dx)


def _entry(func, h, dt, geo, mode, inputs, o, out_shape, factors, backward) -> _call.Call:
    """The call entry once operands and arguments are valid (descriptors, staging, scales):
    *mode* is ``(cuDNN's mode, whether it sums)``, *factors* ``(alpha, beta)``; the layout is
    the first input's."""
    pmode, is_sum = mode
    alpha, beta = factors
    nhwc = _staging.channels_last(inputs[0])
    spans = tuple(g.nbytes_span for g in inputs)
    if any(n == 0 for n in out_shape):  # N or C is 0: nothing to compute
        spec = None if o is not None else _call.output_spec(out_shape, dt, inputs[0].device, nhwc)
        spans = (*spans, 0 if o is None else o.nbytes_span)
        return _call.Call(func, h, (spec,), spans, noop=True)
    plan = _staging.packed_operands(dt, inputs, o, out_shape, nhwc, alpha, beta)
    scale = float(math.prod(geo.ws)) if is_sum else 1.0
    if plan.stage is not None and plan.stage.output is not None:
        a, b = _call.scales(dt, scale, 0.0)  # the staged copy applies alpha/beta
    else:
        a, b = _call.scales(dt, alpha * scale, beta)
    so = (plan.spec if o is None else o).nbytes_span
    pool = PoolingDescriptor(geo.ws, geo.stride, geo.pad, mode=pmode, nan_propagation=True)
    return _Pooling(func, h, plan, (*spans, so), pool, a, b, backward)


def _out_operand(
    func: str, name: str, out: Any, like: _operand.Operand, shape
) -> _operand.Operand | None:
    if out is None:
        return None
    o = _operand.operand(out)
    _checks.same_dtype_and_device(func, (("img", like), (name, o)))
    _checks.check_operand(func, name, o)
    _checks.check_out(func, o, shape, name)
    return o


# ==================================================================================================
# Public functions
# ==================================================================================================
def dnn_pool(
    img: DeviceArrayLike,
    ws: int | Sequence[int],
    stride: int | Sequence[int] | None = None,
    mode: PoolMode = "max",
    pad: int | Sequence[int] | None = None,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Out | None = None,
    stream: StreamLike = None,
) -> Out:
    """GPU pooling with cuDNN (``cudnnPoolingForward``): ``out = alpha * pool(img) + beta * out``.

    Parameters
    ----------
    img : device array
        ``(N, C, H, W)`` for 2-D pooling, ``(N, C, D, H, W)`` for 3-D; NCHW/NCDHW or channels
        last (inferred from the strides; other strides are staged through packed copies);
        float16, bfloat16, float32 or float64.
    ws : tuple of 2 or 3 ints
        Window size; its length sets the rank (an int is broadcast to the image's rank).
    stride : int or tuple, optional
        **Default 1 in every dimension** (Theano's default; PyTorch's is the window).
    mode : {'max', 'average_inc_pad', 'average_exc_pad', 'max_deterministic', 'average', 'sum'}
        ``average_inc_pad`` divides by the window volume, ``average_exc_pad`` by the number of
        input elements in the window; ``average`` is ``average_inc_pad``; ``sum`` is
        ``average_inc_pad`` times the window volume; ``max_deterministic`` is ``max`` with a
        deterministic backward.
    pad : int or tuple, optional
        Implicit padding on both sides of each spatial dimension, default 0; must be smaller
        than the window.
    alpha, beta : float
        Blend factors (*beta* != 0 accumulates into *out*).
    out : device array, optional
        Of shape :func:`get_pool_output_shape`, same dtype and device; may not overlap *img*.
    stream : optional
        CUDA stream; default the operands' framework's current stream (torch, CuPy), else the
        handle's stream.

    Returns
    -------
    DeviceArray or the type of *out*
        ``(N, C, *((in + 2*pad - ws) // stride + 1))``, in *img*'s layout when new.

    Raises
    ------
    TypeError
        Host arrays, a dtype other than the four floating types, mixed dtypes, a non-int size.
    ValueError
        A rank that does not match ``len(ws)``, a window larger than the padded input, padding
        not smaller than the window, a stride or window < 1, a negative pad, an unknown mode, an
        *out* of the wrong shape or overlapping *img*, negative or zero strides, operands on
        different devices.

    Examples
    --------
    >>> y = pycudnn.dnn_pool(x, (2, 2), stride=(2, 2))              # PyTorch's max_pool2d(x, 2)
    >>> y = pycudnn.dnn_pool(x, (3, 3), (1, 1), "average_exc_pad", pad=(1, 1))
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(img)
    px, kx = _operand.key_of(img)
    po, ko = (None, None) if out is None else _operand.key_of(out)
    key = (_FWD, kx, ko, _geometry_key(ws, stride, pad), mode, alpha, beta)
    key += (alpha.__class__, beta.__class__)  # True == 1.0, but only one is valid
    args = (img, out, ws, stride, mode, pad, alpha, beta, stream)
    return _call.run_cached(key, _build_forward, args, (px,), (out,), (po,), stream)[0]


def _build_forward(img, out, ws, stride, mode, pad, alpha, beta, stream) -> _call.Call:
    func = "dnn_pool"
    g = _operand.operand(img)
    dt, device = _checks.same_dtype_and_device(func, (("img", g),))
    _checks.check_operand(func, "img", g)
    geo = _geometry(func, g.shape, ws, stride, pad)
    pooling = _checks.choose(mode, _MODES, "mode", func)
    factors = _checks.real(alpha, "alpha", func), _checks.real(beta, "beta", func)
    _checks.beta_needs_out(func, beta, out)
    o = _out_operand(func, "out", out, g, geo.out_shape)
    h = _call.handle_for(device, stream, func)
    return _entry(func, h, dt, geo, pooling, (g,), o, geo.out_shape, factors, False)


def dnn_pool_grad(
    img: DeviceArrayLike,
    out: DeviceArrayLike,
    out_grad: DeviceArrayLike,
    ws: int | Sequence[int],
    stride: int | Sequence[int] | None = None,
    mode: PoolMode = "max",
    pad: int | Sequence[int] | None = None,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    img_grad: Out | None = None,
    stream: StreamLike = None,
) -> Out:
    """Gradient of :func:`dnn_pool` w.r.t. *img* (``cudnnPoolingBackward``):
    ``img_grad = alpha * dpool(out_grad) + beta * img_grad``.

    Parameters
    ----------
    img : device array
        The forward input.
    out : device array
        The forward output ``dnn_pool(img, ws, stride, mode, pad)`` (computed with ``alpha=1,
        beta=0``: the max modes route the gradient to the input elements equal to it).
    out_grad : device array
        Gradient w.r.t. *out*, same shape.
    ws, stride, mode, pad
        As in the forward call (same defaults: stride 1, pad 0).
    alpha, beta : float
        Blend factors (*beta* != 0 accumulates into *img_grad*).
    img_grad : device array, optional
        The destination of the gradient (shape of *img*, same dtype and device); may not
        overlap the inputs. (``out`` is Theano's positional name of the forward output, hence
        this keyword.)
    stream : optional
        CUDA stream; default the operands' framework's current stream (torch, CuPy), else the
        handle's stream.

    Returns
    -------
    DeviceArray or the type of *img_grad*
        The gradient w.r.t. *img*, in *img*'s layout when new.

    Raises
    ------
    TypeError, ValueError
        As for :func:`dnn_pool`; also when *out* or *out_grad* does not have the forward output's
        shape.

    Notes
    -----
    For the max modes, an input element receives the gradient of every window whose maximum it
    is; ties within a window are resolved by cuDNN (``max_deterministic`` deterministically).

    Examples
    --------
    >>> y = pycudnn.dnn_pool(x, (2, 2), (2, 2))
    >>> dx = pycudnn.dnn_pool_grad(x, y, dy, (2, 2), (2, 2))
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(img)
    px, kx = _operand.key_of(img)
    py, ky = _operand.key_of(out)
    pdy, kdy = _operand.key_of(out_grad)
    po, ko = (None, None) if img_grad is None else _operand.key_of(img_grad)
    key = (
        _BWD,
        kx,
        ky,
        kdy,
        ko,
        _geometry_key(ws, stride, pad),
        mode,
        alpha,
        beta,
        alpha.__class__,
        beta.__class__,
    )
    args = ((img, out, out_grad), img_grad, ws, stride, mode, pad, alpha, beta, stream)
    ptrs = (px, py, pdy)
    return _call.run_cached(key, _build_backward, args, ptrs, (img_grad,), (po,), stream)[0]


def _build_backward(operands, img_grad, ws, stride, mode, pad, alpha, beta, stream) -> _call.Call:
    """*operands*: ``(img, out, out_grad)``."""
    func = "dnn_pool_grad"
    gx, gy, gdy = (_operand.operand(a) for a in operands)
    named = (("img", gx), ("out", gy), ("out_grad", gdy))
    dt, device = _checks.same_dtype_and_device(func, named)
    for name, g in named:
        _checks.check_operand(func, name, g)
    geo = _geometry(func, gx.shape, ws, stride, pad)
    for name, g in named[1:]:
        if tuple(g.shape) != geo.out_shape:
            raise ValueError(
                f"{func}: {name} has shape {tuple(g.shape)}, expected the forward output's "
                f"{geo.out_shape} (img {tuple(gx.shape)}, ws={geo.ws}, stride={geo.stride}, "
                f"pad={geo.pad})"
            )
    pooling = _checks.choose(mode, _MODES, "mode", func)
    factors = _checks.real(alpha, "alpha", func), _checks.real(beta, "beta", func)
    _checks.beta_needs_out(func, beta, img_grad)
    o = _out_operand(func, "img_grad", img_grad, gx, gx.shape)
    h = _call.handle_for(device, stream, func)
    return _entry(func, h, dt, geo, pooling, (gx, gy, gdy), o, gx.shape, factors, True)
