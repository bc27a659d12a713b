"""``icecdc bench ...``: the benches a user runs on their own set-up, icecdc against the alternatives
on the same data, written as JSON, a plot and a markdown table. This is their registry: each
module declares its options (``add_arguments``) and runs from them (``main``), imported only when
chosen. The investigations (``benchmarks/``, not installed) reuse it; it never imports them.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from icecdc.domain.errors import UserError

INSTALL_HINT = "pip install 'icecdc[bench]'"


@dataclass(frozen=True)
class Benchmark:
    name: str  # the subcommand
    help: str  # its line in ``--help``
    package: str = __name__  # where its module lives

    @property
    def module(self) -> str:
        return f"{self.package}.{self.name.replace('-', '_')}"


BENCHMARKS = (
    Benchmark("ingest", "icecdc's writer against MERGE INTO (merge-on-read) on growing tables"),
    Benchmark("contention", "the writer's commit latency beside no compactor, a naive one and the coordinated one"),
    Benchmark(
        "e2e",
        "query latency, files, write amplification and writer latency over a CDC run, "
        "per maintenance strategy (none, cron, threshold, icecdc)",
    ),
    Benchmark(
        "writers",
        "the sidecar beside writers that are not icecdc's (MERGE merge-on-read and copy-on-write, appends, a "
        "Flink-style upsert sink): refused commits, conflicts, reads against a compacted copy, files after",
    ),
    Benchmark(
        "source-latency",
        "PostgreSQL commit to visible in Iceberg through the real Debezium connector and the ingester, at a steady "
        "rate of transactions",
    ),
)


class _BenchmarkParser(argparse.ArgumentParser):
    """A benchmark's parser, whose options its module declares once the benchmark is chosen."""

    def __init__(self, *args: Any, benchmark: Benchmark | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._undeclared = benchmark

    def parse_known_args(self, args: Iterable[str] | None = None, namespace: Any = None) -> tuple[Any, list[str]]:
        if self._undeclared is not None:
            module = importlib.import_module(self._undeclared.module)
            module.add_arguments(self)
            self.set_defaults(handler=lambda parsed: _run(module, parsed))
            self._undeclared = None
        return super().parse_known_args(args, namespace)


def add_benchmarks(bench: argparse.ArgumentParser, benchmarks: Iterable[Benchmark] = BENCHMARKS) -> None:
    """One subcommand per benchmark."""
    benches = bench.add_subparsers(dest="bench", required=True, metavar="BENCHMARK", parser_class=_BenchmarkParser)
    for benchmark in benchmarks:
        benches.add_parser(benchmark.name, help=benchmark.help, benchmark=benchmark)


def _run(module: Any, args: argparse.Namespace) -> int:
    # Before the run rather than at its first plot, after the measuring.
    try:
        importlib.import_module("matplotlib")
    except ImportError:
        raise UserError(f"the benchmarks plot with matplotlib, which is not installed: {INSTALL_HINT}") from None
    result: int = module.main(args)
    return result


def out_argument(parser: argparse.ArgumentParser, plots: str = "plot") -> None:
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help=f"where to write JSON, {plots} and summary")


def positive_numbers(text: str, option: str) -> list[float]:
    """A comma-separated list of positive numbers, or a clear error."""
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        raise UserError(f"{option} wants comma-separated numbers, like 30,120; got {text!r}") from None
    if min(values) <= 0:
        raise UserError(f"{option}: every value must be above 0; got {text!r}")
    return values


def table_property_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--table-property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an Iceberg property of every table the bench creates, over icecdc's own (the tables' properties), "
        "e.g. commit.manifest.min-count-to-merge=4; repeat for more (default: none)",
    )


def table_properties(args: argparse.Namespace) -> dict[str, str]:
    """The ``--table-property`` options as a mapping."""
    return dict(key_value(p, "--table-property") for p in args.table_property)


def table_properties_said(properties: Mapping[str, str]) -> str:
    """A summary's words for the tables' ``--table-property`` options ("" for none)."""
    return "".join(f"table property {key}={value}; " for key, value in sorted(properties.items()))


def key_value(text: str, option: str) -> tuple[str, str]:
    """``KEY=VALUE``, split at the first ``=``, or a clear error."""
    key, equals, value = text.partition("=")
    if not (key.strip() and equals):
        raise UserError(f"{option} wants KEY=VALUE, like commit.manifest.min-count-to-merge=4; got {text!r}")
    return key.strip(), value.strip()


def positive_integers(text: str, option: str) -> list[int]:
    return [int(n) for n in positive_numbers(text, option)]


def print_results(out: Path, name: str, summary: str) -> None:
    """The summary, and where the results and the plot are."""
    print(summary)
    print(f"results: {out / f'{name}.json'}, plot: {out / f'{name}.png'}")
