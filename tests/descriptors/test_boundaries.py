"""Every boundary validated (issue 16), without a GPU: descriptor-valued backend attributes against
the table generated from cuDNN's documentation, handle arguments, ``pycudnn.api``'s argument
guard, enum/dtype arguments from their own class only, empty spatial tuples.

Each refused input is checked to make no C call (``counting_c_calls``) where it would have reached
cuDNN before.
"""

from __future__ import annotations

import ctypes
import re
import subprocess
import sys
import timeit
from pathlib import Path

import numpy as np
import pytest
from _desc_shim import counting_c_calls

import pycudnn
from pycudnn import _lib, api, enums, errors
from pycudnn._generated import backend_attrs as _attrs
from pycudnn._types import as_data_type
from pycudnn.descriptors import (
    BackendDescriptor,
    ConvolutionDescriptor,
    DropoutDescriptor,
    FilterDescriptor,
    PoolingDescriptor,
    RNNDataDescriptor,
    RNNDescriptor,
    TensorDescriptor,
    _codec,
    _validate,
)
from pycudnn.enums import BackendAttributeName as A
from pycudnn.enums import BackendAttributeType as T
from pycudnn.enums import BackendDescriptorType as D
from pycudnn.handle import Handle

ROOT = Path(__file__).resolve().parents[2]


# -- the attribute table ---------------------------------------------------------------------------
def test_every_attribute_has_an_owner_and_the_table_is_total():
    owned = {n for names in _attrs.ATTRIBUTES.values() for n in names}
    assert owned == set(A.__members__), set(A.__members__) ^ owned
    assert set(_codec.OWNER) == {int(a) for a in A}
    for owner in _attrs.ATTRIBUTES:
        assert f"{owner}_DESCRIPTOR" in D.__members__, owner


# names that say "descriptor" but document another type (checked against the header below)
_NOT_DESCRIPTOR_VALUED = {"OPERATION_CONCAT_INPLACE_INDEX"}
_DESCRIPTOR_NAME = re.compile(r"(DESC|DESCS|_DESCRIPTOR|_GRAPH|_OPS|_RESULTS|_ENGINE|_CONFIG)$")


def test_every_descriptor_valued_attribute_has_an_entry():
    """Each attribute whose name says it holds descriptors is in TAKES, with known types."""
    named = {n for n in A.__members__ if _DESCRIPTOR_NAME.search(n)}
    missing = named - set(_attrs.TAKES) - _NOT_DESCRIPTOR_VALUED
    assert not missing, missing
    for name, types in _attrs.TAKES.items():
        assert name in A.__members__, name
        assert types, name
        for t in types:
            assert t == "OPERATION_*" or f"{t}_DESCRIPTOR" in D.__members__, (name, t)
    # the ones the documentation spells out, spot-checked
    assert _attrs.TAKES["OPERATION_POINTWISE_XDESC"] == ("TENSOR",)
    assert _attrs.TAKES["OPERATION_POINTWISE_PW_DESCRIPTOR"] == ("POINTWISE",)
    assert _attrs.TAKES["OPERATION_CONVOLUTION_FORWARD_CONV_DESC"] == ("CONVOLUTION",)
    assert _attrs.TAKES["EXECUTION_PLAN_ENGINE_CONFIG"] == ("ENGINECFG",)
    assert _attrs.TAKES["ENGINEHEUR_RESULTS"] == ("ENGINECFG",)
    assert _attrs.TAKES["OPERATIONGRAPH_OPS"] == ("OPERATION_*",)
    assert _attrs.TAKES["OPERATION_RNG_SEED"] == ("TENSOR",)


def _header() -> Path | None:
    try:
        import nvidia.cudnn
    except ImportError:
        return None
    path = Path(next(iter(nvidia.cudnn.__path__))) / "include" / "cudnn_graph.h"
    return path if path.exists() else None


def test_table_is_generated_from_the_installed_headers():
    header = _header()
    if header is None or f'"{_attrs.HEADER_VERSION}"' not in _header_version_line(header):
        pytest.skip("the nvidia-cudnn wheel's cudnn_graph.h of the table's version is not here")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_backend_attrs.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # and every attribute the header documents as CUDNN_TYPE_BACKEND_DESCRIPTOR is in TAKES
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import gen_backend_attrs as gen
    finally:
        sys.path.pop(0)
    attrs, docs, _descs = gen.parse(header.read_text())
    documented = {n for n, (_o, doc) in docs.items() if "CUDNN_TYPE_BACKEND_DESCRIPTOR" in doc}
    assert documented and documented <= set(_attrs.TAKES), documented - set(_attrs.TAKES)
    assert len(attrs) == len(A)


def _header_version_line(header: Path) -> str:
    text = header.read_text()
    keys = ("MAJOR", "MINOR", "PATCH")
    parts = [re.search(rf"#define CUDNN_GRAPH_{k} (\d+)", text) for k in keys]
    return '"' + ".".join(m[1] for m in parts if m) + '"'


# -- descriptor-valued attributes ------------------------------------------------------------------
def _desc(dtype: D) -> BackendDescriptor:
    return BackendDescriptor(dtype)


@pytest.mark.parametrize("name", sorted(_attrs.TAKES), ids=str)
def test_wrong_descriptor_type_is_refused_without_a_c_call(name, monkeypatch):
    attr = A[name]
    owner = _desc(_codec.OWNER[int(attr)])
    allowed = _codec.TAKES[int(attr)]
    wrong = next(d for d in (D.ENGINE_DESCRIPTOR, D.TENSOR_DESCRIPTOR) if d not in allowed)
    value = _desc(wrong)
    with counting_c_calls(monkeypatch) as c_calls:
        with pytest.raises(TypeError, match=f"{name} takes .*not {wrong.name}"):
            owner.set(attr, T.BACKEND_DESCRIPTOR, value)
        with pytest.raises(TypeError, match=f"{name} takes"):
            owner.set(attr, T.BACKEND_DESCRIPTOR, [value])
        with pytest.raises(ValueError, match="its own attribute value"):
            owner.set(attr, T.BACKEND_DESCRIPTOR, owner)
        assert c_calls.calls == []
    # a descriptor of an allowed type passes the check (cuDNN may still refuse, categorised)
    try:
        good = _desc(sorted(allowed)[0])  # (INTERMEDIATE_INFO cannot be created)
        owner.set(attr, T.BACKEND_DESCRIPTOR, good)
    except errors.CudnnError:
        pass


def test_issue_reproducers_are_refused():
    # was SIGSEGV: an engine descriptor as the pointwise operation's input tensor
    op = BackendDescriptor("operation_pointwise")
    with pytest.raises(TypeError, match="OPERATION_POINTWISE_XDESC takes TENSOR_DESCRIPTOR"):
        op.set("OPERATION_POINTWISE_XDESC", "BACKEND_DESCRIPTOR", BackendDescriptor("engine"))
    # was SIGABRT: an operation descriptor as its own input
    with pytest.raises(ValueError, match="own attribute value"):
        op.set("OPERATION_POINTWISE_XDESC", "BACKEND_DESCRIPTOR", op)
    g = BackendDescriptor("operationgraph")
    with pytest.raises(ValueError, match="own attribute value"):
        g.set("OPERATIONGRAPH_OPS", "BACKEND_DESCRIPTOR", [g])
    with pytest.raises(TypeError, match="OPERATIONGRAPH_OPS takes an OPERATION"):
        g.set("OPERATIONGRAPH_OPS", "BACKEND_DESCRIPTOR", [BackendDescriptor("tensor")])


def test_other_descriptor_value_errors(monkeypatch):
    op = BackendDescriptor("operation_pointwise")
    closed = BackendDescriptor("tensor")
    closed.close()
    tensor, legacy = BackendDescriptor("tensor"), TensorDescriptor((1, 1, 1))
    with counting_c_calls(monkeypatch) as c_calls:
        with pytest.raises(ValueError, match="closed"):
            op.set("OPERATION_POINTWISE_XDESC", "BACKEND_DESCRIPTOR", closed)
        with pytest.raises(TypeError, match="not a descriptor-valued attribute"):
            op.set("OPERATION_POINTWISE_ALPHA1", "BACKEND_DESCRIPTOR", tensor)
        with pytest.raises(TypeError, match="raw ctypes data"):
            op.set("OPERATION_POINTWISE_XDESC", "BACKEND_DESCRIPTOR", (ctypes.c_void_p * 1)(8))
        with pytest.raises(TypeError, match="raw ctypes data"):
            op.set("OPERATION_POINTWISE_XDESC", "BACKEND_DESCRIPTOR", ctypes.c_void_p(8))
        with pytest.raises(TypeError, match="must be a BackendDescriptor"):
            op.set("OPERATION_POINTWISE_XDESC", "BACKEND_DESCRIPTOR", [legacy.ptr])
        assert c_calls.calls == []


def test_get_refuses_a_descriptor_type_the_attribute_does_not_hold(monkeypatch):
    op = BackendDescriptor("operation_pointwise")
    # count given: no count query, so the check is the first thing that can fail
    with counting_c_calls(monkeypatch) as c_calls:
        with pytest.raises(TypeError, match="takes TENSOR_DESCRIPTOR, not ENGINE_DESCRIPTOR"):
            op.get("OPERATION_POINTWISE_XDESC", "BACKEND_DESCRIPTOR", 1, descriptor_type="engine")
        with pytest.raises(TypeError, match="not a descriptor-valued"):
            op.get("OPERATION_POINTWISE_ALPHA1", "BACKEND_DESCRIPTOR", 1, descriptor_type="tensor")
        assert c_calls.calls == []


def test_handle_and_void_ptr_values():
    plan = BackendDescriptor("execution_plan")
    t = TensorDescriptor((1, 2, 3))
    with pytest.raises(TypeError, match=r"must be a pycudnn\.Handle"):
        plan.set("EXECUTION_PLAN_HANDLE", "HANDLE", t)
    with pytest.raises(OverflowError, match="64-bit address"):
        plan.set("EXECUTION_PLAN_HANDLE", "HANDLE", -1)
    vp = BackendDescriptor("variant_pack")
    with pytest.raises(TypeError, match="device buffer"):
        vp.set("VARIANT_PACK_WORKSPACE", "VOID_PTR", t)
    with pytest.raises(OverflowError, match="64-bit address"):
        vp.set("VARIANT_PACK_WORKSPACE", "VOID_PTR", 2**64)

    class Buffer:
        ptr = 0x7F00_0000_0000

    vp.set("VARIANT_PACK_WORKSPACE", "VOID_PTR", Buffer())  # a device buffer: accepted
    vp.set("VARIANT_PACK_DATA_POINTERS", "VOID_PTR", [0x1000, None])


# -- handle arguments ------------------------------------------------------------------------------
def _not_handles():
    class HasPtr:
        ptr = 0x1234

    arr = pycudnn.memory.DeviceArray.from_ptr(0x7F00_0000_0000, (4,), "float32", check=False)
    return [TensorDescriptor((1, 2, 3)), arr, HasPtr(), 0x1234, "handle", None]


_TAKE_A_HANDLE = {
    "cudnnDropoutGetStatesSize",
    "cudnnGetRNNWeightSpaceSize",
    "cudnnGetRNNTempSpaceSizes",
    "cudnnGetDropoutDescriptor",
    "cudnnSetDropoutDescriptor",
    "cudnnBackendSetAttribute",
    "cudnnBackendFinalize",
}


@pytest.mark.parametrize("bad", range(6), ids=["desc", "array", "hasptr", "int", "str", "none"])
def test_handle_arguments_must_be_handles(bad, monkeypatch):
    value = _not_handles()[bad]
    rnn = RNNDescriptor(8)
    x = RNNDataDescriptor([2, 1], 8)
    calls = [
        lambda: DropoutDescriptor.states_size(value),
        lambda: rnn.weight_space_size(value),
        lambda: rnn.temp_space_sizes(value, x),
        lambda: DropoutDescriptor().read(value),
    ]
    if value is not None:  # None means "no handle" for these two
        calls += [
            lambda: DropoutDescriptor(handle=value),
            lambda: BackendDescriptor.operation_graph(
                [BackendDescriptor("operation_pointwise")], value, finalize=False
            ),
        ]
    with counting_c_calls(monkeypatch) as c_calls:
        for call in calls:
            c_calls.reset()
            with pytest.raises((TypeError, ValueError)) as info:
                call()
            if value is not None:
                assert isinstance(info.value, TypeError), info.value
                assert "handle" in str(info.value)
            assert not set(c_calls.calls) & _TAKE_A_HANDLE, c_calls.calls


def test_handle_check_is_by_type_and_refuses_closed_handles():
    h = Handle.from_ptr(0x1234, device=0)  # a wrapper: recognised, never passed to C here
    assert _validate.is_handle(h) and _validate.as_handle(h) is h
    assert not _validate.is_handle(TensorDescriptor((1, 1, 1)))
    h.close()  # borrowed: closing forgets the address
    h._mark_closed()
    with pytest.raises(ValueError, match="closed"):
        _validate.as_handle(h)


def test_dropout_states_must_be_a_buffer_not_a_descriptor():
    h = Handle.from_ptr(0x1234, device=0)
    with pytest.raises(TypeError, match="states must be a device buffer"):
        DropoutDescriptor(h, 0.5, TensorDescriptor((1, 2, 3)), 64)


# -- pycudnn.api argument guard --------------------------------------------------------------------
@pytest.mark.parametrize("junk", [b"x" * 64, "x" * 64, bytearray(64), memoryview(b"x" * 64)])
def test_api_refuses_str_and_bytes_for_descriptors(junk):
    size = ctypes.c_size_t()
    with pytest.raises(errors.ArgumentTypeError, match="cudnnGetTensorSizeInBytes: argument 1"):
        api.cudnnGetTensorSizeInBytes(junk, ctypes.byref(size))
    with pytest.raises(TypeError, match="cudnnDestroyTensorDescriptor"):
        api.cudnnDestroyTensorDescriptor(junk)  # was a double free for str
    with pytest.raises(ctypes.ArgumentError):  # still a ctypes.ArgumentError too
        api.cudnnDestroyFilterDescriptor(junk)


def test_api_refuses_wrong_family_and_closed_objects():
    size = ctypes.c_size_t()
    f = FilterDescriptor((1, 2, 3))
    with pytest.raises(errors.ArgumentTypeError, match="expected cudnnTensorDescriptor_t"):
        api.cudnnGetTensorSizeInBytes(f, ctypes.byref(size))
    with pytest.raises(TypeError):
        api.cudnnGetTensorSizeInBytes(BackendDescriptor("tensor"), ctypes.byref(size))
    t = TensorDescriptor((1, 2, 3))
    t.close()
    with pytest.raises(errors.ArgumentValueError, match="ValueError: TensorDescriptor is closed"):
        api.cudnnGetTensorSizeInBytes(t, ctypes.byref(size))
    with pytest.raises(TypeError, match="void"):  # a str for a void * data pointer
        api.cudnnBackendSetAttribute(BackendDescriptor("tensor"), 0, 0, 1, "abc")
    # bytes for a read-only void * (a CHAR attribute) is legitimate and passes
    api.cudnnBackendSetAttribute(
        BackendDescriptor("execution_plan"),
        int(A.EXECUTION_PLAN_JSON_REPRESENTATION),
        int(T.CHAR),
        2,
        b"{}",
    )


def test_api_guard_keeps_ints_objects_and_the_c_address():
    t = TensorDescriptor((1, 2, 3))
    size = ctypes.c_size_t()
    api.cudnnGetTensorSizeInBytes(t, ctypes.byref(size))
    assert size.value == 24
    api.cudnnGetTensorSizeInBytes(t.ptr, ctypes.byref(size))  # raw ints: the raw contract
    fn = errors.checked("cudnnGetTensorSizeInBytes", warn=False)
    addr = ctypes.cast(api.cudnnGetTensorSizeInBytes, ctypes.c_void_p).value
    assert addr == ctypes.cast(fn, ctypes.c_void_p).value
    assert api.cudnnGetVersion() == _lib.cudnnGetVersion()  # value functions are unchanged


def test_api_guard_cost_is_small():
    """The guard is one Python frame: well under a microsecond on top of the ctypes call."""
    t = TensorDescriptor((1, 2, 3))
    size = ctypes.c_size_t()
    ref = ctypes.byref(size)
    raw = errors.checked("cudnnGetTensorSizeInBytes", warn=False)
    guarded = api.cudnnGetTensorSizeInBytes
    n = 20000
    t_raw = min(timeit.repeat(lambda: raw(t, ref), number=n, repeat=5)) / n
    t_api = min(timeit.repeat(lambda: guarded(t, ref), number=n, repeat=5)) / n
    assert t_api - t_raw < 1e-6, (t_raw, t_api)


# -- enums only from their own class ---------------------------------------------------------------
@pytest.mark.parametrize(
    "bad", [None, True, enums.ActivationMode.RELU, enums.TensorFormat.NHWC, enums.Status.BAD_PARAM]
)
def test_dtype_arguments_refuse_none_bools_and_other_enums(bad, monkeypatch):
    with counting_c_calls(monkeypatch) as c_calls:
        for call in (
            lambda: TensorDescriptor((1, 2, 3), bad),
            lambda: FilterDescriptor((1, 2, 3), bad),
            lambda: ConvolutionDescriptor(compute_type=bad),
            lambda: RNNDescriptor(8, dtype=bad),
            lambda: RNNDataDescriptor([1], 4, dtype=bad),
            lambda: BackendDescriptor.tensor((1, 2), dtype=bad, uid=1, finalize=False),
            lambda: as_data_type(bad),
            lambda: pycudnn.memory.array.checked_dtype(bad),
        ):
            with pytest.raises(TypeError, match=r"dtype|compute_type|not a"):
                call()
        b = BackendDescriptor("tensor")
        c_calls.reset()
        with pytest.raises(TypeError):
            b.set("TENSOR_DATA_TYPE", "DATA_TYPE", bad)
        assert [c for c in c_calls.calls if c != "cudnnBackendCreateDescriptor"] == []


def test_dtype_arguments_still_take_their_own_kinds():
    assert as_data_type(enums.DataType.HALF) is enums.DataType.HALF
    assert as_data_type(0) is enums.DataType.FLOAT  # a DataType value, as before
    assert as_data_type("float16") is as_data_type(np.float16) is enums.DataType.HALF
    assert TensorDescriptor((1, 2, 3), enums.DataType.DOUBLE).dtype == enums.DataType.DOUBLE


def test_enum_arguments_refuse_other_enums():
    with pytest.raises(TypeError, match="not a ConvolutionMode"):
        ConvolutionDescriptor(mode=enums.PoolingMode.MAX)
    with pytest.raises(TypeError, match="not a PoolingMode"):
        PoolingDescriptor(2, mode=enums.ConvolutionMode.CONVOLUTION)


# -- empty spatial tuples --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make",
    [
        lambda: ConvolutionDescriptor(pad=()),
        lambda: ConvolutionDescriptor(stride=[]),
        lambda: ConvolutionDescriptor(pad=(), stride=(), dilation=()),
        lambda: PoolingDescriptor(()),
        lambda: PoolingDescriptor(2, stride=()),
        lambda: BackendDescriptor.convolution((), finalize=False),
        lambda: BackendDescriptor.convolution((1,), stride=(), finalize=False),
    ],
)
def test_empty_spatial_tuples_are_refused(make, monkeypatch):
    with counting_c_calls(monkeypatch) as c_calls:
        with pytest.raises(ValueError, match=r"empty|entries"):
            make()
        assert c_calls.calls == []


# -- finalize of descriptors cuDNN dereferences unchecked (found by the fuzzer) -------------------
def test_finalize_refuses_what_crashes_cudnn(monkeypatch):
    cfg = BackendDescriptor("enginecfg")
    plan = BackendDescriptor("execution_plan")
    engine = BackendDescriptor("engine")  # not finalized
    with counting_c_calls(monkeypatch) as c_calls:
        with pytest.raises(ValueError, match="set ENGINECFG_ENGINE before finalize"):
            cfg.finalize()
        with pytest.raises(ValueError, match="set EXECUTION_PLAN_ENGINE_CONFIG before finalize"):
            plan.finalize()
        assert "cudnnBackendFinalize" not in c_calls.calls
    cfg.set("ENGINECFG_ENGINE", "BACKEND_DESCRIPTOR", engine)
    plan.set("EXECUTION_PLAN_ENGINE_CONFIG", "BACKEND_DESCRIPTOR", cfg)
    with counting_c_calls(monkeypatch) as c_calls:
        with pytest.raises(ValueError, match="ENGINE_DESCRIPTOR set as ENGINECFG_ENGINE is not"):
            cfg.finalize()
        with pytest.raises(ValueError, match="set as EXECUTION_PLAN_ENGINE_CONFIG is not final"):
            plan.finalize()
        assert "cudnnBackendFinalize" not in c_calls.calls
    # a plan deserialized from JSON has no engine config: cuDNN judges it
    js = BackendDescriptor("execution_plan")
    js.set("EXECUTION_PLAN_JSON_REPRESENTATION", "CHAR", "{}")
    with pytest.raises(errors.CudnnError):
        js.finalize()
