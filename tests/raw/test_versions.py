"""Version rule with injected fake versions, and the real checks (tier B: no GPU)."""

from __future__ import annotations

import pytest

import pycudnn
from pycudnn import _info, errors
from pycudnn import lib as _lib

HEADER = 92800


@pytest.mark.parametrize(
    ("runtime", "decoded"),
    [(8907, (8, 9, 7)), (92800, (9, 28, 0)), (91900, (9, 19, 0)), (100000, (10, 0, 0))],
)
def test_decode_both_encodings(runtime, decoded):
    assert _info.decode_version(runtime) == decoded


@pytest.mark.parametrize(
    ("runtime", "ok", "kind"),
    [
        (8907, False, "mismatch"),  # cuDNN 8.9.7
        (100000, False, "mismatch"),  # a future cuDNN 10.0.0
        (91900, True, "older"),  # 9.19 (the GPU machine's wheel)
        (90000, True, "older"),
        (92900, True, "newer"),
        (92800, True, "same"),
    ],
)
def test_compatibility_rule(runtime, ok, kind):
    c = _info.check_compatibility(
        runtime, HEADER, runtime_path="/x/libcudnn.so", bindings_path="/b"
    )
    assert (c.ok, c.kind) == (ok, kind)
    if kind == "mismatch":
        # both versions, both paths, and what to do
        v = _info.format_version(runtime)
        assert v in c.message and "9.28.0" in c.message
        assert "/x/libcudnn.so" in c.message and "/b" in c.message
        assert "pip install" in c.message and "PYCUDNN_SKIP_VERSION_CHECK" in c.message
    if kind == "older":
        assert "SymbolNotFoundError" in c.message


@pytest.mark.parametrize("fake", [8907, 100000])
def test_version_raises_or_returns_minus_one_on_mismatch(monkeypatch, fake):
    monkeypatch.setattr(_info._loader, "runtime_version", lambda: fake)
    monkeypatch.delenv("PYCUDNN_SKIP_VERSION_CHECK", raising=False)
    with pytest.raises(errors.VersionMismatchError, match=_info.format_version(fake)):
        pycudnn.version()
    assert pycudnn.version(raises=False) == -1
    assert pycudnn.is_available() is False
    monkeypatch.setenv("PYCUDNN_SKIP_VERSION_CHECK", "1")
    assert pycudnn.version() == fake


@pytest.mark.parametrize("fake", [91900, 92900])
def test_version_accepts_other_9x(monkeypatch, fake):
    monkeypatch.setattr(_info._loader, "runtime_version", lambda: fake)
    assert pycudnn.version() == fake


def test_sublibrary_mismatch_is_fatal(monkeypatch):
    monkeypatch.setattr(
        _info,
        "sublibrary_checks",
        lambda: {
            "graph": "CUDNN_STATUS_SUCCESS",
            "ops": "CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH",
        },
    )
    with pytest.raises(errors.VersionMismatchError, match="ops: CUDNN_STATUS_SUBLIBRARY"):
        pycudnn.version()


def test_real_versions():
    assert pycudnn.version() == _lib.cudnnGetVersion()
    assert pycudnn.header_version() == 92800
    assert pycudnn.cudart_version() > 11000
    info = pycudnn.library_info()
    assert info.path.endswith("libcudnn.so.9") and info.found_via
    assert info.runtime_version == pycudnn.version()
    assert info.max_device_version >= 900
    assert set(info.sublibraries) == set(_info.SUBLIBRARY_CHECKS)
    # a sub-library newer than the runtime (subquadratic_ops before 9.2x) is reported, not failed
    ok = ("CUDNN_STATUS_SUCCESS", "not in this cuDNN")
    assert all(v in ok for v in info.sublibraries.values()), info.sublibraries
    assert info.sublibraries["graph"] == "CUDNN_STATUS_SUCCESS"
    with pytest.raises(AttributeError):
        info.path = "x"  # frozen


def test_property_query():
    import ctypes

    v = ctypes.c_int()
    for prop, expect in zip((0, 1, 2), _info.decode_version(_lib.cudnnGetVersion()), strict=True):
        pycudnn.api.cudnnGetProperty(prop, ctypes.byref(v))
        assert v.value == expect


def test_is_available_never_raises(monkeypatch):
    from conftest import gpu_unavailable_reason

    assert pycudnn.is_available() is (gpu_unavailable_reason() is None)

    def boom():
        raise OSError("broken")

    monkeypatch.setattr(_info._loader, "runtime_version", boom)
    assert pycudnn.is_available() is False
