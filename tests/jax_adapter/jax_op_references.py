"""float64 numpy references of ``pycudnn.jax``'s operations, forward and backward, and the host
twins built from them (not a test module).

The references compute what each request of ``pycudnn.jax`` asks of cuDNN, in float64, from
numpy arrays: the GPU tests compare the operations with them, and :func:`twin` runs them as the
slow path of a family's FFI target on JAX's CPU platform, so the CPU tests exercise the same
calls, attributes, result shapes, batching and gradients with numpy in cuDNN's place.
"""

from __future__ import annotations

import itertools

import numpy as np

F64 = np.float64


# -- activations -----------------------------------------------------------------------------------
def activation(mode, coef, x):
    x = x.astype(F64)
    if mode == "relu":
        return np.maximum(x, 0)
    if mode == "sigmoid":
        return 1 / (1 + np.exp(-x))
    if mode == "tanh":
        return np.tanh(x)
    if mode == "clipped_relu":
        return np.clip(x, 0, coef)
    if mode == "elu":
        return np.where(x > 0, x, coef * np.expm1(np.minimum(x, 0)))
    if mode == "swish":
        return x / (1 + np.exp(-coef * x))
    return x


def activation_grad(mode, coef, x, y, dy):
    """The input gradient as cuDNN computes it: from the output *y* for sigmoid and tanh (so a
    caller may pass y for x, as the convolution's epilogue does), from *x* otherwise."""
    x, y, dy = x.astype(F64), y.astype(F64), dy.astype(F64)
    if mode == "relu":
        return dy * (x > 0)
    if mode == "sigmoid":
        return dy * y * (1 - y)
    if mode == "tanh":
        return dy * (1 - y * y)
    if mode == "clipped_relu":
        return dy * ((x > 0) & (x < coef))
    if mode == "elu":
        return dy * np.where(x > 0, 1, coef * np.exp(np.minimum(x, 0)))
    if mode == "swish":
        s = 1 / (1 + np.exp(-coef * x))
        return dy * (s + coef * x * s * (1 - s))
    return dy


# -- softmax over axis 1 ---------------------------------------------------------------------------
def softmax(algo, x):
    x = x.astype(F64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    s = e / e.sum(axis=1, keepdims=True)
    return np.log(s) if algo == "log" else s


def softmax_grad(algo, y, dy):
    y, dy = y.astype(F64), dy.astype(F64)
    if algo == "log":
        return dy - np.exp(y) * dy.sum(axis=1, keepdims=True)
    return y * (dy - (dy * y).sum(axis=1, keepdims=True))


# -- pooling (channels first) ----------------------------------------------------------------------
def _windows(x, window, strides, padding, fill):
    nd = len(window)
    pad = [(0, 0), (0, 0)] + [(p, p) for p in padding]
    xp = np.pad(x.astype(F64), pad, constant_values=fill)
    view = np.lib.stride_tricks.sliding_window_view(xp, window, axis=tuple(range(2, 2 + nd)))
    return view[(slice(None), slice(None), *(slice(None, None, s) for s in strides))]


def _inside(shape, window, strides, padding):
    """1 where a window element is an input element (not padding)."""
    return _windows(np.ones((1, 1, *shape[2:])), window, strides, padding, 0.0)


def pool(mode, window, strides, padding, x):
    nd = len(window)
    axes = tuple(range(-nd, 0))
    if mode == "max":
        return _windows(x, window, strides, padding, -np.inf).max(axis=axes)
    s = _windows(x, window, strides, padding, 0.0).sum(axis=axes)
    if mode == "average_inc_pad":
        return s / np.prod(window)
    return s / _inside(x.shape, window, strides, padding).sum(axis=axes)


def pool_grad(mode, window, strides, padding, x, dy):
    """The input gradient, window by window (ties: the first maximum, as argmax picks)."""
    nd = len(window)
    dy = dy.astype(F64)
    xp_shape = (*x.shape[:2], *(n + 2 * p for n, p in zip(x.shape[2:], padding, strict=True)))
    dxp = np.zeros(xp_shape)
    win = _windows(x, window, strides, padding, -np.inf if mode == "max" else 0.0)
    if mode == "average_exc_pad":
        count = _inside(x.shape, window, strides, padding).sum(axis=tuple(range(-nd, 0)))
    for out_idx in itertools.product(*(range(n) for n in dy.shape[2:])):
        starts = [o * s for o, s in zip(out_idx, strides, strict=True)]
        region = (
            slice(None),
            slice(None),
            *(slice(b, b + w) for b, w in zip(starts, window, strict=True)),
        )
        g = dy[(slice(None), slice(None), *out_idx)]
        if mode == "max":
            w = win[(slice(None), slice(None), *out_idx)]
            flat = w.reshape(*w.shape[:2], -1)
            mask = np.zeros_like(flat)
            np.put_along_axis(mask, flat.argmax(axis=-1)[..., None], 1.0, axis=-1)
            dxp[region] += mask.reshape(w.shape) * g.reshape(*g.shape, *(1,) * nd)
        else:
            div = np.prod(window) if mode == "average_inc_pad" else count[0, 0][out_idx]
            dxp[region] += (g / div).reshape(*g.shape, *(1,) * nd)
    inner = (
        slice(None),
        slice(None),
        *(slice(p, p + n) for p, n in zip(padding, x.shape[2:], strict=True)),
    )
    return dxp[inner]


# -- norms over the trailing ndim dims -------------------------------------------------------------
def _rows(x, ndim):
    return x.astype(F64).reshape(-1, int(np.prod(x.shape[x.ndim - ndim :])))


def layer_norm(ndim, eps, x, gamma, beta):
    r = _rows(x, ndim)
    mean = r.mean(axis=1, keepdims=True)
    inv = 1 / np.sqrt(r.var(axis=1, keepdims=True) + eps)
    y = (r - mean) * inv * gamma.astype(F64).reshape(1, -1) + beta.astype(F64).reshape(1, -1)
    stat = (*x.shape[: x.ndim - ndim], *(1,) * ndim)
    return y.reshape(x.shape), mean.reshape(stat), inv.reshape(stat)


def layer_norm_grad(ndim, dy, x, gamma, mean, inv):
    r, g = _rows(x, ndim), _rows(dy, ndim)
    m, i = mean.astype(F64).reshape(-1, 1), inv.astype(F64).reshape(-1, 1)
    xhat = (r - m) * i
    gm = gamma.astype(F64).reshape(1, -1)
    dxhat = g * gm
    dx = i * (
        dxhat
        - dxhat.mean(axis=1, keepdims=True)
        - xhat * (dxhat * xhat).mean(axis=1, keepdims=True)
    )
    return (
        dx.reshape(x.shape),
        (g * xhat).sum(0).reshape(gamma.shape),
        g.sum(0).reshape(gamma.shape),
    )


def rms_norm(ndim, eps, x, gamma):
    r = _rows(x, ndim)
    inv = 1 / np.sqrt((r * r).mean(axis=1, keepdims=True) + eps)
    y = r * inv * gamma.astype(F64).reshape(1, -1)
    stat = (*x.shape[: x.ndim - ndim], *(1,) * ndim)
    return y.reshape(x.shape), inv.reshape(stat)


def rms_norm_grad(ndim, dy, x, gamma, inv):
    r, g = _rows(x, ndim), _rows(dy, ndim)
    i = inv.astype(F64).reshape(-1, 1)
    xhat = r * i
    dxhat = g * gamma.astype(F64).reshape(1, -1)
    dx = i * (dxhat - xhat * (dxhat * xhat).mean(axis=1, keepdims=True))
    return dx.reshape(x.shape), (g * xhat).sum(0).reshape(gamma.shape)


# -- convolution (cross-correlation, channels first) -----------------------------------------------
def _offsets(kernel):
    return itertools.product(*(range(k) for k in kernel))


def _slab(a, offset, out_sp, strides, dilation):
    """a[:, :, o*d + s*t ...] for every output position t (a view)."""
    idx = [slice(None), slice(None)]
    for o, n, s, d in zip(offset, out_sp, strides, dilation, strict=True):
        idx.append(slice(o * d, o * d + s * (n - 1) + 1, s))
    return tuple(idx)


def conv(x, w, strides, padding, dilation, groups):
    x, w = x.astype(F64), w.astype(F64)
    nd = w.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in padding])
    n = x.shape[0]
    k, cg = w.shape[:2]
    out_sp = [
        (xp.shape[2 + i] - dilation[i] * (w.shape[2 + i] - 1) - 1) // strides[i] + 1
        for i in range(nd)
    ]
    y = np.zeros((n, groups, k // groups, *out_sp))
    wg = w.reshape(groups, k // groups, cg, *w.shape[2:])
    for off in _offsets(w.shape[2:]):
        xs = xp[_slab(xp, off, out_sp, strides, dilation)].reshape(n, groups, cg, *out_sp)
        y += np.einsum("ngc...,gkc->ngk...", xs, wg[(Ellipsis, *off)])
    return y.reshape(n, k, *out_sp)


def conv_grad_input(w, dy, x_shape, strides, padding, dilation, groups):
    w, dy = w.astype(F64), dy.astype(F64)
    n, c = x_shape[:2]
    k, cg = w.shape[:2]
    out_sp = dy.shape[2:]
    xp_shape = (n, c, *(s + 2 * p for s, p in zip(x_shape[2:], padding, strict=True)))
    dxp = np.zeros(xp_shape)
    wg = w.reshape(groups, k // groups, cg, *w.shape[2:])
    dyg = dy.reshape(n, groups, k // groups, *out_sp)
    for off in _offsets(w.shape[2:]):
        contrib = np.einsum("ngk...,gkc->ngc...", dyg, wg[(Ellipsis, *off)])
        dxp[_slab(dxp, off, out_sp, strides, dilation)] += contrib.reshape(n, c, *out_sp)
    inner = (
        slice(None),
        slice(None),
        *(slice(p, p + s) for p, s in zip(padding, x_shape[2:], strict=True)),
    )
    return dxp[inner]


def conv_grad_filter(x, dy, w_shape, strides, padding, dilation, groups):
    x, dy = x.astype(F64), dy.astype(F64)
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in padding])
    n = x.shape[0]
    k, cg = w_shape[:2]
    out_sp = dy.shape[2:]
    dyg = dy.reshape(n, groups, k // groups, *out_sp)
    dw = np.zeros((groups, k // groups, cg, *w_shape[2:]))
    for off in _offsets(w_shape[2:]):
        xs = xp[_slab(xp, off, out_sp, strides, dilation)].reshape(n, groups, cg, *out_sp)
        flat = xs.reshape(n, groups, cg, -1)
        dw[(Ellipsis, *off)] = np.einsum(
            "ngkp,ngcp->gkc", dyg.reshape(*flat.shape[:2], -1, flat.shape[-1]), flat
        )
    return dw.reshape(w_shape)


# -- layouts ---------------------------------------------------------------------------------------
def to_first(a):
    """A channels-last array in channels-first order."""
    return np.moveaxis(a, -1, 1)


def to_last(a):
    """A channels-first array in channels-last order."""
    return np.moveaxis(a, 1, -1)


# -- the host twins: each request computed from the call's host buffers ----------------------------
def compute(request, args):
    """The results of *request* (a ``pycudnn.jax`` request) on numpy *args*, in float64."""
    kind = type(request).__name__
    if kind == "Activation":
        return [activation(request.mode, request.coef, args[0])]
    if kind == "ActivationGrad":
        y, dy, x = args
        return [activation_grad(request.mode, request.coef, x, y, dy)]
    if kind == "Softmax":
        return [softmax(request.algo, args[0])]
    if kind == "SoftmaxGrad":
        return [softmax_grad(request.algo, *args)]
    if kind in ("Pool", "PoolGrad"):
        geo = (request.mode, request.window, request.strides, request.padding)
        first = [to_first(a) for a in args] if request.channels_last else list(args)
        out = pool(*geo, first[0]) if kind == "Pool" else pool_grad(*geo, first[0], first[2])
        return [to_last(out) if request.channels_last else out]
    if kind == "Norm":
        if request.rms:
            return list(rms_norm(request.ndim, request.epsilon, *args))
        return list(layer_norm(request.ndim, request.epsilon, *args))
    if kind == "NormGrad":
        if request.rms:
            return list(rms_norm_grad(request.ndim, *args))
        return list(layer_norm_grad(request.ndim, *args))
    raise NotImplementedError(kind)


def conv_compute(request, args, rets):
    """A convolution request's result (float64) on numpy *args*; *rets* give the result's
    shape (the backward directions take it from there)."""
    kind = type(request).__name__
    cl = request.channels_last
    first = [to_first(a) if cl and a.ndim > 2 else a for a in args]
    geo = (request.strides, request.padding, request.dilation, request.groups)
    out_shape = to_first(np.empty(rets[0].shape)).shape if cl else rets[0].shape
    if kind == "ConvForward":
        x, w, *rest = first
        y = conv(x, w, *geo)
        if request.residual:
            y = y + rest[-1]
        if request.bias:
            y = y + rest[0].astype(F64).reshape(1, -1, *(1,) * (y.ndim - 2))
        if request.activation:
            y = activation(request.activation, 0.0, y)
    elif kind == "ConvBackwardData":
        y = conv_grad_input(first[0], first[1], out_shape, *geo)
    else:
        y = conv_grad_filter(first[0], first[1], out_shape, *geo)
    return to_last(y) if cl else y


def twin(request, call, stream):
    """The slow path of a family's target on JAX's CPU platform: the reference's results
    written into XLA's host buffers in their dtypes."""
    args = [b.numpy() for b in call.args]
    rets = [b.numpy() for b in call.rets]
    if type(request).__name__.startswith("Conv"):
        outs = [conv_compute(request, args, rets)]
    else:
        outs = compute(request, args)
    assert len(outs) == len(rets), (request, len(outs), len(rets))
    for r, o in zip(rets, outs, strict=True):
        assert r.shape == o.shape, (request, r.shape, o.shape)
        r[...] = o.astype(r.dtype)


_TWINS: set[str] = set()


def register_twins(*families, twin=twin):
    """Register each family's target on JAX's CPU platform with *twin* (this module's
    :func:`twin` by default), once a process (test modules share the families)."""
    from pycudnn.jax import _ops

    for family in families:
        if family not in _TWINS:
            _ops.register_twin(family, twin)
            _TWINS.add(family)
