"""CPU tests of the transformer operations' validation: ``dnn_matmul``, ``dnn_layer_norm`` /
``dnn_rms_norm`` and their gradients, ``dnn_sdpa`` / ``dnn_sdpa_grad`` (no GPU).

Every bad argument raises the right exception type, with a message naming the function and the
argument, before any C call: the fake operands (``_fake_device.Fake``) carry an address, shape,
strides, dtype and device; every way into CUDA/cuDNN raises ``CCall`` (a ``BaseException``, so
``pytest.raises(ValueError)`` cannot swallow it), and so do the graph's ``build`` and the call
entry (``_graphops.entry``). A valid baseline of each catalogue reaches the entry, which shows
the bad cases were refused by validation and not by something else.
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

F16, BF16, F32, F64 = DataType.HALF, DataType.BFLOAT16, DataType.FLOAT, DataType.DOUBLE
I32, I64 = DataType.INT32, DataType.INT64
no_c = fd.no_c


@pytest.fixture
def guarded(no_c, monkeypatch):
    """No C call, no graph build, no call entry; an sm90 device."""

    def boom(*args, **kwargs):
        raise CCall("reached the graph build / call entry")

    monkeypatch.setattr(_graphops, "entry", boom)
    monkeypatch.setattr(Graph, "build", boom)
    monkeypatch.setattr(_graphops, "capability", lambda device: (9, 0))
    yield


def _raises(exc, fragments, fn, *args, **kwargs):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    msg = str(info.value)
    for f in (fragments,) if isinstance(fragments, str) else fragments:
        assert f in msg, f"{f!r} not in {msg!r}"
    return info.value


# ==================================================================================================
# dnn_matmul
# ==================================================================================================
def _mm(a=None, b=None, **kw):
    return pycudnn.dnn_matmul(
        Fake((4, 5)) if a is None else a, Fake((5, 7)) if b is None else b, **kw
    )


MATMUL_BAD = [
    (dict(a=np.zeros((4, 5), np.float32)), TypeError, "host"),
    (dict(a=[[1.0]]), TypeError, "expected a device array"),
    (dict(b=Fake((5, 7), F16)), TypeError, ("dnn_matmul", "a is float32 but b is float16")),
    (
        dict(a=Fake((4, 5), F64), b=Fake((5, 7), F64)),
        TypeError,
        ("dnn_matmul", "a has an unsupported dtype"),
    ),
    (dict(a=Fake((4, 5), I32), b=Fake((5, 7), I32)), TypeError, "unsupported dtype"),
    (dict(b=Fake((5, 7), device=1)), ValueError, ("dnn_matmul", "device")),
    (dict(a=Fake((5,))), ValueError, ("dnn_matmul", "need at least 2 dims")),
    (
        dict(b=Fake((6, 7))),
        ValueError,
        ("dnn_matmul", "a's last dim (5) must equal b's second to last (6)"),
    ),
    (
        dict(a=Fake((2, 4, 5)), b=Fake((3, 5, 7))),
        ValueError,
        ("dnn_matmul", "batch dim 0", "does not broadcast (2 vs 3)"),
    ),
    (dict(a=Fake((2, 3, 4, 5)), b=Fake((2, 2, 5, 7))), ValueError, "batch dim 1"),
    (dict(a=Fake((4, 5), strides=(5, -1))), ValueError, ("dnn_matmul", "a has a negative stride")),
    (dict(b=Fake((5, 7), strides=(0, 1))), ValueError, ("b has a zero (broadcast) stride")),
    (dict(a=Fake((4, 5), ptr=(1 << 32) + 2)), ValueError, "a's address"),
    (dict(a=Fake((0, 5))), ValueError, ("dnn_matmul", "empty operands")),
    (dict(bias=Fake((5,))), ValueError, ("dnn_matmul", "bias has shape (5,); expected (7,)")),
    (dict(bias=Fake((2, 7))), ValueError, "bias has shape (2, 7)"),
    (dict(bias=Fake((7,), F16)), TypeError, "bias is float16"),
    (dict(bias=Fake((7,), device=1)), ValueError, "bias on device 1"),
    (dict(bias=np.zeros(7, np.float32)), TypeError, "host"),
    (dict(activation="relu6"), ValueError, ("dnn_matmul", "activation='relu6' is not one of")),
    (dict(activation=3), ValueError, "activation=3"),
    (dict(activation="clipped_relu"), ValueError, "needs its upper clip"),
    (dict(activation=("clipped_relu", 6.0)), pycudnn.NotSupportedError, "ignore the upper clip"),
    (dict(activation=("relu", 1.0)), ValueError, "takes no parameter"),
    (dict(out=Fake((4, 6))), ValueError, ("dnn_matmul", "out has shape (4, 6), expected (4, 7)")),
    (dict(out=Fake((4, 7), F16)), TypeError, ("dnn_matmul", "out is float16, expected float32")),
    (dict(out=Fake((4, 7), device=1)), ValueError, "out is on device 1"),
    (dict(out=Fake((4, 7), strides=(0, 1))), ValueError, "make elements overlap"),
    (dict(a=Fake((3, 4, 5)), out=Fake((4, 7))), ValueError, "expected (3, 4, 7)"),
]


@pytest.mark.parametrize(("kwargs", "exc", "fragments"), MATMUL_BAD)
def test_matmul_rejects_before_any_c_call(guarded, kwargs, exc, fragments):
    with pycudnn.config.override(allow_tf32=True):  # the fakes are float32 (TF32 engines)
        _raises(exc, fragments, _mm, **kwargs)


def test_float32_matmul_needs_allow_tf32(guarded):
    """cuDNN's float32 matmul engines are TF32 (measured, 9.19 on an H100): refused unless the
    config allows TF32, before any C call, naming the setting."""
    with pycudnn.config.override(allow_tf32=False):
        _raises(pycudnn.NotSupportedError, ["allow_tf32", "float16/bfloat16"], _mm)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        dict(a=Fake((2, 4, 5)), b=Fake((1, 5, 7))),
        dict(a=Fake((3, 1, 4, 5)), b=Fake((1, 5, 7))),
        dict(b=Fake((5, 7), strides=(1, 5))),  # a transposed operand
        dict(bias=Fake((7,)), activation="gelu"),
        dict(bias=Fake((1, 1, 7)), activation=("clipped_relu", 6.0)),
        dict(activation=("elu", 0.5), out=Fake((4, 7), strides=(8, 1))),
        dict(a=Fake((4, 5), BF16), b=Fake((5, 7), BF16), bias=Fake((7,), BF16)),
    ],
)
def test_matmul_valid_calls_reach_the_graph(guarded, kwargs):
    with pycudnn.config.override(allow_tf32=True), pytest.raises(CCall):
        _mm(**kwargs)


# ==================================================================================================
# dnn_layer_norm / dnn_rms_norm
# ==================================================================================================
X = (4, 6, 64)


def _ln(x=None, ns=64, **kw):
    return pycudnn.dnn_layer_norm(Fake(X) if x is None else x, ns, **kw)


def _rms(x=None, ns=64, **kw):
    return pycudnn.dnn_rms_norm(Fake(X) if x is None else x, ns, **kw)


NORM_BAD = [
    (dict(ns=32), ValueError, "normalized_shape (32,) must be the trailing dims of x's shape"),
    (dict(ns=(4, 64)), ValueError, "normalized_shape (4, 64) must be the trailing dims"),
    (dict(ns=(6, 64, 1)), ValueError, "must be the trailing dims"),
    (dict(ns=()), ValueError, "must be the trailing dims"),
    (dict(ns=X), ValueError, "covers every dim of x"),
    (dict(ns="64"), TypeError, "normalized_shape must be an int or a tuple of ints"),
    (dict(x=np.zeros(X, np.float32)), TypeError, "host"),
    (dict(x=Fake(X, F64)), TypeError, "x has an unsupported dtype"),
    (dict(x=Fake(X, strides=(384, 64, -1))), ValueError, "x has a negative stride"),
    (dict(x=Fake((0, 6, 64))), ValueError, "x has an empty dim"),
    (dict(gamma=Fake((32,))), ValueError, "gamma has shape (32,), expected normalized_shape (64,)"),
    (dict(gamma=Fake((1, 64))), ValueError, "gamma has shape (1, 64)"),
    (dict(gamma=Fake((64,), F64)), TypeError, "gamma has an unsupported dtype"),
    (dict(gamma=Fake((64,), strides=(2,))), ValueError, "gamma must be contiguous"),
    (dict(gamma=Fake((64,), device=1)), ValueError, "gamma is on device 1, x on device 0"),
    (dict(epsilon=0.0), ValueError, "epsilon=0.0 is out of range; expected a value in (0.0, inf]"),
    (dict(epsilon=-1e-5), ValueError, "epsilon=-1e-05 is out of range"),
    (dict(epsilon=float("nan")), ValueError, "epsilon must be finite"),
    (dict(epsilon="1e-5"), TypeError, "epsilon must be a real number"),
    # (gamma given: without one, a cached stand-in of ones is allocated before out is checked)
    (
        dict(out=Fake((4, 6, 63)), gamma=Fake((64,))),
        ValueError,
        "out has shape (4, 6, 63), expected (4, 6, 64)",
    ),
    (dict(out=Fake(X, F16), gamma=Fake((64,))), TypeError, "out is float16, expected float32"),
    (
        dict(out=Fake(X, strides=(1, 4, 24)), gamma=Fake((64,))),
        ValueError,
        "out must be packed",
    ),
]


@pytest.mark.parametrize(("kwargs", "exc", "fragment"), NORM_BAD)
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_norm_forward_rejects_before_any_c_call(guarded, kwargs, exc, fragment, rms):
    func = "dnn_rms_norm" if rms else "dnn_layer_norm"
    if not rms and "out" in kwargs:
        kwargs = {**kwargs, "beta": Fake((64,))}
    # a host array is refused while the call is keyed, by a message of its own
    _raises(
        exc, fragment if fragment == "host" else (func, fragment), _rms if rms else _ln, **kwargs
    )


def test_norm_normalized_shape_of_the_wrong_type_is_a_type_error(guarded):
    with pytest.raises(TypeError):
        _ln(ns=64.0)


def test_norm_normalized_shape_type_error_names_the_argument(guarded):
    _raises(TypeError, ("dnn_layer_norm", "normalized_shape"), _ln, ns=64.0)


def test_norm_out_is_validated_before_the_stand_in_gamma_is_allocated(guarded):
    _raises(ValueError, "out has shape", _ln, out=Fake((4, 6, 63)))


def test_layer_norm_beta_checks(guarded):
    _raises(ValueError, ("dnn_layer_norm", "beta has shape (63,)"), _ln, beta=Fake((63,)))
    _raises(ValueError, "beta is on device 1", _ln, beta=Fake((64,), device=1))
    _raises(TypeError, "beta has an unsupported dtype", _ln, beta=Fake((64,), I32))


def test_rms_norm_takes_no_beta(guarded):
    with pytest.raises(TypeError, match="beta"):
        pycudnn.dnn_rms_norm(Fake(X), 64, beta=Fake((64,)))


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        dict(ns=(6, 64)),
        dict(gamma=Fake((64,)), beta=Fake((64,))),
        dict(gamma=Fake((64,), F32), x=Fake(X, BF16)),  # float32 parameters of bf16 data
        dict(x=Fake(X, strides=(1000, 100, 1))),  # row pitch: as is
        dict(x=Fake(X, strides=(1, 4, 24))),  # staged through a packed copy
        dict(training=False, out=Fake(X)),
        dict(epsilon=1),
    ],
)
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_norm_forward_valid_calls_reach_the_graph(guarded, kwargs, rms):
    if rms:
        kwargs = {k: v for k, v in kwargs.items() if k != "beta"}
    with pytest.raises(CCall):
        (_rms if rms else _ln)(**kwargs)


STAT = (4, 6, 1)


def _ln_grad(dy=None, x=None, mean="ok", inv=None, ns=64, gamma=None, **kw):
    return pycudnn.dnn_layer_norm_grad(
        Fake(X) if dy is None else dy,
        Fake(X) if x is None else x,
        Fake(STAT) if mean == "ok" else mean,
        Fake(STAT) if inv is None else inv,
        ns,
        gamma,
        **kw,
    )


def _rms_grad(dy=None, x=None, mean=None, inv=None, ns=64, gamma=None, **kw):
    return pycudnn.dnn_rms_norm_grad(
        Fake(X) if dy is None else dy,
        Fake(X) if x is None else x,
        Fake(STAT) if inv is None else inv,
        ns,
        gamma,
        **kw,
    )


NORM_GRAD_BAD = [
    (dict(dy=Fake((4, 6, 32))), ValueError, "dy has shape (4, 6, 32), x (4, 6, 64)"),
    (dict(dy=Fake(X, F16)), TypeError, "dy is float16 but x is float32"),
    (dict(x=Fake(X, device=1)), ValueError, "device"),
    (dict(ns=32), ValueError, "normalized_shape (32,) must be the trailing dims"),
    (
        dict(inv=Fake(STAT, F16)),
        TypeError,
        "must be float32 (as the forward returns it), got float16",
    ),
    (dict(inv=Fake((4, 6))), ValueError, "must be a contiguous float32 array of shape (4, 6, 1)"),
    (dict(inv=Fake(STAT, strides=(1, 4, 1))), ValueError, "must be a contiguous float32 array"),
    (dict(inv=Fake(STAT, device=1)), ValueError, "is on device 1, x on device 0"),
    (dict(gamma=Fake((63,))), ValueError, "gamma has shape (63,), expected normalized_shape"),
    (dict(gamma=Fake((64,), strides=(2,))), ValueError, "gamma must be contiguous"),
]


@pytest.mark.parametrize(("kwargs", "exc", "fragment"), NORM_GRAD_BAD)
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_norm_backward_rejects_before_any_c_call(guarded, kwargs, exc, fragment, rms):
    func = "dnn_rms_norm_grad" if rms else "dnn_layer_norm_grad"
    e = _raises(exc, (func, fragment), _rms_grad if rms else _ln_grad, **kwargs)
    if "inv" in kwargs:
        assert ("inv_rms" if rms else "inv_std") in str(e)


def test_layer_norm_grad_mean_checks(guarded):
    _raises(TypeError, ("dnn_layer_norm_grad", "mean is required"), _ln_grad, mean=None)
    _raises(TypeError, "mean must be float32", _ln_grad, mean=Fake(STAT, BF16))
    _raises(
        ValueError,
        "mean must be a contiguous float32 array of shape (4, 6, 1)",
        _ln_grad,
        mean=Fake((4, 6, 2)),
    )


@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_norm_backward_valid_calls_reach_the_graph(guarded, rms):
    for kw in (
        {},
        dict(gamma=Fake((64,))),
        dict(ns=(6, 64), inv=Fake((4, 1, 1)), mean=Fake((4, 1, 1))),
    ):
        if rms:
            kw.pop("mean", None)
        with pytest.raises(CCall):
            (_rms_grad if rms else _ln_grad)(**kw)


def _stats_kw(rms, *arrays):
    names = ("out_invrms",) if rms else ("out_mean", "out_invstd")
    return dict(zip(names, arrays, strict=False))


NORM_STATS_BAD = [
    (dict(training=False), ValueError, "written only with training=True"),
    (dict(dt=F16), TypeError, "is float16, expected float32"),
    (dict(shape=(4, 6)), ValueError, "has shape (4, 6), expected (4, 6, 1)"),
    (dict(strides=(1, 4, 1)), ValueError, "must be contiguous (4, 6, 1)"),
    (dict(device=1), ValueError, "is on device 1"),
]


@pytest.mark.parametrize(("bad", "exc", "fragment"), NORM_STATS_BAD)
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_norm_given_statistics_are_checked_by_name(guarded, bad, exc, fragment, rms):
    """``out_mean`` / ``out_invstd`` / ``out_invrms``: float32, the statistics' shape,
    contiguous, on x's device, and only when training."""
    bad = dict(bad)
    training = bad.pop("training", True)
    shape = bad.pop("shape", STAT)
    stat = Fake(shape, bad.pop("dt", F32), **bad)
    kw = _stats_kw(rms, stat, Fake(STAT)) if not rms else _stats_kw(rms, stat)
    func, call = ("dnn_rms_norm", _rms) if rms else ("dnn_layer_norm", _ln)
    e = _raises(exc, (func, fragment), call, gamma=Fake((64,)), training=training, **kw)
    if "training" not in fragment:
        assert ("out_invrms" if rms else "out_mean") in str(e)


@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_norm_given_statistics_reach_the_graph(guarded, rms):
    kw = _stats_kw(rms, Fake(STAT), Fake(STAT))
    with pytest.raises(CCall):
        (_rms if rms else _ln)(gamma=Fake((64,)), out=Fake(X), **kw)


def _grads(rms, dx=None, dg=None, db=None):
    out = (Fake(X) if dx is None else dx, Fake((64,)) if dg is None else dg)
    return out if rms else (*out, Fake((64,)) if db is None else db)


NORM_GRADS_BAD = [
    (dict(out_grads=Fake(X)), TypeError, "out_grads must be None or (dx, dgamma"),
    (dict(gamma=None), ValueError, "out_grads needs gamma"),
    (dict(dx=Fake((4, 6, 63))), ValueError, "out_grads[0] has shape (4, 6, 63)"),
    (dict(dx=Fake(X, F16)), TypeError, "out_grads[0] is float16, expected float32"),
    (dict(dx=Fake(X, strides=(1, 4, 24))), ValueError, "out_grads[0] must be contiguous"),
    (dict(dg=Fake((64,), BF16)), TypeError, "out_grads[1] is bfloat16, expected float32"),
    (dict(dg=Fake((64,), device=1)), ValueError, "out_grads[1] is on device 1"),
]


@pytest.mark.parametrize(("bad", "exc", "fragment"), NORM_GRADS_BAD)
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_norm_given_gradients_are_checked_by_name(guarded, bad, exc, fragment, rms):
    """``out_grads``: (dx, dgamma[, dbeta]) with gamma given, each checked by its place."""
    bad = dict(bad)
    gamma = bad.pop("gamma", Fake((64,)))
    grads = bad.pop("out_grads", None) or _grads(rms, **bad)
    func = "dnn_rms_norm_grad" if rms else "dnn_layer_norm_grad"
    _raises(exc, (func, fragment), _rms_grad if rms else _ln_grad, gamma=gamma, out_grads=grads)


@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_norm_given_gradients_reach_the_graph(guarded, rms):
    with pytest.raises(CCall):
        (_rms_grad if rms else _ln_grad)(gamma=Fake((64,)), out_grads=_grads(rms))


# ==================================================================================================
# dnn_sdpa / dnn_sdpa_grad
# ==================================================================================================
B, H, S, D = 2, 4, 64, 64


def q4(b=B, h=H, s=S, d=D, dt=BF16, **kw):
    return Fake((b, h, s, d), dt, **kw)


def _sdpa(q=None, k=None, v=None, **kw):
    return pycudnn.dnn_sdpa(
        q4() if q is None else q, q4() if k is None else k, q4() if v is None else v, **kw
    )


def lens(n=B, dt=I32, **kw):
    return Fake((n,), dt, **kw)


SDPA_BAD = [
    (
        dict(q=q4(dt=F32), k=q4(dt=F32), v=q4(dt=F32)),
        errors.NotSupportedError,
        ("float16 and bfloat16 only, got float32",),
    ),
    (dict(q=q4(dt=F64), k=q4(dt=F64), v=q4(dt=F64)), errors.NotSupportedError, ("float64",)),
    (dict(q=q4(dt=F16)), TypeError, ("q is float16 but k is bfloat16",)),
    (dict(q=q4(dt=I32), k=q4(dt=I32), v=q4(dt=I32)), TypeError, ("q has an unsupported dtype",)),
    (dict(q=np.zeros((B, H, S, D), np.float16)), TypeError, ("host",)),
    (
        dict(q=q4(d=12), k=q4(d=12), v=q4(d=12)),
        errors.NotSupportedError,
        ("head dims that are multiples of 8", "q/k has 12"),
    ),
    (dict(v=q4(d=20)), errors.NotSupportedError, ("multiples of 8", "v has 20")),
    (dict(q=q4(d=264), k=q4(d=264), v=q4(d=264)), errors.NotSupportedError, ("at most 256",)),
    (dict(q=Fake((B, S, D), BF16)), ValueError, ("q must have 4 dims (B, H, S, D), got shape",)),
    (dict(v=Fake((1, B, H, S, D), BF16)), ValueError, ("v must have 4 dims",)),
    (dict(k=q4(b=3), v=q4(b=3)), ValueError, ("different batch sizes",)),
    (dict(k=q4(d=32)), ValueError, ("q's head dim (64) and k's (32) differ",)),
    (dict(v=q4(s=32)), ValueError, ("must have the same batch, heads and sequence length",)),
    (dict(v=q4(h=2)), ValueError, ("must have the same batch, heads",)),
    (
        dict(k=q4(h=3), v=q4(h=3)),
        ValueError,
        ("q's heads (4) must be a multiple of k's and v's (3)", "grouped-query"),
    ),
    (dict(k=q4(h=8), v=q4(h=8)), ValueError, ("q's heads (4) must be a multiple",)),
    (dict(q=q4(s=0)), ValueError, ("q has an empty dim",)),
    (dict(k=q4(strides=(S * D * H, S * D, D, -1))), ValueError, ("k has a negative stride",)),
    (dict(v=q4(device=1)), ValueError, ("device",)),
    (dict(attn_mask=Fake((B, H, S, S), DataType.BOOLEAN)), TypeError, ("attn_mask", "-inf")),
    (dict(is_causal=2), ValueError, ("dnn_sdpa: is_causal=2 is not a boolean",)),
    (dict(is_causal="maybe"), ValueError, ("dnn_sdpa: is_causal='maybe' is not a boolean",)),
    (dict(is_causal=[True]), TypeError, ("dnn_sdpa: is_causal=[True] is not a boolean",)),
    (dict(training="sometimes"), ValueError, ("dnn_sdpa: training='sometimes'",)),
    (dict(scale="0.1"), TypeError, ("scale must be a real number",)),
    (dict(scale=float("inf")), ValueError, ("scale must be finite",)),
    (
        dict(dropout_p=1.0),
        ValueError,
        ("dropout_p=1.0 is out of range; expected a value in [0.0, 1.0)",),
    ),
    (dict(dropout_p=-0.1), ValueError, ("dropout_p=-0.1 is out of range",)),
    (dict(dropout_p="0.1"), TypeError, ("dropout_p must be a real number",)),
    (dict(dropout_p=0.1, seed=-1), ValueError, ("seed must be an int in [0, 2**63), got -1",)),
    (dict(dropout_p=0.1, seed=1.5), ValueError, ("seed must be an int",)),
    (dict(seq_lens_q=lens()), ValueError, ("give both seq_lens_q and seq_lens_kv",)),
    (dict(seq_lens_kv=lens()), ValueError, ("give both seq_lens_q and seq_lens_kv",)),
    (
        dict(seq_lens_q=lens(dt=I64), seq_lens_kv=lens()),
        TypeError,
        ("seq_lens_q must be an int32 device array of shape (2,), got int64",),
    ),
    (
        dict(seq_lens_q=lens(), seq_lens_kv=lens(dt=F32)),
        TypeError,
        ("seq_lens_kv must be an int32 device array",),
    ),
    (
        dict(seq_lens_q=lens(3), seq_lens_kv=lens(3)),
        ValueError,
        ("seq_lens_q must have shape (2,) (one length per batch), got (3,)",),
    ),
    (
        dict(seq_lens_q=lens(), seq_lens_kv=Fake((B, 1), I32)),
        ValueError,
        ("seq_lens_kv must have shape (2,)",),
    ),
    (
        dict(seq_lens_q=lens(device=1), seq_lens_kv=lens()),
        ValueError,
        ("seq_lens_q is on device 1, q on device 0",),
    ),
    (dict(seq_lens_q=np.zeros(B, np.int32), seq_lens_kv=lens()), TypeError, ("host",)),
    (dict(out=q4(s=32)), ValueError, ("out has shape (2, 4, 32, 64), expected (2, 4, 64, 64)",)),
    (dict(out=q4(dt=F16)), TypeError, ("out is float16, expected bfloat16",)),
    (
        dict(out=q4(strides=(S * D * H, 1, H, S * H))),
        ValueError,
        ("out's head dim must be contiguous (stride 1)",),
    ),
    (dict(out_stats=Fake((B, H, S, 1), F32)), ValueError, ("out_stats", "training=True")),
    (
        dict(training=True, out_stats=Fake((B, H, S, 1), F16)),
        TypeError,
        ("out_stats is float16, expected float32",),
    ),
    (
        dict(training=True, out_stats=Fake((B, H, S), F32)),
        ValueError,
        ("out_stats has shape (2, 4, 64), expected (2, 4, 64, 1)",),
    ),
    (
        dict(training=True, out_stats=Fake((B, H, S, 1), F32, strides=(1, B, B * H, 1))),
        ValueError,
        ("out_stats must be contiguous",),
    ),
    (
        dict(training=True, out_stats=Fake((B, H, S, 1), F32, device=1)),
        ValueError,
        ("out_stats is on device 1",),
    ),
]


@pytest.mark.parametrize(("kwargs", "exc", "fragments"), SDPA_BAD)
def test_sdpa_rejects_before_any_c_call(guarded, kwargs, exc, fragments):
    if fragments != ("host",):  # a host array: refused while the call is keyed
        fragments = ("dnn_sdpa", *fragments)
    _raises(exc, fragments, _sdpa, **kwargs)


def test_sdpa_needs_sm80(guarded, monkeypatch):
    monkeypatch.setattr(_graphops, "capability", lambda device: (7, 5))
    _raises(errors.NotSupportedError, ("dnn_sdpa", "sm80 (Ampere) or newer", "sm75"), _sdpa)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        dict(q=q4(dt=F16), k=q4(dt=F16), v=q4(dt=F16)),
        dict(is_causal=True, training=True),
        dict(k=q4(h=2), v=q4(h=2)),  # grouped-query
        dict(k=q4(h=1, s=96), v=q4(h=1, s=96, d=128)),  # multi-query, other S_kv and D_v
        dict(q=Fake((B, H, S, D), BF16, strides=(S * H * D, D, H * D, 1))),  # (B, S, H, D)
        dict(q=Fake((B, H, S, D), BF16, strides=(S * H * D, S * D, 1, S))),  # staged
        dict(seq_lens_q=lens(), seq_lens_kv=Fake((B, 1, 1, 1), I32)),
        dict(dropout_p=0.1, seed=7, scale=0.5),
        dict(dropout_p=0.0, seed=-5),  # no dropout: the seed is not used
        dict(out=q4()),
        dict(training=True, out=q4(), out_stats=Fake((B, H, S, 1), F32)),
    ],
)
def test_sdpa_valid_calls_reach_the_graph(guarded, kwargs):
    with pytest.raises(CCall):
        _sdpa(**kwargs)


def _grad(q=None, k=None, v=None, out=None, dout=None, stats=None, **kw):
    q = q4() if q is None else q
    return pycudnn.dnn_sdpa_grad(
        q,
        q4() if k is None else k,
        q4() if v is None else v,
        q4() if out is None else out,
        q4() if dout is None else dout,
        Fake((B, H, S, 1), F32) if stats is None else stats,
        **kw,
    )


SDPA_GRAD_BAD = [
    (dict(dropout_p=0.1), ValueError, ("dropout_p=0.1 needs the forward's seed",)),
    (
        dict(q=q4(dt=F32), k=q4(dt=F32), v=q4(dt=F32)),
        errors.NotSupportedError,
        ("float16 and bfloat16",),
    ),
    (dict(q=q4(d=12), k=q4(d=12), v=q4(d=12)), errors.NotSupportedError, ("multiples of 8",)),
    (dict(k=q4(h=3), v=q4(h=3)), ValueError, ("must be a multiple of k's and v's (3)",)),
    (dict(attn_mask=Fake((B, H, S, S), DataType.BOOLEAN)), TypeError, ("attn_mask", "-inf")),
    (dict(dropout_p=1.5, seed=1), ValueError, ("dropout_p=1.5 is out of range",)),
    (dict(q=q4(s=1), k=q4(s=1), v=q4(s=1)), errors.NotSupportedError, ("S_q = S_kv = 1",)),
    (dict(out=q4(s=32)), ValueError, ("out must have shape (2, 4, 64, 64), got (2, 4, 32, 64)",)),
    (dict(dout=q4(d=32)), ValueError, ("dout must have shape (2, 4, 64, 64)",)),
    (dict(dout=q4(dt=F16)), TypeError, ("dout is float16, q is bfloat16",)),
    (dict(out=q4(device=1)), ValueError, ("out is on device 1, q on device 0",)),
    (dict(out=q4(strides=(S * D * H, S * D, D, 0))), ValueError, ("out has a zero (broadcast)",)),
    (
        dict(stats=Fake((B, H, S, 1), F16)),
        ValueError,
        ("stats must be the forward's float32 (2, 4, 64, 1) statistics",),
    ),
    (dict(stats=Fake((B, H, S), F32)), ValueError, ("got shape (2, 4, 64)",)),
    (
        dict(stats=Fake((B, H, S, 1), F32, strides=(1, B, B * H, 1))),
        ValueError,
        ("stats must be contiguous",),
    ),
    (dict(stats=Fake((B, H, S, 1), F32, device=1)), ValueError, ("stats is on device 1",)),
    (dict(seq_lens_q=lens()), ValueError, ("give both seq_lens_q and seq_lens_kv",)),
    (
        dict(seq_lens_q=lens(dt=I64), seq_lens_kv=lens(dt=I64)),
        TypeError,
        ("seq_lens_q must be an int32 device array",),
    ),
    (
        dict(seq_lens_q=lens(4), seq_lens_kv=lens(4)),
        ValueError,
        ("seq_lens_q must have shape (2,)",),
    ),
    (dict(out_grads=q4()), TypeError, ("out_grads must be None or (dq, dk, dv)",)),
    (dict(out_grads=(q4(), q4())), TypeError, ("out_grads must be None or (dq, dk, dv)",)),
    (
        dict(attn_mask=Fake((1, H, S, S), BF16), bias_grad=True, out_grads=(q4(), q4(), q4())),
        ValueError,
        ("out_grads is dq, dk, dv only",),
    ),
    (
        dict(out_grads=(q4(), q4(s=32), q4())),
        ValueError,
        ("out_grads[1] has shape (2, 4, 32, 64), expected (2, 4, 64, 64)",),
    ),
    (dict(out_grads=(q4(dt=F16), q4(), q4())), TypeError, ("out_grads[0] is float16",)),
    (
        dict(out_grads=(q4(), q4(), q4(strides=(S * D * H, 1, H, S * H)))),
        ValueError,
        ("out_grads[2]'s head dim must be contiguous",),
    ),
]


@pytest.mark.parametrize(("kwargs", "exc", "fragments"), SDPA_GRAD_BAD)
def test_sdpa_grad_rejects_before_any_c_call(guarded, kwargs, exc, fragments):
    _raises(exc, ("dnn_sdpa_grad", *fragments), _grad, **kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        dict(is_causal=True, deterministic=True),
        dict(k=q4(h=1), v=q4(h=1)),
        dict(dropout_p=0.2, seed=3),
        dict(seq_lens_q=lens(), seq_lens_kv=lens()),
        dict(out_grads=(q4(), q4(), q4())),
        dict(k=q4(h=2), v=q4(h=2), out_grads=(q4(), q4(h=2), q4(h=2))),
    ],
)
def test_sdpa_grad_valid_calls_reach_the_graph(guarded, kwargs):
    with pytest.raises(CCall):
        _grad(**kwargs)


# ==================================================================================================
# The graphs the operations build (Graph.build captured instead of planned)
# ==================================================================================================
@pytest.fixture
def captured(no_c, monkeypatch):
    """``_graphops.entry`` records the graph it would plan, then stops the call."""
    graphs = []

    def entry(func, g, device, stream, allocs, spans, *, what, stage=None, kind=None):
        graphs.append((func, g, allocs, what, stage))
        raise CCall(what)

    monkeypatch.setattr(_graphops, "entry", entry)
    monkeypatch.setattr(_graphops, "capability", lambda device: (9, 0))
    return graphs


def test_matmul_graph(captured):
    with pytest.raises(CCall):
        pycudnn.dnn_matmul(
            Fake((3, 4, 5), F16),
            Fake((5, 7), F16, strides=(1, 5)),
            bias=Fake((7,), F16),
            activation="relu",
        )
    func, g, allocs, what, _stage = captured[-1]
    assert func == "dnn_matmul" and what == "a float16 matmul (3, 4, 5) @ (5, 7) + bias, relu"
    key = g.key(device=0)
    assert [n.kind for n in key.nodes] == ["matmul", "pointwise", "pointwise"]
    assert key.tensors[1].dim == (1, 5, 7) and key.tensors[1].stride[1:] == (1, 5)
    assert allocs[0].shape == (3, 4, 7)


@pytest.mark.parametrize("rms", [False, True])
def test_norm_graph_rows(rms):
    """cuDNN 9.19 refuses x and y of different row pitches ("!xDesc.hasSameShape(&yDesc)", seen
    on the H100): rows of a wider buffer go through a packed copy, packed rows are taken as is."""
    from pycudnn.highlevel import _operand, norms

    g = Graph("bfloat16")
    stage: list = []
    wide = _operand.Operand(4096, (4, 6, 64), (6 * 128, 128, 1), BF16, 0)
    t = norms._x_tensor(g, "x", wide, 1, 0, stage)
    assert t.dim == (24, 64, 1, 1) and t.stride == (64, 1, 64, 64)
    assert [(i, tuple(p)) for i, _o, p in stage] == [(0, (384, 64, 1, 1))]
    stage.clear()
    packed = _operand.Operand(4096, (4, 6, 64), (384, 64, 1), BF16, 0)
    t = norms._x_tensor(g, "x2", packed, 1 + rms, 1, stage)
    assert stage == [] and t.stride[1] == 1


def test_sdpa_graph_layouts(captured):
    q = Fake((B, H, S, D), F16, strides=(S * H * D, D, H * D, 1))  # (B, S, H, D) memory
    with pytest.raises(CCall):
        pycudnn.dnn_sdpa(
            q,
            q4(dt=F16, h=2),
            q4(dt=F16, h=2),
            is_causal=True,
            training=True,
            seq_lens_q=lens(),
            seq_lens_kv=lens(),
        )
    _func, g, allocs, what, stage = captured[-1]
    assert stage is None and "causal, padding mask, training" in what
    o, stats = allocs
    assert o.element_strides == q.strides and stats.shape == (B, H, S, 1)
    key = g.key(device=0)
    assert next(t for t in key.tensors if t.data_type == int(I32) and not t.is_virtual).dim == (
        B,
        1,
        1,
        1,
    )
    with pytest.raises(CCall):
        pycudnn.dnn_sdpa_grad(
            q4(), q4(), q4(), q4(), q4(), Fake((B, H, S, 1), F32), deterministic=True
        )
    _func, g, allocs, what, stage = captured[-1]
    key = g.key(device=0)
    assert len(key.scratch) == 1 and [a.shape for a in allocs] == [(B, H, S, D)] * 3
    with pytest.raises(CCall):
        pycudnn.dnn_sdpa_grad(
            q4(), q4(), q4(), q4(), q4(), Fake((B, H, S, 1), F32), deterministic=False
        )
    assert len(captured[-1][1].key(device=0).scratch) == 2


# ==================================================================================================
# The float64 references the GPU tests trust, checked by central finite differences
# ==================================================================================================
def _fd(f, x, dy, eps=1e-6):
    """d(sum(f(x) * dy)) / dx by central differences."""
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = eps
        g[i] = ((f(x + e) - f(x - e)) * dy).sum() / (2 * eps)
    return g


@pytest.mark.parametrize("nn", [1, 2])
def test_norm_references_by_finite_differences(nn):
    from references import layer_norm_grad_ref, layer_norm_ref, rms_norm_grad_ref, rms_norm_ref

    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 2, 5))
    dy = rng.standard_normal(x.shape)
    ns = x.shape[3 - nn :]
    gm, bt = rng.standard_normal(ns), rng.standard_normal(ns)
    y, mean, _inv = layer_norm_ref(x, nn, gm, bt, 1e-3)
    assert mean.shape == (*x.shape[: 3 - nn], *(1,) * nn)
    axes = tuple(range(3 - nn, 3))
    np.testing.assert_allclose(mean, x.mean(axes, keepdims=True))
    np.testing.assert_allclose(y, (x - mean) / np.sqrt(x.var(axes, keepdims=True) + 1e-3) * gm + bt)
    dx, dg, db = layer_norm_grad_ref(dy, x, nn, gm, 1e-3)
    np.testing.assert_allclose(
        dx, _fd(lambda v: layer_norm_ref(v, nn, gm, bt, 1e-3)[0], x, dy), rtol=1e-6, atol=1e-8
    )
    np.testing.assert_allclose(
        dg, _fd(lambda v: layer_norm_ref(x, nn, v, bt, 1e-3)[0], gm, dy), rtol=1e-6, atol=1e-8
    )
    np.testing.assert_allclose(
        db, _fd(lambda v: layer_norm_ref(x, nn, gm, v, 1e-3)[0], bt, dy), rtol=1e-6, atol=1e-8
    )
    y, _inv = rms_norm_ref(x, nn, gm, 1e-3)
    np.testing.assert_allclose(y, x / np.sqrt((x * x).mean(axes, keepdims=True) + 1e-3) * gm)
    dx, dg = rms_norm_grad_ref(dy, x, nn, gm, 1e-3)
    np.testing.assert_allclose(
        dx, _fd(lambda v: rms_norm_ref(v, nn, gm, 1e-3)[0], x, dy), rtol=1e-6, atol=1e-8
    )
    np.testing.assert_allclose(
        dg, _fd(lambda v: rms_norm_ref(x, nn, v, 1e-3)[0], gm, dy), rtol=1e-6, atol=1e-8
    )


@pytest.mark.parametrize(
    ("hk", "causal", "lens", "dropout"),
    [
        (2, False, None, False),
        (1, True, None, False),
        (2, True, ([3, 2], [4, 1]), False),
        (2, False, ([2, 3], [3, 4]), True),
    ],
)
def test_sdpa_reference_by_finite_differences(hk, causal, lens, dropout):
    from references import sdpa_grad_ref, sdpa_ref

    rng = np.random.default_rng(11)
    b, h, sq, skv, d = 2, 2, 3, 4, 2
    q = rng.standard_normal((b, h, sq, d))
    k = rng.standard_normal((b, hk, skv, d))
    v = rng.standard_normal((b, hk, skv, d + 1))
    do = rng.standard_normal((b, h, sq, d + 1))
    lq, lkv = lens if lens else (None, None)
    kw = dict(causal=causal, scale=0.7, lens_q=lq, lens_kv=lkv)
    if dropout:
        kw.update(drop_mask=(rng.random((b, h, sq, skv)) > 0.3).astype(float), dropout_p=0.3)
    o, lse = sdpa_ref(q, k, v, **kw)
    assert o.shape == do.shape and lse.shape == (b, h, sq, 1)
    dq, dk, dv = sdpa_grad_ref(q, k, v, do, **kw)
    for got, f, x in (
        (dq, lambda t: sdpa_ref(t, k, v, **kw)[0], q),
        (dk, lambda t: sdpa_ref(q, t, v, **kw)[0], k),
        (dv, lambda t: sdpa_ref(q, k, t, **kw)[0], v),
    ):
        np.testing.assert_allclose(got, _fd(f, x, do), rtol=1e-6, atol=1e-8)
    if lens:  # rows past a batch's query length are zero; their keys get no gradient
        for i, (nq, nkv) in enumerate(zip(lq, lkv, strict=True)):
            assert not o[i, :, nq:].any() and np.isneginf(lse[i, :, nq:]).all()
            assert not dk[i, :, nkv:].any() and not dv[i, :, nkv:].any()
    if causal:
        assert np.allclose(o[:, :, 0], np.repeat(v, h // hk, axis=1)[:, :, 0])  # row 0 sees key 0
    if not dropout and not lens:  # the log-sum-exp of the scaled, masked scores
        s = 0.7 * q @ np.repeat(k, h // hk, axis=1).transpose(0, 1, 3, 2)
        if causal:
            s = np.where(np.tril(np.ones((sq, skv), bool)), s, -np.inf)
        np.testing.assert_allclose(lse[..., 0], np.log(np.exp(s).sum(-1)))


def test_given_stats_and_gradients_are_the_calls_outputs(no_c, monkeypatch):
    """``out_stats`` and ``out_grads`` reach the call as its given outputs, in io order (what
    a caller binding the entry to its own pointers relies on)."""
    seen = []

    def run_cached(key, build, args, ptrs, outs, out_ptrs, stream, *a, **k):
        seen.append((outs, out_ptrs))
        raise CCall("stop")

    monkeypatch.setattr(_call, "run_cached", run_cached)
    out, st = q4(), Fake((B, H, S, 1), F32)
    with pytest.raises(CCall):
        _sdpa(training=True, out=out, out_stats=st)
    grads = (q4(), q4(), q4())
    with pytest.raises(CCall):
        _grad(out_grads=grads)
    assert seen[0] == ((out, st), (out.ptr, st.ptr))
    assert seen[1] == (grads, tuple(g.ptr for g in grads))
