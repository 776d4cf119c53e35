"""``pycudnn.jax.rnn`` on the GPU, under ``jax.jit``: outputs, final states and the gradients of
x, h0, c0 and the packed weights against a pure-JAX ``lax.scan`` reference computed in float64
(``jax_rnn_references.jax_rnn``), every jitted function run twice on fresh inputs with
NaN-filled memory freed in between (an element cuDNN fails to write shows as NaN); padded
sequences, vmap (per example), ``jax.test_util.check_grads`` on a small float64 case. Markers
``gpu`` and ``jax``."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402
import jax_gpu_support as S  # noqa: E402
import jax_rnn_references as RR  # noqa: E402
from jax_gpu_support import poison as _poison  # noqa: E402
from jax_gpu_support import rand as _rand  # noqa: E402

import pycudnn.jax as pj  # noqa: E402
from pycudnn.highlevel.rnn_layout import canonical_rnn_layout  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.jax]
gpu, float64 = S.gpu, S.float64  # the shared fixtures (float64: autouse)


TOL = {"float64": 1e-9, "float32": 5e-5, "float16": 2e-2}


def _check(what, got, ref, dtype, scale=1.0):
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, expected {ref.shape}"
    nan = int(np.isnan(got).sum())
    assert nan == 0, f"{what}: {nan} NaN elements (unwritten?)"
    err = np.abs(got - ref)
    tol = TOL[str(dtype)] * scale * max(1.0, float(np.abs(ref).max(initial=0)))
    worst = float(err.max(initial=0))
    assert worst <= tol, f"{what}: max error {worst:.3g} > {tol:.3g} at {err.argmax()}"


CASES = [
    # mode, layers, bidirectional, proj_size, batch_first, seq_lengths
    ("lstm", 1, False, None, False, None),
    ("lstm", 2, True, None, True, None),
    ("lstm", 2, False, 4, False, (7, 3, 5, 1)),
    ("gru", 2, True, None, False, (7, 6, 2, 4)),
    ("gru", 1, False, None, True, None),
    ("rnn_tanh", 2, True, None, False, None),
    ("rnn_relu", 1, False, None, False, (2, 7, 7, 5)),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("mode", "layers", "bidi", "proj", "batch_first", "lengths"), CASES)
def test_rnn_outputs_states_and_gradients(
    gpu, mode, layers, bidi, proj, batch_first, lengths, dtype
):
    t, n, inp, hidden = 7, 4, 5, 8
    lstm = mode == "lstm"
    dirs = 2 if bidi else 1
    kw = {"mode": mode, "input_size": inp, "hidden_size": hidden, "num_layers": layers}
    kw.update(bidirectional=bidi, proj_size=proj)
    size = canonical_rnn_layout(mode, inp, hidden, layers, bidi, proj).size
    assert pj.rnn_weight_size(**kw) == size
    ours, theirs = RR.ours_and_theirs(kw, batch_first, lengths)

    argnums = (0, 1, 2, 3) if lstm else (0, 1, 3)

    def loss(f, cts):
        return lambda *a: sum((o * c).sum() for o, c in zip(f(*a), cts, strict=True))

    run = jax.jit(ours)
    for _ in range(2):  # the second run on fresh inputs, outputs in NaN-filled memory
        x = _rand(gpu, (n, t, inp) if batch_first else (t, n, inp), dtype)
        h0 = _rand(gpu, (layers * dirs, n, proj or hidden), dtype, 0.5)
        c0 = _rand(gpu, (layers * dirs, n, hidden), dtype, 0.5) if lstm else None
        w = _rand(gpu, (size,), dtype, 1 / np.sqrt(hidden))
        args = (x, h0, c0, w)
        wide = [None if a is None else a.astype(jnp.float64) for a in args]
        ref = jax.jit(theirs)(*wide)
        _poison(gpu, *(np.empty(r.shape, dtype) for r in ref))
        got = run(*args)
        for what, a, b in zip(("y", "h", "c")[: len(ref)], got, ref, strict=True):
            assert a.dtype == np.dtype(dtype)
            _check(f"{mode} {what}", a, b, dtype)
        cts = tuple(_rand(gpu, r.shape, dtype) for r in ref)
        g_ref = jax.jit(jax.grad(loss(theirs, cts), argnums=argnums))(*wide)
        _poison(gpu, *(np.empty(r.shape, dtype) for r in g_ref))
        g = jax.jit(jax.grad(loss(ours, cts), argnums=argnums))(*args)
        for i, a, b in zip(argnums, g, g_ref, strict=True):
            _check(f"{mode} d{('x', 'h0', 'c0', 'w')[i]}", a, b, dtype, scale=4.0)


def test_rnn_in_float16(gpu):
    kw = {"mode": "lstm", "input_size": 8, "hidden_size": 16}
    size = pj.rnn_weight_size(**kw)
    x = _rand(gpu, (6, 4, 8), "float16")
    w = _rand(gpu, (size,), "float16", 0.25)
    y, h, c = jax.jit(lambda x, w: pj.rnn(x, None, None, w, mode="lstm", hidden_size=16))(x, w)
    p = pj.rnn_unpack_weights(w.astype(jnp.float64), **kw)
    zero = jnp.zeros((1, 4, 16), jnp.float64)
    ry, rh, rc = RR.jax_rnn("lstm", p, x.astype(jnp.float64), zero, zero, 1, False)
    for what, a, b in (("y", y, ry), ("h", h, rh), ("c", c, rc)):
        _check(f"float16 {what}", a, b, "float16")


def test_rnn_vmap_per_example(gpu):
    kw = {"mode": "gru", "input_size": 5, "hidden_size": 6}
    w = _rand(gpu, (pj.rnn_weight_size(**kw),), "float32", 0.4)
    xs = _rand(gpu, (3, 4, 2, 5), "float32")

    def f(x, w):
        y, h, _ = pj.rnn(x, None, None, w, mode="gru", hidden_size=6)
        return (y**2).sum() + h.sum()

    vg = jax.jit(jax.vmap(jax.value_and_grad(f, argnums=(0, 1)), in_axes=(0, None)))(xs, w)
    for i in range(3):
        v, (dx, dw) = jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(xs[i], w)
        _check("vmap value", vg[0][i], v, "float32")
        _check("vmap dx", vg[1][0][i], dx, "float32")
        _check("vmap dw", vg[1][1][i], dw, "float32")


def test_rnn_check_grads(gpu):
    from jax.test_util import check_grads

    kw = {"mode": "lstm", "input_size": 3, "hidden_size": 4, "num_layers": 2}
    w = _rand(gpu, (pj.rnn_weight_size(**kw),), "float64", 0.5)
    x = _rand(gpu, (3, 2, 3), "float64")
    h0 = _rand(gpu, (2, 2, 4), "float64")
    c0 = _rand(gpu, (2, 2, 4), "float64")

    def f(x, h0, c0, w):
        y, h, c = pj.rnn(x, h0, c0, w, mode="lstm", hidden_size=4, num_layers=2)
        return y.sum() + (h * c).sum()

    check_grads(f, (x, h0, c0, w), order=1, modes=("rev",), atol=1e-5, rtol=1e-5)
