"""The README and the guides say what the code does (tier A; the site itself is built by CI with
``properdocs build -f mkdocs.yml --strict``, which fails on a broken link or reference)."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
MANIFEST = json.loads((ROOT / "tools" / "cudnn_api.json").read_text())


def test_readme_counts_match_the_manifest():
    m = re.search(
        r"cuDNN (\d+\.\d+\.\d+):\s+(\d+) functions, (\d+) enums with (\d+) members, (\d+) structs",
        README,
    )
    assert m, "README's first paragraph no longer states the header version and counts"
    c = MANIFEST["counts"]
    assert m.groups() == (
        MANIFEST["header_version"],
        str(c["functions"]),
        str(c["enums"]),
        str(c["enum_members"]),
        str(len(MANIFEST["structs"])),
    ), "update README.md's counts (docs/regenerating.md, step 4)"


def test_readme_relative_links_exist():
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        if "://" in target:
            continue
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


def test_every_guide_is_in_the_site_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    listed = set(re.findall(r":\s*(\S+\.md)\s*$", nav, flags=re.M))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages - listed == set(), f"docs pages missing from mkdocs.yml's nav: {pages - listed}"
    generated = {"changelog.md", "SUMMARY.md"}  # written at build time by docs/gen_ref.py
    assert listed - pages <= generated, f"nav names missing pages: {listed - pages}"


def test_logging_guide_names_the_logger():
    from pycudnn import _logging

    text = (ROOT / "docs" / "logging.md").read_text()
    assert f"`{_logging.LOGGER.name}`" in text


def test_versions_guide_names_the_pinned_headers():
    from pycudnn import lib as _lib

    text = (ROOT / "docs" / "versions.md").read_text()
    assert f"**{_lib.HEADER_VERSION_STRING}**" in text
    pin = re.search(r'"nvidia-cudnn-cu12==([\d.]+)"', (ROOT / "pyproject.toml").read_text())
    assert pin and f"nvidia-cudnn-cu12=={pin[1]}" in text


# the reference pages that open with a module docstring: its public part (before "Internals",
# which docs/griffe_roles.py keeps off the site) names no private module
CLEAN_REFERENCE_MODULES = (
    "pycudnn/highlevel/conv/__init__.py",
    "pycudnn/graph/__init__.py",
    "pycudnn/torch/__init__.py",
)
PRIVATE_REF = re.compile(
    r"(?::mod:|:class:|:func:|:meth:)`[~.]*(?:\w+\.)*_[a-z]\w*|pycudnn(?:\.\w+)*\._[a-z]"
)


def _internals_split():
    """docs/griffe_roles.py's INTERNALS pattern (read from its source: griffe may be absent)."""
    src = (ROOT / "docs" / "griffe_roles.py").read_text()
    m = re.search(r'^INTERNALS = re\.compile\((r".*")\)$', src, flags=re.M)
    assert m, "docs/griffe_roles.py defines INTERNALS"
    return re.compile(ast.literal_eval(m.group(1)))


@pytest.mark.parametrize("path", CLEAN_REFERENCE_MODULES)
def test_reference_pages_open_without_private_internals(path):
    doc = ast.get_docstring(ast.parse((ROOT / path).read_text()), clean=False)
    assert doc
    split = _internals_split()
    public = split.split(doc, 1)[0]
    assert not PRIVATE_REF.findall(public), (path, PRIVATE_REF.findall(public))
    assert PRIVATE_REF.search(doc) is None or split.search(doc), path


# mermaid flowchart keywords that break a diagram when used as a node id (it then shows as text
# with "Syntax error in text"); the diagrams themselves are drawn by the browser, not the build
_MERMAID_RESERVED = re.compile(r"^\s*(graph|end|subgraph|flowchart|style|class)\b\s*(\[|\(|-->)")


@pytest.mark.parametrize("page", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_mermaid_diagrams_use_no_reserved_node_ids(page):
    for block in re.findall(r"```mermaid\n(.*?)```", page.read_text(), flags=re.S):
        lines = block.splitlines()
        assert lines[0].split()[0] in ("flowchart", "sequenceDiagram"), lines[0]
        for line in lines[1:]:
            assert not _MERMAID_RESERVED.match(line), f"{page.name}: {line.strip()}"
            assert not re.search(r"-->\s*(graph|end)\s*$", line), f"{page.name}: {line.strip()}"


def test_the_home_page_and_architecture_have_their_diagrams():
    assert "```mermaid" in (ROOT / "docs" / "index.md").read_text()
    arch = (ROOT / "docs" / "architecture.md").read_text()
    assert "```mermaid\nflowchart" in arch and "```mermaid\nsequenceDiagram" in arch
    assert "DESIGN.md" not in arch
