"""GPU tests of pycudnn's own fold kernel (marker ``gpu``; skipped without a device or torch):
``fold_kernel.fold_weights`` is torch's float32 multiply rounded once, bit for bit, for every
input and output dtype pair, both memory orders and more weights than one launch's table, with
outputs poisoned with NaN, on both of its paths (8 elements a thread, and one a thread for rows
that are no whole 16-byte vectors or pointers off 16 bytes); ``warm`` loads every kernel so that
a capture folds with them; a weight it leaves to torch is left untouched; inside a CUDA graph
capture the replay folds the values of its moment, and a kernel that has not run on the device
yet leaves the capture to torch; ``fold_kernel.fold_vectors`` is ``region_folds``' torch
operations bit for bit (mixed vector dtypes, absent affine parameters and biases);
``region_folds.fold`` on the GPU equals each chain's own ``fold_params``.

Run on the GPU machine: ``PYTHONPATH=. python3 -m pytest -m gpu -q
tests/torch_adapter/test_torch_fold_kernel_gpu.py``.
"""

from __future__ import annotations

from collections import OrderedDict

import pytest

torch = pytest.importorskip("torch")

from pycudnn.torch import fold_kernel, region_folds  # noqa: E402
from pycudnn.torch._runtime import stream_of  # noqa: E402
from pycudnn.torch.fused import fold_params  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = "cuda"
CL = torch.channels_last
HALF = (torch.float16, torch.bfloat16, torch.float32)
SHAPES = [(64, 3, 7, 7), (64, 64, 1, 1), (64, 64, 3, 3), (256, 64, 1, 1), (128, 256, 1, 1),
          (512, 512, 3, 3), (3, 5, 2, 2)]  # fmt: skip


@pytest.fixture(autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


def _case(n: int, wdt, odt, fmt):
    ws = [torch.randn(SHAPES[i % len(SHAPES)], device=DEV).to(wdt).to(memory_format=fmt)
          for i in range(n)]  # fmt: skip
    scale = torch.rand(sum(w.shape[0] for w in ws), device=DEV) * 3 + 0.01
    outs = [torch.full_like(w, float("nan"), dtype=odt) for w in ws]
    return ws, scale, outs


def _want(ws, scale, odt):
    parts = scale.split([w.shape[0] for w in ws])
    return [(w.float() * s.view(-1, 1, 1, 1)).to(odt) for w, s in zip(ws, parts, strict=True)]


@pytest.mark.parametrize("fmt", [torch.contiguous_format, CL], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("odt", HALF, ids=str)
@pytest.mark.parametrize("wdt", HALF, ids=str)
def test_the_kernel_is_torchs_multiply_bit_for_bit(wdt, odt, fmt):
    n = fold_kernel.MAX_JOBS + 9  # two launches of one kernel
    ws, scale, outs = _case(n, wdt, odt, fmt)
    left = fold_kernel.fold_weights(ws, scale, outs, stream_of(scale))
    assert left == [] and fold_kernel.SOURCE.failed is None, fold_kernel.SOURCE.failed
    for i, (got, want) in enumerate(zip(outs, _want(ws, scale, odt), strict=True)):
        assert torch.equal(got, want), (i, got.shape)


@pytest.mark.parametrize("odt", HALF, ids=str)
def test_unaligned_weights_and_outputs_take_the_one_element_path(odt):
    # rows of whole 8-element vectors, but pointers 2 or 4 bytes off 16: one element a thread
    ws, scale, outs = _case(4, torch.bfloat16, odt, torch.contiguous_format)
    ws = [torch.cat([w.new_zeros(1), w.flatten()])[1:].view(w.shape) for w in ws]
    outs = [torch.full((o.numel() + 1,), float("nan"), device=DEV, dtype=odt)[1:].view(o.shape)
            for o in outs]  # fmt: skip
    assert all(w.data_ptr() % 16 for w in ws) and all(o.data_ptr() % 16 for o in outs)
    assert fold_kernel.fold_weights(ws, scale, outs, stream_of(scale)) == []
    want = _want(ws, scale, odt)
    assert all(torch.equal(a, b) for a, b in zip(outs, want, strict=True))


def test_a_weight_in_another_layout_is_left_untouched():
    ws, scale, outs = _case(4, torch.bfloat16, torch.bfloat16, CL)
    outs[2] = torch.full(ws[2].shape, float("nan"), device=DEV, dtype=torch.bfloat16)  # NCHW
    left = fold_kernel.fold_weights(ws, scale, outs, stream_of(scale))
    assert left == [2] and outs[2].isnan().all()
    want = _want(ws, scale, torch.bfloat16)
    assert all(torch.equal(outs[i], want[i]) for i in (0, 1, 3))


def test_a_captured_fold_replays_the_values_of_its_moment():
    ws, scale, outs = _case(6, torch.bfloat16, torch.bfloat16, CL)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compiles and loads the kernel
        assert fold_kernel.fold_weights(ws, scale, outs, stream_of(scale)) == []
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        assert fold_kernel.fold_weights(ws, scale, outs, stream_of(scale)) == []
    for step in range(3):
        with torch.no_grad():
            for w in ws:
                w.normal_()
            scale.uniform_(0.5, 2.0 + step)
            for o in outs:
                o.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        want = _want(ws, scale, torch.bfloat16)
        assert all(torch.equal(a, b) for a, b in zip(outs, want, strict=True)), step


def test_inside_a_capture_a_kernel_not_yet_run_on_the_device_is_left_to_torch(monkeypatch):
    monkeypatch.setattr(fold_kernel, "_WARM", set())  # (as in a fresh process)
    ws, scale, outs = _case(3, torch.float16, torch.float16, CL)
    vec = [torch.empty(4, 1, 1, 1, device=DEV), None, None, None, torch.zeros(4, device=DEV),
           torch.ones(4, device=DEV)]  # fmt: skip
    bias = torch.empty(4, device=DEV, dtype=torch.float16)
    s = stream_of(scale)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        left = fold_kernel.fold_weights(ws, scale, outs, s)
        vectors = fold_kernel.fold_vectors(vec, [1e-5], [4], bias, s, 6)
    assert left == [0, 1, 2] and vectors is None and fold_kernel.SOURCE.failed is None
    assert fold_kernel.fold_weights(ws, scale, outs, s) == []  # run here now: loaded
    assert fold_kernel.fold_vectors(vec, [1e-5], [4], bias, s, 6) is not None
    assert (scale.get_device(), "fold_f16_f16") in fold_kernel._WARM


def test_warm_loads_every_kernel_so_a_capture_folds_with_them(monkeypatch):
    monkeypatch.setattr(fold_kernel, "_WARM", set())  # (as in a fresh process)
    ws, scale, outs = _case(3, torch.bfloat16, torch.bfloat16, CL)
    fold_kernel.warm(scale.device)
    assert len(fold_kernel._WARM) == 12 and fold_kernel.SOURCE.failed is None
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        left = fold_kernel.fold_weights(ws, scale, outs, stream_of(scale))
    assert left == []
    for o in outs:
        o.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    want = _want(ws, scale, torch.bfloat16)
    assert all(torch.equal(a, b) for a, b in zip(outs, want, strict=True))


@pytest.mark.parametrize("pdt", HALF, ids=str)
@pytest.mark.parametrize("odt", HALF, ids=str)
def test_the_vectors_kernel_is_torchs_operations_bit_for_bit(odt, pdt):
    """``fold_vectors`` against ``region_folds``' torch operations: more chains than one
    launch's table, vectors in *pdt* (the convolution bias in float32 on every third chain),
    chains without batch norm's affine parameters or a convolution bias among ones with them,
    epsilons differing, outputs poisoned with NaN."""
    n = fold_kernel.MAX_VECS + 7
    sizes = [(16, 64, 3, 256, 5)[i % 5] for i in range(n)]
    params, eps = [], []
    for i, c in enumerate(sizes):
        cb = torch.randn(c, device=DEV) if i % 3 == 0 else None
        gamma = None if i % 4 == 1 else torch.rand(c, device=DEV).to(pdt) * 2 + 0.1
        beta = None if i % 4 == 1 else torch.randn(c, device=DEV).to(pdt)
        mean, var = torch.randn(c, device=DEV).to(pdt), torch.rand(c, device=DEV).to(pdt) + 1e-3
        params += [torch.empty(c, 1, 1, 1, device=DEV), cb, gamma, beta, mean, var]
        eps.append(1e-5 * (1 + i % 3))
    total = sum(sizes)
    bias = torch.full((total,), float("nan"), device=DEV, dtype=odt)
    scale = fold_kernel.fold_vectors(params, eps, sizes, bias, stream_of(bias), 6)
    assert scale is not None and fold_kernel.SOURCE.failed is None, fold_kernel.SOURCE.failed
    want_bias = torch.full_like(bias, float("nan"))
    want_scale = region_folds._vectors(params, eps, want_bias, sizes)
    assert torch.equal(scale, want_scale) and torch.equal(bias, want_bias)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_region_folds_equal_each_chains_own_fold(dtype, monkeypatch):
    """Every chain's fold at once (the kernel for the weights) equals ``fold_params`` per
    chain, bitwise; with the kernel off (torch's multiply) too."""
    g = torch.Generator(device="cpu").manual_seed(7)
    params, eps = [], []
    for i, shape in enumerate(SHAPES):
        c = shape[0]
        vec = [torch.rand(c, generator=g) * 2 + 0.1, torch.randn(c, generator=g),
               torch.randn(c, generator=g), torch.rand(c, generator=g) + 0.5]  # fmt: skip
        cb = torch.randn(c, generator=g) if i % 2 else None
        w = torch.randn(shape, generator=g)
        params += [t if t is None else t.to(DEV) for t in (w, cb, *vec)]
        eps.append(1e-5 * (i + 1))
    params[0::6] = [w.to(dtype) for w in params[0::6]]
    x = torch.randn(2, 3, 8, 8, device=DEV, dtype=dtype).to(memory_format=CL)
    for enabled in (True, False):
        monkeypatch.setattr(fold_kernel, "ENABLED", enabled)
        ws, bs = region_folds.fold(OrderedDict(), params, eps, x, CL)
        for i, (w, b) in enumerate(zip(ws, bs, strict=True)):
            w0, b0 = fold_params(*params[6 * i : 6 * i + 6], eps[i], dtype)
            assert torch.equal(w, w0.to(memory_format=CL)) and torch.equal(b, b0), (enabled, i)
