"""Tables in the Iceberg catalog: creating configured tables, checking existing ones, and the
pyiceberg view of the same catalog for metadata reads.

DDL goes through Spark (whatever catalog Spark is configured with: JDBC, REST, Hive, Glue), so
the JVM, which commits to these tables, also owns their creation. pyiceberg is for metadata
only: it cannot scan tables that carry equality deletes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import quote

from icecdc.domain.errors import CatalogUnavailable, IcebergError, NoSuchTable, UserError
from icecdc.domain.tableref import TableRef
from icecdc.domain.tablespec import PartitionField, TableShape
from icecdc.domain.transient import MAX_CHAIN, Symptoms, classify
from icecdc.jvm.bridge import java_errors
from icecdc.runtime.config import CatalogConfig, Config
from icecdc.runtime.health import Check, cached
from icecdc.runtime.outages import CatalogRetry

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table
    from pyspark.sql import SparkSession

T = TypeVar("T")


class TableMismatchError(UserError):
    """An existing table does not have the shape its configuration declares."""


def pyiceberg_properties(catalog: CatalogConfig) -> dict[str, str]:
    """Catalog properties as pyiceberg expects them. pyiceberg has no ``jdbc`` catalog; its
    ``sql`` catalog reads and writes the same tables through SQLAlchemy, so a JDBC URI is
    translated (``jdbc:sqlite:/p`` -> ``sqlite:////p``, ``jdbc:postgresql://h/db`` ->
    ``postgresql+psycopg://user:password@h/db``, through psycopg 3, a dependency of icecdc).
    Every other catalog passes through as-is."""
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
        auth = quote(user, safe="") + (f":{quote(password, safe='')}" if password else "") + "@" if user else ""
        sql_uri = f"postgresql+psycopg://{auth}{uri.removeprefix('jdbc:postgresql://')}"
        # A pooled connection outlives a restart or a failover of the server only as a closed
        # socket; checked out unpinged, its first statement fails (57P01) and costs a retry.
        props.setdefault("pool_pre_ping", "true")
    else:
        raise UserError(f"pyiceberg cannot open the JDBC catalog at {uri.split('?')[0]!r}")
    return {**props, "type": "sql", "uri": sql_uri}


def translate_pyiceberg(error: BaseException) -> BaseException:
    """The ``icecdc.domain.errors`` kind of an error pyiceberg (or the database or store under it)
    raised; anything else unchanged."""
    from pyiceberg import exceptions as pyiceberg_errors

    if isinstance(error, IcebergError):
        return error
    if isinstance(error, pyiceberg_errors.NoSuchTableError):
        return NoSuchTable(str(error))
    diagnosis = classify(_symptoms(error))
    if diagnosis is not None:
        return CatalogUnavailable(f"{diagnosis.kind.value}: {type(error).__name__}: {error}")
    return error


def _symptoms(error: BaseException) -> Iterator[Symptoms]:
    """What a Python error and the errors under it say about themselves, outermost first: a
    SQLAlchemy error's DBAPI error (``orig``, with psycopg's SQLState), the HTTP error pyiceberg's
    REST client raised its own from (with the status)."""
    seen: set[int] = set()
    pending: list[BaseException] = [error]
    while pending and len(seen) < MAX_CHAIN:
        link = pending.pop(0)
        if id(link) in seen:
            continue
        seen.add(id(link))
        state = getattr(link, "pgcode", None) or getattr(link, "sqlstate", None)
        status = getattr(getattr(link, "response", None), "status_code", None)
        yield Symptoms(
            message=str(link),
            classes=frozenset(f"{c.__module__}.{c.__qualname__}" for c in type(link).__mro__),
            sql_state=state if isinstance(state, str) else None,
            http_status=status if isinstance(status, int) else None,
            disconnected=getattr(link, "connection_invalidated", False) is True,
        )
        pending.extend(e for e in (getattr(link, "orig", None), link.__cause__) if isinstance(e, BaseException))


@contextmanager
def pyiceberg_errors() -> Iterator[None]:
    try:
        yield
    except Exception as error:
        translated = translate_pyiceberg(error)
        if translated is error:
            raise
        raise translated from error


def metadata_call(retry: CatalogRetry | None, what: str, function: Callable[[], T]) -> T:
    """A pyiceberg call (a catalog request, a manifest read): errors translated, and tried again
    while the catalog is unavailable."""

    def attempt() -> T:
        with pyiceberg_errors():
            return function()

    return retry.call(what, attempt) if retry is not None else attempt()


def local_warehouse(catalog_properties: Mapping[str, str]) -> bool:
    """Whether the catalog's warehouse is a path on this host's file system."""
    return catalog_properties.get("warehouse", "").startswith(("/", "file:"))


def pyiceberg_catalog(config: Config) -> Catalog:
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import NotInstalledError

    properties = pyiceberg_properties(config.catalog)
    try:
        return load_catalog(config.catalog.name, **properties)
    except NotInstalledError as missing:
        # pyiceberg names its own extras; the driver icecdc's translated URI asks for is what is missing.
        module = getattr(missing.__cause__, "name", None) or str(missing.__cause__ or missing)
        scheme = properties.get("uri", "").split(":", 1)[0]
        hint = (
            "pip install 'psycopg[binary]>=3.2' (icecdc depends on it: reinstall icecdc)" if "psycopg" in scheme else str(missing)
        )
        raise UserError(
            f"the catalog {config.catalog.name} ({scheme or properties.get('type')}) needs {module}, which is missing: {hint}"
        ) from None


def load_metadata_table(catalog: Catalog, ref: TableRef) -> Table | None:
    """The pyiceberg table (metadata only: pyiceberg cannot scan equality deletes); None while
    it does not exist."""
    try:
        with pyiceberg_errors():
            return catalog.load_table(ref.identifier)
    except NoSuchTable:
        return None


def older_spec_data_live(table: Table) -> bool:
    """Whether the table's current snapshot holds live data files of a partition spec other than
    its current one, from the manifest list alone (each manifest names its spec and counts its
    live files)."""
    from pyiceberg.manifest import ManifestContent

    snapshot = table.current_snapshot()
    if snapshot is None:
        return False
    current = table.spec().spec_id
    with pyiceberg_errors():
        manifests = snapshot.manifests(table.io)
    return any(
        m.content == ManifestContent.DATA
        and m.partition_spec_id != current
        and (m.added_files_count or 0) + (m.existing_files_count or 0) > 0
        for m in manifests
    )


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


def live_shape(table: Table) -> TableShape:
    """A pyiceberg table's columns, key and partitioning, spelled as a configured shape is."""
    schema = table.schema()
    columns = {field.name: str(field.field_type) for field in schema.fields}
    partition = tuple(
        PartitionField.from_iceberg(schema.find_column_name(f.source_id) or "", str(f.transform)) for f in table.spec().fields
    )
    return TableShape(columns, tuple(schema.identifier_field_names()), partition, int(table.metadata.format_version))


def ensure_tables(spark: SparkSession, config: Config, retry: CatalogRetry | None = None) -> list[str]:
    """Create every configured table that has a schema and does not exist (format v2, identifier
    fields = primary key, when it has one); check the ones that exist. Returns the names created.

    Raises TableMismatchError listing every difference, for all tables at once, rather than
    writing into a table whose key or partitioning differs from what the ingester assumes. Each
    statement is idempotent, so that a catalog outage in the middle is retried safely.
    """

    def sql(what: str, statement: str) -> None:
        def run() -> None:
            with java_errors():
                spark.sql(statement)

        retry.call(what, run) if retry is not None else run()

    catalog = metadata_call(retry, "opening the catalog", lambda: pyiceberg_catalog(config))
    created: list[str] = []
    problems: list[str] = []
    for table in config.tables:
        ref = config.table_ref(table)
        existing = metadata_call(retry, f"loading {ref}", functools.partial(load_metadata_table, catalog, ref))
        shape = table.shape
        if shape is None:
            if existing is None:
                problems.append(f"{table.name}: does not exist and has no schema in the config to create it from")
            continue
        if existing is None:
            sql(f"creating {ref.qualified_namespace}", f"CREATE NAMESPACE IF NOT EXISTS {ref.qualified_namespace}")
            sql(f"creating {ref}", shape.create_table_sql(ref.qualified, table.properties, if_not_exists=True))
            if shape.identifier_fields:  # an append-only mirror has no key
                keys = ", ".join(f"`{c}`" for c in shape.identifier_fields)
                sql(f"setting the primary key of {ref}", f"ALTER TABLE {ref.qualified} SET IDENTIFIER FIELDS {keys}")
            created.append(table.name)
            continue
        problems.extend(f"{table.name}: {p}" for p in shape.differences(live_shape(existing), evolved=table.evolve_schema))
    if problems:
        raise TableMismatchError("tables disagree with the configuration:\n  " + "\n  ".join(problems))
    return created
