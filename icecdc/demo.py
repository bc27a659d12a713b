"""``icecdc demo``: the whole stack on one machine with nothing running beforehand.

It starts the embedded broker, writes the configuration it uses to ``<state_dir>/icecdc.yaml``
(so every other command can be pointed at the same stack), creates the demo table and proves
each part: Kafka round trip, Spark writes and reads the Iceberg table, pyiceberg sees the same
snapshot from the same catalog.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import yaml

from icecdc import kafka
from icecdc.broker import EmbeddedBroker
from icecdc.catalog import ensure_tables, pyiceberg_catalog, qualified
from icecdc.config import Config, embedded_config

DEMO_TABLE = {
    "name": "demo.orders",
    "topic": "shop.public.orders",
    "primary_key": ["id"],
    "partition_by": ["region", "days(updated_at)"],
    "schema": {"id": "long", "region": "string", "status": "string", "amount": "decimal(12, 2)", "updated_at": "timestamp"},
}


def _step(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def demo_config(state_dir: Path, port: int) -> Config:
    return embedded_config(state_dir, port, tables=[DEMO_TABLE])


def write_config(config: Config, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=False))


def _kafka_round_trip(config: Config) -> None:
    probe_topic = "icecdc.demo.probe"
    kafka.ensure_topics(config.kafka, [probe_topic])
    marker = uuid.uuid4().hex.encode()
    producer = kafka.producer(config.kafka)
    producer.produce(probe_topic, value=marker)
    producer.flush(10)
    consumer = kafka.consumer(config.kafka, f"icecdc-demo-{marker.decode()}")
    consumer.subscribe([probe_topic])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and not message.error() and message.value() == marker:
                return
        raise RuntimeError("the probe message did not come back from the broker within 60 s")
    finally:
        consumer.close()


def run_demo(state_dir: Path, port: int, keep_broker: bool = False) -> int:
    from icecdc.spark import create_spark_session

    config = demo_config(state_dir, port)
    config_path = state_dir / "icecdc.yaml"
    write_config(config, config_path)
    _step(f"configuration: {config_path}")

    broker = EmbeddedBroker(state_dir / "broker", port)
    started = broker.start()
    _step(f"broker {'started' if started else 'already running'} on {broker.bootstrap_servers}")
    try:
        kafka.ensure_topics(config.kafka, [t.topic for t in config.tables] + [config.commit_topic, config.dead_letter_topic])
        _kafka_round_trip(config)
        _step("kafka: topics created, produce and consume round trip ok")

        spark = create_spark_session(config, "icecdc-demo")
        created = ensure_tables(spark, config)
        table = config.tables[0]
        name = qualified(config, table)
        _step(f"iceberg: table {table.name} {'created' if created else 'exists and matches the config'}")

        spark.sql(f"INSERT INTO {name} VALUES (1, 'eu', 'new', 10.50, TIMESTAMP_NTZ'2025-01-02 03:04:05')")
        rows = spark.sql(f"SELECT count(*) AS n FROM {name}").collect()[0].n
        snapshot = spark.sql(f"SELECT snapshot_id FROM {name}.snapshots ORDER BY committed_at DESC LIMIT 1").collect()[0].snapshot_id
        seen = pyiceberg_catalog(config).load_table(table.name).current_snapshot()
        if seen is None or seen.snapshot_id != snapshot:
            raise RuntimeError(f"pyiceberg sees snapshot {seen and seen.snapshot_id}, Spark committed {snapshot}")
        _step(f"spark: wrote and read {name} ({rows} rows); pyiceberg sees the same snapshot {snapshot}")
        _step("the stack works")
        return 0
    finally:
        if started and not keep_broker:
            broker.stop()
            _step("broker stopped")
