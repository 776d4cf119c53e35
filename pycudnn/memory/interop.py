"""Zero-copy interop and pointer checks: ``asarray`` over ``__cuda_array_interface__`` and DLPack
producers, ``check_device_pointer``, ``check_alignment``.

Design decisions
----------------
* **By protocol, not by type.** :func:`asarray` views anything with
  ``__cuda_array_interface__`` (v2/v3) or ``__dlpack__`` (torch, CuPy, JAX, Numba...) without a
  copy and keeps the producer (or its DLPack deleter) alive. ``__cuda_array_interface__`` is tried
  first (no capsule to build); DLPack is used when it is absent or refuses, and whenever the
  object says bfloat16 (torch labels it ``'<f2'`` in its ``__cuda_array_interface__``).
* **Streams as the protocols say.** The producer's pending work is ordered before the consumer's
  stream: CAI v3's ``stream`` (an event, no host sync), ``__dlpack__(stream=...)``.
* **Host data is refused**, with a :class:`~pycudnn.errors.NotDeviceMemoryError` (a
  ``TypeError`` and a ``ValueError``) that names :func:`~pycudnn.memory.to_device`: copies are
  explicit.
* **Foreign objects are untrusted.** Every ``__cuda_array_interface__`` field is type-, range-
  and overflow-checked before anything is built from it (:func:`parse_cai`: a dict; ``version`` 2
  or 3; ``shape`` a tuple of ints in int64; ``typestr`` a string; ``data`` an ``(int, bool)``
  pair with a 64-bit, non-NULL-when-non-empty address; ``strides`` None or ints, whole items;
  ``stream`` None or a positive int; a byte size and extent that do not overflow), and the same
  for DLPack capsules (:func:`pycudnn.memory._dlpack.from_dlpack`). Each error names the field
  and its value: ``TypeError`` for a wrong kind, ``ValueError`` for a wrong value, ``BufferError``
  for a capsule that lies. This holds with ``check=False`` too: that flag only skips asking CUDA
  where the pointer lives.
* **Checks before C.** :func:`check_device_pointer` asks ``cudaPointerGetAttributes`` where a
  pointer lives (host, unregistered and, unless allowed, managed memory are refused; a pointer on
  another device than the handle is refused). :func:`asarray` runs it once when it wraps a
  ``__cuda_array_interface__`` object that does not say its device (that protocol carries none),
  so a ``DeviceArray`` needs no query per call.
* **Layers, no cycle.** The readers of both protocols live in :mod:`._protocols` and the checks
  in :mod:`._checks`; neither builds an array, so :mod:`.array` (whose ``copy_`` and
  ``to_device`` read foreign sources too) imports them, and this module imports all three.
"""

from __future__ import annotations

from typing import Any

from ._checks import check_alignment, check_device, check_device_pointer
from ._protocols import parse_cai, view_of
from .array import DeviceArray

__all__ = ["asarray", "check_alignment", "check_device_pointer", "parse_cai"]


def asarray(
    obj: Any,
    *,
    stream: Any = None,
    device: int | None = None,
    check: bool = True,
    allow_managed: bool = False,
    argument: str = "array",
) -> DeviceArray:
    """View *obj* as a :class:`DeviceArray` without copying.

    Parameters
    ----------
    obj
        A ``DeviceArray`` (returned as is), or any object with ``__cuda_array_interface__`` or
        ``__dlpack__``: torch tensors, CuPy arrays, JAX arrays, Numba device arrays...
    stream : optional
        The stream the view will be used on; the producer's pending work is ordered before it
        (protocol stream / ``__dlpack__(stream=...)``). Default 0, the legacy default stream.
    device : int, optional
        Expected device: a view on another device raises ``ValueError``.
    check : bool
        Query the pointer's attributes (``__cuda_array_interface__`` carries no device): needs a
        GPU. ``check=False`` trusts the producer and takes *device* (or the current device).
    allow_managed : bool
        Accept managed (unified) memory.
    argument : str
        Name used in error messages.

    Raises
    ------
    NotDeviceMemoryError
        For host arrays (numpy, CPU tensors): a ``TypeError`` naming :func:`to_device`.
    TypeError
        For objects that expose no device-array protocol, or unsupported dtypes.
    ValueError
        For a view on another device than *device*.

    Notes
    -----
    The view keeps *obj* (or, for DLPack, the producer's deleter) alive. Writes through the view
    are visible to *obj* and the other way round.
    """
    if device is not None:
        device = check_device(device, argument)
    if isinstance(obj, DeviceArray):
        if device is not None and obj.device != int(device):
            raise ValueError(f"{argument} is on device {obj.device}, expected device {device}")
        return obj
    return DeviceArray(*view_of(obj, stream, device, check, allow_managed, argument))
