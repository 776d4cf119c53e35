"""The README and the guides say what the code does (tier A; the site itself is built by CI with
``mkdocs build --strict``, which fails on a broken link or reference)."""

from __future__ import annotations

import json
import re
from pathlib import Path

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
