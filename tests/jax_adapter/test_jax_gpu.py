"""The one FFI handler on the CUDA platform, running a pycudnn operation on XLA's buffers and
stream under ``jax.jit`` (markers ``gpu`` and ``jax``: skipped without a GPU or without JAX with
CUDA). Not run on the CPU machine this was written on: see docs/jax.md."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax_gpu_support as S  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.jax]
gpu = S.gpu  # the shared fixture
_names = itertools.count()


def _relu_target(mode="relu"):
    import pycudnn
    from pycudnn.jax import register_handler

    def relu(call):
        (x,), (y,) = call.args, call.rets
        pycudnn.dnn_activation(x, call.attrs.get("mode", mode), out=y, stream=call.stream)

    return register_handler(f"pycudnn_test_gpu_relu_{next(_names)}", relu, platform="CUDA")


def _run(target, x, **attrs):
    from pycudnn.jax import ffi_call

    @jax.jit
    def f(x):
        return ffi_call(target, jax.ShapeDtypeStruct(x.shape, x.dtype))(x, **attrs)

    return f(x)


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 8, 16, 16)])
def test_dnn_activation_on_xla_buffers_under_jit(gpu, shape):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    y = _run(_relu_target(), jax.device_put(x, gpu))
    np.testing.assert_array_equal(np.asarray(y), np.maximum(x, 0))


def test_a_pycudnn_error_surfaces_as_a_jax_error_with_its_message(gpu):
    x = jax.device_put(np.ones((2, 3, 4, 5), np.float32), gpu)
    target = _relu_target()
    with pytest.raises(Exception, match=r"pycudnn\.jax target .*ValueError.*nosuch"):
        _run(target, x, mode="nosuch").block_until_ready()
    np.testing.assert_array_equal(np.asarray(_run(target, x)), 1.0)  # the process goes on


def test_the_stream_is_xlas(gpu):
    from pycudnn.jax import register_handler

    streams = []

    def record(call):
        streams.append(call.stream)
        import pycudnn

        pycudnn.dnn_activation(call.args[0], "identity", out=call.rets[0], stream=call.stream)

    target = register_handler(f"pycudnn_test_gpu_stream_{next(_names)}", record, platform="CUDA")
    x = jax.device_put(np.ones((1, 1, 2, 2), np.float32), gpu)
    np.testing.assert_array_equal(np.asarray(_run(target, x)), 1.0)
    assert streams and isinstance(streams[0], int)
