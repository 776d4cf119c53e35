"""A numpy array to the GPU and back. Needs a GPU (README: "Device memory")."""

# GPU: move a numpy array to the GPU and back
import numpy as np

import pycudnn

x = pycudnn.to_device(np.arange(12, dtype=np.float32).reshape(3, 4))
print(x)                    # DeviceArray(shape=(3, 4), dtype=float32, device=0, ptr=0x...)
y = x.get()                 # a new numpy array
assert (y == np.arange(12).reshape(3, 4)).all()
