"""CPU tests of dnn_reduction (no GPU): the validation catalogue (nothing reaches C), result
shapes, the three execution paths (reduce, degenerate, empty) and their C calls, call caching."""

from __future__ import annotations

import _fake_device as fd
import numpy as np
import pytest
from _fake_device import BF16, F16, F32, F64, I32, Fake

import pycudnn
from pycudnn.enums import ReduceTensorOp
from pycudnn.highlevel import reduction
from pycudnn.highlevel.reduction import dnn_reduction, result_shape

no_c, capture = fd.no_c, fd.capture  # fixtures
X = (2, 3, 4, 5)

BAD = [
    # (args, kwargs, exception, message fragment)
    ((np.zeros(X, np.float32),), {}, TypeError, "to_device"),
    ((Fake(X, BF16),), {}, TypeError, "unsupported dtype"),
    ((Fake(X, I32),), {}, TypeError, "unsupported dtype"),
    ((Fake(()),), {}, ValueError, "0 dims"),
    ((Fake((1,) * 9),), {}, ValueError, "9 dims"),
    ((Fake(X),), {"op": "median"}, ValueError, "op='median' is not one of"),
    ((Fake(X),), {"op": 3}, TypeError, "op must be a string"),
    ((Fake(X),), {"axis": 4}, ValueError, "axis 4 is out of range"),
    ((Fake(X),), {"axis": -5}, ValueError, "axis -5 is out of range"),
    ((Fake(X),), {"axis": (1, -3)}, ValueError, "repeats axis 1"),
    ((Fake(X),), {"axis": 1.0}, TypeError, "axis must be None, an int"),
    ((Fake(X),), {"axis": True}, TypeError, "axis must be None"),
    ((Fake(X),), {"axis": (0, "1")}, TypeError, "axis must contain ints"),
    ((Fake(X),), {"keepdims": "maybe"}, ValueError, "keepdims='maybe' is not a boolean"),
    ((Fake(X),), {"return_indices": True}, ValueError, "needs op 'min', 'max' or 'amax'"),
    ((Fake(X), "norm2"), {"return_indices": 2}, ValueError, "return_indices=2 is not a boolean"),
    ((Fake(X),), {"dtype": "float64"}, TypeError, "expected one of float32, float16"),
    ((Fake(X, F64),), {"dtype": "float32"}, TypeError, "expected one of float64"),
    ((Fake(X, F16),), {"dtype": "bfloat16"}, TypeError, "float16, float32"),
    ((Fake(X),), {"alpha": float("nan")}, ValueError, "alpha must be finite"),
    ((Fake(X),), {"beta": 1.0}, ValueError, "beta=1.0 blends into out"),
    ((Fake(X),), {"axis": 1, "out": Fake((2, 1, 4, 5))}, ValueError, "out has shape (2, 1, 4, 5)"),
    ((Fake(X),), {"axis": 1, "out": Fake((2, 4, 5), F64)}, TypeError, "out is float64"),
    ((Fake(X),), {"axis": 1, "out": Fake((2, 4, 5), device=1)}, ValueError, "on device 1"),
    ((Fake(X),), {"axis": 1, "out": Fake((2, 4, 5), strides=(0, 5, 1))}, ValueError, "overlap"),
    ((Fake(X, strides=(60, 20, 5, -1)),), {}, ValueError, "negative stride"),
    ((Fake((2, 0, 3)), "max"), {"axis": 1}, ValueError, "over zero elements"),
    ((Fake((2, 0, 3)), "amax"), {}, ValueError, "has no value"),
]


@pytest.mark.parametrize(("args", "kwargs", "exc", "fragment"), BAD)
def test_rejects_before_any_c_call(no_c, args, kwargs, exc, fragment):
    with pytest.raises(exc) as info:
        dnn_reduction(*args, **kwargs)
    assert fragment in str(info.value)
    assert "dnn_reduction" in str(info.value) or fragment == "to_device"


@pytest.mark.parametrize(
    ("shape", "axis", "keepdims", "expected"),
    [
        (X, None, False, ()),
        (X, None, True, (1, 1, 1, 1)),
        (X, 1, False, (2, 4, 5)),
        (X, -1, True, (2, 3, 4, 1)),
        (X, (0, 2), False, (3, 5)),
        (X, (), False, X),
        ((7,), 0, False, ()),
    ],
)
def test_result_shape(shape, axis, keepdims, expected):
    assert result_shape(shape, axis, keepdims) == expected
    assert np.sum(np.zeros(shape), axis=axis, keepdims=keepdims).shape == expected


@pytest.mark.parametrize(
    ("axis", "keepdims", "dtype"),
    [(None, False, None), (1, True, "float32"), ((0, 3), False, None)],
)
def test_returned_shapes_and_dtypes(capture, axis, keepdims, dtype):
    x = Fake(X, F16)
    y, idx = dnn_reduction(x, "max", axis, keepdims, True, dtype)
    assert y.shape == result_shape(X, axis, keepdims) == idx.shape
    assert y.dt == (F32 if dtype else F16) and idx.dt == I32
    (args,) = capture.of("cudnnReduceTensor")
    assert args[2] == idx.ptr and args[8] == x.ptr and args[11] == y.ptr


def test_reduce_call_arguments(capture):
    capture.sizes["cudnnGetReductionWorkspaceSize"] = 512
    x, out = Fake(X, F64), Fake((2, 4), F64, strides=(10, 2))  # strided out
    y = dnn_reduction(x, "norm2", axis=(1, 3), alpha=2.0, beta=0.5, out=out)
    assert y is out
    (args,) = capture.of("cudnnReduceTensor")
    assert args[2] is None and args[3] == 0  # no indices
    assert args[4] == 0xABC000 and args[5] == 512  # workspace
    assert args[6]._obj.value == 2.0 and args[9]._obj.value == 0.5  # double scalars
    assert (args[10].shape, args[10].strides) == ((2, 1, 4, 1), (10, 1, 2, 1))  # keepdims view


def test_size_one_axes_take_the_degenerate_path(capture):
    x = Fake((2, 1, 4), F32)
    y, idx = dnn_reduction(x, "amax", axis=1, return_indices=True)
    names = capture.names()
    # x copied twice into [x, x], then reduced over the leading 2-long axis
    assert names.count("cudnnTransformTensor") == 2 and "cudnnReduceTensor" in names
    args = capture.of("cudnnReduceTensor")[0]
    assert args[7].shape == (2, 2, 4, 1) and args[10].shape == (1, 2, 4, 1)
    assert idx.filled == [0] and y.shape == (2, 4)
    capture.calls.clear()
    dnn_reduction(x, "mul_no_zeros", axis=(), keepdims=True)
    names = capture.names()
    assert names.count("cudnnTransformTensor") == 1 and names.count("cudnnSetTensor") == 1
    (setargs,) = capture.of("cudnnSetTensor")
    assert setargs[3]._obj.value == 1.0  # the identity of a product


def test_empty_cases(capture):
    y = dnn_reduction(Fake((0, 3)), "max", axis=1)
    assert y.shape == (0,) and capture.calls == []
    y = dnn_reduction(Fake((2, 0)), "add", axis=1, alpha=3.0)
    (args,) = capture.of("cudnnSetTensor")
    assert args[3]._obj.value == 0.0 and y.shape == (2,)
    capture.calls.clear()
    out = Fake((2,))
    dnn_reduction(Fake((2, 0)), "mul", axis=1, alpha=3.0, beta=2.0, out=out)
    assert capture.names() == ["cudnnSetTensor", "cudnnTransformTensor"]
    assert capture.of("cudnnSetTensor")[0][3]._obj.value == 3.0


def test_op_names_and_aliases():
    assert set(reduction._OPS.values()) == set(ReduceTensorOp)
    assert reduction._OPS["sum"] == ReduceTensorOp.ADD and reduction._OPS["mean"] is (
        ReduceTensorOp.AVG
    )


def test_second_call_skips_validation(capture, monkeypatch):
    builds = []
    real = reduction._build

    def spy(*args):
        builds.append(args)
        return real(*args)

    monkeypatch.setattr(reduction, "_build", spy)
    x = Fake(X)
    for _ in range(3):
        dnn_reduction(x, "add", axis=(2, 3))
    assert len(builds) == 1 and len(capture.of("cudnnReduceTensor")) == 3
    dnn_reduction(Fake(X), "add", axis=(2, 3))  # other pointers, same layout: cached
    assert len(builds) == 1
    dnn_reduction(x, "add", axis=[2, 3])  # unhashable: validated every time
    dnn_reduction(x, "add", axis=[2, 3])
    assert len(builds) == 3


def test_out_overlapping_x_is_refused(capture):
    x = Fake(X)
    out = Fake((2, 4), ptr=x.ptr + 8)
    with pytest.raises(ValueError, match="overlaps an input"):
        dnn_reduction(x, "add", axis=(1, 3), out=out)


def test_exported():
    assert pycudnn.highlevel.reduction.dnn_reduction is dnn_reduction
    assert reduction.__all__ == ["dnn_reduction"]
