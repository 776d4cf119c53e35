"""The implementation of :mod:`pycudnn.torch` (imports torch; the public names are there):
the modules and :func:`convert`.

Each supported ``torch.nn`` module has a subclass here whose ``forward`` calls an
``autograd.Function`` of :mod:`pycudnn._torch_autograd` for CUDA tensors of the dtypes the
operation takes, and torch's own ``forward`` otherwise; :func:`scaled_dot_product_attention`
does the same for ``torch.nn.functional.scaled_dot_product_attention``. The subclasses add no
state to the module: what they cache (RNN blocks and layouts, dropout pools, constant scale/bias
vectors) lives in a side table keyed weakly by the module, so ``convert`` can swap a module's class
in place and back, and ``copy.deepcopy`` / ``torch.save`` see a plain module.
"""

from __future__ import annotations

import math
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from . import _torch_autograd as fn
from ._torch_autograd import TorchMemoryResource, to_torch, use_torch_allocator
from .highlevel import RNNBlock
from .highlevel.rnn_layout import GATES, PROJ_ID, RNNLayout

__all__ = [
    "ELU",
    "GRU",
    "LSTM",
    "RNN",
    "SiLU",
    "AvgPool2d",
    "AvgPool3d",
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "Dropout",
    "Hardtanh",
    "LayerNorm",
    "LocalResponseNorm",
    "LogSoftmax",
    "MaxPool2d",
    "MaxPool3d",
    "RMSNorm",
    "ReLU",
    "ReLU6",
    "Sigmoid",
    "Softmax",
    "Tanh",
    "TorchMemoryResource",
    "convert",
    "rnn_flat_weights",
    "scaled_dot_product_attention",
    "supported_modules",
    "to_torch",
    "unsupported_reason",
    "use_torch_allocator",
]


# side table of what a converted module caches (never stored on the module itself)
_STATE: weakref.WeakKeyDictionary[nn.Module, dict[str, Any]] = weakref.WeakKeyDictionary()


def _state(m: nn.Module) -> dict[str, Any]:
    st = _STATE.get(m)
    if st is None:
        st = _STATE[m] = {}
    return st


# ==================================================================================================
# Modules
# ==================================================================================================
class _Converted:
    """Mixin of the adapter's modules: refuse construction in a configuration cuDNN cannot run
    (:func:`convert` leaves such modules unconverted instead)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        reason = unsupported_reason(self)  # type: ignore[arg-type]
        if reason is not None:
            raise ValueError(f"pycudnn.torch.{type(self).__name__}: {reason}")


def _conv_pad(m: nn.modules.conv._ConvNd, nd: int) -> tuple[int, ...] | None:
    """Symmetric padding of *m* (None: torch's 'same' would be asymmetric)."""
    pad = m.padding
    if isinstance(pad, str):
        if pad == "valid":
            return (0,) * nd
        total = [d * (k - 1) for d, k in zip(m.dilation, m.kernel_size, strict=True)]
        if any(t % 2 for t in total):
            return None
        return tuple(t // 2 for t in total)
    return tuple(pad)


def _conv_forward(m: nn.modules.conv._ConvNd, x: torch.Tensor, nd: int) -> torch.Tensor:
    w, b = m.weight, m.bias
    pad = _conv_pad(m, nd)
    if pad is None or not fn.cuda_ok(x) or x.dtype != w.dtype or m.padding_mode != "zeros":
        return m._conv_forward(x, w, b)
    unbatched = x.dim() == nd + 1
    if unbatched:
        x = x.unsqueeze(0)
    stride, dil = tuple(m.stride), tuple(m.dilation)
    if nd == 1:  # as a 2-D convolution over (N, C, 1, L)
        x2, w2 = fn.dense(x).unsqueeze(2), w.unsqueeze(2)
        y = fn.ConvFn.apply(x2, w2, b, 2, (0, *pad), (1, *stride), (1, *dil), m.groups)
        y = y.squeeze(2)
    else:
        y = fn.ConvFn.apply(fn.dense(x), w, b, nd, pad, stride, dil, m.groups)
    return y.squeeze(0) if unbatched else y


class Conv1d(_Converted, nn.Conv1d):
    """``torch.nn.Conv1d`` on ``dnn_conv`` (as a 2-D convolution over ``(N, C, 1, L)``)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.Conv1d.forward``."""
        return _conv_forward(self, input, 1)


class Conv2d(_Converted, nn.Conv2d):
    """``torch.nn.Conv2d`` on ``dnn_conv`` / ``dnn_gradinput`` / ``dnn_gradweight``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.Conv2d.forward``."""
        return _conv_forward(self, input, 2)


class Conv3d(_Converted, nn.Conv3d):
    """``torch.nn.Conv3d`` on ``dnn_conv3d`` and its gradients."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.Conv3d.forward``."""
        return _conv_forward(self, input, 3)


def _pool_forward(m: nn.Module, x: torch.Tensor, nd: int, mode: str, fallback: Callable) -> Any:
    if not fn.cuda_ok(x) or x.dim() not in (nd + 1, nd + 2):
        return fallback(x)
    ws = fn.as_tuple(m.kernel_size, nd)  # type: ignore[attr-defined]
    stride = ws if not m.stride else fn.as_tuple(m.stride, nd)  # type: ignore[attr-defined]
    pad = fn.as_tuple(m.padding, nd)  # type: ignore[attr-defined]
    unbatched = x.dim() == nd + 1
    if unbatched:
        x = x.unsqueeze(0)
    y = fn.PoolFn.apply(fn.dense(x), ws, stride, pad, mode)
    return y.squeeze(0) if unbatched else y


class MaxPool2d(_Converted, nn.MaxPool2d):
    """``torch.nn.MaxPool2d`` on ``dnn_pool(mode='max')`` (no dilation, ceil mode or indices)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.MaxPool2d.forward``."""
        return _pool_forward(self, input, 2, "max", super().forward)


class MaxPool3d(_Converted, nn.MaxPool3d):
    """``torch.nn.MaxPool3d`` on ``dnn_pool(mode='max')``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.MaxPool3d.forward``."""
        return _pool_forward(self, input, 3, "max", super().forward)


def _avg_mode(m: nn.Module) -> str:
    return "average_inc_pad" if m.count_include_pad else "average_exc_pad"  # type: ignore[attr-defined]


class AvgPool2d(_Converted, nn.AvgPool2d):
    """``torch.nn.AvgPool2d`` on ``dnn_pool`` (``average_inc_pad`` / ``average_exc_pad`` by
    ``count_include_pad``; no ceil mode or ``divisor_override``)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.AvgPool2d.forward``."""
        return _pool_forward(self, input, 2, _avg_mode(self), super().forward)


class AvgPool3d(_Converted, nn.AvgPool3d):
    """``torch.nn.AvgPool3d`` on ``dnn_pool``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.AvgPool3d.forward``."""
        return _pool_forward(self, input, 3, _avg_mode(self), super().forward)


def _bn_forward(m: nn.modules.batchnorm._BatchNorm, x: torch.Tensor, fallback: Callable) -> Any:
    m._check_input_dim(x)
    if not fn.cuda_ok(x) or x.dim() > 5:
        return fallback(x)
    pdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    c = x.shape[1]
    if m.affine:
        w, b = m.weight, m.bias
        if w.dtype != pdt:  # cuDNN's rule: float32 (float64) scale and bias; autograd casts back
            w, b = w.to(pdt), b.to(pdt)
    else:
        consts = _state(m)
        key = ("affine", x.device, pdt, c)
        wb = consts.get(key)
        if wb is None:
            wb = consts[key] = (torch.ones(c, dtype=pdt, device=x.device),
                                torch.zeros(c, dtype=pdt, device=x.device))  # fmt: skip
        w, b = wb
    x = fn.dense(x)
    factor = 0.0 if m.momentum is None else m.momentum
    if m.training and m.track_running_stats and m.num_batches_tracked is not None:
        m.num_batches_tracked.add_(1)
        if m.momentum is None:  # cumulative moving average (as torch: a host read)
            factor = 1.0 / float(m.num_batches_tracked)
    training = m.training or m.running_mean is None
    rm, rv = m.running_mean, m.running_var
    if training:
        running = None
        copy_back = False
        if m.training and rm is not None:
            if rm.dtype != pdt or not rm.is_contiguous() or not rv.is_contiguous():
                copy_back = True
                running = (rm.to(pdt).contiguous(), rv.to(pdt).contiguous())
            else:
                running = (rm, rv)
        y = fn.BNTrainFn.apply(x, w, b, running, m.eps, factor)
        if copy_back:
            rm.copy_(running[0])
            rv.copy_(running[1])
        return y
    return fn.BNEvalFn.apply(x, w, b, rm.to(pdt), rv.to(pdt), m.eps)


class BatchNorm1d(_Converted, nn.BatchNorm1d):
    """``torch.nn.BatchNorm1d`` on pycudnn's batch normalization (``'spatial'`` mode)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.BatchNorm1d.forward`` (training, eval, running statistics)."""
        return _bn_forward(self, input, super().forward)


class BatchNorm2d(_Converted, nn.BatchNorm2d):
    """``torch.nn.BatchNorm2d`` on pycudnn's batch normalization."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.BatchNorm2d.forward``."""
        return _bn_forward(self, input, super().forward)


class BatchNorm3d(_Converted, nn.BatchNorm3d):
    """``torch.nn.BatchNorm3d`` on pycudnn's batch normalization."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.BatchNorm3d.forward``."""
        return _bn_forward(self, input, super().forward)


def _act_forward(x: torch.Tensor, mode: str, coef: float, inplace: bool, fallback: Callable) -> Any:
    if not fn.cuda_ok(x) or x.dim() > 8:
        return fallback(x)
    if inplace and mode in fn.Y_ONLY:
        return fn.ActFn.apply(x, mode, coef, True)
    return fn.ActFn.apply(fn.dense(x), mode, coef, False)


class ReLU(_Converted, nn.ReLU):
    """``torch.nn.ReLU`` on ``dnn_activation('relu')`` (in place with ``inplace=True``)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.ReLU.forward``."""
        return _act_forward(input, "relu", 0.0, self.inplace, super().forward)


class Sigmoid(_Converted, nn.Sigmoid):
    """``torch.nn.Sigmoid`` on ``dnn_activation('sigmoid')``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.Sigmoid.forward``."""
        return _act_forward(input, "sigmoid", 0.0, False, super().forward)


class Tanh(_Converted, nn.Tanh):
    """``torch.nn.Tanh`` on ``dnn_activation('tanh')``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.Tanh.forward``."""
        return _act_forward(input, "tanh", 0.0, False, super().forward)


class ELU(_Converted, nn.ELU):
    """``torch.nn.ELU`` on ``dnn_activation('elu', coef=alpha)`` (``inplace`` computes out of
    place: cuDNN's ELU gradient reads the input)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.ELU.forward``."""
        return _act_forward(input, "elu", float(self.alpha), False, super().forward)


class SiLU(_Converted, nn.SiLU):
    """``torch.nn.SiLU`` on ``dnn_activation('swish', coef=1)`` (``inplace`` computes out of
    place: the gradient reads the input)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.SiLU.forward``."""
        return _act_forward(input, "swish", 1.0, False, super().forward)


class Hardtanh(_Converted, nn.Hardtanh):
    """``torch.nn.Hardtanh(0, max_val)`` on ``dnn_activation('clipped_relu', coef=max_val)``;
    other ``min_val`` are not clipped ReLUs (left unconverted)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.Hardtanh.forward``."""
        return _act_forward(input, "clipped_relu", float(self.max_val), self.inplace,
                            super().forward)  # fmt: skip


class ReLU6(_Converted, nn.ReLU6):
    """``torch.nn.ReLU6`` on ``dnn_activation('clipped_relu', coef=6)``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.ReLU6.forward``."""
        return _act_forward(input, "clipped_relu", 6.0, self.inplace, super().forward)


def _softmax_forward(m: nn.Module, x: torch.Tensor, algo: str, fallback: Callable) -> Any:
    if not fn.cuda_ok(x) or not 2 <= x.dim() <= 5:
        return fallback(x)
    return fn.SoftmaxFn.apply(fn.dense(x), algo)


class Softmax(_Converted, nn.Softmax):
    """``torch.nn.Softmax(dim=1)`` on ``dnn_softmax(mode='channel')``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.Softmax.forward``."""
        return _softmax_forward(self, input, "accurate", super().forward)


class LogSoftmax(_Converted, nn.LogSoftmax):
    """``torch.nn.LogSoftmax(dim=1)`` on ``dnn_softmax(algo='log', mode='channel')``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.LogSoftmax.forward``."""
        return _softmax_forward(self, input, "log", super().forward)


class Dropout(_Converted, nn.Dropout):
    """``torch.nn.Dropout`` on ``dnn_dropout`` / ``dnn_dropout_grad`` (float16, float32,
    float64; bfloat16 runs torch's dropout). Masks come from cuDNN's generator seeded from
    torch's, so they differ from torch's masks for the same seed."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.Dropout.forward``."""
        if not self.training or self.p == 0.0:
            return input
        if not fn.cuda_ok(input, fn.NO_BF16) or input.dim() > 8:
            return super().forward(input)
        pools = _state(self)
        pool = pools.get(("dropout", input.device))
        if pool is None:
            pool = pools[("dropout", input.device)] = fn.DropoutPool()
        keep = torch.is_grad_enabled() and input.requires_grad
        if self.inplace:
            return fn.DropoutFn.apply(input, float(self.p), pool, True, keep)
        return fn.DropoutFn.apply(input, float(self.p), pool, False, keep)


class LocalResponseNorm(_Converted, nn.LocalResponseNorm):
    """``torch.nn.LocalResponseNorm`` on ``dnn_lrn`` (odd sizes up to 16; float16, float32,
    float64)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.LocalResponseNorm.forward``."""
        if not fn.cuda_ok(input, fn.NO_BF16) or not 3 <= input.dim() <= 5:
            return super().forward(input)
        return fn.LRNFn.apply(fn.dense(input), int(self.size), float(self.alpha), float(self.beta),
                            float(self.k))  # fmt: skip


# -- layer norm, RMS norm, attention ---------------------------------------------------------------
def _norm_forward(m: nn.Module, x: torch.Tensor, rms: bool, fallback: Callable) -> Any:
    ns = tuple(m.normalized_shape)  # type: ignore[attr-defined]
    w = m.weight  # type: ignore[attr-defined]
    b = None if rms else m.bias  # type: ignore[attr-defined]
    eps = m.eps  # type: ignore[attr-defined]
    if not fn.cuda_ok(x, fn.NORM_FLOATS) or x.dim() <= len(ns) or x.numel() == 0:
        return fallback(x)
    if _autocast_dtype() is not None:  # autocast's own casting rules for norms: torch's
        return fallback(x)
    if tuple(x.shape[x.dim() - len(ns) :]) != ns:
        return fallback(x)  # torch's error message
    if eps is None:  # RMSNorm's default: the input dtype's machine epsilon, as torch
        eps = torch.finfo(x.dtype).eps
    if not eps > 0:
        return fallback(x)
    # parameters: x's dtype (RMSNorm), or x's dtype or float32 (LayerNorm: torch's mixed
    # half-input/float-parameter case, outputs in x's dtype)
    pdts = (x.dtype,) if rms else (x.dtype, torch.float32)
    for p in (w, b):
        if p is not None and (not fn.cuda_ok(p, pdts) or p.device != x.device):
            return fallback(x)
    if w is not None and b is not None and b.dtype != w.dtype:
        return fallback(x)
    x = fn.no_broadcast(x)
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, w, b))
    w = None if w is None else w.contiguous()
    if rms:
        return fn.RMSNormFn.apply(x, w, ns, float(eps), grad)
    return fn.LayerNormFn.apply(x, w, None if b is None else b.contiguous(), ns, float(eps), grad)


class LayerNorm(_Converted, nn.LayerNorm):
    """``torch.nn.LayerNorm`` on ``dnn_layer_norm`` / ``dnn_layer_norm_grad``
    (``elementwise_affine=False`` and ``bias=False`` included).

    Float16, bfloat16 and float32 inputs, the parameters in the input's dtype or float32 (the
    output in the input's dtype, as torch's); cuDNN's inference phase (no statistics kept) when
    no gradient is wanted. Other inputs (CPU, float64) and autocast regions run torch's
    ``forward``.
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.LayerNorm.forward``."""
        return _norm_forward(self, input, False, super().forward)


if hasattr(nn, "RMSNorm"):

    class RMSNorm(_Converted, nn.RMSNorm):
        """``torch.nn.RMSNorm`` on ``dnn_rms_norm`` / ``dnn_rms_norm_grad``.

        ``eps=None`` is the input dtype's machine epsilon, as in torch. Float16, bfloat16 and
        float32 inputs with parameters of the same dtype (torch promotes mixed dtypes); other
        inputs (CPU, float64, mixed) and autocast regions run torch's ``forward``.
        """

        def forward(self, input: torch.Tensor) -> torch.Tensor:
            """As ``torch.nn.RMSNorm.forward``."""
            return _norm_forward(self, input, True, super().forward)

else:  # torch < 2.4 has no torch.nn.RMSNorm

    class RMSNorm(nn.Module):  # type: ignore[no-redef]
        """Stand-in for ``torch.nn.RMSNorm``, which this PyTorch (before 2.4) lacks:
        constructing it raises ``TypeError``."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise TypeError(
                f"pycudnn.torch.RMSNorm needs torch.nn.RMSNorm (PyTorch >= 2.4); this is "
                f"PyTorch {torch.__version__}"
            )

        def forward(self, input: torch.Tensor) -> torch.Tensor:
            """Never called (the constructor raises)."""
            raise NotImplementedError


def _autocast_dtype() -> torch.dtype | None:
    """The dtype of an enclosing ``torch.autocast('cuda')`` region (None outside one)."""
    try:
        if torch.is_autocast_enabled("cuda"):
            return torch.get_autocast_dtype("cuda")
    except TypeError:  # torch < 2.4: the argument-free CUDA forms
        if torch.is_autocast_enabled():
            return torch.get_autocast_gpu_dtype()
    return None


_CAPABLE: dict[int, bool] = {}
_TENSORS = (torch.Tensor, nn.Parameter)


def _attention_capable(t: torch.Tensor) -> bool:
    """cuDNN's fused attention runs on *t*'s device (sm80 or newer), cached per device."""
    dev = t.get_device()
    ok = _CAPABLE.get(dev)
    if ok is None:
        ok = _CAPABLE[dev] = torch.cuda.get_device_capability(dev) >= (8, 0)
    return ok


def _attention_native(q: Any, k: Any, v: Any, attn_mask: Any, dropout_p: Any, enable_gqa: bool,
                      grad: bool) -> bool:  # fmt: skip
    """The call is one pycudnn's ``dnn_sdpa`` runs (else torch's function runs)."""
    if attn_mask is not None or not isinstance(dropout_p, (int, float)):
        return False
    if not 0.0 <= dropout_p < 1.0:
        return False
    if not (fn.cuda_ok(q, fn.HALVES) and fn.cuda_ok(k, fn.HALVES) and fn.cuda_ok(v, fn.HALVES)):
        return False
    if not q.dtype == k.dtype == v.dtype or not q.device == k.device == v.device:
        return False
    nd = q.dim()
    if nd < 3 or k.dim() != nd or v.dim() != nd:
        return False
    if q.shape[:-3] != k.shape[:-3] or k.shape[:-3] != v.shape[:-3]:
        return False
    hq, sq, d = q.shape[-3:]
    hk, skv, dk = k.shape[-3:]
    hv, skv2, dv = v.shape[-3:]
    if dk != d or hv != hk or skv2 != skv:
        return False
    if hq != hk and (not enable_gqa or hq % hk):  # without enable_gqa torch raises
        return False
    if d % 8 or d > 256 or dv % 8 or dv > 256:
        return False
    if not q.numel() or not k.numel() or not v.numel():
        return False
    if grad and sq == 1 and skv == 1:  # cuDNN's backward does not run S_q = S_kv = 1
        return False
    return _attention_capable(q)


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` on cuDNN's fused flash attention
    (``dnn_sdpa`` / ``dnn_sdpa_grad``), differentiable.

    Same signature and results as torch's function. pycudnn runs it for float16 and bfloat16
    CUDA tensors (one dtype, one device) of shapes ``(..., H, S, E)`` (the leading dims equal
    for query, key and value; 3-D inputs are one batch), head dims ``E`` and ``Ev`` multiples of
    8 up to 256, on an sm80 or newer GPU, without ``attn_mask``. Any strides: the usual
    ``(B, S, H, E)`` projections passed as their ``transpose(1, 2)`` views are read as they
    are, and the output is then laid out the same way (a ``(B, S, H, Ev)`` tensor's view).
    Everything else -- ``attn_mask`` tensors, float32/float64, other head dims, CPU tensors,
    tensor subclasses, ``H_q != H_k`` without ``enable_gqa`` (torch raises), a backward
    through ``S_q = S_kv = 1`` -- calls ``torch.nn.functional.scaled_dot_product_attention``.

    Parameters
    ----------
    query : torch.Tensor
        ``(..., H_q, S_q, E)``.
    key, value : torch.Tensor
        ``(..., H_k, S_kv, E)`` and ``(..., H_k, S_kv, Ev)``.
    attn_mask : torch.Tensor, optional
        Runs torch's implementation (cuDNN's path here takes no mask tensor).
    dropout_p : float
        As in torch's functional API, applied whenever > 0 (whatever a module's ``training``
        flag): pass ``dropout_p if self.training else 0.0`` from a module. The mask comes from
        cuDNN's Philox generator with a seed drawn from torch's CPU generator
        (``torch.manual_seed`` makes it reproducible; it differs from torch's mask), and the
        backward regenerates it from that seed. Each dropout call copies its seed to the
        device (a small synchronous copy).
    is_causal : bool
        Top-left aligned causal mask, as torch's.
    scale : float, optional
        Default ``1 / sqrt(E)``.
    enable_gqa : bool
        Grouped-query attention: ``H_q`` a multiple of ``H_k`` (cuDNN reads the shared key and
        value heads without repeating them; their gradients are summed over each group).

    Returns
    -------
    torch.Tensor
        ``(..., H_q, S_q, Ev)``, query's dtype.

    Notes
    -----
    Inside ``torch.autocast('cuda')`` (float16 or bfloat16) the inputs are cast to autocast's
    dtype first, as autocast casts torch's function. cuDNN's training variant runs (keeping the
    softmax statistics for the backward) when a gradient is wanted, or dropout is on; otherwise
    the inference variant. The backward is cuDNN's deterministic one when
    ``torch.are_deterministic_algorithms_enabled()``.
    """
    ac = _autocast_dtype()
    if ac in fn.HALVES and attn_mask is None:  # as autocast casts it (a lower-precision op)
        query, key, value = (
            t.to(ac) if type(t) in _TENSORS and t.is_cuda and t.dtype in fn.NORM_FLOATS else t
            for t in (query, key, value)
        )
    grad = torch.is_grad_enabled() and (
        query.requires_grad or key.requires_grad or value.requires_grad
    )
    if not _attention_native(query, key, value, attn_mask, dropout_p, enable_gqa, grad):
        kw: dict[str, Any] = {"scale": scale}
        if enable_gqa:  # torch >= 2.5
            kw["enable_gqa"] = True
        return nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask, dropout_p, is_causal, **kw
        )
    lead = query.shape[:-3]
    q, k, v = query, key, value
    if len(lead) != 1:
        q, k, v = (t.reshape(-1, *t.shape[-3:]) for t in (q, k, v))
    q, k, v = (fn.no_broadcast(t, unit_last=True) for t in (q, k, v))
    p = float(dropout_p)
    seed = int(torch.randint(0, 2**62, (1,)).item()) if p > 0.0 else None
    sc = None if scale is None else float(scale)
    out = fn.SDPAFn.apply(q, k, v, bool(is_causal), sc, p, seed, grad)
    if len(lead) != 1:
        out = out.reshape(*lead, *out.shape[1:])
    return out


# -- RNNs ------------------------------------------------------------------------------------------
_RNN_MODES = {"LSTM": "lstm", "GRU": "gru", "RNN_TANH": "rnn_tanh", "RNN_RELU": "rnn_relu"}


def _flat_pieces(layout: RNNLayout) -> list[tuple[str, int, int]]:
    """``(torch parameter name, first row, rows)`` in the order of cuDNN's weight buffer,
    adjacent row blocks of one parameter merged. Raises ``ValueError`` when the buffer is not
    these pieces back to back (a layout the adapter does not know)."""
    ngates = len(GATES[layout.mode])
    pieces: list[list] = []
    end = 0
    for s in sorted(layout.slots, key=lambda s: s.offset):
        if s.offset != end:
            raise ValueError(f"the RNN weight buffer has a gap at element {end} ({layout!r})")
        end = s.offset + s.size
        layer, direction = divmod(s.pseudo_layer, layout.num_directions)
        sfx = f"_l{layer}" + ("_reverse" if direction else "")
        if s.lin_id == PROJ_ID:
            name, row = f"weight_hr{sfx}", 0
        else:
            side, gate = divmod(s.lin_id, ngates)
            name = ("weight" if s.kind == "weight" else "bias") + ("_ih", "_hh")[side] + sfx
            row = gate * layout.hidden_size
        rows = s.shape[0]
        last = pieces[-1] if pieces else None
        if last is not None and last[0] == name and last[1] + last[2] == row:
            last[2] += rows
        else:
            pieces.append([name, row, rows])
    if end != layout.size:
        raise ValueError(f"the RNN weight buffer's slots end at {end}, not {layout.size}")
    return [(n, r, k) for n, r, k in pieces]


def rnn_flat_weights(module: nn.RNNBase, layout: RNNLayout) -> torch.Tensor:
    """cuDNN's flat weight buffer of an RNN module, on its parameters' device.

    The device-side, differentiable counterpart of
    :func:`~pycudnn.highlevel.rnn_layout.rnn_weights_from_torch`: one ``torch.cat`` of the
    parameters (whole, or row blocks of them) in the buffer's order, so the buffer's gradient
    flows back to each parameter.

    Parameters
    ----------
    module : torch.nn.LSTM, torch.nn.GRU or torch.nn.RNN
        Its parameters under PyTorch's names (``weight_ih_l0``, ...).
    layout : RNNLayout
        ``RNNBlock.layout(input_size)`` (read from cuDNN) or ``canonical_rnn_layout(...)``.

    Returns
    -------
    torch.Tensor
        1-D, ``layout.size`` elements, the parameters' dtype.

    Raises
    ------
    ValueError
        The layout's slots do not cover the buffer back to back.
    """
    parts = []
    for name, row, rows in _flat_pieces(layout):
        p = getattr(module, name)
        parts.append((p if row == 0 and rows == p.shape[0] else p[row : row + rows]).reshape(-1))
    return torch.cat(parts)


def _rnn_forward(m: nn.RNNBase, input: Any, hx: Any) -> Any:
    lstm = m.mode == "LSTM"
    if isinstance(input, nn.utils.rnn.PackedSequence) or not fn.cuda_ok(input, fn.NO_BF16):
        return _BACK[type(m)].forward(m, input, hx)
    w0 = m.weight_ih_l0
    if w0.dtype != input.dtype or not fn.cuda_ok(w0, fn.NO_BF16) or input.dim() not in (2, 3):
        return _BACK[type(m)].forward(m, input, hx)
    batched = input.dim() == 3
    h0 = c0 = None
    if hx is not None:
        h0, c0 = hx if lstm else (hx, None)
    if not batched:
        input = input.unsqueeze(0 if m.batch_first else 1)
        h0 = None if h0 is None else h0.unsqueeze(1)
        c0 = None if c0 is None else c0.unsqueeze(1)
    dropout = float(m.dropout) if m.training and m.num_layers > 1 else 0.0
    st = _state(m)
    key = ("block", input.dtype, dropout)
    block = st.get(key)
    if block is None:
        block = st[key] = RNNBlock(
            str(input.dtype)[6:], m.hidden_size, m.num_layers, _RNN_MODES[m.mode],
            direction_mode="bidirectional" if m.bidirectional else "unidirectional",
            dropout=dropout, proj_size=m.proj_size or None, batch_first=m.batch_first,
            bias=m.bias, seed=int(torch.randint(0, 2**62, (1,)).item()))  # fmt: skip
    lkey = ("pieces", input.dtype, input.shape[-1], input.get_device())
    layout = st.get(lkey)
    if layout is None:
        layout = st[lkey] = block.layout(input.shape[-1], input.get_device())
    w = rnn_flat_weights(m, layout)
    x = input.contiguous()
    h0 = None if h0 is None else h0.contiguous()
    c0 = None if c0 is None else c0.contiguous()
    grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, h0, c0, w)
    )
    track = st.setdefault("track", {})
    run = fn.RNNRun(block, track, grad or dropout > 0.0, lstm, dropout)
    y, hy, cy = fn.RNNFn.apply(run, x, h0, c0, w)
    if not batched:
        y = y.squeeze(0 if m.batch_first else 1)
        hy = hy.squeeze(1)
        cy = None if cy is None else cy.squeeze(1)
    return (y, (hy, cy)) if lstm else (y, hy)


class RNN(_Converted, nn.RNN):
    """``torch.nn.RNN`` (tanh or relu) on :class:`~pycudnn.RNNBlock`."""

    def forward(self, input: Any, hx: Any = None) -> Any:
        """As ``torch.nn.RNN.forward`` (PackedSequence input runs torch's)."""
        return _rnn_forward(self, input, hx)


class LSTM(_Converted, nn.LSTM):
    """``torch.nn.LSTM`` (``proj_size``, bidirectional, dropout) on :class:`~pycudnn.RNNBlock`."""

    def forward(self, input: Any, hx: Any = None) -> Any:
        """As ``torch.nn.LSTM.forward`` (PackedSequence input runs torch's)."""
        return _rnn_forward(self, input, hx)


class GRU(_Converted, nn.GRU):
    """``torch.nn.GRU`` on :class:`~pycudnn.RNNBlock`."""

    def forward(self, input: Any, hx: Any = None) -> Any:
        """As ``torch.nn.GRU.forward`` (PackedSequence input runs torch's)."""
        return _rnn_forward(self, input, hx)


# ==================================================================================================
# convert
# ==================================================================================================
_CLASSES: dict[type, type] = {
    nn.Conv1d: Conv1d,
    nn.Conv2d: Conv2d,
    nn.Conv3d: Conv3d,
    nn.MaxPool2d: MaxPool2d,
    nn.MaxPool3d: MaxPool3d,
    nn.AvgPool2d: AvgPool2d,
    nn.AvgPool3d: AvgPool3d,
    nn.BatchNorm1d: BatchNorm1d,
    nn.BatchNorm2d: BatchNorm2d,
    nn.BatchNorm3d: BatchNorm3d,
    nn.ReLU: ReLU,
    nn.Sigmoid: Sigmoid,
    nn.Tanh: Tanh,
    nn.ELU: ELU,
    nn.SiLU: SiLU,
    nn.Hardtanh: Hardtanh,
    nn.ReLU6: ReLU6,
    nn.Softmax: Softmax,
    nn.LogSoftmax: LogSoftmax,
    nn.Dropout: Dropout,
    nn.LocalResponseNorm: LocalResponseNorm,
    nn.RNN: RNN,
    nn.LSTM: LSTM,
    nn.GRU: GRU,
    nn.LayerNorm: LayerNorm,
}
if hasattr(nn, "RMSNorm"):  # torch >= 2.4
    _CLASSES[nn.RMSNorm] = RMSNorm
_BACK = {v: k for k, v in _CLASSES.items()}


def supported_modules() -> dict[type, type]:
    """``{torch.nn class: pycudnn.torch class}`` of every module :func:`convert` replaces."""
    return dict(_CLASSES)


def _float_params(m: nn.Module, allowed: tuple = fn.FLOATS) -> str | None:
    for name, p in m.named_parameters(recurse=False):
        if p.dtype not in allowed:
            names = ", ".join(str(a).replace("torch.", "") for a in allowed)
            return f"parameter {name} is {p.dtype}; cuDNN computes on {names}"
    return None


def unsupported_reason(module: nn.Module) -> str | None:
    """Why :func:`convert` would leave *module* unconverted (None: it converts it).

    Parameters
    ----------
    module : torch.nn.Module
        A module of a class :func:`supported_modules` lists (or its pycudnn twin).

    Returns
    -------
    str or None
    """
    base = _BACK.get(type(module), type(module))
    m: Any = module
    if base in (nn.Conv1d, nn.Conv2d, nn.Conv3d):
        if m.padding_mode != "zeros":
            return f"padding_mode={m.padding_mode!r} (cuDNN pads with zeros only)"
        if _conv_pad(m, len(m.kernel_size)) is None:
            return "padding='same' with an even dilated kernel pads asymmetrically"
        return _float_params(m)
    if base in (nn.MaxPool2d, nn.MaxPool3d):
        if m.ceil_mode:
            return "ceil_mode=True (cuDNN's output size rounds down)"
        if m.return_indices:
            return "return_indices=True (cuDNN returns no indices)"
        if any(d != 1 for d in fn.as_tuple(m.dilation, 3)):
            return f"dilation={m.dilation} (cuDNN pools without dilation)"
        return None
    if base in (nn.AvgPool2d, nn.AvgPool3d):
        if m.ceil_mode:
            return "ceil_mode=True (cuDNN's output size rounds down)"
        if m.divisor_override is not None:
            return f"divisor_override={m.divisor_override} (cuDNN divides by the window)"
        return None
    if base in (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d):
        return _float_params(m)
    if base is nn.Hardtanh:
        if m.min_val != 0 or m.max_val <= 0:
            return (
                f"Hardtanh(min_val={m.min_val}, max_val={m.max_val}) is a clipped ReLU only for "
                "min_val=0 and max_val > 0"
            )
        return None
    if base in (nn.Softmax, nn.LogSoftmax):
        if m.dim != 1:
            return f"dim={m.dim} (cuDNN's channel softmax is over dim=1)"
        return None
    if base is nn.Dropout:
        if not 0.0 <= m.p < 1.0:
            return f"p={m.p} (cuDNN's dropout takes p in [0, 1))"
        return None
    if base is nn.LocalResponseNorm:
        if m.size % 2 == 0 or not 1 <= m.size <= 16:
            return (
                f"size={m.size} (cuDNN's window matches torch's for odd sizes 1 to 15; even "
                "sizes are one channel off)"
            )
        if m.beta < 0.01 or m.k < 1e-5:
            return f"beta={m.beta}, k={m.k} (cuDNN needs beta >= 0.01 and k >= 1e-5)"
        if not all(math.isfinite(float(v)) for v in (m.alpha, m.beta, m.k)):
            return "non-finite alpha, beta or k"
        return None
    if base in (nn.RNN, nn.LSTM, nn.GRU):
        return _float_params(m, fn.NO_BF16)
    if base is nn.LayerNorm or base is getattr(nn, "RMSNorm", None):
        return _float_params(m, fn.NORM_FLOATS)
    if base in _CLASSES:
        return None
    return f"{type(module).__name__} is not a module pycudnn.torch converts"


def convert(
    model: nn.Module,
    exclude: Callable[[nn.Module], bool] | None = None,
    *,
    back: bool = False,
    strict: bool = False,
) -> nn.Module:
    """Replace, in place, the supported ``torch.nn`` modules of *model* by their pycudnn twins
    (cudnn.torch's ``cudnn.convert``); ``back=True`` undoes it.

    Each module whose class is exactly one of :func:`supported_modules` (subclasses, which may
    override ``forward``, are left alone) gets the pycudnn class: the object, its parameters,
    buffers, hooks and ``state_dict`` stay the same, only ``forward`` changes.

    Parameters
    ----------
    model : torch.nn.Module
        Converted with all its submodules (the model itself too, if it is one of them).
    exclude : callable, optional
        ``exclude(module) -> bool``: True keeps that module as it is (e.g.
        ``lambda m: isinstance(m, torch.nn.BatchNorm2d)``).
    back : bool
        Turn the pycudnn modules of *model* back into their ``torch.nn`` classes.
    strict : bool
        Raise ``ValueError`` for a supported class in a configuration cuDNN cannot run
        (:func:`unsupported_reason`); by default such a module stays as it is, with a
        ``UserWarning`` naming it and why.

    Returns
    -------
    torch.nn.Module
        *model* (converted in place).

    Raises
    ------
    ValueError
        With *strict*, naming the first module that cannot be converted and why.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"convert: model must be a torch.nn.Module, got {type(model).__name__}")
    for name, m in model.named_modules():
        where = name or "the model"
        if back:
            base = _BACK.get(type(m))
            if base is not None:
                m.__class__ = base
                _STATE.pop(m, None)
            continue
        cls = _CLASSES.get(type(m))
        if cls is None or (exclude is not None and exclude(m)):
            continue
        reason = unsupported_reason(m)
        if reason is not None:
            msg = f"pycudnn.torch.convert: {where} ({m!r}) stays a torch module: {reason}"
            if strict:
                raise ValueError(msg)
            warnings.warn(msg, UserWarning, stacklevel=2)
            continue
        m.__class__ = cls
    return model
