"""The docs home page's PyTorch quick start: convert, fuse, attention. Needs a GPU and torch."""

# GPU: runs as written (tests/tooling/test_docs_examples.py)
import torch
import torch.nn.functional as F
from torch import nn

import pycudnn.torch as pt

model = nn.Sequential(
    nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
    nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
    nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
).cuda()
x = torch.randn(8, 3, 32, 32, device="cuda")

# 1. convert: in place, and typed as what you passed (here an nn.Sequential)
model = pt.convert(model)
print(type(model[0]))  # pycudnn.torch.conv.Conv2d, still an nn.Conv2d
F.cross_entropy(model(x), torch.randint(0, 10, (8,), device="cuda")).backward()

# 2. fuse: each Conv -> BatchNorm -> ReLU chain runs as one cuDNN graph
model.eval()
pt.convert(model, fuse=True)
with torch.no_grad():
    logits = model(x)

# 3. attention: cuDNN's fused flash attention, directly or for an unmodified model
bf16 = torch.bfloat16
q, k, v = (torch.randn(2, 8, 256, 64, device="cuda", dtype=bf16) for _ in range(3))
out = pt.scaled_dot_product_attention(q, k, v, is_causal=True)
with pt.use_cudnn_attention():  # F.scaled_dot_product_attention runs pycudnn's
    same = F.scaled_dot_product_attention(q, k, v, is_causal=True)
torch.testing.assert_close(out, same)
