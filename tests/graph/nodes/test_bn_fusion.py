"""CPU tests of the conv-BN training fusion operations of the graph builder (``genstats``,
``bn_finalize``, ``dbn_weight``; :mod:`pycudnn.graph.nodes.bn_fusion`): no GPU, no plan.

* each operation's argument checks (tensors of this graph, ranks, per-channel dims, scalars,
  accum_count's int64), each message naming the graph, the operation, the argument and the value;
* the outputs (float32, per channel, NHWC-ordered like the activation they summarize) and the
  recorded node (kind, settings, tensor roles in cuDNN's attribute names);
* the backend descriptors the frozen graph makes for the three documented patterns
  (ConvBNfprop with its scale-bias-ReLU prologue, BN finalize, DgradDreluBNBwdWeight): each
  operation's descriptor type, its tensor attributes and its mode / math-precision attributes
  (cuDNN's finalize is faked: without a GPU driver every backend finalize fails);
* ``to_json`` and the frozen key (the math precision is part of the structure).
"""

from __future__ import annotations

import collections
import json
import re

import pytest

from pycudnn import errors
from pycudnn.descriptors import BackendDescriptor
from pycudnn.enums import BackendAttributeType as T
from pycudnn.enums import BackendDescriptorType as D
from pycudnn.enums import BnFinalizeStatsMode, DataType, GenStatsMode, PointwiseMode
from pycudnn.graph import Graph
from pycudnn.graph.nodes import bn_fusion

N, C, K, H, W = 8, 64, 64, 16, 16


def nhwc(n, c, h, w):
    return (c * h * w, 1, c * w, c)


def per_channel(g, name, c=C, dtype="float32"):
    return g.tensor((1, c, 1, 1), nhwc(1, c, 1, 1), dtype, name=name)


def conv_genstats(prologue=False, io="float16"):
    """The ConvBNfprop pattern: [x*scale+bias -> relu] -> conv fprop -> genstats."""
    g = Graph(io_data_type=io, name="convbn")
    x = g.tensor((N, C, H, W), nhwc(N, C, H, W), name="x")
    w = g.tensor((K, C, 3, 3), nhwc(K, C, 3, 3), name="w")
    t = x
    if prologue:
        s = g.tensor((1, C, 1, 1), nhwc(1, C, 1, 1), name="scale")
        b = g.tensor((1, C, 1, 1), nhwc(1, C, 1, 1), name="bias")
        t = g.relu(g.add(g.mul(x, s), b))
    y = g.conv_fprop(t, w, padding=1, name="conv").set_output(True)
    total, sq = g.genstats(y, name="stats")
    total.set_output(True)
    sq.set_output(True)
    return g, y, total, sq


def finalize_graph(c=C):
    g = Graph(io_data_type="float32", name="finalize")
    ins = [per_channel(g, n, c) for n in ("sum", "sq_sum", "gamma", "beta", "rmean", "rvar")]
    eps = g.scalar(1e-5, name="eps")
    momentum = g.scalar(0.1, name="momentum")
    count = g.scalar(N * H * W, "int64", name="count")
    outs = g.bn_finalize(
        *ins[:4],
        eps,
        count,
        prev_running_mean=ins[4],
        prev_running_var=ins[5],
        momentum=momentum,
        name="fin",
    )
    for o in outs:
        o.set_output(True)
    return g, ins, (eps, momentum, count), outs


def dgrad_drelu_dbn(io="float16"):
    """The DgradDreluBNBwdWeight pattern: dgrad -> relu_bwd against the BN forward's output
    (recomputed from the conv output) -> dbn_weight."""
    g = Graph(io_data_type=io, name="dgrad_dbn")
    dy = g.tensor((N, K, H, W), nhwc(N, K, H, W), name="dy")
    w = g.tensor((K, C, 3, 3), nhwc(K, C, 3, 3), name="w")
    x = g.tensor((N, C, H, W), nhwc(N, C, H, W), name="x")
    mean, inv, gamma, beta = (per_channel(g, n) for n in ("mean", "inv", "gamma", "beta"))
    dx = g.conv_dgrad(dy, w, padding=1, image_dim=(N, C, H, W), name="dgrad")
    bn_y = g.add(g.mul(g.mul(g.sub(x, mean), inv), gamma), beta)
    drelu = g.relu_backward(dx, bn_y).set_output(True)
    outs = g.dbn_weight(drelu, x, mean, inv, gamma, name="dbn")
    for o in outs:
        o.set_output(True)
    return g, drelu, outs


# ==================================================================================================
# genstats
# ==================================================================================================
def test_bn_finalize_can_be_refused(monkeypatch):
    monkeypatch.setattr(bn_fusion, "BN_FINALIZE_VERIFIED", False)
    g = Graph(name="bnf")
    c = dict(dims=(1, 4, 1, 1), strides=(4, 1, 4, 4), data_type="float32")
    t = [g.tensor(c["dims"], c["strides"], c["data_type"], name=f"t{i}") for i in range(6)]
    eps, mom = g.scalar(1e-5), g.scalar(0.1)
    cnt = g.scalar(8, "int64")
    with pytest.raises(errors.NotSupportedError, match="BN_FINALIZE_VERIFIED is False"):
        g.bn_finalize(*t[:4], eps, cnt, prev_running_mean=t[4], prev_running_var=t[5], momentum=mom)


@pytest.mark.parametrize("strides", [(1, 1, 1, 1), (C, 1, 1, 1), (C, 1, C, C)])
def test_bn_finalize_describes_per_channel_tensors_as_cudnn_frontend(strides):
    """Whatever the size-1 dims' strides (``tensor_like`` gives a ``(1, C, 1, 1)`` tensor all
    1s, which cuDNN 9.19's finalize engine misreads: 1 of C channels), the operation's
    per-channel tensors go to cuDNN with cudnn-frontend's ``(C, 1, C, C)``: the same memory."""
    g = Graph(io_data_type="float32", name="fin")
    ins = [g.tensor((1, C, 1, 1), strides, "float32", name=f"t{i}") for i in range(6)]
    outs = g.bn_finalize(
        *ins[:4], g.scalar(1e-5), g.scalar(8, "int64"),
        prev_running_mean=ins[4], prev_running_var=ins[5], momentum=g.scalar(0.1),
    )  # fmt: skip
    assert {t.stride for t in (*ins, *outs)} == {(C, 1, C, C)}


def test_genstats_outputs_and_node():
    g, y, total, sq = conv_genstats()
    for t, nm in ((total, "stats::sum"), (sq, "stats::sq_sum")):
        assert t.dim == (1, K, 1, 1) and t.data_type == DataType.FLOAT and t.name == nm
        assert t.stride == (K, 1, K, K)  # the conv output's NHWC order, as cudnn-frontend's
    kind, name, settings, roles = g._nodes[-1]
    assert (kind, name) == ("genstats", "stats")
    assert settings == {"mode": int(GenStatsMode.SQSUM), "compute_data_type": int(DataType.FLOAT)}
    assert [(r, t) for r, t in roles] == [
        ("OPERATION_GENSTATS_XDESC", y),
        ("OPERATION_GENSTATS_SUMDESC", total),
        ("OPERATION_GENSTATS_SQSUMDESC", sq),
    ]


def test_genstats_takes_a_compute_data_type_and_virtual_outputs_by_default():
    g = Graph(io_data_type="bfloat16")
    x = g.tensor((2, 8, 4, 4))
    total, sq = g.genstats(x, compute_data_type="float16")
    assert total.is_virtual and sq.is_virtual and total.name != sq.name
    assert g._nodes[-1][2]["compute_data_type"] == int(DataType.HALF)
    assert g._nodes[-1][1] == "genstats"


@pytest.mark.parametrize(
    ("make", "exc", "fragment"),
    [
        (lambda g, x: g.genstats(x._dim), TypeError, "g.genstats: input must be a Tensor"),
        (lambda g, x: g.genstats(g.tensor((8, 4))), ValueError, "input must have dims (N, C"),
        (lambda g, x: g.genstats(Graph().tensor((2, 4, 4))), ValueError, "another graph"),
        (lambda g, x: g.genstats(x, compute_data_type="int128"), TypeError, "compute_data_type"),
    ],
)
def test_genstats_argument_errors(make, exc, fragment):
    g = Graph(io_data_type="float16", name="g")
    x = g.tensor((2, 4, 3, 3))
    with pytest.raises(exc, match=re.escape(fragment)):
        make(g, x)
    assert not g._nodes


# ==================================================================================================
# bn_finalize
# ==================================================================================================
def test_bn_finalize_outputs_and_roles():
    g, ins, (eps, momentum, count), outs = finalize_graph()
    assert len(outs) == 6
    names = ["eq_scale", "eq_bias", "mean", "inv_variance", "next_running_mean"]
    assert [o.name for o in outs] == [f"fin::{n}" for n in [*names, "next_running_var"]]
    assert all(o.dim == (1, C, 1, 1) and o.data_type == DataType.FLOAT for o in outs)
    kind, name, settings, roles = g._nodes[-1]
    assert (kind, name) == ("bn_finalize", "fin")
    assert settings == {
        "mode": int(BnFinalizeStatsMode.TRAINING),
        "compute_data_type": int(DataType.FLOAT),
    }
    by_role = dict(roles)
    pre = "OPERATION_BN_FINALIZE_"
    assert by_role[pre + "Y_SUM_DESC"] is ins[0] and by_role[pre + "Y_SQ_SUM_DESC"] is ins[1]
    assert by_role[pre + "SCALE_DESC"] is ins[2] and by_role[pre + "BIAS_DESC"] is ins[3]
    assert by_role[pre + "PREV_RUNNING_MEAN_DESC"] is ins[4]
    assert by_role[pre + "PREV_RUNNING_VAR_DESC"] is ins[5]
    assert by_role[pre + "EPSILON_DESC"] is eps
    assert by_role[pre + "EXP_AVERATE_FACTOR_DESC"] is momentum
    assert by_role[pre + "ACCUM_COUNT_DESC"] is count
    for role, o in zip(
        ("EQ_SCALE", "EQ_BIAS", "SAVED_MEAN", "SAVED_INV_STD", "UPDATED_RUNNING_MEAN"),
        outs,
        strict=False,
    ):
        assert by_role[f"{pre}{role}_DESC"] is o
    assert by_role[pre + "UPDATED_RUNNING_VAR_DESC"] is outs[5]
    # inputs before outputs (the builder's rule for roles)
    assert [r for r, _ in roles].index(pre + "ACCUM_COUNT_DESC") < [r for r, _ in roles].index(
        pre + "EQ_SCALE_DESC"
    )


def test_bn_finalize_scalars_take_the_rank_of_5d_sums():
    g = Graph(io_data_type="float32")
    t = [g.tensor((1, 4, 1, 1, 1)) for _ in range(6)]
    eps, mom, cnt = g.scalar(1e-5), g.scalar(0.1), g.scalar(32, "int64")
    g.bn_finalize(*t[:4], eps, cnt, prev_running_mean=t[4], prev_running_var=t[5], momentum=mom)
    assert eps.dim == mom.dim == cnt.dim == (1, 1, 1, 1, 1)


def _finalize_args(g, **change):
    args = {n: per_channel(g, n) for n in ("sum", "sq_sum", "scale", "bias")}
    args |= {"epsilon": g.scalar(1e-5), "accum_count": g.scalar(8, "int64")}
    kw = {
        "prev_running_mean": per_channel(g, "rm"),
        "prev_running_var": per_channel(g, "rv"),
        "momentum": g.scalar(0.1),
    }
    for k, v in change.items():
        v = v(g) if callable(v) else v
        (args if k in args else kw)[k] = v
    return args, kw


@pytest.mark.parametrize(
    ("change", "exc", "fragment"),
    [
        ({"sum": lambda g: g.tensor((1, C, 2, 1))}, ValueError, "sum ('t"),
        ({"sum": lambda g: g.tensor((C,))}, ValueError, "per-channel dims (1, C, 1, ...)"),
        ({"sq_sum": lambda g: per_channel(g, "sq", c=32)}, ValueError, "sq_sum ('sq') must have"),
        ({"scale": lambda g: g.tensor((1, C, 1))}, ValueError, "scale ('t"),
        ({"prev_running_var": lambda g: per_channel(g, "v", 8)}, ValueError, "prev_running_var"),
        ({"epsilon": lambda g: per_channel(g, "e")}, ValueError, "epsilon ('e') must be a scalar"),
        ({"momentum": lambda g: g.tensor((1, 2))}, ValueError, "momentum ('t"),
        ({"accum_count": lambda g: g.scalar(8.0)}, TypeError, "accum_count ('t"),
        ({"accum_count": lambda g: g.tensor((1, 1, 1, 1))}, TypeError, "got data type unset"),
        ({"bias": None}, TypeError, "bias must be a Tensor of this graph, got NoneType"),
        ({"momentum": 0.1}, TypeError, "momentum must be a Tensor of this graph, got float"),
    ],
)
def test_bn_finalize_argument_errors(change, exc, fragment):
    g = Graph(io_data_type="float32", name="g")
    args, kw = _finalize_args(g, **change)
    with pytest.raises(exc, match="g.bn_finalize: .*" + re.escape(fragment)):
        g.bn_finalize(**args, **kw)
    assert not g._nodes


def test_bn_finalize_needs_the_running_statistics():
    g = Graph(io_data_type="float32")
    args, _kw = _finalize_args(g)
    with pytest.raises(TypeError, match="prev_running_mean"):
        g.bn_finalize(**args)  # cuDNN's operation has no form without them


def test_bn_finalize_accum_count_message_says_what_to_give():
    g = Graph(io_data_type="float32", name="g")
    args, kw = _finalize_args(g, accum_count=lambda g: g.scalar(8, "int32", name="n"))
    with pytest.raises(TypeError) as info:
        g.bn_finalize(**args, **kw)
    msg = str(info.value)
    assert "accum_count ('n') must be an int64 scalar" in msg and "INT32" in msg
    assert "g.scalar(n, 'int64')" in msg


# ==================================================================================================
# dbn_weight
# ==================================================================================================
def test_dbn_weight_outputs_and_roles():
    g, drelu, outs = dgrad_drelu_dbn()
    assert [o.name for o in outs] == [
        "dbn::dscale",
        "dbn::dbias",
        "dbn::eq_scale_dy",
        "dbn::eq_scale_x",
        "dbn::eq_bias",
    ]
    assert all(o.dim == (1, C, 1, 1) and o.data_type == DataType.FLOAT for o in outs)
    assert all(o.stride == (C, 1, C, C) for o in outs)
    kind, name, settings, roles = g._nodes[-1]
    assert (kind, name, settings) == ("dbn_weight", "dbn", {"compute_data_type": 0})
    pre = "OPERATION_BN_BWD_WEIGHTS_"
    assert [r.removeprefix(pre) for r, _ in roles] == [
        "X_DESC",
        "DY_DESC",
        "MEAN_DESC",
        "INVSTD_DESC",
        "BN_SCALE_DESC",
        "DBN_SCALE_DESC",
        "DBN_BIAS_DESC",
        "EQ_DY_SCALE_DESC",
        "EQ_X_SCALE_DESC",
        "EQ_BIAS",
    ]
    assert dict(roles)[pre + "DY_DESC"] is drelu
    assert [n[0] for n in g._nodes] == [
        "conv_dgrad",
        "pointwise",
        "pointwise",
        "pointwise",
        "pointwise",
        "pointwise",
        "dbn_weight",
    ]
    assert g._nodes[5][2]["mode"] == int(PointwiseMode.RELU_BWD)


@pytest.mark.parametrize(
    ("which", "value", "exc", "fragment"),
    [
        (0, lambda g: g.tensor((N, C, H, 8)), ValueError, "grad (8, 64, 16, 8) and input"),
        (1, lambda g: g.tensor((N, C)), ValueError, "input must have dims (N, C, *spatial)"),
        (2, lambda g: g.tensor((1, C, 1)), ValueError, "mean ('t"),
        (3, lambda g: per_channel(g, "iv", 32), ValueError, "inv_variance ('iv') must have"),
        (4, lambda g: g.tensor((C, 1, 1, 1)), ValueError, "scale ('t"),
        (4, lambda g: "gamma", TypeError, "scale must be a Tensor of this graph, got str"),
    ],
)
def test_dbn_weight_argument_errors(which, value, exc, fragment):
    g = Graph(io_data_type="float16", name="g")
    args = [g.tensor((N, C, H, W)), g.tensor((N, C, H, W))]
    args += [per_channel(g, n) for n in ("mean", "inv", "gamma")]
    args[which] = value(g)
    with pytest.raises(exc, match="g.dbn_weight: " + re.escape(fragment)):
        g.dbn_weight(*args)
    assert not g._nodes


# ==================================================================================================
# backend descriptors of the three patterns (finalize faked)
# ==================================================================================================
@pytest.fixture
def recorded(monkeypatch):
    """Every descriptor made by ``build_graph`` and the attributes set on it (finalize faked;
    the operation graph is the list of operations: cuDNN takes no unfinalized operation)."""
    made: list[tuple[D, dict]] = []
    attrs: dict[int, dict] = {}  # id(descriptor) -> its attributes (descriptors have slots)
    real_init, real_set = BackendDescriptor.__init__, BackendDescriptor.set

    def init(self, descriptor_type):
        real_init(self, descriptor_type)
        attrs[id(self)] = {}
        made.append((self._type, attrs[id(self)]))

    def set_(self, attribute, attr_type, values):
        real_set(self, attribute, attr_type, values)
        attrs[id(self)][attribute.name] = (attr_type, values)

    def finalize(self):
        self._finalized = True
        return self

    monkeypatch.setattr(BackendDescriptor, "__init__", init)
    monkeypatch.setattr(BackendDescriptor, "set", set_)
    monkeypatch.setattr(BackendDescriptor, "finalize", finalize)
    monkeypatch.setattr(
        BackendDescriptor, "operation_graph", classmethod(lambda cls, ops, handle=None: list(ops))
    )
    return made


def _ops(made, dtype):
    return [attrs for t, attrs in made if t == dtype]


@pytest.mark.parametrize("prologue", [False, True])
def test_conv_genstats_descriptors(recorded, prologue):
    g, *_ = conv_genstats(prologue)
    key = g.key(device=0)
    ops = key.build_graph(None)
    assert len(ops) == len(key.nodes) == (5 if prologue else 2)
    (gs,) = _ops(recorded, D.OPERATION_GEN_STATS_DESCRIPTOR)
    assert gs["OPERATION_GENSTATS_MODE"] == (T.GENSTATS_MODE, GenStatsMode.SQSUM)
    assert gs["OPERATION_GENSTATS_MATH_PREC"] == (T.DATA_TYPE, DataType.FLOAT)
    for role in ("XDESC", "SUMDESC", "SQSUMDESC"):
        atype, value = gs[f"OPERATION_GENSTATS_{role}"]
        assert atype == T.BACKEND_DESCRIPTOR and value._type == D.TENSOR_DESCRIPTOR
    # the conv output feeds genstats: one tensor descriptor, real (y is an output)
    conv = _ops(recorded, D.OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR)[0]
    assert conv["OPERATION_CONVOLUTION_FORWARD_Y"][1] is gs["OPERATION_GENSTATS_XDESC"][1]


def test_bn_finalize_descriptor(recorded):
    g, *_ = finalize_graph()
    g.key(device=0).build_graph(None)
    (fin,) = _ops(recorded, D.OPERATION_BN_FINALIZE_STATISTICS_DESCRIPTOR)
    assert fin["OPERATION_BN_FINALIZE_STATS_MODE"] == (
        T.BN_FINALIZE_STATS_MODE,
        BnFinalizeStatsMode.TRAINING,
    )
    assert fin["OPERATION_BN_FINALIZE_MATH_PREC"] == (T.DATA_TYPE, DataType.FLOAT)
    tensors = {k for k, (atype, _v) in fin.items() if atype == T.BACKEND_DESCRIPTOR}
    assert len(tensors) == 15  # 9 inputs, 6 outputs: every tensor attribute of the operation


def test_dgrad_drelu_dbn_weight_descriptors(recorded):
    g, *_ = dgrad_drelu_dbn()
    g.key(device=0).build_graph(None)
    (dbn,) = _ops(recorded, D.OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR)
    assert dbn["OPERATION_BN_BWD_WEIGHTS_MATH_PREC"] == (T.DATA_TYPE, DataType.FLOAT)
    assert sum(atype == T.BACKEND_DESCRIPTOR for atype, _v in dbn.values()) == 10
    kinds = collections.Counter(t.name for t, _a in recorded)
    assert kinds["OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR"] == 1
    assert kinds["OPERATION_POINTWISE_DESCRIPTOR"] == 5


def test_a_refused_operation_names_the_node_and_its_kind(monkeypatch):
    def finalize(self):
        if self._type == D.OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR:
            raise errors.BadParamError(2000, "cudnnBackendFinalize", "fake refusal")
        self._finalized = True
        return self

    monkeypatch.setattr(BackendDescriptor, "finalize", finalize)
    g, *_ = dgrad_drelu_dbn()
    with pytest.raises(errors.BadParamError, match=r"node 'dbn' \(dbn_weight\): cuDNN refused"):
        g.key(device=0).build_graph(None)


# ==================================================================================================
# JSON and the frozen key
# ==================================================================================================
def test_to_json_records_the_new_nodes():
    g, *_ = finalize_graph()
    doc = json.loads(g.to_json())
    (node,) = doc["nodes"]
    assert node["kind"] == "bn_finalize" and node["name"] == "fin"
    assert node["settings"] == {"mode": 0, "compute_data_type": int(DataType.FLOAT)}
    uid = {t["name"]: t["uid"] for t in doc["tensors"]}
    assert ["OPERATION_BN_FINALIZE_ACCUM_COUNT_DESC", uid["count"]] in node["tensors"]
    count = next(t for t in doc["tensors"] if t["name"] == "count")
    assert count["is_by_value"] and count["data_type"] == int(DataType.INT64)
    assert json.loads(g.to_json()) == doc


def test_keys_equal_by_structure_and_differ_by_math_precision():
    a, b = conv_genstats()[0], conv_genstats()[0]
    assert a.key(device=0) == b.key(device=0)
    g = Graph(io_data_type="float16")
    x = g.tensor((N, C, H, W), nhwc(N, C, H, W), name="x")
    w = g.tensor((K, C, 3, 3), nhwc(K, C, 3, 3), name="w")
    y = g.conv_fprop(x, w, padding=1, name="conv").set_output(True)
    total, sq = g.genstats(y, compute_data_type="float16", name="stats")
    total.set_output(True)
    sq.set_output(True)
    assert g.key(device=0) != a.key(device=0)


def test_the_graph_has_the_methods_with_docstrings():
    for name in ("genstats", "bn_finalize", "dbn_weight"):
        method = getattr(Graph, name)
        assert method.__doc__ and "Returns" in method.__doc__
