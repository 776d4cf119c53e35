"""What the adapter's GPU test files share (imports torch: import it after
``pytest.importorskip("torch")``): the exact-math setting every comparison with torch runs under."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

import pycudnn
import pycudnn.torch as pt
from pycudnn import memory


@contextlib.contextmanager
def exact_math() -> Iterator[None]:
    """TF32 off on torch's side (pycudnn computes float32 with FMA by default), torch's allocator
    installed (the previous resource back afterwards), the handle back on the default stream."""
    old = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    resource = memory.allocator.memory_resource()
    pt.use_torch_allocator()
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old
        memory.allocator.set_memory_resource(resource)
        pycudnn.get_handle().set_stream(0)
