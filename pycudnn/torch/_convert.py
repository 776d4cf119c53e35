"""``convert`` (cudnn.torch's ``cudnn.convert``) and what it asks of each module class (imports
torch).

There is no table of rules here: each family module's classes say which ``torch.nn`` class they
replace (:attr:`~._module.Converted.replaces`) and whether a given module's configuration runs on
cuDNN (:meth:`~._module.Converted.unsupported`); this module only collects the classes of the
families below and asks them.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TypeVar

from torch import nn

from .._config import parse_bool
from . import (
    activation,
    batchnorm,
    conv,
    conv_transpose,
    dropout,
    linear,
    loss,
    lrn,
    norm,
    pool,
    rnn,
    softmax,
)
from ._module import STATE, Converted
from .fuse import fuse_model, unfuse_model

__all__ = ["convert", "supported_modules", "unsupported_reason"]

_Model = TypeVar("_Model", bound=nn.Module)

# the families whose module classes convert() swaps in, in the order supported_modules() lists them
_FAMILIES = (
    conv,
    conv_transpose,
    linear,
    pool,
    batchnorm,
    activation,
    softmax,
    dropout,
    lrn,
    rnn,
    norm,
    loss,
)
# torch.nn class -> its pycudnn twin (RMSNorm only where torch.nn has it: before 2.4 the twin is a
# stand-in that is no Converted)
_CLASSES: dict[type[nn.Module], type[Converted]] = {
    cls.replaces: cls
    for family in _FAMILIES
    for cls in (getattr(family, name) for name in family.__all__)
    if isinstance(cls, type) and issubclass(cls, Converted) and cls.replaces is not None
}
_BACK = {twin: base for base, twin in _CLASSES.items()}


def supported_modules() -> dict[type, type]:
    """``{torch.nn class: pycudnn.torch class}`` of every module :func:`convert` replaces."""
    return dict(_CLASSES)


def unsupported_reason(module: nn.Module) -> str | None:
    """Why :func:`convert` would leave *module* unconverted (None: it converts it).

    Each pycudnn module class carries its own rule (``unsupported``); this asks the class that
    replaces *module*'s, or *module*'s own class when it is a pycudnn one.

    Parameters
    ----------
    module : torch.nn.Module
        A module of a class :func:`supported_modules` lists (or its pycudnn twin).

    Returns
    -------
    str or None
    """
    cls = _CLASSES.get(type(module)) or (type(module) if type(module) in _BACK else None)
    if cls is None:
        return f"{type(module).__name__} is not a module pycudnn.torch converts"
    return cls.unsupported(module)


def convert(
    model: _Model,
    exclude: Callable[[nn.Module], bool] | None = None,
    *,
    back: bool = False,
    strict: bool = False,
    fuse: bool = False,
) -> _Model:
    """Replace, in place, the supported ``torch.nn`` modules of *model* by their pycudnn twins
    (cudnn.torch's ``cudnn.convert``); ``back=True`` undoes it.

    Each module whose class is exactly one of :func:`supported_modules` (subclasses, which may
    override ``forward``, are left alone) gets the pycudnn class: the object, its parameters,
    buffers, hooks and ``state_dict`` stay the same, only ``forward`` changes.

    Parameters
    ----------
    model : torch.nn.Module
        Converted with all its submodules (the model itself too, if it is one of them).
    exclude : callable, optional
        ``exclude(module) -> bool``: True keeps that module as it is (e.g.
        ``lambda m: isinstance(m, torch.nn.BatchNorm2d)``).
    back : bool
        Turn the pycudnn modules of *model* back into their ``torch.nn`` classes.
    strict : bool
        Raise ``ValueError`` for a supported class in a configuration cuDNN cannot run
        (:func:`unsupported_reason`); by default such a module stays as it is, with a
        ``UserWarning`` naming it and why.
    fuse : bool
        Then fuse chains of converted modules across modules (``torch.fx``): Conv2d/Conv3d ->
        BatchNorm (-> residual add) (-> activation) as one convolution with the batch norm
        folded in and the rest as its epilogue (eval mode, no gradient wanted), Linear ->
        ReLU/GELU/SiLU as one product with its epilogue (no gradient wanted); otherwise the
        modules run unfused as converted. Each traced module keeps its class, submodules and
        ``state_dict``; its fused code is its instance ``forward``. A module that does not
        trace stays unfused with a ``UserWarning`` and its children are tried instead.
        ``back=True`` removes the fusion too.

    Returns
    -------
    torch.nn.Module
        *model* itself, typed as what was passed in (converted in place; the same object with
        *fuse* and *back* too).

    Raises
    ------
    ValueError
        With *strict*, naming the first module that cannot be converted and why.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"convert: model must be a torch.nn.Module, got {type(model).__name__}")
    fuse = parse_bool(fuse, "convert", "fuse")
    if fuse and parse_bool(back, "convert", "back"):
        raise ValueError("convert: fuse=True with back=True; back=True removes the fusion")
    if back:
        unfuse_model(model)
    for name, m in model.named_modules():
        where = name or "the model"
        if back:
            base = _BACK.get(type(m))
            if base is not None:
                m.__class__ = base
                STATE.pop(m, None)
            continue
        cls = _CLASSES.get(type(m))
        if cls is None or (exclude is not None and exclude(m)):
            continue
        reason = cls.unsupported(m)
        if reason is not None:
            msg = f"pycudnn.torch.convert: {where} ({m!r}) stays a torch module: {reason}"
            if strict:
                raise ValueError(msg)
            warnings.warn(msg, UserWarning, stacklevel=2)
            continue
        m.__class__ = cls
    if fuse:
        fuse_model(model)
    return model
