"""Zero-copy views between torch and pycudnn. Needs a GPU and torch (README)."""

# GPU: view a torch tensor without a copy, and the other way round
import torch

import pycudnn

t = torch.ones(2, 3, device="cuda")
v = pycudnn.asarray(t)      # no copy: the same memory
assert v.ptr == t.data_ptr()
t.mul_(5)                   # written through torch ...
assert (v.get() == 5).all() # ... read through pycudnn
u = torch.from_dlpack(v)    # back to torch, still no copy
assert u.data_ptr() == t.data_ptr()
