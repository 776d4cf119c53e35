"""The built site lets a reader find every public name: each public function and class of the Python
layers, each cudnn.h function and each enum has its own entry in the site's search index (a
heading of its own, so the search box jumps to it).

Usage: python .ci/check_site.py SITE_DIR   (after mkdocs build; CI runs it)
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs"))
sys.path.insert(0, str(ROOT))

import surface  # noqa: E402


def main(site: Path) -> int:
    index = json.loads((site / "search" / "search_index.json").read_text())["docs"]
    anchors = {e["location"].rsplit("#", 1)[-1] for e in index if "#" in e["location"]}
    titles = {re.sub(r"<[^>]+>", "", e["title"]).strip() for e in index}
    missing = []
    python, _raw = surface.modules()
    objects = surface.objects(python)
    for obj in objects:
        if obj.canonical not in anchors:
            missing.append(f"{obj.path} (anchor {obj.canonical})")
    functions = surface.raw_functions()
    for name in functions:
        if name not in titles:
            missing.append(f"pycudnn.lib.{name}")
    enums = surface.raw_enums()
    for cls in enums:
        if cls.__name__ not in titles:
            missing.append(f"pycudnn.enums.{cls.__name__}")
    # the PyTorch adapter (documented from its stub and sources: torch is not imported)
    from pycudnn import _exports

    torch_names = _exports.declared(str(ROOT / "pycudnn" / "torch" / "__init__.pyi"))
    for name, where in torch_names.items():
        module, attr = where if where is not None else (".", name)
        canonical = f"pycudnn.torch{module if module != '.' else ''}.{attr or name}"
        if canonical not in anchors:
            missing.append(f"pycudnn.torch.{name} (anchor {canonical})")
    pages = len(list(site.rglob("index.html")))
    print(
        f"check_site: {pages} pages; {len(index)} search entries; found {len(objects)} public "
        f"functions and classes, {len(torch_names)} names of pycudnn.torch, {len(functions)} "
        f"cudnn.h functions, {len(enums)} enums" + (f"; MISSING {len(missing)}" if missing else "")
    )
    for m in missing:
        print(f"check_site: not in the search index: {m}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "site")))
