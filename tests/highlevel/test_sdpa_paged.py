"""CPU tests of ``dnn_sdpa_paged`` (attention over a paged KV cache; no GPU).

* every bad argument raises the right exception, naming the function, the argument, the value
  and what was expected, before any C call (fake operands, ``_fake_device``; every way into
  CUDA/cuDNN, the graph's build and the call entry raise ``CCall``), and valid calls reach the
  graph;
* the graph it would plan: the page table read in place as cuDNN's ``(B, 1, pages, 1)`` (a wider
  table by its own strides), ``max_seqlen_kv``'s default, bottom-right causal, the io order, the
  default ``seq_lens_q`` entry;
* call keys tell the cases apart (a shared table from two, the bound, ``True`` from ``1``).
"""

from __future__ import annotations

import _fake_device as fd
import numpy as np
import pytest
from _fake_device import CCall, Fake

import pycudnn
from pycudnn import errors
from pycudnn.enums import DataType
from pycudnn.graph import Graph
from pycudnn.highlevel import _call, _graphops
from pycudnn.highlevel.attention import _calls

F16, BF16, F32, F64 = DataType.HALF, DataType.BFLOAT16, DataType.FLOAT, DataType.DOUBLE
I32, I64 = DataType.INT32, DataType.INT64
no_c = fd.no_c

B, H, HK, SQ, D, BS, NB, W = 2, 8, 2, 1, 64, 16, 20, 6


@pytest.fixture
def guarded(no_c, monkeypatch):
    """No C call, no graph build, no call entry; an sm90 device."""

    def boom(*args, **kwargs):
        raise CCall("reached the graph build / call entry")

    monkeypatch.setattr(_graphops, "entry", boom)
    monkeypatch.setattr(Graph, "build", boom)
    monkeypatch.setattr(_graphops, "capability", lambda device: (9, 0))
    yield


def q4(b=B, h=H, s=SQ, d=D, dt=BF16, **kw):
    return Fake((b, h, s, d), dt, **kw)


def cache(nb=NB, hk=HK, bs=BS, d=D, dt=BF16, **kw):
    return Fake((nb, hk, bs, d), dt, **kw)


def table(b=B, w=W, dt=I32, **kw):
    return Fake((b, w), dt, **kw)


def lens(n=B, dt=I32, **kw):
    return Fake((n,), dt, **kw)


def _paged(q=None, k=None, v=None, pt=None, skv=None, **kw):
    return pycudnn.dnn_sdpa_paged(
        q4() if q is None else q,
        cache() if k is None else k,
        cache() if v is None else v,
        table() if pt is None else pt,
        lens() if skv is None else skv,
        **kw,
    )


def _raises(exc, fragments, fn, *args, **kwargs):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    msg = str(info.value)
    for f in (fragments,) if isinstance(fragments, str) else fragments:
        assert f in msg, f"{f!r} not in {msg!r}"
    return info.value


BAD = [
    (
        dict(q=q4(dt=F32), k=cache(dt=F32), v=cache(dt=F32)),
        errors.NotSupportedError,
        ("float16 and bfloat16 only, got float32",),
    ),
    (dict(q=q4(dt=F16)), TypeError, ("q is float16 but k_cache is bfloat16",)),
    (dict(v=cache(dt=F16)), TypeError, ("v_cache is float16",)),
    (dict(k=cache(device=1)), ValueError, ("k_cache on device 1",)),
    (dict(q=np.zeros((B, H, SQ, D), np.float16)), TypeError, ("host",)),
    (dict(q=Fake((B, SQ, D), BF16)), ValueError, ("q must have 4 dims (B, H, S_q, D)",)),
    (
        dict(k=Fake((NB, BS, D), BF16)),
        ValueError,
        ("k_cache must have 4 dims (num_blocks, H_k, block_size, D), got shape (20, 16, 64)",),
    ),
    (dict(k=cache(nb=0), v=cache(nb=0)), ValueError, ("k_cache has an empty dim",)),
    (
        dict(k=cache(strides=(HK * BS * D, BS * D, 1, BS))),
        ValueError,
        ("k_cache's head dim must be contiguous (stride 1)", "never copied"),
    ),
    (
        dict(v=cache(bs=32)),
        ValueError,
        ("k_cache (20, 2, 16, 64) and v_cache (20, 2, 32, 64) must have the same",),
    ),
    (dict(v=cache(nb=21)), ValueError, ("must have the same (num_blocks, H_k, block_size)",)),
    (dict(k=cache(d=32)), ValueError, ("q's head dim (64) and k_cache's (32) differ",)),
    (
        dict(k=cache(hk=3), v=cache(hk=3)),
        ValueError,
        ("q's heads (8) must be a multiple of the caches' (3)", "grouped-query"),
    ),
    (
        dict(q=q4(d=12), k=cache(d=12), v=cache(d=12)),
        errors.NotSupportedError,
        ("multiples of 8", "q/k has 12"),
    ),
    (dict(v=cache(d=264)), errors.NotSupportedError, ("at most 256", "v has 264")),
    (
        dict(pt=table(dt=I64)),
        TypeError,
        ("page_table must be an int32 device array of shape (2, pages per sequence), got int64",),
    ),
    (dict(pt=table(b=3)), ValueError, ("page_table must have shape (2, pages per sequence)",)),
    (dict(pt=Fake((B, 1, W, 1), I32)), ValueError, ("got (2, 1, 6, 1)",)),
    (dict(pt=table(w=0)), ValueError, ("page_table must have shape",)),
    (dict(pt=table(device=1)), ValueError, ("page_table is on device 1, q on device 0",)),
    (dict(pt=table(strides=(0, 1))), ValueError, ("page_table has a zero (broadcast) stride",)),
    (dict(pt=table(ptr=(1 << 32) + 2)), ValueError, ("page_table's address",)),
    (dict(pt=np.zeros((B, W), np.int32)), TypeError, ("host",)),
    (dict(page_table_v=table(dt=F32)), TypeError, ("page_table_v must be an int32",)),
    (dict(page_table_v=table(b=1)), ValueError, ("page_table_v must have shape (2, pages",)),
    (
        dict(skv=lens(dt=I64)),
        TypeError,
        ("seq_lens_kv must be an int32 device array of shape (2,), got int64",),
    ),
    (dict(skv=lens(3)), ValueError, ("seq_lens_kv must have shape (2,)",)),
    (dict(seq_lens_q=lens(dt=F32)), TypeError, ("seq_lens_q must be an int32",)),
    (dict(seq_lens_q=lens(device=1)), ValueError, ("seq_lens_q is on device 1",)),
    (
        dict(max_seqlen_kv=W * BS + 1),
        ValueError,
        ("max_seqlen_kv must be an int in [1, 96] (pages per sequence 6 * block_size 16), got 97",),
    ),
    (dict(max_seqlen_kv=0), ValueError, ("max_seqlen_kv must be an int in [1, 96]",)),
    (dict(max_seqlen_kv=True), ValueError, ("got True",)),
    (dict(max_seqlen_kv=64.0), ValueError, ("got 64.0",)),
    (
        dict(page_table_v=table(w=4), max_seqlen_kv=80),
        ValueError,
        ("max_seqlen_kv must be an int in [1, 64] (pages per sequence 4",),
    ),
    (dict(is_causal=2), ValueError, ("is_causal=2 is not a boolean",)),
    (dict(is_causal="maybe"), ValueError, ("is_causal='maybe' is not a boolean",)),
    (dict(scale="0.1"), TypeError, ("scale must be a real number",)),
    (dict(scale=float("nan")), ValueError, ("scale must be finite",)),
    (dict(out=q4(s=2)), ValueError, ("out has shape (2, 8, 2, 64), expected (2, 8, 1, 64)",)),
    (dict(out=q4(dt=F16)), TypeError, ("out is float16, expected bfloat16",)),
    (
        dict(out=q4(strides=(H * D, 1, H * D, H))),
        ValueError,
        ("out's head dim must be contiguous (stride 1)",),
    ),
]


@pytest.mark.parametrize(("kwargs", "exc", "fragments"), BAD)
def test_rejects_before_any_c_call(guarded, kwargs, exc, fragments):
    if fragments != ("host",):
        fragments = ("dnn_sdpa_paged", *fragments)
    _raises(exc, fragments, _paged, **kwargs)


def test_required_operands_name_themselves(guarded):
    for name in ("page_table", "seq_lens_kv"):
        args = [q4(), cache(), cache(), table(), lens()]
        args[3 if name == "page_table" else 4] = None
        _raises(
            TypeError,
            (f"dnn_sdpa_paged: {name} is required (an int32 device array), got None",),
            pycudnn.dnn_sdpa_paged,
            *args,
        )


def test_needs_sm80(guarded, monkeypatch):
    monkeypatch.setattr(_graphops, "capability", lambda device: (7, 5))
    _raises(errors.NotSupportedError, ("dnn_sdpa_paged", "sm80 (Ampere) or newer", "sm75"), _paged)


def test_version_gates(guarded, monkeypatch):
    from pycudnn.graph.nodes import paged as paged_node

    monkeypatch.setattr(_call, "cudnn_version", lambda: 90900)
    _raises(
        errors.NotSupportedError,
        ("dnn_sdpa_paged", "is_causal=True with S_q = 1 (decode) needs cuDNN 9.10.0", "90900"),
        _paged,
        is_causal=True,
    )
    monkeypatch.setattr(paged_node, "cudnn_version", lambda: 90400)
    _raises(errors.NotSupportedError, ("needs cuDNN 9.5.0 or newer",), _paged)
    monkeypatch.setattr(paged_node, "cudnn_version", lambda: 90900)
    big = dict(q=q4(d=256), k=cache(d=256), v=cache(d=256))
    _raises(errors.NotSupportedError, ("head dim 256 > 128 needs cuDNN 9.10.0",), _paged, **big)


@pytest.fixture
def captured(no_c, monkeypatch):
    """``_graphops.entry`` records the graph it would plan, then stops the call; the default
    ``seq_lens_q`` array is a fake."""
    graphs = []

    def entry(func, g, device, stream, allocs, spans, *, what, stage=None, kind=None):
        graphs.append((func, g, allocs, spans, what, stage, kind))
        raise CCall(what)

    monkeypatch.setattr(_graphops, "entry", entry)
    monkeypatch.setattr(_graphops, "capability", lambda device: (9, 0))
    monkeypatch.setattr(_graphops, "filled", lambda n, dt, device, value: Fake((n,), dt))
    return graphs


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        dict(q=q4(dt=F16), k=cache(dt=F16), v=cache(dt=F16)),
        dict(q=q4(s=32), is_causal=True, seq_lens_q=lens()),  # prefill
        dict(k=cache(hk=1), v=cache(hk=1, d=128)),  # multi-query, another D_v
        dict(k=cache(hk=8), v=cache(hk=8)),  # no grouping
        dict(q=Fake((B, H, 4, D), BF16, strides=(4 * H * D, D, H * D, 1))),  # (B, S, H, D)
        dict(q=Fake((B, H, 4, D), BF16, strides=(4 * H * D, 4 * D, 1, 4))),  # staged q
        # vLLM's (num_blocks, block_size, H_k, D) storage as its transpose(1, 2) view
        dict(
            k=cache(strides=(BS * HK * D, D, HK * D, 1)),
            v=cache(strides=(BS * HK * D, D, HK * D, 1)),
        ),
        dict(pt=Fake((B, W), I32, strides=(16, 1)), max_seqlen_kv=33),  # a wider table's slice
        dict(page_table_v=table(), scale=0.25, out=q4()),
        dict(out=q4(strides=(H * D, D, H * D, 1))),
    ],
)
def test_valid_calls_reach_the_graph(captured, kwargs):
    with pytest.raises(CCall):
        _paged(**kwargs)


def _tensor(g, name):
    return next(t for t in g._tensors if t.name == name)


def test_graph_of_a_decode_call(captured):
    wide = Fake((B, W), I32, strides=(16, 1))
    with pytest.raises(CCall):
        _paged(pt=wide, max_seqlen_kv=40)
    func, g, allocs, spans, what, stage, kind = captured[-1]
    assert func == "dnn_sdpa_paged" and stage is None
    assert what == "bfloat16 paged attention forward q(2, 8, 1, 64) k_cache(20, 2, 16, 64) " + (
        "(block size 16, max_seqlen_kv 40)"
    )
    # ceil(40 / 16) = 3 pages of the 6, read in place with the table's row stride
    for name in ("page_table_k", "page_table_v"):
        t = _tensor(g, name)
        assert t.dim == (B, 1, 3, 1) and t.stride == (16, 16, 1, 1) and t.data_type == I32
    key = g.key(device=0)
    assert sum(n.kind == "paged_cache_load" for n in key.nodes) == 2
    assert [n.kind for n in key.nodes].count("matmul") == 2
    # no seq_lens_q: the entry puts in its own array of S_q's at the launch
    assert kind is _calls.FixedLensQ
    names = [t.name for t in g._order] if g._order else None
    tables = ["page_table_k", "page_table_v"]
    assert names[:7] == ["q", "k_cache", "v_cache", *tables, "seq_len_q", "seq_len_kv"]
    assert names[_calls.LENS_Q_AT] == "seq_len_q"
    assert spans[_calls.LENS_Q_AT] == 0
    (alloc,) = allocs
    assert alloc.shape == (B, H, 1, D)
    # no mask beyond the padding lengths
    assert not any(t.name.endswith("right_bound") for t in g._tensors)


def test_graph_of_a_causal_prefill(captured):
    with pytest.raises(CCall):
        _paged(q=q4(s=32), is_causal=True, seq_lens_q=lens(), page_table_v=table())
    _func, g, _allocs, spans, what, _stage, kind = captured[-1]
    assert kind is _call.GraphCall and spans[_calls.LENS_Q_AT] == B * 4
    assert what.endswith("(block size 16, max_seqlen_kv 96, causal)")
    assert _tensor(g, "page_table_k").dim == (B, 1, W, 1)
    # bottom-right: the band's row is shifted by seq_len_kv - seq_len_q
    assert any("rb_row+skv" in t.name for t in g._tensors)


def test_call_keys_tell_the_cases_apart(no_c, monkeypatch):
    keys = []

    def run_cached(key, build, args, ptrs, outs, out_ptrs, stream):
        keys.append((key, ptrs))
        return (None,)

    monkeypatch.setattr(_call, "run_cached", run_cached)
    q, k, v, pt, skv, sq = q4(), cache(), cache(), table(), lens(), lens()
    pt2 = table()
    calls = [
        dict(),
        dict(),  # the same call again
        dict(page_table_v=pt2),
        dict(page_table_v=pt),  # K's table given again: the same graph as another table
        dict(max_seqlen_kv=64),
        dict(max_seqlen_kv=1),
        dict(max_seqlen_kv=True),  # equal to 1: the type tells them apart
        dict(is_causal=True),
        dict(scale=0.5),
        dict(seq_lens_q=sq),
    ]
    for kw in calls:
        pycudnn.dnn_sdpa_paged(q, k, v, pt, skv, **kw)
    ks = [k_ for k_, _p in keys]
    assert ks[0] == ks[1] and ks[2] == ks[3] and ks[0] != ks[2]
    assert len({ks[0], *ks[3:]}) == len(calls) - 2
    # the pointers: q, k, v, the tables (K's twice without page_table_v), seq_lens_q (0: the
    # entry's own), seq_lens_kv
    ptrs = keys[0][1]
    assert ptrs == (q.ptr, k.ptr, v.ptr, pt.ptr, pt.ptr, 0, skv.ptr)
    assert keys[2][1][4] == pt2.ptr and keys[-1][1][5] == sq.ptr


def test_fixed_lens_entry_puts_in_its_array():
    """The default ``seq_lens_q``: the launch replaces the caller's 0 by the entry's array."""
    seen = []

    class Base(_calls.FixedLensQ):
        __slots__ = ()

    entry = object.__new__(Base)
    entry.lens_q = Fake((B,), I32)
    orig = _call.GraphCall.launch
    try:
        _call.GraphCall.launch = lambda self, ptrs: seen.append(tuple(ptrs))
        entry.launch((1, 2, 3, 4, 5, 0, 7, 8))
    finally:
        _call.GraphCall.launch = orig
    assert seen == [(1, 2, 3, 4, 5, entry.lens_q.ptr, 7, 8)]
