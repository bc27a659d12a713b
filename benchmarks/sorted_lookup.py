"""``python -m benchmarks sorted-lookup``: what a point lookup on a table's sort key costs before
and after the sidecar's compactions (docs/BENCHMARKS.md, row "Lookups on a sorted table"). Two
tables get the same batches from the ingester, each batch's ids spread over the whole key range,
so every batch file's id bounds admit almost every key. One table is declared
``WRITE ORDERED BY id``, the other has no sort order. The sidecar compacts both; the bench then
checks that every data file of the sorted table is sorted by id.

A lookup's cost is counted as Iceberg plans it: the data files whose id bounds admit the key. Its
latency is Spark's ``SELECT * WHERE id = k``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from benchmarks.harness import column_figure, int_partitioned_table, settled_config
from icecdc.bench import out_argument, print_results
from icecdc.bench.harness import BenchStack, FeedWriter, bench_stack, progress
from icecdc.bench.report import machine, markdown_table, publish
from icecdc.options import state_dir_argument

say = progress("sorted-lookup")
TABLES = ("sorted", "unsorted")
STAGES = ("before", "after")
# The sidecar's turns are bounded: a job a partition a table, and the turns that find nothing left.
MAX_TURNS = 200


@dataclass(frozen=True)
class Lookups:
    """Point lookups on one table at one stage."""

    data_files: int
    files_per_lookup: float  # median data files whose id bounds admit the key
    lookup_ms: list[float]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.lookup_ms)


@dataclass
class SortedLookupRun:
    lookups: dict[str, dict[str, Lookups]] = field(default_factory=dict)  # table -> stage -> lookups
    compactions: dict[str, int] = field(default_factory=dict)
    every_file_sorted: bool = False


@dataclass
class SortedLookupResults:
    machine: str
    partitions: int
    rows: int
    batches: int
    keys: int
    runs: list[SortedLookupRun] = field(default_factory=list)


def _lookups(spark: Any, name: str, keys: list[int]) -> Lookups:
    spark.sql(f"REFRESH TABLE {name}")
    files = spark.sql(
        f"SELECT readable_metrics.id.lower_bound AS low, readable_metrics.id.upper_bound AS high FROM {name}.files "
        "WHERE content = 0"
    ).collect()
    admitting = [sum(f.low <= key <= f.high for f in files) for key in keys]
    for key in keys[:5]:  # warm-up: the first queries pay for planning caches and the JIT
        spark.sql(f"SELECT * FROM {name} WHERE id = {key}").collect()
    latencies = []
    for key in keys:
        started = time.perf_counter()
        spark.sql(f"SELECT * FROM {name} WHERE id = {key}").collect()
        latencies.append((time.perf_counter() - started) * 1000)
    return Lookups(len(files), statistics.median(admitting), latencies)


def _every_file_sorted(spark: Any, name: str) -> bool:
    import pyarrow.parquet as pq

    for row in spark.sql(f"SELECT file_path FROM {name}.files WHERE content = 0").collect():
        ids = pq.read_table(row.file_path.removeprefix("file:"), columns=["id"]).column("id").to_pylist()
        if ids != sorted(ids):
            return False
    return True


def _compact(config: Any, spark: Any) -> int:
    """The sidecar's turns until none is due; the compactions it committed."""
    from icecdc.compactor.sidecar import create_sidecar
    from icecdc.domain.events import CompactionOutcome

    sidecar = create_sidecar(config, spark)
    committed = 0
    try:
        for _ in range(MAX_TURNS):
            events = sidecar.run_once(poll_timeout=0.5)
            failed = [e for e in events if e.outcome not in (CompactionOutcome.COMMITTED, CompactionOutcome.SKIPPED)]
            if failed:
                raise RuntimeError(f"a compaction did not commit: {failed[0]}")
            committed += sum(e.outcome is CompactionOutcome.COMMITTED for e in events)
            if not events and not sidecar.candidates(time.time()):
                return committed
    finally:
        sidecar.close()
    raise RuntimeError(f"the sidecar still had work after {MAX_TURNS} turns")


def measure(stack: BenchStack, label: str, partitions: int, rows: int, batches: int, keys: int) -> SortedLookupRun:
    spark, run = stack.spark, SortedLookupRun()
    names = {kind: f"bench.lookup_{kind}_{label}_{stack.run_id}" for kind in TABLES}
    tables = [int_partitioned_table(names[kind], f"lookup-{kind}-{label}-{stack.run_id}") for kind in TABLES]
    config = settled_config(stack, f"lookup-{label}", tables, partitions * rows)
    feed = FeedWriter(spark, config, "bench-sorted-lookup")
    try:
        qualified = {kind: config.table_ref(names[kind]).qualified for kind in TABLES}
        spark.sql(f"ALTER TABLE {qualified['sorted']} WRITE ORDERED BY id")
        per_batch = rows // batches
        for batch in range(batches):
            # Batch b holds ids b, b + batches, ...: its files span the whole key range.
            records = [
                (
                    orjson.dumps({"id": p * rows + batch + k * batches}),
                    orjson.dumps({"op": "c", "after": {"id": p * rows + batch + k * batches, "p": p, "v": f"{batch}"}}),
                )
                for p in range(partitions)
                for k in reversed(range(per_batch))
            ]
            feed.write(records, batch)
    finally:
        feed.close()
    written = [p * rows + i for p in range(partitions) for i in range(per_batch * batches)]
    sample = random.Random(label).sample(written, keys)
    for kind in TABLES:
        run.lookups[kind] = {"before": _lookups(spark, qualified[kind], sample)}
    say(f"{label}: {batches} batches written; compacting both tables")
    run.compactions = {"both": _compact(config, spark)}
    for kind in TABLES:
        run.lookups[kind]["after"] = _lookups(spark, qualified[kind], sample)
    run.every_file_sorted = _every_file_sorted(spark, qualified["sorted"])
    for kind in TABLES:
        spark.sql(f"DROP TABLE IF EXISTS {qualified[kind]} PURGE")
    s = run.lookups["sorted"]
    say(
        f"{label}: sorted table {s['before'].files_per_lookup:.1f} -> {s['after'].files_per_lookup:.1f} files a lookup, "
        f"{s['before'].median_ms:.0f} -> {s['after'].median_ms:.0f} ms; every file sorted: {run.every_file_sorted}"
    )
    return run


def run(partitions: int, rows: int, batches: int, keys: int, repeats: int, out: Path, state_dir: Path) -> SortedLookupResults:
    results = SortedLookupResults(machine(), partitions, rows, batches, keys)
    with bench_stack("sorted-lookup", state_dir) as stack:
        for repeat in range(repeats):
            say(f"run {repeat + 1}/{repeats}: {partitions} partitions of {rows} rows in {batches} batches")
            results.runs.append(measure(stack, str(repeat), partitions, rows, batches, keys))
    publish(out, "sorted-lookup", results, _plot, summary)
    return results


def _spread(values: list[float], unit: str = "", digits: int = 1) -> str:
    return f"{statistics.median(values):.{digits}f}{unit} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def summary(results: SortedLookupResults) -> str:
    rows = []
    for kind in TABLES:
        for stage in STAGES:
            of = [r.lookups[kind][stage] for r in results.runs]
            rows.append(
                [
                    kind,
                    stage,
                    _spread([float(x.data_files) for x in of], digits=0),
                    _spread([x.files_per_lookup for x in of]),
                    _spread([x.median_ms for x in of], " ms", 0),
                ]
            )
    ratios = [r.lookups["sorted"]["before"].median_ms / r.lookups["sorted"]["after"].median_ms for r in results.runs]
    sorted_runs = sum(r.every_file_sorted for r in results.runs)
    header = ["table", "stage", "data files", "files a lookup reads", "lookup latency"]
    return (
        f"{results.partitions} partitions of {results.rows} rows, written in {results.batches} batches whose ids span "
        f"the key range, point lookups on {results.keys} keys; medians (spread) of {len(results.runs)} runs; "
        f"{results.machine}.\n\n"
        + markdown_table(header, rows)
        + f"\nThe sorted table's lookup before over after: {_spread(ratios, 'x')}. Every data file of the sorted table "
        f"sorted by id after the compactions in {sorted_runs} of {len(results.runs)} runs.\n"
    )


def _plot(results: SortedLookupResults, path: Path) -> None:
    with column_figure(path, "point lookup on id (ms)", "lookups before and after the sidecar's compactions") as ax:
        for i, (kind, stage) in enumerate((k, s) for k in TABLES for s in STAGES):
            latencies = [ms for r in results.runs for ms in r.lookups[kind][stage].lookup_ms]
            ax.boxplot(latencies, positions=[i], widths=0.6)
        ax.set_xticks(range(4), [f"{k}\n{s}" for k in TABLES for s in STAGES])


# ---- python -m benchmarks sorted-lookup ----


def add_arguments(parser: argparse.ArgumentParser) -> None:
    state_dir_argument(parser)
    parser.add_argument("--partitions", type=int, default=3, help="partitions of each table (default: 3)")
    parser.add_argument("--rows", type=int, default=20000, help="rows in each partition (default: 20000)")
    parser.add_argument("--batches", type=int, default=30, help="ingester batches (default: 30)")
    parser.add_argument("--keys", type=int, default=40, help="point lookups at each stage (default: 40)")
    parser.add_argument("--repeats", type=int, default=3, help="runs (default: 3)")
    out_argument(parser)


def main(args: argparse.Namespace) -> int:
    results = run(args.partitions, args.rows, args.batches, args.keys, args.repeats, args.out, args.state_dir.resolve())
    print_results(args.out, "sorted-lookup", summary(results))
    return 0
