"""Table maintenance: snapshot expiry, orphan-file removal and manifest rewrites
(docs/coordinator.md, "Maintenance"). What maintenance must never do is decided here, in plain
functions: expire the starting snapshot of a running compaction, a writer's newest exactly-once
marker (the ingester's offsets, a Flink job's or a Kafka Connect sink's) or, on a staged table, the snapshots between main and its branch's head (the cutoff
moves back to the oldest of them); remove a file younger than ``orphan_age_seconds``, which a
commit in flight may be about to reference; announce a run that has nothing to do. Running them
is Iceberg's own actions, through the Java adapter (``icecdc.jvm.actions``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from icecdc.domain.events import MaintenanceKind
from icecdc.jvm import actions
from icecdc.jvm.actions import ManifestFacts
from icecdc.jvm.tables import IcebergTable
from icecdc.runtime.config import MaintenanceConfig

log = logging.getLogger(__name__)

EXPIRE, ORPHANS, MANIFESTS = MaintenanceKind.EXPIRE, MaintenanceKind.ORPHANS, MaintenanceKind.MANIFESTS
# Iceberg's TableProperties.MANIFEST_TARGET_SIZE_BYTES and its default.
MANIFEST_TARGET_SIZE = "commit.manifest.target-size-bytes"
MANIFEST_TARGET_SIZE_DEFAULT = 8 * 1024 * 1024


def expiry_cutoff(now_ms: int, retention_seconds: float, protected_timestamps_ms: Iterable[int]) -> int:
    """Snapshots older than the returned time may be expired: the retention limit, moved back to
    the oldest protected snapshot."""
    return min([now_ms - int(retention_seconds * 1000), *protected_timestamps_ms])


def anything_to_expire(snapshot_times_ms: Iterable[int], cutoff_ms: int, retain_last: int) -> bool:
    times = list(snapshot_times_ms)
    return len(times) > retain_last and any(t < cutoff_ms for t in times)


def manifest_target_size(table_properties: Mapping[str, str]) -> int:
    return int(table_properties.get(MANIFEST_TARGET_SIZE, MANIFEST_TARGET_SIZE_DEFAULT))


def manifests_to_merge(small: Iterable[ManifestFacts], max_small_manifests: int) -> tuple[set[str], set[str]]:
    """The small data manifests and the small delete manifests to merge, once there are more
    than ``max_small_manifests`` small ones: the data manifests (two or more) every time, in this
    process (``actions.merge_data_manifests``); the delete manifests only when they alone are past
    the bound, by Iceberg's Spark action, since the core operation leaves them alone. The writer's
    own merging on commit (``commit.manifest.min-count-to-merge``, 8 on tables icecdc creates)
    and the sidecar's commits, which merge both kinds (``compactor.merge_manifests``), bound
    those already; a Spark job for them on every check would hold the table's portability
    conversions for its length."""
    small = list(small)
    if len(small) <= max_small_manifests:
        return set(), set()
    data = {m.path for m in small if not m.deletes}
    deletes = {m.path for m in small if m.deletes}
    return (data if len(data) >= 2 else set()), (deletes if len(deletes) > max_small_manifests else set())


def is_small_manifest(length: int, target_size_bytes: int) -> bool:
    """A manifest worth merging: under half the size Iceberg packs manifests to. Larger ones
    already cost queries little per entry, and rewriting them would cost the rewrite a lot."""
    return length < target_size_bytes // 2


@dataclass
class MaintenanceSchedule:
    """When each kind of maintenance is next due on each table. Expiry and manifest checks are
    due at once (they cost a metadata read when there is nothing to do), then every
    ``interval_seconds`` and ``manifest_interval_seconds``; orphan removal, which lists the whole
    table location, first comes one ``interval_seconds`` after ``started``, so that short runs
    and restarts do not pay for it each time."""

    settings: MaintenanceConfig
    started: float = 0.0
    last: dict[tuple[str, MaintenanceKind], float] = field(default_factory=dict)

    def interval(self, kind: MaintenanceKind) -> float:
        if kind is ORPHANS:
            return self.settings.orphan_interval_seconds
        return self.settings.manifest_interval_seconds if kind is MANIFESTS else self.settings.interval_seconds

    def _last(self, table: str, kind: MaintenanceKind) -> float:
        if (table, kind) in self.last:
            return self.last[(table, kind)]
        if kind is ORPHANS:
            return self.started + self.settings.interval_seconds - self.settings.orphan_interval_seconds
        return float("-inf")

    def due(self, table: str, now: float) -> list[MaintenanceKind]:
        if not self.settings.enabled:
            return []
        return [k for k in (EXPIRE, MANIFESTS, ORPHANS) if now - self._last(table, k) >= self.interval(k)]

    def done(self, table: str, kind: MaintenanceKind, now: float) -> None:
        self.last[(table, kind)] = now

    def due_again(self, table: str, kind: MaintenanceKind) -> None:
        """A run that did nothing after all (it was due when it started): due at once again."""
        self.last.pop((table, kind), None)


@dataclass(frozen=True)
class MaintenanceResult:
    kind: MaintenanceKind
    committed: bool
    cutoff_ms: int | None = None
    protected_snapshot_ids: tuple[int, ...] = ()
    snapshots_expired: int = 0
    files_deleted: int = 0
    manifests_rewritten: int = 0
    manifests_added: int = 0


class TableMaintenance:
    """Maintenance of one table, sparing what must be spared; ``summary`` tags its commits."""

    def __init__(self, table: IcebergTable, tags: Mapping[str, str]) -> None:
        self.table = table
        self._tags = dict(tags)

    def worth_running(self, kind: MaintenanceKind, now_ms: int, settings: MaintenanceConfig) -> bool:
        """Whether a run of ``kind`` would do anything, from metadata alone. Protected snapshots
        only move the expiry cutoff back, so nothing older than the retention limit means
        nothing to expire, whatever is running. Orphans cannot be told without listing."""
        if kind is EXPIRE:
            self.table.refresh()
            cutoff = now_ms - int(settings.snapshot_retention_seconds * 1000)
            return anything_to_expire(self.table.snapshot_times_ms().values(), cutoff, settings.retain_last)
        if kind is MANIFESTS:
            # Iceberg's manifest rewrites (the core operation and the Spark action) commit to main
            # only; on a staged table main is the compactor's to move, and the writer's own commits
            # merge the staging branch's manifests (``commit.manifest.min-count-to-merge``).
            staged = self.table.ref.staged
            return not staged and any(manifests_to_merge(self.small_manifests(), settings.max_small_manifests))
        return True

    def expire(self, now_ms: int, settings: MaintenanceConfig, running_starts: Iterable[int | None]) -> MaintenanceResult:
        self.table.refresh()
        times = self.table.snapshot_times_ms()
        protected = {i: times[i] for i in running_starts if i is not None and i in times}
        # Each writer's newest exactly-once marker, and so every snapshot after it: the ingester's
        # offsets, a Flink job's checkpoint id, a Kafka Connect sink's offsets on a kept table.
        for marked in self.table.newest_recovery_snapshots().values():
            protected[marked.snapshot_id] = marked.timestamp_ms
        main = self.table.main_snapshot_id() if self.table.ref.staged else None
        if main is not None and main in times:
            # A staged table's main lags its branch: the branch's snapshots after it are how it
            # gets to the head (``decide_main`` walks back to it), so none of them may go.
            protected[main] = times[main]
        cutoff = expiry_cutoff(now_ms, settings.snapshot_retention_seconds, protected.values())
        ids = tuple(sorted(protected))
        if not anything_to_expire(times.values(), cutoff, settings.retain_last):
            return MaintenanceResult(EXPIRE, False, cutoff, ids)
        deleted = actions.expire_snapshots(self.table, cutoff, settings.retain_last)
        self.table.refresh()
        # (the writer may have committed meanwhile: count what went, not the difference in size)
        expired = len(times.keys() - self.table.snapshot_times_ms().keys())
        return MaintenanceResult(EXPIRE, expired > 0, cutoff, ids, snapshots_expired=expired, files_deleted=deleted)

    def remove_orphans(self, now_ms: int, settings: MaintenanceConfig) -> MaintenanceResult:
        cutoff = now_ms - int(settings.orphan_age_seconds * 1000)
        removed = actions.delete_orphan_files(self.table, cutoff)
        return MaintenanceResult(ORPHANS, removed > 0, cutoff, files_deleted=removed)

    def small_manifests(self) -> list[ManifestFacts]:
        """The current snapshot's small data and delete manifests (one manifest-list read)."""
        manifests = actions.current_manifests(self.table)  # refreshes the table
        target = manifest_target_size(self.table.properties())
        return [m for m in manifests if is_small_manifest(m.length, target)]

    def rewrite_manifests(self, settings: MaintenanceConfig) -> MaintenanceResult:
        data, deletes = manifests_to_merge(self.small_manifests(), settings.max_small_manifests)
        if not data and not deletes:
            return MaintenanceResult(MANIFESTS, False)
        rewritten = added = 0
        if data:
            rewritten, added = actions.merge_data_manifests(self.table, data, self._tags)
        if deletes:
            more_rewritten, more_added = actions.rewrite_manifests(self.table, deletes, self._tags)
            rewritten, added = rewritten + more_rewritten, added + more_added
        return MaintenanceResult(MANIFESTS, rewritten > 0, manifests_rewritten=rewritten, manifests_added=added)
