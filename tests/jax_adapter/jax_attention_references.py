"""float64 numpy references of ``pycudnn.jax``'s attention, CTC loss and spatial transformer,
forward and backward, and the host twin built from them (not a test module): what each request
asks of cuDNN, computed from numpy arrays. The GPU tests compare with them; :func:`twin` runs
them as the slow path of the ``attention``, ``ctc`` and ``spatialtf`` targets on JAX's CPU
platform (as ``jax_op_references.twin`` does for the first families)."""

from __future__ import annotations

import numpy as np

from pycudnn.highlevel.attention._masks import alibi_slopes

F64 = np.float64
FAMILIES = ("attention", "ctc", "spatialtf")


# -- attention (jax.nn.dot_product_attention's layout: (B, T, N, H)) -------------------------------
def keep_mask(causal, left, right, t, s, q_lens=None, kv_lens=None):
    """Where the scores are kept, bool ``(B or 1, 1, T, S)``; *left*/*right* cuDNN's band
    (``i - left < j <= i + right``)."""
    i = np.arange(t)[:, None]
    j = np.arange(s)[None, :]
    keep = np.ones((t, s), bool)
    if causal:
        keep &= j <= i
    if right is not None:
        keep &= j <= i + right
    if left is not None:
        keep &= j > i - left
    keep = keep[None, None]
    if q_lens is not None:
        keep = keep & (i[None, None] < np.asarray(q_lens)[:, None, None, None])
        keep = keep & (j[None, None] < np.asarray(kv_lens)[:, None, None, None])
    return keep


def _probabilities(scale, causal, left, right, alibi, q, k, lens, bias):
    """``(p, lse)``: the attention weights ``(B, N, T, S)`` (rows with nothing kept
    are 0) and the log-sum-exp ``(B, N, T, 1)``."""
    _b, t, n, _h = q.shape
    s, kh = k.shape[1], k.shape[2]
    kk = np.repeat(k.astype(F64), n // kh, axis=2)
    sc = np.einsum("btnh,bsnh->bnts", q.astype(F64), kk) * scale
    if bias is not None:
        sc = sc + bias.astype(F64)
    if alibi:
        sc = sc + alibi_slopes(n).astype(F64) * (np.arange(s)[None] - np.arange(t)[:, None])
    keep = keep_mask(causal, left, right, t, s, *(lens or (None, None)))
    sc = np.where(keep, sc, -np.inf)
    m = sc.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(sc - m)
    z = e.sum(-1, keepdims=True)
    p = np.where(z > 0, e / np.where(z > 0, z, 1.0), 0.0)
    with np.errstate(divide="ignore"):
        lse = m + np.log(z)
    return p, lse


def attention(scale, causal, left, right, alibi, q, k, v, lens=None, bias=None):
    """``(out (B, T, N, H_v), stats (B, N, T, 1))``."""
    n, kh = q.shape[2], k.shape[2]
    p, lse = _probabilities(scale, causal, left, right, alibi, q, k, lens, bias)
    vv = np.repeat(v.astype(F64), n // kh, axis=2)
    return np.einsum("bnts,bsnh->btnh", p, vv), lse


def _group_sum(a, kh):
    b, s, n, h = a.shape
    return a.reshape(b, s, kh, n // kh, h).sum(3)


def attention_grad(scale, causal, left, right, alibi, q, k, v, out, dout, lens=None, bias=None):
    """``(dq, dk, dv)``; the bias gradient (``dS`` summed to the bias' shape) as a fourth."""
    n, kh = q.shape[2], k.shape[2]
    p, _ = _probabilities(scale, causal, left, right, alibi, q, k, lens, bias)
    kk = np.repeat(k.astype(F64), n // kh, axis=2)
    vv = np.repeat(v.astype(F64), n // kh, axis=2)
    do = dout.astype(F64)
    dv = _group_sum(np.einsum("bnts,btnh->bsnh", p, do), kh)
    dp = np.einsum("btnh,bsnh->bnts", do, vv)
    di = np.einsum("btnh,btnh->bnt", do, out.astype(F64))[..., None]
    ds = p * (dp - di)
    dq = np.einsum("bnts,bsnh->btnh", ds, kk) * scale
    dk = _group_sum(np.einsum("bnts,btnh->bsnh", ds, q.astype(F64)) * scale, kh)
    dbias = None
    if bias is not None:
        axes = tuple(a for a in (0, 1) if bias.shape[a] == 1 and ds.shape[a] != 1)
        dbias = ds.sum(axis=axes, keepdims=True)
    return dq, dk, dv, dbias


# -- CTC (cuDNN's: softmax of the logits, blank 0, loss 0 where the labels cannot fit) -------------
def _logsumexp(a, axis=None):
    m = np.max(a, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):  # every term -inf: -inf
        r = np.log(np.sum(np.exp(a - m), axis=axis, keepdims=True)) + m
    return np.squeeze(r, axis=axis) if axis is not None else r.item()


def ctc(logits, labels, label_lengths, input_lengths):
    """``(loss (B,), grad (T, B, K))`` of time-major *logits* and concatenated *labels*: the
    gradient w.r.t. the logits."""
    t_max, b, k = logits.shape
    x = logits.astype(F64)
    lp = x - _logsumexp(x, axis=2)[..., None]
    loss = np.zeros(b)
    grad = np.zeros((t_max, b, k))
    off = 0
    for i in range(b):
        n, t = int(label_lengths[i]), int(input_lengths[i])
        lab = [int(c) for c in labels[off : off + n]]
        off += n
        ext = [0] * (2 * n + 1)
        ext[1::2] = lab
        s_n = len(ext)
        alpha = np.full((t, s_n), -np.inf)
        beta = np.full((t, s_n), -np.inf)
        alpha[0, 0] = lp[0, i, 0]
        if s_n > 1:
            alpha[0, 1] = lp[0, i, ext[1]]
        for tt in range(1, t):
            for s in range(s_n):
                terms = [alpha[tt - 1, s]]
                if s >= 1:
                    terms.append(alpha[tt - 1, s - 1])
                if s >= 2 and ext[s] != 0 and ext[s] != ext[s - 2]:
                    terms.append(alpha[tt - 1, s - 2])
                alpha[tt, s] = _logsumexp(np.array(terms)) + lp[tt, i, ext[s]]
        beta[t - 1, s_n - 1] = lp[t - 1, i, 0]
        if s_n > 1:
            beta[t - 1, s_n - 2] = lp[t - 1, i, ext[s_n - 2]]
        for tt in range(t - 2, -1, -1):
            for s in range(s_n):
                terms = [beta[tt + 1, s]]
                if s + 1 < s_n:
                    terms.append(beta[tt + 1, s + 1])
                if s + 2 < s_n and ext[s] != 0 and ext[s] != ext[s + 2]:
                    terms.append(beta[tt + 1, s + 2])
                beta[tt, s] = _logsumexp(np.array(terms)) + lp[tt, i, ext[s]]
        ends = [alpha[t - 1, s_n - 1]] + ([alpha[t - 1, s_n - 2]] if s_n > 1 else [])
        ll = _logsumexp(np.array(ends))
        if not np.isfinite(ll):  # the labels cannot fit: cuDNN's ZERO_OOB_GRADIENTS
            continue
        loss[i] = -ll
        post = np.zeros((t, k))
        for s in range(s_n):
            post[:, ext[s]] += np.exp(alpha[:, s] + beta[:, s] - lp[:t, i, ext[s]] - ll)
        grad[:t, i] = np.exp(lp[:t, i]) - post
    return loss, grad


# -- spatial transformer ---------------------------------------------------------------------------
def _coords(n):
    return np.linspace(-1.0, 1.0, n) if n > 1 else np.full(1, -1.0)


def affine_grid(theta, h, w):
    """``(N, H, W, 2)``: ``theta @ (x_w, y_h, 1)``."""
    xs, ys = np.meshgrid(_coords(w), _coords(h))
    base = np.stack([xs, ys, np.ones_like(xs)], -1)  # (H, W, 3)
    return np.einsum("hwk,njk->nhwj", base, theta.astype(F64))


def affine_grid_grad(dgrid):
    _n, h, w, _ = dgrid.shape
    xs, ys = np.meshgrid(_coords(w), _coords(h))
    base = np.stack([xs, ys, np.ones_like(xs)], -1)
    return np.einsum("hwk,nhwj->njk", base, dgrid.astype(F64))


def _corners(x_nchw, grid):
    """The four neighbours of each grid point: ``(weights, (iy, ix), inside)`` lists, the
    weights' derivatives w.r.t. the pixel coordinates, and the scales from grid to pixels."""
    _n, _c, hi, wi = x_nchw.shape
    px = (grid[..., 0].astype(F64) + 1) * (wi - 1) / 2
    py = (grid[..., 1].astype(F64) + 1) * (hi - 1) / 2
    x0, y0 = np.floor(px), np.floor(py)
    fx, fy = px - x0, py - y0
    out = []
    for dy_, dx_ in ((0, 0), (0, 1), (1, 0), (1, 1)):
        wx = fx if dx_ else 1 - fx
        wy = fy if dy_ else 1 - fy
        gx = 1.0 if dx_ else -1.0  # d wx / d px
        gy = 1.0 if dy_ else -1.0
        ix, iy = (x0 + dx_).astype(int), (y0 + dy_).astype(int)
        inside = (ix >= 0) & (ix < wi) & (iy >= 0) & (iy < hi)
        out.append((wx, wy, gx, gy, np.clip(iy, 0, hi - 1), np.clip(ix, 0, wi - 1), inside))
    return out, (wi - 1) / 2, (hi - 1) / 2


def grid_sample(x_nchw, grid):
    """Bilinear, zeros outside, ``align_corners=True``: ``(N, C, H, W)``."""
    x = x_nchw.astype(F64)
    nidx = np.arange(x.shape[0])[:, None, None]
    corners, _, _ = _corners(x, grid)
    y = 0.0
    for wx, wy, _gx, _gy, iy, ix, inside in corners:
        v = x[nidx, :, iy, ix]  # (N, H, W, C)
        y = y + (wx * wy * inside)[..., None] * v
    return np.moveaxis(y, -1, 1)


def grid_sample_grad(x_nchw, grid, dy_nchw):
    """``(dx (N, C, Hi, Wi), dgrid (N, H, W, 2))``."""
    x = x_nchw.astype(F64)
    dy = np.moveaxis(dy_nchw.astype(F64), 1, -1)  # (N, H, W, C)
    n = x.shape[0]
    nidx = np.broadcast_to(np.arange(n)[:, None, None], grid.shape[:3])
    corners, sx, sy = _corners(x, grid)
    dx = np.zeros_like(np.moveaxis(x, 1, -1))  # (N, Hi, Wi, C)
    dgx = np.zeros(grid.shape[:3])
    dgy = np.zeros(grid.shape[:3])
    for wx, wy, gx, gy, iy, ix, inside in corners:
        w = wx * wy * inside
        np.add.at(dx, (nidx, iy, ix), w[..., None] * dy)
        v = np.moveaxis(x, 1, -1)[nidx, iy, ix]  # (N, H, W, C)
        dv = (dy * v).sum(-1) * inside
        dgx += dv * gx * wy * sx
        dgy += dv * gy * wx * sy
    return np.moveaxis(dx, -1, 1), np.stack([dgx, dgy], -1)


# -- the host twin ---------------------------------------------------------------------------------
def _first(a, cl):
    return np.moveaxis(a, -1, 1) if cl else a


def _last(a, cl):
    return np.moveaxis(a, 1, -1) if cl else a


def compute(request, args):
    """The results of *request* on numpy *args*, in float64."""
    kind = type(request).__name__
    if kind in ("Attention", "AttentionGrad"):
        opts = (request.scale, request.causal, request.left, request.right, request.alibi)
        nt = 3 if kind == "Attention" else 6
        tensors, rest = list(args[:nt]), list(args[nt:])
        lens = (rest[0], rest[1]) if request.lens else None
        bias = rest[-1] if request.bias else None
        if kind == "Attention":
            return list(attention(*opts, *tensors, lens, bias))
        q, k, v, out, dout, _stats = tensors
        return list(attention_grad(*opts, q, k, v, out, dout, lens, bias)[:3])
    if kind == "CtcLoss":
        return list(ctc(*args))
    if kind == "AffineGrid":
        return [affine_grid(args[0], request.height, request.width)]
    if kind == "AffineGridGrad":
        return [affine_grid_grad(args[0])]
    if kind in ("GridSample", "GridSampleGrad"):
        cl = request.channels_last
        if kind == "GridSample":
            return [_last(grid_sample(_first(args[0], cl), args[1]), cl)]
        dx, dgrid = grid_sample_grad(_first(args[0], cl), args[1], _first(args[2], cl))
        return [_last(dx, cl), dgrid]
    raise NotImplementedError(kind)


def twin(request, call, stream):
    """The slow path of the ``attention``, ``ctc`` and ``spatialtf`` targets on JAX's CPU
    platform: the reference's results written into XLA's host buffers in their dtypes."""
    args = [b.numpy() for b in call.args]
    rets = [b.numpy() for b in call.rets]
    outs = compute(request, args)
    assert len(outs) == len(rets), (request, len(outs), len(rets))
    for r, o in zip(rets, outs, strict=True):
        assert r.shape == o.shape, (request, r.shape, o.shape)
        r[...] = o.astype(r.dtype)
