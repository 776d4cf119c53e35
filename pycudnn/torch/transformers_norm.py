"""transformers' RMS norms on cuDNN (imports torch, never transformers): the module classes whose
``forward`` is transformers' ``LlamaRMSNorm.forward``, converted by :func:`~pycudnn.torch.convert`.

transformers writes Llama's RMS norm as its own module, five torch operations in float32, and
some forty model families copy it unchanged (Mistral, Qwen2 and Qwen3, Phi-3, OLMo, ...); it is
not ``torch.nn.RMSNorm``, so ``convert`` used to leave it, and each call ran as eight kernels
forward and about twice that backward (nine calls per step in a four-layer Llama). A class whose
``forward`` is that code, bytecode for bytecode (:func:`twin_of`: a class whose formula
differs, as Gemma's ``1 + weight``, does not match), converts to a *twin*: a
subclass with :class:`TransformersRMSNorm` first, which runs the adapter's RMS norm
(:func:`~.norm.norm_forward`: cuDNN's kernel, one launch each way, bound to the call's
signature) and the class's own ``forward`` wherever that does not apply (CPU, float64, a weight
in another dtype than the input, autocast).

Numerics: cuDNN normalizes and multiplies by the weight in float32 and rounds once; transformers
rounds the normalized value to the input's dtype before the weight multiplies it, so the two
differ by that rounding (one unit in the last place of the output's dtype at most).

The comparison is of compiled code, so it depends on how the copy was compiled as well as on
its text: a copy in a module where ``torch`` is not bound by an ``import`` statement compiles
``torch.rsqrt(...)`` to other instructions and is left alone (safe: it runs its own forward).

The twin keeps the class's name (``repr`` is unchanged) and ``isinstance(m, LlamaRMSNorm)``
holds. It is importable by a name that says its class (``"LlamaRMSNorm of
transformers:models:llama:modeling_llama"``, made again on lookup), so a pickled converted model
loads converted where transformers is installed.
"""

from __future__ import annotations

import importlib
import weakref
from typing import Any

import torch
from torch import nn

from ._module import Converted, float_params
from ._runtime import NORM_FLOATS
from .norm import norm_forward

__all__ = ["TransformersRMSNorm", "twin_of"]


def _reference(self, hidden_states):
    # transformers' LlamaRMSNorm.forward, statement for statement (the bytecode is compared)
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * hidden_states.to(input_dtype)


def _same_code(a: Any, b: Any) -> bool:
    """Whether code objects *a* and *b* run the same instructions on the same names and
    constants (their file, line numbers and function names aside)."""
    if a is None:
        return False
    return (
        a.co_code == b.co_code
        and a.co_consts == b.co_consts
        and a.co_names == b.co_names
        and a.co_varnames == b.co_varnames
        and a.co_argcount == b.co_argcount
    )


class TransformersRMSNorm(Converted):
    """The mixin of a transformers RMS norm's twin: ``normalized_shape`` and ``eps`` read from
    the module (``weight.shape`` and ``variance_epsilon``), ``forward`` on cuDNN."""

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


# per class seen, its twin or None (weak keys: convert asks about every class of a model, and
# a model's own classes must not live on here)
_TWINS: weakref.WeakKeyDictionary[type, type | None] = weakref.WeakKeyDictionary()


def _name(cls: type) -> str:
    return f"{cls.__qualname__} of {cls.__module__.replace('.', ':')}"


def twin_of(cls: type) -> type | None:
    """The converted twin of module class *cls* when its ``forward`` is transformers'
    ``LlamaRMSNorm.forward`` (made once per class), else None."""
    if not isinstance(cls, type):
        return None
    if cls in _TWINS:
        return _TWINS[cls]
    twin = None
    fwd = getattr(cls, "forward", None)
    if (
        issubclass(cls, nn.Module)
        and not issubclass(cls, Converted)
        and _same_code(getattr(fwd, "__code__", None), _reference.__code__)
    ):
        twin = type(
            cls.__name__,
            (TransformersRMSNorm, cls),
            {"__module__": __name__, "__qualname__": _name(cls), "__doc__": cls.__doc__},
        )
        globals()[_name(cls)] = twin
    _TWINS[cls] = twin
    return twin


def __getattr__(name: str) -> type:
    """A twin by its name (pickle's lookup in a process that has not made it yet)."""
    qual, sep, where = name.partition(" of ")
    if sep:
        try:
            cls = getattr(importlib.import_module(where.replace(":", ".")), qual)
        except (ImportError, AttributeError):
            cls = None
        twin = twin_of(cls) if isinstance(cls, type) else None
        if twin is not None:
            return twin
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
