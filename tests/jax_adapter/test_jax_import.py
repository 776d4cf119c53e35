"""``pycudnn.jax`` is optional: nothing imports JAX until one of its names is used, and without
JAX that use says what to install. These tests need no JAX (they hide it when it is there)."""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=ROOT
    )


def test_import_pycudnn_and_pycudnn_jax_import_no_jax():
    r = _run(
        "import sys, pycudnn, pycudnn.jax\n"
        "import pycudnn.jax._capi, pycudnn.jax._header, pycudnn.jax._frame, pycudnn.jax._handler\n"
        # the run side of the operations (what XLA's calls execute) needs no JAX either
        "import pycudnn.jax._request, pycudnn.jax._operands, pycudnn.jax._bound\n"
        "print(sorted(m for m in sys.modules if m == 'jax' or m.startswith(('jax.', 'jaxlib'))))"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_a_name_without_jax_raises_an_import_error_saying_what_to_install():
    r = _run(
        "import sys\n"
        "sys.modules['jax'] = None  # as if JAX were not installed\n"
        "import pycudnn.jax\n"
        "assert pycudnn.jax.is_available() is False\n"
        "try:\n"
        "    from pycudnn.jax import register_handler\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "else:\n"
        "    print('no error')\n"
    )
    assert r.returncode == 0, r.stderr
    assert "pycudnn.jax.register_handler needs JAX, which is not installed" in r.stdout
    assert 'pip install -e ".[jax]"' in r.stdout


def test_undeclared_names_raise_attribute_error():
    import pycudnn.jax

    with pytest.raises(AttributeError):
        pycudnn.jax.no_such_name  # noqa: B018
    assert "register_handler" in dir(pycudnn.jax)
    assert "ffi_call" in pycudnn.jax.__all__


def test_the_mirrors_have_the_sizes_of_api_versions_0_3_and_0_4_on_64_bit():
    """The sizes XLA declares for jaxlib 0.10.2's header (API 0.3) and jaxlib 0.11.2's (API
    0.4), computed as XLA does (``XLA_FFI_STRUCT_SIZE``: the end of the last field); the header
    check repeats this against whatever jaxlib is installed."""
    from pycudnn.jax import _capi

    if ctypes.sizeof(ctypes.c_void_p) != 8:
        pytest.skip("the expected sizes are those of a 64-bit ABI")
    for gen, getter_size in ((_capi.API_0_3, 32), (_capi.API_0_4, 36)):
        sizes = {name: _capi.struct_size(cls) for name, cls in gen.mirrors.items()}
        assert sizes["XLA_FFI_CallFrame"] == 168  # the frame's struct_size ends at attrs
        assert sizes["XLA_FFI_Buffer"] == 48
        assert sizes["XLA_FFI_Error_Create_Args"] == 28
        assert sizes[gen.error_getter + "_Args"] == getter_size
        assert sizes["XLA_FFI_Stream_Get_Args"] == 32
        assert sizes["XLA_FFI_Metadata"] == 36
        assert sizes["XLA_FFI_Api_Version"] == 24
        assert gen.api.XLA_FFI_Stream_Get.offset == 80
        assert getattr(gen.api, gen.error_getter).offset == 56
