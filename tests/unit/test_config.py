from pathlib import Path

import pytest

from icecdc.runtime.config import ConfigError, expand_env, load_config, parse_config

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


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        pytest.param("primary_key: [id]", "primary_key: [id]\n    primry: 1", "tables[0].primry: unknown key", id="unknown-key"),
        pytest.param("commit_topic:", "kafak: {}\ncommit_topic:", "kafak: unknown key", id="unknown-top-level-key"),
        pytest.param('master: "local[2]"', "master: [1]", "spark.master: Input should be a valid string", id="wrong-type"),
        pytest.param(
            "  - name: db.orders\n    topic:", "  - topic:", "tables[0].name: required key is missing", id="missing-table-key"
        ),
        pytest.param(
            '"days(updated_at)"', '"dayz(updated_at)"', "tables[0]: unknown partition transform 'dayz'", id="bad-transform"
        ),
        pytest.param('"days(updated_at)"', '"days(region)"', "day cannot apply to 'region' of type string", id="transform-type"),
        pytest.param(
            '"bucket(16, id)"', '"bucket(16, nope)"', "names column 'nope', which is not in the schema", id="partition-column"
        ),
        pytest.param(
            "amount: double",
            "amount: dubble",
            "tables[0].schema: column 'amount': unknown column type 'dubble'",
            id="column-type",
        ),
        pytest.param(
            "primary_key: [id]",
            "primary_key: [order_id]",
            "primary_key column(s) ['order_id'] are not in the schema",
            id="key-column",
        ),
        pytest.param("spark.driver.memory", "driver.memory", "spark.conf: keys must start with 'spark.'", id="spark-conf-key"),
        pytest.param("    type: jdbc\n", "", "catalog.properties: needs 'type'", id="catalog-type"),
        pytest.param("name: db.orders", "name: orders", "must be namespace.table", id="table-namespace"),
    ],
)
def test_bad_files_fail_naming_the_problem(tmp_path, old, new, message):
    assert old in VALID
    assert message in error_of(tmp_path, VALID.replace(old, new))


def test_duplicate_topics_are_rejected():
    table = {"topic": "t", "primary_key": ["id"]}
    with pytest.raises(ConfigError, match="two tables share the topic 't'"):
        parse_config(
            {"catalog": {"properties": {"type": "rest"}}, "tables": [{"name": "db.a", **table}, {"name": "db.b", **table}]}
        )


@pytest.mark.parametrize(
    ("ingest", "message"),
    [
        pytest.param(
            {"min_commit_interval_seconds": 2, "max_commit_delay_seconds": 1},
            "ingest: max_commit_delay_seconds (1) is below min_commit_interval_seconds (2)",
            id="delay-below-floor",
        ),
        pytest.param({"min_commit_interval_seconds": 6}, "max_commit_delay_seconds (5) is below", id="floor-above-default-delay"),
        pytest.param(
            {"min_commit_interval_seconds": 0}, "ingest.min_commit_interval_seconds: Input should be greater than 0", id="zero"
        ),
        pytest.param({"trigger_seconds": 5}, "ingest: trigger_seconds is gone: set min_commit_interval_seconds", id="old-key"),
    ],
)
def test_the_commit_floor_and_delay_are_checked(ingest, message):
    with pytest.raises(ConfigError) as info:
        parse_config({"catalog": {"properties": {"type": "rest"}}, "ingest": ingest})
    assert message in str(info.value)


def test_the_commit_delay_may_equal_the_floor():
    config = parse_config(
        {"catalog": {"properties": {"type": "rest"}}, "ingest": {"min_commit_interval_seconds": 5, "max_commit_delay_seconds": 5}}
    )
    assert (config.ingest.min_commit_interval_seconds, config.ingest.max_commit_delay_seconds) == (5.0, 5.0)


@pytest.mark.parametrize("branch", ["main", "", "has space", "-leading-dash"])
def test_a_staging_branch_must_be_a_branch_other_than_main(branch):
    with pytest.raises(ConfigError, match="staging_branch"):
        parse_config(
            {
                "catalog": {"properties": {"type": "rest"}},
                "tables": [{"name": "db.a", "topic": "t", "primary_key": ["id"], "staging_branch": branch}],
            }
        )


def test_a_staged_tables_ref_names_its_branch_and_others_name_main():
    table = {"topic": "t", "primary_key": ["id"]}
    config = parse_config(
        {
            "catalog": {"properties": {"type": "rest"}},
            "tables": [{"name": "db.a", **table, "staging_branch": "icecdc-staged"}, {"name": "db.b", **table, "topic": "u"}],
        }
    )
    assert config.table_ref("db.a").branch == "icecdc-staged" and config.table_ref(config.tables[0]).staged
    assert config.table_ref("db.b").branch == "main" and not config.table_ref("db.b").staged
    assert config.table_ref("db.unconfigured").branch == "main"


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


def test_a_table_with_a_topic_and_no_primary_key_is_an_append_only_mirror():
    catalog = {"properties": {"type": "rest"}}
    config = parse_config({"catalog": catalog, "tables": [{"name": "db.history", "topic": "t", "truncate": "dead-letter"}]})
    (table,) = config.tables
    assert table.primary_key == [] and table.ingested
    assert table.shape is None
    schema = {"aid": "int", "mtime": "timestamp", "filler": "string"}
    created = parse_config({"catalog": catalog, "tables": [{"name": "db.history", "topic": "t", "schema": schema}]})
    shape = created.tables[0].shape
    assert shape is not None and shape.identifier_fields == () and "NOT NULL" not in shape.create_table_sql("lake.db.history", {})


@pytest.mark.parametrize(
    "settings",
    [
        {"before_image": "full"},
        {"unknown_partition": "dead-letter"},
        {"unavailable_values": "keep-placeholder"},
        {"before_image": "full", "unknown_partition": "same-partition"},
    ],
)
def test_an_append_only_mirror_refuses_the_settings_of_updates_and_deletes(settings):
    with pytest.raises(ConfigError) as info:
        parse_config({"catalog": {"properties": {"type": "rest"}}, "tables": [{"name": "db.h", "topic": "t", **settings}]})
    assert "table db.h has no primary_key, so it is mirrored append-only" in str(info.value)
    assert ", ".join(settings) + " apply to updates and deletes only" in str(info.value)
    # With a key, or kept for another writer (no topic), the same settings are fine.
    parse_config(
        {
            "catalog": {"properties": {"type": "rest"}},
            "tables": [{"name": "db.h", "topic": "t", "primary_key": ["id"], **settings}],
        }
    )
    parse_config({"catalog": {"properties": {"type": "rest"}}, "tables": [{"name": "db.h", **settings}]})
