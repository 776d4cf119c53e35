"""The plumbing of the adapter's transposed convolutions and cross-entropy loss on the CPU:
pycudnn's functions replaced by torch computations behind their **real signatures** (each call
is bound to the real function's signature first, so a wrong argument name, order or count fails
here), CPU tensors let through as ``test_torch_adapter_fakes.py`` does.

What this proves without a GPU: ``ConvTransposeFn`` calls ``dnn_gradinput`` with the weight as
the filters, the input as the gradient and the full output shape (``output_padding`` and
``output_size=`` included), and its backward ``dnn_conv`` / ``dnn_gradweight`` with the roles of
image and gradient swapped; 1-D runs as 2-D, unbatched inputs, groups, dilation; the loss's
``dnn_softmax`` call and its closed-form gradient with ``ignore_index``, class weights and the
three reductions; what falls back to torch; ``convert`` and the rules. cuDNN's numbers are the
GPU tier's (``test_torch_modules_gpu.py``).
"""

from __future__ import annotations

import copy
import inspect

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from pycudnn import highlevel as hl  # noqa: E402
from pycudnn import torch as pt  # noqa: E402
from pycudnn.torch import _runtime, conv, conv_transpose, loss  # noqa: E402

CALLS: list[str] = []


def _bound(real, ranks):
    """The fake of *real*: the real signature's arguments, bound and defaulted; the first
    operand of one of *ranks*; ``out=`` and ``stream=`` always given (the adapter's rule)."""
    sig = inspect.signature(real)

    def deco(fake):
        def wrapper(*args, **kwargs):
            ba = sig.bind(*args, **kwargs)
            ba.apply_defaults()
            a = ba.arguments
            first = next(iter(a.values()))
            assert first.dim() in ranks, (real.__name__, first.shape)
            assert a["out"] is not None and a["stream"] == 0, real.__name__
            CALLS.append(real.__name__)
            return fake(**a)

        return wrapper

    return deco


def _out(out, r):
    assert out.shape == r.shape and out.dtype == r.dtype, (out.shape, r.shape)
    out.copy_(r)
    return out


def _conv(img, kerns, border_mode, subsample, dilation, conv_mode, num_groups, out, **_):
    assert conv_mode == "cross"
    f = F.conv2d if img.dim() == 4 else F.conv3d
    return _out(out, f(img, kerns, None, subsample, border_mode, dilation, num_groups))


def _gradinput(kerns, topgrad, img_shp, border_mode, subsample, dilation, num_groups, out, **_):
    g = torch.nn.grad.conv2d_input if topgrad.dim() == 4 else torch.nn.grad.conv3d_input
    assert tuple(img_shp) == tuple(out.shape)
    return _out(out, g(img_shp, kerns, topgrad, subsample, border_mode, dilation, num_groups))


def _gradweight(img, topgrad, kerns_shp, border_mode, subsample, dilation, num_groups, out, **_):
    g = torch.nn.grad.conv2d_weight if img.dim() == 4 else torch.nn.grad.conv3d_weight
    return _out(out, g(img, kerns_shp, topgrad, subsample, border_mode, dilation, num_groups))


def _softmax(x, algo, mode, out, **_):
    assert (algo, mode) == ("log", "channel") and 2 <= x.dim() <= 5
    return _out(out, torch.log_softmax(x, 1))


FAKES = {
    "dnn_conv": _bound(hl.dnn_conv, (4,))(_conv),
    "dnn_conv3d": _bound(hl.dnn_conv3d, (5,))(_conv),
    "dnn_gradinput": _bound(hl.dnn_gradinput, (4,))(_gradinput),
    "dnn_gradinput3d": _bound(hl.dnn_gradinput3d, (5,))(_gradinput),
    "dnn_gradweight": _bound(hl.dnn_gradweight, (4,))(_gradweight),
    "dnn_gradweight3d": _bound(hl.dnn_gradweight3d, (5,))(_gradweight),
    "dnn_softmax": _bound(hl.dnn_softmax, (2, 3, 4, 5))(_softmax),
}


@pytest.fixture(autouse=True)
def fakes(monkeypatch):
    for name, fake in FAKES.items():
        # the transposed convolutions run on the convolutions' calls (conv.py's names)
        where = [m for m in (conv, conv_transpose, loss) if hasattr(m, name)]
        assert where, f"no adapter module reads {name}"
        for module in where:
            monkeypatch.setattr(module, name, fake)
    for module in (conv_transpose, loss):
        monkeypatch.setattr(
            module,
            "cuda_ok",
            lambda x, dtypes=_runtime.FLOATS: (
                type(x) in (torch.Tensor, nn.Parameter) and x.dtype in dtypes
            ),
        )
    monkeypatch.setattr(_runtime, "raw_stream", lambda device: 0)
    monkeypatch.setattr(_runtime, "_AUTO", [False])  # no allocator to install on the CPU
    CALLS.clear()
    yield


def _grads(module, x, dy, **kw):
    """(y, dx, parameter grads) of *module* at *x* with output gradient *dy*."""
    x = x.clone().requires_grad_()
    y = module(x, **kw)
    y.backward(dy)
    return y, x.grad, [p.grad for p in module.parameters()]


# ==================================================================================================
# Transposed convolutions
# ==================================================================================================
TCONVS = [
    (
        "2d-stride-pad-outpad",
        lambda: nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1),
        (2, 4, 5, 5),
        {},
        "dnn_gradinput",
    ),
    (
        "2d-groups-dilation",
        lambda: nn.ConvTranspose2d(4, 6, (3, 2), groups=2, dilation=2, bias=False),
        (2, 4, 5, 6),
        {},
        "dnn_gradinput",
    ),
    (
        "2d-output-size",
        lambda: nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1),
        (2, 4, 5, 5),
        {"output_size": [10, 9]},
        "dnn_gradinput",
    ),
    (
        "2d-unbatched",
        lambda: nn.ConvTranspose2d(3, 2, 3, stride=(2, 1), padding=(1, 0)),
        (3, 4, 5),
        {"output_size": (2, 8, 7)},
        "dnn_gradinput",
    ),
    (
        "1d",
        lambda: nn.ConvTranspose1d(3, 4, 3, stride=2, padding=1, output_padding=1, dilation=2),
        (2, 3, 7),
        {},
        "dnn_gradinput",
    ),
    ("1d-unbatched", lambda: nn.ConvTranspose1d(3, 2, 4, stride=3), (3, 5), {}, "dnn_gradinput"),
    (
        "3d",
        lambda: nn.ConvTranspose3d(2, 4, 3, stride=(1, 2, 2), padding=1, output_padding=(0, 1, 1)),
        (2, 2, 3, 4, 4),
        {},
        "dnn_gradinput3d",
    ),
    (
        "3d-groups",
        lambda: nn.ConvTranspose3d(4, 2, 2, stride=2, groups=2),
        (1, 4, 2, 3, 2),
        {},
        "dnn_gradinput3d",
    ),
]


@pytest.mark.parametrize(
    ("name", "make", "shape", "kw", "first"), TCONVS, ids=[t[0] for t in TCONVS]
)
def test_conv_transpose_through_the_real_signatures(name, make, shape, kw, first):
    torch.manual_seed(0)
    ref = make().double()
    mine = pt.convert(copy.deepcopy(ref), strict=True)
    assert type(mine).__name__ == type(ref).__name__ and type(mine) is not type(ref)
    x = torch.randn(shape, dtype=torch.float64)
    with torch.no_grad():
        dy = torch.randn_like(ref(x, **kw))
    yr, dxr, dpr = _grads(ref, x, dy, **kw)
    ym, dxm, dpm = _grads(mine, x, dy, **kw)
    torch.testing.assert_close(ym, yr)
    torch.testing.assert_close(dxm, dxr)
    assert len(dpm) == len(dpr) == (1 if ref.bias is None else 2)
    for a, b in zip(dpm, dpr, strict=True):
        torch.testing.assert_close(a, b)
    three = "3d" if first.endswith("3d") else ""
    assert [first, f"dnn_conv{three}", f"dnn_gradweight{three}"] == CALLS


def test_conv_transpose_channels_last_output_and_no_weight_grad():
    torch.manual_seed(0)
    ref = nn.ConvTranspose2d(4, 4, 3, stride=2).double()
    mine = pt.convert(copy.deepcopy(ref))
    mine.weight.requires_grad_(False)
    x = torch.randn(2, 4, 5, 5, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    y = mine(x.requires_grad_())
    assert y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous()
    torch.testing.assert_close(y, ref(x))
    y.sum().backward()
    assert CALLS == ["dnn_gradinput", "dnn_conv"]  # no weight gradient asked
    assert mine.weight.grad is None and mine.bias.grad is not None


def test_conv_transpose_falls_back_where_cudnn_cannot_run():
    """``output_padding`` not below its stride (torch pads past the last step), and what torch
    refuses (a dtype other than the weight's, a wrong rank or channel count) run torch's
    forward."""
    torch.manual_seed(0)
    ref = nn.ConvTranspose2d(2, 3, 3, dilation=2, output_padding=1).double()
    mine = pt.convert(copy.deepcopy(ref))
    x = torch.randn(1, 2, 4, 4, dtype=torch.float64)
    torch.testing.assert_close(mine(x), ref(x))
    for bad in (x.float(), x[0, 0], x[:, :1]):  # torch's own errors
        with pytest.raises(RuntimeError):
            ref(bad)
        with pytest.raises(RuntimeError):
            mine(bad)
    assert CALLS == []


def test_conv_transpose_autocast_casts_the_operands(monkeypatch):
    """Under autocast the operands take its dtype first (torch's rule for the op)."""
    monkeypatch.setattr(conv_transpose, "autocast_dtype", lambda: torch.bfloat16)
    torch.manual_seed(0)
    ref = nn.ConvTranspose2d(3, 4, 3, padding=1)
    mine = pt.convert(copy.deepcopy(ref))
    x = torch.randn(2, 3, 5, 5)
    y = mine(x)
    assert y.dtype == torch.bfloat16 and CALLS == ["dnn_gradinput"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = ref(x)
    torch.testing.assert_close(y.float(), want.float(), rtol=2e-2, atol=2e-2)
    y.float().sum().backward()
    assert mine.weight.grad.dtype == torch.float32


# ==================================================================================================
# Cross-entropy
# ==================================================================================================
def _targets(shape, classes, ignore):
    t = torch.randint(0, classes, shape)
    t.view(-1)[::3] = ignore  # every third target ignored
    return t


LOSSES = [
    ("2d", (7, 5)),
    ("3d", (3, 5, 4)),
    ("4d", (2, 5, 3, 4)),
    ("5d", (2, 3, 2, 3, 2)),
]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weights"])
@pytest.mark.parametrize(("name", "shape"), LOSSES, ids=[s[0] for s in LOSSES])
def test_cross_entropy_through_the_real_signatures(name, shape, weighted, reduction):
    torch.manual_seed(0)
    c = shape[1]
    w = torch.rand(c, dtype=torch.float64) + 0.5 if weighted else None
    ignore = 1 if name == "3d" else -100  # an ignored class index, or torch's default
    ref = nn.CrossEntropyLoss(weight=w, ignore_index=ignore, reduction=reduction)
    mine = pt.convert(copy.deepcopy(ref), strict=True)
    assert type(mine) is pt.CrossEntropyLoss
    x = torch.randn(shape, dtype=torch.float64) * 3
    t = _targets(shape[:1] + shape[2:], c, ignore)
    xr, xm = x.clone().requires_grad_(), x.clone().requires_grad_()
    lr, lm = ref(xr, t), mine(xm, t)
    assert lm.shape == lr.shape and lm.dtype == lr.dtype
    torch.testing.assert_close(lm, lr)
    g = torch.randn_like(lr)
    lr.backward(g)
    lm.backward(g)
    torch.testing.assert_close(xm.grad, xr.grad)
    assert CALLS == ["dnn_softmax"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_entropy_channels_last_and_low_precision(dtype):
    torch.manual_seed(0)
    x = torch.randn(2, 6, 3, 5).to(dtype).contiguous(memory_format=torch.channels_last)
    t = torch.randint(0, 6, (2, 3, 5))
    mine = pt.CrossEntropyLoss()
    xr, xm = x.clone().requires_grad_(), x.clone().requires_grad_()
    want = F.cross_entropy(xr.double(), t)
    got = mine(xm, t)
    assert got.dtype == dtype and CALLS == ["dnn_softmax"]
    tol = 1e-6 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    want.backward()
    got.backward()
    assert xm.grad.dtype == dtype
    torch.testing.assert_close(xm.grad.double(), xr.grad.double(), rtol=tol, atol=tol)


def test_cross_entropy_all_ignored_mean_is_nan_as_torch():
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    t = torch.full((3,), -100)
    got = pt.CrossEntropyLoss()(x, t)
    want = F.cross_entropy(x, t)
    assert torch.isnan(got) and torch.isnan(want)
    assert CALLS == ["dnn_softmax"]


def test_cross_entropy_falls_back_to_torch():
    """Probability targets, label smoothing set after construction, unbatched inputs, int32
    targets (torch's error), a weight of another dtype: torch's forward, same results."""
    torch.manual_seed(0)
    mine = pt.CrossEntropyLoss()
    x = torch.randn(4, 5, dtype=torch.float64)
    probs = torch.softmax(torch.randn(4, 5, dtype=torch.float64), 1)
    torch.testing.assert_close(mine(x, probs), F.cross_entropy(x, probs))
    t = torch.randint(0, 5, (4,))
    mine.label_smoothing = 0.2
    torch.testing.assert_close(mine(x, t), F.cross_entropy(x, t, label_smoothing=0.2))
    mine.label_smoothing = 0.0
    torch.testing.assert_close(mine(x[0], t[0]), F.cross_entropy(x[0], t[0]))
    with pytest.raises(RuntimeError):
        mine(x, t.int())
    w = torch.rand(5)
    with pytest.raises(RuntimeError):
        F.cross_entropy(x, t, weight=w)  # torch refuses mixed dtypes: so does the twin
    with pytest.raises(RuntimeError):
        pt.CrossEntropyLoss(weight=w)(x, t)
    assert CALLS == []


def test_cross_entropy_autocast_computes_in_float32(monkeypatch):
    monkeypatch.setattr(loss, "autocast_dtype", lambda: torch.float16)
    torch.manual_seed(0)
    x = torch.randn(4, 3, 2, 2).half().requires_grad_()
    t = torch.randint(0, 3, (4, 2, 2))
    got = pt.CrossEntropyLoss(weight=torch.rand(3) + 0.5)(x, t)
    assert got.dtype == torch.float32 and CALLS == ["dnn_softmax"]
    got.backward()
    assert x.grad.dtype == torch.float16


def test_gradcheck_through_the_fakes():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 2, 2, dtype=torch.float64, requires_grad=True)
    t = torch.tensor([[[0, 2], [1, 1]], [[2, 2], [0, 1]]])
    w = torch.rand(3, dtype=torch.float64) + 0.5
    for reduction in ("mean", "sum", "none"):
        m = pt.CrossEntropyLoss(weight=w, ignore_index=1, reduction=reduction)
        assert torch.autograd.gradcheck(lambda inp, m=m: m(inp, t), (x,))
    m = pt.ConvTranspose2d(3, 2, 2, stride=2, padding=1, output_padding=1).double()
    names = [n for n, _ in m.named_parameters()]
    params = [p.detach().clone().requires_grad_() for p in m.parameters()]

    def f(inp, *ps):
        return torch.func.functional_call(m, dict(zip(names, ps, strict=True)), (inp,))

    assert torch.autograd.gradcheck(f, (x, *params))


# ==================================================================================================
# convert and the rules
# ==================================================================================================
def test_convert_swaps_both_and_back():
    model = nn.Sequential(nn.ConvTranspose2d(2, 3, 3), nn.ConvTranspose1d(2, 2, 1))
    crit = nn.CrossEntropyLoss(weight=torch.ones(3), ignore_index=2)
    sd = model.state_dict()
    pt.convert(model)
    pt.convert(crit)
    assert type(model[0]) is pt.ConvTranspose2d and type(model[1]) is pt.ConvTranspose1d
    assert type(crit) is pt.CrossEntropyLoss and crit.ignore_index == 2
    assert list(model.state_dict()) == list(sd)
    table = pt.supported_modules()
    for name in ("ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d", "CrossEntropyLoss"):
        assert table[getattr(nn, name)] is getattr(pt, name)
    pt.convert(model, back=True)
    pt.convert(crit, back=True)
    assert type(model[0]) is nn.ConvTranspose2d and type(crit) is nn.CrossEntropyLoss


def test_rules_label_smoothing_and_padding_mode():
    smooth = nn.CrossEntropyLoss(label_smoothing=0.1)
    assert "label_smoothing=0.1" in pt.unsupported_reason(smooth)
    assert pt.unsupported_reason(nn.CrossEntropyLoss()) is None
    with pytest.warns(UserWarning, match="stays a torch module: label_smoothing=0.1"):
        pt.convert(smooth)
    assert type(smooth) is nn.CrossEntropyLoss
    with pytest.raises(ValueError, match=r"pycudnn.torch.CrossEntropyLoss: label_smoothing"):
        pt.CrossEntropyLoss(label_smoothing=0.1)
    tconv = nn.ConvTranspose2d(1, 1, 3)
    assert pt.unsupported_reason(tconv) is None
    tconv.padding_mode = "reflect"  # torch refuses it at construction; a rule still says why
    assert "padding_mode='reflect'" in pt.unsupported_reason(tconv)
    with pytest.raises(ValueError, match="stays a torch module: padding_mode"):
        pt.convert(tconv, strict=True)
    with pytest.warns(UserWarning, match="Complex modules"):
        cplx = nn.ConvTranspose2d(1, 1, 3).to(torch.complex64)
    assert "cuDNN computes on" in pt.unsupported_reason(cplx)
