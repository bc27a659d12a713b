from pathlib import Path

import pytest

from icecdc.domain.errors import UserError
from icecdc.runtime.catalog import pyiceberg_catalog, pyiceberg_properties
from icecdc.runtime.config import CatalogConfig, embedded_config, load_config
from icecdc.runtime.spark import jdbc_driver_jar


def test_sqlite_jdbc_becomes_sql_catalog():
    props = pyiceberg_properties(CatalogConfig(properties={"type": "jdbc", "uri": "jdbc:sqlite:/data/c.db", "warehouse": "/w"}))
    assert props == {"type": "sql", "uri": "sqlite:////data/c.db", "warehouse": "/w"}
    waiting = pyiceberg_properties(
        CatalogConfig(properties={"type": "jdbc", "uri": "jdbc:sqlite:/c.db", "jdbc.busy_timeout": "30000"})
    )
    assert waiting["uri"] == "sqlite:////c.db?timeout=30"


def test_postgres_jdbc_carries_credentials():
    props = pyiceberg_properties(
        CatalogConfig(
            properties={
                "type": "jdbc",
                "uri": "jdbc:postgresql://db:5432/lake",
                "jdbc.user": "ice",
                "jdbc.password": "pw",
                "warehouse": "s3://b/w",
            }
        )
    )
    assert props == {
        "type": "sql",
        "uri": "postgresql+psycopg://ice:pw@db:5432/lake",
        "warehouse": "s3://b/w",
        "pool_pre_ping": "true",
    }


def test_postgres_credentials_are_quoted_for_the_url():
    props = pyiceberg_properties(
        CatalogConfig(
            properties={"type": "jdbc", "uri": "jdbc:postgresql://db/lake", "jdbc.user": "ice@corp", "jdbc.password": "p:w/@#"}
        )
    )
    assert props["uri"] == "postgresql+psycopg://ice%40corp:p%3Aw%2F%40%23@db/lake"
    without_password = pyiceberg_properties(
        CatalogConfig(properties={"type": "jdbc", "uri": "jdbc:postgresql://db/lake", "jdbc.user": "ice"})
    )
    assert without_password["uri"] == "postgresql+psycopg://ice@db/lake"


def test_the_sql_catalog_opens_postgres_through_the_installed_driver():
    """The URL's driver is one icecdc installs: SQLAlchemy resolves its dialect without a server."""
    from sqlalchemy import create_engine

    props = pyiceberg_properties(CatalogConfig(properties={"type": "jdbc", "uri": "jdbc:postgresql://127.0.0.1:1/lake"}))
    assert create_engine(props["uri"]).dialect.driver == "psycopg"


def test_a_missing_driver_is_a_user_error_naming_what_to_install(monkeypatch):
    from pyiceberg.exceptions import NotInstalledError

    def load_catalog(name, **properties):
        try:
            raise ModuleNotFoundError("No module named 'psycopg'", name="psycopg")
        except ImportError as exc:
            raise NotInstalledError("SQLAlchemy support not installed: pip install 'pyiceberg[sql-postgres]'") from exc

    monkeypatch.setattr("pyiceberg.catalog.load_catalog", load_catalog)
    config = embedded_config(Path("/tmp/unused")).model_copy(
        update={
            "catalog": CatalogConfig(properties={"type": "jdbc", "uri": "jdbc:postgresql://db/lake", "jdbc.password": "secret"})
        }
    )
    with pytest.raises(UserError, match=r"needs psycopg, which is missing: pip install 'psycopg\[binary\]") as raised:
        pyiceberg_catalog(config)
    assert "secret" not in str(raised.value)


def test_other_catalogs_pass_through():
    given = {"type": "rest", "uri": "http://r:8181", "credential": "a:b"}
    assert pyiceberg_properties(CatalogConfig(properties=given)) == given


def test_unknown_jdbc_database():
    with pytest.raises(UserError, match="pyiceberg cannot open"):
        pyiceberg_properties(CatalogConfig(properties={"type": "jdbc", "uri": "jdbc:oracle:thin:@x"}))


EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "postgres-catalog.yaml"


def test_the_documented_postgres_catalog_opens_on_both_sides(monkeypatch, tmp_path):
    monkeypatch.setenv("CATALOG_DB_HOST", "catalog-db")
    monkeypatch.setenv("CATALOG_DB_PASSWORD", "s3cret")
    config = load_config(EXAMPLE)
    # Spark: Iceberg's JDBC catalog with Debian's driver, the password given to the driver only.
    (tmp_path / "postgresql.jar").touch()
    assert jdbc_driver_jar(config.catalog.properties, [], java_dir=tmp_path) == tmp_path / "postgresql.jar"
    assert config.catalog.properties["uri"] == "jdbc:postgresql://catalog-db:5432/shop"
    # pyiceberg: the SQL catalog on the same database, through psycopg, with the same credentials.
    props = pyiceberg_properties(config.catalog)
    assert props["uri"] == "postgresql+psycopg://iceberg:s3cret@catalog-db:5432/shop"
    assert not [key for key in props if key.startswith("jdbc.")]
