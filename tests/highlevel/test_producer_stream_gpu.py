"""Streams follow the producer on the GPU (issue 29): ``dnn_*`` without ``stream=`` on torch
tensors runs on torch's current stream (also while torch captures a CUDA graph there), on CuPy
arrays on CuPy's. Marker ``gpu``."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pycudnn  # noqa: E402  (torch first: both then use the same libcudnn)

pytestmark = pytest.mark.gpu
F = torch.nn.functional


def _conv(x, w):
    return pycudnn.dnn_conv(x, w, border_mode="half", conv_mode="cross", out=torch.empty_like(x))


def test_a_torch_side_stream_is_followed():
    x = torch.randn(4, 8, 16, 16, device="cuda")
    w = torch.randn(8, 8, 3, 3, device="cuda")
    with torch.backends.cudnn.flags(allow_tf32=False):
        want = F.conv2d(x, w, padding=1)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = _conv(x, w)
        assert pycudnn.get_handle().stream == s.cuda_stream
        z = pycudnn.dnn_activation(y, "relu")
    torch.cuda.current_stream().wait_stream(s)
    torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(torch.from_dlpack(z), want.relu(), rtol=1e-4, atol=1e-4)
    _conv(x, w)  # back on the default stream: the handle follows
    assert pycudnn.get_handle().stream == torch.cuda.current_stream().cuda_stream


def test_a_cuda_graph_capture_without_stream_arguments():
    """Without ``stream=`` the calls used to run on the legacy default stream, which CUDA refuses
    while torch captures on its side stream."""
    x = torch.randn(2, 8, 8, 8, device="cuda")
    w = torch.randn(8, 8, 3, 3, device="cuda")
    y = torch.empty_like(x)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up where the capture runs (plans, workspaces)
        pycudnn.dnn_conv(x, w, border_mode="half", conv_mode="cross", out=y)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        pycudnn.dnn_conv(x, w, border_mode="half", conv_mode="cross", out=y)
    x.copy_(torch.randn_like(x))
    y.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    with torch.backends.cudnn.flags(allow_tf32=False):
        torch.testing.assert_close(y, F.conv2d(x, w, padding=1), rtol=1e-4, atol=1e-4)


def test_a_cupy_stream_is_followed():
    cupy = pytest.importorskip("cupy")
    a = cupy.random.standard_normal((2, 3, 4, 5), dtype=cupy.float32)
    with cupy.cuda.Stream(non_blocking=True) as cs:
        out = pycudnn.dnn_activation(a, "relu")
        assert pycudnn.get_handle().stream == cs.ptr
    cs.synchronize()
    np.testing.assert_allclose(out.get(), cupy.maximum(a, 0).get(), rtol=1e-6)
