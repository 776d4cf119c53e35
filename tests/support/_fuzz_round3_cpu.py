"""Issue 42's generators for the CPU fuzzer (``_fuzz_builder_child.py`` appends them to its
``GENERATORS``): what found the round-three findings, each with an oracle from the contract.

* ``case_dtype_mix``: attention's q/k/v with data types drawn from float32, float16, bfloat16
  and unset, on graphs whose io type is float16, float32 or unset (float32 is a type, not
  "unset": DataType.FLOAT is 0);
* ``case_index_dtypes``: every builder operation's index and mask tensors -- the lengths, the
  dropout seed and offset, the matmul overrides, binary_select's mask, a paged cache's table --
  with data types drawn from the right one, others, and unset (which resolves to the graph's);
* ``case_shared``: q, k and v drawn from a pool of tensors (aliasing), and a tensor shared with
  another operation before or after the attention; every argument's dims, strides and data
  type must be unchanged by every call;
* ``case_builder_options``: reshape strides of another rank, relu clips in either order,
  conv padding up to 2**40, graph names of any type, strides up to 2**62 elements;
* ``case_descriptor``: hostile shapes, strides and containers for the descriptors (dicts,
  sets, generators, arrays, byte-swapped dtypes, conv and pooling pads, activation
  coefficients) and hostile values for ``BackendDescriptor.set`` (BOOLEAN, FLOAT, FRACTION,
  containers).
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np

import pycudnn
from pycudnn.enums import BackendAttributeName as A
from pycudnn.enums import BackendAttributeType as T
from pycudnn.enums import BackendDescriptorType as D
from pycudnn.graph import Graph

pycudnn.TensorDescriptor((1, 1, 1), "float32").close()  # load cuDNN once, before the forks

_TYPES = [None, "float32", "float16", "bfloat16"]
_IO = ["float16", "float32", None]


def _resolved(own: str | None, io: str | None) -> str | None:
    return own if own is not None else io


def case_dtype_mix(rng: random.Random) -> tuple:
    io = rng.choice(_IO)
    dts = [rng.choice(_TYPES) for _ in range(3)]
    eff = [_resolved(t, io) for t in dts]
    ok = len({t for t in eff if t is not None}) <= 1

    def program() -> None:
        g = Graph(io_data_type=io, name="Gm")
        q, k, v = (
            g.tensor((1, 2, 16, 64), data_type=t, name=n) for t, n in zip(dts, "qkv", strict=True)
        )
        o, _ = g.sdpa(q, k, v)
        want = eff[0]  # q's type, its own or the graph's (unset without either)
        got = None if o.data_type is None else pycudnn._types.dtype_name(o.data_type)
        assert got == want, f"o is {got}, expected {want}"

    label = f"sdpa io={io} q/k/v={dts}"
    return label, program, "valid" if ok else (("Gm.sdpa", "data type"), ("float32", "float16"))


_INDEX_TYPES = [None, "int32", "int64", "float16", "float32", "bool"]


def case_index_dtypes(rng: random.Random) -> tuple:
    which = rng.choice(["seq_len", "dropout", "override", "mask", "table"])
    dt = rng.choice(_INDEX_TYPES)
    io = rng.choice(["float16", "bfloat16"])
    need = {"seq_len": "int32", "dropout": "int64", "override": "int32", "mask": "bool"}
    need["table"] = "int32"
    ok = _resolved(dt, io) == need[which]

    def program() -> None:
        g = Graph(io_data_type=io, name="Gi")
        if which == "mask":
            a, b = g.tensor((4, 4)), g.tensor((4, 4))
            g.binary_select(a, b, g.tensor((4, 4), data_type=dt, name="m"))
            return
        if which == "override":
            a, b = g.tensor((3, 8, 16)), g.tensor((3, 16, 8))
            g.matmul(a, b, m_override=g.tensor((3, 1, 1), data_type=dt, name="m"))
            return
        q, k, v = (g.tensor((2, 2, 1 if which == "table" else 16, 64)) for _ in range(3))
        lens = [g.tensor((2, 1, 1, 1), data_type="int32") for _ in range(2)]
        if which == "seq_len":
            lens[rng.randrange(2)] = g.tensor((2, 1, 1, 1), data_type=dt, name="m")
            g.sdpa(q, k, v, seq_len_q=lens[0], seq_len_kv=lens[1])
        elif which == "dropout":
            seed = g.tensor((1, 1, 1, 1), data_type=dt, name="m")
            off = g.tensor((1, 1, 1, 1), data_type="int64")
            g.sdpa(q, k, v, is_inference=False, dropout=(0.1, seed, off))
        else:
            kc, vc = g.tensor((8, 2, 16, 64)), g.tensor((8, 2, 16, 64))
            tab = g.tensor((2, 1, 2, 1), data_type=dt, name="m")
            g.sdpa(
                q,
                kc,
                vc,
                seq_len_q=lens[0],
                seq_len_kv=lens[1],
                paged_attention_k_table=tab,
                paged_attention_v_table=g.tensor((2, 1, 2, 1), data_type="int32"),
                paged_attention_max_seq_len_kv=32,
            )

    label = f"index tensor {which} dtype={dt} io={io}"
    return label, program, "valid" if ok else (("Gi.", "'m'", need[which]), ())


def _snap(ts: list) -> list:
    return [(t.dim, t.stride, t.data_type, repr(t)) for t in ts]


def case_shared(rng: random.Random) -> tuple:
    pick = [rng.randrange(3) for _ in range(3)]  # q, k, v from a pool of three tensors
    other = rng.choice([None, "before", "after"])
    on = rng.choice(["k", "q", "v"])
    backward = rng.random() < 0.3
    swapped = {pick[1]} | ({pick[2]} if backward else set())
    others = {pick[0]} | (set() if backward else {pick[2]})
    reasons = []
    if swapped & others:
        reasons.append("the same tensor")
    shared = {"q": pick[0], "k": pick[1], "v": pick[2]}[on]
    if other == "before" and shared in swapped:  # (either refusal may come first)
        reasons.append("already an input")
    if other == "after" and shared in swapped and not reasons:
        reasons.append("attention's k or v")

    def program() -> None:
        g = Graph(io_data_type="float16", name="Gs")
        pool = [g.tensor((1, 2, 16, 64), name=f"t{i}") for i in range(3)]
        q, k, v = (pool[i] for i in pick)
        before = _snap(pool)
        t = {"q": q, "k": k, "v": v}[on]
        if other == "before":
            g.add(t, g.tensor((1, 2, 16, 64)))
        try:
            if backward:
                o, do = g.tensor((1, 2, 16, 64)), g.tensor((1, 2, 16, 64))
                st = g.tensor((1, 2, 16, 1), data_type="float32")
                g.sdpa_backward(q, k, v, o, do, st)
            else:
                g.sdpa(q, k, v)
            if other == "after":
                g.add(t, g.tensor((1, 2, 16, 64)))
        finally:
            assert _snap(pool) == before, "an argument was changed by a call"

    label = f"shared q/k/v=t{pick} {'backward' if backward else 'forward'} {on} {other}"
    if not reasons:
        return label, program, "valid"
    return label, program, (("Gs.",), tuple(reasons))


def case_builder_options(rng: random.Random) -> tuple:
    what = rng.choice(["reshape", "relu", "conv", "name", "stride"])
    if what == "reshape":
        n = rng.choice([1, 3, 4, 4, 5])

        def program() -> None:
            g = Graph(io_data_type="float16", name="Go")
            g.reshape(g.tensor((256, 1, 1, 1)), (256, 1, 1, 1), (1,) * n)

        return (
            f"reshape stride rank {n}",
            program,
            ("valid" if n == 4 else (("Go.reshape", "stride"), ())),
        )
    if what == "relu":
        lo, hi = rng.choice([0, 1, 5, -2]), rng.choice([0, 1, 5, 6])

        def program() -> None:
            g = Graph(io_data_type="float16", name="Go")
            g.relu(g.tensor((4, 4)), relu_lower_clip=lo, relu_upper_clip=hi)

        return (
            f"relu clips {lo}, {hi}",
            program,
            ("valid" if lo <= hi else (("relu_lower_clip", "relu_upper_clip"), ())),
        )
    if what == "conv":
        pad = rng.choice([0, 1, 3, 2**20, 2**40, 2**62])
        ok = 8 + 2 * pad - 2 >= 1 and 4 * (8 + 2 * pad - 2) ** 2 <= 2**63 - 1

        def program() -> None:
            g = Graph(io_data_type="float16", name="Go")
            g.conv_fprop(g.tensor((1, 3, 8, 8)), g.tensor((4, 3, 3, 3)), padding=pad)

        return f"conv padding {pad}", program, "valid" if ok else (("Go.conv_fprop", "padding"), ())
    if what == "name":
        name = rng.choice(["g", "G 1", 123, "", None, b"g", ["g"]])
        ok = isinstance(name, str) and name != ""

        def program() -> None:
            Graph(name=name)

        return f"Graph(name={name!r})", program, "valid" if ok else (("name",), ())
    stride = rng.choice([1, 2**40, 2**61, 2**62, 2**62 + 1])
    dt = rng.choice(["float16", "float32", "int8", None])
    span = stride + 2  # 1 + (2 - 1) * stride + (2 - 1) * 1
    size = {"float16": 2, "float32": 4, "int8": 1, None: 1}[dt]
    ok = span * size <= 2**63 - 1

    def program() -> None:
        g = Graph(name="Go")
        g.tensor((2, 2), (stride, 1), data_type=dt)

    return f"stride {stride} {dt}", program, "valid" if ok else (("Go",), ("bytes", "int64"))


def _shape_container(rng: random.Random, dims: tuple[int, ...]) -> tuple[Any, bool]:
    kind = rng.choice(["tuple", "list", "dict", "set", "gen", "ndarray", "str", "nested"])
    if kind == "tuple":
        return dims, True
    if kind == "list":
        return list(dims), True
    if kind == "dict":
        return dict.fromkeys(dims, 0), False
    if kind == "set":
        return set(dims), False
    if kind == "gen":
        return (d for d in dims), True  # an iterable in order: taken
    if kind == "ndarray":
        return np.array(dims), True
    if kind == "str":
        return ",".join(map(str, dims)), False
    return [list(dims)], False


_HOSTILE_DTYPES = [
    ("float32", True),
    (np.float16, True),
    (np.dtype("<f4"), True),
    (np.dtype(">f4"), False),
    (np.dtype(">f2"), False),
    (">f4", False),
    ("complex64", False),
    (None, False),
]


def case_descriptor(rng: random.Random) -> tuple:
    what = rng.choice(["tensor", "filter", "conv", "pool", "activation", "backend"])
    if what in ("tensor", "filter"):
        dims = tuple(rng.choice([1, 2, 3, 5]) for _ in range(rng.choice([3, 4, 5])))
        shape, ok_shape = _shape_container(rng, dims)
        dtype, ok_dt = rng.choice(_HOSTILE_DTYPES)
        cls = pycudnn.TensorDescriptor if what == "tensor" else pycudnn.FilterDescriptor

        def program() -> None:
            d = cls(shape, dtype)
            assert d.shape == dims, f"shape {d.shape} != {dims}"

        frag = "shape" if not ok_shape else "dtype"
        return (
            f"{what}({shape!r}, {dtype!r})",
            program,
            ("valid" if ok_shape and ok_dt else ((), (frag, "dtype", "shape"))),
        )
    if what == "conv":
        pad = rng.choice([0, 1, 2**20, 2**30 - 1, 2**30, 2**31 - 1, -1])
        ok = 0 <= pad <= (2**31 - 1) // 2
        fits = ok and 8 + 2 * pad <= 2**31 - 1

        def program() -> None:
            c = pycudnn.ConvolutionDescriptor(pad=pad)
            x = pycudnn.TensorDescriptor((1, 3, 8, 8), "float32")
            w = pycudnn.FilterDescriptor((4, 3, 3, 3), "float32")
            shape = c.forward_output_shape(x, w)
            assert all(s >= 1 for s in shape), shape

        return f"conv pad={pad}", program, "valid" if fits else (("pad",), ())
    if what == "pool":
        win, pad = rng.choice([1, 2, 3]), rng.choice([0, 1, 2, 3])

        def program() -> None:
            pycudnn.PoolingDescriptor(win, pad=pad)

        return (
            f"pool window={win} pad={pad}",
            program,
            ("valid" if pad < win else (("pad", "window"), ())),
        )
    if what == "activation":
        mode = rng.choice(["relu", "clipped_relu", "elu"])
        coef = rng.choice([0.0, 1.0, -5.0, 6.0, 10**400, math.nan, math.inf])
        ok = isinstance(coef, float) and math.isfinite(coef)
        ok = ok and not (mode == "clipped_relu" and coef < 0)

        def program() -> None:
            pycudnn.ActivationDescriptor(mode, coef)

        return f"activation {mode} coef={coef!r:.20}", program, ("valid" if ok else (("coef",), ()))
    return _case_backend_set(rng)


def _case_backend_set(rng: random.Random) -> tuple:
    kind = rng.choice(["bool", "float", "double", "fraction", "dims"])
    if kind == "bool":
        v = rng.choice([True, False, 0, 1, 5, -1, 2.0, np.True_])
        ok = isinstance(v, bool | np.bool_) or (type(v) is int and v in (0, 1))
        attr, at = A.TENSOR_IS_VIRTUAL, T.BOOLEAN
        desc = D.TENSOR_DESCRIPTOR
    elif kind in ("float", "double"):
        v = rng.choice([0.5, 1e38, 3.5e38, 1e300, 10**400, math.inf, -math.inf])
        try:
            f = float(v)
        except OverflowError:
            f = None
        ok = f is not None and (kind == "double" or not math.isfinite(f) or abs(f) <= 3.4028e38)
        attr, at = A.POINTWISE_RELU_LOWER_CLIP, T.FLOAT if kind == "float" else T.DOUBLE
        desc = D.POINTWISE_DESCRIPTOR
    elif kind == "fraction":
        v = rng.choice([(1, 2), (1, 0), 2**70, (2**64, 1), 3])
        num, den = v if isinstance(v, tuple) else (v, 1)
        ok = den != 0 and abs(num) < 2**63 and abs(den) < 2**63
        attr, at = A.POINTWISE_RELU_LOWER_CLIP, T.FRACTION  # cuDNN refuses the type: BadParam
        desc = D.POINTWISE_DESCRIPTOR
    else:
        dims = (1, 2, 3)
        v, ok = _shape_container(rng, dims)
        ok = ok and not isinstance(v, str)
        attr, at = A.TENSOR_DIMENSIONS, T.INT64
        desc = D.TENSOR_DESCRIPTOR

    def program() -> None:
        d = pycudnn.BackendDescriptor(desc)
        try:
            d.set(attr, at, v)
        except pycudnn.errors.BadParamError:
            pass  # cuDNN's own refusal of the attribute's type: past pycudnn's checks

    label = f"BackendDescriptor.set({attr.name}, {at.name}, {v!r:.40})"
    return label, program, "valid" if ok else ((), ("values", "must", "fit"))


GENERATORS = [case_dtype_mix, case_index_dtypes, case_shared, case_builder_options, case_descriptor]
