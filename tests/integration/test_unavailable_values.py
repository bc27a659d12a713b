"""Unsent (TOAST) values resolved against a real table: the writer's key lookup through Spark
(``IcebergTable.key_rows``), its read of the snapshot an earlier batch found for a primary-key
change whose delete, tombstone and create came in three batches, and the headers through the
direct reader's frame.
The decisions themselves are unit tests (tests/unit/test_unavailable.py)."""

from __future__ import annotations

import base64

import orjson

from icecdc.ingest.debezium import NEW_KEY_HEADER, OLD_KEY_HEADER, UNAVAILABLE_PLACEHOLDER, UNAVAILABLE_PLACEHOLDER_BASE64
from icecdc.ingest.records import records_to_dataframe
from icecdc.runtime.config import TableConfig
from tests.cdc import kafka_records
from tests.integration.test_ingest_writer import batch_writer

SCHEMA = {"id": "long", "region": "string", "qty": "long", "notes": "string", "blob": "binary"}
NOTES, BLOB = "n" * 9000, base64.b64encode(bytes(range(256)) * 20).decode()


def _record(op: str, after: dict | None, key: int, headers: dict[str, int]) -> tuple[bytes, bytes | None, list]:
    value = None if op == "tombstone" else orjson.dumps({"op": op, "before": {"id": key} if op == "d" else None, "after": after})
    return orjson.dumps({"id": key}), value, [(name, orjson.dumps({"id": k})) for name, k in headers.items()]


def test_a_key_change_split_by_batches_and_an_update_take_their_values_from_the_table(spark, stack_config, unique):
    table = TableConfig.model_validate(
        {
            "name": f"it.toast_{unique}",
            "topic": f"toast-{unique}",
            "primary_key": ["id"],
            "partition_by": ["region"],
            "schema": SCHEMA,
        }
    )
    config = stack_config.model_copy(
        update={"tables": [table], "commit_topic": f"commits-{unique}", "dead_letter_topic": f"dlq-{unique}"}
    )
    unsent = {"notes": UNAVAILABLE_PLACEHOLDER, "blob": UNAVAILABLE_PLACEHOLDER_BASE64}
    batches = [
        [
            _record("c", {"id": 1, "region": "eu", "qty": 0, "notes": NOTES, "blob": BLOB}, 1, {}),
            _record("c", {"id": 2, "region": "eu", "qty": 0, "notes": "two", "blob": None}, 2, {}),
        ],
        [  # key 1 moves to 10; the batch ends before the tombstone
            _record("u", {"id": 2, "region": "us", "qty": 1, **unsent, "blob": None}, 2, {}),
            _record("d", None, 1, {NEW_KEY_HEADER: 10}),
        ],
        [_record("tombstone", None, 1, {}), _record("c", {"id": 3, "region": "eu", "qty": 0, "notes": "three"}, 3, {})],
        [_record("c", {"id": 10, "region": "us", "qty": 0, **unsent}, 10, {OLD_KEY_HEADER: 1})],
    ]
    offset = 0
    with batch_writer(spark, config) as write:
        for number, batch in enumerate(batches):
            records = kafka_records(table.topic, [(k, v) for k, v, _ in batch], first_offset=offset)
            for record, (_, _, headers) in zip(records, batch, strict=True):
                record["headers"] = headers
            offset += len(records)
            result = write(records_to_dataframe(spark, records), number)
            assert result.dead_letters == 0

    rows = spark.table(config.table_ref(table.name).qualified).orderBy("id").collect()
    assert [(r.id, r.region, r.qty, r.notes, r.blob and base64.b64encode(r.blob).decode()) for r in rows] == [
        (2, "us", 1, "two", None),
        (3, "eu", 0, "three", None),
        (10, "us", 0, NOTES, BLOB),
    ]
