"""``pycudnn.jax``'s batch norm, dropout, LRN and matmul on JAX's CPU platform, as
``test_jax_ops.py`` tests the other families: argument checks at trace time, the lowering for
CUDA, and -- each family's target registered for the CPU platform with a float64 numpy twin in
cuDNN's place (``jax_op_references_more.twin``) -- the same calls run: values against float64
references and pure-JAX formulations, gradients through ``jax.custom_vjp``, vmap and
``check_grads``. cuDNN itself runs in ``test_jax_ops_more_gpu.py``."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402
import jax_op_references  # noqa: E402
import jax_op_references_more as R  # noqa: E402
from jax import lax  # noqa: E402
from test_jax_ops import _calls_and_loops, _close, _grads, _lower_cuda, _rand  # noqa: E402

import pycudnn  # noqa: E402
import pycudnn.jax as pj  # noqa: E402
from pycudnn.jax import _ops, _request  # noqa: E402

pytestmark = pytest.mark.jax
FAMILIES = ("batchnorm", "dropout", "lrn", "matmul")


@pytest.fixture(scope="module", autouse=True)
def twins():
    """Each family's target on the CPU platform, computed by the numpy twin (once a process)."""
    jax_op_references.register_twins(*FAMILIES, twin=R.twin)


@pytest.fixture
def tf32():
    """float32 matmuls allowed (cuDNN computes them in TF32; the twin in float64)."""
    with pycudnn.config.override(allow_tf32=True):
        yield


# -- argument checks: clear errors at trace time, before any call ----------------------------------
X4 = jax.ShapeDtypeStruct((2, 3, 8, 8), jnp.float32)
P3 = jnp.ones(3)
KEY = jax.random.key(0)


@pytest.mark.parametrize(
    ("f", "error", "match"),
    [
        (lambda x: pj.batch_norm(x, P3, P3, training=1), TypeError, r"training=1; expected a b"),
        (lambda x: pj.batch_norm(x, P3, P3, training=True, mode="x"), ValueError, r"mode='x'"),
        (
            lambda x: pj.batch_norm(x, jnp.ones(4), P3, training=True),
            ValueError,
            r"gamma is float32\[4\]; expected float32\[3\]",
        ),
        (
            lambda x: pj.batch_norm(x, P3.astype(jnp.float16), P3, training=True),
            TypeError,
            r"gamma is float16\[3\]; expected float32\[3\]",
        ),
        (
            lambda x: pj.batch_norm(x, P3, P3, P3, training=True),
            ValueError,
            r"only running_mean was given; expected both or neither",
        ),
        (
            lambda x: pj.batch_norm(x, P3, P3, training=False),
            ValueError,
            r"training=False .* pass running_mean and running_var",
        ),
        (
            lambda x: pj.batch_norm(x, P3, P3, P3, jnp.ones(2), training=True),
            ValueError,
            r"running_var is float32\[2\]",
        ),
        (
            lambda x: pj.batch_norm(x, P3, P3, P3, P3, training=True, momentum=2),
            ValueError,
            r"momentum=2.0; expected a number in \[0, 1\]",
        ),
        (
            lambda x: pj.batch_norm(x, P3, P3, training=True, epsilon=-1),
            ValueError,
            r"epsilon=-1; expected >= 0",
        ),
        (
            lambda x: pj.batch_norm(x, P3, P3, training=True, channels_last=1),
            TypeError,
            r"channels_last=1; expected a bool",
        ),
        (
            lambda x: pj.batch_norm(
                x, P3, P3, training=True, mode="per-activation", channels_last=True
            ),
            ValueError,
            r"per-activation normalization takes channels-first",
        ),
        (
            lambda x: pj.batch_norm(x[:1, :, :1, :1], P3, P3, P3, P3, training=True),
            ValueError,
            r"m = 1 element",
        ),
        (lambda x: pj.dropout(x, 1.0, KEY), ValueError, r"rate=1.0; expected a number in \[0, 1\)"),
        (lambda x: pj.dropout(x, "a", KEY), TypeError, r"rate='a'; expected a real number"),
        (lambda x: pj.dropout(x, 0.5, KEY, deterministic=0), TypeError, r"deterministic=0"),
        (lambda x: pj.dropout(x, 0.5, jnp.ones(2)), TypeError, r"key is float32\[2\]; expected"),
        (lambda x: pj.dropout(x, 0.5, 7), TypeError, r"key=7; expected a JAX key"),
        (
            lambda x: pj.dropout(x.astype(jnp.bfloat16), 0.5, KEY),
            TypeError,
            r"x has dtype bfloat16; expected one of \('float16', 'float32', 'float64'\)",
        ),
        (lambda x: pj.lrn(x, 17), ValueError, r"size=17; expected 1 to 16 channels"),
        (lambda x: pj.lrn(x, 2.0), TypeError, r"size=2.0; expected an int"),
        (lambda x: pj.lrn(x, 5, beta=0.001), ValueError, r"beta=0.001; expected >= 0.01"),
        (lambda x: pj.lrn(x, 5, k=0), ValueError, r"k=0.0; expected >= 1e-05"),
        (lambda x: pj.lrn(x, alpha=float("nan")), ValueError, r"alpha=nan; expected a finite"),
        (lambda x: pj.lrn(x[0, 0, 0]), ValueError, r"x has shape \(8,\); expected 2 to 5 dims"),
        (
            lambda x: pj.lrn(x.astype(jnp.bfloat16)),
            TypeError,
            r"x has dtype bfloat16; expected one of",
        ),
        (
            lambda x: pj.matmul(x.astype(jnp.float16), jnp.ones((7, 2), jnp.float16)),
            ValueError,
            r"a's last dim \(8\) must equal b's second to last \(7\)",
        ),
        (
            lambda x: pj.matmul(x.astype(jnp.float16), jnp.ones((8, 2), jnp.bfloat16)),
            TypeError,
            r"b is bfloat16, a float16; expected one dtype",
        ),
        (
            lambda x: pj.matmul(x, jnp.ones((8, 2))),
            TypeError,
            r"float32, whose cuDNN matmul engines compute in TF32",
        ),
        (
            lambda x: pj.matmul(x[0, 0, 0].astype(jnp.float16), jnp.ones((8, 2), jnp.float16)),
            ValueError,
            r"expected at least 2 dims each",
        ),
        (
            lambda x: pj.matmul(x.astype(jnp.float16), jnp.ones((4, 1, 8, 2), jnp.float16)),
            ValueError,
            r"batch dim 0 of a .* does not broadcast \(2 vs 4\)",
        ),
        (
            lambda x: pj.matmul(x[:1].astype(jnp.float16), jnp.ones((2, 1, 8, 2), jnp.float16)),
            ValueError,
            r"each broadcast against the other",
        ),
        (
            lambda x: pj.matmul(
                x.astype(jnp.float16), jnp.ones((8, 2), jnp.float16), bias=jnp.ones(3, jnp.float16)
            ),
            ValueError,
            r"bias is float16\[3\]; expected float16\[2\]",
        ),
        (
            lambda x: pj.matmul(
                x.astype(jnp.float16), jnp.ones((8, 2), jnp.float16), activation="erf"
            ),
            ValueError,
            r"activation='erf' is not one of",
        ),
        (
            lambda x: pj.matmul(
                x.astype(jnp.float16),
                jnp.ones((8, 2), jnp.float16),
                activation=("clipped_relu", 6.0),
            ),
            ValueError,
            r"needs a bias",
        ),
    ],
)
def test_arguments_are_checked_at_trace_time(f, error, match):
    with pytest.raises(error, match=match):
        jax.eval_shape(f, X4)


def test_lowering_names_the_family_targets_and_the_request_decodes():
    x = _rand(2, 3, 4, 4)
    h = x.astype(jnp.float16)

    def f(x, h):
        y, _, _ = pj.batch_norm(x, jnp.ones(3), jnp.zeros(3), training=True)
        return y, pj.dropout(x, 0.25, KEY), pj.lrn(x, 3), pj.matmul(h, h)

    text = _lower_cuda(f, x, h)
    for family in FAMILIES:
        assert f"custom_call @{_ops.target_name(family)}" in text, family
    assert _request.decode(repr(("Lrn", (3, 1e-4, 0.75, 2.0, False))).encode()) == pj._lrn.Lrn(
        3, 1e-4, 0.75, 2.0, False
    )


# -- batch norm ------------------------------------------------------------------------------------
def _jnp_batch_norm(x, gamma, beta, axes, eps):
    """The training formula in jnp (biased variance), parameters broadcast over *axes*."""
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps) * jnp.expand_dims(gamma, axes) + jnp.expand_dims(
        beta, axes
    )


BNS = [  # shape, mode, channels_last, the reduced axes
    ((4, 3, 5, 6), "spatial", False, (0, 2, 3)),
    ((4, 5, 6, 3), "spatial", True, (0, 1, 2)),
    ((6, 3), "spatial", False, (0,)),
    ((3, 3, 4, 2, 5), "spatial", False, (0, 2, 3, 4)),
    ((5, 3, 4), "per-activation", False, (0,)),
]


@pytest.mark.parametrize(("shape", "mode", "cl", "axes"), BNS)
def test_batch_norm_training_values_running_averages_and_gradients(shape, mode, cl, axes):
    c = shape[-1] if cl else shape[1]
    ps = (c,) if mode == "spatial" else shape[1:]
    x = _rand(*shape) * 2 + 1
    gamma, beta = _rand(*ps, seed=1), _rand(*ps, seed=2)
    rm, rv = _rand(*ps, seed=3), jnp.abs(_rand(*ps, seed=4)) + 0.5
    eps, mom = 1e-3, 0.2

    def ours(x, g, b, rm, rv):
        return pj.batch_norm(
            x, g, b, rm, rv, training=True, momentum=mom, epsilon=eps, mode=mode, channels_last=cl
        )

    y, nm, nv = jax.jit(ours)(x, gamma, beta, rm, rv)
    _close(y, _jnp_batch_norm(x, gamma, beta, axes, eps), 1e-4)
    xf = np.asarray(x, np.float64)
    xr = np.moveaxis(xf, -1, 1) if cl else xf
    _, _, ref = R.batch_norm_train(mode == "spatial", eps, xr, gamma, beta)
    _close(y, np.moveaxis(ref, 1, -1) if cl else ref, 1e-4)
    # PyTorch's running averages: momentum, and the unbiased batch variance
    m = int(np.prod([shape[a] for a in axes]))
    _close(nm, (1 - mom) * np.asarray(rm) + mom * xf.mean(axis=axes), 1e-5)
    _close(nv, (1 - mom) * np.asarray(rv) + mom * xf.var(axis=axes) * m / (m - 1), 1e-4)
    assert nm.dtype == nv.dtype == jnp.float32
    t = _rand(*shape, seed=5)
    got = _grads(lambda x, g, b: ours(x, g, b, rm, rv)[0], t, x, gamma, beta)
    want = _grads(lambda x, g, b: _jnp_batch_norm(x, g, b, axes, eps), t, x, gamma, beta)
    for a, b in zip(got, want, strict=True):
        _close(a, b, 1e-4)
    # the running averages' own gradient: linear in the old ones, none through the statistics
    drm = jax.grad(lambda rm: ours(x, gamma, beta, rm, rv)[1].sum())(rm)
    _close(drm, np.full(ps, 1 - mom), 1e-6)
    dx = jax.grad(lambda x: ours(x, gamma, beta, rm, rv)[2].sum())(x)
    _close(dx, np.zeros(shape))


def test_batch_norm_training_without_running_averages_returns_none():
    x = _rand(4, 3, 5)
    y, nm, nv = pj.batch_norm(x, jnp.ones(3), jnp.zeros(3), training=True)
    assert nm is None and nv is None
    _close(y, _jnp_batch_norm(x, jnp.ones(3), jnp.zeros(3), (0, 2), 1e-5), 1e-4)


@pytest.mark.parametrize(("shape", "mode", "cl", "axes"), BNS)
def test_batch_norm_inference_values_and_gradients(shape, mode, cl, axes):
    c = shape[-1] if cl else shape[1]
    ps = (c,) if mode == "spatial" else shape[1:]
    x = _rand(*shape)
    gamma, beta = _rand(*ps, seed=1), _rand(*ps, seed=2)
    rm, rv = _rand(*ps, seed=3), jnp.abs(_rand(*ps, seed=4)) + 0.5
    eps = 1e-3

    def ours(x, g, b, rm, rv):
        return pj.batch_norm(
            x, g, b, rm, rv, training=False, epsilon=eps, mode=mode, channels_last=cl
        )[0]

    def theirs(x, g, b, rm, rv):
        e = lambda p: jnp.expand_dims(p, axes)  # noqa: E731
        return (x - e(rm)) / jnp.sqrt(e(rv) + eps) * e(g) + e(b)

    args = (x, gamma, beta, rm, rv)
    y, rm2, rv2 = jax.jit(lambda *a: pj.batch_norm(*a, training=False, epsilon=eps, mode=mode,
                                                    channels_last=cl))(*args)  # fmt: skip
    _close(y, theirs(*args), 1e-5)
    assert rm2 is not None and np.array_equal(rm2, rm) and np.array_equal(rv2, rv)
    t = _rand(*shape, seed=5)
    for a, b in zip(_grads(ours, t, *args), _grads(theirs, t, *args), strict=True):
        _close(a, b, 1e-4)


def test_batch_norm_in_float64_and_half_types():
    x = _rand(4, 3, 5, 5)
    g, b = _rand(3, seed=1), _rand(3, seed=2)
    for dt in (jnp.float16, jnp.bfloat16):
        y, _, _ = pj.batch_norm(x.astype(dt), g, b, training=True)
        assert y.dtype == dt
        _close(y, _jnp_batch_norm(x, g, b, (0, 2, 3), 1e-5), 3e-2)
    with jax.enable_x64(True):
        x64, g64, b64 = (jnp.asarray(np.asarray(a), jnp.float64) for a in (x, g, b))
        y, nm, nv = pj.batch_norm(x64, g64, b64, jnp.zeros(3), jnp.ones(3), training=True)
        assert nv.dtype == jnp.float64
        assert y.dtype == nm.dtype == jnp.float64
        _close(y, _jnp_batch_norm(x64, g64, b64, (0, 2, 3), 1e-5), 1e-12)
        with pytest.raises(TypeError, match=r"gamma is float32\[3\]; expected float64\[3\]"):
            pj.batch_norm(x64, g, b64, training=True)


def test_batch_norm_vmap_inference_folds_and_training_runs_per_example():
    x = _rand(3, 4, 2, 5)
    g, b, rm, rv = jnp.ones(2), jnp.zeros(2), _rand(2, seed=1), jnp.ones(2)

    def infer(x):
        return pj.batch_norm(x, g, b, rm, rv, training=False)[0]

    assert _calls_and_loops(jax.vmap(infer), x) == (1, 0)
    _close(jax.vmap(infer)(x), infer(x.reshape(12, 2, 5)).reshape(x.shape))

    def train(x):
        return pj.batch_norm(x, g, b, training=True)[0]

    assert _calls_and_loops(jax.vmap(train), x) == (1, 1)
    got = jax.vmap(train)(x)
    for i in range(3):  # each example's own statistics
        _close(got[i], train(x[i]), 1e-5)


# -- dropout ---------------------------------------------------------------------------------------
def test_dropout_same_key_same_mask_other_keys_differ_and_the_seed_varies_at_run_time():
    x = _rand(8, 16, 32) + 3.0  # no zeros: a zero in y is a dropped element
    f = jax.jit(lambda x, k: pj.dropout(x, 0.3, k))
    k1, k2 = jax.random.key(1), jax.random.key(2)
    y1, y1b, y2 = f(x, k1), f(x, k1), f(x, k2)
    assert f._cache_size() == 1  # one trace: the key reaches the call at run time
    np.testing.assert_array_equal(y1, y1b)
    assert not np.array_equal(y1 == 0, y2 == 0)
    keep = np.asarray(y1) != 0
    assert abs(keep.mean() - 0.7) < 0.02
    _close(np.asarray(y1)[keep], (np.asarray(x) / np.float32(0.7))[keep], 1e-6)
    # a legacy uint32[2] key works too, and gives the seed of its bits
    y3 = f(x, jax.random.PRNGKey(1))
    assert y3.shape == x.shape
    bits = jax.random.bits(jax.random.key(1), (2,), jnp.uint32)
    assert pj._dropout.seed_of(bits) == int(bits[0]) | int(bits[1]) << 32


def test_dropout_gradient_is_the_mask_times_the_scale():
    x = _rand(4, 50) + 3.0
    t = _rand(4, 50, seed=1)

    def loss(x):
        return (pj.dropout(x, 0.4, KEY) * t).sum()

    y = pj.dropout(x, 0.4, KEY)
    dx = jax.jit(jax.grad(loss))(x)
    _close(dx, np.where(np.asarray(y) != 0, np.asarray(t) / np.float32(0.6), 0), 1e-6)


def test_dropout_deterministic_and_rate_zero_return_x_and_float64_and_half_run():
    x = _rand(3, 5)
    assert pj.dropout(x, 0.5, KEY, deterministic=True) is x
    assert pj.dropout(x, 0.0, KEY) is x
    xb = x.astype(jnp.bfloat16)  # cuDNN's dropout has no bfloat16, and is not called here
    assert pj.dropout(xb, 0.5, KEY, deterministic=True) is xb
    y = pj.dropout(x.astype(jnp.float16), 0.5, KEY)
    assert y.dtype == jnp.float16
    with jax.enable_x64(True):
        y = pj.dropout(jnp.asarray(np.asarray(x), jnp.float64), 0.5, KEY)
        assert y.dtype == jnp.float64


def test_dropout_under_vmap_runs_per_example():
    x = _rand(3, 4, 6) + 3.0
    keys = jax.random.split(KEY, 3)
    got = jax.vmap(lambda x, k: pj.dropout(x, 0.5, k))(x, keys)
    for i in range(3):
        np.testing.assert_array_equal(got[i], pj.dropout(x[i], 0.5, keys[i]))
    same = jax.vmap(lambda x: pj.dropout(x, 0.5, KEY))(x)  # one key: one mask per example
    np.testing.assert_array_equal(np.asarray(same[0]) == 0, np.asarray(same[1]) == 0)


# -- LRN -------------------------------------------------------------------------------------------
def _jnp_lrn(x, size, alpha, beta, k, cl=False):
    """cuDNN's LRN in jnp (a zero-padded window sum over the channel axis)."""
    axis = x.ndim - 1 if cl else 1
    dims = [1] * x.ndim
    dims[axis] = size
    pads = [(0, 0)] * x.ndim
    pads[axis] = ((size - 1) // 2, size // 2)
    s = lax.reduce_window(x * x, 0.0, lax.add, dims, (1,) * x.ndim, pads)
    return x / (k + alpha / size * s) ** beta


LRNS = [
    ((2, 7, 4, 5), 5, 1e-2, 0.75, 2.0, False),
    ((2, 6, 3), 4, 0.5, 0.6, 1.0, False),  # even size: cuDNN's window
    ((3, 9), 3, 1.0, 1.2, 1.5, False),
    ((2, 4, 5, 7), 3, 0.3, 0.75, 1.0, True),
    ((1, 5, 2, 3, 4), 16, 0.2, 0.5, 1.0, False),
]


@pytest.mark.parametrize(("shape", "size", "alpha", "beta", "k", "cl"), LRNS)
def test_lrn_values_and_gradient(shape, size, alpha, beta, k, cl):
    x = _rand(*shape) * 2
    ours = lambda x: pj.lrn(x, size, alpha, beta, k, channels_last=cl)  # noqa: E731
    theirs = lambda x: _jnp_lrn(x, size, alpha, beta, k, cl)  # noqa: E731
    y = jax.jit(ours)(x)
    _close(y, theirs(x), 1e-5)
    xf = np.asarray(x, np.float64)
    ref = R.lrn(size, alpha, beta, k, np.moveaxis(xf, -1, 1) if cl else xf)
    _close(y, np.moveaxis(ref, 1, -1) if cl else ref, 1e-5)
    t = _rand(*shape, seed=1)
    _close(_grads(ours, t, x)[0], _grads(theirs, t, x)[0], 1e-4)


def test_lrn_odd_size_is_torchs_local_response_norm():
    """PyTorch's formula (avg_pool of x**2 over a zero-padded channel window of size, centred
    for odd size), written here in numpy."""
    x = np.asarray(_rand(2, 6, 3, 3), np.float64)
    size, alpha, beta, k = 5, 1e-1, 0.75, 1.0
    sq = np.pad(x**2, ((0, 0), (size // 2, (size - 1) // 2), (0, 0), (0, 0)))
    div = np.stack([sq[:, c : c + size].sum(1) for c in range(6)], 1) / size
    torch_like = x / (k + alpha * div) ** beta
    _close(pj.lrn(jnp.asarray(x, jnp.float32), size, alpha, beta, k), torch_like, 1e-5)


def test_lrn_vmap_folds():
    x = _rand(3, 2, 5, 4)
    assert _calls_and_loops(jax.vmap(pj.lrn), x) == (1, 0)
    _close(jax.vmap(pj.lrn)(x), pj.lrn(x.reshape(6, 5, 4)).reshape(x.shape))


# -- matmul ----------------------------------------------------------------------------------------
def _jnp_act(name, coef):
    return {
        None: lambda z: z,
        "relu": jax.nn.relu,
        "sigmoid": jax.nn.sigmoid,
        "tanh": jnp.tanh,
        "gelu": lambda z: jax.nn.gelu(z, approximate=False),
        "gelu_tanh": lambda z: jax.nn.gelu(z, approximate=True),
        "silu": jax.nn.silu,
        "elu": lambda z: jax.nn.elu(z, coef),
        "clipped_relu": lambda z: jnp.clip(z, 0, coef),
    }[name]


MATMULS = [  # a shape, b shape, bias, activation
    ((5, 7), (7, 3), False, None),
    ((2, 5, 7), (7, 3), True, "relu"),
    ((2, 4, 5, 7), (7, 3), True, "gelu"),
    ((2, 5, 7), (2, 7, 3), False, "sigmoid"),
    ((5, 7), (3, 7, 4), True, "tanh"),
    ((1, 5, 7), (3, 7, 4), False, ("elu", 0.5)),
    ((3, 5, 7), (1, 7, 4), True, "gelu_tanh"),
    ((2, 5, 7), (7, 3), True, ("clipped_relu", 0.5)),
    ((2, 5, 7), (7, 3), False, "silu"),
]


@pytest.mark.parametrize(("sa", "sb", "bias", "act"), MATMULS)
def test_matmul_values_and_gradients_are_jnp_matmuls(sa, sb, bias, act, tf32):
    a, b = _rand(*sa), _rand(*sb, seed=1)
    name, coef = act if isinstance(act, tuple) else (act, None)
    args = [a, b] + ([_rand(sb[-1], seed=2)] if bias else [])

    def ours(a, b, *c):
        return pj.matmul(a, b, bias=c[0] if c else None, activation=act)

    def theirs(a, b, *c):
        z = jnp.matmul(a, b, precision="highest")
        return _jnp_act(name, coef)(z + c[0] if c else z)

    y = jax.jit(ours)(*args)
    _close(y, theirs(*args), 1e-5)
    ref = R.matmul(a, b, args[2] if bias else None, name, coef if coef else 1.0)
    _close(y, ref, 1e-5)
    t = _rand(*y.shape, seed=3)
    for g, w in zip(_grads(ours, t, *args), _grads(theirs, t, *args), strict=True):
        assert g.shape == w.shape
        _close(g, w, 1e-4)


def test_matmul_in_half_types():
    a, b = _rand(3, 4, 8), _rand(8, 5, seed=1)
    for dt in (jnp.float16, jnp.bfloat16):
        y = pj.matmul(a.astype(dt), b.astype(dt), activation="relu")
        assert y.dtype == dt
        _close(y, jax.nn.relu(jnp.matmul(a.astype(dt), b.astype(dt))), 3e-2)
        ga, gb = jax.grad(lambda a, b: pj.matmul(a, b).astype(jnp.float32).sum(), (0, 1))(
            a.astype(dt), b.astype(dt)
        )
        assert ga.dtype == gb.dtype == dt and gb.shape == (8, 5)


def test_matmul_vmap_folds_a_batch_of_a_against_a_2d_b(tf32):
    a, w = _rand(4, 3, 5, 6), _rand(6, 2, seed=1)
    f = lambda a: pj.matmul(a, w)  # noqa: E731
    assert _calls_and_loops(jax.vmap(f), a) == (1, 0)
    _close(jax.vmap(f)(a), jnp.matmul(a, w, precision="highest"), 1e-5)
    bs = _rand(4, 6, 2, seed=2)
    assert _calls_and_loops(jax.vmap(pj.matmul), a, bs)[1] == 1  # b batched: per example
    _close(jax.vmap(pj.matmul)(a, bs), jnp.einsum("bmik,bkn->bmin", a, bs), 1e-5)


# -- gradients checked numerically (check_grads) ---------------------------------------------------
def test_check_grads_on_small_cases(tf32):
    from jax.test_util import check_grads

    x = _rand(3, 4, 3, 3) * 2
    g, b = _rand(4, seed=1), _rand(4, seed=2)
    rm, rv = _rand(4, seed=3), jnp.ones(4) * 1.5
    a, w = _rand(2, 3, 4, seed=4), _rand(4, 5, seed=5)
    for f, args in [
        (lambda x, g, b: pj.batch_norm(x, g, b, training=True)[0], (x, g, b)),
        (lambda x, g, b: pj.batch_norm(x, g, b, rm, rv, training=False)[0], (x, g, b)),
        (lambda x: pj.lrn(x, 3, 0.5, 0.75, 1.0), (x,)),
        (lambda a, w: pj.matmul(a, w, activation="gelu"), (a, w)),
    ]:
        check_grads(f, args, order=1, modes=("rev",), atol=2e-2, rtol=2e-2, eps=1e-2)


# -- shape polymorphism ----------------------------------------------------------------------------
def test_a_shape_polymorphic_export_runs_for_several_batch_and_image_sizes():
    export = pytest.importorskip("jax.export")
    checks = [
        export.DisabledSafetyCheck.custom_call(_ops.target_name(f))
        for f in ("batchnorm", "lrn", "matmul")
    ]
    g, b = _rand(4, seed=1), _rand(4, seed=2)
    w = _rand(6, 3, seed=3).astype(jnp.float16)

    def model(x):
        # a symbolic m in the running variance's m / (m - 1)
        y, _, rv = pj.batch_norm(x, g, b, jnp.zeros(4), jnp.ones(4), training=True)
        y = pj.lrn(y, 3, 0.5)
        return pj.matmul(y.astype(jnp.float16), w).astype(jnp.float32).sum() + rv.sum()

    arg = jax.ShapeDtypeStruct(export.symbolic_shape("b, 4, h, 6"), jnp.float32)
    for f in (model, jax.grad(model)):
        exp = export.export(jax.jit(f), platforms=["cpu", "cuda"], disabled_checks=checks)(arg)
        for n, h in ((2, 3), (3, 5)):
            x = _rand(n, 4, h, 6, seed=n)
            _close(exp.call(x), f(x), 1e-5)


def test_dropout_refuses_symbolic_dims_naming_why():
    export = pytest.importorskip("jax.export")
    arg = jax.ShapeDtypeStruct(export.symbolic_shape("b, 4"), jnp.float32)
    with pytest.raises(ValueError, match=r"dropout needs concrete dims"):
        export.export(jax.jit(lambda x: pj.dropout(x, 0.5, KEY)), platforms=["cuda"])(arg)
