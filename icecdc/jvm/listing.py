"""One partition's live files at one snapshot, listed through the Java API (pyiceberg cannot plan
a table with equality deletes): typed facts for the policy, and the Java handles a commit needs,
kept inside the listing.

The listing is a scan with a filter built from the partition's transforms (identity, year,
month, day, hour, bucket, truncate), ``ignoreResiduals`` so that no row is ever filtered out of a
rewrite, then an exact check of each file's spec id and partition path; delete files come from
the delete manifests, so that deletes which apply to nothing are found too.
"""

from __future__ import annotations

from typing import Any

from icecdc.files import DataFileContent, LiveDataFile, LiveDeleteFile
from icecdc.jvm.bridge import JavaBridge, JavaObject, iterate
from icecdc.jvm.tables import IcebergTable, Snapshot
from icecdc.layout import PartitionKey, TableLayout


class PartitionListing:
    def __init__(self, table: IcebergTable, layout: TableLayout, partition: PartitionKey, snapshot: JavaObject) -> None:
        self.table = table
        self.layout = layout
        self.partition = partition
        self.snapshot = Snapshot.of(snapshot)
        self._java_snapshot = snapshot
        self.data: tuple[LiveDataFile, ...] = ()
        self.deletes: tuple[LiveDeleteFile, ...] = ()
        self._tasks: dict[str, JavaObject] = {}  # data file path -> FileScanTask (for the adapter)
        self._delete_handles: dict[str, JavaObject] = {}  # delete file path -> DeleteFile (for the adapter)

    @property
    def partition_path(self) -> str:
        return self.layout.partition_path(self.partition)


def java_partition(
    bridge: JavaBridge,
    spec: JavaObject,
    layout: TableLayout,
    partition: PartitionKey,
    cache: dict[PartitionKey, Any] | None = None,
) -> JavaObject:
    """The Java partition tuple (``StructLike``) of a canonical partition."""
    # Iceberg's public parser from partition strings to a typed partition tuple is
    # DataFiles.Builder.withPartitionValues; borrowing it avoids py4j's int-vs-long ambiguity
    # (a Python int becomes a Java Integer, which a long partition field rejects).
    if cache is not None and partition in cache:
        return cache[partition]
    iceberg = bridge.iceberg
    result = (
        iceberg.DataFiles.builder(spec)
        .withPartitionValues(layout.partition_java_strings(partition))
        .withPath("partition-parser")
        .withFormat(iceberg.FileFormat.PARQUET)
        .withFileSizeInBytes(0)
        .withRecordCount(0)
        .build()
        .partition()
    )
    if cache is not None:
        cache[partition] = result
    return result


def partition_filter(bridge: JavaBridge, layout: TableLayout, partition: PartitionKey) -> JavaObject:
    """An Iceberg expression selecting exactly one partition, for identity and transform fields
    alike. It only prunes; membership is checked exactly."""
    expressions = bridge.iceberg.expressions.Expressions
    result = expressions.alwaysTrue()
    for term, value in zip(layout.partition, partition, strict=True):
        name, _, arg = term.transform.partition("[")
        if name == "identity":
            java_term = expressions.ref(term.source)
        elif name in ("year", "month", "day", "hour"):
            java_term = getattr(expressions, name)(term.source)
        elif name in ("bucket", "truncate") and arg:
            java_term = getattr(expressions, name)(term.source, int(arg.rstrip("]")))
        else:
            continue
        if value is None:
            predicate = expressions.isNull(java_term)
        elif term.source_type == "binary" or term.source_type.startswith("fixed"):
            continue  # no literal form for bytes; the exact check still applies
        else:
            predicate = expressions.equal(java_term, value)
        result = getattr(expressions, "and")(result, predicate)  # `and` is a Python keyword
    return result


def list_partition(table: IcebergTable, layout: TableLayout, partition: PartitionKey) -> PartitionListing | None:
    """The partition's live files at the table's current snapshot (None: an empty table)."""
    return table.call(
        f"listing {table.ref} {layout.partition_path(partition) or '(unpartitioned)'}", lambda: _list(table, layout, partition)
    )


def _list(table: IcebergTable, layout: TableLayout, partition: PartitionKey) -> PartitionListing | None:
    java = table._java
    bridge = table.bridge
    java.refresh()
    snapshot = java.currentSnapshot()
    if snapshot is None:
        return None
    listing = PartitionListing(table, layout, partition, snapshot)
    specs = java.specs()
    spec = specs.get(layout.spec_id)
    # Compared as Iceberg itself renders them, from the typed Java partition tuple.
    java_path = spec.partitionToPath(java_partition(bridge, spec, layout, partition))

    def in_partition(file: JavaObject) -> bool:
        return bool(file.specId() == layout.spec_id and spec.partitionToPath(file.partition()) == java_path)

    expression = partition_filter(bridge, layout, partition)
    io = java.io()
    deletes = []
    for manifest in iterate(snapshot.deleteManifests(io)):
        if manifest.partitionSpecId() != layout.spec_id:
            continue
        reader = bridge.iceberg.ManifestFiles.readDeleteManifest(manifest, io, specs).filterRows(expression)
        try:
            for delete in iterate(reader):
                if in_partition(delete):
                    path = str(delete.location())
                    listing._delete_handles[path] = delete.copy()
                    equality = delete.content().toString() == "EQUALITY_DELETES"
                    ids = tuple(int(i) for i in delete.equalityFieldIds()) if equality else ()
                    referenced = delete.referencedDataFile()
                    offset, length = delete.contentOffset(), delete.contentSizeInBytes()  # deletion vectors only
                    deletes.append(
                        LiveDeleteFile(
                            path,
                            DataFileContent.EQUALITY_DELETES if equality else DataFileContent.POSITION_DELETES,
                            int(delete.recordCount()),
                            int(delete.fileSizeInBytes()),
                            int(delete.dataSequenceNumber()),
                            None if referenced is None else str(referenced),
                            ids,
                            None if offset is None else int(offset),
                            None if length is None else int(length),
                        )
                    )
        finally:
            reader.close()
    data = []
    tasks = java.newScan().useSnapshot(snapshot.snapshotId()).filter(expression).ignoreResiduals().planFiles()
    try:
        for task in iterate(tasks):
            file = task.file()
            if in_partition(file):
                path = str(file.location())
                listing._tasks[path] = task
                data.append(
                    LiveDataFile(path, int(file.fileSizeInBytes()), int(file.recordCount()), int(file.dataSequenceNumber()))
                )
    finally:
        tasks.close()
    listing.data, listing.deletes = tuple(data), tuple(deletes)
    return listing
