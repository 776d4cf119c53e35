"""Spatial transformer: Theano's ``dnn_spatialtf`` and its pieces, with their gradients
(``cudnnSpatialTfGridGenerator*`` and ``cudnnSpatialTfSampler*``).

* :func:`dnn_spatialtf_grid` ``(theta (N, 2, 3), out_shape (N, C, H, W)) -> grid (N, H, W, 2)``:
  the affine grid ``grid[n, h, w] = theta[n] @ (x_w, y_h, 1)`` over the normalised output
  coordinates ``x_w = -1 + 2 w / (W - 1)``, ``y_h = -1 + 2 h / (H - 1)`` (sizes of at least 2
  are the tested ones).
* :func:`dnn_spatialtf_sampler` ``(img (N, C, Hi, Wi), grid) -> (N, C, H, W)``: bilinear
  sampling of *img* at ``grid[..., 0]`` (x, along the width) and ``grid[..., 1]`` (y), where -1
  and 1 are the centres of the first and last pixels; points outside read zeros.
* :func:`dnn_spatialtf` ``(img, theta, scale_width, scale_height)``: both, with Theano's output
  size ``ceil(Hi * scale_height) x ceil(Wi * scale_width)``.

This is PyTorch's ``F.affine_grid(theta, size, align_corners=True)`` and
``F.grid_sample(img, grid, mode='bilinear', padding_mode='zeros', align_corners=True)`` (checked
on cuDNN 9.19; ``align_corners=False`` differs). The gradients: :func:`dnn_spatialtf_grid_grad`
(``dgrid -> dtheta``), :func:`dnn_spatialtf_sampler_grad` (``-> (dimg, dgrid)``, one cuDNN call)
and :func:`dnn_spatialtf_grad` (``-> (dimg, dtheta)``). cuDNN's sampler backward accumulates with
atomics: it is not bitwise reproducible.

Layouts and dtypes: float16, float32, float64 (bfloat16 is refused by cuDNN's descriptor).
Images, outputs and their gradients take any strides (NCHW, NHWC, views). *theta* and *grid*
have no descriptor in cuDNN's API: inputs of other strides are copied to packed C order first,
and ``out=`` arrays for grids and ``dtheta`` must be C-contiguous. Every call goes through the
shared call path (:mod:`._call`), its descriptors cached with the call.
"""

from __future__ import annotations

import ctypes
import math
from typing import TYPE_CHECKING, Any

from .. import _layout
from ..descriptors import SpatialTransformerDescriptor
from ..enums import DataType
from . import _call, _checks, _operand, _staging

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..memory import DeviceArray
    from ..typing import DeviceArrayLike, StreamLike
    from ._annotations import Out, Out2

__all__ = [
    "dnn_spatialtf",
    "dnn_spatialtf_grad",
    "dnn_spatialtf_grid",
    "dnn_spatialtf_grid_grad",
    "dnn_spatialtf_sampler",
    "dnn_spatialtf_sampler_grad",
]

_TYPES = (DataType.HALF, DataType.FLOAT, DataType.DOUBLE)
_GRID, _GRID_BWD, _SAMPLE, _SAMPLE_BWD = "stf_grid", "stf_grid_grad", "stf_sampler", "stf_sgrad"


# ==================================================================================================
# Validation helpers
# ==================================================================================================
def _shape_of(func: str, name: str, g: _operand.Operand, expected: tuple, what: str) -> None:
    """*g* has ``len(expected)`` dims and the given sizes (None: any)."""
    shape = tuple(g.shape)
    ok = len(shape) == len(expected) and all(
        e is None or s == e for s, e in zip(shape, expected, strict=True)
    )
    if not ok:
        raise ValueError(f"{func}: {name} has shape {shape}; expected {what}")


def _staged(func: str, name: str, g: _operand.Operand, index: int, stage: list) -> None:
    """Check *g*'s strides; queue a packed copy when cuDNN (no descriptor) cannot read it."""
    _checks.check_strides(func, name, g)
    if not _layout.is_c_contiguous(g.shape, g.strides) and 0 not in g.shape:
        stage.append((index, g, _layout.packed_strides(g.shape)))


def _packed_out(
    func: str, name: str, out: Any, shape: tuple, dt: DataType, device: int
) -> _operand.Operand:
    o = _checks.out_operand(func, out, shape, dt, device, name)
    if not _layout.is_c_contiguous(o.shape, o.strides):
        raise ValueError(
            f"{func}: {name} has strides {tuple(o.strides)}; cuDNN writes it without a "
            "descriptor, so it must be C-contiguous"
        )
    return o


def _out_shape(func: str, value: Any) -> tuple[int, int, int, int]:
    what = f"{func}: out_shape must be 4 ints (N, C, H, W)"
    try:
        vals = tuple(value)
    except TypeError:
        raise TypeError(f"{what}, got {value!r}") from None
    if len(vals) != 4:
        raise ValueError(f"{what}, got {value!r}")
    if any(isinstance(v, bool) or not hasattr(v, "__index__") for v in vals):
        raise TypeError(f"{what}, got {value!r}")
    n, c, h, w = (v.__index__() for v in vals)
    if n < 0 or min(c, h, w) < 1:
        raise ValueError(f"{what} with N >= 0 and C, H, W >= 1, got {value!r}")
    return n, c, h, w


def _make_stage(dt: DataType, stage: list) -> _staging.Stage | None:
    return _staging.Stage(dt, stage, None, 1.0, 0.0) if stage else None


def _beta_needs_out(func: str, beta: float, out: Any) -> None:
    if beta != 0.0 and out is None:
        raise ValueError(f"{func}: beta={beta!r} blends into out, but no out was given")


def _image(func: str, name: str, g: _operand.Operand) -> None:
    if len(g.shape) != 4:
        raise ValueError(f"{func}: {name} has shape {tuple(g.shape)}; expected (N, C, H, W)")
    if any(s < 1 for s in g.shape[1:]):
        raise ValueError(f"{func}: {name} has shape {tuple(g.shape)}; C, H and W must be >= 1")


def output_shape(
    img_shape: Any, scale_width: float = 1, scale_height: float = 1
) -> tuple[int, int, int, int]:
    """The output shape of :func:`dnn_spatialtf`: ``(N, C, ceil(H * scale_height),
    ceil(W * scale_width))`` (Theano's; a product within 1e-9 of an integer is that integer)."""
    func = "dnn_spatialtf"
    n, c, h, w = (int(s) for s in img_shape)
    sw = _checks.real(scale_width, "scale_width", func, lo=0.0, lo_open=True)
    sh = _checks.real(scale_height, "scale_height", func, lo=0.0, lo_open=True)
    return n, c, max(1, math.ceil(h * sh - 1e-9)), max(1, math.ceil(w * sw - 1e-9))


# ==================================================================================================
# Call entries
# ==================================================================================================
class _GridGenerator(_call.Call):
    """``cudnnSpatialTfGridGeneratorForward`` (theta, grid) or ``...Backward`` (dgrid, dtheta)."""

    __slots__ = ("fn", "hp", "st")

    def __init__(self, func, h, alloc, spans, stage, st, name):
        super().__init__(func, h, (alloc,), spans, stage, keepalive=st)
        self.st, self.hp = st, h.ptr
        self.fn = _call.quiet(name)

    def launch(self, ptrs):
        self.fn(self.hp, self.st, ptrs[0], ptrs[1])


class _Sampler(_call.Call):
    """``cudnnSpatialTfSamplerForward``: x, grid, then y."""

    __slots__ = ("alpha", "beta", "descs", "fn", "hp", "st")

    def __init__(self, func, h, alloc, spans, stage, st, descs, a, b):
        # the descriptors and the factors byref() points into live as long as the entry
        super().__init__(func, h, (alloc,), spans, stage, keepalive=(st, descs, a, b))
        self.st, self.descs, self.hp = st, descs, h.ptr
        self.alpha, self.beta = ctypes.byref(a), ctypes.byref(b)
        self.fn = _call.quiet("cudnnSpatialTfSamplerForward")

    def launch(self, ptrs):
        x, grid, y = ptrs
        xd, yd = self.descs
        self.fn(self.hp, self.st, self.alpha, xd, x, grid, self.beta, yd, y)


class _SamplerBackward(_call.Call):
    """``cudnnSpatialTfSamplerBackward``: x, grid, dy, then dx, dgrid."""

    __slots__ = ("alpha", "beta", "descs", "fn", "hp", "st")

    def __init__(self, func, h, allocs, spans, stage, st, descs, a, b):
        super().__init__(func, h, allocs, spans, stage, keepalive=(st, descs, a, b))
        self.st, self.descs, self.hp = st, descs, h.ptr
        self.alpha, self.beta = ctypes.byref(a), ctypes.byref(b)
        self.fn = _call.quiet("cudnnSpatialTfSamplerBackward")

    def launch(self, ptrs):
        x, grid, dy, dx, dgrid = ptrs
        xd, dxd, dyd = self.descs
        a, b = self.alpha, self.beta
        self.fn(self.hp, self.st, a, xd, x, b, dxd, dx, a, dyd, dy, grid, b, dgrid)


# ==================================================================================================
# Grid generator
# ==================================================================================================
def dnn_spatialtf_grid(
    theta: DeviceArrayLike,
    out_shape: Sequence[int],
    *,
    out: Out | None = None,
    stream: StreamLike = None,
) -> Out:
    """The sampling grid of affine transformations (``cudnnSpatialTfGridGeneratorForward``).

    Parameters
    ----------
    theta : device array
        ``(N, 2, 3)`` affine matrices mapping output to input coordinates; float16, float32 or
        float64; copied to C order first if strided.
    out_shape : sequence of 4 ints
        ``(N, C, H, W)`` of the image to produce (Theano's ``out_dims``; *C* does not matter).
    out : device array, optional
        ``(N, H, W, 2)``, C-contiguous, *theta*'s dtype.
    stream : optional
        CUDA stream; default the operands' framework's current stream (torch, CuPy), else the
        handle's stream.

    Returns
    -------
    DeviceArray or the type of *out*
        ``grid[n, h, w] = (x, y)``, normalised input coordinates in [-1, 1] for the corners.

    Raises
    ------
    TypeError
        Host arrays, an unsupported dtype, a non-int size.
    ValueError
        *theta* not ``(N, 2, 3)``, *out_shape* not 4 sizes >= 1 with ``N`` of *theta*, a bad
        *out*.

    Examples
    --------
    >>> grid = pycudnn.dnn_spatialtf_grid(theta, (n, c, 32, 32))
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(theta)
    pt, kt = _operand.key_of(theta)
    po, ko = (None, None) if out is None else _operand.key_of(out)
    try:
        oshape: Any = tuple(out_shape)
    except TypeError:
        oshape = out_shape
    key = (_GRID, kt, ko, oshape)
    args = (theta, out, out_shape, stream)
    return _call.run_cached(key, _build_grid, args, (pt,), (out,), (po,), stream)[0]


def _build_grid(theta, out, out_shape, stream) -> _call.Call:
    func = "dnn_spatialtf_grid"
    g = _operand.operand(theta)
    dt, device = _checks.same_dtype_and_device(func, (("theta", g),), _TYPES)
    _shape_of(func, "theta", g, (None, 2, 3), "(N, 2, 3)")
    n, c, h, w = _out_shape(func, out_shape)
    if n != g.shape[0]:
        raise ValueError(f"{func}: out_shape {(n, c, h, w)} has N={n}, theta has N={g.shape[0]}")
    shapes = ((n, h, w, 2), (n, c, h, w))
    name = "cudnnSpatialTfGridGeneratorForward"
    return _grid_call(func, name, "theta", g, (dt, device), out, stream, shapes)


def _grid_call(func, name, what, g, dt_device, out, stream, shapes) -> _call.Call:
    """The grid generator's call, either direction: *g* (argument *what*) staged to C order,
    the packed output of ``shapes[0]``, the transformer descriptor of ``shapes[1]``."""
    dt, device = dt_device
    oshape, st_shape = shapes
    stage: list = []
    _staged(func, what, g, 0, stage)
    if out is None:
        spec = _call.output_spec(oshape, dt, device)
        so = spec.nbytes_span
    else:
        spec, so = None, _packed_out(func, "out", out, oshape, dt, device).nbytes_span
    hd = _call.handle_for(device, stream, func)
    spans = (g.nbytes_span, so)
    if oshape[0] == 0:
        return _call.Call(func, hd, (spec,), spans, noop=True)
    st = SpatialTransformerDescriptor(st_shape, dt)
    return _GridGenerator(func, hd, spec, spans, _make_stage(dt, stage), st, name)


def dnn_spatialtf_grid_grad(
    dgrid: DeviceArrayLike, *, out: Out | None = None, stream: StreamLike = None
) -> Out:
    """Gradient of :func:`dnn_spatialtf_grid` w.r.t. *theta*
    (``cudnnSpatialTfGridGeneratorBackward``).

    Parameters
    ----------
    dgrid : device array
        ``(N, H, W, 2)``, gradient w.r.t. the grid; copied to C order first if strided.
    out : device array, optional
        ``dtheta``, ``(N, 2, 3)``, C-contiguous.
    stream : optional
        CUDA stream; default the operands' framework's current stream (torch, CuPy), else the
        handle's stream.

    Returns
    -------
    DeviceArray or the type of *out*
        ``dtheta`` (N, 2, 3).

    Raises
    ------
    TypeError, ValueError
        As for :func:`dnn_spatialtf_grid`; *dgrid* not ``(N, H, W, 2)``.

    Examples
    --------
    >>> dimg, dgrid = pycudnn.dnn_spatialtf_sampler_grad(img, grid, dy)
    >>> dtheta = pycudnn.dnn_spatialtf_grid_grad(dgrid)
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(dgrid)
    pg, kg = _operand.key_of(dgrid)
    po, ko = (None, None) if out is None else _operand.key_of(out)
    key = (_GRID_BWD, kg, ko)
    args = (dgrid, out, stream)
    return _call.run_cached(key, _build_grid_backward, args, (pg,), (out,), (po,), stream)[0]


def _build_grid_backward(dgrid, out, stream) -> _call.Call:
    func = "dnn_spatialtf_grid_grad"
    g = _operand.operand(dgrid)
    dt, device = _checks.same_dtype_and_device(func, (("dgrid", g),), _TYPES)
    _shape_of(func, "dgrid", g, (None, None, None, 2), "(N, H, W, 2)")
    n, h, w, _ = g.shape
    if n and min(h, w) < 1:
        raise ValueError(f"{func}: dgrid has shape {tuple(g.shape)}; H and W must be >= 1")
    shapes = ((n, 2, 3), (n, 1, h, w))
    name = "cudnnSpatialTfGridGeneratorBackward"
    return _grid_call(func, name, "dgrid", g, (dt, device), out, stream, shapes)


# ==================================================================================================
# Sampler
# ==================================================================================================
def dnn_spatialtf_sampler(
    img: DeviceArrayLike,
    grid: DeviceArrayLike,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Out | None = None,
    stream: StreamLike = None,
) -> Out:
    """Bilinear sampling of *img* at *grid* (``cudnnSpatialTfSamplerForward``):
    ``out = alpha * sample(img, grid) + beta * out``.

    Parameters
    ----------
    img : device array
        ``(N, C, Hi, Wi)``, any strides; float16, float32 or float64.
    grid : device array
        ``(N, H, W, 2)`` normalised ``(x, y)`` coordinates (-1 and 1: the centres of the edge
        pixels), *img*'s dtype; copied to C order first if strided.
    alpha, beta : float
        Blend factors (``beta != 0`` needs *out*).
    out : device array, optional
        ``(N, C, H, W)``, any strides.
    stream : optional
        CUDA stream; default the operands' framework's current stream (torch, CuPy), else the
        handle's stream.

    Returns
    -------
    DeviceArray or the type of *out*
        ``(N, C, H, W)``, in *img*'s memory order (NCHW or NHWC) when new.

    Raises
    ------
    TypeError
        Host arrays, unsupported or mixed dtypes.
    ValueError
        Bad shapes (*img* not 4-D, *grid* not ``(N, H, W, 2)`` with *img*'s N), operands on
        different devices, a bad *out*, ``beta != 0`` without *out*.

    Examples
    --------
    >>> y = pycudnn.dnn_spatialtf_sampler(img, grid)
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(img)
    pi, ki = _operand.key_of(img)
    pg, kg = _operand.key_of(grid)
    po, ko = (None, None) if out is None else _operand.key_of(out)
    key = (_SAMPLE, ki, kg, ko, alpha, beta, alpha.__class__, beta.__class__)
    args = (img, grid, out, alpha, beta, stream)
    return _call.run_cached(key, _build_sampler, args, (pi, pg), (out,), (po,), stream)[0]


def _sampler_operands(func, img, grid):
    gi, gg = _operand.operand(img), _operand.operand(grid)
    dt, device = _checks.same_dtype_and_device(func, (("img", gi), ("grid", gg)), _TYPES)
    _image(func, "img", gi)
    n = gi.shape[0]
    _shape_of(func, "grid", gg, (n, None, None, 2), f"({n}, H, W, 2) (N of img)")
    if n and min(gg.shape[1:3]) < 1:
        raise ValueError(f"{func}: grid has shape {tuple(gg.shape)}; H and W must be >= 1")
    _checks.check_strides(func, "img", gi)
    stage: list = []
    _staged(func, "grid", gg, 1, stage)
    return gi, gg, dt, device, stage


def _build_sampler(img, grid, out, alpha, beta, stream) -> _call.Call:
    func = "dnn_spatialtf_sampler"
    gi, gg, dt, device, stage = _sampler_operands(func, img, grid)
    a = _checks.real(alpha, "alpha", func)
    b = _checks.real(beta, "beta", func)
    _beta_needs_out(func, b, out)
    n, c = gi.shape[:2]
    h, w = gg.shape[1:3]
    yshape = (n, c, h, w)
    if out is None:
        spec = _call.like_spec(gi, shape=yshape)
        ystrides, so = spec.element_strides, spec.nbytes_span
    else:
        spec = None
        o = _checks.out_operand(func, out, yshape, dt, device)
        ystrides, so = tuple(o.strides), o.nbytes_span
    hd = _call.handle_for(device, stream, func)
    spans = (gi.nbytes_span, gg.nbytes_span, so)
    if n == 0:
        return _call.Call(func, hd, (spec,), spans, noop=True)
    xd = _staging.tensor_desc(func, "img", gi)
    yd = _staging.tensor_descriptor(yshape, ystrides, dt)
    st = SpatialTransformerDescriptor(yshape, dt)
    sa, sb = _call.scales(dt, a, b)
    stage = _make_stage(dt, stage)
    return _Sampler(func, hd, spec, spans, stage, st, (xd, yd), sa, sb)


def dnn_spatialtf_sampler_grad(
    img: DeviceArrayLike,
    grid: DeviceArrayLike,
    dy: DeviceArrayLike,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: tuple[Out | None, Out2 | None] | None = None,
    stream: StreamLike = None,
) -> tuple[Out, Out2]:
    """Gradients of :func:`dnn_spatialtf_sampler` w.r.t. the image and the grid, in one call
    (``cudnnSpatialTfSamplerBackward``): ``d = alpha * grad + beta * d`` for both.

    Parameters
    ----------
    img, grid : device arrays
        The forward inputs.
    dy : device array
        ``(N, C, H, W)``, gradient w.r.t. the sampler's output, any strides.
    alpha, beta : float
        Blend factors of both gradients (``beta != 0`` needs both outputs in *out*).
    out : (device array or None, device array or None), optional
        ``(dimg, dgrid)``: *dimg* like *img* (any strides), *dgrid* like *grid* (C-contiguous).
    stream : optional
        CUDA stream; default the operands' framework's current stream (torch, CuPy), else the
        handle's stream.

    Returns
    -------
    (dimg, dgrid)
        New arrays (*dimg* in *img*'s memory order) or the given ones.

    Raises
    ------
    TypeError, ValueError
        As for :func:`dnn_spatialtf_sampler`; *dy* not ``(N, C, H, W)`` of *img* and *grid*;
        *out* not a pair.

    Examples
    --------
    >>> dimg, dgrid = pycudnn.dnn_spatialtf_sampler_grad(img, grid, dy)
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(img)
    func = "dnn_spatialtf_sampler_grad"
    outs = _checks.out_pair(func, out, "dimg, dgrid")
    pi, ki = _operand.key_of(img)
    pg, kg = _operand.key_of(grid)
    pdy, kdy = _operand.key_of(dy)
    pos, kos = zip(*((None, None) if o is None else _operand.key_of(o) for o in outs), strict=True)
    key = (_SAMPLE_BWD, ki, kg, kdy, kos, alpha, beta, alpha.__class__, beta.__class__)
    args = (img, grid, dy, outs, alpha, beta, stream)
    return _call.run_cached(key, _build_sampler_backward, args, (pi, pg, pdy), outs, pos, stream)


def _build_sampler_backward(img, grid, dy, outs, alpha, beta, stream) -> _call.Call:
    func = "dnn_spatialtf_sampler_grad"
    gi, gg, dt, device, stage = _sampler_operands(func, img, grid)
    gdy = _operand.operand(dy)
    _checks.same_dtype_and_device(func, (("img", gi), ("dy", gdy)), _TYPES)
    n, c = gi.shape[:2]
    h, w = gg.shape[1:3]
    _shape_of(func, "dy", gdy, (n, c, h, w), f"{(n, c, h, w)} (N, C of img, H, W of grid)")
    _checks.check_strides(func, "dy", gdy)
    a = _checks.real(alpha, "alpha", func)
    b = _checks.real(beta, "beta", func)
    if b != 0.0 and (outs[0] is None or outs[1] is None):
        raise ValueError(f"{func}: beta={beta!r} blends into out, but out has no (dimg, dgrid)")
    if outs[0] is None:
        ispec = _call.like_spec(gi)
        dxstrides, sdx = ispec.element_strides, ispec.nbytes_span
    else:
        ispec = None
        o = _checks.out_operand(func, outs[0], gi.shape, dt, device, "out[0] (dimg)")
        dxstrides, sdx = tuple(o.strides), o.nbytes_span
    if outs[1] is None:
        gspec = _call.output_spec(gg.shape, dt, device)
        sdg = gspec.nbytes_span
    else:
        gspec = None
        sdg = _packed_out(func, "out[1] (dgrid)", outs[1], gg.shape, dt, device).nbytes_span
    hd = _call.handle_for(device, stream, func)
    in_spans = (gi.nbytes_span, gg.nbytes_span, gdy.nbytes_span)
    if n == 0:
        return _call.Call(func, hd, (ispec, gspec), (*in_spans, sdx, sdg), noop=True)
    xd = _staging.tensor_desc(func, "img", gi)
    dxd = _staging.tensor_descriptor(gi.shape, dxstrides, dt)
    dyd = _staging.tensor_desc(func, "dy", gdy)
    st = SpatialTransformerDescriptor((n, c, h, w), dt)
    sa, sb = _call.scales(dt, a, b)
    spans = (*in_spans, sdx, sdg)
    stage = _make_stage(dt, stage)
    return _SamplerBackward(func, hd, (ispec, gspec), spans, stage, st, (xd, dxd, dyd), sa, sb)


# ==================================================================================================
# The whole transformer
# ==================================================================================================
def _check_whole(func, img, theta, scale_width, scale_height):
    gi, gt = _operand.operand(img), _operand.operand(theta)
    _checks.same_dtype_and_device(func, (("img", gi), ("theta", gt)), _TYPES)
    _image(func, "img", gi)
    _shape_of(func, "theta", gt, (gi.shape[0], 2, 3), f"({gi.shape[0]}, 2, 3) (N of img)")
    return gi, output_shape(gi.shape, scale_width, scale_height)


def dnn_spatialtf(
    img: DeviceArrayLike,
    theta: DeviceArrayLike,
    scale_width: float = 1,
    scale_height: float = 1,
    *,
    out: Out | None = None,
    stream: StreamLike = None,
) -> Out:
    """Spatial transformer (Theano's ``dnn_spatialtf``): the affine grid of *theta* over an
    output of ``ceil(H * scale_height) x ceil(W * scale_width)``, then bilinear sampling of
    *img* (PyTorch: ``F.grid_sample(img, F.affine_grid(theta, size, align_corners=True),
    align_corners=True)``).

    Parameters
    ----------
    img : device array
        ``(N, C, H, W)``, any strides; float16, float32 or float64.
    theta : device array
        ``(N, 2, 3)``, *img*'s dtype.
    scale_width, scale_height : float
        Output size factors (> 0); 1 keeps the input's size.
    out : device array, optional
        The result, any strides.
    stream : optional
        CUDA stream; default the operands' framework's current stream (torch, CuPy), else the
        handle's stream.

    Returns
    -------
    DeviceArray or the type of *out*
        ``(N, C, ceil(H * scale_height), ceil(W * scale_width))``.

    Raises
    ------
    TypeError, ValueError
        As for :func:`dnn_spatialtf_grid` and :func:`dnn_spatialtf_sampler`; non-positive
        scales.

    Examples
    --------
    >>> theta = torch.tensor([[[0.5, 0, 0], [0, 0.5, 0]]], device="cuda").expand(n, 2, 3)
    >>> y = pycudnn.dnn_spatialtf(img, theta.contiguous(), 2, 2)   # zoom in, double size
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(img)
    func = "dnn_spatialtf"
    gi, oshape = _check_whole(func, img, theta, scale_width, scale_height)
    if out is not None:
        _checks.out_operand(func, out, oshape, gi.dtype, gi.device)
    grid = dnn_spatialtf_grid(theta, oshape, stream=stream)
    return dnn_spatialtf_sampler(img, grid, out=out, stream=stream)


def dnn_spatialtf_grad(
    img: DeviceArrayLike,
    theta: DeviceArrayLike,
    dy: DeviceArrayLike,
    scale_width: float = 1,
    scale_height: float = 1,
    *,
    stream: StreamLike = None,
) -> tuple[DeviceArray, DeviceArray]:
    """Gradients of :func:`dnn_spatialtf` w.r.t. *img* and *theta*: the grid is generated
    again, then :func:`dnn_spatialtf_sampler_grad` and :func:`dnn_spatialtf_grid_grad`.

    Parameters
    ----------
    img, theta, scale_width, scale_height
        As in the forward call.
    dy : device array
        Gradient w.r.t. the output, of the forward output's shape.
    stream : optional
        CUDA stream; default the operands' framework's current stream (torch, CuPy), else the
        handle's stream.

    Returns
    -------
    (dimg, dtheta)

    Raises
    ------
    TypeError, ValueError
        As for :func:`dnn_spatialtf`; *dy* of another shape.

    Examples
    --------
    >>> dimg, dtheta = pycudnn.dnn_spatialtf_grad(img, theta, dy)
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(img)
    func = "dnn_spatialtf_grad"
    gi, oshape = _check_whole(func, img, theta, scale_width, scale_height)
    gdy = _operand.operand(dy)
    _checks.same_dtype_and_device(func, (("img", gi), ("dy", gdy)), _TYPES)
    _shape_of(func, "dy", gdy, oshape, f"{oshape} (the forward output's shape)")
    grid = dnn_spatialtf_grid(theta, oshape, stream=stream)
    dimg, dgrid = dnn_spatialtf_sampler_grad(img, grid, dy, stream=stream)
    return dimg, dnn_spatialtf_grid_grad(dgrid, stream=stream)
