"""cuDNN's RNNs (RNN tanh/relu, LSTM, GRU) as a JAX function on ``cudnnRNNForward``,
``cudnnRNNBackwardData_v8`` and ``cudnnRNNBackwardWeights_v8``, with cuDNN's packed weights.

What :class:`pycudnn.highlevel.rnn.RNNBlock` computes (docs/rnn.md: PyTorch's ``nn.RNN``,
``nn.LSTM`` and ``nn.GRU`` equations, multi-layer, bidirectional, LSTM projection, padded
sequences), but functional: the block is only the source of cuDNN's descriptors and sizes (one
per thread and configuration); the **reserve space** -- the intermediate results the training
forward writes and both backward calls read -- is not the block's but an XLA buffer, a ``uint8``
result of the training forward kept by ``jax.custom_vjp`` as a residual. The backward data call
updates it in place, so it enters the backward call as an operand aliased to a result
(``input_output_aliases``: XLA copies it first only when something else still reads it).

A differentiated call (``jax.grad``, ``jax.vjp``) runs the training forward; any other runs the
inference forward (no reserve). The reserve's size is cuDNN's (``cudnnGetRNNTempSpaceSizes``),
asked when a differentiated call is traced, on the current device: tracing a gradient needs a
GPU and concrete ``T`` and ``N`` (the inference call is shape-polymorphic). The workspace is
pycudnn's per-stream one, as for every operation of ``pycudnn.jax``.

Sequence lengths are static (a tuple of ``N`` ints, part of the request): cuDNN reads them on the
host when it describes the data. Dropout and ``input_mode='skip'`` are not offered (cuDNN's
dropout states are state a functional call cannot own); ``bias=False`` is not offered either
(pack zeros).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _config
from ..enums import ForwardMode, WgradMode
from ..highlevel import _call, _rnn_calls
from ..highlevel.rnn import RNNBlock
from ..highlevel.rnn_layout import (
    RNNLayout,
    canonical_rnn_layout,
    torch_params,
    torch_shape,
)
from . import _capture, _ops, _request
from ._operands import device_of

__all__ = [
    "MODES",
    "RNN",
    "RNNGrad",
    "reserve_size",
    "rnn",
    "rnn_pack_weights",
    "rnn_unpack_weights",
    "rnn_weight_size",
    "rnn_weights_from_flax",
]

_FUNC = "pycudnn.jax.rnn"
#: the cell types, cuDNN's names
MODES = ("rnn_relu", "rnn_tanh", "lstm", "gru")
_TYPES = ("float16", "float32", "float64")  # cuDNN's RNN data types
_local = threading.local()
Shape = tuple[Any, ...]  # a shape (dims may be symbolic at trace time)


def _int(value: Any, name: str, func: str, lo: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{func}: {name}={value!r}; expected an int")
    if int(value) < lo:
        raise ValueError(f"{func}: {name}={value!r}; expected an int >= {lo}")
    return int(value)


def _bool(value: Any, name: str, func: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{func}: {name}={value!r}; expected True or False")
    return bool(value)


def _config_of(
    func: str, mode: Any, hidden_size: Any, num_layers: Any, bidirectional: Any, proj_size: Any
) -> tuple[str, int, int, bool, int | None]:
    """The network's checked configuration (strict types; nothing rewritten)."""
    if mode not in MODES:
        raise ValueError(f"{func}: mode={mode!r}; expected one of {MODES}")
    hidden = _int(hidden_size, "hidden_size", func)
    layers = _int(num_layers, "num_layers", func)
    bidi = _bool(bidirectional, "bidirectional", func)
    if proj_size is not None:
        proj = _int(proj_size, "proj_size", func)
        if mode != "lstm" or proj >= hidden:
            raise ValueError(
                f"{func}: proj_size={proj_size!r}; expected None, or for mode='lstm' an int "
                f"< hidden_size ({hidden})"
            )
        proj_size = proj
    return mode, hidden, layers, bidi, proj_size


@dataclasses.dataclass(frozen=True)
class RNN(_request.Request):
    """The forward: operands ``x``, ``h0``, (``c0``,) ``w``; results ``y``, ``hy``, (``cy``,)
    and in training the reserve space (``uint8[reserve]``)."""

    family = "rnn"
    batch_results = False  # x and h0 carry the batch in different dims: vmap runs per example

    mode: str
    hidden_size: int
    num_layers: int
    bidirectional: bool
    proj_size: int | None
    batch_first: bool
    seq_lengths: tuple[int, ...] | None
    training: bool
    reserve: int  # bytes of cuDNN's reserve space (training; 0 in inference)

    def __post_init__(self) -> None:
        _config_of(
            _FUNC, self.mode, self.hidden_size, self.num_layers, self.bidirectional, self.proj_size
        )
        _bool(self.batch_first, "batch_first", _FUNC)
        _bool(self.training, "training", _FUNC)
        _int(self.reserve, "reserve", _FUNC, lo=0)
        if self.seq_lengths is not None and not isinstance(self.seq_lengths, tuple):
            raise TypeError(f"{_FUNC}: seq_lengths={self.seq_lengths!r}; expected a tuple")

    @property
    def lstm(self) -> bool:
        """Whether the cell is an LSTM (a cell state)."""
        return self.mode == "lstm"

    @property
    def states(self) -> int:
        """``num_layers * num_directions``: the states' leading dim."""
        return self.num_layers * (2 if self.bidirectional else 1)

    @property
    def out_size(self) -> int:
        """Width of each direction's output and hidden state."""
        return self.proj_size or self.hidden_size

    def geometry(self, shape: Sequence[Any]) -> tuple[Any, Any, Any]:
        """``(T, N, input_size)`` of x's *shape*."""
        if self.batch_first:
            return shape[1], shape[0], shape[2]
        return shape[0], shape[1], shape[2]

    def layout(self, input_size: int) -> RNNLayout:
        """The weight layout (cuDNN 9's, computed: docs/rnn.md)."""
        return canonical_rnn_layout(
            self.mode,
            input_size,
            self.hidden_size,
            self.num_layers,
            self.bidirectional,
            self.proj_size,
        )

    def batch_operands(self) -> tuple[bool, ...]:
        return (False,) * (4 if self.lstm else 3)

    def check(self, x: Any, h0: Any, c0: Any, w: Any) -> tuple[np.dtype, Shape, Shape, Shape]:
        """Check the forward's operands; ``(dtype, y shape, h shape, c shape)``."""
        dt = _request.check_dtype(_FUNC, "x", x, _TYPES)
        if len(x.shape) != 3:
            order = "(N, T, input_size)" if self.batch_first else "(T, N, input_size)"
            raise ValueError(f"{_FUNC}: x has shape {tuple(x.shape)}; expected 3 dims {order}")
        t, n, inp = self.geometry(tuple(x.shape))
        if not _request.known(inp):
            raise ValueError(f"{_FUNC}: x's input_size {inp} must be a concrete int")
        if self.seq_lengths is not None:
            if _request.known(n) and len(self.seq_lengths) != n:
                raise ValueError(
                    f"{_FUNC}: seq_lengths has {len(self.seq_lengths)} entries; x has {n} sequences"
                )
            if _request.known(t) and max(self.seq_lengths) > t:
                raise ValueError(
                    f"{_FUNC}: seq_lengths={self.seq_lengths} has a length > T={t} (x's "
                    "padded length)"
                )
        hshape = (self.states, n, self.out_size)
        cshape = (self.states, n, self.hidden_size)
        named = [("h0", h0, hshape), ("c0", c0, cshape)] if self.lstm else [("h0", h0, hshape)]
        for name, a, shape in named:
            if tuple(a.shape) != shape or np.dtype(a.dtype) != dt:
                raise ValueError(
                    f"{_FUNC}: {name} is {np.dtype(a.dtype).name}{list(a.shape)}; expected "
                    f"{dt.name}{list(shape)} (num_layers * num_directions, N, "
                    f"{'proj_size or hidden_size' if name == 'h0' else 'hidden_size'})"
                )
        size = self.layout(int(inp)).size
        if tuple(w.shape) != (size,) or np.dtype(w.dtype) != dt:
            raise ValueError(
                f"{_FUNC}: weights is {np.dtype(w.dtype).name}{list(w.shape)}; expected "
                f"{dt.name}[{size}] (cuDNN's packed buffer: rnn_weight_size)"
            )
        ds = 2 if self.bidirectional else 1
        yshape = (n, t, ds * self.out_size) if self.batch_first else (t, n, ds * self.out_size)
        return dt, yshape, hshape, cshape

    def results(self, *operands: Any) -> _ops.Results:
        x, h0, c0, w = operands if self.lstm else (operands[0], operands[1], None, operands[2])
        dt, yshape, hshape, cshape = self.check(x, h0, c0, w)
        out: list[tuple[tuple[Any, ...], Any]] = [(yshape, dt), (hshape, dt)]
        if self.lstm:
            out.append((cshape, dt))
        if self.training:
            out.append(((self.reserve,), np.dtype("uint8")))
        return tuple(out)

    # -- the run side (XLA's call on a GPU) -------------------------------------------------------
    def _prepare(self, args: Sequence[Any], rets: Sequence[Any], stream: int) -> tuple[Any, Any]:
        """``(handle, the block's per-shape state)`` on *stream*, the weight size checked."""
        x, w = args[0], args[3 if self.lstm else 2]
        t, n, inp = self.geometry(x.shape)
        device = device_of((*args, *rets))
        h = _call.handle_for(device, stream, _FUNC)  # first: the block's copies go on XLA's stream
        block = _block(self, x.dtype)
        s = block._shape(block._device(device), t, n, inp, self.seq_lengths)
        if s.w_bytes != w.nbytes:
            raise ValueError(
                f"{_FUNC}: cuDNN's weight space is {s.w_bytes} bytes; weights has {w.nbytes}"
            )
        return h, s

    def run(self, args: Sequence[Any], rets: Sequence[Any], stream: int) -> None:
        h, s = self._prepare(args, rets, stream)
        if self.lstm:
            px, ph, pc, pw = (b.ptr for b in args)
        else:
            (px, ph, pw), pc = (b.ptr for b in args), 0
        py, phy = rets[0].ptr, rets[1].ptr
        pcy = rets[2].ptr if self.lstm else 0
        if self.training:
            if s.rs_bytes != self.reserve:
                raise ValueError(
                    f"{_FUNC}: cuDNN's reserve space is {s.rs_bytes} bytes here, {self.reserve} "
                    "when the call was traced (another GPU or cuDNN?): trace it again"
                )
            ws, rs, rptr, mode = s.ws_train, s.rs_bytes, rets[-1].ptr, ForwardMode.TRAINING
        else:
            ws, rs, rptr, mode = s.ws_infer, 0, 0, ForwardMode.INFERENCE
        wsp = _call.workspace(h, ws) if ws else 0
        _call.quiet("cudnnRNNForward")(
            h.ptr, s.rnn, mode, s.dev_lengths_p, s.xdesc, px, s.ydesc, py, s.hdesc, ph, phy,
            s.cdesc, pc or None, pcy or None, s.w_bytes, pw, ws, wsp or None, rs, rptr or None,
        )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class RNNGrad(RNN):
    """The backward: operands ``x``, ``h0``, (``c0``,) ``w``, ``y``, ``dy``, ``dhy``,
    (``dcy``,) ``reserve``; results ``dx``, ``dh0``, (``dc0``,) ``dw``, ``reserve`` (the
    operand's buffer: cuDNN's backward data updates it, its backward weights reads it)."""

    @property
    def aliases(self) -> tuple[tuple[int, int], ...]:  # type: ignore[override]
        return ((8, 4),) if self.lstm else ((6, 3),)

    def batch_operands(self) -> tuple[bool, ...]:
        return (False,) * (9 if self.lstm else 7)

    def results(self, *operands: Any) -> _ops.Results:
        k = 4 if self.lstm else 3
        fwd = dataclasses.replace(self, training=True)
        want = RNN.results(fwd, *operands[:k])
        y, dy, dh, *rest = operands[k:]
        dc = rest[0] if self.lstm else None
        named = [("y", y, want[0]), ("dy", dy, want[0]), ("dhy", dh, want[1])]
        named += [("dcy", dc, want[2])] if self.lstm else []
        named.append(("reserve", operands[-1], want[-1]))
        for name, a, (shape, dt) in named:
            if tuple(a.shape) != tuple(shape) or np.dtype(a.dtype) != dt:
                raise ValueError(
                    f"{_FUNC} gradient: {name} is {np.dtype(a.dtype).name}{list(a.shape)}; "
                    f"expected {np.dtype(dt).name}{list(shape)}"
                )
        x, h0 = operands[0], operands[1]
        grads = [(tuple(x.shape), x.dtype), (tuple(h0.shape), h0.dtype)]
        if self.lstm:
            grads.append((tuple(operands[2].shape), operands[2].dtype))
        w = operands[k - 1]
        return (*grads, (tuple(w.shape), w.dtype), want[-1])

    def run(self, args: Sequence[Any], rets: Sequence[Any], stream: int) -> None:
        h, s = self._prepare(args, rets, stream)
        if self.lstm:
            px, ph, pc, pw, py, pdy, pdh, pdc, _r = (b.ptr for b in args)
            pdx, pdhx, pdcx, pdw, rptr = (b.ptr for b in rets)
        else:
            px, ph, pw, py, pdy, pdh, _r = (b.ptr for b in args)
            pdx, pdhx, pdw, rptr = (b.ptr for b in rets)
            pc = pdc = pdcx = 0
        if s.rs_bytes != self.reserve:
            raise ValueError(
                f"{_FUNC}: cuDNN's reserve space is {s.rs_bytes} bytes here, {self.reserve} "
                "when the call was traced: trace it again"
            )
        ws = s.ws_train
        wsp = _call.workspace(h, ws) if ws else 0
        _call.quiet("cudnnRNNBackwardData_v8")(
            h.ptr, s.rnn, s.dev_lengths_p, s.ydesc, py, pdy, s.xdesc, pdx, s.hdesc, ph, pdh,
            pdhx, s.cdesc, pc or None, pdc or None, pdcx or None, s.w_bytes, pw, ws,
            wsp or None, s.rs_bytes, rptr or None,
        )  # fmt: skip
        # cuDNN's weight gradient adds into dw (its SET mode is refused by some releases)
        _rnn_calls.zero(pdw, s.w_bytes, h.device, h.stream)
        _call.quiet("cudnnRNNBackwardWeights_v8")(
            h.ptr, s.rnn, WgradMode.ADD, s.dev_lengths_p, s.xdesc, px, s.hdesc, ph, s.ydesc,
            py, s.w_bytes, pdw, ws, wsp or None, s.rs_bytes, rptr or None,
        )  # fmt: skip


def _block(request: RNN, dtype: Any) -> RNNBlock:
    """The calling thread's :class:`RNNBlock` of *request*'s network (its descriptors and
    per-shape state; never its reserve space). A block is not thread-safe: one per thread."""
    try:
        blocks = _local.blocks
    except AttributeError:
        blocks = _local.blocks = {}
    tf32 = _config.config.allow_tf32  # the block's default math reads it when it is made
    key = (
        request.mode,
        request.hidden_size,
        request.num_layers,
        request.bidirectional,
        request.proj_size,
        request.batch_first,
        np.dtype(dtype).name,
        tf32,
    )
    block: RNNBlock | None = blocks.get(key)
    if block is None:
        block = blocks[key] = RNNBlock(
            np.dtype(dtype).name,
            request.hidden_size,
            request.num_layers,
            request.mode,
            direction_mode="bidirectional" if request.bidirectional else "unidirectional",
            proj_size=request.proj_size,
            batch_first=request.batch_first,
            seed=0,  # no dropout: the seed is never used
        )
    return block


def reserve_size(request: RNN, x_shape: tuple[int, ...], dtype: Any) -> int:
    """Bytes of cuDNN's reserve space for *request* on x of *x_shape* (the current device's
    ``cudnnGetRNNTempSpaceSizes``; the CPU tests replace this function)."""
    block = _block(request, dtype)
    return int(block.temp_space_sizes(x_shape, request.seq_lengths)[2])


def _split(request: RNN, operands: tuple[Any, ...]) -> tuple[Any, Any, Any, Any]:
    if request.lstm:
        x, h0, c0, w = operands
        return x, h0, c0, w
    x, h0, w = operands
    return x, h0, None, w


def _primal(request: RNN, _capture_on: bool, *operands: Any) -> tuple[Any, ...]:
    return tuple(_ops.call(request, *operands))


def _forward(request: RNN, _capture_on: bool, *operands: Any) -> tuple[tuple[Any, ...], Any]:
    x = operands[0]
    for d in x.shape:
        if not _request.known(d):
            raise ValueError(
                f"{_FUNC}: differentiating needs x's concrete shape (cuDNN sizes the reserve "
                f"space from T and N); got {tuple(x.shape)}"
            )
    nbytes = reserve_size(request, tuple(int(d) for d in x.shape), x.dtype)
    train = dataclasses.replace(request, training=True, reserve=nbytes)
    *outs, reserve = _ops.call(train, *operands)
    return tuple(outs), (operands, outs[0], reserve)


def _backward(
    request: RNN, _capture_on: bool, residuals: Any, cotangents: tuple[Any, ...]
) -> tuple[Any, ...]:
    operands, y, reserve = residuals
    fields = {f.name: getattr(request, f.name) for f in dataclasses.fields(RNN)}
    fields.update(training=True, reserve=int(reserve.shape[-1]))  # the size the forward had
    grad = RNNGrad(**fields)
    x, h0, c0, w = _split(grad, operands)
    dy, dh, *dc = cotangents
    ops = (x, h0, c0, w, y, dy, dh, dc[0]) if grad.lstm else (x, h0, w, y, dy, dh)
    *grads, _reserve = _ops.call(grad, *ops, reserve)
    return tuple(grads)


# the command-buffer setting a static argument, as _ops.differentiable's: JAX caches a
# custom_vjp's traces by its static arguments (the primal here is inference, not the forward)
_rnn = jax.custom_vjp(_primal, nondiff_argnums=(0, 1))
_rnn.defvjp(_forward, _backward)


def _lengths(seq_lengths: Any, n: Any, t: Any) -> tuple[int, ...] | None:
    if seq_lengths is None:
        return None
    if isinstance(seq_lengths, jax.core.Tracer):
        raise TypeError(
            f"{_FUNC}: seq_lengths is a traced array; expected host ints (a tuple, list or "
            "numpy array): cuDNN reads the lengths on the host when it describes the data"
        )
    try:
        items = np.asarray(seq_lengths)
    except (TypeError, ValueError):  # ragged or unreadable
        items = None
    if items is None or items.ndim != 1 or items.dtype.kind not in "iu":
        raise TypeError(f"{_FUNC}: seq_lengths={seq_lengths!r}; expected a sequence of ints")
    lengths = tuple(int(v) for v in items)
    if _request.known(n) and len(lengths) != n:
        raise ValueError(f"{_FUNC}: seq_lengths has {len(lengths)} entries; x has N={n} sequences")
    if any(v < 1 or (_request.known(t) and v > t) for v in lengths):
        raise ValueError(f"{_FUNC}: seq_lengths={lengths}; expected each in [1, T={t}]")
    return lengths


def rnn(
    x: Any,
    h0: Any,
    c0: Any,
    weights: Any,
    *,
    mode: str,
    hidden_size: int,
    num_layers: int = 1,
    bidirectional: bool = False,
    proj_size: int | None = None,
    batch_first: bool = False,
    seq_lengths: Sequence[int] | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    """A multi-layer RNN, LSTM or GRU over a batch of sequences through cuDNN, differentiable in
    *x*, *h0*, *c0* and *weights* (cuDNN's backward data and backward weights).

    The cells are PyTorch's ``nn.RNN``/``nn.LSTM``/``nn.GRU`` (docs/rnn.md, "What it
    computes"); the weights are cuDNN's one packed buffer (:func:`rnn_pack_weights` builds it
    from PyTorch's parameters, :func:`rnn_unpack_weights` splits it).

    Parameters
    ----------
    x : jax.Array
        ``(T, N, input_size)``, or ``(N, T, input_size)`` with *batch_first*; float16, float32
        or float64 (float16 computes in float32).
    h0 : jax.Array or None
        ``(num_layers * num_directions, N, proj_size or hidden_size)`` (pseudo-layer order:
        layer 0 forward, layer 0 reverse, layer 1 forward, ...); None: zeros.
    c0 : jax.Array or None
        LSTM only: ``(num_layers * num_directions, N, hidden_size)``; None: zeros (must be None
        for the other modes).
    weights : jax.Array
        1-D, :func:`rnn_weight_size` elements of x's dtype, in cuDNN's layout.
    mode : {'rnn_relu', 'rnn_tanh', 'lstm', 'gru'}
    hidden_size, num_layers : int
        >= 1.
    bidirectional : bool
    proj_size : int, optional
        LSTM only, ``< hidden_size``: PyTorch's ``proj_size``.
    batch_first : bool
        x and y are ``(N, T, features)``; the states stay ``(layers * directions, N, ...)``.
    seq_lengths : sequence of int, optional
        Static host ints, one per sequence, each in ``[1, T]``, any order: x is padded past
        them, y is zero there and the final states are each sequence's own. Default all ``T``.

    Returns
    -------
    y : jax.Array
        ``(T, N, num_directions * (proj_size or hidden_size))`` (``(N, T, ...)`` with
        *batch_first*).
    h : jax.Array
        The final hidden states, h0's shape.
    c : jax.Array or None
        The final cell states (LSTM), else None.

    Raises
    ------
    TypeError, ValueError
        At trace time, before any C call: a mode not above, non-int sizes, non-bool flags,
        *proj_size* outside ``[1, hidden_size)`` or for a non-LSTM, a dtype cuDNN's RNNs do
        not take (bfloat16), mismatched shapes or dtypes of *h0*, *c0* or *weights*,
        *c0* for a non-LSTM, *seq_lengths* traced, not one per sequence or outside
        ``[1, T]``; differentiating with symbolic dims.

    Notes
    -----
    Under ``vmap`` the call runs once per example (x's and the states' batch dims differ).
    A differentiated call runs cuDNN's training forward and keeps its reserve space (a
    ``uint8`` buffer) for the backward; tracing it asks cuDNN for the size on the current
    device, so it needs a GPU. Dropout is not offered.
    """
    cfg = _config_of(_FUNC, mode, hidden_size, num_layers, bidirectional, proj_size)
    batch_first = _bool(batch_first, "batch_first", _FUNC)
    x = jnp.asarray(x)
    if x.ndim != 3:
        order = "(N, T, input_size)" if batch_first else "(T, N, input_size)"
        raise ValueError(f"{_FUNC}: x has shape {x.shape}; expected 3 dims {order}")
    t, n = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    lengths = _lengths(seq_lengths, n, t)
    request = RNN(*cfg, batch_first, lengths, False, 0)
    if c0 is not None and not request.lstm:
        raise TypeError(f"{_FUNC}: c0 is only for mode='lstm', not {mode!r}; pass None")
    h0 = jnp.zeros((request.states, n, request.out_size), x.dtype) if h0 is None else h0
    operands: list[Any] = [x, jnp.asarray(h0)]
    if request.lstm:
        c0 = jnp.zeros((request.states, n, request.hidden_size), x.dtype) if c0 is None else c0
        operands.append(jnp.asarray(c0))
    operands.append(jnp.asarray(weights))
    request.check(*_split(request, tuple(operands)))
    out = _rnn(request, _capture.enabled(), *operands)
    return (out[0], out[1], out[2] if request.lstm else None)


# -- the packed weights ----------------------------------------------------------------------
def _layout_of(
    func: str,
    mode: Any,
    input_size: Any,
    hidden_size: Any,
    num_layers: Any,
    bidirectional: Any,
    proj_size: Any,
) -> RNNLayout:
    cfg = _config_of(func, mode, hidden_size, num_layers, bidirectional, proj_size)
    inp = _int(input_size, "input_size", func)
    return RNN(*cfg, False, None, False, 0).layout(inp)


def rnn_weight_size(
    mode: str,
    input_size: int,
    hidden_size: int,
    num_layers: int = 1,
    bidirectional: bool = False,
    proj_size: int | None = None,
) -> int:
    """Elements of cuDNN's packed weight buffer of the network (``cudnnGetRNNWeightSpaceSize``
    divided by the element size, computed without a GPU from cuDNN 9's layout)."""
    func = "pycudnn.jax.rnn_weight_size"
    return _layout_of(
        func, mode, input_size, hidden_size, num_layers, bidirectional, proj_size
    ).size


def rnn_pack_weights(
    params: Mapping[str, Any],
    *,
    mode: str,
    input_size: int,
    hidden_size: int,
    num_layers: int = 1,
    bidirectional: bool = False,
    proj_size: int | None = None,
) -> jax.Array:
    """cuDNN's packed weight buffer from PyTorch's parameters, as JAX arrays (jittable and
    differentiable: a concatenation of slices).

    Parameters
    ----------
    params : mapping of str to array
        PyTorch's names and shapes (``nn.LSTM(...).state_dict()``'s): per layer ``k`` and
        direction (``_reverse`` suffix for the reverse one) ``weight_ih_l{k}`` ``(G * H,
        in)``, ``weight_hh_l{k}`` ``(G * H, proj_size or H)``, ``bias_ih_l{k}`` and
        ``bias_hh_l{k}`` ``(G * H,)``, and with *proj_size* ``weight_hr_l{k}``
        ``(proj_size, H)``; the ``G`` gates stacked in PyTorch's order -- LSTM ``i, f, g, o``,
        GRU ``r, z, n`` -- which is cuDNN's. **Flax**: a cell's per-gate ``Dense`` kernels are
        ``(in, H)``; ``weight_ih`` is ``concatenate([k_i.T, k_f.T, k_g.T, k_o.T])`` of the input
        ``Dense`` layers (``ii, if, ig, io``; GRU ``ir, iz, in``), ``weight_hh`` likewise of the
        hidden ones, and a bias Flax does not have is zeros (Flax's GRU ``hn`` bias is
        ``bias_hh``'s ``n`` block, inside the reset product as in cuDNN).
    mode, input_size, hidden_size, num_layers, bidirectional, proj_size
        The network (as :func:`rnn`'s).

    Returns
    -------
    jax.Array
        1-D, :func:`rnn_weight_size` elements, the parameters' (promoted) dtype.

    Raises
    ------
    ValueError
        A parameter missing, of another shape, or not one of the network's (named).
    """
    func = "pycudnn.jax.rnn_pack_weights"
    layout = _layout_of(func, mode, input_size, hidden_size, num_layers, bidirectional, proj_size)
    if not isinstance(params, Mapping):
        raise TypeError(f"{func}: params is a {type(params).__name__}; expected a mapping")
    parts = torch_params(layout)
    extra = sorted(str(k) for k in params if k not in parts)
    if extra:
        raise ValueError(f"{func}: unexpected parameters {extra}; expected {sorted(parts)}")
    pieces: list[tuple[int, Any]] = []
    for name, slots in parts.items():
        if name not in params:
            raise ValueError(f"{func}: parameter {name!r} is missing; expected {sorted(parts)}")
        a = jnp.asarray(params[name])
        shape = torch_shape(layout, name, slots)
        if tuple(a.shape) != shape:
            raise ValueError(f"{func}: {name} has shape {tuple(a.shape)}; expected {shape}")
        for s, row in slots:
            pieces.append((s.offset, a[row : row + s.shape[0]].reshape(-1)))
    pieces.sort(key=lambda p: p[0])
    return jnp.concatenate([p for _o, p in pieces])


def rnn_unpack_weights(
    weights: Any,
    *,
    mode: str,
    input_size: int,
    hidden_size: int,
    num_layers: int = 1,
    bidirectional: bool = False,
    proj_size: int | None = None,
) -> dict[str, jax.Array]:
    """PyTorch's parameters (names and shapes as :func:`rnn_pack_weights` takes them) from
    cuDNN's packed buffer (or its gradient), as JAX arrays (slices: jittable and
    differentiable). The inverse of :func:`rnn_pack_weights`."""
    func = "pycudnn.jax.rnn_unpack_weights"
    layout = _layout_of(func, mode, input_size, hidden_size, num_layers, bidirectional, proj_size)
    w = jnp.asarray(weights)
    if w.shape != (layout.size,):
        raise ValueError(
            f"{func}: weights has shape {w.shape}; expected ({layout.size},) (rnn_weight_size)"
        )
    out: dict[str, jax.Array] = {}
    for name, slots in torch_params(layout).items():
        blocks = [w[s.offset : s.offset + s.size].reshape(s.shape) for s, _row in slots]
        out[name] = blocks[0] if len(blocks) == 1 else jnp.concatenate(blocks)
    return out


#: Flax's cell parameter names per mode: (input-side Dense layers, hidden-side ones), in the
#: gate order of cuDNN (flax.linen's LSTMCell/OptimizedLSTMCell, GRUCell, SimpleCell)
_FLAX = {
    "lstm": (("ii", "if", "ig", "io"), ("hi", "hf", "hg", "ho")),
    "gru": (("ir", "iz", "in"), ("hr", "hz", "hn")),
    "rnn_tanh": (("i",), ("h",)),
    "rnn_relu": (("i",), ("h",)),
}


def rnn_weights_from_flax(
    cells: Sequence[Mapping[str, Any]],
    *,
    mode: str,
    input_size: int,
    hidden_size: int,
    num_layers: int = 1,
    bidirectional: bool = False,
) -> jax.Array:
    """cuDNN's packed weight buffer from Flax cells' parameters (jittable, differentiable).

    Parameters
    ----------
    cells : sequence of mapping
        One ``params`` dict per pseudo-layer (layer 0 forward, layer 0 reverse, layer 1
        forward, ...) of ``flax.linen.LSTMCell``/``OptimizedLSTMCell`` (``ii, if, ig, io`` and
        ``hi, hf, hg, ho``), ``GRUCell`` (``ir, iz, in`` and ``hr, hz, hn``) or ``SimpleCell``
        (``i`` and ``h``; ``rnn_relu`` is a SimpleCell with ``activation_fn=relu``): each a
        ``{"kernel": (in, H)[, "bias": (H,)]}``. A bias Flax's cell has not is zero in cuDNN's
        buffer (the LSTM's input side, the GRU's ``hr``/``hz``, SimpleCell's ``h``); the cells'
        equations are then cuDNN's. Flax's LSTM carry is ``(c, h)``; :func:`rnn` takes
        ``h0, c0``.
    mode, input_size, hidden_size, num_layers, bidirectional
        The network (no ``proj_size``: Flax's cells have none).

    Returns
    -------
    jax.Array
        1-D, :func:`rnn_weight_size` elements.

    Raises
    ------
    ValueError
        A cell count, a layer name or a shape not the network's (named).
    """
    func = "pycudnn.jax.rnn_weights_from_flax"
    layout = _layout_of(func, mode, input_size, hidden_size, num_layers, bidirectional, None)
    if isinstance(cells, Mapping) or not isinstance(cells, Sequence):
        raise TypeError(
            f"{func}: cells is a {type(cells).__name__}; expected a sequence of per-pseudo-layer "
            "params dicts"
        )
    if len(cells) != layout.num_pseudo_layers:
        raise ValueError(
            f"{func}: {len(cells)} cells; expected {layout.num_pseudo_layers} (num_layers * "
            "num_directions, in pseudo-layer order)"
        )
    params: dict[str, Any] = {}
    h = layout.hidden_size
    for pl, cell in enumerate(cells):
        layer, direction = divmod(pl, layout.num_directions)
        sfx = f"_l{layer}" + ("_reverse" if direction else "")
        for side, names in zip(("ih", "hh"), _FLAX[mode], strict=True):
            kernels, biases = [], []
            for name in names:
                dense = cell.get(name) if isinstance(cell, Mapping) else None
                if not isinstance(dense, Mapping) or "kernel" not in dense:
                    raise ValueError(
                        f"{func}: cells[{pl}] has no {name!r} Dense parameters (a dict with "
                        f"'kernel'); expected {list(_FLAX[mode][0] + _FLAX[mode][1])}"
                    )
                k = jnp.asarray(dense["kernel"])
                if k.ndim != 2 or k.shape[1] != h:
                    raise ValueError(
                        f"{func}: cells[{pl}][{name!r}]['kernel'] has shape {k.shape}; "
                        f"expected (inputs, {h})"
                    )
                kernels.append(k.T)
                b = dense.get("bias")
                biases.append(jnp.zeros((h,), k.dtype) if b is None else jnp.asarray(b))
            params[f"weight_{side}{sfx}"] = jnp.concatenate(kernels)
            params[f"bias_{side}{sfx}"] = jnp.concatenate(biases)
    return rnn_pack_weights(
        params,
        mode=mode,
        input_size=input_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
        bidirectional=bidirectional,
    )
