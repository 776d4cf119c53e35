"""Per-call cost of reading and exporting foreign device arrays: pycudnn's hand-written DLPack /
``__cuda_array_interface__`` readers against ``cuda.core``'s ``StridedMemoryView`` and
``Buffer`` (issue 29, item 7).

For torch, CuPy and JAX device arrays of the tiny conv's shapes (x ``(1, 8, 8, 8)``, w
``(8, 8, 3, 3)``, float32), each framework skipped when it is not installed, it times per call
(median over batches, ``time.perf_counter_ns``, warmed up):

a) ``ours``: the read the ``dnn_conv`` hot path does (``highlevel/conv/_key.py``): for a torch
   tensor the inline ``FAST_T`` read (what ``_operand.key_of`` does for one), for any other
   array ``_operand.raw_operand`` (which, for CuPy and JAX, views the array through
   ``memory.asarray`` each call); plus ``_operand.producer_stream``, which the call does first
   when ``stream=`` is not given;
b) ``cuda.core``: ``StridedMemoryView(obj, stream_ptr=-1)`` and its ``from_dlpack`` /
   ``from_cuda_array_interface`` / ``from_any_interface`` constructors where the installed
   version has them, each followed by reading ``ptr``, ``shape``, ``strides``, ``dtype``,
   ``device_id`` and ``readonly`` (what pycudnn would need);
c) the whole tiny ``dnn_conv`` call on that framework's arrays (``out=`` a pycudnn array, no
   ``stream=``), so the operand share of a call is visible.

The export side: a pycudnn ``DeviceArray`` consumed by ``torch.from_dlpack`` /
``cupy.from_dlpack`` against a ``cuda.core`` ``Buffer.from_handle`` over the same memory (a byte
buffer: the consumer views it as float32 and reshapes, timed with it) and a
``StridedMemoryView.from_buffer`` of it (shape and dtype, no reshaping).

Run from the repository root on a GPU machine: ``PYTHONPATH=. python bench/interop.py --quick``
(under a minute). ``cuda.core`` is optional: without it only pycudnn's side is timed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

X_SHAPE = (1, 8, 8, 8)
W_SHAPE = (8, 8, 3, 3)
FIELDS = ("ptr", "shape", "strides", "dtype", "device_id", "readonly")


def per_call_us(fn: Callable[[], object], batches: int, calls: int) -> dict[str, float]:
    """Median and min µs per call of *fn* over *batches* batches of *calls* calls (after a
    warm-up batch); a batch is timed as a whole (one clock read per call would cost more than
    some of the reads timed)."""
    for _ in range(calls):
        fn()
    runs = []
    for _ in range(batches):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter_ns() - t0) / calls / 1e3)
    return {"median": statistics.median(runs), "min": min(runs), "batches": batches}


def timed(fn: Callable[[], object], batches: int, calls: int) -> dict[str, Any]:
    """:func:`per_call_us` of *fn*, or ``{"error": ...}`` when its first call fails."""
    try:
        fn()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return per_call_us(fn, batches, calls)


# -- the frameworks (each None when absent or without a GPU) ---------------------------------------
def torch_arrays() -> tuple[Any, Any] | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return torch.randn(*X_SHAPE, device="cuda"), torch.randn(*W_SHAPE, device="cuda")


def cupy_arrays() -> tuple[Any, Any] | None:
    try:
        import cupy
    except ImportError:
        return None
    try:
        rs = cupy.random.default_rng(0)
        return rs.standard_normal(X_SHAPE, dtype=cupy.float32), rs.standard_normal(
            W_SHAPE, dtype=cupy.float32
        )
    except Exception:  # no device
        return None


def jax_arrays() -> tuple[Any, Any] | None:
    # JAX would otherwise take most of the GPU's memory at its first array
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        import jax
        import numpy as np
    except ImportError:
        return None
    try:
        gpu = jax.devices("gpu")[0]
    except Exception:
        return None
    rng = np.random.default_rng(0)
    x = jax.device_put(rng.standard_normal(X_SHAPE, dtype=np.float32), gpu)
    w = jax.device_put(rng.standard_normal(W_SHAPE, dtype=np.float32), gpu)
    x.block_until_ready()
    w.block_until_ready()
    return x, w


FRAMEWORKS: dict[str, Callable[[], tuple[Any, Any] | None]] = {
    "torch": torch_arrays,
    "cupy": cupy_arrays,
    "jax": jax_arrays,
}


def strided_memory_view() -> Any:
    """``cuda.core``'s ``StridedMemoryView`` class, or None when cuda.core is not installed."""
    try:
        from cuda.core.utils import StridedMemoryView
    except Exception:  # ImportError, or a cuda.core that does not match cuda.bindings
        return None
    return StridedMemoryView


def cuda_core_version() -> str | None:
    try:
        from cuda.core import __version__
    except Exception:
        return None
    return str(__version__)


# -- (a) ours ------------------------------------------------------------------------------------
def ours_readers(x: Any) -> dict[str, Callable[[], object]]:
    """The hot path's read of one operand, as ``_key.conv`` does it for *x*'s type."""
    from pycudnn.highlevel import _operand

    _operand.raw_operand(x)  # finds the getter (and sets FAST_T for torch tensors)
    fast = _operand.FAST_T
    if type(x) is fast:

        def hot() -> object:  # the inline read of _key.conv for a torch tensor
            p = x.data_ptr()
            return p, (x.shape, x.stride(), x.dtype, x.get_device(), p & 15)

    else:

        def hot() -> object:
            return _operand.raw_operand(x)

    return {
        "hot path read": hot,
        "raw_operand": lambda: _operand.raw_operand(x),
        "producer_stream": lambda: _operand.producer_stream(x),
    }


# -- (b) cuda.core -------------------------------------------------------------------------------
def _read(view: Any) -> tuple:
    return (view.ptr, view.shape, view.strides, view.dtype, view.device_id, view.readonly)


def cuda_core_readers(smv: Any, x: Any) -> dict[str, Callable[[], object]]:
    """Each way the installed cuda.core builds a view of *x*, followed by the reads pycudnn
    needs. The plain constructor is deprecated in newer versions: its warning is silenced, its
    cost (``warnings.warn`` per call) kept."""
    warnings.simplefilter("ignore", DeprecationWarning)
    out: dict[str, Callable[[], object]] = {
        "StridedMemoryView(obj, -1)": lambda: _read(smv(x, stream_ptr=-1)),
    }
    for name in ("from_dlpack", "from_cuda_array_interface", "from_any_interface"):
        make = getattr(smv, name, None)
        if make is not None:
            out[f"{name}(obj, -1)"] = lambda make=make: _read(make(x, stream_ptr=-1))
    return out


def check_same_view(smv: Any, x: Any) -> dict[str, Any]:
    """What cuda.core reads from *x* next to what pycudnn reads (a sanity check of the timing:
    both must describe the same memory)."""
    from pycudnn.highlevel import _operand

    o = _operand.operand(x)
    ours = {"ptr": o.ptr, "shape": o.shape, "strides": o.strides, "device": o.device}
    try:
        v = (
            smv.from_any_interface(x, stream_ptr=-1)
            if hasattr(smv, "from_any_interface")
            else smv(x, stream_ptr=-1)
        )
        theirs = {
            "ptr": v.ptr,
            "shape": tuple(v.shape),
            "strides": None if v.strides is None else tuple(v.strides),
            "device": v.device_id,
        }
    except Exception as exc:
        return {"ours": repr(ours), "error": f"{type(exc).__name__}: {exc}"[:300]}
    packed = theirs["strides"] is None and ours["strides"] == _packed(ours["shape"])
    same = all(ours[k] == theirs[k] for k in ("ptr", "shape", "device")) and (
        packed or ours["strides"] == theirs["strides"]
    )
    return {"same": same, "ours": repr(ours), "cuda.core": repr(theirs)}


def _packed(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


# -- (c) the whole call ---------------------------------------------------------------------------
def conv_call(pc: Any, x: Any, w: Any) -> Callable[[], object]:
    """The tiny conv on *x*, *w* (no ``stream=``: the call reads the producer's stream), writing
    into one pycudnn array so that only the inputs' reading differs between frameworks."""
    y = pc.empty(X_SHAPE, "float32")

    def call() -> object:
        return pc.dnn_conv(x, w, border_mode=(1, 1), conv_mode="cross", out=y)

    return call


def synced(fn: Callable[[], object], sync: Callable[[], object], calls: int) -> Callable[[], None]:
    """*fn* called *calls* times, then one device sync (so queued kernels do not pile up)."""

    def run() -> None:
        for _ in range(calls):
            fn()
        sync()

    return run


# -- export ----------------------------------------------------------------------------------------
def export_cases(pc: Any, smv: Any, consumers: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """DLPack export of one pycudnn array to each consumer, by pycudnn and by cuda.core."""
    import numpy as np

    if not consumers:  # no consumer framework (and so no GPU to allocate on)
        return {}
    a = pc.empty(X_SHAPE, "float32")
    nbytes = int(np.prod(X_SHAPE)) * 4
    cases: dict[str, dict[str, Any]] = {}
    buf = view = None
    if smv is not None:
        try:
            from cuda.core import Buffer

            buf = Buffer.from_handle(a.ptr, nbytes, owner=a)
            if hasattr(smv, "from_buffer"):
                view = smv.from_buffer(buf, X_SHAPE, dtype=np.dtype(np.float32))
        except Exception as exc:
            cases["cuda.core setup"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    for name, (from_dlpack, as_f32) in consumers.items():
        fns: dict[str, Callable[[], object]] = {"pycudnn DeviceArray": lambda f=from_dlpack: f(a)}
        if buf is not None:
            key = "cuda.core Buffer (+ view as float32, reshape)"
            fns[key] = lambda f=from_dlpack, g=as_f32: g(f(buf))
        if view is not None:
            fns["cuda.core StridedMemoryView.from_buffer"] = lambda f=from_dlpack: f(view)
        cases[name] = fns
    return cases


def consumers() -> dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]]:
    """``{framework: (from_dlpack, bytes -> float32 array of X_SHAPE)}`` for those installed."""
    out: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {}
    try:
        import torch

        if torch.cuda.is_available():
            out["torch.from_dlpack"] = (
                torch.from_dlpack,
                lambda t: t.view(torch.float32).view(X_SHAPE),
            )
    except ImportError:
        pass
    try:
        import cupy

        out["cupy.from_dlpack"] = (
            cupy.from_dlpack,
            lambda a: a.view(cupy.float32).reshape(X_SHAPE),
        )
    except ImportError:
        pass
    return out


# -- the run ---------------------------------------------------------------------------------------
def _best(entries: dict[str, dict[str, Any]]) -> tuple[str | None, float | None]:
    ok = {k: v["median"] for k, v in entries.items() if "median" in v}
    if not ok:
        return None, None
    k = min(ok, key=ok.__getitem__)
    return k, ok[k]


def run(quick: bool) -> dict[str, Any]:
    """Every measurement, as a JSON-ready dict."""
    try:
        import torch  # first, when present: pycudnn then finds the libcudnn torch loaded

        sync: Callable[[], object] = torch.cuda.synchronize
    except ImportError:
        sync = lambda: None  # noqa: E731
    import pycudnn

    batches, calls = (15, 200) if quick else (41, 500)
    smv = strided_memory_view()
    result: dict[str, Any] = {
        "quick": quick,
        "cuda_core": cuda_core_version(),
        "shapes": {"x": X_SHAPE, "w": W_SHAPE, "dtype": "float32"},
        "read": {},
        "call": {},
        "export": {},
        "skipped": {},
    }
    if smv is None:
        result["skipped"]["cuda.core"] = "not importable: only pycudnn's side is timed"
    for fw, make in FRAMEWORKS.items():
        arrays = make()
        if arrays is None:
            result["skipped"][fw] = "not installed or no GPU"
            continue
        x, w = arrays
        read: dict[str, Any] = {"ours": {}, "cuda.core": {}}
        for name, fn in ours_readers(x).items():
            read["ours"][name] = timed(fn, batches, calls)
        if smv is not None:
            for name, fn in cuda_core_readers(smv, x).items():
                read["cuda.core"][name] = timed(fn, batches, calls)
            read["same_view"] = check_same_view(smv, x)
        result["read"][fw] = read
        n = 50
        try:
            call = conv_call(pycudnn, x, w)
        except Exception as exc:
            result["call"][fw] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            continue
        entry = timed(synced(call, sync, n), max(batches // 3, 5), 1)
        if "median" in entry:
            entry = {k: v / n if k != "batches" else v for k, v in entry.items()}
        result["call"][fw] = entry
    for consumer, fns in export_cases(pycudnn, smv, consumers()).items():
        if isinstance(fns, dict) and "error" in fns:
            result["export"][consumer] = fns
            continue
        result["export"][consumer] = {name: timed(fn, batches, calls) for name, fn in fns.items()}
    return result


def table(result: dict[str, Any]) -> str:
    """The short table: framework, ours µs, cuda.core µs (its fastest constructor), ratio."""
    rows = [("what", "ours us", "cuda.core us", "cuda.core/ours", "cuda.core's fastest")]
    for fw, read in result["read"].items():
        ours = read["ours"]["hot path read"].get("median")
        name, theirs = _best(read["cuda.core"])
        rows.append((f"{fw}: read one operand", ours, theirs, _ratio(theirs, ours), name or "-"))
        stream = read["ours"]["producer_stream"].get("median")
        rows.append((f"{fw}: + producer_stream", stream, None, None, "(cuda.core: none)"))
        call = result["call"].get(fw, {})
        note = call.get("error", "2 operands read")[:60]
        rows.append((f"{fw}: whole dnn_conv (ours)", call.get("median"), None, None, note))
    for consumer, fns in result["export"].items():
        if "error" in fns:
            rows.append((f"export to {consumer}", None, None, None, fns["error"][:40]))
            continue
        ours = fns.get("pycudnn DeviceArray", {}).get("median")
        theirs_only = {k: v for k, v in fns.items() if k != "pycudnn DeviceArray"}
        name, theirs = _best(theirs_only)
        rows.append((f"export to {consumer}", ours, theirs, _ratio(theirs, ours), name or "-"))
    lines = []
    for r in rows:
        cells = [r[0]] + [_fmt(v) for v in r[1:4]] + [r[4]]
        lines.append(f"{cells[0]:<34} {cells[1]:>8} {cells[2]:>13} {cells[3]:>15}  {cells[4]}")
    for k, v in result["skipped"].items():
        lines.append(f"skipped {k}: {v}")
    for fw, read in result["read"].items():
        same = read.get("same_view")
        if same is not None and not same.get("same"):
            lines.append(f"{fw}: cuda.core's view differs from ours: {same}")
        for side in ("ours", "cuda.core"):
            for name, e in read[side].items():
                if "error" in e:
                    lines.append(f"{fw} {side} {name}: {e['error']}")
    return "\n".join(lines)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer batches (well under a minute)")
    p.add_argument("--out", default=None, help="write the measurements as JSON to this file")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    result = run(args.quick)
    result["seconds"] = time.perf_counter() - t0
    print(table(result))
    print(f"({result['seconds']:.1f} s; cuda.core {result['cuda_core']}; µs per call, medians)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
