import datetime as dt
import random

import orjson
import pyarrow as pa
import pytest

from icecdc.domain import summary
from icecdc.domain.layout import FIELD_ID, Column, PartitionTerm, TableLayout
from icecdc.ingest import offsets

TS = 1_735_787_045_000_000  # 2025-01-02T03:04:05
LAYOUT = TableLayout(
    "db.t",
    "t",
    (Column("id", "long", True), Column("region", "string"), Column("amount", "decimal(10, 2)"), Column("ts", "timestamp")),
    {"id": 1, "region": 2, "amount": 3, "ts": 4},
    ("id",),
    (
        PartitionTerm("region", "region", "identity", "string"),
        PartitionTerm("ts_day", "ts", "day", "timestamp"),
        PartitionTerm("id_bucket", "id", "bucket[4]", "long"),
        PartitionTerm("amount_trunc", "amount", "truncate[10]", "decimal(10, 2)"),
    ),
    0,
    "/w/data",
)


def test_partition_values_follow_iceberg_transforms():
    partition = LAYOUT.partition_of({"id": 7, "region": "e u/x", "amount": "12.34", "ts": TS})
    # pyiceberg computes bucket(4) of 7 as 3; the integration tests check that Spark prunes to it.
    assert partition == ("e u/x", 20090, 3, "12.30")
    assert LAYOUT.partition_java_strings(partition) == ["e u/x", "2025-01-02", "3", "12.30"]
    assert LAYOUT.partition_path(partition) == "region=e+u%2Fx/ts_day=2025-01-02/id_bucket=3/amount_trunc=12.30"
    assert LAYOUT.partition_record(partition) == {"region": "e u/x", "ts_day": 20090, "id_bucket": 3, "amount_trunc": "12.30"}


def test_missing_source_column_means_unknown_partition():
    assert LAYOUT.partition_of({"id": 7}) is None


def test_arrow_tables_carry_field_ids():
    table = LAYOUT.to_arrow([{"id": 1, "region": "eu", "amount": "1.50", "ts": TS}])
    assert [f.metadata[FIELD_ID] for f in table.schema] == [b"1", b"2", b"3", b"4"]
    assert table.column("ts").type == pa.timestamp("us")
    assert table.to_pylist()[0]["ts"] == dt.datetime(2025, 1, 2, 3, 4, 5)
    keys = LAYOUT.to_arrow([{"id": 1}], key_only=True)
    assert keys.schema.names == ["id"] and not keys.schema.field("id").nullable


def test_committed_offsets_come_from_the_newest_summary_that_has_them():
    history = [{"operation": "replace"}, {summary.OFFSETS: '{"t": {"0": 10}}'}, {summary.OFFSETS: '{"t": {"0": 5}}'}]
    assert offsets.committed_offsets(history) == {"t": {0: 10}}
    assert offsets.committed_offsets([]) == {}


def test_advance_merges_and_never_goes_back():
    merged = offsets.advance({"t": {0: 10, 1: 4}}, {("t", 0): 19, ("u", 0): 0, ("t", 1): 2})
    assert merged == {"t": {0: 20, 1: 4}, "u": {0: 1}}
    assert offsets.encode(merged) == '{"t":{"0":20,"1":4},"u":{"0":1}}'


def test_partition_paths_render_time_transforms_as_iceberg_does():
    hour = PartitionTerm("ts_hour", "ts", "hour", "timestamp")
    month = PartitionTerm("ts_month", "ts", "month", "timestamp")
    year = PartitionTerm("ts_year", "ts", "year", "timestamp")
    assert hour.path_segment(482136 + 13) == "ts_hour=2025-01-01-13"
    assert month.path_segment(660) == "ts_month=2025-01"
    assert year.path_segment(55) == "ts_year=2025"
    assert hour.java_string(482149) == "482149"  # what Iceberg's partition-string parser reads back


@pytest.mark.parametrize("transform", ["day", "hour"])
@pytest.mark.parametrize("source_type", ["timestamp", "timestamptz"])
def test_fast_time_transforms_agree_with_pyiceberg(transform, source_type):
    from icecdc.domain.layout import _transform_function

    term = PartitionTerm("p", "ts", transform, source_type)
    exact = _transform_function(transform, source_type)
    values = [0, -1, 1, 86_399_999_999, -86_400_000_001, *random.Random(3).sample(range(-(10**17), 10**17), 500)]
    assert [term.apply(v) for v in values] == [exact(v) for v in values]


@pytest.mark.parametrize(
    ("warehouse", "local"), [("/var/lake", True), ("file:/var/lake", True), ("s3://bucket/lake", False), ("", False)]
)
def test_a_warehouse_on_a_local_path_is_local(warehouse, local):
    from icecdc.runtime.catalog import local_warehouse

    assert local_warehouse({"warehouse": warehouse} if warehouse else {}) is local


def test_arrow_read_from_canonical_json_is_what_to_arrow_makes() -> None:
    types = [
        "long",
        "int",
        "float",
        "double",
        "date",
        "timestamp",
        "timestamptz",
        "string",
        "binary",
        "decimal(12, 2)",
        "boolean",
    ]
    columns = tuple(Column(f"c{i}", t, i == 0) for i, t in enumerate(types))
    layout = TableLayout("t", "t", columns, {c.name: i + 1 for i, c in enumerate(columns)}, ("c0", "c7"), (), 0, "/w")
    full = dict(
        zip(
            [c.name for c in columns],
            [1, -2, 0.1, 1e300, 19000, 1_700_000_000_000_001, -5, 'h\u00e9"x', "AAEC", "-12.30", True],
            strict=True,
        )
    )
    rows = [full, {"c0": 2, **{c.name: None for c in columns[1:]}}]
    images = pa.array([b"ignored", *(orjson.dumps(row) for row in rows)]).slice(1)  # an offset, as a filtered column has
    assert layout.arrow_from_json(images).equals(layout.to_arrow(rows))
    assert layout.arrow_from_json(images).schema.equals(layout.arrow_schema(), check_metadata=True)
    keys = layout.arrow_from_json(pa.array([orjson.dumps({"c0": 1, "c7": "x"})], pa.string()), key_only=True)
    assert keys.equals(layout.to_arrow([{"c0": 1, "c7": "x"}], key_only=True))
    assert layout.arrow_from_json(pa.array([], pa.binary())).num_rows == 0
