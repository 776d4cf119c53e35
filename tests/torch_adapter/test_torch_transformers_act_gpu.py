"""GPU tests of transformers' tanh GELUs converted (marker ``gpu``; skipped without a device,
torch or transformers).

* ``NewGELUActivation`` and ``FastGELUActivation`` against their twins (torch's fused tanh GELU)
  and a float64 reference, output and input gradient, bfloat16, float16 and float32: the twin
  within twice transformers' own distance to float64 (it rounds once where the formula rounds
  at each of its steps).
* A GPT-2 built from a small config (no weights) in bfloat16, converted (its layer norms and
  GELUs) and run with ``attn_implementation="pycudnn"``, against the same model unconverted with
  ``"sdpa"`` and a float32 copy: logits and every parameter's gradient of the language-model
  loss within twice torch's own bfloat16 distance to float32 (at least 2e-2, relative L2); a
  greedy decode gives the unconverted model's tokens.

Run on the GPU machine: ``PYTHONPATH=. python3 -m pytest -m gpu -q
tests/torch_adapter/test_torch_transformers_act_gpu.py``.
"""

from __future__ import annotations

import copy
import math

import pytest

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")

import torch_gpu  # noqa: E402  (tests/support)

import pycudnn.torch as pt  # noqa: E402
from pycudnn.torch import transformers_act  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = "cuda"
FLOOR = {torch.bfloat16: 1e-3, torch.float16: 1e-4, torch.float32: 1e-6}


@pytest.fixture(autouse=True)
def _exact_math():
    with torch_gpu.exact_math():
        yield


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("name", ["NewGELUActivation", "FastGELUActivation"])
def test_the_twin_is_within_transformers_own_distance_to_float64(dtype, name):
    from transformers import activations

    ref = getattr(activations, name)()
    mine = pt.convert(getattr(activations, name)(), strict=True)
    assert isinstance(mine, transformers_act.TransformersGELU)
    torch.manual_seed(3)
    x = torch.randn(4, 128, 4096, device=DEV, dtype=dtype) * 3
    dy = torch.randn_like(x)
    x64 = x.double().requires_grad_(True)
    c = math.sqrt(2 / math.pi)
    y64 = 0.5 * x64 * (1 + torch.tanh(c * (x64 + 0.044715 * x64**3)))
    y64.backward(dy.double())
    want = (y64.detach(), x64.grad)
    got = {}
    for side, m in (("transformers", ref), ("pycudnn", mine)):
        xi = x.clone().fill_(float("nan")).copy_(x).requires_grad_(True)
        y = m(xi)
        y.backward(dy)
        got[side] = (y.detach(), xi.grad)
    for i, what in enumerate(("output", "input gradient")):
        a, b = got["pycudnn"][i], got["transformers"][i]
        assert a.dtype == b.dtype == dtype and torch.isfinite(a).all(), what
        mine_err, theirs = _rel(a, want[i]), _rel(b, want[i])
        assert mine_err <= 2 * theirs + FLOOR[dtype], (what, mine_err, theirs)


def _gpt2(attn: str) -> tuple:
    cfg = tf.GPT2Config(
        vocab_size=256, n_positions=128, n_embd=256, n_layer=2, n_head=4,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    f32 = tf.GPT2LMHeadModel._from_config(cfg, attn_implementation="sdpa").to(DEV)
    ref = copy.deepcopy(f32).to(torch.bfloat16)
    mine = copy.deepcopy(ref)
    pt.register_transformers()
    mine.set_attn_implementation(attn)
    pt.convert(mine)
    return f32, ref, mine


def test_a_converted_gpt2_trains_and_decodes_as_torchs():
    f32, ref, mine = _gpt2("pycudnn")
    acts = [m for m in mine.modules() if isinstance(m, transformers_act.TransformersGELU)]
    assert len(acts) == 2
    torch.manual_seed(1)
    ids = torch.randint(0, 256, (4, 96), device=DEV)
    run = torch_gpu.lm_grads
    torch_gpu.assert_lm_agree(run(mine, ids), run(ref, ids), run(f32, ids))
    prompt = ids[:, :16]
    with torch.no_grad():
        kw = {"max_new_tokens": 12, "do_sample": False, "pad_token_id": 0}
        a = mine.eval().generate(prompt, **kw)
        b = ref.eval().generate(prompt, **kw)
    assert (a == b).float().mean().item() >= 0.9, (a, b)  # bfloat16 ties may differ late
