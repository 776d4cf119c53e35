"""CPU tests of the convolution front end (no GPU, no cuDNN call).

* the validation catalogue (research/reliability_perf.md A1): every bad input raises before any
  handle, descriptor, allocation or cuDNN call -- a fixture makes each of those fail loudly;
* output shapes for every border mode;
* the plan-cache key: every argument that changes the plan changes the Problem; LRU bounds;
* the hot path's bookkeeping with fake plans: one validation per distinct call, pointer roles,
  overlap checks, counters;
* flag parsing (algorithm names per direction, precision, config overrides).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import pycudnn
from pycudnn import _config, _layout
from pycudnn.enums import ConvolutionMode, DataType
from pycudnn.graph import _plans
from pycudnn.highlevel import _call, _operand, conv
from pycudnn.highlevel.conv import _prepare
from pycudnn.highlevel.conv import _problem as problem_mod
from pycudnn.highlevel.conv._problem import OP_BWD_DATA, OP_BWD_FILTER, OP_FWD, Problem

REAL_PLAN = _plans.plan  # the capture fixture replaces the engine's entry
F32, F64, F16, BF16 = DataType.FLOAT, DataType.DOUBLE, DataType.HALF, DataType.BFLOAT16
_addr = itertools.count(1)


def _packed(shape, nhwc=False):
    return _layout.packed_strides(tuple(shape), nhwc)


class Fake:
    """A fake device array: an address, shape, element strides, DataType and device."""

    def __init__(self, shape, dt=F32, strides=None, ptr=None, device=0, nhwc=False):
        self.shape = tuple(shape)
        self.dt = dt
        self.strides = tuple(strides) if strides is not None else _packed(shape, nhwc)
        self.ptr = (next(_addr) << 32) if ptr is None else ptr
        self.device = device


conv.register_operand_type(Fake, lambda f: (f.ptr, f.shape, f.strides, f.dt, f.device))


class CCall(BaseException):
    """Raised by every patched entry point into the GPU/cuDNN: a validation error must come first
    (BaseException, so ``pytest.raises(ValueError)`` cannot swallow it)."""


def _boom(*args, **kwargs):
    raise CCall("a handle, descriptor, allocation or cuDNN call was attempted")


@pytest.fixture
def no_c(monkeypatch):
    """Make every way into CUDA/cuDNN raise CCall."""
    monkeypatch.setattr(_call._handle, "get_handle", _boom)
    monkeypatch.setattr(_plans, "BackendDescriptor", _boom)
    monkeypatch.setattr(problem_mod, "BackendDescriptor", _boom)
    monkeypatch.setattr(_call, "cudnn_version", _boom)
    for name in ("empty", "zeros", "get_workspace", "asarray"):
        monkeypatch.setattr(conv.memory, name, _boom)
    conv.clear_caches()
    yield
    conv.clear_caches()


class DummyHandle:
    ptr = 0x1234
    device = 0
    stream = 0

    def set_stream(self, s):
        self.stream = s
        return s


class FakePlan:
    workspace = 0
    kind = "fake"

    def __init__(self, p):
        self.p = p
        self.runs = []

    def run(self, xp, wp, yp, wsp):
        self.runs.append((xp, wp, yp, wsp))

    def describe(self):
        return "fake"

    def close(self):
        pass


@pytest.fixture
def capture(monkeypatch):
    """Run the front end with a fake handle/plan/allocator; record the Problems planned."""
    problems: list[Problem] = []
    plans: list[FakePlan] = []
    handle = DummyHandle()

    def plan(p, h, given_ptrs=None):
        problems.append(p)
        plan = FakePlan(p)
        plans.append(plan)
        return plan

    def allocate(shape, dtype, device=None, stream=None, *, strides=None):
        isz = np.dtype(dtype).itemsize
        return Fake(shape, _operand.data_type(dtype), tuple(s // isz for s in strides))

    monkeypatch.setattr(_call._handle, "get_handle", lambda device=None: handle)
    monkeypatch.setattr(_call, "cudnn_version", lambda: 91900)
    monkeypatch.setattr(_plans, "plan", plan)
    monkeypatch.setattr(conv.memory, "empty", allocate)
    monkeypatch.setattr(conv.memory, "zeros", _boom)
    conv.clear_caches()
    yield problems, plans
    conv.clear_caches()


OUT = (2, 6, 6, 6)  # dnn_conv(x4(), w4())'s output


def x4(n=2, c=4, h=8, w=8, **kw):
    return Fake((n, c, h, w), **kw)


def w4(k=6, c=4, kh=3, kw=3, **kw_):
    return Fake((k, c, kh, kw), **kw_)


# ==================================================================================================
# Validation catalogue: nothing reaches C
# ==================================================================================================
BAD_FWD = [
    # (kwargs for dnn_conv, exception, message fragment)
    (dict(img=Fake((2, 4, 8)), kerns=w4()), ValueError, "4-D operands"),
    (dict(img=Fake((2, 4, 8, 8, 8)), kerns=w4()), ValueError, "dnn_conv3d"),
    (dict(img=x4(), kerns=Fake((6, 4, 3, 3, 3))), ValueError, "(6, 4, 3, 3, 3)"),
    (dict(img=x4(c=5), kerns=w4()), ValueError, "input channels"),
    (dict(img=x4(), kerns=w4(), num_groups=0), ValueError, "num_groups"),
    (dict(img=x4(), kerns=w4(), num_groups=-2), ValueError, "num_groups"),
    (dict(img=x4(), kerns=w4(), num_groups=True), TypeError, "num_groups"),
    (dict(img=x4(), kerns=w4(), num_groups=1.0), TypeError, "num_groups"),
    (dict(img=x4(c=4), kerns=w4(k=6, c=1), num_groups=4), ValueError, "divide"),  # K % g
    (dict(img=x4(c=6), kerns=w4(k=8, c=1), num_groups=4), ValueError, "divide"),  # C % g
    (dict(img=x4(c=4), kerns=w4(k=4, c=2), num_groups=4), ValueError, "input channels"),
    (dict(img=x4(), kerns=w4(), border_mode=-1), ValueError, "negative"),
    (dict(img=x4(), kerns=w4(), border_mode=(1, -1)), ValueError, "negative"),
    (dict(img=x4(), kerns=w4(), border_mode=(1, 1, 1)), ValueError, "2 values"),
    (dict(img=x4(), kerns=w4(), border_mode="same"), ValueError, "border_mode"),
    (dict(img=x4(), kerns=w4(), border_mode=1.5), TypeError, "border_mode"),
    (dict(img=x4(), kerns=w4(), subsample=(0, 1)), ValueError, "non-positive"),
    (dict(img=x4(), kerns=w4(), subsample=(-1, -1)), ValueError, "non-positive"),
    (dict(img=x4(), kerns=w4(), subsample=(1,)), ValueError, "2 values"),
    (dict(img=x4(), kerns=w4(), dilation=0), ValueError, "dilation"),
    (dict(img=x4(), kerns=w4(), dilation=(1, 0)), ValueError, "dilation"),
    (dict(img=x4(h=2, w=2), kerns=w4()), ValueError, "empty"),
    (dict(img=x4(), kerns=w4(), dilation=(5, 5)), ValueError, "empty"),
    (
        dict(img=x4(), kerns=w4(), subsample=(1, 1), border_mode=(0, 0), conv_mode="corr"),
        ValueError,
        "conv_mode",
    ),
    (dict(img=x4(), kerns=w4(dt=F64)), TypeError, "same dtype"),
    (dict(img=x4(dt=DataType.INT32), kerns=w4(dt=DataType.INT32)), TypeError, "unsupported dtype"),
    (dict(img=x4(), kerns=w4(), out=Fake((2, 6, 6, 6), dt=F16)), TypeError, "same dtype"),
    (dict(img=x4(), kerns=w4(), out=Fake((2, 6, 5, 6))), ValueError, "out has shape"),
    (dict(img=x4(), kerns=w4(), out=Fake((2, 6, 6, 6), strides=(36, 0, 6, 1))), ValueError, "zero"),
    (
        dict(img=x4(), kerns=w4(), out=Fake((2, 6, 6, 6), strides=(36, 6, 6, 1))),
        ValueError,
        "overlap",
    ),
    (dict(img=x4(ptr=(1 << 32) + 2), kerns=w4()), ValueError, "multiple of its element size"),
    (dict(img=x4(), kerns=w4(device=1)), ValueError, "device"),
    (dict(img=x4(strides=(256, 64, 8, -1)), kerns=w4()), ValueError, "negative stride"),
    (dict(img=x4(strides=(256, 0, 8, 1)), kerns=w4()), ValueError, "zero (broadcast) stride"),
    (dict(img=x4(), kerns=w4(), precision="float16"), ValueError, "not available for float32"),
    (dict(img=x4(dt=F64), kerns=w4(dt=F64), precision="float32"), ValueError, "float64"),
    (dict(img=x4(dt=BF16), kerns=w4(dt=BF16), precision="float16"), ValueError, "bfloat16"),
    (dict(img=x4(), kerns=w4(), precision="quad"), ValueError, "precision"),
    (dict(img=x4(), kerns=w4(), precision=32), TypeError, "precision"),
    (dict(img=x4(), kerns=w4(), algo="fastest"), ValueError, "algo"),
    (dict(img=x4(), kerns=w4(), algo=3), TypeError, "algo"),
    (dict(img=x4(), kerns=w4(), direction_hint="sideways"), ValueError, "direction_hint"),
    (dict(img=x4(), kerns=w4(), alpha="2"), TypeError, "alpha"),
    (dict(img=x4(), kerns=w4(), beta=None), TypeError, "beta"),
    # int32 overflow: a dimension, a stride, and a span beyond 2**31 - 1 (fake pointers)
    (dict(img=x4(n=2**31), kerns=w4()), OverflowError, "32-bit"),
    (dict(img=Fake((70000, 4, 100, 100)), kerns=w4()), OverflowError, "32-bit"),
    (dict(img=x4(strides=(2**31, 64, 8, 1)), kerns=w4()), OverflowError, "32-bit"),
]


@pytest.mark.parametrize(("kwargs", "exc", "fragment"), BAD_FWD)
def test_dnn_conv_rejects_before_any_c_call(no_c, kwargs, exc, fragment):
    with pytest.raises(exc) as info:
        pycudnn.dnn_conv(**kwargs)
    assert fragment in str(info.value)


def test_dnn_conv3d_rank(no_c):
    with pytest.raises(ValueError, match="5-D operands"):
        pycudnn.dnn_conv3d(x4(), w4())
    with pytest.raises(ValueError, match="3 values"):
        pycudnn.dnn_conv3d(Fake((1, 2, 4, 4, 4)), Fake((2, 2, 1, 1, 1)), subsample=(1, 1))


def test_host_and_non_arrays_name_to_device(no_c):
    with pytest.raises(TypeError, match="to_device"):
        pycudnn.dnn_conv(np.zeros((1, 1, 3, 3), np.float32), w4(c=1))
    with pytest.raises(TypeError, match="device array"):
        pycudnn.dnn_conv([[1.0]], w4())


def test_torch_cpu_tensor_names_cuda(no_c):
    # a CPU torch tensor is told to move with torch's own .cuda() (numpy arrays: to_device)
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"img is a CPU torch tensor.*tensor\.cuda\(\)"):
        pycudnn.dnn_conv(torch.zeros(1, 1, 3, 3), torch.zeros(1, 1, 1, 1))


BAD_GRAD = [
    # gradinput(kerns, topgrad, img_shp)
    (
        pycudnn.dnn_gradinput,
        (w4(), Fake((2, 6, 6, 6)), None),
        {},
        ValueError,
        "img_shp is required",
    ),
    (pycudnn.dnn_gradinput, (w4(), Fake((2, 6, 6, 6)), (2, 4, 8)), {}, ValueError, "4 entries"),
    (pycudnn.dnn_gradinput, (w4(), Fake((2, 6, 6, 6)), (2, 4, 9, 8)), {}, ValueError, "img_shp"),
    (
        pycudnn.dnn_gradinput,
        (w4(), Fake((2, 6, 6, 6)), (2, 5, 8, 8)),
        {},
        ValueError,
        "input channels",
    ),
    (pycudnn.dnn_gradinput, (w4(), Fake((2, 7, 6, 6)), (2, 4, 8, 8)), {}, ValueError, "topgrad"),
    (pycudnn.dnn_gradinput, (w4(), Fake((3, 6, 6, 6)), (2, 4, 8, 8)), {}, ValueError, "topgrad"),
    (
        pycudnn.dnn_gradinput,
        (w4(), Fake((2, 6, 6, 6)), (2, 4, 8, -8)),
        {},
        ValueError,
        "non-negative",
    ),
    (pycudnn.dnn_gradinput, (w4(), Fake((2, 6, 6, 6)), "abcd"), {}, ValueError, "non-negative"),
    (pycudnn.dnn_gradinput, (w4(), Fake((2, 6, 6, 6)), 7), {}, TypeError, "img_shp"),
    (
        pycudnn.dnn_gradinput,
        (w4(), Fake((2, 6, 6, 6)), (2, 4, 8, 8)),
        dict(out=Fake((2, 4, 8, 9))),
        ValueError,
        "out has shape",
    ),
    (
        pycudnn.dnn_gradinput,
        (w4(), Fake((2, 6, 6, 6)), (2, 4, 8, 8)),
        dict(algo="large"),
        ValueError,
        "algo",
    ),
    (
        pycudnn.dnn_gradinput,
        (w4(), Fake((2, 6, 6, 6)), (2, 4, 8, 8)),
        dict(algo="small"),
        ValueError,
        "algo",
    ),
    # gradweight(img, topgrad, kerns_shp)
    (
        pycudnn.dnn_gradweight,
        (x4(), Fake((2, 6, 6, 6)), None),
        {},
        ValueError,
        "kerns_shp is required",
    ),
    (pycudnn.dnn_gradweight, (x4(), Fake((2, 6, 6, 6)), (6, 4, 3, 4)), {}, ValueError, "kerns_shp"),
    (
        pycudnn.dnn_gradweight,
        (x4(), Fake((2, 6, 6, 6)), (6, 4, 0, 3)),
        {},
        ValueError,
        "kernel spatial",
    ),
    (
        pycudnn.dnn_gradweight,
        (x4(), Fake((2, 6, 6, 6)), (6, 3, 3, 3)),
        {},
        ValueError,
        "input channels",
    ),
    (
        pycudnn.dnn_gradweight,
        (x4(), Fake((2, 5, 6, 6)), (5, 2, 3, 3)),
        dict(num_groups=2),
        ValueError,
        "divide",
    ),
    (
        pycudnn.dnn_gradweight,
        (x4(), Fake((2, 6, 6, 6), dt=F16), (6, 4, 3, 3)),
        {},
        TypeError,
        "same dtype",
    ),
    (
        pycudnn.dnn_gradweight,
        (x4(), Fake((2, 6, 6, 6)), (6, 4, 3, 3)),
        dict(algo="winograd"),
        ValueError,
        "algo",
    ),
    (
        pycudnn.dnn_gradweight,
        (x4(), Fake((2, 6, 6, 6)), (6, 4, 3, 3)),
        dict(out=Fake((6, 4, 3, 4))),
        ValueError,
        "kerns_shp",
    ),
    (pycudnn.dnn_gradweight3d, (x4(), Fake((2, 6, 6, 6)), (6, 4, 3, 3)), {}, ValueError, "5-D"),
]


@pytest.mark.parametrize(("fn", "args", "kwargs", "exc", "fragment"), BAD_GRAD)
def test_gradients_reject_before_any_c_call(no_c, fn, args, kwargs, exc, fragment):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert fragment in str(info.value)


def test_out_overlapping_input_is_rejected(capture):
    img, kerns = x4(), w4()
    alias = Fake((2, 6, 6, 6), ptr=img.ptr + 64)  # inside img's bytes
    with pytest.raises(ValueError, match="overlaps an input"):
        pycudnn.dnn_conv(img, kerns, out=alias)
    ok = Fake((2, 6, 6, 6))
    pycudnn.dnn_conv(img, kerns, out=ok)
    # the cached call entry checks overlap too (the pointer is not part of the call key)
    alias2 = Fake((2, 6, 6, 6), ptr=kerns.ptr)
    with pytest.raises(ValueError, match="overlaps an input"):
        pycudnn.dnn_conv(img, kerns, out=alias2)


# ==================================================================================================
# Zero-size problems: an empty result and no cuDNN call
# ==================================================================================================
def test_zero_batch_returns_empty_without_cudnn(no_c, monkeypatch):
    made = []

    def empty(shape, dtype, device=None, stream=None, *, strides=None):
        made.append(("empty", tuple(shape)))
        return Fake(shape)

    def zeros(shape, dtype, device=None, stream=None, *, strides=None):
        made.append(("zeros", tuple(shape)))
        return Fake(shape)

    monkeypatch.setattr(conv.memory, "empty", empty)
    monkeypatch.setattr(conv.memory, "zeros", zeros)
    y = pycudnn.dnn_conv(x4(n=0), w4())
    assert y.shape == (0, 6, 6, 6) and made == [("empty", (0, 6, 6, 6))]
    made.clear()
    dx = pycudnn.dnn_gradinput(w4(), Fake((0, 6, 6, 6)), (0, 4, 8, 8))
    assert dx.shape == (0, 4, 8, 8) and made == [("empty", (0, 4, 8, 8))]
    made.clear()
    # gradient w.r.t. the filters of an empty batch: a sum over nothing, zeros
    dw = pycudnn.dnn_gradweight(x4(n=0), Fake((0, 6, 6, 6)), (6, 4, 3, 3))
    assert dw.shape == (6, 4, 3, 3) and made == [("zeros", (6, 4, 3, 3))]
    made.clear()
    # no input channels: the forward output is zeros
    y = pycudnn.dnn_conv(x4(c=0), w4(c=0))
    assert y.shape == (2, 6, 6, 6) and made == [("zeros", (2, 6, 6, 6))]
    made.clear()
    # out= given with an empty output: returned as is, nothing allocated
    out = Fake((0, 6, 6, 6))
    assert pycudnn.dnn_conv(x4(n=0), w4(), out=out) is out and made == []
    # the 3-D functions too
    y = pycudnn.dnn_conv3d(Fake((0, 2, 4, 4, 4)), Fake((3, 2, 1, 1, 1)))
    assert y.shape == (0, 3, 4, 4, 4)


# ==================================================================================================
# Output shapes
# ==================================================================================================
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("s", [1, 2, 3])
@pytest.mark.parametrize("i", [7, 8, 16])
def test_output_shape_every_border_mode(i, k, d, s):
    dk = (k - 1) * d + 1
    expected_pad = {"valid": 0, "full": dk - 1, "half": dk // 2, 2: 2, (1, 1): 1}
    for mode, pad in expected_pad.items():
        o = (i + 2 * pad - dk) // s + 1
        got = conv.get_conv_output_shape((3, 5, i, i), (7, 5, k, k), mode, (s, s), (d, d))
        assert got == (3, 7, o, o), (mode, i, k, d, s)
    # Theano's identities at unit stride
    if s == 1 and i >= dk:
        assert (
            conv.get_conv_output_shape((1, 1, i, i), (1, 1, k, k), "valid", 1, d)[2] == i - dk + 1
        )
        assert conv.get_conv_output_shape((1, 1, i, i), (1, 1, k, k), "full", 1, d)[2] == i + dk - 1
        if dk % 2:
            assert conv.get_conv_output_shape((1, 1, i, i), (1, 1, k, k), "half", 1, d)[2] == i


def test_output_shape_3d_and_mixed():
    assert conv.get_conv_output_shape(
        (2, 3, 9, 10, 11), (4, 3, 3, 2, 1), (1, 0, 2), (2, 1, 3), (1, 2, 1)
    ) == (
        2,
        4,
        5,
        8,
        5,
    )
    with pytest.raises(ValueError):
        conv.get_conv_output_shape((2, 3, 9, 9), (4, 3, 3), "valid")


def test_output_shape_matches_torch_formula():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    for _ in range(50):
        i, k = int(rng.integers(4, 20)), int(rng.integers(1, 5))
        p, s, d = int(rng.integers(0, 3)), int(rng.integers(1, 4)), int(rng.integers(1, 3))
        if i + 2 * p < (k - 1) * d + 1:
            continue
        y = torch.nn.functional.conv2d(
            torch.zeros(1, 1, i, i), torch.zeros(1, 1, k, k), padding=p, stride=s, dilation=d
        )
        assert conv.get_conv_output_shape((1, 1, i, i), (1, 1, k, k), p, s, d) == tuple(y.shape)


# ==================================================================================================
# The plan key: every field that changes the plan changes the Problem
# ==================================================================================================
def _problem(capture, fn=pycudnn.dnn_conv, *args, **kwargs):
    problems = capture[0]
    n = len(problems)
    fn(*args, **kwargs)
    assert len(problems) == n + 1, "expected a new plan"
    return problems[-1]


def test_every_argument_changes_the_key(capture):
    problems, _ = capture
    base_args = (x4(), w4())
    base = _problem(capture, pycudnn.dnn_conv, *base_args)
    variants = {
        "dtype": ((x4(dt=F64), w4(dt=F64)), {}),
        "shape": ((x4(n=3), w4()), {}),
        "filter shape": ((x4(), w4(k=5)), {}),
        "layout NHWC": ((x4(nhwc=True), w4(nhwc=True)), {}),
        "pads": (base_args, {"border_mode": 1}),
        "stride": (base_args, {"subsample": (2, 1)}),
        "dilation": (base_args, {"dilation": (1, 2)}),
        "groups": ((x4(), w4(c=2)), {"num_groups": 2}),
        "conv mode": (base_args, {"conv_mode": "cross"}),
        "precision": ((x4(dt=F16), w4(dt=F16)), {"precision": "float16"}),
        "alpha": (base_args, {"alpha": 2.0}),
        # beta reads out (issue 42: refused without one)
        "beta": (base_args, {"beta": -3.0, "out": Fake((2, 6, 6, 6))}),
        "algo policy": (base_args, {"algo": "time_once"}),
        "alignment": ((x4(ptr=(next(_addr) << 32) + 4), w4()), {}),
        "device": ((x4(device=1), w4(device=1)), {}),
    }
    seen = {base}
    for name, (args, kwargs) in variants.items():
        p = _problem(capture, pycudnn.dnn_conv, *args, **kwargs)
        assert p not in seen, name
        seen.add(p)
    for name, flags in {
        "tf32": {"allow_tf32": True},
        "determinism": {"deterministic": True},
        "workspace limit": {"workspace_limit": 1 << 20},
    }.items():
        with _config.config.override(**flags):
            p = _problem(capture, pycudnn.dnn_conv, *base_args)
        assert p not in seen, name
        seen.add(p)
    # algo='deterministic' is the same problem as config.deterministic
    assert _problem(capture, pycudnn.dnn_conv, *base_args, algo="deterministic") in seen
    # operations
    for fn, args in (
        (pycudnn.dnn_gradinput, (w4(), Fake((2, 6, 6, 6)), (2, 4, 8, 8))),
        (pycudnn.dnn_gradweight, (x4(), Fake((2, 6, 6, 6)), (6, 4, 3, 3))),
    ):
        p = _problem(capture, fn, *args)
        assert p not in seen
        seen.add(p)
    # the specific fields
    assert base.op == OP_FWD and base.mode == ConvolutionMode.CONVOLUTION
    assert base.compute == F32 and not base.allow_tf32 and not base.deterministic
    assert base.workspace_limit == -1 and base.algo == "guess"
    assert (base.x_align, base.w_align, base.y_align) == (16, 16, 16)
    assert problems[-1].op == OP_BWD_FILTER and problems[-2].op == OP_BWD_DATA


def test_same_problem_spelt_differently_shares_the_plan_key(capture):
    img, kerns = x4(), w4()
    a = _problem(capture, pycudnn.dnn_conv, img, kerns, border_mode="half")
    b = _problem(capture, pycudnn.dnn_conv, img, kerns, border_mode=(1, 1), subsample=1)
    c = _problem(capture, pycudnn.dnn_conv, img, kerns, border_mode=1, algo="guess_on_shape_change")
    assert a == b == c


def test_fields_normalised(capture):
    # tf32 only matters for float32 data; size-1 dims get canonical strides
    with _config.config.override(allow_tf32=True):
        p16 = _problem(capture, pycudnn.dnn_conv, x4(dt=F16), w4(dt=F16))
        p32 = _problem(capture, pycudnn.dnn_conv, x4(), w4())
    assert not p16.allow_tf32 and p32.allow_tf32
    odd = Fake((1, 4, 8, 8), strides=(999, 64, 8, 1))
    p = _problem(capture, pycudnn.dnn_conv, odd, w4())
    assert p.x_strides == (256, 64, 8, 1)
    # NHWC inputs give NHWC problem strides, and an NHWC output allocation
    p = _problem(capture, pycudnn.dnn_conv, x4(nhwc=True), w4(nhwc=True))
    assert p.x_strides == _packed((2, 4, 8, 8), True) and p.y_strides == _packed((2, 6, 6, 6), True)
    # precision: as_input_f32 computes fp16 in fp32, as_input in fp16; bf16 always in fp32
    assert (
        _problem(capture, pycudnn.dnn_conv, x4(dt=F16), w4(dt=F16), precision="as_input").compute
        == F16
    )
    assert (
        _problem(capture, pycudnn.dnn_conv, x4(dt=BF16), w4(dt=BF16), precision="as_input").compute
        == F32
    )
    assert _problem(capture, pycudnn.dnn_conv, x4(dt=F64), w4(dt=F64)).compute == F64


def test_nhwc_output_allocated_channels_last(capture):
    y = pycudnn.dnn_conv(x4(nhwc=True), w4(nhwc=True))
    assert y.shape == (2, 6, 6, 6) and y.strides == _packed((2, 6, 6, 6), True)
    y = pycudnn.dnn_conv(x4(), w4())
    assert y.strides == _packed((2, 6, 6, 6))


# ==================================================================================================
# Routes (direction_hint) and pointer roles
# ==================================================================================================
def test_pointer_roles_per_operation(capture):
    _problems, plans = capture
    img, kerns, top = x4(), w4(), Fake((2, 6, 6, 6))
    y = pycudnn.dnn_conv(img, kerns)
    assert plans[-1].runs[-1][:3] == (img.ptr, kerns.ptr, y.ptr)
    dx = pycudnn.dnn_gradinput(kerns, top, (2, 4, 8, 8))
    assert plans[-1].runs[-1][:3] == (dx.ptr, kerns.ptr, top.ptr)
    dw = pycudnn.dnn_gradweight(img, top, (6, 4, 3, 3))
    assert plans[-1].runs[-1][:3] == (img.ptr, dw.ptr, top.ptr)


def test_direction_hint_routes(capture):
    problems, plans = capture
    # routes apply when every N/C-transposed view is packed: N == 1 and C == 1 here
    img, kerns = Fake((1, 1, 8, 8)), Fake((6, 1, 3, 3))
    # 'bprop weights': backward-filter on transposed views, cross-correlation only
    y = pycudnn.dnn_conv(img, kerns, conv_mode="cross", direction_hint="bprop weights")
    p = problems[-1]
    assert p.op == OP_BWD_FILTER
    assert p.x_shape == (1, 1, 8, 8) and p.y_shape == (1, 6, 3, 3) and p.w_shape == (6, 1, 6, 6)
    assert plans[-1].runs[-1][:3] == (img.ptr, y.ptr, kerns.ptr)
    # with conv_mode='conv' the kernel would need flipping: stays forward
    pycudnn.dnn_conv(img, kerns, conv_mode="conv", direction_hint="bprop weights")
    assert problems[-1].op == OP_FWD
    # 'full': backward-data of a valid conv with the filters transposed and the mode swapped
    img2 = Fake((2, 1, 8, 8))
    y = pycudnn.dnn_conv(img2, kerns, border_mode="full")
    p = problems[-1]
    assert p.op == OP_BWD_DATA and p.mode == ConvolutionMode.CROSS_CORRELATION
    assert p.w_shape == (1, 6, 3, 3) and p.y_shape == (2, 1, 8, 8) and p.x_shape == (2, 6, 10, 10)
    assert p.pads == (0, 0)
    assert plans[-1].runs[-1][:3] == (y.ptr, kerns.ptr, img2.ptr)
    # 'forward!' keeps the forward operation; strides too
    pycudnn.dnn_conv(img2, kerns, border_mode="full", direction_hint="forward!")
    assert problems[-1].op == OP_FWD and problems[-1].pads == (2, 2)
    pycudnn.dnn_conv(img2, kerns, border_mode="full", subsample=2)
    assert problems[-1].op == OP_FWD
    # a named forward algorithm gives way to the backward-data default on the route
    pycudnn.dnn_conv(img2, kerns, border_mode="full", algo="large")
    assert problems[-1].op == OP_BWD_DATA and problems[-1].algo == "guess"
    # views that are not packed (C > 1): the forward operation
    pycudnn.dnn_conv(x4(), w4(), border_mode="full")
    assert problems[-1].op == OP_FWD


# ==================================================================================================
# The hot path: one validation per distinct call, counters
# ==================================================================================================
def test_second_call_skips_validation(capture, monkeypatch):
    _problems, plans = capture
    slow_calls = []
    real_prepare = _prepare.prepare

    def spy(req):
        slow_calls.append(req)
        return real_prepare(req)

    monkeypatch.setattr(_prepare, "prepare", spy)
    img, kerns = x4(), w4()
    out = Fake((2, 6, 6, 6))
    for _ in range(5):
        pycudnn.dnn_conv(img, kerns, border_mode="valid", out=out)
    assert len(slow_calls) == 1 and len(plans) == 1 and len(plans[0].runs) == 5
    info = conv.cache_info()
    assert info.hits == 4
    # new pointers, same shapes: still the cached call (pointers are not in the call key)
    img2, out2 = x4(), Fake((2, 6, 6, 6))
    pycudnn.dnn_conv(img2, kerns, border_mode="valid", out=out2)
    assert len(slow_calls) == 1 and plans[0].runs[-1][:3] == (img2.ptr, kerns.ptr, out2.ptr)
    # an unhashable argument still works, without call caching
    pycudnn.dnn_conv(img, kerns, border_mode=[0, 0], out=out)
    pycudnn.dnn_conv(img, kerns, border_mode=[0, 0], out=out)
    assert len(slow_calls) == 3
    # a config change is a different call key
    with _config.config.override(allow_tf32=True):
        pycudnn.dnn_conv(img, kerns, out=out)
    assert len(slow_calls) == 4
    conv.clear_caches()
    assert conv.cache_info().hits == 0
    pycudnn.dnn_conv(img, kerns, out=out)
    assert len(slow_calls) == 5


def test_stream_argument_binds_the_handle(capture):
    pycudnn.dnn_conv(x4(), w4(), stream=7)
    h = _call._handle.get_handle()
    assert h.stream == 7
    pycudnn.dnn_conv(x4(), w4(), stream=9)
    assert h.stream == 9


# ==================================================================================================
# The LRU and cache control
# ==================================================================================================
class Closable:
    def __init__(self):
        self.closed = False

    def close(self):
        self.closed = True


def test_lru_bound_and_order():
    lru = _plans._LRU(3)
    vals = [Closable() for _ in range(5)]
    for i in range(3):
        lru.put(i, vals[i])
    assert lru.get(0) is vals[0]  # 0 becomes most recent
    lru.put(3, vals[3])  # evicts 1
    assert list(lru.data) == [2, 0, 3] and vals[1].closed
    lru.put(4, vals[4])  # evicts 2
    assert list(lru.data) == [0, 3, 4] and vals[2].closed and not vals[0].closed
    assert lru.get(2) is None
    lru.clear()
    assert len(lru) == 0 and all(
        v.closed for v in vals[:5] if v is not vals[1] and v is not vals[2]
    )


def test_set_cache_size_and_clear():
    old = _plans._maxsize
    try:
        lru = _plans.new_lru()
        for i in range(10):
            lru.put(i, Closable())
        conv.set_cache_size(4)
        assert len(lru) == 4 and lru.maxsize == 4 and conv.cache_info().maxsize == 4
        with pytest.raises(ValueError):
            conv.set_cache_size(-1)
        conv.clear_caches()
        assert len(lru) == 0
        info = conv.cache_info()
        assert (info.hits, info.misses, info.builds) == (0, 0, 0)
    finally:
        _plans.set_cache_size(old)


def test_call_cache_bounded(capture):
    old = _plans._maxsize
    try:
        conv.set_cache_size(3)
        for n in range(1, 8):
            pycudnn.dnn_conv(x4(n=n), w4())
        assert len(_call.calls()) <= 3
    finally:
        _plans.set_cache_size(old)


def test_clear_caches_public():
    pycudnn.clear_caches()
    assert pycudnn.highlevel.clear_caches is pycudnn.clear_caches


# ==================================================================================================
# Flags and names
# ==================================================================================================
def test_algo_names_per_direction_cover_config_choices():
    flags = _config.config.snapshot()
    for op, choices in (
        (OP_FWD, _config.ALGO_FWD_CHOICES),
        (OP_BWD_DATA, _config.ALGO_BWD_DATA_CHOICES),
        (OP_BWD_FILTER, _config.ALGO_BWD_FILTER_CHOICES),
    ):
        for name in choices:
            policy, det = _prepare.policy(op, name, flags, "f")
            if name.startswith("guess"):
                assert policy == "guess" and not det
            elif name.startswith("time"):
                assert policy == "time" and not det
            elif name == "deterministic":
                assert policy == "guess" and det
            else:
                assert policy == name and name in problem_mod.LEGACY[op]
        assert _prepare.policy(op, "TIME_ONCE", flags, "f") == ("time", False)


def test_config_defaults_flow_into_the_problem(capture):
    with _config.config.override(algo_fwd="time_once", precision="as_input"):
        p = _problem(capture, pycudnn.dnn_conv, x4(dt=F16), w4(dt=F16))
    assert p.algo == "time" and p.compute == F16
    with _config.config.override(algo_bwd_data="fft", algo_bwd_filter="small"):
        p = _problem(capture, pycudnn.dnn_gradinput, w4(), Fake((2, 6, 6, 6)), (2, 4, 8, 8))
        q = _problem(capture, pycudnn.dnn_gradweight, x4(), Fake((2, 6, 6, 6)), (6, 4, 3, 3))
    assert p.algo == "fft" and q.algo == "small"
    # an explicit algo wins over the config
    with _config.config.override(algo_fwd="time_once"):
        p = _problem(capture, pycudnn.dnn_conv, x4(), w4(), algo="guess_once")
    assert p.algo == "guess"


@pytest.mark.parametrize(
    ("dt", "precision", "compute"),
    [
        (F16, "as_input_f32", F32),
        (F16, "as_input", F16),
        (F16, "float16", F16),
        (F16, "float32", F32),
        (BF16, "as_input_f32", F32),
        (BF16, "as_input", F32),
        (BF16, "float32", F32),
        (F32, "as_input_f32", F32),
        (F32, "as_input", F32),
        (F32, "float32", F32),
        (F64, "as_input_f32", F64),
        (F64, "as_input", F64),
        (F64, "float64", F64),
    ],
)
def test_precision_table(dt, precision, compute):
    assert _prepare.compute_type(dt, precision, "f") == compute


@pytest.mark.parametrize(
    ("dt", "precision"),
    [
        (F16, "float64"),
        (BF16, "float16"),
        (BF16, "float64"),
        (F32, "float16"),
        (F32, "float64"),
        (F64, "float32"),
        (F64, "float16"),
    ],
)
def test_precision_rejected(dt, precision):
    with pytest.raises(ValueError, match="not available"):
        _prepare.compute_type(dt, precision, "f")


def test_layout_helpers():
    shape = (2, 3, 4, 5)
    assert _layout.layout_of(shape, _packed(shape)) == (True, False)
    assert _layout.layout_of(shape, _packed(shape, True)) == (False, True)
    assert _layout.layout_of((2, 1, 4, 5), _packed((2, 1, 4, 5))) == (True, True)  # C == 1
    assert _layout.matches((2, 1, 4, 5), (20, 7, 5, 1), _packed((2, 1, 4, 5)))  # size-1 dim
    assert _layout.non_overlapping(shape, _packed(shape))
    assert not _layout.non_overlapping(shape, (60, 20, 5, 2))
    align = problem_mod.alignment
    assert align(0, 4) == 16 and align(8, 4) == 8 and align(2, 2) == 2


def test_unpacked_operands_are_staged(capture, monkeypatch):
    """Strides that are not packed NCHW/NHWC never reach a plan: the Problem sees packed
    strides and the call entry copies through cudnnTransformTensor."""
    problems, plans = capture
    transforms = []

    def transform(h, alpha, src, x, beta, dst, y):
        transforms.append((x, y))

    real = _call.quiet
    monkeypatch.setattr(
        _call,
        "quiet",
        lambda name: transform if name == "cudnnTransformTensor" else real(name),
    )
    padded = Fake((2, 4, 8, 8), strides=(4 * 8 * 9, 8 * 9, 9, 1))  # padded rows
    base = _problem(capture, pycudnn.dnn_conv, x4(), w4())
    p = _problem(capture, pycudnn.dnn_conv, padded, w4(), alpha=2.0, beta=0.5, out=Fake(OUT))
    assert p.x_strides == base.x_strides
    assert len(transforms) == 1 and transforms[0][0] == padded.ptr
    assert plans[-1].runs[-1][0] == transforms[0][1]  # the plan read the packed copy
    # a strided output: the plan writes a packed buffer with alpha=1, beta=0; the final copy
    # applies alpha and beta
    transforms.clear()
    out = Fake((2, 6, 6, 6), strides=(6 * 6 * 7, 6 * 7, 7, 1))
    p = _problem(capture, pycudnn.dnn_conv, x4(), w4(), alpha=2.0, beta=0.5, out=out)
    assert (p.alpha, p.beta) == (1.0, 0.0)
    assert len(transforms) == 1 and transforms[0][1] == out.ptr
    assert plans[-1].runs[-1][2] == transforms[0][0]
    # mixed layouts: the NCHW image is copied to the NHWC layout of the filter
    transforms.clear()
    img, kerns = Fake((2, 4, 8, 8)), Fake((6, 4, 3, 3), nhwc=True)
    p = _problem(capture, pycudnn.dnn_conv, img, kerns)
    assert len(transforms) == 1 and transforms[0][0] == img.ptr
    assert p.x_strides == _packed((2, 4, 8, 8), True) and p.w_strides == _packed((6, 4, 3, 3), True)
    # transposed N/C views (the direction-hint routes) stay on the forward path
    img, kerns = x4(), w4()
    pycudnn.dnn_conv(img, kerns, conv_mode="cross", direction_hint="bprop weights")
    assert problems[-1].op == OP_FWD
    # ...unless every view is packed (N == C == 1)
    pycudnn.dnn_conv(
        Fake((1, 1, 8, 8)), Fake((3, 1, 3, 3)), conv_mode="cross", direction_hint="bprop weights"
    )
    assert problems[-1].op == OP_BWD_FILTER


# ==================================================================================================
# Legacy algorithms (descriptors are real; the C calls are recorded)
# ==================================================================================================
class WorkspaceHandle(DummyHandle):
    def workspace(self, nbytes, stream=None):
        return 0xABC000, nbytes


def _legacy_problem(op, **kw):
    x, w, y = (1, 4, 8, 8), (6, 4, 3, 3), (1, 6, 6, 6)
    base = dict(
        op=op,
        device=0,
        cudnn_version=91900,
        dtype=int(F32),
        compute=int(F32),
        mode=int(ConvolutionMode.CROSS_CORRELATION),
        x_shape=x,
        x_strides=_packed(x),
        w_shape=w,
        w_strides=_packed(w),
        y_shape=y,
        y_strides=_packed(y),
        pads=(0, 0),
        strides=(1, 1),
        dilations=(1, 1),
        allow_tf32=False,
        deterministic=False,
        x_align=16,
        w_align=16,
        y_align=16,
        workspace_limit=-1,
        alpha=1.0,
        beta=0.0,
        algo="fft",
    )
    return Problem(**{**base, **kw})


@pytest.mark.parametrize(
    ("op", "query", "call", "order"),
    [
        (OP_FWD, "ForwardWorkspaceSize", "cudnnConvolutionForward", (11, 22, 33)),
        (OP_BWD_DATA, "BackwardDataWorkspaceSize", "cudnnConvolutionBackwardData", (22, 33, 11)),
        (
            OP_BWD_FILTER,
            "BackwardFilterWorkspaceSize",
            "cudnnConvolutionBackwardFilter",
            (11, 33, 22),
        ),
    ],
)
def test_legacy_plan_queries_its_workspace_and_calls_in_cudnn_order(
    monkeypatch, op, query, call, order
):
    calls = []

    def quiet(name):
        def fn(*args):
            calls.append((name, args))
            size = args[-1]._obj if hasattr(args[-1], "_obj") else None
            if size is not None:
                size.value = 4096

        return fn

    monkeypatch.setattr(_call, "quiet", quiet)
    conv.clear_caches()
    plan = problem_mod.legacy_plan(_legacy_problem(op), WorkspaceHandle())
    assert plan.workspace == 4096 and plan.describe().startswith(f"legacy {call} algo")
    assert calls[0][0] == "cudnnGetConvolution" + query
    assert conv.cache_info().builds == 1  # counted by the engine (_plans.built)
    plan.run(11, 22, 33, 44)  # x, w, y, workspace
    name, args = calls[-1]
    assert name == call and (args[3], args[5], args[-1]) == order and args[8] == 44
    # over the workspace limit: a warning and None (the caller falls back to the heuristics)
    with pytest.warns(RuntimeWarning, match="cannot run this"):
        assert (
            problem_mod.legacy_plan(_legacy_problem(op, workspace_limit=0), DummyHandle()) is None
        )


def test_the_legacy_fallback_warns_at_the_callers_line(capture, monkeypatch):
    def quiet(name):
        def fn(*args):
            if hasattr(args[-1], "_obj"):
                args[-1]._obj.value = 4096  # the workspace the legacy algorithm wants

        return fn

    monkeypatch.setattr(_call, "quiet", quiet)
    monkeypatch.setattr(_plans, "plan", REAL_PLAN)  # the engine's entry, over a fake search
    monkeypatch.setattr(_plans, "search", lambda key, h, given_ptrs=None: FakePlan(key))
    with _config.config.override(workspace_limit=0), pytest.warns(RuntimeWarning) as got:
        pycudnn.dnn_conv(x4(), w4(), algo="fft")
    assert got[0].filename == __file__, got[0].filename
    # the heuristics' plan, cached under the legacy key too
    keys = list(_plans._plan_cache().data)
    assert [k.algo for k in keys] == ["guess", "fft"]
