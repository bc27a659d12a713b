"""Iceberg's own maintenance actions on one table: its Spark actions (Spark SQL's procedures take
no snapshot-summary tags, and the actions return what they did), and its core ``RewriteManifests``
operation for data manifests, which needs no Spark job. What they must spare is decided by the
coordinator (``icecdc.coordinator.maintenance``); this only runs them."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from icecdc.jvm.bridge import JavaObject, iterate
from icecdc.jvm.tables import IcebergTable


@dataclass(frozen=True)
class ManifestFacts:
    path: str
    length: int
    deletes: bool = False  # a delete manifest (else a data manifest)


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
        current = table.java_head()
        if current is None:
            return []
        return [
            ManifestFacts(str(m.path()), int(m.length()), str(m.content().name()) == "DELETES")
            for m in iterate(current.allManifests(table._java.io()))
        ]

    return table.call(f"listing the manifests of {table.ref}", run)


def _chosen_manifests(table: IcebergTable, paths: Collection[str]) -> JavaObject:
    """A java.util.function.Predicate over manifests that holds for ``paths``: Guava's
    Predicates.in (relocated in Iceberg's runtime) over the current ones (manifests compare by
    path, so it holds for them when a retry reads them again)."""
    chosen = table.bridge.jvm.java.util.HashSet()
    table._java.refresh()
    head = table.java_head()
    for manifest in iterate(head.allManifests(table._java.io())) if head is not None else ():
        if str(manifest.path()) in paths:
            chosen.add(manifest)
    return getattr(table.bridge.iceberg.relocated.com.google.common.base.Predicates, "in")(chosen)


def merge_data_manifests(table: IcebergTable, paths: Collection[str], summary: Mapping[str, str]) -> tuple[int, int]:
    """Merge the data manifests ``paths`` in this process, with Iceberg's core ``RewriteManifests``
    (rolled at the table's manifest target size), tagging the snapshot with ``summary``; returns
    (manifests rewritten, manifests added).

    Not the Spark action: its Spark job is slow on a busy machine, the table's portability
    conversions waiting all that time, and it commits the manifests it chose by name,
    so a writer commit merging one of them meanwhile failed it (``ValidationException: Deleted
    manifest``). The core operation reads and writes a few small Avro files, and on a
    retry chooses again among the current manifests, so one the writer merged is simply left out.
    It takes data manifests only (the action is kept for delete manifests), and clusters by one
    constant key: a CDC batch's manifest spans the partitions the batch touched anyway."""

    def run() -> tuple[int, int]:
        # A java.util.function.Function giving every data file one key: Guava's Functions.constant.
        # Iceberg's runtime jar strips that class from its relocated Guava; Spark's distribution
        # ships Hadoop's shaded Guava, which has it.
        constant = table.bridge.jvm.org.apache.hadoop.thirdparty.com.google.common.base.Functions.constant("merged")
        update = table._java.rewriteManifests().rewriteIf(_chosen_manifests(table, paths)).clusterBy(constant)
        for key, value in summary.items():
            update = update.set(key, value)
        update.commit()
        done = update.updateEvent().summary()  # the committed snapshot's summary
        return int(done.get("manifests-replaced") or 0), int(done.get("manifests-created") or 0)

    return table.call(f"merging the data manifests of {table.ref}", run)


def rewrite_manifests(table: IcebergTable, paths: Collection[str], summary: Mapping[str, str]) -> tuple[int, int]:
    """Merge exactly the manifests ``paths`` (clustered by partition, as Iceberg does) with
    Iceberg's Spark action, tagging the snapshot with ``summary``; returns (manifests rewritten,
    manifests added). For delete manifests, which the core operation leaves alone."""

    def run() -> tuple[int, int]:
        action = _actions(table).rewriteManifests(table._java).rewriteIf(_chosen_manifests(table, paths))
        for key, value in summary.items():
            action = action.snapshotProperty(key, value)
        result = action.execute()
        return sum(1 for _ in iterate(result.rewrittenManifests())), sum(1 for _ in iterate(result.addedManifests()))

    return table.call(f"rewriting the manifests of {table.ref}", run)
