"""The graph-plan engine: execution plans for any operation graph of cuDNN's backend API, their
search, and the per-thread LRU plan cache.

Graph keys
----------
A plan is searched for a *graph key*: a hashable named tuple of everything that changes the
execution plan, which also knows how to build its operation graph. The engine asks a key for

* ``build_graph(handle)`` -> the finalized ``OPERATIONGRAPH`` descriptor (any operations:
  convolutions, pointwise, reductions, matmuls; any number of tensors);
* ``uids`` -> the unique ids of the graph's non-virtual tensors, in the order in which a call
  passes their pointers (``plan.run(*pointers, workspace)``);
* ``dtype``, ``allow_tf32``, ``deterministic``, ``workspace_limit``, ``algo`` -> the numerics and
  search policy (:func:`rejection`, :func:`search`);
* ``what()`` -> a phrase naming the problem for error messages; ``label`` -> what
  ``describe()`` adds after the engine (e.g. ``"fused conv+bias+relu"``; None for a plain
  convolution);
* ``timing_buffers(handle, given_ptrs)`` -> ``(ptrs, keepalive)``: a pointer for every uid to
  time candidates on (``algo == 'time'`` only). Each key type knows which of the caller's
  pointers are safe to run on (inputs) and which need a scratch buffer (an output that may
  accumulate, ``beta != 0``); the engine keeps the one timing loop;
* optionally ``scratch`` -> tensors carved from the workspace (:mod:`._scratch`),
  ``make_plan(handle, given_ptrs)`` -> a plan of the key's own kind or None (a convolution's
  pinned legacy algorithm), and ``negative`` -> True when "no engine" is an answer to cache
  (:class:`NoEngine`) rather than an error to raise.

:func:`plan` is the one entry: cache lookup, counters, the key's own plan or the search, the
negative record, the verbose report.

The keys live with their operations: a convolution's is
:class:`pycudnn.highlevel.conv._problem.Problem` (with ``make_plan`` for Theano's named legacy
algorithms), the fused convolution's :class:`pycudnn.highlevel.conv._epilogue.FusedProblem`
(``negative``), a builder graph's :class:`pycudnn.graph._key.GraphKey`. The (hashable) key *is*
the cache key.

Caching design
--------------

* **Plans** (:class:`GraphPlan` for the graph API, or a key's own kind from ``make_plan``)
  live in a per-thread LRU (:class:`_LRU`, bound :func:`set_cache_size`, default
  1024 entries or ``PYCUDNN_PLAN_CACHE_SIZE``). Per thread, because the plans are built on the
  thread's cuDNN handle and cuDNN does not promise that one plan may run concurrently on two
  handles (PyTorch keeps its v8 plan cache ``thread_local`` for the same reason).
* **Plans run** through :mod:`._execution` (:class:`GraphPlan`: variant packs cached per
  plan by their pointers, the bare execute call).
* **Search** (cache miss): operation graph -> heuristics (mode INSTANT, or the key's
  ``heur_modes``: builder graphs default to A then FALLBACK) -> the first engine
  config is tried alone before the rest are fetched; configs are filtered by their numerical
  notes (TF32 / down-conversion / non-determinism, as PyTorch's ``filterEngineConfigs``), then
  built in rank order; an engine that fails to build, exceeds the workspace limit, or whose
  workspace cannot be allocated is skipped (the allocation failure caps later candidates' size).
  The FALLBACK heuristics are tried when mode INSTANT yields nothing. Timing policies build every
  acceptable config (up to :data:`BENCHMARK_LIMIT`) and time them on the caller's buffers with
  CUDA events, writing into a scratch output so that an accumulating (``beta != 0``) output is
  not corrupted. When everything fails, one error lists every engine tried and why.
* A failure while a cached plan runs (e.g. its workspace no longer fits) evicts the plan and
  re-searches; a failed search is never cached.

This module never imports ``pycudnn._lib``.

Diagnostics hook (benchmarks): :func:`raw_function`, :func:`execute_function`,
:func:`cached_plan` and a plan's ``handle_c``/``plan_c``/``pack()``/``run()`` are the documented
way to reach below ``dnn_conv`` (with ``pycudnn.highlevel.conv.last_call()``).
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

from .. import _config, _cuda, errors
from ..descriptors import BackendDescriptor
from ..enums import (
    BackendAttributeName as A,
)
from ..enums import (
    BackendAttributeType as T,
)
from ..enums import (
    BackendBehaviorNote,
    BackendDescriptorType,
    BackendHeurMode,
    BackendNumericalNote,
    DataType,
)
from ._execution import EngineInfo, GraphPlan, execute_function, raw_function

__all__ = [
    "BENCHMARK_LIMIT",
    "PENDING_LIMIT",
    "CacheInfo",
    "DeviceCache",
    "GraphPlan",
    "cache_info",
    "cached_plan",
    "clear_caches",
    "device_cache",
    "evict",
    "execute_function",
    "new_lru",
    "raw_function",
    "remember",
    "set_cache_size",
]

#: How many engine configs the ``time_*`` policies build and time at most (PyTorch's default
#: ``benchmark_limit`` is 10). Set ``pycudnn.graph._plans.BENCHMARK_LIMIT`` to change it.
BENCHMARK_LIMIT = int(os.environ.get("PYCUDNN_BENCHMARK_LIMIT", "16") or 16)
_TIMING_WARMUP, _TIMING_REPEATS = 1, 3
_TIMING_BLOCK_MS, _TIMING_MIN_RUNS, _TIMING_MAX_RUNS = 0.5, 5, 50


def engine_info(cfg: BackendDescriptor) -> EngineInfo:
    """Global engine index, numerical/behaviour notes and workspace of an engine config."""
    eng = cfg.get(A.ENGINECFG_ENGINE, T.BACKEND_DESCRIPTOR, 1, descriptor_type="ENGINE_DESCRIPTOR")[
        0
    ]
    index = int(eng.get(A.ENGINE_GLOBAL_INDEX, T.INT64, 1)[0])
    num = frozenset(int(v) for v in eng.get(A.ENGINE_NUMERICAL_NOTE, T.NUMERICAL_NOTE, 16))
    beh = frozenset(int(v) for v in eng.get(A.ENGINE_BEHAVIOR_NOTE, T.BEHAVIOR_NOTE, 16))
    try:
        ws = int(cfg.get(A.ENGINECFG_WORKSPACE_SIZE, T.INT64, 1)[0])
    except errors.CudnnError:
        ws = -1
    eng.close()
    return EngineInfo(index, num, beh, ws)


def rejection(p: Any, info: EngineInfo) -> str | None:
    """Why an engine may not run the graph key *p* under the numerics policy, or None if it may.

    * non-deterministic engines are dropped when determinism is requested;
    * fp32 data without ``allow_tf32``: engines with the TENSOR_CORE note (TF32) are dropped, as
      PyTorch does -- the graph API has no per-convolution math-type switch, the notes are how
      TF32 is kept out;
    * engines that down-convert their inputs are dropped unless fp32 with TF32 allowed (they
      compute in a narrower type than the caller asked for).
    """
    n = info.numerical
    deny = getattr(p, "deny_numerical", None)
    if deny and n & deny:
        return "numerical note " + ", ".join(BackendNumericalNote(v).name for v in n & deny)
    deny = getattr(p, "deny_behavior", None)
    if deny and info.behavior & deny:
        return "behaviour note " + ", ".join(
            BackendBehaviorNote(v).name for v in info.behavior & deny
        )
    if p.deterministic and BackendNumericalNote.NONDETERMINISTIC in n:
        return "non-deterministic"
    fp32 = p.dtype == DataType.FLOAT
    if fp32 and not p.allow_tf32 and BackendNumericalNote.TENSOR_CORE in n:
        return "tensor cores (TF32) with allow_tf32=False"
    if BackendNumericalNote.DOWN_CONVERT_INPUTS in n and not (fp32 and p.allow_tf32):
        return "down-converts inputs"
    return None


def heuristics(graph: BackendDescriptor, mode: BackendHeurMode) -> BackendDescriptor:
    """A finalized ENGINEHEUR descriptor for *graph* in *mode*."""
    heur = BackendDescriptor(BackendDescriptorType.ENGINEHEUR_DESCRIPTOR)
    heur.set(A.ENGINEHEUR_OPERATION_GRAPH, T.BACKEND_DESCRIPTOR, graph)
    heur.set(A.ENGINEHEUR_MODE, T.HEUR_MODE, mode)
    heur.finalize()
    return heur


def heuristic_configs(heur: BackendDescriptor, count: int | None) -> list[BackendDescriptor]:
    """Engine configs of finalized heuristics, best first (*count* None: all of them)."""
    return heur.get(
        A.ENGINEHEUR_RESULTS, T.BACKEND_DESCRIPTOR, count, descriptor_type="ENGINECFG_DESCRIPTOR"
    )


# -- the per-thread LRU ----------------------------------------------------------------------------
class _LRU:
    """An ordered dict with a size bound; lookups move the entry to the most-recent end.

    Evicted or cleared values are closed (``value.close()``) when *owns* (plans own their
    variant packs); a cache of objects that others may still hold (descriptors referenced by
    call entries) only drops its references and leaves them to their finalizers.
    """

    __slots__ = ("__weakref__", "data", "maxsize", "owns")

    def __init__(self, maxsize: int, owns: bool = True):
        self.data: collections.OrderedDict[Any, Any] = collections.OrderedDict()
        self.maxsize = maxsize
        self.owns = owns

    def _close(self, value: Any) -> None:
        close = getattr(value, "close", None) if self.owns else None
        if close is not None:
            close()

    def get(self, key: Any) -> Any:
        data = self.data
        value = data.get(key)
        if value is not None:
            data.move_to_end(key)
        return value

    def put(self, key: Any, value: Any) -> None:
        data = self.data
        data[key] = value
        data.move_to_end(key)
        while len(data) > self.maxsize > 0:
            self._close(data.popitem(last=False)[1])

    def pop(self, key: Any) -> None:
        self.data.pop(key, None)

    def clear(self) -> None:
        for value in self.data.values():
            self._close(value)
        self.data.clear()

    def __len__(self) -> int:
        return len(self.data)


def _default_size() -> int:
    try:
        return int(os.environ.get("PYCUDNN_PLAN_CACHE_SIZE", "1024"))
    except ValueError:
        return 1024


_maxsize = _default_size()
_local = threading.local()
_registry: weakref.WeakSet[_LRU] = weakref.WeakSet()
_registry_lock = threading.Lock()


class _Stats:  # (clears: clear_caches() calls; what holds entries outside the caches keys on it)
    __slots__ = ("builds", "clears", "hits", "misses", "search_seconds")

    def __init__(self) -> None:
        self.hits = self.misses = self.builds = self.clears = 0
        self.search_seconds = 0.0


stats = _Stats()


def new_lru(owns: bool = True) -> _LRU:
    """A per-thread LRU bound by the configured size and cleared by :func:`clear_caches`
    (*owns*: close values on eviction, see :class:`_LRU`)."""
    lru = _LRU(_maxsize, owns)
    with _registry_lock:
        _registry.add(lru)
    return lru


def _plan_cache() -> _LRU:
    try:
        return _local.plans
    except AttributeError:
        lru = _local.plans = new_lru()
        return lru


def cached_plan(p: Any) -> Any:
    """This thread's cached plan of *p*, or None (a hit moves it to the recent end)."""
    return _plan_cache().get(p)


# -- device memory that call entries read ---------------------------------------------------------
#: how many arrays a device cache lets go of before it synchronizes their devices and drops them
PENDING_LIMIT = 16


def _device_sync(rt: Any) -> None:
    rt.cudaDeviceSynchronize()


class DeviceCache(_LRU):
    """A process-wide cache of small device arrays that launches read by pointer (the
    attention's ALiBi slopes and packed lengths, the filled vectors of the norms and the paged
    attention): in the registry, so :func:`clear_caches` empties it and :func:`cache_info`
    counts it, and bounded by its own *maxsize* (:func:`set_cache_size` bounds the plan and
    call caches, not these). A value is a device array (``device``, ``nbytes``) or a tuple
    whose first item is one.

    A launch queued on any stream may still read an array the cache lets go of, and its
    memory would go back to the allocator at once. So an evicted or cleared value waits:
    once :data:`PENDING_LIMIT` wait (or at :meth:`clear`), each of their devices is
    synchronized once (``cudaDeviceSynchronize``: every queued launch has finished), and only
    then are they dropped. A put happens on a cache miss, which uploads and synchronizes
    anyway; a hit takes no lock but the cache's own and makes no CUDA call.
    """

    __slots__ = ("lock", "name", "pending")

    def __init__(self, name: str, maxsize: int):
        super().__init__(maxsize, owns=False)
        self.name = name
        self.lock = threading.Lock()
        self.pending: list[Any] = []

    def get(self, key: Any) -> Any:
        with self.lock:
            return _LRU.get(self, key)

    def put(self, key: Any, value: Any) -> None:
        with self.lock:
            data = self.data
            data[key] = value
            data.move_to_end(key)
            while len(data) > self.maxsize > 0:
                self.pending.append(data.popitem(last=False)[1])
            full = len(self.pending) >= PENDING_LIMIT
        if full:
            self.release()

    def pop(self, key: Any) -> None:
        with self.lock:
            value = self.data.pop(key, None)
            if value is not None:
                self.pending.append(value)

    def clear(self) -> None:
        with self.lock:
            self.pending.extend(self.data.values())
            self.data.clear()
        self.release()

    def release(self) -> None:
        """Drop the values let go of, once every launch queued on their devices finished."""
        with self.lock:
            victims, self.pending = self.pending, []
        for device in sorted({_array(v).device for v in victims}):
            _cuda.call_on_device(device, _device_sync)  # best effort: never raises
        del victims

    @property
    def nbytes(self) -> int:
        """Bytes of device memory held, the values waiting to be dropped included."""
        with self.lock:
            held = [*self.data.values(), *self.pending]
        return sum(_array(v).nbytes for v in held)


def _array(value: Any) -> Any:
    return value[0] if isinstance(value, tuple) else value


_Cache = TypeVar("_Cache", bound=_LRU)

#: the device caches by name (one each: they are process-wide)
_device_caches: dict[str, DeviceCache] = {}


def _named(
    table: dict[str, _Cache], cls: Callable[[str, int], _Cache], name: str, maxsize: int
) -> _Cache:
    """*table*'s cache *name*, a *cls* made and registered on first use."""
    with _registry_lock:
        cache = table.get(name)
        if cache is None:
            cache = table[name] = cls(name, maxsize)
            _registry.add(cache)
    return cache


def device_cache(name: str, maxsize: int) -> DeviceCache:
    """The registered device cache *name* (made on first use, bounded to *maxsize* values)."""
    return _named(_device_caches, DeviceCache, name, maxsize)


class HostCache(_LRU):
    """A process-wide cache of host values that grows with the inputs (the packed attention's
    checked lengths, the fused batch norm's reserve sizes): in the registry, so
    :func:`clear_caches` empties it and :func:`cache_info` counts it (``host_entries``), and
    bounded by its own *maxsize*. Reads are one dict lookup (:meth:`lookup`, no reordering);
    puts and clears take the cache's lock."""

    __slots__ = ("lock", "name")

    def __init__(self, name: str, maxsize: int):
        super().__init__(maxsize, owns=False)
        self.name = name
        self.lock = threading.Lock()

    def lookup(self, key: Any, default: Any = None) -> Any:
        """The value of *key*, else *default* (the LRU order is left as is)."""
        return self.data.get(key, default)

    def put(self, key: Any, value: Any) -> None:
        with self.lock:
            _LRU.put(self, key, value)

    def clear(self) -> None:
        with self.lock:
            _LRU.clear(self)


_host_caches: dict[str, HostCache] = {}


def host_cache(name: str, maxsize: int) -> HostCache:
    """The registered host cache *name* (made on first use, bounded to *maxsize* values)."""
    return _named(_host_caches, HostCache, name, maxsize)


class CacheInfo(NamedTuple):
    hits: int
    misses: int
    builds: int
    currsize: int
    maxsize: int
    search_seconds: float
    device_entries: int = 0
    device_bytes: int = 0
    host_entries: int = 0


def cache_info() -> CacheInfo:
    """Counters of the convolution plan cache (all threads): calls served by a cached plan
    (``hits``), calls that searched (``misses``), plans built, current size (this thread),
    bound, and total seconds spent searching; and the device arrays that launches read from
    the device caches (:class:`DeviceCache`: ALiBi slopes, packed lengths, filled vectors):
    how many, and their bytes; and the values of the host caches that grow with the inputs
    (:class:`HostCache`)."""
    with _registry_lock:
        caches = list(_device_caches.values())
        hosts = list(_host_caches.values())
    return CacheInfo(
        stats.hits,
        stats.misses,
        stats.builds,
        len(_plan_cache()),
        _maxsize,
        stats.search_seconds,
        sum(len(c) for c in caches),
        sum(c.nbytes for c in caches),
        sum(len(c.data) for c in hosts),
    )


def clear_caches() -> None:
    """Drop every cached plan, variant pack and call entry in every thread, and the device
    caches' arrays (once their devices finished the work queued on them); reset counters."""
    stats.clears += 1
    with _registry_lock:
        lrus = list(_registry)
    for lru in lrus:
        lru.clear()
    stats.hits = stats.misses = stats.builds = 0
    stats.search_seconds = 0.0


def set_cache_size(maxsize: int) -> None:
    """Bound every plan cache to *maxsize* entries (0: unbounded); shrinks existing ones."""
    global _maxsize
    if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 0:
        raise ValueError(f"maxsize must be an int >= 0, got {maxsize!r}")
    _maxsize = maxsize
    with _registry_lock:
        lrus = list(_registry)
    for lru in lrus:
        if isinstance(lru, (DeviceCache, HostCache)):
            continue  # bounded by its own size
        lru.maxsize = maxsize
        while maxsize and len(lru.data) > maxsize:
            lru._close(lru.data.popitem(last=False)[1])


# -- search ----------------------------------------------------------------------------------------
def _fail(p: Any, tried: list[str], oom: list[int]) -> errors.CudnnError:
    """The search's error: out of memory when every engine tried failed for its workspace
    (*oom*: the sizes that could not be allocated; ``requested`` the smallest of them)."""
    detail = f"no cuDNN engine could run the {p.what()}; tried: " + (
        "; ".join(tried) or "nothing (the heuristics returned no engine)"
    )
    api = getattr(p, "api", None) or "dnn_conv"
    if oom and all("workspace" in t or "alloc" in t for t in tried):
        exc = errors.OutOfMemoryError(4004, api, detail)
        exc.requested, exc.free, exc.total = min(oom), -1, -1
        exc.device = getattr(p, "device", -1)
        return exc
    return errors.NotSupportedError(3000, api, detail)


def _candidates(p: Any, graph: BackendDescriptor, tried: list[str], first_only: bool):
    """Yield (rank, cfg, info) acceptable under the numerics policy, best first: INSTANT rank 0
    alone (*first_only*), then the other INSTANT configs, then the FALLBACK ones.

    The heuristics' order is kept, as PyTorch and cudnn-frontend keep it: deferring engines that
    compile at run time (behaviour note RUNTIME_COMPILATION) saves their one-off NVRTC compile
    on a new shape but, measured on an H200, left depthwise convolutions on a kernel 25% slower
    than the specialised one cuDNN ranks first.
    """

    def screen(rank: int, cfg: BackendDescriptor, mode: BackendHeurMode):
        try:
            info = engine_info(cfg)
        except errors.CudnnError as exc:
            tried.append(f"{mode.name} config {rank}: {errors.status_name(exc.status)}")
            return None
        why = rejection(p, info)
        if why:
            tried.append(f"engine {info.index}: {why}")
            return None
        return rank, cfg, info

    modes = getattr(p, "heur_modes", None) or (
        BackendHeurMode.MODE_INSTANT,
        BackendHeurMode.MODE_FALLBACK,
    )
    for mode in modes:
        try:
            heur = heuristics(graph, mode)
        except errors.CudnnError as exc:
            tried.append(f"heuristics {mode.name}: {errors.status_name(exc.status)}")
            continue
        try:
            start = 0
            if mode == modes[0] and first_only:
                # the rank-0 config is usually the answer: fetching it alone skips making
                # descriptors for the (often 30-40) others
                try:
                    first = heuristic_configs(heur, 1)[:1]
                except errors.CudnnError:
                    first = []
                for cfg in first:
                    start = 1
                    got = screen(0, cfg, mode)
                    if got:
                        yield got
            try:
                cfgs = heuristic_configs(heur, None)
            except errors.CudnnError as exc:
                tried.append(f"heuristics {mode.name}: {errors.status_name(exc.status)}")
                continue
            for rank in range(start, len(cfgs)):
                got = screen(rank, cfgs[rank], mode)
                if got:
                    yield got
        finally:
            heur.close()


def engine_plans(p: Any, handle: Any) -> list[tuple[EngineInfo, GraphPlan | str]]:
    """Every engine config the heuristics (INSTANT, then FALLBACK) return for the graph key *p*
    that the numerics policy allows, built: ``(info, GraphPlan)``, or ``(info, why not)`` when
    it did not build. For tests and diagnostics (each engine checked against a reference)."""
    graph = p.build_graph(handle)
    out: list[tuple[EngineInfo, GraphPlan | str]] = []
    for _rank, cfg, info in _candidates(p, graph, [], first_only=False):
        try:
            plan, ws = _build_plan(cfg, handle)
        except errors.CudnnError as exc:
            out.append((info, errors.status_name(exc.status)))
            continue
        out.append((info, GraphPlan(plan, graph, handle, info, ws, p.uids, p.label)))
    return out


def _build_plan(cfg: BackendDescriptor, handle: Any) -> tuple[BackendDescriptor, int]:
    plan = BackendDescriptor(BackendDescriptorType.EXECUTION_PLAN_DESCRIPTOR)
    try:
        plan.set(A.EXECUTION_PLAN_HANDLE, T.HANDLE, handle.ptr)
        plan.set(A.EXECUTION_PLAN_ENGINE_CONFIG, T.BACKEND_DESCRIPTOR, cfg)
        plan.finalize()
        ws = int(plan.get(A.EXECUTION_PLAN_WORKSPACE_SIZE, T.INT64, 1)[0])
    except BaseException:
        plan.close()
        raise
    return plan, ws


class NoEngine:
    """A cached record that no engine runs a graph key (for keys that allow it, ``negative``):
    another spelling of the same call then does not search again. ``reason`` says why."""

    __slots__ = ("reason",)
    kind = "none"
    fused = False
    workspace = 0

    def __init__(self, reason: str):
        self.reason = reason

    def describe(self) -> str:
        return self.reason

    def close(self) -> None:
        pass


def plan(key: Any, handle: Any, given_ptrs: Sequence[int] | None = None) -> Any:
    """The plan of the graph key *key* in this thread: cached, or made on *handle* and cached.

    The one entry to plans. On a miss the key's own ``make_plan(handle, given_ptrs)`` runs
    first when it has one (a convolution's pinned legacy algorithm; None: search), then the
    search (:func:`search`). A key with ``negative = True`` gets a :class:`NoEngine` (cached)
    instead of the search's error. A failed search is never cached. *given_ptrs* are the
    caller's data pointers (``uids`` order, None where the key must not use them), which
    timing policies may run on (``key.timing_buffers``). The engine alone keeps the counters
    of :func:`cache_info`.
    """
    lru = _plan_cache()
    found = lru.get(key)
    if found is not None:
        stats.hits += 1
        return found
    stats.misses += 1
    return _make(lru, key, handle, given_ptrs)


def built() -> None:
    """Count a plan that a key's ``make_plan`` built itself (a convolution's legacy algorithm);
    the search counts its own."""
    stats.builds += 1


def served_cached() -> None:
    """Count a call served by a plan that its call entry already held (a call-cache hit never
    looks the plan up, but it is a cache hit of the plan all the same)."""
    stats.hits += 1


def _make(lru: _LRU, key: Any, handle: Any, given_ptrs: Sequence[int] | None) -> Any:
    t0 = time.perf_counter()
    try:
        found = None
        make = getattr(key, "make_plan", None)
        if make is not None:
            found = make(handle, given_ptrs)
        if found is None:
            try:
                found = search(key, handle, given_ptrs)
            except errors.CudnnError as exc:  # AllocationError included
                if not getattr(key, "negative", False):
                    raise
                found = NoEngine(f"no engine: {exc}")
    finally:
        stats.search_seconds += time.perf_counter() - t0
    lru.put(key, found)
    if _config.config.verbose:
        print(f"pycudnn: {key.what()} -> {found.describe()}", file=sys.stderr)
    return found


def alias(key: Any, handle: Any, given_ptrs: Sequence[int] | None = None) -> Any:
    """The plan of *key* for use under another key (e.g. a pinned legacy algorithm that cannot
    run here falls back to the heuristics' plan): cached under *key* too, not counted again."""
    lru = _plan_cache()
    found = lru.get(key)
    if found is not None:
        return found
    return _make(lru, key, handle, given_ptrs)


def search(key: Any, handle: Any, given_ptrs: Sequence[int] | None = None) -> GraphPlan:
    """Build the plan for the graph key *key*: the first engine that builds (``algo`` other than
    ``'time'``), or the fastest of up to :data:`BENCHMARK_LIMIT` (``algo == 'time'``), timed on
    the buffers the key supplies (``key.timing_buffers(handle, given_ptrs) -> (ptrs,
    keepalive)``; its scratch tensors, ``key.scratch``, carved from the workspace).

    Workspaces come from the handle (grow-only, per stream); an engine whose workspace cannot
    be allocated is skipped and caps later candidates' size.
    """
    timing = None
    if key.algo == "time":

        def timing(built: list[GraphPlan]) -> list[float]:
            return _time(key, built, handle, given_ptrs)

    return _search(key, handle, timing)


def _search(
    key: Any, handle: Any, timing: Callable[[list[GraphPlan]], list[float]] | None
) -> GraphPlan:
    graph = key.build_graph(handle)
    tried: list[str] = []
    oom: list[int] = []  # workspace sizes that could not be allocated
    cap = key.workspace_limit if key.workspace_limit >= 0 else None
    built: list[GraphPlan] = []
    want = BENCHMARK_LIMIT if timing is not None else 1
    for _rank, cfg, info in _candidates(key, graph, tried, first_only=timing is None):
        if cap is not None and info.workspace > cap:
            tried.append(
                f"engine {info.index}: workspace {info.workspace} B over the limit {cap} B"
            )
            continue
        try:
            gp, ws = _build_plan(cfg, handle)
        except errors.CudnnError as exc:
            tried.append(f"engine {info.index}: {errors.status_name(exc.status)}")
            continue
        if cap is not None and ws > cap:
            gp.close()
            tried.append(f"engine {info.index}: workspace {ws} B over the limit {cap} B")
            continue
        if ws:
            try:
                handle.workspace(ws)
            except MemoryError as exc:  # AllocationError is a MemoryError too
                gp.close()
                oom.append(ws)
                cap = ws - 1  # smaller candidates only from now on
                tried.append(
                    f"engine {info.index}: workspace of {ws} B could not be allocated ({exc})"
                )
                continue
        stats.builds += 1
        built.append(GraphPlan(gp, graph, handle, info, ws, key.uids, key.label))
        if len(built) >= want:
            break
    if not built:
        raise _fail(key, tried, oom)
    if timing is None or len(built) == 1:
        return built[0]
    times = timing(built)
    best = min(range(len(built)), key=times.__getitem__)
    for i, candidate in enumerate(built):
        if i != best:
            candidate.close()
            candidate.plan.close()
    return built[best]


def _time(
    key: Any, built: list[GraphPlan], handle: Any, given_ptrs: Sequence[int] | None
) -> list[float]:
    """Each candidate's milliseconds per run on the key's timing buffers; the packs made for
    those buffers are dropped afterwards (they are of no further use)."""
    ptrs, keepalive = key.timing_buffers(handle, given_ptrs)
    scratch = getattr(key, "scratch", ())
    try:
        return time_plans(built, lambda gp: gp.launch(ptrs, scratch), handle.stream)
    finally:
        for gp in built:
            gp.close()
        del keepalive


def remember(p: Any, value: Any) -> None:
    """Cache *value* for the graph key *p* in this thread (e.g. a record that no engine runs it,
    so that another spelling of the call does not search again); it needs a ``close()``."""
    _plan_cache().put(p, value)


def evict(p: Any) -> None:
    """Forget the plan of *p* in this thread (after it failed to run)."""
    lru = _plan_cache()
    plan = lru.data.pop(p, None)
    if plan is not None:
        plan.close()


def time_plans(
    plans: Sequence[GraphPlan], run: Callable[[GraphPlan], None], stream: int
) -> list[float]:
    """Milliseconds per call of each plan, by CUDA events on *stream* (min over repeats).

    Each repeat times a block of back-to-back runs (about ``_TIMING_BLOCK_MS``, at least
    ``_TIMING_MIN_RUNS``): timing single calls ranked 15-25 us kernels by their launch gaps and
    picked an engine 24% slower back-to-back than PyTorch's choice (H200, depthwise dgrad).
    """
    rt, check = _cuda.runtime(), _cuda.check
    start = check(rt.cudaEventCreate(), "cudaEventCreate")
    stop = check(rt.cudaEventCreate(), "cudaEventCreate")
    out: list[float] = []
    try:
        for gp in plans:
            try:
                for _ in range(_TIMING_WARMUP):
                    run(gp)
                runs = 1  # the first block (one run) sizes the others
                best = float("inf")
                for _ in range(_TIMING_REPEATS + 1):
                    check(rt.cudaEventRecord(start, stream), "cudaEventRecord")
                    for _ in range(runs):
                        run(gp)
                    check(rt.cudaEventRecord(stop, stream), "cudaEventRecord")
                    check(rt.cudaEventSynchronize(stop), "cudaEventSynchronize")
                    per_run = check(rt.cudaEventElapsedTime(start, stop), "cudaEventElapsedTime")
                    per_run /= runs
                    if runs > 1:
                        best = min(best, per_run)
                    else:
                        runs = int(_TIMING_BLOCK_MS / max(per_run, 1e-3))
                        runs = max(_TIMING_MIN_RUNS, min(_TIMING_MAX_RUNS, runs))
            except errors.CudnnError:
                best = float("inf")  # a plan that fails to run never wins
            out.append(best)
    finally:
        rt.cudaEventDestroy(start)
        rt.cudaEventDestroy(stop)
    return out
