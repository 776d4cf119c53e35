"""Stride arithmetic: the one home of packed layouts, density, extents and cuDNN's int limits.

Pure functions of ``shape`` and ``strides`` tuples, no imports from pycudnn. The unit of the
strides is the caller's: element strides (cuDNN descriptors, DLPack) with ``itemsize=1``, byte
strides (numpy, ``__cuda_array_interface__``, :class:`~pycudnn.DeviceArray`) with the element
size. Shapes of operands follow cuDNN's order ``(N, C, spatial...)``; "channels last" is the
NHWC / NDHWC memory order of such a shape.

The strides of size-1 dimensions do not matter (nothing is ever stepped over them), so every
comparison here ignores them, as cuDNN, numpy and PyTorch do.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "INT32_MAX",
    "INT64_MAX",
    "UINT64_MAX",
    "check_int32",
    "extent",
    "is_c_contiguous",
    "is_dense",
    "layout_of",
    "matches",
    "non_overlapping",
    "overlaps",
    "packed_strides",
    "span",
]

INT32_MAX = 2**31 - 1  # cuDNN's legacy descriptors: dims, strides and spans are int
INT64_MAX = 2**63 - 1  # the backend API's int64 attributes
UINT64_MAX = 2**64 - 1  # addresses


def packed_strides(
    shape: Sequence[int], channels_last: bool = False, itemsize: int = 1
) -> tuple[int, ...]:
    """Strides of a packed array of *shape*: C order (NCHW), or channels last (NHWC, NDHWC).

    Size-0 dimensions count as 1, so the strides stay distinct (as numpy's do).
    """
    n = len(shape)
    order = (0, *range(2, n), 1) if channels_last and n > 2 else range(n)
    strides = [0] * n
    acc = itemsize
    for d in reversed(tuple(order)):
        strides[d] = acc
        acc *= max(shape[d], 1)
    return tuple(strides)


def matches(shape: Sequence[int], strides: Sequence[int], expected: Sequence[int]) -> bool:
    """*strides* equal *expected* in every dimension longer than 1."""
    return all(s == 1 or st == e for s, st, e in zip(shape, strides, expected, strict=True))


def layout_of(shape: Sequence[int], strides: Sequence[int]) -> tuple[bool, bool]:
    """``(packed NCHW, packed NHWC)`` for element *strides* (both for tensors that fit both)."""
    return (
        matches(shape, strides, packed_strides(shape, False)),
        matches(shape, strides, packed_strides(shape, True)),
    )


def is_c_contiguous(shape: Sequence[int], strides: Sequence[int], itemsize: int = 1) -> bool:
    """Packed in C order (empty arrays are)."""
    if 0 in shape:
        return True
    expected = itemsize
    for n, s in zip(reversed(shape), reversed(strides), strict=True):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


def is_dense(shape: Sequence[int], strides: Sequence[int], itemsize: int = 1) -> bool:
    """No gaps, no overlap, no negative strides, in any dimension order: the elements fill
    exactly ``size * itemsize`` units."""
    if 0 in shape:
        return True
    dims = sorted(((s, n) for n, s in zip(shape, strides, strict=True) if n != 1), reverse=True)
    expected = itemsize
    for s, n in reversed(dims):
        if s != expected:
            return False
        expected *= n
    return True


def extent(shape: Sequence[int], strides: Sequence[int], itemsize: int = 1) -> tuple[int, int]:
    """Offsets ``[lo, hi)`` from the first element's address that the elements touch
    (``(0, 0)`` when empty); *lo* is negative only with negative strides."""
    if 0 in shape:
        return 0, 0
    lo = hi = 0
    for n, s in zip(shape, strides, strict=True):
        if s < 0:
            lo += s * (n - 1)
        else:
            hi += s * (n - 1)
    return lo, hi + itemsize


def span(shape: Sequence[int], strides: Sequence[int]) -> int:
    """Elements from the first to one past the last addressed one (0 when empty), for
    non-negative element strides."""
    return extent(shape, strides)[1]


def non_overlapping(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """No two indices address the same element (a sufficient test: each stride at least the
    extent of the smaller ones)."""
    dims = sorted((st, s) for s, st in zip(shape, strides, strict=True) if s > 1)
    need = 1
    for st, s in dims:
        if st < need:
            return False
        need = st * s
    return True


def check_int32(what: str, shape: Sequence[int], strides: Sequence[int]) -> None:
    """Raise ``OverflowError`` naming *what* when a dimension, an element stride or the span is
    beyond cuDNN's 32-bit limit."""
    worst = max([*shape, *strides, span(shape, strides)], default=0)
    if worst > INT32_MAX:
        raise OverflowError(
            f"{what} of shape {tuple(shape)} with strides {tuple(strides)} exceeds cuDNN's "
            f"32-bit limit ({INT32_MAX} elements per dimension, stride and span); split the "
            "batch into smaller calls"
        )


def overlaps(p1: int, n1: int, p2: int, n2: int) -> bool:
    """Byte ranges ``[p1, p1 + n1)`` and ``[p2, p2 + n2)`` intersect."""
    return p1 < p2 + n2 and p2 < p1 + n1
