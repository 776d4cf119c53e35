"""CPU tests of the pooling front end (no GPU, no cuDNN compute call).

* the validation catalogue: every bad input raises before any handle, allocation or cuDNN call
  (a fixture makes each of those fail loudly);
* output shapes (Theano's ``ignore_border=True``, default stride 1);
* the call entries with a fake handle and a recording C function: one validation per distinct
  call, the pointers and scaling factors each C call gets, layouts of new outputs, staging.
"""

from __future__ import annotations

import ctypes
import itertools

import numpy as np
import pytest

from pycudnn import _layout, memory
from pycudnn.enums import DataType, PoolingMode
from pycudnn.highlevel import _call, _operand, pool
from pycudnn.highlevel.pool import dnn_pool, dnn_pool_grad, get_pool_output_shape

F32, F64, F16, BF16 = DataType.FLOAT, DataType.DOUBLE, DataType.HALF, DataType.BFLOAT16
_addr = itertools.count(1)


class Fake:
    """A fake device array: an address, shape, element strides, DataType and device."""

    def __init__(self, shape, dt=F32, strides=None, ptr=None, device=0, nhwc=False):
        self.shape = tuple(shape)
        self.dt = dt
        self.strides = (
            tuple(strides) if strides is not None else _layout.packed_strides(shape, nhwc)
        )
        self.ptr = (next(_addr) << 32) if ptr is None else ptr
        self.device = device


_operand.register_operand_type(Fake, lambda f: (f.ptr, f.shape, f.strides, f.dt, f.device))


class CCall(BaseException):
    """Raised by every patched entry point into the GPU/cuDNN (BaseException, so that
    ``pytest.raises(ValueError)`` cannot swallow it)."""


def _boom(*args, **kwargs):
    raise CCall("a handle, allocation or cuDNN call was attempted")


@pytest.fixture
def no_c(monkeypatch):
    monkeypatch.setattr(_call._handle, "get_handle", _boom)
    monkeypatch.setattr(_call, "quiet", _boom)
    for name in ("empty", "zeros", "asarray"):
        monkeypatch.setattr(memory, name, _boom)
    _call.calls().clear()
    yield
    _call.calls().clear()


class DummyHandle:
    ptr = 0x1234
    device = 0
    stream = 0

    def set_stream(self, s):
        self.stream = s
        return s


class Recorder:
    """Stands in for ``_call.quiet``: each C function records its calls in ``log``."""

    def __init__(self):
        self.log = []

    def __call__(self, name):
        def fn(*args):
            self.log.append((name, args))

        return fn

    def names(self):
        return [n for n, _ in self.log]


@pytest.fixture
def rec(monkeypatch):
    """A fake handle, allocator and C functions; real descriptors (they need no GPU)."""
    r = Recorder()
    handle = DummyHandle()

    def allocate(shape, dtype, device=None, stream=None, *, strides=None):
        isz = np.dtype(dtype).itemsize
        return Fake(shape, _operand.data_type(dtype), tuple(s // isz for s in strides))

    monkeypatch.setattr(_call._handle, "get_handle", lambda device=None: handle)
    monkeypatch.setattr(_call, "quiet", r)
    monkeypatch.setattr(memory, "empty", allocate)
    _call.calls().clear()
    yield r
    _call.calls().clear()


def x4(n=2, c=3, h=8, w=8, **kw):
    return Fake((n, c, h, w), **kw)


def x5(n=2, c=3, d=6, h=8, w=8, **kw):
    return Fake((n, c, d, h, w), **kw)


def _pool_desc():
    """The PoolingDescriptor of the latest call entry (the C call gets its address)."""
    return list(_call.calls().data.values())[-1].keepalive[0]


def _d(arg):
    """The descriptor behind a C call's argument: the entries pass their descriptors'
    addresses (ints) and keep the objects (``.keepalive``: pool, descriptors, ...); staging
    passes the objects."""
    if not isinstance(arg, int):
        return arg
    for entry in _call.calls().data.values():
        for d in _kept(entry.keepalive):
            if d.ptr == arg:
                return d
    raise KeyError(hex(arg))


def _kept(obj):
    """The objects with a ``ptr`` (descriptors) in a call entry's ``keepalive``, at any depth."""
    if isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _kept(o)
    elif isinstance(getattr(obj, "ptr", None), int):
        yield obj


def _value(p):
    """The float behind a ctypes byref() argument."""
    return ctypes.cast(p, ctypes.POINTER(ctypes.c_float)).contents.value


# ==================================================================================================
# Output shapes
# ==================================================================================================
@pytest.mark.parametrize(
    ("shape", "ws", "stride", "pad", "want"),
    [
        ((2, 3, 8, 8), (2, 2), None, None, (2, 3, 7, 7)),  # Theano's default stride is 1
        ((2, 3, 8, 8), (2, 2), (2, 2), None, (2, 3, 4, 4)),
        ((2, 3, 7, 7), (2, 2), (2, 2), None, (2, 3, 3, 3)),  # ignore_border=True: floor
        ((2, 3, 7, 6), (3, 3), (2, 2), (1, 1), (2, 3, 4, 3)),
        ((1, 1, 5, 5), (5, 5), None, None, (1, 1, 1, 1)),
        ((1, 1, 5, 5), (3, 2), (1, 3), (2, 1), (1, 1, 7, 2)),
        ((2, 3, 6, 8, 8), (2, 2, 2), (2, 2, 2), None, (2, 3, 3, 4, 4)),
        ((2, 3, 5, 6, 4), (3, 3, 3), (2, 2, 2), (1, 1, 1), (2, 3, 3, 3, 2)),
        ((2, 3, 8, 8), 3, 2, 1, (2, 3, 4, 4)),  # ints broadcast to the image's rank
        ((0, 3, 8, 8), (2, 2), (2, 2), None, (0, 3, 4, 4)),
    ],
)
def test_output_shape(shape, ws, stride, pad, want):
    assert get_pool_output_shape(shape, ws, stride, pad) == want


# ==================================================================================================
# Validation catalogue: nothing reaches C
# ==================================================================================================
BAD_FWD = [
    # (kwargs for dnn_pool, exception, message fragment)
    (dict(img=x4(), ws=(2,)), ValueError, "2 or 3"),
    (dict(img=x4(), ws=(2, 2, 2, 2)), ValueError, "2 or 3"),
    (dict(img=x4(), ws=(2, 2, 2)), ValueError, "needs 5 dims"),
    (dict(img=x5(), ws=(2, 2)), ValueError, "needs 4 dims"),
    (dict(img=Fake((2, 3, 8)), ws=2), ValueError, "2-D pooling needs"),
    (dict(img=x4(), ws=None), TypeError, "ws"),
    (dict(img=x4(), ws=True), TypeError, "ws"),
    (dict(img=x4(), ws=(2.0, 2)), TypeError, "ints"),
    (dict(img=x4(), ws=(0, 2)), ValueError, "non-positive ws"),
    (dict(img=x4(), ws=(2, 2), stride=(0, 1)), ValueError, "non-positive stride"),
    (dict(img=x4(), ws=(2, 2), stride=(1, 1, 1)), ValueError, "stride must have 2"),
    (dict(img=x4(), ws=(2, 2), pad=(-1, 0)), ValueError, "negative pad"),
    (dict(img=x4(), ws=(2, 2), pad=(2, 0)), ValueError, "smaller than the window"),
    (dict(img=x4(), ws=(3, 3), pad=(1, 3)), ValueError, "smaller than the window"),
    (dict(img=x4(h=2), ws=(5, 2), pad=(1, 0)), ValueError, "larger than the padded input"),
    (dict(img=x4(h=0), ws=(1, 1)), ValueError, "empty spatial"),
    (dict(img=x4(), ws=(2, 2), mode="avg"), ValueError, "mode='avg' is not one of"),
    (dict(img=x4(), ws=(2, 2), mode=1), TypeError, "mode must be a string"),
    (dict(img=x4(dt=DataType.INT32), ws=(2, 2)), TypeError, "unsupported dtype"),
    (dict(img=np.zeros((2, 3, 8, 8), np.float32), ws=(2, 2)), TypeError, "to_device"),
    (dict(img=[1.0], ws=(2, 2)), TypeError, "device array"),
    (dict(img=x4(), ws=(2, 2), out=Fake((2, 3, 4, 4))), ValueError, "out has shape"),
    (dict(img=x4(), ws=(2, 2), out=Fake((2, 3, 7, 7), dt=F64)), TypeError, "same dtype"),
    (dict(img=x4(), ws=(2, 2), out=Fake((2, 3, 7, 7), device=1)), ValueError, "device"),
    (
        dict(img=x4(), ws=(2, 2), out=Fake((2, 3, 7, 7), strides=(49, 7, 7, 1))),
        ValueError,
        "overlap",
    ),
    (dict(img=x4(strides=(192, 0, 8, 1)), ws=(2, 2)), ValueError, "zero (broadcast) stride"),
    (dict(img=x4(strides=(192, 64, 8, -1)), ws=(2, 2)), ValueError, "negative stride"),
    (dict(img=x4(ptr=(1 << 32) + 2), ws=(2, 2)), ValueError, "multiple of its element size"),
    (dict(img=x4(), ws=(2, 2), alpha=float("nan")), ValueError, "alpha must be finite"),
    (dict(img=x4(), ws=(2, 2), beta="0"), TypeError, "beta"),
    (dict(img=x4(n=2**31), ws=(2, 2)), OverflowError, "32-bit"),
    (dict(img=x4(strides=(2**31, 64, 8, 1)), ws=(2, 2)), OverflowError, "32-bit"),
]


@pytest.mark.parametrize(("kwargs", "exc", "fragment"), BAD_FWD)
def test_dnn_pool_rejects_before_any_c_call(no_c, kwargs, exc, fragment):
    with pytest.raises(exc) as info:
        dnn_pool(**kwargs)
    assert fragment in str(info.value)
    assert "dnn_pool" in str(info.value) or exc is TypeError


def _grad_args(**over):
    kw = dict(
        img=x4(), out=Fake((2, 3, 4, 4)), out_grad=Fake((2, 3, 4, 4)), ws=(2, 2), stride=(2, 2)
    )
    kw.update(over)
    return kw


BAD_BWD = [
    (_grad_args(out=Fake((2, 3, 7, 7))), ValueError, "out has shape (2, 3, 7, 7)"),
    (_grad_args(out_grad=Fake((2, 3, 4, 5))), ValueError, "out_grad has shape"),
    (_grad_args(stride=None), ValueError, "expected the forward output's (2, 3, 7, 7)"),
    (_grad_args(out_grad=Fake((2, 3, 4, 4), dt=F64)), TypeError, "same dtype"),
    (_grad_args(out=Fake((2, 3, 4, 4), device=1)), ValueError, "device"),
    (_grad_args(img_grad=Fake((2, 3, 4, 4))), ValueError, "img_grad has shape"),
    (_grad_args(img_grad=Fake((2, 3, 8, 8), dt=F16)), TypeError, "same dtype"),
    (_grad_args(mode="median"), ValueError, "mode"),
    (_grad_args(pad=(2, 2)), ValueError, "smaller than the window"),
    (_grad_args(out_grad=Fake((2, 3, 4, 4), strides=(48, 0, 4, 1))), ValueError, "zero"),
]


@pytest.mark.parametrize(("kwargs", "exc", "fragment"), BAD_BWD)
def test_dnn_pool_grad_rejects_before_any_c_call(no_c, kwargs, exc, fragment):
    with pytest.raises(exc) as info:
        dnn_pool_grad(**kwargs)
    assert fragment in str(info.value)


def test_out_keyword_of_the_gradient_is_img_grad():
    import inspect

    params = inspect.signature(dnn_pool_grad).parameters
    assert list(params)[:7] == ["img", "out", "out_grad", "ws", "stride", "mode", "pad"]
    assert params["img_grad"].kind is inspect.Parameter.KEYWORD_ONLY
    assert "out" not in [n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]


# ==================================================================================================
# Call entries: C calls, scaling, layouts, caching
# ==================================================================================================
def test_forward_calls_cudnn_once_per_call_and_validates_once(rec, monkeypatch):
    builds = []
    real = pool._build_forward
    monkeypatch.setattr(pool, "_build_forward", lambda *a: builds.append(1) or real(*a))
    x = x4()
    y1 = dnn_pool(x, (2, 2), (2, 2))
    y2 = dnn_pool(x, [2, 2], [2, 2])  # lists key like tuples
    assert len(builds) == 1
    assert rec.names() == ["cudnnPoolingForward"] * 2
    (_, args), _ = rec.log
    handle, _pd, alpha, xd, xp, beta, yd, yp = args
    assert handle == 0x1234 and xp == x.ptr and yp == y1.ptr
    assert _value(alpha) == 1.0 and _value(beta) == 0.0
    assert _d(xd).shape == (2, 3, 8, 8) and _d(yd).shape == (2, 3, 4, 4)
    assert y1.shape == y2.shape == (2, 3, 4, 4)
    dnn_pool(x, (2, 2), (2, 2), alpha=2.0)  # a different argument: a new entry
    assert len(builds) == 2


def test_pooling_descriptor_follows_the_arguments(rec):
    dnn_pool(x5(), (3, 3, 2), (2, 1, 2), "average_exc_pad", (1, 0, 1))
    ((_, args),) = rec.log
    pd = _pool_desc()
    assert args[1] == pd.ptr
    assert pd.window == (3, 3, 2) and pd.stride == (2, 1, 2) and pd.pad == (1, 0, 1)
    assert pd.mode == PoolingMode.AVERAGE_COUNT_EXCLUDE_PADDING
    assert int(pd.nan_propagation) == 1  # NaN propagates through max, as in torch
    rec.log.clear()
    dnn_pool(x4(), (2, 2))
    pd = _pool_desc()
    assert pd.stride == (1, 1) and pd.pad == (0, 0) and pd.mode == PoolingMode.MAX


@pytest.mark.parametrize(
    ("mode", "cudnn_mode"),
    [
        ("max", PoolingMode.MAX),
        ("MAX", PoolingMode.MAX),
        ("max_deterministic", PoolingMode.MAX_DETERMINISTIC),
        ("average_inc_pad", PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING),
        ("average", PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING),
        ("average_exc_pad", PoolingMode.AVERAGE_COUNT_EXCLUDE_PADDING),
        ("sum", PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING),
    ],
)
def test_modes(rec, mode, cudnn_mode):
    dnn_pool(x4(), (3, 2), mode=mode, alpha=0.5)
    ((_, args),) = rec.log
    assert _pool_desc().mode == cudnn_mode
    assert _value(args[2]) == (0.5 * 6 if mode == "sum" else 0.5)  # sum: x window volume


def test_float64_scales_are_double(rec):
    dnn_pool(x4(dt=F64), (2, 2), alpha=0.25, beta=0.5, out=Fake((2, 3, 7, 7), dt=F64))
    args = rec.log[0][1]
    assert ctypes.cast(args[2], ctypes.POINTER(ctypes.c_double)).contents.value == 0.25
    assert ctypes.cast(args[5], ctypes.POINTER(ctypes.c_double)).contents.value == 0.5


@pytest.mark.parametrize("dt", [F16, BF16, F32, F64])
def test_new_output_follows_the_input_layout(rec, dt):
    y = dnn_pool(x4(dt=dt, nhwc=True), (2, 2), (2, 2))
    assert y.dt == dt and y.strides == _layout.packed_strides((2, 3, 4, 4), True)
    y = dnn_pool(x5(dt=dt), (2, 2, 2), (2, 2, 2))
    assert y.strides == _layout.packed_strides((2, 3, 3, 4, 4))
    y = dnn_pool(x5(dt=dt, nhwc=True), (2, 2, 2), (2, 2, 2))
    assert y.strides == _layout.packed_strides((2, 3, 3, 4, 4), True)
    assert rec.names() == ["cudnnPoolingForward"] * 3


def test_strided_input_and_output_are_staged(rec):
    big = Fake((2, 3, 8, 11))
    x = Fake((2, 3, 8, 8), strides=big.strides, ptr=big.ptr)  # a sliced view
    out = Fake((2, 3, 4, 4), nhwc=True)  # the other layout than the (NCHW) computation
    res = dnn_pool(x, (2, 2), (2, 2), alpha=3.0, beta=0.5, out=out)
    assert res is out
    assert rec.names() == ["cudnnTransformTensor", "cudnnPoolingForward", "cudnnTransformTensor"]
    (_, copy_in), (_, fwd), (_, copy_out) = rec.log
    # cudnnTransformTensor(handle, alpha, src desc, src, beta, dst desc, dst)
    assert copy_in[3] == x.ptr and fwd[4] == copy_in[6]  # pooled from the packed copy
    assert _value(fwd[2]) == 1.0 and _value(fwd[5]) == 0.0  # into a fresh buffer
    assert copy_out[6] == out.ptr and copy_out[3] == fwd[7]
    assert _value(copy_out[1]) == 3.0 and _value(copy_out[4]) == 0.5  # alpha/beta applied here


def test_overlapping_out_is_refused_on_every_call(rec):
    x = x4()
    with pytest.raises(ValueError, match="overlaps an input"):
        dnn_pool(x, (2, 2), (2, 2), out=Fake((2, 3, 4, 4), ptr=x.ptr + 64))
    assert rec.log == []


def test_empty_batch_makes_no_c_call(rec):
    y = dnn_pool(x4(n=0), (2, 2), (2, 2))
    assert y.shape == (0, 3, 4, 4) and rec.log == []


def test_backward_pointer_roles(rec):
    x, y, dy = x4(), Fake((2, 3, 4, 4)), Fake((2, 3, 4, 4))
    dx = dnn_pool_grad(x, y, dy, (2, 2), (2, 2), alpha=2.0)
    ((name, args),) = rec.log
    assert name == "cudnnPoolingBackward"
    _h, _pd, alpha, yd, yp, dyd, dyp, xd, xp, beta, dxd, dxp = args
    assert (yp, dyp, xp, dxp) == (y.ptr, dy.ptr, x.ptr, dx.ptr)
    assert _d(yd).shape == _d(dyd).shape == (2, 3, 4, 4)
    assert _d(xd).shape == _d(dxd).shape == (2, 3, 8, 8)
    assert _value(alpha) == 2.0 and _value(beta) == 0.0
    assert dx.shape == x.shape and dx.strides == x.strides


def test_backward_keeps_the_input_layout(rec):
    x, y, dy = x4(nhwc=True), Fake((2, 3, 4, 4), nhwc=True), Fake((2, 3, 4, 4), nhwc=True)
    for mode in ("average_inc_pad", "max"):
        dx = dnn_pool_grad(x, y, dy, (2, 2), (2, 2), mode)
        assert dx.strides == _layout.packed_strides((2, 3, 8, 8), True)
    assert rec.names() == ["cudnnPoolingBackward"] * 2
    assert _d(rec.log[0][1][3]).strides == _layout.packed_strides((2, 3, 4, 4), True)
    rec.log.clear()
    dnn_pool_grad(x, Fake((2, 3, 4, 4)), dy, (2, 2), (2, 2))  # y NCHW: staged into NHWC
    assert rec.names() == ["cudnnTransformTensor", "cudnnPoolingBackward"]


def test_sum_backward_scales_by_the_window(rec):
    x, y = x4(), Fake((2, 3, 7, 7))
    dnn_pool_grad(x, y, y, (2, 2), mode="sum", alpha=0.5)
    assert _value(rec.log[0][1][2]) == 2.0
