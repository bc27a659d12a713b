"""One partition's live files at one snapshot, listed through the Java API (pyiceberg cannot plan
a table with equality deletes): typed facts for the policy, and the Java handles a commit needs,
kept inside the listing.

A partition of an older spec is listed the same way through that spec's layout
(``TableLayout.of_older_spec``). The listing is a scan with a filter built from the partition's transforms (identity, year,
month, day, hour, bucket, truncate), ``ignoreResiduals`` so that no row is ever filtered out of a
rewrite, then an exact check of each file's spec id and partition path; delete files come from
the delete manifests, so that deletes which apply to nothing are found too.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from icecdc.domain.files import DataFileContent, LiveDataFile, LiveDeleteFile
from icecdc.domain.layout import PartitionKey, TableLayout
from icecdc.jvm.bridge import JavaBridge, JavaObject, iterate
from icecdc.jvm.tables import IcebergTable, Snapshot
from icecdc.runtime.fileio import read_parquet_fields


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

        # A global-delete listing: the data files whose key bounds admit a deleted key (None: a
        # partition listing, where every file may match).
        self.may_match: tuple[str, ...] | None = None
        self._global = False
        # The partition as Iceberg renders it (``PartitionSpec.partitionToPath``): how the files a
        # job of several partitions wrote are told apart.
        self.iceberg_path = ""

    @property
    def partition_path(self) -> str:
        return "(global deletes)" if self._global else self.layout.tracked_path(self.partition)


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
    listed = list_partitions(table, layout, [partition])
    return None if listed is None else listed[0]


def list_partitions(
    table: IcebergTable, layout: TableLayout, partitions: Sequence[PartitionKey]
) -> list[PartitionListing] | None:
    """Each partition's live files, all at the table's current snapshot, from one scan (a job
    compacting several partitions commits them together, from one starting snapshot). None: an
    empty table."""
    paths = ", ".join(layout.partition_path(p) or "(unpartitioned)" for p in partitions)
    return table.call(f"listing {table.ref} {paths}", lambda: _list(table, layout, partitions))


def _at_current_snapshot(table: IcebergTable, layout: TableLayout, partition: PartitionKey) -> PartitionListing | None:
    """An empty listing at the table's current snapshot (the head of the branch icecdc commits to),
    refreshed (None: the table has none)."""
    table._java.refresh()
    snapshot = table.java_head()
    return None if snapshot is None else PartitionListing(table, layout, partition, snapshot)


def _list(table: IcebergTable, layout: TableLayout, partitions: Sequence[PartitionKey]) -> list[PartitionListing] | None:
    java, bridge = table._java, table.bridge
    first = _at_current_snapshot(table, layout, partitions[0])
    if first is None:
        return None
    snapshot = first._java_snapshot
    listings = [first, *(PartitionListing(table, layout, p, snapshot) for p in partitions[1:])]
    specs = java.specs()
    spec = specs.get(layout.spec_id)
    # Compared as Iceberg itself renders them, from the typed Java partition tuple.
    by_path: dict[str, PartitionListing] = {}
    for listing in listings:
        listing.iceberg_path = str(spec.partitionToPath(java_partition(bridge, spec, layout, listing.partition)))
        by_path[listing.iceberg_path] = listing

    def listing_of(file: JavaObject) -> PartitionListing | None:
        return by_path.get(str(spec.partitionToPath(file.partition()))) if file.specId() == layout.spec_id else None

    expressions = bridge.iceberg.expressions.Expressions
    expression = partition_filter(bridge, layout, partitions[0])
    for partition in partitions[1:]:
        expression = getattr(expressions, "or")(expression, partition_filter(bridge, layout, partition))
    io = java.io()
    # An older spec without fields may be the global-delete spec: its equality deletes are the
    # global deletes, which apply to every partition and are left to their resolution.
    global_deletes_here = layout.spec_id == layout.global_spec_id
    deletes: dict[str, list[LiveDeleteFile]] = {path: [] for path in by_path}
    for manifest in iterate(snapshot.deleteManifests(io)):
        if manifest.partitionSpecId() != layout.spec_id:
            continue
        reader = bridge.iceberg.ManifestFiles.readDeleteManifest(manifest, io, specs).filterRows(expression)
        try:
            for delete in iterate(reader):
                if global_deletes_here and delete.content().toString() == "EQUALITY_DELETES":
                    continue
                if (owner := listing_of(delete)) is not None:
                    deletes[owner.iceberg_path].append(_delete_file(owner, delete))
        finally:
            reader.close()
    data: dict[str, list[LiveDataFile]] = {path: [] for path in by_path}
    tasks = java.newScan().useSnapshot(snapshot.snapshotId()).filter(expression).ignoreResiduals().planFiles()
    try:
        for task in iterate(tasks):
            file = task.file()
            if (owner := listing_of(file)) is not None:
                path = str(file.location())
                owner._tasks[path] = task
                data[owner.iceberg_path].append(
                    LiveDataFile(path, int(file.fileSizeInBytes()), int(file.recordCount()), int(file.dataSequenceNumber()))
                )
    finally:
        tasks.close()
    for listing in listings:
        listing.data, listing.deletes = tuple(data[listing.iceberg_path]), tuple(deletes[listing.iceberg_path])
    return listings


def _delete_file(listing: PartitionListing, delete: JavaObject) -> LiveDeleteFile:
    """The facts of a delete file; its Java handle is kept in the listing for the commit."""
    facts = delete_facts(delete)
    listing._delete_handles[facts.path] = delete.copy()
    return facts


def delete_facts(delete: JavaObject) -> LiveDeleteFile:
    """The facts of a Java ``DeleteFile``."""
    path = str(delete.location())
    equality = delete.content().toString() == "EQUALITY_DELETES"
    ids = tuple(int(i) for i in iterate(delete.equalityFieldIds())) if equality else ()
    referenced = delete.referencedDataFile()
    offset, length = delete.contentOffset(), delete.contentSizeInBytes()  # deletion vectors only
    return LiveDeleteFile(
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


# Key types whose Iceberg bounds and Parquet values compare as the same Python values.
_PRUNABLE_KEY_TYPES = frozenset({"int", "long", "string"})


def list_global_deletes(table: IcebergTable, layout: TableLayout, io_properties: Mapping[str, str]) -> PartitionListing | None:
    """What resolving the table's global equality deletes needs, at its current snapshot: the
    global deletes (under its unpartitioned spec), every data file of any partition one of them
    applies to (data sequence number lower than the delete's), each with its file-scoped position
    deletes, and which of those files' key bounds admit a deleted key (the deleted keys are read
    from the global delete files, which hold one batch's keys each). None: an empty table."""
    return table.call(f"listing the global deletes of {table.ref}", lambda: _list_global(table, layout, io_properties))


def _list_global(table: IcebergTable, layout: TableLayout, io_properties: Mapping[str, str]) -> PartitionListing | None:
    java, bridge = table._java, table.bridge
    listing = _at_current_snapshot(table, layout, ())
    if listing is None:
        return None
    snapshot = listing._java_snapshot
    listing._global = True
    if layout.global_spec_id is None:
        return listing
    specs, io = java.specs(), java.io()
    global_deletes: list[LiveDeleteFile] = []
    position_deletes: list[LiveDeleteFile] = []
    for manifest in iterate(snapshot.deleteManifests(io)):
        reader = bridge.iceberg.ManifestFiles.readDeleteManifest(manifest, io, specs)
        try:
            for delete in iterate(reader):
                if delete.content().toString() == "EQUALITY_DELETES":
                    if delete.specId() == layout.global_spec_id:
                        global_deletes.append(_delete_file(listing, delete))
                elif delete.referencedDataFile() is not None:
                    position_deletes.append(_delete_file(listing, delete))
        finally:
            reader.close()
    newest = max((d.data_sequence_number for d in global_deletes), default=0)
    data = []
    bounds: dict[str, tuple[Any, Any]] = {}
    key_id = layout.key_field_ids[0]
    key_type = java.schema().findType(key_id)
    # Pruned by the first key column's bounds (a multi-column key's other columns are not used).
    prune = next(c.type for c in layout.columns if c.name == layout.primary_key[0]) in _PRUNABLE_KEY_TYPES
    tasks = java.newScan().useSnapshot(snapshot.snapshotId()).ignoreResiduals().planFiles()
    try:
        for task in iterate(tasks):
            file = task.file()
            sequence = int(file.dataSequenceNumber())
            if sequence >= newest:
                continue  # no global delete applies to it
            path = str(file.location())
            listing._tasks[path] = task
            data.append(LiveDataFile(path, int(file.fileSizeInBytes()), int(file.recordCount()), sequence))
            lower, upper = (file.lowerBounds(), file.upperBounds()) if prune else (None, None)
            if lower is not None and upper is not None and lower.get(key_id) is not None and upper.get(key_id) is not None:
                conversions = bridge.iceberg.types.Conversions
                bounds[path] = (
                    _python(conversions.fromByteBuffer(key_type, lower.get(key_id))),
                    _python(conversions.fromByteBuffer(key_type, upper.get(key_id))),
                )
    finally:
        tasks.close()
    listing.data = tuple(data)
    referenced = {f.path for f in data}
    listing.deletes = (*global_deletes, *(d for d in position_deletes if d.referenced_data_file in referenced))
    if prune:
        keys = sorted(_first_key_values(global_deletes, key_id, io_properties))
        listing.may_match = tuple(f.path for f in data if f.path not in bounds or _any_between(keys, *bounds[f.path]))
    return listing


def _python(value: Any) -> Any:
    """A bound as Python compares it: py4j gives Java integers as ints, strings as CharSequences."""
    return value if isinstance(value, (int, str)) else str(value.toString())


def _first_key_values(deletes: Iterable[LiveDeleteFile], field_id: int, io_properties: Mapping[str, str]) -> set[Any]:
    values: set[Any] = set()
    for delete in deletes:
        values.update(read_parquet_fields(delete.path, [field_id], io_properties).column(0).to_pylist())
    values.discard(None)
    return values


def _any_between(keys: Sequence[Any], lower: Any, upper: Any) -> bool:
    """Whether a sorted sequence holds a value within [lower, upper]."""
    at = bisect.bisect_left(keys, lower)
    return at < len(keys) and keys[at] <= upper
