"""The high-level layer: eager functions modelled on Theano's ``theano.gpuarray.dnn``.

Convolutions (:mod:`.conv`): ``dnn_conv``, ``dnn_conv3d``, ``dnn_gradinput``,
``dnn_gradinput3d``, ``dnn_gradweight``, ``dnn_gradweight3d``. Each module keeps its own plan or
algorithm caches; :func:`clear_caches` empties all of them.
"""

from __future__ import annotations

from . import conv
from .conv import (
    dnn_conv,
    dnn_conv3d,
    dnn_gradinput,
    dnn_gradinput3d,
    dnn_gradweight,
    dnn_gradweight3d,
)

__all__ = [
    "clear_caches",
    "dnn_conv",
    "dnn_conv3d",
    "dnn_gradinput",
    "dnn_gradinput3d",
    "dnn_gradweight",
    "dnn_gradweight3d",
]


def clear_caches() -> None:
    """Drop every cached plan, variant pack and algorithm choice of the high-level layer (all
    threads). The next call of each operation searches again."""
    conv.clear_caches()
