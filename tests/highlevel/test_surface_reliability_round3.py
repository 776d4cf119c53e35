"""Issue 42 outside the graph builder: unclear messages, accepted nonsense and checks that ran
only after the first CUDA call, in the descriptors, the memory layer, the config and the high
level (no GPU: the descriptors are real, every way into CUDA is refused by ``no_c``).

Each case raises a named error whose message names the argument and the value; each would
fail if its fix regressed.
"""

from __future__ import annotations

import contextlib
import fractions
import types

import numpy as np
import pytest
from _fake_device import BF16, F16, CCall, Fake
from _fake_device import no_c as no_c  # the fixture

import pycudnn
from pycudnn import highlevel as H
from pycudnn import memory
from pycudnn.enums import BackendAttributeName as A
from pycudnn.enums import BackendAttributeType as T
from pycudnn.enums import BackendDescriptorType as D


# -- descriptors ---------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [{1: 2, 3: 4, 5: 6}, {1, 2, 3}, frozenset({4, 5, 6})])
def test_unordered_shapes_are_refused(shape):
    with pytest.raises(
        TypeError, match=r"shape must be a sequence of integers \(a tuple or list\)"
    ):
        pycudnn.TensorDescriptor(shape, "float32")
    with pytest.raises(TypeError, match="shape must be a sequence of integers"):
        pycudnn.FilterDescriptor(shape, "float32")
    with pytest.raises(TypeError, match="pad must be an int or a sequence of ints"):
        pycudnn.ConvolutionDescriptor(pad=set(list(shape)[:2]))


@pytest.mark.parametrize("dtype", [np.dtype(">f4"), np.dtype(">f2"), np.dtype(">i4")])
def test_byte_swapped_dtypes_are_refused(dtype):
    with pytest.raises(TypeError, match="is byte-swapped"):
        pycudnn.TensorDescriptor((1, 2, 3), dtype)
    assert pycudnn.TensorDescriptor((1, 2, 3), dtype.newbyteorder("=")).shape == (1, 2, 3)


def test_convolution_padding_past_32_bit_sizes_is_refused():
    with pytest.raises(OverflowError, match=r"pad\[0\]=2147483647 exceeds|pad=2147483647 exceeds"):
        pycudnn.ConvolutionDescriptor(pad=2**31 - 1)
    c = pycudnn.ConvolutionDescriptor(pad=2**30 - 1)
    x = pycudnn.TensorDescriptor((1, 3, 8, 8), "float32")
    w = pycudnn.FilterDescriptor((4, 3, 3, 3), "float32")
    with pytest.raises(ValueError, match="larger than cuDNN's 32-bit sizes"):
        c.forward_output_shape(x, w)


def test_pooling_padding_not_below_the_window_is_refused():
    with pytest.raises(ValueError, match=r"pad=\(3, 3\) is not smaller than window=\(2, 2\)"):
        pycudnn.PoolingDescriptor(2, pad=3)
    with pytest.raises(ValueError, match="not smaller than window"):
        pycudnn.PoolingDescriptor((3, 3), pad=(1, 3))
    pycudnn.PoolingDescriptor(3, pad=2)


def test_activation_coef_checks():
    with pytest.raises(ValueError, match=r"coef=-5\.0 is the clipped ReLU's ceiling"):
        pycudnn.ActivationDescriptor("clipped_relu", -5.0)
    with pytest.raises(OverflowError, match=r"coef=1000.* does not fit in a double"):
        pycudnn.ActivationDescriptor("relu", 10**400)
    pycudnn.ActivationDescriptor("clipped_relu", 0.0)
    pycudnn.ActivationDescriptor("elu", -1.0)  # elu's alpha may be negative


def _pw():
    return pycudnn.BackendDescriptor(D.POINTWISE_DESCRIPTOR)


@pytest.mark.parametrize(
    ("attr", "atype", "value", "exc", "match"),
    [
        (A.POINTWISE_NAN_PROPAGATION, T.BOOLEAN, 5, TypeError, r"must be a bool .* got 5"),
        (A.POINTWISE_NAN_PROPAGATION, T.BOOLEAN, 2.0, TypeError, "must be a bool"),
        (A.POINTWISE_RELU_LOWER_CLIP, T.FLOAT, 1e300, OverflowError, "does not fit in FLOAT"),
        (A.POINTWISE_RELU_LOWER_CLIP, T.DOUBLE, 10**400, OverflowError, "does not fit in DOUBLE"),
        (A.POINTWISE_RELU_LOWER_CLIP, T.FRACTION, (1, 0), ValueError, r"\(1, 0\) has a zero den"),
        (A.POINTWISE_RELU_LOWER_CLIP, T.FRACTION, 2**70, OverflowError, "must fit in int64"),
        (A.POINTWISE_RELU_LOWER_CLIP, T.FRACTION, (1, 2**64), OverflowError, "fit in int64"),
    ],
)
def test_backend_set_refuses_values_that_do_not_fit(attr, atype, value, exc, match):
    with pytest.raises(exc, match=match):
        _pw().set(attr, atype, value)


def test_backend_set_refuses_unordered_values_and_takes_valid_ones():
    t = pycudnn.BackendDescriptor(D.TENSOR_DESCRIPTOR)
    for bad in ({1: 2, 3: 4}, {1, 2}):
        with pytest.raises(TypeError, match="a mapping or a set has no order"):
            t.set(A.TENSOR_DIMENSIONS, T.INT64, bad)
    t.set(A.TENSOR_DIMENSIONS, T.INT64, (1, 2, 3))
    _pw().set(A.POINTWISE_RELU_LOWER_CLIP, T.FLOAT, float("inf"))  # explicit infinity: kept
    _pw().set(A.POINTWISE_RELU_LOWER_CLIP, T.FLOAT, 3.0e38)
    from pycudnn.descriptors._codec import pack

    for pair in ((1, 3), fractions.Fraction(1, 3), [(1, 3)]):
        arr, n = pack(T.FRACTION, pair, pycudnn.BackendDescriptor)
        assert n == 1 and (arr[0].numerator, arr[0].denominator) == (1, 3)


def test_backend_get_of_a_huge_count_asks_cudnn_first(monkeypatch):
    """get(count=2**31 - 1) allocated and zeroed 16 GiB before cuDNN refused: a count above the
    direct limit is asked of cuDNN first, and the array is what the attribute holds."""
    from pycudnn.descriptors import backend

    sizes = []

    def checked(name, warn=False):
        def fn(h, attr, atype, count, got, arr):
            if arr is None:
                got._obj.value = 3  # the attribute holds 3 elements
            else:
                sizes.append(len(arr))
                got._obj.value = min(count, 3)

        return fn

    t = pycudnn.BackendDescriptor(D.TENSOR_DESCRIPTOR)
    monkeypatch.setattr(backend.errors, "checked", checked)
    assert len(t.get(A.TENSOR_DIMENSIONS, T.INT64, 2**31 - 1)) == 3
    assert sizes == [3]
    t.get(A.TENSOR_DIMENSIONS, T.INT64, 8)  # a small count: allocated as asked, one call
    assert sizes == [3, 8]


# -- memory --------------------------------------------------------------------------------------
def test_device_array_is_not_made_directly():
    with pytest.raises(TypeError, match=r"DeviceArray is not made directly: use pycudnn\.empty"):
        memory.DeviceArray(1, "float32")


@pytest.mark.parametrize("shape", [(6.0,), ("6",), ({6: 1},), ((2, 3.0),), (True, 6)])
def test_device_array_reshape_names_its_argument(shape):
    a = memory.DeviceArray(0, (6,), np.dtype("float32"), (4,), 0, 0, None)
    with pytest.raises(TypeError, match="reshape: shape must"):
        a.reshape(*shape)
    assert a.reshape(2, 3).shape == (2, 3) and a.reshape((3, -1)).shape == (3, 2)


class _Dl:
    def __init__(self, device=(2, 0), dlpack=None):
        self._device = device
        if dlpack is not None:
            self.__dlpack__ = dlpack

    def __dlpack_device__(self):
        return self._device


def test_a_dlpack_attribute_that_is_not_a_method_is_named():
    with pytest.raises(TypeError, match=r"_Dl\.__dlpack__ is a int, not a method"):
        memory.asarray(_Dl(dlpack=5))


@pytest.mark.parametrize("device", [(2, 0, 0), (2,), "cuda", (2, 0.5), None])
def test_a_malformed_dlpack_device_is_refused(device):
    def never(**kw):
        raise AssertionError("__dlpack__ must not be called")

    with pytest.raises(TypeError, match=r"__dlpack_device__\(\) returned .*pair of ints"):
        memory.asarray(_Dl(device, dlpack=never))


def test_a_dlpack_device_that_contradicts_the_capsule_is_refused():
    """The producer says CUDA device 0; its capsule holds a tensor on device 1."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parents[1] / "device" / "test_interop_untrusted.py"
    spec = importlib.util.spec_from_file_location("_untrusted_capsules", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # its hand-built capsules (issue 16)
    cap = mod.Capsule(device=(2, 1))
    with pytest.raises(ValueError, match=r"__dlpack_device__\(\) says .* but its capsule holds"):
        memory.asarray(_Dl((2, 0), dlpack=lambda **kw: cap.capsule))


@pytest.mark.parametrize("stream", [2**64, 2**70])
def test_streams_past_64_bits_are_refused(stream):
    from pycudnn import _cuda

    with pytest.raises(ValueError, match="is not a cudaStream_t: an address is below 2"):
        _cuda.coerce_stream(stream)


# -- config ----------------------------------------------------------------------------------------
def test_deleting_a_flag_says_what_to_do():
    with pytest.raises(AttributeError, match=r"pycudnn\.config\.algo_fwd cannot be deleted"):
        del pycudnn.config.algo_fwd
    assert pycudnn.config.algo_fwd  # still there


# -- high level ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("shapes", "exc", "match"),
    [
        ((None, (4, 3, 3, 3)), TypeError, "image_shape must be a sequence of ints"),
        (((1, 3, 8, 8), "4333"), TypeError, "kernel_shape must be a sequence of ints"),
        (((1, 3, -8, 8), (4, 3, 3, 3)), ValueError, "non-positive image_shape"),
        (((1, 3, 8, 8), (4, 3, 0, 3)), ValueError, "non-positive kernel_shape"),
        (((1, 3, 8.0, 8), (4, 3, 3, 3)), TypeError, "image_shape must contain ints"),
    ],
)
def test_get_conv_output_shape_checks_its_shapes(shapes, exc, match):
    from pycudnn.highlevel.conv import get_conv_output_shape

    with pytest.raises(exc, match=f"get_conv_output_shape: {match}"):
        get_conv_output_shape(*shapes)
    assert get_conv_output_shape((1, 3, 8, 8), (4, 3, 3, 3)) == (1, 4, 6, 6)


X, W = (2, 3, 8, 8), (4, 3, 3, 3)
_BLEND = [
    ("dnn_conv", lambda b: H.dnn_conv(Fake(X), Fake(W), beta=b)),
    ("dnn_conv3d", lambda b: H.dnn_conv3d(Fake((1, 3, 4, 4, 4)), Fake((2, 3, 3, 3, 3)), beta=b)),
    ("dnn_gradinput", lambda b: H.dnn_gradinput(Fake(W), Fake((2, 4, 6, 6)), X, beta=b)),
    ("dnn_gradweight", lambda b: H.dnn_gradweight(Fake(X), Fake((2, 4, 6, 6)), W, beta=b)),
    ("dnn_pool", lambda b: H.dnn_pool(Fake(X), (2, 2), beta=b)),
    (
        "dnn_pool_grad",
        lambda b: H.dnn_pool_grad(Fake(X), Fake((2, 3, 7, 7)), Fake((2, 3, 7, 7)), (2, 2), beta=b),
    ),
    ("dnn_softmax", lambda b: H.dnn_softmax(Fake(X), beta=b)),
    ("dnn_activation", lambda b: H.dnn_activation(Fake(X), beta=b)),
    ("dnn_activation_grad", lambda b: H.dnn_activation_grad(Fake(X), Fake(X), Fake(X), beta=b)),
    ("dnn_op_tensor", lambda b: H.dnn_op_tensor("add", Fake(X), Fake(X), beta=b)),
]


@pytest.mark.parametrize(("func", "call"), _BLEND, ids=[f for f, _ in _BLEND])
def test_beta_without_out_is_refused_before_any_c_call(no_c, func, call):
    """``out = alpha * op + beta * out`` with no out= blended a new, uninitialized buffer."""
    with pytest.raises(ValueError, match=rf"{func}: beta=1\.0 blends out's previous values"):
        call(1.0)
    with pytest.raises(ValueError, match=rf"{func}: beta=-0\.5 blends"):
        call(-0.5)
    with pytest.raises(CCall):  # beta=0: valid, reaches the first C call
        call(0.0)


def test_matmul_stream_is_checked_before_the_first_cuda_call(no_c):
    a, b = Fake((4, 8), F16), Fake((8, 4), F16)
    with pytest.raises(TypeError, match=r"dnn_matmul: stream: cannot use str as a CUDA stream"):
        H.dnn_matmul(a, b, stream="abc")
    with pytest.raises(ValueError, match=r"dnn_matmul: stream: stream=-1 is negative"):
        H.dnn_matmul(a, b, stream=np.int64(-1))


@pytest.mark.parametrize("func", ["dnn_layer_norm", "dnn_rms_norm"])
def test_norm_out_is_checked_before_the_stand_ins_are_made(no_c, func):
    x = Fake((4, 8), BF16)
    with pytest.raises(ValueError, match=rf"{func}: out has shape \(3, 3\), expected \(4, 8\)"):
        getattr(H, func)(x, (8,), out=Fake((3, 3), BF16))
    with pytest.raises(TypeError, match=rf"{func}: stream: cannot use str"):
        getattr(H, func)(x, (8,), stream="abc")


# -- Graph.execute: the workspace and the stream before the first CUDA call ---------------------
@pytest.fixture
def built(monkeypatch):
    from pycudnn import _cuda
    from pycudnn.graph import Graph, _builder

    class Plan:
        workspace = 4096

        def launch(self, ptrs, scratch=()):
            raise CCall("launch")

        def run(self, *ptrs):
            raise CCall("run")

    def no_device(device):
        raise CCall("a CUDA device switch was attempted")

    handle = types.SimpleNamespace(set_stream=lambda s: None, stream=0)
    monkeypatch.setattr(_builder._plans, "plan", lambda key, h: Plan())
    monkeypatch.setattr(_builder._handle, "get_handle", lambda device: handle)
    monkeypatch.setattr(_cuda, "DeviceContext", lambda device: contextlib.nullcontext())

    def asarray(obj, check=False):
        if isinstance(obj, tuple):  # (nbytes, device): a fake workspace
            return types.SimpleNamespace(nbytes=obj[0], device=obj[1], ptr=0x9000)
        if not isinstance(obj, int):
            raise TypeError(f"cannot view {type(obj).__name__} as a device array")
        return types.SimpleNamespace(
            dtype=np.dtype("float16"), shape=(2, 3), strides=(6, 2), device=0, ptr=obj
        )

    monkeypatch.setattr(memory, "asarray", asarray)
    g = Graph(io_data_type="float16", name="G")
    a = g.tensor((2, 3), name="a")
    y = g.relu(a).set_output(True)
    g.build(device=0)
    monkeypatch.setattr(_cuda, "DeviceContext", no_device)
    return g, {a: 0x1000, y: 0x2000}


@pytest.mark.parametrize(
    ("kw", "exc", "match"),
    [
        (dict(workspace=(100, 0)), ValueError, r"G: workspace has 100 B, the plan needs 4096 B"),
        (dict(workspace=(8192, 1)), ValueError, r"G: workspace is on device 1, the graph was"),
        (dict(workspace="ws"), TypeError, r"G: workspace: cannot view str"),
        (dict(stream="abc"), TypeError, r"G\.execute: stream: cannot use str"),
        (dict(stream=2**70), ValueError, r"G\.execute: stream: stream=.* is not a cudaStream_t"),
    ],
)
def test_execute_checks_workspace_and_stream_before_cuda(built, kw, exc, match):
    g, pack = built
    with pytest.raises(exc, match=match):
        g.execute(pack, **kw)
    with pytest.raises(CCall):  # a valid workspace reaches the device switch
        g.execute(pack, workspace=(4096, 0))
    with contextlib.suppress(CCall):
        g.execute(pack)


# -- faults: the named out-of-memory error, and refusals during a CUDA-graph capture ---------------
def test_out_of_memory_is_named_with_the_size_asked(monkeypatch):
    from pycudnn import _cuda, errors
    from pycudnn.memory import allocator

    monkeypatch.setattr(_cuda, "mem_get_info", lambda device: (1 << 20, 1 << 30))
    monkeypatch.setattr(allocator, "mem_get_info", lambda device: (1 << 20, 1 << 30))
    exc = allocator.allocation_error(3 << 30, 0, "cudaMallocAsync", "out of memory")
    assert isinstance(exc, errors.OutOfMemoryError) and isinstance(exc, errors.AllocationError)
    assert isinstance(exc, MemoryError) and exc.requested == 3 << 30 and exc.free == 1 << 20
    assert "cannot allocate 3.0 GiB (3221225472 bytes) on device 0" in str(exc)


def test_allocation_on_a_capturing_stream_is_refused_before_cuda(monkeypatch):
    from pycudnn import _cuda, errors
    from pycudnn.memory import allocator

    def no_runtime():
        raise CCall("a CUDA runtime call was attempted")

    monkeypatch.setattr(_cuda, "is_capturing", lambda stream: stream == 0x77)
    monkeypatch.setattr(_cuda, "runtime", no_runtime)
    with pytest.raises(errors.StreamCaptureError, match=r"stream 0x77 is capturing a CUDA graph"):
        allocator.device_malloc(4096, 0, 0x77)
    with pytest.raises(CCall):  # another stream: allocated as before
        allocator.device_malloc(4096, 0, 0x78)


def test_a_new_call_on_a_capturing_stream_is_refused_before_planning(no_c, monkeypatch):
    from pycudnn import _cuda, errors
    from pycudnn.highlevel import _call

    handle = types.SimpleNamespace(stream=0x55, set_stream=lambda s: None, device=0, ptr=0x1234)
    monkeypatch.setattr(_call._handle, "get_handle", lambda device=None: handle)
    monkeypatch.setattr(_cuda, "device_count", lambda: 1)
    monkeypatch.setattr(_cuda, "is_capturing", lambda stream: stream == 0x55)
    with pytest.raises(errors.StreamCaptureError, match=r"dnn_activation: stream 0x55 is capt"):
        H.dnn_activation(Fake(X))
    handle.stream = 0x56
    with pytest.raises(CCall):  # not capturing: planned as before
        H.dnn_activation(Fake(X))
