"""The attention request and what validation makes of it.

An :class:`AttentionRequest` is one call of an attention function exactly as the caller made it,
frozen: nothing in it is validated yet beyond what the call key needed. It covers the four
layouts (:data:`DENSE`, :data:`PADDED`, :data:`RAGGED`, :data:`PAGED`) and both directions. It
is built only on a call-cache miss: the hot path (:mod:`._key`) keys the call on flat tuples and
hands the request's fields to the call cache as a plain tuple (building the record there would
cost every call); :func:`._graph.build` makes the request of them, :func:`._operands.read`
validates it once into a :class:`Checked` call, and :mod:`._graph` builds the forward or the
backward graph and the call entry (:mod:`._calls`) from that.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ...enums import DataType
from .. import _operand

__all__ = ["ALL", "DENSE", "PADDED", "PAGED", "RAGGED", "TYPES", "AttentionRequest", "Checked"]

#: q, k, v ``(B, H, S, D)`` by strides
DENSE = "dense"
#: dense, with per-batch valid lengths (``seq_lens_q``/``seq_lens_kv``: padding masks)
PADDED = "padded"
#: packed ``(total tokens, H, D)`` sequences with cumulative lengths (cuDNN's ragged offsets)
RAGGED = "ragged"
#: q dense; k and v gathered from the blocks of a paged cache through page tables
PAGED = "paged"

#: what cuDNN's fused attention runs
TYPES = (DataType.HALF, DataType.BFLOAT16)
#: what the dtype check accepts before it names the fused attention's limit
ALL = (DataType.HALF, DataType.BFLOAT16, DataType.FLOAT, DataType.DOUBLE)


class AttentionRequest(NamedTuple):
    """One call as the caller made it (the hot path passes these fields in this order)."""

    func: str  # the public function (every error message starts with it)
    layout: str  # DENSE, PADDED, RAGGED or PAGED
    operands: tuple  # (q, k, v), or (q, k, v, out, dout, stats) for a backward
    options: tuple  # (attn_mask, is_causal, scale, dropout_p, masks: a _masks.Spec or None)
    training: bool  # a forward that also returns the statistics
    deterministic: bool  # a backward's deterministic variant
    lengths: tuple  # PADDED, PAGED: (seq_lens_q, seq_lens_kv); RAGGED: (B, maxes, roles, totals)
    tables: tuple  # PAGED: (page_table, page_table_v or None, max_seqlen_kv); else ()
    outs: tuple  # the outputs as given: (out, out_stats) / out_grads / (out,); () when none
    stream: Any

    @property
    def backward(self) -> bool:
        return len(self.operands) == 6

    @property
    def saved(self) -> tuple:
        """A backward's ``(out, dout, stats)`` (``()`` for a forward)."""
        return self.operands[3:]

    @property
    def attn_mask(self) -> Any:
        return self.options[0]

    @property
    def masks(self) -> Any:
        return self.options[4]


class Checked(NamedTuple):
    """A validated request (:func:`._operands.read`): everything the graph is built from."""

    req: AttentionRequest
    gq: _operand.Operand
    gk: _operand.Operand  # k (the k cache when PAGED)
    gv: _operand.Operand
    dt: DataType
    device: int
    causal: bool
    scale: float
    p: float  # the dropout probability
    saved: tuple  # a backward's checked (out, dout, stats); () for a forward
    lens: tuple  # PADDED, PAGED: the checked (q's, kv's) lengths (None: not given)
    tables: tuple  # PAGED: (k's table, v's table, max_seqlen_kv); else ()
    out: _operand.Operand | None  # RAGGED: the given output, checked before the upload
