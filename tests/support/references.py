"""float64 NumPy references shared by the GPU tests and the GPU fuzzer (one formula each)."""

from __future__ import annotations

import numpy as np

__all__ = ["act_grad_ref", "act_ref", "conv_ref"]


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
    if mode == "gelu":  # erf form
        from math import erf

        return 0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2.0)))
    if mode == "gelu_tanh":
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    return x


def conv_ref(x, w, pads):
    """Cross-correlation of ``(N, C, *spatial)`` with ``(K, C, *kernel)`` filters, unit stride and
    dilation, one group, symmetric zero padding *pads*, in float64."""
    nd = x.ndim - 2
    xp = np.pad(np.asarray(x, np.float64), [(0, 0), (0, 0)] + [(p, p) for p in pads])
    out = [xp.shape[2 + i] - w.shape[2 + i] + 1 for i in range(nd)]
    y = np.zeros((x.shape[0], w.shape[0], *out))
    sp = "dhw"[-nd:]
    for off in np.ndindex(*w.shape[2:]):
        win = xp[
            (slice(None), slice(None), *(slice(o, o + n) for o, n in zip(off, out, strict=True)))
        ]
        y += np.einsum(f"kc,nc{sp}->nk{sp}", np.asarray(w, np.float64)[(Ellipsis, *off)], win)
    return y


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
