"""``python -m benchmarks rewrite``: the compactor's delete merge of one partition, timed without its
commit, against reading and writing the same files with pyarrow alone, with Spark's stage costs
(docs/BENCHMARKS.md, row "Rewrite throughput").
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq

from benchmarks.harness import StageCost, last_stage_id, stage_table, stages_since
from icecdc.bench import out_argument, print_results
from icecdc.bench.harness import FeedWriter, bench_stack, clone, progress
from icecdc.bench.ingest import ChangingTable, base_sql
from icecdc.bench.report import machine, markdown_table, publish, pyplot
from icecdc.domain import summary as summary_keys
from icecdc.ingest.batch_decisions import ROWS_PER_WRITE_TASK
from icecdc.options import embedded_stack_arguments
from icecdc.runtime.fileio import file_io
from icecdc.workload import REGIONS, orders_table

MB = 1e6
# The writer's batches of updates and deletes, each written by one task: one data file a batch in
# the partition measured (``--batches`` counts them).
CHANGES_PER_BATCH = ROWS_PER_WRITE_TASK
say = progress("rewrite")


@dataclass(frozen=True)
class RewriteResults:
    machine: str
    rows: int
    files: int
    input_bytes: int
    deleted_share: float
    cores: int
    icecdc_seconds: list[float]
    pyarrow_seconds: list[float]
    icecdc_mb_per_second_per_core: float
    pyarrow_mb_per_second_per_core: float
    stages: list[StageCost]  # the Spark stages of the last timed rewrite: where its time went
    # The same partition rewritten before any change, so with no delete to apply.
    plain_input_bytes: int
    plain_seconds: list[float]
    plain_stages: list[StageCost]
    # The same delete merge by the arrow rewrite engine (pyarrow on executors), side by side.
    arrow_seconds: list[float] = field(default_factory=list)

    @property
    def plain_mb_per_second_per_core(self) -> float:
        return self.plain_input_bytes / MB / statistics.median(self.plain_seconds) / self.cores

    @property
    def arrow_mb_per_second_per_core(self) -> float:
        return self.input_bytes / MB / statistics.median(self.arrow_seconds) / self.cores


@dataclass
class TimedRewrites:
    seconds: list[float] = field(default_factory=list)
    stages: list[StageCost] = field(default_factory=list)  # of the last one
    paths: list[str] = field(default_factory=list)
    input_bytes: int = 0


class _DryRun(Exception):
    """Raised in place of the commit: the rewrite is measured, not kept."""


def _refuse_commit(attempt: Any) -> Any:
    raise _DryRun


def _pyarrow_copy_seconds(paths: list[str], io_properties: dict[str, str]) -> float:
    """Read every file and write it again, single-threaded."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        for number, path in enumerate(paths):
            with file_io(path, io_properties).new_input(path).open() as stream:
                table = pq.read_table(stream, use_threads=False)
            pq.write_table(table, os.path.join(scratch, f"{number}.parquet"), compression="zstd")
    return time.perf_counter() - started


def run(
    rows: int, batches: int, deleted_share: float, repeats: int, out: Path, state_dir: Path, regions: int = len(REGIONS)
) -> RewriteResults:
    from icecdc.compactor.metadata import load_table_partitions
    from icecdc.compactor.plans import PartitionFiles, RewritePlan, plan_rewrite
    from icecdc.compactor.policy import Work
    from icecdc.compactor.rewrite import PartitionCompaction
    from icecdc.jvm.bridge import JavaBridge
    from icecdc.jvm.tables import IcebergTable
    from icecdc.runtime.catalog import pyiceberg_catalog
    from icecdc.runtime.config import RewriteEngine

    with bench_stack("rewrite", state_dir, spark={"conf": {"spark.driver.memory": "4g"}}) as stack:
        config = clone(stack.config, tables=[orders_table(f"bench.rewrite_{stack.run_id}", f"rewrite-{stack.run_id}")])
        table = config.tables[0]
        ref = config.table_ref(table)
        spark = stack.spark
        cores = spark.sparkContext.defaultParallelism
        settings = config.compactor
        feed = FeedWriter(spark, clone(config, ingest={"max_batch_records": CHANGES_PER_BATCH}))  # creates the table
        iceberg_table = IcebergTable(JavaBridge(spark), ref)

        def timed(
            key: tuple[object, ...], plan_of: Callable[[PartitionFiles], RewritePlan], engine: RewriteEngine
        ) -> TimedRewrites:
            """One warm-up and ``repeats`` timed rewrites of the partition, none committed."""
            layout = load_table_partitions(pyiceberg_catalog(config), ref, table, settings)
            if layout is None:
                raise RuntimeError(f"{ref} was not created")
            timings = TimedRewrites()
            for attempt in range(repeats + 1):
                compaction = PartitionCompaction(
                    spark, iceberg_table, layout.layout, key, config.catalog.properties, settings.target_file_size_bytes, engine
                )
                files = compaction.files()
                if files is None:
                    raise RuntimeError(f"{ref} has no snapshot")
                plan = plan_of(files)
                sizes = {f.path: f.size for f in files.data}
                timings.paths, timings.input_bytes = list(plan.rewrite), sum(sizes[p] for p in plan.rewrite)
                before = last_stage_id(spark)
                started = time.perf_counter()
                with contextlib.suppress(_DryRun):
                    compaction.run(plan, {summary_keys.COMPACTOR: "bench"}, commit=_refuse_commit)
                if attempt:  # the first is a warm-up
                    timings.seconds.append(time.perf_counter() - started)
                    timings.stages = stages_since(spark, before)
                    say(f"{plan.work.value} ({engine.value}) {attempt}/{repeats}: {timings.seconds[-1]:.2f}s")
            return timings

        # The rows are loaded by Spark in ``batches`` INSERTs over one day, so each adds a file to
        # each region's partition (through the writer, the load would take most of a 20M-row run).
        for number in range(batches):
            first, last = number * rows // batches + 1, (number + 1) * rows // batches
            spark.sql(f"INSERT INTO {ref.qualified} {base_sql(last, days=1, first=first, regions=regions)}")
            say(f"loaded rows {first:,} to {last:,}")
        loaded = load_table_partitions(pyiceberg_catalog(config), ref, table, settings)
        if loaded is None:
            raise RuntimeError(f"{ref} was not created")
        largest = max(loaded.partitions.values(), key=lambda p: p.stats.data_bytes)
        key = tuple(largest.partition.get(term.name) for term in loaded.layout.partition)
        # The same machinery with no delete to apply: what reading and writing costs in Spark.
        plain = timed(key, lambda files: RewritePlan(Work.MINOR, rewrite=tuple(f.path for f in files.data)), RewriteEngine.SPARK)
        # Then the writer updates (moving some to another region) or deletes a share of the rows.
        source = ChangingTable(rows, days=1, regions=regions)
        changed = int(rows * deleted_share)
        for number, start in enumerate(range(0, changed, CHANGES_PER_BATCH)):
            batch = source.batch(min(CHANGES_PER_BATCH, changed - start), updates=0.5, inserts=0.0)
            feed.write([(orjson.dumps({"id": k}), value) for _, k, _, value in batch], number)
            say(f"changed {start + len(batch):,} of {changed:,} rows")
        feed.close()
        say(f"{rows:,} rows, {len(source.changed):,} updated or deleted; rewriting partition {key}")
        merge = timed(key, lambda files: plan_rewrite(files, Work.DELETE_MERGE, settings), RewriteEngine.SPARK)
        arrow = timed(key, lambda files: plan_rewrite(files, Work.DELETE_MERGE, settings), RewriteEngine.ARROW)
        pyarrow_seconds = [_pyarrow_copy_seconds(merge.paths, config.catalog.properties) for _ in range(repeats)]
        spark.sql(f"DROP TABLE {ref.qualified} PURGE")
    results = RewriteResults(
        machine(),
        rows,
        len(merge.paths),
        merge.input_bytes,
        deleted_share,
        cores,
        merge.seconds,
        pyarrow_seconds,
        merge.input_bytes / MB / statistics.median(merge.seconds) / cores,
        merge.input_bytes / MB / statistics.median(pyarrow_seconds),
        merge.stages,
        plain.input_bytes,
        plain.seconds,
        plain.stages,
        arrow.seconds,
    )
    publish(out, "rewrite", results, _plot, summary)
    return results


def summary(results: RewriteResults) -> str:
    pyarrow = results.pyarrow_mb_per_second_per_core

    def row(path: str, seconds: list[float], per_core: float) -> list[str]:
        return [path, f"{statistics.median(seconds):.2f}", f"{per_core:.1f}", f"{per_core / pyarrow:.2f}x"]

    return (
        f"One partition of {results.files} data files, {results.input_bytes / MB:.1f} MB, "
        f"{results.deleted_share:.0%} of its rows updated or deleted by equality deletes; medians of "
        f"{len(results.icecdc_seconds)} runs after a warm-up; {results.machine}.\n\n"
        + markdown_table(
            ["path", "seconds", "MB/s per core", "vs pyarrow"],
            [
                row(
                    "icecdc delete merge, arrow engine (pyarrow on executors; the default on format v2)",
                    results.arrow_seconds,
                    results.arrow_mb_per_second_per_core,
                ),
                row(
                    "icecdc delete merge, spark engine (Iceberg's Spark reader and writer)",
                    results.icecdc_seconds,
                    results.icecdc_mb_per_second_per_core,
                ),
                row(
                    f"icecdc rewrite of the same partition before the changes, no deletes ({results.plain_input_bytes / MB:.1f} MB)",
                    results.plain_seconds,
                    results.plain_mb_per_second_per_core,
                ),
                row("pyarrow read + write, one thread, no deletes", results.pyarrow_seconds, pyarrow),
            ],
        )
        + f"\n\nSpark stages of the last timed delete merge by the spark engine ({results.cores} cores; task times summed over tasks):\n\n"
        + stage_table(results.stages)
        + "\n\nAnd of the last rewrite with no deletes:\n\n"
        + stage_table(results.plain_stages)
        + "\n"
    )


def _plot(results: RewriteResults, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3))
    labels = ["delete merge, arrow engine", "delete merge, spark engine", "spark rewrite, no deletes", "pyarrow read + write"]
    values = [
        results.arrow_mb_per_second_per_core,
        results.icecdc_mb_per_second_per_core,
        results.plain_mb_per_second_per_core,
        results.pyarrow_mb_per_second_per_core,
    ]
    ax.barh(labels, values)
    ax.set_xlabel("MB of input data files per second per core")
    ax.set_title("Rewrite throughput")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---- python -m benchmarks rewrite ----


def add_arguments(parser: argparse.ArgumentParser) -> None:
    embedded_stack_arguments(parser)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows written (default: 1000000)")
    parser.add_argument("--batches", type=int, default=12, help="batches they are written in: files per partition (default: 12)")
    parser.add_argument("--deleted-share", type=float, default=0.1, help="share of rows then updated or deleted (default: 0.1)")
    parser.add_argument(
        "--regions",
        type=int,
        choices=range(1, 5),
        default=4,
        help="regions the rows spread over, one partition each; 1 puts them all in the timed one (default: 4)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed runs after one warm-up (default: 3)")
    out_argument(parser)


def main(args: argparse.Namespace) -> int:
    results = run(args.rows, args.batches, args.deleted_share, args.repeats, args.out, args.state_dir.resolve(), args.regions)
    print_results(args.out, "rewrite", summary(results))
    return 0
