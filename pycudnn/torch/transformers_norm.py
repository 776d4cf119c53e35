"""transformers' RMS norms on cuDNN (imports torch, never transformers): the module classes whose
``forward`` is transformers' ``LlamaRMSNorm.forward``, converted by :func:`~pycudnn.torch.convert`.

transformers writes Llama's RMS norm as its own module, five torch operations in float32, and
some forty model families copy it unchanged (Mistral, Qwen2 and Qwen3, Phi-3, OLMo, ...); it is
not ``torch.nn.RMSNorm``, so ``convert`` used to leave it, and each call ran as eight kernels
forward and about twice that backward (nine calls per step in a four-layer Llama). A class whose
``forward`` is that code, bytecode for bytecode (:func:`~.transformers_twins.twin_of`: a class
whose formula differs, as Gemma's ``1 + weight``, does not match), converts to a *twin*: a
subclass with :class:`TransformersRMSNorm` first, which runs the adapter's RMS norm
(:func:`~.norm.norm_forward`: cuDNN's kernel, one launch each way, bound to the call's
signature) and the class's own ``forward`` wherever that does not apply (CPU, float64, a weight
in another dtype than the input, autocast).

Numerics: cuDNN normalizes and multiplies by the weight in float32 and rounds once; transformers
rounds the normalized value to the input's dtype before the weight multiplies it, so the two
differ by that rounding (one unit in the last place of the output's dtype at most).

The twin is made by :mod:`.transformers_twins` (the comparison of compiled code, the twins'
names, pickling).
"""

from __future__ import annotations

import torch
from torch import nn

from ._module import CodeTwin, float_params
from ._runtime import NORM_FLOATS
from .norm import norm_forward

__all__ = ["TransformersRMSNorm"]


def _reference(self, hidden_states):
    # transformers' LlamaRMSNorm.forward, statement for statement (the bytecode is compared)
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * hidden_states.to(input_dtype)


class TransformersRMSNorm(CodeTwin):
    """The mixin of a transformers RMS norm's twin: ``normalized_shape`` and ``eps`` read from
    the module (``weight.shape`` and ``variance_epsilon``), ``forward`` on cuDNN."""

    references = (_reference.__code__,)

    @property
    def normalized_shape(self) -> tuple[int, ...]:
        """``tuple(weight.shape)``: the norm is over the last dimension."""
        return tuple(self.weight.shape)  # type: ignore[attr-defined]

    @property
    def eps(self) -> float:
        """transformers' ``variance_epsilon``."""
        return self.variance_epsilon  # type: ignore[attr-defined]

    @classmethod
    def unsupported(cls, module: nn.Module) -> str | None:
        w = module._parameters.get("weight")
        if w is None or w.dim() != 1:
            return "its weight is not a 1-D parameter"
        eps = getattr(module, "variance_epsilon", None)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
            return f"variance_epsilon is {eps!r}, not a positive number"
        for name in ("eps", "normalized_shape"):
            if name in vars(module):
                return f"it has an attribute {name!r} of its own, which the twin computes"
        return float_params(module, NORM_FLOATS)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As the transformers class's ``forward``."""
        return norm_forward(self, input, True, super().forward)  # type: ignore[misc]
