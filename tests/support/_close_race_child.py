"""Child process: ``close()`` racing uses of the same objects from other threads (issue 16).

Run as ``python _close_race_child.py ROUNDS THREADS``. Each round makes fresh descriptors, starts
THREADS users that hammer them (``BackendDescriptor.set`` with int and descriptor values,
property reads read back through cuDNN, ``pycudnn.api`` calls passing the object) while the main
thread closes everything. Every use must either succeed with the right value or raise
``ValueError`` ("is closed"): a crash shows as a signal in the parent, a wrong value is counted.
Then a leak phase (create / set / close with deferred destroys) reports the RSS growth. Prints
one JSON line.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
import time

from pycudnn import _resource, api, errors
from pycudnn.descriptors import BackendDescriptor, ConvolutionDescriptor, TensorDescriptor

STATS = {
    "rounds": 0,
    "threads": 0,
    "uses": 0,
    "ok": 0,
    "closed": 0,
    "wrong_values": 0,
    "other_errors": 0,
}
_lock = threading.Lock()
XDESC = "OPERATION_POINTWISE_XDESC"


def count(key: str, n: int = 1) -> None:
    with _lock:
        STATS[key] += n


def user(objs: dict, go: threading.Event, reps: int) -> None:
    size = ctypes.c_size_t()
    go.wait()
    for _ in range(reps):
        for name, fn in (
            ("set_int", lambda: objs["b"].set("TENSOR_DIMENSIONS", "INT64", [1, 2, 3, 4])),
            ("set_desc", lambda: objs["op"].set(XDESC, "BACKEND_DESCRIPTOR", objs["x"])),
            ("shape", lambda: objs["t"].shape),
            ("pad", lambda: objs["c"].pad),
            ("api", lambda: api.cudnnGetTensorSizeInBytes(objs["t"], ctypes.byref(size))),
        ):
            count("uses")
            try:
                value = fn()
            except ValueError as exc:  # includes errors.ArgumentValueError
                if "closed" not in str(exc):
                    count("other_errors")
                count("closed")
                continue
            except Exception:
                count("other_errors")
                continue
            count("ok")
            if name == "shape" and value != (2, 3, 4, 5):
                count("wrong_values")
            if name == "pad" and value != (1, 1):
                count("wrong_values")
            if name == "api" and size.value != 2 * 3 * 4 * 5 * 4:
                count("wrong_values")


def race_round(threads: int) -> None:
    objs = {
        "b": BackendDescriptor("tensor"),
        "x": BackendDescriptor("tensor"),
        "op": BackendDescriptor("operation_pointwise"),
        "t": TensorDescriptor((2, 3, 4, 5)),
        "c": ConvolutionDescriptor(1),
    }
    go = threading.Event()
    ts = [threading.Thread(target=user, args=(objs, go, 5)) for _ in range(threads)]
    for t in ts:
        t.start()
    go.set()
    time.sleep(0)
    for key in ("x", "t", "b", "op", "c"):  # children first: their destroys get deferred
        objs[key].close()
    for t in ts:
        t.join()
    STATS["rounds"] += 1


def rss_kib() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def leak_phase(n: int) -> dict:
    def cycle():
        x = BackendDescriptor("tensor")
        op = BackendDescriptor("operation_pointwise")
        op.set("OPERATION_POINTWISE_XDESC", "BACKEND_DESCRIPTOR", x)
        x.close()  # held by op: deferred
        op.close()
        t = TensorDescriptor((2, 3, 4, 5))
        h = t._h()  # a "call in flight"
        t.close()  # deferred
        del h

    for _ in range(2000):
        cycle()
    before = rss_kib()
    for _ in range(n):
        cycle()
    return {"cycles": n, "rss_growth_kib": rss_kib() - before}


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    leak = int(sys.argv[3]) if len(sys.argv) > 3 else 20000
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: more interleavings
    STATS["threads"] = threads
    for _ in range(rounds):
        race_round(threads)
    sys.setswitchinterval(0.005)
    STATS["live_after"] = _resource.live_counts()  # deferred destroys all happened
    STATS["leak"] = leak_phase(leak)
    STATS["live_after_leak"] = _resource.live_counts()
    STATS["errors_module"] = errors.__name__
    print(json.dumps(STATS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
