"""The convolution problem: the plan key of one convolution, its operation graph, and Theano's
named legacy algorithms.

:class:`Problem` is everything that changes a convolution's execution plan; hashable, it *is*
the plan-cache key, and it implements the plan engine's key protocol
(:mod:`pycudnn.graph._plans`): ``build_graph`` (one convolution operation), ``uids`` (x, w, y),
``timing_buffers`` (the caller's inputs and a scratch output) and ``make_plan`` (a pinned legacy
algorithm, :class:`LegacyPlan`, or the heuristics' plan when cuDNN's legacy API cannot run it).
Every differently spelt call that means the same convolution (a ``direction_hint`` route, a
transposed view) builds the same ``Problem`` and so shares one plan.
"""

from __future__ import annotations

import ctypes
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ... import _layout, errors, memory
from ..._types import numpy_dtype, scaling_type
from ...descriptors import (
    BackendDescriptor,
    ConvolutionDescriptor,
    FilterDescriptor,
    TensorDescriptor,
)
from ...descriptors._conv_operation import CONV_OPERATIONS, conv_operation_attributes
from ...enums import (
    ConvolutionBwdDataAlgo,
    ConvolutionBwdFilterAlgo,
    ConvolutionFwdAlgo,
    ConvolutionMode,
    DataType,
)
from ...graph import _plans
from .. import _call

__all__ = [
    "LEGACY",
    "OP_BWD_DATA",
    "OP_BWD_FILTER",
    "OP_FWD",
    "OP_NAMES",
    "UIDS",
    "LegacyPlan",
    "alignment",
    "Problem",
    "build_operation_graph",
    "conv_operation",
]

OP_FWD, OP_BWD_DATA, OP_BWD_FILTER = 0, 1, 2
OP_NAMES = ("forward", "backward_data", "backward_filter")
UIDS = (1, 2, 3)  #: the variant-pack unique ids of x, w, y
#: the role (x 0, w 1, y 2) each operation writes
_OUT_ROLE = {OP_FWD: 2, OP_BWD_DATA: 0, OP_BWD_FILTER: 1}

#: Theano's named algorithms -> legacy cuDNN algorithm, per direction (theano/gpuarray/dnn.py)
LEGACY: dict[int, dict[str, int]] = {
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


def alignment(residue: int, itemsize: int) -> int:
    """Byte alignment (<= 16) implied by an address residue mod 16 (at least the item size: a
    smaller one was refused by the stride checks)."""
    if residue == 0:
        return 16
    return max(residue & -residue, itemsize)


class Problem(NamedTuple):
    """Everything that changes a convolution's execution plan; hashable, it is the cache key.

    Tensor roles follow cuDNN's forward naming for every operation: ``x`` is the image (the
    output ``dx`` of backward-data), ``w`` the filter (the output ``dw`` of backward-filter),
    ``y`` the convolution output (the input ``dy`` of both backward operations). Strides are in
    elements, shapes in (N, C, spatial...) order.
    """

    op: int
    device: int
    cudnn_version: int
    dtype: int
    compute: int
    mode: int
    x_shape: tuple[int, ...]
    x_strides: tuple[int, ...]
    w_shape: tuple[int, ...]
    w_strides: tuple[int, ...]
    y_shape: tuple[int, ...]
    y_strides: tuple[int, ...]
    pads: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    allow_tf32: bool
    deterministic: bool
    x_align: int
    w_align: int
    y_align: int
    workspace_limit: int  # bytes; -1 = unlimited
    alpha: float
    beta: float
    algo: str  # 'guess' | 'time' | a legacy algorithm name

    # -- the graph-key protocol of pycudnn.graph._plans ---------------------------------------
    @property
    def uids(self) -> tuple[int, ...]:
        """The pointers' order in a variant pack: x, w, y."""
        return UIDS

    @property
    def label(self) -> str | None:
        return None

    def build_graph(self, handle: Any) -> BackendDescriptor:
        return build_operation_graph(self, handle)

    def what(self) -> str:
        return (
            f"{OP_NAMES[self.op]} convolution, x{self.x_shape} w{self.w_shape} y{self.y_shape}, "
            f"{DataType(self.dtype).name} data, {DataType(self.compute).name} compute"
        )

    def timing_buffers(self, handle: Any, given_ptrs: Sequence[int] | None) -> tuple[tuple, list]:
        """x, w, y pointers to time candidate plans on: the caller's inputs (*given_ptrs*, in
        x, w, y order) and a scratch output (an accumulating ``out`` must stay intact); scratch
        throughout when the call is staged (*given_ptrs* None)."""
        out_role = _OUT_ROLE[self.op]
        npdt = numpy_dtype(DataType(self.dtype))
        keep: list = []
        ptrs: list[int] = []
        roles = (
            (self.x_shape, self.x_strides),
            (self.w_shape, self.w_strides),
            (self.y_shape, self.y_strides),
        )
        for role, (shape, strides) in enumerate(roles):
            if given_ptrs is not None and role != out_role:
                ptrs.append(given_ptrs[role])
                continue
            n = max(_layout.span(shape, strides), 1)
            buf = memory.empty((n,), npdt, self.device, handle.stream)
            keep.append(buf)
            ptrs.append(buf.ptr)
        return tuple(ptrs), keep

    def make_plan(self, handle: Any, given_ptrs: Sequence[int] | None) -> Any:
        """A named legacy algorithm's :class:`LegacyPlan`; where cuDNN's legacy API cannot run
        it, the heuristics' plan (cached under that key too). None for the engine's search."""
        if self.algo in ("guess", "time"):
            return None
        plan = legacy_plan(self, handle)
        if plan is not None:
            return plan
        return _plans.alias(self._replace(algo="guess"), handle, given_ptrs)


# -- graph construction ----------------------------------------------------------------------------
#: the roles of x, w and y (the Problem's forward naming) in each operation's encoding
#: (:data:`pycudnn.descriptors._conv_operation.CONV_OPERATIONS`)
_ROLES = {OP_FWD: ("x", "w", "y"), OP_BWD_DATA: ("dx", "w", "dy"), OP_BWD_FILTER: ("x", "dw", "dy")}


def conv_operation(p: Problem, y: BackendDescriptor | None = None) -> BackendDescriptor:
    """The finalized convolution operation of *p* (its x, w, y tensor descriptors made here;
    *y* replaces the output descriptor, e.g. by a virtual tensor that an epilogue reads)."""
    dt = DataType(p.dtype)
    tx = BackendDescriptor.tensor(p.x_shape, p.x_strides, dt, uid=UIDS[0], alignment=p.x_align)
    tw = BackendDescriptor.tensor(p.w_shape, p.w_strides, dt, uid=UIDS[1], alignment=p.w_align)
    if y is None:
        y = BackendDescriptor.tensor(p.y_shape, p.y_strides, dt, uid=UIDS[2], alignment=p.y_align)
    conv = BackendDescriptor.convolution(
        p.pads,
        p.pads,
        p.strides,
        p.dilations,
        mode=ConvolutionMode(p.mode),
        compute_type=DataType(p.compute),
    )
    name = OP_NAMES[p.op]
    tensors = dict(zip(_ROLES[p.op], (tx, tw, y), strict=True))
    scaling = (scaling_type(p.compute), p.alpha, p.beta)
    op = BackendDescriptor(CONV_OPERATIONS[name].descriptor)
    for attr, atype, value in conv_operation_attributes(name, tensors, conv, scaling):
        op.set(attr, atype, value)
    return op.finalize()


def build_operation_graph(p: Problem, handle: Any) -> BackendDescriptor:
    """Tensors, convolution and operation descriptors, and the finalized operation graph.

    Everything is created with ``set`` + ``finalize`` (no GPU is needed until ``finalize``); the
    graph keeps its children alive.
    """
    return BackendDescriptor.operation_graph([conv_operation(p)], handle)


# -- legacy algorithms -----------------------------------------------------------------------------
class LegacyPlan:
    """A legacy-API convolution with a pinned algorithm (Theano's named algorithms).

    Holds the tensor/filter/convolution descriptors; :meth:`run` calls
    ``cudnnConvolution{Forward,BackwardData,BackwardFilter}`` with prebuilt scaling arguments.
    """

    __slots__ = ("__weakref__", "algo", "args", "descs", "fn", "handle", "name", "workspace")
    kind = "legacy"
    fused = False
    label = None

    def __init__(
        self, name: str, algo: int, descs: tuple, handle: Any, workspace: int, scales: tuple
    ) -> None:
        """*descs*: the x, w, convolution and y descriptors; *scales*: ctypes alpha and beta."""
        self.fn: Callable[..., Any] = _call.quiet(name)
        self.name, self.algo, self.descs = name, algo, descs
        self.handle, self.workspace = handle, workspace
        alpha, beta = scales
        self.args = (ctypes.byref(alpha), ctypes.byref(beta), alpha, beta)

    def run(self, xp: int, wp: int, yp: int, wsp: int) -> None:
        h = self.handle.ptr
        dx, dw, dconv, dy = self.descs
        alpha, beta = self.args[0], self.args[1]
        ws = wsp or None
        if self.name == "cudnnConvolutionForward":
            self.fn(h, alpha, dx, xp, dw, wp, dconv, self.algo, ws, self.workspace, beta, dy, yp)
        elif self.name == "cudnnConvolutionBackwardData":
            self.fn(h, alpha, dw, wp, dy, yp, dconv, self.algo, ws, self.workspace, beta, dx, xp)
        else:
            self.fn(h, alpha, dx, xp, dy, yp, dconv, self.algo, ws, self.workspace, beta, dw, wp)

    def describe(self) -> str:
        return f"legacy {self.name} algo {self.algo} (workspace {self.workspace} B)"

    def close(self) -> None:
        pass


#: operation -> (workspace-size query, the convolution call)
_LEGACY_CALLS = {
    OP_FWD: ("cudnnGetConvolutionForwardWorkspaceSize", "cudnnConvolutionForward"),
    OP_BWD_DATA: ("cudnnGetConvolutionBackwardDataWorkspaceSize", "cudnnConvolutionBackwardData"),
    OP_BWD_FILTER: (
        "cudnnGetConvolutionBackwardFilterWorkspaceSize",
        "cudnnConvolutionBackwardFilter",
    ),
}
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _callers_level() -> int:
    """The ``stacklevel`` of a warning issued by this module's caller that names the first frame
    outside pycudnn (the user's call of ``dnn_conv``, however deep the plan was made)."""
    frame = sys._getframe(2)
    level = 2
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
        level += 1
    return level


def legacy_plan(p: Problem, h: Any) -> LegacyPlan | None:
    """A :class:`LegacyPlan` for a named Theano algorithm, or None (with a warning) when
    cuDNN's legacy API cannot run it here; the caller then uses the heuristics."""
    algo = LEGACY[p.op][p.algo]
    dt = DataType(p.dtype)
    try:
        descs = _legacy_descriptors(p, dt)
        query, name = _LEGACY_CALLS[p.op]
        ws = _legacy_workspace(p, h, descs, query, int(algo))
    except (errors.CudnnError, MemoryError, ValueError) as exc:
        warnings.warn(
            f"pycudnn: the legacy algorithm {p.algo!r} cannot run this {OP_NAMES[p.op]} "
            f"convolution ({exc}); using cuDNN's heuristics instead",
            RuntimeWarning,
            stacklevel=_callers_level(),
        )
        return None
    plan = LegacyPlan(name, int(algo), descs, h, ws, _call.scales(dt, p.alpha, p.beta))
    _plans.built()
    return plan


def _legacy_descriptors(p: Problem, dt: DataType) -> tuple:
    """The x, w, convolution and y descriptors of the legacy API (math type by cuDNN's rules:
    tensor ops for half types, FMA for fp32 without TF32)."""
    nchw_w, nhwc_w = _layout.layout_of(p.w_shape, p.w_strides)
    if not (nchw_w or nhwc_w):
        raise errors.NotSupportedError(
            3000, "dnn_conv", "the legacy API needs a packed NCHW or NHWC filter"
        )
    if dt in (DataType.HALF, DataType.BFLOAT16):
        math = "tensor_op"
    elif dt == DataType.FLOAT and not p.allow_tf32:
        math = "fma"
    else:
        math = "default"
    dconv = ConvolutionDescriptor(
        p.pads,
        p.strides,
        p.dilations,
        mode=ConvolutionMode(p.mode),
        compute_type=DataType(p.compute),
        groups=p.x_shape[1] // p.w_shape[1],
        math_type=math,
    )
    return (
        TensorDescriptor(p.x_shape, dt, p.x_strides),
        FilterDescriptor(p.w_shape, dt, "NCHW" if nchw_w else "NHWC"),
        dconv,
        TensorDescriptor(p.y_shape, dt, p.y_strides),
    )


def _legacy_workspace(p: Problem, h: Any, descs: tuple, query: str, algo: int) -> int:
    """The legacy algorithm's workspace in bytes, within the limit and allocated (so that a
    workspace that cannot be had fails here, not at the first run)."""
    dx, dw, dconv, dy = descs
    size = ctypes.c_size_t(0)
    # each query takes its operation's inputs, then the output
    roles = {OP_FWD: (dx, dw, dy), OP_BWD_DATA: (dw, dy, dx), OP_BWD_FILTER: (dx, dy, dw)}
    first, second, result = roles[p.op]
    query_fn = _call.quiet(query)
    query_fn(h.ptr, first.ptr, second.ptr, dconv.ptr, result.ptr, algo, ctypes.byref(size))
    ws = int(size.value)
    if p.workspace_limit >= 0 and ws > p.workspace_limit:
        raise errors.NotSupportedError(
            3000, query, f"workspace {ws} B is over the limit {p.workspace_limit} B"
        )
    if ws:
        _call.workspace(h, ws)
    return ws
