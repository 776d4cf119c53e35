"""``pycudnn.jax`` under ``shard_map`` on JAX's CPU platform (two host devices, in a child
process: the device count is fixed when JAX starts), with the float64 numpy twins in cuDNN's
place: a call's results vary over the mesh axes its operands vary over, and the ``custom_vjp``
backward types its cotangents as the operands (a replicated weight's gradient is the sum over
the devices, JAX's own rule), so ``shard_map``'s varying-axes check passes. The GPU run is
``test_jax_modes_gpu.py``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("jax")
pytestmark = pytest.mark.jax

_CHILD = textwrap.dedent(
    """
    import sys
    import numpy as np, jax, jax.numpy as jnp
    import jax_op_references as R
    R.register_twins("conv", "activation")
    import pycudnn.jax as pj
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    sm = getattr(jax, "shard_map", None)
    if sm is None:
        from jax.experimental.shard_map import shard_map as sm
    mesh = Mesh(np.array(jax.devices("cpu")[:2]), ("b",))
    r = np.random.default_rng(0)
    x = r.standard_normal((8, 3, 6, 6)).astype(np.float32)
    w = (r.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)

    def ref(x, w):
        dn = jax.lax.conv_dimension_numbers(x.shape, w.shape, ("NCHW", "OIHW", "NCHW"))
        return jax.lax.conv_general_dilated(
            x, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=dn, precision="highest")

    def body(x, w):
        y = pj.relu(pj.conv(x, w, padding=1))
        gx, gw = jax.grad(lambda x, w: pj.relu(pj.conv(x, w, padding=1)).sum(), (0, 1))(x, w)
        return y, gx, gw

    f = jax.jit(sm(body, mesh=mesh, in_specs=(P("b"), P()), out_specs=(P("b"), P("b"), P())))
    y, gx, gw = f(jax.device_put(x, NamedSharding(mesh, P("b"))),
                  jax.device_put(w, NamedSharding(mesh, P())))
    np.testing.assert_allclose(np.asarray(y), np.maximum(ref(x, w), 0), rtol=1e-5, atol=1e-5)
    wx, ww = jax.grad(lambda x, w: jax.nn.relu(ref(x, w)).sum(), (0, 1))(
        jnp.asarray(x), jnp.asarray(w))
    np.testing.assert_allclose(np.asarray(gx), np.asarray(wx), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(gw), np.asarray(ww), rtol=1e-4, atol=1e-4)
    print("SHARDMAP ok")
    """
)


def test_shard_map_types_and_gradients_on_two_cpu_devices():
    here = Path(__file__).resolve().parent
    env = dict(os.environ)
    env["XLA_FLAGS"] = env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(here), str(here.parent.parent), env.get("PYTHONPATH", "")]
    )
    r = subprocess.run(
        [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-4000:]
    assert "SHARDMAP ok" in r.stdout
