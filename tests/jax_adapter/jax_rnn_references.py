"""References of ``pycudnn.jax.rnn`` (not a test module): a pure-JAX ``lax.scan`` RNN/LSTM/GRU
on PyTorch's parameters (what the tests compare with, differentiated by ``jax.grad``), and a
float64 numpy forward and backward (BPTT) on cuDNN's packed weights, the host twin that runs in
cuDNN's place on JAX's CPU platform.

Both follow docs/rnn.md's equations (PyTorch's cells): per layer and direction, padded
sequences with per-sequence lengths (a step past a sequence's end leaves its states as they are
and outputs zeros), the reverse direction running from each sequence's last element.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pycudnn.highlevel.rnn_layout import GATES, PROJ_ID, canonical_rnn_layout

F64 = np.float64


# -- pure JAX: lax.scan on PyTorch's parameters ------------------------------------------------
def _jax_cell(mode, p, x, h, c):
    """One step of one direction: ``(h', c')`` from PyTorch's ``(w_ih, w_hh, b_ih, b_hh,
    w_hr)``."""
    w_ih, w_hh, b_ih, b_hh, w_hr = p
    a = x @ w_ih.T + b_ih
    b = h @ w_hh.T + b_hh
    if mode in ("rnn_tanh", "rnn_relu"):
        s = a + b
        return (jnp.tanh(s) if mode == "rnn_tanh" else jnp.maximum(s, 0)), c
    if mode == "lstm":
        i, f, g, o = jnp.split(a + b, 4, axis=-1)
        i, f, g, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
        c2 = f * c + i * g
        h2 = o * jnp.tanh(c2)
        return (h2 @ w_hr.T if w_hr is not None else h2), c2
    ar, az, an = jnp.split(a, 3, axis=-1)
    br, bz, bn = jnp.split(b, 3, axis=-1)
    r, z = jax.nn.sigmoid(ar + br), jax.nn.sigmoid(az + bz)
    n = jnp.tanh(an + r * bn)
    return (1 - z) * n + z * h, c


def jax_rnn(mode, params, x, h0, c0, num_layers, bidirectional, lengths=None):
    """The reference on time-major *x* ``(T, N, I)``; *params* PyTorch's names; returns
    ``(y, hy, cy)`` (cy None unless LSTM)."""
    t_len, n = x.shape[0], x.shape[1]
    dirs = 2 if bidirectional else 1
    lens = jnp.full((n,), t_len) if lengths is None else jnp.asarray(lengths)
    c0 = jnp.zeros_like(h0) if c0 is None else c0
    inp = x
    hs, cs = [], []
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            sfx = f"_l{layer}" + ("_reverse" if d else "")
            names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr")
            p = tuple(params.get(k + sfx) for k in names)
            pl = layer * dirs + d
            steps = jnp.arange(t_len)[::-1] if d else jnp.arange(t_len)

            def step(carry, t, p=p, inp=inp):
                h, c = carry
                h2, c2 = _jax_cell(mode, p, inp[t], h, c)
                live = (t < lens)[:, None]
                h2, c2 = jnp.where(live, h2, h), jnp.where(live, c2, c)
                return (h2, c2), jnp.where(live, h2, 0)

            (h, c), ys = lax.scan(step, (h0[pl], c0[pl]), steps)
            outs.append(ys[::-1] if d else ys)
            hs.append(h)
            cs.append(c)
        inp = jnp.concatenate(outs, axis=-1)
    return inp, jnp.stack(hs), (jnp.stack(cs) if mode == "lstm" else None)


# -- numpy float64 on cuDNN's packed buffer: the host twin -------------------------------------
def _mats(layout, w, pl):
    """``(W (G*H, in) or None, R, bW, bR, P or None)`` of pseudo-layer *pl*."""
    ng = len(GATES[layout.mode])

    def m(lin, kind):
        s = layout.matrix(pl, lin) if kind == "weight" else layout.bias_of(pl, lin)
        return None if s is None else w[s.offset : s.offset + s.size].reshape(s.shape)

    W = np.concatenate([m(g, "weight") for g in range(ng)])
    R = np.concatenate([m(ng + g, "weight") for g in range(ng)])
    bW = np.concatenate([m(g, "bias") for g in range(ng)])
    bR = np.concatenate([m(ng + g, "bias") for g in range(ng)])
    return W, R, bW, bR, m(PROJ_ID, "weight")


def _slot_views(layout, dw, pl):
    """Writable views into *dw* of pseudo-layer *pl*, as :func:`_mats` (gates stacked)."""
    ng = len(GATES[layout.mode])
    out = []
    for kind, lins in (
        ("weight", range(ng)),
        ("weight", range(ng, 2 * ng)),
        ("bias", range(ng)),
        ("bias", range(ng, 2 * ng)),
    ):
        slots = [layout.matrix(pl, g) if kind == "weight" else layout.bias_of(pl, g) for g in lins]
        out.append([dw[s.offset : s.offset + s.size].reshape(s.shape) for s in slots])
    p = layout.matrix(pl, PROJ_ID)
    out.append(None if p is None else dw[p.offset : p.offset + p.size].reshape(p.shape))
    return out


def _sig(v):
    return 1 / (1 + np.exp(-v))


def _cell_fwd(mode, mats, x, h, c):
    W, R, bW, bR, P = mats
    a = x @ W.T + bW
    b = h @ R.T + bR
    if mode in ("rnn_tanh", "rnn_relu"):
        s = a + b
        h2 = np.tanh(s) if mode == "rnn_tanh" else np.maximum(s, 0)
        return h2, c, (s, h2)
    if mode == "lstm":
        i, f, g, o = np.split(a + b, 4, axis=-1)
        i, f, g, o = _sig(i), _sig(f), np.tanh(g), _sig(o)
        c2 = f * c + i * g
        tc = np.tanh(c2)
        hf = o * tc
        return (hf @ P.T if P is not None else hf), c2, (i, f, g, o, tc, hf)
    ar, az, an = np.split(a, 3, axis=-1)
    br, bz, bn = np.split(b, 3, axis=-1)
    r, z = _sig(ar + br), _sig(az + bz)
    n = np.tanh(an + r * bn)
    return (1 - z) * n + z * h, c, (r, z, n, bn)


def _cell_bwd(mode, mats, grads, x, h, c, cache, dh2, dc2):
    """``(dx, dh, dc)`` of one step; accumulates into *grads* ``[dW, dR, dbW, dbR, dP]``."""
    W, R, _bW, _bR, P = mats
    dc = np.zeros_like(c)
    if mode in ("rnn_tanh", "rnn_relu"):
        s, h2 = cache
        da = dh2 * (1 - h2 * h2) if mode == "rnn_tanh" else dh2 * (s > 0)
        db = da
        dh_direct = 0
    elif mode == "lstm":
        i, f, g, o, tc, hf = cache
        if P is not None:
            grads[4] += dh2.T @ hf
            dh2 = dh2 @ P
        dct = dc2 + dh2 * o * (1 - tc * tc)
        do = dh2 * tc
        da = np.concatenate(
            [dct * g * i * (1 - i), dct * c * f * (1 - f), dct * i * (1 - g * g), do * o * (1 - o)],
            axis=-1,
        )
        db = da
        dc = dct * f
        dh_direct = 0
    else:
        r, z, n, bn = cache
        dn = dh2 * (1 - z)
        dz = dh2 * (h - n)
        dsn = dn * (1 - n * n)
        dr = dsn * bn
        dsr, dsz = dr * r * (1 - r), dz * z * (1 - z)
        da = np.concatenate([dsr, dsz, dsn], axis=-1)
        db = np.concatenate([dsr, dsz, dsn * r], axis=-1)
        dh_direct = dh2 * z
    grads[0] += da.T @ x
    grads[1] += db.T @ h
    grads[2] += da.sum(0)
    grads[3] += db.sum(0)
    return da @ W, db @ R + dh_direct, dc


def _run_direction(mode, mats, inp, h, c, lens, reverse):
    t_len = inp.shape[0]
    ys = np.zeros((t_len, inp.shape[1], h.shape[-1]))
    caches = {}
    for t in range(t_len - 1, -1, -1) if reverse else range(t_len):
        live = (t < lens)[:, None]
        h2, c2, cache = _cell_fwd(mode, mats, inp[t], h, c)
        caches[t] = (h, c, cache)
        h, c = np.where(live, h2, h), np.where(live, c2, c)
        ys[t] = np.where(live, h2, 0)
    return ys, h, c, caches


def _network(request, x, w):
    """``(layout, x time-major float64)`` of a request and its operands."""
    xt = np.swapaxes(x, 0, 1) if request.batch_first else x
    layout = canonical_rnn_layout(
        request.mode,
        xt.shape[2],
        request.hidden_size,
        request.num_layers,
        request.bidirectional,
        request.proj_size,
    )
    return layout, xt.astype(F64), w.astype(F64)


def numpy_forward(request, x, h0, c0, w):
    """``(y, hy, cy, per-layer caches)`` in float64 (y in x's order)."""
    layout, xt, w = _network(request, x, w)
    dirs = layout.num_directions
    t_len, n = xt.shape[:2]
    lens = np.full(n, t_len) if request.seq_lengths is None else np.asarray(request.seq_lengths)
    c0 = np.zeros((h0.shape[0], n, layout.hidden_size)) if c0 is None else c0.astype(F64)
    inp, hy, cy, layers = xt, [], [], []
    for layer in range(layout.num_layers):
        outs, caches = [], []
        for d in range(dirs):
            pl = layer * dirs + d
            mats = _mats(layout, w, pl)
            ys, h, c, cache = _run_direction(
                request.mode, mats, inp, h0[pl].astype(F64), c0[pl], lens, bool(d)
            )
            outs.append(ys)
            caches.append(cache)
            hy.append(h)
            cy.append(c)
        layers.append((inp, caches))
        inp = np.concatenate(outs, axis=-1)
    y = np.swapaxes(inp, 0, 1) if request.batch_first else inp
    return y, np.stack(hy), np.stack(cy), (layout, lens, layers)


def numpy_backward(request, x, h0, c0, w, dy, dhy, dcy):
    """``(dx, dh0, dc0, dw)`` in float64 (BPTT through :func:`numpy_forward`)."""
    _y, _hy, _cy, (layout, lens, layers) = numpy_forward(request, x, h0, c0, w)
    _l, _x, wf = _network(request, x, w)
    dirs, out = layout.num_directions, layout.out_size
    dw = np.zeros(layout.size)
    g = np.swapaxes(dy, 0, 1) if request.batch_first else dy
    g = g.astype(F64)
    dh0 = np.zeros(h0.shape)
    dc0 = np.zeros((h0.shape[0], h0.shape[1], layout.hidden_size))
    dcy = np.zeros_like(dc0) if dcy is None else dcy.astype(F64)
    for layer in range(layout.num_layers - 1, -1, -1):
        inp, caches = layers[layer]
        dinp = np.zeros(inp.shape)
        for d in range(dirs):
            pl = layer * dirs + d
            mats = _mats(layout, wf, pl)
            views = _slot_views(layout, dw, pl)
            grads = [
                np.zeros_like(mats[0]),
                np.zeros_like(mats[1]),
                np.zeros_like(mats[2]),
                np.zeros_like(mats[3]),
                None if mats[4] is None else np.zeros_like(mats[4]),
            ]
            dh, dc = dhy[pl].astype(F64), dcy[pl]
            order = range(inp.shape[0]) if d else range(inp.shape[0] - 1, -1, -1)
            for t in order:
                live = (t < lens)[:, None]
                h, c, cache = caches[d][t]
                dh2 = np.where(live, dh + g[t][:, d * out : (d + 1) * out], 0)
                dc2 = np.where(live, dc, 0)
                dx, dhp, dcp = _cell_bwd(request.mode, mats, grads, inp[t], h, c, cache, dh2, dc2)
                dinp[t] += dx
                dh, dc = np.where(live, dhp, dh), np.where(live, dcp, dc)
            dh0[pl], dc0[pl] = dh, dc
            ng = len(GATES[layout.mode])
            for k in range(4):
                for j, v in enumerate(views[k]):
                    v[...] = grads[k][j * layout.hidden_size : (j + 1) * layout.hidden_size]
                    assert len(views[k]) == ng
            if views[4] is not None:
                views[4][...] = grads[4]
        g = dinp
    dx = np.swapaxes(g, 0, 1) if request.batch_first else g
    return dx, dh0, dc0, dw


def _fill_reserve(r):
    r[...] = (np.arange(r.size) % 251).astype(np.uint8)


def twin(request, call, stream):
    """The slow path of the ``rnn`` target on JAX's CPU platform: the numpy references written
    into XLA's host buffers. The training forward writes a pattern into the reserve space and
    the backward checks it arrived (through the residual and the in-place alias)."""
    args = [b.numpy() for b in call.args]
    rets = [b.numpy() for b in call.rets]
    lstm = request.mode == "lstm"
    if type(request).__name__ == "RNN":
        x, h0, c0, w = args if lstm else (args[0], args[1], None, args[2])
        y, hy, cy, _ = numpy_forward(request, x, h0, c0, w)
        outs = [y, hy] + ([cy] if lstm else [])
        for r, o in zip(rets, outs, strict=False):
            r[...] = o.astype(r.dtype)
        if request.training:
            assert rets[-1].shape == (request.reserve,)
            _fill_reserve(rets[-1])
        return
    if lstm:
        x, h0, c0, w, _y, dy, dhy, dcy, reserve = args
    else:
        (x, h0, w, _y, dy, dhy, reserve), c0, dcy = args, None, None
    expected = np.empty_like(reserve)
    _fill_reserve(expected)
    assert np.array_equal(rets[-1], expected), "the reserve space did not reach the backward"
    dx, dh0, dc0, dw = numpy_backward(request, x, h0, c0, w, dy, dhy, dcy)
    outs = [dx, dh0] + ([dc0] if lstm else []) + [dw]
    for r, o in zip(rets[:-1], outs, strict=True):
        r[...] = o.astype(r.dtype)
    rets[-1][...] = 0  # cuDNN updates it in place: anything may be left there


def ours_and_theirs(kw, batch_first, lengths):
    """``pycudnn.jax.rnn`` on ``(x, h0, c0, w)`` and its pure-JAX twin (:func:`jax_rnn` on the
    unpacked weights), each returning ``(y, h, c)`` for an LSTM, ``(y, h)`` else; *kw* the
    network (``mode``, ``input_size``, ``hidden_size``, ``num_layers``, ``bidirectional``,
    ``proj_size``)."""
    import pycudnn.jax as pj

    mode, lstm = kw["mode"], kw["mode"] == "lstm"
    opts = {k: kw[k] for k in ("num_layers", "bidirectional", "proj_size")}

    def ours(x, h0, c0, w):
        y, h, c = pj.rnn(
            x, h0, c0, w, mode=mode, hidden_size=kw["hidden_size"], batch_first=batch_first,
            seq_lengths=lengths, **opts,
        )  # fmt: skip
        return (y, h, c) if lstm else (y, h)

    def theirs(x, h0, c0, w):
        p = pj.rnn_unpack_weights(w, **kw)
        xt = jnp.swapaxes(x, 0, 1) if batch_first else x
        y, h, c = jax_rnn(mode, p, xt, h0, c0, kw["num_layers"], kw["bidirectional"], lengths)
        y = jnp.swapaxes(y, 0, 1) if batch_first else y
        return (y, h, c) if lstm else (y, h)

    return ours, theirs
