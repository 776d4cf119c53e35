"""Scaled dot-product attention as a JAX function on ``dnn_sdpa`` / ``dnn_sdpa_grad`` (cuDNN's
fused flash-attention engines).

``jax.nn.dot_product_attention``'s layout: query ``(B, T, N, H)``, key ``(B, S, K, H)``, value
``(B, S, K, H_v)``, output ``(B, T, N, H_v)``, ``N`` a multiple of ``K`` (grouped-query; ``K =
1`` multi-query). cuDNN reads the ``(B, N, T, H)`` view of each buffer through its strides, so
nothing is transposed. The forward also writes the softmax statistics (float32 ``(B, N, T,
1)``, each row's log-sum-exp): a residual, not a result; the backward is one ``dnn_sdpa_grad``
call with ``dq``, ``dk``, ``dv`` given.

The bias gradient is XLA's, from the saved statistics (``P = exp(s - lse)``, ``dS = P * (dP -
rowsum(dO * O))``, summed over the bias' broadcast dims): cuDNN gives one only for a ``(1, N, T,
S)`` bias and not into given outputs. It costs one ``(B, N, T, S)`` float32 intermediate, and
XLA drops it when the bias' gradient is not used (a constant mask).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..highlevel import dnn_sdpa, dnn_sdpa_grad
from ..highlevel.attention._masks import alibi_slopes
from . import _ops, _request
from ._operands import XlaOperand, device_of, view

__all__ = ["Attention", "AttentionGrad", "dot_product_attention"]

_FUNC = "pycudnn.jax.dot_product_attention"
_TYPES = ("float16", "bfloat16")  # cuDNN's fused attention has no float32 engine
_MAX_HEAD = 256


@dataclasses.dataclass(frozen=True)
class Attention(_request.Request):
    """The forward: operands ``q``, ``k``, ``v`` (, ``q_lens``, ``kv_lens``) (, ``bias``) --
    the high level's pointer order; results ``out``, ``stats``.

    *left*/*right*: cuDNN's band (``i - left < j <= i + right``), None when unbounded;
    *causal*: the top-left causal mask (right bound 0). *bias_batched*: the bias has the batch
    dim (not 1), so a vmapped batch folds into it too."""

    family = "attention"
    scale: float
    causal: bool
    left: int | None
    right: int | None
    alibi: bool
    lens: bool
    bias: bool
    bias_batched: bool

    def __post_init__(self) -> None:
        object.__setattr__(self, "scale", _request.real(self.scale, "scale", _FUNC))
        for name in ("causal", "alibi", "lens", "bias", "bias_batched"):
            if getattr(self, name).__class__ is not bool:
                raise TypeError(f"{_FUNC}: {name}={getattr(self, name)!r}; expected a bool")
        if self.left is not None:
            _request.ints(self.left, 1, "left bound", _FUNC, 1)
        if self.right is not None:
            _request.ints(self.right, 1, "right bound", _FUNC, 0)
        if self.causal and self.right is not None:
            raise ValueError(f"{_FUNC}: the causal mask is a right bound of 0; got {self.right}")

    def batch_operands(self) -> tuple[bool, ...]:
        return (True,) * (3 + 2 * self.lens) + ((self.bias_batched,) if self.bias else ())

    def check(self, q: Any, k: Any, v: Any, rest: Sequence[Any]) -> tuple[Any, ...]:
        """Check the operands; returns ``(B, T, N, S, H_v)``."""
        dt = _request.check_dtype(_FUNC, "query", q, _TYPES)
        for name, a in (("key", k), ("value", v)):
            if np.dtype(a.dtype) != dt:
                raise TypeError(f"{_FUNC}: {name} is {a.dtype}; expected query's {dt}")
        for name, a in (("query", q), ("key", k), ("value", v)):
            if len(a.shape) != 4:
                raise ValueError(
                    f"{_FUNC}: {name} has shape {tuple(a.shape)}; expected 4 dims (B, T, N, H)"
                )
        b, t, n, h = q.shape
        _, s, kh, hk = k.shape
        if tuple(k.shape[:1]) != (b,) or tuple(v.shape[:3]) != tuple(k.shape[:3]):
            raise ValueError(
                f"{_FUNC}: query {tuple(q.shape)}, key {tuple(k.shape)}, value "
                f"{tuple(v.shape)}; expected (B, T, N, H), (B, S, K, H), (B, S, K, H_v)"
            )
        if _request.known(h, hk) and h != hk:
            raise ValueError(f"{_FUNC}: query's head dim {h} differs from key's {hk}")
        if _request.known(n, kh) and n % kh:
            raise ValueError(
                f"{_FUNC}: query has {n} heads, key and value {kh}; expected a divisor of {n} "
                "(grouped-query attention)"
            )
        hv = v.shape[3]
        for name, d in (("query/key", h), ("value", hv)):
            if _request.known(d) and (d % 8 or d > _MAX_HEAD):
                raise ValueError(
                    f"{_FUNC}: {name} head dim {d}; cuDNN's fused attention takes multiples of "
                    f"8 up to {_MAX_HEAD}"
                )
        rest = list(rest)
        if self.lens:
            for name in ("query_seq_lengths", "key_value_seq_lengths"):
                a = rest.pop(0)
                if np.dtype(a.dtype) != np.dtype("int32") or tuple(a.shape) != (b,):
                    raise ValueError(
                        f"{_FUNC}: {name} is {a.dtype}{list(a.shape)}; expected int32[{b}]"
                    )
        if self.bias:
            a = rest.pop(0)
            shape = tuple(a.shape)
            lead = b if self.bias_batched else 1
            if np.dtype(a.dtype) != dt:
                raise TypeError(f"{_FUNC}: bias is {a.dtype}; expected query's {dt}")
            if len(shape) != 4 or shape[0] != lead or shape[1] not in (1, n) or shape[2:] != (t, s):
                raise ValueError(
                    f"{_FUNC}: bias has shape {shape}; expected ({lead}, {n} or 1, {t}, {s})"
                )
        return b, t, n, s, hv

    def results(self, *operands: Any) -> _ops.Results:
        q, k, v, *rest = operands
        b, t, n, _s, hv = self.check(q, k, v, rest)
        return (((b, t, n, hv), np.dtype(q.dtype)), ((b, n, t, 1), np.dtype("float32")))

    def masks(self) -> dict[str, Any]:
        """The high level's mask arguments."""
        return {
            "is_causal": self.causal,
            "scale": self.scale,
            "left_bound": self.left,
            "right_bound": self.right,
            "alibi": self.alibi,
        }

    def split(self, ops: Sequence[Any]) -> tuple[list[Any], dict[str, Any]]:
        """``(tensors, keyword arguments)``: the lengths and the bias out of *ops* (after the
        leading tensors); the rest stays in order."""
        ops = list(ops)
        kw: dict[str, Any] = {}
        at = 3 if type(self) is Attention else 6
        if self.lens:
            kw["seq_lens_q"], kw["seq_lens_kv"] = ops[at], ops[at + 1]
            del ops[at : at + 2]
        if self.bias:
            kw["attn_mask"] = ops.pop(at)
        return ops, kw

    def run(self, args: Sequence[Any], rets: Sequence[Any], stream: int) -> None:
        (q, k, v, out, stats), kw = self.split(_views(args, rets, (3, 1)))
        dnn_sdpa(
            q, k, v, training=True, out=out, out_stats=stats, stream=stream, **kw, **self.masks()
        )


@dataclasses.dataclass(frozen=True)
class AttentionGrad(Attention):
    """The backward: operands ``q``, ``k``, ``v``, ``out``, ``dout``, ``stats`` (, lengths)
    (, ``bias``); results ``dq``, ``dk``, ``dv``."""

    def batch_operands(self) -> tuple[bool, ...]:
        return (True,) * (6 + 2 * self.lens) + ((self.bias_batched,) if self.bias else ())

    def results(self, *operands: Any) -> _ops.Results:
        q, k, v, out, dout, stats, *rest = operands
        b, t, n, _s, hv = self.check(q, k, v, rest)
        for name, a, shape, dt in (
            ("out", out, (b, t, n, hv), q.dtype),
            ("dout", dout, (b, t, n, hv), q.dtype),
            ("stats", stats, (b, n, t, 1), np.dtype("float32")),
        ):
            if tuple(a.shape) != shape or np.dtype(a.dtype) != np.dtype(dt):
                raise ValueError(
                    f"{_FUNC} gradient: {name} is {a.dtype}{list(a.shape)}; expected "
                    f"{np.dtype(dt)}{list(shape)}"
                )
        return tuple((tuple(a.shape), np.dtype(a.dtype)) for a in (q, k, v))

    def run(self, args: Sequence[Any], rets: Sequence[Any], stream: int) -> None:
        (q, k, v, out, dout, stats, dq, dk, dv), kw = self.split(_views(args, rets, (5, 3)))
        dnn_sdpa_grad(
            q, k, v, out, dout, stats, out_grads=(dq, dk, dv), stream=stream, **kw, **self.masks()
        )


def _bnth(buffer: Any, device: int) -> XlaOperand:
    """A ``(B, T, N, H)`` buffer as cuDNN's ``(B, N, T, H)`` through its strides (no copy)."""
    b, t, n, h = buffer.shape
    op = view(buffer, device)
    return op._replace(shape=(b, n, t, h), strides=(t * n * h, h, n * h, 1))


def _views(args: Sequence[Any], rets: Sequence[Any], tensors: tuple[int, int]) -> list[Any]:
    """The operands of a call: the first ``tensors[0]`` args and ``tensors[1]`` rets (the
    ``(B, T, N, H)`` ones) as ``(B, N, T, H)`` views, the statistics, lengths and bias as
    they are."""
    device = device_of((*args, *rets))
    na, nr = tensors
    ins = [_bnth(x, device) if i < na else view(x, device) for i, x in enumerate(args)]
    outs = [_bnth(x, device) if i < nr else view(x, device) for i, x in enumerate(rets)]
    return ins + outs


# -- the bias gradient (XLA's, from the statistics) ------------------------------------------------
def _keep(request: Attention, t: int, s: int, lens: tuple[Any, Any] | None) -> Any:
    """Where the scores are kept: bool ``(B or 1, 1, T, S)``."""
    i = jnp.arange(t)[:, None]
    j = jnp.arange(s)[None, :]
    keep = jnp.ones((t, s), bool)
    if request.causal:
        keep &= j <= i
    if request.right is not None:
        keep &= j <= i + request.right
    if request.left is not None:
        keep &= j > i - request.left
    keep = keep[None, None]
    if lens is not None:
        ql, kl = lens
        keep = keep & (i[None, None] < ql[:, None, None, None])
        keep = keep & (j[None, None] < kl[:, None, None, None])
    return keep


def _bias_grad(request: Attention, residuals: Any, dout: Any) -> Any:
    q, k, v, out, stats, lens, bias = residuals
    f32 = jnp.float32
    _b, t, n, _h = q.shape
    s, kh = k.shape[1], k.shape[2]
    kk = jnp.repeat(k, n // kh, axis=2).astype(f32)
    vv = jnp.repeat(v, n // kh, axis=2).astype(f32)
    scores = jnp.einsum("btnh,bsnh->bnts", q.astype(f32), kk) * request.scale
    scores = scores + bias.astype(f32)
    if request.alibi:
        slopes = jnp.asarray(alibi_slopes(n), f32)  # (1, N, 1, 1)
        scores = scores + slopes * (jnp.arange(s)[None, :] - jnp.arange(t)[:, None]).astype(f32)
    keep = _keep(request, t, s, lens)
    p = jnp.where(keep, jnp.exp(scores - stats), 0.0)
    dp = jnp.einsum("btnh,bsnh->bnts", dout.astype(f32), vv)
    di = jnp.einsum("btnh,btnh->bnt", dout.astype(f32), out.astype(f32))[..., None]
    ds = p * (dp - di)
    axes = tuple(a for a in (0, 1) if bias.shape[a] == 1 and ds.shape[a] != 1)
    return jnp.sum(ds, axis=axes, keepdims=True).astype(bias.dtype)


# -- the differentiable function -------------------------------------------------------------------
def _valid(lengths: Any, n: int) -> Any:
    """Rows ``< lengths`` of a ``(B, n, ...)`` tensor: bool ``(B, n, 1, 1)``."""
    return (jnp.arange(n)[None, :] < lengths[:, None])[:, :, None, None]


def _forward(request: Attention, *operands: Any) -> tuple[Any, Any]:
    out, stats = _ops.call(request, *operands)
    if request.lens:  # rows past a query length: 0 (whatever cuDNN leaves there)
        out = jnp.where(_valid(operands[3], out.shape[1]), out, jnp.zeros((), out.dtype))
    return out, (operands, out, stats)


def _backward(request: Attention, residuals: Any, dout: Any) -> tuple:
    operands, out, stats = residuals
    q, k, v, *rest = operands
    grad = AttentionGrad(*(getattr(request, f.name) for f in dataclasses.fields(request)))
    dq, dk, dv = _ops.call(grad, q, k, v, out, dout, stats, *rest)
    lens = (rest[0], rest[1]) if request.lens else None
    if lens is not None:  # padded positions take no part: their gradients are 0
        zero = jnp.zeros((), dq.dtype)
        dq = jnp.where(_valid(lens[0], q.shape[1]), dq, zero)
        kv = _valid(lens[1], k.shape[1])
        dk, dv = jnp.where(kv, dk, zero), jnp.where(kv, dv, zero)
    grads: list[Any] = [dq, dk, dv]
    if request.lens:
        grads += [None, None]  # integer lengths: no cotangent
    if request.bias:
        bias = rest[-1]
        grads.append(_bias_grad(request, (q, k, v, out, stats, lens, bias), dout))
    return tuple(grads)


_attention = _ops.differentiable(_forward, _backward)


def _flag(value: Any, name: str) -> bool:
    if value.__class__ not in (bool, np.bool_):
        raise TypeError(f"{_FUNC}: {name}={value!r}; expected a bool")
    return bool(value)


def _window(value: Any) -> tuple[int, int] | None:
    """``local_window_size`` as ``(left, right)`` (JAX's: an int is both)."""
    if value is None:
        return None
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (value, value)
    if not isinstance(value, (tuple, list)):
        raise TypeError(
            f"{_FUNC}: local_window_size={value!r}; expected None, an int or a (left, right) pair"
        )
    left, right = _request.ints(tuple(value), 2, "local_window_size", _FUNC, 0)
    return left, right


def _lengths(name: str, value: Any, b: int, full: int) -> Any:
    if value is None:
        return jnp.full((b,), full, jnp.int32)
    a = jnp.asarray(value)
    if a.dtype != jnp.int32:
        raise TypeError(f"{_FUNC}: {name} has dtype {a.dtype}; expected int32")
    if a.shape != (b,):
        raise ValueError(f"{_FUNC}: {name} has shape {a.shape}; expected ({b},) (B of query)")
    return a


def _dims4(a: Any, shape: tuple[int, int, int, int], name: str) -> Any:
    """*a* (broadcastable to ``(B, N, T, S)``) as 4 dims, checked (*name* in the error)."""
    if a.ndim > 4:
        raise ValueError(
            f"{_FUNC}: {name} has shape {a.shape}; expected at most 4 dims (B, N, T, S)"
        )
    try:
        np.broadcast_shapes(a.shape, shape)
    except ValueError:
        raise ValueError(
            f"{_FUNC}: {name} has shape {tuple(a.shape)}; expected a shape broadcastable "
            f"to (B, N, T, S) = {shape}"
        ) from None
    return a.reshape((1,) * (4 - a.ndim) + a.shape)


def _bias4(bias: Any, shape: tuple[int, int, int, int]) -> Any:
    """*bias* (broadcastable to ``(B, N, T, S)``) as 4 dims: batch and heads stay 1 where they
    are (cuDNN broadcasts them), T and S are broadcast (cuDNN reads them in full)."""
    a = _dims4(jnp.asarray(bias), shape, "bias")
    b, n = a.shape[:2]
    return jnp.broadcast_to(a, (b, n, *shape[2:]))


def _masked(mask: Any, bias: Any, query: Any, shape: tuple[int, int, int, int]) -> tuple:
    """``(query, bias)`` for a boolean *mask* (True: attend) over *bias* (or 0), as
    ``jax.nn.dot_product_attention`` applies it: masked scores get ``-0.7 * finfo.max`` of
    query's dtype (JAX's value, capped at 1e30: cuDNN scales scores by log2(e), and
    bfloat16's -2.4e38 would overflow float32 to -inf), the others keep their bias. JAX's
    mask also stops the gradient at the masked scores, which an added bias alone would not in a
    fully masked row (its uniform softmax still has a score gradient): such a row's query and
    bias are 0 here, giving JAX's uniform average with no gradient to the query, none from the
    row to the keys and none to the bias."""
    m = _dims4(jnp.asarray(mask), shape, "mask")
    if m.dtype != jnp.bool_:
        raise TypeError(
            f"{_FUNC}: mask has dtype {m.dtype}; expected bool (True: attend; pass an additive "
            "mask as bias)"
        )
    dt = query.dtype
    if not jnp.issubdtype(dt, jnp.floating):  # (the request's check names query's dtype)
        return query, bias
    # JAX's -0.7 * finfo.max, but at most 1e30 in magnitude: cuDNN scales the scores by
    # log2(e) for its exp2, and bfloat16's -2.4e38 then overflows float32 to -inf (a fully
    # masked row would give 0, not JAX's average)
    neg = jnp.asarray(-min(0.7 * float(jnp.finfo(dt).max), 1e30), dt)
    zero = jnp.zeros((), dt)
    base = zero if bias is None else _dims4(jnp.asarray(bias), shape, "bias")
    # (B|1, N|1, T, 1): the rows that attend to something. A fully masked row gets a zero
    # query and a zero bias: equal scores (JAX's average), a softmax sum cuDNN's float32
    # statistics keep exactly (log S beside -1e30 would be lost: the backward's P = 1, not 1/S)
    rows = jnp.any(m, axis=-1, keepdims=True)
    return (
        jnp.where(rows.transpose(0, 2, 1, 3), query, zero),
        jnp.where(rows, jnp.where(m, base, neg), zero),
    )


def dot_product_attention(
    query: Any,
    key: Any,
    value: Any,
    bias: Any = None,
    mask: Any = None,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    query_seq_lengths: Any = None,
    key_value_seq_lengths: Any = None,
    local_window_size: int | tuple[int, int] | None = None,
    alibi: bool = False,
) -> jax.Array:
    """Scaled dot-product attention through cuDNN's fused flash-attention (``dnn_sdpa``),
    differentiable in *query*, *key*, *value* and *bias* (``dnn_sdpa_grad``).

    ``softmax(scale * q k^T + bias + masks) v`` per head, with ``jax.nn.dot_product_attention``'s
    arguments, in its order, and layout (its ``implementation`` and ``return_residual`` are not
    taken).

    Parameters
    ----------
    query : jax.Array
        ``(B, T, N, H)``, float16 or bfloat16; H a multiple of 8, at most 256.
    key, value : jax.Array
        ``(B, S, K, H)`` and ``(B, S, K, H_v)``, query's dtype; ``N`` a multiple of ``K``
        (grouped-query attention); ``H_v`` a multiple of 8, at most 256.
    bias : jax.Array, optional
        Additive, query's dtype, broadcastable to ``(B, N, T, S)`` (0 to attend, ``-inf`` to
        mask); its gradient is computed (by XLA, from the saved statistics).
    mask : jax.Array, optional
        Boolean, broadcastable to ``(B, N, T, S)``, True where a query attends a key, as
        ``jax.nn.dot_product_attention``'s: a masked score's bias becomes JAX's ``-0.7 *
        finfo(dtype).max`` (at most ``1e30`` in magnitude), passed to cuDNN with *bias* as one
        additive bias; a fully masked row averages the values with no gradient to its query,
        as JAX's does.
    scale : float, optional
        Default ``1 / sqrt(H)``.
    is_causal : bool
        Query ``i`` sees keys ``j <= i`` (top-left aligned, as JAX's).
    query_seq_lengths, key_value_seq_lengths : jax.Array, optional
        int32 ``(B,)`` valid lengths (either alone: the other is the full length). Output rows
        past a query length are 0 (JAX's own implementation gives them other values), and the
        gradients at padded positions are 0. A valid query row that sees no key (a key length
        of 0, a window past the key length) has no softmax: its values are cuDNN's (the
        lengths are device values, not checked).
    local_window_size : int or (int, int), optional
        JAX's sliding window ``(left, right)``: query ``i`` sees keys ``i - left <= j <= i +
        right`` (an int is both); with *is_causal* the right side is 0.
    alibi : bool
        Add ALiBi's ``slope_n * (j - i)`` (the paper's slopes for N heads); with *is_causal*
        only (cuDNN's backward needs the causal mask).

    Returns
    -------
    jax.Array
        ``(B, T, N, H_v)``, query's dtype.

    Raises
    ------
    TypeError, ValueError
        At trace time: float32/float64 or mixed dtypes, mismatched shapes, head dims cuDNN does
        not take, a bias or mask that does not broadcast to ``(B, N, T, S)``, a mask that is not
        boolean, lengths not int32 ``(B,)``,
        a bad window, non-bool flags, *alibi* without *is_causal*.
    """
    query, key, value = jnp.asarray(query), jnp.asarray(key), jnp.asarray(value)
    causal = _flag(is_causal, "is_causal")
    use_alibi = _flag(alibi, "alibi")
    if use_alibi and not causal:
        raise ValueError(f"{_FUNC}: alibi=True needs is_causal=True (cuDNN's backward does)")
    if query.ndim != 4 or key.ndim != 4:
        raise ValueError(
            f"{_FUNC}: query {tuple(query.shape)} and key {tuple(key.shape)}; expected 4 dims "
            "(B, T, N, H) and (B, S, K, H)"
        )
    b, t, n, h = query.shape
    s = key.shape[1]
    sc = 1.0 / math.sqrt(h) if scale is None else _request.real(scale, "scale", _FUNC)
    window = _window(local_window_size)
    left = right = None
    if window is not None:
        left, right = window[0] + 1, (None if causal else window[1])
    lens = query_seq_lengths is not None or key_value_seq_lengths is not None
    rest: list[Any] = []
    if lens:
        rest.append(_lengths("query_seq_lengths", query_seq_lengths, b, t))
        rest.append(_lengths("key_value_seq_lengths", key_value_seq_lengths, b, s))
    batched = False
    if mask is not None:
        query, bias = _masked(mask, bias, query, (b, n, t, s))
    if bias is not None:
        bias = _bias4(bias, (b, n, t, s))
        batched = bias.shape[0] == b and b != 1
        rest.append(bias)
    request = Attention(sc, causal, left, right, use_alibi, lens, bias is not None, batched)
    return _attention(request, query, key, value, *rest)
