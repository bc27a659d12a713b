"""The parse stage's fast path against its Python path: on the same random streams (random tables,
types, ops and rules, wrapped and bare, with the records the fast path must hand over), both give
the same rows, rejects, marks and tallies; and the common records do take the fast path."""

from __future__ import annotations

import base64
import datetime as dt
import json
from dataclasses import replace
from typing import Any

import hypothesis.strategies as st
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings

from benchmarks import parse as parse_bench
from icecdc.domain.layout import Column, PartitionTerm, TableLayout
from icecdc.domain.sourcespec import BeforeImage, SourceRules, TruncateMode, UnavailableValues, UnknownPartition
from icecdc.ingest.debezium import ROW_OPS, UNAVAILABLE_PLACEHOLDER, UNAVAILABLE_PLACEHOLDER_BASE64
from icecdc.ingest.fastparse import PAYLOAD, FastParser, split_wrapper, wrapper_schema
from icecdc.ingest.prefixes import CUT_PREFIX, SchemaPrefixes
from icecdc.ingest.stage_rows import Tag
from icecdc.ingest.stages import parse_stage

TOPIC = "shop.public.t"
# The nasty values of the types read from text or floats: each the fast path must read exactly
# as the Python path does, or hand over.
FLOAT32_EDGES = st.sampled_from([3.4028235e38, 3.4028236e38, 3.5e38, 1e-46, -0.0, 0.1, 16777217])
BINARY_EDGES = st.sampled_from(["", "QQ==", "QUI=", "QR==", "QQ", "QQ=", "Q===", "QUJD\n", "not base64!", "Q Q==", 5])


@st.composite
def iso_dates(draw: st.DrawFn, suffixes: tuple[str, ...] = ("", "", "Z", "x")) -> str:
    year = draw(st.sampled_from([0, 1, 4, 100, 1600, 1900, 1969, 1970, 2000, 2024, 9999]))
    return f"{year:04d}-{draw(st.integers(0, 13)):02d}-{draw(st.integers(0, 32)):02d}" + draw(st.sampled_from(suffixes))


@st.composite
def iso_times(draw: st.DrawFn, zones: tuple[str, ...] = ("Z", "Z", "", "+02:00", " ", "z")) -> str:
    clock = f"{draw(st.integers(0, 25)):02d}:{draw(st.integers(0, 61)):02d}:{draw(st.integers(0, 61)):02d}"
    digits = draw(st.integers(0, 8))
    fraction = "." + "".join(draw(st.lists(st.sampled_from("0123456789"), min_size=digits, max_size=digits))) if digits else ""
    return clock + fraction + draw(st.sampled_from(zones))


ZONES = ("Z", "Z", "", "+05:30", "-08:00", "-00:00", "+23:59", "+24:00", "+05:75", "+0530", "+05")


@st.composite
def iso_timestamps(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from(["+10000-01-01T00:00:00Z", "2024-01-02T03:04:60Z", "2024-01-02T24:00:00Z", "2024-01-02", 7]))
    if draw(st.booleans()):
        moment = draw(st.datetimes(timezones=st.sampled_from([None, dt.timezone.utc, dt.timezone(dt.timedelta(hours=-8))])))
        return moment.isoformat(sep=draw(st.sampled_from(["T", " "]))).replace("+00:00", draw(st.sampled_from(["Z", "+00:00"])))
    return draw(iso_dates(("",))) + draw(st.sampled_from(["T", " ", "t"])) + draw(iso_times(ZONES))


def connect_decimal(precision: int, scale: int) -> dict[str, Any]:
    parameters = {"scale": str(scale), "connect.decimal.precision": str(precision)}
    return {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "parameters": parameters}


def connect_decimals(largest: int) -> st.SearchStrategy[Any]:
    """Unscaled values as Connect sends them, mostly within the column's precision, some past it,
    and texts that are not such a value."""

    def encoded(unscaled: int) -> str:
        return base64.b64encode(unscaled.to_bytes(max(1, (unscaled.bit_length() + 8) // 8), "big", signed=True)).decode()

    unscaled = st.one_of(st.integers(-largest, largest), st.integers(-(2**70), 2**70), st.sampled_from([0, 1, -1, largest + 1]))
    return st.one_of(unscaled.map(encoded), st.sampled_from(["", "!!", "AQ", UNAVAILABLE_PLACEHOLDER_BASE64, 5, "1.50"]))


# Column type -> (Connect field schema, a strategy of the JSON values a source may send for it:
# mostly canonical, some the fast path must hand over, some the Python path rejects).
BIG = 2**63
VALUES: dict[str, tuple[dict[str, Any], st.SearchStrategy[Any]]] = {
    "long": ({"type": "int64"}, st.one_of(st.integers(-(2**40), 2**40), st.sampled_from([BIG, -BIG - 1, 1.5, "7", True]))),
    "int": ({"type": "int32"}, st.one_of(st.integers(-(2**31) - 2, 2**31 + 1), st.sampled_from([2**33, "x"]))),
    "string": (
        {"type": "string"},
        st.one_of(st.text(max_size=6), st.sampled_from([UNAVAILABLE_PLACEHOLDER, 'quote " and \\ \n', 5, ""])),
    ),
    "boolean": ({"type": "boolean"}, st.one_of(st.booleans(), st.sampled_from([0, "true"]))),
    "decimal(5, 2)": (
        {"type": "string"},
        st.one_of(
            st.sampled_from(["1.50", "-999.99", "0.00", "1.5", "1000.00", "1.505", "\u0661.\u0665\u0660", "1.50\n", "abc"]),
            st.integers(-5, 5),
        ),
    ),
    # Debezium's default decimal mode (precise): base64 of the unscaled two's-complement value.
    "decimal(5, 2) as Decimal": (connect_decimal(5, 2), connect_decimals(999_99)),
    "decimal(5, 2) as Decimal of scale 1": (connect_decimal(5, 1), connect_decimals(9999)),
    "decimal(10, 8) as Decimal": (connect_decimal(10, 8), connect_decimals(99_99999999)),  # 1E-8 is how Python writes 10^-8
    "timestamp": (
        {"type": "int64", "name": "io.debezium.time.MicroTimestamp"},
        st.one_of(st.integers(-(2**45), 2**45), st.sampled_from(["2025-01-01T00:00:00Z", 1.5])),
    ),
    "timestamptz": (
        {"type": "int64", "name": "io.debezium.time.NanoTimestamp"},
        st.one_of(st.integers(-(2**55), 2**55), st.sampled_from([-1, -1000, -1001, 999])),
    ),
    "date": ({"type": "int32", "name": "io.debezium.time.Date"}, st.integers(-30000, 30000)),
    "double": (
        {"type": "double"},
        st.one_of(
            st.floats(allow_nan=False, allow_infinity=False),
            st.integers(-(2**70), 2**70),
            st.sampled_from([0.0, -0.0, 5, 1e16, 1.5e-7, float("nan"), float("inf"), "1.5", "NaN", True]),
        ),
    ),
    "float": ({"type": "float"}, st.one_of(st.floats(width=32, allow_nan=False, allow_infinity=False), st.just(0.1))),
    "double as float32": (
        {"type": "float"},
        st.one_of(st.floats(width=32, allow_nan=False, allow_infinity=False), FLOAT32_EDGES),
    ),
    "binary": ({"type": "bytes"}, st.one_of(st.binary(max_size=7).map(lambda b: base64.b64encode(b).decode()), BINARY_EDGES)),
    "long as MicroTime": ({"type": "int64", "name": "io.debezium.time.MicroTime"}, st.integers(-(2**40), 2**40)),
    "long as Time": ({"type": "int32", "name": "io.debezium.time.Time"}, st.one_of(st.integers(-(2**31), 2**31), st.just(2**62))),
    "long as NanoTime": ({"type": "int64", "name": "io.debezium.time.NanoTime"}, st.integers(-(2**50), 2**50)),
    "long as ZonedTime": ({"type": "string", "name": "io.debezium.time.ZonedTime"}, st.one_of(iso_times(), st.just(5))),
    "timestamptz as ZonedTimestamp": ({"type": "string", "name": "io.debezium.time.ZonedTimestamp"}, iso_timestamps()),
    "timestamp as ZonedTimestamp": ({"type": "string", "name": "io.debezium.time.ZonedTimestamp"}, iso_timestamps()),
    "date as IsoDate": ({"type": "string", "name": "io.debezium.time.IsoDate"}, st.one_of(iso_dates(), iso_timestamps())),
}


def column_type(kind: str) -> str:
    """The Iceberg type of a ``VALUES`` kind ("timestamptz as ZonedTimestamp": timestamptz)."""
    return kind.split(" as ")[0]


@st.composite
def tables(draw: st.DrawFn) -> tuple[TableLayout, SourceRules, dict[str, Any], dict[str, str]]:
    kinds = draw(st.lists(st.sampled_from(sorted(VALUES)), max_size=4))
    columns = [Column("id", "long", True), *(Column(f"c{i}", column_type(kind)) for i, kind in enumerate(kinds))]
    key = ("id",) if draw(st.integers(0, 3)) else ()  # a quarter of the tables have no primary key (append-only)
    partition: list[PartitionTerm] = []
    for column in columns[1:]:
        if column.type in ("string", "int", "date") and draw(st.booleans()):
            partition.append(PartitionTerm(column.name, column.name, "identity", column.type, 1000 + len(partition)))
        elif column.type in ("timestamp", "timestamptz") and draw(st.booleans()):
            transform = draw(st.sampled_from(["day", "hour"]))
            partition.append(
                PartitionTerm(f"{column.name}_{transform}", column.name, transform, column.type, 1000 + len(partition))
            )
    if draw(st.booleans()):
        partition.append(PartitionTerm("id_bucket", "id", "bucket[4]", "long", 1000 + len(partition)))
    layout = TableLayout(
        "db.t", TOPIC, tuple(columns), {c.name: i + 1 for i, c in enumerate(columns)}, key, tuple(partition), 0, "/w"
    )
    rules = SourceRules(
        before_image=draw(st.sampled_from(BeforeImage)),
        unknown_partition=draw(st.sampled_from(UnknownPartition)),
        truncate=draw(st.sampled_from(TruncateMode)),
        evolve_schema=draw(st.booleans()),
        infer_new_columns=draw(st.booleans()),
        unavailable_values=draw(st.sampled_from(UnavailableValues)),
    )
    kind_of = {"id": "long", **{f"c{i}": kind for i, kind in enumerate(kinds)}}
    fields = [{**VALUES[kind_of[c.name]][0], "optional": c.name != "id", "field": c.name} for c in columns]
    if draw(st.booleans()):
        fields.append({"type": "string", "optional": True, "field": "added"})  # a column the table lacks
    if draw(st.booleans()):
        fields = [f for f in fields if f["field"] != "id"] + [{"type": "int32", "optional": False, "field": "id"}]  # narrower
    row = {"type": "struct", "fields": fields, "optional": True, "name": "shop.public.t.Value"}
    schema = {
        "type": "struct",
        "fields": [{**row, "field": "before"}, {**row, "field": "after"}],
        "name": "shop.public.t.Envelope",
    }
    return layout, rules, schema, kind_of


@st.composite
def images(draw: st.DrawFn, layout: TableLayout, kinds: dict[str, str]) -> dict[str, Any] | None:
    if draw(st.integers(0, 9)) == 0:
        return None
    image = {}
    for column in layout.columns:
        if column.name == "id":
            image["id"] = (
                draw(st.one_of(st.integers(1, 6), st.sampled_from([None, "k"])))
                if draw(st.integers(0, 9)) == 0
                else draw(st.integers(1, 6))
            )
            if draw(st.integers(0, 19)) == 0:
                del image["id"]
            continue
        choice = draw(st.integers(0, 9))
        if choice == 0:
            continue  # not sent
        image[column.name] = None if choice == 1 else draw(VALUES[kinds[column.name]][1])
    if draw(st.integers(0, 9)) == 0:
        image["extra"] = draw(st.one_of(st.none(), st.integers(), st.text(max_size=3)))
    return image


def _json(document: Any) -> bytes:
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


@st.composite
def records(draw: st.DrawFn, layout: TableLayout, kinds: dict[str, str], schema: dict[str, Any], offset: int) -> dict[str, Any]:
    op = draw(st.sampled_from(["c", "c", "r", "u", "u", "d", "t", "m", "x", None]))
    payload: dict[str, Any] = {"op": op, "before": draw(images(layout, kinds)), "after": draw(images(layout, kinds))}
    if draw(st.integers(0, 9)):
        payload["source"] = {"connector": "postgresql", "lsn": offset * 10}
    elif draw(st.booleans()):
        payload["source"] = None
    payload["ts_ms"] = draw(st.sampled_from([1700000000000, None, "soon"]))
    if op is None and draw(st.booleans()):
        del payload["op"]
    key_id = draw(st.integers(1, 6))
    key_form = draw(st.integers(0, 9))
    key: bytes | None = (
        None  # a table without a primary key is keyed by null
        if key_form == 0
        else orjson.dumps({"schema": {"type": "struct"}, "payload": {"id": key_id}})
        if key_form % 2
        else orjson.dumps({"id": key_id})
    )
    dump = _json  # orjson refuses integers past 64 bits, which a source may send
    form = draw(st.integers(0, 19))
    if form == 0:
        value: bytes | None = None  # a tombstone
    elif form == 1:
        value = dump(payload)[:-1]  # cut short
    elif form == 2:
        value = dump(payload) + b" " + dump(payload)  # two documents
    elif form == 3:
        value = dump({"payload": payload, "schema": schema})  # the wrapper's keys the other way round
    elif form < 12:
        value = dump({"schema": schema, "payload": payload})
    else:
        value = dump(payload)
    partition = draw(st.integers(0, 1))
    return {"key": key, "value": value, "topic": TOPIC, "partition": partition, "offset": offset}


def cut(batch: list[dict[str, Any]], prefix: bytes) -> tuple[list[dict[str, Any]], list[bytes]]:
    """The batch as the direct reader hands it over once it knows ``prefix``, and the prefixes."""
    prefixes = SchemaPrefixes()
    prefixes.learn({TOPIC: b"an earlier version's prefix", "other": b"another topic's"})
    prefixes.learn({TOPIC: prefix})
    return prefixes.cut_records([dict(record) for record in batch]), prefixes.known


def _rows(
    layout: TableLayout,
    rules: SourceRules,
    batch: list[dict[str, Any]],
    fast: bool,
    committed: dict[Any, int],
    prefix: bytes | None = None,
) -> list[Any]:
    """The parse stage's rows but the prefixes it learned (only the fast path learns them);
    ``prefix``: the wrapper prefix cut from the values that start with it."""
    batch, prefixes = cut(batch, prefix) if prefix is not None else (batch, [])
    stage = parse_stage({TOPIC: layout}, committed, {layout.table: rules}, {}, fast=fast, prefixes=prefixes)
    records = pa.RecordBatch.from_pylist(batch)
    rows = [row for out in stage([records]) for row in out.to_pylist() if row["op"] != Tag.PREFIX]
    for row in rows:
        if row["op"] in (Tag.COLUMNS, Tag.CONTROL):
            row["detail"] = orjson.loads(row["detail"])  # counts by name: the driver adds them up in any order
    return sorted(
        rows, key=lambda r: orjson.dumps(r, default=lambda v: base64.b64encode(v).decode(), option=orjson.OPT_SORT_KEYS)
    )


def _change(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(row[name] for name in ("offset", "op", "key", "after", "partition", "prior", "global_delete", "change"))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example])
@given(data=st.data())
def test_the_fast_path_parses_every_stream_as_the_python_path_does(data: st.DataObject) -> None:
    """Whole, and with the drawn schema's wrapper prefix cut: dead letters still carry the records'
    whole bytes."""
    layout, rules, schema, kinds = data.draw(tables())
    batch = [data.draw(records(layout, kinds, schema, offset)) for offset in range(data.draw(st.integers(1, 40)))]
    committed = {(TOPIC, 0): data.draw(st.integers(0, 3))}
    python = _rows(layout, rules, batch, False, committed)
    assert _rows(layout, rules, batch, True, committed) == python
    assert _rows(layout, rules, batch, True, committed, prefix=b'{"schema":' + _json(schema) + PAYLOAD) == python


def orders() -> TableLayout:
    columns = (
        Column("id", "long", True),
        Column("region", "string"),
        Column("amount", "decimal(12, 2)"),
        Column("at", "timestamp"),
    )
    partition = (
        PartitionTerm("region", "region", "identity", "string", 1000),
        PartitionTerm("at_day", "at", "day", "timestamp", 1001),
    )
    return TableLayout("db.t", TOPIC, columns, {"id": 1, "region": 2, "amount": 3, "at": 4}, ("id",), partition, 0, "/w")


WRAPPER = {
    "type": "struct",
    "fields": [
        {
            "type": "struct",
            "field": "after",
            "fields": [
                {"type": "int64", "optional": False, "field": "id"},
                {"type": "string", "optional": True, "field": "region"},
                {"type": "string", "optional": True, "field": "amount"},
                {"type": "int64", "optional": True, "name": "io.debezium.time.Timestamp", "field": "at"},
            ],
        }
    ],
}


def common(op: str, key: int, wrapped: bool) -> bytes:
    row = {"id": key, "region": "eu", "amount": "12.50", "at": 1_735_689_600_000 + key}
    payload = {"op": op, "before": row if op == "d" else None, "after": None if op == "d" else row, "source": {"lsn": key}}
    return orjson.dumps({"schema": WRAPPER, "payload": payload} if wrapped else payload)


@pytest.mark.parametrize("wrapped", [True, False])
def test_the_common_records_take_the_fast_path(wrapped: bool) -> None:
    values = [common(op, key, wrapped) for key, op in enumerate(["c", "r", "u", "d"] * 10)]
    rules = SourceRules(before_image=BeforeImage.FULL)
    parsed = FastParser(orders(), rules).parse(values)
    assert sorted(parsed.positions) == list(range(len(values)))
    change = parsed.taken.filter(pc.equal(parsed.taken.column("index"), 0)).to_pylist()[0]
    # The wrapper says the timestamp is in millis: micros, and the partition is the day of it; bare,
    # the integer is taken as micros.
    at, day = (1_735_689_600_000_000, 20089) if wrapped else (1_735_689_600_000, 20)
    assert orjson.loads(change["after"]) == {"id": 0, "region": "eu", "amount": "12.50", "at": at}
    assert (change["key"], change["partition"], change["prior"]) == ('{"id":0}', f'["eu",{day}]', [f'["eu",{day}]'])
    assert change["global_delete"] is False


def test_connect_decimals_take_the_fast_path_as_the_python_path_decodes_them() -> None:
    schema = json.loads(json.dumps(WRAPPER))
    schema["fields"][0]["fields"][2] = {**connect_decimal(12, 2), "optional": True, "field": "amount"}

    def record(key: int, unscaled: int) -> bytes:
        amount = base64.b64encode(unscaled.to_bytes(8, "big", signed=True)).decode()
        row = {"id": key, "region": "eu", "amount": amount, "at": 1_735_689_600_000}
        return orjson.dumps({"schema": schema, "payload": {"op": "c", "before": None, "after": row, "source": {"lsn": key}}})

    # 12.50, -0.01, 0 and one past decimal(12, 2), which the Python path dead-letters.
    values = [record(0, 1250), record(1, -1), record(2, 0), record(3, 10**12)]
    parsed = FastParser(orders(), SourceRules()).parse(values)
    assert sorted(parsed.positions) == [0, 1, 2]
    amounts = {r["index"]: orjson.loads(r["after"])["amount"] for r in parsed.taken.to_pylist()}
    assert amounts == {0: "12.50", 1: "-0.01", 2: "0.00"}
    # At scale 8 Python writes 10^-8 as 1E-8: the fast path writes what the Python path does.
    small = TableLayout(
        "db.t", TOPIC, (Column("id", "long", True), Column("c", "decimal(10, 8)")), {"id": 1, "c": 2}, ("id",), (), 0, "/w"
    )
    row = {"type": "struct", "fields": [{"type": "int64", "field": "id"}, {**connect_decimal(10, 8), "field": "c"}]}
    envelope = {"type": "struct", "fields": [{**row, "field": "before"}, {**row, "field": "after"}]}
    after = {"id": 1, "c": base64.b64encode(b"\x01").decode()}
    value = orjson.dumps({"schema": envelope, "payload": {"op": "c", "before": None, "after": after, "source": {"lsn": 1}}})
    [taken] = FastParser(small, SourceRules()).parse([value]).taken.to_pylist()
    assert orjson.loads(taken["after"])["c"] == "1E-8"


def test_the_records_it_cannot_take_are_handed_over_one_by_one() -> None:
    good = common("c", 1, True)
    handed = [
        None,  # a tombstone
        good.replace(b'"12.50"', b'"12.5"'),  # a decimal to quantize
        good.replace(b'"eu"', b'"__debezium_unavailable_value"'),  # resolved from an earlier version
        good.replace(b'"op":"c"', b'"op":"t"'),
        good.replace(b'"id":1', b'"id":null'),
        good[:-2],  # malformed
        good.replace(b'"eu"', b"5"),  # a number for a string column: Arrow refuses the chunk, split until found
    ]
    values = [good] * 40 + handed + [good] * 40
    parsed = FastParser(orders(), SourceRules()).parse(values)
    assert sorted(set(range(len(values))) - set(parsed.positions)) == list(range(40, 40 + len(handed)))


def test_a_schema_is_read_once_whole_or_not_at_all() -> None:
    assert split_wrapper(b'{"schema":{"a":1},"payload":{"op":"c"}}') == (b'{"schema":{"a":1}', b'{"op":"c"}')
    assert split_wrapper(b'{"op":"c"}') == (None, b'{"op":"c"}')
    assert split_wrapper(b'{"schema":{"a":1},"payload":5}') is None
    assert wrapper_schema(b'{"schema":{"a":1}') == (True, {"a": 1})
    # A "payload" key inside the schema: not one JSON value up to the cut.
    assert wrapper_schema(b'{"schema":{"parameters":{"x":1')[0] is False
    assert wrapper_schema(b'{"schema":1,"other":2')[0] is False


def test_a_stream_learns_its_wrapper_prefix_and_takes_its_values_cut() -> None:
    """The prefix the fast path learns from whole records is what the next batch is cut with; cut
    records are parsed as whole ones, and a record left whole still is."""
    layout, rules = orders(), SourceRules(before_image=BeforeImage.FULL)
    values = [common(op, key, True) for key, op in enumerate(["c", "u", "d"] * 5)]
    batch = [{"key": b'{"id": 1}', "value": v, "topic": TOPIC, "partition": 0, "offset": i} for i, v in enumerate(values)]
    stage = parse_stage({TOPIC: layout}, {}, {layout.table: rules}, {})
    learned = [row for out in stage([pa.RecordBatch.from_pylist(batch)]) for row in out.to_pylist() if row["op"] == Tag.PREFIX]
    prefix = b'{"schema":' + orjson.dumps(WRAPPER) + PAYLOAD
    assert [(row["topic"], row["raw_value"]) for row in learned] == [(TOPIC, prefix)]
    assert split_wrapper(values[0][len(prefix) :], prefix) == split_wrapper(values[0])
    records, prefixes = cut(batch, prefix)
    records[3] = batch[3] | {CUT_PREFIX: None}
    assert [record[CUT_PREFIX] for record in records].count(prefixes.index(prefix)) == len(batch) - 1
    again = parse_stage({TOPIC: layout}, {}, {layout.table: rules}, {}, prefixes=prefixes)
    rows = [row for out in again([pa.RecordBatch.from_pylist(records)]) for row in out.to_pylist()]
    assert [row["raw_value"] for row in rows if row["op"] == Tag.PREFIX] == [prefix]  # from the one left whole
    changes = sorted(_change(r) for r in rows if r["op"] in ROW_OPS)
    python = _rows(layout, rules, batch, False, {})
    assert len(changes) == len(batch)
    assert changes == sorted(_change(r) for r in python if r["op"] in ROW_OPS)


def test_variable_scale_decimals_send_the_table_the_python_way() -> None:
    layout = one_column_table("double")
    field = {"type": "struct", "name": "io.debezium.data.VariableScaleDecimal", "optional": True, "field": "c0"}
    value = typed_record(0, field, {"scale": 1, "value": "DA=="})
    assert FastParser(layout, SourceRules()).parse([value]).positions == []


def one_column_table(kind: str) -> TableLayout:
    columns = (Column("id", "long", True), Column("c0", column_type(kind)))
    return TableLayout("db.t", TOPIC, columns, {"id": 1, "c0": 2}, ("id",), (), 0, "/w")


def typed_record(key: int, field: dict[str, Any], value: Any) -> bytes:
    row = {"type": "struct", "fields": [{"type": "int64", "optional": False, "field": "id"}, field]}
    schema = {"type": "struct", "fields": [{**row, "field": "before"}, {**row, "field": "after"}]}
    payload = {"op": "c", "before": None, "after": {"id": key, "c0": value}, "source": {"lsn": key}}
    return _json({"schema": schema, "payload": payload})


NAN = float("nan")
# kind -> (values the fast path takes, values it hands over: not canonical, or not provably read
# as the Python path reads them).
TYPED: dict[str, tuple[list[Any], list[Any]]] = {
    "double": ([1.5, 5, 1e16, 1.5e-7, 0.0, 2**70, -2.5e-300, 0.1], ["NaN", -0.0, NAN, float("inf"), "1.5", True]),
    "float": ([0.1, 1.5, 3.4028235e38], [-0.0]),
    "double as float32": ([0.1, 3.4028235e38, 1e-46, 16777217], [3.5e38, "0.1"]),
    "binary": (["", "QQ==", "QUI=", "QUJD", "QR=="], ["QQ", "QQ=", "Q===", "not base64!", "QUJD\n", "Q Q==", 5]),
    "long as MicroTime": ([0, 86_399_999_999, -5], [1.5, "10:00:00"]),
    "long as Time": ([0, 86_399_999, 2**31], [2**62, "10:00:00"]),
    "long as NanoTime": ([0, -1, -1001, 999, 86_399_999_999_999], ["10:00:00"]),
    # Its source type is a string, which a long column cannot take: the Python path dead-letters it.
    "long as ZonedTime": ([], ["10:15:30Z", "10:15:30.5Z", "24:00:00Z", "10:15:30+02:00", 5]),
    "timestamptz as ZonedTimestamp": (
        [
            "2024-02-29T03:04:05.123456Z",
            "1969-12-31T23:59:59.5Z",
            "0001-01-01T00:00:00+01:00",
            "9999-12-31 23:59:59-08:00",
            "2024-01-02T03:04:05",
            "2024-01-02T03:04:05.05-00:00",
            "2000-03-01T00:00:00+23:59",
        ],
        [
            "2023-02-29T00:00:00Z",
            "1900-02-29T00:00:00Z",
            "0000-01-01T00:00:00Z",
            "+10000-01-01T00:00:00Z",
            "2024-01-02T03:04:60Z",
            "2024-01-02T24:00:00Z",
            "2024-01-02T03:04:05.1234567Z",
            "2024-01-02T03:04:05+0530",
            "2024-01-02T03:04:05+05:75",
            "2024-01-02",
            1_700_000_000_000_000,
        ],
    ),
    "timestamp as ZonedTimestamp": (["2024-01-02T03:04:05+05:30", "2024-01-02T03:04:05"], ["2024-13-01T00:00:00Z"]),
    "date as IsoDate": (
        ["2024-02-29", "1970-01-01", "2000-02-29T03:04:05Z", "0001-01-01"],
        ["2023-02-29", "0000-01-01", "20240102", 19000],
    ),
}


@pytest.mark.parametrize("kind", sorted(TYPED))
def test_each_type_is_read_as_the_python_path_reads_it_or_handed_over(kind: str) -> None:
    taken, handed = TYPED[kind]
    layout = one_column_table(kind)
    field = {**VALUES[kind][0], "optional": True, "field": "c0"}
    values = [typed_record(key, field, value) for key, value in enumerate([*taken, *handed])]
    rules = SourceRules(unavailable_values=UnavailableValues.KEEP_PLACEHOLDER)
    assert sorted(FastParser(layout, rules).parse(values).positions) == list(range(len(taken)))
    batch = [{"key": None, "value": v, "topic": TOPIC, "partition": 0, "offset": i} for i, v in enumerate(values)]
    assert _rows(layout, rules, batch, True, {}) == _rows(layout, rules, batch, False, {})


def test_a_binary_placeholder_is_handed_over_when_the_table_resolves_it() -> None:
    layout = one_column_table("binary")
    value = typed_record(1, {"type": "bytes", "optional": True, "field": "c0"}, UNAVAILABLE_PLACEHOLDER_BASE64)
    assert FastParser(layout, SourceRules(unavailable_values=UnavailableValues.KEEP_PLACEHOLDER)).parse([value]).positions == [0]
    assert FastParser(layout, SourceRules(unavailable_values=UnavailableValues.RESOLVE)).parse([value]).positions == []


def test_a_stream_of_the_common_case_is_parsed_alike_by_both_paths() -> None:
    layout = orders()
    batch = [
        {"key": b'{"id": 1}', "value": common(op, key % 7, key % 2 == 0), "topic": TOPIC, "partition": 0, "offset": key}
        for key, op in enumerate(["c", "u", "d", "r"] * 25)
    ]
    rules = SourceRules(before_image=BeforeImage.FULL, unavailable_values=UnavailableValues.KEEP_PLACEHOLDER)
    fast = _rows(layout, rules, batch, True, {})
    assert fast == _rows(layout, rules, batch, False, {})
    assert sum(row["op"] in "curd" for row in fast) == 100 and not any(row["reason"] for row in fast)
    assert next(row for row in fast if row["op"] == Tag.MARK)["records"] == 100


def test_connector_records_of_a_table_with_postgres_types_take_the_fast_path() -> None:
    """A timestamptz (ZonedTimestamp text), a double precision and a bytea, as ``python -m benchmarks parse``'s
    connector-pg-types shape sends them: every record taken, and read as the Python path reads it."""
    batches = parse_bench.record_batches(parse_bench.PG_TYPES, 300, 1000)
    values = [v for batch in batches for v in batch.column("value").to_pylist()]
    layout, rules = parse_bench.orders_layout(parse_bench.PG_TYPES), SourceRules(before_image=BeforeImage.FULL)
    assert len(FastParser(layout, rules).parse(values).positions) == len(values)
    batch = [{**row, "topic": TOPIC} for b in batches for row in b.to_pylist()]
    layout = TableLayout(layout.table, TOPIC, layout.columns, layout.field_ids, layout.primary_key, layout.partition, 0, "/w")
    assert _rows(layout, rules, batch, True, {}) == _rows(layout, rules, batch, False, {})


def test_a_table_without_a_primary_key_takes_its_creates_and_hands_over_its_updates_and_deletes() -> None:
    layout, rules = replace(orders(), primary_key=()), SourceRules()
    ops = ["c", "r", "u", "d"] * 5
    values = [common(op, key, True) for key, op in enumerate(ops)]
    parsed = FastParser(layout, rules).parse(values)
    assert sorted(parsed.positions) == [i for i, op in enumerate(ops) if op in ("c", "r")]
    change = parsed.taken.filter(pc.equal(parsed.taken.column("index"), 0)).to_pylist()[0]
    assert (change["key"], change["prior"], change["global_delete"]) == ("{}", [], False)
    # Debezium keys the records of a table without a primary key with null.
    batch = [{"key": None, "value": v, "topic": TOPIC, "partition": 0, "offset": i} for i, v in enumerate(values)]
    fast = _rows(layout, rules, batch, True, {})
    assert fast == _rows(layout, rules, batch, False, {})
    rejected = [row for row in fast if row["reason"] is not None]
    assert sorted(row["offset"] for row in rejected) == [i for i, op in enumerate(ops) if op in ("u", "d")]
    assert {row["reason"] for row in rejected} == {"no-primary-key"}
    assert all(row["raw_value"] == values[row["offset"]] for row in rejected), "a dead letter keeps the record's bytes"
