"""CPU tests of the builder's paged KV cache (``Graph.sdpa``'s ``paged_attention_k_table``,
``paged_attention_v_table``, ``paged_attention_max_seq_len_kv``; :mod:`pycudnn.graph.nodes.paged`):
no GPU, no plan.

* every paged option's checks (tensors of the graph, the container's and the table's dims, int32,
  the bound, the padding lengths cuDNN needs), each message naming the option, the value and
  what was expected; the cuDNN versions that would run a refused case named;
* the graph: one paged cache load per paged operand before ``Q K^T`` / ``P V``, its roles, the
  loaded K read transposed (``(B, H_k, D, S)`` with unit stride on S), V as ``(B, H_k, S, D)``;
  the padding lengths feeding the loads; a shared table; one operand paged alone;
* ``build_graph`` makes a ``OPERATION_PAGED_CACHE_LOAD_DESCRIPTOR`` per load (finalize faked:
  without a GPU driver cuDNN refuses every finalize).
"""

from __future__ import annotations

import collections

import pytest

from pycudnn import errors
from pycudnn.descriptors import BackendDescriptor
from pycudnn.enums import DataType
from pycudnn.graph import Graph
from pycudnn.graph.nodes import paged as paged_node

B, H, HK, SQ, D, BS, NB, MAX = 3, 8, 2, 4, 64, 16, 40, 100
PAGES = -(-MAX // BS)  # 7
F16, I32 = DataType.HALF, DataType.INT32


def _graph(hk=HK, d=D, dv=None, bs=BS, nb=NB, pages=PAGES, sq=SQ):
    g = Graph(io_data_type="float16", name="g")
    t = dict(
        q=g.tensor((B, H, sq, d), name="q"),
        k=g.tensor((nb, hk, bs, d), name="k_cache"),
        v=g.tensor((nb, hk, bs, dv or d), name="v_cache"),
        table=g.tensor((B, 1, pages, 1), data_type="int32", name="table"),
        sq=g.tensor((B, 1, 1, 1), data_type="int32", name="sq"),
        skv=g.tensor((B, 1, 1, 1), data_type="int32", name="skv"),
    )
    return g, t


def _sdpa(g, t, **kw):
    opts = dict(
        seq_len_q=t["sq"],
        seq_len_kv=t["skv"],
        paged_attention_k_table=t["table"],
        paged_attention_v_table=t["table"],
        paged_attention_max_seq_len_kv=MAX,
    )
    opts.update(kw)
    return g.sdpa(t["q"], t.pop("k_arg", t["k"]), t.pop("v_arg", t["v"]), **opts)


BAD = [
    (
        dict(paged_attention_max_seq_len_kv=0),
        ValueError,
        "paged_attention_max_seq_len_kv must be an int >= 1 (the longest key sequence), got 0",
    ),
    (dict(paged_attention_max_seq_len_kv=True), ValueError, "got True"),
    (dict(paged_attention_max_seq_len_kv=100.0), ValueError, "got 100.0"),
    (dict(paged_attention_max_seq_len_kv=None), ValueError, "must be an int >= 1"),
    (
        dict(paged_attention_max_seq_len_kv=120),
        ValueError,
        "paged_attention_k_table must have dims (3, 1, 8, 1) (B, 1, ceil(max_seq_len_kv / "
        "block_size), 1), got (3, 1, 7, 1)",
    ),
    (
        dict(paged_attention_max_seq_len_kv=96),
        ValueError,
        "must have dims (3, 1, 6, 1)",
    ),
    (dict(seq_len_q=None, seq_len_kv=None), ValueError, "needs seq_len_q and seq_len_kv"),
    (dict(paged_attention_k_table="t"), TypeError, "paged_attention_k_table must be a Tensor"),
    (
        dict(paged_attention_k_table=None, paged_attention_v_table=None),
        ValueError,
        "paged_attention_max_seq_len_kv needs a page table",
    ),
]


@pytest.mark.parametrize(("kw", "exc", "fragment"), BAD)
def test_paged_option_errors(kw, exc, fragment):
    g, t = _graph()
    with pytest.raises(exc) as info:
        _sdpa(g, t, **kw)
    assert "g.sdpa" in str(info.value) and fragment in str(info.value)


def test_paged_tensor_errors():
    g, t = _graph()
    g.tensor((B, 1, PAGES, 1), data_type="int64", name="t64")
    t64 = g._tensors[-1]
    with pytest.raises(TypeError, match=r"v_table \(.t64.\) must be int32, got int64"):
        _sdpa(g, t, paged_attention_v_table=t64)
    g, t = _graph()
    wrong = g.tensor((B, PAGES), data_type="int32", name="flat")
    with pytest.raises(ValueError, match=r"paged_attention_k_table must have dims \(3, 1, 7, 1\)"):
        _sdpa(g, t, paged_attention_k_table=wrong)
    g, t = _graph()
    t["k_arg"] = g.tensor((NB, HK, BS * D), name="k3")
    with pytest.raises(ValueError, match=r"a paged k is the cache container \(num_blocks, H_k"):
        _sdpa(g, t)
    g, t = _graph()
    t["v_arg"] = g.tensor((NB, HK, BS, D), stride=(HK * BS * D, BS * D, 1, BS), name="vt")
    with pytest.raises(ValueError, match="v's last dim \\(D\\) must have stride 1"):
        _sdpa(g, t)
    other = Graph(io_data_type="float16").tensor((B, 1, PAGES, 1), data_type="int32")
    g, t = _graph()
    with pytest.raises(ValueError, match=r"paged_attention_k_table .* belongs to another graph"):
        _sdpa(g, t, paged_attention_k_table=other)


def test_unpaged_operand_has_the_bound_as_its_length():
    g, t = _graph()
    t["v_arg"] = g.tensor((B, HK, 64, D), name="v_dense")
    msg = r"v is not paged, so its sequence length \(64\) must equal"
    with pytest.raises(ValueError, match=msg):
        _sdpa(g, t, paged_attention_v_table=None)
    g, t = _graph()
    t["v_arg"] = g.tensor((B, HK, MAX, D), name="v_dense")
    o, _ = _sdpa(g, t, paged_attention_v_table=None)
    kinds = collections.Counter(n.kind for n in g.key(device=0).nodes)
    assert kinds["paged_cache_load"] == 1 and o.dim == (B, H, SQ, D)


def test_the_attention_checks_see_the_loaded_operands():
    """GQA, head dims and q's batch are checked on what the loads yield."""
    g, t = _graph(hk=3, nb=40)
    with pytest.raises(ValueError, match=r"q's heads \(8\) must be a multiple of k's \(3\)"):
        _sdpa(g, t)
    g, t = _graph(dv=20)
    with pytest.raises(ValueError, match="v's head dim \\(D\\) is 20"):
        _sdpa(g, t)


def _version(monkeypatch, v):
    monkeypatch.setattr(paged_node, "cudnn_version", lambda: v)


def test_cudnn_versions_that_would_run_it(monkeypatch):
    _version(monkeypatch, 90400)
    g, t = _graph()
    with pytest.raises(errors.NotSupportedError) as info:
        _sdpa(g, t)
    msg = str(info.value)
    assert "paged_attention_k_table/v_table" in msg and "needs cuDNN 9.5.0 or newer" in msg
    assert "90400" in msg
    _version(monkeypatch, 90900)
    g, t = _graph(d=256)
    with pytest.raises(errors.NotSupportedError, match=r"head dim 256 > 128 needs cuDNN 9\.10\.0"):
        _sdpa(g, t)
    _version(monkeypatch, 91000)
    g, t = _graph(d=256)
    _sdpa(g, t)  # accepted from 9.10


def _node(key, kind):
    return [n for n in key.nodes if n.kind == kind]


@pytest.mark.parametrize("causal", [False, True])
def test_paged_graph(causal):
    g, t = _graph()
    kw = dict(use_causal_mask=True, diagonal_alignment="bottom_right") if causal else {}
    o, stats = _sdpa(g, t, is_inference=False, **kw)
    assert o.dim == (B, H, SQ, D) and stats.dim == (B, H, SQ, 1)
    key = g.key(device=0)
    kinds = [n.kind for n in key.nodes]
    # the two loads come before the attention's first matmul
    assert kinds[:3] == ["paged_cache_load", "paged_cache_load", "matmul"]
    assert kinds.count("matmul") == 2
    uid = {t_.name: s.uid for t_, s in zip(g._tensors, key.tensors, strict=True)}
    spec = {s.uid: s for s in key.tensors}
    lk, lv = _node(key, "paged_cache_load")
    for load, cont in ((lk, "k_cache"), (lv, "v_cache")):
        roles = dict(load.tensors)
        assert list(roles) == [
            "OPERATION_PAGED_CACHE_LOAD_CONTAINER_DESC",
            "OPERATION_PAGED_CACHE_LOAD_SEQUENCE_DESC",
            "OPERATION_PAGED_CACHE_LOAD_PAGE_TABLE_DESC",
            "OPERATION_PAGED_CACHE_LOAD_YDESC",
        ]
        assert roles["OPERATION_PAGED_CACHE_LOAD_CONTAINER_DESC"] == uid[cont]
        assert roles["OPERATION_PAGED_CACHE_LOAD_SEQUENCE_DESC"] == uid["skv"]
        assert roles["OPERATION_PAGED_CACHE_LOAD_PAGE_TABLE_DESC"] == uid["table"]
    yk = spec[dict(lk.tensors)["OPERATION_PAGED_CACHE_LOAD_YDESC"]]
    yv = spec[dict(lv.tensors)["OPERATION_PAGED_CACHE_LOAD_YDESC"]]
    # K^T as cudnn-frontend describes it: (B, H_k, D, S) with unit stride on S's neighbour
    assert yk.dim == (B, HK, D, MAX) and yk.stride == (HK * MAX * D, MAX * D, 1, D)
    assert yv.dim == (B, HK, MAX, D) and yv.stride == (HK * MAX * D, MAX * D, D, 1)
    assert yk.is_virtual and yv.is_virtual
    assert yk.data_type == yv.data_type == int(F16)
    bmm1, bmm2 = _node(key, "matmul")
    assert dict(bmm1.tensors)["OPERATION_MATMUL_BDESC"] == yk.uid
    assert dict(bmm2.tensors)["OPERATION_MATMUL_BDESC"] == yv.uid
    assert spec[uid["table"]].dim == (B, 1, PAGES, 1) and spec[uid["table"]].data_type == int(I32)
    # the scores span max_seq_len_kv keys
    pw = _node(key, "pointwise")
    assert spec[dict(pw[0].tensors)["OPERATION_POINTWISE_XDESC"]].dim == (B, H, SQ, MAX)


def test_paged_decode_and_separate_tables():
    g, t = _graph(sq=1)
    tv = g.tensor((B, 1, PAGES, 1), data_type="int32", name="table_v")
    _sdpa(g, t, paged_attention_v_table=tv)
    key = g.key(device=0)
    uid = {t_.name: s.uid for t_, s in zip(g._tensors, key.tensors, strict=True)}
    lk, lv = _node(key, "paged_cache_load")
    assert dict(lk.tensors)["OPERATION_PAGED_CACHE_LOAD_PAGE_TABLE_DESC"] == uid["table"]
    assert dict(lv.tensors)["OPERATION_PAGED_CACHE_LOAD_PAGE_TABLE_DESC"] == uid["table_v"]


def test_keys_tell_paged_graphs_apart():
    def key(**kw):
        g, t = _graph()
        _sdpa(g, t, **kw)
        return g.key(device=0)

    base = key()
    assert key() == base
    assert key(paged_attention_max_seq_len_kv=97) != base  # another S_kv, same table
    assert key(use_causal_mask=True, diagonal_alignment="bottom_right") != base


def test_build_graph_makes_the_paged_cache_loads(monkeypatch):
    made = collections.Counter()
    real_init = BackendDescriptor.__init__

    def init(self, descriptor_type):
        real_init(self, descriptor_type)
        made[self._type.name] += 1

    def finalize(self):
        self._finalized = True
        return self

    monkeypatch.setattr(BackendDescriptor, "__init__", init)
    monkeypatch.setattr(BackendDescriptor, "finalize", finalize)
    monkeypatch.setattr(
        BackendDescriptor, "operation_graph", classmethod(lambda cls, ops, handle=None: list(ops))
    )
    g, t = _graph()
    _sdpa(g, t)
    key = g.key(device=0)
    ops = key.build_graph(None)
    assert len(ops) == len(key.nodes)
    assert made["OPERATION_PAGED_CACHE_LOAD_DESCRIPTOR"] == 2
    assert made["TENSOR_DESCRIPTOR"] == len(key.tensors)
