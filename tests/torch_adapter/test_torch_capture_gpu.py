"""GPU tests of whole steps in a CUDA graph (marker ``gpu``; skipped without a device, torch or
torchvision): a fused model (``convert(model, fuse=True)``) captured as torch's documentation
says (warm-up on a side stream, ``torch.cuda.graph`` around the step) replays as it runs eagerly.

* **Eval**: a captured forward of a fused ResNet-18/50 (bfloat16, channels-last) replays the
  eager model's logits on new data, and after the parameters and running statistics change in
  place, the new model's: its batch-norm folds are made inside the graph, so a replay folds the
  values of its moment.
* **Training**: forward, loss, backward and ``SGD`` (momentum) of a fused ResNet-18/50, captured
  whole, replayed on fresh batches against a copy stepping eagerly on the same batches: losses,
  parameter updates and running statistics agree within the noise of cuDNN's nondeterministic
  reductions; ``torch.cuda.make_graphed_callables`` of a fused ResNet-18 trains the same way; a
  converted transformer encoder layer's whole step too.
* **Dropout**: a converted ``nn.Dropout`` captured in a graph draws a new mask each replay
  (cuDNN's RNG states advance on the device), with the kept fraction and scale of its ``p``.

Run on the GPU machine: ``PYTHONPATH=. python3 -m pytest -m gpu -q
tests/torch_adapter/test_torch_capture_gpu.py``.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
nn = torch.nn
F = nn.functional

from torch_gpu import model_named, own_kernels  # noqa: E402, F401  (tests/support; fixture)

import pycudnn.torch as pt  # noqa: E402
from pycudnn.torch import fold_kernel  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("own_kernels")]
DEV = "cuda"
CL = torch.channels_last


@pytest.fixture(autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def _fused(name: str, train: bool):
    torch.manual_seed(0)
    base = getattr(torchvision.models, name)(weights=None, num_classes=10)
    base = base.to(DEV, memory_format=CL)
    for m in base.modules():  # bfloat16, batch norm in float32 (mixed precision's usual choice)
        if not isinstance(m, nn.BatchNorm2d):
            for p in m.parameters(recurse=False):
                p.data = p.data.to(torch.bfloat16)
    model = pt.convert(base, fuse=True)
    return model.train(train)


def _batch(n: int, seed: int):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(n, 3, 64, 64, device=DEV, dtype=torch.bfloat16, generator=g)
    return x.to(memory_format=CL), torch.randint(0, 10, (n,), device=DEV, generator=g)


def _warm(fn, times: int = 3) -> None:
    """*fn* run *times* on a side stream, as torch's CUDA-graph documentation asks before a
    capture (plans, workspaces, optimizer state and gradients are made there)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(times):
            fn()
    torch.cuda.current_stream().wait_stream(s)


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_a_captured_eval_replays_the_parameters_of_its_moment(name):
    model = _fused(name, train=False)
    eager = copy.deepcopy(model)
    static_x, _ = _batch(8, 1)
    with torch.no_grad():
        _warm(lambda: model(static_x))
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_y = model(static_x)
        for seed in (2, 3):
            x, _ = _batch(8, seed)
            static_x.copy_(x)
            g.replay()
            want = eager(x)
            assert _rel(static_y, want) < 1e-3, seed
        # an optimizer step, an EMA or load_state_dict changes the tensors in place: the replay
        # must fold what they hold now, not what they held at the capture
        for m in (model, eager):
            for p in m.parameters():
                p.mul_(1.25)
            for n, b in m.named_buffers():
                if n.endswith("running_var"):
                    b.add_(0.5)
        before = static_y.clone()
        g.replay()
        want = eager(static_x)
        assert _rel(want, before) > 0.05  # (the change shows)
        assert _rel(static_y, want) < 1e-3


def test_a_capture_after_an_eager_warm_up_folds_with_pycudnns_kernels(monkeypatch):
    monkeypatch.setattr(fold_kernel, "_WARM", set())  # (as in a fresh process)
    model = _fused("resnet18", train=False)
    static_x, _ = _batch(8, 1)
    with torch.no_grad():
        _warm(lambda: model(static_x))  # eager: the region's programs, and the kernels loaded
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            model(static_x)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        g.replay()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert any(n.startswith("fold_vectors_") for n in names), names
    assert any(n.startswith("fold_bf16_") for n in names), names
    assert not any("BinaryFunctor" in n for n in names)  # (torch's per-weight multiply)


def _sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def _train_step(model, opt, x, y):
    loss = F.cross_entropy(model(x).float(), y)
    loss.backward()
    opt.step()
    return loss


def _agree(a: nn.Module, b: nn.Module, start: dict, losses_a: list, losses_b: list) -> None:
    """*a* and *b* trained from the same *start* on the same batches: per-step losses, the
    parameters' updates and the running statistics agree (cuDNN's weight gradients and batch
    norm's reductions may sum in another order between runs: not bitwise)."""
    for la, lb in zip(losses_a, losses_b, strict=True):
        assert abs(la - lb) <= 2e-2 * abs(lb), (losses_a, losses_b)
    da = torch.cat([(p.detach().float() - start[n].float()).flatten()
                    for n, p in a.named_parameters()])  # fmt: skip
    db = torch.cat([(p.detach().float() - start[n].float()).flatten()
                    for n, p in b.named_parameters()])  # fmt: skip
    assert db.norm() > 0 and _rel(da, db) < 5e-2, _rel(da, db)
    for (n, ba), bb in zip(a.named_buffers(), b.buffers(), strict=True):
        if ba.is_floating_point():
            assert _rel(ba, bb) < 1e-2, n
        else:
            assert torch.equal(ba, bb), n  # num_batches_tracked


@pytest.mark.parametrize("name", ["resnet18", "resnet50", "resnet18-plain-own"])
def test_a_captured_training_step_trains_as_the_eager_one(name, monkeypatch):
    """(``-plain-own``: :func:`torch_gpu.model_named`.)"""
    name = model_named(name, monkeypatch)
    model = _fused(name, train=True)
    eager = copy.deepcopy(model)
    opt, opt_e = _sgd(model), _sgd(eager)
    static_x, static_y = _batch(8, 1)

    def warm_step():
        opt.zero_grad(set_to_none=True)
        _train_step(model, opt, static_x, static_y)

    _warm(warm_step)
    for _ in range(3):  # the eager copy takes the same warm-up steps
        opt_e.zero_grad(set_to_none=True)
        _train_step(eager, opt_e, static_x, static_y)
    start = {n: p.detach().clone() for n, p in eager.named_parameters()}
    opt.zero_grad(set_to_none=True)  # the graph's backward allocates the gradients
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_loss = _train_step(model, opt, static_x, static_y)
    got, want = [], []
    for seed in (2, 3, 4):
        x, y = _batch(8, seed)
        static_x.copy_(x)
        static_y.copy_(y)
        g.replay()
        got.append(float(static_loss))
        opt_e.zero_grad(set_to_none=True)
        want.append(float(_train_step(eager, opt_e, x, y)))
    assert len(set(got)) == 3  # each replay trained on its own batch
    _agree(model, eager, start, got, want)


def test_make_graphed_callables_trains_the_fused_model():
    model = _fused("resnet18", train=True)
    eager = copy.deepcopy(model)
    sample, _ = _batch(8, 1)
    graphed = torch.cuda.make_graphed_callables(model, (sample,))
    for _ in range(3):  # its warm-up ran the forward three times: the same statistics
        eager(sample)
    opt, opt_e = _sgd(model), _sgd(eager)
    start = {n: p.detach().clone() for n, p in eager.named_parameters()}
    got, want = [], []
    for seed in (2, 3, 4):
        x, y = _batch(8, seed)
        opt.zero_grad(set_to_none=True)
        got.append(float(_train_step(graphed, opt, x, y)))
        opt_e.zero_grad(set_to_none=True)
        want.append(float(_train_step(eager, opt_e, x, y)))
    _agree(model, eager, start, got, want)


def test_a_converted_transformer_layers_whole_step_captures():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)
    model = pt.convert(layer.to(DEV, torch.bfloat16))
    assert any(type(m).__module__.startswith("pycudnn") for m in model.modules())
    eager = copy.deepcopy(model)
    opt, opt_e = _sgd(model), _sgd(eager)
    g0 = torch.Generator(device=DEV).manual_seed(1)
    static_x = torch.randn(4, 128, 256, device=DEV, dtype=torch.bfloat16, generator=g0)

    def step(m, o, x):
        loss = m(x).float().square().mean()
        loss.backward()
        o.step()
        return loss

    def warm_step():
        opt.zero_grad(set_to_none=True)
        step(model, opt, static_x)

    _warm(warm_step)
    for _ in range(3):
        opt_e.zero_grad(set_to_none=True)
        step(eager, opt_e, static_x)
    start = {n: p.detach().clone() for n, p in eager.named_parameters()}
    opt.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = step(model, opt, static_x)
    got, want = [], []
    for seed in (2, 3, 4):
        x = torch.randn(4, 128, 256, device=DEV, dtype=torch.bfloat16,
                        generator=torch.Generator(device=DEV).manual_seed(seed))  # fmt: skip
        static_x.copy_(x)
        graph.replay()
        got.append(float(static_loss))
        opt_e.zero_grad(set_to_none=True)
        want.append(float(step(eager, opt_e, x)))
    _agree(model, eager, start, got, want)


def test_captured_dropout_draws_a_new_mask_each_replay():
    drop = pt.convert(nn.Sequential(nn.Dropout(0.5))).train()
    assert type(drop[0]).__module__.startswith("pycudnn")
    x = torch.ones(1 << 16, device=DEV, dtype=torch.float16)
    with torch.no_grad():
        _warm(lambda: drop(x))
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = drop(x)
        masks = []
        for _ in range(3):
            g.replay()
            assert set(y.unique().tolist()) <= {0.0, 2.0}  # kept elements scaled by 1 / (1 - p)
            kept = (y != 0).float().mean().item()
            assert 0.48 < kept < 0.52, kept
            masks.append(y != 0)
    assert not torch.equal(masks[0], masks[1]) and not torch.equal(masks[1], masks[2])
