"""Execution plans and how they run: the bare ``cudnnBackendExecute`` call, variant packs and
:class:`GraphPlan` (a finalized plan with the packs of the pointers seen so far).

* **Variant packs** are cached per plan, keyed by the N data pointers and the workspace pointer:
  a finalized variant pack cannot be updated (``SetAttribute`` on it returns BAD_PARAM), and
  rebuilding one costs several microseconds of host time per call (see ``docs/BENCHMARKS.md``).
  A pack for pointers not seen before is built by bare C calls on ctypes arrays that the plan
  allocated once (its unique ids, a pointer array it refills, the workspace slot).
* **The execute call** goes through a ctypes prototype without ``argtypes``/``errcheck`` and
  with prebuilt ``c_void_p`` arguments; the status check is one integer comparison.

Searching and caching plans is :mod:`._plans`'s. This module never imports ``pycudnn._lib``:
raw addresses are plain ints / ``c_void_p``.
"""

from __future__ import annotations

import ctypes
import sys
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from .. import api, errors
from ..descriptors import BackendDescriptor
from ..enums import BackendAttributeName as A
from ..enums import BackendAttributeType as T
from ..enums import BackendDescriptorType
from ._scratch import fill_scratch, workspace_layout

__all__ = ["PACKS_PER_PLAN", "EngineInfo", "GraphPlan", "execute_function", "raw_function"]

#: variant packs kept per plan: a training loop's activations cycle through the addresses of a
#: caching allocator, so a few dozen packs per plan keep most calls on a cached pack (each pack
#: is a few hundred bytes of host memory)
PACKS_PER_PLAN = 64


# -- the raw execute call --------------------------------------------------------------------------
_EXECUTE: Callable[..., int] | None = None


def raw_function(name: str) -> Callable[..., int]:
    """A prototype of *name* without argtypes/errcheck (the cheapest ctypes call), by address:
    pass ``c_void_p``/``c_int`` objects, never bare Python ints for pointers."""
    fn = getattr(api, name)
    try:
        addr = ctypes.cast(fn, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):  # a Python wrapper (deprecated): use it as is
        return fn
    return ctypes.CFUNCTYPE(ctypes.c_int)(addr)


def execute_function() -> Callable[..., int]:
    """The bare ``cudnnBackendExecute(handle_c, plan_c, pack_c)`` (returns the status)."""
    global _EXECUTE
    if _EXECUTE is None:
        _EXECUTE = raw_function("cudnnBackendExecute")
    return _EXECUTE


class _PackCalls:
    """Bare prototypes and constant arguments for building variant packs."""

    def __init__(self) -> None:
        self.create = raw_function("cudnnBackendCreateDescriptor")
        self.set = raw_function("cudnnBackendSetAttribute")
        self.finalize = raw_function("cudnnBackendFinalize")
        self.destroy = raw_function("cudnnBackendDestroyDescriptor")
        self.vp_type = ctypes.c_int(BackendDescriptorType.VARIANT_PACK_DESCRIPTOR)
        self.uids_attr = ctypes.c_int(A.VARIANT_PACK_UNIQUE_IDS)
        self.ptrs_attr = ctypes.c_int(A.VARIANT_PACK_DATA_POINTERS)
        self.ws_attr = ctypes.c_int(A.VARIANT_PACK_WORKSPACE)
        self.int64 = ctypes.c_int(T.INT64)
        self.void_ptr = ctypes.c_int(T.VOID_PTR)
        self.one = ctypes.c_int64(1)


_PACK: _PackCalls | None = None


def _pack_calls() -> _PackCalls:
    global _PACK
    if _PACK is None:
        _PACK = _PackCalls()
    return _PACK


class _PackArgs:
    """The ctypes arguments of one plan's variant packs, allocated once: the unique ids, a
    pointer array and a workspace slot refilled for each new pack (cuDNN copies them in
    ``SetAttribute``). Plans are per thread, so one plan's scratch is never filled concurrently."""

    __slots__ = ("n", "n_c", "ptrs", "uids", "ws", "ws_ref")

    def __init__(self, uids: Sequence[int]):
        self.n = n = len(uids)
        self.n_c = ctypes.c_int64(n)
        self.uids = (ctypes.c_int64 * n)(*uids)
        self.ptrs = (ctypes.c_void_p * n)()
        self.ws = ctypes.c_void_p()
        self.ws_ref = ctypes.byref(self.ws)


def _new_variant_pack(a: _PackArgs, key: tuple[int, ...]) -> ctypes.c_void_p:
    """A finalized variant pack for ``key = (*data_pointers, workspace_pointer)``."""
    k = _PACK or _pack_calls()
    n = a.n
    a.ptrs[:] = key[:n]
    a.ws.value = key[n] or None
    vp = ctypes.c_void_p()
    rc = k.create(k.vp_type, ctypes.byref(vp))
    if rc:
        raise errors.error_for(rc, "cudnnBackendCreateDescriptor")
    name = "cudnnBackendSetAttribute"
    rc = k.set(vp, k.uids_attr, k.int64, a.n_c, a.uids)
    if not rc:
        rc = k.set(vp, k.ptrs_attr, k.void_ptr, a.n_c, a.ptrs)
    if not rc:
        rc = k.set(vp, k.ws_attr, k.void_ptr, k.one, a.ws_ref)
    if not rc:
        name = "cudnnBackendFinalize"
        rc = k.finalize(vp)
    if rc:
        exc = errors.error_for(rc, name)
        k.destroy(vp)
        raise exc
    return vp


def _destroy_descriptor(c: ctypes.c_void_p) -> None:
    if _PACK is not None and not sys.is_finalizing():
        _PACK.destroy(c)


def _destroy_packs(packs: dict) -> None:
    for c in packs.values():
        _destroy_descriptor(c)
    packs.clear()


class EngineInfo(NamedTuple):
    index: int
    numerical: frozenset[int]
    behavior: frozenset[int]
    workspace: int  # the config's own estimate; -1 if unknown


# -- plans -----------------------------------------------------------------------------------------
class GraphPlan:
    """A finalized execution plan for any graph key, plus what a call needs: prebuilt ctypes
    arguments and the variant packs of the pointers seen so far.

    ``run(*pointers, workspace_ptr)`` takes the graph's data pointers in the order of its key's
    ``uids`` (x, w, y for a convolution), then the workspace pointer (0 when it needs none).
    """

    __slots__ = (
        "__weakref__",
        "args",
        "engine",
        "graph",
        "handle",
        "handle_c",
        "label",
        "layout",
        "packs",
        "plan",
        "plan_c",
        "uids",
        "workspace",
    )
    kind = "graph"

    def __init__(
        self,
        plan: BackendDescriptor,
        graph: BackendDescriptor,
        handle: Any,
        engine: EngineInfo,
        workspace: int,
        uids: Sequence[int],
        label: str | None = None,
    ):
        self.plan = plan
        self.graph = graph
        self.handle = handle
        self.engine = engine
        self.workspace = workspace
        self.uids = tuple(uids)
        self.label = label  # what the graph computes, for describe(); None: a plain convolution
        self.plan_c = ctypes.c_void_p(plan.ptr)
        self.handle_c = ctypes.c_void_p(handle.ptr)
        self.args = _PackArgs(self.uids)
        # (*data pointers, workspace pointer) -> finalized variant pack (owned: destroyed on
        # eviction, in close(), or by the finalizer when the plan is dropped)
        self.packs: dict[tuple[int, ...], ctypes.c_void_p] = {}
        weakref.finalize(self, _destroy_packs, self.packs)
        # (scratch, total bytes, offsets) of the last scratch tuple launched: an entry passes
        # the same tuple every launch, so its layout is computed once, not per launch
        self.layout: tuple[Any, int, list[int]] | None = None

    @property
    def fused(self) -> bool:
        """Whether this plan runs a fused graph (a convolution with its epilogue) as one."""
        return self.label is not None and self.label.startswith("fused")

    def pack(self, *key: int) -> ctypes.c_void_p:
        """The finalized variant pack for ``(*data_pointers, workspace_pointer)`` (built once,
        then cached; the oldest of :data:`PACKS_PER_PLAN` is destroyed for a new one).

        Built with bare C calls on the plan's prebuilt ctypes arguments (no descriptor object,
        no finalizer, no per-call ctypes array): a pack miss then costs little more than cuDNN's
        own create/set/finalize."""
        c = self.packs.get(key)
        if c is not None:
            return c
        return self._new_pack(key)

    def _new_pack(self, key: tuple[int, ...]) -> ctypes.c_void_p:
        if len(key) != len(self.uids) + 1:
            raise TypeError(
                f"this plan takes {len(self.uids)} data pointers and a workspace pointer, "
                f"got {len(key)} values"
            )
        c = _new_variant_pack(self.args, key)
        packs = self.packs
        if len(packs) >= PACKS_PER_PLAN:  # oldest first: dicts keep insertion order
            _destroy_descriptor(packs.pop(next(iter(packs))))
        packs[key] = c
        return c

    def run(self, *key: int) -> None:
        """Execute on the handle's current stream (the caller bound it):
        ``run(*data_pointers, workspace_pointer)``."""
        c = self.packs.get(key)
        if c is None:
            c = self._new_pack(key)
        rc = (_EXECUTE or execute_function())(self.handle_c, self.plan_c, c)
        if rc:
            raise errors.error_for(rc, "cudnnBackendExecute")

    def launch(self, ptrs: Sequence[int], scratch: Sequence[Any] = ()) -> None:
        """Run on the handle's workspace and current stream: *ptrs* are the data pointers in
        ``uids`` order, the last ``len(scratch)`` of them placeholders for the graph's scratch
        tensors, which are carved from the same workspace (:mod:`._scratch`).

        The one way the engine, a builder graph's ``execute`` and the high level's graph calls
        run a plan with its workspace."""
        handle = self.handle
        if not scratch:
            ws = self.workspace
            self.run(*ptrs, handle.workspace(ws)[0] if ws else 0)
            return
        full = list(ptrs)
        lay = self.layout
        if lay is None or lay[0] is not scratch:
            lay = self.layout = (scratch, *workspace_layout(self.workspace, scratch))
        wsp = handle.workspace(lay[1])[0]
        fill_scratch(scratch, full, wsp, lay[2], handle.stream)
        self.run(*full, wsp if self.workspace else 0)

    def describe(self) -> str:
        what = f"{self.label}, " if self.label else ""
        return f"engine {self.engine.index} ({what}workspace {self.workspace} B)"

    def close(self) -> None:
        """Drop the cached variant packs (the plan itself stays usable)."""
        _destroy_packs(self.packs)  # in place: the finalizer holds this same dict
