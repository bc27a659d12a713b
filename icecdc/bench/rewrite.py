"""``icecdc bench rewrite``: how fast the compactor rewrites, deletes applied, against the raw cost
of reading and writing the same bytes with pyarrow alone on the same machine (the practical
limit: no deletes to apply, no Spark, no commit).

Four partitions (one day, four regions) are loaded by Spark in several INSERTs (a file each per
partition), then the ingester's writer updates and deletes a share of the rows (equality deletes,
updates moving some rows to another region). The compactor's delete merge of that partition is
timed (``PartitionCompaction.run``: listing excluded, the Spark read that applies the deletes,
the write of target-sized files) without committing it, so that it can be repeated on the same
files; what a failed commit leaves is deleted by the rewrite itself. The pyarrow side reads each
of the same data files and writes it out again on one thread. Both are reported in MB of input
data files per second per core, and Spark's own stage metrics of the last timed rewrite say
where its time went.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq

from icecdc import summary as summary_keys
from icecdc.bench.harness import FeedWriter, StageCost, bench_stack, clone, last_stage_id, progress, stage_table, stages_since
from icecdc.bench.ingest import ChangingTable, base_sql
from icecdc.bench.report import machine, markdown_table, publish, pyplot
from icecdc.fileio import file_io
from icecdc.workload import orders_table

MB = 1e6
CHANGES_PER_BATCH = 200_000  # the writer's batches of updates and deletes
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


def run(rows: int, batches: int, deleted_share: float, repeats: int, out: Path, state_dir: Path) -> RewriteResults:
    from icecdc.catalog import pyiceberg_catalog
    from icecdc.compactor.metadata import load_table_partitions
    from icecdc.compactor.plans import plan_rewrite
    from icecdc.compactor.policy import Work
    from icecdc.compactor.rewrite import PartitionCompaction
    from icecdc.jvm.bridge import JavaBridge
    from icecdc.jvm.tables import IcebergTable

    with bench_stack("rewrite", state_dir) as stack:
        config = clone(stack.config, tables=[orders_table(f"bench.rewrite_{stack.run_id}", f"rewrite-{stack.run_id}")])
        table = config.tables[0]
        ref = config.table_ref(table)
        spark = stack.spark
        cores = spark.sparkContext.defaultParallelism
        feed = FeedWriter(spark, clone(config, ingest={"max_batch_records": CHANGES_PER_BATCH}))
        # The rows are loaded by Spark in ``batches`` INSERTs over one day, so each adds a file to
        # each region's partition (through the writer, the load would take most of a 20M-row run).
        for number in range(batches):
            first, last = number * rows // batches + 1, (number + 1) * rows // batches
            spark.sql(f"INSERT INTO {ref.qualified} {base_sql(last, days=1, first=first)}")
            say(f"loaded rows {first:,} to {last:,}")
        # Then the writer updates (moving some to another region) or deletes a share of them.
        source = ChangingTable(rows, days=1)
        changed = int(rows * deleted_share)
        for number, start in enumerate(range(0, changed, CHANGES_PER_BATCH)):
            batch = source.batch(min(CHANGES_PER_BATCH, changed - start), updates=0.5, inserts=0.0)
            feed.write([(orjson.dumps({"id": key}), value) for _, key, _, value in batch], number)
            say(f"changed {start + len(batch):,} of {changed:,} rows")
        feed.close()
        changes = source.changed
        settings = config.compactor
        metadata = load_table_partitions(pyiceberg_catalog(config), ref, table, settings)
        if metadata is None:
            raise RuntimeError(f"{ref} was not created")
        largest = max(metadata.partitions.values(), key=lambda p: p.stats.data_bytes)
        key = tuple(largest.partition.get(term.name) for term in metadata.layout.partition)
        say(
            f"{rows:,} rows, {len(changes):,} updated or deleted; rewriting partition {key} "
            f"({largest.stats.data_files} files, {largest.stats.equality_delete_files} equality-delete files)"
        )
        iceberg_table = IcebergTable(JavaBridge(spark), ref)
        icecdc_seconds: list[float] = []
        stages: list[StageCost] = []
        sizes: dict[str, int] = {}
        paths: list[str] = []
        for attempt in range(repeats + 1):
            compaction = PartitionCompaction(
                spark, iceberg_table, metadata.layout, key, config.catalog.properties, settings.target_file_size_bytes
            )
            files = compaction.files()
            if files is None:
                raise RuntimeError(f"{ref} has no snapshot")
            plan = plan_rewrite(files, Work.DELETE_MERGE, settings)
            sizes, paths = {f.path: f.size for f in files.data}, list(plan.rewrite)
            before = last_stage_id(spark)
            started = time.perf_counter()
            with contextlib.suppress(_DryRun):
                compaction.run(plan, {summary_keys.COMPACTOR: "bench"}, commit=_refuse_commit)
            if attempt:  # the first is a warm-up
                icecdc_seconds.append(time.perf_counter() - started)
                say(f"rewrite {attempt}/{repeats}: {icecdc_seconds[-1]:.2f}s")
                stages = stages_since(spark, before)
        input_bytes = sum(sizes[p] for p in paths)
        pyarrow_seconds = [_pyarrow_copy_seconds(paths, config.catalog.properties) for _ in range(repeats)]
        spark.sql(f"DROP TABLE {ref.qualified} PURGE")
    results = RewriteResults(
        machine(),
        rows,
        len(paths),
        input_bytes,
        deleted_share,
        cores,
        icecdc_seconds,
        pyarrow_seconds,
        input_bytes / MB / statistics.median(icecdc_seconds) / cores,
        input_bytes / MB / statistics.median(pyarrow_seconds),
        stages,
    )
    publish(out, "rewrite", results, _plot, summary)
    return results


def summary(results: RewriteResults) -> str:
    ratio = results.icecdc_mb_per_second_per_core / results.pyarrow_mb_per_second_per_core
    return (
        f"One partition of {results.files} data files, {results.input_bytes / MB:.1f} MB, "
        f"{results.deleted_share:.0%} of its rows updated or deleted by equality deletes; medians of "
        f"{len(results.icecdc_seconds)} runs after a warm-up; {results.machine}.\n\n"
        + markdown_table(
            ["path", "seconds", "MB/s per core", "vs pyarrow"],
            [
                [
                    "icecdc delete merge (Spark, deletes applied, target-sized files)",
                    f"{statistics.median(results.icecdc_seconds):.2f}",
                    f"{results.icecdc_mb_per_second_per_core:.1f}",
                    f"{ratio:.2f}x",
                ],
                [
                    "pyarrow read + write, one thread, no deletes",
                    f"{statistics.median(results.pyarrow_seconds):.2f}",
                    f"{results.pyarrow_mb_per_second_per_core:.1f}",
                    "1.00x",
                ],
            ],
        )
        + f"\n\nThe last timed rewrite's Spark stages ({results.cores} cores; task times summed over tasks):\n\n"
        + stage_table(results.stages)
        + "\n"
    )


def _plot(results: RewriteResults, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3))
    labels = ["icecdc delete merge", "pyarrow read + write"]
    ax.barh(labels, [results.icecdc_mb_per_second_per_core, results.pyarrow_mb_per_second_per_core])
    ax.set_xlabel("MB of input data files per second per core")
    ax.set_title("Rewrite throughput")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
