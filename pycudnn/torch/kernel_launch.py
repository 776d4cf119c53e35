"""How pycudnn's own NVRTC kernels of the adapter launch (imports torch): one kernel bound to a
signature (:class:`KernelLaunch`, what a launch tape records and a program replays) and the eager
call that finds or makes it, launches it and records it (:func:`run_kernel`). The batch-norm
kernels (:mod:`.bn_kernel`) and the max-pooling kernels (:mod:`.pool_kernel`) launch this way.

A kernel's first launch in a CUDA context loads it, which a stream capture cannot do: a kernel
that has not run on a device outside a capture must not be launched inside one (:func:`warm`
says which have; the callers fall back to cuDNN's path there).
"""

from __future__ import annotations

import ctypes
import threading

import torch

from .._nvrtc import Source
from .._nvrtc import launch as launch_kernel
from . import _lean
from ._runtime import device_info

__all__ = ["BLOCK", "KernelLaunch", "run_kernel", "warm"]

#: threads per block unless a launch says otherwise
BLOCK = 256


class _Stream:
    """The stream the kernel launches of one thread go to: a program sets it before it runs
    (:meth:`~.program.Program.run` calls ``handle.set_stream``, as for a cuDNN handle)."""

    __slots__ = ("stream",)

    def __init__(self) -> None:
        self.stream = 0

    def set_stream(self, stream: int) -> None:
        self.stream = stream


_local = threading.local()


def _stream_box() -> _Stream:
    box = getattr(_local, "box", None)
    if box is None:
        box = _local.box = _Stream()
    return box


class KernelLaunch:
    """One kernel bound to a signature, as a launch tape records it: ``n_in`` input operands
    then the outputs, ``handle`` (the thread's stream box) and ``launch(pointers)`` (the
    operands' pointers in that order). The kernel's parameters are built once: per launch only
    the pointers are written into them. Used by one thread (its programs are per thread).

    Parameters
    ----------
    source : Source
        The translation unit the kernel is in.
    device : int
        The CUDA device it launches on (the current one when it launches).
    name : str
        The kernel.
    grid : tuple of int
        Blocks (x, y, z).
    params : sequence
        The kernel's parameters in order: an int is the operand whose pointer it takes (None:
        a null pointer), a ctypes value a constant.
    n_in : int
        How many operands are inputs (the rest are outputs).
    block : int
        Threads per block.
    """

    __slots__ = ("_args", "_block", "_cells", "_fn", "_grid", "_refs", "handle", "n_in")

    def __init__(
        self,
        source: Source,
        device: int,
        name: str,
        grid: tuple,
        params: list,
        n_in: int,
        block: int = BLOCK,
    ) -> None:
        arch, _ = device_info(device)
        self._fn = source.kernel(arch, name)
        self._grid = tuple(grid)
        self._block = (block, 1, 1)
        self._refs = [ctypes.c_uint64(0) if p is None or isinstance(p, int) else p for p in params]
        self._cells = tuple((self._refs[k], p) for k, p in enumerate(params) if isinstance(p, int))
        arr = (ctypes.c_void_p * len(self._refs))(*map(ctypes.addressof, self._refs))
        self._args = (arr, ctypes.addressof(arr))  # (the array kept alive with its address)
        self.handle = _stream_box()
        self.n_in = n_in

    def launch(self, ptrs: tuple) -> None:
        for cell, i in self._cells:
            cell.value = ptrs[i]
        launch_kernel(self._fn, self._grid, self._block, self._args[1], self.handle.stream)


#: bound launches per (thread, source, kernel, grid, block, constants): the eager calls' store
_STORE: dict[tuple, KernelLaunch] = {}
_STORE_MAX = 512
#: (device, source name, kernel) launched outside a capture: loaded in that device's context
_WARM: set[tuple[int, str, str]] = set()


def warm(source: Source, device: int, names: tuple[str, ...]) -> bool:
    """Whether every kernel of *names* in *source* has run on *device* outside a stream capture
    (so may run inside one)."""
    return all((device, source.name, n) in _WARM for n in names)


def run_kernel(
    source: Source,
    x: torch.Tensor,
    name: str,
    grid: tuple,
    params: list,
    ins: tuple,
    outs: tuple,
    stream: int,
    block: int = BLOCK,
) -> None:
    """Launch kernel *name* of *source* on *x*'s device over the operands ``ins + outs``
    (*params* as :class:`KernelLaunch` takes them, constants as ctypes values) on *stream*,
    *block* threads a block, and record it on the calling thread's tape."""
    dev = x.device.index
    consts = tuple(bytes(p) if isinstance(p, ctypes.Structure) else getattr(p, "value", p)
                   for p in params)  # fmt: skip
    key = (threading.get_ident(), source.name, dev, name, grid, block, consts)
    entry = _STORE.get(key)
    if entry is None:
        if len(_STORE) >= _STORE_MAX:
            _STORE.clear()
        entry = _STORE[key] = KernelLaunch(source, dev, name, grid, params, len(ins), block)
    tensors = ins + outs
    entry.handle.set_stream(stream)
    with torch.cuda.device(dev):
        entry.launch(tuple(t.data_ptr() for t in tensors))
    if (dev, source.name, name) not in _WARM and not torch.cuda.is_current_stream_capturing():
        _WARM.add((dev, source.name, name))
    _lean.tape_append(entry, tensors)
