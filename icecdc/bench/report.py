"""Writing benchmark results: JSON with every series, PNG plots, a markdown summary."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()} {platform.release()}"


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, default=str))


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def publish(out: Path, name: str, results: dict[str, Any], plot: Callable[[dict[str, Any], Path], None],
            summary: Callable[[dict[str, Any]], str]) -> None:
    """``<name>.json`` with every series, ``<name>.png`` and the ``<name>.md`` summary in ``out``."""
    write_json(out / f"{name}.json", results)
    plot(results, out / f"{name}.png")
    (out / f"{name}.md").write_text(summary(results))
