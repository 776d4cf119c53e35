"""float64 NumPy references shared by the GPU tests and the GPU fuzzer (one formula each)."""

from __future__ import annotations

import itertools
import math

import numpy as np

__all__ = [
    "act_grad_ref",
    "act_ref",
    "conv_ref",
    "bn_axes",
    "bn_grad_ref",
    "bn_test_ref",
    "bn_train_ref",
    "ctc_ref",
    "grid_grad_ref",
    "grid_ref",
    "layer_norm_grad_ref",
    "layer_norm_ref",
    "log_softmax",
    "lrn_grad_ref",
    "lrn_ref",
    "lrn_window",
    "pool_grad_ref",
    "pool_ref",
    "reduction_ref",
    "rms_norm_grad_ref",
    "rms_norm_ref",
    "sample_grad_ref",
    "sample_ref",
    "sdpa_grad_ref",
    "sdpa_ref",
]


def act_ref(x, mode, coef):
    if mode == "relu":
        return np.maximum(x, 0)
    if mode == "sigmoid":
        return 1 / (1 + np.exp(-x))
    if mode == "tanh":
        return np.tanh(x)
    if mode == "clipped_relu":
        return np.minimum(np.maximum(x, 0), coef)
    if mode == "elu":
        return np.where(x > 0, x, coef * (np.exp(x) - 1))
    if mode == "swish":
        return x / (1 + np.exp(-coef * x))
    if mode == "gelu":  # erf form
        from math import erf

        return 0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2.0)))
    if mode == "gelu_tanh":
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    return x


def conv_ref(x, w, pads):
    """Cross-correlation of ``(N, C, *spatial)`` with ``(K, C, *kernel)`` filters, unit stride and
    dilation, one group, symmetric zero padding *pads*, in float64."""
    nd = x.ndim - 2
    xp = np.pad(np.asarray(x, np.float64), [(0, 0), (0, 0)] + [(p, p) for p in pads])
    out = [xp.shape[2 + i] - w.shape[2 + i] + 1 for i in range(nd)]
    y = np.zeros((x.shape[0], w.shape[0], *out))
    sp = "dhw"[-nd:]
    for off in np.ndindex(*w.shape[2:]):
        win = xp[
            (slice(None), slice(None), *(slice(o, o + n) for o, n in zip(off, out, strict=True)))
        ]
        y += np.einsum(f"kc,nc{sp}->nk{sp}", np.asarray(w, np.float64)[(Ellipsis, *off)], win)
    return y


def act_grad_ref(x, y, dy, mode, coef):
    if mode == "relu":
        return dy * (x > 0)
    if mode == "sigmoid":
        return dy * y * (1 - y)
    if mode == "tanh":
        return dy * (1 - y * y)
    if mode == "clipped_relu":
        return dy * ((x > 0) & (x < coef))
    if mode == "elu":
        return dy * np.where(x > 0, 1.0, y + coef)
    if mode == "swish":
        s = 1 / (1 + np.exp(-coef * x))
        return dy * (s + coef * x * s * (1 - s))
    return dy


# -- pool (from tests/highlevel/test_pool_gpu.py) --------------------------------------------------
def _pool_windows(a, ws, stride):
    """``a[n, c, *out, *ws]``: the strided pooling windows of an (already padded) array."""
    nd = len(ws)
    win = np.lib.stride_tricks.sliding_window_view(a, ws, axis=tuple(range(2, 2 + nd)))
    return win[(slice(None), slice(None), *(slice(None, None, s) for s in stride))]


def pool_ref(x, ws, stride, pad, mode):
    nd = len(ws)
    padding = [(0, 0), (0, 0)] + [(p, p) for p in pad]
    axes = tuple(range(-nd, 0))
    if mode.startswith("max"):
        return _pool_windows(np.pad(x, padding, constant_values=-np.inf), ws, stride).max(axes)
    total = _pool_windows(np.pad(x, padding), ws, stride).sum(axes)
    if mode == "sum":
        return total
    if mode == "average_inc_pad":
        return total / math.prod(ws)
    count = _pool_windows(np.pad(np.ones_like(x), padding), ws, stride).sum(axes)
    return total / count


def pool_grad_ref(x, dy, ws, stride, pad, mode):
    """d(sum(pool(x) * dy)) / dx, window offset by window offset."""
    nd = len(ws)
    padding = [(0, 0), (0, 0)] + [(p, p) for p in pad]
    xp = np.pad(x, padding, constant_values=-np.inf)
    y = pool_ref(x, ws, stride, pad, mode)
    out = dy.shape[2:]
    if mode == "average_exc_pad":
        count = _pool_windows(np.pad(np.ones_like(x), padding), ws, stride).sum(
            tuple(range(-nd, 0))
        )
    dxp = np.zeros(xp.shape)
    for k in itertools.product(*(range(w) for w in ws)):
        taps = (slice(k[i], k[i] + stride[i] * (out[i] - 1) + 1, stride[i]) for i in range(nd))
        sl = (slice(None), slice(None), *taps)
        if mode.startswith("max"):
            dxp[sl] += dy * (xp[sl] == y)
        elif mode == "sum":
            dxp[sl] += dy
        elif mode == "average_inc_pad":
            dxp[sl] += dy / math.prod(ws)
        else:
            dxp[sl] += dy / count
    return dxp[
        (
            slice(None),
            slice(None),
            *(slice(p, p + n) for p, n in zip(pad, x.shape[2:], strict=True)),
        )
    ]


# -- batchnorm (from tests/highlevel/test_batchnorm_gpu.py) ----------------------------------------
def bn_axes(ndim, mode):
    return (0,) if mode == "per-activation" else (0, *range(2, ndim))


def bn_train_ref(x, g, b, mode, eps, factor, rm, rv):
    axes = bn_axes(x.ndim, mode)
    mean = x.mean(axes, keepdims=True)
    var = x.var(axes, keepdims=True)
    invstd = 1.0 / np.sqrt(var + eps)
    out = (x - mean) * g * invstd + b
    m = x.size / mean.size
    new_rm = rm * (1 - factor) + mean * factor
    new_rv = rv * (1 - factor) + (m / (m - 1)) * var * factor
    return out, mean, invstd, new_rm, new_rv


def bn_test_ref(x, g, b, mean, var, eps):
    return (x - mean) * g / np.sqrt(var + eps) + b


def bn_grad_ref(x, dy, scale, mean, invstd, mode):
    axes = bn_axes(x.ndim, mode)
    m = x.size / mean.size
    xhat = (x - mean) * invstd
    dbias = dy.sum(axes, keepdims=True)
    dscale = (dy * xhat).sum(axes, keepdims=True)
    dx = scale * invstd / m * (m * dy - dbias - xhat * dscale)
    return dx, dscale, dbias


# -- lrn (from tests/highlevel/test_lrn_gpu.py) ----------------------------------------------------
def lrn_window(c, n, channels):
    lb = (n - 1) // 2
    return max(0, c - lb), min(channels, c + n - lb)


def lrn_ref(x, n, alpha, beta, k):
    sq = x * x
    s = np.empty_like(x)
    for c in range(x.shape[1]):
        lo, hi = lrn_window(c, n, x.shape[1])
        s[:, c] = sq[:, lo:hi].sum(axis=1)
    s = k + alpha / n * s
    return x * s**-beta, s


def lrn_grad_ref(x, dy, n, alpha, beta, k):
    _, s = lrn_ref(x, n, alpha, beta, k)
    t = dy * x * s ** (-beta - 1)
    acc = np.zeros_like(x)
    for c in range(x.shape[1]):  # channel c's window feeds every i in it
        lo, hi = lrn_window(c, n, x.shape[1])
        acc[:, lo:hi] += t[:, c : c + 1]
    return dy * s**-beta - 2 * alpha * beta / n * x * acc


# -- reduction (from tests/highlevel/test_reduction_gpu.py) ----------------------------------------
def reduction_ref(x, op, axis=None, keepdims=False):
    if op == "add":
        return x.sum(axis=axis, keepdims=keepdims)
    if op == "mul":
        return x.prod(axis=axis, keepdims=keepdims)
    if op == "min":
        return x.min(axis=axis, keepdims=keepdims)
    if op == "max":
        return x.max(axis=axis, keepdims=keepdims)
    if op == "amax":
        return np.abs(x).max(axis=axis, keepdims=keepdims)
    if op == "avg":
        return x.mean(axis=axis, keepdims=keepdims)
    if op == "norm1":
        return np.abs(x).sum(axis=axis, keepdims=keepdims)
    if op == "norm2":
        return np.sqrt((x * x).sum(axis=axis, keepdims=keepdims))
    return np.where(x == 0, 1.0, x).prod(axis=axis, keepdims=keepdims)  # mul_no_zeros


# -- spatialtf (from tests/highlevel/test_spatialtf_gpu.py) ----------------------------------------
def _st_base(h, w):
    xs, ys = np.linspace(-1, 1, w), np.linspace(-1, 1, h)
    return np.stack(np.broadcast_arrays(xs[None, :], ys[:, None], np.ones((h, w))), -1)


def grid_ref(theta, h, w):
    return np.einsum("hwj,nij->nhwi", _st_base(h, w), theta)


def grid_grad_ref(dgrid):
    return np.einsum("nhwi,hwj->nij", dgrid, _st_base(*dgrid.shape[1:3]))


def _st_corners(img, grid):
    n_, _, h, w = img.shape
    x = (grid[..., 0] + 1) * (w - 1) / 2
    y = (grid[..., 1] + 1) * (h - 1) / 2
    x0, y0 = np.floor(x).astype(np.int64), np.floor(y).astype(np.int64)
    wx, wy = x - x0, y - y0
    n = np.arange(n_)[:, None, None]

    def at(dy_, dx_):
        yi, xi = y0 + dy_, x0 + dx_
        ok = (yi >= 0) & (yi < h) & (xi >= 0) & (xi < w)
        v = img[n, :, np.clip(yi, 0, h - 1), np.clip(xi, 0, w - 1)]  # (N, Ho, Wo, C)
        return np.where(ok[..., None], v, 0.0), ok, yi, xi

    return wx, wy, at


def sample_ref(img, grid):
    wx, wy, at = _st_corners(img, grid)
    out = 0.0
    for dy_, dx_, wgt in (
        (0, 0, (1 - wy) * (1 - wx)),
        (0, 1, (1 - wy) * wx),
        (1, 0, wy * (1 - wx)),
        (1, 1, wy * wx),
    ):
        out = out + wgt[..., None] * at(dy_, dx_)[0]
    return out.transpose(0, 3, 1, 2)


def sample_grad_ref(img, grid, dy):
    n_, c, h, w = img.shape
    wx, wy, at = _st_corners(img, grid)
    g = dy.transpose(0, 2, 3, 1)  # (N, Ho, Wo, C)
    dimg = np.zeros_like(img)
    n = np.broadcast_to(np.arange(n_)[:, None, None], wx.shape)
    v = {}
    for dy_, dx_, wgt in (
        (0, 0, (1 - wy) * (1 - wx)),
        (0, 1, (1 - wy) * wx),
        (1, 0, wy * (1 - wx)),
        (1, 1, wy * wx),
    ):
        val, ok, yi, xi = at(dy_, dx_)
        v[dy_, dx_] = val
        for ch in range(c):
            np.add.at(dimg, (n[ok], ch, yi[ok], xi[ok]), (g[..., ch] * wgt)[ok])
    dodx = (1 - wy)[..., None] * (v[0, 1] - v[0, 0]) + wy[..., None] * (v[1, 1] - v[1, 0])
    dody = (1 - wx)[..., None] * (v[1, 0] - v[0, 0]) + wx[..., None] * (v[1, 1] - v[0, 1])
    dgrid = np.stack([(g * dodx).sum(-1) * (w - 1) / 2, (g * dody).sum(-1) * (h - 1) / 2], -1)
    return dimg, dgrid


# -- ctc (from tests/highlevel/test_ctc_gpu.py) ----------------------------------------------------
def log_softmax(u):
    m = u.max(-1, keepdims=True)
    return u - m - np.log(np.exp(u - m).sum(-1, keepdims=True))


def ctc_ref(lp, labels, lens, ilens):
    """(loss per sample, gradient w.r.t. the softmax input) of log-probabilities (T, N, C)."""
    _, n_, c_ = lp.shape
    loss = np.zeros(n_)
    grad = np.zeros_like(lp)
    off = 0
    for b in range(n_):
        lab = labels[off : off + lens[b]]
        off += lens[b]
        tb = ilens[b]
        ext = np.zeros(2 * len(lab) + 1, np.int64)
        ext[1::2] = lab
        s_ = len(ext)
        skip = np.zeros(s_, bool)  # s may come from s - 2
        skip[2:] = (ext[2:] != 0) & (ext[2:] != ext[:-2])
        e = lp[:tb, b][:, ext]  # (tb, S) emissions
        la = np.full((tb, s_), -np.inf)
        la[0, :2] = e[0, :2]
        for t in range(1, tb):
            a = la[t - 1].copy()
            a[1:] = np.logaddexp(a[1:], la[t - 1, :-1])
            a[2:] = np.where(skip[2:], np.logaddexp(a[2:], la[t - 1, :-2]), a[2:])
            la[t] = a + e[t]
        lb = np.full((tb, s_), -np.inf)
        lb[tb - 1, -2:] = e[tb - 1, -2:]
        for t in range(tb - 2, -1, -1):
            bb = lb[t + 1].copy()
            bb[:-1] = np.logaddexp(bb[:-1], lb[t + 1, 1:])
            bb[:-2] = np.where(skip[2:], np.logaddexp(bb[:-2], lb[t + 1, 2:]), bb[:-2])
            lb[t] = bb + e[t]
        logp = np.logaddexp(la[tb - 1, -1], la[tb - 1, -2])
        if not np.isfinite(logp):  # the labels do not fit: zero_oob
            continue
        loss[b] = -logp
        ab = la + lb
        for t in range(tb):
            occ = np.full(c_, -np.inf)
            np.logaddexp.at(occ, ext, ab[t])
            grad[t, b] = np.exp(lp[t, b]) - np.exp(occ - lp[t, b] - logp)
    return loss, grad


# -- transformer operations (tests/highlevel/test_transformer_gpu.py) -----------------------------
def _rows2d(x, nn):
    """*x* as (M, N): the leading dims are rows, the trailing *nn* dims features."""
    x = np.asarray(x, np.float64)
    return x.reshape(-1, math.prod(x.shape[x.ndim - nn :]))


def layer_norm_ref(x, nn, gamma=None, beta=None, eps=1e-5):
    """``(y, mean, inv_std)`` over the trailing *nn* dims (biased variance); the statistics
    shaped ``(*lead, 1, ..., 1)``."""
    shape = np.shape(x)
    x2 = _rows2d(x, nn)
    mean = x2.mean(1, keepdims=True)
    inv = 1.0 / np.sqrt(((x2 - mean) ** 2).mean(1, keepdims=True) + eps)
    y = (x2 - mean) * inv
    if gamma is not None:
        y = y * np.asarray(gamma, np.float64).reshape(1, -1)
    if beta is not None:
        y = y + np.asarray(beta, np.float64).reshape(1, -1)
    sshape = (*shape[: len(shape) - nn], *(1,) * nn)
    return y.reshape(shape), mean.reshape(sshape), inv.reshape(sshape)


def layer_norm_grad_ref(dy, x, nn, gamma=None, eps=1e-5):
    """``(dx, dgamma, dbeta)`` of :func:`layer_norm_ref` (dgamma/dbeta of normalized shape)."""
    shape = np.shape(x)
    x2, dy2 = _rows2d(x, nn), _rows2d(dy, nn)
    mean = x2.mean(1, keepdims=True)
    inv = 1.0 / np.sqrt(((x2 - mean) ** 2).mean(1, keepdims=True) + eps)
    xhat = (x2 - mean) * inv
    g = np.ones(x2.shape[1]) if gamma is None else np.asarray(gamma, np.float64).reshape(-1)
    dxhat = dy2 * g
    dx = inv * (dxhat - dxhat.mean(1, keepdims=True) - xhat * (dxhat * xhat).mean(1, keepdims=True))
    nshape = shape[len(shape) - nn :]
    return dx.reshape(shape), (dy2 * xhat).sum(0).reshape(nshape), dy2.sum(0).reshape(nshape)


def rms_norm_ref(x, nn, gamma=None, eps=1e-6):
    """``(y, inv_rms)``, ``inv_rms = 1 / sqrt(mean(x**2) + eps)`` over the trailing *nn* dims."""
    shape = np.shape(x)
    x2 = _rows2d(x, nn)
    inv = 1.0 / np.sqrt((x2 * x2).mean(1, keepdims=True) + eps)
    y = x2 * inv
    if gamma is not None:
        y = y * np.asarray(gamma, np.float64).reshape(1, -1)
    return y.reshape(shape), inv.reshape((*shape[: len(shape) - nn], *(1,) * nn))


def rms_norm_grad_ref(dy, x, nn, gamma=None, eps=1e-6):
    """``(dx, dgamma)`` of :func:`rms_norm_ref`."""
    shape = np.shape(x)
    x2, dy2 = _rows2d(x, nn), _rows2d(dy, nn)
    inv = 1.0 / np.sqrt((x2 * x2).mean(1, keepdims=True) + eps)
    g = np.ones(x2.shape[1]) if gamma is None else np.asarray(gamma, np.float64).reshape(-1)
    dxhat = dy2 * g
    dx = inv * (dxhat - x2 * inv**2 * (dxhat * x2).mean(1, keepdims=True))
    return dx.reshape(shape), (dy2 * x2 * inv).sum(0).reshape(shape[len(shape) - nn :])


def _sdpa_probs(q, k, causal, scale, lens_q, lens_kv):
    """``(P, lse, k repeated over the query heads, scale)``: the softmax of the masked scores
    (rows with every key masked: P = 0, lse = -inf)."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    b, hq, sq, d = q.shape
    group = hq // k.shape[1]
    kr = np.repeat(k, group, axis=1)  # query head h reads key head h // group
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    s = scale * q @ kr.transpose(0, 1, 3, 2)
    skv = s.shape[-1]
    row = np.arange(sq)[:, None]
    col = np.arange(skv)[None, :]
    keep = np.ones((b, 1, sq, skv), bool)
    if causal:  # top-left aligned, as torch's is_causal
        keep &= (col <= row)[None, None]
    if lens_q is not None:
        lq = np.asarray(lens_q).reshape(b, 1, 1, 1)
        lkv = np.asarray(lens_kv).reshape(b, 1, 1, 1)
        keep &= (row[None, None] < lq) & (col[None, None] < lkv)
    s = np.where(keep, s, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    z = e.sum(-1, keepdims=True)
    p = np.divide(e, z, out=np.zeros_like(e), where=z > 0)
    with np.errstate(divide="ignore"):
        lse = m + np.log(z)
    return p, lse, kr, scale


def sdpa_ref(
    q, k, v, causal=False, scale=None, lens_q=None, lens_kv=None, drop_mask=None, dropout_p=0.0
):
    """Scaled dot-product attention in float64: ``(o, lse)``; q (B, H, S_q, D), k/v
    (B, H_k, S_kv, D/D_v) with H a multiple of H_k; *lens_q*/*lens_kv* per-batch valid lengths
    (rows past lens_q come out 0, lse -inf); *drop_mask* (B, H, S_q, S_kv) of 0/1 scales the
    kept weights by 1 / (1 - dropout_p). lse (B, H, S_q, 1) is the log-sum-exp of the scaled
    scores (before dropout)."""
    p, lse, _kr, _scale = _sdpa_probs(q, k, causal, scale, lens_q, lens_kv)
    if drop_mask is not None:
        p = p * drop_mask / (1.0 - dropout_p)
    vr = np.repeat(np.asarray(v, np.float64), q.shape[1] // v.shape[1], axis=1)
    return p @ vr, lse


def sdpa_grad_ref(
    q, k, v, do, causal=False, scale=None, lens_q=None, lens_kv=None, drop_mask=None, dropout_p=0.0
):
    """``(dq, dk, dv)`` of ``sum(sdpa_ref(...)[0] * do)``; dk and dv summed over each group of
    query heads (grouped-query attention)."""
    q, v, do = (np.asarray(a, np.float64) for a in (q, v, do))
    b, hq, _sq, _d = q.shape
    hk = np.shape(k)[1]
    p, _lse, kr, scale = _sdpa_probs(q, k, causal, scale, lens_q, lens_kv)
    vr = np.repeat(v, hq // hk, axis=1)
    keep = 1.0 if drop_mask is None else drop_mask / (1.0 - dropout_p)
    pd = p * keep
    dv = pd.transpose(0, 1, 3, 2) @ do
    dp = (do @ vr.transpose(0, 1, 3, 2)) * keep
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    dq = scale * ds @ kr
    dk = scale * ds.transpose(0, 1, 3, 2) @ q

    def heads(a):
        return a.reshape(b, hk, hq // hk, *a.shape[2:]).sum(2)

    return dq, heads(dk), heads(dv)
