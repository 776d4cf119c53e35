"""CPU tests of the fused batch norm + ReLU (+ residual) front end (no GPU, no cuDNN compute call):
the validation catalogue (nothing reaches C), and the call entries with a fake handle and a
recording C function (bnOps, pointer roles, the reserve space, one validation per call)."""

from __future__ import annotations

import pytest
import test_pool
from test_pool import BF16, F16, F32, Fake, _d

from pycudnn.enums import ActivationMode, BatchNormMode, BatchNormOps
from pycudnn.highlevel import batchnorm_act
from pycudnn.highlevel._bn_calls import ActSizes
from pycudnn.highlevel.batchnorm_act import (
    batch_normalization_act_reserve_size,
    dnn_batch_normalization_act_grad,
    dnn_batch_normalization_act_train,
)

C = 8
SHAPE = (2, C, 5, 6)
no_c, rec = test_pool.no_c, test_pool.rec  # the fixtures: fake handle, allocator, C functions


def xl(dt=BF16, **kw):
    """Channels-last data."""
    return Fake(SHAPE, dt, nhwc=True, **kw)


def sp(**kw):
    return Fake((C,), F32, **kw)


def _train(**over):
    kw = dict(inputs=xl(), gamma=sp(), beta=sp())
    kw.update(over)
    return kw


BAD_TRAIN = [
    (_train(inputs=Fake(SHAPE, F32, nhwc=True)), TypeError, "float16 or bfloat16 data"),
    (_train(inputs=Fake(SHAPE, BF16)), ValueError, "packed channels-last"),
    (_train(inputs=Fake((2, C, 3, 4, 5), BF16, nhwc=True)), ValueError, "4-D packed"),
    (_train(z=Fake(SHAPE, BF16)), ValueError, "z has shape"),
    (_train(z=xl(F16)), TypeError, "z"),
    (_train(activation="gelu"), ValueError, "activation='gelu'"),
    (_train(activation=None), ValueError, "fuses 'relu'"),
    (_train(gamma=Fake((C,), BF16)), TypeError, "gamma is bfloat16"),
    (_train(running_mean=sp()), ValueError, "go together"),
    (_train(running_mean=sp(strides=(2,)), running_var=sp()), ValueError, "in place"),
    (_train(running_average_factor=2.0), ValueError, "running_average_factor"),
    (_train(epsilon=-1.0), ValueError, "epsilon"),
    (_train(inputs=Fake((0, C, 5, 6), BF16, nhwc=True)), ValueError, "empty"),
    (_train(out=Fake(SHAPE, BF16)), ValueError, "out has shape"),
]


@pytest.mark.parametrize(("kwargs", "exc", "fragment"), BAD_TRAIN)
def test_train_rejects_before_any_c_call(no_c, kwargs, exc, fragment):
    with pytest.raises(exc, match=fragment):
        dnn_batch_normalization_act_train(**kwargs)


def _grad(**over):
    kw = dict(
        inputs=xl(), y=xl(), dy=xl(), scale=sp(), bias=sp(), x_mean=sp(), x_invstd=sp(),
        reserve=Fake((0,), batchnorm_act.DataType.UINT8),
    )  # fmt: skip
    kw.update(over)
    return kw


BAD_GRAD = [
    (_grad(y=Fake(SHAPE, BF16)), ValueError, "y has shape"),
    (_grad(dy=xl(F16)), TypeError, "dy"),
    (_grad(residual=1), TypeError, "residual must be a bool"),
    (_grad(out_dz=xl()), ValueError, "residual=False"),
    (_grad(activation="tanh"), ValueError, "activation='tanh'"),
    (_grad(x_invstd=Fake((C + 1,), F32)), ValueError, "x_invstd has shape"),
]


@pytest.mark.parametrize(("kwargs", "exc", "fragment"), BAD_GRAD)
def test_grad_rejects_before_any_c_call(no_c, kwargs, exc, fragment):
    with pytest.raises(exc, match=fragment):
        dnn_batch_normalization_act_grad(**kwargs)


@pytest.mark.parametrize(
    ("args", "exc", "fragment"),
    [
        (((2, 8, 4), "bfloat16"), ValueError, "four positive ints"),
        (((2, 8, 4, 0), "bfloat16"), ValueError, "four positive ints"),
        (((2, 8, 4, 4.0), "bfloat16"), ValueError, "four positive ints"),
        ((SHAPE, "float32"), TypeError, "float16 or bfloat16"),
        ((SHAPE, None), TypeError, "not a dtype"),
        ((SHAPE, "bfloat16", "yes"), TypeError, "residual must be a bool"),
        ((SHAPE, "bfloat16", False, -1), TypeError, "device must be"),
    ],
)
def test_reserve_size_refuses_before_any_c_call(no_c, args, exc, fragment):
    with pytest.raises(exc, match=fragment):
        batch_normalization_act_reserve_size(*args)


def test_reserve_size_asks_cudnn_once_per_shape(rec, monkeypatch):
    asked = []
    monkeypatch.setattr(
        batchnorm_act, "act_sizes", lambda h, xd, pd, ad, res: asked.append(xd) or ActSizes(8, 0, 0)
    )
    batchnorm_act._RESERVES.clear()
    for dt in ("bfloat16", BF16, "bfloat16"):
        assert batch_normalization_act_reserve_size(SHAPE, dt, True, 0) == 8
    assert len(asked) == 1 and asked[0].strides == (C * 30, 1, C * 6, C)
    batchnorm_act._RESERVES.clear()


@pytest.fixture
def sizes(monkeypatch):
    """cuDNN's byte counts as a GPU would answer: a reserve for the residual form only."""
    got = {True: ActSizes(96, 0, 0), False: ActSizes(0, 0, 0)}
    monkeypatch.setattr(batchnorm_act, "act_sizes", lambda h, xd, pd, ad, res: got[res])
    return got


@pytest.mark.parametrize("residual", [False, True])
def test_train_pointer_roles(rec, sizes, residual):
    x, g, b, rm, rv = xl(), sp(), sp(), sp(), sp()
    z = xl() if residual else None
    y, mean, invstd, reserve = dnn_batch_normalization_act_train(
        x, g, b, z, "relu", 1e-5, 0.25, rm, rv
    )
    assert y.shape == SHAPE and y.strides == x.strides and y.dt == BF16
    assert mean.shape == invstd.shape == (C,) and mean.dt == F32
    assert reserve.shape == (sizes[residual].reserve,)
    assert rec.names() == ["cudnnBatchNormalizationForwardTrainingEx"]
    a = rec.log[0][1]
    ops = BatchNormOps.BN_ADD_ACTIVATION if residual else BatchNormOps.BN_ACTIVATION
    assert a[1] == int(BatchNormMode.SPATIAL_PERSISTENT) and a[2] == int(ops)
    assert a[6] == x.ptr and a[10] == y.ptr and (a[12], a[13]) == (g.ptr, b.ptr)
    assert a[8] == (z.ptr if residual else None) and (a[7] is None) == (not residual)
    assert a[14] == 0.25 and (a[15], a[16]) == (rm.ptr, rv.ptr) and a[17] == 1e-5
    assert (a[18], a[19]) == (mean.ptr, invstd.ptr)
    assert _d(a[5]).shape == SHAPE and _d(a[11]).shape == (1, C, 1, 1)
    assert _d(a[20]).mode == ActivationMode.RELU
    assert a[24] == sizes[residual].reserve
    assert a[23] == (reserve.ptr if residual else None)  # no reserve: NULL


@pytest.mark.parametrize("residual", [False, True])
def test_grad_pointer_roles(rec, sizes, residual):
    x, y, dy, g, b, m, i = xl(), xl(), xl(), sp(), sp(), sp(), sp()
    reserve = Fake((sizes[residual].reserve,), batchnorm_act.DataType.UINT8)
    res = dnn_batch_normalization_act_grad(
        x, y, dy, g, b, m, i, reserve, "relu", 1e-4, residual=residual
    )
    assert len(res) == (4 if residual else 3)
    dx, dg, db = res[:3]
    assert dx.shape == SHAPE and dx.strides == x.strides and dg.shape == (C,)
    a = rec.log[0][1]
    assert rec.names() == ["cudnnBatchNormalizationBackwardEx"]
    assert (a[8], a[10], a[12], a[16]) == (x.ptr, y.ptr, dy.ptr, dx.ptr)
    assert a[14] == (res[3].ptr if residual else None)
    assert (a[18], a[19], a[20], a[21]) == (g.ptr, b.ptr, dg.ptr, db.ptr)
    assert a[22] == 1e-4 and (a[23], a[24]) == (m.ptr, i.ptr)
    assert a[29] == sizes[residual].reserve


def test_grad_refuses_a_reserve_of_the_wrong_size(rec, sizes):
    g = _grad(residual=True)
    with pytest.raises(
        ValueError, match=r"reserve must be a contiguous uint8 array of shape \(96,\)"
    ):
        dnn_batch_normalization_act_grad(**g)
    assert rec.log == []


def test_one_validation_per_call(rec, sizes, monkeypatch):
    builds = []
    real = batchnorm_act._build_train
    monkeypatch.setattr(batchnorm_act, "_build_train", lambda *a: builds.append(1) or real(*a))
    x, g, b = xl(), sp(), sp()
    dnn_batch_normalization_act_train(x, g, b)
    dnn_batch_normalization_act_train(x, g, b)
    assert len(builds) == 1 and rec.names() == ["cudnnBatchNormalizationForwardTrainingEx"] * 2


@pytest.mark.parametrize("residual", [False, True])
def test_running_averages_may_not_alias_another_operand(rec, sizes, residual):
    x, g, b, rm = xl(), sp(), sp(), sp()
    z = xl() if residual else None
    with pytest.raises(ValueError, match="running_mean overlaps running_var"):
        dnn_batch_normalization_act_train(x, g, b, z, running_mean=rm, running_var=rm)
    with pytest.raises(ValueError, match="running_var overlaps gamma"):
        dnn_batch_normalization_act_train(x, g, b, z, running_mean=sp(), running_var=g)
    assert rec.log == []
