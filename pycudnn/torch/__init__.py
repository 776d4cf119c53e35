"""PyTorch adapter: ``torch.nn``-compatible modules over pycudnn's high-level functions, and
:func:`convert` (cudnn.torch's ``cudnn.convert``), which swaps them into a model in place.

Optional: this module imports without PyTorch (``import pycudnn`` never imports either), and
PyTorch is imported on the first use of any of its names; without PyTorch that use raises an
``ImportError`` saying what to install (``pip install torch``).

Design decisions
----------------
* **Subclasses of the torch.nn modules, swapped in place.** ``pycudnn.torch.Conv2d`` *is* a
  ``torch.nn.Conv2d`` whose ``forward`` runs pycudnn: same constructor, parameters, buffers,
  ``state_dict`` keys, hooks and ``repr``. :func:`convert` changes the class of each supported
  module of a model (no copy, no re-initialisation: the weights stay where they are) and
  ``convert(model, back=True)`` changes it back.
* **autograd.Functions over the forward and backward functions**: ``dnn_conv`` /
  ``dnn_gradinput`` / ``dnn_gradweight`` (bias fused into ``dnn_conv`` when it takes
  ``bias=``), the same three for the transposed convolutions (``dnn_gradinput`` is their
  forward), ``dnn_matmul`` (``Linear``: the bias fused, the gradients two more products over
  strided views), ``dnn_pool`` / ``dnn_pool_grad``, the three batch-normalization calls,
  ``dnn_activation``, ``dnn_softmax``, ``dnn_dropout``, ``dnn_lrn``, ``dnn_layer_norm``,
  ``dnn_rms_norm`` and ``RNNBlock.apply`` / ``backward``, each with its ``_grad``;
  ``CrossEntropyLoss`` as ``dnn_softmax(algo='log')`` and the negative log-likelihood in one
  function with its closed-form gradient; and
  :func:`scaled_dot_product_attention`, torch's function of that name (same signature) over
  ``dnn_sdpa`` / ``dnn_sdpa_grad`` (``attn_mask`` as cuDNN's bias), falling back to torch's for
  what cuDNN's fused attention does not run (masks broadcast over the sequence, float32, other
  head dims, CPU tensors).
* **torch.compile**: the same operations are ``torch.library`` custom ops (``pycudnn::conv``,
  ...), called only while dynamo traces; eager calls never enter the dispatcher.
* **Fusion across modules** (``convert(model, fuse=True)``): an fx pass running Conv->BN(->add)
  (->act) and Linear->act chains as one fused cuDNN call in eval mode.
* **Attention for unmodified models**: :func:`use_cudnn_attention` routes
  ``torch.nn.functional.scaled_dot_product_attention`` to pycudnn's; :func:`register_transformers`
  adds ``attn_implementation="pycudnn"`` to HuggingFace transformers.
* **What it did is public**: :func:`conversion_report` (per module: converted, fused into which
  chain, or left alone and why), :func:`fusions` and :func:`programs` (the chains found, and what
  each fused region runs per input signature), :func:`attention_calls` (per attention route, the
  calls that ran cuDNN and those handed to torch).
* **torch's current stream, torch's memory.** Every call passes torch's current stream (no
  synchronisation is added). On first use the adapter installs :class:`TorchMemoryResource` as
  pycudnn's memory resource (unless another non-default resource is installed, or
  :func:`use_torch_allocator` said otherwise): every pycudnn allocation -- outputs, statistics,
  staging copies, RNN reserve spaces -- is then a ``torch.empty`` on the current stream, visible
  to ``torch.cuda.memory_allocated()``, taken from a CUDA graph's private pool under
  ``torch.cuda.graph`` capture, and returned to torch as torch tensors without a copy. The
  handles' workspaces, which outlive a call, are pycudnn's own ``cudaMalloc`` (CUDA-graph pools
  refuse live blocks).
* **Unsupported configurations are left unconverted, with a warning** naming the module and the
  reason (``padding_mode='reflect'``, ``ceil_mode=True``, ``Softmax(dim=2)``, an even
  ``LocalResponseNorm`` size, ``CrossEntropyLoss(label_smoothing=0.1)``, ...);
  ``convert(..., strict=True)`` raises ``ValueError`` instead, and constructing such a module
  directly from this namespace raises ``ValueError``.
* **Inputs cuDNN cannot take run torch's own implementation**: CPU tensors, dtypes the operation
  lacks (bfloat16 dropout, LRN and RNNs; float32 ``Linear`` without
  ``pycudnn.config.allow_tf32``, since cuDNN's float32 matmul is TF32; integer types),
  ``PackedSequence`` RNN inputs, softmax over a 1-D input, probability targets of
  ``CrossEntropyLoss``. A converted model therefore still runs wherever the original ran.

Internals
---------
One module per layer family, each holding its ``autograd.Function``, its module classes and their
rule for what cuDNN can run: :mod:`.conv`, :mod:`.linear`, :mod:`.pool`, :mod:`.batchnorm`,
:mod:`.activation`, :mod:`.softmax`, :mod:`.dropout`, :mod:`.lrn`, :mod:`.norm`, :mod:`.rnn`,
:mod:`.attention`, :mod:`.conv_transpose`, :mod:`.loss`; each also registers its custom ops
through :mod:`._compile`. :mod:`.fuse` (the fx pass) and :mod:`.fused` (the fused modules),
:mod:`.attention_scope` (the routing scope, the transformers registration, the attention
counters), :mod:`.report` (the conversion report), :mod:`._lean` (the lean call path).
:mod:`._convert` asks those classes (private: a submodule named ``convert`` would be bound over
the function :func:`convert` once imported); :mod:`._runtime` holds torch's stream and memory.
The public names are declared once, in ``__init__.pyi``.
"""

from __future__ import annotations

import importlib.util

from .. import _exports

_INSTALL = (
    "pip install torch (any PyTorch build with CUDA; "
    'in pycudnn\'s source tree: pip install -e ".[torch]")'
)


def _require_torch(name: str) -> None:
    """Before a name's module is imported: an ImportError naming what to install when torch is
    missing (rather than a bare ``No module named 'torch'`` from deep inside the adapter)."""
    try:
        import torch  # noqa: F401  (the real torch: absolute imports never mean this package)
    except ImportError as exc:
        raise ImportError(
            f"pycudnn.torch.{name} needs PyTorch, which is not installed: {_INSTALL}"
        ) from exc


# The names are declared once, in __init__.pyi (what type checkers read); this table, __all__ and
# dir() derive from it, and a name's module (hence torch) is imported on its first use.
__getattr__, __dir__ = _exports.attach_stub(globals(), before=_require_torch)


def is_available() -> bool:
    """True when PyTorch can be imported (the adapter's modules can then be used). Never
    raises and imports nothing else."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a broken or blocked torch entry in sys.modules
        return False
