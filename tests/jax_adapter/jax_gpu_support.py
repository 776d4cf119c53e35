"""What the ``pycudnn.jax`` GPU test modules share (imported by them; not a test module): the
device fixture (the module skips without JAX's CUDA backend), float64 enabled, fresh random
inputs and NaN-poisoned memory.

A module uses the fixtures by importing them (``from jax_gpu_support import float64, gpu``):
``float64`` is autouse wherever it is imported."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")

_seeds = itertools.count(1)


def cuda_device() -> Any:
    """JAX's first CUDA device, or a skip saying why there is none."""
    try:
        devices = jax.devices("cuda")
    except RuntimeError as exc:
        pytest.skip(f"JAX has no CUDA backend here: {exc}")
    return devices[0]


@pytest.fixture(scope="module")
def gpu():
    """JAX's first CUDA device (the module skips without one)."""
    return cuda_device()


@pytest.fixture(scope="module", autouse=True)
def float64():
    """float64 operands allowed (the tests give every array its dtype)."""
    if hasattr(jax, "enable_x64"):  # the context manager (jax 0.10+)
        with jax.enable_x64(True):
            yield
    else:
        jax.config.update("jax_enable_x64", True)
        yield
        jax.config.update("jax_enable_x64", False)


def rand(gpu, shape, dtype="float32", scale=1.0):
    """Fresh standard-normal values (times *scale*) of *dtype* on *gpu*."""
    a = np.random.default_rng(next(_seeds)).standard_normal(shape) * scale
    return jax.device_put(a.astype(dtype), gpu)


def poison(gpu, *arrays):
    """Fill and free device memory with NaN in the sizes of *arrays*: the allocator hands such
    blocks to the next outputs, so an element a call fails to write shows as NaN."""
    junk = [jax.device_put(np.full(np.shape(a), np.nan, np.dtype(a.dtype)), gpu) for a in arrays]
    jax.block_until_ready(junk)
    del junk
