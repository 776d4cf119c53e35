"""What a type checker infers from pycudnn's high-level signatures (``mypy --strict``; read, not
run: :mod:`tests.tooling.test_typing` checks it). Never imported by the tests."""

from __future__ import annotations

from typing import Any, assert_type

import pycudnn
from pycudnn import DeviceArray, DropoutState
from pycudnn.typing import DeviceArrayLike, SupportsCudaArrayInterface, SupportsDLPack


class Foreign:
    """A stand-in for a framework's array (torch, CuPy): only the DLPack export."""

    def __dlpack__(self, *, stream: Any = None, max_version: tuple[int, int] | None = None) -> Any:
        return None


class Cai:
    """A stand-in for a Numba-style array: only ``__cuda_array_interface__``."""

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {}


def usage(x: DeviceArray, f: Foreign, c: Cai, flag: bool) -> None:
    dlpack: SupportsDLPack = f
    cai: SupportsCudaArrayInterface = c
    arr: DeviceArrayLike = x
    del dlpack, cai, arr
    # out= decides the result's type: a new DeviceArray, or out's own type
    assert_type(pycudnn.dnn_conv(f, f, "half", algo="time_once"), DeviceArray)
    assert_type(pycudnn.dnn_conv(f, c, border_mode=(1, 1), out=None), DeviceArray)
    assert_type(pycudnn.dnn_conv(x, x, activation=("clipped_relu", 6.0), out=f), Foreign)
    assert_type(pycudnn.dnn_gradinput(x, x, (1, 2, 3, 3), out=c), Cai)
    assert_type(pycudnn.dnn_activation(f, "relu", out=f), Foreign)
    assert_type(pycudnn.dnn_softmax(c, algo="log"), DeviceArray)
    assert_type(pycudnn.dnn_pool(x, (2, 2), 2, "average_exc_pad"), DeviceArray)
    assert_type(pycudnn.dnn_pool_grad(x, x, x, 2, img_grad=f), Foreign)
    assert_type(pycudnn.dnn_add_tensor(x, f), Foreign)  # c, updated in place
    assert_type(pycudnn.dnn_op_tensor("max", x, x, out=c), Cai)
    assert_type(pycudnn.dnn_matmul(x, x, activation="gelu"), DeviceArray)
    # several outputs: tuples, each element typed
    assert_type(pycudnn.dnn_dropout(x, 0.5, seed=1), tuple[DeviceArray, DropoutState])
    bn = pycudnn.dnn_batch_normalization_train(x, x, x, "spatial", out=f)
    assert_type(bn, tuple[Foreign, DeviceArray, DeviceArray])
    bn5 = pycudnn.dnn_batch_normalization_train(x, x, x, "spatial", 1e-5, 0.1, f, c)
    assert_type(bn5, tuple[DeviceArray, DeviceArray, DeviceArray, DeviceArray, DeviceArray])
    inplace = pycudnn.dnn_batch_normalization_train(
        x, x, x, "spatial", 1e-5, 0.1, f, c, inplace_running=True
    )
    assert_type(inplace, tuple[DeviceArray, DeviceArray, DeviceArray, Foreign, Cai])
    grads = pycudnn.dnn_batch_normalization_grad(x, x, x, x, x, out_dbias=f)
    assert_type(grads, tuple[DeviceArray, DeviceArray, Foreign])
    assert_type(pycudnn.dnn_ctc_loss(x, x, x, x), tuple[DeviceArray, DeviceArray | None])
    assert_type(
        pycudnn.dnn_spatialtf_sampler_grad(x, x, x, out=(f, None)), tuple[Foreign, DeviceArray]
    )
    # training= and return_indices= decide the shape of the result
    assert_type(pycudnn.dnn_sdpa(x, x, x, is_causal=True), DeviceArray)
    assert_type(pycudnn.dnn_sdpa(x, x, x, training=True, out=f), tuple[Foreign, DeviceArray])
    assert_type(
        pycudnn.dnn_sdpa(x, x, x, None, False, None, 0.0, None, True),
        tuple[DeviceArray, DeviceArray],
    )
    assert_type(
        pycudnn.dnn_sdpa(x, x, x, training=flag), DeviceArray | tuple[DeviceArray, DeviceArray]
    )
    dq, _dk, _dv = pycudnn.dnn_sdpa_grad(x, x, x, x, x, x, diagonal_alignment="bottom_right")
    assert_type(pycudnn.dnn_sdpa_paged(x, x, x, x, x), DeviceArray)
    assert_type(pycudnn.dnn_sdpa_paged(x, x, x, x, x, 64, True, page_table_v=x, out=f), Foreign)
    assert_type(dq, DeviceArray)
    assert_type(pycudnn.dnn_layer_norm(x, 64), tuple[DeviceArray, DeviceArray, DeviceArray])
    assert_type(pycudnn.dnn_layer_norm(x, (64,), training=False), tuple[DeviceArray, None, None])
    assert_type(pycudnn.dnn_rms_norm(x, 64, out=f), tuple[Foreign, DeviceArray])
    assert_type(pycudnn.dnn_reduction(x, "max", axis=1), DeviceArray)
    assert_type(pycudnn.dnn_reduction(x, "max", 1, False, True), tuple[DeviceArray, DeviceArray])
    assert_type(pycudnn.dnn_reduction(x, return_indices=True, out=f), tuple[Foreign, DeviceArray])


def misuse(x: DeviceArray) -> None:
    pycudnn.dnn_activation(x, "gelu")  # type: ignore[arg-type]  # not a cuDNN activation mode
    pycudnn.dnn_conv(x, x, border_mode="same")  # type: ignore[arg-type]  # Theano's names only
    pycudnn.dnn_softmax(3.0)  # type: ignore[arg-type]  # not a device array
    pycudnn.dnn_sdpa(x, x, x, alibi="yes")  # type: ignore[call-overload]  # a bool
