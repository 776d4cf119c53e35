"""Batch norm's scale folded into many convolution weights in **one launch** (imports torch):
pycudnn's own kernel (:mod:`pycudnn._nvrtc`) for :mod:`.region_folds`.

Folding a region's batch norms into its convolutions multiplies each weight, row by output
channel, by a float32 scale and rounds the product to the data's dtype once. torch does that
with one launch per weight, and for a bfloat16 or float16 weight times a float32 scale into a
half-precision output its kernel is the unvectorized mixed-dtype broadcast one: 5.6 µs each on
an H200, 295 of the 846 µs of a captured ResNet-50 replay at batch 8 (docs/BENCHMARKS.md). Here
one kernel takes a table of up to :data:`MAX_JOBS` weights (by value: the table is the kernel's
parameter block, so a CUDA graph capture keeps it with the launch) and computes, per element,
``out[i] = round(float(w[i]) * scale[at + i / k])`` with ``k`` the weight's elements per output
channel -- torch's float32 multiply and its round-to-nearest-even, bit for bit.

A weight it does not take (float64, another layout than its output's, another device, over
2**31 elements, a device before Volta) is left to the caller, as is everything where the
kernel cannot be compiled or loaded (no NVRTC; the reason is kept in ``SOURCE.failed``) or,
inside a CUDA graph capture, was not loaded yet (loading is no capturable step; the eager
warm-up before a capture loads it).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch

from .._nvrtc import Source

__all__ = ["ENABLED", "MAX_JOBS", "SOURCE", "fold_weights", "rows"]

#: weights per launch: the table is passed by value, and 120 entries of 32 bytes and the
#: scale's address stay under the 4 KiB every CUDA driver takes as a kernel's parameters
MAX_JOBS = 120
#: False sends every weight back to the caller (torch's multiply): tests compare the two
ENABLED = True
_BLOCK = 256
_MAX_BLOCKS = 512  # per weight: a grid-stride loop does the rest

_KINDS = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}

_TEXT = r"""
typedef unsigned short u16;
struct Job { unsigned long long w, out; unsigned n, k, at, pad; };
struct Jobs { Job job[MAX_JOBS]; };

__device__ __forceinline__ float ld_f32(unsigned long long p, unsigned i) {
    return ((const float *)p)[i];
}
__device__ __forceinline__ float ld_f16(unsigned long long p, unsigned i) {
    u16 v = ((const u16 *)p)[i]; float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
    return f;
}
__device__ __forceinline__ float ld_bf16(unsigned long long p, unsigned i) {
    return __uint_as_float(((unsigned)((const u16 *)p)[i]) << 16);
}
__device__ __forceinline__ void st_f32(unsigned long long p, unsigned i, float f) {
    ((float *)p)[i] = f;
}
__device__ __forceinline__ void st_f16(unsigned long long p, unsigned i, float f) {
    u16 v;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(v) : "f"(f));
    ((u16 *)p)[i] = v;
}
/* round to nearest even, as torch's float -> bfloat16 (any architecture) */
__device__ __forceinline__ void st_bf16(unsigned long long p, unsigned i, float f) {
    unsigned u = __float_as_uint(f);
    u16 v = (f != f) ? (u16)0x7fc0 : (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    ((u16 *)p)[i] = v;
}

#define FOLD(IN, OUT)                                                                      \
extern "C" __global__ void fold_##IN##_##OUT(const __grid_constant__ Jobs jobs,          \
                                             const float *__restrict__ scale) {           \
    const Job &j = jobs.job[blockIdx.y];                                                  \
    const float *s = scale + j.at;                                                        \
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < j.n;                     \
         i += gridDim.x * blockDim.x)                                                     \
        st_##OUT(j.out, i, ld_##IN(j.w, i) * s[i / j.k]);                                 \
}
FOLD(f16, f16) FOLD(f16, bf16) FOLD(f16, f32)
FOLD(bf16, f16) FOLD(bf16, bf16) FOLD(bf16, f32)
FOLD(f32, f16) FOLD(f32, bf16) FOLD(f32, f32)
""".replace("MAX_JOBS", str(MAX_JOBS))

#: the kernels' source, compiled per architecture on first use
SOURCE = Source("pycudnn_fold.cu", _TEXT)


class _Job(ctypes.Structure):
    _fields_ = [
        ("w", ctypes.c_uint64),
        ("out", ctypes.c_uint64),
        ("n", ctypes.c_uint32),
        ("k", ctypes.c_uint32),
        ("at", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    ]


class _Jobs(ctypes.Structure):
    _fields_ = [("job", _Job * MAX_JOBS)]


_ARCH: dict[int, int] = {}


def _arch(index: int) -> int:
    a = _ARCH.get(index)
    if a is None:
        major, minor = torch.cuda.get_device_capability(index)
        a = _ARCH[index] = major * 10 + minor
    return a


def rows(t: torch.Tensor) -> tuple[torch.Tensor, bool] | None:
    """*t* as ``(out channels, rest)`` in its memory order, and whether that order is
    channels-last's (else C order); None for another layout."""
    if t.is_contiguous():
        return t.view(t.shape[0], -1), False
    if t.dim() in (4, 5):
        p = t.permute(0, *range(2, t.dim()), 1)
        if p.is_contiguous():
            return p.view(t.shape[0], -1), True
    return None


def _takes(w: torch.Tensor, out: torch.Tensor, dev: torch.device) -> bool:
    if w.device != dev or out.device != dev:
        return False
    if w.dtype not in _KINDS or out.dtype not in _KINDS or not 0 < w.numel() < 2**31:
        return False
    a, b = rows(w), rows(out)
    return a is not None and b is not None and a[1] == b[1] and w.shape == out.shape


def fold_weights(
    weights: Sequence[torch.Tensor],
    scale: torch.Tensor,
    outs: Sequence[torch.Tensor],
    stream: int,
) -> list[int]:
    """``outs[i] = weights[i] * scale[rows of chain i]`` for the weights the kernel takes,
    launched on *stream* (``cudaStream_t`` of *scale*'s device, the current device); returns
    the indices of the chains it left to the caller (all of them where the kernel is off,
    unavailable, or inside a capture not yet loaded).

    *scale* is a packed float32 CUDA tensor, every chain's output channels one after another
    (chain ``i`` owns ``weights[i].shape[0]`` entries)."""
    n = len(weights)
    if not ENABLED or SOURCE.failed is not None or not scale.is_cuda or n == 0:
        return list(range(n))
    if scale.dtype != torch.float32 or not scale.is_contiguous():
        return list(range(n))
    dev = scale.device
    arch = _arch(dev.index)
    if arch < 70:  # (__grid_constant__ needs Volta)
        return list(range(n))
    capturing = torch.cuda.is_current_stream_capturing()
    left: list[int] = []
    groups: dict[str, list[tuple[int, int]]] = {}
    at = 0
    for i, (w, out) in enumerate(zip(weights, outs, strict=True)):
        c = int(w.shape[0])
        if _takes(w, out, dev):
            name = f"fold_{_KINDS[w.dtype]}_{_KINDS[out.dtype]}"
            if capturing and not SOURCE.loaded(arch, name):
                left.append(i)
            else:
                groups.setdefault(name, []).append((i, at))
        else:
            left.append(i)
        at += c
    try:
        with torch.cuda.device(dev.index):  # (the kernels launch in the current context)
            for name, jobs in groups.items():
                for start in range(0, len(jobs), MAX_JOBS):
                    batch = jobs[start : start + MAX_JOBS]
                    _launch(arch, name, batch, weights, outs, scale, stream)
    except Exception as exc:  # no NVRTC, no driver support: torch's multiply from now on
        SOURCE.failure(exc)
        return list(range(n))
    return left


def _launch(arch, name, jobs, weights, outs, scale, stream) -> None:
    table = _Jobs()
    most = 0
    for slot, (i, at) in enumerate(jobs):
        w, out = weights[i], outs[i]
        e = table.job[slot]
        e.w, e.out = w.data_ptr(), out.data_ptr()
        e.n = w.numel()
        e.k = e.n // int(w.shape[0])
        e.at = at
        most = max(most, e.n)
    s = ctypes.c_uint64(scale.data_ptr())
    args = (ctypes.c_void_p * 2)(ctypes.addressof(table), ctypes.addressof(s))
    blocks = min(_MAX_BLOCKS, -(-most // _BLOCK))
    grid = (blocks, len(jobs), 1)
    SOURCE.launch(arch, name, grid, (_BLOCK, 1, 1), ctypes.addressof(args), stream)
