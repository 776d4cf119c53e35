"""Batch normalization's call entries (:mod:`.batchnorm` builds them): training, inference and
the backward, on cuDNN's legacy calls, and channels-last training and backward on their ``...Ex``
forms.

**Channels-last float16/bfloat16** (spatial mode): the plain legacy training and backward run such
data at a few percent of the memory bandwidth (measured on an H100, cuDNN 9.19: 29-50x torch's
time), while ``cudnnBatchNormalizationForwardTrainingEx`` / ``cudnnBatchNormalizationBackwardEx``
in ``CUDNN_BATCHNORM_SPATIAL_PERSISTENT`` mode have NHWC kernels (the ones PyTorch runs for
channels-last batch norm). Plain batch norm (``CUDNN_BATCHNORM_OPS_BN``) needs no reserve space
between the two (:func:`ex_workspace` checks it), so the public functions' statistics are all the
backward needs, as for the other modes.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any, NamedTuple

from ..enums import BatchNormMode, BatchNormOps, DataType
from . import _call

__all__ = [
    "ActBackwardCall",
    "ActSizes",
    "ActTrainCall",
    "BackwardCall",
    "BatchNormCall",
    "InferenceCall",
    "TrainCall",
    "act_sizes",
    "check_running",
    "ex_workspace",
    "use_ex",
]

_EX_TRAIN = "cudnnBatchNormalizationForwardTrainingEx"
_EX_BWD = "cudnnBatchNormalizationBackwardEx"
_OPS_BN = int(BatchNormOps.BN)


def ex_workspace(h: Any, xd: Sequence[Any], pd: Any, backward: bool) -> int | None:
    """Workspace bytes of the ``SPATIAL_PERSISTENT`` ``...Ex`` call on these descriptors (*xd*:
    x and y, or x, dy and dx), or None when cuDNN would need a reserve space (which the public
    functions do not carry from the forward to the backward) or refuses the descriptors."""
    mode = int(BatchNormMode.SPATIAL_PERSISTENT)
    size = ctypes.c_size_t()
    try:
        _call.quiet("cudnnGetBatchNormalizationTrainingExReserveSpaceSize")(
            h.ptr, mode, _OPS_BN, None, xd[0].ptr, ctypes.byref(size)
        )
        if size.value:
            return None
        if backward:
            x, dy, dx = (d.ptr for d in xd)
            _call.quiet("cudnnGetBatchNormalizationBackwardExWorkspaceSize")(
                h.ptr, mode, _OPS_BN, x, None, dy, None, dx, pd.ptr, None, ctypes.byref(size)
            )
        else:
            x, y = (d.ptr for d in xd)
            _call.quiet("cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize")(
                h.ptr, mode, _OPS_BN, x, None, y, pd.ptr, None, ctypes.byref(size)
            )
    except Exception:
        return None
    return size.value


def check_running(call: _call.Call, ptrs: Sequence[int], written: tuple, n: int, names) -> None:
    """Running averages updated in place (the inputs at *written*) may not alias another of the
    first *n* inputs (the addresses may change between calls of one key): a ``ValueError``
    naming both."""
    spans = call.spans
    for w in written:
        for r in range(n):
            if r != w and _call.overlaps(ptrs[w], spans[w], ptrs[r], spans[r]):
                raise ValueError(
                    f"{call.func}: {names[w]} overlaps {names[r]}; the running averages are "
                    "written in place"
                )


class BatchNormCall(_call.Call):
    """A batch-norm call: data descriptors ``xd`` (inputs, then output) and the parameters'
    descriptor ``pd`` (*descs*), cuDNN's mode and epsilon. The statistics it returns are
    outputs before the normalized data, which is last (a staged output is the last one)."""

    __slots__ = ("eps", "ex", "fn", "hp", "mode", "one", "pd", "xd", "zero")

    def __init__(self, p: Any, name: str, h, allocs, spans, stage, descs, keep=()):
        xd, pd = descs
        one, zero = _call.scales(p.dt, 1.0, 0.0)
        # the descriptors live as long as the entry; the C call gets their addresses (faster)
        super().__init__(p.func, h, allocs, spans, stage, keepalive=(xd, pd, keep, one, zero))
        self.xd, self.pd = tuple(d.ptr for d in xd), pd.ptr
        self.hp, self.mode, self.eps = h.ptr, int(p.mode), p.eps
        self.one, self.zero = ctypes.byref(one), ctypes.byref(zero)
        self.fn = _call.quiet(name)
        self.ex: int | None = None  # the workspace bytes of the channels-last Ex call, once set


def use_ex(entry: BatchNormCall, workspace: int) -> None:
    """Run *entry* on cuDNN's ``...Ex`` call in ``SPATIAL_PERSISTENT`` mode (its NHWC kernels),
    with *workspace* bytes of the handle's workspace."""
    entry.ex = workspace
    entry.mode = int(BatchNormMode.SPATIAL_PERSISTENT)
    backward = isinstance(entry, BackwardCall)
    entry.fn = _call.quiet(_EX_BWD if backward else _EX_TRAIN)


class TrainCall(BatchNormCall):
    """Pointers: x, gamma, beta[, running_mean, running_var], then mean, invstd[, the running
    averages' new copies], y."""

    __slots__ = ("copy", "factor", "names")

    def __init__(self, p, h, allocs, spans, stage, descs, factor, copy, names):
        super().__init__(
            p, "cudnnBatchNormalizationForwardTraining", h, allocs, spans, stage, descs, copy
        )
        self.factor = factor
        # None: no running averages, or updated in place; else how to copy them first
        self.copy = None if copy is None else (*copy[:3], *(d.ptr for d in copy[3:]))
        self.names = names

    def launch(self, ptrs: Sequence[int]) -> None:
        if len(ptrs) == 6:
            (x, g, b, mean, invstd, y), rm, rv = ptrs, None, None
        elif len(ptrs) == 8:  # the running averages updated in place
            check_running(self, ptrs, (3, 4), 5, self.names)
            x, g, b, rm, rv, mean, invstd, y = ptrs
        else:  # new copies of the running averages are updated
            x, g, b, src_m, src_v, mean, invstd, rm, rv, y = ptrs
            copy, one, zero, desc_m, desc_v, dst = self.copy
            copy(self.hp, one, desc_m, src_m, zero, dst, rm)
            copy(self.hp, one, desc_v, src_v, zero, dst, rv)
        xd, yd = self.xd
        if self.ex is not None:
            ws = self.ex
            self.fn(
                self.hp,
                self.mode,
                _OPS_BN,
                self.one,
                self.zero,
                xd,
                x,
                None,  # z: no residual
                None,
                yd,
                y,
                self.pd,
                g,
                b,
                self.factor,
                rm,
                rv,
                self.eps,
                mean,
                invstd,
                None,  # no activation
                self.handle.workspace(ws)[0] if ws else None,
                ws,
                None,  # no reserve space: plain batch norm needs none (checked at build)
                0,
            )
            return
        self.fn(
            self.hp,
            self.mode,
            self.one,
            self.zero,
            xd,
            x,
            yd,
            y,
            self.pd,
            g,
            b,
            self.factor,
            rm,
            rv,
            self.eps,
            mean,
            invstd,
        )


class InferenceCall(BatchNormCall):
    """Pointers: x, gamma, beta, mean, var, then y."""

    __slots__ = ()

    def launch(self, ptrs: Sequence[int]) -> None:
        x, g, b, mean, var, y = ptrs
        xd, yd = self.xd
        self.fn(
            self.hp,
            self.mode,
            self.one,
            self.zero,
            xd,
            x,
            yd,
            y,
            self.pd,
            g,
            b,
            mean,
            var,
            self.eps,
        )


class BackwardCall(BatchNormCall):
    """Pointers: x, dy, scale, x_mean, x_invstd, then dscale, dbias, dx."""

    __slots__ = ()

    def launch(self, ptrs: Sequence[int]) -> None:
        x, dy, scale, mean, invstd, dscale, dbias, dx = ptrs
        one, zero = self.one, self.zero
        xd, dyd, dxd = self.xd
        if self.ex is not None:
            ws = self.ex
            self.fn(
                self.hp,
                self.mode,
                _OPS_BN,
                one,
                zero,
                one,
                zero,
                xd,
                x,
                None,  # y: read by the fused activations only
                None,
                dyd,
                dy,
                None,  # dz: no residual
                None,
                dxd,
                dx,
                self.pd,
                scale,
                None,  # bias: read by the fused activations only
                dscale,
                dbias,
                self.eps,
                mean,
                invstd,
                None,
                self.handle.workspace(ws)[0] if ws else None,
                ws,
                None,
                0,
            )
            return
        self.fn(
            self.hp,
            self.mode,
            one,
            zero,
            one,
            zero,
            xd,
            x,
            dyd,
            dy,
            dxd,
            dx,
            self.pd,
            scale,
            dscale,
            dbias,
            self.eps,
            mean,
            invstd,
        )


# ==================================================================================================
# Batch norm with a fused ReLU (and residual addition): bnOps other than plain BN
# ==================================================================================================
class ActSizes(NamedTuple):
    """cuDNN's byte counts for a fused batch norm: the reserve space the forward writes and the
    backward reads, and each direction's workspace."""

    reserve: int
    forward: int
    backward: int


def act_sizes(h: Any, xd: Any, pd: Any, ad: Any, residual: bool) -> ActSizes:
    """:class:`ActSizes` of the ``SPATIAL_PERSISTENT`` fused call on these descriptors (*xd*
    the data's, all four data operands alike); cuDNN's refusal (``NotSupportedError``) raises."""
    mode = int(BatchNormMode.SPATIAL_PERSISTENT)
    ops = int(BatchNormOps.BN_ADD_ACTIVATION if residual else BatchNormOps.BN_ACTIVATION)
    x, z = xd.ptr, xd.ptr if residual else None
    sizes = []
    for name, args in (
        ("cudnnGetBatchNormalizationTrainingExReserveSpaceSize", (ad.ptr, x)),
        ("cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize", (x, z, x, pd.ptr, ad.ptr)),
        ("cudnnGetBatchNormalizationBackwardExWorkspaceSize", (x, x, x, z, x, pd.ptr, ad.ptr)),
    ):
        size = ctypes.c_size_t()
        _call.quiet(name)(h.ptr, mode, ops, *args, ctypes.byref(size))
        sizes.append(size.value)
    return ActSizes(*sizes)


class _ActCall(_call.Call):
    """The fused batch norm's entries: one data descriptor ``xd`` for every data operand (they
    share shape and strides, checked at build), the parameters' ``pd``, the activation's ``ad``,
    the workspace bytes and whether a residual is added."""

    __slots__ = ("ad", "eps", "fn", "hp", "one", "ops", "pd", "residual", "ws", "xd", "zero")

    def __init__(self, func, name, h, allocs, spans, descs, eps, ws, residual):
        xd, pd, ad = descs
        one, zero = _call.scales(DataType.FLOAT, 1.0, 0.0)
        super().__init__(func, h, allocs, spans, None, keepalive=(descs, one, zero))
        self.xd, self.pd, self.ad = xd.ptr, pd.ptr, ad.ptr
        self.hp, self.eps, self.ws, self.residual = h.ptr, eps, ws, residual
        self.one, self.zero = ctypes.byref(one), ctypes.byref(zero)
        self.ops = int(BatchNormOps.BN_ADD_ACTIVATION if residual else BatchNormOps.BN_ACTIVATION)
        self.fn = _call.quiet(name)


class ActTrainCall(_ActCall):
    """Pointers: x, gamma, beta[, z][, running_mean, running_var (updated in place)], then mean,
    invstd, reserve, y."""

    __slots__ = ("factor", "names", "reserve", "running")

    def __init__(self, func, h, allocs, spans, descs, eps, sizes, residual, factor, running):
        super().__init__(func, _EX_TRAIN, h, allocs, spans, descs, eps, sizes.forward, residual)
        self.reserve, self.factor, self.running = sizes.reserve, factor, running
        self.names = ("inputs", "gamma", "beta", *(("z",) if residual else ()))
        self.names += ("running_mean", "running_var")

    def launch(self, ptrs: Sequence[int]) -> None:
        x, g, b = ptrs[:3]
        i = 3
        z = None
        if self.residual:
            z, i = ptrs[3], 4
        rm = rv = None
        if self.running:
            check_running(self, ptrs, (i, i + 1), i + 2, self.names)
            rm, rv = ptrs[i], ptrs[i + 1]
            i += 2
        mean, invstd, reserve, y = ptrs[i:]
        xd, ws = self.xd, self.ws
        self.fn(
            self.hp,
            int(BatchNormMode.SPATIAL_PERSISTENT),
            self.ops,
            self.one,
            self.zero,
            xd,
            x,
            xd if z is not None else None,
            z,
            xd,
            y,
            self.pd,
            g,
            b,
            self.factor,
            rm,
            rv,
            self.eps,
            mean,
            invstd,
            self.ad,
            self.handle.workspace(ws)[0] if ws else None,
            ws,
            reserve if self.reserve else None,
            self.reserve,
        )


class ActBackwardCall(_ActCall):
    """Pointers: x, y, dy, scale, bias, mean, invstd, reserve, then dscale, dbias[, dz], dx."""

    __slots__ = ("reserve",)

    def __init__(self, func, h, allocs, spans, descs, eps, sizes, residual):
        super().__init__(func, _EX_BWD, h, allocs, spans, descs, eps, sizes.backward, residual)
        self.reserve = sizes.reserve

    def launch(self, ptrs: Sequence[int]) -> None:
        x, y, dy, scale, bias, mean, invstd, reserve, dscale, dbias = ptrs[:10]
        dz, dx = (ptrs[10], ptrs[11]) if self.residual else (None, ptrs[10])
        one, zero, xd, ws = self.one, self.zero, self.xd, self.ws
        self.fn(
            self.hp,
            int(BatchNormMode.SPATIAL_PERSISTENT),
            self.ops,
            one,
            zero,
            one,
            zero,
            xd,
            x,
            xd,
            y,
            xd,
            dy,
            xd if dz is not None else None,
            dz,
            xd,
            dx,
            self.pd,
            scale,
            bias,
            dscale,
            dbias,
            self.eps,
            mean,
            invstd,
            self.ad,
            self.handle.workspace(ws)[0] if ws else None,
            ws,
            reserve if self.reserve else None,
            self.reserve,
        )
