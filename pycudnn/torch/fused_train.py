"""The training step of a fused ``Conv -> BatchNorm (-> residual add) (-> activation)`` chain
(imports torch): the chain as **one autograd node** instead of three or four, and batch norm,
the addition and a ReLU as **one cuDNN kernel** in each direction where cuDNN has it.

Forward: the convolution (the lean path), then batch norm with the batch's statistics (running
averages updated in place, as the batch-norm module's), the residual added and the activation
applied in place. Backward: the activation's and batch norm's gradients, then the convolution's
data and weight gradients. Where the data is channels-last float16/bfloat16 and the activation a
ReLU, batch norm, the addition and the ReLU run fused in both directions (:func:`chain_path`
picks per signature): with a residual on a large enough tensor, pycudnn's own kernels
(:mod:`.bn_kernel`); otherwise cuDNN's fused kernel
(:func:`~pycudnn.highlevel.dnn_batch_normalization_act_train`, ``BN_ADD_ACTIVATION``). The rest
runs the separate cuDNN calls of the converted modules (torch's add, and torch's ReLU backward
for bfloat16, as there), still in the one node.

The chain's intermediate results that autograd keeps are the unfused chain's: the input, the
weight, the convolution's output (batch norm's input), the block's output and batch norm's
statistics (plus, on the fused paths, the ReLU's mask: cuDNN's reserve space or pycudnn's, a
bit per element).

cuDNN's graph-API conv-BN training fusions (convolution with statistics generation, BN finalize,
the next convolution's scale-bias-ReLU prologue, data gradient with dReLU and batch norm's weight
gradients) are not used: on an H200 with cuDNN 9.19 their convolution kernels are slower than
the plain ones by more than the batch-norm kernels they replace (ResNet-50's identity blocks in
float16: 1.06-1.07x forward, 1.23x backward), and bfloat16 has engines for conv -> genstats only
(``bench/bn_chain.py``, docs/BENCHMARKS.md).
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import torch

from .. import errors
from ._compile import define, eager_gradient, gradient
from ._runtime import HALVES, dense, like, ready
from .activation import Y_ONLY, act_grad_run, act_run
from .batchnorm import (
    bn_act_grad_run,
    bn_act_train_run,
    bn_grad_run,
    bn_train_run,
    reserve_bytes,
)
from .bn_kernel import fits, mask_bytes, takes, train_backward, train_forward
from .conv import conv_dgrad, conv_out_shape, conv_run, conv_wgrad

__all__ = [
    "CUDNN",
    "OWN",
    "OWN_MIN_ELEMENTS",
    "OWN_PLAIN_MIN_ELEMENTS",
    "SEPARATE",
    "TRAIN_ACTS",
    "TrainBlock",
    "TrainFn",
    "bn_act_backward",
    "block_backward",
    "block_forward",
    "cfg_list",
    "cfg_of",
    "chain_path",
    "op_block_grad",
    "op_block_train",
    "op_lists",
    "reads_as_is",
    "train_block",
]

#: the epilogue activations the training node runs (those whose gradient needs only the output)
TRAIN_ACTS = Y_ONLY


class TrainBlock(NamedTuple):
    """What the training node needs besides its tensors: the convolution's *cfg* ``(nd, pad,
    stride, dilation, groups)``, batch norm's *eps* and running-average *factor*, the activation
    (``(mode, coef)`` or None) and a per-module set of signatures cuDNN's fused batch norm
    refused (*refused*)."""

    cfg: tuple
    eps: float
    factor: float
    act: tuple[str, float] | None
    refused: set


#: how a chain's batch norm (+ addition) + ReLU runs in training: cuDNN's separate calls (and
#: torch's addition), cuDNN's fused kernel, or pycudnn's own kernels (:mod:`.bn_kernel`)
SEPARATE, CUDNN, OWN = "", "cudnn", "own"
#: the fewest elements of a convolution output whose residual form runs on pycudnn's kernels:
#: below it their three launches a direction cost more than cuDNN's one (on an H200, ResNet-50
#: at batch 8: 1.10-1.14x cuDNN's at 0.8-3.2 million elements, level at 6.4 million). A constant
#: of the process: a compiled backward asks :func:`chain_path` again for the forward's choice
#: (the tests lower it before they build a model)
OWN_MIN_ELEMENTS = 1 << 22
#: the same for the plain form (batch norm + ReLU, no residual), where cuDNN's fused kernel is
#: faster on ResNet-50's stage shapes at batch 64 (up to 12.8 million elements; docs/
#: BENCHMARKS.md): from here (a ResNet stem's output at batch 32 and up) pycudnn's kernels, whose
#: backward reads the ReLU's mask, not the chain's output, so that output can go as soon as its
#: readers are done (the stem's, once the max pooling has run: pycudnn's pooling keeps its own
#: byte per element instead)
OWN_PLAIN_MIN_ELEMENTS = 1 << 24


def chain_path(
    y: torch.Tensor,
    pdt: torch.dtype,
    act: tuple[str, float] | None,
    residual: bool,
    device: int | None = None,
) -> tuple[str, int]:
    """How the chain whose convolution gives *y* runs its batch norm, addition and ReLU in
    training, and the bytes its backward reads besides the statistics (cuDNN's reserve space or
    pycudnn's ReLU mask): ``(path, bytes)``. From *y*'s shape, dtype, layout and device alone
    (fake tensors too; *device* instead of *y*'s for a meta tensor) and batch norm's parameter
    dtype *pdt*: the same answer every time for one signature.

    Channels-last float16/bfloat16 with a ReLU: pycudnn's own kernels where they take the
    shape and it has :data:`OWN_MIN_ELEMENTS` or more with a residual (on an H200 they run the
    residual form at 0.75-0.95x cuDNN's fused kernels, forward and backward, over ResNet-50's
    shapes at batch 64: docs/BENCHMARKS.md), :data:`OWN_PLAIN_MIN_ELEMENTS` or more without;
    else cuDNN's fused kernel where its size query takes it (cuDNN's is faster on the plain
    form at ResNet-50's stage shapes and on small tensors). The rest runs cuDNN's separate
    calls (:data:`SEPARATE`, 0 bytes)."""
    if act is None or act[0] != "relu" or y.dtype not in HALVES or y.dim() != 4:
        return SEPARATE, 0
    if not y.is_contiguous(memory_format=torch.channels_last):
        return SEPARATE, 0
    # int(): a symbolic size (torch.compile's dynamic shapes) is specialized, as cuDNN's sizes are
    shape = tuple(int(n) for n in y.shape)
    dev = y.get_device() if device is None else device
    least = OWN_MIN_ELEMENTS if residual else OWN_PLAIN_MIN_ELEMENTS
    big = shape[0] * shape[1] * shape[2] * shape[3] >= least
    if big and dev >= 0 and pdt == torch.float32 and fits(shape, y.dtype):
        return OWN, mask_bytes(shape)
    n = reserve_bytes(shape, y.dtype, dev, residual)
    return (SEPARATE, 0) if n is None else (CUDNN, n)


def reads_as_is(t: torch.Tensor, like_: torch.Tensor) -> bool:
    """Whether pycudnn's kernels read *t* beside *like_* as it is: *like_*'s strides, 16-byte
    aligned (else :func:`block_forward` reads a copy)."""
    return t.stride() == like_.stride() and takes(t)


def _aligned(t: torch.Tensor, like_: torch.Tensor) -> torch.Tensor:
    """*t* as pycudnn's kernels read it beside *like_* (:func:`reads_as_is`; a copy where
    not)."""
    return t if reads_as_is(t, like_) else torch.empty_like(like_).copy_(t)


def block_forward(x, w, cb, gamma, beta, z, running, blk: TrainBlock, strict: bool = False):
    """The chain's forward: ``(out, saved)``, *saved* what the backward reads: ``(path,
    conv_out, mean, invstd, out, reserve)`` (*path* :func:`chain_path`'s; *reserve* cuDNN's
    reserve space or the ReLU's mask, None on the separate path). *strict*: a fused launch
    cuDNN refuses raises (the compiled graph fixed the path) instead of running the separate
    calls for this signature from then on."""
    yc = conv_run(x, w, cb, blk.cfg)
    path, n = chain_path(yc, gamma.dtype, blk.act, z is not None)
    if path == OWN:
        out, mean, invstd, mask = train_forward(
            yc,
            gamma,
            beta,
            None if z is None else _aligned(z, yc),
            running,
            blk.eps,
            blk.factor,
            True,
        )
        return out, (OWN, yc, mean, invstd, out, mask)
    if path == CUDNN and (yc.shape, yc.dtype) not in blk.refused:
        try:
            out, mean, invstd, reserve = bn_act_train_run(
                yc, gamma, beta, z, running, blk.eps, blk.factor, n
            )
            return out, (CUDNN, yc, mean, invstd, out, reserve)
        except errors.NotSupportedError:
            if strict:
                raise
            blk.refused.add((yc.shape, yc.dtype))  # no fused kernel here: separate calls
    out, mean, invstd = bn_train_run(yc, gamma, beta, running, blk.eps, blk.factor)
    if z is not None:
        out.add_(z)
    if blk.act is not None:
        act_run(out, blk.act[0], blk.act[1], True)
    return out, (SEPARATE, yc, mean, invstd, out, None)


def bn_act_backward(path: str, saved: tuple, dy, blk: TrainBlock, dz: bool) -> tuple:
    """Batch norm's, the addition's and the activation's gradients of a chain whose forward
    took *path*: ``(dyc, dgamma, dbeta, dz)`` (*dz*, the residual's, None unless asked). *saved*
    is ``(conv_out, out, gamma, beta, mean, invstd, reserve)``; *dy* dense, in the output's
    dtype and (for the fused paths) its strides."""
    yc, y, gamma, beta, mean, invstd, reserve = saved
    if path == OWN:
        if dy.data_ptr() % 16:
            dy = dy.clone()  # (same strides: only the alignment pycudnn's kernels read at)
        dyc, dgamma, dbeta, dzz = train_backward(dy, reserve, yc, gamma, mean, invstd, dz)
        return dyc, dgamma, dbeta, dzz
    if path == CUDNN:
        return bn_act_grad_run(yc, y, dy, gamma, beta, mean, invstd, reserve, blk.eps, dz)
    d = dy if blk.act is None else act_grad_run(y, y, dy, (*blk.act, True))
    dyc, dgamma, dbeta = bn_grad_run(yc, dense(d), gamma, mean, invstd, blk.eps)
    return dyc, dgamma, dbeta, d if dz else None


def block_backward(dy, saved: tuple, blk: TrainBlock, path: str, need: tuple) -> tuple:
    """The chain's backward from *saved* ``(x, w, yc, gamma, beta, mean, invstd, out,
    reserve)`` of a forward that took *path*: ``(dx, dw, dyc, dgamma, dbeta, dz)``; *need*
    ``(dx, dw, dz)`` wanted (None for the others)."""
    x, w, yc, gamma, beta, mean, invstd, y, reserve = saved
    dy = dense(dy)
    if dy.dtype != y.dtype:
        dy = dy.to(y.dtype)
    if path and dy.stride() != y.stride():  # the fused kernels take one layout for all
        dy = dy.contiguous(memory_format=torch.channels_last)
    dyc, dgamma, dbeta, dz = bn_act_backward(
        path, (yc, y, gamma, beta, mean, invstd, reserve), dy, blk, need[2]
    )
    dx = conv_dgrad(w, dyc, torch.empty_like(x), blk.cfg) if need[0] else None
    dw = conv_wgrad(x, dyc, w, blk.cfg) if need[1] else None
    return dx, dw, dyc, dgamma, dbeta, dz


def train_block(x, w, cb, gamma, beta, z, running, blk: TrainBlock, lists=None) -> Any:
    """``act(bn(conv(x)) [+ z])`` in training mode: one autograd node (:class:`TrainFn`) when a
    gradient is wanted, the bare forward otherwise. Every tensor dense, CUDA, of one dtype
    (*gamma*, *beta* and *running* float32 or float64 as batch norm takes them). *lists*: the
    custom ops' ``(conv, params, act)`` (:func:`op_lists`) where the call is being traced, so
    the node runs :data:`op_block_train`; None in eager."""
    wanted = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, w, cb, gamma, beta, z)
    )
    rm, rv = (None, None) if running is None else running
    if wanted or lists is not None:
        # (traced, the block stays out of the graph: dynamo would guard on its set)
        return TrainFn.apply(x, w, cb, gamma, beta, z, rm, rv, None if lists else blk, lists)
    return block_forward(x, w, cb, gamma, beta, z, running, blk)[0]


# -- torch.compile: the training node as two pycudnn:: custom ops -------------------------------
def cfg_list(cfg: tuple) -> list[int]:
    """A convolution's *cfg* ``(nd, pad, stride, dilation, groups)`` as the custom ops' int
    list ``[nd, groups, *pad, *stride, *dilation]``."""
    nd, pad, stride, dil, groups = cfg
    return [nd, groups, *pad, *stride, *dil]


def cfg_of(conv: list[int]) -> tuple:
    """:func:`cfg_list` undone."""
    nd, groups = conv[0], conv[1]
    pad, stride, dil = (tuple(conv[2 + i * nd : 2 + (i + 1) * nd]) for i in range(3))
    return (nd, pad, stride, dil, groups)


def _block(conv: list[int], params: list[float], act: str) -> TrainBlock:
    eps, factor, coef = params
    return TrainBlock(cfg_of(conv), eps, factor, (act, coef) if act else None, set())


def _op_train(
    x: torch.Tensor,
    w: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor,
    z: torch.Tensor | None,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    conv: list[int],
    params: list[float],
    act: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    ready()
    blk = _block(conv, params, act)
    running = None if running_mean is None else (running_mean, running_var)
    zd = None if z is None else dense(z)
    out, (_, yc, mean, invstd, _y, reserve) = block_forward(
        dense(x), w, None, gamma, beta, zd, running, blk, strict=True
    )
    if reserve is None:
        reserve = x.new_empty(0, dtype=torch.uint8)
    return out, yc, mean, invstd, reserve


def _op_train_fake(x, w, gamma, beta, z, running_mean, running_var, conv, params, act):
    blk = _block(conv, params, act)
    x = dense(x)
    yc = like(conv_out_shape(x, w, blk.cfg), x)
    n = chain_path(yc, gamma.dtype, blk.act, z is not None)[1]
    reserve = x.new_empty(n, dtype=torch.uint8)
    return torch.empty_like(yc), yc, torch.empty_like(gamma), torch.empty_like(gamma), reserve


def _op_grad(
    dy: torch.Tensor,
    saved: list[torch.Tensor],
    conv: list[int],
    params: list[float],
    act: str,
    flags: list[int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    ready()
    blk = _block(conv, params, act)
    has_z, need_dx, need_dw = (bool(f) for f in flags[:3])
    yc = saved[2]
    path = chain_path(yc, saved[3].dtype, blk.act, has_z)[0]  # as the forward decided
    dx, dw, _dyc, dgamma, dbeta, dz = block_backward(
        dy, tuple(saved), blk, path, (need_dx, need_dw, has_z)
    )
    if dz is not None and (dz is dy or dz.stride() != yc.stride()):
        dz = torch.empty_like(yc).copy_(dz)  # a new tensor in the layout the fake gives
    return (
        yc.new_empty(0) if dx is None else dx,  # one new empty each: outputs may not alias
        yc.new_empty(0) if dw is None else dw,
        yc.new_empty(0),  # the traced chains have no convolution bias
        dgamma,
        dbeta,
        yc.new_empty(0) if dz is None else dz,
    )


def _op_grad_fake(dy, saved, conv, params, act, flags):
    x, w, yc, gamma = saved[:4]
    return (
        torch.empty_like(x) if flags[1] else yc.new_empty(0),
        torch.empty_like(w) if flags[2] else yc.new_empty(0),
        yc.new_empty(0),
        torch.empty_like(gamma),
        torch.empty_like(gamma),
        torch.empty_like(yc) if flags[0] else yc.new_empty(0),
    )


#: ``pycudnn::conv_bn_train(x, w, gamma, beta, z?, running_mean?, running_var?, conv, [eps,
#: factor, coef], act) -> (out, conv_out, mean, invstd, reserve)``: :func:`block_forward`
#: (the running averages updated in place; its gradient: :class:`TrainFn`)
op_block_train = define(
    "conv_bn_train", _op_train, _op_train_fake, mutates=("running_mean", "running_var")
)
#: ``pycudnn::conv_bn_train_grad(dy, saved, conv, params, act, [has_z, need_dx, need_dw, 0]) ->
#: (dx, dw, dcb, dgamma, dbeta, dz)`` (empty tensors for what was not wanted; dcb always, as the
#: traced chains have no convolution bias): :func:`block_backward`
op_block_grad = define("conv_bn_train_grad", _op_grad, _op_grad_fake)


def op_lists(blk: TrainBlock) -> tuple[list[int], list[float], str]:
    """*blk* as the custom ops' ``(conv, params, act)`` arguments."""
    name, coef = ("", 0.0) if blk.act is None else blk.act
    return cfg_list(blk.cfg), [float(blk.eps), float(blk.factor), float(coef or 0.0)], name


def _eager_grad(path: str, blk: TrainBlock, dy, saved, _conv, _params, _act, flags) -> tuple:
    """:data:`op_block_grad`'s eager twin for a node that ran eagerly: the path its forward
    took (*path*) and its *blk* kept, instead of their list forms."""
    has_z, need_dx, need_dw, need_dcb = (bool(f) for f in flags)
    dx, dw, dyc, dgamma, dbeta, dz = block_backward(
        dy, tuple(saved), blk, path, (need_dx, need_dw, has_z)
    )
    dcb = dyc.sum(dim=(0, *range(2, dyc.dim()))) if need_dcb else None
    return dx, dw, dcb, dgamma, dbeta, dz


class TrainFn(torch.autograd.Function):
    """The chain as one autograd node, eager and under ``torch.compile`` alike. Eager, the
    forward is :func:`block_forward`; traced (*lists* given), :data:`op_block_train` (a mutating
    op, which ``torch.library`` gives no autograd formula, so dynamo traces this Function around
    it). Its one backward is :func:`block_backward` through :func:`~._compile.gradient`
    (:data:`op_block_grad` where it is traced)."""

    @staticmethod
    def forward(ctx, x, w, cb, gamma, beta, z, running_mean, running_var, blk, lists):
        if lists is None:
            running = None if running_mean is None else (running_mean, running_var)
            out, (path, yc, mean, invstd, y, reserve) = block_forward(
                x, w, cb, gamma, beta, z, running, blk
            )
            ctx.lists = (None, None, None)
        else:  # (the traced chains have no convolution bias)
            out, yc, mean, invstd, reserve = op_block_train(
                x, w, gamma, beta, z, running_mean, running_var, *lists
            )
            path, y, ctx.lists = SEPARATE, out, lists
        ctx.save_for_backward(x, w, yc, gamma, beta, mean, invstd, y, reserve)
        ctx.blk, ctx.path = blk, path
        ctx.has_z, ctx.has_cb = z is not None, cb is not None
        return out

    @staticmethod
    def backward(ctx, dy):
        need = ctx.needs_input_grad
        flags = [int(ctx.has_z), int(need[0]), int(need[1]), int(ctx.has_cb and need[2])]
        # a node that ran the ops (traced, or applied so in a test) has no block: the op's body
        if ctx.blk is None:
            eager, grad = _op_grad, gradient
        else:
            eager, grad = partial(_eager_grad, ctx.path, ctx.blk), eager_gradient
        saved = list(ctx.saved_tensors)
        dx, dw, dcb, dgamma, dbeta, dz = grad(op_block_grad, eager, dy, saved, *ctx.lists, flags)
        return (
            dx if need[0] else None,
            dw if need[1] else None,
            dcb if flags[3] else None,
            dgamma,
            dbeta,
            dz if ctx.has_z else None,
            None,
            None,
            None,
            None,
        )
