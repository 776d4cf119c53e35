"""Batch norm folded into a fused region's convolutions for ``pycudnn::region_eval`` (imports
torch): the folds of all the region's chains in few launches, kept between calls while nothing
they come from changes, and made anew inside a CUDA-graph capture.

``region_eval`` takes each chain's raw parameters (convolution weight and bias, batch norm's
weight, bias, running mean and variance) and folds them here. Where the traced graph computed
the folds instead (inductor: about two kernels per chain), a compiled ResNet-50's default-mode
inference paid those ~100 launches every call (1.30-1.49x the compiled original); folds kept by
the op in torch memory measured 0.82-0.85x, but under ``mode="reduce-overhead"`` a tensor kept
from the warm-up run is a live block in the graph tree's private pool, which torch refuses, and
a replay must read the parameters of the moment (docs/BENCHMARKS.md). So:

* **not capturing**: the folds live in pycudnn's own memory (:func:`~._runtime.kept_bytes`,
  outside torch's allocator and its graph pools) and are recomputed, in place, when a tensor
  they come from changes (its data pointer or version counter);
* **capturing**: the folds are computed into a temporary of the capture, so every replay folds
  the parameters it reads: on CUDA in two launches of pycudnn's own kernels for all the chains
  (:mod:`.fold_kernel`: the per-channel vectors, then the weights), where torch's operations
  took about a dozen for the vectors and one per chain for the weights (torch's unvectorized
  mixed-dtype broadcast kernel, 5.6 µs each on an H200: 295 of the 846 µs of a ResNet-50's
  replay at batch 8, docs/BENCHMARKS.md). torch's operations remain the way where the kernels
  do not run (CPU tensors, float64, a layout they do not take, no NVRTC).

The arithmetic is :func:`~.fused.fold_params`' operation for operation (float32, float64 for
float64 data; rounded to the data's dtype once), so a compiled region gives the eager region's
numbers.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Sequence

import torch

from ._runtime import kept_bytes, stream_of
from .fold_kernel import fold_vectors, fold_weights, rows
from .program import ALIGN

__all__ = ["MAX_KEPT", "PER_CHAIN", "Folds", "fold"]

#: tensors per chain in ``region_eval``'s *params*: the convolution's weight and bias, batch
#: norm's weight, bias, running mean and running variance (the biases and batch norm's affine
#: parameters may be None)
PER_CHAIN = 6
#: kept folds per region (model copies share a region's spec; the oldest is dropped)
MAX_KEPT = 4


def _up(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class _Layout:
    """Where one region's folds lie in their arena: per chain the weight's ``(shape, strides,
    offset)`` in the data's memory format, and the biases of all chains one after another."""

    __slots__ = ("bias_at", "channels", "nbytes", "weights")

    def __init__(self, weights: Sequence[torch.Tensor], dtype: torch.dtype, fmt) -> None:
        self.weights: list[tuple] = []
        self.channels = [int(w.shape[0]) for w in weights]
        top = 0
        for w in weights:
            meta = torch.empty(tuple(w.shape), device="meta", memory_format=fmt)
            self.weights.append((tuple(meta.shape), meta.stride(), top))
            top += _up(w.numel() * dtype.itemsize)
        self.bias_at = top
        self.nbytes = top + _up(sum(self.channels) * dtype.itemsize)

    def views(self, arena: torch.Tensor, dtype: torch.dtype) -> tuple[list, list, torch.Tensor]:
        """The weights', the biases' and all biases' tensors over *arena* (no copy)."""
        isz = dtype.itemsize
        ws = []
        for shape, stride, off in self.weights:
            n = (sum((k - 1) * s for k, s in zip(shape, stride, strict=True)) + 1) * isz
            ws.append(arena[off : off + n].view(dtype).as_strided(shape, stride))
        total = sum(self.channels)
        every = arena[self.bias_at : self.bias_at + total * isz].view(dtype)
        return ws, list(every.split(self.channels)), every


class Folds:
    """One region's folds for one model (its first weight's address), dtype and memory format:
    the layout, and where kept, the arena, its views and what they were computed from."""

    __slots__ = ("arena", "biases", "every", "layout", "sources", "weights")

    def __init__(self, layout: _Layout) -> None:
        self.layout = layout
        self.arena: torch.Tensor | None = None
        self.weights: list[torch.Tensor] = []
        self.biases: list[torch.Tensor] = []
        self.every: torch.Tensor | None = None
        self.sources: tuple = ()


_PTR = torch.Tensor.data_ptr
_VERSION = operator.attrgetter("_version")


def _sources(params: Sequence[torch.Tensor | None]) -> tuple:
    """What the folds are computed from: the tensors' addresses and version counters (``map``
    over C callables: about half the time of a generator per tensor, 265 tensors a ResNet-50)."""
    present = [t for t in params if t is not None]
    return tuple(map(_PTR, present)), tuple(map(_VERSION, present))


def fold(
    store: OrderedDict,
    params: Sequence[torch.Tensor | None],
    eps: Sequence[float],
    x: torch.Tensor,
    fmt,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per chain the folded weight (in memory format *fmt*) and bias in *x*'s dtype, from
    *params* (:data:`PER_CHAIN` per chain) and *eps* (per chain); kept in *store* (a region's)
    between calls as the module's docstring says."""
    weights = params[0::PER_CHAIN]
    dtype = x.dtype
    key = (x.device, dtype, fmt, weights[0].data_ptr())
    got = store.get(key)
    if got is None:
        if len(store) >= MAX_KEPT:
            store.popitem(last=False)
        got = store[key] = Folds(_Layout(weights, dtype, fmt))
    if x.is_cuda and torch.cuda.is_current_stream_capturing():
        arena = torch.empty(got.layout.nbytes, dtype=torch.uint8, device=x.device)
        ws, bs, every = got.layout.views(arena, dtype)
        _compute(params, eps, ws, every, got.layout.channels)
        return ws, bs
    sources = _sources(params)
    if sources != got.sources:
        if got.arena is None:
            nbytes = got.layout.nbytes
            got.arena = (
                kept_bytes(nbytes, x.get_device(), stream_of(x))
                if x.is_cuda
                else torch.empty(nbytes, dtype=torch.uint8, device=x.device)
            )
            got.weights, got.biases, got.every = got.layout.views(got.arena, dtype)
        _compute(params, eps, got.weights, got.every, got.layout.channels)
        got.sources = sources
    return got.weights, got.biases


def _cat(ts: Sequence[torch.Tensor | None], sizes: list[int], fill: float, acc, like):
    """The per-chain vectors *ts* one after another, as a new tensor in *acc* (None where every
    one is None; a missing one filled with *fill*). One launch (two where *ts* are in another
    dtype): ``torch.cat`` promotes, exactly, to the widest dtype."""
    if all(t is None for t in ts):
        return None
    parts = [
        torch.full((n,), fill, dtype=acc, device=like.device) if t is None else t
        for t, n in zip(ts, sizes, strict=True)
    ]
    return torch.cat(parts).to(acc)


def _compute(params, eps, ws, every, sizes) -> None:
    """:func:`~.fused.fold_params` for every chain at once, into *ws* and *every*: on CUDA
    pycudnn's fold kernels (:mod:`.fold_kernel`, one launch for the vectors and one for the
    weights, bit for bit these operations), else torch's operations."""
    weights = params[0::PER_CHAIN]
    with torch.no_grad():
        s = stream_of(every) if every.is_cuda else 0
        scale = fold_vectors(params, eps, sizes, every, s, PER_CHAIN) if every.is_cuda else None
        if scale is None:
            scale = _vectors(params, eps, every, sizes)
        left = fold_weights(weights, scale, ws, s) if every.is_cuda else None
        parts = scale.split(sizes)
        for i in range(len(ws)) if left is None else left:  # what the kernel did not take
            w, part, out = weights[i], parts[i], ws[i]
            w2, o2 = rows(w), rows(out)
            if w2 is not None and o2 is not None and w2[1] == o2[1]:  # (2-D: cheaper indexing)
                torch.mul(w2[0], part.view(-1, 1), out=o2[0])
            else:
                torch.mul(w, part.view(-1, *(1,) * (w.dim() - 1)), out=out)


def _vectors(params, eps, every, sizes) -> torch.Tensor:
    """Every chain's scale (float32; float64 for float64 data) returned and its folded bias
    written into *every*, by torch's operations (about a dozen launches for all chains)."""
    dtype = every.dtype
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    _, cbs, gammas, betas, means, variances = (params[k::PER_CHAIN] for k in range(6))
    scale = _cat(variances, sizes, 0.0, acc, every)  # (new tensors: updated in place)
    if len(set(eps)) == 1:
        scale.add_(eps[0])
    else:
        for part, e in zip(scale.split(sizes), eps, strict=True):
            part.add_(e)
    scale.rsqrt_()
    gamma = _cat(gammas, sizes, 1.0, acc, every)
    if gamma is not None:
        scale.mul_(gamma)
    bias = _cat(means, sizes, 0.0, acc, every).neg_()
    cb = _cat(cbs, sizes, 0.0, acc, every)
    if cb is not None:
        bias.add_(cb)
    bias.mul_(scale)
    beta = _cat(betas, sizes, 0.0, acc, every)
    if beta is not None:
        bias.add_(beta)
    every.copy_(bias)
    return scale
