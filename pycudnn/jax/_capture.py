"""Calls XLA may capture in its command buffers (CUDA graphs): the workspace each needs, measured
when the call is traced, so that XLA gives it as one more result (no JAX here).

XLA (jaxlib 0.11) runs a command buffer's first execution call by call (a warm-up: pycudnn's
plans and bound launches are made then), and afterwards records each custom call marked
compatible by calling its handler once on a stream that captures a CUDA graph, per set of
buffer addresses; then it replays the graph, with no Python per call. A capture cannot allocate,
and a workspace pycudnn kept per stream would be shared by calls that XLA may run concurrently
inside one graph. So the workspace of such a call is XLA's memory: a ``uint8`` result of the
call (its last), whose size this module measures when the call is traced, by running the call
once on zero-filled scratch memory of its operands' and results' sizes, on a stream of pycudnn's,
with the handles' workspace requests measured (:data:`pycudnn.handle.workspace_scope`). The
executor then serves every workspace request of the call from that result
(:class:`~._bound.CaptureExecutor`).

A call is capturable when that run launched one lean entry that takes the call's pointers: what
a hit of the bound launches replays, with nothing to allocate or stage. Any other call (a failed
run, a staged or multi-launch call, a shape-polymorphic trace, no GPU) runs its family's plain
target, which XLA runs outside its command buffers. The measurement is remembered per request,
shapes and ``pycudnn.config`` snapshot.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import _cuda, handle
from ..highlevel import _call
from ..memory import allocator
from . import _frame, _request

__all__ = ["enabled", "use_command_buffers", "workspace_bytes"]

_ALIGN = 256  # the scratch buffers' alignment (plans depend on the pointers' residue mod 16)
_LOCK = threading.Lock()
_enabled = True
_MEASURED: dict[tuple, int | None] = {}
_STREAMS: dict[int, int] = {}  # device -> pycudnn's stream for the measuring runs


def enabled() -> bool:
    """Whether calls traced now may be captured in XLA's command buffers."""
    return _enabled


def use_command_buffers(enabled: bool) -> bool:
    """Let XLA capture ``pycudnn.jax``'s calls in its command buffers (CUDA graphs), or not.

    On (the default), each call traced for a GPU whose workspace could be measured (see the
    module's docstring) goes through its family's capturable target, with its workspace as a
    result of the call: XLA's command buffers (``--xla_gpu_enable_command_buffer``, which
    includes custom calls by default) then replay it with no host work. Off, every call runs
    outside them, through the plain target. Applies to functions traced after the change
    (``jax.jit`` keeps what it traced).

    Parameters
    ----------
    enabled : bool

    Returns
    -------
    bool
        The previous setting.

    Raises
    ------
    TypeError
        *enabled* is not a bool.
    """
    global _enabled
    if type(enabled) is not bool:
        raise TypeError(f"use_command_buffers: enabled={enabled!r}; expected True or False")
    with _LOCK:
        previous, _enabled = _enabled, enabled
    return previous


def workspace_bytes(
    request: _request.Request,
    operands: Sequence[tuple[tuple[int, ...], Any]],
    results: Sequence[tuple[tuple[int, ...], Any]],
) -> int | None:
    """The workspace bytes a capturable call of *request* needs on *operands* and *results*
    (``(shape, dtype)`` each, concrete), measured once on the current GPU; None when the call
    is not capturable (see the module's docstring)."""
    shapes = tuple((tuple(s), np.dtype(d)) for s, d in (*operands, *results))
    key = (request, shapes, len(operands), _call.snapshot())
    try:
        return _MEASURED[key]
    except KeyError:
        pass
    try:
        nbytes = _measure(request, shapes, len(operands))
    except Exception:  # any failure: the call runs outside the command buffers, as before
        nbytes = None
    with _LOCK:
        _MEASURED[key] = nbytes
    return nbytes


def _stream(device: int) -> int:
    """pycudnn's stream of *device* for the measuring runs (non-blocking, kept for the
    process)."""
    s = _STREAMS.get(device)
    if s is None:
        with _LOCK:
            s = _STREAMS.get(device)
            if s is None:
                with _cuda.DeviceContext(device):
                    rt = _cuda.runtime()
                    made = rt.cudaStreamCreateWithFlags(1)  # cudaStreamNonBlocking
                    s = _STREAMS[device] = int(_cuda.check(made, "cudaStreamCreateWithFlags"))
    return s


def _measure(request: _request.Request, shapes: tuple, n_args: int) -> int | None:
    """Run *request* once on zero-filled scratch buffers of *shapes*; the largest workspace it
    asked for, or None when it did not run as one lean launch of the call's pointers."""
    device = _cuda.current_device()
    stream = _stream(device)
    codes = [_frame.ffi_code(d) for _s, d in shapes]
    dtypes = [d for _s, d in shapes]
    sizes = [
        int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        for (shape, _d), dt in zip(shapes, dtypes, strict=True)
    ]
    offsets, total = _layout(sizes)
    ptr, _mode = allocator.device_malloc(max(total, 1), device, stream, mode=allocator.SYNC)
    rt = _cuda.runtime()
    scope = handle.workspace_scope
    try:
        with _cuda.DeviceContext(device):
            _cuda.check(rt.cudaMemsetAsync(ptr, 0, max(total, 1), stream), "cudaMemsetAsync")
        bufs = [
            _frame.DeviceBuffer(ptr + off if n else 0, shape, dt, code)
            for (shape, _d), off, n, dt, code in zip(
                shapes, offsets, sizes, dtypes, codes, strict=True
            )
        ]
        _call.take_last_entry()  # forget an earlier call's entry
        given, scope.given, scope.peak = scope.given, None, 0
        try:
            request.run(bufs[:n_args], bufs[n_args:], stream)
            entry = _call.take_last_entry()
            peak = scope.peak
        finally:
            scope.given, scope.peak = given, -1
        if entry is None or not entry.lean or len(entry.spans) != len(shapes):
            return None
        return peak
    finally:
        _cuda.synchronize(stream, device)
        with _cuda.DeviceContext(device):
            rt.cudaFree(ptr)
        handle.get_handle(device).release_workspace(stream)


def _layout(sizes: Sequence[int]) -> tuple[list[int], int]:
    """Offsets of buffers of *sizes* bytes in one allocation, each :data:`_ALIGN`-aligned, and
    the allocation's bytes."""
    offsets = []
    total = 0
    for n in sizes:
        offsets.append(total)
        total += -(-n // _ALIGN) * _ALIGN
    return offsets, total
