"""Types of ``pycudnn.lib``: the generated stubs of ``pycudnn._generated.lib``."""

from ._generated.lib import *  # noqa: F403
from ._generated.lib import has as has
