"""``torch.compile`` support of the PyTorch adapter on the CPU: the ``pycudnn::`` custom ops.

pycudnn's functions are replaced by torch computations behind their real signatures (the fakes
of ``test_torch_adapter_fakes.py``, plus the norms', attention's and matmul's here) and CPU
tensors are let through, so each op's *real* implementation -- the lean-path function the eager
modules run -- executes on the CPU. What this proves without a GPU: every op's schema, its
registered autograd, its fake (shape, dtype and strides equal to the real output's, NCHW and
channels-last, 2-D and 3-D: ``torch.library.opcheck``), that a converted CNN and a
transformer-ish block trace under ``torch.compile`` with no graph break inside pycudnn and give
eager's outputs and gradients, and that the eager path never calls the ops. cuDNN's numbers,
streams and CUDA graphs are the GPU tier's, ``test_torch_compile_gpu.py``.
"""

from __future__ import annotations

import copy
import math

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch.library, "custom_op") or not hasattr(torch, "compiler"):
    pytest.skip("torch.library.custom_op needs torch >= 2.4", allow_module_level=True)
nn = torch.nn
F = torch.nn.functional

import test_torch_adapter_fakes as base  # noqa: E402  (tests/torch_adapter is on sys.path)
import test_torch_pool_kernel as tpk  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch_compile_models import CNN, Block  # noqa: E402  (tests/support)

import pycudnn  # noqa: E402
from pycudnn import highlevel as hl  # noqa: E402
from pycudnn import torch as pt  # noqa: E402
from pycudnn.torch import (  # noqa: E402
    _compile,
    _runtime,
    activation,
    attention,
    batchnorm,
    conv,
    conv_transpose,
    dropout,
    linear,
    lrn,
    norm,
    pool,
    pool_kernel,
    rnn,
    softmax,
)

OPS = _compile.OPS
PREFIX = "pycudnn::"


_bound = base._bound  # the fake gets the real function's arguments, bound and defaulted


def _rows(x, shape):
    n = len(tuple(shape))
    return tuple(range(x.dim() - n, x.dim()))


@_bound(hl.dnn_layer_norm)
def fake_layer_norm(
    x, normalized_shape, gamma, beta, epsilon, training, out, out_mean, out_invstd, **_
):
    dims = _rows(x, normalized_shape)
    xf = x.float()
    mean = xf.mean(dims, keepdim=True)
    invstd = torch.rsqrt(xf.var(dims, unbiased=False, keepdim=True) + epsilon)
    y = (xf - mean) * invstd
    y = y if gamma is None else y * gamma.float()
    y = y if beta is None else y + beta.float()
    out.copy_(y.to(x.dtype))
    mean = mean if out_mean is None else out_mean.copy_(mean)
    invstd = invstd if out_invstd is None else out_invstd.copy_(invstd)
    return (out, mean, invstd) if training else (out, None, None)


@_bound(hl.dnn_layer_norm_grad)
def fake_layer_norm_grad(dy, x, mean, inv_std, normalized_shape, gamma, out_grads, **_):
    got = _layer_norm_grad(dy, x, normalized_shape, gamma)
    return _given(got, out_grads)


def _layer_norm_grad(dy, x, normalized_shape, gamma):
    ns = tuple(normalized_shape)
    if gamma is None:
        (dx,) = _vjp(lambda t: F.layer_norm(t.float(), ns, None, None, 1e-5), (x,), dy.float())
        return dx.to(x.dtype), None, None
    zero = torch.zeros_like(gamma)
    dx, dw, db = _vjp(
        lambda t, g, b: F.layer_norm(t.float(), ns, g.float(), b.float(), 1e-5),
        (x, gamma, zero),
        dy.float(),
    )
    return dx.to(x.dtype), dw, db


@_bound(hl.dnn_rms_norm)
def fake_rms_norm(x, normalized_shape, gamma, epsilon, training, out, out_invrms, **_):
    dims = _rows(x, normalized_shape)
    inv = torch.rsqrt(x.float().pow(2).mean(dims, keepdim=True) + epsilon)
    inv = inv if out_invrms is None else out_invrms.copy_(inv)
    y = x.float() * inv
    out.copy_((y if gamma is None else y * gamma.float()).to(x.dtype))
    return (out, inv) if training else (out, None)


def _rms(t, ns, g):
    dims = tuple(range(t.dim() - len(ns), t.dim()))
    y = t * torch.rsqrt(t.pow(2).mean(dims, keepdim=True) + 1e-6)
    return y if g is None else y * g


@_bound(hl.dnn_rms_norm_grad)
def fake_rms_norm_grad(dy, x, inv_rms, normalized_shape, gamma, out_grads, **_):
    ns = tuple(normalized_shape)
    if gamma is None:
        return _vjp(lambda t: _rms(t, ns, None), (x,), dy)[0], None
    got = _vjp(lambda t, g: _rms(t, ns, g), (x, gamma), dy)
    return _given(got, out_grads)


def _given(got, out_grads):
    """*got* written into *out_grads* when given (the functions' ``out_grads=``)."""
    if out_grads is None:
        return got
    return tuple(o.copy_(g) for o, g in zip(out_grads, got, strict=True))


def _vjp(f, primals, ct):
    """The gradients of *f* at *primals* for the cotangent *ct*, by ``torch.func.vjp``: the
    fakes run inside custom ops, below autograd, where ``torch.autograd.grad`` records nothing."""
    _, pull = torch.func.vjp(f, *primals)
    return pull(ct)


@_bound(hl.dnn_pool_grad)
def fake_pool_grad(img, out, out_grad, ws, stride, mode, pad, img_grad, **_):
    (g,) = _vjp(lambda x: base._pool(x, ws, stride, mode, pad), (img,), out_grad)
    img_grad.copy_(g)
    return img_grad


@_bound(hl.dnn_activation_grad)
def fake_activation_grad(y, dy, x, mode, coef, out, **_):
    if mode in activation.Y_ONLY:
        return base.fake_activation_grad(y, dy, x, mode, coef, out=out)
    (g,) = _vjp(lambda t: base._act(t, mode, coef), (x,), dy)
    out.copy_(g)
    return out


@_bound(hl.dnn_lrn_grad)
def fake_lrn_grad(y, dy, x, n, alpha, beta, k, out, **_):
    (g,) = _vjp(lambda t: F.local_response_norm(t, n, alpha, beta, k), (x,), dy)
    out.copy_(g)
    return out


#: torch's own function (``F``'s attribute is pycudnn's inside ``use_cudnn_attention()``)
_TORCH_SDPA = torch._C._nn.scaled_dot_product_attention


def _heads(q, k):
    """*k* with each key head repeated for its group of query heads (grouped-query attention)."""
    n = q.shape[-3] // k.shape[-3]
    return k if n == 1 else k.repeat_interleave(n, dim=-3)


def _attn(q, k, v, causal, scale, mask=None):
    gqa = {"enable_gqa": True} if q.shape[-3] != k.shape[-3] else {}  # (cuDNN reads shared heads)
    return _TORCH_SDPA(q, k, v, mask, 0.0, causal, scale=scale, **gqa)


@_bound(hl.dnn_sdpa)
def fake_sdpa(q, k, v, attn_mask, is_causal, scale, dropout_p, seed, training, out, out_stats, **_):
    assert dropout_p == 0.0
    out.copy_(_attn(q, k, v, is_causal, scale, attn_mask))
    if not training:
        return out
    s = q.float() @ _heads(q, k).float().transpose(-1, -2) * (scale or 1 / math.sqrt(q.shape[-1]))
    if attn_mask is not None:
        s = s + attn_mask.float()
    stats = torch.logsumexp(s, -1, keepdim=True)
    return out, stats if out_stats is None else out_stats.copy_(stats)


@_bound(hl.dnn_sdpa_grad)
def fake_sdpa_grad(
    q, k, v, out, dout, stats, attn_mask, is_causal, scale, bias_grad, out_grads, **_
):
    if bias_grad:  # (q, k, v and the mask's gradients)
        return _vjp(
            lambda a, b, c, m: _attn(a, b, c, is_causal, scale, m), (q, k, v, attn_mask), dout
        )
    g = _vjp(lambda a, b, c: _attn(a, b, c, is_causal, scale, attn_mask), (q, k, v), dout)
    return _given(g, out_grads)


@_bound(hl.dnn_matmul)
def fake_matmul(a, b, bias, activation, out, **_):
    r = a @ b
    out.copy_(r if bias is None else r + bias)
    return out


class FakeState(base.FakeDropoutState):
    """The dropout state of the adapter's fakes, keeping its mask for ``dnn_dropout_grad``."""


@pytest.fixture(autouse=True)
def fakes(monkeypatch):
    replaced = {
        "dnn_conv": base.fake_conv,
        "dnn_conv3d": base.fake_conv3d,
        "dnn_gradinput": base.fake_gradinput,
        "dnn_gradinput3d": base.fake_gradinput3d,
        "dnn_gradweight": base.fake_gradweight,
        "dnn_gradweight3d": base.fake_gradweight3d,
        "dnn_pool": base.fake_pool,
        "dnn_pool_grad": fake_pool_grad,
        "dnn_batch_normalization_train": base.fake_bn_train,
        "dnn_batch_normalization_test": base.fake_bn_test,
        "dnn_batch_normalization_grad": base.fake_bn_grad,
        "dnn_activation": base.fake_activation,
        "dnn_activation_grad": fake_activation_grad,
        "dnn_softmax": base.fake_softmax,
        "dnn_softmax_grad": base.fake_softmax_grad,
        "dnn_dropout": base.fake_dropout,
        "dnn_dropout_grad": base.fake_dropout_grad,
        "DropoutState": FakeState,
        "dnn_lrn": base.fake_lrn,
        "dnn_lrn_grad": fake_lrn_grad,
        "dnn_layer_norm": fake_layer_norm,
        "dnn_layer_norm_grad": fake_layer_norm_grad,
        "dnn_rms_norm": fake_rms_norm,
        "dnn_rms_norm_grad": fake_rms_norm_grad,
        "dnn_sdpa": fake_sdpa,
        "dnn_sdpa_grad": fake_sdpa_grad,
        "dnn_matmul": fake_matmul,
        "cuda_ok": lambda x, dtypes=_runtime.FLOATS: (
            type(x) in (torch.Tensor, nn.Parameter)
            and x.dtype in dtypes
            and not _runtime.transforming()
        ),
    }
    adapter = (
        _runtime,
        activation,
        attention,
        batchnorm,
        conv,
        conv_transpose,
        dropout,
        linear,
        lrn,
        norm,
        pool,
        rnn,
        softmax,
    )
    for name, fake in replaced.items():
        where = [m for m in adapter if hasattr(m, name)]
        assert where, f"no adapter module reads {name}"
        for module in where:
            monkeypatch.setattr(module, name, fake)
    monkeypatch.setattr(_runtime, "raw_stream", lambda device: 0)
    monkeypatch.setattr(pool_kernel, "_run", tpk.twin_run)  # pycudnn's pooling kernels' twins
    monkeypatch.setattr(_runtime, "_AUTO", [False])
    monkeypatch.setattr(attention, "_attention_capable", lambda t: True)
    monkeypatch.setattr(attention, "HALVES", (*_runtime.HALVES, torch.float32, torch.float64))
    base.CALLS.clear()
    dropout._POOLS.clear()
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# -- every op: schema, autograd, fake (opcheck runs the real implementation on the fakes) ----------
def _t(*shape, last=False, grad=False, dtype=torch.float64):
    t = torch.randn(shape, dtype=dtype)
    if last:
        t = t.contiguous(
            memory_format=torch.channels_last if t.dim() == 4 else torch.channels_last_3d
        )
    return t.requires_grad_(grad)


def _cases():
    """(op name, args) for every op: NCHW and channels-last, 2-D and 3-D."""
    cases = []
    for last in (False, True):
        for nd in (2, 3):
            sp = (6,) * nd
            x, w = _t(2, 4, *sp, last=last, grad=True), _t(6, 2, *(3,) * nd, grad=True)
            b = _t(6, grad=True)
            cfg = ([1] * nd, [2] + [1] * (nd - 1), [1] * nd, 2)
            cv = F.conv2d if nd == 2 else F.conv3d
            y = cv(x.detach(), w.detach(), None, cfg[1], cfg[0], cfg[2], cfg[3])
            dy = _t(*y.shape, last=last)
            cases += [
                ("conv", (x, w, b, *cfg)),
                ("conv", (x, w, None, *cfg)),
                ("conv_dgrad", (w, dy.requires_grad_(), list(x.shape), last, *cfg)),
                ("conv_wgrad", (x.detach(), dy.detach(), w.detach(), *cfg)),
                ("pool", (x, [2] * nd, [2] * nd, [0] * nd, "max")),
                ("pool", (x, [3] * nd, [1] * nd, [1] * nd, "average_exc_pad")),
                ("act", (x, "relu", 0.0)),
                ("act", (x, "elu", 0.5)),
                ("softmax", (x, "log")),
                ("dropout", (x.detach(), 0.25)),
            ]
            cw, cb = _t(4, grad=True), _t(4, grad=True)
            rm, rv = torch.zeros(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64)
            cases += [
                ("bn_train", (x.detach(), cw.detach(), cb.detach(), rm, rv, 1e-5, 0.1)),
                ("bn_train", (x.detach(), cw.detach(), cb.detach(), None, None, 1e-5, 0.0)),
                ("bn_eval", (x, cw, cb, rm.clone(), rv.clone(), 1e-5)),
            ]
    x3, w2, b1 = _t(2, 5, 8, grad=True), _t(3, 8, grad=True), _t(3, grad=True)
    cases += [
        ("linear", (x3, w2, b1)),
        ("linear", (x3, w2, None)),
        ("layer_norm", (x3, _t(8, grad=True), _t(8, grad=True), [8], 1e-5, True)),
        ("layer_norm", (x3.detach(), None, None, [5, 8], 1e-5, False)),
        ("rms_norm", (x3, _t(8, grad=True), [8], 1e-6, True)),
        # pycudnn's pooling kernels (their float64 twins): channels-last, 8 channels
        (
            "max_pool",
            (
                _t(2, 8, 7, 9, last=True, grad=True, dtype=torch.float32),
                [3, 3],
                [2, 2],
                [1, 1],
                True,
            ),
        ),
        (
            "max_pool",
            (_t(2, 8, 6, 6, last=True, dtype=torch.float32), [2, 2], [2, 2], [0, 0], False),
        ),
        ("act", (x3, "sigmoid", 0.0)),
        ("softmax", (x3, "accurate")),
    ]
    q = _t(2, 3, 5, 8, grad=True)
    kv = _t(2, 5, 3, 8).transpose(1, 2).requires_grad_()  # (B, S, H, E) projections' view
    cases += [
        ("sdpa", (q, kv, kv, None, False, None, 0.0, None, True)),
        # an additive mask, its gradient (the (1, H, S_q, S_kv) shape cuDNN differentiates)
        ("sdpa", (q, kv, kv, _t(1, 3, 5, 5, grad=True), False, None, 0.0, None, True)),
        # the inference variant keeps no statistics: its inputs want no gradient
        ("sdpa", (q.detach(), kv.detach(), kv.detach(), None, True, 0.3, 0.0, None, False)),
    ]
    return cases


CASES = _cases() if _compile.OPS else []


@pytest.mark.parametrize(("name", "args"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_opcheck(name, args):
    """Schema, autograd registration, fake tensors (shape, dtype, strides) and AOT dispatch,
    each against the real implementation on the CPU fakes."""
    torch.library.opcheck(OPS[name], args)


def test_every_op_has_a_case_and_a_schema():
    assert {c[0] for c in CASES} >= set(OPS) - {
        "bn_grad",
        "pool_grad",
        "max_pool_grad",
        "act_grad",
        "softmax_grad",
        "linear_dx",
        "linear_dw",
        "layer_norm_grad",
        "rms_norm_grad",
        "sdpa_grad",
        "dropout_grad",
        "conv_fused",  # the fused modules' ops: opcheck in test_torch_fuse.py
        "linear_fused",
        "conv_bn_train",
        "conv_bn_train_grad",
        "region_eval",  # the fused regions' ops: opcheck in test_torch_region_ops.py
        "region_train",
        "region_train_grad",
    }  # the gradients' ops run through the autograd checks of their forwards
    for name, op in OPS.items():
        assert str(op._schema).startswith(PREFIX + name + "("), op._schema
    assert "Tensor(a3!)? running_mean" in str(OPS["bn_train"]._schema)  # declared mutation


@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize("nd", [2, 3])
def test_fakes_on_cuda_fake_tensors(nd, last):
    """The fakes under FakeTensorMode with device='cuda' (no GPU needed): the outputs' shapes,
    dtypes and strides are those of torch's own operators on the same inputs (the convolution's
    output in the input's memory format, as torch's CUDA builds give it)."""
    with FakeTensorMode(allow_non_fake_inputs=False):
        fmt = torch.channels_last if nd == 2 else torch.channels_last_3d
        # made in its layout rather than converted: a CPU-only torch build (2.13.0+cpu) refuses
        # .contiguous(memory_format=...) on a fake CUDA tensor (not linked with CUDA)
        x = torch.empty(
            (2, 4, *(7,) * nd),
            dtype=torch.float16,
            device="cuda",
            memory_format=fmt if last else torch.contiguous_format,
        )
        w = torch.empty((6, 4, *(3,) * nd), dtype=torch.float16, device="cuda")
        cfg = ([1] * nd, [2] * nd, [1] * nd, 1)
        y = OPS["conv"](x, w, None, *cfg)
        ref = (F.conv2d if nd == 2 else F.conv3d)(x, w, None, 2, 1)
        # torch's own layout choice for a CUDA conv depends on its build: a CUDA build keeps the
        # input's memory format (cuDNN), a CPU-only build (2.13.0+cpu) answers a contiguous one
        layout = torch.empty(ref.shape, memory_format=fmt if last else torch.contiguous_format)
        if torch.backends.cuda.is_built():
            assert ref.stride() == layout.stride()
        assert (y.shape, y.stride(), y.dtype, y.device) == (
            ref.shape,
            layout.stride(),
            ref.dtype,
            ref.device,
        )
        dx = OPS["conv_dgrad"](w, y, list(x.shape), last, *cfg)
        assert (dx.shape, dx.stride()) == (x.shape, x.stride())
        assert OPS["conv_wgrad"](x, y, w, *cfg).stride() == w.stride()
        p = OPS["pool"](x, [2] * nd, [2] * nd, [0] * nd, "max")
        pref = (F.max_pool2d if nd == 2 else F.max_pool3d)(x, 2)
        assert (p.shape, p.stride()) == (pref.shape, pref.stride())
        c = torch.empty(4, dtype=torch.float32, device="cuda")
        yb, mean, invstd = OPS["bn_train"](x, c, c, None, None, 1e-5, 0.0)
        assert (yb.shape, yb.stride(), yb.dtype) == (x.shape, x.stride(), x.dtype)
        assert mean.shape == invstd.shape == (4,) and mean.dtype == torch.float32
        a = OPS["act"](x, "relu", 0.0)
        assert a.stride() == x.stride() and a.device.type == "cuda"
        y2, mask = OPS["dropout"](x, 0.5)
        assert y2.stride() == x.stride() and mask.dtype == torch.uint8
        assert mask.shape == (pycudnn.dropout_mask_bytes(tuple(x.shape), x.dtype),)


def test_attention_and_norm_fakes_on_cuda_fake_tensors():
    with FakeTensorMode():
        q = torch.empty((2, 7, 4, 64), dtype=torch.bfloat16, device="cuda").transpose(1, 2)
        out, stats = OPS["sdpa"](q, q, q, None, True, None, 0.0, None, True)
        assert out.shape == (2, 4, 7, 64) and out.stride() == q.stride()
        assert stats.shape == (2, 4, 7, 1) and stats.dtype == torch.float32
        _, none = OPS["sdpa"](q, q, q, None, False, None, 0.0, None, False)
        assert none.shape == (0,)
        x = torch.empty((3, 5, 16), dtype=torch.float16, device="cuda")
        w = torch.empty(16, dtype=torch.float32, device="cuda")
        y, mean, _ = OPS["layer_norm"](x, w, w, [16], 1e-5, True)
        assert y.shape == x.shape and y.dtype == x.dtype and mean.shape == (3, 5, 1)
        y = OPS["linear"](x, torch.empty((8, 16), dtype=x.dtype, device="cuda"), None)
        assert y.shape == (3, 5, 8) and y.is_contiguous()


# -- torch.compile over converted models -----------------------------------------------------------
def _step(model, x):
    y = model(x)
    y.backward(torch.ones_like(y))
    return y.detach(), [p.grad.clone() for p in model.parameters()]


def _run_compiled(make, x, backend="aot_eager"):
    torch.manual_seed(0)
    ref = make().to(x.dtype)
    eager = pt.convert(copy.deepcopy(ref), strict=True)
    comp = pt.convert(copy.deepcopy(ref), strict=True)
    ye, ge = _step(eager, x.clone())
    compiled = torch.compile(comp, backend=backend, fullgraph=True)
    yc, gc = _step(compiled, x.clone())
    yr, gr = _step(ref, x.clone())
    torch.testing.assert_close(yc, ye)
    torch.testing.assert_close(yc, yr)
    for a, b, c in zip(gc, ge, gr, strict=True):
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(a, c)
    for a, b in zip(comp.buffers(), eager.buffers(), strict=True):
        torch.testing.assert_close(a, b)  # the running statistics, updated in place
    return comp


@pytest.mark.parametrize("last", [False, True])
def test_converted_cnn_compiles_without_graph_breaks(last):
    """fullgraph=True: a graph break anywhere (pycudnn's included) fails; the backward of the
    issue's case (channels-last or not) equals eager's and torch's."""
    x = torch.randn(8, 3, 16, 16, dtype=torch.float64)
    if last:
        x = x.contiguous(memory_format=torch.channels_last)
    base.CALLS.clear()
    _run_compiled(CNN, x)
    for name in ("dnn_conv", "dnn_gradinput", "dnn_gradweight", "dnn_pool_grad"):
        assert name in base.CALLS, name
    assert "dnn_batch_normalization_grad" in base.CALLS


def test_transformer_block_compiles_without_graph_breaks():
    x = torch.randn(2, 6, 32)  # float32: the norms' dtypes (Linear with allow_tf32)
    base.CALLS.clear()
    with pycudnn.config.override(allow_tf32=True):
        _run_compiled(Block, x)
    for name in ("dnn_layer_norm", "dnn_matmul", "dnn_sdpa", "dnn_sdpa_grad", "dnn_softmax"):
        assert name in base.CALLS, name


def test_explain_reports_no_graph_break():
    model = pt.convert(CNN().double(), strict=True)
    x = torch.randn(8, 3, 16, 16, dtype=torch.float64)
    ex = torch._dynamo.explain(model)(x)
    assert ex.graph_break_count == 0, ex.break_reasons
    ops = {str(n.target) for g in ex.graphs for n in g.graph.nodes if n.op == "call_function"}
    assert {"pycudnn.conv.default", "pycudnn.pool.default", "pycudnn.act.default"} <= ops


def test_eager_never_calls_the_ops(monkeypatch):
    """Eager keeps the lean path: the custom ops' real implementations are not entered."""
    entered = []
    for mod, name in ((conv, "_op_conv"), (pool, "_op_pool"), (linear, "_op_linear")):
        monkeypatch.setattr(mod, name, lambda *a, n=name: entered.append(n))
    model = pt.convert(CNN().double(), strict=True)
    _step(model, torch.randn(8, 3, 16, 16, dtype=torch.float64))
    assert not entered and "dnn_conv" in base.CALLS


def assert_same_grads(ref: nn.Module, mine: nn.Module, x: torch.Tensor, dy: torch.Tensor) -> None:
    """The gradients of *x* and of the parameters through *mine* equal those through *ref*."""
    want = torch.autograd.grad(ref(x), (x, *ref.parameters()), dy)
    got = torch.autograd.grad(mine(x), (x, *mine.parameters()), dy)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("make", "given"),
    [
        (lambda: nn.LayerNorm(16), True),  # both parameters: every output given (lean path)
        (lambda: nn.LayerNorm(16, bias=False), False),
        (lambda: nn.LayerNorm((4, 16), elementwise_affine=False), False),
        (lambda: nn.RMSNorm(16), True),
        (lambda: nn.RMSNorm(16, elementwise_affine=False), False),
    ],
    ids=["ln", "ln-nobias", "ln-noaffine", "rms", "rms-noaffine"],
)
def test_eager_norms_match_torch_and_give_every_output(monkeypatch, make, given):
    """Eager norms (forward, then backward, twice) equal torch's; with every parameter the
    adapter allocates the statistics and gradients itself (``out_mean``/``out_invstd``/
    ``out_invrms`` and ``out_grads``), which is what binds the call to its signature."""
    if not hasattr(nn, "RMSNorm") and make().__class__.__name__ == "RMSNorm":
        pytest.skip("torch.nn.RMSNorm needs torch >= 2.4")
    seen = []
    for name in ("dnn_layer_norm", "dnn_layer_norm_grad", "dnn_rms_norm", "dnn_rms_norm_grad"):
        fake = getattr(norm, name)
        keys = ("out_grads",) if name.endswith("grad") else ("out_mean", "out_invrms")

        def spy(*a, _f=fake, _n=name, _k=keys, **kw):
            if kw.get("training", True):  # (an inference phase keeps no statistics)
                seen.append((_n, any(kw.get(k) is not None for k in _k)))
            return _f(*a, **kw)

        monkeypatch.setattr(norm, name, spy)
    torch.manual_seed(0)
    ref = make()  # float32: a dtype the norms take
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_()
    mine = pt.convert(copy.deepcopy(ref), strict=True)
    for _ in range(2):
        x = torch.randn(3, 4, 16, requires_grad=True)
        dy = torch.randn(3, 4, 16)
        assert_same_grads(ref, mine, x, dy)
        with torch.no_grad():
            torch.testing.assert_close(mine(x), ref(x), rtol=1e-5, atol=1e-5)
    assert len(seen) == 4 and all(g == given for _n, g in seen), seen


@pytest.mark.parametrize("make", [lambda: nn.LayerNorm(16), lambda: nn.RMSNorm(16)],
                         ids=["ln", "rms"])  # fmt: skip
def test_eager_norms_ask_for_no_zero_gradient_of_their_statistics(monkeypatch, make):
    """The statistics outputs carry no gradient: the eager node tells autograd not to
    materialize one for them (a zero tensor allocated and filled per statistic, every
    backward); the gradients are still right (the test above)."""
    if not hasattr(nn, "RMSNorm") and make().__class__.__name__ == "RMSNorm":
        pytest.skip("torch.nn.RMSNorm needs torch >= 2.4")
    asked = []
    real = torch.autograd.function.FunctionCtx.set_materialize_grads

    def spy(ctx, value):
        asked.append((type(ctx).__name__, value))
        return real(ctx, value)

    monkeypatch.setattr(torch.autograd.function.FunctionCtx, "set_materialize_grads", spy)
    mine = pt.convert(make(), strict=True)
    x = torch.randn(3, 4, 16, requires_grad=True)
    y = mine(x)
    assert asked == [(type(y.grad_fn).__name__, False)]
    assert asked[0][0].endswith("NormFnBackward")
    y.backward(torch.randn_like(y))
    assert x.grad is not None and mine.weight.grad is not None


def test_stats_outputs_reach_the_backward_as_none(monkeypatch):
    """``differentiable(stats_outputs=k)``: the last *k* outputs' gradients arrive as None,
    not as zero tensors; an ordinary family's arrive materialized."""
    monkeypatch.setattr(_compile, "define", lambda *a, **k: None)  # no op registered
    seen = []

    def run(x):
        return x * 2, torch.ones(3)

    def setup(ctx, inputs, output):
        ctx.mark_non_differentiable(output[1])

    def backward(ctx, dy, dstats):
        seen.append(dstats)
        return (dy * 2,)

    for k, want in ((1, None), (0, "zeros")):
        fn, op = _compile.differentiable("probe", run, None, setup, backward, stats_outputs=k)
        assert op is None
        x = torch.randn(3, requires_grad=True)
        y, _ = fn.apply(x)
        y.sum().backward()
        torch.testing.assert_close(x.grad, torch.full((3,), 2.0))
        got = seen.pop()
        assert got is None if want is None else torch.equal(got, torch.zeros(3))


def test_eager_only_modules_still_compile():
    """LRN runs by Python under compile (dynamo skips its frame), with eager's result."""
    m = pt.convert(nn.Sequential(nn.Conv2d(3, 4, 3), nn.LocalResponseNorm(3)).double())
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    ye = m(x)
    base.CALLS.clear()
    yc = torch.compile(m, backend="eager")(x)
    torch.testing.assert_close(yc, ye)
    assert "dnn_lrn" in base.CALLS


def test_rnns_run_eager_only_whenever_dynamo_is_loaded(monkeypatch):
    """Dynamo refuses to trace ``nn.RNNBase`` modules and runs their forward eagerly while it
    still compiles the frames that forward calls (pycudnn's RNN code, which it cannot trace:
    a guard error on the GPU machine). So once dynamo is loaded, the converted RNNs take the
    eager-only (``torch.compiler.disable``d) path even when not tracing."""
    import torch._dynamo  # loaded, as under any torch.compile

    from pycudnn.torch import rnn

    seen = []
    for name in ("_rnn_eager", "rnn_forward"):  # each records itself, then runs torch's RNN
        monkeypatch.setattr(rnn, name, lambda m, x, hx, f, n=name: seen.append(n) or f(x, hx))
    lstm = pt.convert(nn.LSTM(4, 6, batch_first=True).double())
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    y = lstm(x)[0]
    assert seen == ["_rnn_eager"]
    yc = torch.compile(lstm, backend="eager")(x)[0]
    torch.testing.assert_close(yc, y)
    assert seen == ["_rnn_eager", "_rnn_eager"]
