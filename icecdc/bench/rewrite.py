"""``icecdc bench rewrite``: how fast the compactor rewrites, deletes applied, against the raw cost
of reading and writing the same bytes with pyarrow alone on the same machine (the practical
limit: no deletes to apply, no Spark, no commit).

One partition is filled by the ingester's writer in several batches, then updated and deleted
in a share of its rows (equality deletes). The compactor's delete merge of that partition is
timed (``PartitionCompaction.run``: listing excluded, the Spark read that applies the deletes,
the write of target-sized files) without committing it, so that it can be repeated on the same
files; what a failed commit leaves is deleted by the rewrite itself. The pyarrow side reads each
of the same data files and writes it out again on one thread. Both are reported in MB of input
data files per second per core.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from icecdc import kafka
from icecdc.bench.report import machine, markdown_table, publish
from icecdc.broker import EmbeddedBroker, free_port
from icecdc.catalog import ensure_tables, pyiceberg_catalog, qualified
from icecdc.config import Config, embedded_config
from icecdc.fileio import file_io
from icecdc.workload import OrdersWorkload, orders_table

MB = 1e6


class _DryRun(Exception):
    """Raised in place of the commit: the rewrite is measured, not kept."""


def _refuse_commit(attempt: Any) -> Any:
    raise _DryRun


def _progress(message: str) -> None:
    print(f"[bench rewrite] {message}", flush=True)


def _pyarrow_copy_seconds(paths: list[str], io_properties: dict[str, str]) -> float:
    """Read every file and write it again, single-threaded."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        for number, path in enumerate(paths):
            with file_io(path, io_properties).new_input(path).open() as stream:
                table = pq.read_table(stream, use_threads=False)
            pq.write_table(table, os.path.join(scratch, f"{number}.parquet"), compression="zstd")
    return time.perf_counter() - started


def run(rows: int, batches: int, deleted_share: float, repeats: int, out: Path, state_dir: Path) -> dict[str, Any]:
    from icecdc.compactor.metadata import load_table_partitions
    from icecdc.compactor.policy import Work, plan_rewrite
    from icecdc.compactor.rewrite import COMPACTOR_PROPERTY, PartitionCompaction
    from icecdc.ingest.publish import CommitEventPublisher
    from icecdc.ingest.sources import records_to_dataframe, source_rows
    from icecdc.ingest.writer import BatchWriter
    from icecdc.spark import create_spark_session

    port = free_port()
    broker = EmbeddedBroker(state_dir / "broker", port)
    broker.start()
    try:
        run_id = int(time.time())
        base = embedded_config(state_dir, port)
        data = base.model_dump(by_alias=True)
        data["tables"] = [orders_table(f"bench.rewrite_{run_id}", f"rewrite-{run_id}")]
        config = Config.model_validate(data)
        table = config.tables[0]
        spark = create_spark_session(config, "icecdc-bench-rewrite")
        cores = spark.sparkContext.defaultParallelism
        ensure_tables(spark, config)
        producer = kafka.producer(config.kafka)
        writer = BatchWriter(spark, config, producer, CommitEventPublisher(producer, config.commit_topic), "bench")
        # One day: every batch adds one file to each region's partition.
        orders = OrdersWorkload(seed=3, today=0)
        offset = 0
        for number in range(batches):
            pairs = [c.record for c in orders.load(rows // batches)]
            writer(records_to_dataframe(spark, source_rows(table.topic, pairs, offset)), number)
            offset += len(pairs)
        changes = [c.record for c in orders.changes(int(rows * deleted_share), updates=0.5, inserts=0.0)]
        writer(records_to_dataframe(spark, source_rows(table.topic, changes, offset)), batches)
        producer.flush(10)
        settings = config.compactor
        metadata = load_table_partitions(pyiceberg_catalog(config), table, settings)
        largest = max(metadata.partitions.values(), key=lambda p: p.stats.data_bytes)
        key = tuple(largest.partition.get(term.name) for term in metadata.layout.partition)
        _progress(f"{rows:,} rows, {len(changes):,} updated or deleted; rewriting partition {key} "
                  f"({largest.stats.data_files} files, {largest.stats.equality_delete_files} equality-delete files)")
        layout = metadata.layout
        icecdc_seconds = []
        for attempt in range(repeats + 1):
            compaction = PartitionCompaction(spark, qualified(config, table), layout, key, config.catalog.properties,
                                             settings.target_file_size_bytes)
            files = compaction.files()
            plan = plan_rewrite(files, Work.DELETE_MERGE, settings)
            started = time.perf_counter()
            try:
                compaction.run(plan, {COMPACTOR_PROPERTY: "bench"}, commit=_refuse_commit)
            except _DryRun:
                pass
            if attempt:  # the first is a warm-up
                icecdc_seconds.append(time.perf_counter() - started)
        paths = list(plan.rewrite)
        input_bytes = sum(f.size for f in files.data if f.path in set(paths))
        pyarrow_seconds = [_pyarrow_copy_seconds(paths, config.catalog.properties) for _ in range(repeats)]
        spark.sql(f"DROP TABLE {qualified(config, table)} PURGE")
    finally:
        broker.stop()
    icecdc_rate = input_bytes / MB / statistics.median(icecdc_seconds) / cores
    pyarrow_rate = input_bytes / MB / statistics.median(pyarrow_seconds)
    results = {
        "machine": machine(), "rows": rows, "files": len(paths), "input_bytes": input_bytes, "deleted_share": deleted_share,
        "cores": cores, "icecdc_seconds": icecdc_seconds, "pyarrow_seconds": pyarrow_seconds,
        "icecdc_mb_per_second_per_core": icecdc_rate, "pyarrow_mb_per_second_per_core": pyarrow_rate,
    }
    publish(out, "rewrite", results, _plot, summary)
    return results


def summary(results: dict[str, Any]) -> str:
    ratio = results["icecdc_mb_per_second_per_core"] / results["pyarrow_mb_per_second_per_core"]
    return (f"One partition of {results['files']} data files, {results['input_bytes'] / MB:.1f} MB, "
            f"{results['deleted_share']:.0%} of its rows updated or deleted by equality deletes; medians of "
            f"{len(results['icecdc_seconds'])} runs after a warm-up; {results['machine']}.\n\n"
            + markdown_table(["path", "seconds", "MB/s per core", "vs pyarrow"], [
                ["icecdc delete merge (Spark, deletes applied, target-sized files)",
                 f"{statistics.median(results['icecdc_seconds']):.2f}", f"{results['icecdc_mb_per_second_per_core']:.1f}",
                 f"{ratio:.2f}x"],
                ["pyarrow read + write, one thread, no deletes", f"{statistics.median(results['pyarrow_seconds']):.2f}",
                 f"{results['pyarrow_mb_per_second_per_core']:.1f}", "1.00x"],
            ]) + "\n")


def _plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3))
    labels = ["icecdc delete merge", "pyarrow read + write"]
    values = [results["icecdc_mb_per_second_per_core"], results["pyarrow_mb_per_second_per_core"]]
    ax.barh(labels, values)
    ax.set_xlabel("MB of input data files per second per core")
    ax.set_title("Rewrite throughput")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
