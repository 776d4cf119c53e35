"""The benchmark page's summary table and plots, from the committed results (one command).

Reads ``docs/benchmarks/latest.json`` (convolutions, ``bench/run.py``),
``docs/benchmarks/issue13-fusion-frontend.json`` (fused epilogues and the cudnn-frontend column)
and ``docs/benchmarks/headlines.json`` (the other sections' headline numbers), then

* rewrites the summary table of ``docs/BENCHMARKS.md`` between its ``summary:begin`` and
  ``summary:end`` markers (no matplotlib needed: ``--summary-only``);
* writes the plots to ``docs/benchmarks/plots/``: ``ratios.svg`` (every headline ratio against
  1.0), ``conv_ratio.svg`` (GPU time per convolution case, both algorithm modes, and the fused
  epilogues), ``host_us.svg`` (host microseconds per call) and ``scaling.svg`` (DDP efficiency,
  1 -> 2 GPUs).

Run from the repository root: ``python -m bench.plots`` (matplotlib: ``pip install -e
".[bench]"``); ``python -m bench.plots --check`` exits 1 if the page's summary is stale.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "benchmarks"
PAGE = ROOT / "docs" / "BENCHMARKS.md"
PLOTS = DATA / "plots"
BEGIN, END = "<!-- summary:begin (python -m bench.plots) -->", "<!-- summary:end -->"


def load(name: str) -> dict[str, Any]:
    return json.loads((DATA / name).read_text())


def gpu_of(meta: dict[str, Any]) -> str:
    return " ".join(str(meta.get("gpu", "?")).removeprefix("NVIDIA ").split()[:1])


def side_ratio(item: dict[str, Any], key: str = "gpu_ms") -> tuple[float, float, float] | None:
    """(median ratio, lowest, highest) of pycudnn / torch for one item: the extremes pair one
    side's min with the other's max (the range the repetitions allow)."""
    a, b = item.get("pycudnn", {}).get(key), item.get("torch", {}).get(key)
    if not a or not b:
        return None
    return a["median"] / b["median"], a["min"] / b["max"], a["max"] / b["min"]


def conv_items(mode: str) -> list[tuple[str, tuple[float, float, float]]]:
    out = []
    for it in load("latest.json")["modes"][mode]["items"]:
        r = side_ratio(it)
        if r:
            out.append((f"{it['case']} {it['op']}", r))
    return out


def fusion_items() -> list[tuple[str, tuple[float, float, float]]]:
    out = []
    for it in load("issue13-fusion-frontend.json")["modes"]["heuristic"].get("fusion", []):
        r = side_ratio(it)
        if r:
            out.append((f"{it['case']} {it.get('epilogue', '')}", r))
    return out


def summary_rows() -> list[dict[str, Any]]:
    """Every headline: what, GPU, ratio, spread, over, target."""
    latest = load("latest.json")
    gpu = gpu_of(latest["meta"])
    rows = []
    for mode, label in (("heuristic", "heuristics"), ("autotune", "autotuned")):
        ratios = [r[0] for _, r in conv_items(mode)]
        rows.append(
            {
                "what": f"Convolution GPU time, {label} (median of {len(ratios)} cases)",
                "gpu": gpu,
                "ratio": statistics.median(ratios),
                "spread": [min(ratios), max(ratios)],
                "over": f"{len(ratios)} cases",
                "target": "<= 1.00",
            }
        )
    fused = [r[0] for _, r in fusion_items()]
    if fused:
        meta = load("issue13-fusion-frontend.json")["meta"]
        rows.append(
            {
                "what": "Fused conv+bias+ReLU(+residual), GPU time against torch eager",
                "gpu": gpu_of(meta),
                "ratio": statistics.median(fused),
                "spread": [min(fused), max(fused)],
                "over": f"{len(fused)} cases",
                "target": "<= 0.85",
            }
        )
    cold = latest["modes"]["heuristic"]["cold"]
    per_shape = [
        a / b for a, b in zip(cold["pycudnn_all_ms"], cold["torch_all_ms"], strict=True)
    ]  # the i-th new shape of each side is the same shape
    rows.append(
        {
            "what": "First call of a new convolution shape (plan build; ratio of the medians)",
            "gpu": gpu,
            "ratio": cold["ratio"],
            "spread": [min(per_shape), max(per_shape)],
            "over": f"{len(per_shape)} shapes, each its own ratio",
            "target": "<= 1.00",
        }
    )
    return rows + load("headlines.json")["rows"]


def summary_table() -> str:
    lines = [
        "| headline | GPU | pycudnn / torch | spread | target |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in summary_rows():
        lo, hi = r["spread"]
        spread = f"{lo:.3f}-{hi:.3f} ({r['over']})" if lo != hi else f"({r['over']})"
        what = r["what"]
        if r.get("section"):
            what = f"[{what}](#{r['section']})"
        value = f"**{r['ratio']:.3f}**"
        if r.get("unit") == "efficiency":
            value = f"**{r['ratio']:.1%}** efficiency"
        elif r.get("unit") == "memory":
            value = f"**{r['ratio']:.3f}** in memory"
        lines.append(f"| {what} | {r['gpu']} | {value} | {spread} | {r['target']} |")
    return "\n".join(lines)


def write_summary(check: bool = False) -> bool:
    """Put the table between the page's markers; True when the page already had it."""
    text = PAGE.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{BEGIN}\n{summary_table()}\n{END}{tail}"
    if new == text:
        return True
    if not check:
        PAGE.write_text(new)
    return False


# -- plots ---------------------------------------------------------------------------------------
def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "pycudnn", "font.size": 9, "svg.fonttype": "none"})
    return plt


def _save(fig: Any, name: str) -> Path:
    PLOTS.mkdir(parents=True, exist_ok=True)
    path = PLOTS / name
    fig.savefig(path, bbox_inches="tight", metadata={"Date": None})
    return path


def _ratio_panel(ax: Any, items: list[tuple[str, tuple[float, float, float]]], label: str) -> None:
    ys = list(range(len(items)))
    med = [r[0] for _, r in items]
    err = [[r[0] - r[1] for _, r in items], [r[2] - r[0] for _, r in items]]
    ax.errorbar(med, ys, xerr=err, fmt="o", ms=3, capsize=2, label=label)


def plot_ratios(plt: Any) -> Path:
    # (scaling.svg has the efficiencies; a memory ratio is no time)
    rows = [r for r in summary_rows() if r.get("unit") not in ("efficiency", "memory")]
    fig, ax = plt.subplots(figsize=(7.5, 0.32 * len(rows) + 1.0))
    ys = list(range(len(rows)))[::-1]
    for y, r in zip(ys, rows, strict=True):
        lo, hi = r["spread"]
        ratio = r["ratio"]
        color = "tab:green" if ratio <= 1.0 else "tab:red"
        ax.errorbar([ratio], [y], xerr=[[ratio - lo], [hi - ratio]], fmt="o", color=color, ms=4)
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_yticks(ys, [r["what"] if len(r["what"]) < 70 else r["what"][:67] + "..." for r in rows])
    ax.set_xlabel("pycudnn / torch (time; left of 1.0: pycudnn faster), bars: spread")
    ax.set_title("Headline ratios (docs/BENCHMARKS.md summary)")
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, "ratios.svg")


def plot_conv(plt: Any) -> Path:
    heur, auto, fused = conv_items("heuristic"), conv_items("autotune"), fusion_items()
    fig, (a1, a2) = plt.subplots(
        1, 2, figsize=(9, 0.22 * len(heur) + 1.2), gridspec_kw={"width_ratios": [3, 2]}
    )
    _ratio_panel(a1, heur, "heuristics")
    _ratio_panel(a1, [(n, (r[0], r[1], r[2])) for n, r in auto], "autotuned")
    a1.set_yticks(range(len(heur)), [n for n, _ in heur])
    a1.invert_yaxis()
    a1.axvline(1.0, color="black", lw=0.8)
    a1.set_xlabel("GPU time, pycudnn / torch")
    meta = load("latest.json")["meta"]
    a1.set_title(f"Convolutions ({gpu_of(meta)}, cuDNN {meta['cudnn_version']})")
    a1.legend(loc="lower right")
    a1.grid(axis="x", alpha=0.3)
    _ratio_panel(a2, fused, "fused (heuristics)")
    a2.set_yticks(range(len(fused)), [n for n, _ in fused])
    a2.invert_yaxis()
    a2.axvline(1.0, color="black", lw=0.8)
    a2.set_xlim(0, 1.1)
    a2.set_xlabel("GPU time, pycudnn fused / torch eager")
    fmeta = load("issue13-fusion-frontend.json")["meta"]
    a2.set_title(f"Fused epilogues, one cuDNN graph ({gpu_of(fmeta)})")
    a2.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return _save(fig, "conv_ratio.svg")


def plot_host(plt: Any) -> Path:
    latest = load("latest.json")
    tiny = latest["modes"]["heuristic"]["tiny"]
    names = ["reuse", "no_stream_arg", "prewrapped", "alloc_only", "new_x_out_reused"]
    names += ["new_buffers"]
    names = [n for n in names if isinstance(tiny.get(n), dict) and tiny[n].get("torch")]
    fig, ax = plt.subplots(figsize=(7.5, 3.2))
    width = 0.38
    for k, side in enumerate(("pycudnn", "torch")):
        med = [tiny[n][side]["median"] for n in names]
        lo = [tiny[n][side]["median"] - tiny[n][side]["min"] for n in names]
        hi = [tiny[n][side]["max"] - tiny[n][side]["median"] for n in names]
        xs = [i + (k - 0.5) * width for i in range(len(names))]
        ax.bar(xs, med, width, yerr=[lo, hi], capsize=2, label=side)
    ax.set_xticks(range(len(names)), [n.replace("_", " ") for n in names], rotation=20)
    ax.set_ylabel("host us per call (lower is better)")
    ax.set_title(
        f"Tiny conv (1x8x8x8 fp32, 3x3): host time per call, {gpu_of(latest['meta'])}, "
        "one process (bench/run.py)"
    )
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, "host_us.svg")


def plot_scaling(plt: Any) -> Path:
    ddp = load("headlines.json")["ddp"]
    runs = ddp["runs"]
    fig, ax = plt.subplots(figsize=(6.5, 3.0))
    width = 0.38
    for k, side in enumerate(("torch", "pycudnn")):
        xs = [i + (k - 0.5) * width for i in range(len(runs))]
        ax.bar(xs, [100 * r[side] for r in runs], width, label=side)
    ax.axhline(100 * ddp["target"], color="black", lw=0.8, ls="--", label="target")
    ax.set_xticks(range(len(runs)), [r["label"] for r in runs])
    ax.set_ylim(50, 100)
    ax.set_ylabel("scaling efficiency 1 -> 2 GPUs (%)")
    ax.set_title("DDP ResNet-50 training step, 2x H200 (bench/ddp_scaling.py)")
    ax.legend(loc="lower right")
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, "scaling.svg")


def main(argv: list[str]) -> int:
    if "--check" in argv:
        ok = write_summary(check=True)
        print(
            "summary up to date"
            if ok
            else "docs/BENCHMARKS.md's summary is stale: run bench/plots.py"
        )
        return 0 if ok else 1
    write_summary()
    print(f"summary written to {PAGE.relative_to(ROOT)}")
    if "--summary-only" in argv:
        return 0
    plt = _plt()
    for fn in (plot_ratios, plot_conv, plot_host, plot_scaling):
        print(f"wrote {fn(plt).relative_to(ROOT)}")
        plt.close("all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
