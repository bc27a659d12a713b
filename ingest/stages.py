"""The two executor-side stages of a micro-batch, as ``mapInArrow`` functions over Arrow record
batches: parse Kafka records; then, after one shuffle by (table, key), reduce each key to what the
batch commits and write its files (``batch_files``). Only offset marks, rejected records and the
facts of written files reach the driver, in the one result of one Spark job. The stages commit
nothing; the rows they pass on are declared in ``stage_rows``.

One shuffle, not two: grouping by partition as well would give one file per partition per batch
instead of one per partition per write task, and the second shuffle costs more than it saves (a
small batch has one write task anyway). Rows travel with JSON payloads (orjson), so one plan
serves tables of any schema.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import groupby
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from icecdc.domain.layout import TableLayout
from icecdc.domain.sourcespec import SourceRules, TruncateMode, UnavailableValues
from icecdc.ingest.batch import Image, KeyChange, KeyResult, reduce_key, to_key_change
from icecdc.ingest.batch_decisions import erased_by_truncate
from icecdc.ingest.batch_files import write_file
from icecdc.ingest.debezium import (
    NEW_KEY_HEADER,
    OLD_KEY_HEADER,
    ChangeEvent,
    Control,
    ControlKind,
    Reason,
    RejectedEvent,
    append_only_rejection,
    decode_change,
    key_from_header,
    read_envelope,
    source_lsn,
    unavailable_columns,
)
from icecdc.ingest.evolution import ChangeKind, ColumnChange, compare, inferred_changes
from icecdc.ingest.fastparse import FAST_COLUMNS, FastParser, change_columns, key_text
from icecdc.ingest.filemeta import FileKind
from icecdc.ingest.prefixes import CUT_PREFIX
from icecdc.ingest.reduce import GLOBAL_PARTITION, append_rows, plain_rows, reduce_plain_keys
from icecdc.ingest.stage_rows import PARSED, PASSED_THROUGH, RESULT, ArrowStage, Tag
from icecdc.ingest.unavailable import unavailable_detail


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
        if layout.append_only:
            raise append_only_rejection(layout.table, "a tombstone")  # it follows a delete the table cannot apply
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
    parsed: dict[str, Any] = {"op": event.op, "key": key_text(layout.primary_key, event.key), **change_columns(layout, change)}
    # A create carries every value of its row: only an update leaves a value unsent.
    if rules.unavailable_values is not UnavailableValues.KEEP_PLACEHOLDER and not layout.append_only:
        extra: dict[str, Any] = {}
        parsed.update(_unavailable_fields(record, event, layout, rules, headers, extra))
        if extra:
            parsed["change"] = orjson.dumps(extra)
    return parsed


def _unavailable_fields(
    record: dict[str, Any], event: ChangeEvent, layout: TableLayout, rules: SourceRules, headers: Headers, payload: dict[str, Any]
) -> dict[str, Any]:
    """The change's unavailable columns and key-change headers, into ``payload`` (the change
    column's); the record's bytes, for the dead letter it may become. Raises RejectedEvent
    (``unavailable_values: dead-letter``)."""
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


def _header_reader(column: pa.Array | None, index: int) -> Headers:
    """One record's headers, read from the Arrow column only when asked for (few records are)."""
    if column is None:
        return _no_headers

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
    kept: np.ndarray,
    batch: pa.RecordBatch,
    moved: list[bool] | None,
    tallies: Mapping[str, _TableTally],
    prefixes: Sequence[bytes],
) -> tuple[np.ndarray, list[pa.RecordBatch]]:
    """Per record of ``batch``, whether the fast path took it, and their parsed rows (one call per
    topic and prefix cut: the column ``CUT_PREFIX``, when there, is the id in ``prefixes`` of the
    prefix cut from a record's value). ``kept``: per record, whether it is parsed at all."""
    taken = np.zeros(batch.num_rows, dtype=bool)
    rows: list[pa.RecordBatch] = []
    cut = batch.column(CUT_PREFIX) if CUT_PREFIX in batch.schema.names else pa.nulls(batch.num_rows, pa.int32())
    ours = pc.and_(pa.array(kept), pc.is_in(batch.column("topic"), pa.array(list(parsers), pa.string())))
    pairs = pa.table({"topic": batch.column("topic"), "cut": cut}).filter(ours).group_by(["topic", "cut"]).aggregate([])
    for topic, prefix in zip(pairs.column("topic").to_pylist(), pairs.column("cut").to_pylist(), strict=True):
        same_cut = pc.is_null(cut) if prefix is None else pc.fill_null(pc.equal(cut, prefix), False)
        at = np.flatnonzero(
            pc.and_(pc.and_(ours, pc.equal(batch.column("topic"), topic)), same_cut).to_numpy(zero_copy_only=False)
        )
        parser = parsers[topic]
        result = parser.parse(
            batch.column("value").take(pa.array(at)),
            [moved[i] for i in at] if moved is not None else None,
            prefixes[prefix] if prefix is not None else None,
        )
        tallies[parser.table].unknown.update(result.unknown)
        if not result.taken.num_rows:
            continue
        records = pa.array(at[result.taken.column("index").to_numpy()])
        taken[records.to_numpy()] = True
        columns = {
            "table": pa.array([parser.table] * len(records), pa.string()),
            "topic": batch.column("topic").take(records),
            "kafka_partition": batch.column("partition").take(records),
            "offset": batch.column("offset").take(records),
            **{name: result.taken.column(name).combine_chunks() for name in FAST_COLUMNS},
        }
        n = len(records)
        arrays = [columns[f.name].cast(f.type) if f.name in columns else pa.nulls(n, f.type) for f in PARSED]
        rows.append(pa.RecordBatch.from_arrays(arrays, schema=PARSED))
    return taken, rows


def _kept_and_marks(batch: pa.RecordBatch, committed: Mapping[tuple[str, int], int]) -> tuple[np.ndarray, pa.Table]:
    """Per record, whether it is at or above its partition's committed offset; and per (topic,
    partition), the highest offset kept and how many records were."""
    positions = pa.table(
        {"topic": batch.column("topic"), "partition": batch.column("partition"), "offset": batch.column("offset")}
    )
    kept = np.ones(batch.num_rows, dtype=bool)
    present = positions.group_by(["topic", "partition"]).aggregate([])
    for topic, partition in zip(present.column("topic").to_pylist(), present.column("partition").to_pylist(), strict=True):
        floor = committed.get((topic, partition), 0)
        if floor > 0:
            below = pc.and_(pc.equal(positions.column("topic"), topic), pc.equal(positions.column("partition"), partition))
            below = pc.and_(below, pc.less(positions.column("offset"), floor))
            kept &= ~below.to_numpy(zero_copy_only=False)
    marks = positions.filter(pa.array(kept)).group_by(["topic", "partition"]).aggregate([("offset", "max"), ("offset", "count")])
    return kept, marks


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
    record here (the property tests and ``python -m benchmarks parse`` compare the two). ``prefixes``: the
    wrapper prefixes cut from the values, by the id a record's ``CUT_PREFIX`` names (``ingest.prefixes``)."""
    known = list(prefixes)

    def parsed_row(record: dict[str, Any], headers: Headers, tallies: Mapping[str, _TableTally]) -> dict[str, Any]:
        """The row of a record the fast path did not take: parsed here, or rejected."""
        topic = record["topic"]
        row: dict[str, Any] = {"topic": topic, "kafka_partition": record["partition"], "offset": record["offset"]}
        layout = layouts_by_topic.get(topic)
        prefix = record.get(CUT_PREFIX)
        if prefix is not None:
            record["value"] = known[prefix] + record["value"]
        try:
            if layout is None:
                raise RejectedEvent(Reason.UNKNOWN_TABLE, f"topic {topic!r} is not mapped to a table in the configuration")
            row["table"] = table = layout.table
            row.update(_parse_record(record, layout, rules_by_table[table], tallies[table], truncate_lsns.get(table), headers))
        except RejectedEvent as rejected:
            row.update(
                reason=rejected.rejection.reason,
                detail=rejected.rejection.detail,
                raw_key=record["key"],
                raw_value=record["value"],
            )
        return row

    def parse(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        tallies: dict[str, _TableTally] = defaultdict(_TableTally)
        parsers = {
            topic: FastParser(layout, rules_by_table[layout.table])
            for topic, layout in layouts_by_topic.items()
            if fast and layout.table not in truncate_lsns  # a redo after a truncate reads its records' LSNs
        }
        for batch in batches:
            header_column = batch.column("headers") if "headers" in batch.schema.names else None
            kept, marks = _kept_and_marks(batch, committed)
            moved = _carrying(header_column, NEW_KEY_HEADER) if header_column is not None else None
            taken, fast_rows = _fast_rows(parsers, kept, batch, moved, tallies, known)
            yield from fast_rows
            rest = np.flatnonzero(kept & ~taken)
            records = batch.take(pa.array(rest)).to_pylist()
            out = [
                parsed_row(record, _header_reader(header_column, index), tallies)
                for index, record in zip(rest.tolist(), records, strict=True)
            ]
            yield pa.RecordBatch.from_pylist(out + _mark_rows(marks, layouts_by_topic), schema=PARSED)
        tallied = _task_rows(tallies, parsers)
        if tallied:
            yield pa.RecordBatch.from_pylist(tallied, schema=PARSED)

    return parse


def _mark_rows(marks: pa.Table, layouts_by_topic: Mapping[str, TableLayout]) -> list[dict[str, Any]]:
    """The offset marks of one input batch (``Tag.MARK``), one per (topic, partition)."""
    rows = []
    names = ("topic", "partition", "offset_max", "offset_count")
    for topic, partition, last, count in zip(*(marks.column(name).to_pylist() for name in names), strict=True):
        layout = layouts_by_topic.get(topic)
        rows.append(
            {
                "table": layout.table if layout else None,
                "topic": topic,
                "kafka_partition": partition,
                "offset": last,
                "records": count,
                "op": Tag.MARK,
            }
        )
    return rows


def _task_rows(tallies: Mapping[str, _TableTally], parsers: Mapping[str, FastParser]) -> list[dict[str, Any]]:
    """What the parse task saw besides changes, sent once at its end: the tallies and the
    wrapper prefixes the fast path learned."""
    rows = [row for table, tally in tallies.items() for row in _tally_rows(table, tally)]
    for topic, parser in parsers.items():
        if parser.learned is not None:  # whole wrapped records: none once their prefix is cut
            rows.append({"table": parser.table, "topic": topic, "op": Tag.PREFIX, "raw_value": parser.learned})
    return rows


def reduce_and_write_stage(
    layouts_by_table: Mapping[str, TableLayout], io_properties: Mapping[str, str], batch_tag: str
) -> ArrowStage:
    """Rows grouped by (table, key) in source order -> per key, the surviving after-image (data)
    and a key row per partition where an earlier version may live (equality deletes); then one
    Parquet file per (table, partition, kind) of this task, with Iceberg field ids. File names
    are unique per attempt, so a retried or replayed batch never overwrites a file a committed
    snapshot references; files of attempts that never commit are orphans."""

    def reduce_and_write(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rows = pa.Table.from_batches([batch.cast(PARSED) for batch in batches], schema=PARSED)
        through = pc.or_(pc.is_in(rows.column("op"), _PASSED_OPS), pc.is_valid(rows.column("reason")))
        passed = rows.filter(through).to_pylist()
        changes = rows.filter(pc.and_(pc.invert(through), pc.not_equal(rows.column("op"), Tag.SKIP.value)))
        pieces: dict[tuple[str, str, FileKind], list[pa.Table]] = defaultdict(list)
        for table in pc.unique(changes.column("table")).to_pylist():
            of_table = changes.filter(pc.equal(changes.column("table"), table))
            for (partition, kind), arrows in _reduce_table(layouts_by_table[table], of_table, passed).items():
                pieces[table, partition, kind].extend(arrows)
        # One file after the other, on this thread: two threads did not make a batch of many small
        # files faster (docs/BENCHMARKS.md, row "Many tables in one batch").
        facts = [
            write_file(
                layouts_by_table[table], kind, tuple(orjson.loads(partition)), pa.concat_tables(arrows), io_properties, batch_tag
            )
            for (table, partition, kind), arrows in pieces.items()
        ]
        if facts or passed:
            yield pa.RecordBatch.from_pylist(passed + facts, schema=RESULT)

    return reduce_and_write


_PASSED_OPS = pa.array([tag.value for tag in PASSED_THROUGH])


def _reduce_table(
    layout: TableLayout, rows: pa.Table, passed: list[dict[str, Any]]
) -> dict[tuple[str, FileKind], list[pa.Table]]:
    """One table's changes reduced per key, by (partition, kind) of file: the plain keys in Arrow
    (``reduce``), the others one by one (``_reduce_by_key``)."""
    pieces: dict[tuple[str, FileKind], list[pa.Table]] = defaultdict(list)
    if layout.append_only:
        return {at: [arrow] for at, arrow in append_rows(layout, rows).items()}
    plain = plain_rows(rows)
    for (partition, kind), arrow in reduce_plain_keys(layout, rows.filter(plain)).items():
        pieces[partition, kind].append(arrow)
    for (partition, kind), records in _reduce_by_key(layout, rows.filter(pc.invert(plain)), passed).items():
        pieces[partition, kind].append(layout.to_arrow(records, key_only=kind is not FileKind.DATA))
    return everywhere(pieces) if layout.older_spec_data else pieces


def everywhere(pieces: dict[tuple[str, FileKind], list[pa.Table]]) -> dict[tuple[str, FileKind], list[pa.Table]]:
    """Every partition's deletes as global ones (``TableLayout.older_spec_data``): a key whose
    row may be in a data file of an older spec is deleted in every partition of every spec."""
    out: dict[tuple[str, FileKind], list[pa.Table]] = defaultdict(list)
    for (partition, kind), arrows in pieces.items():
        at = (GLOBAL_PARTITION, FileKind.GLOBAL_DELETE) if kind is FileKind.DELETE else (partition, kind)
        out[at].extend(arrows)
    return out


def _reduce_by_key(
    layout: TableLayout, rows: pa.Table, passed: list[dict[str, Any]]
) -> dict[tuple[str, FileKind], list[dict[str, Any]]]:
    """``batch.reduce_key`` of each key of ``rows`` (one table's, in key order): the rows of its
    files by (partition, kind); into ``passed``, the images primary-key changes moved and the
    rows the batch cannot complete."""
    outputs: dict[tuple[str, FileKind], list[dict[str, Any]]] = defaultdict(list)
    columns = {name: rows.column(name).to_pylist() for name in _REDUCED}
    for key, group in groupby(range(rows.num_rows), key=columns["key"].__getitem__):
        indices = list(group)
        key_values = tuple(orjson.loads(key).values())
        result = reduce_key([_key_change(columns, i) for i in indices], key_values)
        if result.unresolved:
            assert result.row is not None
            passed.append(_unresolved_row(rows.slice(indices[-1], 1).to_pylist()[0], result))
        elif result.row is not None:
            outputs[orjson.dumps(layout.partition_of(result.row)).decode(), FileKind.DATA].append(result.row)
        for moved in result.moved:
            row = {"row": None} if moved.image is None else _image_payload(moved.image.row, moved.image)
            image = {"to": moved.to, "at": moved.at, **row}
            passed.append({"table": layout.table, "op": Tag.MOVED, "key": key, "change": orjson.dumps(image)})
        key_row = dict(zip(layout.primary_key, key_values, strict=True))
        if result.global_delete:
            outputs[GLOBAL_PARTITION, FileKind.GLOBAL_DELETE].append(key_row)
        for p in result.delete_partitions:
            outputs[orjson.dumps(p).decode(), FileKind.DELETE].append(key_row)
    return outputs


def _key(values: list[Any] | None) -> tuple[Any, ...] | None:
    return tuple(values) if values is not None else None


_REDUCED = ("key", "op", "after", "prior", "global_delete", "change", "kafka_partition", "offset")


def _key_change(columns: dict[str, list[Any]], index: int) -> KeyChange:
    """A change as the parse stage sent it (``fastparse.change_columns``, ``_unavailable_fields``)."""
    after, extra = columns["after"][index], columns["change"][index]
    extra = orjson.loads(extra) if extra is not None else {}
    return KeyChange(
        columns["op"][index],
        orjson.loads(after) if after is not None else None,
        tuple(tuple(orjson.loads(p)) for p in columns["prior"][index]),
        columns["global_delete"][index],
        frozenset(extra.get("unavailable", ())),
        _key(extra.get("from")),
        _key(extra.get("to")),
        (columns["kafka_partition"][index], columns["offset"][index]),
    )


def _image_payload(row: dict[str, Any] | None, image: Image | KeyResult) -> dict[str, Any]:
    """What the driver needs to complete ``row`` (``job._image`` reads it back)."""
    return {"row": row, "unresolved": sorted(image.unresolved), "source": image.source, "moved_at": image.moved_at}


def _unresolved_row(last: dict[str, Any], result: KeyResult) -> dict[str, Any]:
    """A key's row the batch cannot complete, to the driver with its last record (``Tag.UNRESOLVED``)."""
    change = _image_payload(result.row, result) | {"prior": list(result.delete_partitions), "global": result.global_delete}
    kept = ("table", "topic", "kafka_partition", "offset", "key", "raw_key", "raw_value")
    return {**{name: last[name] for name in kept}, "op": Tag.UNRESOLVED, "change": orjson.dumps(change)}
