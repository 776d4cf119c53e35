"""Checked cuDNN calls: ``pycudnn.api.<C name>`` is ``pycudnn.lib.<C name>`` raising on failure.

A status-returning function raises the :mod:`pycudnn.errors` exception of its status category
(with cuDNN's last error text) and returns None on success; the few functions that return a
value (``cudnnGetVersion``, ``cudnnGetErrorString``, ...) return it unchanged. A
``CUDNN_DEPRECATED`` function warns once with ``CudnnDeprecationWarning``.
"""

from collections.abc import Callable
from typing import Any

from ._generated import lib as _lib
from .errors import checked


def __getattr__(name: str) -> Callable[..., Any]:
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        fn = checked(name)
    except AttributeError:
        raise AttributeError(f"module 'pycudnn.api' has no attribute {name!r}") from None
    globals()[name] = fn  # later lookups skip __getattr__
    return fn


def __dir__() -> list[str]:
    return sorted(_lib.PROTOTYPES)
