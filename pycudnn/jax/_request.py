"""The static options of one FFI call of a ``pycudnn.jax`` operation: a frozen request.

Every operation of ``pycudnn.jax`` reaches XLA as one custom call of its family's FFI target
(``pycudnn_jax_<family>``) carrying **one string attribute**, ``op``: the request's text
(:meth:`Request.encode`, a Python literal of the request's class name and its field values).
One attribute rather than one per option because the per-call path keys its bound launches on
it: reading one string costs a fraction of decoding several attributes, and a text compares by
content, so nothing depends on where XLA keeps it. The text carries no shapes (they come from
the buffers at run time, so a shape-polymorphic export runs as any other).

A request class says, for the trace side (:mod:`._ops`): its family, how vmap may fold a batch
into its operands (:meth:`Request.batch_operands`, :attr:`Request.batch_results`), and its
results' shapes and dtypes (:meth:`Request.results`, which also checks the operands: clear
Python errors at trace time, before any C call); for the run side (:mod:`._bound`): the one
pycudnn call that computes it on XLA's buffers (:meth:`Request.run`).

Stdlib and numpy only (no JAX).
"""

from __future__ import annotations

import ast
import dataclasses
import math
import threading
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

__all__ = [
    "FLOATS",
    "Request",
    "check_dtype",
    "decode",
    "ints",
    "known",
    "real",
]

#: the floating dtypes cuDNN computes (bfloat16: ml_dtypes', as JAX has it)
FLOATS = ("float16", "bfloat16", "float32", "float64")

_CLASSES: dict[str, type[Request]] = {}
_DECODED: dict[bytes, Request] = {}
_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True)
class Request:
    """The static options of one FFI call (a frozen dataclass of plain values).

    Subclasses set :attr:`family` (the FFI target ``pycudnn_jax_<family>``), define their
    fields (``str``, ``int``, ``float``, ``bool``, ``None`` or tuples of them), validate them
    in ``__post_init__`` and implement :meth:`results` and :meth:`run`.
    """

    #: the operation family: one FFI target per family
    family: ClassVar[str] = ""
    #: whether every result has the operands' leading batch dim (False: a parameter gradient
    #: is among them, so a vmapped call runs example by example)
    batch_results: ClassVar[bool] = True
    #: ``(operand index, result index)`` pairs: the result is written in the operand's buffer
    #: (``ffi_call``'s ``input_output_aliases``; XLA copies the operand first when it is still
    #: read elsewhere), for a computation that updates an operand in place (an RNN's reserve)
    aliases: ClassVar[tuple[tuple[int, int], ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        with _LOCK:
            other = _CLASSES.setdefault(cls.__name__, cls)
        if other is not cls:
            raise TypeError(f"two request classes named {cls.__name__}: {other} and {cls}")

    def encode(self) -> str:
        """The request as the text of the call's ``op`` attribute (:func:`decode` reads it)."""
        values = tuple(getattr(self, f.name) for f in dataclasses.fields(self))
        return repr((type(self).__name__, values))

    def batch_operands(self) -> tuple[bool, ...]:
        """Per operand: True when its leading dim is a batch dim (a vmapped batch folds into
        it), False for a parameter (its batch cannot fold)."""
        raise NotImplementedError

    def results(self, *operands: Any) -> tuple[tuple[tuple[Any, ...], Any], ...]:
        """``(shape, dtype)`` of each result for operands with ``.shape`` and ``.dtype``
        (JAX's abstract values at trace time); checks the operands first (``TypeError``,
        ``ValueError`` naming the argument, its value and what was expected)."""
        raise NotImplementedError

    def run(self, args: Sequence[Any], rets: Sequence[Any], stream: int) -> None:
        """Compute the results into *rets* from *args* (XLA's device buffers) on *stream*:
        one call of a pycudnn high-level function, every output given."""
        raise NotImplementedError


def decode(text: bytes) -> Request:
    """The request of an ``op`` attribute's text, remembered (a text decodes once per process;
    an executable exported and run in another process decodes here too)."""
    request = _DECODED.get(text)
    if request is not None:
        return request
    try:
        name, values = ast.literal_eval(text.decode())
        request = _CLASSES[name](*values)
    except (ValueError, SyntaxError, TypeError, KeyError, UnicodeDecodeError) as exc:
        known_names = sorted(_CLASSES)
        raise ValueError(
            f"pycudnn.jax: the op attribute {text[:200]!r} is no request of this pycudnn "
            f"({type(exc).__name__}: {exc}); known: {known_names}"
        ) from None
    _DECODED[text] = request
    return request


# -- checks shared by the requests (trace time) ----------------------------------------------------
def known(*dims: Any) -> bool:
    """Whether every dim is a plain int (not a symbolic dim of a shape-polymorphic trace)."""
    return all(isinstance(d, (int, np.integer)) for d in dims)


def check_dtype(func: str, name: str, x: Any, allowed: Sequence[str] = FLOATS) -> np.dtype:
    """*x*'s dtype, which must be one of *allowed* (a ``TypeError`` naming it otherwise)."""
    dt = np.dtype(x.dtype)
    if dt.name not in allowed:
        raise TypeError(f"{func}: {name} has dtype {dt.name}; expected one of {tuple(allowed)}")
    return dt


def ints(value: Any, n: int, name: str, func: str, lo: int) -> tuple[int, ...]:
    """*value* (an int, or a sequence of *n* ints) as a tuple of *n* ints >= *lo*."""
    items = (value,) * n if isinstance(value, (int, np.integer)) else value
    try:
        if isinstance(items, (str, bytes)) or any(isinstance(v, bool) for v in items):
            raise TypeError
        out = tuple(int(v.__index__()) for v in items)
    except (TypeError, AttributeError):
        raise TypeError(
            f"{func}: {name}={value!r}; expected an int or a sequence of {n} ints"
        ) from None
    if len(out) != n:
        raise ValueError(f"{func}: {name}={value!r} has {len(out)} values; expected {n}")
    if any(v < lo for v in out):
        raise ValueError(f"{func}: {name}={value!r}; expected values >= {lo}")
    return out


def real(value: Any, name: str, func: str) -> float:
    """*value* as a finite float (a ``TypeError``/``ValueError`` naming it otherwise)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{func}: {name}={value!r}; expected a real number")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{func}: {name}={value!r}; expected a finite number")
    return v
