"""The fused modules of ``convert(model, fuse=True)`` (imports torch): a convolution with its batch
norm folded in and the activation (and a residual) as its epilogue (:class:`FusedConv`), and a
``Linear`` with its activation as the product's epilogue (:class:`FusedLinear`).

Neither owns a parameter or registers a submodule: the original modules stay registered where
they were (so ``state_dict`` keys and tensors do not change) and the fused module refers to them
through a plain tuple. Each decides per call:

* :class:`FusedConv`: batch norm in eval mode with running statistics, no gradient wanted and a
  CUDA input cuDNN takes -> one ``dnn_conv(x, w', bias=b', z=z, activation=act)`` on the lean
  path (:mod:`._lean`), ``w'``/``b'`` the batch norm folded into the convolution in float32
  (float64 for float64 data), cached until a tensor it read changes (data pointer and version
  counter). In training (batch statistics, running statistics updated) the chain is one
  autograd node, batch norm, the residual and a ReLU one cuDNN kernel where cuDNN has it
  (:mod:`.fused_train`). Otherwise -- eval with a gradient wanted (the backward needs the
  intermediate results), CPU tensors, float64 mixed with float32, an activation whose gradient
  needs its input in training, hooks -- the original modules run one after the other, exactly
  as unfused.
* :class:`FusedLinear`: no gradient wanted -> one ``dnn_matmul(x, w.T, bias, activation)``;
  with one, ``Linear`` then the activation (the backward needs the pre-activation).

An epilogue cuDNN refuses for a signature (a GELU without a runtime-fusion engine) runs unfused
for that signature from then on. Under ``torch.compile`` the fused calls are the custom ops
``pycudnn::conv_fused`` and ``pycudnn::linear_fused`` (their fakes give the real outputs' shape,
dtype and strides); eager calls go to the lean path directly.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

from .. import errors
from .._config import config
from ..highlevel import dnn_conv, dnn_conv3d, dnn_matmul
from . import _lean
from ._compile import compiling, define
from ._module import state
from ._runtime import HALVES, autocast_dtype, cuda_ok, dense, format_of, like, ready, stream_of
from .batchnorm import bn_affine, train_running
from .conv import conv_options, conv_out_shape, conv_pad
from .fused_train import (
    TRAIN_ACTS,
    TrainBlock,
    cfg_list,
    cfg_of,
    op_block_train,
    op_lists,
    train_block,
)
from .linear import TF32_DTYPES, linear_native, linear_operands

__all__ = [
    "Act",
    "Add",
    "FusedConv",
    "FusedLinear",
    "Step",
    "conv_fused_call",
    "conv_fused_into",
    "fold_bn",
    "fold_params",
    "hooked",
    "torch_act",
]

_CONV, _MM = "conv_fused", "matmul_fused"  # the lean path's tags


class Act(NamedTuple):
    """An epilogue activation: its ``dnn_conv``/``dnn_matmul`` name and parameter."""

    name: str
    coef: float | None = None

    def arg(self) -> str | tuple[str, float]:
        """The ``activation=`` argument of the high-level functions."""
        return self.name if self.coef is None else (self.name, self.coef)


def torch_act(y: torch.Tensor, act: Act | None) -> torch.Tensor:
    """*act* as torch computes it (the custom ops' path for tensors cuDNN does not take)."""
    if act is None:
        return y
    name, coef = act
    if name == "relu":
        return F.relu(y)
    if name == "clipped_relu":
        return y.clamp(0.0, coef)
    if name in ("gelu", "gelu_tanh"):
        return F.gelu(y, approximate="tanh" if name == "gelu_tanh" else "none")
    if name in ("silu", "swish"):
        return F.silu(y)
    if name == "elu":
        return F.elu(y, 1.0 if coef is None else coef)
    return torch.sigmoid(y) if name == "sigmoid" else torch.tanh(y)


class Step:
    """One original activation call, replayed on the unfused path: a module (called, hooks
    included), a function or a tensor method, with its other arguments as traced."""

    def __init__(self, kind: str, target: Any, args: tuple = (), kwargs: dict | None = None):
        self.kind, self.target, self.args, self.kwargs = kind, target, args, dict(kwargs or {})

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "call_method":
            return getattr(x, self.target)(*self.args, **self.kwargs)
        return self.target(x, *self.args, **self.kwargs)

    def __repr__(self) -> str:
        name = getattr(self.target, "__name__", None) or type(self.target).__name__
        return f"{name}" if self.kind != "call_method" else f"Tensor.{self.target}"


class Add:
    """The original residual addition (``operator.add``/``iadd``, ``torch.add``, ``Tensor.add``
    or ``add_``), replayed on the unfused path with its operands in their traced order."""

    def __init__(self, kind: str, target: Any, bn_first: bool):
        self.kind, self.target, self.bn_first = kind, target, bn_first

    def __call__(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        a, b = (y, z) if self.bn_first else (z, y)
        if self.kind == "call_method":
            return getattr(a, self.target)(b)
        return self.target(a, b)


def fold_bn(conv: nn.Module, bn: nn.Module, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """``(w', b')``: eval-mode *bn* folded into *conv* (:func:`fold_params`)."""
    return fold_params(
        conv.weight, conv.bias, bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.eps, dtype
    )


def fold_params(w, cb, gamma, beta, mean, var, eps: float, dtype: torch.dtype) -> tuple:
    """``(w', b')``: a batch norm's eval transform folded into the convolution before it,
    computed in float32 (float64 for float64 data) and rounded to *dtype* once: ``w' = w *
    gamma / sqrt(var + eps)``, ``b' = beta + (cb - mean) * gamma / sqrt(var + eps)`` (*cb*,
    *gamma*, *beta* may be None: no bias, no affine transform)."""
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    scale = torch.rsqrt(var.to(acc) + eps)
    if gamma is not None:
        scale = scale * gamma.to(acc)
    shift = -mean.to(acc)
    if cb is not None:
        shift = shift + cb.to(acc)
    bias = shift * scale
    if beta is not None:
        bias = bias + beta.to(acc)
    wf = w.to(acc) * scale.view(-1, *(1,) * (w.dim() - 1))
    return wf.to(dtype), bias.to(dtype)


def _version_of(t: torch.Tensor | None) -> Any:
    return None if t is None else (t.data_ptr(), t._version, t.device)


def _conv_slow(x, w, b, z, act, cfg, y, s) -> None:
    nd, pad, stride, dil, groups = cfg
    fwd = dnn_conv if nd == 2 else dnn_conv3d
    fwd(x, w, bias=b, activation=act, z=z, out=y, **conv_options(pad, stride, dil, groups, s))


def conv_fused_into(x, w, b, z, act: Act | None, cfg: tuple, y: torch.Tensor) -> torch.Tensor:
    """``y = act(conv(x, w) + z + b)`` (dense CUDA operands, *cfg* ``(nd, pad, stride,
    dilation, groups)``) on the lean path: the entry bound to the signature, or ``dnn_conv``
    with every output given once. The pointer order is the fused call's: x, w, bias, [z], y."""
    s = stream_of(x)
    ops = (x, w, b, y) if z is None else (x, w, b, z, y)
    a = None if act is None else act.arg()
    _lean.launch((_CONV, cfg, a), ops, s, _conv_slow, x, w, b, z, a, cfg, y, s)
    return y


def hooked(m: nn.Module) -> bool:
    """*m* has hooks (its own or global ones) that only its own call runs."""
    mm = nn.modules.module
    if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks:
        return True
    if getattr(m, "_backward_pre_hooks", None):
        return True
    return bool(mm._global_forward_hooks or mm._global_forward_pre_hooks)


def _grad_wanted(*tensors: Any) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


class FusedConv(nn.Module):
    """A ``Conv2d``/``Conv3d`` -> ``BatchNorm`` (-> residual add) (-> activation) chain of a
    traced model as one module (see the module docstring for when it runs fused).

    Parameters
    ----------
    conv, bn : torch.nn.Module
        The converted convolution and batch norm (kept registered where they are).
    act : Act or None
        The activation as an epilogue; *step* replays it unfused.
    step : Step or None
        The original activation call.
    add : Add or None
        The residual addition (``forward`` then takes the residual *z*).
    """

    def __init__(
        self, conv: nn.Module, bn: nn.Module, act: Act | None, step: Step | None, add: Add | None
    ) -> None:
        super().__init__()
        self.parts = (conv, bn, step, add)  # a tuple: nothing registered, state_dict unchanged
        self.act = act
        self.nd = len(conv.kernel_size)

    def extra_repr(self) -> str:
        conv, bn, step, add = self.parts
        chain = [type(conv).__name__, type(bn).__name__]
        chain += ["add"] if add is not None else []
        chain += [repr(step)] if step is not None else []
        return " -> ".join(chain)

    def unfused(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        """The original modules one after the other (training, gradients, fallbacks)."""
        conv, bn, step, add = self.parts
        y = bn(conv(x))
        if add is not None:
            y = add(y, z)
        return y if step is None else step(y)

    def forward(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        """``act(bn(conv(x)) [+ z])``: fused in eval mode without a gradient, one autograd node
        in training (:mod:`.fused_train`), else unfused."""
        conv, bn, _, _ = self.parts
        if bn.training or bn.running_mean is None or bn.running_var is None:
            y = self._train(x, z)
            return self.unfused(x, z) if y is None else y
        if _grad_wanted(x, z, *conv.parameters(recurse=False), *bn.parameters(recurse=False)):
            return self.unfused(x, z)
        if compiling():
            return self._compiled(x, z)
        y = self._eager(x, z)
        return self.unfused(x, z) if y is None else y

    def _cfg(self) -> tuple | None:
        conv = self.parts[0]
        pad = conv_pad(conv, self.nd)
        if pad is None or conv.padding_mode != "zeros":
            return None
        return (self.nd, pad, tuple(conv.stride), tuple(conv.dilation), conv.groups)

    def _inputs(self, x: torch.Tensor) -> torch.Tensor | None:
        """*x* in the dtype the convolution computes in (autocast's), or None: unfused."""
        w = self.parts[0].weight
        dt = autocast_dtype()
        if dt is not None and x.dtype != torch.float64:
            x = x.to(dt)
        elif x.dtype != w.dtype:
            return None
        return x if x.dim() == self.nd + 2 else None

    def _eager(self, x: torch.Tensor, z: torch.Tensor | None) -> torch.Tensor | None:
        conv = self.parts[0]
        cfg = self._cfg()
        if cfg is None or not (cuda_ok(x) and cuda_ok(conv.weight)):
            return None
        x = self._inputs(x)
        if x is None or conv.weight.device != x.device:
            return None
        x = dense(x)
        shape = conv_out_shape(x, conv.weight, cfg)
        if z is not None:
            if not cuda_ok(z) or z.dtype != x.dtype or tuple(z.shape) != shape:
                return None
            if z.device != x.device:
                return None
            z = dense(z)
        st = state(self)
        sig = (x.shape, x.stride(), x.dtype, x.device, None if z is None else z.stride())
        refused = st.setdefault("refused", set())
        if sig in refused:
            return None
        ready()
        w, b = self.folded(x.dtype, format_of(x))
        try:
            return conv_fused_into(x, w, b, z, self.act, cfg, like(shape, x))
        except errors.NotSupportedError:
            refused.add(sig)  # no engine for this epilogue here (a GELU on NCHW or float32)
            return None

    def _train(self, x: torch.Tensor, z: torch.Tensor | None) -> torch.Tensor | None:
        """The chain with the batch's statistics as one training node, or None: unfused (an
        activation whose gradient needs its input, hooks on the modules, operands cuDNN does
        not take; while compiling, a convolution with a bias). Compiled, the node is the custom
        ops (:class:`~.fused_train.TrainFn`)."""
        traced = compiling()
        args = self.train_args(x, z, traced)
        if args is None:
            return None
        x, w, cb, gamma, beta, z, running, blk, copy_back = args
        lists = op_lists(blk) if traced else None
        y = train_block(x, w, cb, gamma, beta, z, running, blk, lists)
        if copy_back:
            bn = self.parts[1]
            bn.running_mean.copy_(running[0])
            bn.running_var.copy_(running[1])
        return y

    def train_args(self, x: torch.Tensor, z: torch.Tensor | None, traced: bool = False) -> Any:
        """The training node's operands ``(x, w, conv_bias, gamma, beta, z, running, block,
        copy_back)`` (:func:`~.fused_train.block_forward`'s, cast as autocast casts and made
        dense; the batch counted in ``num_batches_tracked``), or None: the chain runs unfused
        (see :meth:`_train`). Nothing is counted when it returns None."""
        conv, bn, _, _ = self.parts
        act = self.act
        if act is not None and act.name not in TRAIN_ACTS:
            return None
        if traced and (op_block_train is None or conv.bias is not None):
            return None
        if hooked(conv) or hooked(bn):
            return None  # the unfused modules run their hooks
        cfg = self._cfg()
        if cfg is None or not (cuda_ok(x) and cuda_ok(conv.weight)):
            return None
        w, cb = conv.weight, conv.bias
        dt = autocast_dtype()
        if dt is not None and x.dtype != torch.float64:  # autocast's casts, as Conv2d's
            x, w = x.to(dt), w.to(dt)
            cb = None if cb is None else cb.to(dt)
        if x.dtype != w.dtype or (cb is not None and cb.dtype != w.dtype):
            return None
        if x.dim() != self.nd + 2 or w.device != x.device:
            return None
        x = dense(x)
        if z is not None:
            if not cuda_ok(z) or z.dtype != x.dtype or z.device != x.device:
                return None
            if tuple(z.shape) != conv_out_shape(x, w, cfg):
                return None
            z = dense(z)
        if not traced:
            ready()
        gamma, beta = bn_affine(bn, x, traced)
        running, factor, copy_back = train_running(bn, gamma.dtype)
        a = None if act is None else (act.name, act.coef or 0.0)
        # no side table while dynamo traces (it would guard on it); the ops decide by themselves
        refused = set() if traced else state(self).setdefault("refused_bn_act", set())
        blk = TrainBlock(cfg, bn.eps, factor, a, refused)
        return x, w, cb, gamma, beta, z, running, blk, copy_back

    def fold_sources(self) -> tuple[torch.Tensor | None, ...]:
        """The tensors the folded weight and bias are computed from."""
        conv, bn, _, _ = self.parts
        return (conv.weight, conv.bias, bn.weight, bn.bias, bn.running_mean, bn.running_var)

    def folded(
        self, dtype: torch.dtype, fmt: torch.memory_format
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The folded weight (in memory format *fmt*) and bias in *dtype*, cached until a
        tensor they were computed from changes (its data pointer or version counter). Inside a
        CUDA graph capture they are computed anew, in the capture, and not kept: a replay then
        folds the parameters of its moment (an in-place update between replays changes no
        version the replay could see)."""
        conv, bn, _, _ = self.parts
        capturing = conv.weight.is_cuda and torch.cuda.is_current_stream_capturing()
        key = (dtype, fmt, bn.eps, *(_version_of(t) for t in self.fold_sources()))
        st = state(self)
        hit = st.get("fold")
        if hit is not None and hit[0] == key and not capturing:
            return hit[1], hit[2]
        with torch.no_grad():
            w, b = fold_bn(conv, bn, dtype)
            w = w.contiguous(memory_format=fmt)
        if not capturing:
            st["fold"] = (key, w, b)
        return w, b

    def _compiled(self, x: torch.Tensor, z: torch.Tensor | None) -> torch.Tensor:
        conv, bn, _, _ = self.parts
        cfg = self._cfg()
        xc = self._inputs(x)
        op = op_conv_fused
        if cfg is None or xc is None or op is None:
            return self.unfused(x, z)
        w, b = fold_bn(conv, bn, xc.dtype)
        w = w.contiguous(memory_format=format_of(xc))  # the weight in x's layout, as eager's
        act = self.act or Act("")
        return op(xc, w, b, z, cfg_list(cfg), act.name, act.coef or 0.0)


def _mm_slow(a, b, bias, act, out, s) -> None:
    dnn_matmul(a, b, bias=bias, activation=act, out=out, stream=s)


def _matmul_act(x: torch.Tensor, w: torch.Tensor, b: Any, act: Act) -> torch.Tensor:
    """``act(x @ w.T + b)`` for *x* of any leading dims, one ``dnn_matmul`` on the lean path."""
    ready()
    n, k = w.shape
    x2 = x.reshape(-1, k)
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    wt = (w if w.is_contiguous() else w.contiguous()).t()
    y = torch.empty((*x.shape[:-1], n), dtype=x.dtype, device=x.device)
    y2 = y.view(-1, n)
    s = stream_of(x2)
    ops = (x2, wt, y2) if b is None else (x2, wt, b, y2)
    a = act.arg()
    _lean.launch((_MM, a), ops, s, _mm_slow, x2, wt, b, a, y2, s)
    return y


class FusedLinear(nn.Module):
    """A ``Linear`` -> activation chain of a traced model as one module: one ``dnn_matmul``
    with the bias and activation epilogue when no gradient is wanted, else the two unfused.

    Parameters
    ----------
    linear : torch.nn.Module
        The converted ``Linear`` (kept registered where it is).
    act : Act
        The activation as an epilogue.
    step : Step
        The original activation call (the unfused path).
    """

    def __init__(self, linear: nn.Module, act: Act, step: Step) -> None:
        super().__init__()
        self.parts = (linear, step)
        self.act = act

    def extra_repr(self) -> str:
        return f"{type(self.parts[0]).__name__} -> {self.parts[1]!r}"

    def unfused(self, x: torch.Tensor) -> torch.Tensor:
        """``Linear`` then the activation, as traced."""
        linear, step = self.parts
        return step(linear(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``act(linear(x))``: one product with its epilogue without a gradient, else unfused."""
        linear = self.parts[0]
        if _grad_wanted(x, linear.weight, linear.bias):
            return self.unfused(x)
        if compiling():
            op = op_linear_fused
            if op is None or x.shape[-1] != linear.weight.shape[1]:
                return self.unfused(x)
            ac = autocast_dtype()
            w, b = linear.weight, linear.bias
            if ac is not None:
                x, w = x.to(ac), w.to(ac)
                b = None if b is None else b.to(ac)
            return op(x, w, b, self.act.name)
        ops = linear_operands(x, linear.weight, linear.bias)
        st = state(self)
        refused = st.setdefault("refused", set())
        sig = None if ops is None else (ops[0].shape, ops[0].stride(), ops[0].dtype, x.device)
        if ops is None or sig in refused:
            return self.unfused(x)
        try:
            return _matmul_act(*ops, self.act)
        except errors.NotSupportedError:
            refused.add(sig)  # no engine for this epilogue here
            return self.unfused(x)


# -- torch.compile: the fused calls as custom ops ----------------------------------------------
def _op_act(act: str, coef: float) -> Act | None:
    if not act:
        return None
    return Act(act, coef if act in ("clipped_relu", "elu") else None)


def conv_fused_call(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor,
    z: torch.Tensor | None,
    conv: list[int],
    act: str,
    coef: float,
) -> torch.Tensor:
    """``act(conv(x, w) + b [+ z])`` into a new tensor (*conv* :func:`~.fused_train.cfg_list`'s
    form): the lean fused launch for CUDA operands, torch's computation where cuDNN has no
    engine for the epilogue or the tensors are not CUDA (``pycudnn::conv_fused``'s body)."""
    cfg = cfg_of(conv)
    x = dense(x)
    y = like(conv_out_shape(x, w, cfg), x)
    a = _op_act(act, coef)
    if cuda_ok(x) and cuda_ok(w) and (z is None or cuda_ok(z)):
        ready()
        try:
            return conv_fused_into(x, w, b, None if z is None else dense(z), a, cfg, y)
        except errors.NotSupportedError:
            pass  # the same computation in torch below
    nd, pad, stride, dil, groups = cfg
    r = (F.conv2d if nd == 2 else F.conv3d)(x, w, b, stride, pad, dil, groups)
    y.copy_(torch_act(r if z is None else r + z, a))
    return y


def _conv_fused_fake(x, w, b, z, conv: list[int], act: str, coef: float) -> torch.Tensor:
    x = dense(x)
    return like(conv_out_shape(x, w, cfg_of(conv)), x)


def _linear_fused_impl(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, act: str
) -> torch.Tensor:
    a = Act(act)
    ok = TF32_DTYPES if config.snapshot().allow_tf32 else HALVES
    if linear_native(x, w, b, ok):
        try:
            return _matmul_act(x, w, b, a)
        except errors.NotSupportedError:
            pass
    y = torch.empty((*x.shape[:-1], w.shape[0]), dtype=x.dtype, device=x.device)
    y.copy_(torch_act(F.linear(x, w, b), a))
    return y


def _linear_fused_fake(x, w, b, act: str) -> torch.Tensor:
    return torch.empty((*x.shape[:-1], w.shape[0]), dtype=x.dtype, device=x.device)


#: ``pycudnn::conv_fused`` / ``pycudnn::linear_fused``: the fused calls under ``torch.compile``
#: (None on a torch without custom ops: the fused modules then run unfused while compiling)
op_conv_fused = define("conv_fused", conv_fused_call, _conv_fused_fake)
op_linear_fused = define("linear_fused", _linear_fused_impl, _linear_fused_fake)
