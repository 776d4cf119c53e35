"""CPU tests of the activation, softmax and tensor-arithmetic functions (no GPU, no compute call).

* the validation catalogue: every bad input raises before any handle, allocation or C call;
* the C calls these functions make, recorded through a fake ``_call.quiet``: which function, with
  which descriptors and pointers in which order, alpha/beta, in-place rules;
* the call cache: a repeated call validates once; new pointers with the same layout reuse it.
"""

from __future__ import annotations

import ctypes

import _fake_device as fd
import numpy as np
import pytest
from _fake_device import DummyHandle, Fake

import pycudnn
from pycudnn import _layout
from pycudnn.enums import ActivationMode, DataType, SoftmaxAlgorithm, SoftmaxMode
from pycudnn.highlevel import _call, _operand

F32, F64, F16 = DataType.FLOAT, DataType.DOUBLE, DataType.HALF
no_c = fd.no_c  # the fixture: every way into CUDA/cuDNN raises before validation could pass


@pytest.fixture
def record(monkeypatch):
    """Fake handle and allocator; compute functions recorded as (name, args)."""
    calls = []
    built = []
    real_quiet = _call.quiet

    def quiet(name):
        if name.startswith(("cudnnCreate", "cudnnSet", "cudnnGet", "cudnnDestroy")):
            return real_quiet(name)  # descriptors are real (they need no GPU)

        def fn(*args):
            calls.append((name, args))

        return fn

    def empty(shape, dtype, device=None, stream=None, *, strides=None):
        isz = np.dtype(dtype).itemsize
        f = Fake(shape, _operand.data_type(dtype), tuple(s // isz for s in strides))
        built.append(f)
        return f

    monkeypatch.setattr(_call, "quiet", quiet)
    monkeypatch.setattr(_call._handle, "get_handle", lambda device=None: DummyHandle())
    monkeypatch.setattr(pycudnn.memory, "empty", empty)
    pycudnn.clear_caches()
    yield calls, built
    pycudnn.clear_caches()


def _scalar(byref_arg, dt=F32):
    ct = ctypes.c_double if dt == F64 else ctypes.c_float
    return ctypes.cast(byref_arg, ctypes.POINTER(ct)).contents.value


def _desc_of(d):
    return d.shape, d.strides, d.dtype


# ==================================================================================================
# Validation catalogue
# ==================================================================================================
X = Fake((2, 3, 4, 5))
CASES = [
    (pycudnn.dnn_activation, (X,), dict(mode="gelu"), ValueError, "mode='gelu'"),
    (pycudnn.dnn_activation, (X,), dict(mode=3), TypeError, "mode must be a string"),
    (pycudnn.dnn_activation, (X, "clipped_relu", 0.0), {}, ValueError, "ceiling"),
    (pycudnn.dnn_activation, (X, "elu", float("nan")), {}, ValueError, "coef must be finite"),
    (pycudnn.dnn_activation, (X,), dict(alpha="1"), TypeError, "alpha must be a real"),
    (pycudnn.dnn_activation, (Fake((2, 3), DataType.INT32),), {}, TypeError, "unsupported dtype"),
    (pycudnn.dnn_activation, (X,), dict(out=Fake((2, 3, 4, 6))), ValueError, "out has shape"),
    (pycudnn.dnn_activation, (X,), dict(out=Fake((2, 3, 4, 5), F64)), TypeError, "float64"),
    (pycudnn.dnn_activation, (X,), dict(out=Fake((2, 3, 4, 5), device=1)), ValueError, "device"),
    (pycudnn.dnn_activation, (Fake((2, 3), strides=(-3, 1)),), {}, ValueError, "negative stride"),
    (pycudnn.dnn_activation, (Fake((2, 3), strides=(0, 1)),), {}, ValueError, "zero (broadcast)"),
    (pycudnn.dnn_activation, (Fake((2,) * 9),), {}, ValueError, "at most 8"),
    (pycudnn.dnn_activation, (Fake((4,), ptr=(1 << 32) + 2),), {}, ValueError, "element size"),
    (pycudnn.dnn_activation, (np.zeros(3),), {}, TypeError, "to_device"),
    (pycudnn.dnn_activation, ([1.0],), {}, TypeError, "expected a device array"),
    (pycudnn.dnn_activation_grad, (X, Fake((2, 3, 4, 6)), X), {}, ValueError, "dy has shape"),
    (pycudnn.dnn_softmax, (X,), dict(algo="exact"), ValueError, "algo='exact'"),
    (pycudnn.dnn_softmax, (X,), dict(mode="spatial"), ValueError, "mode='spatial'"),
    (pycudnn.dnn_softmax, (Fake((5,)),), {}, ValueError, "expected 2-D to 5-D"),
    (pycudnn.dnn_softmax, (Fake((1,) * 6),), {}, ValueError, "expected 2-D to 5-D"),
    (pycudnn.dnn_softmax, (X,), dict(out=Fake((2, 3, 4, 4))), ValueError, "out has shape"),
    (pycudnn.dnn_softmax_grad, (X, Fake((2, 3, 4, 4))), {}, ValueError, "dy has shape"),
    (pycudnn.dnn_softmax_grad, (X, Fake((2, 3, 4, 5), F16)), {}, TypeError, "same dtype"),
    (pycudnn.dnn_add_tensor, (Fake((3,)), X), {}, ValueError, "does not broadcast"),
    (pycudnn.dnn_add_tensor, (Fake((1, 2, 1, 1)), X), {}, ValueError, "does not broadcast"),
    (pycudnn.dnn_add_tensor, (Fake((1,) * 6), Fake((1,) * 6)), {}, ValueError, "1 to 5"),
    (pycudnn.dnn_add_tensor, (Fake((1, 3, 1, 1)), X), dict(beta=None), TypeError, "beta"),
    (pycudnn.dnn_op_tensor, ("pow", X, X), {}, ValueError, "op='pow'"),
    (pycudnn.dnn_op_tensor, ("add", X), {}, TypeError, "is binary"),
    (pycudnn.dnn_op_tensor, ("sqrt", X, X), {}, TypeError, "takes a alone"),
    (pycudnn.dnn_op_tensor, ("mul", X, Fake((2, 3, 1, 2))), {}, ValueError, "does not broadcast"),
    (pycudnn.dnn_op_tensor, ("mul", X, X), dict(out=Fake((2, 3, 4))), ValueError, "out has"),
]


@pytest.mark.parametrize(("fn", "args", "kwargs", "exc", "fragment"), CASES)
def test_rejects_before_any_c_call(no_c, fn, args, kwargs, exc, fragment):
    with pytest.raises(exc, match=None) as info:
        fn(*args, **kwargs)
    assert fragment in str(info.value), str(info.value)
    assert fn.__name__ in str(info.value) or exc is TypeError


def test_overlapping_out_refused(record):
    x = Fake((2, 3, 4, 5))
    half = Fake((2, 3, 4, 5), ptr=x.ptr + 8)  # partly over x
    for call in (
        lambda: pycudnn.dnn_activation(x, out=half),
        lambda: pycudnn.dnn_softmax(x, out=half),
        lambda: pycudnn.dnn_softmax(x, out=x),  # softmax is never in place
        lambda: pycudnn.dnn_op_tensor("add", x, x, out=half),
    ):
        with pytest.raises(ValueError, match="overlaps an input"):
            call()
    # in place only where the layout is the same
    transposed = Fake((2, 3, 4, 5), strides=(60, 1, 15, 3), ptr=x.ptr)
    with pytest.raises(ValueError, match="overlaps"):
        pycudnn.dnn_activation(x, out=transposed)
    # activation_grad: dx may be dy, not x or y
    y, dy = Fake((2, 3, 4, 5)), Fake((2, 3, 4, 5))
    pycudnn.dnn_activation_grad(y, dy, x, out=dy)
    with pytest.raises(ValueError, match="overlaps"):
        pycudnn.dnn_activation_grad(y, dy, x, out=Fake((2, 3, 4, 5), ptr=x.ptr))


# ==================================================================================================
# The C calls
# ==================================================================================================
def test_activation_call(record):
    calls, _built = record
    x = Fake((2, 3, 4, 5), F64)
    y = Fake((2, 3, 4, 5), F64)  # beta reads out: refused without one (issue 42)
    pycudnn.dnn_activation(x, "clipped_relu", 6.0, alpha=2.0, beta=0.5, out=y)
    ((name, args),) = calls
    assert name == "cudnnActivationForward"
    h, act, alpha, xd, xp, beta, yd, yp = args
    assert h == DummyHandle.ptr and xp == x.ptr and yp == y.ptr
    assert act.mode == ActivationMode.CLIPPED_RELU and act.coef == 6.0
    assert (_scalar(alpha, F64), _scalar(beta, F64)) == (2.0, 0.5)  # double for double data
    assert _desc_of(xd) == ((2, 3, 4, 5), (60, 20, 5, 1), F64) == _desc_of(yd)
    # in place, and the cache: same layout, new pointers -> no new validation
    pycudnn.dnn_activation(x, "relu", out=x)
    assert calls[-1][1][4] == calls[-1][1][7] == x.ptr
    x2 = Fake((2, 3, 4, 5), F64)
    n_descs = len(_call.calls())
    pycudnn.dnn_activation(x2, "relu", out=x2)
    assert len(_call.calls()) == n_descs and calls[-1][1][4] == x2.ptr


def test_activation_layouts(record):
    calls, built = record
    # a 2-D input: padded to 4-D; a channels-last input: the output keeps the memory order
    pycudnn.dnn_activation(Fake((3, 7)), "tanh")
    xd = calls[-1][1][3]
    assert xd.shape == (3, 7, 1, 1)
    nhwc = Fake((2, 3, 4, 5), strides=_layout.packed_strides((2, 3, 4, 5), True))
    pycudnn.dnn_activation(nhwc, "sigmoid")
    assert built[-1].strides == nhwc.strides
    # a view with gaps: the output is packed (NCHW)
    gappy = Fake((2, 3, 4, 5), strides=(200, 50, 10, 2))
    pycudnn.dnn_activation(gappy, "sigmoid")
    assert built[-1].strides == (60, 20, 5, 1)
    assert calls[-1][1][3].strides == (200, 50, 10, 2)


def test_identity_and_swish(record):
    calls, _built = record
    x = Fake((2, 3, 4, 5))
    pycudnn.dnn_activation(x, "identity", alpha=3.0)
    name, args = calls[-1]
    assert name == "cudnnTransformTensor" and _scalar(args[1]) == 3.0 and args[3] == x.ptr
    pycudnn.dnn_activation(x, "swish", coef=1.5)
    act = calls[-1][1][1]
    assert act.mode == ActivationMode.SWISH and act.swish_beta == 1.5
    y, dy = Fake((2, 3, 4, 5)), Fake((2, 3, 4, 5))
    dx = pycudnn.dnn_activation_grad(y, dy, x, "identity")
    name, args = calls[-1]
    assert name == "cudnnTransformTensor" and args[3] == dy.ptr and args[6] == dx.ptr
    dx = pycudnn.dnn_activation_grad(y, dy, x, "elu", 0.3)
    name, args = calls[-1]
    assert name == "cudnnActivationBackward"
    assert (args[4], args[6], args[8], args[11]) == (y.ptr, dy.ptr, x.ptr, dx.ptr)


def test_softmax_calls(record):
    calls, _built = record
    x = Fake((8, 10))
    pycudnn.dnn_softmax(x)
    name, args = calls[-1]
    assert name == "cudnnSoftmaxForward"
    # (N, C): no spatial extent, so cuDNN's (same, faster) instance mode
    assert args[1:3] == (int(SoftmaxAlgorithm.ACCURATE), int(SoftmaxMode.INSTANCE))
    assert args[4].shape == (8, 10, 1, 1) and args[5] == x.ptr
    pycudnn.dnn_softmax(Fake((8, 10, 3)))
    assert calls[-1][1][1:3] == (int(SoftmaxAlgorithm.ACCURATE), int(SoftmaxMode.CHANNEL))
    pycudnn.dnn_softmax(Fake((2, 3, 4)), algo="log", mode="instance")
    assert calls[-1][1][1:3] == (int(SoftmaxAlgorithm.LOG), int(SoftmaxMode.INSTANCE))
    assert calls[-1][1][4].shape == (2, 3, 4, 1)
    # 5-D: two spatial dims merged, NCDHW and NDHWC alike
    for cl in (False, True):
        v = Fake((2, 3, 4, 5, 6), strides=_layout.packed_strides((2, 3, 4, 5, 6), cl))
        pycudnn.dnn_softmax(v)
        d = calls[-1][1][4]
        assert d.shape in ((2, 3, 20, 6), (2, 3, 4, 30))
    sm, dy = Fake((4, 5, 6, 7)), Fake((4, 5, 6, 7))
    dx = pycudnn.dnn_softmax_grad(dy, sm, algo="log")
    name, args = calls[-1]
    assert name == "cudnnSoftmaxBackward" and args[1] == int(SoftmaxAlgorithm.LOG)
    assert (args[5], args[7], args[10]) == (sm.ptr, dy.ptr, dx.ptr)


def test_softmax_unmergeable_5d_is_staged(record):
    calls, _built = record
    shape = (2, 3, 4, 5, 6)
    x = Fake(shape, strides=(720, 240, 2, 8, 40))  # dims 2,3,4 in reverse memory order
    pycudnn.dnn_softmax(x)
    names = [n for n, _a in calls[-2:]]
    assert names == ["cudnnTransformTensor", "cudnnSoftmaxForward"]
    assert calls[-2][1][3] == x.ptr  # copied first
    assert calls[-1][1][4].shape in ((2, 3, 20, 6), (2, 3, 4, 30))


def test_tensor_ops_calls(record):
    calls, built = record
    y, bias = Fake((2, 3, 4, 5)), Fake((1, 3, 1, 1))
    assert pycudnn.dnn_add_tensor(bias, y, beta=1.0) is y
    name, args = calls[-1]
    assert name == "cudnnAddTensor" and (args[3], args[6]) == (bias.ptr, y.ptr)
    assert args[2].shape == (1, 3, 1, 1)
    a, b = Fake((2, 3, 4, 5)), Fake((1, 3, 1, 1))
    c = pycudnn.dnn_op_tensor("max", a, b, alpha2=2.0)
    name, args = calls[-1]
    assert name == "cudnnOpTensor" and (args[4], args[7], args[10]) == (a.ptr, b.ptr, c.ptr)
    assert args[1].op.name == "MAX" and _scalar(args[5]) == 2.0
    pycudnn.dnn_op_tensor("sqrt", a, out=a)  # unary, in place
    name, args = calls[-1]
    assert (args[4], args[7], args[10]) == (a.ptr, a.ptr, a.ptr)
    pycudnn.dnn_op_tensor("mul", a, a, out=a)
    assert calls[-1][1][10] == a.ptr
    assert built  # new outputs came from memory.empty


def test_empty_tensors_make_no_compute_call(record):
    calls, _built = record
    out = pycudnn.dnn_activation(Fake((0, 3)))
    assert out.shape == (0, 3) and not calls
    pycudnn.dnn_softmax(Fake((0, 4)))
    assert not calls


def test_softmax_without_spatial_extent_asks_cudnn_for_instance_mode():
    # the same computation as channel mode there, and cuDNN's fast kernels (its channel-mode
    # backward of (8192, 1024, 1, 1) took 9.5 ms on an H200, instance mode 35 µs)
    from pycudnn.enums import SoftmaxMode
    from pycudnn.highlevel.softmax import _kernel_mode

    channel, instance = SoftmaxMode.CHANNEL, SoftmaxMode.INSTANCE
    for shape in ((8192, 1024), (4, 10, 1), (4, 10, 1, 1), (2, 3, 1, 1, 1)):
        assert _kernel_mode(channel, shape) is instance
    for shape in ((4, 10, 2), (2, 3, 4, 4), (2, 3, 1, 1, 2)):
        assert _kernel_mode(channel, shape) is channel
    assert _kernel_mode(instance, (2, 3, 4, 4)) is instance
