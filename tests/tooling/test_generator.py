"""The generator on a hand-written fixture header, plus seal and regenerate-and-diff checks.

Tier A (no libcudnn needed) except the regenerate test, which needs the pinned headers and
skips with the reason when they are absent.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).resolve().parents[1] / "support" / "fixtures" / "mini_cudnn"
sys.path.insert(0, str(ROOT / "tools"))
gen = pytest.importorskip("gen_bindings", reason="tools/gen_bindings.py not importable")
# what gen_bindings writes into pycudnn/_generated/ (sealed), and the folder's other module
GENERATED = tuple(
    f"pycudnn/_generated/{n}" for n in ("__init__.py", "lib.py", "lib.pyi", "enums.py")
)
BACKEND_ATTRS = "pycudnn/_generated/backend_attrs.py"  # tools/gen_backend_attrs.py (header hash)
pytest.importorskip("clang.cindex", reason="libclang is needed to run the generator")


@pytest.fixture(scope="module")
def mini():
    files = gen.generate(FIXTURE)
    return files, json.loads(files["tools/cudnn_api.json"])


def _load(text: str, name: str, tmp_path: Path):
    pkg = tmp_path / "minipkg"
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_loader.py").write_text("def bind(*a):\n    raise AssertionError\n")
    (pkg / "_generated").mkdir(exist_ok=True)  # where the generated modules sit
    (pkg / "_generated" / "__init__.py").write_text("")
    (pkg / "_generated" / f"{name}.py").write_text(text)
    sys.path.insert(0, str(tmp_path))
    try:
        for mod in [m for m in sys.modules if m == "minipkg" or m.startswith("minipkg.")]:
            del sys.modules[mod]
        return importlib.import_module(f"minipkg._generated.{name}")
    finally:
        sys.path.remove(str(tmp_path))


def test_counts_and_version(mini):
    _files, m = mini
    assert m["header_version"] == "9.1.2"
    assert m["header_version_int"] == 90102
    assert m["counts"]["functions"] == 7
    assert m["counts"]["enums"] == 4
    assert m["counts"]["structs"] == 1
    assert m["counts"]["callbacks"] == 1
    assert {h["name"] for h in m["handles"]} == {
        "cudnnHandle_t",
        "cudnnWidgetDescriptor_t",
        "cudnnBackendDescriptor_t",
    }


def test_deprecation_in_every_position(mini):
    _files, m = mini
    fns = {f["name"]: f for f in m["functions"]}
    assert fns["cudnnSetWidget"]["deprecated"] and fns["cudnnSetWidget"]["doc_deprecated"]
    assert not fns["cudnnCreate"]["deprecated"]
    enums = {e["name"]: e for e in m["enums"]}
    assert enums["cudnnLegacyMode_t"]["deprecated"]
    status = {x["name"]: x for x in enums["cudnnStatus_t"]["members"]}
    assert status["CUDNN_STATUS_OLD_NAME"]["deprecated"]
    assert not status["CUDNN_STATUS_BAD_PARAM"]["deprecated"]
    handles = {h["name"]: h for h in m["handles"]}
    assert handles["cudnnWidgetDescriptor_t"]["deprecated"]


def test_enum_values_suffixes_and_aliases(mini, tmp_path):
    files, m = mini
    enums = {e["name"]: e for e in m["enums"]}
    kinds = {x["name"]: x["value"] for x in enums["cudnnWidgetKind_t"]["members"]}
    assert kinds == {"CUDNN_WIDGET_SMALL": 0, "CUDNN_WIDGET_LARGE": 1, "CUDNN_WIDGET_AUTO": -1}
    status = {x["name"]: x for x in enums["cudnnStatus_t"]["members"]}
    assert status["CUDNN_STATUS_OLD_NAME"]["alias_of"] == "CUDNN_STATUS_BAD_PARAM_NULL_POINTER"
    mod = _load(files["pycudnn/_generated/enums.py"], "enums", tmp_path)
    # prefix stripping, class naming, aliases collapse onto the first name
    assert mod.WidgetKind.AUTO == -1 and mod.WidgetKind.SMALL.c_name == "CUDNN_WIDGET_SMALL"
    assert mod.Status.OLD_NAME is mod.Status.BAD_PARAM_NULL_POINTER
    assert mod.by_c_name("CUDNN_STATUS_OLD_NAME") is mod.Status.BAD_PARAM_NULL_POINTER
    assert mod.Status.NOT_SUPPORTED.category == 3000
    assert "CUDNN_STATUS_OLD_NAME" in mod.DEPRECATED_MEMBERS
    assert "CUDNN_LEGACY_A" in mod.DEPRECATED_MEMBERS  # typedef-level deprecation propagates
    assert mod.LegacyMode.A.deprecated and not mod.WidgetKind.SMALL.deprecated
    assert mod.Severity.c_type() == "cudnnSeverity_t"


def test_defines(mini):
    _files, m = mini
    d = {x["name"]: x for x in m["defines"]}
    assert d["CUDNN_SEV_ERROR_EN"]["value"] == 2
    assert d["CUDNN_WIDGET_MAX"]["value"] == 8
    assert d["CUDNN_WIDGET_MIN_EPS"]["value"] == pytest.approx(1e-5)
    assert d["CUDNN_VERSION"]["kind"] == "version" and d["CUDNN_VERSION"]["value"] == 90102
    assert d["CUDNN_TWICE"]["kind"] == "function_like" and "value" not in d["CUDNN_TWICE"]
    assert d["CUDNN_H_"]["kind"] == "include_guard"
    assert d["CUDNN_DEPRECATED"]["kind"] == "decoration"


def test_struct_layout_matches_clang(mini, tmp_path):
    files, m = mini
    s = m["structs"][0]
    assert s["name"] == "cudnnDebug_t" and s["size"] == 48
    mod = _load(files["pycudnn/_generated/lib.py"], "lib", tmp_path)
    assert ctypes.sizeof(mod.cudnnDebug_t) == s["size"]
    for f in s["fields"]:
        assert getattr(mod.cudnnDebug_t, f["name"]).offset == f["offset"], f["name"]


def test_prototypes(mini, tmp_path):
    files, _m = mini
    mod = _load(files["pycudnn/_generated/lib.py"], "lib", tmp_path)
    P = mod.PROTOTYPES
    assert P["cudnnGetVersion"][:2] == (ctypes.c_size_t, ())
    assert P["cudnnGetErrorString"][0] is ctypes.c_char_p
    assert P["cudnnGetLastErrorString"][:2] == (None, (ctypes.c_char_p, ctypes.c_size_t))
    _restype, argtypes, where, deprecated = P["cudnnSetWidget"]
    assert argtypes[0] is mod.cudnnWidgetDescriptor_t  # top-level const stripped
    assert argtypes[1] is ctypes.c_int  # enum
    assert argtypes[3]._type_ is ctypes.c_int  # const int dimA[] -> POINTER(c_int)
    assert argtypes[4] is ctypes.c_int64  # by typedef name, not canonical type
    assert deprecated and where.startswith("cudnn.h:")
    assert P["cudnnCreate"][1][0]._type_ is mod.cudnnHandle_t
    _r, args, _w, _d = P["cudnnBackendSetThing"]
    assert args == (
        mod.cudnnBackendDescriptor_t,
        ctypes.c_void_p,
        mod.cudaStream_t,
        ctypes.c_double,
    )
    # distinct handle types reject each other but take raw addresses
    assert mod.cudnnHandle_t is not mod.cudnnWidgetDescriptor_t
    assert mod.CUDNN_WIDGET_AUTO == -1 and mod.CUDNN_SEV_ERROR_EN == 2
    cb = mod.cudnnCallback_t(lambda *a: None)
    assert callable(cb)


def test_docstrings_in_pyi(mini):
    files, _m = mini
    pyi = files["pycudnn/_generated/lib.pyi"]
    assert "Returns the version." in pyi and "Second sentence" not in pyi
    assert "See ``cudnnSetWidget`` (cudnn.h:" in pyi and "Deprecated in cuDNN." in pyi


def test_deterministic_and_sealed(mini):
    files, _m = mini
    again = gen.generate(FIXTURE)
    assert again == files
    for rel in GENERATED:
        assert gen.verify_seal(files[rel])
        assert (
            "DO NOT EDIT" in files[rel] and "Regenerate: python tools/gen_bindings.py" in files[rel]
        )
        tampered = files[rel].replace("cudnn", "cuDNN", 1)
        assert not gen.verify_seal(tampered)


def test_error_diagnostic_aborts(tmp_path):
    bad = tmp_path / "inc"
    bad.mkdir()
    (bad / "cudnn.h").write_text('#include "missing_header.h"\nint f(void);\n')
    with pytest.raises(gen.GenerationError, match="refusing to guess"):
        gen.generate(bad)


def test_size_t_without_stub_is_caught(tmp_path):
    # The known trap: an unknown size_t becomes int silently unless errors abort the run.
    bad = tmp_path / "inc"
    bad.mkdir()
    (bad / "cudnn.h").write_text("size_t cudnnGetVersion(void);\n")
    with pytest.raises(gen.GenerationError):
        gen.generate(bad)


@pytest.mark.parametrize("rel", GENERATED)
def test_checked_in_files_are_sealed(rel):
    assert gen.verify_seal((ROOT / rel).read_text()), f"{rel} was edited by hand; regenerate it"


def test_regenerate_matches_checked_in():
    try:
        include = gen.find_include_dir()
    except gen.GenerationError as exc:
        pytest.skip(f"cuDNN headers not installed: {exc}")
    manifest = json.loads((ROOT / "tools" / "cudnn_api.json").read_text())
    files = gen.generate(include)
    fresh = json.loads(files["tools/cudnn_api.json"])
    if fresh["header_version"] != manifest["header_version"]:
        pytest.skip(
            f"installed headers are {fresh['header_version']}, bindings pinned to "
            f"{manifest['header_version']} (install the [test] extra)"
        )
    for rel, text in files.items():
        assert (ROOT / rel).read_text() == text, f"{rel} differs: run python tools/gen_bindings.py"


def test_check_cli():
    r = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_bindings.py"), "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if "headers not found" in r.stderr:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stdout + r.stderr


def test_generated_files_formatter_clean():
    ruff = pytest.importorskip("ruff", reason="ruff not installed")
    del ruff
    r = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", *GENERATED, BACKEND_ATTRS],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_generated_folder_holds_only_generated_files():
    """``pycudnn/_generated/`` holds what the two tools write and nothing else, and no
    generated module sits outside it (the faces ``lib.py`` and ``enums.py`` are hand-written)."""
    here = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "pycudnn" / "_generated").iterdir()
        if p.name != "__pycache__"
    }
    assert here == {*GENERATED, BACKEND_ATTRS}
    assert (ROOT / BACKEND_ATTRS).read_text().startswith("# Generated by tools/gen_backend_attrs")
    outside = [
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "pycudnn").rglob("*.py*")
        if "_generated" not in p.parts
        and p.suffix in (".py", ".pyi")  # not the bytecode any child process may leave
        and "DO NOT EDIT" in p.read_text()[:1000]
    ]
    assert not outside, f"generated files outside pycudnn/_generated/: {outside}"
