"""GPU tests of dnn_reduction (marker ``gpu``; skipped without a device).

Run on the GPU machine:
``PYTHONPATH=. python3 -m pytest -m gpu -q tests/highlevel/test_reduction_gpu.py``.

References are float64 NumPy on the input rounded to the tested dtype; errors are
max |got - ref| / max(|ref|, 1e-30). Outputs are poisoned with NaN before each call (or, with
``beta``, filled with known values). Every op x dtype x layout (C order, channels last, a strided
view) x several axis sets; output dtypes; indices; alpha/beta; the degenerate (nothing to reduce)
and empty paths; equality with torch's reductions.
"""

from __future__ import annotations

import numpy as np
import pytest
from references import reduction_ref

import pycudnn
from pycudnn.highlevel.reduction import dnn_reduction

pytestmark = pytest.mark.gpu

OPS = ("add", "mul", "min", "max", "amax", "avg", "norm1", "norm2", "mul_no_zeros")
DTYPES = ("float16", "float32", "float64")
LAYOUTS = ("nchw", "nhwc", "sliced")
TOL = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3}
AXES = (None, 1, (1, 3), (0, 2, 3), -1, (0, 1, 2, 3))
rng = np.random.default_rng()


def data(shape, op):
    """Values that keep products of up to 120 elements in range (|x| in [0.8, 1.25])."""
    if op in ("mul", "mul_no_zeros"):
        x = rng.uniform(0.8, 1.25, shape) * rng.choice([-1.0, 1.0], shape)
        if op == "mul_no_zeros":
            x[rng.random(shape) < 0.2] = 0.0
        return x
    return rng.standard_normal(shape)


def dev(x64, dtype, layout="nchw"):
    """(device array of *x64* in *dtype* and *layout*, the values it holds as float64)."""
    x = x64.astype(dtype)
    if layout == "nhwc":
        d = pycudnn.to_device(np.ascontiguousarray(x.transpose(0, 2, 3, 1))).transpose(0, 3, 1, 2)
        assert d.is_dense and not d.is_c_contiguous
    elif layout == "sliced":
        big = np.zeros((*x.shape[:-1], 2 * x.shape[-1]), dtype)
        big[..., ::2] = x
        d = pycudnn.to_device(big)[..., ::2]
        assert not d.is_dense
    else:
        d = pycudnn.to_device(x)
    return d, x.astype(np.float64)


def poisoned(shape, dtype):
    out = pycudnn.empty(shape, dtype)
    out.fill_(float("nan"))
    return out


def err(got, want, scale=None):
    """Largest error relative to *scale* (default the reference itself). A sum's rounding grows
    with the magnitudes summed, not with the result: random data that cancels to a small sum
    (-0.026 from 120 standard normals, seen on an H200) is measured against the sum of |x|."""
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape
    assert not np.isnan(got).any(), "NaN in the output (an element was not written)"
    ref = np.abs(want if scale is None else np.asarray(scale, np.float64)).max()
    return float(np.abs(got - want).max() / max(ref, 1e-30)) if want.size else 0.0


def scale_of(x64, op, axis, keepdims=False):
    """What a reduction's rounding is relative to: the same sum over |x| for the sums."""
    if op in ("add", "avg"):
        return reduction_ref(np.abs(x64), op, axis, keepdims)
    return None


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_every_op_dtype_layout_and_axes(op, dtype, layout):
    x, x64 = dev(data((2, 3, 4, 5), op), dtype, layout)
    for axis in AXES:
        for keepdims in (False, True):
            want = reduction_ref(x64, op, axis, keepdims)
            out = poisoned(want.shape, dtype)
            got = dnn_reduction(x, op, axis, keepdims, out=out)
            assert got is out
            scale = scale_of(x64, op, axis, keepdims)
            assert err(out.get(), want, scale) <= TOL[dtype], (axis, keepdims)
        y = dnn_reduction(x, op, (1, 2))  # a new output
        assert y.shape == (2, 5) and y.dtype == np.dtype(dtype)
        want = reduction_ref(x64, op, (1, 2))
        assert err(y.get(), want, scale_of(x64, op, (1, 2))) <= TOL[dtype]


@pytest.mark.parametrize(
    ("dtype", "out_dtype", "tol"), [("float16", "float32", 1e-5), ("float32", "float16", 2e-3)]
)
@pytest.mark.parametrize("op", ("add", "max", "avg", "norm2"))
def test_mixed_output_dtypes(op, dtype, out_dtype, tol):
    x, x64 = dev(data((3, 4, 5, 6), op), dtype)
    got = dnn_reduction(x, op, (0, 2), dtype=out_dtype)
    assert got.dtype == np.dtype(out_dtype)
    assert err(got.get(), reduction_ref(x64, op, (0, 2)), scale_of(x64, op, (0, 2))) <= tol


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ("max", "min", "amax"))
@pytest.mark.parametrize("axis", (1, (1, 3), None, (0, 2)))
def test_indices_are_flattened_over_the_reduced_axes(op, dtype, axis):
    x, x64 = dev(rng.standard_normal((3, 4, 5, 6)), dtype, "nhwc")
    vals, idx = dnn_reduction(x, op, axis, keepdims=False, return_indices=True)
    assert idx.dtype == np.int32 and idx.shape == vals.shape
    axes = tuple(range(4)) if axis is None else (axis,) if isinstance(axis, int) else axis
    kept = tuple(i for i in range(4) if i not in axes)
    block = x64.transpose(*kept, *axes).reshape(*(x64.shape[i] for i in kept), -1)
    v = np.abs(block) if op == "amax" else block
    i = idx.get().astype(np.int64)
    assert ((i >= 0) & (i < block.shape[-1])).all()
    picked = np.take_along_axis(v, i[..., None], axis=-1)[..., 0]
    want = reduction_ref(x64, op, axis)
    np.testing.assert_array_equal(picked, want)  # the value at the index is the extreme
    assert err(vals.get(), want) <= TOL[dtype]
    if dtype != "float16":  # no ties in float32/64 random data: the very index
        arg = v.argmin(-1) if op == "min" else v.argmax(-1)
        np.testing.assert_array_equal(i, arg)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ("add", "mul", "norm2", "max"))
def test_alpha_beta_blend(op, dtype):
    x, x64 = dev(data((2, 3, 4, 5), op), dtype)
    prior = rng.standard_normal((3, 5)).astype(dtype)
    out = pycudnn.to_device(prior)
    dnn_reduction(x, op, (0, 2), alpha=-1.5, beta=0.5, out=out)
    # alpha multiplies the reduced value (for mul: alpha * prod, not prod(alpha * x))
    want = -1.5 * reduction_ref(x64, op, (0, 2)) + 0.5 * prior.astype(np.float64)
    assert err(out.get(), want) <= 2 * TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_nothing_to_reduce(op, dtype):
    """Axes of size 1 (or none): cuDNN refuses such a reduction; the result is element-wise."""
    x64 = data((2, 1, 4, 3), op)
    x64[0, 0, 0, :] = [0.0, -2.0, 3.0]
    x, x64 = dev(x64, dtype, "sliced")
    for axis, keepdims in ((1, False), ((), True), ((1,), True)):
        want = reduction_ref(x64, op, axis, keepdims)
        out = poisoned(want.shape, dtype)
        dnn_reduction(x, op, axis, keepdims, out=out)
        assert err(out.get(), want) <= TOL[dtype], axis
    if op in ("min", "max", "amax"):
        _vals, idx = dnn_reduction(x, op, 1, return_indices=True)
        assert (idx.get() == 0).all()
    out = pycudnn.to_device(np.ones((2, 4, 3), dtype))
    dnn_reduction(x, op, 1, alpha=2.0, beta=-1.0, out=out)
    assert err(out.get(), 2 * reduction_ref(x64, op, 1) - 1) <= 2 * TOL[dtype]


@pytest.mark.parametrize(("op", "value"), [("add", 0.0), ("mul", 1.0), ("norm2", 0.0)])
def test_empty_reductions(op, value):
    x = pycudnn.empty((3, 0, 2), np.float32)
    got = dnn_reduction(x, op, 1)
    np.testing.assert_array_equal(got.get(), np.full((3, 2), value, np.float32))
    out = pycudnn.to_device(np.full((3, 2), 4.0, np.float32))
    dnn_reduction(x, op, 1, alpha=3.0, beta=0.5, out=out)
    np.testing.assert_array_equal(out.get(), np.full((3, 2), 3 * value + 2, np.float32))
    assert np.isnan(dnn_reduction(x, "avg", 1).get()).all()
    assert dnn_reduction(x, op, 0).shape == (0, 2)


def test_strided_output_and_high_rank():
    x, x64 = dev(rng.standard_normal((2, 2, 3, 2, 2, 2, 3, 2)), "float32")
    want = reduction_ref(x64, "add", (1, 3, 5, 7))
    big = poisoned((2, 3, 2, 3, 2), np.float32)
    out = big[..., 0]  # a strided (non-dense) view
    dnn_reduction(x, "add", (1, 3, 5, 7), out=out)
    assert err(out.get(), want, scale_of(x64, "add", (1, 3, 5, 7))) <= TOL["float32"]
    v, v64 = dev(rng.standard_normal(11), "float64")
    assert err(dnn_reduction(v, "norm2").get(), reduction_ref(v64, "norm2")) <= 1e-12


def test_nan_propagates():
    x64 = rng.standard_normal((2, 3, 4))
    x64[1, 2, 3] = np.nan
    got = dnn_reduction(pycudnn.to_device(x64.astype(np.float32)), "max", (1, 2)).get()
    assert np.isnan(got[1]) and not np.isnan(got[0])


def test_repeated_calls_and_new_pointers():
    for _ in range(3):
        x, x64 = dev(rng.standard_normal((4, 5, 6)), "float32")
        got = dnn_reduction(x, "add", (0, 2)).get()
        assert err(got, x64.sum((0, 2)), np.abs(x64).sum((0, 2))) <= 1e-5


@pytest.mark.parametrize("dtype", ("float32", "float64"))
def test_equal_to_torch(dtype):
    torch = pytest.importorskip("torch")
    t = torch.randn(3, 4, 5, 6, device="cuda", dtype=getattr(torch, dtype))
    t = t.to(memory_format=torch.channels_last)
    tol = TOL[dtype] * 10
    cases = [
        ("amax", (1, 3), torch.amax(t.abs(), dim=(1, 3))),  # cuDNN's amax: max of |x|
        ("max", 2, torch.amax(t, dim=2)),
        ("min", None, torch.amin(t)),
        ("add", (0, 2), torch.sum(t, dim=(0, 2))),
        ("avg", 1, torch.mean(t, dim=1)),
        ("mul", 3, torch.prod(t, dim=3)),
        ("norm2", (2, 3), torch.linalg.vector_norm(t, 2, dim=(2, 3))),
        ("norm1", 1, torch.linalg.vector_norm(t, 1, dim=1)),
    ]
    for op, axis, want in cases:
        got = torch.as_tensor(dnn_reduction(t, op, axis), device="cuda")
        scale = want.abs().max().clamp_min(1e-30)
        assert ((got - want).abs().max() / scale).item() <= tol, op
    out = torch.full((3, 5), float("nan"), device="cuda", dtype=t.dtype)
    vals, idx = dnn_reduction(t, "max", (1, 3), return_indices=True, out=out)
    assert vals is out and torch.equal(out, torch.amax(t, dim=(1, 3)))
    flat = t.permute(0, 2, 1, 3).reshape(3, 5, -1)
    assert torch.equal(torch.as_tensor(idx, device="cuda").long(), flat.argmax(-1))


def test_docs_page_examples_run():
    """The examples of docs/ops_more.md (this group's page) run in order, as written."""
    pytest.importorskip("torch")
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "ops_more.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert len(blocks) >= 6
    namespace = {"__name__": "docs"}
    for block in blocks:
        exec(compile(block, "docs/ops_more.md", "exec"), namespace)
