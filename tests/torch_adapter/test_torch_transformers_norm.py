"""transformers' RMS norms converted (:mod:`pycudnn.torch.transformers_norm`) on the CPU.

A class whose ``forward`` is transformers' ``LlamaRMSNorm.forward`` statement for statement
(defined here, so the recognition is tested without transformers; transformers' own classes where
it is installed) converts to a twin that runs the adapter's RMS norm: with the pointer fakes of
``test_torch_binding.py`` its calls compute from the pointers they are given, bind, and give the
class's own numbers and gradients. A formula that differs (Gemma's ``1 + weight``) stays, with
the reason; ``back=True``, ``copy.deepcopy`` and pickling (in a fresh process) keep or restore
the classes. cuDNN's numbers are the GPU tier's (``test_torch_transformers_norm_gpu.py``).
"""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys

import pytest

pytest.importorskip("torch")
import torch  # (an import, as in transformers: the compiler then emits the same code)

if not hasattr(torch.library, "custom_op"):
    pytest.skip("torch.library.custom_op needs torch >= 2.4", allow_module_level=True)
nn = torch.nn

from test_torch_binding import assert_rms_binds, pointer_entries  # noqa: E402, F401  (fixture)
from test_torch_compile_fakes import fakes  # noqa: E402, F401  (fixture)

from pycudnn import torch as pt  # noqa: E402
from pycudnn.torch import transformers_norm, transformers_twins  # noqa: E402


class VerbatimRMSNorm(nn.Module):
    """transformers' LlamaRMSNorm, copied as its model families copy it."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class OnePlusRMSNorm(VerbatimRMSNorm):
    """Gemma's formula: the weight is an offset from 1."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return (1.0 + self.weight) * hidden_states.to(input_dtype)


class Block(nn.Module):
    def __init__(self, norm: type = VerbatimRMSNorm):
        super().__init__()
        self.norm = norm(16)
        self.proj = nn.Linear(16, 16)

    def forward(self, x):
        return self.proj(self.norm(x))


def mixin_after_reload(model: nn.Module, tmp_path, where: str) -> str:
    """The name of the first base of ``type(where)`` (an expression of the model ``m``) after
    *model* is saved and loaded in a fresh Python process."""
    path = tmp_path / "model.pt"
    torch.save(model, path)
    code = (
        "import sys, torch; m = torch.load(sys.argv[1], weights_only=False); "
        f"print(type({where}).__mro__[1].__name__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def _pair(norm: type = VerbatimRMSNorm):
    torch.manual_seed(0)
    ref = Block(norm)
    with torch.no_grad():
        ref.norm.weight.normal_()
    return ref, pt.convert(copy.deepcopy(ref))


def test_a_verbatim_copy_converts_computes_and_binds(pointer_entries):  # noqa: F811
    ref, mine = _pair()
    n = mine.norm
    assert isinstance(n, VerbatimRMSNorm) and isinstance(n, transformers_norm.TransformersRMSNorm)
    assert type(n).__name__ == "VerbatimRMSNorm" and repr(n) == repr(ref.norm)
    assert n.normalized_shape == (16,) and n.eps == 1e-6
    assert_rms_binds(ref, mine, n, pointer_entries)


def test_where_cudnn_does_not_apply_the_class_runs_its_own_forward(pointer_entries):  # noqa: F811
    ref, mine = _pair()
    x = torch.randn(3, 4, 16, dtype=torch.float64)
    ref.double()
    mine.double()
    with torch.no_grad():
        assert torch.equal(mine.norm(x), ref.norm(x))  # float64: the class's own forward
    assert not pointer_entries["rms_fwd"]


def test_another_formula_stays_with_its_reason_and_back_restores():
    _, mine = _pair(OnePlusRMSNorm)
    assert type(mine.norm) is OnePlusRMSNorm
    why = pt.unsupported_reason(mine.norm)
    assert "is not transformers' LlamaRMSNorm.forward" in why, why
    _, mine = _pair()
    assert pt.unsupported_reason(mine.norm) is None
    assert "TransformersRMSNorm (VerbatimRMSNorm)" in str(pt.conversion_report(mine))
    pt.convert(mine, back=True)
    assert type(mine.norm) is VerbatimRMSNorm and type(mine.proj) is nn.Linear


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda m: setattr(m, "variance_epsilon", 0.0), "variance_epsilon is 0.0"),
        (lambda m: setattr(m, "variance_epsilon", True), "variance_epsilon is True"),
        (lambda m: setattr(m, "weight", nn.Parameter(torch.ones(4, 4))), "not a 1-D parameter"),
        (lambda m: setattr(m, "eps", 1e-3), "an attribute 'eps' of its own"),
        (lambda m: m.to(torch.float64), "parameter weight is torch.float64"),
    ],
    ids=["eps-zero", "eps-bool", "weight-2d", "own-eps", "float64"],
)
def test_a_configuration_cudnn_cannot_run_stays_with_a_warning(change, why):
    m = VerbatimRMSNorm(16)
    change(m)
    with pytest.warns(UserWarning, match=why):
        pt.convert(m)
    assert type(m) is VerbatimRMSNorm
    with pytest.raises(ValueError, match=why):
        pt.convert(m, strict=True)


def test_copies_and_pickles_stay_converted():
    _, mine = _pair()
    assert type(copy.deepcopy(mine).norm) is type(mine.norm)
    assert type(pickle.loads(pickle.dumps(mine)).norm) is type(mine.norm)
    with pytest.raises(AttributeError):
        transformers_twins.__getattr__("Nothing of no:such:module")


def test_transformers_classes_are_recognized_by_their_forward(tmp_path):
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    assert transformers_twins.twin_of(LlamaRMSNorm) is not None
    gemma = pytest.importorskip("transformers.models.gemma.modeling_gemma")
    assert transformers_twins.twin_of(gemma.GemmaRMSNorm) is None
    cfg = transformers.LlamaConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=64, vocab_size=64, max_position_embeddings=16,
    )  # fmt: skip
    model = pt.convert(transformers.LlamaForCausalLM(cfg))
    norms = [m for m in model.modules() if isinstance(m, LlamaRMSNorm)]
    assert len(norms) == 3 and all(type(m) is not LlamaRMSNorm for m in norms)
    # a fresh process makes the twin on lookup
    assert mixin_after_reload(model, tmp_path, "m.model.norm") == "TransformersRMSNorm"


def test_compiled_fullgraph_runs_the_rms_norm_op(fakes):  # noqa: F811
    """Under ``torch.compile`` the twin is ``pycudnn::rms_norm`` (no graph break), torch's
    numbers and gradients."""
    torch._dynamo.reset()
    ref, mine = _pair()
    seen: list[str] = []

    def backend(gm, inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes)
        return gm.forward

    compiled = torch.compile(mine, backend=backend, fullgraph=True)
    x = torch.randn(3, 4, 16, requires_grad=True)
    dy = torch.randn(3, 4, 16)
    want = torch.autograd.grad(ref(x), (x, ref.norm.weight), dy)
    got = torch.autograd.grad(compiled(x), (x, mine.norm.weight), dy)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    assert any("rms_norm" in t for t in seen), seen
    torch._dynamo.reset()
