"""Batch normalization: Theano's ``dnn_batch_normalization_train`` / ``_test`` and the gradient
(``GpuDnnBatchNormGrad``) as eager functions on cuDNN's legacy batch-norm calls.

* ``dnn_batch_normalization_train`` -- ``cudnnBatchNormalizationForwardTraining``: the batch
  statistics, the normalized output, and optionally the updated running averages.
* ``dnn_batch_normalization_test`` -- ``cudnnBatchNormalizationForwardInference``: normalization
  with given statistics.
* ``dnn_batch_normalization_grad`` -- ``cudnnBatchNormalizationBackward``: ``(dx, dscale, dbias)``
  from the statistics the training call returned.

Formulas (Theano's, which are cuDNN's; ``axes`` are ``(0,)`` for ``'per-activation'`` and all
but the channel axis for ``'spatial'``; ``m`` is the number of elements averaged over)::

    mean   = x.mean(axes)
    var    = x.var(axes)                        # biased (divides by m)
    invstd = 1 / sqrt(var + epsilon)
    out    = (x - mean) * gamma * invstd + beta
    new_running_mean = running_mean * (1 - factor) + mean * factor
    new_running_var  = running_var  * (1 - factor) + var * m / (m - 1) * factor

cuDNN's ``resultSaveInvVariance`` is this ``invstd`` (not ``1/var``), and its backward uses the
``savedMean``/``savedInvVariance`` it is given (checked on cuDNN 9.19), so the gradient is the one
of the formula above at the given ``x_mean``/``x_invstd``.

Multiple outputs: the statistics are outputs of the one call protocol (:class:`._call.Call`),
allocated like any output, before the normalized data (the last output, which a staged call
copies out); a repeated call is one cache lookup and one C call (plus the running-average copies
when they are not updated in place).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

from .. import _layout
from .._config import parse_bool
from ..descriptors import BN_MIN_EPSILON
from ..enums import BatchNormMode, DataType
from . import _bn_checks as bc
from . import _call, _checks, _operand, _staging
from ._bn_calls import BackwardCall, InferenceCall, TrainCall, ex_workspace, use_ex

if TYPE_CHECKING:
    from ..memory import DeviceArray
    from ..typing import DeviceArrayLike, StreamLike
    from ._annotations import Given, Given2, Out, Out2, Out3

__all__ = [
    "BN_MIN_EPSILON",
    "dnn_batch_normalization_grad",
    "dnn_batch_normalization_test",
    "dnn_batch_normalization_train",
]

# data types whose channels-last batch-norm training/backward cuDNN runs slowly (see _plan)
_SLOW_NHWC = (DataType.HALF, DataType.BFLOAT16)
_TRAIN, _TEST, _GRAD = "bn_train", "bn_test", "bn_grad"


# ==================================================================================================
# Validation
# ==================================================================================================
class _Stages:
    """The staging of a call whose operands have two dtypes (data and parameters): each
    :class:`._staging.Stage` copies its own operands; only the data's may stage the output."""

    __slots__ = ("stages",)

    def __init__(self, *stages: _staging.Stage | None):
        self.stages = tuple(s for s in stages if s is not None)

    def before(self, h: Any, ptrs: list[int], keep: list) -> int | None:
        real = None
        for s in self.stages:
            r = s.before(h, ptrs, keep)
            real = r if r is not None else real
        return real

    def after(self, h: Any, ptrs: list[int], real_out: int | None) -> None:
        for s in self.stages:
            if s.output is not None:
                s.after(h, ptrs, real_out)


def _plan(
    p: bc.Problem,
    data: Sequence[_operand.Operand],
    o: _operand.Operand | None,
    params: Sequence[_operand.Operand],
    first_param: int,
    inference: bool = False,
    ex: bool = False,
):
    """Descriptors and staging: the data operands (and the output, last) packed in the layout
    cuDNN computes in, the parameters packed ``(1, C, ...)``; the output's allocation spec when
    new (in the inputs' layout).

    cuDNN's legacy batch-norm training and backward run channels-last float16/bfloat16 data at
    a few percent of the memory bandwidth (measured on an H100, cuDNN 9.19: 28 GB/s, 29-50x
    torch's time; 1.7-2.9x through NCHW copies), so such data is computed in NCHW through packed
    copies; a new output still comes back channels-last, like the input. Inference is not slow
    channels-last (1.6x torch; 3.2x through copies): it runs as given. With *ex* the data is
    planned channels-last for the ``...Ex`` calls' NHWC kernels (:mod:`._bn_calls`).
    """
    compute_nhwc = p.nhwc and (inference or ex or p.dt not in _SLOW_NHWC)
    spec = None if o is not None else _call.output_spec(p.shape, p.dt, p.x.device, p.nhwc)
    target = o
    if o is None and compute_nhwc != p.nhwc:
        # the new output is written through a staged copy: plan it like a given out=
        target = _operand.Operand(
            0, *_staging.padded(spec.shape, spec.element_strides, 4), p.dt, p.x.device
        )
    dplan = _staging.packed_operands(p.dt, data, target, p.x.shape, compute_nhwc)
    pplan = _staging.packed_operands(p.pdt, params, None, None, False, first=first_param)
    stage = None
    if dplan.stage is not None or pplan.stage is not None:
        stage = _Stages(dplan.stage, pplan.stage)
    return dplan.descs, pplan.descs[0], stage, spec


def _planned(p: bc.Problem, h: Any, data: Sequence, o: Any, params: Sequence, first: int) -> tuple:
    """:func:`_plan` of a training or backward call, on the channels-last ``...Ex`` calls where
    they apply (spatial float16/bfloat16 NHWC data, no reserve space needed); also returns their
    workspace bytes (None: the plain call)."""
    if p.nhwc and p.dt in _SLOW_NHWC and p.mode == BatchNormMode.SPATIAL:
        xd, pd, stage, spec = _plan(p, data, o, params, first, ex=True)
        ws = ex_workspace(h, xd, pd, first == 2)
        if ws is not None:
            return xd, pd, stage, spec, ws
    return (*_plan(p, data, o, params, first), None)


# ==================================================================================================
# dnn_batch_normalization_train
# ==================================================================================================
# the running averages decide the tuple's length; inplace_running=True returns them as given
@overload
def dnn_batch_normalization_train(
    inputs: DeviceArrayLike,
    gamma: DeviceArrayLike,
    beta: DeviceArrayLike,
    mode: Literal["per-activation", "spatial"] = ...,
    epsilon: float = ...,
    running_average_factor: float = ...,
    running_mean: None = ...,
    running_var: None = ...,
    *,
    inplace_running: bool = ...,
    out: Out | None = ...,
    out_mean: Out2 | None = ...,
    out_invstd: Out3 | None = ...,
    stream: StreamLike = ...,
) -> tuple[Out, Out2, Out3]: ...
@overload
def dnn_batch_normalization_train(
    inputs: DeviceArrayLike,
    gamma: DeviceArrayLike,
    beta: DeviceArrayLike,
    mode: Literal["per-activation", "spatial"] = ...,
    epsilon: float = ...,
    running_average_factor: float = ...,
    running_mean: DeviceArrayLike = ...,
    running_var: DeviceArrayLike = ...,
    *,
    inplace_running: Literal[False] = ...,
    out: Out | None = ...,
    out_mean: Out2 | None = ...,
    out_invstd: Out3 | None = ...,
    stream: StreamLike = ...,
) -> tuple[Out, Out2, Out3, DeviceArray, DeviceArray]: ...
@overload
def dnn_batch_normalization_train(
    inputs: DeviceArrayLike,
    gamma: DeviceArrayLike,
    beta: DeviceArrayLike,
    mode: Literal["per-activation", "spatial"] = ...,
    epsilon: float = ...,
    running_average_factor: float = ...,
    running_mean: Given = ...,
    running_var: Given2 = ...,
    *,
    inplace_running: Literal[True],
    out: Out | None = ...,
    out_mean: Out2 | None = ...,
    out_invstd: Out3 | None = ...,
    stream: StreamLike = ...,
) -> tuple[Out, Out2, Out3, Given, Given2]: ...
def dnn_batch_normalization_train(
    inputs: DeviceArrayLike,
    gamma: DeviceArrayLike,
    beta: DeviceArrayLike,
    mode: Literal["per-activation", "spatial"] = "per-activation",
    epsilon: float = 1e-4,
    running_average_factor: float = 0.1,
    running_mean: DeviceArrayLike | None = None,
    running_var: DeviceArrayLike | None = None,
    *,
    inplace_running: bool = False,
    out: Out | None = None,
    out_mean: DeviceArrayLike | None = None,
    out_invstd: DeviceArrayLike | None = None,
    stream: StreamLike = None,
) -> tuple[Any, ...]:
    """Batch normalization with the batch's own statistics
    (``cudnnBatchNormalizationForwardTraining``).

    Parameters
    ----------
    inputs : device array
        ``(N, C, H, W)`` or ``(N, C, D, H, W)`` (also ``(N, C)`` and ``(N, C, L)``, padded with
        size-1 dims as Theano did); NCHW or channels last (other strides are staged through
        packed copies); float16, bfloat16, float32 or float64.
    gamma, beta : device array
        Scale and bias: ``(1, C, H, W)`` (or ``(C, H, W)``) for ``'per-activation'``,
        ``(1, C, 1, 1)`` (or ``(C,)``) for ``'spatial'`` -- Theano's shape (the inputs' rank with
        1 on the normalized axes) or the squeezed one. float32 for float16/bfloat16/float32
        inputs, float64 for float64 inputs (cuDNN's rule).
    mode : {'per-activation', 'spatial'}
        Normalize each activation over the batch (axis 0), or each channel over the batch and
        all spatial axes.
    epsilon : float
        Added to the variance; >= ``CUDNN_BN_MIN_EPSILON`` (:data:`BN_MIN_EPSILON`, 0.0 in cuDNN
        9) and finite.
    running_average_factor : float
        In ``[0, 1]``: the weight of this batch in the running averages.
    running_mean, running_var : device array, optional
        Both or neither; shaped and typed like *gamma*. When given, the updated running averages
        are returned too (running variance from the unbiased batch variance, ``m / (m - 1)``).
    inplace_running : bool
        Update *running_mean*/*running_var* in place (they must then be contiguous and are
        returned as given); by default they are left untouched and new arrays are returned.
    out : device array, optional
        The normalized output (shape and dtype of *inputs*); may not overlap any input.
    out_mean, out_invstd : device array, optional
        Where to write ``mean`` and ``invstd`` (contiguous, shaped and typed like *gamma*;
        new arrays when not given).
    stream : optional
        CUDA stream; default the operands' framework's current stream (torch, CuPy), else the
        handle's stream.

    Returns
    -------
    tuple
        ``(out, mean, invstd)``, or ``(out, mean, invstd, new_running_mean, new_running_var)``
        with running averages. ``mean`` and ``invstd = 1 / sqrt(var + epsilon)`` are new arrays
        shaped like *gamma*; *out* is new (in *inputs*' layout) unless given.

    Raises
    ------
    TypeError
        Host arrays, an unsupported dtype, parameters of the wrong dtype for the data.
    ValueError
        An unknown mode; inputs of rank other than 2 to 5 or empty; a parameter of the wrong
        shape; only one of the running averages; a running average over a single element
        (``m = 1``: no unbiased variance); epsilon below ``CUDNN_BN_MIN_EPSILON`` or not finite;
        a factor outside ``[0, 1]``; an *out* of the wrong shape or overlapping an input; operands
        on different devices.

    Examples
    --------
    >>> y, mean, invstd = pycudnn.dnn_batch_normalization_train(x, gamma, beta, "spatial")
    >>> y, mean, invstd, rm, rv = pycudnn.dnn_batch_normalization_train(
    ...     x, gamma, beta, "spatial", 1e-5, 0.1, running_mean, running_var, inplace_running=True)
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(inputs)
    px, kx = _operand.key_of(inputs)
    pg, kg = _operand.key_of(gamma)
    pb, kb = _operand.key_of(beta)
    pm, km = bc.key(running_mean)
    pv, kv = bc.key(running_var)
    po, ko = bc.key(out)
    pom, kom = bc.key(out_mean)
    poi, koi = bc.key(out_invstd)
    inplace_running = parse_bool(
        inplace_running, "dnn_batch_normalization_train", "inplace_running"
    )
    eps, factor = epsilon, running_average_factor
    key = (_TRAIN, kx, kg, kb, km, kv, ko, kom, koi, mode, eps, factor, inplace_running)
    key += (eps.__class__, factor.__class__)  # True == 1.0, but only one is valid
    args = (
        inputs,
        gamma,
        beta,
        mode,
        epsilon,
        running_average_factor,
        (running_mean, running_var),
        inplace_running,
        (out_mean, out_invstd, out),
        stream,
    )
    # the statistics, then the output (see _BatchNorm); literal tuples: the cheapest to build
    if pm is None or pv is None:
        outs, out_ptrs = (out_mean, out_invstd, out), (pom, poi, po)
        res = _call.run_cached(key, _build_train, args, (px, pg, pb), outs, out_ptrs, stream)
        return res[2], res[0], res[1]
    ptrs = (px, pg, pb, pm, pv)
    if inplace_running:
        outs, out_ptrs = (out_mean, out_invstd, out), (pom, poi, po)
        res = _call.run_cached(key, _build_train, args, ptrs, outs, out_ptrs, stream)
        return res[2], res[0], res[1], running_mean, running_var
    # new copies of the running averages are outputs too
    outs, out_ptrs = (out_mean, out_invstd, None, None, out), (pom, poi, None, None, po)
    res = _call.run_cached(key, _build_train, args, ptrs, outs, out_ptrs, stream)
    return res[4], res[0], res[1], res[2], res[3]


def _build_train(
    inputs, gamma, beta, mode, epsilon, factor, running, inplace_running, outs, stream
) -> TrainCall:
    func = "dnn_batch_normalization_train"
    running_mean, running_var = running
    out_mean, out_invstd, out = outs
    p = bc.problem(func, "inputs", inputs, mode, epsilon)
    f = _checks.real(factor, "running_average_factor", func, lo=0.0, hi=1.0)
    if not isinstance(inplace_running, bool):
        raise TypeError(f"{func}: inplace_running must be a bool, got {inplace_running!r}")
    if (running_mean is None) != (running_var is None):
        given = "running_mean" if running_var is None else "running_var"
        raise ValueError(
            f"{func}: only {given} was given; running_mean and running_var go together (both or "
            "neither)"
        )
    named = [("gamma", gamma), ("beta", beta)]
    running = running_mean is not None
    if running:
        named += [("running_mean", running_mean), ("running_var", running_var)]
    params = bc.params(p, named)
    o = bc.main_output(p, "out", out)
    bc.check_stat_outs(p, (("out_mean", out_mean), ("out_invstd", out_invstd)))
    bc.check_not_empty(p, "batch statistics")
    if running and p.m < 2:
        raise ValueError(
            f"{func}: each statistic averages m = {p.m} element of inputs {p.shape} "
            f"(mode={p.mode_name!r}); the running variance uses the unbiased variance "
            "m / (m - 1) * var, undefined for m = 1"
        )
    if running:
        rshape = params[2][1]
        if params[3][1] != rshape:
            raise ValueError(
                f"{func}: running_mean has shape {rshape} but running_var {params[3][1]}"
            )
        for (g, _), name in zip(params[2:], ("running_mean", "running_var"), strict=True):
            if inplace_running and not _layout.matches(g.shape, g.strides, bc.packed(g.shape)):
                raise ValueError(
                    f"{func}: inplace_running=True writes {name} in place, which needs a "
                    "contiguous array; pass a contiguous one or inplace_running=False"
                )
    h = _call.handle_for(p.x.device, stream, p.func)
    pops = [g for g, _ in params]
    given = list(pops)  # the operands as given (their spans)
    copy = None
    staged_params = pops[:2]
    stat_shapes = [params[0][1]] * 2
    if running:
        if inplace_running:
            staged_params = pops  # packed (checked above): never staged
        else:
            one, zero = _call.scales(p.pdt, 1.0, 0.0)
            dst = _staging.tensor_descriptor(p.pshape, bc.packed(p.pshape), p.pdt)
            src_m, src_v = (_staging.tensor_descriptor(g.shape, g.strides, p.pdt) for g in pops[2:])
            copy = (
                _call.quiet("cudnnTransformTensor"),
                ctypes.byref(one),
                ctypes.byref(zero),
                src_m,
                src_v,
                dst,
            )
            stat_shapes += [rshape] * 2
            # the copies are packed: the call sees them with the parameters' descriptor
            pops = [
                *pops[:2],
                *(
                    _operand.Operand(0, g.shape, bc.packed(g.shape), p.pdt, g.device)
                    for g in pops[2:]
                ),
            ]
            staged_params = pops
    stats = tuple(_call.output_spec(s, p.pdt, p.x.device) for s in stat_shapes)
    xd, pd, stage, spec, ws = _planned(p, h, (p.x,), o, staged_params, 1)
    spans = bc.spans(p.x, *given, *stats, spec if o is None else o)
    names = ("inputs", "gamma", "beta", "running_mean", "running_var")
    call = TrainCall(p, h, (*stats, spec), spans, stage, (xd, pd), f, copy, names)
    if ws is not None:
        use_ex(call, ws)
    return call


# ==================================================================================================
# dnn_batch_normalization_test
# ==================================================================================================
def dnn_batch_normalization_test(
    inputs: DeviceArrayLike,
    gamma: DeviceArrayLike,
    beta: DeviceArrayLike,
    mean: DeviceArrayLike,
    var: DeviceArrayLike,
    mode: Literal["per-activation", "spatial"] = "per-activation",
    epsilon: float = 1e-4,
    *,
    out: Out | None = None,
    stream: StreamLike = None,
) -> Out:
    """Batch normalization with given statistics (``cudnnBatchNormalizationForwardInference``):
    ``out = (inputs - mean) * gamma / sqrt(var + epsilon) + beta``.

    Parameters
    ----------
    inputs : device array
        As for :func:`dnn_batch_normalization_train`.
    gamma, beta, mean, var : device array
        Scale, bias and the statistics (usually the running averages), each shaped and typed as
        *gamma* in :func:`dnn_batch_normalization_train`.
    mode, epsilon
        As for :func:`dnn_batch_normalization_train`.
    out : device array, optional
        Shape and dtype of *inputs*; may not overlap any input.
    stream : optional
        CUDA stream; default the operands' framework's current stream (torch, CuPy), else the
        handle's stream.

    Returns
    -------
    DeviceArray or the type of *out*
        New arrays have *inputs*' layout.

    Raises
    ------
    TypeError, ValueError
        As for :func:`dnn_batch_normalization_train` (empty inputs are allowed here: the output
        is empty).

    Examples
    --------
    >>> y = pycudnn.dnn_batch_normalization_test(x, gamma, beta, running_mean, running_var,
    ...                                          "spatial", 1e-5)
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(inputs)
    px, kx = _operand.key_of(inputs)
    pg, kg = _operand.key_of(gamma)
    pb, kb = _operand.key_of(beta)
    pm, km = _operand.key_of(mean)
    pv, kv = _operand.key_of(var)
    po, ko = bc.key(out)
    key = (_TEST, kx, kg, kb, km, kv, ko, mode, epsilon, epsilon.__class__)
    args = (inputs, gamma, beta, mean, var, mode, epsilon, out, stream)
    ptrs = (px, pg, pb, pm, pv)
    return _call.run_cached(key, _build_inference, args, ptrs, (out,), (po,), stream)[0]


def _build_inference(inputs, gamma, beta, mean, var, mode, epsilon, out, stream) -> _call.Call:
    func = "dnn_batch_normalization_test"
    p = bc.problem(func, "inputs", inputs, mode, epsilon)
    named = (("gamma", gamma), ("beta", beta), ("mean", mean), ("var", var))
    pops = [g for g, _ in bc.params(p, named)]
    o = bc.main_output(p, "out", out)
    h = _call.handle_for(p.x.device, stream, p.func)
    if 0 in p.shape:
        spec = None if o is not None else _call.output_spec(p.shape, p.dt, p.x.device, p.nhwc)
        spans = bc.spans(p.x, *pops, spec if o is None else o)
        return _call.Call(func, h, (spec,), spans, noop=True)
    xd, pd, stage, spec = _plan(p, (p.x,), o, pops, 1, inference=True)
    spans = bc.spans(p.x, *pops, spec if o is None else o)
    name = "cudnnBatchNormalizationForwardInference"
    return InferenceCall(p, name, h, (spec,), spans, stage, (xd, pd))


# ==================================================================================================
# dnn_batch_normalization_grad
# ==================================================================================================
def dnn_batch_normalization_grad(
    inputs: DeviceArrayLike,
    dy: DeviceArrayLike,
    scale: DeviceArrayLike,
    x_mean: DeviceArrayLike,
    x_invstd: DeviceArrayLike,
    mode: Literal["per-activation", "spatial"] = "per-activation",
    epsilon: float = 1e-4,
    *,
    out: Out | None = None,
    out_dscale: Out2 | None = None,
    out_dbias: Out3 | None = None,
    stream: StreamLike = None,
) -> tuple[Out, Out2, Out3]:
    """Gradients of :func:`dnn_batch_normalization_train`'s output
    (``cudnnBatchNormalizationBackward``), Theano's ``GpuDnnBatchNormGrad``.

    With ``xhat = (inputs - x_mean) * x_invstd`` and sums over the normalized axes (``m``
    elements each)::

        dbias  = sum(dy)
        dscale = sum(dy * xhat)
        dx     = scale * x_invstd / m * (m * dy - dbias - xhat * dscale)

    Parameters
    ----------
    inputs : device array
        The forward inputs.
    dy : device array
        Gradient w.r.t. the normalized output, shape and dtype of *inputs*.
    scale : device array
        *gamma* of the forward call.
    x_mean, x_invstd : device array
        The ``mean`` and ``invstd`` the training call returned (cuDNN uses them as given).
    mode, epsilon
        As in the forward call.
    out : device array, optional
        Destination of ``dx`` (shape and dtype of *inputs*); may not overlap any input.
    out_dscale, out_dbias : device array, optional
        Destinations of ``dscale`` and ``dbias`` (contiguous, shaped and typed like *scale*).
    stream : optional
        CUDA stream; default the operands' framework's current stream (torch, CuPy), else the
        handle's stream.

    Returns
    -------
    tuple
        ``(dx, dscale, dbias)``: ``dx`` new in *inputs*' layout unless *out* is given;
        ``dscale``/``dbias`` new, shaped like *scale*.

    Raises
    ------
    TypeError, ValueError
        As for :func:`dnn_batch_normalization_train`; also when *dy* is not shaped like
        *inputs*.

    Examples
    --------
    >>> y, mean, invstd = pycudnn.dnn_batch_normalization_train(x, gamma, beta, "spatial")
    >>> dx, dgamma, dbeta = pycudnn.dnn_batch_normalization_grad(x, dy, gamma, mean, invstd,
    ...                                                           "spatial")
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(inputs)
    px, kx = _operand.key_of(inputs)
    pdy, kdy = _operand.key_of(dy)
    ps, ks = _operand.key_of(scale)
    pm, km = _operand.key_of(x_mean)
    pi, ki = _operand.key_of(x_invstd)
    po, ko = bc.key(out)
    pos, kos = bc.key(out_dscale)
    pob, kob = bc.key(out_dbias)
    key = (_GRAD, kx, kdy, ks, km, ki, ko, kos, kob, mode, epsilon, epsilon.__class__)
    outs = (out_dscale, out_dbias, out)
    args = (inputs, dy, scale, x_mean, x_invstd, mode, epsilon, outs, stream)
    ptrs = (px, pdy, ps, pm, pi)
    # dscale, dbias, then dx (see BatchNormCall)
    result = _call.run_cached(key, _build_backward, args, ptrs, outs, (pos, pob, po), stream)
    return result[2], result[0], result[1]


def _build_backward(
    inputs, dy, scale, x_mean, x_invstd, mode, epsilon, outs, stream
) -> BackwardCall:
    func = "dnn_batch_normalization_grad"
    out_dscale, out_dbias, out = outs
    p = bc.problem(func, "inputs", inputs, mode, epsilon)
    gdy = _operand.operand(dy)
    _checks.same_dtype_and_device(func, (("inputs", p.x), ("dy", gdy)))
    if tuple(gdy.shape) != p.shape:
        raise ValueError(f"{func}: dy has shape {tuple(gdy.shape)} but inputs {p.shape}")
    _checks.check_operand(func, "dy", gdy)
    gdy = _operand.Operand(
        gdy.ptr, *_staging.padded(gdy.shape, gdy.strides, 4), gdy.dtype, gdy.device
    )
    params = bc.params(p, (("scale", scale), ("x_mean", x_mean), ("x_invstd", x_invstd)))
    pops = [g for g, _ in params]
    o = bc.main_output(p, "out", out)
    bc.check_stat_outs(p, (("out_dscale", out_dscale), ("out_dbias", out_dbias)))
    bc.check_not_empty(p, "gradients")
    h = _call.handle_for(p.x.device, stream, p.func)
    stats = tuple(_call.output_spec(params[0][1], p.pdt, p.x.device) for _ in range(2))
    xd, pd, stage, spec, ws = _planned(p, h, (p.x, gdy), o, pops, 2)
    spans = bc.spans(p.x, gdy, *pops, *stats, spec if o is None else o)
    call = BackwardCall(
        p, "cudnnBatchNormalizationBackward", h, (*stats, spec), spans, stage, (xd, pd)
    )
    if ws is not None:
        use_ex(call, ws)
    return call
