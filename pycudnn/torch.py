"""PyTorch adapter: ``torch.nn``-compatible modules over pycudnn's high-level functions, and
:func:`convert` (cudnn.torch's ``cudnn.convert``), which swaps them into a model in place.

Optional: this module imports without PyTorch (``import pycudnn`` never imports either), and
PyTorch is imported on the first use of any of its names; without PyTorch that use raises an
``ImportError`` saying what to install (``pip install "pycudnn[torch]"``). The implementation is
:mod:`pycudnn._torch_nn`.

Design decisions
----------------
* **Subclasses of the torch.nn modules, swapped in place.** ``pycudnn.torch.Conv2d`` *is* a
  ``torch.nn.Conv2d`` whose ``forward`` runs pycudnn: same constructor, parameters, buffers,
  ``state_dict`` keys, hooks and ``repr``. :func:`convert` changes the class of each supported
  module of a model (no copy, no re-initialisation: the weights stay where they are) and
  ``convert(model, back=True)`` changes it back.
* **autograd.Functions over the forward and backward functions**: ``dnn_conv`` /
  ``dnn_gradinput`` / ``dnn_gradweight`` (bias fused into ``dnn_conv`` when it takes
  ``bias=``), ``dnn_pool`` / ``dnn_pool_grad``, the three batch-normalization calls,
  ``dnn_activation``, ``dnn_softmax``, ``dnn_dropout``, ``dnn_lrn``, ``dnn_layer_norm``,
  ``dnn_rms_norm`` and ``RNNBlock.apply`` / ``backward``, each with its ``_grad``; and
  :func:`scaled_dot_product_attention`, torch's function of that name (same signature) over
  ``dnn_sdpa`` / ``dnn_sdpa_grad``, falling back to torch's for what cuDNN's fused attention
  does not run (``attn_mask`` tensors, float32, other head dims, CPU tensors).
* **torch's current stream, torch's memory.** Every call passes torch's current stream (no
  synchronisation is added). On first use the adapter installs :class:`TorchMemoryResource` as
  pycudnn's memory resource (unless another non-default resource is installed, or
  :func:`use_torch_allocator` said otherwise): every pycudnn allocation -- outputs, statistics,
  staging copies, RNN reserve spaces and the handles' workspaces -- is then a ``torch.empty`` on
  the current stream, visible to ``torch.cuda.memory_allocated()``, taken from a CUDA graph's
  private pool under ``torch.cuda.graph`` capture, and returned to torch as torch tensors
  without a copy.
* **Unsupported configurations are left unconverted, with a warning** naming the module and the
  reason (``padding_mode='reflect'``, ``ceil_mode=True``, ``Softmax(dim=2)``, an even
  ``LocalResponseNorm`` size, ...); ``convert(..., strict=True)`` raises ``ValueError`` instead,
  and constructing such a module directly from this namespace raises ``ValueError``.
* **Inputs cuDNN cannot take run torch's own implementation**: CPU tensors, dtypes the operation
  lacks (bfloat16 dropout, LRN and RNNs; integer types), ``PackedSequence`` RNN inputs, softmax
  over a 1-D input. A converted model therefore still runs wherever the original ran.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names resolve lazily (__getattr__), importing torch then
    from ._torch_nn import (
        ELU as ELU,
    )
    from ._torch_nn import (
        GRU as GRU,
    )
    from ._torch_nn import (
        LSTM as LSTM,
    )
    from ._torch_nn import (
        RNN as RNN,
    )
    from ._torch_nn import (
        AvgPool2d as AvgPool2d,
    )
    from ._torch_nn import (
        AvgPool3d as AvgPool3d,
    )
    from ._torch_nn import (
        BatchNorm1d as BatchNorm1d,
    )
    from ._torch_nn import (
        BatchNorm2d as BatchNorm2d,
    )
    from ._torch_nn import (
        BatchNorm3d as BatchNorm3d,
    )
    from ._torch_nn import (
        Conv1d as Conv1d,
    )
    from ._torch_nn import (
        Conv2d as Conv2d,
    )
    from ._torch_nn import (
        Conv3d as Conv3d,
    )
    from ._torch_nn import (
        Dropout as Dropout,
    )
    from ._torch_nn import (
        Hardtanh as Hardtanh,
    )
    from ._torch_nn import (
        LayerNorm as LayerNorm,
    )
    from ._torch_nn import (
        LocalResponseNorm as LocalResponseNorm,
    )
    from ._torch_nn import (
        LogSoftmax as LogSoftmax,
    )
    from ._torch_nn import (
        MaxPool2d as MaxPool2d,
    )
    from ._torch_nn import (
        MaxPool3d as MaxPool3d,
    )
    from ._torch_nn import (
        ReLU as ReLU,
    )
    from ._torch_nn import (
        ReLU6 as ReLU6,
    )
    from ._torch_nn import (
        RMSNorm as RMSNorm,
    )
    from ._torch_nn import (
        Sigmoid as Sigmoid,
    )
    from ._torch_nn import (
        SiLU as SiLU,
    )
    from ._torch_nn import (
        Softmax as Softmax,
    )
    from ._torch_nn import (
        Tanh as Tanh,
    )
    from ._torch_nn import (
        TorchMemoryResource as TorchMemoryResource,
    )
    from ._torch_nn import (
        convert as convert,
    )
    from ._torch_nn import (
        rnn_flat_weights as rnn_flat_weights,
    )
    from ._torch_nn import (
        scaled_dot_product_attention as scaled_dot_product_attention,
    )
    from ._torch_nn import (
        supported_modules as supported_modules,
    )
    from ._torch_nn import (
        to_torch as to_torch,
    )
    from ._torch_nn import (
        unsupported_reason as unsupported_reason,
    )
    from ._torch_nn import (
        use_torch_allocator as use_torch_allocator,
    )

__all__ = [
    "ELU",
    "GRU",
    "LSTM",
    "RNN",
    "SiLU",
    "AvgPool2d",
    "AvgPool3d",
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "Dropout",
    "Hardtanh",
    "LayerNorm",
    "LocalResponseNorm",
    "LogSoftmax",
    "MaxPool2d",
    "MaxPool3d",
    "RMSNorm",
    "ReLU",
    "ReLU6",
    "Sigmoid",
    "Softmax",
    "Tanh",
    "TorchMemoryResource",
    "convert",
    "is_available",
    "rnn_flat_weights",
    "scaled_dot_product_attention",
    "supported_modules",
    "to_torch",
    "unsupported_reason",
    "use_torch_allocator",
]

_INSTALL = 'pip install "pycudnn[torch]" (or any PyTorch build with CUDA)'


def _impl() -> Any:
    """The implementation module (imports torch), or an ImportError naming what to install."""
    try:
        import torch  # noqa: F401  (only to tell a missing torch from another failure)
    except ImportError as exc:
        raise ImportError(
            f"pycudnn.torch needs PyTorch, which is not installed: {_INSTALL}"
        ) from exc
    return importlib.import_module("pycudnn._torch_nn")


def __getattr__(name: str) -> Any:
    if name in __all__ and name != "is_available":
        value = getattr(_impl(), name)
        globals()[name] = value  # resolved once
        return value
    raise AttributeError(f"module 'pycudnn.torch' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def is_available() -> bool:
    """True when PyTorch can be imported (the adapter's modules can then be used). Never
    raises and imports nothing else."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a broken or blocked torch entry in sys.modules
        return False
