"""What the adapter's GPU test files share (imports torch: import it after
``pytest.importorskip("torch")``): the exact-math setting every comparison with torch runs under,
the comparison of a language model's logits and gradients with torch's own error, the
``own_kernels`` fixture and the ``-plain-own`` model names (:func:`model_named`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import pycudnn
import pycudnn.torch as pt
from pycudnn import memory
from pycudnn.torch import fused_train
from pycudnn.torch._runtime import FIRST_USE


@pytest.fixture
def own_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The residual chains on pycudnn's batch-norm kernels at test sizes too (below
    ``fused_train.OWN_MIN_ELEMENTS`` they run cuDNN's fused kernel, as the fuse tests check):
    ``pytest.mark.usefixtures("own_kernels")``, the fixture imported."""
    monkeypatch.setattr(fused_train, "OWN_MIN_ELEMENTS", 0)


#: a test model's name suffix that puts every ReLU chain on pycudnn's kernels, the plain ones too
PLAIN_OWN = "-plain-own"


def model_named(name: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """*name* without :data:`PLAIN_OWN`; with it, every ReLU chain of the test's fused model on
    pycudnn's batch-norm kernels, the plain ones too (whose region outputs the backward does not
    keep): ``fused_train.OWN_PLAIN_MIN_ELEMENTS`` lowered to 0."""
    if name.endswith(PLAIN_OWN):
        monkeypatch.setattr(fused_train, "OWN_PLAIN_MIN_ELEMENTS", 0)
    return name.removesuffix(PLAIN_OWN)


@contextlib.contextmanager
def exact_math() -> Iterator[None]:
    """TF32 off on torch's side (pycudnn computes float32 with FMA by default), torch's allocator
    installed (the previous resource back afterwards, and the adapter's first-use choice with
    it: where this was the process's first use, the next one still installs torch's allocator,
    as a later CUDA-graph capture needs), the handle back on the default stream."""
    old = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    resource, first = memory.allocator.memory_resource(), FIRST_USE[0]
    pt.use_torch_allocator()
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old
        memory.allocator.set_memory_resource(resource)
        FIRST_USE[0] = first
        pycudnn.get_handle().set_stream(0)


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    """``|a - b| / |b|`` (L2, float32; a zero *b* counts as 1e-30)."""
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def lm_grads(model: Any, ids: torch.Tensor, mask: torch.Tensor | None = None) -> tuple:
    """A transformers language model's logits and its parameters' gradients of the loss on
    *ids* (gradients reset first): ``(logits, {name: grad})``."""
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, attention_mask=mask, labels=ids)
    out.loss.backward()
    return out.logits, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def assert_lm_agree(got: tuple, ref: tuple, f32: tuple) -> None:
    """*got* within twice *ref*'s error of the float32 *f32* (at least 2e-2, relative L2), the
    logits and every gradient (:func:`lm_grads`' results)."""
    (lg, gg), (lr, gr), (lf, gf) = got, ref, f32
    assert lg.dtype == lr.dtype and torch.isfinite(lg).all()
    assert rel_l2(lg, lf) <= max(2 * rel_l2(lr, lf), 2e-2), (rel_l2(lg, lf), rel_l2(lr, lf))
    assert set(gg) == set(gr) == set(gf)
    for n in gf:
        want = max(2 * rel_l2(gr[n], gf[n]), 2e-2)
        assert rel_l2(gg[n], gf[n]) <= want, (n, rel_l2(gg[n], gf[n]), rel_l2(gr[n], gf[n]))
