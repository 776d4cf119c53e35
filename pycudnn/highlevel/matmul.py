"""``dnn_matmul``: batched matrix products on cuDNN's graph API, with an optional fused
``bias`` and activation (one graph: ``act(a @ b + bias)``, the epilogue of
:mod:`.conv._epilogue`), planned and cached like every builder graph (:mod:`pycudnn.graph`).

Operands: ``a`` (..., M, K) and ``b`` (..., K, N) with NumPy's batch broadcasting (missing
leading dims are 1; a batch dim of 1 broadcasts). Transposed operands are strides: pass
``w.t()`` (a view) for ``x @ w.T``. Only one operand may broadcast (cuDNN has no engine when
each broadcasts against the other). float16, bfloat16 and float32 (float32 only with
``pycudnn.config.allow_tf32``: cuDNN's float32 matmul engines compute in TF32); the product
accumulates in float32.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from .. import errors
from .._types import dtype_name
from ..enums import DataType
from ..graph import Graph
from ..graph._tensor import alignment_of
from . import _call, _checks, _graphops, _operand
from .conv import _epilogue

if TYPE_CHECKING:
    from ..typing import DeviceArrayLike, StreamLike
    from ._annotations import Epilogue, Out

__all__ = ["dnn_matmul"]

_TYPES = (DataType.HALF, DataType.BFLOAT16, DataType.FLOAT)
_FUNC = "dnn_matmul"


def dnn_matmul(
    a: DeviceArrayLike,
    b: DeviceArrayLike,
    bias: DeviceArrayLike | None = None,
    activation: Epilogue | None = None,
    *,
    out: Out | None = None,
    stream: StreamLike = None,
) -> Out:
    """Batched ``act(a @ b + bias)`` as one cuDNN graph.

    Parameters
    ----------
    a : device array
        (..., M, K), float16, bfloat16 or float32, any positive strides.
    b : device array
        (..., K, N), same dtype; batch dims broadcast against *a*'s (NumPy rules).
    bias : device array, optional
        (N,) (or any shape whose dims are 1 but the last, N), *a*'s dtype; added to each row.
    activation : str or (str, float), optional
        As ``dnn_conv``'s: ``'relu'``, ``'gelu'`` (erf), ``'gelu_tanh'``, ``'silu'``/``'swish'``,
        ``'sigmoid'``, ``'tanh'``, ``'elu'`` or ``('clipped_relu', upper)``.
    out : device array, optional
        (*batch, M, N), *a*'s dtype, any non-overlapping strides.
    stream : optional
        CUDA stream; default the operands' framework's current stream (torch, CuPy), else the
        handle's stream.

    Returns
    -------
    DeviceArray or the type of *out*
        The product, packed row-major when new.

    Raises
    ------
    TypeError
        Host arrays, mixed or unsupported dtypes.
    ValueError
        Mismatched inner dims, batch dims that do not broadcast, a bad *bias*, *activation* or
        *out*, zero or negative strides.
    NotSupportedError
        float32 operands without ``pycudnn.config.allow_tf32``; cuDNN has no engine for this
        product here (the message lists the engines tried).

    Examples
    --------
    >>> y = pycudnn.dnn_matmul(x, w.t(), bias=b, activation="gelu")   # F.gelu(F.linear(x, w, b))
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(a)
    pa, ka = _operand.key_of(a)
    pb, kb = _operand.key_of(b)
    pbias, kbias = (0, None) if bias is None else _operand.key_of(bias)
    po, ko = (None, None) if out is None else _operand.key_of(out)
    key = (_FUNC, ka, kb, kbias, activation, ko, _call.snapshot())
    args = (a, b, bias, activation, out, stream)
    ptrs = (pa, pb) if bias is None else (pa, pb, pbias)
    return _call.run_cached(key, _build, args, ptrs, (out,), (po,), stream)[0]


def _build(a: Any, b: Any, bias: Any, activation: Any, out: Any, stream: Any) -> _call.GraphCall:
    func = _FUNC
    ga, gb = _operand.operand(a), _operand.operand(b)
    gbias = None if bias is None else _operand.operand(bias)
    named = (("a", ga), ("b", gb), ("bias", gbias))
    dt, device = _checks.same_dtype_and_device(func, named, _TYPES)
    for name, g in named:
        if g is not None:
            _checks.check_strides(func, name, g)
    if len(ga.shape) < 2 or len(gb.shape) < 2:
        raise ValueError(
            f"{func}: a {tuple(ga.shape)} and b {tuple(gb.shape)} need at least "
            "2 dims (..., M, K) and (..., K, N)"
        )
    if ga.shape[-1] != gb.shape[-2]:
        raise ValueError(
            f"{func}: a's last dim ({ga.shape[-1]}) must equal b's second to "
            f"last ({gb.shape[-2]}); a {tuple(ga.shape)}, b {tuple(gb.shape)}"
        )
    act = _epilogue.activation(activation, func)
    if act is not None and act[0] == "clipped_relu" and bias is None:
        # measured on an H200 with cuDNN 9.19 (the GPU fuzzer): a clipped ReLU straight on the
        # product runs, but the engines ignore its upper clip -- wrong results; after the bias
        # addition they honour it
        raise errors.NotSupportedError(
            3000,
            func,
            "activation=('clipped_relu', c) without a bias: cuDNN 9.19's matmul engines ignore "
            "the upper clip there (measured: wrong results); pass a bias (zeros) or clamp the "
            "product afterwards",
        )
    rank = max(len(ga.shape), len(gb.shape), 3)
    sa, sta = _lift(ga, rank)
    sb, stb = _lift(gb, rank)
    batch = []
    for i, (m, n) in enumerate(zip(sa[:-2], sb[:-2], strict=True)):
        if m != n and 1 not in (m, n):
            raise ValueError(
                f"{func}: batch dim {i} of a {tuple(ga.shape)} and b "
                f"{tuple(gb.shape)} does not broadcast ({m} vs {n})"
            )
        batch.append(max(m, n))
    if any(x == 1 < y for x, y in zip(sa[:-2], sb[:-2], strict=True)) and any(
        y == 1 < x for x, y in zip(sa[:-2], sb[:-2], strict=True)
    ):
        # measured on cuDNN 9.19 (H100): the heuristics return no engine when each operand
        # broadcasts against the other
        raise errors.NotSupportedError(
            3000,
            func,
            f"cuDNN's matmul broadcasts the batch dims of one operand only; a "
            f"{tuple(ga.shape)} and b {tuple(gb.shape)} each broadcast against the other "
            "(expand one of them first)",
        )
    m_, n_ = sa[-2], sb[-1]
    out_shape = (*batch, m_, n_)
    user_shape = tuple(out_shape[rank - max(len(ga.shape), len(gb.shape)) :])
    if any(d == 0 for d in (*out_shape, sa[-1])):
        raise ValueError(
            f"{func}: empty operands are not supported (a {tuple(ga.shape)}, b {tuple(gb.shape)})"
        )
    if dt == DataType.FLOAT and not _call.snapshot().allow_tf32:
        # measured on an H100 with cuDNN 9.19: every float32 matmul engine computes with TF32
        # (most carry the TENSOR_CORE note; one does not but rounds as TF32 does)
        raise errors.NotSupportedError(
            3000,
            func,
            "cuDNN's float32 matmul engines compute in TF32: set "
            "pycudnn.config.allow_tf32 = True (or config.override(allow_tf32=True)) to accept "
            "that, or use float16/bfloat16 operands",
        )
    ost = None
    if out is not None:
        o = _checks.out_operand(func, out, user_shape, dt, device)
        ost = _lift(o, rank)[1]
    if rank > 3:
        # cuDNN 9.19 (H100) runs rank-3 products but found no engine for a broadcast over
        # rank-4 batches: fold the batch dims into one where the memory allows
        folded = _fold(sa, sta, sb, stb, (*batch, m_, n_), ost)
        if folded is not None:
            (sa, sta), (sb, stb), ost = folded
            rank = 3
    g = Graph(dt, DataType.FLOAT, DataType.FLOAT, name=func)
    ta = _graphops.declare(g, "a", ga, sa, sta)
    tb = _graphops.declare(g, "b", gb, sb, stb)
    tbias = None
    if gbias is not None:
        n_bias = 1
        for d in gbias.shape:
            n_bias *= d
        if n_bias != n_ or any(d not in (1, n_) for d in gbias.shape):
            raise ValueError(
                f"{func}: bias has shape {tuple(gbias.shape)}; expected ({n_},) "
                "(one value per output column)"
            )
        last = gbias.strides[list(gbias.shape).index(n_)] if n_ > 1 else 1
        tbias = _graphops.declare(
            g, "bias", gbias, (1,) * (rank - 1) + (n_,), (n_,) * (rank - 1) + (max(last, 1),)
        )
    y = g.matmul(ta, tb, name="matmul")
    if tbias is not None or act is not None:
        y = _epilogue.epilogue(
            g, y, tbias, None, 1.0, act[0] if act else None, act[1] if act else None
        )
    y.set_output(True).set_data_type(dt).set_name("y")
    if out is not None:
        y.set_stride(tuple(max(s, 1) for s in ost)).set_alignment(alignment_of(o.ptr))
        alloc, so = None, o.nbytes_span
    else:
        alloc = _call.output_spec(user_shape, dt, device)
        so = alloc.nbytes_span
    inputs = [ta, tb] + ([tbias] if tbias is not None else [])
    g.set_io_order(*inputs, y)
    spans = [ga.nbytes_span, gb.nbytes_span] + ([gbias.nbytes_span] if gbias else [])
    what = (
        f"a {dtype_name(dt)} matmul {tuple(ga.shape)} @ {tuple(gb.shape)}"
        + (" + bias" if gbias is not None else "")
        + (f", {act[0]}" if act else "")
    )
    return _graphops.entry(func, g, device, stream, [alloc], [*spans, so], what=what)


def _lift(g: _operand.Operand, rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """*g*'s shape and strides with leading size-1 dims up to *rank* (their stride: the span,
    any positive value does)."""
    extra = rank - len(g.shape)
    top = max((s * st for s, st in zip(g.shape, g.strides, strict=True)), default=1)
    return (1,) * extra + tuple(g.shape), (max(top, 1),) * extra + tuple(g.strides)


def _batch(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, int] | None:
    """``(count, stride)`` of the batch dims as one, or None when their memory does not fold."""
    dims = [(d, st) for d, st in zip(shape[:-2], strides[:-2], strict=True) if d > 1]
    for (_d0, s0), (d1, s1) in itertools.pairwise(dims):
        if s0 != s1 * d1:
            return None
    count = 1
    for d, _st in dims:
        count *= d
    return count, (dims[-1][1] if dims else max(strides[-2] * shape[-2], 1))


def _fold(
    sa: tuple, sta: tuple, sb: tuple, stb: tuple, out_shape: tuple, ost: tuple | None
) -> tuple | None:
    """a, b and the output with their batch dims folded into one, or None: each operand's batch
    is the output's or all 1, and every batch folds in memory."""
    outb = out_shape[:-2]
    parts = []
    for shape, strides in ((sa, sta), (sb, stb)):
        if tuple(shape[:-2]) != tuple(outb) and any(d != 1 for d in shape[:-2]):
            return None
        f = _batch(shape, strides)
        if f is None:
            return None
        n, st = f
        parts.append(((n, *shape[-2:]), (st, *strides[-2:])))
    if ost is not None:
        f = _batch(out_shape, ost)
        if f is None:
            return None
        ost = (f[1], *ost[-2:])
    return parts[0], parts[1], ost
