"""``pycudnn.jax``'s calls inside XLA's command buffers (CUDA graphs) on the GPU: with
``use_command_buffers(True)`` (the default) the measured calls go to their families' capturable
targets, XLA records them once and replays them with no Python, and every result equals the
same function traced with command buffers off (the plain targets, run call by call). In child
processes: XLA's flags are read when JAX starts (command buffers for fusions and custom calls,
a graph of any size). Markers ``gpu`` and ``jax``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

jax = pytest.importorskip("jax")

pytestmark = [pytest.mark.gpu, pytest.mark.jax]

_FLAGS = " --xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1"

_CHILD = textwrap.dedent(
    """
    import numpy as np, jax, jax.numpy as jnp
    import pycudnn.jax as pj
    from pycudnn.highlevel import _bound

    calls = [0]
    run = _bound.run
    def counted(*a, **k):
        calls[0] += 1
        return run(*a, **k)
    _bound.run = counted

    def rand(shape, seed, dtype=jnp.float32, scale=1.0):
        a = np.random.default_rng(seed).standard_normal(shape) * scale
        return jnp.asarray(a.astype(np.float32)).astype(dtype)

    def conv_step(x, w, b):
        y = pj.conv(x, w, padding=1, bias=b, activation="relu")
        gx, gw = jax.grad(lambda x, w: (pj.conv(x, w, padding=1) ** 2).sum(), (0, 1))(x, w)
        return y, gx, gw

    def attn_step(q, k, v):
        o = pj.dot_product_attention(q, k, v, is_causal=True)
        g = jax.grad(lambda q, k, v: (pj.dot_product_attention(q, k, v, is_causal=True)
                                      .astype(jnp.float32) ** 2).sum(), (0, 1, 2))(q, k, v)
        return (o, *g)

    def norm_step(x, g, b):
        y = pj.layer_norm(x, (x.shape[-1],), g, b)
        dx = jax.grad(lambda x: (pj.layer_norm(x, (x.shape[-1],), g, b) ** 2).sum())(x)
        return y, dx, pj.softmax(x, -1), pj.max_pool(x.reshape(4, 8, 16, 32), (2, 2), 2)

    def mm_step(a, b):
        return (pj.matmul(a, b),)

    cases = {
        "conv": (conv_step, lambda s: (rand((8, 16, 14, 14), s),
                                       rand((16, 16, 3, 3), s + 1, scale=0.2), rand((16,), s + 2))),
        "attention": (attn_step, lambda s: tuple(rand((2, 256, 4, 64), s + i, jnp.bfloat16)
                                                 for i in range(3))),
        "norms": (norm_step, lambda s: (rand((512, 32), s), rand((32,), s + 1),
                                        rand((32,), s + 2))),
        "matmul": (mm_step, lambda s: (rand((256, 128), s, jnp.bfloat16),
                                       rand((128, 64), s + 1, jnp.bfloat16))),
    }
    for name, (step, make) in cases.items():
        on = jax.jit(step)
        text = on.lower(*make(0)).as_text()
        pj.use_command_buffers(False)
        low = jax.jit(lambda *a: step(*a)).lower(*make(0))  # (jit reuses a function's trace)
        pj.use_command_buffers(True)
        assert "_cb(" not in low.as_text(), name  # off: the plain targets only
        off = low.compile()
        cb = text.count("_cb(")
        plain = text.count("@pycudnn_jax_") - cb
        print(f"CAPTURE {name}: {cb} calls capturable, {plain} not", flush=True)
        assert cb > 0, name
        for seed in range(6):  # warm-up, capture, replays: fresh values each time
            ops = make(10 * seed)
            for a, b in zip(on(*ops), off(*ops)):
                a, b = np.asarray(a.astype(jnp.float32)), np.asarray(b.astype(jnp.float32))
                assert np.isfinite(a).all(), name
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=name)

    # a loop body: recorded once, then replayed with no handler call (while the buffers' addresses
    # stay: XLA records anew for new ones)
    x0, w = rand((8, 16, 14, 14), 1), rand((16, 16, 3, 3), 2, scale=0.1)
    body = lambda i, x: jnp.tanh(pj.conv(x, w, padding=1, activation="relu"))
    loop = jax.jit(lambda x: jax.lax.fori_loop(0, 20, body, x))
    pj.use_command_buffers(False)
    other = lambda i, v: body(i, v)  # (JAX reuses a loop body's trace: another function)
    ref = jax.jit(lambda x: jax.lax.fori_loop(0, 20, other, x)).lower(x0).compile()
    pj.use_command_buffers(True)
    per = []
    for i in range(5):  # the result dropped each time: XLA's next one reuses its buffer
        c0 = calls[0]
        loop(x0).block_until_ready()
        per.append(calls[0] - c0)
    np.testing.assert_allclose(np.asarray(loop(x0)), np.asarray(ref(x0)), rtol=1e-5, atol=1e-5)
    print(f"CAPTURE loop: pycudnn calls per execution {per}", flush=True)
    assert per[-1] == 0 and per[-2] == 0, per
    print("CAPTURE ok")
    """
)


# which families' calls are capturable (printed: the docs' table), and a call whose binding is
# gone when XLA records: a clear error naming the cause, the process going on
_FAMILIES = textwrap.dedent(
    """
    import numpy as np, jax, jax.numpy as jnp
    import pycudnn, pycudnn.jax as pj

    def rand(shape, seed=0, dtype=jnp.float32):
        a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
        return jnp.asarray(a).astype(dtype)

    x4, g, b = rand((4, 8, 12, 12)), jnp.ones((8,)), jnp.zeros((8,))
    lg = jax.nn.log_softmax(rand((6, 2, 5)), -1)  # (T, N, C)
    calls = {
        "activation": (lambda x: pj.relu(x), (x4,)),
        "softmax": (lambda x: pj.log_softmax(x, -1), (x4,)),
        "avg_pool": (lambda x: pj.avg_pool(x, (2, 2), 2), (x4,)),
        "rms_norm": (lambda x: pj.rms_norm(x, (12,)), (x4,)),
        "batch_norm (training)": (lambda x: pj.batch_norm(x, g, b, training=True)[0], (x4,)),
        "lrn": (lambda x: pj.lrn(x), (x4,)),
        "dropout": (lambda x: pj.dropout(x, 0.5, jax.random.key(0)), (x4,)),
    }
    for name, (f, args) in calls.items():
        text = jax.jit(f).lower(*args).as_text()
        cb = text.count("_cb(")
        print(f"FAMILY {name}: {cb} of {text.count('@pycudnn_jax_')} calls capturable",
              flush=True)
        jax.block_until_ready(jax.jit(lambda *a: f(*a))(*args))

    # the binding gone between XLA's first run and its recording: a clear error
    f = jax.jit(lambda x: pj.relu(pj.relu(x) + 1.0))
    f(x4).block_until_ready()  # XLA's first run: bound
    pycudnn.clear_caches()
    try:
        f(x4).block_until_ready()  # the recording
        print("MISS no error (XLA did not record here)", flush=True)
    except Exception as exc:
        assert "no bound launch to record" in str(exc), exc
        print("MISS clear error:", type(exc).__name__, flush=True)
    np.testing.assert_allclose(np.asarray(jax.jit(lambda x: pj.relu(x))(x4)),
                               np.maximum(np.asarray(x4), 0))  # the process goes on

    # exported with concrete shapes: the capturable target named, its workspace a result
    w = rand((8, 8, 3, 3), 1) * 0.2
    conv = lambda x: pj.conv(x, w, padding=1, activation="relu")
    checks = [jax.export.DisabledSafetyCheck.custom_call(n)
              for n in ("pycudnn_jax_conv", "pycudnn_jax_conv_cb")]
    exp = jax.export.export(jax.jit(conv), disabled_checks=checks)(x4)
    assert "pycudnn_jax_conv_cb" in exp.mlir_module()
    back = jax.export.deserialize(exp.serialize())
    np.testing.assert_allclose(np.asarray(back.call(x4)), np.asarray(jax.jit(conv)(x4)),
                               rtol=1e-6, atol=1e-6)
    print("EXPORT ok", flush=True)
    print("FAMILIES ok")
    """
)


def _child(script: str, ok: str) -> str:
    try:
        jax.devices("cuda")
    except RuntimeError as exc:
        pytest.skip(f"JAX has no CUDA backend here: {exc}")
    env = dict(os.environ)
    env["XLA_FLAGS"] = env.get("XLA_FLAGS", "") + _FLAGS
    r = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=400
    )
    print(r.stdout)
    if "Unknown flag" in r.stderr or "unknown flag" in r.stderr.lower():
        pytest.skip(f"this XLA lacks a command-buffer flag: {r.stderr[-300:]}")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert ok in r.stdout
    return r.stdout


def test_captured_calls_equal_the_plain_ones_and_replay_without_python():
    _child(_CHILD, "CAPTURE ok")


def test_families_and_a_binding_gone_before_the_recording():
    _child(_FAMILIES, "FAMILIES ok")
