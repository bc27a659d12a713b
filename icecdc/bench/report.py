"""Writing benchmark results: JSON with every series, PNG plots, a markdown summary."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

R = TypeVar("R")


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()} {platform.release()}"


def percentile(values: list[float], share: float) -> float:
    """The nearest-rank percentile (``share`` 0.99: p99); of 60 samples, p99 is the second-slowest."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * (len(ordered) - 1))))]


def write_json(path: Path, document: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = dataclasses.asdict(document) if dataclasses.is_dataclass(document) and not isinstance(document, type) else document
    path.write_text(json.dumps(data, indent=2, default=str))


def markdown_table(header: str | list[str], rows: list[list[Any]]) -> str:
    """A table whose ``header`` is its columns, or one string of them joined by `` | ``."""
    columns = header.split(" | ") if isinstance(header, str) else header
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def publish(out: Path, name: str, results: R, plot: Callable[[R, Path], None], summary: Callable[[R], str]) -> None:
    """``<name>.json`` with every series, ``<name>.png`` and the ``<name>.md`` summary in ``out``."""
    write_json(out / f"{name}.json", results)
    plot(results, out / f"{name}.png")
    (out / f"{name}.md").write_text(summary(results))


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only backend (no display on a server)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(plt: Any, fig: Any, path: Path, *axes: Any, legend: int | None = 8, dpi: int = 120) -> None:
    """Grid and legend on ``axes``, the figure written to ``path`` and closed."""
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=legend)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
