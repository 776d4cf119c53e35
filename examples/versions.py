"""Which cuDNN am I running? Needs libcudnn, no GPU (README: "Which cuDNN am I running?")."""

import pycudnn

print(pycudnn.version())        # 92800: cudnnGetVersion(), checked against the bindings
info = pycudnn.library_info()   # LibraryInfo(path=..., found_via=..., compatibility=..., ...)
print(info.path, info.found_via, info.compatibility)   # ... cuda.pathfinder (site-packages) ...
print(pycudnn.is_available())   # library usable and a GPU present; never raises
