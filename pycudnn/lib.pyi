"""Types of ``pycudnn.lib``: the generated raw layer."""

from ._lib import *  # noqa: F403
from ._lib import has as has
