"""The variant pack of :meth:`Graph.execute`, under the high-level calls' rules.

Every key names one real tensor of the built graph, once (a tensor, its name or its uid); a
virtual tensor, a constant of the graph, a tensor no operation uses and the graph's own scratch
tensors take nothing; every array matches its tensor (``check_array``); and no output's bytes
overlap another array's (cuDNN's outputs may not alias its inputs or each other).
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from typing import Any

from .. import _layout, memory
from .._types import itemsize
from ..enums import DataType
from ._tensor import GraphBase, check_array, host_scalar

__all__ = ["pointers"]


def _entries(g: GraphBase, variant_pack: Any) -> dict[int, tuple[Any, Any]]:
    """``uid -> (key as given, value)`` of the real tensors *variant_pack* names."""
    where = f"{g.name}.execute"
    if not isinstance(variant_pack, Mapping):
        raise TypeError(
            f"{where}: variant_pack must be a mapping (tensor, name or uid -> device array or "
            f"number), got {type(variant_pack).__name__}"
        )
    key = g._key
    real = set(key.uids)
    pack: dict[int, tuple[Any, Any]] = {}
    for k, v in variant_pack.items():
        t = g._lookup(k)
        spec = key.tensors[t._index]
        name = t._name
        if spec.uid in pack:
            raise ValueError(
                f"{where}: tensor {name!r} is given twice in variant_pack (as "
                f"{pack[spec.uid][0]!r} and as {k!r})"
            )
        if spec.is_virtual:
            raise ValueError(
                f"{where}: tensor {name!r} is virtual (an intermediate cuDNN need not write): it "
                "takes no array; call set_output(True) before build() to read it"
            )
        if spec.scratch:
            raise ValueError(f"{where}: tensor {name!r} lives in the graph's workspace")
        if spec.is_by_value and t._value is not None:
            raise ValueError(f"{where}: tensor {name!r} is a constant of the graph (scalar())")
        if spec.uid not in real:
            raise ValueError(f"{where}: tensor {name!r} is not used by any operation")
        pack[spec.uid] = (k, v)
    return pack


def _check_overlaps(g: GraphBase, arrays: list[tuple[Any, int, int]]) -> None:
    """*arrays*: ``(tensor, address, bytes)``; refuse an output overlapping any other."""
    for i, (t, p, n) in enumerate(arrays):
        if t._producer is None or not n:
            continue
        for j, (u, q, m) in enumerate(arrays):
            if j != i and m and _layout.overlaps(p, n, q, m):
                role = "output" if u._producer is not None else "input"
                raise ValueError(
                    f"{g.name}.execute: the array of output {t._name!r} overlaps the array of "
                    f"{role} {u._name!r}; cuDNN's outputs may not alias its inputs or each other"
                )


def pointers(g: GraphBase, variant_pack: Any) -> tuple[list[int], list[Any]]:
    """``(pointers in the key's uid order, host scalars to keep alive)`` of a checked
    *variant_pack*; a scratch tensor's slot is 0 (carved from the workspace when the plan
    runs)."""
    key = g._key
    by_uid = {spec.uid: (t, spec) for t, spec in zip(g._tensors, key.tensors, strict=True)}
    pack = _entries(g, variant_pack)
    ptrs: list[int] = []
    keep: list[Any] = []
    arrays: list[tuple[Any, int, int]] = []
    for uid in key.uids:
        t, spec = by_uid[uid]
        if spec.scratch:
            ptrs.append(0)
        elif spec.is_by_value and t._value is not None:
            ptrs.append(ctypes.addressof(t._value))
        elif spec.is_by_value:
            if uid not in pack:
                raise KeyError(f"{g.name}: no value for the by-value tensor {t._name!r}")
            c = host_scalar(pack[uid][1], DataType(spec.data_type), t._name)
            keep.append(c)
            ptrs.append(ctypes.addressof(c))
        elif uid not in pack:
            raise KeyError(f"{g.name}: no array for tensor {t._name!r} (uid {uid}) in variant_pack")
        else:
            p = check_array(g.name, t, pack[uid][1], spec, key.device)
            if t._ragged is None:
                lo, hi = _layout.extent(t._dim, t._stride, itemsize(DataType(spec.data_type)))
            else:  # packed rows: the array's own bytes
                a = memory.asarray(pack[uid][1], check=False)
                lo, hi = _layout.extent(a.shape, a.strides)
            arrays.append((t, p + lo, hi - lo))
            ptrs.append(p)
    _check_overlaps(g, arrays)
    return ptrs, keep
