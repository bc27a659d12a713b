"""A real Spark session on the SQLite JDBC catalog, and pyiceberg on the same catalog."""

import datetime as dt
from decimal import Decimal

import pytest

from icecdc.runtime.catalog import (
    TableMismatchError,
    ensure_tables,
    live_shape,
    pyiceberg_catalog,
)
from icecdc.runtime.config import Config


def with_table(config: Config, **table) -> Config:
    return config.model_copy(
        update={"tables": [Config.model_validate({"catalog": config.catalog.model_dump(), "tables": [table]}).tables[0]]}
    )


def orders(name: str, **overrides):
    return {
        "name": name,
        "topic": f"{name}.topic",
        "primary_key": ["id"],
        "partition_by": ["region", "days(updated_at)", "bucket(4, id)"],
        "schema": {"id": "long", "region": "string", "amount": "decimal(10, 2)", "updated_at": "timestamp"},
        **overrides,
    }


def test_create_write_read_and_pyiceberg_sees_same_snapshot(spark, stack_config, unique):
    config = with_table(stack_config, **orders(f"it.orders_{unique}"))
    name = config.table_ref(f"it.orders_{unique}").qualified
    assert ensure_tables(spark, config) == [f"it.orders_{unique}"]
    assert ensure_tables(spark, config) == []  # exists and matches: nothing to do

    spark.sql(f"""INSERT INTO {name} VALUES
        (1, 'eu', 1.50, TIMESTAMP_NTZ'2025-01-02 03:04:05'),
        (2, 'us', 2.25, TIMESTAMP_NTZ'2025-01-03 00:00:00')""")
    rows = sorted(spark.table(name).collect())
    assert [tuple(r) for r in rows] == [
        (1, "eu", Decimal("1.50"), dt.datetime(2025, 1, 2, 3, 4, 5)),
        (2, "us", Decimal("2.25"), dt.datetime(2025, 1, 3)),
    ]
    spark_snapshot = spark.sql(f"SELECT snapshot_id FROM {name}.snapshots").collect()
    assert len(spark_snapshot) == 1

    table = pyiceberg_catalog(config).load_table(f"it.orders_{unique}")
    assert table.metadata.format_version == 2
    assert table.current_snapshot().snapshot_id == spark_snapshot[0].snapshot_id
    assert [table.schema().find_column_name(i) for i in table.schema().identifier_field_ids] == ["id"]
    assert {str(f.transform) for f in table.spec().fields} == {"identity", "day", "bucket[4]"}
    assert len(table.inspect.files()) == 2  # two partitions, a file each

    assert config.tables[0].shape.differences(live_shape(table)) == []
    assert live_shape(table).format_version == 2  # the default when the config names none
    # The writer's own commits merge manifests early (docs/compactor.md, "Manifests while writing").
    assert table.properties["commit.manifest.min-count-to-merge"] == "8"


def test_existing_table_that_disagrees_is_an_error_saying_how(spark, stack_config, unique):
    ensure_tables(spark, with_table(stack_config, **orders(f"it.drift_{unique}")))
    drifted = with_table(
        stack_config,
        **orders(
            f"it.drift_{unique}",
            partition_by=["region"],
            schema={"id": "long", "region": "string", "amount": "double", "updated_at": "timestamp"},
            format_version=3,
        ),
    )
    with pytest.raises(TableMismatchError) as info:
        ensure_tables(spark, drifted)
    message = str(info.value)
    assert "column 'amount' is decimal(10, 2) in the table but double in the config" in message
    assert "partitioning is [region, days(updated_at), bucket(4, id)] in the table but [region] in the config" in message
    assert "format version is 2 in the table but 3 in the config" in message


def test_a_table_configured_for_format_3_is_created_in_it(spark, stack_config, unique):
    config = with_table(stack_config, **orders(f"it.v3_{unique}", format_version=3))
    ensure_tables(spark, config)
    assert ensure_tables(spark, config) == []  # exists and matches
    assert live_shape(pyiceberg_catalog(config).load_table(f"it.v3_{unique}")).format_version == 3


def test_missing_table_without_schema_is_an_error(spark, stack_config, unique):
    config = with_table(stack_config, name=f"it.absent_{unique}", topic="x", primary_key=["id"])
    with pytest.raises(TableMismatchError, match="does not exist and has no schema"):
        ensure_tables(spark, config)


def _imported_before_the_task(_: object) -> list[tuple[bool, bool]]:
    import sys

    return [("pandas" in sys.modules, "pyarrow.parquet" in sys.modules)]


def test_python_workers_are_forked_with_arrow_and_pandas_imported(spark):
    """icecdc's Python daemon (icecdc/runtime/python_daemon.py) imports them before it forks a
    worker; Spark's own daemon does not, and a plain RDD task imports neither."""
    imported = spark.sparkContext.parallelize([0], 1).mapPartitions(_imported_before_the_task).collect()
    assert imported == [(True, True)]
