"""Partition statistics from a table's own metadata, through pyiceberg (metadata only: it reads
manifests, never rows). This is how the sidecar knows every partition at start-up and catches up
with whatever the commit events did not tell it (a late start, a restart, a lost event)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from icecdc.compactor.policy import PartitionStats, Work
from icecdc.compactor.sizes import SizeClass, size_class
from icecdc.compactor.tracker import GLOBAL_DELETES_PATH, PartitionMetadata
from icecdc.domain import summary
from icecdc.domain.files import DataFileContent
from icecdc.domain.layout import PartitionKey, TableLayout, layout_from_pyiceberg
from icecdc.domain.portable import SnapshotFacts
from icecdc.domain.tableref import MAIN_BRANCH, TableRef
from icecdc.runtime.catalog import load_metadata_table
from icecdc.runtime.config import CompactorConfig, TableConfig


@dataclass
class PartitionTally:
    """What live files of one partition add up to, and the newest commit among them."""

    key: PartitionKey
    record: dict[str, Any]  # the partition as field name -> value, in its own spec's fields
    counts: Counter[str] = field(default_factory=Counter)
    # (timestamp ms, snapshot id) of the newest commit that added one of the files.
    newest: tuple[int, int] | None = None
    # Timestamp (ms) of the oldest commit that added one of its live equality-delete files.
    oldest_equality_delete_ms: int | None = None

    def add(self, other: PartitionTally) -> None:
        self.counts.update(other.counts)
        if other.newest is not None and (self.newest is None or other.newest > self.newest):
            self.newest = other.newest
        self.equality_delete_at(other.oldest_equality_delete_ms)

    def equality_delete_at(self, at: int | None) -> None:
        if at is not None and (self.oldest_equality_delete_ms is None or at < self.oldest_equality_delete_ms):
            self.oldest_equality_delete_ms = at


@dataclass
class ManifestTally:
    """One manifest's live entries, summed per partition (of the current spec, or of an older one
    under its tracked path), and its global equality deletes. A manifest file never changes once written, so this is read once per file."""

    partitions: dict[str, PartitionTally] = field(default_factory=dict)
    global_delete_files: int = 0
    global_delete_records: int = 0
    global_delete_times_ms: tuple[int, int] | None = None  # oldest, newest commit of one


def _tally_manifest(
    manifest: Any, io: Any, layout: TableLayout, settings: CompactorConfig, commit_times: Mapping[int, int]
) -> ManifestTally:
    tally = ManifestTally()
    spec_id = manifest.partition_spec_id
    # Files of an older spec are tallied as partitions of that spec, to be rewritten into the
    # current one; the global-delete spec's equality deletes are the table's global deletes.
    spec_layout = layout.of_spec(spec_id)
    if spec_layout is None:
        return tally  # a spec whose source columns are gone: its files are left as they are
    names = [term.name for term in spec_layout.partition]
    for entry in manifest.fetch_manifest_entry(io, discard_deleted=True):
        data_file = entry.data_file
        content = DataFileContent(data_file.content)
        at = commit_times.get(entry.snapshot_id) if entry.snapshot_id is not None else None
        if spec_id == layout.global_spec_id and content is DataFileContent.EQUALITY_DELETES:
            tally.global_delete_files += 1
            tally.global_delete_records += data_file.record_count
            if at is not None:
                old = tally.global_delete_times_ms
                tally.global_delete_times_ms = (at, at) if old is None else (min(old[0], at), max(old[1], at))
            continue
        key = spec_layout.partition_from_metadata(dict(zip(names, data_file.partition, strict=True)))
        path = spec_layout.tracked_path(key)
        partition = tally.partitions.get(path)
        if partition is None:
            partition = tally.partitions[path] = PartitionTally(key, spec_layout.partition_record(key))
        if at is not None and (partition.newest is None or (at, entry.snapshot_id) > partition.newest):
            partition.newest = (at, entry.snapshot_id)
        c, size, records = partition.counts, data_file.file_size_in_bytes, data_file.record_count
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
            partition.equality_delete_at(at)
        else:
            c["position_delete_files"] += 1
            c["position_delete_records"] += records
    return tally


class ManifestCache:
    """The tallies of one table's manifests, by manifest path, kept between reads: a read of the
    table then opens only the manifests written since the last one (the metadata of an unchanged
    table costs its manifest list). Only the current snapshot's manifests are kept, so memory
    follows the table's live manifests, not its history. A new layout (a spec or schema change)
    starts it afresh."""

    def __init__(self) -> None:
        self._layout: TableLayout | None = None
        self._tallies: dict[str, ManifestTally] = {}
        # At the last read: manifests opened, and manifests whose tally was already known.
        self.opened = self.cached = 0

    def tallies(self, table: Any, snapshot: Any, layout: TableLayout, settings: CompactorConfig) -> list[ManifestTally]:
        if layout != self._layout:
            self._layout, self._tallies = layout, {}
        manifests = snapshot.manifests(table.io)
        commit_times: dict[int, int] | None = None
        kept: dict[str, ManifestTally] = {}
        self.opened = 0
        for manifest in manifests:
            tally = self._tallies.get(manifest.manifest_path)
            if tally is None:
                if commit_times is None:
                    commit_times = {s.snapshot_id: s.timestamp_ms for s in table.metadata.snapshots}
                tally = _tally_manifest(manifest, table.io, layout, settings, commit_times)
                self.opened += 1
            kept[manifest.manifest_path] = tally
        self._tallies = kept
        self.cached = len(kept) - self.opened
        return list(kept.values())


def head_snapshot(table: Any, branch: str) -> Any:
    """The head of ``branch`` in a pyiceberg table; main's current snapshot while the branch does
    not exist yet, where the ingester's first commit to it starts from (as ``IcebergTable`` reads
    it through Java)."""
    return table.snapshot_by_name(branch) or table.current_snapshot()


def branch_history(table: Any, branch: str) -> Iterator[SnapshotFacts]:
    """The head of ``branch`` in a pyiceberg table (``head_snapshot``), then its parent, and so
    on, lazily, as the portability rules read it (``icecdc.domain.portable``)."""
    from pyiceberg.table.snapshots import ancestors_of

    for snapshot in ancestors_of(head_snapshot(table, branch), table.metadata):
        facts = snapshot.summary.additional_properties if snapshot.summary is not None else {}
        yield SnapshotFacts(snapshot.snapshot_id, snapshot.timestamp_ms, facts)


def read_partitions(
    table: Any,
    layout: TableLayout,
    settings: CompactorConfig,
    cache: ManifestCache | None = None,
    branch: str = MAIN_BRANCH,
) -> dict[str, PartitionMetadata]:
    """Every partition that has live files, by tracked path (``TableLayout.tracked_path``: an
    older spec's carry its id), and the table's global deletes (under GLOBAL_DELETES_PATH). One pass over the manifests of the
    head of ``branch`` (the ones ``cache`` has not seen), entries only: no file statistics decoded."""
    snapshot = head_snapshot(table, branch)
    if snapshot is None:
        return {}
    totals: dict[str, PartitionTally] = {}
    global_files = global_records = 0
    global_times: list[int] = []
    for tally in (cache or ManifestCache()).tallies(table, snapshot, layout, settings):
        for path, partition in tally.partitions.items():
            total = totals.get(path)
            if total is None:
                total = totals[path] = PartitionTally(partition.key, partition.record)
            total.add(partition)
        global_files += tally.global_delete_files
        global_records += tally.global_delete_records
        global_times.extend(tally.global_delete_times_ms or ())
    out: dict[str, PartitionMetadata] = {}
    if global_files:
        out[GLOBAL_DELETES_PATH] = PartitionMetadata(
            partition={},
            stats=PartitionStats(equality_delete_files=global_files, equality_delete_records=global_records),
            last_write=max(global_times) / 1000 if global_times else None,
            last_compaction=None,
            oldest_write=min(global_times) / 1000 if global_times else None,
        )
    snapshots = {s.snapshot_id: s for s in table.metadata.snapshots}
    for path, total in totals.items():
        # An unpartitioned table's one partition (the only empty path) was last written by the
        # current snapshot.
        newest_id = total.newest[1] if path and total.newest is not None else snapshot.snapshot_id
        newest = snapshots.get(newest_id)
        when = newest.timestamp_ms / 1000 if newest is not None else None
        tags = newest.summary.additional_properties if newest is not None else {}
        # A resolution of the global deletes is ours, yet for the partitions it gave position
        # deletes it is what the writer's deletes are for a source of whole before-images: rows of
        # theirs deleted. Counted as a write, it makes them hot, judged by the read budget, and
        # settled once the resolutions stop, when their delete merge comes; not counted, a settled
        # partition whose merge had answered its last write kept those deletes until the writer
        # next wrote it (docs/compactor.md, "Global deletes").
        ours = summary.COMPACTOR in tags and tags.get(summary.COMPACTION) != Work.RESOLVE_GLOBAL_DELETES.value
        out[path] = PartitionMetadata(
            partition=total.record,
            stats=PartitionStats(**total.counts),
            last_write=None if ours else when,
            last_compaction=when if ours else None,
            oldest_write=None if total.oldest_equality_delete_ms is None else total.oldest_equality_delete_ms / 1000,
        )
    return out


@dataclass(frozen=True)
class TableMetadata:
    layout: TableLayout
    # The sequence number of the snapshot the partitions were read from: commit events up to it
    # are already counted in them.
    sequence_number: int
    partitions: dict[str, PartitionMetadata]


def load_table_partitions(
    catalog: Any, ref: TableRef, table_config: TableConfig, settings: CompactorConfig, cache: ManifestCache | None = None
) -> TableMetadata | None:
    """A configured table's layout and partitions; None while the table does not exist (the
    ingester creates it). Give the same ``cache`` to every read of a table to read only its new
    manifests."""
    table = load_metadata_table(catalog, ref)
    return None if table is None else table_partitions(table, ref, table_config, settings, cache)


def table_partitions(
    table: Any, ref: TableRef, table_config: TableConfig, settings: CompactorConfig, cache: ManifestCache | None = None
) -> TableMetadata:
    """``load_table_partitions`` of a table already loaded (a pyiceberg ``Table``)."""
    layout = layout_from_pyiceberg(table_config.name, table_config.topic or "", table_key(table_config, table), table)
    snapshot = head_snapshot(table, ref.branch)
    sequence_number = (snapshot.sequence_number or 0) if snapshot is not None else 0
    return TableMetadata(layout, sequence_number, read_partitions(table, layout, settings, cache, ref.branch))


def table_key(table_config: TableConfig, table: Any) -> list[str]:
    """The key equality deletes are converted by: the configured primary key, or else the
    table's Iceberg identifier fields (a table kept for another writer is configured by name);
    empty when neither says."""
    if table_config.primary_key:
        return list(table_config.primary_key)
    schema = table.schema()
    return [schema.find_column_name(field_id) for field_id in schema.identifier_field_ids]
