"""``icecdc bench source-latency``: the real source's end-to-end latency, from a PostgreSQL commit
to the first Iceberg snapshot that shows it, at a steady rate of transactions.

Each run drives ``--rate`` transactions a second for ``--seconds`` into an ``orders`` table of a
throwaway PostgreSQL cluster (``icecdc.sources.orders``: single-statement transactions in
autocommit, inserts, updates that move rows between regions, deletes, some statements of several
rows), which the real Debezium connector streams to the broker as Kafka Connect would, and which
``icecdc ingest`` (the direct reader, in this process) mirrors into an Iceberg table partitioned
by region. Every statement stamps the rows it writes with its own clock
(``clock_timestamp()``, within a millisecond of its commit in autocommit). Once the table has
caught up with the database, it must equal ``SELECT *`` (the run fails otherwise), and each row's
latency is read from the table itself: the row lives in a data file, which one snapshot added
(the ``entries`` metadata table), committed at a known millisecond; its latency is that moment
minus the row's stamp. Rows a later statement changed again are measured at their last change;
deleted rows are not measured. Rows stamped in the first ``--warmup-seconds`` are left out (the
first Spark jobs of a session are slow).

The pacing is one connection on this machine, so when the database, Debezium, Spark and the
pacing cannot keep ``--rate`` between them, the run says what rate it reached.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from icecdc.bench import out_argument, print_results
from icecdc.bench.harness import BenchStack, bench_stack, clone, progress
from icecdc.bench.report import machine, markdown_table, percentile, publish, pyplot
from icecdc.domain.errors import UserError
from icecdc.options import state_dir_argument
from icecdc.sources.postgres import ThrowawayPostgres
from icecdc.workload import ORDERS_SCHEMA, orders_table

NAME = "source-latency"
say = progress(NAME)
EPOCH = dt.datetime(1970, 1, 1)
# How long the table may take to catch up with the database once the load stops.
CATCH_UP_SECONDS = 300
# Transactions the pacer starts per tick: a tick is 1/TICKS_PER_SECOND s.
TICKS_PER_SECOND = 100


@dataclass
class RunResult:
    """One run: the rate reached and every measured row's latency (seconds)."""

    run: int
    target_rate: float
    seconds: float  # how long the load ran
    committed: int  # transactions committed
    rows_changed: int
    latencies: list[float] = field(default_factory=list)
    # Seconds into the load at which each measured row was committed (same order as latencies).
    committed_at: list[float] = field(default_factory=list)
    snapshots: int = 0  # Iceberg commits that made the measured rows visible
    rows: int = 0  # rows in the table at the end
    rows_match: bool = False
    catch_up_seconds: float = 0.0  # from the load's end until the table matched the database

    @property
    def rate(self) -> float:
        return self.committed / self.seconds if self.seconds else 0.0

    def latency(self, share: float) -> float:
        return percentile(self.latencies, share) if self.latencies else float("nan")


@dataclass
class LatencyResults:
    machine: str
    rate: float
    seconds: float
    warmup_seconds: float
    trigger_seconds: float
    runs: list[RunResult] = field(default_factory=list)


class PacedLoad:
    """``rate`` transactions a second on one connection, on a thread, for ``seconds``; behind
    schedule it runs as fast as it can (the run then reports the rate it reached)."""

    def __init__(self, postgres: ThrowawayPostgres, workload: Any, rate: float, seconds: float) -> None:
        self._postgres, self.workload, self._rate, self._seconds = postgres, workload, rate, seconds
        self.started = 0.0  # wall clock (epoch seconds) when the load began
        self.elapsed = 0.0
        self._thread = threading.Thread(target=self._run, name="paced-load", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            with self._postgres.connect() as db:
                self.started, begun = time.time(), time.monotonic()
                done = 0
                while (now := time.monotonic() - begun) < self._seconds:
                    due = int(now * self._rate)
                    if done >= due:
                        time.sleep(1 / TICKS_PER_SECOND)
                        continue
                    for _ in range(min(due - done, int(self._rate / TICKS_PER_SECOND) + 1)):
                        self.workload.transaction(db)
                        done += 1
                self.elapsed = time.monotonic() - begun
        except BaseException as exc:  # noqa: BLE001 - carried to the bench's thread, which raises it
            self.error = exc

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        self._thread.join()
        if self.error is not None:
            raise self.error


def _wait_until(condition: Any, timeout: float, what: str) -> float:
    begun = time.monotonic()
    while not condition():
        if time.monotonic() - begun > timeout:
            raise RuntimeError(f"{what} within {timeout:.0f}s")
        time.sleep(1)
    return time.monotonic() - begun


def run_once(stack: BenchStack, postgres: ThrowawayPostgres, run: int, args: argparse.Namespace, out: Path) -> RunResult:
    from icecdc.ingest.runner import run_ingest
    from icecdc.runtime.catalog import pyiceberg_catalog
    from icecdc.sources.debezium import DebeziumPostgresSource
    from icecdc.sources.orders import OrdersTransactions, table_rows

    source_table = f"orders_{stack.run_id}_{run}"
    workload = OrdersTransactions(
        table=source_table, seed=run, max_statements=1, rollback_share=0.0, multi_row=0.1, clock=True, recent_keys=5_000
    )
    with postgres.connect() as db:
        workload.create(db)
    source = DebeziumPostgresSource(
        out / f"debezium-{run}",
        postgres,
        stack.config.kafka,
        topic_prefix=f"bench{stack.run_id}r{run}",
        slot_name=f"bench_{stack.run_id}_{run}",
        properties={"table.include.list": f"public.{source_table}"},
    )
    spec = {**orders_table(f"bench.latency_{stack.run_id}_{run}", source.topic(source_table)), "before_image": "key"}
    spec["partition_by"] = ["region"]
    config = clone(
        stack.config,
        tables=[spec],
        commit_topic=f"commits-{stack.run_id}-{run}",
        dead_letter_topic=f"dlq-{stack.run_id}-{run}",
        ingest=stack.config.ingest.model_copy(update={"source": "direct", "trigger_seconds": args.trigger_seconds}),
    )
    name = config.table_ref(spec["name"]).qualified
    stop_ingest = threading.Event()
    ingested: dict[str, Any] = {}

    def ingest() -> None:
        ingested["stats"] = run_ingest(config, spark=stack.spark, stop=stop_ingest)

    with source:
        source.wait_streaming()
        ingester = threading.Thread(target=ingest, name="ingest", daemon=True)
        ingester.start()
        catalog = pyiceberg_catalog(config)
        _wait_until(lambda: catalog.table_exists(spec["name"]), 300, "the ingester did not create its table")
        load = PacedLoad(postgres, workload, args.rate, args.seconds)
        say(f"run {run}: {args.rate:g} transactions/s for {args.seconds:g}s into {source_table}")
        load.start()
        load.join()
        say(
            f"run {run}: {workload.counts.committed} transactions in {load.elapsed:.1f}s ({workload.counts.committed / load.elapsed:.0f}/s)"
        )
        with postgres.connect() as db:
            expected = table_rows(db, source_table)
        # Debezium keeps commit order, and the topic has one partition: the newest stamp visible
        # means every earlier commit is too.
        newest = max(r[4] for r in expected)
        caught_up = _wait_until(
            lambda: _newest_stamp(stack, name) == newest,
            CATCH_UP_SECONDS,
            "the table did not catch up with the database",
        )
        stop_ingest.set()
        ingester.join()
    if "stats" not in ingested:
        raise RuntimeError("the ingester stopped with an error (see the log above)")
    rows = sorted(tuple(r) for r in stack.spark.table(name).select(*ORDERS_SCHEMA).collect())
    result = RunResult(
        run,
        args.rate,
        load.elapsed,
        workload.counts.committed,
        workload.counts.rows_changed,
        rows=len(rows),
        rows_match=rows == expected,
        catch_up_seconds=caught_up,
    )
    if not result.rows_match:
        raise RuntimeError(f"run {run}: the table ({len(rows)} rows) does not match SELECT * ({len(expected)} rows)")
    _measure(stack, spec["name"], load.started + args.warmup_seconds, load.started, result)
    return result


def _newest_stamp(stack: BenchStack, name: str) -> Any:
    # The session's catalog caches the table while it is read; the ingester commits through the Java API.
    stack.spark.sql(f"REFRESH TABLE {name}")
    (newest,) = stack.spark.sql(f"SELECT max(updated_at) FROM {name}").collect()[0]
    return newest


def _measure(stack: BenchStack, table_name: str, measured_from: float, load_started: float, result: RunResult) -> None:
    """Each live row's latency: the commit of the snapshot that added its data file, minus its stamp."""
    from icecdc.runtime.catalog import pyiceberg_catalog

    name = stack.ref(table_name).qualified
    table = pyiceberg_catalog(stack.config).load_table(stack.ref(table_name).identifier)
    committed_ms = {s.snapshot_id: s.timestamp_ms for s in table.snapshots()}
    rows = stack.spark.sql(
        f"SELECT t.updated_at, e.snapshot_id FROM (SELECT updated_at, _file FROM {name}) t "
        f"JOIN (SELECT data_file.file_path AS file, snapshot_id FROM {name}.entries WHERE status < 2) e ON t._file = e.file"
    ).collect()
    visible_in = set()
    for stamp, snapshot_id in rows:
        stamped = (stamp - EPOCH).total_seconds()
        if stamped < measured_from:
            continue
        result.latencies.append(committed_ms[snapshot_id] / 1000 - stamped)
        result.committed_at.append(stamped - load_started)
        visible_in.add(snapshot_id)
    result.snapshots = len(visible_in)


def run(args: argparse.Namespace) -> LatencyResults:
    results = LatencyResults(machine(), args.rate, args.seconds, args.warmup_seconds, args.trigger_seconds)
    state_dir = args.state_dir.resolve()
    with bench_stack(NAME, state_dir) as stack, ThrowawayPostgres() as postgres:
        for number in range(1, args.runs + 1):
            result = run_once(stack, postgres, number, args, state_dir)
            results.runs.append(result)
            say(
                f"run {number}: {result.rate:.0f} transactions/s; latency p50 {result.latency(0.5):.2f}s, "
                f"p95 {result.latency(0.95):.2f}s, max {max(result.latencies, default=float('nan')):.2f}s "
                f"over {len(result.latencies)} rows"
            )
    publish(args.out, NAME, results, _plot, summary)
    return results


def _spread(values: list[float], unit: str = "s", digits: int = 2) -> str:
    return f"{statistics.median(values):.{digits}f} {unit} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def summary(results: LatencyResults) -> str:
    runs = results.runs
    rows = [
        [
            r.run,
            f"{r.rate:,.0f}",
            f"{r.committed:,}",
            f"{len(r.latencies):,}",
            r.snapshots,
            f"{r.latency(0.5):.2f}",
            f"{r.latency(0.95):.2f}",
            f"{max(r.latencies, default=float('nan')):.2f}",
            f"{r.catch_up_seconds:.0f}",
        ]
        for r in runs
    ]
    table = markdown_table(
        ["run", "tx/s reached", "transactions", "rows measured", "snapshots", "p50 s", "p95 s", "max s", "catch-up s"], rows
    )
    reached = [r.rate for r in runs]
    verdict = (
        f"The pipeline kept the target rate of {results.rate:,.0f} transactions/s."
        if min(reached) >= 0.98 * results.rate
        else f"The machine did not sustain {results.rate:,.0f} transactions/s through the pipeline: it reached {_spread(reached, 'tx/s', 0)}."
    )
    return (
        f"{len(runs)} runs of {results.seconds:g} s at {results.rate:,.0f} transactions/s (the first "
        f"{results.warmup_seconds:g} s of each not measured), ingester trigger {results.trigger_seconds:g} s; {results.machine}.\n\n"
        f"PostgreSQL commit to visible in Iceberg, median of the runs (range): p50 {_spread([r.latency(0.5) for r in runs])}, "
        f"p95 {_spread([r.latency(0.95) for r in runs])}, max {_spread([max(r.latencies) for r in runs])}. {verdict}\n\n"
        + table
        + "\n"
    )


def _plot(results: LatencyResults, path: Path) -> None:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for r in results.runs:
        step = max(1, len(r.latencies) // 3_000)  # a readable scatter
        left.scatter(r.committed_at[::step], r.latencies[::step], s=2, alpha=0.4, label=f"run {r.run}")
        ordered = sorted(r.latencies)
        right.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], label=f"run {r.run}")
    left.set_xlabel("commit, seconds into the run")
    left.set_ylabel("seconds to visible in Iceberg")
    left.set_title(f"each row, at {results.rate:,.0f} transactions/s", fontsize=9)
    right.set_xlabel("seconds from PostgreSQL commit to visible in Iceberg")
    right.set_ylabel("share of rows")
    right.set_title("cumulative distribution", fontsize=9)
    for ax in (left, right):
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, markerscale=4)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---- icecdc bench source-latency ----


def add_arguments(parser: argparse.ArgumentParser) -> None:
    state_dir_argument(parser)
    parser.add_argument("--rate", type=float, default=1_000, help="transactions per second into PostgreSQL (default: 1000)")
    parser.add_argument("--seconds", type=float, default=90, help="how long each run drives the load (default: 90)")
    parser.add_argument("--warmup-seconds", type=float, default=10, help="commits not measured at each run's start (default: 10)")
    parser.add_argument("--runs", type=int, default=3, help="runs, each with its own table and connector (default: 3)")
    parser.add_argument("--trigger-seconds", type=float, default=2, help="the ingester's ingest.trigger_seconds (default: 2)")
    out_argument(parser)


def main(args: argparse.Namespace) -> int:
    if min(args.rate, args.seconds, args.runs, args.trigger_seconds) <= 0 or not 0 <= args.warmup_seconds < args.seconds:
        raise UserError("--rate, --seconds, --runs and --trigger-seconds must be above 0, --warmup-seconds below --seconds")
    print_results(args.out, NAME, summary(run(args)))
    return 0
