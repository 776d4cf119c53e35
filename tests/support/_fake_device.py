"""A fake device for the CPU tests of the high-level operations (activations, softmax, tensor
arithmetic, dropout, spatial transformer, reduction, LRN, CTC): fake arrays, a fake handle, and
fixtures that either forbid every way into CUDA/cuDNN (``no_c``: validation must come first) or
record the C calls an operation makes (``capture``: the launches' plumbing, with real
descriptors, which need no GPU).

Import the fixtures into a test module: ``from _fake_device import Fake, capture, no_c``.
"""

from __future__ import annotations

import ctypes
import itertools

import numpy as np
import pytest

from pycudnn import _layout, memory
from pycudnn.enums import DataType
from pycudnn.highlevel import _call, _operand, clear_caches

F16, BF16, F32, F64 = DataType.HALF, DataType.BFLOAT16, DataType.FLOAT, DataType.DOUBLE
I32, U8 = DataType.INT32, DataType.UINT8
ITEMSIZE = {F16: 2, BF16: 2, F32: 4, F64: 8, I32: 4, U8: 1, DataType.INT64: 8}
_addr = itertools.count(1)


class Fake:
    """A fake device array: an address, shape, element strides, DataType and device; ``host``
    (optional) is what :meth:`get` returns."""

    def __init__(self, shape, dt=F32, strides=None, ptr=None, device=0, host=None, nhwc=False):
        self.shape = tuple(shape)
        self.dt = dt
        self.strides = (
            tuple(strides)
            if strides is not None
            else _layout.packed_strides(self.shape, nhwc and len(self.shape) > 2)
        )
        self.ptr = (next(_addr) << 32) if ptr is None else ptr
        self.device = device
        self.host = host
        self.filled = []

    @property
    def nbytes(self):
        return int(np.prod(self.shape)) * ITEMSIZE[self.dt]

    def get(self, stream=None):
        return np.asarray(self.host)

    def fill_(self, value, stream=None):
        self.filled.append(value)
        return self


_operand.register_operand_type(Fake, lambda f: (f.ptr, f.shape, f.strides, f.dt, f.device))


class CCall(BaseException):
    """Raised by every patched entry into the GPU/cuDNN: a validation error must come first
    (BaseException, so ``pytest.raises(ValueError)`` cannot swallow it)."""


def _boom(*args, **kwargs):
    raise CCall("a handle, allocation or cuDNN call was attempted")


@pytest.fixture
def no_c(monkeypatch):
    """Every way into CUDA/cuDNN raises CCall (descriptors stay real: they need no GPU)."""
    monkeypatch.setattr(_call._handle, "get_handle", _boom)
    monkeypatch.setattr(_call, "quiet", _boom)
    for name in ("empty", "zeros", "get_workspace", "asarray", "to_device"):
        monkeypatch.setattr(memory, name, _boom)
    clear_caches()
    yield
    clear_caches()


class DummyHandle:
    ptr = 0x1234
    device = 0
    stream = 0

    def set_stream(self, s):
        self.stream = s
        return s

    def workspace(self, nbytes, stream=None):
        return 0xABC000, nbytes


class Recorder:
    """Stands in for ``_call.quiet``: every C function records ``(name, args)``; size queries
    answer ``sizes.get(name, 0)``."""

    def __init__(self):
        self.calls = []
        self.sizes = {}

    def __call__(self, name):
        def fn(*args):
            self.calls.append((name, args))
            for a in args:
                obj = getattr(a, "_obj", None)
                if isinstance(obj, ctypes.c_size_t):
                    obj.value = self.sizes.get(name, 0)
            return 0

        return fn

    def names(self):
        return [n for n, _ in self.calls]

    def of(self, name):
        return [args for n, args in self.calls if n == name]


def _allocate(shape, dtype, device=None, stream=None, *, strides=None):
    dt = _operand.data_type(np.dtype(dtype))
    shape = tuple(shape) if not isinstance(shape, int) else (shape,)
    el = None if strides is None else tuple(s // np.dtype(dtype).itemsize for s in strides)
    return Fake(shape, dt, el, device=device or 0)


def _to_device(a, stream=None, **kwargs):
    a = np.asarray(a)
    return Fake(a.shape, _operand.data_type(a.dtype), host=a)


@pytest.fixture
def capture(monkeypatch):
    """A fake handle, allocator and workspace; ``_call.quiet`` records the C calls."""
    rec = Recorder()
    handle = DummyHandle()
    rec.handle = handle
    monkeypatch.setattr(_call._handle, "get_handle", lambda device=None: handle)
    monkeypatch.setattr(_call, "quiet", rec)
    monkeypatch.setattr(memory, "empty", _allocate)
    monkeypatch.setattr(memory, "zeros", _boom)
    monkeypatch.setattr(memory, "asarray", lambda obj, **kw: obj)
    monkeypatch.setattr(memory, "to_device", _to_device)
    clear_caches()
    yield rec
    clear_caches()
