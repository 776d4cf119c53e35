"""What every family module of :mod:`pycudnn.torch` shares (imports torch): torch's stream,
torch's memory, the tensor checks that pick pycudnn or torch's own implementation, and the
autocast state.

Memory: :class:`TorchMemoryResource` makes every pycudnn allocation a ``torch.empty`` of bytes on
the current stream; :func:`to_torch` turns a pycudnn array over such a block back into a torch
tensor without a copy (``as_strided`` over the block's tensor), and over any other memory through
DLPack.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..memory import DeviceArray, allocator
from . import _lean
from ._compile import PLAIN, compiling

__all__ = [
    "FIRST_USE",
    "bump_version",
    "FLOATS",
    "HALVES",
    "NORM_FLOATS",
    "NO_BF16",
    "TorchMemoryResource",
    "as_tuple",
    "autocast_dtype",
    "cuda_ok",
    "dense",
    "device_info",
    "format_of",
    "kept_bytes",
    "like",
    "no_broadcast",
    "raw_stream",
    "ready",
    "stream_of",
    "to_torch",
    "transforming",
    "use_torch_allocator",
]

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
NO_BF16 = (torch.float16, torch.float32, torch.float64)  # dropout, LRN, RNNs
NORM_FLOATS = (torch.float16, torch.bfloat16, torch.float32)  # layer and RMS norm
HALVES = (torch.float16, torch.bfloat16)  # fused attention


# -- streams and memory ----------------------------------------------------------------------------
def _current_stream_slow(device: int) -> int:
    return torch.cuda.current_stream(device).cuda_stream


#: ``cudaStream_t`` of torch's current stream on a device: torch's own fast accessor (the one
#: its compiled kernels use, ~0.3 us) where it exists, else the public ``current_stream``
raw_stream: Callable[[int], int] = getattr(
    torch._C, "_cuda_getCurrentRawStream", _current_stream_slow
)
_DEVICES: dict[int, torch.device] = {}
if hasattr(torch._C, "_cuda_getDevice"):  # torch's current device, without a CUDA call
    _lean.set_device_getter(torch._C._cuda_getDevice)


def _device(index: int) -> torch.device:
    dev = _DEVICES.get(index)
    if dev is None:
        dev = _DEVICES[index] = torch.device("cuda", index)
    return dev


_INFO: dict[int, tuple[int, int]] = {}


def device_info(index: int) -> tuple[int, int]:
    """``(compute capability as one number, e.g. 90; multiprocessors)`` of CUDA device *index*,
    asked once per device (pycudnn's own kernels compile per architecture and size their
    grids by the multiprocessors)."""
    got = _INFO.get(index)
    if got is None:
        p = torch.cuda.get_device_properties(index)
        got = _INFO[index] = (p.major * 10 + p.minor, p.multi_processor_count)
    return got


class _TorchBlock:
    """A :class:`~pycudnn.memory.allocator.Block` over a torch uint8 tensor: the memory goes back
    to torch's caching allocator when the last pycudnn array (and torch view) over it is gone."""

    __slots__ = ("device", "keep", "nbytes", "ptr", "stream", "tensor")

    def __init__(self, tensor: torch.Tensor, device: int, stream: int, keep: Any):
        self.tensor = tensor
        self.ptr = tensor.data_ptr()
        self.nbytes = tensor.numel()
        self.device = device
        self.stream = stream
        self.keep = keep


class TorchMemoryResource:
    """A pycudnn :class:`~pycudnn.memory.allocator.MemoryResource` over torch's CUDA caching
    allocator.

    ``allocate(nbytes, device, stream)`` is ``torch.empty(nbytes, dtype=torch.uint8)`` on
    *device* with *stream* made torch's current stream (it usually already is: the adapter
    passes torch's current stream to pycudnn). Handles' workspaces are the exception
    (:meth:`workspace`). The memory is then counted by
    ``torch.cuda.memory_allocated()``, freed and reused by torch's rules (stream-ordered on the
    allocation stream), and taken from a graph's private pool under ``torch.cuda.graph``.
    Install it with :func:`use_torch_allocator`.
    """

    def allocate(self, nbytes: int, device: int, stream: int, keep: Any = None) -> _TorchBlock:
        """*nbytes* of torch-owned memory on (*device*, *stream*)."""
        dev = _device(device)
        try:
            if stream == raw_stream(device):
                t = torch.empty(nbytes, dtype=torch.uint8, device=dev)
            else:
                with torch.cuda.stream(torch.cuda.ExternalStream(stream, device=dev)):
                    t = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        except torch.cuda.OutOfMemoryError as exc:
            raise allocator.allocation_error(
                nbytes, device, "torch.empty", f"torch's caching allocator is out of memory ({exc})"
            ) from None
        return _TorchBlock(t, device, stream, keep)

    def workspace(self, nbytes: int, device: int, stream: int) -> allocator.Allocation:
        """A handle's workspace: pycudnn's own ``cudaMalloc``, not torch memory (after
        ``torch.cuda.empty_cache()`` when the device is full). A workspace outlives the call
        that made it, and under CUDA graph trees (``torch.compile(mode="reduce-overhead")``)
        every torch allocation of a warm-up run lands in the graph's private pool, which
        refuses blocks that stay alive and are no output."""
        return _own(nbytes, device, stream)

    def __repr__(self) -> str:
        return "TorchMemoryResource()"


def _own(nbytes: int, device: int, stream: int) -> allocator.Allocation:
    """*nbytes* of pycudnn's own ``cudaMalloc`` (after ``torch.cuda.empty_cache()`` when the
    device is full), freed with ``cudaFree`` whatever stream is alive then."""
    try:
        return allocator.Allocation(nbytes, device, stream, free_sync=True)
    except MemoryError:
        torch.cuda.empty_cache()  # torch's cached blocks back to the device, then once more
        return allocator.Allocation(nbytes, device, stream, free_sync=True)


def kept_bytes(nbytes: int, device: int, stream: int) -> torch.Tensor:
    """A ``uint8`` tensor of *nbytes* over pycudnn's own memory, for results an op keeps between
    calls: under CUDA graph trees (``torch.compile(mode="reduce-overhead")``) every torch
    allocation of a warm-up run lands in the graph's private pool, which refuses blocks that stay
    alive and are no output (as for :meth:`TorchMemoryResource.workspace`). Freed when the
    tensor's last view goes. Not during a capture (``cudaMalloc`` is refused there)."""
    block = _own(nbytes, device, stream)
    arr = DeviceArray.from_ptr(
        block.ptr, (nbytes,), "uint8", device=device, stream=stream, owner=block, check=False
    )
    return torch.from_dlpack(arr)


_RESOURCE = TorchMemoryResource()
_AUTO = [True]  # install the resource on first use (until use_torch_allocator decides)
#: the same list, for the ops' hot paths: ``if FIRST_USE[0]: ready()`` skips the call after the
#: first use (ready() reads ``_AUTO`` itself, so a test that replaces it stays consistent)
FIRST_USE = _AUTO


def use_torch_allocator(enabled: bool = True) -> None:
    """Make pycudnn allocate through torch's caching allocator (or stop doing so).

    The adapter does this by itself on first use, unless a resource other than pycudnn's own
    caching allocator is installed then; calling this function settles the choice either way.
    With it, every pycudnn allocation in the process (outputs, staging copies, statistics,
    reserve spaces -- also of pycudnn calls made outside the adapter) but the handles'
    workspaces (:meth:`TorchMemoryResource.workspace`) is torch memory:
    ``torch.cuda.memory_allocated()`` counts it, ``torch.cuda.empty_cache()`` releases
    it, and CUDA-graph capture takes it from the graph's pool.

    Parameters
    ----------
    enabled : bool
        False restores pycudnn's own caching allocator (if the torch one is installed).
    """
    _AUTO[0] = False
    if enabled:
        allocator.set_memory_resource(_RESOURCE)
    elif allocator.memory_resource() is _RESOURCE:
        allocator.set_memory_resource(None)


#: ``bump_version(tensor)``: torch's ``increment_version`` where it exists (2.1+), as an in-place
#: op bumps its output's version (a saved copy's check then sees the change)
bump_version: Callable[[torch.Tensor], None] = getattr(
    torch.autograd.graph, "increment_version", lambda t: None
)


def ready() -> None:
    """First use: install torch's allocator unless the user chose otherwise."""
    if _AUTO[0]:
        _AUTO[0] = False
        if isinstance(allocator.memory_resource(), allocator.CachingAllocator):
            allocator.set_memory_resource(_RESOURCE)


_TORCH_DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "uint8": torch.uint8,
    "int8": torch.int8,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
}


def to_torch(a: Any) -> torch.Tensor:
    """A torch tensor over the memory of *a*, without a copy.

    Parameters
    ----------
    a : DeviceArray or torch.Tensor
        A pycudnn array (what the high-level functions return), or a tensor.

    Returns
    -------
    torch.Tensor
        Over a :class:`TorchMemoryResource` block: a view of the block's tensor (shape,
        strides and dtype of *a*; no DLPack round trip). Over any other memory:
        ``torch.from_dlpack(a)`` (which orders torch's current stream after *a*'s). A tensor
        is returned as it is.
    """
    if isinstance(a, torch.Tensor):
        return a
    base = getattr(a, "base", None)
    if type(base) is _TorchBlock:
        isz = a.dtype.itemsize
        off = a.ptr - base.ptr
        dt = _TORCH_DTYPES.get(a.dtype.name)
        if dt is not None and off % isz == 0 and base.nbytes % isz == 0:
            return base.tensor.view(dt).as_strided(
                a.shape, tuple(s // isz for s in a.strides), off // isz
            )
    return torch.from_dlpack(a)


def dense(t: torch.Tensor) -> torch.Tensor:
    """*t* when its elements are packed in C order or channels-last, else a contiguous copy
    (gradients arrive as expanded zero-stride views, which cuDNN refuses)."""
    if t.is_contiguous():
        return t
    nd = t.dim()
    if (nd == 4 and t.is_contiguous(memory_format=torch.channels_last)) or (
        nd == 5 and t.is_contiguous(memory_format=torch.channels_last_3d)
    ):
        return t
    return t.contiguous()


def format_of(t: torch.Tensor) -> torch.memory_format:
    """The memory format of dense *t*: channels-last when it is not C-contiguous (4-D or 5-D; as
    torch's convolution and pooling choose for their outputs), else C order."""
    if t.is_contiguous() or t.dim() not in (4, 5):
        return torch.contiguous_format
    return torch.channels_last if t.dim() == 4 else torch.channels_last_3d


def like(shape: tuple[int, ...], t: torch.Tensor) -> torch.Tensor:
    """A new tensor of *shape* (*t*'s rank) in dense *t*'s dtype, device and memory format."""
    return torch.empty(shape, dtype=t.dtype, device=t.device, memory_format=format_of(t))


def no_broadcast(t: torch.Tensor, unit_last: bool = False) -> torch.Tensor:
    """*t*, or a contiguous copy when it has a zero (broadcast) stride, which cuDNN refuses, or
    (*unit_last*) a last dim that is not contiguous."""
    if unit_last and t.stride(-1) != 1 and t.shape[-1] != 1:
        return t.contiguous()
    for n, st in zip(t.shape, t.stride(), strict=True):
        if st == 0 and n > 1:
            return t.contiguous()
    return t


#: whether a ``torch.func`` transform (vmap, grad, ...) is active: its wrapped tensors look
#: plain but have no storage either (torch's own implementation runs under them)
transforming: Callable[[], bool] = getattr(
    torch._C, "_are_functorch_transforms_active", lambda: False
)


def cuda_ok(x: Any, dtypes: tuple = FLOATS) -> bool:
    """*x* is a CUDA tensor of one of *dtypes*, outside ``torch.func`` transforms (else torch's
    own implementation runs). (While dynamo traces, the transforms are not asked about: the
    custom ops run then, on fake tensors.)"""
    return (
        type(x) in PLAIN and x.is_cuda and x.dtype in dtypes
        and (compiling() or not transforming())
    )  # fmt: skip


def stream_of(t: torch.Tensor) -> int:
    """``cudaStream_t`` of torch's current stream on *t*'s device."""
    return raw_stream(t.get_device())


def as_tuple(v: Any, nd: int) -> tuple[int, ...]:
    """*v* as *nd* ints (a scalar repeated, as torch's ``_ntuple``)."""
    return tuple(int(i) for i in v) if isinstance(v, (tuple, list)) else (int(v),) * nd


def autocast_dtype() -> torch.dtype | None:
    """The dtype of an enclosing ``torch.autocast('cuda')`` region (None outside one)."""
    try:
        if torch.is_autocast_enabled("cuda"):
            return torch.get_autocast_dtype("cuda")
    except TypeError:  # torch < 2.4: the argument-free CUDA forms
        if torch.is_autocast_enabled():
            return torch.get_autocast_gpu_dtype()
    return None
