"""Batch norm folded into many convolutions in **two launches** (imports torch): pycudnn's own
kernels (:mod:`pycudnn._nvrtc`) for :mod:`.region_folds`, one for every chain's per-channel
vectors (:func:`fold_vectors`: the float32 scale ``rsqrt(var + eps) * gamma`` and the folded
bias ``(cb - mean) * scale + beta``, in torch's operations' order, each step rounded as theirs),
one for the weights (:func:`fold_weights`).

Folding a region's batch norms into its convolutions multiplies each weight, row by output
channel, by a float32 scale and rounds the product to the data's dtype once. torch does that
with one launch per weight, and for a bfloat16 or float16 weight times a float32 scale into a
half-precision output its kernel is the unvectorized mixed-dtype broadcast one: 5.6 µs each on
an H200, 295 of the 846 µs of a captured ResNet-50 replay at batch 8 (docs/BENCHMARKS.md). Here
one kernel takes a table of up to :data:`MAX_JOBS` weights (by value: the table is the kernel's
parameter block, so a CUDA graph capture keeps it with the launch) and computes, per element,
``out[i] = round(float(w[i]) * scale[at + i / k])`` with ``k`` the weight's elements per output
channel -- torch's float32 multiply and its round-to-nearest-even, bit for bit. The vectors'
kernel replaces about a dozen small torch launches (concatenations, the additions and products,
torch's ``rsqrt``, which is CUDA's ``rsqrtf`` as here) the same way.

A weight it does not take (float64, another layout than its output's, another device, over
2**31 elements, a device before Volta) is left to the caller, as is everything where the
kernel cannot be compiled or loaded (no NVRTC; the reason is kept in ``SOURCE.failed``) or,
inside a CUDA graph capture, has not run on that device yet (its first launch there loads it,
which is no capturable step): :func:`warm`, which a fused region's eager run calls, loads them
all, so a capture after the usual eager warm-up folds with them.

The weights' kernel takes 8 elements a thread in 16-byte accesses where a weight's rows are
whole vectors and both pointers 16-byte aligned (every ResNet convolution but the 3x7x7
stem), one element a thread otherwise; the arithmetic per element is the same.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable, Sequence

import torch

from .._nvrtc import ELEMENTS, Source
from ._runtime import device_info

__all__ = [
    "ENABLED",
    "MAX_JOBS",
    "MAX_VECS",
    "SOURCE",
    "fold_vectors",
    "fold_weights",
    "rows",
    "warm",
]

#: weights per launch: the table is passed by value, and 120 entries of 32 bytes and the
#: scale's address stay under the 4 KiB every CUDA driver takes as a kernel's parameters
MAX_JOBS = 120
#: chains per launch of the vectors' kernel: 60 entries of 56 bytes, under the same 4 KiB
MAX_VECS = 60
#: False leaves every fold to the caller (torch's operations): tests compare the two
ENABLED = True
_BLOCK = 256
_MAX_BLOCKS = 512  # per weight: a grid-stride loop does the rest

_KINDS = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}

_TEXT = (
    ELEMENTS
    + r"""
/* vec8: n and k multiples of 8 and both pointers 16-byte aligned: 8 elements a thread */
struct Job { unsigned long long w, out; unsigned n, k, at, vec8; };
struct Jobs { Job job[MAX_JOBS]; };

/* the product is one float32 multiply, rounded to the output's dtype once, in both paths */
#define FOLD(IN, OUT)                                                                      \
extern "C" __global__ void fold_##IN##_##OUT(const __grid_constant__ Jobs jobs,          \
                                             const float *__restrict__ scale) {           \
    const Job &j = jobs.job[blockIdx.y];                                                  \
    const float *s = scale + j.at;                                                        \
    if (j.vec8) {                                                                         \
        for (unsigned v = blockIdx.x * blockDim.x + threadIdx.x; v < j.n / 8;             \
             v += gridDim.x * blockDim.x) {                                               \
            unsigned i = v * 8;                                                           \
            float x[8];                                                                   \
            ld8_##IN(j.w, i, x);                                                          \
            float f = s[i / j.k];                                                         \
            for (int q = 0; q < 8; ++q)                                                   \
                x[q] = x[q] * f;                                                          \
            st8_##OUT(j.out, i, x);                                                       \
        }                                                                                 \
        return;                                                                           \
    }                                                                                     \
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < j.n;                     \
         i += gridDim.x * blockDim.x)                                                     \
        st_##OUT(j.out, i, ld_##IN(j.w, i) * s[i / j.k]);                                 \
}
FOLD(f16, f16) FOLD(f16, bf16) FOLD(f16, f32)
FOLD(bf16, f16) FOLD(bf16, bf16) FOLD(bf16, f32)
FOLD(f32, f16) FOLD(f32, bf16) FOLD(f32, f32)

/* batch norm's per-channel vectors: kinds 3 bits a vector (0 absent, 1 f32, 2 f16, 3 bf16) */
struct Vec {
    unsigned long long var, gamma, mean, cb, beta;
    unsigned at, c; float eps; unsigned kinds;
};
struct Vecs { Vec vec[MAX_VECS]; };

__device__ __forceinline__ float ldk(unsigned long long p, unsigned kind, unsigned i) {
    return kind == 1 ? ld_f32(p, i) : kind == 2 ? ld_f16(p, i) : ld_bf16(p, i);
}

/* scale = rsqrt(var + eps) [* gamma]; bias = (-mean [+ cb]) * scale [+ beta], in float32 and
   in region_folds' order (rounded at each step: no contraction into fma); an absent vector
   where another chain of the launch has one is a 1 or a 0, as torch's concatenation fills it */
#define VECTORS(OUT)                                                                       \
extern "C" __global__ void fold_vectors_##OUT(const __grid_constant__ Vecs vecs,          \
                                              float *__restrict__ scale, unsigned long long bias, \
                                              unsigned any) {                              \
    const Vec &v = vecs.vec[blockIdx.y];                                                  \
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < v.c;                     \
         i += gridDim.x * blockDim.x) {                                                   \
        unsigned kv = v.kinds & 7, kg = (v.kinds >> 3) & 7, km = (v.kinds >> 6) & 7;      \
        unsigned kc = (v.kinds >> 9) & 7, kb = (v.kinds >> 12) & 7;                       \
        float s = rsqrtf(__fadd_rn(ldk(v.var, kv, i), v.eps));                            \
        if (any & 1) s = __fmul_rn(s, kg ? ldk(v.gamma, kg, i) : 1.0f);                   \
        float b = -ldk(v.mean, km, i);                                                    \
        if (any & 2) b = __fadd_rn(b, kc ? ldk(v.cb, kc, i) : 0.0f);                      \
        b = __fmul_rn(b, s);                                                              \
        if (any & 4) b = __fadd_rn(b, kb ? ldk(v.beta, kb, i) : 0.0f);                    \
        scale[v.at + i] = s;                                                              \
        st_##OUT(bias, v.at + i, b);                                                      \
    }                                                                                     \
}
VECTORS(f16) VECTORS(bf16) VECTORS(f32)
""".replace("MAX_JOBS", str(MAX_JOBS)).replace("MAX_VECS", str(MAX_VECS))
)

#: the kernels' source, compiled per architecture on first use
SOURCE = Source("pycudnn_fold.cu", _TEXT)


class _Job(ctypes.Structure):
    _fields_ = [
        ("w", ctypes.c_uint64),
        ("out", ctypes.c_uint64),
        ("n", ctypes.c_uint32),
        ("k", ctypes.c_uint32),
        ("at", ctypes.c_uint32),
        ("vec8", ctypes.c_uint32),
    ]


class _Jobs(ctypes.Structure):
    _fields_ = [("job", _Job * MAX_JOBS)]


class _Vec(ctypes.Structure):
    _fields_ = [
        ("var", ctypes.c_uint64),
        ("gamma", ctypes.c_uint64),
        ("mean", ctypes.c_uint64),
        ("cb", ctypes.c_uint64),
        ("beta", ctypes.c_uint64),
        ("at", ctypes.c_uint32),
        ("c", ctypes.c_uint32),
        ("eps", ctypes.c_float),
        ("kinds", ctypes.c_uint32),
    ]


class _Vecs(ctypes.Structure):
    _fields_ = [("vec", _Vec * MAX_VECS)]


_CODES = {torch.float32: 1, torch.float16: 2, torch.bfloat16: 3}


#: ``(device, kernel)`` pairs launched outside a capture (so loaded into that device's context)
_WARM: set[tuple[int, str]] = set()


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
    the indices of the chains it left to the caller (all of them where the kernel is off or
    unavailable; inside a capture, those of a kernel that has not run on this device yet).

    *scale* is a packed float32 CUDA tensor, every chain's output channels one after another
    (chain ``i`` owns ``weights[i].shape[0]`` entries)."""
    n = len(weights)
    if not ENABLED or SOURCE.failed is not None or not scale.is_cuda or n == 0:
        return list(range(n))
    if scale.dtype != torch.float32 or not scale.is_contiguous():
        return list(range(n))
    dev = scale.device
    arch = device_info(dev.index)[0]
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
            if capturing and (dev.index, name) not in _WARM:
                left.append(i)
            else:
                groups.setdefault(name, []).append((i, at))
        else:
            left.append(i)
        at += c
    launches = (
        _weights_launch(name, jobs[start : start + MAX_JOBS], weights, outs, scale)
        for name, jobs in groups.items()
        for start in range(0, len(jobs), MAX_JOBS)
    )
    return left if _launch_all(dev.index, arch, stream, launches, capturing) else list(range(n))


def _launch_all(index: int, arch: int, stream: int, launches: Iterable, capturing: bool) -> bool:
    """Launch each ``(kernel name, grid, argument objects)`` of *launches* on *stream* in device
    *index*'s context (the arguments by their addresses, as ``cuLaunchKernel`` takes them); a
    kernel launched outside a capture is loaded there from then on (:data:`_WARM`). False where
    a launch failed (no NVRTC, no driver support): the kernels are off from then on, and the
    callers fold with torch's operations."""
    try:
        with torch.cuda.device(index):  # (the kernels launch in the current context)
            for name, grid, refs in launches:
                args = (ctypes.c_void_p * len(refs))(*map(ctypes.addressof, refs))
                SOURCE.launch(arch, name, grid, (_BLOCK, 1, 1), ctypes.addressof(args), stream)
                if not capturing:
                    _WARM.add((index, name))
    except Exception as exc:
        SOURCE.failure(exc)
        return False
    return True


def _weights_launch(name, jobs, weights, outs, scale) -> tuple[str, tuple, tuple]:
    """One launch of the weights' kernel *name* for *jobs* ``(chain, first row)``."""
    table = _Jobs()
    most = 0
    for slot, (i, at) in enumerate(jobs):
        w, out = weights[i], outs[i]
        e = table.job[slot]
        e.w, e.out = w.data_ptr(), out.data_ptr()
        e.n = w.numel()
        e.k = e.n // int(w.shape[0])
        e.at = at
        # 8 elements a thread, all of one row, in 16-byte accesses where the rows are whole
        # vectors and both pointers aligned; else one a thread (a stem's 3x7x7 rows)
        e.vec8 = int((e.n | e.k) & 7 == 0 and (e.w | e.out) & 15 == 0)
        most = max(most, e.n // 8 if e.vec8 else e.n)
    blocks = min(_MAX_BLOCKS, -(-most // _BLOCK))
    return name, (blocks, len(jobs), 1), (table, ctypes.c_uint64(scale.data_ptr()))


def warm(device: torch.device) -> None:
    """Load every fold kernel into *device*'s context with an empty launch (a job of no
    elements), outside a capture: a fused region's eager run calls it, so that a CUDA graph
    captured after that warm-up (``torch.cuda.graph``, ``make_graphed_callables``) folds with
    these kernels, not with torch's per-weight multiplies (without it: 53 launches, 290 µs of
    a captured ResNet-50's replay at batch 8 on an H200). Does nothing while capturing, where
    the kernels are off or failed, or once done for *device*."""
    if not ENABLED or SOURCE.failed is not None or device.type != "cuda":
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    names = [f"fold_{a}_{b}" for a in _KINDS.values() for b in _KINDS.values()]
    names += [f"fold_vectors_{k}" for k in _KINDS.values()]
    if all((index, n) in _WARM for n in names) or torch.cuda.is_current_stream_capturing():
        return
    arch = device_info(index)[0]
    if arch < 70:
        return
    jobs, vecs = _Jobs(), _Vecs()  # (zeroed: no elements, no channels; nothing is read)
    zero = ctypes.c_uint64(0)
    flags = ctypes.c_uint32(0)
    launches = (
        (name, (1, 1, 1), (vecs, zero, zero, flags) if "vectors" in name else (jobs, zero))
        for name in names
    )
    _launch_all(index, arch, torch.cuda.current_stream(index).cuda_stream, launches, False)


def _vector_ok(t: torch.Tensor | None, c: int, dev: torch.device) -> bool:
    return t is None or (
        t.device == dev and t.dtype in _CODES and t.shape == (c,) and t.is_contiguous()
    )


def fold_vectors(
    params: Sequence[torch.Tensor | None],
    eps: Sequence[float],
    sizes: Sequence[int],
    bias: torch.Tensor,
    stream: int,
    per_chain: int,
) -> torch.Tensor | None:
    """Every chain's float32 scale (returned, a new packed tensor) and its folded bias (into
    *bias*, packed, the data's dtype) from batch norm's vectors in *params* (*per_chain* a
    chain: convolution weight, its bias, batch norm's weight, bias, running mean, running
    variance; the biases and batch norm's affine parameters may be None), *eps* per chain,
    *sizes* the chains' channels: :mod:`.region_folds`' torch operations, bit for bit, in one
    launch per :data:`MAX_VECS` chains on *stream*. None (nothing launched) where the kernel
    does not take them all (a vector not 1-D contiguous float16/bfloat16/float32 on *bias*'s
    device, *bias* of another dtype) or cannot run, as :func:`fold_weights`."""
    if not ENABLED or SOURCE.failed is not None or not bias.is_cuda or bias.dtype not in _KINDS:
        return None
    dev = bias.device
    arch = device_info(dev.index)[0]
    name = f"fold_vectors_{_KINDS[bias.dtype]}"
    capturing = torch.cuda.is_current_stream_capturing()
    if arch < 70 or (capturing and (dev.index, name) not in _WARM):
        return None
    chains = []
    any_ = 0
    for i, c in enumerate(sizes):
        _, cb, gamma, beta, mean, var = params[i * per_chain : (i + 1) * per_chain]
        if (
            var is None
            or mean is None
            or not all(_vector_ok(t, c, dev) for t in (cb, gamma, beta, mean, var))
        ):
            return None
        any_ |= (gamma is not None) | (cb is not None) << 1 | (beta is not None) << 2
        chains.append((var, gamma, mean, cb, beta))
    scale = torch.empty(sum(sizes), dtype=torch.float32, device=dev)
    flags = ctypes.c_uint32(any_)
    ptrs = ctypes.c_uint64(scale.data_ptr()), ctypes.c_uint64(bias.data_ptr())

    def launches():
        for start in range(0, len(chains), MAX_VECS):
            table, most = _vec_table(chains, sizes, eps, start)
            grid = (-(-most // _BLOCK), min(MAX_VECS, len(chains) - start), 1)
            yield name, grid, (table, *ptrs, flags)

    return scale if _launch_all(dev.index, arch, stream, launches(), capturing) else None


_FIELDS = ("var", "gamma", "mean", "cb", "beta")


def _vec_table(chains: list, sizes: Sequence[int], eps: Sequence[float], start: int) -> tuple:
    """The vectors' kernel table for chains ``start:start + MAX_VECS`` and their most
    channels."""
    table = _Vecs()
    at = sum(sizes[:start])
    most = 0
    for slot, vecs in enumerate(chains[start : start + MAX_VECS]):
        e = table.vec[slot]
        c = sizes[start + slot]
        kinds = 0
        for j, (field, t) in enumerate(zip(_FIELDS, vecs, strict=True)):
            if t is not None:
                setattr(e, field, t.data_ptr())
                kinds |= _CODES[t.dtype] << (3 * j)
        e.at, e.c, e.eps, e.kinds = at, c, float(eps[start + slot]), kinds
        at += c
        most = max(most, c)
    return table, most
