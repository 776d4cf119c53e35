"""pycudnn's own CUDA kernels: CUDA C++ source compiled with NVRTC for the device's
architecture, loaded as a context-independent library, launched on a caller's stream.

cuDNN has no operation for a few small jobs around it (folding batch norm into many
convolutions' weights at once, say); where torch's operations would take one launch per tensor,
one kernel of ours takes one for all of them. NVRTC comes with cuDNN (the ``nvidia-cudnn``
wheels depend on ``nvidia-cuda-nvrtc``: cuDNN compiles its runtime-fusion engines with it), and
``cuda.bindings`` wraps it.

Design decisions
----------------
* **Compiled once per architecture**, on first use: a cubin for ``sm_XY`` where this NVRTC
  knows the device's architecture, else PTX for the newest one it knows below it (the driver
  compiles that). The source has only ``extern "C"`` kernels and includes no header (NVRTC's
  own or the toolkit's), so nothing but libnvrtc is needed.
* **Loaded as a library** (``cuLibraryLoadData``, CUDA 12): its kernels are context-independent
  handles, loaded into whichever device's primary context is current when they launch. Kept for
  the process's lifetime (a few kilobytes; there is nothing to give back early).
* **Errors**: a failed compilation raises :class:`~pycudnn.errors.CudaError` naming
  ``nvrtcCompileProgram`` with NVRTC's log; driver calls go through :func:`._cuda.check`. A
  caller that has another way to do the job (torch's operations) catches them once and keeps to
  that way (:meth:`Source.failure`).

This module sits above :mod:`._cuda` (which imports ``cuda.bindings`` for it) and imports nothing
else from pycudnn.
"""

from __future__ import annotations

import threading
from typing import Any

from . import _cuda
from .errors import CudaError

__all__ = ["ELEMENTS", "Source", "launch", "nvrtc", "nvrtc_version"]

#: device functions the kernels' sources begin with: a float32, float16 or bfloat16 element
#: (``ld_*``/``st_*``, index *i* of the pointer *p*) or 8 of them in 16-byte accesses
#: (``ld8_*``/``st8_*``, from *i* a multiple of 8) as float32; rounding to the nearest even
ELEMENTS = r"""
typedef unsigned short u16;

__device__ __forceinline__ float ld_f32(unsigned long long p, unsigned i) {
    return ((const float *)p)[i];
}
__device__ __forceinline__ float half_f32(u16 v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
    return f;
}
__device__ __forceinline__ float ld_f16(unsigned long long p, unsigned i) {
    return half_f32(((const u16 *)p)[i]);
}
__device__ __forceinline__ float ld_bf16(unsigned long long p, unsigned i) {
    return __uint_as_float(((unsigned)((const u16 *)p)[i]) << 16);
}
__device__ __forceinline__ u16 f16_bits(float f) {
    u16 v;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(v) : "f"(f));
    return v;
}
/* round to nearest even, as torch's float -> bfloat16 (any architecture) */
__device__ __forceinline__ u16 bf16_bits(float f) {
    unsigned u = __float_as_uint(f);
    return (f != f) ? (u16)0x7fc0 : (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ void st_f32(unsigned long long p, unsigned i, float f) {
    ((float *)p)[i] = f;
}
__device__ __forceinline__ void st_f16(unsigned long long p, unsigned i, float f) {
    ((u16 *)p)[i] = f16_bits(f);
}
__device__ __forceinline__ void st_bf16(unsigned long long p, unsigned i, float f) {
    ((u16 *)p)[i] = bf16_bits(f);
}

/* 8 elements from i (a multiple of 8) in one or two 16-byte accesses; element 2q of a 32-bit
   word is its low half (little-endian) */
__device__ __forceinline__ void ld8_f32(unsigned long long p, unsigned i, float *x) {
    const float4 *v = (const float4 *)((const float *)p + i);
    float4 a = v[0], b = v[1];
    x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w; x[4] = b.x; x[5] = b.y; x[6] = b.z; x[7] = b.w;
}
__device__ __forceinline__ void ld8_f16(unsigned long long p, unsigned i, float *x) {
    uint4 u = *(const uint4 *)((const u16 *)p + i);
    unsigned w[4] = {u.x, u.y, u.z, u.w};
    for (int q = 0; q < 4; ++q) {
        x[2 * q] = half_f32((u16)(w[q] & 0xffffu));
        x[2 * q + 1] = half_f32((u16)(w[q] >> 16));
    }
}
__device__ __forceinline__ void ld8_bf16(unsigned long long p, unsigned i, float *x) {
    uint4 u = *(const uint4 *)((const u16 *)p + i);
    unsigned w[4] = {u.x, u.y, u.z, u.w};
    for (int q = 0; q < 4; ++q) {
        x[2 * q] = __uint_as_float(w[q] << 16);
        x[2 * q + 1] = __uint_as_float(w[q] & 0xffff0000u);
    }
}
__device__ __forceinline__ void st8_f32(unsigned long long p, unsigned i, const float *y) {
    float4 *v = (float4 *)((float *)p + i);
    v[0] = make_float4(y[0], y[1], y[2], y[3]);
    v[1] = make_float4(y[4], y[5], y[6], y[7]);
}
#define ST8_HALF(OUT)                                                                      \
__device__ __forceinline__ void st8_##OUT(unsigned long long p, unsigned i, const float *y) { \
    unsigned w[4];                                                                        \
    for (int q = 0; q < 4; ++q)                                                           \
        w[q] = (unsigned)OUT##_bits(y[2 * q]) | ((unsigned)OUT##_bits(y[2 * q + 1]) << 16); \
    *(uint4 *)((u16 *)p + i) = make_uint4(w[0], w[1], w[2], w[3]);                        \
}
ST8_HALF(f16) ST8_HALF(bf16)
"""


def nvrtc() -> Any:
    """``cuda.bindings.nvrtc`` (:func:`._cuda.nvrtc`: ``CudaUnavailableError`` without
    cuda-python)."""
    return _cuda.nvrtc()


def _check(result: Any, api: str) -> Any:
    err = result[0]
    if int(err) != 0:
        name = getattr(err, "name", "") or "nvrtcError"
        raise CudaError(api, int(err), name, "")
    return result[1] if len(result) == 2 else None


def nvrtc_version() -> tuple[int, int]:
    """NVRTC's ``(major, minor)`` (loads libnvrtc; raises where it cannot be loaded)."""
    r = nvrtc().nvrtcVersion()
    if int(r[0]) != 0:
        raise CudaError("nvrtcVersion", int(r[0]), getattr(r[0], "name", ""), "")
    return int(r[1]), int(r[2])


def _target(arch: int) -> tuple[str, bool]:
    """The ``--gpu-architecture`` value for a device of compute capability *arch* (``90`` for
    9.0) and whether it makes a cubin: ``sm_XY`` where NVRTC knows *arch*, else
    ``compute_XY`` of the newest architecture it knows below (PTX, compiled by the driver)."""
    known = _check(nvrtc().nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs")
    known = sorted(int(a) for a in known)
    if arch in known:
        return f"sm_{arch}", True
    below = [a for a in known if a < arch]
    if not below:
        raise CudaError(
            "nvrtcGetSupportedArchs", 0, "",
            f"this NVRTC ({nvrtc_version()}) knows no architecture up to sm_{arch}: {known}",
        )  # fmt: skip
    return f"compute_{below[-1]}", False


def launch(fn: Any, grid: tuple, block: tuple, params: int, stream: int) -> None:
    """Launch ``CUfunction`` *fn* (:meth:`Source.kernel`) over *grid* blocks of *block* threads
    on *stream* (``cudaStream_t``) in the current context, *params* the address of its
    ``void *[]`` of argument addresses: the one launch every kernel of pycudnn's goes through."""
    dr = _cuda.driver()
    _cuda.check(
        dr.cuLaunchKernel(fn, *grid, *block, 0, dr.CUstream(stream), params, 0), "cuLaunchKernel"
    )


class Source:
    """One CUDA C++ translation unit of ``extern "C"`` kernels: compiled per architecture and
    loaded once, its kernels looked up by name.

    Parameters
    ----------
    name : str
        The unit's file name in NVRTC's messages (``"fold.cu"``).
    text : str
        The source; it must include no header.
    """

    def __init__(self, name: str, text: str) -> None:
        self.name = name
        self.text = text
        self._lock = threading.Lock()
        self._images: dict[int, tuple[bytes, bool]] = {}
        self._libraries: dict[int, Any] = {}
        self._kernels: dict[tuple[int, str], Any] = {}
        #: why a caller stopped using this source (None while it works): see :meth:`failure`
        self.failed: str | None = None

    def compile(self, arch: int) -> tuple[bytes, bool]:
        """``(image, is_cubin)`` for compute capability *arch* (``90``), compiled on the first
        call for it. Needs no GPU."""
        with self._lock:
            got = self._images.get(arch)
            if got is None:
                got = self._images[arch] = self._compile(arch)
            return got

    def _compile(self, arch: int) -> tuple[bytes, bool]:
        nv = nvrtc()
        target, cubin = _target(arch)
        prog = _check(
            nv.nvrtcCreateProgram(self.text.encode(), self.name.encode(), 0, [], []),
            "nvrtcCreateProgram",
        )
        try:
            opts = [f"--gpu-architecture={target}".encode(), b"-std=c++17"]
            r = nv.nvrtcCompileProgram(prog, len(opts), opts)
            if int(r[0]) != 0:
                size = _check(nv.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
                log = b" " * size
                nv.nvrtcGetProgramLog(prog, log)
                text = log.rstrip(b"\x00").decode(errors="replace").strip()
                raise CudaError("nvrtcCompileProgram", int(r[0]), r[0].name, f"{self.name}: {text}")
            if cubin:
                size = _check(nv.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
                image = b" " * size
                _check(nv.nvrtcGetCUBIN(prog, image), "nvrtcGetCUBIN")
            else:
                size = _check(nv.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
                image = b" " * size
                _check(nv.nvrtcGetPTX(prog, image), "nvrtcGetPTX")
            return image, cubin
        finally:
            nv.nvrtcDestroyProgram(prog)

    def kernel(self, arch: int, name: str) -> Any:
        """The ``CUfunction`` of kernel *name* for compute capability *arch*: compiled and
        loaded on first use (a library's kernel, loaded into the current context when it
        launches)."""
        key = (arch, name)
        k = self._kernels.get(key)
        if k is not None:
            return k
        image, _ = self.compile(arch)
        dr = _cuda.driver()
        with self._lock:
            lib = self._libraries.get(arch)
            if lib is None:
                lib = self._libraries[arch] = _cuda.check(
                    dr.cuLibraryLoadData(image, None, None, 0, None, None, 0), "cuLibraryLoadData"
                )
            kern = _cuda.check(dr.cuLibraryGetKernel(lib, name.encode()), "cuLibraryGetKernel")
            k = self._kernels[key] = dr.CUfunction(int(kern))
        return k

    def launch(
        self, arch: int, name: str, grid: tuple, block: tuple, params: int, stream: int
    ) -> None:
        """Launch kernel *name* on *stream* (``cudaStream_t``), *params* the address of its
        ``void *[]`` of argument addresses, on the current device (whose compute capability is
        *arch*)."""
        launch(self.kernel(arch, name), grid, block, params, stream)

    def failure(self, exc: BaseException) -> str:
        """Record that a caller gave up on this source because of *exc*; returns (and keeps in
        :attr:`failed`) the sentence saying why, for diagnostics."""
        self.failed = f"{type(exc).__name__}: {exc}"
        return self.failed
