import base64

import hypothesis.strategies as st
import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings

from icecdc.domain.layout import Column
from icecdc.ingest.debezium import (
    ChangeEvent,
    Control,
    ControlKind,
    Envelope,
    Reason,
    RejectedEvent,
    _looks_like_payload,
    decode_change,
    decode_value,
    parse_change,
    read_envelope,
    source_lsn,
)
from icecdc.schemas import DEBEZIUM_ENVELOPE, SchemaError, validator

VARIABLE_SCALE = {"name": "io.debezium.data.VariableScaleDecimal"}
CONNECT_DECIMAL_2 = {"name": "org.apache.kafka.connect.data.Decimal", "parameters": {"scale": "2"}}

COLUMNS = (
    Column("id", "long", True),
    Column("region", "string"),
    Column("amount", "decimal(10, 2)"),
    Column("updated_at", "timestamp"),
    Column("day", "date"),
    Column("ok", "boolean"),
    Column("score", "double"),
)
KEY = ("id",)


def dump(document) -> bytes:
    return orjson.dumps(document)


def test_bare_envelope_update():
    event = parse_change(
        b'{"id": 1}',
        dump(
            {
                "op": "u",
                "before": {"id": 1, "region": "eu"},
                "after": {"id": 1, "region": "us", "amount": "12.5", "extra": 1},
            }
        ),
        COLUMNS,
        KEY,
    )
    assert event.op == "u" and event.key == (1,)
    assert event.before == {"id": 1, "region": "eu"}
    # Extra source columns are ignored; decimals are quantized to the column's scale.
    assert event.after == {"id": 1, "region": "us", "amount": "12.50"}


def test_wrapped_envelope_uses_logical_types():
    schema = {
        "type": "struct",
        "fields": [
            {"field": "before", "type": "struct", "fields": []},
            {
                "field": "after",
                "type": "struct",
                "fields": [
                    {"field": "updated_at", "type": "int64", "name": "io.debezium.time.Timestamp"},
                    {"field": "day", "type": "int32", "name": "io.debezium.time.Date"},
                    {
                        "field": "amount",
                        "type": "bytes",
                        "name": "org.apache.kafka.connect.data.Decimal",
                        "parameters": {"scale": "2"},
                    },
                ],
            },
        ],
    }
    unscaled = (12345).to_bytes(2, "big", signed=True)
    value = dump(
        {
            "schema": schema,
            "payload": {
                "op": "c",
                "after": {
                    "id": 7,
                    "updated_at": 1_735_787_045_123,
                    "day": 20090,
                    "amount": base64.b64encode(unscaled).decode(),
                },
            },
        }
    )
    event = parse_change(None, value, COLUMNS, KEY)
    assert event.after == {"id": 7, "updated_at": 1_735_787_045_123_000, "day": 20090, "amount": "123.45"}


@pytest.mark.parametrize(
    ("logical", "raw", "micros"),
    [
        (None, 1_700_000_000_123_456, 1_700_000_000_123_456),  # no schema: microseconds
        ("io.debezium.time.Timestamp", 1_700_000_000_123, 1_700_000_000_123_000),
        ("io.debezium.time.MicroTimestamp", 1_700_000_000_123_456, 1_700_000_000_123_456),
        ("io.debezium.time.NanoTimestamp", 1_700_000_000_123_456_789, 1_700_000_000_123_456),
        ("io.debezium.time.ZonedTimestamp", "2023-11-14T22:13:20.123456Z", 1_700_000_000_123_456),
        (None, "2023-11-14T23:13:20.123456+01:00", 1_700_000_000_123_456),
        (None, "2023-11-14 22:13:20.123456", 1_700_000_000_123_456),
    ],
)
def test_timestamps(logical, raw, micros):
    column = Column("t", "timestamp")
    assert decode_value(column, raw, {"name": logical} if logical else None) == micros
    assert decode_value(Column("t", "timestamptz"), raw, {"name": logical} if logical else None) == micros


@pytest.mark.parametrize(
    ("column", "raw", "expected"),
    [
        (Column("d", "date"), 20090, 20090),
        (Column("d", "date"), "2025-01-02", 20090),
        (Column("x", "decimal(5, 2)"), 12.5, "12.50"),
        (Column("x", "decimal(5, 2)"), "-0.1", "-0.10"),
        (Column("x", "decimal(5, 2)"), 3, "3.00"),
        (Column("x", "double"), 3, 3.0),
        (Column("x", "float"), 1.5, 1.5),
        (Column("x", "int"), -5, -5),
        (Column("x", "boolean"), False, False),
        (Column("x", "binary"), "AAE=", "AAE="),
        (Column("x", "string"), None, None),
    ],
)
def test_values(column, raw, expected):
    assert decode_value(column, raw) == expected


@pytest.mark.parametrize(
    ("column", "raw", "why"),
    [
        (Column("x", "long"), "12", "is not an integer"),
        (Column("x", "long"), True, "is not an integer"),
        (Column("x", "long"), 1.5, "is not an integer"),
        (Column("x", "int"), 2**31, "out of range for int"),
        (Column("x", "decimal(5, 2)"), "1.234", "more than 2 decimal places"),
        (Column("x", "decimal(5, 2)"), "12345.6", "does not fit precision 5"),
        (Column("x", "decimal(12, 2)"), 1e26, "does not fit precision 12"),  # beyond the quantize context
        (Column("x", "decimal(5, 2)"), "abc", "is not a decimal"),
        (Column("x", "decimal(5, 2)"), "NaN", "not a finite decimal"),
        (Column("x", "string"), 5, "is not a string"),
        (Column("x", "boolean"), "true", "is not a boolean"),
        (Column("x", "timestamp"), "yesterday", "is not a timestamp"),
        (Column("x", "date"), "02/01/2025", "is not a date"),
        (Column("x", "binary"), "%%%", "is not base64"),
        (Column("x", "binary"), "AAé=", "is not base64"),  # non-ASCII: b64decode's ValueError, not binascii.Error
    ],
)
def test_bad_values_are_rejected_with_the_column(column, raw, why):
    with pytest.raises(RejectedEvent) as info:
        decode_value(column, raw)
    assert info.value.rejection.reason == Reason.BAD_VALUE
    assert "column 'x'" in info.value.rejection.detail and why in info.value.rejection.detail


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"{not json", Reason.UNPARSEABLE),
        (b'{"op": "x", "after": {"id": 1}}', Reason.UNKNOWN_OP),
        (b'{"op": "c"}', Reason.NOT_AN_ENVELOPE),
        (b'{"op": "c", "after": {"region": "eu"}}', Reason.MISSING_KEY),
        (b'{"op": "c", "after": {"id": null}}', Reason.NULL_KEY),
        (b'{"op": "c", "after": {"id": 1, "score": "high"}}', Reason.BAD_VALUE),
        (b"[1, 2]", Reason.NOT_AN_ENVELOPE),
        (b'{"op": {}, "after": {"id": 1}}', Reason.UNKNOWN_OP),
    ],
)
def test_rejections(value, reason):
    with pytest.raises(RejectedEvent) as info:
        parse_change(None, value, COLUMNS, KEY)
    assert info.value.rejection.reason == reason


def test_reasons_are_the_dead_letter_headers_as_they_were():
    # Consumers of the dead-letter topic filter on these values: they never change.
    assert {reason.name: str(reason) for reason in Reason} == {
        "UNPARSEABLE": "unparseable-json",
        "NOT_AN_ENVELOPE": "not-a-debezium-envelope",
        "UNKNOWN_OP": "unknown-op",
        "MISSING_KEY": "missing-key",
        "NULL_KEY": "null-key",
        "BAD_VALUE": "bad-value",
        "MISSING_PARTITION_VALUE": "missing-partition-value",
        "UNKNOWN_TABLE": "unknown-table",
        "TRUNCATE": "truncate",
        "INCOMPATIBLE_SCHEMA": "incompatible-schema-change",
        "UNAVAILABLE_VALUE": "unavailable-value",
        "NO_PRIMARY_KEY": "no-primary-key",
    }
    rejected = RejectedEvent(Reason.NULL_KEY, "primary key column 'id' is null")
    assert str(rejected) == str(rejected.rejection) == "null-key: primary key column 'id' is null"
    # the header's bytes, and the column of the parse stage's Arrow batch
    assert Reason.NULL_KEY.encode() == b"null-key"
    assert pa.array([Reason.NULL_KEY]).to_pylist() == ["null-key"]


def test_delete_key_falls_back_to_the_record_key():
    event = parse_change(b'{"schema": {}, "payload": {"id": 9}}', b'{"op": "d", "before": {"region": "eu"}}', COLUMNS, KEY)
    assert event.op == "d" and event.key == (9,) and event.after is None


_json_values = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=2), st.just({}), st.just({"id": 1}), st.just([])
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(
        st.sampled_from(["op", "before", "after", "source", "ts_ms", "ts_us", "transaction", "x"]),
        st.one_of(st.sampled_from(["c", "r", "u", "d", "t"]), _json_values),
        max_size=6,
    )
)
def test_quick_envelope_check_never_accepts_what_the_schema_rejects(payload):
    try:
        validator(DEBEZIUM_ENVELOPE, "payload")(payload)
        schema_ok = True
    except SchemaError:
        schema_ok = False
    assert _looks_like_payload(payload, payload.get("op")) == schema_ok


_json = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**63 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=5),
    ),
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(st.text(max_size=3), children, max_size=3)),
    max_leaves=10,
)
_rows = st.dictionaries(st.sampled_from([c.name for c in COLUMNS] + ["other"]), _json, max_size=5)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    op=st.one_of(st.sampled_from(["c", "r", "u", "d"]), _json),
    before=st.one_of(st.none(), _rows),
    after=st.one_of(st.none(), _rows),
    wrapped=st.booleans(),
    key=st.one_of(st.none(), st.binary(max_size=8)),
)
def test_any_json_is_parsed_or_rejected_never_crashes(op, before, after, wrapped, key):
    payload = {"op": op, "before": before, "after": after}
    document = (
        {
            "schema": {"fields": [{"field": "after", "fields": [{"field": "updated_at", "name": "io.debezium.time.Timestamp"}]}]},
            "payload": payload,
        }
        if wrapped
        else payload
    )
    try:
        event = parse_change(key, orjson.dumps(document), COLUMNS, KEY)
    except RejectedEvent:
        return
    assert event.op in {"c", "r", "u", "d"} and event.key[0] is not None


@pytest.mark.parametrize(
    ("kind", "raw", "expected"),
    [
        ("decimal(12, 2)", "0.50", "0.50"),
        ("decimal(12, 2)", "-12.30", "-12.30"),
        ("decimal(12, 2)", "1234567890.12", "1234567890.12"),
        ("decimal(12, 2)", "1.5", "1.50"),  # not canonical yet: the full path pads it
        ("decimal(12, 2)", "012.30", "12.30"),
        ("decimal(12, 2)", "12345678901.12", None),
        ("decimal(2, 2)", "0.12", "0.12"),
        ("decimal(2, 2)", "1.23", None),
        ("decimal(5, 0)", "12345", "12345"),
        ("decimal(5, 0)", "123456", None),
    ],
)
def test_decimal_strings_fast_and_full_paths_agree(kind, raw, expected):
    column = Column("x", kind)
    if expected is None:
        with pytest.raises(RejectedEvent):
            decode_value(column, raw)
    else:
        assert decode_value(column, raw) == expected


def _unscaled(number: int) -> str:
    return base64.b64encode(number.to_bytes((number.bit_length() + 8) // 8, "big", signed=True)).decode()


@pytest.mark.parametrize(
    ("kind", "value", "logical", "expected"),
    [
        # PostgreSQL's unconstrained numeric (VariableScaleDecimal) keeps every digit, as its own text.
        (
            "string",
            {"scale": 1, "value": _unscaled(1234567890123456789012345678905)},
            VARIABLE_SCALE,
            "123456789012345678901234567890.5",
        ),
        ("string", {"scale": 7, "value": _unscaled(1)}, VARIABLE_SCALE, "0.0000001"),
        ("string", {"scale": 0, "value": _unscaled(-1000)}, VARIABLE_SCALE, "-1000"),
        # A Connect Decimal wider than Python's default 28 digits.
        (
            "decimal(38, 2)",
            _unscaled(12345678901234567890123456789012345678),
            CONNECT_DECIMAL_2,
            "123456789012345678901234567890123456.78",
        ),
        (
            "decimal(38, 6)",
            {"scale": 1, "value": _unscaled(1234567890123456789012345678905)},
            VARIABLE_SCALE,
            "123456789012345678901234567890.500000",
        ),
    ],
)
def test_wide_and_tiny_decimals_keep_every_digit(kind, value, logical, expected):
    assert decode_value(Column("x", kind), value, logical) == expected


@pytest.mark.parametrize(
    ("kind", "field", "value", "expected"),
    [
        # A real (float32) into a double column: the float32 itself, as PostgreSQL widens it.
        ("double", {"type": "float"}, 0.1, 0.10000000149011612),
        ("double", {"type": "double"}, 0.1, 0.1),
        ("float", {"type": "float"}, 0.1, 0.1),  # the float32 column rounds it when written
    ],
)
def test_a_float32_into_a_double_column_is_the_float32s_value(kind, field, value, expected):
    schema = {"fields": [{"field": "after", "fields": [{**field, "field": "x"}]}]}
    envelope = Envelope({"op": "c", "after": {"id": 1, "x": value}}, schema)
    event = decode_change(None, envelope, [Column("id", "int", True), Column("x", kind)], ["id"])
    assert event.after == {"id": 1, "x": expected}


# ---- records that are not row changes, and every Debezium type ------------------------------

SOURCE = {"version": "2.7.0.Final", "connector": "postgresql", "name": "shop", "db": "shop", "schema": "public", "table": "t"}


@pytest.mark.parametrize(
    ("document", "kind"),
    [
        # A truncate: no before or after (PostgreSQL, skipped.operations=none).
        ({"source": SOURCE, "op": "t", "ts_ms": 1559033904863, "transaction": None}, ControlKind.TRUNCATE),
        # A logical decoding message (pg_logical_emit_message), routed to a table topic.
        (
            {"op": "m", "ts_ms": 1559033904961, "source": SOURCE, "message": {"prefix": "foo", "content": "Ymfy"}},
            ControlKind.MESSAGE,
        ),
        # A heartbeat, with its schema wrapper.
        (
            {
                "schema": {
                    "type": "struct",
                    "fields": [{"type": "int64", "optional": False, "field": "ts_ms"}],
                    "optional": False,
                    "name": "io.debezium.connector.common.Heartbeat",
                },
                "payload": {"ts_ms": 1588252618953},
            },
            ControlKind.HEARTBEAT,
        ),
        # Transaction metadata (provide.transaction.metadata=true).
        (
            {"status": "BEGIN", "id": "571:53195829", "ts_ms": 1486500577125, "event_count": None, "data_collections": None},
            ControlKind.TRANSACTION,
        ),
    ],
)
def test_records_that_are_not_row_changes_are_told_apart(document, kind):
    assert parse_change(None, dump(document), COLUMNS, KEY) == Control(kind)


@pytest.mark.parametrize(
    ("source", "lsn"),
    [
        ({**SOURCE, "lsn": 24023128, "sequence": '["24023064","24023128"]', "txId": 555}, 24023128),  # PostgreSQL
        ({**SOURCE, "connector": "mysql", "file": "mysql-bin.000003", "pos": 154}, None),  # a binlog position
        ({**SOURCE, "connector": "sqlserver", "change_lsn": "00000027:00000758:0005"}, None),
        ({**SOURCE, "lsn": "24023128"}, None),  # not PostgreSQL's int64
        ({**SOURCE, "lsn": True}, None),
        ({**SOURCE, "lsn": None}, None),
        (None, None),  # no source block
    ],
)
def test_the_source_lsn_is_postgresql_s_int64_or_none(source, lsn):
    block = {"source": source} if source is not None else {}
    envelope = read_envelope(dump({"schema": {}, "payload": {"op": "c", "after": {"id": 1}, **block}}))
    assert source_lsn(envelope.payload) == lsn
    truncate = {"op": "t", "ts_ms": 1559033904863, **block}
    assert parse_change(None, dump(truncate), COLUMNS, KEY) == Control(ControlKind.TRUNCATE, lsn)


def test_an_after_image_without_its_key_is_malformed_even_with_a_record_key():
    with pytest.raises(RejectedEvent) as info:
        parse_change(b'{"id": 4}', dump({"op": "u", "before": None, "after": {"region": "eu"}}), COLUMNS, KEY)
    assert info.value.rejection.reason == Reason.MISSING_KEY and "after-image" in info.value.rejection.detail


def field(name: str, kind: str, logical: str | None = None, **parameters: str) -> dict:
    document = {"type": kind, "optional": True, "field": name}
    if logical:
        document["name"] = logical
        document["version"] = 1
    if parameters:
        document["parameters"] = parameters
    return document


TYPED = (
    Column("id", "long", True),
    Column("d", "date"),
    Column("t_ms", "long"),
    Column("t_us", "long"),
    Column("t_ns", "long"),
    Column("t_zoned", "long"),
    Column("t_text", "string"),
    Column("ts_ms", "timestamp"),
    Column("ts_us", "timestamp"),
    Column("ts_ns", "timestamp"),
    Column("ts_zoned", "timestamptz"),
    Column("price", "decimal(10, 2)"),
    Column("ratio", "decimal(12, 4)"),
    Column("ratio_text", "string"),
    Column("ratio_double", "double"),
    Column("uid", "string"),
    Column("doc", "string"),
    Column("mood", "string"),
    Column("flags", "binary"),
    Column("ok", "boolean"),
    Column("raw", "binary"),
)


def test_every_debezium_encoding_lands_in_its_column_type():
    """One PostgreSQL row in Debezium's default JSON encodings, schema wrapper and all, as its
    documentation shows each type (time.precision.mode adaptive_time_microseconds, decimal
    handling precise)."""
    schema_fields = [
        field("id", "int64"),
        field("d", "int32", "io.debezium.time.Date"),
        field("t_ms", "int32", "io.debezium.time.Time"),
        field("t_us", "int64", "io.debezium.time.MicroTime"),
        field("t_ns", "int64", "io.debezium.time.NanoTime"),
        field("t_zoned", "string", "io.debezium.time.ZonedTime"),
        field("t_text", "string", "io.debezium.time.ZonedTime"),
        field("ts_ms", "int64", "io.debezium.time.Timestamp"),
        field("ts_us", "int64", "io.debezium.time.MicroTimestamp"),
        field("ts_ns", "int64", "io.debezium.time.NanoTimestamp"),
        field("ts_zoned", "string", "io.debezium.time.ZonedTimestamp"),
        field("price", "bytes", "org.apache.kafka.connect.data.Decimal", scale="2", **{"connect.decimal.precision": "10"}),
        {
            "type": "struct",
            "fields": [
                {"type": "int32", "optional": False, "field": "scale"},
                {"type": "bytes", "optional": False, "field": "value"},
            ],
            "optional": True,
            "name": "io.debezium.data.VariableScaleDecimal",
            "version": 1,
            "doc": "Variable scaled decimal",
            "field": "ratio",
        },
        {**field("ratio_text", "struct", "io.debezium.data.VariableScaleDecimal"), "fields": []},
        {**field("ratio_double", "struct", "io.debezium.data.VariableScaleDecimal"), "fields": []},
        field("uid", "string", "io.debezium.data.Uuid"),
        field("doc", "string", "io.debezium.data.Json"),
        field("mood", "string", "io.debezium.data.Enum", allowed="happy,sad"),
        field("flags", "bytes", "io.debezium.data.Bits", length="3"),
        field("ok", "boolean"),
        field("raw", "bytes"),
    ]
    envelope = {
        "type": "struct",
        "name": "shop.public.t.Envelope",
        "fields": [
            {"type": "struct", "fields": schema_fields, "optional": True, "field": "before"},
            {"type": "struct", "fields": schema_fields, "optional": True, "field": "after"},
        ],
    }
    scaled = {"scale": 3, "value": base64.b64encode((12345).to_bytes(2, "big", signed=True)).decode()}  # 12.345
    after = {
        "id": 1,
        "d": 20090,  # 2025-01-02
        "t_ms": 37_230_500,  # 10:20:30.5
        "t_us": 37_230_500_000,
        "t_ns": 37_230_500_000_123,
        "t_zoned": "10:20:30.5Z",
        "t_text": "10:20:30.5Z",
        "ts_ms": 1_735_787_045_123,
        "ts_us": 1_735_787_045_123_456,
        "ts_ns": 1_735_787_045_123_456_789,
        "ts_zoned": "2025-01-02T03:04:05.123456Z",
        "price": base64.b64encode((12345).to_bytes(2, "big", signed=True)).decode(),  # 123.45
        "ratio": scaled,
        "ratio_text": scaled,
        "ratio_double": scaled,
        "uid": "a1b2c3d4-0000-4000-8000-000000000001",
        "doc": '{"a": [1, 2]}',
        "mood": "happy",
        "flags": base64.b64encode(b"\x05\x00\x01").decode(),
        "ok": True,
        "raw": base64.b64encode(b"\x00\xff").decode(),
    }
    event = parse_change(None, dump({"schema": envelope, "payload": {"op": "c", "after": after, "source": SOURCE}}), TYPED, KEY)
    micros_of_day = 37_230_500_000
    assert event.after == {
        "id": 1,
        "d": 20090,
        "t_ms": micros_of_day,
        "t_us": micros_of_day,
        "t_ns": micros_of_day,
        "t_zoned": micros_of_day,
        "t_text": "10:20:30.5Z",
        "ts_ms": 1_735_787_045_123_000,
        "ts_us": 1_735_787_045_123_456,
        "ts_ns": 1_735_787_045_123_456,
        "ts_zoned": 1_735_787_045_123_456,
        "price": "123.45",
        "ratio": "12.3450",
        "ratio_text": "12.345",
        "ratio_double": 12.345,
        "uid": "a1b2c3d4-0000-4000-8000-000000000001",
        "doc": '{"a": [1, 2]}',
        "mood": "happy",
        "flags": after["flags"],
        "ok": True,
        "raw": after["raw"],
    }
    # The wrapper's fields travel with the event, for schema changes.
    assert dict(event.schema_fields)["ratio"] == "variable-decimal" and dict(event.schema_fields)["ts_zoned"] == "timestamptz"


@pytest.mark.parametrize(
    "key",
    [None, dump({"schema": {"type": "struct", "fields": []}, "payload": {}}), dump({})],
    ids=["null", "struct-without-fields", "empty-object"],
)
def test_a_record_of_a_table_without_a_primary_key_parses_with_its_record_key_unread(key):
    # Debezium keys a table without a primary key with null; a struct without fields says the same.
    after = {"id": 1, "region": "eu", "amount": "2.50", "updated_at": 1_700_000_000_000_000}
    schema = {
        "type": "struct",
        "fields": [{"type": "struct", "field": "after", "fields": [{"type": "int64", "field": "id"}]}],
    }
    for value in (
        dump({"op": "c", "before": None, "after": after}),
        dump({"schema": schema, "payload": {"op": "r", "after": after}}),
    ):
        event = parse_change(key, value, COLUMNS, ())
        assert isinstance(event, ChangeEvent) and event.key == () and event.after == after
    # A delete's before-image is decoded as on any table; the append-only rule is the batch's.
    deleted = parse_change(key, dump({"op": "d", "before": after, "after": None}), COLUMNS, ())
    assert isinstance(deleted, ChangeEvent) and (deleted.op, deleted.key, deleted.before) == ("d", (), after)
