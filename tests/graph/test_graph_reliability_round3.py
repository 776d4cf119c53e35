"""Issue 42: the graph builder's dtypes it must not guess, arguments it must not change, and the
last silent accepts (no GPU).

Every case is refused when the operation is added (or the tensor declared), before any C call,
with a message naming the graph, the operation, the argument and what was expected; and no
tensor given to an operation is changed by it.
"""

from __future__ import annotations

import pytest

from pycudnn.enums import DataType
from pycudnn.graph import Graph, load_plan


def G(io="float16"):
    return Graph(io_data_type=io, name="G")


def _qkv(g, dtypes=(None, None, None), s=8):
    return tuple(
        g.tensor((1, 2, s, 64), data_type=dt, name=nm) for nm, dt in zip("qkv", dtypes, strict=True)
    )


def _snapshot(*tensors):
    return [(t.dim, t.stride, t.data_type, repr(t)) for t in tensors]


# -- 1. float32 is a data type, not "unset" --------------------------------------------------------
@pytest.mark.parametrize(
    "dtypes",
    [
        ("float32", "float16", "float16"),
        ("float16", "float32", "float16"),
        ("float16", "float16", "float32"),
        ("float32", None, None),  # unset k and v are the graph's float16
        (None, "float32", None),
        ("bfloat16", "float16", "float16"),
    ],
)
def test_sdpa_float32_mixed_with_the_io_type_is_refused(dtypes):
    g = G()
    with pytest.raises(TypeError, match=r"G\.sdpa: q, k and v must have one data type, got q "):
        g.sdpa(*_qkv(g, dtypes))


def test_sdpa_all_float32_or_all_unset_is_taken():
    g = G()
    g.sdpa(*_qkv(g, ("float32",) * 3))
    g = G()
    o, _ = g.sdpa(*_qkv(g))
    assert o.data_type == DataType.HALF
    g = G("float32")  # a float32 graph: float32 q/k/v and outputs
    o, _ = g.sdpa(*_qkv(g))
    assert o.data_type == DataType.FLOAT


def test_paged_cache_of_float32_is_not_read_as_unset():
    g = G()
    q = g.tensor((2, 2, 1, 64), data_type="float32", name="q")
    kc = g.tensor((8, 2, 16, 64), data_type="float32", name="kc")
    vc = g.tensor((8, 2, 16, 64), data_type="float32", name="vc")
    sq = g.tensor((2, 1, 1, 1), data_type="int32")
    skv = g.tensor((2, 1, 1, 1), data_type="int32")
    tab = g.tensor((2, 1, 2, 1), data_type="int32")
    o, _ = g.sdpa(
        q,
        kc,
        vc,
        seq_len_q=sq,
        seq_len_kv=skv,
        paged_attention_k_table=tab,
        paged_attention_v_table=tab,
        paged_attention_max_seq_len_kv=32,
    )
    assert o.data_type == DataType.FLOAT  # the load's output is float32, as the cache


# -- 2. index tensors must be declared with their int type -----------------------------------------
def test_seq_lens_without_a_dtype_are_refused_naming_the_io_type():
    g = G()
    sq, skv = g.tensor((1, 1, 1, 1), name="sq"), g.tensor((1, 1, 1, 1), name="skv")
    with pytest.raises(TypeError, match=r"G\.sdpa: seq_len_q \('sq'\) must be int32.*float16"):
        g.sdpa(*_qkv(g), seq_len_q=sq, seq_len_kv=skv)
    g = Graph(name="G")  # no io type at all
    q, k, v = _qkv(g, ("float16",) * 3)
    sq, skv = g.tensor((1, 1, 1, 1), name="sq"), g.tensor((1, 1, 1, 1), name="skv")
    with pytest.raises(TypeError, match=r"seq_len_q \('sq'\) must be int32, got no data type"):
        g.sdpa(q, k, v, seq_len_q=sq, seq_len_kv=skv)


def test_dropout_seed_without_a_dtype_is_refused():
    g = G()
    seed, off = g.tensor((1, 1, 1, 1), name="seed"), g.tensor((1, 1, 1, 1), data_type="int64")
    with pytest.raises(TypeError, match=r"dropout seed \('seed'\) must be int64"):
        g.sdpa(*_qkv(g), is_inference=False, dropout=(0.1, seed, off))


def test_page_table_without_a_dtype_is_refused():
    g = G()
    q = g.tensor((2, 2, 1, 64), name="q")
    kc, vc = g.tensor((8, 2, 16, 64), name="kc"), g.tensor((8, 2, 16, 64), name="vc")
    lens = [g.tensor((2, 1, 1, 1), data_type="int32") for _ in range(2)]
    tab = g.tensor((2, 1, 2, 1), name="tab")
    with pytest.raises(TypeError, match=r"paged_attention_k_table \('tab'\) must be int32"):
        g.sdpa(
            q,
            kc,
            vc,
            seq_len_q=lens[0],
            seq_len_kv=lens[1],
            paged_attention_k_table=tab,
            paged_attention_max_seq_len_kv=32,
        )


@pytest.mark.parametrize("which", ["m_override", "n_override", "k_override"])
def test_matmul_overrides_dtype_and_dims_checked(which):
    g = G()
    a, b = g.tensor((3, 8, 16)), g.tensor((3, 16, 8))
    bad_type = g.tensor((3, 1, 1), data_type="float16", name="o16")
    with pytest.raises(TypeError, match=rf"G\.matmul: {which} \('o16'\) must be int32"):
        g.matmul(a, b, **{which: bad_type})
    unset = g.tensor((3, 1, 1), name="unset")
    with pytest.raises(TypeError, match=rf"{which} \('unset'\) must be int32.*float16"):
        g.matmul(a, b, **{which: unset})
    for dims in [(3, 5, 7), (3, 1), (2, 1, 1), (3, 1, 1, 1)]:
        bad = g.tensor(dims, data_type="int32", name="bad")
        with pytest.raises(ValueError, match=rf"G\.matmul: {which} \('bad'\) holds one valid"):
            g.matmul(a, b, **{which: bad})
    for dims in [(3, 1, 1), (1, 1, 1)]:
        g.matmul(a, b, **{which: g.tensor(dims, data_type="int32")})
    assert len(g._nodes) == 2


# -- 3. attention does not change its k; aliasing and sharing refused ---------------------------
def test_sdpa_leaves_k_as_declared():
    g = G()
    q, k, v = _qkv(g)
    before = _snapshot(q, k, v)
    g.sdpa(q, k, v)
    assert _snapshot(q, k, v) == before
    g.validate()


@pytest.mark.parametrize("alias", ["qqq", "qqv", "kkv", "qkk"])  # q is v: fine
def test_sdpa_aliased_operands_are_refused(alias):
    g = G()
    t = dict(zip("qkv", _qkv(g), strict=True))
    args = [t[c] for c in alias]
    with pytest.raises(ValueError, match=r"G\.sdpa: k and [qv] are the same tensor"):
        g.sdpa(*args)
    assert g._nodes == [] and g._transposed == {}


def test_sdpa_k_shared_with_another_operation_is_refused_either_way():
    g = G()
    q, k, v = _qkv(g)
    g.add(k, q)
    with pytest.raises(ValueError, match=r"G\.sdpa: k \('k'\) is already an input of another"):
        g.sdpa(q, k, v)
    g = G()
    q, k, v = _qkv(g)
    o, _ = g.sdpa(q, k, v)
    for op in (lambda: g.add(k, q), lambda: g.matmul(q, k), lambda: g.relu(k)):
        with pytest.raises(ValueError, match=r"tensor 'k' is an attention's k or v \('sdpa'\)"):
            op()
    g.add(q, v)  # q and v are read as declared: they may be shared
    o.set_output(True)
    g.validate()


def test_two_attentions_may_share_k_but_not_swap_roles():
    g = G()
    q, k, v = _qkv(g)
    g.sdpa(q, k, v, name="a1")
    q2 = g.tensor(q.dim, name="q2")
    g.sdpa(q2, k, v, name="a2")  # both read k transposed: one description
    with pytest.raises(ValueError, match=r"q \('k'\) is the k or v of attention 'a1'"):
        g.sdpa(k, g.tensor(k.dim, name="k3"), g.tensor(k.dim, name="v3"))


def test_sdpa_backward_v_shared_with_the_forward_is_refused():
    g = G()
    q, k, v = _qkv(g)
    o, st = g.sdpa(q, k, v, is_inference=False)
    do = g.tensor(o.dim, name="do")
    with pytest.raises(ValueError, match=r"sdpa_backward: v \('v'\) is already an input"):
        g.sdpa_backward(q, k, v, o, do, st)
    kb, vb = g.tensor(k.dim, name="kb"), g.tensor(v.dim, name="vb")
    g.sdpa_backward(q, kb, vb, o, do, st)


def test_a_constant_used_at_two_ranks_is_copied_not_changed():
    g = G()
    s = g.scalar(2.0, name="two")
    g.mul(g.tensor((4, 5)), s)
    g.mul(g.tensor((2, 3, 4, 5)), s)
    assert s.dim == (1, 1, 1, 1)


# -- unclear messages and silent accepts ---------------------------------------------------------
def test_reshape_stride_of_another_rank_is_named():
    g = G()
    x = g.tensor((256, 1, 1, 1), name="x")
    with pytest.raises(ValueError, match=r"G\.reshape: stride \(1, 1, 1\) has 3 values, dim"):
        g.reshape(x, (256, 1, 1, 1), (1, 1, 1))


def test_conv_padding_too_large_is_named():
    g = G()
    x, w = g.tensor((1, 3, 8, 8)), g.tensor((4, 3, 3, 3))
    with pytest.raises(ValueError, match=r"G\.conv_fprop: padding \(1099511627776, "):
        g.conv_fprop(x, w, padding=2**40)


def test_relu_clips_in_the_wrong_order_are_refused():
    g = G()
    x = g.tensor((4, 4))
    with pytest.raises(ValueError, match=r"relu_lower_clip=5 is above relu_upper_clip=1"):
        g.relu(x, relu_lower_clip=5, relu_upper_clip=1)
    g.relu(x, relu_lower_clip=1, relu_upper_clip=1)


@pytest.mark.parametrize("dt", ["float16", "float32", "int32", None])
def test_binary_select_mask_must_be_boolean(dt):
    g = G()
    a, b = g.tensor((4, 4)), g.tensor((4, 4))
    m = g.tensor((4, 4), data_type=dt, name="m")
    with pytest.raises(
        TypeError, match=r"G\.binary_select: input2 \(the mask\) \('m'\) must be bool"
    ):
        g.binary_select(a, b, m)
    g.binary_select(a, b, g.tensor((4, 4), data_type="bool"))
    g.binary_select(a, b, g.cmp_gt(a, b))


@pytest.mark.parametrize("name", [123, "", None, b"g"])
def test_graph_name_must_be_a_str(name):
    with pytest.raises(TypeError, match="Graph: name must be a non-empty str"):
        Graph(name=name)


def test_strides_past_a_64_bit_address_space_are_refused():
    g = G()
    with pytest.raises(ValueError, match=r"span \d+ float16 elements, \d+ bytes"):
        g.tensor((2, 2), stride=(2**62, 1))
    g32 = Graph(name="G")
    t = g32.tensor((2, 2), stride=(2**62, 1))  # no type yet: 2**62 bytes may still be
    with pytest.raises(ValueError, match="bytes: more than a 64-bit address space"):
        t.set_data_type("float32")
    with pytest.raises(ValueError, match="bytes: more than a 64-bit address space"):
        g.tensor((2, 2), data_type="int8").set_stride((2**61, 1)).set_data_type("float64")


def test_load_plan_checks_its_arguments_before_cudnn():
    with pytest.raises(TypeError, match=r"load_plan: h must be a pycudnn\.Handle"):
        load_plan("garbage", None, [1])
    with pytest.raises(TypeError, match="load_plan: text must be a non-empty str"):
        load_plan(b"x", None, [1])
    from pycudnn import handle

    class H(handle.Handle):
        def __init__(self):  # never a real handle: the checks run before any use of it
            pass

    with pytest.raises(ValueError, match="load_plan: uids must be ints"):
        load_plan("x", H(), [0])
    with pytest.raises(TypeError, match="load_plan: engine must be an int"):
        load_plan("x", H(), [1], engine=1.5)
