"""GPU tests of module bindings (:mod:`pycudnn.torch._binding`; marker ``gpu``, skipped without a
device or without torch): a converted ``LayerNorm``, ``RMSNorm`` and ``Linear`` called again and
again with fresh inputs of one signature run their bound cuDNN launches (forward, and the
backward's), and give torch's results every time.

Run on the GPU machine:
``PYTHONPATH=. python3 -m pytest -m gpu -q tests/torch_adapter/test_torch_binding_gpu.py``.

Each case runs five forward + backward steps and three without a gradient, fresh random inputs
each, against ``torch.nn``'s module with the same parameters: outputs and the input and
parameter gradients within the dtype's tolerance of max |torch's| (float16 1e-2, bfloat16 4e-2),
and the binding was hit (the forward from the second call, the backward from the third). A
signature change in between (another row count) runs the checked path and binds anew, and the
old signature then binds again: no stale launch on another shape.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import torch_gpu  # noqa: E402  (tests/support)

import pycudnn  # noqa: E402  (torch first: both then use the same libcudnn)
import pycudnn.torch as pt  # noqa: E402
from pycudnn.torch import _binding, _module  # noqa: E402

pytestmark = pytest.mark.gpu

DEV = "cuda"
TOL = {torch.float16: 1e-2, torch.bfloat16: 4e-2}


@pytest.fixture(autouse=True)
def _settings():
    with torch_gpu.exact_math():
        pycudnn.clear_caches()
        yield


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert torch.isfinite(got).all()
    err = (got.float() - want.float()).abs().max().item()
    scale = max(want.float().abs().max().item(), 1e-3)
    assert err <= TOL[want.dtype] * scale, (err, scale)


MAKERS = {
    "layer_norm": lambda dt: nn.LayerNorm(512, device=DEV, dtype=dt),
    "rms_norm": lambda dt: nn.RMSNorm(512, eps=1e-6, device=DEV, dtype=dt),
    "linear": lambda dt: nn.Linear(512, 384, device=DEV, dtype=dt),
    "linear_nobias": lambda dt: nn.Linear(512, 384, bias=False, device=DEV, dtype=dt),
}


def _pair(kind: str, dt: torch.dtype):
    if kind == "rms_norm" and not hasattr(nn, "RMSNorm"):
        pytest.skip("torch.nn.RMSNorm needs torch >= 2.4")
    torch.manual_seed(0)
    ref = MAKERS[kind](dt)
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.05 if kind.startswith("linear") else 1.0).add_(
                0 if kind.startswith("linear") else 1.0
            )
    return ref, pt.convert(copy.deepcopy(ref), strict=True)


def _step(ref, mine, rows: int, dt: torch.dtype) -> None:
    x = torch.randn(rows, 8, 512, device=DEV, dtype=dt)
    xr, xm = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    yr, ym = ref(xr), mine(xm)
    _close(ym, yr)
    dy = torch.randn_like(yr)
    want = torch.autograd.grad(yr, (xr, *ref.parameters()), dy)
    got = torch.autograd.grad(ym, (xm, *mine.parameters()), dy)
    for g, w in zip(got, want, strict=True):
        _close(g, w)


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_bound_calls_give_torchs_results(kind, dt):
    ref, mine = _pair(kind, dt)
    for _ in range(5):
        _step(ref, mine, 4, dt)
    bd = _binding.latest(_module.state(mine))
    assert bd is not None and bd.hits == 4  # every call after the first
    assert bd.grads, "the backward bound no entry"
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(4, 8, 512, device=DEV, dtype=dt)
            _close(mine(x), ref(x))
    assert _binding.latest(_module.state(mine)).hits == 2


@pytest.mark.parametrize("kind", ["layer_norm", "linear"])
def test_a_new_signature_binds_too_and_the_old_one_runs_right_again(kind):
    """A second signature binds beside the first; back at the first, its binding launches
    again (every call right, torch's results)."""
    dt = torch.bfloat16
    ref, mine = _pair(kind, dt)
    for rows in (4, 4, 4, 2, 2, 2, 4, 4, 4):
        _step(ref, mine, rows, dt)
    bound = _module.state(mine)["bound"]
    assert [b.sig[1][0] for b in bound.values()] == [2, 4]  # least recently used first
    assert [b.hits for b in bound.values()] == [2, 5]
