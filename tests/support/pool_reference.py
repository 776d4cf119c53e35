"""float64 twins of pycudnn's max-pooling kernels (:mod:`pycudnn.torch.pool_kernel`), in torch
(imports torch: import it after ``pytest.importorskip("torch")``): the window maximum, its
position in the window (the first maximum in row-major order, the last NaN where there is one,
as torch's max pooling picks), and the gradient scattered back to those positions. The CPU tests
run them in the kernels' place; the GPU tests compare the kernels with them."""

from __future__ import annotations

import torch
from torch.nn import functional as F


def max_pool_ref(x: torch.Tensor, cfg: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y, pos)`` of *x* (n, c, h, w) pooled by *cfg* ``(window, stride, pad, mode)``: *y*
    float64, *pos* int64 (n, c, oh, ow). Inputs must not hold -inf (a padded position would tie
    with it)."""
    ws, stride, pad, _ = cfg
    n, c, h, w = x.shape
    xp = F.pad(x.double(), (pad[1], pad[1], pad[0], pad[0]), value=float("-inf"))
    cols = F.unfold(xp, ws, stride=stride)
    k = ws[0] * ws[1]
    cols = cols.view(n, c, k, -1)
    pos = cols.argmax(dim=2)
    nan = cols.isnan()
    last_nan = k - 1 - nan.flip(2).to(torch.int8).argmax(dim=2)
    pos = torch.where(nan.any(dim=2), last_nan, pos)
    oh = (h + 2 * pad[0] - ws[0]) // stride[0] + 1
    ow = (w + 2 * pad[1] - ws[1]) // stride[1] + 1
    y = cols.gather(2, pos.unsqueeze(2)).view(n, c, oh, ow)
    return y, pos.view(n, c, oh, ow)


def max_pool_grad_ref(
    dy: torch.Tensor, pos: torch.Tensor, shape: tuple, cfg: tuple
) -> torch.Tensor:
    """float64 gradient of the input (*shape*) from the output's *dy* and :func:`max_pool_ref`'s
    *pos*: each output gradient added at its window's maximum."""
    ws, stride, pad, _ = cfg
    n, c, h, w = shape
    k = ws[0] * ws[1]
    onehot = F.one_hot(pos.reshape(n, c, -1), k).permute(0, 1, 3, 2).double()
    cols = (onehot * dy.double().reshape(n, c, 1, -1)).reshape(n, c * k, -1)
    full = F.fold(cols, (h + 2 * pad[0], w + 2 * pad[1]), ws, stride=stride)
    return full[:, :, pad[0] : pad[0] + h, pad[1] : pad[1] + w]


def positions_of(idx: torch.Tensor, oshape: tuple) -> torch.Tensor:
    """The kernel's *idx* (a byte per output element, channels-last memory order) as int64
    positions (n, c, oh, ow)."""
    n, c, oh, ow = oshape
    return idx.view(n, oh, ow, c).permute(0, 3, 1, 2).long()


def bn_relu_ref(x: torch.Tensor, vectors: tuple, eps: float) -> torch.Tensor:
    """float64 ``relu(gamma * (x - mean) / sqrt(var + eps) + beta)`` of *x* (n, c, h, w), the
    vectors ``(mean, var, gamma, beta)`` (gamma, beta may be None), a NaN kept."""
    mean, var, gamma, beta = (None if v is None else v.double().view(1, -1, 1, 1) for v in vectors)
    y = (x.double() - mean) / torch.sqrt(var + eps)
    if gamma is not None:
        y = y * gamma
    if beta is not None:
        y = y + beta
    return torch.where(y < 0, torch.zeros_like(y), y)
