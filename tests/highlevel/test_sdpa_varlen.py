"""CPU tests of packed variable-length attention (``dnn_sdpa_varlen`` /
``dnn_sdpa_varlen_grad``): no GPU (the fakes of ``test_transformer.py``).

* every bad argument -- operands, cumulative lengths (host or device), maximum lengths,
  options -- is refused with a message naming the function, the argument and the value before
  any C call (``CCall`` otherwise), and valid calls reach the upload / graph;
* the uploaded lengths and element offsets (``cu_seqlens * token stride``, int32 unless they
  overflow, each part 16-byte aligned), uploaded once per content;
* the graph each call builds: ragged q/k/v/out/stats (and dO, dq, dk, dv), one offset tensor
  per distinct token stride, the padding lengths, the io order the pointers follow;
* the call key tells the cases apart, and does not change with the lengths' content.
"""

from __future__ import annotations

import numpy as np
import pytest
from _fake_device import CCall, Fake
from test_transformer import BF16, F16, F32, I32, I64, _raises, guarded, no_c

import pycudnn
from pycudnn import errors, memory
from pycudnn.enums import DataType
from pycudnn.highlevel import _call, _graphops, sdpa_varlen
from pycudnn.highlevel.attention import _cu_seqlens

__all__ = ["guarded", "no_c"]  # fixtures, re-exported for pytest

H, D = 4, 64
CU = [0, 5, 12, 13]  # three sequences of 5, 7 and 1 tokens
T = CU[-1]


def thd(t=T, h=H, d=D, dt=BF16, **kw):
    return Fake((t, h, d), dt, **kw)


def _fwd(q=None, k=None, v=None, cu_q=CU, cu_kv=CU, mq=8, mkv=8, **kw):
    return pycudnn.dnn_sdpa_varlen(
        thd() if q is None else q,
        thd() if k is None else k,
        thd() if v is None else v,
        cu_q,
        cu_kv,
        mq,
        mkv,
        **kw,
    )


def _grad(q=None, out=None, dout=None, stats=None, cu_q=CU, mq=8, **kw):
    return pycudnn.dnn_sdpa_varlen_grad(
        thd() if q is None else q,
        thd(),
        thd(),
        thd() if out is None else out,
        thd() if dout is None else dout,
        Fake((T, H, 1), F32) if stats is None else stats,
        cu_q,
        CU,
        mq,
        8,
        **kw,
    )


FWD_BAD = [
    (dict(q=thd(dt=F32), k=thd(dt=F32), v=thd(dt=F32)), errors.NotSupportedError, ("float32",)),
    (dict(q=thd(dt=F16)), TypeError, ("q is float16 but k is bfloat16",)),
    (dict(q=Fake((T, H * D), BF16)), ValueError, ("q must have 3 dims", "(13, 256)")),
    (dict(v=Fake((1, T, H, D), BF16)), ValueError, ("v must have 3 dims",)),
    (dict(k=thd(d=32)), ValueError, ("q's head dim (64) and k's (32) differ",)),
    (dict(v=thd(h=2)), ValueError, ("must have the same tokens and heads",)),
    (dict(k=thd(h=3), v=thd(h=3)), ValueError, ("q's heads (4) must be a multiple of k's",)),
    (dict(v=thd(d=20)), errors.NotSupportedError, ("multiples of 8", "v has 20")),
    (dict(q=thd(strides=(H * D, 1, H))), ValueError, ("q's head dim must be contiguous",)),
    (dict(k=thd(strides=(D, D, 1))), ValueError, ("k's strides (64, 64, 1) make tokens",)),
    (dict(k=thd(strides=(H * D, D, -1))), ValueError, ("k has a negative stride",)),
    (dict(v=thd(device=1)), ValueError, ("device",)),
    (dict(q=np.zeros((T, H, D), np.float16)), TypeError, ("host",)),
    # the cumulative lengths
    (dict(cu_q=[1, 5, 12, 13]), ValueError, ("cu_seqlens_q must start at 0, got 1",)),
    (dict(cu_kv=[0, 5, 12]), ValueError, ("cu_seqlens_q and cu_seqlens_kv must both have",)),
    (
        dict(cu_q=[0, 5, 12, 14]),
        ValueError,
        ("cu_seqlens_q must end at the total number of tokens 13 (q.shape[0]), got 14",),
    ),
    (dict(cu_kv=[0, 5, 14, 13]), ValueError, ("cu_seqlens_kv[3] - cu_seqlens_kv[2] = -1",)),
    (dict(cu_q=[0, 5, 5, 13]), ValueError, ("at least one token", "cu_seqlens_q[2]")),
    (dict(cu_q=[0]), ValueError, ("cu_seqlens_q must be 1-D with B + 1 >= 2 values",)),
    (dict(cu_q=[[0, 13]]), TypeError, ("cu_seqlens_q must hold ints",)),
    (dict(cu_q=[0, 5.0, 12, 13]), TypeError, ("cu_seqlens_q must hold ints, got 5.0",)),
    (dict(cu_q=[0, True, 12, 13]), TypeError, ("cu_seqlens_q must hold ints, got True",)),
    (dict(cu_q=np.array([0, 5, 12, 13.0])), TypeError, ("must hold integers, got dtype float64",)),
    (dict(cu_q=Fake((4,), I64)), TypeError, ("cu_seqlens_q must be an int32 device array",)),
    (dict(cu_q=Fake((4, 1), I32)), ValueError, ("cu_seqlens_q must have shape (B + 1,)",)),
    (dict(cu_q=Fake((4,), I32, device=1)), ValueError, ("cu_seqlens_q is on device 1",)),
    (dict(cu_q="0,5"), TypeError, ("expected a device array",)),
    (
        dict(mq=6),
        ValueError,
        ("sequence 1 has 7 tokens (cu_seqlens_q), more than max_seqlen_q=6",),
    ),
    (dict(mkv=0), ValueError, ("max_seqlen_kv must be an int >= 1, got 0",)),
    (dict(mq=8.0), ValueError, ("max_seqlen_q must be an int >= 1, got 8.0",)),
    (dict(mq=True), ValueError, ("max_seqlen_q must be an int >= 1, got True",)),
    # options
    (dict(is_causal="maybe"), ValueError, ("is_causal='maybe'",)),
    (dict(training=2), ValueError, ("training=2",)),
    (dict(scale="0.1"), TypeError, ("scale must be a real number",)),
    (dict(dropout_p=1.0), ValueError, ("dropout_p=1.0 is out of range",)),
    (dict(dropout_p=0.1, seed=-1), ValueError, ("seed must be an int in [0, 2**63), got -1",)),
    (dict(out=thd(t=12)), ValueError, ("out has shape (12, 4, 64), expected (13, 4, 64)",)),
    (dict(out=thd(dt=F16)), TypeError, ("out is float16",)),
    (dict(out=thd(strides=(H * D, 1, H))), ValueError, ("out's head dim must be contiguous",)),
]


@pytest.mark.parametrize(("kwargs", "exc", "fragments"), FWD_BAD)
def test_forward_rejects_before_any_c_call(guarded, kwargs, exc, fragments):
    e = _raises(exc, fragments, _fwd, **kwargs)
    if fragments[0] not in ("host", "expected a device array"):
        assert "dnn_sdpa_varlen" in str(e)


GRAD_BAD = [
    (dict(out=thd(t=12)), ValueError, ("out must have shape (13, 4, 64), got (12, 4, 64)",)),
    (dict(dout=thd(dt=F16)), TypeError, ("out is bfloat16 but dout is float16",)),
    (dict(stats=Fake((T, H), F32)), ValueError, ("stats must have 3 dims",)),
    (dict(stats=Fake((T, H, 1), BF16)), ValueError, ("stats must be the forward's float32",)),
    (dict(stats=Fake((T, H, 1), F32, strides=(1, T, 1))), ValueError, ("stats must be contig",)),
    (dict(stats=Fake((T, H, 1), F32, device=1)), ValueError, ("stats is on device 1",)),
    (dict(cu_q=[0, 5, 12, 12]), ValueError, ("cu_seqlens_q must end at the total number",)),
    (dict(dropout_p=0.1), ValueError, ("dropout_p=0.1 needs the forward's seed",)),
    (dict(deterministic="nope"), ValueError, ("deterministic='nope'",)),
]


@pytest.mark.parametrize(("kwargs", "exc", "fragments"), GRAD_BAD)
def test_grad_rejects_before_any_c_call(guarded, kwargs, exc, fragments):
    e = _raises(exc, fragments, _grad, **kwargs)
    assert "dnn_sdpa_varlen_grad" in str(e)


def test_grad_of_single_token_sequences_is_refused(guarded, monkeypatch):
    monkeypatch.setattr(_cu_seqlens, "upload", lambda *a: (0,) * 8)
    cu = list(range(T + 1))
    _raises(errors.NotSupportedError, "max_seqlen_q = max_seqlen_kv = 1", _grad_ones, cu)


def _grad_ones(cu):
    return pycudnn.dnn_sdpa_varlen_grad(
        thd(), thd(), thd(), thd(), thd(), Fake((T, H, 1), F32), cu, cu, 1, 1
    )


def test_older_gpus_need_cudnn_9_18_1(guarded, monkeypatch):
    monkeypatch.setattr(_cu_seqlens, "upload", lambda *a: (0,) * 8)
    monkeypatch.setattr(_graphops, "capability", lambda device: (8, 0))
    monkeypatch.setattr(_call, "cudnn_version", lambda: 91800)
    _raises(errors.NotSupportedError, ("sm90 (Hopper)", "9.18.1", "sm80"), _fwd)
    monkeypatch.setattr(_call, "cudnn_version", lambda: 91801)
    with pytest.raises(CCall):  # allowed: reaches the graph
        _fwd()
    monkeypatch.setattr(_graphops, "capability", lambda device: (7, 5))  # no fused attention
    _raises(errors.NotSupportedError, ("sm80 (Ampere) or newer", "sm75"), _fwd)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        dict(is_causal=True, training=True),
        dict(k=thd(h=1), v=thd(h=1, d=32)),  # multi-query, another value head dim
        dict(cu_q=np.array(CU, np.int32), cu_kv=tuple(CU)),
        dict(q=thd(strides=(3 * H * D, D, 1))),  # a slice of a packed qkv
        dict(dropout_p=0.1, seed=3, training=True),
        dict(out=thd()),
    ],
)
def test_valid_forward_calls_reach_the_upload(guarded, kwargs):
    with pytest.raises(CCall):  # memory.to_device: the lengths' upload
        _fwd(**kwargs)


def test_device_lengths_are_read_back_and_checked(guarded, monkeypatch):
    monkeypatch.setattr(memory, "asarray", lambda obj, *a, **k: obj)
    bad = Fake((4,), I32, host=np.array([0, 5, 12, 12], np.int32))
    _raises(
        ValueError, ("cu_seqlens_kv must end at the total number of tokens 13",), _fwd, cu_kv=bad
    )
    good = Fake((4,), I32, host=np.array(CU, np.int32))
    with pytest.raises(CCall):
        _fwd(cu_q=good, cu_kv=good)


# -- the uploaded lengths and offsets ---------------------------------------------------------
def test_upload_lays_out_lengths_and_offsets(monkeypatch):
    sent = []

    def to_device(a, stream=None, *, device=None):
        sent.append(np.array(a))
        return Fake((len(a),), DataType.UINT8, ptr=0x10000 * (len(sent) + 1))

    monkeypatch.setattr(memory, "to_device", to_device)
    monkeypatch.setattr(Fake, "synchronize", lambda self: None, raising=False)
    pycudnn.clear_caches()
    p = _cu_seqlens.packing("f", (CU, [0, 3, 4, 9]), (T, 9), (8, 8), (0, None))
    pairs = ((0, H * D), (1, 2 * D), (0, H))
    ptrs = _cu_seqlens.upload(p, pairs, 0, None)
    assert len(sent) == 1 and len(ptrs) == 5
    base = 0x20000
    offs = [x - base for x in ptrs]
    assert all(o % 16 == 0 for o in offs)
    blob = sent[0].tobytes()

    def part(i, n, dt):
        return np.frombuffer(blob[offs[i] : offs[i] + n * np.dtype(dt).itemsize], dt)

    assert list(part(0, 3, np.int32)) == [5, 7, 1]
    assert list(part(1, 3, np.int32)) == [3, 1, 5]
    assert list(part(2, 4, np.int32)) == [c * H * D for c in CU]
    assert list(part(3, 4, np.int32)) == [c * 2 * D for c in (0, 3, 4, 9)]
    assert list(part(4, 4, np.int32)) == [c * H for c in CU]
    # the same content again: no upload; other content: one more
    assert _cu_seqlens.upload(p, pairs, 0, None) == ptrs and len(sent) == 1
    p2 = _cu_seqlens.packing("f", ([0, 6, 12, 13], [0, 3, 4, 9]), (T, 9), (8, 8), (0, None))
    assert _cu_seqlens.upload(p2, pairs, 0, None) != ptrs and len(sent) == 2
    pycudnn.clear_caches()


def test_offsets_are_int64_only_when_int32_overflows():
    assert _cu_seqlens.offsets_dtype(((0, 1024),), (2**20, 1)) is np.int32
    assert _cu_seqlens.offsets_dtype(((1, 2**12),), (1, 2**20)) is np.int64


# -- the graph and the call key -----------------------------------------------------------------
class _Stop(BaseException):
    pass


def _bound(monkeypatch, fn, **kw):
    """The graph, allocations and pointers a call builds (no C call)."""
    seen = {}

    class Entry:
        def run(self, ptrs, outs, out_ptrs, stream):
            seen["ptrs"] = ptrs
            raise _Stop

        def evict(self):
            pass

    def entry(func, g, device, stream, allocs, spans, **_kw):
        seen.update(g=g, allocs=allocs, spans=spans)
        return Entry()

    monkeypatch.setattr(_graphops, "entry", entry)
    monkeypatch.setattr(_cu_seqlens, "upload", lambda p, pairs, *a: tuple(range(1, 3 + len(pairs))))
    with pytest.raises(_Stop):
        fn(**kw)
    return seen


def test_forward_graph_is_ragged_with_one_offset_per_token_stride(guarded, monkeypatch):
    seen = _bound(monkeypatch, _fwd, training=True, k=thd(h=2), v=thd(h=2, d=32))
    g = seen["g"]
    names = [t.name for t in g._order]
    # q, k, v; the lengths; offsets of q (and stats? no: H elements a token), k, v, out, stats
    assert names[:5] == ["q", "k", "v", "seq_len_q", "seq_len_kv"]
    by = {t.name: t for t in g._tensors}
    q, k, v = by["q"], by["k"], by["v"]
    assert q.dim == (3, H, 8, D) and q.stride == (8 * H * D, D, H * D, 1)
    assert k.dim == (3, 2, 8, D) and v.dim == (3, 2, 8, 32)
    o, stats = g._order[-2], g._order[-1]
    assert o.dim == (3, H, 8, 32) and o.stride == (8 * H * 32, 32, H * 32, 1)
    assert stats.stride == (8 * H, 1, H, 1)
    offs = {t.name: t.ragged_offset.name for t in (q, k, v, o, stats)}
    assert len(set(offs.values())) == 5  # q H*D, k 2*D, v 2*32, out H*32, stats H
    allocs = seen["allocs"]
    assert tuple(allocs[0].shape) == (T, H, 32) and tuple(allocs[1].shape) == (T, H, 1)
    assert len(seen["ptrs"]) == 3 + 2 + 5
    key = g.key(device=0)  # freezes: every offset passes its checks
    assert sum(t.ragged_offset is not None for t in key.tensors) == 5


def test_packed_operands_share_offsets(guarded, monkeypatch):
    seen = _bound(monkeypatch, _fwd)
    g = seen["g"]
    by = {t.name: t for t in g._tensors}
    assert by["q"].ragged_offset is g._order[-1].ragged_offset  # q and out: H * D a token
    assert by["k"].ragged_offset is by["v"].ragged_offset
    assert by["q"].ragged_offset is not by["k"].ragged_offset  # another side (kv)
    assert len(seen["ptrs"]) == 3 + 2 + 2


def test_backward_graph_is_ragged(guarded, monkeypatch):
    seen = _bound(monkeypatch, _grad, is_causal=True)
    g = seen["g"]
    names = [t.name for t in g._order]
    assert names[:8] == ["q", "k", "v", "out", "dout", "stats", "seq_len_q", "seq_len_kv"]
    assert [tuple(a.shape) for a in seen["allocs"]] == [(T, H, D)] * 3
    key = g.key(device=0)
    ragged = {key.names[0][i] for i, t in enumerate(key.tensors) if t.ragged_offset is not None}
    assert {"q", "k", "v", "out", "dout", "stats"} <= ragged
    assert len([t for t in g._order if t._producer is not None]) == 3
    assert all(t.ragged_offset is not None for t in g._order[-3:])  # dq, dk, dv


def test_the_call_key_tells_cases_apart_and_ignores_the_lengths_content(guarded, monkeypatch):
    keys = []

    def run_cached(key, build, args, ptrs, outs, out_ptrs, stream, *a, **k):
        keys.append(key)
        return (None, None)

    monkeypatch.setattr(_call, "run_cached", run_cached)
    monkeypatch.setattr(_cu_seqlens, "upload", lambda *a: (0,) * 7)
    cases = [
        {},
        dict(is_causal=True),
        dict(training=True),
        dict(mq=9),
        dict(mkv=9),
        dict(scale=0.5),
        dict(k=thd(h=2), v=thd(h=2)),
        dict(cu_q=[0, 13], cu_kv=[0, 13], mq=13, mkv=13),  # another B
        dict(q=thd(dt=F16), k=thd(dt=F16), v=thd(dt=F16)),
    ]
    for kw in cases:
        _fwd(**kw)
    assert len(set(keys)) == len(cases)
    _fwd(cu_q=[0, 1, 8, 13], cu_kv=[0, 6, 7, 13])  # other lengths, same shapes: same entry
    assert keys[-1] == keys[0]
    keys.clear()
    _grad()
    _grad(deterministic=True)
    _grad(is_causal=True)
    assert len(set(keys)) == 3


def test_varlen_functions_are_public():
    assert pycudnn.dnn_sdpa_varlen is sdpa_varlen.dnn_sdpa_varlen
    assert pycudnn.highlevel.dnn_sdpa_varlen_grad is sdpa_varlen.dnn_sdpa_varlen_grad


def test_lengths_given_as_ints_are_checked_once_per_content():
    """A repeated list of lengths is served its checked packing; a spelling with a boolean
    (``True == 1``, the same hash) is not served it, and still refused."""
    pycudnn.clear_caches()  # (the checked lengths are a host cache of the registry)
    args = ((10, 10), (9, 9), (0, None))
    p1 = _cu_seqlens.packing("f", ([0, 1, 10], (0, 1, 10)), *args)
    assert _cu_seqlens.packing("f", ([0, 1, 10], [0, 1, 10]), *args) is p1
    with pytest.raises(TypeError, match="must hold ints, got True"):
        _cu_seqlens.packing("f", ([0, True, 10], [0, 1, 10]), *args)
    with pytest.raises(ValueError, match="more than max_seqlen_q=8"):
        _cu_seqlens.packing("f", ([0, 1, 10], [0, 1, 10]), (10, 10), (8, 9), (0, None))
