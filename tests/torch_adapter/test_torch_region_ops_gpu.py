"""GPU tests of fused regions under ``torch.compile`` (marker ``gpu``; skipped without a
device, torch or torchvision): each region traced as its custom ops (``pycudnn::region_eval``,
``region_train``, ``region_train_grad``), which replay launch programs.

Run on the GPU machine:
``PYTHONPATH=. python3 -m pytest -m gpu -q tests/torch_adapter/test_torch_region_ops_gpu.py``.

torchvision's resnet18 (random init) converted with ``fuse=True``, bfloat16 channels-last:
compiled training steps (inductor, default mode and ``reduce-overhead``: warm-up, CUDA-graph
capture, replays) within twice torch's own distance to a float32 copy (output, input gradient,
parameter gradients, running statistics), and the regions' programs recorded; under autocast
with float32 weights; compiled eval equal to the eager fused model's.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
nn = torch.nn

import test_torch_fuse_gpu as fg  # noqa: E402  (tests/torch_adapter)
import test_torch_program_gpu as pg  # noqa: E402
from torch_gpu import own_kernels  # noqa: E402, F401  (tests/support; fixture)

from pycudnn.torch import fuse, region_ops  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("own_kernels")]
DEV = "cuda"
CL = torch.channels_last


def _programs(model):
    """Per region of *model*: (training forward programs, backward programs, eval programs)."""
    out = []
    for _, r in fuse.regions(model):
        spec = region_ops.spec_of(r.op_key)
        fwd = sum(p.fwd is not None for p in spec.train.values())
        bwd = sum(isinstance(v, tuple) for p in spec.train.values() for v in p.bwd.values())
        out.append((fwd, bwd, sum(p.fwd is not None for p in spec.eval.values())))
    return out


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_compiled_training_runs_region_programs_within_noise(mode):
    torch._dynamo.reset()
    base, mine = pg._models("resnet18")
    compiled = torch.compile(mine) if mode is None else torch.compile(mine, mode=mode)
    x = torch.randn(8, 3, 64, 64, device=DEV, dtype=torch.bfloat16).to(memory_format=CL)
    for _ in range(4):  # warm-up and capture (reduce-overhead), then replays
        pg._zero(base, mine)
        fg._within_noise(base, compiled, x, 1e-2)
    progs = _programs(mine)
    assert progs and all(f >= 1 and b >= 1 for f, b, _ in progs), progs
    torch._dynamo.reset()


def test_compiled_training_under_autocast_within_noise():
    torch._dynamo.reset()
    base, mine = pg._models("resnet18", bn_float=False, dtype=torch.float32)
    compiled = torch.compile(mine)
    ref32 = copy.deepcopy(base)
    x = torch.randn(8, 3, 64, 64, device=DEV).to(memory_format=CL)
    with torch.no_grad():
        dy = torch.randn(base(x).shape, device=DEV)
    for _ in range(3):
        pg._zero(base, mine, ref32)
        got = {
            "base": fg._step(base, x, dy, torch.bfloat16),
            "mine": fg._step(compiled, x, dy, torch.bfloat16),
            "f32": fg._step(ref32, x, dy, None),
        }
        for i in range(4):
            err_base = fg._rel(got["base"][i], got["f32"][i])
            assert fg._rel(got["mine"][i], got["f32"][i]) <= 2 * err_base + 1e-2, i
    progs = _programs(mine)
    assert progs and all(f >= 1 and b >= 1 for f, b, _ in progs), progs
    torch._dynamo.reset()


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_compiled_eval_equals_the_eager_fused_model(mode):
    torch._dynamo.reset()
    _, mine = pg._models("resnet50")
    mine.eval()
    eager = copy.deepcopy(mine)
    compiled = torch.compile(mine) if mode is None else torch.compile(mine, mode=mode)
    x = torch.randn(8, 3, 64, 64, device=DEV, dtype=torch.bfloat16).to(memory_format=CL)
    with torch.no_grad():
        want = eager(x).float()
        for _ in range(4):  # (reduce-overhead: warm-up, capture, replays)
            got = compiled(x).float()
            assert fg._rel(got, want) < 1e-2  # (inductor's pooling and head: rounding)
        # parameters and statistics changed in place (an optimizer step, load_state_dict): the
        # kept folds are refolded; a replay folds inside its graph, so it reads the new ones
        for m in (mine, eager):
            for p in m.parameters():
                p.mul_(1.25)
            for n, b in m.named_buffers():
                if n.endswith("running_var"):
                    b.add_(0.5)
        moved = eager(x).float()
        assert fg._rel(moved, want) > 0.1
        for _ in range(3):
            assert fg._rel(compiled(x).float(), moved) < 1e-2
    progs = _programs(mine)
    assert progs and all(e >= 1 for _, _, e in progs), progs
    for _, r in fuse.regions(mine):  # kept in pycudnn's memory, not the graph tree's pool
        assert len(region_ops.spec_of(r.op_key).folds) >= 1
    torch._dynamo.reset()
