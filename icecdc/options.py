"""Command-line options that several commands declare alike: the local state directory and the
embedded broker's port (``demo``, ``broker`` and the benchmarks on the embedded stack)."""

from __future__ import annotations

import argparse
from pathlib import Path

from icecdc.runtime.config import DEFAULT_STATE_DIR, EMBEDDED_BROKER_PORT


def state_dir_argument(
    parser: argparse.ArgumentParser,
    help_text: str = f"local state directory (default: {DEFAULT_STATE_DIR})",
    default: Path = Path(DEFAULT_STATE_DIR),
) -> None:
    parser.add_argument("--state-dir", type=Path, default=default, help=help_text)


def embedded_stack_arguments(parser: argparse.ArgumentParser) -> None:
    """``--state-dir`` and the embedded broker's ``--port``."""
    state_dir_argument(parser)
    parser.add_argument(
        "--port", type=int, default=EMBEDDED_BROKER_PORT, help=f"embedded broker port (default: {EMBEDDED_BROKER_PORT})"
    )
