"""The attention's scalar options checked: the one place for the causal flag, the scale, the
dropout probability and its seed, and the given gradients of a backward (before any C call)."""

from __future__ import annotations

import math
import random
from typing import Any

from ..._config import parse_bool
from .. import _checks

__all__ = ["needs_seed", "options", "out_grads", "probability", "seed"]


def probability(func: str, dropout_p: Any) -> float:
    """*dropout_p* as a float in [0, 1) before the call key (any real: a NumPy float or a
    ``Fraction`` is as valid as a float, and decides whether the call needs a seed)."""
    if dropout_p.__class__ is float and 0.0 <= dropout_p < 1.0:
        return dropout_p
    return _checks.real(dropout_p, "dropout_p", func, lo=0.0, hi=1.0, hi_open=True)


def seed(func: str, value: Any, p: float) -> int | None:
    """The Philox seed of a call with dropout (*p*): the given one checked, or a random one;
    None without dropout."""
    if p == 0.0:
        return None
    if value is None:
        return random.getrandbits(63)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise ValueError(f"{func}: seed must be an int in [0, 2**63), got {value!r}")
    return value


def needs_seed(func: str, p: float, value: Any) -> None:
    """A backward with dropout regenerates the forward's mask: it needs the forward's seed."""
    if p and value is None:
        raise ValueError(
            f"{func}: dropout_p={p} needs the forward's seed (seed=None would draw another mask)"
        )


def out_grads(func: str, given: Any, bias_grad: Any, sink_grad: Any) -> tuple:
    """*given* (``out_grads=``) as a tuple of three arrays, or ``()`` when not given."""
    if given is None:
        return ()
    if not isinstance(given, (tuple, list)) or len(given) != 3:
        raise TypeError(f"{func}: out_grads must be None or (dq, dk, dv), got {given!r}")
    if bias_grad is not False or sink_grad is not False:
        raise ValueError(f"{func}: out_grads is dq, dk, dv only: not with bias_grad/sink_grad")
    return tuple(given)


def options(func: str, is_causal: Any, scale: Any, dropout_p: Any, d: int) -> tuple:
    """``(causal, scale, p)``: the causal flag, the scale (default ``1 / sqrt(D)`` of the head
    dim *d*) and the dropout probability, checked."""
    causal = parse_bool(is_causal, func, "is_causal")
    sc = 1.0 / math.sqrt(d) if scale is None else _checks.real(scale, "scale", func)
    p = _checks.real(dropout_p, "dropout_p", func, lo=0.0, hi=1.0, hi_open=True)
    return causal, sc, p
