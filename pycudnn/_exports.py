"""A package's public names, declared once: in its ``__init__.pyi`` stub.

The stub is what type checkers read (``from .errors import CudnnError as CudnnError``: precise
types for every re-export), and the package's ``__init__.py`` derives its runtime table from the
same file at import, so the two cannot drift and no name is written twice. This is the
scientific-python SPEC 1 ``lazy_loader.attach_stub`` pattern, without the dependency.

What a stub may declare, and what each becomes at runtime:

* ``from .mod import name as name`` -- ``name``, read from ``pkg.mod`` on first access;
* ``from . import mod as mod`` -- the submodule ``pkg.mod`` itself;
* ``from .sub import *`` -- every name that ``sub/__init__.pyi`` declares, read from ``pkg.sub``;
* ``def name(...)``, ``class Name``, ``name: T`` -- defined by ``__init__.py`` itself;
* absolute imports (``from typing import Any``) -- for the stub's own annotations, not exported.

Stdlib only, and nothing is read or imported until a name is used: the stub is parsed on the
first look-up (``__all__`` included), so ``import pycudnn`` costs neither the parse nor
``ast``'s import (``eager=True`` resolves every name at once, for a package that imports its
modules anyway).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

__all__ = ["attach_stub", "declared"]


def declared(stub: str) -> dict[str, tuple[str, str | None] | None]:
    """The public names a stub declares, in its order.

    Parameters
    ----------
    stub : str
        Path of a package's ``__init__.pyi``.

    Returns
    -------
    dict
        ``name -> (relative module, attribute)``: the attribute is None for a submodule; the
        value is None for a name the package's ``__init__.py`` defines itself.
    """
    import ast  # here, not at the top: only the first look-up of a package's names pays for it

    with open(stub, encoding="utf-8") as f:
        tree = ast.parse(f.read(), stub)
    names: dict[str, tuple[str, str | None] | None] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            mod = "." + (node.module or "")
            for alias in node.names:
                if alias.name == "*":  # a subpackage's own declared names
                    sub = os.path.join(os.path.dirname(stub), *mod[1:].split("."))
                    for name in declared(os.path.join(sub, "__init__.pyi")):
                        names[name] = (mod, name)
                    continue
                if alias.asname != alias.name:  # "X as X" is a re-export; anything else a typo
                    raise ImportError(f"{stub}:{node.lineno}: write '{alias.name} as {alias.name}'")
                names[alias.name] = (mod + alias.name, None) if mod == "." else (mod, alias.name)
        elif isinstance(node, ast.ImportFrom | ast.Import):
            continue  # the stub's own typing imports
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            names[node.name] = None
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = None
    return names


def attach_stub(
    namespace: dict[str, Any],
    *,
    eager: bool = False,
    before: Callable[[str], None] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for the package whose globals are *namespace*, from the
    ``__init__.pyi`` beside its ``__init__.py``; ``__all__`` is one of the names they serve.

    Parameters
    ----------
    namespace : dict
        The package's ``globals()``.
    eager : bool
        Read the stub and resolve (import) every declared name now, into *namespace*
        (``__all__`` included).
    before : callable, optional
        ``before(name)`` runs before a name's module is first imported (the torch adapter checks
        there that torch is installed); it may raise.

    Returns
    -------
    tuple
        ``(__getattr__, __dir__)``: a name resolves once, then lives in *namespace*.
    """
    package = namespace["__name__"]
    stub = os.path.splitext(namespace["__file__"])[0] + ".pyi"
    table: dict[str, tuple[str, str | None] | None] = {}

    def declared_names() -> dict[str, tuple[str, str | None] | None]:
        if not table:
            table.update(declared(stub))
            namespace["__all__"] = list(table)
        return table

    def __getattr__(name: str) -> Any:
        if name == "__all__":
            declared_names()
            return namespace["__all__"]
        where = declared_names().get(name)
        if where is None:  # undeclared, or defined by __init__.py (then never looked up here)
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if before is not None:
            before(name)
        module = importlib.import_module(where[0], package)
        value = module if where[1] is None else getattr(module, where[1])
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(declared_names()))

    if eager:
        for name, where in declared_names().items():
            if where is not None:
                __getattr__(name)
    return __getattr__, __dir__
