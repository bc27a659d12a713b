import pytest

from icecdc.domain.errors import UserError
from icecdc.runtime.catalog import pyiceberg_properties
from icecdc.runtime.config import CatalogConfig


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
    assert props == {"type": "sql", "uri": "postgresql+psycopg2://ice:pw@db:5432/lake", "warehouse": "s3://b/w"}


def test_other_catalogs_pass_through():
    given = {"type": "rest", "uri": "http://r:8181", "credential": "a:b"}
    assert pyiceberg_properties(CatalogConfig(properties=given)) == given


def test_unknown_jdbc_database():
    with pytest.raises(UserError, match="pyiceberg cannot open"):
        pyiceberg_properties(CatalogConfig(properties={"type": "jdbc", "uri": "jdbc:oracle:thin:@x"}))
