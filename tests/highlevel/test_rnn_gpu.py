"""GPU tests of ``RNNBlock`` (marker ``gpu``; skipped without a device).

Run on the GPU machine:
``PYTHONPATH=. python3 -m pytest -m gpu -q tests/highlevel/test_rnn_gpu.py``.

* forward and backward of every mode x direction x input mode x {1, 2} layers x {fp16, fp32,
  fp64}, with unsorted variable sequence lengths, against a float64 NumPy reference of each
  cell written here (forward recurrence and hand-written backpropagation through time); inputs
  are rounded to the tested dtype first, outputs poisoned with NaN before every call;
* cuDNN's weight layout (``cudnnGetRNNWeightParams``) equals the canonical one the converters use;
* equality with torch's ``nn.RNN``/``nn.LSTM``/``nn.GRU`` (weights converted both ways), in
  forward, backward, with projections, ``batch_first`` and ``pack_padded_sequence``;
* finite differences on tiny float64 networks; accumulate/overwrite of the weight gradient;
  dropout; reserve-space pairing; caching of a repeated call.
"""

from __future__ import annotations

import numpy as np
import pytest

try:  # torch first when present: both then use the same libcudnn
    import torch
except ImportError:  # pragma: no cover - the torch tests skip
    torch = None

import pycudnn
from pycudnn import memory
from pycudnn.highlevel import _rnn_calls
from pycudnn.highlevel import rnn as rnn_mod
from pycudnn.highlevel.rnn import RNNBlock
from pycudnn.highlevel.rnn_layout import (
    GATES,
    canonical_rnn_layout,
    rnn_weights_to_torch,
)

pytestmark = pytest.mark.gpu

MODES = ("rnn_relu", "rnn_tanh", "lstm", "gru")
DTYPES = ("float16", "float32", "float64")
# max |got - ref| / max |ref|, per dtype (forward, backward)
# float16 backward: 5e-2 (a ReLU RNN's unbounded states; one random draw of the bidirectional
# rnn_relu case reached 3.4e-2 of the largest gradient on an H200)
TOL = {"float64": (1e-10, 1e-9), "float32": (2e-5, 5e-5), "float16": (1.5e-2, 5e-2)}
_rng = np.random.default_rng()


def _needs_torch():
    if torch is None:
        pytest.skip("torch is not installed")
    return torch


# ==================================================================================================
# float64 NumPy reference
# ==================================================================================================
def _sig(a):
    return 1.0 / (1.0 + np.exp(-a))


class Ref:
    """A float64 RNN with the cuDNN/PyTorch cell equations; parameters per pseudo-layer as
    ``split_params`` returns them: ``[(W, b), ...]`` in linLayerID order (W None: skip input,
    b None: no bias), then ``(P, None)`` with a projection."""

    def __init__(self, mode, layers, dirs, params, hidden, proj=None):
        self.mode, self.layers, self.dirs = mode, layers, dirs
        self.p = params
        self.n = len(GATES[mode])
        self.hidden = hidden
        self.proj = proj

    # -- one step ------------------------------------------------------------------------------
    def _pre(self, p, k, x, h):
        """W_k x + b_Wk + R_k h + b_Rk (input and recurrent parts separately)."""
        w, bw = p[k]
        r, br = p[self.n + k]
        xi = x if w is None else x @ w.T
        if bw is not None:
            xi = xi + bw
        hr = h @ r.T
        if br is not None:
            hr = hr + br
        return xi, hr

    def _step(self, p, x, h, c):
        m = self.mode
        if m in ("rnn_relu", "rnn_tanh"):
            xi, hr = self._pre(p, 0, x, h)
            a = xi + hr
            hn = np.maximum(a, 0) if m == "rnn_relu" else np.tanh(a)
            return hn, None, (a, hn)
        if m == "lstm":
            a = [sum(self._pre(p, k, x, h)) for k in range(4)]
            i, f, g, o = _sig(a[0]), _sig(a[1]), np.tanh(a[2]), _sig(a[3])
            cn = f * c + i * g
            tc = np.tanh(cn)
            mm = o * tc
            hn = mm @ p[8][0].T if self.proj else mm
            return hn, cn, (i, f, g, o, tc, mm)
        # gru
        xr, hr_ = self._pre(p, 0, x, h)
        xz, hz = self._pre(p, 1, x, h)
        xn, u = self._pre(p, 2, x, h)
        r, z = _sig(xr + hr_), _sig(xz + hz)
        nn = np.tanh(xn + r * u)
        hn = (1 - z) * nn + z * h
        return hn, None, (r, z, nn, u)

    def _acc(self, g, p, k, da_in, da_rec, x, h):
        """Accumulate gate k's gradients; return (dx, dh) contributions."""
        w = p[k][0]
        r = p[self.n + k][0]
        gw, gbw = g[k]
        gr, gbr = g[self.n + k]
        if w is not None:
            gw += da_in.T @ x
            dx = da_in @ w
        else:
            dx = da_in.copy()
        if gbw is not None:
            gbw += da_in.sum(0)
        gr += da_rec.T @ h
        if gbr is not None:
            gbr += da_rec.sum(0)
        return dx, da_rec @ r

    def _step_back(self, p, g, x, h, c, aux, dhn, dcn):
        m = self.mode
        if m in ("rnn_relu", "rnn_tanh"):
            a, hn = aux
            da = dhn * ((a > 0) if m == "rnn_relu" else (1 - hn**2))
            dx, dh = self._acc(g, p, 0, da, da, x, h)
            return dx, dh, None
        if m == "lstm":
            i, f, gg, o, tc, mm = aux
            if self.proj:
                g[8][0][...] += dhn.T @ mm
                dm = dhn @ p[8][0]
            else:
                dm = dhn
            do = dm * tc
            dc = dcn + dm * o * (1 - tc**2)
            das = [
                dc * gg * i * (1 - i),
                dc * c * f * (1 - f),
                dc * i * (1 - gg**2),
                do * o * (1 - o),
            ]
            dx = 0
            dh = 0
            for k in range(4):
                ex, eh = self._acc(g, p, k, das[k], das[k], x, h)
                dx, dh = dx + ex, dh + eh
            return dx, dh, dc * f
        r, z, nn, u = aux
        dn = dhn * (1 - z)
        dz = dhn * (h - nn)
        dh = dhn * z
        dan = dn * (1 - nn**2)
        dr = dan * u
        dx, eh = self._acc(g, p, 2, dan, dan * r, x, h)
        dh = dh + eh
        for k, dgate, gate in ((0, dr, r), (1, dz, z)):
            da = dgate * gate * (1 - gate)
            ex, eh = self._acc(g, p, k, da, da, x, h)
            dx, dh = dx + ex, dh + eh
        return dx, dh, None

    # -- whole network -------------------------------------------------------------------------
    def forward(self, x, lengths, hx, cx):
        """x (T, N, I) float64 time-major; returns y, hy, cy (cy None for non-LSTM)."""
        T, N, _ = x.shape
        lens = np.asarray(lengths)
        lstm = self.mode == "lstm"
        out = self.proj or self.hidden
        hy = np.zeros_like(hx)
        cy = np.zeros_like(cx) if lstm else None
        self.caches = []
        inp = x
        for layer in range(self.layers):
            ys = []
            for d in range(self.dirs):
                pl = layer * self.dirs + d
                p = self.p[pl]
                h, c = hx[pl].copy(), (cx[pl].copy() if lstm else None)
                yd = np.zeros((T, N, out))
                cache = []
                for t in range(T - 1, -1, -1) if d else range(T):
                    msk = (t < lens)[:, None].astype(np.float64)
                    hn, cn, aux = self._step(p, inp[t], h, c)
                    cache.append((t, msk, inp[t], h, c, aux))
                    yd[t] = msk * hn
                    h = msk * hn + (1 - msk) * h
                    if lstm:
                        c = msk * cn + (1 - msk) * c
                hy[pl] = h
                if lstm:
                    cy[pl] = c
                ys.append(yd)
                self.caches.append((pl, inp.shape, cache))
            inp = np.concatenate(ys, axis=2)
        return inp, hy, cy

    def backward(self, dy, dhy, dcy):
        """Gradients after :meth:`forward`: (dx, dhx, dcx, grads per pseudo-layer)."""
        lstm = self.mode == "lstm"
        out = self.proj or self.hidden
        grads = [
            [
                (None if w is None else np.zeros_like(w), None if b is None else np.zeros_like(b))
                for w, b in pp
            ]
            for pp in self.p
        ]
        dhx = np.zeros_like(dhy)
        dcx = np.zeros_like(dcy) if lstm else None
        dY = dy
        caches = {pl: (shape, cache) for pl, shape, cache in self.caches}
        for layer in range(self.layers - 1, -1, -1):
            din = None
            for d in range(self.dirs):
                pl = layer * self.dirs + d
                shape, cache = caches[pl]
                if din is None:
                    din = np.zeros(shape)
                p, g = self.p[pl], grads[pl]
                dys = dY[:, :, d * out : (d + 1) * out]
                dh = dhy[pl].copy()
                dc = dcy[pl].copy() if lstm else None
                for t, msk, xt, h, c, aux in reversed(cache):
                    dhs = msk * (dh + dys[t])
                    dcs = msk * dc if lstm else None
                    dxt, dhp, dcp = self._step_back(p, g, xt, h, c, aux, dhs, dcs)
                    din[t] += dxt
                    dh = dhp + (1 - msk) * dh
                    if lstm:
                        dc = dcp + (1 - msk) * dc
                dhx[pl] = dh
                if lstm:
                    dcx[pl] = dc
            dY = din
        return dY, dhx, dcx, grads


# ==================================================================================================
# helpers
# ==================================================================================================
def _round(a, dtype):
    return a.astype(dtype).astype(np.float64)


def _poisoned(shape, dtype):
    return memory.empty(shape, dtype).fill_(np.nan)


def _err(got, ref):
    got = np.asarray(got, dtype=np.float64)
    assert np.isfinite(got).all(), "non-finite output (a position was not written?)"
    scale = max(float(np.max(np.abs(ref))), 1e-30) if ref.size else 1.0
    return float(np.max(np.abs(got - ref))) / scale if ref.size else 0.0


def _host_params(block, w, inp):
    return [
        [
            (
                None if a is None else a.get().astype(np.float64),
                None if b is None else b.get().astype(np.float64),
            )
            for a, b in block.split_params(w, pl, inp)
        ]
        for pl in range(block.num_layers * block.num_directions)
    ]


def _problem(block, T, N, inp, dtype, lengths):
    """Random weights, inputs and upstream gradients (rounded to *dtype*), on host and device."""
    size = block.get_param_size(inp)
    scale = 1.0 / np.sqrt(block.hidden_size)
    wh = _round(_rng.uniform(-scale, scale, size), dtype)
    nl = block.num_layers * block.num_directions
    hs, cs = (nl, N, block.out_size), (nl, N, block.hidden_size)
    xh = _round(_rng.standard_normal((T, N, inp)), dtype)
    hh = _round(0.5 * _rng.standard_normal(hs), dtype)
    ch = _round(0.5 * _rng.standard_normal(cs), dtype)
    gy = _round(_rng.standard_normal((T, N, block.output_size)), dtype)
    if lengths is not None:
        t = np.arange(T)[:, None]
        gy = gy * (t < np.asarray(lengths)[None, :])[:, :, None]  # dy at padding: any value
    ghy = _round(_rng.standard_normal(hs), dtype)
    gcy = _round(_rng.standard_normal(cs), dtype)
    dev = {
        k: memory.to_device(v.astype(dtype))
        for k, v in dict(w=wh, x=xh, hx=hh, cx=ch, gy=gy, ghy=ghy, gcy=gcy).items()
    }
    return dict(w=wh, x=xh, hx=hh, cx=ch, gy=gy, ghy=ghy, gcy=gcy), dev


# ==================================================================================================
# forward and backward against the NumPy reference
# ==================================================================================================
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("input_mode", ["linear", "skip"])
@pytest.mark.parametrize("direction", ["unidirectional", "bidirectional"])
@pytest.mark.parametrize("mode", MODES)
def test_against_numpy_reference(mode, direction, input_mode, layers, dtype):
    T, N, H = 5, 3, 4
    inp = H if input_mode == "skip" else 5
    lengths = (5, 2, 4)  # unsorted: the padded layout needs no order
    lstm = mode == "lstm"
    with RNNBlock(dtype, H, layers, mode, input_mode, direction) as block:
        host, dev = _problem(block, T, N, inp, dtype, lengths)
        ref = Ref(mode, layers, block.num_directions, _host_params(block, dev["w"], inp), H)
        y_r, hy_r, cy_r = ref.forward(host["x"], lengths, host["hx"], host["cx"])
        ftol, btol = TOL[dtype]
        cx = dev["cx"] if lstm else None
        for training in (False, True):
            outs = [_poisoned(y_r.shape, dtype), _poisoned(hy_r.shape, dtype)]
            if lstm:
                outs.append(_poisoned(cy_r.shape, dtype))
            got = block.apply(dev["w"], dev["x"], dev["hx"], cx, lengths, training, out=tuple(outs))
            assert all(g is o for g, o in zip(got, outs, strict=True))
            assert _err(got[0].get(), y_r) < ftol
            assert _err(got[1].get(), hy_r) < ftol
            if lstm:
                assert _err(got[2].get(), cy_r) < ftol
        y = got[0]
        dx_r, dhx_r, dcx_r, grads = ref.backward(host["gy"], host["ghy"], host["gcy"])
        bouts = [_poisoned(dx_r.shape, dtype), _poisoned(dhx_r.shape, dtype)]
        if lstm:
            bouts.append(_poisoned(dcx_r.shape, dtype))
        dw = _poisoned((block.get_param_size(inp),), dtype)
        dx, dhx, dcx, dw2 = block.backward(
            dev["w"],
            dev["x"],
            dev["hx"],
            cx,
            y,
            dev["gy"],
            dev["ghy"],
            dev["gcy"] if lstm else None,
            lengths,
            dw=dw,
            out=tuple(bouts),
        )
        assert dw2 is dw and dx is bouts[0]
        assert _err(dx.get(), dx_r) < btol
        assert _err(dhx.get(), dhx_r) < btol
        if lstm:
            assert _err(dcx.get(), dcx_r) < btol
        else:
            assert dcx is None
        gw = _host_params(block, dw, inp)
        for pl, (mine, want) in enumerate(zip(gw, grads, strict=True)):
            for k, ((a, b), (ra, rb)) in enumerate(zip(mine, want, strict=True)):
                if ra is not None:
                    assert _err(a, ra) < btol, (pl, k, "matrix")
                if rb is not None:
                    assert _err(b, rb) < btol, (pl, k, "bias")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("direction", ["unidirectional", "bidirectional"])
def test_lstm_projection_against_numpy(direction, dtype):
    T, N, H, P, inp = 4, 3, 5, 3, 4
    lengths = (2, 4, 3)
    with RNNBlock(dtype, H, 2, "lstm", direction_mode=direction, proj_size=P) as block:
        host, dev = _problem(block, T, N, inp, dtype, lengths)
        ref = Ref("lstm", 2, block.num_directions, _host_params(block, dev["w"], inp), H, P)
        y_r, hy_r, cy_r = ref.forward(host["x"], lengths, host["hx"], host["cx"])
        y, hy, cy = block.apply(dev["w"], dev["x"], dev["hx"], dev["cx"], lengths, True)
        ftol, btol = TOL[dtype]
        assert y.shape == (T, N, block.num_directions * P) and hy.shape[2] == P
        assert _err(y.get(), y_r) < ftol and _err(hy.get(), hy_r) < ftol
        assert _err(cy.get(), cy_r) < ftol
        dx_r, dhx_r, dcx_r, grads = ref.backward(host["gy"], host["ghy"], host["gcy"])
        dx, dhx, dcx, dw = block.backward(
            dev["w"], dev["x"], dev["hx"], dev["cx"], y, dev["gy"], dev["ghy"], dev["gcy"], lengths
        )
        assert _err(dx.get(), dx_r) < btol and _err(dhx.get(), dhx_r) < btol
        assert _err(dcx.get(), dcx_r) < btol
        for mine, want in zip(_host_params(block, dw, inp), grads, strict=True):
            for (a, b), (ra, rb) in zip(mine, want, strict=True):
                assert _err(a, ra) < btol
                if rb is not None:
                    assert _err(b, rb) < btol


@pytest.mark.parametrize("mode", MODES)
def test_batch_first_and_no_bias(mode):
    T, N, H, inp = 4, 2, 3, 5
    with RNNBlock(
        "float64", H, 2, mode, direction_mode="bidirectional", batch_first=True, bias=False
    ) as block:
        host, dev = _problem(block, T, N, inp, "float64", None)
        params = _host_params(block, dev["w"], inp)
        assert all(b is None for pp in params for _, b in pp)
        ref = Ref(mode, 2, 2, params, H)
        y_r, hy_r, _ = ref.forward(host["x"], (T,) * N, host["hx"], host["cx"])
        xb = memory.to_device(np.ascontiguousarray(host["x"].transpose(1, 0, 2)))
        cx = dev["cx"] if mode == "lstm" else None
        got = block.apply(dev["w"], xb, dev["hx"], cx)
        assert got[0].shape == (N, T, 2 * H)
        assert _err(got[0].get(), y_r.transpose(1, 0, 2)) < 1e-10
        assert _err(got[1].get(), hy_r) < 1e-10


# ==================================================================================================
# layout: cuDNN's answer equals the canonical rule
# ==================================================================================================
@pytest.mark.parametrize(
    "mode,direction,input_mode,proj,layers,bias",
    [
        ("lstm", "unidirectional", "linear", None, 3, True),
        ("lstm", "bidirectional", "linear", 3, 2, True),
        ("lstm", "bidirectional", "skip", None, 2, True),
        ("lstm", "unidirectional", "linear", 2, 1, False),
        ("gru", "bidirectional", "linear", None, 2, True),
        ("gru", "unidirectional", "skip", None, 2, False),
        ("rnn_tanh", "bidirectional", "linear", None, 3, True),
        ("rnn_relu", "unidirectional", "skip", None, 2, True),
    ],
)
@pytest.mark.parametrize("dtype", DTYPES)
def test_layout_is_canonical(mode, direction, input_mode, proj, layers, bias, dtype):
    H = 4
    inp = H if input_mode == "skip" else 7
    with RNNBlock(
        dtype, H, layers, mode, input_mode, direction, proj_size=proj, bias=bias
    ) as block:
        lay = block.layout(inp)
        want = canonical_rnn_layout(
            mode, inp, H, layers, direction == "bidirectional", proj, input_mode, bias
        )
        assert lay == want, lay.table() + "\n---\n" + want.table()
        assert block.get_param_size(inp) == want.size
        assert block.get_param_size((8, inp)) == want.size  # Theano's (batch, input_dim)


def test_split_params_are_views_in_theano_order():
    H, inp = 3, 4
    with RNNBlock("float32", H, 1, "lstm", direction_mode="bidirectional") as block:
        n = block.get_param_size(inp)
        wh = np.arange(n, dtype=np.float32)
        w = memory.to_device(wh)
        lay = block.layout(inp)
        for pl in range(2):
            parts = block.split_params(w, pl, inp)
            assert len(parts) == 8
            for lid, (m, b) in enumerate(parts):
                s = lay.matrix(pl, lid)
                assert m.shape == s.shape and m.ptr == w.ptr + 4 * s.offset
                np.testing.assert_array_equal(m.get().ravel(), wh[s.offset : s.offset + s.size])
                assert b.shape == (H,) and b.ptr == w.ptr + 4 * lay.bias_of(pl, lid).offset
        # views write through
        parts = block.split_params(w, 1, inp)
        parts[2][1].fill_(-1.0)
        assert (w.get()[lay.bias_of(1, 2).offset : lay.bias_of(1, 2).offset + H] == -1).all()


# ==================================================================================================
# equality with torch
# ==================================================================================================
def _torch_module(mode, inp, H, layers, bidir, dtype, proj=None, batch_first=False):
    t = _needs_torch()
    kw = dict(num_layers=layers, bidirectional=bidir, batch_first=batch_first)
    if mode == "lstm":
        m = t.nn.LSTM(inp, H, proj_size=proj or 0, **kw)
    elif mode == "gru":
        m = t.nn.GRU(inp, H, **kw)
    else:
        m = t.nn.RNN(inp, H, nonlinearity=mode[4:], **kw)
    return m.to(device="cuda", dtype=getattr(t, dtype))


def _tt(a):
    """A torch view of a pycudnn device array."""
    return torch.as_tensor(a, device="cuda")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("bidir", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_equals_torch(mode, bidir, dtype):
    t = _needs_torch()
    T, N, H, inp, layers = 6, 3, 5, 4, 2
    tol = 1e-10 if dtype == "float64" else 2e-5
    m = _torch_module(mode, inp, H, layers, bidir, dtype)
    direction = "bidirectional" if bidir else "unidirectional"
    lstm = mode == "lstm"
    with (
        RNNBlock(dtype, H, layers, mode, direction_mode=direction) as block,
        t.backends.cudnn.flags(enabled=True, allow_tf32=False),
    ):
        w = block.from_torch(m, inp)  # torch -> cuDNN layout
        tdt = getattr(t, dtype)
        x = t.randn(T, N, inp, device="cuda", dtype=tdt, requires_grad=True)
        nl = layers * block.num_directions
        h0 = t.randn(nl, N, H, device="cuda", dtype=tdt, requires_grad=True)
        c0 = t.randn(nl, N, H, device="cuda", dtype=tdt, requires_grad=True)
        out, state = m(x, (h0, c0) if lstm else h0)
        hy_t, cy_t = state if lstm else (state, None)
        got = block.apply(w, x.detach(), h0.detach(), c0.detach() if lstm else None, training=True)
        assert _err(got[0].get(), out.detach().double().cpu().numpy()) < tol
        assert _err(got[1].get(), hy_t.detach().double().cpu().numpy()) < tol
        if lstm:
            assert _err(got[2].get(), cy_t.detach().double().cpu().numpy()) < tol
        gy, ghy = t.randn_like(out), t.randn_like(hy_t)
        loss = (out * gy).sum() + (hy_t * ghy).sum()
        gcy = None
        if lstm:
            gcy = t.randn_like(cy_t)
            loss = loss + (cy_t * gcy).sum()
        loss.backward()
        dx, dhx, dcx, dw = block.backward(
            w, x.detach(), h0.detach(), c0.detach() if lstm else None, got[0], gy, ghy, gcy
        )
        assert _err(dx.get(), x.grad.double().cpu().numpy()) < tol * 5
        assert _err(dhx.get(), h0.grad.double().cpu().numpy()) < tol * 5
        if lstm:
            assert _err(dcx.get(), c0.grad.double().cpu().numpy()) < tol * 5
        grads = block.to_torch(dw, inp)  # cuDNN -> torch layout
        for name, p in m.named_parameters():
            assert _err(grads[name], p.grad.double().cpu().numpy()) < tol * 5, name


@pytest.mark.parametrize("bidir", [False, True])
def test_equals_torch_lstm_projection_batch_first(bidir):
    t = _needs_torch()
    T, N, H, P, inp = 5, 4, 6, 3, 4
    m = _torch_module("lstm", inp, H, 2, bidir, "float64", proj=P, batch_first=True)
    direction = "bidirectional" if bidir else "unidirectional"
    with RNNBlock(
        "float64", H, 2, "lstm", direction_mode=direction, proj_size=P, batch_first=True
    ) as block:
        w = block.from_torch(m.state_dict(), inp)
        x = t.randn(N, T, inp, device="cuda", dtype=t.float64, requires_grad=True)
        out, (hy, cy) = m(x)
        y, hy2, cy2 = block.apply(w, x.detach(), training=True)  # hx, cx None: zeros
        assert _err(y.get(), out.detach().cpu().numpy()) < 1e-10
        assert _err(hy2.get(), hy.detach().cpu().numpy()) < 1e-10
        assert _err(cy2.get(), cy.detach().cpu().numpy()) < 1e-10
        gy = t.randn_like(out)
        (out * gy).sum().backward()
        dx, _dhx, _dcx, dw = block.backward(w, x.detach(), None, None, y, gy)
        assert _err(dx.get(), x.grad.cpu().numpy()) < 1e-9
        grads = block.to_torch(dw, inp)
        for name, p in m.named_parameters():
            assert _err(grads[name], p.grad.cpu().numpy()) < 1e-9, name


@pytest.mark.parametrize("mode", MODES)
def test_equals_torch_variable_lengths(mode):
    t = _needs_torch()
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    T, N, H, inp = 7, 5, 4, 3
    lengths = [3, 7, 1, 5, 7]  # unsorted
    m = _torch_module(mode, inp, H, 2, True, "float64")
    lstm = mode == "lstm"
    with RNNBlock("float64", H, 2, mode, direction_mode="bidirectional") as block:
        w = block.from_torch(m, inp)
        x = t.randn(T, N, inp, device="cuda", dtype=t.float64, requires_grad=True)
        h0 = t.randn(4, N, H, device="cuda", dtype=t.float64, requires_grad=True)
        c0 = t.randn(4, N, H, device="cuda", dtype=t.float64, requires_grad=True)
        packed = pack_padded_sequence(x, t.tensor(lengths), enforce_sorted=False)
        out_p, state = m(packed, (h0, c0) if lstm else h0)
        out, _ = pad_packed_sequence(out_p, total_length=T)
        hy, cy = state if lstm else (state, None)
        y = _poisoned((T, N, 2 * H), np.float64)
        got = block.apply(
            w,
            x.detach(),
            h0.detach(),
            c0.detach() if lstm else None,
            t.tensor(lengths),
            True,
            out=(y, None, None) if lstm else (y, None),
        )
        assert _err(got[0].get(), out.detach().cpu().numpy()) < 1e-10  # zero padding too
        assert _err(got[1].get(), hy.detach().cpu().numpy()) < 1e-10
        if lstm:
            assert _err(got[2].get(), cy.detach().cpu().numpy()) < 1e-10
        gy, ghy = t.randn_like(out), t.randn_like(hy)
        ((out * gy).sum() + (hy * ghy).sum()).backward()
        dx, dhx, dcx, dw = block.backward(
            w,
            x.detach(),
            h0.detach(),
            c0.detach() if lstm else None,
            got[0],
            gy,
            ghy,
            None,
            lengths,
        )
        assert _err(dx.get(), x.grad.cpu().numpy()) < 1e-9
        assert _err(dhx.get(), h0.grad.cpu().numpy()) < 1e-9
        if lstm:
            assert _err(dcx.get(), c0.grad.cpu().numpy()) < 1e-9
        grads = block.to_torch(dw, inp)
        for name, p in m.named_parameters():
            assert _err(grads[name], p.grad.cpu().numpy()) < 1e-9, name


@pytest.mark.parametrize("mode", MODES)
def test_torch_flat_buffer_is_our_layout(mode):
    """torch keeps its cuDNN weights in one buffer laid out by cuDNN: ours, element for element."""
    t = _needs_torch()
    m = _torch_module(mode, 5, 4, 2, True, "float32")
    m.flatten_parameters()
    with RNNBlock("float32", 4, 2, mode, direction_mode="bidirectional") as block:
        n = block.get_param_size(5)
        assert n == sum(p.numel() for p in m.parameters())
        first = m._flat_weights[0]
        buf = t.empty(0, dtype=t.float32, device="cuda").set_(first.untyped_storage(), 0, (n,))
        np.testing.assert_array_equal(block.from_torch(m, 5).get(), buf.cpu().numpy())
        # and the gate blocks are where the layout says (the second gate, or the only one)
        lay = block.layout(5)
        gate = 1 if len(GATES[mode]) > 1 else 0
        W = block.split_params(block.from_torch(m, 5), 1, 5)[gate][0].get()
        rows = m.weight_ih_l0_reverse.detach().cpu().numpy()[4 * gate : 4 * gate + 4]
        np.testing.assert_array_equal(W, rows)
        assert lay == canonical_rnn_layout(mode, 5, 4, 2, True)


def test_converters_round_trip_on_device_weights():
    _needs_torch()
    m = _torch_module("gru", 3, 4, 2, True, "float32")
    with RNNBlock("float32", 4, 2, "gru", direction_mode="bidirectional") as block:
        w = block.from_torch(m, 3)
        back = block.to_torch(w, 3)
        for name, p in m.state_dict().items():
            np.testing.assert_array_equal(back[name], p.cpu().numpy())
        back2 = rnn_weights_to_torch(w, block.layout(3))  # a device array is read to the host
        assert back2.keys() == back.keys()


# ==================================================================================================
# gradients by finite differences (float64, tiny)
# ==================================================================================================
@pytest.mark.parametrize("mode", MODES)
def test_finite_differences(mode):
    T, N, H, inp = 3, 2, 2, 3
    lengths = (3, 2)
    lstm = mode == "lstm"
    with RNNBlock("float64", H, 2, mode, direction_mode="bidirectional") as block:
        host, dev = _problem(block, T, N, inp, "float64", lengths)
        if mode == "rnn_relu":  # keep away from the kink
            host["w"] = host["w"] + 0.05
            dev["w"] = memory.to_device(host["w"])

        def loss(w, x, hx, cx):
            got = block.apply(
                memory.to_device(w),
                memory.to_device(x),
                memory.to_device(hx),
                memory.to_device(cx) if lstm else None,
                lengths,
            )
            s = (got[0].get() * host["gy"]).sum() + (got[1].get() * host["ghy"]).sum()
            return s + ((got[2].get() * host["gcy"]).sum() if lstm else 0.0)

        y, *_ = block.apply(
            dev["w"], dev["x"], dev["hx"], dev["cx"] if lstm else None, lengths, True
        )
        dx, dhx, dcx, dw = block.backward(
            dev["w"],
            dev["x"],
            dev["hx"],
            dev["cx"] if lstm else None,
            y,
            dev["gy"],
            dev["ghy"],
            dev["gcy"] if lstm else None,
            lengths,
        )
        args = [host["w"], host["x"], host["hx"], host["cx"]]
        analytic = [dw.get(), dx.get(), dhx.get(), dcx.get() if lstm else None]
        eps = 1e-6
        for i, (a, g) in enumerate(zip(args, analytic, strict=True)):
            if g is None:
                continue
            flat = a.reshape(-1)
            for j in range(flat.size):
                old = flat[j]
                flat[j] = old + eps
                up = loss(*args)
                flat[j] = old - eps
                down = loss(*args)
                flat[j] = old
                fd = (up - down) / (2 * eps)
                assert abs(fd - g.reshape(-1)[j]) < 1e-6 * max(1.0, abs(fd)), (i, j, fd, g)


# ==================================================================================================
# semantics
# ==================================================================================================
def _lstm_case(block, T=4, N=3, inp=5):
    host, dev = _problem(block, T, N, inp, "float64", None)
    return host, dev


def test_weight_gradient_overwrite_and_accumulate():
    with RNNBlock("float64", 4, 2, "lstm") as block:
        _host, dev = _lstm_case(block)
        args = (dev["w"], dev["x"], dev["hx"], dev["cx"])
        y, _, _ = block.apply(*args, training=True)
        _, _, _, g = block.backward(*args, y, dev["gy"])
        base = _rng.standard_normal(g.shape[0])
        dw = memory.to_device(base)
        y, _, _ = block.apply(*args, training=True)
        block.backward(*args, y, dev["gy"], dw=dw, accumulate=True)
        np.testing.assert_allclose(dw.get(), base + g.get(), rtol=1e-12, atol=1e-12)
        poisoned = _poisoned(g.shape, np.float64)
        y, _, _ = block.apply(*args, training=True)
        block.backward(*args, y, dev["gy"], dw=poisoned, accumulate=False)
        np.testing.assert_allclose(poisoned.get(), g.get(), rtol=1e-12, atol=1e-12)
        y, _, _ = block.apply(*args, training=True)
        dx, _dhx, _dcx, none = block.backward(*args, y, dev["gy"], weights=False)
        assert none is None and dx.shape == (4, 3, 5)


def test_missing_states_are_zeros():
    with RNNBlock("float64", 4, 1, "lstm", direction_mode="bidirectional") as block:
        _host, dev = _lstm_case(block)
        zh = memory.zeros(dev["hx"].shape, np.float64)
        zc = memory.zeros(dev["cx"].shape, np.float64)
        a = block.apply(dev["w"], dev["x"], None, None, training=True)
        b_ = block.apply(dev["w"], dev["x"], zh, zc, training=True)
        for u, v in zip(a, b_, strict=True):
            np.testing.assert_array_equal(u.get(), v.get())
        g1 = block.backward(dev["w"], dev["x"], zh, zc, b_[0], dev["gy"])
        block.apply(dev["w"], dev["x"], zh, zc, training=True)
        g2 = block.backward(dev["w"], dev["x"], zh, zc, b_[0], dev["gy"], zh, zc)
        for u, v in zip(g1, g2, strict=True):
            np.testing.assert_allclose(u.get(), v.get(), rtol=1e-13, atol=1e-13)


def test_backward_needs_the_training_apply():
    with RNNBlock("float32", 4, 1, "gru") as block:
        _host, dev = _problem(block, 4, 2, 3, "float32", None)
        args = (dev["w"], dev["x"], dev["hx"], None)
        y, _ = block.apply(*args)  # inference: no reserve
        with pytest.raises(RuntimeError, match="no training apply"):
            block.backward(*args, y, dev["gy"])
        block.apply(*args, seq_lengths=[4, 3], training=True)
        with pytest.raises(RuntimeError, match="another input shape or other sequence lengths"):
            block.backward(*args, y, dev["gy"])
        y, _ = block.apply(*args, training=True)
        _dx, _dhx, dcx, dw = block.backward(*args, y, dev["gy"])
        assert dcx is None and np.isfinite(dw.get()).all()


def test_dropout_between_layers():
    with (
        RNNBlock("float32", 8, 3, "lstm", dropout=0.5, seed=1234) as b1,
        RNNBlock("float32", 8, 3, "lstm", seed=1234) as b0,
        RNNBlock("float32", 8, 3, "lstm", dropout=0.5, seed=1234) as b2,
    ):
        _host, dev = _problem(b0, 5, 4, 6, "float32", None)
        args = (dev["w"], dev["x"], dev["hx"], dev["cx"])
        ref = b0.apply(*args)[0].get()
        np.testing.assert_array_equal(b1.apply(*args)[0].get(), ref)  # no dropout in inference
        y1 = b1.apply(*args, training=True)[0]
        y2 = b2.apply(*args, training=True)[0]
        assert not np.allclose(y1.get(), ref)  # dropout applied
        np.testing.assert_array_equal(y1.get(), y2.get())  # same seed, same first mask
        dx, _, _, dw = b1.backward(*args, y1, dev["gy"])
        assert np.isfinite(dx.get()).all() and np.isfinite(dw.get()).all()


def test_strided_input_is_staged():
    with RNNBlock("float64", 4, 2, "gru", direction_mode="bidirectional") as block:
        host, dev = _problem(block, 5, 3, 4, "float64", None)
        xt = memory.to_device(np.ascontiguousarray(host["x"].transpose(1, 0, 2)))
        xv = xt.transpose(1, 0, 2)  # (T, N, I) view with batch-major strides
        a = block.apply(dev["w"], dev["x"], dev["hx"])
        b_ = block.apply(dev["w"], xv, dev["hx"])
        np.testing.assert_array_equal(a[0].get(), b_[0].get())


def test_repeated_call_reuses_everything(monkeypatch):
    with RNNBlock("float32", 8, 2, "lstm") as block:
        _host, dev = _problem(block, 6, 4, 8, "float32", [6, 5, 4, 3])
        args = (dev["w"], dev["x"], dev["hx"], dev["cx"], [6, 5, 4, 3], True)
        builds = []
        real = _rnn_calls.build_forward

        def counting(*a):
            builds.append(1)
            return real(*a)

        monkeypatch.setattr(_rnn_calls, "build_forward", counting)
        outs = block.apply(*args)
        reserve = next(iter(block._shapes.values())).reserve
        for _ in range(3):
            block.apply(*args, out=outs)
        assert len(builds) == 2  # out= given or not: two keys
        assert next(iter(block._shapes.values())).reserve is reserve
        assert len(block._shapes) == 1


def test_close_frees_and_refuses():
    block = RNNBlock("float32", 4, 1, "rnn_tanh")
    _host, dev = _problem(block, 3, 2, 4, "float32", None)
    block.apply(dev["w"], dev["x"], dev["hx"], training=True)
    block.close()
    block.close()
    assert block.closed and not block._shapes and not block._devices
    with pytest.raises(ValueError, match="closed"):
        block.apply(dev["w"], dev["x"], dev["hx"])
    with pytest.raises(ValueError, match="closed"):
        block.get_param_size(4)


def test_fp16_uses_tensor_ops_and_fp32_fma_by_default():
    assert RNNBlock("float16", 4, 1, "lstm").math == "tensor_op"
    assert RNNBlock("float32", 4, 1, "lstm").math == "fma"
    with pycudnn.config.override(allow_tf32=True):
        assert RNNBlock("float32", 4, 1, "lstm").math == "default"
    b = RNNBlock("float32", 4, 1, "lstm", math="tensor_op_allow_conversion")
    assert b._device(None).rnn(4)[0].math_type.name == "TENSOR_OP_MATH_ALLOW_CONVERSION"


def test_selftest_lstm_case_passes():
    from pycudnn import _selftest

    msg = dict(_selftest.CASES)["lstm"]()
    assert "max" in msg


def test_selftest_lstm_case_detects_wrong_results(monkeypatch):
    from pycudnn import _selftest

    orig = _selftest._check
    monkeypatch.setattr(_selftest, "_check", lambda n, got, want, tol: orig(n, got, want + 1, tol))
    with pytest.raises(AssertionError):
        dict(_selftest.CASES)["lstm"]()


def test_module_exports():
    assert rnn_mod.__all__ == ["RNNBlock"]


def test_docs_example_runs():
    """docs/rnn.md's example runs as written."""
    import re
    from pathlib import Path

    _needs_torch()
    text = (Path(__file__).resolve().parents[2] / "docs" / "rnn.md").read_text()
    block = re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]
    exec(compile(block, "docs/rnn.md", "exec"), {"__name__": "rnn_doc"})
