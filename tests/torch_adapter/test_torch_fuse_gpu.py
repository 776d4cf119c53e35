"""GPU tests of ``convert(model, fuse=True)`` (marker ``gpu``; skipped without a device, torch,
torchvision or transformers as each test needs).

Run on the GPU machine:
``PYTHONPATH=. python3 -m pytest -m gpu -q tests/torch_adapter/test_torch_fuse_gpu.py``.

The fused model against the unfused torch model (a deep copy: the same parameters) for every
pattern, in eval (``torch.no_grad``: the fused calls) and in training (one step: outputs, input
and parameter gradients, running statistics), float32 and bfloat16, NCHW and channels-last;
torchvision's resnet18/resnet50/mobilenet_v2 (random init, small batch) the same way; a
HuggingFace Llama MLP from a tiny config in eval; ``last_call().fused`` for the NHWC bfloat16
fused convolution.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import test_torch_fuse as toys  # noqa: E402  (tests/torch_adapter: the CPU file's toy models)
import torch_gpu  # noqa: E402  (tests/support)

import pycudnn  # noqa: E402
import pycudnn.torch as pt  # noqa: E402
from pycudnn.torch import fuse  # noqa: E402

pytestmark = pytest.mark.gpu

DEV = "cuda"
# (rtol, atol) of a comparison with torch: float32 runs FMA on both sides (TF32 off); bfloat16
# rounds once per fused call against torch's several roundings
TOL = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (5e-2, 5e-2)}
FORMATS = {"nchw": torch.contiguous_format, "nhwc": torch.channels_last}


@pytest.fixture(autouse=True)
def _exact_math():
    with torch_gpu.exact_math():
        yield


def _stats(model):
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.5, 0.5)
    return model


def _pair(model, dtype, fmt):
    torch.manual_seed(0)
    ref = _stats(model).to(DEV, dtype).to(memory_format=fmt)
    mine = pt.convert(copy.deepcopy(ref), fuse=True)
    assert fuse.fusions(mine), "nothing fused"
    return ref, mine


def _eval(ref, mine, x, dtype):
    ref.eval()
    mine.eval()
    with torch.no_grad():
        got, want = mine(x), ref(x)
    rtol, atol = TOL[dtype]
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)


def _train(ref, mine, x, dtype):
    """One training step of each: float32 against torch directly; bfloat16 within its noise
    (:func:`_within_noise`)."""
    if dtype != torch.float32:
        _within_noise(ref, mine, x, 1e-2)
        return
    ref.train()
    mine.train()
    rtol, atol = TOL[dtype]
    xr, xm = x.clone().requires_grad_(), x.clone().requires_grad_()
    yr, ym = ref(xr), mine(xm)
    torch.testing.assert_close(ym, yr, rtol=rtol, atol=atol)
    dy = torch.randn_like(yr)
    yr.backward(dy)
    ym.backward(dy)
    torch.testing.assert_close(xm.grad, xr.grad, rtol=rtol, atol=atol)
    for (n, a), b in zip(mine.named_parameters(), ref.parameters(), strict=True):
        scale = max(1.0, float(b.grad.abs().max()))
        torch.testing.assert_close(a.grad, b.grad, rtol=rtol, atol=atol * scale, msg=n)
    for (n, a), b in zip(mine.named_buffers(), ref.buffers(), strict=True):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=n)


def _step(model, x, dy, autocast=None):
    """One training step (the forward under ``torch.autocast(autocast)`` when given, the
    backward outside it): the output, the input's gradient, every parameter's gradient and the
    running statistics after it, flattened to float32."""
    model.train()
    xi = x.clone().requires_grad_()
    with torch.autocast("cuda", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        y = model(xi)
    y.backward(dy.to(y.dtype))
    grads = torch.cat([p.grad.flatten().float() for p in model.parameters()])
    stats = torch.cat([b.flatten().float() for b in model.buffers() if b.is_floating_point()])
    return y, xi.grad, grads, stats


def _within_noise(base, mine, x, floor):
    """A training step of *mine* and of *base* (the same model in the same low precision), each
    against a float32 copy of *base*: *mine*'s relative L2 error at most twice *base*'s plus
    *floor*, for the output, the input gradient, the parameter gradients and the running
    statistics. Rounding differs between the two (cuDNN's fused batch norm + add + ReLU rounds
    once where the separate calls round each step), which flips the ReLU's mask of elements
    within rounding of zero: an element-wise comparison of gradients does not hold there."""
    ref32 = copy.deepcopy(base).float()
    base.eval()
    with torch.no_grad():
        shape = base(x).shape
    dy = torch.randn(shape, device=DEV)
    got = {"base": _step(base, x, dy), "mine": _step(mine, x, dy)}
    got["f32"] = _step(ref32, x.float(), dy)
    for i, what in enumerate(("output", "input gradient", "parameter gradients", "statistics")):
        err_base, err_mine = (
            _rel(got["base"][i], got["f32"][i]),
            _rel(got["mine"][i], got["f32"][i]),
        )
        assert err_mine <= 2 * err_base + floor, (what, err_mine, err_base)


def _input(model, dtype, fmt):
    c = next(m for m in model.modules() if isinstance(m, nn.Conv2d)).in_channels
    return torch.randn(4, c, 16, 16, device=DEV, dtype=dtype).to(memory_format=fmt)


TOYS = [
    lambda: toys.ConvBNAct(nn.ReLU()),
    lambda: toys.ConvBNAct(nn.SiLU()),
    lambda: toys.ConvBNAct(nn.ReLU6()),
    lambda: toys.ConvBNAct(nn.Sigmoid()),
    lambda: toys.ConvBNAct(nn.Tanh()),
    lambda: toys.ConvBNAct(nn.ELU()),
    lambda: toys.ConvBNAct(nn.GELU()),
    lambda: toys.ConvBNAct(),
    toys.BasicBlock,
    lambda: toys.BasicBlock(4, 8, 2),
    toys.Bottleneck,
    toys.Net,
]
TOY_IDS = ["relu", "silu", "relu6", "sigmoid", "tanh", "elu", "gelu", "noact"]
TOY_IDS += ["basic", "basic-down", "bottleneck", "net"]


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("make", TOYS, ids=TOY_IDS)
def test_patterns_fused_against_torch(make, dtype, fmt):
    ref, mine = _pair(make(), dtype, FORMATS[fmt])
    x = _input(ref, dtype, FORMATS[fmt])
    _eval(ref, mine, x, dtype)
    _train(ref, mine, x, dtype)
    _eval(ref, mine, x, dtype)  # the fold follows the running statistics training changed


def test_nhwc_bfloat16_conv_runs_as_one_fused_kernel():
    _, mine = _pair(toys.ConvBNAct(nn.ReLU(), c=16), torch.bfloat16, torch.channels_last)
    mine.eval()
    pycudnn.clear_caches()
    x = torch.randn(2, 3, 16, 16, device=DEV, dtype=torch.bfloat16)
    x = x.to(memory_format=torch.channels_last)
    with torch.no_grad():
        mine(x)
    call = pycudnn.highlevel.conv.last_call()
    assert call is not None and call.fused, call


def test_linear_act_patterns():
    torch.manual_seed(0)
    for act in (nn.GELU(), nn.ReLU(), nn.SiLU(), nn.GELU("tanh")):
        ref = nn.Sequential(nn.Linear(64, 128), act, nn.Linear(128, 32)).to(DEV, torch.bfloat16)
        mine = pt.convert(copy.deepcopy(ref), fuse=True)
        assert [r.pattern for _, r in fuse.fusions(mine)] == ["linear_act"]
        x = torch.randn(8, 64, device=DEV, dtype=torch.bfloat16)
        with torch.no_grad():
            torch.testing.assert_close(mine(x), ref(x), rtol=5e-2, atol=5e-2)
        xm, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
        mine(xm).float().sum().backward()
        ref(xr).float().sum().backward()
        torch.testing.assert_close(xm.grad, xr.grad, rtol=5e-2, atol=5e-2)


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", ["resnet18", "resnet50", "mobilenet_v2"])
def test_torchvision_models(name, dtype, fmt):
    """Eval: the fused model's logits against a float32 copy of torch's, within twice torch's own
    error in *dtype* (deep bf16 nets drift from float32 by more than any fixed tolerance).
    Training: the fused model and the unfused converted one against a float32 copy of torch's
    (the fused one runs batch norm, the residual and the ReLU as one cuDNN kernel for bfloat16
    channels-last data, rounding once where the unfused calls round two or three times)."""
    models = pytest.importorskip("torchvision.models")
    torch.manual_seed(0)
    model = getattr(models, name)(num_classes=10)
    for m in model.modules():
        if isinstance(m, nn.Dropout):  # mobilenet_v2's classifier: training compares two runs
            m.p = 0.0
    ref, mine = _pair(model, dtype, FORMATS[fmt])
    x = torch.randn(4, 3, 64, 64, device=DEV, dtype=dtype).to(memory_format=FORMATS[fmt])
    assert all(r.fused for _, r in fuse.fusions(mine) if r.pattern.startswith("conv"))
    ref32 = copy.deepcopy(ref).float().eval()
    ref.eval()
    mine.eval()
    with torch.no_grad():
        want = ref32(x.float())
        err_torch, err_fused = _rel(ref(x), want), _rel(mine(x), want)
    floor = 1e-4 if dtype == torch.float32 else 1e-2
    assert err_fused <= 2 * err_torch + floor, (err_fused, err_torch)
    # training, one step: the fused model against the unfused converted one, within the noise
    _within_noise(pt.convert(copy.deepcopy(ref)), mine, x, floor)


@pytest.mark.parametrize("own", [True, False], ids=["own", "cudnn"])
@pytest.mark.parametrize(
    "make", [toys.Bottleneck, lambda: toys.BasicBlock(8, 8)], ids=["bottleneck", "basic"]
)
def test_training_runs_one_kernel_path_per_chain(make, own, monkeypatch):
    """bfloat16 channels-last training: every conv -> bn -> relu chain runs batch norm and the
    ReLU as cuDNN's one kernel, every conv -> bn -> add -> relu chain pycudnn's own kernels
    (:func:`~pycudnn.torch.fused_train.chain_path`; these toys are below its size threshold,
    lowered here) or, below the threshold, cuDNN's fused kernel too; forward and backward, one
    autograd node; the step within noise of torch's."""
    from pycudnn.torch import fused_train

    if own:
        monkeypatch.setattr(fused_train, "OWN_MIN_ELEMENTS", 0)
    seen = []
    names = ("bn_act_train_run", "bn_act_grad_run", "train_forward", "train_backward")
    for name in names:  # (a chain's own node and a region's first run both go through these)
        real = getattr(fused_train, name)
        spy = lambda *a, _r=real, _n=name, **k: seen.append(_n) or _r(*a, **k)  # noqa: E731
        monkeypatch.setattr(fused_train, name, spy)
    ref, mine = _pair(make(), torch.bfloat16, torch.channels_last)
    x = _input(ref, torch.bfloat16, torch.channels_last)
    _train(ref, mine, x, torch.bfloat16)
    pats = [r.pattern for _, r in fuse.fusions(mine)]
    plain, added = pats.count("conv_bn_act"), pats.count("conv_bn_add_act")
    assert added >= 1 and plain + added >= 2, pats
    cudnn, mine = (plain, added) if own else (plain + added, 0)
    assert seen.count("bn_act_train_run") == seen.count("bn_act_grad_run") == cudnn, seen
    assert seen.count("train_forward") == seen.count("train_backward") == mine, seen


@pytest.mark.parametrize("make", [toys.Bottleneck, toys.Net], ids=["bottleneck", "net"])
def test_eval_after_training_on_pycudnns_kernels_folds_the_new_statistics(make, monkeypatch):
    """Eval, a training step with the residual chains on pycudnn's batch-norm kernels, eval
    again: the second eval folds the running statistics the step moved (the kernels bump their
    versions, which the folds' cache keys on; a stale fold otherwise)."""
    from pycudnn.torch import fused_train

    monkeypatch.setattr(fused_train, "OWN_MIN_ELEMENTS", 0)
    ref, mine = _pair(make(), torch.bfloat16, torch.channels_last)
    x = _input(ref, torch.bfloat16, torch.channels_last)
    _eval(ref, mine, x, torch.bfloat16)
    _train(ref, mine, x, torch.bfloat16)
    _eval(ref, mine, x, torch.bfloat16)


def test_llama_mlp_eval():
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaMLP

    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, hidden_act="silu")
    torch.manual_seed(0)
    ref = LlamaMLP(cfg).to(DEV, torch.bfloat16).eval()
    mine = pt.convert(copy.deepcopy(ref), fuse=True)
    assert [r.pattern for _, r in fuse.fusions(mine)] == ["linear_act"]
    x = torch.randn(2, 5, 64, device=DEV, dtype=torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(mine(x), ref(x), rtol=5e-2, atol=5e-2)


def test_state_dict_and_back_on_the_gpu():
    ref, mine = _pair(toys.Net(), torch.float32, torch.contiguous_format)
    assert list(mine.state_dict()) == list(ref.state_dict())
    pt.convert(mine, back=True)
    assert not fuse.fusions(mine)
    assert {type(m) for m in mine.modules()} == {type(m) for m in ref.modules()}


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_compiled_fused_training_equals_eager(mode):
    """``torch.compile`` of a fused model in training: the chains are the custom ops
    ``pycudnn::conv_bn_train`` / ``_grad`` (no graph break), with eager's outputs, gradients and
    running statistics (several steps for CUDA graphs: warm-up, capture, replays)."""
    torch._dynamo.reset()
    ref, eager = _pair(toys.Net(), torch.bfloat16, torch.channels_last)
    comp = copy.deepcopy(eager)
    x = _input(ref, torch.bfloat16, torch.channels_last)
    assert torch._dynamo.explain(copy.deepcopy(eager))(x).graph_break_count == 0
    compiled = torch.compile(comp, mode=mode)
    for _ in range(3 if mode else 1):
        got = []
        for m in (compiled, eager):
            for p in m.parameters():
                p.grad = None
            xi = x.clone().requires_grad_()
            y = m(xi)
            y.float().square().sum().backward()
            got.append([y.detach().clone(), xi.grad, *(p.grad for p in m.parameters())])
        for a, b in zip(*got, strict=True):
            torch.testing.assert_close(a.float(), b.float(), rtol=5e-2, atol=5e-2)
    for a, b in zip(comp.buffers(), eager.buffers(), strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-2, atol=1e-2)
    torch._dynamo.reset()


def test_fused_training_under_autocast(monkeypatch):
    """float32 weights under ``torch.autocast(bfloat16)``, channels-last: the training chains
    take autocast's casts and run cuDNN's fused kernel; one step's output, input and parameter
    gradients and running statistics within noise of a float32 copy (as the unfused converted
    model under autocast)."""
    from pycudnn.torch import fused_train

    seen = []
    real = fused_train.bn_act_train_run
    monkeypatch.setattr(
        fused_train, "bn_act_train_run", lambda *a, **k: seen.append(1) or real(*a, **k)
    )
    torch.manual_seed(0)
    ref = _stats(toys.Net()).to(DEV).to(memory_format=torch.channels_last)
    mine = pt.convert(copy.deepcopy(ref), fuse=True)
    plain = pt.convert(copy.deepcopy(ref))
    x = _input(ref, torch.float32, torch.channels_last)
    dy = torch.randn(x.shape[0], 3, device=DEV)
    got = {"f32": _step(ref, x, dy)}
    for tag, m in (("plain", plain), ("mine", mine)):
        got[tag] = _step(m, x, dy, torch.bfloat16)
    assert seen, "no chain ran cuDNN's fused batch norm under autocast"
    for i, what in enumerate(("output", "input gradient", "parameter gradients", "statistics")):
        err_plain, err_mine = (
            _rel(got["plain"][i], got["f32"][i]),
            _rel(got["mine"][i], got["f32"][i]),
        )
        assert err_mine <= 2 * err_plain + 1e-2, (what, err_mine, err_plain)
