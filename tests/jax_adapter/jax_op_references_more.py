"""float64 numpy references of ``pycudnn.jax``'s batch norm, dropout, LRN and matmul, and the
host twin built from them (not a test module; ``jax_op_references`` has the other families').

As there, the references compute what each request asks of cuDNN, from numpy arrays: the GPU
tests compare the operations with them, and :func:`twin` runs them as the slow path of the
family targets on JAX's CPU platform. Dropout's twin draws its own mask from the seed operand
(numpy's generator: cuDNN's RNG cannot run on the host) and keeps it bit-packed in the mask
result, so the forward and backward agree as cuDNN's do.
"""

from __future__ import annotations

import math

import numpy as np
from jax_op_references import F64, to_first, to_last

from pycudnn.jax._dropout import seed_of


# -- batch norm ------------------------------------------------------------------------------------
def _bn_axes(x, spatial):
    return (0,) if not spatial else (0, *range(2, x.ndim))


def _bn_param(p, x, spatial):
    """A parameter (C,) or x.shape[1:] broadcast against channels-first *x*."""
    p = np.asarray(p, F64)
    return p.reshape(1, -1, *(1,) * (x.ndim - 2)) if spatial else p[None]


def batch_norm_train(spatial, eps, x, gamma, beta):
    """``(mean, invstd, y)`` (the request's result order), channels-first *x*."""
    x = np.asarray(x, F64)
    axes = _bn_axes(x, spatial)
    mean = x.mean(axis=axes)
    var = x.var(axis=axes)
    invstd = 1.0 / np.sqrt(var + eps)
    xhat = (x - _bn_param(mean, x, spatial)) * _bn_param(invstd, x, spatial)
    y = xhat * _bn_param(gamma, x, spatial) + _bn_param(beta, x, spatial)
    return mean, invstd, y


def batch_norm_grad(spatial, x, dy, gamma, mean, invstd):
    """``(dgamma, dbeta, dx)`` from the saved statistics, channels-first."""
    x, dy = np.asarray(x, F64), np.asarray(dy, F64)
    axes = _bn_axes(x, spatial)
    m = math.prod(x.shape[a] for a in axes)
    xhat = (x - _bn_param(mean, x, spatial)) * _bn_param(invstd, x, spatial)
    dbeta = dy.sum(axis=axes)
    dgamma = (dy * xhat).sum(axis=axes)
    scale = _bn_param(np.asarray(gamma, F64) * np.asarray(invstd, F64), x, spatial)
    dx = scale / m * (m * dy - _bn_param(dbeta, x, spatial) - xhat * _bn_param(dgamma, x, spatial))
    return dgamma, dbeta, dx


def batch_norm_inference(spatial, eps, x, gamma, beta, mean, var):
    x = np.asarray(x, F64)
    inv = 1.0 / np.sqrt(np.asarray(var, F64) + eps)
    xhat = (x - _bn_param(mean, x, spatial)) * _bn_param(inv, x, spatial)
    return xhat * _bn_param(gamma, x, spatial) + _bn_param(beta, x, spatial)


# -- dropout (the twin's own mask) -----------------------------------------------------------------
def dropout_keep(seed, shape, rate):
    """The twin's keep mask for *seed* (numpy's generator, not cuDNN's)."""
    return np.random.default_rng(seed).random(shape) >= rate


def pack_mask(keep, nbytes):
    bits = np.packbits(keep.reshape(-1).astype(np.uint8), bitorder="little")
    assert bits.size <= nbytes, (bits.size, nbytes)
    out = np.zeros(nbytes, np.uint8)
    out[: bits.size] = bits
    return out


def unpack_mask(mask, shape):
    n = math.prod(shape)
    return np.unpackbits(mask, bitorder="little")[:n].reshape(shape).astype(bool)


# -- LRN -------------------------------------------------------------------------------------------
def lrn(size, alpha, beta, k, x):
    """cuDNN's cross-channel LRN of channels-first *x* (window ``[c - (size - 1) // 2,
    c + size // 2]``)."""
    x = np.asarray(x, F64)
    c = x.shape[1]
    sq = x**2
    s = np.zeros_like(x)
    lo, hi = (size - 1) // 2, size // 2
    for ch in range(c):
        s[:, ch] = sq[:, max(ch - lo, 0) : min(ch + hi, c - 1) + 1].sum(axis=1)
    return x / (k + alpha / size * s) ** beta


def lrn_grad(size, alpha, beta, k, x, dy):
    """The gradient of :func:`lrn` w.r.t. *x* (its transpose written out)."""
    x, dy = np.asarray(x, F64), np.asarray(dy, F64)
    c = x.shape[1]
    lo, hi = (size - 1) // 2, size // 2
    sq = x**2
    s = np.zeros_like(x)
    for ch in range(c):
        s[:, ch] = sq[:, max(ch - lo, 0) : min(ch + hi, c - 1) + 1].sum(axis=1)
    d = k + alpha / size * s
    dx = dy * d**-beta
    # y_c depends on x_j for j in window(c): d y_c / d x_j = -beta * x_c * d_c**(-beta-1) *
    # alpha / size * 2 x_j
    t = dy * x * d ** (-beta - 1)
    for j in range(c):  # channels c whose window holds j: c - lo <= j <= c + hi
        cs = slice(max(j - hi, 0), min(j + lo, c - 1) + 1)
        dx[:, j] -= 2 * beta * alpha / size * x[:, j] * t[:, cs].sum(axis=1)
    return dx


# -- matmul ----------------------------------------------------------------------------------------
def _erf(z):
    from math import erf

    return np.vectorize(erf)(z)


def activation(name, coef, z):
    if name is None:
        return z
    if name == "relu":
        return np.maximum(z, 0)
    if name == "sigmoid":
        return 1 / (1 + np.exp(-z))
    if name == "tanh":
        return np.tanh(z)
    if name in ("silu", "swish"):
        return z / (1 + np.exp(-z))
    if name == "gelu":
        return 0.5 * z * (1 + _erf(z / np.sqrt(2)))
    if name == "gelu_tanh":
        return 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z**3)))
    if name == "elu":
        return np.where(z > 0, z, coef * np.expm1(np.minimum(z, 0)))
    if name == "clipped_relu":
        return np.clip(z, 0, coef)
    raise NotImplementedError(name)


def matmul(a, b, bias=None, act=None, coef=None, trans_a=False, trans_b=False):
    a, b = np.asarray(a, F64), np.asarray(b, F64)
    if trans_a:
        a = np.swapaxes(a, -1, -2)
    if trans_b:
        b = np.swapaxes(b, -1, -2)
    z = a @ b
    if bias is not None:
        z = z + np.asarray(bias, F64)
    return activation(act, coef, z)


# -- the host twin ---------------------------------------------------------------------------------
def compute(request, args, rets):
    """The results of one of this module's requests on numpy *args* (float64; the mask
    uint8); *rets* give the result shapes."""
    kind = type(request).__name__
    if kind.startswith("BatchNorm"):
        spatial, cl = request.mode == "spatial", request.channels_last
        first = lambda a: to_first(a) if cl and a.ndim > 2 else a  # noqa: E731
        last = lambda a: to_last(a) if cl and a.ndim > 2 else a  # noqa: E731
        if kind == "BatchNorm":
            x, gamma, beta = args
            mean, invstd, y = batch_norm_train(spatial, request.epsilon, first(x), gamma, beta)
            return [mean, invstd, last(y)]
        if kind == "BatchNormGrad":
            x, dy, gamma, mean, invstd = args
            dg, db, dx = batch_norm_grad(spatial, first(x), first(dy), gamma, mean, invstd)
            return [dg, db, last(dx)]
        x, *params = args
        return [last(batch_norm_inference(spatial, request.epsilon, first(x), *params))]
    if kind == "Dropout":
        x, seed = args
        keep = dropout_keep(seed_of(seed), x.shape, request.rate)
        scale = 1.0 / (1.0 - np.float32(request.rate))
        return [np.where(keep, x.astype(F64) * scale, 0.0), pack_mask(keep, rets[1].shape[0])]
    if kind == "DropoutGrad":
        dy, mask = args
        keep = unpack_mask(mask, dy.shape)
        scale = 1.0 / (1.0 - np.float32(request.rate))
        return [np.where(keep, dy.astype(F64) * scale, 0.0)]
    if kind in ("Lrn", "LrnGrad"):
        cl = request.channels_last and args[0].ndim > 2
        first = [to_first(a) if cl else a for a in args]
        p = (request.size, request.alpha, request.beta, request.k)
        out = lrn(*p, first[0]) if kind == "Lrn" else lrn_grad(*p, first[2], first[1])
        return [to_last(out) if cl else out]
    if kind == "Matmul":
        a, b, *rest = args
        bias = rest[0] if request.bias else None
        return [
            matmul(a, b, bias, request.activation, request.coef, request.trans_a, request.trans_b)
        ]
    raise NotImplementedError(kind)


def twin(request, call, stream):
    """The slow path of this module's family targets on JAX's CPU platform."""
    args = [b.numpy() for b in call.args]
    rets = [b.numpy() for b in call.rets]
    outs = compute(request, args, rets)
    assert len(outs) == len(rets), (request, len(outs), len(rets))
    for r, o in zip(rets, outs, strict=True):
        assert r.shape == np.shape(o), (request, r.shape, np.shape(o))
        r[...] = np.asarray(o).astype(r.dtype)
