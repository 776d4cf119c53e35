"""Host data given to a high-level function: the error names the function, the argument and the
fix (issue 29), as ``asarray`` does, and is the same ``NotDeviceMemoryError`` (a ``TypeError`` and a
``ValueError``). The naming runs on the error path only: the operand getters are unchanged."""

from __future__ import annotations

import numpy as np
import pytest

import pycudnn
from pycudnn.errors import NotDeviceMemoryError

X4 = np.zeros((1, 2, 4, 4), np.float32)

CASES = [
    ("dnn_conv", "img", lambda: pycudnn.dnn_conv(X4, X4[:, :, :3, :3])),
    ("dnn_pool", "img", lambda: pycudnn.dnn_pool(X4, (2, 2))),
    ("dnn_activation", "x", lambda: pycudnn.dnn_activation(X4)),
    ("dnn_softmax", "x", lambda: pycudnn.dnn_softmax(X4)),
    ("dnn_matmul", "a", lambda: pycudnn.dnn_matmul(X4[0, 0], X4[0, 0])),
    ("dnn_layer_norm", "x", lambda: pycudnn.dnn_layer_norm(X4, (4,))),
    ("dnn_sdpa", "q", lambda: pycudnn.dnn_sdpa(X4, X4, X4)),
    ("dnn_add_tensor", "a", lambda: pycudnn.dnn_add_tensor(X4, X4)),
]


@pytest.mark.parametrize(("func", "arg", "call"), CASES, ids=[c[0] for c in CASES])
def test_a_host_array_is_named_by_function_and_argument(func, arg, call):
    with pytest.raises(NotDeviceMemoryError) as info:
        call()
    msg = str(info.value)
    assert msg.startswith(f"{func}: {arg} is a host numpy.ndarray"), msg
    assert f"pycudnn.to_device({arg})" in msg, msg
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)


def test_a_non_array_is_named_too():
    with pytest.raises(TypeError, match=r"^dnn_activation: x: expected a device array .* list"):
        pycudnn.dnn_activation([1.0])


class CPUTensor:  # shaped like a CPU torch.Tensor (the getter reads data_ptr and get_device)
    __module__ = "torch"

    def data_ptr(self) -> int:
        return 0x1000

    def get_device(self) -> int:
        return -1


def test_a_cpu_torch_tensor_is_named_with_its_fix():
    with pytest.raises(
        NotDeviceMemoryError, match=r"^dnn_pool: img is a CPU torch tensor; .*\.cuda\(\)"
    ):
        pycudnn.dnn_pool(CPUTensor(), (2, 2))
