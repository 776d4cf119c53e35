"""CPU tests of the batch-normalization front end (no GPU, no cuDNN compute call).

* the validation catalogue of the three functions: every bad input raises before any handle,
  allocation or cuDNN call;
* the call entries with a fake handle and a recording C function: pointer roles, NULL running
  averages, the copies made when running averages are not updated in place, shapes and layouts of
  the new outputs, staging, one validation per distinct call.
"""

from __future__ import annotations

import ctypes

import pytest
import test_pool
from test_pool import BF16, F16, F32, F64, Fake, _d, _value

from pycudnn import _layout
from pycudnn.enums import BatchNormMode, DataType
from pycudnn.highlevel import batchnorm
from pycudnn.highlevel.batchnorm import (
    BN_MIN_EPSILON,
    dnn_batch_normalization_grad,
    dnn_batch_normalization_test,
    dnn_batch_normalization_train,
)

C = 3
no_c, rec = test_pool.no_c, test_pool.rec  # the fixtures: fake handle, allocator, C functions


def x4(n=4, c=C, h=5, w=6, **kw):
    return Fake((n, c, h, w), **kw)


def sp(dt=F32, shape=(1, C, 1, 1), **kw):
    """A spatial-mode parameter."""
    return Fake(shape, dt, **kw)


def pa(dt=F32, shape=(1, C, 5, 6), **kw):
    """A per-activation parameter."""
    return Fake(shape, dt, **kw)


def test_min_epsilon_is_the_headers():
    from pycudnn import lib

    assert lib.CUDNN_BN_MIN_EPSILON == BN_MIN_EPSILON


# ==================================================================================================
# Validation catalogue
# ==================================================================================================
def _train(**over):
    kw = dict(inputs=x4(), gamma=sp(), beta=sp(), mode="spatial")
    kw.update(over)
    return kw


BAD_TRAIN = [
    (_train(inputs=Fake((4,))), ValueError, "4-D (N, C, H, W)"),
    (_train(inputs=Fake((2, 3, 2, 2, 2, 2))), ValueError, "5-D"),
    (_train(mode="batch"), ValueError, "mode='batch' is not one of"),
    (_train(mode=None), TypeError, "mode must be a string"),
    (_train(epsilon=-1e-5), ValueError, "below cuDNN's minimum CUDNN_BN_MIN_EPSILON = 0.0"),
    (_train(epsilon=float("inf")), ValueError, "epsilon must be finite"),
    (_train(epsilon=float("nan")), ValueError, "epsilon must be finite"),
    (_train(epsilon="1e-5"), TypeError, "epsilon must be a real number"),
    (_train(inputs=x4(dt=F16), gamma=sp(F16), beta=sp(F16)), TypeError, "gamma is float16"),
    (_train(inputs=x4(dt=BF16), gamma=sp(BF16)), TypeError, "float32 scale, bias"),
    (_train(inputs=x4(dt=F64)), TypeError, "float64 scale, bias and statistics"),
    (_train(gamma=sp(F64)), TypeError, "gamma is float64 but inputs are float32"),
    (_train(beta=sp(F16)), TypeError, "beta is float16"),
    (_train(inputs=x4(dt=DataType.INT32)), TypeError, "unsupported dtype"),
    (_train(gamma=sp(shape=(1, C, 5, 6))), ValueError, "expected (1, 3, 1, 1) or (3,)"),
    (_train(mode="per-activation"), ValueError, "expected (1, 3, 5, 6) or (3, 5, 6)"),
    (_train(beta=sp(shape=(C, 1))), ValueError, "beta has shape (3, 1)"),
    (_train(gamma=sp(device=1)), ValueError, "device"),
    (_train(running_mean=sp()), ValueError, "both or neither"),
    (_train(running_var=sp()), ValueError, "only running_var"),
    (
        _train(running_mean=sp(), running_var=sp(shape=(C,)), inplace_running=True),
        ValueError,
        "running_mean has shape (1, 3, 1, 1) but running_var (3,)",
    ),
    (_train(running_average_factor=1.5), ValueError, "running_average_factor=1.5 is out of range"),
    (_train(running_average_factor=-0.1), ValueError, "out of range"),
    (_train(inplace_running=2), ValueError, "inplace_running=2 is not a boolean"),
    (
        _train(running_mean=sp(), running_var=sp(strides=(6, 2, 1, 1)), inplace_running=True),
        ValueError,
        "needs a contiguous array",
    ),
    (
        _train(inputs=x4(n=1, h=1, w=1), running_mean=sp(), running_var=sp()),
        ValueError,
        "undefined for m = 1",
    ),
    (
        _train(
            inputs=x4(n=1),
            mode="per-activation",
            gamma=pa(),
            beta=pa(),
            running_mean=pa(),
            running_var=pa(),
        ),
        ValueError,
        "m = 1",
    ),
    (_train(inputs=x4(n=0)), ValueError, "empty"),
    (_train(out=x4(h=4)), ValueError, "out has shape"),
    (_train(out=x4(dt=F64)), TypeError, "same dtype"),
    (_train(inputs=x4(strides=(90, 0, 6, 1))), ValueError, "zero (broadcast) stride"),
    (_train(gamma=sp(strides=(3, -1, 1, 1))), ValueError, "negative stride"),
    (_train(inputs=x4(n=2**31)), OverflowError, "32-bit"),
]


@pytest.mark.parametrize(("kwargs", "exc", "fragment"), BAD_TRAIN)
def test_train_rejects_before_any_c_call(no_c, kwargs, exc, fragment):
    with pytest.raises(exc) as info:
        dnn_batch_normalization_train(**kwargs)
    assert fragment in str(info.value)
    assert "dnn_batch_normalization_train" in str(info.value)


def _test(**over):
    kw = dict(inputs=x4(), gamma=sp(), beta=sp(), mean=sp(), var=sp(), mode="spatial")
    kw.update(over)
    return kw


BAD_TEST = [
    (_test(var=sp(shape=(C, 1, 1))), ValueError, "var has shape"),
    (_test(mean=sp(F64)), TypeError, "mean is float64"),
    (_test(epsilon=-1.0), ValueError, "CUDNN_BN_MIN_EPSILON"),
    (_test(mode="per-activation"), ValueError, "gamma has shape (1, 3, 1, 1)"),
    (_test(out=x4(h=4)), ValueError, "out has shape"),
]


@pytest.mark.parametrize(("kwargs", "exc", "fragment"), BAD_TEST)
def test_test_rejects_before_any_c_call(no_c, kwargs, exc, fragment):
    with pytest.raises(exc) as info:
        dnn_batch_normalization_test(**kwargs)
    assert fragment in str(info.value)


def _grad(**over):
    kw = dict(inputs=x4(), dy=x4(), scale=sp(), x_mean=sp(), x_invstd=sp(), mode="spatial")
    kw.update(over)
    return kw


BAD_GRAD = [
    (_grad(dy=x4(h=4)), ValueError, "dy has shape (4, 3, 4, 6) but inputs (4, 3, 5, 6)"),
    (_grad(dy=x4(dt=F64)), TypeError, "same dtype"),
    (_grad(x_invstd=sp(F16)), TypeError, "x_invstd is float16"),
    (_grad(x_mean=pa()), ValueError, "x_mean has shape"),
    (_grad(inputs=x4(n=0), dy=x4(n=0)), ValueError, "empty"),
    (_grad(epsilon=-0.5), ValueError, "CUDNN_BN_MIN_EPSILON"),
    (_grad(out=x4(dt=F16)), TypeError, "same dtype"),
]


@pytest.mark.parametrize(("kwargs", "exc", "fragment"), BAD_GRAD)
def test_grad_rejects_before_any_c_call(no_c, kwargs, exc, fragment):
    with pytest.raises(exc) as info:
        dnn_batch_normalization_grad(**kwargs)
    assert fragment in str(info.value)


# ==================================================================================================
# Call entries
# ==================================================================================================
def _double(p):
    return ctypes.cast(p, ctypes.POINTER(ctypes.c_double)).contents.value


def test_train_without_running_averages(rec, monkeypatch):
    builds = []
    real = batchnorm._build_train
    monkeypatch.setattr(batchnorm, "_build_train", lambda *a: builds.append(1) or real(*a))
    x, g, b = x4(), sp(shape=(C,)), sp(shape=(C,))
    res = dnn_batch_normalization_train(x, g, b, "spatial", 1e-3, 0.25)
    res2 = dnn_batch_normalization_train(x, g, b, "spatial", 1e-3, 0.25)
    assert len(builds) == 1 and len(res) == len(res2) == 3
    out, mean, invstd = res
    assert out.shape == x.shape and out.strides == x.strides and out.dt == F32
    assert mean.shape == invstd.shape == (C,) and mean.dt == F32
    assert rec.names() == ["cudnnBatchNormalizationForwardTraining"] * 2
    a = rec.log[0][1]
    assert a[1] == int(BatchNormMode.SPATIAL) and _value(a[2]) == 1.0 and _value(a[3]) == 0.0
    assert (a[5], a[7], a[9], a[10]) == (x.ptr, out.ptr, g.ptr, b.ptr)
    assert _d(a[4]).shape == _d(a[6]).shape == (4, C, 5, 6) and _d(a[8]).shape == (1, C, 1, 1)
    assert _d(a[8]).dtype == F32
    assert a[11] == 0.25 and a[12] is None and a[13] is None and a[14] == 1e-3  # NULL running
    assert (a[15], a[16]) == (mean.ptr, invstd.ptr)


def test_train_copies_the_running_averages_unless_in_place(rec):
    x, g, b = x4(), sp(), sp()
    rm, rv = sp(shape=(C,)), sp(shape=(C,), strides=(2,))  # rv: a strided view
    _, mean, invstd, nrm, nrv = dnn_batch_normalization_train(x, g, b, "spatial", 1e-4, 0.1, rm, rv)
    assert rec.names() == ["cudnnTransformTensor"] * 2 + ["cudnnBatchNormalizationForwardTraining"]
    (_, cm), (_, cv), (_, fwd) = rec.log
    assert cm[3] == rm.ptr and cm[6] == nrm.ptr and cv[3] == rv.ptr and cv[6] == nrv.ptr
    assert _d(cv[2]).strides == (1, 2, 1, 1) and _d(cv[5]).strides == (C, 1, 1, 1)
    assert (fwd[12], fwd[13]) == (nrm.ptr, nrv.ptr)  # cuDNN updates the copies
    assert nrm.shape == nrv.shape == (C,) and mean.shape == (1, C, 1, 1)
    assert nrm is not rm and nrv is not rv
    assert len({mean.ptr, invstd.ptr, nrm.ptr, nrv.ptr}) == 4

    rec.log.clear()
    rv = sp(shape=(C,))
    res = dnn_batch_normalization_train(x, g, b, "spatial", 1e-4, 0.1, rm, rv, inplace_running=True)
    assert res[3] is rm and res[4] is rv
    assert rec.names() == ["cudnnBatchNormalizationForwardTraining"]
    assert (rec.log[0][1][12], rec.log[0][1][13]) == (rm.ptr, rv.ptr)


def test_running_averages_in_place_may_not_alias(rec):
    x, g, b, rm = x4(), sp(), sp(), sp()
    with pytest.raises(ValueError, match="running_mean overlaps running_var"):
        dnn_batch_normalization_train(x, g, b, "spatial", 1e-4, 0.1, rm, rm, inplace_running=True)
    with pytest.raises(ValueError, match="running_mean overlaps gamma"):
        dnn_batch_normalization_train(x, g, b, "spatial", 1e-4, 0.1, g, sp(), inplace_running=True)
    with pytest.raises(ValueError, match="out overlaps an input"):
        dnn_batch_normalization_train(x, g, b, "spatial", out=x)
    assert rec.log == []


@pytest.mark.parametrize("dt", [F16, BF16, F32])
def test_half_data_takes_float_parameters(rec, dt):
    x = x4(dt=dt, nhwc=True)
    out, mean, _ = dnn_batch_normalization_train(x, pa(), pa(), "per-activation")
    assert out.dt == dt and out.strides == x.strides  # channels-last in, channels-last out
    assert mean.dt == F32 and mean.shape == (1, C, 5, 6)
    names = [name for name, _a in rec.log]
    if dt == F32:  # computed channels-last as given
        assert names == ["cudnnBatchNormalizationForwardTraining"]
        a = rec.log[0][1]
        assert _d(a[4]).strides == _layout.packed_strides((4, C, 5, 6), True)
    else:  # cuDNN's channels-last half/bfloat16 batch norm is slow: NCHW between copies
        assert names == [
            "cudnnTransformTensor",
            "cudnnBatchNormalizationForwardTraining",
            "cudnnTransformTensor",
        ]
        a = rec.log[1][1]
        assert _d(a[4]).strides == _layout.packed_strides((4, C, 5, 6), False)
        assert rec.log[2][1][6] == out.ptr  # the NCHW result copied into the channels-last out
    assert a[1] == int(BatchNormMode.PER_ACTIVATION) and _d(a[8]).shape == (1, C, 5, 6)


def test_double_data_takes_double_parameters_and_scales(rec):
    x = x4(dt=F64)
    _, mean, _ = dnn_batch_normalization_train(x, sp(F64), sp(F64), "spatial")
    a = rec.log[0][1]
    assert _double(a[2]) == 1.0 and _double(a[3]) == 0.0
    assert mean.dt == F64 and _d(a[8]).dtype == F64


@pytest.mark.parametrize(
    ("shape", "mode", "pshape", "cudnn"),
    [
        ((8, C), "spatial", (C,), (8, C, 1, 1)),
        ((8, C), "per-activation", (1, C), (8, C, 1, 1)),
        ((8, C, 7), "spatial", (1, C, 1), (8, C, 7, 1)),
        ((8, C, 7), "per-activation", (C, 7), (8, C, 7, 1)),
        ((2, C, 3, 4, 5), "spatial", (1, C, 1, 1, 1), (2, C, 3, 4, 5)),
        ((2, C, 3, 4, 5), "per_activation", (C, 3, 4, 5), (2, C, 3, 4, 5)),
    ],
)
def test_ranks_2_to_5(rec, shape, mode, pshape, cudnn):
    x = Fake(shape)
    out, mean, _ = dnn_batch_normalization_train(x, Fake(pshape), Fake(pshape), mode)
    assert out.shape == shape and mean.shape == pshape
    a = rec.log[0][1]
    assert _d(a[4]).shape == cudnn


def test_strided_parameters_and_inputs_are_staged(rec):
    big = Fake((4, C, 5, 9))
    x = Fake((4, C, 5, 6), strides=big.strides, ptr=big.ptr)
    g = Fake((C,), strides=(2,))
    out, _, _ = dnn_batch_normalization_train(x, g, sp(), "spatial", out=x4(nhwc=True))
    names = rec.names()
    assert names == ["cudnnTransformTensor"] * 2 + [
        "cudnnBatchNormalizationForwardTraining",
        "cudnnTransformTensor",
    ]
    (_, cx), (_, cg), (_, fwd), (_, co) = rec.log
    assert cx[3] == x.ptr and fwd[5] == cx[6]
    assert cg[3] == g.ptr and fwd[9] == cg[6] and _d(cg[5]).dtype == F32
    assert co[6] == out.ptr and co[3] == fwd[7]


def test_test_pointer_roles(rec):
    x, g, b, m, v = x4(), sp(), sp(), sp(shape=(C,)), sp()
    out = dnn_batch_normalization_test(x, g, b, m, v, "spatial", 1e-5)
    ((name, a),) = rec.log
    assert name == "cudnnBatchNormalizationForwardInference"
    assert (a[5], a[7], a[9], a[10], a[11], a[12], a[13]) == (
        x.ptr,
        out.ptr,
        g.ptr,
        b.ptr,
        m.ptr,
        v.ptr,
        1e-5,
    )
    with pytest.raises(ValueError, match="overlaps"):  # no in-place inference
        dnn_batch_normalization_test(x, g, b, m, v, "spatial", 1e-5, out=x)


def test_test_on_an_empty_batch_makes_no_c_call(rec):
    out = dnn_batch_normalization_test(x4(n=0), sp(), sp(), sp(), sp(), "spatial")
    assert out.shape == (0, C, 5, 6) and rec.log == []


def test_grad_pointer_roles(rec):
    x, dy, s, m, i = x4(), x4(), sp(shape=(C,)), sp(shape=(C,)), sp(shape=(C,))
    dx, ds, db = dnn_batch_normalization_grad(x, dy, s, m, i, "spatial", 1e-4)
    ((name, a),) = rec.log
    assert name == "cudnnBatchNormalizationBackward"
    assert [_value(a[k]) for k in (2, 3, 4, 5)] == [1.0, 0.0, 1.0, 0.0]
    assert (a[7], a[9], a[11], a[13], a[14], a[15], a[17], a[18]) == (
        x.ptr,
        dy.ptr,
        dx.ptr,
        s.ptr,
        ds.ptr,
        db.ptr,
        m.ptr,
        i.ptr,
    )
    assert a[16] == 1e-4 and ds.shape == db.shape == (C,) and dx.shape == x.shape
