"""The raw layer, pycudnn.lib, and the checked pycudnn.api. Needs libcudnn, no GPU (README)."""

import ctypes

from pycudnn import BadParamError, api, enums, lib

desc = lib.cudnnTensorDescriptor_t()
api.cudnnCreateTensorDescriptor(ctypes.byref(desc))
api.cudnnSetTensor4dDescriptor(desc, enums.TensorFormat.NCHW, enums.DataType.FLOAT, 2, 3, 4, 5)

dtype, n, c, h, w, ns, cs, hs, ws = (ctypes.c_int() for _ in range(9))
api.cudnnGetTensor4dDescriptor(desc, *map(ctypes.byref, (dtype, n, c, h, w, ns, cs, hs, ws)))
print(enums.DataType(dtype.value).name, (n.value, c.value, h.value, w.value))  # FLOAT (2, 3, 4, 5)

try:
    api.cudnnSetTensor4dDescriptor(desc, 0, 0, -2, 3, 4, 5)
except BadParamError as e:   # also a ValueError
    print(e)  # cudnnSetTensor4dDescriptor failed: CUDNN_STATUS_BAD_PARAM (2000): (n <= 0) || ...
api.cudnnDestroyTensorDescriptor(desc)
