"""pycudnn: the Python binding of NVIDIA cuDNN 9.x.

Four layers, each usable on its own: ``pycudnn.lib`` (the generated raw C API) with
``pycudnn.api`` (the same functions, checked) and ``pycudnn.enums``; the descriptor layer
(``TensorDescriptor``, ...); the Theano-style high-level layer (``dnn_conv``, ...) with the
transformer operations; and the graph builder ``pycudnn.graph``. ``pycudnn.torch`` is the
optional PyTorch adapter.

Importing this package loads nothing: libcudnn is found and opened on first use, and the public
names below are resolved lazily from their modules. ``python -m pycudnn`` prints what was found.
"""

from __future__ import annotations

from . import _exports

# The public names are declared once, in __init__.pyi (what type checkers read, with precise
# types); the lazy table, __all__ and dir() are derived from that file on the first look-up. A
# name resolves on first access and then lives in this module's globals.
__getattr__, __dir__ = _exports.attach_stub(globals())
