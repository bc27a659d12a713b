"""``icecdc bench contention``: what a compactor does to the writer it runs beside. The same CDC
batches go to one table per mode (no compactor, a naive one, the coordinated one, Iceberg's own
manifest merging), measuring the writer's commit latency and the compactor's conflicts.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from icecdc.bench import out_argument, print_results
from icecdc.bench.harness import BenchStack, CompactorCounts, CompactorProcess, FeedWriter, bench_stack, clone, progress
from icecdc.bench.report import machine, markdown_table, percentile, publish, pyplot, save
from icecdc.options import embedded_stack_arguments
from icecdc.runtime.config import Config
from icecdc.workload import OrdersWorkload, orders_table

# unmerged: no compactor, and Iceberg's default manifest merging instead of icecdc's tables'.
MODES = ("none", "naive", "coordinated", "unmerged")
# The writer's JVM warms up through the run: the coordinated compactor goes first, so any error is against icecdc.
RUN_ORDER = ("coordinated", "naive", "none", "unmerged")
ICEBERG_MANIFEST_MERGING = {"commit.manifest.min-count-to-merge": "100"}
# Naive: commit the moment a compaction is ready, once (Iceberg's own quick retries only).
NAIVE = {"quiet_windows": False, "commit_attempts": 1}
COMPACTOR = {
    "min_small_files": 4,
    "reconcile_seconds": 10,
    "settle": {"cadence_multiple": 3, "min_seconds": 2, "initial_seconds": 4, "max_seconds": 8},
}
BATCHES_PER_DAY = 6
say = progress("contention")


@dataclass
class ModeResult:
    commit_seconds: list[float]
    writer_failures: list[str]
    writer_commits_interleaved: int
    p50: float
    p99: float
    manifests: int = 0  # in the last snapshot
    rows_match: bool = False
    compactor: CompactorCounts | None = None  # None: no compactor in this mode


@dataclass
class ContentionResults:
    machine: str
    batches: int
    changes_per_batch: int
    interval_seconds: float
    modes: dict[str, ModeResult] = field(default_factory=dict)


def workload_batches(batches: int, changes: int, seed: int = 5) -> tuple[list[list[tuple[bytes, bytes]]], OrdersWorkload]:
    """The initial load and ``batches`` change batches, and the state they leave behind."""
    workload = OrdersWorkload(seed=seed, today=0, recent_keys=changes * 3)
    out = [[c.record for c in workload.load(changes * 2)]]
    for number in range(1, batches + 1):
        workload.today = number // BATCHES_PER_DAY
        out.append([c.record for c in workload.changes(changes)])
    return out, workload


def _mode_config(base: Config, mode: str, run_id: int) -> Config:
    table = orders_table(f"bench.contention_{mode}_{run_id}", f"contention-{mode}-{run_id}")
    if mode == "unmerged":
        table["properties"] = ICEBERG_MANIFEST_MERGING
    return clone(
        base,
        tables=[table],
        commit_topic=f"contention-commits-{mode}-{run_id}",
        compaction_topic=f"contention-compactions-{mode}-{run_id}",
        maintenance_topic=f"contention-maintenance-{mode}-{run_id}",
        compactor={**COMPACTOR, "consumer_group": f"contention-{mode}-{run_id}", "http": {"port": None}},
        coordinator={
            "lease_topic": f"contention-leases-{run_id}",
            "maintenance": {"enabled": False},
            **(NAIVE if mode == "naive" else {}),
        },
    )


def run_mode(
    spark: Any, config: Config, mode: str, batches: list[list[tuple[bytes, bytes]]], interval: float, out: Path
) -> ModeResult:
    """Write every batch at ``interval`` seconds, with the mode's compactor running beside."""
    table = config.tables[0]
    feed = FeedWriter(spark, config)
    feed.write(batches[0], 0)  # the initial load
    compactor = CompactorProcess(config, mode, out) if mode in ("naive", "coordinated") else None
    latencies: list[float] = []
    failures: list[str] = []
    interleaved = 0
    counts = None
    started = time.monotonic()
    try:
        for number, pairs in enumerate(batches[1:], 1):
            frame = feed.frame(pairs)
            time.sleep(max(0.0, started + number * interval - time.monotonic()))
            before = feed.writer.stats.interleaved_commits
            try:
                feed.writer(frame, number)
                latencies.append(feed.writer.stats.last_commit_seconds)
                interleaved += feed.writer.stats.interleaved_commits - before
            except Exception as exc:  # noqa: BLE001 - a writer failure is what this measures
                failures.append(f"batch {number}: {type(exc).__name__}: {str(exc)[:300]}")
            if number % 10 == 0 or number == len(batches) - 1:
                say(
                    f"{mode}: batch {number}/{len(batches) - 1}, writer commit p50 {statistics.median(latencies):.3f}s, "
                    f"failures {len(failures)}"
                )
        if compactor is not None:
            counts = compactor.counts(table.name)
    finally:
        if compactor is not None:
            compactor.stop()
        feed.close()
    return ModeResult(
        latencies, failures, interleaved, statistics.median(latencies), percentile(latencies, 0.99), compactor=counts
    )


def _measure(stack: BenchStack, batches: int, changes: int, interval: float, out: Path) -> ContentionResults:
    spark = stack.spark
    data, workload = workload_batches(batches, changes)
    results = ContentionResults(machine(), batches, changes, interval)
    # JIT and caches warm on a scratch table first, or the first mode measured pays for them.
    warm = _mode_config(stack.config, "none", stack.run_id - 1)
    say("warming up")
    run_mode(spark, warm, "none", data[:6], interval, out)
    spark.sql(f"DROP TABLE {warm.table_ref(warm.tables[0]).qualified} PURGE")
    names = {}
    for mode in RUN_ORDER:
        config = _mode_config(stack.config, mode, stack.run_id)
        names[mode] = config.table_ref(config.tables[0]).qualified
        say(f"{mode}: {batches} batches of {changes:,} changes, one every {interval:g}s")
        results.modes[mode] = run_mode(spark, config, mode, data, interval, out)
    expected = workload.expected_rows()
    for mode, name in names.items():
        spark.sql(f"REFRESH TABLE {name}")
        rows = sorted(tuple(r) for r in spark.table(name).select("id", "region", "status", "amount", "updated_at").collect())
        results.modes[mode].rows_match = rows == expected
        results.modes[mode].manifests = spark.sql(f"SELECT count(*) FROM {name}.manifests").collect()[0][0]
        if rows != expected:
            raise RuntimeError(f"{mode}: the table does not hold the workload's final state")
    say(f"every table holds the workload's final state ({len(expected):,} rows)")
    for name in names.values():
        spark.sql(f"DROP TABLE {name} PURGE")
    return results


def run(batches: int, changes: int, interval: float, out: Path, state_dir: Path) -> ContentionResults:
    with bench_stack("contention", state_dir) as stack:
        results = _measure(stack, batches, changes, interval, out)
    publish(out, "contention", results, _plot, summary)
    return results


def summary(results: ContentionResults) -> str:
    baseline = results.modes["none"].p99
    rows = []
    for mode in MODES:
        m = results.modes[mode]
        c = m.compactor
        rows.append(
            [
                mode,
                f"{m.p50 * 1000:.0f}",
                f"{m.p99 * 1000:.0f}",
                f"{m.p99 / baseline:.2f}x",
                len(m.writer_failures),
                m.writer_commits_interleaved,
                m.manifests,
                c.compactions if c else "-",
                f"{c.commit_conflicts}/{c.commit_attempts} ({c.conflict_rate:.1%})" if c else "-",
            ]
        )
    return (
        f"{results.batches} batches of {results.changes_per_batch:,} changes, one every "
        f"{results.interval_seconds:g}s, per mode; {results.machine}.\n\n"
        + markdown_table(
            (
                "compactor | writer commit p50 ms | p99 ms | p99 vs none | writer failures | "
                "writer commits retried | manifests at end | compactions | compactor conflicts / attempts"
            ),
            rows,
        )
        + "\n"
    )


def _plot(results: ContentionResults, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for mode in MODES:
        latencies = sorted(results.modes[mode].commit_seconds)
        ax.plot([v * 1000 for v in latencies], [(i + 1) / len(latencies) for i in range(len(latencies))], label=mode)
    ax.set_xlabel("writer commit latency (ms)")
    ax.set_ylabel("share of commits at or below")
    ax.set_title("Writer commit latency by compactor mode")
    save(plt, fig, path, ax, legend=None)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    embedded_stack_arguments(parser)
    parser.add_argument("--batches", type=int, default=60, help="writer batches per mode (default: 60)")
    parser.add_argument("--changes", type=int, default=2000, help="changes per batch (default: 2000)")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between the writer's batches (default: 2)")
    out_argument(parser)


def main(args: argparse.Namespace) -> int:
    results = run(args.batches, args.changes, args.interval, args.out, args.state_dir.resolve())
    print_results(args.out, "contention", summary(results))
    return 0
