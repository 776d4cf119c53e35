"""float64 NumPy references shared by the GPU tests and the GPU fuzzer (one formula each)."""

from __future__ import annotations

import numpy as np

__all__ = ["act_grad_ref", "act_ref"]


def act_ref(x, mode, coef):
    if mode == "relu":
        return np.maximum(x, 0)
    if mode == "sigmoid":
        return 1 / (1 + np.exp(-x))
    if mode == "tanh":
        return np.tanh(x)
    if mode == "clipped_relu":
        return np.minimum(np.maximum(x, 0), coef)
    if mode == "elu":
        return np.where(x > 0, x, coef * (np.exp(x) - 1))
    if mode == "swish":
        return x / (1 + np.exp(-coef * x))
    return x


def act_grad_ref(x, y, dy, mode, coef):
    if mode == "relu":
        return dy * (x > 0)
    if mode == "sigmoid":
        return dy * y * (1 - y)
    if mode == "tanh":
        return dy * (1 - y * y)
    if mode == "clipped_relu":
        return dy * ((x > 0) & (x < coef))
    if mode == "elu":
        return dy * np.where(x > 0, 1.0, y + coef)
    if mode == "swish":
        s = 1 / (1 + np.exp(-coef * x))
        return dy * (s + coef * x * s * (1 - s))
    return dy
