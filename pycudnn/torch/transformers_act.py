"""transformers' tanh GELUs as one kernel (imports torch, never transformers): the module classes
whose ``forward`` is transformers' ``NewGELUActivation.forward`` (``gelu_new``: GPT-2, GPT-J,
GPT-Neo, CodeGen, Phi-1/2, T5 v1.1's gated FFN) or ``FastGELUActivation.forward``
(``gelu_fast``), converted by :func:`~pycudnn.torch.convert`.

transformers writes the tanh approximation of GELU as a formula of torch operations, eight
kernels forward and about a dozen backward on a tensor the size of the MLP's hidden layer (four
times the model's width), each one a full pass over memory: in a four-layer GPT-2 training step
a quarter of the launches and of the GPU time (docs/BENCHMARKS.md). The twin
(:class:`TransformersGELU`, made by :mod:`.transformers_twins`) computes the same function with
torch's fused ``gelu(approximate="tanh")``, one kernel each way, in float32 internally with one
rounding to the input's dtype. cuDNN's own tanh GELU is a pointwise graph whose call costs more
host time than torch's kernel for the same single pass; it pays as the epilogue of a product
cuDNN runs (``dnn_matmul(..., activation="gelu_tanh")``; ``convert(model, fuse=True)`` fuses a
``Linear`` followed by ``torch.nn.GELU``), which this twin does not do.

Numerics: the formula rounds each of its eight steps to the input's dtype (bfloat16: 8 bits);
the fused kernel rounds once, so it is nearer the exact function (``gelu_fast``'s constant
0.7978845608 is ``sqrt(2 / pi)`` to 1e-11). Where the class's own ``forward`` decides something
the fused kernel would not reproduce it runs instead: inside an autocast region (its ``pow``
runs in float32 there, which makes the result float32) and for integer or complex inputs.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from ._module import CodeTwin

__all__ = ["TransformersGELU"]


def _new_gelu(self, input):
    # transformers' NewGELUActivation.forward, as written (the bytecode is compared)
    return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))  # fmt: skip  # noqa: E501


def _fast_gelu(self, input):
    # transformers' FastGELUActivation.forward, as written
    return 0.5 * input * (1.0 + torch.tanh(input * 0.7978845608 * (1.0 + 0.044715 * input * input)))  # fmt: skip  # noqa: E501


def _autocast_on(t: torch.Tensor) -> bool:
    try:
        return torch.is_autocast_enabled(t.device.type)
    except TypeError:  # torch < 2.4: the argument-free (CUDA) and CPU forms
        return torch.is_autocast_enabled() or torch.is_autocast_cpu_enabled()


class TransformersGELU(CodeTwin):
    """The mixin of a transformers tanh GELU's twin: ``forward`` is torch's fused
    ``gelu(approximate="tanh")`` (the class's own where that would differ: autocast, a
    non-floating input)."""

    references = (_new_gelu.__code__, _fast_gelu.__code__)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """As the transformers class's ``forward``."""
        if (
            not isinstance(input, torch.Tensor)
            or not input.is_floating_point()
            or _autocast_on(input)
        ):
            return super().forward(input)  # type: ignore[misc]
        return F.gelu(input, approximate="tanh")
