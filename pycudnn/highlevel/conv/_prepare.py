"""The slow path of a convolution: a :class:`ConvRequest` validated once, its plan, its call entry.

A call-cache miss (:mod:`._key`, :func:`._call.run_cached`) calls :func:`build` (or
:func:`build_fused`), which freezes the call into a :class:`ConvRequest` and runs one function
per decision -- :func:`_operands` (dtypes, ranks, devices, strides), :func:`_arguments`
(groups, stride, dilation, precision, algorithm policy), :func:`_shapes` (image, filter and output
shapes, padding), :func:`_layouts` (NCHW or NHWC, what is staged through packed copies), then the
epilogue's checks -- all before any C call, into one :class:`Prepared` record. The call entry
comes next: :func:`_route` (Theano's ``direction_hint``) or :func:`problem_of` (the plan key, a
:class:`Problem`, so differently spelt calls share one plan), the plan from the engine's one
entry (``_plans.plan``), and for an epilogue the fused graph or the separate steps
(:mod:`._epilogue`). ``run_cached`` runs the entry and caches it under the call key once it ran.

Layouts: cuDNN only ever sees operands packed NCHW or NHWC, all in one layout (NHWC when an
operand is unambiguously channels-last). Any other strides -- sliced or padded views, transposed
N/C views, a mix of layouts, a strided ``out`` -- are staged through packed copies made with
``cudnnTransformTensor`` (the graph API's engines returned wrong results, not an error, for
N/C-transposed strides). PyTorch likewise makes operands contiguous in one memory format.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ... import _layout, errors
from ..._types import itemsize
from ...enums import ConvolutionMode, DataType
from ...graph import _plans
from .. import _call, _checks, _operand, _staging
from .._operand import Operand
from . import _epilogue
from ._calls import ConvCall, EmptyCall
from ._problem import LEGACY, OP_BWD_DATA, OP_BWD_FILTER, OP_FWD, Problem, alignment
from ._request import Args, ConvRequest, Epilogue, Layouts, Prepared, Shapes

__all__ = [
    "build",
    "build_fused",
    "compute_type",
    "out_spatial",
    "pads",
    "policy",
    "prepare",
    "problem_of",
]

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
_CONFIG_ALGO = {OP_FWD: "algo_fwd", OP_BWD_DATA: "algo_bwd_data", OP_BWD_FILTER: "algo_bwd_filter"}
_HINTS = (None, "forward", "forward!", "bprop weights", "bprop inputs")


# ==================================================================================================
# Argument parsing (pure Python)
# ==================================================================================================
def pads(
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
    return _checks.ints(border_mode, nd, "border_mode (padding)", 0, func)


def out_spatial(
    xs: Sequence[int],
    ws: Sequence[int],
    pad: Sequence[int],
    sub: Sequence[int],
    dil: Sequence[int],
) -> tuple[int, ...]:
    """The output's spatial sizes (may be <= 0) of image shape *xs* and filter shape *ws*."""
    return tuple(
        (i + 2 * p - ((k - 1) * d + 1)) // s + 1
        for i, k, p, s, d in zip(xs[2:], ws[2:], pad, sub, dil, strict=True)
    )


def compute_type(dt: DataType, precision: str, func: str) -> DataType:
    """The compute type of ``precision=`` for data of *dt* (one cuDNN has a configuration for)."""
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


def policy(op: int, algo: Any, flags: Any, func: str, routed: bool = False) -> tuple[str, bool]:
    """(policy, force deterministic): policy is 'guess', 'time' or a legacy algorithm name.

    *routed*: ``dnn_conv`` computed as a gradient operation (``direction_hint``); a named
    algorithm of the forward direction then gives way to the routed direction's default.
    """
    if not isinstance(algo, str):
        raise TypeError(f"{func}: algo must be a string, got {algo!r}")
    name = algo.lower()
    if name in _META:
        return _META[name], name == "deterministic"
    if name in LEGACY[op]:
        return name, False
    if routed:
        return policy(op, getattr(flags, _CONFIG_ALGO[op]), flags, func)
    valid = sorted(set(_META) | set(LEGACY[op]))
    raise ValueError(f"{func}: algo={algo!r} is not one of {', '.join(map(repr, valid))}")


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


# ==================================================================================================
# Validation: one function per decision, each reading the request
# ==================================================================================================
def _operands(req: ConvRequest) -> tuple:
    """Read the operands; decide their common dtype and device; check ranks and strides."""
    func, nd, names = req.func, req.nd, req.names
    ga, gb = _operand.operand(req.a), _operand.operand(req.b)
    go = _operand.operand(req.out) if req.out is not None else None
    named = ((names[0], ga), (names[1], gb), ("out", go))
    dt, device = _checks.same_dtype_and_device(func, named)
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
            _checks.check_strides(func, name, g)
    return ga, gb, go, dt, device


def _arguments(req: ConvRequest, dt: DataType, flags: Any) -> Args:
    """Groups, stride, dilation, mode, compute type and the algorithm policy."""
    func, nd, num_groups = req.func, req.nd, req.num_groups
    if isinstance(num_groups, bool) or not hasattr(num_groups, "__index__"):
        raise TypeError(f"{func}: num_groups must be a positive int, got {num_groups!r}")
    groups = num_groups.__index__()
    if groups < 1:
        raise ValueError(f"{func}: num_groups must be a positive int, got {num_groups!r}")
    sub = _checks.ints(req.subsample, nd, "subsample (stride)", 1, func)
    dil = _checks.ints(req.dilation, nd, "dilation", 1, func)
    if req.conv_mode not in ("conv", "cross"):
        raise ValueError(f"{func}: conv_mode={req.conv_mode!r} is not 'conv' or 'cross'")
    if req.hint not in _HINTS:
        raise ValueError(f"{func}: direction_hint={req.hint!r} is not one of {_HINTS}")
    prec = flags.precision if req.precision is None else req.precision
    if not isinstance(prec, str):
        raise TypeError(f"{func}: precision must be a string, got {prec!r}")
    compute = compute_type(dt, prec.lower(), func)
    _checks.real(req.alpha, "alpha", func)
    _checks.real(req.beta, "beta", func)
    _checks.beta_needs_out(func, req.beta, req.out)
    explicit = req.algo is not None
    chosen = req.algo if explicit else getattr(flags, _CONFIG_ALGO[req.op])
    pol, det = policy(req.op, chosen, flags, func)
    mode = (
        ConvolutionMode.CONVOLUTION
        if req.conv_mode == "conv"
        else ConvolutionMode.CROSS_CORRELATION
    )
    return Args(groups, sub, dil, mode, compute, pol, det, explicit)


def _given_shapes(req: ConvRequest, ga: Operand, gb: Operand, go: Operand | None) -> tuple:
    """(x, w, y shapes) as the operands, ``*_shp`` and ``out`` give them (y None: computed)."""
    func, nd = req.func, req.nd
    if req.op == OP_FWD:
        return tuple(ga.shape), tuple(gb.shape), None
    what = "img_shp" if req.op == OP_BWD_DATA else "kerns_shp"
    shape = _shape_arg(req.shape, nd, what, func) if req.shape is not None else None
    if go is not None:
        if shape is not None and shape != tuple(go.shape):
            raise ValueError(f"{func}: {what}={shape} but out has shape {tuple(go.shape)}")
        shape = tuple(go.shape)
    if shape is None:
        raise ValueError(f"{func}: {what} is required (or pass out=)")
    if req.op == OP_BWD_DATA:  # gradinput(kerns, topgrad, img_shp)
        return shape, tuple(ga.shape), tuple(gb.shape)
    return tuple(ga.shape), shape, tuple(gb.shape)  # gradweight(img, topgrad, kerns_shp)


def _shapes(req: ConvRequest, ga: Operand, gb: Operand, go: Operand | None, args: Args) -> Shapes:
    """The image, filter and output shapes (the missing one from ``*_shp`` or ``out``), the
    padding, and whether the problem reduces over nothing."""
    func, op = req.func, req.op
    xs, ws, ys = _given_shapes(req, ga, gb, go)
    if any(k < 1 for k in ws[2:]):
        raise ValueError(f"{func}: kernel spatial sizes must be positive, got filter shape {ws}")
    groups, sub, dil = args.groups, args.sub, args.dil
    c_in, k_out, c_per_group = xs[1], ws[0], ws[1]
    if k_out % groups or c_in % groups:
        raise ValueError(
            f"{func}: num_groups={groups} must divide the input channels ({c_in}) and the number "
            f"of filters ({k_out}); image {xs}, filters {ws}"
        )
    if c_per_group * groups != c_in:
        raise ValueError(
            f"{func}: with num_groups={groups}, filters of shape {ws} expect "
            f"{c_per_group * groups} input channels, but the image {xs} has {c_in}"
        )
    pad = pads(req.border_mode, ws[2:], dil, func)
    spatial = out_spatial(xs, ws, pad, sub, dil)
    if any(o < 1 for o in spatial):
        raise ValueError(
            f"{func}: the convolution output would be empty: padded input "
            f"{tuple(i + 2 * p for i, p in zip(xs[2:], pad, strict=True))} is smaller than the "
            f"dilated kernel {tuple((k - 1) * d + 1 for k, d in zip(ws[2:], dil, strict=True))} "
            f"(image {xs}, filters {ws}, pads {pad}, dilation {dil})"
        )
    expect_y = (xs[0], k_out, *spatial)
    if op == OP_FWD:
        ys = expect_y
    elif ys != expect_y:
        other = "img_shp" if op == OP_BWD_DATA else "kerns_shp"
        raise ValueError(
            f"{func}: topgrad has shape {ys}, but a convolution of image {xs} with filters {ws} "
            f"(pads {pad}, subsample {sub}, dilation {dil}) gives {expect_y}; check {other}"
        )
    if go is not None and op == OP_FWD and tuple(go.shape) != ys:
        raise ValueError(f"{func}: out has shape {tuple(go.shape)}, expected {ys}")
    out_shape = {OP_FWD: ys, OP_BWD_DATA: xs, OP_BWD_FILTER: ws}[op]
    # a sum over nothing (no input channels, no filters, no images, all-padding input): zeros
    no_input = any(i == 0 for i in xs[2:])
    reduced_empty = {
        OP_FWD: c_in == 0 or no_input,
        OP_BWD_DATA: k_out == 0,
        OP_BWD_FILTER: xs[0] == 0 or no_input,
    }[op]
    return Shapes(xs, ws, ys, pad, out_shape, reduced_empty)


def _layouts(
    req: ConvRequest, ga: Operand, gb: Operand, go: Operand | None, out_shape: tuple[int, ...]
) -> Layouts:
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
                f"{req.func}: out's strides {o_strides} make elements overlap; cuDNN cannot "
                "write it"
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
    return Layouts(nhwc, a_can, b_can, o_can, o_strides, staged_in, staged_out)


def prepare(req: ConvRequest) -> Prepared | EmptyCall:
    """Validate and normalise *req* (every check before any C call). Returns a
    :class:`Prepared`, or the call entry of an empty problem (no handle, no cuDNN call)."""
    func = req.func
    flags = _call.snapshot()
    checked = _epilogue.arguments(req) if req.epilogue is not None else None
    ga, gb, go, dt, device = _operands(req)
    args = _arguments(req, dt, flags)
    sh = _shapes(req, ga, gb, go, args)
    lay = _layouts(req, ga, gb, go, sh.out_shape)
    if checked is not None:
        checked = _epilogue.operands(req, checked, ga, sh.ys)
    if any(s == 0 for s in sh.out_shape) or sh.reduced_empty:  # no cuDNN call
        fill = sh.reduced_empty and not any(s == 0 for s in sh.out_shape)
        if fill and checked is not None:
            raise errors.NotSupportedError(
                3000,
                func,
                f"a convolution that sums over nothing (image {sh.xs}, filters {sh.ws}) has no "
                "epilogue path: add the bias, z and activation to the zero output separately",
            )
        spec = _call.output_spec(sh.out_shape, dt, device, lay.nhwc)
        return EmptyCall(func, spec, req.beta, fill)
    names = req.names
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
    spans = tuple(
        _layout.span(s, st) * isz
        for s, st in ((ga.shape, ga.strides), (gb.shape, gb.strides), (sh.out_shape, lay.o_strides))
    )
    return Prepared(
        req=req,
        flags=flags,
        ga=ga,
        gb=gb,
        go=go,
        dt=dt,
        device=device,
        args=args,
        sh=sh,
        lay=lay,
        align=tuple(alignment(r & 15, isz) for r in residues),
        handle=_call.handle_for(device, req.stream),
        base=_base(req, flags, dt, device, args, lay),
        ptrs=(ga.ptr, gb.ptr, go.ptr if go is not None else None),
        spans=spans,
        alloc=_call.output_spec(sh.out_shape, dt, device, lay.nhwc) if go is None else None,
        stage=_stage(req, dt, (ga, gb), sh, lay),
        epilogue=checked,
    )


def _base(
    req: ConvRequest, flags: Any, dt: DataType, device: int, args: Args, lay: Layouts
) -> dict:
    """The :class:`Problem` fields every plan key of the call shares (a route's too)."""
    return dict(
        device=device,
        cudnn_version=_call.cudnn_version(),
        dtype=int(dt),
        compute=int(args.compute),
        allow_tf32=bool(flags.allow_tf32) and dt == DataType.FLOAT,
        deterministic=bool(flags.deterministic or args.deterministic),
        workspace_limit=-1 if flags.workspace_limit is None else int(flags.workspace_limit),
        # a staged output takes alpha/beta in its final copy; the plan writes a fresh buffer
        alpha=1.0 if lay.staged_out else float(req.alpha),
        beta=0.0 if lay.staged_out else float(req.beta),
    )


def _stage(req: ConvRequest, dt: DataType, inputs: tuple, sh: Shapes, lay: Layouts) -> Any:
    """The packed copies around the call for operands cuDNN cannot take as they are, or None."""
    if not (lay.staged_in or lay.staged_out):
        return None
    can = (lay.a_can, lay.b_can)
    return _staging.Stage(
        dt,
        [(i, inputs[i], can[i]) for i in lay.staged_in],
        (sh.out_shape, lay.o_strides, lay.o_can) if lay.staged_out else None,
        req.alpha,
        req.beta,
    )


# ==================================================================================================
# The plan key, the routes, the call entry
# ==================================================================================================
def problem_of(pr: Prepared) -> tuple[Problem, tuple[int, int, int]]:
    """The plan key of the operation as the caller asked it, and the role permutation (the
    (a, b, out) index feeding x, w, y)."""
    lay, sh, args, op = pr.lay, pr.sh, pr.args, pr.req.op
    if op == OP_FWD:
        xstr, wstr, ystr, perm = lay.a_can, lay.b_can, lay.o_can, (0, 1, 2)
    elif op == OP_BWD_DATA:
        xstr, wstr, ystr, perm = lay.o_can, lay.a_can, lay.b_can, (2, 0, 1)
    else:
        xstr, wstr, ystr, perm = lay.a_can, lay.o_can, lay.b_can, (0, 2, 1)
    p = Problem(
        op=op,
        mode=int(args.mode),
        x_shape=sh.xs,
        x_strides=xstr,
        w_shape=sh.ws,
        w_strides=wstr,
        y_shape=sh.ys,
        y_strides=ystr,
        pads=sh.pads,
        strides=args.sub,
        dilations=args.dil,
        x_align=pr.align[perm[0]],
        w_align=pr.align[perm[1]],
        y_align=pr.align[perm[2]],
        algo=args.policy,
        **pr.base,
    )
    return p, perm


def _swap_nc(shape: tuple, strides: tuple) -> tuple[tuple, tuple]:
    """The view with the N and C dims swapped."""
    return (shape[1], shape[0], *shape[2:]), (strides[1], strides[0], *strides[2:])


def _route(pr: Prepared) -> ConvCall | None:
    """Theano's ``direction_hint`` routes of ``dnn_conv`` (views only, no copies), or None when
    there is no route, a view is not packed in the problem's layout (transposing N and C of a
    packed tensor rarely is: only with a size-1 N or C) or the gradient operation has no engine
    for the views; the forward then runs as usual."""
    req, args, sh, lay = pr.req, pr.args, pr.sh, pr.lay
    if (
        req.op != OP_FWD
        or args.groups != 1
        or any(s != 1 for s in args.sub)
        or any(d != 1 for d in args.dil)
    ):
        return None
    border = req.border_mode
    if req.hint == "bprop weights" and all(p == 0 for p in sh.pads) and req.conv_mode == "cross":
        route = OP_BWD_FILTER
    elif req.hint != "forward!" and isinstance(border, str) and border.lower() == "full":
        route = OP_BWD_DATA
    else:
        return None
    try:
        chosen = req.algo if args.explicit_algo else getattr(pr.flags, _CONFIG_ALGO[route])
        pol, det = policy(route, chosen, pr.flags, req.func, routed=True)
    except ValueError:
        return None
    if route == OP_BWD_FILTER:
        # dnn_conv(img, kerns, 'valid', 'cross') == gradweight(img^T, kerns^T)^T
        x_shape, x_str = _swap_nc(sh.xs, lay.a_can)
        y_shape, y_str = _swap_nc(sh.ws, lay.b_can)
        w_shape, w_str = _swap_nc(sh.ys, lay.o_can)
        perm, mode = (0, 2, 1), args.mode
    else:
        # dnn_conv(img, kerns, 'full') == gradinput(kerns^T, img) with the other conv mode
        w_shape, w_str = _swap_nc(sh.ws, lay.b_can)
        y_shape, y_str = sh.xs, lay.a_can
        x_shape, x_str = sh.ys, lay.o_can
        perm = (2, 1, 0)
        mode = (
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
        mode=int(mode),
        x_shape=x_shape,
        x_strides=x_str,
        w_shape=w_shape,
        w_strides=w_str,
        y_shape=y_shape,
        y_strides=y_str,
        pads=(0,) * req.nd,
        strides=(1,) * req.nd,
        dilations=tuple(args.dil),
        x_align=pr.align[perm[0]],
        w_align=pr.align[perm[1]],
        y_align=pr.align[perm[2]],
        algo=pol,
        **{**pr.base, "deterministic": pr.base["deterministic"] or det},
    )
    try:
        plan = _plans.plan(p, pr.handle, tuple(pr.ptrs[i] for i in perm))
    except (errors.NotSupportedError, errors.BadParamError):
        return None
    return ConvCall(pr, p, plan, perm)


def conv_call(pr: Prepared) -> ConvCall:
    """The call entry of a prepared convolution: a ``direction_hint`` route or the operation as
    asked, its plan cached or searched."""
    call = _route(pr) if pr.stage is None else None
    if call is None:
        p, perm = problem_of(pr)
        # timing (time_*) runs on the caller's inputs, or on scratch buffers when staged
        given = tuple(pr.ptrs[i] for i in perm) if pr.stage is None else None
        call = ConvCall(pr, p, _plans.plan(p, pr.handle, given), perm)
    return call


def _entry(pr: Prepared) -> ConvCall:
    """The call entry: the plain convolution's, or with an epilogue the fused graph's -- or the
    separate steps' when no engine runs the graph."""
    if pr.epilogue is None:
        return conv_call(pr)
    why = _epilogue.not_fusable(pr)
    if not why:
        fp = _epilogue.fused_problem(pr, problem_of(pr)[0])
        plan = _plans.plan(fp, pr.handle, _epilogue.given_ptrs(pr))
        if not isinstance(plan, _plans.NoEngine):
            return _epilogue.FusedCall(pr, fp, plan)
        why = plan.reason
    _epilogue.check_separable(pr, why)
    return _epilogue.SeparateCall(pr, conv_call(pr), why)


def build(
    op: int, nd: int, a: Any, b: Any, shape: Any, opts: tuple, out: Any, stream: Any
) -> _call.Call:
    """The call entry of a plain convolution that missed the call cache (:mod:`._key`'s
    arguments; *opts* in :class:`ConvRequest` order)."""
    return _build(ConvRequest(op, nd, a, b, shape, *opts, out, stream))


def build_fused(
    nd: int, a: Any, b: Any, opts: tuple, epilogue: tuple, out: Any, stream: Any
) -> _call.Call:
    """The call entry of a forward convolution with an epilogue that missed the call cache."""
    return _build(ConvRequest(OP_FWD, nd, a, b, None, *opts, out, stream, Epilogue(*epilogue)))


def _build(req: ConvRequest) -> _call.Call:
    """Validate *req* and make its call entry, its plans found or searched on the operands'
    device; :func:`._call.run_cached` runs it and caches it once it ran."""
    pr = prepare(req)
    if not isinstance(pr, Prepared):
        return pr  # an empty problem
    with _call.on_device(pr.device):  # plans are built on the operands' device
        return _entry(pr)
