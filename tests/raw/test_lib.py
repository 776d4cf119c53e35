"""The generated raw layer against the manifest and the installed libcudnn (tier B: no GPU)."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import pytest

from pycudnn import enums, lib
from pycudnn.errors import SymbolNotFoundError

MANIFEST = json.loads(
    (Path(__file__).resolve().parents[2] / "tools" / "cudnn_api.json").read_text()
)


def test_coverage_counts_for_pinned_headers():
    c = MANIFEST["counts"]
    assert MANIFEST["header_version"] == "9.28.0"
    assert (c["functions"], c["deprecated_functions"]) == (239, 135)
    assert (c["enums"], c["enum_members"]) == (73, 960)
    assert (c["structs"], c["handles"], c["callbacks"]) == (7, 21, 1)
    assert len(lib.PROTOTYPES) == 239
    assert len(lib.DEPRECATED_FUNCTIONS) == 135
    consts = [d for d in MANIFEST["defines"] if "value" in d]
    assert len(consts) == 36


def test_every_function_resolves_in_loaded_library():
    missing = [name for name in lib.PROTOTYPES if not lib.has(name)]
    runtime = lib.cudnnGetVersion()
    if runtime == lib.HEADER_VERSION:
        assert missing == []
        return
    # an older 9.x may lack only functions the headers mark as newer than it (or leave untagged)
    since = {f["name"]: f["since"] for f in MANIFEST["functions"]}

    def newer(name):
        tag = since[name]
        if tag is None:
            return True
        major, minor, *_ = (int(x) for x in tag.split("."))
        return major * 10000 + minor * 100 > runtime

    assert [m for m in missing if not newer(m)] == []


@pytest.mark.parametrize("fn", MANIFEST["functions"], ids=lambda f: f["name"])
def test_prototype_arity_and_restype(fn):
    restype, argtypes, where, deprecated = lib.PROTOTYPES[fn["name"]]
    assert len(argtypes) == len(fn["params"])
    assert where == fn["where"] and deprecated == fn["deprecated"]
    bound = getattr(lib, fn["name"])
    if getattr(bound, "missing", False):  # only an older runtime may lack a header function
        assert lib.cudnnGetVersion() < lib.HEADER_VERSION
        with pytest.raises(SymbolNotFoundError, match=fn["name"]):
            bound()
        return
    assert bound.argtypes == list(argtypes) or tuple(bound.argtypes) == tuple(argtypes)
    assert bound.restype is restype


def test_return_types_that_are_not_status():
    assert lib.PROTOTYPES["cudnnGetVersion"][0] is ctypes.c_size_t
    assert lib.PROTOTYPES["cudnnGetCudartVersion"][0] is ctypes.c_size_t
    assert lib.PROTOTYPES["cudnnGetErrorString"][0] is ctypes.c_char_p
    assert lib.PROTOTYPES["cudnnGetLastErrorString"][0] is None
    status_fns = [n for n, p in lib.PROTOTYPES.items() if p[0] is lib.cudnnStatus_t]
    assert len(status_fns) == 234


def test_size_t_and_int64_parameters_are_exact():
    # the silent size_t -> int trap would make these c_int
    args = lib.PROTOTYPES["cudnnGetTensorSizeInBytes"][1]
    assert args[1]._type_ is ctypes.c_size_t
    args = lib.PROTOTYPES["cudnnBackendSetAttribute"][1]
    assert args[3] is ctypes.c_int64
    args = lib.PROTOTYPES["cudnnSetTensorNdDescriptor"][1]
    assert args[0] is lib.cudnnTensorDescriptor_t and args[3]._type_ is ctypes.c_int


def test_handle_types_are_distinct():
    handles = [h["name"] for h in MANIFEST["handles"]]
    classes = {getattr(lib, h) for h in handles}
    assert len(classes) == len(handles) == 21
    assert all(issubclass(c, ctypes.c_void_p) for c in classes)
    t = lib.cudnnTensorDescriptor_t()
    with pytest.raises(ctypes.ArgumentError):
        lib.cudnnSetFilter4dDescriptor(t, 0, 0, 1, 1, 1, 1)


@pytest.mark.parametrize("s", MANIFEST["structs"], ids=lambda s: s["name"])
def test_struct_layout(s):
    cls = getattr(lib, s["name"])
    assert ctypes.sizeof(cls) == s["size"]
    assert ctypes.alignment(cls) == s["align"]
    for f in s["fields"]:
        assert getattr(cls, f["name"]).offset == f["offset"], f["name"]
        assert getattr(cls, f["name"]).size == f["size"], f["name"]


def test_enum_values_match_manifest():
    n = 0
    for e in MANIFEST["enums"]:
        first_of_value: dict[int, str] = {}
        for m in e["members"]:
            member = enums.by_c_name(m["name"])
            assert int(member) == m["value"], m["name"]
            assert getattr(lib, m["name"]) == m["value"]
            first = first_of_value.setdefault(m["value"], m["name"])
            # an alias (or a second name for a value) resolves to the first name, as IntEnum does
            assert member.c_name == first, m["name"]
            n += 1
    assert n == 960
    assert len(enums.DEPRECATED_MEMBERS) >= 35


def test_enum_classes_and_deprecation_marks():
    assert enums.DataType.FLOAT == 0 and enums.DataType.FLOAT.c_name == "CUDNN_DATA_FLOAT"
    assert enums.DataType.c_type() == "cudnnDataType_t"
    assert enums.DataType.INT8x4.deprecated
    assert enums.Status.ALLOC_FAILED is enums.Status.INTERNAL_ERROR_HOST_ALLOCATION_FAILED
    assert enums.BackendOperationGraphMode.__members__  # the one signed enum
    assert min(int(m) for m in enums.BackendOperationGraphMode) == -1
    assert enums.Status(2002).category == 2000


def test_constants():
    assert lib.CUDNN_DIM_MAX == 8
    assert (lib.CUDNN_SEV_ERROR_EN, lib.CUDNN_SEV_WARNING_EN, lib.CUDNN_SEV_INFO_EN) == (2, 4, 8)
    assert lib.CUDNN_BN_MIN_EPSILON == 0.0 and pytest.approx(1e-5) == lib.CUDNN_LRN_MIN_K
    assert lib.CUDNN_VERSION == lib.HEADER_VERSION == 92800
    assert lib.CUDNN_MAX_DEVICE_VERSION == 1210
    assert lib.CUDNN_STATUS_CATEGORY(2007) == 2000 and lib.CUDNN_STATUS_SPECIFIC_ERROR(2007) == 7
    assert lib.CUDNN_STATUS_FULL_ERROR_CODE(3000, 5) == 3005


def test_callback_type():
    proto = lib.cudnnCallback_t
    assert proto._restype_ is None
    assert proto._argtypes_[2]._type_ is lib.cudnnDebug_t


def test_missing_symbol_raises_only_when_called(monkeypatch):
    from pycudnn import _loader

    fn = _loader.bind("cudnnThisFunctionDoesNotExist", lib.cudnnStatus_t, ())
    loaded = str(lib.cudnnGetVersion())
    with pytest.raises(
        _loader.SymbolNotFoundError, match=rf"cudnnThisFunctionDoesNotExist.*{loaded}"
    ):
        fn()
    assert not lib.has("cudnnThisFunctionDoesNotExist")
    assert isinstance(_loader.SymbolNotFoundError("x"), AttributeError)


def test_unknown_attribute():
    with pytest.raises(AttributeError):
        lib.cudnnNoSuchThing  # noqa: B018


def test_the_public_faces_are_the_generated_modules():
    """``pycudnn.lib`` is the generated module itself (so patches and lazily bound functions are
    shared), ``pycudnn._lib`` the same module under its old name; ``pycudnn.enums`` re-exports
    the generated enums."""
    import pycudnn
    from pycudnn import _generated, _lib, enums
    from pycudnn._generated import enums as generated_enums

    assert lib is _lib is _generated.lib is pycudnn.lib
    assert enums.DataType is generated_enums.DataType and enums.by_c_name("CUDNN_DATA_FLOAT") == 0
