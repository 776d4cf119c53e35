"""``pycudnn.jax.graph_call`` on JAX's CPU platform: a builder graph's inputs and outputs as
JAX's operands and results (declaration order, dims in memory order), argument checks at trace
time, the registry (an id per graph and signature, held strongly, released), the lowering for
CUDA, and -- with the ``graph`` target registered for the CPU platform with numpy twins of the
test graphs in cuDNN's place -- the calls run under jit and vmap (per example), and a
``jax.custom_vjp`` composed from two graphs. cuDNN runs them in ``test_jax_graph_gpu.py``."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

import pycudnn.graph as G  # noqa: E402
import pycudnn.jax as pj  # noqa: E402
from pycudnn.jax import _graph, _ops  # noqa: E402

pytestmark = pytest.mark.jax
CPU = jax.devices("cpu")[0]
_twin_registered = False


def _bias_relu_matmul(a, b, m):
    y = np.maximum(a + b, 0)
    return [y, y @ m]


#: the test graphs' computations by graph name (the twin's)
NUMPY = {
    "bias_relu_matmul": _bias_relu_matmul,
    "double": lambda x: [2 * x],
    "relu_grad": lambda x, dy: [dy * (x > 0)],
    "relu": lambda x: [np.maximum(x, 0)],
}


def twin(request, call, stream):
    """The ``graph`` target's slow path on JAX's CPU platform: the registered graph's numpy
    computation into XLA's host buffers."""
    graph = _graph.registered(request.graph)
    outs = NUMPY[graph.name](*(b.numpy() for b in call.args))
    rets = [b.numpy() for b in call.rets]
    for r, o in zip(rets, outs, strict=True):
        r[...] = o


@pytest.fixture(scope="module", autouse=True)
def registered_twin():
    global _twin_registered
    if not _twin_registered:
        _ops.register_twin("graph", twin)
        _twin_registered = True


def bias_relu_matmul():
    g = G.Graph(io_data_type="float32", name="bias_relu_matmul")
    a = g.tensor((2, 3, 4), name="a")
    b = g.tensor((1, 3, 4), name="b")
    m = g.tensor((2, 4, 5), name="m")
    y = g.relu(g.add(a, b)).set_output(True)
    g.matmul(y, m).set_output(True)
    return g


def double_channels_last():
    g = G.Graph(io_data_type="float32", name="double")
    x = g.tensor((2, 3, 4, 5), stride=(60, 1, 15, 3), name="x")  # NCHW dims, NHWC memory
    g.mul(x, g.scalar(2.0)).set_output(True)
    return g


def _rand(*shape, seed=0):
    return jax.device_put(np.random.default_rng(seed).standard_normal(shape).astype("f4"), CPU)


def test_graph_io_lists_inputs_and_outputs_in_declaration_and_memory_order():
    ins, outs = pj.graph_io(bias_relu_matmul())
    assert [(p.name, p.shape) for p in ins] == [
        ("a", (2, 3, 4)),
        ("b", (1, 3, 4)),
        ("m", (2, 4, 5)),
    ]
    assert [p.shape for p in outs] == [(2, 3, 4), (2, 3, 5)]
    ins, outs = pj.graph_io(double_channels_last())
    assert ins[0].shape == outs[0].shape == (2, 4, 5, 3)  # (N, H, W, C)
    assert ins[0].dtype == np.float32


def test_values_under_jit_and_vmap():
    g = bias_relu_matmul()
    a, b, m = _rand(2, 3, 4, seed=1), _rand(1, 3, 4, seed=2), _rand(2, 4, 5, seed=3)
    y, z = jax.jit(lambda a, b, m: pj.graph_call(g, a, b, m))(a, b, m)
    ry, rz = _bias_relu_matmul(*(np.asarray(v) for v in (a, b, m)))
    np.testing.assert_allclose(y, ry, rtol=1e-6)
    np.testing.assert_allclose(z, rz, rtol=1e-5)
    eager = pj.graph_call(g, a, b, m)
    np.testing.assert_allclose(eager[1], rz, rtol=1e-5)
    a3 = _rand(3, 2, 3, 4, seed=4)
    ys, zs = jax.jit(jax.vmap(lambda a: pj.graph_call(g, a, b, m)))(a3)
    for i in range(3):
        ry, rz = _bias_relu_matmul(np.asarray(a3[i]), np.asarray(b), np.asarray(m))
        np.testing.assert_allclose(ys[i], ry, rtol=1e-6)
        np.testing.assert_allclose(zs[i], rz, rtol=1e-5)
    x = _rand(2, 4, 5, 3, seed=5)
    (y,) = jax.jit(lambda x: pj.graph_call(double_channels_last(), x))(x)
    np.testing.assert_array_equal(y, 2 * np.asarray(x))


def test_arguments_are_checked_at_trace_time():
    g = bias_relu_matmul()
    a, b, m = (jax.ShapeDtypeStruct(s, jnp.float32) for s in ((2, 3, 4), (1, 3, 4), (2, 4, 5)))
    with pytest.raises(TypeError, match=r"2 operands for graph 'bias_relu_matmul'; expected 3, "):
        jax.eval_shape(lambda a, b: pj.graph_call(g, a, b), a, b)
    with pytest.raises(ValueError, match=r"operands\[2\] \(tensor 'm'\) is float32\[2, 5, 4\]"):
        jax.eval_shape(lambda a, b: pj.graph_call(g, a, b, jnp.zeros((2, 5, 4))), a, b)
    with pytest.raises(ValueError, match=r"operands\[0\] \(tensor 'a'\) is int32\[2, 3, 4\]"):
        jax.eval_shape(lambda b, m: pj.graph_call(g, jnp.zeros((2, 3, 4), int), b, m), b, m)
    with pytest.raises(TypeError, match=r"graph is a dict; expected a pycudnn.graph.Graph"):
        pj.graph_call({}, a)
    g2 = G.Graph(io_data_type="float32", name="bv")
    x = g2.tensor((2, 3), name="x")
    g2.mul(x, g2.tensor((1, 1), name="alpha", is_pass_by_value=True)).set_output(True)
    with pytest.raises(ValueError, match=r"tensor 'alpha' is passed by value"):
        pj.graph_call(g2, jnp.zeros((2, 3)))
    g3 = G.Graph(io_data_type="float32", name="strided")
    g3.relu(g3.tensor((2, 3), stride=(4, 1), name="x")).set_output(True)
    with pytest.raises(ValueError, match=r"tensor 'x' has dims \(2, 3\) and strides \(4, 1\)"):
        pj.graph_io(g3)
    with pytest.raises(ValueError, match=r"no operation"):
        pj.graph_io(G.Graph(io_data_type="float32"))


def test_the_registry_keeps_an_id_per_graph_and_signature_and_releases():
    g = bias_relu_matmul()
    rid = pj.register_graph(g)
    assert pj.register_graph(g) == rid and _graph.registered(rid) is g
    assert pj.register_graph(bias_relu_matmul()) != rid  # another graph object
    a, b, m = _rand(2, 3, 4), _rand(1, 3, 4), _rand(2, 4, 5)
    f = jax.jit(lambda a, b, m: pj.graph_call(g, a, b, m))
    text = f.trace(a, b, m).lower(lowering_platforms=("cuda",)).as_text()
    assert "pycudnn_jax_graph" in text and f"('GraphCall', ({rid}, " in text
    f(a, b, m)
    assert pj.release_graph(g) == 1 and pj.release_graph(g) == 0
    with pytest.raises(ValueError, match=rf"graph {rid} is not registered"):
        _graph.registered(rid)
    with pytest.raises(Exception, match=rf"graph {rid} is not registered"):
        jax.block_until_ready(f(a + 1, b, m))  # compiled before, run after the release


def test_a_custom_vjp_composed_from_a_forward_and_a_backward_graph():
    fwd = G.Graph(io_data_type="float32", name="relu")
    fwd.relu(fwd.tensor((4, 6), name="x")).set_output(True)
    bwd = G.Graph(io_data_type="float32", name="relu_grad")
    x, dy = bwd.tensor((4, 6), name="x"), bwd.tensor((4, 6), name="dy")
    bwd.mul(dy, bwd.cmp_gt(x, bwd.scalar(0.0))).set_output(True)

    @jax.custom_vjp
    def relu(x):
        return pj.graph_call(fwd, x)[0]

    relu.defvjp(lambda x: (relu(x), x), lambda x, dy: pj.graph_call(bwd, x, dy))
    x = _rand(4, 6, seed=7)
    g = jax.jit(jax.grad(lambda x: (relu(x) * x).sum()))(x)
    xn = np.asarray(x)
    np.testing.assert_allclose(g, np.maximum(xn, 0) + xn * (xn > 0), rtol=1e-6)


def test_the_gpu_run_launches_the_plan_on_xlas_pointers_in_uid_order(monkeypatch):
    import contextlib
    import ctypes

    launched, planned = [], []

    class Plan:
        def launch(self, ptrs, scratch):
            launched.append((list(ptrs), scratch))

    class Buf:
        def __init__(self, ptr):
            self.ptr = ptr

    monkeypatch.setattr(_graph, "device_of", lambda buffers: 0)
    monkeypatch.setattr(_graph._call, "handle_for", lambda device, stream, func: "HANDLE")
    monkeypatch.setattr(_graph._cuda, "DeviceContext", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(
        _graph._plans, "plan", lambda key, h: planned.append((key.device, h)) or Plan()
    )
    g = double_channels_last()  # x (uid 1), the constant 2.0 (uid 2), the output (uid 3)
    rid = pj.register_graph(g)
    request = _graph.GraphCall(rid, ())
    request.run([Buf(100)], [Buf(200)], 7)
    request.run([Buf(101)], [Buf(201)], 7)
    assert planned == [(0, "HANDLE")]  # planned once per thread, graph and device
    const = ctypes.addressof(g._tensors[1]._value)
    key = g.key(device=0)
    assert key.uids == (1, 3, 2)  # the real tensors, then the constants
    assert launched == [([100, 200, const], ()), ([101, 201, const], ())]
    g2 = double_channels_last()
    request2 = _graph.GraphCall(pj.register_graph(g2), ())
    g2.relu(g2._tensors[0]).set_output(True)  # changed after tracing: refused when planned
    assert pj.register_graph(g2) != request2.graph  # a new structure, a new id
    with pytest.raises(ValueError, match=r"graph 'double' changed since it was traced"):
        request2.run([Buf(100)], [Buf(200)], 7)
    pj.release_graph(g)
    with pytest.raises(ValueError, match=r"is not registered"):
        request.run([Buf(100)], [Buf(200)], 7)
