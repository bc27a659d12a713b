"""For readers of icecdc's tables that cannot apply equality deletes: the newest snapshot they
read exactly (``icecdc.domain.portable``), from the table's metadata through pyiceberg, and
``icecdc portable-snapshot``, which prints it for engines that take a snapshot id (DuckDB's
``iceberg_scan(..., snapshot_from_id = ...)``, pyiceberg's ``scan(snapshot_id=...)``, Spark's
``VERSION AS OF``). Reading the table commits nothing; no ref is kept for it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from icecdc.compactor.metadata import branch_history
from icecdc.domain.portable import PortableSnapshot, newest_portable
from icecdc.domain.tableref import MAIN_BRANCH

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from icecdc.runtime.config import Config


def portable_snapshot(table: Table) -> PortableSnapshot | None:
    """The newest snapshot of ``table``'s current history that holds no equality delete, as
    loaded; None when the table has no snapshot or none in its history is portable."""
    return newest_portable(branch_history(table, MAIN_BRANCH))


def portable_snapshots(config: Config, tables: list[str] | None = None) -> dict[str, PortableSnapshot | None]:
    """``portable_snapshot`` of each configured table (or of ``tables``), as the catalog has it now."""
    from icecdc.runtime.catalog import pyiceberg_catalog

    catalog = pyiceberg_catalog(config)
    names = tables or [t.name for t in config.tables]
    return {name: portable_snapshot(catalog.load_table(config.table_ref(name).identifier)) for name in names}


def describe(table: str, portable: PortableSnapshot | None) -> str:
    """One line for a person."""
    if portable is None:
        return f"{table}: no portable snapshot (no snapshot, or an equality delete live in every one kept)"
    if portable.is_current:
        return f"{table}: {portable.snapshot_id} (the current snapshot)"
    return (
        f"{table}: {portable.snapshot_id}, {portable.commits_behind} commit(s) and "
        f"{portable.seconds_behind:.1f}s behind the current snapshot {portable.current_snapshot_id}"
    )


def to_dict(portable: PortableSnapshot | None) -> dict[str, Any] | None:
    return None if portable is None else dataclasses.asdict(portable)
