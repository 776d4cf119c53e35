"""Fused regions under ``torch.compile`` on the CPU: the region as its custom ops
(``pycudnn::region_eval``, ``region_train``, ``region_train_grad``) replaying launch programs.

The fakes tier plus the pointer fakes of ``test_torch_program.py`` (each replayed launch rebuilds
its operands at the addresses it is given), so the ops' programs really read and write the
arena whose layout the fakes computed: a wrong offset, stride or slot gives a wrong number.
Outputs, gradients and running statistics are compared with the unfused torch model in float64
over several compiled steps; cuDNN's numbers, streams and CUDA graphs are the GPU tier's
(``test_torch_region_ops_gpu.py``).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch.library, "custom_op") or not hasattr(torch, "compiler"):
    pytest.skip("torch.library.custom_op needs torch >= 2.4", allow_module_level=True)
nn = torch.nn

import test_torch_fuse as tf  # noqa: E402  (tests/torch_adapter is on sys.path)
import test_torch_program as tp  # noqa: E402
from test_torch_fuse import bn_act, fakes  # noqa: E402, F401  (fixtures)
from test_torch_program import lean  # noqa: E402, F401  (fixture)

from pycudnn.torch import fuse, region_ops  # noqa: E402


def _graphs():
    """A backend that keeps every traced node's target (autograd.Function bodies included)."""
    seen: list[str] = []

    def backend(gm, inputs):
        from torch._functorch.aot_autograd import aot_module_simplified

        def keep(g, _):
            seen.extend(str(n.target) for n in g.graph.nodes)
            return g.forward

        return aot_module_simplified(gm, inputs, fw_compiler=keep, bw_compiler=keep)

    return backend, seen


def _regions(model):
    return [r for _, r in fuse.regions(model)]


def _cin(make):
    return 8 if make is tf.Bottleneck else 4 if make is tf.BasicBlock else 3


@pytest.mark.usefixtures("lean")
@pytest.mark.parametrize("make", [tf.BasicBlock, tf.Bottleneck, tp.Two], ids=lambda f: f.__name__)
def test_compiled_training_runs_the_region_ops_and_replays(make):
    """fullgraph: one forward and one backward op per region (no chain ops), torch's numbers
    at every step, and from the second step on no launch that is not a replay."""
    torch._dynamo.reset()
    ref, mine = tf._pair(make)
    backend, seen = _graphs()
    compiled = torch.compile(mine, backend=backend, fullgraph=True)
    for step in range(3):
        n = len(tp.LAUNCHES)
        tf._same_step(ref, mine, tp._x(_cin(make)), compiled)
        if step:
            assert len(tp.LAUNCHES) == n  # every launch a replay
    regions = _regions(mine)
    assert sum("region_train.default" in t for t in seen) == len(regions), seen
    assert sum("region_train_grad.default" in t for t in seen) == len(regions), seen
    assert not any("conv_bn_train" in t for t in seen), seen
    for r in regions:
        for progs in region_ops.spec_of(r.op_key).train.values():
            assert progs.fwd is not None and not progs.reason, progs.reason
            assert all(isinstance(v, tuple) for v in progs.bwd.values()), progs.bwd
    torch._dynamo.reset()


@pytest.mark.usefixtures("lean")
def test_compiled_eval_runs_one_op_per_region_and_replays():
    torch._dynamo.reset()
    ref, mine = tf._pair(tp.Two)
    ref.eval()
    mine.eval()
    backend, seen = _graphs()
    compiled = torch.compile(mine, backend=backend, fullgraph=True)
    for step in range(3):
        n = len(tp.LAUNCHES)
        x = tp._x(3)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), ref(x), rtol=1e-9, atol=1e-9)
        if step:
            assert len(tp.LAUNCHES) == n
    assert sum("region_eval.default" in t for t in seen) == len(_regions(mine)), seen
    assert not any("conv_fused" in t for t in seen), seen
    with torch.no_grad():  # parameters changed in place: the graph folds them again
        for m in (ref, mine):
            m.layer[0].bn1.weight.mul_(1.5)
            m.layer[1].conv1.weight.mul_(0.5)
            m.layer[1].bn3.running_var.add_(0.25)
        x = tp._x(3)
        torch.testing.assert_close(compiled(x), ref(x), rtol=1e-9, atol=1e-9)
    torch._dynamo.reset()


@pytest.mark.usefixtures("lean")
def test_compiled_training_without_gradient_updates_statistics():
    torch._dynamo.reset()
    ref, mine = tf._pair(tp.Two)
    compiled = torch.compile(mine, backend="aot_eager", fullgraph=True)
    for _ in range(3):
        x = tp._x(3)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), ref(x), rtol=1e-9, atol=1e-9)
    for (n, a), b in zip(mine.named_buffers(), ref.buffers(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=n)
    torch._dynamo.reset()


@pytest.mark.usefixtures("lean")
def test_the_fakes_lay_out_what_the_real_ops_return():
    """``torch.library.opcheck`` of the three ops on a Bottleneck's region: schemas, fakes
    (the outputs' and the arena's shapes, dtypes and strides), the declared mutation of the
    running averages, AOT dispatch."""
    _, mine = tf._pair(tf.Bottleneck)
    (r,) = _regions(mine)
    x = tp._x(8)
    ws = [fc.parts[0].weight.detach() for fc in r.parts]
    gs = [fc.parts[1].weight.detach() for fc in r.parts]
    bs = [fc.parts[1].bias.detach() for fc in r.parts]
    running = torch.cat([t for bn in r._bns for t in (bn.running_mean, bn.running_var)])
    params = [v for bn in r._bns for v in (bn.eps, bn.momentum)]
    args = (r.op_key, [x], ws, gs, bs, running, params)
    # (not the AOT dispatch test: the arena's alignment padding is never written, so two runs'
    # arenas differ there; the compiled tests above run the op through AOTAutograd)
    checks = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(torch.ops.pycudnn.region_train, args, test_utils=checks)
    *outs, arena, new = torch.ops.pycudnn.region_train(*args)
    assert new.shape == running.shape and not torch.equal(new, running)  # updated, returned
    _, nbytes, metas = region_ops.saved_layout(region_ops.spec_of(r.op_key), [x], ws, gs, params)
    assert arena.shape == (nbytes,) and arena.dtype == torch.uint8
    assert [(tuple(o.shape), o.stride(), o.dtype) for o in outs] == metas
    dy = [torch.randn_like(o) for o in outs]
    for need in ([1] * 10, [0] + [1, 0, 1] * 3):
        grad = (r.op_key, dy, outs, [x], ws, gs, bs, arena, params, need)
        torch.library.opcheck(torch.ops.pycudnn.region_train_grad, grad)
    ev = (r.op_key, [x], _fold_params(r), [fc.parts[1].eps for fc in r.parts])
    torch.library.opcheck(torch.ops.pycudnn.region_eval, ev)


def _fold_params(r) -> list:
    return [t if t is None else t.detach() for fc in r.parts for t in fc.fold_sources()]


@pytest.mark.usefixtures("lean")
def test_the_eval_op_folds_as_the_eager_chains_do_and_keeps_the_folds():
    """``region_folds``: every chain's fold at once equals each chain's own (fold_params, the
    eager path's), bitwise; kept between calls (same tensors back, no recomputation) until a
    parameter changes in place, then refolded in the same memory; a second model (another
    first weight) gets its own folds; non-uniform epsilons and chains without a convolution
    bias or an affine batch norm among ones with them."""
    from pycudnn.torch import region_folds

    _, mine = tf._pair(tf.Bottleneck)
    (r,) = _regions(mine)
    for i, fc in enumerate(r.parts):  # mixed: conv bias on one, eps differing
        fc.parts[1].eps = 1e-5 * (i + 1)
    r.parts[0].parts[0].bias = nn.Parameter(torch.randn(r.parts[0].parts[0].out_channels).double())
    with torch.no_grad():
        for fc in r.parts:
            fc.parts[1].running_var.uniform_(0.5, 2.0)
            fc.parts[1].running_mean.normal_()
    x = tp._x(8)
    params, eps = _fold_params(r), [fc.parts[1].eps for fc in r.parts]
    store: dict = __import__("collections").OrderedDict()
    ws, bs = region_folds.fold(store, params, eps, x, torch.channels_last)
    for fc, w, b in zip(r.parts, ws, bs, strict=True):
        w0, b0 = fc.folded(x.dtype, torch.channels_last)
        assert torch.equal(w, w0) and torch.equal(b, b0)
        assert w.is_contiguous(memory_format=torch.channels_last)
    again = region_folds.fold(store, params, eps, x, torch.channels_last)
    assert all(a is b for a, b in zip(again[0] + again[1], ws + bs, strict=True))  # kept
    with torch.no_grad():
        r.parts[2].parts[1].weight.mul_(3.0)  # in place: a new version
    ws2, bs2 = region_folds.fold(store, params, eps, x, torch.channels_last)
    assert ws2[2].data_ptr() == ws[2].data_ptr()  # the same memory, refolded
    w0, b0 = r.parts[2].folded(x.dtype, torch.channels_last)
    assert torch.equal(ws2[2], w0) and torch.equal(bs2[2], b0)
    other = [t if t is None else t.clone() for t in params]
    got = region_folds.fold(store, other, eps, x, torch.channels_last)
    assert len(store) == 2 and got[0][0].data_ptr() != ws[0].data_ptr()
    nchw = region_folds.fold(store, params, eps, x, torch.contiguous_format)[0]
    assert nchw[1].is_contiguous() and torch.equal(nchw[1], ws2[1])
    for dt in (torch.float32, torch.bfloat16):  # float32 arithmetic, rounded once
        half = region_folds.fold(store, params, eps, x.to(dt), torch.channels_last)
        for fc, w, b in zip(r.parts, *half, strict=True):
            w0, b0 = fc.folded(dt, torch.channels_last)
            assert w.dtype == dt and torch.equal(w, w0) and torch.equal(b, b0)


@pytest.mark.usefixtures("lean")
def test_copies_of_a_model_share_the_region_spec():
    """``copy.deepcopy`` keeps the key: the copy's region has the same structure, so its
    compiled calls may use the same programs (each call gives its own tensors)."""
    import copy

    _, mine = tf._pair(tf.BasicBlock)
    other = copy.deepcopy(mine)
    assert _regions(other)[0].op_key == _regions(mine)[0].op_key
    with pytest.raises(KeyError, match="no fused region is registered under key -1"):
        region_ops.spec_of(-1)
