"""Release hygiene: the extras' cuda-bindings majors, license metadata, and what the wheel and sdist
contain (tier A: no libcudnn, no GPU, no network).

The metadata is read twice: as pip computes it from this tree (PEP 517 ``prepare_metadata``, with
the environment's setuptools, in a scratch copy so the tree gets no ``egg-info``), and from the
installed distribution (``importlib.metadata``) when it was installed from this tree, as CI does
with ``pip install -e ".[test]"``. The wheel and sdist are built once per session from a scratch
copy (``python -m build --no-isolation``), or taken from ``$PYCUDNN_DIST_DIR`` when CI built them
already (with build isolation, as a release would).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.message import Message
from importlib import metadata
from pathlib import Path

import pytest

packaging = pytest.importorskip("packaging", reason="packaging comes with the [test] extra")
from packaging.requirements import Requirement  # noqa: E402
from packaging.specifiers import SpecifierSet  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pycudnn"
# the distribution's name on the package index (the import name stays pycudnn): "pycudnn" there is
# an unrelated 2017 project (0.0.1-0.0.3) that pip would install with only a warning
DIST = "pycudnn9"
# what the distributions are built from (MANIFEST.in and pyproject.toml decide what goes in)
PROJECT_FILES = ("pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "MANIFEST.in")
# never in a wheel or sdist
OUTSIDE = ("tests/", "tools/", "bench/", "docs/", "examples/", ".ci/")


def _scratch_copy(dest: Path) -> Path:
    for name in PROJECT_FILES:
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(
        PACKAGE, dest / "pycudnn", ignore=shutil.ignore_patterns("__pycache__", "*.py[cod]")
    )
    return dest


def _package_files() -> set[str]:
    """Every file of the package in this tree, as a path relative to the tree's root."""
    return {
        p.relative_to(ROOT).as_posix()
        for p in PACKAGE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")
    }


@functools.cache
def _built_metadata() -> Message:
    build_util = pytest.importorskip("build.util", reason="build comes with the [test] extra")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        meta = build_util.project_wheel_metadata(_scratch_copy(Path(tmp)), isolated=False)
    msg = Message()
    for key, value in meta.items():
        msg[key] = value
    return msg


def _installed_from_this_tree() -> metadata.Distribution | None:
    """The installed distribution whose source is this tree (``pip install -e .``), if any.

    Several may be on ``sys.path`` (an ``egg-info`` left in the tree by a metadata build, another
    checkout's install): the one pip recorded as installed from here is the one that counts.
    """
    for dist in metadata.distributions(name=DIST):
        direct = dist.read_text("direct_url.json")
        url = json.loads(direct).get("url", "") if direct else ""
        if url.rstrip("/") == ROOT.as_uri():
            return dist
    return None


@pytest.fixture(params=["built", "installed"], scope="module")
def meta(request) -> Message:
    if request.param == "built":
        return _built_metadata()
    dist = _installed_from_this_tree()
    if dist is None:
        pytest.skip(f"pycudnn is not installed from {ROOT} (CI installs it with pip install -e)")
    return dist.metadata  # type: ignore[return-value]


def _requirements(meta: Message, extra: str | None) -> list[Requirement]:
    """The requirements an install with *extra* (None: a plain install) brings."""
    out = []
    for line in meta.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": extra or ""}):
            out.append(req)
    return out


def _spec(meta: Message, extra: str | None, name: str) -> SpecifierSet | None:
    specs = [r.specifier for r in _requirements(meta, extra) if r.name == name]
    if not specs:
        return None
    return functools.reduce(lambda a, b: a & b, specs)


@pytest.mark.parametrize(
    ("extra", "allowed", "refused", "cudnn_wheel"),
    [
        (None, ["12.8.0", "12.9.10", "13.0.0", "13.5.0"], ["12.6.0", "11.8.7"], None),
        ("cu12", ["12.8.0", "12.9.10"], ["13.0.0", "13.5.0", "12.6.0"], "nvidia-cudnn-cu12"),
        ("cu13", ["13.0.0", "13.5.0"], ["12.9.10", "14.0.0"], "nvidia-cudnn-cu13"),
        # one CUDA major: the pinned headers' wheel is the CUDA 12 one, so cuda-bindings is 12.x
        ("test", ["12.8.0", "12.9.10"], ["13.0.0", "13.5.0", "12.6.0"], "nvidia-cudnn-cu12"),
    ],
    ids=["plain", "cu12", "cu13", "test"],
)
def test_extra_chooses_the_cuda_bindings_major(meta, extra, allowed, refused, cudnn_wheel):
    # CUDA 12 drivers (R525-R575) need cuda-bindings 12.x: 13.x links the CUDA 13 runtime
    # statically and sees no GPU there (DESIGN.md, Dependencies).
    spec = _spec(meta, extra, "cuda-bindings")
    assert spec is not None, f"extra {extra!r} brings no cuda-bindings"
    for v in allowed:
        assert spec.contains(v), f"[{extra}] cuda-bindings{spec} refuses {v}"
    for v in refused:
        assert not spec.contains(v), f"[{extra}] cuda-bindings{spec} allows {v}"
    names = {r.name for r in _requirements(meta, extra)}
    assert "cuda-pathfinder" in names and "numpy" in names
    # the metapackage pins cuda-bindings of its own version (13.x): never a dependency
    assert "cuda-python" not in names
    if cudnn_wheel:
        assert cudnn_wheel in names


def test_test_extra_pins_the_headers_the_bindings_were_generated_from(meta):
    from pycudnn import lib as _lib

    pins = [r for r in _requirements(meta, "test") if r.name == "nvidia-cudnn-cu12"]
    assert len(pins) == 1, pins
    (spec,) = pins[0].specifier
    assert spec.operator == "=="
    assert spec.version.startswith(_lib.HEADER_VERSION_STRING + "."), (
        f"[test] pins nvidia-cudnn-cu12{spec}, the bindings come from the "
        f"{_lib.HEADER_VERSION_STRING} headers (docs/regenerating.md)"
    )


def test_distribution_name_and_urls(meta):
    assert meta["Name"] == DIST
    urls = meta.get_all("Project-URL") or []
    assert any(u.startswith("cuDNN documentation, https://") for u in urls), urls


def test_the_install_line_tool_sees_the_forms_in_use():
    # the forms the docs and messages use, so that the checks below cannot pass by missing them
    tool = _install_lines()
    for line, names in [
        ('pip install "pycudnn[cu12]" && python -m pycudnn', ["pycudnn"]),
        ("pip install pycudnn[cu12]` (CUDA 12)", ["pycudnn"]),
        ('pip install -e ".[cu12,test]"', [None]),
        ('pip install "pycudnn9[torch]"      # or any PyTorch', ["pycudnn9"]),
        ("pip install ml_dtypes", ["ml_dtypes"]),
        ("`pip install pycudnn9` takes the newest", ["pycudnn9"]),
        ('pip install torch (any PyTorch; in the tree: pip install -e ".[torch]")', ["torch"]),
        ('pip install "nvidia-cudnn-cu12==9.*"` or `-cu13`), or', ["nvidia-cudnn-cu12"]),
    ]:
        (m,) = tool.LINE.finditer(line)
        assert [tool.requirement_name(t) for t in tool.targets(m.group(1))] == names, line


def _install_lines():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import install_lines
    finally:
        sys.path.remove(str(ROOT / "tools"))
    return install_lines


def test_every_install_line_works_as_written():
    # each names this tree with extras it has, or a package the index has today (CI asks the
    # index for each: python tools/install_lines.py --index); pycudnn9 once it is published
    tool = _install_lines()
    assert sum(1 for _ in tool.lines()) > 20  # it reads the texts
    assert tool.problems() == []
    assert not tool.PUBLISHED or tool.DIST in tool.used_index_names()


def test_the_install_line_tool_sees_what_is_wrong(tmp_path):
    tool = _install_lines()
    (tmp_path / "docs").mkdir()
    shutil.copy2(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "README.md").write_text(
        'pip install ".[cu12]" && python -m pycudnn\n'
        'pip install -e ".[cu12,nosuch]"\n'
        'pip install "pycudnn9[torch]"   # or any PyTorch\n'
        "`pip install pycudnn` then\n"
        'pip install "cuda-bindings==12.*" "nvidia-cudnn-cu12==9.*" (in the source tree: x)\n'
        "pip install leftpad\n"
    )
    got = tool.problems(tmp_path)
    assert [p.split(":")[1] for p in got] == ["2", "3", "4", "6"], got
    assert "nosuch" in got[0] and "not on the package index yet" in got[1]
    assert "unrelated" in got[2] and "leftpad" in got[3]


def test_license_is_an_spdx_expression_with_its_file(meta):
    assert meta["License-Expression"] == "BSD-3-Clause"
    assert "LICENSE" in (meta.get_all("License-File") or [])
    assert meta.get("License") is None  # the deprecated free-text field
    assert not [c for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("BSD 3-Clause License")
    assert "Neither the name of the copyright holder" in text  # clause 3


def test_version_has_a_changelog_entry(meta):
    from pycudnn import __version__

    assert meta["Version"] == __version__
    changelog = (ROOT / "CHANGELOG.md").read_text().splitlines()
    headings = [line for line in changelog if line.startswith("## ")]
    assert any(__version__ in h for h in headings), (
        f"CHANGELOG.md has no '## ...' heading naming {__version__}: {headings}"
    )


# -- the wheel and the sdist -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    given = os.environ.get("PYCUDNN_DIST_DIR")
    if given:
        out = Path(given)
    else:
        pytest.importorskip("build", reason="build comes with the [test] extra")
        src = _scratch_copy(tmp_path_factory.mktemp("src"))
        out = tmp_path_factory.mktemp("dist")
        proc = subprocess.run(
            [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    wheels, sdists = sorted(out.glob(f"{DIST}-*.whl")), sorted(out.glob(f"{DIST}-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in out.iterdir())
    return {"wheel": wheels[0], "sdist": sdists[0]}


def _wheel_files(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {n: zf.read(n) for n in zf.namelist() if not n.endswith("/")}


def _sdist_files(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tf:
        out = {}
        for m in tf.getmembers():
            if m.isfile():
                f = tf.extractfile(m)
                assert f is not None
                out[m.name.split("/", 1)[1]] = f.read()  # drop "pycudnn9-X.Y.Z/"
        return out


# the generated modules, their stubs and the stubs that declare the public surface
GENERATED = (
    "pycudnn/_generated/__init__.py",
    "pycudnn/_generated/lib.py",
    "pycudnn/_generated/lib.pyi",
    "pycudnn/_generated/enums.py",
    "pycudnn/_generated/backend_attrs.py",
    "pycudnn/lib.pyi",
)


def _check_package(files: dict[str, bytes], where: str) -> None:
    expected = _package_files()
    present = {n for n in files if n.startswith("pycudnn/")}
    assert expected - present == set(), f"{where} lacks {sorted(expected - present)}"
    assert present - expected == set(), f"{where} has files not in the tree: {present - expected}"
    for name in (*GENERATED, "pycudnn/py.typed"):
        assert name in files, f"{where} lacks {name}"
    for name in expected:  # byte for byte: the generated files' seals hold in the dist too
        assert files[name] == (ROOT / name).read_bytes(), f"{where}: {name} differs from the tree"
    stray = sorted(n for n in files if n.startswith(OUTSIDE) or n.endswith((".pyc", ".json")))
    assert not stray, f"{where} carries {stray}"


def test_wheel_contents(dists):
    files = _wheel_files(dists["wheel"])
    _check_package(files, dists["wheel"].name)
    info = {n.split("/", 1)[1] for n in files if ".dist-info/" in n}
    assert {"METADATA", "RECORD", "WHEEL", "entry_points.txt", "licenses/LICENSE"} <= info, info
    outside = {n for n in files if not n.startswith("pycudnn/") and ".dist-info/" not in n}
    assert not outside, f"the wheel installs files outside the package: {sorted(outside)}"
    assert dists["wheel"].name.endswith("-py3-none-any.whl")  # pure Python: ctypes, no extension


def test_sdist_contents(dists):
    files = _sdist_files(dists["sdist"])
    _check_package(files, dists["sdist"].name)
    for name in ("PKG-INFO", "pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md"):
        assert name in files, f"the sdist lacks {name}"


def test_wheel_metadata_is_the_projects(dists):
    files = _wheel_files(dists["wheel"])
    (name,) = [n for n in files if n.endswith(".dist-info/METADATA")]
    from email.parser import BytesParser

    wheel_meta = BytesParser().parsebytes(files[name])
    built = _built_metadata()
    for key in ("Name", "Version", "License-Expression", "Requires-Python"):
        assert wheel_meta[key] == built[key], key
    assert sorted(wheel_meta.get_all("Requires-Dist")) == sorted(built.get_all("Requires-Dist"))
