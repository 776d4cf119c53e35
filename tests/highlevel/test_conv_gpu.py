"""GPU tests of the convolutions (marker ``gpu``; skipped without a device).

Run on the GPU machine:
``PYTHONPATH=. python3 -m pytest -m gpu -q -s tests/highlevel/test_conv_gpu.py``.

References are float64 NumPy (vectorised over groups, one einsum per kernel tap) on small random
shapes; inputs are rounded to the tested dtype first, so only the convolution's own rounding is
measured, as a max-abs error normalised by the reference's max-abs value (tolerances from
research/reliability_perf.md A3). Outputs are poisoned with NaN before every call.
"""

from __future__ import annotations

import math
import os
import time
import warnings
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pycudnn  # noqa: E402  (torch first: both then use the same libcudnn)
from pycudnn import _config, errors, memory  # noqa: E402
from pycudnn.graph import _execution, _plans  # noqa: E402
from pycudnn.highlevel import conv  # noqa: E402
from pycudnn.highlevel.conv import _problem  # noqa: E402

pytestmark = pytest.mark.gpu

TORCH_DT = {
    "fp32": torch.float32,
    "tf32": torch.float32,
    "fp16": torch.float16,
    "fp16h": torch.float16,
    "bf16": torch.bfloat16,
    "fp64": torch.float64,
}
PRECISION = {"fp16h": "as_input"}
# max |got - ref| / max |ref|
TOL = {"fp64": 1e-10, "fp32": 2e-5, "tf32": 1e-2, "fp16": 5e-3, "fp16h": 2e-2, "bf16": 2e-2}
LETTERS = "dhw"


@pytest.fixture(autouse=True)
def _fresh_stream():
    yield
    pycudnn.get_handle().set_stream(0)


# ==================================================================================================
# float64 NumPy references
# ==================================================================================================
def _geometry(xs, ks, pads, stride, dil):
    return [
        (xs[i] + 2 * pads[i] - (ks[i] - 1) * dil[i] - 1) // stride[i] + 1 for i in range(len(xs))
    ]


def _tap_slices(off, dil, stride, out):
    return tuple(
        slice(o * d, o * d + s * (n - 1) + 1, s)
        for o, d, s, n in zip(off, dil, stride, out, strict=False)
    )


def _flip(w):
    nd = w.ndim - 2
    return w[(slice(None), slice(None)) + (slice(None, None, -1),) * nd]


def ref_forward(x, w, pads, stride, dil, groups, mode):
    nd = x.ndim - 2
    if mode == "conv":
        w = _flip(w)
    n, c = x.shape[:2]
    k = w.shape[0]
    g, cg, kg = groups, c // groups, k // groups
    out = _geometry(x.shape[2:], w.shape[2:], pads, stride, dil)
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pads])
    wg = w.reshape(g, kg, cg, *w.shape[2:])
    sp = LETTERS[-nd:]
    y = np.zeros((n, g, kg, *out))
    for off in np.ndindex(*w.shape[2:]):
        xs = xp[(slice(None), slice(None), *_tap_slices(off, dil, stride, out))]
        y += np.einsum(f"gkc,ngc{sp}->ngk{sp}", wg[(Ellipsis, *off)], xs.reshape(n, g, cg, *out))
    return y.reshape(n, k, *out)


def ref_backward_data(dy, w, x_shape, pads, stride, dil, groups, mode):
    nd = dy.ndim - 2
    if mode == "conv":
        w = _flip(w)
    n, c = x_shape[:2]
    k = w.shape[0]
    g, cg, kg = groups, c // groups, k // groups
    out = list(dy.shape[2:])
    dxp = np.zeros((n, c, *(s + 2 * p for s, p in zip(x_shape[2:], pads, strict=False))))
    wg = w.reshape(g, kg, cg, *w.shape[2:])
    dyg = dy.reshape(n, g, kg, *out)
    sp = LETTERS[-nd:]
    for off in np.ndindex(*w.shape[2:]):
        contrib = np.einsum(f"gkc,ngk{sp}->ngc{sp}", wg[(Ellipsis, *off)], dyg)
        dxp[(slice(None), slice(None), *_tap_slices(off, dil, stride, out))] += contrib.reshape(
            n, c, *out
        )
    crop = tuple(slice(p, p + s) for p, s in zip(pads, x_shape[2:], strict=False))
    return dxp[(slice(None), slice(None), *crop)]


def ref_backward_filter(x, dy, w_shape, pads, stride, dil, groups, mode):
    nd = x.ndim - 2
    n, c = x.shape[:2]
    k = w_shape[0]
    g, cg, kg = groups, c // groups, k // groups
    out = list(dy.shape[2:])
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pads])
    dyg = dy.reshape(n, g, kg, *out)
    sp = LETTERS[-nd:]
    dw = np.zeros(w_shape)
    for off in np.ndindex(*w_shape[2:]):
        xs = xp[(slice(None), slice(None), *_tap_slices(off, dil, stride, out))]
        tap = np.einsum(f"ngc{sp},ngk{sp}->gkc", xs.reshape(n, g, cg, *out), dyg)
        dw[(slice(None), slice(None), *off)] = tap.reshape(k, cg)
    return _flip(dw) if mode == "conv" else dw


def _pads_of(border_mode, ks, dil):
    dk = [(k - 1) * d + 1 for k, d in zip(ks, dil, strict=False)]
    if border_mode == "valid":
        return [0] * len(ks)
    if border_mode == "full":
        return [k - 1 for k in dk]
    if border_mode == "half":
        return [k // 2 for k in dk]
    if isinstance(border_mode, int):
        return [border_mode] * len(ks)
    return list(border_mode)


# ==================================================================================================
# helpers
# ==================================================================================================
def to_np(a):
    if isinstance(a, torch.Tensor):
        return a.detach().double().cpu().numpy()
    return np.asarray(a.get()).astype(np.float64)


def dev(arr, prec, nhwc):
    """float64 numpy -> device tensor of the dtype: (tensor, its exact float64 values)."""
    t = torch.from_numpy(arr).to("cuda", TORCH_DT[prec])
    if nhwc:
        t = t.contiguous(
            memory_format=torch.channels_last if t.ndim == 4 else torch.channels_last_3d
        )
    return t, t.double().cpu().numpy()


def empty_like_nan(shape, prec, nhwc):
    t = torch.full(shape, float("nan"), device="cuda", dtype=TORCH_DT[prec])
    if nhwc:
        t = t.contiguous(
            memory_format=torch.channels_last if t.ndim == 4 else torch.channels_last_3d
        )
    return t


def rel_err(got, ref):
    got = to_np(got) if not isinstance(got, np.ndarray) else got
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert not np.isnan(got).any(), "NaN in the result (an unwritten output element?)"
    scale = max(float(np.abs(ref).max()), 1e-30)
    return float(np.abs(got - ref).max()) / scale


def flags_for(prec):
    return _config.config.override(allow_tf32=prec == "tf32")


# ==================================================================================================
# the random sweep
# ==================================================================================================
def _cases(count, seed=1234):
    rng = np.random.default_rng(seed)
    cases = []
    precs = ["fp32", "tf32", "fp16", "bf16", "fp64", "fp32", "fp16", "fp16h"]
    while len(cases) < count:
        nd = int(rng.choice([2, 2, 3]))
        op = str(rng.choice(["fwd", "bwd_data", "bwd_filter"]))
        prec = str(rng.choice(precs))
        nhwc = bool(rng.integers(2))
        gkind = str(rng.choice(["1", "2", "dw"]))
        mode = str(rng.choice(["conv", "cross"]))
        n = int(rng.integers(1, 4))
        if gkind == "1":
            g, c, k = 1, int(rng.choice([1, 3, 4, 8])), int(rng.choice([2, 4, 8]))
        elif gkind == "2":
            g, c, k = 2, 2 * int(rng.choice([1, 2, 4])), 2 * int(rng.choice([1, 2, 3]))
        else:
            c = int(rng.choice([4, 8]))
            g, k = c, c * int(rng.choice([1, 2]))
        xs = [int(rng.integers(5, 12 if nd == 2 else 8)) for _ in range(nd)]
        ks = [int(rng.integers(1, 4)) for _ in range(nd)]
        stride = [int(rng.integers(1, 3)) for _ in range(nd)]
        dil = [int(rng.integers(1, 3)) for _ in range(nd)]
        bm = rng.integers(5)
        border = [
            "valid",
            "half",
            "full",
            int(rng.integers(0, 3)),
            tuple(int(v) for v in rng.integers(0, 3, nd)),
        ][bm]
        pads = _pads_of(border, ks, dil)
        if min(_geometry(xs, ks, pads, stride, dil)) < 1:
            continue
        alpha_beta = bool(rng.integers(4) == 0)
        use_out = alpha_beta or bool(rng.integers(2))
        cases.append(
            dict(
                nd=nd,
                op=op,
                prec=prec,
                nhwc=nhwc,
                groups=g,
                n=n,
                c=c,
                k=k,
                xs=xs,
                ks=ks,
                stride=tuple(stride),
                dil=tuple(dil),
                border=border,
                mode=mode,
                alpha_beta=alpha_beta,
                use_out=use_out,
            )
        )
    return cases


def _case_id(c):
    b = c["border"] if isinstance(c["border"], str) else f"p{c['border']}".replace(" ", "")
    return (
        f"{c['op']}-{c['nd']}d-{c['prec']}-{'nhwc' if c['nhwc'] else 'nchw'}-g{c['groups']}-"
        f"{c['mode']}-{b}-s{''.join(map(str, c['stride']))}-d{''.join(map(str, c['dil']))}"
        + ("-ab" if c["alpha_beta"] else "")
    )


N_CASES = int(os.environ.get("PYCUDNN_CONV_SWEEP", "72"))
CASES = _cases(N_CASES)


def run_case(c, algo=None, check=True):
    rng = np.random.default_rng(zlib.crc32(_case_id(c).encode()))
    nd, prec, nhwc = c["nd"], c["prec"], c["nhwc"]
    x_shape = (c["n"], c["c"], *c["xs"])
    w_shape = (c["k"], c["c"] // c["groups"], *c["ks"])
    pads = _pads_of(c["border"], c["ks"], c["dil"])
    y_shape = (c["n"], c["k"], *_geometry(c["xs"], c["ks"], pads, c["stride"], c["dil"]))
    kw = dict(
        border_mode=c["border"],
        subsample=c["stride"],
        dilation=c["dil"],
        conv_mode=c["mode"],
        num_groups=c["groups"],
        precision=PRECISION.get(prec),
        algo=algo,
    )
    fns = {
        ("fwd", 2): pycudnn.dnn_conv,
        ("fwd", 3): pycudnn.dnn_conv3d,
        ("bwd_data", 2): pycudnn.dnn_gradinput,
        ("bwd_data", 3): pycudnn.dnn_gradinput3d,
        ("bwd_filter", 2): pycudnn.dnn_gradweight,
        ("bwd_filter", 3): pycudnn.dnn_gradweight3d,
    }
    fn = fns[(c["op"], nd)]
    x, x64 = dev(rng.standard_normal(x_shape), prec, nhwc)
    w, w64 = dev(rng.standard_normal(w_shape), prec, nhwc)
    dy, dy64 = dev(rng.standard_normal(y_shape), prec, nhwc)
    geo = (pads, c["stride"], c["dil"], c["groups"], c["mode"])
    if c["op"] == "fwd":
        args, out_shape = (x, w), y_shape
        ref = ref_forward(x64, w64, *geo)
    elif c["op"] == "bwd_data":
        args, out_shape = (w, dy, x_shape), x_shape
        ref = ref_backward_data(dy64, w64, x_shape, *geo)
    else:
        args, out_shape = (x, dy, w_shape), w_shape
        ref = ref_backward_filter(x64, dy64, w_shape, *geo)
    if c["alpha_beta"]:
        prior, prior64 = dev(rng.standard_normal(out_shape), prec, nhwc)
        ref = 2.0 * ref - 3.0 * prior64
        kw.update(alpha=2.0, beta=-3.0, out=prior)
    elif c["use_out"]:
        kw["out"] = empty_like_nan(out_shape, prec, nhwc)
    with flags_for(prec):
        got = fn(*args, **kw)
    torch.cuda.synchronize()
    if "out" in kw:
        assert got is kw["out"]
    else:
        assert isinstance(got, memory.DeviceArray) and tuple(got.shape) == tuple(out_shape)
    if check:
        err = rel_err(got, ref)
        assert err <= TOL[prec], f"{_case_id(c)}: error {err:.3g} > {TOL[prec]}"
    return got, ref


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_sweep_against_float64_reference(case):
    run_case(case)


# ==================================================================================================
# specific semantics
# ==================================================================================================
@pytest.mark.parametrize("nd", [2, 3])
@pytest.mark.parametrize("op", ["fwd", "bwd_data", "bwd_filter"])
def test_alpha_beta_accumulate(nd, op):
    c = dict(
        nd=nd,
        op=op,
        prec="fp32",
        nhwc=False,
        groups=2,
        n=2,
        c=4,
        k=6,
        xs=[7] * nd,
        ks=[3] * nd,
        stride=(2,) * nd,
        dil=(1,) * nd,
        border="half",
        mode="conv",
        alpha_beta=True,
        use_out=True,
    )
    run_case(c)


@pytest.mark.parametrize("nd", [2, 3])
def test_conv_equals_cross_on_flipped_kernel(nd):
    x = torch.randn(2, 3, *([7] * nd), device="cuda", dtype=torch.float64)
    w = torch.randn(4, 3, *([3] * nd), device="cuda", dtype=torch.float64)
    fn = pycudnn.dnn_conv if nd == 2 else pycudnn.dnn_conv3d
    a = torch.from_dlpack(fn(x, w, border_mode="half", conv_mode="conv"))
    wf = torch.flip(w, dims=list(range(2, 2 + nd))).contiguous()
    b = torch.from_dlpack(fn(x, wf, border_mode="half", conv_mode="cross"))
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("prec", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("nhwc", [False, True])
@pytest.mark.parametrize("nd", [2, 3])
def test_equals_torch(prec, nhwc, nd):
    """cross-correlation equals torch's conv and both of its gradients."""
    g = torch.Generator(device="cuda").manual_seed(7)
    dt = TORCH_DT[prec]
    shape = (4, 8, *([9] * nd))
    x = torch.randn(shape, device="cuda", generator=g).to(dt)
    w = torch.randn(16, 4, *([3] * nd), device="cuda", generator=g).to(dt)
    if nhwc:
        mf = torch.channels_last if nd == 2 else torch.channels_last_3d
        x, w = x.contiguous(memory_format=mf), w.contiguous(memory_format=mf)
    kw = dict(padding=1, stride=2, dilation=1, groups=2)
    tconv = torch.nn.functional.conv2d if nd == 2 else torch.nn.functional.conv3d
    grad = (
        (torch.nn.grad.conv2d_input, torch.nn.grad.conv2d_weight)
        if nd == 2
        else (torch.nn.grad.conv3d_input, torch.nn.grad.conv3d_weight)
    )
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        y_t = tconv(x, w, **kw)
        dy = torch.randn(y_t.shape, device="cuda", generator=g).to(dt)
        dx_t = grad[0](x.shape, w, dy, **kw)
        dw_t = grad[1](x, w.shape, dy, **kw)
    finally:
        torch.backends.cudnn.allow_tf32 = old
    sfx = "" if nd == 2 else "3d"
    args = dict(border_mode=1, subsample=(2,) * nd, conv_mode="cross", num_groups=2)
    y = torch.from_dlpack(getattr(pycudnn, "dnn_conv" + sfx)(x, w, **args))
    dx = torch.from_dlpack(getattr(pycudnn, "dnn_gradinput" + sfx)(w, dy, x.shape, **args))
    dw = torch.from_dlpack(getattr(pycudnn, "dnn_gradweight" + sfx)(x, dy, w.shape, **args))
    tol = TOL[prec] * 2
    for mine, theirs in ((y, y_t), (dx, dx_t), (dw, dw_t)):
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape
        err = float((mine.double() - theirs.double()).abs().max() / theirs.double().abs().max())
        assert err <= tol, (prec, nhwc, nd, err)
    if nhwc:
        assert y.is_contiguous(
            memory_format=torch.channels_last if nd == 2 else torch.channels_last_3d
        )


def _problem_of_last_call():
    data = _plans._plan_cache().data
    return next(reversed(data))


@pytest.mark.parametrize(
    ("op", "prec"),
    [
        ("fwd", "fp32"),
        ("bwd_data", "fp32"),
        ("bwd_filter", "fp32"),
        ("fwd", "fp16"),
        ("bwd_filter", "bf16"),
        ("fwd", "tf32"),
        ("bwd_data", "fp64"),
    ],
)
def test_every_engine_agrees_with_the_reference(op, prec):
    c = dict(
        nd=2,
        op=op,
        prec=prec,
        nhwc=prec != "fp32",
        groups=1,
        n=2,
        c=8,
        k=8,
        xs=[10, 9],
        ks=[3, 3],
        stride=(1, 1),
        dil=(1, 1),
        border="half",
        mode="cross",
        alpha_beta=False,
        use_out=True,
    )
    conv.clear_caches()
    _got, ref = run_case(c)
    p = _problem_of_last_call()
    h = pycudnn.get_handle()
    # recover the operands of the last call (cached call entry -> pointers are not kept, so
    # re-run with known buffers)
    rng = np.random.default_rng(3)
    t = {}
    for name, shape in (("x", p.x_shape), ("w", p.w_shape), ("y", p.y_shape)):
        t[name], t[name + "64"] = dev(rng.standard_normal(shape), prec, c["nhwc"])
    geo = (p.pads, p.strides, p.dilations, 1, "cross")
    out_name, ref = {
        _problem.OP_FWD: ("y", lambda: ref_forward(t["x64"], t["w64"], *geo)),
        _problem.OP_BWD_DATA: ("x", lambda: ref_backward_data(t["y64"], t["w64"], p.x_shape, *geo)),
        _problem.OP_BWD_FILTER: (
            "w",
            lambda: ref_backward_filter(t["x64"], t["y64"], p.w_shape, *geo),
        ),
    }[p.op]
    ref = ref()
    results = []
    t0 = time.perf_counter()
    for info, gp in _plans.engine_plans(p, h):
        if isinstance(gp, str):
            results.append((info.index, "did not build: " + gp))
            continue
        if time.perf_counter() - t0 > 20:
            results.append((info.index, "skipped (time budget)"))
            continue
        t[out_name].fill_(float("nan"))
        ws = memory.get_workspace(h, gp.workspace)[0] if gp.workspace else 0
        gp.run(t["x"].data_ptr(), t["w"].data_ptr(), t["y"].data_ptr(), ws)
        torch.cuda.synchronize()
        err = rel_err(t[out_name], ref)
        results.append((info.index, f"err {err:.2e}"))
        assert err <= TOL[prec], f"engine {info.index} ({sorted(info.numerical)}): {err}"
        gp.close()
    print(f"\n[engines] {op} {prec}: {len(results)} engines: {results}")
    assert any("err" in r for _i, r in results)


@pytest.mark.parametrize("op", ["fwd", "bwd_data", "bwd_filter"])
def test_deterministic_is_bit_identical(op):
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(32, 32, 20, 20, device="cuda", generator=g)
    w = torch.randn(32, 32, 3, 3, device="cuda", generator=g)
    dy = torch.randn(32, 32, 20, 20, device="cuda", generator=g)
    kw = dict(border_mode="half", conv_mode="cross", algo="deterministic")
    outs = []
    for _ in range(3):
        if op == "fwd":
            r = pycudnn.dnn_conv(x, w, **kw)
        elif op == "bwd_data":
            r = pycudnn.dnn_gradinput(w, dy, x.shape, **kw)
        else:
            r = pycudnn.dnn_gradweight(x, dy, w.shape, **kw)
        outs.append(torch.from_dlpack(r).clone())
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    plan = _plans._plan_cache().data[_problem_of_last_call()]
    assert _plans.BackendNumericalNote.NONDETERMINISTIC not in plan.engine.numerical
    with _config.config.override(deterministic=True):
        r = pycudnn.dnn_gradweight(x, dy, w.shape, border_mode="half", conv_mode="cross")
    assert _problem_of_last_call().deterministic


def test_time_once_keeps_the_accumulating_output_intact():
    c = dict(
        nd=2,
        op="fwd",
        prec="fp32",
        nhwc=False,
        groups=1,
        n=4,
        c=16,
        k=16,
        xs=[16, 16],
        ks=[3, 3],
        stride=(1, 1),
        dil=(1, 1),
        border="half",
        mode="cross",
        alpha_beta=True,
        use_out=True,
    )
    conv.clear_caches()
    run_case(c, algo="time_once")
    plan = _plans._plan_cache().data[_problem_of_last_call()]
    assert _problem_of_last_call().algo == "time"
    print(f"\n[time_once] chose {plan.describe()}, builds {conv.cache_info().builds}")
    c2 = dict(c, op="bwd_filter")
    run_case(c2, algo="time_on_shape_change")


@pytest.mark.parametrize(
    ("op", "algo"),
    [
        (op, a)
        for op in ("fwd", "bwd_data", "bwd_filter")
        for a in sorted(_problem.LEGACY[{"fwd": 0, "bwd_data": 1, "bwd_filter": 2}[op]])
    ],
)
def test_legacy_named_algorithms(op, algo):
    c = dict(
        nd=2,
        op=op,
        prec="fp32",
        nhwc=False,
        groups=1,
        n=2,
        c=8,
        k=8,
        xs=[12, 12],
        ks=[3, 3],
        stride=(1, 1),
        dil=(1, 1),
        border="half",
        mode="conv",
        alpha_beta=op == "fwd",
        use_out=True,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, ref = run_case(c, algo=algo, check=False)
    err = rel_err(got, ref)
    plan = _plans._plan_cache().data[_problem_of_last_call()]
    fell_back = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    deprecations = [w for w in caught if issubclass(w.category, errors.CudnnDeprecationWarning)]
    print(f"\n[legacy] {op} {algo}: {plan.describe()} err {err:.2e} fallback={bool(fell_back)}")
    assert not deprecations
    assert err <= 1e-4


@pytest.mark.parametrize("mode", ["conv", "cross"])
@pytest.mark.parametrize(("n", "c"), [(1, 1), (2, 1), (2, 3)])
def test_direction_hint_routes(mode, n, c):
    """Same results whichever operation runs: the routes apply when the N/C-transposed views
    are packed (N == C == 1 for 'bprop weights', C == 1 for 'full'), else the forward runs."""
    x = torch.randn(n, c, 9, 8, device="cuda", dtype=torch.float64)
    w = torch.randn(5, c, 4, 3, device="cuda", dtype=torch.float64)
    x64, w64 = x.cpu().numpy(), w.cpu().numpy()
    geo = ((1, 1), (1, 1), 1, mode)
    ref_valid = ref_forward(x64, w64, (0, 0), *geo)
    ref_full = ref_forward(x64, w64, (3, 2), *geo)
    got = pycudnn.dnn_conv(x, w, "valid", conv_mode=mode, direction_hint="bprop weights")
    ops = [_problem_of_last_call().op]
    assert rel_err(got, ref_valid) < 1e-12, ops
    for hint in (None, "forward!"):
        got = pycudnn.dnn_conv(x, w, "full", conv_mode=mode, direction_hint=hint)
        ops.append(_problem_of_last_call().op)
        assert rel_err(got, ref_full) < 1e-12, ops
    print(f"\n[routes] n={n} c={c} {mode}: ops {ops}")


UNPACKED = ["sliced", "padded", "transposed", "mixed", "strided_out"]


@pytest.mark.parametrize("prec", ["fp32", "bf16", "fp64", "fp16"])
@pytest.mark.parametrize("op", ["fwd", "bwd_data", "bwd_filter"])
@pytest.mark.parametrize("kind", UNPACKED)
def test_unpacked_operands(kind, op, prec):
    """Operands that are not packed NCHW/NHWC (or not in the problem's layout) are staged
    through packed copies and give the reference result, alpha/beta included."""
    rng = np.random.default_rng(5)
    dt = TORCH_DT[prec]
    n, c, k, hw = 2, 4, 6, 9

    def make(shape, how):
        a64 = rng.standard_normal(shape)
        if how == "sliced":  # every other column of a wider buffer
            big = torch.from_numpy(np.repeat(a64, 2, axis=-1)).to("cuda", dt)
            t = big[..., ::2]
        elif how == "padded":  # rows padded by 3 elements
            big = torch.zeros(*shape[:-1], shape[-1] + 3, device="cuda", dtype=dt)
            big[..., : shape[-1]] = torch.from_numpy(a64).to(dt)
            t = big[..., : shape[-1]]
        elif how == "transposed":  # an N/C-transposed view of a packed tensor
            t = torch.from_numpy(a64.swapaxes(0, 1).copy()).to("cuda", dt).transpose(0, 1)
        elif how == "nhwc":
            t = torch.from_numpy(a64).to("cuda", dt).contiguous(memory_format=torch.channels_last)
        else:
            t = torch.from_numpy(a64).to("cuda", dt)
        return t, t.double().cpu().numpy()

    in_kind = kind if kind in ("sliced", "padded", "transposed") else "plain"
    x, x64 = make((n, c, hw, hw), in_kind)
    w, w64 = make((k, c, 3, 3), "nhwc" if kind == "mixed" else "plain")
    dy, dy64 = make((n, k, hw - 2, hw - 2), in_kind if op != "fwd" else "plain")
    geo = ((0, 0), (1, 1), (1, 1), 1, "cross")
    if op == "fwd":
        fn, args, ref = pycudnn.dnn_conv, (x, w), ref_forward(x64, w64, *geo)
    elif op == "bwd_data":
        fn, args = pycudnn.dnn_gradinput, (w, dy, x.shape)
        ref = ref_backward_data(dy64, w64, x.shape, *geo)
    else:
        fn, args = pycudnn.dnn_gradweight, (x, dy, w.shape)
        ref = ref_backward_filter(x64, dy64, w.shape, *geo)
    kw = dict(conv_mode="cross")
    if kind == "strided_out":
        big = torch.randn(*ref.shape[:-1], ref.shape[-1] + 2, device="cuda").to(dt)
        out = big[..., : ref.shape[-1]]
        pad_before = big[..., ref.shape[-1] :].clone()
        prior = out.double().cpu().numpy()
        ref = 2.0 * ref - 3.0 * prior
        kw.update(out=out, alpha=2.0, beta=-3.0)
    got = fn(*args, **kw)
    torch.cuda.synchronize()
    err = rel_err(got, ref)
    assert err <= TOL[prec], (kind, op, prec, err)
    if kind == "strided_out":  # the padding around the output is untouched
        assert torch.equal(big[..., ref.shape[-1] :], pad_before)


def test_device_array_and_dlpack_io():
    rng = np.random.default_rng(0)
    x64, w64 = rng.standard_normal((2, 3, 8, 8)), rng.standard_normal((4, 3, 3, 3))
    x = pycudnn.to_device(x64.astype(np.float32))
    w = pycudnn.to_device(w64.astype(np.float32))
    y = pycudnn.dnn_conv(x, w, border_mode="half", conv_mode="cross")
    x32, w32 = (a.astype(np.float32).astype(np.float64) for a in (x64, w64))
    ref = ref_forward(x32, w32, (1, 1), (1, 1), (1, 1), 1, "cross")
    assert isinstance(y, memory.DeviceArray) and rel_err(y, ref) < 2e-5
    t = torch.from_dlpack(y)
    assert t.shape == (2, 4, 8, 8) and t.device.type == "cuda"
    try:
        import cupy
    except ImportError:
        return
    xc = cupy.asarray(x64.astype(np.float32))
    wc = cupy.asarray(w64.astype(np.float32))
    yc = pycudnn.dnn_conv(xc, wc, border_mode="half", conv_mode="cross")
    assert rel_err(yc, ref) < 2e-5


def test_unaligned_pointer_gets_its_own_plan():
    base = torch.randn(1 + 2 * 4 * 8 * 8, device="cuda")
    x_un = base[1:].view(2, 4, 8, 8)  # address 4 mod 16
    x_al = base[:-1].view(2, 4, 8, 8).clone()
    x_al.copy_(x_un)
    w = torch.randn(6, 4, 3, 3, device="cuda")
    a = torch.from_dlpack(pycudnn.dnn_conv(x_un, w, conv_mode="cross"))
    pa = _problem_of_last_call()
    b = torch.from_dlpack(pycudnn.dnn_conv(x_al, w, conv_mode="cross"))
    pb = _problem_of_last_call()
    assert pa.x_align == 4 and pb.x_align == 16 and pa != pb
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_zero_size_on_gpu():
    x = torch.randn(0, 4, 8, 8, device="cuda")
    dy = torch.randn(0, 6, 6, 6, device="cuda")
    w = torch.randn(6, 4, 3, 3, device="cuda")
    y = pycudnn.dnn_conv(x, w)
    assert tuple(y.shape) == (0, 6, 6, 6)
    dw = pycudnn.dnn_gradweight(x, dy, w.shape)
    assert np.all(dw.get() == 0)
    out = torch.full((6, 4, 3, 3), float("nan"), device="cuda")
    pycudnn.dnn_gradweight(x, dy, w.shape, out=out)
    assert torch.all(out == 0)


def test_side_stream():
    s = torch.cuda.Stream()
    x = torch.randn(4, 8, 16, 16, device="cuda")
    w = torch.randn(8, 8, 3, 3, device="cuda")
    ref = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
    torch.cuda.synchronize()
    out = torch.empty(4, 8, 16, 16, device="cuda")
    with torch.cuda.stream(s):
        pycudnn.dnn_conv(x, w, 1, conv_mode="cross", out=out, stream=s)
    assert pycudnn.get_handle().stream == s.cuda_stream
    s.synchronize()
    assert float((out.double() - ref).abs().max() / ref.abs().max()) < 2e-5


# ==================================================================================================
# faults
# ==================================================================================================
def test_failing_engines_fall_through_and_all_failing_is_one_error(monkeypatch):
    x = torch.randn(2, 4, 9, 9, device="cuda")
    w = torch.randn(4, 4, 3, 3, device="cuda")
    ref = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
    real = _plans._build_plan
    calls = []

    def flaky(cfg, handle):
        calls.append(1)
        if len(calls) <= 2:
            raise errors.NotSupportedError(3000, "cudnnBackendFinalize", "injected")
        return real(cfg, handle)

    conv.clear_caches()
    monkeypatch.setattr(_plans, "_build_plan", flaky)
    y = torch.from_dlpack(pycudnn.dnn_conv(x, w, 1, conv_mode="cross"))
    assert len(calls) >= 3
    assert float((y.double() - ref).abs().max() / ref.abs().max()) < 2e-5

    def never(cfg, handle):
        raise errors.NotSupportedError(3000, "cudnnBackendFinalize", "injected")

    monkeypatch.setattr(_plans, "_build_plan", never)
    with pytest.raises(errors.NotSupportedError) as info:
        pycudnn.dnn_conv(x, w, 2, conv_mode="cross")
    msg = str(info.value)
    assert "tried" in msg and msg.count("engine") >= 2
    print(f"\n[faults] all-failing message: {msg[:400]}")
    # nothing poisoned: the same call succeeds once engines build again
    monkeypatch.setattr(_plans, "_build_plan", real)
    y2 = pycudnn.dnn_conv(x, w, 2, conv_mode="cross")
    assert tuple(y2.shape) == (2, 4, 11, 11)


def test_workspace_failures(monkeypatch):
    x = torch.randn(8, 64, 32, 32, device="cuda")
    w = torch.randn(64, 64, 5, 5, device="cuda")
    ref = torch.nn.functional.conv2d(x.double(), w.double(), padding=2)
    kw = dict(border_mode="half", conv_mode="cross")
    conv.clear_caches()
    for algo in ("time_once", "guess_once"):
        y = torch.from_dlpack(pycudnn.dnn_conv(x, w, algo=algo, **kw))
        plan = _plans._plan_cache().data[_problem_of_last_call()]
        print(f"\n[workspace] {algo}: {plan.describe()}")
    assert float((y.double() - ref).abs().max() / ref.abs().max()) < 2e-5
    # a workspace limit of 0 picks a zero-workspace engine
    with _config.config.override(workspace_limit=0):
        y = torch.from_dlpack(pycudnn.dnn_conv(x, w, **kw))
        plan = _plans._plan_cache().data[_problem_of_last_call()]
    assert plan.workspace == 0
    assert float((y.double() - ref).abs().max() / ref.abs().max()) < 2e-5
    # a cached plan whose workspace can no longer be allocated is re-searched, not kept: find a
    # call whose plan needs a workspace (fp16 NHWC engines often do; legacy FFT always does)
    candidates = [
        (torch.randn(16, 64, 28, 28, device="cuda", dtype=torch.float16), torch.float16, None),
        (x, torch.float32, "fft"),
    ]
    chosen = None
    for xx, dt, algo in candidates:
        xx = xx.to(dt).contiguous(memory_format=torch.channels_last)
        ww = w.to(dt).contiguous(memory_format=torch.channels_last)
        if algo == "fft":
            xx, ww = xx.contiguous(), ww.contiguous()
        pycudnn.dnn_conv(xx, ww, algo=algo, **kw)
        plan = _plans._plan_cache().data[_problem_of_last_call()]
        if plan.workspace > 0:
            chosen = (xx, ww, algo, plan)
            break
    assert chosen is not None, "no plan with a workspace found"
    xx, ww, algo, plan = chosen
    limit = plan.workspace
    real = pycudnn.Handle.workspace

    def tight(handle, nbytes, stream=None):
        if nbytes >= limit:
            raise errors.AllocationError(4004, "Handle.workspace", "injected out of memory")
        return real(handle, nbytes, stream)

    monkeypatch.setattr(pycudnn.Handle, "workspace", tight)
    misses = conv.cache_info().misses
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the legacy algorithm falls back
        y = torch.from_dlpack(pycudnn.dnn_conv(xx, ww, algo=algo, **kw))
    assert conv.cache_info().misses == misses + 1
    plan2 = _plans._plan_cache().data[_problem_of_last_call()]
    print(f"  re-searched: {plan.describe()} -> {plan2.describe()}")
    assert plan2.workspace < limit
    ref = torch.nn.functional.conv2d(xx.double(), ww.double(), padding=2)
    err = float((y.double() - ref).abs().max() / ref.abs().max())
    assert err < (2e-5 if xx.dtype == torch.float32 else 5e-3)


# ==================================================================================================
# the plan cache and host overhead
# ==================================================================================================
def _per_call_us(*fns, calls=300, repeats=9):
    """Host microseconds per call of each function: (median, min) over *repeats* batches of
    *calls* back-to-back calls without synchronisation, the functions interleaved batch by
    batch (research/graph_api_overhead.md's method)."""
    for fn in fns:
        for _ in range(50):
            fn()
    torch.cuda.synchronize()
    samples = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[i].append((time.perf_counter() - t0) / calls * 1e6)
            torch.cuda.synchronize()
    out = []
    for smp in samples:
        smp.sort()
        out.append((smp[len(smp) // 2], smp[0]))
    return out if len(fns) > 1 else out[0]


def test_plan_cache_hits_and_host_time():
    x = torch.randn(1, 8, 8, 8, device="cuda")
    w = torch.randn(8, 8, 3, 3, device="cuda")
    out = torch.empty(1, 8, 8, 8, device="cuda")
    conv.clear_caches()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    pycudnn.dnn_conv(x, w, 1, conv_mode="cross", out=out)
    torch.cuda.synchronize()
    cold_ms = (time.perf_counter() - t0) * 1e3
    info1 = conv.cache_info()
    pycudnn.dnn_conv(x, w, 1, conv_mode="cross", out=out)
    info2 = conv.cache_info()
    assert info1.misses == 1 and info2.hits == info1.hits + 1 and info2.misses == 1
    ref = torch.nn.functional.conv2d(x, w, padding=1)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)

    mine_out, mine_alloc, theirs = _per_call_us(
        lambda: pycudnn.dnn_conv(x, w, 1, conv_mode="cross", out=out),
        lambda: pycudnn.dnn_conv(x, w, 1, conv_mode="cross"),
        lambda: torch.nn.functional.conv2d(x, w, padding=1),
    )
    # the Python part alone: cudnnBackendExecute stubbed out
    plan = _plans._plan_cache().data[_problem_of_last_call()]
    real_exec = _plans.execute_function()
    _execution._EXECUTE = lambda *a: 0
    try:
        python_only = _per_call_us(lambda: pycudnn.dnn_conv(x, w, 1, conv_mode="cross", out=out))
    finally:
        _execution._EXECUTE = real_exec
    ptrs = (x.data_ptr(), w.data_ptr(), out.data_ptr(), 0)
    raw = _per_call_us(lambda: plan.run(*ptrs))
    info = conv.cache_info()
    print(
        f"\n[host] tiny conv x(1,8,8,8) w(8,8,3,3) fp32, {torch.cuda.get_device_name()}:"
        f"\n  cold first call (plan search + build) {cold_ms:.2f} ms"
        f"\n  dnn_conv(out=) {mine_out[0]:.2f} us/call (min {mine_out[1]:.2f})"
        f"\n  dnn_conv() allocating {mine_alloc[0]:.2f} us/call (min {mine_alloc[1]:.2f})"
        f"\n  torch F.conv2d {theirs[0]:.2f} us/call (min {theirs[1]:.2f})"
        f"\n  Python part of dnn_conv(out=) (run stubbed) {python_only[0]:.2f} us/call"
        f"\n  GraphPlan.run alone (pack cached, execute) {raw[0]:.2f} us/call"
        f"\n  cache_info {info}  plan: {plan.describe()}"
    )
    # the search after clear_caches for a medium conv: cold cost
    x2 = torch.randn(32, 64, 56, 56, device="cuda", dtype=torch.float16).contiguous(
        memory_format=torch.channels_last
    )
    w2 = torch.randn(64, 64, 3, 3, device="cuda", dtype=torch.float16).contiguous(
        memory_format=torch.channels_last
    )
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    y2 = pycudnn.dnn_conv(x2, w2, 1, conv_mode="cross")
    torch.cuda.synchronize()
    cold2 = (time.perf_counter() - t0) * 1e3
    ref2 = torch.nn.functional.conv2d(x2, w2, padding=1)
    err = float(
        (torch.from_dlpack(y2).double() - ref2.double()).abs().max() / ref2.double().abs().max()
    )
    plan2 = _plans._plan_cache().data[_problem_of_last_call()]
    print(
        f"  medium fp16 NHWC cold first call {cold2:.2f} ms, {plan2.describe()}, "
        f"err vs torch {err:.2e}"
    )
    assert err < 1e-2
    assert math.isfinite(mine_out[0])


def test_threads_get_their_own_handles_and_caches():
    import threading

    x = torch.randn(4, 8, 12, 12, device="cuda")
    w = torch.randn(8, 8, 3, 3, device="cuda")
    ref = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
    torch.cuda.synchronize()
    results, handles, errs = {}, {}, []

    def work(i):
        try:
            s = torch.cuda.Stream()
            outs = []
            for _ in range(20):
                outs.append(pycudnn.dnn_conv(x, w, 1, conv_mode="cross", stream=s))
            s.synchronize()
            handles[i] = pycudnn.get_handle().ptr
            results[i] = max(
                float((torch.from_dlpack(o).double() - ref).abs().max() / ref.abs().max())
                for o in outs
            )
        except Exception as exc:  # reported below
            errs.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errs, errs
    assert len(set(handles.values())) == 6
    assert max(results.values()) < 2e-5
