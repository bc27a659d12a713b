"""The parse stage's fast path: the common Debezium records of one table read by Arrow's
vectorized JSON reader instead of one ``orjson.loads`` and one Python decode per record. The
Connect schema wrapper is read once per distinct text and only the payloads are parsed. Pure:
bytes in, the parsed rows of the records it takes out. A record it cannot take exactly as the
Python path (``debezium``) would goes to the Python path, whole, so every dead-letter reason and
rule stays there (docs/ingest.md, "The fast parse path").
"""

from __future__ import annotations

import contextlib
import enum
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from icecdc.domain.jsonlines import json_lines
from icecdc.domain.layout import Column, TableLayout
from icecdc.domain.sourcespec import BeforeImage, SourceRules, UnavailableValues, UnknownPartition
from icecdc.ingest.batch import KeyChange, to_key_change
from icecdc.ingest.debezium import (
    CONNECT_DECIMAL,
    INT_RANGE,
    ISO_TIMES,
    JSON_FLOAT32,
    ROW_OPS,
    TIME_UNITS,
    TIMESTAMP_UNITS,
    UNAVAILABLE_PLACEHOLDER,
    UNAVAILABLE_PLACEHOLDER_BASE64,
    VARIABLE_SCALE_DECIMAL,
    ChangeEvent,
    RejectedEvent,
    decimal_shape,
    decode_value,
    logical_types,
)
from icecdc.ingest.evolution import ChangeKind, compare, source_fields

WRAPPED = b'{"schema":'
PAYLOAD = b',"payload":'
_OPS = pa.array(sorted(ROW_OPS))
_CREATES = pa.array(["c", "r"])
_NO_KEY = pa.scalar("{}", pa.string())  # ``key_text`` of a table without a primary key


def key_text(primary_key: Sequence[str], key: Sequence[Any]) -> str:
    """A change's key as the ``key`` column carries it: the shuffle's grouping value, and a JSON
    object of the key columns the write stage reads into Arrow (``TableLayout.arrow_from_json``)."""
    return orjson.dumps(dict(zip(primary_key, key, strict=True))).decode()


def change_columns(layout: TableLayout, change: KeyChange) -> dict[str, Any]:
    """What the write stage reads of a change besides its op and key: its after-image (canonical
    JSON), the after-image's partition and the partitions where an earlier version of its key
    may live (as orjson writes the tuples), and whether its old partition is unknown."""
    after = change.after
    return {
        "after": orjson.dumps(after) if after is not None else None,
        "partition": orjson.dumps(layout.partition_of(after)).decode() if after is not None else None,
        "prior": [orjson.dumps(p).decode() for p in change.prior_partitions],
        "global_delete": change.global_delete,
    }


class Reading(enum.Enum):
    """How a column's JSON values are read, checked and converted to their canonical form."""

    AS_READ = "as-read"  # int, long, boolean, string: canonical as Arrow reads them (ints range-checked)
    DECIMAL = "decimal"  # text already quantized to the column's scale
    # Connect's Decimal, Debezium's default ``precise`` mode: base64 of the unscaled value, at the
    # scale the field schema names, decoded value by value by the Python path's own function.
    CONNECT_DECIMAL = "connect-decimal"
    EPOCH = "epoch"  # an integer in a unit of time, to microseconds (or days as they are)
    FLOAT = "float"  # a JSON number, as a double
    FLOAT32 = "float32"  # a Connect float32 into a double column: the float32 itself
    BINARY = "binary"  # base64 text, kept as it is once it is known to decode
    ISO_DATE = "iso-date"  # ISO-8601 text to days since 1970-01-01
    ISO_TIMESTAMP = "iso-timestamp"  # ISO-8601 text to microseconds since the epoch, UTC


@dataclass(frozen=True)
class _ValueRule:
    """How one column's JSON values are read (``arrow``) and which of them are canonical as read."""

    column: Column
    arrow: pa.DataType
    reading: Reading = Reading.AS_READ
    micros_per_unit: int = 1  # an epoch integer's unit; negative: that many units make a microsecond
    pattern: str | None = None  # what a canonical text matches (decimal and binary)
    int_range: tuple[int, int] | None = None
    sent_scale: int = 0  # a Connect decimal's scale, from its field schema

    @property
    def canonical(self) -> pa.DataType:
        """The Arrow type of the canonical values."""
        if self.reading in (Reading.ISO_DATE, Reading.ISO_TIMESTAMP):
            return pa.int64()
        return self.arrow


# Base64 as ``base64.b64decode(validate=True)`` takes it, padded to whole quads (RE2 reads $ as
# the very end): what this accepts decodes; what it does not goes the Python way.
_BASE64 = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"


def _value_rule(column: Column, logical: Mapping[str, Any] | None) -> _ValueRule | None:
    """How the fast path reads ``column`` under its Connect field schema, or None when it does not
    (its records go the Python way)."""
    name = logical.get("name", "") if logical else ""
    sent_as_text = logical is not None and logical.get("type") == "string"
    kind = column.type
    if name == VARIABLE_SCALE_DECIMAL:
        return None
    if kind == "long" and name in ISO_TIMES:
        # The source's type for it is a string, which a long column cannot take: the Python path
        # dead-letters the schema (a string column takes the text as it came, on the fast path).
        return None
    if kind == "long" and name in TIME_UNITS:
        return _ValueRule(column, pa.int64(), Reading.EPOCH, micros_per_unit=TIME_UNITS[name])
    if kind in INT_RANGE:
        return _ValueRule(column, pa.int64(), int_range=INT_RANGE[kind] if kind == "int" else None)
    if kind in ("float", "double"):
        float32 = kind == "double" and logical is not None and logical.get("type") == JSON_FLOAT32
        return _ValueRule(column, pa.float64(), Reading.FLOAT32 if float32 else Reading.FLOAT)
    if kind == "boolean":
        return _ValueRule(column, pa.bool_())
    if kind == "string":
        return _ValueRule(column, pa.string())
    if kind == "binary":
        return _ValueRule(column, pa.string(), Reading.BINARY, pattern=_BASE64)
    if kind.startswith("decimal(") and name == CONNECT_DECIMAL and logical is not None and logical.get("type") == "bytes":
        scale = logical.get("parameters", {}).get("scale", "0")
        return _ValueRule(column, pa.string(), Reading.CONNECT_DECIMAL, sent_scale=int(scale)) if scale.isdigit() else None
    if kind.startswith("decimal("):
        _, _, canonical = decimal_shape(kind)
        # RE2 reads \d as ASCII digits only and $ as the very end: what it accepts, Python's
        # pattern accepts too; what it does not goes the Python way.
        return _ValueRule(column, pa.string(), Reading.DECIMAL, pattern=canonical.pattern)
    if kind in ("date", "timestamp", "timestamptz") and sent_as_text:
        return _ValueRule(column, pa.string(), Reading.ISO_DATE if kind == "date" else Reading.ISO_TIMESTAMP)
    if kind in ("date", "timestamp", "timestamptz"):
        unit = TIMESTAMP_UNITS.get(name, 1) if kind != "date" else 1
        return _ValueRule(column, pa.int64(), Reading.EPOCH, micros_per_unit=unit)
    return None


@dataclass(frozen=True)
class Plan:
    """How the records of one table under one schema text are read."""

    rules: tuple[_ValueRule, ...]
    payload_schema: pa.Schema
    bare: bool  # no row struct in the schema: the after-image's extra fields must be looked for
    unknown: tuple[str, ...]  # source fields the table lacks, counted per record (``COLUMNS``)


def plan_for(layout: TableLayout, rules: SourceRules, schema: Any) -> Plan | None:
    """The plan for records with Connect schema ``schema`` (None: bare), or None when none of
    them can take the fast path."""
    fields = source_fields(schema)
    unknown: tuple[str, ...] = ()
    if fields:
        source = compare(layout.columns, fields)
        if source.incompatible or (source.changes and rules.evolve_schema):
            return None
        unknown = source.unknown + tuple(c.column for c in source.changes if c.kind is ChangeKind.ADD)
    logical = logical_types(schema)
    value_rules = []
    for column in layout.columns:
        rule = _value_rule(column, logical.get(column.name))
        if rule is None:
            return None
        value_rules.append(rule)
    image = pa.struct([(r.column.name, r.arrow) for r in value_rules])
    stamps = [(name, pa.int64()) for name in ("ts_ms", "ts_us", "ts_ns")]
    payload = pa.schema(
        [
            ("op", pa.string()),
            ("before", image),
            ("after", image),
            ("source", pa.struct([])),
            ("transaction", pa.struct([])),
            *stamps,
        ]
    )
    return Plan(tuple(value_rules), payload, not fields, unknown)


def _line_breaks(values: pa.Array) -> np.ndarray:
    """Per value, whether it holds a line break (a byte scan: Arrow's substring search is ten
    times slower)."""
    values = values.cast(pa.binary())  # 32-bit offsets (a large binary column has 64-bit ones)
    broken = np.zeros(len(values), dtype=bool)
    offsets = np.frombuffer(values.buffers()[1], np.int32)[values.offset : values.offset + len(values) + 1]
    data = values.buffers()[2]
    if data is None or not len(values):
        return broken
    text = np.frombuffer(data, np.uint8)[offsets[0] : offsets[-1]]
    at = np.flatnonzero((text == ord("\n")) | (text == ord("\r"))) + offsets[0]
    broken[np.searchsorted(offsets, at, side="right") - 1] = True
    return broken


def split_wrapper(value: bytes | None, stripped: bytes | None = None) -> tuple[bytes | None, bytes] | None:
    """(the schema part, the payload) of a compact wrapped record, (None, the value) of a bare one
    on one line, or None when it is neither. The schema part is ``{"schema":<value>``: when its
    text is one JSON value, the payload follows it exactly. ``stripped``: the wrapper's prefix
    (the schema part and ``,"payload":``) cut from ``value`` before it came here (``prefixes``)."""
    if value is None or b"\n" in value or b"\r" in value:
        return None
    if stripped is not None:
        if not value.endswith(b"}"):
            return None
        prefix, payload = stripped[: -len(PAYLOAD)], value[:-1]
    elif value.startswith(WRAPPED):
        cut = value.find(PAYLOAD)
        if cut < 0 or not value.endswith(b"}"):
            return None
        prefix, payload = value[:cut], value[cut + len(PAYLOAD) : -1]
    else:
        prefix, payload = None, value
    if not (payload.startswith(b"{") and payload.endswith(b"}")):
        return None
    return prefix, payload


def wrapper_schema(prefix: bytes) -> tuple[bool, Any]:
    """(whether ``prefix`` is ``{"schema":<one JSON value>``, that value)."""
    try:
        document = orjson.loads(prefix + b"}")
    except orjson.JSONDecodeError:
        return False, None
    if not isinstance(document, dict) or list(document) != ["schema"]:
        return False, None
    return True, document["schema"]


class _Refused(Exception):
    """Arrow's reader refused a chunk, or read it other than record by record."""


def _read(plan: Plan, payloads: pa.Array) -> pa.Table:
    try:
        # orjson refuses what is not UTF-8 (a surrogate too): Arrow does not look at fields it
        # skips, but checks the text it is cast to.
        payloads.cast(pa.string())
        data = json_lines(payloads)
        table = pj.read_json(
            pa.BufferReader(data),
            read_options=pj.ReadOptions(use_threads=True, block_size=max(1 << 18, data.size // 4 + 1)),
            parse_options=pj.ParseOptions(
                explicit_schema=plan.payload_schema, unexpected_field_behavior="infer" if plan.bare else "ignore"
            ),
        )
    except pa.ArrowInvalid:
        raise _Refused from None
    if table.num_rows != len(payloads):
        raise _Refused  # a line with two documents
    if plan.bare:
        names = set(table.schema.names)
        if {"schema", "payload"} <= names:
            raise _Refused  # a wrapper with its keys in another order: the Python path unwraps it
        if table.schema.field("after").type.num_fields != len(plan.rules):
            raise _Refused  # after-image fields the table lacks (counted or inferred by the Python path)
    return table


def _image(table: pa.Table, name: str, plan: Plan) -> pa.StructArray:
    """A row image's column, with the table's fields only (a bare read infers the others)."""
    array = table.column(name).combine_chunks()
    assert isinstance(array, pa.StructArray)
    names = [r.column.name for r in plan.rules]
    return pa.StructArray.from_arrays([array.field(n) for n in names], names=names, mask=pc.is_null(array))


def _checked(plan: Plan, image: pa.StructArray, placeholder: bool) -> tuple[pa.Array, pa.StructArray]:
    """(per record, whether every value of ``image`` is canonical as read; the image with values
    converted to their canonical form)."""
    fine = pa.array([True] * len(image))
    children = []
    for rule, values in zip(plan.rules, image.flatten(), strict=True):
        check, values = _canonical(rule, values, placeholder)
        if check is not None:
            fine = pc.and_(fine, pc.fill_null(check, True))
        children.append(values)
    fields = [pa.field(r.column.name, r.canonical) for r in plan.rules]
    converted = pa.StructArray.from_arrays(children, fields=fields, mask=pc.is_null(image))
    return fine, converted


def _canonical(rule: _ValueRule, values: pa.Array, placeholder: bool) -> tuple[pa.Array | None, pa.Array]:
    """(per value, whether ``decode_value`` gives what the fast path does (None: all do); the
    values in canonical form). A value it does not is the Python path's, with its verdict."""
    reading = rule.reading
    if reading is Reading.AS_READ and rule.int_range is not None:
        low, high = rule.int_range
        return pc.and_(pc.greater_equal(values, low), pc.less_equal(values, high)), values
    if reading is Reading.AS_READ and placeholder and rule.column.type == "string":
        return pc.not_equal(values, UNAVAILABLE_PLACEHOLDER), values
    if reading in (Reading.DECIMAL, Reading.BINARY):
        assert rule.pattern is not None
        check = pc.match_substring_regex(values, rule.pattern)
        if reading is Reading.BINARY and placeholder:
            check = pc.and_(check, pc.not_equal(values, UNAVAILABLE_PLACEHOLDER_BASE64))
        return check, values
    if reading is Reading.CONNECT_DECIMAL:
        return _connect_decimal(rule, values, placeholder)
    if reading is Reading.EPOCH:
        if rule.micros_per_unit > 1:
            return None, pc.multiply_checked(values, rule.micros_per_unit)
        if rule.micros_per_unit < 0:
            return None, _floor_divide(values, -rule.micros_per_unit)
        return None, values
    if reading in (Reading.FLOAT, Reading.FLOAT32):
        return _float(values, reading is Reading.FLOAT32)
    if reading is Reading.ISO_DATE:
        return _iso_date(values)
    if reading is Reading.ISO_TIMESTAMP:
        return _iso_timestamp(values)
    return None, values


def _connect_decimal(rule: _ValueRule, values: pa.Array, placeholder: bool) -> tuple[pa.Array, pa.Array]:
    """Connect decimals as ``decode_value`` decodes them, one by one: Arrow cannot decode base64,
    and this costs a few microseconds a value against a whole record's Python parse. A value it
    refuses (or an unavailable value's placeholder) is the Python path's, with its verdict."""
    logical = {"name": CONNECT_DECIMAL, "parameters": {"scale": str(rule.sent_scale)}}
    fine, texts = [], []
    for value in values.to_pylist():
        text = None
        if value is not None and not (placeholder and value == UNAVAILABLE_PLACEHOLDER_BASE64):
            with contextlib.suppress(RejectedEvent):
                text = decode_value(rule.column, value, logical)
        fine.append(value is None or text is not None)
        texts.append(text)
    return pa.array(fine, pa.bool_()), pa.array(texts, pa.string())


def _float(values: pa.Array, float32: bool) -> tuple[pa.Array, pa.Array]:
    """A JSON number as ``float(value)`` (or the float32 it rounds to) reads it. Not taken: what
    orjson refuses and Arrow reads (NaN, Infinity), and a negative zero (orjson reads ``-0`` as the
    integer 0, whose float is +0.0: Arrow's reading cannot tell it from ``-0.0``)."""
    if float32:
        values = pc.cast(pc.cast(values, pa.float32()), pa.float64())  # past its range: inf, not taken
    negative_zero = pc.and_(pc.equal(values, 0.0), pc.less(pc.divide(1.0, values), 0.0))
    return pc.and_(pc.is_finite(values), pc.invert(negative_zero)), values


def _int(text: pa.Array) -> pa.Array:
    """Digits (an absent optional group reads as "") as an integer."""
    return pc.cast(pc.if_else(pc.equal(text, ""), "0", text), pa.int64())


def _between(values: pa.Array, low: int | pa.Array, high: int | pa.Array) -> pa.Array:
    return pc.and_(pc.greater_equal(values, low), pc.less_equal(values, high))


# ISO-8601 as Debezium writes it (``ZonedTimestamp``, ``IsoDate``): a strict form
# whose fields are read as ``datetime.fromisoformat`` reads them, one to six fraction digits, an
# offset of hours and minutes or Z. Anything else (a leap second, 24:00, years past 9999, more
# digits, an offset without minutes...) goes the Python way, whatever it makes of it.
_CLOCK = r"(?P<hour>\d{2}):(?P<minute>\d{2}):(?P<second>\d{2})(?:\.(?P<fraction>\d{1,6}))?"
_ISO_DATE = r"^(?P<year>\d{4})-(?P<month>\d{2})-(?P<day>\d{2})"  # ``date.fromisoformat(text.strip()[:10])``
_ISO_TIMESTAMP = _ISO_DATE + "[T ]" + _CLOCK + r"(?P<zone>Z|(?P<sign>[+-])(?P<zone_hour>\d{2}):(?P<zone_minute>\d{2}))?$"
_DAYS_IN_MONTH = pa.array([0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], pa.int64())


_TEXT_GROUPS = frozenset({"zone", "sign", "fraction"})


def _fields(values: pa.Array, pattern: str) -> tuple[pa.Array, dict[str, pa.Array]]:
    """(which texts match ``pattern``, its named groups: numbers as integers)."""
    parts = pc.extract_regex(values, pattern)
    names = [parts.type.field(i).name for i in range(parts.type.num_fields)]
    groups = dict(zip(names, parts.flatten(), strict=True))
    return pc.is_valid(parts), {n: g if n in _TEXT_GROUPS else _int(g) for n, g in groups.items()}


def _read_as(values: pa.Array, matched: pa.Array, valid: pa.Array) -> pa.Array:
    """Whether a value is taken: null, or matched and valid."""
    return pc.or_(pc.is_null(values), pc.fill_null(pc.and_(matched, valid), False))


def _days(groups: Mapping[str, pa.Array]) -> tuple[pa.Array, pa.Array]:
    """(whether year, month and day make a date, its days since 1970-01-01: H. Hinnant's
    ``days_from_civil``, for years 1 to 9999)."""
    year, month, day = groups["year"], groups["month"], groups["day"]
    leap = pc.or_(
        pc.and_(pc.equal(pc.modulo(year, 4), 0), pc.not_equal(pc.modulo(year, 100), 0)), pc.equal(pc.modulo(year, 400), 0)
    )
    valid_month = _between(month, 1, 12)
    last = pc.take(_DAYS_IN_MONTH, pc.if_else(valid_month, month, 0))
    last = pc.add(last, pc.cast(pc.and_(leap, pc.equal(month, 2)), pa.int64()))
    valid = pc.and_(pc.and_(pc.greater_equal(year, 1), valid_month), _between(day, 1, last))
    before_march = pc.less_equal(month, 2)
    shifted = pc.subtract(year, pc.cast(before_march, pa.int64()))  # >= 0 for years from 1
    era = pc.divide(shifted, 400)
    year_of_era = pc.subtract(shifted, pc.multiply(era, 400))
    month_from_march = pc.if_else(before_march, pc.add(month, 9), pc.subtract(month, 3))
    day_of_year = pc.add(pc.divide(pc.add(pc.multiply(month_from_march, 153), 2), 5), pc.subtract(day, 1))
    day_of_era = pc.add(
        pc.subtract(pc.add(pc.multiply(year_of_era, 365), pc.divide(year_of_era, 4)), pc.divide(year_of_era, 100)),
        day_of_year,
    )
    return valid, pc.subtract(pc.add(pc.multiply(era, 146_097), day_of_era), 719_468)


def _clock(groups: Mapping[str, pa.Array]) -> tuple[pa.Array, pa.Array]:
    """(whether hour, minute and second are a time of day, its microseconds since midnight)."""
    hour, minute, second = groups["hour"], groups["minute"], groups["second"]
    valid = pc.and_(pc.and_(_between(hour, 0, 23), _between(minute, 0, 59)), _between(second, 0, 59))
    seconds = pc.add(pc.multiply(pc.add(pc.multiply(hour, 60), minute), 60), second)
    fraction = _int(pc.utf8_rpad(groups["fraction"], 6, "0"))
    return valid, pc.add(pc.multiply(seconds, 1_000_000), fraction)


def _iso_date(values: pa.Array) -> tuple[pa.Array, pa.Array]:
    matched, groups = _fields(values, _ISO_DATE)
    valid, days = _days(groups)
    return _read_as(values, matched, valid), days


def _iso_timestamp(values: pa.Array) -> tuple[pa.Array, pa.Array]:
    """ISO-8601 text as ``debezium._iso_micros`` reads it: without an offset, UTC."""
    matched, groups = _fields(values, _ISO_TIMESTAMP)
    valid_date, days = _days(groups)
    valid_clock, micros = _clock(groups)
    zone_hour, zone_minute = groups["zone_hour"], groups["zone_minute"]
    offset = pc.multiply(pc.add(pc.multiply(zone_hour, 60), zone_minute), 60_000_000)
    offset = pc.if_else(pc.equal(groups["sign"], "-"), pc.negate(offset), offset)
    valid = pc.and_(pc.and_(valid_date, valid_clock), pc.and_(_between(zone_hour, 0, 23), _between(zone_minute, 0, 59)))
    micros = pc.subtract(pc.add(pc.multiply(days, 86_400_000_000), micros), offset)
    return _read_as(values, matched, valid), micros


# Partition transforms rendered here, as ``PartitionTerm.apply`` computes them: identity of a
# type whose canonical value is the partition value, and day and hour of epoch microseconds.
_IDENTITY_TYPES = frozenset({"string", "int", "long", "boolean", "date"})
_MICROS_PER = {"day": 86_400_000_000, "hour": 3_600_000_000}
# What orjson escapes in a string; a value holding one is rendered by orjson, record by record.
_ESCAPED = r'["\\\x00-\x1f]'
_OUT = pa.schema(
    [
        ("index", pa.int64()),
        ("op", pa.string()),
        ("key", pa.string()),
        ("after", pa.binary()),
        ("partition", pa.string()),
        ("prior", pa.list_(pa.string())),
        ("global_delete", pa.bool_()),
    ]
)
FAST_COLUMNS = _OUT.names[1:]  # the parse stage's columns the fast path fills


def _floor_divide(values: pa.Array, divisor: int) -> pa.Array:
    quotient = pc.divide(values, divisor)  # truncates toward zero; Python's // floors
    return pc.subtract(quotient, pc.cast(pc.greater(pc.multiply(quotient, divisor), values), pa.int64()))


def _concat(*parts: Any) -> pa.Array:
    return pc.binary_join_element_wise(*parts, "")


def _json(rule: _ValueRule, values: pa.Array) -> pa.Array:
    """Canonical values as orjson writes them (strings that need no escape)."""
    if rule.canonical == pa.float64():
        # orjson's shortest round trip ("1.0", "1e16"), which Arrow's cast does not write; a
        # float's text has no comma.
        texts = orjson.dumps(values.to_pylist()).decode()[1:-1].split(",") if len(values) else []
        return pa.array(texts, pa.string())
    text = _concat('"', values, '"') if rule.canonical == pa.string() else pc.cast(values, pa.string())
    return pc.if_else(pc.is_valid(values), text, "null")


def _list(items: Sequence[pa.Array]) -> pa.Array | str:
    return _concat("[", *_joined(items), "]") if items else "[]"


def _object(items: Mapping[str, pa.Array]) -> pa.Array | str:
    """Per row, the JSON object of ``items`` (name -> its values' JSON text), as orjson writes it."""
    return _concat("{", *_joined([_concat(orjson.dumps(name).decode(), ":", text) for name, text in items.items()]), "}")


def _lists(first: pa.Array, second: pa.Array) -> pa.ListArray:
    """Per row, the list of its values of ``first`` and ``second`` that are not null, in that order."""
    valid = np.column_stack(
        [pc.is_valid(first).to_numpy(zero_copy_only=False), pc.is_valid(second).to_numpy(zero_copy_only=False)]
    )
    n = len(first)
    offsets = np.concatenate([[0], np.cumsum(valid.sum(axis=1))]).astype(np.int32)
    order = np.column_stack([np.arange(n), np.arange(n, 2 * n)]).ravel()[valid.ravel()]
    values = pa.concat_arrays([first, second]).take(pa.array(order, pa.int64()))
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)


def _joined(items: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for item in items:
        out += [",", item] if out else [item]
    return out


@dataclass
class FastRows:
    """The records the fast path took: ``taken`` has, per record, its position in the values
    given, op, key and change (the parse stage's columns); ``unknown``: their source fields the
    table lacks, counted."""

    taken: pa.Table
    unknown: Counter[str]

    @property
    def positions(self) -> list[int]:
        return list(self.taken.column("index").to_pylist())


class FastParser:
    """The fast path for one table's records, with its plans per schema text (a table has a
    handful over its life)."""

    def __init__(self, layout: TableLayout, rules: SourceRules) -> None:
        self._layout, self._rules = layout, rules
        self.table = layout.table
        self._plans: dict[bytes | None, Plan | None] = {}
        self._last: tuple[bytes, Plan | None] | None = None
        self._learned: bytes | None = None  # the schema part of the last whole wrapped record it took
        self._vector_partition = all(
            (t.transform == "identity" and t.source_type in _IDENTITY_TYPES)
            or (t.transform in _MICROS_PER and t.source_type in ("timestamp", "timestamptz"))
            for t in layout.partition
        )

    @property
    def learned(self) -> bytes | None:
        """The wrapper prefix of the last whole wrapped record it took, to be cut from the table's
        next records (``prefixes.SchemaPrefixes``)."""
        return self._learned + PAYLOAD if self._learned is not None else None

    def _plan(self, prefix: bytes | None) -> Plan | None:
        if prefix not in self._plans:
            schema: Any = None
            if prefix is not None:
                whole, schema = wrapper_schema(prefix)
                if not whole:
                    self._plans[prefix] = None
                    return None
            self._plans[prefix] = plan_for(self._layout, self._rules, schema)
        return self._plans[prefix]

    def parse(
        self, values: pa.Array | Sequence[bytes | None], moved: Sequence[bool] | None = None, stripped: bytes | None = None
    ) -> FastRows:
        """The records the fast path takes (the others are the Python path's). ``moved``: whether
        each record carries the header of a primary-key change's delete (None: no record does).
        ``stripped``: the wrapper prefix cut from every value (None: they are whole)."""
        values = values if isinstance(values, pa.Array) else pa.array(values, pa.binary())
        tables: list[pa.Table] = []
        unknown: Counter[str] = Counter()
        chunks = self._cut(values, stripped) if stripped is not None else self._whole(values)
        for plan, indices, payloads in chunks:
            chunk_moved = [moved[i] for i in indices] if moved is not None else None
            for taken in self._parse_chunk(plan, indices, payloads, chunk_moved):
                if taken.num_rows:
                    tables.append(taken)
                    unknown.update(dict.fromkeys(plan.unknown, taken.num_rows))
        return FastRows(pa.concat_tables(tables) if tables else _OUT.empty_table(), unknown)

    def _cut(self, values: pa.Array, stripped: bytes) -> list[tuple[Plan, np.ndarray, pa.Array]]:
        """``split_wrapper`` of values cut of ``stripped``, in Arrow: the records of a table in its
        steady state, all of one schema."""
        plan = self._plan(stripped[: -len(PAYLOAD)])
        if plan is None:
            return []
        payloads = pc.binary_slice(values, 0, -1)
        fits = pc.and_(pc.ends_with(values, "}"), pc.and_(pc.starts_with(payloads, "{"), pc.ends_with(payloads, "}")))
        fits = pc.and_(pc.fill_null(fits, False), pa.array(~_line_breaks(values)))
        return [(plan, np.flatnonzero(fits.to_numpy(zero_copy_only=False)), payloads.filter(fits))]

    def _whole(self, values: pa.Array) -> list[tuple[Plan, np.ndarray, pa.Array]]:
        """``split_wrapper`` of whole values, one by one, grouped by the plan of their schema."""
        groups: dict[int, tuple[Plan, list[int], list[bytes]]] = {}
        for index, value in enumerate(values.to_pylist()):
            parts = split_wrapper(value)
            if parts is None:
                continue
            prefix, payload = parts
            if prefix is not None and self._last is not None and self._last[0] == prefix:
                plan = self._last[1]
            else:
                plan = self._plan(prefix)
                if prefix is not None:
                    self._last = (prefix, plan)
            if plan is None:
                continue
            if prefix is not None:
                self._learned = prefix
            group = groups.setdefault(id(plan), (plan, [], []))
            group[1].append(index)
            group[2].append(payload)
        return [
            (plan, np.array(indices, np.int64), pa.array(payloads, pa.binary())) for plan, indices, payloads in groups.values()
        ]

    def _parse_chunk(self, plan: Plan, indices: np.ndarray, payloads: pa.Array, moved: list[bool] | None) -> list[pa.Table]:
        try:
            return [self._rows(plan, _read(plan, payloads), pa.array(indices, pa.int64()), moved)]
        except (_Refused, pa.ArrowInvalid):
            if len(indices) == 1:
                return []  # the record Arrow refuses: the Python path says why
            half = len(indices) // 2
            first, second = (moved[:half], moved[half:]) if moved is not None else (None, None)
            return [
                *self._parse_chunk(plan, indices[:half], payloads.slice(0, half), first),
                *self._parse_chunk(plan, indices[half:], payloads.slice(half), second),
            ]

    def _rows(self, plan: Plan, table: pa.Table, indices: pa.Array, moved: list[bool] | None) -> pa.Table:
        layout, rules = self._layout, self._rules
        op = table.column("op").combine_chunks()
        before, after = _image(table, "before", plan), _image(table, "after", plan)
        # A create carries every value of its row (an append-only table has nothing but creates).
        placeholder = rules.unavailable_values is not UnavailableValues.KEEP_PLACEHOLDER and not layout.append_only
        before_fine, before = _checked(plan, before, False)
        after_fine, after = _checked(plan, after, placeholder)
        is_delete = pc.fill_null(pc.equal(op, "d"), False)
        fine = pc.and_(pc.fill_null(pc.is_in(op, _OPS), False), pc.is_valid(table.column("source").combine_chunks()))
        fine = pc.and_(fine, pc.and_(before_fine, after_fine))
        fine = pc.and_(fine, pc.if_else(is_delete, pc.is_valid(before), pc.is_valid(after)))
        if layout.append_only:
            # Its updates and deletes are dead letters, whose reason the Python path gives.
            fine = pc.and_(fine, pc.is_in(op, _CREATES))
        names = [r.column.name for r in plan.rules]
        old_values = dict(zip(names, before.flatten(), strict=True))
        new_values = dict(zip(names, after.flatten(), strict=True))
        for name in layout.primary_key:
            present = pc.if_else(is_delete, pc.is_valid(old_values[name]), pc.is_valid(new_values[name]))
            fine = pc.and_(fine, present)
            # A delete's after-image (if any) takes the key of its before-image (``decode_change``).
            new_values[name] = pc.if_else(is_delete, old_values[name], new_values[name])
        reads_before = pc.and_(pc.is_in(op, pa.array(["u", "d"])), pc.is_valid(before))
        if rules.before_image is BeforeImage.FULL:
            # Arrow reads an absent field as null: a before-image's null partition value could be
            # either, and the two give different partitions (``TableLayout.partition_of``).
            for term in layout.partition:
                fine = pc.and_(fine, pc.invert(pc.and_(reads_before, pc.is_null(old_values[term.source]))))
        if rules.unavailable_values is UnavailableValues.RESOLVE and moved is not None:
            # A primary-key change's delete names the new key in a header: the Python path reads it.
            fine = pc.and_(fine, pc.invert(pc.and_(is_delete, pa.array(moved))))
        fine = pc.fill_null(fine, False)
        if not self._vector_partition:
            return self._one_by_one(
                pc.filter(indices, fine), pc.filter(op, fine), pc.filter(before, fine), pc.filter(after, fine)
            )
        rules_by_name = dict(zip(names, plan.rules, strict=True))
        old_text = {name: _json(rules_by_name[name], values) for name, values in old_values.items()}
        new_text = {name: _json(rules_by_name[name], values) for name, values in new_values.items()}
        plain = pa.array([True] * len(op))
        for name, rule in rules_by_name.items():
            if rule.reading in (Reading.AS_READ, Reading.DECIMAL) and rule.canonical == pa.string():
                for values in (old_values[name], new_values[name]):
                    plain = pc.and_(plain, pc.invert(pc.fill_null(pc.match_substring_regex(values, _ESCAPED), False)))
        key = (
            _object({name: new_text[name] for name in layout.primary_key}) if layout.primary_key else pa.repeat(_NO_KEY, len(op))
        )
        after_text = pc.if_else(pc.is_valid(after), _object({n: new_text[n] for n in names}), pa.scalar(None, pa.string()))
        new_partition = pc.if_else(pc.is_valid(after), self._partition(new_values, new_text), pa.scalar(None, pa.string()))
        old_partition = self._old_partition(old_values, old_text, new_values, new_text, is_delete, reads_before)
        prior, global_delete, decided = self._prior(op, old_partition, new_partition)
        vector = pc.and_(fine, pc.and_(plain, decided))
        columns = [indices, op, key, pc.cast(after_text, pa.binary()), new_partition, prior, global_delete]
        taken = pa.Table.from_arrays(columns, schema=_OUT).filter(vector)
        rest = pc.and_(fine, pc.invert(vector))
        by_row = self._one_by_one(pc.filter(indices, rest), pc.filter(op, rest), pc.filter(before, rest), pc.filter(after, rest))
        return pa.concat_tables([taken, by_row])

    def _partition(self, values: Mapping[str, pa.Array], text: Mapping[str, pa.Array]) -> pa.Array | str:
        """A row image's partition as orjson writes the tuple (``TableLayout.partition_of``)."""
        parts = []
        for term in self._layout.partition:
            if term.transform == "identity":
                parts.append(text[term.source])
            else:
                source = values[term.source]
                parts.append(
                    pc.if_else(
                        pc.is_valid(source), pc.cast(_floor_divide(source, _MICROS_PER[term.transform]), pa.string()), "null"
                    )
                )
        return _list(parts)

    def _old_partition(
        self,
        old_values: Mapping[str, pa.Array],
        old_text: Mapping[str, pa.Array],
        new_values: Mapping[str, pa.Array],
        new_text: Mapping[str, pa.Array],
        is_delete: pa.Array,
        reads_before: pa.Array,
    ) -> pa.Array:
        """Where an update's or delete's row lived (``batch.old_partition``); null when unknown."""
        if self._layout.key_determines_partition:
            # The key's partition: of the before-image's key values for a delete, the after-image's otherwise.
            by_key = pc.if_else(is_delete, self._partition(old_values, old_text), self._partition(new_values, new_text))
        else:
            by_key = pa.nulls(len(is_delete), pa.string())
        if self._rules.before_image is BeforeImage.FULL:
            return pc.if_else(reads_before, self._partition(old_values, old_text), by_key)
        return by_key

    def _prior(self, op: pa.Array, old: pa.Array, new: pa.Array) -> tuple[pa.Array, pa.Array, pa.Array]:
        """(prior partitions, global delete, whether decided here) as ``batch.to_key_change``
        decides them; the undecided (a dead letter) go record by record."""
        created = pc.is_in(op, _CREATES)
        moved = pc.and_(pc.is_valid(new), pc.not_equal(pc.fill_null(new, ""), pc.fill_null(old, "")))
        has_old = pc.is_valid(old)
        unknown_rule = self._rules.unknown_partition
        none = pa.nulls(len(op), pa.string())
        unknown = new if unknown_rule is UnknownPartition.SAME_PARTITION else none
        first = pc.if_else(created, new, pc.if_else(has_old, old, unknown))
        second = pc.if_else(pc.and_(pc.invert(created), pc.and_(has_old, moved)), new, none)
        unknown_global = unknown_rule is UnknownPartition.GLOBAL_DELETE
        global_delete = pc.if_else(pc.or_(created, has_old), False, unknown_global)
        if unknown_rule is UnknownPartition.GLOBAL_DELETE:
            unknown_decided = pa.array([True] * len(op))
        elif unknown_rule is UnknownPartition.SAME_PARTITION:
            unknown_decided = pc.is_valid(new)
        else:
            unknown_decided = pa.array([False] * len(op))
        decided = pc.fill_null(pc.or_(pc.or_(created, has_old), unknown_decided), False)
        if self._layout.append_only:
            return _lists(none, none), pa.array([False] * len(op)), decided  # a row without a key replaces nothing
        return _lists(first, second), global_delete, decided

    def _one_by_one(self, indices: pa.Array, op: pa.Array, before: pa.Array, after: pa.Array) -> pa.Table:
        """The records the vectorized rendering does not take (a string to escape, a partition
        transform it does not compute, a dead letter to find): ``batch.to_key_change`` and orjson."""
        rows = [
            (index, *row)
            for index, kind, old, new in zip(
                indices.to_pylist(), op.to_pylist(), before.to_pylist(), after.to_pylist(), strict=True
            )
            if (row := self._row(kind, old, new)) is not None
        ]
        return pa.table(
            dict(zip(_OUT.names, zip(*rows, strict=True), strict=True)) if rows else {n: [] for n in _OUT.names}, schema=_OUT
        )

    def _row(self, op: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> tuple[Any, ...] | None:
        layout = self._layout
        image = before if op == "d" else after
        assert image is not None
        key = tuple(image[name] for name in layout.primary_key)
        if op == "d" and after is not None:
            after = {**after, **dict(zip(layout.primary_key, key, strict=True))}  # as ``decode_change`` does
        try:
            change = to_key_change(ChangeEvent(op, key, before, after), layout, self._rules)
        except RejectedEvent:
            return None  # the Python path rejects it, with its detail
        return op, key_text(layout.primary_key, key), *change_columns(layout, change).values()
