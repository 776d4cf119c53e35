"""The models the ``torch.compile`` tests share, on the CPU fakes and on the GPU (imports torch:
import it after ``pytest.importorskip("torch")``)."""

from __future__ import annotations

import torch
from torch import nn

import pycudnn.torch as pt


class CNN(nn.Module):
    """The issue's model: conv-bn-relu-pool-conv-relu-pool-linear, *cin* input channels, 16
    inside, *pool* the second pooling (16x16 inputs)."""

    def __init__(self, cin: int = 3, pool: type[nn.Module] = nn.AvgPool2d):
        super().__init__()
        self.c1, self.bn = nn.Conv2d(cin, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.p1, self.c2 = nn.MaxPool2d(2), nn.Conv2d(16, 16, 3, padding=1)
        self.p2, self.fc = pool(2), nn.Linear(16 * 4 * 4, 10)
        self.r1, self.r2 = nn.ReLU(), nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.p1(self.r1(self.bn(self.c1(x))))
        x = self.p2(self.r2(self.c2(x)))
        return self.fc(x.flatten(1))


class Block(nn.Module):
    """A transformer block: LayerNorm, Linear projections, attention (pycudnn's), dropout (p=0),
    softmax; width *d*, *h* heads."""

    def __init__(self, d: int = 32, h: int = 4):
        super().__init__()
        self.h = h
        self.ln, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.drop, self.sm = nn.Dropout(0.0), nn.Softmax(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln(x)).view(b, s, 3, self.h, d // self.h).unbind(2)
        a = pt.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        y = x + self.drop(self.proj(a.transpose(1, 2).reshape(b, s, d)))
        return self.sm(y.transpose(1, 2)).transpose(1, 2)
