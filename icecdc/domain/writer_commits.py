"""Another writer's commits as plain facts: what a snapshot of a table icecdc does not ingest
added and removed, the kind of writer that makes such a commit (``WriterKind``), and the commit
event the sidecar's tracker takes from it (``commit_event``). Pure: the catalog adapter
(``icecdc.compactor.watcher``) reads the facts from the manifests each snapshot added
(docs/compactor.md, "Beside other writers").
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from icecdc.domain.events import CommitEvent, PartitionDelta
from icecdc.domain.files import DataFileContent

# What the sidecar puts in ``CommitEvent.writer`` for a commit it found in the catalog.
FOUND_WRITER: Final = "found-in-catalog"


class WriterKind(int, enum.Enum):
    """What a writer's commit does to the files already in the table, the least demanding first:
    a higher kind fails on more of the sidecar's commits (docs/compactor.md, "Beside other
    writers")."""

    APPENDS = 0  # only adds data files (Iceberg's Kafka Connect sink)
    # Adds equality deletes, and position deletes only against files added in the same commit
    # (Flink's upsert sink, debezium-server-iceberg).
    EQUALITY_DELETES = 1
    # Adds position deletes or deletion vectors against older data files (Spark merge-on-read
    # MERGE, UPDATE, DELETE): its commit checks that none of those files was removed.
    DELETES_IN_PLACE = 2
    # Removes data files (a copy-on-write overwrite, a delete of whole files, someone's rewrite):
    # its commit fails when a file it removes is already gone.
    REPLACES_FILES = 3

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", "-")


@dataclass(frozen=True)
class FileChange:
    """One manifest entry a snapshot wrote: a file it added or removed."""

    content: DataFileContent
    added: bool  # False: removed (a DELETED entry)
    path: str
    partition: Mapping[str, Any]
    # The tracked path (an older spec's carries its id); None: a global delete, or a file of a
    # spec whose source columns are gone, in no tracked partition.
    partition_path: str | None
    spec_id: int
    records: int = 0
    size: int = 0
    # Position deletes and deletion vectors: the one data file they apply to, when the file says
    # (``referenced_data_file``, or equal bounds on its ``file_path`` column); None: unknown.
    referenced_data_file: str | None = None


@dataclass(frozen=True)
class FoundCommit:
    """A snapshot of a kept table as the catalog holds it, with the files it added and removed."""

    table: str
    snapshot_id: int
    parent_snapshot_id: int | None
    sequence_number: int
    commit_time_ms: int
    operation: str
    changes: Sequence[FileChange] = field(default_factory=tuple)


@dataclass(frozen=True)
class SummaryCounts:
    """What a snapshot summary counts (Iceberg's ``SnapshotSummary`` keys), for snapshots whose
    manifests are not read: those already in the table when the sidecar first sees it."""

    added_data_files: int = 0
    deleted_data_files: int = 0
    added_equality_delete_files: int = 0
    added_position_delete_files: int = 0  # v2 position-delete files and v3 deletion vectors

    @classmethod
    def from_summary(cls, summary: Mapping[str, str]) -> SummaryCounts:
        def count(*keys: str) -> int:
            return sum(int(summary.get(key, "0") or 0) for key in keys)

        return cls(
            added_data_files=count("added-data-files"),
            deleted_data_files=count("deleted-data-files"),
            added_equality_delete_files=count("added-equality-delete-files"),
            added_position_delete_files=count("added-position-delete-files", "added-dvs"),
        )


def classify_counts(counts: SummaryCounts) -> WriterKind:
    """The kind of a commit known only by its summary: position deletes beside equality deletes
    are taken for a Flink-like writer's deletes of its own new rows, any others for deletes in place."""
    if counts.deleted_data_files:
        return WriterKind.REPLACES_FILES
    if counts.added_position_delete_files and not counts.added_equality_delete_files:
        return WriterKind.DELETES_IN_PLACE
    if counts.added_equality_delete_files or counts.added_position_delete_files:
        return WriterKind.EQUALITY_DELETES
    return WriterKind.APPENDS


def classify(commit: FoundCommit) -> WriterKind:
    """The kind of one commit, from the files it added and removed. A position delete whose data
    file is unknown, or not one the commit added, deletes rows in place."""
    added_data = {c.path for c in commit.changes if c.added and c.content is DataFileContent.DATA}
    if any(not c.added and c.content is DataFileContent.DATA for c in commit.changes):
        return WriterKind.REPLACES_FILES
    positions = [c for c in commit.changes if c.added and c.content is DataFileContent.POSITION_DELETES]
    if any(c.referenced_data_file is None or c.referenced_data_file not in added_data for c in positions):
        return WriterKind.DELETES_IN_PLACE
    if positions or any(c.added and c.content is DataFileContent.EQUALITY_DELETES for c in commit.changes):
        return WriterKind.EQUALITY_DELETES
    return WriterKind.APPENDS


def told_by_event(commit: FoundCommit) -> bool:
    """Whether the commit's event counts all it did: it added data and equality-delete files only."""
    return all(c.added and c.content is not DataFileContent.POSITION_DELETES for c in commit.changes)


def touched_partitions(commit: FoundCommit) -> frozenset[str]:
    """The partitions the commit added files to or removed files from."""
    return frozenset(c.partition_path for c in commit.changes if c.partition_path is not None)


def most_demanding(kinds: Iterable[WriterKind], known: WriterKind | None = None) -> WriterKind | None:
    """The most demanding of ``kinds`` and what was known before (None: nothing seen yet)."""
    return max([*kinds, *([known] if known is not None else [])], default=None)


def commit_event(commit: FoundCommit) -> CommitEvent:
    """The commit event icecdc's ingester would have sent for the commit: the partitions it touched,
    with the data and equality-delete files it added. Removed files and position deletes have no
    field in the event; the table's metadata, read right after, counts them."""
    deltas: dict[str, PartitionDelta] = {}
    for change in commit.changes:
        if change.partition_path is None:
            continue
        delta = deltas.get(change.partition_path) or PartitionDelta(dict(change.partition), change.partition_path, change.spec_id)
        if change.added and change.content is DataFileContent.DATA:
            delta = replace(
                delta,
                data_files=delta.data_files + 1,
                data_bytes=delta.data_bytes + change.size,
                data_records=delta.data_records + change.records,
            )
        elif change.added and change.content is DataFileContent.EQUALITY_DELETES:
            delta = replace(
                delta,
                equality_delete_files=delta.equality_delete_files + 1,
                equality_delete_records=delta.equality_delete_records + change.records,
            )
        deltas[change.partition_path] = delta
    return CommitEvent(
        table=commit.table,
        snapshot_id=commit.snapshot_id,
        parent_snapshot_id=commit.parent_snapshot_id,
        sequence_number=commit.sequence_number,
        commit_time_ms=commit.commit_time_ms,
        operation=commit.operation,
        writer=FOUND_WRITER,
        batch_id=None,
        source_offsets={},
        partitions=sorted(deltas.values(), key=lambda d: d.partition_path),
    )


@dataclass(frozen=True)
class SnapshotLink:
    """One snapshot's place in a table's history and whether the sidecar committed it."""

    snapshot_id: int
    parent_snapshot_id: int | None
    ours: bool


def new_snapshots(history: Mapping[int, SnapshotLink], current: int | None, last_seen: int | None) -> list[int]:
    """The snapshots from ``last_seen`` (exclusive) to ``current``, oldest first, walking parent
    ids; the whole retained history when ``last_seen`` is not an ancestor of ``current``."""
    out: list[int] = []
    at = current
    while at is not None and at != last_seen and at in history:
        out.append(at)
        at = history[at].parent_snapshot_id
    return out[::-1]
