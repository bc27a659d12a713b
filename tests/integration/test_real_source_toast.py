"""Unchanged TOAST values through the real Debezium PostgreSQL connector, at PostgreSQL's default
REPLICA IDENTITY: wide text, jsonb and bytea values that most updates leave alone arrive as
Debezium's placeholder, and the Iceberg table still ends equal to ``SELECT *``, over several
micro-batches and primary-key changes (``unavailable_values: resolve``, the default); with
``unavailable_values: dead-letter`` such updates go to the dead-letter topic with their reason."""

from __future__ import annotations

import random

import orjson
import pytest

from icecdc.ingest import metrics
from icecdc.ingest.debezium import UNAVAILABLE_PLACEHOLDER
from icecdc.ingest.runner import run_ingest
from icecdc.runtime.config import TableConfig
from icecdc.testbed.connector import DebeziumPostgresSource
from tests.integration.test_ingest_process import UNTIL_IDLE_SECONDS
from tests.integration.test_ingest_writer import read_topic
from tests.integration.test_real_source import postgres, wait_for_key  # noqa: F401  (postgres: the module's cluster)

pytestmark = pytest.mark.slow

ROWS, UPDATES, KEY_CHANGES = 120, 250, 6
BATCH_RECORDS = 100  # several micro-batches: resolution across batches, key changes split by them
SENTINEL = 1_000_000
SCHEMA = {"id": "long", "region": "string", "qty": "int", "notes": "string", "doc": "string", "blob": "binary"}


def test_unchanged_toast_values_end_exact_and_dead_letter_mode_sends_them_away(postgres, spark, stack_config, unique, tmp_path):  # noqa: F811
    table, rejecting = f"wide_{unique}", f"wide_dl_{unique}"
    rng = random.Random(283)

    def notes() -> str:  # 9-14 kB, stored out of line
        return rng.randbytes(rng.randrange(4500, 7000)).hex()

    def doc() -> str:
        return orjson.dumps({"text": rng.randbytes(2500).hex(), "n": rng.randrange(1000)}).decode()

    def blob() -> bytes:
        return rng.randbytes(rng.randrange(3000, 4000))

    insert = f"INSERT INTO {table} VALUES (%s, %s, %s, %s, %s, %s)"
    with postgres.connect() as db:
        db.execute(
            f"CREATE TABLE {table} (id bigint PRIMARY KEY, region text NOT NULL, qty int NOT NULL, notes text, doc jsonb, blob bytea)"
        )
        db.execute(f"CREATE TABLE {rejecting} (id bigint PRIMARY KEY, qty int NOT NULL, notes text)")
        db.cursor().executemany(
            insert, [(k, rng.choice("ab"), 0, notes(), doc(), blob()) for k in range(ROWS // 2)]
        )  # the snapshot
    source = DebeziumPostgresSource(
        tmp_path / "engine",
        postgres,
        stack_config.kafka,
        topic_prefix=table,
        slot_name=table,
        properties={"table.include.list": f"public.{table},public.{rejecting}"},
    )
    with source:
        source.wait_streaming()
        with postgres.connect() as db:
            db.cursor().executemany(insert, [(k, rng.choice("ab"), 0, notes(), doc(), blob()) for k in range(ROWS // 2, ROWS)])
            keys = list(range(ROWS))
            moves = set(rng.sample(range(UPDATES), KEY_CHANGES))
            for step in range(UPDATES):
                with db.transaction():
                    for key in rng.sample(keys, 3):
                        if step in moves and key == keys[0]:
                            continue
                        draw = rng.random()
                        if draw < 0.9:  # the wide values left alone: sent as the placeholder
                            db.execute(f"UPDATE {table} SET qty = qty + 1, region = %s WHERE id = %s", (rng.choice("ab"), key))
                        elif draw < 0.95:
                            db.execute(f"UPDATE {table} SET notes = %s WHERE id = %s", (notes(), key))
                        else:
                            db.execute(f"UPDATE {table} SET doc = %s, blob = %s WHERE id = %s", (doc(), blob(), key))
                if step in moves:  # a key change of a row whose wide values it does not touch
                    old = rng.choice(keys)
                    keys.remove(old)
                    keys.append(old + 10_000)
                    db.execute(f"UPDATE {table} SET id = %s, qty = qty + 1 WHERE id = %s", (old + 10_000, old))
            for key in rng.sample(keys, 5):
                db.execute(f"DELETE FROM {table} WHERE id = %s", (key,))
            rejected_notes = notes()
            db.execute(f"INSERT INTO {rejecting} VALUES (1, 0, %s), (2, 0, %s)", (rejected_notes, notes()))
            db.execute(f"UPDATE {rejecting} SET qty = 1 WHERE id = 1")  # the placeholder: dead-lettered
            db.execute(f"UPDATE {rejecting} SET notes = 'set' WHERE id = 2")
            db.execute(f"INSERT INTO {rejecting} VALUES (%s, 0, NULL)", (SENTINEL,))
            db.execute(insert, (SENTINEL, "a", 0, None, None, None))
            expected = sorted(db.execute(f"SELECT id, region, qty, notes, doc::text, blob FROM {table}").fetchall())
            kept = sorted(db.execute(f"SELECT id, qty, notes FROM {rejecting}").fetchall())
        wait_for_key(stack_config, source.topic(table), {"id": SENTINEL})
        wait_for_key(stack_config, source.topic(rejecting), {"id": SENTINEL})

    base = {"primary_key": ["id"], "partition_by": ["region"], "schema": SCHEMA}
    resolving = TableConfig.model_validate(base | {"name": f"it.{table}", "topic": source.topic(table)})
    dead_letter = TableConfig.model_validate(
        {"name": f"it.{rejecting}", "topic": source.topic(rejecting), "primary_key": ["id"]}
        | {"schema": {"id": "long", "qty": "int", "notes": "string"}, "unavailable_values": "dead-letter"}
    )
    config = stack_config.model_copy(
        update={
            "tables": [resolving, dead_letter],
            "commit_topic": f"commits-{unique}",
            "dead_letter_topic": f"dlq-{unique}",
            "ingest": stack_config.ingest.model_copy(
                update={"source": "direct", "min_commit_interval_seconds": 0.5, "max_batch_records": BATCH_RECORDS}
            ),
        }
    )
    resolved = metrics.UNAVAILABLE_ROWS.labels(resolving.name, "resolved")
    resolved_before = resolved._value.get()
    stats = run_ingest(config, until_idle=UNTIL_IDLE_SECONDS, spark=spark)

    assert stats.batches - stats.batches_skipped >= 5, "the stream spans several micro-batches"
    assert resolved._value.get() - resolved_before > ROWS / 2, "rows took their values from the table"
    rows = spark.table(config.table_ref(resolving.name).qualified).select(*SCHEMA).collect()
    got = sorted((r.id, r.region, r.qty, r.notes, r.doc, None if r.blob is None else bytes(r.blob)) for r in rows)
    assert len(got) == len(expected) and got == expected
    assert not any(UNAVAILABLE_PLACEHOLDER in str(value) for row in got for value in row[3:5])
    assert not any(row[5] is not None and UNAVAILABLE_PLACEHOLDER.encode() in row[5] for row in got)

    assert dict(stats.dead_letters_by_reason) == {"unavailable-value": 1}
    (letter,) = read_topic(config, config.dead_letter_topic, 1)
    headers = dict(letter.headers())
    assert headers["icecdc.reason"] == b"unavailable-value" and b"['notes']" in headers["icecdc.detail"]
    assert orjson.loads(letter.value())["payload"]["after"] == {"id": 1, "qty": 1, "notes": UNAVAILABLE_PLACEHOLDER}
    rejected_rows = spark.table(config.table_ref(dead_letter.name).qualified).collect()
    assert sorted((r.id, r.qty, r.notes) for r in rejected_rows) == [
        (1, 0, rejected_notes),  # its placeholder update went to the dead-letter topic
        *[row for row in kept if row[0] != 1],
    ]
