"""Every ``pip install`` line the project shows a user, and whether each one works as written.

The README, the docs, the changelog, the examples and the package's own messages (error hints,
the doctor's report) tell people what to install. Each line may name:

- this source tree (``.`` or ``".[extras]"``, with or without ``-e``): every extra it names must
  exist in ``pyproject.toml``;
- a package from the index that is there today (:data:`ON_INDEX`); ``python tools/install_lines.py
  --index`` (CI) asks the index for each name the lines use;
- ``pycudnn9`` (the distribution's name, kept ready) only once :data:`PUBLISHED` says it is on the
  index; ``pycudnn`` never (an unrelated 2017 project there).

``tests/tooling/test_packaging.py`` runs the offline checks; ``python tools/install_lines.py``
prints every line with its verdict and exits 1 on the first kind of failure.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DIST = "pycudnn9"
# Flip to True when pycudnn9 is on the package index: its install lines are then allowed (and
# CI's --index check asks the index for it like any other name).
PUBLISHED = False
# the packages the lines may name from the index (each checked there by --index)
ON_INDEX = frozenset(
    {
        "cuda-bindings",
        "cuda-python",  # named in a message that says it is *not* needed (pycudnn/_cuda.py)
        "ml_dtypes",
        "nvidia-cudnn-cu12",
        "nvidia-cudnn-cu13",
        "torch",
        "transformers",
        "pyperf",
        "matplotlib",
        "cuda-bench",  # bench/'s GPU timer (NVIDIA's nvbench bindings)
        "flax",  # pycudnn.jax.linen / .nnx (Flax's layers)
    }
)
# every place that tells a user what to install
TEXTS = (
    "README.md",
    "CHANGELOG.md",
    "docs/**/*.md",
    "examples/*.py",
    "pycudnn/**/*.py",
    "pycudnn/**/*.pyi",
    ".ci/*.py",
    "tools/*.py",
    "bench/*.py",
)
LINE = re.compile(r"pip3?\s+(?:install|download)\s+([^\n`]*)")
_LOCAL = re.compile(r"""^["']?\.(?:\[([A-Za-z0-9_,-]*)\])?["']?$""")
# lines about the machinery itself (wheels carried to the GPU machine, pip's own report)
_NOT_FOR_USERS = ("--no-index", "--dry-run", "--report")


def targets(rest: str) -> list[str]:
    """The words of a ``pip install`` line that name something to install, up to the next
    command or comment: requirement strings (quotes dropped) and local paths; options dropped."""
    out = []
    for raw in rest.split():
        if raw in ("&&", "||", "|", ";") or raw.startswith(("#", "(")):
            break  # the next command, a comment, or prose in parentheses
        word = raw.strip("\"'`;,()\\")
        if word and not word.startswith("-") and word != "or":
            out.append(word)
        if raw.endswith((")", ",", ".", ":")) and not raw.endswith((".]", '."')):
            break  # the sentence goes on after the command
    return out


def requirement_name(word: str) -> str | None:
    """The distribution a requirement word names (lower case), or None for a local path."""
    if word.startswith((".", "/")):
        return None
    m = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", word)
    return m.group(0).lower() if m else None


def lines(root: Path = ROOT) -> Iterator[tuple[str, int, str]]:
    """(file, line number, what follows ``pip install``) for every install line of the texts."""
    for pattern in TEXTS:
        for path in sorted(root.glob(pattern)):
            if "_generated" in path.parts:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                for m in LINE.finditer(line):
                    yield path.relative_to(root).as_posix(), n, m.group(1)


def extras(root: Path = ROOT) -> set[str]:
    with open(root / "pyproject.toml", "rb") as f:
        return set(tomllib.load(f)["project"]["optional-dependencies"])


def problems(root: Path = ROOT) -> list[str]:
    """What is wrong with the install lines (empty: every line works as written)."""
    known = extras(root)
    out = []
    for path, n, rest in lines(root):
        if any(flag in rest for flag in _NOT_FOR_USERS) or path == "CHANGELOG.md":
            continue  # the changelog tells history (a line there was true when written)
        for word in targets(rest):
            local = _LOCAL.match(word)
            if local:
                unknown = {e for e in (local.group(1) or "").split(",") if e} - known
                if unknown:
                    out.append(f"{path}:{n}: no extra {sorted(unknown)} in pyproject.toml")
                continue
            name = requirement_name(word)
            if name is None or "{" in word:
                continue  # another path, or a name a message fills in (checked where used)
            if name == "pycudnn":
                out.append(f"{path}:{n}: 'pycudnn' on the index is an unrelated project")
            elif name == DIST and not PUBLISHED:
                out.append(f"{path}:{n}: {DIST} is not on the package index yet: {rest.strip()}")
            elif name not in ON_INDEX and name != DIST:
                out.append(f"{path}:{n}: {name} is not in install_lines.ON_INDEX")
    return out


def used_index_names(root: Path = ROOT) -> set[str]:
    names = set()
    for _, _, rest in lines(root):
        for word in targets(rest):
            name = requirement_name(word)
            if name in ON_INDEX or (name == DIST and PUBLISHED):
                names.add(name)
    return names


def check_index(names: set[str]) -> list[str]:
    """Ask the package index for each name (``pip download --no-deps``, metadata only where the
    index serves it): the names no release of which pip can find."""
    missing = []
    for name in sorted(names):
        args = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--quiet"]
        args += ["--ignore-installed", "--disable-pip-version-check", name]
        proc = subprocess.run(args, capture_output=True, text=True)
        print(f"  {name:<20} {'on the index' if proc.returncode == 0 else 'NOT FOUND'}")
        if proc.returncode != 0:
            missing.append(f"{name}: {proc.stderr.strip().splitlines()[-1:]}")
    return missing


def main(argv: list[str]) -> int:
    bad = problems()
    print(f"install lines: {sum(1 for _ in lines())} found, {len(bad)} wrong")
    for p in bad:
        print(f"  {p}")
    if "--index" in argv:
        print("the names they use, asked of the package index:")
        bad += check_index(used_index_names())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
