"""CPU tests of dnn_lrn / dnn_lrn_grad (no GPU): the validation catalogue, the C calls and
their pointer roles, output layouts, empty inputs, call caching."""

from __future__ import annotations

import _fake_device as fd
import numpy as np
import pytest
from _fake_device import BF16, F16, F64, I32, Fake

from pycudnn.enums import LRNMode
from pycudnn.highlevel import lrn
from pycudnn.highlevel.lrn import dnn_lrn, dnn_lrn_grad

no_c, capture = fd.no_c, fd.capture  # fixtures
X = (2, 7, 5, 6)

BAD = [
    ((np.zeros(X, np.float32),), {}, TypeError, "to_device"),
    ((Fake(X, BF16),), {}, TypeError, "unsupported dtype"),
    ((Fake(X, I32),), {}, TypeError, "unsupported dtype"),
    ((Fake((7,)),), {}, ValueError, "expected 2 to 5 dims"),
    ((Fake((2, 3, 4, 5, 6, 7)),), {}, ValueError, "expected 2 to 5 dims"),
    ((Fake(X),), {"n": 0}, ValueError, "n=0 is out of range; expected a window of 1 to 16"),
    ((Fake(X),), {"n": 17}, ValueError, "n=17 is out of range"),
    ((Fake(X),), {"n": 2.0}, TypeError, "n must be an int"),
    ((Fake(X),), {"n": True}, TypeError, "n must be an int"),
    ((Fake(X),), {"alpha": float("inf")}, ValueError, "alpha must be finite"),
    ((Fake(X),), {"beta": 0.001}, ValueError, "beta=0.001 is out of range"),
    ((Fake(X),), {"k": 0.0}, ValueError, "k=0.0 is out of range"),
    ((Fake(X),), {"k": "2"}, TypeError, "k must be a real number"),
    ((Fake(X),), {"out": Fake((2, 7, 5))}, ValueError, "out has shape (2, 7, 5)"),
    ((Fake(X),), {"out": Fake(X, F64)}, TypeError, "out is float64"),
    ((Fake(X),), {"out": Fake(X, device=2)}, ValueError, "on device 2"),
    ((Fake(X, strides=(210, 30, 6, -1)),), {}, ValueError, "negative stride"),
]


@pytest.mark.parametrize(("args", "kwargs", "exc", "fragment"), BAD)
def test_forward_rejects_before_any_c_call(no_c, args, kwargs, exc, fragment):
    with pytest.raises(exc) as info:
        dnn_lrn(*args, **kwargs)
    assert fragment in str(info.value)


BAD_GRAD = [
    ((Fake(X), Fake(X), Fake((2, 7, 5, 5))), {}, ValueError, "y has shape (2, 7, 5, 6) but x"),
    ((Fake((2, 7, 5, 5)), Fake(X), Fake(X)), {}, ValueError, "y has shape (2, 7, 5, 5)"),
    ((Fake(X), Fake((2, 7, 5)), Fake(X)), {}, ValueError, "dy has shape (2, 7, 5)"),
    ((Fake(X), Fake(X, F64), Fake(X)), {}, TypeError, "y is float32 but dy is float64"),
    ((Fake(X), Fake(X), Fake(X, device=1)), {}, ValueError, "x on device 1"),
    ((Fake(X), Fake(X), Fake(X)), {"n": 20}, ValueError, "dnn_lrn_grad: n=20"),
    ((Fake(X), Fake(X), Fake(X)), {"out": Fake(X, F16)}, TypeError, "out is float16"),
]


@pytest.mark.parametrize(("args", "kwargs", "exc", "fragment"), BAD_GRAD)
def test_backward_rejects_before_any_c_call(no_c, args, kwargs, exc, fragment):
    with pytest.raises(exc) as info:
        dnn_lrn_grad(*args, **kwargs)
    assert fragment in str(info.value)


def test_forward_call(capture):
    x = Fake(X, F64, nhwc=True)
    y = dnn_lrn(x, 3, 1e-3, 0.5, 1.5)
    (args,) = capture.of("cudnnLRNCrossChannelForward")
    assert args[2] == LRNMode.DIM1 and args[5] == x.ptr and args[8] == y.ptr
    assert args[3]._obj.value == 1.0 and args[6]._obj.value == 0.0  # double scalars
    desc = args[1]
    assert (desc.n, desc.alpha, desc.beta, desc.k) == (3, 1e-3, 0.5, 1.5)
    assert y.strides == x.strides  # a new output in x's memory order (NHWC here)
    assert args[4].shape == X and args[4].strides == x.strides


def test_backward_call_pointer_roles(capture):
    y, dy, x, out = Fake(X), Fake(X), Fake(X), Fake(X)
    assert dnn_lrn_grad(y, dy, x, out=out) is out
    (args,) = capture.of("cudnnLRNCrossChannelBackward")
    assert (args[5], args[7], args[9], args[12]) == (y.ptr, dy.ptr, x.ptr, out.ptr)
    with pytest.raises(ValueError, match="overlaps an input"):
        dnn_lrn_grad(y, dy, x, out=dy)


def test_ranks_pad_to_four_dims(capture):
    dnn_lrn(Fake((3, 4)))
    dnn_lrn(Fake((3, 4, 5, 6, 7)))
    shapes = [a[4].shape for a in capture.of("cudnnLRNCrossChannelForward")]
    assert shapes == [(3, 4, 1, 1), (3, 4, 5, 6, 7)]


def test_empty_and_in_place(capture):
    y = dnn_lrn(Fake((0, 7, 5, 6)))
    assert y.shape == (0, 7, 5, 6) and capture.calls == []
    x = Fake(X)
    with pytest.raises(ValueError, match="overlaps an input"):
        dnn_lrn(x, out=x)


def test_second_call_skips_validation(capture, monkeypatch):
    builds = []
    real = lrn._build_forward

    def spy(*args):
        builds.append(args)
        return real(*args)

    monkeypatch.setattr(lrn, "_build_forward", spy)
    for _ in range(3):
        dnn_lrn(Fake(X), 5)
    dnn_lrn(Fake(X), 3)
    assert len(builds) == 2 and len(capture.of("cudnnLRNCrossChannelForward")) == 4


def test_exports():
    assert lrn.__all__ == ["dnn_lrn", "dnn_lrn_grad"]
