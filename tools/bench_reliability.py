#!/usr/bin/env python3
"""Hot-path costs of the reliability checks (issue 16), in ns per call, without a GPU.

Run it against this tree and against a tree without the checks to compare::

    PYTHONPATH=. python tools/bench_reliability.py
    git archive <commit> pycudnn | tar -x -C /tmp/base
    PYTHONPATH=/tmp/base python tools/bench_reliability.py

Prints one JSON object: the best of 7 repeats, per call. Cases that need something the older
tree lacks print null.
"""

from __future__ import annotations

import ctypes
import json
import sys
import timeit

import pycudnn  # the tree under test, from PYTHONPATH
from pycudnn import api, errors
from pycudnn.descriptors import BackendDescriptor, TensorDescriptor


def best(fn, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=7)) / number * 1e9


def main() -> int:
    t = TensorDescriptor((2, 3, 4, 5))
    size = ctypes.c_size_t()
    ref = ctypes.byref(size)
    raw = errors.checked("cudnnGetTensorSizeInBytes", warn=False)
    guarded = api.cudnnGetTensorSizeInBytes
    x, w, c = TensorDescriptor((2, 3, 8, 8)), pycudnn.FilterDescriptor((4, 3, 3, 3)), None
    c = pycudnn.ConvolutionDescriptor(1)
    dims = (ctypes.c_int * 4)()
    out_dim = api.cudnnGetConvolutionNdForwardOutputDim
    out_dim_raw = errors.checked("cudnnGetConvolutionNdForwardOutputDim", warn=False)
    b = BackendDescriptor("tensor")
    xt = BackendDescriptor("tensor")
    op = BackendDescriptor("operation_pointwise")
    dims64 = [2, 3, 4, 5]

    def create_close():
        d = TensorDescriptor((2, 3, 4, 5))
        d.close()

    def backend_create_close():
        d = BackendDescriptor("tensor")
        d.close()

    res = {
        "api_GetTensorSizeInBytes_unguarded": best(lambda: raw(t, ref), 200_000),
        "api_GetTensorSizeInBytes_api": best(lambda: guarded(t, ref), 200_000),
        "api_ConvNdForwardOutputDim_unguarded": best(
            lambda: out_dim_raw(c, x, w, 4, dims), 100_000
        ),
        "api_ConvNdForwardOutputDim_api": best(lambda: out_dim(c, x, w, 4, dims), 100_000),
        "TensorDescriptor.shape": best(lambda: t.shape, 100_000),
        "TensorDescriptor create+close": best(create_close, 50_000),
        "BackendDescriptor create+close": best(backend_create_close, 50_000),
        "BackendDescriptor.set INT64[4]": best(
            lambda: b.set("TENSOR_DIMENSIONS", "INT64", dims64), 100_000
        ),
        "BackendDescriptor.set BACKEND_DESCRIPTOR": best(
            lambda: op.set("OPERATION_POINTWISE_XDESC", "BACKEND_DESCRIPTOR", xt), 100_000
        ),
    }
    try:
        from pycudnn.memory.interop import parse_cai

        cai = {
            "shape": (2, 3, 4, 5),
            "typestr": "<f4",
            "data": (1 << 40, False),
            "version": 3,
            "strides": None,
            "stream": None,
        }
        res["parse_cai"] = best(lambda: parse_cai(cai), 100_000)
    except ImportError:
        res["parse_cai"] = None

    class CAI:
        def __init__(self):
            self.__cuda_array_interface__ = {
                "shape": (2, 3, 4, 5),
                "typestr": "<f4",
                "data": (1 << 40, False),
                "version": 3,
                "strides": None,
                "stream": None,
            }

    obj = CAI()
    res["asarray(CAI, check=False)"] = best(
        lambda: pycudnn.asarray(obj, check=False, device=0), 50_000
    )
    print(json.dumps({k: (round(v, 1) if v is not None else None) for k, v in res.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
