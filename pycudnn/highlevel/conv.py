"""Convolutions: Theano's ``dnn_conv`` family, eager, on cuDNN's graph API.

``dnn_conv``/``dnn_conv3d`` (forward), ``dnn_gradinput``/``dnn_gradinput3d`` (gradient w.r.t. the
image, cuDNN's backward-data) and ``dnn_gradweight``/``dnn_gradweight3d`` (gradient w.r.t. the
filters, backward-filter) take any device array -- torch tensors, CuPy/JAX arrays, pycudnn
``DeviceArray`` -- in NCHW or NHWC (inferred from the strides) and return a ``DeviceArray``, or
write into ``out=`` and return it.

Caching design (the hot path)
-----------------------------
A call first builds a *call key* (the shared op path's, see :mod:`._op`): a flat tuple of what the
caller passed that is cheap to read -- each operand's shape, element strides, dtype, device and
pointer residue mod 16 (which fixes its byte alignment), the convolution arguments exactly as
given, ``alpha``/``beta`` and the calling thread's ``pycudnn.config.snapshot()``. The per-thread
call cache maps call keys to a ready call entry (:class:`_ConvCall`): the plan (from
:mod:`pycudnn.graph._plans`), the handle, how the three pointers map onto the plan's x/w/y, the
output's allocation spec and the operands' byte spans. A hit therefore skips parsing and validation
(the key pins everything they depend on) and only reads three pointers, checks that ``out`` does
not overlap an input, fetches the workspace pointer when the plan needs one, finds the variant pack
cached for those pointers and calls ``cudnnBackendExecute`` -- no stream query, and
``cudnnSetStream`` only when ``stream=`` names a different stream than the handle's. The torch
fast path builds the key without an intermediate record; ``docs/BENCHMARKS.md`` has the measured
host cost against PyTorch's.

A miss runs :func:`_slow`, one function per decision: :func:`_operands` (dtypes, ranks, devices,
strides), :func:`_arguments` (groups, stride, dilation, precision, algorithm policy),
:func:`_shapes` (image, filter and output shapes, padding), :func:`_layouts` (NCHW or NHWC, what
is staged through packed copies), :func:`_route` (Theano's ``direction_hint``) and
:func:`_problem` (the plan key, a :class:`._plans.Problem`, so differently spelt calls share one
plan). Everything is validated before any C call. The plan comes from the LRU plan cache and is
searched only when that misses too.

Layouts: cuDNN only ever sees operands packed NCHW or NHWC, all in one layout (NHWC when an
operand is unambiguously channels-last). Any other strides -- sliced or padded views, transposed
N/C views, a mix of layouts, a strided ``out`` -- are staged through packed copies made with
``cudnnTransformTensor`` (the graph API's engines returned wrong results, not an error, for
N/C-transposed strides). PyTorch likewise makes operands contiguous in one memory format.

``pycudnn.highlevel.conv.cache_info()`` exposes hit/miss counters; ``clear_caches()`` empties all
of it; ``set_cache_size()`` bounds it; :func:`last_call` describes the thread's latest call (for
benchmarks and diagnostics).
"""

from __future__ import annotations

import ctypes
import sys
import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

from .. import _layout, errors, memory
from .._types import itemsize, numpy_dtype
from ..descriptors import ActivationDescriptor
from ..enums import (
    ConvolutionBwdDataAlgo,
    ConvolutionBwdFilterAlgo,
    ConvolutionFwdAlgo,
    ConvolutionMode,
    DataType,
)
from ..graph import _plans
from ..graph._plans import OP_BWD_DATA, OP_BWD_FILTER, OP_FWD, Problem
from . import _fusion, _op
from ._op import Operand

__all__ = [
    "CallInfo",
    "cache_info",
    "clear_caches",
    "dnn_conv",
    "dnn_conv3d",
    "dnn_gradinput",
    "dnn_gradinput3d",
    "dnn_gradweight",
    "dnn_gradweight3d",
    "get_conv_output_shape",
    "last_call",
    "recent_calls",
    "set_cache_size",
]

# keep the module-level names the tests and users patch/read: the shared op path's
register_operand_type = _op.register_operand_type
_SUPPORTED = _op.FLOATS
# data type -> compute types cuDNN has a configuration for (TRUE_HALF, PSEUDO_HALF, PSEUDO_BFLOAT16,
# FLOAT, DOUBLE configs of the cuDNN docs)
_COMPUTE_OK = {
    DataType.HALF: (DataType.HALF, DataType.FLOAT),
    DataType.BFLOAT16: (DataType.FLOAT,),
    DataType.FLOAT: (DataType.FLOAT,),
    DataType.DOUBLE: (DataType.DOUBLE,),
}
_DT_NAME = {
    DataType.HALF: "float16",
    DataType.BFLOAT16: "bfloat16",
    DataType.FLOAT: "float32",
    DataType.DOUBLE: "float64",
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
# the user's names of the two inputs, per operation
_NAMES = {
    OP_FWD: ("img", "kerns"),
    OP_BWD_DATA: ("kerns", "topgrad"),
    OP_BWD_FILTER: ("img", "topgrad"),
}
_HINTS = (None, "forward", "forward!", "bprop weights", "bprop inputs")


# ==================================================================================================
# Argument parsing (pure Python)
# ==================================================================================================
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
    return _op.ints(border_mode, nd, "border_mode (padding)", 0, func)


def _out_spatial(
    xs: Sequence[int],
    ws: Sequence[int],
    pads: Sequence[int],
    sub: Sequence[int],
    dil: Sequence[int],
) -> tuple[int, ...]:
    return tuple(
        (i + 2 * p - ((k - 1) * d + 1)) // s + 1
        for i, k, p, s, d in zip(xs[2:], ws[2:], pads, sub, dil, strict=True)
    )


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
    sub = _op.ints(subsample, nd, "subsample", 1, func)
    dil = _op.ints(dilation, nd, "dilation", 1, func)
    pads = _pads(border_mode, kernel_shape[2:], dil, func)
    spatial = _out_spatial(image_shape, kernel_shape, pads, sub, dil)
    return (int(image_shape[0]), int(kernel_shape[0]), *spatial)


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
class _ConvCall(_op.Call):
    """A cached convolution call: a plan and how the (a, b, out) pointers feed its x, w, y."""

    __slots__ = ("op", "perm", "plan", "problem", "workspace")

    def __init__(
        self,
        op: int,
        problem: Problem,
        plan: Any,
        handle: Any,
        perm: tuple[int, int, int],
        alloc: _op.OutputSpec | None,
        spans: tuple[int, int, int],
        stage: _op.Stage | None = None,
    ):
        conv = getattr(problem, "conv", problem)  # a fused key holds its convolution's
        super().__init__(_FUNC[(op, len(conv.x_shape) - 2)], handle, alloc, spans, stage)
        self.op = op
        self.problem = problem
        self.plan = plan
        self.perm = perm  # (a, b, out) index feeding the plan's x, w, y
        self.workspace = plan.workspace

    def launch(self, ptrs: Sequence[int]) -> None:
        x, w, y = self.perm
        ws = self.workspace
        self.plan.run(ptrs[x], ptrs[w], ptrs[y], _op.workspace(self.handle, ws) if ws else 0)

    @property
    def staged(self) -> bool:
        return self.stage is not None

    @property
    def epilogue(self) -> str | None:
        return None


class CallInfo(NamedTuple):
    """What :func:`last_call` reports: for benchmarks and diagnostics, not a stable API.

    ``plan`` has ``describe()``, ``workspace`` (bytes) and ``run(x, w, y, workspace_ptr)``;
    graph plans also ``pack(...)``, ``handle_c`` and ``plan_c`` (see :mod:`pycudnn.graph._plans`).
    ``perm`` maps the call's ``(a, b, out)`` pointers onto the plan's ``(x, w, y)``.
    With an epilogue (``bias=``/``activation=``/``z=``), ``epilogue`` names it (e.g.
    ``"bias+add+relu"``) and ``fused`` says whether one fused graph ran it (``plan`` is then
    that graph's plan, ``problem`` its :class:`._fusion.FusedProblem`, and ``plan.run`` takes
    ``x, w, [bias], [z], y, workspace_ptr``) or the convolution's plan and separate steps did.
    """

    func: str
    problem: Any
    plan: Any
    handle: Any
    perm: tuple[int, int, int]
    staged: bool
    allocates_output: bool
    fused: bool = False
    epilogue: str | None = None

    def workspace_ptr(self) -> int:
        """The handle's workspace pointer for this plan (0 when it needs none)."""
        ws = self.plan.workspace
        return _op.workspace(self.handle, ws) if ws else 0


def recent_calls() -> list[CallInfo]:
    """The calling thread's cached convolution calls, the most recently cached first."""
    return [
        CallInfo(
            c.func,
            c.problem,
            c.plan,
            c.handle,
            c.perm,
            c.staged,
            c.alloc is not None,
            isinstance(c, _FusedCall),
            c.epilogue,
        )
        for c in reversed(_op.calls().data.values())
        if isinstance(c, _ConvCall)
    ]


def last_call() -> CallInfo | None:
    """The calling thread's most recently cached convolution call (None before the first)."""
    calls = recent_calls()
    return calls[0] if calls else None


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
    fast = _op.FAST_T
    if type(a) is fast and type(b) is fast:  # torch tensors: no intermediate records
        pa = a.data_ptr()
        pb = b.data_ptr()
        ka = (a.shape, a.stride(), a.dtype, a.get_device(), pa & 15,
              b.shape, b.stride(), b.dtype, b.get_device(), pb & 15)  # fmt: skip
    else:  # the raw (ptr, shape, strides, dtype, device) of each operand
        ga = _op.raw_operand(a)
        gb = _op.raw_operand(b)
        pa, pb = ga[0], gb[0]
        ka = (ga[1], ga[2], ga[3], ga[4], pa & 15, gb[1], gb[2], gb[3], gb[4], pb & 15)
    if out is None:
        po = okey = None
    elif type(out) is fast:
        po = out.data_ptr()
        okey = (out.shape, out.stride(), out.dtype, out.get_device(), po & 15)
    else:
        po, okey = _op.key_of(out)
    if type(shp) is list:
        shp = tuple(shp)
    key = (op, nd, ka, okey, shp, border_mode, subsample, dilation, conv_mode, hint, algo,
           precision, num_groups, alpha, beta, _op.snapshot())  # fmt: skip
    result = _cached_run(key, (pa, pb), out, po, stream)
    if result is _MISS or result is _UNHASHABLE:
        return _slow(op, nd, a, b, shp, border_mode, subsample, dilation, conv_mode, hint, algo,
                     precision, num_groups, alpha, beta, out, stream,
                     None if result is _UNHASHABLE else key)  # fmt: skip
    return result


_MISS = object()  # no cached call entry (or one whose plan was just evicted)
_UNHASHABLE = object()  # an unhashable argument (a list, an array): no call caching


def _cached_run(key: Any, ptrs: tuple, out: Any, po: Any, stream: Any) -> Any:
    """Run the thread's cached call entry of *key* (plain or fused convolution): its result, or
    :data:`_MISS` / :data:`_UNHASHABLE` for the slow path. A plan whose workspace no longer fits
    is forgotten with its entry (the slow path searches again, smaller workspaces first). No
    LRU reordering here: the call cache evicts the oldest-inserted."""
    try:
        calls = _op.local.calls
    except AttributeError:
        calls = _op.calls()
    try:
        call = calls.data.get(key)
    except TypeError:
        return _UNHASHABLE
    if call is None:
        return _MISS
    try:
        result = call.run(ptrs, out, po, stream)
    except MemoryError:
        _plans.evict(call.problem)
        calls.pop(key)
        return _MISS
    _plans.stats.hits += 1
    return result


# ==================================================================================================
# The slow path: one function per decision, then the plan and the cached call entry
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


class _Args(NamedTuple):
    """What the convolution arguments decide (validated)."""

    groups: int
    sub: tuple[int, ...]
    dil: tuple[int, ...]
    mode: ConvolutionMode
    compute: DataType
    policy: str  # 'guess', 'time' or a legacy algorithm name
    deterministic: bool
    explicit_algo: bool


class _Shapes(NamedTuple):
    """Image x, filters w, convolution output y, the padding, and which one is the output."""

    xs: tuple[int, ...]
    ws: tuple[int, ...]
    ys: tuple[int, ...]
    pads: tuple[int, ...]
    out_shape: tuple[int, ...]
    reduced_empty: bool  # a sum over nothing: the output is all zeros (times alpha)


class _Layouts(NamedTuple):
    """What cuDNN sees: packed NCHW or NHWC strides per role, the output's strides, staging."""

    nhwc: bool
    a_can: tuple[int, ...]
    b_can: tuple[int, ...]
    o_can: tuple[int, ...]
    o_strides: tuple[int, ...]
    staged_in: list[int]
    staged_out: bool


def _operands(op: int, nd: int, func: str, a: Any, b: Any, out: Any):
    """Read the operands; decide their common dtype and device; check ranks and strides."""
    names = _NAMES[op]
    ga, gb = _op.operand(a), _op.operand(b)
    go = _op.operand(out) if out is not None else None
    named = ((names[0], ga), (names[1], gb), ("out", go))
    dt, device = _op.same_dtype_and_device(func, named)
    for name, g in named:
        if g is not None and len(g.shape) != nd + 2:
            other = (
                "dnn_conv3d/dnn_gradinput3d/dnn_gradweight3d"
                if nd == 2
                else "dnn_conv/dnn_gradinput/dnn_gradweight"
            )
            raise ValueError(
                f"{func}: expected {nd + 2}-D operands (N, C, {nd} spatial dims), got {name} of "
                f"shape {tuple(g.shape)} ({names[0]} {tuple(ga.shape)}, {names[1]} "
                f"{tuple(gb.shape)})"
                + (
                    f"; for {len(g.shape) - 2} spatial dims use {other}"
                    if len(g.shape) in (4, 5)
                    else ""
                )
            )
    for name, g in named:
        if g is not None:
            _op.check_strides(func, name, g)
    return ga, gb, go, dt, device


def _arguments(
    op,
    nd,
    func,
    dt,
    subsample,
    dilation,
    conv_mode,
    hint,
    algo,
    precision,
    num_groups,
    alpha,
    beta,
    flags,
) -> _Args:
    """Groups, stride, dilation, mode, compute type and the algorithm policy."""
    if isinstance(num_groups, bool) or not hasattr(num_groups, "__index__"):
        raise TypeError(f"{func}: num_groups must be a positive int, got {num_groups!r}")
    groups = num_groups.__index__()
    if groups < 1:
        raise ValueError(f"{func}: num_groups must be a positive int, got {num_groups!r}")
    sub = _op.ints(subsample, nd, "subsample (stride)", 1, func)
    dil = _op.ints(dilation, nd, "dilation", 1, func)
    if conv_mode not in ("conv", "cross"):
        raise ValueError(f"{func}: conv_mode={conv_mode!r} is not 'conv' or 'cross'")
    if hint not in _HINTS:
        raise ValueError(f"{func}: direction_hint={hint!r} is not one of {_HINTS}")
    prec = flags.precision if precision is None else precision
    if not isinstance(prec, str):
        raise TypeError(f"{func}: precision must be a string, got {prec!r}")
    compute = _compute_type(dt, prec.lower(), func)
    _op.real(alpha, "alpha", func)
    _op.real(beta, "beta", func)
    explicit = algo is not None
    policy, det = _policy(op, algo if explicit else getattr(flags, _CONFIG_ALGO[op]), flags, func)
    mode = ConvolutionMode.CONVOLUTION if conv_mode == "conv" else ConvolutionMode.CROSS_CORRELATION
    return _Args(groups, sub, dil, mode, compute, policy, det, explicit)


def _shapes(
    op: int,
    nd: int,
    func: str,
    ga: Operand,
    gb: Operand,
    go: Operand | None,
    shp: Any,
    border_mode: Any,
    args: _Args,
) -> _Shapes:
    """The image, filter and output shapes (the missing one from ``*_shp`` or ``out``), the
    padding, and whether the problem reduces over nothing."""
    if op == OP_FWD:
        xs, ws_ = tuple(ga.shape), tuple(gb.shape)
    elif op == OP_BWD_DATA:
        ws_, ys = tuple(ga.shape), tuple(gb.shape)
        xs = _shape_arg(shp, nd, "img_shp", func) if shp is not None else None
        if go is not None:
            if xs is not None and xs != tuple(go.shape):
                raise ValueError(f"{func}: img_shp={xs} but out has shape {tuple(go.shape)}")
            xs = tuple(go.shape)
        if xs is None:
            raise ValueError(f"{func}: img_shp is required (or pass out=)")
    else:
        xs, ys = tuple(ga.shape), tuple(gb.shape)
        ws_ = _shape_arg(shp, nd, "kerns_shp", func) if shp is not None else None
        if go is not None:
            if ws_ is not None and ws_ != tuple(go.shape):
                raise ValueError(f"{func}: kerns_shp={ws_} but out has shape {tuple(go.shape)}")
            ws_ = tuple(go.shape)
        if ws_ is None:
            raise ValueError(f"{func}: kerns_shp is required (or pass out=)")
    if any(k < 1 for k in ws_[2:]):
        raise ValueError(f"{func}: kernel spatial sizes must be positive, got filter shape {ws_}")
    groups, sub, dil = args.groups, args.sub, args.dil
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
    out_spatial = _out_spatial(xs, ws_, pads, sub, dil)
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
    if go is not None and op == OP_FWD and tuple(go.shape) != ys:
        raise ValueError(f"{func}: out has shape {tuple(go.shape)}, expected {ys}")
    out_shape = {OP_FWD: ys, OP_BWD_DATA: xs, OP_BWD_FILTER: ws_}[op]
    # a sum over nothing (no input channels, no filters, no images, all-padding input): zeros
    no_input = any(i == 0 for i in xs[2:])
    reduced_empty = {
        OP_FWD: c_in == 0 or no_input,
        OP_BWD_DATA: k_out == 0,
        OP_BWD_FILTER: xs[0] == 0 or no_input,
    }[op]
    return _Shapes(xs, ws_, ys, pads, out_shape, reduced_empty)


def _layouts(
    func: str, ga: Operand, gb: Operand, go: Operand | None, out_shape: tuple[int, ...]
) -> _Layouts:
    """NHWC when an operand is unambiguously channels-last, else NCHW; operands whose strides
    are not packed in that layout are staged (the graph API's engines computed garbage for other
    stride orders, e.g. N/C-transposed views, instead of refusing them; ATen also makes operands
    contiguous first)."""
    present = [g for g in (ga, gb, go) if g is not None]
    nhwc = any(h and not c for c, h in (_layout.layout_of(g.shape, g.strides) for g in present))
    if go is None:
        o_strides = _layout.packed_strides(out_shape, nhwc)
    else:
        o_strides = tuple(go.strides)
        if not _layout.non_overlapping(out_shape, o_strides):
            raise ValueError(
                f"{func}: out's strides {o_strides} make elements overlap; cuDNN cannot write it"
            )
    a_can = _layout.packed_strides(ga.shape, nhwc)
    b_can = _layout.packed_strides(gb.shape, nhwc)
    o_can = _layout.packed_strides(out_shape, nhwc)
    staged_in = [
        i
        for i, g, can in ((0, ga, a_can), (1, gb, b_can))
        if not _layout.matches(g.shape, g.strides, can)
    ]
    staged_out = go is not None and not _layout.matches(out_shape, o_strides, o_can)
    return _Layouts(nhwc, a_can, b_can, o_can, o_strides, staged_in, staged_out)


def _alignment(residue: int, isz: int) -> int:
    """Byte alignment (<= 16) implied by an address residue mod 16."""
    if residue == 0:
        return 16
    return max(residue & -residue, isz)


def _problem(op, args: _Args, sh: _Shapes, lay: _Layouts, align, base) -> tuple[Problem, tuple]:
    """The plan key of the operation as the caller asked it, and the role permutation."""
    xs, ws_, ys = sh.xs, sh.ws, sh.ys
    if op == OP_FWD:
        roles = (lay.a_can, lay.b_can, lay.o_can, (0, 1, 2))
    elif op == OP_BWD_DATA:
        roles = (lay.o_can, lay.a_can, lay.b_can, (2, 0, 1))
    else:
        roles = (lay.a_can, lay.o_can, lay.b_can, (0, 2, 1))
    xstr, wstr, ystr, perm = roles
    p = Problem(
        op=op,
        mode=int(args.mode),
        x_shape=xs,
        x_strides=xstr,
        w_shape=ws_,
        w_strides=wstr,
        y_shape=ys,
        y_strides=ystr,
        pads=sh.pads,
        strides=args.sub,
        dilations=args.dil,
        x_align=align[perm[0]],
        w_align=align[perm[1]],
        y_align=align[perm[2]],
        algo=args.policy,
        **base,
    )
    return p, perm


class _Prepared(NamedTuple):
    """A validated convolution call (:func:`_prepare`): everything a call entry is built from."""

    func: str
    flags: Any
    ga: Operand
    gb: Operand
    go: Operand | None
    dt: DataType
    device: int
    args: _Args
    sh: _Shapes
    lay: _Layouts
    align: tuple[int, int, int]
    handle: Any
    base: dict
    ptrs: tuple
    spans: tuple[int, int, int]
    alloc: _op.OutputSpec | None
    stage: _op.Stage | None
    extra: Any = None  # what the caller's check returned (the epilogue's operands)


def _prepare(op, nd, a, b, shp, border_mode, subsample, dilation, conv_mode, hint, algo,
             precision, num_groups, alpha, beta, out, stream, check=None):  # fmt: skip
    """Validate and normalise a call (every check before any C call; *check(ga, shapes)* adds
    the caller's). Returns a :class:`_Prepared`, or the finished result of an empty problem (no
    cuDNN call)."""
    func = _FUNC[(op, nd)]
    flags = _op.snapshot()
    ga, gb, go, dt, device = _operands(op, nd, func, a, b, out)
    args = _arguments(
        op,
        nd,
        func,
        dt,
        subsample,
        dilation,
        conv_mode,
        hint,
        algo,
        precision,
        num_groups,
        alpha,
        beta,
        flags,
    )
    sh = _shapes(op, nd, func, ga, gb, go, shp, border_mode, args)
    lay = _layouts(func, ga, gb, go, sh.out_shape)
    extra = check(ga, sh) if check is not None else None
    if any(s == 0 for s in sh.out_shape) or sh.reduced_empty:  # no cuDNN call
        fill = sh.reduced_empty and not any(s == 0 for s in sh.out_shape)
        if fill and check is not None:
            raise errors.NotSupportedError(
                3000,
                func,
                f"a convolution that sums over nothing (image {sh.xs}, filters {sh.ws}) has no "
                "epilogue path: add the bias, z and activation to the zero output separately",
            )
        spec = _op.output_spec(sh.out_shape, dt, device, lay.nhwc)
        return _op.empty_result(func, out, spec, beta, fill)
    names = _NAMES[op]
    for what, s, st in (
        (names[0], ga.shape, ga.strides),
        (names[1], gb.shape, gb.strides),
        ("the output", sh.out_shape, lay.o_strides),
    ):
        _layout.check_int32(f"{func}: {what}", s, st)

    isz = itemsize(dt)
    residues = (
        16 if 0 in lay.staged_in else ga.ptr & 15,
        16 if 1 in lay.staged_in else gb.ptr & 15,
        0 if go is None or lay.staged_out else go.ptr & 15,
    )
    align = tuple(_alignment(r & 15, isz) for r in residues)
    h = _op.handle_for(device, stream)
    base = dict(
        device=device,
        cudnn_version=_op.cudnn_version(),
        dtype=int(dt),
        compute=int(args.compute),
        allow_tf32=bool(flags.allow_tf32) and dt == DataType.FLOAT,
        deterministic=bool(flags.deterministic or args.deterministic),
        workspace_limit=-1 if flags.workspace_limit is None else int(flags.workspace_limit),
        # a staged output takes alpha/beta in its final copy; the plan writes a fresh buffer
        alpha=1.0 if lay.staged_out else float(alpha),
        beta=0.0 if lay.staged_out else float(beta),
    )
    ptrs = (ga.ptr, gb.ptr, go.ptr if go is not None else None)
    spans = tuple(
        _layout.span(s, st) * isz
        for s, st in ((ga.shape, ga.strides), (gb.shape, gb.strides), (sh.out_shape, lay.o_strides))
    )
    alloc = None
    if go is None:
        alloc = _op.output_spec(sh.out_shape, dt, device, lay.nhwc)
    stage = None
    if lay.staged_in or lay.staged_out:
        stage = _op.Stage(
            dt,
            [(i, (ga, gb)[i], (lay.a_can, lay.b_can)[i]) for i in lay.staged_in],
            (sh.out_shape, lay.o_strides, lay.o_can) if lay.staged_out else None,
            alpha,
            beta,
        )
    return _Prepared(
        func, flags, ga, gb, go, dt, device, args, sh, lay, align, h, base, ptrs, spans, alloc,
        stage, extra,
    )  # fmt: skip


def _conv_call(op, nd, pr: _Prepared, hint, border_mode, conv_mode, algo) -> _ConvCall:
    """The call entry of a prepared convolution: a ``direction_hint`` route or the operation as
    asked, its plan cached or searched."""
    call = None
    if pr.stage is None:
        call = _route(
            op,
            nd,
            pr.func,
            hint,
            border_mode,
            conv_mode,
            pr.args,
            pr.sh,
            pr.lay,
            pr.align,
            pr.base,
            algo,
            pr.flags,
            pr.handle,
            pr.ptrs,
            pr.alloc,
            pr.spans,
        )
    if call is None:
        p, perm = _problem(op, pr.args, pr.sh, pr.lay, pr.align, pr.base)
        # timing (time_*) runs on the caller's buffers, or on the packed copies when staged
        plan = _plan_for(
            p, pr.handle, pr.ptrs if pr.stage is None else None, perm, pr.alloc, pr.flags
        )
        call = _ConvCall(op, p, plan, pr.handle, perm, pr.alloc, pr.spans, pr.stage)
    return call


def _slow(op, nd, a, b, shp, border_mode, subsample, dilation, conv_mode, hint, algo,
          precision, num_groups, alpha, beta, out, stream, key):  # fmt: skip
    """Validate and normalise a call, find (or search) its plan, cache the call entry, run it."""
    pr = _prepare(op, nd, a, b, shp, border_mode, subsample, dilation, conv_mode, hint, algo,
                  precision, num_groups, alpha, beta, out, stream)  # fmt: skip
    if not isinstance(pr, _Prepared):
        return pr  # an empty problem's result
    with _op.on_device(pr.device):  # plans are built on the operands' device
        call = _conv_call(op, nd, pr, hint, border_mode, conv_mode, algo)
    try:
        result = call.run(pr.ptrs[:2], out, pr.ptrs[2], None)
    except (errors.CudnnError, MemoryError):
        _plans.evict(call.problem)  # a plan that cannot run is never kept
        raise
    if key is not None:
        _op.calls().put(key, call)
    return result


def _route(
    op,
    nd,
    func,
    hint,
    border_mode,
    conv_mode,
    args: _Args,
    sh: _Shapes,
    lay: _Layouts,
    align,
    base,
    algo,
    flags,
    h,
    ptrs,
    alloc,
    spans,
) -> _ConvCall | None:
    """Theano's ``direction_hint`` routes of ``dnn_conv`` (views only, no copies), or None when
    there is no route, a view is not packed in the problem's layout (transposing N and C of a
    packed tensor rarely is: only with a size-1 N or C) or the gradient operation has no engine
    for the views; the forward then runs as usual."""
    if (
        op != OP_FWD
        or args.groups != 1
        or any(s != 1 for s in args.sub)
        or any(d != 1 for d in args.dil)
    ):
        return None
    if hint == "bprop weights" and all(p == 0 for p in sh.pads) and conv_mode == "cross":
        route = OP_BWD_FILTER
    elif hint != "forward!" and isinstance(border_mode, str) and border_mode.lower() == "full":
        route = OP_BWD_DATA
    else:
        return None
    try:
        chosen = algo if args.explicit_algo else getattr(flags, _CONFIG_ALGO[route])
        policy, det = _policy(route, chosen, flags, func, routed=True)
    except ValueError:
        return None

    def t(shape: tuple, strides: tuple) -> tuple[tuple, tuple]:  # swap the N and C dims
        return (shape[1], shape[0], *shape[2:]), (strides[1], strides[0], *strides[2:])

    xs, ws_, ys = sh.xs, sh.ws, sh.ys
    if route == OP_BWD_FILTER:
        # dnn_conv(img, kerns, 'valid', 'cross') == gradweight(img^T, kerns^T)^T
        x_shape, x_str = t(xs, lay.a_can)
        y_shape, y_str = t(ws_, lay.b_can)
        w_shape, w_str = t(ys, lay.o_can)
        perm, mode2 = (0, 2, 1), args.mode
    else:
        # dnn_conv(img, kerns, 'full') == gradinput(kerns^T, img) with the other conv mode
        w_shape, w_str = t(ws_, lay.b_can)
        y_shape, y_str = xs, lay.a_can
        x_shape, x_str = ys, lay.o_can
        perm = (2, 1, 0)
        mode2 = (
            ConvolutionMode.CROSS_CORRELATION
            if args.mode == ConvolutionMode.CONVOLUTION
            else ConvolutionMode.CONVOLUTION
        )
    nhwc = lay.nhwc
    for shape, strides in ((x_shape, x_str), (w_shape, w_str), (y_shape, y_str)):
        if not _layout.matches(shape, strides, _layout.packed_strides(shape, nhwc)):
            return None
    # the views' strides, made canonical for their size-1 dims
    x_str, w_str, y_str = (_layout.packed_strides(s, nhwc) for s in (x_shape, w_shape, y_shape))
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
        dilations=tuple(args.dil),
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
    return _ConvCall(op, p, plan, h, perm, alloc, spans)


# ==================================================================================================
# Fused epilogues: out = act(alpha * conv(img, kerns) + z_alpha * z + bias)
# ==================================================================================================
class _FusedCall(_ConvCall):
    """One fused graph (:class:`._fusion.FusedProblem`): its plan runs x, w, [bias], [z], y."""

    __slots__ = ()

    def launch(self, ptrs: Sequence[int]) -> None:
        ws = self.workspace
        self.plan.run(*ptrs, _op.workspace(self.handle, ws) if ws else 0)

    @property
    def epilogue(self) -> str | None:
        return self.problem.label.split("+", 1)[1]


class _SeparateCall(_ConvCall):
    """The epilogue as separate steps, where no fused engine runs the graph: the plain
    convolution (its own call entry: route, staging, legacy algorithm), then ``cudnnAddTensor``
    for the bias and ``z`` and ``cudnnActivationForward`` in place on the output."""

    __slots__ = ("_epilogue", "act_fn", "add", "hp", "inner", "keep", "steps", "why", "ydesc")

    def __init__(self, inner: _ConvCall, alloc, spans, steps, ydesc, keep, epilogue: str,
                 why: str):  # fmt: skip
        super().__init__(
            inner.op, inner.problem, inner.plan, inner.handle, inner.perm, alloc, spans
        )
        self.inner = inner
        self.steps = steps  # ("add", desc, alpha_ref, one_ref) | ("act", desc, one_ref, zero_ref)
        self.ydesc = ydesc  # the final output's descriptor
        self.keep = keep  # the scaling factors the steps' byref()s point into
        self.hp = inner.handle.ptr
        self.add = _op.quiet("cudnnAddTensor")
        self.act_fn = _op.quiet("cudnnActivationForward")
        self._epilogue = epilogue
        self.why = why  # why no fused engine runs it (diagnostics)

    def launch(self, ptrs: Sequence[int]) -> None:
        y = ptrs[-1]
        self.inner.run(ptrs[:2], y, y, None)  # out given: the inner call allocates nothing
        hp, i, ydesc = self.hp, 2, self.ydesc
        for kind, desc, a, b in self.steps:
            if kind == "add":
                self.add(hp, a, desc, ptrs[i], b, ydesc, y)
                i += 1
            else:
                self.act_fn(hp, desc, a, ydesc, y, b, ydesc, y)

    @property
    def staged(self) -> bool:
        return self.inner.stage is not None

    @property
    def epilogue(self) -> str | None:
        return self._epilogue


class _NoEngine:
    """A plan-cache entry saying that no engine runs a fused graph (so another spelling of the
    call does not search again); ``reason`` is the search's error."""

    __slots__ = ("reason",)

    def __init__(self, reason: str):
        self.reason = reason

    def close(self) -> None:
        pass


def _fused(nd, a, b, border_mode, subsample, dilation, conv_mode, hint, algo, precision,
           num_groups, bias, activation, z, z_alpha, alpha, beta, out, stream):  # fmt: skip
    """The hot path of a convolution with an epilogue: the call key of every operand, then the
    cached call entry (or :func:`_fused_slow`)."""
    pa, ka = _op.key_of(a)
    pb, kb = _op.key_of(b)
    ptrs: tuple = (pa, pb)
    kbias = kz = None
    if bias is not None:
        pbias, kbias = _op.key_of(bias)
        ptrs += (pbias,)
    if z is not None:
        pz, kz = _op.key_of(z)
        ptrs += (pz,)
    if out is None:
        po = okey = None
    else:
        po, okey = _op.key_of(out)
    key = ("fused", nd, ka, kb, kbias, kz, okey, border_mode, subsample, dilation, conv_mode,
           hint, algo, precision, num_groups, activation, z_alpha, alpha, beta,
           _op.snapshot())  # fmt: skip
    result = _cached_run(key, ptrs, out, po, stream)
    if result is _MISS or result is _UNHASHABLE:
        return _fused_slow(nd, a, b, border_mode, subsample, dilation, conv_mode, hint, algo,
                           precision, num_groups, bias, activation, z, z_alpha, alpha, beta, out,
                           stream, None if result is _UNHASHABLE else key)  # fmt: skip
    return result


def _epilogue_operands(func: str, nd: int, ga: Operand, ys: tuple[int, ...], bias: Any, z: Any):
    """The bias and z operands, checked against the convolution's output (before any C call)."""
    k = ys[1]
    gbias = _op.operand(bias) if bias is not None else None
    gz = _op.operand(z) if z is not None else None
    _op.same_dtype_and_device(func, (("img", ga), ("bias", gbias), ("z", gz)))
    if gbias is not None:
        shapes = ((k,), (1, k, *(1,) * nd))
        if tuple(gbias.shape) not in shapes:
            raise ValueError(
                f"{func}: bias must have shape {shapes[0]} or {shapes[1]} (one value per output "
                f"channel), got {tuple(gbias.shape)}"
            )
        kstride = gbias.strides[0] if len(gbias.shape) == 1 else gbias.strides[1]
        if k > 1 and kstride != 1:
            raise ValueError(
                f"{func}: bias must be contiguous along its {k} channels (stride 1), got strides "
                f"{tuple(gbias.strides)}"
            )
    if gz is not None:
        if tuple(gz.shape) != ys:
            raise ValueError(f"{func}: z must have the output's shape {ys}, got {tuple(gz.shape)}")
        _op.check_strides(func, "z", gz)
        _layout.check_int32(f"{func}: z", gz.shape, gz.strides)
    return gbias, gz


def _fused_slow(nd, a, b, border_mode, subsample, dilation, conv_mode, hint, algo, precision,
                num_groups, bias, activation, z, z_alpha, alpha, beta, out, stream,
                key):  # fmt: skip
    """Validate a convolution with an epilogue, build its fused graph's call entry -- or the
    separate steps' when no engine runs the graph -- cache it and run it."""
    func = _FUNC[(OP_FWD, nd)]
    act = _fusion.activation(activation, func)
    z_alpha = _op.real(z_alpha, "z_alpha", func)
    if z is None and z_alpha != 1.0:
        raise ValueError(f"{func}: z_alpha={z_alpha!r} is given without z (the residual it scales)")
    if _op.real(beta, "beta", func) != 0.0:
        raise ValueError(
            f"{func}: beta={beta!r} must be 0 with an epilogue (bias, activation or z): "
            "out = act(alpha * conv + z_alpha * z + bias) replaces out; pass out as z to add it"
        )

    def check(ga: Operand, sh: _Shapes) -> tuple:
        return _epilogue_operands(func, nd, ga, sh.ys, bias, z)

    pr = _prepare(OP_FWD, nd, a, b, None, border_mode, subsample, dilation, conv_mode, hint,
                  algo, precision, num_groups, alpha, beta, out, stream, check)  # fmt: skip
    if not isinstance(pr, _Prepared):
        return pr  # an empty output: nothing to compute
    gbias, gz = pr.extra
    isz = itemsize(pr.dt)
    extra = [g for g in (gbias, gz) if g is not None]
    in_ptrs = (pr.ga.ptr, pr.gb.ptr, *(g.ptr for g in extra))
    spans = (*pr.spans[:2], *(_layout.span(g.shape, g.strides) * isz for g in extra), pr.spans[2])
    names = [n for n, g in (("bias", gbias), ("add", gz)) if g is not None]
    epilogue = "+".join(names + ([act[0]] if act else []))

    with _op.on_device(pr.device):  # plans are built on the operands' device
        call = _fused_entry(nd, pr, hint, border_mode, conv_mode, algo, gbias, gz, act, z_alpha,
                            in_ptrs, spans, epilogue)  # fmt: skip
    try:
        result = call.run(in_ptrs, out, pr.ptrs[2], None)
    except (errors.CudnnError, MemoryError):
        _plans.evict(call.problem)
        raise
    if key is not None:
        _op.calls().put(key, call)
    return result


def _fused_entry(nd, pr: _Prepared, hint, border_mode, conv_mode, algo, gbias, gz, act,
                 z_alpha, in_ptrs, spans, epilogue) -> _ConvCall:  # fmt: skip
    """The fused graph's call entry, or the separate steps' when it cannot be fused."""
    isz = itemsize(pr.dt)
    call: _ConvCall | None = None
    why = ""
    if pr.stage is not None:
        why = "operands staged through packed copies (strides not packed NCHW/NHWC)"
    elif pr.args.policy not in ("guess", "time"):
        why = f"the legacy algorithm {pr.args.policy!r} was asked for"
    elif gz is not None and not _layout.matches(gz.shape, gz.strides, pr.lay.o_can):
        why = "z is not packed in the output's layout"
    else:
        conv_p, _perm = _problem(OP_FWD, pr.args, pr.sh, pr.lay, pr.align, pr.base)
        bshape = (1, pr.sh.ys[1], *(1,) * nd)
        fp = _fusion.FusedProblem(
            conv_p,
            None if gbias is None else _fusion.Tensor(
                bshape, _layout.packed_strides(bshape, pr.lay.nhwc), _alignment(gbias.ptr & 15, isz)
            ),
            None if gz is None else _fusion.Tensor(
                pr.sh.ys, pr.lay.o_can, _alignment(gz.ptr & 15, isz)
            ),
            z_alpha,
            act[0] if act else None,
            act[1] if act else None,
        )  # fmt: skip
        plan = _fused_plan(fp, pr.handle, in_ptrs, pr.flags)
        if isinstance(plan, _NoEngine):
            why = plan.reason
        else:
            call = _FusedCall(OP_FWD, fp, plan, pr.handle, (0, 1, 2), pr.alloc, spans)
    if call is None:
        call = _separate_call(nd, pr, hint, border_mode, conv_mode, algo, gbias, gz, act,
                              z_alpha, spans, epilogue, why)  # fmt: skip
    return call


def _fused_plan(fp: Any, h: Any, in_ptrs: tuple, flags: Any) -> Any:
    """The cached plan of the fused graph *fp*, a new one, or a :class:`_NoEngine` (cached too)
    when cuDNN has no engine for it."""
    plan = _plans.cached_plan(fp)
    if plan is not None:
        _plans.stats.hits += 1
        return plan
    _plans.stats.misses += 1

    def ws(nbytes: int) -> int:
        return _op.workspace(h, nbytes)

    timing = None
    if fp.algo == "time":

        def timing(plans: list) -> list[float]:
            # the caller's inputs, a scratch output (out may be the caller's data)
            c = fp.conv
            n = max(_layout.span(c.y_shape, c.y_strides), 1)
            buf = memory.empty((n,), numpy_dtype(DataType(c.dtype)), c.device, h.stream)

            def run(gp: Any) -> None:
                gp.run(*in_ptrs, buf.ptr, ws(gp.workspace) if gp.workspace else 0)

            try:
                return _plans.time_plans(plans, run, h.stream)
            finally:
                for gp in plans:
                    gp.close()
                del buf

    try:
        plan = _plans.get_plan(fp, lambda: _plans.search_graph_plan(fp, h, ws, timing))
    except errors.CudnnError as exc:  # no engine builds the graph (AllocationError included)
        plan = _NoEngine(f"no fused engine: {exc}")
        _plans.remember(fp, plan)
    if flags.verbose:
        print(f"pycudnn: {fp.what()} -> "
              f"{plan.reason if isinstance(plan, _NoEngine) else plan.describe()}",
              file=sys.stderr)  # fmt: skip
    return plan


def _separate_call(nd, pr: _Prepared, hint, border_mode, conv_mode, algo, gbias, gz, act,
                   z_alpha, spans, epilogue: str, why: str) -> _SeparateCall:  # fmt: skip
    """The separate-steps call entry (module docstring of :mod:`._fusion`)."""
    dt = pr.dt
    if act is not None and act[0] not in _fusion.SEPARATE:
        raise errors.NotSupportedError(
            3000,
            pr.func,
            f"activation {act[0]!r} has no legacy kernel (cuDNN's legacy activations have no "
            f"GELU) and no fused engine runs this call ({why}); GELU epilogues need cuDNN's "
            "runtime fusion: packed NHWC float16/bfloat16 operands on an sm80+ GPU",
        )
    inner = _conv_call(OP_FWD, nd, pr, hint, border_mode, conv_mode, algo)
    one, zero, za = _op.scales(dt, 1.0, 0.0, z_alpha)
    # the final output's strides (the inner call stages a strided out itself)
    ystr = pr.alloc.element_strides if pr.alloc is not None else tuple(pr.go.strides)
    ydesc = _op.tensor_descriptor(*_op.padded(pr.sh.ys, ystr), dt)
    steps: list[tuple] = []
    if gbias is not None:
        bshape = (1, pr.sh.ys[1], *(1,) * nd)
        bdesc = _op.tensor_descriptor(*_op.padded(bshape, _layout.packed_strides(bshape)), dt)
        steps.append(("add", bdesc, ctypes.byref(one), ctypes.byref(one)))
    if gz is not None:
        zdesc = _op.tensor_descriptor(*_op.padded(gz.shape, gz.strides), dt)
        steps.append(("add", zdesc, ctypes.byref(za), ctypes.byref(one)))
    if act is not None:
        name, coef = act
        mode = _fusion.SEPARATE[name]
        if mode == _fusion.SEPARATE["swish"]:
            adesc = ActivationDescriptor(mode, 0.0, nan_propagation=True, swish_beta=1.0)
        else:
            adesc = ActivationDescriptor(mode, coef or 0.0, nan_propagation=True)
        steps.append(("act", adesc, ctypes.byref(one), ctypes.byref(zero)))
    return _SeparateCall(inner, pr.alloc, spans, steps, ydesc, (one, zero, za), epilogue, why)


# ==================================================================================================
# Plans: cached, searched (heuristics or timing) or a pinned legacy algorithm
# ==================================================================================================
def _plan_for(p: Problem, h: Any, ptrs: tuple | None, perm: tuple, alloc: Any, flags: Any) -> Any:
    """The cached plan of *p* or a new one (searched on the caller's buffers)."""
    plan = _plans.cached_plan(p)
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
            return _plans.get_plan(p2, lambda: _graph_plan(p2, h, ptrs, perm))
        return _graph_plan(p, h, ptrs, perm)

    plan = _plans.get_plan(p, build)
    if flags.verbose:
        print(
            f"pycudnn: {_plans.OP_NAMES[p.op]} conv x{p.x_shape} w{p.w_shape} y{p.y_shape} "
            f"{DataType(p.dtype).name}/{DataType(p.compute).name} ({p.algo}) -> {plan.describe()}",
            file=sys.stderr,
        )
    return plan


def _graph_plan(p: Problem, h: Any, ptrs: tuple | None, perm: tuple) -> Any:
    def ws(nbytes: int) -> int:
        return _op.workspace(h, nbytes)

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
                n = max(_layout.span(shape, strides), 1)
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
    nchw_w, nhwc_w = _layout.layout_of(p.w_shape, p.w_strides)
    wfmt = "NCHW" if nchw_w else "NHWC" if nhwc_w else None
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
            _op.quiet(q)(h.ptr, dx.ptr, dw.ptr, dconv.ptr, dy.ptr, int(algo), ctypes.byref(size))
            name = "cudnnConvolutionForward"
        elif p.op == OP_BWD_DATA:
            q = "cudnnGetConvolutionBackwardDataWorkspaceSize"
            _op.quiet(q)(h.ptr, dw.ptr, dy.ptr, dconv.ptr, dx.ptr, int(algo), ctypes.byref(size))
            name = "cudnnConvolutionBackwardData"
        else:
            q = "cudnnGetConvolutionBackwardFilterWorkspaceSize"
            _op.quiet(q)(h.ptr, dx.ptr, dy.ptr, dconv.ptr, dw.ptr, int(algo), ctypes.byref(size))
            name = "cudnnConvolutionBackwardFilter"
        ws = int(size.value)
        if p.workspace_limit >= 0 and ws > p.workspace_limit:
            raise errors.NotSupportedError(
                3000, q, f"workspace {ws} B is over the limit {p.workspace_limit} B"
            )
        if ws:
            _op.workspace(h, ws)
    except (errors.CudnnError, MemoryError, ValueError) as exc:
        warnings.warn(
            f"pycudnn: the legacy algorithm {p.algo!r} cannot run this {_plans.OP_NAMES[p.op]} "
            f"convolution ({exc}); using cuDNN's heuristics instead",
            RuntimeWarning,
            stacklevel=5,
        )
        return None
    alpha, beta = _op.scales(dt, p.alpha, p.beta)
    _plans.stats.builds += 1
    return _plans.LegacyPlan(
        _op.quiet(name), name, int(algo), (dx, dw, dconv, dy), h, ws, alpha, beta
    )


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
    bias: Any = None,
    activation: str | tuple[str, float] | None = None,
    z: Any = None,
    z_alpha: float = 1.0,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Any = None,
    stream: Any = None,
) -> Any:
    """2-D convolution of *img* with *kerns*, Theano's ``dnn_conv`` on cuDNN's graph API, with an
    optional fused epilogue ``act(alpha * conv + z_alpha * z + bias)``.

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
    bias : device array, optional
        ``(K,)`` or ``(1, K, 1, 1)``, contiguous, the dtype of *img*: added per output channel.
    activation : str or (str, float), optional
        Applied last: ``'relu'``, ``'gelu'`` (erf), ``'gelu_tanh'`` (tanh approximation),
        ``'silu'``/``'swish'``, ``'sigmoid'``, ``'tanh'``, ``'elu'`` (or ``('elu', alpha)``) and
        ``('clipped_relu', upper)``.
    z : device array, optional
        A residual of the output's shape and dtype, added as ``z_alpha * z`` before the bias's
        activation (ResNet's ``relu(conv + bias + shortcut)``); it may not overlap *out*.
    z_alpha : float
        The scale of *z*.
    alpha, beta : float
        ``out = alpha * conv + beta * out`` (*beta* != 0 accumulates into *out*). With an
        epilogue *beta* must be 0 (pass *out* as *z* to add it).
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
        No engine can run it; the message lists every engine tried and why. A GELU epilogue
        that no fused engine runs (GELU has no separate-steps form).

    Notes
    -----
    An epilogue is built as one graph -- convolution, then pointwise additions and the
    activation on float32 intermediates -- and runs as one fused kernel where cuDNN's runtime
    fusion has an engine for it (packed NHWC float16/bfloat16 on sm80+ GPUs), rounding to the
    output type once. Elsewhere (NCHW, float32/float64, staged strides, a legacy ``algo``) it
    runs as the convolution followed by ``cudnnAddTensor`` and ``cudnnActivationForward`` on
    the output, with the same result up to rounding. ``last_call().fused`` and
    ``last_call().plan.describe()`` say which ran. ``direction_hint`` routes apply only to the
    separate-steps form.

    Examples
    --------
    >>> x = torch.randn(8, 3, 32, 32, device="cuda")
    >>> w = torch.randn(16, 3, 3, 3, device="cuda")
    >>> y = torch.from_dlpack(pycudnn.dnn_conv(x, w, border_mode="half", conv_mode="cross"))
    >>> b = torch.randn(16, device="cuda")
    >>> y = pycudnn.dnn_conv(x, w, border_mode="half", conv_mode="cross", bias=b,
    ...                      activation="relu")
    """
    if bias is not None or activation is not None or z is not None:
        return _fused(2, img, kerns, border_mode, subsample, dilation, conv_mode,
                      direction_hint, algo, precision, num_groups, bias, activation, z, z_alpha,
                      alpha, beta, out, stream)  # fmt: skip
    if z_alpha != 1.0:
        raise ValueError(
            f"dnn_conv: z_alpha={z_alpha!r} is given without z (the residual it scales)"
        )
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
    bias: Any = None,
    activation: str | tuple[str, float] | None = None,
    z: Any = None,
    z_alpha: float = 1.0,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Any = None,
    stream: Any = None,
) -> Any:
    """3-D convolution: :func:`dnn_conv` for ``(N, C, D, H, W)`` images (NCDHW or NDHWC) and
    ``(K, C / num_groups, kD, kH, kW)`` filters, with the same optional epilogue (*bias* of
    shape ``(K,)`` or ``(1, K, 1, 1, 1)``). Same parameters, returns and errors."""
    if bias is not None or activation is not None or z is not None:
        return _fused(3, img, kerns, border_mode, subsample, dilation, conv_mode,
                      direction_hint, algo, precision, num_groups, bias, activation, z, z_alpha,
                      alpha, beta, out, stream)  # fmt: skip
    if z_alpha != 1.0:
        raise ValueError(
            f"dnn_conv3d: z_alpha={z_alpha!r} is given without z (the residual it scales)"
        )
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
