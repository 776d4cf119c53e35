"""What :func:`~pycudnn.torch.convert` did to a model (imports torch):
:func:`conversion_report`, one row per module -- converted (to which class), fused (into which
chain) or left alone (and why).

The report is read off the model when asked, not recorded by ``convert``: a module's class says
whether it was converted, the fusion pass's records (:func:`~pycudnn.torch.fusions`) which
chains it is in, and the classes' own rules (:func:`~pycudnn.torch.unsupported_reason`) why a
module stays a torch one. ``convert`` only remembers which modules its ``exclude`` kept (a weak
set), so asking costs nothing until it is asked, and the answer follows the model through later
``convert`` calls, ``back=True`` included.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from torch import nn

from ._convert import EXCLUDED, converted_name, supported_modules, unsupported_reason
from .fuse import fusions

__all__ = ["ConversionReport", "ModuleConversion", "conversion_report"]

#: the statuses of :attr:`ModuleConversion.status`
STATUSES = ("converted", "fused", "left alone")


@dataclass(frozen=True)
class ModuleConversion:
    """One module of a model as :func:`~pycudnn.torch.convert` left it (a row of
    :class:`ConversionReport`).

    Attributes
    ----------
    path : str
        The module's qualified name in the model (``""`` for the model itself).
    kind : str
        Its class's name: ``"Conv2d"`` (a ``torch.nn`` class, or the pycudnn twin of one), or
        module and name for other classes (``"transformers.pytorch_utils.Conv1D"``).
    status : str
        ``"converted"`` (its class is now pycudnn's), ``"fused"`` (part of a chain that
        ``convert(..., fuse=True)`` runs as one cuDNN call; converted too, except a torch
        activation such as ``GELU`` fused as the epilogue) or ``"left alone"``.
    detail : str
        Converted: the pycudnn class (and why a chain it starts did not fuse, if one did not).
        Fused: the pycudnn class and each chain (pattern, members, the traced module). Left
        alone: why (excluded by ``exclude``, a configuration cuDNN cannot run, a class pycudnn
        does not convert).
    """

    path: str
    kind: str
    status: str
    detail: str


@dataclass(frozen=True, repr=False)
class ConversionReport:
    """What :func:`~pycudnn.torch.convert` did to each module of a model
    (:func:`conversion_report`). ``str(report)`` is a table; iterating gives the rows
    (:class:`ModuleConversion`); ``report[path]`` one row.

    Attributes
    ----------
    modules : tuple of ModuleConversion
        One row per module that computes (see :func:`conversion_report`), in the model's order.
    """

    modules: tuple[ModuleConversion, ...]

    def __iter__(self) -> Iterator[ModuleConversion]:
        return iter(self.modules)

    def __len__(self) -> int:
        return len(self.modules)

    def __getitem__(self, path: str) -> ModuleConversion:
        for row in self.modules:
            if row.path == path:
                return row
        raise KeyError(f"conversion report: no module at {path!r}")

    def _having(self, status: str) -> tuple[ModuleConversion, ...]:
        return tuple(row for row in self.modules if row.status == status)

    @property
    def converted(self) -> tuple[ModuleConversion, ...]:
        """The rows of modules converted and not fused."""
        return self._having("converted")

    @property
    def fused(self) -> tuple[ModuleConversion, ...]:
        """The rows of modules in a fused chain."""
        return self._having("fused")

    @property
    def left_alone(self) -> tuple[ModuleConversion, ...]:
        """The rows of modules that stayed as they were, each with its reason."""
        return self._having("left alone")

    def summary(self) -> str:
        """One line: how many modules have each status.

        Returns
        -------
        str
            E.g. ``'9 modules: 2 converted, 5 fused, 2 left alone'``.
        """
        counts = ", ".join(f"{len(self._having(s))} {s}" for s in STATUSES)
        return f"{len(self.modules)} modules: {counts}"

    def __repr__(self) -> str:
        return f"<ConversionReport: {self.summary()}>"

    def __str__(self) -> str:
        head = ("module", "class", "status", "detail")
        rows = [(r.path or "(model)", r.kind, r.status, r.detail) for r in self.modules]
        widths = [max(len(row[i]) for row in (head, *rows)) for i in range(3)]
        lines = [self.summary()]
        rule = (*("-" * w for w in widths), "-" * 6)
        for row in (head, rule, *rows):
            cells = [cell.ljust(w) for cell, w in zip(row, widths, strict=False)]
            lines.append("  ".join((*cells, row[3])).rstrip())
        return "\n".join(lines)


def _join(root: str, name: str) -> str:
    return f"{root}.{name}" if root and name else root or name


def _chains(model: nn.Module) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """``(fused, missed)``: module path -> the fused chains it is in, and the near misses it
    starts (each described) -- from the fusion pass's records."""
    fused: dict[str, list[str]] = {}
    missed: dict[str, list[str]] = {}
    for root, rec in fusions(model):
        targets = rec.modules or ("",) * len(rec.nodes)
        members = [_join(root, m) if m else n for n, m in zip(rec.nodes, targets, strict=True)]
        if rec.fused:
            where = f"traced at {root}" if root else "traced at the model"
            text = f"{rec.pattern} chain {' -> '.join(members)} ({where})"
            for m in targets:
                if m:
                    fused.setdefault(_join(root, m), []).append(text)
        elif targets[0]:
            text = f"not fused as {rec.pattern} with {' -> '.join(members[1:])}: {rec.reason}"
            missed.setdefault(_join(root, targets[0]), []).append(text)
    return fused, missed


def _kind(m: nn.Module) -> str:
    t = type(m)
    if t.__module__.startswith(("torch.nn.", "pycudnn.torch.")):
        return t.__name__
    return f"{t.__module__}.{t.__qualname__}"


def conversion_report(model: nn.Module) -> ConversionReport:
    """What :func:`~pycudnn.torch.convert` did to each module of *model*: converted (to which
    pycudnn class), fused (into which chain) or left alone (and why).

    ``convert`` returns the model itself; this is its account, read off the model when asked
    (cheap: one pass over the modules, nothing kept per call), so it also describes a model
    converted back, or never converted (then every module ``convert`` would swap is "left
    alone: not converted yet").

    Parameters
    ----------
    model : torch.nn.Module
        The model (any module).

    Returns
    -------
    ConversionReport
        One :class:`ModuleConversion` per module that computes, in the model's order: every
        module without children, every module of a class ``convert`` considers or has
        converted, every module in a chain the fusion pass found and every module with
        parameters of its own. Pure containers (``Sequential``, a model class that only calls
        its children) are not listed. ``print(report)`` shows the table.

    Notes
    -----
    Which chains fused, per traced module, is :func:`~pycudnn.torch.fusions`; what a fused
    region runs per input signature (launch programs or its chains one by one) is
    :func:`~pycudnn.torch.programs`; whether attention ran cuDNN is
    :func:`~pycudnn.torch.attention_calls`.

    Examples
    --------
    >>> model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
    ...                       nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    >>> report = pt.conversion_report(pt.convert(model, fuse=True))  # doctest: +SKIP
    >>> report.summary()  # doctest: +SKIP
    '6 modules: 1 converted, 3 fused, 2 left alone'
    >>> report["0"].detail  # doctest: +SKIP
    'pycudnn.torch.Conv2d; conv_bn_act chain 0 -> 1 -> 2 (traced at the model)'
    >>> [row.path for row in report.left_alone]  # doctest: +SKIP
    ['3', '4']
    >>> print(report)  # the table: module, class, status, detail  # doctest: +SKIP
    """
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"conversion_report: model must be a torch.nn.Module, got {type(model).__name__}"
        )
    classes = supported_modules()
    in_fused, in_missed = _chains(model)
    rows = []
    for path, m in model.named_modules():
        t = type(m)
        fused, missed = in_fused.get(path, []), in_missed.get(path, [])
        twin = converted_name(t)
        considered = twin is not None or any(isinstance(m, c) for c in classes)
        own = next(m.parameters(recurse=False), None) is not None
        if not (considered or fused or own or next(m.children(), None) is None):
            continue  # a container
        name = twin or f"torch.nn.{t.__name__}"
        if fused:
            status, detail = "fused", "; ".join([name, *fused])
        elif twin is not None:
            status, detail = "converted", "; ".join([name, *missed])
        elif m in EXCLUDED:
            status, detail = "left alone", "excluded by convert's exclude"
        else:
            why = unsupported_reason(m)
            status = "left alone"
            detail = why or "not converted yet: convert(model) converts it"
        rows.append(ModuleConversion(path, _kind(m), status, detail))
    return ConversionReport(tuple(rows))
