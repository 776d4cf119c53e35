"""The arithmetic of views: what a reshape, an index or a transpose of a strided array points
at. Pure functions on ``(pointer, shape, byte strides)``; :class:`~pycudnn.memory.DeviceArray`
wraps their results in views that keep the memory alive."""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np

from ._checks import as_shape

__all__ = ["indexed", "reshaped", "transposed"]

View = tuple[int, tuple[int, ...], tuple[int, ...]]


def reshaped(size: int, shape: tuple[Any, ...]) -> tuple[int, ...]:
    """The shape ``reshape(*shape)`` asks for an array of *size* elements (one dimension may be
    -1; a single sequence argument is the shape)."""
    if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
        one = shape[0]
        if isinstance(one, (str, bytes, dict, set, frozenset)) or not hasattr(one, "__iter__"):
            raise TypeError(
                f"reshape: shape must be ints or one sequence of ints, got {one!r} "
                f"({type(one).__name__})"
            )
        shape = tuple(one)
    dims = []
    for s in shape:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
            raise TypeError(f"reshape: shape must hold ints, got {s!r} ({type(s).__name__})")
        dims.append(int(s))
    dims = tuple(dims)
    if dims.count(-1) > 1:
        raise ValueError("only one dimension can be -1")
    if -1 in dims:
        rest = math.prod(s for s in dims if s != -1)
        if rest == 0 or size % rest:
            raise ValueError(f"cannot reshape size {size} into {dims}")
        dims = tuple(size // rest if s == -1 else s for s in dims)
    new = as_shape(dims)
    if math.prod(new) != size:
        raise ValueError(f"cannot reshape size {size} into {new}")
    return new


def indexed(ptr: int, shape: tuple[int, ...], strides: tuple[int, ...], key: Any) -> View:
    """``(pointer, shape, strides)`` of numpy's basic indexing (ints, slices of any step,
    ``...``, ``None``) of the array at *ptr*; an int removes its dimension."""
    if not isinstance(key, tuple):
        key = (key,)
    if sum(k is Ellipsis for k in key) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    ndim = len(shape)
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
    if n_real > ndim:
        raise IndexError(f"too many indices: array is {ndim}-dimensional, {n_real} given")
    fill = (slice(None),) * (ndim - n_real)
    if Ellipsis in key:
        at = next(i for i, k in enumerate(key) if k is Ellipsis)
        key = key[:at] + fill + key[at + 1 :]
    else:
        key = key + fill
    new_shape: list[int] = []
    new_strides: list[int] = []
    dim = 0
    for k in key:
        if k is None:
            new_shape.append(1)
            new_strides.append(0)
            continue
        n, stride = shape[dim], strides[dim]
        dim += 1
        if isinstance(k, slice):
            start, stop, step = k.indices(n)
            length = len(range(start, stop, step))
            if length:
                ptr += start * stride
            new_shape.append(length)
            new_strides.append(stride * step)
            continue
        if isinstance(k, (bool, np.bool_)) or not hasattr(k, "__index__"):
            raise IndexError(
                f"only integers, slices, '...' and None index a DeviceArray, not {k!r}"
            )
        i = operator.index(k)
        if not -n <= i < n:
            raise IndexError(f"index {i} is out of bounds for axis {dim - 1} with size {n}")
        ptr += (i % n) * stride
    return ptr, tuple(new_shape), tuple(new_strides)


def transposed(
    shape: tuple[int, ...], strides: tuple[int, ...], axes: tuple[Any, ...]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shape and strides with the dimensions permuted by *axes* (default: reversed; a single
    sequence argument is the permutation), as ``numpy.transpose``."""
    if len(axes) == 1 and not isinstance(axes[0], (int, np.integer)):
        axes = tuple(axes[0])
    ndim = len(shape)
    order = tuple(reversed(range(ndim))) if not axes else tuple(operator.index(a) for a in axes)
    order = tuple(a + ndim if a < 0 else a for a in order)
    if sorted(order) != list(range(ndim)):
        raise ValueError(f"axes {axes} are not a permutation of {ndim} dimensions")
    return tuple(shape[a] for a in order), tuple(strides[a] for a in order)
