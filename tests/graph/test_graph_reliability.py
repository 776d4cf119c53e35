"""Issue 30: the graph builder checks at the line that made the mistake (no GPU).

Each case is refused when the operation is added (or the tensor declared), with a message that
names the graph, the operation, the argument and the value or what was expected.
"""

from __future__ import annotations

import math

import pytest

from pycudnn.graph import Graph


def G():
    return Graph(io_data_type="float16", name="G")


# -- convolutions ----------------------------------------------------------------------------------
def test_conv_fprop_channel_mismatch():
    g = G()
    x, w = g.tensor((1, 4, 8, 8)), g.tensor((6, 3, 3, 3))
    with pytest.raises(ValueError, match=r"G\.conv_fprop: image has 4 channels, weight 3"):
        g.conv_fprop(x, w, padding=1)


def test_conv_fprop_grouped_is_taken_and_bad_groups_refused():
    g = G()
    x = g.tensor((1, 4, 8, 8))
    assert g.conv_fprop(x, g.tensor((6, 2, 3, 3)), padding=1).dim == (1, 6, 8, 8)
    with pytest.raises(ValueError, match="not a multiple of the 2 groups"):
        g.conv_fprop(x, g.tensor((5, 2, 3, 3)), padding=1)


def test_conv_dgrad_loss_channels_and_image_dim_mismatch():
    g = G()
    w = g.tensor((6, 4, 3, 3))
    with pytest.raises(ValueError, match=r"G\.conv_dgrad: loss must have dims \(1, 6, 8, 8\)"):
        g.conv_dgrad(g.tensor((1, 5, 8, 8)), w, padding=1)
    with pytest.raises(ValueError, match=r"G\.conv_dgrad: loss must have dims \(1, 6, 6, 6\)"):
        g.conv_dgrad(g.tensor((1, 6, 8, 8)), w, padding=1, image_dim=(1, 4, 6, 6))
    assert g.conv_dgrad(g.tensor((1, 6, 8, 8)), w, padding=1).dim == (1, 4, 8, 8)


def test_conv_wgrad_filter_dim_and_batch_mismatch():
    g = G()
    x = g.tensor((2, 4, 8, 8))
    with pytest.raises(ValueError, match=r"G\.conv_wgrad: loss must have dims \(2, 6, 6, 6\)"):
        g.conv_wgrad(x, g.tensor((2, 6, 8, 8)), padding=1, filter_dim=(6, 4, 5, 5))
    with pytest.raises(ValueError, match=r"G\.conv_wgrad: loss must have dims"):
        g.conv_wgrad(x, g.tensor((3, 6, 8, 8)), padding=1)
    assert g.conv_wgrad(x, g.tensor((2, 6, 8, 8)), padding=1).dim == (6, 4, 3, 3)


@pytest.mark.parametrize(
    ("kw", "exc"), [({"alpha": math.nan}, ValueError), ({"beta": "a"}, TypeError)]
)
def test_conv_scalars_are_finite_and_named(kw, exc):
    g = G()
    (arg,) = kw
    with pytest.raises(exc, match=rf"G\.conv_fprop: {arg}"):
        g.conv_fprop(g.tensor((1, 4, 8, 8)), g.tensor((6, 4, 3, 3)), padding=1, **kw)


# -- norms -----------------------------------------------------------------------------------------
def _norm_inputs(g, scale=(1, 64, 1, 1), bias=(1, 64, 1, 1)):
    return g.tensor((8, 64, 1, 1)), g.tensor(scale), g.tensor(bias), g.scalar(1e-5)


def test_norm_scale_bias_epsilon_dims():
    g = G()
    x, s, b, e = _norm_inputs(g, scale=(1, 32, 1, 1))
    with pytest.raises(ValueError, match=r"G\.layernorm: scale must have dims \(1, 64, 1, 1\)"):
        g.layernorm(x, s, b, e)
    x, s, b, e = _norm_inputs(g, bias=(64,))
    with pytest.raises(ValueError, match=r"G\.layernorm: bias must have dims"):
        g.layernorm(x, s, b, e)
    x, s, b, _e = _norm_inputs(g)
    with pytest.raises(ValueError, match=r"G\.layernorm: epsilon must be a scalar"):
        g.layernorm(x, s, b, g.tensor((1, 2, 1, 1)))


def test_norm_backward_statistics_dims():
    g = G()
    x, s, b, e = _norm_inputs(g)
    _y, mean, inv = g.layernorm(x, s, b, e)
    with pytest.raises(
        ValueError, match=r"G\.layernorm_backward: mean must have dims \(8, 1, 1, 1\)"
    ):
        g.layernorm_backward(x, x, s, g.tensor((1, 64, 1, 1)), inv)
    with pytest.raises(ValueError, match=r"G\.layernorm_backward: grad .* must have one shape"):
        g.layernorm_backward(g.tensor((8, 32, 1, 1)), x, s, mean, inv)


# -- attention -------------------------------------------------------------------------------------
def _qkv(g, d=64, dv=64, dtypes=(None, None, None)):
    q = g.tensor((2, 4, 64, d), data_type=dtypes[0], name="q")
    k = g.tensor((2, 4, 64, d), data_type=dtypes[1], name="k")
    v = g.tensor((2, 4, 64, dv), data_type=dtypes[2], name="v")
    return q, k, v


def test_sdpa_qkv_dtype_mismatch():
    g = G()
    with pytest.raises(TypeError, match=r"G\.sdpa: q, k and v must have one data type"):
        g.sdpa(*_qkv(g, dtypes=("float16", "bfloat16", None)))


@pytest.mark.parametrize(("d", "dv"), [(60, 64), (512, 512), (64, 36)])
def test_sdpa_head_dims_cudnn_cannot_take(d, dv):
    g = G()
    with pytest.raises(ValueError, match=r"G\.sdpa: (q/k|v)'s head dim \(D\) is"):
        g.sdpa(*_qkv(g, d, dv))


def test_sdpa_seed_and_length_dtypes():
    g = G()
    seed = g.tensor((1, 1, 1, 1), data_type="float32")
    off = g.tensor((1, 1, 1, 1), data_type="int64")
    with pytest.raises(TypeError, match=r"G\.sdpa: dropout seed \('t\d+'\) must be int64, got f"):
        g.sdpa(*_qkv(g), is_inference=False, dropout=(0.1, seed, off))
    lens = g.tensor((2, 1, 1, 1), data_type="int64")
    with pytest.raises(TypeError, match=r"G\.sdpa: seq_len_q \('t\d+'\) must be int32, got int64"):
        g.sdpa(*_qkv(g), seq_len_q=lens, seq_len_kv=lens)


# -- tensors, scalars, bounds ----------------------------------------------------------------------
def test_set_dim_of_a_used_tensor_is_refused():
    g = G()
    x = g.tensor((1, 4, 8, 8))
    g.conv_fprop(x, g.tensor((6, 4, 3, 3)), padding=1)
    with pytest.raises(ValueError, match=r"G: tensor 't0' is used by an operation"):
        x.set_dim((1, 5, 8, 8))
    x.set_dim((1, 4, 8, 8))  # unchanged: fine
    y = g.tensor((3, 3))
    y.set_dim((2, 2))  # unused: fine


def test_set_stride_past_int64_is_refused():
    g = G()
    x = g.tensor((4, 4))
    with pytest.raises(ValueError, match="more elements \\(or span more\\)"):
        x.set_stride((2**62, 2**62))


def test_tensor_dims_elements_and_span_bounded():
    g = G()
    with pytest.raises(ValueError, match=r"G: tensor dim must contain ints <= 2\*\*63 - 1"):
        g.tensor((2**70, 4))
    with pytest.raises(ValueError, match="more elements"):
        g.tensor((2**40, 2**40))


@pytest.mark.parametrize(
    ("value", "dtype", "exc"),
    [
        (2**40, "int32", OverflowError),
        (-(2**31) - 1, "int32", OverflowError),
        (2**63, "int64", OverflowError),
        (1e300, "float16", OverflowError),
        (1e300, "float32", OverflowError),
        (1e39, "bfloat16", OverflowError),
        (2**2000, "float32", OverflowError),
        (0.5, "int32", ValueError),
        (math.inf, "int64", ValueError),
    ],
)
def test_scalar_values_that_do_not_fit_are_refused(value, dtype, exc):
    with pytest.raises(exc, match=r"^G: by-value tensor"):
        G().scalar(value, dtype)


def test_scalar_values_that_fit():
    g = G()
    g.scalar(2**31 - 1, "int32")
    g.scalar(65504.0, "float16")
    g.scalar(-math.inf, "float32")  # an explicit infinity is meant (attention's -inf mask)


def test_pointwise_alpha_nan_refused_and_json_standard():
    g = G()
    x = g.tensor((1, 4))
    with pytest.raises(ValueError, match=r"G\.add: alpha1 must be a finite number, got nan"):
        g.add(x, x, alpha1=math.nan)
    with pytest.raises(TypeError, match=r"G\.add: alpha2 must be a real number, got 'a'"):
        g.add(x, x, alpha2="a")


class _Cai:
    """A device array by ``__cuda_array_interface__`` (tensor_like trusts it: no pointer check)."""

    def __init__(self, shape, strides):
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": "<f2",
            "strides": strides,
            "data": (0x10000, False),
            "version": 3,
        }


def _device_array(shape, strides_bytes):
    return _Cai(shape, strides_bytes)


@pytest.mark.parametrize(
    ("shape", "strides", "fragment"),
    [
        ((4, 4), (0, 2), "zero or negative"),
        ((4, 4), (-8, 2), "zero or negative"),
        ((0, 4), (8, 2), "must contain ints >= 1"),
        ((1,) * 9, (2,) * 9, "1 to 8 values"),
    ],
)
def test_tensor_like_keeps_the_rules_of_tensor(shape, strides, fragment):
    g = G()
    with pytest.raises(ValueError, match=fragment):
        g.tensor_like(_device_array(shape, strides))


def test_tensor_like_refuses_strides_of_part_elements():
    with pytest.raises(TypeError, match=r"G: tensor_like needs a device array: .*not a multiple"):
        G().tensor_like(_device_array((4, 4), (8, 3)))


def test_tensor_like_takes_a_size_one_dim_of_any_stride():
    g = G()
    t = g.tensor_like(_device_array((1, 4), (0, 2)))
    assert t.dim == (1, 4) and t.stride == (1, 1)


# -- Graph.execute with the high level's rules -----------------------------------------------------
@pytest.fixture
def built(monkeypatch):
    """A built graph ``y = relu(a) + b`` (relu's output virtual) on a fake plan and handle;
    arrays are ints (their addresses) read by a fake ``asarray`` as (1, 1, 2, 3) float16."""
    import contextlib
    import types

    import numpy as np

    from pycudnn import _cuda, memory
    from pycudnn.graph import _builder

    launched = []

    class Plan:
        workspace = 0

        def launch(self, ptrs, scratch=()):
            launched.append(list(ptrs))

    handle = types.SimpleNamespace(set_stream=lambda s: None)
    monkeypatch.setattr(_builder._plans, "plan", lambda key, h: Plan())
    monkeypatch.setattr(_builder._handle, "get_handle", lambda device: handle)
    monkeypatch.setattr(_cuda, "DeviceContext", lambda device: contextlib.nullcontext())

    def asarray(obj, check=False):
        if not isinstance(obj, int):
            raise TypeError(f"not a device array: {type(obj).__name__}")
        return types.SimpleNamespace(
            dtype=np.dtype("float16"), shape=(1, 1, 2, 3), strides=(12, 12, 6, 2), device=0, ptr=obj
        )

    monkeypatch.setattr(memory, "asarray", asarray)
    g = G()
    a, b = g.tensor((1, 1, 2, 3), name="a"), g.tensor((1, 1, 2, 3), name="b")
    r = g.relu(a, name="r")
    y = g.add(r, b, name="y").set_output(True)
    g.build(device=0)
    return g, a, b, r, y, launched


def test_execute_runs_a_valid_pack(built):
    g, a, _b, _r, y, launched = built
    g.execute({a: 0x1000, "b": 0x2000, y: 0x3000})
    assert launched == [[0x1000, 0x2000, 0x3000]]


@pytest.mark.parametrize("pack", [None, [1, 2], "a"])
def test_execute_needs_a_mapping(built, pack):
    g = built[0]
    with pytest.raises(TypeError, match=r"G\.execute: variant_pack must be a mapping"):
        g.execute(pack)


def test_execute_refuses_an_array_for_a_virtual_tensor(built):
    g, a, b, r, y, _ = built
    with pytest.raises(
        ValueError, match=r"G\.execute: tensor 'r::y' is virtual|tensor '.*' is virtual"
    ):
        g.execute({a: 0x1000, b: 0x2000, y: 0x3000, r: 0x4000})


def test_execute_refuses_the_same_tensor_twice(built):
    g, a, b, _r, y, _ = built
    with pytest.raises(ValueError, match=r"G\.execute: tensor 'a' is given twice"):
        g.execute({a: 0x1000, "a": 0x1000, b: 0x2000, y: 0x3000})


@pytest.mark.parametrize(("out", "other"), [(0x1000, "input 'a'"), (0x2000, "input 'b'")])
def test_execute_refuses_an_output_overlapping_an_input(built, out, other):
    g, a, b, _r, y, _ = built
    with pytest.raises(ValueError, match=rf"output '.*' overlaps the array of {other}"):
        g.execute({a: 0x1000, b: 0x2000, y: out})


def test_execute_refuses_wrong_key_and_value_types(built):
    g, a, b, _r, y, _ = built
    with pytest.raises(TypeError, match="variant_pack keys are Tensors, names or uids"):
        g.execute({a: 0x1000, b: 0x2000, y: 0x3000, 1.5: 0x4000})
    with pytest.raises(TypeError, match="tensor 'b' needs a device array"):
        g.execute({a: 0x1000, b: "0x2000", y: 0x3000})


# -- Graph.deserialize of garbage ------------------------------------------------------------------
def _saved_graph():
    g = G()
    x = g.tensor((1, 4))
    g.relu(x).set_output(True)
    return g


@pytest.mark.parametrize(
    ("data", "exc", "fragment"),
    [
        ("garbage", ValueError, "data is not the JSON serialize() writes"),
        ("[1, 2]", ValueError, "must be the JSON object serialize() writes, got a list"),
        ("{}", ValueError, "data has no 'graph'"),
        (None, TypeError, "data must be the str that serialize() returned, got NoneType"),
        (b"\xff", ValueError, "data is not UTF-8 text"),
        ('{"graph": [], "cudnn_version": 1, "plan": ""}', TypeError, "'graph' must be"),
        (
            '{"graph": {}, "cudnn_version": "92800", "plan": ""}',
            TypeError,
            "'cudnn_version' must be an int (cudnnGetVersion()), got '92800'",
        ),
        ('{"graph": {}, "cudnn_version": 1, "plan": 5}', TypeError, "'plan' must be"),
        (
            '{"graph": {"tensors": [1]}, "cudnn_version": 1, "plan": ""}',
            ValueError,
            "another graph structure",
        ),
    ],
)
def test_deserialize_of_garbage_names_the_field(data, exc, fragment):
    g = _saved_graph()
    with pytest.raises(exc) as info:
        g.deserialize(data)
    assert str(info.value).startswith("G") and fragment in str(info.value)


def test_deserialize_of_another_version_says_which():
    g = _saved_graph()
    import json

    from pycudnn.graph._key import unnamed
    from pycudnn.graph.nodes._base import cudnn_version

    saved = {"graph": unnamed(json.loads(g.to_json())), "cudnn_version": 1, "plan": ""}
    with pytest.raises(ValueError, match=f"saved with cuDNN 1, this is {cudnn_version()}"):
        g.deserialize(json.dumps(saved))


# -- build/key arguments ---------------------------------------------------------------------------
def _small():
    g = G()
    g.relu(g.tensor((1, 4))).set_output(True)
    return g


@pytest.mark.parametrize(
    ("kw", "exc", "fragment"),
    [
        ({"device": "0"}, TypeError, "G.build: device must be a device ordinal"),
        ({"device": True}, TypeError, "G.build: device must be a device ordinal"),
        ({"device": -1}, ValueError, "G.build: device must be a device ordinal"),
        ({"heur_mode": 5}, ValueError, "G: heur_mode=5"),
        ({"deny_behavior_notes": 5}, TypeError, "G: deny_behavior_notes must be a note"),
    ],
)
def test_key_arguments_are_checked(kw, exc, fragment):
    with pytest.raises(exc) as info:
        _small().key(**kw)
    assert fragment in str(info.value)


def test_key_takes_one_note_by_name():
    key = _small().key(device=0, deny_numerical_notes="TENSOR_CORE")
    assert len(key.deny_numerical) == 1


def test_an_output_with_overlapping_strides_is_refused():
    g = G()
    y = g.relu(g.tensor((4, 4)))
    with pytest.raises(ValueError, match=r"G: output tensor .* strides \(1, 1\) make the elements"):
        y.set_stride((1, 1))
    y.set_stride((1, 4))  # column-major: fine
    x = g.tensor((4, 4))
    x.set_stride((1, 1))  # an input may be read with overlapping strides
