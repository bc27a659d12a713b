"""``icecdc demo``: the whole pipeline on one machine with nothing running beforehand.

It starts the embedded broker, writes the configuration it uses to ``<state_dir>/icecdc.yaml``
(so every other command can be pointed at the same stack), streams a synthetic Debezium change
feed for an ``orders`` table into Kafka while the ingester mirrors it into Iceberg, then checks
the table against the state the change feed implies and shows what was written.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import yaml

from icecdc import kafka
from icecdc.broker import EmbeddedBroker
from icecdc.catalog import pyiceberg_catalog, qualified
from icecdc.config import Config, embedded_config
from icecdc.workload import OrdersWorkload, orders_table

DEMO_TABLE = orders_table("demo.orders", "shop.public.orders")
INITIAL_ROWS = 5_000
BURSTS, BURST_CHANGES = 6, 2_000
MALFORMED = [b"{this is not json", b'{"op": "c", "after": {"id": null, "region": "eu"}}']


def _step(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def demo_config(state_dir: Path, port: int) -> Config:
    return embedded_config(state_dir, port, tables=[DEMO_TABLE],
                           ingest={"source": "direct", "trigger_seconds": 2, "max_batch_records": 5_000})


def write_config(config: Config, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=False))


def _stream_changes(config: Config, workload: OrdersWorkload) -> None:
    """The upstream database: an initial snapshot, then bursts of changes every few seconds."""
    topic = config.tables[0].topic
    producer = kafka.producer(config.kafka)
    for burst in range(BURSTS + 1):
        changes = workload.load(INITIAL_ROWS) if burst == 0 else workload.changes(BURST_CHANGES)
        for change in changes:
            producer.produce(topic, key=change.record[0], value=change.record[1])
            producer.poll(0)
        if burst == BURSTS // 2:
            for value in MALFORMED:
                producer.produce(topic, key=b"bad", value=value)
        producer.flush(30)
        _step(f"upstream: {'snapshot of ' + str(INITIAL_ROWS) + ' rows' if burst == 0 else str(BURST_CHANGES) + ' changes'} sent")
        time.sleep(3)


def run_demo(state_dir: Path, port: int, keep_broker: bool = False) -> int:
    from icecdc.ingest.runner import run_ingest
    from icecdc.spark import create_spark_session

    config = demo_config(state_dir, port)
    config_path = state_dir / "icecdc.yaml"
    write_config(config, config_path)
    _step(f"configuration: {config_path}")

    broker = EmbeddedBroker(state_dir / "broker", port)
    started = broker.start()
    _step(f"broker {'started' if started else 'already running'} on {broker.bootstrap_servers} (memory only)")
    try:
        table = config.tables[0]
        name = qualified(config, table)
        spark = create_spark_session(config, "icecdc-demo")
        if spark.catalog.tableExists(name):
            # The broker forgets everything when it stops; a table left by an earlier run would
            # hold offsets the new broker never issued. Start the demo table afresh.
            spark.sql(f"DROP TABLE {name} PURGE")
        kafka.ensure_topics(config.kafka, [table.topic])

        workload = OrdersWorkload()
        upstream = threading.Thread(target=_stream_changes, args=(config, workload), daemon=True)
        upstream.start()
        # The upstream pauses 3 s between bursts; 8 s of silence means it has finished.
        stats = run_ingest(config, until_idle=8, spark=spark)
        upstream.join()

        rows = sorted(tuple(r) for r in spark.table(name).select("id", "region", "status", "amount", "updated_at").collect())
        expected = workload.expected_rows()
        if rows != expected:
            _step(f"MISMATCH: the table has {len(rows)} rows, the change feed implies {len(expected)}")
            return 1
        _step(f"ingest: {stats.batches} micro-batches, {stats.records} records, {stats.commits} commits, "
              f"{stats.dead_letters} malformed records sent to {config.dead_letter_topic}")
        _step(f"check: {name} holds exactly the {len(rows)} rows the change feed implies")
        files = {r.content: r.n for r in spark.sql(f"SELECT content, count(*) AS n FROM {name}.files GROUP BY content").collect()}
        _step(f"table: {files.get(0, 0)} data files, {files.get(2, 0)} equality-delete files, "
              f"{files.get(1, 0)} position-delete files (the compactor's job is to fold these)")
        snapshot = pyiceberg_catalog(config).load_table(table.name).current_snapshot()
        _step(f"pyiceberg sees snapshot {snapshot.snapshot_id} with summary offsets {snapshot.summary.additional_properties.get('icecdc.offsets')}")
        _step(f"try: icecdc ingest --config {config_path}  (with --keep-broker, the stack stays up)")
        return 0
    finally:
        if started and not keep_broker:
            broker.stop()
            _step("broker stopped")
