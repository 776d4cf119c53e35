"""GPU tests of the PyTorch adapter ``pycudnn.torch`` (marker ``gpu``; skipped without a device
or without torch).

Run on the GPU machine:
``PYTHONPATH=. python3 -m pytest -m gpu -q tests/torch_adapter/test_torch_adapter_gpu.py``.

Every converted module against its ``torch.nn`` twin (a deep copy, so the same parameters): the
forward, the input and parameter gradients and the running statistics, in float32 (TF32 off on
both sides) and in float16/bfloat16/float64 where cuDNN takes them; ``torch.autograd.gradcheck``
in float64 on tiny shapes (inputs and parameters, through ``torch.func.functional_call``);
``state_dict`` round trips; then the adapter's contract with torch: torch's current stream,
memory through torch's caching allocator (``torch.cuda.memory_allocated`` sees it, pycudnn's own
cache stays unused), ``torch.no_grad``, CUDA-graph capture and replay of a forward+backward, and
two real trainings on scikit-learn's bundled digits (a CNN and an LSTM reading the rows as a
sequence), each run with ``torch.nn`` and with its converted twin from the same seed: the loss
curves agree (0.1 at every step, 0.02 on 10-step running means) and both reach the same accuracy
band (at least 0.93 on the 297 held-out digits, within 0.03 of each other). One summary line
per training is printed (``TRAIN cnn ...``, ``TRAIN lstm ...``; run with ``-s`` to see them).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import torch_gpu  # noqa: E402  (tests/support)

import pycudnn  # noqa: E402  (torch first: both then use the same libcudnn)
import pycudnn.torch as pt  # noqa: E402
from pycudnn import memory  # noqa: E402

pytestmark = pytest.mark.gpu

DEV = "cuda"
TOL = {torch.float16: 1e-2, torch.bfloat16: 4e-2, torch.float32: 2e-4, torch.float64: 1e-10}


@pytest.fixture(autouse=True)
def _exact_math():
    with torch_gpu.exact_math():
        yield


def _close(got, want, dtype, what):
    """``max |got - want| <= tol * max(1, max |want|)`` (NaN fails)."""
    assert got.shape == want.shape, (what, got.shape, want.shape)
    g, w = got.detach().double(), want.detach().double()
    err = (g - w).abs().max().item() if g.numel() else 0.0
    scale = max(1.0, w.abs().max().item() if w.numel() else 0.0)
    assert err <= TOL[dtype] * scale, f"{what}: max error {err:.3g} (scale {scale:.3g})"


def _distinct(shape, dtype):
    """Values distinct within the tensor and exact in *dtype* (no ties for max pooling)."""
    n = int(np.prod(shape))
    vals = torch.randperm(n, device=DEV).to(torch.float64) / n * 4 - 2
    step = {torch.float16: 2**-8, torch.bfloat16: 2**-7}.get(dtype, 2**-20)  # exact steps
    assert 4 / n >= step, "too many elements for distinct values"
    return (torch.round(vals / step) * step).reshape(shape).to(dtype)


def _twin(ref):
    """A converted deep copy of *ref* (strict: every module must convert)."""
    mine = pt.convert(copy.deepcopy(ref), strict=True)
    converted = [m for m in mine.modules() if type(m) in set(pt.supported_modules().values())]
    assert converted, "nothing was converted"
    return mine


def _check_module(ref, x, dtype, *, eval_mode=False, inplace_input=False):
    """Forward, gradients of the input and every parameter, the buffers afterwards, and the
    state_dict of the twin loaded back into a torch module."""
    ref = ref.to(DEV, dtype)
    if eval_mode:
        ref.eval()
    mine = _twin(ref)
    x = x.to(DEV, dtype)
    xr, xm = x.clone().requires_grad_(), x.clone().requires_grad_()
    yr = ref(xr * 1 if inplace_input else xr)
    ym = mine(xm * 1 if inplace_input else xm)
    yr = yr[0] if isinstance(yr, tuple) else yr
    ym = ym[0] if isinstance(ym, tuple) else ym
    _close(ym, yr, dtype, f"{type(ref).__name__} forward")
    dy = torch.randn_like(yr)
    yr.backward(dy)
    ym.backward(dy)
    _close(xm.grad, xr.grad, dtype, f"{type(ref).__name__} input grad")
    for (name, pr), (_, pm) in zip(ref.named_parameters(), mine.named_parameters(), strict=True):
        _close(pm.grad, pr.grad, dtype, f"{type(ref).__name__} grad of {name}")
    for (name, br), (_, bm) in zip(ref.named_buffers(), mine.named_buffers(), strict=True):
        _close(bm.to(br.dtype), br, dtype, f"{type(ref).__name__} buffer {name}")
    sd = mine.state_dict()
    assert list(sd) == list(ref.state_dict())
    back = copy.deepcopy(ref)
    back.load_state_dict(sd)
    for k, v in back.state_dict().items():
        assert torch.equal(v, sd[k]), k


# ==================================================================================================
# Every module against its torch.nn twin
# ==================================================================================================
CONVS = [
    ("conv1d", lambda: nn.Conv1d(3, 4, 3, stride=2, padding=1, dilation=2), (2, 3, 11)),
    ("conv1d-groups", lambda: nn.Conv1d(4, 6, 3, padding="same", groups=2, bias=False), (2, 4, 9)),
    ("conv2d", lambda: nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2), (2, 4, 9, 9)),
    (
        "conv2d-dil-same",
        lambda: nn.Conv2d(3, 5, (3, 1), padding="same", dilation=(2, 1)),
        (2, 3, 8, 7),
    ),
    ("conv2d-depthwise", lambda: nn.Conv2d(4, 4, 3, padding=1, groups=4), (2, 4, 6, 6)),
    ("conv3d", lambda: nn.Conv3d(2, 4, 3, stride=(1, 2, 2), padding=1), (2, 2, 5, 6, 6)),
]


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.float64], ids=["fp32", "fp16", "fp64"]
)
@pytest.mark.parametrize(("name", "make", "shape"), CONVS, ids=[c[0] for c in CONVS])
def test_conv_matches_torch(name, make, shape, dtype):
    torch.manual_seed(0)
    _check_module(make(), torch.randn(shape), dtype)


def test_conv2d_bf16_channels_last_matches_torch():
    torch.manual_seed(0)
    ref = nn.Conv2d(8, 16, 3, padding=1).to(DEV, torch.bfloat16, memory_format=torch.channels_last)
    mine = _twin(ref)
    x = torch.randn(4, 8, 10, 10, device=DEV, dtype=torch.bfloat16)
    x = x.contiguous(memory_format=torch.channels_last)
    _close(mine(x), ref(x), torch.bfloat16, "channels-last bf16 conv")
    x1 = x.clone().requires_grad_()
    x2 = x.clone().requires_grad_()
    ref(x1).float().square().sum().backward()
    mine(x2).float().square().sum().backward()
    _close(x2.grad, x1.grad, torch.bfloat16, "channels-last input grad")
    _close(mine.weight.grad, ref.weight.grad, torch.bfloat16, "channels-last weight grad")


def test_unbatched_conv_and_pool():
    torch.manual_seed(0)
    conv, pool = nn.Conv2d(3, 4, 3).to(DEV), nn.MaxPool2d(2).to(DEV)
    x = torch.randn(3, 8, 8, device=DEV)
    _close(_twin(conv)(x), conv(x), torch.float32, "unbatched conv")
    _close(_twin(pool)(x), pool(x), torch.float32, "unbatched pool")


POOLS = [
    ("max2d", lambda: nn.MaxPool2d(3, stride=2, padding=1), (2, 3, 9, 9)),
    ("max2d-default-stride", lambda: nn.MaxPool2d(2), (2, 3, 8, 8)),
    ("max3d", lambda: nn.MaxPool3d(2), (2, 2, 4, 4, 4)),
    ("avg2d-inc", lambda: nn.AvgPool2d(3, stride=2, padding=1), (2, 3, 9, 9)),
    (
        "avg2d-exc",
        lambda: nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False),
        (2, 3, 7, 7),
    ),
    ("avg3d", lambda: nn.AvgPool3d(2, stride=1), (2, 2, 4, 4, 4)),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("name", "make", "shape"), POOLS, ids=[p[0] for p in POOLS])
def test_pool_matches_torch(name, make, shape, dtype):
    torch.manual_seed(0)
    _check_module(make(), _distinct(shape, dtype), dtype)


BNS = [
    ("bn1d-2d", lambda: nn.BatchNorm1d(5), (8, 5)),
    ("bn1d-3d", lambda: nn.BatchNorm1d(5, momentum=0.3), (4, 5, 7)),
    ("bn2d", lambda: nn.BatchNorm2d(5), (4, 5, 6, 6)),
    ("bn2d-cma", lambda: nn.BatchNorm2d(5, momentum=None), (4, 5, 6, 6)),
    ("bn2d-noaffine", lambda: nn.BatchNorm2d(5, affine=False), (4, 5, 6, 6)),
    ("bn2d-nostats", lambda: nn.BatchNorm2d(5, track_running_stats=False), (4, 5, 6, 6)),
    ("bn3d", lambda: nn.BatchNorm3d(3, eps=1e-3), (2, 3, 3, 4, 4)),
]


@pytest.mark.parametrize("eval_mode", [False, True], ids=["train", "eval"])
@pytest.mark.parametrize(("name", "make", "shape"), BNS, ids=[b[0] for b in BNS])
def test_batchnorm_matches_torch(name, make, shape, eval_mode):
    torch.manual_seed(0)
    ref = make()
    with torch.no_grad():  # non-trivial parameters and statistics
        for t in (*ref.parameters(), *(b for b in ref.buffers() if b.is_floating_point())):
            t.copy_(torch.rand_like(t) + 0.5)
    _check_module(ref, torch.randn(shape) * 2 + 0.3, torch.float32, eval_mode=eval_mode)


def test_batchnorm_two_steps_and_half_precision():
    """Running statistics over two training steps, then eval; float16 data with float32
    parameters (cuDNN's rule) and with float16 parameters (cast by the adapter)."""
    torch.manual_seed(0)
    for data, params in (
        (torch.float32, torch.float32),
        (torch.float16, torch.float32),
        (torch.float16, torch.float16),
    ):
        ref = nn.BatchNorm2d(6, momentum=0.2).to(DEV, params)
        mine = _twin(ref)
        for _ in range(2):
            x = torch.randn(4, 6, 5, 5, device=DEV, dtype=data) * 3 + 1
            _close(mine(x), ref(x), data, f"bn train {data}/{params}")
        for b in ("running_mean", "running_var", "num_batches_tracked"):
            _close(getattr(mine, b).double(), getattr(ref, b).double(), data, b)
        ref.eval()
        mine.eval()
        x = torch.randn(4, 6, 5, 5, device=DEV, dtype=data)
        _close(mine(x), ref(x), data, f"bn eval {data}/{params}")


ACTS = [
    ("relu", lambda: nn.ReLU()),
    ("relu-inplace", lambda: nn.ReLU(inplace=True)),
    ("sigmoid", lambda: nn.Sigmoid()),
    ("tanh", lambda: nn.Tanh()),
    ("elu", lambda: nn.ELU(0.7)),
    ("silu", lambda: nn.SiLU()),
    ("hardtanh", lambda: nn.Hardtanh(0.0, 2.0)),
    ("relu6", lambda: nn.ReLU6(inplace=True)),
    ("softmax", lambda: nn.Softmax(dim=1)),
    ("logsoftmax", lambda: nn.LogSoftmax(dim=1)),
    ("lrn", lambda: nn.LocalResponseNorm(5, alpha=1e-2, beta=0.75, k=2.0)),
    ("lrn-3", lambda: nn.LocalResponseNorm(3, alpha=1e-3, beta=0.5, k=1.0)),
]


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.float64], ids=["fp32", "fp16", "fp64"]
)
@pytest.mark.parametrize("shape", [(4, 8), (2, 8, 5, 5)], ids=["2d", "4d"])
@pytest.mark.parametrize(("name", "make"), ACTS, ids=[a[0] for a in ACTS])
def test_activation_softmax_lrn_match_torch(name, make, shape, dtype):
    if name.startswith("lrn") and len(shape) == 2:
        pytest.skip("LocalResponseNorm takes 3-D and larger inputs")
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=torch.float64) * 3
    for kink in (0.0, 2.0, 6.0):  # away from where the derivative jumps (ties in rounding)
        x = torch.where((x - kink).abs() < 0.02, x + 0.05, x)
    _check_module(make(), x, dtype, inplace_input="inplace" in name or name == "relu6")


def test_softmax_5d_and_bf16():
    torch.manual_seed(0)
    _check_module(nn.Softmax(dim=1), torch.randn(2, 4, 3, 3, 3), torch.float32)
    _check_module(nn.LogSoftmax(dim=1), torch.randn(3, 10), torch.bfloat16)


def test_dropout_masks_scale_and_gradient():
    torch.manual_seed(0)
    p = 0.3
    drop = pt.Dropout(p).to(DEV)
    x = (torch.rand(64, 256, device=DEV) + 1).requires_grad_()
    y = drop(x)
    kept = y != 0
    frac = 1 - kept.float().mean().item()
    assert abs(frac - p) < 0.02, frac
    torch.testing.assert_close(y[kept], (x / (1 - p))[kept])
    dy = torch.randn_like(y)
    y.backward(dy)
    torch.testing.assert_close(x.grad, dy * kept / (1 - p))
    y2 = drop(x)  # a new mask
    assert not torch.equal(y2 != 0, kept)
    drop.eval()
    assert drop(x) is x
    drop.train()
    xb = x.detach().to(torch.bfloat16)  # cuDNN has no bfloat16 dropout: torch's runs
    assert drop(xb).dtype == torch.bfloat16


def test_dropout_twice_before_backward_and_inplace():
    """Two forwards of one module before one backward: each keeps its own mask."""
    drop = pt.Dropout(0.5).to(DEV)
    a = (torch.rand(1000, device=DEV) + 1).requires_grad_()
    ya, yb = drop(a), drop(a * 1)
    (ya.sum() + 2 * yb.sum()).backward()
    torch.testing.assert_close(a.grad, ((ya != 0) + 2 * (yb != 0)) / 0.5)
    ip = pt.Dropout(0.5, inplace=True).to(DEV)
    b = torch.rand(1000, device=DEV) + 1
    out = ip(b)
    assert out.data_ptr() == b.data_ptr() and (b == 0).any()


RNNS = [
    ("lstm", lambda: nn.LSTM(6, 8, 2), True),
    ("lstm-proj-bi", lambda: nn.LSTM(6, 8, proj_size=4, bidirectional=True), True),
    ("lstm-batch-first-nobias", lambda: nn.LSTM(6, 8, batch_first=True, bias=False), False),
    ("gru-bi", lambda: nn.GRU(6, 8, bidirectional=True), True),
    ("gru-2", lambda: nn.GRU(6, 8, 2, batch_first=True), False),
    ("rnn-relu", lambda: nn.RNN(6, 8, nonlinearity="relu"), True),
    ("rnn-tanh", lambda: nn.RNN(6, 8, 2), False),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize(("name", "make", "with_state"), RNNS, ids=[r[0] for r in RNNS])
def test_rnn_matches_torch(name, make, with_state, dtype):
    torch.manual_seed(0)
    ref = make().to(DEV, dtype)
    mine = _twin(ref)
    x = torch.randn(5, 3, 6, device=DEV, dtype=dtype)  # (T, N) or (N, T) with batch_first
    lstm = isinstance(ref, nn.LSTM)
    states = None
    leaves = []
    if with_state:
        nl = ref.num_layers * (2 if ref.bidirectional else 1)
        n = x.shape[0] if ref.batch_first else x.shape[1]
        h0 = torch.randn(nl, n, ref.proj_size or ref.hidden_size, device=DEV, dtype=dtype)
        c0 = torch.randn(nl, n, ref.hidden_size, device=DEV, dtype=dtype)
        leaves = [h0, c0] if lstm else [h0]
    outs = {}
    for tag, m in (("ref", ref), ("mine", mine)):
        xi = x.clone().requires_grad_()
        st = [t.clone().requires_grad_() for t in leaves]
        states = (tuple(st) if lstm else st[0]) if st else None
        y, hid = m(xi, states)
        hy, cy = hid if lstm else (hid, None)
        loss = (y * torch.linspace(-1, 1, y.numel(), device=DEV, dtype=dtype).view(y.shape)).sum()
        loss = loss + hy.square().sum() + (cy.sum() if cy is not None else 0)
        loss.backward()
        outs[tag] = (y, hy, cy, xi.grad, [s.grad for s in st], [p.grad for p in m.parameters()])
    r, g = outs["ref"], outs["mine"]
    for i, what in enumerate(("y", "hy", "cy", "dx")):
        if r[i] is not None:
            _close(g[i], r[i], dtype, f"{name} {what}")
    for a, b in zip(g[4], r[4], strict=True):
        _close(a, b, dtype, f"{name} d(initial state)")
    for (pname, _), a, b in zip(ref.named_parameters(), g[5], r[5], strict=True):
        _close(a, b, dtype, f"{name} grad of {pname}")


def test_rnn_two_forwards_before_backward_unbatched_and_no_grad():
    torch.manual_seed(0)
    ref = nn.LSTM(4, 5).to(DEV)
    mine = _twin(ref)
    x1, x2 = torch.randn(6, 2, 4, device=DEV), torch.randn(3, 2, 4, device=DEV)
    for m in (ref, mine):
        (m(x1)[0].sum() + m(x2)[0].square().sum() + m(x1)[0].mean()).backward()
    for (n, a), b in zip(mine.named_parameters(), ref.parameters(), strict=True):
        _close(a.grad, b.grad, torch.float32, f"recomputed reserve: grad of {n}")
    xu = torch.randn(6, 4, device=DEV)  # unbatched (T, F)
    _close(mine(xu)[0], ref(xu)[0], torch.float32, "unbatched y")
    with torch.no_grad():
        y = mine(x1)[0]
    assert not y.requires_grad
    _close(y, ref(x1)[0], torch.float32, "no_grad y")
    drop = _twin(nn.LSTM(4, 5, 2, dropout=0.5).to(DEV))
    drop(x1)[0].sum().backward()  # training with dropout runs (masks differ from torch's)
    assert all(p.grad is not None for p in drop.parameters())


# ==================================================================================================
# gradcheck in float64
# ==================================================================================================
GRADCHECK = [
    ("conv1d", lambda: nn.Conv1d(2, 3, 3, stride=2, padding=1, dilation=1), (2, 2, 7)),
    ("conv2d", lambda: nn.Conv2d(4, 4, 3, stride=2, padding=1, dilation=1, groups=2), (2, 4, 5, 5)),
    ("conv2d-dil", lambda: nn.Conv2d(2, 2, 2, dilation=2, bias=False), (1, 2, 5, 5)),
    ("conv3d", lambda: nn.Conv3d(1, 2, 2, padding=1), (1, 1, 3, 3, 3)),
    ("maxpool2d", lambda: nn.MaxPool2d(2, stride=1, padding=1), (1, 2, 4, 4)),
    (
        "avgpool2d",
        lambda: nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False),
        (1, 2, 5, 5),
    ),
    ("avgpool3d", lambda: nn.AvgPool3d(2), (1, 1, 4, 4, 4)),
    ("bn2d", lambda: nn.BatchNorm2d(3), (3, 3, 2, 2)),
    ("bn1d", lambda: nn.BatchNorm1d(3), (5, 3)),
    ("sigmoid", lambda: nn.Sigmoid(), (2, 3, 2, 2)),
    ("tanh", lambda: nn.Tanh(), (2, 3, 2, 2)),
    ("elu", lambda: nn.ELU(0.5), (2, 3, 2, 2)),
    ("silu", lambda: nn.SiLU(), (2, 3, 2, 2)),
    ("relu", lambda: nn.ReLU(), (2, 3, 2, 2)),
    ("softmax", lambda: nn.Softmax(1), (3, 4)),
    ("logsoftmax", lambda: nn.LogSoftmax(1), (2, 4, 2, 2)),
    ("lrn", lambda: nn.LocalResponseNorm(3, alpha=0.1, beta=0.75, k=1.0), (1, 4, 2, 2)),
    ("lstm", lambda: nn.LSTM(3, 2), (4, 2, 3)),
    ("gru", lambda: nn.GRU(3, 2, bidirectional=True), (3, 2, 3)),
    ("rnn", lambda: nn.RNN(3, 2), (3, 2, 3)),
]


@pytest.mark.parametrize(("name", "make", "shape"), GRADCHECK, ids=[g[0] for g in GRADCHECK])
def test_gradcheck_float64(name, make, shape):
    torch.manual_seed(0)
    mine = _twin(make().to(DEV, torch.float64))
    if name == "maxpool2d":
        x = _distinct(shape, torch.float64)
    elif name == "relu":  # away from the kink
        x = torch.randn(shape, device=DEV, dtype=torch.float64)
        x = x + 0.1 * torch.sign(x)
    else:
        x = torch.randn(shape, device=DEV, dtype=torch.float64)
    names = [n for n, _ in mine.named_parameters()]
    params = [p.detach().clone().requires_grad_() for p in mine.parameters()]

    def f(inp, *ps):
        out = torch.func.functional_call(mine, dict(zip(names, ps, strict=True)), (inp,))
        return out[0] if isinstance(out, tuple) else out

    assert torch.autograd.gradcheck(f, (x.requires_grad_(), *params), nondet_tol=1e-10)


# ==================================================================================================
# The contract with torch: stream, memory, no_grad, graphs
# ==================================================================================================
def _small_cnn(classes=10):
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 2 * 2, classes),
    )


def test_runs_on_torchs_current_stream():
    torch.manual_seed(0)
    ref = _small_cnn().to(DEV)
    mine = _twin(ref)
    x = torch.randn(16, 1, 8, 8, device=DEV)
    want = ref(x)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        got = mine(x)
        got.sum().backward()
        assert pycudnn.get_handle().stream == s.cuda_stream
    torch.cuda.current_stream().wait_stream(s)
    _close(got, want, torch.float32, "on a side stream")


def test_memory_goes_through_torchs_allocator():
    torch.manual_seed(0)
    model = _twin(_small_cnn().to(DEV))
    x = torch.randn(64, 1, 8, 8, device=DEV)
    model(x).sum().backward()  # warm: plans, workspaces
    before = memory.cache_stats()
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()
    y = model(x)
    assert torch.cuda.memory_allocated() > allocated  # outputs and saved tensors: torch's
    y.sum().backward()
    after = memory.cache_stats()
    assert (after["misses"], after["hits"]) == (before["misses"], before["hits"])
    assert after["used_bytes"] == before["used_bytes"]
    a = memory.empty((1 << 20,), np.uint8)  # any pycudnn allocation now
    grown = torch.cuda.memory_allocated()
    del a
    assert torch.cuda.memory_allocated() == grown - (1 << 20)
    b = memory.empty((3, 4), np.float32)
    t = pt.to_torch(b)
    assert t.data_ptr() == b.ptr and t.shape == (3, 4) and t.dtype == torch.float32
    # a workspace made now (a new stream: none exists for it) is pycudnn's own cudaMalloc, not
    # torch memory: it outlives the call, which torch's CUDA-graph pools refuse
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    h = pycudnn.get_handle()
    with torch.cuda.stream(s):
        big = _twin(nn.Conv2d(64, 64, 3, padding=1).to(DEV))
        big(torch.randn(32, 64, 28, 28, device=DEV))
        ws = h.workspace_size(s.cuda_stream)
    torch.cuda.current_stream().wait_stream(s)
    if ws:
        assert type(h._workspaces[s.cuda_stream]) is memory.allocator.Allocation


def test_no_grad_and_eval():
    torch.manual_seed(0)
    ref = _small_cnn().to(DEV).eval()
    mine = _twin(ref)
    x = torch.randn(8, 1, 8, 8, device=DEV)
    with torch.no_grad():
        got = mine(x)
    assert not got.requires_grad
    _close(got, ref(x), torch.float32, "no_grad eval")


def test_cuda_graph_capture_of_forward_and_backward():
    torch.manual_seed(0)
    model = _twin(_small_cnn().to(DEV))
    eager = copy.deepcopy(model)
    static_x = torch.randn(32, 1, 8, 8, device=DEV)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up (plans, workspaces, dropout-free)
        for _ in range(2):
            model.zero_grad(set_to_none=True)
            model(static_x).square().mean().backward()
    torch.cuda.current_stream().wait_stream(s)
    state = copy.deepcopy(model.state_dict())
    eager.load_state_dict(state)
    model.zero_grad(set_to_none=True)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = model(static_x)
        static_y.square().mean().backward()
    model.load_state_dict(state)  # capture queued no work: restore nothing, but be explicit
    new_x = torch.randn_like(static_x)
    static_x.copy_(new_x)
    g.replay()
    torch.cuda.synchronize()
    eager.zero_grad(set_to_none=True)
    want = eager(new_x)
    want.square().mean().backward()
    _close(static_y, want, torch.float32, "replayed forward")
    for (n, a), b in zip(model.named_parameters(), eager.parameters(), strict=True):
        _close(a.grad, b.grad, torch.float32, f"replayed grad of {n}")
    for (n, a), b in zip(model.named_buffers(), eager.buffers(), strict=True):
        _close(a.double(), b.double(), torch.float32, f"replayed buffer {n}")


# ==================================================================================================
# Training on scikit-learn's digits
# ==================================================================================================
def _digits():
    datasets = pytest.importorskip("sklearn.datasets")
    d = datasets.load_digits()
    x = torch.tensor(d.images / 16.0, dtype=torch.float32, device=DEV)
    y = torch.tensor(d.target, device=DEV)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0)).to(DEV)
    return x, y, perm[:1500], perm[1500:]


class _LSTMClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(8, 48, batch_first=True)
        self.fc = nn.Linear(48, 10)

    def forward(self, x):  # (N, 8 rows, 8 pixels): the rows are the sequence
        y, _ = self.rnn(x)
        return self.fc(y[:, -1])


def _train(model, data, steps, make_opt, image):
    x, y, train, test = data
    g = torch.Generator().manual_seed(1)
    batches = [
        train[torch.randint(0, len(train), (64,), generator=g).to(DEV)] for _ in range(steps)
    ]
    opt = make_opt(model.parameters())
    losses = []
    model.train()
    for idx in batches:
        xb = x[idx].unsqueeze(1) if image else x[idx]
        loss = F.cross_entropy(model(xb), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    model.eval()
    with torch.no_grad():
        xt = x[test].unsqueeze(1) if image else x[test]
        acc = (model(xt).argmax(1) == y[test]).float().mean().item()
    return torch.stack(losses).cpu().numpy(), acc


@pytest.mark.parametrize("which", ["cnn", "lstm"])
def test_training_on_digits_matches_torch(which):
    data = _digits()
    torch.manual_seed(0)
    if which == "cnn":
        ref = _small_cnn().to(DEV)
        steps, image = 120, True

        def opt(p):
            return torch.optim.SGD(p, lr=0.05, momentum=0.9)
    else:
        ref = _LSTMClassifier().to(DEV)
        steps, image = 200, False

        def opt(p):
            return torch.optim.Adam(p, lr=1e-2)

    mine = _twin(ref)
    lt, at = _train(ref, data, steps, opt, image)
    lp, ap = _train(mine, data, steps, opt, image)
    diff = np.abs(lt - lp)
    # two float32 trainings drift apart (1e-7 per op at first, then amplified by training): the
    # tolerance is on every step's loss (0.1) and on the 10-step running means (0.02)
    window = np.ones(10) / 10
    smooth = np.abs(np.convolve(lt, window, "valid") - np.convolve(lp, window, "valid"))
    print(
        f"TRAIN {which} steps={steps} torch_loss={lt[-1]:.4f} pycudnn_loss={lp[-1]:.4f} "
        f"torch_acc={at:.4f} pycudnn_acc={ap:.4f} max_loss_diff={diff.max():.2e} "
        f"max_mean10_diff={smooth.max():.2e} first_loss={lt[0]:.4f}"
    )
    assert np.isfinite(lp).all()
    assert diff.max() <= 0.1, f"losses differ by {diff.max():.3g} at step {diff.argmax()}"
    assert smooth.max() <= 0.02, f"running means differ by {smooth.max():.3g}"
    assert at >= 0.93 and ap >= 0.93, (at, ap)
    assert abs(at - ap) <= 0.03, (at, ap)


# ==================================================================================================
# bfloat16 channels-last, as in a ResNet training step (float32 batch-norm parameters)
# ==================================================================================================
def _rel_l2(got, want):
    g, w = got.detach().double(), want.detach().double()
    return ((g - w).norm() / w.norm().clamp_min(1e-30)).item()


BF16_NHWC = [
    ("conv3x3", lambda: nn.Conv2d(32, 32, 3, padding=1, bias=False)),
    ("bn2d", lambda: nn.BatchNorm2d(32)),
    ("relu-inplace", lambda: nn.ReLU(inplace=True)),
    ("maxpool", lambda: nn.MaxPool2d(3, 2, 1)),
    (
        "bottleneck",
        lambda: nn.Sequential(
            nn.Conv2d(32, 16, 1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(inplace=True),
            nn.Conv2d(16, 16, 3, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(inplace=True),
            nn.Conv2d(16, 32, 1, bias=False),
            nn.BatchNorm2d(32),
        ),
    ),
]


@pytest.mark.parametrize(("name", "make"), BF16_NHWC, ids=[b[0] for b in BF16_NHWC])
def test_bfloat16_channels_last_training_matches_torch(name, make):
    """Input and parameter gradients of bf16 NHWC modules (float32 batch-norm parameters, as
    torch's autocast-free bf16 ResNets keep them) against torch's, as relative L2 errors."""
    torch.manual_seed(0)
    ref = make().to(DEV, memory_format=torch.channels_last)
    for m in ref.modules():
        if not isinstance(m, nn.BatchNorm2d):
            for p in m.parameters(recurse=False):
                p.data = p.data.to(torch.bfloat16)
    mine = _twin(ref)
    x = torch.randn(8, 32, 14, 14, device=DEV, dtype=torch.bfloat16)
    x = x.contiguous(memory_format=torch.channels_last)
    xr, xm = x.clone().requires_grad_(), x.clone().requires_grad_()
    yr, ym = ref(xr * 1), mine(xm * 1)
    dy = torch.randn_like(yr)
    (yr.float() * dy.float()).sum().backward()
    (ym.float() * dy.float()).sum().backward()
    errs = {"y": _rel_l2(ym, yr), "dx": _rel_l2(xm.grad, xr.grad)}
    for (n, a), b in zip(mine.named_parameters(), ref.parameters(), strict=True):
        errs[n] = _rel_l2(a.grad, b.grad)
    print(f"\nBF16NHWC {name}: " + ", ".join(f"{k} {v:.1e}" for k, v in errs.items()))
    bad = {k: v for k, v in errs.items() if v > 3e-2}
    assert not bad, bad
