"""A torch model converted with pycudnn.torch, trained as before. Needs a GPU and torch (README)."""

# GPU: a torch model on cuDNN through pycudnn, trained as before
import torch
from torch import nn

import pycudnn.torch

model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                      nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 16 * 16, 10)).cuda()
pycudnn.torch.convert(model)                  # in place: same parameters, state_dict keys, hooks
loss = nn.functional.cross_entropy(model(torch.randn(8, 3, 32, 32, device="cuda")),
                                   torch.randint(0, 10, (8,), device="cuda"))
loss.backward()                               # dnn_gradinput, dnn_gradweight, ... as autograd
