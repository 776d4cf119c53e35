"""Pooling, batch norm, activations, softmax and an LSTM. Needs a GPU and torch (README)."""

# GPU: pooling, batch norm, activations, softmax and an LSTM on torch tensors
import torch

import pycudnn

x = torch.randn(8, 16, 32, 32, device="cuda").to(memory_format=torch.channels_last)
gamma = torch.ones(1, 16, 1, 1, device="cuda")
beta = torch.zeros(1, 16, 1, 1, device="cuda")
y, mean, invstd = pycudnn.dnn_batch_normalization_train(x, gamma, beta, "spatial", 1e-5)
y = pycudnn.dnn_activation(y, "relu", out=y)               # in place
p = pycudnn.dnn_pool(y, (2, 2), (2, 2), "max")             # Theano's stride default is 1
probs = torch.from_dlpack(pycudnn.dnn_softmax(p))          # over the channels, per pixel
torch.testing.assert_close(probs.sum(1), torch.ones(8, 16, 16, device="cuda"))
with pycudnn.RNNBlock("float32", 64, 1, "lstm") as lstm:  # time-major (T, N, features)
    w = torch.randn(lstm.get_param_size(32), device="cuda") * 0.1
    seq, hy, cy = lstm.apply(w, torch.randn(10, 4, 32, device="cuda"))
