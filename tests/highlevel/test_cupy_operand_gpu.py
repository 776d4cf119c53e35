"""CuPy arrays read from their attributes describe the same memory as the protocol reader
(``pycudnn.asarray``) on real CuPy arrays, and a call on them is right. Marker ``gpu``."""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

import pycudnn  # noqa: E402
from pycudnn.highlevel import _operand  # noqa: E402

pytestmark = pytest.mark.gpu


def _views():
    base = cupy.arange(2 * 3 * 8 * 8, dtype=cupy.float32).reshape(2, 3, 8, 8)
    yield "packed", base
    yield "transposed", base.transpose(0, 2, 3, 1)
    yield "sliced with an offset", base[1:, :, 2:, 1::2]
    yield "float16", base.astype(cupy.float16)
    yield "empty", base[:0]


@pytest.mark.parametrize("name", [n for n, _ in _views()])
def test_attributes_match_the_protocol_reader(name):
    a = dict(_views())[name]
    ptr, shape, strides, dt, dev = _operand.raw_operand(a)
    v = pycudnn.asarray(a)
    if a.size == 0:  # CuPy's interface says 0 for an empty array, its data.ptr the base's
        ptr = v.ptr
    assert (ptr, tuple(shape), tuple(strides), dev) == (
        v.ptr,
        tuple(v.shape),
        tuple(s // v.dtype.itemsize for s in v.strides),
        v.device,
    )
    assert dt == _operand.data_type(v.dtype)


def test_a_call_on_cupy_arrays_is_right():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 9, 9)).astype(np.float32)
    w = rng.standard_normal((5, 4, 3, 3)).astype(np.float32)
    y = pycudnn.dnn_conv(cupy.asarray(x), cupy.asarray(w), border_mode="valid", conv_mode="cross")
    got = np.asarray(y.get(), np.float64)
    want = np.zeros((2, 5, 7, 7))
    for i in range(3):
        for j in range(3):
            want += np.einsum("nchw,kc->nkhw", x[:, :, i : i + 7, j : j + 7], w[:, :, i, j])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)  # float32, TF32 off by default
