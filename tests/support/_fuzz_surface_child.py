"""Child process: property-based fuzzing of the public surface that needs no GPU (issue 16).

Run as ``python _fuzz_surface_child.py GROUP EXAMPLES``; GROUP is one of ``backend``,
``arguments``, ``interop``, ``config``. Every case's outcome must be a correct result or a
documented Python error (``TypeError``, ``ValueError``, ``OverflowError``, ``BufferError``,
``NotImplementedError`` for masked arrays, ``AttributeError`` for unknown config flags, a
``CudnnError`` for cuDNN's own verdict). Where the case is known to be invalid (an independent
oracle written here, not the code under test), success is a *silent accept*; where it is known
valid, a refusal is a *false refusal*; results are compared with what was asked for. Anything else
fails the run (exit 1 with hypothesis' minimal example); a crash is a signal in the parent. Prints
one JSON line: cases, outcomes, silent accepts, false refusals, wrong results per target.

``backend`` is meant to run with the stub ``libcuda.so.1`` on ``LD_LIBRARY_PATH`` (see
``tests/test_backend_descriptors.py``): cuDNN then finalizes descriptors without a GPU, so
finalize and read-back are fuzzed too.
"""

from __future__ import annotations

import collections
import ctypes
import json
import math
import os
import sys
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pycudnn
from pycudnn import _resource, api, enums, errors
from pycudnn._config import Flags
from pycudnn.descriptors import (
    BackendDescriptor,
    ConvolutionDescriptor,
    DropoutDescriptor,
    FilterDescriptor,
    PoolingDescriptor,
    RNNDataDescriptor,
    RNNDescriptor,
    TensorDescriptor,
    _codec,
)
from pycudnn.enums import BackendAttributeName as A
from pycudnn.enums import BackendAttributeType as T
from pycudnn.enums import BackendDescriptorType as D
from pycudnn.memory import _dlpack
from pycudnn.memory.array import DeviceArray

DOCUMENTED = (
    TypeError,
    ValueError,
    OverflowError,
    BufferError,
    NotImplementedError,
    errors.CudnnError,
)
CASES: collections.Counter[str] = collections.Counter()
OUTCOMES: collections.Counter[str] = collections.Counter()
TRACE = os.environ.get("PYCUDNN_FUZZ_TRACE") == "1"
SILENT: list[str] = []  # invalid input accepted
FALSE: list[str] = []  # valid input refused
WRONG: list[str] = []  # accepted, but the result is not what was asked for

SETTINGS = settings(
    max_examples=int(sys.argv[2]) if len(sys.argv) > 2 else 100,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def run(
    target: str, fn, *args, invalid: bool | None = None, extra=(), what: Any = None, **kwargs
) -> Any:
    """Call *fn*; count the outcome; check it against the oracle (*invalid*: True must be
    refused, False must succeed, None unknown). Returns the result or None."""
    CASES[target] += 1
    shown = what if what is not None else (args, kwargs)
    if TRACE:  # the last line before a crash names the case (PYCUDNN_FUZZ_TRACE=1)
        print(f"TRACE {target}: {shown!r:.500}", file=sys.stderr, flush=True)
    try:
        result = fn(*args, **kwargs)
    except DOCUMENTED + tuple(extra) as exc:
        OUTCOMES[type(exc).__name__] += 1
        if invalid is False and not isinstance(exc, errors.CudaUnavailableError):
            FALSE.append(f"{target}: {shown!r:.200}: {type(exc).__name__}: {exc}"[:400])
        return None
    OUTCOMES["ok"] += 1
    if invalid:
        SILENT.append(f"{target}: accepted {shown!r:.300}")
    return result


# -- shared strategies -----------------------------------------------------------------------------
ENUM_MEMBERS = [
    m
    for cls in (
        enums.ActivationMode,
        enums.TensorFormat,
        enums.Status,
        enums.ConvolutionMode,
        enums.PoolingMode,
        enums.BackendAttributeType,
        enums.PointwiseMode,
        enums.DataType,
    )
    for m in cls
]
junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**65), 2**65),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.lists(st.integers(-3, 9), max_size=4),
    st.sampled_from(ENUM_MEMBERS),
    st.just(object()),
)
USABLE_TYPES = [d for d in D if d != D.INTERMEDIATE_INFO_DESCRIPTOR]  # that one cannot be created


# -- backend ---------------------------------------------------------------------------------------
class Pool:
    """Descriptors for one example: created on demand, some closed, all closed at the end."""

    def __init__(self) -> None:
        self.items: list[Any] = []

    def make(self, dtype: D) -> BackendDescriptor:
        d = BackendDescriptor(dtype)
        self.items.append(d)
        return d

    def close(self) -> None:
        for d in self.items:
            d.close()


value_kinds = st.sampled_from(
    ["fresh", "fresh", "fresh", "self", "closed", "legacy", "int", "junk"]
)


@st.composite
def descriptor_values(draw, pool: Pool, owner: BackendDescriptor):
    """A list of values for a BACKEND_DESCRIPTOR attribute, and whether it must be refused
    (given the attribute's allowed types, decided by the caller)."""
    out, kinds = [], []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(value_kinds)
        if kind == "fresh":
            out.append(pool.make(draw(st.sampled_from(USABLE_TYPES))))
        elif kind == "self":
            out.append(owner)
        elif kind == "closed":
            d = pool.make(draw(st.sampled_from(USABLE_TYPES)))
            d.close()
            out.append(d)
        elif kind == "legacy":
            out.append(TensorDescriptor((1, 2, 3)))
        elif kind == "int":
            out.append(draw(st.integers(0, 2**64 - 1)))
        else:
            out.append(draw(junk))
        kinds.append(kind)
    return out, kinds


def attrs_of(dtype: D) -> list[A]:
    return [A(a) for a, o in _codec.OWNER.items() if o == dtype]


@SETTINGS
@given(data=st.data())
def fuzz_backend_set(data):
    pool = Pool()
    try:
        owner = pool.make(data.draw(st.sampled_from(USABLE_TYPES)))
        own = attrs_of(owner.descriptor_type)
        attr = data.draw(
            st.sampled_from(own)
            if own and data.draw(st.integers(0, 3))
            else st.sampled_from(list(A))
        )
        takes = _codec.TAKES.get(int(attr))
        if takes is not None and data.draw(st.integers(0, 3)):
            atype = T.BACKEND_DESCRIPTOR
        else:
            atype = data.draw(st.sampled_from(list(T)))
        if atype == T.BACKEND_DESCRIPTOR:
            values, kinds = data.draw(descriptor_values(pool, owner))
            bad = takes is None or any(
                k in ("self", "closed", "legacy", "int", "junk")
                or (k == "fresh" and v.descriptor_type not in takes)
                for v, k in zip(values, kinds, strict=True)
            )
            arg = values if len(values) > 1 or data.draw(st.booleans()) else values[0]
            # (a value of an allowed type may still be refused by cuDNN: invalid=None then)
            run(
                "BackendDescriptor.set[BACKEND_DESCRIPTOR]",
                owner.set,
                attr,
                atype,
                arg,
                invalid=True if bad else None,
            )
        else:
            value = data.draw(st.one_of(junk, st.lists(junk, max_size=4)))
            if atype in (T.HANDLE, T.VOID_PTR):
                # raw addresses are trusted by design (no binding can check them): only objects
                value = data.draw(st.sampled_from([TensorDescriptor((1, 1, 1)), owner, "x", 1.5]))
                run(
                    f"BackendDescriptor.set[{atype.name}]",
                    owner.set,
                    attr,
                    atype,
                    value,
                    invalid=True,
                )
            else:
                run("BackendDescriptor.set[other]", owner.set, attr, atype, value)
        if data.draw(st.booleans()):
            run("BackendDescriptor.finalize", owner.finalize)
        if data.draw(st.booleans()):
            a2 = data.draw(st.sampled_from(own or list(A)))
            if a2 in _codec.TAKES or data.draw(st.booleans()):
                dt = data.draw(st.sampled_from(USABLE_TYPES))
                bad = int(a2) not in _codec.TAKES or dt not in _codec.TAKES[int(a2)]
                got = run(
                    "BackendDescriptor.get[BACKEND_DESCRIPTOR]",
                    owner.get,
                    a2,
                    T.BACKEND_DESCRIPTOR,
                    data.draw(st.sampled_from([None, 1, 4])),
                    descriptor_type=dt,
                    invalid=True if bad else None,
                )
                for d in got or ():
                    d.close()
            else:
                atype2 = data.draw(st.sampled_from(list(T)))
                count = data.draw(st.sampled_from([None, 0, 1, 8]))
                run("BackendDescriptor.get[other]", owner.get, a2, atype2, count)
        # close in a random order, then use what is left and what is closed
        order = data.draw(st.permutations(range(len(pool.items))))
        for i in order[: data.draw(st.integers(0, len(order)))]:
            pool.items[i].close()
        if owner.closed:
            run("closed.set", owner.set, attr, T.INT64, [1], invalid=True)
    finally:
        pool.close()


@SETTINGS
@given(data=st.data())
def fuzz_backend_graph(data):
    """Plausible graphs, miswired at random; finalized (stub libcuda) and read back."""
    pool: list[Any] = []

    def tensor(uid, shape=(1, 8, 4, 4)):
        t = run(
            "BackendDescriptor.tensor",
            BackendDescriptor.tensor,
            shape,
            uid=uid,
            finalize=data.draw(st.booleans()) or True,
        )
        if t is not None:
            pool.append(t)
        return t

    try:
        x, y = tensor(1), tensor(2)
        mode = data.draw(st.sampled_from(["relu_fwd", "add", "tanh_fwd", "sigmoid_fwd"]))
        pw = run("BackendDescriptor.pointwise", BackendDescriptor.pointwise, mode)
        if pw is not None:
            pool.append(pw)
        cands = [d for d in (x, y, pw) if d is not None] + [BackendDescriptor("engine")]
        pool.append(cands[-1])
        if data.draw(st.booleans()) and None not in (x, y, pw):
            inputs = [pw, x, y]  # well wired: reaches finalize, the graph and the heuristics
        else:
            inputs = [data.draw(st.sampled_from(cands)) for _ in range(3)]
        if data.draw(st.integers(0, 2)) == 0:  # close an input before it is used
            victim = data.draw(st.sampled_from(inputs))
            victim.close()
        # the oracle: the thin constructor checks types and closed inputs itself
        op = run(
            "BackendDescriptor.operation_pointwise",
            BackendDescriptor.operation_pointwise,
            inputs[0],
            inputs[1],
            inputs[2],
            finalize=True,
        )
        if op is None:
            return
        pool.append(op)
        for d in pool[:-1]:
            if data.draw(st.booleans()):
                d.close()  # the op still refers to them: deferred
        g = run("BackendDescriptor.operation_graph", BackendDescriptor.operation_graph, [op])
        if g is not None:
            pool.append(g)
            dt = data.draw(st.sampled_from(USABLE_TYPES))
            got = run(
                "finalized.get[BACKEND_DESCRIPTOR]",
                op.get,
                "OPERATION_POINTWISE_XDESC",
                "BACKEND_DESCRIPTOR",
                1,
                descriptor_type=dt,
                invalid=True if dt != D.TENSOR_DESCRIPTOR else None,
            )
            for d in got or ():
                if d.descriptor_type != D.TENSOR_DESCRIPTOR:
                    WRONG.append(f"get returned {d!r}")
                d.close()
            heur = BackendDescriptor("engineheur")
            pool.append(heur)
            run("engineheur.set", heur.set, "ENGINEHEUR_OPERATION_GRAPH", "BACKEND_DESCRIPTOR", g)
            run("engineheur.set", heur.set, "ENGINEHEUR_MODE", "HEUR_MODE", "mode_a")
            run("engineheur.finalize", heur.finalize)
            res = run(
                "engineheur.get",
                heur.get,
                "ENGINEHEUR_RESULTS",
                "BACKEND_DESCRIPTOR",
                descriptor_type="enginecfg",
            )
            for d in res or ():
                d.close()
    finally:
        for d in reversed(pool):
            d.close()


@SETTINGS
@given(data=st.data())
def fuzz_backend_engine_chain(data):
    """graph -> engine -> engine config -> execution plan, each step finalized or not, inputs
    closed at random; finalize every link (stub libcuda: no device, so engines fail late)."""
    made: list[Any] = []

    def keep(d):
        made.append(d)
        return d

    try:
        x = keep(BackendDescriptor.tensor((1, 8, 4, 4), uid=1))
        y = keep(BackendDescriptor.tensor((1, 8, 4, 4), uid=2))
        pw = keep(BackendDescriptor.pointwise("relu_fwd"))
        op = keep(BackendDescriptor.operation_pointwise(pw, x, y))
        g = keep(BackendDescriptor.operation_graph([op]))
        chain = [g]
        for kind, attr, extra in (
            ("engine", "ENGINE_OPERATION_GRAPH", ("ENGINE_GLOBAL_INDEX", "INT64", 0)),
            ("enginecfg", "ENGINECFG_ENGINE", None),
            ("execution_plan", "EXECUTION_PLAN_ENGINE_CONFIG", None),
        ):
            d = keep(BackendDescriptor(kind))
            if data.draw(st.integers(0, 4)):  # usually wire the previous link
                run(f"{kind}.set", d.set, attr, "BACKEND_DESCRIPTOR", chain[-1])
            if extra and data.draw(st.booleans()):
                run(f"{kind}.set", d.set, *extra)
            if data.draw(st.integers(0, 3)) == 0:
                victim = data.draw(st.sampled_from(made[:-1]))
                victim.close()  # a link below is closed: its destroy waits for d
            if data.draw(st.booleans()):
                run(f"{kind}.finalize", d.finalize)
            chain.append(d)
        for d in chain[1:]:
            if not d.closed and d.is_finalized:
                got = run(
                    "chain.get",
                    d.get,
                    data.draw(st.sampled_from(list(A))),
                    data.draw(st.sampled_from(list(T))),
                    data.draw(st.sampled_from([1, 4])),
                    descriptor_type=data.draw(st.sampled_from(USABLE_TYPES)),
                )
                for v in got or ():
                    if isinstance(v, BackendDescriptor):
                        v.close()
    finally:
        for d in made:
            d.close()


# -- arguments -------------------------------------------------------------------------------------
class HasPtr:
    ptr = 0x1234


NOT_HANDLES = [
    TensorDescriptor((1, 2, 3)),
    HasPtr(),
    0x1234,
    "handle",
    b"h",
    1.5,
    object(),
    DeviceArray.from_ptr(1 << 40, (4,), "float32", check=False),
    BackendDescriptor("tensor"),
]


@SETTINGS
@given(data=st.data())
def fuzz_handle_arguments(data):
    bad = data.draw(st.sampled_from(NOT_HANDLES))
    rnn = RNNDescriptor(8)
    x = RNNDataDescriptor([2, 1], 8)
    call = data.draw(st.sampled_from(["states_size", "weight", "temp", "read", "ctor", "graph"]))
    fn = {
        "states_size": lambda: DropoutDescriptor.states_size(bad),
        "weight": lambda: rnn.weight_space_size(bad),
        "temp": lambda: rnn.temp_space_sizes(bad, x),
        "read": lambda: DropoutDescriptor().read(bad),
        "ctor": lambda: DropoutDescriptor(bad, 0.0),
        "graph": lambda: BackendDescriptor.operation_graph(
            [BackendDescriptor("operation_pointwise")], bad, finalize=False
        ),
    }[call]
    run(f"handle[{call}]", fn, invalid=True, what=bad)
    rnn.close()
    x.close()


GOOD_DTYPES = [
    "float32",
    "float16",
    "float64",
    np.float32,
    np.dtype("float16"),
    enums.DataType.FLOAT,
    enums.DataType.HALF,
    0,
    "half",
]
BAD_DTYPES = [
    None,
    True,
    False,
    enums.ActivationMode.RELU,
    enums.TensorFormat.NHWC,
    enums.Status.BAD_PARAM,
    enums.PoolingMode.MAX,
    1.0,
    "float128",
    "complex64",
    object(),
    [None],
]


@SETTINGS
@given(data=st.data())
def fuzz_dtype_arguments(data):
    good = data.draw(st.booleans())
    dtype = data.draw(st.sampled_from(GOOD_DTYPES if good else BAD_DTYPES))
    where = data.draw(st.sampled_from(["tensor", "filter", "rnn", "backend", "codec", "memory"]))
    fn = {
        "tensor": lambda: TensorDescriptor((1, 2, 3), dtype),
        "filter": lambda: FilterDescriptor((1, 2, 3), dtype),
        "rnn": lambda: RNNDescriptor(8, dtype=dtype),
        "backend": lambda: BackendDescriptor.tensor((1, 2), dtype=dtype, uid=1, finalize=False),
        "codec": lambda: BackendDescriptor("tensor").set("TENSOR_DATA_TYPE", "DATA_TYPE", dtype),
        "memory": lambda: pycudnn.memory.array.checked_dtype(dtype),
    }[where]
    result = run(f"dtype[{where}]", fn, invalid=not good, what=dtype)
    if isinstance(result, _resource.Resource):
        if where in ("tensor", "filter") and result.dtype not in (
            enums.DataType.FLOAT,
            enums.DataType.HALF,
            enums.DataType.DOUBLE,
        ):
            WRONG.append(f"dtype {dtype!r} became {result.dtype!r}")
        result.close()


spatial_values = st.one_of(
    st.integers(-1, 4),
    st.lists(st.integers(-1, 4), min_size=0, max_size=7),
    st.tuples(),
    junk,
)


@SETTINGS
@given(pad=spatial_values, stride=spatial_values, window=spatial_values)
def fuzz_spatial(pad, stride, window):
    def empty(v):
        return isinstance(v, list | tuple) and len(v) == 0

    c = run(
        "ConvolutionDescriptor(spatial)",
        ConvolutionDescriptor,
        pad,
        stride,
        invalid=True if empty(pad) or empty(stride) else None,
    )
    if c is not None:
        if len(c.pad) < 1:
            WRONG.append(f"ConvolutionDescriptor({pad!r}, {stride!r}) has {c.ndim} dims")
        c.close()
    p = run(
        "PoolingDescriptor(spatial)",
        PoolingDescriptor,
        window,
        None,
        pad,
        invalid=True if empty(window) or empty(pad) else None,
    )
    if p is not None:
        p.close()


OPAQUE_FUNCTIONS = sorted(
    n
    for n, (restype, argtypes, _w, _dep) in pycudnn.lib.PROTOTYPES.items()
    if any(errors._opaque(t) for t in argtypes) and pycudnn.lib.has(n)
)
API_JUNK = [
    b"x" * 32,
    "x" * 32,
    bytearray(32),
    memoryview(b"x" * 32),
    1.5,
    {"a": 1},
    object(),
    FilterDescriptor((1, 2, 3)),
    BackendDescriptor("tensor"),
    ConvolutionDescriptor(1),
]


@SETTINGS
@given(data=st.data())
def fuzz_api_guard(data):
    """api.* with junk in every argument (never an int: raw addresses are the raw contract)."""
    name = data.draw(st.sampled_from(OPAQUE_FUNCTIONS))
    argtypes = pycudnn.lib.PROTOTYPES[name][1]
    closed = TensorDescriptor((1, 1, 1))
    closed.close()
    args = []
    for t in argtypes:
        pick = data.draw(st.sampled_from([*API_JUNK, closed]))
        # an object of the parameter's own family would be valid: replace it by a str
        if errors._opaque(t) and isinstance(pick, _resource.Resource) and pick._c_type is t:
            pick = "x"
        args.append(pick)
    if data.draw(st.integers(0, 9)) == 0:  # a wrong argument count
        args = args[:-1] if args else [1]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", errors.CudnnDeprecationWarning)
        run("api.*(junk)", getattr(api, name), *args, invalid=True, what=(name, args))


# -- interop ---------------------------------------------------------------------------------------
ADDR = 0x7F00_0000_0000
I64 = 2**63 - 1
SUPPORTED = {"float32", "float64", "float16", "int8", "uint8", "int32", "int64", "bool"}


def cai_oracle(cai: Any) -> bool:
    """Is this __cuda_array_interface__ record valid? (An independent reading of the spec.)"""

    def is_int(v):
        return isinstance(v, int | np.integer) and not isinstance(v, bool | np.bool_)

    if not isinstance(cai, dict) or not {"shape", "typestr", "data", "version"} <= cai.keys():
        return False
    if not is_int(cai["version"]) or cai["version"] not in (2, 3):
        return False
    if cai.get("mask") is not None:
        return False
    shape = cai["shape"]
    if not isinstance(shape, tuple | list) or len(shape) > 64:
        return False
    if not all(is_int(n) and 0 <= n <= I64 for n in shape):
        return False
    if not isinstance(cai["typestr"], str):
        return False
    try:
        dt = np.dtype(cai["typestr"])
    except (TypeError, ValueError):
        return False
    if dt.kind == "V" or dt.byteorder == ">" or dt.name not in SUPPORTED:
        return False
    item = dt.itemsize
    data = cai["data"]
    if not isinstance(data, tuple | list) or len(data) != 2:
        return False
    ptr, ro = data
    if ptr is not None and not (is_int(ptr) and 0 <= ptr < 2**64):
        return False
    if not isinstance(ro, bool | np.bool_):
        return False
    ptr = int(ptr or 0)
    strides = cai.get("strides")
    if strides is None:
        strides, acc = [], item
        for n in reversed(shape):
            strides.insert(0, acc)
            acc *= max(int(n), 1)
    if not isinstance(strides, tuple | list) or len(strides) != len(shape):
        return False
    if not all(is_int(s) and -I64 <= s <= I64 and s % item == 0 for s in strides):
        return False
    size = math.prod(int(n) for n in shape)
    if size * item > I64:
        return False
    if size:
        if ptr == 0:
            return False
        lo = sum(int(s) * (int(n) - 1) for n, s in zip(shape, strides, strict=True) if s < 0)
        hi = sum(int(s) * (int(n) - 1) for n, s in zip(shape, strides, strict=True) if s > 0)
        if ptr + lo < 0 or ptr + hi + item > 2**64:
            return False
    if cai["version"] == 3 and cai.get("stream") is not None:
        s = cai["stream"]
        if not is_int(s) or not 0 < s < 2**64:
            return False
    return True


cai_values = {
    "shape": st.one_of(
        st.lists(st.integers(0, 5), max_size=4).map(tuple),
        st.lists(st.integers(-2, 2**63 + 1), max_size=3).map(tuple),
        st.just((2**40, 2**40)),
        junk,
    ),
    "typestr": st.one_of(
        st.sampled_from(["<f4", "<f2", "|u1", "<i4", "<f8", ">f4", "<V2", "<c8"]), junk
    ),
    "data": st.one_of(
        st.tuples(st.sampled_from([ADDR, 0, None, -1, 2**64, 2**64 - 8, 16]), st.booleans()),
        st.tuples(junk, junk),
        junk,
    ),
    "version": st.one_of(st.sampled_from([2, 3, 1, 99, "3", True]), junk),
    "strides": st.one_of(
        st.none(),
        st.lists(st.sampled_from([4, 8, 2, -4, 0, 6, 2**64, 12.0]), max_size=4).map(tuple),
        junk,
    ),
    "stream": st.one_of(st.sampled_from([None, 1, 2, 0, -1, 2**64, True]), junk),
    "mask": st.sampled_from([None, None, None, object()]),
}


class CAI:
    def __init__(self, cai):
        self.__cuda_array_interface__ = cai


@SETTINGS
@given(data=st.data())
def fuzz_cai(data):
    cai = {
        "shape": (2, 3),
        "typestr": "<f4",
        "data": (ADDR, False),
        "version": 3,
        "strides": None,
        "stream": None,
    }
    for key in data.draw(st.lists(st.sampled_from(sorted(cai_values)), max_size=3)):
        cai[key] = data.draw(cai_values[key])
    if data.draw(st.integers(0, 19)) == 0:
        cai.pop(data.draw(st.sampled_from(sorted(cai))))
    if data.draw(st.integers(0, 29)) == 0:
        cai = data.draw(st.sampled_from([list(cai.items()), None, "cai", 3]))
    ok = cai_oracle(cai)
    # (a producer stream other than ours needs a GPU to wait on: CudaUnavailableError here)
    a = run(
        "asarray(CAI, check=False)",
        pycudnn.asarray,
        CAI(cai),
        check=False,
        device=0,
        invalid=not ok,
        what=cai,
        extra=(errors.CudaUnavailableError,),
    )
    if a is not None:
        if a.shape != tuple(int(n) for n in cai["shape"]) or a.ptr != int(cai["data"][0] or 0):
            WRONG.append(f"CAI {cai!r:.200} gave {a!r}")
        if a.readonly != bool(cai["data"][1]) or a.dtype != np.dtype(cai["typestr"]):
            WRONG.append(f"CAI {cai!r:.200} gave readonly={a.readonly} dtype={a.dtype}")


# our own prototypes: ctypes.pythonapi's function objects are shared, and jax.ffi.pycapsule
# sets PyCapsule_New's argument types on the shared one
_New = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi)
)


@SETTINGS
@given(data=st.data())
def fuzz_dlpack_import(data):
    shape = data.draw(
        st.lists(st.integers(-2, 6) | st.sampled_from([2**62, 2**63 - 1]), max_size=5)
    )
    n = max(len(shape), 1)
    ndim = data.draw(st.sampled_from([len(shape)] * 6 + [-1, 65, 1000, 2**31 - 1]))
    if 0 <= ndim <= 64 and ndim > len(shape):
        ndim = len(shape)  # a lie within bounds would read past our array: not a refusable case
    strides = data.draw(
        st.none() | st.lists(st.integers(-8, 8) | st.just(2**62), min_size=n, max_size=n)
    )
    ptr = data.draw(st.sampled_from([ADDR, 0, 8, 2**64 - 8, 2**64 - 1]))
    offset = data.draw(st.sampled_from([0, 0, 16, 2**63, 2**64 - 1]))
    code, bits = data.draw(
        st.sampled_from([(2, 32), (2, 16), (4, 16), (0, 8), (1, 8), (5, 64), (2, 128), (6, 8)])
    )
    lanes = data.draw(st.sampled_from([1, 1, 1, 2]))
    dev = data.draw(st.sampled_from([(2, 0), (2, 1), (2, -1), (1, 0), (13, 0)]))
    versioned = data.draw(st.booleans())
    shape_arr = (ctypes.c_int64 * n)(*shape)
    strides_arr = None if strides is None else (ctypes.c_int64 * n)(*strides)
    managed: Any = _dlpack.DLManagedTensorVersioned() if versioned else _dlpack.DLManagedTensor()
    if versioned:
        managed.version = _dlpack.DLPackVersion(
            *data.draw(st.sampled_from([(1, 0), (1, 1), (2, 0)]))
        )
    t = managed.dl_tensor
    t.data, t.byte_offset, t.ndim = ptr or None, offset, ndim
    t.dtype = _dlpack.DLDataType(code, bits, lanes)
    t.device = _dlpack.DLDevice(*dev)
    i64p = ctypes.POINTER(ctypes.c_int64)
    t.shape = ctypes.cast(shape_arr, i64p)
    t.strides = i64p() if strides is None else ctypes.cast(strides_arr, i64p)
    cap = _New(ctypes.addressof(managed), b"dltensor_versioned" if versioned else b"dltensor", None)
    # the oracle
    item = bits // 8
    shape = shape[: max(ndim, 0)]
    strides = strides[: len(shape)] if strides is not None else None
    bad = not 0 <= ndim <= 64 or any(s < 0 for s in shape) or lanes != 1
    bad |= (code, bits) not in ((2, 32), (2, 16), (4, 16), (0, 8), (1, 8), (6, 8))
    bad |= versioned and managed.version.major > 1
    bad |= dev[1] < 0 or ptr + offset >= 2**64
    size = math.prod(shape) if not bad else 0
    bad |= size * max(item, 1) > I64
    if not bad and size:
        bad |= ptr == 0
        st_b = [s * item for s in strides] if strides is not None else None
        if st_b is None:
            lo, hi = 0, (size - 1) * item
        else:
            lo = sum(s * (k - 1) for k, s in zip(shape, st_b, strict=True) if s < 0)
            hi = sum(s * (k - 1) for k, s in zip(shape, st_b, strict=True) if s > 0)
        bad |= ptr + offset + lo < 0 or ptr + offset + hi + item > 2**64
    what = dict(
        shape=shape,
        ndim=ndim,
        strides=strides,
        ptr=ptr,
        offset=offset,
        dtype=(code, bits),
        lanes=lanes,
        device=dev,
        versioned=versioned,
    )
    imported = run(
        "_dlpack.from_dlpack(capsule)",
        _dlpack.from_dlpack,
        cap,
        stream=None,
        invalid=bad,
        what=what,
    )
    if imported is not None:
        if imported.shape != tuple(shape) or imported.data != ptr + offset:
            WRONG.append(f"capsule shape={shape} ptr={ptr} offset={offset} gave {imported!r:.200}")
        imported.owner = None


@SETTINGS
@given(
    ptr=st.sampled_from([ADDR, 0, -8, 2**64, 2**64 - 8]),
    shape=st.lists(st.sampled_from([0, 1, 3, 2**31, 2**63, 2**63 - 1]), max_size=4),
    stride_scale=st.sampled_from([1, 2, -1, 2**66]),
    dtype=st.sampled_from(["float32", "float16", "uint8"]),
)
def fuzz_dlpack_export(ptr, shape, stride_scale, dtype):
    dt = np.dtype(dtype)
    strides = tuple(dt.itemsize * stride_scale for _ in shape)
    a = DeviceArray(ptr, tuple(shape), dt, strides, 0, 0, None)
    size = math.prod(shape)
    bad = not 0 <= ptr < 2**64 or any(n > I64 for n in shape)
    if size and not a.is_c_contiguous:  # (an empty or C-contiguous array exports no strides)
        bad |= any(not -I64 <= s // dt.itemsize <= I64 for s in strides)
    bad |= size * dt.itemsize > I64 or (size > 0 and ptr == 0)
    if not bad and size:
        lo = sum(s * (n - 1) for n, s in zip(shape, strides, strict=True) if s < 0)
        hi = sum(s * (n - 1) for n, s in zip(shape, strides, strict=True) if s > 0)
        bad |= ptr + lo < 0 or ptr + hi + dt.itemsize > 2**64
    cap = run("DeviceArray.__dlpack__", a.__dlpack__, stream=-1, invalid=bad, what=a)
    if cap is not None:
        back = _dlpack.from_dlpack(cap, stream=None) if not bad else None
        if back is not None and (back.shape != a.shape or back.data != a.ptr):
            WRONG.append(f"export of {a!r} read back as {back!r:.200}")


# -- config ----------------------------------------------------------------------------------------
FLAG_VALUES = st.one_of(
    st.sampled_from(
        [
            "guess_once",
            "time_once",
            "small",
            "none",
            "fft",
            "as_input",
            "float32",
            "1",
            "0",
            "yes",
            "off",
            "512MiB",
            "2G",
            "1.5K",
            "none",
            "",
            "bogus",
        ]
    ),
    st.integers(-3, 2**40),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=False),  # inf: see test_config_infinite_workspace
    st.none(),
    st.text(max_size=10),
)
FLAG_NAMES = [*Flags._fields, "algo", "verbos", "version"]


@SETTINGS
@given(name=st.sampled_from(FLAG_NAMES), value=FLAG_VALUES)
def fuzz_config_assign(name, value):
    cfg = pycudnn.config

    def assign():
        setattr(cfg, name, value)
        return getattr(cfg, name)

    got = run("config.<flag> = value", assign, extra=(AttributeError,))
    if got is not None or name in Flags._fields:
        try:
            again = getattr(cfg, name)
            setattr(cfg, name, again)  # the canonical value is accepted back, unchanged
            if getattr(cfg, name) != again:
                WRONG.append(f"config.{name}: {again!r} did not round-trip")
        except (AttributeError, ValueError) as exc:
            if got is not None:
                WRONG.append(f"config.{name}: canonical value refused: {exc}")
    cfg.reset()


@SETTINGS
@given(
    items=st.lists(st.tuples(st.sampled_from(FLAG_NAMES), FLAG_VALUES.map(str)), max_size=4),
    sep=st.sampled_from([",", ", ", ";", ",,"]),
)
def fuzz_config_env(items, sep):
    text = sep.join(f"{k}={v}" for k, v in items).replace("\x00", "")  # (os.environ refuses NUL)
    os.environ["PYCUDNN_FLAGS"] = text
    pycudnn.config.reset()
    run("PYCUDNN_FLAGS", pycudnn.config.snapshot)
    os.environ.pop("PYCUDNN_FLAGS", None)
    pycudnn.config.reset()
    with_override = dict(items[:2])
    run(
        "config.override",
        lambda: pycudnn.config.override(**with_override).__enter__(),
        extra=(AttributeError,),
    )
    pycudnn.config.reset()


GROUPS = {
    "backend": [fuzz_backend_set, fuzz_backend_graph, fuzz_backend_engine_chain],
    "arguments": [fuzz_handle_arguments, fuzz_dtype_arguments, fuzz_spatial, fuzz_api_guard],
    "interop": [fuzz_cai, fuzz_dlpack_import, fuzz_dlpack_export],
    "config": [fuzz_config_assign, fuzz_config_env],
}


def main() -> int:
    group = sys.argv[1]
    for fuzz in GROUPS[group]:
        fuzz()
    import gc

    for d in (*NOT_HANDLES, *API_JUNK):  # module-level test objects
        if isinstance(d, _resource.Resource):
            d.close()
    gc.collect()
    print(
        json.dumps(
            {
                "group": group,
                "cases": sum(CASES.values()),
                "per_target": dict(CASES),
                "outcomes": dict(OUTCOMES),
                "silent_accepts": SILENT[:20],
                "n_silent_accepts": len(SILENT),
                "false_refusals": FALSE[:20],
                "n_false_refusals": len(FALSE),
                "wrong_results": WRONG[:20],
                "n_wrong_results": len(WRONG),
                "live": _resource.live_counts(),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
