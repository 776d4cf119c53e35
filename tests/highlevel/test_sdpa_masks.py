"""CPU tests of the attention's masks and scores (``dnn_sdpa`` / ``dnn_sdpa_grad``'s
``attn_mask``, ``diagonal_alignment``, ``left_bound``/``right_bound``, ``alibi``, ``sink``,
``bias_grad``/``sink_grad``, and ``Graph.sdpa``'s): every bad argument is refused with a
message naming it before any C call, valid ones reach the graph, and the call key tells the
options apart (no GPU; the fakes of ``test_transformer.py``)."""

from __future__ import annotations

import pytest
from _fake_device import CCall, Fake
from test_transformer import BF16, F32, I32, B, H, S, _grad, _raises, _sdpa, guarded, no_c, q4

from pycudnn import errors
from pycudnn.enums import DataType, PointwiseMode
from pycudnn.graph import Graph
from pycudnn.highlevel import _graphops
from pycudnn.highlevel.attention import _masks as _sdpa_masks

__all__ = ["guarded", "no_c"]  # fixtures, re-exported for pytest


def bias(b=1, h=H, sq=S, skv=S, dt=BF16, **kw):
    return Fake((b, h, sq, skv), dt, **kw)


MASKS_BAD = [
    (dict(diagonal_alignment="bottom"), ValueError, ("diagonal_alignment", "'bottom'")),
    (dict(diagonal_alignment=None), ValueError, ("diagonal_alignment", "None")),
    (dict(left_bound=0), ValueError, ("left_bound", ">= 1", "0")),
    (dict(left_bound=-3), ValueError, ("left_bound", "-3")),
    (dict(left_bound=2.0), ValueError, ("left_bound", "2.0")),
    (dict(left_bound=True), ValueError, ("left_bound", "True")),
    (dict(right_bound=-1), ValueError, ("right_bound", ">= 0", "-1")),
    (dict(right_bound="1"), ValueError, ("right_bound", "'1'")),
    (dict(alibi="yes please"), ValueError, ("alibi",)),
    (dict(alibi=[1]), TypeError, ("alibi",)),
    (dict(attn_mask=bias(dt=DataType.BOOLEAN)), TypeError, ("attn_mask", "boolean", "-inf")),
    (dict(attn_mask=bias(dt=F32)), TypeError, ("attn_mask", "bfloat16", "float32")),
    (dict(attn_mask=bias(b=3)), ValueError, ("attn_mask", "shape", "(3, 4, 64, 64)")),
    (dict(attn_mask=bias(h=2)), ValueError, ("attn_mask", "(2 or 1, 4 or 1, 64, 64)")),
    (dict(attn_mask=bias(skv=32)), ValueError, ("attn_mask", "(1, 4, 64, 32)")),
    (dict(attn_mask=Fake((S, S), BF16)), ValueError, ("attn_mask", "shape")),
    (
        dict(attn_mask=bias(b=B, strides=(0, S * S, S, 1))),
        ValueError,
        ("attn_mask", "stride 0", "size 1"),
    ),
    (
        dict(attn_mask=bias(strides=(H * S * S, S * S, 1, S))),
        ValueError,
        ("attn_mask", "contiguous"),
    ),
    (dict(attn_mask=bias(device=1)), ValueError, ("attn_mask", "device 1")),
    (dict(attn_mask=bias(ptr=0x1001)), ValueError, ("attn_mask", "address")),
    (dict(sink=Fake((H,), BF16)), TypeError, ("sink", "float32")),
    (dict(sink=Fake((H + 1,), F32)), ValueError, ("sink", "(4,)", "(5,)")),
    (dict(sink=Fake((H,), F32, device=1)), ValueError, ("sink", "device 1")),
    (dict(is_causal=True, right_bound=2), ValueError, ("right_bound=0", "right_bound=2")),
    (dict(diagonal_alignment="bottom_right"), ValueError, ("bottom_right", "causal mask")),
]


@pytest.mark.parametrize(("kwargs", "exc", "fragments"), MASKS_BAD)
def test_masks_rejected_before_any_c_call(guarded, kwargs, exc, fragments):
    _raises(exc, ("dnn_sdpa", *fragments), _sdpa, **kwargs)


@pytest.mark.parametrize(("kwargs", "exc", "fragments"), MASKS_BAD)
def test_grad_masks_rejected_before_any_c_call(guarded, kwargs, exc, fragments):
    _raises(exc, ("dnn_sdpa_grad", *fragments), _grad, **kwargs)


GRAD_BAD = [
    (dict(bias_grad="on"), ValueError, ("bias_grad",)),
    (dict(sink_grad=2), ValueError, ("sink_grad",)),
    (dict(bias_grad=True), ValueError, ("bias_grad=True", "attn_mask")),
    (dict(sink_grad=True), ValueError, ("sink_grad=True", "sink")),
    (dict(attn_mask=bias(b=B), bias_grad=True), errors.NotSupportedError, ("dbias", "(1, 4")),
    (dict(attn_mask=bias(h=1), bias_grad=True), errors.NotSupportedError, ("dbias",)),
    (
        dict(attn_mask=bias(b=1, h=1), bias_grad=True),
        errors.NotSupportedError,
        ("dbias", "(1, 4, S_q, S_kv)"),
    ),
    (
        dict(sink=Fake((H,), F32), sink_grad=True),
        errors.NotSupportedError,
        ("sink_grad=True", "not yet verified on cuDNN 9.19"),
    ),
    (dict(alibi=True, is_causal=False), CCall, ()),  # the slopes' upload is a C call
    (
        dict(is_causal=True, diagonal_alignment="bottom_right", attn_mask=bias()),
        errors.NotSupportedError,
        ("bottom_right", "bias"),
    ),
    (
        dict(is_causal=True, diagonal_alignment="bottom_right", dropout_p=0.1, seed=1),
        errors.NotSupportedError,
        ("bottom_right", "dropout"),
    ),
]


@pytest.mark.parametrize(("kwargs", "exc", "fragments"), GRAD_BAD)
def test_grad_only_arguments(guarded, kwargs, exc, fragments):
    if exc is CCall:
        with pytest.raises(CCall):
            _grad(**kwargs)
        return
    _raises(exc, ("dnn_sdpa_grad", *fragments), _grad, **kwargs)


def test_bottom_right_longer_queries_need_padding(guarded):
    q = q4(s=128)
    _raises(
        errors.NotSupportedError,
        ("dnn_sdpa_grad", "S_q (128) > S_kv (64)", "padding"),
        _grad,
        q=q,
        out=q4(s=128),
        dout=q4(s=128),
        stats=Fake((B, H, 128, 1), F32),
        is_causal=True,
        diagonal_alignment="bottom_right",
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(attn_mask=bias()),
        dict(attn_mask=bias(b=B, h=1)),
        dict(attn_mask=bias(b=B)),
        dict(attn_mask=bias(b=1, h=1), is_causal=True),
        dict(attn_mask=bias(strides=(0, S * S, S, 1))),  # a size-1 dim may have stride 0
        dict(is_causal=True, diagonal_alignment="bottom_right", k=q4(s=128), v=q4(s=128)),
        dict(left_bound=16, right_bound=0),
        dict(left_bound=16, right_bound=4, diagonal_alignment="bottom_right"),
        dict(left_bound=8),
        dict(right_bound=3),
        dict(sink=Fake((H,), F32)),
        dict(sink=Fake((1, H, 1, 1), F32), is_causal=True),
        dict(attn_mask=bias(), seq_lens_q=Fake((B,), I32), seq_lens_kv=Fake((B,), I32)),
        dict(left_bound=16, is_causal=True, k=q4(h=2), v=q4(h=2)),  # GQA
        dict(attn_mask=bias(), dropout_p=0.1, seed=3),
    ],
)
def test_valid_masks_reach_the_graph(guarded, kwargs):
    with pytest.raises(CCall):
        _sdpa(**kwargs)
    with pytest.raises(CCall):
        _grad(**kwargs)


def test_valid_gradients_reach_the_graph(guarded, monkeypatch):
    with pytest.raises(CCall):
        _grad(attn_mask=bias(), bias_grad=True)
    from pycudnn.graph.nodes import sdpa_masks

    monkeypatch.setattr(sdpa_masks, "DSINK_VERIFIED", True)  # the GPU probe's switch
    with pytest.raises(CCall):
        _grad(sink=Fake((H,), F32), sink_grad=True, is_causal=True)


class _Stop(BaseException):
    """Ends a call once its graph and pointers are seen."""


def _bound_backward(monkeypatch, **kw):
    """The graph, output specs and pointers ``dnn_sdpa_grad`` builds for *kw* (no C call)."""
    seen = {}

    class Entry:
        def run(self, ptrs, outs, out_ptrs, stream):
            seen["ptrs"] = ptrs
            raise _Stop

        def evict(self):
            pass

    def entry(func, g, device, stream, allocs, spans, **_kw):
        seen["g"], seen["allocs"] = g, allocs
        return Entry()

    monkeypatch.setattr(_graphops, "entry", entry)
    with pytest.raises(_Stop):
        _grad(**kw)
    return seen


def test_dbias_is_bound_in_io_order_and_dq_is_written_directly(guarded, monkeypatch):
    """dbias is the graph's last output, allocated (1, H, S_q, S_kv) in q's dtype after dq, dk
    and dv; the bias is the input after the stats; and the graph writes dQ directly (no float32
    accumulator: cuDNN fills dBias only on those kernels, as cudnn-frontend builds it)."""
    mask = bias()
    seen = _bound_backward(monkeypatch, attn_mask=mask, bias_grad=True)
    g = seen["g"]
    names = [t.name for t in g._order]
    assert names[:7] == ["q", "k", "v", "out", "dout", "stats", "bias"]
    assert names[-1].endswith("dbias::y") and len(names) == 7 + 4
    assert seen["ptrs"][6] == mask.ptr and len(seen["ptrs"]) == 7
    db = seen["allocs"][-1]
    assert tuple(db.shape) == (1, H, S, S) and len(seen["allocs"]) == 4
    key = g.key(device=0)
    modes = [dict(n.settings).get("mode") for n in key.nodes if n.kind == "pointwise"]
    assert int(PointwiseMode.IDENTITY) not in modes  # no accumulator copy-out
    assert [s.dim for s in key.scratch] == [(B, H, S, 1)]  # softmax_sum only
    # without dbias the default graph keeps its float32 dQ accumulator
    seen = _bound_backward(monkeypatch, attn_mask=mask)
    assert [s.dim for s in seen["g"].key(device=0).scratch] == [(B, H, S, 1), (B, H, S, 64)]


def test_the_call_key_tells_the_options_apart():
    q = q4()
    _ptr, kq = __import__("pycudnn").highlevel._operand.key_of(q)
    specs = [
        _sdpa_masks.spec("f", "top_left", (None, 0), False, None),
        _sdpa_masks.spec("f", "bottom_right", (None, 0), False, None),
        _sdpa_masks.spec("f", "top_left", (8, 0), False, None),
        _sdpa_masks.spec("f", "top_left", (None, 1), False, None),
        _sdpa_masks.spec("f", "top_left", (None, None), False, Fake((H,), F32)),
        _sdpa_masks.spec("f", "top_left", (None, None), False, None, (True, False)),
    ]
    keys = [_sdpa_masks.key(None, s, kq)[1] for s in specs]
    keys.append(_sdpa_masks.key(bias(), specs[0], kq)[1])
    keys.append(_sdpa_masks.key(bias(b=B), specs[0], kq)[1])
    assert len(set(keys)) == len(keys)
    hash(keys[4])  # the sink's object is not in the key, its signature is


def test_alibi_slopes_follow_the_paper():
    s = _sdpa_masks.alibi_slopes(8).ravel()
    assert list(s) == pytest.approx([2.0 ** -(i + 1) for i in range(8)])
    s12 = _sdpa_masks.alibi_slopes(12).ravel()
    assert len(s12) == 12 and list(s12[:8]) == pytest.approx([2.0 ** -(i + 1) for i in range(8)])
    assert list(s12[8:]) == pytest.approx([2.0 ** (-0.5 - i) for i in range(4)])


# -- the builder ------------------------------------------------------------------------------
def _graph(sq=64, skv=128, h=4):
    g = Graph(DataType.HALF, DataType.FLOAT, DataType.FLOAT, name="g")
    q = g.tensor((2, h, sq, 64), (h * sq * 64, sq * 64, 64, 1), DataType.HALF, name="q")
    k = g.tensor((2, 2, skv, 64), (2 * skv * 64, skv * 64, 64, 1), DataType.HALF, name="k")
    v = g.tensor((2, 2, skv, 64), (2 * skv * 64, skv * 64, 64, 1), DataType.HALF, name="v")
    return g, q, k, v


def _kv_again(g, k, v):
    """k and v declared again for a backward in the forward's graph: an attention reads its
    k (forward) or k and v (backward) transposed, so they cannot be shared (issue 42)."""
    return (
        g.tensor(k.dim, k.stride, DataType.HALF, name="k_bwd"),
        g.tensor(v.dim, v.stride, DataType.HALF, name="v_bwd"),
    )


def _per_head(g, name, dt=DataType.FLOAT, h=4):
    return g.tensor((1, h, 1, 1), (h, 1, 1, 1), dt, name=name)


@pytest.mark.parametrize(
    ("make", "exc", "fragment"),
    [
        (lambda g: dict(diagonal_alignment="x"), ValueError, "diagonal_alignment"),
        (lambda g: dict(left_bound=0), ValueError, "left_bound must be None or an int >= 1"),
        (lambda g: dict(right_bound=-2), ValueError, "right_bound must be None or an int >= 0"),
        (lambda g: dict(use_causal_mask=True, right_bound=1), ValueError, "right_bound=1"),
        (lambda g: dict(diagonal_alignment="bottom_right"), ValueError, "needs a causal mask"),
        (
            lambda g: dict(bias=g.tensor((1, 4, 64, 64), (1, 1, 1, 1), DataType.HALF, name="b")),
            ValueError,
            "bias must have dims",
        ),
        (
            lambda g: dict(
                bias=g.tensor((1, 4, 64, 128), (1, 1, 1, 1), DataType.BOOLEAN, name="b")
            ),
            TypeError,
            "boolean",
        ),
        (lambda g: dict(sink=_per_head(g, "s", h=2)), ValueError, "sink must have dims"),
        (lambda g: dict(sink=_per_head(g, "s", DataType.HALF)), TypeError, "sink must be float32"),
        (lambda g: dict(alibi_slopes=_per_head(g, "a", h=8)), ValueError, "alibi_slopes"),
    ],
)
def test_builder_mask_errors(make, exc, fragment):
    g, q, k, v = _graph()
    with pytest.raises(exc, match=None) as info:
        g.sdpa(q, k, v, **make(g))
    assert "sdpa" in str(info.value) and fragment in str(info.value)


def test_builder_backward_refusals_and_extra_outputs():
    from pycudnn.graph.nodes import sdpa_masks

    g, q, k, v = _graph()
    b = g.tensor((1, 4, 64, 128), (4 * 64 * 128, 64 * 128, 128, 1), DataType.HALF, name="b")
    sink = _per_head(g, "sink")
    o, st = g.sdpa(q, k, v, is_inference=False, bias=b, sink=sink)
    do = g.tensor(o.dim, o.stride, DataType.HALF, name="do")
    with pytest.raises(ValueError, match=r"g\.sdpa_backward: v \('v'\) is already an input"):
        g.sdpa_backward(q, k, v, o, do, st, bias=b, sink=sink)
    k, v = _kv_again(g, k, v)
    with pytest.raises(errors.NotSupportedError, match=r"dsink=True.*not yet verified"):
        g.sdpa_backward(q, k, v, o, do, st, bias=b, sink=sink, dbias=True, dsink=True)
    with pytest.MonkeyPatch.context() as mp:  # the GPU probe's switch
        mp.setattr(sdpa_masks, "DSINK_VERIFIED", True)
        *_, db, ds = g.sdpa_backward(q, k, v, o, do, st, bias=b, sink=sink, dbias=True, dsink=True)
    assert db.dim == (1, 4, 64, 128) and ds.dim == (1, 4, 1, 1)
    assert not db.is_virtual and db.data_type == DataType.HALF
    assert not ds.is_virtual and ds.data_type == DataType.FLOAT
    *_, db = g.sdpa_backward(q, k, v, o, do, st, bias=b, sink=sink, dbias=True)
    assert db.dim == (1, 4, 64, 128)
    with pytest.raises(ValueError, match="dbias=True needs a bias"):
        g.sdpa_backward(q, k, v, o, do, st, dbias=True)
    with pytest.raises(ValueError, match="dsink"):
        g.sdpa_backward(q, k, v, o, do, st, dsink="maybe")
    slopes = _per_head(g, "alibi")
    with pytest.raises(errors.NotSupportedError, match="ALiBi only with a causal mask"):
        g.sdpa_backward(q, k, v, o, do, st, alibi_slopes=slopes)
    bb = g.tensor((2, 4, 64, 128), (4 * 64 * 128, 64 * 128, 128, 1), DataType.HALF, name="bb")
    with pytest.raises(errors.NotSupportedError, match=r"dbias.*\(1, 4, S_q, S_kv\)"):
        g.sdpa_backward(q, k, v, o, do, st, bias=bb, dbias=True)


def test_builder_backward_without_dsink_leaves_the_sink_out():
    """The forward's statistics hold the sink's term, so a backward without dsink does not read
    the sink: it is no input of the plan (a variant pack may still name it; it is not passed),
    unlike the high level's earlier bug of passing its pointer to a plan that had no slot."""
    g, q, k, v = _graph()
    sink = _per_head(g, "sink")
    o, st = g.sdpa(q, k, v, is_inference=False, sink=sink)
    o.set_output(True)
    st.set_output(True)
    do = g.tensor(o.dim, o.stride, DataType.HALF, name="do")
    k, v = _kv_again(g, k, v)
    for t in g.sdpa_backward(q, k, v, o, do, st, sink=sink):
        t.set_output(True)
    key = g.key(device=0)
    uid = {t._name: spec.uid for t, spec in zip(g._tensors, key.tensors, strict=True)}
    assert uid["sink"] in key.uids  # the forward reads it
    g2, q2, k2, v2 = _graph()
    sink2 = _per_head(g2, "sink")
    o2 = g2.tensor(o.dim, o.stride, DataType.HALF, name="o")
    st2 = g2.tensor(st.dim, st.stride, DataType.FLOAT, name="stats")
    do2 = g2.tensor(o.dim, o.stride, DataType.HALF, name="do")
    for t in g2.sdpa_backward(q2, k2, v2, o2, do2, st2, sink=sink2):
        t.set_output(True)
    key2 = g2.key(device=0)
    uid2 = {t._name: spec.uid for t, spec in zip(g2._tensors, key2.tensors, strict=True)}
    assert uid2["sink"] not in key2.uids and uid2["q"] in key2.uids


def test_builder_sink_needs_cudnn_9_13(monkeypatch):
    from pycudnn.graph.nodes import sdpa_masks

    monkeypatch.setattr(sdpa_masks, "cudnn_version", lambda: 91200)
    g, q, k, v = _graph()
    with pytest.raises(errors.NotSupportedError, match=r"sink needs cuDNN 9\.13\.0"):
        g.sdpa(q, k, v, sink=_per_head(g, "s"))
    with pytest.raises(errors.NotSupportedError, match=r"left_bound.*9\.2\.0") as info:
        monkeypatch.setattr(sdpa_masks, "cudnn_version", lambda: 90100)
        g.sdpa(q, k, v, left_bound=4, right_bound=0)
    assert "90100" in str(info.value)
