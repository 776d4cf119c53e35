"""Do a converted Llama's (or GPT-2's) module bindings hit inside its training step and its
decode? (issue 37)

Builds ``bench/llm_profile.py``'s Llama (``--arch gpt2``: its GPT-2; 4 layers, hidden 1024,
bfloat16, random init) with
``attn_implementation="pycudnn"``, converts it, runs three training steps and one 32-token
greedy decodes, and prints per module class how many modules there are, how many hold a
binding (:mod:`pycudnn.torch._binding`; ``bound`` counts their bound signatures), their hits,
their bound gradient entries, and how many stopped binding; then the same after each of
``--decodes`` decodes (a prompt's signature, then a token's, each time). Run on the GPU
machine::

    PYTHONPATH=. python3 bench/binding_hits.py [--arch llama|gpt2] [--decodes 6]

First run (sixth session, H200): after 3 training steps the 29 ``Linear`` modules held 29
bindings, 58 hits and 58 gradient entries; a 32-token decode added 870 hits. transformers'
``LlamaRMSNorm`` is its own class (not converted), so no ``RMSNorm`` row appears.
"""

from __future__ import annotations

import argparse
import collections
import time
from typing import Any

import llm_profile as L  # bench/ is the script's directory

# (transformers' RMS norms keep their class's name when converted)
CLASSES = ("Linear", "LayerNorm", "RMSNorm", "LlamaRMSNorm")


def report(model: Any, tag: str) -> None:
    from pycudnn.torch import _module

    c: collections.Counter = collections.Counter()
    for mod in model.modules():
        name = type(mod).__name__
        if name not in CLASSES:
            continue
        c[name, "modules"] += 1
        st = _module.STATE.get(mod)
        if st is None:
            continue
        if st.get("nobind"):
            c[name, "nobind"] += 1
        for bd in (st.get("bound") or {}).values():  # (a module's bound signatures)
            c[name, "bound"] += 1
            c[name, "hits"] += bd.hits
            c[name, "grad_entries"] += len(bd.grads)
    print(f"{tag}: " + "; ".join(f"{k[0]}.{k[1]}={v}" for k, v in sorted(c.items())), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="llama", choices=("llama", "gpt2"))
    ap.add_argument("--decodes", type=int, default=6, help="decodes after the training steps")
    args = ap.parse_args()
    arch = args.arch
    import torch
    import transformers as tf

    import pycudnn.torch as pt

    t0 = time.perf_counter()
    pt.register_transformers()
    cfg, cls = L._config(tf, arch)
    torch.manual_seed(0)
    model = cls._from_config(cfg, attn_implementation="pycudnn", dtype=torch.bfloat16).cuda()
    model = pt.convert(model)
    step = L._steps(arch, "train", cfg.vocab_size)
    for _ in range(3):
        step(model)
    torch.cuda.synchronize()
    report(model, "after 3 training steps")
    decode = L._steps(arch, "decode", cfg.vocab_size)
    for k in range(1, args.decodes + 1):
        decode(model)
        torch.cuda.synchronize()
        report(model, f"after {k} 32-token decode{'s' if k > 1 else ''}")
    print(f"done in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
