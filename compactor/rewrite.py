"""One compaction job, of one partition or of several small ones of a table, as ONE Iceberg
commit, through the Java adapter: list each partition's live files at the starting snapshot and
plan from them (``plans``), rewrite the chosen data files with their deletes applied
(``row_merge`` or Spark), compute position deletes for the converted files (``positions``), and
commit one ``RewriteFiles`` at the starting sequence number, or one ``RowDelta`` for a conversion
alone (docs/compactor.md, "One compaction, one commit"). Files of a compaction that does not
commit are deleted, unless the commit's outcome is unknown: they may be referenced.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from icecdc.compactor.key_index import KeyIndex
from icecdc.compactor.key_index_loader import ParquetFiles, convert_with_index
from icecdc.compactor.plans import CONVERSIONS, PartitionFiles, RewritePlan, keep_deletes_of_unchanged, plan_together
from icecdc.compactor.policy import Work
from icecdc.compactor.positions import Conversion, ConvertedFile, EqualityDeletes, FileDeletes, PositionDeletes, convert_all
from icecdc.compactor.row_merge import MergedFile, RowMerge, bins, merge_all
from icecdc.coordinator.commits import Attempt
from icecdc.domain import summary
from icecdc.domain.errors import CatalogOutage, CatalogUnavailable, CommitStateUnknown
from icecdc.domain.events import CompactionCounts
from icecdc.domain.layout import PartitionKey, TableLayout
from icecdc.jvm.listing import PartitionListing, list_global_deletes, list_partitions
from icecdc.jvm.rewrites import NewFile, PartitionRewrite, PositionDeleteFile, WrittenDataFile
from icecdc.jvm.tables import CommittedSnapshot, IcebergTable, Snapshot
from icecdc.runtime import failpoints
from icecdc.runtime.config import RewriteEngine

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
# (table, sort order id) whose order the arrow engine cannot apply, said once per process.
_SPARK_FOR_ORDER_SAID: set[tuple[str, int]] = set()

J = TypeVar("J")
R = TypeVar("R")
Committer = Callable[[Attempt], CommittedSnapshot]
# Errors after which the commit may have landed: what the compaction wrote may be referenced.
OUTCOME_UNKNOWN = (CommitStateUnknown, CatalogUnavailable, CatalogOutage)


def commit_now(attempt: Attempt) -> CommittedSnapshot:
    return attempt()


@dataclass(frozen=True)
class CompactionResult:
    """What a job did to one of its partitions: its work, its counts, and the snapshot it
    committed (None: nothing, the partition had nothing to do)."""

    work: Work
    counts: CompactionCounts
    committed: CommittedSnapshot | None = None


class CompactionJob:
    """One Spark job and one commit compacting one or more partitions of one table, all listed at
    one starting snapshot; or (``partitions`` None) the resolution of the table's global equality
    deletes, which works on the files of every partition they apply to. Several partitions share
    the job's fixed costs (a listing scan, a Spark job, a quiet window and a commit): the sidecar
    groups small settled partitions (``turns.job_partitions``)."""

    def __init__(
        self,
        spark: SparkSession,
        table: IcebergTable,
        layout: TableLayout,
        partitions: Sequence[PartitionKey] | None,
        io_properties: Mapping[str, str],
        target_file_size: int,
        engine: RewriteEngine = RewriteEngine.ARROW,
        key_index: KeyIndex | None = None,
        *,
        merge_manifests: bool = False,
    ) -> None:
        if partitions is not None and not partitions:
            raise ValueError("a compaction job needs at least one partition")
        self._spark = spark
        self.table = table
        self._layout = layout
        self._partitions = None if partitions is None else tuple(partitions)
        self._io_properties = dict(io_properties)
        self._target = target_file_size
        self._engine = engine
        self._key_index = key_index
        self._merge_manifests = merge_manifests
        self._listings: list[PartitionListing] | None = None
        self._files: list[PartitionFiles] | None = None

    def files(self) -> list[PartitionFiles] | None:
        """Each partition's live files at the table's current snapshot, in the order given
        (None: an empty table)."""
        if self._partitions is None:
            listing = list_global_deletes(self.table, self._layout, self._io_properties)
            self._listings = None if listing is None else [listing]
        else:
            self._listings = list_partitions(self.table, self._layout, self._partitions)
        listings = self._listings
        self._files = None if listings is None else [PartitionFiles.of(x.data, x.deletes, x.may_match) for x in listings]
        return self._files

    @property
    def starting_snapshot(self) -> Snapshot:
        """The snapshot the last ``files()`` listed the partitions at."""
        if self._listings is None:
            raise RuntimeError("files() must be called first, on a table that has a snapshot")
        return self._listings[0].snapshot

    def run(
        self, plans: Sequence[RewritePlan], tags: Mapping[str, str], commit: Committer = commit_now
    ) -> list[CompactionResult]:
        """Execute one plan per partition, made from ``files()``, in one Spark job and one commit
        through ``commit``, which calls the attempt it is given when (and as often as) it sees fit:
        the coordinator's commit gate. Returns what the commit did to each partition."""
        listings, files = self._listings, self._files
        if listings is None or files is None:
            raise RuntimeError("files() must be called before run()")
        if len(plans) != len(listings):
            raise ValueError(f"{len(plans)} plans for {len(listings)} partitions")
        start = listings[0].snapshot
        at_start = CompactionCounts(starting_snapshot_id=start.snapshot_id, starting_sequence_number=start.sequence_number)
        plan = plan_together(plans, self._layout.format_version >= 3)
        if plan.empty:
            return [CompactionResult(p.work, at_start) for p in plans]
        rewrite = PartitionRewrite(listings, self._target, merge_manifests=self._merge_manifests)
        converted: list[PositionDeleteFile] = []
        try:
            if plan.rewrite:
                if self._arrow_rewrites():
                    self._merge_rows(plan.rewrite, files, listings, rewrite)
                else:
                    rewrite.rewrite_data(plan.rewrite)
            if plan.convert:
                converted = self._convert(plan, files, listings)
                rewrite.add_position_deletes([c for c in converted if c.path])
                unchanged = {c.data_file for c in converted if not c.path}
                plans = [keep_deletes_of_unchanged(p, f, unchanged) for p, f in zip(plans, files, strict=True)]
                plan = plan_together(plans, self._layout.format_version >= 3)
            failpoints.hit("compactor-before-commit")
            summary_tags = {**tags, summary.COMPACTION: plan.work.value}
            if plan.work in CONVERSIONS:
                examined = tuple(dict.fromkeys((*plan.convert, *plan.examined)))
                # A conversion's validation indexes no deletes: it validates from the start.
                committed = commit(
                    lambda checked_through=None: rewrite.commit_conversion(examined, plan.remove_deletes, summary_tags)
                )
            else:
                committed = commit(
                    lambda checked_through=None: rewrite.commit(plan.rewrite, plan.remove_deletes, summary_tags, checked_through)
                )
        except OUTCOME_UNKNOWN:
            raise
        except BaseException:
            rewrite.discard()
            raise
        sizes = {f.path: f.size for partition in files for f in partition.data}
        positions_written = {c.data_file for c in converted if c.path}
        return [
            CompactionResult(
                p.work,
                dataclasses.replace(
                    at_start,
                    snapshot_id=None if p.empty else committed.snapshot_id,
                    sequence_number=None if p.empty else committed.sequence_number,
                    data_files_rewritten=len(p.rewrite),
                    data_files_added=len(new_data),
                    bytes_rewritten=sum(sizes[path] for path in p.rewrite),
                    bytes_added=sum(f.size for f in new_data),
                    delete_files_removed=len(p.remove_deletes),
                    position_delete_files_added=sum(1 for path in p.convert if path in positions_written),
                ),
                None if p.empty else committed,
            )
            for p, new_data in zip(plans, self._new_data_by_partition(rewrite, listings), strict=True)
        ]

    def _arrow_rewrites(self) -> bool:
        """Whether this job's rewrites go through the arrow engine. Format v3 stays on Spark's:
        it carries the rows' lineage, the arrow engine does not. So does a partition of an older
        spec: the arrow engine writes each file in the spec of the files it replaces. So does a table whose sort order
        has a transform the arrow engine cannot apply: Spark's write sorts by any of them
        (``PartitionRewrite.rewrite_data``), said once per table and order."""
        if self._engine is not RewriteEngine.ARROW or self._layout.format_version >= 3 or self._layout.is_older_spec:
            return False
        order = self._layout.sort_order
        if order.applies or not order.is_sorted:
            return True
        said = (self._layout.table, order.order_id)
        if said not in _SPARK_FOR_ORDER_SAID:
            _SPARK_FOR_ORDER_SAID.add(said)
            log.info(
                "table %s is ordered by %s: its rewrites go through the spark engine, since the arrow engine cannot sort by %s",
                self._layout.table,
                order,
                ", ".join(map(str, order.unsupported)),
            )
        return False

    @staticmethod
    def _new_data_by_partition(rewrite: PartitionRewrite, listings: Sequence[PartitionListing]) -> list[list[NewFile]]:
        if len(listings) == 1:
            return [rewrite.new_data]
        return [[f for f in rewrite.new_data if f.partition == listing.iceberg_path] for listing in listings]

    def _convert(
        self, plan: RewritePlan, files: Sequence[PartitionFiles], listings: Sequence[PartitionListing]
    ) -> list[PositionDeleteFile]:
        """Position deletes for the files to convert, a file with nothing new deleted coming
        back without a path: through the key index in this process (``key_index_loader``), else
        written on executors (one task per file)."""
        data = {f.path: f for partition in files for f in partition.data}
        deletes = {d.path: d for listing in listings for d in listing.deletes}
        dv = self._layout.format_version >= 3  # v3 refuses Parquet position deletes
        suffix = "deletion-vector.puffin" if dv else "position-deletes.parquet"

        def output_for(path: str) -> str:
            # Beside the data file it deletes from, in its partition's directory.
            return f"{path.rsplit('/', 1)[0]}/{uuid.uuid4().hex}-{suffix}"

        converted: list[ConvertedFile]
        indexed = None
        if self._key_index is not None:
            table = self._layout.table
            # Files this plan rewrites are neither converted nor live once it commits: not read.
            rewritten = set(plan.rewrite)
            partitions = (
                []
                if self._partitions is None
                else [((table, x.partition), [f for f in x.data if f.path not in rewritten]) for x in listings]
            )
            indexed = convert_with_index(
                self._key_index,
                partitions,
                [data[path] for path in plan.convert],
                deletes,
                self._layout.key_field_ids,
                ParquetFiles(self._io_properties),
                output_for,
                dv,
            )
        if indexed is not None:
            converted = indexed.converted
        else:
            jobs = [
                Conversion(
                    path,
                    tuple(EqualityDeletes(p, deletes[p].equality_field_ids) for p in data[path].equality_deletes),
                    tuple(PositionDeletes(p, deletes[p].is_deletion_vector) for p in data[path].position_deletes),
                    output_for(path),
                    deletion_vector=dv,
                )
                for path in plan.convert
            ]
            converted = self._on_executors(jobs, convert_all)
        return [
            PositionDeleteFile(c.data_file, c.path or "", c.size, c.positions, c.content_offset, c.content_size)
            for c in converted
        ]

    def _merge_rows(
        self,
        paths: Sequence[str],
        files: Sequence[PartitionFiles],
        listings: Sequence[PartitionListing],
        rewrite: PartitionRewrite,
    ) -> None:
        """Rewrite the data files ``paths`` with their deletes applied, with pyarrow on executors
        (``row_merge``): each partition's files in runs of at most the target size, a new file
        each, beside the files it replaces."""
        sizes = {f.path: f.size for partition in files for f in partition.data}
        chosen, schema, order = set(paths), self._layout.arrow_schema(), self._layout.sort_order
        jobs = []
        for listing in listings:
            mine = [(f.path, sizes[f.path]) for f in listing.data if f.path in chosen]
            for run in bins(mine, self._target):
                output = f"{run[0].rsplit('/', 1)[0]}/{uuid.uuid4().hex}-compacted.parquet"
                jobs.append(RowMerge(tuple(self._file_deletes(rewrite, p) for p in run), schema, output, order))
        merged: list[MergedFile] = self._on_executors(jobs, merge_all)
        rewrite.add_data_files([WrittenDataFile(m.path, m.size, m.source) for m in merged if m.path])

    @staticmethod
    def _file_deletes(rewrite: PartitionRewrite, path: str) -> FileDeletes:
        deletes = rewrite.task_deletes(path)
        return FileDeletes(
            path,
            tuple(EqualityDeletes(d.path, d.equality_field_ids) for d in deletes if d.is_equality),
            tuple(PositionDeletes(d.path, d.is_deletion_vector) for d in deletes if not d.is_equality),
        )

    def _on_executors(self, jobs: Sequence[J], run: Callable[[Sequence[J], Mapping[str, str]], list[R]]) -> list[R]:
        """``run`` over the jobs on executors, a few tasks per core, each taking several jobs (a
        task costs more than a job): the results, collected."""
        tasks = min(len(jobs), 2 * max(1, self._spark.sparkContext.defaultParallelism))
        results: list[R] = (
            self._spark.sparkContext.parallelize(list(jobs), tasks)
            .mapPartitions(functools.partial(_run_task, run, self._io_properties))
            .collect()
        )
        return results


def _run_task(
    run: Callable[[Sequence[J], Mapping[str, str]], list[R]], io_properties: Mapping[str, str], jobs: Iterable[J]
) -> list[R]:
    return run(list(jobs), io_properties)


class PartitionCompaction:
    """One compaction of one partition (``partition`` None: of the table's global deletes): a
    ``CompactionJob`` of one, with one plan and one result."""

    def __init__(
        self,
        spark: SparkSession,
        table: IcebergTable,
        layout: TableLayout,
        partition: PartitionKey | None,
        io_properties: Mapping[str, str],
        target_file_size: int,
        engine: RewriteEngine = RewriteEngine.ARROW,
        key_index: KeyIndex | None = None,
        *,
        merge_manifests: bool = False,
    ) -> None:
        self.table = table
        partitions = None if partition is None else [partition]
        self._job = CompactionJob(
            spark, table, layout, partitions, io_properties, target_file_size, engine, key_index, merge_manifests=merge_manifests
        )

    def files(self) -> PartitionFiles | None:
        """The partition's live files at the table's current snapshot (None: empty table)."""
        listed = self._job.files()
        return None if listed is None else listed[0]

    @property
    def starting_snapshot(self) -> Snapshot:
        return self._job.starting_snapshot

    def run(self, plan: RewritePlan, tags: Mapping[str, str], commit: Committer = commit_now) -> CompactionResult:
        return self._job.run([plan], tags, commit)[0]
