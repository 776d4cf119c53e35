"""pycudnn.jax's operations against XLA's own, per jitted step, on the GPU (issue 41's speed
target: a jitted step per operation at <= 1.10x XLA's own kernel for convolution and attention).

Each case is one jitted function of K steps, unrolled, each step's result feeding the next (so
XLA can hoist nothing), timed by the wall clock around ``block_until_ready`` and divided by K:
per-step time with the host's enqueue overlapped, as in a jitted training step. Both sides of a
case run the same loop body except the operation (pycudnn's FFI call against ``lax``/``jax.nn``'s
own), interleaved over the repeats; medians. ``fwd+bwd`` steps take the gradient of
``sum(op(x) * t)`` and feed ``x - 1e-3 * dx`` (and the weights' gradient where there are
weights) to the next step.

    PYTHONPATH=. python3 bench/jax_ops.py [--steps 50] [--repeats 7] [--json FILE] [--plain]
        [--only conv,norm,small,softmax,attention,matmul,lrn,spatialtf,lstm,ctc]

``--plain`` adds a third side: pycudnn's loop traced with ``pycudnn.jax.use_command_buffers(False)``
(every call outside XLA's command buffers, as before they could capture pycudnn's calls).

Needs JAX with CUDA; cases whose pycudnn.jax function does not exist in this tree are skipped.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import pycudnn
import pycudnn.jax as pj

Case = tuple[str, Callable[[], tuple[Callable, Callable, tuple]], str]


def _rand(shape: tuple[int, ...], dtype: Any, seed: int, scale: float = 1.0) -> jax.Array:
    a = np.random.default_rng(seed).standard_normal(shape) * scale
    return jnp.asarray(a.astype(np.float32)).astype(dtype)


def _loop(step: Callable, steps: int) -> Callable:
    """K steps unrolled in one jitted function: straight-line code, as a model's step is (an
    XLA while loop would copy its predicate to the host every iteration, a sync)."""

    def run(*c: jax.Array) -> tuple:
        for _ in range(steps):
            c = step(*c)
        return c

    return jax.jit(run)


def _fwd_loop(op: Callable) -> Callable:
    """A shape-preserving op: the carry is its output."""

    def step(x: jax.Array, *rest: jax.Array) -> tuple:
        return (op(x, *rest), *rest)

    return step


def _train_loop(op: Callable, n_diff: int) -> Callable:
    """fwd+bwd: the gradients of ``sum(op(x, ...) * t)`` update the first *n_diff* operands."""

    def step(t: jax.Array, *ops: jax.Array) -> tuple:
        grads = jax.grad(lambda *a: (op(*a) * t).sum().astype(jnp.float32),
                         argnums=tuple(range(n_diff)))(*ops)  # fmt: skip
        new = [o - (1e-3 * g).astype(o.dtype) for o, g in zip(ops[:n_diff], grads, strict=True)]
        return (t, *new, *ops[n_diff:])

    return step


def _ln_formula(x: jax.Array, g: jax.Array, b: jax.Array) -> jax.Array:
    """Layer norm over the last dim written in XLA (which fuses it), float32 inside."""
    xf = x.astype(jnp.float32)
    m = xf.mean(-1, keepdims=True)
    v = ((xf - m) ** 2).mean(-1, keepdims=True)
    return ((xf - m) * lax.rsqrt(v + 1e-5) * g + b).astype(x.dtype)


def cases(dt: Any) -> list[Case]:
    out: list[Case] = []

    def conv_case(n: int, hw: int, c: int, k: int) -> Case:
        def make() -> tuple:
            x = _rand((n, hw, hw, c), dt, 1)
            w = _rand((k, k, c, c), dt, 2, 0.05)  # HWIO
            dn = lax.conv_dimension_numbers(x.shape, w.shape, ("NHWC", "HWIO", "NHWC"))
            ours = lambda x, w: pj.conv(  # noqa: E731
                x, jnp.transpose(w, (3, 0, 1, 2)), padding="SAME", channels_last=True
            )
            theirs = lambda x, w: lax.conv_general_dilated(  # noqa: E731
                x, w, (1, 1), "SAME", dimension_numbers=dn
            )
            return ours, theirs, (x, w)

        return (f"conv {k}x{k} {c}->{c} {hw}x{hw} b{n}", make, "conv")

    out += [conv_case(32, 56, 64, 3), conv_case(32, 28, 128, 3), conv_case(32, 56, 64, 1)]

    def ln_case(rows: int) -> Callable[[], tuple]:
        def make() -> tuple:
            x = _rand((rows, 1024), dt, 3)
            g, b = jnp.ones(1024, jnp.float32), jnp.zeros(1024, jnp.float32)
            return (lambda x, g, b: pj.layer_norm(x, (1024,), g, b)), _ln_formula, (x, g, b)

        return make

    out.append(("layer_norm 8192x1024", ln_case(8192), "norm"))

    def small_relu() -> tuple:  # host-bound: a few us of GPU work per call
        return pj.relu, jax.nn.relu, (_rand((64, 256), dt, 7),)

    out += [("relu 64x256", small_relu, "small"), ("layer_norm 64x1024", ln_case(64), "small")]

    def sm() -> tuple:
        x = _rand((8192, 1024), dt, 4)
        return (lambda x: pj.softmax(x, -1)), (lambda x: jax.nn.softmax(x, -1)), (x,)

    out.append(("softmax 8192x1024", sm, "softmax"))

    if hasattr(pj, "dot_product_attention"):

        def attn() -> tuple:
            q = _rand((4, 1024, 16, 64), dt, 5)
            k = _rand((4, 1024, 16, 64), dt, 6)
            v = _rand((4, 1024, 16, 64), dt, 7)
            ours = lambda q, k, v: pj.dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
            theirs = lambda q, k, v: jax.nn.dot_product_attention(  # noqa: E731
                q, k, v, is_causal=True, implementation="cudnn"
            )
            return ours, theirs, (q, k, v)

        out.append(("attention b4 t1024 h16 d64 causal (XLA: jax.nn cudnn)", attn, "attention"))
    if hasattr(pj, "matmul"):

        def mm() -> tuple:
            a = _rand((8192, 1024), dt, 8)
            b = _rand((1024, 1024), dt, 9, 0.03)
            return (lambda a, b: pj.matmul(a, b)), (lambda a, b: jnp.matmul(a, b)), (a, b)

        out.append(("matmul 8192x1024 @ 1024x1024", mm, "matmul"))
    if hasattr(pj, "lrn"):

        def lrn() -> tuple:
            x = _rand((32, 64, 56, 56), jnp.float32, 11)  # cuDNN's LRN: no bfloat16

            def theirs(x: jax.Array) -> jax.Array:  # the window sum as a reduce_window
                s = lax.reduce_window(x * x, 0.0, lax.add, (1, 5, 1, 1), (1, 1, 1, 1),
                                      ((0, 0), (2, 2), (0, 0), (0, 0)))  # fmt: skip
                return x / (2.0 + 1e-4 / 5 * s) ** 0.75

            return (lambda x: pj.lrn(x, 5, 1e-4, 0.75, 2.0)), theirs, (x,)

        out.append(("LRN 5, b32 64x56x56 f32 (XLA: reduce_window)", lrn, "lrn"))
    if hasattr(pj, "grid_sample"):

        def st() -> tuple:
            x = _rand((32, 64, 56, 56), jnp.float32, 12)  # cuDNN's sampler: no bfloat16
            rng = np.random.default_rng(13)
            base = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
            theta = jnp.asarray(base * 0.9 + rng.standard_normal((32, 2, 3)) * 0.1, jnp.float32)
            grid = pj.affine_grid(theta, (56, 56))

            def theirs(x: jax.Array, grid: jax.Array) -> jax.Array:  # bilinear, zeros outside
                hi, wi = x.shape[2:]
                px = (grid[..., 0] + 1) * (wi - 1) / 2
                py = (grid[..., 1] + 1) * (hi - 1) / 2
                x0, y0 = jnp.floor(px), jnp.floor(py)
                n = jnp.arange(x.shape[0])[:, None, None]
                out = 0.0
                for dy, dx in ((0, 0), (0, 1), (1, 0), (1, 1)):
                    ix, iy = x0 + dx, y0 + dy
                    wgt = (1 - jnp.abs(px - ix)) * (1 - jnp.abs(py - iy))
                    inside = (ix >= 0) & (ix < wi) & (iy >= 0) & (iy < hi)
                    iyc = jnp.clip(iy, 0, hi - 1).astype(jnp.int32)
                    ixc = jnp.clip(ix, 0, wi - 1).astype(jnp.int32)
                    out = out + jnp.where(inside, wgt, 0)[..., None] * x[n, :, iyc, ixc]
                return jnp.moveaxis(out, -1, 1)

            return (lambda x, g: pj.grid_sample(x, g)), theirs, (x, grid)

        out.append(("grid_sample b32 64x56x56 f32 (XLA: gathers)", st, "spatialtf"))
    try:
        from flax import linen as fl

        from pycudnn.jax import linen as pl
    except ImportError:
        return out

    def lstm() -> tuple:
        x = _rand((64, 100, 256), jnp.float32, 10)  # cuDNN's RNNs: no bfloat16
        v = fl.RNN(fl.LSTMCell(256)).init(jax.random.key(0), x)
        ours = lambda x, v: pl.LSTM(256).apply({"params": v["params"]}, x)  # noqa: E731
        theirs = lambda x, v: fl.RNN(fl.LSTMCell(256)).apply(v, x)  # noqa: E731
        return ours, theirs, (x, v)

    out.append(("LSTM T100 N64 256->256 f32 (XLA: Flax's scanned LSTMCell)", lstm, "lstm"))
    return out


def ctc_case(steps: int, repeats: int) -> list[dict[str, Any]]:
    """CTC loss and its gradient against ``optax.ctc_loss`` (a pure-JAX forward-backward):
    each step's logits move by the previous step's gradient (the loss is not shape-preserving,
    so it has its own loop). Skipped without optax or ``pj.ctc_loss``."""
    try:
        import optax
    except ImportError:
        return []
    if not hasattr(pj, "ctc_loss"):
        return []
    b, t, k, n = 32, 200, 64, 40
    rng = np.random.default_rng(14)
    logits = jnp.asarray(rng.standard_normal((b, t, k)), jnp.float32)
    lp = jnp.zeros((b, t), jnp.float32)
    labels = jnp.asarray(rng.integers(1, k, (b, n)), jnp.int32)
    lab_p = jnp.zeros((b, n), jnp.float32)
    sides = {}
    for side, f in (("pycudnn", pj.ctc_loss), ("XLA", optax.ctc_loss)):

        def step(x: jax.Array, f: Callable = f) -> tuple:
            g = jax.grad(lambda x: f(x, lp, labels, lab_p).sum())(x)
            return (x - 1e-3 * g,)

        sides[side] = _loop(step, steps)
    name = f"CTC loss b{b} T{t} K{k} labels {n} f32 (XLA: optax.ctc_loss)"
    return [_measure(name, "fwd+bwd", sides, (logits,), steps, repeats)]


def _time(f: Callable, args: tuple, steps: int) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(f(*args))
    return (time.perf_counter() - t0) / steps * 1e6


def _measure(
    name: str, mode: str, sides: dict[str, Callable], args: tuple, steps: int, repeats: int
) -> dict[str, Any]:
    """The sides' medians (compiled and warmed first, then interleaved), printed as a row."""
    for f in sides.values():
        jax.block_until_ready(f(*args))  # compile, bind, warm
    times: dict[str, list[float]] = {s: [] for s in sides}
    for _ in range(repeats):
        for s, f in sides.items():
            times[s].append(_time(f, args, steps))
    us = {s: statistics.median(v) for s, v in times.items()}
    ratio = us["pycudnn"] / us["XLA"]
    row = {"case": name, "mode": mode, "pycudnn_us": round(us["pycudnn"], 2),
           "xla_us": round(us["XLA"], 2), "ratio": round(ratio, 3)}  # fmt: skip
    plain = ""
    if "plain" in us:
        row["plain_us"] = round(us["plain"], 2)
        row["plain_ratio"] = round(us["plain"] / us["XLA"], 3)
        plain = f"  (outside command buffers {row['plain_us']:9.2f} us {row['plain_ratio']:.3f}x)"
    print(f"JAXOPS {name:52s} {mode:8s} pycudnn {row['pycudnn_us']:9.2f} us  XLA "
          f"{row['xla_us']:9.2f} us  {row['ratio']:.3f}x{plain}", flush=True)  # fmt: skip
    return row


def _plain(f: Callable, args: tuple) -> Callable:
    """*f* compiled with pycudnn's calls kept out of XLA's command buffers."""
    before = pj.use_command_buffers(False)
    try:
        return f.lower(*args).compile()
    finally:
        pj.use_command_buffers(before)


def run(
    steps: int, repeats: int, only: set[str] | None, dt: Any, plain: bool = False
) -> list[dict[str, Any]]:
    rows = []
    for name, make, kind in cases(dt):
        if only and kind not in only:
            continue
        ours, theirs, args = make()
        n_diff = {"conv": 2, "attention": 3, "matmul": 2, "spatialtf": 2}.get(kind, 1)
        for mode in ("fwd", "fwd+bwd"):
            if mode == "fwd":  # every case's op keeps its first operand's shape
                sides = {"pycudnn": _loop(_fwd_loop(ours), steps),
                         "XLA": _loop(_fwd_loop(theirs), steps)}  # fmt: skip
                a = args
            else:
                t = jnp.ones_like(theirs(*args))
                sides = {"pycudnn": _loop(_train_loop(ours, n_diff), steps),
                         "XLA": _loop(_train_loop(theirs, n_diff), steps)}  # fmt: skip
                a = (t, *args)
            if plain and hasattr(pj, "use_command_buffers"):
                loop = _train_loop(ours, n_diff) if mode != "fwd" else _fwd_loop(ours)
                sides["plain"] = _plain(_loop(loop, steps), a)
            rows.append(_measure(name, mode, sides, a, steps, repeats))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--only", default="")
    p.add_argument("--json", default=None)
    p.add_argument("--plain", action="store_true", help="also pycudnn outside command buffers")
    a = p.parse_args()
    only = set(a.only.split(",")) if a.only else None
    dev = jax.devices()[0]
    print(f"jax {jax.__version__} on {dev.device_kind}; cuDNN {pycudnn.version(raises=False)}; "
          f"Python {platform.python_version()}; {a.steps} steps x {a.repeats} repeats, "
          f"{a.dtype}")  # fmt: skip
    rows = run(a.steps, a.repeats, only, jnp.dtype(a.dtype), a.plain)
    if not only or "ctc" in only:
        rows += ctc_case(a.steps, a.repeats)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {"device": dev.device_kind, "jax": jax.__version__, "rows": rows}, f, indent=1
            )


if __name__ == "__main__":
    main()
