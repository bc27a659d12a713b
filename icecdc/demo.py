"""``icecdc demo``: the whole pipeline on one machine with nothing running beforehand.

It starts the embedded broker, writes the configuration it uses to ``<state_dir>/icecdc.yaml``
(so every other command can be pointed at the same stack), and streams a synthetic Debezium
change feed for an ``orders`` table partitioned by region and day: a snapshot of three past
days, then four more days in bursts, where orders change soon after they are placed. The
ingester mirrors the feed into Iceberg while the compactor sidecar runs beside it: today's
partitions stay hot, yesterday's cool down and get compacted. At the end the demo checks the
table against the state the change feed implies and shows every partition's files and deletes.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import yaml

from icecdc import generator
from icecdc.compactor import status
from icecdc.compactor.status import status_path
from icecdc.compactor.tracker import PartitionStatus
from icecdc.runtime import kafka
from icecdc.runtime.broker import EmbeddedBroker
from icecdc.runtime.catalog import pyiceberg_catalog
from icecdc.runtime.config import Config, embedded_config
from icecdc.workload import OrdersWorkload, orders_table

DEMO_TABLE = orders_table("demo.orders", "shop.public.orders")
INITIAL_ROWS = 5_000
STREAMED_DAYS, BURSTS_PER_DAY, BURST_CHANGES, BURST_PAUSE = 4, 3, 1_500, 3.0
# Orders change within their first thousand successors (about a day of the feed).
RECENT_KEYS = 1_000
MALFORMED = [b"{this is not json", b'{"op": "c", "after": {"id": null, "region": "eu"}}']


def _step(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def demo_config(state_dir: Path, port: int) -> Config:
    # Small numbers for a small feed: every demo file is "small" under an 8 MB target, and a
    # partition settles after three of its usual gaps between writes (4 to 30 s).
    return embedded_config(
        state_dir,
        port,
        tables=[DEMO_TABLE],
        ingest={"source": "direct", "trigger_seconds": 2, "max_batch_records": 2_000, "http": {"host": "127.0.0.1", "port": 0}},
        compactor={
            "http": {"host": "127.0.0.1", "port": 0},
            "target_file_size_bytes": 8 * 1024 * 1024,
            "min_small_files": 4,
            "reconcile_seconds": 30,
            "settle": {"min_seconds": 4, "initial_seconds": 8, "max_seconds": 30},
        },
    )


def write_config(config: Config, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=False))


def _stream_changes(config: Config, workload: OrdersWorkload) -> None:
    """The upstream database: a snapshot of past days, then bursts of changes day after day."""
    topic = config.tables[0].topic
    producer = kafka.producer(config.kafka)

    def send(changes: list[Any], what: str) -> None:
        generator.send(producer, topic, changes)
        _step(f"upstream: {what}")

    send(workload.load(INITIAL_ROWS), f"snapshot of {INITIAL_ROWS} orders over days 1-{workload.days}")
    # Stream the days only once the ingester commits, so that each burst becomes its own
    # micro-batch (rather than a backlog read while Spark starts) and the cadence is visible.
    catalog = pyiceberg_catalog(config)
    while not catalog.table_exists(config.tables[0].name) or catalog.load_table(config.tables[0].name).current_snapshot() is None:
        time.sleep(1)
    for day in range(workload.days, workload.days + STREAMED_DAYS):
        workload.today = day
        for burst in range(BURSTS_PER_DAY):
            send(workload.changes(BURST_CHANGES), f"day {day + 1}: {BURST_CHANGES} changes")
            if day == workload.days and burst == 0:
                for value in MALFORMED:
                    producer.produce(topic, key=b"bad", value=value)
            time.sleep(BURST_PAUSE)


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
            part += f", read cost {sum(p.read_cost for p in rows)} (budget {sum(p.read_budget for p in rows):g}, {over} over)"
        parts.append(part)
    return f"t+{elapsed:.0f}s  " + (" | ".join(parts) or "no table yet")


def _all_settled(config: Config) -> bool:
    partitions = status.collect(config).partitions
    return bool(partitions) and all(p.state == "settled" and not p.equality_delete_files for p in partitions)


def run_demo(state_dir: Path, port: int, keep_broker: bool = False) -> int:
    from icecdc.compactor.sidecar import run_compactor
    from icecdc.ingest.runner import run_ingest
    from icecdc.runtime.spark import create_spark_session

    config = demo_config(state_dir, port)
    config_path = state_dir / "icecdc.yaml"
    write_config(config, config_path)
    _step(f"configuration: {config_path}")

    broker = EmbeddedBroker(state_dir / "broker", port)
    started = broker.start()
    _step(f"broker {'started' if started else 'already running'} on {broker.bootstrap_servers} (memory only)")
    spark = None
    try:
        table = config.tables[0]
        name = config.table_ref(table).qualified
        spark = create_spark_session(config, "icecdc-demo")
        if spark.catalog.tableExists(name):
            # The broker forgets everything when it stops; a table left by an earlier run would
            # hold offsets the new broker never issued. Start the demo table afresh.
            spark.sql(f"DROP TABLE {name} PURGE")
        status_path(config).unlink(missing_ok=True)
        kafka.ensure_topics(config.kafka, [table.topic])

        workload = OrdersWorkload(recent_keys=RECENT_KEYS)
        results: dict[str, Any] = {}
        stop_compactor = threading.Event()

        def ingest() -> None:
            # The upstream pauses 3 s between bursts; 8 s of silence means it has finished.
            results["ingest"] = run_ingest(config, until_idle=8, spark=spark)

        def compact() -> None:
            results["compactor"] = run_compactor(config, spark=spark, stop=stop_compactor)

        threads = [threading.Thread(target=f, daemon=True) for f in (lambda: _stream_changes(config, workload), ingest, compact)]
        begun = time.monotonic()
        for thread in threads:
            thread.start()
        upstream, ingester, compactor = threads
        while ingester.is_alive():
            ingester.join(6)
            _step(_summary(config, time.monotonic() - begun))
        upstream.join()
        # The feed has ended: give the last hot partitions time to settle and be compacted.
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not _all_settled(config):
            time.sleep(3)
            _step(_summary(config, time.monotonic() - begun))
        stop_compactor.set()
        compactor.join(120)
        if "ingest" not in results or "compactor" not in results:
            _step("FAILED: the ingester or the compactor stopped with an error (see the log above)")
            return 1
        stats, compactions = results["ingest"], results["compactor"]

        rows = sorted(tuple(r) for r in spark.table(name).select("id", "region", "status", "amount", "updated_at").collect())
        expected = workload.expected_rows()
        if rows != expected:
            _step(f"MISMATCH: the table has {len(rows)} rows, the change feed implies {len(expected)}")
            return 1
        _step(
            f"ingest: {stats.batches} micro-batches, {stats.records} records, {stats.commits} commits, "
            f"{stats.dead_letters} malformed records sent to {config.dead_letter_topic}"
        )
        _step(f"compactor: {compactions.committed} compactions committed, outcomes {compactions.outcomes}")
        _step(f"check: {name} holds exactly the {len(rows)} rows the change feed implies")
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
        if spark is not None:
            spark.stop()  # before the broker, and before the JVM's shutdown hooks would
        if started and not keep_broker:
            broker.stop()
            _step("broker stopped")
