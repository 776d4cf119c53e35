"""Public name of the generated raw layer: ``import pycudnn.lib`` gives ``pycudnn._lib`` itself."""

import sys

from . import _lib

sys.modules[__name__] = _lib
