"""The parse stage over Arrow batches of Kafka records, without Spark: the truncate carries its
LSN out, and the redo after it skips the table's changes below that LSN on every partition."""

from __future__ import annotations

from typing import Any

import orjson
import pyarrow as pa

from icecdc.domain.layout import Column, TableLayout
from icecdc.domain.sourcespec import DEFAULT_RULES
from icecdc.ingest.debezium import Reason
from icecdc.ingest.stage_rows import Tag
from icecdc.ingest.stages import parse_stage


def layout(table: str, topic: str) -> TableLayout:
    columns = (Column("id", "long", True), Column("v", "string"))
    return TableLayout(table, topic, columns, {"id": 1, "v": 2}, ("id",), (), 0, f"/w/{table}/data")


LAYOUTS = {"shop.public.t": layout("db.t", "shop.public.t"), "shop.public.u": layout("db.u", "shop.public.u")}
RULES = dict.fromkeys(("db.t", "db.u"), DEFAULT_RULES)


def record(
    topic: str, partition: int, offset: int, op: str, lsn: int | None, row: dict[str, Any] | None = None
) -> dict[str, Any]:
    source = {"connector": "postgresql", "lsn": lsn} if lsn is not None else {"connector": "mysql", "pos": 154}
    payload = {"op": op, "source": source, "before": None, "after": row}
    key = orjson.dumps({"id": row["id"]}) if row else None
    return {"key": key, "value": orjson.dumps(payload), "topic": topic, "partition": partition, "offset": offset}


BATCH = [
    record("shop.public.t", 0, 0, "c", 10, {"id": 1, "v": "before, same partition"}),
    record("shop.public.t", 0, 1, "t", 30),
    record("shop.public.t", 0, 2, "c", 40, {"id": 2, "v": "after"}),
    record("shop.public.t", 1, 0, "c", 20, {"id": 3, "v": "before, another partition"}),
    record("shop.public.t", 1, 1, "c", 25, {"id": "four", "v": "before, and bad"}),
    record("shop.public.t", 1, 2, "u", 35, {"id": 1, "v": "after, another partition"}),
    record("shop.public.t", 2, 0, "c", None, {"id": 5, "v": "no lsn"}),
    record("shop.public.u", 0, 0, "c", 5, {"id": 6, "v": "another table, not truncated"}),
]


def parsed(truncate_lsns: dict[str, int]) -> list[dict[str, Any]]:
    stage = parse_stage(LAYOUTS, {}, RULES, truncate_lsns)
    return [row for batch in stage([pa.RecordBatch.from_pylist(BATCH)]) for row in batch.to_pylist() if row["op"] != Tag.MARK]


def ops(rows: list[dict[str, Any]]) -> dict[tuple[str, int, int], str]:
    return {(row["topic"].rsplit(".", 1)[1], row["kafka_partition"], row["offset"]): row["reason"] or row["op"] for row in rows}


def test_the_truncate_carries_its_lsn_and_the_first_run_parses_every_change():
    rows = parsed({})
    (truncate,) = [row for row in rows if row["op"] == Tag.TRUNCATE]
    assert (truncate["table"], truncate["kafka_partition"], truncate["offset"], truncate["lsn"]) == ("db.t", 0, 1, 30)
    assert ops(rows) == {
        ("t", 0, 0): "c",
        ("t", 0, 1): Tag.TRUNCATE,
        ("t", 0, 2): "c",
        ("t", 1, 0): "c",
        ("t", 1, 1): Reason.BAD_VALUE,
        ("t", 1, 2): "u",
        ("t", 2, 0): "c",
        ("u", 0, 0): "c",
    }
    assert all(row["lsn"] is None for row in rows if row["op"] != Tag.TRUNCATE)  # only the truncate's is carried


def test_the_redo_skips_the_truncated_table_s_changes_below_its_lsn_and_still_rejects_bad_ones():
    assert ops(parsed({"db.t": 30})) == {
        ("t", 0, 0): Tag.SKIP,  # the redo starts after the truncate there; below its LSN all the same
        ("t", 0, 1): Tag.TRUNCATE,
        ("t", 0, 2): "c",
        ("t", 1, 0): Tag.SKIP,
        ("t", 1, 1): Reason.BAD_VALUE,  # a dead letter before the truncate as after it
        ("t", 1, 2): "u",
        ("t", 2, 0): "c",  # no LSN to compare: kept, as after the truncate
        ("u", 0, 0): "c",
    }


def test_a_table_without_a_primary_key_keeps_its_creates_and_dead_letters_the_rest_with_the_reason():
    keyless = {
        "shop.public.h": TableLayout(
            "db.h", "shop.public.h", LAYOUTS["shop.public.t"].columns, {"id": 1, "v": 2}, (), (), 0, "/w"
        )
    }
    batch = [
        record("shop.public.h", 0, 0, "r", 10, {"id": 1, "v": "snapshot"}),
        record("shop.public.h", 0, 1, "c", 20, {"id": 1, "v": "snapshot"}),  # the same row again
        record("shop.public.h", 0, 2, "u", 30, {"id": 1, "v": "updated"}),
        {
            **record("shop.public.h", 0, 3, "d", 40),
            "value": orjson.dumps({"op": "d", "before": {"id": 1, "v": "x"}, "after": None}),
        },
        {"key": None, "value": None, "topic": "shop.public.h", "partition": 0, "offset": 4},  # a tombstone
        record("shop.public.h", 0, 5, "t", 50),  # a truncate, applied (it needs no key)
    ]
    for row in batch:
        row["key"] = None  # Debezium keys a table without a primary key with null
    stage = parse_stage(keyless, {}, {"db.h": DEFAULT_RULES}, {})
    rows = [row for out in stage([pa.RecordBatch.from_pylist(batch)]) for row in out.to_pylist() if row["op"] != Tag.MARK]
    assert ops(rows) == {
        ("h", 0, 0): "r",
        ("h", 0, 1): "c",
        ("h", 0, 2): Reason.NO_PRIMARY_KEY,
        ("h", 0, 3): Reason.NO_PRIMARY_KEY,
        ("h", 0, 4): Reason.NO_PRIMARY_KEY,
        ("h", 0, 5): Tag.TRUNCATE,
    }
    created = [row for row in rows if row["op"] in ("c", "r")]
    assert [(row["key"], row["prior"], row["global_delete"]) for row in created] == [("{}", [], False)] * 2
    details = [row["detail"] for row in rows if row["reason"] is not None]
    assert details == [
        f"table db.h has no primary key: it is mirrored append-only, updates and deletes cannot be applied ({what})"
        for what in ("an update", "a delete", "a tombstone")
    ]
