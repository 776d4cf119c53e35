"""Descriptor layer without a GPU: round-trips, output-shape helpers, the bad-input catalogue.

Every call here works with libcudnn and no GPU (``research/headers.md`` §7.1). The bad-input
catalogue checks each invalid argument's exception type and message *and* that no C function
was called (a counting shim over the C layer, ``tests/support/_desc_shim.py``).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from _desc_shim import counting_c_calls

import pycudnn
from pycudnn import enums, errors
from pycudnn.descriptors import (
    ActivationDescriptor,
    BackendDescriptor,
    ConvolutionDescriptor,
    CTCLossDescriptor,
    DropoutDescriptor,
    FilterDescriptor,
    LRNDescriptor,
    OpTensorDescriptor,
    PoolingDescriptor,
    ReduceTensorDescriptor,
    RNNDataDescriptor,
    RNNDescriptor,
    SpatialTransformerDescriptor,
    TensorDescriptor,
)
from pycudnn.enums import DataType

I32 = 2**31 - 1


# -- round-trips -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "shape",
    [(2, 3), (2, 3, 4), (2, 3, 4, 5), (1, 2, 3, 4, 5), (1, 1, 2, 2, 2, 2), (2,) * 8],
    ids=lambda s: f"{len(s)}d",
)
@pytest.mark.parametrize("dtype", ["float32", np.float64, "float16", "bfloat16", DataType.INT8])
def test_tensor_roundtrip_packed(shape, dtype):
    if len(shape) < 3:
        with pytest.raises(ValueError, match="shape"):
            TensorDescriptor(shape, dtype)
        return
    with TensorDescriptor(shape, dtype) as t:
        assert t.shape == shape
        assert t.ndim == len(shape)
        assert t.dtype == pycudnn._types.as_data_type(dtype)
        assert t.strides == tuple(int(s) for s in np.cumprod((1, *shape[::-1]))[-2::-1])
        assert t.layout == enums.TensorFormat.NCHW
        assert t.size_in_bytes == math.prod(shape) * pycudnn._types.itemsize(t.dtype)


@pytest.mark.parametrize(
    ("shape", "strides"),
    [
        ((2, 3, 4, 5), (60, 1, 15, 3)),
        ((2, 3, 4, 5, 6), (360, 1, 90, 18, 3)),
        ((2, 3, 4), (12, 1, 3)),
    ],
)
def test_tensor_nhwc(shape, strides):
    t = TensorDescriptor(shape, "float16", layout="NHWC")
    assert t.strides == strides
    assert t.layout == enums.TensorFormat.NHWC
    assert repr(t) == f"TensorDescriptor(shape={shape}, dtype=float16, layout=NHWC)"
    # the same strides given explicitly (with or without the layout name) read back the same
    assert TensorDescriptor(shape, "float16", strides=strides).layout == enums.TensorFormat.NHWC
    assert TensorDescriptor(shape, "float16", strides, layout="nhwc").strides == strides
    t.close()


def test_tensor_arbitrary_strides_and_repr():
    t = TensorDescriptor((2, 3, 4, 5), "float32", strides=(200, 50, 10, 2))
    assert t.strides == (200, 50, 10, 2)
    assert t.layout is None
    assert (
        repr(t) == "TensorDescriptor(shape=(2, 3, 4, 5), dtype=float32, strides=(200, 50, 10, 2))"
    )
    assert repr(TensorDescriptor((2, 3, 4, 5))) == (
        "TensorDescriptor(shape=(2, 3, 4, 5), dtype=float32, layout=NCHW)"
    )


def test_tensor_accepts_numpy_ints_and_enum_members():
    t = TensorDescriptor(np.array([2, 3, 4, 5]), DataType.DOUBLE, layout=enums.TensorFormat.NCHW)
    assert t.shape == (2, 3, 4, 5) and t.dtype == DataType.DOUBLE


@pytest.mark.parametrize(
    ("mode", "shape"),
    [
        ("spatial", (1, 3, 1, 1)),
        ("per_activation", (1, 3, 4, 5)),
        ("SPATIAL_PERSISTENT", (1, 3, 1, 1)),
    ],
)
def test_derive_bn(mode, shape):
    x = TensorDescriptor((2, 3, 4, 5))
    assert TensorDescriptor.derive_bn(x, mode).shape == shape
    x5 = TensorDescriptor((2, 3, 4, 5, 6))
    assert TensorDescriptor.derive_bn(x5, enums.BatchNormMode.SPATIAL).shape == (1, 3, 1, 1, 1)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("shape", [(8, 3, 3, 3), (8, 3, 3, 3, 3), (4, 2, 5)])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64", "int8", "uint8"])
def test_filter_roundtrip(shape, layout, dtype):
    w = FilterDescriptor(shape, dtype, layout)
    assert w.shape == shape
    assert w.layout == enums.TensorFormat[layout]
    assert w.dtype == pycudnn._types.as_data_type(dtype)
    assert w.ndim == len(shape)
    assert w.size_in_bytes == math.prod(shape) * pycudnn._types.itemsize(w.dtype)
    assert repr(w).startswith(f"FilterDescriptor(shape={shape}, ")


@pytest.mark.parametrize(
    ("kw", "pad", "stride", "dilation"),
    [
        ({}, (0, 0), (1, 1), (1, 1)),
        ({"pad": 1, "stride": 2, "dilation": 3}, (1, 1), (2, 2), (3, 3)),
        (
            {"pad": (0, 1, 2), "stride": (1, 2, 1), "dilation": (1, 1, 2)},
            (0, 1, 2),
            (1, 2, 1),
            (1, 1, 2),
        ),
        ({"pad": 2, "ndim": 3}, (2, 2, 2), (1, 1, 1), (1, 1, 1)),
        ({"pad": 1, "ndim": 1}, (1,), (1,), (1,)),
    ],
)
def test_convolution_roundtrip(kw, pad, stride, dilation):
    c = ConvolutionDescriptor(**kw)
    assert (c.pad, c.stride, c.dilation) == (pad, stride, dilation)
    assert c.ndim == len(pad)
    assert c.mode == enums.ConvolutionMode.CROSS_CORRELATION
    assert c.compute_type == DataType.FLOAT
    assert c.groups == 1 and c.math_type == enums.MathType.DEFAULT_MATH


def test_convolution_options():
    c = ConvolutionDescriptor(
        1, mode="conv", compute_type="float64", groups=4, math_type="tensor_op_allow_conversion"
    )
    assert c.mode == enums.ConvolutionMode.CONVOLUTION
    assert c.compute_type == DataType.DOUBLE
    assert c.groups == 4
    assert c.math_type == enums.MathType.TENSOR_OP_MATH_ALLOW_CONVERSION
    assert c.reorder_type == enums.ReorderType.DEFAULT_REORDER
    c.reorder_type = "no_reorder"
    assert c.reorder_type == enums.ReorderType.NO_REORDER
    assert "groups=4" in repr(c) and "mode=CONVOLUTION" in repr(c)
    c2 = ConvolutionDescriptor(mode=enums.ConvolutionMode.CROSS_CORRELATION, compute_type="float16")
    assert c2.compute_type == DataType.HALF


# x shape, w shape, conv kwargs, expected (hand-computed: (i + 2p - d(k-1) - 1) // s + 1)
CONV_CASES = [
    ("valid", (2, 3, 32, 32), (8, 3, 3, 3), {}, (2, 8, 30, 30)),
    ("full", (2, 3, 32, 32), (8, 3, 3, 3), {"pad": 2}, (2, 8, 34, 34)),
    ("half", (2, 3, 32, 32), (8, 3, 3, 3), {"pad": 1}, (2, 8, 32, 32)),
    ("half-5x5", (1, 1, 7, 7), (1, 1, 5, 5), {"pad": 2}, (1, 1, 7, 7)),
    ("stride2", (2, 3, 32, 32), (8, 3, 3, 3), {"pad": 1, "stride": 2}, (2, 8, 16, 16)),
    ("stride3-odd", (1, 3, 10, 10), (4, 3, 3, 3), {"stride": 3}, (1, 4, 3, 3)),
    ("dilation2", (2, 3, 32, 32), (8, 3, 3, 3), {"dilation": 2}, (2, 8, 28, 28)),
    ("dilation-full", (1, 2, 9, 9), (2, 2, 3, 3), {"pad": 4, "dilation": 2}, (1, 2, 13, 13)),
    (
        "asymmetric",
        (1, 1, 7, 9),
        (1, 1, 3, 5),
        {"pad": (1, 2), "stride": (2, 3), "dilation": (1, 2)},
        (1, 1, 4, 2),
    ),
    ("grouped", (2, 8, 10, 10), (16, 2, 3, 3), {"groups": 4}, (2, 16, 8, 8)),
    ("depthwise", (2, 6, 5, 5), (6, 1, 3, 3), {"groups": 6, "pad": 1}, (2, 6, 5, 5)),
    ("3d", (1, 4, 8, 8, 8), (6, 4, 3, 3, 3), {"pad": 1, "stride": 2, "ndim": 3}, (1, 6, 4, 4, 4)),
    ("3d-dilated", (1, 2, 9, 9, 9), (3, 2, 3, 3, 3), {"dilation": (1, 2, 3)}, (1, 3, 7, 5, 3)),
    ("1d", (2, 3, 10), (4, 3, 3), {"ndim": 1}, (2, 4, 8)),
    ("kernel=input", (1, 1, 3, 3), (1, 1, 3, 3), {}, (1, 1, 1, 1)),
]


@pytest.mark.parametrize(
    ("x", "w", "kw", "expected"), [c[1:] for c in CONV_CASES], ids=[c[0] for c in CONV_CASES]
)
def test_conv_forward_output_shape(x, w, kw, expected):
    conv = ConvolutionDescriptor(**kw)
    assert conv.forward_output_shape(TensorDescriptor(x), FilterDescriptor(w)) == expected


POOL_CASES = [
    ("2x2", (2, 3, 32, 32), {"window": 2}, (2, 3, 16, 16)),
    ("3x3-s2-p1", (2, 3, 32, 32), {"window": 3, "stride": 2, "pad": 1}, (2, 3, 16, 16)),
    ("3x3-s1", (2, 3, 32, 32), {"window": 3, "stride": 1}, (2, 3, 30, 30)),
    ("odd-floor", (1, 1, 7, 7), {"window": 2}, (1, 1, 3, 3)),
    ("rect", (2, 3, 32, 32), {"window": (2, 3), "stride": (2, 3), "pad": (0, 1)}, (2, 3, 16, 11)),
    ("3d", (1, 2, 8, 8, 8), {"window": (2, 2, 2)}, (1, 2, 4, 4, 4)),
    ("3d-s1-p1", (1, 2, 5, 6, 7), {"window": 3, "stride": 1, "pad": 1, "ndim": 3}, (1, 2, 5, 6, 7)),
    ("global", (4, 8, 7, 7), {"window": 7}, (4, 8, 1, 1)),
]


@pytest.mark.parametrize(
    ("x", "kw", "expected"), [c[1:] for c in POOL_CASES], ids=[c[0] for c in POOL_CASES]
)
def test_pool_forward_output_shape(x, kw, expected):
    assert PoolingDescriptor(**kw).forward_output_shape(TensorDescriptor(x)) == expected


@pytest.mark.parametrize(
    ("mode", "member"),
    [
        ("max", enums.PoolingMode.MAX),
        ("average_inc_pad", enums.PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING),
        ("average_exc_pad", enums.PoolingMode.AVERAGE_COUNT_EXCLUDE_PADDING),
        ("max_deterministic", enums.PoolingMode.MAX_DETERMINISTIC),
        ("CUDNN_POOLING_MAX", enums.PoolingMode.MAX),
        (
            enums.PoolingMode.AVERAGE_COUNT_EXCLUDE_PADDING,
            enums.PoolingMode.AVERAGE_COUNT_EXCLUDE_PADDING,
        ),
    ],
)
def test_pooling_roundtrip(mode, member):
    p = PoolingDescriptor((3, 3, 3), (1, 2, 3), (1, 0, 1), mode=mode, nan_propagation=True)
    assert p.window == (3, 3, 3) and p.stride == (1, 2, 3) and p.pad == (1, 0, 1)
    assert p.ndim == 3 and p.mode == member
    assert p.nan_propagation == enums.NanPropagation.PROPAGATE_NAN
    assert PoolingDescriptor(2).stride == (2, 2)  # default stride = window


@pytest.mark.parametrize(
    "mode", ["relu", "sigmoid", "tanh", "clipped_relu", "elu", "identity", "swish"]
)
def test_activation_roundtrip(mode):
    a = ActivationDescriptor(mode, 6.0, nan_propagation="propagate")
    assert a.mode == enums.ActivationMode[mode.upper()]
    assert a.coef == 6.0
    assert a.nan_propagation == enums.NanPropagation.PROPAGATE_NAN
    a2 = ActivationDescriptor("swish", swish_beta=1.25)
    assert a2.swish_beta == 1.25


def test_lrn_roundtrip():
    lrn = LRNDescriptor(7, 2e-4, 0.5, 1.5)
    assert (lrn.n, lrn.alpha, lrn.beta, lrn.k) == (7, 2e-4, 0.5, 1.5)
    assert repr(lrn) == "LRNDescriptor(n=7, alpha=0.0002, beta=0.5, k=1.5)"


@pytest.mark.parametrize("op", list(enums.OpTensorOp))
@pytest.mark.parametrize("ct", ["float32", "float64", "float16", "bfloat16"])
def test_op_tensor_roundtrip(op, ct):
    o = OpTensorDescriptor(op.name.lower(), ct, nan_propagation=True)
    assert o.op == op and o.compute_type == pycudnn._types.as_data_type(ct)
    assert o.nan_propagation == enums.NanPropagation.PROPAGATE_NAN


@pytest.mark.parametrize("op", list(enums.ReduceTensorOp))
def test_reduce_roundtrip(op):
    r = ReduceTensorDescriptor(op, "float64", indices="flattened", indices_type="uint16")
    assert r.op == op and r.compute_type == DataType.DOUBLE
    assert r.indices == enums.ReduceTensorIndices.FLATTENED_INDICES
    assert r.indices_type == enums.IndicesType.CUDNN_16BIT_INDICES
    assert ReduceTensorDescriptor().indices == enums.ReduceTensorIndices.NO_INDICES


def test_dropout_without_handle():
    d = DropoutDescriptor()
    assert not d.is_set
    assert repr(d) == "DropoutDescriptor(unset)"
    assert DropoutDescriptor.reserve_space_size(TensorDescriptor((2, 3, 4, 5))) > 0
    with pytest.raises(ValueError, match="needs a cuDNN handle"):
        _ = d.dropout


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
@pytest.mark.parametrize("direction", ["unidirectional", "bidirectional"])
def test_rnn_roundtrip(cell, direction):
    drop = DropoutDescriptor()
    r = RNNDescriptor(
        32,
        3,
        cell_mode=cell,
        input_size=16,
        bias_mode="single_inp",
        direction=direction,
        dtype="float16",
        math_precision="float16",
        math_type="tensor_op",
        dropout=drop,
        aux_flags="padded_io",
    )
    cfg = r.config()
    assert (
        cfg["cell_mode"]
        == enums.RNNMode[{"rnn_tanh": "RNN_TANH", "rnn_relu": "RNN_RELU"}.get(cell, cell.upper())]
    )
    assert (r.hidden_size, r.num_layers, r.input_size, r.proj_size) == (32, 3, 16, 32)
    assert r.direction == enums.DirectionMode[direction.upper()]
    assert r.bias_mode == enums.RNNBiasMode.SINGLE_INP_BIAS
    assert r.dtype == DataType.HALF and r.math_precision == DataType.HALF
    assert r.math_type == enums.MathType.TENSOR_OP_MATH
    assert r.aux_flags == 1 and cfg["dropout_ptr"] == drop.ptr
    assert r.input_mode == enums.RNNInputMode.LINEAR_INPUT and r.algo == enums.RNNAlgo.STANDARD
    del drop  # the RNN descriptor keeps its dropout descriptor alive
    assert r.config()["dropout_ptr"] != 0


def test_rnn_projection_and_clip():
    r = RNNDescriptor(64, proj_size=16, input_size=8, dtype="float64")
    assert r.proj_size == 16 and r.math_precision == DataType.DOUBLE
    assert r.clip[0] == enums.RNNClipMode.NONE
    r.set_clip("minmax", -2.5, 3.0)
    assert r.clip == (enums.RNNClipMode.MINMAX, -2.5, 3.0)
    assert "hidden_size=64" in repr(r)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize(
    "layout", ["seq_major_unpacked", "seq_major_packed", "batch_major_unpacked"]
)
def test_rnn_data_roundtrip(dtype, layout):
    # packed: sorted lengths, and cuDNN wants max_seq_length == the longest one
    packed = layout == "seq_major_packed"
    lengths, max_len = ((9, 5, 5, 1), None) if packed else ((3, 7, 0, 5), 9)
    d = RNNDataDescriptor(lengths, 12, max_len, dtype=dtype, layout=layout, padding_fill=-1.5)
    assert d.seq_lengths == lengths and d.batch_size == 4
    assert d.max_seq_length == 9 and d.vector_size == 12
    assert d.dtype == pycudnn._types.as_data_type(dtype)
    assert d.layout == enums.RNNDataLayout[layout.upper()]
    assert d.padding_fill == -1.5
    assert RNNDataDescriptor([4, 2], 3).max_seq_length == 4


def test_spatial_transformer():
    st = SpatialTransformerDescriptor((2, 3, 8, 9), "float64")
    assert st.shape == (2, 3, 8, 9) and st.dtype == DataType.DOUBLE
    assert st.sampler == enums.SamplerType.BILINEAR
    wrapped = SpatialTransformerDescriptor.from_ptr(st.ptr, owner=st)
    assert wrapped.shape is None  # cuDNN has no getter for this family


@pytest.mark.parametrize("ct", ["float32", "float64"])
def test_ctc_roundtrip(ct):
    c = CTCLossDescriptor(ct, normalization="none", grad_mode="skip_oob", max_label_length=42)
    assert c.compute_type == pycudnn._types.as_data_type(ct)
    assert c.normalization == enums.LossNormalizationMode.NONE
    assert c.grad_mode == enums.CTCGradMode.SKIP_OOB_GRADIENTS
    assert c.max_label_length == 42


def test_from_ptr_reads_through_cudnn():
    """A descriptor made elsewhere (here: by the raw API) reads correctly through its wrapper."""
    import ctypes

    from pycudnn import _lib, api

    raw = _lib.cudnnTensorDescriptor_t()
    api.cudnnCreateTensorDescriptor(ctypes.byref(raw))
    dims = (ctypes.c_int * 4)(1, 2, 3, 4)
    strides = (ctypes.c_int * 4)(24, 12, 4, 1)
    api.cudnnSetTensorNdDescriptor(raw, DataType.HALF, 4, dims, strides)
    t = TensorDescriptor.from_ptr(raw.value)
    assert (t.shape, t.dtype, t.layout) == ((1, 2, 3, 4), DataType.HALF, enums.TensorFormat.NCHW)
    assert "borrowed" in repr(t)
    t.close()  # never destroys a borrowed object
    api.cudnnDestroyTensorDescriptor(raw)


def test_no_cudnn_deprecation_warnings(monkeypatch):
    # fresh state: no deprecated function has been called (and warned about) in this process
    monkeypatch.setattr(errors, "_warned", set())
    monkeypatch.setattr(errors, "_checked", {})
    monkeypatch.setattr(errors, "_quiet", {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ConvolutionDescriptor(1).forward_output_shape(
            TensorDescriptor((1, 1, 4, 4)), FilterDescriptor((1, 1, 3, 3))
        )
        PoolingDescriptor(2).forward_output_shape(TensorDescriptor((1, 1, 4, 4)))
        TensorDescriptor.derive_bn(TensorDescriptor((1, 2, 3, 4)))
        for make in (ActivationDescriptor, ReduceTensorDescriptor, OpTensorDescriptor):
            make().close()
    # direct use of the checked raw API still warns (for a function this layer never called)
    import ctypes

    from pycudnn import api

    with pytest.warns(errors.CudnnDeprecationWarning, match="cudnnGetFilter4dDescriptor"):
        w = FilterDescriptor((1, 2, 3, 4))
        out = [ctypes.c_int() for _ in range(6)]
        api.cudnnGetFilter4dDescriptor(w, *(ctypes.byref(o) for o in out))
    assert [o.value for o in out[2:]] == [1, 2, 3, 4]


def test_only_cudnn_can_judge_gives_categorised_error():
    """What passes Python validation but breaks a cuDNN rule comes back categorised."""
    # packed RNN data needs max_seq_length == the longest sequence: a cuDNN-only rule
    with pytest.raises(errors.BadParamError) as info:
        RNNDataDescriptor([3, 2], 4, 5, layout="seq_major_packed")
    assert info.value.api == "cudnnSetRNNDataDescriptor"
    assert isinstance(info.value, ValueError)
    # a backend tensor finalized without its attributes
    with pytest.raises(errors.CudnnError) as info:
        BackendDescriptor("tensor").finalize()
    assert info.value.api == "cudnnBackendFinalize"


# -- the bad-input catalogue -----------------------------------------------------------------------
class _Handle:
    def __init__(self, ptr=1):
        self.ptr = ptr


def _prebuilt():
    return {
        "x": TensorDescriptor((2, 3, 8, 8)),
        "x3": TensorDescriptor((2, 3, 8)),
        "x5": TensorDescriptor((1, 3, 4, 4, 4)),
        "w": FilterDescriptor((4, 3, 3, 3)),
        "wbig": FilterDescriptor((4, 3, 11, 11)),
        "w5": FilterDescriptor((4, 3, 3, 3, 3)),
        "conv": ConvolutionDescriptor(0),
        "gconv": ConvolutionDescriptor(0, groups=2),
        "pool": PoolingDescriptor(2),
        "pool9": PoolingDescriptor(9),
        "closed": _closed_tensor(),
    }


def _closed_tensor():
    t = TensorDescriptor((1, 1, 1, 1))
    t.close()
    return t


# (id, callable(prebuilt), exception type, message fragment)
BAD = [
    # TensorDescriptor
    (
        "tensor-rank2",
        lambda p: TensorDescriptor((2, 3)),
        ValueError,
        "shape=(2, 3) has 2 entries; expected 3 to 8",
    ),
    ("tensor-rank9", lambda p: TensorDescriptor((1,) * 9), ValueError, "expected 3 to 8"),
    ("tensor-zero", lambda p: TensorDescriptor((2, 0, 4, 5)), ValueError, "shape[1]=0"),
    ("tensor-negative", lambda p: TensorDescriptor((2, 3, -4, 5)), ValueError, "shape[2]=-4"),
    (
        "tensor-float-size",
        lambda p: TensorDescriptor((2, 3.0, 4, 5)),
        TypeError,
        "shape[1] must be an integer",
    ),
    (
        "tensor-bool-size",
        lambda p: TensorDescriptor((2, True, 4, 5)),
        TypeError,
        "shape[1] must be an integer",
    ),
    ("tensor-shape-str", lambda p: TensorDescriptor("2345"), TypeError, "shape must be a sequence"),
    ("tensor-shape-int", lambda p: TensorDescriptor(5), TypeError, "shape must be a sequence"),
    (
        "tensor-size-overflow",
        lambda p: TensorDescriptor((1, 1, 1, 2**31)),
        OverflowError,
        "shape[3]=2147483648",
    ),
    (
        "tensor-count-overflow",
        lambda p: TensorDescriptor((2**16, 2**16, 1)),
        OverflowError,
        "4294967296 elements",
    ),
    (
        "tensor-span-overflow",
        lambda p: TensorDescriptor((4, 1, 1, 1), strides=(2**30, 1, 1, 1)),
        OverflowError,
        "spans",
    ),
    (
        "tensor-stride-len",
        lambda p: TensorDescriptor((2, 3, 4, 5), strides=(1, 1, 1)),
        ValueError,
        "expected 4",
    ),
    (
        "tensor-stride-zero",
        lambda p: TensorDescriptor((2, 3, 4, 5), strides=(60, 20, 0, 1)),
        ValueError,
        "strides[2]=0",
    ),
    (
        "tensor-stride-overflow",
        lambda p: TensorDescriptor((1, 1, 1, 1), strides=(2**31, 1, 1, 1)),
        OverflowError,
        "strides[0]",
    ),
    (
        "tensor-stride-vs-layout",
        lambda p: TensorDescriptor((2, 3, 4, 5), strides=(60, 20, 5, 1), layout="NHWC"),
        ValueError,
        "not the packed NHWC strides",
    ),
    (
        "tensor-dtype-int64",
        lambda p: TensorDescriptor((2, 3, 4, 5), "int64"),
        TypeError,
        "dtype=INT64 is not supported",
    ),
    (
        "tensor-dtype-bool",
        lambda p: TensorDescriptor((2, 3, 4, 5), np.bool_),
        TypeError,
        "dtype=BOOLEAN",
    ),
    (
        "tensor-dtype-complex",
        lambda p: TensorDescriptor((2, 3, 4, 5), np.complex64),
        TypeError,
        "dtype=",
    ),
    (
        "tensor-dtype-name",
        lambda p: TensorDescriptor((2, 3, 4, 5), "float31"),
        TypeError,
        "dtype='float31'",
    ),
    (
        "tensor-dtype-fp8",
        lambda p: TensorDescriptor((2, 3, 4, 5), DataType.FP8_E5M3),
        TypeError,
        "FP8_E5M3",
    ),
    (
        "tensor-layout-name",
        lambda p: TensorDescriptor((2, 3, 4, 5), layout="NWHC"),
        ValueError,
        "layout='NWHC'",
    ),
    (
        "tensor-layout-vect",
        lambda p: TensorDescriptor((2, 3, 4, 5), layout="NCHW_VECT_C"),
        ValueError,
        "not supported here",
    ),
    (
        "tensor-layout-type",
        lambda p: TensorDescriptor((2, 3, 4, 5), layout=1.5),
        TypeError,
        "layout=1.5",
    ),
    (
        "derive-bn-type",
        lambda p: TensorDescriptor.derive_bn(p["w"], "spatial"),
        TypeError,
        "x must be a TensorDescriptor",
    ),
    (
        "derive-bn-rank",
        lambda p: TensorDescriptor.derive_bn(p["x3"], "spatial"),
        ValueError,
        "4-D or 5-D",
    ),
    (
        "derive-bn-closed",
        lambda p: TensorDescriptor.derive_bn(p["closed"], "spatial"),
        ValueError,
        "closed",
    ),
    (
        "derive-bn-mode",
        lambda p: TensorDescriptor.derive_bn(p["x"], "batch"),
        ValueError,
        "mode='batch'",
    ),
    # FilterDescriptor
    ("filter-rank", lambda p: FilterDescriptor((3, 3)), ValueError, "expected 3 to 8"),
    ("filter-zero", lambda p: FilterDescriptor((0, 3, 3, 3)), ValueError, "shape[0]=0"),
    (
        "filter-dtype",
        lambda p: FilterDescriptor((4, 3, 3, 3), "int32"),
        TypeError,
        "dtype=INT32 is not supported",
    ),
    (
        "filter-layout",
        lambda p: FilterDescriptor((4, 3, 3, 3), layout="CHWN"),
        ValueError,
        "layout='CHWN'",
    ),
    ("filter-overflow", lambda p: FilterDescriptor((2**16, 2**15, 1)), OverflowError, "elements"),
    # ConvolutionDescriptor
    ("conv-pad-negative", lambda p: ConvolutionDescriptor(-1), ValueError, "pad=-1"),
    ("conv-pad-negative-seq", lambda p: ConvolutionDescriptor((1, -2)), ValueError, "pad[1]=-2"),
    ("conv-stride-zero", lambda p: ConvolutionDescriptor(stride=0), ValueError, "stride=0"),
    (
        "conv-dilation-zero",
        lambda p: ConvolutionDescriptor(dilation=(1, 0)),
        ValueError,
        "dilation[1]=0",
    ),
    ("conv-groups-zero", lambda p: ConvolutionDescriptor(groups=0), ValueError, "groups=0"),
    (
        "conv-groups-float",
        lambda p: ConvolutionDescriptor(groups=2.0),
        TypeError,
        "groups must be an integer",
    ),
    (
        "conv-length-mismatch",
        lambda p: ConvolutionDescriptor((1, 1), (1, 1, 1)),
        ValueError,
        "stride=(1, 1, 1) has 3 entries; expected 2",
    ),
    (
        "conv-ndim-mismatch",
        lambda p: ConvolutionDescriptor((1, 1), ndim=3),
        ValueError,
        "expected 3",
    ),
    ("conv-ndim-too-big", lambda p: ConvolutionDescriptor(0, ndim=7), OverflowError, "ndim=7"),
    (
        "conv-spatial-too-many",
        lambda p: ConvolutionDescriptor((0,) * 7),
        ValueError,
        "7 spatial dims",
    ),
    ("conv-pad-overflow", lambda p: ConvolutionDescriptor(2**31), OverflowError, "pad=2147483648"),
    (
        "conv-mode",
        lambda p: ConvolutionDescriptor(mode="correlate"),
        ValueError,
        "mode='correlate'",
    ),
    (
        "conv-mode-type",
        lambda p: ConvolutionDescriptor(mode=enums.PoolingMode.MAX),
        TypeError,
        "not a ConvolutionMode",
    ),
    (
        "conv-mode-int",
        lambda p: ConvolutionDescriptor(mode=7),
        ValueError,
        "mode=7 is not a valid ConvolutionMode",
    ),
    (
        "conv-compute",
        lambda p: ConvolutionDescriptor(compute_type="int8"),
        TypeError,
        "compute_type=INT8",
    ),
    (
        "conv-math",
        lambda p: ConvolutionDescriptor(math_type="tf32"),
        ValueError,
        "math_type='tf32'",
    ),
    (
        "conv-out-types",
        lambda p: p["conv"].forward_output_shape(p["w"], p["w"]),
        TypeError,
        "x must be a TensorDescriptor",
    ),
    (
        "conv-out-w-type",
        lambda p: p["conv"].forward_output_shape(p["x"], p["x"]),
        TypeError,
        "w must be a FilterDescriptor",
    ),
    (
        "conv-out-rank",
        lambda p: p["conv"].forward_output_shape(p["x5"], p["w5"]),
        ValueError,
        "must both have 4 dims",
    ),
    (
        "conv-out-channels",
        lambda p: p["gconv"].forward_output_shape(p["x"], p["w"]),
        ValueError,
        "x has 3 channels",
    ),
    (
        "conv-out-kernel",
        lambda p: p["conv"].forward_output_shape(p["x"], p["wbig"]),
        ValueError,
        "dilated kernel size 11 exceeds padded input size 8",
    ),
    (
        "conv-out-closed",
        lambda p: p["conv"].forward_output_shape(p["closed"], p["w"]),
        ValueError,
        "closed",
    ),
    # PoolingDescriptor
    ("pool-window-zero", lambda p: PoolingDescriptor(0), ValueError, "window=0"),
    ("pool-stride-zero", lambda p: PoolingDescriptor(2, (1, 0)), ValueError, "stride[1]=0"),
    ("pool-pad-negative", lambda p: PoolingDescriptor(2, pad=-1), ValueError, "pad=-1"),
    ("pool-length", lambda p: PoolingDescriptor((2, 2), (1, 1, 1)), ValueError, "expected 2"),
    ("pool-mode", lambda p: PoolingDescriptor(2, mode="median"), ValueError, "mode='median'"),
    (
        "pool-nan",
        lambda p: PoolingDescriptor(2, nan_propagation="sometimes"),
        ValueError,
        "nan_propagation='sometimes'",
    ),
    ("pool-window-type", lambda p: PoolingDescriptor("2"), TypeError, "window must be an integer"),
    (
        "pool-out-rank",
        lambda p: p["pool"].forward_output_shape(p["x5"]),
        ValueError,
        "must have 4 dims",
    ),
    (
        "pool-out-window",
        lambda p: p["pool9"].forward_output_shape(p["x"]),
        ValueError,
        "window 9 exceeds padded input size 8",
    ),
    (
        "pool-out-type",
        lambda p: p["pool"].forward_output_shape(p["w"]),
        TypeError,
        "x must be a TensorDescriptor",
    ),
    # ActivationDescriptor
    ("act-mode", lambda p: ActivationDescriptor("gelu"), ValueError, "mode='gelu'"),
    (
        "act-coef-nan",
        lambda p: ActivationDescriptor("elu", float("nan")),
        ValueError,
        "coef must not be NaN",
    ),
    (
        "act-coef-inf",
        lambda p: ActivationDescriptor("clipped_relu", float("inf")),
        ValueError,
        "coef=inf must be finite",
    ),
    (
        "act-coef-type",
        lambda p: ActivationDescriptor("elu", "1"),
        TypeError,
        "coef must be a real number",
    ),
    ("act-beta", lambda p: ActivationDescriptor("swish", swish_beta="x"), TypeError, "swish_beta"),
    # LRNDescriptor
    ("lrn-n-zero", lambda p: LRNDescriptor(0), ValueError, "n=0"),
    ("lrn-n-big", lambda p: LRNDescriptor(17), ValueError, "n=17 is invalid; expected 1 to 16"),
    ("lrn-beta", lambda p: LRNDescriptor(beta=0.001), ValueError, "CUDNN_LRN_MIN_BETA"),
    ("lrn-k", lambda p: LRNDescriptor(k=0.0), ValueError, "CUDNN_LRN_MIN_K"),
    (
        "lrn-alpha-nan",
        lambda p: LRNDescriptor(alpha=float("nan")),
        ValueError,
        "alpha must not be NaN",
    ),
    # OpTensor / ReduceTensor
    ("optensor-op", lambda p: OpTensorDescriptor("sub"), ValueError, "op='sub'"),
    ("optensor-type", lambda p: OpTensorDescriptor("add", "int8"), TypeError, "compute_type=INT8"),
    ("reduce-op", lambda p: ReduceTensorDescriptor("median"), ValueError, "op='median'"),
    (
        "reduce-type",
        lambda p: ReduceTensorDescriptor("add", "bfloat16"),
        TypeError,
        "compute_type=BFLOAT16",
    ),
    (
        "reduce-indices",
        lambda p: ReduceTensorDescriptor(indices="all"),
        ValueError,
        "indices='all'",
    ),
    (
        "reduce-indices-type",
        lambda p: ReduceTensorDescriptor(indices_type="int128"),
        ValueError,
        "indices_type='int128'",
    ),
    # DropoutDescriptor
    (
        "dropout-p-one",
        lambda p: DropoutDescriptor(dropout=1.0),
        ValueError,
        "dropout=1.0 is invalid",
    ),
    ("dropout-p-negative", lambda p: DropoutDescriptor(dropout=-0.1), ValueError, "[0, 1)"),
    (
        "dropout-p-type",
        lambda p: DropoutDescriptor(dropout="0.5"),
        TypeError,
        "dropout must be a real number",
    ),
    ("dropout-seed", lambda p: DropoutDescriptor(seed=-1), ValueError, "seed=-1"),
    ("dropout-seed-big", lambda p: DropoutDescriptor(seed=2**64), OverflowError, "seed="),
    (
        "dropout-states-no-handle",
        lambda p: DropoutDescriptor(states=_Handle()),
        TypeError,
        "states need a handle",
    ),
    (
        "dropout-handle-type",
        lambda p: DropoutDescriptor(handle=1234),
        TypeError,
        "handle must be an object with an int .ptr",
    ),
    (
        "dropout-no-states",
        lambda p: DropoutDescriptor(_Handle(), 0.5),
        ValueError,
        "needs a states buffer",
    ),
    (
        "dropout-states-size",
        lambda p: DropoutDescriptor(_Handle(), 0.5, _Handle(), -1),
        ValueError,
        "states_size=-1",
    ),
    (
        "dropout-states-unknown-size",
        lambda p: DropoutDescriptor(_Handle(), 0.5, _Handle()),
        TypeError,
        "states_size is required",
    ),
    (
        "dropout-reserve-type",
        lambda p: DropoutDescriptor.reserve_space_size(p["w"]),
        TypeError,
        "x must be a TensorDescriptor",
    ),
    # RNNDescriptor
    ("rnn-hidden", lambda p: RNNDescriptor(0), ValueError, "hidden_size=0"),
    ("rnn-layers", lambda p: RNNDescriptor(8, 0), ValueError, "num_layers=0"),
    ("rnn-input", lambda p: RNNDescriptor(8, input_size=-3), ValueError, "input_size=-3"),
    (
        "rnn-proj-big",
        lambda p: RNNDescriptor(8, proj_size=9),
        ValueError,
        "proj_size=9 must not exceed hidden_size=8",
    ),
    (
        "rnn-proj-gru",
        lambda p: RNNDescriptor(8, proj_size=4, cell_mode="gru"),
        ValueError,
        "only valid for LSTM",
    ),
    (
        "rnn-skip",
        lambda p: RNNDescriptor(8, input_size=4, input_mode="skip"),
        ValueError,
        "input_mode='skip' needs",
    ),
    (
        "rnn-cell",
        lambda p: RNNDescriptor(8, cell_mode="transformer"),
        ValueError,
        "cell_mode='transformer'",
    ),
    ("rnn-dtype", lambda p: RNNDescriptor(8, dtype="int8"), TypeError, "dtype=INT8"),
    (
        "rnn-math-prec",
        lambda p: RNNDescriptor(8, math_precision="float16"),
        TypeError,
        "math_precision=HALF",
    ),
    (
        "rnn-dropout-type",
        lambda p: RNNDescriptor(8, dropout=0.5),
        TypeError,
        "dropout must be a DropoutDescriptor",
    ),
    ("rnn-aux", lambda p: RNNDescriptor(8, aux_flags="packed"), ValueError, "aux_flags='packed'"),
    ("rnn-aux-negative", lambda p: RNNDescriptor(8, aux_flags=-1), ValueError, "aux_flags=-1"),
    ("rnn-direction", lambda p: RNNDescriptor(8, direction="both"), ValueError, "direction='both'"),
    ("rnn-hidden-overflow", lambda p: RNNDescriptor(2**31), OverflowError, "hidden_size"),
    # RNNDataDescriptor
    (
        "rnndata-empty",
        lambda p: RNNDataDescriptor([], 4),
        ValueError,
        "seq_lengths=() has 0 entries",
    ),
    ("rnndata-negative", lambda p: RNNDataDescriptor([3, -1], 4), ValueError, "seq_lengths[1]=-1"),
    (
        "rnndata-too-long",
        lambda p: RNNDataDescriptor([3, 9], 4, 5),
        ValueError,
        "more than max_seq_length=5",
    ),
    (
        "rnndata-all-zero",
        lambda p: RNNDataDescriptor([0, 0], 4),
        ValueError,
        "max_seq_length must be >= 1",
    ),
    ("rnndata-vector", lambda p: RNNDataDescriptor([3], 0), ValueError, "vector_size=0"),
    (
        "rnndata-overflow",
        lambda p: RNNDataDescriptor([2**16, 1], 2**15),
        OverflowError,
        "exceeds cuDNN's limit",
    ),
    ("rnndata-dtype", lambda p: RNNDataDescriptor([3], 4, dtype="int32"), TypeError, "dtype=INT32"),
    (
        "rnndata-layout",
        lambda p: RNNDataDescriptor([3], 4, layout="time_major"),
        ValueError,
        "layout='time_major'",
    ),
    (
        "rnndata-fill",
        lambda p: RNNDataDescriptor([3], 4, padding_fill="zero"),
        TypeError,
        "padding_fill",
    ),
    # SpatialTransformerDescriptor
    ("st-rank", lambda p: SpatialTransformerDescriptor((2, 3, 4)), ValueError, "expected 4"),
    ("st-zero", lambda p: SpatialTransformerDescriptor((2, 0, 4, 4)), ValueError, "shape[1]=0"),
    (
        "st-dtype",
        lambda p: SpatialTransformerDescriptor((2, 3, 4, 4), "bfloat16"),
        TypeError,
        "dtype=BFLOAT16",
    ),
    (
        "st-sampler",
        lambda p: SpatialTransformerDescriptor((2, 3, 4, 4), sampler="nearest"),
        ValueError,
        "sampler='nearest'",
    ),
    # CTCLossDescriptor
    ("ctc-type", lambda p: CTCLossDescriptor("float16"), TypeError, "compute_type=HALF"),
    (
        "ctc-label-len",
        lambda p: CTCLossDescriptor(max_label_length=0),
        ValueError,
        "max_label_length=0",
    ),
    (
        "ctc-norm",
        lambda p: CTCLossDescriptor(normalization="log"),
        ValueError,
        "normalization='log'",
    ),
    ("ctc-grad", lambda p: CTCLossDescriptor(grad_mode="clip"), ValueError, "grad_mode='clip'"),
    # BackendDescriptor (Python-side checks; attribute semantics are cuDNN's)
    ("backend-type", lambda p: BackendDescriptor("tensr"), ValueError, "descriptor_type='tensr'"),
    ("backend-type-type", lambda p: BackendDescriptor(3.0), TypeError, "descriptor_type=3.0"),
    (
        "backend-thin-shape",
        lambda p: BackendDescriptor.tensor((1, 0, 3), uid=1),
        ValueError,
        "shape[1]=0",
    ),
    (
        "backend-thin-uid",
        lambda p: BackendDescriptor.tensor((1, 2, 3), uid=-1),
        ValueError,
        "uid=-1",
    ),
    (
        "backend-thin-strides",
        lambda p: BackendDescriptor.tensor((1, 2, 3), (1, 1), uid=1),
        ValueError,
        "expected 3",
    ),
    (
        "backend-thin-conv-pad",
        lambda p: BackendDescriptor.convolution((0, -1)),
        ValueError,
        "pre_padding[1]=-1",
    ),
    (
        "backend-thin-conv-stride",
        lambda p: BackendDescriptor.convolution((0, 0), stride=(1, 0)),
        ValueError,
        "stride[1]=0",
    ),
    (
        "backend-thin-pointwise",
        lambda p: BackendDescriptor.pointwise("frobnicate"),
        ValueError,
        "mode='frobnicate'",
    ),
    (
        "backend-thin-op-types",
        lambda p: BackendDescriptor.operation_convolution_forward(p["x"], p["x"], p["x"], p["x"]),
        TypeError,
        "x must be a BackendDescriptor",
    ),
    (
        "backend-thin-graph-empty",
        lambda p: BackendDescriptor.operation_graph([]),
        TypeError,
        "ops must be a non-empty sequence",
    ),
]


@pytest.mark.parametrize(("make", "exc", "fragment"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_raises_before_any_c_call(monkeypatch, make, exc, fragment):
    pre = _prebuilt()
    with counting_c_calls(monkeypatch) as c_calls:
        c_calls.reset()
        with pytest.raises(exc) as info:
            make(pre)
        assert fragment in str(info.value)
        # a validation error is never a cuDNN error
        assert not isinstance(info.value, errors.CudnnError)
        # the shape/channel checks of forward_output_shape read the descriptors back (Get*),
        # but nothing may create, set or compute before the check fails
        assert [c for c in c_calls.calls if "Get" not in c] == [], c_calls.calls


def test_bad_backend_values_make_no_c_call(monkeypatch):
    b = BackendDescriptor("tensor")
    cases = [
        (("TENSOR_DIMENSIONS", "INT64", ["a"]), TypeError, "values[0] must be an integer"),
        (("TENSOR_DIMENSIONS", "INT32", [2**40]), OverflowError, "fit in INT32"),
        (("TENSOR_DIMENSIONS", "INT32", [np.int64(2**40)]), OverflowError, "does not fit in INT32"),
        (("TENSOR_DIMENSIONS", "INT64", [2**63]), OverflowError, "do not fit"),
        (("TENSOR_DATA_TYPE", "DATA_TYPE", "float128"), TypeError, "values[0]='float128'"),
        (("TENSOR_IS_VIRTUAL", "BOOLEAN", "yes"), TypeError, "must be a bool"),
        (("TENSOR_DIMENSIONS", "DOUBLE", ["x"]), TypeError, "must be a real number"),
        (
            ("TENSOR_DIMENSIONS", "BACKEND_DESCRIPTOR", [123]),
            TypeError,
            "must be a BackendDescriptor",
        ),
        (("TENSOR_DIMENSIONS", "FRACTION", ["1/2"]), TypeError, "must be a Fraction"),
        (("TENSOR_DIMENSIONS", "CHAR", 12), TypeError, "must be str or bytes"),
        (("TENSOR_DIMENSIONZ", "INT64", [1]), ValueError, "attribute='TENSOR_DIMENSIONZ'"),
        (("TENSOR_DIMENSIONS", "INT63", [1]), ValueError, "attr_type='INT63'"),
        (("TENSOR_DIMENSIONS", enums.DataType.FLOAT, [1]), TypeError, "not a BackendAttributeType"),
    ]
    with counting_c_calls(monkeypatch) as c_calls:
        for args, exc, fragment in cases:
            c_calls.reset()
            with pytest.raises(exc, match=fragment.replace("[", r"\[").replace("(", r"\(")):
                b.set(*args)
            assert c_calls.calls == []


def test_docs_examples_run():
    import pathlib
    import re

    doc = pathlib.Path(__file__).resolve().parents[2] / "docs" / "descriptors.md"
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S)
    assert len(blocks) >= 2
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/descriptors.md[{i}]", "exec"), {"__name__": "docs"})


# -- every framework's dtypes (issue 29): torch, numpy/CuPy, ml_dtypes, JAX, names, DataType -----
def _framework_dtypes():
    import ml_dtypes
    from _framework_dtypes import jax_numpy, torch

    jnp = jax_numpy()
    return [
        (torch.float16, DataType.HALF),
        (torch.half, DataType.HALF),
        (torch.bfloat16, DataType.BFLOAT16),
        (torch.float32, DataType.FLOAT),
        (torch.float64, DataType.DOUBLE),
        (torch.int8, DataType.INT8),
        (torch.uint8, DataType.UINT8),
        (torch.int32, DataType.INT32),
        (torch.int64, DataType.INT64),
        (torch.bool, DataType.BOOLEAN),
        (np.float16, DataType.HALF),  # CuPy's dtypes are numpy's
        (np.dtype("float32"), DataType.FLOAT),
        (ml_dtypes.bfloat16, DataType.BFLOAT16),
        (np.dtype(ml_dtypes.bfloat16), DataType.BFLOAT16),
        (jnp.float16, DataType.HALF),
        (jnp.float32, DataType.FLOAT),
        (jnp.bfloat16, DataType.BFLOAT16),
        ("torch.bfloat16", DataType.BFLOAT16),
        ("half", DataType.HALF),
        (DataType.DOUBLE, DataType.DOUBLE),
    ]


def test_the_dtype_table_takes_every_frameworks_dtypes():
    from _framework_dtypes import torch

    for given, expected in _framework_dtypes():
        assert pycudnn._types.as_data_type(given) == expected, given
    with pytest.raises(TypeError, match=r"dtype=torch\.complex64 .*torch"):
        pycudnn._types.as_data_type(torch.complex64)


@pytest.mark.parametrize("i", range(20))
def test_descriptors_take_every_frameworks_dtypes(i):
    given, expected = _framework_dtypes()[i]
    if expected not in (DataType.HALF, DataType.BFLOAT16, DataType.FLOAT, DataType.DOUBLE):
        pytest.skip("the legacy descriptors here are float")
    with TensorDescriptor((2, 3, 4, 5), given) as t:
        assert t.dtype == expected
    with FilterDescriptor((4, 3, 3, 3), given) as w:
        assert w.dtype == expected
    # the graph API's DATA_TYPE attributes (BackendDescriptor.tensor and set()); finalizing one
    # needs a GPU, so the encoding is what is checked here
    from pycudnn.descriptors import _codec

    dt = enums.BackendAttributeType.DATA_TYPE
    assert _codec.to_c(dt, given, "dtype", BackendDescriptor) == expected


def test_descriptor_refuses_a_torch_dtype_cudnn_lacks_naming_it():
    from _framework_dtypes import torch

    with pytest.raises(TypeError, match=r"torch\.complex64"):
        TensorDescriptor((2, 3, 4, 5), torch.complex64)
