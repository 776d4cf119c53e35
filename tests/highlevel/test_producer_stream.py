"""Streams follow the producer (issue 29): with ``stream=`` not given, a high-level call on torch
tensors runs on torch's current stream of their device (CuPy arrays: CuPy's), other arrays keep
the handle's stream. No GPU and no torch needed: the frameworks are stand-ins in ``sys.modules``
and the C calls are recorded (``tests/support/_fake_device.py``)."""

from __future__ import annotations

import sys
import types

import _fake_device as fd
import pytest
from _fake_device import Fake

import pycudnn
from pycudnn.highlevel import _operand

capture = fd.capture  # the fixture: a fake handle, allocator and workspace; C calls recorded


class TorchLike(Fake):
    """A torch tensor as far as the stream reader sees one (its type's module is torch's)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.index = kwargs.get("device", 0)

    def get_device(self):
        return self.index


TorchLike.__module__ = "torch"


class CupyLike(Fake):
    """A CuPy array as far as the stream reader sees one."""

    @property
    def device(self):  # CuPy's Device object: .id
        return types.SimpleNamespace(id=self._dev)

    @device.setter
    def device(self, value):
        self._dev = value


CupyLike.__module__ = "cupy._core.core"

for _tp in (TorchLike, CupyLike):
    _operand.register_operand_type(_tp, lambda f: (f.ptr, f.shape, f.strides, f.dt, f._device()))
TorchLike._device = lambda self: self.index  # type: ignore[attr-defined]
CupyLike._device = lambda self: self._dev  # type: ignore[attr-defined]


@pytest.fixture
def frameworks(monkeypatch):
    """torch and CuPy stand-ins whose current stream on device d is 0x7000 + d / 0x9000 + d."""
    torch_c = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda d: 0x7000 + d)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(_C=torch_c))
    cuda = types.SimpleNamespace(get_current_stream=lambda d: types.SimpleNamespace(ptr=0x9000 + d))
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(_operand, "_STREAMS", {})  # readers are made per type on first sight


def test_the_reader_of_each_framework(frameworks):
    assert _operand.producer_stream(TorchLike((2, 3), device=0)) == 0x7000
    assert _operand.producer_stream(TorchLike((2, 3), device=1)) == 0x7001
    assert _operand.producer_stream(TorchLike((2, 3), device=-1)) is None  # a CPU tensor
    assert _operand.producer_stream(CupyLike((2, 3), device=1)) == 0x9001
    assert _operand.producer_stream(Fake((2, 3))) is None  # pycudnn's own arrays, JAX's, ...
    assert _operand.producer_stream(3.0) is None


def test_a_torch_without_cuda_reads_no_stream(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(_C=types.SimpleNamespace()))
    monkeypatch.setattr(_operand, "_STREAMS", {})
    assert _operand.producer_stream(TorchLike((2, 3))) is None


def test_calls_run_on_the_producers_stream_unless_given_one(frameworks, capture):
    h = capture.handle
    h.stream = 0
    pycudnn.dnn_activation(Fake((2, 3, 4, 5)), "relu")
    assert h.stream == 0  # no framework: the handle's stream as it was
    pycudnn.dnn_activation(TorchLike((2, 3, 4, 5)), "relu")
    assert h.stream == 0x7000  # torch's current stream (a cached call: the entry's run binds it)
    pycudnn.dnn_activation(TorchLike((2, 3, 4, 5)), "relu", stream=5)
    assert h.stream == 5  # stream= wins
    pycudnn.dnn_softmax(CupyLike((2, 3, 4, 5)))
    assert h.stream == 0x9000
    x = TorchLike((2, 3, 4, 5))
    pycudnn.dnn_pool(x, (2, 2))
    assert h.stream == 0x7000
