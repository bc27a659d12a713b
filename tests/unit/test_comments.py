"""The product's comments and docstrings say why, and carry no dates and no measured figures.

A date or a benchmark figure in a comment goes stale the day the next run lands; the results live
in docs/BENCHMARKS.md, and a comment names the row by its goal, as
``docs/BENCHMARKS.md, row "Records a second"`` does. The rule here is practical, not complete: it
catches what a measurement usually looks like.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.unit.test_doc_references import passages_of_python

ROOT = Path(__file__).resolve().parents[2]
PRODUCT_DIRS = ("icecdc", "ingest", "compactor", "coordinator", "schemas", "benchmarks")
DATE = re.compile(r"(?<![\w-])(?:19|20)\d{2}-[01]\d-[0-3]\d(?!\d)")
NUMBER = r"\d+(?:[.,]\d+)*"
TIME = r"(?:s|ms|µs|us|seconds|milliseconds)"
# What a measurement looks like: a ratio (1.28x), a decimal or a range of time (0.36 s, 53-59 ms),
# a throughput (45 MB/s, records/s), a count of runs (in three runs), a decimal percentage.
FIGURE = re.compile(
    rf"(?<![\w.])(?:{NUMBER}(?:-{NUMBER})?x(?![\w-])"
    rf"|\d+\.\d+\s?{TIME}\b"
    rf"|{NUMBER}\s?(?:-|to)\s?{NUMBER}\s?{TIME}\b"
    r"|\d+\.\d+\s?%)"
    r"|\b(?:records|rows|changes|files|[KMG]B|bytes)/s\b"
    r"|\b(?:in|of|over) (?:\d+|two|three|four|five|six|seven|eight|nine|ten) runs\b"
)
# Figures that are definitions, not measurements, by file ("*": any file): the text the rule flags.
ALLOWED: dict[str, set[str]] = {
    "*": {"1970-01-01"},  # the Unix epoch, which Iceberg's dates and timestamps count from
    # Iceberg's human string of an hour partition, a format, not a run's date.
    "icecdc/domain/layout.py": {"2025-01-02"},
}


def offences(text: str, allowed: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
    found = [m.group(0) for m in DATE.finditer(text)] + [m.group(0) for m in FIGURE.finditer(text)]
    return [f for f in found if f not in allowed]


def product_files() -> list[Path]:
    return [file for folder in PRODUCT_DIRS for file in sorted((ROOT / folder).rglob("*.py"))]


def test_no_date_or_measured_figure_in_the_products_comments():
    problems = []
    for file in product_files():
        relative = file.relative_to(ROOT).as_posix()
        for line, text in passages_of_python(file.read_text()):
            problems += [f"{relative}:{line}: {found}" for found in offences(text, ALLOWED["*"] | ALLOWED.get(relative, set()))]
    assert not problems, "dates or measured figures in comments (cite a BENCHMARKS row instead):\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Eight, since 2026-11-29: faster", ["2026-11-29"]),
        ("took 0.36 s wall against 0.43 s", ["0.36 s", "0.43 s"]),
        ("53-59 ms with this", ["53-59 ms"]),
        ("reads 1.6-2.4x the compacted copy's", ["1.6-2.4x"]),
        ("some 45 MB/s", ["MB/s"]),
        ("62,622 records/s", ["records/s"]),
        ("shorter in each of five runs", ["of five runs"]),
        ("a 12.5% share", ["12.5%"]),
        # Definitions stay: a default, a unit, an Iceberg rule, a hex literal, a version.
        ("librdkafka's default session of 45 s", []),
        ("Iceberg polls every 10 ms", []),
        ("128 MB files, a factor of 4 apart", []),
        ("0x1F, Iceberg 1.10, format v3, v2.4", []),
        ('(docs/BENCHMARKS.md, row "Many tables in one batch")', []),
    ],
)
def test_the_rule_flags_a_measurement_and_passes_a_definition(text, expected):
    assert offences(text) == expected
