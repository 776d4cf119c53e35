"""Layer norm and RMS norm on cuDNN's graph API (``OPERATION_NORM_FORWARD`` /
``NORM_BACKWARD``), with PyTorch's arguments: ``normalized_shape`` is the trailing dims
normalized together.

The operand ``x`` of shape ``(*lead, *normalized_shape)`` is given to cuDNN as an
``(M, N, 1, 1)`` tensor (``M`` rows of ``N`` features) when its normalized dims are packed and
its leading dims collapse into one stride -- any row pitch, so slices of a larger buffer work
as they are; other layouts go through a packed copy. The statistics (``mean``, ``inv_std`` =
1/sqrt(var + eps), ``inv_rms``) are float32 of shape ``(*lead, 1, ..., 1)``, as torch's
``native_layer_norm`` returns them; the backward functions take them back.

``gamma``/``beta`` may be None (cuDNN still needs them: cached ones/zeros stand in, and their
gradients are not returned). Data: float16, bfloat16, float32; gamma/beta: the same dtype or
float32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

from .. import _layout
from .._config import parse_bool
from .._types import dtype_name
from ..enums import DataType
from ..graph import Graph
from ..graph._tensor import alignment_of
from . import _call, _checks, _graphops, _operand, _staging

if TYPE_CHECKING:
    from ..memory import DeviceArray
    from ..typing import DeviceArrayLike, StreamLike
    from ._annotations import Out

__all__ = ["dnn_layer_norm", "dnn_layer_norm_grad", "dnn_rms_norm", "dnn_rms_norm_grad"]

_TYPES = (DataType.HALF, DataType.BFLOAT16, DataType.FLOAT)


def _norm_shape(func: str, normalized_shape: Any, x: _operand.Operand) -> tuple[int, ...]:
    ns = (normalized_shape,) if isinstance(normalized_shape, int) else normalized_shape
    try:
        if isinstance(ns, bool) or any(isinstance(d, bool) for d in ns):
            raise TypeError  # True is no size
        ns = tuple(int(d.__index__()) for d in ns)
    except (TypeError, AttributeError):
        raise TypeError(
            f"{func}: normalized_shape must be an int or a tuple of ints, got {normalized_shape!r}"
        ) from None
    if not ns or tuple(x.shape[len(x.shape) - len(ns) :]) != ns or len(ns) >= len(x.shape) + 1:
        raise ValueError(
            f"{func}: normalized_shape {ns} must be the trailing dims of x's shape {tuple(x.shape)}"
        )
    if len(ns) == len(x.shape):
        raise ValueError(
            f"{func}: normalized_shape {ns} covers every dim of x "
            f"{tuple(x.shape)}; x needs at least one leading (row) dim"
        )
    return ns


def _shape_key(normalized_shape: Any) -> Any:
    """*normalized_shape* as a hashable part of a call key (validated later, on a miss)."""
    if isinstance(normalized_shape, (list, tuple)):
        # with the elements' types: (True,) == (1,), but only one of them is a shape
        return tuple(normalized_shape), tuple(map(type, normalized_shape))
    return normalized_shape, normalized_shape.__class__


def _rows(g: _operand.Operand, nn: int) -> int | None:
    """The row stride when *g* is (M, N) rows of packed features with collapsible leading
    dims, else None."""
    shape, strides = tuple(g.shape), tuple(g.strides)
    lead, feat = shape[: len(shape) - nn], shape[len(shape) - nn :]
    if not _layout.matches(feat, strides[len(shape) - nn :], _layout.packed_strides(feat)):
        return None
    pitch = None
    acc = None
    for size, st in reversed(list(zip(lead, strides[: len(lead)], strict=True))):
        if size == 1:
            continue
        if acc is None:
            pitch = st
            acc = st * size
        elif st != acc:
            return None
        else:
            acc = st * size
    n = math.prod(feat)
    return n if pitch is None else pitch


def _x_tensor(g: Graph, name: str, o: _operand.Operand, nn: int, index: int, stage: list) -> Any:
    m = math.prod(o.shape[: len(o.shape) - nn])
    n = math.prod(o.shape[len(o.shape) - nn :])
    pitch = _rows(o, nn)
    align = alignment_of(o.ptr)
    # through a packed copy (a new, aligned buffer): cuDNN's norms want x, dy, y and dx in one
    # layout (a row pitch other than N is refused: "!xDesc.hasSameShape(&yDesc)", 9.19)
    if pitch is None or (pitch != n and m > 1):
        # the copy's legacy descriptors take 4 dims at least (trailing 1s change nothing)
        shp, st = _staging.padded(o.shape, o.strides)
        stage.append((index, o._replace(shape=shp, strides=st), _layout.packed_strides(shp)))
        pitch, align = n, 16
    return g.tensor(
        (m, n, 1, 1), (n if m == 1 else pitch, 1, n, n), o.dtype, name=name, alignment=align
    )


def _params(
    func: str, gm: _operand.Operand | None, ns: tuple[int, ...], name: str, device: int
) -> None:
    if gm is None:
        return
    if gm.device != device:
        raise ValueError(f"{func}: {name} is on device {gm.device}, x on device {device}")
    if tuple(gm.shape) != ns:
        raise ValueError(
            f"{func}: {name} has shape {tuple(gm.shape)}, expected normalized_shape {ns}"
        )
    if gm.dtype not in _TYPES:
        raise TypeError(
            f"{func}: {name} has an unsupported dtype; supported: float16, bfloat16, float32"
        )
    _checks.check_strides(func, name, gm)
    if not _layout.matches(gm.shape, gm.strides, _layout.packed_strides(tuple(gm.shape))):
        raise ValueError(f"{func}: {name} must be contiguous, got strides {tuple(gm.strides)}")


def _param_tensor(g: Graph, name: str, gm: _operand.Operand | None, n: int, dt: DataType) -> Any:
    align = 16 if gm is None else alignment_of(gm.ptr)
    return g.tensor(
        (1, n, 1, 1), (n, 1, n, n), dt if gm is None else gm.dtype, name=name, alignment=align
    )


def _stat_shape(x: _operand.Operand, nn: int) -> tuple[int, ...]:
    return (*x.shape[: len(x.shape) - nn], *(1,) * nn)


def _check_stat(
    func: str, name: str, o: _operand.Operand, shape: tuple[int, ...], device: int
) -> None:
    if o.dtype != DataType.FLOAT:
        raise TypeError(
            f"{func}: {name} must be float32 (as the forward returns it), got "
            f"{dtype_name(o.dtype) if o.dtype else 'an unsupported dtype'}"
        )
    if tuple(o.shape) != shape or (
        math.prod(shape) and not _layout.matches(o.shape, o.strides, _layout.packed_strides(shape))
    ):
        raise ValueError(
            f"{func}: {name} must be a contiguous float32 array of shape {shape}, "
            f"got shape {tuple(o.shape)}"
        )
    if o.device != device:
        raise ValueError(f"{func}: {name} is on device {o.device}, x on device {device}")
    _checks.check_aligned(func, name, o)


def _stat_out(g: Graph, t: Any) -> None:
    t.set_output(True).set_data_type(DataType.FLOAT)


class _Norm(_call.GraphCall):
    """A norm graph whose missing gamma/beta are stand-ins (ones, zeros): the caller passes
    pointer 0 for them and :meth:`launch` puts the stand-ins' pointers in."""

    __slots__ = ("stand_ins",)

    def stand_in(self, *places: tuple[int, Any]) -> None:
        """*places*: ``(input index, stand-in array or None)``; the arrays live with the entry."""
        self.stand_ins = tuple((i, a.ptr) for i, a in places if a is not None)
        self.keepalive = tuple(a for _i, a in places if a is not None)

    def launch(self, ptrs: Sequence[int]) -> None:
        if self.stand_ins:
            ptrs = list(ptrs)
            for i, p in self.stand_ins:
                ptrs[i] = p
        super().launch(ptrs)


# ==================================================================================================
# forward
# ==================================================================================================
def _forward(
    func: str,
    rms: bool,
    x: Any,
    normalized_shape: Any,
    gamma: Any,
    beta: Any,
    epsilon: Any,
    training: bool,
    outs: tuple,
    stream: Any,
) -> tuple:
    """*outs*: ``(out, out_mean, out_invstd)`` (layer) or ``(out, out_invrms)`` (RMS), as given."""
    out, stats = outs[0], outs[1:]
    px, kx = _operand.key_of(x)
    pg, kg = (0, None) if gamma is None else _operand.key_of(gamma)
    pb, kb = (0, None) if beta is None else _operand.key_of(beta)
    po, ko = (None, None) if out is None else _operand.key_of(out)
    if training.__class__ is not bool:
        training = parse_bool(training, func, "training")
    skeys = [(None, None) if a is None else _operand.key_of(a) for a in stats]
    if not training and any(a is not None for a in stats):
        names = "out_invrms" if rms else "out_mean and out_invstd"
        raise ValueError(f"{func}: {names} are written only with training=True")
    key = (
        func,
        kx,
        _shape_key(normalized_shape),
        kg,
        kb,
        epsilon,
        epsilon.__class__,  # epsilon=True equals 1.0: the type keeps it from a valid entry
        training,
        ko,
        tuple(k for _p, k in skeys),
        _call.snapshot(),
    )
    args = (func, rms, x, normalized_shape, gamma, beta, epsilon, training, outs, stream)
    ptrs = (px, pg) if rms else (px, pg, pb)  # 0: a stand-in (_Norm)
    if training:
        given, pos = outs, (po, *(p for p, _k in skeys))
    else:
        given, pos = (out,), (po,)
    result = _call.run_cached(key, _build_forward, args, ptrs, given, pos, stream)
    if rms:
        return (result[0], result[1] if training else None)
    return (result[0], result[1], result[2]) if training else (result[0], None, None)


def _build_forward(
    func: str,
    rms: bool,
    x: Any,
    normalized_shape: Any,
    gamma: Any,
    beta: Any,
    epsilon: Any,
    training: bool,
    outs: tuple,
    stream: Any,
) -> _call.GraphCall:
    out, given = outs[0], outs[1:]
    gx = _operand.operand(x)
    dt, device = _checks.same_dtype_and_device(func, (("x", gx),), _TYPES)
    _checks.check_strides(func, "x", gx)
    ns = _norm_shape(func, normalized_shape, gx)
    nn, n = len(ns), math.prod(ns)
    gg = None if gamma is None else _operand.operand(gamma)
    gb = None if beta is None else _operand.operand(beta)
    if rms and beta is not None:
        raise TypeError(f"{func} takes no beta")
    _params(func, gg, ns, "gamma", device)
    _params(func, gb, ns, "beta", device)
    eps = _checks.real(epsilon, "epsilon", func, lo=0.0, lo_open=True)
    if any(d == 0 for d in gx.shape):
        raise ValueError(f"{func}: x has an empty dim {tuple(gx.shape)}")
    g = Graph(dt, DataType.FLOAT, DataType.FLOAT, name=func)
    stage: list = []
    tx = _x_tensor(g, "x", gx, nn, 0, stage)
    pdt = dt if gg is None else gg.dtype
    tg = _param_tensor(g, "gamma", gg, n, pdt)
    tb = None
    if not rms:
        tb = _param_tensor(g, "beta", gb, n, pdt if gb is None else gb.dtype)
    te = g.scalar(eps, name="epsilon")
    phase = "training" if training else "inference"
    if rms:
        y, inv = g.rmsnorm(tx, tg, None, te, phase, name="rmsnorm")
        stats = [inv] if training else []
    else:
        y, mean, inv = g.layernorm(tx, tg, tb, te, phase, name="layernorm")
        stats = [mean, inv] if training else []
    m = tx.dim[0]
    y.set_output(True).set_data_type(dt).set_name("y")
    if out is not None:
        o = _checks.out_operand(func, out, tuple(gx.shape), dt, device)
        pitch = _rows(o, nn)
        if pitch is None or (pitch != n and m > 1):
            raise ValueError(
                f"{func}: out must be packed (rows of normalized_shape {ns} with no "
                f"row padding: cuDNN writes y in x's layout), got strides "
                f"{tuple(o.strides)}"
            )
        y.set_stride((n, 1, n, n)).set_alignment(alignment_of(o.ptr))
        alloc, so = None, o.nbytes_span
    else:
        alloc = _call.output_spec(tuple(gx.shape), dt, device)
        y.set_stride((n, 1, n, n))
        so = alloc.nbytes_span
    allocs = [alloc]
    out_spans = [so]
    sshape = _stat_shape(gx, nn)
    names = ("out_invrms",) if rms else ("out_mean", "out_invstd")
    for t, a, name in zip(stats, given, names, strict=False):
        _stat_out(g, t)
        spec, span = _graphops.packed_output(func, name, t, a, sshape, DataType.FLOAT, device)
        allocs.append(spec)
        out_spans.append(span)
    inputs = [tx, tg] + ([] if rms else [tb])
    g.set_io_order(*inputs, y, *stats)
    # a stand-in's pointer is 0 in the call's pointers, so its span is 0 (it overlaps nothing)
    in_spans = [gx.nbytes_span, 0 if gg is None else gg.nbytes_span]
    if not rms:
        in_spans.append(0 if gb is None else gb.nbytes_span)
    st = _staging.Stage(dt, stage, None, 1.0, 0.0) if stage else None
    what = f"{'RMS' if rms else 'layer'} norm {phase} of {m} rows x {n} {dtype_name(dt)} features"
    call = _graphops.entry(
        func, g, device, stream, allocs, [*in_spans, *out_spans], what=what, stage=st, kind=_Norm
    )
    # the stand-ins by role (None where the caller gave the array), allocated once every check
    # passed (issue 42: out= was checked after them)
    one = None if gg is not None else _graphops.filled(n, pdt, device, 1.0)
    zero = None if rms or gb is not None else _graphops.filled(n, pdt, device, 0.0)
    call.stand_in((1, one), (2, zero))
    return call


# training decides whether the statistics come back
@overload
def dnn_layer_norm(
    x: DeviceArrayLike,
    normalized_shape: int | Sequence[int],
    gamma: DeviceArrayLike | None = ...,
    beta: DeviceArrayLike | None = ...,
    epsilon: float = ...,
    *,
    training: Literal[True] = ...,
    out: Out | None = ...,
    out_mean: DeviceArrayLike | None = ...,
    out_invstd: DeviceArrayLike | None = ...,
    stream: StreamLike = ...,
) -> tuple[Out, DeviceArray, DeviceArray]: ...
@overload
def dnn_layer_norm(
    x: DeviceArrayLike,
    normalized_shape: int | Sequence[int],
    gamma: DeviceArrayLike | None = ...,
    beta: DeviceArrayLike | None = ...,
    epsilon: float = ...,
    *,
    training: Literal[False] = ...,
    out: Out | None = ...,
    out_mean: DeviceArrayLike | None = ...,
    out_invstd: DeviceArrayLike | None = ...,
    stream: StreamLike = ...,
) -> tuple[Out, None, None]: ...
@overload
def dnn_layer_norm(
    x: DeviceArrayLike,
    normalized_shape: int | Sequence[int],
    gamma: DeviceArrayLike | None = ...,
    beta: DeviceArrayLike | None = ...,
    epsilon: float = ...,
    *,
    training: bool = ...,
    out: Out | None = ...,
    out_mean: DeviceArrayLike | None = ...,
    out_invstd: DeviceArrayLike | None = ...,
    stream: StreamLike = ...,
) -> tuple[Out, DeviceArray | None, DeviceArray | None]: ...
def dnn_layer_norm(
    x: DeviceArrayLike,
    normalized_shape: int | Sequence[int],
    gamma: DeviceArrayLike | None = None,
    beta: DeviceArrayLike | None = None,
    epsilon: float = 1e-5,
    *,
    training: bool = True,
    out: Out | None = None,
    out_mean: DeviceArrayLike | None = None,
    out_invstd: DeviceArrayLike | None = None,
    stream: StreamLike = None,
) -> tuple[Any, ...]:
    """Layer normalization over the trailing ``normalized_shape`` dims (``F.layer_norm``).

    ``y = (x - mean) * inv_std * gamma + beta`` with ``inv_std = 1 / sqrt(var + epsilon)``
    (biased variance), per row.

    Parameters
    ----------
    x : device array
        ``(*lead, *normalized_shape)``, float16, bfloat16 or float32, any strides.
    normalized_shape : int or tuple of int
        The trailing dims normalized together.
    gamma, beta : device array, optional
        Of shape ``normalized_shape``, contiguous, x's dtype or float32.
    epsilon : float
        > 0.
    training : bool
        Also return the statistics the backward needs (default); False runs cuDNN's
        inference phase and returns ``(y, None, None)``.
    out : device array, optional
        ``y``'s storage: x's shape and dtype, packed rows.
    out_mean, out_invstd : device array, optional
        Where to write the statistics (``training=True`` only): float32 of their shape,
        contiguous. With every output given, a repeated call launches with no allocation (how a
        framework binds the call once: ``pycudnn.torch``'s lean path).
    stream : optional
        CUDA stream; default the operands' framework's current stream (torch, CuPy), else the
        handle's stream.

    Returns
    -------
    (y, mean, inv_std)
        ``mean`` and ``inv_std`` float32 of shape ``(*lead, 1, ..., 1)`` (None unless
        *training*).

    Raises
    ------
    TypeError
        Host arrays, unsupported dtypes, a bad *normalized_shape* type.
    ValueError
        *normalized_shape* not the trailing dims of x; bad gamma/beta shapes; epsilon <= 0.
    NotSupportedError
        cuDNN has no engine for this case here.
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(x)
    outs = (out, out_mean, out_invstd)
    return _forward(
        "dnn_layer_norm", False, x, normalized_shape, gamma, beta, epsilon, training, outs, stream
    )


# training decides whether the statistics come back
@overload
def dnn_rms_norm(
    x: DeviceArrayLike,
    normalized_shape: int | Sequence[int],
    gamma: DeviceArrayLike | None = ...,
    epsilon: float = ...,
    *,
    training: Literal[True] = ...,
    out: Out | None = ...,
    out_invrms: DeviceArrayLike | None = ...,
    stream: StreamLike = ...,
) -> tuple[Out, DeviceArray]: ...
@overload
def dnn_rms_norm(
    x: DeviceArrayLike,
    normalized_shape: int | Sequence[int],
    gamma: DeviceArrayLike | None = ...,
    epsilon: float = ...,
    *,
    training: Literal[False] = ...,
    out: Out | None = ...,
    out_invrms: DeviceArrayLike | None = ...,
    stream: StreamLike = ...,
) -> tuple[Out, None]: ...
@overload
def dnn_rms_norm(
    x: DeviceArrayLike,
    normalized_shape: int | Sequence[int],
    gamma: DeviceArrayLike | None = ...,
    epsilon: float = ...,
    *,
    training: bool = ...,
    out: Out | None = ...,
    out_invrms: DeviceArrayLike | None = ...,
    stream: StreamLike = ...,
) -> tuple[Out, DeviceArray | None]: ...
def dnn_rms_norm(
    x: DeviceArrayLike,
    normalized_shape: int | Sequence[int],
    gamma: DeviceArrayLike | None = None,
    epsilon: float = 1e-6,
    *,
    training: bool = True,
    out: Out | None = None,
    out_invrms: DeviceArrayLike | None = None,
    stream: StreamLike = None,
) -> tuple[Any, ...]:
    """RMS normalization over the trailing ``normalized_shape`` dims (``F.rms_norm``).

    ``y = x * inv_rms * gamma`` with ``inv_rms = 1 / sqrt(mean(x**2) + epsilon)`` per row.

    Parameters and errors as :func:`dnn_layer_norm` (no *beta*; *out_invrms* where it has
    *out_mean* and *out_invstd*).

    Returns
    -------
    (y, inv_rms)
        ``inv_rms`` float32 of shape ``(*lead, 1, ..., 1)`` (None unless *training*).
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(x)
    outs = (out, out_invrms)
    return _forward(
        "dnn_rms_norm", True, x, normalized_shape, gamma, None, epsilon, training, outs, stream
    )


# ==================================================================================================
# backward
# ==================================================================================================
def _backward(
    func: str,
    rms: bool,
    dy: Any,
    x: Any,
    mean: Any,
    inv: Any,
    normalized_shape: Any,
    gamma: Any,
    out_grads: Any,
    stream: Any,
) -> tuple:
    n_out = 2 if rms else 3
    given = _out_grads(func, out_grads, gamma, n_out)
    gkeys = [_operand.key_of(a) for a in given]
    pdy, kdy = _operand.key_of(dy)
    px, kx = _operand.key_of(x)
    pm, km = (0, None) if mean is None else _operand.key_of(mean)
    pi, ki = _operand.key_of(inv)
    pg, kg = (0, None) if gamma is None else _operand.key_of(gamma)
    key = (
        func, kdy, kx, km, ki, _shape_key(normalized_shape), kg,
        tuple(k for _p, k in gkeys), _call.snapshot(),
    )  # fmt: skip
    args = (func, rms, dy, x, mean, inv, normalized_shape, gamma, given, stream)
    ptrs = (pdy, px, pg, pi) if rms else (pdy, px, pg, pm, pi)  # pg 0: a stand-in (_Norm)
    if given:
        outs, pos = given, tuple(p for p, _k in gkeys)
    else:
        outs = pos = (None,) * n_out
    result = _call.run_cached(key, _build_backward, args, ptrs, outs, pos, stream)
    if gamma is None:
        return (result[0], None) if rms else (result[0], None, None)
    return tuple(result)


def _out_grads(func: str, out_grads: Any, gamma: Any, n: int) -> tuple:
    """*out_grads* as a tuple of *n* arrays, or ``()`` when not given."""
    if out_grads is None:
        return ()
    want = "(dx, dgamma)" if n == 2 else "(dx, dgamma, dbeta)"
    if not isinstance(out_grads, (tuple, list)) or len(out_grads) != n:
        raise TypeError(f"{func}: out_grads must be None or {want}, got {out_grads!r}")
    if gamma is None:
        raise ValueError(f"{func}: out_grads needs gamma (without it the stand-in's gradients stay"
                         " pycudnn's)")  # fmt: skip
    if any(a is None for a in out_grads):
        raise TypeError(f"{func}: out_grads must be {want} arrays, got {out_grads!r}")
    return tuple(out_grads)


def _build_backward(
    func: str,
    rms: bool,
    dy: Any,
    x: Any,
    mean: Any,
    inv: Any,
    normalized_shape: Any,
    gamma: Any,
    given: tuple,
    stream: Any,
) -> _call.GraphCall:
    gdy, gx = _operand.operand(dy), _operand.operand(x)
    dt, device = _checks.same_dtype_and_device(func, (("dy", gdy), ("x", gx)), _TYPES)
    for name, o in (("dy", gdy), ("x", gx)):
        _checks.check_strides(func, name, o)
    if tuple(gdy.shape) != tuple(gx.shape):
        raise ValueError(f"{func}: dy has shape {tuple(gdy.shape)}, x {tuple(gx.shape)}")
    ns = _norm_shape(func, normalized_shape, gx)
    nn, n = len(ns), math.prod(ns)
    sshape = _stat_shape(gx, nn)
    gm = None if mean is None else _operand.operand(mean)
    if not rms:
        if gm is None:
            raise TypeError(f"{func}: mean is required (the forward's second result)")
        _check_stat(func, "mean", gm, sshape, device)
    gi = _operand.operand(inv)
    _check_stat(func, "inv_rms" if rms else "inv_std", gi, sshape, device)
    gg = None if gamma is None else _operand.operand(gamma)
    _params(func, gg, ns, "gamma", device)
    g = Graph(dt, DataType.FLOAT, DataType.FLOAT, name=func)
    stage: list = []
    tdy = _x_tensor(g, "dy", gdy, nn, 0, stage)
    tx = _x_tensor(g, "x", gx, nn, 1, stage)
    pdt = dt if gg is None else gg.dtype
    tg = _param_tensor(g, "gamma", gg, n, pdt)
    m = tx.dim[0]
    tm = None if rms else _graphops.column(g, "mean", m, DataType.FLOAT, gm.ptr)
    ti = _graphops.column(g, "inv", m, DataType.FLOAT, gi.ptr)
    if rms:
        dx, dgamma, _ = g.rmsnorm_backward(tdy, tx, tg, ti, False, name="rmsnorm_backward")
        grads = [dgamma]
    else:
        dx, dgamma, dbeta = g.layernorm_backward(tdy, tx, tg, tm, ti, name="layernorm_backward")
        grads = [dgamma, dbeta]
    dx.set_output(True).set_data_type(dt).set_stride((n, 1, n, n)).set_name("dx")
    given = given or (None,) * (1 + len(grads))
    spec, span = _graphops.packed_output(
        func, "out_grads[0]", dx, given[0], tuple(gx.shape), dt, device
    )
    allocs, out_spans = [spec], [span]
    for i, t in enumerate(grads, 1):
        t.set_output(True).set_data_type(pdt).set_stride((n, 1, n, n))
        spec, span = _graphops.packed_output(func, f"out_grads[{i}]", t, given[i], ns, pdt, device)
        allocs.append(spec)
        out_spans.append(span)
    inputs = [tdy, tx, tg] + ([] if rms else [tm]) + [ti]
    g.set_io_order(*inputs, dx, *grads)
    in_spans = [gdy.nbytes_span, gx.nbytes_span, 0 if gg is None else gg.nbytes_span]
    if not rms:
        in_spans.append(gm.nbytes_span)
    in_spans.append(gi.nbytes_span)
    st = _staging.Stage(dt, stage, None, 1.0, 0.0) if stage else None
    what = f"{'RMS' if rms else 'layer'} norm backward of {m} rows x {n} {dtype_name(dt)} features"
    spans = [*in_spans, *out_spans]
    call = _graphops.entry(func, g, device, stream, allocs, spans, what=what, stage=st, kind=_Norm)
    call.stand_in((2, None if gg is not None else _graphops.filled(n, pdt, device, 1.0)))
    return call


def dnn_layer_norm_grad(
    dy: DeviceArrayLike,
    x: DeviceArrayLike,
    mean: DeviceArrayLike,
    inv_std: DeviceArrayLike,
    normalized_shape: int | Sequence[int],
    gamma: DeviceArrayLike | None = None,
    *,
    out_grads: tuple[DeviceArrayLike, DeviceArrayLike, DeviceArrayLike] | None = None,
    stream: StreamLike = None,
) -> tuple[DeviceArray, DeviceArray | None, DeviceArray | None]:
    """Gradients of :func:`dnn_layer_norm` from its saved statistics.

    Parameters
    ----------
    dy, x : device array
        The output's gradient and the forward's input (same shape and dtype).
    mean, inv_std : device array
        The forward's statistics (float32, ``(*lead, 1, ..., 1)``).
    normalized_shape, gamma
        As in the forward.
    out_grads : (dx, dgamma, dbeta) device arrays, optional
        Where to write the gradients (dx: x's shape and dtype, contiguous; dgamma and dbeta:
        gamma's shape and dtype, contiguous); needs *gamma*. With them given, a repeated call
        launches with no allocation (``pycudnn.torch``'s lean path binds the call so).
    stream : optional
        CUDA stream.

    Returns
    -------
    (dx, dgamma, dbeta)
        ``dgamma``/``dbeta`` in gamma's dtype (None when *gamma* is None); the given arrays
        with *out_grads*.
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(dy)
    return _backward(
        "dnn_layer_norm_grad", False, dy, x, mean, inv_std, normalized_shape, gamma, out_grads,
        stream,
    )  # fmt: skip


def dnn_rms_norm_grad(
    dy: DeviceArrayLike,
    x: DeviceArrayLike,
    inv_rms: DeviceArrayLike,
    normalized_shape: int | Sequence[int],
    gamma: DeviceArrayLike | None = None,
    *,
    out_grads: tuple[DeviceArrayLike, DeviceArrayLike] | None = None,
    stream: StreamLike = None,
) -> tuple[DeviceArray, DeviceArray | None]:
    """Gradients of :func:`dnn_rms_norm`: ``(dx, dgamma)`` (dgamma None without gamma);
    *out_grads* ``(dx, dgamma)`` as :func:`dnn_layer_norm_grad`'s."""
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(dy)
    return _backward(
        "dnn_rms_norm_grad", True, dy, x, None, inv_rms, normalized_shape, gamma, out_grads, stream
    )
