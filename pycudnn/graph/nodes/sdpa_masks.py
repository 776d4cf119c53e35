"""The attention's score modifiers and their checks: an additive bias, ALiBi, the diagonal band
(causal with either alignment, sliding windows) and sink tokens, built as the pointwise patterns
cuDNN's fused attention engines recognise (cudnn-frontend's ``attn::score_modifiers`` and its
softmax with a sink are the reference for the patterns and their order).

Scores, in order::

    S = scale * Q K^T  [+ bias]  [+ (col - row) * slope_h]  [padding]  [- Stats (backward)]
        [band: keep  col <= row + shift + right_bound  and  col > row + shift - left_bound]

``shift`` is 0 top-left aligned and ``S_kv - S_q`` (per batch with padding lengths)
bottom-right aligned. A sink adds ``exp(sink_h - M)`` to each row's softmax sum.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ... import errors
from ...enums import DataType
from ...enums import PointwiseMode as P
from .._tensor import GraphBase, Tensor
from . import pointwise
from ._base import cudnn_version
from .reduction import reduction

__all__ = ["Masks", "apply_scores", "check_masks", "dbias_of", "dsink_of", "softmax"]

#: the alignments of the diagonal band
ALIGNMENTS = ("top_left", "bottom_right")

#: the cuDNN versions that first run each option (cudnn-frontend's checks)
_SINK_VERSION = 91300
_WINDOW_VERSION = 90200
_BOTTOM_RIGHT_ANY_LENGTH = 90600

#: whether ``dsink`` is served: its graph is cudnn-frontend's pattern, yet on an H200 with
#: cuDNN 9.19 the output came back unwritten (garbage); refused until a GPU run shows it right
DSINK_VERIFIED = False


class Masks(NamedTuple):
    """The checked modifiers: right/left bounds None when absent (causal: right bound 0)."""

    bottom_right: bool = False
    left_bound: int | None = None
    right_bound: int | None = None
    bias: Tensor | None = None
    alibi_slopes: Tensor | None = None
    sink: Tensor | None = None

    @property
    def plain_causal(self) -> bool:
        """Top-left causal and nothing else of the band (today's causal graph)."""
        return not self.bottom_right and self.right_bound == 0 and self.left_bound is None


def _pw(g: GraphBase, mode: P, *inputs: Tensor, name: str, compute: Any = None, **kw: Any):
    return pointwise.apply(g, mode, inputs, compute, name=name, params=kw)


def _bound(where: str, name: str, value: Any, lo: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"{where}: {name} must be None or an int >= {lo}, got {value!r}")
    return value


def _unsupported(where: str, what: str, version: int) -> errors.NotSupportedError:
    have = cudnn_version()
    need = f"{version // 10000}.{version // 100 % 100}.{version % 100}"
    return errors.NotSupportedError(
        3000, where, f"{what} needs cuDNN {need} or newer; the loaded cuDNN is {have}"
    )


def _per_head(g: GraphBase, op: str, name: str, t: Any, h: int) -> Tensor | None:
    """A float32 (1, H, 1, 1) tensor (ALiBi's slopes, the sink logits)."""
    t = g._check(op, name, t, optional=True)
    if t is None:
        return None
    if t.dim != (1, h, 1, 1):
        raise ValueError(f"{g.name}.{op}: {name} must have dims (1, {h}, 1, 1), got {t.dim}")
    if t.data_type is not None and t.data_type != DataType.FLOAT:
        raise TypeError(f"{g.name}.{op}: {name} must be float32, got {t.data_type.name.lower()}")
    return t


def _bias(g: GraphBase, op: str, t: Any, dims: tuple[int, int, int, int]) -> Tensor | None:
    t = g._check(op, "bias", t, optional=True)
    if t is None:
        return None
    b, h, sq, skv = dims
    ok = len(t.dim) == 4 and t.dim[0] in (1, b) and t.dim[1] in (1, h) and t.dim[2:] == (sq, skv)
    if not ok:
        raise ValueError(
            f"{g.name}.{op}: bias must have dims ({b} or 1, {h} or 1, {sq}, {skv}), got {t.dim}"
        )
    if t.data_type == DataType.BOOLEAN:
        raise TypeError(
            f"{g.name}.{op}: bias must be a floating tensor (0 to attend, -inf to mask), "
            "got boolean"
        )
    return t


def check_masks(
    g: GraphBase, op: str, o: Any, dims: tuple[int, int, int, int], causal: bool
) -> Masks:
    """*o*'s (an ``SdpaOptions``) modifiers checked against the scores' ``dims = (B, H, S_q,
    S_kv)``; *causal* (``use_causal_mask``) is a right bound of 0."""
    where = f"{g.name}.{op}"
    align = o.diagonal_alignment
    if not isinstance(align, str) or align not in ALIGNMENTS:
        raise ValueError(
            f"{where}: diagonal_alignment must be 'top_left' or 'bottom_right', got {align!r}"
        )
    left = _bound(where, "left_bound", o.left_bound, 1)
    right = _bound(where, "right_bound", o.right_bound, 0)
    if causal:
        if right not in (None, 0):
            raise ValueError(
                f"{where}: use_causal_mask=True is right_bound=0; got right_bound={right}"
            )
        right = 0
    bottom_right = align == "bottom_right"
    if bottom_right and left is None and right is None:
        raise ValueError(
            f"{where}: diagonal_alignment='bottom_right' needs a causal mask or a bound"
        )
    _b, h, sq, skv = dims
    if left is not None and cudnn_version() < _WINDOW_VERSION:
        raise _unsupported(where, "left_bound (a sliding window)", _WINDOW_VERSION)
    if bottom_right and cudnn_version() < _BOTTOM_RIGHT_ANY_LENGTH and (sq % 64 or skv % 64):
        raise _unsupported(
            where,
            "diagonal_alignment='bottom_right' with S_q or S_kv not a multiple of 64",
            _BOTTOM_RIGHT_ANY_LENGTH,
        )
    sink = _per_head(g, op, "sink", o.sink, h)
    if sink is not None and cudnn_version() < _SINK_VERSION:
        raise _unsupported(where, "sink", _SINK_VERSION)
    return Masks(
        bottom_right,
        left,
        right,
        _bias(g, op, o.bias, dims),
        _per_head(g, op, "alibi_slopes", o.alibi_slopes, h),
        sink,
    )


def check_backward(where: str, m: Masks, dims: tuple, padded: bool, dropout: bool) -> None:
    """The combinations cudnn-frontend refuses for the backward, refused before any C call."""
    _b, _h, sq, skv = dims
    if m.alibi_slopes is not None and m.right_bound != 0:
        raise errors.NotSupportedError(
            3000, where, "alibi_slopes: cuDNN's backward runs ALiBi only with a causal mask"
        )
    if m.bottom_right:
        for what, on in (("bias", m.bias), ("alibi_slopes", m.alibi_slopes), ("dropout", dropout)):
            if on is not None and on is not False:
                raise errors.NotSupportedError(
                    3000,
                    where,
                    f"diagonal_alignment='bottom_right' with {what}: cuDNN's backward does "
                    "not run the combination",
                )
    if not padded and sq > skv and (m.bottom_right or m.left_bound is not None):
        what = "left_bound" if m.left_bound is not None else "diagonal_alignment='bottom_right'"
        raise errors.NotSupportedError(
            3000, where, f"{what} with S_q ({sq}) > S_kv ({skv}) needs padding lengths"
        )


def _index(g: GraphBase, s: Tensor, axis: int, name: str) -> Tensor:
    return _pw(g, P.GEN_INDEX, s, axis=axis, compute=DataType.INT32, name=name)


def _int(g: GraphBase, mode: P, a: Tensor, b: Tensor, name: str, dt: DataType) -> Tensor:
    y = _pw(g, mode, a, b, compute=dt, axis=3, name=name)
    y.set_data_type(dt)
    return y


def _band(g: GraphBase, s: Tensor, m: Masks, seq_lens: tuple, neg_inf: Tensor, name: str):
    """The diagonal band as the frontend's two selects: the right bound, then the left."""
    i32, f32, b8 = DataType.INT32, DataType.FLOAT, DataType.BOOLEAN
    sq, skv = s.dim[2], s.dim[3]
    len_q, len_kv = seq_lens
    if m.bottom_right:  # shift = s_kv - s_q (per batch with padding lengths)
        len_q = len_q if len_q is not None else g._constant(sq, i32, f"{name}::s_q")
        len_kv = len_kv if len_kv is not None else g._constant(skv, i32, f"{name}::s_kv")
    if m.right_bound is not None:
        row = _index(g, s, 2, f"{name}::rb_row")
        col = _index(g, s, 3, f"{name}::rb_col")
        if m.bottom_right:
            row = _int(g, P.ADD, row, len_kv, f"{name}::rb_row+skv", i32)
            row = _int(g, P.SUB, row, len_q, f"{name}::rb_row-sq", i32)
        if m.right_bound:
            rb = g._constant(m.right_bound, i32, f"{name}::right_bound")
            row = _int(g, P.ADD, row, rb, f"{name}::rb_row+bound", i32)
        keep = _pw(g, P.CMP_GE, row, col, compute=b8, name=f"{name}::rb_keep")
        s = _pw(g, P.BINARY_SELECT, s, neg_inf, keep, name=f"{name}::select_right_bound")
    if m.left_bound is not None:
        row = _index(g, s, 2, f"{name}::lb_row")
        col = _index(g, s, 3, f"{name}::lb_col")
        if not m.bottom_right:
            lb = g._constant(float(m.left_bound), f32, f"{name}::left_bound")
            col = _int(g, P.ADD, col, lb, f"{name}::lb_col+bound", f32)
        elif seq_lens[0] is None:  # fixed lengths: one constant shift
            lb = g._constant(float(m.left_bound - skv + sq), f32, f"{name}::left_bound")
            col = _int(g, P.ADD, col, lb, f"{name}::lb_col+bound", f32)
        else:
            lb = g._constant(m.left_bound, i32, f"{name}::left_bound")
            col = _int(g, P.ADD, col, lb, f"{name}::lb_col+bound", i32)
            col = _int(g, P.SUB, col, len_kv, f"{name}::lb_col-skv", i32)
            col = _int(g, P.ADD, col, len_q, f"{name}::lb_col+sq", i32)
        keep = _pw(g, P.CMP_GT, col, row, compute=b8, name=f"{name}::lb_keep")
        s = _pw(g, P.BINARY_SELECT, s, neg_inf, keep, name=f"{name}::select_left_bound")
    return s


def _alibi(g: GraphBase, s: Tensor, slopes: Tensor, name: str) -> Tensor:
    i32 = DataType.INT32
    row = _index(g, s, 2, f"{name}::alibi_row")
    col = _index(g, s, 3, f"{name}::alibi_col")
    dist = _pw(g, P.SUB, col, row, compute=i32, name=f"{name}::alibi_col-row")
    dist.set_data_type(i32)
    return _pw(
        g,
        P.ADD,
        s,
        _pw(g, P.MUL, dist, slopes, name=f"{name}::alibi_slope"),
        name=f"{name}::add_alibi",
    )


def apply_scores(
    g: GraphBase,
    s: Tensor,
    m: Masks,
    seq_lens: tuple,
    padding: Any,
    after_padding: Any,
    name: str,
) -> Tensor:
    """The scaled scores with the bias, ALiBi, *padding(s)* (today's padding select, or
    identity), *after_padding(s)* (the backward's Stats subtraction) and the band."""
    if m.bias is not None:
        s = _pw(g, P.ADD, s, m.bias, name=f"{name}::bias")
    if m.alibi_slopes is not None:
        s = _alibi(g, s, m.alibi_slopes, name)
    s = padding(s)
    if after_padding is not None:
        s = after_padding(s)
    return s


def needs_band(m: Masks) -> bool:
    """Anything of the band that today's plain causal select does not express."""
    return (m.right_bound is not None or m.left_bound is not None) and not m.plain_causal


def band(g: GraphBase, s: Tensor, m: Masks, seq_lens: tuple, neg_inf: Tensor, name: str):
    """The general band (bottom-right alignment, a right bound > 0, a left bound)."""
    return _band(g, s, m, seq_lens, neg_inf, name)


def softmax(g: GraphBase, s: Tensor, rows: tuple, sink: Tensor | None, name: str) -> tuple:
    """``(e, z, stats)``: ``e = exp(s - M)``, ``z`` the row sums, ``stats = M + log z``; a sink
    competes in the max and adds ``exp(sink - M)`` to the sum."""
    m = reduction(g, s, "max", rows, name=f"{name}::max")
    if sink is not None:
        m = _pw(g, P.MAX, m, sink, name=f"{name}::max_sink")
    e = _pw(g, P.EXP, _pw(g, P.SUB, s, m, name=f"{name}::sub"), name=f"{name}::exp")
    z = reduction(g, e, "add", rows, name=f"{name}::sum")
    if sink is not None:
        es = _pw(g, P.SUB, sink, m, name=f"{name}::sub_sink")
        es = _pw(g, P.EXP, es, name=f"{name}::exp_sink")
        z = _pw(g, P.ADD, z, es, name=f"{name}::add_sink")
    stats = _pw(g, P.ADD, m, _pw(g, P.LOG, z, name=f"{name}::log"), name=f"{name}::stats")
    return e, z, stats


def dsink_of(g: GraphBase, sink: Tensor, stats: Tensor, rowsum: Tensor, name: str) -> Tensor:
    """The sink's gradient as the frontend's pattern: ``sum over (B, S_q) of exp(sink - Stats)
    * rowsum(dO * O)``, float32 (1, H, 1, 1)."""
    es = _pw(g, P.SUB, sink, stats, name=f"{name}::sub_sink")
    es = _pw(g, P.EXP, es, name=f"{name}::exp_sink")
    t = _pw(g, P.MUL, es, rowsum, name=f"{name}::sink_token_grad")
    ds = reduction(g, t, "add", sink.dim, name=f"{name}::dsink")
    ds.set_output(True).set_data_type(DataType.FLOAT)
    return ds


def dbias_of(g: GraphBase, ds: Tensor, bias: Tensor, io: Any, where: str, name: str) -> Tensor:
    """dBias: dS (before the scale) summed over the batch; served only for a ``(1, H, S_q,
    S_kv)`` bias (cudnn-frontend's surface). cuDNN writes it only from its dP-workspace kernels:
    the graph then writes dQ directly, without the float32 accumulator (:func:`.sdpa.backward`)."""
    h = ds.dim[1]
    if bias.dim[1] != h or bias.dim[0] != 1:
        raise errors.NotSupportedError(
            3000,
            where,
            f"dbias: cuDNN computes the bias gradient only for a bias of dims (1, {h}, S_q, "
            f"S_kv); bias has {bias.dim}",
        )
    db = reduction(g, ds, "add", (1, h, *ds.dim[2:]), name=f"{name}::dbias")
    db.set_output(True)
    if io is not None:
        db.set_data_type(io)
    return db
