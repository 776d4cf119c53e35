"""Batched matrix products as a JAX function on ``dnn_matmul`` (cuDNN's graph API), with its
fused epilogue ``act(a @ b + bias)``.

``a (..., M, K) @ b (..., K, N)`` with NumPy's batch broadcasting, as ``jnp.matmul`` (both at
least 2-D; only one operand's batch may broadcast against the other's: cuDNN's engines). The
gradients are products too, on the same call: ``da = dz @ b^T`` and ``db = a^T @ dz`` (the
transposes are strides given to cuDNN, no copies; summed by XLA over the dims an operand was
broadcast along, or, for a 2-D ``b``, one product over the folded batch), ``dbias`` XLA's sum
of ``dz``. ``dz``, the gradient before the activation, comes from the output for ``relu``,
``sigmoid``, ``tanh`` and the clipped ReLU, and for the other activations from the
pre-activation, recomputed by one more product (cuDNN's fused call does not keep it); XLA
computes the activation's derivative. Data: float16, bfloat16, float32 (float32 only with
``pycudnn.config.allow_tf32``: cuDNN's float32 matmul engines compute in TF32); the product
accumulates in float32.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..highlevel import _call, dnn_matmul
from ..highlevel.conv import _epilogue
from . import _ops, _request
from ._operands import XlaOperand, views

__all__ = ["Matmul", "matmul"]

_FUNC = "pycudnn.jax.matmul"
_TYPES = ("float16", "bfloat16", "float32")
#: the activations whose gradient needs only the output (the clipped ReLU's: 0 < y < clip)
_FROM_OUTPUT = ("relu", "sigmoid", "tanh", "clipped_relu")


def _transposed(op: XlaOperand) -> XlaOperand:
    """*op* with its last two dims swapped (strides: the same memory)."""
    s, st = list(op.shape), list(op.strides)
    s[-2], s[-1], st[-2], st[-1] = s[-1], s[-2], st[-1], st[-2]
    return XlaOperand(op.ptr, tuple(s), tuple(st), op.dtype, op.device)


@dataclasses.dataclass(frozen=True)
class Matmul(_request.Request):
    """``act(op(a) @ op(b) + bias)``: operands ``a``, ``b`` (, ``bias``); result the product.
    *trans_a*/*trans_b* transpose an operand's last two dims (the gradients' products);
    *fold*: b has no batch dims, so a vmapped batch of ``a`` folds into a's leading dim."""

    family = "matmul"
    activation: str | None
    coef: float | None
    bias: bool
    trans_a: bool
    trans_b: bool
    fold: bool

    def __post_init__(self) -> None:
        act = (self.activation, self.coef) if self.coef is not None else self.activation
        parsed = _epilogue.activation(act, _FUNC)
        object.__setattr__(self, "activation", parsed and parsed[0])
        object.__setattr__(self, "coef", parsed and parsed[1])
        for name in ("bias", "trans_a", "trans_b", "fold"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{_FUNC}: {name}={getattr(self, name)!r}; expected a bool")
        if self.activation == "clipped_relu" and not self.bias:
            # the high level's rule (measured on cuDNN 9.19: the engines ignore the upper clip
            # straight on the product), checked here before any call
            raise ValueError(
                f"{_FUNC}: activation=('clipped_relu', {self.coef}) needs a bias (cuDNN's "
                "engines ignore the clip without one): pass bias=zeros or clamp the product"
            )

    def batch_operands(self) -> tuple[bool, ...]:
        return (self.fold and not self.trans_a, False) + ((False,) if self.bias else ())

    def results(self, *operands: Any) -> _ops.Results:
        a, b, *rest = operands
        shape, dt = product_shape(a, b, self.trans_a, self.trans_b)
        if self.bias:
            (bias,) = rest
            n = shape[-1]
            if tuple(bias.shape) != (n,) or np.dtype(bias.dtype) != dt:
                raise ValueError(
                    f"{_FUNC}: bias is {bias.dtype}{list(bias.shape)}; expected {dt}[{n}] (one "
                    "value per output column)"
                )
        return ((shape, dt),)

    def run(self, args: Sequence[Any], rets: Sequence[Any], stream: int) -> None:
        ops = views(args, rets)
        a, b, y = ops[0], ops[1], ops[-1]
        if self.trans_a:
            a = _transposed(a)
        if self.trans_b:
            b = _transposed(b)
        act = None if self.activation is None else (self.activation, self.coef)
        if act is not None and act[1] is None:
            act = act[0]
        bias = ops[2] if self.bias else None
        dnn_matmul(a, b, bias, act, out=y, stream=stream)


def product_shape(a: Any, b: Any, trans_a: bool, trans_b: bool) -> tuple[tuple, np.dtype]:
    """The product's shape and dtype after checking *a* and *b* (``TypeError``/``ValueError``
    naming them)."""
    dt = _request.check_dtype(_FUNC, "a", a, _TYPES)
    if np.dtype(b.dtype) != dt:
        raise TypeError(f"{_FUNC}: b is {b.dtype}, a {dt}; expected one dtype")
    if dt == np.dtype("float32") and not _call.snapshot().allow_tf32:
        raise TypeError(
            f"{_FUNC}: a and b are float32, whose cuDNN matmul engines compute in TF32: set "
            "pycudnn.config.allow_tf32 = True to accept that, or use float16/bfloat16"
        )
    sa, sb = tuple(a.shape), tuple(b.shape)
    if len(sa) < 2 or len(sb) < 2:
        raise ValueError(f"{_FUNC}: a {sa} and b {sb}; expected at least 2 dims each")
    if trans_a:
        sa = (*sa[:-2], sa[-1], sa[-2])
    if trans_b:
        sb = (*sb[:-2], sb[-1], sb[-2])
    if _request.known(sa[-1], sb[-2]) and sa[-1] != sb[-2]:
        raise ValueError(
            f"{_FUNC}: a's last dim ({sa[-1]}) must equal b's second to last ({sb[-2]}); "
            f"a {sa}, b {sb}"
        )
    rank = max(len(sa), len(sb))
    ba = (1,) * (rank - len(sa)) + sa[:-2]
    bb = (1,) * (rank - len(sb)) + sb[:-2]
    batch = []
    for i, (m, n) in enumerate(zip(ba, bb, strict=True)):
        if _request.known(m, n) and m != n and 1 not in (m, n):
            raise ValueError(
                f"{_FUNC}: batch dim {i} of a {sa} and b {sb} does not broadcast ({m} vs {n})"
            )
        batch.append(n if _request.known(m) and m == 1 else m)
    pairs = list(zip(ba, bb, strict=True))
    if any(_request.known(x, y) and x == 1 < y for x, y in pairs) and any(
        _request.known(x, y) and y == 1 < x for x, y in pairs
    ):
        raise ValueError(
            f"{_FUNC}: a {sa} and b {sb} each broadcast against the other; cuDNN's matmul "
            "broadcasts one operand's batch only (broadcast one of them first)"
        )
    shape = (*batch, sa[-2], sb[-1])
    if _request.known(*shape, sa[-1]) and 0 in (*shape, sa[-1]):
        raise ValueError(f"{_FUNC}: a {sa} and b {sb}: empty products are not supported")
    return shape, dt


def _activation_fn(name: str, coef: float | None) -> Callable[[Any], Any]:
    """The activation in ``jnp``, for its derivative at the pre-activation."""
    if name in ("silu", "swish"):
        return jax.nn.silu
    if name == "gelu":
        return lambda z: jax.nn.gelu(z, approximate=False)
    if name == "gelu_tanh":
        return lambda z: jax.nn.gelu(z, approximate=True)
    if name == "elu":
        return lambda z: jax.nn.elu(z, coef)
    raise NotImplementedError(name)


def _from_output(name: str, coef: float | None, y: Any, dy: Any) -> Any:
    """The activation's gradient from its output (float32)."""
    if name == "relu":
        return jnp.where(y > 0, dy, 0.0)
    if name == "clipped_relu":
        return jnp.where((y > 0) & (y < coef), dy, 0.0)
    if name == "sigmoid":
        return dy * y * (1.0 - y)
    return dy * (1.0 - y * y)  # tanh


def _sum_to(g: Any, shape: tuple[Any, ...]) -> Any:
    """*g* summed over the dims an operand of *shape* was broadcast along (float32 sums)."""
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, d in enumerate(shape[:-2]) if d == 1 and g.shape[lead + i] != 1
    )
    if not axes:
        return g
    acc = jnp.promote_types(g.dtype, jnp.float32)
    return jnp.sum(g, axis=axes, dtype=acc).reshape(shape).astype(g.dtype)


def _forward(request: Matmul, *operands: Any) -> tuple[Any, Any]:
    (y,) = _ops.call(request, *operands)
    return y, (operands, y)


def _plain(fold: bool, trans_a: bool = False, trans_b: bool = False, bias: bool = False) -> Matmul:
    return Matmul(None, None, bias, trans_a, trans_b, fold)


def _backward(request: Matmul, residuals: Any, dy: Any) -> tuple:
    operands, y = residuals
    a, b = operands[0], operands[1]
    act = request.activation
    if act is not None:
        acc = jnp.promote_types(y.dtype, jnp.float32)
        if act in _FROM_OUTPUT:
            dz = _from_output(act, request.coef, y.astype(acc), dy.astype(acc))
        else:  # the pre-activation, recomputed (the fused call did not keep it)
            (z,) = _ops.call(_plain(request.fold, bias=request.bias), *operands)
            _, pull = jax.vjp(_activation_fn(act, request.coef), z.astype(acc))
            (dz,) = pull(dy.astype(acc))
        dy = dz.astype(y.dtype)
    fold_b = b.ndim == 2
    (da,) = _ops.call(_plain(fold_b, trans_b=True), dy, b)
    grads = [_sum_to(da, tuple(a.shape))]
    if fold_b and a.ndim > 2:  # one product over the folded batch: (K, M') @ (M', N)
        k, n = a.shape[-1], dy.shape[-1]
        (db,) = _ops.call(_plain(True, trans_a=True), a.reshape(-1, k), dy.reshape(-1, n))
    else:
        (db,) = _ops.call(_plain(False, trans_a=True), a, dy)
    grads.append(_sum_to(db, tuple(b.shape)))
    if request.bias:
        bias = operands[2]
        acc = jnp.promote_types(dy.dtype, jnp.float32)
        axes = tuple(range(dy.ndim - 1))
        grads.append(jnp.sum(dy, axis=axes, dtype=acc).astype(bias.dtype))
    return tuple(grads)


_matmul = _ops.differentiable(_forward, _backward)


def matmul(
    a: Any,
    b: Any,
    *,
    bias: Any = None,
    activation: str | tuple[str, float] | None = None,
) -> jax.Array:
    """Batched ``activation(a @ b + bias)`` through cuDNN (``dnn_matmul``, one graph),
    differentiable in *a*, *b* and *bias*; ``jnp.matmul``'s shapes.

    Parameters
    ----------
    a : jax.Array
        ``(..., M, K)``; float16, bfloat16, or float32 with ``pycudnn.config.allow_tf32``
        (cuDNN computes float32 products in TF32).
    b : jax.Array
        ``(..., K, N)``, a's dtype; batch dims broadcast with a's (NumPy's rules; only one of
        the two may broadcast against the other).
    bias : jax.Array, optional
        ``(N,)``, a's dtype, added to each row. Keyword only.
    activation : str or (str, float), optional
        ``dnn_matmul``'s: ``'relu'``, ``'sigmoid'``, ``'tanh'``, ``'gelu'`` (erf),
        ``'gelu_tanh'``, ``'silu'``/``'swish'``, ``'elu'`` (or ``('elu', alpha)``), or
        ``('clipped_relu', upper)`` (with a bias). Keyword only.

    Returns
    -------
    jax.Array
        ``(*batch, M, N)``, a's dtype.

    Raises
    ------
    TypeError, ValueError
        At trace time: mixed or unsupported dtypes (float32 without ``allow_tf32``, as the
        tracing thread sees it), fewer than 2 dims, mismatched inner dims, batch dims that do
        not broadcast or broadcast both ways, a bad bias, an unknown activation.
    """
    a, b = jnp.asarray(a), jnp.asarray(b)
    name, coef = activation, None
    if isinstance(activation, tuple) and len(activation) == 2:
        name, coef = activation
    request = Matmul(name, coef, bias is not None, False, False, b.ndim == 2)
    operands = [a, b] if bias is None else [a, b, jnp.asarray(bias)]
    return _matmul(request, *operands)
