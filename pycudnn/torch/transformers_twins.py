"""Twins of transformers' own module classes (imports torch, never transformers): which classes
:func:`~pycudnn.torch.convert` turns into twins, how the twins are made, named and pickled.

transformers defines some layers as its own modules rather than ``torch.nn`` ones, and its model
families copy them unchanged: Llama's RMS norm (:mod:`.transformers_norm`) and the tanh GELU of
GPT-2's family (:mod:`.transformers_act`); GPT-2's block is a launch program
(:mod:`.transformers_block`). A class is recognised by its ``forward``'s compiled code, not its
name: :func:`twin_of` compares it with each mixin's :attr:`~._module.CodeTwin.references`,
instruction for instruction, with the same names and constants (a formula that differs, as
Gemma's ``1 + weight`` RMS norm, does not match and stays the class's own); a mixin that knows
its classes by other means says so in :meth:`~._module.CodeTwin.recognizes` (the block: the
source text of its ``forward``, per known transformers version). The twin is a subclass with
the mixin first, so it keeps the class's name (``repr`` is unchanged), ``isinstance`` holds and
``convert(model, back=True)`` restores the class.

The comparison is of compiled code, so it depends on how the copy was compiled as well as on
its text: a copy in a module where ``torch`` is not bound by an ``import`` statement compiles
``torch.rsqrt(...)`` to other instructions and is left alone (safe: it runs its own forward).

A twin is importable from this module by a name that says its class (``"LlamaRMSNorm of
transformers:models:llama:modeling_llama"``, made again on lookup), so a pickled converted model
loads converted where transformers is installed.
"""

from __future__ import annotations

import importlib
import weakref
from types import CodeType

from torch import nn

from ._module import CodeTwin, Converted
from .transformers_act import TransformersGELU
from .transformers_block import TransformersGPT2Block
from .transformers_norm import TransformersRMSNorm

__all__ = ["MIXINS", "mixin_of", "same_code", "twin_of"]

#: the mixins a twin can have, in the order :func:`twin_of` tries them
MIXINS: tuple[type[CodeTwin], ...] = (TransformersRMSNorm, TransformersGELU, TransformersGPT2Block)


def same_code(a: CodeType | None, b: CodeType) -> bool:
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


# per class seen, its twin or None (weak keys: convert asks about every class of a model, and
# a model's own classes must not live on here)
_TWINS: weakref.WeakKeyDictionary[type, type | None] = weakref.WeakKeyDictionary()


def _name(cls: type) -> str:
    return f"{cls.__qualname__} of {cls.__module__.replace('.', ':')}"


def _mixin_for(cls: type) -> type[CodeTwin] | None:
    if not issubclass(cls, nn.Module) or issubclass(cls, Converted):
        return None
    forward = getattr(cls, "forward", None)
    code = getattr(forward, "__code__", None)
    return next(
        (
            m
            for m in MIXINS
            if any(same_code(code, ref) for ref in m.references) or m.recognizes(forward)
        ),
        None,
    )


def twin_of(cls: type) -> type | None:
    """The converted twin of module class *cls* when its ``forward`` is one a mixin of
    :data:`MIXINS` stands in for (made once per class), else None."""
    if not isinstance(cls, type):
        return None
    if cls in _TWINS:
        return _TWINS[cls]
    mixin = _mixin_for(cls)
    twin = None
    if mixin is not None:
        twin = type(
            cls.__name__,
            (mixin, cls),
            {"__module__": __name__, "__qualname__": _name(cls), "__doc__": cls.__doc__},
        )
        globals()[_name(cls)] = twin
    _TWINS[cls] = twin
    return twin


def mixin_of(t: type) -> type[CodeTwin] | None:
    """The mixin of twin class *t* (None: *t* is no twin)."""
    if not issubclass(t, CodeTwin):
        return None
    return next((m for m in MIXINS if issubclass(t, m)), None)


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
