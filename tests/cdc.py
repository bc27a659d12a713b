"""An independent model of an upstream database for the ingest tests: applying operations to it
yields the Debezium events a connector would emit, and ``expected_rows`` is the state the target
table must end in. It shares no code with the ingester."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import orjson

ORDERS_SCHEMA = {"id": "long", "region": "string", "amount": "decimal(10, 2)", "updated_at": "timestamp"}
ORDERS_PARTITIONING = ["region", "days(updated_at)"]
REGIONS = ("eu", "us", "apac")
MICROS_PER_DAY = 86_400_000_000
BASE_MICROS = 1_735_689_600_000_000  # 2025-01-01T00:00:00

_WRAPPER_SCHEMA = {
    "type": "struct",
    "name": "shop.public.orders.Envelope",
    "fields": [
        {
            "field": field_name,
            "type": "struct",
            "optional": True,
            "fields": [
                {"field": "id", "type": "int64"},
                {"field": "region", "type": "string", "optional": True},
                {"field": "amount", "type": "string", "optional": True},
                {"field": "updated_at", "type": "int64", "optional": True, "name": "io.debezium.time.Timestamp"},
            ],
        }
        for field_name in ("before", "after")
    ],
}


def orders_table(name: str, topic: str) -> dict[str, Any]:
    # This source sends every column of the old row with each update and delete.
    return {
        "name": name,
        "topic": topic,
        "primary_key": ["id"],
        "partition_by": ORDERS_PARTITIONING,
        "schema": ORDERS_SCHEMA,
        "before_image": "full",
    }


@dataclass
class SourceDatabase:
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)
    # PostgreSQL's REPLICA IDENTITY DEFAULT, as Debezium's JSON shows it: updates carry no
    # before-image; a delete's before-image has the key, and every other column as the converter
    # prints it anyway: null, or Debezium's fallback value for a NOT NULL column ("", 0), which
    # looks like a real partition value.
    key_only_before: bool = False

    @staticmethod
    def row(key: int, region: str, cents: int, day: int, second: int = 0) -> dict[str, Any]:
        return {
            "id": key,
            "region": region,
            "amount": f"{cents // 100}.{cents % 100:02d}",
            "updated_at": BASE_MICROS + day * MICROS_PER_DAY + second * 1_000_000,
        }

    def upsert(
        self,
        key: int,
        region: str,
        cents: int,
        day: int,
        *,
        snapshot_read: bool = False,
        omit_before: bool = False,
        wrapped: bool = False,
    ) -> tuple[bytes, bytes]:
        """Insert or update; returns the (key, value) of the Debezium record."""
        after = self.row(key, region, cents, day, second=key)
        before = self.rows.get(key)
        op = "r" if snapshot_read else ("u" if before is not None else "c")
        self.rows[key] = after
        # Debezium's snapshot reads carry no before-image.
        omit_before = omit_before or self.key_only_before or snapshot_read
        payload = {"op": op, "before": None if omit_before else before, "after": after, "source": {"lsn": 1}, "ts_ms": 0}
        if wrapped:

            def millis(row: dict[str, Any] | None) -> dict[str, Any] | None:
                return row and {**row, "updated_at": row["updated_at"] // 1000}

            return self._key(key), orjson.dumps(
                {"schema": _WRAPPER_SCHEMA, "payload": {**payload, "before": millis(payload["before"]), "after": millis(after)}}
            )
        return self._key(key), orjson.dumps(payload)

    def delete(self, key: int) -> tuple[bytes, bytes]:
        before = self.rows.pop(key)
        if self.key_only_before:
            before = {"id": key, "region": "", "amount": None, "updated_at": 0}
        return self._key(key), orjson.dumps({"op": "d", "before": before, "after": None, "source": {"lsn": 1}})

    @staticmethod
    def _key(key: int) -> bytes:
        return orjson.dumps({"id": key})

    def expected_rows(self) -> list[tuple[Any, ...]]:
        """As Spark returns them: (id, region, Decimal amount, naive UTC datetime)."""
        epoch = dt.datetime(1970, 1, 1)
        return sorted(
            (r["id"], r["region"], Decimal(r["amount"]), epoch + dt.timedelta(microseconds=r["updated_at"]))
            for r in self.rows.values()
        )


def table_rows(spark: Any, qualified_name: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in spark.table(qualified_name).select("id", "region", "amount", "updated_at").collect())


def kafka_records(
    topic: str, pairs: list[tuple[bytes | None, bytes | None]], first_offset: int = 0, partition: int = 0
) -> list[dict[str, Any]]:
    """Rows with the Spark Kafka source's schema."""
    now = dt.datetime.now(dt.timezone.utc)
    return [
        {
            "key": k,
            "value": v,
            "topic": topic,
            "partition": partition,
            "offset": first_offset + i,
            "timestamp": now,
            "timestampType": 0,
        }
        for i, (k, v) in enumerate(pairs)
    ]
