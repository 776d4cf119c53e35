"""GPU tests of transformers' RMS norms converted (marker ``gpu``; skipped without a device,
torch or transformers): ``LlamaRMSNorm`` against its converted twin (cuDNN's RMS norm) and a
float64 reference, forward and both gradients, bfloat16, float16 and float32, training rows, an
odd row count and one decode row: the twin within twice transformers' own distance to float64
(it rounds once where transformers rounds twice), and its calls bound after the first.

Run on the GPU machine: ``PYTHONPATH=. python3 -m pytest -m gpu -q
tests/torch_adapter/test_torch_transformers_norm_gpu.py``.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import pycudnn.torch as pt  # noqa: E402
from pycudnn.torch import _binding, _module  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = "cuda"
FLOOR = {torch.bfloat16: 1e-3, torch.float16: 1e-4, torch.float32: 1e-6}


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [(4, 64, 1024), (3, 5, 4096), (1, 1, 2048)], ids=str)
def test_the_twin_is_within_transformers_own_distance_to_float64(dtype, shape):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(sum(shape))
    ref = LlamaRMSNorm(shape[-1], eps=1e-6).to(DEV, dtype)
    with torch.no_grad():
        ref.weight.normal_(1.0, 0.3)
    mine = pt.convert(copy.deepcopy(ref), strict=True)
    assert type(mine) is not LlamaRMSNorm
    x = torch.randn(shape, device=DEV, dtype=dtype) * 3
    dy = torch.randn(shape, device=DEV, dtype=dtype)
    x64 = x.double().requires_grad_(True)
    w64 = ref.weight.detach().double().requires_grad_(True)
    y64 = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * w64
    y64.backward(dy.double())
    want = (y64.detach(), x64.grad, w64.grad)
    got = {}
    for name, m in (("transformers", ref), ("pycudnn", mine)):
        xi = x.clone().requires_grad_(True)
        y = m(xi)
        y.backward(dy)
        got[name] = (y.detach(), xi.grad, m.weight.grad)
    for i, what in enumerate(("output", "input gradient", "weight gradient")):
        a, b = got["pycudnn"][i], got["transformers"][i]
        assert a.dtype == b.dtype and torch.isfinite(a).all(), what
        mine_err, theirs = _rel(a, want[i]), _rel(b, want[i])
        assert mine_err <= 2 * theirs + FLOOR[dtype], (what, mine_err, theirs)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(mine(x), got["pycudnn"][0])
    assert _binding.latest(_module.state(mine)).hits >= 1  # the repeated call is the bound launch
