from pathlib import Path

import pytest

from icecdc.config import ConfigError, expand_env, load_config, parse_config

VALID = """
kafka:
  bootstrap_servers: "127.0.0.1:9092"
  properties: {security.protocol: SASL_SSL, sasl.password: "${TEST_SASL_PASSWORD}"}
catalog:
  name: lake
  properties:
    type: jdbc
    uri: jdbc:sqlite:/abs/path/catalog.db
    warehouse: /abs/path/warehouse
tables:
  - name: db.orders
    topic: shop.public.orders
    primary_key: [id]
    partition_by: [region, "days(updated_at)", "bucket(16, id)"]
    schema: {id: long, region: string, amount: double, updated_at: timestamp}
commit_topic: icecdc.commits
dead_letter_topic: icecdc.dlq
spark: {master: "local[2]", conf: {spark.driver.memory: 2g}}
"""


@pytest.fixture(autouse=True)
def sasl_password(monkeypatch):
    monkeypatch.setenv("TEST_SASL_PASSWORD", "s3cret")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "icecdc.yaml"
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    return str(info.value)


def test_valid_file_loads(tmp_path):
    config = load_config(write(tmp_path, VALID))
    table = config.table("db.orders")
    assert config.kafka.properties["sasl.password"] == "s3cret"
    assert config.catalog.properties["type"] == "jdbc"
    assert table.schema_ == {"id": "long", "region": "string", "amount": "double", "updated_at": "timestamp"}
    assert [str(f) for f in table.partition_fields] == ["region", "days(updated_at)", "bucket(16, id)"]
    assert config.spark.conf == {"spark.driver.memory": "2g"}
    # A relative state_dir is anchored at the config file, not at the working directory.
    assert config.state_dir == (tmp_path / ".icecdc").resolve()


def test_minimal_file_takes_defaults(tmp_path):
    config = load_config(write(tmp_path, "catalog: {properties: {type: rest, uri: 'http://localhost:8181'}}\n"))
    assert config.tables == [] and config.commit_topic == "icecdc.commits" and config.spark.master == "local[2]"


def test_secrets_are_masked_for_display(tmp_path):
    shown = load_config(write(tmp_path, VALID)).redacted()
    assert shown["kafka"]["properties"]["sasl.password"] == "***"
    assert shown["kafka"]["properties"]["security.protocol"] == "SASL_SSL"
    assert "s3cret" not in repr(shown)


def test_unknown_key_is_named(tmp_path):
    message = error_of(tmp_path, VALID.replace("primary_key: [id]", "primary_key: [id]\n    primry: 1"))
    assert "tables[0].primry: unknown key" in message


def test_unknown_top_level_key_is_named(tmp_path):
    assert "kafak: unknown key" in error_of(tmp_path, VALID + "kafak: {}\n")


def test_wrong_type_is_named(tmp_path):
    message = error_of(tmp_path, VALID.replace('master: "local[2]"', "master: [1]"))
    assert "spark.master" in message and "string" in message


def test_missing_table_key_is_named(tmp_path):
    message = error_of(tmp_path, VALID.replace("    topic: shop.public.orders\n", ""))
    assert "tables[0].topic: required key is missing" in message


def test_bad_partition_transform_is_named(tmp_path):
    message = error_of(tmp_path, VALID.replace('"days(updated_at)"', '"dayz(updated_at)"'))
    assert "tables[0]" in message and "unknown partition transform 'dayz'" in message


def test_transform_on_wrong_column_type(tmp_path):
    message = error_of(tmp_path, VALID.replace('"days(updated_at)"', '"days(region)"'))
    assert "day cannot apply to 'region' of type string" in message


def test_partition_on_unknown_column(tmp_path):
    message = error_of(tmp_path, VALID.replace('"bucket(16, id)"', '"bucket(16, nope)"'))
    assert "names column 'nope', which is not in the schema" in message


def test_unknown_column_type(tmp_path):
    message = error_of(tmp_path, VALID.replace("amount: double", "amount: dubble"))
    assert "tables[0].schema: column 'amount': unknown column type 'dubble'" in message


def test_primary_key_must_be_in_schema(tmp_path):
    message = error_of(tmp_path, VALID.replace("primary_key: [id]", "primary_key: [order_id]"))
    assert "primary_key column(s) ['order_id'] are not in the schema" in message


def test_spark_conf_keys_must_be_spark_settings(tmp_path):
    assert "keys must start with 'spark.'" in error_of(tmp_path, VALID.replace("spark.driver.memory", "driver.memory"))


def test_catalog_needs_a_type(tmp_path):
    message = error_of(tmp_path, VALID.replace("    type: jdbc\n", ""))
    assert "catalog.properties: needs 'type'" in message


def test_duplicate_topics_are_rejected():
    table = {"topic": "t", "primary_key": ["id"]}
    with pytest.raises(ConfigError, match="two tables share the topic 't'"):
        parse_config({"catalog": {"properties": {"type": "rest"}},
                      "tables": [{"name": "db.a", **table}, {"name": "db.b", **table}]})


def test_table_name_needs_a_namespace(tmp_path):
    assert "must be namespace.table" in error_of(tmp_path, VALID.replace("name: db.orders", "name: orders"))


def test_missing_environment_variable_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("TEST_SASL_PASSWORD", raising=False)
    message = error_of(tmp_path, VALID)
    assert "kafka.properties.sasl.password: environment variable TEST_SASL_PASSWORD is not set" in message


def test_environment_defaults():
    assert expand_env({"a": ["${NOPE_X:-fallback}", "x${HOME_X}y"]}, environ={"HOME_X": "h"}) == {"a": ["fallback", "xhy"]}


def test_not_yaml(tmp_path):
    assert "not valid YAML" in error_of(tmp_path, "kafka: [unclosed\n")


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read configuration"):
        load_config(tmp_path / "absent.yaml")
