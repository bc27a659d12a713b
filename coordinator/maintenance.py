"""Table maintenance: snapshot expiry, orphan-file removal and manifest rewrites.

What maintenance must never do is decided here, in plain functions:
- expire the starting snapshot of a running compaction (its commit validates the history from
  that snapshot and would fail), or the ingester's newest offsets snapshot: exactly-once
  recovery walks back from the current snapshot to the newest one that records source offsets
  (``ingest/offsets.py``), so that snapshot and every one after it must stay. Both are spared by
  moving the expiry cutoff back to the oldest of them; ``expireOlderThan`` keeps everything newer;
- remove a file that a commit in flight is about to reference: only files older than
  ``orphan_age_seconds`` (at least an hour, far beyond a micro-batch or a compaction) are taken.

Running them is Iceberg's own Spark actions, through py4j (Spark SQL's procedures take no
snapshot-summary tags, and the actions return what they did).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from icecdc.config import MaintenanceConfig
from icecdc.ingest.offsets import OFFSETS_PROPERTY
from icecdc.jvm import activate_session, history, iterate, jvm, load_table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

EXPIRE = "expire-snapshots"
ORPHANS = "remove-orphans"
MANIFESTS = "rewrite-manifests"
# Iceberg's TableProperties.MANIFEST_TARGET_SIZE_BYTES and its default.
MANIFEST_TARGET_SIZE = "commit.manifest.target-size-bytes"
MANIFEST_TARGET_SIZE_DEFAULT = 8 * 1024 * 1024


def expiry_cutoff(now_ms: int, retention_seconds: float, protected_timestamps_ms: Iterable[int]) -> int:
    """Snapshots older than the returned time may be expired: the retention limit, moved back to
    the oldest protected snapshot."""
    return min([now_ms - int(retention_seconds * 1000), *protected_timestamps_ms])


def manifest_target_size(table_properties: Mapping[str, str]) -> int:
    return int(table_properties.get(MANIFEST_TARGET_SIZE, MANIFEST_TARGET_SIZE_DEFAULT))


def is_small_manifest(length: int, target_size_bytes: int) -> bool:
    """A manifest worth merging: under half the size Iceberg packs manifests to. Larger ones
    already cost queries little per entry, and rewriting them would cost the rewrite a lot."""
    return length < target_size_bytes // 2


@dataclass
class MaintenanceSchedule:
    """When each kind of maintenance is next due on each table. Expiry and manifest checks are
    due at once (they cost nothing when there is nothing to do), then every ``interval_seconds``
    and ``manifest_interval_seconds``; orphan removal, which lists the whole table location, first
    comes one ``interval_seconds`` after ``started``, so that short runs and restarts do not pay
    for it each time."""

    settings: MaintenanceConfig
    started: float = 0.0
    last: dict[tuple[str, str], float] = field(default_factory=dict)

    def interval(self, kind: str) -> float:
        if kind == ORPHANS:
            return self.settings.orphan_interval_seconds
        return self.settings.manifest_interval_seconds if kind == MANIFESTS else self.settings.interval_seconds

    def _last(self, table: str, kind: str) -> float:
        if (table, kind) in self.last:
            return self.last[(table, kind)]
        if kind == ORPHANS:
            return self.started + self.settings.interval_seconds - self.settings.orphan_interval_seconds
        return float("-inf")

    def due(self, table: str, now: float) -> list[str]:
        if not self.settings.enabled:
            return []
        return [k for k in (EXPIRE, MANIFESTS, ORPHANS) if now - self._last(table, k) >= self.interval(k)]

    def done(self, table: str, kind: str, now: float) -> None:
        self.last[(table, kind)] = now

    def due_again(self, table: str, kind: str) -> None:
        """A run that did nothing after all (it was due when it started): due at once again."""
        self.last.pop((table, kind), None)


@dataclass(frozen=True)
class MaintenanceResult:
    kind: str
    committed: bool
    cutoff_ms: int | None = None
    protected_snapshot_ids: tuple[int, ...] = ()
    snapshots_expired: int = 0
    files_deleted: int = 0
    manifests_rewritten: int = 0
    manifests_added: int = 0


class TableMaintenance:
    """Iceberg's maintenance actions on one table."""

    def __init__(self, spark: SparkSession, qualified_name: str, summary: dict[str, str]) -> None:
        self._spark = spark
        self._summary = summary
        self.table = load_table(spark, qualified_name)

    def _actions(self) -> Any:
        activate_session(self._spark)
        return jvm(self._spark).org.apache.iceberg.spark.actions.SparkActions.get(self._spark._jsparkSession)

    def offsets_snapshot(self) -> Any | None:
        """The newest snapshot that records the ingester's source offsets."""
        return next((s for s in history(self.table) if s.summary().get(OFFSETS_PROPERTY)), None)

    def expire(self, now_ms: int, settings: MaintenanceConfig, running_starts: Iterable[int | None]) -> MaintenanceResult:
        self.table.refresh()
        protected = [self.table.snapshot(i) for i in running_starts if i is not None]
        protected = [s for s in protected if s is not None]
        offsets = self.offsets_snapshot()
        if offsets is not None:
            protected.append(offsets)
        cutoff = expiry_cutoff(now_ms, settings.snapshot_retention_seconds, (s.timestampMillis() for s in protected))
        ids = tuple(sorted({s.snapshotId() for s in protected}))
        before = {s.snapshotId(): s.timestampMillis() for s in iterate(self.table.snapshots())}
        if len(before) <= settings.retain_last or not any(t < cutoff for t in before.values()):
            return MaintenanceResult(EXPIRE, False, cutoff, ids)
        result = self._actions().expireSnapshots(self.table).expireOlderThan(cutoff).retainLast(settings.retain_last).execute()
        self.table.refresh()
        # (the writer may have committed meanwhile: count what went, not the difference in size)
        expired = len(before.keys() - {s.snapshotId() for s in iterate(self.table.snapshots())})
        deleted = (result.deletedDataFilesCount() + result.deletedEqualityDeleteFilesCount()
                   + result.deletedPositionDeleteFilesCount() + result.deletedManifestsCount()
                   + result.deletedManifestListsCount())
        return MaintenanceResult(EXPIRE, expired > 0, cutoff, ids, snapshots_expired=expired, files_deleted=deleted)

    def remove_orphans(self, now_ms: int, settings: MaintenanceConfig) -> MaintenanceResult:
        cutoff = now_ms - int(settings.orphan_age_seconds * 1000)
        result = self._actions().deleteOrphanFiles(self.table).olderThan(cutoff).execute()
        removed = sum(1 for _ in iterate(result.orphanFileLocations()))
        return MaintenanceResult(ORPHANS, removed > 0, cutoff, files_deleted=removed)

    def small_manifests(self) -> list[Any]:
        """The current snapshot's small data and delete manifests (one manifest-list read)."""
        self.table.refresh()
        current = self.table.currentSnapshot()
        if current is None:
            return []
        target = manifest_target_size(dict(self.table.properties()))
        return [m for m in iterate(current.allManifests(self.table.io())) if is_small_manifest(m.length(), target)]

    def manifests_due(self, settings: MaintenanceConfig) -> bool:
        return len(self.small_manifests()) > settings.max_small_manifests

    def rewrite_manifests(self, settings: MaintenanceConfig) -> MaintenanceResult:
        small = self.small_manifests()
        if len(small) <= settings.max_small_manifests:
            return MaintenanceResult(MANIFESTS, False)
        # Only the small ones: the action takes a java.util.function.Predicate, and Guava's
        # Predicates.in (relocated in Iceberg's runtime) is one, over manifests that compare by path.
        chosen = jvm(self._spark).java.util.HashSet()
        for manifest in small:
            chosen.add(manifest)
        predicates = jvm(self._spark).org.apache.iceberg.relocated.com.google.common.base.Predicates
        action = self._actions().rewriteManifests(self.table).rewriteIf(getattr(predicates, "in")(chosen))
        for key, value in self._summary.items():
            action = action.snapshotProperty(key, value)
        result = action.execute()
        return MaintenanceResult(MANIFESTS, True, manifests_rewritten=sum(1 for _ in iterate(result.rewrittenManifests())),
                                 manifests_added=sum(1 for _ in iterate(result.addedManifests())))
