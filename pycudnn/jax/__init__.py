"""JAX adapter: pycudnn inside ``jax.jit`` through XLA's typed FFI, with no compiled code.

Optional: this module imports without JAX (``import pycudnn`` never imports either), and JAX is
imported on the first use of any of its names; without JAX that use raises an ``ImportError``
saying what to install.

What exists today is the foundation (issue 41, build item 1): **one generic XLA FFI handler**,
a ctypes callback ``XLA_FFI_Error* handler(XLA_FFI_CallFrame*)`` that XLA calls like any C
handler. :func:`register_handler` registers a Python function under a target name for a
platform; ``jax.ffi.ffi_call`` (or :func:`ffi_call`) calls it from JAX code, jitted or not. The
function receives a :class:`Call`: the operands and results as :class:`Buffer` records (pointer,
dims, dtype; host memory on the CPU platform, device memory with ``__cuda_array_interface__`` on
a GPU), the attributes as Python values, and XLA's stream (``call.stream``) on a GPU. Operations
as JAX functions (convolution, pooling, norms, attention, ... with ``jax.custom_vjp``), Flax
modules and the framework modes are not written yet.

Design decisions
----------------
* **Checked against the installed jaxlib, not trusted.** The C structs are mirrored in ctypes;
  before any registration, :func:`check_abi` reads the XLA FFI header jaxlib ships
  (``jax.ffi.include_dir()``) and compares every mirrored field's position, name, offset and
  size, and the API's major version. Any difference refuses the registration with
  :class:`UnsupportedJaxlibError` naming the jaxlib version. At the first call the API table XLA
  passes is checked the same way (major version, sizes).
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
:mod:`._capi` holds the ctypes mirrors and the FFI enums, :mod:`._header` parses the header and
compares, :mod:`._frame` reads a call frame (buffers, attributes, stream), :mod:`._handler` is
the callback, the registration and the ``ffi_call`` wrapper. Only :mod:`._handler`'s public
functions import JAX. The public names are declared once, in ``__init__.pyi``.
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
