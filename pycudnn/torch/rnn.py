"""Recurrent networks (imports torch): ``RNN``, ``LSTM`` and ``GRU`` on
:class:`~pycudnn.RNNBlock` (``apply`` / ``backward``), the ``autograd.Function`` over them, and
:func:`rnn_flat_weights`, which packs a module's parameters into cuDNN's weight buffer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from ..highlevel import RNNBlock
from ..highlevel.rnn_layout import GATES, PROJ_ID, RNNLayout
from ._compile import compiling, dynamo_loaded, eager_only
from ._module import Converted, float_params, state
from ._runtime import NO_BF16, cuda_ok, ready, stream_of

__all__ = ["GRU", "LSTM", "RNN", "RNNFn", "RNNRun", "hy_shape", "rnn_flat_weights", "rnn_forward"]


class RNNRun:
    """What one RNN forward hands its backward: the block, whether it trained, its generation
    (the block's reserve space holds the last training forward's intermediates)."""

    __slots__ = ("block", "dropout", "gen", "lstm", "track", "training")

    def __init__(self, block: RNNBlock, track: dict, training: bool, lstm: bool, dropout: float):
        self.block, self.track, self.training, self.lstm = block, track, training, lstm
        self.dropout = dropout
        self.gen = 0


class RNNFn(torch.autograd.Function):
    """``RNNBlock.apply`` (training mode when a gradient is wanted) and ``RNNBlock.backward``."""

    @staticmethod
    def forward(ctx, run, x, hx, cx, w):
        ready()
        block = run.block
        y, hy, cy = _rnn_outputs(block, x, run.lstm)
        outs = (y, hy, cy) if run.lstm else (y, hy)
        block.apply(w, x, hx, cx, training=run.training, out=outs, stream=stream_of(x))
        if run.training:
            gen = run.track["gen"] = run.track.get("gen", 0) + 1
            run.track[id(block)] = run.gen = gen
        ctx.run = run
        ctx.save_for_backward(x, hx, cx, w, y)
        ctx.set_materialize_grads(False)
        if run.lstm:
            return y, hy, cy
        return y, hy, None

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dhy, dcy):
        run = ctx.run
        x, hx, cx, w, y = ctx.saved_tensors
        if not run.training:
            raise RuntimeError(
                "pycudnn.torch: this RNN forward ran in inference mode (no gradient was needed "
                "then); cuDNN's RNN backward needs a training-mode forward"
            )
        block = run.block
        s = stream_of(x)
        if run.track.get(id(block)) != run.gen:
            # another training forward of this module ran since, or a backward consumed the
            # reserve space (cuDNN's backward updates it): recompute it
            if run.dropout:
                raise RuntimeError(
                    "pycudnn.torch: the RNN module ran another training forward (or a backward) "
                    "since this forward; with dropout > 0 its dropout mask cannot be recomputed "
                    "(run one backward per forward, before the next forward, or use dropout=0)"
                )
            scratch = _rnn_outputs(block, x, run.lstm)
            block.apply(
                w, x, hx, cx, training=True, out=scratch if run.lstm else scratch[:2], stream=s
            )
            run.track[id(block)] = run.gen
        dy = torch.zeros_like(y) if dy is None else dy.contiguous()
        dhy = None if dhy is None else dhy.contiguous()
        dcy = None if dcy is None or not run.lstm else dcy.contiguous()
        dx = torch.empty_like(x)
        dhx = torch.empty(hy_shape(x, block), dtype=x.dtype, device=x.device)
        outs: tuple = (dx, dhx)
        if run.lstm:
            dcx = torch.empty(
                (dhx.shape[0], dhx.shape[1], block.hidden_size), dtype=x.dtype, device=x.device
            )
            outs = (dx, dhx, dcx)
        need_w = ctx.needs_input_grad[4]
        dw = torch.empty_like(w) if need_w else None
        block.backward(w, x, hx, cx, y, dy, dhy, dcy, dw=dw, weights=need_w, out=outs, stream=s)
        run.track[id(block)] = None  # consumed: a second backward (retain_graph) recomputes
        dh = outs[1] if hx is not None else None
        dc = outs[2] if run.lstm and cx is not None else None
        return None, dx, dh, dc, dw


def hy_shape(x: torch.Tensor, block: RNNBlock) -> tuple[int, int, int]:
    """``(num_layers * num_directions, N, proj_size or hidden_size)`` for input *x*."""
    n = x.shape[0] if block.batch_first else x.shape[1]
    return (block.num_layers * block.num_directions, n, block.out_size)


def _rnn_outputs(block: RNNBlock, x: torch.Tensor, lstm: bool) -> tuple:
    """New ``(y, hy, cy)`` tensors (cy None unless LSTM)."""
    t, n = (x.shape[1], x.shape[0]) if block.batch_first else (x.shape[0], x.shape[1])
    ysh = (n, t, block.output_size) if block.batch_first else (t, n, block.output_size)
    kw = {"dtype": x.dtype, "device": x.device}
    hsh = hy_shape(x, block)
    y = torch.empty(ysh, **kw)
    hy = torch.empty(hsh, **kw)
    cy = torch.empty((hsh[0], n, block.hidden_size), **kw) if lstm else None
    return y, hy, cy


_RNN_MODES = {"LSTM": "lstm", "GRU": "gru", "RNN_TANH": "rnn_tanh", "RNN_RELU": "rnn_relu"}


def _flat_pieces(layout: RNNLayout) -> list[tuple[str, int, int]]:
    """``(torch parameter name, first row, rows)`` in the order of cuDNN's weight buffer,
    adjacent row blocks of one parameter merged. Raises ``ValueError`` when the buffer is not
    these pieces back to back (a layout the adapter does not know)."""
    ngates = len(GATES[layout.mode])
    pieces: list[list] = []
    end = 0
    for s in sorted(layout.slots, key=lambda s: s.offset):
        if s.offset != end:
            raise ValueError(f"the RNN weight buffer has a gap at element {end} ({layout!r})")
        end = s.offset + s.size
        layer, direction = divmod(s.pseudo_layer, layout.num_directions)
        sfx = f"_l{layer}" + ("_reverse" if direction else "")
        if s.lin_id == PROJ_ID:
            name, row = f"weight_hr{sfx}", 0
        else:
            side, gate = divmod(s.lin_id, ngates)
            name = ("weight" if s.kind == "weight" else "bias") + ("_ih", "_hh")[side] + sfx
            row = gate * layout.hidden_size
        rows = s.shape[0]
        last = pieces[-1] if pieces else None
        if last is not None and last[0] == name and last[1] + last[2] == row:
            last[2] += rows
        else:
            pieces.append([name, row, rows])
    if end != layout.size:
        raise ValueError(f"the RNN weight buffer's slots end at {end}, not {layout.size}")
    return [(n, r, k) for n, r, k in pieces]


def rnn_flat_weights(module: nn.RNNBase, layout: RNNLayout) -> torch.Tensor:
    """cuDNN's flat weight buffer of an RNN module, on its parameters' device.

    The device-side, differentiable counterpart of
    :func:`~pycudnn.highlevel.rnn_layout.rnn_weights_from_torch`: one ``torch.cat`` of the
    parameters (whole, or row blocks of them) in the buffer's order, so the buffer's gradient
    flows back to each parameter.

    Parameters
    ----------
    module : torch.nn.LSTM, torch.nn.GRU or torch.nn.RNN
        Its parameters under PyTorch's names (``weight_ih_l0``, ...).
    layout : RNNLayout
        ``RNNBlock.layout(input_size)`` (read from cuDNN) or ``canonical_rnn_layout(...)``.

    Returns
    -------
    torch.Tensor
        1-D, ``layout.size`` elements, the parameters' dtype.

    Raises
    ------
    ValueError
        The layout's slots do not cover the buffer back to back.
    """
    parts = []
    for name, row, rows in _flat_pieces(layout):
        p = getattr(module, name)
        parts.append((p if row == 0 and rows == p.shape[0] else p[row : row + rows]).reshape(-1))
    return torch.cat(parts)


def rnn_forward(m: nn.RNNBase, input: Any, hx: Any, fallback: Callable) -> Any:
    """*m*'s forward on :class:`~pycudnn.RNNBlock` for CUDA inputs it takes, else *fallback*."""
    lstm = m.mode == "LSTM"
    if isinstance(input, nn.utils.rnn.PackedSequence) or not cuda_ok(input, NO_BF16):
        return fallback(input, hx)
    w0 = m.weight_ih_l0
    if w0.dtype != input.dtype or not cuda_ok(w0, NO_BF16) or input.dim() not in (2, 3):
        return fallback(input, hx)
    batched = input.dim() == 3
    h0 = c0 = None
    if hx is not None:
        h0, c0 = hx if lstm else (hx, None)
    if not batched:
        input = input.unsqueeze(0 if m.batch_first else 1)
        h0 = None if h0 is None else h0.unsqueeze(1)
        c0 = None if c0 is None else c0.unsqueeze(1)
    dropout = float(m.dropout) if m.training and m.num_layers > 1 else 0.0
    st = state(m)
    key = ("block", input.dtype, dropout)
    block = st.get(key)
    if block is None:
        block = st[key] = RNNBlock(
            str(input.dtype)[6:],
            m.hidden_size,
            m.num_layers,
            _RNN_MODES[m.mode],
            direction_mode="bidirectional" if m.bidirectional else "unidirectional",
            dropout=dropout,
            proj_size=m.proj_size or None,
            batch_first=m.batch_first,
            bias=m.bias,
            seed=int(torch.randint(0, 2**62, (1,)).item()),
        )
    lkey = ("pieces", input.dtype, input.shape[-1], input.get_device())
    layout = st.get(lkey)
    if layout is None:
        layout = st[lkey] = block.layout(input.shape[-1], input.get_device())
    w = rnn_flat_weights(m, layout)
    x = input.contiguous()
    h0 = None if h0 is None else h0.contiguous()
    c0 = None if c0 is None else c0.contiguous()
    grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, h0, c0, w)
    )
    track = st.setdefault("track", {})
    run = RNNRun(block, track, grad or dropout > 0.0, lstm, dropout)
    y, hy, cy = RNNFn.apply(run, x, h0, c0, w)
    if not batched:
        y = y.squeeze(0 if m.batch_first else 1)
        hy = hy.squeeze(1)
        cy = None if cy is None else cy.squeeze(1)
    return (y, (hy, cy)) if lstm else (y, hy)


#: the RNNs' forward run by Python under torch.compile (dynamo breaks its graph around it)
_rnn_eager = eager_only(rnn_forward)


class _RNNRule(Converted):
    """The RNNs' rule: float16, float32 or float64 parameters (cuDNN's RNNs lack bfloat16)."""

    @classmethod
    def unsupported(cls, module: nn.Module) -> str | None:
        return float_params(module, NO_BF16)


class RNN(_RNNRule, nn.RNN):
    """``torch.nn.RNN`` (tanh or relu) on :class:`~pycudnn.RNNBlock`."""

    def forward(self, input: Any, hx: Any = None) -> Any:
        """As ``torch.nn.RNN.forward`` (PackedSequence input runs torch's)."""
        fwd = _rnn_eager if compiling() or dynamo_loaded() else rnn_forward
        return fwd(self, input, hx, super().forward)


class LSTM(_RNNRule, nn.LSTM):
    """``torch.nn.LSTM`` (``proj_size``, bidirectional, dropout) on :class:`~pycudnn.RNNBlock`."""

    def forward(self, input: Any, hx: Any = None) -> Any:
        """As ``torch.nn.LSTM.forward`` (PackedSequence input runs torch's)."""
        fwd = _rnn_eager if compiling() or dynamo_loaded() else rnn_forward
        return fwd(self, input, hx, super().forward)


class GRU(_RNNRule, nn.GRU):
    """``torch.nn.GRU`` on :class:`~pycudnn.RNNBlock`."""

    def forward(self, input: Any, hx: Any = None) -> Any:
        """As ``torch.nn.GRU.forward`` (PackedSequence input runs torch's)."""
        fwd = _rnn_eager if compiling() or dynamo_loaded() else rnn_forward
        return fwd(self, input, hx, super().forward)
