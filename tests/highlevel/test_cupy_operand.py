"""CuPy arrays are read from their own attributes (as torch tensors are), not through a protocol
round trip (issue 29's interop measurement: about 20 us a call through
``__cuda_array_interface__``). No GPU, no CuPy: a stand-in with CuPy's type name and module."""

from __future__ import annotations

import types

import numpy as np
import pytest

from pycudnn.enums import DataType
from pycudnn.highlevel import _operand


class ndarray:  # CuPy's class name: the getter is chosen by it
    """What the getter reads of a ``cupy.ndarray``: data.ptr, shape, byte strides, itemsize,
    dtype, device.id."""

    def __init__(self, ptr, shape, strides, dtype="float16", device=0):
        self._ptr, self._dev = ptr, device
        self.shape, self.strides = shape, strides
        self.dtype = np.dtype(dtype)
        self.itemsize = self.dtype.itemsize

    @property
    def data(self):  # CuPy's MemoryPointer (a property of the class, as in CuPy)
        return types.SimpleNamespace(ptr=self._ptr)

    @property
    def device(self):
        return types.SimpleNamespace(id=self._dev)


ndarray.__module__ = "cupy._core.core"


def test_read_from_the_arrays_attributes():
    a = ndarray(0x10000, (2, 3, 4), (24, 2, 6), "float16", device=1)  # a permuted view
    assert _operand.raw_operand(a) == (0x10000, (2, 3, 4), (12, 1, 3), DataType.HALF, 1)
    ptr, key = _operand.key_of(a)
    assert ptr == 0x10000 and key == ((2, 3, 4), (12, 1, 3), DataType.HALF, 1, 0)
    assert _operand.operand(ndarray(0x20008, (5,), (4,), "float32")).strides == (1,)


def test_byte_strides_that_split_elements_are_refused():
    with pytest.raises(ValueError, match=r"byte strides \(3,\) that are not whole 2-byte"):
        _operand.raw_operand(ndarray(0x10000, (4,), (3,)))


def test_other_cupy_types_keep_the_protocol_reader():
    class Other:
        pass

    Other.__module__ = "cupy.cuda.memory"
    assert _operand._getter(Other) is _operand._from_other
    assert _operand._getter(ndarray) is _operand._from_cupy
