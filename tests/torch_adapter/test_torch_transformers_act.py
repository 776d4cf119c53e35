"""transformers' tanh GELUs converted (:mod:`pycudnn.torch.transformers_act`) on the CPU.

Classes whose ``forward`` is transformers' ``NewGELUActivation.forward`` or
``FastGELUActivation.forward`` statement for statement (defined here, so the recognition is tested
without transformers; transformers' own classes and a GPT-2 where it is installed) convert to a
twin that computes torch's fused ``gelu(approximate="tanh")``: the formula's values and gradients
in float64, nearer the exact function than the formula in bfloat16, the class's own ``forward``
under autocast and for integer inputs. A different formula stays, with the reason; ``back=True``,
copies and pickles keep or restore the classes; under ``torch.compile`` the twin is one ``gelu``.
"""

from __future__ import annotations

import copy
import math  # (imports, as in transformers: the compiler then emits the same code)
import pickle

import pytest

pytest.importorskip("torch")
import torch

nn = torch.nn
F = torch.nn.functional

from test_torch_transformers_norm import mixin_after_reload  # noqa: E402

from pycudnn import torch as pt  # noqa: E402
from pycudnn.torch import transformers_act, transformers_twins  # noqa: E402


class VerbatimNewGELU(nn.Module):
    """transformers' NewGELUActivation (``gelu_new``), copied as written."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))  # fmt: skip  # noqa: E501


class VerbatimFastGELU(nn.Module):
    """transformers' FastGELUActivation (``gelu_fast``), copied as written."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return 0.5 * input * (1.0 + torch.tanh(input * 0.7978845608 * (1.0 + 0.044715 * input * input)))  # fmt: skip  # noqa: E501


class QuickGELU(nn.Module):
    """transformers' QuickGELUActivation: another function, not a tanh GELU."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return input * torch.sigmoid(1.702 * input)


def _exact(x: torch.Tensor) -> torch.Tensor:
    x = x.double()
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


@pytest.mark.parametrize("cls", [VerbatimNewGELU, VerbatimFastGELU])
def test_a_verbatim_copy_converts_to_torchs_fused_tanh_gelu(cls):
    ref = cls()
    mine = pt.convert(cls(), strict=True)
    assert type(mine) is not cls and isinstance(mine, cls)
    assert isinstance(mine, transformers_act.TransformersGELU) and repr(mine) == repr(ref)
    torch.manual_seed(0)
    x = (torch.randn(4, 7, 33, dtype=torch.float64) * 4).requires_grad_(True)
    y = mine(x)
    torch.testing.assert_close(y, F.gelu(x, approximate="tanh"), rtol=0, atol=0)
    dy = torch.randn_like(y)
    got = torch.autograd.grad(y, x, dy)[0]
    x2 = x.detach().requires_grad_(True)
    y2 = ref(x2)
    want = torch.autograd.grad(y2, x2, dy)[0]
    torch.testing.assert_close(y, y2, rtol=1e-9, atol=1e-10)  # gelu_fast: its constant's 1e-11
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)


def test_in_bfloat16_the_twin_is_nearer_the_exact_function():
    torch.manual_seed(1)
    x = (torch.randn(64, 256) * 3).bfloat16()
    exact = _exact(x)
    mine_err = (pt.convert(VerbatimNewGELU())(x).double() - exact).abs().max().item()
    theirs = (VerbatimNewGELU()(x).double() - exact).abs().max().item()
    assert mine_err <= theirs, (mine_err, theirs)


def test_autocast_and_integer_inputs_run_the_class_own_forward():
    ref, mine = VerbatimNewGELU(), pt.convert(VerbatimNewGELU())
    x = torch.randn(8, 16, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, got = ref(x), mine(x)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    i = torch.arange(-3, 4)
    torch.testing.assert_close(mine(i), ref(i), rtol=0, atol=0)  # float, as the formula's


def test_another_formula_stays_with_its_reason():
    m = QuickGELU()
    assert transformers_twins.twin_of(QuickGELU) is None
    why = pt.unsupported_reason(m)
    assert "is not a module pycudnn.torch converts" in why and "tanh GELUs" in why, why
    assert type(pt.convert(m)) is QuickGELU


def test_back_copies_and_pickles():
    model = pt.convert(nn.Sequential(nn.Linear(8, 8), VerbatimNewGELU(), VerbatimFastGELU()))
    twins = [type(m) for m in model[1:]]
    assert all(t not in (VerbatimNewGELU, VerbatimFastGELU) for t in twins)
    assert [type(m) for m in copy.deepcopy(model)[1:]] == twins
    assert [type(m) for m in pickle.loads(pickle.dumps(model))[1:]] == twins
    row = pt.conversion_report(model)["1"]
    assert row.status == "converted"
    assert row.detail.startswith("pycudnn.torch.TransformersGELU (VerbatimNewGELU)"), row
    pt.convert(model, back=True)
    assert [type(m) for m in model[1:]] == [VerbatimNewGELU, VerbatimFastGELU]


def test_compiled_fullgraph_is_one_gelu():
    torch._dynamo.reset()
    mine = pt.convert(VerbatimNewGELU())
    seen: list[str] = []

    def backend(gm, inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes)
        return gm.forward

    x = torch.randn(5, 9)
    torch.testing.assert_close(
        torch.compile(mine, backend=backend, fullgraph=True)(x), F.gelu(x, approximate="tanh")
    )
    assert any("gelu" in t for t in seen) and not any("tanh" in t for t in seen), seen
    torch._dynamo.reset()


def test_transformers_gpt2_converts_its_gelu(tmp_path):
    transformers = pytest.importorskip("transformers")
    from transformers.activations import (
        FastGELUActivation,
        NewGELUActivation,
        QuickGELUActivation,
    )

    assert transformers_twins.twin_of(NewGELUActivation) is not None
    assert transformers_twins.twin_of(FastGELUActivation) is not None
    assert transformers_twins.twin_of(QuickGELUActivation) is None
    cfg = transformers.GPT2Config(
        n_embd=32, n_layer=2, n_head=2, n_positions=16, vocab_size=64,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    ref = transformers.GPT2LMHeadModel(cfg).eval()
    mine = pt.convert(copy.deepcopy(ref))
    acts = [m for m in mine.modules() if isinstance(m, NewGELUActivation)]
    assert len(acts) == 2 and all(type(m) is not NewGELUActivation for m in acts)
    report = pt.conversion_report(mine)
    assert report["transformer.h.0.mlp.act"].status == "converted"
    ids = torch.randint(0, 64, (2, 12))
    torch.testing.assert_close(mine(ids).logits, ref(ids).logits, rtol=1e-5, atol=1e-5)
    # a fresh process makes the twin on lookup
    where = "m.transformer.h[0].mlp.act"
    assert mixin_after_reload(mine, tmp_path, where) == "TransformersGELU"
