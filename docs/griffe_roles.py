"""Griffe extension: Sphinx cross-reference roles in pycudnn's docstrings become links, and a
module docstring's ``Internals`` section (notes on private modules, for the code's readers) stays
out of the public reference.

The docstrings use numpydoc with Sphinx roles (``:func:`to_device```,
``:class:`~pycudnn.enums.DataType```), which Markdown would show as literal text. Each role is
resolved in the scope of the object whose docstring it is in (so ``:meth:`close``` inside a
class means that class's ``close``), followed through re-exports to where Python defines it, and
rewritten as an *optional* autorefs link: a link when the target is documented on the site, plain
code when it is not (a private helper), never a broken reference.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

#: where a module docstring's notes on private internals begin (kept in the source, not on the site)
INTERNALS = re.compile(r"\n\s*Internals\n\s*-{9,}\n")
ROLE = re.compile(r":(?:py:)?(?:func|class|meth|attr|data|mod|exc|obj|const):`(?P<body>[^`]+)`")


def _final_path(scope: griffe.Object, target: str) -> str:
    """The path where Python defines *target*, as seen from *scope*; *target* if unknown."""
    head, _, rest = target.partition(".")
    try:
        path = scope.resolve(head)
    except griffe.NameResolutionError:
        path = head  # an absolute dotted path ("pycudnn.enums.DataType") or a builtin
    path = f"{path}.{rest}" if rest else path
    try:
        found = scope.modules_collection[path]
        return found.final_target.path if found.is_alias else found.path
    except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return path


class SphinxRoles(griffe.Extension):
    """Rewrite ``:role:`target``` in every docstring of the package once it is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self._walk(pkg, set())

    def _walk(self, obj: griffe.Object, seen: set[str]) -> None:
        if obj.path in seen:
            return
        seen.add(obj.path)
        doc = obj.docstring
        if doc is not None and obj.is_module:
            doc.value = INTERNALS.split(doc.value, 1)[0].rstrip()
        if doc is not None and ":`" in doc.value:
            doc.value = ROLE.sub(lambda m: self._link(obj, m["body"]), doc.value)
        for member in obj.members.values():
            if not member.is_alias:
                self._walk(member, seen)  # type: ignore[arg-type]

    @staticmethod
    def _link(obj: griffe.Object, body: str) -> str:
        body = body.strip()
        short = body.startswith("~")
        target = body.lstrip("~!.")
        title = target.rsplit(".", 1)[-1] if short else target
        scope = obj if (obj.is_class or obj.is_module) else obj.parent or obj
        path = _final_path(scope, target)
        return f'<autoref identifier="{path}" optional><code>{title}</code></autoref>'
