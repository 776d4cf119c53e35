"""Dropout as a JAX function on ``dnn_dropout`` / ``dnn_dropout_grad`` (cuDNN's dropout), with
an explicit JAX key.

**The seed.** cuDNN's dropout draws from its own RNG (``cudnnSetDropoutDescriptor`` seeds it),
not JAX's: the key only chooses cuDNN's seed. ``jax.random.bits(key, (2,), uint32)`` is computed
inside the jitted program (so a new key at run time gives a new seed: nothing is fixed at trace
time) and passed to the call as a ``uint32[2]`` operand; the handler reads it from the device and
seeds cuDNN with ``bits[0] | bits[1] << 32``. The same key, shape and rate give the same mask on
the same GPU and cuDNN; the masks are not ``jax.random.bernoulli``'s and may differ between cuDNN
versions.

**Costs** (cuDNN's design): reading the seed copies 8 bytes to the host and waits for XLA's
stream (the call cannot be enqueued ahead of the work before it), and each call re-seeds cuDNN's
RNG states (``cudnnSetDropoutDescriptor``: about 20 ms on an H100 by the high level's notes).
The RNG states (a few MiB) are one :class:`~pycudnn.DropoutState` per executing thread and
device, kept for the process.

The mask (cuDNN's reserve space, ``dropout_mask_bytes`` bytes, 1 bit per element) is a ``uint8``
result of the forward and the residual of the backward (``dnn_dropout_grad(mask=, p=)``:
``dx = mask * dy / (1 - rate)``). Data: float16, float32, float64 (cuDNN's dropout has no
bfloat16), up to 8 dims, concrete shapes (the mask's size is a cuDNN query at trace time).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _cuda
from ..highlevel import DropoutState, dnn_dropout, dnn_dropout_grad, dropout_mask_bytes
from . import _ops, _request
from ._operands import device_of, views

__all__ = ["Dropout", "DropoutGrad", "dropout", "seed_of"]

_FUNC = "pycudnn.jax.dropout"
_TYPES = ("float16", "float32", "float64")
_local = threading.local()


def _state(device: int) -> DropoutState:
    """The executing thread's dropout state on *device* (its RNG states, re-seeded per call)."""
    states = getattr(_local, "states", None)
    if states is None:
        states = _local.states = {}
    st = states.get(device)
    if st is None:
        st = states[device] = DropoutState(0)
    return st


def seed_of(bits: Any) -> int:
    """cuDNN's seed from the two ``uint32`` words the key gave: ``bits[0] | bits[1] << 32``."""
    lo, hi = (int(b) for b in np.asarray(bits, np.uint32).reshape(2))
    return lo | hi << 32


def _read_seed(ptr: int, device: int, stream: int) -> int:
    """The seed operand's 8 bytes copied to the host on XLA's *stream*, waited for."""
    host = np.empty(2, np.uint32)
    rt = _cuda.runtime()
    kind = rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
    _cuda.check(rt.cudaMemcpyAsync(host.ctypes.data, ptr, 8, kind, stream), "cudaMemcpyAsync")
    _cuda.synchronize(stream, device)
    return seed_of(host)


@dataclasses.dataclass(frozen=True)
class Dropout(_request.Request):
    """The forward: operands ``x``, ``seed`` (``uint32[2]``); results ``y``, ``mask``
    (``uint8[dropout_mask_bytes]``)."""

    family = "dropout"
    # the mask's bytes for a folded batch need not be the examples' sum: run per example
    batch_results = False
    rate: float

    def __post_init__(self) -> None:
        rate = _request.real(self.rate, "rate", _FUNC)
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"{_FUNC}: rate={self.rate!r}; expected a number in [0, 1)")
        object.__setattr__(self, "rate", rate)

    def batch_operands(self) -> tuple[bool, ...]:
        return (False, False)

    def mask_bytes(self, x: Any) -> int:
        """The mask's bytes for *x* (checked first: dtype, rank, concrete dims)."""
        dt = _request.check_dtype(_FUNC, "x", x, _TYPES)
        shape = tuple(x.shape)
        if not 1 <= len(shape) <= 8:
            raise ValueError(f"{_FUNC}: x has shape {shape}; expected 1 to 8 dims (cuDNN's)")
        if not _request.known(*shape):
            raise ValueError(
                f"{_FUNC}: x has shape {shape}; dropout needs concrete dims (the mask's size is "
                "cuDNN's query for the shape)"
            )
        return dropout_mask_bytes(tuple(int(d) for d in shape), dt)

    def results(self, *operands: Any) -> _ops.Results:
        x, seed = operands
        nbytes = self.mask_bytes(x)
        if tuple(seed.shape) != (2,) or np.dtype(seed.dtype) != np.dtype("uint32"):
            raise TypeError(
                f"{_FUNC}: the seed is {seed.dtype}{list(seed.shape)}; expected uint32[2]"
            )
        return ((tuple(x.shape), np.dtype(x.dtype)), ((nbytes,), np.dtype("uint8")))

    def run(self, args: Sequence[Any], rets: Sequence[Any], stream: int) -> None:
        device = device_of((*args, *rets))
        seed = _read_seed(args[1].ptr, device, stream)
        x, y, mask = views((args[0], *rets), ())
        dnn_dropout(x, self.rate, seed, _state(device), out=y, out_mask=mask, stream=stream)


@dataclasses.dataclass(frozen=True)
class DropoutGrad(Dropout):
    """The backward: operands ``dy``, ``mask``; result ``dx``."""

    batch_results = True

    def batch_operands(self) -> tuple[bool, ...]:
        return (True, False)

    def results(self, *operands: Any) -> _ops.Results:
        dy, mask = operands
        nbytes = self.mask_bytes(dy)
        if tuple(mask.shape) != (nbytes,) or np.dtype(mask.dtype) != np.dtype("uint8"):
            raise ValueError(
                f"{_FUNC} gradient: the mask is {mask.dtype}{list(mask.shape)}; expected "
                f"uint8[{nbytes}]"
            )
        return ((tuple(dy.shape), np.dtype(dy.dtype)),)

    def run(self, args: Sequence[Any], rets: Sequence[Any], stream: int) -> None:
        dy, mask, dx = views(args, rets)
        st = _state(dy.device)  # lends its descriptor; the mask is the forward's
        dnn_dropout_grad(dy, st, mask=mask, p=self.rate, out=dx, stream=stream)


def _forward(request: Dropout, x: Any, seed: Any) -> tuple[Any, Any]:
    y, mask = _ops.call(request, x, seed)
    return y, (mask, seed)


def _backward(request: Dropout, residuals: Any, dy: Any) -> tuple:
    mask, seed = residuals
    (dx,) = _ops.call(DropoutGrad(request.rate), dy, mask)
    # the seed is integer data: its cotangent is float0 zeros
    return dx, np.zeros(seed.shape, jax.dtypes.float0)


_dropout = _ops.differentiable(_forward, _backward)


def _key(key: Any) -> jax.Array:
    """*key* checked: a typed JAX key of shape () or a legacy ``uint32[2]`` one."""
    if not isinstance(key, (jax.Array, np.ndarray)):
        raise TypeError(
            f"{_FUNC}: key={key!r}; expected a JAX key (jax.random.key(...), or a legacy "
            "uint32[2] jax.random.PRNGKey(...))"
        )
    k = jnp.asarray(key)
    typed = jax.dtypes.issubdtype(k.dtype, jax.dtypes.prng_key)
    if typed and k.shape != ():
        raise ValueError(f"{_FUNC}: key has shape {k.shape}; expected one key (shape ())")
    if not typed and (k.shape != (2,) or k.dtype != jnp.uint32):
        raise TypeError(
            f"{_FUNC}: key is {k.dtype}{list(k.shape)}; expected a JAX key "
            "(jax.random.key(...), or a legacy uint32[2] jax.random.PRNGKey(...))"
        )
    return k


def dropout(x: Any, rate: float, key: Any, *, deterministic: bool = False) -> jax.Array:
    """Dropout through cuDNN (``dnn_dropout``), differentiable in *x*: each element is zeroed
    with probability *rate*, the others are scaled by ``1 / (1 - rate)`` (rate as a float32 in
    cuDNN).

    Parameters
    ----------
    x : jax.Array
        1 to 8 dims, concrete shape; float16, float32 or float64.
    rate : float
        In ``[0, 1)``; 0 returns *x* as given (no call).
    key : jax.Array
        A JAX key; cuDNN's seed is derived from it inside the program
        (``jax.random.bits(key, (2,), uint32)``, ``bits[0] | bits[1] << 32``): the same key
        gives the same mask, another key another one. The bits are cuDNN's RNG's, not JAX's.
    deterministic : bool
        True returns *x* as given (inference; Flax's argument). Keyword only.

    Returns
    -------
    jax.Array
        x's shape and dtype.

    Raises
    ------
    TypeError, ValueError
        At trace time: a rate outside ``[0, 1)``, a non-bool *deterministic*, a key that is not
        a JAX key; unless *x* is returned as it is: a dtype cuDNN's dropout does not take
        (bfloat16), symbolic dims, more than 8 dims.

    Notes
    -----
    Each call reads the seed back to the host (a wait for XLA's stream) and re-seeds cuDNN's
    RNG states (milliseconds): see the module's notes. Under ``vmap`` each example runs its
    own call; an unbatched key gives every example the same mask (as ``jax.random`` does).
    """
    if not isinstance(deterministic, bool):
        raise TypeError(f"{_FUNC}: deterministic={deterministic!r}; expected a bool")
    request = Dropout(rate)
    k = _key(key)
    if deterministic or request.rate == 0.0:
        return x
    x = jnp.asarray(x)
    # the seed from the key inside the program (a new key at run time: a new seed); the data's
    # checks come first in the call's results(), then cuDNN's query of the mask's size
    return _dropout(request, x, jax.random.bits(k, (2,), jnp.uint32))
