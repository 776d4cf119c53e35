"""``python -m pycudnn``: print which cuDNN is loaded, whether it fits, the GPUs, and a self-test.

Every visible GPU is listed; the self-test runs on each supported GPU, or on GPU N only with
``--device N``. Exit status 0 when everything checked is healthy, 1 otherwise (a missing GPU
alone is not a failure: the report says so; a ``--device`` that is not visible is), 2 for bad
arguments.
"""

from __future__ import annotations

import argparse
import sys


def _ordinal(text: str) -> int:
    """A CUDA device ordinal (argparse type): a non-negative int."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a GPU ordinal (0, 1, ...), got {text!r}"
        ) from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a GPU ordinal (0, 1, ...), got {n}")
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pycudnn", description=__doc__.splitlines()[0])
    ap.add_argument("--no-self-test", action="store_true", help="skip the GPU self-test")
    ap.add_argument(
        "--device",
        type=_ordinal,
        metavar="N",
        help="run the self-test on GPU N only (default: on every supported GPU)",
    )
    args = ap.parse_args(argv)
    from ._info import report

    text, healthy = report(self_test=not args.no_self_test, device=args.device)
    print(text)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
