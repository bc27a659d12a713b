"""Finding the commits of writers that send no commit event: every ``watch_interval_seconds`` the
sidecar loads each kept table (a table with no topic) from the catalog, skips it when its
metadata location has not changed, and reads only the manifests each new snapshot added. Each
commit becomes a commit event for the tracker and the writer's cadence (``writer_commits``), and
its kind tells the tracker how demanding the writer is; the table's statistics are then re-read
from the same loaded metadata (``reconcile``). The sidecar's own commits are recognised by their
tag and skipped. On first sight, or after a restart, the current snapshot is the baseline and the
retained snapshots' summaries give the writer's kind (docs/compactor.md, "Beside other writers").
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from icecdc.compactor.metadata import head_snapshot
from icecdc.compactor.policy import beside_writer
from icecdc.compactor.reconcile import Reconciler
from icecdc.compactor.tracker import PartitionTracker
from icecdc.coordinator.errors import WriterWroteThere
from icecdc.domain import summary
from icecdc.domain.errors import CatalogOutage
from icecdc.domain.events import CommitEvent
from icecdc.domain.files import DataFileContent
from icecdc.domain.layout import TableLayout
from icecdc.domain.writer_commits import (
    FileChange,
    FoundCommit,
    SnapshotLink,
    SummaryCounts,
    WriterKind,
    classify,
    classify_counts,
    commit_event,
    new_snapshots,
    told_by_event,
    touched_partitions,
)
from icecdc.runtime.catalog import load_metadata_table, metadata_call
from icecdc.runtime.config import Config

log = logging.getLogger(__name__)

# The field id of a position-delete file's ``file_path`` column (Iceberg spec, reserved ids).
DELETE_FILE_PATH_FIELD_ID = 2147483546
# Snapshots remembered per table, for the check before a compaction commits: far more than land
# on one table during one compaction.
REMEMBERED_SNAPSHOTS = 1000


@dataclass(frozen=True)
class SeenSnapshot:
    """A snapshot the watcher read: the writer's, with the partitions it touched, or ours."""

    sequence_number: int
    snapshot_id: int
    ours: bool
    # None: not read (the table's layout was not known yet), so taken as touching every partition.
    partitions: frozenset[str] | None = frozenset()

    def touches(self, partitions: Collection[str]) -> bool:
        return not self.ours and (self.partitions is None or not self.partitions.isdisjoint(partitions))


@dataclass
class WatchedTable:
    """What the watcher last saw of one kept table."""

    metadata_location: str | None = None
    snapshot_id: int | None = None
    sequence_number: int = -1
    # The sequence number of the first snapshot seen: commits before it were never read.
    watched_from: int | None = None
    # The latest snapshots read, oldest first.
    seen: deque[SeenSnapshot] = field(default_factory=lambda: deque(maxlen=REMEMBERED_SNAPSHOTS))
    # The newest snapshot no longer remembered (-1: none forgotten).
    forgotten_through: int = -1

    def remember(self, snapshot: SeenSnapshot) -> None:
        if len(self.seen) == self.seen.maxlen:
            self.forgotten_through = self.seen[0].sequence_number
        self.seen.append(snapshot)

    def knows_snapshots_after(self, sequence_number: int) -> bool:
        """Whether every snapshot after ``sequence_number``, up to the last poll, was read and is
        still remembered."""
        return (
            self.watched_from is not None and self.watched_from <= sequence_number and self.forgotten_through <= sequence_number
        )

    def writer_wrote(self, since_sequence_number: int, partitions: Collection[str]) -> bool:
        """Whether a writer's commit after ``since_sequence_number`` touched ``partitions``; True
        as well when the watcher cannot tell."""
        if not self.knows_snapshots_after(since_sequence_number):
            return True
        wanted = set(partitions)
        return any(s.sequence_number > since_sequence_number and s.touches(wanted) for s in self.seen)

    def checked_through(self, since_sequence_number: int) -> int | None:
        """The newest snapshot up to which every snapshot after ``since_sequence_number`` is the
        writer's (read, and checked by ``writer_wrote``), not the sidecar's: a sidecar commit
        in another lease's slot (a global resolution) may have added deletes to the job's files.
        None: the first snapshot after it is the sidecar's, or none was read."""
        if not self.knows_snapshots_after(since_sequence_number):
            return None
        through = None
        for snapshot in self.seen:
            if snapshot.sequence_number <= since_sequence_number:
                continue
            if snapshot.ours:
                break
            through = snapshot.snapshot_id
        return through


def snapshot_links(table: Any) -> dict[int, SnapshotLink]:
    """Every retained snapshot of a pyiceberg table, with its parent and whether it is ours."""
    return {s.snapshot_id: SnapshotLink(s.snapshot_id, s.parent_snapshot_id, _ours(s.summary)) for s in table.metadata.snapshots}


def _ours(snapshot_summary: Any) -> bool:
    return snapshot_summary is not None and summary.COMPACTOR in snapshot_summary.additional_properties


def _properties(snapshot: Any) -> dict[str, str]:
    return dict(snapshot.summary.additional_properties) if snapshot.summary is not None else {}


def _referenced_data_file(data_file: Any) -> str | None:
    """The one data file a position-delete file applies to, when the file says."""
    named = getattr(data_file, "referenced_data_file", None)
    if named:
        return str(named)
    lower, upper = data_file.lower_bounds or {}, data_file.upper_bounds or {}
    low, high = lower.get(DELETE_FILE_PATH_FIELD_ID), upper.get(DELETE_FILE_PATH_FIELD_ID)
    return bytes(low).decode() if low is not None and low == high else None


def found_commit(table_name: str, table: Any, snapshot: Any, layout: TableLayout) -> FoundCommit:
    """One snapshot's facts, from the manifests it added (entries it added or removed only)."""
    from pyiceberg.manifest import ManifestEntryStatus

    changes: list[FileChange] = []
    for manifest in snapshot.manifests(table.io):
        if manifest.added_snapshot_id != snapshot.snapshot_id:
            continue
        spec_layout = layout.of_spec(manifest.partition_spec_id)
        names = [term.name for term in spec_layout.partition] if spec_layout is not None else []
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
            if entry.status == ManifestEntryStatus.EXISTING or entry.snapshot_id != snapshot.snapshot_id:
                continue
            data_file = entry.data_file
            content = DataFileContent(data_file.content)
            path: str | None = None
            partition: dict[str, Any] = {}
            # The global deletes touch no tracked partition: their reconcile counts them.
            if spec_layout is not None and not (
                manifest.partition_spec_id == layout.global_spec_id and content is DataFileContent.EQUALITY_DELETES
            ):
                key = spec_layout.partition_from_metadata(dict(zip(names, data_file.partition, strict=True)))
                path, partition = spec_layout.tracked_path(key), spec_layout.partition_record(key)
            changes.append(
                FileChange(
                    content=content,
                    added=entry.status == ManifestEntryStatus.ADDED,
                    path=data_file.file_path,
                    partition=partition,
                    partition_path=path,
                    spec_id=manifest.partition_spec_id,
                    records=data_file.record_count,
                    size=data_file.file_size_in_bytes,
                    referenced_data_file=_referenced_data_file(data_file)
                    if content is DataFileContent.POSITION_DELETES
                    else None,
                )
            )
    operation = snapshot.summary.operation.value if snapshot.summary is not None else ""
    return FoundCommit(
        table=table_name,
        snapshot_id=snapshot.snapshot_id,
        parent_snapshot_id=snapshot.parent_snapshot_id,
        sequence_number=snapshot.sequence_number or 0,
        commit_time_ms=snapshot.timestamp_ms,
        operation=operation,
        changes=tuple(changes),
    )


class CommitWatcher:
    """The kept tables' commits, found in the catalog (the module's docstring)."""

    def __init__(
        self,
        config: Config,
        tracker: PartitionTracker,
        reconciler: Reconciler,
        found: Callable[[CommitEvent], None],
        retry: Any = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._tracker = tracker
        self._reconciler = reconciler
        self._found = found  # the feed's entry for a commit event (tracker and writer cadence)
        self._retry = retry
        self._clock = clock
        self._last = float("-inf")
        self._tables: dict[str, WatchedTable] = {}
        self.commits_found = 0

    @property
    def tables(self) -> list[str]:
        """The tables watched: those no topic feeds with commit events."""
        return [t.name for t in self._config.tables if not t.ingested]

    def due(self, now: float) -> bool:
        return bool(self.tables) and now - self._last >= self._config.compactor.watch_interval_seconds

    def poll_all(self) -> int:
        """Reads every kept table's new commits; returns how many were found."""
        found = sum(self.poll(name) for name in self.tables)
        self._last = self._clock()
        return found

    def poll(self, table_name: str) -> int:
        """Reads one kept table's new commits (none when its metadata location is unchanged)."""
        config = self._config.find_table(table_name)
        if config is None:
            return 0
        ref = self._config.table_ref(config)
        watched = self._tables.setdefault(table_name, WatchedTable())
        try:
            catalog = self._reconciler.catalog()
            table = metadata_call(self._retry, f"loading {ref}", lambda: load_metadata_table(catalog, ref))
            if table is None or table.metadata_location == watched.metadata_location:
                return 0
            return metadata_call(self._retry, f"reading the new commits of {ref}", lambda: self._read(table_name, table, watched))
        except CatalogOutage:
            raise
        except Exception as exc:  # noqa: BLE001 - read again at the next poll
            log.warning("could not read the new commits of %s (read again at the next poll): %s", table_name, exc)
            return 0

    def _read(self, table_name: str, table: Any, watched: WatchedTable) -> int:
        head = head_snapshot(table, self._config.table_ref(table_name).branch)
        found: list[tuple[WriterKind, FoundCommit]] = []
        if watched.metadata_location is None:
            self._baseline(table_name, table)
        else:
            links = snapshot_links(table)
            found = self._new_commits(table_name, table, links, head, watched)
            self._tracker.on_writer(table_name, (kind for kind, _ in found))
            for _, commit in found:
                self._found(commit_event(commit))
            self.commits_found += len(found)
            ours = self._remember(table, links, head, watched, [commit for _, commit in found])
            # Commit events count what appends and equality deletes add; removed files, position
            # deletes and compactions (another replica's) only the metadata counts.
            if ours or not all(told_by_event(commit) for _, commit in found):
                self._reconciler.reconcile(table_name, table)
        watched.metadata_location = table.metadata_location
        watched.snapshot_id = head.snapshot_id if head is not None else None
        watched.sequence_number = (head.sequence_number or 0) if head is not None else -1
        if watched.watched_from is None:
            watched.watched_from = watched.sequence_number
        return len(found)

    @staticmethod
    def _remember(
        table: Any, links: dict[int, SnapshotLink], head: Any, watched: WatchedTable, found: Sequence[FoundCommit]
    ) -> bool:
        """Remembers the snapshots since the last poll, oldest first; returns whether any is ours."""
        commits = {commit.snapshot_id: commit for commit in found}
        sequence_numbers = {s.snapshot_id: s.sequence_number or 0 for s in table.metadata.snapshots}
        ours = False
        for snapshot_id in new_snapshots(links, head.snapshot_id if head else None, watched.snapshot_id):
            ours = ours or links[snapshot_id].ours
            sequence_number = sequence_numbers[snapshot_id]
            if sequence_number > watched.sequence_number:  # not one seen before a rollback
                commit = commits.get(snapshot_id)
                touched = touched_partitions(commit) if commit is not None else None
                watched.remember(SeenSnapshot(sequence_number, snapshot_id, links[snapshot_id].ours, touched))
        return ours

    def _baseline(self, table_name: str, table: Any) -> None:
        """First sight: the current snapshot is where the watch starts, the table's statistics come
        from its metadata, and its retained snapshots' summaries say what kind of writer it has."""
        kinds = [
            classify_counts(SummaryCounts.from_summary(_properties(s))) for s in table.metadata.snapshots if not _ours(s.summary)
        ]
        self._tracker.on_writer(table_name, kinds)
        self._reconciler.reconcile(table_name, table)
        kind = self._tracker.writer_kind(table_name)
        log.info(
            "watching %s for its writer's commits (writer so far: %s)",
            table_name,
            kind.label if kind is not None else "none seen",
            extra={"table": table_name},
        )

    def _new_commits(
        self, table_name: str, table: Any, links: dict[int, SnapshotLink], head: Any, watched: WatchedTable
    ) -> list[tuple[WriterKind, FoundCommit]]:
        """The writer's commits since the last poll, oldest first, each with its kind."""
        layout = self._reconciler.layouts.get(table_name)
        if layout is None or head is None:
            return []
        by_id = {s.snapshot_id: s for s in table.metadata.snapshots}
        found = []
        for snapshot_id in new_snapshots(links, head.snapshot_id, watched.snapshot_id):
            snapshot = by_id[snapshot_id]
            if links[snapshot_id].ours or (snapshot.sequence_number or 0) <= watched.sequence_number:
                continue
            commit = found_commit(table_name, table, snapshot, layout)
            found.append((classify(commit), commit))
        return found

    def writer_wrote(self, table_name: str, since_sequence_number: int, partitions: Collection[str]) -> bool:
        """Whether the table's writer committed to any of ``partitions`` after the snapshot of
        ``since_sequence_number``, reading its newest commits first; True as well when the
        watcher cannot tell (it started watching later, or has forgotten commits since)."""
        self.poll(table_name)
        watched = self._tables.get(table_name)
        return watched is not None and watched.writer_wrote(since_sequence_number, partitions)

    def guard(self, table_name: str, since_sequence_number: int, partitions: Iterable[str]) -> int | None:
        """Raises ``WriterWroteThere`` when a writer that names files (``policy.beside_writer``)
        committed to the job's partitions since it started. Otherwise returns the newest snapshot
        up to which it checked the writer's commits (``WatchedTable.checked_through``), from which
        the commit may validate."""
        if beside_writer(self._tracker.writer_kind(table_name)).commit_after_writer:
            return None
        paths = list(partitions)
        if self.writer_wrote(table_name, since_sequence_number, paths):
            raise WriterWroteThere(
                f"the writer of {table_name} committed to {', '.join(p or '(unpartitioned)' for p in paths)} "
                "since the compaction started; tried again later"
            )
        return self._tables[table_name].checked_through(since_sequence_number)
