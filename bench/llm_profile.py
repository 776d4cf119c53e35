"""Where a Llama training step's time goes with pycudnn's attention routed (issue 37): HF
transformers' ``LlamaForCausalLM`` (4 layers, hidden 1024, 16/4 heads, batch 4x1024, bfloat16,
random init) with ``attn_implementation="sdpa"`` against ``"pycudnn"`` (nothing else converted),
profiled with ``torch.profiler``: per side the wall time of a step, the GPU kernel time, the
kernels by total time and the host operations by self time, and the attention calls' own
kernels. Run on the GPU machine: ``PYTHONPATH=. python3 bench/llm_profile.py``.
"""

from __future__ import annotations

import sys
import time


def main() -> int:
    import torch
    import transformers as tf
    from torch.profiler import ProfilerActivity, profile

    import pycudnn.torch as pt

    pt.register_transformers()
    cfg = tf.LlamaConfig(
        hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=16,
        num_key_value_heads=4, max_position_embeddings=1024, vocab_size=8192,
    )  # fmt: skip
    torch.manual_seed(0)
    models = {}
    for impl in ("sdpa", "pycudnn"):
        bf16 = torch.bfloat16
        m = tf.LlamaForCausalLM._from_config(cfg, attn_implementation=impl, torch_dtype=bf16)
        models[impl] = m.cuda()
    models["pycudnn"].load_state_dict(models["sdpa"].state_dict())
    ids = torch.randint(0, cfg.vocab_size, (4, 1024), device="cuda")

    def step(m):
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        for p in m.parameters():
            p.grad = None

    for m in models.values():
        for _ in range(3):
            step(m)
    torch.cuda.synchronize()
    for impl, m in models.items():
        ts = []
        for _ in range(10):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step(m)
            torch.cuda.synchronize()
            ts.append((time.perf_counter() - t0) * 1e3)
        ts.sort()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step(m)
            torch.cuda.synchronize()
        ka = prof.key_averages()
        print(f"== {impl}: wall median {ts[len(ts) // 2]:.2f} ms", flush=True)
        print(ka.table(sort_by="device_time_total", row_limit=14, max_name_column_width=60))
        print(ka.table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    sys.exit(main())
