"""CPU tests of dnn_ctc_loss (no GPU): the validation catalogue, the value checks on the labels
and lengths, the C calls of every reduction (with a fake device), call caching."""

from __future__ import annotations

import ctypes

import _fake_device as fd
import numpy as np
import pytest
from _fake_device import F16, F32, F64, I32, Fake

from pycudnn.enums import CTCLossAlgo, DataType
from pycudnn.highlevel import ctc
from pycudnn.highlevel.ctc import dnn_ctc_loss

no_c, capture = fd.no_c, fd.capture  # fixtures
T, N, C = 12, 3, 6
LP = (T, N, C)
I64 = DataType.INT64


def ints(values, **kw):
    values = np.asarray(values, np.int32)
    return Fake(values.shape, I32, host=values, **kw)


def batch(lens=(3, 4, 2), ilens=(12, 10, 7), labels=None, dt=F32):
    if labels is None:
        labels = np.arange(sum(lens)) % (C - 1) + 1
    return Fake(LP, dt), ints(labels), ints(lens), ints(ilens)


BAD = [
    ((np.zeros(LP, np.float32), *batch()[1:]), {}, TypeError, "to_device"),
    ((Fake(LP, F16), *batch()[1:]), {}, TypeError, "unsupported dtype"),
    ((Fake((T, N)), *batch()[1:]), {}, ValueError, "expected (T, N, C)"),
    ((Fake((T, N, 1)), *batch()[1:]), {}, ValueError, "C >= 2"),
    ((Fake((T, 0, C)), ints([]), ints([]), ints([])), {}, ValueError, "N >= 1"),
    ((Fake(LP), Fake((9,), I64), ints([3, 4, 2]), ints([12] * 3)), {}, TypeError, "labels"),
    (
        (Fake(LP), ints([[1, 2]]), ints([3, 4, 2]), ints([12] * 3)),
        {},
        ValueError,
        "labels has shape (1, 2)",
    ),
    (
        (Fake(LP), ints([1] * 9), ints([3, 4]), ints([12] * 3)),
        {},
        ValueError,
        "label_lengths has shape (2,); expected (3,)",
    ),
    (
        (Fake(LP), ints([1] * 9), ints([3, 4, 2]), ints([12] * 4)),
        {},
        ValueError,
        "input_lengths has shape (4,)",
    ),
    (
        (Fake(LP), Fake((9,), I32, strides=(2,)), ints([3, 4, 2]), ints([12] * 3)),
        {},
        ValueError,
        "labels has stride 2",
    ),
    (
        (Fake(LP), ints([1] * 9, device=1), ints([3, 4, 2]), ints([12] * 3)),
        {},
        ValueError,
        "device 1",
    ),
    ((Fake(LP, device=1), *batch()[1:]), {}, ValueError, "log_probs is on device 1"),
    (batch(), {"algo": "fast"}, ValueError, "algo='fast' is not one of"),
    (batch(), {"reduction": "max"}, ValueError, "reduction='max' is not one of"),
    (batch(), {"compute_grad": "maybe"}, ValueError, "compute_grad='maybe' is not a boolean"),
    (batch(), {"out": Fake((N,))}, TypeError, "out must be None or a pair (loss, grad)"),
    (batch(), {"out": (Fake((N, 1)), None)}, ValueError, "out[0] (loss) has shape (3, 1)"),
    (batch(), {"out": (Fake((N,), F64), None)}, TypeError, "out[0] (loss) is float64"),
    (batch(), {"out": (Fake((N,), strides=(2,)), None)}, ValueError, "out[0] (loss) has stride 2"),
    (batch(), {"out": (None, Fake((T, N, C + 1)))}, ValueError, "out[1] (grad) has shape"),
    (batch(), {"out": (None, Fake(LP)), "compute_grad": False}, ValueError, "compute_grad=False"),
    (batch(), {"reduction": "sum", "out": (Fake((N,)), None)}, ValueError, "expected ()"),
]


@pytest.mark.parametrize(("args", "kwargs", "exc", "fragment"), BAD)
def test_rejects_before_any_c_call(no_c, args, kwargs, exc, fragment):
    with pytest.raises(exc) as info:
        dnn_ctc_loss(*args, **kwargs)
    assert fragment in str(info.value)


VALUES = [
    (dict(lens=(3, 0, 2)), "label_lengths[1]=0 is out of range; expected 1 to 255"),
    (dict(lens=(256, 1, 1), ilens=(12, 12, 12)), "label_lengths[0]=256 is out of range"),
    (dict(ilens=(12, 13, 7)), "input_lengths[1]=13 is out of range; expected 1 to T = 12"),
    (dict(ilens=(12, 0, 7)), "input_lengths[1]=0 is out of range"),
    (dict(ilens=(12, 3, 7)), "label_lengths[1]=4 exceeds input_lengths[1]=3"),
    (dict(labels=[1] * 8), "labels has 8 elements but label_lengths add up to 9"),
    (dict(labels=[1, 2, 3, 4, 5, 0, 1, 2, 3]), "labels[5]=0 is out of range; expected 1 to C - 1"),
    (dict(labels=[1, 2, 3, 4, 5, 6, 1, 2, 3]), "labels[5]=6 is out of range"),
]


@pytest.mark.parametrize(("kw", "fragment"), VALUES)
def test_value_checks(capture, kw, fragment):
    with pytest.raises(ValueError) as info:
        dnn_ctc_loss(*batch(**kw))
    assert fragment in str(info.value) and "dnn_ctc_loss" in str(info.value)
    assert "cudnnCTCLoss_v8" not in capture.names()
    capture.calls.clear()
    dnn_ctc_loss(*batch(**kw), check_values=False)  # unchecked: cuDNN gets them
    assert "cudnnCTCLoss_v8" in capture.names()


def _addr(p):
    return ctypes.cast(p, ctypes.c_void_p).value


def test_none_reduction_call(capture):
    capture.sizes["cudnnGetCTCLossWorkspaceSize_v8"] = 1000
    lp, labels, lens, ilens = batch(dt=F64)
    loss, grad = dnn_ctc_loss(lp, labels, lens, ilens, "non_deterministic")
    assert capture.names()[-2:] == ["cudnnSetTensor", "cudnnCTCLoss_v8"]
    (z,) = capture.of("cudnnSetTensor")
    assert z[2] == grad.ptr and z[3]._obj.value == 0.0  # the gradient is zeroed first
    (args,) = capture.of("cudnnCTCLoss_v8")
    assert args[1] == CTCLossAlgo.NON_DETERMINISTIC and args[4] == lp.ptr
    assert [_addr(a) for a in args[5:8]] == [labels.ptr, lens.ptr, ilens.ptr]
    assert args[8] == loss.ptr and args[10] == grad.ptr and args[11:] == (1000, 0xABC000)
    desc = args[2]
    assert desc.compute_type == DataType.DOUBLE and desc.max_label_length == 255
    assert desc.normalization.name == "SOFTMAX"
    assert loss.shape == (N,) and grad.shape == LP and loss.dt == F64


def test_sum_and_mean(capture):
    lp, labels, lens, ilens = batch()
    loss, grad = dnn_ctc_loss(lp, labels, lens, ilens, reduction="sum")
    assert loss.shape == ()
    names = capture.names()
    assert names[-3:] == ["cudnnSetTensor", "cudnnCTCLoss_v8", "cudnnReduceTensor"]
    costs = capture.of("cudnnCTCLoss_v8")[0][8]
    assert costs != loss.ptr and capture.of("cudnnReduceTensor")[0][8] == costs
    assert capture.of("cudnnCTCLoss_v8")[0][10] == grad.ptr  # packed: written directly
    capture.calls.clear()
    loss, grad = dnn_ctc_loss(lp, labels, lens, ilens, reduction="mean")
    names = [n for n in capture.names() if not n.startswith("cudnnGet")]
    assert names == [
        "cudnnSetTensor",
        "cudnnCTCLoss_v8",
        "cudnnOpTensor",  # costs * weights
        "cudnnReduceTensor",
        "cudnnOpTensor",  # grad * weights
    ]
    weights = capture.of("cudnnOpTensor")[0][7]
    assert capture.of("cudnnOpTensor")[1][7] == weights
    assert capture.of("cudnnOpTensor")[1][10] == grad.ptr


def test_mean_weights_are_torchs(capture, monkeypatch):
    seen = []
    real = fd._to_device

    def to_device(a, stream=None, **kw):
        seen.append(np.array(a))
        return real(a, stream)

    monkeypatch.setattr(fd.memory, "to_device", to_device)
    dnn_ctc_loss(*batch(lens=(3, 4, 2)), reduction="mean", check_values=False)
    np.testing.assert_allclose(seen[0], 1 / (3 * np.array([3, 4, 2])), rtol=1e-6)


def test_single_sample_sum_copies(capture):
    lp, labels, lens, ilens = Fake((T, 1, C)), ints([1, 2]), ints([2]), ints([T])
    dnn_ctc_loss(lp, labels, lens, ilens, reduction="sum")
    assert "cudnnReduceTensor" not in capture.names()
    assert capture.names()[-1] == "cudnnTransformTensor"


def test_strided_operands(capture):
    lp = Fake(LP, strides=(C, T * C, 1))  # (N, T, C) memory viewed as (T, N, C): staged
    grad_out = Fake(LP, strides=(C, T * C, 1))  # filled through a packed buffer
    _, grad = dnn_ctc_loss(lp, *batch()[1:], out=(None, grad_out))
    names = [n for n in capture.names() if not n.startswith("cudnnGet")]
    assert names == [
        "cudnnTransformTensor",  # log_probs -> packed
        "cudnnSetTensor",
        "cudnnCTCLoss_v8",
        "cudnnTransformTensor",  # packed grad -> out
    ]
    staged = capture.of("cudnnTransformTensor")[0][6]
    assert capture.of("cudnnCTCLoss_v8")[0][4] == staged
    assert capture.of("cudnnTransformTensor")[1][6] == grad_out.ptr and grad is grad_out


def test_loss_only(capture):
    _, grad = dnn_ctc_loss(*batch(), compute_grad=False)
    assert grad is None and "cudnnSetTensor" not in capture.names()
    assert capture.of("cudnnCTCLoss_v8")[0][10] is None


def test_second_call_skips_validation(capture, monkeypatch):
    builds = []
    real = ctc._build

    def spy(*args):
        builds.append(args)
        return real(*args)

    monkeypatch.setattr(ctc, "_build", spy)
    for _ in range(3):
        dnn_ctc_loss(*batch())
    dnn_ctc_loss(*batch(), algo="non_deterministic")
    assert len(builds) == 2 and len(capture.of("cudnnCTCLoss_v8")) == 4


def test_exports():
    assert ctc.__all__ == ["dnn_ctc_loss"]
