"""Python function calls per call of the converted modules of ``bench/torch_models.py``'s module
table (issue 39's A/B of the adapter's eager path): forward under ``no_grad``, forward with
autograd recording, and forward + backward, each counted by ``cProfile`` over 100 calls after 3
warm-up calls. Deterministic, so two trees compare without the host-speed drift that separate
processes on a shared machine show; what it counts is Python steps, not microseconds.

Run on the GPU machine from the repository root (bf16 channels-last, batch 8, 28x28: the
module table's ``quick`` shapes)::

    PYTHONPATH=. python3 bench/adapter_calls.py

Prints one line per module: ``<module> fwd N  fwd_grad N  fwd+bwd N``.
"""

from __future__ import annotations

import copy
import cProfile
import pstats
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def calls(fn: Callable[[], Any], n: int = 100) -> float:
    """Python function calls per call of *fn* (after three untimed calls)."""
    for _ in range(3):
        fn()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        fn()
    prof.disable()
    return pstats.Stats(prof).total_calls / n  # type: ignore[attr-defined]


def row(spec: tuple, torch: Any, pt: Any, rn: Any) -> str:
    """One module's line: its converted twin's calls per call in the three columns."""
    name, make, shape, training = spec
    torch.manual_seed(0)
    m = copy.deepcopy(rn.to_bf16_channels_last(make(), "cuda").train(training))
    pt.convert(m, strict=True)
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    if x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    xg = x.detach().clone().requires_grad_(True)
    inplace = bool(getattr(m, "inplace", False))  # a fresh input each call
    prep = (lambda: x.clone()) if inplace else (lambda: x)
    prep_g = (lambda: xg.clone()) if inplace else (lambda: xg)
    with torch.no_grad():
        dy = torch.randn_like(m(prep()))
        fwd = calls(lambda: m(prep()))
    fwd_grad = calls(lambda: m(prep_g()))
    ins = (xg, *(p for p in m.parameters() if p.requires_grad))
    both = calls(lambda: torch.autograd.grad(m(prep_g()), ins, dy))
    return f"{name:24s} fwd {fwd:6.0f}  fwd_grad {fwd_grad:6.0f}  fwd+bwd {both:6.0f}"


def main() -> int:
    import torch

    import pycudnn.torch as pt
    from bench import torch_resnet50 as rn
    from bench.torch_models import PLANS, module_specs

    for spec in module_specs(PLANS["quick"]):
        print(row(spec, torch, pt, rn), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
