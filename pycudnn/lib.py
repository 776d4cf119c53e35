"""Public face of the generated raw layer: ``pycudnn.lib`` *is* ``pycudnn._generated.lib``."""

import sys

from ._generated import lib

sys.modules[__name__] = lib  # one module object: its lazily bound functions, has(), patches
