"""Batch normalization (imports torch): ``BatchNorm1d``/``2d``/``3d`` on the three
``dnn_batch_normalization_*`` calls (``'spatial'`` mode), and the ``autograd.Function`` s over them:
training (running averages updated in place) and evaluation, on the lean path (:mod:`._lean`;
no autograd node when no gradient is wanted). Channels-last float16/bfloat16 data runs on cuDNN's
NHWC kernels without copies (the high level's ``...Ex`` calls). Batch norm is not on autocast's
lists: it runs in the input's dtype with float32 parameters, as torch's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .. import errors
from ..graph import _plans
from ..highlevel import (
    batch_normalization_act_reserve_size,
    dnn_batch_normalization_act_grad,
    dnn_batch_normalization_act_train,
    dnn_batch_normalization_grad,
    dnn_batch_normalization_test,
    dnn_batch_normalization_train,
)
from . import _lean
from ._compile import compiling, define, differentiable, eager_gradient, gradient
from ._module import Converted, float_params, state
from ._runtime import FIRST_USE, cuda_ok, dense, ready, stream_of

__all__ = [
    "BNEvalFn",
    "BNTrainFn",
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "bn_act_grad_run",
    "bn_act_train_run",
    "bn_affine",
    "bn_eval_run",
    "bn_forward",
    "bn_grad_run",
    "bn_train_run",
    "reserve_bytes",
    "train_running",
    "op_bn_eval",
    "op_bn_grad",
    "op_bn_train",
]

# the lean path's tags
_TRAIN, _EVAL, _GRAD, _ACT_TRAIN, _ACT_GRAD = "bn_train", "bn_eval", "bn_grad", "bnr", "bnr_grad"


def _train_slow(x, w, b, running, eps, factor, outs, s) -> None:
    y, mean, invstd = outs
    rm, rv = (None, None) if running is None else running
    dnn_batch_normalization_train(
        x,
        w,
        b,
        "spatial",
        eps,
        factor,
        rm,
        rv,
        inplace_running=running is not None,
        out=y,
        out_mean=mean,
        out_invstd=invstd,
        stream=s,
    )


def _eval_slow(x, w, b, mean, var, eps, y, s) -> None:
    dnn_batch_normalization_test(x, w, b, mean, var, "spatial", eps, out=y, stream=s)


def _grad_slow(x, dy, w, mean, invstd, eps, outs, s) -> None:
    dx, dw, db = outs
    dnn_batch_normalization_grad(
        x, dy, w, mean, invstd, "spatial", eps, out=dx, out_dscale=dw, out_dbias=db, stream=s
    )


def bn_train_run(x, w, b, running, eps, factor) -> tuple[torch.Tensor, ...]:
    """``dnn_batch_normalization_train`` of dense *x* (running averages, when given, updated in
    place) on the lean path: ``(y, mean, invstd)``, *y* in *x*'s memory format."""
    outs = (torch.empty_like(x), torch.empty_like(w), torch.empty_like(w))
    y, mean, invstd = outs
    s = stream_of(x)
    ops = (x, w, b) if running is None else (x, w, b, *running)
    tag = (_TRAIN, eps, factor)
    _lean.launch(
        tag, (*ops, mean, invstd, y), s, _train_slow, x, w, b, running, eps, factor, outs, s
    )
    if running is not None:  # cuDNN wrote them: tell torch they changed, as an in-place op would
        for t in running:
            torch.autograd.graph.increment_version(t)
    return outs


def bn_eval_run(x, w, b, mean, var, eps) -> torch.Tensor:
    """``dnn_batch_normalization_test`` of dense *x* on the lean path."""
    y = torch.empty_like(x)
    s = stream_of(x)
    ops = (x, w, b, mean, var, y)
    _lean.launch((_EVAL, eps), ops, s, _eval_slow, x, w, b, mean, var, eps, y, s)
    return y


def bn_grad_run(x, dy, w, mean, invstd, eps) -> tuple[torch.Tensor, ...]:
    """``dnn_batch_normalization_grad`` on the lean path: ``(dx, dw, db)``."""
    outs = (torch.empty_like(x), torch.empty_like(w), torch.empty_like(w))
    dx, dw, db = outs
    s = stream_of(dy)
    ops = (x, dy, w, mean, invstd, dw, db, dx)
    _lean.launch((_GRAD, eps), ops, s, _grad_slow, x, dy, w, mean, invstd, eps, outs, s)
    return outs


# -- batch norm with a fused ReLU (and residual addition): cuDNN's BN_(ADD_)ACTIVATION ------------
def _act_train_slow(x, w, b, z, running, eps, factor, outs, s) -> None:
    mean, invstd, reserve, y = outs
    rm, rv = (None, None) if running is None else running
    dnn_batch_normalization_act_train(
        x, w, b, z, "relu", eps, factor, rm, rv,
        out=y, out_mean=mean, out_invstd=invstd, out_reserve=reserve, stream=s,
    )  # fmt: skip


def _act_grad_slow(ops, eps, residual, outs, s) -> None:
    dw, db, *rest = outs
    dz, dx = rest if residual else (None, rest[0])
    dnn_batch_normalization_act_grad(
        *ops, "relu", eps, residual=residual,
        out=dx, out_dscale=dw, out_dbias=db, out_dz=dz, stream=s,
    )  # fmt: skip


# (shape, dtype, device, residual) -> reserve bytes, or _REFUSED: grows with the input shapes, so
# a host cache of the one registry (bounded, emptied by pycudnn.clear_caches())
_RESERVE = _plans.host_cache("torch_bn_act_reserve_bytes", 256)
_REFUSED = -1


def reserve_bytes(shape: tuple, dtype: torch.dtype, device: int, residual: bool) -> int | None:
    """cuDNN's reserve bytes for :func:`bn_act_train_run` on channels-last data of *shape* and
    *dtype* (``batch_normalization_act_reserve_size``, remembered), or None where cuDNN's size
    query refuses the fused kernel."""
    key = (shape, dtype, device, residual)
    n = _RESERVE.lookup(key)
    if n is None:
        try:
            n = batch_normalization_act_reserve_size(shape, dtype, residual, device)
        except errors.NotSupportedError:
            n = _REFUSED
        _RESERVE.put(key, n)
    return None if n == _REFUSED else n


def bn_act_train_run(x, w, b, z, running, eps, factor, n: int) -> tuple[torch.Tensor, ...]:
    """``relu(batch_norm(x) [+ z])``, one cuDNN kernel (dense channels-last float16/bfloat16
    *x*; running averages, when given, updated in place; *n* the reserve bytes,
    :func:`reserve_bytes`), on the lean path: ``(y, mean, invstd, reserve)``. Raises
    ``NotSupportedError`` where cuDNN has no kernel for it."""
    y, mean, invstd = torch.empty_like(x), torch.empty_like(w), torch.empty_like(w)
    reserve = torch.empty(n, dtype=torch.uint8, device=x.device)
    outs = (mean, invstd, reserve, y)
    ops = (x, w, b) if z is None else (x, w, b, z)
    if running is not None:
        ops += running
    s = stream_of(x)
    tag = (_ACT_TRAIN, eps, factor)
    _lean.launch(tag, ops + outs, s, _act_train_slow, x, w, b, z, running, eps, factor, outs, s)
    if running is not None:  # cuDNN wrote them: tell torch they changed, as an in-place op would
        for t in running:
            torch.autograd.graph.increment_version(t)
    return y, mean, invstd, reserve


def bn_act_grad_run(x, y, dy, w, b, mean, invstd, reserve, eps, residual: bool) -> tuple:
    """The gradients of :func:`bn_act_train_run` on the lean path: ``(dx, dw, db, dz)`` (*dz*
    None without a residual); *dy* laid out like *x*."""
    dx, dw, db = torch.empty_like(x), torch.empty_like(w), torch.empty_like(w)
    dz = torch.empty_like(x) if residual else None
    outs = (dw, db, dz, dx) if residual else (dw, db, dx)
    ops = (x, y, dy, w, b, mean, invstd, reserve)
    s = stream_of(dy)
    tag = (_ACT_GRAD, eps, residual)
    _lean.launch(tag, ops + outs, s, _act_grad_slow, ops, eps, residual, outs, s)
    return dx, dw, db, dz


def _eval_grad(ctx, dy):
    """Evaluation batch norm's gradient (torch computations: cuDNN has none for inference):
    ``dx = dy * w * invstd``, ``dw = sum(dy * xhat)``, ``db = sum(dy)``; ``(dx, dw, db, None,
    None, None)``."""
    x, w, mean, var = ctx.saved_tensors
    shape = (1, -1) + (1,) * (x.dim() - 2)
    dims = (0, *range(2, x.dim()))
    invstd = torch.rsqrt(var + ctx.eps)
    dx = dw = db = None
    if ctx.needs_input_grad[0]:
        dx = dy * (w * invstd).view(shape).to(dy.dtype)
    if ctx.needs_input_grad[1]:
        xhat = (x.to(w.dtype) - mean.view(shape)) * invstd.view(shape)
        dw = (dy.to(w.dtype) * xhat).sum(dims)
    if ctx.needs_input_grad[2]:
        db = dy.to(w.dtype).sum(dims)
    return dx, dw, db, None, None, None


# -- torch.compile: the three calls as pycudnn:: custom ops ----------------------------------------
def _op_train(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    eps: float,
    factor: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ready()
    running = None if running_mean is None else (running_mean, running_var)
    return bn_train_run(dense(x), w, b, running, eps, factor)


def _op_train_fake(x, w, b, running_mean, running_var, eps, factor):
    return torch.empty_like(x), torch.empty_like(w), torch.empty_like(w)


class BNTrainFn(torch.autograd.Function):
    """Training batch norm, eager and under ``torch.compile`` alike: ``pycudnn::bn_train`` (a
    mutating op, which ``torch.library`` gives no autograd formula, so dynamo traces this
    Function around it) or, in eager, :func:`bn_train_run` on the lean path; the running
    averages (None, or both) updated in place. Its one backward is ``dnn_batch_normalization_
    grad`` through :func:`~._compile.gradient` (``pycudnn::bn_grad`` where it is traced)."""

    @staticmethod
    def forward(ctx, x, w, b, running_mean, running_var, eps, factor):
        traced = compiling()
        if traced:
            y, mean, invstd = op_bn_train(x, w, b, running_mean, running_var, eps, factor)
        else:
            running = None if running_mean is None else (running_mean, running_var)
            y, mean, invstd = bn_train_run(x, w, b, running, eps, factor)
        ctx.save_for_backward(x, w, mean, invstd)
        ctx.eps, ctx.eager = eps, not traced
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, mean, invstd = ctx.saved_tensors
        if dy.dtype != x.dtype:
            dy = dy.to(x.dtype)
        grad = eager_gradient if ctx.eager else gradient
        dx, dw, db = grad(op_bn_grad, _op_grad, x, dy, w, mean, invstd, ctx.eps)
        return dx, dw, db, None, None, None, None


def _op_eval(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor,
    mean: torch.Tensor,
    var: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    ready()
    return bn_eval_run(dense(x), w, b, mean, var, eps)


def _op_eval_fake(x, w, b, mean, var, eps):
    return torch.empty_like(x)


def _eval_setup(ctx, inputs, output) -> None:
    x, w, _, mean, var, eps = inputs
    ctx.save_for_backward(x, w, mean, var)
    ctx.eps = eps


def _op_grad(
    x: torch.Tensor,
    dy: torch.Tensor,
    w: torch.Tensor,
    mean: torch.Tensor,
    invstd: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if FIRST_USE[0]:  # the first use only (no call on the hot path)
        ready()
    return bn_grad_run(x, dense(dy), w, mean, invstd, eps)


def _op_grad_fake(x, dy, w, mean, invstd, eps):
    return torch.empty_like(x), torch.empty_like(w), torch.empty_like(w)


#: ``pycudnn::bn_train(x, w, b, running_mean?, running_var?, eps, factor) -> (y, mean,
#: invstd)``: :func:`bn_train_run`, the running averages updated in place (its gradient:
#: :class:`BNTrainFn`)
op_bn_train = define(
    "bn_train",
    _op_train,
    _op_train_fake,
    mutates=("running_mean", "running_var"),
)
#: ``BNEvalFn.apply(x, w, b, mean, var, eps)`` (eager; *x* dense already) and
#: ``pycudnn::bn_eval(...)``: :func:`bn_eval_run`, one backward (:func:`_eval_grad`)
BNEvalFn, op_bn_eval = differentiable(
    "bn_eval", _op_eval, _op_eval_fake, _eval_setup, _eval_grad, eager_run=bn_eval_run
)
#: ``pycudnn::bn_grad(x, dy, w, mean, invstd, eps) -> (dx, dw, db)``
op_bn_grad = define("bn_grad", _op_grad, _op_grad_fake)


def bn_affine(m: nn.modules.batchnorm._BatchNorm, x: torch.Tensor, traced: bool) -> tuple:
    """*m*'s scale and shift as cuDNN takes them for *x*: float32 (float64 for float64 data),
    cast by a differentiable ``.to`` when the module's are not; ones and zeros (cached per
    module) without ``affine``."""
    pdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    c = x.shape[1]
    if m.affine:
        w, b = m.weight, m.bias
        if w.dtype != pdt:  # cuDNN's rule: float32 (float64) scale and bias; autograd casts back
            w, b = w.to(pdt), b.to(pdt)
        return w, b
    if traced:  # no side table in traced code: constants of the graph
        w = torch.ones(c, dtype=pdt, device=x.device)
        return w, torch.zeros(c, dtype=pdt, device=x.device)
    consts = state(m)
    key = ("affine", x.device, pdt, c)
    wb = consts.get(key)
    if wb is None:
        wb = consts[key] = (
            torch.ones(c, dtype=pdt, device=x.device),
            torch.zeros(c, dtype=pdt, device=x.device),
        )
    return wb


def train_running(m: nn.modules.batchnorm._BatchNorm, pdt: torch.dtype) -> tuple:
    """A training step's running averages of *m*: ``(running, factor, copy_back)``. Counts the
    batch (``num_batches_tracked``, as torch); *running* is ``(mean, var)`` to update in place
    (copies in *pdt* when the buffers are not: *copy_back* then says to copy them back), or
    None."""
    factor = 0.0 if m.momentum is None else m.momentum
    if m.training and m.track_running_stats and m.num_batches_tracked is not None:
        m.num_batches_tracked.add_(1)
        if m.momentum is None:  # cumulative moving average (as torch: a host read)
            factor = 1.0 / float(m.num_batches_tracked)
    rm, rv = m.running_mean, m.running_var
    if not m.training or rm is None:
        return None, factor, False
    if rm.dtype != pdt or not rm.is_contiguous() or not rv.is_contiguous():
        return (rm.to(pdt).contiguous(), rv.to(pdt).contiguous()), factor, True
    return (rm, rv), factor, False


def bn_forward(m: nn.modules.batchnorm._BatchNorm, x: torch.Tensor, fallback: Callable) -> Any:
    """*m*'s forward on cuDNN for CUDA inputs it takes (``'spatial'`` mode), else *fallback*."""
    m._check_input_dim(x)
    if not cuda_ok(x) or x.dim() > 5:
        return fallback(x)
    traced = compiling()
    if not traced:
        ready()
    w, b = bn_affine(m, x, traced)
    x = dense(x)
    if m.training or m.running_mean is None:
        running, factor, copy_back = train_running(m, w.dtype)
        if traced or (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)):
            rmean, rvar = (None, None) if running is None else running
            y = BNTrainFn.apply(x, w, b, rmean, rvar, m.eps, factor)
        else:
            y = bn_train_run(x, w, b, running, m.eps, factor)[0]
        if copy_back:
            m.running_mean.copy_(running[0])
            m.running_var.copy_(running[1])
        return y
    mean, var = m.running_mean.to(w.dtype), m.running_var.to(w.dtype)
    if traced:
        return op_bn_eval(x, w, b, mean, var, m.eps)
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
        return BNEvalFn.apply(x, w, b, mean, var, m.eps)
    return bn_eval_run(x, w, b, mean, var, m.eps)


class _BatchNormRule(Converted):
    """Batch normalization's rule: floating-point parameters."""

    @classmethod
    def unsupported(cls, module: nn.Module) -> str | None:
        return float_params(module)


class BatchNorm1d(_BatchNormRule, nn.BatchNorm1d):
    """``torch.nn.BatchNorm1d`` on pycudnn's batch normalization (``'spatial'`` mode)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.BatchNorm1d.forward`` (training, eval, running statistics)."""
        return bn_forward(self, input, super().forward)


class BatchNorm2d(_BatchNormRule, nn.BatchNorm2d):
    """``torch.nn.BatchNorm2d`` on pycudnn's batch normalization."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.BatchNorm2d.forward``."""
        return bn_forward(self, input, super().forward)


class BatchNorm3d(_BatchNormRule, nn.BatchNorm3d):
    """``torch.nn.BatchNorm3d`` on pycudnn's batch normalization."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.BatchNorm3d.forward``."""
        return bn_forward(self, input, super().forward)
