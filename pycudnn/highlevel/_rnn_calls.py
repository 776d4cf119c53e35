"""What an :class:`.rnn.RNNBlock` is made of besides its public methods: the validation its calls
share, its per-device state (:class:`Device`: the dropout descriptor and states, one
``RNNDescriptor`` per input size), its per-shape state (:class:`Shape`: data descriptors, device
sequence lengths, temp-space sizes, the reserve space), and its two call entries
(:class:`RNNForward`, :class:`RNNBackward`) with their build functions.

The entries are :class:`._call.Call` objects like every high-level call's; they live in the
block's own store (see :mod:`.rnn`), because they hold the block's descriptors and reserve space.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from .. import _layout, memory
from .._types import itemsize
from ..descriptors import DropoutDescriptor, RNNDescriptor, TensorDescriptor
from ..enums import DataType, ForwardMode, WgradMode
from . import _call, _checks, _operand, _staging
from .rnn_layout import GATES, PROJ_ID, RNNLayout

__all__ = [
    "Device",
    "Out",
    "RNNBackward",
    "RNNForward",
    "Shape",
    "build_backward",
    "build_forward",
    "check_lengths",
    "describe_shape",
    "input_size",
    "lengths_key",
    "nbytes",
    "nonneg_int",
    "out_tuple",
    "stage_inputs",
    "zero",
]

FWD, BWD = "RNNBlock.apply", "RNNBlock.backward"
_INT32_P = ctypes.POINTER(ctypes.c_int32)


def nonneg_int(value: Any, name: str, func: str, lo: int = 1, hi: int = _layout.INT32_MAX) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{func}: {name} must be an int, got {value!r}")
    v = value.__index__()
    if not lo <= v <= hi:
        raise ValueError(f"{func}: {name}={v} is out of range; expected {lo} <= {name} <= {hi}")
    return v


def input_size(value: Any, func: str) -> int:
    """Theano passes ``(batch_size, input_dim)``; an int is the input dimension."""
    if not isinstance(value, bool) and hasattr(value, "__index__"):
        return nonneg_int(value, "input_size", func)
    try:
        vals = tuple(value)
    except TypeError:
        raise TypeError(
            f"{func}: input_size must be an int or Theano's (batch_size, input_dim), got {value!r}"
        ) from None
    if not vals:
        raise ValueError(f"{func}: input_size={value!r} is empty")
    return nonneg_int(vals[-1], "input_size", func)


def lengths_key(seq_lengths: Any) -> tuple | None:
    """The call-key form of *seq_lengths* (a tuple), refusing device arrays."""
    if seq_lengths is None:
        return None
    if hasattr(seq_lengths, "__cuda_array_interface__") or getattr(seq_lengths, "is_cuda", False):
        raise TypeError(
            "RNNBlock: seq_lengths must be host integers (a list, tuple, NumPy array or CPU "
            "tensor): cuDNN reads them on the host; pycudnn copies them to the device itself"
        )
    if isinstance(seq_lengths, tuple):
        return seq_lengths
    tolist = getattr(seq_lengths, "tolist", None)
    if tolist is not None:
        seq_lengths = tolist()
    try:
        return tuple(seq_lengths)
    except TypeError:
        raise TypeError(
            f"RNNBlock: seq_lengths must be a sequence of ints, got {type(seq_lengths).__name__}"
        ) from None


def out_tuple(func: str, out: Any, what: str) -> tuple:
    if out is None:
        return ()
    if not isinstance(out, (tuple, list)):
        raise TypeError(
            f"{func}: out must be a tuple {what} of device arrays or None entries, got "
            f"{type(out).__name__}"
        )
    return tuple(out)


def check_lengths(func: str, lengths: tuple, n: int, t: int) -> tuple[int, ...]:
    if len(lengths) != n:
        raise ValueError(
            f"{func}: seq_lengths has {len(lengths)} entries but the batch has {n} sequences"
        )
    out = []
    for v in lengths:
        if isinstance(v, bool) or not hasattr(v, "__index__"):
            raise TypeError(f"{func}: seq_lengths must contain ints, got {v!r}")
        v = v.__index__()
        if not 1 <= v <= t:
            raise ValueError(
                f"{func}: seq_lengths contains {v}; each length must be in [1, {t}] (the "
                "padded sequence length of x)"
            )
        out.append(v)
    return tuple(out)


class Shape:
    """Everything that depends on one input shape: the RNN data descriptors, the device copy of
    the sequence lengths, the temp-space sizes and the reserve space (kept for ``backward``)."""

    __slots__ = (
        "cdesc",
        "dev_lengths",
        "dev_lengths_p",
        "device",
        "hdesc",
        "key",
        "lengths",
        "reserve",
        "rnn",
        "rs_bytes",
        "w_bytes",
        "ws_infer",
        "ws_train",
        "xdesc",
        "ydesc",
    )

    def __init__(self, key, device, rnn, descs, lengths, sizes):
        """*rnn*: ``(RNNDescriptor, weight bytes)``; *descs*: ``(x, y, h, c)`` descriptors;
        *lengths*: ``(host lengths, their device copy)``; *sizes*: ``(workspace for training,
        for inference, reserve space)`` in bytes."""
        self.key = key
        self.device = device
        self.rnn, self.w_bytes = rnn
        self.xdesc, self.ydesc, self.hdesc, self.cdesc = descs
        self.lengths, dev_len = lengths
        self.dev_lengths = dev_len  # cuDNN reads the lengths on the device, asynchronously
        self.dev_lengths_p = ctypes.cast(ctypes.c_void_p(dev_len.ptr), _INT32_P)
        self.ws_train, self.ws_infer, self.rs_bytes = sizes
        self.reserve: Any = None  # allocated by the first training apply, then reused

    def reserve_ptr(self, stream: int) -> int:
        if not self.rs_bytes:
            return 0
        if self.reserve is None:
            self.reserve = memory.empty((self.rs_bytes,), np.uint8, self.device, stream)
        return self.reserve.ptr


def nbytes(g: _operand.Operand | None) -> int:
    """Bytes *g*'s elements span (0 for None)."""
    return 0 if g is None else g.nbytes_span


class Out(NamedTuple):
    """An output: its shape and, when given as ``out=``, the operand (else allocated)."""

    shape: tuple[int, ...]
    given: _operand.Operand | None


def stage_inputs(dt: DataType, named: list[tuple[int, _operand.Operand]]) -> _staging.Stage | None:
    """A Stage copying the inputs that are not packed (C order) into packed buffers."""
    todo = []
    for idx, g in named:
        if g is None:
            continue
        packed = _layout.packed_strides(g.shape)
        if not _layout.matches(g.shape, g.strides, packed):
            shape, strides = _staging.padded(g.shape, g.strides)
            g4 = _operand.Operand(g.ptr, shape, strides, g.dtype, g.device)
            todo.append((idx, g4, _layout.packed_strides(shape)))
    return _staging.Stage(dt, todo, None, 1.0, 0.0) if todo else None


class RNNForward(_call.Call):
    """``cudnnRNNForward``: w, x, hx, cx (0 when absent), then y, hy[, cy]."""

    __slots__ = ("block", "fn", "shape", "training")

    def __init__(self, block, h, allocs, spans, stage, shape, training):
        super().__init__(FWD, h, allocs, spans, stage, keepalive=shape)
        self.block = block
        self.shape: Shape = shape
        self.training = training
        self.fn = _call.quiet("cudnnRNNForward")

    def launch(self, ptrs: Sequence[int]) -> None:
        pw, px, ph, pc, py, phy = ptrs[:6]
        pcy = ptrs[6] if len(ptrs) > 6 else 0
        s, h = self.shape, self.handle
        if self.training:
            ws, rs, rptr = s.ws_train, s.rs_bytes, s.reserve_ptr(h.stream)
            mode = ForwardMode.TRAINING
        else:
            ws, rs, rptr, mode = s.ws_infer, 0, 0, ForwardMode.INFERENCE
        wsp = _call.workspace(h, ws) if ws else 0
        self.fn(
            h.ptr,
            s.rnn,
            mode,
            s.dev_lengths_p,
            s.xdesc,
            px,
            s.ydesc,
            py,
            s.hdesc,
            ph or None,
            phy,
            s.cdesc,
            pc or None,
            pcy or None,
            s.w_bytes,
            pw,
            ws,
            wsp or None,
            rs,
            rptr or None,
        )
        if self.training:
            self.block._last_train = s  # backward needs its reserve space


class RNNBackward(_call.Call):
    """``cudnnRNNBackwardData_v8`` then ``cudnnRNNBackwardWeights_v8``: w, x, hx, cx, y, dy,
    dhy, dcy (0 when absent), then dx, dhx[, dcx][, dw]."""

    __slots__ = ("block", "fn", "fn_weights", "lstm", "shape", "weights", "zero_dw")

    def __init__(self, block, h, allocs, spans, stage, shape, weights):
        super().__init__(BWD, h, allocs, spans, stage, keepalive=shape)
        self.block = block
        self.shape: Shape = shape
        self.lstm = block._mode == "lstm"
        # weights: None (no weight gradient), or whether dw starts from zeros (overwritten)
        self.weights, self.zero_dw = weights is not None, bool(weights)
        self.fn = _call.quiet("cudnnRNNBackwardData_v8")
        self.fn_weights = _call.quiet("cudnnRNNBackwardWeights_v8")

    def _check_reserve(self) -> None:
        """The last training apply must be of this shape: its reserve space is read."""
        last, s = self.block._last_train, self.shape
        if last is s:
            return
        if last is None:
            raise RuntimeError(
                f"{BWD}: no training apply ran on this block; call apply(..., "
                "training=True) first (backward needs its reserve space)"
            )
        raise RuntimeError(
            f"{BWD}: the last training apply had another input shape or other sequence "
            f"lengths ({describe_shape(last.key)}) than this backward "
            f"({describe_shape(s.key)}); backward uses the reserve space of the last "
            "training apply"
        )

    def launch(self, ptrs: Sequence[int]) -> None:
        self._check_reserve()
        s, h = self.shape, self.handle
        pw, px, ph, pc, py, pdy, pdh, pdc, pdx, pdhx = ptrs[:10]
        pdcx = ptrs[10] if self.lstm else 0
        ws = s.ws_train
        wsp = _call.workspace(h, ws) if ws else 0
        rptr = s.reserve_ptr(h.stream)
        self.fn(
            h.ptr,
            s.rnn,
            s.dev_lengths_p,
            s.ydesc,
            py,
            pdy,
            s.xdesc,
            pdx,
            s.hdesc,
            ph or None,
            pdh or None,
            pdhx,
            s.cdesc,
            pc or None,
            pdc or None,
            pdcx or None,
            s.w_bytes,
            pw,
            ws,
            wsp or None,
            s.rs_bytes,
            rptr or None,
        )
        if not self.weights:
            return
        pdw = ptrs[-1]
        if self.zero_dw:
            # cuDNN's weight gradient adds into dw (CUDNN_WGRAD_MODE_SET is not supported by
            # every release): start from zeros to overwrite
            zero(pdw, s.w_bytes, h.device, h.stream)
        self.fn_weights(
            h.ptr,
            s.rnn,
            WgradMode.ADD,
            s.dev_lengths_p,
            s.xdesc,
            px,
            s.hdesc,
            ph or None,
            s.ydesc,
            py,
            s.w_bytes,
            pdw,
            ws,
            wsp or None,
            s.rs_bytes,
            rptr or None,
        )


def _out_specs(block, func, outs, names, shapes, device) -> list:
    """The output specs of a forward or backward call: *outs* is empty or has one entry per
    output, the three of *names* and *shapes* for an LSTM, the first two otherwise."""
    nout = 3 if block._mode == "lstm" else 2
    if not isinstance(outs, (tuple, list)) or len(outs) not in (0, nout):
        raise ValueError(
            f"{func}: out must be a tuple of {nout} entries ({', '.join(names[:nout])}), "
            f"got {outs!r}"
        )
    outs = tuple(outs) or (None,) * nout
    return [
        block._out(func, name, o, shape, device)
        for name, o, shape in zip(names[:nout], outs, shapes[:nout], strict=True)
    ]


def build_forward(block, w, x, hx, cx, sl, training, outs, stream) -> RNNForward:
    """Validate an :meth:`RNNBlock.apply` (before any C call) and make its call entry."""
    func = FWD
    gx, gw, t, n, inp, device, hshape, cshape, expected = block._inputs(func, x, w)
    if stream is not None:
        _checks.check_stream(func, stream, device)
    gh = None if hx is None else block._operand(func, "hx", hx, hshape, device)
    if cx is not None and block._mode != "lstm":
        raise TypeError(f"{func}: cx is only for rnn_mode='lstm', not {block._mode!r}")
    gc = None if cx is None else block._operand(func, "cx", cx, cshape, device)
    lengths = None if sl is None else check_lengths(func, sl, n, t)
    shapes = (block._y_shape(t, n), hshape, cshape)
    specs = _out_specs(block, func, outs, ("y", "hy", "cy"), shapes, device)
    stage = stage_inputs(block._dt, [(1, gx), (2, gh), (3, gc)])
    spans = tuple(nbytes(g) for g in (gw, gx, gh, gc))
    # -- validated: descriptors, sizes (C calls) ------------------------------------------
    dev = block._device(device)
    if dev.rnn(inp)[1] // itemsize(block._dt) != expected:  # pragma: no cover - cuDNN change
        block._check_weights(func, "w", gw, dev.rnn(inp)[1] // itemsize(block._dt))
    shape = block._shape(dev, t, n, inp, lengths)
    h = _call.handle_for(device, stream, func)
    allocs = tuple(block._alloc(o, device) for o in specs)
    spans += tuple(
        nbytes(o.given) if a is None else a.nbytes_span for o, a in zip(specs, allocs, strict=True)
    )
    return RNNForward(block, h, allocs, spans, stage, shape, training)


def build_backward(block, ops, sl, outs, dw, flags, stream) -> RNNBackward:
    """Validate an :meth:`RNNBlock.backward` (before any C call) and make its call entry;
    *flags*: ``(weights, accumulate)``."""
    func = BWD
    weights, accumulate = flags
    w, x, hx, cx, y, dy, dhy, dcy = ops
    gx, gw, t, n, inp, device, hshape, cshape, expected = block._inputs(func, x, w)
    if stream is not None:
        _checks.check_stream(func, stream, device)
    yshape = block._y_shape(t, n)
    if cx is not None and block._mode != "lstm":
        raise TypeError(f"{func}: cx is only for rnn_mode='lstm', not {block._mode!r}")
    if dcy is not None and block._mode != "lstm":
        raise TypeError(f"{func}: dcy is only for rnn_mode='lstm', not {block._mode!r}")
    gh = None if hx is None else block._operand(func, "hx", hx, hshape, device)
    gc = None if cx is None else block._operand(func, "cx", cx, cshape, device)
    if y is None or dy is None:
        raise TypeError(f"{func}: y and dy are required (the forward output and its gradient)")
    gy = block._operand(func, "y", y, yshape, device)
    gdy = block._operand(func, "dy", dy, yshape, device)
    gdh = None if dhy is None else block._operand(func, "dhy", dhy, hshape, device)
    gdc = None if dcy is None else block._operand(func, "dcy", dcy, cshape, device)
    lengths = None if sl is None else check_lengths(func, sl, n, t)
    shapes = (tuple(gx.shape), hshape, cshape)
    specs = _out_specs(block, func, outs, ("dx", "dhx", "dcx"), shapes, device)
    wsize = (gw.shape[0],)
    dw_spec = None
    if dw is not None:
        if not weights:
            raise ValueError(f"{func}: dw was given with weights=False")
        gdw = block._operand(func, "dw", dw, wsize, device)
        block._check_weights(func, "dw", gdw, expected)
        dw_spec = Out(wsize, gdw)
    elif weights:
        dw_spec = Out(wsize, None)
    specs.append(dw_spec)
    named = [(1, gx), (2, gh), (3, gc), (4, gy), (5, gdy), (6, gdh), (7, gdc)]
    stage = stage_inputs(block._dt, named)
    spans = tuple(nbytes(g) for g in (gw, gx, gh, gc, gy, gdy, gdh, gdc))
    # -- validated --------------------------------------------------------------------------
    dev = block._device(device)
    shape = block._shape(dev, t, n, inp, lengths)
    h = _call.handle_for(device, stream, func)
    specs = [o for o in specs if o is not None]  # dw_spec None: no weight gradient
    allocs = tuple(block._alloc(o, device) for o in specs)
    spans += tuple(
        nbytes(o.given) if a is None else a.nbytes_span for o, a in zip(specs, allocs, strict=True)
    )
    # whether dw starts from zeros (None: no weight gradient)
    zero_dw = None if dw_spec is None else (dw_spec.given is None or not accumulate)
    return RNNBackward(block, h, allocs, spans, stage, shape, zero_dw)


def zero(ptr: int, nbytes: int, device: int, stream: int) -> None:
    """Zero *nbytes* at *ptr*, ordered on *stream*."""
    memory.DeviceArray.from_ptr(
        ptr, (nbytes,), np.uint8, device=device, stream=stream, check=False
    ).fill_(0)


def describe_shape(key: tuple) -> str:
    _device, t, n, inp, lengths = key
    s = f"T={t}, N={n}, input_size={inp}"
    return s + (f", seq_lengths={list(lengths)}" if lengths is not None else "")


class Device:
    """A block's state on one device: the dropout descriptor with its states, and one
    RNNDescriptor (with its weight-space size and layout) per input size."""

    __slots__ = ("block", "device", "drop", "layouts", "rnns", "states")

    def __init__(self, block: Any, device: int) -> None:
        self.block = block
        self.device = device
        self.rnns: dict[int, tuple[RNNDescriptor, int]] = {}
        self.layouts: dict[int, RNNLayout] = {}
        h = self.handle()
        b = block
        if b._dropout > 0 and b._layers > 1:
            nbytes = DropoutDescriptor.states_size(h)
            self.states = memory.empty((nbytes,), np.uint8, device, h.stream)
            self.drop = DropoutDescriptor(h, b._dropout, self.states, nbytes, b._seed)
        else:
            self.states = None
            self.drop = DropoutDescriptor(h, 0.0, seed=b._seed)

    def handle(self) -> Any:
        return _call.handle_for(self.device, None)

    def close(self) -> None:
        for rnn, _ in self.rnns.values():
            rnn.close()
        self.rnns.clear()
        self.drop.close()
        self.states = None

    def rnn(self, inp: int) -> tuple[RNNDescriptor, int]:
        """The RNN descriptor for input size *inp* and its weight space in bytes."""
        got = self.rnns.get(inp)
        if got is None:
            b = self.block
            desc = RNNDescriptor(
                b._hidden,
                b._layers,
                cell_mode=b._mode,
                input_size=inp,
                proj_size=b._proj,
                bias_mode="double" if b._bias else "none",
                direction="bidirectional" if b._dirs == 2 else "unidirectional",
                input_mode=b._input_mode,
                dtype=b._dt,
                math_type=b._math,
                dropout=self.drop,
                aux_flags="padded_io",
                algo="standard",
            )
            got = self.rnns[inp] = (desc, desc.weight_space_size(self.handle()))
        return got

    def layout(self, inp: int) -> RNNLayout:
        """The weight layout cuDNN reports for input size *inp*."""
        lay = self.layouts.get(inp)
        if lay is None:
            lay = self.layouts[inp] = self._read_layout(inp)
        return lay

    def _read_layout(self, inp: int) -> RNNLayout:
        b = self.block
        desc, nbytes = self.rnn(inp)
        h = self.handle()
        isz = itemsize(b._dt)
        fn = _call.quiet("cudnnGetRNNWeightParams")
        # cudnnGetRNNWeightParams computes addresses inside the buffer it is given: use a real one
        buf = memory.empty((max(nbytes, 1),), np.uint8, self.device, h.stream)
        base = buf.ptr
        mdesc = TensorDescriptor((1, 1, 1), b._dt)
        bdesc = TensorDescriptor((1, 1, 1), b._dt)
        nlin = 2 * len(GATES[b._mode])
        ids = list(range(nlin)) + ([PROJ_ID] if b._proj else [])
        slots = []
        try:
            for pl in range(b._layers * b._dirs):
                for lid in ids:
                    ma, ba = ctypes.c_void_p(), ctypes.c_void_p()
                    fn(
                        h.ptr,
                        desc,
                        pl,
                        nbytes,
                        base,
                        lid,
                        mdesc,
                        ctypes.byref(ma),
                        bdesc,
                        ctypes.byref(ba),
                    )
                    for kind, addr, d in (("weight", ma.value, mdesc), ("bias", ba.value, bdesc)):
                        if not addr:
                            continue
                        dims = d.shape  # (1, rows, cols) or (1, rows, 1)
                        shape = (dims[-2], dims[-1]) if kind == "weight" else (dims[-2],)
                        slots.append((pl, lid, kind, (addr - base) // isz, shape))
        finally:
            mdesc.close()
            bdesc.close()
        return RNNLayout(
            b._mode,
            inp,
            b._hidden,
            b._layers,
            b._dirs == 2,
            b._proj,
            b._input_mode,
            b._bias,
            nbytes // isz,
            slots,
        )
