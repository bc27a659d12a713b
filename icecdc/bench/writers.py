"""``icecdc bench writers``: the sidecar beside writers that are not icecdc's. Each writer kind
(a Structured Streaming ``MERGE`` in merge-on-read or copy-on-write mode, an append job, a
Flink-style upsert sink; ``icecdc.testbed.writers``) writes its own table for a number of commits
at its trigger interval, on each format version, while ``icecdc compact`` keeps the table from its
own process, as deployed. The writer keeps Spark's catalog cache, as users' jobs do.

Per case: the writer's refused commits, the sidecar's conflicts against its commit attempts,
aggregation and lookup latency against a compacted copy while writing and after, the write
amplification, and the seconds from the last write until every partition is compacted (at most 2
data files and no delete file). Every case also checks the table against the model of the
writer's changes, and every sidecar snapshot against its parent's rows.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from icecdc.bench import out_argument, positive_integers, print_results
from icecdc.bench.e2e.snapshots import amplification_between, snapshot_log
from icecdc.bench.harness import BenchStack, CompactorCounts, CompactorProcess, bench_stack, clone, progress
from icecdc.bench.read_probe import LOOKUPS, ORDERS_READS, READ_RATIO_GOAL, read_ratios, reader_session
from icecdc.bench.report import machine, markdown_table, publish, pyplot, save
from icecdc.domain.errors import UserError
from icecdc.options import embedded_stack_arguments
from icecdc.runtime.catalog import pyiceberg_catalog
from icecdc.runtime.config import Config
from icecdc.testbed.writers.jobs import JobSettings, Writer, writer_job
from icecdc.testbed.writers.model import Locality
from icecdc.testbed.writers.table_checks import (
    compacted,
    live_files,
    most_deletes_on_a_data_file,
    sidecar_snapshots_changing_rows,
)

# After the writes stop, every partition ends compacted within its settle window and this bound
# (issue "beside other writers": a watch interval, the sidecar's turn, one job per partition).
COMPACTED_WITHIN_SECONDS = 60.0
# The goal of docs/BENCHMARKS.md's row "Beside other writers" (the reads' is ``read_probe``'s).
CONFLICT_SHARE_GOAL = 0.05
say = progress("writers")


@dataclass(frozen=True)
class ReadPoint:
    t: float  # seconds since the sidecar joined the writer
    writing: bool
    aggregate_ratio: float  # the table's median latency over the compacted copy's
    lookup_ratio: float
    data_files: int
    delete_files: int
    most_deletes_on_a_data_file: int


@dataclass
class CaseResult:
    writer: str
    format_version: int
    run: int
    commits: int = 0
    refused: list[str] = field(default_factory=list)
    retries: int = 0
    rows: int = 0
    differences: list[str] = field(default_factory=list)
    sidecar: CompactorCounts | None = None
    snapshots_changing_rows: list[int] = field(default_factory=list)
    reads: list[ReadPoint] = field(default_factory=list)
    write_amplification: float | None = None
    compacted_after_seconds: float | None = None  # None: not within the bound
    bound_seconds: float = 0.0  # the settle window's maximum + COMPACTED_WITHIN_SECONDS
    final_files: dict[str, int] = field(default_factory=dict)  # "region/content" -> live files

    @property
    def name(self) -> str:
        return f"{self.writer} v{self.format_version}"

    def ratio(self, metric: str, writing: bool) -> float | None:
        values = [getattr(p, metric) for p in self.reads if p.writing is writing]
        return statistics.median(values) if values else None


@dataclass
class WritersResults:
    machine: str
    commits: int
    interval_seconds: float
    changes: int
    load_rows: int
    spread: str
    settle_seconds: float
    cases: list[CaseResult] = field(default_factory=list)


def _config(base: Config, table: str, run_id: int, settle_seconds: float) -> Config:
    """A sidecar keeping one table, by name alone, with its own topics and group. A partition
    settles once the writer left it for ``settle_seconds`` (longer than the workload reaches back)."""
    return clone(
        base,
        tables=[{"name": table}],
        commit_topic=f"writers-commits-{run_id}",
        compaction_topic=f"writers-compactions-{run_id}",
        maintenance_topic=f"writers-maintenance-{run_id}",
        compactor={
            "consumer_group": f"writers-{run_id}",
            "http": {"port": None},
            "settle": {
                "cadence_multiple": 3,
                "min_seconds": settle_seconds,
                "initial_seconds": settle_seconds,
                "max_seconds": 2 * settle_seconds,
            },
        },
        coordinator={"lease_topic": f"writers-leases-{run_id}"},
    )


def _probe(reader: Any, name: str, copy: str, keys: list[int], t: float, writing: bool, format_version: int) -> ReadPoint:
    """The table against a compacted copy of its rows (``read_probe``) and its files."""
    ratios = read_ratios(reader, name, copy, keys, ORDERS_READS, format_version)
    files = live_files(reader, name)
    return ReadPoint(
        round(t, 1),
        writing,
        ratios.aggregation,
        ratios.lookup,
        sum(n for (_, content), n in files.items() if content == 0),
        sum(n for (_, content), n in files.items() if content != 0),
        most_deletes_on_a_data_file(reader, name),
    )


def run_case(stack: BenchStack, writer: Writer, format_version: int, run: int, settings: Settings, out: Path) -> CaseResult:
    spark, result = stack.spark, CaseResult(writer.value, format_version, run)
    slug = f"{writer.value.replace('-', '_')}_v{format_version}_{stack.run_id}_{run}"
    table, copy = f"bench.writers_{slug}", f"bench.writers_copy_{slug}"
    name, copy_name = stack.ref(table).qualified, stack.ref(copy).qualified
    config = _config(stack.config, table, stack.run_id * 100 + run, settings.settle_seconds)
    job_settings = JobSettings(
        format_version=format_version,
        trigger_seconds=settings.interval,
        changes=settings.changes,
        load_rows=settings.load_rows,
        locality=settings.locality,
        seed=run,
    )
    job = writer_job(writer, spark, name, out / "writers" / slug, job_settings)
    # Reads and checks go through a session of their own, so that the writer keeps its catalog cache.
    reader = reader_session(spark)
    rng = random.Random(run)
    job.begin()
    # The sidecar joins a writer already running, as beside a user's job: its history tells what
    # kind of writer it is, and no pause in the writes lets the writer's partitions settle early.
    job.write(settings.commits)
    sidecar = CompactorProcess(config, slug, out)
    try:
        started = time.monotonic()
        next_probe = started
        while job.commits < settings.commits + 2:
            if time.monotonic() >= next_probe:
                keys = [rng.randint(1, settings.load_rows + settings.commits * settings.changes) for _ in range(LOOKUPS)]
                result.reads.append(_probe(reader, name, copy_name, keys, time.monotonic() - started, True, format_version))
                next_probe = time.monotonic() + settings.probe_seconds
                say(f"{result.name}: {job.commits - 2}/{settings.commits} commits, {_said(result.reads[-1])}")
            time.sleep(0.5)
        job.wait()
        if not result.reads:
            say(f"{result.name}: the writer finished before the sidecar joined, so no read while writing: use more --commits")
        writes_ended, wrote_until = time.monotonic(), time.time()
        result.bound_seconds = config.compactor.settle.max_seconds + COMPACTED_WITHIN_SECONDS
        files = live_files(reader, name)
        while not compacted(files) and time.monotonic() < writes_ended + result.bound_seconds:
            time.sleep(2.0)
            files = live_files(reader, name)
        if compacted(files):
            result.compacted_after_seconds = round(time.monotonic() - writes_ended, 1)
        result.final_files = {f"{region}/{content}": n for (region, content), n in sorted(files.items())}
        keys = [rng.randint(1, settings.load_rows + settings.commits * settings.changes) for _ in range(LOOKUPS)]
        result.reads.append(_probe(reader, name, copy_name, keys, time.monotonic() - started, False, format_version))
        result.sidecar = sidecar.counts(table)
    finally:
        sidecar.stop()
    end = job.end()
    result.commits, result.refused, result.retries, result.rows, result.differences = (
        end.commits,
        end.refused,
        end.retries,
        end.rows,
        end.differences,
    )
    result.snapshots_changing_rows = sidecar_snapshots_changing_rows(reader, name)
    log = snapshot_log(pyiceberg_catalog(stack.config).load_table(stack.ref(table).identifier))
    result.write_amplification = amplification_between(log, 0, wrote_until + result.bound_seconds)
    say(
        f"{result.name}: {end.commits} commits, {len(end.refused)} refused; sidecar {_conflicts(result.sidecar)}; "
        f"compacted {result.compacted_after_seconds} s after the last write; {len(end.differences)} rows differ"
    )
    for dropped in (name, copy_name):
        spark.sql(f"DROP TABLE IF EXISTS {dropped} PURGE")
    return result


def _said(point: ReadPoint) -> str:
    return (
        f"aggregation {point.aggregate_ratio:.2f}x, lookup {point.lookup_ratio:.2f}x the compacted copy, "
        f"{point.data_files} data and {point.delete_files} delete files, at most {point.most_deletes_on_a_data_file} "
        "on one data file"
    )


def _conflicts(counts: CompactorCounts | None) -> str:
    if counts is None:
        return "-"
    return f"{counts.compactions} compactions, {counts.commit_conflicts}/{counts.commit_attempts} conflicts"


@dataclass(frozen=True)
class Settings:
    writers: tuple[Writer, ...]
    formats: tuple[int, ...]
    commits: int
    interval: float
    changes: int
    load_rows: int
    runs: int
    locality: Locality | None
    settle_seconds: float
    probe_seconds: float


def run(settings: Settings, out: Path, state_dir: Path) -> WritersResults:
    spread = "recent" if settings.locality else "uniform"
    results = WritersResults(
        machine(), settings.commits, settings.interval, settings.changes, settings.load_rows, spread, settings.settle_seconds
    )
    with bench_stack("writers", state_dir) as stack:
        for run_number in range(1, settings.runs + 1):
            for writer in settings.writers:
                for format_version in settings.formats:
                    say(f"run {run_number}/{settings.runs}: {writer.value} on format v{format_version}")
                    results.cases.append(run_case(stack, writer, format_version, run_number, settings, out))
                    # After every case, so that a long run shows its results so far and keeps them if stopped.
                    publish(out, "writers", results, plot, summary)
    return results


def _spread(values: list[float | None], template: str = "{:.2f}") -> str:
    known = sorted(v for v in values if v is not None)
    if not known:
        return "-"
    middle = template.format(statistics.median(known))
    return middle if len(known) == 1 else f"{middle} ({template.format(known[0])}-{template.format(known[-1])})"


def summary(results: WritersResults) -> str:
    by_case: dict[str, list[CaseResult]] = {}
    for case in results.cases:
        by_case.setdefault(case.name, []).append(case)
    rows = []
    for name, cases in by_case.items():
        attempts = sum(c.sidecar.commit_attempts for c in cases if c.sidecar)
        conflicts = sum(c.sidecar.commit_conflicts for c in cases if c.sidecar)
        rows.append(
            [
                name,
                len(cases),
                sum(c.commits for c in cases),
                sum(len(c.refused) for c in cases),
                sum(bool(c.differences) for c in cases) + sum(bool(c.snapshots_changing_rows) for c in cases),
                sum(c.sidecar.compactions for c in cases if c.sidecar),
                f"{conflicts}/{attempts} ({conflicts / attempts:.0%})" if attempts else "0/0",
                _spread([c.ratio("aggregate_ratio", True) for c in cases]),
                _spread([c.ratio("lookup_ratio", True) for c in cases]),
                max((p.most_deletes_on_a_data_file for c in cases for p in c.reads if p.writing), default=0),
                _spread([c.ratio("aggregate_ratio", False) for c in cases]),
                _spread([c.write_amplification for c in cases]),
                _spread([c.compacted_after_seconds for c in cases], "{:.0f}"),
                sum(c.compacted_after_seconds is None for c in cases),
            ]
        )
    cases = results.cases
    slow_reads = [
        c for c in cases if max(c.ratio("aggregate_ratio", True) or 0, c.ratio("lookup_ratio", True) or 0) > READ_RATIO_GOAL
    ]
    busy = [c for c in cases if c.sidecar and c.sidecar.commit_conflicts > CONFLICT_SHARE_GOAL * c.sidecar.commit_attempts]
    verdicts = [
        f"refused writer commits: {sum(len(c.refused) for c in cases)} in {sum(c.commits for c in cases)}",
        f"runs not exact against the writer's model: {sum(bool(c.differences) for c in cases)} of {len(cases)}",
        f"sidecar snapshots changing rows: {sum(len(c.snapshots_changing_rows) for c in cases)}",
        f"runs whose sidecar conflicts exceed {CONFLICT_SHARE_GOAL:.0%} of its attempts: {len(busy)} of {len(cases)}",
        (
            f"runs reading over {READ_RATIO_GOAL:g}x the compacted copy while writing (aggregation or lookup, median): "
            f"{len(slow_reads)} of {len(cases)}" + "".join(f"; {c.name} #{c.run}" for c in slow_reads)
        ),
        (
            f"runs not compacted within the settle window's maximum + {COMPACTED_WITHIN_SECONDS:.0f} s: "
            f"{sum(c.compacted_after_seconds is None for c in cases)} of {len(cases)}"
        ),
    ]
    locality = "recent (new rows in the current partition, changes reaching back 3 commits)"
    return (
        f"{results.commits} commits of {results.changes} changes, one every {results.interval_seconds:g} s, over "
        f"{results.load_rows:,} rows per case; spread {locality if results.spread == 'recent' else 'uniform'}; "
        f"settle window {results.settle_seconds:g} s; {results.machine}. Ratios are the table's median latency "
        "over a compacted copy's, median (lowest-highest) over runs.\n\n"
        + markdown_table(
            (
                "writer | runs | writer commits | refused | runs not exact | sidecar compactions | sidecar conflicts | "
                "aggregation while writing | lookup while writing | most deletes on a data file while writing | "
                "aggregation after | write amplification | "
                "compacted s after last write | runs not compacted"
            ),
            rows,
        )
        + "\n"
        + "".join(f"- {line}\n" for line in verdicts)
    )


def plot(results: WritersResults, path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, metric, title in (
        (axes[0], "aggregate_ratio", "aggregation"),
        (axes[1], "lookup_ratio", "point lookup"),
    ):
        for case in results.cases:
            points = [p for p in case.reads if p.writing]
            ax.plot([p.t for p in points], [getattr(p, metric) for p in points], label=f"{case.name} #{case.run}", lw=1)
        ax.axhline(READ_RATIO_GOAL, color="grey", ls="--", lw=0.8)
        ax.set_title(f"{title}: table over compacted copy, while writing")
        ax.set_xlabel("seconds into the writes")
    axes[0].set_ylabel("latency ratio")
    save(plt, fig, path, *axes)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    embedded_stack_arguments(parser)
    parser.add_argument(
        "--writers",
        default=",".join(w.value for w in Writer),
        help=f"comma-separated writers (default: all of {', '.join(w.value for w in Writer)})",
    )
    parser.add_argument("--formats", default="2,3", help="comma-separated format versions (default: 2,3)")
    parser.add_argument("--commits", type=int, default=60, help="the writer's commits per case (default: 60)")
    parser.add_argument("--interval", type=float, default=2.0, help="the writer's trigger interval, seconds (default: 2)")
    parser.add_argument("--changes", type=int, default=400, help="changes a commit (default: 400)")
    parser.add_argument("--rows", type=int, default=30_000, help="rows of the first commit (default: 30000)")
    parser.add_argument("--runs", type=int, default=1, help="repeats of every case (default: 1)")
    parser.add_argument(
        "--spread",
        choices=("recent", "uniform"),
        default="recent",
        help="recent: new rows in the current partition (it moves on every 10 commits), changes reaching back 3 "
        "commits, as a CDC stream of orders; uniform: every commit changes random rows of every partition "
        "(default: recent)",
    )
    parser.add_argument("--settle-seconds", type=float, default=10.0, help="the sidecar's settle window, seconds (default: 10)")
    parser.add_argument("--probe-seconds", type=float, default=15.0, help="seconds between read probes (default: 15)")
    out_argument(parser)


def main(args: argparse.Namespace) -> int:
    try:
        writers = tuple(Writer(w.strip()) for w in args.writers.split(","))
    except ValueError:
        raise UserError(f"--writers: each one of {', '.join(w.value for w in Writer)}; got {args.writers!r}") from None
    formats = tuple(positive_integers(args.formats, "--formats"))
    if not set(formats) <= {2, 3}:
        raise UserError(f"--formats: 2, 3 or both; got {args.formats!r}")
    settings = Settings(
        writers,
        formats,
        args.commits,
        args.interval,
        args.changes,
        args.rows,
        args.runs,
        Locality() if args.spread == "recent" else None,
        args.settle_seconds,
        args.probe_seconds,
    )
    results = run(settings, args.out, args.state_dir.resolve())
    print_results(args.out, "writers", summary(results))
    return 0
