"""CPU tests of the spatial transformer functions (no GPU): the validation catalogue, Theano's
output size, staging of strided theta/grid, the C calls and pointer roles, composition of
dnn_spatialtf and its gradient, call caching."""

from __future__ import annotations

import _fake_device as fd
import numpy as np
import pytest
from _fake_device import BF16, F16, F64, Fake

from pycudnn.highlevel import spatialtf
from pycudnn.highlevel.spatialtf import (
    dnn_spatialtf,
    dnn_spatialtf_grad,
    dnn_spatialtf_grid,
    dnn_spatialtf_grid_grad,
    dnn_spatialtf_sampler,
    dnn_spatialtf_sampler_grad,
    output_shape,
)

no_c, capture = fd.no_c, fd.capture  # fixtures
N, C, H, W = 2, 3, 5, 6
IMG, THETA, GRID = (N, C, H, W), (N, 2, 3), (N, 4, 7, 2)

BAD = [
    (dnn_spatialtf_grid, (np.zeros(THETA, np.float32), (N, C, 4, 7)), {}, TypeError, "to_device"),
    (dnn_spatialtf_grid, (Fake(THETA, BF16), (N, C, 4, 7)), {}, TypeError, "unsupported dtype"),
    (dnn_spatialtf_grid, (Fake((N, 3, 2)), (N, C, 4, 7)), {}, ValueError, "expected (N, 2, 3)"),
    (dnn_spatialtf_grid, (Fake(THETA), (N, C, 4)), {}, ValueError, "out_shape must be 4 ints"),
    (dnn_spatialtf_grid, (Fake(THETA), 7), {}, TypeError, "out_shape must be 4 ints"),
    (dnn_spatialtf_grid, (Fake(THETA), (N, C, 4.0, 7)), {}, TypeError, "4 ints"),
    (dnn_spatialtf_grid, (Fake(THETA), (N, C, 0, 7)), {}, ValueError, "C, H, W >= 1"),
    (dnn_spatialtf_grid, (Fake(THETA), (3, C, 4, 7)), {}, ValueError, "theta has N=2"),
    (
        dnn_spatialtf_grid,
        (Fake(THETA), (N, C, 4, 7)),
        {"out": Fake((N, 4, 7, 2), strides=(56, 2, 8, 1))},
        ValueError,
        "must be C-contiguous",
    ),
    (
        dnn_spatialtf_grid,
        (Fake(THETA), (N, C, 4, 7)),
        {"out": Fake((N, 7, 4, 2))},
        ValueError,
        "out has shape",
    ),
    (dnn_spatialtf_grid_grad, (Fake((N, 4, 7, 3)),), {}, ValueError, "expected (N, H, W, 2)"),
    (dnn_spatialtf_grid_grad, (Fake(GRID),), {"out": Fake((N, 2, 3), F64)}, TypeError, "float64"),
    (dnn_spatialtf_sampler, (Fake((N, C, H)), Fake(GRID)), {}, ValueError, "expected (N, C, H, W)"),
    (
        dnn_spatialtf_sampler,
        (Fake((N, 0, H, W)), Fake(GRID)),
        {},
        ValueError,
        "C, H and W must be >= 1",
    ),
    (
        dnn_spatialtf_sampler,
        (Fake(IMG), Fake((3, 4, 7, 2))),
        {},
        ValueError,
        "expected (2, H, W, 2)",
    ),
    (
        dnn_spatialtf_sampler,
        (Fake(IMG), Fake(GRID, F16)),
        {},
        TypeError,
        "img is float32 but grid is float16",
    ),
    (dnn_spatialtf_sampler, (Fake(IMG), Fake(GRID, device=1)), {}, ValueError, "grid on device 1"),
    (
        dnn_spatialtf_sampler,
        (Fake(IMG), Fake(GRID)),
        {"beta": 1.0},
        ValueError,
        "beta=1.0 blends into out",
    ),
    (
        dnn_spatialtf_sampler,
        (Fake(IMG), Fake(GRID)),
        {"out": Fake(IMG)},
        ValueError,
        "out has shape (2, 3, 5, 6), expected (2, 3, 4, 7)",
    ),
    (
        dnn_spatialtf_sampler,
        (Fake(IMG, strides=(90, 30, 6, 0)), Fake(GRID)),
        {},
        ValueError,
        "zero (broadcast) stride",
    ),
    (
        dnn_spatialtf_sampler_grad,
        (Fake(IMG), Fake(GRID), Fake(IMG)),
        {},
        ValueError,
        "dy has shape (2, 3, 5, 6)",
    ),
    (
        dnn_spatialtf_sampler_grad,
        (Fake(IMG), Fake(GRID), Fake((N, C, 4, 7))),
        {"out": Fake(IMG)},
        TypeError,
        "out must be None or a pair",
    ),
    (
        dnn_spatialtf_sampler_grad,
        (Fake(IMG), Fake(GRID), Fake((N, C, 4, 7))),
        {"beta": 2.0, "out": (Fake(IMG), None)},
        ValueError,
        "beta=2.0 blends",
    ),
    (
        dnn_spatialtf_sampler_grad,
        (Fake(IMG), Fake(GRID), Fake((N, C, 4, 7))),
        {"out": (None, Fake(GRID, strides=(56, 2, 8, 1)))},
        ValueError,
        "out[1] (dgrid) has strides",
    ),
    (
        dnn_spatialtf,
        (Fake(IMG), Fake(THETA)),
        {"scale_width": 0},
        ValueError,
        "scale_width=0 is out of range",
    ),
    (dnn_spatialtf, (Fake(IMG), Fake((3, 2, 3))), {}, ValueError, "expected (2, 2, 3)"),
    (dnn_spatialtf, (Fake(IMG), Fake(THETA, F64)), {}, TypeError, "img is float32 but theta"),
    (
        dnn_spatialtf,
        (Fake(IMG), Fake(THETA)),
        {"out": Fake((N, C, 4, 7))},
        ValueError,
        "expected (2, 3, 5, 6)",
    ),
    (
        dnn_spatialtf_grad,
        (Fake(IMG), Fake(THETA), Fake((N, C, 4, 7))),
        {},
        ValueError,
        "dy has shape",
    ),
]


@pytest.mark.parametrize(("fn", "args", "kwargs", "exc", "fragment"), BAD)
def test_rejects_before_any_c_call(no_c, fn, args, kwargs, exc, fragment):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert fragment in str(info.value)
    assert fn.__name__ in str(info.value) or fragment == "to_device"


@pytest.mark.parametrize(
    ("hw", "scales", "expected"),
    [
        ((5, 6), (1, 1), (5, 6)),
        ((5, 6), (2, 0.5), (3, 12)),
        ((5, 5), (1.2, 1.2), (6, 6)),
        ((7, 3), (0.3, 0.5), (4, 1)),
        ((1, 1), (0.01, 0.01), (1, 1)),
    ],
)
def test_output_shape_is_theanos_ceil(hw, scales, expected):
    h, w = hw
    sw, sh = scales
    assert output_shape((2, 3, h, w), sw, sh) == (2, 3, *expected)


def test_grid_calls_and_staging(capture):
    theta = Fake(THETA)
    grid = dnn_spatialtf_grid(theta, (N, 5, 4, 7))
    assert grid.shape == GRID and grid.strides == (56, 14, 2, 1)
    (args,) = capture.of("cudnnSpatialTfGridGeneratorForward")
    assert args[2] == theta.ptr and args[3] == grid.ptr
    assert args[1].shape == (N, 5, 4, 7)
    capture.calls.clear()
    strided = Fake(THETA, strides=(1, 3 * N, N))  # a transposed view: staged through a copy
    dnn_spatialtf_grid(strided, (N, 5, 4, 7))
    assert capture.names() == ["cudnnTransformTensor", "cudnnSpatialTfGridGeneratorForward"]
    copy = capture.of("cudnnTransformTensor")[0]
    assert (
        copy[3] == strided.ptr
        and capture.of("cudnnSpatialTfGridGeneratorForward")[0][2] == (copy[6])
    )


def test_sampler_calls(capture):
    img, grid = Fake(IMG, F64, nhwc=True), Fake(GRID, F64)
    y = dnn_spatialtf_sampler(img, grid, alpha=2.0)
    (args,) = capture.of("cudnnSpatialTfSamplerForward")
    assert (args[4], args[5], args[8]) == (img.ptr, grid.ptr, y.ptr)
    assert args[2]._obj.value == 2.0 and args[6]._obj.value == 0.0
    assert y.shape == (N, C, 4, 7) and y.strides == (84, 1, 21, 3)  # NHWC like img


def test_sampler_grad_calls(capture):
    img, grid, dy = Fake(IMG), Fake(GRID), Fake((N, C, 4, 7))
    dimg, dgrid = dnn_spatialtf_sampler_grad(img, grid, dy)
    (args,) = capture.of("cudnnSpatialTfSamplerBackward")
    assert (args[4], args[7], args[10], args[11], args[13]) == (
        img.ptr,
        dimg.ptr,
        dy.ptr,
        grid.ptr,
        dgrid.ptr,
    )
    assert dimg.shape == IMG and dgrid.shape == GRID
    given = Fake(GRID)
    assert dnn_spatialtf_sampler_grad(img, grid, dy, out=(None, given))[1] is given
    with pytest.raises(ValueError, match="two outputs overlap"):
        dnn_spatialtf_sampler_grad(img, grid, dy, out=(Fake(IMG, ptr=given.ptr), given))
    with pytest.raises(ValueError, match="overlaps an input"):
        dnn_spatialtf_sampler_grad(img, grid, dy, out=(None, grid))


def test_composites(capture):
    img, theta = Fake(IMG), Fake(THETA)
    y = dnn_spatialtf(img, theta, 2, 0.5)
    assert y.shape == (N, C, 3, 12)
    assert capture.names() == [
        "cudnnSpatialTfGridGeneratorForward",
        "cudnnSpatialTfSamplerForward",
    ]
    capture.calls.clear()
    dimg, dtheta = dnn_spatialtf_grad(img, theta, Fake((N, C, 3, 12)), 2, 0.5)
    assert capture.names() == [
        "cudnnSpatialTfGridGeneratorForward",
        "cudnnSpatialTfSamplerBackward",
        "cudnnSpatialTfGridGeneratorBackward",
    ]
    assert dimg.shape == IMG and dtheta.shape == THETA
    dgrid = capture.of("cudnnSpatialTfSamplerBackward")[0][13]
    assert capture.of("cudnnSpatialTfGridGeneratorBackward")[0][2:] == (dgrid, dtheta.ptr)


def test_empty_batch(capture):
    y = dnn_spatialtf(Fake((0, C, H, W)), Fake((0, 2, 3)))
    assert y.shape == (0, C, H, W) and capture.calls == []


def test_second_call_skips_validation(capture, monkeypatch):
    builds = []
    real = spatialtf._build_sampler

    def spy(*args):
        builds.append(args)
        return real(*args)

    monkeypatch.setattr(spatialtf, "_build_sampler", spy)
    for _ in range(3):
        dnn_spatialtf_sampler(Fake(IMG), Fake(GRID))
    assert len(builds) == 1 and len(capture.of("cudnnSpatialTfSamplerForward")) == 3


def test_exports():
    assert set(spatialtf.__all__) == {
        "dnn_spatialtf",
        "dnn_spatialtf_grad",
        "dnn_spatialtf_grid",
        "dnn_spatialtf_grid_grad",
        "dnn_spatialtf_sampler",
        "dnn_spatialtf_sampler_grad",
    }
