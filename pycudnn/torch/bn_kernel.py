"""Batch norm's training forward and backward on channels-last half-precision data in pycudnn's
own kernels (imports torch), written for the memory traffic the work needs. A fused training
chain with a residual and a ReLU runs its batch norm, addition and ReLU on them where
:func:`~.fused_train.chain_path` says (large enough tensors: below, cuDNN's one fused kernel a
direction beats their three launches); ``bench/bn_chain.py`` times them against cuDNN's
(docs/BENCHMARKS.md).

cuDNN's fused batch-norm-(add-)ReLU training kernels (``batchnorm_fwtr_nhwc_semiPersist``,
``batchnorm_add_relu_bwtr_nhwc_semiPersist``) ran at about half the memory bandwidth of the
H200 on ResNet-50's shapes: 173 µs for a batch-64 256x56x56 forward with the residual, whose
reads and writes take 71 µs at the rate torch's addition of two such tensors runs. These
kernels do the work in passes that each stream the data once (a first cut, which loaded one
row a step and added the partial sums up one thread per channel, was slower than cuDNN's):

forward, ``out = act(x * scale + shift [+ z])``
    ``bn_stats``: per-channel sums of ``x - k`` and their squares (*k* the first row, a shift
    that keeps the sum of squares exact enough where the mean is far from zero) over a grid of
    row blocks (four a multiprocessor: one kept too few loads in flight to stream), partial
    sums per block; ``bn_finalize``: the mean, the inverse standard
    deviation (biased variance, as batch norm normalizes), the running statistics moved by the
    momentum with the unbiased variance (torch's), and ``scale = gamma * invstd``, ``shift =
    beta - mean * scale``; ``bn_apply``: one read of *x* (and *z*), one write, and the ReLU's
    mask, a bit per element (a sixteenth of a half-precision tensor, as cuDNN's reserve space).
backward, from the mask, the input and the statistics
    ``bn_grad_stats``: per-channel sums of ``g`` and ``g * (x - mean)`` (``g = dy`` masked by
    the ReLU); ``bn_grad_finalize``: ``dbeta``, ``dgamma`` and the three coefficients of ``dx =
    k_g * g + k_x * x + k_0``; ``bn_grad_apply``: ``dx`` (and ``dz = g`` for the residual).

Sums are float32 per thread and per block, float64 across blocks. The data is float16 or
bfloat16, channels-last (rows of *C* contiguous channels), *C* a multiple of 8 up to 2048, 16-byte
aligned; the per-channel vectors float32.
"""

from __future__ import annotations

import ctypes

import torch

from .._nvrtc import ELEMENTS, Source
from ._runtime import bump_version, device_info, stream_of
from .kernel_launch import run_kernel

__all__ = [
    "SOURCE",
    "fits",
    "mask_bytes",
    "takes",
    "train_backward",
    "train_forward",
]

_BLOCK = 256
#: threads of a finalize block (each adds up every stats block's partial sums of 32 channels)
_FBLOCK = 1024
#: stats blocks per multiprocessor (four of 256 threads keep enough loads in flight)
_PER_SM = 4
_KINDS = {torch.float16: "f16", torch.bfloat16: "bf16"}
#: the most channels a stats block covers (a thread per 8 channels of a row)
MAX_C = 8 * _BLOCK

_TEXT = (
    ELEMENTS
    + r"""
#define BLOCK 256
#define FBLOCK 1024
#define UNROLL 4

/* per-channel partial sums of (a, b) over this block's rows into part[blockIdx.x][c] and
   part[gridDim.x + blockIdx.x][c], from a thread's 8-channel sums */
__device__ __forceinline__ void block_sums(const float *s, const float *t, float *part,
                                           unsigned c, unsigned lane, unsigned sub,
                                           unsigned rpp) {
    __shared__ float sh[2][BLOCK * 8];
    if (sub < rpp)
        for (int q = 0; q < 8; ++q) {
            sh[0][sub * c + lane * 8 + q] = s[q];
            sh[1][sub * c + lane * 8 + q] = t[q];
        }
    __syncthreads();
    for (unsigned ch = threadIdx.x; ch < c; ch += blockDim.x) {
        float a = 0.f, b = 0.f;
        for (unsigned r = 0; r < rpp; ++r) {
            a += sh[0][r * c + ch];
            b += sh[1][r * c + ch];
        }
        part[(size_t)blockIdx.x * c + ch] = a;
        part[(size_t)(gridDim.x + blockIdx.x) * c + ch] = b;
    }
}

/* the partial sums of 32 channels from blockIdx.x * 32 (the FBLOCK / 32 warps over the
   blocks' rows, then warp 0): lane l of warp 0 gets channel's (s, t) in float64; false for
   the other threads */
__device__ __forceinline__ bool channel_sums(const float *part, unsigned blocks, unsigned c,
                                             double *s, double *t, unsigned *ch) {
    __shared__ double sh[2][FBLOCK];
    unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    *ch = blockIdx.x * 32 + lane;
    double a = 0.0, b = 0.0;
    if (*ch < c)
        for (unsigned k = warp; k < blocks; k += FBLOCK / 32) {
            a += part[(size_t)k * c + *ch];
            b += part[(size_t)(blocks + k) * c + *ch];
        }
    sh[0][threadIdx.x] = a;
    sh[1][threadIdx.x] = b;
    __syncthreads();
    if (warp != 0 || *ch >= c) return false;
    for (unsigned w = 1; w < FBLOCK / 32; ++w) {
        a += sh[0][w * 32 + lane];
        b += sh[1][w * 32 + lane];
    }
    *s = a;
    *t = b;
    return true;
}

/* a block's rows [r0, r1) and this thread's first: UNROLL rows a step, loads first */
#define ROWS                                                                               \
    unsigned tpr = c / 8, lane = threadIdx.x % tpr, sub = threadIdx.x / tpr;             \
    unsigned rpp = blockDim.x / tpr;                                                      \
    unsigned per = (rows + gridDim.x - 1) / gridDim.x;                                    \
    unsigned r0 = blockIdx.x * per, r1 = min(rows, r0 + per);

/* sums of x - k and (x - k)^2, k = x's first row */
#define STATS(T)                                                                           \
extern "C" __global__ void bn_stats_##T(unsigned long long x, float *part, unsigned rows,  \
                                        unsigned c) {                                      \
    ROWS                                                                                  \
    float k[8], s[8], t[8], v[UNROLL][8];                                                 \
    ld8_##T(x, lane * 8, k);                                                              \
    for (int q = 0; q < 8; ++q) s[q] = t[q] = 0.f;                                        \
    if (sub < rpp) {                                                                      \
        unsigned r = r0 + sub;                                                            \
        for (; r + (UNROLL - 1) * rpp < r1; r += UNROLL * rpp) {                          \
            _Pragma("unroll") for (int u = 0; u < UNROLL; ++u)                            \
                ld8_##T(x, (r + u * rpp) * c + lane * 8, v[u]);                           \
            _Pragma("unroll") for (int u = 0; u < UNROLL; ++u)                            \
                _Pragma("unroll") for (int q = 0; q < 8; ++q) {                           \
                    float d = v[u][q] - k[q];                                             \
                    s[q] += d;                                                            \
                    t[q] += d * d;                                                        \
                }                                                                         \
        }                                                                                 \
        for (; r < r1; r += rpp) {                                                        \
            ld8_##T(x, r * c + lane * 8, v[0]);                                           \
            for (int q = 0; q < 8; ++q) {                                                 \
                float d = v[0][q] - k[q];                                                 \
                s[q] += d;                                                                \
                t[q] += d * d;                                                            \
            }                                                                             \
        }                                                                                 \
    }                                                                                     \
    block_sums(s, t, part, c, lane, sub, rpp);                                            \
}
STATS(f16) STATS(bf16)

/* per channel: mean, invstd, running statistics, scale and shift (ss: scale then shift) */
#define FINALIZE(T)                                                                        \
extern "C" __global__ void bn_finalize_##T(                                                \
        const float *part, unsigned blocks, unsigned c, unsigned rows, unsigned long long x, \
        const float *gamma, const float *beta, float *rmean, float *rvar, float *mean,     \
        float *invstd, float *ss, float eps, float momentum) {                             \
    double s, t;                                                                          \
    unsigned ch;                                                                          \
    if (!channel_sums(part, blocks, c, &s, &t, &ch)) return;                              \
    double n = (double)rows, d = s / n;                                                   \
    double var = t / n - d * d;                                                           \
    if (var < 0.0) var = 0.0;                                                             \
    double m = (double)ld_##T(x, ch) + d;                                                 \
    float inv = (float)(1.0 / sqrt(var + (double)eps));                                   \
    mean[ch] = (float)m;                                                                  \
    invstd[ch] = inv;                                                                     \
    float sc = gamma[ch] * inv;                                                           \
    ss[ch] = sc;                                                                          \
    ss[c + ch] = beta[ch] - (float)m * sc;                                                \
    if (rmean) {                                                                          \
        double unbiased = rows > 1 ? var * n / (n - 1.0) : var;                           \
        rmean[ch] = (float)((1.0 - momentum) * rmean[ch] + momentum * m);                 \
        rvar[ch] = (float)((1.0 - momentum) * rvar[ch] + momentum * unbiased);            \
    }                                                                                     \
}
FINALIZE(f16) FINALIZE(bf16)

/* out = act(x * scale + shift [+ z]), 8 channels a thread, two vectors a step (v[U] with a
   constant U: the arrays stay in registers); mask (if given): a byte per 8 elements, bit q
   set where element q of them is above 0 (the ReLU's backward reads it) */
#define APPLY_ONE(T, I, U)                                                                 \
    {                                                                                     \
        unsigned ch = ((I) % c8) * 8;                                                     \
        ld8_f32((unsigned long long)(ss), ch, sc);                                        \
        ld8_f32((unsigned long long)(ss + c), ch, sh);                                    \
        _Pragma("unroll") for (int q = 0; q < 8; ++q) {                                   \
            float y = v[U][q] * sc[q] + sh[q];                                            \
            if (z) y += w[U][q];                                                          \
            v[U][q] = relu ? fmaxf(y, 0.f) : y;                                           \
        }                                                                                 \
        st8_##T(out, (I) * 8, v[U]);                                                      \
        if (mask) {                                                                       \
            unsigned b = 0;                                                               \
            _Pragma("unroll") for (int q = 0; q < 8; ++q) b |= (unsigned)(v[U][q] > 0.f) << q; \
            mask[I] = (unsigned char)b;                                                   \
        }                                                                                 \
    }
#define APPLY(T)                                                                           \
extern "C" __global__ void bn_apply_##T(unsigned long long x, unsigned long long z,        \
                                        const float *ss, unsigned long long out,           \
                                        unsigned char *mask, unsigned n8, unsigned c8,     \
                                        unsigned relu) {                                   \
    unsigned c = c8 * 8, step = gridDim.x * blockDim.x;                                   \
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += 2 * step) {     \
        unsigned j = i + step;                                                            \
        bool two = j < n8;                                                                \
        float v[2][8], w[2][8], sc[8], sh[8];                                             \
        ld8_##T(x, i * 8, v[0]);                                                          \
        if (two) ld8_##T(x, j * 8, v[1]);                                                 \
        if (z) {                                                                          \
            ld8_##T(z, i * 8, w[0]);                                                      \
            if (two) ld8_##T(z, j * 8, w[1]);                                             \
        }                                                                                 \
        APPLY_ONE(T, i, 0)                                                                \
        if (two) APPLY_ONE(T, j, 1)                                                       \
    }                                                                                     \
}
APPLY(f16) APPLY(bf16)

/* sums of g and g * (x - mean), g = dy where the ReLU's mask is set (all of dy without one) */
#define GRAD_ROW(T, R, U)                                                                  \
    {                                                                                     \
        unsigned i_ = (R) * c + lane * 8;                                                 \
        ld8_##T(dy, i_, g[U]);                                                            \
        ld8_##T(x, i_, v[U]);                                                             \
        o[U] = mask ? mask[i_ / 8] : 0xffu;                                               \
    }
#define GRAD_ACC(U)                                                                        \
    _Pragma("unroll") for (int q = 0; q < 8; ++q) {                                       \
        float gq = (o[U] >> q) & 1u ? g[U][q] : 0.f;                                      \
        s[q] += gq;                                                                       \
        t[q] += gq * (v[U][q] - m[q]);                                                    \
    }
#define GRAD_STATS(T)                                                                      \
extern "C" __global__ void bn_grad_stats_##T(unsigned long long dy,                       \
                                             const unsigned char *mask,                    \
                                             unsigned long long x, const float *mean,      \
                                             float *part, unsigned rows, unsigned c) {     \
    ROWS                                                                                  \
    float m[8], s[8], t[8], g[2][8], v[2][8];                                             \
    unsigned o[2];                                                                        \
    ld8_f32((unsigned long long)(mean), lane * 8, m);                                     \
    for (int q = 0; q < 8; ++q) s[q] = t[q] = 0.f;                                        \
    if (sub < rpp) {                                                                      \
        unsigned r = r0 + sub;                                                            \
        for (; r + rpp < r1; r += 2 * rpp) {                                              \
            GRAD_ROW(T, r, 0) GRAD_ROW(T, r + rpp, 1)                                     \
            GRAD_ACC(0) GRAD_ACC(1)                                                       \
        }                                                                                 \
        if (r < r1) {                                                                     \
            GRAD_ROW(T, r, 0)                                                             \
            GRAD_ACC(0)                                                                   \
        }                                                                                 \
    }                                                                                     \
    block_sums(s, t, part, c, lane, sub, rpp);                                            \
}
GRAD_STATS(f16) GRAD_STATS(bf16)

/* dbeta, dgamma and dx's coefficients: dx = k_g * g + k_x * x + k_0 (coef: k_g, k_x, k_0) */
extern "C" __global__ void bn_grad_finalize(const float *part, unsigned blocks, unsigned c,
                                            unsigned rows, const float *gamma,
                                            const float *mean, const float *invstd,
                                            float *dgamma, float *dbeta, float *coef) {
    double s, t;
    unsigned ch;
    if (!channel_sums(part, blocks, c, &s, &t, &ch)) return;
    double inv = invstd[ch], n = (double)rows;
    double dg = t * inv, kg = (double)gamma[ch] * inv;
    double kx = -kg * inv * dg / n;
    dbeta[ch] = (float)s;
    dgamma[ch] = (float)dg;
    coef[ch] = (float)kg;
    coef[c + ch] = (float)kx;
    coef[2 * c + ch] = (float)(-kg * s / n - kx * (double)mean[ch]);
}

#define GRAD_APPLY(T)                                                                      \
extern "C" __global__ void bn_grad_apply_##T(unsigned long long dy,                       \
                                             const unsigned char *mask,                    \
                                             unsigned long long x, const float *coef,      \
                                             unsigned long long dx, unsigned long long dz, \
                                             unsigned n8, unsigned c8) {                   \
    unsigned c = c8 * 8;                                                                  \
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n8;                      \
         i += gridDim.x * blockDim.x) {                                                   \
        unsigned ch = (i % c8) * 8;                                                       \
        float g[8], v[8], kg[8], kx[8], k0[8];                                            \
        ld8_##T(dy, i * 8, g);                                                            \
        ld8_##T(x, i * 8, v);                                                             \
        unsigned o = mask ? mask[i] : 0xffu;                                              \
        ld8_f32((unsigned long long)(coef), ch, kg);                                      \
        ld8_f32((unsigned long long)(coef + c), ch, kx);                                  \
        ld8_f32((unsigned long long)(coef + 2 * c), ch, k0);                              \
        _Pragma("unroll") for (int q = 0; q < 8; ++q)                                     \
            if (!((o >> q) & 1u)) g[q] = 0.f;                                             \
        if (dz) st8_##T(dz, i * 8, g);                                                    \
        for (int q = 0; q < 8; ++q)                                                       \
            v[q] = kg[q] * g[q] + kx[q] * v[q] + k0[q];                                   \
        st8_##T(dx, i * 8, v);                                                            \
    }                                                                                     \
}
GRAD_APPLY(f16) GRAD_APPLY(bf16)
"""
)

#: the kernels' source, compiled per architecture on first use
SOURCE = Source("pycudnn_bn.cu", _TEXT)


def _run(x: torch.Tensor, name: str, grid: tuple, params: list, ins: tuple, outs: tuple,
         stream: int, block: int = _BLOCK) -> None:  # fmt: skip
    """:func:`~.kernel_launch.run_kernel` of these kernels (one name, which the CPU tests
    replace with float64 twins)."""
    run_kernel(SOURCE, x, name, grid, params, ins, outs, stream, block)


def fits(shape: tuple, dtype: torch.dtype) -> bool:
    """Whether these kernels take channels-last data of *shape* and *dtype* (from those alone:
    fake and meta tensors too): 4-D float16/bfloat16, channels a multiple of 8 up to
    :data:`MAX_C`, fewer than 2**31 elements."""
    if dtype not in _KINDS or len(shape) != 4:
        return False
    c = shape[1]
    n = shape[0] * shape[1] * shape[2] * shape[3]
    return c % 8 == 0 and 0 < c <= MAX_C and 0 < n < 2**31


def mask_bytes(shape: tuple) -> int:
    """The bytes of the ReLU's mask :func:`train_forward` gives for data of *shape* (a bit an
    element)."""
    return shape[0] * shape[1] * shape[2] * shape[3] // 8


def takes(x: torch.Tensor) -> bool:
    """Whether these kernels take *x*: CUDA data :func:`fits` takes, channels-last, 16-byte
    aligned."""
    return (
        x.is_cuda
        and fits(tuple(x.shape), x.dtype)
        and x.is_contiguous(memory_format=torch.channels_last)
        and x.data_ptr() % 16 == 0
    )


def _grid(x: torch.Tensor, rows: int, c: int) -> int:
    """Row blocks of a stats kernel: :data:`_PER_SM` per multiprocessor, each at least a few
    rows a thread (its partial sums are what the finalize kernel adds up)."""
    _, sms = device_info(x.device.index)
    rpp = _BLOCK // (c // 8)
    return max(1, min(_PER_SM * sms, -(-rows // (rpp * 8))))


def _apply_grid(x: torch.Tensor, n8: int) -> int:
    """Blocks of an elementwise kernel: enough threads to keep every multiprocessor full."""
    _, sms = device_info(x.device.index)
    return max(1, min(8 * sms, -(-n8 // _BLOCK)))


def _setup(x: torch.Tensor) -> tuple:
    """``(rows, channels, kernel suffix, stats blocks, partial sums' buffer, float32 options)``
    of a call on *x*."""
    n, c, h, w = x.shape
    rows = n * h * w
    blocks = _grid(x, rows, c)
    f32 = {"dtype": torch.float32, "device": x.device}
    return rows, c, _KINDS[x.dtype], blocks, torch.empty(2 * blocks * c, **f32), f32


def _u32(v: int) -> ctypes.c_uint32:
    return ctypes.c_uint32(v)


def train_forward(
    x: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor,
    z: torch.Tensor | None,
    running: tuple[torch.Tensor, torch.Tensor] | None,
    eps: float,
    momentum: float,
    relu: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``act(batch_norm(x) [+ z])`` with the batch's statistics: ``(out, mean, invstd, mask)``, the
    statistics float32 per channel, *mask* the ReLU's (a ``uint8`` per 8 elements, bit q for
    element q; None without the ReLU), what the backward reads instead of the output; the
    running mean and variance, when given, moved by *momentum* in place. *x* (and *z*, laid out
    as *x*) as :func:`takes` says; *gamma*, *beta* and the running statistics float32 (C,),
    contiguous, on *x*'s device. Three launches, recorded on a launch tape when one records."""
    rows, c, kind, blocks, part, f32 = _setup(x)
    s = stream_of(x)
    mean, invstd, ss = torch.empty(c, **f32), torch.empty(c, **f32), torch.empty(2 * c, **f32)
    out = torch.empty_like(x)
    mask = torch.empty(x.numel() // 8, dtype=torch.uint8, device=x.device) if relu else None
    _run(x, f"bn_stats_{kind}", (blocks, 1, 1), [0, 1, _u32(rows), _u32(c)], (x,), (part,), s)
    run = () if running is None else tuple(running)
    r = (4, 5) if running else (None, None)
    k = 4 + len(run)
    _run(x, f"bn_finalize_{kind}", (-(-c // 32), 1, 1), [
        0, _u32(blocks), _u32(c), _u32(rows), 1, 2, 3, *r, k, k + 1, k + 2,
        ctypes.c_float(eps), ctypes.c_float(momentum)],
        (part, x, gamma, beta, *run), (mean, invstd, ss), s, _FBLOCK)  # fmt: skip
    n8 = x.numel() // 8
    zz = () if z is None else (z,)
    mm = () if mask is None else (mask,)
    k = len(zz)
    _run(x, f"bn_apply_{kind}", (_apply_grid(x, n8), 1, 1), [
        0, 1 if z is not None else None, 1 + k, 2 + k, 3 + k if mask is not None else None,
        _u32(n8), _u32(c // 8), _u32(int(relu))], (x, *zz, ss), (out, *mm), s)  # fmt: skip
    for t in run:  # written in place: tell torch, as an in-place op does (the folds key on it)
        bump_version(t)
    return out, mean, invstd, mask


def train_backward(
    dy: torch.Tensor,
    mask: torch.Tensor | None,
    x: torch.Tensor,
    gamma: torch.Tensor,
    mean: torch.Tensor,
    invstd: torch.Tensor,
    residual: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The gradients of :func:`train_forward`: ``(dx, dgamma, dbeta, dz)`` (*dz* None without a
    residual). *mask* is the forward's (None without the ReLU); *dy* laid out as *x*. Three
    launches, recorded on a launch tape when one records."""
    rows, c, kind, blocks, part, f32 = _setup(x)
    s = stream_of(dy)
    dgamma, dbeta, coef = torch.empty(c, **f32), torch.empty(c, **f32), torch.empty(3 * c, **f32)
    dx = torch.empty_like(x)
    dz = torch.empty_like(x) if residual else None
    oo = () if mask is None else (mask,)
    m = len(oo)
    _run(x, f"bn_grad_stats_{kind}", (blocks, 1, 1), [
        0, None if mask is None else 1, 1 + m, 2 + m, 3 + m, _u32(rows), _u32(c)],
        (dy, *oo, x, mean), (part,), s)  # fmt: skip
    _run(x, "bn_grad_finalize", (-(-c // 32), 1, 1), [
        0, _u32(blocks), _u32(c), _u32(rows), 1, 2, 3, 4, 5, 6],
        (part, gamma, mean, invstd), (dgamma, dbeta, coef), s, _FBLOCK)  # fmt: skip
    n8 = x.numel() // 8
    zz = () if dz is None else (dz,)
    _run(x, f"bn_grad_apply_{kind}", (_apply_grid(x, n8), 1, 1), [
        0, None if mask is None else 1, 1 + m, 2 + m, 3 + m, None if dz is None else 4 + m,
        _u32(n8), _u32(c // 8)], (dy, *oo, x, coef), (dx, *zz), s)  # fmt: skip
    return dx, dgamma, dbeta, dz
