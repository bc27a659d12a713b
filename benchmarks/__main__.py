"""``python -m benchmarks NAME [options]``: one investigation, with the options ``icecdc bench`` has."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from benchmarks import INVESTIGATIONS
from icecdc.bench import add_benchmarks
from icecdc.domain.errors import UserError
from icecdc.runtime.logs import setup_logging


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description="icecdc's one-off investigations")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--log-format", choices=["text", "json"], default="text", help="log line format (default: text)")
    add_benchmarks(parser, INVESTIGATIONS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose, args.log_format == "json")
    try:
        result: int = args.handler(args)
    except UserError as exc:
        print(f"benchmarks: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return result


if __name__ == "__main__":
    sys.exit(main())
