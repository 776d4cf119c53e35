"""GPU fuzz specs of issue 30's surface, registered into ``_fuzz_highlevel_child``'s ``SPECS``.

Imported by ``_fuzz_highlevel_child.py`` (which aliases itself under its module name first, so
these specs share its registry, ``execute`` and figures: one fuzzer mechanism). Groups:

* ``matmul``: ``dnn_matmul`` with batch broadcast (either operand), transposed views, a bias,
  every activation, float16/bfloat16, and float32 under ``pycudnn.config.override(allow_tf32=
  True)`` (compared with a float32 reference; the others with float64), tolerances scaled by
  the dtype and by sqrt(K);
* ``norms``: ``dnn_layer_norm``/``dnn_rms_norm`` (training and inference) and their gradients
  ``dnn_layer_norm_grad``/``dnn_rms_norm_grad`` on the forward's statistics;
* ``sdpa``: ``dnn_sdpa``/``dnn_sdpa_grad``: causal or not, GQA/MQA, padding lengths, head dims
  64/128, S 1..300, float16/bfloat16 (relative L2 against float64, valid rows only); dropout
  checked for shape, finiteness and bitwise repeatability with the same seed;
* ``graph``: random valid builder graphs (``pycudnn.graph.Graph``: conv+bias+activation,
  matmul+pointwise chains with a by-value scalar, matmul+row reduction) run with
  ``Graph.execute`` into NaN-poisoned outputs, and builder mistakes (channels, inner dims,
  execute with a wrong array) that must be refused.

Cases whose support depends on the loaded cuDNN's engines (a graph cuDNN may have no engine
for, padding with GQA, very short sequences) are ``either``: a ``NotSupportedError`` or a result
that matches the reference.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from _fuzz_highlevel_child import Case, conv_ref, nan_out, spec
from hypothesis import strategies as st
from references import (
    layer_norm_grad_ref,
    layer_norm_ref,
    rms_norm_grad_ref,
    rms_norm_ref,
    sdpa_grad_ref,
    sdpa_ref,
)

import pycudnn
from pycudnn.graph import Graph

try:  # bfloat16 host arrays (the GPU machine has ml_dtypes; without it: float16 only)
    import ml_dtypes

    _NP = {"bfloat16": np.dtype(ml_dtypes.bfloat16)}
except ImportError:
    _NP = {}
_NP.update(float16=np.dtype(np.float16), float32=np.dtype(np.float32))
HALF = tuple(d for d in ("float16", "bfloat16") if d in _NP)
#: max |got - ref| / max |ref| (one rounding to the dtype, float32 accumulation)
MAXREL = {"bfloat16": 2e-2, "float16": 5e-3, "float32": 1e-4, "tf32": 1e-2}
#: relative L2 of attention (exp, rescaling and the P rounding of flash attention)
L2 = {"bfloat16": 3e-2, "float16": 1e-2}
_rng = np.random.default_rng()


def rounded(shape, dt: str, scale: float = 1.0) -> np.ndarray:
    """Random float64 values exactly representable in *dt*."""
    return (_rng.standard_normal(shape) * scale).astype(_NP[dt]).astype(np.float64)


def todev(a64: np.ndarray, dt: str, order: tuple[int, ...] | None = None) -> Any:
    """A device copy in *dt*; *order*: the memory order of the dims (a permuted view)."""
    h = a64.astype(_NP[dt])
    if order is None:
        return pycudnn.to_device(np.ascontiguousarray(h))
    d = pycudnn.to_device(np.ascontiguousarray(h.transpose(order)))
    return d.transpose(*np.argsort(order))


def poisoned(shape, dt: str, order: tuple[int, ...] | None = None) -> Any:
    if order is None:
        return nan_out(tuple(shape), _NP[dt])
    base = nan_out(tuple(shape[i] for i in order), _NP[dt])
    return base.transpose(*np.argsort(order))


def got64(a: Any) -> np.ndarray:
    g = np.asarray(a.get(), dtype=np.float64)
    assert np.all(np.isfinite(g)), "non-finite values (an unwritten output?)"
    return g


def maxrel(got: Any, ref: np.ndarray, tol: float, what: str) -> None:
    g = got64(got) if not isinstance(got, np.ndarray) else got
    assert g.shape == ref.shape, f"{what}: shape {g.shape} != {ref.shape}"
    err = float(np.max(np.abs(g - ref))) / max(float(np.max(np.abs(ref))), 1e-6)
    assert err <= tol, f"{what}: error {err:.3g} > {tol:.3g}"


def l2rel(g: np.ndarray, ref: np.ndarray, tol: float, what: str) -> None:
    """Relative L2 error, the reference's norm floored at an RMS of 1e-3: a gradient that is
    zero in exact arithmetic (a query row that sees one key has dQ = 0) is then compared by
    its rounding noise's size, not divided by ~0 (inputs here are O(1))."""
    assert np.all(np.isfinite(g)), f"{what}: non-finite values"
    floor = 1e-3 * math.sqrt(max(ref.size, 1))
    err = float(np.linalg.norm(g - ref)) / max(float(np.linalg.norm(ref)), floor)
    assert err <= tol, f"{what}: relative L2 {err:.3g} > {tol:.3g}"


_ERF = np.vectorize(math.erf)
ACTS = {
    None: lambda v: v,
    "relu": lambda v: np.maximum(v, 0),
    "gelu": lambda v: 0.5 * v * (1 + _ERF(v / math.sqrt(2))),
    "gelu_tanh": lambda v: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))),
    "silu": lambda v: v / (1 + np.exp(-v)),
    "sigmoid": lambda v: 1 / (1 + np.exp(-v)),
    "tanh": np.tanh,
    "elu": lambda v: np.where(v > 0, v, np.expm1(np.minimum(v, 0))),
    ("clipped_relu", 1.5): lambda v: np.clip(v, 0, 1.5),
}


# -- dnn_matmul ------------------------------------------------------------------------------------
@spec("dnn_matmul", "matmul")
def gen_matmul(draw):
    dt = draw(st.sampled_from([*HALF, "float32"]))
    m, k, n = (draw(st.integers(1, 96)) for _ in range(3))
    batch = tuple(draw(st.integers(1, 3)) for _ in range(draw(st.integers(0, 2))))
    # one operand may broadcast: a 1 in its batch dims, or fewer dims
    side = draw(st.sampled_from(["none", "a", "b"]))
    ba = tuple(1 if side == "a" else s for s in batch)
    bb = tuple(1 if side == "b" else s for s in batch)
    if side == "b" and draw(st.booleans()):
        bb = ()
    a64, b64 = rounded((*ba, m, k), dt), rounded((*bb, k, n), dt, 1 / math.sqrt(k))
    ta, tb = draw(st.booleans()), draw(st.booleans())  # transposed views (strides)
    a = todev(a64, dt, (*range(len(ba)), len(ba) + 1, len(ba)) if ta else None)
    b = todev(b64, dt, (*range(len(bb)), len(bb) + 1, len(bb)) if tb else None)
    act = draw(st.sampled_from(list(ACTS)))
    bias64 = rounded((n,), dt) if draw(st.booleans()) else None
    bias = None if bias64 is None else todev(bias64, dt)
    kind = draw(st.sampled_from(["valid"] * 4 + ["invalid"]))
    bad = draw(st.sampled_from(["inner", "two_way", "f64", "bias", "act", "host", "out"]))
    bad = bad if kind == "invalid" else None
    shape = (*np.broadcast_shapes(ba, bb), m, n)
    out = poisoned(shape, dt) if draw(st.booleans()) else None
    if bad == "inner":
        b = todev(rounded((*bb, k + 1, n), dt), dt)
    elif bad == "two_way":  # each operand broadcasts against the other: no engine, refused
        a, b = todev(rounded((2, 1, m, k), dt), dt), todev(rounded((1, 3, k, n), dt), dt)
        out = None
    elif bad == "f64":
        a = pycudnn.to_device(a64)
    elif bad == "bias":
        bias = todev(rounded((n + 1,), dt), dt)
    elif bad == "act":
        act = "swishy"
    elif bad == "host":
        b = b64.astype(_NP[dt])
    elif bad == "out":
        out = poisoned((*shape[:-1], n + 1), dt)
    if kind == "valid" and act == ("clipped_relu", 1.5) and bias is None:
        # cuDNN 9.19's engines ignore the upper clip straight on the product (this fuzzer found
        # it): dnn_matmul refuses that call, so it is an invalid case
        kind = "invalid"
    ref = np.matmul(a64, b64) if dt != "float32" else np.matmul(a64, b64).astype(np.float32)
    ref = np.asarray(ref, np.float64) + (0 if bias64 is None else bias64)
    ref = ACTS[act](ref) if act in ACTS else ref
    tol = MAXREL["tf32" if dt == "float32" else dt] * max(1.0, math.sqrt(k) / 8)
    if act is not None and dt != "float32":
        tol *= 2  # the activation on the float32 sum, then one more rounding where not fused

    def call():
        if dt == "float32":
            with pycudnn.config.override(allow_tf32=True):
                return pycudnn.dnn_matmul(a, b, bias, act, out=out)
        return pycudnn.dnn_matmul(a, b, bias, act, out=out)

    def check(r):
        if out is not None:
            assert r is out, "out= not returned"
        maxrel(r, ref, tol, "a @ b")

    label = f"a{(*ba, m, k)}{'T' if ta else ''} b{(*bb, k, n)}{'T' if tb else ''} {dt} "
    return Case(kind, call, check, label + f"bias={bias64 is not None} act={act} bad={bad}")


# -- norms -----------------------------------------------------------------------------------------
def _norm_problem(draw):
    dt = draw(st.sampled_from([*HALF, "float32"]))
    nn = draw(st.integers(1, 2))
    lead = tuple(draw(st.integers(1, 6)) for _ in range(draw(st.integers(1, 2))))
    feat = (draw(st.sampled_from([8, 16, 32, 64, 128, 256])),)
    if nn == 2:
        feat = (draw(st.sampled_from([2, 4])), feat[0])
    x64 = rounded((*lead, *feat), dt) * draw(st.sampled_from([1.0, 3.0])) + draw(
        st.sampled_from([0.0, 1.0])
    )
    x64 = x64.astype(_NP[dt]).astype(np.float64)
    pdt = draw(st.sampled_from([dt, "float32"]))
    g64 = rounded(feat, pdt) if draw(st.booleans()) else None
    b64 = rounded(feat, pdt) if g64 is not None and draw(st.booleans()) else None
    eps = draw(st.sampled_from([1e-5, 1e-6, 1e-3]))
    return dt, nn, feat, x64, pdt, g64, b64, eps


def _norm_bad(draw, kind, feat, nn):
    if kind != "invalid":
        return None, {}
    bad = draw(st.sampled_from(["eps0", "eps_neg", "shape", "gamma", "training", "f64"]))
    over = {
        "eps0": {"epsilon": 0.0},
        "eps_neg": {"epsilon": -1e-5},
        "shape": {"normalized_shape": tuple(f + 1 for f in feat)},
        "training": {"training": "maybe"},
    }
    return bad, over.get(bad, {})


@spec("dnn_layer_norm", "norms")
def gen_layer_norm(draw):
    return _norm_case(draw, rms=False, grad=False)


@spec("dnn_rms_norm", "norms")
def gen_rms_norm(draw):
    return _norm_case(draw, rms=True, grad=False)


@spec("dnn_layer_norm_grad", "norms")
def gen_layer_norm_grad(draw):
    return _norm_case(draw, rms=False, grad=True)


@spec("dnn_rms_norm_grad", "norms")
def gen_rms_norm_grad(draw):
    return _norm_case(draw, rms=True, grad=True)


def _norm_case(draw, rms: bool, grad: bool) -> Case:
    dt, nn, feat, x64, pdt, g64, b64, eps = _norm_problem(draw)
    if rms:
        b64 = None
    kind = draw(st.sampled_from(["valid"] * 3 + ["invalid"]))
    bad, over = _norm_bad(draw, kind, feat, nn)
    x = todev(x64, dt)
    gamma = None if g64 is None else todev(g64, pdt)
    beta = None if b64 is None else todev(b64, pdt)
    if bad == "gamma":
        gamma = todev(rounded((feat[-1] + 8,), pdt), pdt)
    elif bad == "f64":
        x = pycudnn.to_device(x64)
    shape = over.get("normalized_shape", feat)
    epsilon = over.get("epsilon", eps)
    training = over.get("training", draw(st.booleans()) or grad)
    tol = MAXREL[dt] * (2 if dt != "float32" else 10)
    label = f"x{x64.shape} nn={nn} {dt} params {pdt} gamma={g64 is not None} eps={eps} bad={bad}"

    def forward():
        if rms:
            y, inv = pycudnn.dnn_rms_norm(x, shape, gamma, epsilon, training=training)
            return y, None, inv
        return pycudnn.dnn_layer_norm(x, shape, gamma, beta, epsilon, training=training)

    if not grad:

        def check(r):
            y, mean, inv = r
            if rms:
                wy, winv = rms_norm_ref(x64, nn, g64, eps)
                wmean = None
            else:
                wy, wmean, winv = layer_norm_ref(x64, nn, g64, b64, eps)
            maxrel(y, wy, tol, "y")
            if not training:
                assert inv is None and mean is None, "statistics returned in inference"
                return
            maxrel(inv, winv, 1e-3, "inv")
            if wmean is not None:
                maxrel(mean, wmean, 1e-3, "mean")

        return Case(kind, forward, check, label + f" training={training}")

    dy64 = rounded(x64.shape, dt)
    dy = todev(dy64, dt)

    def backward():
        # the forward's statistics, then the call under test
        if rms:
            _y, inv = pycudnn.dnn_rms_norm(x, feat, gamma, eps)
            return pycudnn.dnn_rms_norm_grad(dy, x, inv, shape, gamma)
        _y, mean, inv = pycudnn.dnn_layer_norm(x, feat, gamma, beta, eps)
        return pycudnn.dnn_layer_norm_grad(dy, x, mean, inv, shape, gamma)

    if bad in ("eps0", "eps_neg", "training", "f64"):
        # the gradients take no epsilon/training: make the mistake one they take
        bad, shape = "shape", tuple(f + 1 for f in feat)
        label += " (-> bad=shape)"

    def check_grad(r):
        if rms:
            wdx, wdg = rms_norm_grad_ref(dy64, x64, nn, g64, eps)
            dx, dg = r
            wdb = db = None
        else:
            wdx, wdg, wdb = layer_norm_grad_ref(dy64, x64, nn, g64, eps)
            dx, dg, db = r
        maxrel(dx, wdx, tol * 2, "dx")
        if g64 is None:
            assert dg is None, "dgamma without gamma"
            return
        rows = math.prod(x64.shape[: x64.ndim - nn])
        maxrel(dg, wdg, tol * max(2.0, math.sqrt(rows)), "dgamma")
        if db is not None:
            maxrel(db, wdb, tol * max(2.0, math.sqrt(rows)), "dbeta")

    return Case(kind, backward, check_grad, label)


# -- dnn_sdpa / dnn_sdpa_grad ----------------------------------------------------------------------
def _sdpa_problem(draw):
    dt = draw(st.sampled_from(HALF))
    b = draw(st.integers(1, 2))
    hk = draw(st.sampled_from([1, 2, 4]))
    h = hk * draw(st.sampled_from([1, 1, 2, 4]))
    d = draw(st.sampled_from([64, 128]))
    sq = draw(st.one_of(st.integers(1, 300), st.sampled_from([64, 128, 256])))
    skv = draw(st.sampled_from([sq, sq, draw(st.integers(1, 300))]))
    causal = draw(st.booleans())
    pad = draw(st.integers(0, 3)) == 0
    lq = lkv = None
    if pad:
        lq = [draw(st.integers(1, sq)) for _ in range(b)]
        lkv = [draw(st.integers(1, skv)) for _ in range(b)]
    bshd = draw(st.booleans())  # (B, S, H, D) storage: transposed views
    scale = draw(st.sampled_from([None, None, 0.05, 0.2]))
    return dt, b, h, hk, sq, skv, d, causal, lq, lkv, bshd, scale


def _qkv(dt, b, h, hk, sq, skv, d, bshd):
    order = (0, 2, 1, 3) if bshd else None
    q64 = rounded((b, h, sq, d), dt)
    k64, v64 = rounded((b, hk, skv, d), dt), rounded((b, hk, skv, d), dt)
    return (q64, k64, v64), tuple(todev(a, dt, order) for a in (q64, k64, v64))


def _rows(a: np.ndarray, lens) -> np.ndarray:
    if lens is None:
        return a.reshape(-1)
    return np.concatenate([a[i, :, :n].reshape(-1) for i, n in enumerate(lens)])


def _lens(lq, lkv):
    if lq is None:
        return {}
    return {
        "seq_lens_q": pycudnn.to_device(np.array(lq, np.int32)),
        "seq_lens_kv": pycudnn.to_device(np.array(lkv, np.int32)),
    }


_SDPA_BAD = ["head_dim", "f32", "heads", "mask", "p1", "one_len", "lens_i64", "causal_str"]


def _sdpa_bad(bad, q, k, v, kw, dt):
    if bad == "head_dim":
        k = todev(rounded((*k.shape[:3], 60), dt), dt)
    elif bad == "f32":
        q = pycudnn.to_device(rounded(q.shape, dt).astype(np.float32))
    elif bad == "heads":  # 3 query heads over 2 key/value heads
        b, sq, skv, d = q.shape[0], q.shape[2], k.shape[2], q.shape[3]
        q = todev(rounded((b, 3, sq, d), dt), dt)
        k, v = todev(rounded((b, 2, skv, d), dt), dt), todev(rounded((b, 2, skv, d), dt), dt)
    elif bad == "mask":
        kw["attn_mask"] = q
    elif bad == "p1":
        kw.update(dropout_p=1.0, seed=1)
    elif bad == "one_len":
        kw["seq_lens_q"] = pycudnn.to_device(np.ones(q.shape[0], np.int32))
        kw.pop("seq_lens_kv", None)
    elif bad == "lens_i64":
        kw["seq_lens_q"] = pycudnn.to_device(np.ones(q.shape[0], np.int64))
        kw["seq_lens_kv"] = pycudnn.to_device(np.ones(q.shape[0], np.int64))
    elif bad == "causal_str":
        kw["is_causal"] = "maybe"
    return q, k, v


def _sdpa_kind(draw, sq, skv, lq, h, hk):
    kind = draw(st.sampled_from(["valid"] * 4 + ["invalid"]))
    if kind == "valid" and (min(sq, skv) < 8 or (lq is not None and h != hk)):
        kind = "either"  # engine support varies with the cuDNN version here
    return kind


@spec("dnn_sdpa", "sdpa")
def gen_sdpa(draw):
    dt, b, h, hk, sq, skv, d, causal, lq, lkv, bshd, scale = _sdpa_problem(draw)
    (q64, k64, v64), (q, k, v) = _qkv(dt, b, h, hk, sq, skv, d, bshd)
    kind = _sdpa_kind(draw, sq, skv, lq, h, hk)
    bad = draw(st.sampled_from(_SDPA_BAD)) if kind == "invalid" else None
    dropout = kind != "invalid" and lq is None and draw(st.integers(0, 4)) == 0
    training = draw(st.booleans())
    kw: dict[str, Any] = dict(is_causal=causal, scale=scale, training=training, **_lens(lq, lkv))
    out = poisoned((b, h, sq, d), dt, (0, 2, 1, 3) if bshd else None)
    if draw(st.booleans()):
        kw["out"] = out
    q, k, v = _sdpa_bad(bad, q, k, v, kw, dt)
    label = (
        f"{dt} b={b} h={h} hk={hk} sq={sq} skv={skv} d={d} causal={causal} lens={lq}/{lkv} "
        f"bshd={bshd} scale={scale} training={training} dropout={dropout} bad={bad}"
    )
    if dropout:
        kw.update(dropout_p=0.2, seed=int(draw(st.integers(0, 2**31))))

    def call():
        return pycudnn.dnn_sdpa(q, k, v, **kw)

    def check(r):
        o, stats = r if training else (r, None)
        if "out" in kw:
            assert o is kw["out"], "out= not returned"
        assert tuple(o.shape) == (b, h, sq, d)
        if dropout:  # shape, finiteness and the same mask for the same seed
            first = got64(o)
            again = call()
            assert np.array_equal(first, got64(again[0] if training else again)), "seed"
            return
        want, lse = sdpa_ref(q64, k64, v64, causal, scale, lq, lq and lkv)
        got = np.asarray(o.get(), np.float64)  # rows past a length are left unwritten
        l2rel(_rows(got, lq), _rows(want, lq), L2[dt], "out")
        if stats is not None:
            st_ = _rows(np.asarray(stats.get(), np.float64), lq)
            assert float(np.max(np.abs(st_ - _rows(lse, lq)))) < 2e-2, "stats (log-sum-exp)"

    return Case(kind, call, check, label)


@spec("dnn_sdpa_grad", "sdpa")
def gen_sdpa_grad(draw):
    dt, b, h, hk, sq, skv, d, causal, lq, lkv, bshd, scale = _sdpa_problem(draw)
    (q64, k64, v64), (q, k, v) = _qkv(dt, b, h, hk, sq, skv, d, bshd)
    kind = _sdpa_kind(draw, sq, skv, lq, h, hk)
    if sq == 1 and skv == 1:
        kind = "invalid"  # documented: cuDNN's backward does not run S_q = S_kv = 1
    bad = draw(st.sampled_from([*_SDPA_BAD, "no_seed", "stats"])) if kind == "invalid" else None
    bad = None if sq == 1 and skv == 1 else bad
    dropout = kind != "invalid" and lq is None and draw(st.integers(0, 4)) == 0
    det = draw(st.sampled_from([None, True, False]))
    lens = _lens(lq, lkv)
    fw: dict[str, Any] = dict(is_causal=causal, scale=scale, **lens)
    if dropout:
        fw.update(dropout_p=0.2, seed=int(draw(st.integers(0, 2**31))))
    do64 = rounded((b, h, sq, d), dt)
    if lq is not None:
        for i, n in enumerate(lq):
            do64[i, :, n:] = 0  # no gradient flows from padded rows
    do = todev(do64, dt, (0, 2, 1, 3) if bshd else None)
    label = (
        f"{dt} b={b} h={h} hk={hk} sq={sq} skv={skv} d={d} causal={causal} lens={lq}/{lkv} "
        f"bshd={bshd} scale={scale} det={det} dropout={dropout} bad={bad}"
    )
    pack: dict[str, Any] = {}

    def call():
        o, stats = pycudnn.dnn_sdpa(q, k, v, training=True, **fw)
        kw = dict(fw, deterministic=det)
        q2, k2, v2 = _sdpa_bad(bad, q, k, v, kw, dt)
        if bad == "no_seed":
            kw.update(dropout_p=0.1, seed=None)
        elif bad == "stats":
            stats = nan_out((b, h, sq, 2), np.float32)
        pack.update(o=o, stats=stats, kw=kw)
        return pycudnn.dnn_sdpa_grad(q2, k2, v2, o, do, stats, **kw)

    def check(r):
        dq, dk, dv = r
        assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
        if dropout:
            kw = dict(pack["kw"], deterministic=True)
            first = pycudnn.dnn_sdpa_grad(q, k, v, pack["o"], do, pack["stats"], **kw)
            again = pycudnn.dnn_sdpa_grad(q, k, v, pack["o"], do, pack["stats"], **kw)
            for x, y in zip(first, again, strict=True):
                assert np.array_equal(got64(x), got64(y)), "deterministic with the same seed"
            for g in (dq, dk, dv):
                got64(g)
            return
        wq, wk, wv = sdpa_grad_ref(q64, k64, v64, do64, causal, scale, lq, lq and lkv)
        for name, g, w, ln in (("dq", dq, wq, lq), ("dk", dk, wk, lkv), ("dv", dv, wv, lkv)):
            l2rel(_rows(np.asarray(g.get(), np.float64), ln), _rows(w, ln), 2 * L2[dt], name)

    return Case(kind, call, check, label)


# -- builder graphs (pycudnn.graph) ----------------------------------------------------------------
_GACT = {"relu": ACTS["relu"], "tanh": np.tanh, "sigmoid": ACTS["sigmoid"], None: ACTS[None]}
NHWC = (0, 2, 3, 1)


def _el(a: Any) -> tuple[int, ...]:
    return tuple(s // a.itemsize for s in a.strides)


@spec("Graph conv_fprop+bias+act", "graph")
def gen_graph_conv(draw):
    dt = draw(st.sampled_from(HALF))
    n, c, kk = draw(st.integers(1, 4)), 8 * draw(st.integers(1, 4)), 8 * draw(st.integers(1, 4))
    hw = draw(st.integers(3, 16))
    ks = draw(st.sampled_from([1, 3]))
    pad = draw(st.integers(0, ks // 2))
    stride = draw(st.sampled_from([1, 1, 2]))
    act = draw(st.sampled_from(list(_GACT)))
    x64, w64 = rounded((n, c, hw, hw), dt), rounded((kk, c, ks, ks), dt, 1 / math.sqrt(c * ks))
    b64 = rounded((1, kk, 1, 1), dt)
    kind = "valid" if act == "relu" else "either"
    if draw(st.integers(0, 4)) == 0:
        kind = "invalid"
    bad = (
        draw(st.sampled_from(["channels", "exec_dtype", "exec_shape"]))
        if kind == "invalid"
        else None
    )
    x, w, bias = todev(x64, dt, NHWC), todev(w64, dt, NHWC), todev(b64, dt)
    want = conv_ref(x64, w64, (pad, pad), (stride, stride), (1, 1), 1, False) + b64
    want = _GACT[act](want)
    y = poisoned(want.shape, dt, NHWC)

    def call():
        g = Graph(io_data_type=dt, name="fuzz_conv")
        tx, tw, tb = g.tensor_like(x), g.tensor_like(w), g.tensor_like(bias)
        if bad == "channels":  # refused when the operation is added
            tw = g.tensor_like(todev(rounded((kk, c + 8, ks, ks), dt), dt, NHWC))
        t = g.add(g.conv_fprop(tx, tw, padding=pad, stride=stride), tb)
        ty = (t if act is None else getattr(g, act)(t)).set_output(True)
        ty.set_stride(_el(y))
        g.build()
        yy = y
        if bad == "exec_dtype":
            yy = poisoned(want.shape, "float32", NHWC)
        elif bad == "exec_shape":
            yy = poisoned((n + 1, *want.shape[1:]), dt, NHWC)
        g.execute({tx: x, tw: w, tb: bias, ty: yy})
        return yy

    label = (
        f"{dt} x{(n, c, hw, hw)} w{(kk, c, ks, ks)} pad={pad} stride={stride} act={act} bad={bad}"
    )
    return Case(kind, call, lambda r: maxrel(r, want, 2 * MAXREL[dt], "y"), label)


@spec("Graph matmul+pointwise", "graph")
def gen_graph_matmul(draw):
    dt = draw(st.sampled_from(HALF))
    bt, m, k, n = draw(st.integers(1, 3)), *(8 * draw(st.integers(1, 8)) for _ in range(3))
    a64 = rounded((bt, m, k), dt)
    b64 = rounded((draw(st.sampled_from([1, bt])), k, n), dt, 1 / math.sqrt(k))
    bias64 = rounded((1, 1, n), dt)
    act = draw(st.sampled_from(list(_GACT)))
    s_val = draw(st.sampled_from([0.5, -2.0, 1.0]))
    runtime = draw(st.booleans())  # the scale a by-value tensor given at execute, or a constant
    kind = draw(st.sampled_from(["either"] * 4 + ["invalid"]))
    bad = draw(st.sampled_from(["inner", "exec_missing_dtype"])) if kind == "invalid" else None
    a, b, bias = todev(a64, dt), todev(b64, dt), todev(bias64, dt)
    want = _GACT[act](s_val * np.matmul(a64, b64) + bias64)
    out = poisoned(want.shape, dt)

    def call():
        g = Graph(io_data_type=dt, name="fuzz_matmul")
        ta, tb, tbias = g.tensor_like(a), g.tensor_like(b), g.tensor_like(bias)
        if bad == "inner":
            tb = g.tensor_like(todev(rounded((1, k + 8, n), dt), dt))
        if runtime:
            s = g.tensor((1, 1, 1), data_type="float32", is_pass_by_value=True, name="s")
        else:
            s = g.scalar(s_val, name="s")
        t = g.add(g.mul(g.matmul(ta, tb), s), tbias)
        y = (t if act is None else getattr(g, act)(t)).set_output(True)
        g.build()
        pack = {ta: a, tb: b, tbias: bias, y: out}
        if runtime:
            pack[s] = s_val
        if bad == "exec_missing_dtype":
            pack[tbias] = todev(bias64, "float32")
        g.execute(pack)
        return out

    label = f"{dt} a{a64.shape} b{b64.shape} act={act} scale={s_val} runtime={runtime} bad={bad}"
    tol = 2 * MAXREL[dt] * max(1.0, math.sqrt(k) / 8)
    return Case(kind, call, lambda r: maxrel(r, want, tol, "y"), label)


@spec("Graph matmul+reduction", "graph")
def gen_graph_reduction(draw):
    dt = draw(st.sampled_from(["float32", *HALF]))
    m, k, n = (8 * draw(st.integers(1, 12)) for _ in range(3))
    a64, b64 = rounded((1, m, k), dt), rounded((1, k, n), dt, 1 / math.sqrt(k))
    mode = draw(st.sampled_from(["add", "max"]))
    a, b = todev(a64, dt), todev(b64, dt)
    prod = np.matmul(a64, b64)
    if dt == "float32":
        prod = prod.astype(np.float32).astype(np.float64)
    want = prod.sum(-1, keepdims=True) if mode == "add" else prod.max(-1, keepdims=True)
    out = poisoned((1, m, 1), "float32")

    def call():
        g = Graph(io_data_type=dt, name="fuzz_reduction")
        ta, tb = g.tensor_like(a), g.tensor_like(b)
        r = g.reduction(g.matmul(ta, tb), mode, dim=(1, m, 1)).set_output(True)
        r.set_data_type("float32")
        if dt == "float32":
            with pycudnn.config.override(allow_tf32=True):
                g.build()
        else:
            g.build()
        g.execute({ta: a, tb: b, r: out})
        return out

    tol = (MAXREL["tf32"] if dt == "float32" else 1e-3) * max(1.0, math.sqrt(n * k) / 16)
    label = f"{dt} a{a64.shape} b{b64.shape} {mode}"
    return Case("either", call, lambda r: maxrel(r, want, tol, mode), label)
