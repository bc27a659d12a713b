"""``python -m benchmarks ingest-shape``: one batch of the ingester's writer against the batch's size
and the tables it spans, by message shape and where the job runs, with CPU and memory. Each table
must end with the rows its changes imply (docs/BENCHMARKS.md, row "Batch size and tables per batch").
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from benchmarks.harness import (
    StageCost,
    WorkerMemory,
    cpu_seconds,
    jit_cpu_between,
    jit_cpu_seconds,
    last_stage_id,
    rss_kib,
    rss_peak_reset,
    stage_table,
    stages_since,
)
from benchmarks.parse import connector_record
from icecdc.bench import (
    out_argument,
    positive_integers,
    print_results,
    table_properties,
    table_properties_said,
    table_property_argument,
)
from icecdc.bench.harness import FeedWriter, bench_stack, clone, progress
from icecdc.bench.ingest import ChangingTable
from icecdc.bench.report import machine, markdown_table, publish, pyplot
from icecdc.domain.errors import UserError
from icecdc.options import state_dir_argument
from icecdc.workload import orders_table

say = progress("ingest-shape")
UPDATES, INSERTS = 0.7, 0.2
# Keys the changes update and delete. The tables start empty and the writer never reads them: an
# update of a key the table lacks costs the same equality delete as any other.
SOURCE_ROWS = 1_000_000
SHAPES = ("generator", "connector")


@dataclass
class ShapePoint:
    changes: int  # per batch, over all tables
    tables: int
    commit_threads: int  # ingest.commit_threads: tables committed at once
    shape: str = "generator"
    prefix_cut: bool = True  # whether the writer cuts the known wrapper prefixes (``ingest.prefixes``)
    job: str = "spark"  # where the batch's job ran: "driver" or "spark" (``ingest.driver_batch_records``)
    value_bytes: int = 0  # the Debezium JSON (record values) of one batch, the last one measured
    seconds: list[float] = field(default_factory=list)  # the records made a DataFrame, then written
    frame_seconds: list[float] = field(default_factory=list)  # the DataFrame made (on Spark; 0 in the driver)
    job_seconds: list[float] = field(default_factory=list)  # the job: parse, reduce, write files
    commit_seconds: list[float] = field(default_factory=list)  # the commits of every table
    offsets_seconds: list[float] = field(default_factory=list)  # the committed offsets read at the start
    commits_wall_seconds: list[float] = field(default_factory=list)  # the commits, side by side, start to end
    # CPU time of the batch: the driver's Python process (every thread) and the driver's JVM
    # (in ``local`` mode, Spark's executors too; GC and JIT included). Over 2 cores, their sum
    # past twice the batch's seconds is impossible, near it the batch is CPU-bound.
    python_cpu_seconds: list[float] = field(default_factory=list)
    jvm_cpu_seconds: list[float] = field(default_factory=list)
    # Of the JVM's, its JIT compilers' (``harness.jit_cpu_seconds``): a JVM that has not yet
    # compiled the paths a batch takes spends it on every batch.
    jit_cpu_seconds: list[float] = field(default_factory=list)
    heap_peak_mib: float = 0.0
    workers_peak_mib: float = 0.0
    driver_growth_mib: float = 0.0
    stages: list[StageCost] = field(default_factory=list)  # the last batch's Spark stages

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def records_per_second(self) -> float:
        return self.changes / self.median

    @property
    def mb_per_second(self) -> float:
        return self.value_bytes / 1e6 / self.median


@dataclass
class ShapeResults:
    machine: str
    batches: int
    warm_up: int = 1  # batches per point before the measured ones
    table_properties: dict[str, str] = field(default_factory=dict)  # every table's, over icecdc's
    batch_sizes: list[ShapePoint] = field(default_factory=list)
    fan_out: list[ShapePoint] = field(default_factory=list)


def _records(
    source: ChangingTable, changes: int, shape: str, first_offset: int
) -> list[tuple[int, tuple[bytes | None, bytes | None]]]:
    """(key, Kafka record) for ``changes`` changes, in ``shape``."""
    out: list[tuple[int, tuple[bytes | None, bytes | None]]] = []
    for offset, (_, key, _, value) in enumerate(source.batch(changes, UPDATES, INSERTS), first_offset):
        record_key = orjson.dumps({"id": key})
        if shape == "connector":
            payload = orjson.loads(value) | {"ts_ms": 1_735_689_600_000 + offset}
            record_key, value, _ = connector_record(record_key, orjson.dumps(payload), offset)
        out.append((key, (record_key, value)))
    return out


def measure(
    stack: Any,
    changes: int,
    tables: int,
    batches: int,
    commit_threads: int = 8,
    shape: str = "generator",
    prefix_cut: bool = True,
    job: str = "spark",
    warm_up: int = 1,
    properties: Mapping[str, str] | None = None,
) -> ShapePoint:
    from icecdc.jvm.bridge import JavaBridge

    run = f"{changes}_{tables}_{commit_threads}_{job}_{stack.run_id}"
    specs = [
        {**orders_table(f"bench.shape_{run}_{i}", f"shape-{run}-{i}"), "properties": dict(properties or {})}
        for i in range(tables)
    ]
    ingest = {"max_batch_records": changes, "commit_threads": commit_threads}
    config = clone(stack.config, tables=specs, commit_topic=f"shape-commits-{run}", ingest=ingest)
    topics = [t["topic"] for t in specs]
    bridge = JavaBridge(stack.spark)
    jvm_pid = bridge.pid()
    feed = FeedWriter(stack.spark, config, "bench-shape")
    feed.writer.prefixes.learning = prefix_cut
    feed.writer.job.driver_batch_records = changes if job == "driver" else 0
    source = ChangingTable(SOURCE_ROWS)
    point = ShapePoint(changes, tables, commit_threads, shape, prefix_cut, job)
    try:
        for number in range(warm_up + batches):  # the first ``warm_up`` are not counted
            by_topic: dict[str, list[tuple[bytes | None, bytes | None]]] = {topic: [] for topic in topics}
            point.value_bytes = 0
            for key, record in _records(source, changes, shape, number * changes):
                by_topic[topics[key % tables]].append(record)
                point.value_bytes += len(record[1] or b"")
            bridge.reset_heap_peak()
            rss_peak_reset()
            driver_before = rss_kib("VmRSS")
            before = last_stage_id(stack.spark)
            # No sampler beside a job in the driver: it starts no Python worker, and its walk of /proc would take the GIL.
            workers = WorkerMemory(jvm_pid)
            with workers if job == "spark" else contextlib.nullcontext():
                polled = feed.polled_by_topic(by_topic)
                python_cpu, jvm_cpu, jit_before = cpu_seconds(), cpu_seconds(jvm_pid), jit_cpu_seconds(jvm_pid)
                started = time.perf_counter()
                if job == "spark":  # made here to be timed; the writer takes the same frame
                    polled.frame(feed.writer.prefixes)
                framed = time.perf_counter()
                result = feed.writer(polled, number)
                seconds = time.perf_counter() - started
                python_cpu, jvm_cpu = cpu_seconds() - python_cpu, cpu_seconds(jvm_pid) - jvm_cpu
                jit_cpu = jit_cpu_between(jit_before, jit_cpu_seconds(jvm_pid))
            if result.job_in_driver != (job == "driver"):
                raise RuntimeError(f"batch {number}: the job ran {'in the driver' if result.job_in_driver else 'on Spark'}")
            point.stages = stages_since(stack.spark, before)
            if len(result.commits) != tables:
                raise RuntimeError(f"batch {number} committed to {len(result.commits)} of {tables} tables")
            if number >= warm_up:
                point.seconds.append(seconds)
                point.frame_seconds.append(framed - started)
                point.job_seconds.append(feed.writer.stats.last_job_seconds)
                point.commit_seconds.append(sum(result.commit_seconds.values()))
                point.offsets_seconds.append(result.offsets_seconds)
                point.commits_wall_seconds.append(result.commits_wall_seconds)
                point.python_cpu_seconds.append(python_cpu)
                point.jvm_cpu_seconds.append(jvm_cpu)
                point.jit_cpu_seconds.append(jit_cpu)
                point.heap_peak_mib = max(point.heap_peak_mib, bridge.heap_peak_bytes() / 2**20)
                point.workers_peak_mib = max(point.workers_peak_mib, workers.peak_kib / 1024)
                point.driver_growth_mib = max(point.driver_growth_mib, max(0, rss_kib("VmHWM") - driver_before) / 1024)
            say(
                f"{changes:,} changes over {tables} table(s), batch {number}{' (warm-up)' if number < warm_up else ''}: {seconds:.2f}s"
            )
    finally:
        feed.close()
    _check_rows(stack, specs, source, tables)
    for spec in specs:
        stack.spark.sql(f"DROP TABLE IF EXISTS {stack.ref(spec['name']).qualified} PURGE")
    say(
        f"{changes:,} {shape} changes over {tables} table(s), job {job}, prefix cut {'on' if prefix_cut else 'off'}: median {point.median:.2f}s "
        f"({point.records_per_second:,.0f} records/s, {point.mb_per_second:.1f} MB/s), heap peak {point.heap_peak_mib:.0f} MiB"
    )
    return point


def _check_rows(stack: Any, specs: list[dict[str, Any]], source: ChangingTable, tables: int) -> None:
    """Each table holds the live rows of its keys among those the changes touched (a delete or an
    update of a key it never had leaves nothing)."""
    live: dict[int, int] = {}
    for key, row in source.changed.items():
        if row is not None:
            live[key % tables] = live.get(key % tables, 0) + 1
    for i, spec in enumerate(specs):
        count = stack.spark.table(stack.ref(spec["name"]).qualified).count()
        if count != live.get(i, 0):
            raise RuntimeError(f"{spec['name']} holds {count:,} rows, the changes imply {live.get(i, 0):,}")


def run(
    changes: Sequence[int],
    tables: Sequence[int],
    fan_out_changes: int,
    batches: int,
    out: Path,
    state_dir: Path,
    commit_threads: Sequence[int] = (8,),
    shape: str = "generator",
    prefix_cuts: Sequence[bool] = (True,),
    jobs: Sequence[str] = ("driver",),
    driver_memory: str = "6g",
    warm_up: int = 1,
    properties: Mapping[str, str] | None = None,  # every table's, over icecdc's
) -> ShapeResults:
    results = ShapeResults(machine(), batches, warm_up, dict(properties or {}))
    with bench_stack("ingest-shape", state_dir, spark={"conf": {"spark.driver.memory": driver_memory}}) as stack:
        for size in changes:
            for cut in prefix_cuts:  # side by side, size by size
                for job in jobs:
                    # One table commits on one thread whatever the setting; the point names the last.
                    results.batch_sizes.append(
                        measure(
                            stack,
                            size,
                            1,
                            batches,
                            commit_threads[-1],
                            shape,
                            prefix_cut=cut,
                            job=job,
                            warm_up=warm_up,
                            properties=properties,
                        )
                    )
        for count in tables:
            # Each commit_threads setting side by side, table count by table count.
            for threads in commit_threads if count > 1 else commit_threads[-1:]:
                for job in jobs:
                    results.fan_out.append(
                        measure(
                            stack,
                            fan_out_changes,
                            count,
                            batches,
                            threads,
                            shape,
                            job=job,
                            warm_up=warm_up,
                            properties=properties,
                        )
                    )
    publish(out, "ingest-shape", results, _plot, summary)
    return results


def _rows(points: list[ShapePoint]) -> list[list[Any]]:
    return [
        [
            f"{p.changes:,}",
            p.tables,
            p.commit_threads,
            "on" if p.prefix_cut else "off",
            p.job,
            f"{p.median:.2f}",
            f"{statistics.median(p.frame_seconds):.2f}",
            f"{statistics.median(p.job_seconds):.2f}",
            f"{statistics.median(p.offsets_seconds):.3f}",
            f"{statistics.median(p.commits_wall_seconds):.2f}",
            f"{statistics.median(p.commit_seconds):.2f}",
            (
                f"{statistics.median(p.python_cpu_seconds):.2f} / {statistics.median(p.jvm_cpu_seconds):.2f}"
                f" ({statistics.median(p.jit_cpu_seconds):.2f})"
            ),
            p.shape,
            f"{p.records_per_second:,.0f}",
            f"{p.mb_per_second:.1f}",
            f"{min(p.seconds):.2f}-{max(p.seconds):.2f}",
            f"{p.heap_peak_mib:.0f}",
            f"{p.workers_peak_mib:.0f}",
            f"{p.driver_growth_mib:.0f}",
        ]
        for p in points
    ]


def summary(results: ShapeResults) -> str:
    header = [
        "changes/batch",
        "tables",
        "commit threads",
        "prefix cut",
        "job",
        "s/batch",
        "DataFrame s",
        "job s",
        "offsets read s",
        "commits s (wall)",
        "commit s (sum over tables)",
        "CPU s: driver Python / JVM (its JIT)",
        "messages",
        "records/s",
        "MB/s of values",
        "range s",
        "JVM heap peak MiB",
        "Python workers peak MiB",
        "driver Python growth MiB",
    ]
    return (
        f"Medians of {results.batches} batches after {results.warm_up} warm-up batch(es); "
        f"{table_properties_said(results.table_properties)}{results.machine}.\n\n"
        + markdown_table(header, _rows(results.batch_sizes + results.fan_out))
        + "\n"
        + "".join(
            f"\nThe last batch of {p.changes:,} changes over {p.tables} table(s), its Spark stages (task times summed):\n\n"
            + stage_table(p.stages)
            + "\n"
            for p in results.batch_sizes
            if p.stages  # a job in the driver runs no Spark stage
        )
    )


def _plot(results: ShapeResults, path: Path) -> None:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for cut, job in sorted({(p.prefix_cut, p.job) for p in results.batch_sizes}):
        sizes = [p for p in results.batch_sizes if (p.prefix_cut, p.job) == (cut, job)]
        label = f"job {job}, prefix cut {'on' if cut else 'off'}"
        left.plot([p.changes for p in sizes], [p.records_per_second for p in sizes], marker="o", label=label)
    left.legend(fontsize=8)
    left.set_xscale("log")
    left.set_xlabel("changes per batch (one table)")
    left.set_title("records per second (median)", fontsize=9)
    fan = results.fan_out
    for threads, job in sorted({(p.commit_threads, p.job) for p in fan}):
        # The one-table point belongs to every setting (nothing to commit side by side).
        points = [p for p in fan if p.job == job and (p.commit_threads == threads or p.tables == 1)]
        label = f"batch, {threads} commit threads, job {job}"
        right.plot([p.tables for p in points], [p.median for p in points], marker="o", label=label)
        right.plot(
            [p.tables for p in points],
            [statistics.median(p.job_seconds) for p in points],
            linestyle="--",
            label=f"its job ({job})",
        )
    right.set_xlabel("tables the batch spans")
    right.set_title(f"seconds per batch of {fan[0].changes:,} changes (median)" if fan else "", fontsize=9)
    right.legend(fontsize=8)
    for ax in (left, right):
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---- python -m benchmarks ingest-shape ----


def add_arguments(parser: argparse.ArgumentParser) -> None:
    state_dir_argument(parser)
    parser.add_argument(
        "--changes", default="10000,50000,200000", metavar="N[,N...]", help="batch sizes, one table (default: 10000,50000,200000)"
    )
    parser.add_argument("--tables", default="1,10,50", metavar="N[,N...]", help="tables one batch spans (default: 1,10,50)")
    parser.add_argument(
        "--fan-out-changes", type=int, default=10_000, help="changes per batch over all tables, for --tables (default: 10000)"
    )
    parser.add_argument(
        "--commit-threads",
        default="1,8",
        metavar="N[,N...]",
        help="ingest.commit_threads settings compared side by side at each table count (default: 1,8; 8 is the setting's default)",
    )
    parser.add_argument("--batches", type=int, default=3, help="measured batches per point, after the warm-up (default: 3)")
    parser.add_argument(
        "--warm-up",
        type=int,
        default=1,
        help="batches per point before the measured ones; the JIT's share of the JVM's CPU shows whether they were enough (default: 1)",
    )
    parser.add_argument(
        "--shape",
        choices=SHAPES,
        default="generator",
        help="the messages: the generator's bare payloads or the real connector's with schemas (default: generator)",
    )
    parser.add_argument(
        "--prefix-cut",
        choices=("on", "off", "both"),
        default="on",
        help="whether the writer cuts the known wrapper prefixes from the records (ingest/prefixes.py); "
        "both: side by side at each batch size (default: on)",
    )
    parser.add_argument(
        "--job",
        choices=("driver", "spark", "both"),
        default="driver",
        help="where the writer runs a batch's job (ingest.driver_batch_records): in the driver, on Spark, "
        "or both side by side at each point (default: driver)",
    )
    parser.add_argument(
        "--driver-memory",
        default="6g",
        help="the driver JVM's heap (spark.driver.memory; the deployment examples give it 2g) (default: 6g)",
    )
    table_property_argument(parser)
    out_argument(parser)


def main(args: argparse.Namespace) -> int:
    changes = positive_integers(args.changes, "--changes")
    tables = positive_integers(args.tables, "--tables")
    threads = positive_integers(args.commit_threads, "--commit-threads")
    cuts = {"on": (True,), "off": (False,), "both": (False, True)}[args.prefix_cut]
    jobs = ("driver", "spark") if args.job == "both" else (args.job,)
    if args.warm_up < 1:  # a point's first batch also warms up its new tables' paths
        raise UserError(f"--warm-up: at least 1 batch; got {args.warm_up}")
    results = run(
        changes,
        tables,
        args.fan_out_changes,
        args.batches,
        args.out,
        args.state_dir.resolve(),
        threads,
        args.shape,
        cuts,
        jobs,
        args.driver_memory,
        args.warm_up,
        table_properties(args),
    )
    print_results(args.out, "ingest-shape", summary(results))
    return 0
