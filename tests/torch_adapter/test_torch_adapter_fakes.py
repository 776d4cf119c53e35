"""The PyTorch adapter's plumbing on the CPU: pycudnn's functions replaced by torch
computations behind their **real signatures** (every call is bound to the real function's
signature first, so a wrong argument name, order or count fails here), CPU tensors let through.

What this proves without a GPU: each ``autograd.Function`` passes its arguments where the
high-level functions take them, returns one gradient per input, honours ``out=``, updates the
batch-norm running statistics, keeps one dropout mask per pending backward, packs the RNN
weights in cuDNN's order and recomputes an RNN's reserve space when another forward (or a
backward) used it. What it cannot prove (cuDNN's numbers, streams, memory) is the GPU tier's,
``test_torch_adapter_gpu.py``.
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
from pycudnn.highlevel.rnn_layout import (  # noqa: E402
    canonical_rnn_layout,
    rnn_weights_from_torch,
    rnn_weights_to_torch,
)
from pycudnn.torch import (  # noqa: E402
    _module,
    _runtime,
    activation,
    batchnorm,
    conv,
    dropout,
    lrn,
    pool,
    rnn,
    softmax,
)

CALLS: list[str] = []


def _bound(real):
    """A decorator: the fake gets the real function's arguments, bound and defaulted."""
    sig = inspect.signature(real)

    def deco(fake):
        def wrapper(*args, **kwargs):
            ba = sig.bind(*args, **kwargs)
            ba.apply_defaults()
            CALLS.append(real.__name__)
            return fake(**ba.arguments)

        return wrapper

    return deco


def _out(out, r):
    if out is None:
        return r.clone()
    out.copy_(r)
    return out


def _spatial(x):
    return (0, *range(2, x.dim()))


def _chan(v, x):
    return v.view(1, -1, *([1] * (x.dim() - 2)))


def _conv_fn(x):
    return F.conv2d if x.dim() == 4 else F.conv3d


@_bound(hl.dnn_conv)
def fake_conv(
    img, kerns, border_mode, subsample, dilation, conv_mode, num_groups, out, bias=None, **_
):
    assert conv_mode == "cross" and img.dim() == 4
    if bias is not None:
        CALLS.append("dnn_conv+bias")
    r = F.conv2d(img, kerns, None, subsample, border_mode, dilation, num_groups)
    return _out(out, r if bias is None else r + _chan(bias, r))


@_bound(hl.dnn_conv3d)
def fake_conv3d(
    img, kerns, border_mode, subsample, dilation, conv_mode, num_groups, out, bias=None, **_
):
    assert conv_mode == "cross" and img.dim() == 5
    r = F.conv3d(img, kerns, None, subsample, border_mode, dilation, num_groups)
    return _out(out, r if bias is None else r + _chan(bias, r))


def _gradinput(
    kerns, topgrad, img_shp, border_mode, subsample, dilation, num_groups, out, beta=0.0, **_
):
    g = torch.nn.grad.conv2d_input if topgrad.dim() == 4 else torch.nn.grad.conv3d_input
    r = g(img_shp, kerns, topgrad, subsample, border_mode, dilation, num_groups)
    return _out(out, r if not beta else r + beta * out)  # beta: accumulated into out


def _gradweight(img, topgrad, kerns_shp, border_mode, subsample, dilation, num_groups, out, **_):
    g = torch.nn.grad.conv2d_weight if img.dim() == 4 else torch.nn.grad.conv3d_weight
    return _out(out, g(img, kerns_shp, topgrad, subsample, border_mode, dilation, num_groups))


fake_gradinput = _bound(hl.dnn_gradinput)(_gradinput)
fake_gradinput3d = _bound(hl.dnn_gradinput3d)(_gradinput)
fake_gradweight = _bound(hl.dnn_gradweight)(_gradweight)
fake_gradweight3d = _bound(hl.dnn_gradweight3d)(_gradweight)


def _pool(img, ws, stride, mode, pad):
    nd = img.dim() - 2
    if mode == "max":
        return (F.max_pool2d if nd == 2 else F.max_pool3d)(img, ws, stride, pad)
    avg = F.avg_pool2d if nd == 2 else F.avg_pool3d
    return avg(img, ws, stride, pad, count_include_pad=mode == "average_inc_pad")


@_bound(hl.dnn_pool)
def fake_pool(img, ws, stride, mode, pad, out, **_):
    return _out(out, _pool(img, ws, stride, mode, pad))


@_bound(hl.dnn_pool_grad)
def fake_pool_grad(img, out, out_grad, ws, stride, mode, pad, img_grad, **_):
    x = img.detach().requires_grad_()
    with torch.enable_grad():
        y = _pool(x, ws, stride, mode, pad)
    assert torch.equal(y, out), "dnn_pool_grad got another forward output"
    return _out(img_grad, torch.autograd.grad(y, x, out_grad)[0])


@_bound(hl.dnn_batch_normalization_train)
def fake_bn_train(
    inputs,
    gamma,
    beta,
    mode,
    epsilon,
    running_average_factor,
    running_mean,
    running_var,
    inplace_running,
    out,
    out_mean=None,
    out_invstd=None,
    **_,
):
    x, dims, f = inputs.to(gamma.dtype), _spatial(inputs), running_average_factor
    assert mode == "spatial" and gamma.dim() == 1
    mean, var = x.mean(dims), x.var(dims, unbiased=False)
    invstd = torch.rsqrt(var + epsilon)
    mean, invstd = _out(out_mean, mean), _out(out_invstd, invstd)
    y = (x - _chan(mean, x)) * _chan(invstd * gamma, x) + _chan(beta, x)
    out = _out(out, y.to(inputs.dtype))
    if running_mean is None:
        return out, mean, invstd
    assert inplace_running
    m = x.numel() // x.shape[1]
    running_mean.mul_(1 - f).add_(mean * f)
    running_var.mul_(1 - f).add_(var * m / (m - 1) * f)
    return out, mean, invstd, running_mean, running_var


@_bound(hl.dnn_batch_normalization_test)
def fake_bn_test(inputs, gamma, beta, mean, var, mode, epsilon, out, **_):
    x = inputs.to(gamma.dtype)
    y = (x - _chan(mean, x)) * _chan(torch.rsqrt(var + epsilon) * gamma, x) + _chan(beta, x)
    return _out(out, y.to(inputs.dtype))


@_bound(hl.dnn_batch_normalization_grad)
def fake_bn_grad(
    inputs, dy, scale, x_mean, x_invstd, mode, epsilon, out, out_dscale=None, out_dbias=None, **_
):
    x, d, dims = inputs.to(scale.dtype), dy.to(scale.dtype), _spatial(inputs)
    m = x.numel() // x.shape[1]
    xhat = (x - _chan(x_mean, x)) * _chan(x_invstd, x)
    dbias, dscale = d.sum(dims), (d * xhat).sum(dims)
    dx = _chan(scale * x_invstd / m, x) * (m * d - _chan(dbias, x) - xhat * _chan(dscale, x))
    return _out(out, dx.to(inputs.dtype)), _out(out_dscale, dscale), _out(out_dbias, dbias)


def _act(x, mode, coef):
    return {
        "relu": lambda: F.relu(x),
        "sigmoid": lambda: torch.sigmoid(x),
        "tanh": lambda: torch.tanh(x),
        "clipped_relu": lambda: x.clamp(0, coef),
        "elu": lambda: F.elu(x, coef),
        "swish": lambda: x * torch.sigmoid(coef * x),
    }[mode]()


@_bound(hl.dnn_activation)
def fake_activation(x, mode, coef, out, **_):
    return _out(out, _act(x, mode, coef))


@_bound(hl.dnn_activation_grad)
def fake_activation_grad(y, dy, x, mode, coef, out, **_):
    if mode in activation.Y_ONLY:  # what cuDNN reads: the output (x may be y, in place)
        d = {
            "relu": lambda: (y > 0).to(y.dtype),
            "sigmoid": lambda: y * (1 - y),
            "tanh": lambda: 1 - y * y,
            "clipped_relu": lambda: ((y > 0) & (y < coef)).to(y.dtype),
        }[mode]()
        return _out(out, dy * d)
    xx = x.detach().requires_grad_()
    with torch.enable_grad():
        r = _act(xx, mode, coef)
    return _out(out, torch.autograd.grad(r, xx, dy)[0])


@_bound(hl.dnn_softmax)
def fake_softmax(x, algo, mode, out, **_):
    assert mode == "channel"
    return _out(out, torch.log_softmax(x, 1) if algo == "log" else torch.softmax(x, 1))


@_bound(hl.dnn_softmax_grad)
def fake_softmax_grad(dy, sm, algo, mode, out, **_):
    if algo == "log":
        return _out(out, dy - sm.exp() * dy.sum(1, keepdim=True))
    return _out(out, sm * (dy - (dy * sm).sum(1, keepdim=True)))


class FakeDropoutState:
    def __init__(self, seed=None):
        self.seed, self.mask, self.p = seed, None, None


_BITS = 2 ** torch.arange(8)


def _pack(keep: torch.Tensor, mask: torch.Tensor) -> None:
    """*keep*'s elements as bits into the uint8 *mask* (as cuDNN's reserve holds one a bit)."""
    bits = keep.flatten().bool()
    bits = torch.cat([bits, bits.new_zeros(-bits.numel() % 8)]).view(-1, 8)
    mask.zero_()[: bits.shape[0]] = (bits.to(torch.int64) * _BITS).sum(-1).to(torch.uint8)


def _unpack(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    bits = (mask.to(torch.int64)[:, None] // _BITS) % 2
    return bits.flatten()[: like.numel()].view(like.shape).to(like.dtype)


@_bound(hl.dnn_dropout)
def fake_dropout(x, p, seed, state, out, out_mask, **_):
    assert isinstance(state, FakeDropoutState) and seed is None
    keep = (torch.rand_like(x) >= p).to(x.dtype)
    if out_mask is None:
        state.mask, state.p = keep, p
    else:  # the caller keeps the mask (cuDNN's size: a bit per element, at least)
        assert out_mask.dtype == torch.uint8 and out_mask.numel() * 8 >= x.numel()
        _pack(keep, out_mask)
    return _out(out, x * keep / (1 - p)), state


@_bound(hl.dnn_dropout_grad)
def fake_dropout_grad(dy, state, mask, p, out, **_):
    keep, p = (state.mask, state.p) if mask is None else (_unpack(mask, dy), p)
    assert keep.shape == dy.shape
    return _out(out, dy * keep / (1 - p))


@_bound(hl.dnn_lrn)
def fake_lrn(x, n, alpha, beta, k, out, **_):
    return _out(out, F.local_response_norm(x, n, alpha, beta, k))


@_bound(hl.dnn_lrn_grad)
def fake_lrn_grad(y, dy, x, n, alpha, beta, k, out, **_):
    xx = x.detach().requires_grad_()
    with torch.enable_grad():
        r = F.local_response_norm(xx, n, alpha, beta, k)
    return _out(out, torch.autograd.grad(r, xx, dy)[0])


_TORCH_RNN = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn_tanh": nn.RNN, "rnn_relu": nn.RNN}


class FakeRNNBlock:
    """RNNBlock's interface over a torch RNN; the 'reserve space' is the autograd graph of the
    last training apply, consumed by backward (as cuDNN's backward updates it)."""

    _apply_sig = inspect.signature(hl.RNNBlock.apply)
    _backward_sig = inspect.signature(hl.RNNBlock.backward)
    _init_sig = inspect.signature(hl.RNNBlock.__init__)

    def __init__(self, *args, **kwargs):
        ba = self._init_sig.bind(self, *args, **kwargs)
        ba.apply_defaults()
        a = ba.arguments
        self.mode, self.hidden_size, self.num_layers = (
            a["rnn_mode"],
            a["hidden_size"],
            a["num_layers"],
        )
        self.num_directions = 2 if a["direction_mode"] == "bidirectional" else 1
        self.proj, self.batch_first, self.bias = a["proj_size"], a["batch_first"], a["bias"]
        self.dropout = a["dropout"]
        self.out_size = self.proj or self.hidden_size
        self.output_size = self.num_directions * self.out_size
        self.reserve = None
        self.applies = 0

    def layout(self, input_size, device=None):
        bi = self.num_directions == 2
        return canonical_rnn_layout(
            self.mode, input_size, self.hidden_size, self.num_layers, bi, self.proj, bias=self.bias
        )

    def _module(self, w, input_size):
        kw = {
            "bias": self.bias,
            "batch_first": self.batch_first,
            "bidirectional": self.num_directions == 2,
        }
        if self.mode == "lstm" and self.proj:
            kw["proj_size"] = self.proj
        if self.mode.startswith("rnn_"):
            kw["nonlinearity"] = self.mode[4:]
        m = _TORCH_RNN[self.mode](input_size, self.hidden_size, self.num_layers, **kw).double()
        lay = self.layout(input_size)
        sd = {k: torch.as_tensor(v) for k, v in rnn_weights_to_torch(w.detach(), lay).items()}
        m.load_state_dict(sd)
        return m, lay

    def apply(self, *args, **kwargs):
        a = self._apply_sig.bind(self, *args, **kwargs).arguments
        CALLS.append("RNNBlock.apply")
        w, x, hx, cx = a["w"], a["x"], a.get("hx"), a.get("cx")
        training, out = a.get("training", False), a["out"]
        m, lay = self._module(w, x.shape[-1])
        leaves = [
            t.detach().double().requires_grad_() if t is not None else None for t in (x, hx, cx)
        ]
        with torch.enable_grad():
            state = None
            if leaves[1] is not None:
                state = (leaves[1], leaves[2]) if self.mode == "lstm" else leaves[1]
            y, hid = m(leaves[0], state)
        hy, cy = hid if self.mode == "lstm" else (hid, None)
        for o, r in zip(out, (y, hy, cy), strict=False):
            o.copy_(r.detach())
        self.applies += 1
        if training:
            self.reserve = {
                "x": x.clone(),
                "w": w.detach().clone(),
                "outs": (y, hy, cy),
                "leaves": leaves,
                "params": list(m.named_parameters()),
                "lay": lay,
            }
        return out

    def backward(self, *args, **kwargs):
        a = self._backward_sig.bind(self, *args, **kwargs).arguments
        CALLS.append("RNNBlock.backward")
        r = self.reserve
        if r is None or not torch.equal(r["x"], a["x"]) or not torch.equal(r["w"], a["w"]):
            raise RuntimeError("fake RNNBlock: backward without its training apply's reserve")
        self.reserve = None  # consumed
        y, hy, cy = r["outs"]
        outs = [y, hy] + ([cy] if cy is not None else [])
        grads = [a["dy"], a.get("dhy"), a.get("dcy")][: len(outs)]
        grads = [
            torch.zeros_like(o) if g is None else g.double()
            for o, g in zip(outs, grads, strict=True)
        ]
        leaves = [t for t in r["leaves"] if t is not None]
        params = [p for _, p in r["params"]]
        got = torch.autograd.grad(outs, leaves + params, grads, allow_unused=True)
        dx = got[0]
        out = a["out"]
        out[0].copy_(dx)
        dh = got[1] if r["leaves"][1] is not None else torch.zeros_like(out[1])
        out[1].copy_(dh)
        if len(out) > 2:
            dc = got[2] if r["leaves"][2] is not None else torch.zeros_like(out[2])
            out[2].copy_(dc)
        dw = a.get("dw")
        if a.get("weights", True):
            pg = {n: g for (n, _), g in zip(r["params"], got[len(leaves) :], strict=True)}
            dw.copy_(torch.as_tensor(rnn_weights_from_torch(pg, r["lay"])))
        return out[0], out[1], out[2] if len(out) > 2 else None, dw


# where the adapter reads each function: the family modules (and the runtime they share)
ADAPTER = (_runtime, activation, batchnorm, conv, dropout, lrn, pool, rnn, softmax)


@pytest.fixture(autouse=True)
def fakes(monkeypatch):
    replaced = {
        "dnn_conv": fake_conv,
        "dnn_conv3d": fake_conv3d,
        "dnn_gradinput": fake_gradinput,
        "dnn_gradinput3d": fake_gradinput3d,
        "dnn_gradweight": fake_gradweight,
        "dnn_gradweight3d": fake_gradweight3d,
        "dnn_pool": fake_pool,
        "dnn_pool_grad": fake_pool_grad,
        "dnn_batch_normalization_train": fake_bn_train,
        "dnn_batch_normalization_test": fake_bn_test,
        "dnn_batch_normalization_grad": fake_bn_grad,
        "dnn_activation": fake_activation,
        "dnn_activation_grad": fake_activation_grad,
        "dnn_softmax": fake_softmax,
        "dnn_softmax_grad": fake_softmax_grad,
        "dnn_dropout": fake_dropout,
        "dnn_dropout_grad": fake_dropout_grad,
        "dnn_lrn": fake_lrn,
        "dnn_lrn_grad": fake_lrn_grad,
        "DropoutState": FakeDropoutState,
        "RNNBlock": FakeRNNBlock,
        "cuda_ok": lambda x, dtypes=_runtime.FLOATS: (
            type(x) in (torch.Tensor, nn.Parameter) and x.dtype in dtypes
        ),
    }
    for name, fake in replaced.items():
        where = [m for m in ADAPTER if hasattr(m, name)]
        assert where, f"no adapter module reads {name}"
        for module in where:
            monkeypatch.setattr(module, name, fake)
    monkeypatch.setattr(_runtime, "raw_stream", lambda device: 0)
    monkeypatch.setattr(_runtime, "_AUTO", [False])  # no allocator to install on the CPU
    CALLS.clear()
    dropout._POOLS.clear()  # states of the fake DropoutState only
    yield


def _compare(ref, x, *, rtol=1e-9, atol=1e-9, inplace_input=False, expect=()):
    """The converted twin against *ref* in float64: forward, gradients, buffers."""
    ref = ref.double()
    mine = pt.convert(copy.deepcopy(ref), strict=True)
    xr = x.double().clone().requires_grad_()
    xm = x.double().clone().requires_grad_()
    yr, ym = ref(xr * 1 if inplace_input else xr), mine(xm * 1 if inplace_input else xm)
    yr = yr[0] if isinstance(yr, tuple) else yr
    ym = ym[0] if isinstance(ym, tuple) else ym
    torch.testing.assert_close(ym, yr, rtol=rtol, atol=atol)
    dy = torch.randn_like(yr)
    yr.backward(dy)
    ym.backward(dy)
    torch.testing.assert_close(xm.grad, xr.grad, rtol=rtol, atol=atol)
    for (n, a), b in zip(mine.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=rtol, atol=atol, msg=n)
    for (n, a), b in zip(mine.named_buffers(), ref.buffers(), strict=True):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=n)
    for name in expect:
        assert name in CALLS, (name, CALLS)


MODULES = [
    (
        "conv1d",
        lambda: nn.Conv1d(3, 4, 3, stride=2, padding=1, dilation=2),
        (2, 3, 11),
        ("dnn_conv", "dnn_gradinput", "dnn_gradweight"),
    ),
    (
        "conv2d",
        lambda: nn.Conv2d(4, 6, 3, stride=2, padding="valid", groups=2),
        (2, 4, 9, 9),
        ("dnn_conv", "dnn_gradinput", "dnn_gradweight", "dnn_conv+bias"),
    ),
    (
        "conv2d-same",
        lambda: nn.Conv2d(3, 5, (3, 1), padding="same", dilation=(2, 1), bias=False),
        (2, 3, 8, 7),
        ("dnn_conv",),
    ),
    (
        "conv3d",
        lambda: nn.Conv3d(2, 4, 3, stride=(1, 2, 2), padding=1),
        (2, 2, 5, 6, 6),
        ("dnn_conv3d", "dnn_gradinput3d", "dnn_gradweight3d"),
    ),
    (
        "maxpool2d",
        lambda: nn.MaxPool2d(3, stride=2, padding=1),
        (2, 3, 9, 9),
        ("dnn_pool", "dnn_pool_grad"),
    ),
    ("maxpool3d", lambda: nn.MaxPool3d(2), (2, 2, 4, 4, 4), ("dnn_pool",)),
    (
        "avgpool2d",
        lambda: nn.AvgPool2d(3, padding=1, count_include_pad=False),
        (2, 3, 9, 9),
        ("dnn_pool",),
    ),
    ("avgpool3d", lambda: nn.AvgPool3d(2, stride=1), (1, 2, 4, 4, 4), ("dnn_pool",)),
    (
        "bn1d",
        lambda: nn.BatchNorm1d(5, momentum=None),
        (8, 5),
        ("dnn_batch_normalization_train", "dnn_batch_normalization_grad"),
    ),
    ("bn2d", lambda: nn.BatchNorm2d(5), (4, 5, 3, 3), ("dnn_batch_normalization_train",)),
    ("bn2d-noaffine", lambda: nn.BatchNorm2d(5, affine=False), (4, 5, 3, 3), ()),
    ("bn3d-nostats", lambda: nn.BatchNorm3d(2, track_running_stats=False), (2, 2, 2, 3, 3), ()),
    ("relu", lambda: nn.ReLU(), (3, 4, 5), ("dnn_activation", "dnn_activation_grad")),
    ("relu-inplace", lambda: nn.ReLU(inplace=True), (3, 4, 5), ("dnn_activation",)),
    ("sigmoid-4d", lambda: nn.Sigmoid(), (2, 3, 4, 4), ("dnn_activation",)),
    ("tanh", lambda: nn.Tanh(), (3, 4), ("dnn_activation",)),
    ("elu", lambda: nn.ELU(0.3, inplace=True), (3, 4), ("dnn_activation",)),
    ("silu", lambda: nn.SiLU(), (3, 4), ("dnn_activation",)),
    ("hardtanh", lambda: nn.Hardtanh(0, 1.5, inplace=True), (3, 8), ("dnn_activation",)),
    ("relu6", lambda: nn.ReLU6(), (3, 8), ("dnn_activation",)),
    ("softmax", lambda: nn.Softmax(1), (3, 7), ("dnn_softmax", "dnn_softmax_grad")),
    ("logsoftmax", lambda: nn.LogSoftmax(1), (2, 4, 3, 3), ("dnn_softmax",)),
    (
        "lrn",
        lambda: nn.LocalResponseNorm(3, 0.1, 0.75, 1.5),
        (2, 5, 3, 3),
        ("dnn_lrn", "dnn_lrn_grad"),
    ),
]


@pytest.mark.parametrize(("name", "make", "shape", "expect"), MODULES, ids=[m[0] for m in MODULES])
def test_module_through_the_real_signatures(name, make, shape, expect):
    torch.manual_seed(0)
    x = torch.randn(shape) * 4 if name in ("hardtanh", "relu6") else torch.randn(shape)
    _compare(
        make(), x, inplace_input="inplace" in name or name in ("elu", "hardtanh"), expect=expect
    )


@pytest.mark.parametrize("eval_first", [False, True])
def test_batchnorm_eval_and_running_statistics(eval_first):
    torch.manual_seed(0)
    ref = nn.BatchNorm2d(3, momentum=0.25)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
        ref.bias.uniform_(-1, 1)
    if eval_first:
        ref.running_var.fill_(2.0)
        ref.eval()
    _compare(
        ref,
        torch.randn(4, 3, 2, 2) * 2 + 1,
        expect=("dnn_batch_normalization_test",) if eval_first else (),
    )


def test_batchnorm_half_parameters_are_cast_and_copied_back():
    """float16 parameters and statistics: cast to float32 for the call (cuDNN's rule), the
    running averages written back in float16."""
    torch.manual_seed(0)
    mine = pt.convert(nn.BatchNorm2d(3).half())
    ref = nn.BatchNorm2d(3)
    for _ in range(2):
        x = torch.randn(4, 3, 2, 2) * 2 + 1
        torch.testing.assert_close(
            mine(x.half()).float(), ref(x.half().float()), rtol=1e-2, atol=1e-2
        )
    assert mine.running_mean.dtype == torch.float16 and mine.num_batches_tracked.item() == 2
    torch.testing.assert_close(mine.running_mean.float(), ref.running_mean, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(mine.running_var.float(), ref.running_var, rtol=1e-3, atol=1e-3)


def test_dropout_masks_travel_with_the_outputs_and_one_state_serves():
    """Two forwards pending their backward: each output's mask is its own tensor (the node's), so
    the device's one generator state is lent per launch and is back in the pool at once."""
    torch.manual_seed(0)
    drop = pt.Dropout(0.5)
    a = torch.rand(200, requires_grad=True)
    ya, yb = drop(a), drop(a * 1)
    pool = dropout._POOLS[a.get_device()]
    assert len(pool.free) == 1  # one state, lent twice
    (ya.sum() + 2 * yb.sum()).backward()
    torch.testing.assert_close(a.grad, ((ya != 0) * 1.0 + 2 * (yb != 0)) / 0.5)
    assert len(pool.free) == 1
    b = torch.rand(50)
    assert drop.__class__(0.5, inplace=True)(b).data_ptr() == b.data_ptr()
    c = torch.rand(50).requires_grad_() * 1  # in place on a non-leaf: the node marks it dirty
    assert drop.__class__(0.5, inplace=True)(c) is c and c._version > 0
    assert type(c.grad_fn).__name__ == "DropoutFnBackward"


RNNS = [
    ("lstm", lambda: nn.LSTM(3, 4, 2), True),
    (
        "lstm-proj-bi-bf",
        lambda: nn.LSTM(3, 4, proj_size=2, bidirectional=True, batch_first=True),
        True,
    ),
    ("gru", lambda: nn.GRU(3, 4, bias=False), False),
    ("rnn", lambda: nn.RNN(3, 4, 2, nonlinearity="relu"), True),
]


@pytest.mark.parametrize(("name", "make", "with_state"), RNNS, ids=[r[0] for r in RNNS])
def test_rnn_through_the_real_signatures(name, make, with_state):
    torch.manual_seed(0)
    ref = make().double()
    mine = pt.convert(copy.deepcopy(ref), strict=True)
    lstm = isinstance(ref, nn.LSTM)
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    nl = ref.num_layers * (2 if ref.bidirectional else 1)
    n = x.shape[0] if ref.batch_first else x.shape[1]
    h0 = torch.randn(nl, n, ref.proj_size or ref.hidden_size, dtype=torch.float64)
    c0 = torch.randn(nl, n, ref.hidden_size, dtype=torch.float64)
    res = []
    for m in (ref, mine):
        xi = x.clone().requires_grad_()
        st = [h0.clone().requires_grad_(), c0.clone().requires_grad_()][: 2 if lstm else 1]
        state = (tuple(st) if lstm else st[0]) if with_state else None
        y, hid = m(xi, state)
        hy = hid[0] if lstm else hid
        (y.square().sum() + hy.sum() + (hid[1].sum() if lstm else 0)).backward()
        res.append((y, hy, xi.grad, [s.grad for s in st], [p.grad for p in m.parameters()]))
    assert {"RNNBlock.apply", "RNNBlock.backward"} <= set(CALLS)
    (yr, hr, dxr, dsr, dpr), (ym, hm, dxm, dsm, dpm) = res
    torch.testing.assert_close(ym, yr)
    torch.testing.assert_close(hm, hr)
    torch.testing.assert_close(dxm, dxr)
    for a, b in zip(dsm, dsr, strict=True):
        if with_state:
            torch.testing.assert_close(a, b)
        else:
            assert a is None and b is None
    for a, b in zip(dpm, dpr, strict=True):
        torch.testing.assert_close(a, b)


def test_rnn_recomputes_the_reserve_after_another_forward_or_a_backward():
    torch.manual_seed(0)
    ref = nn.LSTM(3, 4).double()
    mine = pt.convert(copy.deepcopy(ref))
    x1, x2 = torch.randn(4, 2, 3, dtype=torch.float64), torch.randn(6, 2, 3, dtype=torch.float64)
    for m in (ref, mine):
        y1 = m(x1)[0]
        y2 = m(x2)[0]  # the reserve is x2's now
        loss = y1.sum() + y2.square().sum()
        loss.backward(retain_graph=True)
        loss.backward()  # again: the reserve was consumed by the first backward
    for (n, a), b in zip(mine.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, msg=n)
    block = next(v for k, v in _module.STATE[mine].items() if k[0] == "block")
    assert block.applies > 2  # recomputed forwards happened


def test_rnn_with_dropout_cannot_recompute():
    torch.manual_seed(0)
    mine = pt.convert(nn.LSTM(3, 4, 2, dropout=0.5).double())
    x = torch.randn(4, 2, 3, dtype=torch.float64)
    y1 = mine(x)[0]
    mine(x)[0].sum().backward()
    with pytest.raises(RuntimeError, match="dropout mask cannot be recomputed"):
        y1.sum().backward()


def test_rnn_unbatched_and_no_grad():
    torch.manual_seed(0)
    ref = nn.GRU(3, 4).double()
    mine = pt.convert(copy.deepcopy(ref))
    x, h = torch.randn(5, 3, dtype=torch.float64), torch.randn(1, 4, dtype=torch.float64)
    torch.testing.assert_close(mine(x, h)[0], ref(x, h)[0])
    with torch.no_grad():
        y, hy = mine(x)
    assert not y.requires_grad and hy.shape == (1, 4)


def test_gradcheck_through_the_fakes():
    torch.manual_seed(0)
    for make, shape in (
        (lambda: nn.Conv2d(2, 2, 3, padding=1), (1, 2, 3, 3)),
        (lambda: nn.BatchNorm2d(2), (3, 2, 2, 2)),
        (lambda: nn.LSTM(2, 2), (3, 1, 2)),
    ):
        mine = pt.convert(make().double())
        names = [n for n, _ in mine.named_parameters()]
        params = [p.detach().clone().requires_grad_() for p in mine.parameters()]

        def f(inp, *ps, mine=mine, names=names):
            out = torch.func.functional_call(mine, dict(zip(names, ps, strict=True)), (inp,))
            return out[0] if isinstance(out, tuple) else out

        x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(f, (x, *params))


@pytest.mark.parametrize("coef", [1.0, 0.5])
def test_swish_gradient_torch_computes_where_cudnn_has_no_kernel(coef):
    """bfloat16 activations take their gradient from torch (cuDNN's legacy backward has no
    bfloat16 kernel): SiLU (``coef == 1``) through torch's one ``silu_backward`` kernel, other
    swish coefficients through the formula; both equal autograd's gradient of
    ``x * sigmoid(coef * x)``."""
    torch.manual_seed(0)
    x = torch.randn(64, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(64, dtype=torch.float64)
    y = x * torch.sigmoid(coef * x)
    (want,) = torch.autograd.grad(y, x, dy)
    got = activation._torch_grad("swish", coef, x.detach(), y.detach(), dy)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
