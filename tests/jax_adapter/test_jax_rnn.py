"""``pycudnn.jax.rnn`` on JAX's CPU platform: argument checks at trace time, the packed weights
(PyTorch's parameters in and out, against the high level's converter), the lowering for CUDA
(the ``rnn`` target, the reserve space aliased into the backward), and -- with the target
registered for the CPU platform with a float64 numpy twin in cuDNN's place
(``jax_rnn_references.twin``) and a fixed reserve size -- outputs, final states and gradients
against a pure-JAX ``lax.scan`` reference, under jit, vmap (per example) and with padded
sequences. cuDNN itself runs in ``test_jax_rnn_gpu.py``."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402
import jax_op_references  # noqa: E402
import jax_rnn_references as RR  # noqa: E402

import pycudnn.jax as pj  # noqa: E402
from pycudnn.highlevel.rnn_layout import canonical_rnn_layout, rnn_weights_from_torch  # noqa: E402
from pycudnn.jax import _rnn  # noqa: E402

pytestmark = pytest.mark.jax
CPU = jax.devices("cpu")[0]


@pytest.fixture(scope="module", autouse=True)
def twin():
    """The ``rnn`` target on the CPU platform (once a process), a fixed reserve size in place of
    cuDNN's (which needs a GPU), float64 allowed."""
    jax_op_references.register_twins("rnn", twin=RR.twin)
    size = _rnn.reserve_size
    _rnn.reserve_size = lambda request, shape, dtype: 96 + shape[0] * shape[1]
    with jax.enable_x64(True):
        yield
    _rnn.reserve_size = size


def _rand(*shape, seed=0, dtype=np.float64, scale=1.0):
    a = np.random.default_rng(seed).standard_normal(shape) * scale
    return jax.device_put(a.astype(dtype), CPU)


def _close(a, b, tol=1e-9, what=""):
    np.testing.assert_allclose(
        np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=tol, atol=tol, err_msg=what
    )


def _params(mode, inp, hidden, layers, bidi, proj, seed=1, dtype=np.float64):
    """PyTorch-named random parameters (scaled as PyTorch initialises them)."""
    lay = canonical_rnn_layout(mode, inp, hidden, layers, bidi, proj)
    flat = np.random.default_rng(seed).uniform(-1, 1, lay.size) / np.sqrt(hidden)
    kw = {"mode": mode, "input_size": inp, "hidden_size": hidden, "num_layers": layers}
    kw.update(bidirectional=bidi, proj_size=proj)
    return pj.rnn_unpack_weights(jnp.asarray(flat.astype(dtype)), **kw), kw


# -- argument checks ----------------------------------------------------------------------------
X = jax.ShapeDtypeStruct((5, 3, 4), jnp.float32)
W_LSTM = jax.ShapeDtypeStruct((pj.rnn_weight_size("lstm", 4, 6),), jnp.float32)
W_GRU = jax.ShapeDtypeStruct((pj.rnn_weight_size("gru", 4, 6),), jnp.float32)


@pytest.mark.parametrize(
    ("f", "error", "match"),
    [
        (lambda x, w: pj.rnn(x, None, None, w, mode="LSTM", hidden_size=6), ValueError,
         r"mode='LSTM'; expected one of \('rnn_relu'"),
        (lambda x, w: pj.rnn(x, None, None, w, mode="lstm", hidden_size=True), TypeError,
         r"hidden_size=True; expected an int"),
        (lambda x, w: pj.rnn(x, None, None, w, mode="lstm", hidden_size=6, num_layers=0),
         ValueError, r"num_layers=0; expected an int >= 1"),
        (lambda x, w: pj.rnn(x, None, None, w, mode="lstm", hidden_size=6, bidirectional=1),
         TypeError, r"bidirectional=1; expected True or False"),
        (lambda x, w: pj.rnn(x, None, None, w, mode="lstm", hidden_size=6, batch_first="no"),
         TypeError, r"batch_first='no'; expected True or False"),
        (lambda x, w: pj.rnn(x, None, None, w, mode="lstm", hidden_size=6, proj_size=6),
         ValueError, r"proj_size=6; expected None, or for mode='lstm' an int < hidden_size"),
        (lambda x, w: pj.rnn(x, None, None, w, mode="lstm", hidden_size=5), ValueError,
         r"weights is float32\[\d+\]; expected float32\[\d+\]"),
        (lambda x, w: pj.rnn(x, jnp.zeros((2, 3, 6), x.dtype), None, w, mode="lstm", hidden_size=6),
         ValueError, r"h0 is float32\[2, 3, 6\]; expected float32\[1, 3, 6\]"),
        (lambda x, w: pj.rnn(x, None, jnp.zeros((1, 3, 6), jnp.float64), w, mode="lstm",
                             hidden_size=6), ValueError, r"c0 is float64\[1, 3, 6\]"),
        (lambda x, w: pj.rnn(x.astype(jnp.bfloat16), None, None, w, mode="lstm", hidden_size=6),
         TypeError, r"x has dtype bfloat16; expected one of \('float16', 'float32', 'float64'\)"),
        (lambda x, w: pj.rnn(x[0], None, None, w, mode="lstm", hidden_size=6), ValueError,
         r"x has shape \(3, 4\); expected 3 dims \(T, N, input_size\)"),
        (lambda x, w: pj.rnn(x, None, None, w, mode="lstm", hidden_size=6, seq_lengths=[5, 5]),
         ValueError, r"seq_lengths has 2 entries; x has N=3"),
        (lambda x, w: pj.rnn(x, None, None, w, mode="lstm", hidden_size=6,
                             seq_lengths=[5, 6, 1]), ValueError, r"expected each in \[1, T=5\]"),
        (lambda x, w: pj.rnn(x, None, None, w, mode="lstm", hidden_size=6,
                             seq_lengths=[1.5, 2, 3]), TypeError, r"expected a sequence of ints"),
    ],
)  # fmt: skip
def test_arguments_are_checked_at_trace_time(f, error, match):
    with pytest.raises(error, match=match):
        jax.eval_shape(f, X, W_LSTM)


def test_c0_for_a_gru_and_traced_lengths_are_refused():
    with pytest.raises(TypeError, match=r"c0 is only for mode='lstm', not 'gru'; pass None"):
        jax.eval_shape(
            lambda x, w: pj.rnn(x, None, jnp.zeros((1, 3, 6)), w, mode="gru", hidden_size=6),
            X,
            W_GRU,
        )
    with pytest.raises(TypeError, match=r"seq_lengths is a traced array; expected host ints"):
        jax.jit(
            lambda x, w, s: pj.rnn(x, None, None, w, mode="gru", hidden_size=6, seq_lengths=s)
        ).trace(X, W_GRU, jnp.ones(3, jnp.int32))


def test_result_shapes():
    w = jax.ShapeDtypeStruct((pj.rnn_weight_size("lstm", 4, 6, 2, True, 3),), jnp.float32)
    x = jax.ShapeDtypeStruct((3, 5, 4), jnp.float32)
    y, h, c = jax.eval_shape(
        lambda x, w: pj.rnn(
            x, None, None, w, mode="lstm", hidden_size=6, num_layers=2, bidirectional=True,
            proj_size=3, batch_first=True,
        ),
        x,
        w,
    )  # fmt: skip
    assert (y.shape, h.shape, c.shape) == ((3, 5, 6), (4, 3, 3), (4, 3, 6))
    y, h, c = jax.eval_shape(
        lambda x, w: pj.rnn(x, None, None, w, mode="gru", hidden_size=6), X, W_GRU
    )
    assert (y.shape, h.shape, c) == ((5, 3, 6), (1, 3, 6), None)


# -- the packed weights -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("mode", "layers", "bidi", "proj"),
    [("lstm", 2, True, 3), ("gru", 1, False, None), ("rnn_tanh", 3, True, None)],
)
def test_packed_weights_are_the_high_levels_and_round_trip(mode, layers, bidi, proj):
    params, kw = _params(mode, 4, 5, layers, bidi, proj)
    packed = pj.rnn_pack_weights(params, **kw)
    lay = canonical_rnn_layout(mode, 4, 5, layers, bidi, proj)
    theirs = rnn_weights_from_torch({k: np.asarray(v) for k, v in params.items()}, lay)
    assert packed.shape == (pj.rnn_weight_size(mode, 4, 5, layers, bidi, proj),)
    np.testing.assert_array_equal(np.asarray(packed), theirs)
    back = pj.rnn_unpack_weights(packed, **kw)
    assert list(back) == list(params)
    for k in params:
        np.testing.assert_array_equal(np.asarray(back[k]), np.asarray(params[k]))


def test_packing_names_what_is_wrong():
    params, kw = _params("gru", 4, 5, 1, False, None)
    with pytest.raises(ValueError, match=r"parameter 'bias_hh_l0' is missing"):
        pj.rnn_pack_weights({k: v for k, v in params.items() if k != "bias_hh_l0"}, **kw)
    with pytest.raises(ValueError, match=r"unexpected parameters \['weight_hr_l0'\]"):
        pj.rnn_pack_weights({**params, "weight_hr_l0": jnp.zeros((2, 5))}, **kw)
    with pytest.raises(ValueError, match=r"weight_ih_l0 has shape \(15, 3\); expected \(15, 4\)"):
        pj.rnn_pack_weights({**params, "weight_ih_l0": jnp.zeros((15, 3))}, **kw)
    with pytest.raises(ValueError, match=r"weights has shape \(7,\); expected \(\d+,\)"):
        pj.rnn_unpack_weights(jnp.zeros(7), **kw)


# -- lowering ------------------------------------------------------------------------------------
def test_lowering_an_inference_call_and_a_gradient():
    def f(x, w):
        return pj.rnn(x, None, None, w, mode="lstm", hidden_size=6)[0]

    text = jax.jit(f).trace(X, W_LSTM).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("pycudnn_jax_rnn") == 1 and "'RNN'" in text and "False, 0)" in text
    grad = jax.jit(jax.grad(lambda x, w: f(x, w).sum(), argnums=(0, 1)))
    text = grad.trace(X, W_LSTM).lower(lowering_platforms=("cuda",)).as_text()
    assert "'RNNGrad'" in text and "True, 111)" in text  # the reserve size: 96 + T * N
    assert "output_operand_alias" in text  # the reserve: updated in place


# -- values and gradients against lax.scan (CPU, float64) ---------------------------------------
CASES = [
    ("lstm", 1, False, None, False, None),
    ("lstm", 2, True, None, False, (5, 2, 4)),
    ("lstm", 2, True, 3, True, None),
    ("gru", 2, True, None, False, None),
    ("gru", 1, False, None, True, (1, 5, 3)),
    ("rnn_tanh", 2, False, None, False, None),
    ("rnn_relu", 1, True, None, False, (4, 4, 2)),
]


@pytest.mark.parametrize(("mode", "layers", "bidi", "proj", "batch_first", "lengths"), CASES)
def test_outputs_states_and_gradients_are_a_scans(mode, layers, bidi, proj, batch_first, lengths):
    t, n, inp, hidden = 5, 3, 4, 6
    params, kw = _params(mode, inp, hidden, layers, bidi, proj)
    w = pj.rnn_pack_weights(params, **kw)
    dirs = 2 if bidi else 1
    x = _rand(*((n, t, inp) if batch_first else (t, n, inp)), seed=2)
    h0 = _rand(layers * dirs, n, proj or hidden, seed=3, scale=0.5)
    c0 = _rand(layers * dirs, n, hidden, seed=4, scale=0.5) if mode == "lstm" else None
    lstm = mode == "lstm"
    ours, theirs = RR.ours_and_theirs(kw, batch_first, lengths)

    args = (x, h0, c0, w)
    got, ref = jax.jit(ours)(*args), theirs(*args)
    for what, a, b in zip(("y", "h", "c")[: len(ref)], got, ref, strict=True):
        _close(a, b, what=what)
    if lengths is not None:  # padded steps are zero
        for i, ln in enumerate(lengths):
            pad = got[0][i, ln:] if batch_first else got[0][ln:, i]
            assert not np.asarray(pad).any()
    cts = tuple(_rand(*r.shape, seed=10 + i) for i, r in enumerate(ref))
    argnums = (0, 1, 2, 3) if lstm else (0, 1, 3)

    def loss(f):
        return lambda *a: sum((o * c).sum() for o, c in zip(f(*a), cts, strict=True))

    g_ours = jax.jit(jax.grad(loss(ours), argnums=argnums))(*args)
    g_ref = jax.jit(jax.grad(loss(theirs), argnums=argnums))(*args)
    for i, a, b in zip(argnums, g_ours, g_ref, strict=True):
        _close(a, b, tol=1e-8, what=f"d{('x', 'h0', 'c0', 'w')[i]}")


def test_float32_and_none_states():
    params, kw = _params("gru", 4, 6, 1, False, None, dtype=np.float32)
    w = pj.rnn_pack_weights(params, **kw)
    x = _rand(5, 3, 4, seed=5, dtype=np.float32)
    y, h, c = jax.jit(lambda x, w: pj.rnn(x, None, None, w, mode="gru", hidden_size=6))(x, w)
    ry, rh, _ = RR.jax_rnn("gru", pj.rnn_unpack_weights(w, **kw), x, jnp.zeros((1, 3, 6)), None,
                           1, False)  # fmt: skip
    assert y.dtype == h.dtype == jnp.float32 and c is None
    _close(y, ry, tol=1e-5)
    _close(h, rh, tol=1e-5)


def test_vmap_runs_per_example_values_and_gradients():
    params, kw = _params("lstm", 4, 6, 1, False, None)
    w = pj.rnn_pack_weights(params, **kw)
    xs = _rand(2, 5, 3, 4, seed=6)

    def f(x, w):
        y, h, c = pj.rnn(x, None, None, w, mode="lstm", hidden_size=6)
        return (y**2).sum() + (h * c).sum()

    batched = jax.jit(jax.vmap(jax.value_and_grad(f, argnums=(0, 1)), in_axes=(0, None)))(xs, w)
    for i in range(2):
        v, (dx, dw) = jax.value_and_grad(f, argnums=(0, 1))(xs[i], w)
        _close(batched[0][i], v)
        _close(batched[1][0][i], dx)
        _close(batched[1][1][i], dw)


# -- the GPU run's plumbing, with cuDNN's functions recorded (no GPU) ---------------------------
class _Buf:
    def __init__(self, ptr, shape, dtype):
        self.ptr, self.shape, self.dtype = ptr, shape, np.dtype(dtype)
        self.nbytes = int(np.prod(shape)) * self.dtype.itemsize


class _Shape:
    rnn, xdesc, ydesc, hdesc, cdesc, dev_lengths_p = "RNN", "X", "Y", "H", "C", "LEN"
    ws_train, ws_infer, rs_bytes = 300, 200, 96

    def __init__(self, w_bytes):
        self.w_bytes = w_bytes


def _recording(monkeypatch, w_bytes):
    calls = []

    class Block:
        def _device(self, device):
            return device

        def _shape(self, dev, t, n, inp, lengths):
            calls.append(("shape", dev, t, n, inp, lengths))
            return _Shape(w_bytes)

    class Handle:
        ptr, device, stream = "HANDLE", 0, 77

    monkeypatch.setattr(_rnn, "_block", lambda request, dtype: Block())
    monkeypatch.setattr(_rnn, "device_of", lambda buffers: 0)
    monkeypatch.setattr(_rnn._call, "handle_for", lambda device, stream, func: Handle())
    monkeypatch.setattr(_rnn._call, "workspace", lambda h, n: 5000 + n)
    monkeypatch.setattr(_rnn._call, "quiet", lambda name: lambda *a: calls.append((name, *a)))
    monkeypatch.setattr(_rnn._rnn_calls, "zero", lambda *a: calls.append(("zero", *a)))
    return calls


def test_the_gpu_run_gives_cudnn_xlas_pointers_and_the_reserve(monkeypatch):
    w_bytes = pj.rnn_weight_size("lstm", 4, 6) * 4
    calls = _recording(monkeypatch, w_bytes)
    req = _rnn.RNN("lstm", 6, 1, False, None, False, (5, 3, 2), True, 96)
    args = [_Buf(p, s, "f4") for p, s in ((1, (5, 3, 4)), (2, (1, 3, 6)), (3, (1, 3, 6)))]
    args.append(_Buf(4, (w_bytes // 4,), "f4"))
    rets = [_Buf(p, s, "f4") for p, s in ((11, (5, 3, 6)), (12, (1, 3, 6)), (13, (1, 3, 6)))]
    rets.append(_Buf(14, (96,), "u1"))
    req.run(args, rets, 77)
    assert calls[0] == ("shape", 0, 5, 3, 4, (5, 3, 2))
    name, *a = calls[1]
    assert name == "cudnnRNNForward"
    assert a[3:] == ["LEN", "X", 1, "Y", 11, "H", 2, 12, "C", 3, 13, w_bytes, 4, 300, 5300, 96, 14]
    calls.clear()
    grad = _rnn.RNNGrad("lstm", 6, 1, False, None, False, (5, 3, 2), True, 96)
    gargs = [*args, _Buf(21, (5, 3, 6), "f4"), _Buf(22, (5, 3, 6), "f4")]
    gargs += [_Buf(23, (1, 3, 6), "f4"), _Buf(24, (1, 3, 6), "f4"), _Buf(14, (96,), "u1")]
    grets = [_Buf(p, b.shape, "f4") for p, b in zip((31, 32, 33, 34), args, strict=True)]
    grets.append(_Buf(14, (96,), "u1"))  # aliased: the operand's buffer
    grad.run(gargs, grets, 77)
    names = [c[0] for c in calls]
    assert names == ["shape", "cudnnRNNBackwardData_v8", "zero", "cudnnRNNBackwardWeights_v8"]
    data, zero, weights = calls[1][1:], calls[2][1:], calls[3][1:]
    assert data[4:] == (21, 22, "X", 31, "H", 2, 23, 32, "C", 3, 24, 33, w_bytes, 4, 300, 5300,
                        96, 14)  # fmt: skip
    assert zero == (34, w_bytes, 0, 77)
    assert weights[4:] == ("X", 1, "H", 2, "Y", 21, w_bytes, 34, 300, 5300, 96, 14)
    inference = _rnn.RNN("gru", 6, 1, False, None, False, None, False, 0)
    calls.clear()
    gw = _Buf(4, (pj.rnn_weight_size("gru", 4, 6),), "f4")
    with pytest.raises(ValueError, match=r"cuDNN's weight space is \d+ bytes; weights has"):
        inference.run([args[0], args[1], gw], rets[:2], 77)
    calls.clear()
    with pytest.raises(ValueError, match=r"reserve space is 96 bytes here, 64 when the call"):
        _rnn.RNN("lstm", 6, 1, False, None, False, None, True, 64).run(args, rets, 77)


def test_an_inference_call_exports_with_symbolic_dims_and_runs_for_several_sizes():
    from jax import export

    params, kw = _params("gru", 4, 6, 1, False, None)
    w = pj.rnn_pack_weights(params, **kw)
    t, n = export.symbolic_shape("t, n")
    x = jax.ShapeDtypeStruct((t, n, 4), jnp.float64)

    def f(x, w):
        return pj.rnn(x, None, None, w, mode="gru", hidden_size=6)[0]

    checks = [export.DisabledSafetyCheck.custom_call("pycudnn_jax_rnn")]
    exp = export.export(jax.jit(f), platforms=("cpu",), disabled_checks=checks)(
        x, jax.ShapeDtypeStruct(w.shape, w.dtype)
    )
    for shape in ((5, 3, 4), (2, 1, 4)):
        xs = _rand(*shape, seed=8)
        ref = RR.jax_rnn("gru", params, xs, jnp.zeros((1, shape[1], 6)), None, 1, False)[0]
        _close(exp.call(xs, w), ref)


def _flax_cells(mode, inp, hidden, count, seed=20):
    """Random parameters shaped as flax.linen's cells' (kernels (in, H); biases where Flax's
    cells have them)."""
    rng = np.random.default_rng(seed)
    ins, hids = _rnn._FLAX[mode]
    biased = {"lstm": ("hi", "hf", "hg", "ho"), "gru": ("ir", "iz", "in", "hn")}
    cells = []
    for _ in range(count):
        cell = {}
        for name in ins + hids:
            rows = inp if name in ins else hidden
            dense = {"kernel": jnp.asarray(rng.uniform(-0.5, 0.5, (rows, hidden)))}
            if name in biased.get(mode, ("i",)):
                dense["bias"] = jnp.asarray(rng.uniform(-0.5, 0.5, hidden))
            cell[name] = dense
        cells.append(cell)
    return cells


def _flax_step(mode, p, x, h, c):
    """flax.linen's cell equations (LSTMCell, GRUCell, SimpleCell)."""

    def d(name, v):
        return v @ p[name]["kernel"] + p[name].get("bias", 0)

    if mode == "lstm":
        i = jax.nn.sigmoid(d("ii", x) + d("hi", h))
        f = jax.nn.sigmoid(d("if", x) + d("hf", h))
        g = jnp.tanh(d("ig", x) + d("hg", h))
        o = jax.nn.sigmoid(d("io", x) + d("ho", h))
        c = f * c + i * g
        return o * jnp.tanh(c), c
    if mode == "gru":
        r = jax.nn.sigmoid(d("ir", x) + d("hr", h))
        z = jax.nn.sigmoid(d("iz", x) + d("hz", h))
        n = jnp.tanh(d("in", x) + r * d("hn", h))
        return (1 - z) * n + z * h, c
    s = d("i", x) + d("h", h)
    return (jnp.tanh(s) if mode == "rnn_tanh" else jnp.maximum(s, 0)), c


@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_tanh"])
def test_weights_from_flax_cells_compute_flaxs_equations(mode):
    inp, hidden = 3, 5
    (cell,) = _flax_cells(mode, inp, hidden, 1)
    w = pj.rnn_weights_from_flax([cell], mode=mode, input_size=inp, hidden_size=hidden)
    x = _rand(4, 2, inp, seed=21)
    h0, c0 = _rand(1, 2, hidden, seed=22), _rand(1, 2, hidden, seed=23)
    lstm = mode == "lstm"
    y, hy, cy = pj.rnn(x, h0, c0 if lstm else None, w, mode=mode, hidden_size=hidden)
    h, c, ys = h0[0], c0[0], []
    for t in range(4):
        h, c = _flax_step(mode, cell, x[t], h, c)
        ys.append(h)
    _close(y, jnp.stack(ys))
    _close(hy[0], h)
    if lstm:
        _close(cy[0], c)


def test_weights_from_flax_name_what_is_wrong():
    cells = _flax_cells("gru", 3, 5, 2)
    kw = {"mode": "gru", "input_size": 3, "hidden_size": 5}
    with pytest.raises(ValueError, match=r"2 cells; expected 1 \(num_layers \* num_directions"):
        pj.rnn_weights_from_flax(cells, **kw)
    del cells[0]["hn"]
    with pytest.raises(ValueError, match=r"cells\[0\] has no 'hn' Dense parameters"):
        pj.rnn_weights_from_flax(cells, **kw, bidirectional=True)
    with pytest.raises(ValueError, match=r"cells\[1\]\['ir'\]\['kernel'\] has shape \(3, 4\)"):
        cells[0]["hn"] = cells[1]["hn"]
        cells[1]["ir"] = {"kernel": jnp.zeros((3, 4))}
        pj.rnn_weights_from_flax(cells, **kw, bidirectional=True)
    with pytest.raises(TypeError, match=r"cells is a dict; expected a sequence"):
        pj.rnn_weights_from_flax(cells[0], **kw)
