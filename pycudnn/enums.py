"""Every cuDNN C enum as an ``IntEnum`` (``enums.DataType.FLOAT``): the public face of the
generated :mod:`pycudnn._generated.enums`; see there for the naming rules."""

from ._generated.enums import *  # noqa: F403
