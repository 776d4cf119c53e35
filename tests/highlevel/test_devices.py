"""Mixed devices, on the CPU (issue 18): every high-level function refuses operands on different
devices, an ``out=`` on another device than the inputs, and a stream object of another device,
with a ``ValueError`` naming both devices, before any handle, allocation or cuDNN call.

The operands are fake device arrays (``tests/support/_fake_device.py``) that say which device
they are on; the fixture makes every way into CUDA/cuDNN raise ``CCall`` (a ``BaseException``,
which ``pytest.raises(ValueError)`` cannot swallow). What one GPU can show of the same rules runs
in ``test_devices_gpu.py``, what two GPUs can show under its ``multigpu`` marker.
"""

from __future__ import annotations

import re

import _fake_device as fd
import numpy as np
import pytest
from _fake_device import BF16, F32, I32, U8, Fake

import pycudnn
from pycudnn import _cuda
from pycudnn.graph import _plans
from pycudnn.highlevel import DropoutState, RNNBlock, _rnn_calls, conv, rnn

no_c = fd.no_c


@pytest.fixture
def no_c_at_all(no_c, monkeypatch):
    """``no_c`` plus the convolution's plan builder and the RNN's descriptors."""
    monkeypatch.setattr(_plans, "BackendDescriptor", fd._boom)
    monkeypatch.setattr(pycudnn.highlevel._call, "cudnn_version", fd._boom)
    for name in ("empty", "zeros", "get_workspace", "asarray"):
        monkeypatch.setattr(conv.memory, name, fd._boom)
    for name in ("RNNDescriptor", "RNNDataDescriptor", "DropoutDescriptor"):
        for module in (rnn, _rnn_calls):  # where the block and its parts make them
            if hasattr(module, name):
                monkeypatch.setattr(module, name, fd._boom)
    yield


class TorchLikeStream:
    """A stream object that says its device the way torch's does (``device_index``)."""

    def __init__(self, device, handle=0x5000):
        self.device_index = device
        self.cuda_stream = handle


class CupyLikeStream:
    def __init__(self, device, handle=0x6000):
        self.device_id = device
        self.ptr = handle


class _Dev:
    def __init__(self, device_id):
        self.device_id = device_id


class CoreLikeStream:
    """cuda.core's way: ``device.device_id`` and ``__cuda_stream__``."""

    def __init__(self, device, handle=0x7000):
        self.device = _Dev(device)
        self._h = handle

    def __cuda_stream__(self):
        return (0, self._h)


def A(shape, device=0, dt=F32):
    return Fake(shape, dt, device=device)


def ints(values, device=0):
    values = np.asarray(values, np.int32)
    return Fake(values.shape, I32, host=values, device=device)


# Each entry: name -> (call(dev) where dev(name) is the device of the operand called name, the
# operand names that can be moved, whether the function takes out=). The shapes are valid.
X4, W4, Y4 = (2, 4, 8, 8), (6, 4, 3, 3), (2, 6, 6, 6)
X5, W5 = (1, 2, 4, 4, 4), (2, 2, 1, 1, 1)
CTC_T, CTC_N, CTC_C = 12, 3, 6


def _ctc(dev, out=None, stream=None):
    lens, ilens = (3, 4, 2), (12, 10, 7)
    labels = np.arange(sum(lens)) % (CTC_C - 1) + 1
    return pycudnn.dnn_ctc_loss(
        A((CTC_T, CTC_N, CTC_C), dev("log_probs")),
        ints(labels, dev("labels")),
        ints(lens, dev("label_lengths")),
        ints(ilens, dev("input_lengths")),
        out=out,
        stream=stream,
    )


def _dropout_grad(dev, out=None, stream=None):
    st = DropoutState(1)
    st._device, st._mask = 0, (2, 3, 4)  # as a forward call on device 0 leaves it
    return pycudnn.dnn_dropout_grad(A((2, 3, 4), dev("dy")), st, out=out, stream=stream)


CASES = {
    "dnn_conv": (
        lambda d, **k: pycudnn.dnn_conv(A(X4, d("img")), A(W4, d("kerns")), **k),
        ("img", "kerns"),
        Y4,
    ),
    "dnn_conv3d": (
        lambda d, **k: pycudnn.dnn_conv3d(A(X5, d("img")), A(W5, d("kerns")), **k),
        ("img", "kerns"),
        X5,
    ),
    "dnn_gradinput": (
        lambda d, **k: pycudnn.dnn_gradinput(A(W4, d("kerns")), A(Y4, d("topgrad")), X4, **k),
        ("kerns", "topgrad"),
        X4,
    ),
    "dnn_gradinput3d": (
        lambda d, **k: pycudnn.dnn_gradinput3d(A(W5, d("kerns")), A(X5, d("topgrad")), X5, **k),
        ("kerns", "topgrad"),
        X5,
    ),
    "dnn_gradweight": (
        lambda d, **k: pycudnn.dnn_gradweight(A(X4, d("img")), A(Y4, d("topgrad")), W4, **k),
        ("img", "topgrad"),
        W4,
    ),
    "dnn_gradweight3d": (
        lambda d, **k: pycudnn.dnn_gradweight3d(A(X5, d("img")), A(X5, d("topgrad")), W5, **k),
        ("img", "topgrad"),
        W5,
    ),
    "dnn_pool": (
        lambda d, **k: pycudnn.dnn_pool(A((2, 3, 8, 8), d("img")), (2, 2), (2, 2), **k),
        ("img",),
        (2, 3, 4, 4),
    ),
    "dnn_pool_grad": (
        lambda d, out=None, **k: pycudnn.dnn_pool_grad(
            A((2, 3, 8, 8), d("img")),
            A((2, 3, 4, 4), d("out")),
            A((2, 3, 4, 4), d("out_grad")),
            (2, 2),
            (2, 2),
            img_grad=out,
            **k,
        ),
        ("img", "out", "out_grad"),
        (2, 3, 8, 8),
    ),
    "dnn_batch_normalization_train": (
        lambda d, **k: pycudnn.dnn_batch_normalization_train(
            A((4, 3, 5, 6), d("inputs")),
            A((1, 3, 1, 1), d("gamma")),
            A((1, 3, 1, 1), d("beta")),
            "spatial",
            running_mean=A((1, 3, 1, 1), d("running_mean")),
            running_var=A((1, 3, 1, 1), d("running_var")),
            **k,
        ),
        ("inputs", "gamma", "beta", "running_mean", "running_var"),
        (4, 3, 5, 6),
    ),
    "dnn_batch_normalization_act_train": (
        lambda d, **k: pycudnn.dnn_batch_normalization_act_train(
            Fake((4, 8, 5, 6), BF16, device=d("inputs"), nhwc=True),
            A((8,), d("gamma")),
            A((8,), d("beta")),
            Fake((4, 8, 5, 6), BF16, device=d("z"), nhwc=True),
            running_mean=A((8,), d("running_mean")),
            running_var=A((8,), d("running_var")),
            out_reserve=Fake((16,), U8, device=d("out_reserve")),
            **k,
        ),
        ("inputs", "gamma", "beta", "z", "running_mean", "running_var", "out_reserve"),
        None,
    ),
    "dnn_batch_normalization_act_grad": (
        lambda d, **k: pycudnn.dnn_batch_normalization_act_grad(
            *(Fake((4, 8, 5, 6), BF16, device=d(n), nhwc=True) for n in ("inputs", "y", "dy")),
            *(A((8,), d(n)) for n in ("scale", "bias", "x_mean", "x_invstd")),
            Fake((16,), U8, device=d("reserve")),
            **k,
        ),
        ("inputs", "y", "dy", "scale", "bias", "x_mean", "x_invstd", "reserve"),
        None,
    ),
    "dnn_batch_normalization_test": (
        lambda d, **k: pycudnn.dnn_batch_normalization_test(
            A((4, 3, 5, 6), d("inputs")),
            *(A((1, 3, 1, 1), d(n)) for n in ("gamma", "beta", "mean", "var")),
            "spatial",
            **k,
        ),
        ("inputs", "gamma", "beta", "mean", "var"),
        (4, 3, 5, 6),
    ),
    "dnn_batch_normalization_grad": (
        lambda d, **k: pycudnn.dnn_batch_normalization_grad(
            A((4, 3, 5, 6), d("inputs")),
            A((4, 3, 5, 6), d("dy")),
            *(A((1, 3, 1, 1), d(n)) for n in ("scale", "x_mean", "x_invstd")),
            "spatial",
            **k,
        ),
        ("inputs", "dy", "scale", "x_mean", "x_invstd"),
        (4, 3, 5, 6),
    ),
    "dnn_activation": (
        lambda d, **k: pycudnn.dnn_activation(A((2, 3, 4), d("x")), **k),
        ("x",),
        (2, 3, 4),
    ),
    "dnn_activation_grad": (
        lambda d, **k: pycudnn.dnn_activation_grad(
            A((2, 3, 4), d("y")), A((2, 3, 4), d("dy")), A((2, 3, 4), d("x")), **k
        ),
        ("y", "dy", "x"),
        (2, 3, 4),
    ),
    "dnn_softmax": (
        lambda d, **k: pycudnn.dnn_softmax(A((2, 3, 4), d("x")), **k),
        ("x",),
        (2, 3, 4),
    ),
    "dnn_softmax_grad": (
        lambda d, **k: pycudnn.dnn_softmax_grad(A((2, 3, 4), d("dy")), A((2, 3, 4), d("sm")), **k),
        ("dy", "sm"),
        (2, 3, 4),
    ),
    "dnn_add_tensor": (
        lambda d, out=None, **k: pycudnn.dnn_add_tensor(
            A((1, 3, 1, 1), d("a")), A((2, 3, 4, 4), d("c")), **k
        ),
        ("a", "c"),
        None,
    ),
    "dnn_op_tensor": (
        lambda d, **k: pycudnn.dnn_op_tensor(
            "add", A((2, 3, 4, 4), d("a")), A((1, 3, 1, 1), d("b")), **k
        ),
        ("a", "b"),
        (2, 3, 4, 4),
    ),
    "dnn_dropout": (
        lambda d, **k: pycudnn.dnn_dropout(A((2, 3, 4), d("x")), 0.5, 1, **k),
        ("x",),
        (2, 3, 4),
    ),
    "dnn_dropout_grad": (
        lambda d, **k: _dropout_grad(d, **k),
        ("dy",),
        (2, 3, 4),
    ),
    "dnn_spatialtf_grid": (
        lambda d, **k: pycudnn.dnn_spatialtf_grid(A((2, 2, 3), d("theta")), (2, 3, 4, 4), **k),
        ("theta",),
        (2, 4, 4, 2),
    ),
    "dnn_spatialtf_grid_grad": (
        lambda d, **k: pycudnn.dnn_spatialtf_grid_grad(A((2, 4, 4, 2), d("dgrid")), **k),
        ("dgrid",),
        (2, 2, 3),
    ),
    "dnn_spatialtf_sampler": (
        lambda d, **k: pycudnn.dnn_spatialtf_sampler(
            A((2, 3, 5, 5), d("img")), A((2, 4, 4, 2), d("grid")), **k
        ),
        ("img", "grid"),
        (2, 3, 4, 4),
    ),
    "dnn_spatialtf_sampler_grad": (
        lambda d, out=None, **k: pycudnn.dnn_spatialtf_sampler_grad(
            A((2, 3, 5, 5), d("img")),
            A((2, 4, 4, 2), d("grid")),
            A((2, 3, 4, 4), d("dy")),
            out=None if out is None else (out, None),
            **k,
        ),
        ("img", "grid", "dy"),
        (2, 3, 5, 5),
    ),
    "dnn_spatialtf": (
        lambda d, **k: pycudnn.dnn_spatialtf(
            A((2, 3, 5, 5), d("img")), A((2, 2, 3), d("theta")), **k
        ),
        ("img", "theta"),
        (2, 3, 5, 5),
    ),
    "dnn_spatialtf_grad": (
        lambda d, out=None, **k: pycudnn.dnn_spatialtf_grad(
            A((2, 3, 5, 5), d("img")), A((2, 2, 3), d("theta")), A((2, 3, 5, 5), d("dy")), **k
        ),
        ("img", "theta", "dy"),
        None,
    ),
    "dnn_reduction": (
        lambda d, **k: pycudnn.dnn_reduction(A((2, 3, 4, 4), d("x")), "add", 1, **k),
        ("x",),
        (2, 4, 4),
    ),
    "dnn_lrn": (
        lambda d, **k: pycudnn.dnn_lrn(A((2, 8, 4, 4), d("x")), **k),
        ("x",),
        (2, 8, 4, 4),
    ),
    "dnn_lrn_grad": (
        lambda d, **k: pycudnn.dnn_lrn_grad(
            A((2, 8, 4, 4), d("y")), A((2, 8, 4, 4), d("dy")), A((2, 8, 4, 4), d("x")), **k
        ),
        ("y", "dy", "x"),
        (2, 8, 4, 4),
    ),
    "dnn_matmul": (
        lambda d, **k: pycudnn.dnn_matmul(
            A((4, 8), d("a"), BF16), A((8, 6), d("b"), BF16), bias=A((6,), d("bias"), BF16), **k
        ),
        ("a", "b", "bias"),
        ((4, 6), BF16),
    ),
    "dnn_layer_norm": (
        lambda d, **k: pycudnn.dnn_layer_norm(
            A((4, 8), d("x")), (8,), A((8,), d("gamma")), A((8,), d("beta")), **k
        ),
        ("x", "gamma", "beta"),
        (4, 8),
    ),
    "dnn_layer_norm_grad": (
        lambda d, **k: pycudnn.dnn_layer_norm_grad(
            A((4, 8), d("dy")),
            A((4, 8), d("x")),
            A((4, 1), d("mean")),
            A((4, 1), d("inv_std")),
            (8,),
            A((8,), d("gamma")),
            **k,
        ),
        ("dy", "x", "mean", "inv_std", "gamma"),
        None,
    ),
    "dnn_rms_norm": (
        lambda d, **k: pycudnn.dnn_rms_norm(A((4, 8), d("x")), (8,), A((8,), d("gamma")), **k),
        ("x", "gamma"),
        (4, 8),
    ),
    "dnn_rms_norm_grad": (
        lambda d, **k: pycudnn.dnn_rms_norm_grad(
            A((4, 8), d("dy")),
            A((4, 8), d("x")),
            A((4, 1), d("inv_rms")),
            (8,),
            A((8,), d("gamma")),
            **k,
        ),
        ("dy", "x", "inv_rms", "gamma"),
        None,
    ),
    "dnn_sdpa": (
        lambda d, **k: pycudnn.dnn_sdpa(
            A((1, 2, 8, 8), d("q"), BF16),
            A((1, 2, 8, 8), d("k"), BF16),
            A((1, 2, 8, 8), d("v"), BF16),
            **k,
        ),
        ("q", "k", "v"),
        ((1, 2, 8, 8), BF16),
    ),
    "dnn_sdpa_grad": (
        lambda d, **k: pycudnn.dnn_sdpa_grad(
            *(A((1, 2, 8, 8), d(n), BF16) for n in ("q", "k", "v", "out", "dout")),
            A((1, 2, 8, 1), d("stats")),
            **k,
        ),
        ("q", "k", "v", "out", "dout", "stats"),
        None,
    ),
    "dnn_sdpa_paged": (
        lambda d, **k: pycudnn.dnn_sdpa_paged(
            A((1, 2, 1, 8), d("q"), BF16),
            A((4, 2, 16, 8), d("k_cache"), BF16),
            A((4, 2, 16, 8), d("v_cache"), BF16),
            A((1, 4), d("page_table"), I32),
            A((1,), d("seq_lens_kv"), I32),
            **k,
        ),
        ("q", "k_cache", "v_cache", "page_table", "seq_lens_kv"),
        ((1, 2, 1, 8), BF16),
    ),
    "dnn_sdpa_varlen": (
        lambda d, **k: pycudnn.dnn_sdpa_varlen(
            *(A((12, 2, 8), d(n), BF16) for n in ("q", "k", "v")),
            [0, 5, 12],
            [0, 5, 12],
            7,
            7,
            **k,
        ),
        ("q", "k", "v"),
        ((12, 2, 8), BF16),
    ),
    "dnn_sdpa_varlen_grad": (
        lambda d, **k: pycudnn.dnn_sdpa_varlen_grad(
            *(A((12, 2, 8), d(n), BF16) for n in ("q", "k", "v", "out", "dout")),
            A((12, 2, 1), d("stats")),
            [0, 5, 12],
            [0, 5, 12],
            7,
            7,
            **k,
        ),
        ("q", "k", "v", "out", "dout", "stats"),
        None,
    ),
    "dnn_ctc_loss": (
        lambda d, **k: _ctc(d, **k),
        ("log_probs", "labels", "label_lengths", "input_lengths"),
        None,
    ),
}


def test_every_high_level_function_is_covered():
    names = {n for n in pycudnn.highlevel.__all__ if n.startswith("dnn_")}
    assert names == set(CASES)


def _named_both(msg: str, a: int, b: int) -> bool:
    return bool(re.search(rf"\b{a}\b", msg)) and bool(re.search(rf"\b{b}\b", msg))


# a function of one operand has no mixed devices of its own: its out= and stream= cases below
MOVES = [(name, moved) for name, (_, ops, _) in CASES.items() if len(ops) > 1 for moved in ops]


@pytest.mark.parametrize(("name", "moved"), MOVES, ids=[f"{n}-{m}" for n, m in MOVES])
@pytest.mark.parametrize("where", [1, 3])
def test_operands_on_different_devices_are_refused_naming_both(no_c_at_all, name, moved, where):
    call, _ops, _out = CASES[name]
    with pytest.raises(ValueError, match="device") as exc:
        call(lambda n: where if n == moved else 0)
    assert _named_both(str(exc.value), 0, where), str(exc.value)


OUTS = [name for name, (_, _, out) in CASES.items() if out is not None]


def _out(spec, device):
    """An ``out=`` array: *spec* is a shape, or (shape, dtype)."""
    if len(spec) == 2 and isinstance(spec[0], tuple):
        return A(spec[0], device, spec[1])
    return A(spec, device)


@pytest.mark.parametrize("name", OUTS)
def test_out_on_another_device_is_refused_naming_both(no_c_at_all, name):
    call, _ops, out_shape = CASES[name]
    with pytest.raises(ValueError, match="device") as exc:
        call(lambda n: 0, out=_out(out_shape, 1))
    assert _named_both(str(exc.value), 0, 1), str(exc.value)


@pytest.mark.parametrize("name", OUTS)
def test_out_on_the_operands_other_device_is_refused_too(no_c_at_all, name):
    """All inputs on device 2, out on device 0 (the usual current device)."""
    call, _ops, out_shape = CASES[name]
    if name == "dnn_dropout_grad":  # its state is bound to device 0 (checked first)
        pytest.skip("the state fixes the device")
    with pytest.raises(ValueError, match="device") as exc:
        call(lambda n: 2, out=_out(out_shape, 0))
    assert _named_both(str(exc.value), 2, 0), str(exc.value)


STREAMS = [TorchLikeStream, CupyLikeStream, CoreLikeStream]


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("kind", STREAMS, ids=lambda k: k.__name__)
def test_a_stream_of_another_device_is_refused_naming_both(no_c_at_all, name, kind):
    call, _ops, _out = CASES[name]
    with pytest.raises(ValueError, match="stream") as exc:
        call(lambda n: 0, stream=kind(1))
    assert _named_both(str(exc.value), 0, 1), str(exc.value)


def test_dropout_state_of_another_device_is_refused_before_any_c_call(no_c_at_all):
    st = DropoutState(3)
    st._device = 0
    with pytest.raises(ValueError, match="bound to device 0, the operands are on device 1"):
        pycudnn.dnn_dropout(A((2, 3), 1), 0.5, state=st)
    with pytest.raises(ValueError, match="bound to device 0, the operands are on device 1"):
        pycudnn.dnn_dropout_grad(A((2, 3), 1), st)


# -- RNNBlock ----------------------------------------------------------------------------------
def _block():
    return RNNBlock("float32", 4, 1, "lstm")


@pytest.mark.parametrize("moved", ["w", "hx", "cx", "out"])
def test_rnn_apply_refuses_operands_on_different_devices(no_c_at_all, moved):
    b = _block()
    t, n, i = 3, 2, 5
    nw = 4 * 4 * (i + 4) + 8 * 4  # canonical LSTM size: 4 gates x (W, R) + 2 bias sets
    dev = {moved: 1}
    w = A((nw,), dev.get("w", 0))
    x = A((t, n, i), 0)
    hx, cx = A((1, n, 4), dev.get("hx", 0)), A((1, n, 4), dev.get("cx", 0))
    out = (A((t, n, 4), 1), None, None) if moved == "out" else None
    with pytest.raises(ValueError, match="device") as exc:
        b.apply(w, x, hx, cx, out=out)
    assert _named_both(str(exc.value), 0, 1), str(exc.value)


def test_rnn_apply_refuses_a_stream_of_another_device(no_c_at_all):
    b = _block()
    nw = 4 * 4 * (5 + 4) + 8 * 4
    with pytest.raises((ValueError, fd.CCall)) as exc:
        b.apply(A((nw,), 0), A((3, 2, 5), 0), stream=TorchLikeStream(1))
    # the weight size needs a handle (a C call): the stream must be refused before it
    assert isinstance(exc.value, ValueError), exc.value
    assert _named_both(str(exc.value), 0, 1), str(exc.value)


def test_handle_set_stream_refuses_a_stream_of_another_device(monkeypatch):
    from pycudnn import api
    from pycudnn.handle import Handle

    monkeypatch.setattr(api, "cudnnSetStream", fd._boom)
    h = Handle.from_ptr(0x1234, 0)
    with pytest.raises(ValueError, match=r"is on device 1, but the handle .* on device 0"):
        h.set_stream(TorchLikeStream(1))
    assert h.stream == 0


# -- the helpers -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("stream", "device"),
    [
        (None, None),
        (0, None),
        (0x1234, None),
        (TorchLikeStream(1), 1),
        (CupyLikeStream(2), 2),
        (CoreLikeStream(3), 3),
        (object(), None),
    ],
)
def test_stream_device_reads_what_stream_objects_say(stream, device):
    assert _cuda.stream_device(stream) == device


def test_device_now_without_a_gpu_is_none_not_an_error(monkeypatch):
    def no_runtime():
        raise pycudnn.errors.CudaUnavailableError("no")

    monkeypatch.setattr(_cuda, "_get_device", None)
    monkeypatch.setattr(_cuda, "runtime", no_runtime)
    assert _cuda.device_now() is None
