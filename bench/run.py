"""pycudnn vs PyTorch (and NVIDIA's cudnn-frontend) convolution benchmarks (issues 6 and 13).

Run on the GPU machine from the repository root::

    PYTHONPATH=. python3 bench/run.py [--quick] [--only conv,tiny,fusion] [--cases 2,f1]

The frontend column (``import cudnn`` from ``nvidia-cudnn-frontend``) is skipped, with its
reason in the JSON and the report, when the package is absent or unusable (``--no-frontend``
skips it on purpose). The fusion cases (``f1b`` ... ``f4h``) compare pycudnn's fused
conv+bias(+z)+relu call with torch eager and the frontend's fused graph.

Each mode (heuristic vs heuristic, autotuned vs autotuned) runs in its own process (torch keeps
one cuDNN plan per problem regardless of ``cudnn.benchmark``). Both libraries use the same
libcudnn (asserted), torch's current stream, and TF32 off unless a case says otherwise. GPU
time is nvbench's (``cuda-bench``, see ``bench/timing.py``): without it the script stops at once,
naming the install line. The
summary tables are printed last; the merged JSON goes to ``results/bench-<UTC time>.json`` (and
``$OUT`` when set), with the text and Markdown reports beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import evaluate_targets, render_report, summary_lines  # noqa: E402
from bench.timing import missing_reason  # noqa: E402

MODES = ("heuristic", "autotune")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--modes", default=",".join(MODES), help="comma list of: heuristic,autotune")
    p.add_argument(
        "--cases",
        default=None,
        help="comma list of case ids (1,2,...,6a,...,12; f1b..f4h, f1 = f1b+f1h, f = all fusion)",
    )
    p.add_argument(
        "--only", default=None, help="comma list of groups: tiny,cold,thrash,conv,fusion"
    )
    p.add_argument("--no-frontend", action="store_true", help="skip the cudnn-frontend column")
    p.add_argument("--budget", type=float, default=400.0, help="seconds for all modes together")
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--results", default=str(ROOT / "results"), help="results folder")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--json", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-budget", type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    from bench.cases import Selection

    try:
        Selection.parse(args.cases, args.only)
    except ValueError as exc:
        p.error(str(exc))
    return args


def run_modes(args: argparse.Namespace, stamp: str, outdir: Path) -> dict[str, Any]:
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            raise SystemExit(f"unknown mode {m!r}; expected one of {MODES}")
    start = time.monotonic()
    results: dict[str, Any] = {"meta": {}, "modes": {}}
    # the autotuned mode does more work (autotuning every problem twice): give it more time
    weights = {"heuristic": 0.45, "autotune": 0.55}
    for i, mode in enumerate(modes):
        left = args.budget - (time.monotonic() - start)
        share = weights[mode] / sum(weights[m] for m in modes[i:])
        budget = max(30.0, left * share)
        path = outdir / f"bench-{stamp}-{mode}.json"
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            mode,
            "--json",
            str(path),
            "--child-budget",
            f"{budget:.0f}",
        ]
        if args.quick:
            cmd.append("--quick")
        if args.cases:
            cmd += ["--cases", args.cases]
        if args.only:
            cmd += ["--only", args.only]
        if args.no_frontend:
            cmd.append("--no-frontend")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        print(f"[bench] mode {mode}: budget {budget:.0f} s", flush=True)
        t0 = time.monotonic()
        rc: int | str
        try:
            rc = subprocess.run(cmd, env=env, timeout=budget + 25).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        res: dict[str, Any] = {}
        if path.exists():
            with open(path) as fh:
                res = json.load(fh)
        if rc != 0:
            res.setdefault("error", f"child exited with {rc}")
        res["wall_s"] = round(time.monotonic() - t0, 1)
        results["modes"][mode] = res
        if res.get("meta") and not results["meta"]:
            results["meta"] = dict(res["meta"])
    results["meta"]["total_s"] = round(time.monotonic() - start, 1)
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        from bench.runner import child_main

        return child_main(
            args.child,
            args.json,
            args.child_budget or args.budget,
            args.quick,
            args.cases,
            args.only,
            not args.no_frontend,
        )
    why = missing_reason()  # before any child spends its budget
    if why:
        print(f"[bench] {why}", file=sys.stderr, flush=True)
        return 2
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    outdir = Path(args.results)
    outdir.mkdir(parents=True, exist_ok=True)
    results = run_modes(args, stamp, outdir)
    results["meta"]["command"] = "PYTHONPATH=. python3 bench/run.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    results["meta"]["timestamp_utc"] = stamp
    base = outdir / f"bench-{stamp}"
    paths = [base.with_suffix(".json"), base.with_suffix(".txt"), base.with_suffix(".md")]
    out_env = os.environ.get("OUT")

    def save(path: Path, text: str) -> None:
        path.write_text(text)
        if out_env:
            shutil.copy(path, Path(out_env) / path.name)

    # the raw results first: a bug in the report code must not lose a run
    save(paths[0], json.dumps(results, indent=1, default=str))
    try:
        results["targets"] = [
            t.__dict__ | {"verdict": t.verdict} for t in evaluate_targets(results)
        ]
        save(paths[0], json.dumps(results, indent=1, default=str))
        text = render_report(results)
        save(paths[1], text + "\n")
        save(paths[2], render_report(results, markdown=True) + "\n")
    except Exception:
        import traceback

        text = "report failed:\n" + traceback.format_exc()
    print("\n" + text, flush=True)
    print(f"\n[bench] wrote {', '.join(str(p) for p in paths)}", flush=True)
    # the summary lines last, one per group and mode
    try:
        lines = summary_lines(results)
    except Exception as exc:
        lines = [f"summary failed: {type(exc).__name__}: {exc}"]
    print("\n" + "\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
