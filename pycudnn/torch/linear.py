"""Fully connected layers (imports torch): ``Linear`` on ``dnn_matmul`` (the bias fused into the
product's graph), and the ``autograd.Function`` over it.

The route: ``Linear.forward`` -> :func:`linear_forward` -> :class:`LinearFn` -> ``dnn_matmul``,
written into a ``torch.empty`` output; the backward is two more ``dnn_matmul`` calls (the
transposed operands are strided views, not copies) and a sum for the bias.
"""

from __future__ import annotations

import contextlib
from threading import get_ident
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from .._config import config
from ..graph import _plans
from ..highlevel import _call, dnn_matmul
from . import _binding, _lean
from ._compile import PLAIN, compiling, constant, define, differentiable
from ._module import STATE, Converted, float_params, state
from ._runtime import (
    FIRST_USE,
    HALVES,
    NORM_FLOATS,
    autocast_dtype,
    cuda_ok,
    raw_stream,
    ready,
    stream_of,
    transforming,
)

__all__ = [
    "TF32_DTYPES",
    "Linear",
    "LinearFn",
    "linear_dw",
    "linear_dx",
    "linear_forward",
    "linear_native",
    "linear_operands",
    "linear_run",
    "matmul_run",
    "op_linear",
    "op_linear_dw",
    "op_linear_dx",
]

#: the dtypes cuDNN's matmul runs with ``pycudnn.config.allow_tf32`` (float32 computes in TF32)
TF32_DTYPES = (*HALVES, torch.float32)


# the lean path's tags: a product of 2-D operands as given, and the three products of a Linear
# keyed on its tensors as the module sees them (contiguous; the 2-D views made on a miss only)
_MM, _FWD, _DX, _DW = "matmul", "linear", "linear_dx", "linear_dw"


def _matrix(t: torch.Tensor) -> torch.Tensor:
    """2-D *t* as cuDNN's matmul reads it: rows or columns packed with a pitch (a transposed
    view is one), else a contiguous copy (expanded gradients' zero strides included)."""
    (m, n), (s0, s1) = t.shape, t.stride()
    if (s1 == 1 and s0 >= max(n, 1)) or (s0 == 1 and s1 >= max(m, 1)):
        return t
    return t.contiguous()


def _mm_slow(a, b, bias, out, s) -> None:
    dnn_matmul(a, b, bias=bias, out=out, stream=s)


def matmul_run(a: torch.Tensor, b: torch.Tensor, bias: Any, out: torch.Tensor) -> None:
    """``out = a @ b (+ bias)`` on the lean path (:mod:`._lean`): the entry bound to the operands'
    signature, or ``dnn_matmul`` once to bind it."""
    s = stream_of(a)
    ops = (a, b, out) if bias is None else (a, b, bias, out)
    _lean.launch(_MM, ops, s, _mm_slow, a, b, bias, out, s)


# The contiguous case's slow functions: the 2-D views the product reads. Their pointers are the
# tensors' own and their shapes and strides follow from the tensors', which the key pins.
def _fwd_slow(x, w, b, y, s) -> None:
    k = w.shape[1]
    dnn_matmul(x.reshape(-1, k), w.t(), bias=b, out=y.view(-1, w.shape[0]), stream=s)


def _dx_slow(dy, w, dx, s) -> None:
    dnn_matmul(dy.reshape(-1, w.shape[0]), w, out=dx.view(-1, w.shape[1]), stream=s)


def _dw_slow(dy, x, dw, s) -> None:
    n, k = dw.shape
    dnn_matmul(dy.reshape(-1, n).t(), x.reshape(-1, k), out=dw, stream=s)


def linear_run(x: torch.Tensor, w: torch.Tensor, b: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``y = x @ w.T + b`` (bias fused) for *x* of any leading dims; returns *y* and *x* as the
    rows the product read (*x* itself when contiguous, else a view or a copy)."""
    ready()
    n, k = w.shape
    y = torch.empty((*x.shape[:-1], n), dtype=x.dtype, device=x.device)
    if x.is_contiguous() and w.is_contiguous():  # the common case: no view made per call
        s = stream_of(x)
        ins = (x, w) if b is None else (x, w, b)
        _lean.launch_fresh(_FWD, ins, (y,), s, _fwd_slow, x, w, b, y, s)
        return y, x
    x2 = _matrix(x.reshape(-1, k))
    matmul_run(x2, _matrix(w).t(), b, y.view(-1, n))
    return y, x2


def _apply(x: torch.Tensor, w: torch.Tensor, b: Any) -> torch.Tensor:
    """:class:`LinearFn` when a gradient is wanted, else the product alone (no autograd node);
    under ``torch.compile`` the custom op."""
    if compiling():
        return op_linear(x, w, b)
    if torch.is_grad_enabled() and (
        x.requires_grad or w.requires_grad or (b is not None and b.requires_grad)
    ):
        return LinearFn.apply(x, w, b)
    return linear_run(x, w, b)[0]


def _tf32(dy: torch.Tensor) -> Any:
    """float32 reached the forward only with allow_tf32; the backward keeps that choice
    (autograd may run it on another thread, which the caller's config.override misses)."""
    return (
        config.override(allow_tf32=True) if dy.dtype == torch.float32 else contextlib.nullcontext()
    )


def _grad_launch(tag: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, slow: Any) -> None:
    """A gradient product on contiguous operands keyed as they are, float32 under TF32 (the
    forward's choice, :func:`_tf32`). *out* is keyed too: ``dx`` takes the shape the caller
    gave (``pycudnn::linear_dx``'s ``x_shape``), not one the operands fix."""
    s = stream_of(a)
    if a.dtype is torch.float32:
        with _tf32(a):
            _lean.launch(tag, (a, b, out), s, slow, a, b, out, s)
    else:
        _lean.launch(tag, (a, b, out), s, slow, a, b, out, s)


def _dx(dy: torch.Tensor, w: torch.Tensor, x_shape: Any) -> torch.Tensor:
    """:func:`linear_dx` for contiguous *dy* and *w* (keyed on them as they are)."""
    dx = torch.empty(x_shape, dtype=dy.dtype, device=dy.device)
    _grad_launch(_DX, dy, w, dx, _dx_slow)
    return dx


def _dw(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """:func:`linear_dw` for contiguous *dy* and *x* (keyed on them as they are)."""
    dw = torch.empty((dy.shape[-1], x.shape[-1]), dtype=dy.dtype, device=dy.device)
    _grad_launch(_DW, dy, x, dw, _dw_slow)
    return dw


def linear_dx(dy2: torch.Tensor, w: torch.Tensor, x_shape: Any) -> torch.Tensor:
    """``dx = dy @ w`` for the gradient's rows *dy2*, in a new tensor of the input's shape."""
    dx = torch.empty(x_shape, dtype=dy2.dtype, device=dy2.device)
    with _tf32(dy2):
        matmul_run(dy2, _matrix(w), None, dx.view(-1, w.shape[1]))
    return dx


def linear_dw(dy2: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """``dw = dy.T @ x`` for the gradient's rows *dy2* and the input's rows *x2*."""
    dw = torch.empty((dy2.shape[1], x2.shape[1]), dtype=dy2.dtype, device=dy2.device)
    with _tf32(dy2):
        matmul_run(dy2.t(), x2, None, dw)
    return dw


def _bias_grad(dy2: torch.Tensor) -> torch.Tensor:
    # dtype given: a backward run inside an autocast region would otherwise sum in float32
    return dy2.sum(0, dtype=dy2.dtype)


# -- torch.compile: pycudnn::linear and its two gradients ------------------------------------------
def _op_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return linear_run(x, w, b)[0]


def _op_linear_fake(x, w, b):
    return torch.empty((*x.shape[:-1], w.shape[0]), dtype=x.dtype, device=x.device)


def _op_dx(dy: torch.Tensor, w: torch.Tensor, x_shape: list[int]) -> torch.Tensor:
    if FIRST_USE[0]:  # the first use only (no call on the hot path)
        ready()
    if dy.is_contiguous() and w.is_contiguous():  # keyed as they are: no view per call
        return _dx(dy, w, x_shape)
    return linear_dx(_matrix(dy.reshape(-1, w.shape[0])), w, x_shape)


def _op_dx_fake(dy, w, x_shape):
    return torch.empty(x_shape, dtype=dy.dtype, device=dy.device)


def _op_dw(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if FIRST_USE[0]:  # the first use only (no call on the hot path)
        ready()
    if dy.is_contiguous() and x.is_contiguous():  # keyed as they are: no view per call
        return _dw(dy, x)
    n = dy.shape[-1]
    return linear_dw(_matrix(dy.reshape(-1, n)), _matrix(x.reshape(-1, x.shape[-1])))


def _op_dw_fake(dy, x):
    return torch.empty((dy.shape[-1], x.shape[-1]), dtype=dy.dtype, device=dy.device)


def _setup(ctx, inputs, output) -> None:
    x, w, b = inputs[:3]
    ctx.save_for_backward(x, w)
    ctx.has_bias = b is not None
    ctx.bound = inputs[3] if len(inputs) > 3 else None  # an eager call's module binding


def _backward(ctx, dy):
    x, w = ctx.saved_tensors
    need = ctx.needs_input_grad
    bd = ctx.bound if type(dy) in PLAIN else None  # (compiled autograd's are not)
    dx = dw = None
    if bd is None:
        dx = ctx.gradient(op_linear_dx, _op_dx, dy, w, list(x.shape)) if need[0] else None
        dw = ctx.gradient(op_linear_dw, _op_dw, dy, x) if need[1] else None
    else:  # the binding's gradient entries (bound by this thread's first backward)
        s = raw_stream(bd.index)
        if need[0]:
            args = (op_linear_dx, _op_dx, dy, w, list(x.shape))
            dx = _one(_binding.backward(bd, _DX, dy, s, (dy, w), _dx_out, ctx.gradient, *args))
        if need[1]:
            args = (op_linear_dw, _op_dw, dy, x)
            dw = _one(_binding.backward(bd, _DW, dy, s, (dy, x), _dw_out, ctx.gradient, *args))
    db = _bias_grad(dy.reshape(-1, w.shape[0])) if ctx.has_bias and need[2] else None
    return (dx, dw, db) + (None,) * (len(need) - 3)


def _linear_eager(x, w, b, bound=None):
    """``LinearFn``'s eager forward: *bound* (a module's :class:`~._binding.Binding` whose
    signature this call has) launches its entry; else :func:`_op_linear`."""
    if bound is not None:
        y = _bound_launch(bound, x, w, b)
        if y is not None:
            return y
    return _op_linear(x, w, b)


def _one(r: Any) -> torch.Tensor:
    """A gradient product's result: the bound launch's one output, or the tensor its own path
    returned."""
    return r[0] if type(r) is tuple else r


def _dx_out(bd: Any, dy: torch.Tensor, _w: Any) -> tuple:
    """A bound backward's new ``dx``, as :func:`_dx` makes it (the input's shape)."""
    return (torch.empty(bd.meta[0], dtype=dy.dtype, device=bd.meta[3]),)


def _dw_out(bd: Any, dy: torch.Tensor, _x: Any) -> tuple:
    """A bound backward's new ``dw``, as :func:`_dw` makes it (the weight's shape)."""
    return (torch.empty(bd.meta[2], dtype=dy.dtype, device=bd.meta[3]),)


#: ``LinearFn.apply(x, w, b)`` (eager) and ``pycudnn::linear(x, w, b?)``: :func:`linear_run`
#: (``x @ w.T + b``, any leading dims), one backward (``dx = dy @ w``, ``dw = dy.T @ x``,
#: ``db = dy`` summed over the rows)
LinearFn, op_linear = differentiable(
    "linear", _op_linear, _op_linear_fake, _setup, _backward, eager_run=_linear_eager
)
#: ``pycudnn::linear_dx(dy, w, x_shape)``: :func:`linear_dx`
op_linear_dx = define("linear_dx", _op_dx, _op_dx_fake)
#: ``pycudnn::linear_dw(dy, x)``: :func:`linear_dw`
op_linear_dw = define("linear_dw", _op_dw, _op_dw_fake)


@constant
def _allow_tf32() -> bool:
    """``pycudnn.config.allow_tf32`` as traced code reads it: once, when dynamo traces (set it
    before compiling; ``torch._dynamo.reset()`` after changing it)."""
    return bool(config.snapshot().allow_tf32)


def linear_native(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, dtypes: tuple) -> bool:
    """*x*, *w* and *b* are CUDA tensors of one dtype in *dtypes* on one device, of shapes
    ``F.linear`` takes and ``dnn_matmul`` runs (no empty operand)."""
    if not (cuda_ok(x, dtypes) and cuda_ok(w, dtypes)) or x.dim() == 0 or x.numel() == 0:
        return False
    if w.dim() != 2 or w.numel() == 0 or x.shape[-1] != w.shape[1]:
        return False  # torch's error message (or its empty result)
    same = x.dtype == w.dtype and x.device == w.device
    if b is not None:
        same = same and cuda_ok(b, dtypes) and b.dtype == x.dtype and b.device == x.device
        same = same and b.dim() == 1 and b.shape[0] == w.shape[0]
    return same


def _cast(t: torch.Tensor | None, dt: torch.dtype) -> torch.Tensor | None:
    """*t* cast to *dt* where autocast would cast it for ``F.linear`` (a floating CUDA tensor,
    float64 excepted); a differentiable ``.to``, so the gradient comes back in *t*'s dtype."""
    return t.to(dt) if t is not None and cuda_ok(t, NORM_FLOATS) else t


def linear_forward(m: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """*m*'s forward on cuDNN for CUDA inputs it takes, else ``F.linear``.

    Inside ``torch.autocast('cuda')`` the operands are cast to autocast's dtype first, as
    autocast casts ``F.linear``; the casts are part of the autograd graph, so the gradients come
    back in the parameters' dtypes. A call with the signature of the module's binding
    (:mod:`._binding`) is its one launch; another call that runs as one lean launch on the
    module's own tensors binds anew.
    """
    # (dynamo must not read the side table: it would guard on the weak dict's contents)
    st = None if compiling() else STATE.get(m)
    if st is not None:
        bound = st.get("bound")
        if bound:
            y = _bound_forward(m, x, bound)
            if y is not None:
                return y
    w, b = m.weight, m.bias
    ops = linear_operands(x, w, b)
    if ops is None:
        return F.linear(x, w, b)  # torch's (and in an autocast region autocast's)
    if (
        ops[0] is not x or ops[1] is not w or ops[2] is not b or compiling()
        or not x.is_contiguous() or not w.is_contiguous()  # (the lean path makes views)
        or (st is not None and st.get("nobind"))
    ):  # fmt: skip
        return _apply(*ops)
    sig = _linear_sig(x, w, b, _wants_grad(x, w, b))
    ins = (x, w) if b is None else (x, w, b)
    y, entry = _binding.record(_apply, ins, *ops)
    if entry is not None:
        meta = (tuple(x.shape), tuple(y.shape), tuple(w.shape), x.device)
        _binding.keep(state(m), sig, entry, x.get_device(), meta)
    return y


def _wants_grad(x: torch.Tensor, w: torch.Tensor, b: Any) -> bool:
    return torch.is_grad_enabled() and (
        x.requires_grad or w.requires_grad or (b is not None and b.requires_grad)
    )


def _linear_sig(x: torch.Tensor, w: torch.Tensor, b: Any, grad: bool) -> tuple:
    """A Linear call's signature (:mod:`._binding`): what :func:`linear_operands`' checks and
    the lean key read of the input and the parameters, the mode, ``pycudnn.config`` (TF32), the
    thread."""
    return (
        type(x), x.shape, x.stride(), x.dtype, x.get_device(), x.data_ptr() & 15,
        type(w), w.shape, w.stride(), w.dtype, w.get_device(), w.data_ptr() & 15,
        None if b is None else (
            type(b), b.shape, b.stride(), b.dtype, b.get_device(), b.data_ptr() & 15),
        grad, _call.snapshot(), _plans.stats.clears, get_ident(),
    )  # fmt: skip


def _bound_forward(m: nn.Linear, x: torch.Tensor, bound: Any) -> Any:
    """The module's bound call for *x* when this call has the signature of one of its
    bindings (*bound*), else None (then :func:`linear_forward` goes its own way)."""
    if autocast_dtype() is not None:  # (never called while dynamo traces: see the caller)
        return None
    p = m._parameters
    w, b = p["weight"], p["bias"]
    # (a tensor of another type -- a subclass, a fake one -- or under a torch.func transform
    # may have no pointer)
    if (
        w is None
        or type(x) not in PLAIN
        or type(w) not in PLAIN
        or (b is not None and type(b) not in PLAIN)
        or transforming()
    ):
        return None
    grad = _wants_grad(x, w, b)
    bd = _binding.find(bound, _linear_sig(x, w, b, grad))
    if bd is None:
        return None
    if grad:
        return LinearFn.apply(x, w, b, bd)
    return _bound_launch(bd, x, w, b)


def _bound_launch(bd: Any, x: torch.Tensor, w: torch.Tensor, b: Any) -> torch.Tensor | None:
    """``y`` of the binding's product on *x*, *w* (and *b*), laid out as :func:`linear_run`
    lays it out; None where it could not launch. Counts the hit."""
    y = torch.empty(bd.meta[1], dtype=x.dtype, device=bd.meta[3])
    ins = (x, w) if b is None else (x, w, b)
    if not _binding.launch(bd.entry, ins, (y,), raw_stream(bd.index)):
        return None
    bd.hits += 1
    return y


def linear_operands(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> tuple | None:
    """``(x, w, b)`` as cuDNN's product takes them -- cast to autocast's dtype inside
    ``torch.autocast('cuda')``, as autocast casts ``F.linear`` -- or None where ``F.linear``
    runs (float32 needs ``pycudnn.config.allow_tf32``; see :func:`linear_native`)."""
    ac = autocast_dtype()
    if ac is None:
        tf32 = _allow_tf32() if compiling() else config.snapshot().allow_tf32
        return (x, w, b) if linear_native(x, w, b, TF32_DTYPES if tf32 else HALVES) else None
    if ac in HALVES:
        xc, wc, bc = (_cast(t, ac) for t in (x, w, b))
        return (xc, wc, bc) if linear_native(xc, wc, bc, (ac,)) else None
    return None


class _LinearRule(Converted):
    """The fully connected layer's rule: floating-point parameters."""

    @classmethod
    def unsupported(cls, module: nn.Module) -> str | None:
        return float_params(module)


class Linear(_LinearRule, nn.Linear):
    """``torch.nn.Linear`` on ``dnn_matmul``: ``x @ weight.T + bias`` with the bias fused into
    the product, any leading dims, and its gradients (``dx = dy @ weight``,
    ``dweight = dy.T @ x``, ``dbias = dy`` summed over the rows).

    float16 and bfloat16 inputs with parameters of the same dtype run on cuDNN. float32 runs on
    cuDNN only with ``pycudnn.config.allow_tf32``: cuDNN's float32 matmul engines compute in
    TF32 (10-bit mantissas), which torch does not use for float32 by default; without the flag
    torch's ``F.linear`` runs, with torch's own precision. Inside ``torch.autocast('cuda')``
    (float16 or bfloat16) the input and parameters are cast to autocast's dtype, as autocast
    does for ``F.linear``, and the product runs on cuDNN in that dtype; the gradients come back
    in the parameters' dtypes. float64, CPU tensors, mismatched dtypes or devices and empty
    inputs run torch's ``F.linear``.
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As ``torch.nn.Linear.forward``."""
        return linear_forward(self, input)
