"""The variant pack of :meth:`Graph.execute`, under the high-level calls' rules, bound to the
operands' signature after the first call.

Every key names one real tensor of the built graph, once (a tensor, its name or its uid); a
virtual tensor, a constant of the graph, a tensor no operation uses and the graph's own scratch
tensors take nothing; every array matches its tensor (``check_array``); and no output's bytes
overlap another array's (cuDNN's outputs may not alias its inputs or each other).

**Bound calls.** A call that passed every check binds its *signature* to what the checks
found (:class:`_Binding`): where each key's pointer goes in the plan's pointer order, which keys
are by-value scalars, and each array's byte extent. The signature pins everything the checks
read that is not a pointer value: the mapping's keys in their order (with their types, so
``True`` is not the uid ``1``), and for each value its type and -- for a ``torch.Tensor`` or a
pycudnn ``DeviceArray``, the only arrays read without a protocol round trip -- its shape,
strides, dtype, device (and a tensor's ``requires_grad``, which the protocols refuse) and its
address modulo the lcm of the graph's declared alignments; a by-value scalar contributes its type
(``int`` or ``float``) only. A later call with the same signature skips the per-array checks and
the key lookup. What depends on values is still done on every call:

* each by-value scalar is converted (and range-checked) from the value given (``host_scalar``);
* the output/input overlap check runs on the new addresses, with the extents the checks found,
  unless the array addresses are exactly those of the binding's last checked call;
* torch tensors: the call is bound only while the current CUDA device is the graph's and torch's
  current stream on it (and on the tensors' devices) is the default stream. Otherwise (a side
  stream) every array is read through its protocol as before, which orders torch's current
  stream before the legacy default stream as a DLPack export does.

Anything else -- another mapping type, a CuPy/JAX/other array, a NumPy scalar -- and any failure
on the bound path go through the full checks, which raise the same errors as always. Bindings
live on the graph (at most :data:`BINDINGS_PER_GRAPH`, oldest dropped first) and belong to the
graph's current build (a new ``build()``/``deserialize()`` starts afresh).
"""

from __future__ import annotations

import ctypes
import math
import sys
from collections.abc import Mapping
from typing import Any

from .. import _layout, memory
from .._types import itemsize
from ..enums import DataType
from ._tensor import GraphBase, check_array, host_scalar

__all__ = ["BINDINGS_PER_GRAPH", "pointers", "scratch"]

#: signatures bound per graph (a loop alternating a few shapes stays bound; a new one beyond
#: this drops the oldest)
BINDINGS_PER_GRAPH = 16

_DeviceArray = memory.DeviceArray
#: ``torch.Tensor`` once a variant pack held one (read without importing torch)
_torch_tensor: Any = None


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


# -- the signature of a call -----------------------------------------------------------------------
def _signature(
    variant_pack: Any, align: int
) -> tuple[tuple[Any, ...], list[int], list[Any]] | None:
    """``(signature, array pointers, scalar values)`` in the mapping's order, or None when a
    value is not one that a signature can pin (then the call is checked in full)."""
    global _torch_tensor
    if type(variant_pack) is not dict:
        return None
    sig: list[tuple[Any, ...]] = []
    ptrs: list[int] = []
    values: list[Any] = []
    tt = _torch_tensor
    for k, v in variant_pack.items():
        tp = type(v)
        if tp is tt:
            p = v.data_ptr()
            sig.append(
                (
                    k,
                    type(k),
                    tp,
                    v.shape,
                    v.stride(),
                    v.dtype,
                    v.get_device(),
                    v.requires_grad,
                    p % align,
                )
            )
            ptrs.append(p)
        elif tp is _DeviceArray:
            p = v._ptr
            sig.append((k, type(k), tp, v._shape, v._strides, v._dtype, v._device, p % align))
            ptrs.append(p)
        elif tp is float or tp is int:
            sig.append((k, type(k), tp))
            values.append(v)
        elif tt is None and tp.__module__ == "torch" and tp.__name__ == "Tensor":
            _torch_tensor = tp  # the first torch tensor seen: read it as one from now on
            return _signature(variant_pack, align)
        else:
            return None
    return tuple(sig), ptrs, values


#: torch's ``(current device getter, current raw stream getter)``, read once
_torch_getters: tuple[Any, Any] | None = None


def _torch_default_stream(devices: tuple[int, ...], device: int) -> bool:
    """Whether *device* is current and torch's current stream on it and on *devices* is the
    default stream: reading a torch tensor through its protocol then orders nothing (a DLPack
    export orders torch's current stream before the default one only when they differ)."""
    global _torch_getters
    if _torch_getters is None:
        torch_c = sys.modules["torch"]._C
        _torch_getters = (torch_c._cuda_getDevice, torch_c._cuda_getCurrentRawStream)
    current, raw = _torch_getters
    if current() != device or raw(device):
        return False
    return not any(raw(d) for d in devices if d != device)


# -- bindings --------------------------------------------------------------------------------------
class _Binding:
    """What the checks of one signature found: ``template`` (the pointers in the plan's order,
    constants' addresses and scratch placeholders filled), ``arrays`` (``(slot, position)``:
    the n-th array pointer of the mapping goes to ``slot``), ``scalars`` (``(slot, data type,
    name)`` in the mapping's order), ``extents`` (``(tensor, position, lo, bytes)`` in the
    plan's order, for the overlap check), ``torch_devices`` (devices of torch tensors, whose
    reading depends on torch's current stream) and ``last`` (the array pointers of the latest
    call whose overlap check passed)."""

    __slots__ = ("arrays", "extents", "identity", "last", "scalars", "template", "torch_devices")

    def __init__(
        self,
        template: list[int],
        arrays: tuple[tuple[int, int], ...],
        scalars: tuple[tuple[int, DataType, str], ...],
        extents: tuple[tuple[Any, int, int, int], ...],
        torch_devices: tuple[int, ...],
        last: tuple[int, ...],
    ) -> None:
        self.template = template
        self.arrays = arrays
        self.scalars = scalars
        self.extents = extents
        self.torch_devices = torch_devices
        self.last = last
        # the common case: only arrays, given in the plan's order
        self.identity = not scalars and [s for s, _ in arrays] == list(range(len(template)))


class _Bindings:
    """A graph's bindings, for one build (``key``); ``align``: the lcm of the declared
    alignments; ``scratch``: the key's scratch tensors (its property builds a tuple)."""

    __slots__ = ("align", "data", "key", "scratch")

    def __init__(self, key: Any) -> None:
        self.key = key
        self.align = math.lcm(1, *(s.alignment for s in key.tensors if s.alignment > 0))
        self.scratch = key.scratch
        self.data: dict[tuple[Any, ...], _Binding] = {}


def _bindings(g: GraphBase) -> _Bindings:
    b = getattr(g, "_bindings", None)
    if b is None or b.key is not g._key:
        b = _Bindings(g._key)
        g._bindings = b  # type: ignore[attr-defined]
    return b


def scratch(g: GraphBase) -> tuple[Any, ...]:
    """The built graph's scratch tensors (``GraphKey.scratch``), read once per build."""
    found: tuple[Any, ...] = _bindings(g).scratch
    return found


def _bound(
    g: GraphBase, b: _Binding, ptrs: list[int], values: list[Any]
) -> tuple[list[int], list[Any]]:
    """The pointers of a call whose signature is bound to *b*: scalars converted, overlaps
    checked on the new addresses (unless they are the last checked ones)."""
    key = tuple(ptrs)
    if key != b.last:
        _check_overlaps(g, [(t, ptrs[i] + lo, n) for t, i, lo, n in b.extents])
        b.last = key
    if b.identity:
        return ptrs, []
    full = b.template.copy()
    for slot, i in b.arrays:
        full[slot] = ptrs[i]
    keep: list[Any] = []
    for j, (slot, dt, name) in enumerate(b.scalars):
        c = host_scalar(values[j], dt, name)
        keep.append(c)
        full[slot] = ctypes.addressof(c)
    return full, keep


def pointers(g: GraphBase, variant_pack: Any) -> tuple[list[int], list[Any]]:
    """``(pointers in the key's uid order, host scalars to keep alive)`` of a checked
    *variant_pack*; a scratch tensor's slot is 0 (carved from the workspace when the plan
    runs). A call whose signature is bound skips the per-array checks (see the module)."""
    if g._key is None:  # not built: the checks say so
        return _checked(g, variant_pack)[:2]
    store = _bindings(g)
    read = None
    try:
        read = _signature(variant_pack, store.align)
        if read is not None:
            b = store.data.get(read[0])
            if b is not None and (
                not b.torch_devices or _torch_default_stream(b.torch_devices, g._key.device)
            ):
                return _bound(g, b, read[1], read[2])
    except Exception:
        # a tensor that cannot say its layout (sparse), a scalar out of range, an overlap...:
        # the full checks below raise the error they always did (and nothing is bound)
        read = None
    ptrs_full, keep, found = _checked(g, variant_pack, read is not None)
    if read is not None and found is not None:
        _bind(store, read, found)
    return ptrs_full, keep


def _bind(store: _Bindings, read: tuple[Any, ...], found: tuple[Any, ...]) -> None:
    """Bind *read*'s signature to what the checks *found*, when the signature's pointers are
    those the checks read (else the call stays unbound: checked in full each time)."""
    sig, ptrs, values = read
    full, order, extents, torch_devices = found
    arrays: list[tuple[int, int]] = []
    scalars: list[tuple[int, DataType, str]] = []
    if len(order) != len(sig):
        return
    for (slot, spec, t), entry in zip(order, sig, strict=True):  # the mapping's order
        scalar = len(entry) == 3  # (key, key type, value type): a number
        if spec.is_by_value != scalar:
            return  # say, an int where the checks took an array (a test's fake): not bound
        if scalar:
            scalars.append((slot, DataType(spec.data_type), t._name))
        else:
            if full[slot] != ptrs[len(arrays)]:
                return
            arrays.append((slot, len(arrays)))
    if len(arrays) != len(ptrs) or len(scalars) != len(values):
        return
    position = {slot: i for slot, i in arrays}
    ext = tuple((t, position[slot], lo, n) for t, slot, lo, n in extents)
    template = list(full)
    for slot, *_ in scalars:
        template[slot] = 0
    data = store.data
    if sig not in data and len(data) >= BINDINGS_PER_GRAPH:
        data.pop(next(iter(data)), None)
    data[sig] = _Binding(template, tuple(arrays), tuple(scalars), ext, torch_devices, tuple(ptrs))


def _checked(
    g: GraphBase, variant_pack: Any, binding: bool = False
) -> tuple[list[int], list[Any], tuple[Any, ...] | None]:
    """Every check, as :meth:`Graph.execute` always made them: ``(pointers, host scalars,
    what a binding needs)`` (None unless *binding*)."""
    key = g._key
    by_uid = {spec.uid: (t, spec) for t, spec in zip(g._tensors, key.tensors, strict=True)}
    pack = _entries(g, variant_pack)
    ptrs: list[int] = []
    keep: list[Any] = []
    arrays: list[tuple[Any, int, int]] = []
    extents: list[tuple[Any, int, int, int]] = []
    slots: dict[int, int] = {}
    torch_devices: set[int] = set()
    tt = _torch_tensor
    for uid in key.uids:
        t, spec = by_uid[uid]
        slots[uid] = len(ptrs)
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
            value: Any = pack[uid][1]
            p = check_array(g.name, t, value, spec, key.device)
            # byte offsets (extent takes byte strides: element strides undercounted the span)
            if t._ragged is None:
                isz = itemsize(DataType(spec.data_type))
                lo, hi = _layout.extent(t._dim, tuple(s * isz for s in t._stride), isz)
            else:  # packed rows: the array's own bytes
                a = memory.asarray(value, check=False)
                lo, hi = _layout.extent(a.shape, a.strides, a.dtype.itemsize)
            arrays.append((t, p + lo, hi - lo))
            extents.append((t, len(ptrs), lo, hi - lo))
            if tt is not None and type(value) is tt:
                torch_devices.add(value.get_device())
            ptrs.append(p)
    _check_overlaps(g, arrays)
    if not binding:
        return ptrs, keep, None
    order = tuple((slots[uid], by_uid[uid][1], by_uid[uid][0]) for uid in pack)
    return ptrs, keep, (list(ptrs), order, extents, tuple(sorted(torch_devices)))
