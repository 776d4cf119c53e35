"""The one FFI handler on JAX's CPU platform, under ``jax.jit``: operations defined here in numpy
on XLA's host buffers, registered through ``pycudnn.jax.register_handler`` and called through
``ffi_call``. The same handler serves the CUDA platform (``test_jax_gpu.py``)."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from pycudnn.jax import (  # noqa: E402
    Call,
    FfiTarget,
    HostBuffer,
    UnsupportedJaxlibError,
    check_abi,
    ffi_call,
    register_handler,
    registered_targets,
)

pytestmark = pytest.mark.jax
ROOT = Path(__file__).resolve().parents[2]
CPU = jax.devices("cpu")[0]
_names = itertools.count()


def _register(fn, name="scale"):
    """*fn* as a fresh CPU target (a name registers once per process)."""
    return register_handler(f"pycudnn_test_{name}_{next(_names)}", fn, platform="cpu")


def _scale(call: Call) -> None:
    (x,), (y,) = call.args, call.rets
    y.numpy()[...] = x.numpy() * call.attrs["scale"]


def _jitted(target, n_out=None, **attrs):
    def run(*xs):
        out = (
            jax.ShapeDtypeStruct(xs[0].shape, xs[0].dtype)
            if n_out is None
            else [jax.ShapeDtypeStruct(xs[0].shape, xs[0].dtype)] * n_out
        )
        return ffi_call(target, out)(*xs, **attrs)

    return jax.jit(run)


def _on_cpu(a):
    return jax.device_put(a, CPU)


@pytest.mark.parametrize(
    ("dtype", "shape"),
    [
        ("float32", (7,)),
        ("float32", (2, 3, 4)),
        ("float64", (3, 5)),
        ("float16", (4, 4)),
        ("int32", (2, 2, 2, 2)),
        ("int8", (9,)),
        ("float32", ()),
    ],
)
def test_scale_under_jit_equals_numpy(dtype, shape):
    if dtype == "float64" and not jax.config.jax_enable_x64:
        pytest.skip("float64 needs jax_enable_x64")
    seen = []

    def scale(call):
        seen.append((call.args[0].dtype, call.args[0].shape, type(call.args[0])))
        _scale(call)

    target = _register(scale)
    x = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
    # a float32 attribute for every dtype: XLA refuses float16 scalar attributes
    y = _jitted(target, scale=np.float32(3))(_on_cpu(x))
    np.testing.assert_array_equal(np.asarray(y), (x * np.float32(3)).astype(dtype))
    assert seen == [(np.dtype(dtype), shape, HostBuffer)]


def test_bfloat16_buffers_have_ml_dtypes_dtype():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    seen = []

    def copy(call):
        seen.append(call.args[0].dtype)
        call.rets[0].numpy()[...] = call.args[0].numpy()

    x = np.linspace(-2, 2, 8).astype(ml_dtypes.bfloat16)
    y = _jitted(_register(copy))(_on_cpu(x))
    assert seen == [np.dtype(ml_dtypes.bfloat16)]
    np.testing.assert_array_equal(np.asarray(y), x)


def test_several_operands_and_results_in_order():
    def addsub(call):
        a, b = (buf.numpy() for buf in call.args)
        s, d = (buf.numpy() for buf in call.rets)
        s[...] = a + b
        d[...] = a - b

    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.full((2, 3), 10, np.float32)
    s, d = _jitted(_register(addsub), n_out=2)(_on_cpu(a), _on_cpu(b))
    np.testing.assert_array_equal(np.asarray(s), a + b)
    np.testing.assert_array_equal(np.asarray(d), a - b)


def test_attributes_scalars_strings_arrays_and_dicts_are_read():
    got = {}

    def record(call):
        got.update(call.attrs)
        call.rets[0].numpy()[...] = call.args[0].numpy()

    attrs = dict(
        f32=np.float32(1.5),
        f64=2.25,  # a Python float: XLA passes it as float64
        i32=np.int32(-7),
        i64=123,
        u8=np.uint8(200),
        flag=True,
        mode="relu",
        empty="",
        ints=np.array([1, 2, 3], np.int64),
        floats=np.array([0.5, -1.0], np.float32),
        nested={"alpha": np.float32(0.25), "name": "x"},
    )
    x = np.ones(3, np.float32)
    _jitted(_register(record), **attrs)(_on_cpu(x)).block_until_ready()
    assert got["f32"] == 1.5 and isinstance(got["f32"], float)
    assert got["f64"] == 2.25
    assert got["i32"] == -7 and isinstance(got["i32"], int)
    assert got["i64"] == 123 and got["u8"] == 200
    assert got["flag"] is True
    assert got["mode"] == "relu" and got["empty"] == ""
    np.testing.assert_array_equal(got["ints"], [1, 2, 3])
    assert got["ints"].dtype == np.int64
    np.testing.assert_array_equal(got["floats"], np.array([0.5, -1.0], np.float32))
    assert got["nested"] == {"alpha": 0.25, "name": "x"}
    assert list(got) == sorted(attrs)  # XLA sorts the attributes by name


def test_an_exception_becomes_a_jax_error_with_its_message_and_the_process_goes_on():
    def check(call):
        if call.attrs["scale"] < 0:
            raise ValueError(f"scale must be >= 0, got {call.attrs['scale']}")
        _scale(call)

    target = _register(check)
    x = _on_cpu(np.ones(4, np.float32))
    with pytest.raises(Exception, match=r"ValueError: scale must be >= 0, got -1\.0") as info:
        _jitted(target, scale=np.float32(-1))(x).block_until_ready()
    assert "INVALID_ARGUMENT" in str(info.value)
    assert target.name in str(info.value)
    # the same target, and another, still work afterwards
    np.testing.assert_array_equal(np.asarray(_jitted(target, scale=np.float32(2))(x)), 2.0)


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (NotImplementedError("no such mode"), "UNIMPLEMENTED"),
        (RuntimeError("cuDNN said no"), "INTERNAL"),
        (KeyError("scale"), "INTERNAL"),
        (TypeError("bad dtype"), "INVALID_ARGUMENT"),
        (MemoryError("no workspace"), "RESOURCE_EXHAUSTED"),
        (IndexError("no operand 3"), "OUT_OF_RANGE"),
    ],
)
def test_exception_types_map_to_xla_error_codes(exc, code):
    def fail(call):
        raise exc

    with pytest.raises(Exception, match=f"{code}.*{type(exc).__name__}") as info:
        _jitted(_register(fail))(_on_cpu(np.ones(2, np.float32))).block_until_ready()
    assert str(exc) in str(info.value)


def test_an_exception_in_a_child_process_leaves_it_running():
    """The crash-safety claim in a fresh process: a failing call, then a good one, then exit 0."""
    code = (
        "import numpy as np, jax, pycudnn.jax as pj\n"
        "def bad(call): raise RuntimeError('boom')\n"
        "t = pj.register_handler('child_bad', bad, platform='cpu')\n"
        "x = jax.device_put(np.ones(3, np.float32), jax.devices('cpu')[0])\n"
        "f = jax.jit(lambda x: pj.ffi_call(t, jax.ShapeDtypeStruct(x.shape, x.dtype))(x))\n"
        "for _ in range(3):\n"
        "    try:\n"
        "        f(x).block_until_ready()\n"
        "    except Exception as exc:\n"
        "        print(type(exc).__name__, exc)\n"
        "print('alive', float(jax.numpy.sum(x)))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=ROOT
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("RuntimeError: boom") == 3
    assert "alive 3.0" in r.stdout


def test_the_stream_is_asked_of_xla_and_the_cpu_has_none():
    def stream(call):
        call.stream  # noqa: B018

    with pytest.raises(Exception, match="XLA has no stream for"):
        _jitted(_register(stream))(_on_cpu(np.ones(2, np.float32))).block_until_ready()


def test_outside_jit_and_in_a_loop():
    target = _register(_scale)
    x = _on_cpu(np.arange(4, dtype=np.float32))
    y = ffi_call(target, jax.ShapeDtypeStruct(x.shape, x.dtype))(x, scale=np.float32(2))
    np.testing.assert_array_equal(np.asarray(y), [0, 2, 4, 6])

    @jax.jit
    def loop(x):
        out = jax.ShapeDtypeStruct(x.shape, x.dtype)
        body = lambda i, v: ffi_call(target, out)(v, scale=np.float32(2))  # noqa: E731
        return jax.lax.fori_loop(0, 5, body, x)

    np.testing.assert_array_equal(np.asarray(loop(x)), np.arange(4) * 32)


def test_registration_is_recorded_and_names_are_unique():
    target = _register(_scale)
    assert isinstance(target, FfiTarget)
    assert target in registered_targets()
    assert target.platform == "cpu" and target.address
    assert target.api_version == check_abi().api_version
    with pytest.raises(ValueError, match="already registered"):
        register_handler(target.name, _scale, platform="cpu")
    with pytest.raises(ValueError, match=r"not a target registered by pycudnn\.jax"):
        ffi_call("pycudnn_test_never_registered", jax.ShapeDtypeStruct((1,), np.float32))
    with pytest.raises(TypeError, match="callable"):
        register_handler("pycudnn_test_not_callable", 3, platform="cpu")


def test_check_abi_reads_the_installed_header():
    import jaxlib

    report = check_abi()
    assert report.jaxlib_version == jaxlib.__version__
    assert report.api_version[0] == 0
    assert report.header.endswith("c_api.h")
    assert report.structs["XLA_FFI_CallFrame"] >= 168
    assert report.generation == ("0.3" if report.api_version <= (0, 3) else "0.4")


def test_an_unsupported_major_version_is_refused_naming_jaxlib(monkeypatch):
    import jaxlib

    from pycudnn.jax import _capi

    monkeypatch.setattr(_capi, "SUPPORTED_MAJOR", 1)
    with pytest.raises(UnsupportedJaxlibError, match=f"jaxlib {jaxlib.__version__}.*major"):
        register_handler("pycudnn_test_refused_major", _scale, platform="cpu")
    assert all(t.name != "pycudnn_test_refused_major" for t in registered_targets())
