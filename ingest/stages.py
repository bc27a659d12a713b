"""The two executor-side stages of a micro-batch, as ``mapInArrow`` functions over Arrow record
batches: parse Kafka records; then, after one shuffle by (table, key), reduce each key to what the
batch commits and write one Parquet file per (table, partition, kind) of the task's share. Only
offset marks, rejected records and the facts of written files ever reach the driver, all in the
one result of one Spark job (marks and rejects pass through the write stage untouched).

One shuffle, not two: grouping by partition as well would give one file per partition per batch
instead of one per partition per write task, at the price of a second shuffle that costs more
than it saves; the writer sizes the number of write tasks so that small batches use one.

Rows travel between stages with JSON payloads (orjson), so one plan serves tables of any schema.
"""

from __future__ import annotations

import enum
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import groupby
from operator import itemgetter
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from icecdc.domain.layout import PartitionKey, TableLayout
from icecdc.domain.sourcespec import SourceRules, TruncateMode, UnavailableValues
from icecdc.ingest.batch import Image, KeyChange, KeyResult, SourceOffset, reduce_key, reduce_plain, to_key_change
from icecdc.ingest.debezium import (
    NEW_KEY_HEADER,
    OLD_KEY_HEADER,
    ChangeEvent,
    Control,
    ControlKind,
    Reason,
    RejectedEvent,
    decode_change,
    key_from_header,
    read_envelope,
    source_lsn,
    unavailable_columns,
)
from icecdc.ingest.evolution import ChangeKind, ColumnChange, compare, inferred_changes
from icecdc.ingest.fastparse import FastParser, change_payload, key_text
from icecdc.ingest.filemeta import FileKind, describe
from icecdc.ingest.plan import erased_by_truncate
from icecdc.ingest.prefixes import CUT_PREFIX
from icecdc.ingest.unavailable import unavailable_detail
from icecdc.runtime.fileio import write_parquet_with_footer

_DDL_TYPES = {pa.string(): "string", pa.binary(): "binary", pa.int32(): "int", pa.int64(): "long"}


def _ddl(schema: pa.Schema) -> str:
    """The Spark DDL of an Arrow schema, so each stage's row shape is declared once."""
    return ", ".join(f"{f.name} {_DDL_TYPES[f.type]}" for f in schema)


# What Spark's Kafka source yields (the foreachBatch writer's input contract); with
# ``includeHeaders`` (read when a table resolves unavailable values: the key-change headers) a
# ``headers`` column follows.
KAFKA_SCHEMA = "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, timestampType int"
HEADERS_FIELD = "headers array<struct<key:string,value:binary>>"
KAFKA_SCHEMA_WITH_HEADERS = f"{KAFKA_SCHEMA}, {HEADERS_FIELD}"
PARSED = pa.schema(
    [
        ("table", pa.string()),
        ("topic", pa.string()),
        ("kafka_partition", pa.int32()),
        ("offset", pa.int64()),
        ("lsn", pa.int64()),  # a truncate's (the redo after it drops the table's changes below it)
        ("records", pa.int64()),
        ("key", pa.string()),
        ("op", pa.string()),
        ("change", pa.binary()),
        ("reason", pa.string()),
        ("detail", pa.string()),
        ("raw_key", pa.binary()),
        ("raw_value", pa.binary()),
    ]
)
# The write stage's output: the parse stage's marks and rejects as they came, and one row per
# written file (op = data or delete, with its path, partition, record count and size).
RESULT = pa.schema(
    [
        *PARSED,
        ("path", pa.string()),
        ("partition", pa.string()),
        ("record_count", pa.int64()),
        ("file_size", pa.int64()),
        ("description", pa.string()),
    ]
)
PARSED_SCHEMA, RESULT_SCHEMA = _ddl(PARSED), _ddl(RESULT)

GLOBAL_PARTITION = "[]"  # a global delete file has no partition


class Tag(str, enum.Enum):
    """The ``op`` of a parsed row that is not a change (a change's ``op`` is its Debezium op, a
    written file's its ``FileKind``); all but SKIP pass through the write stage to the driver."""

    # Per (table, topic, partition) and input batch, the highest offset read and how many records.
    MARK = "mark"
    # A tombstone: advances offsets and nothing else (never leaves the write stage).
    SKIP = "skip"
    # Per (table, parse task): the column changes the records' schemas ask for.
    SCHEMA = "schema"
    # Per (table, parse task): the source fields the table lacks and will not get (counted).
    COLUMNS = "columns"
    # Per (table, parse task): the records that are not row changes (counted by kind).
    CONTROL = "control"
    # One per truncate record: its table, topic, partition, offset and LSN.
    TRUNCATE = "truncate"
    # From the write stage: a key's row with values the batch does not hold (``change``: the
    # row, its unresolved columns, the key whose earlier version holds them, where that version
    # may live), with its last record (for a dead letter); the driver resolves it.
    UNRESOLVED = "unresolved"
    # From the write stage: a key's last image before a primary-key change moved it (``change``:
    # the new key, the image).
    MOVED = "moved"
    # Per (topic, parse task) that took whole wrapped records: the wrapper prefix the last one
    # carried (``raw_value``), to be cut from the topic's next records (``prefixes``).
    PREFIX = "prefix"


PASSED_THROUGH = frozenset({Tag.MARK, Tag.SCHEMA, Tag.COLUMNS, Tag.CONTROL, Tag.TRUNCATE, Tag.PREFIX})

ArrowStage = Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]
# The order the write stage reads the parsed rows in: each key's changes together, in source order.
GROUP_ORDER = ("table", "key", "kafka_partition", "offset")


class _TableTally:
    """What one parse task saw of one table besides its changes."""

    def __init__(self) -> None:
        self.changes: set[ColumnChange] = set()
        self.unknown: Counter[str] = Counter()
        self.controls: Counter[str] = Counter()


Headers = Callable[[str], "bytes | None"]  # a record's header by name


def _no_headers(_name: str) -> bytes | None:
    return None


def _parse_record(
    record: dict[str, Any],
    layout: TableLayout,
    rules: SourceRules,
    tally: _TableTally,
    truncate_lsn: int | None,
    headers: Headers = _no_headers,
) -> dict[str, Any]:
    """The parsed row of one record of a mapped topic (a change, a skip, a truncate). Raises
    RejectedEvent. A record whose schema asks for column changes is not decoded: the batch is
    done again once the table has them (``writer``). In the redo after a truncate at
    ``truncate_lsn``, a change below it is skipped, once parsed (a bad one is still rejected)."""
    if record["value"] is None:
        return {"op": Tag.SKIP}
    envelope = read_envelope(record["value"])
    if isinstance(envelope, Control):
        if envelope.kind is not ControlKind.TRUNCATE:
            tally.controls[envelope.kind.value] += 1
            return {"op": Tag.SKIP}
        if rules.truncate is TruncateMode.DEAD_LETTER:
            raise RejectedEvent(Reason.TRUNCATE, "a truncate of the table, dead-lettered (the table's truncate option)")
        return {"op": Tag.TRUNCATE, "lsn": envelope.lsn}
    if envelope.fields:
        source = compare(layout.columns, envelope.fields)
        if source.incompatible:
            raise RejectedEvent(Reason.INCOMPATIBLE_SCHEMA, "; ".join(source.incompatible))
        tally.unknown.update(source.unknown)
        if source.changes and rules.evolve_schema:
            tally.changes.update(source.changes)
            return {"op": Tag.SKIP}
        tally.unknown.update(c.column for c in source.changes if c.kind is ChangeKind.ADD)
    event = decode_change(record["key"], envelope, layout.columns, layout.primary_key)
    if event.extra:
        inferred = inferred_changes(layout.columns, event.extra) if rules.evolve_schema and rules.infer_new_columns else ()
        if inferred:
            tally.changes.update(inferred)
            return {"op": Tag.SKIP}
        tally.unknown.update(list(event.extra))  # counted by name (a mapping would add its values)
    change = to_key_change(event, layout, rules)
    if truncate_lsn is not None and erased_by_truncate(source_lsn(envelope.payload), truncate_lsn):
        return {"op": Tag.SKIP}
    payload = change_payload(change)
    parsed: dict[str, Any] = {"op": event.op, "key": key_text(event.key)}
    if rules.unavailable_values is not UnavailableValues.KEEP_PLACEHOLDER:
        parsed.update(_unavailable_fields(record, event, layout, rules, headers, payload))
    parsed["change"] = orjson.dumps(payload)
    return parsed


def _unavailable_fields(
    record: dict[str, Any], event: ChangeEvent, layout: TableLayout, rules: SourceRules, headers: Headers, payload: dict[str, Any]
) -> dict[str, Any]:
    """The change's unavailable columns and key-change headers, into ``payload``; the record's
    bytes, for the dead letter it may become. Raises RejectedEvent (``unavailable_values:
    dead-letter``)."""
    if event.after is None:
        if rules.unavailable_values is UnavailableValues.RESOLVE:
            moved_to = key_from_header(headers(NEW_KEY_HEADER), layout.columns, layout.primary_key)
            if moved_to is not None:
                payload["to"] = moved_to
        return {}
    unavailable = unavailable_columns(event.after, layout.columns)
    if not unavailable:
        return {}
    if rules.unavailable_values is UnavailableValues.DEAD_LETTER:
        raise RejectedEvent(
            Reason.UNAVAILABLE_VALUE, unavailable_detail(event.key, unavailable, "unavailable_values is dead-letter")
        )
    payload["unavailable"] = sorted(unavailable)
    if event.op in ("c", "r"):
        moved_from = key_from_header(headers(OLD_KEY_HEADER), layout.columns, layout.primary_key)
        if moved_from is not None:
            payload["from"] = moved_from
    return {"raw_key": record["key"], "raw_value": record["value"]}


def _tally_rows(table: str, tally: _TableTally) -> list[dict[str, Any]]:
    rows = []
    if tally.changes:
        changes = [[c.kind.value, c.column, c.iceberg_type] for c in sorted(tally.changes)]
        rows.append({"table": table, "op": Tag.SCHEMA, "detail": orjson.dumps(changes).decode()})
    if tally.unknown:
        rows.append({"table": table, "op": Tag.COLUMNS, "detail": orjson.dumps(dict(tally.unknown)).decode()})
    if tally.controls:
        rows.append({"table": table, "op": Tag.CONTROL, "detail": orjson.dumps(dict(tally.controls)).decode()})
    return rows


def _header_reader(column: pa.Array, index: int) -> Headers:
    """One record's headers, read from the Arrow column only when asked for (few records are)."""

    def header(name: str) -> bytes | None:
        for pair in column[index].as_py() or ():
            if pair["key"] == name:
                return bytes(pair["value"]) if pair["value"] is not None else None
        return None

    return header


def _carrying(headers: pa.Array, name: str) -> list[bool]:
    """Per record, whether it carries the header ``name`` (read in Arrow: every record of the real
    connector carries headers, few this one)."""
    pairs = pc.list_flatten(headers)
    found = pc.equal(pc.struct_field(pairs, "key"), name)
    carrying = set(pc.filter(pc.list_parent_indices(headers), pc.fill_null(found, False)).to_pylist())
    return [index in carrying for index in range(len(headers))]


def _fast_rows(
    parsers: Mapping[str, FastParser],
    kept: list[int],
    batch: pa.RecordBatch,
    moved: list[bool] | None,
    tallies: Mapping[str, _TableTally],
    cut: list[int | None] | None,
    prefixes: Sequence[bytes],
) -> tuple[set[int], list[pa.RecordBatch]]:
    """The records the fast path takes (their indices in ``batch``) and their parsed rows (one
    call per topic and prefix cut: ``cut``, per record, the id in ``prefixes`` of the prefix cut
    from its value)."""
    topics, values = batch.column("topic").to_pylist(), batch.column("value").to_pylist()
    by_topic: dict[tuple[str, int | None], list[int]] = defaultdict(list)
    for index in kept:
        if topics[index] in parsers:
            by_topic[topics[index], cut[index] if cut is not None else None].append(index)
    taken: set[int] = set()
    rows: list[pa.RecordBatch] = []
    for (topic, prefix), indices in by_topic.items():
        parser = parsers[topic]
        result = parser.parse(
            [values[i] for i in indices],
            [moved[i] for i in indices] if moved is not None else None,
            prefixes[prefix] if prefix is not None else None,
        )
        tallies[parser.table].unknown.update(result.unknown)
        if not result.taken.num_rows:
            continue
        at = pc.take(pa.array(indices, pa.int64()), result.taken.column("index").combine_chunks())
        taken.update(at.to_pylist())
        columns = {
            "table": pa.array([parser.table] * len(at), pa.string()),
            "topic": pc.take(batch.column("topic"), at),
            "kafka_partition": pc.take(batch.column("partition"), at),
            "offset": pc.take(batch.column("offset"), at),
            **{name: result.taken.column(name).combine_chunks() for name in ("op", "key", "change")},
        }
        n = len(at)
        arrays = [columns[f.name].cast(f.type) if f.name in columns else pa.nulls(n, f.type) for f in PARSED]
        rows.append(pa.RecordBatch.from_arrays(arrays, schema=PARSED))
    return taken, rows


def parse_stage(
    layouts_by_topic: Mapping[str, TableLayout],
    committed: Mapping[tuple[str, int], int],
    rules_by_table: Mapping[str, SourceRules],
    truncate_lsns: Mapping[str, int],
    fast: bool = True,
    prefixes: Sequence[bytes] = (),
) -> ArrowStage:
    """Kafka records -> one parsed row each, plus offset marks and what else the task saw. Records
    below the table's committed offset (a replayed batch, or the replayed part of one) are dropped
    here: that is the exactly-once filter. ``truncate_lsns``: table -> the LSN of the truncate a
    redo applies, below which its changes are skipped. The records the fast path takes
    (``fastparse``) are parsed there, the others here, one by one; ``fast=False`` parses every
    record here (the property tests and ``bench parse`` compare the two). ``prefixes``: the
    wrapper prefixes cut from the values, by the id a record's ``CUT_PREFIX`` names (``ingest.prefixes``)."""
    known = list(prefixes)

    def parse(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        tallies: dict[str, _TableTally] = defaultdict(_TableTally)
        parsers = {
            topic: FastParser(layout, rules_by_table[layout.table])
            for topic, layout in layouts_by_topic.items()
            if fast and layout.table not in truncate_lsns  # a redo after a truncate reads its records' LSNs
        }
        for batch in batches:
            out: list[dict[str, Any]] = []
            marks: dict[tuple[str, int], list[int]] = {}
            header_column = batch.column("headers") if "headers" in batch.schema.names else None
            topics, partitions, offsets = (batch.column(name).to_pylist() for name in ("topic", "partition", "offset"))
            kept = []
            for index, (topic, partition, offset) in enumerate(zip(topics, partitions, offsets, strict=True)):
                if offset < committed.get((topic, partition), 0):
                    continue
                mark = marks.setdefault((topic, partition), [offset, 0])
                mark[0], mark[1] = max(mark[0], offset), mark[1] + 1
                kept.append(index)
            moved = _carrying(header_column, NEW_KEY_HEADER) if header_column is not None else None
            cut = batch.column(CUT_PREFIX).to_pylist() if CUT_PREFIX in batch.schema.names else None
            taken, fast_rows = _fast_rows(parsers, kept, batch, moved, tallies, cut, known)
            yield from fast_rows
            keys, values = batch.column("key"), batch.column("value")
            for index in kept:
                if index in taken:
                    continue
                topic = topics[index]
                row: dict[str, Any] = {"topic": topic, "kafka_partition": partitions[index], "offset": offsets[index]}
                layout = layouts_by_topic.get(topic)
                value, prefix = values[index].as_py(), cut[index] if cut is not None else None
                record = {"key": keys[index].as_py(), "value": known[prefix] + value if prefix is not None else value}
                try:
                    if layout is None:
                        raise RejectedEvent(
                            Reason.UNKNOWN_TABLE, f"topic {topic!r} is not mapped to a table in the configuration"
                        )
                    row["table"] = table = layout.table
                    headers = _header_reader(header_column, index) if header_column is not None else _no_headers
                    row.update(
                        _parse_record(record, layout, rules_by_table[table], tallies[table], truncate_lsns.get(table), headers)
                    )
                except RejectedEvent as rejected:
                    row.update(
                        reason=rejected.rejection.reason,
                        detail=rejected.rejection.detail,
                        raw_key=record["key"],
                        raw_value=record["value"],
                    )
                out.append(row)
            for (topic, partition), (last, count) in marks.items():
                layout = layouts_by_topic.get(topic)
                out.append(
                    {
                        "table": layout.table if layout else None,
                        "topic": topic,
                        "kafka_partition": partition,
                        "offset": last,
                        "records": count,
                        "op": Tag.MARK,
                    }
                )
            yield pa.RecordBatch.from_pylist(out, schema=PARSED)
        tallied = [row for table, tally in tallies.items() for row in _tally_rows(table, tally)]
        for topic, parser in parsers.items():
            if parser.learned is not None:  # whole wrapped records: none once their prefix is cut
                tallied.append({"table": parser.table, "topic": topic, "op": Tag.PREFIX, "raw_value": parser.learned})
        if tallied:
            yield pa.RecordBatch.from_pylist(tallied, schema=PARSED)

    return parse


def reduce_and_write_stage(
    layouts_by_table: Mapping[str, TableLayout], io_properties: Mapping[str, str], batch_tag: str
) -> ArrowStage:
    """Rows grouped by (table, key) in source order -> per key, the surviving after-image (data)
    and a key row per partition where an earlier version may live (equality deletes); then one
    Parquet file per (table, partition, kind) of this task, with Iceberg field ids. File names
    are unique per attempt, so a retried or replayed batch never overwrites a file a committed
    snapshot references; files of attempts that never commit are orphans."""

    def reduce_and_write(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        outputs: dict[tuple[str, str, FileKind], list[dict[str, Any]]] = {}
        passed: list[dict[str, Any]] = []

        def changes() -> Iterator[tuple[str, str, str, bytes, pa.RecordBatch, int]]:
            # Column by column: a whole row is read only for the few that pass through.
            for batch in batches:
                columns = (batch.column(name).to_pylist() for name in ("table", "key", "op", "reason", "change"))
                for index, (table, key, op, reason, change) in enumerate(zip(*columns, strict=True)):
                    if op in PASSED_THROUGH or reason is not None:
                        passed.append(_row(batch, index))
                    elif op != Tag.SKIP:
                        yield table, key, op, change, batch, index

        for (table, key), group in groupby(changes(), key=itemgetter(0, 1)):
            layout = layouts_by_table[table]
            records = [(op, orjson.loads(payload), batch, index) for _, _, op, payload, batch, index in group]
            key_values = tuple(orjson.loads(key))
            last = records[-1]
            if any("unavailable" in change or "to" in change for _, change, _, _ in records):
                result = reduce_key([_key_change(op, change, _source_offset(b, i)) for op, change, b, i in records], key_values)
            else:  # the common case, without a KeyChange per change
                partitions = (tuple(p) for _, change, _, _ in records for p in change["prior"])
                result = reduce_plain(last[0], last[1]["after"], partitions, any(c["global"] for _, c, _, _ in records))
            if result.unresolved:
                assert last is not None and result.row is not None
                passed.append(_unresolved_row(_row(last[2], last[3]), result))
            elif result.row is not None:
                partition = orjson.dumps(layout.partition_of(result.row)).decode()
                outputs.setdefault((table, partition, FileKind.DATA), []).append(result.row)
            for moved in result.moved:
                row = {"row": None} if moved.image is None else _image_payload(moved.image.row, moved.image)
                image = {"to": moved.to, "at": moved.at, **row}
                passed.append({"table": table, "op": Tag.MOVED, "key": key, "change": orjson.dumps(image)})
            key_row = dict(zip(layout.primary_key, key_values, strict=True))
            if result.global_delete:
                outputs.setdefault((table, GLOBAL_PARTITION, FileKind.GLOBAL_DELETE), []).append(key_row)
            for p in result.delete_partitions:
                outputs.setdefault((table, orjson.dumps(p).decode(), FileKind.DELETE), []).append(key_row)

        facts = [
            write_file(layouts_by_table[table], kind, tuple(orjson.loads(partition)), records, io_properties, batch_tag)
            for (table, partition, kind), records in outputs.items()
        ]
        if facts or passed:
            yield pa.RecordBatch.from_pylist(passed + facts, schema=RESULT)

    return reduce_and_write


def _row(batch: pa.RecordBatch, index: int) -> dict[str, Any]:
    return batch.slice(index, 1).to_pylist()[0]


def _key(values: list[Any] | None) -> tuple[Any, ...] | None:
    return tuple(values) if values is not None else None


def _source_offset(batch: pa.RecordBatch, index: int) -> SourceOffset:
    return batch.column("kafka_partition")[index].as_py(), batch.column("offset")[index].as_py()


def _key_change(op: str, change: dict[str, Any], at: SourceOffset) -> KeyChange:
    """A change as the parse stage sent it (``fastparse.change_payload``, and ``_unavailable_fields``)."""
    return KeyChange(
        op,
        change["after"],
        tuple(tuple(p) for p in change["prior"]),
        change["global"],
        frozenset(change.get("unavailable", ())),
        _key(change.get("from")),
        _key(change.get("to")),
        at,
    )


def _image_payload(row: dict[str, Any] | None, image: Image | KeyResult) -> dict[str, Any]:
    """What the driver needs to complete ``row`` (``job._image`` reads it back)."""
    return {"row": row, "unresolved": sorted(image.unresolved), "source": image.source, "moved_at": image.moved_at}


def _unresolved_row(last: dict[str, Any], result: KeyResult) -> dict[str, Any]:
    """A key's row the batch cannot complete, to the driver with its last record (``Tag.UNRESOLVED``)."""
    change = _image_payload(result.row, result) | {"prior": list(result.delete_partitions), "global": result.global_delete}
    kept = ("table", "topic", "kafka_partition", "offset", "key", "raw_key", "raw_value")
    return {**{name: last[name] for name in kept}, "op": Tag.UNRESOLVED, "change": orjson.dumps(change)}


def write_file(
    layout: TableLayout,
    kind: FileKind,
    partition: PartitionKey,
    records: list[dict[str, Any]],
    io_properties: Mapping[str, str],
    batch_tag: str,
) -> dict[str, Any]:
    """One Parquet file of rows (data) or keys (deletes) of one partition, with Iceberg field ids,
    under a name unique per attempt; its facts as a result row."""
    arrow = layout.to_arrow(records, key_only=kind != FileKind.DATA)
    partition_path = "" if kind == FileKind.GLOBAL_DELETE else layout.partition_path(partition)
    name = f"{batch_tag}-{uuid.uuid4().hex}-{kind.value}.parquet"
    path = "/".join(p for p in (layout.data_location, partition_path, name) if p)
    size, footer = write_parquet_with_footer(arrow, path, io_properties)
    return {
        "table": layout.table,
        "op": kind,
        "path": path,
        "partition": orjson.dumps(partition).decode(),
        "record_count": arrow.num_rows,
        "file_size": size,
        "description": describe(layout, kind, path, partition, size, footer),
    }
