"""Issue 30 on the CPU: booleans read by one strict parser, valid input taken as such, and
validation on every call that could differ (not only on a call-cache miss).

The fake device of ``_fake_device`` stands in for the GPU; ``served`` replaces the graph entry
with a stub call that "runs" (returns its outputs) so that a second call is a cache hit.
"""

from __future__ import annotations

import fractions

import _fake_device as fd
import numpy as np
import pytest
from _fake_device import Fake

import pycudnn
from pycudnn import _config
from pycudnn.enums import DataType, PointwiseMode
from pycudnn.graph import Graph
from pycudnn.highlevel import _graphops
from pycudnn.highlevel.attention import _calls

BF16, F32, I32 = DataType.BFLOAT16, DataType.FLOAT, DataType.INT32
no_c = fd.no_c
B, H, S, D = 2, 4, 64, 64


def q4(**kw):
    return Fake((B, H, S, D), BF16, **kw)


class _Stub:
    """A call entry that runs without a GPU: returns one sentinel per output."""

    def __init__(self, g):
        self.graph = g

    def run(self, ptrs, outs, out_ptrs, stream):
        return tuple(f"out{i}" for i in range(len(outs)))

    def evict(self):
        pass

    def stand_in(self, *places):
        pass


@pytest.fixture
def served(no_c, monkeypatch):
    """No C call; the graph entry is a stub that runs (records the graphs it was given)."""
    built: list[Graph] = []

    def entry(func, g, device, stream, allocs, spans, **kw):
        built.append(g)
        return _Stub(g)

    monkeypatch.setattr(_graphops, "entry", entry)
    monkeypatch.setattr(_graphops, "capability", lambda device: (9, 0))
    return built


# -- the one parser -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, True),
        (False, False),
        (1, True),
        (0, False),
        (np.bool_(True), True),
        (np.int64(0), False),
        ("no", False),
        ("False", False),
        ("off", False),
        ("YES", True),
        (" true ", True),
    ],
)
def test_parse_bool_reads_what_the_config_reads(value, expected):
    assert _config.parse_bool(value, "f", "flag") is expected
    with pycudnn.config.override(allow_tf32=value):
        assert pycudnn.config.allow_tf32 is expected


@pytest.mark.parametrize(
    ("value", "exc"),
    [
        ("maybe", ValueError),
        (2, ValueError),
        (0.5, ValueError),
        (1.0, ValueError),
        (None, TypeError),
        ([True], TypeError),
        (np.array([True, False]), TypeError),
    ],
)
def test_parse_bool_refuses_ambiguous_values_naming_where_what_and_the_value(value, exc):
    with pytest.raises(exc, match=r"^f: flag=.* is not a boolean"):
        _config.parse_bool(value, "f", "flag")


# -- the graph builder -----------------------------------------------------------------------------
def _graph():
    g = Graph(io_data_type="float16", name="g1")
    x = g.tensor((1, 8, 4, 4), name="x")
    y = g.relu(x).set_output(True)
    return g, x, y


@pytest.mark.parametrize("flag", ["allow_tf32", "deterministic"])
def test_graph_build_flags_mean_what_they_say(flag):
    g, _x, _y = _graph()
    for text, expected in (("no", False), ("False", False), ("off", False), ("yes", True)):
        assert getattr(g.key(device=0, **{flag: text}), flag) is expected
    with pytest.raises(ValueError, match=f"g1.build: {flag}='maybe' is not a boolean"):
        g.key(device=0, **{flag: "maybe"})


def test_graph_build_allow_tf32_no_like_the_config():
    g, _x, _y = _graph()
    with pycudnn.config.override(allow_tf32="no"):
        assert g.key(device=0).allow_tf32 is False
    assert g.key(device=0, allow_tf32="no").allow_tf32 is False


def test_set_output_no_makes_the_tensor_virtual_and_refuses_nonsense():
    g, x, _y = _graph()
    z = g.relu(x)
    z.set_output(True)
    z.set_output("no")
    assert z.is_virtual
    with pytest.raises(ValueError, match=r"g1: tensor .*set_output: is_output='perhaps'"):
        z.set_output("perhaps")
    with pytest.raises(ValueError, match="graph input; it cannot be virtual"):
        x.set_output("False")


def test_tensor_is_pass_by_value_parsed():
    g = Graph(name="g2")
    assert not g.tensor((1, 1), data_type="float32", is_pass_by_value="no").is_pass_by_value
    with pytest.raises(ValueError, match=r"g2\.tensor: is_pass_by_value='x'"):
        g.tensor((1, 1), data_type="float32", is_pass_by_value="x")


def _sdpa_graph(**kw):
    g = Graph(io_data_type="bfloat16", name="att")
    q, k, v = (g.tensor((B, H, S, D), name=n) for n in "qkv")
    return g, g.sdpa(q, k, v, **kw)


def _modes(g):
    return [n[2].get("mode") for n in g._nodes if isinstance(n[2], dict)]


def test_graph_sdpa_booleans():
    g_yes, (_o, stats) = _sdpa_graph(use_causal_mask="yes", is_inference="no")
    g_no, (_o2, stats2) = _sdpa_graph(use_causal_mask="no", is_inference="yes")
    assert stats is not None and stats2 is None
    assert int(PointwiseMode.CMP_GE) in _modes(g_yes)
    assert int(PointwiseMode.CMP_GE) not in _modes(g_no)
    with pytest.raises(ValueError, match=r"att\.sdpa: use_causal_mask='sure'"):
        _sdpa_graph(use_causal_mask="sure")


def test_graph_reduction_and_norm_backward_booleans():
    g = Graph(name="g3")
    x = g.tensor((4, 8), data_type="float32")
    with pytest.raises(ValueError, match=r"g3\.reduction: deterministic='sometimes'"):
        g.reduction(x, "add", dim=(4, 1), deterministic="sometimes")
    g.reduction(x, "add", dim=(4, 1), deterministic="no")


# -- the high level: booleans, valid dropout probabilities ----------------------------------------
def _sdpa(**kw):
    return pycudnn.dnn_sdpa(q4(), q4(), q4(), **kw)


@pytest.mark.parametrize("p", [np.float32(0.1), fractions.Fraction(1, 10), np.float64(0.25)])
def test_sdpa_dropout_of_any_real_type_passes_the_seed_pointers(served, monkeypatch, p):
    seen = []
    monkeypatch.setattr(
        _calls,
        "run",
        lambda seed, key, build, args, *rest: seen.append((seed, args)) or ("o", "s"),
    )
    pycudnn.dnn_sdpa(q4(), q4(), q4(), dropout_p=p, seed=1, training=True)
    assert seen and seen[0][0] == 1 and seen[0][1][3][3] == float(p)


def test_sdpa_dropout_seed_is_a_by_value_scalar_written_by_the_launch(served):
    """No device copy of the seed: the graph's seed and offset are by-value scalars (not
    inputs), and the entry's launch writes each call's seed into the seed's host scalar."""
    pycudnn.dnn_sdpa(q4(), q4(), q4(), dropout_p=0.1, seed=123, training=True)
    g = served[-1]
    by_name = {t.name: t for t in g._tensors}
    assert by_name["seed"].is_pass_by_value and by_name["offset"].is_pass_by_value
    assert by_name["seed"].data_type == DataType.INT64
    key = g.key(device=0)
    real = [t for t in key.tensors if t.uid in key.uids and not t.is_by_value]
    assert len(real) == 5  # q, k, v, out, stats: no seed or offset input
    launched = []

    class Plan:
        def launch(self, ptrs, scratch=()):
            launched.append(seed_c.value)

    call = object.__new__(_calls.Seeded)
    seed_c = by_name["seed"]._value
    call.seed, call.plan, call.key, call.consts, call.scratch = seed_c, Plan(), key, (), ()
    for value in (7, 2**62):
        _calls._RUN.seed = value
        call.launch((1, 2, 3))
    _calls._RUN.seed = None
    assert launched == [7, 2**62]


def test_sdpa_training_no_is_inference(served):
    out = _sdpa(training="no")
    assert out == "out0"  # one output, no statistics
    out, stats = _sdpa(training="yes")
    assert stats == "out1"


@pytest.mark.parametrize("p", [np.float32(0.1), fractions.Fraction(1, 10)])
def test_sdpa_grad_with_a_numpy_dropout_needs_the_forward_seed(no_c, p):
    o = q4()
    stats = Fake((B, H, S, 1), F32)
    with pytest.raises(
        ValueError, match=r"dnn_sdpa_grad: dropout_p=0\.1.* needs the forward's seed"
    ):
        pycudnn.dnn_sdpa_grad(q4(), q4(), q4(), o, q4(), stats, dropout_p=p)


def test_sdpa_grad_deterministic_is_parsed(no_c):
    stats = Fake((B, H, S, 1), F32)
    with pytest.raises(ValueError, match="dnn_sdpa_grad: deterministic='x'"):
        pycudnn.dnn_sdpa_grad(q4(), q4(), q4(), q4(), q4(), stats, deterministic="x")


def test_norm_training_no_is_inference(served):
    x = Fake((4, 6, 64))
    _y, mean, inv = pycudnn.dnn_layer_norm(x, 64, Fake((64,)), Fake((64,)), training="no")
    assert mean is None and inv is None
    with pytest.raises(ValueError, match="dnn_layer_norm: training='False!'"):
        pycudnn.dnn_layer_norm(x, 64, Fake((64,)), Fake((64,)), training="False!")


# -- validation on every call that could differ ---------------------------------------------------
def test_norm_epsilon_true_after_one_is_still_refused(served):
    x, gm, bt = Fake((4, 6, 64)), Fake((64,)), Fake((64,))
    pycudnn.dnn_layer_norm(x, 64, gm, bt, 1.0)
    pycudnn.dnn_layer_norm(x, 64, gm, bt, 1.0)
    assert len(served) == 1  # the second call was a cache hit
    with pytest.raises(TypeError, match="dnn_layer_norm: epsilon"):
        pycudnn.dnn_layer_norm(x, 64, gm, bt, True)


def test_norm_normalized_shape_true_after_one_is_still_refused(served):
    x, gm, bt = Fake((4, 6, 1)), Fake((1,)), Fake((1,))
    pycudnn.dnn_layer_norm(x, (1,), gm, bt)
    with pytest.raises(TypeError, match="dnn_layer_norm: normalized_shape"):
        pycudnn.dnn_layer_norm(x, (True,), gm, bt)


def test_sdpa_scale_true_after_one_is_still_refused(served):
    _sdpa(scale=1.0)
    _sdpa(scale=1.0)
    assert len(served) == 1
    with pytest.raises(TypeError, match="dnn_sdpa: scale must be a real number"):
        _sdpa(scale=True)


def test_sdpa_is_causal_one_after_true_means_true(served):
    _sdpa(is_causal=True)
    _sdpa(is_causal=1)  # the one parser: 1 is True, the same entry
    assert len(served) == 1
    with pytest.raises(ValueError, match="dnn_sdpa: is_causal=2"):
        _sdpa(is_causal=2)


# -- misaligned addresses of the operands that used to reach the kernels ---------------------------
F16 = DataType.HALF
ODD = (9 << 32) + 1  # an odd address: no 2- or 4-byte element starts there


def test_conv_bias_at_an_odd_address_is_refused(no_c):
    x, w = Fake((2, 4, 8, 8), F16), Fake((6, 4, 3, 3), F16)
    with pytest.raises(ValueError, match="dnn_conv: bias's address 0x900000001 is not a multiple"):
        pycudnn.dnn_conv(x, w, bias=Fake((6,), F16, ptr=ODD))


@pytest.mark.parametrize(("rms", "which"), [(False, "mean"), (False, "inv"), (True, "inv")])
def test_norm_grad_statistics_at_an_odd_address_are_refused(no_c, rms, which):
    x, dy = Fake((4, 6, 64)), Fake((4, 6, 64))
    stats = {n: Fake((4, 6, 1), F32, ptr=ODD if n == which else None) for n in ("mean", "inv")}
    name = {"mean": "mean", "inv": "inv_rms" if rms else "inv_std"}[which]
    func = "dnn_rms_norm_grad" if rms else "dnn_layer_norm_grad"
    with pytest.raises(ValueError, match=f"{func}: {name}'s address 0x900000001"):
        if rms:
            pycudnn.dnn_rms_norm_grad(dy, x, stats["inv"], 64, Fake((64,)))
        else:
            pycudnn.dnn_layer_norm_grad(dy, x, stats["mean"], stats["inv"], 64, Fake((64,)))


@pytest.mark.parametrize("which", ["seq_lens_q", "seq_lens_kv"])
def test_sdpa_seq_lens_at_an_odd_address_are_refused(no_c, monkeypatch, which):
    monkeypatch.setattr(_graphops, "capability", lambda device: (9, 0))
    lens = {n: Fake((B,), I32, ptr=ODD if which.endswith(n) else None) for n in ("q", "kv")}
    with pytest.raises(ValueError, match=f"dnn_sdpa: {which}'s address 0x900000001"):
        _sdpa(seq_lens_q=lens["q"], seq_lens_kv=lens["kv"])


def test_sdpa_grad_stats_at_an_odd_address_are_refused(no_c, monkeypatch):
    monkeypatch.setattr(_graphops, "capability", lambda device: (9, 0))
    stats = Fake((B, H, S, 1), F32, ptr=ODD)
    with pytest.raises(ValueError, match="dnn_sdpa_grad: stats's address 0x900000001"):
        pycudnn.dnn_sdpa_grad(q4(), q4(), q4(), q4(), q4(), stats)


# -- interop: unclear messages (the real asarray: these are refused before any pointer check) ------
class _BadDLPack:
    def __init__(self, ret):
        self.ret = ret

    def __dlpack__(self, stream=None, **kw):
        return self.ret

    def __dlpack_device__(self):
        return (2, 0)


@pytest.mark.parametrize("ret", [5, object(), "capsule"])
def test_dlpack_that_returns_no_capsule_names_the_role(monkeypatch, ret):
    monkeypatch.setattr(_graphops, "capability", lambda device: (9, 0))
    with pytest.raises(TypeError, match=r"dnn_sdpa: k: _BadDLPack\.__dlpack__ returned a \w+, not"):
        pycudnn.dnn_sdpa(q4(), _BadDLPack(ret), q4())
    with pytest.raises(TypeError, match=r"dnn_matmul: b: _BadDLPack\.__dlpack__ returned"):
        pycudnn.dnn_matmul(Fake((4, 5)), _BadDLPack(ret))


class _Cai:
    def __init__(self, **fields):
        base = {"shape": (4, 64), "typestr": "<f4", "data": (0x10000, False), "version": 3}
        self.__cuda_array_interface__ = {**base, **fields}


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"shape": "ab"}, "['shape'] must be a tuple of ints"),
        ({"shape": (2.5, 64)}, "shape[0] must be an int"),
        ({"typestr": 4}, "['typestr'] must be a str"),
        ({"data": 5}, "['data'] must be a (pointer, readonly) pair"),
        ({"data": ("x", False)}, "data[0] must be an int"),
        ({"strides": (1.5, 4)}, "strides[0] must be an int"),
        ({"version": "3"}, "['version'] must be an int"),
    ],
)
def test_cuda_array_interface_wrong_field_types_name_role_and_field(fields, fragment):
    with pytest.raises(TypeError) as info:
        pycudnn.dnn_layer_norm(_Cai(**fields), 64)
    assert str(info.value).startswith("dnn_layer_norm: x: ") and fragment in str(info.value)


class _TorchLooking:
    """Looks like a tensor (data_ptr, shape, stride) but is none: refused, its role named."""

    def __init__(self, ptr, shape, strides):
        self.ptr, self.shape, self.strides_ = ptr, shape, strides
        self.is_cuda = True

    def data_ptr(self):
        return self.ptr

    def stride(self):
        return self.strides_


@pytest.mark.parametrize(
    "fields", [("x", (4, 5), (5, 1)), (2**70, (4, 5), (5, 1)), (0x1000, ("a", 5), (5, 1))]
)
def test_torch_looking_objects_are_refused_naming_the_role(fields):
    with pytest.raises(TypeError, match=r"^dnn_matmul: a: .*cannot view _TorchLooking"):
        pycudnn.dnn_matmul(_TorchLooking(*fields), Fake((5, 7)))


# -- the convolution's call key tells True from 1 --------------------------------------------------
class _ConvStub:
    def run(self, ptrs, outs, out_ptrs, stream):
        return ("y",)

    def evict(self):
        pass


@pytest.mark.parametrize(
    ("valid", "invalid"),
    [
        ({"alpha": 1.0}, {"alpha": True}),
        ({"beta": 0.0}, {"beta": False}),
        ({"num_groups": 1}, {"num_groups": True}),
        ({"subsample": (1, 1)}, {"subsample": (True, True)}),
        ({"subsample": (2, 1)}, {"subsample": (2, True)}),
        ({"dilation": (1, 1)}, {"dilation": (True, 1)}),
        ({"dilation": 1}, {"dilation": True}),
        ({"border_mode": 1}, {"border_mode": True}),
        ({"border_mode": (1, 0)}, {"border_mode": (True, 0)}),
    ],
)
def test_conv_scalars_equal_to_a_cached_valid_call_are_still_checked(
    no_c, monkeypatch, valid, invalid
):
    from pycudnn.highlevel.conv import _prepare

    real_build, built = _prepare.build, []
    monkeypatch.setattr(_prepare, "build", lambda *args: built.append(args) or _ConvStub())
    x, w = Fake((2, 4, 8, 8)), Fake((6, 4, 3, 3))
    pycudnn.dnn_conv(x, w, **valid)
    pycudnn.dnn_conv(x, w, **valid)
    assert len(built) == 1  # the second call was served from the cache
    monkeypatch.setattr(_prepare, "build", real_build)  # a miss validates (no C call: no_c)
    (arg,) = invalid
    with pytest.raises(TypeError, match=f"dnn_conv: {arg}"):
        pycudnn.dnn_conv(x, w, **invalid)


@pytest.mark.parametrize("epilogue", [False, True])
def test_conv_default_geometry_is_keyed_by_identity_and_equal_tuples_still_hit(
    no_c, monkeypatch, epilogue
):
    """The defaults skip the bool scan by identity; an equal tuple of ints the caller built
    (not the default object) still hits the same entry, and a bool spelling never does."""
    from pycudnn.highlevel.conv import _prepare

    built = []
    stub = lambda *args: built.append(args) or _ConvStub()  # noqa: E731
    monkeypatch.setattr(_prepare, "build", stub)
    monkeypatch.setattr(_prepare, "build_fused", stub)
    x, w = Fake((2, 4, 8, 8), F16), Fake((6, 4, 3, 3), F16)
    kw = {"activation": "relu"} if epilogue else {}
    pycudnn.dnn_conv(x, w, **kw)
    pycudnn.dnn_conv(x, w, subsample=tuple([1, 1]), dilation=tuple([1, 1]), **kw)
    assert len(built) == 1
    pycudnn.dnn_conv(x, w, subsample=(True, True), **kw)
    assert len(built) == 2


#: (function, positional arguments, keyword: (valid value, invalid value equal to it))
TUPLE_KEYED = [
    (pycudnn.dnn_pool, (lambda: Fake((2, 4, 8, 8)),), {"ws": ((1, 1), (True, True))}),
    (pycudnn.dnn_pool, (lambda: Fake((2, 4, 8, 8)), (2, 2)), {"stride": ((1, 1), (1, True))}),
    (pycudnn.dnn_pool, (lambda: Fake((2, 4, 8, 8)), (2, 2)), {"pad": ([0, 1], [False, 1])}),
    (pycudnn.dnn_reduction, (lambda: Fake((2, 4, 8, 8)), "add"), {"axis": (1, True)}),
    (pycudnn.dnn_reduction, (lambda: Fake((2, 4, 8, 8)), "add"), {"axis": ((1, 2), (True, 2))}),
]


@pytest.mark.parametrize(
    ("fn", "args", "kw"), TUPLE_KEYED, ids=lambda v: getattr(v, "__name__", "")
)
def test_tuples_of_booleans_get_a_key_of_their_own_and_are_refused(no_c, monkeypatch, fn, args, kw):
    """``(True, True) == (1, 1)``: the bool spelling's key differs from the valid call's (a
    cached valid entry cannot serve it), and on its miss the checks refuse it naming the
    argument (no C call: no_c)."""
    from pycudnn.highlevel import _call

    objs = [a() if callable(a) else a for a in args]
    ((name, (good, bad)),) = kw.items()
    assert good == bad
    keys = []
    with monkeypatch.context() as m:
        m.setattr(_call, "run_cached", lambda key, *rest: keys.append(key) or ("r0", "r1"))
        fn(*objs, **{name: good})
        fn(*objs, **{name: bad})
        fn(*objs, **{name: good})
    assert keys[0] != keys[1] and keys[0] == keys[2]
    with pytest.raises(TypeError, match=rf"{fn.__name__}: {name}"):
        fn(*objs, **{name: bad})
