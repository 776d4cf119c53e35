"""Cross-channel local response normalization: cudnn.torch's ``SpatialCrossMapLRN`` as eager
functions (``cudnnLRNCrossChannelForward`` / ``Backward``).

``dnn_lrn(x, n, alpha, beta, k)`` computes, for every channel ``c``,

    y[:, c] = x[:, c] / (k + alpha / n * sum(x[:, j] ** 2 for j in window(c))) ** beta

with cuDNN's window ``[c - (n - 1) // 2, c + n // 2]`` clipped to the channels (as documented
for ``cudnnSetLRNDescriptor`` and measured: for odd *n* this is PyTorch's
``F.local_response_norm``; for even *n* PyTorch's window is one channel earlier).
``dnn_lrn_grad(y, dy, x, ...)`` is its gradient. Both go through the shared call path
(:mod:`._call`): the descriptors are cached per call, so a repeated call makes one C call.

Operands: 2 to 5 dims ``(N, C, spatial...)`` with any strides (NCHW, NHWC, views); 5-D operands
other than packed NCDHW go through packed copies (cuDNN refuses 5-D tensors whose spatial dims
are not packed: ``BAD_PARAM``, "isTensorNCHW_HWpacked");
float16, float32, float64 (bfloat16 is ``NOT_SUPPORTED`` by cuDNN). cuDNN's blend factors are not
exposed (their names, alpha and beta, are the LRN parameters here): the result is written,
not accumulated.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

from .. import _layout
from ..descriptors import LRNDescriptor
from ..enums import DataType, LRNMode
from . import _call, _checks, _operand, _staging

if TYPE_CHECKING:
    from ..typing import DeviceArrayLike, StreamLike
    from ._annotations import Out

__all__ = ["dnn_lrn", "dnn_lrn_grad"]

_TYPES = (DataType.HALF, DataType.FLOAT, DataType.DOUBLE)
_FWD, _BWD = "lrn", "lrn_grad"
_N_MAX, _BETA_MIN, _K_MIN = 16, 0.01, 1e-5  # CUDNN_LRN_MAX_N, CUDNN_LRN_MIN_BETA, CUDNN_LRN_MIN_K


def _params(func: str, n: Any, alpha: Any, beta: Any, k: Any) -> tuple[int, float, float, float]:
    if isinstance(n, bool) or not hasattr(n, "__index__"):
        raise TypeError(f"{func}: n must be an int, got {n!r}")
    nv = n.__index__()
    if not 1 <= nv <= _N_MAX:
        raise ValueError(f"{func}: n={nv} is out of range; expected a window of 1 to 16 channels")
    a = _checks.real(alpha, "alpha", func)
    b = _checks.real(beta, "beta", func, lo=_BETA_MIN)
    kv = _checks.real(k, "k", func, lo=_K_MIN)
    return nv, a, b, kv


def _check_rank(func: str, name: str, g: _operand.Operand) -> None:
    if not 2 <= len(g.shape) <= 5:
        raise ValueError(
            f"{func}: {name} has shape {tuple(g.shape)}; expected 2 to 5 dims (N, C, spatial...)"
        )


class _LRN(_call.Call):
    """``cudnnLRNCrossChannelForward`` (x, y) or ``cudnnLRNCrossChannelBackward``
    (y, dy, x, dx)."""

    __slots__ = ("descs", "fn", "hp", "ld", "one", "zero")

    def __init__(self, func, h, alloc, spans, stage, ld, descs, dt, name):
        one, zero = _call.scales(dt, 1.0, 0.0)
        # the descriptors and the factors byref() points into live as long as the entry
        super().__init__(func, h, (alloc,), spans, stage, keepalive=(ld, descs, one, zero))
        self.ld, self.descs = ld, descs
        self.hp = h.ptr
        self.one, self.zero = ctypes.byref(one), ctypes.byref(zero)
        self.fn = _call.quiet(name)


class _Forward(_LRN):
    __slots__ = ()

    def launch(self, ptrs):
        xd, yd = self.descs
        self.fn(self.hp, self.ld, LRNMode.DIM1, self.one, xd, ptrs[0], self.zero, yd, ptrs[1])


class _Backward(_LRN):
    __slots__ = ()

    def launch(self, ptrs):
        y, dy, x, dx = ptrs
        yd, dyd, xd, dxd = self.descs
        self.fn(self.hp, self.ld, LRNMode.DIM1, self.one, yd, y, dyd, dy, xd, x, self.zero, dxd, dx)


def _packed5(g: _operand.Operand) -> bool:
    """cuDNN's LRN takes 5-D tensors with packed spatial dims only (``BAD_PARAM`` otherwise,
    measured on 9.19); other 5-D layouts go through packed copies."""
    return len(g.shape) != 5 or _layout.is_c_contiguous(g.shape, g.strides)


def _input(func: str, name: str, g: _operand.Operand, index: int, stage: list) -> Any:
    """The descriptor cuDNN reads *g* with (queueing a packed copy for 5-D non-packed)."""
    if _packed5(g):
        return _staging.tensor_desc(func, name, g)
    _checks.check_strides(func, name, g)
    packed = _layout.packed_strides(g.shape)
    stage.append((index, g, packed))
    return _staging.tensor_descriptor(g.shape, packed, g.dtype)


def _output(func: str, out: Any, like: _operand.Operand, dt: DataType, device: int):
    """(descriptor or None when empty, alloc spec or None, its byte span, staged output or
    None)."""
    empty = any(n == 0 for n in like.shape)
    if out is None:
        if len(like.shape) == 5:
            spec = _call.output_spec(like.shape, dt, device)  # packed NCDHW
        else:
            spec = _call.like_spec(like)
        desc = None
        if not empty:
            desc = _staging.tensor_descriptor(
                *_staging.padded(spec.shape, spec.element_strides), dt
            )
        return desc, spec, spec.nbytes_span, None
    o = _checks.out_operand(func, out, like.shape, dt, device)
    if empty:
        return None, None, o.nbytes_span, None
    if _packed5(o):
        return _staging.tensor_desc(func, "out", o), None, o.nbytes_span, None
    packed = _layout.packed_strides(o.shape)
    staged = (tuple(o.shape), tuple(o.strides), packed)
    return _staging.tensor_descriptor(o.shape, packed, dt), None, o.nbytes_span, staged


def _stage(dt: DataType, inputs: list, output: Any) -> _staging.Stage | None:
    if not inputs and output is None:
        return None
    return _staging.Stage(dt, inputs, output, 1.0, 0.0)


def dnn_lrn(
    x: DeviceArrayLike,
    n: int = 5,
    alpha: float = 1e-4,
    beta: float = 0.75,
    k: float = 2.0,
    *,
    out: Out | None = None,
    stream: StreamLike = None,
) -> Out:
    """Cross-channel local response normalization (``cudnnLRNCrossChannelForward``).

    ``y = x / (k + alpha / n * sum of x**2 over the n-channel window) ** beta``.

    Parameters
    ----------
    x : device array
        ``(N, C, spatial...)``, 2 to 5 dims, any strides; float16, float32 or float64.
    n : int
        Window width in channels, 1 to 16; the window of channel ``c`` is
        ``[c - (n - 1) // 2, c + n // 2]``.
    alpha : float
        Scale of the sum of squares (divided by *n*, as in cudnn.torch and PyTorch).
    beta : float
        Exponent, at least 0.01.
    k : float
        Additive constant, at least 1e-5.
    out : device array, optional
        Same shape and dtype as *x*, any strides; must not overlap *x*.
    stream : optional
        CUDA stream; default the operands' framework's current stream (torch, CuPy), else the
        handle's stream.

    Returns
    -------
    DeviceArray or the type of *out*
        ``y``, in *x*'s memory order when new.

    Raises
    ------
    TypeError
        Host arrays, an unsupported dtype (bfloat16 included), a non-int *n*.
    ValueError
        *n* outside 1..16, *beta* < 0.01, *k* < 1e-5, non-finite parameters, a rank outside
        2..5, a bad *out*, negative or zero strides.

    Examples
    --------
    >>> y = pycudnn.dnn_lrn(x, n=5, alpha=1e-4, beta=0.75, k=2.0)   # AlexNet's LRN
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(x)
    px, kx = _operand.key_of(x)
    po, ko = (None, None) if out is None else _operand.key_of(out)
    key = (
        _FWD,
        kx,
        ko,
        n,
        alpha,
        beta,
        k,
        n.__class__,
        alpha.__class__,
        beta.__class__,
        k.__class__,
    )
    args = (x, out, n, alpha, beta, k, stream)
    return _call.run_cached(key, _build_forward, args, (px,), (out,), (po,), stream)[0]


def _build_forward(x, out, n, alpha, beta, k, stream) -> _call.Call:
    func = "dnn_lrn"
    g = _operand.operand(x)
    dt, device = _checks.same_dtype_and_device(func, (("x", g),), _TYPES)
    _check_rank(func, "x", g)
    _checks.check_strides(func, "x", g)
    params = _params(func, n, alpha, beta, k)
    yd, spec, so, staged = _output(func, out, g, dt, device)
    h = _call.handle_for(device, stream, func)
    spans = (g.nbytes_span, so)
    if yd is None:
        return _call.Call(func, h, (spec,), spans, noop=True)
    inputs: list = []
    xd = _input(func, "x", g, 0, inputs)
    ld = LRNDescriptor(*params)
    stage = _stage(dt, inputs, staged)
    return _Forward(func, h, spec, spans, stage, ld, (xd, yd), dt, "cudnnLRNCrossChannelForward")


def dnn_lrn_grad(
    y: DeviceArrayLike,
    dy: DeviceArrayLike,
    x: DeviceArrayLike,
    n: int = 5,
    alpha: float = 1e-4,
    beta: float = 0.75,
    k: float = 2.0,
    *,
    out: Out | None = None,
    stream: StreamLike = None,
) -> Out:
    """Gradient of :func:`dnn_lrn` w.r.t. *x* (``cudnnLRNCrossChannelBackward``).

    Parameters
    ----------
    y : device array
        The forward output ``dnn_lrn(x, n, alpha, beta, k)``.
    dy : device array
        Gradient w.r.t. *y*, same shape.
    x : device array
        The forward input, same shape.
    n, alpha, beta, k
        As in the forward call.
    out : device array, optional
        ``dx``, same shape and dtype, any strides; must not overlap the inputs.
    stream : optional
        CUDA stream; default the operands' framework's current stream (torch, CuPy), else the
        handle's stream.

    Returns
    -------
    DeviceArray or the type of *out*
        ``dx``, in *x*'s memory order when new.

    Raises
    ------
    TypeError, ValueError
        As for :func:`dnn_lrn`; also when *y*, *dy* and *x* differ in shape, dtype or device.

    Examples
    --------
    >>> y = pycudnn.dnn_lrn(x, 5)
    >>> dx = pycudnn.dnn_lrn_grad(y, dy, x, 5)
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
        n,
        alpha,
        beta,
        k,
        n.__class__,
        alpha.__class__,
        beta.__class__,
        k.__class__,
    )
    args = (y, dy, x, out, n, alpha, beta, k, stream)
    return _call.run_cached(key, _build_backward, args, (py, pdy, px), (out,), (po,), stream)[0]


def _build_backward(y, dy, x, out, n, alpha, beta, k, stream) -> _call.Call:
    func = "dnn_lrn_grad"
    gy, gdy, gx = _operand.operand(y), _operand.operand(dy), _operand.operand(x)
    dt, device = _checks.same_dtype_and_device(func, (("y", gy), ("dy", gdy), ("x", gx)), _TYPES)
    _check_rank(func, "x", gx)
    _checks.shapes_of_x(func, gy, gdy, gx)
    for name, g in (("y", gy), ("dy", gdy), ("x", gx)):
        _checks.check_strides(func, name, g)
    params = _params(func, n, alpha, beta, k)
    dxd, spec, so, staged = _output(func, out, gx, dt, device)
    h = _call.handle_for(device, stream, func)
    spans = (gy.nbytes_span, gdy.nbytes_span, gx.nbytes_span, so)
    if dxd is None:
        return _call.Call(func, h, (spec,), spans, noop=True)
    inputs: list = []
    yd, dyd, xd = (
        _input(func, nm, g, i, inputs)
        for i, (nm, g) in enumerate((("y", gy), ("dy", gdy), ("x", gx)))
    )
    ld = LRNDescriptor(*params)
    stage = _stage(dt, inputs, staged)
    descs = (yd, dyd, xd, dxd)
    return _Backward(func, h, spec, spans, stage, ld, descs, dt, "cudnnLRNCrossChannelBackward")
