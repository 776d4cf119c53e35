"""JAX adapter: pycudnn inside ``jax.jit`` through XLA's typed FFI, with no compiled code.

Optional: this module imports without JAX (``import pycudnn`` never imports either), and JAX is
imported on the first use of any of its names; without JAX that use raises an ``ImportError``
saying what to install.

**Operations** (issue 41, build item 2, a first slice): :func:`activation` (and :func:`relu`,
:func:`sigmoid`, :func:`tanh`, :func:`elu`, :func:`silu`, :func:`relu6`), :func:`softmax` and
:func:`log_softmax` over any axis, :func:`max_pool` and :func:`avg_pool` (2-D and 3-D),
:func:`layer_norm` and :func:`rms_norm`, :func:`conv` (2-D and 3-D, strides, padding,
dilation, groups, channels-last, a fused ``activation(conv + residual + bias)`` epilogue),
:func:`dot_product_attention` (``jax.nn.dot_product_attention``'s layout), :func:`ctc_loss`
(``optax.ctc_loss``'s arguments), and :func:`affine_grid`, :func:`grid_sample` and
:func:`spatial_transformer` (cuDNN's spatial transformer) are JAX
functions: jittable, differentiable through ``jax.custom_vjp`` (the backward is pycudnn's
backward calls), vmappable (a batch folds into cuDNN's leading dim where it can) and
shape-polymorphic (``jax.export`` with symbolic dims). Each runs pycudnn's high level on XLA's
buffers and stream; a call site's first run binds the high level's ready call entry, and later
runs launch it directly (:mod:`._bound`).

Also (build item 2, a second slice): :func:`batch_norm` (training returns the output and new
running averages, PyTorch's momentum and unbiased variance; inference uses them),
:func:`dropout` (an explicit JAX key becomes cuDNN's seed inside the program; cuDNN's RNG, not
JAX's), :func:`lrn` (cross-channel) and :func:`matmul` (batched, with a fused bias and
activation), in the family modules :mod:`._batchnorm`, :mod:`._dropout`, :mod:`._lrn` and
:mod:`._matmul`.
**RNNs**: :func:`rnn` (cuDNN's RNN tanh/relu, LSTM and GRU on its packed weights; the training
forward's reserve space an XLA buffer kept as a ``custom_vjp`` residual; vmap per example) with
:func:`rnn_weight_size`, :func:`rnn_pack_weights` and :func:`rnn_unpack_weights` (PyTorch's
parameter names) and :func:`rnn_weights_from_flax`, in :mod:`._rnn`.

**Graph calls**: :func:`graph_call` runs a :class:`pycudnn.graph.Graph` on JAX arrays inside
``jax.jit`` (a registry id in the request; the registry holds the graph until
:func:`release_graph`), with :func:`graph_io` and :func:`register_graph`, in :mod:`._graph`.

**The foundation** (build item 1): **one generic XLA FFI handler**, a ctypes callback
``XLA_FFI_Error* handler(XLA_FFI_CallFrame*)`` that XLA calls like any C handler.
:func:`register_handler` registers a Python function under a target name for a platform;
``jax.ffi.ffi_call`` (or :func:`ffi_call`) calls it from JAX code, jitted or not. The function
receives a :class:`Call`: the operands and results as :class:`Buffer` records (pointer, dims,
dtype; host memory on the CPU platform, device memory with ``__cuda_array_interface__`` on a
GPU), the attributes as Python values, and XLA's stream (``call.stream``) on a GPU.

**Flax layers** (build item 3): :mod:`pycudnn.jax.linen` and :mod:`pycudnn.jax.nnx` are
subclasses of Flax's own layers (same variables) whose calls run these operations; import them
explicitly (they need Flax).

Design decisions
----------------
* **Checked against the installed jaxlib, not trusted.** The C structs are mirrored in ctypes,
  for each layout generation of XLA's header known (API 0.3, jaxlib 0.10.x; API 0.4, jaxlib
  0.11.x: renamed extension struct and error getter); before any registration,
  :func:`check_abi` reads the XLA FFI header jaxlib ships (``jax.ffi.include_dir()``), selects
  the generation by the structs it declares, and compares every mirrored field's position,
  name, offset and size, the enum values the handler uses, and the API's major version. Any
  difference, or a header of no known generation, refuses the registration with
  :class:`UnsupportedJaxlibError` naming the jaxlib version and the struct. At the first call
  the API table XLA passes is checked the same way (major version, sizes).
* **An exception never crosses into C.** Whatever the Python function raises becomes an XLA FFI
  error carrying the exception's type and message (``ValueError``/``TypeError`` as
  ``INVALID_ARGUMENT``, ``NotImplementedError`` as ``UNIMPLEMENTED``, others ``INTERNAL``): JAX
  raises it as a ``JaxRuntimeError`` in the caller, and the process goes on.
* **XLA's metadata request is answered** with the API version the handler was checked against
  and its traits (``command_buffer_compatible``); the stages before execution return at once.
* **Targets live for the process**: XLA keeps the function pointer, so every registered target
  (and its Python function) is kept in a process-wide table (:func:`registered_targets`).

Internals
---------
The foundation: :mod:`._capi` holds the ctypes mirrors and the FFI enums, :mod:`._header` parses
the header and compares, :mod:`._frame` reads a call frame (buffers, attributes, stream, as the
function asks), :mod:`._handler` is the callback, the registration and the ``ffi_call`` wrapper.
The operations, one way up: :mod:`._request` (a call's static options as one frozen request,
carried as the call's one string attribute), :mod:`._operands` (XLA's buffers as the high
level's operands), :mod:`._bound` (the per-call path: bound launches per call signature),
:mod:`._capture` (which calls XLA may capture in its command buffers, and the workspace it
gives them), :mod:`._ops` (the one mechanism: registration, the batching-aware call,
``custom_vjp``), then
one module per family (:mod:`._activation`, :mod:`._softmax`, :mod:`._pooling`,
:mod:`._norms`, :mod:`._conv`, :mod:`._attention`, :mod:`._ctc`,
:mod:`._spatialtf`). Only :mod:`._ops` and the family modules import JAX at their
top (they are imported when one of their names is first used); :mod:`._handler` imports it in
its public functions. The public names are declared once, in ``__init__.pyi``.
"""

from __future__ import annotations

import importlib.util

from .. import _exports

_INSTALL = (
    "install JAX (CPU: the jax package; NVIDIA GPUs: jax with its CUDA plugin, jax[cuda12] or "
    'jax[cuda13]); in pycudnn\'s source tree: pip install -e ".[jax]"'
)


def _require_jax(name: str) -> None:
    """Before a name's module is imported: an ImportError naming what to install when JAX is
    missing."""
    try:
        import jax  # (the real JAX: absolute imports never mean this package)
    except ImportError as exc:
        raise ImportError(
            f"pycudnn.jax.{name} needs JAX, which is not installed: {_INSTALL}"
        ) from exc
    if getattr(jax, "__file__", None) is None:  # a directory named jax on sys.path, not JAX
        raise ImportError(
            f"pycudnn.jax.{name} needs JAX, which is not installed (the 'jax' found is a "
            f"directory without __init__.py: {list(jax.__path__)}): {_INSTALL}"
        )


# The names are declared once, in __init__.pyi (what type checkers read); this table, __all__ and
# dir() derive from it, and a name's module is imported on its first use (JAX checked first).
__getattr__, __dir__ = _exports.attach_stub(globals(), before=_require_jax)


def is_available() -> bool:
    """True when JAX can be imported (the adapter can then be used). Never raises and imports
    nothing else."""
    try:
        spec = importlib.util.find_spec("jax")
    except (ImportError, ValueError):  # a broken or blocked jax entry in sys.modules
        return False
    return spec is not None and spec.origin is not None  # not a namespace directory "jax"
