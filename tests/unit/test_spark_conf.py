import sqlite3
from pathlib import Path

import pytest

from icecdc.runtime.config import embedded_config
from icecdc.runtime.spark import (
    ICEBERG_EXTENSIONS,
    SparkSetupError,
    host_local_paths,
    iceberg_runtime_jar,
    jdbc_driver_jar,
    spark_conf,
)


def test_embedded_conf_uses_wheel_jar_and_sqlite_driver(tmp_path):
    conf = spark_conf(embedded_config(tmp_path))
    jars = conf["spark.jars"].split(",")
    assert jars[0] == str(iceberg_runtime_jar()) and Path(jars[0]).is_file()
    assert jars[1] == "/usr/share/java/sqlite-jdbc.jar"
    assert conf["spark.sql.catalog.lake"] == "org.apache.iceberg.spark.SparkCatalog"
    assert conf["spark.sql.catalog.lake.type"] == "jdbc"
    assert conf["spark.sql.catalog.lake.uri"] == f"jdbc:sqlite:{tmp_path.resolve() / 'catalog.db'}"
    assert conf["spark.sql.extensions"] == ICEBERG_EXTENSIONS


def test_maven_coordinates_replace_the_wheel_jar(tmp_path):
    coordinates = "org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.10.2"
    config = embedded_config(
        tmp_path, spark={"conf": {"spark.jars.packages": coordinates, "spark.sql.extensions": "com.example.Ext"}}
    )
    conf = spark_conf(config)
    assert conf["spark.jars"] == "/usr/share/java/sqlite-jdbc.jar"
    assert conf["spark.jars.packages"] == coordinates
    # The user's extensions are kept, Iceberg's is added.
    assert conf["spark.sql.extensions"] == f"{ICEBERG_EXTENSIONS},com.example.Ext"


def test_rest_catalog_needs_no_driver(tmp_path):
    config = embedded_config(tmp_path, catalog={"name": "prod", "properties": {"type": "rest", "uri": "http://r:8181"}})
    conf = spark_conf(config)
    assert "sqlite" not in conf["spark.jars"]
    assert conf["spark.sql.catalog.prod.uri"] == "http://r:8181"


def test_missing_jdbc_driver_says_what_to_install(tmp_path):
    props = {"type": "jdbc", "uri": "jdbc:postgresql://db:5432/lake"}
    with pytest.raises(SparkSetupError, match="apt-get install libpostgresql-jdbc-java"):
        jdbc_driver_jar(props, [], java_dir=tmp_path)
    # A driver the user already put on spark.jars is trusted.
    assert jdbc_driver_jar(props, ["/opt/jars/postgresql.jar"], java_dir=tmp_path) is None


def test_user_settings_override_defaults(tmp_path):
    conf = spark_conf(embedded_config(tmp_path, spark={"conf": {"spark.sql.shuffle.partitions": 64}}))
    assert conf["spark.sql.shuffle.partitions"] == "64"


def test_an_initialized_sqlite_catalog_is_not_initialized_again(tmp_path):
    # Iceberg's initialization over existing tables leaks a read lock on SQLite (icecdc/runtime/spark.py).
    key = "spark.sql.catalog.lake.jdbc.init-catalog-tables"
    assert key not in spark_conf(embedded_config(tmp_path))  # no database yet: Iceberg creates it
    with sqlite3.connect(tmp_path / "catalog.db") as db:
        db.execute("CREATE TABLE iceberg_tables (x)")
        assert key not in spark_conf(embedded_config(tmp_path))  # not fully initialized
        db.execute("CREATE TABLE iceberg_namespace_properties (x)")
    assert spark_conf(embedded_config(tmp_path))[key] == "false"


def test_a_local_warehouse_is_named_when_executors_may_run_on_other_hosts(tmp_path):
    assert host_local_paths(embedded_config(tmp_path)) == []
    assert host_local_paths(embedded_config(tmp_path, spark={"master": "local-cluster[2,1,1024]"})) == []
    on_cluster = embedded_config(tmp_path, spark={"master": "spark://master:7077"})
    assert host_local_paths(on_cluster) == [on_cluster.catalog.properties["warehouse"]]
    s3 = on_cluster.model_copy(
        update={"catalog": on_cluster.catalog.model_copy(update={"properties": {"warehouse": "s3://lake/wh"}})}
    )
    assert host_local_paths(s3) == []
