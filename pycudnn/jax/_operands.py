"""XLA's device buffers as pycudnn operands.

A :class:`~._frame.DeviceBuffer` could reach the high level through ``__cuda_array_interface__``,
but that protocol has no bfloat16 and costs a parse and a pointer query per operand. An
:class:`XlaOperand` is the high level's own operand record (pointer, shape, element strides,
``DataType``, device), registered as an operand type, so the high-level functions read it as
they read torch tensors. Its strides say the memory order: XLA's buffers are dense and row-major,
and a channels-last buffer ``(N, H, W, C)`` is given to cuDNN as the ``(N, C, H, W)`` shape with
NHWC strides (:func:`view`), as cuDNN describes that layout.

This runs on a call's slow path only (its first run with a signature): the bound launches of
:mod:`._bound` read pointers, not operands.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import _layout, memory
from ..highlevel import _operand
from ._frame import Buffer

__all__ = ["XlaOperand", "device_of", "view", "views"]


class XlaOperand(_operand.Operand):
    """An XLA buffer as the high level's operand record (see the module's docstring)."""

    __slots__ = ()


def _read(obj: XlaOperand) -> XlaOperand:
    return obj  # already the (ptr, shape, strides, DataType, device) the high level reads


_operand.register_operand_type(XlaOperand, _read)


def device_of(buffers: Sequence[Buffer]) -> int:
    """The device of the first non-empty buffer (``cudaPointerGetAttributes``); 0 when all are
    empty (nothing is launched then)."""
    for b in buffers:
        if b.ptr:
            return memory.check_device_pointer(b.ptr, argument=f"XLA buffer {b.shape}")
    return 0


def view(buffer: Buffer, device: int, channels_last: bool = False) -> XlaOperand:
    """*buffer* as an operand; *channels_last*: its dims are ``(N, spatial..., C)`` in memory,
    and the operand is ``(N, C, spatial...)`` with those strides."""
    shape = tuple(buffer.shape)
    dt = _operand.data_type(buffer.dtype)
    if dt is None:
        raise TypeError(f"an XLA buffer of dtype {buffer.dtype} has no cuDNN data type")
    if channels_last and len(shape) >= 3:
        shape = (shape[0], shape[-1], *shape[1:-1])
        strides = _layout.packed_strides(shape, channels_last=True)
    else:
        strides = _layout.packed_strides(shape)
    return XlaOperand(buffer.ptr, shape, strides, dt, device)


def views(
    args: Sequence[Buffer], rets: Sequence[Buffer], channels_last: Sequence[bool] = ()
) -> tuple[Any, ...]:
    """The operands of *args* then *rets* on their device; *channels_last* flags each of them
    (all False when empty)."""
    buffers = (*args, *rets)
    device = device_of(buffers)
    flags = channels_last or (False,) * len(buffers)
    return tuple(view(b, device, f) for b, f in zip(buffers, flags, strict=True))
