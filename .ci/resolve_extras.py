"""What a fresh ``pip install`` of this tree resolves to, plain and with each CUDA extra.

Runs ``pip install --dry-run --ignore-installed --report`` (nothing is installed; PyPI is asked),
prints the versions that matter and exits 1 unless ``[cu12]`` brings cuda-bindings 12.x (>= 12.8)
and the CUDA 12 cuDNN wheel, and ``[cu13]`` cuda-bindings 13.x and the CUDA 13 one. A plain install
must resolve too. CI runs it; it needs the package index, not a GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHOWN = ("cuda-bindings", "cuda-pathfinder", "nvidia-cudnn-cu12", "nvidia-cudnn-cu13", "numpy")
# extra -> (cuda-bindings major, the cuDNN wheel it must bring)
EXPECTED = {"": (None, None), "cu12": (12, "nvidia-cudnn-cu12"), "cu13": (13, "nvidia-cudnn-cu13")}


def resolve(extra: str) -> dict[str, str]:
    target = f"{ROOT}[{extra}]" if extra else str(ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
             "--disable-pip-version-check", "--no-build-isolation", "--report", str(report),
             target],
            capture_output=True, text=True,
        )  # fmt: skip
        if proc.returncode != 0:
            sys.exit(f"pip could not resolve {target}:\n{proc.stdout}{proc.stderr}")
        data = json.loads(report.read_text())
    return {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in data["install"]}


def main() -> int:
    failures = []
    print(f"{'install':<16}" + "".join(f"{n:<20}" for n in SHOWN))
    for extra, (major, wheel) in EXPECTED.items():
        got = resolve(extra)
        label = f"pycudnn9[{extra}]" if extra else "pycudnn9"
        print(f"{label:<16}" + "".join(f"{got.get(n, '-'):<20}" for n in SHOWN))
        bindings = got.get("cuda-bindings")
        if bindings is None:
            failures.append(f"{label} brings no cuda-bindings")
        elif major is not None and int(bindings.split(".")[0]) != major:
            failures.append(f"{label} resolves cuda-bindings {bindings}, not {major}.x")
        elif tuple(int(p) for p in bindings.split(".")[:2]) < (12, 8):
            failures.append(f"{label} resolves cuda-bindings {bindings} (< 12.8)")
        if wheel and wheel not in got:
            failures.append(f"{label} does not bring {wheel}")
        other = {"nvidia-cudnn-cu12", "nvidia-cudnn-cu13"} - {wheel} if wheel else set()
        if other & set(got):
            failures.append(f"{label} also brings {sorted(other & set(got))}")
        if "cuda-python" in got:
            failures.append(f"{label} brings the cuda-python metapackage")
    for f in failures:
        print(f"resolve_extras: FAIL: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
