"""Strictness of ``cuda.core``'s ``StridedMemoryView`` on the hostile inputs pycudnn's own tests
refuse (issue 29, item 7).

The cases are read from ``tests/device/test_interop_untrusted.py`` (its tables of lying
``__cuda_array_interface__`` records and hand-built DLPack capsules, and its valid records) so
the probe follows the tests; a few more come from ``tests/memory/test_memory.py`` (untyped and
big-endian typestrs, CAI version 1, host arrays, managed memory, a consumed capsule). Each case
runs in its own subprocess, which reads the input with pycudnn (``asarray(..., check=False)``,
as the tests do) and then with ``StridedMemoryView.from_any_interface(obj, stream_ptr=-1)`` (the
plain constructor where that classmethod is missing), reading ``ptr``, ``shape``, ``strides``,
``dtype``, ``device_id`` and ``readonly`` and releasing the view. A crash in cuda.core is
recorded with the stage it happened in (construct, read, release), not fatal.

Outcomes per side: ``rejected`` (the error type and message), ``accepted`` (what it read; for a
valid case, whether that matches pycudnn's view), ``crashed`` (the signal), ``inconclusive``
(no CUDA driver here: cuda.core asks the driver where a CAI pointer lives, so CAI cases need a
GPU machine; DLPack cases run anywhere).

Hand-built capsules get a no-op deleter (DLPack allows NULL, which one case tests on its own);
with a CUDA driver the CAI records point into a real 64 KiB allocation, so that cuda.core's
pointer query does not refuse them for the wrong reason.

Run from the repository root: ``PYTHONPATH=. python bench/interop_strictness.py [--out f.json]``.
Needs pytest (the case tables live in the tests) and, for the cuda.core side, ``cuda.core``.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
UNTRUSTED = ROOT / "tests" / "device" / "test_interop_untrusted.py"
SPAN = 1 << 16  # bytes of the real allocation the CAI records point into (GPU runs)

# capsule names must outlive their capsules: module-level constants
_USED = {b"dltensor": b"used_dltensor", b"dltensor_versioned": b"used_dltensor_versioned"}
#: refusals that are pycudnn's policy (what cuDNN takes) rather than a lie: a reader that
#: accepts them still says enough (dtype, device_id) for pycudnn to refuse afterwards -- except
#: managed memory, which a StridedMemoryView does not tell apart from device memory
POLICY = ("'code': 5", "'<c8'", "host numpy", "managed")
_NO_DRIVER = ("DynamicLibNotFoundError", "CUDA_ERROR_NO_DEVICE", "CUDA_ERROR_NOT_INITIALIZED")


def load_tests() -> Any:
    """``tests/device/test_interop_untrusted.py`` as a module (its case tables and helpers)."""
    spec = importlib.util.spec_from_file_location("_untrusted_cases", UNTRUSTED)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _params(fn: Any) -> list:
    """The argument values of *fn*'s ``pytest.mark.parametrize``."""
    return list(next(m for m in fn.pytestmark if m.name == "parametrize").args[1])


def cases(mod: Any) -> list[tuple[str, str, Any, bool]]:
    """``(name, kind, spec, valid)`` of every case; *kind* says how :func:`build` makes the
    input from *spec*; *valid* cases must be accepted with the same view as pycudnn's."""
    out: list[tuple[str, str, Any, bool]] = []
    for changes, exc, _frag in mod.CAI_CASES:
        out.append((f"cai {_short(changes)} (pycudnn: {exc.__name__})", "cai", changes, False))
    for cai, _frag in _params(mod.test_cai_structure_is_checked):
        out.append((f"cai record {_short(cai)}", "cai_raw", cai, False))
    for changes in (
        {"typestr": "<V2"},
        {"typestr": ">f4"},
        {"typestr": "<c8"},
        {"version": 1},
    ):
        out.append((f"cai {_short(changes)}", "cai", changes, False))
    for fields, exc, _frag in mod.DLPACK_BAD:
        out.append((f"dlpack {_short(fields)} (pycudnn: {exc.__name__})", "dlpack", fields, False))
    out.append(("dlpack NULL deleter (allowed by dlpack.h)", "dlpack_null_deleter", {}, True))
    out.append(("dlpack managed memory (kDLCUDAManaged)", "dlpack", {"device": (13, 0)}, False))
    out.append(("dlpack capsule consumed already", "dlpack_used", {}, False))
    for changes in _params(mod.test_valid_cai_records_give_the_right_view):
        out.append((f"valid cai {_short(changes)}", "cai", changes, True))
    for fields in _params(mod.test_valid_capsules_give_the_right_view):
        out.append((f"valid dlpack {_short(fields)}", "dlpack", fields, True))
    out.append(("host numpy array", "numpy", None, False))
    out.append(("object without a protocol", "object", None, False))
    return out


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


# -- the child: one case ---------------------------------------------------------------------------
_noop = None


def _noop_deleter() -> Any:
    global _noop
    if _noop is None:
        from pycudnn.memory import _dlpack

        _noop = _dlpack._Deleter(lambda managed: None)
    return _noop


class Producer:
    """A DLPack producer handing out one hand-built capsule (cuda.core needs the object, with
    ``__dlpack_device__``; pycudnn takes either)."""

    def __init__(self, cap: Any, device: tuple[int, int]):
        self.cap = cap
        self.device = device

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.cap.capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device


def _rebase(value: Any, fake: int, base: int) -> Any:
    """*value* moved from the tests' fake address range into the real allocation."""
    if isinstance(value, int) and not isinstance(value, bool) and fake <= value < fake + SPAN:
        return type(value)(base + (value - fake))
    return value


def build(mod: Any, kind: str, spec: Any, base: int) -> Any:
    """The input of one case (*base*: where CAI records point, the tests' fake address or a
    real allocation)."""
    import numpy as np

    if kind in ("cai", "cai_raw"):
        cai = mod.good_cai(**spec) if kind == "cai" else spec
        if isinstance(cai, dict) and isinstance(cai.get("data"), tuple | list) and cai["data"]:
            data = list(cai["data"])
            data[0] = _rebase(data[0], mod.ADDR, base)
            cai = {**cai, "data": tuple(data)}
        return mod.CAI(cai)
    if kind.startswith("dlpack"):
        cap = mod.Capsule(**spec)
        if kind != "dlpack_null_deleter":
            cap.managed.deleter = _noop_deleter()
        if kind == "dlpack_used":
            # marked used, as a consumer does (our own prototype: ctypes.pythonapi's function
            # objects are shared by the process, and other libraries set their argtypes)
            set_name = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
                ("PyCapsule_SetName", ctypes.pythonapi)
            )
            set_name(cap.capsule, _USED[cap.name])
        return Producer(cap, tuple(spec.get("device", (2, 0))))
    if kind == "numpy":
        return np.zeros((2, 3), np.float32)
    return object()


def _outcome_of(exc: BaseException) -> dict[str, Any]:
    kind = type(exc).__name__
    text = f"{kind}: {exc}"
    if any(m in text for m in _NO_DRIVER):
        return {"outcome": "inconclusive", "error": text[:200]}
    return {"outcome": "rejected", "error": text[:200]}


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


def _real_base() -> tuple[int, Any]:
    """A 64 KiB device allocation's address (and what keeps it), or (0, None) without a
    driver/GPU."""
    try:
        from cuda.bindings import driver
    except Exception:
        return 0, None
    try:
        (err,) = driver.cuInit(0)
        if int(err):
            return 0, None
        err, dev = driver.cuDeviceGet(0)
        err, ctx = driver.cuDevicePrimaryCtxRetain(dev)
        driver.cuCtxSetCurrent(ctx)
        err, ptr = driver.cuMemAlloc(SPAN)
        if int(err):
            return 0, None
        return int(ptr), ptr
    except Exception:
        return 0, None


def child(index: int) -> int:
    """Run case *index*: one JSON line per stage on stdout, the last one the result."""
    import gc
    import warnings

    warnings.simplefilter("ignore", DeprecationWarning)
    import pycudnn

    mod = load_tests()
    _name, kind, spec, _valid = cases(mod)[index]
    base, _keep = _real_base()
    base = base or mod.ADDR
    try:
        a = pycudnn.asarray(build(mod, kind, spec, base), check=False, device=0)
        ours = {
            "outcome": "accepted",
            "view": {
                "ptr_offset": a.ptr - base,
                "shape": list(a.shape),
                "strides": [s // a.itemsize for s in a.strides],
                "dtype": str(a.dtype),
                "readonly": a.readonly,
            },
        }
    except Exception as exc:
        ours = _outcome_of(exc)
    _emit({"side": "pycudnn", **ours})
    try:
        from cuda.core.utils import StridedMemoryView as smv
    except Exception as exc:
        _emit({"side": "cuda.core", "outcome": "absent", "error": f"{type(exc).__name__}: {exc}"})
        return 0
    obj = build(mod, kind, spec, base)
    make = getattr(smv, "from_any_interface", None) or smv
    _emit({"stage": "construct"})
    try:
        view = make(obj, stream_ptr=-1)
        _emit({"stage": "read"})
        strides = view.strides
        theirs: dict[str, Any] = {
            "outcome": "accepted",
            "view": {
                "ptr_offset": view.ptr - base,
                "shape": list(view.shape),
                "strides": None if strides is None else list(strides),
                "dtype": str(view.dtype),
                "readonly": bool(view.readonly),
                "device_id": view.device_id,
            },
        }
        _emit({"stage": "release"})
        del view
        gc.collect()
    except Exception as exc:
        theirs = _outcome_of(exc)
    cap = getattr(getattr(obj, "cap", None), "capsule", None)
    if cap is not None:
        theirs["capsule"] = mod._GetName(cap).decode()
    _emit({"side": "cuda.core", **theirs})
    return 0


# -- the parent ------------------------------------------------------------------------------------
def run_case(index: int, timeout: float) -> dict[str, Any]:
    """Case *index* in a subprocess: its pycudnn and cuda.core outcomes."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(index)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
        out, rc, err = p.stdout, p.returncode, p.stderr
    except subprocess.TimeoutExpired as exc:
        out, rc, err = (
            (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or ""),
            None,
            "timeout",
        )
    lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    res: dict[str, Any] = {}
    stage = None
    for line in lines:
        if "stage" in line:
            stage = line["stage"]
        elif "side" in line:
            res[line.pop("side")] = line
    if "cuda.core" not in res:
        if rc is None:
            how = f"hung (> {timeout:.0f} s)"
        elif rc < 0:
            how = f"crashed ({signal.Signals(-rc).name})"
        else:
            how = f"crashed (exit {rc}: {err.strip().splitlines()[-1:] if err else ''})"
        res["cuda.core"] = {"outcome": "crashed", "error": f"{how} at {stage or 'setup'}"}
    res.setdefault("pycudnn", {"outcome": "crashed", "error": (err or "")[-200:]})
    return res


def verdict(valid: bool, policy: bool, ours: dict[str, Any], theirs: dict[str, Any]) -> str:
    """How cuda.core compares on one case: ``as strict``, ``LAX`` (accepts what pycudnn
    refuses), ``CRASH``, ``WRONG VIEW``, ``stricter`` (refuses a valid input), ``same``..."""
    t = theirs.get("outcome")
    if t in ("inconclusive", "absent"):
        return t
    if t == "crashed":
        return "CRASH"
    if not valid:
        if ours.get("outcome") != "rejected":
            return "pycudnn accepts?"
        if t == "rejected":
            return "as strict"
        return "accepts(policy)" if policy else "LAX"
    if t == "rejected":
        return "stricter"
    a, b = ours.get("view", {}), theirs.get("view", {})
    keys = ("ptr_offset", "shape", "readonly")
    same = all(a.get(k) == b.get(k) for k in keys)
    if b.get("strides") is not None:
        same = same and a.get("strides") == b.get("strides")
    return "same view" if same else "WRONG VIEW"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default=None, help="write the outcomes as JSON to this file")
    p.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1))
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per case")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        return child(args.child)
    t0 = time.perf_counter()
    table = cases(load_tests())
    with ThreadPoolExecutor(max(args.jobs, 1)) as pool:
        results = list(pool.map(lambda i: run_case(i, args.timeout), range(len(table))))
    rows = []
    counts: dict[str, int] = {}
    for (name, _kind, _spec, valid), res in zip(table, results, strict=True):
        ours, theirs = res["pycudnn"], res["cuda.core"]
        v = verdict(valid, any(m in name for m in POLICY), ours, theirs)
        counts[v] = counts.get(v, 0) + 1
        rows.append({"case": name, "valid": valid, "verdict": v, **res})
        what = theirs.get("error") or json.dumps(theirs.get("view"))
        mine = ours.get("error", "accepted").split(":")[0]
        extra = f" [capsule {theirs['capsule']}]" if "capsule" in theirs else ""
        print(f"{v:<15} {name:<72} pycudnn {mine:<22} cuda.core {what}{extra}")
    summary = ", ".join(f"{k}: {n}" for k, n in sorted(counts.items()))
    print(f"\n{len(table)} cases in {time.perf_counter() - t0:.1f} s -- {summary}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"cases": rows, "summary": counts}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
