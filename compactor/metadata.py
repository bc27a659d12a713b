"""Partition statistics from a table's own metadata, through pyiceberg (metadata only: it reads
manifests, never rows). This is how the sidecar knows every partition at start-up and catches up
with whatever the commit events did not tell it (a late start, a restart, a lost event)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from icecdc import summary
from icecdc.catalog import load_metadata_table
from icecdc.compactor.policy import PartitionStats
from icecdc.compactor.sizes import SizeClass, size_class
from icecdc.compactor.tracker import GLOBAL_DELETES_PATH, PartitionMetadata
from icecdc.config import CompactorConfig, TableConfig
from icecdc.files import DataFileContent
from icecdc.layout import TableLayout, layout_from_pyiceberg
from icecdc.tableref import TableRef


def _snapshot_time_and_owner(table: Any, snapshot_id: int | None) -> tuple[float | None, bool]:
    snapshot = table.snapshot_by_id(snapshot_id) if snapshot_id is not None else None
    if snapshot is None:
        return None, False
    ours = summary.COMPACTOR in snapshot.summary.additional_properties
    return snapshot.timestamp_ms / 1000, ours


def read_partitions(table: Any, layout: TableLayout, settings: CompactorConfig) -> dict[str, PartitionMetadata]:
    """Every partition of the table's current spec that has live files, by partition path.
    Files of older specs are left to a full rewrite and not reported."""
    snapshot = table.current_snapshot()
    # A table emptied by a truncate has a snapshot without manifests, which pyiceberg's
    # inspect tables cannot be built from.
    if snapshot is None or not snapshot.manifests(table.io):
        return {}
    counters: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    keys: dict[str, Any] = {}
    files = table.inspect.files().select(["content", "spec_id", "partition", "record_count", "file_size_in_bytes"])
    for row in files.to_pylist():
        if row["spec_id"] != layout.spec_id:
            continue
        key = layout.partition_from_metadata(row["partition"] or {})
        path = layout.partition_path(key)
        keys[path] = key
        c = counters[path]
        size, records = row["file_size_in_bytes"], row["record_count"]
        content = DataFileContent(row["content"])
        if content is DataFileContent.DATA:
            c["data_files"] += 1
            c["data_bytes"] += size
            c["records"] += records
            kind = size_class(size, settings)
            if kind is not SizeClass.LARGE:
                c[f"{kind.value}_files"] += 1
                c[f"{kind.value}_bytes"] += size
        elif content is DataFileContent.EQUALITY_DELETES:
            c["equality_delete_files"] += 1
            c["equality_delete_records"] += records
        else:
            c["position_delete_files"] += 1
            c["position_delete_records"] += records
    last_updated: dict[str, int | None] = {}
    if layout.partition:
        for row in table.inspect.partitions().select(["partition", "spec_id", "last_updated_snapshot_id"]).to_pylist():
            if row["spec_id"] == layout.spec_id:
                last_updated[layout.partition_path(layout.partition_from_metadata(row["partition"]))] = row[
                    "last_updated_snapshot_id"
                ]
    else:
        last_updated[""] = table.current_snapshot().snapshot_id
    out = {}
    global_deletes = read_global_deletes(table, layout)
    if global_deletes is not None:
        out[GLOBAL_DELETES_PATH] = global_deletes
    for path, counts in counters.items():
        when, ours = _snapshot_time_and_owner(table, last_updated.get(path))
        out[path] = PartitionMetadata(
            partition=layout.partition_record(keys[path]),
            stats=PartitionStats(**counts),
            last_write=None if ours else when,
            last_compaction=when if ours else None,
        )
    return out


def read_global_deletes(table: Any, layout: TableLayout) -> PartitionMetadata | None:
    """The table's live global equality deletes (under its unpartitioned spec), with when the
    newest and the oldest were committed; None when there are none. Only the delete manifests of
    that spec are read."""
    from pyiceberg.manifest import ManifestContent

    snapshot = table.current_snapshot()
    if layout.global_spec_id is None or snapshot is None:
        return None
    files = records = 0
    times: list[float] = []
    for manifest in snapshot.manifests(table.io):
        if manifest.content != ManifestContent.DELETES or manifest.partition_spec_id != layout.global_spec_id:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if DataFileContent(entry.data_file.content) is not DataFileContent.EQUALITY_DELETES:
                continue
            files += 1
            records += entry.data_file.record_count
            added = table.snapshot_by_id(entry.snapshot_id) if entry.snapshot_id is not None else None
            if added is not None:
                times.append(added.timestamp_ms / 1000)
    if not files:
        return None
    return PartitionMetadata(
        partition={},
        stats=PartitionStats(equality_delete_files=files, equality_delete_records=records),
        last_write=max(times, default=None),
        last_compaction=None,
        oldest_write=min(times, default=None),
    )


@dataclass(frozen=True)
class TableMetadata:
    layout: TableLayout
    # The sequence number of the snapshot the partitions were read from: commit events up to it
    # are already counted in them.
    sequence_number: int
    partitions: dict[str, PartitionMetadata]


def load_table_partitions(
    catalog: Any, ref: TableRef, table_config: TableConfig, settings: CompactorConfig
) -> TableMetadata | None:
    """A configured table's layout and partitions; None while the table does not exist (the
    ingester creates it)."""
    table = load_metadata_table(catalog, ref)
    if table is None:
        return None
    layout = layout_from_pyiceberg(table_config.name, table_config.topic, table_config.primary_key, table)
    snapshot = table.current_snapshot()
    sequence_number = (snapshot.sequence_number or 0) if snapshot is not None else 0
    return TableMetadata(layout, sequence_number, read_partitions(table, layout, settings))
