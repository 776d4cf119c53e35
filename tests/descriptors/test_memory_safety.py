"""Issue 30: nothing memory-unsafe in the descriptor layer without a raw address.

Each case that used to crash runs in a child process (a crash is a signal there, not the end of
the test run): the checked ``api``'s ``Destroy*`` refuse objects pycudnn owns (their finalizer
would free them a second time), and ``BackendDescriptor.set`` refuses ctypes data whose element is
not the attribute type's C element (cuDNN would read past it).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pycudnn import api, errors
from pycudnn.descriptors import (
    BackendDescriptor,
    ConvolutionDescriptor,
    FilterDescriptor,
    TensorDescriptor,
)

ROOT = Path(__file__).resolve().parents[2]


def _child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )


def test_destroy_of_an_owned_descriptor_then_del_does_not_abort():
    proc = _child(
        """
        import gc
        from pycudnn import api
        from pycudnn.descriptors import TensorDescriptor
        t = TensorDescriptor((1, 2, 3, 4))
        try:
            api.cudnnDestroyTensorDescriptor(t)
        except ValueError as exc:
            print("refused:", exc)
        del t
        gc.collect()
        print("alive")
        """
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "refused: cudnnDestroyTensorDescriptor: argument 1" in proc.stdout
    assert "owned by pycudnn" in proc.stdout and "alive" in proc.stdout


@pytest.mark.filterwarnings("ignore::pycudnn.errors.CudnnDeprecationWarning")
@pytest.mark.parametrize(
    ("make", "destroy"),
    [
        (lambda: TensorDescriptor((1, 2, 3, 4)), "cudnnDestroyTensorDescriptor"),
        (lambda: FilterDescriptor((2, 2, 3, 3)), "cudnnDestroyFilterDescriptor"),
        (lambda: ConvolutionDescriptor((1, 1)), "cudnnDestroyConvolutionDescriptor"),
        (lambda: BackendDescriptor("TENSOR_DESCRIPTOR"), "cudnnBackendDestroyDescriptor"),
    ],
)
def test_api_destroy_refuses_owned_objects_and_takes_detached_addresses(make, destroy):
    obj = make()
    with pytest.raises(errors.ArgumentValueError, match=f"{destroy}: .*owned by pycudnn"):
        getattr(api, destroy)(obj)
    assert obj.owned and not obj.closed  # untouched: still usable, still destroyed once
    getattr(api, destroy)(obj.detach())  # the documented way to take ownership


def test_api_destroy_of_a_closed_object_is_a_value_error():
    t = TensorDescriptor((1, 2, 3, 4))
    t.close()
    with pytest.raises(ValueError, match="closed"):
        api.cudnnDestroyTensorDescriptor(t)


@pytest.mark.parametrize(
    ("attr_type", "value"),
    [
        ("INT64", (ctypes.c_int8 * 2)(1, 2)),
        ("INT64", (ctypes.c_int32 * 4)(1, 2, 3, 4)),
        ("INT64", ctypes.c_int8(1)),
        ("INT64", (ctypes.c_double * 2)(1, 2)),
        ("INT64", (ctypes.c_int64 * 2 * 2)()),
        ("DOUBLE", (ctypes.c_float * 2)(1, 2)),
        ("FLOAT", (ctypes.c_int32 * 1)(1)),
        ("DATA_TYPE", ctypes.c_int8(0)),
        ("FRACTION", (ctypes.c_int64 * 2)(1, 2)),
    ],
)
def test_backend_set_refuses_ctypes_data_of_another_element(attr_type, value):
    d = BackendDescriptor("TENSOR_DESCRIPTOR")
    with pytest.raises(TypeError, match=f"cannot be passed as {attr_type}.*read past"):
        d.set("TENSOR_DIMENSIONS", attr_type, value)


def test_backend_set_takes_ctypes_data_of_the_right_element():
    d = BackendDescriptor("TENSOR_DESCRIPTOR")
    d.set("TENSOR_DIMENSIONS", "INT64", (ctypes.c_int64 * 4)(1, 2, 3, 4))
    d.set("TENSOR_STRIDES", "INT64", (ctypes.c_longlong * 4)(24, 12, 4, 1))
    d.set("TENSOR_DATA_TYPE", "DATA_TYPE", ctypes.c_int(0))
    d.set("TENSOR_UNIQUE_ID", "INT64", ctypes.c_int64(7))


def test_backend_set_int8_array_as_int64_in_child_does_not_crash():
    proc = _child(
        """
        import ctypes
        from pycudnn.descriptors import BackendDescriptor
        d = BackendDescriptor("TENSOR_DESCRIPTOR")
        try:
            d.set("TENSOR_DIMENSIONS", "INT64", (ctypes.c_int8 * 2)(1, 2))
        except TypeError as exc:
            print("refused:", exc)
        """
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "refused:" in proc.stdout
