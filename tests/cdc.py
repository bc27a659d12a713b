"""An independent model of an upstream database for the ingest tests: applying operations to it
yields the Debezium events a connector would emit, and ``expected_rows`` is the state the target
table must end in. It shares no code with the ingester."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import hypothesis.strategies as st
import orjson

ORDERS_SCHEMA = {"id": "long", "region": "string", "amount": "decimal(10, 2)", "updated_at": "timestamp"}
ORDERS_PARTITIONING = ["region", "days(updated_at)"]
REGIONS = ("eu", "us", "apac")
# One change of a random history: (key, region or None for a delete, day, amount in cents).
Change = tuple[int, "str | None", int, int]
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

    def apply(self, changes: Iterable[Change]) -> list[tuple[bytes, bytes]]:
        """The records of one micro-batch of changes; a delete of a key that does not exist is
        no change."""
        pairs = []
        for key, region, day, cents in changes:
            if region is not None:
                pairs.append(self.upsert(key, region, cents, day))
            elif key in self.rows:
                pairs.append(self.delete(key))
        return pairs

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

    def expected_images(self) -> list[tuple[Any, ...]]:
        """As the ingester decodes them: (id, region, decimal string, epoch microseconds)."""
        return sorted(image(r) for r in self.rows.values())


def image(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return (row["id"], row["region"], row["amount"], row["updated_at"])


def changes(keys: int, regions: tuple[str, ...] = REGIONS, days: int = 1, max_size: int = 20) -> st.SearchStrategy[list[Change]]:
    """Micro-batches of random changes to ``keys`` keys: inserts, updates that may move a row to
    another region and day, deletes."""
    # A delete as likely as an upsert to any one region.
    change = st.tuples(st.integers(1, keys), st.sampled_from((None, *regions)), st.integers(0, days - 1), st.integers(0, 9_999))
    return st.lists(change, min_size=1, max_size=max_size)


# One step of a random history as a source sends it: (key, region or None for a delete, amount in
# cents, day, flavour of the record, end the micro-batch after it).
flavoured_history = st.lists(
    st.tuples(
        st.integers(1, 6),
        st.one_of(st.none(), st.sampled_from(REGIONS)),
        st.integers(0, 99_999),
        st.integers(0, 3),
        st.sampled_from(["plain", "plain", "snapshot", "no-before", "wrapped"]),
        st.booleans(),
    ),
    min_size=1,
    max_size=40,
)


def flavoured_batches(
    source: SourceDatabase, history: Iterable[tuple[int, str | None, int, int, str, bool]]
) -> Iterator[list[tuple[bytes, bytes]]]:
    """The micro-batches of records a ``flavoured_history`` makes, each applied to ``source``
    by the time it is yielded."""
    batch: list[tuple[bytes, bytes]] = []
    for key, region, cents, day, flavour, cut in history:
        if region is None:
            if key in source.rows:
                batch.append(source.delete(key))
        else:
            existing = source.rows.get(key)
            stays = existing is None or (
                existing["region"] == region
                and source.row(key, region, cents, day, key)["updated_at"] // MICROS_PER_DAY
                == existing["updated_at"] // MICROS_PER_DAY
            )
            # An update without a before-image gets a global delete (unknown_partition's default);
            # a re-snapshot read is taken not to have moved (docs/ingest.md), so the history only
            # sends those where that holds.
            omit = flavour == "no-before" and existing is not None
            snapshot_read = flavour == "snapshot" and stays
            batch.append(
                source.upsert(
                    key, region, cents, day, snapshot_read=snapshot_read, omit_before=omit, wrapped=flavour == "wrapped"
                )
            )
        if cut and batch:
            yield batch
            batch = []
    if batch:
        yield batch


def table_rows(spark: Any, qualified_name: str) -> list[tuple[Any, ...]]:
    # The Spark catalog caches a loaded table (Iceberg's CachingCatalog, entries expire 30 s after
    # their last use) and does not refresh it for a read. Once an entry expired, the next load (a
    # read, or the sidecar's) holds a new instance that the writer's commits through its own do
    # not update: on a loaded machine a read just after a batch then saw the table before it. So
    # the cached instance is refreshed in place (``REFRESH TABLE`` would drop it from the cache
    # instead, and part the table adapters' instance from the one Spark reads).
    catalog, identifier = qualified_name.split(".", 1)
    plugin = spark._jsparkSession.sessionState().catalogManager().catalog(catalog)
    plugin.icebergCatalog().loadTable(spark._jvm.org.apache.iceberg.catalog.TableIdentifier.parse(identifier)).refresh()
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
