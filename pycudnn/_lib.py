"""The raw layer's former private name, kept for code that imports it: ``pycudnn.lib``."""

import sys

from ._generated import lib

sys.modules[__name__] = lib
