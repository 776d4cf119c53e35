"""``python -m pycudnn``: print which cuDNN is loaded, whether it fits, the GPUs, and a self-test.

Exit status 0 when everything checked is healthy, 1 otherwise (a missing GPU alone is not a
failure: the report says so).
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pycudnn", description=__doc__.splitlines()[0])
    ap.add_argument("--no-self-test", action="store_true", help="skip the GPU self-test")
    args = ap.parse_args(argv)
    from ._info import report

    text, healthy = report(self_test=not args.no_self_test)
    print(text)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
