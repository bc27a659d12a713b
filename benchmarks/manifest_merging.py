"""``python -m benchmarks manifest-merging``: the writer's commit time against the table's live files
and ``commit.manifest.min-count-to-merge``, on tables of metadata only (docs/BENCHMARKS.md, row
"Manifest merging on the writer").
"""

from __future__ import annotations

import argparse
import base64
import io
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from benchmarks.harness import line_plot
from icecdc.bench import out_argument, positive_integers, print_results
from icecdc.bench.harness import bench_stack, progress
from icecdc.bench.report import machine, markdown_table, percentile, publish
from icecdc.ingest.filemeta import DATA_CONTENT, EQUALITY_DELETE_CONTENT, FOOTER_FIELD, parquet_footer
from icecdc.options import state_dir_argument
from icecdc.runtime.config import DEFAULT_STATE_DIR

say = progress("manifest-merging")
LOAD_CHUNK = 2_000  # files a loading commit adds: a few MB of descriptions through py4j
ROWS_PER_FILE = 1_000
COLUMNS = "id BIGINT, region STRING, status STRING, amount DECIMAL(12,2), updated_at TIMESTAMP"


@dataclass(frozen=True)
class MergingPoint:
    live_files: int
    min_count_to_merge: int
    manifests_before: int  # data and delete manifests as the timed commits began
    manifests_after: int
    manifest_bytes_after: int
    commit_ms: list[float]


@dataclass(frozen=True)
class MergingResults:
    machine: str
    commits: int
    series: list[MergingPoint]


def _footers() -> tuple[bytes, bytes]:
    """The footers of a data file of the bench's columns and of an equality-delete file on
    ``id``, as pyarrow writes them with Iceberg's field ids (1-5, the table's)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def field(name: str, kind: Any, field_id: int) -> Any:
        return pa.field(name, kind, metadata={"PARQUET:field_id": str(field_id)})

    ids = pa.array(range(ROWS_PER_FILE), pa.int64())
    data = pa.table(
        [
            ids,
            pa.array(["eu", "us", "apac", "latam"] * (ROWS_PER_FILE // 4)),
            pa.array(["placed", "shipped"] * (ROWS_PER_FILE // 2)),
            pa.array([i * 7 % 100_000 for i in range(ROWS_PER_FILE)], pa.decimal128(12, 2)),
            pa.array([1_767_225_600_000_000 + i * 1_000_000 for i in range(ROWS_PER_FILE)], pa.timestamp("us")),
        ],
        schema=pa.schema(
            [
                field("id", pa.int64(), 1),
                field("region", pa.string(), 2),
                field("status", pa.string(), 3),
                field("amount", pa.decimal128(12, 2), 4),
                field("updated_at", pa.timestamp("us"), 5),
            ]
        ),
    )
    keys = pa.table([ids], schema=pa.schema([field("id", pa.int64(), 1)]))
    footers = []
    for table in (data, keys):
        buffer = io.BytesIO()
        pq.write_table(table, buffer, compression="zstd")
        footers.append(parquet_footer(buffer.getvalue()))
    return footers[0], footers[1]


def _describe(path: str, footer: bytes, equality_deletes: bool = False) -> str:
    """Iceberg's content-file JSON of one unpartitioned file, as the ingester's ``describe``."""
    document: dict[str, Any] = {
        "spec-id": 0,
        "content": EQUALITY_DELETE_CONTENT if equality_deletes else DATA_CONTENT,
        "file-path": path,
        "file-format": "PARQUET",
        "file-size-in-bytes": 40_000,
        "record-count": ROWS_PER_FILE,
        FOOTER_FIELD: base64.b64encode(footer).decode(),
    }
    if equality_deletes:
        document["equality-ids"] = [1]
    return orjson.dumps(document).decode()


def _manifests(spark: Any, name: str) -> tuple[int, int]:
    row = spark.sql(f"SELECT count(*), coalesce(sum(length), 0) FROM {name}.manifests").first()
    return int(row[0]), int(row[1])


def measure(spark: Any, name: str, live_files: int, min_count: int, commits: int, footers: tuple[bytes, bytes]) -> MergingPoint:
    """Load ``live_files`` data files, merge the manifests, time ``commits`` writer commits."""
    from icecdc.domain.tableref import TableRef
    from icecdc.jvm.bridge import JavaBridge
    from icecdc.jvm.tables import IcebergTable

    catalog, identifier = name.split(".", 1)
    spark.sql(
        f"CREATE TABLE {name} ({COLUMNS}) USING iceberg TBLPROPERTIES "
        f"('format-version' = '2', 'commit.manifest.min-count-to-merge' = '{min_count}')"
    )
    table = IcebergTable(JavaBridge(spark), TableRef.of(catalog, identifier))
    data_footer, delete_footer = footers
    prefix = f"file:/nonexistent/{identifier}"
    for start in range(0, live_files, LOAD_CHUNK):
        chunk = [_describe(f"{prefix}/load-{i}.parquet", data_footer) for i in range(start, min(live_files, start + LOAD_CHUNK))]
        table.commit_files("bench load", chunk, [], {})
    spark.sql(f"CALL {catalog}.system.rewrite_manifests('{identifier}')")
    manifests_before, _ = _manifests(spark, name)
    commit_ms = []
    for i in range(commits):
        data = [_describe(f"{prefix}/batch-{i}.parquet", data_footer)]
        deletes = [_describe(f"{prefix}/batch-{i}-eq.parquet", delete_footer, equality_deletes=True)]
        started = time.perf_counter()
        table.commit_files("bench batch", data, deletes, {})
        commit_ms.append((time.perf_counter() - started) * 1000)
    manifests_after, manifest_bytes = _manifests(spark, name)
    return MergingPoint(live_files, min_count, manifests_before, manifests_after, manifest_bytes, commit_ms)


def run(live_files: Sequence[int], min_counts: Sequence[int], commits: int, out: Path, state_dir: Path) -> MergingResults:
    series: list[MergingPoint] = []
    footers = _footers()
    with bench_stack("manifest-merging", state_dir, broker=False) as stack:  # only Spark and the catalog
        namespace = f"{stack.config.catalog.name}.bench"
        stack.spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {namespace}")
        # A warm-up table first: the first commits of a JVM pay for its JIT, whichever setting runs first.
        for files, count in [(min(live_files), max(min_counts)), *((f, m) for f in live_files for m in min_counts)]:
            name = f"{namespace}.merging_{files}_{count}_{len(series)}_{stack.run_id}"
            try:
                point = measure(stack.spark, name, files, count, commits, footers)
            finally:
                stack.spark.sql(f"DROP TABLE IF EXISTS {name}")  # not PURGE: the files named do not exist
            series.append(point)
            say(
                ("the warm-up table, left out: " if len(series) == 1 else "")
                + f"{files:,} live files, min-count-to-merge {count}: a commit {statistics.median(point.commit_ms):.0f} ms "
                f"(p95 {percentile(point.commit_ms, 0.95):.0f}); {point.manifests_after} manifests, "
                f"{point.manifest_bytes_after / 1e6:.2f} MB after"
            )
    results = MergingResults(machine(), commits, series[1:])  # the warm-up table left out
    publish(out, "manifest-merging", results, _plot, summary)
    return results


def summary(results: MergingResults) -> str:
    rows = [
        [
            f"{p.live_files:,}",
            p.min_count_to_merge,
            f"{statistics.median(p.commit_ms):.0f}",
            f"{percentile(p.commit_ms, 0.95):.0f}",
            p.manifests_before,
            p.manifests_after,
            f"{p.manifest_bytes_after / 1e6:.2f}",
        ]
        for p in results.series
    ]
    return (
        f"{results.commits} commits of the writer's kind (one data file, one equality-delete file) timed on each "
        f"table, after a warm-up table; {results.machine}.\n\n"
        + markdown_table(
            [
                "live data files",
                "min-count-to-merge",
                "commit ms, median",
                "commit ms, p95",
                "manifests before",
                "manifests after",
                "manifest MB after",
            ],
            rows,
        )
        + "\n"
    )


def _plot(results: MergingResults, path: Path) -> None:
    counts = sorted({p.min_count_to_merge for p in results.series})
    files = sorted({p.live_files for p in results.series})
    by = {(p.live_files, p.min_count_to_merge): statistics.median(p.commit_ms) for p in results.series}
    line_plot(
        path,
        [float(f) for f in files],
        {f"min-count-to-merge {c}": [by[(f, c)] for f in files] for c in counts},
        "live data files",
        "writer commit, median ms",
        size=(6, 3.5),
    )


# ---- python -m benchmarks manifest-merging ----


def add_arguments(parser: argparse.ArgumentParser) -> None:
    state_dir_argument(parser, f"local state directory: catalog and warehouse, no broker (default: {DEFAULT_STATE_DIR})")
    parser.add_argument(
        "--live-files",
        default="1000,10000,50000",
        metavar="N[,N...]",
        help="live data files each table is loaded with (default: 1000,10000,50000)",
    )
    parser.add_argument(
        "--min-counts",
        default="2,8",
        metavar="N[,N...]",
        help="the tables' commit.manifest.min-count-to-merge (default: 2,8)",
    )
    parser.add_argument("--commits", type=int, default=30, help="writer commits timed on each table (default: 30)")
    out_argument(parser)


def main(args: argparse.Namespace) -> int:
    results = run(
        positive_integers(args.live_files, "--live-files"),
        positive_integers(args.min_counts, "--min-counts"),
        args.commits,
        args.out,
        args.state_dir.resolve(),
    )
    print_results(args.out, "manifest-merging", summary(results))
    return 0
