"""Completes the rows whose unsent (TOAST) values a batch does not hold, from their keys' earlier
versions in the table (``unavailable_values: resolve``). ``unavailable`` decides what to read and
how a row is completed; this module reads, writes the completed rows and keeps the primary-key
changes whose create a later batch may bring. It commits nothing.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from icecdc.domain.layout import TableLayout
from icecdc.ingest import batch_decisions, metrics, unavailable
from icecdc.ingest.batch_decisions import Committed, DeadLetter, JobResult, Truncates, WrittenFile
from icecdc.ingest.unavailable import Key, MovedImage, UnresolvedRow, Version, unavailable_detail

log = logging.getLogger(__name__)

# (key, version) -> the row read for it
ReadRows = dict[tuple[Key, Version], dict[str, Any]]


class KeyedTable(Protocol):
    """What resolution reads from a table: the rows of some keys, at a snapshot."""

    def key_rows(
        self, key_columns: Sequence[str], keys: Collection[Key], columns: Sequence[str], snapshot_id: int | None = None
    ) -> dict[Key, dict[str, Any]]: ...


class RowWriter(Protocol):
    """Writes completed rows as data files of the batch (``job.BatchJob``)."""

    def write_rows(self, layout: TableLayout, rows: Sequence[dict[str, Any]], tag: str) -> list[WrittenFile]: ...


@dataclass(frozen=True)
class Resolved:
    """What resolution leaves the batch: the rows it could not complete, as dead letters, and per
    table the key changes whose images the completed rows took."""

    letters: list[DeadLetter] = field(default_factory=list)
    followed: dict[str, list[MovedImage]] = field(default_factory=dict)


class ToastResolver:
    """Resolves unsent values batch after batch. ``layouts`` is the batch runner's own mapping, so
    a schema change made by a redo is seen here."""

    def __init__(self, *, tables: Mapping[str, KeyedTable], layouts: Mapping[str, TableLayout], writer: RowWriter) -> None:
        self._tables = tables
        self._layouts = layouts
        self._writer = writer
        # table -> the earlier batches' primary-key changes whose create may still come
        self._pending_moves: dict[str, unavailable.PendingMoves] = defaultdict(unavailable.PendingMoves)

    def resolve(self, tag: str, job: JobResult, truncated: Truncates) -> Resolved:
        """Complete the rows from their keys' earlier versions, read from the table for just those
        keys; the completed rows join the batch as data files of its commit (into ``job.files``)."""
        resolved = Resolved()
        for table, rows in job.unresolved.items():
            if not rows:
                continue
            # A key change split by batch boundaries: its old key's image is an earlier batch's.
            moved, layout = self._pending_moves[table].with_batch(job.moved.get(table, [])), self._layouts[table]
            wanted = unavailable.rows_to_read(rows, moved)
            # After a truncate in the batch, the table's rows are gone with it: nothing to read.
            found = {} if table in truncated or not wanted else self._read_rows(table, wanted, rows, moved)
            resolution = unavailable.resolve(rows, moved, found)
            resolved.followed[table] = resolution.followed
            if resolution.rows:
                job.files[table].extend(self._writer.write_rows(layout, resolution.rows, tag))
            resolved.letters.extend(batch_decisions.unresolvable_letters(table, resolution.unresolvable, _unresolvable_detail))
            _count(table, resolution, len(found))
        return resolved

    def _read_rows(
        self, table: str, wanted: Collection[tuple[Key, Version]], rows: Sequence[UnresolvedRow], moved: Sequence[MovedImage]
    ) -> ReadRows:
        """The rows of ``wanted`` keys, one read per table version."""
        columns = unavailable.columns_to_read(rows, moved)
        by_version: dict[Version, list[Key]] = defaultdict(list)
        for key, version in wanted:
            by_version[version].append(key)
        found: ReadRows = {}
        for version, keys in by_version.items():
            read = self._tables[table].key_rows(self._layouts[table].primary_key, keys, columns, version)
            found |= {(key, version): row for key, row in read.items()}
        return found

    def carry_moves(
        self, job: JobResult, commits: Mapping[str, Committed], truncated: Truncates, followed: Mapping[str, Sequence[MovedImage]]
    ) -> None:
        """Keep the batch's key changes for creates of later batches, with the table as the batch
        found it (its commit's parent); a truncate leaves nothing to take values from."""
        for table in set(self._pending_moves) | set(job.moved):
            if table in truncated:
                self._pending_moves.pop(table, None)
                continue
            commit = commits.get(table)
            before = unavailable.NO_SNAPSHOT if commit is None or commit.parent_snapshot_id is None else commit.parent_snapshot_id
            self._pending_moves[table].advance(job.moved.get(table, []), before, followed.get(table, []))


def _count(table: str, resolution: unavailable.Resolution, read: int) -> None:
    metrics.UNAVAILABLE_ROWS.labels(table, "resolved").inc(len(resolution.rows))
    metrics.UNAVAILABLE_ROWS.labels(table, "dead-lettered").inc(len(resolution.unresolvable))
    log.info(
        "%s: %d rows took unsent (TOAST) values from the %d rows read from the table; %d had no earlier version (dead-lettered)",
        table,
        len(resolution.rows),
        read,
        len(resolution.unresolvable),
        extra={"table": table},
    )


def _unresolvable_detail(row: UnresolvedRow) -> str:
    why = "the row has no earlier version to take them from (neither in the batch nor in the table)"
    return unavailable_detail(row.key, row.image.unresolved, why)
