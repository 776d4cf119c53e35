"""GPU tests of ``torch.compile`` over the PyTorch adapter (marker ``gpu``; skipped without a
device or without torch).

Run on the GPU machine:
``PYTHONPATH=. python3 -m pytest -m gpu -q tests/torch_adapter/test_torch_compile_gpu.py``.

``torch.library.opcheck`` of every ``pycudnn::`` op on random CUDA inputs (float32 and bfloat16,
NCHW and channels-last; attention in float16/bfloat16), which runs cuDNN and compares the fakes'
shapes, dtypes and strides with the real outputs'; ``torch.compile`` of a converted CNN (default
mode and ``mode="reduce-overhead"``, CUDA graphs) and of a transformer block against the eager
converted model and torch's original; ``torch._dynamo.explain`` with no graph break; and the
issue's case (conv-bn-relu-pool-conv-relu-pool-linear, batch 8, 16 channels, channels-last or
not) training one step under compile with eager's gradients.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch.library, "custom_op"):
    pytest.skip("torch.library.custom_op needs torch >= 2.4", allow_module_level=True)
nn = torch.nn
F = torch.nn.functional

import torch_compile_models as models  # noqa: E402  (tests/support)
import torch_gpu  # noqa: E402  (tests/support)

import pycudnn  # noqa: E402  (torch first: both then use the same libcudnn)
import pycudnn.torch as pt  # noqa: E402
from pycudnn.torch import (  # noqa: E402, F401  (_convert: every family's ops; attention's)
    _compile,
    _convert,
    attention,
)

pytestmark = pytest.mark.gpu

DEV = "cuda"
OPS = _compile.OPS
NO_AOT = ("test_schema", "test_autograd_registration", "test_faketensor")


@pytest.fixture(autouse=True)
def _exact_math():
    with torch_gpu.exact_math():
        torch._dynamo.reset()
        yield
        torch._dynamo.reset()


def _t(*shape, dtype=torch.float32, last=False, grad=False):
    t = torch.randn(shape, device=DEV, dtype=dtype)
    if last:
        fmt = torch.channels_last if t.dim() == 4 else torch.channels_last_3d
        t = t.contiguous(memory_format=fmt)
    return t.requires_grad_(grad)


# -- opcheck: every op -------------------------------------------------------------------------
@pytest.mark.parametrize("last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("nd", [2, 3])
def test_opcheck_conv_pool_act_bn(nd, dtype, last):
    x = _t(2, 8, *(6,) * nd, dtype=dtype, last=last, grad=True)
    w = _t(8, 4, *(3,) * nd, dtype=dtype, grad=True)
    b = _t(8, dtype=dtype, grad=True)
    cfg = ([1] * nd, [1] * nd, [1] * nd, 2)
    torch.library.opcheck(OPS["conv"], (x, w, b, *cfg))
    torch.library.opcheck(OPS["conv"], (x, w, None, *cfg))
    dy = _t(*x.shape[:1], 8, *(6,) * nd, dtype=dtype, last=last)
    torch.library.opcheck(OPS["conv_dgrad"], (w, dy.requires_grad_(), list(x.shape), last, *cfg))
    torch.library.opcheck(OPS["conv_wgrad"], (x.detach(), dy.detach(), w.detach(), *cfg))
    torch.library.opcheck(OPS["pool"], (x, [2] * nd, [2] * nd, [0] * nd, "max"))
    torch.library.opcheck(OPS["pool"], (x, [3] * nd, [1] * nd, [1] * nd, "average_inc_pad"))
    for mode, coef in (("relu", 0.0), ("sigmoid", 0.0), ("elu", 1.0), ("clipped_relu", 6.0)):
        torch.library.opcheck(OPS["act"], (x, mode, coef))
    c = torch.randn(8, device=DEV)
    rm, rv = torch.zeros(8, device=DEV), torch.ones(8, device=DEV)
    xd = x.detach()
    torch.library.opcheck(OPS["bn_train"], (xd, c, c.clone(), rm, rv, 1e-5, 0.1))
    torch.library.opcheck(OPS["bn_train"], (xd, c, c.clone(), None, None, 1e-5, 0.0))
    cg = c.clone().requires_grad_()
    torch.library.opcheck(OPS["bn_eval"], (x, cg, cg.detach().clone(), rm, rv.abs(), 1e-5))


@pytest.mark.parametrize("last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_opcheck_softmax_dropout(dtype, last):
    x = _t(4, 6, 5, 5, dtype=dtype, last=last, grad=True)
    torch.library.opcheck(OPS["softmax"], (x, "accurate"))
    torch.library.opcheck(OPS["softmax"], (x, "log"))
    # a mask of cuDNN's generator differs between runs, and its reserve bytes are cuDNN's: no AOT
    # comparison of values
    torch.library.opcheck(OPS["dropout"], (x.detach(), 0.0), test_utils=NO_AOT)
    torch.library.opcheck(OPS["dropout"], (x, 0.3), test_utils=NO_AOT)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_opcheck_linear_norms_attention(dtype):
    x, w = _t(2, 5, 64, dtype=dtype, grad=True), _t(32, 64, dtype=dtype, grad=True)
    b = _t(32, dtype=dtype, grad=True)
    torch.library.opcheck(OPS["linear"], (x, w, b))
    torch.library.opcheck(OPS["linear"], (x, w, None))
    g, be = _t(64, grad=True), _t(64, grad=True)  # float32 parameters (torch's mixed case)
    torch.library.opcheck(OPS["layer_norm"], (x, g, be, [64], 1e-5, True))
    torch.library.opcheck(OPS["layer_norm"], (x.detach(), None, None, [64], 1e-5, False))
    torch.library.opcheck(OPS["rms_norm"], (x, _t(64, dtype=dtype, grad=True), [64], 1e-6, True))
    q = _t(2, 4, 16, 64, dtype=dtype, grad=True)
    kv = _t(2, 16, 4, 64, dtype=dtype).transpose(1, 2).requires_grad_()
    torch.library.opcheck(OPS["sdpa"], (q, kv, kv, None, True, None, 0.0, None, True))
    # the inference variant (no statistics): inputs that want no gradient
    torch.library.opcheck(
        OPS["sdpa"], (q.detach(), kv.detach(), kv.detach(), None, False, 0.2, 0.0, None, False)
    )
    seed = torch.tensor([1234])
    torch.library.opcheck(OPS["sdpa"], (q, kv, kv, None, False, None, 0.1, seed, True))
    bias = _t(1, 4, 16, 16, dtype=dtype, grad=True)  # an additive mask and its gradient
    torch.library.opcheck(OPS["sdpa"], (q, kv, kv, bias, False, None, 0.0, None, True))


@pytest.mark.parametrize("kind", ["bool", "bias"])
def test_compiled_attention_with_a_mask_runs_cudnn(kind):
    """A mask under torch.compile takes pycudnn::sdpa (the bias, and its gradient for a
    (1, H, S_q, S_kv) one) with eager's outputs and gradients, and torch's within tolerance."""
    dt = torch.bfloat16
    q, k, v = (_t(2, 4, 32, 64, dtype=dt, grad=True) for _ in range(3))
    if kind == "bool":
        m = torch.rand(32, 32, device=DEV) > 0.3
        m[:, 0] = True
    else:
        m = _t(1, 4, 32, 32, dtype=dt, grad=True)
    seen: list[str] = []

    def backend(gm, inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes)
        return gm.forward

    def f(q, k, v, m):
        return pt.scaled_dot_product_attention(q, k, v, attn_mask=m)

    leaves = (q, k, v) + ((m,) if kind == "bias" else ())
    dy = torch.randn(2, 4, 32, 64, device=DEV, dtype=dt)
    got = []
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    for fn in (compiled, f, F.scaled_dot_product_attention):
        y = fn(q, k, v, m)
        got.append((y, torch.autograd.grad(y, leaves, dy)))
    assert any("pycudnn.sdpa" in t for t in seen), seen
    for (y, g), (ye, ge) in ((got[0], got[1]), (got[0], got[2])):
        _close(y, ye, 2e-2)
        for a, b in zip(g, ge, strict=True):
            _close(a, b, 5e-2)


# -- torch.compile over converted models -------------------------------------------------------
def CNN():
    """The issue's model with 16 input channels and two max poolings."""
    return models.CNN(16, nn.MaxPool2d)


def Block():
    """The shared transformer block, width 128, two heads."""
    return models.Block(128, 2)


def _step(model, x):
    for p in model.parameters():
        p.grad = None
    y = model(x)
    y.float().square().sum().backward()
    return y.detach().clone(), [p.grad.clone() for p in model.parameters()]


def _twins(make, dtype=torch.float32):
    torch.manual_seed(0)
    ref = make().to(DEV, dtype)
    return ref, pt.convert(copy.deepcopy(ref), strict=True), pt.convert(copy.deepcopy(ref))


def _close(a, b, tol):
    torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
@pytest.mark.parametrize("last", [False, True], ids=["nchw", "nhwc"])
def test_compiled_cnn_equals_eager_and_torch(last, mode):
    """The issue's failing case: one training step under compile (several for CUDA graphs:
    warm-up, capture, replays) with eager's outputs, gradients and running statistics."""
    ref, eager, comp = _twins(CNN)
    x = torch.randn(8, 16, 16, 16, device=DEV)
    if last:
        x = x.contiguous(memory_format=torch.channels_last)
    compiled = torch.compile(comp, mode=mode)
    for _ in range(3 if mode else 1):
        yc, gc = _step(compiled, x)
        ye, ge = _step(eager, x)
        yr, gr = _step(ref, x)
        _close(yc, ye, 1e-4)
        _close(yc, yr, 2e-4)
        for a, b, c in zip(gc, ge, gr, strict=True):
            _close(a, b, 1e-4)
            _close(a, c, 2e-3)
    for a, b in zip(comp.buffers(), eager.buffers(), strict=True):
        _close(a, b, 1e-5)


def test_compiled_cnn_has_no_graph_break():
    _, eager, _ = _twins(CNN)
    ex = torch._dynamo.explain(eager)(torch.randn(8, 16, 16, 16, device=DEV))
    assert ex.graph_break_count == 0, ex.break_reasons


def test_compiled_cnn_eval_and_no_grad():
    ref, eager, comp = _twins(CNN)
    for m in (ref, eager, comp):
        m.eval()
    x = torch.randn(4, 16, 16, 16, device=DEV)
    with torch.no_grad():
        _close(torch.compile(comp)(x), eager(x), 1e-4)
        _close(eager(x), ref(x), 2e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_compiled_transformer_block(dtype):
    ref, eager, comp = _twins(Block, dtype)
    x = torch.randn(2, 64, 128, device=DEV, dtype=dtype)
    tol = 2e-2 if dtype == torch.float16 else 5e-2
    compiled = torch.compile(comp, fullgraph=True)
    yc, gc = _step(compiled, x)
    ye, ge = _step(eager, x)
    yr, _ = _step(ref, x)
    _close(yc, ye, tol)
    _close(yc, yr, tol)
    for a, b in zip(gc, ge, strict=True):
        _close(a, b, 10 * tol)


def test_compiled_autocast_matches_eager():
    """Autocast under compile: the same casts as eager (conv and Linear in bfloat16)."""
    _, eager, comp = _twins(CNN)
    x = torch.randn(8, 16, 16, 16, device=DEV)
    compiled = torch.compile(comp)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        yc, ye = compiled(x), eager(x)
    assert yc.dtype == ye.dtype
    _close(yc, ye, 5e-2)


def test_eager_only_modules_under_compile():
    """LRN and LSTM have no custom op: they run by Python, with eager's results."""
    torch.manual_seed(0)
    m = pt.convert(nn.Sequential(nn.Conv2d(3, 4, 3), nn.LocalResponseNorm(3)).to(DEV))
    x = torch.randn(2, 3, 8, 8, device=DEV)
    _close(torch.compile(m)(x), m(x), 1e-5)
    lstm = pt.convert(nn.LSTM(8, 16, batch_first=True).to(DEV))
    s = torch.randn(2, 5, 8, device=DEV)
    _close(torch.compile(lstm)(s)[0], lstm(s)[0], 1e-5)


def test_allow_tf32_linear_under_compile():
    _, eager, comp = _twins(lambda: nn.Sequential(nn.Linear(64, 32), nn.ReLU()))
    x = torch.randn(16, 64, device=DEV)
    with pycudnn.config.override(allow_tf32=True):
        torch._dynamo.reset()
        yc, ye = torch.compile(comp)(x), eager(x)
    _close(yc, ye, 1e-5)
