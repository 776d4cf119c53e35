"""A ResNet stem as one module (imports torch): a one-chain fused region -- convolution, batch
norm, ReLU -- and the ``MaxPool2d`` that alone reads its output (``convert(model, fuse=True)``).

In eval without a gradient the region runs the convolution with batch norm folded into its
weights and the ReLU as its epilogue; for a 3-channel image cuDNN has a slower kernel for that
epilogue than for the plain convolution (ResNet's 7x7 stride-2 stem, batch 32, bfloat16, on an
H200: 218.7 µs against 194.7, and slower still with the batch norm's scale in the epilogue;
docs/BENCHMARKS.md). So here the plain convolution runs with the model's own weight, and the
batch norm and the ReLU are applied inside pycudnn's max-pooling kernel as it reads each element
(:func:`.pool_kernel.forward_bn`): two launches, no folded copy of anything, and a CUDA-graph
replay reads the statistics and parameters of its moment.

Everything else -- training, a gradient wanted, ``torch.compile``, hooks, a convolution bias,
data the kernel does not take -- runs the region and then the pooling module, as before.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch import nn

from .._config import config
from . import pool_kernel
from ._compile import compiling
from ._module import state
from ._runtime import as_tuple, autocast_dtype, cuda_ok, like, ready
from .conv import conv_into, conv_out_shape
from .fused import hooked
from .pool import MaxPool2d
from .region import FusedRegion

__all__ = ["FusedPool", "pools_after", "use_pool_kernel"]

#: the eval signatures a module remembers as run (the oldest is dropped for a new one)
MAX_SIGNATURES = 8
_WHAT = (
    "eval: the convolution without an epilogue, then batch norm and ReLU inside pycudnn's "
    "max-pooling kernel (2 launches)"
)


_ENABLED = [True]


def use_pool_kernel(enabled: bool) -> None:
    """Run stems' eval on the plain convolution and pycudnn's pooling kernel (True, the
    default) or as the region and then the pooling module (False: for comparisons)."""
    if not isinstance(enabled, bool):
        raise TypeError(f"use_pool_kernel: enabled must be a bool, got {enabled!r}")
    _ENABLED[0] = enabled


def pools_after(region: FusedRegion, pool: nn.Module) -> bool:
    """Whether :class:`FusedPool` takes *region* and *pool*: one 2-D chain with a ReLU and no
    residual, reading the region's input, and a converted ``MaxPool2d``."""
    if len(region.parts) != 1 or region.wiring != ((-1, None),) or region.outputs != (0,):
        return False
    chain = region.parts[0]
    return (
        isinstance(pool, MaxPool2d)
        and chain.nd == 2
        and chain.act is not None
        and chain.act.name == "relu"
        and chain.parts[3] is None
    )


class FusedPool(nn.Module):
    """A one-chain region and the max pooling of its output (see the module docstring);
    registers nothing with parameters (``state_dict`` unchanged).

    Parameters
    ----------
    region : FusedRegion
        The stem's region (:func:`pools_after` says which).
    pool : MaxPool2d
        The converted pooling module (kept registered where it is).
    """

    def __init__(self, region: FusedRegion, pool: nn.Module) -> None:
        super().__init__()
        self.region = region
        self.parts = (pool,)  # a tuple: nothing registered

    def extra_repr(self) -> str:
        return f"then {type(self.parts[0]).__name__}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``pool(region(x))``: in eval without a gradient on the convolution and pycudnn's
        pooling kernel with the batch norm and ReLU inside (where it takes the data)."""
        if _ENABLED[0] and not compiling():
            y = self._eval(x)
            if y is not None:
                return y
        return self.parts[0](self.region(x)[0])

    def programs(self) -> list[tuple[Any, str]]:
        """Per eval signature that ran the kernel path: ``(signature, what runs)``."""
        return [(sig, _WHAT) for sig in state(self).get("evals", {})]

    def _eval(self, x: torch.Tensor) -> torch.Tensor | None:
        """The eval path, or None (the region and the pooling module run)."""
        chain = self.region.parts[0]
        conv, bn, step, _ = chain.parts
        pool = self.parts[0]
        if bn.training or bn.running_mean is None or bn.running_var is None:
            return None
        if not cuda_ok(x) or x.dim() != 4 or conv.bias is not None:
            return None
        w = conv.weight
        if torch.is_grad_enabled() and (
            x.requires_grad or w.requires_grad or any(p.requires_grad for p in bn.parameters())
        ):
            return None
        if hooked(conv) or hooked(bn) or hooked(pool):
            return None
        if step is not None and isinstance(step.target, nn.Module) and hooked(step.target):
            return None
        cfg = chain._cfg()
        if cfg is None or w.device != x.device:
            return None
        ac = autocast_dtype()
        if ac is not None:  # (autocast's casts, as the convolution's)
            x, w = x.to(ac), w.to(ac)
        if x.dtype != w.dtype or not x.is_contiguous(memory_format=torch.channels_last):
            return None
        ws = as_tuple(pool.kernel_size, 2)
        pcfg = (ws, ws if not pool.stride else as_tuple(pool.stride, 2),
                as_tuple(pool.padding, 2), "max")  # fmt: skip
        y = like(conv_out_shape(x, w, cfg), x)
        vectors = (bn.running_mean, bn.running_var, bn.weight, bn.bias)
        if not (pool_kernel.takes_bn(y, pcfg) and pool_kernel.bn_vectors_ok(vectors, y)):
            return None
        sig = (tuple(x.shape), x.stride(), x.dtype, x.get_device(), x.data_ptr() & 15,
               w.stride(), ac, config.snapshot(), threading.get_ident())  # fmt: skip
        evals = state(self).setdefault("evals", {})
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            if sig not in evals:  # (the convolution's plan is built outside a capture only)
                return None
        elif sig not in evals:
            if len(evals) >= MAX_SIGNATURES:
                evals.pop(next(iter(evals)))
            evals[sig] = True
        ready()
        conv_into(x, w, None, y, cfg)
        return pool_kernel.forward_bn(y, pcfg, vectors, float(bn.eps))
