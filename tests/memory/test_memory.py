"""DeviceArray metadata and interop logic without a GPU: fake CAI producers, DLPack capsules
(numpy's real ones and our own), layout helpers, operand checks, workspace limits, no-GPU errors.

Views are built with ``check=False`` (no pointer query) on fake addresses; nothing dereferences
them.
"""

from __future__ import annotations

import enum
import gc
import sys
import threading
import time
import typing
import weakref

import numpy as np
import pytest

import pycudnn
from pycudnn import _cuda, _layout, errors
from pycudnn import handle as hmod
from pycudnn import memory as mem
from pycudnn.enums import DataType
from pycudnn.handle import CudaUnavailableError, Handle
from pycudnn.memory import DeviceArray, NotDeviceMemoryError, _dlpack, _transfer, allocator
from pycudnn.memory import array as marr

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)

no_gpu = pytest.mark.skipif(
    hmod.gpu_unavailable_reason() is None, reason="a GPU is present: the no-GPU path is not taken"
)

ADDR = 0x7F00_0000_0000  # a fake, well-aligned device address


class FakeCAI:
    """A producer exposing only __cuda_array_interface__ (like Numba device arrays)."""

    def __init__(self, shape, typestr="<f4", strides=None, ptr=ADDR, version=3, stream=None, **kw):
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": typestr,
            "data": (ptr, kw.pop("readonly", False)),
            "version": version,
            "strides": strides,
            **kw,
        }
        if version >= 3:
            self.__cuda_array_interface__["stream"] = stream


class DLPackOnly:
    """Forwards the DLPack protocol of another object, hiding everything else."""

    def __init__(self, target, *, with_device=True, versioned_ok=True):
        self.target = target
        self.calls = []
        self.versioned_ok = versioned_ok
        if with_device:
            self.__dlpack_device__ = target.__dlpack_device__

    def __dlpack__(self, **kwargs):
        self.calls.append(kwargs)
        if not self.versioned_ok and "max_version" in kwargs:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        return self.target.__dlpack__(**kwargs)


def fake(shape, dtype=np.float32, strides=None, ptr=ADDR, **kw) -> DeviceArray:
    return DeviceArray.from_ptr(ptr, shape, dtype, strides, device=0, check=False, **kw)


# -- layout helpers (pycudnn._layout, in bytes as memory uses them) --------------------------------
def test_c_strides_and_contiguity():
    assert _layout.packed_strides((2, 3, 4), itemsize=4) == (48, 16, 4)
    assert _layout.packed_strides((), itemsize=8) == ()
    assert _layout.packed_strides((0, 3), itemsize=2) == (6, 2)
    assert _layout.is_c_contiguous((2, 3), (12, 4), 4)
    assert _layout.is_c_contiguous((2, 1, 3), (12, 999, 4), 4)  # size-1 dims: any stride
    assert not _layout.is_c_contiguous((2, 3), (4, 8), 4)
    assert _layout.is_c_contiguous((0, 3), (5, 7), 4)


def test_dense_layouts():
    # NCHW shape with NHWC strides (float32): dense, not C-contiguous
    shape, nhwc = (2, 3, 4, 5), (240, 4, 60, 12)
    assert _layout.is_dense(shape, nhwc, 4)
    assert not _layout.is_c_contiguous(shape, nhwc, 4)
    assert _layout.is_dense((3, 4), (4, 12), 4)  # Fortran order
    assert not _layout.is_dense((3, 4), (32, 4), 4)  # row gaps
    assert not _layout.is_dense((3, 4), (4, 4), 4)  # overlap
    assert not _layout.is_dense((3, 4), (-16, 4), 4)  # negative stride
    assert _layout.is_dense((), (), 4)


def test_extent():
    assert _layout.extent((2, 3), (12, 4), 4) == (0, 24)
    assert _layout.extent((2, 3), (-12, 4), 4) == (-12, 12)
    assert _layout.extent((0, 3), (12, 4), 4) == (0, 0)
    assert _layout.extent((), (), 8) == (0, 8)


def test_host_in_layout_reorders_only_when_needed():
    host = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    assert _transfer.host_in_layout(host, host.strides) is host
    fortran = (4, 8, 24)
    buf = _transfer.host_in_layout(host, fortran)
    back = np.ndarray(host.shape, host.dtype, buffer=buf, strides=fortran)
    np.testing.assert_array_equal(back, host)


# -- DeviceArray metadata ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("dtype", "itemsize", "data_type"),
    [
        (np.float16, 2, DataType.HALF),
        ("bfloat16", 2, DataType.BFLOAT16),
        (BF16, 2, DataType.BFLOAT16),
        (np.float32, 4, DataType.FLOAT),
        (np.float64, 8, DataType.DOUBLE),
        (np.int8, 1, DataType.INT8),
        (np.int32, 4, DataType.INT32),
        (np.uint8, 1, DataType.UINT8),
        (np.bool_, 1, DataType.BOOLEAN),
    ],
)
def test_metadata_for_every_dtype(dtype, itemsize, data_type):
    a = fake((2, 3, 4), dtype)
    assert a.shape == (2, 3, 4)
    assert a.ndim == 3 and a.size == 24 and len(a) == 2
    assert a.itemsize == itemsize
    assert a.nbytes == 24 * itemsize
    assert a.strides == (12 * itemsize, 4 * itemsize, itemsize)  # bytes, like numpy
    assert a.data_type == data_type
    assert a.is_c_contiguous and a.is_dense
    assert a.ptr == ADDR and a.device == 0 and a.stream == 0
    assert "DeviceArray(shape=(2, 3, 4)" in repr(a)


@pytest.mark.parametrize("dtype", [np.int16, np.complex64, np.uint32, "V2", object])
def test_unsupported_dtypes_are_type_errors(dtype):
    with pytest.raises(TypeError):
        fake((2,), dtype)


def test_bad_shapes_and_strides():
    with pytest.raises(ValueError, match="negative"):
        fake((2, -1))
    with pytest.raises(TypeError, match="shape"):
        fake("ab")
    with pytest.raises(ValueError, match="do not match"):
        fake((2, 3), strides=(4,))


def test_strided_view_metadata():
    a = fake((3, 4), np.float32, strides=(4, 12))
    assert not a.is_c_contiguous and a.is_dense
    assert "strides=(4, 12)" in repr(a)
    b = fake((3, 4), np.float32, strides=(32, 4))
    assert not b.is_dense


def test_no_implicit_numpy_conversion():
    with pytest.raises(TypeError, match=r"\.get\(\)"):
        np.asarray(fake((2,)))


def test_len_of_scalar():
    with pytest.raises(TypeError):
        len(fake(()))


def test_reshape():
    a = fake((2, 3, 4))
    b = a.reshape(6, -1)
    assert b.shape == (6, 4) and b.strides == (16, 4) and b.ptr == a.ptr
    assert b.base is a  # keeps the viewed array alive
    assert a.reshape((24,)).shape == (24,)
    with pytest.raises(ValueError):
        a.reshape(5, 5)
    with pytest.raises(ValueError):
        fake((3, 4), strides=(4, 12)).reshape(12)


# -- __cuda_array_interface__ --------------------------------------------------------------------
def test_cai_export():
    a = fake((2, 3), np.float16)
    cai = a.__cuda_array_interface__
    assert cai["version"] == 3
    assert cai["shape"] == (2, 3)
    assert cai["typestr"] == "<f2"
    assert cai["data"] == (ADDR, False)
    assert cai["strides"] is None  # C-contiguous
    assert cai["stream"] == 1  # legacy default stream: 1, never 0


def test_cai_export_strided_readonly_and_stream():
    a = fake((3, 4), np.int32, strides=(4, 12), stream=0xABC0, readonly=True)
    cai = a.__cuda_array_interface__
    assert cai["strides"] == (4, 12)
    assert cai["data"] == (ADDR, True)
    assert cai["stream"] == 0xABC0
    assert fake((2,), np.bool_).__cuda_array_interface__["typestr"] == "|b1"


def test_asarray_from_cai_is_zero_copy_and_keeps_owner():
    producer = FakeCAI((4, 5), "<f8", strides=(8, 32))
    ref = weakref.ref(producer)
    view = pycudnn.asarray(producer, check=False)
    assert view.ptr == ADDR
    assert view.shape == (4, 5) and view.dtype == np.float64
    assert view.strides == (8, 32)
    assert not view.is_c_contiguous
    del producer
    gc.collect()
    assert ref() is not None  # the view keeps its producer alive
    del view
    gc.collect()
    assert ref() is None


def test_asarray_cai_round_trip_of_our_export():
    a = fake((2, 3, 4), np.int8, strides=(1, 2, 6))
    b = pycudnn.asarray(FakeCAI(**_cai_kwargs(a)), check=False)
    assert (b.ptr, b.shape, b.strides, b.dtype) == (a.ptr, a.shape, a.strides, a.dtype)


def _cai_kwargs(a):
    cai = a.__cuda_array_interface__
    return {
        "shape": cai["shape"],
        "typestr": cai["typestr"],
        "strides": cai["strides"],
        "ptr": cai["data"][0],
        "stream": None,
    }


def test_asarray_cai_v2_and_readonly():
    v = pycudnn.asarray(FakeCAI((3,), "|u1", version=2, readonly=True), check=False, device=0)
    assert v.dtype == np.uint8 and v.readonly
    with pytest.raises(ValueError, match="read-only"):
        v.fill_(1)


def test_asarray_cai_same_stream_needs_no_sync():
    # producer stream 1 (legacy default) and consumer stream 0 are the same stream: no CUDA call
    v = pycudnn.asarray(FakeCAI((3,), stream=1), check=False)
    assert v.stream == 0


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"typestr": "<V2"}, TypeError, "bfloat16.*DLPack"),
        ({"typestr": "<i2"}, TypeError, "int16"),
        ({"typestr": ">f4"}, TypeError, "big-endian"),
        ({"version": 1}, TypeError, "too old"),
        ({"mask": object()}, NotImplementedError, "masked"),
        ({"stream": 0}, ValueError, "stream 0 is not allowed"),
        ({"strides": (4,)}, ValueError, "do not match"),
    ],
)
def test_asarray_cai_rejects(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        pycudnn.asarray(FakeCAI((2, 3), **kwargs), check=False)


def test_asarray_expected_device():
    assert pycudnn.asarray(FakeCAI((2,)), check=False, device=1).device == 1  # trusted
    with pytest.raises(ValueError, match="on device 0, expected device 1"):
        pycudnn.asarray(DLPackOnly(fake((2,))), device=1)


def test_device_array_passes_through_asarray():
    a = fake((2,))
    assert pycudnn.asarray(a) is a
    with pytest.raises(ValueError, match="expected device 1"):
        pycudnn.asarray(a, device=1)


# -- host data is refused, naming to_device --------------------------------------------------------
@pytest.mark.parametrize(
    "host",
    [
        np.zeros((2, 3), np.float32),
        np.float32(1.0),
        DLPackOnly(np.zeros(3, np.float32)),  # via __dlpack_device__: kDLCPU
        DLPackOnly(np.zeros(3, np.float32), with_device=False),  # via the capsule itself
    ],
)
def test_host_arrays_are_refused_naming_to_device(host):
    with pytest.raises(NotDeviceMemoryError, match=r"host array.*pycudnn\.to_device") as info:
        pycudnn.asarray(host, check=False, argument="img")
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)
    assert str(info.value).startswith("img")


def test_a_device_record_that_is_a_tuple_is_not_host_data():
    # pycudnn.jax's DeviceBuffer is a NamedTuple with __cuda_array_interface__ (a GPU run found
    # the reader calling it a host array); a plain tuple still is one
    from typing import NamedTuple

    from pycudnn.memory._checks import is_host_array

    class Record(NamedTuple):
        ptr: int

        @property
        def __cuda_array_interface__(self):
            return {"shape": (1,), "typestr": "<f4", "data": (self.ptr, False), "version": 3}

    assert not is_host_array(Record(0x1000))
    assert is_host_array((1.0, 2.0)) and is_host_array([1.0]) and is_host_array(np.float32(1))


def test_objects_without_a_protocol():
    with pytest.raises(TypeError, match="__cuda_array_interface__ or __dlpack__"):
        pycudnn.asarray(object())
    with pytest.raises(NotDeviceMemoryError, match="to_device"):
        pycudnn.asarray([1.0, 2.0])


def test_cai_property_errors_fall_back_to_dlpack():
    class Refuses:
        @property
        def __cuda_array_interface__(self):
            raise TypeError("dtype bfloat16 has no typestr")  # what torch does for bfloat16

        def __init__(self):
            self.target = fake((2, 2), BF16)

        def __dlpack__(self, **kw):
            return self.target.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.target.__dlpack_device__()

    v = pycudnn.asarray(Refuses())
    assert v.dtype == BF16 and v.ptr == ADDR


def test_cai_property_error_without_dlpack_is_raised():
    class Refuses:
        @property
        def __cuda_array_interface__(self):
            raise RuntimeError("requires grad")

    with pytest.raises(RuntimeError, match="requires grad"):
        pycudnn.asarray(Refuses())


# -- DLPack ------------------------------------------------------------------------------------
def test_dlpack_device():
    assert fake((2,)).__dlpack_device__() == (_dlpack.KDL_CUDA, 0)


@pytest.mark.parametrize("versioned_ok", [True, False])
@pytest.mark.parametrize(
    ("shape", "dtype", "strides"),
    [
        ((2, 3), np.float32, None),
        ((2, 3, 4, 5), np.float16, (240 // 2, 2, 60 // 2, 12 // 2)),  # NHWC strides, float16
        ((4,), BF16, None),
        ((3, 3), np.bool_, (1, 3)),
        ((5,), np.int8, None),
        ((), np.float64, None),
        ((0, 4), np.int32, None),
    ],
)
def test_dlpack_round_trip_through_our_exporter(shape, dtype, strides, versioned_ok):
    a = fake(shape, dtype, strides=strides)
    gc.collect()
    before = _dlpack.live_exports()
    producer = DLPackOnly(a, versioned_ok=versioned_ok)
    v = pycudnn.asarray(producer)
    assert producer.calls[-1]["stream"] == 1  # the consumer's stream: legacy default
    assert producer.calls[0]["max_version"] == (1, 0)  # versioned first, then plain if refused
    assert (v.shape, v.dtype, v.strides, v.device) == (a.shape, a.dtype, a.strides, 0)
    assert v.ptr == (a.ptr if a.size else v.ptr)
    assert _dlpack.live_exports() == before + 1  # held until the view goes
    del v, producer
    gc.collect()
    assert _dlpack.live_exports() == before


def test_dlpack_capsule_names_and_unconsumed_release():
    a = fake((2, 2))
    gc.collect()
    before = _dlpack.live_exports()
    cap = a.__dlpack__()
    assert "dltensor" in repr(cap) and "versioned" not in repr(cap)
    capv = a.__dlpack__(max_version=(1, 0))
    assert "dltensor_versioned" in repr(capv)
    assert "dltensor_versioned" not in repr(a.__dlpack__(max_version=(0, 8)))
    gc.collect()
    assert _dlpack.live_exports() == before + 2
    del cap, capv
    gc.collect()
    assert _dlpack.live_exports() == before  # the capsule destructor released them


def test_dlpack_export_keeps_the_array_alive():
    a = fake((2, 2))
    ref = weakref.ref(a)
    cap = a.__dlpack__()
    del a
    gc.collect()
    assert ref() is not None
    del cap
    gc.collect()
    assert ref() is None


def test_dlpack_export_arguments():
    a = fake((2,))
    with pytest.raises(BufferError, match="device"):
        a.__dlpack__(dl_device=(1, 0))
    assert a.__dlpack__(dl_device=(2, 0)) is not None
    with pytest.raises(ValueError, match="stream"):
        a.__dlpack__(stream=-2)
    with pytest.raises(ValueError, match="stream"):
        a.__dlpack__(stream="s")
    assert a.__dlpack__(stream=-1) is not None  # -1: do not synchronize
    assert a.__dlpack__(stream=1) is not None  # same stream: no CUDA call


def test_dlpack_strides_must_be_whole_elements():
    a = fake((2, 2), np.float32, strides=(8, 2))
    with pytest.raises(BufferError, match="multiples"):
        a.__dlpack__()


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.arange(12, dtype=np.float32).reshape(3, 4),
        lambda: np.arange(12, dtype=np.float64).reshape(3, 4)[:, ::2],
        lambda: np.arange(24, dtype=np.int8).reshape(2, 3, 4).transpose(2, 0, 1),
        lambda: np.array([True, False, True]),
        lambda: np.arange(6, dtype=np.uint8)[1:],
        lambda: np.zeros((0, 3), np.int32),
        lambda: np.array(3.0, np.float16),
    ],
)
def test_dlpack_import_of_numpy_capsules(make):
    """Our consumer against a real producer: numpy (CPU capsules, so only parsing is checked)."""
    arr = make()
    ref = weakref.ref(arr) if arr.base is None else weakref.ref(arr.base)
    imported = _dlpack.from_dlpack(arr, stream=None)
    assert imported.device_type == _dlpack.KDL_CPU
    assert imported.shape == arr.shape
    assert imported.dtype == arr.dtype
    if arr.size:
        assert imported.data == arr.__array_interface__["data"][0]
        got_strides = imported.strides or _layout.packed_strides(arr.shape, itemsize=arr.itemsize)
        for n, s, t in zip(arr.shape, got_strides, arr.strides, strict=True):
            assert n == 1 or s == t
    owner = imported.owner
    del imported, arr
    gc.collect()
    assert ref() is not None  # numpy's manager context holds the array until we release it
    del owner
    gc.collect()
    assert ref() is None  # our finalizer called numpy's deleter


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_, np.float16, np.uint8])
def test_numpy_consumes_our_capsules(dtype):
    """Our exporter against a real consumer: numpy reads a kDLCPU capsule we build."""
    src = (np.arange(12) % 3).astype(dtype).reshape(3, 4)
    holder = [src]

    class Exporter:
        def __dlpack_device__(self):
            return (_dlpack.KDL_CPU, 0)

        def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
            versioned = max_version is not None and max_version[0] >= 1
            return _dlpack.export(
                holder,
                src.ctypes.data,
                src.shape,
                src.strides,
                src.dtype,
                (_dlpack.KDL_CPU, 0),
                versioned=versioned,
            )

    gc.collect()
    before = _dlpack.live_exports()
    out = np.from_dlpack(Exporter())
    np.testing.assert_array_equal(out, src)
    assert out.__array_interface__["data"][0] == src.ctypes.data  # zero-copy
    assert _dlpack.live_exports() == before + 1
    del out
    gc.collect()
    assert _dlpack.live_exports() == before  # numpy called our deleter


def test_dlpack_dtype_table():
    for dt in (np.float16, np.float32, np.float64, np.int8, np.int32, np.int64, np.uint8):
        code, bits = _dlpack.dtype_to_dl(np.dtype(dt))
        assert _dlpack.dtype_from_dl(code, bits, 1) == np.dtype(dt)
    assert _dlpack.dtype_to_dl(BF16) == (4, 16)
    assert _dlpack.dtype_from_dl(4, 16, 1) == BF16
    assert _dlpack.dtype_to_dl(np.dtype(np.bool_)) == (6, 8)
    with pytest.raises(TypeError, match="lanes"):
        _dlpack.dtype_from_dl(2, 32, 4)
    with pytest.raises(TypeError):
        _dlpack.dtype_from_dl(5, 64, 1)  # complex


def test_dlpack_managed_memory_needs_opt_in():
    class Managed:
        def __dlpack_device__(self):
            return (_dlpack.KDL_CUDA_MANAGED, 0)

        def __dlpack__(self, **kw):  # pragma: no cover - refused before
            raise AssertionError

    with pytest.raises(NotDeviceMemoryError, match="allow_managed=True"):
        pycudnn.asarray(Managed())


# -- checks ----------------------------------------------------------------------------------------
def test_check_alignment():
    mem.check_alignment(ADDR + 4, 4, argument="x")
    with pytest.raises(ValueError, match=r"kerns: device pointer 0x.* not aligned to 4 bytes"):
        mem.check_alignment(ADDR + 2, 4, argument="kerns")


def test_check_device_pointer_null():
    with pytest.raises(ValueError, match="w: null device pointer"):
        mem.check_device_pointer(0, argument="w")


# -- no GPU ----------------------------------------------------------------------------------------
@no_gpu
@pytest.mark.parametrize(
    "call",
    [
        lambda: pycudnn.empty((2, 3)),
        lambda: pycudnn.zeros((2, 3), np.float16),
        lambda: pycudnn.to_device(np.ones(3, np.float32)),
        lambda: mem.empty_like(fake((2, 2))),
        lambda: mem.check_device_pointer(ADDR, argument="x"),
        lambda: pycudnn.asarray(FakeCAI((2,))),  # the pointer check needs a GPU
        lambda: mem.mem_get_info(),
    ],
)
def test_no_gpu_errors_say_a_gpu_is_needed(call):
    with pytest.raises(CudaUnavailableError, match=r"needs a CUDA GPU.*none is usable"):
        call()


def test_dtype_is_checked_before_the_device():
    with pytest.raises(TypeError, match="int16"):
        pycudnn.empty((2,), np.int16)
    with pytest.raises(TypeError, match="int16"):
        pycudnn.to_device(np.zeros(2, np.int16))


# -- workspaces (limit logic; allocation itself is in the GPU tests) -------------------------------
def test_workspace_limit_raises_allocation_error():
    h = Handle.from_ptr(0x1000, 0)
    assert mem.get_workspace(h, 0) == (0, 0)
    assert mem.workspace_size(h) == 0
    with pytest.raises(ValueError, match="negative"):
        mem.get_workspace(h, -1)
    with (
        pycudnn.config.override(workspace_limit=1024),
        pytest.raises(errors.AllocationError) as info,
    ):
        mem.get_workspace(h, 4096)
    exc = info.value
    assert isinstance(exc, MemoryError)
    assert exc.requested == 4096
    text = str(exc)
    assert "4096 bytes" in text and "workspace_limit=1024" in text
    assert "free" in text  # free memory (or that it is unknown) is named


def test_workspace_needs_a_handle():
    with pytest.raises(TypeError, match="Handle"):
        mem.get_workspace(object(), 10)


def test_public_names():
    for name in ("DeviceArray", "to_device", "empty", "zeros", "asarray"):
        assert getattr(pycudnn, name) is getattr(mem, name)


class TorchLikeBF16:
    """torch's quirk: a bfloat16 tensor's __cuda_array_interface__ says '<f2' (float16)."""

    dtype = "torch.bfloat16"

    def __init__(self):
        self.target = fake((2, 3), BF16)
        self.__cuda_array_interface__ = {**self.target.__cuda_array_interface__, "typestr": "<f2"}

    def __dlpack__(self, **kw):
        return self.target.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.target.__dlpack_device__()


def test_bfloat16_goes_through_dlpack_not_the_mislabelled_cai():
    v = pycudnn.asarray(TorchLikeBF16(), check=False)
    assert v.dtype == BF16
    assert v.data_type == DataType.BFLOAT16


def test_untyped_cai_falls_back_to_dlpack():
    obj = TorchLikeBF16()
    obj.dtype = None
    obj.__cuda_array_interface__["typestr"] = "<V2"
    assert pycudnn.asarray(obj, check=False).dtype == BF16


def test_bare_capsule_is_consumed_once():
    a = fake((3, 4), np.float16, strides=(2, 6))
    cap = a.__dlpack__()
    v = pycudnn.asarray(cap)
    assert (v.ptr, v.shape, v.strides, v.dtype) == (a.ptr, a.shape, a.strides, a.dtype)
    assert "used_dltensor" in repr(cap)
    with pytest.raises(TypeError, match="consumed already"):
        pycudnn.asarray(cap)


def test_dlpack_survives_another_library_setting_pythonapis_argtypes(monkeypatch):
    """``ctypes.pythonapi``'s function objects are one per process; ``jax.ffi.pycapsule`` sets
    ``PyCapsule_New.argtypes`` to a CFUNCTYPE destructor on the shared one (before, every
    DLPack export here then raised ``ctypes.ArgumentError``). pycudnn's capsule calls use their
    own prototypes."""
    import ctypes

    shared = ctypes.pythonapi.PyCapsule_New
    monkeypatch.setattr(shared, "restype", ctypes.py_object)
    monkeypatch.setattr(
        shared,
        "argtypes",
        (ctypes.c_void_p, ctypes.c_char_p, ctypes.CFUNCTYPE(None, ctypes.py_object)),
    )  # what jax.ffi.pycapsule does
    getname = ctypes.pythonapi.PyCapsule_GetName
    monkeypatch.setattr(getname, "argtypes", (ctypes.c_void_p,))  # another library's choice
    a = fake((3, 4), np.float16, strides=(2, 6))
    cap = a.__dlpack__()
    v = pycudnn.asarray(cap)
    assert (v.ptr, v.shape, v.strides, v.dtype) == (a.ptr, a.shape, a.strides, a.dtype)
    assert "used_dltensor" in repr(cap)


# -- views: indexing and transposes match numpy (metadata only: host memory as the fake address) --
def _mirror(host: np.ndarray) -> DeviceArray:
    return DeviceArray.from_ptr(
        host.ctypes.data, host.shape, host.dtype, host.strides, device=0, check=False, owner=host
    )


def _same_view(view: DeviceArray, ref: np.ndarray) -> None:
    assert view.shape == ref.shape
    assert view.dtype == ref.dtype
    if ref.size:
        assert view.ptr == ref.__array_interface__["data"][0]
        for n, a, b in zip(ref.shape, view.strides, ref.strides, strict=True):
            assert n == 1 or a == b


@pytest.mark.parametrize(
    "key",
    [
        0,
        -1,
        slice(None),
        slice(1, None),
        slice(None, None, -1),
        slice(4, 0, -2),
        slice(2, 2),
        (Ellipsis, 1),
        (1, Ellipsis, slice(None, None, 2)),
        (None, 0),
        (slice(None), None, 1, Ellipsis),
        (2, 3, 1),
        (slice(-2, None), slice(None, None, 3), -1),
        Ellipsis,
        (),
        np.int64(1),
    ],
)
def test_getitem_matches_numpy(key):
    host = np.arange(5 * 6 * 4, dtype=np.float32).reshape(5, 6, 4)
    _same_view(_mirror(host)[key], _np_view(host, key))


def _np_view(host: np.ndarray, key) -> np.ndarray:
    """numpy's view for *key* (a trailing ... keeps all-integer keys from giving a scalar)."""
    key = key if isinstance(key, tuple) else (key,)
    return host[key] if Ellipsis in key else host[(*key, Ellipsis)]


def test_getitem_errors_and_keeps_the_base():
    host = np.zeros((3, 4), np.float32)
    a = _mirror(host)
    for bad, exc in [
        ((0, 0, 0), IndexError),
        (3, IndexError),
        (-4, IndexError),
        ((Ellipsis, Ellipsis), IndexError),
        (True, IndexError),
        (1.0, IndexError),
        ([0, 1], IndexError),
    ]:
        with pytest.raises(exc):
            a[bad]
    view = a[1:, ::2]
    assert view.base is host and not view.is_dense  # the owner of the memory is kept
    assert view[0].base is host
    b = fake((3, 4))
    assert b[1].base is b and b[1][2].base is b  # views of views share the root


@pytest.mark.parametrize(
    "axes", [(), ((0, 2, 3, 1),), (0, 3, 1, 2), (3, 2, 1, 0), (-1, 0, 1, 2), ([1, 0, 2, 3],)]
)
def test_transpose_matches_numpy(axes):
    host = np.arange(2 * 3 * 4 * 5, dtype=np.float16).reshape(2, 3, 4, 5)
    view = _mirror(host).transpose(*axes)
    _same_view(view, host.transpose(*axes))
    assert view.is_dense


def test_transpose_views_nhwc_as_nchw():
    nhwc = np.zeros((2, 4, 5, 3), np.float32)
    v = _mirror(nhwc).transpose(0, 3, 1, 2)
    assert v.shape == (2, 3, 4, 5) and v.is_dense and not v.is_c_contiguous
    assert _mirror(nhwc).T.shape == (3, 5, 4, 2)
    with pytest.raises(ValueError, match="permutation"):
        _mirror(nhwc).transpose(0, 1, 1, 2)


hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies


@st.composite
def _arrays_and_keys(draw):
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=4)))
    host = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    if draw(st.booleans()) and host.ndim:
        host = host.transpose(draw(st.permutations(range(host.ndim))))
    key = []
    for n in host.shape:
        if n and draw(st.booleans()):
            key.append(draw(st.integers(-n, n - 1)))
        else:
            key.append(
                slice(
                    draw(st.none() | st.integers(-6, 6)),
                    draw(st.none() | st.integers(-6, 6)),
                    draw(st.none() | st.sampled_from([-3, -2, -1, 1, 2, 3])),
                )
            )
    return host, tuple(key)


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(_arrays_and_keys())
def test_views_and_layout_predicates_agree_with_numpy(case):
    host, key = case
    view = _mirror(host)[key]
    ref = _np_view(host, key)
    _same_view(view, ref)
    assert view.is_c_contiguous == ref.flags.c_contiguous or ref.size <= 1
    lo, hi = _layout.extent(view.shape, view.strides, view.itemsize)
    if ref.size:
        # numpy >= 2.0: np.lib.array_utils; before, np.byte_bounds (the declared floor is 1.25)
        utils = getattr(np.lib, "array_utils", np)
        low, high = utils.byte_bounds(ref)
        assert (view.ptr + lo, view.ptr + hi) == (low, high)
    # a dense view is exactly its elements, packed
    if view.is_dense and ref.size:
        assert hi - lo == ref.nbytes


# -- workspace growth logic, with the allocation faked (the GPU tests do it for real) --------------
class FakeAllocation:
    log: typing.ClassVar[list] = []
    fail_above: int | None = None
    next_ptr = ADDR

    def __init__(self, nbytes, device, stream, keep=None, *, free_sync=False):
        if FakeAllocation.fail_above is not None and nbytes > FakeAllocation.fail_above:
            raise errors.AllocationError(4004, "cudaMallocAsync", f"{nbytes} bytes")
        self.nbytes, self.device, self.stream, self.free_sync = nbytes, device, stream, free_sync
        self.ptr = FakeAllocation.next_ptr
        FakeAllocation.next_ptr += 1 << 30
        FakeAllocation.log.append(("alloc", nbytes, stream))

    def release(self, stream):
        FakeAllocation.log.append(("release", self.nbytes, stream))

    def close(self):
        FakeAllocation.log.append(("close", self.nbytes, self.stream))


@pytest.fixture
def fake_alloc(monkeypatch):
    FakeAllocation.log = []
    FakeAllocation.fail_above = None
    monkeypatch.setattr(allocator, "Allocation", FakeAllocation)
    return FakeAllocation


def test_workspace_is_grow_only_per_stream(fake_alloc):
    mib = 1 << 20
    h = Handle.from_ptr(0x1000, 0, stream=0x50)
    p1, s1 = mem.get_workspace(h, 1000)
    assert s1 == mib and fake_alloc.log == [("alloc", mib, 0x50)]  # whole MiB, handle's stream
    assert mem.get_workspace(h, mib) == (p1, s1)  # fits: reused, nothing allocated
    p2, s2 = mem.get_workspace(h, mib + 1)
    assert s2 == 2 * mib and p2 != p1
    assert fake_alloc.log[-2:] == [("release", mib, 0x50), ("alloc", 2 * mib, 0x50)]
    p3, s3 = mem.get_workspace(h, 10, stream=0x60)  # its own buffer on another stream
    assert p3 != p2 and mem.workspace_size(h, 0x60) == s3 == mib
    assert mem.workspace_size(h) == 2 * mib
    mem.release_workspace(h, 0x60)
    assert fake_alloc.log[-1] == ("release", mib, 0x60) and mem.workspace_size(h, 0x60) == 0
    h.close()  # frees what is left, synchronously
    assert fake_alloc.log[-1] == ("close", 2 * mib, 0x50)


def test_workspace_rounding_is_capped_by_the_limit(fake_alloc):
    h = Handle.from_ptr(0x1000, 0)
    with pycudnn.config.override(workspace_limit=1500):
        assert mem.get_workspace(h, 1200)[1] == 1500
        with pytest.raises(errors.AllocationError, match="1501 bytes"):
            mem.get_workspace(h, 1501)
    assert mem.get_workspace(h, 1400)[1] == 1500  # still there after the failure


def test_workspace_falls_back_to_the_exact_size(fake_alloc):
    h = Handle.from_ptr(0x1000, 0)
    fake_alloc.fail_above = 3000  # the rounded size fails, the exact one fits
    assert mem.get_workspace(h, 2500)[1] == 2500
    fake_alloc.fail_above = 0
    with pytest.raises(MemoryError):
        mem.get_workspace(h, 2 << 20)
    assert mem.workspace_size(h) == 0  # the old buffer was released before the attempt


def test_workspace_functions_are_the_handles_methods(fake_alloc):
    mib = 1 << 20
    h = Handle.from_ptr(0x1000, 0, stream=0x50)
    ptr, size = h.workspace(1000)
    assert mem.get_workspace(h, 10) == (ptr, size) == (fake_alloc.next_ptr - (1 << 30), mib)
    assert h.workspace_size() == mem.workspace_size(h) == mib
    assert h.workspace(5, stream=0x60)[1] == mem.workspace_size(h, 0x60) == mib
    mem.release_workspace(h, 0x60)
    assert h.workspace_size(0x60) == 0 and fake_alloc.log[-1] == ("release", mib, 0x60)
    h.release_workspace()
    assert mem.workspace_size(h) == 0 and fake_alloc.log[-1] == ("release", mib, 0x50)
    for fn in (mem.workspace_size, mem.release_workspace):
        with pytest.raises(TypeError, match="Handle"):
            fn(object())


# -- caching allocator, on a fake CUDA runtime that records what it is asked ----------------------
class _Err(enum.IntEnum):
    cudaSuccess = 0
    cudaErrorMemoryAllocation = 2
    cudaErrorInvalidResourceHandle = 400
    cudaErrorNotSupported = 801


class FakeRuntime:
    """The few ``cuda.bindings.runtime`` calls the allocator makes, as no-ops returning
    ``(status, value)``; mallocs and frees are logged in ``calls``."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.next_ptr = ADDR
        self.dev = 0
        self.oom = 0  # this many next mallocs fail with cudaErrorMemoryAllocation (-1: all)
        self.no_pools = False
        self.dead_streams: set[int] = set()
        self.log_lock = threading.Lock()

    def _log(self, *entry):
        with self.log_lock:
            self.calls.append(entry)

    def _new_ptr(self, n):
        with self.log_lock:
            ptr = self.next_ptr
            self.next_ptr += max(n, 1 << 21)
            return ptr

    def cudaGetDevice(self):
        return (_Err.cudaSuccess, self.dev)

    def cudaSetDevice(self, d):
        self.dev = d
        return (_Err.cudaSuccess,)

    def cudaMallocAsync(self, n, stream):
        if self.no_pools:
            return (_Err.cudaErrorNotSupported, 0)
        if self.oom:
            self.oom -= self.oom > 0
            self._log("oom", n, stream)
            return (_Err.cudaErrorMemoryAllocation, 0)
        ptr = self._new_ptr(n)
        self._log("malloc", n, stream, self.dev, ptr)
        return (_Err.cudaSuccess, ptr)

    def cudaMalloc(self, n):
        ptr = self._new_ptr(n)
        self._log("malloc_sync", n, self.dev, ptr)
        return (_Err.cudaSuccess, ptr)

    def cudaFreeAsync(self, ptr, stream):
        if stream in self.dead_streams:
            return (_Err.cudaErrorInvalidResourceHandle,)
        self._log("free", ptr, stream, self.dev)
        return (_Err.cudaSuccess,)

    def cudaFree(self, ptr):
        self._log("free_sync", ptr, self.dev)
        return (_Err.cudaSuccess,)

    def cudaDeviceSynchronize(self):
        self._log("device_sync", self.dev)
        return (_Err.cudaSuccess,)

    def cudaStreamSynchronize(self, stream):
        self._log("stream_sync", stream)
        return (_Err.cudaSuccess,)

    def cudaMemsetAsync(self, ptr, value, n, stream):
        self._log("memset", ptr, value, n, stream)
        return (_Err.cudaSuccess,)

    def cudaGetLastError(self):
        return (_Err.cudaSuccess,)

    def cudaMemGetInfo(self):
        return (_Err.cudaSuccess, 1 << 30, 16 << 30)

    def cudaGetErrorName(self, err):
        return (_Err.cudaSuccess, _Err(int(err)).name.encode())

    def cudaGetErrorString(self, err):
        return (_Err.cudaSuccess, b"fake error")

    def of(self, kind):
        return [c for c in self.calls if c[0] == kind]


@pytest.fixture
def rt(monkeypatch):
    """A fake runtime with two devices and a fresh, empty allocator cache."""
    fake_rt = FakeRuntime()
    monkeypatch.setattr(_cuda, "_rt", fake_rt)
    monkeypatch.setattr(_cuda, "_device_count", 2)
    cache = allocator.CachingAllocator()  # what the cache functions manage and arrays use
    monkeypatch.setattr(allocator, "_default", cache)
    monkeypatch.setattr(allocator, "_resource", cache)
    monkeypatch.setattr(marr, "_layouts", {})
    yield fake_rt
    gc.collect()  # blocks of this test go back to its pool while the fakes are still in place


F32 = np.dtype(np.float32)


def test_size_classes():
    mib = 1 << 20
    cases = {1: 512, 512: 512, 513: 1024, 1000: 1024, mib: mib, mib + 1: mib + mib // 8}
    cases |= {3 * mib: 3 * mib, 3 * mib + 1: 3 * mib + mib // 4, 100 * mib: 104 * mib}
    for n, cls in cases.items():
        assert allocator.size_class(n) == cls, n
    rng = np.random.default_rng(0)
    sizes = sorted(int(n) for n in rng.integers(1, 1 << 34, 2000))
    classes = [allocator.size_class(n) for n in sizes]
    assert classes == sorted(classes)  # monotonic
    for n, cls in zip(sizes, classes, strict=True):
        assert n <= cls < n + max(512, n // 8)  # < 12.5% above 1 MiB
        assert cls % 512 == 0


def test_same_stream_reuses_the_block_without_a_cuda_call(rt):
    a = mem.empty((100,), F32, 0, 0x10)
    ptr, base = a.ptr, a.base
    assert base.nbytes == 512 and base.stream == 0x10 and "block" in repr(base)
    del a, base
    calls = len(rt.calls)
    b = mem.empty((120,), F32, 0, 0x10)  # 480 bytes: the same 512-byte class
    assert b.ptr == ptr and b.shape == (120,) and b.nbytes == 480 and b.stream == 0x10
    assert len(rt.calls) == calls  # no malloc, no free, not even cudaGetDevice
    stats = mem.cache_stats()
    assert (stats["hits"], stats["misses"]) == (1, 1)
    assert stats["used_bytes"] == 512 and stats["used_blocks"] == 1 and stats["cached_bytes"] == 0
    assert len(rt.of("malloc")) == 1 and not rt.of("free")


def test_no_reuse_across_streams_or_devices(rt):
    a = mem.empty((100,), F32, 0, 0x10)
    pa = a.ptr
    del a
    b = mem.empty((100,), F32, 0, 0x20)  # another stream: its own block
    c = mem.empty((100,), F32, 1, 0x10)  # another device
    assert len({pa, b.ptr, c.ptr}) == 3
    assert [m[2:4] for m in rt.of("malloc")] == [(0x10, 0), (0x20, 0), (0x10, 1)]
    assert rt.dev == 0  # the device switch for device 1 was undone
    assert mem.empty((100,), F32, 0, 0x10).ptr == pa  # back on the first stream: reused
    del b, c
    assert mem.cache_stats(1)["cached_blocks"] == 1 and mem.cache_stats(0)["cached_blocks"] == 2


def test_allocations_are_rounded_to_their_class(rt):
    mib = 1 << 20
    a = mem.empty((1000,), np.uint8, 0, 0)
    b = mem.empty((3 * mib + 1,), np.uint8, 0, 0)
    assert [m[1] for m in rt.of("malloc")] == [1024, 3 * mib + mib // 4]
    assert a.nbytes == 1000 and b.nbytes == 3 * mib + 1  # the arrays keep their own size
    del a
    c = mem.empty((4, 64), F32, 0, 0)  # 1024 bytes: reuses a's 1024-byte block
    d = mem.empty((2000,), np.uint8, 0, 0)  # 2048: a new block
    assert len(rt.of("malloc")) == 3 and c.ptr != d.ptr
    zero = mem.empty((0, 5), F32, 0, 0)  # nothing allocated, nothing cached
    assert zero.ptr == 0 and zero.base is None and len(rt.of("malloc")) == 3


def test_cache_limit_frees_the_oldest_blocks(rt):
    assert mem.get_cache_limit() == mem.DEFAULT_CACHE_LIMIT == 1 << 30
    assert mem.set_cache_limit(4096) == 1 << 30
    arrays = [mem.empty((512,), F32, 0, s) for s in (0x10, 0x20, 0x30)]  # 2048 bytes each
    ptrs = [a.ptr for a in arrays]
    while arrays:  # freed in order: 0x10's block, then 0x20's, then 0x30's
        arrays.pop(0)
    assert rt.of("free") == [("free", ptrs[0], 0x10, 0)]  # on its own stream
    stats = mem.cache_stats()
    assert stats["cached_bytes"] == 4096 and stats["cached_blocks"] == 2
    assert stats["released_blocks"] == 1 and stats["limit"] == 4096
    big = mem.empty((5000,), np.uint8, 0, 0x10)  # above the limit: exact size, never cached
    assert rt.of("malloc")[-1][1] == 5000
    pbig = big.ptr
    del big
    assert rt.of("free")[-1] == ("free", pbig, 0x10, 0)
    assert mem.cache_stats()["cached_bytes"] == 4096
    mem.set_cache_limit(2048)  # lowering it trims at once
    assert rt.of("free")[-1] == ("free", ptrs[1], 0x20, 0)
    mem.set_cache_limit(0)  # caching off
    assert mem.cache_stats()["cached_blocks"] == 0 and len(rt.of("free")) == 4
    a = mem.empty((10,), F32, 0, 0)
    pa = a.ptr
    del a
    assert rt.of("free")[-1] == ("free", pa, 0, 0) and mem.cache_stats()["used_bytes"] == 0
    for bad in (-1, 1.5, True, "1G"):
        with pytest.raises(ValueError, match="cache limit"):
            mem.set_cache_limit(bad)


def test_empty_cache_frees_every_cached_block(rt):
    keep = mem.empty((10,), F32, 0, 0x10)
    arrays = [mem.empty((n,), F32, d, 0x10) for n in (10, 1000, 300_000) for d in (0, 1)]
    ptrs = {a.ptr for a in arrays}
    nbytes = sum(a.base.nbytes for a in arrays)
    del arrays[:]
    assert not rt.of("free")
    rt.calls.clear()
    assert mem.empty_cache() == nbytes
    assert {f[1] for f in rt.of("free")} == ptrs  # every block, through cudaFreeAsync
    assert {f[2] for f in rt.of("free")} == {0}  # after a device sync: safe on stream 0
    for dev in (0, 1):
        mine = [c for c in rt.calls if c[-1] == dev]
        assert mine[0] == ("device_sync", dev) and mine[-1] == ("device_sync", dev)
    stats = mem.cache_stats()
    assert stats["cached_bytes"] == 0 and stats["released_blocks"] == 6
    assert stats["used_blocks"] == 1  # a live array is untouched
    rt.calls.clear()
    assert mem.empty_cache() == 0 and rt.calls == []  # nothing cached: no sync either
    del keep
    assert mem.empty_cache(1) == 0 and mem.empty_cache(0) == 512


def test_out_of_memory_releases_the_cache_and_retries(rt):
    cached = [mem.empty((1 << 20,), F32, 0, 0x10) for _ in range(3)]
    ptrs = {a.ptr for a in cached}
    del cached[:]
    rt.calls.clear()
    rt.oom = 1  # the first attempt fails, the retry (after the release) succeeds
    a = mem.empty((5 << 20,), F32, 0, 0x10)
    kinds = [c[0] for c in rt.calls]
    assert kinds == ["oom", "device_sync", "free", "free", "free", "device_sync", "malloc"]
    assert {f[1] for f in rt.of("free")} == ptrs
    stats = mem.cache_stats()
    assert stats["oom_releases"] == 1 and stats["cached_bytes"] == 0
    assert stats["used_blocks"] == 1
    used = stats["used_bytes"]
    rt.oom = -1  # the retry fails too: AllocationError, as before the cache existed
    with pytest.raises(errors.AllocationError) as info:
        mem.empty((1000 << 10,), np.uint8, 0, 0x10)  # 1000 KiB, a 1000 KiB class
    exc = info.value
    assert isinstance(exc, MemoryError) and "out of memory" in str(exc)
    assert (exc.requested, exc.free, exc.total, exc.device) == (1000 << 10, 1 << 30, 16 << 30, 0)
    with pytest.raises(errors.AllocationError) as info:
        mem.empty((1000,), np.uint8, 0, 0x10)  # a 1024-byte class: the error names 1000 bytes
    assert info.value.requested == 1000 and "(1000 bytes)" in str(info.value)
    with pytest.raises(MemoryError, match="absurd"):
        mem.empty((1 << 40,), np.uint8, 0, 0x10)
    assert mem.cache_stats()["used_bytes"] == used  # the failed attempt is not counted
    assert mem.cache_stats()["oom_releases"] == 3
    rt.oom = 0
    del a


def test_workspaces_release_the_cache_on_out_of_memory(rt):
    a = mem.empty((1 << 20,), F32, 0, 0)
    pa = a.ptr
    del a
    rt.oom = 1
    h = Handle.from_ptr(0x1000, 0)
    ptr, size = mem.get_workspace(h, 1 << 20)
    assert ptr and size == 1 << 20
    assert ("free", pa, 0, 0) in rt.calls and mem.cache_stats()["cached_blocks"] == 0
    h.close()


def test_views_keep_the_block_alive(rt):
    a = mem.empty((4, 8), F32, 0, 0)
    ptr, ref = a.ptr, weakref.ref(a.base)
    v = a[1:].T
    del a
    gc.collect()
    assert ref() is not None and mem.cache_stats()["cached_blocks"] == 0
    assert mem.empty((4, 8), F32, 0, 0).ptr != ptr  # still in use: not handed out
    assert v.base is ref() and v.ptr == ptr + 32
    del v
    gc.collect()
    assert ref() is None and mem.cache_stats()["cached_blocks"] == 2
    assert mem.empty((4, 8), F32, 0, 0).ptr in {ptr, rt.of("malloc")[1][4]}


def test_dlpack_and_cai_exports_of_cached_memory(rt):
    a = mem.empty((2, 3), F32, 0, 0x10)
    cai = a.__cuda_array_interface__
    assert cai["data"] == (a.ptr, False) and cai["stream"] == 0x10
    capsule = a.__dlpack__(stream=-1)
    ref = weakref.ref(a.base)
    del a
    gc.collect()
    assert ref() is not None  # the capsule keeps the array, and so the block
    del capsule
    gc.collect()
    assert ref() is None and mem.cache_stats()["cached_blocks"] == 1


def test_a_stream_object_stays_alive_while_its_block_is_cached(rt):
    class Stream:
        def __cuda_stream__(self):
            return (0, 0x40)

    s = Stream()
    ref = weakref.ref(s)
    a = mem.empty((10,), F32, 0, s)
    assert a.stream == 0x40
    del s, a
    gc.collect()
    assert ref() is not None and mem.cache_stats()["cached_blocks"] == 1
    b = mem.empty((10,), F32, 0, 0x40)  # the same stream as an int: reused, object let go
    gc.collect()
    assert ref() is None and b.ptr == rt.of("malloc")[0][4]


def test_per_thread_default_stream_is_never_cached(rt):
    a = mem.empty((100,), F32, 0, 2)  # cudaStreamPerThread: another stream in every thread
    pa = a.ptr
    assert rt.of("malloc")[-1][1] == 400  # exact size
    del a
    assert rt.of("free") == [("free", pa, 2, 0)]
    stats = mem.cache_stats()
    assert stats["cached_blocks"] == stats["used_bytes"] == stats["used_blocks"] == 0


def test_devices_without_memory_pools_use_cudamalloc(rt):
    rt.no_pools = True
    a = mem.empty((100,), F32, 0, 0)
    assert rt.of("malloc_sync") and not rt.of("malloc")
    pa = a.ptr
    del a
    assert mem.empty((100,), F32, 0, 0).ptr == pa  # cached like the others
    gc.collect()
    mem.empty_cache()
    assert rt.of("free_sync") == [("free_sync", pa, 0)] and not rt.of("free")


def test_a_destroyed_stream_falls_back_to_a_synchronized_free(rt):
    mem.set_cache_limit(512)
    a, b = mem.empty((10,), F32, 0, 0x10), mem.empty((10,), F32, 0, 0x20)
    pa = a.ptr
    rt.dead_streams.add(0x10)  # destroyed against the rules, its block still cached
    del a, b  # b's block pushes a's out: its free on 0x10 fails
    assert rt.calls[-2:] == [("device_sync", 0), ("free", pa, 0, 0)]


def test_finalizers_never_wait_for_the_lock(rt):
    a = mem.empty((10,), F32, 0, 0)
    cache = allocator.memory_resource()
    with cache._lock:  # as if another thread (or this one, inside an allocation) held it
        del a
        gc.collect()
        assert len(cache._pending) == 1
    stats = mem.cache_stats()  # the next holder of the lock takes the pending block in
    assert stats["cached_blocks"] == 1 and not cache._pending


def test_nothing_happens_at_interpreter_shutdown(rt, monkeypatch):
    mem.set_cache_limit(0)  # a free would be a CUDA call
    a = mem.empty((10,), F32, 0, 0)
    with monkeypatch.context() as m:
        m.setattr(sys, "is_finalizing", lambda: True)
        del a
        gc.collect()
    pool = allocator.memory_resource()._pools[0]
    assert rt.calls == [rt.calls[0]] and pool.used_blocks == 1  # untouched


def test_fast_path_returns_what_the_slow_path_does(rt):
    nhwc = (57600, 4, 1920, 64)
    slow = mem.empty([8, 16, 30, 30], "float32", 0, 0, strides=list(nhwc))  # lists: slow path
    assert len(marr._layouts) == 1  # only the normalized key (a list is not hashable)
    fast = mem.empty((8, 16, 30, 30), F32, 0, 0, strides=nhwc)
    for x in (slow, fast):
        assert (x.shape, x.dtype, x.strides, x.device, x.stream) == (
            (8, 16, 30, 30),
            F32,
            nhwc,
            0,
            0,
        )
    np_ints = tuple(np.int64(n) for n in (8, 16, 30, 30))
    odd = mem.empty(np_ints, F32, 0, 0, strides=nhwc)  # equal key: the normalized shape comes back
    assert all(type(n) is int for n in odd.shape)
    default = mem.empty((3, 4))  # no device: the current one, default float32 C order
    assert (default.device, default.dtype, default.strides) == (0, F32, (16, 4))
    with pytest.raises(ValueError, match="dense"):
        mem.empty((8, 16, 30, 30), F32, 0, 0, strides=(4, 4, 4, 4))
    with pytest.raises(TypeError, match="int16"):
        mem.empty((2,), np.int16, 0, 0)
    with pytest.raises(ValueError, match="negative"):
        mem.empty((8, 16, 30, 30), F32, 0, -1, strides=nhwc)
    with pytest.raises(ValueError, match="does not exist"):
        mem.empty((2,), F32, 5, 0)
    z = mem.zeros((8, 16, 30, 30), F32, 0, 0, strides=nhwc)  # zeros shares the fast path
    assert z.strides == nhwc


def test_layout_cache_is_bounded(rt, monkeypatch):
    monkeypatch.setattr(marr, "_LAYOUTS_MAX", 8)
    for n in range(1, 20):
        mem.empty((n,), F32, 0, 0)
        assert len(marr._layouts) <= 8


@pytest.mark.parametrize("limit", [None, 8192], ids=["default-limit", "evicting"])
def test_threads_share_the_cache_safely(rt, limit):
    if limit is not None:
        mem.set_cache_limit(limit)
    n_threads, rounds = 8, 300
    live: set[int] = set()
    live_lock = threading.Lock()
    errors_seen: list[BaseException] = []
    start = threading.Barrier(n_threads)

    def work(i):
        try:
            rng = np.random.default_rng(i)
            start.wait()
            held = []
            for _ in range(rounds):
                stream = 0x10 if rng.random() < 0.5 else 0x100 + i
                a = mem.empty((int(rng.integers(1, 3000)),), F32, int(rng.integers(0, 2)), stream)
                with live_lock:
                    assert a.ptr not in live, "a block handed out twice"
                    live.add(a.ptr)
                held.append(a)
                if len(held) > 4 or rng.random() < 0.3:
                    old = held.pop(int(rng.integers(0, len(held))))
                    with live_lock:
                        live.remove(old.ptr)
                    del old
            with live_lock:
                live.difference_update(x.ptr for x in held)
        except BaseException as exc:
            errors_seen.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    gc.collect()
    assert not errors_seen, errors_seen
    stats = mem.cache_stats()
    assert stats["used_blocks"] == stats["used_bytes"] == 0
    assert stats["hits"] + stats["misses"] == n_threads * rounds
    assert stats["misses"] == len(rt.of("malloc"))
    assert stats["cached_blocks"] == len(rt.of("malloc")) - len(rt.of("free"))
    mem.empty_cache()
    assert sorted(m[4] for m in rt.of("malloc")) == sorted(f[1] for f in rt.of("free"))


def test_microbenchmark_of_a_cache_hit(rt):
    """Prints the host cost of empty() on a cache hit and of the free (not asserted: speed
    targets do not belong in unit tests; the fake runtime is never reached on a hit)."""
    shape, strides, k, best_alloc, best_free = (8, 16, 30, 30), (57600, 3600, 120, 4), 100, 1e9, 1e9
    held = [mem.empty(shape, F32, 0, 0, strides=strides) for _ in range(k)]
    held.clear()
    for _ in range(50):
        t0 = time.perf_counter()
        for _ in range(k):
            held.append(mem.empty(shape, F32, 0, 0, strides=strides))
        t1 = time.perf_counter()
        held.clear()
        t2 = time.perf_counter()
        best_alloc, best_free = min(best_alloc, t1 - t0), min(best_free, t2 - t1)
    assert mem.cache_stats()["misses"] == k
    print(
        f"\nempty() on a cache hit: {best_alloc / k * 1e6:.2f} us, "
        f"free into the cache: {best_free / k * 1e6:.2f} us"
    )


def test_another_memory_resource_can_replace_the_cache(rt):
    class Bump:
        """A toy resource: hands out addresses, never frees (enough to see who allocates)."""

        def __init__(self):
            self.asked = []

        def allocate(self, nbytes, device, stream, keep=None):
            self.asked.append((nbytes, device, stream, keep))
            block = type("B", (), {})()
            block.ptr, block.nbytes, block.device, block.stream = (
                0x1000 * len(self.asked),
                nbytes,
                device,
                stream,
            )
            return block

    bump = Bump()
    previous = allocator.set_memory_resource(bump)
    try:
        assert isinstance(bump, allocator.MemoryResource)
        a = mem.empty((10,), F32, 0, 0x10)
        b = mem.zeros((2, 3), np.float16, 1)  # the slow path too
        assert (a.ptr, a.base.nbytes, b.ptr) == (0x1000, 40, 0x2000)
        assert bump.asked == [(40, 0, 0x10, None), (12, 1, 0, None)]
        assert not rt.of("malloc") and mem.cache_stats()["misses"] == 0  # the cache is bypassed
    finally:
        assert allocator.set_memory_resource(previous) is bump
    assert mem.empty((10,), F32, 0, 0x10).base.nbytes == 512  # the caching allocator again


def test_block_finalizer_survives_module_teardown(monkeypatch):
    """A block released late at interpreter exit (seen with a JAX array viewing a pycudnn
    result) runs its weakref callback after the module's globals are set to None: the callback
    must use what it bound at definition, not raise "'NoneType' object is not callable"."""
    from pycudnn.memory import allocator as al

    cache = al.CachingAllocator()

    class Blk:
        pass

    blk = Blk()
    ref = weakref.ref(blk)
    pool = al._Pool(0)
    cache._live[ref] = (pool, (0, 512), 0x1000, None)
    monkeypatch.setattr(al, "_recycle", None)
    monkeypatch.setattr(al, "sys", None)
    cache._block_dead(ref)  # no exception
    assert ref not in cache._live


def test_arrays_take_every_frameworks_dtypes():
    # issue 29: the memory layer's dtype arguments (empty, zeros, views) read torch/JAX dtypes
    from _framework_dtypes import jax_numpy, torch

    assert fake((2, 3), torch.float16).dtype == np.float16
    assert fake((2, 3), torch.bfloat16).dtype == np.dtype(ml_dtypes.bfloat16)
    assert fake((2, 3), torch.int64).data_type == DataType.INT64
    assert fake((2, 3), jax_numpy().bfloat16).data_type == DataType.BFLOAT16
    with pytest.raises(TypeError, match=r"torch\.complex64"):
        fake((2,), torch.complex64)
