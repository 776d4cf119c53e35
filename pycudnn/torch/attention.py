"""Attention (imports torch): :func:`scaled_dot_product_attention`, torch's function of that
name on ``dnn_sdpa`` / ``dnn_sdpa_grad`` (cuDNN's fused flash attention), and the
``autograd.Function`` over them. What cuDNN's path does not run calls torch's function."""

from __future__ import annotations

import threading
from threading import get_ident
from typing import Any

import torch
from torch import nn

from .._config import parse_bool
from ..graph import _plans
from ..highlevel import _call, dnn_sdpa, dnn_sdpa_grad
from ..highlevel._checks import real
from . import _binding, _lean
from ._compile import PLAIN, compiling, constant, define, differentiable
from ._runtime import (
    FIRST_USE,
    HALVES,
    NORM_FLOATS,
    autocast_dtype,
    cuda_ok,
    no_broadcast,
    raw_stream,
    ready,
    stream_of,
    to_torch,
)

__all__ = [
    "BOUND_MAX",
    "SDPAFn",
    "attention_out",
    "attention_sig",
    "bound_attention",
    "bound_count",
    "cudnn_attention",
    "op_sdpa",
    "op_sdpa_grad",
    "scaled_dot_product_attention",
    "sdpa_grad_outputs",
    "sdpa_grad_run",
    "sdpa_outputs",
    "sdpa_run",
]


_FUNC = "pycudnn.torch.scaled_dot_product_attention"


def attention_out(q: torch.Tensor, dv: int) -> torch.Tensor:
    """An empty ``(B, H, S_q, dv)`` output in *q*'s memory order: the ``transpose(1, 2)`` view of
    a ``(B, S_q, H, dv)`` tensor when q is such a view (heads inside sequence), else packed."""
    b, h, s, _ = q.shape
    if h > 1 and s > 1 and q.stride(1) < q.stride(2):
        return torch.empty((b, s, h, dv), dtype=q.dtype, device=q.device).transpose(1, 2)
    return torch.empty((b, h, s, dv), dtype=q.dtype, device=q.device)


_FWD, _BWD = "sdpa", "sdpa_grad"  # the lean path's tags


def sdpa_outputs(q: torch.Tensor, dv: int, grad: bool) -> tuple:
    """A mask-free call's new outputs as the lean path lays them out (a bound entry launches on
    exactly that layout): ``(out, stats)`` for the training variant (*grad*), else ``(out,)``."""
    out = attention_out(q, dv)
    if not grad:
        return (out,)
    b, h, sq = q.shape[:3]
    return out, torch.empty((b, h, sq, 1), dtype=torch.float32, device=q.device)


def _forward_slow(q, k, v, causal, scale, out, stats, s) -> None:
    dnn_sdpa(q, k, v, None, causal, scale, 0.0, None, stats is not None, out=out,
             out_stats=stats, stream=s)  # fmt: skip


def _backward_slow(ops, causal, scale, det, grads, s) -> None:
    dnn_sdpa_grad(*ops, None, causal, scale, deterministic=det, out_grads=grads, stream=s)


def sdpa_run(q, k, v, mask, causal, scale, p, seed, grad) -> tuple[torch.Tensor, Any]:
    """``(out, stats)`` of ``dnn_sdpa`` (stats None unless *grad*): cuDNN's training variant
    when a gradient is wanted or dropout is on, else the inference variant. Without a mask or
    dropout (a causal LLM's attention) the call takes the lean path (:mod:`._lean`: every
    output allocated here, the entry bound to the operands' signature)."""
    ready()
    s = stream_of(q)
    if mask is None and p == 0.0:
        outs = sdpa_outputs(q, v.shape[3], grad)
        out, stats = outs[0], (outs[1] if grad else None)
        tag = (_FWD, causal, scale, grad)
        _lean.launch_fresh(tag, (q, k, v), outs, s, _forward_slow, q, k, v, causal, scale, out,
                           stats, s)  # fmt: skip
        return out, stats
    out = attention_out(q, v.shape[3])
    r = dnn_sdpa(q, k, v, mask, causal, scale, p, seed, grad or p > 0.0, out=out, stream=s)
    return out, (to_torch(r[1]) if grad else None)


def _mask_dims(m: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[int, ...] | None:
    """*m*'s dims as ``(B|1, H|1, S_q, S_kv)`` for 4-D *q*, or None when cuDNN's bias cannot
    take it (it broadcasts over batch and heads only)."""
    if m.dim() < 2 or m.dim() > 4 or q.dim() != 4:
        return None
    dims = (1,) * (4 - m.dim()) + tuple(m.shape)
    want = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    if dims[2:] != want[2:] or any(
        d not in (1, w) for d, w in zip(dims[:2], want[:2], strict=True)
    ):
        return None
    return dims


def _mask_runs(m: Any, q: torch.Tensor, k: torch.Tensor) -> bool:
    """An ``attn_mask`` pycudnn's path takes: a boolean or q-dtype tensor on q's device whose
    dims broadcast over batch and heads only; with a gradient to compute, a floating
    ``(1, H, S_q, S_kv)`` one (the only bias shape cuDNN differentiates)."""
    if type(m) not in _TENSORS or m.device != q.device or m.dtype not in (torch.bool, q.dtype):
        return False
    dims = _mask_dims(m, q, k)
    if dims is None:
        return False
    if torch.is_grad_enabled() and m.requires_grad:
        return m.dtype != torch.bool and dims[:2] == (1, q.shape[1])
    return True


def attention_bias(
    m: torch.Tensor, q: torch.Tensor, k: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """torch's ``attn_mask`` *m* (one :func:`_mask_runs` takes) as ``dnn_sdpa``'s additive bias
    -- 4-D, batch and head dims broadcast by a size of 1 (not by a zero stride), keys contiguous
    -- and, for a boolean mask, the rows that attend to anything (q's dtype, ``(.., S_q, 1)``;
    None for a float mask). Differentiable.

    A boolean mask (True: attend) becomes 0 / the dtype's lowest finite value, not -inf: a fully
    masked row then averages all keys instead of dividing by zero, and the caller multiplies the
    output by the row mask, so such rows are 0 with zero gradients, as torch's function gives
    them (a NaN there would reach every row of the next layer through 0 * NaN)."""
    dims = _mask_dims(m, q, k)
    m = m.reshape(dims)
    for i in (0, 1):  # an expanded mask: one slice of the repeated dim, by a size of 1
        if m.shape[i] > 1 and m.stride(i) == 0:
            m = m.narrow(i, 0, 1)
    if m.dtype == torch.bool:
        low = torch.finfo(q.dtype).min
        bias = torch.zeros(m.shape, dtype=q.dtype, device=q.device).masked_fill_(~m, low)
        return bias, m.any(-1, keepdim=True).to(q.dtype)
    if m.stride(3) != 1 or 0 in m.stride()[2:]:
        m = m.contiguous()
    return m, None


# -- one definition: SDPAFn (eager) and pycudnn::sdpa / pycudnn::sdpa_grad (torch.compile) -------
def _like(r: Any, t: torch.Tensor) -> torch.Tensor:
    """Gradient *r* as a torch tensor laid out as *t* (the fake's layout: ``empty_like``)."""
    r = to_torch(r)
    return r if r.stride() == t.stride() else torch.empty_like(t).copy_(r)


def _seed_of(seed: torch.Tensor | None) -> int | None:
    return None if seed is None else int(seed.item())  # a CPU tensor: no device read


def _op_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    causal: bool,
    scale: float | None,
    p: float,
    seed: torch.Tensor | None,
    training: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`sdpa_run` with the seed as a CPU tensor (a graph has no Python ints drawn per
    call) and the statistics empty unless *training*."""
    out, stats = sdpa_run(q, k, v, mask, causal, scale, p, _seed_of(seed), training)
    if stats is None:
        return out, torch.empty((0,), dtype=torch.float32, device=q.device)
    return out, stats


def _sdpa_eager(q, k, v, mask, causal, scale, p, seed, training, bound=None):
    """``SDPAFn``'s eager forward: *bound* (a :class:`~._binding.Binding` whose signature this
    call has, see :func:`bound_attention`) launches its entry on new ``(out, stats)``."""
    if bound is not None:
        r = _bound_launch(bound, q, k, v, True)
        if r is not None:
            return r
    return _op_sdpa(q, k, v, mask, causal, scale, p, seed, training)


def _bound_launch(bd: Any, q: Any, k: Any, v: Any, stats: bool) -> tuple | None:
    """``(out,)``, or ``(out, stats)`` for the training variant, of the binding's launch on
    *q*, *k*, *v*, laid out as :func:`sdpa_run` lays them out; None where it could not launch.
    Counts the hit."""
    outs = sdpa_outputs(q, bd.meta, stats)
    if not _binding.launch(bd.entry, (q, k, v), outs, raw_stream(bd.index)):
        return None
    bd.hits += 1
    return outs


def _op_sdpa_fake(q, k, v, mask, causal, scale, p, seed, training):
    out = attention_out(q, v.shape[3])
    b, h, s, _ = q.shape
    dims = (b, h, s, 1) if training else (0,)
    return out, torch.empty(dims, dtype=torch.float32, device=q.device)


def sdpa_grad_run(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    dout: torch.Tensor,
    stats: torch.Tensor,
    mask: torch.Tensor | None,
    causal: bool,
    scale: float | None,
    p: float,
    seed: torch.Tensor | None,
    bias_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv, dbias)`` (dbias empty unless *bias_grad*). Without a mask or dropout (a
    causal LLM's attention) the lean path, with none of the public function's per-call keying
    of each operand; with dropout, the forward's *seed*, so cuDNN regenerates its mask."""
    if FIRST_USE[0]:  # the first use only (no call on the hot path)
        ready()
    if dout.stride() != out.stride():  # an expanded or otherwise laid-out gradient
        dout = torch.empty_like(out).copy_(dout)
    det = True if torch.are_deterministic_algorithms_enabled() else None
    s = stream_of(dout)
    if mask is None and p == 0.0:
        grads = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
        ops = (q, k, v, out, dout, stats)
        tag = (_BWD, causal, scale, det)
        _lean.launch_fresh(tag, ops, grads, s, _backward_slow, ops, causal, scale, det, grads, s)
        return (*grads, q.new_empty(0))
    r = dnn_sdpa_grad(q, k, v, out, dout, stats, mask, causal, scale, p, _seed_of(seed),
                      deterministic=det, bias_grad=bias_grad, stream=s)  # fmt: skip
    dbias = _like(r[3], mask) if bias_grad else q.new_empty(0)
    return _like(r[0], q), _like(r[1], k), _like(r[2], v), dbias


def sdpa_grad_outputs(
    _bd: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *_: Any
) -> tuple:
    """A bound backward's new ``(dq, dk, dv)``, as :func:`sdpa_grad_run` makes them."""
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _op_grad_fake(q, k, v, out, dout, stats, mask, causal, scale, p, seed, bias_grad):
    dbias = torch.empty_like(mask) if bias_grad else q.new_empty(0)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dbias


def _setup(ctx, inputs, output) -> None:
    q, k, v, mask, causal, scale, p, seed, _ = inputs[:9]
    out, stats = output
    ctx.mark_non_differentiable(stats)
    ctx.save_for_backward(q, k, v, out, stats, mask, seed)
    ctx.cfg = (causal, scale, p)
    ctx.bound = inputs[9] if len(inputs) > 9 else None  # an eager call's binding


def _backward(ctx, dout, _dstats):
    q, k, v, out, stats, mask, seed = ctx.saved_tensors
    if not stats.numel():  # the inference variant keeps no softmax statistics
        raise RuntimeError(
            "pycudnn::sdpa ran with training=False (no softmax statistics): its output has "
            "no gradient; pass training=True"
        )
    need = ctx.needs_input_grad
    bias_grad = bool(need[3])
    args = (op_sdpa_grad, sdpa_grad_run, q, k, v, out, dout, stats, mask, *ctx.cfg, seed, bias_grad)
    bd = ctx.bound if type(dout) in PLAIN else None  # (compiled autograd's are not)
    if bd is None:
        dq, dk, dv, dbias = ctx.gradient(*args)
    else:  # the binding's gradient entry (bound by this thread's first backward), per mode
        det = True if torch.are_deterministic_algorithms_enabled() else None
        ops = (q, k, v, out, dout, stats)
        r = _binding.backward(bd, det, dout, raw_stream(bd.index), ops, sdpa_grad_outputs,
                              ctx.gradient, *args)  # fmt: skip
        dq, dk, dv, dbias = *r[:3], None
    return (
        dq if need[0] else None,
        dk if need[1] else None,
        dv if need[2] else None,
        dbias if bias_grad else None,
    ) + (None,) * (len(need) - 4)


#: ``SDPAFn.apply(q, k, v, mask?, causal, scale?, p, seed?, training) -> (out, stats)`` (eager)
#: and ``pycudnn::sdpa(...)`` (compiled): :func:`sdpa_run` on 4-D ``(B, H, S, D)`` operands with
#: an optional additive *mask* ``(B|1, H|1, S_q, S_kv)`` in q's dtype (:func:`attention_bias`;
#: its gradient only for a ``(1, H, S_q, S_kv)`` one, the shape cuDNN computes it for), *seed* a
#: CPU int64 tensor of one element when *p* > 0, stats empty unless *training*; one backward.
#: An eager call may pass a tenth argument, the binding it runs bound (:func:`bound_attention`).
SDPAFn, op_sdpa = differentiable(
    "sdpa", _op_sdpa, _op_sdpa_fake, _setup, _backward, eager_run=_sdpa_eager, stats_outputs=1
)
#: ``pycudnn::sdpa_grad(q, k, v, out, dout, stats, mask?, causal, scale?, p, seed?, bias_grad)
#: -> (dq, dk, dv, dbias)``
op_sdpa_grad = define("sdpa_grad", sdpa_grad_run, _op_grad_fake)


_CAPABLE: dict[int, bool] = {}
_TENSORS = (torch.Tensor, nn.Parameter)


def _attention_capable(t: torch.Tensor) -> bool:
    """cuDNN's fused attention runs on *t*'s device (sm80 or newer), cached per device."""
    dev = t.get_device()
    if compiling():  # no cache read: dynamo would guard on the dict the first call fills
        return _capable(dev)
    ok = _CAPABLE.get(dev)
    if ok is None:
        ok = _CAPABLE[dev] = _capable(dev)
    return ok


@constant  # traced code reads it once (a device's capability is fixed)
def _capable(dev: int) -> bool:
    return torch.cuda.get_device_capability(dev) >= (8, 0)


def _attention_native(
    q: Any, k: Any, v: Any, attn_mask: Any, dropout_p: Any, enable_gqa: bool, grad: bool
) -> bool:
    """The call is one pycudnn's ``dnn_sdpa`` runs (else torch's function runs)."""
    if not isinstance(dropout_p, (int, float)):
        return False
    if attn_mask is not None and not _mask_runs(attn_mask, q, k):
        return False
    if not 0.0 <= dropout_p < 1.0:
        return False
    if not (cuda_ok(q, HALVES) and cuda_ok(k, HALVES) and cuda_ok(v, HALVES)):
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


def cudnn_operands(
    q: Any, k: Any, v: Any, attn_mask: Any, dropout_p: Any, enable_gqa: bool
) -> tuple[Any, Any, Any, bool] | None:
    """``(q, k, v, grad)`` as :func:`scaled_dot_product_attention` runs cuDNN on them --
    autocast's casts applied (as autocast casts torch's function, a lower-precision op), *grad*
    whether a gradient is wanted -- or None where it calls torch's function instead (the
    attention scope asks the same question before routing a call)."""
    ac = autocast_dtype()
    if ac in HALVES and attn_mask is None:
        q, k, v = (
            t.to(ac) if type(t) in _TENSORS and t.is_cuda and t.dtype in NORM_FLOATS else t
            for t in (q, k, v)
        )
    grad = torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v, attn_mask)
    )
    if not _attention_native(q, k, v, attn_mask, dropout_p, enable_gqa, grad):
        return None
    return q, k, v, grad


# -- attention bindings: a repeated mask-free, dropout-free eager call as one bound launch ---------
#: signatures an attention binding store keeps (all threads; the oldest goes first)
BOUND_MAX = 16
_BOUND: dict[tuple, _binding.Binding] = {}
_BOUND_LOCK = threading.Lock()
_CLEARS = [0]  # ``pycudnn.clear_caches()`` count the store's bindings were made under


def attention_sig(
    q: Any, k: Any, v: Any, dropout_p: Any, is_causal: Any, scale: Any, enable_gqa: Any
) -> tuple | None:
    """The signature of a mask-free attention call that may run bound (:func:`bound_attention`),
    or None for one that cannot: under ``torch.compile`` or ``torch.func`` transforms, tensors
    that are not plain float16/bfloat16 CUDA tensors, dropout, or arguments of other types than
    the bound calls' (``is_causal`` and ``enable_gqa`` bools, ``scale`` None or a float), which
    then go through every check. The signature holds what :func:`cudnn_operands`' checks and
    the lean key read: each tensor's shape, strides, dtype, device and pointer alignment, the
    arguments, whether a gradient is wanted, autocast's dtype, ``pycudnn.config`` and the
    thread (its first element is the gradient flag)."""
    if compiling():  # (dynamo must not read the store: it would guard on its contents)
        return None
    # plain CUDA tensors of a dtype cuDNN takes, outside torch.func transforms: the others have
    # no pointer to read, or go to torch's function anyway
    if not (cuda_ok(q, HALVES) and cuda_ok(k, HALVES) and cuda_ok(v, HALVES)):
        return None
    if type(dropout_p) not in (float, int) or dropout_p != 0:
        return None
    if type(is_causal) is not bool or type(enable_gqa) is not bool:
        return None
    if scale is not None and type(scale) is not float:
        return None
    if _plans.stats.clears != _CLEARS[0]:  # a clear_caches() drops the bindings too
        _BOUND.clear()
        _CLEARS[0] = _plans.stats.clears
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    return (
        grad, is_causal, scale, enable_gqa,
        type(q), q.shape, q.stride(), q.dtype, q.get_device(), q.data_ptr() & 15,
        type(k), k.shape, k.stride(), k.dtype, k.get_device(), k.data_ptr() & 15,
        type(v), v.shape, v.stride(), v.dtype, v.get_device(), v.data_ptr() & 15,
        autocast_dtype(), _call.snapshot(), get_ident(),
    )  # fmt: skip


def bound_attention(sig: tuple, q: Any, k: Any, v: Any) -> torch.Tensor | None:
    """The attention output of a call whose signature *sig* (:func:`attention_sig`) is bound,
    else None (the caller then takes the checked path, which binds the call where it runs as
    one lean launch on the caller's own tensors).

    An equal signature pins everything the first call's checks validated, so a bound call is
    its outputs' allocation and the entry's launch (through ``SDPAFn`` when a gradient is
    wanted, whose backward launches the binding's gradient entry, bound per thread and
    incoming-gradient signature; see :mod:`._binding`). Decoding changes the keys' length
    each token, so the store keeps the last :data:`BOUND_MAX` signatures: the first layer of
    a step binds, the others hit."""
    bd = _BOUND.get(sig)
    if bd is None:
        return None
    if sig[0]:
        return SDPAFn.apply(q, k, v, None, sig[1], sig[2], 0.0, None, True, bd)[0]
    r = _bound_launch(bd, q, k, v, False)
    return None if r is None else r[0]


def _keep(sig: tuple, entry: Any, q: torch.Tensor, dv: int) -> None:
    with _BOUND_LOCK:
        if len(_BOUND) >= BOUND_MAX:  # oldest first: dicts keep insertion order
            _BOUND.pop(next(iter(_BOUND)))
        _BOUND[sig] = _binding.Binding(sig, entry, q.get_device(), dv)


def bound_count() -> int:
    """Attention signatures bound now (tests and diagnostics)."""
    return len(_BOUND)


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
    8 up to 256, on an sm80 or newer GPU. Any strides: the usual ``(B, S, H, E)`` projections
    passed as their ``transpose(1, 2)`` views are read as they are, and the output is then laid
    out the same way (a ``(B, S, H, Ev)`` tensor's view). Everything else -- float32/float64,
    other head dims, CPU tensors, tensor subclasses, ``H_q != H_k`` without ``enable_gqa``
    (torch raises), a backward through ``S_q = S_kv = 1``, masks cuDNN's bias cannot take (see
    *attn_mask*) -- calls
    ``torch.nn.functional.scaled_dot_product_attention``.

    Parameters
    ----------
    query : torch.Tensor
        ``(..., H_q, S_q, E)``.
    key, value : torch.Tensor
        ``(..., H_k, S_kv, E)`` and ``(..., H_k, S_kv, Ev)``.
    attn_mask : torch.Tensor, optional
        torch's mask: boolean (True: attend) or additive in query's dtype, 4-D query, its dims
        ``(B|1, H|1, S_q, S_kv)`` (fewer dims broadcast from the left): cuDNN adds it to the
        scores as a bias (a boolean one as 0 / the lowest finite value, fully masked rows
        giving 0 as torch's do). Its gradient is computed for a floating
        ``(1, H, S_q, S_kv)`` mask (the shape cuDNN differentiates); a mask that needs another
        gradient, broadcasts over the sequence dims, or comes with ``is_causal=True`` (torch
        raises) runs torch's implementation.
    dropout_p : float
        As in torch's functional API, applied whenever > 0 (whatever a module's ``training``
        flag): pass ``dropout_p if self.training else 0.0`` from a module. The mask comes from
        cuDNN's Philox generator with a seed drawn from torch's CPU generator
        (``torch.manual_seed`` makes it reproducible; it differs from torch's mask), and the
        backward regenerates it from that seed (passed to cuDNN by value: no device copy).
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
    sig = None
    if attn_mask is None:
        sig = attention_sig(query, key, value, dropout_p, is_causal, scale, enable_gqa)
        if sig is not None:
            out = bound_attention(sig, query, key, value)
            if out is not None:
                return out
    ops = cudnn_operands(query, key, value, attn_mask, dropout_p, enable_gqa)
    if ops is not None:
        is_causal = parse_bool(is_causal, _FUNC, "is_causal")
    if ops is None or (attn_mask is not None and is_causal):  # torch's (it refuses both)
        kw: dict[str, Any] = {"scale": scale}
        if enable_gqa:  # torch >= 2.5
            kw["enable_gqa"] = True
        return nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask, dropout_p, is_causal, **kw
        )
    return cudnn_attention(*ops, attn_mask, dropout_p, is_causal, scale, sig, (query, key, value))


def cudnn_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    grad: bool,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    sig: tuple | None = None,
    given: tuple = (),
) -> torch.Tensor:
    """The attention on cuDNN for operands :func:`cudnn_operands` answered (``(q, k, v,
    grad)``, its casts made; not with both *attn_mask* and *is_causal*): what
    :func:`scaled_dot_product_attention` runs once it decided, and what the routes that take
    the decision themselves (:mod:`.attention_scope`) call, so no call decides twice.

    *sig*, the call's :func:`attention_sig` (None: not bindable), and *given*, the caller's
    own ``(query, key, value)``: a call that runs as one lean launch on exactly those tensors
    (no cast, reshape or copy on the way) is bound to *sig* for the next such call."""
    lead = q.shape[:-3]
    if len(lead) != 1:
        q, k, v = (t.reshape(-1, *t.shape[-3:]) for t in (q, k, v))
    q, k, v = (no_broadcast(t, unit_last=True) for t in (q, k, v))
    p = real(dropout_p, "dropout_p", _FUNC, lo=0.0, hi=1.0, hi_open=True)
    sc = None if scale is None else real(scale, "scale", _FUNC)
    causal = parse_bool(is_causal, _FUNC, "is_causal")
    # the seed a CPU tensor: a traced graph holds no Python int drawn per call
    seed = torch.randint(0, 2**62, (1,)) if p > 0.0 else None
    mask, rows = (None, None) if attn_mask is None else attention_bias(attn_mask, q, k)
    if compiling():  # the op (its autograd is SDPAFn's setup and backward)
        out = op_sdpa(q, k, v, mask, causal, sc, p, seed, grad)[0]
    elif sig is not None and given and given[0] is q and given[1] is k and given[2] is v:
        run: Any = SDPAFn.apply if grad else sdpa_run
        r, entry = _binding.record(run, given, q, k, v, None, causal, sc, 0.0, None, grad)
        out = r[0]
        if entry is not None:
            _keep(sig, entry, q, v.shape[3])
    elif grad:
        out = SDPAFn.apply(q, k, v, mask, causal, sc, p, seed, True)[0]
    else:  # no autograd node: the launch alone
        out = sdpa_run(q, k, v, mask, causal, sc, p, _seed_of(seed), False)[0]
    if rows is not None:  # fully masked rows: 0, as torch's function gives them
        out = out * rows
    if len(lead) != 1:
        out = out.reshape(*lead, *out.shape[1:])
    return out
