"""CPU tests of the builder's ragged tensors (packed variable-length sequences): no GPU.

* ``set_ragged_offset`` / ``tensor(ragged_offset=)`` checks, each message naming the tensor,
  the offset and what was expected (re-checked when the graph freezes);
* the frozen key: the offset's uid in the ragged tensor's spec, the offset tensor among a
  call's pointers, keys told apart by raggedness, ``to_json`` unchanged for other graphs;
* ``build_graph`` sets ``TENSOR_RAGGED_OFFSET_DESC`` on the ragged tensors' descriptors (the
  offset's descriptor made first; finalize faked);
* attention: ragged q, k, v need the padding mask (``NotSupportedError``), grouped-query heads
  on ragged tensors need cuDNN 9.6, the backward's K view keeps K's offsets.
"""

from __future__ import annotations

import json

import pytest

from pycudnn import errors
from pycudnn.descriptors import BackendDescriptor
from pycudnn.enums import BackendAttributeName as A
from pycudnn.enums import BackendDescriptorType as D
from pycudnn.graph import Graph
from pycudnn.graph.nodes import _base as nodes_base

B, H, S, DH = 3, 4, 64, 64


def _thd(g, name, b=B, h=H, s=S, d=DH, off=None):
    """A (B, H, S_max, D) tensor over packed (T, H, D) rows, with its offset tensor."""
    if off is None:
        off = g.tensor((b + 1, 1, 1, 1), data_type="int32", name=f"{name}_off")
    return g.tensor((b, h, s, d), (s * h * d, d, h * d, 1), name=name, ragged_offset=off)


def _lens(g, b=B):
    return (
        g.tensor((b, 1, 1, 1), data_type="int32", name="seq_q"),
        g.tensor((b, 1, 1, 1), data_type="int32", name="seq_kv"),
    )


def _forward(hk=H, training=True):
    g = Graph(io_data_type="bfloat16")
    q, k, v = _thd(g, "q"), _thd(g, "k", h=hk), _thd(g, "v", h=hk)
    sq, skv = _lens(g)
    o, stats = g.sdpa(q, k, v, is_inference=not training, seq_len_q=sq, seq_len_kv=skv)
    o.set_ragged_offset(g.tensor((B + 1, 1, 1, 1), data_type="int64", name="o_off"))
    if stats is not None:
        stats.set_stride((H * S, 1, H, 1))
        stats.set_ragged_offset(g.tensor((B + 1, 1, 1, 1), data_type="int32", name="st_off"))
    return g, (q, k, v), o, stats


_OFFSET_ERRORS = [
    ("x", TypeError, "ragged offset must be a Tensor of this graph, got str"),
    ("float", TypeError, "ragged offset ('off') must be int32 or int64, got float32"),
    ("unset", TypeError, "ragged offset ('off') must be int32 or int64, got unset"),
    ("dims", ValueError, "must have dims (4, 1, 1, 1) (one offset per batch and the end), got"),
    ("other", ValueError, "ragged offset ('off') belongs to another graph"),
    ("output", ValueError, "must be another graph input of device memory"),
    ("byvalue", ValueError, "must be another graph input of device memory"),
    ("self", ValueError, "must be another graph input of device memory"),
]


@pytest.mark.parametrize("offset, exc, fragment", _OFFSET_ERRORS)
def test_ragged_offset_checks(offset, exc, fragment):
    g = Graph()
    x = g.tensor((B, H, S, DH), data_type="float16", name="x")
    value = {
        "x": lambda: "x",
        "float": lambda: g.tensor((B + 1, 1, 1, 1), data_type="float32", name="off"),
        "unset": lambda: g.tensor((B + 1, 1, 1, 1), name="off"),
        "dims": lambda: g.tensor((B, 1, 1, 1), data_type="int32", name="off"),
        "other": lambda: Graph().tensor((B + 1, 1, 1, 1), data_type="int32", name="off"),
        "output": lambda: g.relu(g.tensor((B + 1, 1, 1, 1), data_type="int32"), name="off"),
        "byvalue": lambda: g.tensor(
            (1, 1, 1, 1), data_type="int32", is_pass_by_value=True, name="off"
        ),
        "self": lambda: x,
    }[offset]()
    with pytest.raises(exc) as info:
        x.set_ragged_offset(value)
    assert fragment in str(info.value)
    assert "tensor 'x'" in str(info.value)
    assert x.ragged_offset is None  # nothing set by a refused call


def test_ragged_offset_setter_chains_removes_and_reads_back():
    g = Graph(io_data_type="float16")
    off = g.tensor((B + 1, 1, 1, 1), data_type="int64", name="off")
    x = g.tensor((B, H, S, DH), name="x")
    assert x.set_ragged_offset(off) is x
    assert x.ragged_offset is off and x.get_ragged_offset() is off
    assert x.set_ragged_offset(None).ragged_offset is None
    y = g.tensor((B, H, S, DH), name="y", ragged_offset=off)
    assert y.ragged_offset is off


def test_ragged_offset_is_checked_again_when_the_graph_freezes():
    g, (q, _k, _v), _o, _st = _forward()
    q.ragged_offset.set_data_type("float32")  # after set_ragged_offset
    with pytest.raises(TypeError, match=r"tensor 'q': ragged offset \('q_off'\) must be int32"):
        g.key(device=0)


def test_the_key_holds_the_offsets_and_a_call_passes_them():
    g, (q, k, v), o, stats = _forward()
    key = g.key(device=0)
    by_name = dict(zip(key.names[0], key.tensors, strict=True))
    for t, off in ((q, "q_off"), (k, "k_off"), (v, "v_off"), (o, "o_off"), (stats, "st_off")):
        assert by_name[t.name].ragged_offset == by_name[off].uid
        assert by_name[off].uid in key.uids  # a real input of the call, though no node reads it
    assert by_name["seq_q"].ragged_offset is None
    assert by_name[stats.name].stride == (H * S, 1, H, 1)
    # the same graph without offsets is another key; a graph without any has no new JSON field
    g2 = Graph(io_data_type="bfloat16")
    q2, k2, v2 = (g2.tensor((B, H, S, DH), (S * H * DH, DH, H * DH, 1), name=n) for n in "qkv")
    sq, skv = _lens(g2)
    g2.sdpa(q2, k2, v2, seq_len_q=sq, seq_len_kv=skv)
    assert g2.key(device=0) != key
    doc = json.loads(g2.to_json())
    assert all("ragged_offset" not in t for t in doc["tensors"])
    tensors = {t["name"]: t for t in json.loads(g.to_json())["tensors"]}
    assert tensors["q"]["ragged_offset"] == tensors["q_off"]["uid"]


def test_ragged_keys_tell_offset_types_apart():
    def key(dtype):
        g = Graph(io_data_type="float16")
        off = g.tensor((B + 1, 1, 1, 1), data_type=dtype, name="off")
        x = g.tensor((B, H, S, DH), name="x", ragged_offset=off)
        g.relu(x).set_output(True)
        return g.key(device=0)

    assert key("int32") != key("int64")
    assert key("int32") == key("int32")


def test_build_graph_sets_the_ragged_offset_descriptor(monkeypatch):
    def finalize(self):
        self._finalized = True
        return self

    monkeypatch.setattr(BackendDescriptor, "finalize", finalize)
    monkeypatch.setattr(
        BackendDescriptor, "operation_graph", classmethod(lambda cls, ops, handle=None: list(ops))
    )
    set_calls = []
    real_set = BackendDescriptor.set

    def record(self, attribute, attr_type, values):
        if attribute == A.TENSOR_RAGGED_OFFSET_DESC:
            set_calls.append((self, values))
        return real_set(self, attribute, attr_type, values)

    monkeypatch.setattr(BackendDescriptor, "set", record)
    g, _qkv, _o, _st = _forward()
    key = g.key(device=0)
    key.build_graph(None)
    ragged = [t for t in key.tensors if t.ragged_offset is not None]
    assert len(set_calls) == len(ragged) == 5  # q, k, v, o, stats
    for desc, off in set_calls:
        assert desc._type == D.TENSOR_DESCRIPTOR and off._type == D.TENSOR_DESCRIPTOR


def test_build_graph_names_a_refused_ragged_offset(monkeypatch):
    real_set = BackendDescriptor.set

    def refuse(self, attribute, attr_type, values):
        if attribute == A.TENSOR_RAGGED_OFFSET_DESC:
            raise errors.BadParamError(2000, "cudnnBackendSetAttribute", "fake refusal")
        return real_set(self, attribute, attr_type, values)

    monkeypatch.setattr(BackendDescriptor, "finalize", lambda self: self)
    monkeypatch.setattr(BackendDescriptor, "set", refuse)
    g, _qkv, _o, _st = _forward()
    with pytest.raises(errors.BadParamError) as info:
        g.key(device=0).build_graph(None)
    assert "node 'q' (tensor): cuDNN refused its ragged offset (tensor uid" in str(info.value)


def test_attention_with_ragged_tensors_needs_the_padding_mask():
    g = Graph(io_data_type="float16")
    q, k, v = _thd(g, "q"), _thd(g, "k"), _thd(g, "v")
    with pytest.raises(errors.NotSupportedError) as info:
        g.sdpa(q, k, v)
    msg = str(info.value)
    assert "ragged offsets on q, k, v (packed sequences) need the padding mask" in msg
    assert "seq_len_q and seq_len_kv" in msg
    g = Graph(io_data_type="float16")
    q, k, v = _thd(g, "q"), g.tensor((B, H, S, DH), name="k"), g.tensor((B, H, S, DH), name="v")
    with pytest.raises(errors.NotSupportedError, match="ragged offsets on q "):
        g.sdpa_backward(q, k, v, q, q, g.tensor((B, H, S, 1), data_type="float32"))


@pytest.mark.parametrize("version, refused", [(90500, True), (90600, False)])
def test_grouped_query_heads_on_ragged_tensors_need_cudnn_9_6(monkeypatch, version, refused):
    monkeypatch.setattr(nodes_base, "_cached_version", version)
    if refused:
        with pytest.raises(errors.NotSupportedError) as info:
            _forward(hk=2)
        assert "grouped-query heads with ragged offsets needs cuDNN 9.6.0 or newer" in str(
            info.value
        )
    else:
        _forward(hk=2)
    _forward(hk=H)  # equal heads: any version


def test_backward_keeps_the_offsets_on_the_k_view():
    g = Graph(io_data_type="bfloat16")
    q, k, v = _thd(g, "q"), _thd(g, "k", h=2), _thd(g, "v", h=2)
    o, do = _thd(g, "o"), _thd(g, "dO")
    st = g.tensor((B, H, S, 1), (H * S, 1, H, 1), data_type="float32", name="stats")
    st.set_ragged_offset(g.tensor((B + 1, 1, 1, 1), data_type="int32", name="st_off"))
    sq, skv = _lens(g)
    dq, dk, dv = g.sdpa_backward(q, k, v, o, do, st, seq_len_q=sq, seq_len_kv=skv)
    for t, like in ((dq, q), (dk, k), (dv, v)):
        t.set_ragged_offset(like.ragged_offset)
    (reshape_k,) = [n for n in g._nodes if n[1].endswith("::reshape_k")]
    out = dict(reshape_k[3])["OPERATION_RESHAPE_YDESC"]
    assert out.ragged_offset is k.ragged_offset
    key = g.key(device=0)
    assert sum(t.ragged_offset is not None for t in key.tensors) == 10  # 9 + the K view
    # the scratch accumulators stay padded (B, H, S, ...) tensors, as cudnn-frontend's
    assert all(t.ragged_offset is None for t in key.scratch)
