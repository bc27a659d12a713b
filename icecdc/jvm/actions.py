"""Iceberg's own maintenance actions on one table, through its Spark actions (Spark SQL's
procedures take no snapshot-summary tags, and the actions return what they did). What they must
spare is decided by the coordinator (``icecdc.coordinator.maintenance``); this only runs them."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from icecdc.jvm.bridge import JavaObject, iterate
from icecdc.jvm.tables import IcebergTable


@dataclass(frozen=True)
class ManifestFacts:
    path: str
    length: int


def _actions(table: IcebergTable) -> JavaObject:
    table.bridge.activate_session()
    return table.bridge.iceberg.spark.actions.SparkActions.get(table.bridge.java_spark_session)


def expire_snapshots(table: IcebergTable, older_than_ms: int, retain_last: int) -> int:
    """Expire snapshots older than ``older_than_ms`` but the newest ``retain_last``; returns
    how many files (data, deletes, manifests, manifest lists) that deleted."""

    def run() -> int:
        result = _actions(table).expireSnapshots(table._java).expireOlderThan(older_than_ms).retainLast(retain_last).execute()
        return int(
            result.deletedDataFilesCount()
            + result.deletedEqualityDeleteFilesCount()
            + result.deletedPositionDeleteFilesCount()
            + result.deletedManifestsCount()
            + result.deletedManifestListsCount()
        )

    return table.call(f"expiring snapshots of {table.ref}", run)


def delete_orphan_files(table: IcebergTable, older_than_ms: int) -> int:
    """Delete files under the table's location that no snapshot references and that are older
    than ``older_than_ms``; returns how many."""

    def run() -> int:
        result = _actions(table).deleteOrphanFiles(table._java).olderThan(older_than_ms).execute()
        return sum(1 for _ in iterate(result.orphanFileLocations()))

    return table.call(f"removing orphan files of {table.ref}", run)


def current_manifests(table: IcebergTable) -> list[ManifestFacts]:
    """The current snapshot's data and delete manifests (one manifest-list read, after a refresh)."""

    def run() -> list[ManifestFacts]:
        table._java.refresh()
        current = table._java.currentSnapshot()
        if current is None:
            return []
        return [ManifestFacts(str(m.path()), int(m.length())) for m in iterate(current.allManifests(table._java.io()))]

    return table.call(f"listing the manifests of {table.ref}", run)


def rewrite_manifests(table: IcebergTable, paths: Collection[str], summary: Mapping[str, str]) -> tuple[int, int]:
    """Merge exactly the manifests ``paths`` (clustered by partition, as Iceberg does), tagging
    the snapshot with ``summary``; returns (manifests rewritten, manifests added)."""

    def run() -> tuple[int, int]:
        # The action takes a java.util.function.Predicate over manifests; Guava's Predicates.in
        # (relocated in Iceberg's runtime) is one, over manifests that compare by path.
        chosen = table.bridge.jvm.java.util.HashSet()
        table._java.refresh()
        for manifest in iterate(table._java.currentSnapshot().allManifests(table._java.io())):
            if str(manifest.path()) in paths:
                chosen.add(manifest)
        predicates = table.bridge.iceberg.relocated.com.google.common.base.Predicates
        action = _actions(table).rewriteManifests(table._java).rewriteIf(getattr(predicates, "in")(chosen))
        for key, value in summary.items():
            action = action.snapshotProperty(key, value)
        result = action.execute()
        return sum(1 for _ in iterate(result.rewrittenManifests())), sum(1 for _ in iterate(result.addedManifests()))

    return table.call(f"rewriting the manifests of {table.ref}", run)
