"""The JAX adapter's tests (``pycudnn.jax``): the lazy import and the ctypes mirrors run
everywhere; the handler's tests need JAX (each module skips without it) and run on JAX's CPU
platform; ``*_gpu.py`` needs a GPU and JAX with CUDA (markers ``gpu`` and ``jax``).

JAX preallocates most of a GPU's memory when its CUDA backend starts: on a GPU machine that
would starve the other tests of the process, so preallocation is switched off here (before any
test module imports JAX) unless the environment says otherwise.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
