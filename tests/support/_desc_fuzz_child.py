"""Child process for property-based fuzzing of every descriptor constructor (hypothesis).

Run as ``python _desc_fuzz_child.py EXAMPLES``. Each constructor and helper gets arbitrary (also
invalid) arguments, mixed with plausible ones so that many cases reach cuDNN. Every outcome
must be a result or one of the documented exceptions: ``TypeError``, ``ValueError``,
``OverflowError`` (validation) or a ``CudnnError`` (cuDNN's verdict). Anything else fails the
run (exit 1, with hypothesis' minimal example); a crash shows as a signal in the parent. Prints
one JSON line: cases per target and outcome counts.

Raw addresses (``from_ptr``, HANDLE/VOID_PTR attribute values) are trusted by design and not
fuzzed: no binding can tell a valid C pointer from a random integer.
"""

from __future__ import annotations

import collections
import json
import sys

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pycudnn import _resource, enums, errors
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

DOCUMENTED = (TypeError, ValueError, OverflowError, errors.CudnnError)
CASES: collections.Counter[str] = collections.Counter()
OUTCOMES: collections.Counter[str] = collections.Counter()

# -- strategies ------------------------------------------------------------------------------------
ALL_ENUMS = [
    m
    for cls in (
        enums.DataType,
        enums.PoolingMode,
        enums.TensorFormat,
        enums.ConvolutionMode,
        enums.MathType,
        enums.RNNMode,
        enums.BackendAttributeType,
        enums.PointwiseMode,
    )
    for m in cls
]
big_ints = st.integers(min_value=-(2**65), max_value=2**65)
small_ints = st.integers(min_value=-3, max_value=40)
anything = st.one_of(
    st.none(),
    st.booleans(),
    big_ints,
    small_ints,
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.binary(max_size=8),
    st.lists(small_ints, max_size=10),
    st.tuples(small_ints, small_ints, small_ints, small_ints),
    st.lists(big_ints, max_size=9),
    st.sampled_from(ALL_ENUMS),
    st.sampled_from(
        [
            np.float32,
            np.int64,
            np.complex64,
            "float16",
            "bfloat16",
            "nchw",
            "NHWC",
            "max",
            "relu",
            "lstm",
            "conv",
            "cross",
            "tensor",
            "float",
            np.int32(3),
        ]
    ),
    st.just(object()),
)


def maybe(valid):
    """Plausible values five times in six, anything at all otherwise (so that whole argument
    sets are often valid and reach cuDNN, while every argument is also tried with garbage)."""
    return st.integers(0, 5).flatmap(lambda i: anything if i == 0 else valid)


dims = st.lists(st.integers(min_value=1, max_value=12), min_size=3, max_size=8)
dtypes = st.sampled_from(
    [
        "float32",
        "float64",
        "float16",
        "bfloat16",
        "int8",
        "uint8",
        "int32",
        "int64",
        "bool",
        enums.DataType.FP8_E4M3,
        np.float32,
        np.uint8,
    ]
)
spatial = st.one_of(
    st.integers(min_value=0, max_value=4),
    st.lists(st.integers(min_value=0, max_value=4), min_size=1, max_size=6),
)


def outcome(target, fn, *args, **kwargs):
    CASES[target] += 1
    try:
        result = fn(*args, **kwargs)
    except DOCUMENTED as exc:
        OUTCOMES[type(exc).__name__] += 1
        return None
    OUTCOMES["ok"] += 1
    if isinstance(result, _resource.Resource):
        repr(result)  # repr reads back through cuDNN: must work on anything we built
        result.close()
    return result


SETTINGS = settings(
    max_examples=int(sys.argv[1]) if len(sys.argv) > 1 else 200,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


# -- targets ---------------------------------------------------------------------------------------
@SETTINGS
@given(
    shape=maybe(dims),
    dtype=maybe(dtypes),
    strides=st.one_of(st.none(), maybe(dims)),
    layout=st.one_of(st.none(), maybe(st.sampled_from(["NCHW", "NHWC", "nchw_vect_c"]))),
)
def fuzz_tensor(shape, dtype, strides, layout):
    outcome("TensorDescriptor", TensorDescriptor, shape, dtype, strides, layout)


@SETTINGS
@given(shape=maybe(dims), dtype=maybe(dtypes), layout=maybe(st.sampled_from(["NCHW", "NHWC"])))
def fuzz_filter(shape, dtype, layout):
    outcome("FilterDescriptor", FilterDescriptor, shape, dtype, layout)


@SETTINGS
@given(
    pad=maybe(spatial),
    stride=maybe(spatial),
    dilation=maybe(spatial),
    mode=maybe(st.sampled_from(["conv", "cross"])),
    compute=maybe(dtypes),
    groups=maybe(st.integers(0, 8)),
    math=maybe(st.sampled_from(["default", "fma"])),
    ndim=st.one_of(st.none(), maybe(st.integers(0, 7))),
)
def fuzz_conv(pad, stride, dilation, mode, compute, groups, math, ndim):
    outcome(
        "ConvolutionDescriptor",
        ConvolutionDescriptor,
        pad,
        stride,
        dilation,
        mode=mode,
        compute_type=compute,
        groups=groups,
        math_type=math,
        ndim=ndim,
    )


@st.composite
def conv_case(draw):
    n = draw(st.integers(1, 3))
    groups = draw(st.integers(1, 3))
    cg = draw(st.integers(1, 3))
    c = cg * groups if draw(st.integers(0, 4)) else draw(st.integers(1, 9))
    k = groups * draw(st.integers(1, 3)) if draw(st.integers(0, 4)) else draw(st.integers(1, 9))
    xs = (draw(st.integers(1, 3)), c, *draw(st.lists(st.integers(1, 12), min_size=n, max_size=n)))
    ws = (k, cg, *draw(st.lists(st.integers(1, 6), min_size=n, max_size=n)))
    pad = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    stride = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    dil = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    if not draw(st.integers(0, 9)):  # sometimes a rank mismatch
        ws = (*ws, 1)
    return xs, ws, pad, stride, dil, groups


@SETTINGS
@given(case=conv_case())
def fuzz_conv_output(case):
    xs, ws, pad, stride, dilation, groups = case
    x, w = TensorDescriptor(xs), FilterDescriptor(ws)
    c = ConvolutionDescriptor(pad, stride, dilation, groups=groups)
    shape = outcome("ConvolutionDescriptor.forward_output_shape", c.forward_output_shape, x, w)
    if shape is not None:  # cuDNN and the Python formula agree
        for i in range(len(pad)):
            eff = dilation[i] * (ws[i + 2] - 1) + 1
            assert shape[i + 2] == (xs[i + 2] + 2 * pad[i] - eff) // stride[i] + 1, case
    for d in (x, w, c):
        d.close()


@SETTINGS
@given(
    window=maybe(spatial),
    stride=st.one_of(st.none(), maybe(spatial)),
    pad=maybe(spatial),
    mode=maybe(st.sampled_from(["max", "average_exc_pad"])),
    nan=maybe(st.booleans()),
    ndim=st.one_of(st.none(), maybe(st.integers(0, 7))),
)
def fuzz_pool(window, stride, pad, mode, nan, ndim):
    outcome(
        "PoolingDescriptor",
        PoolingDescriptor,
        window,
        stride,
        pad,
        mode=mode,
        nan_propagation=nan,
        ndim=ndim,
    )


@st.composite
def pool_case(draw):
    n = draw(st.integers(1, 3))
    xs = (2, 3, *draw(st.lists(st.integers(1, 12), min_size=n, max_size=n)))
    win = draw(st.lists(st.integers(1, 6), min_size=n, max_size=n))
    stride = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    pad = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    return xs, win, stride, pad


@SETTINGS
@given(case=pool_case())
def fuzz_pool_output(case):
    xs, window, stride, pad = case
    x = TensorDescriptor(xs)
    if any(pd >= w for pd, w in zip(pad, window, strict=True)):
        # a window could lie wholly in the padding: refused before any C call (issue 42)
        try:
            PoolingDescriptor(window, stride, pad)
        except ValueError as exc:
            assert "is not smaller than window" in str(exc), exc
        else:
            raise AssertionError(f"pad={pad} not below window={window} was accepted")
        x.close()
        return
    p = PoolingDescriptor(window, stride, pad)
    shape = outcome("PoolingDescriptor.forward_output_shape", p.forward_output_shape, x)
    if shape is not None:
        for i in range(len(window)):
            assert shape[i + 2] == (xs[i + 2] + 2 * pad[i] - window[i]) // stride[i] + 1, case
    x.close()
    p.close()


@SETTINGS
@given(xs=dims, mode=maybe(st.sampled_from(["spatial", "per_activation"])))
def fuzz_derive_bn(xs, mode):
    try:
        x = TensorDescriptor(xs)
    except DOCUMENTED:
        return
    outcome("TensorDescriptor.derive_bn", TensorDescriptor.derive_bn, x, mode)
    x.close()


@SETTINGS
@given(
    mode=maybe(st.sampled_from(["relu", "elu", "swish"])),
    coef=maybe(st.floats(-10, 10)),
    nan=maybe(st.booleans()),
    beta=st.one_of(st.none(), maybe(st.floats(-5, 5))),
)
def fuzz_activation(mode, coef, nan, beta):
    outcome(
        "ActivationDescriptor",
        ActivationDescriptor,
        mode,
        coef,
        nan_propagation=nan,
        swish_beta=beta,
    )


@SETTINGS
@given(
    n=maybe(st.integers(0, 20)),
    a=maybe(st.floats(-1, 1)),
    b=maybe(st.floats(0, 2)),
    k=maybe(st.floats(0, 3)),
)
def fuzz_lrn(n, a, b, k):
    outcome("LRNDescriptor", LRNDescriptor, n, a, b, k)


@SETTINGS
@given(
    op=maybe(st.sampled_from(["add", "mul", "sqrt", "not"])),
    ct=maybe(dtypes),
    nan=maybe(st.booleans()),
)
def fuzz_optensor(op, ct, nan):
    outcome("OpTensorDescriptor", OpTensorDescriptor, op, ct, nan_propagation=nan)


@SETTINGS
@given(
    op=maybe(st.sampled_from(["add", "max", "amax", "norm2"])),
    ct=maybe(dtypes),
    ind=maybe(st.booleans()),
    it=maybe(st.sampled_from(["uint32", "uint8"])),
)
def fuzz_reduce(op, ct, ind, it):
    outcome("ReduceTensorDescriptor", ReduceTensorDescriptor, op, ct, indices=ind, indices_type=it)


@SETTINGS
@given(p=maybe(st.floats(-1, 2)), seed=maybe(st.integers(-5, 2**65)))
def fuzz_dropout(p, seed):
    # no handle here (none without a GPU); handle paths are in test_descriptors_gpu.py
    outcome("DropoutDescriptor", DropoutDescriptor, None, p, seed=seed)


@SETTINGS
@given(
    hidden=maybe(st.integers(0, 64)),
    layers=maybe(st.integers(0, 4)),
    cell=maybe(st.sampled_from(["lstm", "gru", "rnn_tanh"])),
    inp=st.one_of(st.none(), maybe(st.integers(0, 64))),
    proj=st.one_of(st.none(), maybe(st.integers(0, 64))),
    bias=maybe(st.sampled_from(["double", "none"])),
    direction=maybe(st.sampled_from(["unidirectional", "bidirectional"])),
    input_mode=maybe(st.sampled_from(["linear", "skip"])),
    dtype=maybe(dtypes),
    mp=st.one_of(st.none(), maybe(dtypes)),
    aux=maybe(st.sampled_from([0, 1, "padded_io"])),
    with_dropout=st.booleans(),
)
def fuzz_rnn(
    hidden, layers, cell, inp, proj, bias, direction, input_mode, dtype, mp, aux, with_dropout
):
    drop = DropoutDescriptor() if with_dropout else None
    outcome(
        "RNNDescriptor",
        RNNDescriptor,
        hidden,
        layers,
        cell_mode=cell,
        input_size=inp,
        proj_size=proj,
        bias_mode=bias,
        direction=direction,
        input_mode=input_mode,
        dtype=dtype,
        math_precision=mp,
        aux_flags=aux,
        dropout=drop,
    )
    if drop is not None:
        drop.close()


@SETTINGS
@given(
    lengths=maybe(st.lists(st.integers(-1, 12), min_size=0, max_size=10)),
    vec=maybe(st.integers(0, 64)),
    mx=st.one_of(st.none(), maybe(st.integers(-1, 14))),
    dtype=maybe(dtypes),
    layout=maybe(
        st.sampled_from(["seq_major_packed", "seq_major_unpacked", "batch_major_unpacked"])
    ),
    fill=maybe(st.floats(allow_nan=False)),
)
def fuzz_rnn_data(lengths, vec, mx, dtype, layout, fill):
    outcome(
        "RNNDataDescriptor",
        RNNDataDescriptor,
        lengths,
        vec,
        mx,
        dtype=dtype,
        layout=layout,
        padding_fill=fill,
    )


@SETTINGS
@given(
    shape=maybe(st.lists(st.integers(0, 9), min_size=3, max_size=5)),
    dtype=maybe(dtypes),
    sampler=maybe(st.just("bilinear")),
)
def fuzz_spatial_transformer(shape, dtype, sampler):
    outcome("SpatialTransformerDescriptor", SpatialTransformerDescriptor, shape, dtype, sampler)


@SETTINGS
@given(
    ct=maybe(dtypes),
    norm=maybe(st.sampled_from(["softmax", "none"])),
    grad=maybe(st.sampled_from(["zero_oob", "skip_oob"])),
    mll=maybe(st.integers(-2, 300)),
)
def fuzz_ctc(ct, norm, grad, mll):
    outcome(
        "CTCLossDescriptor",
        CTCLossDescriptor,
        ct,
        normalization=norm,
        grad_mode=grad,
        max_label_length=mll,
    )


SAFE_ATTR_TYPES = [
    t
    for t in enums.BackendAttributeType
    if t not in (enums.BackendAttributeType.HANDLE, enums.BackendAttributeType.VOID_PTR)
]


@SETTINGS
@given(
    dtype=maybe(st.sampled_from(list(enums.BackendDescriptorType))),
    attr=maybe(st.sampled_from(list(enums.BackendAttributeName))),
    atype=st.sampled_from(SAFE_ATTR_TYPES),
    values=st.one_of(anything, st.lists(st.integers(-(2**64), 2**64), max_size=9)),
    use_desc=st.booleans(),
    count=st.integers(0, 16),
    finalize=st.booleans(),
)
def fuzz_backend(dtype, attr, atype, values, use_desc, count, finalize):
    try:
        b = BackendDescriptor(dtype)
    except DOCUMENTED:
        CASES["BackendDescriptor (create rejected)"] += 1
        return
    other = BackendDescriptor("tensor")
    if use_desc and atype == enums.BackendAttributeType.BACKEND_DESCRIPTOR:
        values = [other]
    outcome("BackendDescriptor.set", b.set, attr, atype, values)
    if finalize:
        outcome("BackendDescriptor.finalize", b.finalize)
    if atype != enums.BackendAttributeType.BACKEND_DESCRIPTOR:
        outcome("BackendDescriptor.get", b.get, attr, atype, count)
    b.close()
    other.close()


@SETTINGS
@given(
    shape=maybe(st.lists(st.integers(0, 9), min_size=0, max_size=9)),
    strides=st.one_of(st.none(), maybe(dims)),
    dtype=maybe(dtypes),
    uid=maybe(st.integers(-1, 2**64)),
    align=maybe(st.integers(-1, 64)),
    pre=maybe(spatial),
    stride=maybe(spatial),
    pw=maybe(st.sampled_from(["add", "relu_fwd"])),
)
def fuzz_backend_thin(shape, strides, dtype, uid, align, pre, stride, pw):
    outcome(
        "BackendDescriptor.tensor",
        BackendDescriptor.tensor,
        shape,
        strides,
        dtype,
        uid=uid,
        alignment=align,
        finalize=False,
    )
    outcome(
        "BackendDescriptor.convolution",
        BackendDescriptor.convolution,
        pre,
        None,
        stride,
        finalize=False,
    )
    outcome("BackendDescriptor.pointwise", BackendDescriptor.pointwise, pw, dtype, finalize=False)


TARGETS = [v for k, v in dict(globals()).items() if k.startswith("fuzz_")]


def main() -> None:
    for target in TARGETS:
        target()
    import gc

    gc.collect()
    print(
        json.dumps(
            {
                "cases": sum(CASES.values()),
                "per_target": dict(sorted(CASES.items())),
                "outcomes": dict(OUTCOMES),
                "live": _resource.live_counts(),
            }
        )
    )


if __name__ == "__main__":
    main()
