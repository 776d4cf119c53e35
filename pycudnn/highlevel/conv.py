"""Convolutions: Theano's ``dnn_conv`` family, eager, on cuDNN's graph API.

``dnn_conv``/``dnn_conv3d`` (forward), ``dnn_gradinput``/``dnn_gradinput3d`` (gradient w.r.t. the
image, cuDNN's backward-data) and ``dnn_gradweight``/``dnn_gradweight3d`` (gradient w.r.t. the
filters, backward-filter) take any device array -- torch tensors, CuPy/JAX arrays, pycudnn
``DeviceArray`` -- in NCHW or NHWC (inferred from the strides) and return a ``DeviceArray``, or
write into ``out=`` and return it.

Caching design (the hot path)
-----------------------------
A call first builds a *call key*: a flat tuple of what the caller passed that is cheap to read
-- each operand's shape, element strides, dtype, device and pointer residue mod 16 (which fixes
its byte alignment), the convolution arguments exactly as given, ``alpha``/``beta`` and the
calling thread's ``pycudnn.config.snapshot()`` (a cached, hashable tuple). A per-thread bounded
dict (oldest-inserted evicted first; no reordering on hits, which would hash the key twice) maps
call keys to a ready *call entry*: the plan (from :mod:`._plans`), the handle, how the three
pointers map onto the plan's x/w/y, the output's allocation spec and the operands' byte spans.
A hit therefore skips parsing and validation entirely (the key pins everything they depend on)
and only reads three pointers, checks that ``out`` does not overlap an input, fetches the
workspace pointer when the plan needs one, finds the variant pack cached for those pointers and
calls ``cudnnBackendExecute`` -- no stream query, and ``cudnnSetStream`` only when ``stream=``
names a different stream than the handle's. Measured on two H200 hosts (tiny fp32 conv,
``out=`` given): 9.5 / 11.9 us per call, of which 3.0 / 3.5 us Python and 6.5 / 7.7 us
variant-pack lookup + execute; torch's ``F.conv2d`` 12.8 / 15.2 us in the same processes.

A miss validates everything before any C call (ranks, channels and groups, pads, strides,
dilations, empty outputs, dtypes and precision, int32 limits, alignment, devices, overlap),
normalises the problem to a :class:`._plans.Problem` (so differently spelt calls share one plan)
and gets its plan from the LRU plan cache, searching only when that misses too (0.7 ms cold for
the tiny conv: the heuristics' first config is tried before the others are fetched).

Layouts: cuDNN only ever sees operands packed NCHW or NHWC, all in one layout (NHWC when an
operand is unambiguously channels-last). Any other strides -- sliced or padded views, transposed
N/C views, a mix of layouts, a strided ``out`` -- are staged through packed copies made with
``cudnnTransformTensor`` (the graph API's engines returned wrong results, not an error, for
N/C-transposed strides). PyTorch likewise makes operands contiguous in one memory format.

``pycudnn.highlevel.conv.cache_info()`` exposes hit/miss counters; ``clear_caches()`` empties all
of it; ``set_cache_size()`` bounds it.
"""

from __future__ import annotations

import ctypes
import numbers
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from .. import _config, errors, memory
from .. import handle as _handle
from .._types import as_data_type, itemsize, numpy_dtype
from ..enums import (
    ConvolutionBwdDataAlgo,
    ConvolutionBwdFilterAlgo,
    ConvolutionFwdAlgo,
    ConvolutionMode,
    DataType,
)
from . import _plans
from ._plans import OP_BWD_DATA, OP_BWD_FILTER, OP_FWD, Problem

__all__ = [
    "cache_info",
    "clear_caches",
    "dnn_conv",
    "dnn_conv3d",
    "dnn_gradinput",
    "dnn_gradinput3d",
    "dnn_gradweight",
    "dnn_gradweight3d",
    "get_conv_output_shape",
    "set_cache_size",
]

INT32_MAX = 2**31 - 1
_SUPPORTED = (DataType.HALF, DataType.BFLOAT16, DataType.FLOAT, DataType.DOUBLE)
_DT_NAME = {
    DataType.HALF: "float16",
    DataType.BFLOAT16: "bfloat16",
    DataType.FLOAT: "float32",
    DataType.DOUBLE: "float64",
}
# data type -> compute types cuDNN has a configuration for (TRUE_HALF, PSEUDO_HALF, PSEUDO_BFLOAT16,
# FLOAT, DOUBLE configs of the cuDNN docs)
_COMPUTE_OK = {
    DataType.HALF: (DataType.HALF, DataType.FLOAT),
    DataType.BFLOAT16: (DataType.FLOAT,),
    DataType.FLOAT: (DataType.FLOAT,),
    DataType.DOUBLE: (DataType.DOUBLE,),
}
_PRECISIONS = ("as_input_f32", "as_input", "float16", "float32", "float64")
_META = {
    "guess_once": "guess",
    "guess_on_shape_change": "guess",
    "time_once": "time",
    "time_on_shape_change": "time",
    "deterministic": "guess",
}
# Theano's named algorithms -> legacy cuDNN algorithm, per direction (theano/gpuarray/dnn.py)
_LEGACY = {
    OP_FWD: {
        "none": ConvolutionFwdAlgo.IMPLICIT_GEMM,
        "small": ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM,
        "large": ConvolutionFwdAlgo.GEMM,
        "fft": ConvolutionFwdAlgo.FFT,
        "fft_tiling": ConvolutionFwdAlgo.FFT_TILING,
        "winograd": ConvolutionFwdAlgo.WINOGRAD,
        "winograd_non_fused": ConvolutionFwdAlgo.WINOGRAD_NONFUSED,
    },
    OP_BWD_DATA: {
        "none": ConvolutionBwdDataAlgo.ALGO_0,
        "fft": ConvolutionBwdDataAlgo.ALGO_FFT,
        "fft_tiling": ConvolutionBwdDataAlgo.ALGO_FFT_TILING,
        "winograd": ConvolutionBwdDataAlgo.ALGO_WINOGRAD,
        "winograd_non_fused": ConvolutionBwdDataAlgo.ALGO_WINOGRAD_NONFUSED,
    },
    OP_BWD_FILTER: {
        "none": ConvolutionBwdFilterAlgo.ALGO_0,
        "small": ConvolutionBwdFilterAlgo.ALGO_3,
        "fft": ConvolutionBwdFilterAlgo.ALGO_FFT,
        "fft_tiling": ConvolutionBwdFilterAlgo.ALGO_FFT_TILING,
        "winograd_non_fused": ConvolutionBwdFilterAlgo.ALGO_WINOGRAD_NONFUSED,
    },
}
_CONFIG_ALGO = {OP_FWD: "algo_fwd", OP_BWD_DATA: "algo_bwd_data", OP_BWD_FILTER: "algo_bwd_filter"}
_FUNC = {
    (OP_FWD, 2): "dnn_conv",
    (OP_FWD, 3): "dnn_conv3d",
    (OP_BWD_DATA, 2): "dnn_gradinput",
    (OP_BWD_DATA, 3): "dnn_gradinput3d",
    (OP_BWD_FILTER, 2): "dnn_gradweight",
    (OP_BWD_FILTER, 3): "dnn_gradweight3d",
}
_HINTS = (None, "forward", "forward!", "bprop weights", "bprop inputs")


# ==================================================================================================
# Operands: (ptr, shape, element strides, DataType, device) read as cheaply as each kind allows
# ==================================================================================================
_dtype_cache: dict[Any, DataType | None] = {}


def _data_type(dtype: Any) -> DataType | None:
    """DataType of a numpy/torch/ml_dtypes dtype object (None if cuDNN has none); memoised."""
    try:
        return _dtype_cache[dtype]
    except KeyError:
        pass
    except TypeError:  # unhashable dtype-like
        return _data_type_uncached(dtype)
    dt = _dtype_cache[dtype] = _data_type_uncached(dtype)
    return dt


def _data_type_uncached(dtype: Any) -> DataType | None:
    name = str(dtype)
    if name.startswith("torch."):
        name = name[6:]
    try:
        return as_data_type(name)
    except TypeError:
        try:
            return as_data_type(dtype)
        except TypeError:
            return None


def _from_torch(t: Any) -> tuple:
    dev = t.get_device()
    if dev < 0:
        raise TypeError(
            "a CPU torch tensor was passed; pycudnn needs device memory: move it with "
            "tensor.cuda() or pycudnn.to_device(...)"
        )
    return (t.data_ptr(), t.shape, t.stride(), _data_type(t.dtype), dev)


def _from_device_array(a: Any) -> tuple:
    dt = _data_type(a.dtype)
    size = a.dtype.itemsize
    return (a.ptr, a.shape, tuple(s // size for s in a.strides), dt, a.device)


def _from_other(obj: Any) -> tuple:
    return _from_device_array(memory.asarray(obj))


def _host_array(obj: Any) -> tuple:
    raise TypeError(
        f"a host {type(obj).__module__}.{type(obj).__name__} was passed; pycudnn's convolutions "
        "need device memory: copy it with pycudnn.to_device(array) (or pass a torch/CuPy/JAX "
        "device array)"
    )


_GETTERS: dict[type, Callable[[Any], tuple]] = {}


def _getter(tp: type) -> Callable[[Any], tuple]:
    global _FAST_T
    getter = _GETTERS.get(tp)
    if getter is not None:
        return getter
    module = tp.__module__ or ""
    if module.startswith("torch") and hasattr(tp, "data_ptr") and hasattr(tp, "get_device"):
        getter = _from_torch
        if module == "torch" and tp.__name__ == "Tensor":
            _FAST_T = tp
    elif issubclass(tp, memory.DeviceArray):
        getter = _from_device_array
    elif module.startswith("numpy") or (tp.__name__ == "ndarray" and module == "numpy"):
        getter = _host_array
    elif tp in (int, float, complex, bool, str, bytes, list, tuple, type(None)):

        def getter(obj: Any) -> tuple:
            raise TypeError(
                f"expected a device array (torch tensor, CuPy/JAX array, pycudnn DeviceArray), "
                f"got {type(obj).__name__}"
            )

    else:
        getter = _from_other
    _GETTERS[tp] = getter
    return getter


def register_operand_type(tp: type, getter: Callable[[Any], tuple]) -> None:
    """Teach the convolutions a device-array type: *getter(obj)* returns ``(ptr, shape,
    element_strides, DataType, device)``. Used by tests (fake arrays) and for fast paths."""
    _GETTERS[tp] = getter


def _operand(obj: Any) -> tuple:
    return (_GETTERS.get(type(obj)) or _getter(type(obj)))(obj)


# ==================================================================================================
# Argument parsing (pure Python)
# ==================================================================================================
def _ints(value: Any, nd: int, name: str, lo: int, func: str) -> tuple[int, ...]:
    if isinstance(value, bool):
        raise TypeError(f"{func}: {name} must be an int or a tuple of {nd} ints, got {value!r}")
    if isinstance(value, int):
        vals = (value,) * nd
    else:
        try:
            vals = tuple(value)
        except TypeError:
            raise TypeError(
                f"{func}: {name} must be an int or a tuple of {nd} ints, got {value!r}"
            ) from None
        if len(vals) != nd:
            raise ValueError(
                f"{func}: {name} must have {nd} values (one per spatial dim), got {value!r}"
            )
    out = []
    for v in vals:
        if isinstance(v, bool) or not hasattr(v, "__index__"):
            raise TypeError(f"{func}: {name} must contain ints, got {value!r}")
        v = v.__index__()
        if v < lo:
            what = "negative" if lo == 0 else "non-positive"
            raise ValueError(f"{func}: {what} {name} is not supported, got {value!r}")
        out.append(v)
    return tuple(out)


def _pads(
    border_mode: Any, kernel: Sequence[int], dilation: Sequence[int], func: str
) -> tuple[int, ...]:
    """Theano's border modes -> symmetric zero padding per spatial dim."""
    nd = len(kernel)
    dil_k = [(k - 1) * d + 1 for k, d in zip(kernel, dilation, strict=True)]
    if isinstance(border_mode, str):
        mode = border_mode.lower()
        if mode == "valid":
            return (0,) * nd
        if mode == "full":
            return tuple(k - 1 for k in dil_k)
        if mode == "half":
            return tuple(k // 2 for k in dil_k)
        raise ValueError(
            f"{func}: border_mode={border_mode!r} is not one of 'valid', 'full', 'half', an int "
            f"or a tuple of {nd} ints"
        )
    return _ints(border_mode, nd, "border_mode (padding)", 0, func)


def get_conv_output_shape(
    image_shape: Sequence[int],
    kernel_shape: Sequence[int],
    border_mode: Any = "valid",
    subsample: Sequence[int] | int = 1,
    dilation: Sequence[int] | int = 1,
) -> tuple[int, ...]:
    """Output shape of a forward convolution, Theano's ``get_conv_output_shape``.

    Parameters
    ----------
    image_shape : sequence of int
        ``(N, C, spatial...)``.
    kernel_shape : sequence of int
        ``(K, C / groups, kernel spatial...)``.
    border_mode, subsample, dilation
        As for :func:`dnn_conv`.

    Returns
    -------
    tuple of int
        ``(N, K, out spatial...)`` with ``out = (in + 2 * pad - ((k - 1) * d + 1)) // s + 1``;
        a spatial size may come out <= 0 (``dnn_conv`` rejects that).
    """
    nd = len(image_shape) - 2
    if nd < 1 or len(kernel_shape) != nd + 2:
        raise ValueError(
            f"image shape {tuple(image_shape)} and kernel shape {tuple(kernel_shape)} do not match"
        )
    func = "get_conv_output_shape"
    sub = _ints(subsample, nd, "subsample", 1, func)
    dil = _ints(dilation, nd, "dilation", 1, func)
    pads = _pads(border_mode, kernel_shape[2:], dil, func)
    spatial = tuple(
        (i + 2 * p - ((k - 1) * d + 1)) // s + 1
        for i, k, p, s, d in zip(image_shape[2:], kernel_shape[2:], pads, sub, dil, strict=True)
    )
    return (int(image_shape[0]), int(kernel_shape[0]), *spatial)


def _layout_strides(shape: Sequence[int], nhwc: bool) -> tuple[int, ...]:
    """Packed element strides of *shape* (N, C, spatial...) in NCHW or NHWC order."""
    n = len(shape)
    order = (0, *range(2, n), 1) if nhwc else tuple(range(n))
    strides = [0] * n
    acc = 1
    for d in reversed(order):
        strides[d] = acc
        acc *= max(shape[d], 1)
    return tuple(strides)


def _matches(shape: Sequence[int], strides: Sequence[int], canon: Sequence[int]) -> bool:
    return all(s == 1 or st == c for s, st, c in zip(shape, strides, canon, strict=True))


def _layout_of(shape: Sequence[int], strides: Sequence[int]) -> tuple[bool, bool]:
    """(is packed NCHW, is packed NHWC), ignoring the strides of size-1 dims."""
    return (
        _matches(shape, strides, _layout_strides(shape, False)),
        _matches(shape, strides, _layout_strides(shape, True)),
    )


def _span(shape: Sequence[int], strides: Sequence[int]) -> int:
    """Elements from the first to one past the last addressed element (0 if empty)."""
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, strides, strict=True))


def _non_overlapping(shape: Sequence[int], strides: Sequence[int]) -> bool:
    dims = sorted((st, s) for s, st in zip(shape, strides, strict=True) if s > 1)
    need = 1
    for st, s in dims:
        if st < need:
            return False
        need = st * s
    return True


def _check_int32(func: str, what: str, shape: Sequence[int], strides: Sequence[int]) -> None:
    worst = max([*shape, *strides, _span(shape, strides)], default=0)
    if worst > INT32_MAX:
        raise OverflowError(
            f"{func}: {what} of shape {tuple(shape)} with strides {tuple(strides)} exceeds "
            f"cuDNN's 32-bit limit ({INT32_MAX} elements per dimension, stride and span); split "
            "the batch into smaller calls"
        )


def _compute_type(dt: DataType, precision: str, func: str) -> DataType:
    if precision == "as_input_f32":
        ct = DataType.DOUBLE if dt == DataType.DOUBLE else DataType.FLOAT
    elif precision == "as_input":
        # cuDNN has no bfloat16-accumulating convolution: bf16 computes in float32
        ct = DataType.FLOAT if dt == DataType.BFLOAT16 else dt
    elif precision == "float16":
        ct = DataType.HALF
    elif precision == "float32":
        ct = DataType.FLOAT
    elif precision == "float64":
        ct = DataType.DOUBLE
    else:
        raise ValueError(
            f"{func}: precision={precision!r} is not one of {', '.join(map(repr, _PRECISIONS))}"
        )
    if ct not in _COMPUTE_OK[dt]:
        ok = ", ".join(repr(_DT_NAME[c]) for c in _COMPUTE_OK[dt])
        raise ValueError(
            f"{func}: precision={precision!r} ({_DT_NAME[ct]} compute) is not available for "
            f"{_DT_NAME[dt]} data; cuDNN computes {_DT_NAME[dt]} convolutions in {ok}"
        )
    return ct


def _policy(op: int, algo: Any, flags: Any, func: str, routed: bool = False) -> tuple[str, bool]:
    """(policy, force deterministic): policy is 'guess', 'time' or a legacy algorithm name.

    *routed*: ``dnn_conv`` computed as a gradient operation (``direction_hint``); a named
    algorithm of the forward direction then gives way to the routed direction's default.
    """
    if not isinstance(algo, str):
        raise TypeError(f"{func}: algo must be a string, got {algo!r}")
    name = algo.lower()
    if name in _META:
        return _META[name], name == "deterministic"
    if name in _LEGACY[op]:
        return name, False
    if routed:
        return _policy(op, getattr(flags, _CONFIG_ALGO[op]), flags, func)
    valid = sorted(set(_META) | set(_LEGACY[op]))
    raise ValueError(f"{func}: algo={algo!r} is not one of {', '.join(map(repr, valid))}")


# ==================================================================================================
# Call entries and the hot path
# ==================================================================================================
class _Call:
    """What a cache hit needs; see the module docstring."""

    __slots__ = (
        "alloc",
        "alloc_strides",
        "handle",
        "op",
        "perm",
        "plan",
        "problem",
        "spans",
        "stage",
        "workspace",
    )

    def __init__(
        self,
        op: int,
        problem: Problem,
        plan: Any,
        handle: Any,
        perm: tuple[int, int, int],
        alloc: tuple | None,
        spans: tuple[int, int, int],
        stage: _Stage | None = None,
    ):
        self.op = op  # the user-facing operation (error messages)
        self.problem = problem
        self.plan = plan
        self.handle = handle
        self.perm = perm  # (a, b, out) index feeding the plan's x, w, y
        # (shape, numpy dtype, device) and byte strides of a new output when out is None
        self.alloc = None if alloc is None else alloc[:3]
        self.alloc_strides = None if alloc is None else alloc[3]
        self.spans = spans  # byte spans of (a, b, out), for the overlap check
        self.stage = stage
        self.workspace = plan.workspace


class _Stage:
    """Copies around a plan for operands cuDNN should not see as they are (strides not packed
    NCHW/NHWC in the problem's layout): inputs are copied into packed buffers before, and a
    staged output is computed into a packed buffer and then scaled into ``out`` (``alpha``,
    ``beta`` applied by ``cudnnTransformTensor``)."""

    __slots__ = ("inputs", "output", "scales")

    def __init__(self, inputs: list[tuple], output: tuple | None, scales: tuple):
        self.inputs = inputs  # [(operand index, shape, numpy dtype, byte strides, src, dst)]
        self.output = output  # (shape, numpy dtype, byte strides, src, dst) or None
        self.scales = scales  # ctypes (one, zero, alpha, beta)


_local = threading.local()


_snapshot = _config.config.snapshot
#: torch.Tensor once one was seen (the call key then reads tensors without intermediate tuples)
_FAST_T: type | None = None


def _calls() -> Any:
    try:
        return _local.calls
    except AttributeError:
        lru = _local.calls = _plans.new_lru()
        return lru


def _workspace_ptr(h: Any, nbytes: int) -> int:
    """Device pointer of at least *nbytes* of the handle's workspace on its current stream
    (grow-only, per (handle, stream); raises ``AllocationError``, a ``MemoryError``)."""
    return memory.get_workspace(h, nbytes)[0]


def _run_call(call: _Call, pa: int, pb: int, po: int | None, out: Any, stream: Any) -> Any:
    """Run a ready call entry (the slow path's twin of the inlined hot path)."""
    if call.stage is not None:
        return _execute_staged(call, pa, pb, po, out, stream)
    h = call.handle
    if stream is not None:
        h.set_stream(stream)
    if out is None:
        out = memory.empty(*call.alloc, h.stream, strides=call.alloc_strides)
        po = out.ptr
    sa, sb, so = call.spans
    if (po < pa + sa and pa < po + so) or (po < pb + sb and pb < po + so):
        _overlap(call)
    ptrs = (pa, pb, po)
    x, w, y = call.perm
    ws = call.workspace
    call.plan.run(ptrs[x], ptrs[w], ptrs[y], _workspace_ptr(h, ws) if ws else 0)
    return out


def _execute_staged(call: _Call, pa: int, pb: int, po: int | None, out: Any, stream: Any) -> Any:
    h = call.handle
    if stream is not None:
        h.set_stream(stream)
    if out is None:
        out = memory.empty(*call.alloc, h.stream, strides=call.alloc_strides)
        po = out.ptr
    sa, sb, so = call.spans
    if (po < pa + sa and pa < po + so) or (po < pb + sb and pb < po + so):
        _overlap(call)
    st = call.stage
    one, zero, alpha, beta = st.scales
    transform = _plans.quiet_api("cudnnTransformTensor")
    device = h.device
    ptrs = [pa, pb, po]
    keep = []  # the packed copies live until the plan has been queued (freed stream-ordered)
    for idx, shape, npdt, strides, src, dst in st.inputs:
        tmp = memory.empty(shape, npdt, device, h.stream, strides=strides)
        transform(h.ptr, ctypes.byref(one), src, ptrs[idx], ctypes.byref(zero), dst, tmp.ptr)
        keep.append(tmp)
        ptrs[idx] = tmp.ptr
    final = None
    if st.output is not None:
        shape, npdt, strides, src, dst = st.output
        final = memory.empty(shape, npdt, device, h.stream, strides=strides)
        keep.append(final)
        ptrs[2] = final.ptr
    x, w, y = call.perm
    ws = call.workspace
    call.plan.run(ptrs[x], ptrs[w], ptrs[y], _workspace_ptr(h, ws) if ws else 0)
    if final is not None:
        transform(h.ptr, ctypes.byref(alpha), src, final.ptr, ctypes.byref(beta), dst, po)
    return out


def _conv(
    op: int,
    nd: int,
    a: Any,
    b: Any,
    shp: Any,
    border_mode: Any,
    subsample: Any,
    dilation: Any,
    conv_mode: Any,
    hint: Any,
    algo: Any,
    precision: Any,
    num_groups: Any,
    alpha: Any,
    beta: Any,
    out: Any,
    stream: Any,
) -> Any:
    # -- the call key: what the caller passed, read as cheaply as each array kind allows --------
    # (one flat tuple: hashing nested tuples costs more; op and nd fix the operands' ranks)
    if type(a) is _FAST_T and type(b) is _FAST_T:  # torch tensors: no intermediate tuples
        pa = a.data_ptr()
        pb = b.data_ptr()
        ka = (a.shape, a.stride(), a.dtype, a.get_device(), pa & 15,
              b.shape, b.stride(), b.dtype, b.get_device(), pb & 15)  # fmt: skip
    else:
        ga = _operand(a)
        gb = _operand(b)
        pa, pb = ga[0], gb[0]
        ka = (ga[1], ga[2], ga[3], ga[4], pa & 15, gb[1], gb[2], gb[3], gb[4], pb & 15)
    if out is None:
        po = okey = None
    elif type(out) is _FAST_T:
        po = out.data_ptr()
        okey = (out.shape, out.stride(), out.dtype, out.get_device(), po & 15)
    else:
        go = _operand(out)
        po = go[0]
        okey = (go[1], go[2], go[3], go[4], po & 15)
    if type(shp) is list:
        shp = tuple(shp)
    key = (op, nd, ka, okey, shp, border_mode, subsample, dilation, conv_mode, hint, algo,
           precision, num_groups, alpha, beta, _snapshot())  # fmt: skip
    try:
        calls = _local.calls
    except AttributeError:
        calls = _calls()
    data = calls.data
    try:
        call = data.get(key)
    except TypeError:  # an unhashable argument (a list, an array): no call caching
        call = key = None
    if call is not None:  # (no LRU reordering here: the call cache evicts oldest-inserted)
        try:
            if call.stage is not None:
                result = _execute_staged(call, pa, pb, po, out, stream)
            else:
                # -- the hot path, inlined -----------------------------------------------------
                h = call.handle
                if stream is not None:
                    h.set_stream(stream)  # no C call when unchanged
                if out is None:
                    out = memory.empty(*call.alloc, h.stream, strides=call.alloc_strides)
                    po = out.ptr
                sa, sb, so = call.spans
                if (po < pa + sa and pa < po + so) or (po < pb + sb and pb < po + so):
                    _overlap(call)
                ptrs = (pa, pb, po)
                x, w, y = call.perm
                ws = call.workspace
                call.plan.run(ptrs[x], ptrs[w], ptrs[y], _workspace_ptr(h, ws) if ws else 0)
                result = out
        except MemoryError:
            # the plan's workspace no longer fits: forget it and search again (smaller ones)
            _plans.evict(call.problem)
            calls.pop(key)
        else:
            _plans.stats.hits += 1
            return result
    return _slow(op, nd, a, b, shp, border_mode, subsample, dilation, conv_mode, hint, algo,
                 precision, num_groups, alpha, beta, out, stream, key)  # fmt: skip


def _overlap(call: _Call) -> None:
    p = call.problem
    raise ValueError(
        f"{_FUNC[(call.op, len(p.x_shape) - 2)]}: out overlaps an input; cuDNN's outputs may not "
        "alias its inputs"
    )


# ==================================================================================================
# The slow path: validate, normalise, find the plan, cache the call entry
# ==================================================================================================
def _shape_arg(value: Any, nd: int, name: str, func: str) -> tuple[int, ...]:
    try:
        vals = tuple(value)
    except TypeError:
        raise TypeError(
            f"{func}: {name} must be a sequence of {nd + 2} ints, got {value!r}"
        ) from None
    if len(vals) != nd + 2:
        raise ValueError(
            f"{func}: {name}={value!r} must have {nd + 2} entries (N, C, {nd} spatial)"
        )
    out = []
    for v in vals:
        if isinstance(v, bool) or not hasattr(v, "__index__") or v.__index__() < 0:
            raise ValueError(f"{func}: {name}={value!r} must contain non-negative ints")
        out.append(v.__index__())
    return tuple(out)


def _slow(op, nd, a, b, shp, border_mode, subsample, dilation, conv_mode, hint, algo,
          precision, num_groups, alpha, beta, out, stream, key):  # fmt: skip
    """Validate and normalise a call, find (or search) its plan, cache the call entry, run it."""
    ga = _operand(a)
    gb = _operand(b)
    func = _FUNC[(op, nd)]
    flags = _config.config.snapshot()
    go = _operand(out) if out is not None else None
    names = {
        OP_FWD: ("img", "kerns"),
        OP_BWD_DATA: ("kerns", "topgrad"),
        OP_BWD_FILTER: ("img", "topgrad"),
    }[op]

    # -- dtypes, ranks, devices --------------------------------------------------------------------
    dt = ga[3]
    for name, g in ((names[0], ga), (names[1], gb), ("out", go)):
        if g is None:
            continue
        if g[3] not in _SUPPORTED:
            raise TypeError(
                f"{func}: {name} has an unsupported dtype; supported: float16, bfloat16, float32, "
                "float64"
            )
        if g[3] != dt:
            raise TypeError(
                f"{func}: {names[0]} is {_DT_NAME[dt]} but {name} is {_DT_NAME[g[3]]}; all "
                "operands must have the same dtype"
            )
    for name, g in ((names[0], ga), (names[1], gb), ("out", go)):
        if g is not None and len(g[1]) != nd + 2:
            other = (
                "dnn_conv3d/dnn_gradinput3d/dnn_gradweight3d"
                if nd == 2
                else "dnn_conv/dnn_gradinput/dnn_gradweight"
            )
            raise ValueError(
                f"{func}: expected {nd + 2}-D operands (N, C, {nd} spatial dims), got {name} of "
                f"shape {tuple(g[1])} ({names[0]} {tuple(ga[1])}, {names[1]} {tuple(gb[1])})"
                + (f"; for {len(g[1]) - 2} spatial dims use {other}" if len(g[1]) in (4, 5) else "")
            )
    device = ga[4]
    for name, g in ((names[1], gb), ("out", go)):
        if g is not None and g[4] != device:
            raise ValueError(
                f"{func}: {names[0]} is on device {device} but {name} on device {g[4]}"
            )
    isz = itemsize(dt)
    for name, g in ((names[0], ga), (names[1], gb), ("out", go)):
        if g is None:
            continue
        if g[0] % isz:
            raise ValueError(
                f"{func}: {name}'s address 0x{g[0]:x} is not a multiple of its element size "
                f"({isz} B)"
            )
        for s, st in zip(g[1], g[2], strict=True):
            if st < 0:
                raise ValueError(
                    f"{func}: {name} has a negative stride {tuple(g[2])}; cuDNN does not support "
                    "them"
                )
            if st == 0 and s > 1:
                raise ValueError(
                    f"{func}: {name} has a zero (broadcast) stride {tuple(g[2])}; make it "
                    "contiguous first"
                )

    # -- arguments ---------------------------------------------------------------------------
    if isinstance(num_groups, bool) or not hasattr(num_groups, "__index__"):
        raise TypeError(f"{func}: num_groups must be a positive int, got {num_groups!r}")
    groups = num_groups.__index__()
    if groups < 1:
        raise ValueError(f"{func}: num_groups must be a positive int, got {num_groups!r}")
    sub = _ints(subsample, nd, "subsample (stride)", 1, func)
    dil = _ints(dilation, nd, "dilation", 1, func)
    if conv_mode not in ("conv", "cross"):
        raise ValueError(f"{func}: conv_mode={conv_mode!r} is not 'conv' or 'cross'")
    if hint not in _HINTS:
        raise ValueError(f"{func}: direction_hint={hint!r} is not one of {_HINTS}")
    prec = flags.precision if precision is None else precision
    if not isinstance(prec, str):
        raise TypeError(f"{func}: precision must be a string, got {prec!r}")
    compute = _compute_type(dt, prec.lower(), func)
    for name, v in (("alpha", alpha), ("beta", beta)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"{func}: {name} must be a real number, got {v!r}")

    # -- shapes: x (image), w (filters), y (conv output) -------------------------------------
    if op == OP_FWD:
        xs, ws_ = tuple(ga[1]), tuple(gb[1])
    elif op == OP_BWD_DATA:
        ws_, ys = tuple(ga[1]), tuple(gb[1])
        xs = _shape_arg(shp, nd, "img_shp", func) if shp is not None else None
        if go is not None:
            if xs is not None and xs != tuple(go[1]):
                raise ValueError(f"{func}: img_shp={xs} but out has shape {tuple(go[1])}")
            xs = tuple(go[1])
        if xs is None:
            raise ValueError(f"{func}: img_shp is required (or pass out=)")
    else:
        xs, ys = tuple(ga[1]), tuple(gb[1])
        ws_ = _shape_arg(shp, nd, "kerns_shp", func) if shp is not None else None
        if go is not None:
            if ws_ is not None and ws_ != tuple(go[1]):
                raise ValueError(f"{func}: kerns_shp={ws_} but out has shape {tuple(go[1])}")
            ws_ = tuple(go[1])
        if ws_ is None:
            raise ValueError(f"{func}: kerns_shp is required (or pass out=)")
    if any(k < 1 for k in ws_[2:]):
        raise ValueError(f"{func}: kernel spatial sizes must be positive, got filter shape {ws_}")
    c_in, k_out, c_per_group = xs[1], ws_[0], ws_[1]
    if k_out % groups or c_in % groups:
        raise ValueError(
            f"{func}: num_groups={groups} must divide the input channels ({c_in}) and the number "
            f"of filters ({k_out}); image {xs}, filters {ws_}"
        )
    if c_per_group * groups != c_in:
        raise ValueError(
            f"{func}: with num_groups={groups}, filters of shape {ws_} expect "
            f"{c_per_group * groups} input channels, but the image {xs} has {c_in}"
        )
    pads = _pads(border_mode, ws_[2:], dil, func)
    out_spatial = tuple(
        (i + 2 * p - ((k - 1) * d + 1)) // s + 1
        for i, k, p, s, d in zip(xs[2:], ws_[2:], pads, sub, dil, strict=True)
    )
    if any(o < 1 for o in out_spatial):
        raise ValueError(
            f"{func}: the convolution output would be empty: padded input "
            f"{tuple(i + 2 * p for i, p in zip(xs[2:], pads, strict=True))} is smaller than the "
            f"dilated kernel {tuple((k - 1) * d + 1 for k, d in zip(ws_[2:], dil, strict=True))} "
            f"(image {xs}, filters {ws_}, pads {pads}, dilation {dil})"
        )
    expect_y = (xs[0], k_out, *out_spatial)
    if op == OP_FWD:
        ys = expect_y
    elif ys != expect_y:
        other = "img_shp" if op == OP_BWD_DATA else "kerns_shp"
        raise ValueError(
            f"{func}: topgrad has shape {ys}, but a convolution of image {xs} with filters {ws_} "
            f"(pads {pads}, subsample {sub}, dilation {dil}) gives {expect_y}; check {other}"
        )
    if go is not None and op == OP_FWD and tuple(go[1]) != ys:
        raise ValueError(f"{func}: out has shape {tuple(go[1])}, expected {ys}")

    # -- algorithm policy ------------------------------------------------------------------------
    explicit = algo is not None
    policy, det = _policy(op, algo if explicit else getattr(flags, _CONFIG_ALGO[op]), flags, func)

    # -- empty problems: no cuDNN call ------------------------------------------------------------
    out_shape = {OP_FWD: ys, OP_BWD_DATA: xs, OP_BWD_FILTER: ws_}[op]
    # a sum over nothing (no input channels, no filters, no images, all-padding input): zeros
    no_input = any(i == 0 for i in xs[2:])
    reduced_empty = {
        OP_FWD: c_in == 0 or no_input,
        OP_BWD_DATA: k_out == 0,
        OP_BWD_FILTER: xs[0] == 0 or no_input,
    }[op]
    # layouts: NHWC when an operand is unambiguously channels-last, else NCHW
    layouts = [_layout_of(g[1], g[2]) for g in (ga, gb, go) if g is not None]
    nhwc = any(h and not c for c, h in layouts)
    if go is None:
        o_strides = _layout_strides(out_shape, nhwc)
    else:
        o_strides = tuple(go[2])
        if not _non_overlapping(out_shape, o_strides):
            raise ValueError(
                f"{func}: out's strides {o_strides} make elements overlap; cuDNN cannot write it"
            )
    if any(s == 0 for s in out_shape) or reduced_empty:
        fill = reduced_empty and not any(s == 0 for s in out_shape)
        return _empty_result(func, out, out_shape, o_strides, dt, device, beta, fill)

    # -- int32 limits ------------------------------------------------------------------------------
    for what, s, st in (
        (names[0], ga[1], ga[2]),
        (names[1], gb[1], gb[2]),
        ("the output", out_shape, o_strides),
    ):
        _check_int32(func, what, s, st)

    # -- layouts: what cuDNN sees is packed NCHW or NHWC, the rest is staged through copies ------
    # (the graph API's engines computed garbage for other stride orders, e.g. N/C-transposed
    # views, instead of refusing them; ATen also makes operands contiguous first)
    mode = ConvolutionMode.CONVOLUTION if conv_mode == "conv" else ConvolutionMode.CROSS_CORRELATION
    a_can = _layout_strides(ga[1], nhwc)
    b_can = _layout_strides(gb[1], nhwc)
    o_can = _layout_strides(out_shape, nhwc)
    staged_in = [
        i for i, g, can in ((0, ga, a_can), (1, gb, b_can)) if not _matches(g[1], g[2], can)
    ]
    staged_out = go is not None and not _matches(out_shape, o_strides, o_can)
    if op == OP_FWD:
        roles = (xs, a_can, ws_, b_can, ys, o_can, (0, 1, 2))
    elif op == OP_BWD_DATA:
        roles = (xs, o_can, ws_, a_can, ys, b_can, (2, 0, 1))
    else:
        roles = (xs, a_can, ws_, o_can, ys, b_can, (0, 2, 1))
    route = None
    if (
        op == OP_FWD
        and groups == 1
        and all(s == 1 for s in sub)
        and all(d == 1 for d in dil)
        and not staged_in
        and not staged_out
    ):
        if hint == "bprop weights" and all(p == 0 for p in pads) and conv_mode == "cross":
            route = OP_BWD_FILTER
        elif hint != "forward!" and isinstance(border_mode, str) and border_mode.lower() == "full":
            route = OP_BWD_DATA
    residues = (
        16 if 0 in staged_in else ga[0] & 15,
        16 if 1 in staged_in else gb[0] & 15,
        0 if go is None or staged_out else go[0] & 15,
    )
    align = tuple(_alignment(r & 15, isz) for r in residues)
    h = _handle.get_handle(device)
    if stream is not None:
        h.set_stream(stream)
    base = dict(
        device=device,
        cudnn_version=_cudnn_version(),
        dtype=int(dt),
        compute=int(compute),
        allow_tf32=bool(flags.allow_tf32) and dt == DataType.FLOAT,
        deterministic=bool(flags.deterministic or det),
        workspace_limit=-1 if flags.workspace_limit is None else int(flags.workspace_limit),
        # a staged output takes alpha/beta in its final copy; the plan writes a fresh buffer
        alpha=1.0 if staged_out else float(alpha),
        beta=0.0 if staged_out else float(beta),
    )
    ptrs = (ga[0], gb[0], go[0] if go is not None else None)
    spans = (
        _span(ga[1], ga[2]) * isz,
        _span(gb[1], gb[2]) * isz,
        _span(out_shape, o_strides) * isz,
    )
    npdt = numpy_dtype(dt)
    alloc = None
    if go is None:
        alloc = (out_shape, npdt, device, tuple(st * isz for st in o_can))
    stage = None
    if staged_in or staged_out:
        stage = _make_stage(dt, npdt, isz, staged_in, staged_out, (ga, gb), (a_can, b_can),
                            out_shape, o_strides, o_can, alpha, beta)  # fmt: skip

    call = None
    if route is not None:
        call = _routed_call(route, op, nd, xs, ws_, ys, a_can, b_can, o_can, mode, dil,
                            align, base, algo, explicit, flags, func, h, ptrs, alloc, spans,
                            nhwc)  # fmt: skip
    if call is None:
        xshape, xstr, wshape, wstr, yshape, ystr, perm = roles
        p = Problem(
            op=op,
            mode=int(mode),
            x_shape=xshape,
            x_strides=xstr,
            w_shape=wshape,
            w_strides=wstr,
            y_shape=yshape,
            y_strides=ystr,
            pads=pads,
            strides=sub,
            dilations=dil,
            x_align=align[perm[0]],
            w_align=align[perm[1]],
            y_align=align[perm[2]],
            algo=policy,
            **base,
        )
        # timing (time_*) runs on the caller's buffers, or on the packed copies when staged
        plan = _plan_for(p, h, ptrs if stage is None else None, perm, alloc, flags)
        call = _Call(op, p, plan, h, perm, alloc, spans, stage)
    try:
        result = _run_call(call, ga[0], gb[0], go[0] if go is not None else None, out, None)
    except (errors.CudnnError, MemoryError):
        _plans.evict(call.problem)  # a plan that cannot run is never kept
        raise
    if key is not None:
        _calls().put(key, call)
    return result


def _make_stage(dt, npdt, isz, staged_in, staged_out, gs, cans, out_shape, o_strides, o_can,
                alpha, beta):  # fmt: skip
    from ..descriptors import TensorDescriptor

    def desc(shape: tuple, strides: tuple) -> Any:
        fixed = tuple(max(st, 1) for st in strides)  # size-1 dims may carry stride 0
        return TensorDescriptor(shape, dt, fixed)

    inputs = []
    for i in staged_in:
        g, can = gs[i], cans[i]
        shape = tuple(g[1])
        inputs.append(
            (i, shape, npdt, tuple(st * isz for st in can), desc(shape, g[2]), desc(shape, can))
        )
    output = None
    if staged_out:
        output = (
            out_shape,
            npdt,
            tuple(st * isz for st in o_can),
            desc(out_shape, o_can),
            desc(out_shape, o_strides),
        )
    st = ctypes.c_double if dt == DataType.DOUBLE else ctypes.c_float
    return _Stage(inputs, output, (st(1.0), st(0.0), st(float(alpha)), st(float(beta))))


def _routed_call(route, op, nd, xs, ws_, ys, a_str, b_str, o_str, mode, dil, align, base, algo,
                 explicit, flags, func, h, ptrs, alloc, spans, nhwc):  # fmt: skip
    """Theano's ``direction_hint`` routes of ``dnn_conv`` (views only, no copies), or None when
    a view is not packed in the problem's layout (transposing N and C of a packed tensor rarely
    is: only with a size-1 N or C) or the gradient operation has no engine for the views; the
    forward then runs as usual."""
    try:
        chosen = algo if explicit else getattr(flags, _CONFIG_ALGO[route])
        policy, det = _policy(route, chosen, flags, func, routed=True)
    except ValueError:
        return None

    def t(shape: tuple, strides: tuple) -> tuple[tuple, tuple]:  # swap the N and C dims
        return (shape[1], shape[0], *shape[2:]), (strides[1], strides[0], *strides[2:])

    if route == OP_BWD_FILTER:
        # dnn_conv(img, kerns, 'valid', 'cross') == gradweight(img^T, kerns^T)^T
        x_shape, x_str = t(xs, a_str)
        y_shape, y_str = t(ws_, b_str)
        w_shape, w_str = t(ys, o_str)
        perm, mode2 = (0, 2, 1), mode
    else:
        # dnn_conv(img, kerns, 'full') == gradinput(kerns^T, img) with the other conv mode
        w_shape, w_str = t(ws_, b_str)
        y_shape, y_str = xs, a_str
        x_shape, x_str = ys, o_str
        perm = (2, 1, 0)
        mode2 = (
            ConvolutionMode.CROSS_CORRELATION
            if mode == ConvolutionMode.CONVOLUTION
            else ConvolutionMode.CONVOLUTION
        )
    for shape, strides in ((x_shape, x_str), (w_shape, w_str), (y_shape, y_str)):
        if not _matches(shape, strides, _layout_strides(shape, nhwc)):
            return None
        # the views' strides, made canonical for their size-1 dims
    x_str, w_str, y_str = (
        _layout_strides(x_shape, nhwc),
        _layout_strides(w_shape, nhwc),
        _layout_strides(y_shape, nhwc),
    )
    p = Problem(
        op=route,
        mode=int(mode2),
        x_shape=x_shape,
        x_strides=x_str,
        w_shape=w_shape,
        w_strides=w_str,
        y_shape=y_shape,
        y_strides=y_str,
        pads=(0,) * nd,
        strides=(1,) * nd,
        dilations=tuple(dil),
        x_align=align[perm[0]],
        w_align=align[perm[1]],
        y_align=align[perm[2]],
        algo=policy,
        **{**base, "deterministic": base["deterministic"] or det},
    )
    try:
        plan = _plan_for(p, h, ptrs, perm, alloc, flags)
    except (errors.NotSupportedError, errors.BadParamError):
        return None
    return _Call(op, p, plan, h, perm, alloc, spans)


def _alignment(residue: int, isz: int) -> int:
    """Byte alignment (<= 16) implied by an address residue mod 16."""
    if residue == 0:
        return 16
    return max(residue & -residue, isz)


_version: int | None = None


def _cudnn_version() -> int:
    global _version
    if _version is None:
        from .. import api

        _version = int(api.cudnnGetVersion())
    return _version


def _plan_for(p: Problem, h: Any, ptrs: tuple, perm: tuple, alloc: tuple | None, flags: Any) -> Any:
    """The cached plan of *p* or a new one (searched on the caller's buffers)."""
    lru = _plans._plans()
    plan = lru.get(p)
    if plan is not None:
        _plans.stats.hits += 1  # a new spelling of a cached problem
        return plan
    _plans.stats.misses += 1

    def build() -> Any:
        if p.algo not in ("guess", "time"):
            plan = _legacy_plan(p, h)
            if plan is not None:
                return plan
            p2 = p._replace(algo="guess")
            return _plans.get_plan(p2, lambda: _graph_plan(p2, h, ptrs, perm, alloc))
        return _graph_plan(p, h, ptrs, perm, alloc)

    plan = _plans.get_plan(p, build)
    if flags.verbose:
        print(
            f"pycudnn: {_plans.OP_NAMES[p.op]} conv x{p.x_shape} w{p.w_shape} y{p.y_shape} "
            f"{DataType(p.dtype).name}/{DataType(p.compute).name} ({p.algo}) -> {plan.describe()}",
            file=sys.stderr,
        )
    return plan


def _graph_plan(p: Problem, h: Any, ptrs: tuple | None, perm: tuple, alloc: tuple | None) -> Any:
    def ws(nbytes: int) -> int:
        return _workspace_ptr(h, nbytes)

    timing = None
    if p.algo == "time":

        def timing(plans: list) -> list[float]:
            # time on the caller's inputs and a scratch output (an accumulating out must stay
            # intact); staged calls (ptrs None) time on scratch buffers throughout
            out_role = {OP_FWD: 2, OP_BWD_DATA: 0, OP_BWD_FILTER: 1}[p.op]
            npdt = numpy_dtype(DataType(p.dtype))
            keep = []
            role_ptrs = []
            for role, (shape, strides) in enumerate(
                ((p.x_shape, p.x_strides), (p.w_shape, p.w_strides), (p.y_shape, p.y_strides))
            ):
                if ptrs is not None and role != out_role:
                    role_ptrs.append(ptrs[perm[role]])
                    continue
                n = max(_span(shape, strides), 1)
                buf = memory.empty((n,), npdt, p.device, h.stream)
                keep.append(buf)
                role_ptrs.append(buf.ptr)

            def run(gp: Any) -> None:
                gp.run(*role_ptrs, ws(gp.workspace) if gp.workspace else 0)

            try:
                return _plans.time_plans(plans, run, h.stream)
            finally:
                for gp in plans:  # packs for the scratch pointers are of no further use
                    gp.close()
                del keep

    return _plans.search_graph_plan(p, h, ws, timing)


def _legacy_plan(p: Problem, h: Any) -> Any:
    """A :class:`_plans.LegacyPlan` for a named Theano algorithm, or None (with a warning) when
    cuDNN's legacy API cannot run it here; the caller then uses the heuristics."""
    from ..descriptors import ConvolutionDescriptor, FilterDescriptor, TensorDescriptor

    algo = _LEGACY[p.op][p.algo]
    dt = DataType(p.dtype)
    nhwc_w = _layout_of(p.w_shape, p.w_strides)
    if nhwc_w[0]:
        wfmt = "NCHW"
    elif nhwc_w[1]:
        wfmt = "NHWC"
    else:
        wfmt = None
    fp32 = dt == DataType.FLOAT
    if dt in (DataType.HALF, DataType.BFLOAT16):
        math = "tensor_op"
    elif fp32 and not p.allow_tf32:
        math = "fma"
    else:
        math = "default"
    try:
        if wfmt is None:
            raise errors.NotSupportedError(
                3000, "dnn_conv", "the legacy API needs a packed NCHW or NHWC filter"
            )
        groups = p.x_shape[1] // p.w_shape[1]
        dx = TensorDescriptor(p.x_shape, dt, p.x_strides)
        dy = TensorDescriptor(p.y_shape, dt, p.y_strides)
        dw = FilterDescriptor(p.w_shape, dt, wfmt)
        dconv = ConvolutionDescriptor(
            p.pads,
            p.strides,
            p.dilations,
            mode=ConvolutionMode(p.mode),
            compute_type=DataType(p.compute),
            groups=groups,
            math_type=math,
        )
        size = ctypes.c_size_t(0)
        if p.op == OP_FWD:
            q = "cudnnGetConvolutionForwardWorkspaceSize"
            _plans.quiet_api(q)(
                h.ptr, dx.ptr, dw.ptr, dconv.ptr, dy.ptr, int(algo), ctypes.byref(size)
            )
            name = "cudnnConvolutionForward"
        elif p.op == OP_BWD_DATA:
            q = "cudnnGetConvolutionBackwardDataWorkspaceSize"
            _plans.quiet_api(q)(
                h.ptr, dw.ptr, dy.ptr, dconv.ptr, dx.ptr, int(algo), ctypes.byref(size)
            )
            name = "cudnnConvolutionBackwardData"
        else:
            q = "cudnnGetConvolutionBackwardFilterWorkspaceSize"
            _plans.quiet_api(q)(
                h.ptr, dx.ptr, dy.ptr, dconv.ptr, dw.ptr, int(algo), ctypes.byref(size)
            )
            name = "cudnnConvolutionBackwardFilter"
        ws = int(size.value)
        if p.workspace_limit >= 0 and ws > p.workspace_limit:
            raise errors.NotSupportedError(
                3000, q, f"workspace {ws} B is over the limit {p.workspace_limit} B"
            )
        if ws:
            _workspace_ptr(h, ws)
    except (errors.CudnnError, MemoryError, ValueError) as exc:
        warnings.warn(
            f"pycudnn: the legacy algorithm {p.algo!r} cannot run this {_plans.OP_NAMES[p.op]} "
            f"convolution ({exc}); using cuDNN's heuristics instead",
            RuntimeWarning,
            stacklevel=5,
        )
        return None
    st = ctypes.c_double if dt == DataType.DOUBLE else ctypes.c_float
    _plans.stats.builds += 1
    return _plans.LegacyPlan(
        _plans.quiet_api(name), name, int(algo), (dx, dw, dconv, dy), h, ws, st(p.alpha), st(p.beta)
    )


def _empty_result(func, out, shape, strides, dt, device, beta, fill):
    """Zero-size problems, no cuDNN call: nothing to compute (an empty output), or a sum over
    nothing (``alpha * 0 + beta * out``) when only a reduced dimension is empty."""
    npdt = numpy_dtype(dt)
    byte_strides = tuple(st * npdt.itemsize for st in strides)
    if out is None:
        make = memory.zeros if fill else memory.empty
        return make(shape, npdt, device, strides=byte_strides)
    if fill:
        if float(beta) == 0.0:
            memory.asarray(out).fill_(0)
        elif float(beta) != 1.0:
            raise NotImplementedError(
                f"{func}: scaling out by beta={beta} for an empty reduction is not supported"
            )
    return out


# ==================================================================================================
# Public functions
# ==================================================================================================
def dnn_conv(
    img: Any,
    kerns: Any,
    border_mode: str | int | tuple[int, ...] = "valid",
    subsample: tuple[int, ...] = (1, 1),
    dilation: tuple[int, ...] = (1, 1),
    conv_mode: str = "conv",
    direction_hint: str | None = None,
    algo: str | None = None,
    precision: str | None = None,
    num_groups: int = 1,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Any = None,
    stream: Any = None,
) -> Any:
    """2-D convolution of *img* with *kerns*, Theano's ``dnn_conv`` on cuDNN's graph API.

    Parameters
    ----------
    img : device array
        ``(N, C, H, W)`` images, NCHW or NHWC (channels-last strides), float16, bfloat16,
        float32 or float64 (torch tensor, CuPy/JAX array, ``DeviceArray``, ...).
    kerns : device array
        ``(K, C / num_groups, kH, kW)`` filters, same dtype and device.
    border_mode : {'valid', 'full', 'half'} or int or tuple of int
        ``'valid'`` no padding, ``'full'`` pad ``dilated_k - 1``, ``'half'`` pad
        ``dilated_k // 2``, or explicit symmetric padding.
    subsample : tuple of int
        Stride per spatial dim (an int applies to all).
    dilation : tuple of int
        Filter dilation per spatial dim.
    conv_mode : {'conv', 'cross'}
        ``'conv'`` flips the kernel (true convolution, Theano's default); ``'cross'`` does not
        (cross-correlation, PyTorch's ``conv2d``).
    direction_hint : {None, 'forward', 'forward!', 'bprop weights', 'bprop inputs'}
        As in Theano: with ``'bprop weights'`` (valid, unit stride/dilation, ``'cross'``, one
        group) the result is computed as a backward-filter convolution; ``'full'`` border mode
        with unit stride/dilation and one group is computed as a backward-data convolution
        unless the hint is ``'forward!'``. Same result either way; routes fall back to the
        forward operation when cuDNN has no engine for them.
    algo : str, optional
        ``'guess_once'``/``'guess_on_shape_change'`` (heuristics; the first engine config that
        builds), ``'time_once'``/``'time_on_shape_change'`` (time the candidate engines on these
        buffers, keep the fastest), ``'deterministic'`` (heuristics among deterministic engines),
        or a legacy algorithm (``'none'``, ``'small'``, ``'large'``, ``'fft'``, ``'fft_tiling'``,
        ``'winograd'``, ``'winograd_non_fused'``) run through cuDNN's legacy API. Default
        ``pycudnn.config.algo_fwd``. Each choice is cached per problem (shape, dtype, ...): in
        eager use ``*_once`` and ``*_on_shape_change`` behave the same.
    precision : {'as_input_f32', 'as_input', 'float16', 'float32', 'float64'}, optional
        Compute type; default ``pycudnn.config.precision``. float32 data computes with FMA
        (no TF32) unless ``pycudnn.config.allow_tf32``.
    num_groups : int
        Grouped convolution (``C`` and ``K`` divisible by it; ``num_groups == C`` is depthwise).
    alpha, beta : float
        ``out = alpha * conv + beta * out`` (*beta* != 0 accumulates into *out*).
    out : device array, optional
        Output ``(N, K, oH, oW)``; must not overlap the inputs.
    stream : optional
        CUDA stream (int, ``cuda.core`` / torch / CuPy stream); default the handle's current
        stream (``pycudnn.get_handle().stream``, the legacy default stream unless changed).

    Returns
    -------
    DeviceArray or the type of *out*
        A new ``DeviceArray`` in the layout of the inputs (NHWC if an input is channels-last),
        or *out*.

    Raises
    ------
    TypeError
        Host arrays (copy with ``pycudnn.to_device``), unsupported or mixed dtypes.
    ValueError
        Rank, channel or group mismatches, negative pads, non-positive strides or dilations, an
        empty output, misaligned pointers, operands on different devices, overlapping outputs.
    OverflowError
        A dimension, stride or span beyond cuDNN's 32-bit limit.
    pycudnn.errors.NotSupportedError
        No engine can run it; the message lists every engine tried and why.

    Examples
    --------
    >>> x = torch.randn(8, 3, 32, 32, device="cuda")
    >>> w = torch.randn(16, 3, 3, 3, device="cuda")
    >>> y = torch.from_dlpack(pycudnn.dnn_conv(x, w, border_mode="half", conv_mode="cross"))
    """
    return _conv(
        OP_FWD,
        2,
        img,
        kerns,
        None,
        border_mode,
        subsample,
        dilation,
        conv_mode,
        direction_hint,
        algo,
        precision,
        num_groups,
        alpha,
        beta,
        out,
        stream,
    )


def dnn_conv3d(
    img: Any,
    kerns: Any,
    border_mode: str | int | tuple[int, ...] = "valid",
    subsample: tuple[int, ...] = (1, 1, 1),
    dilation: tuple[int, ...] = (1, 1, 1),
    conv_mode: str = "conv",
    direction_hint: str | None = None,
    algo: str | None = None,
    precision: str | None = None,
    num_groups: int = 1,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Any = None,
    stream: Any = None,
) -> Any:
    """3-D convolution: :func:`dnn_conv` for ``(N, C, D, H, W)`` images (NCDHW or NDHWC) and
    ``(K, C / num_groups, kD, kH, kW)`` filters. Same parameters, returns and errors."""
    return _conv(
        OP_FWD,
        3,
        img,
        kerns,
        None,
        border_mode,
        subsample,
        dilation,
        conv_mode,
        direction_hint,
        algo,
        precision,
        num_groups,
        alpha,
        beta,
        out,
        stream,
    )


def dnn_gradinput(
    kerns: Any,
    topgrad: Any,
    img_shp: Sequence[int] | None,
    border_mode: str | int | tuple[int, ...] = "valid",
    subsample: tuple[int, ...] = (1, 1),
    dilation: tuple[int, ...] = (1, 1),
    conv_mode: str = "conv",
    precision: str | None = None,
    algo: str | None = None,
    num_groups: int = 1,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Any = None,
    stream: Any = None,
) -> Any:
    """Gradient of :func:`dnn_conv` w.r.t. its image (cuDNN backward-data).

    Parameters
    ----------
    kerns : device array
        The filters ``(K, C / num_groups, kH, kW)``.
    topgrad : device array
        Gradient w.r.t. the convolution output, ``(N, K, oH, oW)``.
    img_shp : sequence of int
        Shape of the image ``(N, C, H, W)`` (needed: with strides several image sizes give the
        same output size). May be None when *out* is given.
    border_mode, subsample, dilation, conv_mode, precision, num_groups, alpha, beta, out, stream
        As for :func:`dnn_conv`; *precision* and *algo* default to ``pycudnn.config.precision``
        and ``pycudnn.config.algo_bwd_data``.
    algo : str, optional
        ``'guess_*'``, ``'time_*'``, ``'deterministic'`` or a legacy backward-data algorithm
        (``'none'``, ``'fft'``, ``'fft_tiling'``, ``'winograd'``, ``'winograd_non_fused'``).

    Returns
    -------
    DeviceArray or the type of *out*
        The image gradient ``(N, C, H, W)``.

    Raises
    ------
    TypeError, ValueError, OverflowError, pycudnn.errors.NotSupportedError
        As for :func:`dnn_conv`; also when *img_shp* is inconsistent with *kerns*/*topgrad*.
    """
    return _conv(
        OP_BWD_DATA,
        2,
        kerns,
        topgrad,
        img_shp,
        border_mode,
        subsample,
        dilation,
        conv_mode,
        None,
        algo,
        precision,
        num_groups,
        alpha,
        beta,
        out,
        stream,
    )


def dnn_gradinput3d(
    kerns: Any,
    topgrad: Any,
    img_shp: Sequence[int] | None,
    border_mode: str | int | tuple[int, ...] = "valid",
    subsample: tuple[int, ...] = (1, 1, 1),
    dilation: tuple[int, ...] = (1, 1, 1),
    conv_mode: str = "conv",
    precision: str | None = None,
    algo: str | None = None,
    num_groups: int = 1,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Any = None,
    stream: Any = None,
) -> Any:
    """3-D :func:`dnn_gradinput`: image gradient ``(N, C, D, H, W)``."""
    return _conv(
        OP_BWD_DATA,
        3,
        kerns,
        topgrad,
        img_shp,
        border_mode,
        subsample,
        dilation,
        conv_mode,
        None,
        algo,
        precision,
        num_groups,
        alpha,
        beta,
        out,
        stream,
    )


def dnn_gradweight(
    img: Any,
    topgrad: Any,
    kerns_shp: Sequence[int] | None,
    border_mode: str | int | tuple[int, ...] = "valid",
    subsample: tuple[int, ...] = (1, 1),
    dilation: tuple[int, ...] = (1, 1),
    conv_mode: str = "conv",
    precision: str | None = None,
    algo: str | None = None,
    num_groups: int = 1,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Any = None,
    stream: Any = None,
) -> Any:
    """Gradient of :func:`dnn_conv` w.r.t. its filters (cuDNN backward-filter).

    Parameters
    ----------
    img : device array
        The images ``(N, C, H, W)``.
    topgrad : device array
        Gradient w.r.t. the convolution output, ``(N, K, oH, oW)``.
    kerns_shp : sequence of int
        Shape of the filters ``(K, C / num_groups, kH, kW)``; may be None when *out* is given.
    border_mode, subsample, dilation, conv_mode, precision, num_groups, alpha, beta, out, stream
        As for :func:`dnn_conv`; *algo* defaults to ``pycudnn.config.algo_bwd_filter``.
    algo : str, optional
        ``'guess_*'``, ``'time_*'``, ``'deterministic'`` or a legacy backward-filter algorithm
        (``'none'``, ``'small'``, ``'fft'``, ``'fft_tiling'``, ``'winograd_non_fused'``).

    Returns
    -------
    DeviceArray or the type of *out*
        The filter gradient ``(K, C / num_groups, kH, kW)``.

    Raises
    ------
    TypeError, ValueError, OverflowError, pycudnn.errors.NotSupportedError
        As for :func:`dnn_conv`; also when *kerns_shp* is inconsistent with *img*/*topgrad*.
    """
    return _conv(
        OP_BWD_FILTER,
        2,
        img,
        topgrad,
        kerns_shp,
        border_mode,
        subsample,
        dilation,
        conv_mode,
        None,
        algo,
        precision,
        num_groups,
        alpha,
        beta,
        out,
        stream,
    )


def dnn_gradweight3d(
    img: Any,
    topgrad: Any,
    kerns_shp: Sequence[int] | None,
    border_mode: str | int | tuple[int, ...] = "valid",
    subsample: tuple[int, ...] = (1, 1, 1),
    dilation: tuple[int, ...] = (1, 1, 1),
    conv_mode: str = "conv",
    precision: str | None = None,
    algo: str | None = None,
    num_groups: int = 1,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Any = None,
    stream: Any = None,
) -> Any:
    """3-D :func:`dnn_gradweight`: filter gradient ``(K, C / num_groups, kD, kH, kW)``."""
    return _conv(
        OP_BWD_FILTER,
        3,
        img,
        topgrad,
        kerns_shp,
        border_mode,
        subsample,
        dilation,
        conv_mode,
        None,
        algo,
        precision,
        num_groups,
        alpha,
        beta,
        out,
        stream,
    )


# ==================================================================================================
# Cache control
# ==================================================================================================
def cache_info() -> _plans.CacheInfo:
    """Plan-cache counters: ``hits`` (calls served by a cached plan), ``misses`` (calls that
    searched), ``builds`` (plans built), ``currsize``/``maxsize`` (this thread's plan LRU) and
    ``search_seconds`` (time spent building plans)."""
    return _plans.cache_info()


def clear_caches() -> None:
    """Forget every cached convolution plan, variant pack and call entry (all threads)."""
    _plans.clear_caches()


def set_cache_size(maxsize: int) -> None:
    """Bound the per-thread plan and call caches to *maxsize* entries each (0: unbounded).

    The default is 1024, or ``PYCUDNN_PLAN_CACHE_SIZE`` from the environment.
    """
    _plans.set_cache_size(maxsize)
