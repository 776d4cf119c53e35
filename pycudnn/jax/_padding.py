"""Asymmetric padding on cuDNN's symmetric padding (imports JAX): cuDNN's convolution and
pooling pad both sides of a spatial dimension alike, so ``(lo, hi)`` pairs give cuDNN the smaller
side of each and pad the input by the difference first (``jnp.pad``: one copy of the input per
call, its gradient a slice). ``lax.conv_general_dilated``'s ``'SAME'`` with a stride or an even
kernel, Flax's default, is such padding."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

from . import _request

__all__ = ["pairs", "split"]


def pairs(padding: Any, nd: int, func: str) -> tuple[tuple[int, int], ...]:
    """``(lo, hi)`` per spatial dim from an int, *nd* ints or *nd* ``(lo, hi)`` pairs (each >= 0),
    a ``TypeError``/``ValueError`` naming *func*, the value and what was expected otherwise."""
    if isinstance(padding, Sequence) and any(isinstance(p, Sequence) for p in padding):
        items = [tuple(p) if isinstance(p, Sequence) else None for p in padding]
        if len(items) != nd or any(p is None or len(p) != 2 for p in items):
            raise ValueError(
                f"{func}: padding={padding!r}; expected {nd} (lo, hi) pairs, one per spatial dim"
            )
        try:
            flat = _request.ints([v for p in items for v in p], 2 * nd, "padding", func, 0)
        except (TypeError, ValueError) as exc:
            raise type(exc)(
                f"{func}: padding={padding!r}; expected {nd} (lo, hi) pairs of ints >= 0"
            ) from None
        return tuple(zip(flat[0::2], flat[1::2], strict=True))
    return tuple((p, p) for p in _request.ints(padding, nd, "padding", func, 0))


def split(
    x: Any, pads: Sequence[tuple[int, int]], channels_last: bool, value: float = 0.0
) -> tuple[Any, tuple[int, ...]]:
    """``(x, symmetric)``: *x* padded with *value* by what cuDNN's symmetric padding leaves of
    *pads* (*x* itself where the sides are equal), and the symmetric padding per dim."""
    sym = tuple(min(lo, hi) for lo, hi in pads)
    extra = [(lo - m, hi - m) for (lo, hi), m in zip(pads, sym, strict=True)]
    if all(e == (0, 0) for e in extra):
        return x, sym
    rows = [(0, 0), *extra, (0, 0)] if channels_last else [(0, 0), (0, 0), *extra]
    return jnp.pad(x, rows, constant_values=value), sym
