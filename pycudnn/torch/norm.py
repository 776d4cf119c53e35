"""Layer and RMS normalization (imports torch): ``LayerNorm`` and ``RMSNorm`` on
``dnn_layer_norm`` / ``dnn_rms_norm`` and their ``_grad``s, and the ``autograd.Function`` s over
them."""

from __future__ import annotations

from collections.abc import Callable
from threading import get_ident
from typing import Any

import torch
from torch import nn

from ..graph import _plans
from ..highlevel import _call, dnn_layer_norm, dnn_layer_norm_grad, dnn_rms_norm, dnn_rms_norm_grad
from . import _binding, _lean
from ._compile import PLAIN, compiling, define, differentiable
from ._module import STATE, Converted, float_params, state
from ._runtime import (
    FIRST_USE,
    NORM_FLOATS,
    autocast_dtype,
    cuda_ok,
    dense,
    no_broadcast,
    raw_stream,
    ready,
    stream_of,
    to_torch,
    transforming,
)

__all__ = [
    "LayerNorm",
    "LayerNormFn",
    "RMSNorm",
    "RMSNormFn",
    "layer_norm_grad_outputs",
    "layer_norm_grad_run",
    "layer_norm_outputs",
    "layer_norm_run",
    "norm_forward",
    "op_layer_norm",
    "op_layer_norm_grad",
    "op_rms_norm",
    "op_rms_norm_grad",
    "rms_norm_run",
]


_LN, _LN_GRAD, _RMS, _RMS_GRAD = "layer_norm", "layer_norm_grad", "rms_norm", "rms_norm_grad"


def _ln_slow(x, shape, w, b, eps, grad, y, mean, inv, s) -> None:
    dnn_layer_norm(x, shape, w, b, eps, training=grad, out=y, out_mean=mean, out_invstd=inv,
                   stream=s)  # fmt: skip


def _ln_grad_slow(dy, x, mean, inv, shape, w, grads, s) -> None:
    dnn_layer_norm_grad(dy, x, mean, inv, shape, w, out_grads=grads, stream=s)


def _rms_slow(x, shape, w, eps, grad, y, inv, s) -> None:
    dnn_rms_norm(x, shape, w, eps, training=grad, out=y, out_invrms=inv, stream=s)


def _rms_grad_slow(dy, x, inv, shape, w, grads, s) -> None:
    dnn_rms_norm_grad(dy, x, inv, shape, w, out_grads=grads, stream=s)


def layer_norm_outputs(x: torch.Tensor, shape: Any, grad: bool) -> tuple:
    """A layer norm call's new outputs as the lean path lays them out (a bound entry launches on
    exactly that layout): ``(y, mean, invstd)`` for the training phase (*grad*), else ``(y,)``."""
    y = _out(x)
    return (y, _stats(x, shape, True), _stats(x, shape, True)) if grad else (y,)


def layer_norm_run(x, w, b, shape, eps, grad) -> tuple[torch.Tensor, Any, Any]:
    """``(y, mean, invstd)`` of ``dnn_layer_norm`` (the statistics None unless *grad*). With
    both parameters given every output is allocated here and the call is bound to its
    signature (:mod:`._lean`); without one, the public function's stand-ins run it."""
    ready()
    s = stream_of(x)
    if w is None or b is None:
        y = _out(x)
        _, mean, inv = dnn_layer_norm(x, shape, w, b, eps, training=grad, out=y, stream=s)
        return y, (to_torch(mean) if grad else None), (to_torch(inv) if grad else None)
    outs = layer_norm_outputs(x, shape, grad)
    y, mean, inv = outs if grad else (outs[0], None, None)
    _lean.launch_fresh((_LN, shape, eps, grad), (x, w, b), outs, s, _ln_slow, x, shape, w, b,
                       eps, grad, y, mean, inv, s)  # fmt: skip
    return y, mean, inv


def rms_norm_run(x, w, shape, eps, grad) -> tuple[torch.Tensor, Any]:
    """``(y, invrms)`` of ``dnn_rms_norm`` (invrms None unless *grad*), bound to its signature
    as :func:`layer_norm_run` (with a weight)."""
    ready()
    y = _out(x)
    s = stream_of(x)
    if w is None:
        _, inv = dnn_rms_norm(x, shape, w, eps, training=grad, out=y, stream=s)
        return y, (to_torch(inv) if grad else None)
    inv = _stats(x, shape, True) if grad else None
    outs = (y, inv) if grad else (y,)
    _lean.launch_fresh((_RMS, shape, eps, grad), (x, w), outs, s, _rms_slow, x, shape, w, eps,
                       grad, y, inv, s)  # fmt: skip
    return y, inv


def _out(x: torch.Tensor) -> torch.Tensor:
    """An empty packed tensor of *x*'s shape, dtype and device: ``empty_like`` for a packed
    *x* (no keyword parsing: about half of ``torch.empty``'s host time)."""
    if x.is_contiguous():
        return torch.empty_like(x)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


# -- torch.compile: the four calls as pycudnn:: custom ops -----------------------------------------
_NONE = (0,)  # the shape standing for an absent output (the schema has no optional outputs)


def _tt(a: Any, like_t: torch.Tensor | None = None) -> torch.Tensor:
    """*a* as a packed torch tensor (an empty float32 one for None; *like_t*'s dtype and
    device then): the layout the fakes give."""
    if a is None:
        ref = like_t
        dev = None if ref is None else ref.device
        return torch.empty(_NONE, dtype=torch.float32, device=dev)
    return to_torch(a).contiguous()


def _stats(x: torch.Tensor, shape: Any, training: bool) -> torch.Tensor:
    """An empty float32 statistic of *x* normalized over its trailing ``len(shape)`` dims:
    ``(*lead, 1, ..., 1)`` as the high level lays it out (``(0,)``, an absent output, unless
    *training*)."""
    n = len(shape)
    dims = (*x.shape[: x.dim() - n], *(1,) * n) if training else _NONE
    return torch.empty(dims, dtype=torch.float32, device=x.device)


def _grad_of(p: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    if p is None:
        return torch.empty(_NONE, dtype=torch.float32, device=x.device)
    return torch.empty(p.shape, dtype=p.dtype, device=p.device)


def _op_ln(
    x: torch.Tensor,
    w: torch.Tensor | None,
    b: torch.Tensor | None,
    shape: list[int],
    eps: float,
    training: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y, mean, invstd = layer_norm_run(x, w, b, tuple(shape), eps, training)
    if mean is None:  # the inference phase keeps no statistics
        mean, invstd = _stats(x, shape, False), _stats(x, shape, False)
    return y, mean, invstd


def _op_ln_fake(x, w, b, shape, eps, training):
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return y, _stats(x, shape, training), _stats(x, shape, training)


def layer_norm_grad_run(
    dy: torch.Tensor,
    x: torch.Tensor,
    mean: torch.Tensor,
    invstd: torch.Tensor,
    shape: list[int],
    w: torch.Tensor | None,
    b: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if FIRST_USE[0]:  # the first use only (no call on the hot path)
        ready()
    dy, shape = dense(dy), tuple(shape)
    s = stream_of(dy)
    if w is not None and b is not None:  # every output given: bound to its signature
        grads = (_out(x), torch.empty_like(w), torch.empty_like(w))
        _lean.launch_fresh((_LN_GRAD, shape), (dy, x, w, mean, invstd), grads, s, _ln_grad_slow,
                           dy, x, mean, invstd, shape, w, grads, s)  # fmt: skip
        return grads
    dx, dw, db = dnn_layer_norm_grad(dy, x, mean, invstd, shape, w, stream=s)
    return _tt(dx), _tt(dw if w is not None else None, x), _tt(db if b is not None else None, x)


def _op_ln_grad_fake(dy, x, mean, invstd, shape, w, b):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device), _grad_of(w, x), _grad_of(b, x)


def _ln_setup(ctx, inputs, output) -> None:
    x, w, b, shape = inputs[:4]
    _, mean, invstd = output
    ctx.mark_non_differentiable(mean, invstd)
    ctx.save_for_backward(x, w, b, mean, invstd)
    ctx.shape = shape
    ctx.bound = inputs[6] if len(inputs) > 6 else None  # an eager call's module binding


def _ln_backward(ctx, dy, _dmean, _dinvstd):
    x, w, b, mean, invstd = ctx.saved_tensors
    args = (op_layer_norm_grad, layer_norm_grad_run, dy, x, mean, invstd, ctx.shape, w, b)
    bd = ctx.bound if type(dy) in PLAIN else None  # (compiled autograd's are not)
    if bd is None:
        dx, dw, db = ctx.gradient(*args)
    else:  # the binding's gradient entry (bound by this thread's first backward)
        ops = (dy, x, w, mean, invstd)
        dx, dw, db = _binding.backward(
            bd, 0, dy, raw_stream(bd.index), ops, layer_norm_grad_outputs, ctx.gradient, *args
        )
    need = ctx.needs_input_grad
    dw = dw if need[1] and w is not None else None
    db = db if need[2] and b is not None else None
    return (dx if need[0] else None, dw, db) + (None,) * (len(need) - 3)


def layer_norm_grad_outputs(
    _bd: Any, _dy: Any, x: torch.Tensor, w: torch.Tensor, *_stats: Any
) -> tuple:
    """A bound layer norm backward's new ``(dx, dw, db)``, as :func:`layer_norm_grad_run` makes
    them."""
    return _out(x), torch.empty_like(w), torch.empty_like(w)


def _rms_grads(_bd: Any, _dy: Any, x: torch.Tensor, w: torch.Tensor, _inv: Any) -> tuple:
    """A bound RMS norm backward's new ``(dx, dw)``, as :func:`_op_rms_grad` makes them."""
    return _out(x), torch.empty_like(w)


def _op_rms(
    x: torch.Tensor, w: torch.Tensor | None, shape: list[int], eps: float, training: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    y, invrms = rms_norm_run(x, w, tuple(shape), eps, training)
    return y, (_stats(x, shape, False) if invrms is None else invrms)


def _op_rms_fake(x, w, shape, eps, training):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device), _stats(x, shape, training)


def _op_rms_grad(
    dy: torch.Tensor,
    x: torch.Tensor,
    invrms: torch.Tensor,
    shape: list[int],
    w: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    if FIRST_USE[0]:  # the first use only (no call on the hot path)
        ready()
    dy, shape = dense(dy), tuple(shape)
    s = stream_of(dy)
    if w is not None:  # every output given: bound to its signature
        grads = (_out(x), torch.empty_like(w))
        _lean.launch_fresh((_RMS_GRAD, shape), (dy, x, w, invrms), grads, s, _rms_grad_slow, dy,
                           x, invrms, shape, w, grads, s)  # fmt: skip
        return grads
    dx, _ = dnn_rms_norm_grad(dy, x, invrms, shape, w, stream=s)
    return _tt(dx), _tt(None, x)


def _op_rms_grad_fake(dy, x, invrms, shape, w):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device), _grad_of(w, x)


def _rms_setup(ctx, inputs, output) -> None:
    x, w, shape = inputs[:3]
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(x, w, output[1])
    ctx.shape = shape
    ctx.bound = inputs[5] if len(inputs) > 5 else None  # an eager call's module binding


def _rms_backward(ctx, dy, _dinvrms):
    x, w, invrms = ctx.saved_tensors
    args = (op_rms_norm_grad, _op_rms_grad, dy, x, invrms, ctx.shape, w)
    bd = ctx.bound if type(dy) in PLAIN else None  # (compiled autograd's are not)
    if bd is None:
        dx, dw = ctx.gradient(*args)
    else:  # the binding's gradient entry (bound by this thread's first backward)
        ops = (dy, x, w, invrms)
        dx, dw = _binding.backward(
            bd, 0, dy, raw_stream(bd.index), ops, _rms_grads, ctx.gradient, *args
        )
    need = ctx.needs_input_grad
    dw = dw if need[1] and w is not None else None
    return (dx if need[0] else None, dw) + (None,) * (len(need) - 2)


def _ln_eager(x, w, b, shape, eps, training, bound=None):
    """``LayerNormFn``'s eager forward: *bound* (a module's :class:`~._binding.Binding` whose
    signature this call has) launches its entry; else :func:`_op_ln`."""
    if bound is not None:
        r = _bound_launch(bound, (x, w, b), 2)
        if r is not None:
            return r
    return _op_ln(x, w, b, shape, eps, training)


def _rms_eager(x, w, shape, eps, training, bound=None):
    """``RMSNormFn``'s eager forward, as :func:`_ln_eager`."""
    if bound is not None:
        r = _bound_launch(bound, (x, w), 1)
        if r is not None:
            return r
    return _op_rms(x, w, shape, eps, training)


#: ``LayerNormFn.apply`` (eager) and ``pycudnn::layer_norm(x, w?, b?, shape, eps, training)
#: -> (y, mean, invstd)`` (the statistics empty unless *training*): one backward
LayerNormFn, op_layer_norm = differentiable(
    "layer_norm",
    _op_ln,
    _op_ln_fake,
    _ln_setup,
    _ln_backward,
    eager_run=_ln_eager,
    stats_outputs=2,
)
#: ``pycudnn::layer_norm_grad(dy, x, mean, invstd, shape, w?, b?) -> (dx, dw, db)`` (empty for
#: an absent parameter)
op_layer_norm_grad = define("layer_norm_grad", layer_norm_grad_run, _op_ln_grad_fake)
#: ``RMSNormFn.apply`` (eager) and ``pycudnn::rms_norm(x, w?, shape, eps, training) -> (y,
#: invrms)``: one backward
RMSNormFn, op_rms_norm = differentiable(
    "rms_norm",
    _op_rms,
    _op_rms_fake,
    _rms_setup,
    _rms_backward,
    eager_run=_rms_eager,
    stats_outputs=1,
)
#: ``pycudnn::rms_norm_grad(dy, x, invrms, shape, w?) -> (dx, dw)``
op_rms_norm_grad = define("rms_norm_grad", _op_rms_grad, _op_rms_grad_fake)


def norm_forward(m: nn.Module, x: torch.Tensor, rms: bool, fallback: Callable) -> Any:
    """Layer (or, *rms*, RMS) normalization on cuDNN for CUDA inputs it takes, else *fallback*.

    A call with the signature of the module's binding (:mod:`._binding`) is its one launch;
    any other call checks everything here and, where it ran as one lean launch, binds anew."""
    # (dynamo must not read the side table: it would guard on the weak dict's contents)
    st = None if compiling() else STATE.get(m)
    if st is not None:
        bound = st.get("bound")
        if bound:
            y = _bound_forward(m, x, rms, bound)
            if y is not None:
                return y
    ns = tuple(m.normalized_shape)  # type: ignore[attr-defined]
    w0 = w = m.weight  # type: ignore[attr-defined]
    b0 = b = None if rms else m.bias  # type: ignore[attr-defined]
    eps = m.eps  # type: ignore[attr-defined]
    if not cuda_ok(x, NORM_FLOATS) or x.dim() <= len(ns) or x.numel() == 0:
        return fallback(x)
    ac = autocast_dtype()
    if ac is not None:
        if rms:  # autocast's own rule for RMS norm: torch's
            return fallback(x)
        # layer norm is on autocast's float32 list: computed in float32, as torch does
        x = x.float()
        w = None if w is None else w.float()
        b = None if b is None else b.float()
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
        if p is not None and (not cuda_ok(p, pdts) or p.device != x.device):
            return fallback(x)
    if w is not None and b is not None and b.dtype != w.dtype:
        return fallback(x)
    x0 = x
    x = x if x.is_contiguous() else no_broadcast(x)
    grad = torch.is_grad_enabled() and (
        x.requires_grad
        or (w is not None and w.requires_grad)
        or (b is not None and b.requires_grad)
    )
    # (parameters are contiguous nearly always: is_contiguous is the cheap question)
    if w is not None and not w.is_contiguous():
        w = w.contiguous()
    if b is not None and not b.is_contiguous():
        b = b.contiguous()
    if compiling():
        if rms:
            return op_rms_norm(x, w, list(ns), float(eps), grad)[0]
        return op_layer_norm(x, w, b, list(ns), float(eps), grad)[0]
    eps = float(eps)
    ins = (x, w) if rms else (x, w, b)
    if grad:
        run: Callable = RMSNormFn.apply if rms else LayerNormFn.apply
    else:
        run = rms_norm_run if rms else layer_norm_run
    args = (*ins, ns, eps, grad)
    # bindable: one lean launch on the module's own tensors (no cast, copy or stand-in)
    if ac is not None or w is None or w is not w0 or b is not b0 or x is not x0 or (
        not rms and b is None) or (st is not None and st.get("nobind")):  # fmt: skip
        return run(*args)[0]
    sig = _norm_sig(m, x, w, b, grad)
    out, entry = _binding.record(run, ins, *args)
    if entry is not None:
        dims = (*x.shape[: x.dim() - len(ns)], *(1,) * len(ns))
        _binding.keep(state(m), sig, entry, x.get_device(), (dims, x.device, ns, eps))
    return out[0]


def _norm_sig(m: nn.Module, x: torch.Tensor, w: torch.Tensor, b: Any, grad: bool) -> tuple:
    """A norm call's signature (:mod:`._binding`): what :func:`norm_forward`'s checks and the
    lean key read of the input, the parameters and the module, the mode, the thread."""
    return (
        type(x), x.shape, x.stride(), x.dtype, x.get_device(), x.data_ptr() & 15,
        type(w), w.shape, w.stride(), w.dtype, w.get_device(), w.data_ptr() & 15,
        None if b is None else (
            type(b), b.shape, b.stride(), b.dtype, b.get_device(), b.data_ptr() & 15),
        grad, m.eps, m.normalized_shape, _call.snapshot(), _plans.stats.clears, get_ident(),
    )  # fmt: skip


def _plain(x: Any, w: Any, b: Any) -> bool:
    """*x*, *w* and *b* (None or) plain tensors outside ``torch.func`` transforms: the ones a
    signature may read pointers of."""
    return (
        type(x) in PLAIN and type(w) in PLAIN and (b is None or type(b) in PLAIN)
        and not transforming()
    )  # fmt: skip


def _bound_forward(m: nn.Module, x: torch.Tensor, rms: bool, bound: Any) -> Any:
    """The module's bound call for *x* when this call has the signature of one of its
    bindings (*bound*), else None (then :func:`norm_forward` goes its own way)."""
    if autocast_dtype() is not None:  # (never called while dynamo traces: see the caller)
        return None
    p = m._parameters
    w = p["weight"]
    b = None if rms else p["bias"]
    if w is None or (b is None and not rms) or not _plain(x, w, b):
        return None
    grad = torch.is_grad_enabled() and (
        x.requires_grad or w.requires_grad or (b is not None and b.requires_grad)
    )
    bd = _binding.find(bound, _norm_sig(m, x, w, b, grad))
    if bd is None:
        return None
    if grad:
        ns, eps = bd.meta[2], bd.meta[3]
        if rms:
            return RMSNormFn.apply(x, w, ns, eps, True, bd)[0]
        return LayerNormFn.apply(x, w, b, ns, eps, True, bd)[0]
    r = _bound_launch(bd, (x, w) if rms else (x, w, b), 0)
    return None if r is None else r[0]


def _bound_launch(bd: Any, ins: tuple, stats: int) -> tuple | None:
    """``(y, *statistics)`` of the binding's launch on *ins* (*stats* float32 statistics: 2
    for a layer norm's training call, 1 for an RMS norm's, 0 without a gradient), laid out as
    the lean path lays them out; None where it could not launch. Counts the hit."""
    dims, dev = bd.meta[:2]
    st = [torch.empty(dims, dtype=torch.float32, device=dev) for _ in range(stats)]
    outs = (_out(ins[0]), *st)
    if not _binding.launch(bd.entry, ins, outs, raw_stream(bd.index)):
        return None
    bd.hits += 1
    return outs


class _NormRule(Converted):
    """The norms' rule: float16, bfloat16 or float32 parameters."""

    @classmethod
    def unsupported(cls, module: nn.Module) -> str | None:
        return float_params(module, NORM_FLOATS)


class LayerNorm(_NormRule, nn.LayerNorm):
    """``torch.nn.LayerNorm`` on ``dnn_layer_norm`` / ``dnn_layer_norm_grad``
    (``elementwise_affine=False`` and ``bias=False`` included).

    Float16, bfloat16 and float32 inputs, the parameters in the input's dtype or float32 (the
    output in the input's dtype, as torch's); cuDNN's inference phase (no statistics kept) when
    no gradient is wanted; inside ``torch.autocast`` in float32 (autocast's rule for layer norm).
    Other inputs (CPU, float64) run torch's ``forward``.
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.LayerNorm.forward``."""
        return norm_forward(self, input, False, super().forward)


if hasattr(nn, "RMSNorm"):

    class RMSNorm(_NormRule, nn.RMSNorm):
        """``torch.nn.RMSNorm`` on ``dnn_rms_norm`` / ``dnn_rms_norm_grad``.

        ``eps=None`` is the input dtype's machine epsilon, as in torch. Float16, bfloat16 and
        float32 inputs with parameters of the same dtype (torch promotes mixed dtypes); other
        inputs (CPU, float64, mixed) and autocast regions run torch's ``forward``.
        """

        def forward(self, input: torch.Tensor) -> torch.Tensor:
            """As ``torch.nn.RMSNorm.forward``."""
            return norm_forward(self, input, True, super().forward)

else:  # torch < 2.4 has no torch.nn.RMSNorm

    class _RMSNormStandIn(nn.Module):
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

    # bound by name, not by a second ``class RMSNorm``: type checkers and the API reference
    # (griffe) then know the one class above, the one a current PyTorch gets
    _RMSNormStandIn.__name__ = _RMSNormStandIn.__qualname__ = "RMSNorm"
    globals()["RMSNorm"] = _RMSNormStandIn
