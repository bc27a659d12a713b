"""Tables in the Iceberg catalog: creating configured tables, checking existing ones, and the
pyiceberg view of the same catalog for metadata reads.

DDL goes through Spark (whatever catalog Spark is configured with: JDBC, REST, Hive, Glue), so
the JVM, which commits to these tables, also owns their creation. pyiceberg is for metadata
only: it cannot scan tables that carry equality deletes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from icecdc.config import CatalogConfig, Config, TableConfig
from icecdc.errors import UserError
from icecdc.health import Check, cached
from icecdc.jvm import load_table
from icecdc.tablespec import PartitionField, TableShape

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyspark.sql import SparkSession


class TableMismatchError(UserError):
    """An existing table does not have the shape its configuration declares."""


def qualified(config: Config, table: TableConfig | str) -> str:
    name = table if isinstance(table, str) else table.name
    return f"{config.catalog.name}.{name}"


def pyiceberg_properties(catalog: CatalogConfig) -> dict[str, str]:
    """Catalog properties as pyiceberg expects them. pyiceberg has no ``jdbc`` catalog; its
    ``sql`` catalog reads and writes the same tables through SQLAlchemy, so a JDBC URI is
    translated (``jdbc:sqlite:/p`` -> ``sqlite:////p``, ``jdbc:postgresql://h/db`` ->
    ``postgresql+psycopg2://user:password@h/db``). Every other catalog passes through as-is."""
    props = dict(catalog.properties)
    if props.get("type") != "jdbc":
        return props
    uri = props.pop("uri", "")
    user, password = props.pop("jdbc.user", None), props.pop("jdbc.password", None)
    busy_ms = props.get("jdbc.busy_timeout")
    props = {k: v for k, v in props.items() if not k.startswith("jdbc.")}
    if uri.startswith("jdbc:sqlite:"):
        path = uri.removeprefix("jdbc:sqlite:").removeprefix("file:")
        # Wait for another process's write lock as long as the JVM side does (Python's sqlite3
        # gives up after 5 s by default).
        sql_uri = f"sqlite:///{path}" + (f"?timeout={int(busy_ms) / 1000:g}" if busy_ms else "")
    elif uri.startswith("jdbc:postgresql:"):
        auth = f"{user}:{password}@" if user and password else (f"{user}@" if user else "")
        sql_uri = f"postgresql+psycopg2://{auth}{uri.removeprefix('jdbc:postgresql://')}"
    else:
        raise ValueError(f"pyiceberg cannot open the JDBC catalog at {uri.split('?')[0]!r}")
    return {**props, "type": "sql", "uri": sql_uri}


def pyiceberg_catalog(config: Config) -> Catalog:
    from pyiceberg.catalog import load_catalog

    return load_catalog(config.catalog.name, **pyiceberg_properties(config.catalog))


# Readiness probes come every few seconds; the catalog is asked at most this often.
CATALOG_CHECK_SECONDS = 10.0


def catalog_check(config: Config) -> Check:
    """A readiness check: the catalog answers a namespace listing."""

    catalog: list[Catalog] = []  # opened once, on the first probe: probes must not open connections

    def reachable() -> tuple[bool, str]:
        if not catalog:
            catalog.append(pyiceberg_catalog(config))
        namespaces = catalog[0].list_namespaces()
        return True, f"catalog {config.catalog.name} answers ({len(namespaces)} namespaces)"

    return cached(reachable, CATALOG_CHECK_SECONDS)


def live_shape(spark: SparkSession, qualified_name: str) -> TableShape:
    table = load_table(spark, qualified_name)
    schema = table.schema()
    columns = {field.name(): field.type().toString() for field in schema.columns()}
    partition = tuple(
        PartitionField.from_iceberg(schema.findColumnName(field.sourceId()), field.transform().toString())
        for field in table.spec().fields()
    )
    return TableShape(columns, tuple(schema.identifierFieldNames()), partition)


def ensure_tables(spark: SparkSession, config: Config) -> list[str]:
    """Create every configured table that has a schema and does not exist (format v2, identifier
    fields = primary key); check the ones that exist. Returns the names created.

    Raises TableMismatchError listing every difference, for all tables at once, rather than
    writing into a table whose key or partitioning differs from what the ingester assumes.
    """
    created: list[str] = []
    problems: list[str] = []
    for table in config.tables:
        name = qualified(config, table)
        exists = spark.catalog.tableExists(name)
        shape = table.shape
        if shape is None:
            if not exists:
                problems.append(f"{table.name}: does not exist and has no schema in the config to create it from")
            continue
        if not exists:
            namespace = name.rsplit(".", 1)[0]
            spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {namespace}")
            spark.sql(shape.create_table_sql(name, table.properties))
            spark.sql(f"ALTER TABLE {name} SET IDENTIFIER FIELDS {', '.join(f'`{c}`' for c in shape.identifier_fields)}")
            created.append(table.name)
            continue
        problems.extend(f"{table.name}: {p}" for p in shape.differences(live_shape(spark, name)))
    if problems:
        raise TableMismatchError("tables disagree with the configuration:\n  " + "\n  ".join(problems))
    return created
