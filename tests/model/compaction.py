"""The compactor's plans on the table model: the product's plain-data inputs built from the
model's files (what ``icecdc.jvm.listing`` lists at a snapshot), and a plan carried out by the
model's own rules, which are the spec's:

- a rewritten data file's rows are those a reader sees at the starting snapshot (every delete
  that applies to it, global ones too), packed into target-sized files at the starting snapshot's
  sequence number, in the table's current spec: the rows of a file of an older spec are
  partitioned by the current one (``plans.plan_older_spec``); each new file's rows in the table's
  sort order at the start, sorted by the product's own function (``row_merge.sorted_rows``);
- a converted data file gets one position delete (a deletion vector on format v3) listing every
  position deleted at the starting snapshot, at the commit's sequence number, unless that adds
  nothing to the positions its position deletes already remove: then nothing is written and the
  plan keeps them (``plans.keep_deletes_of_unchanged``);
- a plan of conversions alone commits as a ``RowDelta``, any other as one ``RewriteFiles``;
- writer batches, and other compactions, may commit between the listing and the commit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import pyarrow as pa

from icecdc.compactor.plans import CONVERSIONS, PartitionFiles, RewritePlan, keep_deletes_of_unchanged, plan_together
from icecdc.compactor.policy import PartitionStats
from icecdc.compactor.row_merge import sorted_rows
from icecdc.compactor.sizes import SizeClass, size_class
from icecdc.domain.files import DataFileContent, LiveDataFile, LiveDeleteFile
from icecdc.domain.layout import TableLayout
from icecdc.domain.sort_order import UNSORTED, SortOrder
from icecdc.runtime.config import CompactorConfig
from tests.model.iceberg import (
    PARTITIONED_SPEC_ID,
    UNPARTITIONED_SPEC_ID,
    DataFile,
    DeleteFile,
    EqualityDelete,
    Partition,
    PositionDelete,
    Row,
    Snapshot,
    Table,
)


def live_data_file(data: DataFile) -> LiveDataFile:
    return LiveDataFile(data.path, data.size, len(data.rows), data.sequence_number)


def live_delete_file(delete: DeleteFile, key_field_ids: tuple[int, ...]) -> LiveDeleteFile:
    if isinstance(delete, EqualityDelete):
        records = len(delete.keys)
        return LiveDeleteFile(
            delete.path, DataFileContent.EQUALITY_DELETES, records, 16 * records, delete.sequence_number, None, key_field_ids
        )
    records = len(delete.positions)
    return LiveDeleteFile(
        delete.path,
        DataFileContent.POSITION_DELETES,
        records,
        8 * records,
        delete.sequence_number,
        delete.data_file,
        content_offset=4 if delete.deletion_vector else None,
        content_size=8 * records if delete.deletion_vector else None,
    )


def partitions(snapshot: Snapshot, spec_id: int = PARTITIONED_SPEC_ID) -> list[Partition]:
    """The partitions of the spec ``spec_id`` with live files, in order."""
    return sorted({f.partition for f in (*snapshot.data.values(), *snapshot.deletes.values()) if f.spec_id == spec_id})


def older_spec_partitions(snapshot: Snapshot, spec_id: int) -> list[tuple[int, Partition]]:
    """The (spec, partition) pairs with live files of a spec older than the current ``spec_id``,
    in order; not the unpartitioned spec, whose equality deletes are the global deletes."""
    return sorted(
        {
            (f.spec_id, f.partition)
            for f in (*snapshot.data.values(), *snapshot.deletes.values())
            if f.spec_id not in (spec_id, UNPARTITIONED_SPEC_ID)
        }
    )


def partition_files(
    snapshot: Snapshot, partition: Partition, key_field_ids: tuple[int, ...] = (1,), *, spec_id: int = PARTITIONED_SPEC_ID
) -> PartitionFiles:
    """A partition's listing (of the spec ``spec_id``): its data files and its own delete files
    (partition-scoped equality deletes and position deletes, whether they apply to anything or
    not; not global deletes)."""
    data = [live_data_file(f) for f in snapshot.data.values() if f.spec_id == spec_id and f.partition == partition]
    deletes = [
        live_delete_file(d, key_field_ids) for d in snapshot.deletes.values() if d.spec_id == spec_id and d.partition == partition
    ]
    return PartitionFiles.of(data, deletes)


def global_delete_files(snapshot: Snapshot, key_field_ids: tuple[int, ...] = (1,)) -> PartitionFiles | None:
    """What resolving the global deletes is planned from: the global deletes, every data file
    older than the newest of them with the position deletes that name it, and which of those
    files' key bounds (the first key column's, over every row the file holds) admit a deleted
    key. None when there are no global deletes."""
    global_deletes = [d for d in snapshot.deletes.values() if isinstance(d, EqualityDelete) and d.is_global]
    if not global_deletes:
        return None
    newest = max(d.sequence_number for d in global_deletes)
    data = [f for f in snapshot.data.values() if f.sequence_number < newest]
    named = {f.path for f in data}
    positions = [d for d in snapshot.deletes.values() if isinstance(d, PositionDelete) and d.data_file in named]
    keys = {key[0] for d in global_deletes for key in d.keys}

    def may_match(f: DataFile) -> bool:
        first = [snapshot.key_of(row)[0] for row in f.rows]
        return any(min(first) <= k <= max(first) for k in keys)

    return PartitionFiles.of(
        [live_data_file(f) for f in data],
        [live_delete_file(d, key_field_ids) for d in (*global_deletes, *positions)],
        [f.path for f in data if may_match(f)],
    )


def partition_stats(files: PartitionFiles, settings: CompactorConfig) -> PartitionStats:
    """A partition's statistics, as the compactor sums them from table metadata."""
    counts = {"data_files": 0, "data_bytes": 0, "records": 0}
    for f in files.data:
        counts["data_files"] += 1
        counts["data_bytes"] += f.size
        counts["records"] += f.records
        kind = size_class(f.size, settings)
        if kind is not SizeClass.LARGE:
            counts[f"{kind.value}_files"] = counts.get(f"{kind.value}_files", 0) + 1
            counts[f"{kind.value}_bytes"] = counts.get(f"{kind.value}_bytes", 0) + f.size
    for d in files.deletes:
        kind = "equality_delete" if d.is_equality else "position_delete"
        counts[f"{kind}_files"] = counts.get(f"{kind}_files", 0) + 1
        counts[f"{kind}_records"] = counts.get(f"{kind}_records", 0) + d.records
    return PartitionStats(**counts)


def packed(rows: Sequence[Row], target_rows: int, order: SortOrder) -> Iterable[Sequence[Row]]:
    """Target-sized files of ``rows``, each in ``order`` when the table has one."""
    for start in range(0, len(rows), target_rows):
        chunk = rows[start : start + target_rows]
        yield sorted_rows(pa.Table.from_pylist(list(chunk)), order).to_pylist() if order.applies else chunk


def prepare(
    table: Table,
    start: Snapshot,
    plans: Sequence[RewritePlan],
    files: Sequence[PartitionFiles],
    settings: CompactorConfig,
    layout: TableLayout | None = None,
) -> Callable[[], Snapshot] | None:
    """Carry out one plan per listing, all listed at ``start``, up to its commit: returns the
    commit, to be called when the test sees fit (writer batches or other compactions may commit
    first). None: nothing to commit. ``layout``: the table's as the job read it at its start (its
    current spec, which the rows of an older spec's files are partitioned by, and its sort order);
    None: one spec, unsorted."""
    plan = plan_together(plans, table.format_version >= 3)
    if plan.empty:
        return None
    target_rows = max(1, settings.target_file_size_bytes // table.row_bytes)
    spec_id = PARTITIONED_SPEC_ID if layout is None else layout.spec_id
    by_partition: dict[Partition, list[Row]] = {}
    for path in plan.rewrite:
        data = start.data[path]
        for row in start.live_rows(data):
            partition = data.partition if layout is None or data.spec_id == spec_id else layout.partition_of(row)
            assert partition is not None, row
            by_partition.setdefault(partition, []).append(row)
    order = UNSORTED if layout is None else layout.sort_order
    new_data = [(p, chunk) for p, rows in by_partition.items() for chunk in packed(rows, target_rows, order)]
    positions: list[tuple[str, frozenset[int]]] = []
    unchanged: set[str] = set()
    for path in plan.convert:
        data = start.data[path]
        deleted = start.deleted_positions(data)
        earlier = frozenset().union(*(d.positions for d in start.position_deletes_of(data)))
        if deleted - earlier:
            positions.append((path, deleted))
        else:
            unchanged.add(path)
    if unchanged:
        plans = [keep_deletes_of_unchanged(p, f, unchanged) for p, f in zip(plans, files, strict=True)]
        plan = plan_together(plans, table.format_version >= 3)
    if plan.work in CONVERSIONS:
        examined = (*plan.convert, *plan.examined)
        return lambda: table.row_delta(start, positions, plan.remove_deletes, examined)
    return lambda: table.rewrite(start, plan.rewrite, new_data, positions, plan.remove_deletes, spec_id=spec_id)
