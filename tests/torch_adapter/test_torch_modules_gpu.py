"""GPU tests of the adapter's transposed convolutions and cross-entropy loss (marker ``gpu``;
skipped without a device or without torch).

Run on the GPU machine:
``PYTHONPATH=. python3 -m pytest -m gpu -q tests/torch_adapter/test_torch_modules_gpu.py``.

Each converted module against its ``torch.nn`` twin (a deep copy, so the same parameters): the
forward, the input gradient and the weight and bias gradients, in float32 (TF32 off on both
sides), float16 and bfloat16, from inputs drawn with a fixed seed. ``ConvTranspose`` with stride
2, padding 1 and ``output_padding`` 1, groups, dilation, ``output_size=``, 1-D, 3-D, unbatched
inputs and channels-last 2-D; ``CrossEntropyLoss`` on ``(N, C)`` and ``(N, C, H, W)`` logits
with targets hitting ``ignore_index``, class weights and the three reductions, and torch's own
forward for probability targets and ``label_smoothing``. Spies on the adapter's imports check
that pycudnn (not torch's fallback) ran.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import torch_gpu  # noqa: E402  (tests/support)

import pycudnn  # noqa: E402  (torch first: both then use the same libcudnn)
import pycudnn.torch as pt  # noqa: E402
from pycudnn.torch import conv, conv_transpose, loss  # noqa: E402

pytestmark = pytest.mark.gpu

DEV = "cuda"
TOL = {torch.float16: 1e-2, torch.bfloat16: 4e-2, torch.float32: 2e-4, torch.float64: 1e-10}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = ["fp32", "fp16", "bf16"]


@pytest.fixture(autouse=True)
def _exact_math():
    with torch_gpu.exact_math():
        yield


@pytest.fixture
def spy(monkeypatch):
    """The names of the pycudnn functions the adapter modules called (the real ones run; the
    transposed convolutions call conv.py's). The caches are emptied first: a call whose
    signature an earlier test bound is launched without the public function (the lean path)."""
    pycudnn.clear_caches()
    calls: list[str] = []
    for module in (conv, conv_transpose, loss):
        for name in dir(module):
            real = getattr(module, name)
            if name.startswith("dnn_") and callable(real):

                def wrapper(*args, _real=real, _name=name, **kwargs):
                    calls.append(_name)
                    return _real(*args, **kwargs)

                monkeypatch.setattr(module, name, wrapper)
    return calls


def _close(got, want, dtype, what):
    """``max |got - want| <= tol * max(1, max |want|)`` (NaN fails)."""
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
    g, w = got.detach().double(), want.detach().double()
    err = (g - w).abs().max().item() if g.numel() else 0.0
    scale = max(1.0, w.abs().max().item() if w.numel() else 0.0)
    assert err <= TOL[dtype] * scale, f"{what}: max error {err:.3g} (scale {scale:.3g})"


def _twin(ref):
    """A converted deep copy of *ref* (strict: it must convert)."""
    mine = pt.convert(copy.deepcopy(ref), strict=True)
    assert type(mine) is pt.supported_modules()[type(ref)]
    return mine


# ==================================================================================================
# Transposed convolutions
# ==================================================================================================
def _check_tconv(ref, x, dtype, spy, *, channels_last=False, **kw):
    """Forward (with *kw*, e.g. ``output_size=``), input, weight and bias gradients of the
    converted twin of *ref* against *ref*, and that cuDNN ran all three."""
    ref, x = ref.to(DEV, dtype), x.to(DEV, dtype)
    if channels_last:
        ref, x = ref.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
    mine = _twin(ref)
    xr, xm = x.clone().requires_grad_(), x.clone().requires_grad_()
    yr, ym = ref(xr, **kw), mine(xm, **kw)
    what = type(ref).__name__
    _close(ym, yr, dtype, f"{what} forward")
    if channels_last:
        assert ym.is_contiguous(memory_format=torch.channels_last), "output not channels-last"
    dy = torch.randn_like(yr)
    yr.backward(dy)
    ym.backward(dy)
    _close(xm.grad, xr.grad, dtype, f"{what} input grad")
    for (name, pr), (_, pm) in zip(ref.named_parameters(), mine.named_parameters(), strict=True):
        _close(pm.grad, pr.grad, dtype, f"{what} grad of {name}")
    three = "3d" if isinstance(ref, nn.ConvTranspose3d) else ""
    assert [f"dnn_gradinput{three}", f"dnn_conv{three}", f"dnn_gradweight{three}"] == spy


TCONVS = [
    (
        "2d-s2-p1-op1",
        lambda: nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1),
        (2, 4, 5, 5),
    ),
    ("2d-groups2", lambda: nn.ConvTranspose2d(4, 6, 3, padding=1, groups=2), (2, 4, 6, 6)),
    ("2d-dil2", lambda: nn.ConvTranspose2d(3, 4, 3, dilation=2, bias=False), (2, 3, 5, 5)),
    (
        "2d-all",
        lambda: nn.ConvTranspose2d(4, 8, (3, 2), stride=2, padding=1, groups=2, dilation=2),
        (2, 4, 5, 6),
    ),
    (
        "1d-s2-p1-op1",
        lambda: nn.ConvTranspose1d(3, 4, 3, stride=2, padding=1, output_padding=1),
        (2, 3, 9),
    ),
    (
        "3d-s2-p1-op1",
        lambda: nn.ConvTranspose3d(2, 4, 3, stride=(1, 2, 2), padding=1, output_padding=(0, 1, 1)),
        (2, 2, 3, 4, 4),
    ),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(("name", "make", "shape"), TCONVS, ids=[t[0] for t in TCONVS])
def test_conv_transpose_matches_torch(name, make, shape, dtype, spy):
    torch.manual_seed(0)
    _check_tconv(make(), torch.randn(shape), dtype, spy)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_conv_transpose2d_channels_last_matches_torch(dtype, spy):
    torch.manual_seed(0)
    ref = nn.ConvTranspose2d(8, 16, 3, stride=2, padding=1, output_padding=1)
    _check_tconv(ref, torch.randn(4, 8, 6, 6), dtype, spy, channels_last=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_conv_transpose_output_size_matches_torch(dtype, spy):
    torch.manual_seed(0)
    ref = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1)
    _check_tconv(ref, torch.randn(2, 4, 5, 5), dtype, spy, output_size=[10, 9])


@pytest.mark.parametrize(
    ("make", "shape", "kw"),
    [
        (lambda: nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1), (3, 5, 4), {}),
        (lambda: nn.ConvTranspose2d(3, 2, 3, stride=2), (3, 5, 4), {"output_size": (2, 12, 10)}),
        (lambda: nn.ConvTranspose1d(3, 2, 4, stride=3, groups=1), (3, 7), {}),
    ],
    ids=["2d", "2d-output-size", "1d"],
)
def test_conv_transpose_unbatched_matches_torch(make, shape, kw, spy):
    torch.manual_seed(0)
    _check_tconv(make(), torch.randn(shape), torch.float32, spy, **kw)


def test_conv_transpose_falls_back_for_what_cudnn_cannot_take(spy):
    """``output_padding`` not below the stride (torch pads past the last step), CPU tensors:
    torch's own forward, same results."""
    torch.manual_seed(0)
    ref = nn.ConvTranspose2d(2, 3, 3, dilation=2, output_padding=1).to(DEV)
    x = torch.randn(1, 2, 4, 4, device=DEV)
    _close(_twin(ref)(x), ref(x), torch.float32, "output_padding >= stride")
    cpu = nn.ConvTranspose2d(2, 3, 3, stride=2)
    _close(_twin(cpu)(x.cpu()), cpu(x.cpu()), torch.float32, "CPU")
    assert spy == []


def test_conv_transpose_under_autocast(spy):
    """The operands in autocast's dtype (torch's rule for the op): float16 out, float32 grads."""
    torch.manual_seed(0)
    ref = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1).to(DEV)
    mine = _twin(ref)
    x = torch.randn(2, 4, 5, 5, device=DEV)
    with torch.autocast("cuda", dtype=torch.float16):
        yr, ym = ref(x), mine(x)
    _close(ym, yr, torch.float16, "autocast forward")
    yr.float().square().sum().backward()
    ym.float().square().sum().backward()
    assert mine.weight.grad.dtype == torch.float32
    _close(mine.weight.grad, ref.weight.grad, torch.float16, "autocast weight grad")
    assert spy[0] == "dnn_gradinput"


# ==================================================================================================
# Cross-entropy
# ==================================================================================================
def _targets(shape, classes, ignore):
    t = torch.randint(0, classes, shape, device=DEV)
    t.view(-1)[::4] = ignore  # every fourth target ignored
    return t


def _check_loss(ref, x, target, dtype):
    """The loss and the input gradient of the converted twin of *ref* against *ref*."""
    mine = _twin(ref)
    xr, xm = x.clone().requires_grad_(), x.clone().requires_grad_()
    lr, lm = ref(xr, target), mine(xm, target)
    _close(lm, lr, dtype, f"loss {ref.reduction}")
    g = torch.rand_like(lr) + 0.5
    lr.backward(g)
    lm.backward(g)
    _close(xm.grad, xr.grad, dtype, f"loss {ref.reduction} input grad")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weights"])
@pytest.mark.parametrize("shape", [(16, 10), (4, 5, 6, 7)], ids=["NC", "NCHW"])
def test_cross_entropy_matches_torch(shape, weighted, reduction, dtype, spy):
    torch.manual_seed(0)
    c = shape[1]
    ignore = 3 if len(shape) == 2 else -100  # a class index, or torch's default
    w = torch.rand(c, device=DEV, dtype=dtype) + 0.5 if weighted else None
    ref = nn.CrossEntropyLoss(weight=w, ignore_index=ignore, reduction=reduction)
    x = (torch.randn(shape, device=DEV) * 3).to(dtype)
    _check_loss(ref, x, _targets(shape[:1] + shape[2:], c, ignore), dtype)
    assert spy == ["dnn_softmax"]


def test_cross_entropy_channels_last_and_5d(spy):
    torch.manual_seed(0)
    x = torch.randn(2, 6, 5, 7, device=DEV).contiguous(memory_format=torch.channels_last)
    _check_loss(nn.CrossEntropyLoss(), x, _targets((2, 5, 7), 6, -100), torch.float32)
    x5 = torch.randn(2, 4, 3, 5, 6, device=DEV)
    _check_loss(nn.CrossEntropyLoss(), x5, _targets((2, 3, 5, 6), 4, -100), torch.float32)
    assert spy == ["dnn_softmax", "dnn_softmax"]


def test_cross_entropy_probability_targets_and_label_smoothing_fall_back(spy):
    torch.manual_seed(0)
    x = torch.randn(8, 5, 3, 3, device=DEV)
    probs = torch.softmax(torch.randn(8, 5, 3, 3, device=DEV), 1)
    _check_loss(nn.CrossEntropyLoss(), x, probs, torch.float32)
    t = _targets((8, 3, 3), 5, -100)
    smooth = nn.CrossEntropyLoss(label_smoothing=0.1)
    with pytest.warns(UserWarning, match="label_smoothing=0.1"):
        kept = pt.convert(copy.deepcopy(smooth))
    assert type(kept) is nn.CrossEntropyLoss
    mine = _twin(nn.CrossEntropyLoss())
    mine.label_smoothing = 0.1  # set after conversion: the forward falls back
    _close(mine(x, t), smooth(x, t), torch.float32, "label smoothing")
    assert spy == []


def test_cross_entropy_under_autocast(spy):
    """Cross-entropy autocasts to float32: float16 logits give a float32 loss, float16 grads."""
    torch.manual_seed(0)
    x = torch.randn(6, 7, 4, device=DEV, dtype=torch.float16)
    t = _targets((6, 4), 7, -100)
    ref = nn.CrossEntropyLoss(weight=torch.rand(7, device=DEV) + 0.5)
    mine = _twin(ref)
    xr, xm = x.clone().requires_grad_(), x.clone().requires_grad_()
    with torch.autocast("cuda", dtype=torch.float16):
        lr, lm = ref(xr, t), mine(xm, t)
    _close(lm, lr, torch.float32, "autocast loss")
    lr.backward()
    lm.backward()
    _close(xm.grad, xr.grad, torch.float16, "autocast input grad")
    assert spy == ["dnn_softmax"]
