"""Re-render the summary of a results JSON written by ``bench/run.py``.

python3 -m bench.report results/bench-<stamp>.json [--markdown]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import render_report  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("json", help="a results/bench-<stamp>.json file")
    p.add_argument("--markdown", action="store_true", help="GitHub Markdown tables")
    args = p.parse_args(argv)
    results = json.loads(Path(args.json).read_text())
    print(render_report(results, markdown=args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
