"""``convert`` (cudnn.torch's ``cudnn.convert``) and what it asks of each module class (imports
torch).

There is no table of rules here: each family module's classes say which ``torch.nn`` class they
replace (:attr:`~._module.Converted.replaces`) and whether a given module's configuration runs on
cuDNN (:meth:`~._module.Converted.unsupported`); this module only collects the classes of the
families below and asks them.
"""

from __future__ import annotations

import warnings
import weakref
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
from .transformers_twins import mixin_of, twin_of

__all__ = ["convert", "converted_name", "supported_modules", "unsupported_reason"]

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

# the modules convert's *exclude* kept as they are (conversion_report says so), until they are
# converted or converted back
EXCLUDED: weakref.WeakSet[nn.Module] = weakref.WeakSet()

_ADAPTIVE = (
    "adaptive pooling: its windows follow the input's size, cuDNN's pooling takes fixed ones"
)
_NO_MODE = "cuDNN's activation modes (relu, sigmoid, tanh, clipped relu, elu, swish) lack it"
# why convert leaves a class it does not replace alone: torch.nn's by name, others by
# "module.qualname" (no import of the library that defines them)
_NOT_CONVERTED = {
    **dict.fromkeys((f"Adaptive{k}Pool{d}d" for k in ("Avg", "Max") for d in (1, 2, 3)), _ADAPTIVE),
    "MaxPool1d": "pycudnn.torch converts 2-D and 3-D pooling",
    "AvgPool1d": "pycudnn.torch converts 2-D and 3-D pooling",
    "GELU": (
        f"{_NO_MODE} (a fused Linear or convolution chain takes a GELU as its epilogue: "
        "convert(model, fuse=True))"
    ),
    **dict.fromkeys(
        ("LeakyReLU", "PReLU", "Hardswish", "Hardsigmoid", "Mish", "Softplus", "GLU"), _NO_MODE
    ),
    "Embedding": "a table lookup, no cuDNN operation",
    "Flatten": "a reshape, no cuDNN operation",
    "MultiheadAttention": (
        "its attention runs pycudnn's inside use_cudnn_attention() (not on torch's inference "
        "fast path); its projections are torch's"
    ),
    "SyncBatchNorm": "its statistics are exchanged across ranks by torch's own NCCL calls",
    "transformers.pytorch_utils.Conv1D": (
        "transformers' Conv1D (GPT-2) stores its weight transposed, (in, out), and computes "
        "with torch.addmm; only torch.nn.Linear converts"
    ),
}


def supported_modules() -> dict[type, type]:
    """``{torch.nn class: pycudnn.torch class}`` of every module :func:`convert` replaces
    (besides transformers' own RMS norms and tanh GELUs: :mod:`.transformers_twins`)."""
    return dict(_CLASSES)


def _twin(t: type) -> type | None:
    """The class :func:`convert` gives a module of class *t*, or None."""
    return _CLASSES.get(t) or twin_of(t)


def _base(t: type) -> type | None:
    """The class a converted module of class *t* goes back to, or None (not converted)."""
    if mixin_of(t) is not None:
        return t.replaces
    return _BACK.get(t)


def converted_name(t: type) -> str | None:
    """How a report names converted class *t* (None: *t* is no converted class)."""
    mixin = mixin_of(t)
    if mixin is not None:
        return f"pycudnn.torch.{mixin.__name__} ({t.__name__})"
    return f"pycudnn.torch.{t.__name__}" if t in _BACK else None


def unsupported_reason(module: nn.Module) -> str | None:
    """Why :func:`convert` would leave *module* unconverted (None: it converts it).

    Each pycudnn module class carries its own rule (``unsupported``); this asks the class that
    replaces *module*'s, or *module*'s own class when it is a pycudnn one. For a class
    ``convert`` does not replace it says so, and why where pycudnn knows (a subclass of a
    converted class, adaptive pooling, an activation cuDNN lacks, transformers' ``Conv1D``).

    Parameters
    ----------
    module : torch.nn.Module
        Any module.

    Returns
    -------
    str or None
        None for a module ``convert`` converts (or has converted).

    Examples
    --------
    >>> conv = torch.nn.Conv2d(3, 8, 3, padding_mode="reflect")
    >>> pycudnn.torch.unsupported_reason(conv)  # doctest: +SKIP
    "padding_mode='reflect' (cuDNN pads with zeros only)"
    >>> pycudnn.torch.unsupported_reason(torch.nn.AdaptiveAvgPool2d(1))  # doctest: +SKIP
    "AdaptiveAvgPool2d is not a module pycudnn.torch converts: adaptive pooling: ..."
    """
    t = type(module)
    cls = _twin(t) or (t if _base(t) is not None else None)
    if cls is not None:
        return cls.unsupported(module)
    base = next((b for b in _CLASSES if isinstance(module, b)), None)
    if base is not None:
        return (
            f"{t.__name__} is a subclass of torch.nn.{base.__name__}: convert replaces exact "
            "classes only (a subclass may override forward)"
        )
    why = _NOT_CONVERTED.get(
        t.__name__ if t.__module__.startswith("torch.nn.") else f"{t.__module__}.{t.__qualname__}"
    )
    name = t.__name__
    if why is None and name.endswith("RMSNorm"):
        why = (
            "its forward is not transformers' LlamaRMSNorm.forward, the RMS norm pycudnn.torch "
            "converts besides torch.nn.RMSNorm"
        )
    elif why is None and "GELU" in name:
        why = (
            "its forward is not transformers' NewGELUActivation.forward or "
            "FastGELUActivation.forward, the tanh GELUs pycudnn.torch converts"
        )
    return f"{name} is not a module pycudnn.torch converts" + (f": {why}" if why else "")


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
    buffers, hooks and ``state_dict`` stay the same, only ``forward`` changes. So do
    transformers' RMS norms whose ``forward`` is ``LlamaRMSNorm``'s (Llama, Mistral, Qwen...:
    :class:`~pycudnn.torch.transformers_norm.TransformersRMSNorm`), its tanh GELUs
    (``gelu_new``, ``gelu_fast``: GPT-2's family;
    :class:`~pycudnn.torch.transformers_act.TransformersGELU`) and GPT-2's block, which runs as
    one launch program (:class:`~pycudnn.torch.transformers_block.TransformersGPT2Block`).

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
            EXCLUDED.discard(m)
            base = _base(type(m))
            if base is not None:
                m.__class__ = base
                STATE.pop(m, None)
            continue
        cls = _twin(type(m))
        if cls is None:
            continue
        if exclude is not None and exclude(m):
            EXCLUDED.add(m)
            continue
        EXCLUDED.discard(m)
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
