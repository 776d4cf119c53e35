"""Dropout: Theano's ``dnn_dropout`` (cudnn.torch's ``Dropout``) as eager functions with a
reusable :class:`DropoutState`.

``dnn_dropout(x, p, seed, state)`` runs ``cudnnDropoutForward`` and returns ``(y, state)``;
``dnn_dropout_grad(dy, state)`` runs ``cudnnDropoutBackward`` with the mask of the state's last
forward call. The calls go through the shared call path (:mod:`._call`): a per-thread cache maps the
operands' layouts to ready calls (descriptors, reserve-space size), so a repeated call makes
one C call.

The state
---------
A :class:`DropoutState` owns what makes dropout stateful: the ``cudnnDropoutDescriptor_t``, the
RNG states buffer (``cudnnDropoutGetStatesSize``: 6.2 MiB on an H100) and the reserve space,
which holds the last mask (1 bit per element, grown when a larger input comes). Initialising
the RNG states (``cudnnSetDropoutDescriptor``) costs about 20 ms, so it happens once, at the
state's first use, on the device of that input; later calls continue the same random stream
(a new mask each call) with no re-initialisation, and a change of *p* only restores the
descriptor (``cudnnRestoreDropoutDescriptor``). The state holds device arrays and descriptors
that free themselves: :meth:`DropoutState.close` (or ``with``) frees them at once, otherwise
they go with the object.

Seeds
-----
* ``seed=None, state=None``: a new state with a fresh random seed (``secrets.randbits(63)``).
* ``seed=s, state=None``: a new state seeded with *s*. The same seed gives the same mask for
  the same input shape (and any layout: cuDNN's mask follows the logical element order).
* ``state=st`` alone: the next mask of *st*'s random stream (Theano's seed is likewise fixed
  when its states are made, and its dropout op then advances them).
* ``seed=s, state=st``: restart *st*'s stream from *s* (re-initialising its RNG, ~20 ms),
  unless *st* is unused since it was seeded with *s*: the mask is the one a new state seeded
  with *s* gives.

cuDNN scales the kept elements by ``1 / (1 - p)`` (with *p* as a float32) and zeroes the rest;
``p = 0`` copies. dtypes float16, float32, float64 (bfloat16 is ``NOT_SUPPORTED`` by cuDNN), any
layout, up to 8 dims; ``out=x`` (forward) and ``out=dy`` (backward) compute in place.

A state is used by one thread at a time, on one device; its arrays are ordered on the stream of
its first use, so a state moved to another stream needs that stream ordered after the first.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _layout, memory
from ..descriptors import DropoutDescriptor
from ..enums import DataType
from . import _call, _checks, _operand, _staging

if TYPE_CHECKING:
    from ..typing import DeviceArrayLike, StreamLike
    from ._annotations import Out

__all__ = ["DropoutState", "dnn_dropout", "dnn_dropout_grad", "dropout_mask_bytes"]

_TYPES = (DataType.HALF, DataType.FLOAT, DataType.DOUBLE)
_FWD, _BWD = "dropout", "dropout_grad"
_SEED_MAX = 2**64 - 1


def _seed(func: str, seed: Any) -> int:
    if isinstance(seed, bool) or not hasattr(seed, "__index__"):
        raise TypeError(f"{func}: seed must be an int in [0, 2**64 - 1] or None, got {seed!r}")
    s = seed.__index__()
    if not 0 <= s <= _SEED_MAX:
        raise ValueError(f"{func}: seed={s} is out of range; expected an int in [0, 2**64 - 1]")
    return s


def _p(func: str, p: Any) -> float:
    return _checks.real(p, "p", func, lo=0.0, hi=1.0, hi_open=True)


class DropoutState:
    """The RNG states, descriptor and mask of :func:`dnn_dropout`, reusable across calls.

    Parameters
    ----------
    seed : int, optional
        0 to 2**64 - 1; default a fresh random seed.

    Notes
    -----
    Nothing is allocated until the first :func:`dnn_dropout` with this state, which binds it to
    the input's device, allocates the RNG states and initialises them from :attr:`seed`. The
    reserve space (the mask) is grown for larger inputs. :func:`dnn_dropout_grad` uses the mask
    of the last forward call and refuses a gradient of another shape.

    Examples
    --------
    >>> with pycudnn.DropoutState(seed=0) as st:
    ...     y, _ = pycudnn.dnn_dropout(x, 0.5, state=st)
    ...     dx = pycudnn.dnn_dropout_grad(dy, st)
    """

    __slots__ = (
        "__weakref__",
        "_closed",
        "_desc",
        "_device",
        "_fresh",
        "_mask",
        "_p",
        "_reserve",
        "_seed",
        "_states",
    )

    def __init__(self, seed: int | None = None) -> None:
        self._seed = secrets.randbits(63) if seed is None else _seed("DropoutState", seed)
        self._p: float | None = None
        self._device: int | None = None
        self._desc: DropoutDescriptor | None = None
        self._states: Any = None
        self._reserve: Any = None
        self._mask: tuple[int, ...] | None = None
        self._fresh = True  # the RNG stream is at the start of self._seed's sequence
        self._closed = False

    # ---------------------------------------------------------------------------------- public
    @property
    def seed(self) -> int:
        """The seed the RNG stream was (or will be) initialised from."""
        return self._seed

    @property
    def p(self) -> float | None:
        """The dropout probability of the last call (None before the first)."""
        return self._p

    @property
    def device(self) -> int | None:
        """The device the state is bound to (None before the first call)."""
        return self._device

    @property
    def mask_shape(self) -> tuple[int, ...] | None:
        """Shape of the input of the last forward call, whose mask the state holds."""
        return self._mask

    @property
    def nbytes(self) -> int:
        """Device bytes held (RNG states plus reserve space)."""
        return sum(a.nbytes for a in (self._states, self._reserve) if a is not None)

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def close(self) -> None:
        """Free the descriptor and the device arrays now (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._desc is not None:
            self._desc.close()
        self._desc = self._states = self._reserve = None
        self._mask = None

    def __enter__(self) -> DropoutState:
        if self._closed:
            raise ValueError("DropoutState is closed")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._closed:
            return "DropoutState(closed)"
        where = "unbound" if self._device is None else f"device={self._device}, p={self._p:g}"
        return f"DropoutState(seed={self._seed}, {where}, mask_shape={self._mask})"

    # ---------------------------------------------------------------- for the calls (this module)
    def _check(self, func: str, device: int) -> None:
        if self._closed:
            raise ValueError(f"{func}: the DropoutState is closed")
        if self._device is not None and self._device != device:
            raise ValueError(
                f"{func}: the DropoutState is bound to device {self._device}, the operands are on "
                f"device {device}"
            )

    def _check_mask(self, func: str, shape: tuple[int, ...], device: int) -> None:
        self._check(func, device)
        if self._mask is None:
            raise ValueError(
                f"{func}: the DropoutState holds no mask yet; call dnn_dropout with it first"
            )
        if self._mask != tuple(shape):
            raise ValueError(
                f"{func}: dy has shape {tuple(shape)} but the state's mask is of the last "
                f"dnn_dropout input, of shape {self._mask}"
            )

    def _bind(self, h: Any, p: float, seed: int | None) -> Any:
        """Bind/seed/restore as the call asks; returns the descriptor."""
        if self._desc is None:
            if seed is not None:
                self._seed = seed
            size = DropoutDescriptor.states_size(h)
            self._states = memory.empty((size,), np.uint8, h.device, h.stream)
            self._desc = DropoutDescriptor(h, p, self._states, size, self._seed)
            self._device, self._p, self._fresh = h.device, p, True
        elif seed is not None and not (self._fresh and seed == self._seed):
            self._desc.set(h, p, self._states, self._states.nbytes, seed)
            self._seed, self._p, self._fresh = seed, p, True
        elif p != self._p:
            self._desc.restore(h, p, self._states, self._states.nbytes, self._seed)
            self._p = p
        return self._desc

    def _acquire(self, h: Any, p: float, seed: int | None, nbytes: int) -> tuple[Any, int, int]:
        """:meth:`_bind`, and the reserve space grown to *nbytes*; returns ``(descriptor,
        reserve pointer, reserve bytes)``."""
        desc = self._bind(h, p, seed)
        if self._reserve is None or self._reserve.nbytes < nbytes:
            self._reserve = None  # the old one is freed stream-ordered
            self._reserve = memory.empty((nbytes,), np.uint8, h.device, h.stream)
        return desc, self._reserve.ptr, self._reserve.nbytes


#: the per-call arguments that are not in the key: ``(func, state, p, seed, mask)``, *mask* a
#: given mask's ``(pointer, bytes)`` or None (pure Python; read by launch, set around each run, so
#: the cached entry never keeps a state alive)
_RUN = threading.local()


class _Dropout(_call.Call):
    """A dropout call: its two descriptors (input, output), the input's shape (the mask's) and
    whether it is empty (nothing to launch, but the state still records the mask's shape)."""

    __slots__ = ("empty", "fn", "hp", "in_desc", "nbytes", "out_desc", "shape")
    lean = False  # launch reads the per-call state

    def __init__(self, func, h, alloc, spans, inplace, descs, shape, empty, nbytes, name):
        super().__init__(func, h, (alloc,), spans, inplace=inplace, keepalive=descs)
        self.in_desc, self.out_desc = descs
        self.shape, self.empty = shape, empty
        self.nbytes = nbytes  # the mask's (reserve space's) bytes for this input
        self.hp = h.ptr
        self.fn = _call.quiet(name)


class _Forward(_Dropout):
    """``cudnnDropoutForward``: x, then y; the state's reserve space holds the mask."""

    __slots__ = ()

    def launch(self, ptrs):
        func, state, p, seed, mask = _RUN.args
        state._check(func, self.handle.device)
        if not self.empty:
            if mask is None:
                desc, rp, rs = state._acquire(self.handle, p, seed, self.nbytes)
            else:  # the caller's mask array: the state keeps none
                _mask_size(func, mask, self.nbytes)
                desc, (rp, rs) = state._bind(self.handle, p, seed), mask
            self.fn(self.hp, desc, self.in_desc, ptrs[0], self.out_desc, ptrs[1], rp, rs)
            state._fresh = False
        state._mask = self.shape if mask is None else None


class _Backward(_Dropout):
    """``cudnnDropoutBackward``: dy, then dx, with the mask of the state's last forward (or the
    caller's, of *nbytes* at least)."""

    __slots__ = ()

    def launch(self, ptrs):
        func, state, p, _seed, mask = _RUN.args
        if mask is None:
            state._check_mask(func, self.shape, self.handle.device)
            if self.empty:
                return
            desc, res = state._desc, state._reserve
            rp, rs = res.ptr, res.nbytes
        else:  # the caller's mask and p: the state lends its descriptor
            state._check(func, self.handle.device)
            if self.empty:
                return
            _mask_size(func, mask, self.nbytes)
            desc, (rp, rs) = state._bind(self.handle, p, None), mask
        self.fn(self.hp, desc, self.in_desc, ptrs[0], self.out_desc, ptrs[1], rp, rs)


def _run(
    tag: str, build: Any, x: Any, out: Any, stream: Any, context: tuple, mask: Any = None
) -> Any:
    """Key the call on *x* and *out*, check the state and the caller's *mask* (for the launch:
    its pointer and bytes), and :func:`._call.run_cached` the call with *context* ``(func,
    state, p, seed)`` for the launch (*tag*: ``_FWD`` or ``_BWD``)."""
    func, state = context[0], context[1]
    px, kx = _operand.key_of(x)
    po, ko = (None, None) if out is None else _operand.key_of(out)
    state._check(func, kx[3])  # a state bound to another device: before any C call
    m = None if mask is None else _mask_of(func, mask, kx[3])
    _RUN.args = (*context, m)
    try:
        return _call.run_cached(
            (tag, kx, ko), build, (x, out, stream), (px,), (out,), (po,), stream
        )[0]
    finally:
        _RUN.args = None  # the cache must not keep the state alive


#: reserve-space bytes by the input's (shape, dtype): a descriptor query, no GPU
_MASK_BYTES: dict[tuple, int] = {}


def dropout_mask_bytes(shape: Sequence[int], dtype: Any) -> int:
    """Bytes of the mask cuDNN's dropout keeps for an input of *shape* and *dtype* (its reserve
    space, ``cudnnDropoutGetReserveSpaceSize``; no GPU needed): the size of an ``out_mask`` for
    :func:`dnn_dropout`.

    Parameters
    ----------
    shape : sequence of int
        The input's shape (1 to 8 dims, sizes >= 0; an empty input needs 0 bytes).
    dtype : dtype
        The input's (numpy's or torch's): float16, float32 or float64.
    """
    func = "dropout_mask_bytes"
    dims = tuple(shape)
    key = (dims, dtype)
    n = _MASK_BYTES.get(key)
    if n is not None:
        return n
    if not 1 <= len(dims) <= 8 or any(
        isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in dims
    ):
        raise ValueError(f"{func}: shape must be 1 to 8 ints >= 0, got {dims!r}")
    dt = _operand.data_type(dtype)
    if dt not in _TYPES:
        raise TypeError(f"{func}: dtype must be float16, float32 or float64, got {dtype!r}")
    if 0 in dims:
        return 0
    desc = _staging.tensor_descriptor(*_staging.padded(dims, _layout.packed_strides(dims)), dt)
    n = _MASK_BYTES[key] = DropoutDescriptor.reserve_space_size(desc)
    return n


def _mask_of(func: str, mask: Any, device: int) -> tuple[int, int]:
    """A caller's mask array checked (a contiguous uint8 device array on *device*): ``(pointer,
    bytes)``; the call's entry checks the size against its input's before launching."""
    g = _operand.operand(mask)
    if g.dtype != DataType.UINT8:
        raise TypeError(f"{func}: the mask must be a uint8 device array, got {g.dtype}")
    if g.device != device:
        raise ValueError(f"{func}: the mask is on device {g.device}, the operands on {device}")
    if not _layout.matches(g.shape, g.strides, _layout.packed_strides(g.shape)):
        raise ValueError(f"{func}: the mask must be contiguous, got strides {g.strides}")
    return g.ptr, g.nbytes_span


def _mask_size(func: str, mask: tuple[int, int], need: int) -> None:
    if mask[1] < need:
        raise ValueError(
            f"{func}: the mask has {mask[1]} bytes; the input needs {need} (dropout_mask_bytes)"
        )


def _operands(func: str, name: str, g: _operand.Operand, out: Any, stream: Any):
    """Validate *g* and *out*; ``(handle, alloc spec, spans, in-place, in desc, out desc,
    empty)`` (no descriptors for an empty problem)."""
    dt, device = _checks.same_dtype_and_device(func, ((name, g),), _TYPES)
    empty = any(n == 0 for n in g.shape)
    if len(g.shape) > 8:
        raise ValueError(f"{func}: {name} has {len(g.shape)} dims; cuDNN supports at most 8")
    _checks.check_strides(func, name, g)
    if out is None:
        spec = _call.like_spec(g)
        o, so, ostrides = None, spec.nbytes_span, spec.element_strides
    else:
        spec = None
        o = _checks.out_operand(func, out, g.shape, dt, device)
        so, ostrides = o.nbytes_span, o.strides
    xd = yd = None
    if not empty:
        xd = _staging.tensor_desc(func, name, g)
        yd = _staging.tensor_descriptor(*_staging.padded(g.shape, ostrides), dt)
    inplace = (0,) if o is not None and _staging.same_layout(g, o) else ()
    h = _call.handle_for(device, stream, func)
    return h, spec, (g.nbytes_span, so), inplace, xd, yd, empty


def dnn_dropout(
    x: DeviceArrayLike,
    p: float,
    seed: int | None = None,
    state: DropoutState | None = None,
    *,
    out: Out | None = None,
    out_mask: DeviceArrayLike | None = None,
    stream: StreamLike = None,
) -> tuple[Out, DropoutState]:
    """Dropout (``cudnnDropoutForward``): each element of *x* is zeroed with probability *p*,
    the others are scaled by ``1 / (1 - p)``.

    Parameters
    ----------
    x : device array
        Up to 8 dims, any strides; float16, float32 or float64.
    p : float
        Probability of dropping an element, in ``[0, 1)``.
    seed : int, optional
        0 to 2**64 - 1. See the module notes: with no *state* it seeds the new state (None: a
        random seed); with a *state* it restarts that state's random stream.
    state : DropoutState, optional
        The RNG states and mask to (re)use; default a new one.
    out : device array, optional
        Same shape and dtype as *x*; may be *x* itself (in place).
    out_mask : device array, optional
        Where cuDNN writes the mask instead of the state: a contiguous uint8 array on *x*'s
        device of at least :func:`dropout_mask_bytes` bytes. The state then holds no mask (its
        random stream still advances): pass the array to :func:`dnn_dropout_grad` (``mask=``,
        with ``p=``), and the state is free for other calls meanwhile (how a framework keeps
        the mask with the output, not with a state object).
    stream : optional
        CUDA stream; default the operands' framework's current stream (torch, CuPy), else the
        handle's stream.

    Returns
    -------
    (DeviceArray or the type of *out*, DropoutState)
        ``y``, and the state holding its mask (pass it to :func:`dnn_dropout_grad`).

    Raises
    ------
    TypeError
        Host arrays, an unsupported dtype (bfloat16 included), a non-int seed, a *state* that
        is not a :class:`DropoutState`.
    ValueError
        *p* outside ``[0, 1)``, a seed out of range, a closed state or one bound to another
        device, more than 8 dims, a bad *out* (shape, device, overlap other than in place).

    Examples
    --------
    >>> y, st = pycudnn.dnn_dropout(x, 0.5, seed=1234)
    >>> y2, _ = pycudnn.dnn_dropout(x, 0.5, state=st)      # next mask, no RNG re-init
    >>> dx = pycudnn.dnn_dropout_grad(dy, st)              # the mask of y2
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(x)
    func = "dnn_dropout"
    pv = _p(func, p)
    sv = None if seed is None else _seed(func, seed)
    if state is None:
        state, sv = DropoutState(sv), None
    elif not isinstance(state, DropoutState):
        raise TypeError(f"{func}: state must be a DropoutState or None, got {type(state).__name__}")
    y = _run(_FWD, _build_forward, x, out, stream, (func, state, pv, sv), out_mask)
    return y, state


def _build_forward(x, out, stream) -> _Forward:
    func = "dnn_dropout"
    g = _operand.operand(x)
    h, spec, spans, inplace, xd, yd, empty = _operands(func, "x", g, out, stream)
    nbytes = 0 if empty else DropoutDescriptor.reserve_space_size(xd)
    shape, name = tuple(g.shape), "cudnnDropoutForward"
    return _Forward(func, h, spec, spans, inplace, (xd, yd), shape, empty, nbytes, name)


def dnn_dropout_grad(
    dy: DeviceArrayLike,
    state: DropoutState,
    *,
    mask: DeviceArrayLike | None = None,
    p: float | None = None,
    out: Out | None = None,
    stream: StreamLike = None,
) -> Out:
    """Gradient of :func:`dnn_dropout` (``cudnnDropoutBackward``): ``dx = mask * dy / (1 - p)``
    with the mask and *p* of *state*'s last forward call.

    Parameters
    ----------
    dy : device array
        Gradient w.r.t. ``y``: the shape of that forward call's input (any layout and dtype
        cuDNN supports: the mask follows the logical element order).
    state : DropoutState
        The state returned by (or passed to) :func:`dnn_dropout`; with *mask*, any state bound
        to dy's device (it lends its descriptor).
    mask : device array, optional
        The ``out_mask`` a :func:`dnn_dropout` wrote (with *p*, that call's probability): the
        gradient uses it instead of the state's mask.
    p : float, optional
        The forward's probability, with *mask* only.
    out : device array, optional
        ``dx``, same shape and dtype as *dy*; may be *dy* itself (in place).
    stream : optional
        CUDA stream; default the operands' framework's current stream (torch, CuPy), else the
        handle's stream.

    Returns
    -------
    DeviceArray or the type of *out*
        ``dx``, in *dy*'s memory order when new.

    Raises
    ------
    TypeError
        As for :func:`dnn_dropout`.
    ValueError
        A closed state, one with no mask yet, a mask of another shape or device, a bad *out*.

    Examples
    --------
    >>> y, st = pycudnn.dnn_dropout(x, 0.1)
    >>> dx = pycudnn.dnn_dropout_grad(dy, st)
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(dy)
    func = "dnn_dropout_grad"
    if not isinstance(state, DropoutState):
        raise TypeError(f"{func}: state must be a DropoutState, got {type(state).__name__}")
    if (mask is None) != (p is None):
        raise ValueError(f"{func}: mask and p go together (the forward's out_mask and its p)")
    pv = None if p is None else _p(func, p)
    return _run(_BWD, _build_backward, dy, out, stream, (func, state, pv, None), mask)


def _build_backward(dy, out, stream) -> _Backward:
    func = "dnn_dropout_grad"
    g = _operand.operand(dy)
    h, spec, spans, inplace, dyd, dxd, empty = _operands(func, "dy", g, out, stream)
    nbytes = 0 if empty else DropoutDescriptor.reserve_space_size(dyd)
    shape, name = tuple(g.shape), "cudnnDropoutBackward"
    return _Backward(func, h, spec, spans, inplace, (dyd, dxd), shape, empty, nbytes, name)
