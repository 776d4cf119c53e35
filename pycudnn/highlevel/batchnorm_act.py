"""Batch normalization with a fused ReLU, and optionally a residual addition before it
(``relu(bn(x) + z)``): cuDNN's ``CUDNN_BATCHNORM_OPS_BN_ACTIVATION`` /
``CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION`` on ``cudnnBatchNormalizationForwardTrainingEx`` and
``cudnnBatchNormalizationBackwardEx`` (``SPATIAL_PERSISTENT`` mode, NHWC kernels).

One kernel does what takes two or three otherwise (batch norm, the addition, the ReLU) in each
direction: the training step of a ResNet block. cuDNN runs it for packed channels-last
float16/bfloat16 data only; other data is refused here, before any C call, with the plain
functions named as the way to go.

The forward returns cuDNN's *reserve* space (bytes; empty when cuDNN needs none): the backward
reads it, with the forward's output (the ReLU's mask comes from it) and statistics. Running
averages are updated in place, as a training framework keeps them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np

from .. import _cuda, _layout
from .._types import as_data_type, dtype_name
from ..descriptors.ops import ActivationDescriptor
from ..enums import DataType
from ..graph import _plans
from . import _bn_checks as bc
from . import _call, _checks, _operand, _staging
from ._bn_calls import ActBackwardCall, ActTrainCall, act_sizes

if TYPE_CHECKING:
    from ..typing import DeviceArrayLike, StreamLike
    from ._annotations import Out, Out2, Out3, Out4

__all__ = [
    "dnn_batch_normalization_act_grad",
    "batch_normalization_act_reserve_size",
    "dnn_batch_normalization_act_train",
]

_TRAIN, _GRAD = "bn_act_train", "bn_act_grad"
_ACTS = ("relu",)  # what cuDNN fuses into batch norm
_TYPES = (DataType.HALF, DataType.BFLOAT16)
_PARAMS = DataType.FLOAT  # scale, bias and statistics of half-type data


def _check_act(func: str, activation: Any) -> None:
    if not isinstance(activation, str) or activation.lower() not in _ACTS:
        raise ValueError(
            f"{func}: activation={activation!r}; cuDNN fuses 'relu' into batch norm (use "
            "dnn_batch_normalization_train and dnn_activation for others)"
        )


def _cl(p: Any) -> tuple[int, ...]:
    """The element strides of packed channels-last data of the inputs' shape."""
    return _layout.packed_strides(p.shape, True, 1)


def _data_problem(func: str, inputs: Any, epsilon: Any) -> Any:
    """The spatial problem of *inputs*, refused unless packed channels-last half types."""
    p = bc.problem(func, "inputs", inputs, "spatial", epsilon)
    if p.dt not in _TYPES:
        raise TypeError(
            f"{func}: inputs are {dtype_name(p.dt)}; cuDNN's fused batch norm takes float16 or "
            "bfloat16 data (use dnn_batch_normalization_train for others)"
        )
    strides = tuple(p.x.strides[: len(p.shape)])
    if len(p.shape) != 4 or not _layout.matches(p.shape, strides, _cl(p)):
        raise ValueError(
            f"{func}: inputs have shape {p.shape} and strides {strides}; cuDNN's fused batch "
            f"norm takes 4-D packed channels-last data (strides {_cl(p)})"
        )
    return p


def _alike(func: str, p: Any, name: str, obj: Any) -> _operand.Operand:
    """A data operand shaped, typed and laid out like the inputs (packed channels-last)."""
    g = _operand.operand(obj)
    _checks.same_dtype_and_device(func, (("inputs", p.x), (name, g)))
    if tuple(g.shape) != p.shape or not _layout.matches(g.shape, g.strides, _cl(p)):
        raise ValueError(
            f"{func}: {name} has shape {tuple(g.shape)} and strides {tuple(g.strides)}; "
            f"expected the inputs' shape {p.shape}, packed channels-last (strides {_cl(p)})"
        )
    return g


def _descs(shape: tuple[int, ...], dt: DataType) -> tuple:
    """The data's (packed channels-last), the float32 parameters' and the ReLU's descriptors."""
    xd = _staging.tensor_descriptor(shape, _layout.packed_strides(shape, True, 1), dt)
    pshape = (1, shape[1], 1, 1)
    pd = _staging.tensor_descriptor(pshape, _layout.packed_strides(pshape, False, 1), _PARAMS)
    return xd, pd, ActivationDescriptor("relu", 0.0)


def _reserve_spec(n: int, device: int) -> _call.OutputSpec:
    return _call.OutputSpec((n,), np.dtype(np.uint8), device, (1,))


def _reserve_operand(func: str, name: str, obj: Any, device: int) -> _operand.Operand:
    """The reserve space's operand, on the inputs' *device* (checked before any C call)."""
    g = _operand.operand(obj)
    if g.device != device:
        raise ValueError(f"{func}: inputs are on device {device} but {name} on {g.device}")
    return g


def _check_reserve(func: str, name: str, g: _operand.Operand, n: int) -> None:
    """*g* is what cuDNN reserves: *n* contiguous bytes."""
    if g.dtype != DataType.UINT8 or tuple(g.shape) != (n,) or (n > 1 and g.strides != (1,)):
        raise ValueError(
            f"{func}: {name} must be a contiguous uint8 array of shape ({n},) (cuDNN's reserve "
            f"space for these inputs), got shape {tuple(g.shape)}"
        )


def batch_normalization_act_reserve_size(
    shape: Sequence[int], dtype: Any, residual: bool = False, device: int | None = None
) -> int:
    """Bytes of the reserve space :func:`dnn_batch_normalization_act_train` returns for inputs
    of *shape* ``(N, C, H, W)`` and *dtype* (float16 or bfloat16, any framework's spelling),
    with a residual when *residual*, on *device* (default: the current one): the size an
    ``out_reserve=`` must have (``cudnnGetBatchNormalizationTrainingExReserveSpaceSize``; 0 when
    cuDNN needs none). Reads no data: a framework's shape propagation (``torch.compile``'s fake
    tensors) can call it. Answers are cached (per shape, dtype, residual and device).

    Raises
    ------
    TypeError
        A dtype other than float16/bfloat16, a non-bool *residual*, a non-int device.
    ValueError
        A shape other than four positive ints.
    NotSupportedError
        cuDNN has no fused kernel for this shape and dtype on the device.
    """
    func = "batch_normalization_act_reserve_size"
    if type(residual) is not bool:
        raise TypeError(f"{func}: residual must be a bool, got {residual!r}")
    if device is not None and (type(device) is not int or device < 0):
        raise TypeError(f"{func}: device must be a non-negative int or None, got {device!r}")
    dt = as_data_type(dtype, argument=f"{func}: dtype")
    if dt not in _TYPES:
        raise TypeError(f"{func}: dtype is {dtype_name(dt)}; cuDNN's fused batch norm takes "
                        "float16 or bfloat16 data")  # fmt: skip
    dims = tuple(shape) if isinstance(shape, (tuple, list)) else None
    if dims is None or len(dims) != 4 or not all(type(n) is int and 0 < n < 2**31 for n in dims):
        raise ValueError(f"{func}: shape must be four positive ints (N, C, H, W), got {shape!r}")
    if device is None:
        device = _cuda.device_now() or 0
    return _reserve_bytes(dims, dt, residual, device)


#: cuDNN's answers by (shape, dtype, residual, device): a host cache of the registry (bounded,
#: emptied by clear_caches(), counted by cache_info())
_RESERVES = _plans.host_cache("bn_act_reserve_bytes", 256)


def _reserve_bytes(shape: tuple[int, ...], dt: DataType, residual: bool, device: int) -> int:
    key = (shape, dt, residual, device)
    n = _RESERVES.lookup(key)
    if n is None:
        h = _call.handle_for(device, None, "batch_normalization_act_reserve_size")
        n = act_sizes(h, *_descs(shape, dt), residual).reserve
        _RESERVES.put(key, n)
    return n


def dnn_batch_normalization_act_train(
    inputs: DeviceArrayLike,
    gamma: DeviceArrayLike,
    beta: DeviceArrayLike,
    z: DeviceArrayLike | None = None,
    activation: str = "relu",
    epsilon: float = 1e-5,
    running_average_factor: float = 0.1,
    running_mean: DeviceArrayLike | None = None,
    running_var: DeviceArrayLike | None = None,
    *,
    out: Out | None = None,
    out_mean: Out2 | None = None,
    out_invstd: Out3 | None = None,
    out_reserve: Out4 | None = None,
    stream: StreamLike = None,
) -> tuple[Out, Out2, Out3, Out4]:
    """``relu(batch_norm(inputs) + z)`` with the batch's statistics, one cuDNN kernel
    (``cudnnBatchNormalizationForwardTrainingEx``, ``BN_ACTIVATION`` or ``BN_ADD_ACTIVATION``).

    The formulas are :func:`dnn_batch_normalization_train`'s in ``'spatial'`` mode, then the
    addition of *z* (when given) and the ReLU.

    Parameters
    ----------
    inputs : device array
        ``(N, C, H, W)``, packed channels-last (NHWC in memory), float16 or bfloat16.
    gamma, beta : device array
        float32, ``(C,)`` or ``(1, C, 1, 1)``.
    z : device array, optional
        The residual, shaped, typed and laid out like *inputs*.
    activation : {'relu'}
        The only activation cuDNN fuses here.
    epsilon : float
        Added to the variance (>= ``CUDNN_BN_MIN_EPSILON``).
    running_average_factor : float
        In ``[0, 1]``: the weight of this batch in the running averages.
    running_mean, running_var : device array, optional
        Both or neither; contiguous, typed and shaped like *gamma*; **updated in place**
        (the running variance from the unbiased batch variance, ``m / (m - 1)``).
    out : device array, optional
        The output, like *inputs*; may not overlap an input.
    out_mean, out_invstd : device array, optional
        Where to write ``mean`` and ``invstd`` (like *gamma*).
    out_reserve : device array, optional
        Where to write the reserve space: a contiguous uint8 array of its size
        (:func:`batch_normalization_act_reserve_size`).
    stream : optional
        CUDA stream; default the operands' framework's current stream.

    Returns
    -------
    tuple
        ``(out, mean, invstd, reserve)``; pass ``out``, ``mean``, ``invstd`` and ``reserve`` to
        :func:`dnn_batch_normalization_act_grad`.

    Raises
    ------
    TypeError
        Data other than float16/bfloat16, parameters other than float32.
    ValueError
        Data other than 4-D packed channels-last; *z* or *out* unlike *inputs*; an activation
        other than ReLU; the checks of :func:`dnn_batch_normalization_train`.
    NotSupportedError
        cuDNN has no fused kernel for these operands on this GPU.

    Examples
    --------
    >>> y, mean, invstd, reserve = pycudnn.dnn_batch_normalization_act_train(x, gamma, beta, z)
    """
    if stream is None:
        stream = _operand.producer_stream(inputs)
    px, kx = _operand.key_of(inputs)
    pg, kg = _operand.key_of(gamma)
    pb, kb = _operand.key_of(beta)
    pz, kz = bc.key(z)
    pm, km = bc.key(running_mean)
    pv, kv = bc.key(running_var)
    po, ko = bc.key(out)
    pom, kom = bc.key(out_mean)
    poi, koi = bc.key(out_invstd)
    por, kor = bc.key(out_reserve)
    eps, factor = epsilon, running_average_factor
    key = (_TRAIN, kx, kg, kb, kz, km, kv, ko, kom, koi, kor, activation, eps, factor)
    key += (eps.__class__, factor.__class__)
    ptrs = (px, pg, pb)
    if pz is not None:
        ptrs += (pz,)
    if pm is not None and pv is not None:
        ptrs += (pm, pv)
    args = (inputs, gamma, beta, z, activation, epsilon, factor, (running_mean, running_var))
    args += ((out_mean, out_invstd, out_reserve, out), stream)
    outs = (out_mean, out_invstd, out_reserve, out)
    res = _call.run_cached(key, _build_train, args, ptrs, outs, (pom, poi, por, po), stream)
    return res[3], res[0], res[1], res[2]


def _build_train(
    inputs, gamma, beta, z, activation, epsilon, factor, running, outs, stream
) -> ActTrainCall:
    func = "dnn_batch_normalization_act_train"
    _check_act(func, activation)
    p = _data_problem(func, inputs, epsilon)
    f = _checks.real(factor, "running_average_factor", func, lo=0.0, hi=1.0)
    rm, rv = running
    if (rm is None) != (rv is None):
        given = "running_mean" if rv is None else "running_var"
        raise ValueError(
            f"{func}: only {given} was given; running_mean and running_var go together"
        )
    named = [("gamma", gamma), ("beta", beta)]
    if rm is not None:
        named += [("running_mean", rm), ("running_var", rv)]
    params = bc.params(p, named)
    for g, _shape in params[2:]:
        if not _layout.matches(g.shape, g.strides, _layout.packed_strides(g.shape, False, 1)):
            raise ValueError(
                f"{func}: the running averages are updated in place: pass contiguous ones"
            )
    if rm is not None and p.m < 2:
        raise ValueError(
            f"{func}: each statistic averages m = {p.m} element; the running variance's "
            "unbiased variance is undefined for m = 1"
        )
    data = [p.x]
    if z is not None:
        data.append(_alike(func, p, "z", z))
    out_mean, out_invstd, out_reserve, out = outs
    o = None if out is None else _alike(func, p, "out", out)
    bc.check_stat_outs(p, (("out_mean", out_mean), ("out_invstd", out_invstd)))
    bc.check_not_empty(p, "batch statistics")
    gr = None
    if out_reserve is not None:
        gr = _reserve_operand(func, "out_reserve", out_reserve, p.x.device)
    h = _call.handle_for(p.x.device, stream, func)
    descs = _descs(p.shape, p.dt)
    sizes = act_sizes(h, descs[0], descs[1], descs[2], z is not None)
    if gr is not None:
        _check_reserve(func, "out_reserve", gr, sizes.reserve)
    stats = tuple(_call.output_spec(params[0][1], p.pdt, p.x.device) for _ in range(2))
    spec = _call.like_spec(p.x, shape=p.shape) if o is None else None
    rspec = _reserve_spec(sizes.reserve, p.x.device)
    spans = bc.spans(*data[:1], *(g for g, _ in params[:2]), *data[1:], *(g for g, _ in params[2:]))
    spans += (stats[0].nbytes_span, stats[1].nbytes_span, sizes.reserve)
    spans += (o.nbytes_span if o is not None else spec.nbytes_span,)
    allocs = (*stats, rspec, spec)
    return ActTrainCall(
        func, h, allocs, spans, descs, p.eps, sizes, z is not None, f, rm is not None
    )


@overload
def dnn_batch_normalization_act_grad(
    inputs: DeviceArrayLike,
    y: DeviceArrayLike,
    dy: DeviceArrayLike,
    scale: DeviceArrayLike,
    bias: DeviceArrayLike,
    x_mean: DeviceArrayLike,
    x_invstd: DeviceArrayLike,
    reserve: DeviceArrayLike,
    activation: str = ...,
    epsilon: float = ...,
    *,
    residual: Literal[False] = ...,
    out: Out | None = ...,
    out_dscale: Out2 | None = ...,
    out_dbias: Out3 | None = ...,
    out_dz: None = ...,
    stream: StreamLike = ...,
) -> tuple[Out, Out2, Out3]: ...
@overload
def dnn_batch_normalization_act_grad(
    inputs: DeviceArrayLike,
    y: DeviceArrayLike,
    dy: DeviceArrayLike,
    scale: DeviceArrayLike,
    bias: DeviceArrayLike,
    x_mean: DeviceArrayLike,
    x_invstd: DeviceArrayLike,
    reserve: DeviceArrayLike,
    activation: str = ...,
    epsilon: float = ...,
    *,
    residual: Literal[True],
    out: Out | None = ...,
    out_dscale: Out2 | None = ...,
    out_dbias: Out3 | None = ...,
    out_dz: Out4 | None = ...,
    stream: StreamLike = ...,
) -> tuple[Out, Out2, Out3, Out4]: ...
def dnn_batch_normalization_act_grad(
    inputs: DeviceArrayLike,
    y: DeviceArrayLike,
    dy: DeviceArrayLike,
    scale: DeviceArrayLike,
    bias: DeviceArrayLike,
    x_mean: DeviceArrayLike,
    x_invstd: DeviceArrayLike,
    reserve: DeviceArrayLike,
    activation: str = "relu",
    epsilon: float = 1e-5,
    *,
    residual: bool = False,
    out: Out | None = None,
    out_dscale: Out2 | None = None,
    out_dbias: Out3 | None = None,
    out_dz: Out4 | None = None,
    stream: StreamLike = None,
) -> tuple[Out, Out2, Out3] | tuple[Out, Out2, Out3, Out4]:
    """Gradients of :func:`dnn_batch_normalization_act_train`
    (``cudnnBatchNormalizationBackwardEx``): the ReLU's backward (its mask from *y*), the
    residual's gradient and batch norm's, one kernel.

    Parameters
    ----------
    inputs, y : device array
        The forward's inputs and output.
    dy : device array
        The gradient of *y*, shaped, typed and laid out like *inputs*.
    scale, bias : device array
        *gamma* and *beta* of the forward (cuDNN recomputes the ReLU's input from them).
    x_mean, x_invstd, reserve : device array
        What the forward returned.
    activation, epsilon
        As in the forward.
    residual : bool
        The forward added a residual *z*: its gradient ``dz`` is returned too.
    out, out_dscale, out_dbias, out_dz : device array, optional
        Destinations of ``dx``, ``dscale``, ``dbias`` and ``dz``.
    stream : optional
        CUDA stream; default the operands' framework's current stream.

    Returns
    -------
    tuple
        ``(dx, dscale, dbias)``, or ``(dx, dscale, dbias, dz)`` with *residual*.

    Raises
    ------
    TypeError, ValueError, NotSupportedError
        As for :func:`dnn_batch_normalization_act_train`; also for *y* or *dy* unlike *inputs*,
        a *reserve* of the wrong size, a non-bool *residual*.
    """
    func = "dnn_batch_normalization_act_grad"
    if type(residual) is not bool:
        raise TypeError(f"{func}: residual must be a bool, got {residual!r}")
    if stream is None:
        stream = _operand.producer_stream(inputs)
    keys = [_operand.key_of(a) for a in (inputs, y, dy, scale, bias, x_mean, x_invstd, reserve)]
    po, ko = bc.key(out)
    pos, kos = bc.key(out_dscale)
    pob, kob = bc.key(out_dbias)
    pdz, kdz = bc.key(out_dz)
    if not residual and out_dz is not None:
        raise ValueError(f"{func}: out_dz was given but residual=False (no residual, no dz)")
    key = (_GRAD, *(k for _, k in keys), ko, kos, kob, kdz, activation, residual, epsilon)
    key += (epsilon.__class__,)
    ptrs = tuple(p for p, _ in keys)
    ops = (inputs, y, dy, scale, bias, x_mean, x_invstd, reserve)
    if residual:
        outs, out_ptrs = (out_dscale, out_dbias, out_dz, out), (pos, pob, pdz, po)
    else:
        outs, out_ptrs = (out_dscale, out_dbias, out), (pos, pob, po)
    args = (ops, activation, epsilon, residual, outs, stream)
    res = _call.run_cached(key, _build_grad, args, ptrs, outs, out_ptrs, stream)
    if residual:
        return res[3], res[0], res[1], res[2]
    return res[2], res[0], res[1]


def _build_grad(
    ops: tuple, activation: Any, epsilon: Any, residual: bool, outs: tuple, stream: Any
) -> ActBackwardCall:
    """*ops*: the public function's eight operands, in its order."""
    inputs, y, dy, scale, bias, x_mean, x_invstd, reserve = ops
    func = "dnn_batch_normalization_act_grad"
    _check_act(func, activation)
    p = _data_problem(func, inputs, epsilon)
    gy, gdy = _alike(func, p, "y", y), _alike(func, p, "dy", dy)
    named = (("scale", scale), ("bias", bias), ("x_mean", x_mean), ("x_invstd", x_invstd))
    params = bc.params(p, named)
    out_dscale, out_dbias = outs[:2]
    o = None if outs[-1] is None else _alike(func, p, "out", outs[-1])
    odz = None
    if residual and outs[2] is not None:
        odz = _alike(func, p, "out_dz", outs[2])
    bc.check_stat_outs(p, (("out_dscale", out_dscale), ("out_dbias", out_dbias)))
    bc.check_not_empty(p, "gradients")
    gr = _reserve_operand(func, "reserve", reserve, p.x.device)
    h = _call.handle_for(p.x.device, stream, func)
    descs = _descs(p.shape, p.dt)
    sizes = act_sizes(h, descs[0], descs[1], descs[2], residual)
    _check_reserve(func, "reserve", gr, sizes.reserve)
    stats = tuple(_call.output_spec(params[0][1], p.pdt, p.x.device) for _ in range(2))
    data_spec = _call.like_spec(p.x, shape=p.shape)
    spans = bc.spans(p.x, gy, gdy, *(g for g, _ in params), gr)
    spans += (stats[0].nbytes_span, stats[1].nbytes_span)
    allocs: tuple = stats
    if residual:
        spans += (odz.nbytes_span if odz is not None else data_spec.nbytes_span,)
        allocs += (data_spec if odz is None else None,)
    spans += (o.nbytes_span if o is not None else data_spec.nbytes_span,)
    allocs += (data_spec if o is None else None,)
    return ActBackwardCall(func, h, allocs, spans, descs, p.eps, sizes, residual)
