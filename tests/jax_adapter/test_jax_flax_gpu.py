"""``pycudnn.jax.linen`` / ``pycudnn.jax.nnx`` on the GPU: each layer's output and gradients
against Flax's own layer (XLA's kernels) on fresh inputs, and a small CNN trained under
``jax.jit`` with optax next to its pure-Flax twin from the same initial variables: the loss
curves agree within Flax's own seed-to-seed spread (``FLAXTRAIN`` lines print both). Markers
``gpu`` and ``jax``."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("flax")

import jax.numpy as jnp  # noqa: E402
from flax import linen as fl  # noqa: E402
from flax import nnx as fx  # noqa: E402
from jax_gpu_support import cuda_device  # noqa: E402

from pycudnn.jax import linen as pl  # noqa: E402
from pycudnn.jax import nnx as px  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.jax]
_seeds = itertools.count(11)


@pytest.fixture(scope="module")
def gpu():
    """JAX's first CUDA device, the default device of the module's tests."""
    device = cuda_device()
    with jax.default_device(device):
        yield device


def _rand(gpu, *shape, dtype="float32"):
    a = np.random.default_rng(next(_seeds)).standard_normal(shape)
    return jax.device_put(a.astype(dtype), gpu)


def _close(a, b, tol):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all()
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol * max(1.0, float(np.abs(b).max())))


CASES = [
    (lambda: pl.Conv(16, (3, 3)), lambda: fl.Conv(16, (3, 3)), (4, 16, 16, 8), 2e-3),
    (lambda: pl.Conv(8, (3, 3), strides=2, feature_group_count=4),
     lambda: fl.Conv(8, (3, 3), strides=2, feature_group_count=4), (2, 15, 15, 8), 2e-3),
    (lambda: pl.Conv(8, (3, 3, 3), padding=1), lambda: fl.Conv(8, (3, 3, 3), padding=1),
     (2, 6, 8, 8, 4), 2e-3),
    (lambda: pl.Conv(16, (3, 3), dtype=jnp.bfloat16),
     lambda: fl.Conv(16, (3, 3), dtype=jnp.bfloat16), (4, 16, 16, 8), 5e-2),
    (lambda: pl.Conv(16, (3, 3), strides=2), lambda: fl.Conv(16, (3, 3), strides=2),
     (4, 16, 16, 8), 2e-3),  # 'SAME' with a stride: asymmetric, (0, 1)
    (lambda: pl.Conv(16, (2, 2), dtype=jnp.bfloat16),
     lambda: fl.Conv(16, (2, 2), dtype=jnp.bfloat16), (4, 16, 15, 8), 5e-2),  # even kernel
    (lambda: pl.LayerNorm(), lambda: fl.LayerNorm(), (8, 64, 256), 1e-4),
    (lambda: pl.RMSNorm(), lambda: fl.RMSNorm(), (8, 64, 256), 1e-4),
]  # fmt: skip


@pytest.mark.parametrize(("ours", "theirs", "shape", "tol"), CASES)
def test_linen_layers_equal_flaxs_on_the_gpu(gpu, ours, theirs, shape, tol):
    x = _rand(gpu, *shape)
    m, f = ours(), theirs()
    v = f.init(jax.random.key(next(_seeds)), x)
    y = jax.jit(m.apply)(v, x)
    ref = jax.jit(f.apply)(v, x)
    _close(y, ref, tol)
    t = _rand(gpu, *ref.shape)
    g = jax.jit(jax.grad(lambda v, x: (m.apply(v, x) * t).sum(), argnums=(0, 1)))(v, x)
    gref = jax.jit(jax.grad(lambda v, x: (f.apply(v, x) * t).sum(), argnums=(0, 1)))(v, x)
    jax.tree.map(lambda a, b: _close(a, b, tol * 5), g, gref)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_same_padded_pools_equal_flaxs_on_the_gpu(gpu, dtype):
    """A ResNet's 3x3 stride-2 'SAME' pooling in Flax: asymmetric, (0, 1) at an even size."""
    x = _rand(gpu, 4, 16, 16, 8, dtype=dtype)
    tol = 1e-6 if dtype == "float32" else 1e-2
    t = _rand(gpu, 4, 8, 8, 8, dtype=dtype)
    for ours, theirs in ((pl.max_pool, fl.max_pool), (pl.avg_pool, fl.avg_pool)):
        y, d = _pool_and_grad(ours, x, t)
        yref, dref = _pool_and_grad(theirs, x, t)
        _close(y, yref, tol)
        _close(d, dref, tol * 5)


def _pool_and_grad(pool, x, t):
    def f(x):
        return pool(x, (3, 3), (2, 2), "SAME")

    loss = jax.jit(jax.value_and_grad(lambda x: (f(x) * t).astype(jnp.float32).sum()))
    return jax.jit(f)(x), loss(x)[1]


def test_nnx_layers_equal_flaxs_on_the_gpu(gpu):
    x = _rand(gpu, 4, 16, 16, 8)
    for ours, theirs in (
        (px.Conv(8, 16, (3, 3), rngs=fx.Rngs(0)), fx.Conv(8, 16, (3, 3), rngs=fx.Rngs(0))),
        (px.LayerNorm(8, rngs=fx.Rngs(0)), fx.LayerNorm(8, rngs=fx.Rngs(0))),
    ):
        _close(fx.jit(lambda m, x: m(x))(ours, x), theirs(x), 2e-3)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_linen_batch_norm_equals_flaxs_on_the_gpu(gpu, dtype):
    x = _rand(gpu, 16, 8, 8, 32, dtype=dtype)
    m, f = pl.BatchNorm(), fl.BatchNorm()
    v = f.init(jax.random.key(0), x, False)
    y, upd = jax.jit(lambda v, x: m.apply(v, x, False, mutable=["batch_stats"]))(v, x)
    ref, ref_upd = jax.jit(lambda v, x: f.apply(v, x, False, mutable=["batch_stats"]))(v, x)
    tol = 2e-2 if dtype == "bfloat16" else 1e-4
    _close(y, ref, tol)
    jax.tree.map(lambda a, b: _close(a, b, 1e-4), upd, ref_upd)
    v2 = {"params": v["params"], **upd}
    _close(jax.jit(lambda v, x: m.apply(v, x, True))(v2, x), f.apply(v2, x, True), tol)


class _Net(fl.Module):
    """A small CNN, written once over a layer set (pycudnn's or Flax's)."""

    conv: type
    norm: type
    max_pool: object
    fused: bool

    @fl.compact
    def __call__(self, x):
        if self.fused:
            x = self.conv(16, (3, 3), activation="relu")(x)
        else:
            x = fl.relu(self.conv(16, (3, 3))(x))
        x = self.norm()(x)
        x = self.max_pool(x, (2, 2), (2, 2))
        if self.fused:
            x = self.conv(32, (3, 3), activation="relu")(x)
        else:
            x = fl.relu(self.conv(32, (3, 3))(x))
        x = x.mean(axis=(1, 2))
        return fl.Dense(10)(x)


def _fit(loss_fn, variables, steps, lr):
    """*steps* jitted Adam steps on ``loss_fn(variables)``; the loss of each step."""
    import optax

    opt = optax.adam(lr)
    state = opt.init(variables)

    @jax.jit
    def step(v, s):
        loss, g = jax.value_and_grad(loss_fn)(v)
        upd, s = opt.update(g, s, v)
        return optax.apply_updates(v, upd), s, loss

    losses = []
    for _ in range(steps):
        variables, state, loss = step(variables, state)
        losses.append(float(loss))
    return np.array(losses)


def _train(net, variables, images, labels, steps):
    import optax

    def loss_fn(v):
        logits = net.apply(v, images)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    return _fit(loss_fn, variables, steps, 3e-3)


def _beside_twin(kind, train, ours, flax, x):
    """Train the pure-Flax model from three seeds and ours from seed 0's variables with
    ``train(net, variables)``; print a ``FLAXTRAIN`` line, check ours stays finite and learns.
    Returns ``(Flax's seed-0 curve, Flax's seed-to-seed spread, |ours - seed 0|)``."""
    curves = [train(flax, flax.init(jax.random.key(seed), x)) for seed in (0, 1, 2)]
    mine = train(ours, flax.init(jax.random.key(0), x))
    twin, spread = curves[0], np.ptp(np.stack(curves), axis=0)
    gap = np.abs(mine - twin)
    print(
        f"FLAXTRAIN {kind} first loss {twin[0]:.4f} flax / {mine[0]:.4f} pycudnn, after "
        f"{len(mine)} steps {twin[-1]:.4f} / {mine[-1]:.4f}; max |gap| {gap.max():.4f}, Flax's "
        f"seed spread at the end {spread[-1]:.4f}"
    )
    assert np.isfinite(mine).all()
    assert mine[-1] < 0.5 * mine[0]  # it learns
    return twin, spread, gap


def test_a_small_cnn_trains_like_its_pure_flax_twin(gpu):
    pytest.importorskip("optax")
    rng = np.random.default_rng(0)
    images = jax.device_put(rng.standard_normal((64, 16, 16, 3)).astype(np.float32), gpu)
    labels = jax.device_put(rng.integers(0, 10, 64).astype(np.int32), gpu)
    ours = _Net(pl.Conv, pl.LayerNorm, pl.max_pool, True)
    flax = _Net(fl.Conv, fl.LayerNorm, fl.max_pool, False)
    _twin, spread, gap = _beside_twin(
        "cnn", lambda net, v: _train(net, v, images, labels, 150), ours, flax, images
    )
    assert gap[0] < 1e-3
    assert gap[-20:].max() <= max(spread[-20:].max(), 0.05)


class _Seq(fl.Module):
    """An LSTM regressor, written once over a recurrent layer (pycudnn's or Flax's)."""

    ours: bool

    @fl.compact
    def __call__(self, x):
        # (parent=None: a cell made in a compact method would be the parent's, not the RNN's)
        cell = fl.LSTMCell(32, parent=None)
        layer = pl.LSTM(32, name="rnn") if self.ours else fl.RNN(cell, name="rnn")
        y = layer(x)
        return fl.Dense(1)(y[:, -1])[:, 0]


def _train_seq(net, variables, x, target, steps):
    return _fit(lambda v: ((net.apply(v, x) - target) ** 2).mean(), variables, steps, 1e-2)


def test_an_lstm_trains_like_its_pure_flax_twin(gpu):
    pytest.importorskip("optax")
    rng = np.random.default_rng(1)
    x = jax.device_put(rng.standard_normal((64, 20, 4)).astype(np.float32), gpu)
    target = jax.device_put(np.asarray(x).sum(axis=(1, 2)).astype(np.float32) / 4, gpu)
    ours, flax = _Seq(True), _Seq(False)
    v0, v_ours = flax.init(jax.random.key(0), x), ours.init(jax.random.key(0), x)
    assert jax.tree.structure(v0) == jax.tree.structure(v_ours)  # the same variables
    twin, spread, gap = _beside_twin(
        "lstm", lambda net, v: _train_seq(net, v, x, target, 150), ours, flax, x
    )
    assert gap[0] < 1e-3 * max(1.0, twin[0])
    assert gap[-20:].max() <= max(spread[-20:].max(), 0.05 * twin[-20:].max())


def test_flax_attention_with_pycudnns_attention_fn_on_the_gpu(gpu):
    x = _rand(gpu, 4, 128, 256).astype(jnp.bfloat16)
    kw = dict(num_heads=4, qkv_features=256, dtype=jnp.bfloat16)
    m = fl.MultiHeadDotProductAttention(attention_fn=pl.dot_product_attention, **kw)
    f = fl.MultiHeadDotProductAttention(**kw)
    v = f.init(jax.random.key(0), x)
    mask = fl.make_causal_mask(jnp.ones((4, 128)))
    for msk in (None, mask):
        y = jax.jit(lambda v, x, msk=msk: m.apply(v, x, mask=msk))(v, x)
        ref = jax.jit(lambda v, x, msk=msk: f.apply(v, x, mask=msk))(v, x)
        _close(y.astype(jnp.float32), ref.astype(jnp.float32), 5e-2)


def test_nnx_attention_with_pycudnns_attention_fn_on_the_gpu(gpu):
    """NNX's MultiHeadAttention with pycudnn's attention_fn, jitted, against Flax's own: outputs
    with and without a causal mask, and the parameters' gradients."""
    x = _rand(gpu, 4, 128, 256).astype(jnp.bfloat16)
    kw = dict(num_heads=4, in_features=256, dtype=jnp.bfloat16, decode=False)
    m = fx.MultiHeadAttention(attention_fn=pl.dot_product_attention, rngs=fx.Rngs(0), **kw)
    f = fx.MultiHeadAttention(rngs=fx.Rngs(0), **kw)
    mask = fx.make_causal_mask(jnp.ones((4, 128)))
    for msk in (None, mask):
        y = fx.jit(lambda m, x, msk=msk: m(x, mask=msk))(m, x)
        ref = fx.jit(lambda f, x, msk=msk: f(x, mask=msk))(f, x)
        _close(y.astype(jnp.float32), ref.astype(jnp.float32), 5e-2)

    def loss(mod, x):
        return (mod(x, mask=mask).astype(jnp.float32) ** 2).mean()

    g = fx.jit(fx.grad(loss))(m, x)
    gr = fx.jit(fx.grad(loss))(f, x)
    jax.tree.map(
        lambda a, b: _close(a.astype(jnp.float32), b.astype(jnp.float32), 5e-2),
        fx.state(g),
        fx.state(gr),
    )


def test_recurrent_layers_equal_flaxs_on_the_gpu(gpu):
    """30 steps of float32 recurrence: XLA's products in Flax's cells run at JAX's default GPU
    precision (TF32 inputs), so the two sides part by a few 1e-4 (seen: 5.3e-4 of 0.66): 2e-3
    of max |Flax's|, about four times that."""
    x = _rand(gpu, 8, 30, 16)
    for ours, theirs in (
        (pl.GRU(32, return_carry=True), fl.RNN(fl.GRUCell(32), return_carry=True)),
        (pl.LSTM(32, return_carry=True), fl.RNN(fl.LSTMCell(32), return_carry=True)),
    ):
        v = theirs.init(jax.random.key(0), x)
        got = jax.jit(ours.apply)(v, x)
        ref = jax.jit(theirs.apply)(v, x)
        jax.tree.map(lambda a, b: _close(a, b, 2e-3), got, ref)
    m = px.LSTM(16, 32, rngs=fx.Rngs(0))
    f = fx.RNN(fx.LSTMCell(16, 32, rngs=fx.Rngs(0)))
    _close(fx.jit(lambda m, x: m(x))(m, x), f(x), 2e-3)


def test_nnx_gru_equals_flaxs_on_the_gpu(gpu):
    """NNX's GRU cell (gate kernels side by side, no recurrent bias) as one cuDNN call, against
    Flax's scanned cell (written when the session's GPU time had run out: first run pending)."""
    x = _rand(gpu, 8, 30, 16)
    m = px.GRU(16, 32, rngs=fx.Rngs(0), return_carry=True)
    f = fx.RNN(fx.GRUCell(16, 32, rngs=fx.Rngs(0)), return_carry=True)
    jax.tree.map(lambda a, b: _close(a, b, 2e-3), fx.jit(lambda m, x: m(x))(m, x), f(x))
