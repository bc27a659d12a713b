import pytest

from icecdc.domain.tablespec import (
    DecimalType,
    PartitionField,
    TableShape,
    TableSpecError,
    decimal_type,
    normalize_type,
    parse_partition_field,
    widens_to,
)

TYPES = {
    "id": "long",
    "region": "string",
    "ts": "timestamp",
    "d": "date",
    "price": "decimal(10, 2)",
    "ok": "boolean",
    "blob": "binary",
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("region", PartitionField("region", "identity")),
        ("days(ts)", PartitionField("ts", "day")),
        ("day(ts)", PartitionField("ts", "day")),
        ("months(d)", PartitionField("d", "month")),
        ("hours(ts)", PartitionField("ts", "hour")),
        ("bucket(16, id)", PartitionField("id", "bucket", 16)),
        ("truncate( 4 ,region )", PartitionField("region", "truncate", 4)),
        ("bucket(8, price)", PartitionField("price", "bucket", 8)),
    ],
)
def test_parse_partition_fields(text, expected):
    assert parse_partition_field(text, TYPES) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("weeks(ts)", "unknown partition transform 'weeks'"),
        ("bucket(id)", "bucket needs a positive number first"),
        ("bucket(0, id)", "bucket needs a positive number first"),
        ("days(3, ts)", "days takes only a column"),
        ("hours(d)", "hour cannot apply to 'd' of type date"),
        ("truncate(2, ok)", "truncate cannot apply to 'ok' of type boolean"),
        ("days(missing)", "names column 'missing'"),
        ("region id", "bad partition transform"),
        ("ts", "identity cannot apply to 'ts' of type timestamp"),
        ("blob", "identity cannot apply to 'blob' of type binary"),
    ],
)
def test_bad_partition_fields(text, fragment):
    with pytest.raises(TableSpecError, match=fragment.replace("(", r"\(")):
        parse_partition_field(text, TYPES)


def test_iceberg_transform_strings_round_trip():
    for text in ["region", "days(ts)", "bucket(16, id)", "truncate(4, region)"]:
        field = parse_partition_field(text, TYPES)
        assert PartitionField.from_iceberg(field.source, field.iceberg_transform) == field


def test_types_normalize_to_iceberg_spelling():
    assert normalize_type("Decimal(10,2)") == "decimal(10, 2)"
    assert normalize_type(" LONG ") == "long"
    with pytest.raises(TableSpecError, match="out of range"):
        normalize_type("decimal(40, 2)")
    with pytest.raises(TableSpecError, match="unknown column type 'bigint'"):
        normalize_type("bigint")


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("decimal(10, 2)", DecimalType(10, 2)),
        ("decimal(10,2)", DecimalType(10, 2)),
        ("decimal( 38 , 0 )", DecimalType(38, 0)),
        ("decimal(10)", None),
        ("decimal(10, 2", None),
        ("Decimal(10, 2)", None),  # normalize_type lowers the case first
        ("long", None),
    ],
)
def test_one_parser_of_decimal_types(text, parsed):
    assert decimal_type(text) == parsed
    if parsed is not None:
        assert decimal_type(str(parsed)) == parsed and str(parsed) == normalize_type(text)


def test_a_decimal_widens_by_precision_at_the_same_scale():
    assert widens_to("decimal(10, 2)", "decimal(12, 2)") and widens_to("int", "long")
    assert not widens_to("decimal(10, 2)", "decimal(12, 3)") and not widens_to("decimal(12, 2)", "decimal(10, 2)")
    assert not widens_to("long", "decimal(38, 0)")


def shape(**changes):
    base = {
        "columns": {"id": "long", "region": "string", "ts": "timestamp"},
        "identifier_fields": ("id",),
        "partition": (PartitionField("region", "identity"), PartitionField("ts", "day")),
    }
    base.update(changes)
    return TableShape(**base)


def test_create_table_sql():
    sql = shape().create_table_sql("lake.db.t", {"write.summary.partition-limit": "100"})
    assert "`id` BIGINT NOT NULL" in sql and "`ts` TIMESTAMP_NTZ" in sql and "`region` STRING," in sql
    assert "PARTITIONED BY (`region`, days(`ts`))" in sql
    assert "'format-version'='2'" in sql and "'write.summary.partition-limit'='100'" in sql


def test_same_shape_has_no_differences():
    assert shape().differences(shape()) == []


def test_every_difference_is_reported():
    actual = shape(
        columns={"id": "int", "region": "string", "extra": "double"},
        identifier_fields=(),
        partition=(PartitionField("region", "identity"),),
    )
    problems = shape().differences(actual)
    assert "column 'id' is int in the table but long in the config" in problems
    assert "column 'ts' (timestamp) is in the config but not in the table" in problems
    assert "column 'extra' (double) is in the table but not in the config" in problems
    assert any(p.startswith("primary key is [] in the table") for p in problems)
    assert "partitioning is [region] in the table but [region, days(ts)] in the config" in problems
