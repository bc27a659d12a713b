"""The ingester's micro-batch on the table model: Debezium records parsed and reduced by the
product's own pure rules (``icecdc.ingest.debezium``, ``icecdc.ingest.batch``: the last change per
key in source order; equality deletes for the key in every partition an earlier version may live
in; a global delete when that partition is unknown), committed as the writer commits a batch: one
data file per partition, one equality-delete file per partition and one global equality delete,
all in one commit at one sequence number."""

from __future__ import annotations

from collections.abc import Sequence

from icecdc.domain.layout import Column, PartitionTerm, TableLayout
from icecdc.domain.sourcespec import BeforeImage, SourceRules
from icecdc.domain.tablespec import parse_partition_field
from icecdc.ingest.batch import KeyChange, reduce_key, to_key_change
from icecdc.ingest.debezium import ChangeEvent, parse_change
from tests.cdc import ORDERS_SCHEMA
from tests.model.iceberg import Key, Partition, Row, Snapshot, Table

# A source that sends every column of the old row (tests.cdc.orders_table), and one that sends
# the key alone (PostgreSQL's REPLICA IDENTITY DEFAULT): its updates and deletes delete globally.
FULL_BEFORE_IMAGES = SourceRules(BeforeImage.FULL)
KEY_ONLY_BEFORE_IMAGES = SourceRules(BeforeImage.KEY)


def orders_layout(partition_by: Sequence[str], format_version: int = 2) -> TableLayout:
    """The test orders table (tests.cdc.ORDERS_SCHEMA) as the ingester sees it."""
    columns = tuple(Column(name, kind, name == "id") for name, kind in ORDERS_SCHEMA.items())
    types = dict(ORDERS_SCHEMA)
    fields = [parse_partition_field(text, types) for text in partition_by]
    partition = tuple(
        PartitionTerm(f"{f.source}_{f.transform}", f.source, f.iceberg_transform, types[f.source], 1000 + i)
        for i, f in enumerate(fields)
    )
    field_ids = {c.name: i for i, c in enumerate(columns, start=1)}
    return TableLayout("db.orders", "orders", columns, field_ids, ("id",), partition, 0, "/model", format_version=format_version)


def commit_batch(table: Table, layout: TableLayout, rules: SourceRules, records: Sequence[tuple[bytes, bytes]]) -> Snapshot:
    """Parse, reduce and commit one micro-batch of (key, value) records, in source order."""
    by_key: dict[Key, list[KeyChange]] = {}
    for key, value in records:
        event = parse_change(key, value, layout.columns, layout.primary_key)
        assert isinstance(event, ChangeEvent), event
        by_key.setdefault(event.key, []).append(to_key_change(event, layout, rules))
    data: dict[Partition, list[Row]] = {}
    deletes: dict[Partition, set[Key]] = {}
    global_keys: set[Key] = set()
    for key, changes in by_key.items():
        result = reduce_key(changes)
        if result.row is not None:
            partition = layout.partition_of(result.row)
            assert partition is not None, result.row
            data.setdefault(partition, []).append(result.row)
        if result.global_delete:
            global_keys.add(key)
        for partition in result.delete_partitions:
            deletes.setdefault(partition, set()).add(key)
    return table.append(data, deletes, global_keys)
