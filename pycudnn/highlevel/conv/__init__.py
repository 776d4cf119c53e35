"""Convolutions: Theano's ``dnn_conv`` family, eager, on cuDNN's graph API.

``dnn_conv``/``dnn_conv3d`` (forward), ``dnn_gradinput``/``dnn_gradinput3d`` (gradient w.r.t. the
image, cuDNN's backward-data) and ``dnn_gradweight``/``dnn_gradweight3d`` (gradient w.r.t. the
filters, backward-filter) take any device array -- torch tensors, CuPy/JAX arrays, pycudnn
``DeviceArray`` -- in NCHW or NHWC (inferred from the strides) and return a ``DeviceArray``, or
write into ``out=`` and return it.

``cache_info()`` exposes hit/miss counters; ``clear_caches()`` empties all of it;
``set_cache_size()`` bounds it; :func:`last_call` describes the thread's latest call (for
benchmarks and diagnostics).

Internals
---------
The package is built around one frozen request, in one direction:

* this module: the public functions; each passes its options as one plain tuple to
* :mod:`._key`: the call key and the per-thread call cache (the hot path: a hit runs the cached
  entry with no validation); a miss builds a :class:`._request.ConvRequest` for
* :mod:`._prepare`: validation once, before any C call, into a :class:`._request.Prepared`; the
  plan key (:class:`._problem.Problem`) and the plan from the engine's one entry
  (:func:`pycudnn.graph._plans.plan`); the call entry (:mod:`._calls`, or :mod:`._epilogue`
  for ``bias=``/``activation=``/``z=``), run once and cached.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ... import memory as memory  # tests patch pycudnn.highlevel.conv.memory
from ...graph import _plans
from .. import _checks, _operand
from . import _key, _prepare
from ._calls import CallInfo, last_call, recent_calls
from ._problem import OP_BWD_DATA, OP_BWD_FILTER, OP_FWD

if TYPE_CHECKING:
    from ...typing import DeviceArrayLike, StreamLike
    from .._annotations import (
        BorderMode,
        ConvAlgo,
        ConvMode,
        DirectionHint,
        Epilogue,
        Out,
        Precision,
    )

__all__ = [
    "CallInfo",
    "cache_info",
    "clear_caches",
    "dnn_conv",
    "dnn_conv3d",
    "dnn_gradinput",
    "dnn_gradinput3d",
    "dnn_gradweight",
    "dnn_gradweight3d",
    "get_conv_output_shape",
    "last_call",
    "recent_calls",
    "set_cache_size",
]

#: the shared op path's, kept here for the callers that register their array type through conv
register_operand_type = _operand.register_operand_type


def get_conv_output_shape(
    image_shape: Sequence[int],
    kernel_shape: Sequence[int],
    border_mode: Any = "valid",
    subsample: Sequence[int] | int = 1,
    dilation: Sequence[int] | int = 1,
) -> tuple[int, ...]:
    """Output shape of a forward convolution, Theano's ``get_conv_output_shape``.

    Parameters
    ----------
    image_shape : sequence of int
        ``(N, C, spatial...)``.
    kernel_shape : sequence of int
        ``(K, C / groups, kernel spatial...)``.
    border_mode, subsample, dilation
        As for :func:`dnn_conv`.

    Returns
    -------
    tuple of int
        ``(N, K, out spatial...)`` with ``out = (in + 2 * pad - ((k - 1) * d + 1)) // s + 1``;
        a spatial size may come out <= 0 (``dnn_conv`` rejects that).
    """
    func = "get_conv_output_shape"
    for name, shape in (("image_shape", image_shape), ("kernel_shape", kernel_shape)):
        if isinstance(shape, str | bytes) or not isinstance(shape, Sequence):
            raise TypeError(
                f"{func}: {name} must be a sequence of ints (N|K, C, spatial...), got {shape!r}"
            )
    nd = len(image_shape) - 2
    if nd < 1 or len(kernel_shape) != nd + 2:
        raise ValueError(
            f"{func}: image shape {tuple(image_shape)} and kernel shape {tuple(kernel_shape)} "
            "do not match (the same rank, at least 3)"
        )
    image_shape = _checks.ints(image_shape, nd + 2, "image_shape", 1, func)
    kernel_shape = _checks.ints(kernel_shape, nd + 2, "kernel_shape", 1, func)
    sub = _checks.ints(subsample, nd, "subsample", 1, func)
    dil = _checks.ints(dilation, nd, "dilation", 1, func)
    pads = _prepare.pads(border_mode, kernel_shape[2:], dil, func)
    spatial = _prepare.out_spatial(image_shape, kernel_shape, pads, sub, dil)
    return (int(image_shape[0]), int(kernel_shape[0]), *spatial)


def dnn_conv(
    img: DeviceArrayLike,
    kerns: DeviceArrayLike,
    border_mode: BorderMode = "valid",
    subsample: tuple[int, ...] = _key.ONES2,
    dilation: tuple[int, ...] = _key.ONES2,
    conv_mode: ConvMode = "conv",
    direction_hint: DirectionHint | None = None,
    algo: ConvAlgo | None = None,
    precision: Precision | None = None,
    num_groups: int = 1,
    *,
    bias: DeviceArrayLike | None = None,
    activation: Epilogue | None = None,
    z: DeviceArrayLike | None = None,
    z_alpha: float = 1.0,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Out | None = None,
    stream: StreamLike = None,
) -> Out:
    """2-D convolution of *img* with *kerns*, Theano's ``dnn_conv`` on cuDNN's graph API, with an
    optional fused epilogue ``act(alpha * conv + z_alpha * z + bias)``.

    Parameters
    ----------
    img : device array
        ``(N, C, H, W)`` images, NCHW or NHWC (channels-last strides), float16, bfloat16,
        float32 or float64 (torch tensor, CuPy/JAX array, ``DeviceArray``, ...).
    kerns : device array
        ``(K, C / num_groups, kH, kW)`` filters, same dtype and device.
    border_mode : {'valid', 'full', 'half'} or int or tuple of int
        ``'valid'`` no padding, ``'full'`` pad ``dilated_k - 1``, ``'half'`` pad
        ``dilated_k // 2``, or explicit symmetric padding.
    subsample : tuple of int
        Stride per spatial dim (an int applies to all).
    dilation : tuple of int
        Filter dilation per spatial dim.
    conv_mode : {'conv', 'cross'}
        ``'conv'`` flips the kernel (true convolution, Theano's default); ``'cross'`` does not
        (cross-correlation, PyTorch's ``conv2d``).
    direction_hint : {None, 'forward', 'forward!', 'bprop weights', 'bprop inputs'}
        As in Theano: with ``'bprop weights'`` (valid, unit stride/dilation, ``'cross'``, one
        group) the result is computed as a backward-filter convolution; ``'full'`` border mode
        with unit stride/dilation and one group is computed as a backward-data convolution
        unless the hint is ``'forward!'``. Same result either way; routes fall back to the
        forward operation when cuDNN has no engine for them.
    algo : str, optional
        ``'guess_once'``/``'guess_on_shape_change'`` (heuristics; the first engine config that
        builds), ``'time_once'``/``'time_on_shape_change'`` (time the candidate engines on these
        buffers, keep the fastest), ``'deterministic'`` (heuristics among deterministic engines),
        or a legacy algorithm (``'none'``, ``'small'``, ``'large'``, ``'fft'``, ``'fft_tiling'``,
        ``'winograd'``, ``'winograd_non_fused'``) run through cuDNN's legacy API. Default
        ``pycudnn.config.algo_fwd``. Each choice is cached per problem (shape, dtype, ...): in
        eager use ``*_once`` and ``*_on_shape_change`` behave the same.
    precision : {'as_input_f32', 'as_input', 'float16', 'float32', 'float64'}, optional
        Compute type; default ``pycudnn.config.precision``. float32 data computes with FMA
        (no TF32) unless ``pycudnn.config.allow_tf32``.
    num_groups : int
        Grouped convolution (``C`` and ``K`` divisible by it; ``num_groups == C`` is depthwise).
    bias : device array, optional
        ``(K,)`` or ``(1, K, 1, 1)``, contiguous, the dtype of *img*: added per output channel.
    activation : str or (str, float), optional
        Applied last: ``'relu'``, ``'gelu'`` (erf), ``'gelu_tanh'`` (tanh approximation),
        ``'silu'``/``'swish'``, ``'sigmoid'``, ``'tanh'``, ``'elu'`` (or ``('elu', alpha)``) and
        ``('clipped_relu', upper)``.
    z : device array, optional
        A residual of the output's shape and dtype, added as ``z_alpha * z`` before the bias's
        activation (ResNet's ``relu(conv + bias + shortcut)``); it may not overlap *out*.
    z_alpha : float
        The scale of *z*.
    alpha, beta : float
        ``out = alpha * conv + beta * out`` (*beta* != 0 accumulates into *out*). With an
        epilogue *beta* must be 0 (pass *out* as *z* to add it).
    out : device array, optional
        Output ``(N, K, oH, oW)``; must not overlap the inputs.
    stream : optional
        CUDA stream (int, ``cuda.core`` / torch / CuPy stream); default the operands'
        framework's current stream (torch's on torch tensors, CuPy's on CuPy arrays), else the
        handle's stream (``pycudnn.get_handle().stream``, the legacy default stream unless
        changed).

    Returns
    -------
    DeviceArray or the type of *out*
        A new ``DeviceArray`` in the layout of the inputs (NHWC if an input is channels-last),
        or *out*.

    Raises
    ------
    TypeError
        Host arrays (copy with ``pycudnn.to_device``), unsupported or mixed dtypes.
    ValueError
        Rank, channel or group mismatches, negative pads, non-positive strides or dilations, an
        empty output, misaligned pointers, operands on different devices, overlapping outputs.
    OverflowError
        A dimension, stride or span beyond cuDNN's 32-bit limit.
    pycudnn.errors.NotSupportedError
        No engine can run it; the message lists every engine tried and why. A GELU epilogue
        that no fused engine runs (GELU has no separate-steps form).

    Notes
    -----
    An epilogue is built as one graph -- convolution, then pointwise additions and the
    activation on float32 intermediates -- and runs as one fused kernel where cuDNN's runtime
    fusion has an engine for it (packed NHWC float16/bfloat16 on sm80+ GPUs), rounding to the
    output type once. Elsewhere (NCHW, float32/float64, staged strides, a legacy ``algo``) it
    runs as the convolution followed by ``cudnnAddTensor`` and ``cudnnActivationForward`` on
    the output, with the same result up to rounding. ``last_call().fused`` and
    ``last_call().plan.describe()`` say which ran. ``direction_hint`` routes apply only to the
    separate-steps form.

    Examples
    --------
    >>> x = torch.randn(8, 3, 32, 32, device="cuda")
    >>> w = torch.randn(16, 3, 3, 3, device="cuda")
    >>> y = torch.from_dlpack(pycudnn.dnn_conv(x, w, border_mode="half", conv_mode="cross"))
    >>> b = torch.randn(16, device="cuda")
    >>> y = pycudnn.dnn_conv(x, w, border_mode="half", conv_mode="cross", bias=b,
    ...                      activation="relu")
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(img)
    opts = (
        border_mode,
        subsample,
        dilation,
        conv_mode,
        direction_hint,
        algo,
        precision,
        num_groups,
        alpha,
        beta,
    )
    if bias is not None or activation is not None or z is not None or z_alpha != 1.0:
        return _fused(2, img, kerns, opts, (bias, activation, z, z_alpha), out, stream)
    return _key.conv(OP_FWD, 2, img, kerns, None, opts, out, stream)


def dnn_conv3d(
    img: DeviceArrayLike,
    kerns: DeviceArrayLike,
    border_mode: BorderMode = "valid",
    subsample: tuple[int, ...] = _key.ONES3,
    dilation: tuple[int, ...] = _key.ONES3,
    conv_mode: ConvMode = "conv",
    direction_hint: DirectionHint | None = None,
    algo: ConvAlgo | None = None,
    precision: Precision | None = None,
    num_groups: int = 1,
    *,
    bias: DeviceArrayLike | None = None,
    activation: Epilogue | None = None,
    z: DeviceArrayLike | None = None,
    z_alpha: float = 1.0,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Out | None = None,
    stream: StreamLike = None,
) -> Out:
    """3-D convolution: :func:`dnn_conv` for ``(N, C, D, H, W)`` images (NCDHW or NDHWC) and
    ``(K, C / num_groups, kD, kH, kW)`` filters, with the same optional epilogue (*bias* of
    shape ``(K,)`` or ``(1, K, 1, 1, 1)``). Same parameters, returns and errors."""
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(img)
    opts = (
        border_mode,
        subsample,
        dilation,
        conv_mode,
        direction_hint,
        algo,
        precision,
        num_groups,
        alpha,
        beta,
    )
    if bias is not None or activation is not None or z is not None or z_alpha != 1.0:
        return _fused(3, img, kerns, opts, (bias, activation, z, z_alpha), out, stream)
    return _key.conv(OP_FWD, 3, img, kerns, None, opts, out, stream)


def _fused(
    nd: int, img: Any, kerns: Any, opts: tuple, epilogue: tuple, out: Any, stream: Any
) -> Any:
    """The forward convolution with an *epilogue* ``(bias, activation, z, z_alpha)``; a
    *z_alpha* other than 1 with no epilogue to scale is refused."""
    bias, activation, z, z_alpha = epilogue
    if bias is None and activation is None and z is None:
        func = "dnn_conv" if nd == 2 else "dnn_conv3d"
        raise ValueError(f"{func}: z_alpha={z_alpha!r} is given without z (the residual it scales)")
    return _key.fused(nd, img, kerns, opts, epilogue, out, stream)


def dnn_gradinput(
    kerns: DeviceArrayLike,
    topgrad: DeviceArrayLike,
    img_shp: Sequence[int] | None,
    border_mode: BorderMode = "valid",
    subsample: tuple[int, ...] = _key.ONES2,
    dilation: tuple[int, ...] = _key.ONES2,
    conv_mode: ConvMode = "conv",
    precision: Precision | None = None,
    algo: ConvAlgo | None = None,
    num_groups: int = 1,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Out | None = None,
    stream: StreamLike = None,
) -> Out:
    """Gradient of :func:`dnn_conv` w.r.t. its image (cuDNN backward-data).

    Parameters
    ----------
    kerns : device array
        The filters ``(K, C / num_groups, kH, kW)``.
    topgrad : device array
        Gradient w.r.t. the convolution output, ``(N, K, oH, oW)``.
    img_shp : sequence of int
        Shape of the image ``(N, C, H, W)`` (needed: with strides several image sizes give the
        same output size). May be None when *out* is given.
    border_mode, subsample, dilation, conv_mode, precision, num_groups, alpha, beta, out, stream
        As for :func:`dnn_conv`; *precision* and *algo* default to ``pycudnn.config.precision``
        and ``pycudnn.config.algo_bwd_data``.
    algo : str, optional
        ``'guess_*'``, ``'time_*'``, ``'deterministic'`` or a legacy backward-data algorithm
        (``'none'``, ``'fft'``, ``'fft_tiling'``, ``'winograd'``, ``'winograd_non_fused'``).

    Returns
    -------
    DeviceArray or the type of *out*
        The image gradient ``(N, C, H, W)``.

    Raises
    ------
    TypeError, ValueError, OverflowError, pycudnn.errors.NotSupportedError
        As for :func:`dnn_conv`; also when *img_shp* is inconsistent with *kerns*/*topgrad*.
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(kerns)
    opts = (
        border_mode,
        subsample,
        dilation,
        conv_mode,
        None,
        algo,
        precision,
        num_groups,
        alpha,
        beta,
    )
    return _key.conv(OP_BWD_DATA, 2, kerns, topgrad, img_shp, opts, out, stream)


def dnn_gradinput3d(
    kerns: DeviceArrayLike,
    topgrad: DeviceArrayLike,
    img_shp: Sequence[int] | None,
    border_mode: BorderMode = "valid",
    subsample: tuple[int, ...] = _key.ONES3,
    dilation: tuple[int, ...] = _key.ONES3,
    conv_mode: ConvMode = "conv",
    precision: Precision | None = None,
    algo: ConvAlgo | None = None,
    num_groups: int = 1,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Out | None = None,
    stream: StreamLike = None,
) -> Out:
    """3-D :func:`dnn_gradinput`: image gradient ``(N, C, D, H, W)``."""
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(kerns)
    opts = (
        border_mode,
        subsample,
        dilation,
        conv_mode,
        None,
        algo,
        precision,
        num_groups,
        alpha,
        beta,
    )
    return _key.conv(OP_BWD_DATA, 3, kerns, topgrad, img_shp, opts, out, stream)


def dnn_gradweight(
    img: DeviceArrayLike,
    topgrad: DeviceArrayLike,
    kerns_shp: Sequence[int] | None,
    border_mode: BorderMode = "valid",
    subsample: tuple[int, ...] = _key.ONES2,
    dilation: tuple[int, ...] = _key.ONES2,
    conv_mode: ConvMode = "conv",
    precision: Precision | None = None,
    algo: ConvAlgo | None = None,
    num_groups: int = 1,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Out | None = None,
    stream: StreamLike = None,
) -> Out:
    """Gradient of :func:`dnn_conv` w.r.t. its filters (cuDNN backward-filter).

    Parameters
    ----------
    img : device array
        The images ``(N, C, H, W)``.
    topgrad : device array
        Gradient w.r.t. the convolution output, ``(N, K, oH, oW)``.
    kerns_shp : sequence of int
        Shape of the filters ``(K, C / num_groups, kH, kW)``; may be None when *out* is given.
    border_mode, subsample, dilation, conv_mode, precision, num_groups, alpha, beta, out, stream
        As for :func:`dnn_conv`; *algo* defaults to ``pycudnn.config.algo_bwd_filter``.
    algo : str, optional
        ``'guess_*'``, ``'time_*'``, ``'deterministic'`` or a legacy backward-filter algorithm
        (``'none'``, ``'small'``, ``'fft'``, ``'fft_tiling'``, ``'winograd_non_fused'``).

    Returns
    -------
    DeviceArray or the type of *out*
        The filter gradient ``(K, C / num_groups, kH, kW)``.

    Raises
    ------
    TypeError, ValueError, OverflowError, pycudnn.errors.NotSupportedError
        As for :func:`dnn_conv`; also when *kerns_shp* is inconsistent with *img*/*topgrad*.
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(img)
    opts = (
        border_mode,
        subsample,
        dilation,
        conv_mode,
        None,
        algo,
        precision,
        num_groups,
        alpha,
        beta,
    )
    return _key.conv(OP_BWD_FILTER, 2, img, topgrad, kerns_shp, opts, out, stream)


def dnn_gradweight3d(
    img: DeviceArrayLike,
    topgrad: DeviceArrayLike,
    kerns_shp: Sequence[int] | None,
    border_mode: BorderMode = "valid",
    subsample: tuple[int, ...] = _key.ONES3,
    dilation: tuple[int, ...] = _key.ONES3,
    conv_mode: ConvMode = "conv",
    precision: Precision | None = None,
    algo: ConvAlgo | None = None,
    num_groups: int = 1,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Out | None = None,
    stream: StreamLike = None,
) -> Out:
    """3-D :func:`dnn_gradweight`: filter gradient ``(K, C / num_groups, kD, kH, kW)``."""
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(img)
    opts = (
        border_mode,
        subsample,
        dilation,
        conv_mode,
        None,
        algo,
        precision,
        num_groups,
        alpha,
        beta,
    )
    return _key.conv(OP_BWD_FILTER, 3, img, topgrad, kerns_shp, opts, out, stream)


# ==================================================================================================
# Cache control
# ==================================================================================================
def cache_info() -> _plans.CacheInfo:
    """Plan-cache counters: ``hits`` (calls served by a cached plan), ``misses`` (calls that
    searched), ``builds`` (plans built), ``currsize``/``maxsize`` (this thread's plan LRU) and
    ``search_seconds`` (time spent building plans)."""
    return _plans.cache_info()


def clear_caches() -> None:
    """Forget every cached convolution plan, variant pack and call entry (all threads)."""
    _plans.clear_caches()


def set_cache_size(maxsize: int) -> None:
    """Bound the per-thread plan and call caches to *maxsize* entries each (0: unbounded).

    The default is 1024, or ``PYCUDNN_PLAN_CACHE_SIZE`` from the environment.
    """
    _plans.set_cache_size(maxsize)
