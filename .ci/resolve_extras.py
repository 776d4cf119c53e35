"""What a fresh ``pip install`` of this tree resolves to, plain and with each CUDA extra.

Runs ``pip install --dry-run --ignore-installed --report`` (nothing is installed; PyPI is asked),
prints the versions that matter and exits 1 unless ``[cu12]`` brings cuda-bindings 12.x (>= 12.8)
and the CUDA 12 cuDNN wheel, ``[cu13]`` cuda-bindings 13.x and the CUDA 13 one, and ``[test]``
and ``[cu12,test]`` the same CUDA 12 pair as ``[cu12]`` (one CUDA major: the pinned headers come
from the CUDA 12 wheel). A plain install must resolve too. CI runs it; it needs the package
index, not a GPU. ``--torch`` also resolves ``[torch]``, ``[cu12,torch]`` and ``[cu13,torch]``
(slow: torch's dependencies) and prints the cuDNN torch pins, which is the cuDNN a process that
imports torch first runs (docs/versions.md has the table).
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
EXPECTED = {
    "": (None, None),
    "cu12": (12, "nvidia-cudnn-cu12"),
    "cu13": (13, "nvidia-cudnn-cu13"),
    "test": (12, "nvidia-cudnn-cu12"),
    "cu12,test": (12, "nvidia-cudnn-cu12"),
}
# resolved with --torch: torch's own pins decide the cuDNN wheel (checked: one cuDNN wheel only)
TORCH = {
    "torch": (None, None),
    "cu12,torch": (12, "nvidia-cudnn-cu12"),
    "cu13,torch": (13, "nvidia-cudnn-cu13"),
}
DIST = "pycudnn9"


def resolve(extra: str) -> dict[str, str]:
    target = f"{ROOT}[{extra}]" if extra else str(ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        args = ["install", "--dry-run", "--ignore-installed", "--quiet", "--no-build-isolation"]
        args += ["--disable-pip-version-check", "--report", str(report), target]
        proc = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"pip could not resolve {target}:\n{proc.stdout}{proc.stderr}")
        data = json.loads(report.read_text())
    return {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in data["install"]}


def main(argv: list[str]) -> int:
    failures = []
    shown = (*SHOWN, "torch") if "--torch" in argv else SHOWN
    print(f"{'install':<22}" + "".join(f"{n:<20}" for n in shown))
    expected = {**EXPECTED, **TORCH} if "--torch" in argv else EXPECTED
    for extra, (major, wheel) in expected.items():
        got = resolve(extra)
        label = f"{DIST}[{extra}]" if extra else DIST
        print(f"{label:<22}" + "".join(f"{got.get(n, '-'):<20}" for n in shown))
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
        if len({"nvidia-cudnn-cu12", "nvidia-cudnn-cu13"} & set(got)) > 1:
            failures.append(f"{label} brings two cuDNN wheels (two libcudnn in one environment)")
        if "cuda-python" in got:
            failures.append(f"{label} brings the cuda-python metapackage")
    for f in failures:
        print(f"resolve_extras: FAIL: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
