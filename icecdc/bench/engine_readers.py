"""Readers that cannot apply equality deletes, reading one snapshot of a live table as a user's
other engines would: pyiceberg's scan and DuckDB's iceberg extension (LOADed from the files its
PyPI packages ship, never INSTALLed). Whether a read was exact is for ``icecdc.bench.portability``.
"""

from __future__ import annotations

import enum
import importlib.resources
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from icecdc.bench.portability import KeyDigest

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.table import Table


class Reader(str, enum.Enum):
    PYICEBERG = "pyiceberg"
    DUCKDB = "duckdb"


@dataclass(frozen=True)
class Refused:
    """The reader declined the snapshot; ``reason`` is its own error, as it said it."""

    reason: str


@dataclass(frozen=True)
class Read:
    """What one reader read of one snapshot."""

    reader: Reader
    snapshot_id: int | None
    rows: pa.Table | None  # None when refused
    refused: Refused | None = None


def _extension(package: str, name: str) -> str:
    """The path of the extension file a ``duckdb-extension-*`` package ships."""
    import duckdb

    path = importlib.resources.files(package) / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: {package.replace('_', '-')} must match duckdb {duckdb.__version__} (pip install 'icecdc[test]')"
        )
    return str(path)


def duckdb_connection() -> Any:
    """An in-memory DuckDB with the avro and iceberg extensions loaded (avro first: iceberg uses it)."""
    import duckdb

    connection = duckdb.connect(config={"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"})
    for package, name in (("duckdb_extension_avro", "avro"), ("duckdb_extension_iceberg", "iceberg")):
        path = _extension(package, name).replace("'", "''")
        connection.execute(f"LOAD '{path}'")
    return connection


def _snapshot_id(table: Table, snapshot_id: int | None) -> int | None:
    if snapshot_id is not None:
        return snapshot_id
    current = table.current_snapshot()
    return current.snapshot_id if current is not None else None


def read_pyiceberg(table: Table, columns: Sequence[str] = ("*",), snapshot_id: int | None = None) -> Read:
    """pyiceberg's scan of the loaded snapshot (or ``snapshot_id``); a refusal when it raises on what it cannot apply."""
    snapshot_id = _snapshot_id(table, snapshot_id)
    try:
        rows = table.scan(selected_fields=tuple(columns), snapshot_id=snapshot_id).to_arrow()
    except (ValueError, NotImplementedError) as error:
        return Read(Reader.PYICEBERG, snapshot_id, None, Refused(f"{type(error).__name__}: {error}"))
    return Read(Reader.PYICEBERG, snapshot_id, rows)


def read_duckdb(table: Table, columns: Sequence[str] = ("*",), connection: Any = None, snapshot_id: int | None = None) -> Read:
    """DuckDB's ``iceberg_scan`` of the loaded metadata file (or ``snapshot_id``); a refusal when
    DuckDB raises on the table (its own error, not I/O)."""
    import duckdb

    chosen = snapshot_id
    snapshot_id = _snapshot_id(table, snapshot_id)
    own = connection is None
    connection = duckdb_connection() if own else connection
    try:
        location = table.metadata_location.replace("'", "''")
        selected = ", ".join(c if c == "*" else f'"{c}"' for c in columns)
        at = "" if chosen is None else f", snapshot_from_id = {int(chosen)}"
        rows = connection.execute(f"SELECT {selected} FROM iceberg_scan('{location}'{at})").to_arrow_table()
    except (duckdb.NotImplementedException, duckdb.InvalidInputException) as error:
        return Read(Reader.DUCKDB, snapshot_id, None, Refused(f"{type(error).__name__}: {error}"))
    finally:
        if own:
            connection.close()
    return Read(Reader.DUCKDB, snapshot_id, rows)


def read_all(table: Table, columns: Sequence[str] = ("*",), connection: Any = None, snapshot_id: int | None = None) -> list[Read]:
    """Both readers, on the same snapshot (the loaded one, or ``snapshot_id``)."""
    return [read_pyiceberg(table, columns, snapshot_id), read_duckdb(table, columns, connection, snapshot_id)]


def key_digest(read: Read, key: str = "id") -> KeyDigest | None:
    """A read's digest by its key column (``portability.KeyDigest``); None when it was refused."""
    if read.rows is None:
        return None
    return KeyDigest.of(read.rows.column(key).to_pylist())
