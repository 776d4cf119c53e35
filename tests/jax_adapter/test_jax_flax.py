"""``pycudnn.jax.linen`` / ``pycudnn.jax.nnx`` on JAX's CPU platform: the layers are Flax's own
classes (same variables, names, shapes and initial values), their calls equal Flax's own
layers' (the pycudnn operations' targets registered with the float64 numpy twins of
``jax_op_references``), gradients included, and what cuDNN does not take is refused naming
the field. cuDNN itself runs in ``test_jax_flax_gpu.py``."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("flax")

import jax.numpy as jnp  # noqa: E402
import jax_attention_references as RA  # noqa: E402
import jax_op_references as R  # noqa: E402
import jax_op_references_more as RM  # noqa: E402
import jax_rnn_references as RR  # noqa: E402
from flax import linen as fl  # noqa: E402
from flax import nnx as fx  # noqa: E402

from pycudnn.jax import _rnn  # noqa: E402
from pycudnn.jax import linen as pl  # noqa: E402
from pycudnn.jax import nnx as px  # noqa: E402

pytestmark = pytest.mark.jax
CPU = jax.devices("cpu")[0]


@pytest.fixture(scope="module", autouse=True)
def twins():
    R.register_twins("conv", "norm", "pool")
    R.register_twins("batchnorm", twin=RM.twin)
    R.register_twins("rnn", twin=RR.twin)
    R.register_twins(*RA.FAMILIES, twin=RA.twin)
    size = _rnn.reserve_size  # cuDNN's reserve size needs a GPU: a fixed one for the twin
    _rnn.reserve_size = lambda request, shape, dtype: 96 + shape[0] * shape[1]
    with jax.default_device(CPU):
        yield
    _rnn.reserve_size = size


def _rand(*shape, seed=0):
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return jax.device_put(a, CPU)


def _close(a, b, tol=1e-4):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


LINEN = [
    (lambda: pl.Conv(5, (3, 3)), lambda: fl.Conv(5, (3, 3)), (2, 8, 8, 3)),
    (lambda: pl.Conv(6, (3, 3), strides=2, padding=1, feature_group_count=3),
     lambda: fl.Conv(6, (3, 3), strides=2, padding=1, feature_group_count=3), (2, 9, 9, 3)),
    (lambda: pl.Conv(4, (1, 3, 3), padding="VALID", use_bias=False),
     lambda: fl.Conv(4, (1, 3, 3), padding="VALID", use_bias=False), (1, 2, 6, 6, 2)),
    (lambda: pl.Conv(4, (3, 3), kernel_dilation=2, padding=2),
     lambda: fl.Conv(4, (3, 3), kernel_dilation=2, padding=2), (3, 2, 7, 7, 2)),  # 2 batch dims
    (lambda: pl.Conv(4, (3, 3), strides=2), lambda: fl.Conv(4, (3, 3), strides=2),
     (2, 8, 8, 3)),  # Flax's default 'SAME' with a stride: (0, 1) in each dim
    (lambda: pl.Conv(4, (2, 2)), lambda: fl.Conv(4, (2, 2)), (2, 7, 8, 3)),  # an even kernel
    (lambda: pl.Conv(4, (3, 3), padding=((0, 2), (1, 0))),
     lambda: fl.Conv(4, (3, 3), padding=((0, 2), (1, 0))), (2, 6, 7, 3)),
    (lambda: pl.LayerNorm(), lambda: fl.LayerNorm(), (4, 6, 10)),
    (lambda: pl.LayerNorm(use_bias=False, epsilon=1e-3),
     lambda: fl.LayerNorm(use_bias=False, epsilon=1e-3), (4, 10)),
    (lambda: pl.RMSNorm(), lambda: fl.RMSNorm(), (4, 6, 10)),
]  # fmt: skip


@pytest.mark.parametrize(("ours", "theirs", "shape"), LINEN)
def test_linen_layers_are_flaxs_with_flaxs_results(ours, theirs, shape):
    x = _rand(*shape)
    m, f = ours(), theirs()
    assert isinstance(m, type(f))
    v = m.init(jax.random.key(3), x)
    ref_v = f.init(jax.random.key(3), x)
    assert jax.tree.structure(v) == jax.tree.structure(ref_v)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), v, ref_v)
    _close(jax.jit(m.apply)(v, x), f.apply(v, x))
    t = _rand(*f.apply(v, x).shape, seed=1)
    g = jax.grad(lambda v, x: (m.apply(v, x) * t).sum(), argnums=(0, 1))(v, x)
    ref = jax.grad(lambda v, x: (f.apply(v, x) * t).sum(), argnums=(0, 1))(v, x)
    jax.tree.map(_close, g, ref)


def test_linen_conv_fuses_activation_and_residual():
    x, z = _rand(2, 8, 8, 3), _rand(2, 8, 8, 4, seed=2)
    m = pl.Conv(4, (3, 3), activation="relu")
    v = m.init(jax.random.key(0), x, z)
    ref = jax.nn.relu(fl.Conv(4, (3, 3)).apply(v, x) + z)
    _close(m.apply(v, x, z), ref)


def test_linen_pools_equal_flaxs():
    x = _rand(2, 8, 8, 3)
    _close(pl.max_pool(x, (2, 2), (2, 2)), fl.max_pool(x, (2, 2), (2, 2)))
    _close(pl.max_pool(x, (3, 3)), fl.max_pool(x, (3, 3)))  # Flax's stride default, 1
    pad = ((1, 1), (1, 1))
    _close(pl.avg_pool(x, (3, 3), (1, 1), pad), fl.avg_pool(x, (3, 3), (1, 1), pad))
    _close(
        pl.avg_pool(x, (3, 3), (2, 2), pad, count_include_pad=False),
        fl.avg_pool(x, (3, 3), (2, 2), pad, count_include_pad=False),
    )


def test_bfloat16_inputs_promote_as_flax_does():
    x = _rand(2, 6, 6, 3).astype(jnp.bfloat16)
    m = pl.Conv(4, (3, 3))
    v = m.init(jax.random.key(0), x)
    assert m.apply(v, x).dtype == fl.Conv(4, (3, 3)).apply(v, x).dtype == jnp.float32
    m16 = pl.Conv(4, (3, 3), dtype=jnp.bfloat16)
    assert m16.apply(v, x).dtype == jnp.bfloat16


@pytest.mark.parametrize(
    ("layer", "shape", "error", "match"),
    [
        (pl.Conv(4, (3, 3), use_bias=1), (2, 8, 8, 3), TypeError, r"use_bias=1; expected True"),
        (pl.Conv(4, 3), (2, 8, 3), ValueError, r"2-D or 3-D"),
        (pl.Conv(4, (3, 3), input_dilation=2), (2, 8, 8, 3), NotImplementedError,
         r"input_dilation=2"),
        (pl.Conv(4, (3, 3), padding="CIRCULAR"), (2, 8, 8, 3), NotImplementedError,
         r"padding='CIRCULAR'"),
        (pl.Conv(4, (3, 3), promote_dtype=lambda *a, **k: a), (2, 8, 8, 3), ValueError,
         r"promote_dtype="),
        (pl.LayerNorm(reduction_axes=(1, 2)), (2, 4, 4), NotImplementedError,
         r"reduction_axes=\(1, 2\)"),
        (pl.RMSNorm(use_scale="yes"), (2, 4), TypeError, r"use_scale='yes'"),
    ],
)  # fmt: skip
def test_what_cudnn_does_not_take_is_refused_naming_the_field(layer, shape, error, match):
    with pytest.raises(error, match=match):
        layer.init(jax.random.key(0), _rand(*shape))


@pytest.mark.parametrize(
    ("window", "strides", "padding"),
    [
        ((3, 3), (2, 2), "SAME"),  # a ResNet's pool in Flax: (0, 1) in each dim at 8x8
        ((2, 2), None, "SAME"),
        ((3, 3), (2, 1), ((1, 2), (0, 1))),
        ((2, 2), (2, 2), ((0, 3), (0, 0))),  # windows wholly in the padding: -inf / 0
    ],
)
def test_asymmetric_pool_padding_is_flaxs(window, strides, padding):
    x = _rand(2, 8, 9, 3)
    for ours, theirs in ((pl.max_pool, fl.max_pool), (pl.avg_pool, fl.avg_pool)):
        _close(jax.jit(ours, static_argnums=(1, 2, 3))(x, window, strides, padding),
               theirs(x, window, strides, padding))  # fmt: skip
        t = _rand(*theirs(x, window, strides, padding).shape, seed=1)
        g = jax.grad(lambda x, f=ours, t=t: (f(x, window, strides, padding) * t).sum())(x)
        ref = jax.grad(lambda x, f=theirs, t=t: (f(x, window, strides, padding) * t).sum())(x)
        _close(g, ref)


def test_pool_padding_refused_naming_it():
    with pytest.raises(NotImplementedError, match=r"padding='CIRCULAR'"):
        pl.max_pool(_rand(2, 8, 8, 3), (2, 2), padding="CIRCULAR")
    with pytest.raises(ValueError, match=r"count_include_pad=False; cuDNN excludes only"):
        pl.avg_pool(_rand(2, 8, 8, 3), (2, 2), padding=((0, 1), (0, 1)), count_include_pad=False)


NNX = [
    (lambda r: px.Conv(3, 5, (3, 3), rngs=r), lambda r: fx.Conv(3, 5, (3, 3), rngs=r),
     (2, 8, 8, 3)),
    (lambda r: px.Conv(4, 4, (3, 3), strides=(2, 1), feature_group_count=2, rngs=r),
     lambda r: fx.Conv(4, 4, (3, 3), strides=(2, 1), feature_group_count=2, rngs=r),
     (2, 9, 9, 4)),
    (lambda r: px.LayerNorm(10, rngs=r), lambda r: fx.LayerNorm(10, rngs=r), (4, 6, 10)),
    (lambda r: px.RMSNorm(10, rngs=r), lambda r: fx.RMSNorm(10, rngs=r), (4, 10)),
]  # fmt: skip


@pytest.mark.parametrize(("ours", "theirs", "shape"), NNX)
def test_nnx_layers_are_flaxs_with_flaxs_results(ours, theirs, shape):
    x = _rand(*shape)
    m, f = ours(fx.Rngs(5)), theirs(fx.Rngs(5))
    assert isinstance(m, type(f))
    s, ref_s = fx.state(m, fx.Param), fx.state(f, fx.Param)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), s, ref_s)
    _close(fx.jit(lambda m, x: m(x))(m, x), f(x))
    t = _rand(*f(x).shape, seed=1)
    g = fx.grad(lambda m: (m(x) * t).sum())(m)
    ref = fx.grad(lambda m: (m(x) * t).sum())(f)
    jax.tree.map(_close, fx.state(g), fx.state(ref))


def test_nnx_conv_activation_keyword_and_errors():
    x = _rand(2, 6, 6, 3)
    m = px.Conv(3, 4, (3, 3), activation="tanh", rngs=fx.Rngs(0))
    f = fx.Conv(3, 4, (3, 3), rngs=fx.Rngs(0))
    _close(m(x), jnp.tanh(f(x)))
    with pytest.raises(NotImplementedError, match=r"input_dilation"):
        px.Conv(3, 4, (3, 3), input_dilation=2, rngs=fx.Rngs(0))(x)
    with pytest.raises(TypeError, match=r"use_bias=0"):
        bad = px.Conv(3, 4, (3, 3), rngs=fx.Rngs(0))
        bad.use_bias = 0
        bad(x)


@pytest.mark.parametrize("shape", [(4, 6, 6, 5), (16, 5), (2, 3, 4, 4, 5)])
def test_linen_batch_norm_trains_and_evaluates_as_flaxs(shape):
    x = _rand(*shape) * 2 + 1
    m, f = pl.BatchNorm(), fl.BatchNorm()
    v = m.init(jax.random.key(0), x, False)
    ref_v = f.init(jax.random.key(0), x, False)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), v, ref_v)
    y, upd = jax.jit(lambda v, x: m.apply(v, x, False, mutable=["batch_stats"]))(v, x)
    ref, ref_upd = f.apply(v, x, False, mutable=["batch_stats"])
    _close(y, ref)
    jax.tree.map(_close, upd, ref_upd)
    v2 = {"params": v["params"], **upd}
    _close(m.apply(v2, x, use_running_average=True), f.apply(v2, x, use_running_average=True))
    t = _rand(*shape, seed=3)

    def loss(mod):
        def f(p, x):
            return (mod.apply({**v, "params": p}, x, False, mutable=["batch_stats"])[0] * t).sum()

        return f

    g = jax.grad(loss(m), argnums=(0, 1))(v["params"], x)
    gref = jax.grad(loss(f), argnums=(0, 1))(v["params"], x)
    jax.tree.map(_close, g, gref)


def test_nnx_batch_norm_trains_and_evaluates_as_flaxs():
    x = _rand(8, 4, 4, 6) * 3 - 1
    m = px.BatchNorm(6, rngs=fx.Rngs(0))
    f = fx.BatchNorm(6, rngs=fx.Rngs(0))
    for _ in range(2):
        _close(m(x), f(x))
    _close(m.mean[...], f.mean[...])
    _close(m.var[...], f.var[...])
    _close(m(x, use_running_average=True), f(x, use_running_average=True))


def test_batch_norm_refusals_name_the_field():
    x = _rand(4, 5, 6)
    with pytest.raises(NotImplementedError, match=r"axis=1"):
        pl.BatchNorm(use_running_average=False, axis=1).init(jax.random.key(0), x)
    with pytest.raises(TypeError, match=r"use_running_average=1"):
        pl.BatchNorm(use_running_average=1).init(jax.random.key(0), x)


@pytest.mark.parametrize("time_major", [False, True])
def test_linen_lstm_is_flaxs_rnn_of_an_lstm_cell(time_major):
    shape = (7, 3, 5) if time_major else (3, 7, 5)
    x = _rand(*shape)
    m = pl.LSTM(6, time_major=time_major, return_carry=True)
    f = fl.RNN(fl.LSTMCell(6), time_major=time_major, return_carry=True)
    v = m.init(jax.random.key(2), x)
    ref_v = f.init(jax.random.key(2), x)
    assert jax.tree.structure(v) == jax.tree.structure(ref_v)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), v, ref_v)
    (c, h), y = jax.jit(m.apply)(v, x)
    (rc, rh), ry = f.apply(v, x)
    _close(y, ry)
    _close(c, rc)
    _close(h, rh)
    t = _rand(*ry.shape, seed=4)
    g = jax.grad(lambda v, x: (m.apply(v, x)[1] * t).sum(), argnums=(0, 1))(v, x)
    gref = jax.grad(lambda v, x: (f.apply(v, x)[1] * t).sum(), argnums=(0, 1))(v, x)
    jax.tree.map(_close, g, gref)


def test_flax_attention_modules_take_pycudnns_attention_fn():
    x = _rand(2, 8, 32).astype(jnp.bfloat16)
    kw = dict(num_heads=4, qkv_features=32, dtype=jnp.bfloat16)
    m = fl.MultiHeadDotProductAttention(attention_fn=pl.dot_product_attention, **kw)
    f = fl.MultiHeadDotProductAttention(**kw)
    v = f.init(jax.random.key(0), x)
    mask = fl.make_causal_mask(jnp.ones((2, 8)))
    for msk in (None, mask):
        _close(m.apply(v, x, mask=msk).astype(jnp.float32),
               f.apply(v, x, mask=msk).astype(jnp.float32), 3e-2)  # fmt: skip
    with pytest.raises(NotImplementedError, match=r"dropout_rate=0.1"):
        fl.MultiHeadDotProductAttention(
            attention_fn=pl.dot_product_attention, dropout_rate=0.1, **kw
        ).apply(v, x, deterministic=False, rngs={"dropout": jax.random.key(1)})


@pytest.mark.parametrize(
    ("ours", "cell", "carry"),
    [
        (lambda: px.LSTM, lambda: fx.LSTMCell, lambda: (_rand(3, 6, seed=5), _rand(3, 6, seed=6))),
        (lambda: px.GRU, lambda: fx.GRUCell, lambda: _rand(3, 6, seed=5)),
    ],
    ids=["lstm", "gru"],
)
def test_nnx_recurrent_layers_are_flaxs_rnn_of_their_cells(ours, cell, carry):
    """The same cell and ``Param`` s as Flax's ``nnx.RNN`` over it; outputs, final carry (and
    from a given initial carry) and gradients equal. NNX's GRU cell keeps its gates' kernels
    side by side (``dense_i`` with a bias, ``dense_h`` without): split per gate they are
    cuDNN's GRU with zero recurrent biases."""
    x = _rand(3, 7, 5)
    m = ours()(5, 6, rngs=fx.Rngs(1), return_carry=True)
    f = fx.RNN(cell()(5, 6, rngs=fx.Rngs(1)), return_carry=True)
    assert isinstance(m, fx.RNN)
    s, ref_s = fx.state(m, fx.Param), fx.state(f, fx.Param)
    assert jax.tree.structure(s) == jax.tree.structure(ref_s)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), s, ref_s)
    jax.tree.map(_close, fx.jit(lambda m, x: m(x))(m, x), f(x))
    c0 = carry()
    jax.tree.map(_close, m(x, initial_carry=c0), f(x, initial_carry=c0))
    t = _rand(3, 7, 6, seed=4)
    g = fx.grad(lambda m: (m(x)[1] * t).sum())(m)
    ref = fx.grad(lambda m: (m(x)[1] * t).sum())(f)
    jax.tree.map(_close, fx.state(g), fx.state(ref))


def test_nnx_attention_takes_pycudnns_attention_fn():
    x = _rand(2, 8, 32).astype(jnp.bfloat16)
    kw = dict(num_heads=4, in_features=32, dtype=jnp.bfloat16, decode=False)
    m = fx.MultiHeadAttention(attention_fn=pl.dot_product_attention, rngs=fx.Rngs(0), **kw)
    f = fx.MultiHeadAttention(rngs=fx.Rngs(0), **kw)
    _close(m(x).astype(jnp.float32), f(x).astype(jnp.float32), 3e-2)
    mask = fx.make_causal_mask(jnp.ones((2, 8)))
    _close(m(x, mask=mask).astype(jnp.float32), f(x, mask=mask).astype(jnp.float32), 3e-2)
    # a keyword of Flax's attention_fn taken by name, not by position (it once shadowed value)
    q = _rand(2, 8, 4, 8).astype(jnp.bfloat16)
    _close(pl.dot_product_attention(q, q, q, is_causal=False, module=None).astype(jnp.float32),
           fl.dot_product_attention(q, q, q).astype(jnp.float32), 3e-2)  # fmt: skip


def test_linen_gru_is_flaxs_rnn_of_a_gru_cell():
    x = _rand(3, 6, 4)
    m = pl.GRU(5, return_carry=True)
    f = fl.RNN(fl.GRUCell(5), return_carry=True)
    v = m.init(jax.random.key(3), x)
    ref_v = f.init(jax.random.key(3), x)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), v, ref_v)
    (h, y), (rh, ry) = jax.jit(m.apply)(v, x), f.apply(v, x)
    _close(y, ry)
    _close(h, rh)
    t = _rand(*ry.shape, seed=5)
    g = jax.grad(lambda v: (m.apply(v, x)[1] * t).sum())(v)
    jax.tree.map(_close, g, jax.grad(lambda v: (f.apply(v, x)[1] * t).sum())(v))
    c0 = _rand(3, 5, seed=6)
    _close(m.apply(v, x, initial_carry=c0)[1], f.apply(v, x, initial_carry=c0)[1])
