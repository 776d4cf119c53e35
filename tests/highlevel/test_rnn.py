"""CPU tests of ``RNNBlock`` and the RNN weight layouts (no GPU, no cuDNN compute).

What cuDNN answers without a GPU is little here: the RNN descriptors can be made, but the
weight-space size, the weight positions (``cudnnGetRNNWeightParams``) and the temp-space sizes
all need a handle. So this file checks:

* the canonical layout against the positions cuDNN 9.19 reported on an H100 (hard-coded below;
  the GPU tests compare the two live for many more configurations);
* the PyTorch converters on NumPy arrays (gate order, both bias sets, projections, round trips);
* the validation catalogue: every bad argument raises before any handle, descriptor,
  allocation or cuDNN call (a fixture makes each of those fail loudly);
* the call path with fake descriptors, handle and allocator: a repeated call validates once,
  pointers go to the right arguments, the reserve space and workspace are reused, the weight
  gradient is zeroed (overwrite) or not (accumulate), and backward is paired with the last
  training apply.
"""

from __future__ import annotations

import ctypes
import itertools
from typing import ClassVar

import numpy as np
import pytest

from pycudnn import _layout
from pycudnn.enums import DataType, ForwardMode, WgradMode
from pycudnn.highlevel import _call, _operand, _rnn_calls, _staging, rnn
from pycudnn.highlevel.rnn import RNNBlock
from pycudnn.highlevel.rnn_layout import (
    GATES,
    ParamSlot,
    RNNLayout,
    canonical_rnn_layout,
    rnn_weights_from_torch,
    rnn_weights_to_torch,
    torch_rnn_param_names,
)

F16, F32, F64, BF16 = DataType.HALF, DataType.FLOAT, DataType.DOUBLE, DataType.BFLOAT16
_addr = itertools.count(1)


class Fake:
    """A fake device array: an address, shape, element strides, DataType and device."""

    def __init__(self, shape, dt=F32, strides=None, ptr=None, device=0):
        self.shape = tuple(shape)
        self.dt = dt
        self.strides = tuple(strides) if strides is not None else _layout.packed_strides(shape)
        self.ptr = (next(_addr) << 32) if ptr is None else ptr
        self.device = device


_operand.register_operand_type(Fake, lambda f: (f.ptr, f.shape, f.strides, f.dt, f.device))


class CCall(BaseException):
    """Raised by every patched way into the GPU/cuDNN (BaseException: pytest.raises(ValueError)
    cannot swallow it)."""


def _boom(*args, **kwargs):
    raise CCall("a handle, descriptor, allocation or cuDNN call was attempted")


@pytest.fixture
def no_c(monkeypatch):
    """Make every way into CUDA/cuDNN raise CCall."""
    monkeypatch.setattr(_call._handle, "get_handle", _boom)
    monkeypatch.setattr(_staging, "tensor_descriptor", _boom)
    monkeypatch.setattr(_call, "quiet", _boom)
    monkeypatch.setattr(_call, "workspace", _boom)
    for name in ("RNNDescriptor", "RNNDataDescriptor", "DropoutDescriptor", "TensorDescriptor"):
        for module in (rnn, _rnn_calls):  # where the block and its parts make them
            if hasattr(module, name):
                monkeypatch.setattr(module, name, _boom)
    for name in ("empty", "zeros", "asarray", "to_device", "get_workspace"):
        monkeypatch.setattr(rnn.memory, name, _boom)
    yield


# ==================================================================================================
# canonical layout vs what cuDNN 9.19 reported (H100, fp32)
# ==================================================================================================
def _offsets(lay, pl):
    """[(matrix offset or None, bias offset or None)] per linLayerID of pseudo-layer *pl*."""
    return [
        (
            None if lay.matrix(pl, i) is None else lay.matrix(pl, i).offset,
            None if lay.bias_of(pl, i) is None else lay.bias_of(pl, i).offset,
        )
        for i in lay.lin_ids()
    ]


def test_canonical_layout_matches_cudnn_lstm_bidirectional_projection():
    lay = canonical_rnn_layout("lstm", 5, 4, 2, bidirectional=True, proj_size=3)
    assert lay.size == 720
    assert _offsets(lay, 0) == [
        (0, 592),
        (20, 596),
        (40, 600),
        (60, 604),
        (80, 608),
        (92, 612),
        (104, 616),
        (116, 620),
        (128, None),
    ]
    assert _offsets(lay, 3) == [
        (436, 688),
        (460, 692),
        (484, 696),
        (508, 700),
        (532, 704),
        (544, 708),
        (556, 712),
        (568, 716),
        (580, None),
    ]
    assert lay.matrix(2, 0).shape == (4, 6)  # layer 1 reads 2 * proj_size
    assert lay.matrix(0, 4).shape == (4, 3)  # recurrent matrices read the projection
    assert lay.matrix(0, 8).shape == (3, 4)


def test_canonical_layout_matches_cudnn_other_modes():
    lay = canonical_rnn_layout("lstm", 5, 4, 2)
    assert lay.size == 336 and lay.matrix(1, 0).offset == 144 and lay.bias_of(0, 0).offset == 272
    assert lay.bias_of(1, 7).offset == 332
    lay = canonical_rnn_layout("gru", 5, 4, 2, True)
    assert lay.size == 600 and lay.matrix(2, 0).shape == (4, 8)
    assert _offsets(lay, 1)[:4] == [(108, 528), (128, 532), (148, 536), (168, 540)]
    lay = canonical_rnn_layout("rnn_tanh", 5, 4, 2)
    assert lay.size == 84 and _offsets(lay, 1) == [(36, 76), (52, 80)]


def test_canonical_layout_matches_cudnn_skip_input_and_bias_modes():
    # skip input: layer 0 has no input matrices, but keeps its input biases
    lay = canonical_rnn_layout("rnn_relu", 4, 4, 2, True, input_mode="skip")
    assert lay.size == 160
    assert _offsets(lay, 0) == [(None, 128), (0, 132)]
    assert _offsets(lay, 2) == [(32, 144), (64, 148)]
    lay = canonical_rnn_layout("lstm", 4, 4, 2, input_mode="skip")
    assert lay.size == 256 and lay.matrix(0, 4).offset == 0 and lay.bias_of(0, 0).offset == 192
    lay = canonical_rnn_layout("gru", 4, 4, 1, input_mode="skip")
    assert lay.size == 72 and lay.bias_of(0, 0).offset == 48
    lay = canonical_rnn_layout("lstm", 5, 4, 1, bias=False)
    assert lay.size == 144 and lay.bias_of(0, 0) is None


def test_layout_table_and_words():
    lay = canonical_rnn_layout("gru", 3, 2, 1, True)
    table = lay.table()
    assert "layer 0 reverse: recurrent matrix R_z (update gate)" in table
    assert "weight_hh_l0_reverse[2:4]" in table
    assert table.splitlines()[1].startswith("0 ")
    assert lay.describe(lay.bias_of(0, 2)) == "layer 0: input bias b_W_n (new memory)"
    assert "proj" not in repr(lay)
    assert lay == canonical_rnn_layout("gru", 3, 2, 1, True)
    assert lay != canonical_rnn_layout("gru", 3, 2, 1, False)
    assert hash(lay) == hash(canonical_rnn_layout("gru", 3, 2, 1, True))
    assert ParamSlot(0, 0, "weight", 0, (2, 3)).size == 6
    assert lay.num_lin_layers == 6 and lay.out_size == 2 and lay.num_pseudo_layers == 2


@pytest.mark.parametrize(
    "kw,exc,msg",
    [
        (dict(mode="lstmx"), ValueError, "not one of"),
        (dict(mode=3), TypeError, "must be a string"),
        (dict(input_size=0), ValueError, ">= 1"),
        (dict(hidden_size=2.0), TypeError, "must be an int"),
        (dict(proj_size=9), ValueError, "must not exceed"),
        (dict(mode="gru", proj_size=2), ValueError, "only valid for 'lstm'"),
        (dict(input_mode="skip"), ValueError, "input_size == hidden_size"),
        (dict(input_mode="other"), ValueError, "'linear' or 'skip'"),
    ],
)
def test_canonical_layout_validation(kw, exc, msg):
    args = dict(mode="lstm", input_size=5, hidden_size=4)
    args.update(kw)
    with pytest.raises(exc, match=msg):
        canonical_rnn_layout(**args)


# ==================================================================================================
# PyTorch converters (NumPy)
# ==================================================================================================
def _torch_like(mode, inp, hid, layers, bidir, proj=None, bias=True, rng=None):
    rng = rng or np.random.default_rng(0)
    g = len(GATES[mode]) * hid
    out = proj or hid
    params = {}
    for layer in range(layers):
        for d in range(2 if bidir else 1):
            sfx = f"_l{layer}" + ("_reverse" if d else "")
            cols = inp if layer == 0 else out * (2 if bidir else 1)
            params[f"weight_ih{sfx}"] = rng.standard_normal((g, cols)).astype(np.float32)
            params[f"weight_hh{sfx}"] = rng.standard_normal((g, out)).astype(np.float32)
            if bias:
                params[f"bias_ih{sfx}"] = rng.standard_normal(g).astype(np.float32)
                params[f"bias_hh{sfx}"] = rng.standard_normal(g).astype(np.float32)
            if proj:
                params[f"weight_hr{sfx}"] = rng.standard_normal((proj, hid)).astype(np.float32)
    return params


def test_torch_param_names_follow_torch():
    assert torch_rnn_param_names("lstm", 2, True, 3) == [
        "weight_ih_l0",
        "weight_hh_l0",
        "bias_ih_l0",
        "bias_hh_l0",
        "weight_hr_l0",
        "weight_ih_l0_reverse",
        "weight_hh_l0_reverse",
        "bias_ih_l0_reverse",
        "bias_hh_l0_reverse",
        "weight_hr_l0_reverse",
        "weight_ih_l1",
        "weight_hh_l1",
        "bias_ih_l1",
        "bias_hh_l1",
        "weight_hr_l1",
        "weight_ih_l1_reverse",
        "weight_hh_l1_reverse",
        "bias_ih_l1_reverse",
        "bias_hh_l1_reverse",
        "weight_hr_l1_reverse",
    ]
    assert torch_rnn_param_names("gru", 1, bias=False) == ["weight_ih_l0", "weight_hh_l0"]


@pytest.mark.parametrize(
    "mode,bidir,proj,bias",
    [
        ("lstm", False, None, True),
        ("lstm", True, 2, True),
        ("lstm", True, 3, False),
        ("gru", True, None, True),
        ("rnn_tanh", False, None, False),
        ("rnn_relu", True, None, True),
    ],
)
def test_converters_round_trip_and_gate_order(mode, bidir, proj, bias):
    inp, hid, layers = 3, 4, 2
    params = _torch_like(mode, inp, hid, layers, bidir, proj, bias)
    lay = canonical_rnn_layout(mode, inp, hid, layers, bidir, proj, bias=bias)
    flat = rnn_weights_from_torch(params, lay)
    assert flat.shape == (lay.size,) and flat.dtype == np.float32
    # every element of the buffer comes from exactly one parameter: sizes add up
    assert sum(p.size for p in params.values()) == lay.size
    back = rnn_weights_to_torch(flat, lay)
    assert list(back) == torch_rnn_param_names(mode, layers, bidir, proj, bias)
    for k, v in params.items():
        np.testing.assert_array_equal(back[k], v)
    # gate g of PyTorch's weight_ih rows is cuDNN's linLayerID g; weight_hh: n + g
    n = len(GATES[mode])
    dirs = 2 if bidir else 1
    for layer, d, gate in itertools.product(range(layers), range(dirs), range(n)):
        sfx = f"_l{layer}" + ("_reverse" if d else "")
        pl = layer * dirs + d
        for side, name in ((0, "weight_ih"), (1, "weight_hh")):
            s = lay.matrix(pl, side * n + gate)
            rows = params[name + sfx][gate * hid : (gate + 1) * hid]
            np.testing.assert_array_equal(flat[s.offset : s.offset + s.size].reshape(s.shape), rows)
        if bias:
            for side, name in ((0, "bias_ih"), (1, "bias_hh")):
                s = lay.bias_of(pl, side * n + gate)
                want = params[name + sfx][gate * hid : (gate + 1) * hid]
                np.testing.assert_array_equal(flat[s.offset : s.offset + s.size], want)
        if proj:
            s = lay.matrix(pl, 8)
            got = flat[s.offset : s.offset + s.size].reshape(s.shape)
            np.testing.assert_array_equal(got, params["weight_hr" + sfx])


def test_converters_prefix_dtype_and_modules():
    lay = canonical_rnn_layout("gru", 3, 2)
    params = {"enc.rnn." + k: v for k, v in _torch_like("gru", 3, 2, 1, False).items()}
    params["enc.other.weight"] = np.zeros(3)  # outside the prefix: ignored
    flat = rnn_weights_from_torch(params, lay, prefix="enc.rnn.", dtype=np.float64)
    assert flat.dtype == np.float64
    back = rnn_weights_to_torch(flat, lay, prefix="enc.rnn.")
    assert set(back) == {k for k in params if k.startswith("enc.rnn.")}

    class Module:  # anything with state_dict() (an nn.Module)
        def state_dict(self):
            return _torch_like("gru", 3, 2, 1, False)

    np.testing.assert_array_equal(
        rnn_weights_from_torch(Module(), lay), rnn_weights_from_torch(Module().state_dict(), lay)
    )


@pytest.mark.parametrize(
    "mutate,exc,msg",
    [
        (lambda p: p.pop("bias_hh_l0"), ValueError, "'bias_hh_l0' is missing"),
        (lambda p: p.update(weight_ih_l0=np.zeros((9, 3))), ValueError, r"\(9, 3\), expected"),
        (lambda p: p.update(bias_ih_l1=np.zeros(8)), ValueError, "unexpected parameters"),
    ],
)
def test_converter_errors(mutate, exc, msg):
    lay = canonical_rnn_layout("lstm", 3, 2)
    params = _torch_like("lstm", 3, 2, 1, False)
    mutate(params)
    with pytest.raises(exc, match=msg):
        rnn_weights_from_torch(params, lay)


def test_converter_errors_other():
    lay = canonical_rnn_layout("lstm", 3, 2)
    with pytest.raises(TypeError, match="mapping"):
        rnn_weights_from_torch([1, 2], lay)
    with pytest.raises(TypeError, match="RNNLayout"):
        rnn_weights_from_torch({}, "lstm")
    with pytest.raises(ValueError, match="has 3 elements"):
        rnn_weights_to_torch(np.zeros(3), lay)
    skip = canonical_rnn_layout("lstm", 2, 2, input_mode="skip")
    with pytest.raises(ValueError, match="skip"):
        rnn_weights_to_torch(np.zeros(skip.size), skip)
    with pytest.raises(ValueError, match="skip"):
        rnn_weights_from_torch({}, skip)
    with pytest.raises(ValueError, match=r"unexpected parameters .*bias_hh_l0"):  # bias=False
        rnn_weights_from_torch(
            _torch_like("lstm", 3, 2, 1, False), canonical_rnn_layout("lstm", 3, 2, bias=False)
        )


def test_layout_constructed_from_slots_round_trips():
    lay = canonical_rnn_layout("lstm", 3, 2, 1, True, 1)
    again = RNNLayout(
        lay.mode,
        lay.input_size,
        lay.hidden_size,
        lay.num_layers,
        lay.bidirectional,
        lay.proj_size,
        lay.input_mode,
        lay.bias,
        lay.size,
        reversed(lay.slots),
    )
    assert again == lay


# ==================================================================================================
# validation catalogue: nothing reaches C
# ==================================================================================================
BAD_BLOCK = [
    (dict(dtype="int32"), TypeError, "not supported by cuDNN's RNNs"),
    (dict(dtype="bfloat16"), TypeError, "float16, float32 or float64"),
    (dict(dtype="nope"), TypeError, "is not a dtype"),
    (dict(hidden_size=0), ValueError, "hidden_size=0 is out of range"),
    (dict(hidden_size=True), TypeError, "hidden_size must be an int"),
    (dict(hidden_size=4.0), TypeError, "hidden_size must be an int"),
    (dict(num_layers=0), ValueError, "num_layers=0"),
    (dict(rnn_mode="lstm2"), ValueError, "rnn_mode='lstm2' is not one of"),
    (dict(rnn_mode=None), TypeError, "rnn_mode must be a string"),
    (dict(input_mode="skipped"), ValueError, "input_mode='skipped'"),
    (dict(direction_mode="both"), ValueError, "direction_mode='both'"),
    (dict(dropout=1.0), ValueError, r"dropout=1.0 is out of range"),
    (dict(dropout=-0.1), ValueError, "dropout"),
    (dict(dropout=float("nan")), ValueError, "finite"),
    (dict(dropout="0.1"), TypeError, "dropout must be a real number"),
    (dict(proj_size=9), ValueError, "proj_size=9 is out of range"),
    (dict(proj_size=0), ValueError, "proj_size=0"),
    (dict(rnn_mode="gru", proj_size=2), ValueError, "only valid for rnn_mode='lstm'"),
    (dict(batch_first=2), ValueError, "batch_first=2 is not a boolean"),
    (dict(bias="maybe"), ValueError, "bias='maybe' is not a boolean"),
    (dict(bias=[True]), TypeError, "bias=\\[True\\] is not a boolean"),
    (dict(math="tf32"), ValueError, "math='tf32' is not one of"),
    (dict(seed=-1), ValueError, "seed=-1"),
]


@pytest.mark.parametrize("kw,exc,msg", BAD_BLOCK)
def test_block_arguments(no_c, kw, exc, msg):
    args = dict(dtype="float32", hidden_size=4, num_layers=2, rnn_mode="lstm")
    args.update(kw)
    with pytest.raises(exc, match=msg):
        RNNBlock(**args)


def test_block_properties_need_no_gpu(no_c):
    b = RNNBlock(
        np.float64,
        6,
        3,
        "tanh",
        "linear",
        "bidirectional",
        0.2,
        None,
        True,
        "fma",
        bias=False,
        seed=7,
    )
    assert (b.rnn_mode, b.hidden_size, b.num_layers, b.num_directions) == ("rnn_tanh", 6, 3, 2)
    assert b.dtype == np.float64 and b.output_size == 12 and b.out_size == 6
    assert (b.dropout, b.batch_first, b.math, b.bias, b.seed) == (0.2, True, "fma", False, 7)
    assert b.direction_mode == "bidirectional" and b.input_mode == "linear"
    assert "rnn_tanh" in repr(b) and "batch_first=True" in repr(b)
    p = RNNBlock("float32", 8, 1, "lstm", proj_size=8)  # proj_size == hidden_size: none
    assert p.proj_size is None
    p = RNNBlock("float32", 8, 1, "lstm", proj_size=3)
    assert p.out_size == 3 and p.output_size == 3
    assert p.canonical_layout(5) == canonical_rnn_layout("lstm", 5, 8, proj_size=3)
    assert p.canonical_layout((16, 5)).size == canonical_rnn_layout("lstm", 5, 8, 1, False, 3).size


def _block(mode="lstm", **kw):
    kw.setdefault("direction_mode", "bidirectional")
    return RNNBlock("float32", 4, 2, mode, **kw)


def _ops(block, T=5, N=3, inp=6, dt=F32, **over):
    """Fake operands of the right shapes for *block*."""
    nl = block.num_layers * block.num_directions
    size = block.canonical_layout(inp).size
    x = Fake((N, T, inp) if block.batch_first else (T, N, inp), dt)
    ops = dict(
        w=Fake((size,), dt),
        x=x,
        hx=Fake((nl, N, block.out_size), dt),
        cx=Fake((nl, N, block.hidden_size), dt) if block.rnn_mode == "lstm" else None,
    )
    ops.update(over)
    return ops


BAD_APPLY = [
    # (overrides of the operands / call, exception, message fragment)
    (dict(x=Fake((5, 6))), ValueError, r"x must be 3-D \(T, N, input_size\)"),
    (dict(x=Fake((5, 3, 6), F64)), TypeError, "x is float64; the block's dtype is float32"),
    (dict(x=Fake((0, 3, 6))), ValueError, "sequence length T must be >= 1"),
    (dict(x=Fake((5, 3, 6), ptr=(1 << 32) + 2)), ValueError, "not a multiple of its element"),
    (dict(x=Fake((5, 3, 6), strides=(0, 6, 1))), ValueError, "zero"),
    (dict(x=Fake((5, 3, 6), device=1)), ValueError, "w on device 0"),
    (dict(x=np.zeros((5, 3, 6), np.float32)), TypeError, "to_device"),
    (dict(w=Fake((10,))), ValueError, r"w has 10 elements; this network needs \d+"),
    (dict(w=Fake((2, 10))), ValueError, "w must be 1-D"),
    (dict(w=Fake((1000,), F16)), TypeError, "w is float16"),
    (dict(hx=Fake((4, 3, 5))), ValueError, r"hx has shape \(4, 3, 5\), expected \(4, 3, 4\)"),
    (dict(hx=Fake((4, 3, 4), F64)), TypeError, "hx is float64"),
    (dict(hx=Fake((4, 3, 4), device=1)), ValueError, "hx on device 1"),
    (dict(cx=Fake((4, 2, 4))), ValueError, r"cx has shape \(4, 2, 4\), expected \(4, 3, 4\)"),
    (dict(seq_lengths=[5, 5]), ValueError, "seq_lengths has 2 entries but the batch has 3"),
    (dict(seq_lengths=[5, 0, 2]), ValueError, r"contains 0; each length must be in \[1, 5\]"),
    (dict(seq_lengths=[5, 6, 2]), ValueError, r"contains 6; each length must be in \[1, 5\]"),
    (dict(seq_lengths=[5, 2.0, 2]), TypeError, "seq_lengths must contain ints"),
    (dict(seq_lengths=5), TypeError, "seq_lengths must be a sequence of ints"),
    (dict(out=Fake((5, 3, 8))), TypeError, r"out must be a tuple \(y, hy\[, cy\]\)"),
    (dict(out=(None, None)), ValueError, r"out must be a tuple of 3 entries \(y, hy, cy\)"),
    (dict(out=(Fake((5, 3, 4)), None, None)), ValueError, r"y has shape \(5, 3, 4\)"),
    (dict(out=(None, Fake((4, 3, 4), strides=(1, 16, 4)), None)), ValueError, "C-contiguous"),
    (dict(out=(None, None, Fake((4, 3, 4), F16))), TypeError, "cy is float16"),
]


@pytest.mark.parametrize("over,exc,msg", BAD_APPLY)
def test_apply_validation(no_c, over, exc, msg):
    block = _block()
    call = dict(seq_lengths=over.pop("seq_lengths", None), out=over.pop("out", None))
    ops = _ops(block, **over)
    with pytest.raises(exc, match=msg):
        block.apply(ops["w"], ops["x"], ops["hx"], ops["cx"], training=True, **call)


def test_apply_validation_mode_specific(no_c):
    gru = _block("gru")
    ops = _ops(gru)
    with pytest.raises(TypeError, match="cx is only for rnn_mode='lstm', not 'gru'"):
        gru.apply(ops["w"], ops["x"], ops["hx"], Fake((4, 3, 4)))
    with pytest.raises(ValueError, match=r"out must be a tuple of 2 entries \(y, hy\)"):
        gru.apply(ops["w"], ops["x"], ops["hx"], out=(None, None, None))
    skip = RNNBlock("float32", 4, 1, "rnn_relu", input_mode="skip")
    with pytest.raises(ValueError, match="input_mode='skip' needs input_size == hidden_size"):
        skip.apply(Fake((100,)), Fake((5, 3, 6)), None)
    bf = RNNBlock("float32", 4, 1, "lstm", batch_first=True)
    with pytest.raises(ValueError, match=r"x must be 3-D \(N, T, input_size\)"):
        bf.apply(Fake((100,)), Fake((5, 3)), None)
    with pytest.raises(TypeError, match="host integers"):

        class DeviceLengths:
            __cuda_array_interface__ = None

        gru.apply(ops["w"], ops["x"], ops["hx"], seq_lengths=DeviceLengths())
    with pytest.raises(OverflowError, match="exceeds cuDNN's limit of 2147483647"):
        big = Fake((2**16, 2**10, 2**6))
        gru.apply(Fake((gru.canonical_layout(2**6).size,)), big, None)


BAD_BACKWARD = [
    (dict(y=Fake((5, 3, 4))), ValueError, r"y has shape \(5, 3, 4\), expected \(5, 3, 8\)"),
    (dict(dy=Fake((5, 3, 8), F64)), TypeError, "dy is float64"),
    (dict(dhy=Fake((4, 3, 5))), ValueError, "dhy has shape"),
    (dict(dcy=Fake((2, 3, 4))), ValueError, "dcy has shape"),
    (dict(dw=Fake((7,))), ValueError, "dw has shape"),
    (dict(out=(Fake((5, 3, 7)), None, None)), ValueError, r"dx has shape \(5, 3, 7\)"),
    (dict(out=(None, None)), ValueError, r"3 entries \(dx, dhx, dcx\)"),
    (dict(out=Fake((5, 3, 6))), TypeError, r"out must be a tuple \(dx, dhx\[, dcx\]\)"),
    (dict(y=None), TypeError, "y and dy are required"),
]


@pytest.mark.parametrize("over,exc,msg", BAD_BACKWARD)
def test_backward_validation(no_c, over, exc, msg):
    block = _block()
    ops = _ops(block)
    grads = dict(y=Fake((5, 3, 8)), dy=Fake((5, 3, 8)), dhy=None, dcy=None)
    call = dict(dw=None, out=None)
    for k, v in over.items():
        (call if k in call else grads)[k] = v
    dw = call["dw"]
    if dw is not None and dw.shape == (7,):
        call["dw"] = Fake((7,))
    with pytest.raises(exc, match=msg):
        block.backward(
            ops["w"],
            ops["x"],
            ops["hx"],
            ops["cx"],
            grads["y"],
            grads["dy"],
            grads["dhy"],
            grads["dcy"],
            **call,
        )


def test_backward_validation_other(no_c):
    gru = _block("gru")
    ops = _ops(gru)
    y = Fake((5, 3, 8))
    with pytest.raises(TypeError, match="dcy is only for rnn_mode='lstm'"):
        gru.backward(ops["w"], ops["x"], ops["hx"], None, y, y, None, Fake((4, 3, 4)))
    with pytest.raises(ValueError, match="dw was given with weights=False"):
        gru.backward(ops["w"], ops["x"], ops["hx"], None, y, y, dw=ops["w"], weights=False)


def test_parameter_methods_validate_first(no_c):
    b = _block()
    with pytest.raises(ValueError, match="input_size=0"):
        b.get_param_size(0)
    with pytest.raises(TypeError, match="Theano's"):
        b.get_param_size(None)
    with pytest.raises(ValueError, match="empty"):
        b.layout(())
    with pytest.raises(ValueError, match=r"layer=4 is out of range; expected 0 <= layer <= 3"):
        b.split_params(Fake((100,)), 4, 6)
    with pytest.raises(ValueError, match="w has 100 elements"):
        b.split_params(Fake((100,)), 0, 6)
    with pytest.raises(ValueError, match="x_shape must have 3 entries"):
        b.temp_space_sizes((5, 3))
    skip = RNNBlock("float32", 4, 1, "gru", input_mode="skip")
    with pytest.raises(ValueError, match="skip"):
        skip.get_param_size(5)


def test_closed_block_refuses_everything(no_c):
    b = _block()
    with b:
        pass
    assert b.closed and "closed" in repr(b)
    b.close()
    ops = _ops(b)
    for call in (
        lambda: b.apply(ops["w"], ops["x"], ops["hx"], ops["cx"]),
        lambda: b.backward(ops["w"], ops["x"], None, None, ops["x"], ops["x"]),
        lambda: b.get_param_size(6),
        lambda: b.layout(6),
        lambda: b.split_params(ops["w"], 0, 6),
        lambda: b.__enter__(),
    ):
        with pytest.raises(ValueError, match="RNNBlock is closed"):
            call()


# ==================================================================================================
# the call path with fakes: caching, pointer roles, reserve/workspace reuse
# ==================================================================================================
class FakeHandle:
    ptr = 0x1234
    device = 0
    stream = 0

    def set_stream(self, s):
        self.stream = s
        return s


class FakeDesc:
    made: ClassVar[list] = []

    def __init__(self, *args, **kw):
        self.args, self.kw = args, kw
        self.closed = False
        FakeDesc.made.append(self)

    def close(self):
        self.closed = True


class FakeRNNDesc(FakeDesc):
    def weight_space_size(self, h):
        kw = self.kw
        lay = canonical_rnn_layout(
            kw["cell_mode"],
            kw["input_size"],
            self.args[0],
            self.args[1],
            kw["direction"] == "bidirectional",
            kw["proj_size"],
            kw["input_mode"],
            kw["bias_mode"] == "double",
        )
        return lay.size * 4

    def temp_space_sizes(self, h, x, training=True):
        return (4096, 512) if training else (1024, 0)


class FakeDropout(FakeDesc):
    @staticmethod
    def states_size(h):
        return 256


@pytest.fixture
def fakes(monkeypatch):
    """Fake handle, descriptors, allocator and C functions; records the C calls."""
    calls: list = []
    handle = FakeHandle()

    def quiet(name):
        def fn(*args):
            calls.append((name, args))

        return fn

    def allocate(shape, dtype, device=None, stream=None, *, strides=None):
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        return Fake(shape, _operand.data_type(np.dtype(dtype)))

    monkeypatch.setattr(_call._handle, "get_handle", lambda device=None: handle)
    monkeypatch.setattr(_call, "quiet", quiet)
    monkeypatch.setattr(_call, "workspace", lambda h, n: 0xABC000)
    monkeypatch.setattr(_staging, "tensor_descriptor", lambda shape, strides, dt: ("tdesc", shape))
    monkeypatch.setattr(_rnn_calls, "RNNDescriptor", FakeRNNDesc)
    monkeypatch.setattr(rnn, "RNNDataDescriptor", FakeDesc)
    monkeypatch.setattr(_rnn_calls, "DropoutDescriptor", FakeDropout)
    monkeypatch.setattr(rnn.memory, "empty", allocate)
    monkeypatch.setattr(rnn.memory, "to_device", lambda a, stream=None, device=None: Fake(a.shape))
    monkeypatch.setattr(_rnn_calls, "zero", lambda p, n, d, s: calls.append(("zero", (p, n))))
    FakeDesc.made = []
    return calls


def _args(call):
    """The arguments of a recorded cudnnRNNForward call, by name."""
    names = (
        "h",
        "rnn",
        "mode",
        "lengths",
        "xdesc",
        "x",
        "ydesc",
        "y",
        "hdesc",
        "hx",
        "hy",
        "cdesc",
        "cx",
        "cy",
        "wbytes",
        "w",
        "wsbytes",
        "ws",
        "rsbytes",
        "rs",
    )
    return dict(zip(names, call[1], strict=True))


def test_forward_call_and_caching(fakes, monkeypatch):
    block = _block()
    builds = []
    real = _rnn_calls.build_forward
    monkeypatch.setattr(_rnn_calls, "build_forward", lambda *a: builds.append(1) or real(*a))
    ops = _ops(block)
    y, hy, cy = block.apply(ops["w"], ops["x"], ops["hx"], ops["cx"], [5, 2, 4], training=True)
    assert (y.shape, hy.shape, cy.shape) == ((5, 3, 8), (4, 3, 4), (4, 3, 4))
    name, _ = fakes[-1]
    a = _args(fakes[-1])
    assert name == "cudnnRNNForward" and a["mode"] == ForwardMode.TRAINING
    assert (a["x"], a["w"], a["hx"], a["cx"]) == (
        ops["x"].ptr,
        ops["w"].ptr,
        ops["hx"].ptr,
        ops["cx"].ptr,
    )
    assert (a["y"], a["hy"], a["cy"]) == (y.ptr, hy.ptr, cy.ptr)
    assert (a["wsbytes"], a["ws"], a["rsbytes"]) == (4096, 0xABC000, 512)
    assert a["wbytes"] == block.canonical_layout(6).size * 4
    assert isinstance(a["lengths"], ctypes.POINTER(ctypes.c_int32))
    reserve = a["rs"]
    # the RNN data descriptors: unpacked, padded, the lengths as given (unsorted)
    xd = a["xdesc"]
    assert xd.args == ((5, 2, 4), 6, 5) and xd.kw["layout"].name == "SEQ_MAJOR_UNPACKED"
    assert a["ydesc"].args == ((5, 2, 4), 8, 5)
    # repeated: no validation, same reserve, same descriptors
    for _ in range(3):
        block.apply(ops["w"], ops["x"], ops["hx"], ops["cx"], [5, 2, 4], training=True)
    assert len(builds) == 1
    assert {_args(c)["rs"] for c in fakes if c[0] == "cudnnRNNForward"} == {reserve}
    # inference: other workspace size, no reserve, NULL states when not given
    block.apply(ops["w"], ops["x"], None, None, (5, 2, 4))
    a = _args(fakes[-1])
    assert a["mode"] == ForwardMode.INFERENCE and (a["wsbytes"], a["rsbytes"]) == (1024, 0)
    assert a["hx"] is None and a["cx"] is None and a["rs"] is None
    assert len(builds) == 2 and len(block._shapes) == 1  # one shape, two calls
    # one RNN descriptor per input size, with the block's settings
    rd = [d for d in FakeDesc.made if isinstance(d, FakeRNNDesc)]
    assert len(rd) == 1 and rd[0].kw["aux_flags"] == "padded_io"
    assert rd[0].kw["math_type"].name == "FMA_MATH" and rd[0].kw["dropout"].kw == {
        "seed": block.seed
    }
    block.close()
    assert all(d.closed for d in FakeDesc.made)


def test_forward_out_and_overlap(fakes):
    block = _block("gru")
    ops = _ops(block)
    y, hy = Fake((5, 3, 8)), Fake((4, 3, 4))
    got = block.apply(ops["w"], ops["x"], ops["hx"], out=(y, hy))
    assert got[0] is y and got[1] is hy
    a = _args(fakes[-1])
    assert (a["y"], a["hy"], a["cy"]) == (y.ptr, hy.ptr, None)
    # out overlapping an input (same key, other addresses): refused on every call
    bad = Fake((5, 3, 8), ptr=ops["x"].ptr)
    with pytest.raises(ValueError, match="overlaps an input"):
        block.apply(ops["w"], ops["x"], ops["hx"], out=(bad, None))
    both = Fake((4, 3, 4), ptr=y.ptr)
    with pytest.raises(ValueError, match="two outputs overlap"):
        block.apply(ops["w"], ops["x"], ops["hx"], out=(y, both))


def test_batch_first_uses_batch_major_layout(fakes):
    block = RNNBlock("float32", 4, 1, "rnn_relu", batch_first=True)
    x = Fake((3, 5, 6))
    y, hy = block.apply(Fake((block.canonical_layout(6).size,)), x, None)
    assert y.shape == (3, 5, 4) and hy.shape == (1, 3, 4)
    assert _args(fakes[-1])["xdesc"].kw["layout"].name == "BATCH_MAJOR_UNPACKED"


def test_strided_input_is_staged_through_transform(fakes):
    block = RNNBlock("float32", 4, 1, "rnn_tanh")
    x = Fake((5, 3, 6), strides=(6, 30, 1))  # (T, N, I) view of batch-major data
    block.apply(Fake((block.canonical_layout(6).size,)), x, None)
    names = [c[0] for c in fakes]
    assert names == ["cudnnTransformTensor", "cudnnRNNForward"]
    assert _args(fakes[-1])["x"] != x.ptr  # the packed copy


def test_backward_pairs_with_the_last_training_apply(fakes):
    block = _block()
    ops = _ops(block)
    w, x, hx, cx = ops["w"], ops["x"], ops["hx"], ops["cx"]
    y, dy = Fake((5, 3, 8)), Fake((5, 3, 8))
    with pytest.raises(RuntimeError, match="no training apply ran"):
        block.backward(w, x, hx, cx, y, dy)
    block.apply(w, x, hx, cx, training=True)
    reserve = _args(fakes[-1])["rs"]
    dx, dhx, dcx, dw = block.backward(w, x, hx, cx, y, dy)
    data, zero, weights = fakes[-3:]
    assert data[0] == "cudnnRNNBackwardData_v8" and weights[0] == "cudnnRNNBackwardWeights_v8"
    assert data[1][3:6] == (_args(fakes[-4])["ydesc"], y.ptr, dy.ptr)
    assert data[1][7] == dx.ptr and data[1][11] == dhx.ptr and data[1][15] == dcx.ptr
    assert data[1][10] is None and data[1][14] is None  # dhy, dcy: zeros
    assert data[1][-1] == reserve and weights[1][-1] == reserve
    assert weights[1][2] == WgradMode.ADD and weights[1][11] == dw.ptr
    assert zero == ("zero", (dw.ptr, block.canonical_layout(6).size * 4))  # overwrite
    # accumulate into a given dw: no zeroing
    mine = Fake(dw.shape)
    block.backward(w, x, hx, cx, y, dy, dw=mine, accumulate=True)
    assert [c[0] for c in fakes[-2:]] == ["cudnnRNNBackwardData_v8", "cudnnRNNBackwardWeights_v8"]
    assert fakes[-1][1][11] == mine.ptr
    # overwrite a given dw: zeroed first
    block.backward(w, x, hx, cx, y, dy, dw=mine)
    assert fakes[-2] == ("zero", (mine.ptr, mine.shape[0] * 4))
    # weights=False: data only
    n = len(fakes)
    got = block.backward(w, x, hx, cx, y, dy, weights=False)
    assert got[3] is None and [c[0] for c in fakes[n:]] == ["cudnnRNNBackwardData_v8"]
    # another shape's training apply in between: refused
    block.apply(w, Fake((4, 3, 6)), hx, cx, training=True)
    with pytest.raises(RuntimeError, match=r"T=4, N=3, input_size=6\) than this backward"):
        block.backward(w, x, hx, cx, y, dy)
    # inference calls do not change the pairing
    block.apply(w, x, hx, cx, training=True)
    block.apply(w, Fake((4, 3, 6)), hx, cx)
    block.backward(w, x, hx, cx, y, dy)


def test_dropout_states_only_when_used(fakes):
    b = RNNBlock("float32", 4, 2, "lstm", dropout=0.3, seed=5)
    b.get_param_size(4)
    d = next(x for x in FakeDesc.made if isinstance(x, FakeDropout))
    assert d.args[1] == 0.3 and d.args[3:] == (256, 5)  # (handle, p, states, size, seed)
    FakeDesc.made.clear()
    RNNBlock("float32", 4, 1, "lstm", dropout=0.3).get_param_size(4)  # one layer: no dropout
    d = next(x for x in FakeDesc.made if isinstance(x, FakeDropout))
    assert d.args[1:] == (0.0,)


def test_math_defaults(fakes, monkeypatch):
    from pycudnn import _config

    assert RNNBlock("float16", 4, 1, "gru").math == "tensor_op"
    assert RNNBlock("float64", 4, 1, "gru").math == "default"
    assert RNNBlock("float32", 4, 1, "gru").math == "fma"
    with _config.config.override(allow_tf32=True):
        assert RNNBlock("float32", 4, 1, "gru").math == "default"
    assert RNNBlock("float32", 4, 1, "gru", math="TENSOR_OP").math == "tensor_op"


def test_get_param_size_and_temp_sizes_with_fakes(fakes):
    b = _block()
    assert b.get_param_size(6) == canonical_rnn_layout("lstm", 6, 4, 2, True).size
    assert b.get_param_size([32, 6]) == b.get_param_size(6)
    assert b.temp_space_sizes((5, 3, 6), [1, 2, 3]) == (1024, 4096, 512)
    with pytest.raises(ValueError, match="seq_lengths has 2 entries"):
        b.temp_space_sizes((5, 3, 6), [1, 2])


def test_a_fresh_block_copies_and_pickles():
    import copy
    import pickle

    block = RNNBlock("float32", 4, 1, "lstm")
    for clone in (copy.deepcopy(block), pickle.loads(pickle.dumps(block))):
        assert repr(clone) == repr(block) and clone._calls() is not block._calls()


def test_block_takes_every_frameworks_dtypes(no_c):
    # issue 29: RNNBlock(torch.float16, ...) as RNNBlock("float16", ...)
    from _framework_dtypes import jax_numpy, torch

    for given, expected in [
        (torch.float16, np.float16),
        (torch.float32, np.float32),
        (torch.double, np.float64),
        (jax_numpy().float32, np.float32),
        (np.float16, np.float16),  # CuPy's
    ]:
        assert RNNBlock(given, 4, 1, "lstm").dtype == expected, given
    with pytest.raises(TypeError, match="bfloat16 is not supported"):
        RNNBlock(torch.bfloat16, 4, 1, "lstm")  # cuDNN's RNNs: float16, float32, float64
