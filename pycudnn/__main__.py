"""``python -m pycudnn``: print which cuDNN is loaded, whether it fits, the GPUs, and a self-test.

Every visible GPU is listed; the self-test runs on each supported GPU, or on GPU N only with
``--device N``. Exit status 0 when everything checked is healthy, 1 otherwise (a missing GPU
alone is not a failure: the report says so; a ``--device`` that is not visible is), 2 for bad
arguments. ``--json`` prints the same facts as one JSON object; ``--version`` the versions.
"""

from __future__ import annotations

import argparse
import json
import sys

DESCRIPTION = (
    "Print which cuDNN is loaded and how it was found, whether it fits these bindings, the "
    "CUDA driver and GPUs, and a short self-test on each supported GPU."
)
EPILOG = (
    "Exit status: 0 when everything checked is healthy, 1 otherwise (a missing GPU alone is not "
    "a failure; a --device that is not visible is), 2 for bad arguments."
)


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


def _version_text() -> str:
    from ._generated import lib
    from ._version import __version__

    return (
        f"pycudnn {__version__} (distribution pycudnn9), bindings generated from the cuDNN "
        f"{lib.HEADER_VERSION_STRING} headers"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pycudnn", description=DESCRIPTION, epilog=EPILOG)
    ap.add_argument("--version", action="version", version=_version_text())
    ap.add_argument("--no-self-test", action="store_true", help="skip the GPU self-test")
    ap.add_argument(
        "--device",
        type=_ordinal,
        metavar="N",
        help="run the self-test on GPU N only (default: on every supported GPU)",
    )
    ap.add_argument(
        "--json", action="store_true", help="print the report as one JSON object (for scripts)"
    )
    args = ap.parse_args(argv)
    if args.json:
        from ._info import facts

        data = facts(self_test=not args.no_self_test, device=args.device)
        print(json.dumps(data, indent=2))
        return 0 if data["healthy"] else 1
    from ._info import report

    text, healthy = report(self_test=not args.no_self_test, device=args.device)
    print(text)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
