"""The thin bridge to Iceberg's Java API through py4j, for what Spark SQL cannot do.

py4j converts Python lists to ``java.util.ArrayList`` but not to Java arrays, and Python ints
to ``Integer``; helpers here build the exact Java values Iceberg's API expects.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JavaObject = Any
# Every icecdc commit carries a unique id in its summary, so that it can find its own snapshot
# even when another writer committed right after it.
COMMIT_ID_PROPERTY = "icecdc.commit-id"


@dataclass(frozen=True)
class CommittedSnapshot:
    snapshot_id: int
    parent_snapshot_id: int | None
    sequence_number: int
    timestamp_ms: int
    operation: str
    # Commits by others that landed between this commit's start and its compare-and-set: each
    # one cost it a retry (Iceberg re-applies the update on the new metadata and tries again).
    interleaved: int = 0


def jvm(spark: SparkSession) -> JavaObject:
    return spark.sparkContext._jvm


def load_table(spark: SparkSession, qualified_name: str) -> JavaObject:
    """The live ``org.apache.iceberg.Table`` for ``catalog.namespace.table``."""
    return jvm(spark).org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, qualified_name)


def int_array(spark: SparkSession, values: Sequence[int]) -> JavaObject:
    gateway = spark.sparkContext._gateway
    array = gateway.new_array(gateway.jvm.int, len(values))
    for i, value in enumerate(values):
        array[i] = value
    return array


def activate_session(spark: SparkSession) -> None:
    """Make ``spark`` the active session of the calling thread's JVM thread. Spark resolves
    catalogs through ``SQLConf.get``, which falls back to an empty default configuration on a
    thread with no active session: reading through a catalog first used on another Python
    thread (the sidecar beside the ingester in one process) then fails with "catalog not
    defined"."""
    jvm(spark).org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)


def static_call(spark: SparkSession, java_class: JavaObject, method: str) -> JavaObject:
    """Call a no-argument static method through reflection: py4j cannot call a static method
    that shares its name with an instance method (``SparkTableCache.get()`` and ``get(key)``)."""
    gateway = spark.sparkContext._gateway
    found = java_class._java_lang_class.getMethod(method, gateway.new_array(gateway.jvm.java.lang.Class, 0))
    return found.invoke(None, gateway.new_array(gateway.jvm.java.lang.Object, 0))


def java_exception_class(error: BaseException) -> str | None:
    """The Java class name of an exception that crossed py4j, if it did."""
    java = getattr(error, "java_exception", None)
    return java.getClass().getName() if java is not None else None


def iterate(iterable: JavaObject) -> Iterator[JavaObject]:
    """The elements of a Java ``Iterable`` (py4j iterates collections, not every Iterable)."""
    iterator = iterable.iterator()
    while iterator.hasNext():
        yield iterator.next()


def history(table: JavaObject) -> Iterator[JavaObject]:
    """The table's current snapshot and its ancestors, newest first."""
    snapshot = table.currentSnapshot()
    while snapshot is not None:
        yield snapshot
        parent = snapshot.parentId()
        snapshot = table.snapshot(parent) if parent is not None else None


def commit_tagged(update: JavaObject, summary: Mapping[str, str], table: JavaObject) -> CommittedSnapshot:
    """Commit a snapshot-producing update with ``summary`` in its snapshot summary, and return
    the snapshot it made."""
    commit_id = uuid.uuid4().hex
    for key, value in {**summary, COMMIT_ID_PROPERTY: commit_id}.items():
        update = update.set(key, value)
    table.refresh()
    current = table.currentSnapshot()
    before = current.snapshotId() if current is not None else None
    update.commit()
    ours: CommittedSnapshot | None = None
    for snapshot in history(table):
        if ours is None and snapshot.summary().get(COMMIT_ID_PROPERTY) == commit_id:
            ours = CommittedSnapshot(
                snapshot.snapshotId(), snapshot.parentId(), snapshot.sequenceNumber(),
                snapshot.timestampMillis(), snapshot.operation(),
            )
        elif ours is not None:
            if snapshot.snapshotId() == before:
                break
            ours = dataclasses.replace(ours, interleaved=ours.interleaved + 1)
    if ours is None:
        raise RuntimeError(f"commit {commit_id} is not in the history of {table.name()}")
    return ours
