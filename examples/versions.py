"""Which cuDNN am I running? Needs libcudnn, no GPU (README: "Which cuDNN am I running?")."""

import pycudnn

pycudnn.version()        # 92800: cudnnGetVersion(), checked against the bindings
pycudnn.library_info()   # LibraryInfo(path=..., found_via='cuda.pathfinder (site-packages)', ...)
pycudnn.is_available()   # library usable and a GPU present; never raises
