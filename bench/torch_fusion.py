"""Beyond eager PyTorch (issue 26): ``convert(model, fuse=True)``, ``torch.compile`` of converted
models and transformers' attention through pycudnn, each against plain PyTorch.

Run on the GPU machine from the repository root::

    PYTHONPATH=. python3 bench/torch_fusion.py [--quick] [--only CASE[,CASE]]
    PYTHONPATH=. python3 bench/torch_fusion.py --smoke    # tiny shapes, one repetition

The method is ``bench/torch_models.py``'s (its helpers are imported): both sides in one process,
the same weights, untimed warm-up steps, then timed repetitions that alternate (the order flips
every repetition), medians compared; ratio = pycudnn / torch (below 1: pycudnn faster).

Cases (``--only`` takes these groups or a prefix of a case name):

fuse     torchvision's ResNet-50 (``weights=None``), bf16 channels-last. ``fuse-infer-b8`` and
         ``fuse-infer-b64``: ``eval()`` under ``no_grad``, torch eager against
         ``convert(copy, fuse=True)``; target <= 0.70x. ``fuse-train``: a training step (forward,
         ``F.cross_entropy``, backward) at batch 64 against the fused copy in training mode;
         target <= 0.90x; ``fuse-train-b128`` the same at batch 128 (where torch's step is
         GPU-bound). The unfused converted model is timed too (``unfused_ratio``).
compile  ``torch.compile(original)`` against ``torch.compile(convert(copy, fuse=True))`` on the
         same ResNet-50 cases, for each mode of ``--modes`` (default: ``default`` and
         ``reduce-overhead``); target <= 1.00x. The compile time of each side is reported.
llm      transformers' ``LlamaForCausalLM`` (grouped-query heads) and ``GPT2LMHeadModel`` from
         small configs (no weights), bf16, batch 8 x 512 tokens, a training step: torch eager with
         ``attn_implementation="sdpa"`` against the converted copy (Linear, norms) with
         ``attn_implementation="pycudnn"`` (``pycudnn.torch.register_transformers()``); target
         <= 1.00x. Skipped without transformers.
mm       the fused matmul + bias + GELU of ``docs/BENCHMARKS.md`` (bf16, ``dnn_matmul(a, w.t(),
         bias=, activation="gelu", out=)`` against ``F.gelu(F.linear(a, w, bias))``) on three
         shapes, GPU time (CUDA events, medians of 5 x 50 calls): the plan cuDNN's heuristics
         pick and the plan the graph builder's ``policy="autotune"`` picks (timing every engine on
         scratch buffers; ``dnn_matmul`` has no switch for it, so the bench sets the builder's
         default for that call); target <= 0.90x.

Prints one line per case at the end (``case: torch X ms pycudnn Y ms ratio Z``) after a line
naming the GPU and both cuDNN versions; writes ``$OUT/fusion.json`` when ``$OUT`` is set.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import torch_models as tm  # noqa: E402  (imports torch when present)

torch = tm.torch
if torch is not None:
    import pycudnn
    import pycudnn.torch as pt
    from bench import torch_resnet50 as rn
    from pycudnn.torch import region

GROUPS = ("fuse", "compile", "llm", "mm")
MM_SHAPES = ((8192, 4096, 4096), (4096, 4096, 4096), (8192, 11008, 4096))
INFER_BATCHES = (8, 64)
MODES = ("default", "reduce-overhead")
CASE_IDS = (
    "fuse-infer-b8",
    "fuse-infer-b64",
    "fuse-train",
    "fuse-train-b128",
    *(f"compile-{m}-{k}" for m in MODES for k in ("infer-b8", "infer-b64", "train")),
    "llm-llama",
    "llm-gpt2",
    *(f"mm-gelu-{m}x{n}x{k}" for m, n, k in MM_SHAPES),
)
TARGETS = {"fuse-infer": 0.70, "fuse-train": 0.90, "compile": 1.00, "llm": 1.00, "mm": 0.90}
TRAIN_BATCH = 64
LLM_BATCH, LLM_SEQ = 8, 512


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, one repetition")
    p.add_argument("--only", default=None, help="CASE[,CASE]: groups or case-name prefixes")
    p.add_argument("--modes", default=",".join(MODES), help="torch.compile modes, comma-separated")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument(
        "--chains",
        action="store_true",
        help="compile cases: also time a third copy compiled with region.use_programs(False)\n"
        "(each chain its own custom ops, as before the region ops) against torch",
    )
    args = p.parse_args(argv)
    args.only = tuple(s.strip() for s in args.only.split(",") if s.strip()) if args.only else ()
    for o in args.only:
        kinds = ("compile-infer-b8", "compile-infer-b64", "compile-train")  # either mode
        if not any(c.startswith(o) for c in (*CASE_IDS, *kinds)):
            p.error(f"--only: unknown item {o!r} (groups: {', '.join(GROUPS)}; or a case prefix)")
    args.modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    for m in args.modes:
        if m not in MODES:
            p.error(f"--modes: {m!r} is not one of {', '.join(MODES)}")
    args.plan = "smoke" if args.smoke else "quick" if args.quick else "full"
    return args


def wanted(case: str, only: tuple[str, ...]) -> bool:
    return not only or any(case == o or case.startswith(o) for o in only)


def target_of(case: str) -> float:
    return next(v for k, v in TARGETS.items() if case.startswith(k))


def _resnet50(train: bool, device: Any) -> Any:
    model, _ = tm.make_model("resnet50", own=True)
    model = rn.to_bf16_channels_last(model, device)
    return model.train(train)


def _pair_infer(ref: Any, mine: Any, x: Any, plan: Any, device: Any) -> dict:
    with torch.no_grad():
        for _ in range(plan.warm):
            # clones: a CUDA-graph tree's output is overwritten by the next graph's replay
            yr, ym = ref(x).clone(), mine(x).clone()
        rn.sync(device)
        res = {"logits_max_rel_diff": rn.rel_diff(ym, yr)}
        res["top1_agreement"] = (ym.argmax(1) == yr.argmax(1)).float().mean().item()
        n = plan.steps * 4 if x.shape[0] <= 8 else plan.steps
        res |= tm.timed_pair(lambda: ref(x), lambda: mine(x), n, plan.reps, device)
    return res


def _pair_train(ref: Any, mine: Any, x: Any, y: Any, plan: Any, device: Any) -> dict:
    for _ in range(plan.warm):
        lr, lm = rn.step(ref, x, y, None), rn.step(mine, x, y, None)
    rn.sync(device)
    res = {"loss_torch": lr.item(), "loss_pycudnn": lm.item()}
    res |= tm.timed_pair(
        lambda: rn.step(ref, x, y, None),
        lambda: rn.step(mine, x, y, None),
        plan.steps,
        plan.reps,
        device,
    )
    return res


def fuse_cases(args: argparse.Namespace, device: Any) -> list[dict]:
    """ResNet-50 eager against ``convert(fuse=True)`` (and the unfused converted model)."""
    plan = tm.PLANS[args.plan]
    out = []
    torch.manual_seed(0)
    for case in ("fuse-infer-b8", "fuse-infer-b64", "fuse-train", "fuse-train-b128"):
        if not wanted(case, args.only):
            continue
        train = case.startswith("fuse-train")
        ref = _resnet50(train, device)
        plain = pt.convert(copy.deepcopy(ref), strict=True)
        t0 = time.perf_counter()
        fused = pt.convert(copy.deepcopy(ref), strict=True, fuse=True)
        res: dict[str, Any] = {"case": case, "fuse_s": time.perf_counter() - t0}
        n = (
            2
            if args.smoke
            else TRAIN_BATCH
            if case == "fuse-train"
            else int(case.rsplit("-b", 1)[1])
        )
        x = tm.image_batch(n, plan.image, torch.bfloat16, device)
        if train:
            y = torch.randint(0, 1000, (n,), device=device)
            res |= _pair_train(ref, fused, x, y, plan, device)
            res["unfused_ratio"] = _pair_train(ref, plain, x, y, plan, device)["ratio"]
        else:
            res |= _pair_infer(ref, fused, x, plan, device)
            res["unfused_ratio"] = _pair_infer(ref, plain, x, plan, device)["ratio"]
        out.append(res)
        del ref, plain, fused
        tm.free(device)
    return out


def _compiled(model: Any, mode: str) -> Any:
    return torch.compile(model) if mode == "default" else torch.compile(model, mode=mode)


class _Chains:
    """A compiled fused model traced and run with ``region.use_programs(False)``: its regions
    trace into their chains' custom ops (dynamo guards on the switch, so it stays off around
    every call)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)

    def __call__(self, x: Any) -> Any:
        region.use_programs(False)
        try:
            return self.inner(x)
        finally:
            region.use_programs(True)


def compile_cases(args: argparse.Namespace, device: Any) -> list[dict]:
    """``torch.compile`` of the original against that of the fused converted model."""
    plan = tm.PLANS[args.plan]
    out = []
    for mode in args.modes:
        for kind in ("infer-b8", "infer-b64", "train"):
            case = f"compile-{mode}-{kind}"
            if not wanted(case, args.only) and not wanted(f"compile-{kind}", args.only):
                continue
            torch.manual_seed(0)
            train = kind == "train"
            ref = _resnet50(train, device)
            mine = pt.convert(copy.deepcopy(ref), strict=True, fuse=True)
            n = 2 if args.smoke else TRAIN_BATCH if train else int(kind.rsplit("-b", 1)[1])
            x = tm.image_batch(n, plan.image, torch.bfloat16, device)
            cref, cmine = _compiled(ref, mode), _compiled(mine, mode)
            res: dict[str, Any] = {"case": case, "mode": mode}
            for side, m in (("torch", cref), ("pycudnn", cmine)):
                t0 = time.perf_counter()
                if train:
                    y = torch.randint(0, 1000, (n,), device=device)
                    rn.step(m, x, y, None)
                else:
                    with torch.no_grad():
                        m(x)
                rn.sync(device)
                res[f"compile_s_{side}"] = time.perf_counter() - t0
            if train:
                res |= _pair_train(cref, cmine, x, y, plan, device)
            else:
                res |= _pair_infer(cref, cmine, x, plan, device)
            if args.chains:  # the same against the chains' ops (before the region ops)
                chains = _Chains(_compiled(pt.convert(copy.deepcopy(ref), fuse=True), mode))
                if train:
                    got = _pair_train(cref, chains, x, y, plan, device)
                else:
                    got = _pair_infer(cref, chains, x, plan, device)
                res |= {f"chains_{k}": v for k, v in got.items()}
                del chains
            out.append(res)
            del ref, mine, cref, cmine
            torch._dynamo.reset()
            tm.free(device)
    return out


def _llm_pair(arch: str, smoke: bool, device: Any) -> tuple[Any, Any, dict]:
    import transformers as tf

    pt.register_transformers()
    small = {"vocab_size": 512 if smoke else 8192}
    if arch == "llama":
        cfg = tf.LlamaConfig(
            hidden_size=64 if smoke else 1024,
            intermediate_size=128 if smoke else 2816,
            num_hidden_layers=2 if smoke else 4,
            num_attention_heads=4 if smoke else 16,
            num_key_value_heads=2 if smoke else 4,
            max_position_embeddings=LLM_SEQ,
            **small,
        )
        cls = tf.LlamaForCausalLM
    else:
        cfg = tf.GPT2Config(
            n_embd=64 if smoke else 1024,
            n_layer=2 if smoke else 4,
            n_head=4 if smoke else 16,
            n_positions=LLM_SEQ,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **small,
        )
        cls = tf.GPT2LMHeadModel
    torch.manual_seed(0)
    # one config each: transformers 5 sets the attention choice on the config object it is
    # given, and a model reads it at run time (with one shared config both ran pycudnn's)
    bf16 = torch.bfloat16
    ref = cls._from_config(copy.deepcopy(cfg), attn_implementation="sdpa", torch_dtype=bf16)
    mine = cls._from_config(copy.deepcopy(cfg), attn_implementation="pycudnn", torch_dtype=bf16)
    mine.load_state_dict(ref.state_dict())
    ref, mine = ref.to(device), pt.convert(mine.to(device))
    info = {"converted_modules": rn.count_converted(mine), "transformers": tf.__version__}
    return ref, mine, info


def _llm_case(arch: str, args: argparse.Namespace, device: Any) -> dict:
    plan = tm.PLANS[args.plan]
    try:
        ref, mine, info = _llm_pair(arch, args.smoke, device)
    except ImportError as exc:
        raise LookupError(f"transformers is not importable: {exc}") from None
    b, s = (2, 16) if args.smoke else (LLM_BATCH, LLM_SEQ)
    ids = torch.randint(0, ref.config.vocab_size, (b, s), device=device)

    def step(m: Any) -> Any:
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        for p in m.parameters():
            p.grad = None
        return loss.detach()

    for _ in range(plan.warm):
        lr, lm = step(ref), step(mine)
    rn.sync(device)
    res = {"case": f"llm-{arch}", **info, "loss_torch": lr.item(), "loss_pycudnn": lm.item()}
    return res | tm.timed_pair(lambda: step(ref), lambda: step(mine), plan.steps, plan.reps, device)


def llm_cases(args: argparse.Namespace, device: Any) -> list[dict]:
    """A training step of small HF decoders: torch's sdpa against pycudnn's attention."""
    out = []
    for arch in ("llama", "gpt2"):
        if wanted(f"llm-{arch}", args.only):
            out.append(_llm_case(arch, args, device))
            tm.free(device)
    return out


def _gpu_ms(fn: Callable[[], object], n: int, reps: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        e0.record()
        for _ in range(n):
            fn()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) / n)
    return sorted(times)[len(times) // 2]


def mm_cases(args: argparse.Namespace, device: Any) -> list[dict]:
    """Fused matmul + bias + GELU: heuristics' plan and the autotuned plan against torch."""
    import functools

    from pycudnn.graph import _builder

    out = []
    n, reps = (2, 1) if args.smoke else (50, 5)
    for m_, n_, k_ in ((256, 256, 256),) if args.smoke else MM_SHAPES:
        case = f"mm-gelu-{m_}x{n_}x{k_}"
        if not wanted(case, args.only):
            continue
        dt = torch.bfloat16
        a = torch.randn(m_, k_, device=device, dtype=dt)
        w = (torch.randn(n_, k_, device=device) / k_**0.5).to(dt)
        bias = torch.randn(n_, device=device, dtype=dt)
        y = torch.empty(m_, n_, device=device, dtype=dt)

        def mine(a: Any = a, w: Any = w, bias: Any = bias, y: Any = y) -> Any:
            return pycudnn.dnn_matmul(a, w.t(), bias=bias, activation="gelu", out=y)

        def ref(a: Any = a, w: Any = w, bias: Any = bias) -> Any:
            return torch.nn.functional.gelu(torch.nn.functional.linear(a, w, bias))

        t_ref = _gpu_ms(ref, n, reps)
        pycudnn.clear_caches()
        t_heur = _gpu_ms(mine, n, reps)
        build = _builder.Graph.build
        _builder.Graph.build = functools.partialmethod(build, policy="autotune")
        pycudnn.clear_caches()
        try:
            t0 = time.perf_counter()
            mine()
            torch.cuda.synchronize()
            tune_s = time.perf_counter() - t0
        finally:
            _builder.Graph.build = build
        t_auto = _gpu_ms(mine, n, reps)  # the autotuned plan stays cached
        want = ref().float()
        out.append(
            {
                "case": case,
                "torch_median_ms": t_ref,
                "pycudnn_median_ms": t_auto,
                "ratio": t_auto / t_ref,
                "heuristics_ms": t_heur,
                "heuristics_ratio": t_heur / t_ref,
                "autotune_s": tune_s,
                "rel_err": ((y.float() - want).norm() / want.norm()).item(),
            }
        )
        pycudnn.clear_caches()
    return out


def guarded(name: str, fn: Callable[[], list[dict]], smoke: bool, device: Any) -> list[dict]:
    print(f"# running {name}", flush=True)
    try:
        out = fn()
    except LookupError as exc:
        out = [{"case": name, "skipped": str(exc)}]
    except Exception as exc:
        if smoke:
            raise
        out = [{"case": name, "error": f"{type(exc).__name__}: {exc}"[:400]}]
    tm.free(device)
    for r in out:
        print(summary_line(r), flush=True)
    return out


def summary_line(r: dict[str, Any]) -> str:
    if "skipped" in r:
        return f"{r['case']}: skipped ({r['skipped']})"
    if "error" in r:
        return f"{r['case']}: error ({r['error']})"
    goal = target_of(r["case"])
    extra = ""
    if "unfused_ratio" in r:
        extra += f" (unfused converted {r['unfused_ratio']:.3f})"
    if "compile_s_torch" in r:
        extra += (
            f" (compile s: torch {r['compile_s_torch']:.0f}, pycudnn {r['compile_s_pycudnn']:.0f})"
        )
    if "logits_max_rel_diff" in r:
        extra += f" logits rel {r['logits_max_rel_diff']:.1e} top1 {r['top1_agreement']:.2f}"
    if "heuristics_ratio" in r:
        extra += (
            f" (heuristics' plan {r['heuristics_ratio']:.3f}; autotune {r['autotune_s']:.1f} s)"
        )
    if "loss_torch" in r:
        extra += f" loss {r['loss_torch']:.4f}/{r['loss_pycudnn']:.4f}"
    if "chains_ratio" in r:
        extra += (
            f" (chains' ops: torch {r['chains_torch_median_ms']:.3f} ms pycudnn "
            f"{r['chains_pycudnn_median_ms']:.3f} ms ratio {r['chains_ratio']:.3f})"
        )
    verdict = "met" if r["ratio"] <= goal else "MISSED"
    return (
        f"{r['case']}: torch {r['torch_median_ms']:.3f} ms pycudnn {r['pycudnn_median_ms']:.3f} ms "
        f"ratio {r['ratio']:.3f} (target <= {goal:.2f}: {verdict}){extra}"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if torch is None or not torch.cuda.is_available():
        print("torch_fusion: needs torch with a CUDA device", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    t0 = time.perf_counter()
    results: list[dict] = []
    for group, fn in (
        ("fuse", fuse_cases),
        ("compile", compile_cases),
        ("llm", llm_cases),
        ("mm", mm_cases),
    ):
        if args.only and not any(o.startswith(group) or group.startswith(o) for o in args.only):
            continue
        results += guarded(group, lambda fn=fn: fn(args, device), args.smoke, device)
    meta = {
        "benchmark": "fusion, torch.compile and transformers attention (issue 26)",
        "gpu": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "torch_cudnn": torch.backends.cudnn.version(),
        "pycudnn_cudnn": pycudnn.version(raises=False),
        "plan": args.plan,
        "modes": list(args.modes),
        "wall_s": time.perf_counter() - t0,
    }
    print(
        f"# {meta['gpu']}, torch {meta['torch']} (cuDNN {meta['torch_cudnn']}), pycudnn on "
        f"cuDNN {meta['pycudnn_cudnn']}; plan {args.plan}; {meta['wall_s']:.0f} s"
    )
    for r in results:
        print(summary_line(r))
    out = {"meta": meta, "cases": results}
    out_env = os.environ.get("OUT")
    for path in filter(None, [args.json, out_env and os.path.join(out_env, "fusion.json")]):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(out, indent=2, default=str) + "\n")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
