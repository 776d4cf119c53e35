"""MkDocs hook: the reference's navigation file (``reference/SUMMARY.md``, written by
``docs/gen_ref.py`` for mkdocs-literate-nav) is read for the navigation but not built as a page."""

from __future__ import annotations

from mkdocs.structure.files import Files, InclusionLevel


def on_files(files: Files, **kwargs: object) -> Files:
    nav_file = files.get_file_from_path("reference/SUMMARY.md")
    if nav_file is not None:
        nav_file.inclusion = InclusionLevel.EXCLUDED
    return files
