"""The convolution request and what validation makes of it.

A :class:`ConvRequest` is one call of a ``dnn_conv``-family function exactly as the caller made
it, frozen: nothing in it is validated yet. It is built only on a call-cache miss (the hot path
keys the call on a flat tuple and never builds it, :mod:`._key`); :mod:`._prepare` turns it, once,
into a :class:`Prepared` call -- the validated records below -- from which :mod:`._calls` and
:mod:`._epilogue` build the cached call entry.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ...enums import ConvolutionMode, DataType
from .. import _call, _operand, _staging
from ._problem import OP_BWD_DATA, OP_BWD_FILTER, OP_FWD

__all__ = ["FUNC", "NAMES", "Args", "ConvRequest", "Epilogue", "Layouts", "Prepared", "Shapes"]

#: (operation, spatial dims) -> the public function's name, for error messages
FUNC = {
    (OP_FWD, 2): "dnn_conv",
    (OP_FWD, 3): "dnn_conv3d",
    (OP_BWD_DATA, 2): "dnn_gradinput",
    (OP_BWD_DATA, 3): "dnn_gradinput3d",
    (OP_BWD_FILTER, 2): "dnn_gradweight",
    (OP_BWD_FILTER, 3): "dnn_gradweight3d",
}
#: the user's names of the two inputs, per operation
NAMES = {
    OP_FWD: ("img", "kerns"),
    OP_BWD_DATA: ("kerns", "topgrad"),
    OP_BWD_FILTER: ("img", "topgrad"),
}


class Epilogue(NamedTuple):
    """``dnn_conv``'s fused epilogue as passed: ``act(alpha * conv + z_alpha * z + bias)``."""

    bias: Any
    activation: Any
    z: Any
    z_alpha: Any


class ConvRequest(NamedTuple):
    """One call as the caller made it. The fields from ``border_mode`` to ``beta`` are the
    options tuple of the hot path (:mod:`._key`), in that order."""

    op: int  # OP_FWD, OP_BWD_DATA or OP_BWD_FILTER
    nd: int  # spatial dims: 2 or 3
    a: Any  # the first input: img (forward, gradweight) or kerns (gradinput)
    b: Any  # the second input: kerns (forward) or topgrad
    shape: Any  # img_shp (gradinput) or kerns_shp (gradweight); None for the forward
    border_mode: Any
    subsample: Any
    dilation: Any
    conv_mode: Any
    hint: Any  # direction_hint (forward only)
    algo: Any
    precision: Any
    num_groups: Any
    alpha: Any
    beta: Any
    out: Any
    stream: Any
    epilogue: Epilogue | None = None

    @property
    def func(self) -> str:
        """The public function's name (every error message starts with it)."""
        return FUNC[(self.op, self.nd)]

    @property
    def names(self) -> tuple[str, str]:
        """The user's names of the two inputs."""
        return NAMES[self.op]


class Args(NamedTuple):
    """What the convolution arguments decide (validated)."""

    groups: int
    sub: tuple[int, ...]
    dil: tuple[int, ...]
    mode: ConvolutionMode
    compute: DataType
    policy: str  # 'guess', 'time' or a legacy algorithm name
    deterministic: bool
    explicit_algo: bool


class Shapes(NamedTuple):
    """Image x, filters w, convolution output y, the padding, and which one is the output."""

    xs: tuple[int, ...]
    ws: tuple[int, ...]
    ys: tuple[int, ...]
    pads: tuple[int, ...]
    out_shape: tuple[int, ...]
    reduced_empty: bool  # a sum over nothing: the output is all zeros (times alpha)


class Layouts(NamedTuple):
    """What cuDNN sees: packed NCHW or NHWC strides per role, the output's strides, staging."""

    nhwc: bool
    a_can: tuple[int, ...]
    b_can: tuple[int, ...]
    o_can: tuple[int, ...]
    o_strides: tuple[int, ...]
    staged_in: list[int]
    staged_out: bool


class CheckedEpilogue(NamedTuple):
    """The epilogue validated: the activation ``(name, coef)`` or None, ``z_alpha``, and the
    bias and z operands (None when absent)."""

    act: tuple[str, float | None] | None
    z_alpha: float
    bias: _operand.Operand | None
    z: _operand.Operand | None

    @property
    def label(self) -> str:
        """What the epilogue computes, e.g. ``"bias+add+relu"``."""
        names = [n for n, g in (("bias", self.bias), ("add", self.z)) if g is not None]
        return "+".join(names + ([self.act[0]] if self.act else []))


class Prepared(NamedTuple):
    """A validated convolution call (:func:`._prepare.prepare`): everything a call entry is
    built from."""

    req: ConvRequest
    flags: Any  # the thread's pycudnn.config snapshot
    ga: _operand.Operand
    gb: _operand.Operand
    go: _operand.Operand | None
    dt: DataType
    device: int
    args: Args
    sh: Shapes
    lay: Layouts
    align: tuple[int, int, int]  # byte alignment of (a, b, out)
    handle: Any
    base: dict  # the Problem fields every plan key of this call shares
    ptrs: tuple  # (a, b, out or None)
    spans: tuple[int, int, int]  # byte spans of (a, b, out)
    alloc: _call.OutputSpec | None
    stage: _staging.Stage | None
    epilogue: CheckedEpilogue | None = None
