"""``pycudnn.jax``'s operations on the GPU, under ``jax.jit``: each forward and gradient against
float64 numpy references (``jax_op_references``) and against JAX's own operations, each jitted
function run twice on fresh inputs with NaN-filled memory freed in between (the second run is
the bound launch, which must write every output element again), ``jax.test_util.check_grads``
on small cases, vmap, the bound launches counted, and the host cost of one call in a jitted loop
printed (``HOSTCOST`` lines, not asserted). Markers ``gpu`` and ``jax``."""

from __future__ import annotations

import statistics
import threading
import time

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402
import jax_gpu_support as S  # noqa: E402
import jax_op_references as R  # noqa: E402
from jax import lax  # noqa: E402
from jax_gpu_support import poison as _poison  # noqa: E402
from jax_gpu_support import rand as _rand  # noqa: E402

import pycudnn.jax as pj  # noqa: E402
from pycudnn.jax import _bound  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.jax]
gpu, float64 = S.gpu, S.float64  # the shared fixtures (float64: autouse)


TOL = {"float64": 1e-9, "float32": 2e-5, "float16": 2e-2, "bfloat16": 3e-2}


def _check(what, got, ref, dtype, scale=1.0):
    """*got* equals the float64 *ref* within the dtype's tolerance relative to the data's
    magnitude; the message says where and by how much."""
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, expected {ref.shape}"
    nan = int(np.isnan(got).sum() - np.isnan(ref).sum())
    assert nan == 0, f"{what}: {nan} NaN elements where the reference has numbers (unwritten?)"
    err = np.abs(got - ref)
    tol = TOL[str(dtype)] * scale * max(1.0, float(np.abs(ref).max(initial=0)))
    worst = float(err.max(initial=0))
    if worst > tol:
        at = np.unravel_index(int(err.argmax()), err.shape)
        raise AssertionError(
            f"{what} ({dtype}): max |error| {worst:.3g} > {tol:.3g} at {at}: got {got[at]!r}, "
            f"expected {ref[at]!r}; {int((err > tol).sum())} of {err.size} elements off"
        )


def _twice(gpu, f, make_args, check):
    """Run jitted *f* on two fresh argument sets (NaN-filled memory freed before each) and
    check each result."""
    g = jax.jit(f)
    for _ in range(2):
        args = make_args()
        shapes = jax.eval_shape(g, *args)
        _poison(gpu, *jax.tree_util.tree_leaves(shapes))
        check(args, jax.block_until_ready(g(*args)))


def _weights(gpu, shape, dtype):
    return _rand(gpu, shape, dtype)


def _vjp(f, t, *args):
    """The gradients of ``sum(f(*args) * t)`` w.r.t. every argument."""
    return jax.grad(lambda *a: (f(*a) * t).sum(), argnums=tuple(range(len(args))))(*args)


# -- activations -----------------------------------------------------------------------------------
ACTS = [
    ("relu", 0.0, jax.nn.relu),
    ("sigmoid", 0.0, jax.nn.sigmoid),
    ("tanh", 0.0, jnp.tanh),
    ("elu", 0.7, lambda x: jax.nn.elu(x, 0.7)),
    ("swish", 1.0, jax.nn.silu),
    ("clipped_relu", 6.0, jax.nn.relu6),
    ("identity", 0.0, lambda x: x),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("mode", "coef", "theirs"), ACTS, ids=[a[0] for a in ACTS])
def test_activation_and_its_gradient(gpu, mode, coef, theirs, dtype):
    shape = (2, 3, 9, 7)

    def f(x, t):
        return pj.activation(x, mode, coef), _vjp(lambda x: pj.activation(x, mode, coef), t, x)[0]

    def check(args, out):
        x, t = (np.asarray(a) for a in args)
        y, dx = out
        _check(f"activation {mode}", y, R.activation(mode, coef, x), dtype)
        ref_y = R.activation(mode, coef, x)
        _check(f"activation {mode} grad", dx, R.activation_grad(mode, coef, x, ref_y, t), dtype)
        _check(f"activation {mode} vs JAX", y, theirs(args[0]), dtype)

    _twice(gpu, f, lambda: (_rand(gpu, shape, dtype, 3), _rand(gpu, shape, dtype)), check)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_activation_in_half_types(gpu, dtype):
    x, t = _rand(gpu, (4, 33), dtype, 3), _rand(gpu, (4, 33), dtype)
    y = jax.jit(pj.silu)(x)
    _check("silu", y, R.activation("swish", 1.0, np.asarray(x, np.float64)), dtype)
    (dx,) = jax.jit(lambda x, t: _vjp(pj.tanh, t, x))(x, t)
    xf = np.asarray(x, np.float64)
    ref = R.activation_grad("tanh", 0, xf, np.tanh(xf), np.asarray(t, np.float64))
    _check("tanh grad", dx, ref, dtype, scale=2)


# -- softmax ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("axis", [-1, 1])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_and_its_gradient(gpu, log, axis, dtype):
    ours, theirs = (pj.log_softmax, jax.nn.log_softmax) if log else (pj.softmax, jax.nn.softmax)
    algo = "log" if log else "accurate"
    shape = (3, 5, 4, 6)

    def f(x, t):
        g = lambda x: ours(x, axis=axis)  # noqa: E731
        return g(x), _vjp(g, t, x)[0]

    def check(args, out):
        x, t = (np.moveaxis(np.asarray(a, np.float64), axis, 1) for a in args)
        ref = R.softmax(algo, x)
        _check(f"{algo} softmax", np.moveaxis(np.asarray(out[0]), axis, 1), ref, dtype)
        dx = np.moveaxis(np.asarray(out[1]), axis, 1)
        _check(f"{algo} softmax grad", dx, R.softmax_grad(algo, ref, t), dtype)
        _check(f"{algo} softmax vs JAX", out[0], theirs(args[0], axis=axis), dtype)

    _twice(gpu, f, lambda: (_rand(gpu, shape, dtype, 4), _rand(gpu, shape, dtype)), check)


# -- pooling ---------------------------------------------------------------------------------------
def _lax_pool(x, mode, window, strides, padding, cl):
    if cl:
        dims, st = (1, *window, 1), (1, *strides, 1)
        pads = [(0, 0), *((p, p) for p in padding), (0, 0)]
    else:
        dims, st = (1, 1, *window), (1, 1, *strides)
        pads = [(0, 0), (0, 0), *((p, p) for p in padding)]
    if mode == "max":
        return lax.reduce_window(x, -jnp.inf, lax.max, dims, st, pads)
    s = lax.reduce_window(x, 0.0, lax.add, dims, st, pads)
    if mode == "average_inc_pad":
        return s / np.prod(window)
    ones = jnp.ones(x.shape[1:-1] if cl else x.shape[2:], x.dtype)
    count = lax.reduce_window(ones, 0.0, lax.add, window, strides, [(p, p) for p in padding])
    return s / (count[..., None] if cl else count)


POOLS = [
    ("max", (2, 2), (2, 2), (0, 0), (2, 3, 8, 8), False),
    ("max", (3, 3), (2, 2), (1, 1), (2, 3, 9, 7), False),
    ("average_inc_pad", (3, 3), (1, 2), (1, 1), (2, 4, 6, 7), False),
    ("average_exc_pad", (3, 2), (2, 1), (1, 1), (1, 2, 6, 7), False),
    ("max", (2, 2, 2), (1, 2, 2), (1, 0, 1), (1, 2, 4, 5, 6), False),
    ("average_exc_pad", (2, 3, 3), (2, 1, 2), (1, 1, 1), (2, 3, 4, 5, 6), False),
    ("max", (3, 3), (2, 2), (1, 1), (2, 9, 7, 8), True),
    ("average_inc_pad", (3, 3), (2, 2), (1, 1), (2, 9, 7, 8), True),
]


@pytest.mark.parametrize(
    ("case", "dtype"),
    [(c, "float32") for c in POOLS] + [(POOLS[i], "float64") for i in (1, 3, 5, 6)],
)
def test_pooling_and_its_gradient(gpu, case, dtype):
    mode, window, strides, padding, shape, cl = case

    def ours(x):
        if mode == "max":
            return pj.max_pool(x, window, strides, padding, channels_last=cl)
        inc = mode == "average_inc_pad"
        return pj.avg_pool(x, window, strides, padding, count_include_pad=inc, channels_last=cl)

    out_shape = jax.eval_shape(ours, jax.ShapeDtypeStruct(shape, dtype)).shape

    def f(x, t):
        return ours(x), _vjp(ours, t, x)[0]

    def check(args, out):
        x, t = (np.asarray(a, np.float64) for a in args)
        if cl:
            x, t = R.to_first(x), R.to_first(t)
        geo = (mode, window, strides, padding)
        y, dx = (R.to_first(np.asarray(o)) if cl else o for o in out)
        _check(f"pool {geo}", y, R.pool(*geo, x), dtype)
        _check(f"pool {geo} grad", dx, R.pool_grad(*geo, x, t), dtype)
        _check(f"pool {geo} vs reduce_window", out[0], _lax_pool(args[0], *geo, cl), dtype)

    _twice(gpu, f, lambda: (_rand(gpu, shape, dtype), _rand(gpu, out_shape, dtype)), check)


# -- norms -----------------------------------------------------------------------------------------
def _jnp_layer_norm(x, ns, g, b, eps=1e-5):
    axes = tuple(range(x.ndim - len(ns), x.ndim))
    xf = x.astype(jnp.float32)
    m = xf.mean(axes, keepdims=True)
    v = ((xf - m) ** 2).mean(axes, keepdims=True)
    return ((xf - m) / jnp.sqrt(v + eps) * g + b).astype(x.dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize(("shape", "ns"), [((8, 64), (64,)), ((2, 3, 4, 40), (4, 40))])
@pytest.mark.parametrize("rms", [False, True])
def test_norms_and_their_gradients(gpu, rms, shape, ns, dtype):
    def ours(x, g, b):
        return pj.rms_norm(x, ns, g) if rms else pj.layer_norm(x, ns, g, b)

    def f(x, g, b, t):
        return ours(x, g, b), _vjp(ours, t, x, g, b)

    def check(args, out):
        x, g, b, t = (np.asarray(a, np.float64) for a in args)
        y, (dx, dg, db) = out
        nd = len(ns)
        if rms:
            ry, inv = R.rms_norm(nd, 1e-6, x, g)
            rdx, rdg = R.rms_norm_grad(nd, t, x, g, inv)
            rdb = np.zeros_like(b)
        else:
            ry, mean, inv = R.layer_norm(nd, 1e-5, x, g, b)
            rdx, rdg, rdb = R.layer_norm_grad(nd, t, x, g, mean, inv)
        name = "rms_norm" if rms else "layer_norm"
        scale = 5 if dtype == "float32" else 1  # float32 statistics over the rows
        _check(name, y, ry, dtype, scale)
        _check(f"{name} dx", dx, rdx, dtype, scale * 5)
        _check(f"{name} dgamma", dg, rdg, dtype, scale * 5)
        _check(f"{name} dbeta", db, rdb, dtype, scale * 5)
        if not rms:
            _check(
                f"{name} vs jnp", y, _jnp_layer_norm(args[0], ns, args[1], args[2]), dtype, scale
            )

    def make():
        return (
            _rand(gpu, shape, dtype, 2),
            _rand(gpu, ns, dtype),
            _rand(gpu, ns, dtype),
            _rand(gpu, shape, dtype),
        )

    _twice(gpu, f, make, check)


# -- convolution -----------------------------------------------------------------------------------
def _lax_conv(x, w, s, p, d, g, cl):
    nd = w.ndim - 2
    dn = None
    if cl:
        sp = "DHW"[3 - nd :]
        dn = (f"N{sp}C", f"O{sp}I", f"N{sp}C")
    return lax.conv_general_dilated(
        x,
        w,
        s,
        [(q, q) for q in p],
        rhs_dilation=d,
        feature_group_count=g,
        dimension_numbers=dn,
        precision=lax.Precision.HIGHEST,
    )


CONVS = [
    ((1, 1), (1, 1), (1, 1), 1, (2, 3, 9, 9), (4, 3, 3, 3), False),
    ((2, 1), (1, 2), (1, 2), 2, (2, 4, 9, 10), (6, 2, 3, 3), False),
    ((1, 1), (1, 1), (1, 1), 8, (2, 8, 7, 7), (8, 1, 3, 3), False),  # depthwise
    ((2, 2), (0, 0), (1, 1), 1, (3, 5, 8, 8), (4, 5, 1, 1), False),  # 1x1, strided
    ((1, 2), (1, 1), (1, 1), 1, (2, 9, 8, 7), (6, 3, 3, 7), True),  # channels last
    ((1, 1, 1), (1, 0, 1), (1, 1, 1), 1, (1, 2, 4, 5, 5), (3, 2, 3, 3, 3), False),  # 3-D
]
EPILOGUES = [("relu", True, True), ("sigmoid", True, False), ("tanh", False, True)]
# every geometry plain in both dtypes; the epilogues on a channels-first and a channels-last one
CONV_CASES = (
    [(c, None, dt) for c in CONVS for dt in ("float32", "float64")]
    + [(CONVS[i], e, "float32") for i in (1, 4) for e in EPILOGUES]
    + [(CONVS[0], EPILOGUES[0], "float64")]
)


def _epilogue_ref(y, b, z, act, cl):
    if z is not None:
        y = y + z
    if b is not None:
        y = y + (b.reshape(1, -1, *(1,) * (y.ndim - 2)))
    return R.activation(act, 0.0, y) if act else y


@pytest.mark.parametrize(("case", "epilogue", "dtype"), CONV_CASES)
def test_conv_and_its_gradients(gpu, case, epilogue, dtype):
    s, p, d, g, xs, ws, cl = case
    act, with_bias, with_z = epilogue or (None, False, False)
    k = ws[0]
    y_shape = jax.eval_shape(
        lambda x, w: _lax_conv(x, w, s, p, d, g, cl),
        jax.ShapeDtypeStruct(xs, dtype),
        jax.ShapeDtypeStruct(ws, dtype),
    ).shape

    def ours(x, w, b, z):
        return pj.conv(
            x, w, s, p, d, g, bias=b if with_bias else None, activation=act,
            residual=z if with_z else None, channels_last=cl,
        )  # fmt: skip

    def f(x, w, b, z, t):
        return ours(x, w, b, z), _vjp(ours, t, x, w, b, z)

    def check(args, out):
        x, w, b, z, t = (np.asarray(a, np.float64) for a in args)
        if cl:
            x, w, z, t = R.to_first(x), R.to_first(w), R.to_first(z), R.to_first(t)
        y, grads = out
        if cl:
            y = R.to_first(np.asarray(y))
            grads = [R.to_first(np.asarray(a)) if a.ndim > 1 else a for a in grads]
        dx, dw, db, dz = grads
        pre = R.conv(x, w, s, p, d, g)
        ref = _epilogue_ref(pre, b if with_bias else None, z if with_z else None, act, cl)
        tag = f"conv s={s} p={p} d={d} g={g} {xs} {ws} cl={cl} {epilogue}"
        sc = 10 * int(np.prod(ws[1:])) ** 0.5  # sums of that many products
        _check(tag, y, ref, dtype, sc)
        dpre = t if act is None else R.activation_grad(act, 0.0, ref, ref, t)
        _check(f"{tag} dx", dx, R.conv_grad_input(w, dpre, x.shape, s, p, d, g), dtype, sc)
        rdw = R.conv_grad_filter(x, dpre, w.shape, s, p, d, g)
        _check(f"{tag} dw", dw, rdw, dtype, 10 * (np.prod(y_shape) / k) ** 0.5)
        if with_bias:
            _check(f"{tag} dbias", db, dpre.sum(axis=(0, *range(2, dpre.ndim))), dtype, 10)
        if with_z:
            _check(f"{tag} dresidual", dz, dpre, dtype)
        theirs = _lax_conv(args[0], args[1], s, p, d, g, cl)
        if epilogue is None:
            _check(f"{tag} vs lax.conv_general_dilated", out[0], theirs, dtype, sc)

    def make():
        return (
            _rand(gpu, xs, dtype),
            _rand(gpu, ws, dtype, 0.5),
            _rand(gpu, (k,), dtype),
            _rand(gpu, y_shape, dtype),
            _rand(gpu, y_shape, dtype),
        )

    _twice(gpu, f, make, check)


# -- check_grads -----------------------------------------------------------------------------------
def test_check_grads_on_small_cases(gpu):
    from jax.test_util import check_grads

    x = _rand(gpu, (2, 3, 5, 5), "float64", 2)
    # max pooling's derivative jumps where two elements of a window tie: distinct spaced values
    spaced = np.random.default_rng(0).permutation(150).reshape(2, 3, 5, 5) * 0.05
    xs = jax.device_put(spaced, gpu)
    w = _rand(gpu, (4, 3, 3, 3), "float64")
    b = _rand(gpu, (4,), "float64")
    cases = {
        "elu": (lambda x: pj.elu(x, 0.5), (x,)),
        "log_softmax": (lambda x: pj.log_softmax(x, axis=1), (x,)),
        "max_pool": (lambda x: pj.max_pool(x, (2, 2), 1, 1), (xs,)),
        "avg_pool": (lambda x: pj.avg_pool(x, (3, 3), 2, 1, count_include_pad=False), (x,)),
        "conv": (lambda x, w, b: pj.conv(x, w, 2, 1, bias=b, activation="tanh"), (x, w, b)),
        "conv_groups": (lambda x, w: pj.conv(x, w[:3, :1], 1, 2, 2, groups=3), (x, w)),
    }
    for name, (f, args) in cases.items():
        try:
            check_grads(f, args, order=1, modes=("rev",), atol=1e-5, rtol=1e-5)
        except AssertionError as exc:
            raise AssertionError(f"check_grads {name}: {exc}") from None
    xf = x.astype(jnp.float32)[:, :, :4, :4]
    norms = {
        "layer_norm": lambda x: pj.layer_norm(x, (4, 4)),
        "rms_norm": lambda x: pj.rms_norm(x, 4),
    }
    for name, f in norms.items():
        try:
            check_grads(f, (xf,), order=1, modes=("rev",), atol=3e-2, rtol=3e-2, eps=1e-2)
        except AssertionError as exc:
            raise AssertionError(f"check_grads {name} (float32): {exc}") from None


# -- vmap ------------------------------------------------------------------------------------------
def test_vmap_folded_and_per_example(gpu):
    x = _rand(gpu, (4, 2, 3, 8, 8))
    w = _rand(gpu, (5, 3, 3, 3))

    def f(x, w):
        y = pj.conv(x, w, 1, 1, bias=jnp.ones(5, x.dtype), activation="relu")
        return pj.layer_norm(pj.softmax(pj.max_pool(y, (2, 2)), axis=1), 4)

    got = jax.jit(jax.vmap(f, in_axes=(0, None)))(x, w)
    for i in range(4):
        _check(f"vmap example {i}", got[i], f(x[i], w), "float32", 5)
    per = jax.jit(jax.vmap(jax.grad(lambda x, w: f(x, w).sum() ** 2, argnums=1), (0, None)))(x, w)
    for i in range(4):
        expected = jax.grad(lambda w, xi=x[i]: f(xi, w).sum() ** 2)(w)
        _check(f"vmap per-example dw {i}", per[i], expected, "float32", 50)


# -- the bound launches ----------------------------------------------------------------------------
def test_each_call_site_binds_once_and_then_launches(gpu, monkeypatch):
    """After a call site's first run every later run with its signature is the bound launch:
    the slow path runs once per call site, signature and thread (bound entries are per
    thread), forward and backward calls alike."""
    slow = []  # (thread, op text, signature) of each slow run
    original = _bound.Executor._slow

    def counted(self, text, call, stream):
        slow.append((threading.get_ident(), text, call.signature()[1]))
        return original(self, text, call, stream)

    monkeypatch.setattr(_bound.Executor, "_slow", counted)
    x = _rand(gpu, (2, 4, 8, 8))
    w = _rand(gpu, (4, 4, 3, 3))
    ops = {
        "activation": lambda x: pj.relu(x),
        "softmax": lambda x: pj.softmax(x, axis=1),
        "pool": lambda x: pj.max_pool(x, (2, 2)),
        "layer_norm": lambda x: pj.layer_norm(x, 8),
        "conv": lambda x: pj.conv(x, w, 1, 1),
        "conv_epilogue": lambda x: pj.conv(x, w, 1, 1, bias=x[0, :, 0, 0], activation="relu"),
    }
    for name, op in list(ops.items()):  # and the backward calls
        ops[name + "_grad"] = jax.grad(lambda x, op=op: (op(x) * x[..., :1, :1].sum()).sum())
    unbound, lines = [], []
    for name, op in ops.items():
        g = jax.jit(op)
        slow.clear()
        for _ in range(6):
            jax.block_until_ready(g(x))
        sites = len({k for _t, k, _s in slow})
        threads = len({t for t, _k, _s in slow})
        lines.append(
            f"BOUND {name:18s} {len(slow)} slow runs in 6 runs of {sites} call sites, on "
            f"{threads} threads"
        )
        if len(slow) != len(set(slow)):  # a call site ran slow twice on a thread: not bound
            unbound.append(lines[-1])
    print("\n" + "\n".join(lines), flush=True)
    assert not unbound, "not bound (runs went through the public function):\n" + "\n".join(unbound)


# -- host cost per call (printed, not asserted) ----------------------------------------------------
def _per_step_us(f, x, steps, repeats=3):
    jax.block_until_ready(f(x))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(x))
        times.append((time.perf_counter() - t0) / steps * 1e6)
    return statistics.median(times)


def test_host_cost_per_call_in_a_jitted_loop(gpu):
    """A jitted ``lax.fori_loop`` of N steps, each one call, against the same loop over XLA's
    own operation; and an unrolled chain of N calls (no loop), against XLA's operation with an
    optimization barrier between steps (so XLA cannot fuse them). Per step, median of 3."""
    steps = 1000
    x = _rand(gpu, (1, 8, 16, 16))
    w = _rand(gpu, (8, 8, 3, 3), scale=0.01)  # the loop decays to 0, never overflows
    sides = {
        "relu": (pj.relu, lambda v: jnp.maximum(v, 0)),
        "softmax": (lambda v: pj.softmax(v, axis=1), lambda v: jax.nn.softmax(v, axis=1)),
        "max_pool": (
            lambda v: jnp.pad(pj.max_pool(v, (2, 2)), ((0, 0), (0, 0), (0, 8), (0, 8))),
            lambda v: jnp.pad(
                lax.reduce_window(v, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID"),
                ((0, 0), (0, 0), (0, 8), (0, 8)),
            ),
        ),
        "conv3x3": (
            lambda v: pj.conv(v, w, 1, 1),
            lambda v: lax.conv_general_dilated(v, w, (1, 1), [(1, 1), (1, 1)]),
        ),
    }
    lines = []
    chain_n = 100
    for name, (ours, theirs) in sides.items():
        row = {}
        for side, op in (("pycudnn", ours), ("xla", theirs)):
            loop = jax.jit(lambda v, op=op: lax.fori_loop(0, steps, lambda i, u: op(u), v))

            def chain(v, op=op):
                for _ in range(chain_n):
                    v = lax.optimization_barrier(op(v))
                return v

            row[side] = (
                _per_step_us(loop, x, steps),
                _per_step_us(jax.jit(chain), x, chain_n),
            )
        (ol, oc), (xl, xc) = row["pycudnn"], row["xla"]
        lines.append(
            f"HOSTCOST {name:9s} loop: pycudnn {ol:7.2f} us, XLA {xl:7.2f} us, +{ol - xl:6.2f} us"
            f" | chain: pycudnn {oc:7.2f} us, XLA {xc:7.2f} us, +{oc - xc:6.2f} us"
        )
    print("\n" + "\n".join(lines), flush=True)
