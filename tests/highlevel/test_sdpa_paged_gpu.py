"""GPU tests of ``dnn_sdpa_paged`` (marker ``gpu``; skipped without a device or without torch).
Run on the GPU machine:
``PYTHONPATH=. python3 -m pytest -m gpu -q tests/highlevel/test_sdpa_paged_gpu.py``.

Each case fills a paged KV cache through a shuffled page table (blocks of a shared pool, spare
blocks filled with garbage), then checks the paged attention against

* the contiguous equivalent: the same keys and values gathered into ``(B, H_k, S_kv, D)`` and run
  through ``dnn_sdpa`` with the same lengths and mask, and
* a float32 matmul-softmax-matmul reference from an explicit mask (padding, bottom-right causal),

on valid query rows only: decode (``S_q = 1``) and prefill (``S_q > 1``), float16 and bfloat16,
grouped-query and multi-query heads, D 64 and 128, block sizes 16 and 64, random key lengths,
K and V sharing one table or each its own, the caches packed or in vLLM's ``(num_blocks,
block_size, H_k, D)`` storage, a table wider than ``max_seqlen_kv`` needs. Outputs are poisoned
with NaN before the call.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import pycudnn  # noqa: E402
from pycudnn.highlevel import _call  # noqa: E402

pytestmark = pytest.mark.gpu
NEG = float("-inf")

# (dtype, B, H, H_k, S_q, D, block, max_s, causal, options)
CASES = [
    ("float16", 4, 8, 2, 1, 128, 16, 200, False, {}),  # decode, GQA, default seq_lens_q
    ("bfloat16", 3, 8, 8, 1, 64, 64, 300, True, dict(own_v=True)),  # causal decode (9.10+)
    ("float16", 3, 8, 2, 32, 64, 16, 160, True, dict(lens_q=True)),  # prefill, causal
    ("bfloat16", 2, 16, 4, 48, 128, 64, 190, True, dict(nhd=True, wide=3, lens_q=True, bshd=True)),
    ("bfloat16", 2, 4, 4, 16, 64, 16, 100, False, dict(lens_q=True, alloc=True, bshd=True)),
    ("float16", 5, 8, 1, 1, 128, 64, 256, False, dict(nhd=True, own_v=True)),  # MQA decode
    ("float16", 2, 8, 2, 24, 64, 16, 96, True, dict(bshd=True)),  # prefill, default seq_lens_q
]


def _like_q(b, h, sq, d, dt, bshd, fill=None, gen=None):
    """A (B, H, S_q, D) array, packed or as the transpose(1, 2) view of (B, S_q, H, D)."""
    shape = (b, sq, h, d) if bshd else (b, h, sq, d)
    if fill is None:
        x = torch.randn(shape, generator=gen, device="cuda", dtype=dt)
    else:
        x = torch.full(shape, fill, device="cuda", dtype=dt)
    return x.transpose(1, 2) if bshd else x


def _cache(nb, hk, bs, d, dt, nhd, gen):
    """A (num_blocks, H_k, block_size, D) cache: packed, or vLLM's (num_blocks, block_size,
    H_k, D) storage seen through transpose(1, 2)."""
    if nhd:
        return torch.randn(nb, bs, hk, d, generator=gen, device="cuda", dtype=dt).transpose(1, 2)
    return torch.randn(nb, hk, bs, d, generator=gen, device="cuda", dtype=dt)


def _table(b, pages, nb, gen, wide=0):
    """A shuffled int32 (B, pages + wide) table of distinct blocks (extra columns: garbage)."""
    perm = torch.randperm(nb, generator=gen, device="cuda")[: b * (pages + wide)]
    return perm.view(b, pages + wide).to(torch.int32)


def _gather(cache, table, pages, max_s):
    """The contiguous (B, H_k, max_s, D) equivalent of *cache* read through *table*."""
    blocks = cache[table[:, :pages].long()]  # (B, pages, H_k, block, D)
    b, _p, hk, bs, d = blocks.shape
    return blocks.permute(0, 2, 1, 3, 4).reshape(b, hk, pages * bs, d)[:, :, :max_s].contiguous()


def _reference(q, k, v, lens_q, lens_kv, causal, scale):
    """float32 attention with the explicit padding and bottom-right causal mask."""
    b, h, sq, _d = q.shape
    skv = k.shape[2]
    rep = h // k.shape[1]
    k, v = k.float().repeat_interleave(rep, 1), v.float().repeat_interleave(rep, 1)
    i = torch.arange(sq, device="cuda").view(sq, 1)
    j = torch.arange(skv, device="cuda").view(1, skv)
    mask = torch.zeros(b, 1, sq, skv, device="cuda")
    for n in range(b):
        lq, lk = int(lens_q[n]), int(lens_kv[n])
        keep = j < lk
        if causal:
            keep = keep & (j <= i + lk - lq)
        mask[n, 0].masked_fill_(~keep, NEG)
    s = q.float() @ k.transpose(-1, -2) * scale + mask
    live = torch.isfinite(s).any(-1, keepdim=True)
    p = torch.softmax(s.masked_fill(~live, 0.0), -1) * live
    return p @ v


def _rows(lens_q, sq):
    """(B, 1, S_q, 1) boolean of the valid query rows."""
    return (torch.arange(sq, device="cuda").view(1, 1, sq, 1) < lens_q.view(-1, 1, 1, 1)).expand(
        -1, 1, sq, 1
    )


def _close(mine, ref, rows, what, tol):
    mine = mine.float()
    keep = rows.expand_as(ref)
    assert not torch.isnan(mine[keep]).any(), f"{what}: NaN in a valid row"
    err = (mine[keep] - ref[keep]).abs().max() / max(ref[keep].abs().max().item(), 1e-6)
    assert err < tol, f"{what}: relative error {err:.3g}"


@pytest.mark.parametrize(
    ("dtype", "b", "h", "hk", "sq", "d", "bs", "max_s", "causal", "opts"), CASES
)
def test_paged_against_contiguous_and_float32(dtype, b, h, hk, sq, d, bs, max_s, causal, opts):
    if causal and sq == 1 and _call.cudnn_version() < 91000:
        pytest.skip("a causal decode needs cuDNN 9.10 (refused below: tested on the CPU tier)")
    dt = getattr(torch, dtype)
    gen = torch.Generator(device="cuda").manual_seed(1000 * b + 10 * sq + d)
    pages = math.ceil(max_s / bs)
    wide = opts.get("wide", 0)
    nb = b * (pages + wide) + 7  # spare blocks the tables never name
    k_cache = _cache(nb, hk, bs, d, dt, opts.get("nhd", False), gen)
    v_cache = _cache(nb, hk, bs, d, dt, opts.get("nhd", False), gen)
    table_k = _table(b, pages, nb, gen, wide)
    table_v = _table(b, pages, nb, gen, wide) if opts.get("own_v") else table_k
    q = _like_q(b, h, sq, d, dt, opts.get("bshd", False), gen=gen)
    lens_kv = torch.randint(sq, max_s + 1, (b,), generator=gen, device="cuda", dtype=torch.int32)
    lens_kv[0] = max_s  # one sequence fills the cache
    if opts.get("lens_q"):
        lens_q = torch.randint(1, sq + 1, (b,), generator=gen, device="cuda", dtype=torch.int32)
    else:
        lens_q = torch.full((b,), sq, device="cuda", dtype=torch.int32)
    lens_kv = torch.maximum(lens_kv, lens_q)  # the new queries are part of the cached keys
    scale = 1.0 / math.sqrt(d)
    kw = dict(
        max_seqlen_kv=max_s,
        is_causal=causal,
        page_table_v=table_v if opts.get("own_v") else None,
        seq_lens_q=lens_q if opts.get("lens_q") else None,
    )
    if opts.get("alloc"):
        out = pycudnn.dnn_sdpa_paged(q, k_cache, v_cache, table_k, lens_kv, **kw)
    else:
        out = _like_q(b, h, sq, d, dt, opts.get("bshd", False), fill=float("nan"))
        pycudnn.dnn_sdpa_paged(q, k_cache, v_cache, table_k, lens_kv, out=out, **kw)
    out = torch.from_dlpack(out) if not isinstance(out, torch.Tensor) else out
    assert out.shape == (b, h, sq, d) and out.dtype == dt

    k = _gather(k_cache, table_k, pages, max_s)
    v = _gather(v_cache, table_v, pages, max_s)
    dense = torch.full((b, h, sq, d), float("nan"), device="cuda", dtype=dt)
    mask_kw = dict(is_causal=True, diagonal_alignment="bottom_right") if causal else {}
    pycudnn.dnn_sdpa(q, k, v, seq_lens_q=lens_q, seq_lens_kv=lens_kv, out=dense, **mask_kw)
    rows = _rows(lens_q, sq)
    ref = _reference(q, k, v, lens_q, lens_kv, causal, scale)
    tol = 2e-2 if dt == torch.float16 else 4e-2
    _close(out, dense.float(), rows, "paged vs contiguous dnn_sdpa", tol / 2)
    _close(out, ref, rows, "paged vs float32 reference", tol)


def test_paged_call_is_cached_and_reads_new_pages(monkeypatch):
    """The second call reuses the entry and reads what the table says now (a new table, new
    lengths: the values live on the device, the graph stays)."""
    from pycudnn.highlevel.attention import _graph

    builds = []
    real = _graph.build
    monkeypatch.setattr(_graph, "build", lambda *a: builds.append(1) or real(*a))
    pycudnn.clear_caches()
    dt = torch.float16
    gen = torch.Generator(device="cuda").manual_seed(7)
    b, h, hk, d, bs, max_s = 2, 8, 2, 64, 16, 64
    pages, nb = max_s // bs, 2 * (max_s // bs) + 4
    k_cache = _cache(nb, hk, bs, d, dt, False, gen)
    v_cache = _cache(nb, hk, bs, d, dt, False, gen)
    q = torch.randn(b, h, 1, d, generator=gen, device="cuda", dtype=dt)
    ones = torch.ones(b, device="cuda", dtype=torch.int32)
    for trial in range(2):
        table = _table(b, pages, nb, gen)
        lens_kv = torch.randint(1, max_s + 1, (b,), generator=gen, device="cuda", dtype=torch.int32)
        out = pycudnn.dnn_sdpa_paged(q, k_cache, v_cache, table, lens_kv)
        assert len(builds) == 1  # built once, then served from the call cache
        k = _gather(k_cache, table, pages, max_s)
        v = _gather(v_cache, table, pages, max_s)
        ref = _reference(q, k, v, ones, lens_kv, False, 1.0 / math.sqrt(d))
        _close(torch.from_dlpack(out), ref, _rows(ones, 1), f"call {trial}", 2e-2)
