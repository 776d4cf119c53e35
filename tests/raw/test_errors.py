"""Status -> exception mapping, messages, pickling, and real failing calls (tier B: no GPU)."""

from __future__ import annotations

import ctypes
import pickle
import warnings

import pytest

import pycudnn
from pycudnn import api, enums, errors, lib


def test_map_is_total_and_exact():
    expected = {
        1000: errors.SublibraryError,
        2000: errors.BadParamError,
        3000: errors.NotSupportedError,
        4000: errors.InternalError,
        5000: errors.ExecutionFailedError,
    }
    for status in enums.Status:
        if status == 0:
            continue
        cls = errors.error_class(status)
        if status in (4003, 4004):
            assert cls is errors.AllocationError
        else:
            assert cls is expected[status.category], status


def test_status_names_exact():
    for status in enums.Status:
        assert errors.status_name(status) == status.c_name
    assert errors.status_name(2001) == "CUDNN_STATUS_INVALID_VALUE"
    assert errors.status_name(2999) == "CUDNN_STATUS_UNKNOWN"


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (1999, errors.SublibraryError),
        (2999, errors.BadParamError),
        (3999, errors.NotSupportedError),
        (4999, errors.InternalError),
        (5999, errors.ExecutionFailedError),
        (7000, errors.CudnnError),
    ],
)
def test_unknown_future_codes_map_by_category(code, cls):
    assert errors.error_class(code) is cls
    e = errors.CudnnError(code, "cudnnFoo")
    assert e.status == code and "CUDNN_STATUS_UNKNOWN" in str(e)


def test_builtin_mixins():
    assert issubclass(errors.BadParamError, ValueError)
    assert issubclass(errors.NotSupportedError, NotImplementedError)
    assert issubclass(errors.AllocationError, MemoryError)
    assert issubclass(errors.AllocationError, errors.InternalError)
    assert issubclass(errors.ExecutionFailedError, RuntimeError)
    assert issubclass(errors.LibraryNotFoundError, ImportError)
    assert issubclass(errors.SymbolNotFoundError, AttributeError)
    assert issubclass(errors.CudnnDeprecationWarning, DeprecationWarning)
    assert pycudnn.BadParamError is errors.BadParamError


def test_message_format_and_pickle():
    e = errors.BadParamError(2002, "cudnnSetTensorNdDescriptor", "dimA is NULL")
    assert str(e) == (
        "cudnnSetTensorNdDescriptor failed: CUDNN_STATUS_BAD_PARAM_NULL_POINTER (2002): "
        "dimA is NULL"
    )
    e2 = pickle.loads(pickle.dumps(e))
    assert type(e2) is errors.BadParamError and str(e2) == str(e)
    assert e2.status is enums.Status.BAD_PARAM_NULL_POINTER and e2.api == e.api


def test_error_string_for_every_status():
    for status in enums.Status:
        assert lib.cudnnGetErrorString(status).decode() == status.c_name
    assert lib.cudnnGetErrorString(2001) == b"CUDNN_STATUS_INVALID_VALUE"
    assert lib.cudnnGetErrorString(31337) == b"CUDNN_UNKNOWN_STATUS"


def _tensor_desc():
    d = lib.cudnnTensorDescriptor_t()
    api.cudnnCreateTensorDescriptor(ctypes.byref(d))
    return d


def test_failing_call_raises_with_last_error_text():
    d = _tensor_desc()
    try:
        with pytest.raises(errors.BadParamError) as info:
            api.cudnnSetTensor4dDescriptor(d, 0, 0, -2, 3, 4, 5)
        e = info.value
        assert e.api == "cudnnSetTensor4dDescriptor"
        assert e.status == enums.Status.BAD_PARAM
        assert "n <= 0" in e.detail  # cuDNN's own text from cudnnGetLastErrorString
        assert str(e).startswith(
            "cudnnSetTensor4dDescriptor failed: CUDNN_STATUS_BAD_PARAM (2000): "
        )
        assert errors.last_error_string() == ""  # read once
    finally:
        api.cudnnDestroyTensorDescriptor(d)


def test_not_supported_category():
    d = _tensor_desc()
    try:
        dims = (ctypes.c_int * 9)(*([2] * 9))
        strides = (ctypes.c_int * 9)(*([1] * 9))
        with pytest.raises(errors.NotSupportedError):
            api.cudnnSetTensorNdDescriptor(d, 0, 9, dims, strides)
    finally:
        api.cudnnDestroyTensorDescriptor(d)


def test_handle_creation_without_gpu_is_categorised():
    from conftest import gpu_unavailable_reason

    if gpu_unavailable_reason() is None:
        pytest.skip("a GPU is present: cudnnCreate succeeds")
    h = lib.cudnnHandle_t()
    with pytest.raises(errors.SublibraryError) as info:
        api.cudnnCreate(ctypes.byref(h))
    assert info.value.status == enums.Status.NOT_INITIALIZED


def test_checked_returns_none_and_value_functions_pass_through():
    assert api.cudnnGetVersion() == lib.cudnnGetVersion() == pycudnn.version()
    d = _tensor_desc()
    assert api.cudnnSetTensor4dDescriptor(d, 0, 0, 2, 3, 4, 5) is None
    n = ctypes.c_size_t()
    api.cudnnGetTensorSizeInBytes(d, ctypes.byref(n))
    assert n.value == 2 * 3 * 4 * 5 * 4
    api.cudnnDestroyTensorDescriptor(d)
    with pytest.raises(AttributeError):
        api.cudnnNoSuchFunction  # noqa: B018


def test_raw_layer_never_raises_on_status():
    d = lib.cudnnTensorDescriptor_t()
    assert lib.cudnnCreateTensorDescriptor(ctypes.byref(d)) == 0
    assert lib.cudnnSetTensor4dDescriptor(d, 0, 0, -1, 3, 4, 5) == 2000
    errors.last_error_string()
    assert lib.cudnnDestroyTensorDescriptor(d) == 0


def test_deprecated_function_warns_once():
    errors._warned.discard("cudnnCreateFilterDescriptor")
    f = lib.cudnnFilterDescriptor_t()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        api.cudnnCreateFilterDescriptor(ctypes.byref(f))
        api.cudnnDestroyFilterDescriptor(f)
        api.cudnnCreateFilterDescriptor(ctypes.byref(f))
        api.cudnnDestroyFilterDescriptor(f)
    created = [x for x in w if "cudnnCreateFilterDescriptor" in str(x.message)]
    assert len(created) == 1 and created[0].category is errors.CudnnDeprecationWarning
    assert created[0].filename == __file__  # points at the caller


def test_descriptor_roundtrip_through_api():
    """Create/set/get/destroy of tensor, filter, convolution and pooling, plus output dims."""
    warnings.simplefilter("ignore", errors.CudnnDeprecationWarning)
    x, w = _tensor_desc(), lib.cudnnFilterDescriptor_t()
    conv, pool = lib.cudnnConvolutionDescriptor_t(), lib.cudnnPoolingDescriptor_t()
    api.cudnnCreateFilterDescriptor(ctypes.byref(w))
    api.cudnnCreateConvolutionDescriptor(ctypes.byref(conv))
    api.cudnnCreatePoolingDescriptor(ctypes.byref(pool))
    try:
        api.cudnnSetTensor4dDescriptor(x, lib.CUDNN_TENSOR_NCHW, lib.CUDNN_DATA_FLOAT, 2, 3, 32, 32)
        out = [ctypes.c_int() for _ in range(9)]
        api.cudnnGetTensor4dDescriptor(x, *(ctypes.byref(o) for o in out))
        assert [o.value for o in out] == [0, 2, 3, 32, 32, 3072, 1024, 32, 1]
        api.cudnnSetFilter4dDescriptor(w, lib.CUDNN_DATA_FLOAT, lib.CUDNN_TENSOR_NCHW, 8, 3, 3, 3)
        api.cudnnSetConvolution2dDescriptor(
            conv, 1, 1, 1, 1, 1, 1, lib.CUDNN_CROSS_CORRELATION, lib.CUDNN_DATA_FLOAT
        )
        dims = [ctypes.c_int() for _ in range(4)]
        api.cudnnGetConvolution2dForwardOutputDim(conv, x, w, *(ctypes.byref(d) for d in dims))
        assert [d.value for d in dims] == [2, 8, 32, 32]
        api.cudnnSetPooling2dDescriptor(pool, lib.CUDNN_POOLING_MAX, 0, 2, 2, 0, 0, 2, 2)
        api.cudnnGetPooling2dForwardOutputDim(pool, x, *(ctypes.byref(d) for d in dims))
        assert [d.value for d in dims] == [2, 3, 16, 16]
    finally:
        api.cudnnDestroyPoolingDescriptor(pool)
        api.cudnnDestroyConvolutionDescriptor(conv)
        api.cudnnDestroyFilterDescriptor(w)
        api.cudnnDestroyTensorDescriptor(x)


def test_quiet_checked_neither_warns_nor_uses_up_the_warning(monkeypatch):
    monkeypatch.setattr(errors, "_warned", set())
    f = lib.cudnnFilterDescriptor_t()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        errors.checked("cudnnCreateFilterDescriptor", warn=False)(ctypes.byref(f))
        errors.checked("cudnnDestroyFilterDescriptor", warn=False)(f)
    with pytest.warns(errors.CudnnDeprecationWarning, match="cudnnCreateFilterDescriptor"):
        api.cudnnCreateFilterDescriptor(ctypes.byref(f))
    errors.checked("cudnnDestroyFilterDescriptor", warn=False)(f)
    with pytest.raises(errors.BadParamError):
        errors.checked("cudnnSetFilter4dDescriptor", warn=False)(None, 0, 0, 1, 1, 1, 1)
