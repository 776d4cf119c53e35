"""Python function calls per step of a converted Llama / GPT-2 (issue 37): ``cProfile`` over the
sides of ``bench/llm_profile.py`` (torch's ``sdpa``, the attention route, the route plus
``convert``), 3 training steps and one 32-token greedy decode each after warm-up, printing per
side the calls per step (builtins included), the profiled time per step and, for pycudnn's
sides, the top functions by their own time. Tells Python frames from time inside C calls.

    PYTHONPATH=. python3 bench/llm_cprofile.py [llama,gpt2]

Run on the GPU machine (torch, transformers).
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
from collections.abc import Callable
from typing import Any

import llm_profile as L  # bench/ is the script's directory
import torch


def _profile(fn: Callable[[], Any], n: int) -> pstats.Stats:
    fn()
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    return pstats.Stats(pr)


def _top(st: pstats.Stats, n: int) -> str:
    s = io.StringIO()
    st.stream = s  # type: ignore[attr-defined]
    st.sort_stats("tottime").print_stats(n)
    out = s.getvalue()
    return out[out.find("ncalls") :]


def main(archs: str) -> None:
    import transformers

    for arch in archs.split(","):
        sides = L._sides(arch)
        cfg = L._config(transformers, arch)[0]
        for mode in ("train", "decode"):
            step = L._steps(arch, mode, cfg.vocab_size)
            for k, m in sides.items():
                if k == "sdpa-again":
                    continue
                for _ in range(3):
                    step(m)
                n = 3 if mode == "train" else 1
                st = _profile(lambda m=m, step=step: step(m), n)
                calls = st.total_calls / n  # type: ignore[attr-defined]
                ms = st.total_tt / n * 1e3  # type: ignore[attr-defined]
                print(f"CPROF {arch} {mode} {k:16s} python calls/step {calls:9.0f}  "
                      f"profiled host ms/step {ms:8.2f}")  # fmt: skip
                if k != "sdpa":
                    print(_top(st, 45)[:9000])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "llama,gpt2")
