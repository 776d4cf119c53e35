"""A ResNet stem as one module (imports torch): a one-chain fused region -- convolution, batch
norm, ReLU -- and the ``MaxPool2d`` that alone reads its output (``convert(model, fuse=True)``).

In eval without a gradient the region runs the convolution with batch norm folded into its
weights and the ReLU as its epilogue; for a 3-channel image cuDNN has a slower kernel for that
epilogue than for the plain convolution (ResNet's 7x7 stride-2 stem, batch 32, bfloat16, on an
H200: 218.7 µs against 194.7, and slower still with the batch norm's scale in the epilogue;
docs/BENCHMARKS.md). So here the plain convolution runs with the model's own weight, and the
batch norm and the ReLU are applied inside pycudnn's max-pooling kernel as it reads each element
(:func:`.pool_kernel.forward_bn`): two launches, no folded copy of anything, and a CUDA-graph
replay reads the statistics and parameters of its moment. A signature's first call checks
everything and records the two launches as a launch program (:mod:`.program`), which later calls
replay, as a region's are.

Everything else -- training, a gradient wanted, ``torch.compile``, hooks, a convolution bias,
data the kernel does not take -- runs the region and then the pooling module, as before.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import torch
from torch import nn

from .._config import config
from ..graph import _plans
from . import _lean, pool_kernel
from ._compile import compiling
from ._module import state
from ._runtime import as_tuple, autocast_dtype, cuda_ok, like, ready, stream_of
from .conv import conv_into, conv_out_shape
from .fused import hooked
from .pool import MaxPool2d
from .program import Program, record
from .region import FusedRegion

__all__ = ["FusedPool", "pools_after", "use_pool_kernel"]

#: the eval signatures a module remembers as run (the oldest is dropped for a new one)
MAX_SIGNATURES = 8
_WHAT = (
    "eval: the convolution without an epilogue, then batch norm and ReLU inside pycudnn's "
    "max-pooling kernel"
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
        out = []
        for sig, b in state(self).get("evals", {}).items():
            if b is False:
                continue
            how = "a program of 2 launches" if b.program is not None else f"unrecorded: {b.why}"
            out.append((sig, f"{_WHAT} ({how})"))
        return out

    def _eval(self, x: torch.Tensor) -> torch.Tensor | None:
        """The eval path, or None (the region and the pooling module run). A signature's first
        call checks everything and runs the two launches under a launch tape, which become a
        program (:func:`~.program.record`: the convolution's output in its arena) that later
        calls replay."""
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
        ac = autocast_dtype()
        if ac is not None:  # (autocast's casts, as the convolution's)
            x, w = x.to(ac), w.to(ac)
        vectors = (bn.running_mean, bn.running_var, bn.weight, bn.bias)
        sig = (
            x.shape, x.stride(), x.dtype, x.get_device(), x.data_ptr() & 15,
            w.shape, w.stride(), w.dtype, w.get_device(), w.data_ptr() & 15,
            tuple(None if v is None else (v.shape, v.stride(), v.dtype, v.get_device(),
                                          v.data_ptr() & 15) for v in vectors),
            conv.stride, conv.padding, conv.dilation, conv.groups, conv.padding_mode,
            bn.eps, pool.kernel_size, pool.stride, pool.padding, ac, config.snapshot(),
            _plans.stats.clears, threading.get_ident(),
        )  # fmt: skip
        evals = state(self).setdefault("evals", OrderedDict())
        b = evals.get(sig)
        capturing = x.is_cuda and torch.cuda.is_current_stream_capturing()
        if b is None:
            if capturing:  # (plans are built and kernels loaded outside a capture only)
                return None
            b = self._bind(x, w, vectors, chain._cfg(), pool)
            if len(evals) >= MAX_SIGNATURES:
                evals.popitem(last=False)
            evals[sig] = b
            if b is False:
                return None
            return self._record(b, x, w, vectors, float(bn.eps))
        if b is False:
            return None
        if b.program is None:  # (the two launches, each on the lean path)
            return self._launch(b, x, w, vectors, float(bn.eps))
        ptrs = [x.data_ptr(), w.data_ptr()] + [v.data_ptr() for v in vectors if v is not None]
        _, outs, _ = b.program.run(ptrs, x.device, stream_of(x))
        return outs[0]

    @staticmethod
    def _bind(x, w, vectors, cfg, pool) -> _Eval | bool:
        """A signature's checks: its :class:`_Eval`, or False (the kernel path does not take
        it)."""
        if cfg is None or w.device != x.device or x.dtype != w.dtype:
            return False
        if not x.is_contiguous(memory_format=torch.channels_last):
            return False
        ws = as_tuple(pool.kernel_size, 2)
        pcfg = (ws, ws if not pool.stride else as_tuple(pool.stride, 2),
                as_tuple(pool.padding, 2), "max")  # fmt: skip
        shape = conv_out_shape(x, w, cfg)
        y = like(shape, x)
        if not (pool_kernel.takes_bn(y, pcfg) and pool_kernel.bn_vectors_ok(vectors, y)):
            return False
        return _Eval(cfg, pcfg, shape)

    @staticmethod
    def _launch(b: _Eval, x, w, vectors, eps: float) -> torch.Tensor:
        ready()
        y = conv_into(x, w, None, like(b.shape, x), b.cfg)
        return pool_kernel.forward_bn(y, b.pcfg, vectors, eps)

    def _record(self, b: _Eval, x, w, vectors, eps: float) -> torch.Tensor:
        """The first call of a signature: the launches under a tape, then their program."""
        if _lean.recording():  # (tapes do not nest: whoever records records these launches)
            b.why = "inside another launch tape"
            return self._launch(b, x, w, vectors, eps)
        with _lean.Tape() as tape:
            out = self._launch(b, x, w, vectors, eps)
        got = record(tape.launches, [x, w, *(v for v in vectors if v is not None)], [out], True)
        if isinstance(got, str):
            b.why = got
        else:
            b.program = got[0]
        return out


class _Eval:
    """What a signature of :meth:`FusedPool._eval` keeps: the convolution's and the pooling's
    configurations, the convolution's output shape, and the program of the two launches (None,
    and why, where they could not be recorded)."""

    __slots__ = ("cfg", "pcfg", "program", "shape", "why")

    def __init__(self, cfg: tuple, pcfg: tuple, shape: tuple) -> None:
        self.cfg, self.pcfg, self.shape = cfg, pcfg, shape
        self.program: Program | None = None
        self.why = ""
