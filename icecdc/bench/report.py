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


def line_plot(path: Path, x: list[float], lines: dict[str, list[float]], xlabel: str, ylabel: str,
              size: tuple[float, float] = (6, 4)) -> None:
    """One line per label over a shared x axis, y from 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=size)
    for label, ys in lines.items():
        ax.plot(x, ys, marker="o", label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
