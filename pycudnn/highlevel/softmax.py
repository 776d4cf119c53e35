"""Softmax and log-softmax, forward and backward: Theano's ``dnn_softmax`` and cudnn.torch's
SoftMax, LogSoftMax and their Spatial/Volumetric variants.

``mode='channel'`` normalizes over the channels (axis 1) separately at every sample and spatial
position (PyTorch's ``softmax(x, dim=1)``); ``mode='instance'`` over everything but the batch
axis (``C * spatial`` values per sample). ``algo='accurate'`` subtracts the maximum first,
``'fast'`` does not, ``'log'`` computes log-softmax.

cuDNN's softmax reads 4-D tensors. 2-D ``(N, C)`` and 3-D ``(N, C, L)`` inputs get trailing
size-1 dims; a 5-D input has two adjacent spatial dims merged when its strides allow it (true for
packed NCDHW and NDHWC), otherwise it is staged through a packed copy, as is an ``out`` whose
strides cannot be merged.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Literal

from .. import _layout
from ..enums import SoftmaxAlgorithm, SoftmaxMode
from . import _call, _checks, _operand, _staging

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..typing import DeviceArrayLike, StreamLike
    from ._annotations import Out

__all__ = ["dnn_softmax", "dnn_softmax_grad"]

_ALGOS = {
    "fast": SoftmaxAlgorithm.FAST,
    "accurate": SoftmaxAlgorithm.ACCURATE,
    "log": SoftmaxAlgorithm.LOG,
}
_MODES = {"instance": SoftmaxMode.INSTANCE, "channel": SoftmaxMode.CHANNEL}


def _as4d(shape: tuple[int, ...], strides: tuple[int, ...]):
    """The 4-D (N, C, S1, S2) view cuDNN reads, or None when the strides cannot be merged."""
    n = len(shape)
    if n <= 4:
        return _staging.padded(shape, strides)
    # 5-D: merge D with H, or H with W
    for i in (2, 3):
        if shape[i + 1] == 1 or strides[i] == strides[i + 1] * shape[i + 1] or shape[i] == 1:
            st = strides[i + 1] if shape[i + 1] > 1 else strides[i]
            return (
                (*shape[:i], shape[i] * shape[i + 1], *shape[i + 2 :]),
                (*strides[:i], st, *strides[i + 2 :]),
            )
    return None


class _Softmax(_call.Call):
    """``cudnnSoftmaxForward`` (x, y) or ``cudnnSoftmaxBackward`` (y, dy, dx)."""

    __slots__ = ("algo", "alpha", "beta", "descs", "fn", "hp", "mode")

    def __init__(self, func, h, alloc, spans, stage, name, algo_mode, descs, factors):
        alpha, beta = factors
        # the descriptors and the factors byref() points into live as long as the entry
        super().__init__(func, h, (alloc,), spans, stage, keepalive=(descs, alpha, beta))
        self.fn = _call.quiet(name)
        self.hp = h.ptr
        self.algo, self.mode = (int(v) for v in algo_mode)
        self.descs = descs
        self.alpha, self.beta = ctypes.byref(alpha), ctypes.byref(beta)

    def launch(self, ptrs):
        alpha, beta = self.alpha, self.beta
        if len(ptrs) == 2:  # forward: x, y
            xd, yd = self.descs
            self.fn(self.hp, self.algo, self.mode, alpha, xd, ptrs[0], beta, yd, ptrs[1])
        else:  # backward: y, dy, dx
            yd, dyd, dxd = self.descs
            self.fn(
                self.hp, self.algo, self.mode, alpha, yd, ptrs[0], dyd, ptrs[1], beta, dxd, ptrs[2]
            )


def _kernel_mode(mode: SoftmaxMode, shape: Sequence[int]) -> SoftmaxMode:
    """The mode cuDNN is asked for: with no spatial extent (every dim after C is 1, as for
    ``(N, C)`` logits) channel and instance mode compute the same thing, and instance mode's
    kernels are the fast ones: on an H200 with cuDNN 9.19 the channel-mode backward of
    ``(8192, 1024, 1, 1)`` took 9.5 ms (float32; 7-21 ms for the shapes and algos tried) where
    instance mode took 27-57 µs (docs/BENCHMARKS.md, "Softmax backward")."""
    if mode == SoftmaxMode.CHANNEL and all(d == 1 for d in shape[2:]):
        return SoftmaxMode.INSTANCE
    return mode


def _build(func, name, names, objs, out, algo, mode, alpha, beta, stream) -> _call.Call:
    """Validate the inputs (*names*, *objs*: all one shape), the output and the arguments;
    stage what cuDNN cannot read as 4-D."""
    ops = [(n, _operand.operand(o)) for n, o in zip(names, objs, strict=True)]
    a_ = _checks.choose(algo, _ALGOS, "algo", func)
    m_ = _checks.choose(mode, _MODES, "mode", func)
    o = _operand.operand(out) if out is not None else None
    m_ = _kernel_mode(m_, ops[0][1].shape)
    dt, device = _checks.same_dtype_and_device(func, [*ops, ("out", o)])
    first_name, g0 = ops[0]
    if not 2 <= len(g0.shape) <= 5:
        raise ValueError(
            f"{func}: {first_name} has shape {tuple(g0.shape)}; expected 2-D to 5-D (N, C, ...)"
        )
    for n, g in ops[1:]:
        if tuple(g.shape) != tuple(g0.shape):
            raise ValueError(
                f"{func}: {n} has shape {tuple(g.shape)} but {first_name} has "
                f"{tuple(g0.shape)}; expected one shape"
            )
    for n, g in ops:
        _checks.check_strides(func, n, g)
    if o is not None:
        _checks.check_strides(func, "out", o)
        _checks.check_out(func, o, g0.shape)
    a, b = _call.scales(dt, _checks.real(alpha, "alpha", func), _checks.real(beta, "beta", func))
    _checks.beta_needs_out(func, beta, out)
    h = _call.handle_for(device, stream, func)
    spec = _call.like_spec(g0) if o is None else None
    out_strides = o.strides if o is not None else spec.element_strides
    so = o.nbytes_span if o is not None else spec.nbytes_span
    spans = (*(g.nbytes_span for _n, g in ops), so)
    if any(s == 0 for s in g0.shape):
        return _call.Call(func, h, (spec,), spans, noop=True)
    packed = _layout.packed_strides(g0.shape)
    staged_in, descs = [], []
    views = [_as4d(g.shape, g.strides) for _n, g in ops]
    # cuDNN's backward reads sm and dy through one layout (BAD_PARAM otherwise): when their
    # views differ, those not packed are staged to packed
    mixed = len({None if v is None else v[1] for v in views}) > 1
    for i, (_n, g) in enumerate(ops):
        view = views[i]
        if view is None or (mixed and tuple(g.strides) != tuple(packed)):
            staged_in.append((i, g, packed))
            view = _as4d(g.shape, packed)
        descs.append(_staging.tensor_descriptor(*view, dt))
    view = _as4d(g0.shape, out_strides)
    staged_out = None
    if view is None:
        staged_out = (tuple(g0.shape), tuple(out_strides), packed)
        view = _as4d(g0.shape, packed)
    descs.append(_staging.tensor_descriptor(*view, dt))
    stage = None
    if staged_in or staged_out:
        stage = _staging.Stage(dt, staged_in, staged_out, alpha, beta)
        if staged_out:
            a, b = _call.scales(dt, 1.0, 0.0)  # the final copy applies alpha and beta
    return _Softmax(func, h, spec, spans, stage, name, (a_, m_), tuple(descs), (a, b))


def dnn_softmax(
    x: DeviceArrayLike,
    algo: Literal["fast", "accurate", "log"] = "accurate",
    mode: Literal["instance", "channel"] = "channel",
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Out | None = None,
    stream: StreamLike = None,
) -> Out:
    """Softmax (or log-softmax) of *x*: ``out = alpha * softmax(x) + beta * out``.

    Parameters
    ----------
    x : device array
        2-D ``(N, C)`` to 5-D ``(N, C, D, H, W)``, any strides; float16, bfloat16, float32 or
        float64.
    algo : {'accurate', 'fast', 'log'}
        ``'accurate'`` subtracts the per-slice maximum before exponentiating (no overflow),
        ``'fast'`` does not, ``'log'`` returns log-softmax (computed accurately).
    mode : {'channel', 'instance'}
        ``'channel'``: over axis 1 at each sample and position (``torch.softmax(x, 1)``);
        ``'instance'``: over all axes but the first.
    alpha, beta : float
        Blend factors (*beta* != 0 accumulates into *out*).
    out : device array, optional
        Same shape and dtype as *x*; must not overlap it.
    stream : optional
        CUDA stream; default the operands' framework's current stream (torch, CuPy), else the
        handle's stream.

    Returns
    -------
    DeviceArray or the type of *out*
        In *x*'s memory order when new.

    Raises
    ------
    TypeError
        Host arrays, a dtype other than the four floating types, mixed dtypes.
    ValueError
        An unknown algo or mode, a rank outside 2..5, a shape mismatch, overlapping *out*,
        negative or zero strides, operands on different devices.

    Examples
    --------
    >>> p = pycudnn.dnn_softmax(logits)                       # (N, C): softmax over classes
    >>> lp = pycudnn.dnn_softmax(scores, algo="log")          # log-softmax, per pixel for 4-D
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(x)
    px, kx = _operand.key_of(x)
    po, ko = (None, None) if out is None else _operand.key_of(out)
    key = ("softmax", kx, ko, algo, mode, alpha, beta, alpha.__class__, beta.__class__)
    args = (
        "dnn_softmax",
        "cudnnSoftmaxForward",
        ("x",),
        (x,),
        out,
        algo,
        mode,
        alpha,
        beta,
        stream,
    )
    return _call.run_cached(key, _build, args, (px,), (out,), (po,), stream)[0]


def dnn_softmax_grad(
    dy: DeviceArrayLike,
    sm: DeviceArrayLike,
    algo: Literal["fast", "accurate", "log"] = "accurate",
    mode: Literal["instance", "channel"] = "channel",
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Out | None = None,
    stream: StreamLike = None,
) -> Out:
    """Gradient of :func:`dnn_softmax` w.r.t. its input: ``out = alpha * dx + beta * out``.

    Parameters
    ----------
    dy : device array
        Gradient w.r.t. the softmax output.
    sm : device array
        The forward output (softmax, or log-softmax for ``algo='log'``), same shape as *dy*.
    algo, mode
        As in the forward call (``'fast'`` and ``'accurate'`` have the same gradient).
    alpha, beta, out, stream
        As for :func:`dnn_softmax`.

    Returns
    -------
    DeviceArray or the type of *out*
        ``dx = sm * (dy - sum(dy * sm))`` (softmax) or ``dy - exp(sm) * sum(dy)`` (log), the sums
        over the normalized axes.

    Raises
    ------
    TypeError, ValueError
        As for :func:`dnn_softmax`; also when *dy* and *sm* differ in shape.
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(dy)
    pdy, kdy = _operand.key_of(dy)
    psm, ksm = _operand.key_of(sm)
    po, ko = (None, None) if out is None else _operand.key_of(out)
    key = ("softmax_grad", kdy, ksm, ko, algo, mode, alpha, beta)
    key += (alpha.__class__, beta.__class__)  # True == 1.0, but only one is valid
    args = (
        "dnn_softmax_grad",
        "cudnnSoftmaxBackward",
        ("sm", "dy"),
        (sm, dy),
        out,
        algo,
        mode,
        alpha,
        beta,
        stream,
    )
    return _call.run_cached(key, _build, args, (psm, pdy), (out,), (po,), stream)[0]
