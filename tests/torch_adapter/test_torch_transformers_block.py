"""transformers' GPT-2 block converted (:mod:`pycudnn.torch.transformers_block`) on the CPU.

The recognition by source text (:func:`~pycudnn.torch.transformers_block.source_digest`): a
digest ignores indentation and trailing spaces but no other change of the text; transformers'
own ``GPT2Block`` (where transformers is installed) converts to the twin and back, and a subclass
whose ``forward`` differs does not. On the CPU the twin runs the class's own ``forward``: a
converted GPT-2's loss and gradients equal those of the same conversion with its blocks kept;
dynamo traces it without a graph break (the twin runs the class's ``forward`` while tracing);
copies and pickles keep the twin. The program's own arithmetic -- the forward between its cuDNN
launches and the hand-written backward, with and without the cache's keys and values as outputs
-- equals torch's autograd of the same block in float64, the launches stood in by torch's
operations (the GPU tests run the real ones).
"""

from __future__ import annotations

import copy
import textwrap

import pytest

pytest.importorskip("torch")
import torch

from pycudnn import torch as pt
from pycudnn.torch import transformers_block, transformers_twins


def _f(x):
    return x + 1


def test_a_digest_ignores_indentation_and_trailing_spaces_only():
    d = transformers_block.source_digest(_f)
    assert isinstance(d, str) and len(d) == 16
    assert transformers_block.source_digest(_f) == d  # cached
    ns: dict = {}
    src = "class A:\n    def f(x):   \n        return x + 1\n"
    path = "<test>"
    exec(compile(src, path, "exec"), ns)  # no source file: no digest
    assert transformers_block.source_digest(ns["A"].f) is None
    assert transformers_block.source_digest(len) is None


def test_known_digests_name_each_part():
    assert set(transformers_block.DIGESTS) == {"block", "attention", "mlp", "conv1d"}
    for part, known in transformers_block.DIGESTS.items():
        assert known and all(len(d) == 16 for d in known), part


class NotABlock(torch.nn.Module):
    def forward(self, hidden_states, *args, **kwargs):
        return hidden_states


def test_a_class_of_other_text_is_no_block_twin():
    assert transformers_twins.twin_of(NotABlock) is None
    assert not transformers_block.TransformersGPT2Block.recognizes(NotABlock.forward)
    assert not transformers_block.TransformersGPT2Block.recognizes(None)


def _gpt2():
    tf = pytest.importorskip("transformers")
    cfg = tf.GPT2Config(
        vocab_size=128, n_positions=64, n_embd=64, n_layer=2, n_head=4,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    pt.register_transformers()
    return tf.GPT2LMHeadModel._from_config(cfg, attn_implementation="pycudnn")


def test_transformers_gpt2_block_converts_and_runs_its_own_forward_on_the_cpu():
    ref = _gpt2()
    from transformers.models.gpt2 import modeling_gpt2

    if not transformers_block.TransformersGPT2Block.recognizes(modeling_gpt2.GPT2Block.forward):
        pytest.skip("this transformers' GPT2Block.forward is not a version the twin knows")
    mine = pt.convert(copy.deepcopy(ref))
    # the same conversion with the blocks kept (the GELU twin computes torch's fused GELU)
    ref = pt.convert(ref, exclude=lambda m: type(m).__name__ == "GPT2Block")
    blocks = [m for m in mine.modules() if isinstance(m, transformers_block.TransformersGPT2Block)]
    assert len(blocks) == 2 and type(blocks[0]).__name__ == "GPT2Block"
    assert isinstance(blocks[0], modeling_gpt2.GPT2Block)
    ids = torch.randint(0, 128, (2, 16))
    a, b = mine(input_ids=ids, labels=ids), ref(input_ids=ids, labels=ids)
    a.loss.backward()
    b.loss.backward()
    assert torch.equal(a.logits, b.logits)
    for (n, p), (_, q) in zip(mine.named_parameters(), ref.named_parameters(), strict=True):
        assert torch.equal(p.grad, q.grad), n
    assert transformers_block.block_hits(blocks[0]) == 0  # the CPU: the class's own forward
    pt.convert(mine, back=True)
    assert type(mine.transformer.h[0]) is modeling_gpt2.GPT2Block


def test_an_edited_block_forward_is_not_recognised():
    pytest.importorskip("transformers")
    import inspect

    from transformers.models.gpt2 import modeling_gpt2

    src = textwrap.dedent(inspect.getsource(modeling_gpt2.GPT2Block.forward))
    assert transformers_block.source_digest(modeling_gpt2.GPT2Block.forward) is not None
    edited = src.replace("attn_output + residual", "attn_output * 2 + residual")
    assert edited != src
    import hashlib

    text = "\n".join(line.rstrip() for line in edited.strip().splitlines())
    assert hashlib.sha256(text.encode()).hexdigest()[:16] not in transformers_block.DIGESTS["block"]


def test_dynamo_traces_the_converted_gpt2_without_graph_breaks():
    ref = _gpt2()
    mine = pt.convert(copy.deepcopy(ref))
    if not any(isinstance(m, transformers_block.TransformersGPT2Block) for m in mine.modules()):
        pytest.skip("this transformers' GPT2Block.forward is not a version the twin knows")
    ids = torch.randint(0, 128, (2, 16))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(mine)(input_ids=ids)
    assert explained.graph_break_count == 0, explained.break_reasons


def test_copies_and_pickles_keep_the_twin():
    import pickle

    mine = pt.convert(_gpt2())
    if not any(isinstance(m, transformers_block.TransformersGPT2Block) for m in mine.modules()):
        pytest.skip("this transformers' GPT2Block.forward is not a version the twin knows")
    for other in (copy.deepcopy(mine), pickle.loads(pickle.dumps(mine))):
        blocks = [
            m for m in other.modules() if isinstance(m, transformers_block.TransformersGPT2Block)
        ]
        assert len(blocks) == 2
        ids = torch.randint(0, 128, (2, 16))
        assert torch.equal(other(input_ids=ids).logits, mine(input_ids=ids).logits)


# -- the program's own arithmetic, its cuDNN launches stood in by torch's operations -----------
B, T, H, D = 2, 6, 4, 8
C = H * D


@pytest.fixture
def stand_ins(monkeypatch):
    """The block program's cuDNN sites as float64 torch operations (autograd for gradients)."""
    F = torch.nn.functional

    def ln(r, i, x, w, b, eps, grad):
        mean = x.mean(-1, keepdim=True)
        inv = torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + eps)
        return (x - mean) * inv * w + b, mean, inv

    def attend(r, q, k, v, causal, scale, grad):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale), None

    def attend_grad(bd, q, k, v, o, do, st, causal, scale):
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        with torch.enable_grad():  # (a backward runs without)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
            return torch.autograd.grad(o, (q, k, v), do)

    def ln_grad(bd, tag, dy, x, w, b, mean, inv):
        x, w, b = (t.detach().requires_grad_() for t in (x, w, b))
        with torch.enable_grad():
            y = F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)
            return torch.autograd.grad(y, (x, w, b), dy)

    monkeypatch.setattr(transformers_block, "_ln", ln)
    monkeypatch.setattr(transformers_block, "_attend", attend)
    monkeypatch.setattr(transformers_block, "_attend_grad", attend_grad)
    monkeypatch.setattr(transformers_block, "_ln_grad", ln_grad)


def _plain_block(x, p, scale):
    """GPT-2's block as transformers computes it (with the converted GELU), plain torch."""
    F = torch.nn.functional
    g1, b1, wqkv, bqkv, wo, bo, g2, b2, wf, bf, wp, bp = p
    y1 = F.layer_norm(x, (C,), g1, b1, 1e-5)
    q, k, v = torch.addmm(bqkv, y1.view(-1, C), wqkv).view(B, T, 3 * C).split(C, dim=2)
    q, k, v = (z.view(B, T, H, D).transpose(1, 2) for z in (q, k, v))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    h = torch.addmm(bo, o.transpose(1, 2).reshape(-1, C), wo).view(B, T, C) + x
    y2 = F.layer_norm(h, (C,), g2, b2, 1e-5)
    f = F.gelu(torch.addmm(bf, y2.view(-1, C), wf), approximate="tanh")
    return h + torch.addmm(bp, f, wp).view(B, T, C), k, v


@pytest.mark.parametrize("kv", [False, True], ids=["no-cache", "cache"])
def test_the_block_programs_backward_is_autograds(stand_ins, kv):
    g = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) / 3).requires_grad_()

    p = [rnd(C), rnd(C), rnd(C, 3 * C), rnd(3 * C), rnd(C, C), rnd(C), rnd(C), rnd(C),
         rnd(C, 4 * C), rnd(4 * C), rnd(4 * C, C), rnd(C)]  # fmt: skip
    x = rnd(B, T, C)
    scale = D**-0.5
    cfg = (H, True, scale, 1e-5, 1e-5)
    got = transformers_block._BlockFn.apply(None, cfg, kv, [], x, *p)
    want = _plain_block(x, p, scale)
    if not kv:
        got, want = (got,), want[:1]
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    weights = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in want]
    ga = torch.autograd.grad(got, [x, *p], weights)
    gb = torch.autograd.grad(want, [x, *p], weights)
    for a, b in zip(ga, gb, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
