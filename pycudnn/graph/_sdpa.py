"""Removed: the composite attention graphs are :mod:`pycudnn.graph.nodes.sdpa`. This alias stays
until ``highlevel/sdpa.py`` calls ``Graph.sdpa_backward`` (issue 24)."""

from __future__ import annotations

from typing import Any

from .nodes import sdpa

__all__ = ["backward"]


def backward(
    g: Any,
    q: Any,
    k: Any,
    v: Any,
    o: Any,
    do: Any,
    stats: Any,
    *options: Any,
    deterministic: bool = False,
) -> tuple:
    """The old spelling of ``g.sdpa_backward``: *options* are ``(attn_scale, causal, seq_len_q,
    seq_len_kv, dropout, name)``."""
    attn_scale, causal, seq_q, seq_kv, dropout, name = options
    opts = sdpa.SdpaOptions(attn_scale, causal, seq_q, seq_kv, dropout)
    return sdpa.backward(g, (q, k, v), (o, do, stats), opts, name, deterministic)
