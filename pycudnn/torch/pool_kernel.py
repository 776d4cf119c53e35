"""2-D max pooling on channels-last data in pycudnn's own kernels (imports torch), forward with
the window position of each maximum and a backward that gathers from those positions.

cuDNN's NHWC max-pooling backward recomputes every window's maximum from the input and the
output: in a ResNet-50 training step at batch 64 (its stem's 3x3, stride-2 pool over 64x112x112
images) it took 438 µs on an H200, and the forward 84 µs, where reading and writing the data
once takes about 40 (docs/BENCHMARKS.md). These kernels stream the data once each way:

``max_pool_fwd``
    a thread per output pixel and 8 channels (16-byte accesses): the window's maximum and, in
    training, its position in the window (a byte per element: windows of at most 255
    positions), the first maximum in row-major order, a NaN taking the place as torch's does.
``max_pool_bwd``
    a thread per input pixel and 8 channels: the sum of the output gradients of the (at most
    ``ceil(k/s)`` squared) windows whose maximum is this pixel, in float32, written once; no
    atomics, no zero fill.

``max_pool_bn_fwd``
    the forward of eval (no positions) with an eval-mode batch norm and a ReLU applied to each
    element as it is read, ``relu(gamma * (x - mean) * invstd + beta)`` in float32 as torch's
    batch norm computes it (``invstd = rsqrt(var + eps)`` from the running variance), rounded
    to the data's dtype once: a ResNet stem's convolution then runs without an epilogue, on
    the faster kernel cuDNN has for it, and its batch norm and ReLU cost no pass of their own
    (:mod:`.region_pool`). The statistics and affine parameters are read as they are
    (float32, float16 or bfloat16), so a CUDA-graph replay reads those of its moment.

So a training step keeps a byte per pooled element for the backward instead of the input and
the output (what cuDNN's backward reads). Data float16, bfloat16 or float32, 4-D channels-last,
channels a multiple of 8, 16-byte aligned; window, stride and padding as ``nn.MaxPool2d``'s
(no dilation, floor mode).
"""

from __future__ import annotations

import ctypes

import torch

from .._nvrtc import ELEMENTS, Source
from ._runtime import device_info, stream_of
from .kernel_launch import BLOCK, run_kernel, warm

__all__ = [
    "SOURCE",
    "backward",
    "bn_vectors_ok",
    "fits",
    "forward",
    "forward_bn",
    "out_shape",
    "takes",
    "takes_bn",
    "usable",
]

_KINDS = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}
#: the batch-norm kernel's per-channel vectors: their kind codes (0: absent)
_VECTORS = {torch.float32: 1, torch.float16: 2, torch.bfloat16: 3}
#: the most positions a window may have (a byte each, 255 is "none")
MAX_WINDOW = 255

_TEXT = (
    ELEMENTS
    + r"""
/* geometry: n, c8 (channels / 8), input h w, output oh ow, window kh kw, stride sh sw, pad ph pw */
struct Geo {
    unsigned n, c8, h, w, oh, ow, kh, kw, sh, sw, ph, pw;
};

/* a forward thread's output pixel (thread i): image n, 8 channels from c8 * 8, and its
   window's top-left corner (h0, w0) in the input (negative in the padding) */
#define OUT_PIXEL                                                                          \
    unsigned c8 = i % g.c8, p = i / g.c8;                                                 \
    unsigned ow = p % g.ow; p /= g.ow;                                                    \
    unsigned oh = p % g.oh, n = p / g.oh;                                                 \
    int h0 = (int)(oh * g.sh) - (int)g.ph, w0 = (int)(ow * g.sw) - (int)g.pw;

/* for each position (r, s) of that window inside the input: v = its 8 values (data of kind
   T), then the statements that follow T */
#define WINDOW(T, ...)                                                                     \
    for (unsigned r = 0; r < g.kh; ++r) {                                                 \
        int hh = h0 + (int)r;                                                             \
        if (hh < 0 || hh >= (int)g.h) continue;                                           \
        for (unsigned s = 0; s < g.kw; ++s) {                                             \
            int ww = w0 + (int)s;                                                         \
            if (ww < 0 || ww >= (int)g.w) continue;                                       \
            ld8_##T(x, (((n * g.h + hh) * g.w + ww) * g.c8 + c8) * 8, v);                \
            __VA_ARGS__                                                                   \
        }                                                                                 \
    }

#define FWD(T)                                                                             \
extern "C" __global__ void max_pool_fwd_##T(unsigned long long x, unsigned long long y,    \
                                            unsigned char *idx, Geo g) {                   \
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;                                   \
    if (i >= g.n * g.oh * g.ow * g.c8) return;                                            \
    OUT_PIXEL                                                                             \
    float m[8], v[8];                                                                     \
    unsigned char a[8];                                                                   \
    for (int q = 0; q < 8; ++q) { m[q] = -__int_as_float(0x7f800000); a[q] = 255; }      \
    WINDOW(T,                                                                             \
        unsigned char pos = (unsigned char)(r * g.kw + s);                                \
        _Pragma("unroll") for (int q = 0; q < 8; ++q)                                     \
            if (a[q] == 255 || v[q] > m[q] || v[q] != v[q]) { m[q] = v[q]; a[q] = pos; }  \
    )                                                                                     \
    st8_##T(y, i * 8, m);                                                                 \
    if (idx) {                                                                            \
        unsigned lo = a[0] | (a[1] << 8) | (a[2] << 16) | ((unsigned)a[3] << 24);        \
        unsigned hi = a[4] | (a[5] << 8) | (a[6] << 16) | ((unsigned)a[7] << 24);        \
        *(uint2 *)(idx + (size_t)i * 8) = make_uint2(lo, hi);                             \
    }                                                                                     \
}
FWD(f16) FWD(bf16) FWD(f32)

/* 8 per-channel values from channel c8 * 8 of a vector of kind k (0: none, every value d;
   1 float32, 2 float16, 3 bfloat16) */
__device__ __forceinline__ void ld8_vec(unsigned long long p, unsigned k, unsigned i, float *v,
                                        float d) {
    if (k == 1) ld8_f32(p, i, v);
    else if (k == 2) ld8_f16(p, i, v);
    else if (k == 3) ld8_bf16(p, i, v);
    else for (int q = 0; q < 8; ++q) v[q] = d;
}

/* kinds: 2 bits each for mean, var, gamma, beta (ld8_vec's k) */
#define FWDBN(T)                                                                           \
extern "C" __global__ void max_pool_bn_fwd_##T(unsigned long long x, unsigned long long y, \
        unsigned long long mean, unsigned long long var, unsigned long long gamma,         \
        unsigned long long beta, unsigned kinds, float eps, Geo g) {                       \
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;                                   \
    if (i >= g.n * g.oh * g.ow * g.c8) return;                                            \
    OUT_PIXEL                                                                             \
    float mu[8], is[8], ga[8], be[8], m[8], v[8];                                         \
    ld8_vec(mean, kinds & 3u, c8 * 8, mu, 0.f);                                           \
    ld8_vec(var, (kinds >> 2) & 3u, c8 * 8, is, 1.f);                                     \
    ld8_vec(gamma, (kinds >> 4) & 3u, c8 * 8, ga, 1.f);                                   \
    ld8_vec(beta, (kinds >> 6) & 3u, c8 * 8, be, 0.f);                                    \
    for (int q = 0; q < 8; ++q) {                                                         \
        is[q] = rsqrtf(is[q] + eps);                                                      \
        m[q] = -__int_as_float(0x7f800000);                                               \
    }                                                                                     \
    WINDOW(T,                                                                             \
        _Pragma("unroll") for (int q = 0; q < 8; ++q) {                                   \
            float t = __fmul_rn(__fmul_rn(ga[q], __fsub_rn(v[q], mu[q])), is[q]);         \
            t = __fadd_rn(t, be[q]);                                                      \
            t = t < 0.f ? 0.f : t; /* (a NaN stays) */                                    \
            if (t > m[q] || t != t) m[q] = t;                                             \
        }                                                                                 \
    )                                                                                     \
    st8_##T(y, i * 8, m);                                                                 \
}
FWDBN(f16) FWDBN(bf16) FWDBN(f32)

#define BWD(T)                                                                             \
extern "C" __global__ void max_pool_bwd_##T(unsigned long long dy, const unsigned char *idx, \
                                            unsigned long long dx, Geo g) {                \
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;                                   \
    if (i >= g.n * g.h * g.w * g.c8) return;                                              \
    unsigned c8 = i % g.c8, p = i / g.c8;                                                 \
    unsigned w = p % g.w; p /= g.w;                                                       \
    unsigned h = p % g.h, n = p / g.h;                                                    \
    /* the windows that hold (h, w): oh * sh - ph <= h <= oh * sh - ph + kh - 1 */           \
    int th = (int)(h + g.ph) - (int)g.kh + 1, tw = (int)(w + g.pw) - (int)g.kw + 1;      \
    unsigned oh0 = th <= 0 ? 0u : (unsigned)(th + g.sh - 1) / g.sh;                       \
    unsigned ow0 = tw <= 0 ? 0u : (unsigned)(tw + g.sw - 1) / g.sw;                       \
    unsigned oh1 = min(g.oh, (h + g.ph) / g.sh + 1), ow1 = min(g.ow, (w + g.pw) / g.sw + 1); \
    float acc[8], d[8];                                                                   \
    for (int q = 0; q < 8; ++q) acc[q] = 0.f;                                             \
    for (unsigned oh = oh0; oh < oh1; ++oh)                                               \
        for (unsigned ow = ow0; ow < ow1; ++ow) {                                         \
            unsigned pos = (h + g.ph - oh * g.sh) * g.kw + (w + g.pw - ow * g.sw);        \
            unsigned o = ((n * g.oh + oh) * g.ow + ow) * g.c8 + c8;                       \
            uint2 u = *(const uint2 *)(idx + (size_t)o * 8);                              \
            unsigned char a[8] = {(unsigned char)u.x, (unsigned char)(u.x >> 8),          \
                                  (unsigned char)(u.x >> 16), (unsigned char)(u.x >> 24), \
                                  (unsigned char)u.y, (unsigned char)(u.y >> 8),          \
                                  (unsigned char)(u.y >> 16), (unsigned char)(u.y >> 24)}; \
            bool any = false;                                                             \
            _Pragma("unroll") for (int q = 0; q < 8; ++q) any |= a[q] == pos;             \
            if (!any) continue;                                                           \
            ld8_##T(dy, o * 8, d);                                                        \
            _Pragma("unroll") for (int q = 0; q < 8; ++q)                                 \
                if (a[q] == pos) acc[q] += d[q];                                          \
        }                                                                                 \
    st8_##T(dx, i * 8, acc);                                                              \
}
BWD(f16) BWD(bf16) BWD(f32)
"""
)

#: the kernels' source, compiled per architecture on first use
SOURCE = Source("pycudnn_pool.cu", _TEXT)


class _Geo(ctypes.Structure):
    """The kernels' ``Geo`` (twelve unsigned ints, passed by value)."""

    _fields_ = [
        (f, ctypes.c_uint32)
        for f in ("n", "c8", "h", "w", "oh", "ow", "kh", "kw", "sh", "sw", "ph", "pw")
    ]


def out_shape(shape: tuple, cfg: tuple) -> tuple:
    """The output shape of pooling data of *shape* (n, c, spatial...) with *cfg* ``(window,
    stride, pad, mode)`` in floor mode (cuDNN's pooling too: every pooling of the adapter)."""
    ws, stride, pad, _ = cfg
    spatial = zip(shape[2:], ws, stride, pad, strict=True)
    return (shape[0], shape[1], *((d + 2 * p - k) // s + 1 for d, k, s, p in spatial))


def fits(shape: tuple, dtype: torch.dtype, cfg: tuple) -> bool:
    """Whether these kernels take channels-last data of *shape* and *dtype* pooled by *cfg*
    (from those alone: fake and meta tensors too): 2-D max pooling of 4-D float16, bfloat16 or
    float32 data, channels a multiple of 8, a window of at most :data:`MAX_WINDOW` positions,
    fewer than 2**31 elements each side, a non-empty output."""
    ws, stride, pad, mode = cfg
    if mode != "max" or dtype not in _KINDS or len(shape) != 4 or len(ws) != 2:
        return False
    if min(ws) < 1 or min(stride) < 1:  # (cuDNN's pooling says what is wrong with them)
        return False
    n, c, h, w = shape
    oshape = out_shape(shape, cfg)
    return (
        c % 8 == 0
        and c > 0
        and ws[0] * ws[1] <= MAX_WINDOW
        and min(oshape) > 0
        and n * c * h * w < 2**31
        and all(0 <= p <= k // 2 for k, p in zip(ws, pad, strict=True))
    )


#: :func:`usable`'s answer per device (asked on every eager call)
_USABLE: dict[int, bool] = {}


def usable(index: int) -> bool:
    """Whether these kernels run on CUDA device *index*: compute capability 7.0 or newer, and
    NVRTC compiled them for it (on the first call for the device; a failure is kept in
    ``SOURCE.failed`` and the callers stay on cuDNN's pooling)."""
    got = _USABLE.get(index)
    if got is not None:
        return got
    if index < 0:  # (a CPU tensor's device index)
        return False
    arch = device_info(index)[0]
    ok = SOURCE.failed is None and arch >= 70
    if ok:
        try:
            SOURCE.compile(arch)
        except Exception as exc:  # any failure to build: cuDNN's pooling runs
            SOURCE.failure(exc)
            ok = False
    _USABLE[index] = ok
    return ok


def takes(x: torch.Tensor, cfg: tuple, grad: bool) -> bool:
    """Whether these kernels pool *x* by *cfg* (and, with *grad*, take the gradient back): CUDA
    data :func:`fits` takes, channels-last, 16-byte aligned, on a device they are
    :func:`usable` on; inside a stream capture only once the kernels the call needs have run on
    the device (a capture cannot load them)."""
    names = ("max_pool_fwd_{}", "max_pool_bwd_{}") if grad else ("max_pool_fwd_{}",)
    return _takes(x, cfg, names)


def takes_bn(x: torch.Tensor, cfg: tuple) -> bool:
    """:func:`takes` for :func:`forward_bn` (its vectors: :func:`bn_vectors_ok`)."""
    return _takes(x, cfg, ("max_pool_bn_fwd_{}",))


def _takes(x: torch.Tensor, cfg: tuple, names: tuple[str, ...]) -> bool:
    if not (
        x.is_cuda
        and fits(tuple(x.shape), x.dtype, cfg)
        and x.is_contiguous(memory_format=torch.channels_last)
        and x.data_ptr() % 16 == 0
        and usable(x.device.index)
    ):
        return False
    if not torch.cuda.is_current_stream_capturing():
        return True
    kind = _KINDS[x.dtype]
    return warm(SOURCE, x.device.index, tuple(n.format(kind) for n in names))


def bn_vectors_ok(vectors: tuple, x: torch.Tensor) -> bool:
    """Whether :func:`forward_bn` reads *vectors* ``(mean, var, gamma, beta)`` for *x*: the
    statistics present, *gamma* and *beta* may be None; each one 1-D, a value per channel of
    *x*, contiguous, float32, float16 or bfloat16, 16-byte aligned, on *x*'s device."""
    c = x.shape[1]
    for k, v in enumerate(vectors):
        if v is None:
            if k < 2:
                return False
            continue
        if (
            v.dtype not in _VECTORS
            or v.device != x.device
            or v.dim() != 1
            or v.numel() != c
            or v.stride(0) != 1
            or v.data_ptr() % 16
        ):
            return False
    return True


def _run(x: torch.Tensor, name: str, grid: tuple, params: list, ins: tuple, outs: tuple,
         stream: int) -> None:  # fmt: skip
    """:func:`~.kernel_launch.run_kernel` of these kernels (one name, which the CPU tests
    replace with float64 twins)."""
    run_kernel(SOURCE, x, name, grid, params, ins, outs, stream)


def _geo(shape: tuple, oshape: tuple, cfg: tuple) -> _Geo:
    ws, stride, pad, _ = cfg
    n, c, h, w = shape
    return _Geo(n, c // 8, h, w, oshape[2], oshape[3], *ws, *stride, *pad)


def _grid(elements: int) -> tuple:
    return (-(-(elements // 8) // BLOCK), 1, 1)


def forward(x: torch.Tensor, cfg: tuple, train: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(y, idx)``: *x* (as :func:`takes` says) max-pooled by *cfg*, channels-last, and with
    *train* each maximum's position in its window (``uint8``, laid out as *y*'s elements in
    memory order; else None). One launch, recorded on a launch tape when one records."""
    oshape = out_shape(tuple(x.shape), cfg)
    y = torch.empty(oshape, dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    idx = torch.empty(y.numel(), dtype=torch.uint8, device=x.device) if train else None
    geo = _geo(tuple(x.shape), oshape, cfg)
    outs = (y,) if idx is None else (y, idx)
    _run(x, f"max_pool_fwd_{_KINDS[x.dtype]}", _grid(y.numel()),
         [0, 1, None if idx is None else 2, geo], (x,), outs, stream_of(x))  # fmt: skip
    return y, idx


def forward_bn(x: torch.Tensor, cfg: tuple, vectors: tuple, eps: float) -> torch.Tensor:
    """*x* (as :func:`takes_bn` says) through an eval-mode batch norm with *vectors* ``(mean,
    var, gamma, beta)`` (as :func:`bn_vectors_ok` says) and *eps*, then a ReLU, max-pooled by
    *cfg*: a new channels-last tensor. One launch, recorded on a launch tape when one
    records."""
    oshape = out_shape(tuple(x.shape), cfg)
    y = torch.empty(oshape, dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    ins: list[torch.Tensor] = [x]
    at: list[int | None] = []
    kinds = 0
    for k, v in enumerate(vectors):
        if v is None:
            at.append(None)
            continue
        kinds |= _VECTORS[v.dtype] << (2 * k)
        at.append(len(ins))
        ins.append(v)
    geo = _geo(tuple(x.shape), oshape, cfg)
    params = [0, len(ins), *at, ctypes.c_uint32(kinds), ctypes.c_float(eps), geo]
    _run(x, f"max_pool_bn_fwd_{_KINDS[x.dtype]}", _grid(y.numel()), params, tuple(ins), (y,),
         stream_of(x))  # fmt: skip
    return y


def backward(dy: torch.Tensor, idx: torch.Tensor, shape: tuple, cfg: tuple) -> torch.Tensor:
    """The input's gradient (*shape*, channels-last) from the output's *dy* (channels-last,
    16-byte aligned) and :func:`forward`'s *idx*. One launch, recorded on a launch tape when
    one records."""
    dx = torch.empty(shape, dtype=dy.dtype, device=dy.device, memory_format=torch.channels_last)
    geo = _geo(shape, tuple(dy.shape), cfg)
    _run(dy, f"max_pool_bwd_{_KINDS[dy.dtype]}", _grid(dx.numel()),
         [0, 1, 2, geo], (dy, idx), (dx,), stream_of(dy))  # fmt: skip
    return dx
