"""Backend (graph API) descriptors without a GPU.

In-process: creation of every descriptor type, ``set`` with every attribute value type
(conversion from Python, prebuilt ctypes arrays), wrong attribute types giving the categorised
error, the thin constructors, references kept to descriptor-valued attributes.

Finalize and read-back need cuDNN's engine library, which loads only with a ``libcuda.so.1``:
a fixture compiles the 6-function stub of ``research/headers.md`` §7.2 with gcc into a temporary
directory and runs ``tests/support/_desc_backend_child.py`` with it on ``LD_LIBRARY_PATH``
(skipped when gcc is missing).
"""

from __future__ import annotations

import contextlib
import ctypes
import fractions
import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from pycudnn import _lib, enums, errors
from pycudnn.descriptors import BackendDescriptor
from pycudnn.enums import BackendAttributeName as A
from pycudnn.enums import BackendAttributeType as T
from pycudnn.enums import BackendDescriptorType as D

# research/headers.md §7.2 (bodies wrapped to fit the line length)
STUB_C = r"""
typedef int CUresult;
#define CUDA_ERROR_NO_DEVICE 100
CUresult cuGetErrorString(CUresult e, const char **s) {
    (void)e; if (s) *s = "stub libcuda: no device"; return 0; }
CUresult cuModuleGetFunction(void *f, void *m, const char *n) {
    (void)f; (void)m; (void)n; return CUDA_ERROR_NO_DEVICE; }
CUresult cuModuleLoadData(void *m, const void *img) {
    (void)m; (void)img; return CUDA_ERROR_NO_DEVICE; }
CUresult cuModuleUnload(void *m) { (void)m; return CUDA_ERROR_NO_DEVICE; }
CUresult cuTensorMapEncodeIm2col(void) { return CUDA_ERROR_NO_DEVICE; }
CUresult cuTensorMapEncodeTiled(void) { return CUDA_ERROR_NO_DEVICE; }
"""
CHILD = pathlib.Path(__file__).resolve().parents[1] / "support" / "_desc_backend_child.py"


@contextlib.contextmanager
def newer_than_older_runtime(what: str):
    """Skip when an older 9.x runtime (e.g. the GPU machine's 9.19) rejects something the 9.28
    headers define; with the pinned runtime (CI) every failure counts."""
    try:
        yield
    except errors.CudnnError as exc:
        runtime = _lib.cudnnGetVersion()
        if runtime < _lib.HEADER_VERSION:
            pytest.skip(
                f"cuDNN {runtime} predates {what} of the {_lib.HEADER_VERSION} headers: {exc}"
            )
        raise


@pytest.mark.parametrize("dtype", [d for d in D if d != D.INTERMEDIATE_INFO_DESCRIPTOR])
def test_create_every_type(dtype):
    with newer_than_older_runtime(dtype.name):
        b = BackendDescriptor(dtype)
    with b:
        assert b.descriptor_type == dtype
        assert b.is_finalized is False
        assert isinstance(b.ptr, int) and b.ptr
        assert repr(b) == f"BackendDescriptor({dtype.name}, not finalized)"


def test_create_unsupported_type_is_categorised():
    # cuDNN 9.28 cannot create INTERMEDIATE_INFO (4003, a host-allocation status)
    with pytest.raises(errors.CudnnError) as info:
        BackendDescriptor(D.INTERMEDIATE_INFO_DESCRIPTOR)
    assert info.value.api == "cudnnBackendCreateDescriptor"


@pytest.mark.parametrize(
    "spelling",
    ["TENSOR_DESCRIPTOR", "CUDNN_BACKEND_TENSOR_DESCRIPTOR", "tensor", "Tensor_Descriptor", 17],
)
def test_type_spellings(spelling):
    assert BackendDescriptor(spelling).descriptor_type == D.TENSOR_DESCRIPTOR


# (descriptor type, attribute, attribute type, value) that cuDNN accepts before finalize;
# together they cover every attribute value type that has a settable attribute
SETTABLE = [
    (D.TENSOR_DESCRIPTOR, A.TENSOR_DIMENSIONS, T.INT64, [1, 8, 16, 16]),
    (D.TENSOR_DESCRIPTOR, A.TENSOR_DATA_TYPE, T.DATA_TYPE, "float16"),
    (D.TENSOR_DESCRIPTOR, A.TENSOR_DATA_TYPE, T.DATA_TYPE, np.float32),
    (D.TENSOR_DESCRIPTOR, A.TENSOR_DATA_TYPE, T.DATA_TYPE, enums.DataType.BFLOAT16),
    (D.TENSOR_DESCRIPTOR, A.TENSOR_IS_VIRTUAL, T.BOOLEAN, True),
    (D.TENSOR_DESCRIPTOR, A.TENSOR_REORDERING_MODE, T.TENSOR_REORDERING_MODE, "NONE"),
    (D.POINTWISE_DESCRIPTOR, A.POINTWISE_MODE, T.POINTWISE_MODE, "relu_fwd"),
    (D.POINTWISE_DESCRIPTOR, A.POINTWISE_RELU_LOWER_CLIP, T.DOUBLE, 0.5),
    (D.POINTWISE_DESCRIPTOR, A.POINTWISE_RELU_LOWER_CLIP, T.FLOAT, 0.5),
    (D.POINTWISE_DESCRIPTOR, A.POINTWISE_NAN_PROPAGATION, T.NAN_PROPOGATION, "PROPAGATE_NAN"),
    (D.CONVOLUTION_DESCRIPTOR, A.CONVOLUTION_CONV_MODE, T.CONVOLUTION_MODE, "CROSS_CORRELATION"),
    (D.ENGINEHEUR_DESCRIPTOR, A.ENGINEHEUR_MODE, T.HEUR_MODE, enums.BackendHeurMode.MODE_A),
    (D.ENGINEHEUR_DESCRIPTOR, A.ENGINEHEUR_SM_COUNT_TARGET, T.INT32, 132),
    (D.KNOB_CHOICE_DESCRIPTOR, A.KNOB_CHOICE_KNOB_TYPE, T.KNOB_TYPE, 0),
    (D.OPERATIONGRAPH_DESCRIPTOR, A.OPERATIONGRAPH_IS_DYNAMIC_SHAPE_ENABLED, T.BOOLEAN, False),
    (D.OPERATIONGRAPH_DESCRIPTOR, A.OPERATIONGRAPH_MODE, T.OPERATIONGRAPH_MODE, 0),
    (D.EXECUTION_PLAN_DESCRIPTOR, A.EXECUTION_PLAN_CUDA_GRAPH_RETENTION, T.CUDA_GRAPH_RETENTION, 0),
    (D.EXECUTION_PLAN_DESCRIPTOR, A.EXECUTION_PLAN_JSON_REPRESENTATION, T.CHAR, "{}"),
    (D.REDUCTION_DESCRIPTOR, A.REDUCTION_OPERATOR, T.REDUCTION_OPERATOR_TYPE, "max"),
    (D.RESAMPLE_DESCRIPTOR, A.RESAMPLE_MODE, T.RESAMPLE_MODE, 0),
    (D.RESAMPLE_DESCRIPTOR, A.RESAMPLE_WINDOW_DIMS, T.FRACTION, [fractions.Fraction(3, 2), (2, 1)]),
    (D.RESAMPLE_DESCRIPTOR, A.RESAMPLE_POST_PADDINGS, T.FRACTION, [0, 1]),
    (D.RESAMPLE_DESCRIPTOR, A.RESAMPLE_PADDING_MODE, T.PADDING_MODE, 0),
    (D.OPERATION_SIGNAL_DESCRIPTOR, A.OPERATION_SIGNAL_MODE, T.SIGNAL_MODE, 0),
    (D.OPERATION_RESHAPE_DESCRIPTOR, A.OPERATION_RESHAPE_MODE, T.RESHAPE_MODE, 0),
    (D.RNG_DESCRIPTOR, A.RNG_DISTRIBUTION, T.RNG_DISTRIBUTION, 0),
    (D.OPERATION_GEN_STATS_DESCRIPTOR, A.OPERATION_GENSTATS_MODE, T.GENSTATS_MODE, 0),
    (
        D.OPERATION_BN_FINALIZE_STATISTICS_DESCRIPTOR,
        A.OPERATION_BN_FINALIZE_STATS_MODE,
        T.BN_FINALIZE_STATS_MODE,
        0,
    ),
    (D.OPERATION_NORM_FORWARD_DESCRIPTOR, A.OPERATION_NORM_FWD_MODE, T.NORM_MODE, 0),
    (D.OPERATION_NORM_FORWARD_DESCRIPTOR, A.OPERATION_NORM_FWD_PHASE, T.NORM_FWD_PHASE, 0),
    (
        D.OPERATION_MOE_GROUPED_MATMUL_DESCRIPTOR,
        A.OPERATION_MOE_GROUPED_MATMUL_MODE,
        T.MOE_GROUPED_MATMUL_MODE,
        0,
    ),
    (D.VARIANT_PACK_DESCRIPTOR, A.VARIANT_PACK_UNIQUE_IDS, T.INT64, [1, 2, 3]),
    (D.VARIANT_PACK_DESCRIPTOR, A.VARIANT_PACK_DATA_POINTERS, T.VOID_PTR, [0x1000, 0x2000, None]),
    (D.VARIANT_PACK_DESCRIPTOR, A.VARIANT_PACK_WORKSPACE, T.VOID_PTR, 0),
]


@pytest.mark.parametrize(
    ("dtype", "attr", "atype", "value"), SETTABLE, ids=lambda v: getattr(v, "name", None)
)
def test_set_every_value_type(dtype, attr, atype, value):
    b = BackendDescriptor(dtype)
    with newer_than_older_runtime(attr.name):
        b.set(attr, atype, value)
    # names work as well as members
    b.set(attr.name, atype.c_name, value)


def test_every_attribute_type_converts_and_reaches_cudnn():
    """Types without a settable attribute still convert; cuDNN's verdict is categorised."""
    covered = {row[2] for row in SETTABLE} | {T.BACKEND_DESCRIPTOR, T.HANDLE}
    rest = [t for t in T if t not in covered]
    assert set(rest) <= {T.NUMERICAL_NOTE, T.LAYOUT_TYPE, T.ATTRIB_NAME, T.BEHAVIOR_NOTE}
    b = BackendDescriptor("tensor")
    for t in rest:
        with pytest.raises(errors.BadParamError) as info:
            b.set(A.TENSOR_DIMENSIONS, t, [0])
        assert info.value.status == enums.Status.BAD_PARAM_ATTRIBUTE_TYPE


def test_handle_attribute_null_is_categorised():
    g = BackendDescriptor("operationgraph")
    with pytest.raises(errors.BadParamError):
        g.set(A.OPERATIONGRAPH_HANDLE, T.HANDLE, None)


def test_wrong_attribute_type_is_categorised():
    b = BackendDescriptor("tensor")
    with pytest.raises(errors.BadParamError) as info:
        b.set("TENSOR_UNIQUE_ID", "DOUBLE", 1.0)
    assert info.value.status == enums.Status.BAD_PARAM_ATTRIBUTE_TYPE
    assert info.value.api == "cudnnBackendSetAttribute"
    assert isinstance(info.value, ValueError)  # BadParamError is also a ValueError


def test_get_before_finalize_is_categorised():
    b = BackendDescriptor.tensor((1, 2, 3), uid=1, finalize=False)
    with pytest.raises(errors.CudnnError) as info:
        b.get("TENSOR_DIMENSIONS", "INT64", 3)
    assert info.value.api == "cudnnBackendGetAttribute"
    with pytest.raises(TypeError, match="descriptor_type is required"):
        b.get("TENSOR_RAGGED_OFFSET_DESC", "BACKEND_DESCRIPTOR", 1)


def test_prebuilt_ctypes_values_pass_through():
    b = BackendDescriptor("tensor")
    b.set(A.TENSOR_DIMENSIONS, T.INT64, (ctypes.c_int64 * 4)(1, 2, 3, 4))
    b.set(A.TENSOR_UNIQUE_ID, T.INT64, ctypes.c_int64(7))
    b.set(A.TENSOR_DATA_TYPE, T.DATA_TYPE, ctypes.c_int(int(enums.DataType.FLOAT)))
    b.set(A.TENSOR_IS_VIRTUAL, T.BOOLEAN, ctypes.c_bool(False))
    r = BackendDescriptor("resample")
    r.set(A.RESAMPLE_WINDOW_DIMS, T.FRACTION, _lib.cudnnFraction_t(2, 1))


def test_descriptor_values_are_kept_alive():
    import gc
    import weakref

    x = BackendDescriptor.tensor((1, 8, 4, 4), uid=1, finalize=False)
    ref = weakref.ref(x)
    op = BackendDescriptor("operation_pointwise")
    op.set(A.OPERATION_POINTWISE_XDESC, T.BACKEND_DESCRIPTOR, x)
    del x
    gc.collect()
    assert ref() is not None
    # re-setting the attribute releases the previous value
    op.set(A.OPERATION_POINTWISE_XDESC, T.BACKEND_DESCRIPTOR, BackendDescriptor("tensor"))
    gc.collect()
    assert ref() is None


def test_thin_constructors_without_finalize():
    x = BackendDescriptor.tensor((2, 3, 8, 8), dtype="float16", uid=1, finalize=False)
    w = BackendDescriptor.tensor(
        (4, 3, 3, 3), (27, 1, 9, 3), dtype=enums.DataType.HALF, uid=2, finalize=False
    )
    y = BackendDescriptor.tensor(
        (2, 4, 6, 6), dtype="float16", uid=3, is_virtual=True, finalize=False
    )
    conv = BackendDescriptor.convolution(
        (0, 0), stride=1, dilation=(1, 1), mode="conv", finalize=False
    )
    assert conv.descriptor_type == D.CONVOLUTION_DESCRIPTOR
    pw = BackendDescriptor.pointwise(
        "relu_fwd", relu_lower_clip=0.0, swish_beta=1.0, finalize=False
    )
    assert pw.descriptor_type == D.POINTWISE_DESCRIPTOR
    # operation descriptors accept non-finalized inputs at set time; cuDNN checks at finalize
    for make in (
        BackendDescriptor.operation_convolution_forward,
        BackendDescriptor.operation_convolution_backward_data,
        BackendDescriptor.operation_convolution_backward_filter,
    ):
        op = make(x, w, y, conv, alpha=1.0, beta=0.0, finalize=False)
        assert op.is_finalized is False
    with pytest.raises(ValueError, match="must be a CONVOLUTION_DESCRIPTOR"):
        BackendDescriptor.operation_convolution_forward(x, w, y, pw, finalize=False)
    with pytest.raises(ValueError, match="must be a TENSOR_DESCRIPTOR"):
        BackendDescriptor.operation_pointwise(pw, conv, y, finalize=False)


def test_from_ptr_backend():
    b = BackendDescriptor("tensor")
    v = BackendDescriptor.from_ptr(b.ptr, owner=b, descriptor_type="tensor", finalized=False)
    assert v.descriptor_type == D.TENSOR_DESCRIPTOR and not v.owned
    v.set("TENSOR_UNIQUE_ID", "INT64", 3)
    v.close()
    u = BackendDescriptor.from_ptr(b.ptr)
    assert u.descriptor_type is None and u.is_finalized is None
    assert "unknown" in repr(u)


@pytest.fixture(scope="session")
def stub_libcuda(tmp_path_factory):
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("needs gcc to build the stub libcuda.so.1")
    d = tmp_path_factory.mktemp("stub_libcuda")
    (d / "stub.c").write_text(STUB_C)
    subprocess.run(
        [
            gcc,
            "-shared",
            "-fPIC",
            "-Wl,-soname,libcuda.so.1",
            "-o",
            str(d / "libcuda.so.1"),
            str(d / "stub.c"),
        ],
        check=True,
        capture_output=True,
    )
    return d


def test_finalize_and_read_back_with_stub_libcuda(stub_libcuda):
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (str(stub_libcuda), env.get("LD_LIBRARY_PATH")) if p
    )
    proc = subprocess.run(
        [sys.executable, str(CHILD)], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["finalized"] == [True] * 8
    assert out["x_dims"] == [1, 8, 16, 16]
    assert out["x_strides"] == [2048, 256, 16, 1]
    assert out["w_strides"] == [72, 1, 24, 8]
    assert out["x_dtype"] == [int(enums.DataType.HALF)]
    assert out["x_uid"] == [1]
    assert out["y_virtual"] == [True]
    assert out["conv_dilations"] == [1, 1] and out["conv_strides"] == [1, 1]
    assert out["conv_pre"] == [1, 1] and out["conv_dims"] == [2]
    assert out["conv_comp"] == [int(enums.DataType.FLOAT)]
    assert out["op_alpha"] == [0.5] and out["op_beta"] == [0.25]
    # cuDNN hands back its own (finalized) copy of the op's input tensor
    assert out["op_x_dims"][-3:] == [8, 16, 16]
    assert out["graph_engines"][0] >= 1
    assert out["wrong_type_get"] == {"error": "BadParamError", "status": 2010}
    assert out["set_after_finalize"]["error"] == "BadParamError"
    assert out["heur_results"] == 0  # no device, so no engine configurations
    assert out["engine_index"] == [0]
    assert out["resample_finalize"] is True
    assert out["resample_window"] == ["2", "3"]
    # reading an attribute cuDNN does not expose is categorised, not a crash
    assert out["x_align"]["error"] in ("NotSupportedError", "BadParamError")
