"""``pycudnn.jax``'s attention, CTC loss and spatial transformer on JAX's CPU platform: argument
checks at trace time, abstract evaluation, the lowering for CUDA, and -- with the families'
targets registered for the CPU platform with float64 numpy twins in cuDNN's place
(``jax_attention_references.twin``) -- the same calls run: values and gradients against JAX's
own operations (``jax.nn.dot_product_attention``, ``optax.ctc_loss`` where installed, a
pure-JAX bilinear sampler), vmap. cuDNN itself runs in ``test_jax_ops_attention_gpu.py``."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402
import jax_attention_references as RA  # noqa: E402
import jax_op_references  # noqa: E402
from test_jax_ops import CPU, _calls_and_loops, _close, _grads, _lower_cuda  # noqa: E402

import pycudnn.jax as pj  # noqa: E402
from pycudnn.jax import _ops, _request  # noqa: E402

pytestmark = pytest.mark.jax


@pytest.fixture(scope="module", autouse=True)
def twins():
    """The families' targets on the CPU platform, computed by the numpy twin (once a process)."""
    jax_op_references.register_twins(*RA.FAMILIES, twin=RA.twin)


def _rand(*shape, seed=0, dtype=np.float32, scale=1.0):
    a = np.random.default_rng(seed).standard_normal(shape) * scale
    return jax.device_put(a.astype(dtype), CPU)


# -- argument checks: clear errors at trace time, before any call ----------------------------------
Q = jax.ShapeDtypeStruct((2, 16, 4, 32), jnp.float16)
KV = jax.ShapeDtypeStruct((2, 24, 2, 32), jnp.float16)


@pytest.mark.parametrize(
    ("f", "error", "match"),
    [
        (
            lambda q, k: pj.dot_product_attention(q.astype(jnp.float32), k, k),
            TypeError,
            r"query has dtype float32; expected one of \('float16', 'bfloat16'\)",
        ),
        (
            lambda q, k: pj.dot_product_attention(q, k.astype(jnp.bfloat16), k),
            TypeError,
            r"key is bfloat16; expected query's float16",
        ),
        (lambda q, k: pj.dot_product_attention(q, k, k, is_causal=1), TypeError, r"is_causal=1"),
        (
            lambda q, k: pj.dot_product_attention(q, k, k, alibi=True),
            ValueError,
            r"alibi=True needs is_causal=True",
        ),
        (
            lambda q, k: pj.dot_product_attention(
                q, k[:, :, :1].repeat(3, 2), k[:, :, :1].repeat(3, 2)
            ),
            ValueError,
            r"query has 4 heads, key and value 3; expected a divisor of 4",
        ),
        (
            lambda q, k: pj.dot_product_attention(q[..., :12], k[..., :12], k[..., :12]),
            ValueError,
            r"query/key head dim 12; cuDNN's fused attention takes multiples of 8 up to 256",
        ),
        (
            lambda q, k: pj.dot_product_attention(q, k, k, jnp.zeros((3, 16, 24), q.dtype)),
            ValueError,
            r"bias has shape \(3, 16, 24\); expected a shape broadcastable to \(B, N, T, S\)",
        ),
        (
            lambda q, k: pj.dot_product_attention(q, k, k, jnp.zeros((16, 24), jnp.float32)),
            TypeError,
            r"bias is float32; expected query's float16",
        ),
        (
            lambda q, k: pj.dot_product_attention(
                q, k, k, query_seq_lengths=jnp.ones(2, jnp.float32)
            ),
            TypeError,
            r"query_seq_lengths has dtype float32; expected int32",
        ),
        (
            lambda q, k: pj.dot_product_attention(
                q, k, k, key_value_seq_lengths=jnp.ones(3, jnp.int32)
            ),
            ValueError,
            r"key_value_seq_lengths has shape \(3,\); expected \(2,\)",
        ),
        (
            lambda q, k: pj.dot_product_attention(q, k, k, local_window_size=(1, -1)),
            ValueError,
            r"local_window_size=\(1, -1\); expected values >= 0",
        ),
        (
            lambda q, k: pj.dot_product_attention(q, k, k, local_window_size="3"),
            TypeError,
            r"local_window_size='3'; expected None, an int or a \(left, right\) pair",
        ),
        (
            lambda q, k: pj.dot_product_attention(q, k, k, scale="1"),
            TypeError,
            r"scale='1'; expected a real number",
        ),
        (
            lambda q, k: pj.dot_product_attention(q, k, k, None, jnp.ones((3, 8, 8))),
            ValueError,
            r"mask has shape \(3, 8, 8\); expected a shape broadcastable to \(B, N, T, S\)",
        ),
        (
            lambda q, k: pj.dot_product_attention(q, k, k, None, jnp.ones((16, 24))),
            TypeError,
            r"mask has dtype float32; expected bool",
        ),
    ],
)
def test_attention_arguments_are_checked_at_trace_time(f, error, match):
    with pytest.raises(error, match=match):
        jax.eval_shape(f, Q, KV)


LOGITS = jax.ShapeDtypeStruct((3, 20, 6), jnp.float32)


@pytest.mark.parametrize(
    ("f", "error", "match"),
    [
        (
            lambda x: pj.ctc_loss(
                x.astype(jnp.float16),
                jnp.zeros((3, 20)),
                jnp.ones((3, 4), jnp.int32),
                jnp.zeros((3, 4)),
            ),
            TypeError,
            r"logits has dtype float16; expected one of \('float32', 'float64'\)",
        ),
        (
            lambda x: pj.ctc_loss(
                x, jnp.zeros((3, 20)), jnp.ones((3, 4), jnp.int32), jnp.zeros((3, 4)), 6
            ),
            ValueError,
            r"blank_id=6; expected 0 to K - 1 = 5",
        ),
        (
            lambda x: pj.ctc_loss(
                x, jnp.zeros((3, 20)), jnp.ones((3, 4), jnp.uint8), jnp.zeros((3, 4))
            ),
            TypeError,
            r"labels have dtype uint8; expected int32",
        ),
        (
            lambda x: pj.ctc_loss(
                x, jnp.zeros((3, 19)), jnp.ones((3, 4), jnp.int32), jnp.zeros((3, 4))
            ),
            ValueError,
            r"logit_paddings has shape \(3, 19\); expected \(3, 20\)",
        ),
        (
            lambda x: pj.ctc_loss(
                x, jnp.zeros((3, 20)), jnp.ones((2, 4), jnp.int32), jnp.zeros((2, 4))
            ),
            ValueError,
            r"labels have shape \(2, 4\); expected \(3, L\)",
        ),
        (
            lambda x: pj.ctc_loss(
                x, jnp.zeros((3, 20)), jnp.ones((3, 4), jnp.int32), jnp.zeros((3, 4)), algo="fast"
            ),
            ValueError,
            r"algo='fast'; expected one of \('deterministic', 'non_deterministic'\)",
        ),
    ],
)
def test_ctc_arguments_are_checked_at_trace_time(f, error, match):
    with pytest.raises(error, match=match):
        jax.eval_shape(f, LOGITS)


X = jax.ShapeDtypeStruct((2, 3, 8, 8), jnp.float32)
THETA = jax.ShapeDtypeStruct((2, 2, 3), jnp.float32)


@pytest.mark.parametrize(
    ("f", "error", "match"),
    [
        (
            lambda t, x: pj.spatial_transformer(t.astype(jnp.float16), x, (4, 4)),
            TypeError,
            r"theta is float16; expected x's float32",
        ),
        (
            lambda t, x: pj.spatial_transformer(t, x.astype(jnp.bfloat16), (4, 4)),
            TypeError,
            r"theta is float32; expected x's bfloat16",
        ),
        (
            lambda t, x: pj.grid_sample(
                x.astype(jnp.bfloat16), jnp.zeros((2, 4, 4, 2), jnp.bfloat16)
            ),
            TypeError,
            r"x has dtype bfloat16; expected one of \('float16', 'float32', 'float64'\)",
        ),
        (lambda t, x: pj.affine_grid(t, 4), TypeError, r"out_shape=4; expected \(H, W\), two ints"),
        (
            lambda t, x: pj.affine_grid(t, (4, 0)),
            ValueError,
            r"out_shape=\(4, 0\); expected values >= 1",
        ),
        (lambda t, x: pj.affine_grid(t[:, :1], (4, 4)), ValueError, r"theta has shape \(2, 1, 3\)"),
        (
            lambda t, x: pj.grid_sample(x, jnp.zeros((3, 4, 4, 2))),
            ValueError,
            r"grid has shape \(3, 4, 4, 2\); expected \(2, H, W, 2\) \(N of x\)",
        ),
        (
            lambda t, x: pj.grid_sample(x, jnp.zeros((2, 4, 4, 2)), channels_last=1),
            TypeError,
            r"channels_last=1; expected a bool",
        ),
    ],
)
def test_spatial_transformer_arguments_are_checked_at_trace_time(f, error, match):
    with pytest.raises(error, match=match):
        jax.eval_shape(f, THETA, X)


# -- the lowering for CUDA: the families' targets, one attribute that decodes to the request -------
def test_lowering_names_the_targets_and_carries_the_requests():
    q = _rand(2, 16, 4, 32, dtype=np.float16)
    k = _rand(2, 24, 2, 32, seed=1, dtype=np.float16)
    bias = _rand(4, 16, 24, seed=2, dtype=np.float16)
    logits = _rand(3, 12, 5, seed=3)
    x = _rand(2, 3, 8, 8, seed=4)
    theta = _rand(2, 2, 3, seed=5)

    def f(q, k, bias, logits, x, theta):
        a = pj.dot_product_attention(q, k, k, bias, is_causal=True).astype(jnp.float32).sum()
        c = pj.ctc_loss(logits, jnp.zeros((3, 12)), jnp.ones((3, 2), jnp.int32), jnp.zeros((3, 2)))
        return a + c.sum() + pj.spatial_transformer(theta, x, (5, 6)).sum()

    text = _lower_cuda(
        jax.value_and_grad(f, argnums=(0, 1, 2, 3, 4, 5)), q, k, bias, logits, x, theta
    )
    targets = set(re.findall(r"custom_call @(\w+)", text))
    assert targets == {f"pycudnn_jax_{family}" for family in RA.FAMILIES}
    ops = re.findall(r'mhlo.backend_config = \{op = "((?:[^"\\]|\\.)*)"\}', text)
    kinds = {type(_request.decode(o.replace('\\"', '"').encode())).__name__ for o in ops}
    assert kinds == {
        "Attention",
        "AttentionGrad",
        "CtcLoss",
        "AffineGrid",
        "AffineGridGrad",
        "GridSample",
        "GridSampleGrad",
    }


# -- attention: values and gradients against jax.nn.dot_product_attention --------------------------
def _jax_attention(q, k, v, bias=None, **kw):
    f32 = jnp.float32
    b = None if bias is None else bias.astype(f32)
    return jax.nn.dot_product_attention(
        q.astype(f32), k.astype(f32), v.astype(f32), b, implementation="xla", **kw
    )


ATTENTION = [
    # (T, S, N, K, H, Hv, bias shape, options)
    (16, 16, 4, 4, 32, 32, None, {}),
    (16, 24, 4, 2, 32, 32, None, {"is_causal": True}),
    (12, 12, 4, 1, 16, 16, (1, 4, 12, 12), {"is_causal": True}),
    (12, 20, 2, 2, 16, 16, (2, 1, 12, 20), {}),
    (12, 20, 2, 2, 16, 16, (12, 20), {"scale": 0.3}),
    (16, 16, 2, 1, 16, 16, None, {"local_window_size": (3, 2)}),
    (16, 16, 2, 2, 16, 16, None, {"local_window_size": 4, "is_causal": True}),
]


@pytest.mark.parametrize(("t", "s", "n", "kh", "h", "hv", "bshape", "kw"), ATTENTION)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_attention_value_and_gradients_are_jaxs(t, s, n, kh, h, hv, bshape, kw, dtype):
    dt = jnp.dtype(dtype)
    q = _rand(2, t, n, h, seed=1).astype(dt)
    k = _rand(2, s, kh, h, seed=2).astype(dt)
    v = _rand(2, s, kh, hv, seed=3).astype(dt)
    args = [q, k, v] + ([] if bshape is None else [_rand(*bshape, seed=4).astype(dt)])
    tol = 2e-2 if dtype == "float16" else 6e-2
    got = jax.jit(lambda *a: pj.dot_product_attention(*a, **kw))(*args)
    assert got.shape == (2, t, n, hv) and got.dtype == dt
    _close(got, _jax_attention(*args, **kw), tol)
    ct = _rand(2, t, n, hv, seed=5).astype(dt)
    ours = _grads(lambda *a: pj.dot_product_attention(*a, **kw).astype(jnp.float32), ct, *args)
    theirs = _grads(lambda *a: _jax_attention(*a, **kw), ct.astype(jnp.float32), *args)
    for g, e in zip(ours, theirs, strict=True):
        assert g.dtype == dt
        _close(g, e, 2 * tol)


@pytest.mark.parametrize(
    ("mshape", "bshape", "kw"),
    [
        ((2, 1, 12, 20), None, {}),  # a padding mask per sequence
        ((12, 20), (1, 4, 12, 20), {"scale": 0.4}),  # with a bias: masked scores replace it
        ((1, 4, 12, 20), None, {}),  # per head, some rows fully masked
    ],
)
def test_attention_with_a_boolean_mask_is_jaxs(mshape, bshape, kw):
    dt = jnp.dtype("bfloat16")
    q = _rand(2, 12, 4, 16, seed=1).astype(dt)
    k = _rand(2, 20, 2, 16, seed=2).astype(dt)
    v = _rand(2, 20, 2, 16, seed=3).astype(dt)
    mask = jnp.asarray(np.random.default_rng(4).random(mshape) > 0.4)
    if len(mshape) == 4 and mshape[0] == 1:  # rows that attend to nothing: JAX averages
        mask = mask.at[0, 1, 3].set(False)
    bias = None if bshape is None else _rand(*bshape, seed=5).astype(dt)
    got = jax.jit(lambda *a: pj.dot_product_attention(*a, **kw))(q, k, v, bias, mask)
    f32 = jnp.float32
    want = jax.nn.dot_product_attention(
        q.astype(f32), k.astype(f32), v.astype(f32), None if bias is None else bias.astype(f32),
        mask, implementation="xla", **kw,
    )  # fmt: skip
    _close(got, want, 6e-2)
    ct = _rand(2, 12, 4, 16, seed=6).astype(dt)
    diff = (q, k, v) if bias is None else (q, k, v, bias)

    def ours(q, k, v, *b):
        return pj.dot_product_attention(q, k, v, *(b or (None,)), mask, **kw).astype(f32)

    def theirs(q, k, v, *b):
        b = (b[0].astype(f32),) if b else (None,)
        qkv = (a.astype(f32) for a in (q, k, v))
        return jax.nn.dot_product_attention(*qkv, *b, mask, implementation="xla", **kw)

    for g, e in zip(_grads(ours, ct, *diff), _grads(theirs, ct.astype(f32), *diff), strict=True):
        _close(g, e, 12e-2)


def test_attention_with_sequence_lengths_is_jaxs_on_the_valid_rows():
    dt = jnp.float16
    q = _rand(3, 10, 2, 16, seed=1).astype(dt)
    k = _rand(3, 14, 2, 16, seed=2).astype(dt)
    v = _rand(3, 14, 2, 16, seed=3).astype(dt)
    bias = _rand(3, 2, 10, 14, seed=4).astype(dt)
    ql = jnp.array([10, 4, 7], jnp.int32)
    kl = jnp.array([14, 9, 3], jnp.int32)
    kw = {"query_seq_lengths": ql, "key_value_seq_lengths": kl, "is_causal": True}
    rows = (np.arange(10)[None, :] < np.asarray(ql)[:, None])[:, :, None, None]
    got = pj.dot_product_attention(q, k, v, bias, **kw)
    ref = _jax_attention(q, k, v, bias, **kw)
    _close(np.where(rows, got, 0), np.where(rows, ref, 0), 2e-2)
    ct = jnp.where(rows, _rand(3, 10, 2, 16, seed=5), 0)  # padded rows: no cotangent
    ours = _grads(
        lambda *a: pj.dot_product_attention(*a, **kw).astype(jnp.float32), ct, q, k, v, bias
    )
    theirs = _grads(lambda *a: _jax_attention(*a, **kw), ct, q, k, v, bias)
    for g, e in zip(ours, theirs, strict=True):
        _close(g, e, 4e-2)
    # padded rows are 0, and the gradients at padded positions too: the cotangent there is moot
    assert not np.asarray(jnp.where(rows, 0, got)).any()
    ct_full = jnp.where(rows, ct, _rand(3, 10, 2, 16, seed=6))
    again = _grads(
        lambda *a: pj.dot_product_attention(*a, **kw).astype(jnp.float32), ct_full, q, k, v, bias
    )
    kv_rows = (np.arange(14)[None, :] < np.asarray(kl)[:, None])[:, :, None, None]
    for g, e in zip(again, ours, strict=True):
        _close(g, e, 1e-6)
    assert not np.asarray(jnp.where(rows, 0, again[0])).any()
    assert not np.asarray(jnp.where(kv_rows, 0, again[1])).any()
    assert not np.asarray(jnp.where(kv_rows, 0, again[2])).any()
    # either length alone: the other is the full length
    only_q = pj.dot_product_attention(q, k, v, query_seq_lengths=ql)
    _close(
        np.where(rows, only_q, 0),
        np.where(rows, _jax_attention(q, k, v, query_seq_lengths=ql), 0),
        2e-2,
    )


def test_alibi_is_a_slope_bias():
    from pycudnn.highlevel.attention._masks import alibi_slopes

    dt = jnp.float16
    q = _rand(2, 12, 4, 16, seed=1).astype(dt)
    k = _rand(2, 12, 4, 16, seed=2).astype(dt)
    v = _rand(2, 12, 4, 16, seed=3).astype(dt)
    slopes = alibi_slopes(4).reshape(4, 1, 1)
    bias = jnp.asarray(slopes * (np.arange(12)[None, :] - np.arange(12)[:, None]), jnp.float32)
    got = pj.dot_product_attention(q, k, v, is_causal=True, alibi=True)
    _close(got, _jax_attention(q, k, v, bias, is_causal=True), 2e-2)
    ct = _rand(2, 12, 4, 16, seed=5)
    ours = _grads(
        lambda *a: pj.dot_product_attention(*a, is_causal=True, alibi=True).astype(jnp.float32),
        ct,
        q,
        k,
        v,
    )
    theirs = _grads(lambda *a: _jax_attention(*a, bias, is_causal=True), ct, q, k, v)
    for g, e in zip(ours, theirs, strict=True):
        _close(g, e, 4e-2)


def test_attention_vmap_folds_the_batch_into_one_call():
    dt = jnp.float16
    q = _rand(3, 2, 8, 2, 16, seed=1).astype(dt)
    k = _rand(3, 2, 8, 2, 16, seed=2).astype(dt)
    f = lambda q, k: pj.dot_product_attention(q, k, k, is_causal=True)  # noqa: E731
    assert _calls_and_loops(jax.vmap(f), q, k) == (1, 0)
    got = jax.vmap(f)(q, k)
    for i in range(3):
        _close(got[i], f(q[i], k[i]), 1e-3)
    # a bias without the batch dim folds; one with it folds with the batch too
    for bias in (_rand(1, 2, 8, 8, seed=3).astype(dt), _rand(3, 2, 2, 8, 8, seed=3).astype(dt)):
        axes = (0, 0, None if bias.ndim == 4 else 0)
        fb = lambda q, k, b: pj.dot_product_attention(q, k, k, b)  # noqa: E731
        calls, _loops = _calls_and_loops(jax.vmap(fb, in_axes=axes), q, k, bias)
        assert calls == 1
        got = jax.vmap(fb, in_axes=axes)(q, k, bias)
        for i in range(3):
            _close(got[i], fb(q[i], k[i], bias if bias.ndim == 4 else bias[i]), 1e-3)
    grad = jax.vmap(jax.grad(lambda q, k: f(q, k).astype(jnp.float32).sum(), argnums=(0, 1)))
    dq, dk = grad(q, k)
    for i in range(3):
        eq, ek = jax.grad(lambda q, k: f(q, k).astype(jnp.float32).sum(), argnums=(0, 1))(
            q[i], k[i]
        )
        _close(dq[i], eq, 1e-3)
        _close(dk[i], ek, 1e-3)


# -- CTC: values and gradients against optax.ctc_loss and the float64 reference --------------------
def _ctc_case(seed, b=3, t=12, k=5, n=4):
    rng = np.random.default_rng(seed)
    logits = _rand(b, t, k, seed=seed, scale=2.0)
    labels = jnp.asarray(rng.integers(1, k, (b, n)), jnp.int32)
    label_lens = np.array([n, 1, n - 1][:b])
    input_lens = np.array([t, t - 2, n + 3][:b])
    lpad = jnp.asarray(np.arange(n)[None] >= label_lens[:, None], jnp.float32)
    ipad = jnp.asarray(np.arange(t)[None] >= input_lens[:, None], jnp.float32)
    return logits, ipad, labels, lpad


def test_ctc_loss_and_gradient_are_the_references():
    logits, ipad, labels, lpad = _ctc_case(1)
    got = jax.jit(pj.ctc_loss)(logits, ipad, labels, lpad)
    lens = np.asarray((lpad == 0).sum(1))
    packed = np.concatenate([np.asarray(labels)[i, : lens[i]] for i in range(3)])
    ilens = np.asarray((ipad == 0).sum(1))
    loss, grad = RA.ctc(np.asarray(logits).transpose(1, 0, 2), packed, lens, ilens)
    _close(got, loss, 1e-5)
    w = _rand(3, seed=9)
    (g,) = _grads(lambda x: pj.ctc_loss(x, ipad, labels, lpad), w, logits)
    _close(g, grad.transpose(1, 0, 2) * np.asarray(w)[:, None, None], 1e-5)


def test_ctc_loss_is_optaxs():
    optax = pytest.importorskip("optax")
    logits, ipad, labels, lpad = _ctc_case(2)
    _close(
        pj.ctc_loss(logits, ipad, labels, lpad), optax.ctc_loss(logits, ipad, labels, lpad), 1e-4
    )
    w = _rand(3, seed=9)
    (g,) = _grads(lambda x: pj.ctc_loss(x, ipad, labels, lpad), w, logits)
    (e,) = _grads(lambda x: optax.ctc_loss(x, ipad, labels, lpad), w, logits)
    _close(
        np.where(np.asarray(ipad)[..., None] == 0, g, 0),
        np.where(np.asarray(ipad)[..., None] == 0, e, 0),
        1e-4,
    )


def test_ctc_loss_with_another_blank_is_optaxs():
    optax = pytest.importorskip("optax")
    logits, ipad, labels, lpad = _ctc_case(4)
    labels = jnp.where(labels == 2, 0, labels)  # class 2 is the blank, 0 a label
    ours = lambda x: pj.ctc_loss(x, ipad, labels, lpad, blank_id=2)  # noqa: E731
    theirs = lambda x: optax.ctc_loss(x, ipad, labels, lpad, blank_id=2)  # noqa: E731
    _close(ours(logits), theirs(logits), 1e-4)
    w = _rand(3, seed=9)
    valid = np.asarray(ipad)[..., None] == 0
    (g,), (e,) = _grads(ours, w, logits), _grads(theirs, w, logits)
    _close(np.where(valid, g, 0), np.where(valid, e, 0), 1e-4)


def test_ctc_vmap_runs_per_example():
    logits, ipad, labels, lpad = _ctc_case(3)
    stack = lambda a: jnp.stack([a, a[::-1]])  # noqa: E731
    args = [stack(a) for a in (logits, ipad, labels, lpad)]
    got = jax.vmap(pj.ctc_loss)(*args)
    for i in range(2):
        _close(got[i], pj.ctc_loss(*(a[i] for a in args)), 1e-6)


# -- spatial transformer: values and gradients against a pure-JAX bilinear sampler -----------------
def _jax_affine_grid(theta, h, w):
    xs, ys = jnp.meshgrid(jnp.linspace(-1.0, 1.0, w), jnp.linspace(-1.0, 1.0, h))
    base = jnp.stack([xs, ys, jnp.ones_like(xs)], -1).astype(theta.dtype)
    return jnp.einsum("hwk,njk->nhwj", base, theta)


def _jax_grid_sample(x, grid):
    """Bilinear, zeros outside, align_corners=True; x (N, C, Hi, Wi)."""
    _n, _c, hi, wi = x.shape
    px = (grid[..., 0] + 1) * (wi - 1) / 2
    py = (grid[..., 1] + 1) * (hi - 1) / 2
    x0, y0 = jnp.floor(px), jnp.floor(py)
    out = 0.0
    nidx = jnp.arange(x.shape[0])[:, None, None]
    for dy, dx in ((0, 0), (0, 1), (1, 0), (1, 1)):
        ix, iy = x0 + dx, y0 + dy
        wgt = (1 - jnp.abs(px - ix)) * (1 - jnp.abs(py - iy))
        inside = (ix >= 0) & (ix < wi) & (iy >= 0) & (iy < hi)
        v = x[nidx, :, jnp.clip(iy, 0, hi - 1).astype(int), jnp.clip(ix, 0, wi - 1).astype(int)]
        out = out + jnp.where(inside, wgt, 0)[..., None] * v
    return jnp.moveaxis(out, -1, 1)


def _theta(n, seed):
    rng = np.random.default_rng(seed)
    base = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    return jnp.asarray(base * 0.8 + rng.standard_normal((n, 2, 3)) * 0.25, jnp.float32)


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("out_shape", [(5, 7), (8, 8)])
def test_spatial_transformer_value_and_gradients_are_a_jax_samplers(channels_last, out_shape):
    x = _rand(2, 3, 8, 9, seed=1)
    theta = _theta(2, 2)
    xin = jnp.moveaxis(x, 1, -1) if channels_last else x

    def ours(theta, x):
        y = pj.spatial_transformer(theta, x, out_shape, channels_last=channels_last)
        return jnp.moveaxis(y, -1, 1) if channels_last else y

    def theirs(theta, x):
        x = jnp.moveaxis(x, -1, 1) if channels_last else x
        return _jax_grid_sample(x, _jax_affine_grid(theta, *out_shape))

    _close(jax.jit(ours)(theta, xin), theirs(theta, xin), 1e-5)
    ct = _rand(2, 3, *out_shape, seed=3)
    for g, e in zip(_grads(ours, ct, theta, xin), _grads(theirs, ct, theta, xin), strict=True):
        _close(g, e, 1e-4)


def test_affine_grid_and_grid_sample_alone_and_vmapped():
    theta = _theta(2, 4)
    _close(pj.affine_grid(theta, (4, 6)), _jax_affine_grid(theta, 4, 6), 1e-6)
    x = _rand(3, 2, 2, 6, 6, seed=5)
    grids = _rand(3, 2, 4, 5, 2, seed=6, scale=0.7)
    assert _calls_and_loops(jax.vmap(pj.grid_sample), x, grids) == (1, 0)
    got = jax.vmap(pj.grid_sample)(x, grids)
    for i in range(3):
        _close(got[i], _jax_grid_sample(x[i], grids[i]), 1e-5)
    ct = _rand(2, 2, 4, 5, seed=7)
    ours = _grads(pj.grid_sample, ct, x[0], grids[0])
    theirs = _grads(_jax_grid_sample, ct, x[0], grids[0])
    for g, e in zip(ours, theirs, strict=True):
        _close(g, e, 1e-4)


def test_the_ctc_call_gives_cudnn_the_packed_labels_prefix_and_checks_values(monkeypatch):
    """The GPU run's arguments, with the C calls replaced: the labels are XLA's buffer cut to
    the lengths' sum (read back), and the values are checked (``check_values=True``)."""
    from pycudnn.jax import _ctc
    from pycudnn.jax._frame import DeviceBuffer

    i32 = np.dtype("int32")
    args = [
        DeviceBuffer(0x1000, (7, 3, 5), np.dtype("float32"), 11),
        DeviceBuffer(0x2000, (12,), i32, 4),
        DeviceBuffer(0x3000, (3,), i32, 4),
        DeviceBuffer(0x4000, (3,), i32, 4),
    ]
    rets = [DeviceBuffer(0x5000, (3,), np.dtype("float32"), 11)] * 2
    seen = {}

    class _Host:
        def __init__(self, obj, stream=None):
            seen["read"] = (obj, stream)

        def get(self, stream=None):
            return np.array([3, 1, 2], np.int32)

    monkeypatch.setattr(_ctc, "views", lambda a, r: ("logits", "loss", "grad"))
    monkeypatch.setattr(_ctc.memory, "asarray", _Host)
    monkeypatch.setattr(_ctc, "dnn_ctc_loss", lambda *a, **kw: seen.update(call=(a, kw)))
    _ctc.CtcLoss("deterministic").run(args, rets, 77)
    a, kw = seen["call"]
    assert seen["read"] == (args[2], 77)
    assert a[0] == "logits" and a[2:] == (args[2], args[3], "deterministic")
    assert a[1] == DeviceBuffer(0x2000, (6,), i32, 4) and type(a[1]) is DeviceBuffer
    assert kw == {"check_values": True, "out": ("loss", "grad"), "stream": 77}


def test_the_attention_calls_give_cudnn_bnth_views_and_every_output(monkeypatch):
    """The GPU runs' arguments, with the C calls replaced: (B, T, N, H) buffers as (B, N, T, H)
    strided views in the high level's pointer order, the statistics packed, every output
    given."""
    from pycudnn.jax import _attention
    from pycudnn.jax._frame import DeviceBuffer

    f16, f32, i32 = np.dtype("float16"), np.dtype("float32"), np.dtype("int32")
    q = DeviceBuffer(0x100, (2, 5, 4, 8), f16, 10)
    k = DeviceBuffer(0x200, (2, 6, 2, 8), f16, 10)
    lq, lk = DeviceBuffer(0x300, (2,), i32, 4), DeviceBuffer(0x400, (2,), i32, 4)
    bias = DeviceBuffer(0x500, (1, 4, 5, 6), f16, 10)
    out = DeviceBuffer(0x600, (2, 5, 4, 8), f16, 10)
    stats = DeviceBuffer(0x700, (2, 4, 5, 1), f32, 11)
    seen = {}
    monkeypatch.setattr(_attention, "device_of", lambda buffers: 0)
    monkeypatch.setattr(_attention, "dnn_sdpa", lambda *a, **kw: seen.update(fwd=(a, kw)))
    monkeypatch.setattr(_attention, "dnn_sdpa_grad", lambda *a, **kw: seen.update(bwd=(a, kw)))
    request = _attention.Attention(0.5, True, 3, None, False, True, True, False)
    request.run([q, k, k, lq, lk, bias], [out, stats], 9)
    a, kw = seen["fwd"]
    assert [x.ptr for x in a] == [0x100, 0x200, 0x200]
    assert a[0].shape == (2, 4, 5, 8) and a[0].strides == (160, 8, 32, 1)
    assert a[1].shape == (2, 2, 6, 8) and a[1].strides == (96, 8, 16, 1)
    assert kw["out"].ptr == 0x600 and kw["out"].strides == (160, 8, 32, 1)
    assert kw["out_stats"].shape == (2, 4, 5, 1) and kw["out_stats"].strides == (20, 5, 1, 1)
    assert [kw[n].ptr for n in ("seq_lens_q", "seq_lens_kv", "attn_mask")] == [0x300, 0x400, 0x500]
    assert kw["attn_mask"].shape == (1, 4, 5, 6) and kw["attn_mask"].strides == (120, 30, 6, 1)
    assert (kw["training"], kw["is_causal"], kw["scale"], kw["left_bound"]) == (True, True, 0.5, 3)
    assert kw["right_bound"] is None and kw["alibi"] is False and kw["stream"] == 9
    grad = _attention.AttentionGrad(
        *(getattr(request, f.name) for f in dataclasses.fields(request))
    )
    dq, dk = DeviceBuffer(0x800, q.shape, f16, 10), DeviceBuffer(0x900, k.shape, f16, 10)
    grad.run([q, k, k, out, out, stats, lq, lk, bias], [dq, dk, dk], 9)
    a, kw = seen["bwd"]
    assert [x.ptr for x in a] == [0x100, 0x200, 0x200, 0x600, 0x600, 0x700]
    assert a[3].strides == a[4].strides == (160, 8, 32, 1) and a[5].strides == (20, 5, 1, 1)
    assert [x.ptr for x in kw["out_grads"]] == [0x800, 0x900, 0x900]
    assert kw["out_grads"][0].strides == (160, 8, 32, 1)
    assert kw["out_grads"][1].shape == (2, 2, 6, 8) and kw["out_grads"][1].strides == (96, 8, 16, 1)
    assert kw["attn_mask"].ptr == 0x500 and kw["seq_lens_q"].ptr == 0x300


def test_a_shape_polymorphic_export_runs_for_several_batch_and_sequence_sizes():
    export = pytest.importorskip("jax.export")
    checks = [export.DisabledSafetyCheck.custom_call(_ops.target_name(f)) for f in RA.FAMILIES]
    theta = _theta(1, 8)

    def model(q, x):
        a = pj.dot_product_attention(q, q, q, is_causal=True).astype(jnp.float32)
        t = jnp.broadcast_to(theta, (x.shape[0], 2, 3))
        return a.sum() + pj.spatial_transformer(t, x, (4, 5)).sum()

    b_, t_, n_, h_ = export.symbolic_shape("b, t, n, h")
    q_arg = jax.ShapeDtypeStruct((b_, t_, 2, 16), jnp.float16)
    x_arg = jax.ShapeDtypeStruct((n_, 3, h_, h_), jnp.float32)
    for f in (model, jax.grad(model, argnums=(0, 1))):
        exp = export.export(jax.jit(f), platforms=["cpu", "cuda"], disabled_checks=checks)(
            q_arg, x_arg
        )
        for b, t, n, h in ((1, 8, 2, 6), (3, 5, 1, 9)):
            q = _rand(b, t, 2, 16, seed=b).astype(jnp.float16)
            x = _rand(n, 3, h, h, seed=t)
            for g, e in zip(
                jax.tree_util.tree_leaves(exp.call(q, x)),
                jax.tree_util.tree_leaves(f(q, x)),
                strict=True,
            ):
                _close(g, e, 1e-3)
