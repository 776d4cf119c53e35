"""Host cost of one call through pycudnn.jax's FFI handler on JAX's CPU platform (not a test).

A jitted ``lax.fori_loop`` of N steps, each step one call on a small float32 vector, against the
same loop over XLA's own CPU op (``jnp.maximum(x, 0)``). Three handler sides: a function that
does nothing (the handler's own path: frame read, Call built, Python entered and left), one that
computes the ReLU in numpy on XLA's host buffers, and the operations' per-call path (their
executor: the ``op`` attribute and the signature read, the bound entry looked up, its handle
bound to the stream) with an entry bound once whose launch does nothing -- what a bound call
costs on a GPU before XLA's stream is asked for and cuDNN's launch. Prints the median per-step
time of each side over several repeats, in microseconds.

    python tests/jax_adapter/host_cost.py [--steps 20000] [--size 256] [--repeats 7]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

import pycudnn.jax as pj
from pycudnn.highlevel import _call
from pycudnn.jax import _bound
from pycudnn.jax._activation import Activation


def _noop(call):
    pass


def _relu(call):
    np.maximum(call.args[0].numpy(), 0, out=call.rets[0].numpy())


class _Handle:
    device = 0

    def set_stream(self, stream):
        pass


class _NoLaunch:
    """A lean entry whose launch does nothing (the high level's entries launch cuDNN)."""

    lean = True
    handle = _Handle()
    spans = (0, 0)

    def launch(self, ptrs):
        pass


def _bind_once(request, call, stream):
    _relu(call)
    _call.local.last = _NoLaunch()  # what the high level's run_cached leaves to be bound


def _loop(step, steps):
    return jax.jit(lambda x: jax.lax.fori_loop(0, steps, lambda i, v: step(v), x))


def _per_step_us(f, x, steps, repeats):
    f(x).block_until_ready()  # compile and warm
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(x).block_until_ready()
        times.append((time.perf_counter() - t0) / steps * 1e6)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--repeats", type=int, default=7)
    a = p.parse_args()
    cpu = jax.devices("cpu")[0]
    x = jax.device_put(np.random.default_rng(0).standard_normal(a.size).astype(np.float32), cpu)
    out = jax.ShapeDtypeStruct(x.shape, x.dtype)
    noop = pj.register_handler("pycudnn_host_cost_noop", _noop, platform="cpu")
    relu = pj.register_handler("pycudnn_host_cost_relu", _relu, platform="cpu")
    _call.one_device = True  # as after the first handle on a one-GPU machine
    bound = pj.register_handler(
        "pycudnn_host_cost_bound", _bound.Executor(_bind_once, 0), platform="cpu"
    )
    op = {_bound.ATTR: Activation("relu", 0.0).encode()}
    sides = {
        "XLA jnp.maximum(x, 0)": lambda v: jnp.maximum(v, 0),
        "handler, empty function": lambda v: pj.ffi_call(noop, out)(v),
        "handler, numpy ReLU": lambda v: pj.ffi_call(relu, out)(v),
        "operation, bound no-op launch": lambda v: pj.ffi_call(bound, out)(v, **op),
    }
    r = {k: _per_step_us(_loop(s, a.steps), x, a.steps, a.repeats) for k, s in sides.items()}
    print(
        f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, Python {platform.python_version()}, "
        f"{platform.processor() or platform.machine()}; {a.steps} steps x {a.repeats} repeats, "
        f"float32[{a.size}]"
    )
    base = r["XLA jnp.maximum(x, 0)"]
    for k, v in r.items():
        print(f"{k:30s} {v:8.2f} us/step   (+{v - base:.2f} us over XLA's op)")


if __name__ == "__main__":
    main()
