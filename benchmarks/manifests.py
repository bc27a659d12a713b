"""``python -m benchmarks manifests``: what N small manifests cost a point lookup against the same
data files with the manifests merged, behind ``compactor.max_small_manifests``
(docs/BENCHMARKS.md, row "Small manifests on a lookup").
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import line_plot
from icecdc.bench import out_argument, positive_integers, print_results
from icecdc.bench.harness import bench_stack, progress
from icecdc.bench.report import machine, markdown_table, publish
from icecdc.options import state_dir_argument
from icecdc.runtime.config import DEFAULT_STATE_DIR

DAYS = 8
say = progress("manifests")


@dataclass(frozen=True)
class ManifestPoint:
    commits: int
    data_files: int
    manifests: int
    merged_manifests: int
    lookup_ms: list[float]
    merged_lookup_ms: list[float]
    ratio: float  # median lookup as written over median lookup merged


@dataclass(frozen=True)
class ManifestResults:
    machine: str
    rows: int
    lookups: int
    series: list[ManifestPoint]


def _lookup_ms(spark: Any, name: str, snapshot_id: int, key: int) -> float:
    started = time.perf_counter()
    spark.sql(f"SELECT * FROM {name} VERSION AS OF {snapshot_id} WHERE id = {key}").collect()
    return (time.perf_counter() - started) * 1000


def _manifests(spark: Any, name: str, snapshot_id: int) -> int:
    return spark.sql(f"SELECT count(*) FROM {name}.all_manifests WHERE reference_snapshot_id = {snapshot_id}").first()[0]


def measure(spark: Any, name: str, rows: int, commits: int, lookups: int) -> ManifestPoint:
    """Load ``rows`` in ``commits`` commits, merge the manifests, time lookups on both snapshots."""
    # Contiguous id ranges per commit and per day: a lookup by id prunes to the few files (one
    # per region) whose bounds hold it, in both snapshots alike.
    spark.sql(
        f"CREATE TABLE {name} (id BIGINT, region STRING, status STRING, amount DECIMAL(12,2), updated_at TIMESTAMP) "
        f"USING iceberg PARTITIONED BY (region, days(updated_at)) TBLPROPERTIES ('format-version' = '2')"
    )
    bounds = [rows * i // commits for i in range(commits + 1)]
    for low, high in itertools.pairwise(bounds):
        spark.sql(
            f"INSERT INTO {name} SELECT id, element_at(array('eu', 'us', 'apac'), CAST(id % 3 + 1 AS INT)), 'placed', "
            f"CAST(id % 100000 / 100 AS DECIMAL(12,2)), "
            f"TIMESTAMP '2026-01-01 00:00:00' + make_interval(0, 0, 0, CAST(id * {DAYS} DIV {rows} AS INT)) "
            f"FROM range({low}, {high})"
        )
    before = spark.sql(f"SELECT snapshot_id FROM {name}.snapshots ORDER BY committed_at DESC LIMIT 1").first()[0]
    spark.sql(f"CALL {name.split('.', 1)[0]}.system.rewrite_manifests('{name.split('.', 1)[1]}')")
    after = spark.sql(f"SELECT snapshot_id FROM {name}.snapshots ORDER BY committed_at DESC LIMIT 1").first()[0]
    keys = random.Random(commits).sample(range(rows), lookups)
    for key in keys[:20]:  # warm-up: the first table pays for the JIT
        _lookup_ms(spark, name, before, key), _lookup_ms(spark, name, after, key)
    small, merged = [], []
    for key in keys:
        small.append(_lookup_ms(spark, name, before, key))
        merged.append(_lookup_ms(spark, name, after, key))
    data_files = spark.sql(f"SELECT count(*) FROM {name}.files").first()[0]
    return ManifestPoint(
        commits,
        data_files,
        _manifests(spark, name, before),
        _manifests(spark, name, after),
        small,
        merged,
        statistics.median(small) / statistics.median(merged),
    )


def run(rows: int, manifest_counts: Sequence[int], lookups: int, out: Path, state_dir: Path) -> ManifestResults:
    series = []
    with bench_stack("manifests", state_dir, broker=False) as stack:  # only Spark and the catalog
        namespace = f"{stack.config.catalog.name}.bench"
        stack.spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {namespace}")
        for commits in manifest_counts:
            name = f"{namespace}.manifests_{commits}_{stack.run_id}"
            try:
                point = measure(stack.spark, name, rows, commits, lookups)
            finally:
                stack.spark.sql(f"DROP TABLE IF EXISTS {name} PURGE")
            series.append(point)
            say(
                f"{point.manifests} manifests: {statistics.median(point.lookup_ms):.0f} ms a lookup; merged into "
                f"{point.merged_manifests}: {statistics.median(point.merged_lookup_ms):.0f} ms ({point.ratio:.2f}x)"
            )
    results = ManifestResults(machine(), rows, lookups, series)
    publish(out, "manifests", results, _plot, summary)
    return results


def summary(results: ManifestResults) -> str:
    rows = [
        [
            p.manifests,
            p.data_files,
            f"{statistics.median(p.lookup_ms):.0f}",
            p.merged_manifests,
            f"{statistics.median(p.merged_lookup_ms):.0f}",
            f"{p.ratio:.2f}x",
        ]
        for p in results.series
    ]
    return (
        f"{results.rows:,} rows; medians of {results.lookups} point lookups by key on each snapshot, "
        f"alternating; {results.machine}.\n\n"
        + markdown_table(["manifests", "data files", "lookup ms", "merged into", "lookup ms, merged", "ratio"], rows)
        + "\n"
    )


def _plot(results: ManifestResults, path: Path) -> None:
    series = results.series
    line_plot(
        path,
        [p.manifests for p in series],
        {
            "as written": [statistics.median(p.lookup_ms) for p in series],
            "manifests merged": [statistics.median(p.merged_lookup_ms) for p in series],
        },
        "manifests as written (same data files in both)",
        "point lookup, median ms",
        size=(6, 3.5),
    )


# ---- python -m benchmarks manifests ----


def add_arguments(parser: argparse.ArgumentParser) -> None:
    state_dir_argument(parser, f"local state directory: catalog and warehouse, no broker (default: {DEFAULT_STATE_DIR})")
    parser.add_argument("--rows", type=int, default=100_000, help="rows in each table (default: 100000)")
    parser.add_argument(
        "--manifests",
        default="2,8,20,50",
        metavar="N[,N...]",
        help="commits (so manifests) each table is loaded in (default: 2,8,20,50)",
    )
    parser.add_argument("--lookups", type=int, default=100, help="point lookups on each snapshot (default: 100)")
    out_argument(parser)


def main(args: argparse.Namespace) -> int:
    counts = positive_integers(args.manifests, "--manifests")
    results = run(args.rows, counts, args.lookups, args.out, args.state_dir.resolve())
    print_results(args.out, "manifests", summary(results))
    return 0
