"""Where a Llama training step's time goes with pycudnn's attention routed (issue 37): HF
transformers' ``LlamaForCausalLM`` (4 layers, hidden 1024, 16/4 heads, batch 4x1024, bfloat16,
random init), each model built from its own copy of the config, with
``attn_implementation="sdpa"`` (twice: the control pair), ``"pycudnn"``, and ``"pycudnn"`` plus
``pycudnn.torch.convert``. Per side: which attention ran (pycudnn's ``SDPAFn`` nodes per step),
the median wall time of a step over interleaved rounds, and from ``torch.profiler`` the GPU
kernel time and the host operations by self time. Run on the GPU machine:
``PYTHONPATH=. python3 bench/llm_profile.py [--tables]``.
"""

from __future__ import annotations

import copy
import statistics
import sys
import time


def main(argv: list[str] | None = None) -> int:
    import torch
    import transformers as tf
    from torch.profiler import ProfilerActivity, profile

    import pycudnn.torch as pt

    tables = "--tables" in (sys.argv[1:] if argv is None else argv)
    pt.register_transformers()
    cfg = tf.LlamaConfig(
        hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=16,
        num_key_value_heads=4, max_position_embeddings=1024, vocab_size=8192,
    )  # fmt: skip
    torch.manual_seed(0)
    sides = {}
    for name, impl in (("sdpa", "sdpa"), ("sdpa-again", "sdpa"), ("pycudnn", "pycudnn")):
        m = tf.LlamaForCausalLM._from_config(
            copy.deepcopy(cfg), attn_implementation=impl, dtype=torch.bfloat16
        )
        sides[name] = m.cuda()
    for m in list(sides.values())[1:]:
        m.load_state_dict(sides["sdpa"].state_dict())
    conv = tf.LlamaForCausalLM._from_config(
        copy.deepcopy(cfg), attn_implementation="pycudnn", dtype=torch.bfloat16
    ).cuda()
    conv.load_state_dict(sides["sdpa"].state_dict())
    sides["pycudnn+convert"] = pt.convert(conv)
    ids = torch.randint(0, cfg.vocab_size, (4, 1024), device="cuda")

    def step(m):
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        for p in m.parameters():
            p.grad = None

    for m in sides.values():
        for _ in range(3):
            step(m)
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(15):  # interleaved rounds: a machine's drift hits every side alike
        for k, m in sides.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step(m)
            torch.cuda.synchronize()
            times[k].append((time.perf_counter() - t0) * 1e3)
    base = statistics.median(times["sdpa"])
    for k, m in sides.items():
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step(m)
            torch.cuda.synchronize()
        ka = prof.key_averages()
        n_fn = sum(e.count for e in ka if e.key == "SDPAFn")
        cpu = sum(e.self_cpu_time_total for e in ka) / 1e3
        gpu = sum(e.self_device_time_total for e in ka) / 1e3
        med = statistics.median(times[k])
        q = statistics.quantiles(times[k], n=4)
        print(
            f"{k:16s} wall {med:6.2f} ms ({med / base:.2f}x, IQR {q[2] - q[0]:.2f}) | "
            f"pycudnn SDPAFn calls {n_fn:3d} | GPU kernels {gpu:6.2f} ms | host self {cpu:6.2f} ms",
            flush=True,
        )
        if tables:
            print(ka.table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=50))
    return 0


if __name__ == "__main__":
    sys.exit(main())
