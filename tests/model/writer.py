"""The ingester's micro-batch on the table model: Debezium records parsed and reduced by the
product's own pure rules (``icecdc.ingest.debezium``, ``icecdc.ingest.batch``: the last change per
key in source order; equality deletes for the key in every partition an earlier version may live
in; a global delete when that partition is unknown; ``stages.everywhere``: every delete global
while data files of an older spec are live), committed as the writer commits a batch: one data
file per partition, one equality-delete file per partition and one global equality delete, all
in one commit at one sequence number, in the spec of the layout the ingester read."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import orjson

from icecdc.domain.layout import Column, PartitionTerm, TableLayout
from icecdc.domain.sourcespec import BeforeImage, SourceRules
from icecdc.domain.tablespec import parse_partition_field
from icecdc.ingest.batch import KeyChange, reduce_key, to_key_change
from icecdc.ingest.debezium import ChangeEvent, parse_change
from icecdc.ingest.filemeta import FileKind
from icecdc.ingest.reduce import GLOBAL_PARTITION
from icecdc.ingest.stages import everywhere
from tests.cdc import ORDERS_SCHEMA
from tests.model.iceberg import PARTITIONED_SPEC_ID, Key, Partition, Row, Snapshot, Table

# A source that sends every column of the old row (tests.cdc.orders_table), and one that sends
# the key alone (PostgreSQL's REPLICA IDENTITY DEFAULT): its updates and deletes delete globally.
FULL_BEFORE_IMAGES = SourceRules(BeforeImage.FULL)
KEY_ONLY_BEFORE_IMAGES = SourceRules(BeforeImage.KEY)


def orders_layout(partition_by: Sequence[str], format_version: int = 2, spec_id: int = PARTITIONED_SPEC_ID) -> TableLayout:
    """The test orders table (tests.cdc.ORDERS_SCHEMA) as the ingester sees it, partitioned by
    its spec ``spec_id``."""
    columns = tuple(Column(name, kind, name == "id") for name, kind in ORDERS_SCHEMA.items())
    types = dict(ORDERS_SCHEMA)
    fields = [parse_partition_field(text, types) for text in partition_by]
    partition = tuple(
        PartitionTerm(f"{f.source}_{f.transform}", f.source, f.iceberg_transform, types[f.source], 1000 + i)
        for i, f in enumerate(fields)
    )
    field_ids = {c.name: i for i, c in enumerate(columns, start=1)}
    return TableLayout(
        "db.orders", "orders", columns, field_ids, ("id",), partition, spec_id, "/model", format_version=format_version
    )


def started(table: Table, layout: TableLayout) -> TableLayout:
    """The layout as the ingester reads it when it starts: the table's, and whether the current
    snapshot holds data files of a spec other than its current one (``catalog.older_spec_data_live``)."""
    return dataclasses.replace(layout, older_spec_data=table.current.holds_data_of_other_specs(layout.spec_id))


def commit_batch(table: Table, layout: TableLayout, rules: SourceRules, records: Sequence[tuple[bytes, bytes]]) -> Snapshot:
    """Parse, reduce and commit one micro-batch of (key, value) records, in source order."""
    by_key: dict[Key, list[KeyChange]] = {}
    for key, value in records:
        event = parse_change(key, value, layout.columns, layout.primary_key)
        assert isinstance(event, ChangeEvent), event
        by_key.setdefault(event.key, []).append(to_key_change(event, layout, rules))
    # The batch's files as the write stage groups them: by (partition, as orjson writes it; kind).
    pieces: dict[tuple[str, FileKind], list[Any]] = defaultdict(list)
    for key, changes in by_key.items():
        result = reduce_key(changes)
        if result.row is not None:
            partition = layout.partition_of(result.row)
            assert partition is not None, result.row
            pieces[orjson.dumps(partition).decode(), FileKind.DATA].append(result.row)
        if result.global_delete:
            pieces[GLOBAL_PARTITION, FileKind.GLOBAL_DELETE].append(key)
        for partition in result.delete_partitions:
            pieces[orjson.dumps(partition).decode(), FileKind.DELETE].append(key)
    if layout.older_spec_data:
        pieces = everywhere(pieces)
    data: dict[Partition, list[Row]] = {}
    deletes: dict[Partition, set[Key]] = {}
    global_keys: set[Key] = set()
    for (text, kind), items in pieces.items():
        partition = tuple(orjson.loads(text))
        if kind is FileKind.DATA:
            data[partition] = items
        elif kind is FileKind.DELETE:
            deletes[partition] = set(items)
        else:
            global_keys.update(items)
    return table.append(data, deletes, global_keys, layout.spec_id)
