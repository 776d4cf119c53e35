"""Per-call cost of ``pycudnn.jax``'s FFI handler: Python calls per call (``cProfile``,
deterministic) and microseconds per call in a jitted ``lax.fori_loop``, next to XLA's own op.

Rows on JAX's CPU platform (always; XLA runs the handler there as on a GPU, minus the stream
query and cuDNN):

* ``handler, empty function``: the handler's own path (frame read, Python entered and left);
* ``executor 1->1`` / ``executor 2->1``: an operation's per-call path (its executor: the ``op``
  text and the signature read, the bound entry looked up, its handle bound to the stream) with
  an entry bound once whose launch does nothing, on one operand (an activation's arity) and on
  two (a convolution's x, w);

and, where JAX has a CUDA backend, the same executor on CUDA (XLA's real stream query; the
launch still does nothing), then ``relu``, ``softmax``, ``max_pool`` and ``conv3x3`` through
pycudnn's real launches against XLA's own ops (``test_jax_ops_gpu.py``'s host-cost sides), and
which thread XLA calls the handler on (a thread without a Python thread state of its own would
get a fresh one, and lose thread-local state, on every call).

Calls per call: ``cProfile``'s total calls over a jitted loop of the side minus the same loop of
XLA's op (JAX's dispatch), per step; counted only when XLA calls the handler on the profiling
thread (the CPU platform does; the output says). Microseconds: median over repeats of the
loop's time per step; ``+`` is over XLA's op.

    PYTHONPATH=. python bench/jax_handler_calls.py [--steps 20000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import platform
import pstats
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# pycudnn's workspaces live outside XLA's pool (as the tests run)
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
from jax import lax

import pycudnn.jax as pj
from pycudnn.highlevel import _call
from pycudnn.jax import _bound
from pycudnn.jax._activation import Activation


class _Handle:
    device = 0

    def set_stream(self, stream: int) -> int:
        return stream


class _NoLaunch:
    """A lean entry whose launch does nothing (the high level's launch cuDNN)."""

    lean = True
    handle = _Handle()

    def __init__(self, n: int) -> None:
        self.spans = (0,) * n

    def launch(self, ptrs: Any) -> None:
        pass


def _binder(n: int) -> Any:
    def bind(request: Any, call: Any, stream: int) -> None:
        _call.local.last = _NoLaunch(n)  # what run_cached leaves to be bound

    return bind


def _executor(n: int, platform_name: str) -> Any:
    """An executor binding a no-op entry of *n* pointers; on the CPU no stream (0)."""
    if platform_name != "cpu":
        return _bound.Executor(_binder(n))
    # a fixed stream where the executor takes one (its fast path), else a getter
    fixed: Any = 0 if hasattr(_bound.Executor, "on_frame") else (lambda call: 0)
    return _bound.Executor(_binder(n), fixed)


def _loop(step: Any, steps: int) -> Any:
    return jax.jit(lambda *a: lax.fori_loop(0, steps, lambda i, v: step(v, *a[1:]), a[0]))


def _us(f: Any, args: tuple, steps: int, repeats: int) -> float:
    jax.block_until_ready(f(*args))  # compile and warm (binds)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append((time.perf_counter() - t0) / steps * 1e6)
    return statistics.median(times)


def _calls(f: Any, args: tuple) -> int:
    jax.block_until_ready(f(*args))
    prof = cProfile.Profile()
    prof.enable()
    jax.block_until_ready(f(*args))
    prof.disable()
    stats = pstats.Stats(prof)
    if _PROFILE:
        stats.sort_stats("ncalls").print_stats(25)
    return stats.total_calls  # type: ignore[attr-defined]


_PROFILE = False


def _rows(sides: dict[str, Any], args: tuple, steps: int, repeats: int, base: str) -> list:
    """``(name, us, calls)`` per side, over *steps*-step loops (calls over *steps* // 10)."""
    few = max(steps // 10, 100)
    out = []
    for name, step in sides.items():
        us = _us(_loop(step, steps), args, steps, repeats)
        calls = _calls(_loop(step, few), args)
        out.append((name, us, calls))
    b_us, b_calls = next((u, c) for n, u, c in out if n == base)
    return [(n, u, u - b_us, (c - b_calls) / few) for n, u, c in out]


def _print(title: str, rows: list) -> None:
    print(f"\n{title}")
    for name, us, plus, calls in rows:
        print(f"  {name:34s} {us:8.2f} us/call (+{plus:6.2f})  {calls:6.1f} Python calls/call")


def _thread_report(platform_name: str, device: Any) -> str:
    """Which thread XLA calls a handler on, and whether its thread-local state lasts."""
    seen: list[tuple[bool, bool]] = []
    local = threading.local()
    main = threading.main_thread().ident

    def probe(call: Any) -> None:
        kept = getattr(local, "n", 0) > 0
        local.n = getattr(local, "n", 0) + 1
        seen.append((threading.get_ident() == main, kept))

    t = pj.register_handler(f"pycudnn_bench_thread_{platform_name}", probe, platform=platform_name)
    x = jax.device_put(np.zeros(4, np.float32), device)
    out = jax.ShapeDtypeStruct(x.shape, x.dtype)
    f = jax.jit(lambda v: lax.fori_loop(0, 50, lambda i, u: pj.ffi_call(t, out)(u), v))
    jax.block_until_ready(f(x))
    jax.block_until_ready(f(x))
    on_main = sum(m for m, _k in seen)
    kept = sum(k for _m, k in seen)
    return (
        f"handler thread: {on_main}/{len(seen)} calls on the main thread; thread-local state "
        f"kept in {kept}/{len(seen)} (a fresh Python thread state per call keeps none)"
    )


def _cpu(steps: int, repeats: int) -> None:
    cpu = jax.devices("cpu")[0]
    _call.one_device = True  # as on a one-GPU machine after its first handle (no device query)
    x = jax.device_put(np.random.default_rng(0).standard_normal(256).astype(np.float32), cpu)
    out = jax.ShapeDtypeStruct(x.shape, x.dtype)
    noop = pj.register_handler("pycudnn_bench_noop", lambda call: None, platform="cpu")
    one = pj.register_handler("pycudnn_bench_exe1", _executor(2, "cpu"), platform="cpu")
    two = pj.register_handler("pycudnn_bench_exe2", _executor(3, "cpu"), platform="cpu")
    op = {_bound.ATTR: Activation("relu", 0.0).encode()}
    sides = {
        "XLA jnp.maximum(x, 0)": lambda v: jnp.maximum(v, 0),
        "handler, empty function": lambda v: pj.ffi_call(noop, out)(v),
        "executor 1->1, no-op launch": lambda v: pj.ffi_call(one, out)(v, **op),
        "executor 2->1, no-op launch": lambda v: pj.ffi_call(two, out)(v, v, **op),
    }
    rows = _rows(sides, (x,), steps, repeats, "XLA jnp.maximum(x, 0)")
    _print(f"CPU platform, float32[256] ({_thread_report('cpu', cpu)})", rows)


def _fake_frame(n_args: int, keep: list) -> int:
    """An XLA_FFI_CallFrame of the execute stage in ctypes memory, as XLA makes one: *n_args*
    float32[1, 8, 16, 16] operands and one result, the ``op`` attribute of a sigmoid, and an
    API 0.4 table whose ``XLA_FFI_Stream_Get`` is a libc no-op returning 0
    (``pthread_mutexattr_destroy``); *keep* holds the memory. Returns its address."""
    import ctypes

    from pycudnn.jax import _capi

    def new(obj: Any) -> Any:
        keep.append(obj)
        return obj

    api = new(_capi.Api04())
    api.struct_size = _capi.struct_size(_capi.Api04)
    api.api_version.major_version, api.api_version.minor_version = 0, 4
    noop = ctypes.cast(ctypes.CDLL(None).pthread_mutexattr_destroy, ctypes.c_void_p).value
    api.XLA_FFI_Stream_Get = _capi.StreamGet(noop)
    dims = new((ctypes.c_int64 * 4)(1, 8, 16, 16))
    data = new((ctypes.c_float * 2048 * (n_args + 1))())

    def buffers(first: int, n: int) -> Any:
        out = new((ctypes.c_void_p * n)())
        for i in range(n):
            b = new(_capi.Buffer(_capi.struct_size(_capi.Buffer), None, 11, 0, 4, dims))
            b.data = ctypes.addressof(data) + 8192 * (first + i)
            out[i] = ctypes.addressof(b)
        return out

    text = Activation("sigmoid", 0.0).encode().encode()  # (no real side's: see _gpu)
    name = new(_capi.ByteSpan(ctypes.cast(new(ctypes.c_char_p(b"op")), ctypes.c_void_p), 2))
    value = new(ctypes.create_string_buffer(text, len(text)))
    span = new(_capi.ByteSpan(ctypes.addressof(value), len(text)))
    types = new((ctypes.c_int * 1)(int(_capi.AttrType.STRING)))
    names = new((ctypes.POINTER(_capi.ByteSpan) * 1)(ctypes.pointer(name)))
    values = new((ctypes.c_void_p * 1)(ctypes.addressof(span)))
    f = new(_capi.CallFrame())
    f.struct_size = _capi.struct_size(_capi.CallFrame)
    f.api = ctypes.addressof(api)
    f.ctx = 0x5000
    f.stage = int(_capi.Stage.EXECUTE)
    f.args.size, f.args.args = (
        n_args,
        ctypes.cast(buffers(0, n_args), ctypes.POINTER(ctypes.c_void_p)),
    )
    f.rets.size, f.rets.rets = 1, ctypes.cast(buffers(n_args, 1), ctypes.POINTER(ctypes.c_void_p))
    f.attrs.size, f.attrs.types = 1, types
    f.attrs.names = names
    f.attrs.attrs = ctypes.cast(values, ctypes.POINTER(ctypes.c_void_p))
    return ctypes.addressof(f)


def _direct(repeats: int) -> None:
    """The handler's Python called directly on a fake frame (no XLA, no ctypes callback): the
    GPU platform's per-call path as it is on the GPU -- the default executor, XLA's stream asked
    through the table -- up to a bound launch that does nothing. Minimum over repeats (robust to
    a loaded machine), and cProfile's calls."""
    import functools
    import timeit

    from pycudnn.jax import _capi, _frame, _handler

    print(
        "\nthe handler called directly on a fake GPU call frame (XLA's stream through the table):"
    )
    keep: list = []
    for n_args in (1, 2):
        exe = _bound.Executor(_binder(n_args + 1))
        h = _handler._Handler(f"bench{n_args}", exe, _frame.DeviceBuffer, (0, 4), 0, _capi.API_0_4)
        addr = _fake_frame(n_args, keep)
        for _ in range(3):  # the table checked, the entry bound
            assert h(addr) is None
        assert _bound.bound_count() >= 1
        n = 20000
        one = functools.partial(h, addr)
        us = min(timeit.repeat(one, number=n, repeat=repeats)) / n * 1e6
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(1000):
            one()
        prof.disable()
        calls = pstats.Stats(prof).total_calls / 1000  # type: ignore[attr-defined]
        print(
            f"  executor {n_args}->1, no-op launch{us:20.2f} us/call  "
            f"{calls:6.1f} Python calls/call"
        )


def _stream_getter(repeats: int) -> None:
    """XLA's stream query as the GPU path makes it, on a fake API table whose
    ``XLA_FFI_Stream_Get`` is a libc no-op returning 0 (``pthread_mutexattr_destroy``): the
    handler's getter (when this tree has one) against a Call's (new arguments, the table's
    entry read, a ctypes call releasing the lock), per query."""
    import ctypes
    import functools
    import timeit

    from pycudnn.jax import _capi, _frame

    noop = ctypes.cast(ctypes.CDLL(None).pthread_mutexattr_destroy, ctypes.c_void_p).value
    api = _capi.Api04()
    api.XLA_FFI_Stream_Get = _capi.StreamGet(noop)
    size = _capi.struct_size(_capi.StreamGetArgs)

    def by_call() -> int:  # what Call.stream does
        args = _capi.StreamGetArgs(size, None, 12345, None)
        error = api.XLA_FFI_Stream_Get(ctypes.byref(args))
        assert not error
        return args.stream or 0

    sides = {"a Call's query (per call before)": by_call}
    if hasattr(_frame, "stream_getter"):
        sides["the handler's getter"] = functools.partial(
            _frame.stream_getter("bench", api, _capi.API_0_4), 12345
        )
    print("\nXLA's stream query on a fake table (a libc no-op), per query:")
    for name, fn in sides.items():
        n = 100000
        t = min(timeit.repeat(fn, number=n, repeat=repeats)) / n * 1e6
        print(f"  {name:34s} {t:8.2f} us")


def _gpu(steps: int, repeats: int) -> None:
    try:
        gpu = jax.devices("cuda")[0]
    except RuntimeError:
        print("\n(no CUDA backend: the GPU rows are skipped)")
        return
    _call.one_device = len(jax.devices("cuda")) == 1
    rng = np.random.default_rng(0)
    x = jax.device_put(rng.standard_normal((1, 8, 16, 16)).astype(np.float32), gpu)
    w = jax.device_put((rng.standard_normal((8, 8, 3, 3)) * 0.01).astype(np.float32), gpu)
    out = jax.ShapeDtypeStruct(x.shape, x.dtype)
    one = pj.register_handler("pycudnn_bench_exe1_gpu", _executor(2, "cuda"), platform="CUDA")
    # a text no real side uses: bound launches are keyed by content, so the relu's text would
    # share one entry between the no-op executor and pycudnn's relu
    op = {_bound.ATTR: Activation("tanh", 0.0).encode()}
    pad = ((0, 0), (0, 0), (0, 8), (0, 8))
    sides = {
        "XLA relu": lambda v, w: jnp.maximum(v, 0),
        "executor 1->1, no-op launch": lambda v, w: pj.ffi_call(one, out)(v, **op),
        "pycudnn relu": lambda v, w: pj.relu(v),
        "XLA softmax": lambda v, w: jax.nn.softmax(v, axis=1),
        "pycudnn softmax": lambda v, w: pj.softmax(v, axis=1),
        "XLA max_pool": lambda v, w: jnp.pad(
            lax.reduce_window(v, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID"), pad
        ),
        "pycudnn max_pool": lambda v, w: jnp.pad(pj.max_pool(v, (2, 2)), pad),
        "XLA conv3x3": lambda v, w: lax.conv_general_dilated(v, w, (1, 1), [(1, 1), (1, 1)]),
        "pycudnn conv3x3": lambda v, w: pj.conv(v, w, 1, 1),
    }
    print(f"\nCUDA, {gpu.device_kind}: {_thread_report('CUDA', gpu)}")
    for name in ("relu", "softmax", "max_pool", "conv3x3"):
        pair = {k: sides[k] for k in (f"XLA {name}", f"pycudnn {name}")}
        if name == "relu":
            pair["executor 1->1, no-op launch"] = sides["executor 1->1, no-op launch"]
        _print(f"CUDA {name}, float32[1, 8, 16, 16]", _rows(pair, (x, w), steps, repeats,
                                                          f"XLA {name}"))  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--gpu-steps", type=int, default=2000)
    p.add_argument("--profile", action="store_true", help="print each side's cProfile table")
    a = p.parse_args()
    global _PROFILE
    _PROFILE = a.profile
    print(
        f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, Python "
        f"{platform.python_version()}, {platform.processor() or platform.machine()}; "
        f"{a.steps} steps (CPU), {a.gpu_steps} (CUDA), median of {a.repeats}"
    )
    _call.one_device = True  # as on a one-GPU machine after its first handle (no device query)
    _direct(a.repeats)
    _stream_getter(a.repeats)
    _cpu(a.steps, a.repeats)
    _gpu(a.gpu_steps, a.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
