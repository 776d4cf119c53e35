"""Calls XLA may capture in its command buffers (``pycudnn.jax._capture``), without a GPU: the
switch, the workspace measurement's bookkeeping, the handle's workspace scope, and the
capturable target's path on JAX's CPU platform (the float64 numpy twins in cuDNN's place): the
call gets one more ``uint8`` result, the executor serves the call's workspace from it and hides
it from the computation. The GPU run (XLA's command buffers replaying pycudnn's launches) is
``test_jax_capture_gpu.py``."""

from __future__ import annotations

import types

import numpy as np
import pytest

pytest.importorskip("jax")
pytestmark = pytest.mark.jax

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jax_op_references as R  # noqa: E402

import pycudnn.jax as pj  # noqa: E402
from pycudnn import handle  # noqa: E402
from pycudnn.errors import AllocationError  # noqa: E402
from pycudnn.jax import _capture, _ops  # noqa: E402

R.register_twins("activation")


def test_switch_is_strict_and_returns_the_previous_setting():
    before = pj.use_command_buffers(False)
    try:
        assert _capture.enabled() is False
        assert pj.use_command_buffers(True) is False
        assert _capture.enabled() is True
        for bad in (1, 0, "yes", None):
            with pytest.raises(TypeError, match="expected True or False"):
                pj.use_command_buffers(bad)
    finally:
        pj.use_command_buffers(before)


def test_ffi_codes_of_numpy_dtypes():
    from pycudnn.jax import _capi, _frame

    assert _frame.ffi_code(np.float32) == int(_capi.DataType.F32)
    assert _frame.ffi_code(jnp.bfloat16) == int(_capi.DataType.BF16)
    assert _frame.numpy_dtype(_frame.ffi_code(np.uint8)) == np.uint8
    with pytest.raises(ValueError, match="has no XLA_FFI_DataType"):
        _frame.ffi_code(np.dtype("U3"))


def test_layout_aligns_every_buffer():
    offsets, total = _capture._layout([1, 0, 300, 256])
    assert offsets == [0, 256, 256, 768]
    assert total == 1024


def test_a_failed_measurement_means_not_capturable_and_is_remembered(monkeypatch):
    calls = []

    def fail(request, shapes, n_args):
        calls.append(shapes)
        raise RuntimeError("no GPU here")

    monkeypatch.setattr(_capture, "_measure", fail)
    req = _activation_request()
    ops, res = [((4, 8), np.float32)], [((4, 8), np.float32)]
    assert _capture.workspace_bytes(req, ops, res) is None
    assert _capture.workspace_bytes(req, ops, res) is None
    assert len(calls) == 1


def _activation_request():
    from pycudnn.jax._activation import Activation

    return Activation("relu", 0.0)


def test_handle_workspace_scope_serves_and_measures():
    fake = types.SimpleNamespace(_device=0)
    scope = handle.workspace_scope
    scope.given = (0x1000, 64)
    try:
        assert handle.Handle.workspace(fake, 0) == (0x1000, 64)
        assert handle.Handle.workspace(fake, 64) == (0x1000, 64)
        with pytest.raises(AllocationError, match="more than the 64 bytes given"):
            handle.Handle.workspace(fake, 65)
        scope.peak = 0
        handle.Handle.workspace(fake, 48)
        handle.Handle.workspace(fake, 16)
        assert scope.peak == 48
    finally:
        scope.given, scope.peak = None, -1


def test_capturable_call_gets_its_workspace_and_hides_it(monkeypatch):
    """With a workspace measured (patched: no GPU here), the call goes to the capturable target
    with a uint8[64] result; the executor serves the workspace from it during the call and the
    computation sees the call's own results only."""
    monkeypatch.setattr(_ops, "_on_gpu", lambda: True)
    monkeypatch.setattr(_capture, "workspace_bytes", lambda request, ops, res: 64)
    seen = []
    compute = R.compute

    def spy(request, args):
        seen.append(handle.workspace_scope.given)
        return compute(request, args)

    monkeypatch.setattr(R, "compute", spy)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 8)), jnp.float32)
    f = jax.jit(lambda x: pj.relu(x) * 2.0)
    text = f.lower(x).as_text()
    assert "pycudnn_jax_activation_cb" in text
    assert "tensor<64xui8>" in text
    y = f(x)
    np.testing.assert_allclose(np.asarray(y), np.maximum(np.asarray(x), 0) * 2.0, rtol=1e-6)
    assert len(seen) == 1 and seen[0] is not None and seen[0][1] == 64
    assert handle.workspace_scope.given is None
    g = jax.grad(lambda x: pj.relu(x).sum())(x)  # the backward's call goes the same way
    np.testing.assert_allclose(np.asarray(g), (np.asarray(x) > 0).astype(np.float32))


def test_off_or_not_measurable_uses_the_plain_target(monkeypatch):
    monkeypatch.setattr(_ops, "_on_gpu", lambda: True)
    monkeypatch.setattr(_capture, "workspace_bytes", lambda request, ops, res: None)
    x = jnp.ones((4, 8), jnp.float32)
    text = jax.jit(pj.relu).lower(x).as_text()
    assert "pycudnn_jax_activation_cb" not in text and "pycudnn_jax_activation" in text
    monkeypatch.setattr(_capture, "workspace_bytes", lambda request, ops, res: 64)
    before = pj.use_command_buffers(False)
    try:
        text = jax.jit(lambda x: pj.relu(x) + 0.0).lower(x).as_text()
    finally:
        pj.use_command_buffers(before)
    assert "pycudnn_jax_activation_cb" not in text
