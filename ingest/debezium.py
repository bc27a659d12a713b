"""Debezium change events to typed changes of one table. Pure: bytes in, a ChangeEvent or a
Rejection out; it runs on the executors, once per Kafka record.

Column values are decoded from Debezium's default JSON encodings into one canonical, JSON-safe
form per Iceberg type (so they survive Spark's shuffle as JSON and compare exactly):

| Iceberg type          | canonical value                                   |
|-----------------------|---------------------------------------------------|
| int, long             | int                                               |
| float, double         | float (a float32 source into double: its float32) |
| boolean               | bool                                              |
| string                | str                                               |
| decimal(P, S)         | str, quantized to S digits (never rounded)        |
| date                  | int, days since 1970-01-01                        |
| timestamp(tz)         | int, microseconds since 1970-01-01T00:00:00 UTC   |
| binary                | str, base64                                       |

Which Debezium encoding goes into which column type is the table in docs/ingest.md ("Values"):
the Connect schema's logical type names an integer's unit, and integers are taken as
microseconds when there is no schema to say.

Records that are not row changes are told apart, not rejected (``Control``): truncates
(``op: t``), logical decoding messages (``op: m``), heartbeats and transaction metadata.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import decimal
import enum
import functools
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from icecdc.domain.layout import EPOCH_DATE, Column
from icecdc.domain.tablespec import decimal_type
from icecdc.ingest.evolution import source_fields
from icecdc.schemas import DEBEZIUM_ENVELOPE, SchemaError, validator

ROW_OPS = frozenset({"c", "r", "u", "d"})
TRUNCATE, MESSAGE = "t", "m"
OPS = ROW_OPS | {TRUNCATE, MESSAGE}
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
INT_RANGE = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}
# Connect logical type -> how many of its integer units make one microsecond (negative: divide).
TIMESTAMP_UNITS = {
    "io.debezium.time.Timestamp": 1000,
    "org.apache.kafka.connect.data.Timestamp": 1000,
    "io.debezium.time.MicroTimestamp": 1,
    "io.debezium.time.NanoTimestamp": -1000,
}
# A time of day: how many of the logical type's integer units make one microsecond (negative:
# divide). Into a ``long`` column, as microseconds since midnight.
TIME_UNITS = {
    "io.debezium.time.Time": 1000,
    "org.apache.kafka.connect.data.Time": 1000,
    "io.debezium.time.MicroTime": 1,
    "io.debezium.time.NanoTime": -1000,
}
ISO_TIMES = frozenset({"io.debezium.time.ZonedTime", "io.debezium.time.IsoTime"})
CONNECT_DECIMAL = "org.apache.kafka.connect.data.Decimal"
JSON_FLOAT32 = "float"  # the JsonConverter's name for Connect's FLOAT32
_FLOAT32 = struct.Struct("<f")
VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
TRANSACTION_SCHEMA = "io.debezium.connector.common.TransactionMetadataValue"
HEARTBEAT_SCHEMA_SUFFIX = "Heartbeat"  # io.debezium.connector.common.Heartbeat, <prefix>.Heartbeat
# What Debezium sends for a value it does not have (its ``unavailable.value.placeholder``
# default): an out-of-line (TOAST) value an update left alone under REPLICA IDENTITY DEFAULT. A
# text or jsonb column gets the string; a bytea column its bytes (base64 in JSON).
UNAVAILABLE_PLACEHOLDER = "__debezium_unavailable_value"
UNAVAILABLE_PLACEHOLDER_BASE64 = base64.b64encode(UNAVAILABLE_PLACEHOLDER.encode()).decode()
# The headers of a primary-key change: the create of the new key names the old one, the delete
# of the old key the new one (each the key as the key converter wrote it).
OLD_KEY_HEADER, NEW_KEY_HEADER = "__debezium.oldkey", "__debezium.newkey"


class Reason(str, enum.Enum):
    """Why a record went to the dead-letter topic: the value is the ``icecdc.reason`` header and
    the dead-letter counter's label."""

    UNPARSEABLE = "unparseable-json"
    NOT_AN_ENVELOPE = "not-a-debezium-envelope"
    UNKNOWN_OP = "unknown-op"
    MISSING_KEY = "missing-key"
    NULL_KEY = "null-key"
    BAD_VALUE = "bad-value"
    MISSING_PARTITION_VALUE = "missing-partition-value"
    UNKNOWN_TABLE = "unknown-table"
    TRUNCATE = "truncate"  # a truncate, dead-lettered because the table's truncate option says so
    INCOMPATIBLE_SCHEMA = "incompatible-schema-change"  # a source type Iceberg cannot change the column to
    # A value the source did not send (an unchanged TOAST value), dead-lettered by the table's
    # unavailable_values option or because the row has no earlier version to take it from.
    UNAVAILABLE_VALUE = "unavailable-value"
    # An update, a delete or a tombstone of a table without a primary key (an append-only mirror).
    NO_PRIMARY_KEY = "no-primary-key"

    def __str__(self) -> str:
        return self.value  # in headers, labels and messages, not "Reason.NULL_KEY"


@dataclass(frozen=True)
class Rejection:
    reason: Reason
    detail: str

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"


class RejectedEvent(Exception):
    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.rejection = Rejection(reason, detail)


def append_only_rejection(table: str, what: str) -> RejectedEvent:
    """Why ``what`` ("an update", "a delete", "a tombstone") of a table without a primary key is not
    applied: without a key the row it changes cannot be found, and a guess would be wrong."""
    return RejectedEvent(
        Reason.NO_PRIMARY_KEY,
        f"table {table} has no primary key: it is mirrored append-only, updates and deletes cannot be applied ({what})",
    )


class ControlKind(str, enum.Enum):
    """Records on a change topic that are not row changes."""

    TRUNCATE = "truncate"  # op t: the table was emptied
    MESSAGE = "message"  # op m: a logical decoding message (pg_logical_emit_message)
    HEARTBEAT = "heartbeat"  # the connector's heartbeat: {"ts_ms": ...}
    TRANSACTION = "transaction"  # transaction metadata: {"status": "BEGIN" | "END", "id": ...}


@dataclass(frozen=True)
class Control:
    kind: ControlKind
    lsn: int | None = None  # a truncate's position in the source's log (``source_lsn``)


@dataclass(frozen=True)
class ChangeEvent:
    """One change to one row, values in canonical form."""

    op: str
    key: tuple[Any, ...]
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    # The row struct's fields and their Iceberg types, from the Connect schema wrapper (empty
    # without one): what the source's columns are now (``evolution``).
    schema_fields: tuple[tuple[str, str | None], ...] = ()
    # Without a wrapper: the after-image's fields the table has no column for, with their values.
    extra: Mapping[str, Any] = field(default_factory=dict)


def _bad(column: Column, value: Any, why: str) -> RejectedEvent:
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    return RejectedEvent(Reason.BAD_VALUE, f"column {column.name!r} ({column.type}): {shown} {why}")


def _iso_time_micros(text: str) -> int:
    """Microseconds since midnight of an ISO-8601 time (``ZonedTime`` "10:15:30.123456Z" is UTC)."""
    parsed = dt.time.fromisoformat(text.strip().removesuffix("Z"))
    return ((parsed.hour * 60 + parsed.minute) * 60 + parsed.second) * 1_000_000 + parsed.microsecond


def _iso_micros(text: str) -> int:
    parsed = dt.datetime.fromisoformat(text.strip().replace(" ", "T", 1))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.timezone.utc)
    delta = parsed - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


@functools.cache
def decimal_shape(iceberg_type: str) -> tuple[int, int, re.Pattern[str]]:
    shape = decimal_type(iceberg_type)
    if shape is None:
        raise ValueError(f"not a decimal type: {iceberg_type!r}")
    precision, scale = shape.precision, shape.scale
    # Already canonical: exactly `scale` decimals and no more digits than the precision allows.
    integer_digits = precision - scale
    integer = "0" if integer_digits == 0 else f"(0|[1-9]\\d{{0,{integer_digits - 1}}})"
    fraction = f"\\.\\d{{{scale}}}" if scale else ""
    return precision, scale, re.compile(f"^-?{integer}{fraction}$")


# Decimal arithmetic rounds to its context's precision, 28 digits by default: Iceberg's decimals
# have up to 38, and PostgreSQL's unconstrained numeric any number.
_WIDE = decimal.Context(prec=2 * 38)


def _scaled(unscaled: int, scale: int) -> decimal.Decimal:
    """``unscaled`` * 10^-``scale``, every digit kept (built from text: no context rounds it)."""
    return decimal.Decimal(f"{unscaled}E{-scale}")


def _variable_scale(value: Mapping[str, Any]) -> decimal.Decimal:
    """A VariableScaleDecimal: {"scale": 2, "value": base64 of the unscaled big-endian integer}."""
    unscaled = int.from_bytes(base64.b64decode(value["value"], validate=True), "big", signed=True)
    return _scaled(unscaled, int(value["scale"]))


def _decimal(column: Column, value: Any, logical: Mapping[str, Any] | None) -> str:
    precision, scale, canonical = decimal_shape(column.type)
    if type(value) is str and canonical.match(value):
        return value  # the common case (Debezium's string decimal mode), checked without Decimal
    try:
        if isinstance(value, bool):
            raise TypeError
        if isinstance(value, Mapping):
            number = _variable_scale(value)
        elif isinstance(value, str) and logical is not None and logical.get("name") == CONNECT_DECIMAL:
            # precise mode: base64 big-endian two's-complement unscaled value, scale in parameters
            unscaled = int.from_bytes(base64.b64decode(value, validate=True), "big", signed=True)
            number = _scaled(unscaled, int(logical.get("parameters", {}).get("scale", 0)))
        elif isinstance(value, (int, str)):
            number = decimal.Decimal(value)
        elif isinstance(value, float):
            number = decimal.Decimal(repr(value))
        else:
            raise TypeError
    except (TypeError, ValueError, KeyError, decimal.InvalidOperation, binascii.Error):
        raise _bad(column, value, "is not a decimal") from None
    if not number.is_finite():
        raise _bad(column, value, "is not a finite decimal")
    # Checked before quantizing: a huge value would overflow even the wide context.
    if number != 0 and number.adjusted() + 1 > precision - scale:
        raise _bad(column, value, f"does not fit precision {precision}")
    quantized = number.quantize(_scaled(1, scale), context=_WIDE)
    if quantized != number:
        raise _bad(column, value, f"has more than {scale} decimal places")
    if len(quantized.as_tuple().digits) > precision and quantized != 0:
        raise _bad(column, value, f"does not fit precision {precision}")
    return str(quantized)


def decode_value(column: Column, value: Any, logical: Mapping[str, Any] | None = None) -> Any:
    """Decode one Debezium JSON value to the canonical form of ``column.type`` (None stays None)."""
    if value is None:
        return None
    kind = column.type
    name = logical.get("name", "") if logical else ""
    if kind == "long" and (name in TIME_UNITS or name in ISO_TIMES):
        value = _time_of_day(column, value, name)  # a string column takes the ISO text as it came
    if kind in INT_RANGE:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _bad(column, value, "is not an integer")
        low, high = INT_RANGE[kind]
        if not low <= value <= high:
            raise _bad(column, value, f"is out of range for {kind}")
        return value
    if kind in ("float", "double"):
        if isinstance(value, Mapping) and name == VARIABLE_SCALE_DECIMAL:
            try:
                return float(_variable_scale(value))
            except (TypeError, ValueError, KeyError, decimal.InvalidOperation, binascii.Error):
                raise _bad(column, value, "is not a decimal") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _bad(column, value, "is not a number")
        if kind == "double" and logical is not None and logical.get("type") == JSON_FLOAT32:
            # A float32 is sent as its shortest text ("0.1"); a double column takes the float32
            # itself (0.10000000149011612), as PostgreSQL's real -> double precision does.
            try:
                return float(_FLOAT32.unpack(_FLOAT32.pack(value))[0])
            except OverflowError:
                raise _bad(column, value, "is out of range for a float32") from None
        return float(value)
    if kind == "boolean":
        if not isinstance(value, bool):
            raise _bad(column, value, "is not a boolean")
        return value
    if kind == "string":
        if isinstance(value, Mapping) and name == VARIABLE_SCALE_DECIMAL:
            try:
                return format(_variable_scale(value), "f")  # PostgreSQL's text: 0.0000001, not 1E-7
            except (TypeError, ValueError, KeyError, decimal.InvalidOperation, binascii.Error):
                raise _bad(column, value, "is not a decimal") from None
        if not isinstance(value, str):
            raise _bad(column, value, "is not a string")
        return value
    if kind.startswith("decimal("):
        return _decimal(column, value, logical)
    if kind == "date":
        if isinstance(value, bool):
            raise _bad(column, value, "is not a date")
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return (dt.date.fromisoformat(value.strip()[:10]) - EPOCH_DATE).days
            except ValueError:
                pass
        raise _bad(column, value, "is not a date (epoch days or ISO-8601)")
    if kind in ("timestamp", "timestamptz"):
        if isinstance(value, bool):
            raise _bad(column, value, "is not a timestamp")
        if isinstance(value, int):
            unit = TIMESTAMP_UNITS.get(logical.get("name", "") if logical else "", 1)
            return value * unit if unit > 0 else value // -unit
        if isinstance(value, str):
            try:
                return _iso_micros(value)
            except ValueError:
                pass
        raise _bad(column, value, "is not a timestamp (epoch integer or ISO-8601)")
    if kind == "binary":
        if not isinstance(value, str):
            raise _bad(column, value, "is not base64 bytes")
        try:
            base64.b64decode(value, validate=True)
        except ValueError:  # binascii.Error, and non-ASCII text (which b64decode refuses before decoding)
            raise _bad(column, value, "is not base64 bytes") from None
        return value
    raise _bad(column, value, f"has an unsupported column type {kind}")


def _time_of_day(column: Column, value: Any, name: str) -> int:
    """Microseconds since midnight of a Debezium time of day."""
    if isinstance(value, str):
        try:
            return _iso_time_micros(value)
        except ValueError:
            raise _bad(column, value, "is not a time of day (ISO-8601)") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(column, value, "is not a time of day")
    unit = TIME_UNITS.get(name, 1)
    return value * unit if unit > 0 else value // -unit


def logical_types(schema: Any) -> dict[str, Mapping[str, Any]]:
    """column -> Connect field schema ({name, parameters}) from a wrapper's before/after struct,
    for the fields whose schema says more than their JSON value: a logical type, or a float32."""
    types: dict[str, Mapping[str, Any]] = {}
    if not isinstance(schema, Mapping):
        return types
    for image in schema.get("fields") or ():
        if isinstance(image, Mapping) and image.get("field") in ("after", "before"):
            for field in image.get("fields") or ():
                if isinstance(field, Mapping) and (field.get("name") or field.get("type") == JSON_FLOAT32) and field.get("field"):
                    types.setdefault(field["field"], field)
    return types


def _decode_row(row: Mapping[str, Any], columns: Sequence[Column], logical: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The row's values for the table's columns; columns the event does not carry are absent
    (not None), so callers can tell 'null' from 'not sent'. Extra source columns are ignored."""
    return {c.name: decode_value(c, row[c.name], logical.get(c.name)) for c in columns if c.name in row}


def parse_json(data: bytes | None) -> Any:
    try:
        return orjson.loads(data) if data is not None else None
    except orjson.JSONDecodeError as exc:
        raise RejectedEvent(Reason.UNPARSEABLE, str(exc)) from None


def _unwrap(document: Any) -> tuple[Any, Any]:
    """(payload, schema) for both the bare and the {schema, payload} forms."""
    if isinstance(document, Mapping) and "payload" in document and "schema" in document:
        return document["payload"], document["schema"]
    return document, None


def _looks_like_payload(payload: Any, op: Any) -> bool:
    """The schema's payload rules, hand-written for the hot path (checking the schema itself costs
    a third of a record's parse time); anything this rejects is then checked against the schema
    for the error message. ``tests/unit/test_debezium.py`` holds both to the same verdicts."""
    if not isinstance(payload, Mapping) or not isinstance(op, str) or op not in OPS:
        return False
    before, after = payload.get("before"), payload.get("after")
    if not (before is None or isinstance(before, Mapping)) or not (after is None or isinstance(after, Mapping)):
        return False
    if "source" in payload and not isinstance(payload["source"], Mapping):
        return False
    if "transaction" in payload and not (payload["transaction"] is None or isinstance(payload["transaction"], Mapping)):
        return False
    for stamp in ("ts_ms", "ts_us", "ts_ns"):
        value = payload.get(stamp)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            return False
    if op not in ROW_OPS:
        return True  # a truncate or a message: no row image
    return isinstance(before, Mapping) if op == "d" else isinstance(after, Mapping)


def control_kind(payload: Any, schema: Any) -> ControlKind | None:
    """What a record that is not a row change is, or None for a row change (or garbage)."""
    if not isinstance(payload, Mapping):
        return None
    op = payload.get("op")
    if op == TRUNCATE:
        return ControlKind.TRUNCATE
    if op == MESSAGE:
        return ControlKind.MESSAGE
    if "op" in payload:
        return None
    name = schema.get("name") if isinstance(schema, Mapping) else None
    if (payload.get("status") in ("BEGIN", "END") and "id" in payload) or name == TRANSACTION_SCHEMA:
        return ControlKind.TRANSACTION
    if (payload and set(payload) <= {"ts_ms"}) or (isinstance(name, str) and name.endswith(HEARTBEAT_SCHEMA_SUFFIX)):
        return ControlKind.HEARTBEAT
    return None


def source_lsn(payload: Mapping[str, Any]) -> int | None:
    """Where an event is in PostgreSQL's write-ahead log (``source.lsn``, an int64), or None when
    the connector sends no such number (MySQL's binlog file and position; SQL Server's and Db2's
    LSNs are strings, and are not read)."""
    source = payload.get("source")
    lsn = source.get("lsn") if isinstance(source, Mapping) else None
    return lsn if isinstance(lsn, int) and not isinstance(lsn, bool) else None


@dataclass(frozen=True)
class Envelope:
    """A change record's JSON, unwrapped: its payload, its Connect schema (None without the
    wrapper), and the row struct's fields with their Iceberg types (``evolution.source_fields``)."""

    payload: Mapping[str, Any]
    schema: Any
    fields: tuple[tuple[str, str | None], ...] = ()


def read_envelope(value: bytes) -> Envelope | Control:
    """A record's value (not a tombstone) as an envelope to decode, or what else it is. Raises
    RejectedEvent for what is no Debezium envelope."""
    payload, schema = _unwrap(parse_json(value))
    control = control_kind(payload, schema)
    if control is ControlKind.TRUNCATE:
        return Control(control, source_lsn(payload))
    if control is not None:
        return Control(control)
    op = payload.get("op") if isinstance(payload, Mapping) else None
    if isinstance(payload, Mapping) and "op" in payload and not (isinstance(op, str) and op in OPS):
        raise RejectedEvent(Reason.UNKNOWN_OP, f"op {op!r} is not one of c, r, u, d, t, m")
    if not _looks_like_payload(payload, op):
        # Only a record that fails the quick check pays for the schema, which says what is wrong.
        try:
            validator(DEBEZIUM_ENVELOPE, "payload")(payload)
        except SchemaError as exc:
            raise RejectedEvent(Reason.NOT_AN_ENVELOPE, exc.message) from None
    return Envelope(payload, schema, source_fields(schema))


def decode_change(key: bytes | None, envelope: Envelope, columns: Sequence[Column], primary_key: Sequence[str]) -> ChangeEvent:
    """The row change an envelope holds, its values decoded for the table's columns. Raises
    RejectedEvent."""
    payload, op = envelope.payload, envelope.payload["op"]
    logical = logical_types(envelope.schema)
    before = _decode_row(payload["before"], columns, logical) if payload.get("before") is not None else None
    after = _decode_row(payload["after"], columns, logical) if payload.get("after") is not None else None
    image = before if op == "d" else after
    if image is None:  # unreachable past the envelope check; kept so a bad record can never crash a batch
        raise RejectedEvent(Reason.NOT_AN_ENVELOPE, f"op {op!r} without its row image")
    # An after-image always carries the key (Debezium never sends one without it): one that does
    # not is malformed, and taking the key from the record key would overwrite the real row with
    # nulls. A delete's before-image may lack it (REPLICA IDENTITY NOTHING), the record key may not.
    key_values = _primary_key(key if op == "d" else None, image, columns, primary_key)
    if after is not None:
        after = {**after, **dict(zip(primary_key, key_values, strict=True))}
    extra: dict[str, Any] = {}
    if not envelope.fields and payload.get("after") is not None:
        names = {c.name for c in columns}
        extra = {k: v for k, v in payload["after"].items() if k not in names}
    return ChangeEvent(str(op), key_values, before, after, envelope.fields, extra)


def unavailable_columns(after: Mapping[str, Any], columns: Sequence[Column]) -> frozenset[str]:
    """The columns of a decoded after-image that hold Debezium's placeholder (text and binary
    columns only: an identity check of one string per such column)."""
    found = [
        c.name
        for c in columns
        if (c.type == "string" and after.get(c.name) == UNAVAILABLE_PLACEHOLDER)
        or (c.type == "binary" and after.get(c.name) == UNAVAILABLE_PLACEHOLDER_BASE64)
    ]
    return frozenset(found)


def key_from_header(value: bytes | None, columns: Sequence[Column], primary_key: Sequence[str]) -> tuple[Any, ...] | None:
    """The key a key-change header names (the key converter's JSON, schema-wrapped or not), or
    None when it cannot be read."""
    try:
        payload, _ = _unwrap(parse_json(value)) if value is not None else (None, None)
        if not isinstance(payload, Mapping):
            return None
        by_name = {c.name: c for c in columns}
        return tuple(decode_value(by_name[name], payload[name]) for name in primary_key)
    except (RejectedEvent, KeyError):
        return None


def parse_change(key: bytes | None, value: bytes, columns: Sequence[Column], primary_key: Sequence[str]) -> ChangeEvent | Control:
    """Parse one Debezium record (the value must not be a tombstone): a row change, or what
    else it is. Raises RejectedEvent."""
    envelope = read_envelope(value)
    return envelope if isinstance(envelope, Control) else decode_change(key, envelope, columns, primary_key)


def _primary_key(
    key: bytes | None, image: Mapping[str, Any], columns: Sequence[Column], primary_key: Sequence[str]
) -> tuple[Any, ...]:
    """The primary key from the row image, falling back to the Kafka key (Debezium keys records
    by primary key, and some connectors send delete before-images without every column)."""
    by_name = {c.name: c for c in columns}
    kafka_key: Mapping[str, Any] | None = None
    values = []
    for name in primary_key:
        if name in image:
            value = image[name]
        else:
            if kafka_key is None:
                try:
                    payload, _ = _unwrap(parse_json(key)) if key is not None else ({}, None)
                except RejectedEvent:
                    payload = {}
                kafka_key = payload if isinstance(payload, Mapping) else {}
            if name not in kafka_key:
                where = "the row image nor the record key" if key is not None else "the after-image"
                raise RejectedEvent(Reason.MISSING_KEY, f"primary key column {name!r} is not in {where}")
            value = decode_value(by_name[name], kafka_key[name])
        if value is None:
            raise RejectedEvent(Reason.NULL_KEY, f"primary key column {name!r} is null")
        values.append(value)
    return tuple(values)
