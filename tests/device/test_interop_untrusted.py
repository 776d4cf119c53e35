"""Interop treats foreign objects as untrusted (issue 16), without a GPU.

``__cuda_array_interface__`` records are parsed with ``check=False`` (no pointer query), DLPack
capsules are hand-built with ctypes (the producer may lie in every field) or come from numpy, and
the exporter is fed values DLPack cannot hold. Every refusal is a ``TypeError`` (wrong kind),
``ValueError`` (wrong value) or ``BufferError`` (an impossible capsule) naming the field and value.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import pycudnn
from pycudnn.memory import _dlpack
from pycudnn.memory.array import DeviceArray
from pycudnn.memory.interop import parse_cai

ADDR = 0x7F00_0000_0000


class CAI:
    def __init__(self, cai):
        self.__cuda_array_interface__ = cai


def good_cai(**changes):
    cai = {
        "shape": (2, 3),
        "typestr": "<f4",
        "data": (ADDR, False),
        "version": 3,
        "strides": None,
        "stream": None,
    }
    cai.update(changes)
    return cai


# -- __cuda_array_interface__ ----------------------------------------------------------------------
CAI_CASES = [
    # (changes, exception, fragment of the message)
    ({"typestr": None}, TypeError, "['typestr'] must be a str"),
    ({"typestr": 42}, TypeError, "['typestr'] must be a str"),
    ({"typestr": "nonsense"}, TypeError, "unknown typestr"),
    ({"version": 99}, ValueError, "version 99 is not supported"),
    ({"version": "3"}, TypeError, "['version'] must be an int"),
    ({"version": True}, TypeError, "['version'] must be an int"),
    ({"version": 3.0}, TypeError, "['version'] must be an int"),
    ({"data": (0, False)}, ValueError, "NULL data pointer"),
    ({"data": (None, False)}, ValueError, "NULL data pointer"),
    ({"data": (-1, False)}, ValueError, "data[0]=-1"),
    ({"data": (2**64, False)}, ValueError, "data[0]=18446744073709551616"),
    ({"data": (1.5, False)}, TypeError, "data[0] must be an int"),
    ({"data": ("0x10", False)}, TypeError, "data[0] must be an int"),
    ({"data": (ADDR,)}, TypeError, "(pointer, readonly) pair"),
    ({"data": None}, TypeError, "(pointer, readonly) pair"),
    ({"data": (ADDR, "False")}, TypeError, "readonly) must be a bool, got 'False'"),
    ({"data": (ADDR, 0)}, TypeError, "readonly) must be a bool"),
    ({"strides": (12.0, 4.0)}, TypeError, "strides[0] must be an int, got 12.0"),
    ({"strides": (6, 2)}, ValueError, "strides[0]=6 bytes is not a multiple of the item size"),
    ({"strides": (4,)}, ValueError, "do not match"),
    ({"strides": "abc"}, TypeError, "['strides'] must be a tuple of ints"),
    ({"strides": (2**63, 4)}, ValueError, "strides[0]="),
    ({"shape": (-1, 3)}, ValueError, "shape[0]=-1"),
    ({"shape": (2**40, 2**40)}, ValueError, "overflows int64"),
    ({"shape": (2**63,)}, ValueError, "shape[0]=9223372036854775808"),
    ({"shape": (1.0, 2)}, TypeError, "shape[0] must be an int"),
    ({"shape": (True, 2)}, TypeError, "shape[0] must be an int"),
    ({"shape": 6}, TypeError, "['shape'] must be a tuple of ints"),
    ({"shape": (1,) * 65}, ValueError, "65 entries"),
    ({"stream": True}, TypeError, "stream must be an int"),
    ({"stream": -1}, ValueError, "stream=-1"),
    ({"stream": 2**64}, ValueError, "stream="),
    ({"stream": 0}, ValueError, "stream 0 is not allowed"),
    ({"data": (2**64 - 8, False), "shape": (4,)}, ValueError, "reaches outside"),
    ({"data": (16, False), "shape": (8,), "strides": (-4,)}, ValueError, "reaches outside"),
    ({"mask": object()}, NotImplementedError, "masked"),
]


@pytest.mark.parametrize(("changes", "exc", "fragment"), CAI_CASES)
def test_cai_fields_are_checked(changes, exc, fragment):
    with pytest.raises(exc) as info:
        pycudnn.asarray(CAI(good_cai(**changes)), check=False, argument="img")
    assert fragment in str(info.value), str(info.value)
    assert str(info.value).startswith("img"), str(info.value)


@pytest.mark.parametrize(
    ("cai", "fragment"),
    [
        ([("shape", (2,))], "must be a dict, got list"),
        ("x", "must be a dict, got str"),
        ({"typestr": "<f4", "data": (ADDR, False), "version": 3}, "no 'shape' entry"),
        ({"shape": (2,), "data": (ADDR, False), "version": 3}, "no 'typestr' entry"),
        ({"shape": (2,), "typestr": "<f4", "version": 3}, "no 'data' entry"),
        ({"shape": (2,), "typestr": "<f4", "data": (ADDR, False)}, "no 'version' entry"),
    ],
)
def test_cai_structure_is_checked(cai, fragment):
    with pytest.raises(TypeError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        pycudnn.asarray(CAI(cai), check=False)


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"version": 2, "stream": 5},  # v2 carries no stream: ignored
        {"strides": (4, 8)},  # F order
        {"strides": [-12, 4], "data": (ADDR + 12, True)},  # negative strides, read-only
        {"shape": (0, 5), "data": (0, False)},  # empty: NULL allowed
        {"shape": (), "strides": ()},
        {"shape": [np.int64(2), np.int32(3)], "data": (np.uint64(ADDR), np.bool_(False))},
        {"typestr": "|u1", "strides": (3, 1)},
    ],
)
def test_valid_cai_records_give_the_right_view(changes):
    cai = good_cai(**changes)
    a = pycudnn.asarray(CAI(cai), check=False, device=0)
    version, shape, dt, ptr, readonly, strides, _stream = parse_cai(cai)
    assert a.shape == tuple(int(s) for s in cai["shape"]) == shape
    assert a.dtype == np.dtype(cai["typestr"]) == dt
    assert a.ptr == int(cai["data"][0] or 0) == ptr
    assert a.readonly is bool(cai["data"][1]) is readonly
    assert a.strides == strides
    if cai.get("strides") is not None:
        assert a.strides == tuple(int(s) for s in cai["strides"])
    assert a.device == 0 and version == cai["version"]


@pytest.mark.parametrize(("device", "exc"), [(-1, ValueError), (True, TypeError), (1.0, TypeError)])
def test_device_argument_is_checked(device, exc):
    with pytest.raises(exc, match="device="):
        pycudnn.asarray(CAI(good_cai()), check=False, device=device)


def test_dlpack_device_of_a_cai_producer_is_checked():
    class Liar(CAI):
        def __dlpack_device__(self):
            return (_dlpack.KDL_CUDA, -1)

    with pytest.raises(ValueError, match="device -1"):
        pycudnn.asarray(Liar(good_cai()), check=True)  # answered before any GPU query


# -- DLPack import: hand-built capsules ------------------------------------------------------------
# our own prototypes: ctypes.pythonapi's function objects are shared, and jax.ffi.pycapsule
# sets PyCapsule_New's argument types on the shared one
_New = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi)
)
_GetName = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(
    ("PyCapsule_GetName", ctypes.pythonapi)
)


class Capsule:
    """A DLPack capsule whose every field we choose; owns the memory it points to."""

    def __init__(
        self,
        *,
        ndim=2,
        shape=(2, 3),
        strides=None,
        data=ADDR,
        byte_offset=0,
        code=2,
        bits=32,
        lanes=1,
        device=(_dlpack.KDL_CUDA, 0),
        null_shape=False,
        versioned=False,
        version=(1, 0),
        flags=0,
    ):
        n = max(len(shape), 1)
        self.shape_arr = (ctypes.c_int64 * n)(*shape)
        self.strides_arr = None if strides is None else (ctypes.c_int64 * n)(*strides)
        if versioned:
            self.managed = _dlpack.DLManagedTensorVersioned()
            self.managed.version = _dlpack.DLPackVersion(*version)
            self.managed.flags = flags
            name = b"dltensor_versioned"
        else:
            self.managed = _dlpack.DLManagedTensor()
            name = b"dltensor"
        t = self.managed.dl_tensor
        t.data = data or None
        t.device = _dlpack.DLDevice(*device)
        t.ndim = ndim
        t.dtype = _dlpack.DLDataType(code, bits, lanes)
        i64p = ctypes.POINTER(ctypes.c_int64)
        t.shape = i64p() if null_shape else ctypes.cast(self.shape_arr, i64p)
        t.strides = i64p() if strides is None else ctypes.cast(self.strides_arr, i64p)
        t.byte_offset = byte_offset
        self.name = name
        self.capsule = _New(ctypes.addressof(self.managed), name, None)


DLPACK_BAD = [
    ({"ndim": -1}, BufferError, "ndim=-1"),
    ({"ndim": 1000}, BufferError, "ndim=1000"),
    ({"ndim": 2**31 - 1}, BufferError, "ndim=2147483647"),
    ({"ndim": 65, "shape": (1,) * 64}, BufferError, "ndim=65"),
    ({"null_shape": True}, BufferError, "NULL shape array"),
    ({"shape": (-2, 3)}, BufferError, "shape[0]=-2"),
    ({"shape": (2**62, 2**62)}, BufferError, "overflows int64"),
    ({"data": 0}, BufferError, "NULL data for a tensor of 6 elements"),
    ({"data": 2**64 - 16, "byte_offset": 2**63}, BufferError, "byte_offset"),
    ({"byte_offset": 2**64 - 1}, BufferError, "byte_offset"),
    ({"device": (_dlpack.KDL_CUDA, -1)}, BufferError, "device_id=-1"),
    ({"data": 2**64 - 8}, BufferError, "reaches outside"),
    ({"strides": (-3, 1), "data": 8}, BufferError, "reaches outside"),
    ({"lanes": 4}, TypeError, "lanes"),
    ({"code": 5, "bits": 64}, TypeError, "not a dtype cuDNN supports"),
    ({"versioned": True, "version": (2, 0)}, BufferError, "DLPack 2.0"),
]


@pytest.mark.parametrize(("fields", "exc", "fragment"), DLPACK_BAD)
def test_lying_capsules_are_refused_and_left_unconsumed(fields, exc, fragment):
    cap = Capsule(**fields)
    with pytest.raises(exc) as info:
        _dlpack.from_dlpack(cap.capsule, stream=None)
    assert fragment in str(info.value), str(info.value)
    assert _GetName(cap.capsule) == cap.name  # not consumed: its producer still owns it
    # the same through the public entry point (a bare capsule)
    cap = Capsule(**fields)
    with pytest.raises((exc, pycudnn.errors.NotDeviceMemoryError)):
        pycudnn.asarray(cap.capsule)


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"strides": (1, 2)},
        {"strides": (-3, 1), "data": ADDR + 12},
        {"shape": (0, 3), "data": 0},
        {"shape": (), "ndim": 0},
        {"byte_offset": 64},
        {"code": 4, "bits": 16},  # bfloat16
        {"versioned": True, "flags": 1},  # read-only
    ],
)
def test_valid_capsules_give_the_right_view(fields):
    cap = Capsule(**fields)
    a = pycudnn.asarray(cap.capsule)  # a bare CUDA capsule: no GPU call needed to view it
    shape = fields.get("shape", (2, 3))
    assert a.shape == tuple(shape)
    assert a.ptr == (fields.get("data", ADDR) or 0) + fields.get("byte_offset", 0)
    item = a.itemsize
    if "strides" in fields:
        assert a.strides == tuple(s * item for s in fields["strides"])
    assert a.readonly is bool(fields.get("flags", 0) & 1)
    assert _GetName(cap.capsule) in (b"used_dltensor", b"used_dltensor_versioned")


def test_numpy_capsules_still_parse():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    imported = _dlpack.from_dlpack(x, stream=None)
    assert imported.shape == (3, 2) and imported.strides == x.strides


# -- DLPack export: what DLPack cannot represent ---------------------------------------------------
def _raw(ptr, shape, strides, dtype=np.float32):
    return DeviceArray(ptr, shape, np.dtype(dtype), strides, 0, 0, None)


@pytest.mark.parametrize(
    ("array", "fragment"),
    [
        (lambda: _raw(ADDR, (2**63,), (4,)), "shape[0]=9223372036854775808"),
        (lambda: _raw(2**64, (2,), (4,)), "does not fit in 64 bits"),
        (lambda: _raw(-8, (2,), (4,)), "does not fit in 64 bits"),
        (lambda: _raw(ADDR, (2, 2), (2**66, 4)), "strides[0]="),
        (lambda: _raw(ADDR, (1,) * 65, (4,) * 65), "65 dimensions"),
    ],
)
def test_export_refuses_what_dlpack_cannot_hold(array, fragment):
    with pytest.raises(BufferError) as info:
        array().__dlpack__(stream=-1)
    assert fragment in str(info.value), str(info.value)


def test_export_refuses_device_ids_beyond_int32():
    with pytest.raises(BufferError, match="device"):
        _dlpack.export(None, ADDR, (2,), None, np.float32, (2, 2**31))


def test_export_round_trips_through_import():
    a = DeviceArray.from_ptr(ADDR, (3, 4), np.float16, (2, 6), device=0, check=False)
    b = pycudnn.asarray(_dlpack.export(a, a.ptr, a.shape, a.strides, a.dtype, (2, 0)))
    assert (b.ptr, b.shape, b.strides, b.dtype) == (a.ptr, a.shape, a.strides, a.dtype)


@pytest.mark.parametrize(
    ("kwargs", "exc", "fragment"),
    [
        ({"ptr": -1}, ValueError, "not a 64-bit address"),
        ({"ptr": 2**64}, ValueError, "not a 64-bit address"),
        ({"ptr": 1.5}, TypeError, "int address"),
        ({"ptr": 0}, ValueError, "NULL data pointer"),
        ({"shape": (2**40, 2**40)}, ValueError, "overflows int64"),
        ({"device": -1}, ValueError, "device=-1"),
        ({"device": True}, TypeError, "device=True"),
        ({"strides": (4.0,), "shape": (2,)}, TypeError, "bool|int|integer"),
    ],
)
def test_from_ptr_checks_its_record(kwargs, exc, fragment):
    args = {"ptr": ADDR, "shape": (2, 3), "dtype": np.float32, "device": 0, **kwargs}
    with pytest.raises(exc, match=fragment):
        DeviceArray.from_ptr(
            args["ptr"],
            args["shape"],
            args["dtype"],
            args.get("strides"),
            device=args["device"],
            check=False,
        )
