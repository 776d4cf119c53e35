"""GPU tests of the public graph builder (marker ``gpu``; skipped without a device).

Run on the GPU machine:
``PYTHONPATH=. python3 -m pytest -m gpu -q -s tests/graph/test_graph_gpu.py``.

Graphs built with :class:`pycudnn.graph.Graph` and executed on fresh random inputs (rounded to
the data type) against float64 NumPy references (``tests/support/references.py``); outputs
are NaN-poisoned before every run. Also: a plan saved with ``serialize`` and loaded into a new
graph gives the same results; the autotune policy; engine filters; ``execute``'s errors.
Graphs cuDNN has no engine for here (pure pointwise or reduction graphs) are skipped with the
reason, and counted in the summary line.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
from references import conv_ref, layer_norm_ref, rms_norm_ref

import pycudnn
from pycudnn import errors
from pycudnn.enums import BackendBehaviorNote
from pycudnn.graph import Graph

pytestmark = pytest.mark.gpu

ml_dtypes = pytest.importorskip("ml_dtypes")
NP = {
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "fp16": np.dtype(np.float16),
    "fp32": np.dtype(np.float32),
}
TOL = {"bf16": 2e-2, "fp16": 1e-2, "fp32": 1e-4}  # max |got - ref| / max |ref|
STATS: dict[str, list] = collections.defaultdict(list)
rng = np.random.default_rng()


@pytest.fixture(scope="module", autouse=True)
def _config():
    old = pycudnn.config.allow_tf32
    pycudnn.config.allow_tf32 = False
    yield
    pycudnn.config.allow_tf32 = old


def dev(a64, dt, order=None):
    """A device array of *a64* rounded to *dt* (stored in the dim *order* given: a permuted
    view) and its float64 values."""
    h = np.asarray(a64).astype(NP[dt])
    if order is None:
        return pycudnn.to_device(np.ascontiguousarray(h)), h.astype(np.float64)
    d = pycudnn.to_device(np.ascontiguousarray(h.transpose(order)))
    return d.transpose(*np.argsort(order)), h.astype(np.float64)


def poisoned(shape, dt, order=None):
    base = pycudnn.empty(shape if order is None else tuple(shape[i] for i in order), NP[dt])
    base.fill_(float("nan"))
    return base if order is None else base.transpose(*np.argsort(order))


def el(a):
    return tuple(s // a.itemsize for s in a.strides)


def host(a):
    got = np.asarray(a.get(), np.float64)
    assert not np.isnan(got).any(), "NaN in the output (an element was not written)"
    return got


def err(got, want):
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def check(family, got, want, dt):
    e = err(host(got), want)
    STATS[family].append(e)
    assert e <= TOL[dt], f"{family}: error {e:.2e}"


def build_or_skip(g, family, **kw):
    try:
        return g.build(**kw)
    except errors.NotSupportedError as exc:
        STATS[f"{family} (no engine)"].append(0.0)
        pytest.skip(f"no engine for the {family} graph here: {str(exc)[:300]}")


# ==================================================================================================
# conv + bias + relu, serialize / deserialize, autotune, engine filters, execute's errors
# ==================================================================================================
NHWC = (0, 2, 3, 1)


def _conv_problem():
    x, x64 = dev(rng.standard_normal((4, 32, 16, 16)), "fp16", NHWC)
    w, w64 = dev(rng.standard_normal((64, 32, 3, 3)) / 10, "fp16", NHWC)
    b, b64 = dev(rng.standard_normal((1, 64, 1, 1)), "fp16")
    want = np.maximum(conv_ref(x64, w64, (1, 1)) + b64, 0)
    return (x, w, b), want


def _conv_graph(x, w, b, y):
    g = Graph(io_data_type="float16", name="conv_bias_relu")
    tx, tw, tb = g.tensor_like(x, name="x"), g.tensor_like(w, name="w"), g.tensor_like(b, name="b")
    ty = g.relu(g.bias(g.conv_fprop(tx, tw, padding=1), tb)).set_output(True).set_name("y")
    ty.set_stride(el(y))
    return g, (tx, tw, tb, ty)


def test_conv_bias_relu_and_a_saved_plan():
    (x, w, b), want = _conv_problem()
    y = poisoned(want.shape, "fp16", NHWC)
    g, (tx, tw, tb, ty) = _conv_graph(x, w, b, y)
    assert ty.stride == el(y)  # NHWC: the convolution's output keeps x's layout
    g.build()
    assert "engine" in g.describe() and g.get_workspace_size() >= 0
    g.execute({tx: x, tw: w, tb: b, ty: y})
    check("builder conv+bias+relu", y, want, "fp16")
    first = host(y)
    saved = g.serialize()
    # a new graph of the same structure loads the plan: no engine search, the same results
    y2 = poisoned(want.shape, "fp16", NHWC)
    g2, (_tx, _tw, _tb, ty2) = _conv_graph(x, w, b, y2)
    g2.deserialize(saved)
    assert "loaded from JSON" in g2.describe()
    g2.execute({"x": x, "w": w, "b": b, ty2: y2})
    assert np.array_equal(host(y2), first)
    # by uid too
    y3 = poisoned(want.shape, "fp16", NHWC)
    g2.execute({g2._key.tensors[0].uid: x, "w": w, "b": b, "y": y3})
    assert np.array_equal(host(y3), first)


def test_conv_autotune_and_engine_filters():
    (x, w, b), want = _conv_problem()
    y = poisoned(want.shape, "fp16", NHWC)
    g, (tx, tw, tb, ty) = _conv_graph(x, w, b, y)
    g.build(policy="autotune")
    g.execute({tx: x, tw: w, tb: b, ty: y})
    check("builder conv autotune", y, want, "fp16")
    g2, (tx, tw, tb, ty) = _conv_graph(x, w, b, y)
    try:
        g2.build(deny_behavior_notes=["RUNTIME_COMPILATION"])
    except errors.NotSupportedError as exc:  # every engine compiles at run time: said so
        assert "RUNTIME_COMPILATION" in str(exc) or "engine" in str(exc)
        STATS["builder conv without runtime compilation (no engine)"].append(0.0)
        return
    assert int(BackendBehaviorNote.RUNTIME_COMPILATION) not in g2.plan.engine.behavior
    y = poisoned(want.shape, "fp16", NHWC)
    g2.execute({tx: x, tw: w, tb: b, ty: y})
    check("builder conv no runtime compilation", y, want, "fp16")


def test_execute_errors_name_the_tensor():
    (x, w, b), want = _conv_problem()
    y = poisoned(want.shape, "fp16", NHWC)
    g, (tx, tw, tb, ty) = _conv_graph(x, w, b, y)
    with pytest.raises(RuntimeError, match="call build"):
        g.execute({tx: x, tw: w, tb: b, ty: y})
    g.build()
    with pytest.raises(KeyError, match="no array for tensor 'b'"):
        g.execute({tx: x, tw: w, ty: y})
    b32 = pycudnn.to_device(np.zeros((1, 64, 1, 1), np.float32))
    with pytest.raises(TypeError, match="tensor 'b' is float16, the array float32"):
        g.execute({tx: x, tw: w, tb: b32, ty: y})
    b_small = pycudnn.to_device(np.zeros((1, 32, 1, 1), np.float16))
    with pytest.raises(ValueError, match=r"tensor 'b' has dims \(1, 64, 1, 1\), the array"):
        g.execute({tx: x, tw: w, tb: b_small, ty: y})
    x_nchw = pycudnn.to_device(np.zeros(x.shape, np.float16))
    with pytest.raises(ValueError, match="tensor 'x' has strides"):
        g.execute({tx: x_nchw, tw: w, tb: b, ty: y})
    with pytest.raises(KeyError, match="no tensor named 'nope'"):
        g.execute({"nope": x})
    other, _ = _conv_graph(x, w, b, y)
    with pytest.raises(ValueError, match="belongs to another graph"):
        g.execute({other._tensors[0]: x})
    need = g.get_workspace_size()
    if need:
        small = pycudnn.empty((max(need // 2, 1),), np.uint8)
        with pytest.raises(ValueError, match="workspace has"):
            g.execute({tx: x, tw: w, tb: b, ty: y}, workspace=small)
    g.execute({tx: x, tw: w, tb: b, ty: y})  # still runs after the refusals
    check("builder conv after errors", y, want, "fp16")


# ==================================================================================================
# matmul, a pointwise chain with a scalar given at execute time, reduction, norms
# ==================================================================================================
@pytest.mark.parametrize("dt", ["bf16", "fp16"])
def test_matmul_graph(dt):
    a, a64 = dev(rng.standard_normal((2, 64, 32)), dt)
    b, b64 = dev(rng.standard_normal((2, 32, 48)), dt)
    g = Graph(io_data_type={"bf16": "bfloat16", "fp16": "float16"}[dt])
    ta, tb = g.tensor_like(a, name="a"), g.tensor_like(b, name="b")
    tc = g.matmul(ta, tb).set_output(True).set_name("c")
    assert tc.dim == (2, 64, 48)
    g.build()
    c = poisoned((2, 64, 48), dt)
    g.execute({ta: a, tb: b, tc: c})
    check("builder matmul", c, a64 @ b64, dt)


def test_pointwise_chain_with_a_runtime_scalar():
    a, a64 = dev(rng.standard_normal((2, 32, 64)), "fp16")
    b, b64 = dev(rng.standard_normal((1, 64, 48)) / 8, "fp16")
    bias, bias64 = dev(rng.standard_normal((1, 1, 48)), "fp16")
    g = Graph(io_data_type="float16")
    ta, tb, tbias = g.tensor_like(a), g.tensor_like(b), g.tensor_like(bias)
    s = g.tensor((1, 1, 1), data_type="float32", is_pass_by_value=True, name="s")
    y = g.tanh(g.add(g.mul(g.matmul(ta, tb), s), tbias)).set_output(True)
    build_or_skip(g, "matmul+pointwise chain")
    out = poisoned((2, 32, 48), "fp16")
    for scale in (0.5, -2.0):
        out.fill_(float("nan"))
        g.execute({ta: a, tb: b, tbias: bias, s: scale, y: out})
        check("builder pointwise chain", out, np.tanh(scale * (a64 @ b64) + bias64), "fp16")
    with pytest.raises(KeyError, match="no value for the by-value tensor 's'"):
        g.execute({ta: a, tb: b, tbias: bias, y: out})


def test_pointwise_only_graph():
    x, x64 = dev(rng.standard_normal((4, 8, 32, 32)), "fp32", NHWC)
    z, z64 = dev(rng.standard_normal((4, 8, 32, 32)), "fp32", NHWC)
    g = Graph(io_data_type="float32")
    tx, tz = g.tensor_like(x, name="x"), g.tensor_like(z, name="z")
    y = g.relu(g.add(tx, tz, alpha2=0.5)).set_output(True)
    build_or_skip(g, "pointwise-only")
    out = poisoned(x.shape, "fp32", NHWC)
    g.execute({tx: x, tz: z, y: out})
    check("builder pointwise", out, np.maximum(x64 + 0.5 * z64, 0), "fp32")


def test_reduction_graph():
    a, a64 = dev(rng.standard_normal((1, 64, 32)), "fp32")
    b, b64 = dev(rng.standard_normal((1, 32, 128)), "fp32")
    g = Graph(io_data_type="float32")
    ta, tb = g.tensor_like(a), g.tensor_like(b)
    r = g.reduction(g.matmul(ta, tb), "add", dim=(1, 64, 1)).set_output(True)
    build_or_skip(g, "matmul+row sum")
    out = poisoned((1, 64, 1), "fp32")
    g.execute({ta: a, tb: b, r: out})
    check("builder reduction", out, (a64 @ b64).sum(-1, keepdims=True), "fp32")


@pytest.mark.parametrize("dt", ["fp32", "bf16"])
@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
def test_norm_graphs(dt, rms):
    m, n = 48, 128
    x, x64 = dev(rng.standard_normal((m, n, 1, 1)) * 2 + 1, dt)
    sc, sc64 = dev(rng.standard_normal((1, n, 1, 1)), "fp32")
    bi, bi64 = dev(rng.standard_normal((1, n, 1, 1)), "fp32")
    g = Graph(io_data_type={"fp32": "float32", "bf16": "bfloat16"}[dt])
    tx = g.tensor_like(x, name="x")
    tsc, tbi = g.tensor_like(sc, name="scale"), g.tensor_like(bi, name="bias")
    eps = g.scalar(1e-5, name="eps")
    if rms:
        y, inv = g.rmsnorm(tx, tsc, None, eps, "training")
        stats = [inv]
        wy, winv = rms_norm_ref(x64, 3, sc64.reshape(-1), 1e-5)
        wants = [winv]
    else:
        y, mean, inv = g.layernorm(tx, tsc, tbi, eps, "training")
        stats = [mean, inv]
        wy, wmean, winv = layer_norm_ref(x64, 3, sc64.reshape(-1), bi64.reshape(-1), 1e-5)
        wants = [wmean, winv]
    y.set_output(True)
    for t in stats:
        t.set_output(True).set_data_type("float32")
    build_or_skip(g, "rmsnorm" if rms else "layernorm")
    out = poisoned((m, n, 1, 1), dt)
    souts = [poisoned((m, 1, 1, 1), "fp32") for _ in stats]
    pack = {tx: x, tsc: sc, y: out, **dict(zip(stats, souts, strict=True))}
    if not rms:
        pack[tbi] = bi
    g.execute(pack)
    check("builder rmsnorm" if rms else "builder layernorm", out, wy, dt)
    for got, want in zip(souts, wants, strict=True):
        check("builder norm statistics", got, want, "fp32")


def test_zz_summary():
    """One line per family (read with ``-s``)."""
    for family, errs in sorted(STATS.items()):
        print(f"\nGRAPH {family}: {len(errs)} cases, max rel err {max(errs):.2e}", end="")
    print()
