"""pycudnn's public surface, derived from the package itself (no list kept by hand).

Used by ``docs/gen_ref.py`` (the API reference pages) and
``tests/tooling/test_docstrings.py`` (every public function and class has a docstring), so
that both always mean the same set of names.

* Python layers: ``pycudnn.__all__``; the ``__all__`` of every module it exports
  (``pycudnn.errors``, ``pycudnn.descriptors``, ...) and of their public (no leading underscore)
  submodules (``pycudnn.highlevel.conv``); and, for an exported *instance* such as
  ``pycudnn.config``, the ``__all__`` of the module defining its class.
* Raw layer: the modules without an ``__all__`` (``pycudnn.lib``, ``pycudnn.api``,
  ``pycudnn.enums``) are the generated bindings; their surface is every function of
  ``pycudnn.lib.PROTOTYPES`` and every ``CudnnEnum`` subclass of ``pycudnn.enums``.

Each object is documented once, on its *owner* page: the public module that defines it if there is
one, else the first public module exporting it (submodules before ``pycudnn`` itself); the other
pages that export it link there.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

PACKAGE = "pycudnn"
_DATA = (str, bytes, int, float, complex, tuple, list, dict, set, frozenset, type(None))


@dataclass
class PublicModule:
    """A public namespace: its dotted name and the module whose ``__all__`` it is."""

    name: str  # as users spell it: "pycudnn.config", "pycudnn.highlevel.conv"
    module: ModuleType  # pycudnn._config for pycudnn.config
    names: tuple[str, ...]  # its __all__
    owned: list[str] = field(default_factory=list)  # names documented on this page

    @property
    def slug(self) -> str:
        return self.name


@dataclass(frozen=True)
class PublicObject:
    """A public function or class and where it is documented."""

    path: str  # public spelling on its owner page: "pycudnn.descriptors.TensorDescriptor"
    canonical: str  # where Python defines it: "pycudnn.descriptors.TensorDescriptor"
    obj: Any
    owner: str  # the PublicModule.name that documents it


def is_api_object(obj: Any) -> bool:
    """A function or class (what must carry a docstring), as opposed to a constant."""
    return inspect.isclass(obj) or inspect.isroutine(obj)


def canonical_path(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def _is_instance_export(value: Any) -> bool:
    return not (
        inspect.ismodule(value) or is_api_object(value) or isinstance(value, _DATA)
    ) and type(value).__module__.startswith(PACKAGE + ".")


def modules() -> tuple[list[PublicModule], list[tuple[str, ModuleType]]]:
    """(Python-layer namespaces with an ``__all__``, raw-layer modules without one), in the order
    ``pycudnn.__all__`` names them; ``pycudnn`` itself comes last."""
    pkg = importlib.import_module(PACKAGE)
    todo: list[tuple[str, ModuleType]] = []
    for name in pkg.__all__:
        value = getattr(pkg, name)
        if inspect.ismodule(value):
            todo.append((f"{PACKAGE}.{name}", value))
        elif _is_instance_export(value):
            todo.append((f"{PACKAGE}.{name}", sys.modules[type(value).__module__]))
    python: list[PublicModule] = []
    raw: list[tuple[str, ModuleType]] = []
    seen: set[str] = set()
    while todo:
        name, mod = todo.pop(0)
        if name in seen:
            continue
        seen.add(name)
        if hasattr(mod, "__all__"):
            python.append(PublicModule(name, mod, tuple(mod.__all__)))
        else:
            raw.append((name, mod))
        if hasattr(mod, "__path__") and mod.__name__.startswith(PACKAGE):  # a package
            for info in sorted(pkgutil.iter_modules(mod.__path__), key=lambda i: i.name):
                if not info.name.startswith("_"):
                    sub = importlib.import_module(f"{mod.__name__}.{info.name}")
                    todo.append((f"{name}.{info.name}", sub))
    python.append(PublicModule(PACKAGE, pkg, tuple(pkg.__all__)))
    return python, raw


def objects(python: list[PublicModule] | None = None) -> list[PublicObject]:
    """Every public function and class once, with its owner page (fills ``PublicModule.owned``)."""
    if python is None:
        python, _ = modules()
    by_module = {m.module.__name__: m for m in python if m.name != PACKAGE}
    owners: dict[int, PublicModule] = {}
    found: list[tuple[Any, str]] = []
    for m in python:
        for name in m.names:
            value = getattr(m.module, name)
            if not is_api_object(value) or id(value) in owners:
                continue
            defining = by_module.get(getattr(value, "__module__", ""))
            owner = defining if defining and name in defining.names else m
            owners[id(value)] = owner
            owner.owned.append(name)
            found.append((value, name))
    return [
        PublicObject(f"{owners[id(v)].name}.{n}", canonical_path(v), v, owners[id(v)].name)
        for v, n in found
    ]


def constants(m: PublicModule) -> list[str]:
    """The names of *m*'s ``__all__`` that are neither functions, classes nor modules."""
    return [
        n
        for n in m.names
        if not is_api_object(getattr(m.module, n)) and not inspect.ismodule(getattr(m.module, n))
    ]


def raw_functions() -> list[str]:
    """Every C function of the raw layer (``pycudnn.lib.PROTOTYPES``), in header order."""
    from pycudnn import lib

    return list(lib.PROTOTYPES)


def raw_enums() -> list[type]:
    """Every generated ``IntEnum`` of ``pycudnn.enums``, in header order."""
    from pycudnn import enums

    return [
        v
        for v in vars(enums).values()
        if inspect.isclass(v) and issubclass(v, enums.CudnnEnum) and v is not enums.CudnnEnum
    ]
