"""Transitional: the epilogue helpers ``dnn_matmul`` imports from here now live in
:mod:`pycudnn.highlevel.conv._epilogue` (merged with the fused convolution). Delete this module
once ``matmul`` imports them from there."""

from __future__ import annotations

from .conv._epilogue import ACTIVATIONS, activation, epilogue

__all__ = ["ACTIVATIONS", "activation", "epilogue"]
