"""GPU tests of the transformer operations (marker ``gpu``; skipped without a device):
``dnn_matmul``, ``dnn_layer_norm`` / ``dnn_rms_norm`` and their gradients, ``dnn_sdpa`` /
``dnn_sdpa_grad``.

Run on the GPU machine:
``PYTHONPATH=. python3 -m pytest -m gpu -q -s tests/highlevel/test_transformer_gpu.py``.

Inputs are fresh random arrays rounded to the data type first; the references are float64
NumPy (``tests/support/references.py``; their gradients are checked by finite differences in
``test_transformer.py``), and torch's ``F.layer_norm`` / ``F.rms_norm`` / autograd in float64
where torch is installed. Outputs given as ``out=`` are NaN-poisoned first, and every result is
checked for NaN (an element cuDNN did not write).

Tolerances. The matmul and the norms: ``max |got - ref| / max |ref|`` within 1e-4 (float32,
TF32 off), 5e-3 (float16), 2e-2 (bfloat16): float32 accumulation, one rounding of the result to
the data type (bfloat16 keeps 8 significant bits, float16 11). Attention runs float16 and
bfloat16 only (cuDNN's fused flash-attention engines have no float32 variant), and it rounds
the softmax probabilities to the data type before the second product (and, backward, ``dS``
before two of its products), so we compare the relative L2 error ``|got - ref| / |ref|``:
< 5e-3 (fp16) and < 2e-2 (bf16) forward, < 1e-2 (fp16) and < 2e-2 (bf16) backward -- a few
roundings of 2**-11 / 2**-8 each, averaged over the rows. The log-sum-exp statistics are float32
from float32 accumulations: within 1e-2 absolute. One summary line per family is printed (``-s``).
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
from references import (
    act_ref,
    layer_norm_grad_ref,
    layer_norm_ref,
    rms_norm_grad_ref,
    rms_norm_ref,
    sdpa_grad_ref,
    sdpa_ref,
)

import pycudnn
from pycudnn import errors

pytestmark = pytest.mark.gpu

ml_dtypes = pytest.importorskip("ml_dtypes")
NP = {
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "fp16": np.dtype(np.float16),
    "fp32": np.dtype(np.float32),
}
TOL = {"bf16": 2e-2, "fp16": 5e-3, "fp32": 1e-4}  # max-abs error relative to max |ref|
ATTN_FWD = {"bf16": 2e-2, "fp16": 5e-3}  # relative L2
ATTN_BWD = {"bf16": 2e-2, "fp16": 1e-2}  # relative L2
STATS: dict[str, list[float]] = collections.defaultdict(list)
rng = np.random.default_rng()
#: float32 matmuls run on TF32 tensor cores (10-bit mantissas): max error over max |ref|
TF32_TOL = 1e-2


@pytest.fixture(scope="module", autouse=True)
def _config():
    old = pycudnn.config.allow_tf32
    pycudnn.config.allow_tf32 = False
    yield
    pycudnn.config.allow_tf32 = old


def dev(a64, dt):
    """(device array, its values in float64) of *a64* rounded to *dt*."""
    host = np.ascontiguousarray(np.asarray(a64).astype(NP[dt]))
    return pycudnn.to_device(host), host.astype(np.float64)


def poisoned(shape, dt, order=None):
    """A NaN-filled device array; *order*: the memory order of its dims (a permuted view)."""
    if order is None:
        out = pycudnn.empty(shape, NP[dt])
        out.fill_(float("nan"))
        return out
    base = pycudnn.empty(tuple(shape[i] for i in order), NP[dt])
    base.fill_(float("nan"))
    return base.transpose(*np.argsort(order))


def host(a):
    got = np.asarray(a.get(), np.float64)
    assert not np.isnan(got).any(), "NaN in the output (an element was not written)"
    return got


def max_err(got, want):
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def l2_err(got, want):
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def record(family, err):
    STATS[family].append(err)
    return err


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


# ==================================================================================================
# dnn_matmul
# ==================================================================================================
MM_SHAPES = [  # (a, b, how b is stored)
    ((64, 128), (128, 96), "c"),
    ((3, 33, 40), (3, 40, 24), "c"),
    ((2, 1, 16, 32), (1, 32, 8), "c"),  # batch broadcast of b: (2, 1, 16, 8)
    ((5, 48, 64), (64, 40), "t"),  # x @ w.T with w (40, 64): a transposed view
    ((1, 40, 64), (4, 64, 24), "t"),
]


def test_matmul_two_way_broadcast_is_refused_naming_it():
    a, _ = dev(rng.standard_normal((2, 1, 16, 32)), "bf16")
    b, _ = dev(rng.standard_normal((3, 32, 8)), "bf16")
    with pytest.raises(errors.NotSupportedError, match="one operand only"):
        pycudnn.dnn_matmul(a, b)


@pytest.mark.parametrize("dt", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize(("sa", "sb", "store"), MM_SHAPES)
def test_matmul(dt, sa, sb, store):
    a, a64 = dev(rng.standard_normal(sa), dt)
    if store == "t":  # b is the transposed view of a (..., N, K) array
        w, w64 = dev(rng.standard_normal((*sb[:-2], sb[-1], sb[-2])), dt)
        b = w.transpose(*range(len(sb) - 2), len(sb) - 1, len(sb) - 2)
        b64 = np.swapaxes(w64, -1, -2)
    else:
        b, b64 = dev(rng.standard_normal(sb), dt)
    want = a64 @ b64
    tol = TOL[dt]
    if dt == "fp32":  # cuDNN's float32 matmul engines are TF32 (9.19, H100): refused unless allowed
        with pytest.raises(errors.NotSupportedError, match="allow_tf32"):
            pycudnn.dnn_matmul(a, b)
        tol = TF32_TOL
    with pycudnn.config.override(allow_tf32=dt == "fp32"):
        got = pycudnn.dnn_matmul(a, b)
        assert got.shape == want.shape and got.is_c_contiguous
        assert record("matmul", max_err(host(got), want)) <= tol
        out = poisoned(want.shape, dt)
        assert pycudnn.dnn_matmul(a, b, out=out) is out
    assert max_err(host(out), want) <= tol


ACTS = [
    None,
    "relu",
    "gelu",
    "gelu_tanh",
    "silu",
    "sigmoid",
    "tanh",
    "elu",
    ("elu", 0.5),
    ("clipped_relu", 0.75),
]
# every activation in bfloat16; a few in float16 and float32 (each is a graph of its own)
EPILOGUES = (
    [("bf16", a) for a in ACTS]
    + [("fp16", a) for a in ("relu", "gelu_tanh", ("clipped_relu", 0.75))]
    + [("fp32", a) for a in (None, "relu", "sigmoid")]
)


def _act(v, act):
    if act is None:
        return v
    name, coef = (act, 1.0) if isinstance(act, str) else act
    return act_ref(v, "swish" if name == "silu" else name, coef)


@pytest.mark.parametrize(("dt", "act"), EPILOGUES, ids=[f"{d}-{a}" for d, a in EPILOGUES])
def test_matmul_bias_activation(dt, act):
    x, x64 = dev(rng.standard_normal((2, 32, 64)), dt)
    w, w64 = dev(rng.standard_normal((48, 64)) / 8, dt)
    bias, b64 = dev(rng.standard_normal(48), dt)
    want = _act(x64 @ w64.T + b64, act)
    out = poisoned((2, 32, 48), dt, order=(1, 0, 2))  # a non-C-order output
    try:
        with pycudnn.config.override(allow_tf32=dt == "fp32"):
            got = pycudnn.dnn_matmul(x, w.T, bias=bias, activation=act, out=out)
    except errors.NotSupportedError as exc:
        STATS["matmul epilogue without an engine"].append(0.0)
        pytest.skip(f"no engine for {dt} matmul+bias+{act}: {str(exc)[:200]}")
    assert got is out
    tol = TF32_TOL if dt == "fp32" else TOL[dt]
    assert record("matmul bias+act", max_err(host(out), want)) <= tol


@pytest.mark.parametrize("dt", ["bf16", "fp16"])
def test_matmul_clipped_relu_without_bias_is_refused_and_with_a_zero_bias_is_right(dt):
    """cuDNN 9.19's engines ignore a ReLU's upper clip applied straight to the product (found by
    the GPU fuzzer: relative errors of 4-6), so dnn_matmul refuses that call; with a bias (here
    zeros) the clip is honoured."""
    x, x64 = dev(rng.standard_normal((55, 87)), dt)
    w, w64 = dev(rng.standard_normal((87, 8)), dt)
    with pytest.raises(errors.NotSupportedError, match="ignore the upper clip"):
        pycudnn.dnn_matmul(x, w, activation=("clipped_relu", 1.5))
    zero, _ = dev(np.zeros(8), dt)
    got = pycudnn.dnn_matmul(x, w, bias=zero, activation=("clipped_relu", 1.5))
    want = np.clip(x64 @ w64, 0.0, 1.5)
    assert record("matmul clipped_relu, zero bias", max_err(host(got), want)) <= TOL[dt]


def test_matmul_against_torch():
    torch = _torch()
    if torch is None:
        pytest.skip("needs torch")
    import torch.nn.functional as F

    x = torch.randn(3, 40, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(96, 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(96, device="cuda", dtype=torch.bfloat16)
    got = torch.from_dlpack(pycudnn.dnn_matmul(x, w.t(), bias=b, activation="gelu"))
    want = F.gelu(F.linear(x.double(), w.double(), b.double()))
    assert ((got.double() - want).abs().max() / want.abs().max()).item() <= TOL["bf16"]


# ==================================================================================================
# dnn_layer_norm / dnn_rms_norm
# ==================================================================================================
NORM_CASES = [  # (shape, nn, layout)
    ((33, 200), 1, "c"),
    ((2, 33, 256), 1, "c"),
    ((4, 6, 64), 2, "c"),
    ((33, 200), 1, "rows"),  # rows of a wider buffer (row pitch 264)
    ((2, 7, 96), 1, "rows"),
]


def _norm_input(shape, nn, dt, layout):
    x64 = rng.standard_normal(shape) * 2 + 0.5
    if layout == "rows":
        wide = np.zeros((*shape[:-1], shape[-1] + 64))
        wide[..., : shape[-1]] = x64
        big, big64 = dev(wide, dt)
        return big[..., : shape[-1]], big64[..., : shape[-1]]
    return dev(x64, dt)


@pytest.mark.parametrize("dt", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize(("shape", "nn", "layout"), NORM_CASES)
@pytest.mark.parametrize("params", ["none", "same", "fp32"])
def test_layer_norm_forward_backward(dt, shape, nn, layout, params):
    ns = shape[len(shape) - nn :]
    x, x64 = _norm_input(shape, nn, dt, layout)
    gamma = beta = g64 = b64 = None
    if params != "none":
        pdt = "fp32" if params == "fp32" else dt
        gamma, g64 = dev(rng.standard_normal(ns), pdt)
        beta, b64 = dev(rng.standard_normal(ns), pdt)
    eps = 1e-5
    out = poisoned(shape, dt)
    y, mean, inv = pycudnn.dnn_layer_norm(x, ns, gamma, beta, eps, out=out)
    assert y is out
    wy, wmean, winv = layer_norm_ref(x64, nn, g64, b64, eps)
    assert mean.shape == wmean.shape and inv.shape == winv.shape
    assert record("layer norm fwd", max_err(host(y), wy)) <= TOL[dt]
    assert max_err(host(mean), wmean) <= 1e-4 and max_err(host(inv), winv) <= 1e-4
    y2, m2, i2 = pycudnn.dnn_layer_norm(x, ns, gamma, beta, eps, training=False)
    assert m2 is None and i2 is None and max_err(host(y2), wy) <= TOL[dt]
    dy, dy64 = dev(rng.standard_normal(shape), dt)
    dx, dgamma, dbeta = pycudnn.dnn_layer_norm_grad(dy, x, mean, inv, ns, gamma)
    wdx, wdg, wdb = layer_norm_grad_ref(dy64, x64, nn, g64, eps)
    assert record("layer norm bwd", max_err(host(dx), wdx)) <= 2 * TOL[dt]
    if gamma is None:
        assert dgamma is None and dbeta is None
    else:
        assert dgamma.dtype == gamma.dtype and dgamma.shape == ns
        assert max_err(host(dgamma), wdg) <= 2 * TOL[dt]
        assert max_err(host(dbeta), wdb) <= 2 * TOL[dt]


@pytest.mark.parametrize("dt", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize(("shape", "nn", "layout"), NORM_CASES)
@pytest.mark.parametrize("params", ["none", "same"])
def test_rms_norm_forward_backward(dt, shape, nn, layout, params):
    ns = shape[len(shape) - nn :]
    x, x64 = _norm_input(shape, nn, dt, layout)
    gamma = g64 = None
    if params != "none":
        gamma, g64 = dev(rng.standard_normal(ns), dt)
    eps = 1e-6
    out = poisoned(shape, dt)
    y, inv = pycudnn.dnn_rms_norm(x, ns, gamma, eps, out=out)
    assert y is out
    wy, winv = rms_norm_ref(x64, nn, g64, eps)
    assert record("rms norm fwd", max_err(host(y), wy)) <= TOL[dt]
    assert max_err(host(inv), winv) <= 1e-4
    dy, dy64 = dev(rng.standard_normal(shape), dt)
    dx, dgamma = pycudnn.dnn_rms_norm_grad(dy, x, inv, ns, gamma)
    wdx, wdg = rms_norm_grad_ref(dy64, x64, nn, g64, eps)
    assert record("rms norm bwd", max_err(host(dx), wdx)) <= 2 * TOL[dt]
    if gamma is None:
        assert dgamma is None
    else:
        assert max_err(host(dgamma), wdg) <= 2 * TOL[dt]


@pytest.mark.parametrize("dt", ["bf16", "fp32"])
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_norms_given_statistics_and_gradients(dt, rms):
    """``out_mean``/``out_invstd``/``out_invrms`` and ``out_grads`` (NaN-poisoned) are written
    with the references' numbers, twice (a repeated call runs the cached entry on them)."""
    shape, nn, eps = (3, 40, 256), 1, 1e-5
    ns = shape[-1:]
    x, x64 = dev(rng.standard_normal(shape) * 2 + 0.5, dt)
    gamma, g64 = dev(rng.standard_normal(ns), dt)
    beta, b64 = dev(rng.standard_normal(ns), dt)
    out = poisoned(shape, dt)
    stats = tuple(poisoned((3, 40, 1), "fp32") for _ in range(1 if rms else 2))
    for _ in range(2):
        if rms:
            got = pycudnn.dnn_rms_norm(x, ns, gamma, eps, out=out, out_invrms=stats[0])
        else:
            got = pycudnn.dnn_layer_norm(
                x, ns, gamma, beta, eps, out=out, out_mean=stats[0], out_invstd=stats[1]
            )
        assert got[0] is out and all(g is s for g, s in zip(got[1:], stats, strict=True))
    want = rms_norm_ref(x64, nn, g64, eps) if rms else layer_norm_ref(x64, nn, g64, b64, eps)
    assert max_err(host(out), want[0]) <= TOL[dt]
    for s, w in zip(stats, want[1:], strict=True):
        assert max_err(host(s), w) <= 1e-4
    dy, dy64 = dev(rng.standard_normal(shape), dt)
    grads = (poisoned(shape, dt), *(poisoned(ns, dt) for _ in range(1 if rms else 2)))
    for _ in range(2):
        if rms:
            got = pycudnn.dnn_rms_norm_grad(dy, x, stats[0], ns, gamma, out_grads=grads)
        else:
            got = pycudnn.dnn_layer_norm_grad(dy, x, *stats, ns, gamma, out_grads=grads)
        assert all(g is w for g, w in zip(got, grads, strict=True))
    ref = rms_norm_grad_ref(dy64, x64, nn, g64, eps) if rms else layer_norm_grad_ref(
        dy64, x64, nn, g64, eps)  # fmt: skip
    for g, w in zip(grads, ref, strict=True):
        assert max_err(host(g), w) <= 2 * TOL[dt]


@pytest.mark.parametrize("dt", ["bf16", "fp32"])
def test_norms_against_torch(dt):
    torch = _torch()
    if torch is None:
        pytest.skip("needs torch")
    import torch.nn.functional as F

    tdt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dt]
    x = torch.randn(5, 33, 200, device="cuda", dtype=tdt)
    g = torch.randn(200, device="cuda", dtype=tdt)
    b = torch.randn(200, device="cuda", dtype=tdt)
    dy = torch.randn_like(x)
    xr, gr, br = (t.double().requires_grad_() for t in (x, g, b))
    want = F.layer_norm(xr, (200,), gr, br, 1e-5)
    want.backward(dy.double())
    y, mean, inv = pycudnn.dnn_layer_norm(x, (200,), g, b, 1e-5)
    dx, dg, db = pycudnn.dnn_layer_norm_grad(dy, x, mean, inv, (200,), g)
    for got, ref in ((y, want), (dx, xr.grad), (dg, gr.grad), (db, br.grad)):
        got = torch.from_dlpack(got).double()
        assert ((got - ref).abs().max() / ref.abs().max()).item() <= 2 * TOL[dt]
    if not hasattr(F, "rms_norm"):
        return
    xr, gr = (t.double().requires_grad_() for t in (x, g))
    want = F.rms_norm(xr, (200,), gr, 1e-6)
    want.backward(dy.double())
    y, inv = pycudnn.dnn_rms_norm(x, (200,), g, 1e-6)
    dx, dg = pycudnn.dnn_rms_norm_grad(dy, x, inv, (200,), g)
    for got, ref in ((y, want), (dx, xr.grad), (dg, gr.grad)):
        got = torch.from_dlpack(got).double()
        assert ((got - ref).abs().max() / ref.abs().max()).item() <= 2 * TOL[dt]


# ==================================================================================================
# dnn_sdpa / dnn_sdpa_grad
# ==================================================================================================
def qkv(dt, b, h, hk, sq, skv, d, bshd=False):
    """q, k, v (B, H, S, D) device arrays -- transposed views of (B, S, H, D) arrays with
    *bshd* -- and their float64 values."""
    out = []
    for heads, s in ((h, sq), (hk, skv), (hk, skv)):
        if bshd:
            a, a64 = dev(rng.standard_normal((b, s, heads, d)), dt)
            out += [a.transpose(0, 2, 1, 3), a64.transpose(0, 2, 1, 3)]
        else:
            out += list(dev(rng.standard_normal((b, heads, s, d)), dt))
    return out


def _valid(a, lens):
    """The rows of each batch below its length, concatenated (all rows without *lens*)."""
    if lens is None:
        return a.reshape(-1)
    return np.concatenate([a[i, :, :n].reshape(-1) for i, n in enumerate(lens)])


FWD_CASES = [  # (dt, causal, h, hk, sq, skv, d, bshd)
    ("bf16", False, 4, 4, 128, 128, 64, False),
    ("bf16", True, 4, 4, 128, 128, 64, False),
    ("fp16", False, 4, 4, 128, 128, 64, False),
    ("fp16", True, 8, 2, 96, 96, 64, True),  # GQA, (B, S, H, D)
    ("bf16", False, 8, 1, 64, 160, 128, True),  # MQA, S_q != S_kv
    ("fp16", True, 4, 1, 100, 100, 32, False),  # MQA, a sequence length not a tile multiple
]


@pytest.mark.parametrize(("dt", "causal", "h", "hk", "sq", "skv", "d", "bshd"), FWD_CASES)
def test_sdpa_forward(dt, causal, h, hk, sq, skv, d, bshd):
    b = 2
    q, q64, k, k64, v, v64 = qkv(dt, b, h, hk, sq, skv, d, bshd)
    out = poisoned((b, h, sq, d), dt, order=(0, 2, 1, 3) if bshd else None)
    o, stats = pycudnn.dnn_sdpa(q, k, v, is_causal=causal, training=True, out=out)
    assert o is out and stats.shape == (b, h, sq, 1)
    want, lse = sdpa_ref(q64, k64, v64, causal)
    assert record("sdpa fwd", l2_err(host(o), want)) < ATTN_FWD[dt]
    assert float(np.abs(host(stats) - lse).max()) < 1e-2
    if bshd:  # a new output (inference): q's memory order
        o2 = pycudnn.dnn_sdpa(q, k, v, is_causal=causal)
        assert _elstrides(o2) == _elstrides(q)
        assert l2_err(host(o2), want) < ATTN_FWD[dt]


def _elstrides(a):
    """Element strides of the dims longer than 1 (a size-1 dim's stride means nothing)."""
    return tuple(s // a.itemsize for s, n in zip(a.strides, a.shape, strict=True) if n > 1)


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_forward_padding(causal):
    dt, b, h, s, d = "bf16", 3, 4, 128, 64
    q, q64, k, k64, v, v64 = qkv(dt, b, h, h, s, s, d)
    lq, lkv = [128, 70, 5], [128, 64, 100]
    sq_d = pycudnn.to_device(np.array(lq, np.int32))
    skv_d = pycudnn.to_device(np.array(lkv, np.int32))
    o, stats = pycudnn.dnn_sdpa(
        q, k, v, is_causal=causal, training=True, seq_lens_q=sq_d, seq_lens_kv=skv_d
    )
    want, lse = sdpa_ref(q64, k64, v64, causal, lens_q=lq, lens_kv=lkv)
    got = np.asarray(o.get(), np.float64)
    g, w = _valid(got, lq), _valid(want, lq)
    assert not np.isnan(g).any()
    assert record("sdpa fwd padding", l2_err(g, w)) < ATTN_FWD[dt]
    st = _valid(np.asarray(stats.get(), np.float64), lq)
    assert float(np.abs(st - _valid(lse, lq)).max()) < 1e-2


def test_sdpa_inference_equals_training_output_and_default_scale():
    q, q64, k, k64, v, v64 = qkv("fp16", 2, 4, 4, 64, 64, 64)
    o_inf = host(pycudnn.dnn_sdpa(q, k, v))
    o_tr, _ = pycudnn.dnn_sdpa(q, k, v, training=True)
    assert np.array_equal(o_inf, host(o_tr))
    o_sc = host(pycudnn.dnn_sdpa(q, k, v, scale=0.3))
    want, _ = sdpa_ref(q64, k64, v64, scale=0.3)
    assert l2_err(o_sc, want) < ATTN_FWD["fp16"]


BWD_CASES = [  # (dt, causal, h, hk, s, d, bshd, also the deterministic variant)
    ("bf16", False, 4, 4, 128, 64, False, True),
    ("bf16", True, 4, 2, 128, 64, False, False),
    ("fp16", True, 4, 4, 128, 64, False, True),
    ("fp16", False, 8, 1, 96, 64, True, False),
    ("bf16", True, 4, 4, 64, 128, True, False),
]


@pytest.mark.parametrize(("dt", "causal", "h", "hk", "s", "d", "bshd", "det"), BWD_CASES)
def test_sdpa_backward(dt, causal, h, hk, s, d, bshd, det):
    b = 2
    q, q64, k, k64, v, v64 = qkv(dt, b, h, hk, s, s, d, bshd)
    o, stats = pycudnn.dnn_sdpa(q, k, v, is_causal=causal, training=True)
    do, do64 = dev(rng.standard_normal((b, h, s, d)), dt)
    dq, dk, dv = pycudnn.dnn_sdpa_grad(q, k, v, o, do, stats, is_causal=causal)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    if bshd:  # gradients in their operand's memory order
        assert _elstrides(dq) == _elstrides(q) and _elstrides(dk) == _elstrides(k)
    # the reference from the forward's rounded output (what the backward is given)
    wq, wk, wv = sdpa_grad_ref(q64, k64, v64, do64, causal)
    errs = [l2_err(host(g), w) for g, w in ((dq, wq), (dk, wk), (dv, wv))]
    record("sdpa bwd", max(errs))
    assert max(errs) < ATTN_BWD[dt], errs
    # again: the same gradients (the float32 dQ accumulator starts from zero every call)
    dq2, dk2, dv2 = pycudnn.dnn_sdpa_grad(q, k, v, o, do, stats, is_causal=causal)
    assert l2_err(host(dq2), host(dq)) < 1e-3
    assert l2_err(host(dk2), host(dk)) < 1e-3 and l2_err(host(dv2), host(dv)) < 1e-3
    if not det:
        return
    # deterministic: cuDNN's variant without the accumulator, the same values
    dq3, dk3, dv3 = pycudnn.dnn_sdpa_grad(
        q, k, v, o, do, stats, is_causal=causal, deterministic=True
    )
    for got, ref in ((dq3, wq), (dk3, wk), (dv3, wv)):
        assert l2_err(host(got), ref) < ATTN_BWD[dt]
    dq4, _, _ = pycudnn.dnn_sdpa_grad(q, k, v, o, do, stats, is_causal=causal, deterministic=True)
    assert np.array_equal(host(dq4), host(dq3))  # deterministic means bitwise


def test_sdpa_backward_padding():
    dt, b, h, s, d = "bf16", 3, 4, 128, 64
    q, q64, k, k64, v, v64 = qkv(dt, b, h, h, s, s, d)
    lq, lkv = [128, 70, 40], [128, 64, 100]
    sq_d = pycudnn.to_device(np.array(lq, np.int32))
    skv_d = pycudnn.to_device(np.array(lkv, np.int32))
    o, stats = pycudnn.dnn_sdpa(q, k, v, training=True, seq_lens_q=sq_d, seq_lens_kv=skv_d)
    do64 = rng.standard_normal((b, h, s, d))
    for i, n in enumerate(lq):
        do64[i, :, n:] = 0  # no gradient flows from padded rows
    do, do64 = dev(do64, dt)
    dq, dk, dv = pycudnn.dnn_sdpa_grad(q, k, v, o, do, stats, seq_lens_q=sq_d, seq_lens_kv=skv_d)
    wq, wk, wv = sdpa_grad_ref(q64, k64, v64, do64, lens_q=lq, lens_kv=lkv)
    errs = [
        l2_err(_valid(np.asarray(dq.get(), np.float64), lq), _valid(wq, lq)),
        l2_err(_valid(np.asarray(dk.get(), np.float64), lkv), _valid(wk, lkv)),
        l2_err(_valid(np.asarray(dv.get(), np.float64), lkv), _valid(wv, lkv)),
    ]
    record("sdpa bwd padding", max(errs))
    assert max(errs) < ATTN_BWD[dt], errs


def test_sdpa_backward_against_torch_autograd():
    torch = _torch()
    if torch is None:
        pytest.skip("needs torch")
    q = torch.randn(2, 4, 128, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(2, 2, 128, 64, device="cuda", dtype=torch.float16)
    v = torch.randn(2, 2, 128, 64, device="cuda", dtype=torch.float16)
    do = torch.randn_like(q)
    o, stats = pycudnn.dnn_sdpa(q, k, v, is_causal=True, training=True)
    dq, dk, dv = pycudnn.dnn_sdpa_grad(q, k, v, o, do, stats, is_causal=True)
    qr, kr, vr = (t.double().requires_grad_() for t in (q, k, v))
    s = (qr @ kr.repeat_interleave(2, 1).transpose(-1, -2)) / 8.0
    s = s.masked_fill(~torch.ones(128, 128, dtype=torch.bool, device="cuda").tril(), float("-inf"))
    ref = torch.softmax(s, -1) @ vr.repeat_interleave(2, 1)
    ref.backward(do.double())
    for got, want in ((o, ref.detach()), (dq, qr.grad), (dk, kr.grad), (dv, vr.grad)):
        got = torch.from_dlpack(got).double()
        assert ((got - want).norm() / want.norm()).item() < ATTN_BWD["fp16"]


@pytest.mark.parametrize("dt", ["bf16", "fp16"])
def test_sdpa_dropout(dt):
    b, h, sq, skv = 2, 4, 128, 64
    p = 0.25
    q, q64 = dev(rng.standard_normal((b, h, sq, 64)), dt)
    k, k64 = dev(rng.standard_normal((b, h, skv, 64)), dt)
    # V = I (S_kv = D_v): the output is the dropped-out probabilities themselves, so the mask
    # cuDNN drew is read back from it (zero where a weight was dropped)
    eye = np.broadcast_to(np.eye(skv), (b, h, skv, skv))
    v, v64 = dev(eye, dt)
    o1, st1 = pycudnn.dnn_sdpa(q, k, v, dropout_p=p, seed=1234, training=True)
    o1 = host(o1)
    o2, st2 = pycudnn.dnn_sdpa(q, k, v, dropout_p=p, seed=1234, training=True)
    assert np.array_equal(o1, host(o2)), "the same seed must give the same mask"
    o3, _ = pycudnn.dnn_sdpa(q, k, v, dropout_p=p, seed=99, training=True)
    assert not np.array_equal(o1, host(o3)), "another seed must give another mask"
    plain = host(pycudnn.dnn_sdpa(q, k, v))
    assert np.array_equal(host(pycudnn.dnn_sdpa(q, k, v, dropout_p=0.0, seed=5)), plain)
    mask = (o1 != 0).astype(np.float64)
    kept = float(mask.mean())
    assert abs(kept - (1 - p)) < 0.02, f"kept {kept:.3f} of the weights, expected {1 - p}"
    want, lse = sdpa_ref(q64, k64, v64, drop_mask=mask, dropout_p=p)
    assert record("sdpa dropout fwd", l2_err(o1, want)) < ATTN_FWD[dt]
    assert float(np.abs(host(st1) - lse).max()) < 1e-2  # the statistics ignore dropout
    # backward with the same seed regenerates the mask
    do, do64 = dev(rng.standard_normal((b, h, sq, skv)), dt)
    dq, dk, dv = pycudnn.dnn_sdpa_grad(q, k, v, o2, do, st2, dropout_p=p, seed=1234)
    wq, wk, wv = sdpa_grad_ref(q64, k64, v64, do64, drop_mask=mask, dropout_p=p)
    errs = [l2_err(host(g), w) for g, w in ((dq, wq), (dk, wk), (dv, wv))]
    record("sdpa dropout bwd", max(errs))
    assert max(errs) < ATTN_BWD[dt], errs
    dq2, _, _ = pycudnn.dnn_sdpa_grad(
        q, k, v, o2, do, st2, dropout_p=p, seed=1234, deterministic=True
    )
    assert l2_err(host(dq2), wq) < ATTN_BWD[dt]


def test_sdpa_mqa_bshd_out_and_new_output_layout():
    q, _q64, k, _k, v, _v = qkv("bf16", 2, 8, 1, 96, 96, 64, bshd=True)
    o = pycudnn.dnn_sdpa(q, k, v, is_causal=True)
    assert _elstrides(o) == _elstrides(q)  # (B, S, H, D) in memory, like q


def test_zz_summary():
    """One line per family (read with ``-s``)."""
    for family, errs in sorted(STATS.items()):
        print(f"\nTRANSFORMER {family}: {len(errs)} cases, max rel err {max(errs):.2e}", end="")
    print()


@pytest.mark.parametrize("bshd", [False, True])
def test_sdpa_given_stats_and_gradients(bshd):
    """``out_stats`` and ``out_grads`` (NaN-poisoned) are written with the numbers of the
    allocated outputs, twice (a repeated call runs the cached entry on the same arrays)."""
    dt, b, h, hk, s, d = "bf16", 2, 4, 2, 128, 64
    q, q64, k, k64, v, v64 = qkv(dt, b, h, hk, s, s, d, bshd)
    order = (0, 2, 1, 3) if bshd else None
    out = poisoned((b, h, s, d), dt, order=order)
    st = poisoned((b, h, s, 1), "fp32")
    for _ in range(2):
        o, stats = pycudnn.dnn_sdpa(q, k, v, is_causal=True, training=True, out=out, out_stats=st)
        assert o is out and stats is st
    want, lse = sdpa_ref(q64, k64, v64, True)
    assert l2_err(host(o), want) < ATTN_FWD[dt]
    assert float(np.abs(host(st) - lse).max()) < 1e-2
    do, do64 = dev(rng.standard_normal((b, h, s, d)), dt)
    grads = tuple(
        poisoned(shape, dt, order=order) for shape in ((b, h, s, d), (b, hk, s, d), (b, hk, s, d))
    )
    for _ in range(2):
        got = pycudnn.dnn_sdpa_grad(q, k, v, o, do, st, is_causal=True, out_grads=grads)
        assert all(g is w for g, w in zip(got, grads, strict=True))
    wq, wk, wv = sdpa_grad_ref(q64, k64, v64, do64, True)
    errs = [l2_err(host(g), w) for g, w in zip(grads, (wq, wk, wv), strict=True)]
    assert max(errs) < ATTN_BWD[dt], errs
