"""GPU tests of transformers' GPT-2 block as one launch program (marker ``gpu``; skipped without a
device, torch or transformers): :mod:`pycudnn.torch.transformers_block`.

A GPT-2 built from a small config (no weights) in bfloat16 with ``attn_implementation="pycudnn"``,
converted (its blocks become programs), against the same model converted with its blocks kept
transformers' (``exclude``: the layer norms, GELUs and attention route as before), the
unconverted model with ``"sdpa"`` and a float32 copy:

* three training steps, with transformers' default cache (its keys and values handed over as
  the block's outputs) and without it: the blocks replay their programs (hits counted), and the
  logits and every parameter's gradient equal the transformers-block copy's to bfloat16 rounding
  (the same launches; the products' gradients by the same torch operations), and are within
  twice torch's own bfloat16 distance to float32;
* the cache the model returns holds the transformers-block copy's keys and values;
* evaluation without a gradient, then a greedy decode (each token after the prompt a program
  too: the keys appended to the cache first, the attention over all of them by the route's
  store) give the transformers-block copy's outputs and tokens, the tokens replaying;
* a padding mask, and dropout in training, run transformers' own ``forward`` (no hit).

Run on the GPU machine: ``PYTHONPATH=. python3 -m pytest -m gpu -q
tests/torch_adapter/test_torch_transformers_block_gpu.py``.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")

import torch_gpu  # noqa: E402  (tests/support)

import pycudnn.torch as pt  # noqa: E402
from pycudnn.torch import transformers_block  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = "cuda"


@pytest.fixture(autouse=True)
def _exact_math():
    with torch_gpu.exact_math():
        yield


def _is_block(m: torch.nn.Module) -> bool:
    return type(m).__name__ == "GPT2Block"


def _models(dropout: float = 0.0) -> tuple:
    cfg = tf.GPT2Config(
        vocab_size=256, n_positions=128, n_embd=256, n_layer=2, n_head=4,
        resid_pdrop=dropout, embd_pdrop=0.0, attn_pdrop=dropout,
    )  # fmt: skip
    torch.manual_seed(0)
    f32 = tf.GPT2LMHeadModel._from_config(cfg, attn_implementation="sdpa").to(DEV)
    ref = copy.deepcopy(f32).to(torch.bfloat16)
    pt.register_transformers()
    plain = copy.deepcopy(ref)
    plain.set_attn_implementation("pycudnn")
    pt.convert(plain, exclude=_is_block)
    mine = copy.deepcopy(ref)
    mine.set_attn_implementation("pycudnn")
    pt.convert(mine)
    return f32, ref, plain, mine


def _blocks(m: torch.nn.Module) -> list:
    return [b for b in m.modules() if isinstance(b, transformers_block.TransformersGPT2Block)]


def _hits(m: torch.nn.Module) -> int:
    return sum(transformers_block.block_hits(b) for b in _blocks(m))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "no-cache"])
def test_training_steps_replay_the_program_and_agree(use_cache):
    f32, ref, plain, mine = _models()
    assert len(_blocks(mine)) == 2 and not _blocks(plain)
    torch.manual_seed(1)
    ids = torch.randint(0, 256, (4, 96), device=DEV)

    def step(m: torch.nn.Module) -> tuple:
        m.zero_grad(set_to_none=True)
        out = m(input_ids=ids, labels=ids, use_cache=use_cache)
        out.loss.backward()
        grads = {n: p.grad for n, p in m.named_parameters() if p.grad is not None}
        return out, grads

    for i in range(3):
        got, want = step(mine), step(plain)
        assert _hits(mine) == 2 * i, _hits(mine)  # the first step records, the next replay
        assert torch.isfinite(got[0].logits).all()
        assert _rel(got[0].logits, want[0].logits) <= 1e-2, i
        assert set(got[1]) == set(want[1])
        for n, g in got[1].items():
            assert _rel(g, want[1][n]) <= 2e-2, (i, n, _rel(g, want[1][n]))
        if use_cache:
            ca, cb = got[0].past_key_values, want[0].past_key_values
            for layer in range(2):
                for kind in ("keys", "values"):
                    a = getattr(ca.layers[layer], kind)
                    b = getattr(cb.layers[layer], kind)
                    assert a.shape == b.shape and torch.equal(a, b), (layer, kind)
        else:
            assert got[0].past_key_values is None
    run = torch_gpu.lm_grads
    torch_gpu.assert_lm_agree(run(mine, ids), run(ref, ids), run(f32, ids))


def test_a_gradient_through_the_cache_reaches_the_parameters():
    _, _, plain, mine = _models()
    torch.manual_seed(2)
    ids = torch.randint(0, 256, (2, 64), device=DEV)
    grads = []
    for m in (mine, plain):
        for _ in range(2):  # the second call replays
            m.zero_grad(set_to_none=True)
            out = m(input_ids=ids, use_cache=True)
            keys = out.past_key_values.layers[1].keys
            (out.logits.float().square().mean() + keys.float().square().mean()).backward()
        grads.append({n: p.grad for n, p in m.named_parameters() if p.grad is not None})
    assert _hits(mine) >= 2
    for n, g in grads[0].items():
        assert _rel(g, grads[1][n]) <= 2e-2, (n, _rel(g, grads[1][n]))


def test_evaluation_and_a_decode_give_the_transformers_blocks_outputs():
    _, _, plain, mine = _models()
    mine.eval()
    plain.eval()
    torch.manual_seed(3)
    ids = torch.randint(1, 256, (4, 48), device=DEV)  # (no pad token: generate would mask it)
    with torch.no_grad():
        for i in range(2):
            a = mine(input_ids=ids, use_cache=False).logits
            b = plain(input_ids=ids, use_cache=False).logits
            assert _rel(a, b) <= 1e-2, i
        assert _hits(mine) == 2
        kw = {"max_new_tokens": 12, "do_sample": False, "pad_token_id": 0}
        ta = mine.generate(ids[:, :16], **kw)
        tb = plain.generate(ids[:, :16], **kw)
    assert (ta == tb).float().mean().item() >= 0.9, (ta, tb)  # bfloat16 ties may differ late
    # the prompt and the first token record; each later token replays, per block
    assert _hits(mine) >= 2 + 2 * 9, _hits(mine)


def test_a_padding_mask_and_dropout_run_transformers_own_forward():
    _, _, plain, mine = _models()
    torch.manual_seed(4)
    ids = torch.randint(0, 256, (2, 32), device=DEV)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    with torch.no_grad():
        for _ in range(2):
            a = mine(input_ids=ids, attention_mask=mask, use_cache=False).logits
            b = plain(input_ids=ids, attention_mask=mask, use_cache=False).logits
    assert _hits(mine) == 0
    assert _rel(a[1], b[1]) <= 1e-2
    _, _, _, wet = _models(dropout=0.1)
    wet.train()
    for _ in range(2):
        wet(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    assert _hits(wet) == 0
    assert not any(b for b in _blocks(wet) if transformers_block.block_hits(b))
