"""``python -m benchmarks scale``: the compactor's own work (reconcile, decisions, status, listing)
as a table grows in partitions and files, its data tiny so that only the metadata grows
(docs/BENCHMARKS.md, row "Compactor cost at scale").
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson

from benchmarks.harness import int_partitioned_table, rss_kib, rss_peak_reset
from icecdc.bench import out_argument, positive_integers, print_results
from icecdc.bench.harness import FeedWriter, bench_stack, clone, progress
from icecdc.bench.report import machine, markdown_table, publish, pyplot
from icecdc.options import state_dir_argument

say = progress("scale")
STEPS = ("reconcile", "re-reconcile", "decision", "status", "listing")
T = TypeVar("T")


@dataclass
class StepCost:
    seconds: list[float] = field(default_factory=list)
    peak_mib: float = 0.0  # peak resident memory growth of this process (the JVM's heap growth for the listing)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


@dataclass
class ShapePoint:
    partitions: int
    files: int
    manifests: int
    build_seconds: float
    costs: dict[str, StepCost] = field(default_factory=dict)


@dataclass
class ScaleResults:
    machine: str
    batches: int
    repeats: int
    series: list[ShapePoint] = field(default_factory=list)


def _measure(step: Callable[[], T], repeats: int) -> tuple[StepCost, T]:
    cost = StepCost()
    result: Any = None
    for _ in range(repeats):
        before = rss_kib("VmRSS")
        rss_peak_reset()
        started = time.perf_counter()
        result = step()
        cost.seconds.append(time.perf_counter() - started)
        cost.peak_mib = max(cost.peak_mib, max(0, rss_kib("VmHWM") - before) / 1024)
    return cost, result


def measure_shape(stack: Any, partitions: int, batches: int, repeats: int) -> ShapePoint:
    from icecdc.compactor import status
    from icecdc.compactor.metadata import ManifestCache, load_table_partitions
    from icecdc.compactor.tracker import PartitionTracker
    from icecdc.jvm.bridge import JavaBridge
    from icecdc.jvm.listing import list_partition
    from icecdc.jvm.tables import IcebergTable
    from icecdc.runtime.catalog import pyiceberg_catalog

    spark = stack.spark
    config = clone(
        stack.config,
        tables=[int_partitioned_table(f"bench.scale_{partitions}_{stack.run_id}", f"scale-{partitions}-{stack.run_id}")],
        commit_topic=f"scale-commits-{partitions}-{stack.run_id}",
        state_dir=str(Path(stack.config.state_dir) / f"scale-{partitions}"),
        ingest={"max_batch_records": partitions},
    )
    table = config.tables[0]
    ref = config.table_ref(table)
    feed = FeedWriter(spark, config, "bench-scale")
    started = time.monotonic()
    try:
        for batch in range(batches):
            records = [
                (
                    orjson.dumps({"id": batch * partitions + p}),
                    orjson.dumps({"op": "c", "after": {"id": batch * partitions + p, "p": p, "v": "x"}}),
                )
                for p in range(partitions)
            ]
            feed.write(records, batch)
            say(f"{partitions:,} partitions: batch {batch + 1}/{batches} written")
    finally:
        feed.close()
    build = time.monotonic() - started
    catalog = pyiceberg_catalog(config)
    metadata_table = catalog.load_table(ref.identifier)
    current = metadata_table.current_snapshot()
    if current is None:
        raise RuntimeError(f"{ref} has no snapshot after its batches")
    files = len(metadata_table.inspect.files())
    manifests = len(current.manifests(metadata_table.io))
    point = ShapePoint(partitions, files, manifests, build)

    point.costs["reconcile"], read = _measure(lambda: load_table_partitions(catalog, ref, table, config.compactor), repeats)
    if read is None:
        raise RuntimeError(f"{ref} disappeared")
    loaded = read
    cache = ManifestCache()
    if load_table_partitions(catalog, ref, table, config.compactor, cache) != loaded:
        raise RuntimeError("a read through the manifest cache differs from a full read")
    point.costs["re-reconcile"], _ = _measure(
        lambda: load_table_partitions(catalog, ref, table, config.compactor, cache), repeats
    )
    if cache.opened:
        raise RuntimeError(f"re-reading the unchanged {ref} opened {cache.opened} manifests")
    tracker = PartitionTracker(config.compactor)
    tracker.on_metadata(table.name, loaded.sequence_number, loaded.partitions)
    later = time.time() + 3600  # every partition settled

    def decide() -> int:
        return len(tracker.candidates(later)) + len(tracker.waiting(later))

    point.costs["decision"], _ = _measure(decide, repeats)
    point.costs["status"], _ = _measure(lambda: status.render(status.collect(config)), repeats)

    bridge = JavaBridge(spark)
    java_table = IcebergTable(bridge, ref)
    keys = [tuple(p.partition[t.name] for t in loaded.layout.partition) for p in list(loaded.partitions.values())[:repeats]]
    listing = StepCost()
    for key in keys:
        heap = bridge.heap_used_bytes()
        started_at = time.perf_counter()
        listed = list_partition(java_table, loaded.layout, key)
        listing.seconds.append(time.perf_counter() - started_at)
        listing.peak_mib = max(listing.peak_mib, max(0, bridge.heap_used_bytes() - heap) / 2**20)
        if listed is None or not listed.data:
            raise RuntimeError(f"partition {key} listed no file")
    point.costs["listing"] = listing
    spark.sql(f"DROP TABLE IF EXISTS {ref.qualified} PURGE")
    say(
        f"{partitions:,} partitions, {files:,} files, {manifests} manifests: "
        + ", ".join(f"{s} {point.costs[s].median * 1000:.0f} ms" for s in STEPS)
    )
    return point


def run(partition_counts: Sequence[int], batches: int, repeats: int, out: Path, state_dir: Path) -> ScaleResults:
    results = ScaleResults(machine(), batches, repeats)
    with bench_stack("scale", state_dir, spark={"conf": {"spark.driver.memory": "4g"}}) as stack:
        for partitions in partition_counts:
            results.series.append(measure_shape(stack, partitions, batches, repeats))
    publish(out, "scale", results, _plot, summary)
    return results


def summary(results: ScaleResults) -> str:
    rows = []
    for p in results.series:
        row: list[Any] = [f"{p.partitions:,}", f"{p.files:,}", p.manifests]
        for step in STEPS:
            cost = p.costs[step]
            per_file = cost.median / p.files * 1e6 if step != "listing" else None
            row.append(f"{cost.median * 1000:.0f}" + (f" ({per_file:.0f} µs/file)" if per_file is not None else ""))
            row.append(f"{cost.peak_mib:.0f}")
        rows.append(row)
    header = ["partitions", "live files", "manifests"]
    for step in STEPS:
        header += [f"{step} ms", f"{step} MiB"]
    return (
        f"{results.batches} writer batches per table, each adding a data and an equality-delete file to every partition; "
        f"medians of {results.repeats}; memory: peak resident growth of the Python process (listing: JVM heap growth); "
        f"{results.machine}.\n\n" + markdown_table(header, rows) + "\n"
    )


def _plot(results: ScaleResults, path: Path) -> None:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    files = [p.files for p in results.series]
    for step in STEPS:
        left.plot(files, [p.costs[step].median for p in results.series], marker="o", label=step)
        right.plot(files, [p.costs[step].median / p.files * 1e6 for p in results.series], marker="o", label=step)
    for ax, title in ((left, "seconds"), (right, "µs per live file (flat: linear cost)")):
        ax.set_xscale("log")
        ax.set_xlabel("live files")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    left.set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---- python -m benchmarks scale ----


def add_arguments(parser: argparse.ArgumentParser) -> None:
    state_dir_argument(parser)
    parser.add_argument(
        "--partitions", default="100,1000,10000", metavar="N[,N...]", help="partitions of each table (default: 100,1000,10000)"
    )
    parser.add_argument(
        "--batches", type=int, default=5, help="writer batches per table, two files per partition each (default: 5)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="measurements of each step (default: 3)")
    out_argument(parser)


def main(args: argparse.Namespace) -> int:
    counts = positive_integers(args.partitions, "--partitions")
    results = run(counts, args.batches, args.repeats, args.out, args.state_dir.resolve())
    print_results(args.out, "scale", summary(results))
    return 0
