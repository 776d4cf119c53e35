"""Theano's dnn_conv on torch tensors. Needs a GPU and torch (README: "Convolution")."""

# GPU: a torch tensor in and out
import torch

import pycudnn

torch.backends.cudnn.allow_tf32 = False   # pycudnn's fp32 default is exact (no TF32)
x = torch.randn(8, 3, 32, 32, device="cuda")
w = torch.randn(16, 3, 3, 3, device="cuda")
y = torch.empty(8, 16, 32, 32, device="cuda")
pycudnn.dnn_conv(x, w, border_mode="half", conv_mode="cross", out=y)   # into the torch tensor
torch.testing.assert_close(y, torch.nn.functional.conv2d(x, w, padding=1))
y2 = torch.from_dlpack(pycudnn.dnn_conv(x, w, border_mode="half", conv_mode="cross"))  # no copy
dw = pycudnn.dnn_gradweight(x, y, (16, 3, 3, 3), border_mode="half", conv_mode="cross")
