"""Types for annotating code that calls pycudnn (like :mod:`numpy.typing`).

:data:`DeviceArrayLike` is what every high-level function takes as an array and as ``out=``: a
:class:`pycudnn.DeviceArray`, or any object exporting ``__dlpack__`` or
``__cuda_array_interface__`` (torch tensors, CuPy, JAX and Numba arrays). :data:`StreamLike` is
what ``stream=`` takes. The protocols are structural (any class with the method or attribute
matches) and ``runtime_checkable``; they say what a type checker can see, not where the memory
lives: a NumPy array exports ``__dlpack__`` too and is refused at run time with a
``TypeError`` naming ``pycudnn.to_device``.

This module imports only the standard library; the high-level modules import it for type
checkers only.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from typing import Any, Protocol, SupportsInt, TypeAlias, runtime_checkable

__all__ = [
    "DeviceArrayLike",
    "StreamLike",
    "SupportsCudaArrayInterface",
    "SupportsCudaStream",
    "SupportsDLPack",
]


@runtime_checkable
class SupportsDLPack(Protocol):
    """An object exporting DLPack (torch, CuPy, JAX, :class:`~pycudnn.DeviceArray`)."""

    def __dlpack__(self, *, stream: Any = ...) -> Any:
        """A DLPack capsule of the array, ordered after *stream*'s work."""
        ...


@runtime_checkable
class SupportsCudaArrayInterface(Protocol):
    """An object with ``__cuda_array_interface__`` (v2 or v3: torch, CuPy, Numba)."""

    @property
    def __cuda_array_interface__(self) -> Mapping[str, Any]:
        """The interface's dict (shape, typestr, data, strides, version, stream)."""
        ...


@runtime_checkable
class SupportsCudaStream(Protocol):
    """A stream object of the CUDA stream protocol (``cuda.core.Stream`` and others)."""

    def __cuda_stream__(self) -> tuple[int, int]:
        """``(version, handle)`` of the stream."""
        ...


class _TorchStream(Protocol):  # torch.cuda.Stream
    @property
    def cuda_stream(self) -> int: ...


class _CupyStream(Protocol):  # cupy.cuda.Stream
    @property
    def ptr(self) -> int: ...


#: An array a high-level function takes (inputs and ``out=``).
DeviceArrayLike: TypeAlias = SupportsDLPack | SupportsCudaArrayInterface

#: What ``stream=`` takes: None (the default choice), a ``cudaStream_t`` as an int (or anything
#: with ``__int__``: ``cuda.bindings``' ``CUstream``), a ``ctypes.c_void_p``, or a stream object
#: of cuda.core, torch or CuPy.
StreamLike: TypeAlias = (
    SupportsInt | ctypes.c_void_p | SupportsCudaStream | _TorchStream | _CupyStream | None
)
