"""The rows the two stages of a micro-batch pass on: what Spark's Kafka source yields, the parse
stage's rows, the write stage's result, and the tags of the rows that are not changes. The
stages' rows are declared once, in Arrow, and their Spark DDL is made from that. Declarations
only: no parsing, no I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa

_DDL_TYPES = {
    pa.string(): "string",
    pa.binary(): "binary",
    pa.int32(): "int",
    pa.int64(): "long",
    pa.bool_(): "boolean",
    pa.list_(pa.string()): "array<string>",
}


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
        ("key", pa.string()),  # a change's: the JSON object of its key columns (``fastparse.key_text``)
        ("op", pa.string()),
        # A change's after-image (canonical JSON), its partition (or a written file's), where an
        # earlier version may live, and whether that is unknown (``fastparse.change_columns``).
        ("after", pa.binary()),
        ("partition", pa.string()),
        ("prior", pa.list_(pa.string())),
        ("global_delete", pa.bool_()),
        # A change's unavailable columns and primary-key change (``stages._unavailable_fields``), null
        # in the common case; the payload of the other tags that have one.
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
        ("record_count", pa.int64()),
        ("file_size", pa.int64()),
        ("description", pa.string()),
    ]
)
PARSED_SCHEMA, RESULT_SCHEMA = _ddl(PARSED), _ddl(RESULT)


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
