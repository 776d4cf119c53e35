"""The base of the adapter's modules (imports torch): which ``torch.nn`` class each replaces, its
own "can cuDNN run this configuration" rule, and the side table of what a module caches.

Each family module (:mod:`.conv`, :mod:`.pool`, ...) subclasses a ``torch.nn`` class together with
:class:`Converted`; :mod:`._convert` reads :attr:`Converted.replaces` and
:meth:`Converted.unsupported` of those classes and nothing else, so a family's knowledge stays in
its own file. The subclasses add no state to the module: what they cache (RNN blocks and layouts,
dropout pools, constant scale/bias vectors) lives in :data:`STATE`, keyed weakly by the module, so
``convert`` can swap a module's class in place and back, and ``copy.deepcopy`` / ``torch.save``
see a plain module.
"""

from __future__ import annotations

import weakref
from types import CodeType
from typing import TYPE_CHECKING, Any, ClassVar

from torch import nn

from ._runtime import FLOATS

__all__ = ["STATE", "CodeTwin", "Converted", "float_params", "state"]

# side table of what a converted module caches (never stored on the module itself)
STATE: weakref.WeakKeyDictionary[nn.Module, dict[Any, Any]] = weakref.WeakKeyDictionary()


def state(m: nn.Module) -> dict[Any, Any]:
    """The cache of module *m* (created empty on first use, gone with the module)."""
    st = STATE.get(m)
    if st is None:
        st = STATE[m] = {}
    return st


class Converted:
    """Mixin of the adapter's modules, listed before the ``torch.nn`` class it runs on cuDNN
    (``class Conv2d(Converted, nn.Conv2d)``).

    Construction refuses a configuration cuDNN cannot run (:func:`~pycudnn.torch.convert`
    leaves such modules unconverted instead).
    """

    #: the ``torch.nn`` class this one replaces: its first ``torch.nn`` base (None for a mixin
    #: that only shares a rule, such as the convolutions')
    replaces: ClassVar[type[nn.Module] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        bases = cls.__mro__[1:]
        cls.replaces = next(
            (b for b in bases if issubclass(b, nn.Module) and not issubclass(b, Converted)), None
        )

    if not TYPE_CHECKING:  # type checkers see the torch.nn class's own typed constructor

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            reason = self.unsupported(self)
            if reason is not None:
                raise ValueError(f"pycudnn.torch.{type(self).__name__}: {reason}")

    @classmethod
    def unsupported(cls, module: nn.Module) -> str | None:
        """Why *module* (of :attr:`replaces` or this class) cannot run on cuDNN, or None.

        The default: every configuration runs. Families override it with their rule.
        """
        return None


class CodeTwin(Converted):
    """Mixin of a twin that :func:`~pycudnn.torch.convert` makes for a module class outside
    ``torch.nn`` (transformers' own), recognised by its ``forward``'s compiled code being one of
    :attr:`references` (:mod:`.transformers_twins` makes the twins)."""

    #: the code objects of the ``forward`` functions this mixin stands in for
    references: ClassVar[tuple[CodeType, ...]] = ()

    @classmethod
    def recognizes(cls, forward: Any) -> bool:
        """Whether a class whose ``forward`` is *forward* gets this mixin's twin, beyond the
        code of :attr:`references` (a mixin that knows its classes by other means says so
        here; by default none)."""
        return False


def float_params(m: nn.Module, allowed: tuple = FLOATS) -> str | None:
    """The rule for a module's own parameters: each of a dtype in *allowed*."""
    for name, p in m.named_parameters(recurse=False):
        if p.dtype not in allowed:
            names = ", ".join(str(a).replace("torch.", "") for a in allowed)
            return f"parameter {name} is {p.dtype}; cuDNN computes on {names}"
    return None
