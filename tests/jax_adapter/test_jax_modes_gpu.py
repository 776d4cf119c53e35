"""``pycudnn.jax`` under JAX's framework modes on the GPU (issue 41, build item 4): buffer
donation, ``shard_map`` and ``pmap`` over the host's GPUs (each device runs its calls on its own
handle; on a one-GPU machine a mesh of one), and XLA's command buffers (CUDA graphs) enabled for
fusions and custom calls, pycudnn's calls among them (``test_jax_capture_gpu.py`` checks the
recording and the replays themselves). Markers ``gpu`` and ``jax``; the several-GPU case also
``multigpu``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

import pycudnn.jax as pj  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.jax]


@pytest.fixture(scope="module")
def gpus():
    try:
        return jax.devices("cuda")
    except RuntimeError as exc:
        pytest.skip(f"JAX has no CUDA backend here: {exc}")


def _conv_ref(x, w):
    dn = jax.lax.conv_dimension_numbers(x.shape, w.shape, ("NCHW", "OIHW", "NCHW"))
    y = jax.lax.conv_general_dilated(
        x, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=dn, precision="highest"
    )  # (XLA's float32 default on a GPU is TF32; pycudnn's is not)
    return jax.nn.relu(y)


def _operands(n, seed=0):
    r = np.random.default_rng(seed)
    x = r.standard_normal((n, 8, 12, 12)).astype(np.float32)
    w = (r.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32)
    return x, w


def _close(a, b):
    a = np.asarray(a)
    assert np.isfinite(a).all()
    np.testing.assert_allclose(a, np.asarray(b), rtol=2e-4, atol=2e-4)


def test_donated_inputs(gpus):
    x, w = _operands(4)
    ref = _conv_ref(jnp.asarray(x), jnp.asarray(w))
    f = jax.jit(lambda x, w: pj.conv(x, w, padding=1, activation="relu"), donate_argnums=(0,))
    _close(f(jax.device_put(x, gpus[0]), jax.device_put(w, gpus[0])), ref)
    g = jax.jit(lambda x: pj.relu(x) * 2.0, donate_argnums=(0,))  # the result may reuse x
    xd = jax.device_put(x, gpus[0])
    _close(g(xd), np.maximum(x, 0) * 2.0)
    assert xd.is_deleted()  # XLA took the buffer; pycudnn read it before it was reused


def _shard_map(body, **kw):
    sm = getattr(jax, "shard_map", None)
    if sm is None:
        from jax.experimental.shard_map import shard_map as sm  # older JAX
    return sm(body, **kw)  # with its varying-axes type check


def _mesh_case(devices):
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    n = len(devices)
    mesh = Mesh(np.array(devices), ("b",))
    x, w = _operands(4 * n, seed=n)
    ref = _conv_ref(jnp.asarray(x), jnp.asarray(w))

    def body(x, w):
        y = pj.conv(x, w, padding=1, activation="relu")
        return y, jax.grad(lambda w: pj.conv(x, w, padding=1).sum())(w)

    f = jax.jit(_shard_map(body, mesh=mesh, in_specs=(P("b"), P()), out_specs=(P("b"), P())))
    xs = jax.device_put(x, NamedSharding(mesh, P("b")))
    ws = jax.device_put(w, NamedSharding(mesh, P()))
    y, gw = f(xs, ws)
    _close(y, ref)
    # the replicated filter's gradient: summed over the devices (JAX's own rule)
    want = jax.grad(lambda w: _conv_ref_lin(jnp.asarray(x), w).sum())(jnp.asarray(w))
    _close(gw, want)
    pf = jax.pmap(lambda x: pj.conv(x, jnp.asarray(w), padding=1, activation="relu"))
    _close(pf(x.reshape(n, 4, *x.shape[1:])).reshape(ref.shape), ref)


def _conv_ref_lin(x, w):
    dn = jax.lax.conv_dimension_numbers(x.shape, w.shape, ("NCHW", "OIHW", "NCHW"))
    return jax.lax.conv_general_dilated(
        x, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=dn, precision="highest"
    )


def test_shard_map_and_pmap_over_the_hosts_gpus(gpus):
    _mesh_case(gpus)


@pytest.mark.multigpu
def test_shard_map_over_two_gpus_each_on_its_own_handle(gpus):
    if len(gpus) < 2:
        pytest.skip("one GPU here")
    _mesh_case(gpus[:2])


_CMDBUF = textwrap.dedent(
    """
    import numpy as np, jax, jax.numpy as jnp
    import pycudnn.jax as pj

    @jax.jit
    def f(x):
        for _ in range(3):
            x = pj.relu(x * 2.0 - 1.0)   # XLA's fusions (command buffers) around pycudnn's calls
            x = pj.softmax(x + 0.5, axis=-1)
        return x

    def ref(x):
        for _ in range(3):
            x = np.maximum(x * 2.0 - 1.0, 0)
            x = np.exp(x + 0.5 - (x + 0.5).max(-1, keepdims=True))
            x = x / x.sum(-1, keepdims=True)
        return x

    for seed in range(4):
        x = np.random.default_rng(seed).standard_normal((64, 256)).astype(np.float32)
        np.testing.assert_allclose(np.asarray(f(jnp.asarray(x))), ref(x), rtol=1e-4, atol=1e-6)
    print("CMDBUF ok")
    """
)


def test_xla_command_buffers_around_pycudnn_calls(gpus):
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "")
        + " --xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1"
    )
    r = subprocess.run(
        [sys.executable, "-c", _CMDBUF], env=env, capture_output=True, text=True, timeout=240
    )
    if "Unknown flag" in r.stderr or "unknown flag" in r.stderr.lower():
        pytest.skip(f"this XLA lacks a command-buffer flag: {r.stderr[-300:]}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "CMDBUF ok" in r.stdout
