"""``python -m benchmarks jobs``: settled partitions compacted per minute by the sidecar, one Spark job
per partition against several a job (``compactor.partitions_per_job``). Every partition must end
as one file with every row kept (docs/BENCHMARKS.md, row "Partitions per job").
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from benchmarks.harness import column_figure, int_partitioned_table, settled_config
from icecdc.bench import out_argument, positive_integers, print_results
from icecdc.bench.harness import BenchStack, FeedWriter, bench_stack, progress
from icecdc.bench.report import machine, markdown_table, publish
from icecdc.options import state_dir_argument

say = progress("jobs")


@dataclass(frozen=True)
class JobsRun:
    partitions_per_job: int
    seconds: float
    jobs: int  # compaction turns (commits) it took
    partitions_compacted: int

    @property
    def partitions_per_minute(self) -> float:
        return self.partitions_compacted / self.seconds * 60


@dataclass
class JobsResults:
    machine: str
    partitions: int
    rows_per_partition: int
    batches: int
    runs: list[JobsRun] = field(default_factory=list)

    def of(self, per_job: int) -> list[JobsRun]:
        return [r for r in self.runs if r.partitions_per_job == per_job]

    @property
    def settings(self) -> list[int]:
        return sorted({r.partitions_per_job for r in self.runs})


def measure(stack: BenchStack, label: str, partitions: int, rows: int, batches: int, per_job: int) -> JobsRun:
    from icecdc.compactor.sidecar import create_sidecar
    from icecdc.domain.events import CompactionOutcome

    spark = stack.spark
    table = int_partitioned_table(f"bench.jobs_{label}_{stack.run_id}", f"jobs-{label}-{stack.run_id}")
    config = settled_config(stack, f"jobs-{label}", [table], partitions * rows, partitions_per_job=per_job)
    feed = FeedWriter(spark, config, "bench-jobs")
    try:
        for batch in range(batches):
            records = [
                (
                    orjson.dumps({"id": p * rows + r}),
                    orjson.dumps({"op": "c", "after": {"id": p * rows + r, "p": p, "v": f"{batch}"}}),
                )
                for p in range(partitions)
                for r in range(rows)
            ]
            feed.write(records, batch)
    finally:
        feed.close()
    ref = config.table_ref(config.tables[0])
    sidecar = create_sidecar(config, spark)
    committed = turns = 0
    done: list[Any] = []
    try:
        started = time.perf_counter()
        while committed < partitions:
            # As the sidecar's own loop does: no wait for events while work is due.
            events = sidecar.run_once(poll_timeout=0.0 if sidecar.candidates(time.time()) else 0.2)
            if not events and sidecar.idle(5.0):
                raise RuntimeError(f"the sidecar went idle after compacting {committed} of {partitions} partitions")
            if events:
                done += events
                turns += 1
                committed += sum(e.outcome is CompactionOutcome.COMMITTED for e in events)
                failed = [e for e in events if e.outcome is not CompactionOutcome.COMMITTED]
                if failed:
                    raise RuntimeError(f"a compaction did not commit: {failed[0]}")
        seconds = time.perf_counter() - started
    finally:
        sidecar.close()
    files = spark.sql(f"SELECT content, count(*) AS n FROM {ref.qualified}.files GROUP BY content").collect()
    count = spark.sql(f"SELECT count(*) AS n, count(DISTINCT p) AS parts FROM {ref.qualified}").collect()[0]
    if {r.content: r.n for r in files} != {0: partitions} or (count.n, count.parts) != (partitions * rows, partitions):
        compactions = [(e.partition_path, e.kind, e.outcome.value, e.data_files_rewritten, e.data_files_added) for e in done]
        raise RuntimeError(f"{ref} did not end as one file a partition with every row: {files}, {count}; {compactions}")
    spark.sql(f"DROP TABLE IF EXISTS {ref.qualified} PURGE")
    run = JobsRun(per_job, seconds, turns, committed)
    say(f"{per_job} a job: {partitions} partitions in {turns} jobs, {seconds:.1f} s, {run.partitions_per_minute:.0f}/min")
    return run


def run(
    partitions: int, rows: int, batches: int, settings: Sequence[int], repeats: int, out: Path, state_dir: Path
) -> JobsResults:
    results = JobsResults(machine(), partitions, rows, batches)
    with bench_stack("jobs", state_dir) as stack:
        for repeat in range(repeats):
            for per_job in settings:
                say(f"run {repeat + 1}/{repeats}, {per_job} partitions a job: building {partitions} partitions")
                results.runs.append(measure(stack, f"{per_job}_{repeat}", partitions, rows, batches, per_job))
    publish(out, "jobs", results, _plot, summary)
    return results


def summary(results: JobsResults) -> str:
    base = statistics.median(r.partitions_per_minute for r in results.of(results.settings[0]))
    rows = []
    for per_job in results.settings:
        runs = results.of(per_job)
        rates = [r.partitions_per_minute for r in runs]
        rows.append(
            [
                per_job,
                statistics.median(r.jobs for r in runs),
                f"{statistics.median(r.seconds for r in runs):.1f}",
                f"{statistics.median(rates):.0f}",
                " / ".join(f"{x:.0f}" for x in rates),
                f"{statistics.median(rates) / base:.1f}x",
            ]
        )
    header = ["partitions a job", "jobs", "seconds", "partitions/min", "runs", f"vs {results.settings[0]} a job"]
    return (
        f"{results.partitions} settled partitions of {results.rows_per_partition} rows, {results.batches} writer batches "
        f"each ({results.batches} data and {results.batches - 1} equality-delete files a partition), compacted by the "
        f"sidecar until every one is a single file; medians of {len(results.of(results.settings[0]))} runs a setting, "
        f"settings taking turns; {results.machine}.\n\n" + markdown_table(header, rows) + "\n"
    )


def _plot(results: JobsResults, path: Path) -> None:
    title = f"{results.partitions} small partitions: bars medians, dots runs"
    with column_figure(path, "settled partitions compacted per minute", title) as ax:
        for i, per_job in enumerate(results.settings):
            rates = [r.partitions_per_minute for r in results.of(per_job)]
            ax.scatter([i] * len(rates), rates, alpha=0.6)
            ax.bar(i, statistics.median(rates), alpha=0.3)
        ax.set_xticks(range(len(results.settings)), [f"{n} a job" for n in results.settings])


# ---- python -m benchmarks jobs ----


def add_arguments(parser: argparse.ArgumentParser) -> None:
    state_dir_argument(parser)
    parser.add_argument("--partitions", type=int, default=64, help="small settled partitions a run (default: 64)")
    parser.add_argument("--rows", type=int, default=200, help="rows in each partition (default: 200)")
    parser.add_argument(
        "--batches", type=int, default=3, help="writer batches, each rewriting every partition's rows (default: 3)"
    )
    parser.add_argument(
        "--per-job",
        default="1,16",
        metavar="N[,N...]",
        help="compactor.partitions_per_job settings compared side by side, run by run (default: 1,16)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs of each setting (default: 3)")
    out_argument(parser)


def main(args: argparse.Namespace) -> int:
    settings = positive_integers(args.per_job, "--per-job")
    results = run(args.partitions, args.rows, args.batches, settings, args.repeats, args.out, args.state_dir.resolve())
    print_results(args.out, "jobs", summary(results))
    return 0
