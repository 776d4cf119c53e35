"""``convert(model, fuse=True)`` on the CPU: the matcher on traced toy models, the rewrite's
``state_dict``/``back``/``deepcopy`` contract, the untraceable-module warning, torch's fallbacks
for CPU tensors, and (the fakes tier: pycudnn's functions replaced by torch computations behind
their real signatures, CPU tensors let through) the fused eager path against the unfused torch
model in eval and training: outputs, gradients, running statistics. cuDNN's numbers are the GPU
tier's, ``test_torch_fuse_gpu.py``.
"""

from __future__ import annotations

import copy
import io
import operator

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import test_torch_adapter_fakes as base  # noqa: E402  (tests/torch_adapter is on sys.path)

import pycudnn  # noqa: E402
from pycudnn import highlevel as hl  # noqa: E402
from pycudnn import torch as pt  # noqa: E402
from pycudnn.graph import _plans  # noqa: E402
from pycudnn.torch import (  # noqa: E402
    _runtime,
    activation,
    batchnorm,
    conv,
    fuse,
    fused,
    fused_train,
    linear,
)

CALLS: list[tuple] = []


# -- toy models ------------------------------------------------------------------------------------
class ConvBNAct(nn.Module):
    def __init__(self, act=None, c=4):
        super().__init__()
        self.conv = nn.Conv2d(3, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.act = act

    def forward(self, x):
        y = self.bn(self.conv(x))
        return y if self.act is None else self.act(y)


class ConvTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        y = self.conv(x)
        return F.relu(self.bn(y)) + y


class BasicBlock(nn.Module):
    """torchvision's, as it is written there (one ReLU module used twice)."""

    def __init__(self, cin=4, c=4, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, c, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(c, c, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.downsample = None
        if stride != 1 or cin != c:
            self.downsample = nn.Sequential(
                nn.Conv2d(cin, c, 1, stride, bias=False), nn.BatchNorm2d(c)
            )

    def forward(self, x):
        identity = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        out = self.relu(out)
        return out


class Bottleneck(nn.Module):
    """torchvision's (one ReLU module used three times)."""

    def __init__(self, cin=8, width=4, c=8):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, c, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += identity
        return self.relu(out)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = ConvBNAct(nn.ReLU(), c=4)
        self.layer = nn.Sequential(BasicBlock(4, 8, 2), BasicBlock(8, 8), Bottleneck(8, 4, 8))
        self.fc = nn.Linear(8, 6)
        self.act = nn.GELU()
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        x = self.layer(self.stem(x))
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.head(self.act(self.fc(x)))


class Untraceable(nn.Module):
    """Control flow on a tensor's value: torch.fx cannot trace it."""

    def __init__(self):
        super().__init__()
        self.block = ConvBNAct(nn.ReLU())

    def forward(self, x):
        if x.sum() > 0:
            return self.block(x)
        return self.block(-x)


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Untraceable()
        self.tail = ConvBNAct(nn.SiLU(), c=4)
        self.tail.conv = nn.Conv2d(4, 4, 1)

    def forward(self, x):
        return self.tail(self.inner(x))


def _records(model):
    m = pt.convert(model, strict=True)
    graph = fuse._Tracer().trace(m)
    return fuse.match(graph, dict(m.named_modules()))


def _summary(records):
    return [(r.pattern, r.nodes, r.fused) for r in records]


# -- the matcher -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("act", "last"),
    [
        (nn.ReLU(), "act"),
        (nn.ReLU6(inplace=True), "act"),
        (nn.SiLU(), "act"),
        (nn.GELU(), "act"),
        (nn.Sigmoid(), "act"),
        (nn.Tanh(), "act"),
        (nn.ELU(0.5), "act"),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, nn.Module) else v,
)
def test_conv_bn_activation_module(act, last):
    (rec,) = _records(ConvBNAct(act))
    assert _summary([rec]) == [("conv_bn_act", ("conv", "bn", last), True)]
    assert "training" in rec.reason


def test_conv_bn_without_activation():
    assert _summary(_records(ConvBNAct())) == [("conv_bn", ("conv", "bn"), True)]


@pytest.mark.parametrize(
    "fn",
    [
        lambda y: F.relu(y, inplace=True),
        torch.relu,
        lambda y: y.relu(),
        lambda y: F.relu6(y),
        lambda y: F.gelu(y, approximate="tanh"),
        lambda y: F.elu(y, alpha=0.3),
    ],
    ids=["F.relu_inplace", "torch.relu", "Tensor.relu", "F.relu6", "F.gelu_tanh", "F.elu"],
)
def test_conv_bn_functional_activation(fn):
    class M(ConvBNAct):
        def forward(self, x):
            return fn(self.bn(self.conv(x)))

    (rec,) = _records(M())
    assert rec.pattern == "conv_bn_act" and rec.fused and len(rec.nodes) == 3


def test_conv_used_twice_is_not_fused_with_its_reason():
    (rec,) = _records(ConvTwice())
    assert rec.pattern == "conv_bn" and not rec.fused
    assert "2 users" in rec.reason


def test_residual_add_relu():
    class M(ConvBNAct):
        def forward(self, x):
            return torch.relu(torch.add(x, self.bn(self.conv(x))))

    (rec,) = _records(M(c=3))
    assert _summary([rec]) == [("conv_bn_add_act", ("conv", "bn", "add", "relu"), True)]


def test_basic_block_and_bottleneck_with_a_shared_relu():
    recs = _records(BasicBlock(4, 8, 2))
    assert _summary(recs) == [
        ("conv_bn_act", ("conv1", "bn1", "relu"), True),
        ("conv_bn_add_act", ("conv2", "bn2", "add", "relu_1"), True),
        ("conv_bn", ("downsample_0", "downsample_1"), True),
    ]
    recs = _records(Bottleneck())
    assert [r.pattern for r in recs] == ["conv_bn_act", "conv_bn_act", "conv_bn_add_act"]
    assert all(r.fused for r in recs)


def test_linear_activations():
    class M(nn.Module):
        def __init__(self, act):
            super().__init__()
            self.fc, self.act = nn.Linear(4, 5), act

        def forward(self, x):
            return self.act(self.fc(x))

    for act in (nn.GELU(), nn.ReLU(), nn.SiLU(), F.gelu):
        (rec,) = _records(M(act))
        assert rec.pattern == "linear_act" and rec.fused, act
        assert "gradient" in rec.reason
    (rec,) = _records(M(nn.Tanh()))
    assert not rec.fused and "tanh" in rec.reason


def test_excluded_modules_are_not_fused():
    m = pt.convert(ConvBNAct(nn.ReLU()), exclude=lambda m: isinstance(m, nn.BatchNorm2d))
    recs = fuse.match(fuse._Tracer().trace(m), dict(m.named_modules()))
    assert len(recs) == 1 and not recs[0].fused and "converted batch norm" in recs[0].reason


# -- the rewrite's contract ------------------------------------------------------------------------
def test_state_dict_same_keys_same_tensors_and_back():
    torch.manual_seed(0)
    model = Net()
    before = {k: v.data_ptr() for k, v in model.state_dict().items()}
    classes = {n: type(m) for n, m in model.named_modules()}
    out = pt.convert(model, fuse=True)
    assert out is model and "forward" in model.__dict__
    after = model.state_dict()
    assert list(after) == list(before)
    assert {k: v.data_ptr() for k, v in after.items()} == before
    pats = sorted(r.pattern for _, r in fuse.fusions(model))
    assert pats == sorted(["conv_bn_act"] * 5 + ["conv_bn_add_act"] * 3 + ["conv_bn", "linear_act"])
    assert pt.convert(model, back=True) is model
    assert "forward" not in model.__dict__ and not fuse.fusions(model)
    assert {n: type(m) for n, m in model.named_modules()} == classes


def test_fuse_is_a_strict_boolean_and_not_with_back():
    with pytest.raises(ValueError, match="fuse"):
        pt.convert(Net(), fuse="maybe")
    with pytest.raises(ValueError, match="back=True"):
        pt.convert(Net(), fuse=True, back=True)


def test_untraceable_module_warns_and_its_children_fuse():
    model = Outer()
    with pytest.warns(UserWarning, match=r"inner \(Untraceable\) does not trace") as rec:
        pt.convert(model, fuse=True)
    assert len([w for w in rec if "does not trace" in str(w.message)]) == 1
    paths = {(p, r.pattern) for p, r in fuse.fusions(model)}
    assert ("inner.block", "conv_bn_act") in paths  # the untraceable module's child
    assert ("", "conv_bn_act") not in paths and ("tail", "conv_bn_act") in paths
    x = torch.randn(2, 3, 6, 6)
    ref = copy.deepcopy(model)
    pt.convert(ref, back=True)
    torch.testing.assert_close(model(x), ref(x))


def test_cpu_inputs_give_torchs_results():
    torch.manual_seed(0)
    ref = Net()
    ref.layer[0].bn1.running_var.uniform_(0.5, 2)
    model = pt.convert(copy.deepcopy(ref), fuse=True)
    x = torch.randn(2, 3, 8, 8)
    for train in (False, True):
        ref.train(train)
        model.train(train)
        torch.testing.assert_close(model(x), ref(x))
    for a, b in zip(model.buffers(), ref.buffers(), strict=True):
        torch.testing.assert_close(a, b)


def test_deepcopy_and_saved_state_dict():
    torch.manual_seed(0)
    model = pt.convert(Net(), fuse=True).eval()
    twin = copy.deepcopy(model)
    gm = twin.__dict__["forward"].__self__
    fc = gm.fused_fc.parts[0]
    assert fc is twin.fc and fc is not model.fc  # the copy's fused modules use its modules
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(twin(x), model(x))
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    fresh = Net()
    fresh.load_state_dict(torch.load(buf))
    torch.testing.assert_close(fresh.eval()(x), model(x))


def test_compile_uses_the_custom_ops():
    torch.manual_seed(0)
    model = pt.convert(BasicBlock(4, 8, 2), fuse=True).eval()
    x = torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        ref = model(x)
        seen = []

        def backend(gm, inputs):
            seen.extend(str(n.target) for n in gm.graph.nodes)
            return gm.forward

        got = torch.compile(model, backend=backend)(x)
    torch.testing.assert_close(got, ref)
    assert any("conv_fused" in t for t in seen), seen


def test_custom_op_fakes_match_the_real_outputs():
    x = torch.randn(2, 3, 9, 9).to(memory_format=torch.channels_last)
    w, b = torch.randn(5, 3, 3, 3), torch.randn(5)
    cfg = [2, 1, 1, 1, 2, 2, 1, 1]
    real = torch.ops.pycudnn.conv_fused(x, w, b, None, cfg, "relu", 0.0)
    torch.library.opcheck(torch.ops.pycudnn.conv_fused, (x, w, b, None, cfg, "relu", 0.0))
    assert real.is_contiguous(memory_format=torch.channels_last) and real.shape == (2, 5, 5, 5)
    torch.testing.assert_close(real, F.relu(F.conv2d(x, w, b, 2, 1)))
    a, w2 = torch.randn(2, 3, 4), torch.randn(6, 4)
    torch.library.opcheck(torch.ops.pycudnn.linear_fused, (a, w2, None, "gelu"))


# -- the fakes tier: the fused eager path on CPU tensors -----------------------------------------
_CONV_SIG = hl.dnn_conv


def _epilogue(r, bias, activation, z, z_alpha):
    if bias is not None:
        r = r + bias.view(1, -1, *(1,) * (r.dim() - 2))
    if z is not None:
        r = r + z_alpha * z
    if activation is None:
        return r
    act = fused.Act(*activation) if isinstance(activation, tuple) else fused.Act(activation)
    return fused.torch_act(r, act)


def _fake_conv(real, fn):
    @base._bound(real)
    def fake(img, kerns, border_mode, subsample, dilation, conv_mode, num_groups, out, **kw):
        assert conv_mode == "cross" and out is not None
        bias, act, z = kw["bias"], kw["activation"], kw["z"]
        CALLS.append(("conv", act, z is not None))
        r = fn(img, kerns, None, subsample, border_mode, dilation, num_groups)
        return base._out(out, _epilogue(r, bias, act, z, kw["z_alpha"]))

    return fake


@base._bound(hl.dnn_matmul)
def fake_matmul(a, b, bias, activation, out, **_):
    assert out is not None and a.dim() == b.dim() == 2
    if a.dtype == torch.float32 and not pycudnn.config.snapshot().allow_tf32:
        raise pycudnn.errors.NotSupportedError(3000, "dnn_matmul", "float32 needs allow_tf32")
    CALLS.append(("matmul", activation))
    r = _epilogue(a.double() @ b.double(), bias, activation, None, 1.0)
    return base._out(out, r.to(out.dtype))


def _ok(x, dtypes=_runtime.FLOATS):
    return type(x) in (torch.Tensor, nn.Parameter) and x.dtype in dtypes


@pytest.fixture
def fakes(monkeypatch):
    replaced = {
        "dnn_conv": _fake_conv(hl.dnn_conv, F.conv2d),
        "dnn_conv3d": _fake_conv(hl.dnn_conv3d, F.conv3d),
        "dnn_gradinput": base.fake_gradinput,
        "dnn_gradinput3d": base.fake_gradinput3d,
        "dnn_gradweight": base.fake_gradweight,
        "dnn_gradweight3d": base.fake_gradweight3d,
        "dnn_batch_normalization_train": base.fake_bn_train,
        "dnn_batch_normalization_test": base.fake_bn_test,
        "dnn_batch_normalization_grad": base.fake_bn_grad,
        "dnn_activation": base.fake_activation,
        "dnn_activation_grad": base.fake_activation_grad,
        "dnn_matmul": fake_matmul,
        "cuda_ok": _ok,
    }
    for name, fake in replaced.items():
        for module in (_runtime, activation, batchnorm, conv, linear, fused):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, fake)
    monkeypatch.setattr(_runtime, "raw_stream", lambda device: 0)
    monkeypatch.setattr(_runtime, "_AUTO", [False])
    CALLS.clear()
    base.CALLS.clear()
    yield


def _pair(make):
    torch.manual_seed(0)
    ref = make().double()
    for m in ref.modules():
        if isinstance(m, nn.BatchNorm2d | nn.BatchNorm3d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.5, 0.5)
    return ref, pt.convert(copy.deepcopy(ref), fuse=True, strict=True)


@pytest.mark.usefixtures("fakes")
@pytest.mark.parametrize("make", [Net, BasicBlock, Bottleneck], ids=lambda f: f.__name__)
def test_fused_eval_path_matches_torch(make):
    ref, mine = _pair(make)
    ref.eval()
    mine.eval()
    x = torch.randn(2, 8 if make is Bottleneck else 4 if make is BasicBlock else 3, 8, 8).double()
    with torch.no_grad():
        got, want = mine(x), ref(x)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    convs = [c for c in CALLS if c[0] == "conv"]
    assert any(c[2] and c[1] == "relu" for c in convs)  # a residual epilogue ran
    assert "dnn_batch_normalization_test" not in base.CALLS  # every batch norm was folded


def _same_step(ref, mine, x, fwd=None):
    """One training step of *ref* and *mine* (through *fwd*, default *mine* itself) on *x*: the
    output, the input's and every parameter's gradient and the buffers equal to 1e-9; returns
    the two outputs."""
    xr, xm = x.clone().requires_grad_(), x.clone().requires_grad_()
    yr, ym = ref(xr), (mine if fwd is None else fwd)(xm)
    torch.testing.assert_close(ym, yr, rtol=1e-9, atol=1e-9)
    dy = torch.randn_like(yr)
    yr.backward(dy)
    ym.backward(dy)
    torch.testing.assert_close(xm.grad, xr.grad, rtol=1e-9, atol=1e-9)
    for (n, a), b in zip(mine.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-9, atol=1e-9, msg=n)
    for (n, a), b in zip(mine.named_buffers(), ref.buffers(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=n)
    return yr, ym


@pytest.mark.usefixtures("fakes")
@pytest.mark.parametrize("make", [Net, BasicBlock, Bottleneck], ids=lambda f: f.__name__)
def test_fused_training_is_one_node_and_exact(make):
    ref, mine = _pair(make)
    x = torch.randn(2, 8 if make is Bottleneck else 4 if make is BasicBlock else 3, 8, 8).double()
    yr, ym = _same_step(ref, mine, x)
    if make is not Net:  # the block's last chain (conv, bn, add, relu) is one autograd node
        assert type(ym.grad_fn).__name__ == "TrainFnBackward"
        assert type(yr.grad_fn).__name__ != "TrainFnBackward"
    assert "dnn_batch_normalization_act_train" not in base.CALLS  # float64: separate calls
    assert all(c[1] is None and not c[2] for c in CALLS if c[0] == "conv")
    # back in eval: the fold is recomputed from the running statistics training updated
    ref.eval()
    mine.eval()
    with torch.no_grad():
        torch.testing.assert_close(mine(x), ref(x), rtol=1e-9, atol=1e-9)


# -- training with cuDNN's fused batch norm + ReLU (+ residual), as fakes --------------------------
@base._bound(hl.dnn_batch_normalization_act_train)
def fake_bn_act_train(
    inputs, gamma, beta, z, activation, epsilon, running_average_factor, running_mean,
    running_var, out, out_mean, out_invstd, out_reserve, **_,
):  # fmt: skip
    assert activation == "relu" and out is not None and out_reserve is not None
    CALLS.append(("bn_act", z is not None, out_reserve.numel()))
    y, mean, invstd, *_r = base.fake_bn_train(
        inputs, gamma, beta, "spatial", epsilon, running_average_factor, running_mean,
        running_var, inplace_running=running_mean is not None, out_mean=out_mean,
        out_invstd=out_invstd,
    )  # fmt: skip
    out_reserve.zero_()  # cuDNN writes its bit mask there
    return base._out(out, F.relu(y if z is None else y + z)), mean, invstd, out_reserve


@base._bound(hl.dnn_batch_normalization_act_grad)
def fake_bn_act_grad(
    inputs, y, dy, scale, bias, x_mean, x_invstd, reserve, activation, epsilon, residual, out,
    out_dscale, out_dbias, out_dz, **_,
):  # fmt: skip
    assert reserve.numel() == (16 if residual else 0)
    d = dy * (y > 0)  # the ReLU's mask from the forward's output, as cuDNN's
    res = base.fake_bn_grad(inputs, d, scale, x_mean, x_invstd, "spatial", epsilon, out=out,
                            out_dscale=out_dscale, out_dbias=out_dbias)  # fmt: skip
    return (*res, base._out(out_dz, d)) if residual else res


def _reserve_size(shape, dtype, residual=False, device=None):
    return 16 if residual else 0


@pytest.fixture
def bn_act(fakes, monkeypatch):
    """The fused batch norm's fakes, taken for float64 channels-last data (exact references)."""
    monkeypatch.setattr(batchnorm, "dnn_batch_normalization_act_train", fake_bn_act_train)
    monkeypatch.setattr(batchnorm, "dnn_batch_normalization_act_grad", fake_bn_act_grad)
    monkeypatch.setattr(batchnorm, "batch_normalization_act_reserve_size", _reserve_size)
    monkeypatch.setattr(fused_train, "HALVES", (torch.float64,))
    monkeypatch.setattr(batchnorm, "_RESERVE", _plans.HostCache("test", 256))


@pytest.mark.usefixtures("bn_act")
@pytest.mark.parametrize("make", [BasicBlock, Bottleneck, Net], ids=lambda f: f.__name__)
def test_fused_training_with_cudnns_bn_relu_kernel(make):
    ref, mine = _pair(make)
    cin = 8 if make is Bottleneck else 4 if make is BasicBlock else 3
    x = torch.randn(2, cin, 8, 8).double().to(memory_format=torch.channels_last)
    _same_step(ref, mine, x)
    fused_calls = [c for c in CALLS if c[0] == "bn_act"]
    # every conv -> bn -> relu and conv -> bn -> add -> relu chain ran on the fused kernel,
    # with the residual form's reserve space; a chain without a ReLU (downsample) did not
    assert ("bn_act", True, 16) in fused_calls
    if make is not BasicBlock:
        assert ("bn_act", False, 0) in fused_calls
    assert base.CALLS.count("dnn_batch_normalization_act_grad") == len(fused_calls)


@pytest.mark.usefixtures("bn_act")
def test_fused_bn_relu_refused_by_cudnn_runs_separate_calls(monkeypatch):
    def refuse(*a, **k):
        CALLS.append(("refused",))
        raise pycudnn.errors.NotSupportedError(3000, "dnn_batch_normalization_act_train", "no")

    monkeypatch.setattr(batchnorm, "batch_normalization_act_reserve_size", refuse)
    ref, mine = _pair(lambda: ConvBNAct(nn.ReLU()))
    x = torch.randn(2, 3, 8, 8).double().to(memory_format=torch.channels_last)
    for _ in range(2):
        torch.testing.assert_close(mine(x), ref(x), rtol=1e-9, atol=1e-9)
    assert CALLS.count(("refused",)) == 1  # the signature is remembered
    assert base.CALLS.count("dnn_batch_normalization_train") == 2


def test_chain_path_gives_the_residual_form_to_pycudnns_kernels(monkeypatch):
    """Which kernels a training chain's batch norm (+ addition) + ReLU runs, from the shapes
    alone: pycudnn's own for the residual form on CUDA channels-last half data they take, from
    ``OWN_MIN_ELEMENTS`` elements (the ReLU's mask a bit an element), else cuDNN's fused kernel
    (its reserve size), else cuDNN's separate calls."""
    monkeypatch.setattr(batchnorm, "batch_normalization_act_reserve_size", _reserve_size)
    monkeypatch.setattr(batchnorm, "_RESERVE", _plans.HostCache("test", 256))
    cl, relu, f32 = torch.channels_last, ("relu", 0.0), torch.float32

    def y(c=16, dtype=torch.float16, fmt=cl):
        return torch.empty(2, c, 4, 6, dtype=dtype, device="meta").to(memory_format=fmt)

    path = fused_train.chain_path
    assert path(y(), f32, relu, True, 0) == ("cudnn", 16)  # too small: launch-bound
    monkeypatch.setattr(fused_train, "OWN_MIN_ELEMENTS", 2 * 16 * 4 * 6)
    assert path(y(), f32, relu, True, 0) == ("own", 2 * 16 * 4 * 6 // 8)
    assert path(y(dtype=torch.bfloat16), f32, relu, True, 0) == ("own", 96)
    assert path(y(), f32, relu, False, 0) == ("cudnn", 0)  # the plain form: cuDNN's kernel
    monkeypatch.setattr(fused_train, "OWN_MIN_ELEMENTS", 0)
    assert path(y(12), f32, relu, True, 0) == ("cudnn", 16)  # channels not a multiple of 8
    assert path(y(4096), f32, relu, True, 0) == ("cudnn", 16)  # more than a block covers
    assert path(y(), torch.float64, relu, True, 0) == ("cudnn", 16)
    assert path(y(), f32, relu, True, -1) == ("cudnn", 16)  # not on a CUDA device
    assert path(y(fmt=torch.contiguous_format), f32, relu, True, 0) == ("", 0)
    assert path(y(), f32, ("silu", 0.0), True, 0) == ("", 0)
    assert path(y(dtype=torch.float32), f32, relu, True, 0) == ("", 0)


def _block_args(residual, dtype=torch.float64):
    torch.manual_seed(0)
    cl = torch.channels_last
    x = torch.randn(2, 3, 8, 8, dtype=dtype).to(memory_format=cl)
    w = torch.randn(4, 3, 3, 3, dtype=dtype).to(memory_format=cl)
    gamma, beta = torch.rand(4, dtype=dtype) + 0.5, torch.randn(4, dtype=dtype)
    z = torch.randn(2, 4, 8, 8, dtype=dtype).to(memory_format=cl) if residual else None
    rm, rv = torch.zeros(4, dtype=dtype), torch.ones(4, dtype=dtype)
    return x, w, gamma, beta, z, rm, rv


CONV = [2, 1, 1, 1, 1, 1, 1, 1]  # nd 2, groups 1, padding 1, stride 1, dilation 1


@pytest.mark.usefixtures("bn_act")
@pytest.mark.parametrize("kernel", ["fused", "separate"])
@pytest.mark.parametrize("residual", [False, True], ids=["bn_relu", "bn_add_relu"])
def test_training_ops_opcheck(residual, kernel, monkeypatch):
    """The compiled training node's two ops: schema, fakes (shapes, dtypes, strides, the
    reserve's size), AOT dispatch, on both of the forward's paths."""
    if kernel == "separate":
        monkeypatch.setattr(fused_train, "HALVES", ())
    args = _block_args(residual)
    params = [1e-5, 0.1, 0.0]
    torch.library.opcheck(torch.ops.pycudnn.conv_bn_train, (*args, CONV, params, "relu"))
    out, yc, mean, invstd, reserve = torch.ops.pycudnn.conv_bn_train(
        *_block_args(residual), CONV, params, "relu"
    )
    assert reserve.numel() == (16 if residual and kernel == "fused" else 0)
    x, w, gamma, beta = args[:4]
    saved = [x, w, yc, gamma, beta, mean, invstd, out, reserve]
    for flags in ([int(residual), 1, 1], [int(residual), 0, 1]):
        dy = torch.randn_like(out)
        torch.library.opcheck(
            torch.ops.pycudnn.conv_bn_train_grad, (dy, saved, CONV, params, "relu", flags)
        )


@pytest.mark.usefixtures("bn_act")
@pytest.mark.parametrize("residual", [False, True], ids=["bn_relu", "bn_add_relu"])
def test_traced_training_node_equals_the_eager_one(residual):
    """The training node's traced form (the ops compile traces) against its eager one: output,
    gradients of the input, weight, scale, shift and residual, and the running statistics."""
    got = []
    for traced in (False, True):
        x, w, gamma, beta, z, rm, rv = _block_args(residual)
        leaves = [t.requires_grad_() for t in (x, w, gamma, beta) + ((z,) if residual else ())]
        if traced:
            lists = (CONV, [1e-5, 0.1, 0.0], "relu")
            y = fused_train.TrainFn.apply(x, w, None, gamma, beta, z, rm, rv, None, lists)
        else:
            blk = fused_train.TrainBlock(fused_train.cfg_of(CONV), 1e-5, 0.1, ("relu", 0.0), set())
            y = fused_train.train_block(x, w, None, gamma, beta, z, (rm, rv), blk)
        y.backward(torch.ones_like(y))
        got.append([y, rm, rv, *(t.grad for t in leaves)])
    for a, b in zip(*got, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.usefixtures("bn_act")
def test_compiled_training_traces_the_training_ops():
    """Dynamo traces the training node as the two custom ops, with eager's results."""
    ref, mine = _pair(Bottleneck)
    x = torch.randn(2, 8, 8, 8).double().to(memory_format=torch.channels_last)
    seen = []

    def backend(gm, inputs):
        for m in gm.modules():  # autograd.Function bodies are subgraphs (fwd_body_0, ...)
            if isinstance(m, torch.fx.GraphModule):
                seen.extend(str(n.target) for n in m.graph.nodes)
        return gm.forward

    _same_step(ref, mine, x, torch.compile(mine, backend=backend))
    assert sum("conv_bn_train.default" in t for t in seen) == 3, seen
    assert sum("conv_bn_train_grad" in t for t in seen) == 3, seen


@pytest.mark.usefixtures("fakes")
def test_training_with_hooks_or_gelu_runs_the_modules():
    ref, mine = _pair(lambda: ConvBNAct(nn.GELU()))
    x = torch.randn(2, 3, 8, 8).double().requires_grad_()
    assert type(mine(x).grad_fn).__name__ != "TrainFnBackward"  # GELU's backward needs its input
    ref, mine = _pair(lambda: ConvBNAct(nn.ReLU()))
    seen = []
    mine.bn.register_forward_hook(lambda m, i, o: seen.append(1))
    torch.testing.assert_close(mine(x), ref(x), rtol=1e-9, atol=1e-9)
    assert seen == [1]


@pytest.mark.usefixtures("fakes")
def test_fold_follows_in_place_changes():
    ref, mine = _pair(lambda: ConvBNAct(nn.ReLU()))
    ref.eval()
    mine.eval()
    x = torch.randn(2, 3, 5, 5).double()
    with torch.no_grad():
        mine(x)
        for m in (ref, mine):
            m.bn.running_mean.add_(0.25)
            m.conv.weight.mul_(1.5)
        torch.testing.assert_close(mine(x), ref(x), rtol=1e-9, atol=1e-9)


@pytest.mark.usefixtures("fakes")
def test_eval_with_a_gradient_runs_unfused():
    ref, mine = _pair(lambda: ConvBNAct(nn.ReLU()))
    ref.eval()
    mine.eval()
    x = torch.randn(2, 3, 5, 5).double().requires_grad_()
    torch.testing.assert_close(mine(x), ref(x), rtol=1e-9, atol=1e-9)
    assert [c for c in CALLS if c[0] == "conv"] == [("conv", None, False)]


@pytest.mark.usefixtures("fakes")
def test_linear_act_fused_without_grad_unfused_with():
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(8, 6), nn.GELU(), nn.Linear(6, 4), nn.SiLU())
    mine = pt.convert(copy.deepcopy(ref), fuse=True)
    assert [r.pattern for _, r in fuse.fusions(mine)] == ["linear_act", "linear_act"]
    x = torch.randn(3, 2, 8)
    with pycudnn.config.override(allow_tf32=True):
        with torch.no_grad():
            got = mine(x)
        assert CALLS == [("matmul", "gelu"), ("matmul", "silu")]
        torch.testing.assert_close(got, ref(x), rtol=1e-5, atol=1e-5)
        CALLS.clear()
        xm, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
        ym, yr = mine(xm), ref(xr)
        assert [c for c in CALLS if c[0] == "matmul"] == [("matmul", None), ("matmul", None)]
        ym.sum().backward()
        yr.sum().backward()
    torch.testing.assert_close(ym, yr, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xm.grad, xr.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("fakes")
def test_float64_linear_falls_back():
    ref = nn.Sequential(nn.Linear(4, 3), nn.ReLU()).double()
    mine = pt.convert(copy.deepcopy(ref), fuse=True)
    x = torch.randn(2, 4).double()
    with torch.no_grad():
        torch.testing.assert_close(mine(x), ref(x))
    assert not CALLS


def test_add_helper_keeps_operand_order():
    add = fused.Add("call_function", operator.sub, bn_first=False)
    assert add(torch.tensor(1.0), torch.tensor(3.0)) == 2.0


def test_the_reserve_sizes_are_a_registry_cache(monkeypatch):
    """The fused batch norm's reserve sizes (a cache that grows with the input shapes): asked
    once per signature, refusals remembered too, bounded by the configured size and emptied by
    ``pycudnn.clear_caches()`` (issue 39, item 2)."""
    asked = []

    def size(shape, dtype, residual=False, device=None):
        asked.append(shape)
        if shape[0] == 3:
            raise pycudnn.errors.NotSupportedError(9, "batch_normalization_act_reserve_size")
        return 64

    monkeypatch.setattr(batchnorm, "batch_normalization_act_reserve_size", size)
    monkeypatch.setattr(batchnorm, "_RESERVE", _plans.host_cache("test_reserve_sizes", 4))
    batchnorm._RESERVE.clear()
    for _ in range(2):
        assert batchnorm.reserve_bytes((2, 8, 4, 4), torch.float16, 0, False) == 64
        assert batchnorm.reserve_bytes((3, 8, 4, 4), torch.float16, 0, False) is None
    assert asked == [(2, 8, 4, 4), (3, 8, 4, 4)]
    for n in range(4, 10):
        batchnorm.reserve_bytes((n, 8, 4, 4), torch.float16, 0, False)
    assert len(batchnorm._RESERVE.data) == 4
    assert pycudnn.highlevel.conv.cache_info().host_entries >= 4
    pycudnn.clear_caches()
    assert not batchnorm._RESERVE.data
    batchnorm.reserve_bytes((2, 8, 4, 4), torch.float16, 0, False)
    assert asked.count((2, 8, 4, 4)) == 2
