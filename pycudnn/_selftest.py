"""The GPU self-test of ``python -m pycudnn``: the public high-level functions on small inputs,
checked against NumPy.

Each case returns a one-line summary (the max error against a float64 NumPy reference) or raises;
``SelfTestSkip`` marks a case this version cannot run yet. Outputs are poisoned with NaN first,
so a call that writes nothing cannot pass.
"""

from __future__ import annotations

import numpy as np

__all__ = ["CASES", "SelfTestSkip"]


class SelfTestSkip(Exception):
    """The case cannot run in this build (reported as SKIP, not as a failure)."""


_rng = np.random.default_rng()


def _check(name: str, got: np.ndarray, want: np.ndarray, tol: float) -> str:
    err = float(np.max(np.abs(got.astype(np.float64) - want))) if want.size else 0.0
    if not np.isfinite(got).all() or err > tol:
        raise AssertionError(f"{name}: max abs error {err:.3g} > {tol:g}")
    return f"max abs error {err:.1e}"


def _poisoned(shape) -> object:
    from . import memory

    out = memory.empty(shape, np.float32)
    out.fill_(np.nan)
    return out


def conv() -> str:
    from . import memory
    from .highlevel import dnn_conv

    x = _rng.standard_normal((2, 3, 9, 9))
    w = _rng.standard_normal((4, 3, 3, 3))
    out = _poisoned((2, 4, 9, 9))
    dnn_conv(
        memory.to_device(x.astype(np.float32)),
        memory.to_device(w.astype(np.float32)),
        border_mode="half",
        conv_mode="cross",
        out=out,
    )
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))  # n c h w kh kw
    want = np.einsum("nchwij,kcij->nkhw", win, w)
    return _check("conv", out.get(), want, 1e-3)


def softmax() -> str:
    from . import memory
    from .highlevel import dnn_softmax

    x = _rng.standard_normal((4, 10, 3, 3))
    out = _poisoned(x.shape)
    dnn_softmax(memory.to_device(x.astype(np.float32)), "accurate", "channel", out=out)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return _check("softmax", out.get(), e / e.sum(axis=1, keepdims=True), 1e-5)


def pool() -> str:
    from . import memory
    from .highlevel import dnn_pool

    x = _rng.standard_normal((2, 3, 8, 8)).astype(np.float32)  # max pooling is exact in fp32
    out = _poisoned((2, 3, 4, 4))
    dnn_pool(memory.to_device(x), (2, 2), (2, 2), "max", out=out)
    want = x.reshape(2, 3, 4, 2, 4, 2).max(axis=(3, 5))
    return _check("pool", out.get(), want, 0.0)


def batchnorm() -> str:
    from . import memory
    from .highlevel import dnn_batch_normalization_test

    x = _rng.standard_normal((4, 3, 5, 5))
    scale, bias = _rng.standard_normal(3), _rng.standard_normal(3)
    mean, var = _rng.standard_normal(3), _rng.uniform(0.5, 2.0, 3)
    eps = 1e-5
    out = _poisoned(x.shape)
    params = [
        memory.to_device(a.astype(np.float32).reshape(1, 3, 1, 1)) for a in (scale, bias, mean, var)
    ]
    dnn_batch_normalization_test(
        memory.to_device(x.astype(np.float32)), *params, "spatial", eps, out=out
    )
    c = (slice(None), None, None)
    want = scale[c] * (x - mean[c]) / np.sqrt(var[c] + eps) + bias[c]
    return _check("batchnorm", out.get(), want, 1e-4)


def lstm() -> str:
    from . import memory
    from .highlevel.rnn import RNNBlock

    T, N, D, H = 5, 3, 6, 4
    x = _rng.standard_normal((T, N, D)).astype(np.float32)
    h0 = (0.5 * _rng.standard_normal((1, N, H))).astype(np.float32)
    c0 = (0.5 * _rng.standard_normal((1, N, H))).astype(np.float32)
    with RNNBlock("float32", H, 1, "lstm") as rnn:
        w = memory.to_device(_rng.uniform(-0.5, 0.5, rnn.get_param_size(D)).astype(np.float32))
        y, hy, cy = _poisoned((T, N, H)), _poisoned((1, N, H)), _poisoned((1, N, H))
        rnn.apply(
            w, memory.to_device(x), memory.to_device(h0), memory.to_device(c0), out=(y, hy, cy)
        )
        # gates in cuDNN's order (input, forget, new memory, output): W @ x + b_W + R @ h + b_R
        p = [
            (m.get().astype(np.float64), b.get().astype(np.float64))
            for m, b in rnn.split_params(w, 0, D)
        ]
    sig = lambda a: 1.0 / (1.0 + np.exp(-a))  # noqa: E731
    h, c, ys = h0[0].astype(np.float64), c0[0].astype(np.float64), []
    for t in range(T):
        a = [x[t] @ p[k][0].T + p[k][1] + h @ p[k + 4][0].T + p[k + 4][1] for k in range(4)]
        c = sig(a[1]) * c + sig(a[0]) * np.tanh(a[2])
        h = sig(a[3]) * np.tanh(c)
        ys.append(h)
    got = np.concatenate([y.get().ravel(), hy.get().ravel(), cy.get().ravel()])
    want = np.concatenate([np.stack(ys).ravel(), h.ravel(), c.ravel()])
    return _check("lstm", got, want, 1e-4)


CASES = [
    ("conv", conv),
    ("pool", pool),
    ("batchnorm", batchnorm),
    ("softmax", softmax),
    ("lstm", lstm),
]
