"""Every cuDNN C enum as an ``IntEnum``: the public face of the generated
``pycudnn._generated.enums``.

Class names drop the ``cudnn`` prefix and ``_t`` suffix (``cudnnDataType_t`` -> ``DataType``);
member names drop the enum's common prefix (``CUDNN_DATA_FLOAT`` -> ``DataType.FLOAT``).
Aliases (two C names with one value) resolve to the first name, as in C. Deprecated members are
kept and listed in ``DEPRECATED_MEMBERS``; ``by_c_name`` finds a member by its C name.
"""

from ._generated.enums import *  # noqa: F403
