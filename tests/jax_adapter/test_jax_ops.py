"""``pycudnn.jax``'s operations on JAX's CPU platform: argument checks at trace time, abstract
evaluation, the lowering for CUDA (targets and attributes), and -- with each family's target
registered for the CPU platform with a float64 numpy twin in cuDNN's place
(``jax_op_references.twin``) -- the same calls run: values against JAX's own operations,
gradients through ``jax.custom_vjp``, vmap (folded or per example), shape-polymorphic export,
and the per-call path's bound launches (with a fake lean entry). cuDNN itself runs in
``test_jax_ops_gpu.py``."""

from __future__ import annotations

import re

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402
import jax_op_references as R  # noqa: E402
from jax import lax  # noqa: E402

import pycudnn.jax as pj  # noqa: E402
from pycudnn.highlevel import _call  # noqa: E402
from pycudnn.jax import _bound, _ops, _request  # noqa: E402

pytestmark = pytest.mark.jax
FAMILIES = ("activation", "softmax", "pool", "norm", "conv")
CPU = jax.devices("cpu")[0]


@pytest.fixture(scope="module", autouse=True)
def twins():
    """Each family's target on the CPU platform, computed by the numpy twin (once a process)."""
    R.register_twins(*FAMILIES)


def _rand(*shape, seed=0, dtype=np.float32):
    return jax.device_put(np.random.default_rng(seed).standard_normal(shape).astype(dtype), CPU)


def _lower_cuda(f, *args):
    return jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def _grads(f, t, *args):
    """The gradients of ``sum(f(*args) * t)`` w.r.t. every argument."""
    return jax.grad(lambda *a: (f(*a) * t).sum(), argnums=tuple(range(len(args))))(*args)


def _close(a, b, tol=1e-5):
    np.testing.assert_allclose(
        np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=tol, atol=tol
    )


# -- argument checks: clear errors at trace time, before any call ----------------------------------
X4 = jax.ShapeDtypeStruct((2, 3, 8, 8), jnp.float32)


@pytest.mark.parametrize(
    ("f", "error", "match"),
    [
        (lambda x: pj.activation(x, "gelu"), ValueError, r"mode='gelu'; expected one of"),
        (lambda x: pj.activation(x, "clipped_relu", 0), ValueError, r"coef=0.*expected > 0"),
        (lambda x: pj.activation(x, "elu", "1"), TypeError, r"coef='1'; expected a real number"),
        (lambda x: pj.activation(x.astype(jnp.int32)), TypeError, r"x has dtype int32"),
        (lambda x: pj.softmax(x, axis=4), ValueError, r"axis=4 is out of range"),
        (lambda x: pj.softmax(x, axis=(1, 2)), TypeError, r"axis=\(1, 2\); expected one int"),
        (lambda x: pj.max_pool(x, 2), TypeError, r"window=2; expected a tuple of 2 or 3 ints"),
        (lambda x: pj.max_pool(x, (2, 2), 1, 2), ValueError, r"padding=\(2, 2\) must be smaller"),
        (lambda x: pj.max_pool(x, (2, 2, 2)), ValueError, r"a 3-D window needs 5 dims"),
        (lambda x: pj.avg_pool(x, (9, 9)), ValueError, r"window \(9, 9\) is larger than"),
        (
            lambda x: pj.max_pool(x, (2, 2), 1, ((0, 1), (1,))),
            ValueError,
            r"padding=\(\(0, 1\), \(1,\)\); expected 2 \(lo, hi\) pairs, one per",
        ),
        (
            lambda x: pj.avg_pool(x, (2, 2), 1, ((0, 1), (0, 0)), count_include_pad=False),
            ValueError,
            r"count_include_pad=False; cuDNN excludes only symmetric padding",
        ),
        (
            lambda x: pj.max_pool(x.astype(jnp.int32), (2, 2), 1, ((0, 1), (0, 0))),
            TypeError,
            r"x has dtype int32",
        ),
        (lambda x: pj.max_pool(x, (2, 2), (0, 1)), ValueError, r"strides=\(0, 1\); expected"),
        (lambda x: pj.layer_norm(x, 7), ValueError, r"normalized_shape=\(7,\) must be trailing"),
        (lambda x: pj.layer_norm(x, (2, 3, 8, 8)), ValueError, r"at least one leading dim"),
        (lambda x: pj.layer_norm(x, 8, epsilon=0), ValueError, r"epsilon=0; expected > 0"),
        (lambda x: pj.layer_norm(x, 8, jnp.ones(7)), ValueError, r"gamma has shape \(7,\)"),
        (lambda x: pj.rms_norm(x, 8, jnp.ones(8, jnp.int32)), TypeError, r"gamma is int32"),
        (lambda x: pj.conv(x, jnp.ones((4, 2, 3, 3))), ValueError, r"x has 3 channels and w"),
        (lambda x: pj.conv(x, jnp.ones((4, 3, 3))), ValueError, r"expected 4 \(2-D\) or 5"),
        (
            lambda x: pj.conv(x, jnp.ones((4, 3, 3, 3)), padding=((1, -1), (1, 1))),
            ValueError,
            r"padding=\(\(1, -1\), \(1, 1\)\); expected 2 \(lo, hi\) pairs of ints >= 0",
        ),
        (
            lambda x: pj.conv(x, jnp.ones((4, 3, 3, 3)), padding=((1, 2),)),
            ValueError,
            r"padding=\(\(1, 2\),\); expected 2 \(lo, hi\) pairs, one per spatial dim",
        ),
        (
            lambda x: pj.conv(x, jnp.ones((4, 3, 3, 3)), padding=((1, 2.5), (1, 1))),
            TypeError,
            r"expected 2 \(lo, hi\) pairs of ints >= 0",
        ),
        (
            lambda x: pj.conv(x, jnp.ones((4, 3, 3, 3)), activation="gelu"),
            ValueError,
            r"activation='gelu'; expected None or one of \('relu', 'sigmoid', 'tanh'\)",
        ),
        (
            lambda x: pj.conv(x, jnp.ones((4, 3, 3, 3)), bias=jnp.ones(3)),
            ValueError,
            r"bias is float32\[3\]; expected float32\[4\]",
        ),
        (lambda x: pj.conv(x, jnp.ones((4, 3, 9, 9))), ValueError, r"dilated kernel .* larger"),
        (lambda x: pj.conv(x, jnp.ones((4, 3, 3, 3)), stride=0), ValueError, r"stride=0"),
        (lambda x: pj.conv(x, jnp.ones((4, 3, 3, 3), jnp.float16)), TypeError, r"one dtype"),
    ],
)
def test_arguments_are_checked_at_trace_time(f, error, match):
    with pytest.raises(error, match=match):
        jax.eval_shape(f, X4)


def test_norms_refuse_float64_naming_the_types():
    with jax.enable_x64(True):
        x = jax.ShapeDtypeStruct((4, 8), jnp.float64)
        with pytest.raises(TypeError, match=r"x has dtype float64; expected one of \('float16'"):
            jax.eval_shape(lambda x: pj.layer_norm(x, 8), x)


# -- abstract evaluation against JAX's own operations ----------------------------------------------
@pytest.mark.parametrize(
    ("stride", "padding", "dilation", "groups", "x_shape", "w_shape"),
    [
        (1, 0, 1, 1, (2, 3, 9, 9), (4, 3, 3, 3)),
        ((2, 1), (1, 2), (1, 2), 1, (2, 3, 9, 10), (4, 3, 3, 3)),
        (2, 1, 1, 3, (1, 6, 11, 7), (9, 2, 3, 3)),
        (1, 1, 1, 4, (2, 4, 5, 5), (4, 1, 3, 3)),  # depthwise
        ((1, 2, 2), 1, 1, 1, (1, 2, 5, 6, 7), (3, 2, 3, 3, 3)),  # 3-D
        (2, ((0, 1), (2, 0)), 1, 1, (2, 3, 8, 8), (4, 3, 3, 3)),  # asymmetric
        (2, "SAME", 1, 1, (2, 3, 8, 9), (4, 3, 3, 3)),  # SAME with a stride: asymmetric
        (1, "SAME", (1, 2), 1, (2, 3, 8, 9), (4, 3, 2, 2)),  # SAME, an even kernel
    ],
)
def test_conv_shapes_are_lax_conv_general_dilateds(
    stride, padding, dilation, groups, x_shape, w_shape
):
    nd = len(x_shape) - 2
    x, w = jax.ShapeDtypeStruct(x_shape, jnp.float32), jax.ShapeDtypeStruct(w_shape, jnp.float32)
    ours = jax.eval_shape(lambda x, w: pj.conv(x, w, stride, padding, dilation, groups), x, w)
    s = _request.ints(stride, nd, "s", "t", 1)
    d = _request.ints(dilation, nd, "d", "t", 1)
    theirs = jax.eval_shape(
        lambda x, w: lax.conv_general_dilated(
            x, w, s, _lax_pads(padding, nd), rhs_dilation=d, feature_group_count=groups
        ),
        x,
        w,
    )
    assert ours == theirs


def test_channels_last_shapes():
    x = jax.ShapeDtypeStruct((2, 9, 9, 6), jnp.float32)
    w = jax.ShapeDtypeStruct((4, 3, 3, 3), jnp.float32)  # (K, kh, kw, C / groups)
    y = jax.eval_shape(lambda x, w: pj.conv(x, w, 2, "SAME", groups=2, channels_last=True), x, w)
    assert y.shape == (2, 5, 5, 4)
    assert jax.eval_shape(lambda x: pj.max_pool(x, (3, 3), 2, 1, channels_last=True), x).shape == (
        2,
        5,
        5,
        6,
    )


# -- the lowering for CUDA: one target per family, one attribute that decodes to the request -------
def test_lowering_names_the_family_targets_and_carries_the_request_as_one_attribute():
    x = _rand(2, 3, 8, 8)
    w = _rand(4, 3, 3, 3, seed=1)
    b = _rand(4, seed=2)

    def f(x, w, b):
        y = pj.conv(x, w, 1, 1, bias=b, activation="relu")
        y = pj.max_pool(y, (2, 2))
        return pj.layer_norm(pj.softmax(pj.sigmoid(y), axis=1), 4).sum()

    text = _lower_cuda(jax.grad(f, argnums=(0, 1, 2)), x, w, b)
    targets = set(re.findall(r"custom_call @(\w+)", text))
    assert targets == {f"pycudnn_jax_{family}" for family in FAMILIES}
    ops = re.findall(r'mhlo.backend_config = \{op = "((?:[^"\\]|\\.)*)"\}', text)
    kinds = {type(_request.decode(o.replace('\\"', '"').encode())).__name__ for o in ops}
    assert kinds == {
        "ConvForward",
        "ConvBackwardData",
        "ConvBackwardFilter",
        "Pool",
        "PoolGrad",
        "Activation",
        "ActivationGrad",
        "Softmax",
        "SoftmaxGrad",
        "Norm",
        "NormGrad",
    }


def test_a_request_text_round_trips_and_a_foreign_one_is_refused():
    from pycudnn.jax._conv import ConvForward

    r = ConvForward((1, 2), (0, 1), (1, 1), 1, True, "time_once", None, "relu", True, False)
    assert _request.decode(r.encode().encode()) == r
    with pytest.raises(ValueError, match=r"is no request of this pycudnn .*known: \["):
        _request.decode(b"('NoSuchRequest', ())")


# -- the calls on the CPU platform, with the numpy twins -------------------------------------------
ACTS = [
    ("relu", 0.0, jax.nn.relu),
    ("sigmoid", 0.0, jax.nn.sigmoid),
    ("tanh", 0.0, jnp.tanh),
    ("elu", 0.7, lambda x: jax.nn.elu(x, 0.7)),
    ("swish", 1.0, jax.nn.silu),
    ("clipped_relu", 6.0, jax.nn.relu6),
    ("identity", 0.0, lambda x: x),
]


@pytest.mark.parametrize(("mode", "coef", "theirs"), ACTS, ids=[a[0] for a in ACTS])
def test_activation_value_and_gradient_are_jaxs(mode, coef, theirs):
    x = _rand(3, 4, 5) * 4

    def loss(f):
        return lambda x: (f(x) * jnp.cos(x)).sum()

    ours = jax.jit(lambda x: pj.activation(x, mode, coef))
    _close(ours(x), theirs(x))
    _close(jax.grad(loss(lambda x: pj.activation(x, mode, coef)))(x), jax.grad(loss(theirs))(x))


def test_named_activations_and_a_scalar():
    x = _rand(7)
    for ours, theirs in (
        (pj.relu, jax.nn.relu),
        (pj.silu, jax.nn.silu),
        (pj.relu6, jax.nn.relu6),
        (pj.elu, jax.nn.elu),
        (pj.sigmoid, jax.nn.sigmoid),
        (pj.tanh, jnp.tanh),
    ):
        _close(ours(x), theirs(x))
    assert pj.relu(jnp.float32(-2.0)).shape == ()


@pytest.mark.parametrize("axis", [0, 1, -1, 2])
@pytest.mark.parametrize(
    ("ours", "theirs"), [(pj.softmax, jax.nn.softmax), (pj.log_softmax, jax.nn.log_softmax)]
)
def test_softmax_over_any_axis_is_jaxs(ours, theirs, axis):
    x = _rand(3, 4, 5) * 3
    w = _rand(3, 4, 5, seed=1)
    _close(ours(x, axis=axis), theirs(x, axis=axis))
    _close(
        jax.grad(lambda x: (ours(x, axis=axis) * w).sum())(x),
        jax.grad(lambda x: (theirs(x, axis=axis) * w).sum())(x),
    )


def _reduce_window_pool(x, mode, window, strides, padding, channels_last=False):
    pairs = [tuple(p) if isinstance(p, tuple) else (p, p) for p in padding]
    if channels_last:
        dims, st = (1, *window, 1), (1, *strides, 1)
        pads = [(0, 0), *pairs, (0, 0)]
    else:
        dims, st = (1, 1, *window), (1, 1, *strides)
        pads = [(0, 0), (0, 0), *pairs]
    if mode == "max":
        return lax.reduce_window(x, -jnp.inf, lax.max, dims, st, pads)
    s = lax.reduce_window(x, 0.0, lax.add, dims, st, pads)
    if mode == "inc":
        return s / np.prod(window)
    ones = jnp.ones(x.shape[1:-1] if channels_last else x.shape[2:], x.dtype)
    count = lax.reduce_window(ones, 0.0, lax.add, window, strides, pairs)
    return s / (count[..., None] if channels_last else count)


@pytest.mark.parametrize(
    ("mode", "window", "strides", "padding", "shape", "cl"),
    [
        ("max", (2, 2), (2, 2), (0, 0), (2, 3, 8, 8), False),
        ("max", (3, 3), (2, 2), (1, 1), (2, 3, 9, 7), False),
        ("inc", (3, 3), (1, 2), (1, 1), (1, 2, 6, 7), False),
        ("exc", (3, 2), (2, 1), (1, 1), (1, 2, 6, 7), False),
        ("max", (2, 2, 2), (1, 2, 2), (1, 0, 1), (1, 2, 4, 5, 6), False),
        ("max", (3, 3), (2, 2), (1, 1), (2, 9, 7, 3), True),
        ("exc", (3, 3), (2, 2), (1, 1), (2, 9, 7, 3), True),
        ("max", (3, 3), (2, 2), ((0, 1), (1, 2)), (2, 3, 8, 8), False),  # asymmetric
        ("inc", (3, 3), (2, 1), ((0, 1), (2, 1)), (2, 8, 7, 3), True),
    ],
)
def test_pooling_value_and_gradient_are_reduce_windows(mode, window, strides, padding, shape, cl):
    x = _rand(*shape)

    def ours(x):
        if mode == "max":
            return pj.max_pool(x, window, strides, padding, channels_last=cl)
        inc = mode == "inc"
        return pj.avg_pool(x, window, strides, padding, count_include_pad=inc, channels_last=cl)

    def theirs(x):
        return _reduce_window_pool(x, mode, window, strides, padding, cl)

    _close(ours(x), theirs(x))
    w = _rand(*ours(x).shape, seed=3)
    _close(jax.grad(lambda x: (ours(x) * w).sum())(x), jax.grad(lambda x: (theirs(x) * w).sum())(x))


def _layer_norm(x, ns, gamma, beta, eps=1e-5):
    axes = tuple(range(x.ndim - len(ns), x.ndim))
    m = x.mean(axes, keepdims=True)
    v = ((x - m) ** 2).mean(axes, keepdims=True)
    return (x - m) / jnp.sqrt(v + eps) * gamma + beta


def _rms_norm(x, ns, gamma, eps=1e-6):
    axes = tuple(range(x.ndim - len(ns), x.ndim))
    return x / jnp.sqrt((x * x).mean(axes, keepdims=True) + eps) * gamma


@pytest.mark.parametrize(("shape", "ns"), [((4, 8), (8,)), ((2, 3, 4, 5), (4, 5))])
def test_layer_and_rms_norm_values_and_gradients_are_jnps(shape, ns):
    x, g, b = _rand(*shape) * 2 + 1, _rand(*ns, seed=1), _rand(*ns, seed=2)
    w = _rand(*shape, seed=3)
    cases = [
        (lambda x, g, b: pj.layer_norm(x, ns, g, b), lambda x, g, b: _layer_norm(x, ns, g, b)),
        (
            lambda x, g, b: pj.rms_norm(x, ns, g) + 0 * b,
            lambda x, g, b: _rms_norm(x, ns, g) + 0 * b,
        ),
    ]
    for ours, theirs in cases:
        _close(ours(x, g, b), theirs(x, g, b), 1e-4)
        for a, c in zip(_grads(ours, w, x, g, b), _grads(theirs, w, x, g, b), strict=True):
            _close(a, c, 1e-4)
    # no gamma/beta: ones and zeros
    _close(pj.layer_norm(x, ns), _layer_norm(x, ns, 1.0, 0.0), 1e-4)


def _lax_conv(x, w, stride, padding, dilation, groups, cl=False):
    nd = w.ndim - 2
    dn = ("NHWC", "OHWI", "NHWC") if cl and nd == 2 else None
    return lax.conv_general_dilated(
        x,
        w,
        stride,
        _lax_pads(padding, nd),
        rhs_dilation=dilation,
        feature_group_count=groups,
        dimension_numbers=dn,
        precision=lax.Precision.HIGHEST,
    )


def _lax_pads(padding, nd):
    """``lax.conv_general_dilated``'s padding for pycudnn's: a string as it is, pairs as they
    are, ints as symmetric pairs."""
    if isinstance(padding, str):
        return padding
    if isinstance(padding, int):
        padding = (padding,) * nd
    return [tuple(p) if isinstance(p, tuple) else (p, p) for p in padding]


CONVS = [
    ((1, 1), (1, 1), (1, 1), 1, (2, 3, 7, 7), (4, 3, 3, 3), False),
    ((2, 2), ((0, 1), (2, 1)), (1, 1), 1, (2, 3, 8, 8), (4, 3, 3, 3), False),  # asymmetric
    ((2, 2), "SAME", (1, 1), 1, (2, 8, 8, 3), (5, 3, 3, 3), True),  # Flax's stride-2 SAME
    ((2, 1), (1, 2), (1, 2), 2, (2, 4, 9, 9), (6, 2, 3, 3), False),
    ((1, 1), (1, 1), (1, 1), 4, (1, 4, 6, 6), (4, 1, 3, 3), False),
    ((2, 2), (1, 1), (1, 1), 1, (2, 7, 7, 3), (5, 3, 3, 3), True),
    ((1, 1, 1), (1, 0, 1), (1, 1, 1), 1, (1, 2, 4, 5, 5), (3, 2, 3, 3, 3), False),
]


@pytest.mark.parametrize(("s", "p", "d", "g", "xs", "ws", "cl"), CONVS)
@pytest.mark.parametrize("epilogue", [False, True])
def test_conv_value_and_gradients_are_lax_convs(s, p, d, g, xs, ws, cl, epilogue):
    x, w = _rand(*xs), _rand(*ws, seed=1)
    k = ws[0]
    b = _rand(k, seed=2)
    y_shape = jax.eval_shape(lambda x, w: _lax_conv(x, w, s, p, d, g, cl), x, w).shape
    z = _rand(*y_shape, seed=4)
    cshape = (1, *(1,) * (len(xs) - 2), k) if cl else (1, k, *(1,) * (len(xs) - 2))

    def ours(x, w, b, z):
        if not epilogue:
            return pj.conv(x, w, s, p, d, g, channels_last=cl)
        return pj.conv(x, w, s, p, d, g, bias=b, activation="relu", residual=z, channels_last=cl)

    def theirs(x, w, b, z):
        y = _lax_conv(x, w, s, p, d, g, cl)
        return jax.nn.relu(y + z + b.reshape(cshape)) if epilogue else y

    args = (x, w, b, z)
    _close(jax.jit(ours)(*args), theirs(*args), 1e-4)
    t = _rand(*y_shape, seed=5)
    for a, c in zip(_grads(ours, t, *args), _grads(theirs, t, *args), strict=True):
        _close(a, c, 1e-4)


# -- vmap: folded into the operands' leading dim, or one call per example --------------------------
def _calls_and_loops(f, *args):
    text = _lower_cuda(f, *args)
    return len(re.findall(r"custom_call @pycudnn_jax", text)), text.count("stablehlo.while")


def test_vmap_folds_a_batch_of_batch_operands_into_one_call():
    x = _rand(5, 2, 3, 6, 6)
    w = _rand(4, 3, 3, 3, seed=1)

    def f(x):
        y = pj.conv(x, w, 1, 1, bias=jnp.ones(4), activation="relu")
        return pj.rms_norm(pj.softmax(pj.max_pool(y, (2, 2)), axis=1), 3)

    assert _calls_and_loops(jax.vmap(f), x) == (4, 0)
    got = jax.vmap(f)(x)
    for i in range(x.shape[0]):
        _close(got[i], f(x[i]), 1e-5)
    # nested vmap folds twice
    _close(jax.vmap(jax.vmap(pj.relu))(x), jax.nn.relu(x))
    assert _calls_and_loops(jax.vmap(jax.vmap(pj.relu)), x) == (1, 0)


def test_vmap_of_a_batched_parameter_or_a_parameter_gradient_runs_per_example():
    x = _rand(3, 2, 3, 6, 6)
    ws = _rand(3, 4, 3, 3, 3, seed=1)
    f = lambda x, w: pj.conv(x, w, 1, 1)  # noqa: E731
    assert _calls_and_loops(jax.vmap(f), x, ws) == (1, 1)
    got = jax.vmap(f)(x, ws)
    for i in range(3):
        _close(got[i], f(x[i], ws[i]), 1e-5)
    # per-example weight gradients: the forward folds, the filter gradient loops (the data
    # gradient is not asked for: XLA drops it)
    w = ws[0]
    per = jax.vmap(jax.grad(lambda x, w: (f(x, w) ** 2).sum(), argnums=1), in_axes=(0, None))
    assert _calls_and_loops(per, x, w) == (2, 1)
    got = per(x, w)
    for i in range(3):
        (expected,) = _grads(lambda w, xi=x[i]: f(xi, w), 2 * f(x[i], w), w)
        _close(got[i], expected, 1e-4)
    g = jnp.ones(6)
    per_ln = jax.vmap(
        jax.grad(lambda x, g: (pj.layer_norm(x, 6, g) ** 3).sum(), argnums=(0, 1)),
        in_axes=(0, None),
    )
    dx, dg = per_ln(x, g)
    for i in range(3):
        ex, eg = jax.grad(lambda x, g: (_layer_norm(x, (6,), g, 0.0) ** 3).sum(), argnums=(0, 1))(
            x[i], g
        )
        _close(dx[i], ex, 1e-4)
        _close(dg[i], eg, 1e-4)


# -- shape polymorphism ----------------------------------------------------------------------------
def test_a_shape_polymorphic_export_runs_for_several_batch_and_image_sizes():
    export = pytest.importorskip("jax.export")
    checks = [export.DisabledSafetyCheck.custom_call(_ops.target_name(f)) for f in FAMILIES]
    w = _rand(6, 4, 3, 3, seed=1)

    def model(x):
        y = pj.avg_pool(pj.conv(x, w, 1, 1, bias=jnp.ones(6), activation="relu"), (2, 2))
        return pj.log_softmax(pj.rms_norm(y, y.shape[-1:]), axis=1)  # a symbolic dim normalized

    shape = export.symbolic_shape("b, 4, h, h")
    arg = jax.ShapeDtypeStruct(shape, jnp.float32)
    for f in (model, jax.grad(lambda x: model(x).sum())):
        exp = export.export(jax.jit(f), platforms=["cpu", "cuda"], disabled_checks=checks)(arg)
        for b, h in ((1, 8), (3, 6)):
            x = _rand(b, 4, h, h, seed=b)
            _close(exp.call(x), f(x), 1e-5)


# -- gradients checked numerically (check_grads) ---------------------------------------------------
def test_check_grads_on_small_cases():
    from jax.test_util import check_grads

    x = _rand(2, 3, 5, 5) * 2
    w = _rand(4, 3, 3, 3, seed=1)
    for f, args in [
        (lambda x: pj.tanh(x), (x,)),
        (lambda x: pj.log_softmax(x, axis=1), (x,)),
        (lambda x: pj.avg_pool(x, (2, 2), 1, 1), (x,)),
        (lambda x, w: pj.conv(x, w, 1, 1, activation="sigmoid"), (x, w)),
        (lambda x: pj.layer_norm(x, 5), (x,)),
    ]:
        check_grads(f, args, order=1, modes=("rev",), atol=2e-2, rtol=2e-2, eps=1e-2)


# -- the per-call path: bound launches -------------------------------------------------------------
class _Handle:
    device = 0

    def __init__(self):
        self.streams = []

    def set_stream(self, stream):
        self.streams.append(stream)


class _Entry:
    """A lean entry whose launch computes a ReLU on host pointers (as the high level's entries
    launch on device pointers)."""

    lean = True

    def __init__(self, shape, fail=False):
        self.handle, self.shape, self.fail = _Handle(), shape, fail
        self.spans = (0, 0)
        self.launches = []

    def launch(self, ptrs):
        self.launches.append(ptrs)
        if self.fail:
            raise RuntimeError("stale")
        n = int(np.prod(self.shape))
        x, y = (
            np.ctypeslib.as_array((np.ctypeslib.ctypes.c_float * n).from_address(p)) for p in ptrs
        )
        np.maximum(x, 0, out=y)


def test_a_call_site_binds_its_lean_entry_once_and_then_launches_it(monkeypatch):
    from pycudnn.jax._activation import Activation

    slow, entries = [], []

    def run(request, call, stream):
        slow.append(type(request).__name__)
        R.twin(request, call, stream)
        entries.append(_Entry(call.args[0].shape, fail=len(entries) == 2))
        _call.local.last = entries[-1]  # what run_cached leaves for take_last_entry

    monkeypatch.setattr(_call, "one_device", True)
    exe = _bound.Executor(run, lambda call: 7)
    target = pj.register_handler("pycudnn_test_bound_relu", exe, platform="cpu")
    text = Activation("relu", 0.0).encode()

    def f(x):
        return pj.ffi_call(target, jax.ShapeDtypeStruct(x.shape, x.dtype))(x, op=text)

    g = jax.jit(f)
    before = _bound.bound_count()
    x = _rand(4, 5)
    for i in range(3):  # the first call runs the slow path and binds; the others launch
        _close(g(x * (i + 1)), np.maximum(np.asarray(x) * (i + 1), 0))
    assert slow == ["Activation"] and len(entries[0].launches) == 2
    assert entries[0].handle.streams == [7, 7]
    assert _bound.bound_count() == before + 1
    _close(g(_rand(2, 3)), np.maximum(np.asarray(_rand(2, 3)), 0))  # a new signature: slow again
    assert slow == ["Activation"] * 2 and _bound.bound_count() == before + 2
    # a bound entry whose launch fails is unbound, and the call takes the slow path
    y = _rand(3, 3)
    _close(g(y), np.maximum(np.asarray(y), 0))  # binds the failing entry (3rd)
    _close(g(y), np.maximum(np.asarray(y), 0))  # its launch fails: slow path, rebinds a good one
    assert slow == ["Activation"] * 4 and len(entries[2].launches) == 1
    _close(g(y), np.maximum(np.asarray(y), 0))
    assert slow == ["Activation"] * 4 and len(entries[3].launches) == 1


def test_an_entry_that_is_not_lean_is_never_bound(monkeypatch):
    from pycudnn.jax._activation import Activation

    slow = []

    def run(request, call, stream):
        slow.append(1)
        R.twin(request, call, stream)
        entry = _Entry(call.args[0].shape)
        entry.lean = False
        _call.local.last = entry

    monkeypatch.setattr(_call, "one_device", True)
    target = pj.register_handler(
        "pycudnn_test_not_lean", _bound.Executor(run, lambda c: 0), platform="cpu"
    )
    text = Activation("relu", 0.0).encode()
    g = jax.jit(lambda x: pj.ffi_call(target, jax.ShapeDtypeStruct(x.shape, x.dtype))(x, op=text))
    x = _rand(6)
    for _ in range(3):
        _close(g(x), np.maximum(np.asarray(x), 0))
    assert len(slow) == 3


def test_a_call_without_its_one_string_attribute_fails_with_a_jax_error_saying_so():
    target = pj.register_handler(
        "pycudnn_test_no_op", _bound.Executor(R.twin, lambda c: 0), platform="cpu"
    )
    x = _rand(3)
    call = pj.ffi_call(target, jax.ShapeDtypeStruct(x.shape, x.dtype))
    with pytest.raises(Exception, match=r"TypeError: .*expected one string attribute, got the "
                       r"attributes \[\]"):  # fmt: skip
        jax.block_until_ready(call(x))
    with pytest.raises(Exception, match=r"got the attributes \['op', 'other'\]"):
        jax.block_until_ready(call(x, op="x", other=np.int32(1)))
    with pytest.raises(Exception, match=r"got the attributes \['op'\]"):
        jax.block_until_ready(call(x, op=np.int32(1)))
    with pytest.raises(Exception, match=r"ValueError: pycudnn.jax: the op attribute b'x' is no"):
        jax.block_until_ready(call(x, op="x"))


def test_the_call_frame_is_not_read_after_the_call_returned():
    kept = []
    target = pj.register_handler("pycudnn_test_kept_call", kept.append, platform="cpu")
    x = _rand(3)
    jax.block_until_ready(pj.ffi_call(target, jax.ShapeDtypeStruct(x.shape, x.dtype))(x))
    with pytest.raises(RuntimeError, match="read after the call returned"):
        kept[0].args  # noqa: B018
    assert "returned" in repr(kept[0])


def test_a_process_exits_with_calls_still_in_flight():
    """A computation still running at exit calls its handler, which needs the interpreter's
    lock, while JAX's exit handler tears the backends down holding it: pycudnn.jax's own exit
    handler waits for the live arrays' work and for the handlers to go quiet first (the process
    hung before)."""
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    code = (
        "import sys, jax\n"
        f"sys.path.insert(0, {str(here)!r})\n"
        "import jax_op_references as R\n"
        "import pycudnn.jax as pj\n"
        "from pycudnn.jax import _ops\n"
        "_ops.register_twin('conv', R.twin)\n"
        "x = jax.random.normal(jax.random.key(0), (8, 3, 32, 32))\n"
        "w = jax.random.normal(jax.random.key(1), (16, 3, 3, 3))\n"
        "f = jax.jit(lambda x: pj.conv(x, w, 1, 1).sum())\n"
        "kept = f(x)\n"
        "f(x * 2)  # dropped at once\n"
        "print('dispatched')\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert r.returncode == 0 and "dispatched" in r.stdout, r.stderr[-2000:]
