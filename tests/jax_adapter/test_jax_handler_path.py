"""The per-call path of ``pycudnn.jax``'s handler (issue 41's host cost): the executor reads the
call frame itself (no ``Call`` built on a hit), the straight-line signature readers agree with
the generic one, XLA's stream is asked through the handler's getter, and the failures the
``Call`` readers report are reported the same. JAX's CPU platform; no GPU."""

from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax_op_references as R  # noqa: E402

import pycudnn.jax as pj  # noqa: E402
from pycudnn.highlevel import _call  # noqa: E402
from pycudnn.jax import _bound, _capi, _frame  # noqa: E402
from pycudnn.jax._activation import Activation  # noqa: E402

_RELU = Activation("relu", 0.0).encode()


def _cpu(a):
    return jax.device_put(a, jax.devices("cpu")[0])


def _buffers(specs):
    """XLA_FFI_Buffer structs for ``(dtype code, data, dims)`` specs, and the array of their
    addresses (kept alive by the returned list)."""
    keep, addrs = [], []
    for code, data, dims in specs:
        d = (ctypes.c_int64 * max(len(dims), 1))(*dims)
        b = _capi.Buffer(_capi.struct_size(_capi.Buffer), None, code, data, len(dims), d)
        keep += [d, b]
        addrs.append(ctypes.addressof(b))
    arr = (ctypes.c_void_p * max(len(addrs), 1))(*addrs)
    keep.append(arr)
    return ctypes.addressof(arr), keep


@pytest.mark.parametrize("n_args,n_rets", [(0, 0), (1, 0), (1, 1), (2, 1), (3, 2), (12, 5)])
def test_the_straight_line_signature_reader_reads_what_the_generic_one_reads(n_args, n_rets):
    rng = np.random.default_rng(n_args * 10 + n_rets)

    def specs(n):
        return [
            (
                int(rng.integers(1, 20)),
                int(rng.integers(0, 2**40)),
                tuple(rng.integers(0, 9, i % 5)),
            )
            for i in range(n)
        ]

    args, keep_a = _buffers(specs(n_args))
    rets, keep_r = _buffers(specs(n_rets))
    ptrs, sig = [], []
    _frame.signature(n_args, args, ptrs, sig)
    _frame.signature(n_rets, rets, ptrs, sig)
    got = _frame.decoder(n_args, n_rets)(args, rets)
    assert got == (tuple(ptrs), tuple(sig))
    assert _frame.decoder(n_args, n_rets) is _frame.decoder(n_args, n_rets)  # made once
    del keep_a, keep_r


class _Handle:
    device = 0

    def __init__(self):
        self.streams = []

    def set_stream(self, stream):
        self.streams.append(stream)


class _Entry:
    """A lean entry computing a ReLU on host pointers."""

    lean = True

    def __init__(self, n):
        self.handle, self.n, self.launches = _Handle(), n, []
        self.spans = (0, 0)

    def launch(self, ptrs):
        self.launches.append(ptrs)
        x, y = (np.ctypeslib.as_array((ctypes.c_float * self.n).from_address(p)) for p in ptrs)
        np.maximum(x, 0, out=y)


def _relu_target(name, stream, slow):
    def run(request, call, s):
        slow.append(s)
        R.twin(request, call, s)
        _call.local.last = _Entry(int(np.prod(call.args[0].shape)))

    return pj.register_handler(name, _bound.Executor(run, stream), platform="cpu")


def test_the_executor_reads_the_frame_itself_and_builds_a_call_only_on_a_miss(monkeypatch):
    built = []

    class Counted(_frame.Call):
        __slots__ = ()

        def __init__(self, *a):
            built.append(a[0])
            super().__init__(*a)

    monkeypatch.setattr(_frame, "Call", Counted)
    monkeypatch.setattr(_call, "one_device", True)
    slow = []
    target = _relu_target("pycudnn_test_path_frame", 5, slow)
    g = jax.jit(lambda x: pj.ffi_call(target, jax.ShapeDtypeStruct(x.shape, x.dtype))(x, op=_RELU))
    x = _cpu(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
    for i in range(4):
        np.testing.assert_array_equal(np.asarray(g(x * (i + 1))), np.maximum(x * (i + 1), 0))
    assert slow == [5]  # the fixed stream, the slow path once
    assert built == ["pycudnn_test_path_frame"]  # the miss's Call only


def test_a_fixed_stream_and_a_getter_bind_alike(monkeypatch):
    monkeypatch.setattr(_call, "one_device", True)
    # (other streams: the store is keyed by content, and the same text and signature on the
    # same stream would launch the entry the first target bound)
    for name, stream, s in (
        ("pycudnn_test_path_int", 3, 3),
        ("pycudnn_test_path_fn", lambda c: 4, 4),
    ):
        slow = []
        target = _relu_target(name, stream, slow)
        g = jax.jit(
            lambda x, t=target: pj.ffi_call(t, jax.ShapeDtypeStruct(x.shape, x.dtype))(x, op=_RELU)
        )
        x = _cpu(np.arange(-3, 3, dtype=np.float32))
        for _ in range(3):
            np.testing.assert_array_equal(np.asarray(g(x)), np.maximum(x, 0))
        assert slow == [s], name


def test_the_default_executor_asks_xla_for_the_stream_and_the_cpu_has_none():
    target = pj.register_handler(
        "pycudnn_test_path_stream", _bound.Executor(R.twin), platform="cpu"
    )
    x = _cpu(np.ones(3, np.float32))
    f = pj.ffi_call(target, jax.ShapeDtypeStruct(x.shape, x.dtype))
    for _ in range(2):  # (the getter's per-thread arguments reused)
        with pytest.raises(Exception, match="RuntimeError: XLA has no stream for"):
            jax.block_until_ready(f(x, op=_RELU))


def test_a_call_without_its_one_string_attribute_reports_it_on_the_frame_path():
    target = pj.register_handler(
        "pycudnn_test_path_no_op", _bound.Executor(R.twin, 0), platform="cpu"
    )
    x = _cpu(np.ones(3, np.float32))
    call = pj.ffi_call(target, jax.ShapeDtypeStruct(x.shape, x.dtype))
    with pytest.raises(Exception, match=r"TypeError: .*expected one string attribute, got the "
                       r"attributes \[\]"):  # fmt: skip
        jax.block_until_ready(call(x))
    with pytest.raises(Exception, match=r"got the attributes \['op'\]"):
        jax.block_until_ready(call(x, op=np.int32(1)))
    with pytest.raises(Exception, match=r"ValueError: pycudnn.jax: the op attribute b'x' is no"):
        jax.block_until_ready(call(x, op="x"))


def test_threads_calling_at_once_each_get_their_own_results(monkeypatch):
    monkeypatch.setattr(_call, "one_device", True)
    target = _relu_target("pycudnn_test_path_threads", 0, [])
    out = jax.ShapeDtypeStruct((64,), np.float32)
    g = jax.jit(
        lambda x: jax.lax.fori_loop(
            0, 50, lambda i, v: pj.ffi_call(target, out)(v - 0.5, op=_RELU), x
        )
    )
    errors = []

    def work(seed):
        try:
            x = np.random.default_rng(seed).standard_normal(64).astype(np.float32) + 30
            want = x.copy()
            for _ in range(50):
                want = np.maximum(want - np.float32(0.5), 0)
            for _ in range(5):
                np.testing.assert_allclose(np.asarray(g(_cpu(x))), want, rtol=1e-6)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
