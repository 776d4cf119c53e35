"""pycudnn: the Python binding of NVIDIA cuDNN 9.x.

Importing this package loads nothing: libcudnn is found and opened on first use (see
``pycudnn._loader``). ``python -m pycudnn`` prints what was found and whether it works.
"""

from ._version import __version__

__all__ = ["__version__"]
