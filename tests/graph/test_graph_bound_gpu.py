"""GPU tests of :meth:`pycudnn.graph.Graph.execute` bound to its operands' signature (marker
``gpu``; skipped without a device).

Run on the GPU machine:
``PYTHONPATH=. python3 -m pytest -m gpu -q tests/graph/test_graph_bound_gpu.py``.

A built graph executed again and again on fresh arrays (new values, new or reused addresses,
NaN-poisoned outputs) gives the float64 NumPy reference's numbers on every call, while the
per-array checks ran on the first call only (``check_array`` counted): pycudnn arrays, a
by-value scale read anew each call, torch tensors on the default stream and on a side stream
(checked in full there, and ordered after the side stream's work).
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
from references import conv_ref

import pycudnn
from pycudnn import errors
from pycudnn.graph import Graph, _variant

pytestmark = pytest.mark.gpu

rng = np.random.default_rng()
NHWC = (0, 2, 3, 1)
TOL = 1e-2  # float16, max |got - ref| / max |ref|


@pytest.fixture(autouse=True)
def _exact():
    old = pycudnn.config.allow_tf32
    pycudnn.config.allow_tf32 = False
    yield
    pycudnn.config.allow_tf32 = old
    pycudnn.get_handle().set_stream(0)


@pytest.fixture
def counted(monkeypatch):
    n = collections.Counter()
    real = _variant.check_array

    def check_array(*args):
        n["check_array"] += 1
        return real(*args)

    monkeypatch.setattr(_variant, "check_array", check_array)
    return n


def dev(a64, order=None):
    """A float16 device array of *a64* (stored in the dim *order*: a permuted view) and its
    float64 values."""
    h = np.asarray(a64).astype(np.float16)
    if order is None:
        return pycudnn.to_device(np.ascontiguousarray(h)), h.astype(np.float64)
    d = pycudnn.to_device(np.ascontiguousarray(h.transpose(order)))
    return d.transpose(*np.argsort(order)), h.astype(np.float64)


def poisoned(shape, order=NHWC):
    base = pycudnn.empty(tuple(shape[i] for i in order), np.float16)
    base.fill_(float("nan"))
    return base.transpose(*np.argsort(order))


def el(a):
    return tuple(s // a.itemsize for s in a.strides)


def rel_err(got, want):
    got = np.asarray(got, np.float64)
    assert not np.isnan(got).any(), "NaN in the output (an element was not written)"
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def _problem():
    x, x64 = dev(rng.standard_normal((4, 32, 16, 16)), NHWC)
    w, w64 = dev(rng.standard_normal((64, 32, 3, 3)) / 10, NHWC)
    b, b64 = dev(rng.standard_normal((1, 64, 1, 1)))
    return (x, w, b), (x64, w64, b64)


def _graph(x, w, b, scaled=False):
    """``relu(conv(x, w) [* alpha] + b)``, alpha a by-value float32 when *scaled*."""
    g = Graph(io_data_type="float16", name="bound_conv")
    tx, tw, tb = g.tensor_like(x, name="x"), g.tensor_like(w, name="w"), g.tensor_like(b, name="b")
    y = g.conv_fprop(tx, tw, padding=1)
    if scaled:
        alpha = g.tensor((1, 1, 1, 1), data_type="float32", is_pass_by_value=True, name="alpha")
        y = g.mul(y, alpha)
    ty = g.relu(g.bias(y, tb)).set_output(True).set_name("y")
    ty.set_stride(el(poisoned((4, 64, 16, 16))))
    try:
        g.build()
    except errors.NotSupportedError as exc:
        pytest.skip(f"no engine for the graph here: {str(exc)[:300]}")
    return g, tx, tw, tb, ty


def test_repeated_execute_on_fresh_arrays_gives_the_reference(counted):
    (x, w, b), _ = _problem()
    g, tx, tw, tb, ty = _graph(x, w, b)
    keep = []  # some arrays kept alive: the next ones get new addresses; others reused
    for i in range(6):
        (x, w, b), (x64, w64, b64) = _problem()
        y = poisoned((4, 64, 16, 16))
        g.execute({tx: x, tw: w, tb: b, ty: y})
        want = np.maximum(conv_ref(x64, w64, (1, 1)) + b64, 0)
        assert rel_err(y.get(), want) <= TOL, f"call {i}"
        if i % 2:
            keep.append((x, w, b, y))
    assert counted["check_array"] == 4  # the first call's four arrays only
    # a changed layout is still refused (a packed NCHW output)
    bad = pycudnn.empty((4, 64, 16, 16), np.float16)
    with pytest.raises(ValueError, match=r"tensor 'y' has strides"):
        g.execute({tx: x, tw: w, tb: b, ty: bad})
    # (an output overlapping an input on a bound signature: tests/graph/test_graph_bound.py)


def test_a_by_value_scale_is_read_on_every_call(counted):
    (x, w, b), (x64, w64, b64) = _problem()
    g, tx, tw, tb, ty = _graph(x, w, b, scaled=True)
    conv = conv_ref(x64, w64, (1, 1))
    for alpha in (0.5, 2.0, -1.0, 1.0, 0.25):
        y = poisoned((4, 64, 16, 16))
        g.execute({tx: x, tw: w, tb: b, ty: y, "alpha": alpha})
        want = np.maximum(conv * alpha + b64, 0)
        assert rel_err(y.get(), want) <= TOL, f"alpha {alpha}"
    assert counted["check_array"] == 4


def test_torch_tensors_default_and_side_stream(counted):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")

    def problem():
        x = torch.randn(4, 32, 16, 16, device="cuda").half().to(memory_format=torch.channels_last)
        w = (torch.randn(64, 32, 3, 3, device="cuda") / 10).half()
        w = w.to(memory_format=torch.channels_last)
        b = torch.randn(1, 64, 1, 1, device="cuda").half()
        y = torch.full((4, 64, 16, 16), float("nan"), device="cuda", dtype=torch.half)
        y = y.to(memory_format=torch.channels_last)
        want = np.maximum(
            conv_ref(x.double().cpu().numpy(), w.double().cpu().numpy(), (1, 1))
            + b.double().cpu().numpy(),
            0,
        )
        return x, w, b, y, want

    x, w, b, y, _ = problem()
    g, tx, tw, tb, ty = _graph(x, w, b)
    for i in range(4):
        x, w, b, y, want = problem()
        g.execute({tx: x, tw: w, tb: b, ty: y})
        torch.cuda.synchronize()
        assert rel_err(y.double().cpu().numpy(), want) <= TOL, f"call {i}"
    assert counted["check_array"] == 4
    # a side stream: the inputs are written there, the call runs there; checked in full
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x, w, b, y, _ = problem()
        torch.cuda._sleep(10_000_000)  # the side stream is busy: ordering matters
        x.mul_(2)
        g.execute({tx: x, tw: w, tb: b, ty: y}, stream=s)
    torch.cuda.synchronize()
    want2 = np.maximum(
        conv_ref(x.double().cpu().numpy(), w.double().cpu().numpy(), (1, 1))
        + b.double().cpu().numpy(),
        0,
    )
    assert rel_err(y.double().cpu().numpy(), want2) <= TOL
    assert counted["check_array"] == 8
