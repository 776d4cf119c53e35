"""Descriptor paths that need a cuDNN handle (GPU machine only; marker ``gpu``).

Run there with
``PYTHONPATH=. python3 -m pytest -m gpu tests/descriptors/test_descriptors_gpu.py -q``.
Device buffers come straight from ``cuda.bindings.runtime.cudaMalloc`` (wrapped in a tiny object
with ``.ptr``/``.nbytes``), so these tests depend only on the ``HasPtr`` protocol.
"""

from __future__ import annotations

import gc
import weakref

import pytest

from pycudnn import enums, errors
from pycudnn.descriptors import (
    BackendDescriptor,
    DropoutDescriptor,
    RNNDataDescriptor,
    RNNDescriptor,
    TensorDescriptor,
)

pytestmark = pytest.mark.gpu


class DeviceBuffer:
    """Minimal device allocation exposing ``.ptr`` and ``.nbytes`` (the HasPtr protocol)."""

    def __init__(self, nbytes: int):
        from cuda.bindings import runtime

        err, ptr = runtime.cudaMalloc(max(nbytes, 1))
        assert int(err) == 0, err
        self.ptr = int(ptr)
        self.nbytes = nbytes
        self._free = weakref.finalize(self, runtime.cudaFree, self.ptr)


@pytest.fixture
def handle():
    from pycudnn.handle import get_handle

    return get_handle()


def test_dropout_states_and_readback(handle):
    size = DropoutDescriptor.states_size(handle)
    assert size > 0
    states = DeviceBuffer(size)
    d = DropoutDescriptor(handle, 0.25, states, seed=1234)
    assert d.is_set
    p, sptr, seed = d.read()
    assert p == pytest.approx(0.25) and sptr == states.ptr and seed == 1234
    assert d.dropout == pytest.approx(0.25) and d.seed == 1234
    assert repr(d) == "DropoutDescriptor(dropout=0.25, seed=1234)"
    # the descriptor keeps its states buffer alive (cuDNN writes to it on every call)
    ref = weakref.ref(states)
    del states
    gc.collect()
    assert ref() is not None
    d.close()
    gc.collect()
    assert ref() is None


def test_dropout_restore_and_zero_probability(handle):
    size = DropoutDescriptor.states_size(handle)
    states = DeviceBuffer(size)
    DropoutDescriptor(handle, 0.5, states, seed=7).close()
    d = DropoutDescriptor()
    d.restore(handle, 0.5, states, seed=7)
    assert d.read()[0] == pytest.approx(0.5)
    z = DropoutDescriptor(handle, 0.0)  # no states needed for p = 0
    assert z.dropout == 0.0


def test_dropout_bad_states_size_is_categorised(handle):
    size = DropoutDescriptor.states_size(handle)
    states = DeviceBuffer(8)
    if size <= 8:
        pytest.skip("this GPU needs tiny dropout states")
    with pytest.raises(errors.CudnnError):
        DropoutDescriptor(handle, 0.5, states, states_size=8)


def test_rnn_weight_space_matches_lstm_formula(handle):
    states = DeviceBuffer(DropoutDescriptor.states_size(handle))
    drop = DropoutDescriptor(handle, 0.1, states, seed=0)
    r = RNNDescriptor(20, 1, cell_mode="lstm", input_size=10, dropout=drop)
    # LSTM, one layer, double bias: 4 gates * (h*in + h*h + 2*h) float32 values
    assert r.weight_space_size(handle) == 4 * (20 * 10 + 20 * 20 + 2 * 20) * 4
    x = RNNDataDescriptor([5, 3, 2], 10, dtype="float32", layout="seq_major_unpacked")
    work, reserve = r.temp_space_sizes(handle, x, training=True)
    assert work > 0 and reserve > 0
    work_inf, reserve_inf = r.temp_space_sizes(handle, x, training=False)
    assert work_inf > 0 and reserve_inf == 0


def test_rnn_weight_space_gru_bidirectional(handle):
    r = RNNDescriptor(8, 2, cell_mode="gru", input_size=4, direction="bidirectional")
    h, i = 8, 4
    layer0 = 3 * (h * i + h * h + 2 * h)
    layer1 = 3 * (h * 2 * h + h * h + 2 * h)
    assert r.weight_space_size(handle) == 2 * (layer0 + layer1) * 4


def test_backend_conv_graph_gets_engine_configs(handle):
    x = BackendDescriptor.tensor((1, 8, 16, 16), dtype="float32", uid=1)
    w = BackendDescriptor.tensor((8, 8, 3, 3), dtype="float32", uid=2)
    y = BackendDescriptor.tensor((1, 8, 16, 16), dtype="float32", uid=3)
    conv = BackendDescriptor.convolution((1, 1))
    op = BackendDescriptor.operation_convolution_forward(x, w, y, conv)
    graph = BackendDescriptor.operation_graph([op], handle)
    heur = BackendDescriptor("ENGINEHEUR_DESCRIPTOR")
    heur.set("ENGINEHEUR_OPERATION_GRAPH", "BACKEND_DESCRIPTOR", graph)
    heur.set("ENGINEHEUR_MODE", "HEUR_MODE", enums.BackendHeurMode.MODE_A)
    heur.finalize()
    cfgs = heur.get("ENGINEHEUR_RESULTS", "BACKEND_DESCRIPTOR", 8, descriptor_type="ENGINECFG")
    assert len(cfgs) >= 1
    plan = BackendDescriptor("EXECUTION_PLAN_DESCRIPTOR")
    plan.set("EXECUTION_PLAN_HANDLE", "HANDLE", handle)
    plan.set("EXECUTION_PLAN_ENGINE_CONFIG", "BACKEND_DESCRIPTOR", cfgs[0])
    plan.finalize()
    (ws,) = plan.get("EXECUTION_PLAN_WORKSPACE_SIZE", "INT64", 1)
    assert ws >= 0


def test_dropout_reserve_space(handle):
    assert DropoutDescriptor.reserve_space_size(TensorDescriptor((2, 3, 4, 5))) > 0
