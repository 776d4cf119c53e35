"""``pycudnn.jax.graph_call`` on the GPU: builder graphs (pointwise with a broadcast bias, a
channels-last float16 convolution with bias and ReLU, a matmul, a graph built beforehand with
its own policy) run under ``jax.jit`` against numpy/JAX references, each jitted function run
twice on fresh inputs with NaN-filled memory freed in between; vmap (per example); a
``jax.custom_vjp`` from a forward and a backward graph; a released graph refused at run time.
Markers ``gpu`` and ``jax``."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402
import jax_gpu_support as S  # noqa: E402
from jax import lax  # noqa: E402
from jax_gpu_support import poison as _poison  # noqa: E402
from jax_gpu_support import rand as _rand  # noqa: E402

import pycudnn.graph as G  # noqa: E402
import pycudnn.jax as pj  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.jax]
gpu = S.gpu  # the shared fixture


def _check(what, got, ref, tol):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, expected {ref.shape}"
    assert not np.isnan(got).any(), f"{what}: NaN elements (unwritten?)"
    err = float(np.abs(got - ref).max(initial=0))
    bound = tol * max(1.0, float(np.abs(ref).max(initial=0)))
    assert err <= bound, f"{what}: max error {err:.3g} > {bound:.3g}"


def _twice(gpu, f, make, reference, tol):
    run = jax.jit(f)
    for _ in range(2):
        args = make()
        ref = reference(*(np.asarray(a) for a in args))
        _poison(gpu, *ref)
        got = run(*args)
        assert len(got) == len(ref)
        for i, (a, b) in enumerate(zip(got, ref, strict=True)):
            _check(f"result {i}", a, b, tol)


def _or_skip(run):
    """*run*, or a skip where cuDNN has no engine for the graph on this GPU: graph_call reports
    cuDNN's refusal as a JaxRuntimeError carrying pycudnn's message (on the H200 with cuDNN
    9.19, these small float32 pointwise-only graphs had none)."""
    try:
        return run()
    except Exception as exc:
        if "NotSupportedError" in str(exc) and "no cuDNN engine" in str(exc):
            pytest.skip(f"no cuDNN engine for this graph here: {str(exc)[:200]}")
        raise


def test_pointwise_graph_with_a_broadcast_bias(gpu):
    _or_skip(lambda: _pointwise_case(gpu))


def _pointwise_case(gpu):
    g = G.Graph(io_data_type="float32", name="bias_relu")
    a, b = g.tensor((4, 3, 16), name="a"), g.tensor((1, 3, 16), name="b")
    g.relu(g.add(a, b)).set_output(True)
    g.mul(a, b).set_output(True)
    _twice(
        gpu,
        lambda a, b: pj.graph_call(g, a, b),
        lambda: (_rand(gpu, (4, 3, 16)), _rand(gpu, (1, 3, 16))),
        lambda a, b: [np.maximum(a + b, 0), a * b],
        1e-6,
    )


def _conv_graph():
    g = G.Graph(io_data_type="float16", name="conv_bias_relu")
    x = g.tensor((2, 8, 6, 6), stride=(288, 1, 48, 8), name="x")  # NCHW dims, NHWC memory
    w = g.tensor((16, 8, 3, 3), stride=(72, 1, 24, 8), name="w")  # KCRS dims, KRSC memory
    b = g.tensor((1, 16, 1, 1), name="b")
    g.relu(g.add(g.conv_fprop(x, w, padding=1), b)).set_output(True)
    return g


def _conv_ref(x, w, b):
    y = lax.conv_general_dilated(
        jnp.asarray(x, jnp.float32), jnp.asarray(w, jnp.float32), (1, 1), ((1, 1), (1, 1)),
        dimension_numbers=("NHWC", "OHWI", "NHWC"),
    )  # fmt: skip
    return [np.maximum(np.asarray(y) + np.asarray(b, np.float32).reshape(1, 1, 1, 16), 0)]


@pytest.mark.parametrize("prebuilt", [False, True])
def test_channels_last_conv_graph(gpu, prebuilt):
    g = _conv_graph()
    if prebuilt:  # the graph's own plan and policy are kept
        g.build(policy="heuristics")
    ins, outs = pj.graph_io(g)
    assert [p.shape for p in ins] == [(2, 6, 6, 8), (16, 3, 3, 8), (1, 16, 1, 1)]
    assert outs[0].shape == (2, 6, 6, 16)
    _twice(
        gpu,
        lambda x, w, b: pj.graph_call(g, x, w, b),
        lambda: (
            _rand(gpu, (2, 6, 6, 8), "float16"),
            _rand(gpu, (16, 3, 3, 8), "float16", 0.3),
            _rand(gpu, (1, 16, 1, 1), "float16"),
        ),
        _conv_ref,
        1e-2,
    )


def test_matmul_graph_and_vmap(gpu):
    g = G.Graph(io_data_type="float16", name="matmul")
    a, b = g.tensor((1, 32, 64), name="a"), g.tensor((1, 64, 48), name="b")
    g.matmul(a, b).set_output(True)
    b = _rand(gpu, (1, 64, 48), "float16", 0.2)
    a3 = _rand(gpu, (3, 1, 32, 64), "float16", 0.2)
    (ys,) = jax.jit(jax.vmap(lambda a: pj.graph_call(g, a, b)))(a3)
    for i in range(3):
        ref = np.asarray(a3[i], np.float32) @ np.asarray(b, np.float32)
        _check(f"matmul {i}", ys[i], ref, 1e-2)


def test_custom_vjp_of_a_forward_and_a_backward_graph(gpu):
    fwd = G.Graph(io_data_type="float32", name="relu")
    fwd.relu(fwd.tensor((8, 32), name="x")).set_output(True)
    bwd = G.Graph(io_data_type="float32", name="relu_grad")
    x, dy = bwd.tensor((8, 32), name="x"), bwd.tensor((8, 32), name="dy")
    bwd.mul(dy, bwd.cmp_gt(x, bwd.scalar(0.0))).set_output(True)

    @jax.custom_vjp
    def relu(x):
        return pj.graph_call(fwd, x)[0]

    relu.defvjp(lambda x: (relu(x), x), lambda x, dy: pj.graph_call(bwd, x, dy))
    x = _rand(gpu, (8, 32))
    g = _or_skip(lambda: jax.block_until_ready(jax.jit(jax.grad(lambda x: (relu(x) * x).sum()))(x)))
    xn = np.asarray(x)
    _check("relu grad", g, np.maximum(xn, 0) + xn * (xn > 0), 1e-6)


def test_a_released_graph_is_refused_when_its_program_runs(gpu):
    g = _conv_graph()  # a graph cuDNN runs here (the pointwise-only ones had no engine)
    f = jax.jit(lambda x, w, b: pj.graph_call(g, x, w, b))
    args = (
        _rand(gpu, (2, 6, 6, 8), "float16"),
        _rand(gpu, (16, 3, 3, 8), "float16", 0.3),
        _rand(gpu, (1, 16, 1, 1), "float16"),
    )
    jax.block_until_ready(f(*args))
    pj.release_graph(g)
    with pytest.raises(Exception, match=r"is not registered"):
        jax.block_until_ready(f(args[0] + 1, *args[1:]))
