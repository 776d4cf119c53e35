"""CPU tests of the fused convolution epilogue (``dnn_conv(..., bias=, activation=, z=)``) and of
the general graph-plan engine's keys (no GPU, no cuDNN execution).

* validation of the new arguments: every bad bias / z / activation / z_alpha / beta raises before
  any handle, descriptor, allocation or cuDNN call;
* the fused graph key (:class:`FusedProblem`): what changes it, the pointer order of a call
  (x, w, [bias], [z], y), the bias/z tensors as the graph sees them;
* the choice between the fused graph and the separate steps, with fake plans;
* :class:`GraphPlan` with N tensors: its pack arguments and arity check.
"""

from __future__ import annotations

import ctypes

import _fake_device as fd
import numpy as np
import pytest
from _fake_device import Fake

import pycudnn
from pycudnn import errors
from pycudnn.enums import DataType
from pycudnn.graph import _execution, _plans
from pycudnn.highlevel import _call, _operand, conv
from pycudnn.highlevel.conv import _epilogue, _problem
from pycudnn.highlevel.conv._epilogue import FusedProblem

F32, F16, BF16 = DataType.FLOAT, DataType.HALF, DataType.BFLOAT16
no_c = fd.no_c  # the fixture: every way into CUDA/cuDNN raises


def x4(n=2, c=4, h=8, w=8, **kw):
    return Fake((n, c, h, w), **kw)


def w4(k=6, c=4, kh=3, kw=3, **kw_):
    return Fake((k, c, kh, kw), **kw_)


Y = (2, 6, 6, 6)  # x4() * w4(), valid


# ==================================================================================================
# Validation: nothing reaches C
# ==================================================================================================
BAD = [
    (dict(bias=Fake((5,))), ValueError, "bias must have shape (6,) or (1, 6, 1, 1)"),
    (dict(bias=Fake((1, 6, 1))), ValueError, "bias must have shape"),
    (dict(bias=Fake((6, 1, 1))), ValueError, "bias must have shape"),
    (dict(bias=Fake((6,), strides=(2,))), ValueError, "contiguous"),
    (dict(bias=Fake((6,), dt=F16)), TypeError, "same dtype"),
    (dict(bias=Fake((6,), device=1)), ValueError, "device"),
    (dict(bias=np.zeros(6, np.float32)), TypeError, "host"),
    (dict(z=Fake((2, 6, 6, 5))), ValueError, "z must have the output's shape (2, 6, 6, 6)"),
    (dict(z=Fake(Y, dt=F16)), TypeError, "same dtype"),
    (dict(z=Fake(Y, device=1)), ValueError, "device"),
    (dict(z=Fake(Y, strides=(216, 36, 6, -1))), ValueError, "negative stride"),
    (dict(activation="relu6"), ValueError, "activation='relu6' is not one of"),
    (dict(activation=3), ValueError, "activation=3"),
    (dict(activation="clipped_relu"), ValueError, "needs its upper clip"),
    (dict(activation=("clipped_relu", -1.0)), ValueError, "must be > 0"),
    (dict(activation=("clipped_relu", "6")), ValueError, "real number"),
    (dict(activation=("relu", 1.0)), ValueError, "takes no parameter"),
    (dict(activation="relu", beta=1.0), ValueError, "beta=1.0 must be 0 with an epilogue"),
    (dict(bias=Fake((6,)), z_alpha="2"), TypeError, "z_alpha"),
    (dict(activation="relu", z_alpha=0.5), ValueError, "without z"),
    (dict(z_alpha=0.5), ValueError, "without z"),
    (dict(activation="relu", out=Fake((2, 6, 6, 5))), ValueError, "out has shape"),
    (dict(activation="relu", precision="quad"), ValueError, "precision"),
]


@pytest.mark.parametrize(("kwargs", "exc", "fragment"), BAD)
def test_fused_rejects_before_any_c_call(no_c, kwargs, exc, fragment):
    with pytest.raises(exc) as info:
        pycudnn.dnn_conv(x4(), w4(), **kwargs)
    assert fragment in str(info.value)


def test_fused_3d_bias_shape(no_c):
    x, w = Fake((1, 4, 5, 5, 5)), Fake((6, 4, 3, 3, 3))
    with pytest.raises(ValueError, match=r"\(6,\) or \(1, 6, 1, 1, 1\)"):
        pycudnn.dnn_conv3d(x, w, bias=Fake((1, 6, 1, 1)))
    with pytest.raises(ValueError, match="without z"):
        pycudnn.dnn_conv3d(x, w, z_alpha=2.0)


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        (None, None),
        ("relu", ("relu", None)),
        ("ReLU", ("relu", None)),
        ("gelu", ("gelu", None)),
        ("gelu_tanh", ("gelu_tanh", None)),
        ("silu", ("silu", None)),
        ("swish", ("swish", None)),
        ("sigmoid", ("sigmoid", None)),
        ("tanh", ("tanh", None)),
        ("elu", ("elu", 1.0)),
        (("elu", 0.5), ("elu", 0.5)),
        (("clipped_relu", 6), ("clipped_relu", 6.0)),
    ],
)
def test_activation_names(value, parsed):
    assert _epilogue.activation(value, "f") == parsed


def test_every_activation_has_a_pointwise_mode_and_gelu_has_no_separate_form():
    assert set(_epilogue.SEPARATE) == set(_epilogue.ACTIVATIONS) - {"gelu", "gelu_tanh"}


# ==================================================================================================
# The fused key and the call, with fake plans
# ==================================================================================================
class DummyHandle:
    ptr = 0x1234
    device = 0
    stream = 0

    def set_stream(self, s):
        self.stream = s
        return s


class FakeGraphPlan:
    workspace = 0
    kind = "graph"

    def __init__(self, p):
        self.p = p
        self.runs = []
        self.label = getattr(p, "label", None)

    def run(self, *key):
        self.runs.append(key)

    def describe(self):
        return f"fake ({self.label})"

    def close(self):
        pass


@pytest.fixture
def fused(monkeypatch):
    """Fake handle, allocator and plans; ``engine`` decides whether the fused graph has one."""
    state = {"engine": True, "fused": [], "plain": [], "c_calls": []}
    handle = DummyHandle()

    def plan(key, h, given_ptrs=None):
        if isinstance(key, FusedProblem):
            state["fused"].append(key)
            if not state["engine"]:
                return _plans.NoEngine("no engine: fake")
            return FakeGraphPlan(key)
        plan = FakeGraphPlan(key)
        state["plain"].append(plan)
        return plan

    def allocate(shape, dtype, device=None, stream=None, *, strides=None):
        isz = np.dtype(dtype).itemsize
        return Fake(shape, _operand.data_type(dtype), tuple(s // isz for s in strides))

    def quiet(name):
        def record(*args):
            state["c_calls"].append((name, args))

        return record

    monkeypatch.setattr(_call._handle, "get_handle", lambda device=None: handle)
    monkeypatch.setattr(_call, "cudnn_version", lambda: 91900)
    monkeypatch.setattr(_plans, "plan", plan)
    monkeypatch.setattr(conv.memory, "empty", allocate)
    monkeypatch.setattr(_call, "quiet", quiet)
    conv.clear_caches()
    yield state
    conv.clear_caches()


def test_fused_call_pointer_order_and_key(fused):
    x, w = x4(nhwc=True, dt=F16), w4(nhwc=True, dt=F16)
    b, z = Fake((6,), dt=F16), Fake(Y, dt=F16, nhwc=True)
    y = pycudnn.dnn_conv(x, w, conv_mode="cross", bias=b, z=z, z_alpha=0.5, activation="relu")
    (fp,) = fused["fused"]
    assert isinstance(fp, FusedProblem)
    assert fp.uids == (1, 2, _epilogue.BIAS_UID, _epilogue.Z_UID, 3)
    assert fp.label == "fused conv+bias+add+relu"
    assert fp.z_alpha == 0.5 and fp.act == "relu" and fp.conv.beta == 0.0
    assert fp.bias.shape == (1, 6, 1, 1) and fp.bias.strides == (6, 1, 6, 6)  # NHWC-packed
    assert fp.z.strides == fp.conv.y_strides
    assert fp.dtype == F16 and fp.device == 0 and fp.algo == "guess"
    call = conv.last_call()
    assert call.fused and call.epilogue == "bias+add+relu"
    (run,) = call.plan.runs
    assert run == (x.ptr, w.ptr, b.ptr, z.ptr, y.ptr, 0)
    # the same call again: the call cache, no new plan search
    pycudnn.dnn_conv(x, w, conv_mode="cross", bias=b, z=z, z_alpha=0.5, activation="relu")
    assert len(fused["fused"]) == 1 and len(call.plan.runs) == 2


@pytest.mark.parametrize(
    "change",
    [
        dict(activation="gelu"),
        dict(activation=("clipped_relu", 6.0)),
        dict(z_alpha=2.0),
        dict(bias=None),
        dict(z=None, z_alpha=1.0),
        dict(alpha=2.0),
    ],
)
def test_fused_key_changes_with_each_epilogue_argument(fused, change):
    x, w = x4(nhwc=True, dt=BF16), w4(nhwc=True, dt=BF16)
    kw = dict(bias=Fake((1, 6, 1, 1), dt=BF16), z=Fake(Y, dt=BF16, nhwc=True), activation="relu")
    pycudnn.dnn_conv(x, w, **kw)
    pycudnn.dnn_conv(x, w, **{**kw, **change})
    a, b = fused["fused"]
    assert a != b and hash(a) != hash(b)


def test_no_engine_falls_back_to_separate_steps(fused):
    fused["engine"] = False
    x, w, b, z = x4(), w4(), Fake((6,)), Fake(Y)
    y = pycudnn.dnn_conv(x, w, bias=b, z=z, z_alpha=0.25, activation=("clipped_relu", 6.0))
    call = conv.last_call()
    assert not call.fused and call.epilogue == "bias+add+clipped_relu"
    (plain,) = fused["plain"]
    assert plain.runs == [(x.ptr, w.ptr, y.ptr, 0)]  # the convolution into the output
    names = [n for n, _ in fused["c_calls"]]
    assert names == ["cudnnAddTensor", "cudnnAddTensor", "cudnnActivationForward"]
    (_, add_b), (_, add_z), (_, act) = fused["c_calls"]
    assert add_b[3] == b.ptr and add_b[6] == y.ptr
    assert add_z[3] == z.ptr and add_z[6] == y.ptr
    assert ctypes.cast(add_z[1], ctypes.POINTER(ctypes.c_float)).contents.value == 0.25
    assert act[4] == y.ptr and act[7] == y.ptr  # in place


def test_gelu_without_an_engine_is_not_supported(fused):
    fused["engine"] = False
    with pytest.raises(errors.NotSupportedError, match="'gelu' has no legacy kernel"):
        pycudnn.dnn_conv(x4(), w4(), activation="gelu")


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        (dict(algo="small"), "legacy algorithm"),
        (dict(z=Fake(Y, nhwc=True)), "not packed in the output's layout"),
        (dict(out=Fake(Y, strides=(432, 72, 12, 2))), "staged"),
    ],
)
def test_separate_steps_when_the_graph_cannot_be_fused(fused, kwargs, why):
    kw = {"activation": "relu", **kwargs}
    pycudnn.dnn_conv(x4(), w4(), **kw)
    assert fused["fused"] == []  # no fused search at all
    call = conv.last_call()
    assert not call.fused
    entry = _call.calls().data[next(reversed(_call.calls().data))]
    assert why in entry.why


def test_fused_out_may_not_overlap_z(fused):
    z = Fake(Y)
    with pytest.raises(ValueError, match="overlaps an input"):
        pycudnn.dnn_conv(x4(), w4(), z=z, out=z)


def test_plain_calls_stay_on_the_plain_path(fused):
    pycudnn.dnn_conv(x4(), w4())
    assert fused["fused"] == [] and len(fused["plain"]) == 1
    call = conv.last_call()
    assert call.epilogue is None and not call.fused


# ==================================================================================================
# The general graph-plan engine
# ==================================================================================================
def test_pack_args_hold_n_uids():
    a = _execution._PackArgs((1, 2, 4, 5, 3))
    assert a.n == 5 and list(a.uids) == [1, 2, 4, 5, 3] and a.n_c.value == 5


def test_graph_plan_checks_the_number_of_pointers_before_any_c_call():
    class P:
        ptr = 1

    gp = _plans.GraphPlan(
        P(),
        P(),
        P(),
        _plans.EngineInfo(1, frozenset(), frozenset(), 0),
        0,
        (1, 2, 4, 3),
        "fused conv+bias",
    )
    assert gp.fused and gp.uids == (1, 2, 4, 3)
    assert gp.describe() == "engine 1 (fused conv+bias, workspace 0 B)"
    with pytest.raises(TypeError, match="takes 4 data pointers and a workspace pointer, got 4"):
        gp.pack(1, 2, 3, 0)
    info7 = _plans.EngineInfo(7, frozenset(), frozenset(), 0)
    plain = _plans.GraphPlan(P(), P(), P(), info7, 0, _problem.UIDS)
    assert not plain.fused and plain.uids == _problem.UIDS
    assert plain.describe() == "engine 7 (workspace 0 B)"


def _conv_problem(**kw):
    """A small forward convolution's plan key, with fields replaced by *kw*."""
    base = dict(
        op=0,
        device=0,
        cudnn_version=91900,
        dtype=int(F32),
        compute=int(F32),
        mode=1,
        x_shape=(1, 4, 8, 8),
        x_strides=(256, 64, 8, 1),
        w_shape=(6, 4, 3, 3),
        w_strides=(36, 9, 3, 1),
        y_shape=(1, 6, 6, 6),
        y_strides=(216, 36, 6, 1),
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
        algo="guess",
    )
    return _problem.Problem(**{**base, **kw})


def test_problem_is_a_graph_key():
    p = _conv_problem()
    assert p.uids == _problem.UIDS and p.label is None
    assert "forward convolution, x(1, 4, 8, 8)" in p.what()
    fp = FusedProblem(p, None, None, 1.0, "tanh", None)
    assert fp.uids == (1, 2, 3) and fp.label == "fused conv+tanh"
    assert fp.what().startswith("fused conv+tanh (forward convolution")
    assert FusedProblem(p, None, None, 1.0, None, None).label == "fused conv"


# ==================================================================================================
# The convolution keys on the engine's one entry (_plans.plan), with a fake search
# ==================================================================================================
@pytest.fixture
def engine(fused, monkeypatch):
    """The real ``_plans.plan`` (cache, counters, make_plan, negative records) over a fake
    search; ``fused["engine"]`` decides whether the fused graph has an engine."""
    searched = []

    def search(key, handle, given_ptrs=None):
        searched.append(key)
        if isinstance(key, FusedProblem) and not fused["engine"]:
            raise errors.NotSupportedError(3000, "dnn_conv", "fake: no engine")
        return FakeGraphPlan(key)

    monkeypatch.undo()  # the fused fixture's fake plan entry goes; its fakes come back below
    handle = DummyHandle()
    monkeypatch.setattr(_call._handle, "get_handle", lambda device=None: handle)
    monkeypatch.setattr(_call, "cudnn_version", lambda: 91900)
    monkeypatch.setattr(_plans, "search", search)
    monkeypatch.setattr(_call, "quiet", lambda name: lambda *args: fused["c_calls"].append(name))
    conv.clear_caches()
    yield searched
    conv.clear_caches()


def test_no_engine_is_a_cached_answer_of_the_engine(fused, engine):
    fused["engine"] = False
    x, w = x4(), w4()
    pycudnn.dnn_conv(x, w, activation="relu", out=Fake(Y))
    pycudnn.dnn_conv(x, w, 0, activation="relu", out=Fake(Y))  # another call key, same graph
    fps = [k for k in engine if isinstance(k, FusedProblem)]
    assert len(fps) == 1  # the second spelling found the NoEngine record
    record = _plans.cached_plan(fps[0])
    assert isinstance(record, _plans.NoEngine) and "fake: no engine" in record.reason
    entry = _call.calls().data[next(reversed(_call.calls().data))]
    assert not entry.fused and "fake: no engine" in entry.why
    info = conv.cache_info()
    assert (info.misses, info.hits) == (2, 2)  # fused + plain searched; both found once more


def test_a_legacy_algorithm_that_cannot_run_falls_back_to_the_heuristics(engine, monkeypatch):
    monkeypatch.setattr(_problem, "legacy_plan", lambda p, h: None)
    p = _conv_problem(algo="fft")
    assert _conv_problem().make_plan(DummyHandle(), None) is None  # guess: the engine searches
    plan = _plans.plan(p, DummyHandle())
    (searched,) = engine
    assert searched == p._replace(algo="guess")  # the heuristics' key, searched once
    assert _plans.cached_plan(p) is plan is _plans.cached_plan(searched)
    assert conv.cache_info().misses == 1  # the alias is not counted again


def test_timing_buffers_keep_the_callers_output_intact(monkeypatch):
    made = []

    def empty(shape, dtype, device=None, stream=None):
        made.append(Fake(shape))
        return made[-1]

    monkeypatch.setattr(conv.memory, "empty", empty)
    h = DummyHandle()
    ptrs, keep = _conv_problem(op=_problem.OP_BWD_DATA).timing_buffers(h, (10, 20, 30))
    assert ptrs == (made[0].ptr, 20, 30) and keep == made  # dx (x) is the output
    ptrs, keep = _conv_problem().timing_buffers(h, None)  # staged: scratch throughout
    assert ptrs == tuple(b.ptr for b in made[1:]) and len(keep) == 3
    fp = FusedProblem(_conv_problem(), None, None, 1.0, "relu", None)
    assert fp.negative and not getattr(_conv_problem(), "negative", False)
    ptrs, keep = fp.timing_buffers(h, (10, 20, None))
    assert ptrs == (10, 20, keep.ptr) and keep.shape == (216,)
