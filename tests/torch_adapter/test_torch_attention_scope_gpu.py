"""GPU tests of ``pycudnn.torch.use_cudnn_attention`` and ``register_transformers`` (marker
``gpu``; skipped without a device or torch; the HuggingFace tests also without transformers).

Run on the GPU machine:
``PYTHONPATH=. python3 -m pytest -m gpu -q -s
tests/torch_adapter/test_torch_attention_scope_gpu.py``.

Each model is built from a tiny config (no weights; ``torch.manual_seed(0)``), in bfloat16, with
``attn_implementation="sdpa"``, and its float32 copy is the reference: the logits and every
parameter's gradient (the language-model loss on random tokens) with the scope are within
twice torch's own bfloat16 error of the float32 ones (at least 2e-2, relative L2), and the
scope's counters say how the calls went:

* GPT-2 and Llama (grouped-query: 2 key/value heads for 4 query heads), causal without a
  padding mask: every layer's call ran cuDNN (``route.cudnn`` = layers, ``route.torch`` = 0).
* BERT (bidirectional): without a padding mask every call is counted; with one (a padded
  second sequence) every call is counted too (cuDNN's bias where transformers' mask has a shape
  it takes, torch's function otherwise), and the results still agree.
* Llama with ``attn_implementation="pycudnn"`` after ``register_transformers()`` against the
  same weights with ``"sdpa"``: same tolerance, and pycudnn's fused path ran in every layer.
* ``torch.nn.MultiheadAttention`` (batch_first, training, ``need_weights=False``): output and
  gradients, one cuDNN call.
* ``torch.compile`` of a function calling torch's function inside the scope gives the eager
  result (graph breaks allowed until pycudnn's attention is a custom op).
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import torch_gpu  # noqa: E402  (tests/support)

import pycudnn.torch as pt  # noqa: E402

pytestmark = pytest.mark.gpu

DEV = "cuda"
LAYERS = 2


@pytest.fixture(autouse=True)
def _exact_math():
    with torch_gpu.exact_math():
        yield


@pytest.fixture
def tf():
    return pytest.importorskip("transformers")


_run = torch_gpu.lm_grads
_agree = torch_gpu.assert_lm_agree


def _models(tf, cfg, auto="AutoModelForCausalLM", impl="sdpa"):
    torch.manual_seed(0)
    cls = getattr(tf, auto)
    ref = cls.from_config(cfg, attn_implementation=impl).to(DEV, torch.bfloat16).eval()
    f32 = copy.deepcopy(ref).float()
    return ref, f32


def _ids(cfg, b=2, s=32):
    g = torch.Generator(device=DEV).manual_seed(1)
    return torch.randint(0, cfg.vocab_size, (b, s), device=DEV, generator=g)


def _gpt2(tf):
    return tf.GPT2Config(
        vocab_size=128,
        n_positions=64,
        n_embd=128,
        n_layer=LAYERS,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )


def _llama(tf):
    return tf.LlamaConfig(
        vocab_size=128,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )


def _bert(tf):
    return tf.BertConfig(
        vocab_size=128,
        hidden_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )


@pytest.mark.parametrize("make", [_gpt2, _llama], ids=["gpt2", "llama"])
def test_causal_models_run_cudnn_under_the_scope(tf, make):
    cfg = make(tf)
    model, f32 = _models(tf, cfg)
    ids = _ids(cfg)
    ref = _run(model, ids)
    with pt.use_cudnn_attention() as route:
        got = _run(model, ids)
    assert (route.cudnn, route.torch) == (LAYERS, 0), route
    _agree(got, ref, _run(f32, ids))


def test_bert_under_the_scope(tf):
    cfg = _bert(tf)
    model, f32 = _models(tf, cfg, "AutoModelForMaskedLM")
    ids = _ids(cfg)
    ref = _run(model, ids)
    with pt.use_cudnn_attention() as route:
        got = _run(model, ids)
    print(f"BERT without padding: {route}")
    assert route.cudnn + route.torch == LAYERS, route
    _agree(got, ref, _run(f32, ids))
    # a padded second sequence: a mask tensor, cuDNN's bias (or torch's function)
    mask = torch.ones_like(ids)
    mask[1, 20:] = 0
    ref = _run(model, ids, mask)
    with pt.use_cudnn_attention() as route:
        got = _run(model, ids, mask)
    print(f"BERT with padding: {route}")
    assert route.cudnn + route.torch == LAYERS, route
    _agree(got, ref, _run(f32, ids, mask))


def test_attn_implementation_pycudnn(tf):
    if not hasattr(tf, "AttentionInterface"):
        pytest.skip(f"transformers {tf.__version__} has no AttentionInterface")
    assert pt.register_transformers() == "pycudnn"
    cfg = _llama(tf)
    model, f32 = _models(tf, cfg)
    torch.manual_seed(0)
    # its own config: transformers 5 writes the choice on the config (the reference would run
    # pycudnn's attention too)
    mine = tf.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="pycudnn")
    mine = mine.to(DEV, torch.bfloat16).eval()
    mine.load_state_dict(model.state_dict())
    ids = _ids(cfg)
    pt.attention_calls(reset=True)
    got = _run(mine, ids)
    # (counted per call: a call bound to an earlier call's signature skips the decision)
    calls = pt.attention_calls(reset=True).transformers
    if hasattr(tf, "AttentionMaskInterface"):  # "sdpa"'s mask function: none when causal
        assert (calls.cudnn, calls.torch) == (LAYERS, 0), calls
    else:
        assert calls.cudnn + calls.torch == LAYERS, calls
    _agree(got, _run(model, ids), _run(f32, ids))


def test_multihead_attention_under_the_scope():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(256, 4, batch_first=True, device=DEV, dtype=torch.bfloat16)
    f32 = copy.deepcopy(mha).float()
    x = torch.randn(4, 64, 256, device=DEV)

    def run(m, dtype):
        m.zero_grad(set_to_none=True)
        xi = x.to(dtype).requires_grad_()
        y = m(xi, xi, xi, need_weights=False)[0]
        y.float().square().mean().backward()
        grads = {n: p.grad for n, p in m.named_parameters()}
        grads["input"] = xi.grad
        return y, grads

    ref = run(mha, torch.bfloat16)
    with pt.use_cudnn_attention() as route:
        got = run(mha, torch.bfloat16)
    assert (route.cudnn, route.torch) == (1, 0), route
    _agree(got, ref, run(f32, torch.float32))


def test_compiled_function_under_the_scope():
    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    g = torch.Generator(device=DEV).manual_seed(0)
    q, k, v = (
        torch.randn(2, 4, 128, 64, device=DEV, dtype=torch.bfloat16, generator=g) for _ in range(3)
    )
    with pt.use_cudnn_attention():
        want = pt.scaled_dot_product_attention(q, k, v, is_causal=True)
        got = torch.compile(f)(q, k, v)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
