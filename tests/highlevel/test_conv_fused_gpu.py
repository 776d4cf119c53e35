"""GPU tests of the fused convolution epilogue (marker ``gpu``; skipped without a device).

Run on the GPU machine:
``PYTHONPATH=. python3 -m pytest -m gpu -q -s tests/highlevel/test_conv_fused_gpu.py``.

Every activation x dtype/layout x {bias, no bias} x {z, no z}: the result of
``dnn_conv(..., bias=, activation=, z=, z_alpha=)`` against a float64 NumPy reference (inputs
rounded to the dtype first) and against the unfused composition (torch's ``F.conv2d`` then the
bias, the residual and the activation in the data type). Outputs are NaN-poisoned ``out=``
tensors. Which path ran (one fused engine or the separate steps) is recorded; on sm90 packed
NHWC bf16/fp16 the fused engine must run. A summary line is printed last (``-s``).
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
from references import act_ref, conv_ref

torch = pytest.importorskip("torch")
F = pytest.importorskip("torch.nn.functional")

import pycudnn  # noqa: E402
from pycudnn import errors  # noqa: E402
from pycudnn.highlevel import _call, conv  # noqa: E402

pytestmark = pytest.mark.gpu

TDT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TOL = {"bf16": 2e-2, "fp16": 5e-3, "fp32": 2e-5}  # max |got - ref| / max |ref|
ACTS = [
    None,
    "relu",
    "gelu",
    "gelu_tanh",
    "silu",
    "sigmoid",
    "tanh",
    ("clipped_relu", 1.5),
    ("elu", 0.7),
]
LAYOUTS = [("bf16", True), ("fp16", True), ("fp32", False), ("bf16", False)]
PATHS: collections.Counter = collections.Counter()
NOT_FUSED: list[str] = []  # packed NHWC half/bfloat16 cases that ran unfused, and why


@pytest.fixture(scope="module", autouse=True)
def _gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    pycudnn.config.allow_tf32 = False
    yield
    pycudnn.get_handle().set_stream(0)


def _dev(a, dt, nhwc):
    t = torch.from_numpy(a).to("cuda", TDT[dt])
    if nhwc and t.ndim >= 4:
        t = t.contiguous(
            memory_format=torch.channels_last if t.ndim == 4 else torch.channels_last_3d
        )
    return t


def _name(act):
    return act if act is None or isinstance(act, str) else act[0]


def _ref_act(v, act):
    if act is None:
        return v
    name, coef = (act, 1.0) if isinstance(act, str) else act
    return act_ref(v, "swish" if name == "silu" else name, coef)


def _torch_act(t, act):
    if act is None:
        return t
    name, coef = (act, None) if isinstance(act, str) else act
    return {
        "relu": F.relu,
        "gelu": F.gelu,
        "gelu_tanh": lambda v: F.gelu(v, approximate="tanh"),
        "silu": F.silu,
        "sigmoid": torch.sigmoid,
        "tanh": torch.tanh,
        "clipped_relu": lambda v: torch.clamp(v, 0, coef),
        "elu": lambda v: F.elu(v, coef),
    }[name](t)


@pytest.mark.parametrize(
    ("dt", "nhwc"), LAYOUTS, ids=[f"{d}-{'nhwc' if n else 'nchw'}" for d, n in LAYOUTS]
)
@pytest.mark.parametrize("act", ACTS, ids=[str(_name(a)) for a in ACTS])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("with_z", [True, False], ids=["z", "noz"])
def test_fused_matches_reference_and_composition(dt, nhwc, act, with_bias, with_z):
    if act is None and not with_bias and not with_z:
        pytest.skip("no epilogue: the plain convolution")
    rng = np.random.default_rng(abs(hash((dt, nhwc, str(act), with_bias, with_z))) % 2**32)
    n, c, k, hw = 2, 16, 32, 9
    x = _dev(rng.standard_normal((n, c, hw, hw)), dt, nhwc)
    w = _dev(rng.standard_normal((k, c, 3, 3)) / 12, dt, nhwc)
    b = _dev(rng.standard_normal(k), dt, False) if with_bias else None
    z = _dev(rng.standard_normal((n, k, hw, hw)), dt, nhwc) if with_z else None
    out = torch.full((n, k, hw, hw), float("nan"), device="cuda", dtype=TDT[dt])
    if nhwc:
        out = out.contiguous(memory_format=torch.channels_last)
    kw = dict(border_mode=1, conv_mode="cross", bias=b, activation=act, z=z, out=out)
    if with_z:
        kw["z_alpha"] = 0.5
    try:
        got = pycudnn.dnn_conv(x, w, **kw)
    except errors.NotSupportedError as exc:
        # only a GELU that neither a fused engine nor an epilogue graph runs
        assert _name(act) in ("gelu", "gelu_tanh") and "no legacy kernel" in str(exc), exc
        PATHS[(dt, nhwc, "gelu not supported")] += 1
        if nhwc:
            NOT_FUSED.append(f"{dt} {_name(act)} bias={with_bias} z={with_z}: not supported")
        return
    assert got is out
    call = conv.last_call()
    PATHS[(dt, nhwc, "fused" if call.fused else "separate")] += 1
    if nhwc and not call.fused:
        entry = list(_call.calls().data.values())[-1]
        NOT_FUSED.append(f"{dt} {_name(act)} bias={with_bias} z={with_z}: {entry.why[:160]}")
    assert call.epilogue is not None
    # float64 reference from the rounded inputs
    xr, wr = x.double().cpu().numpy(), w.double().cpu().numpy()
    ref = conv_ref(xr, wr, (1, 1))
    if with_z:
        ref = ref + 0.5 * z.double().cpu().numpy()
    if with_bias:
        ref = ref + b.double().cpu().numpy()[None, :, None, None]
    ref = _ref_act(ref, act)
    g = out.double().cpu().numpy()
    assert not np.isnan(g).any(), "an unwritten output element"
    scale = max(float(np.abs(ref).max()), 1e-30)
    err = float(np.abs(g - ref).max()) / scale
    assert err <= TOL[dt], f"{call.plan.describe()} fused={call.fused}: error {err:.2e}"
    # the unfused composition in the data type (torch eager)
    comp = F.conv2d(x, w, None, 1, 1)
    if with_z:
        comp = comp + 0.5 * z
    if with_bias:
        comp = comp + b[None, :, None, None]
    comp = _torch_act(comp, act).double().cpu().numpy()
    err2 = float(np.abs(g - comp).max()) / scale
    assert err2 <= 2 * TOL[dt], f"fused vs composition: {err2:.2e}"


def test_sm90_bf16_nhwc_runs_fused():
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("runtime fusion needs sm80+")
    x = torch.randn(8, 64, 14, 14, device="cuda", dtype=torch.bfloat16).to(
        memory_format=torch.channels_last
    )
    w = torch.randn(64, 64, 3, 3, device="cuda", dtype=torch.bfloat16).to(
        memory_format=torch.channels_last
    )
    b = torch.randn(64, device="cuda", dtype=torch.bfloat16)
    pycudnn.dnn_conv(x, w, border_mode=1, conv_mode="cross", bias=b, activation="relu")
    call = conv.last_call()
    print(f"\nFUSED bf16 NHWC conv+bias+relu: {call.plan.describe()} fused={call.fused}")
    assert call.fused, call.plan.describe()
    assert "fused conv+bias+relu" in call.plan.describe()


def test_fallbacks_give_the_same_result():
    """A legacy algorithm, a strided (staged) output and an NCHW fp32 call: separate steps."""
    torch.manual_seed(0)
    x = torch.randn(2, 8, 10, 10, device="cuda")
    w = torch.randn(16, 8, 3, 3, device="cuda") / 8
    b = torch.randn(16, device="cuda")
    z = torch.randn(2, 16, 10, 10, device="cuda")
    want = F.relu(F.conv2d(x, w, b, 1, 1) + z)
    got = torch.from_dlpack(
        pycudnn.dnn_conv(
            x, w, border_mode=1, conv_mode="cross", bias=b, z=z, activation="relu", algo="small"
        )
    )
    call = conv.last_call()
    assert not call.fused and call.plan.kind == "legacy"
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    big = torch.full((2, 16, 10, 20), float("nan"), device="cuda")
    out = big[..., ::2]  # strided: staged
    pycudnn.dnn_conv(
        x, w, border_mode=1, conv_mode="cross", bias=b, z=z, activation="relu", out=out
    )
    assert not conv.last_call().fused
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)


def test_fused_3d_and_alpha():
    x = torch.randn(2, 16, 6, 6, 6, device="cuda", dtype=torch.bfloat16).contiguous(
        memory_format=torch.channels_last_3d
    )
    w = (torch.randn(32, 16, 3, 3, 3, device="cuda", dtype=torch.bfloat16) / 12).contiguous(
        memory_format=torch.channels_last_3d
    )
    b = torch.randn(1, 32, 1, 1, 1, device="cuda", dtype=torch.bfloat16)
    got = torch.from_dlpack(
        pycudnn.dnn_conv3d(
            x, w, border_mode=1, conv_mode="cross", bias=b, activation="relu", alpha=2.0
        )
    )
    want = F.relu(2.0 * F.conv3d(x.double(), w.double(), None, 1, 1) + b.double())
    err = (got.double() - want).abs().max() / want.abs().max()
    PATHS[("bf16-3d", True, "fused" if conv.last_call().fused else "separate")] += 1
    assert err < 2e-2, err


def test_zz_summary():
    """Print which path each case took (read with ``-s``)."""
    fused = sum(v for (_d, _n, p), v in PATHS.items() if p == "fused")
    sep = sum(v for (_d, _n, p), v in PATHS.items() if p == "separate")
    ns = sum(v for (_d, _n, p), v in PATHS.items() if p == "gelu not supported")
    detail = ", ".join(
        f"{d}/{'nhwc' if n else 'nchw'} {p}: {v}" for (d, n, p), v in sorted(PATHS.items())
    )
    print(
        f"\nFUSED summary: {fused + sep + ns} cases, fused {fused}, separate steps {sep}, "
        f"GELU without an engine {ns} ({detail})"
    )
    for line in NOT_FUSED:
        print(f"FUSED not fused: {line}")
    assert fused > 0
