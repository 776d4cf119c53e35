"""CPU tests of the public graph builder (:mod:`pycudnn.graph`): no GPU, no plan.

* every operation's argument checks (types, tensors of another graph, ranks and shapes, the
  matmul inner dim, reduction dims, pointwise arity / parameters / broadcasting, ``gen_index``'s
  axis, convolution padding arity, the attention checks), each message naming the argument;
* the tensor setters; ``to_json()``; the frozen :class:`GraphKey` (equality by structure, not by
  names; what changes it; the pointer order of a call: ``set_io_order``, by-value constants,
  scratch last);
* the composite attention graphs (which nodes the masks, dropout, grouped-query heads and the
  deterministic backward add; the scratch tensors);
* ``workspace_layout``, ``_host_scalar``, ``deserialize`` refusals, ``execute`` before ``build``;
* ``GraphKey.build_graph``: a cuDNN refusal is re-raised naming the node, its kind and the
  attribute (cuDNN's finalize is faked: without a GPU driver every backend finalize fails).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import json
import types

import numpy as np
import pytest

from pycudnn import errors
from pycudnn.descriptors import BackendDescriptor
from pycudnn.enums import BackendDescriptorType as D
from pycudnn.enums import DataType, PointwiseMode
from pycudnn.graph import Graph, GraphKey, Tensor, _scratch, _tensor
from pycudnn.graph._key import TensorSpec
from pycudnn.graph.nodes import _base as nodes_base
from pycudnn.graph.nodes import sdpa as sdpa_node

F16, BF16, F32 = DataType.HALF, DataType.BFLOAT16, DataType.FLOAT


def g16(**kw):
    return Graph(io_data_type="float16", **kw)


def qkv(g, b=2, h=4, hk=4, s=64, skv=64, d=64):
    return (
        g.tensor((b, h, s, d), name="q"),
        g.tensor((b, hk, skv, d), name="k"),
        g.tensor((b, hk, skv, d), name="v"),
    )


# ==================================================================================================
# Graph and tensors
# ==================================================================================================
def test_graph_data_types():
    g = Graph("bfloat16", "float32", np.float32)
    assert g.io_data_type == BF16 and g.intermediate_data_type == F32 and g.compute_data_type == F32
    assert Graph().io_data_type is None
    with pytest.raises(TypeError, match="io_data_type"):
        Graph(io_data_type="float128")
    with pytest.raises(TypeError, match="compute_data_type"):
        Graph(compute_data_type=object())


@pytest.mark.parametrize(
    ("kwargs", "exc", "fragment"),
    [
        (dict(dim=5), TypeError, "tensor dim must be a sequence of ints"),
        (dict(dim="abc"), TypeError, "tensor dim must be a sequence"),
        (dict(dim=(2, 0)), ValueError, "tensor dim must contain ints >= 1"),
        (dict(dim=(2, 2.0)), TypeError, "tensor dim must contain ints"),
        (dict(dim=(2, True)), TypeError, "tensor dim must contain ints"),
        (dict(dim=()), ValueError, "tensor dim must have 1 to 8 values"),
        (dict(dim=(1,) * 9), ValueError, "1 to 8 values"),
        (dict(dim=(2, 3), stride=(3, 0)), ValueError, "tensor stride must contain ints >= 1"),
        (dict(dim=(2, 3), stride=(1,)), ValueError, "stride (1,) has 1 values, dim (2, 3) has 2"),
        (dict(dim=(2, 3), data_type="complex"), TypeError, "data_type"),
        (dict(dim=(2, 3), is_pass_by_value=True), ValueError, "pass-by-value tensor is a scalar"),
        (dict(dim=(2, 3), uid=0), ValueError, "uid must be an int in [1, 2**62)"),
        (dict(dim=(2, 3), uid=True), ValueError, "uid must be an int"),
        (dict(dim=(2, 3), alignment=3), ValueError, "alignment must be a power of two"),
    ],
)
def test_tensor_argument_errors(kwargs, exc, fragment):
    with pytest.raises(exc) as info:
        g16().tensor(**kwargs)
    assert fragment in str(info.value)


def test_tensor_setters_chain_and_check():
    g = g16()
    t = g.tensor((2, 3, 4), name="x")
    assert t.dim == (2, 3, 4) and t.stride == (12, 4, 1) and t.data_type is None
    assert t.set_dim((4, 5)) is t and t.dim == (4, 5) and t.stride == (5, 1)  # rank changed
    assert t.set_dim((4, 6)).stride == (5, 1)  # same rank: strides kept
    assert t.set_stride((1, 4)).get_stride() == [1, 4] and t.get_dim() == [4, 6]
    assert t.set_data_type("bfloat16").get_data_type() == BF16
    assert t.set_name("renamed").name == "renamed"
    assert t.set_uid(77).get_uid() == 77
    assert t.set_alignment(256) is t
    assert not t.is_virtual and not t.is_pass_by_value
    assert "renamed" in repr(t) and "bfloat16" in repr(t)
    with pytest.raises(ValueError, match=r"tensor 'renamed': stride \(1,\) has 1 values"):
        t.set_stride((1,))
    with pytest.raises(ValueError, match="tensor 'renamed': dim must contain ints >= 1"):
        t.set_dim((0, 1))
    with pytest.raises(TypeError, match="tensor 'renamed': data_type"):
        t.set_data_type("nope")
    with pytest.raises(TypeError, match="non-empty str"):
        t.set_name("")
    with pytest.raises(ValueError, match="uid must be"):
        t.set_uid(2**62)
    with pytest.raises(ValueError, match="alignment must be"):
        t.set_alignment(512)
    with pytest.raises(ValueError, match="graph input; it cannot be virtual"):
        t.set_output(False)
    y = g.relu(t)
    assert y.is_virtual and y.set_output(True) is y and not y.is_virtual
    assert y.set_output(False).is_virtual


def test_scalar_and_by_value_tensors():
    g = g16()
    s = g.scalar(0.5, name="half")
    assert s.is_pass_by_value and s.dim == (1, 1, 1, 1) and s.data_type == F32
    assert g.tensor((1, 1), is_pass_by_value=True).is_pass_by_value
    with pytest.raises(TypeError, match="scalar value must be a real number"):
        g.scalar("1")
    with pytest.raises(TypeError, match="scalar value must be a real number"):
        g.scalar(True)
    with pytest.raises(TypeError, match="scalar data_type"):
        g.scalar(1.0, "nope")


def test_tensor_like_needs_a_device_array():
    with pytest.raises(TypeError, match="tensor_like needs a device array"):
        g16().tensor_like(np.zeros((2, 2), np.float16))


def test_a_built_graph_is_frozen():
    g = g16()
    x = g.tensor((2, 3))
    g.relu(x).set_output(True)
    g._key = g.key(device=0)  # what build() does once planned
    with pytest.raises(RuntimeError, match="the graph was built; make a new Graph"):
        g.tensor((1,))
    with pytest.raises(RuntimeError, match="was built"):
        x.set_dim((3, 3))
    with pytest.raises(RuntimeError, match="was built"):
        g.exp(x)


# ==================================================================================================
# Operations: argument checks
# ==================================================================================================
def _conv_graph():
    g = g16()
    return g, g.tensor((2, 4, 8, 8), name="x"), g.tensor((6, 4, 3, 3), name="w")


@pytest.mark.parametrize(
    ("call", "exc", "fragment"),
    [
        (lambda g, x, w: g.conv_fprop("x", w), TypeError, "conv_fprop: image must be a Tensor"),
        (lambda g, x, w: g.conv_fprop(x, None), TypeError, "conv_fprop: weight must be a Tensor"),
        (lambda g, x, w: g.conv_fprop(x, g.tensor((6, 4, 3))), ValueError, "same rank"),
        (lambda g, x, w: g.conv_fprop(g.tensor((2, 4)), g.tensor((6, 4))), ValueError, "same rank"),
        (
            lambda g, x, w: g.conv_fprop(x, w, padding=(1, 1, 1)),
            ValueError,
            "conv_fprop: padding must have 2 values",
        ),
        (
            lambda g, x, w: g.conv_fprop(x, w, padding=-1),
            ValueError,
            "padding must contain ints >= 0",
        ),
        (lambda g, x, w: g.conv_fprop(x, w, stride=0), ValueError, "stride must contain ints >= 1"),
        (
            lambda g, x, w: g.conv_fprop(x, w, dilation=(1,)),
            ValueError,
            "dilation must have 2 values",
        ),
        (
            lambda g, x, w: g.conv_fprop(x, w, post_padding=(1, 1, 1)),
            ValueError,
            "post_padding must have 2 values",
        ),
        (lambda g, x, w: g.conv_fprop(x, w, mode="corr"), ValueError, "mode='corr' is not one of"),
        (
            lambda g, x, w: g.conv_fprop(x, w, compute_data_type="nope"),
            TypeError,
            "conv_fprop: compute_data_type",
        ),
        (
            lambda g, x, w: g.conv_fprop(x, g.tensor((6, 4, 11, 3))),
            ValueError,
            "padded image (8) is smaller than the dilated kernel (11) in spatial dim 0",
        ),
        (lambda g, x, w: g.conv_fprop(x, w, dilation=5), ValueError, "dilated kernel (11)"),
        (
            lambda g, x, w: g.conv_dgrad(x, w, padding=(1, 2, 3)),
            ValueError,
            "conv_dgrad: padding must have 2 values",
        ),
        (
            lambda g, x, w: g.conv_dgrad(x, w, image_dim=(2, 0, 8, 8)),
            ValueError,
            "conv_dgrad: image_dim must contain ints >= 1",
        ),
        (lambda g, x, w: g.conv_wgrad(x, "dy"), TypeError, "conv_wgrad: loss must be a Tensor"),
        (
            lambda g, x, w: g.conv_wgrad(x, x, filter_dim=(6,) * 9),
            ValueError,
            "conv_wgrad: filter_dim must have 1 to 8 values",
        ),
    ],
)
def test_conv_argument_errors(call, exc, fragment):
    g, x, w = _conv_graph()
    with pytest.raises(exc) as info:
        call(g, x, w)
    assert fragment in str(info.value)


def test_conv_output_shapes():
    g, x, w = _conv_graph()
    assert g.conv_fprop(x, w).dim == (2, 6, 6, 6)
    assert g.conv_fprop(x, w, padding=1).dim == (2, 6, 8, 8)
    assert g.conv_fprop(x, w, padding=(1, 0), stride=2).dim == (2, 6, 4, 3)
    assert g.conv_fprop(x, w, padding=1, post_padding=(0, 2)).dim == (2, 6, 7, 9)
    assert g.conv_fprop(x, w, dilation=2).dim == (2, 6, 4, 4)
    dy = g.tensor((2, 6, 6, 6))
    assert g.conv_dgrad(dy, w).dim == (2, 4, 8, 8)
    assert g.conv_wgrad(x, dy).dim == (6, 4, 3, 3)
    # an NHWC image gives an NHWC output
    xh = g.tensor((2, 4, 8, 8), (256, 1, 32, 4))
    assert g.conv_fprop(xh, w, padding=1).stride == (384, 1, 48, 6)


@pytest.mark.parametrize(
    ("a", "b", "exc", "fragment"),
    [
        ((4, 5), (6, 7), ValueError, "A's last dim (5) must equal B's second to last (6)"),
        ((2, 4, 5), (5, 7), ValueError, "must have the same rank, at least 2"),
        ((5,), (5,), ValueError, "at least 2"),
        ((2, 4, 5), (3, 5, 7), ValueError, "batch dim 0 of A (2) and B (3) differ"),
        ((4, 4, 5), (2, 5, 7), ValueError, "neither is 1"),  # no grouping outside attention
    ],
)
def test_matmul_shape_errors(a, b, exc, fragment):
    g = g16()
    with pytest.raises(exc) as info:
        g.matmul(g.tensor(a), g.tensor(b))
    assert fragment in str(info.value)


def test_clipped_relu_straight_on_a_matmul_is_refused():
    """cuDNN 9.19's matmul engines ignore the upper clip of a ReLU on the product (the GPU
    fuzzer's finding through dnn_matmul): the builder refuses it before any C call; a plain
    ReLU on the product, and a clipped one after a bias, are built."""
    g = g16()
    c = g.matmul(g.tensor((4, 5)), g.tensor((5, 8)))
    with pytest.raises(errors.NotSupportedError, match="relu_upper_clip on a matmul's output"):
        g.relu(c, relu_upper_clip=6.0)
    g.relu(c, relu_lower_clip=0.0)
    g.relu(g.add(c, g.tensor((1, 8))), relu_upper_clip=6.0)
    assert g._nodes[-1][2]["relu_upper_clip"] == 6.0


def test_matmul_shapes_and_overrides():
    g = g16()
    c = g.matmul(g.tensor((1, 4, 5)), g.tensor((3, 5, 7)), name="mm")
    assert c.dim == (3, 4, 7) and c.is_virtual and c.name == "mm::C"
    assert g._nodes[-1][0] == "matmul"
    with pytest.raises(TypeError, match="matmul: A must be a Tensor"):
        g.matmul(None, g.tensor((5, 7)))
    with pytest.raises(TypeError, match="matmul: m_override must be a Tensor"):
        g.matmul(g.tensor((4, 5)), g.tensor((5, 7)), m_override=3)
    m = g.tensor((1, 1), data_type="int32")
    g.matmul(g.tensor((4, 5)), g.tensor((5, 7)), m_override=m, padding_value=0.0)
    roles = [r for r, _ in g._nodes[-1][3]]
    assert "OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC" in roles
    assert g._nodes[-1][2]["padding_value"] == 0.0


def test_tensors_of_another_graph_are_refused():
    g1, g2 = g16(name="one"), g16(name="two")
    x1 = g1.tensor((2, 3), name="x1")
    x2 = g2.tensor((2, 3))
    with pytest.raises(ValueError, match=r"two\.add: input0 \('x1'\) belongs to another graph"):
        g2.add(x1, x2)
    with pytest.raises(ValueError, match=r"two\.add: input1 \('x1'\) belongs to another graph"):
        g2.add(x2, x1)
    with pytest.raises(ValueError, match=r"matmul: B .* belongs to another graph"):
        g2.matmul(g2.tensor((2, 3)), g1.tensor((3, 2)))
    with pytest.raises(ValueError, match="set_io_order: tensors\\[0\\]"):
        g2.set_io_order(x1)


@pytest.mark.parametrize(
    ("call", "exc", "fragment"),
    [
        (lambda g, x, y: g.add(x, None), TypeError, "add: input1 must be a Tensor of this graph"),
        (lambda g, x, y: g.add(x), TypeError, "missing"),  # a required argument (Python's own)
        (lambda g, x, y: g.pointwise("add", x), TypeError, "add: input1 must be a Tensor"),
        (lambda g, x, y: g.pointwise("relu_fwd", x, y), TypeError, "takes 1 input(s)"),
        (lambda g, x, y: g.pointwise("add", x, y, x), TypeError, "takes 2 input(s)"),
        (lambda g, x, y: g.pointwise("no_such_mode", x), ValueError, "mode"),
        (lambda g, x, y: g.relu(x, slope=0.1), TypeError, "unknown parameter 'slope'"),
        (
            lambda g, x, y: g.relu(x, relu_lower_clip="a"),
            ValueError,
            "relu_lower_clip must be a real number",
        ),
        (lambda g, x, y: g.elu(x, elu_alpha=float("nan")), ValueError, "elu_alpha must be a real"),
        (lambda g, x, y: g.add(x, g.tensor((2, 3))), ValueError, "inputs of different ranks"),
        (
            lambda g, x, y: g.add(x, g.tensor((2, 2, 5))),
            ValueError,
            "dim 1 of the inputs [(2, 3, 5), (2, 2, 5)] does not broadcast",
        ),
        (lambda g, x, y: g.gen_index(x), TypeError, "gen_index needs axis="),
        (lambda g, x, y: g.gen_index(x, axis=3), ValueError, "axis must be an int in [0, 3)"),
        (lambda g, x, y: g.gen_index(x, axis=-1), ValueError, "axis must be an int in [0, 3)"),
        (lambda g, x, y: g.gen_index(x, axis=1.0), ValueError, "axis must be an int"),
        (lambda g, x, y: g.binary_select(x, y, None), TypeError, "input2 must be a Tensor"),
        (
            lambda g, x, y: g.exp(5),
            TypeError,
            "exp: input0 must be a Tensor of this graph, got int",
        ),
        (lambda g, x, y: g.relu_backward(x, None), TypeError, "relu_bwd: input1 must be a Tensor"),
    ],
)
def test_pointwise_argument_errors(call, exc, fragment):
    g = g16()
    x, y = g.tensor((2, 3, 5), name="x"), g.tensor((2, 3, 5), name="y")
    with pytest.raises(exc) as info:
        call(g, x, y)
    assert fragment in str(info.value)


def test_pointwise_outputs_and_settings():
    g = g16()
    x = g.tensor((2, 3, 5), (15, 1, 3), name="x")  # an inner-major layout
    b = g.tensor((1, 3, 1), name="b")
    y = g.add(x, b, alpha2=2.0, name="bias")
    assert y.dim == (2, 3, 5) and y.stride == (15, 1, 3)  # the larger input's layout
    kind, name, s, roles = g._nodes[-1]
    assert (kind, name) == ("pointwise", "bias")
    assert s["mode"] == int(PointwiseMode.ADD) and s["alpha2"] == 2.0
    assert [r for r, _ in roles] == [
        "OPERATION_POINTWISE_XDESC",
        "OPERATION_POINTWISE_BDESC",
        "OPERATION_POINTWISE_YDESC",
    ]
    assert g.cmp_gt(x, b).data_type == DataType.BOOLEAN
    assert g.gen_index(x, axis=2).data_type == DataType.INT32
    assert g._nodes[-1][2]["axis"] == 2
    g.relu(x, relu_lower_clip=0.0, relu_upper_clip=6)
    assert g._nodes[-1][2]["relu_upper_clip"] == 6.0
    dx = g.relu_backward(y, x)  # backward: (dy, x) -> dx
    assert [r for r, _ in g._nodes[-1][3]] == [
        "OPERATION_POINTWISE_DYDESC",
        "OPERATION_POINTWISE_XDESC",
        "OPERATION_POINTWISE_DXDESC",
    ]
    assert dx.dim == x.dim
    m = g.cmp_lt(x, b)
    sel = g.binary_select(x, y, m)
    assert [r for r, _ in g._nodes[-1][3]][-2] == "OPERATION_POINTWISE_TDESC" and sel.dim == x.dim
    assert g.bias is not None and Graph.bias is Graph.add and Graph.scale is Graph.mul
    assert g.pointwise(PointwiseMode.TANH_FWD, x).dim == x.dim
    assert g.pointwise("sqrt", x).dim == x.dim


@pytest.mark.parametrize(
    ("dim", "fragment"),
    [
        ((2, 1), "must have the input's rank"),
        ((2, 1, 1, 1), "must have the input's rank"),
        ((2, 4, 1), "a divisor of it"),
        ((2, 0, 1), "dim must contain ints >= 1"),
    ],
)
def test_reduction_dim_errors(dim, fragment):
    g = g16()
    with pytest.raises(ValueError) as info:
        g.reduction(g.tensor((2, 6, 8)), "add", dim=dim)
    assert "reduction: dim" in str(info.value) and fragment in str(info.value)


def test_reduction_settings_and_modes():
    g = g16()
    x = g.tensor((2, 6, 8))
    assert g.reduction(x, "max", dim=(2, 1, 1)).dim == (2, 1, 1)
    assert g.reduction(x, dim=(2, 3, 8), deterministic=True).dim == (2, 3, 8)  # groups of 2
    assert g._nodes[-1][2]["deterministic"] is True
    with pytest.raises(ValueError, match="mode"):
        g.reduction(x, "median", dim=(1, 1, 1))
    with pytest.raises(TypeError, match="reduction: input must be a Tensor"):
        g.reduction([1], dim=(1,))


def test_reshape_checks_the_element_count():
    g = g16()
    x = g.tensor((2, 6))
    assert g.reshape(x, (3, 4), (4, 1)).dim == (3, 4)
    with pytest.raises(ValueError, match=r"reshape: dims \(3, 5\) do not hold the input's 12"):
        g.reshape(x, (3, 5), (5, 1))
    with pytest.raises(ValueError, match="reshape: stride must contain ints >= 1"):
        g.reshape(x, (3, 4), (0, 1))


def test_norm_argument_errors():
    g = g16()
    x = g.tensor((8, 64, 1, 1), name="x")
    sc = g.tensor((1, 64, 1, 1), name="scale")
    bi = g.tensor((1, 64, 1, 1), name="bias")
    eps = g.scalar(1e-5)
    y, mean, inv = g.layernorm(x, sc, bi, eps)
    assert y.dim == x.dim and mean.dim == (8, 1, 1, 1) and inv.data_type == F32
    y, mean, inv = g.layernorm(x, sc, bi, eps, "inference")
    assert mean is None and inv is None
    y, inv = g.rmsnorm(x, sc, None, eps)
    assert inv.dim == (8, 1, 1, 1)
    assert g.rmsnorm(x, sc, None, eps, "INFERENCE")[1] is None
    with pytest.raises(ValueError, match="norm_forward_phase='train' is not 'training' or"):
        g.layernorm(x, sc, bi, eps, "train")
    with pytest.raises(TypeError, match="layernorm: scale must be a Tensor"):
        g.layernorm(x, None, bi, eps)
    with pytest.raises(TypeError, match="layernorm: epsilon must be a Tensor"):
        g.layernorm(x, sc, bi, 1e-5)
    with pytest.raises(ValueError, match="input needs at least 2 dims"):
        g.layernorm(g.tensor((8,)), sc, bi, eps)
    y, mean, inv = g.instancenorm(x, sc, bi, eps)
    assert mean.dim == (8, 64, 1, 1)
    y, mean, inv = g.batchnorm(x, sc, bi, eps)
    assert mean.dim == (1, 64, 1, 1)
    with pytest.raises(TypeError, match="batchnorm: in_running_var must be a Tensor"):
        g.batchnorm(x, sc, bi, eps, in_running_mean=sc)
    outs = g.batchnorm(
        x, sc, bi, eps, in_running_mean=sc, in_running_var=bi, momentum=g.scalar(0.1)
    )
    assert len(outs) == 5
    _y, mean, inv = g.layernorm(x, sc, bi, eps)  # the layer norm's statistics (8, 1, 1, 1)
    dx, ds, db = g.layernorm_backward(x, x, sc, mean, inv)
    assert dx.dim == x.dim and ds.dim == sc.dim and db.dim == sc.dim
    with pytest.raises(TypeError, match="layernorm_backward: mean must be a Tensor"):
        g.layernorm_backward(x, x, sc, None, inv)
    dx, ds, db = g.rmsnorm_backward(x, x, sc, inv)
    assert db is None
    assert g.rmsnorm_backward(x, x, sc, inv, True)[2] is not None
    with pytest.raises(TypeError, match="rmsnorm_backward: grad must be a Tensor"):
        g.rmsnorm_backward(None, x, sc, inv)


# ==================================================================================================
# Attention: argument checks
# ==================================================================================================
def _attn(**shape):
    g = g16()
    return g, *qkv(g, **shape)


@pytest.mark.parametrize(
    ("make", "kwargs", "exc", "fragment"),
    [
        (
            lambda g, q, k, v: (g.tensor((2, 4, 64)), k, v),
            {},
            ValueError,
            "sdpa: q must have 4 dims (B, H, S, D), got (2, 4, 64)",
        ),
        (
            lambda g, q, k, v: (q, g.tensor((2, 4, 64, 64), (16384, 4096, 1, 64)), v),
            {},
            ValueError,
            "k's last dim (D) must have stride 1",
        ),
        (
            lambda g, q, k, v: (q, k, g.tensor((3, 4, 64, 64))),
            {},
            ValueError,
            "q, k, v batch sizes differ",
        ),
        (
            lambda g, q, k, v: (q, g.tensor((2, 4, 64, 32)), v),
            {},
            ValueError,
            "q and k head dims differ (64 vs 32)",
        ),
        (
            lambda g, q, k, v: (q, k, g.tensor((2, 4, 32, 64))),
            {},
            ValueError,
            "k and v sequence lengths differ (64 vs 32)",
        ),
        (
            lambda g, q, k, v: (q, g.tensor((2, 3, 64, 64)), g.tensor((2, 3, 64, 64))),
            {},
            ValueError,
            "q's heads (4) must be a multiple of k's (3)",
        ),
        (lambda g, q, k, v: ("q", k, v), {}, TypeError, "sdpa: q must be a Tensor"),
        (
            lambda g, q, k, v: (q, k, g16().tensor((2, 4, 64, 64), name="alien")),
            {},
            ValueError,
            "sdpa: v ('alien') belongs to another graph",
        ),
        (
            lambda g, q, k, v: (q, k, v),
            dict(seq_len_q="sq"),
            TypeError,
            "seq_len_q must be a Tensor",
        ),
        (
            lambda g, q, k, v: (q, k, v),
            "only_q",
            ValueError,
            "a padding mask needs both seq_len_q and seq_len_kv",
        ),
        (
            lambda g, q, k, v: (q, k, v),
            "bad_len_dims",
            ValueError,
            "seq_len_kv must have dims (2, 1, 1, 1), got (2, 1)",
        ),
        (
            lambda g, q, k, v: (q, k, v),
            dict(dropout=0.1),
            TypeError,
            "dropout must be (probability, seed, offset)",
        ),
        (
            lambda g, q, k, v: (q, k, v),
            dict(dropout=(0.1, None)),
            TypeError,
            "dropout must be (probability, seed, offset)",
        ),
        (
            lambda g, q, k, v: (q, k, v),
            "p=1",
            ValueError,
            "dropout probability must be in [0, 1), got 1.0",
        ),
        (lambda g, q, k, v: (q, k, v), "p=-0.1", ValueError, "dropout probability must be in"),
        (lambda g, q, k, v: (q, k, v), "p=True", ValueError, "dropout probability must be in"),
        (lambda g, q, k, v: (q, k, v), "seed=int", TypeError, "dropout seed must be a Tensor"),
        (
            lambda g, q, k, v: (q, k, v),
            dict(attn_scale=float("inf")),
            ValueError,
            "attn_scale must be a finite number",
        ),
        (
            lambda g, q, k, v: (q, k, v),
            dict(attn_scale="0.1"),
            TypeError,
            "attn_scale must be a real number",
        ),
    ],
)
def test_sdpa_argument_errors(make, kwargs, exc, fragment):
    g, q, k, v = _attn()
    q, k, v = make(g, q, k, v)
    if isinstance(kwargs, str):
        seed = g.tensor((1, 1, 1, 1), data_type="int64")
        off = g.tensor((1, 1, 1, 1), data_type="int64")
        lens = g.tensor((2, 1, 1, 1), data_type="int32")
        kwargs = {
            "only_q": dict(seq_len_q=lens),
            "bad_len_dims": dict(seq_len_q=lens, seq_len_kv=g.tensor((2, 1), data_type="int32")),
            "p=1": dict(dropout=(1.0, seed, off)),
            "p=-0.1": dict(dropout=(-0.1, seed, off)),
            "p=True": dict(dropout=(True, seed, off)),
            "seed=int": dict(dropout=(0.1, 7, off)),
        }[kwargs]
    with pytest.raises(exc) as info:
        g.sdpa(q, k, v, **kwargs)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (dict(o=(2, 4, 64, 32)), "o and dO must have dims (2, 4, 64, 64)"),
        (dict(do=(2, 4, 32, 64)), "o and dO must have dims"),
        (dict(stats=(2, 4, 64, 64)), "stats must have dims (2, 4, 64, 1)"),
        (dict(s=1), "s_q = s_kv = 1 is not supported"),
    ],
)
def test_sdpa_backward_argument_errors(change, fragment):
    s = change.get("s", 64)
    g, q, k, v = _attn(s=s, skv=s)
    o = g.tensor(change.get("o", (2, 4, s, 64)))
    do = g.tensor(change.get("do", (2, 4, s, 64)))
    st = g.tensor(change.get("stats", (2, 4, s, 1)), data_type="float32")
    with pytest.raises(ValueError) as info:
        g.sdpa_backward(q, k, v, o, do, st)
    assert "sdpa_backward" in str(info.value) and fragment in str(info.value)
    with pytest.raises(TypeError, match="sdpa_backward: dO must be a Tensor"):
        g.sdpa_backward(q, k, v, o, None, st)


def test_sdpa_accepts_gqa_mqa_and_bshd_strides():
    g = g16()
    q = g.tensor((2, 8, 96, 64), (8 * 96 * 64, 64, 8 * 64, 1), name="q")  # (B, S, H, D) memory
    k = g.tensor((2, 1, 96, 64), name="k")
    v = g.tensor((2, 1, 96, 32), name="v")  # another value head dim
    o, stats = g.sdpa(q, k, v, is_inference=False)
    assert o.dim == (2, 8, 96, 32) and not o.is_virtual
    assert o.stride == (8 * 96 * 32, 32, 8 * 32, 1)  # q's memory order
    assert stats.dim == (2, 8, 96, 1) and stats.data_type == F32 and not stats.is_virtual
    g2 = g16()
    o2, none = g2.sdpa(*qkv(g2))
    assert none is None and o2.data_type == F16


# ==================================================================================================
# The composite attention graphs
# ==================================================================================================
def _sdpa_key(
    causal=False, pad=False, dropout=False, hk=4, backward=False, det=False, training=False, p=0.1
):
    g = Graph(io_data_type="bfloat16")
    q, k, v = qkv(g, hk=hk)
    sq = skv = d = None
    if pad:
        sq = g.tensor((2, 1, 1, 1), data_type="int32", name="sq")
        skv = g.tensor((2, 1, 1, 1), data_type="int32", name="skv")
    if dropout:
        d = (
            p,
            g.tensor((1, 1, 1, 1), data_type="int64", name="seed"),
            g.tensor((1, 1, 1, 1), data_type="int64", name="offset"),
        )
    if backward:
        o = g.tensor((2, 4, 64, 64), name="o")
        do = g.tensor((2, 4, 64, 64), name="do")
        st = g.tensor((2, 4, 64, 1), data_type="float32", name="stats")
        opts = sdpa_node.SdpaOptions(None, causal, sq, skv, d)
        outs = sdpa_node.backward(g, (q, k, v), (o, do, st), opts, "bwd", deterministic=det)
    else:
        outs = g.sdpa(
            q,
            k,
            v,
            is_inference=not training,
            use_causal_mask=causal,
            seq_len_q=sq,
            seq_len_kv=skv,
            dropout=d,
        )
    key = g.key(device=0)
    kinds = collections.Counter(n.kind for n in key.nodes)
    pw = collections.Counter(
        PointwiseMode(dict(n.settings)["mode"]).name for n in key.nodes if n.kind == "pointwise"
    )
    return g, key, kinds, pw, outs


BASE_FWD = {"MUL": 1, "SUB": 1, "EXP": 1, "LOG": 1, "ADD": 1, "DIV": 1}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pad", [False, True])
@pytest.mark.parametrize("dropout", [False, True])
@pytest.mark.parametrize("hk", [4, 2, 1])
def test_sdpa_forward_graph(causal, pad, dropout, hk):
    _g, key, kinds, pw, (o, stats) = _sdpa_key(causal, pad, dropout, hk, training=True)
    assert kinds["matmul"] == 2 and kinds["reduction"] == 2  # Q K^T, P V; max, sum
    assert kinds["rng"] == int(dropout)
    want = collections.Counter(BASE_FWD)
    if causal:
        want.update({"GEN_INDEX": 2, "CMP_GE": 1, "BINARY_SELECT": 1})
    if pad:
        want.update({"GEN_INDEX": 2, "CMP_LT": 2, "LOGICAL_AND": 1, "BINARY_SELECT": 1})
    if dropout:
        want.update({"MUL": 2})  # the mask, the 1 / (1 - p) scale
    assert pw == want
    assert len(key.nodes) == 4 + sum(want.values()) + int(dropout)
    assert key.scratch == ()  # the forward keeps nothing in the workspace
    if dropout:
        (rng,) = [n for n in key.nodes if n.kind == "rng"]
        assert dict(rng.settings)["probability"] == pytest.approx(0.9)  # keep probability
    # K is given to cuDNN transposed (same memory, last two dims and strides swapped)
    kspec = key.tensors[1]
    assert kspec.dim == (2, hk, 64, 64) and kspec.stride == (hk * 4096, 4096, 1, 64)
    # the by-value constants: the scale, -inf for the masks, the dropout scale
    byv = [t for t in key.tensors if t.is_by_value]
    assert len(byv) == 1 + int(causal or pad) + int(dropout)
    assert not o.is_virtual and not stats.is_virtual


def test_sdpa_inference_has_a_virtual_stats_tensor_and_p0_drops_dropout():
    _g, key, kinds, _pw, (_o, stats) = _sdpa_key()
    assert stats is None
    real = [t for t in key.tensors if not t.is_virtual and not t.is_by_value]
    assert len(real) == 4  # q, k, v, o
    _g, key, kinds, _pw, _ = _sdpa_key(dropout=True, p=0.0)
    assert kinds["rng"] == 0


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pad", [False, True])
@pytest.mark.parametrize("dropout", [False, True])
@pytest.mark.parametrize("hk", [4, 2, 1])
@pytest.mark.parametrize("det", [False, True])
def test_sdpa_backward_graph(causal, pad, dropout, hk, det):
    _g, key, kinds, pw, (dq, dk, dv) = _sdpa_key(causal, pad, dropout, hk, backward=True, det=det)
    assert kinds["matmul"] == 5  # Q K^T, P^T dO, dO V^T, dS^T Q, dS K
    assert kinds["reshape"] == 3  # P^T, dS^T, K
    # the rowsum of dO * O, and (grouped-query) the head sums of dK and dV
    assert kinds["reduction"] == 1 + (2 if hk != 4 else 0)
    assert kinds["rng"] == int(dropout)
    assert pw["IDENTITY"] == (0 if det else 1)  # the float32 dQ accumulator's copy out
    assert pw["EXP"] == 1 and pw["SUB"] == 2
    assert pw["GEN_INDEX"] == 2 * int(causal) + 2 * int(pad)
    assert pw["MUL"] == 5 + (4 if dropout else 0)
    scratch = key.scratch
    assert [s.dim for s in scratch] == [(2, 4, 64, 1)] + ([] if det else [(2, 4, 64, 64)])
    assert all(s.data_type == int(F32) and not s.is_virtual for s in scratch)
    # the scratch tensors come last in a call's pointer order
    assert key.uids[len(key.uids) - len(scratch) :] == tuple(s.uid for s in scratch)
    assert dq.dim == (2, 4, 64, 64) and dk.dim == (2, hk, 64, 64) and dv.dim == (2, hk, 64, 64)
    for t in (dq, dk, dv):
        assert not t.is_virtual and t.data_type == BF16


def test_sdpa_backward_dq_accumulator_is_zeroed_only_before_cudnn_9_6(monkeypatch):
    """cudnn-frontend memsets the float32 dQ accumulator for cuDNN < 9.6 only: later versions
    initialise it themselves (the GPU test runs the backward twice and compares)."""
    for version, fill in ((90500, "zero"), (91900, "keep")):
        monkeypatch.setattr(nodes_base, "_cached_version", version)
        _g, key, *_ = _sdpa_key(backward=True)
        assert [s.scratch for s in key.scratch] == ["keep", fill]


# ==================================================================================================
# to_json, keys, pointer order
# ==================================================================================================
def _chain(name_prefix="", dims=(4, 8), io="float16"):
    g = Graph(io_data_type=io, name="chain")
    x = g.tensor(dims, name=f"{name_prefix}x")
    b = g.tensor((1, dims[1]), name=f"{name_prefix}b")
    y = g.relu(g.add(x, b, name=f"{name_prefix}add"), name=f"{name_prefix}relu")
    y.set_output(True).set_name(f"{name_prefix}y")
    return g, x, b, y


def test_to_json_structure():
    g, x, _b, _y = _chain()
    d = json.loads(g.to_json())
    assert d["format"] == "pycudnn.graph/1" and d["name"] == "chain"
    assert len(d["tensors"]) == 4 and len(d["nodes"]) == 2
    uids = [t["uid"] for t in d["tensors"]]
    assert uids == [1, 2, 3, 4]
    assert [t["name"] for t in d["tensors"]] == ["x", "b", "add::y", "y"]
    assert [t["is_virtual"] for t in d["tensors"]] == [False, False, True, False]
    assert d["tensors"][2]["data_type"] == int(F32)  # intermediate
    assert d["tensors"][3]["data_type"] == int(F16)  # io
    add, relu = d["nodes"]
    assert add["kind"] == "pointwise" and add["name"] == "add"
    assert add["settings"]["mode"] == int(PointwiseMode.ADD)
    assert add["tensors"] == [
        ["OPERATION_POINTWISE_XDESC", 1],
        ["OPERATION_POINTWISE_BDESC", 2],
        ["OPERATION_POINTWISE_YDESC", 3],
    ]
    assert relu["tensors"][-1] == ["OPERATION_POINTWISE_YDESC", 4]
    assert json.loads(g.to_json()) == d  # stable
    x.set_uid(10)
    assert [t["uid"] for t in json.loads(g.to_json())["tensors"]] == [10, 1, 2, 3]


def test_freeze_errors():
    with pytest.raises(ValueError, match="the graph has no operations"):
        g16().to_json()
    g = g16()
    g.relu(g.tensor((2, 2)))
    with pytest.raises(ValueError, match="no operation output is marked set_output"):
        g.validate()
    g = Graph()
    g.relu(g.tensor((2, 2), name="untyped")).set_output(True)
    with pytest.raises(ValueError, match="tensor 'untyped' has no data type"):
        g.key(device=0)
    g = g16()
    g.relu(g.tensor((2, 2), uid=5)).set_output(True).set_uid(5)
    with pytest.raises(ValueError, match="two tensors were given the same uid"):
        g.validate()


def test_key_equal_by_structure_not_names():
    a = _chain("")[0].key(device=0)
    b = _chain("other_")[0].key(device=0)
    assert a == b and hash(a) == hash(b)
    assert a.names != b.names
    assert {a: 1}[b] == 1
    assert isinstance(a, GraphKey) and "pointwise+pointwise" in repr(a)


@pytest.mark.parametrize(
    "change",
    [
        lambda: _chain(dims=(4, 16))[0].key(device=0),
        lambda: _chain(io="bfloat16")[0].key(device=0),
        lambda: _chain()[0].key(device=1),
        lambda: _chain()[0].key(device=0, policy="autotune"),
        lambda: _chain()[0].key(device=0, heur_mode="b"),
        lambda: _chain()[0].key(device=0, deterministic=True),
        lambda: _chain()[0].key(device=0, allow_tf32=True),
        lambda: _chain()[0].key(device=0, workspace_limit=0),
        lambda: _chain()[0].key(device=0, deny_behavior_notes=["RUNTIME_COMPILATION"]),
        lambda: _chain()[0].key(device=0, deny_numerical_notes=["TENSOR_CORE"]),
    ],
)
def test_key_changes_with_structure_and_policy(change):
    base = _chain()[0].key(device=0, deterministic=False, allow_tf32=False)
    other = change()
    assert base != other


def test_key_policy_arguments():
    g = _chain()[0]
    k = g.key(
        device=0,
        policy="autotune",
        heur_mode=("instant",),
        deny_behavior_notes=["RUNTIME_COMPILATION"],
    )
    assert k.algo == "time" and len(k.heur_modes) == 1 and len(k.deny_behavior) == 1
    assert g.key(device=0).algo == "guess"
    with pytest.raises(ValueError, match="policy='fastest' is not 'heuristics' or 'autotune'"):
        g.key(device=0, policy="fastest")
    with pytest.raises(ValueError, match="heur_mode='z'"):
        g.key(device=0, heur_mode="z")
    with pytest.raises(ValueError, match="heur_mode is empty"):
        g.key(device=0, heur_mode=())
    with pytest.raises(ValueError, match="workspace_limit must be None or an int >= 0"):
        g.key(device=0, workspace_limit=-5)
    with pytest.raises(ValueError, match="deny_behavior_notes"):
        g.key(device=0, deny_behavior_notes=["NO_SUCH_NOTE"])


def test_uid_order_io_order_constants_then_scratch():
    g = g16()
    a = g.tensor((1, 1, 2, 3), name="a")
    b = g.tensor((1, 1, 2, 3), name="b")
    s = g.scalar(2.0, name="two")
    y = g.mul(g.add(a, b), s).set_output(True)
    scr = g._scratch("acc", (1, 1, 2, 3), F32, "zero")
    g.add(y, scr)  # the scratch tensor used somewhere
    k = g.key(device=0)
    uid = {t.name: spec.uid for t, spec in zip(g._tensors, k.tensors, strict=True)}
    assert k.uids == (uid["a"], uid["b"], uid[y.name], uid["two"], uid["acc"])
    g.set_io_order(y, b)
    k = g.key(device=0)
    assert k.uids == (uid[y.name], uid["b"], uid["a"], uid["two"], uid["acc"])
    assert [t.scratch for t in k.scratch] == ["zero"]


def test_workspace_layout_is_256_aligned():
    s1 = TensorSpec(1, (2, 4, 64, 1), (256, 64, 1, 1), int(F32), False, False, 16, "keep")
    s2 = TensorSpec(2, (3, 5), (5, 1), int(F16), False, False, 16, "zero")
    assert _scratch.workspace_layout(1000, ()) == (1000, [])
    assert _scratch.workspace_layout(0, (s1,)) == (2048, [0])
    total, offs = _scratch.workspace_layout(100, (s1, s2))
    assert offs == [256, 256 + 2048] and total == 256 + 2048 + 256
    assert all(o % 256 == 0 for o in offs)
    total, offs = _scratch.workspace_layout(256, (s2, s1))
    assert offs == [256, 512] and total == 512 + 2048


# ==================================================================================================
# Scalars, deserialize, execute
# ==================================================================================================
@pytest.mark.parametrize(
    ("value", "dt", "ctype", "raw"),
    [
        (0.5, DataType.FLOAT, ctypes.c_float, 0.5),
        (3, DataType.DOUBLE, ctypes.c_double, 3.0),
        (7, DataType.INT32, ctypes.c_int32, 7),
        (-2.0, DataType.INT64, ctypes.c_int64, -2),
        (2**40, DataType.INT64, ctypes.c_int64, 2**40),
        (1.0, DataType.HALF, ctypes.c_uint16, 0x3C00),
        (-2.0, DataType.HALF, ctypes.c_uint16, 0xC000),
        (float("-inf"), DataType.HALF, ctypes.c_uint16, 0xFC00),
        (1.0, DataType.BFLOAT16, ctypes.c_uint16, 0x3F80),
        (-2.0, DataType.BFLOAT16, ctypes.c_uint16, 0xC000),
        (1.0 + 2**-8, DataType.BFLOAT16, ctypes.c_uint16, 0x3F80),  # a tie: to even (down)
        (1.0 + 3 * 2**-8, DataType.BFLOAT16, ctypes.c_uint16, 0x3F82),  # a tie: to even (up)
        (1.0 + 2**-7 + 2**-12, DataType.BFLOAT16, ctypes.c_uint16, 0x3F81),  # nearest
        (float("-inf"), DataType.BFLOAT16, ctypes.c_uint16, 0xFF80),
    ],
)
def test_host_scalar(value, dt, ctype, raw):
    c = _tensor.host_scalar(value, dt)
    assert type(c) is ctype and c.value == raw


def test_host_scalar_errors():
    with pytest.raises(ValueError, match=r"by-value tensor 'n' is an integer, got 2\.5"):
        _tensor.host_scalar(2.5, DataType.INT32, "n")
    with pytest.raises(TypeError, match="needs a real number, got True"):
        _tensor.host_scalar(True, DataType.FLOAT)
    with pytest.raises(TypeError, match="needs a real number"):
        _tensor.host_scalar("1", DataType.FLOAT)
    with pytest.raises(TypeError, match="is not supported for scalars"):
        _tensor.host_scalar(1, DataType.BOOLEAN)


def test_constant_pointers_hold_the_scalars():
    g = g16()
    x = g.tensor((1, 1, 2, 2))
    g.mul(g.mul(x, g.scalar(0.25)), g.scalar(3.0, "float32")).set_output(True)
    ptrs = g.constant_pointers()
    assert [ctypes.c_float.from_address(p).value for p in ptrs] == [0.25, 3.0]
    g2 = g16()
    x2 = g2.tensor((2, 2))
    g2.mul(x2, g2.tensor((1, 1), is_pass_by_value=True, data_type="float32", name="s"))
    g2._tensors[-1].set_output(True)
    with pytest.raises(ValueError, match="by-value tensor 's' has no constant"):
        g2.constant_pointers()


def test_deserialize_refuses_another_structure_or_version():
    g, *_ = _chain()
    other, *_ = _chain(dims=(4, 16))
    saved = json.dumps(
        {
            "graph": json.loads(other.to_json()),
            "plan": "{}",
            "cudnn_version": nodes_base.cudnn_version(),
            "engine": 0,
        }
    )
    with pytest.raises(ValueError, match="chain: the saved plan is for another graph structure"):
        g.deserialize(saved)
    saved = json.dumps({"graph": json.loads(g.to_json()), "plan": "{}", "cudnn_version": 1})
    with pytest.raises(ValueError, match="the plan was saved with cuDNN 1, this is"):
        g.deserialize(saved)
    # names only label messages: a renamed graph of the same structure passes the structure
    # check (and meets the version check here)
    renamed, *_ = _chain("renamed_")
    with pytest.raises(ValueError, match=r"saved with cuDNN 1"):
        renamed.deserialize(saved)
    assert "another graph structure" not in _raised(renamed.deserialize, saved)


def _raised(fn, *args):
    try:
        fn(*args)
    except ValueError as exc:
        return str(exc)
    return ""


def test_execute_and_plan_before_build():
    g, x, b, y = _chain()
    with pytest.raises(RuntimeError, match="chain: call build\\(\\) first"):
        g.execute({x: None, b: None, y: None})
    with pytest.raises(RuntimeError, match="call build"):
        g.describe()
    with pytest.raises(RuntimeError, match="call build"):
        g.serialize()
    with pytest.raises(RuntimeError, match="call build"):
        g.get_workspace_size()


def test_variant_pack_lookup():
    g, x, b, y = _chain()
    g._key = g.key(device=0)
    assert g._lookup(x) is x and g._lookup("b") is b and g._lookup(g._key.tensors[3].uid) is y
    with pytest.raises(KeyError, match="no tensor named 'zz'"):
        g._lookup("zz")
    with pytest.raises(KeyError, match="no tensor with uid 99"):
        g._lookup(99)
    with pytest.raises(TypeError, match="variant_pack keys are Tensors, names or uids"):
        g._lookup(1.5)
    other = _chain()[1]
    with pytest.raises(ValueError, match="tensor 'x' belongs to another graph"):
        g._lookup(other)
    g2, x2, _b, _y = _chain()
    g2.relu(x2, name="dup").set_name("x")
    with pytest.raises(KeyError, match="more than one tensor named 'x'"):
        g2._lookup("x")


def test_like_strides():
    assert _tensor.like_strides((2, 3, 4), (2, 3, 4), (12, 1, 3)) == (12, 1, 3)
    assert _tensor.like_strides((2, 5, 4), (2, 3, 4), (12, 1, 3)) == (20, 1, 5)
    assert _tensor.like_strides((2, 3), (2, 3, 4), (12, 4, 1)) == (3, 1)  # other rank: packed


# ==================================================================================================
# build_graph: cuDNN's refusals name the node
# ==================================================================================================
def _fake_finalize(monkeypatch, refuse):
    """BackendDescriptor.finalize succeeds (without a C call) except for *refuse* types."""

    def finalize(self):
        if self._type in refuse:
            raise errors.BadParamError(2000, "cudnnBackendFinalize", "fake refusal")
        self._finalized = True
        return self

    monkeypatch.setattr(BackendDescriptor, "finalize", finalize)


def test_build_graph_on_cpu_makes_the_descriptors_or_names_the_tensor():
    g, *_ = _chain()
    key = g.key(device=0)
    try:
        key.build_graph(None)
    except errors.CudnnError as exc:  # without a GPU driver cuDNN refuses every finalize
        assert isinstance(exc, (errors.SublibraryError, errors.CudnnError))
        assert "node 'x' (tensor): cuDNN refused its dims (4, 8) / strides (8, 1)" in str(exc)


def test_build_graph_refused_operation_names_node_kind_and_attribute(monkeypatch):
    _fake_finalize(monkeypatch, {D.OPERATION_POINTWISE_DESCRIPTOR})
    g, *_ = _chain()
    with pytest.raises(errors.BadParamError) as info:
        g.key(device=0).build_graph(None)
    msg = str(info.value)
    assert "node 'add' (pointwise): cuDNN refused finalize: fake refusal" in msg
    assert info.value.detail.startswith("node 'add'")


def test_build_graph_refused_sub_descriptor(monkeypatch):
    _fake_finalize(monkeypatch, {D.POINTWISE_DESCRIPTOR})
    g, *_ = _chain()
    with pytest.raises(errors.BadParamError) as info:
        g.key(device=0).build_graph(None)
    assert (
        "node 'add' (pointwise): cuDNN refused its OPERATION_POINTWISE_PW_DESCRIPTOR "
        "settings" in str(info.value)
    )


def test_build_graph_refused_tensor(monkeypatch):
    _fake_finalize(monkeypatch, {D.TENSOR_DESCRIPTOR})
    g, *_ = _chain()
    with pytest.raises(errors.BadParamError, match=r"node 'x' \(tensor\): cuDNN refused its dims"):
        g.key(device=0).build_graph(None)


def test_build_graph_refused_graph(monkeypatch):
    _fake_finalize(monkeypatch, {D.OPERATIONGRAPH_DESCRIPTOR})
    g, *_ = _chain()
    g._label = "my chain"
    pattern = r"node 'my chain' \(operation graph\): cuDNN refused the graph"
    with pytest.raises(errors.BadParamError, match=pattern):
        g.key(device=0).build_graph(None)


@pytest.mark.parametrize("det", [False, True])
def test_build_graph_of_attention_makes_every_operation(monkeypatch, det):
    """Every node kind of the attention graphs turns into a descriptor (finalize faked)."""
    _fake_finalize(monkeypatch, set())
    made = collections.Counter()
    real_init = BackendDescriptor.__init__

    def init(self, descriptor_type):
        real_init(self, descriptor_type)
        made[self._type.name] += 1

    monkeypatch.setattr(BackendDescriptor, "__init__", init)
    # cuDNN takes no unfinalized operation into a graph: keep the list instead
    monkeypatch.setattr(
        BackendDescriptor, "operation_graph", classmethod(lambda cls, ops, handle=None: list(ops))
    )
    _g, key, kinds, _pw, _ = _sdpa_key(
        causal=True, pad=True, dropout=True, hk=2, backward=True, det=det
    )
    ops = key.build_graph(None)
    assert len(ops) == len(key.nodes)
    assert made["TENSOR_DESCRIPTOR"] == len(key.tensors)
    assert made["OPERATION_MATMUL_DESCRIPTOR"] == kinds["matmul"]
    assert made["OPERATION_POINTWISE_DESCRIPTOR"] == kinds["pointwise"]
    assert made["OPERATION_RNG_DESCRIPTOR"] == 1 and made["RNG_DESCRIPTOR"] == 1
    assert made["OPERATION_RESHAPE_DESCRIPTOR"] == 3


def test_a_scalar_takes_the_rank_of_its_operation():
    g = g16()
    x = g.tensor((2, 3), name="x")
    s = g.scalar(0.5, name="half")
    y = g.mul(x, s)
    # the operation reads a rank-2 copy of the constant; the argument is left as declared
    # (issue 42: no argument object is modified by a call that takes it)
    used = g._nodes[-1][3][1][1]
    assert y.dim == (2, 3) and used.dim == (1, 1) and used.stride == (1, 1)
    assert used._value.value == s._value.value and s.dim == (1, 1, 1, 1)
    z = g.mul(g.tensor((2, 3, 4, 5)), s)  # the same constant at rank 4 as well
    assert z.dim == (2, 3, 4, 5) and g._nodes[-1][3][1][1] is s
    p = g.tensor((1, 1, 1, 1), data_type="float32", is_pass_by_value=True, name="p")
    g.mul(x, p)  # a by-value input takes the rank of the first operation it feeds
    assert p.dim == (1, 1)
    with pytest.raises(ValueError, match=r"by-value tensor 'p' is used at rank 2 already"):
        g.mul(g.tensor((2, 3, 4, 5)), p)


def test_batchnorm_builds_the_training_phase_only():
    g = g16()
    x = g.tensor((8, 4, 2, 2))
    sc, bi = g.tensor((1, 4, 1, 1)), g.tensor((1, 4, 1, 1))
    with pytest.raises(ValueError, match="batchnorm: only the training phase"):
        g.batchnorm(x, sc, bi, g.scalar(1e-5), norm_forward_phase="inference")


def test_batchnorm_describes_its_statistics_as_cudnn_compares_them():
    """The next running statistics take the running statistics' data type (the graph's io type,
    float16 beside the float32 mean, made cuDNN refuse every such graph at finalize), the
    parameter gradients the scale's, and every per-channel tensor cudnn-frontend's strides."""
    g = g16()
    x = g.tensor((8, 4, 2, 2), (16, 1, 8, 4))
    sc, bi = (g.tensor((1, 4, 1, 1), data_type="float32") for _ in range(2))
    rm, rv = (g.tensor((1, 4, 1, 1), (1, 1, 1, 1), data_type="float32") for _ in range(2))
    y, mean, inv, nrm, nrv = g.batchnorm(
        x, sc, bi, g.scalar(1e-5), in_running_mean=rm, in_running_var=rv, momentum=g.scalar(0.1)
    )
    for t in (y, mean, inv, nrm, nrv):
        t.set_output(True)
    assert nrm.data_type == nrv.data_type == mean.data_type == F32
    assert y.data_type is None and y.stride == x.stride  # (None: the graph's io type)
    for t in (sc, bi, rm, rv, mean, inv, nrm, nrv):
        assert t.stride == (4, 1, 4, 4)
    dx, dscale, dbias = g.batchnorm_backward(x, x, sc, mean, inv)
    assert dscale.data_type == dbias.data_type == F32 and dscale.stride == (4, 1, 4, 4)
    assert dx.stride == x.stride
    # the other norms keep their parameter gradients in the graph's io type
    lm, li = (g.tensor((8, 1, 1, 1), data_type="float32") for _ in range(2))
    _, ds, _ = g.layernorm_backward(x, x, g.tensor((1, 4, 2, 2)), lm, li)
    assert ds.data_type is None


@pytest.mark.parametrize("det", [False, True])
def test_sdpa_backward_public_deterministic_flag(det):
    g = g16()
    q, k, v = qkv(g)
    o, do = g.tensor((2, 4, 64, 64)), g.tensor((2, 4, 64, 64))
    st = g.tensor((2, 4, 64, 1), data_type="float32")
    g.sdpa_backward(q, k, v, o, do, st, use_deterministic_algorithm=det)
    assert len(g.key(device=0).scratch) == (1 if det else 2)


def test_tensor_class_is_exported():
    g = g16()
    assert isinstance(g.tensor((1,)), Tensor)


# ==================================================================================================
# The engine entry: build -> _plans.plan, the key's timing buffers, execute -> GraphPlan.launch
# ==================================================================================================
def _graph_with_scratch():
    g = g16()
    a = g.tensor((1, 1, 2, 3), name="a")
    b = g.tensor((1, 1, 2, 3), name="b")
    y = g.mul(g.add(a, b), g.scalar(2.0, name="two"))
    g.add(y, g._scratch("acc", (1, 1, 2, 3), F32, "zero"))
    g.add(y, g.tensor((1, 1, 1, 1), data_type="float32", is_pass_by_value=True, name="bias"))
    return g, a, b, y.set_output(True)


class _FakeHandle:
    stream = 7

    def __init__(self):
        self.streams = []

    def set_stream(self, stream):
        self.streams.append(stream)


def test_the_key_gives_the_engine_timing_buffers(monkeypatch):
    """Zero-filled buffers for the real tensors, 1 for the float by-value ones, placeholders
    for the scratch tensors (carved from the workspace by GraphPlan.launch)."""
    from pycudnn import memory

    made = []

    def zeros(shape, dtype, device, stream):
        made.append((shape, dtype, device, stream))
        return type("Buf", (), {"ptr": 4096 * len(made)})()

    monkeypatch.setattr(memory, "zeros", zeros)
    g, *_ = _graph_with_scratch()
    key = g.key(device=3)
    ptrs, keep = key.timing_buffers(_FakeHandle(), given_ptrs=None)
    spec = {t.uid: t for t in key.tensors}
    assert len(ptrs) == len(key.uids)
    for uid, ptr in zip(key.uids, ptrs, strict=True):
        s = spec[uid]
        if s.scratch:
            assert ptr == 0
        elif s.is_by_value:
            assert ctypes.c_float.from_address(ptr).value == 1.0
    assert made == [((12,), "uint8", 3, 7)] * 3  # a, b, y: 6 half elements each
    assert len(keep) == 3 + 2  # the buffers and the two host scalars


def test_build_plans_through_the_engine_and_execute_launches(monkeypatch):
    from pycudnn import _cuda, memory
    from pycudnn.graph import _builder

    launched = []

    class Plan:
        workspace = 0

        def launch(self, ptrs, scratch=()):
            # the by-value scalars are read when the plan runs
            values = [ctypes.c_float.from_address(p).value for p in ptrs[3:5]]
            launched.append((list(ptrs), scratch, values))

    asked = []
    handle = _FakeHandle()
    monkeypatch.setattr(_builder._plans, "plan", lambda key, h: asked.append((key, h)) or Plan())
    monkeypatch.setattr(_builder._handle, "get_handle", lambda device: handle)
    monkeypatch.setattr(_cuda, "DeviceContext", lambda device: contextlib.nullcontext())

    def asarray(obj, check=False):
        shape, strides = (1, 1, 2, 3), (12, 12, 6, 2)
        return types.SimpleNamespace(
            dtype=np.dtype("float16"), shape=shape, strides=strides, device=0, ptr=obj
        )

    monkeypatch.setattr(memory, "asarray", asarray)
    g, a, b, y = _graph_with_scratch()
    g.build(device=0, policy="autotune")
    ((key, h),) = asked
    assert key is g._key and h is handle and key.algo == "time"
    g.execute({a: 0x1000, b: 0x2000, y: 0x3000, "bias": 0.5}, stream=5)
    ((ptrs, scratch, values),) = launched
    assert ptrs[:3] == [0x1000, 0x2000, 0x3000] and ptrs[-1] == 0  # the scratch slot
    assert sorted(values) == [0.5, 2.0]  # the given bias and the graph's constant
    assert [s.scratch for s in scratch] == ["zero"] and handle.streams == [5]
    Plan.workspace = 100  # a given workspace holds the engine's and the scratch tensors'
    assert g.get_workspace_size() == 256 + 256
    small = types.SimpleNamespace(nbytes=300, ptr=0x9000)

    def asarray_or_workspace(obj, check=False):
        return obj if obj is small else asarray(obj)

    monkeypatch.setattr(memory, "asarray", asarray_or_workspace)
    with pytest.raises(ValueError, match=r"workspace has 300 B, the plan needs 512 B"):
        g.execute({a: 0x1000, b: 0x2000, y: 0x3000, "bias": 0.5}, small)


def test_graph_and_tensors_take_every_frameworks_dtypes():
    # issue 29: torch.bfloat16 and friends wherever the builder takes a dtype
    import ml_dtypes
    from _framework_dtypes import jax_numpy, torch

    jnp = jax_numpy()
    g = Graph(io_data_type=torch.bfloat16, compute_data_type=torch.float32)
    assert g.io_data_type == BF16 and g.compute_data_type == F32
    g = Graph(io_data_type=jnp.bfloat16, intermediate_data_type=ml_dtypes.bfloat16)
    assert g.io_data_type == BF16 and g.intermediate_data_type == BF16
    g = Graph(io_data_type=np.float16)  # CuPy's dtypes are numpy's
    for given, expected in [
        (torch.float16, F16),
        (jnp.float32, F32),
        (torch.bool, DataType.BOOLEAN),
    ]:
        assert g.tensor((2, 3), data_type=given).data_type == expected
    with pytest.raises(TypeError, match=r"io_data_type.*torch\.complex64"):
        Graph(io_data_type=torch.complex64)


def test_graph_repr_names_its_types_operations_and_state():
    g = Graph(io_data_type="float16", name="block")
    assert repr(g) == (
        "Graph('block', io=float16, intermediate=float32, compute=float32, 0 tensors, ops=[], "
        "not built)"
    )
    x, w = g.tensor((1, 8, 4, 4), name="x"), g.tensor((8, 8, 3, 3), name="w")
    g.relu(g.conv_fprop(x, w, padding=1))
    text = repr(g)
    assert text.startswith("Graph('block', io=float16") and "ops=[conv_fprop, pointwise]" in text
    assert "4 tensors" in text and text.endswith("not built)")
    assert "io=auto" in repr(Graph())
