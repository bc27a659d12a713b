"""Executing one compaction of one partition on Spark, as ONE Iceberg commit.

Iceberg's ``rewrite_data_files`` action cannot do what a delete merge needs in one commit
(rewrite small files, turn the equality deletes on large files into position deletes, drop the
deletes that then apply to nothing), so this drives the same machinery the action uses, through
its public Java classes:

1. list the partition's live files at the starting snapshot (a scan with a partition filter built
   from the partition's transforms, ``ignoreResiduals`` so that no row is filtered out of a
   rewrite, then an exact check of each file's spec and partition);
2. rewrite the chosen data files the way the action's bin-pack runner does: stage their scan
   tasks (which carry their delete files) in ``ScanTaskSetManager``, read them through Spark, which
   applies the deletes, and write target-sized files, collected by ``FileRewriteCoordinator``;
3. compute position deletes for the large files on executors (``positions.convert``);
4. commit a ``RewriteFiles`` that validates from the starting snapshot and gives the new data
   files the starting sequence number, so that equality deletes the writer commits meanwhile
   still apply to them (DESIGN.md), tagged in the snapshot summary.

Files written by a compaction that does not commit are deleted, unless the commit's outcome is
unknown (then orphan-file removal takes them, since they may be referenced).
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from icecdc import failpoints
from icecdc.compactor.policy import (
    DataFileFacts,
    DeleteFileFacts,
    PartitionFiles,
    RewritePlan,
    Work,
    applying_deletes,
)
from icecdc.compactor.positions import Conversion, EqualityDeletes, convert_all
from icecdc.ingest.commit import java_partition
from icecdc.ingest.layout import PartitionKey, TableLayout
from icecdc.jvm import (
    CommittedSnapshot,
    activate_session,
    commit_tagged,
    iterate,
    java_exception_class,
    jvm,
    load_table,
    static_call,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

# Snapshot summary properties of a compaction commit: the sidecar recognises its own commits by
# them (they are not writes), and anyone can audit who compacted what.
COMPACTOR_PROPERTY = "icecdc.compactor"
WORK_PROPERTY = "icecdc.compaction"
PARTITION_PROPERTY = "icecdc.partition"
STARTING_SNAPSHOT_PROPERTY = "icecdc.starting-snapshot-id"

_CONFLICTS = {
    "org.apache.iceberg.exceptions.ValidationException",
    "org.apache.iceberg.exceptions.CommitFailedException",
}
_UNKNOWN = "org.apache.iceberg.exceptions.CommitStateUnknownException"


Committer = Callable[[Callable[[], CommittedSnapshot]], CommittedSnapshot]


def _commit_now(attempt: Callable[[], CommittedSnapshot]) -> CommittedSnapshot:
    return attempt()


class CompactionConflict(RuntimeError):
    """The commit lost to a concurrent change of the same files (another compactor, or files
    gone by expiry); nothing was committed and the partition can be tried again."""


@dataclass(frozen=True)
class CompactionResult:
    work: Work
    starting_snapshot_id: int
    starting_sequence_number: int
    committed: CommittedSnapshot | None = None
    data_files_rewritten: int = 0
    data_files_added: int = 0
    bytes_rewritten: int = 0
    bytes_added: int = 0
    delete_files_removed: int = 0
    position_delete_files_added: int = 0


@dataclass
class _Listing:
    """A partition's files at one snapshot: plain facts for the policy, Java handles to commit."""

    snapshot: Any
    files: PartitionFiles
    tasks: dict[str, Any] = field(default_factory=dict)  # data file path -> FileScanTask
    deletes: dict[str, Any] = field(default_factory=dict)  # delete file path -> DeleteFile


def partition_filter(spark: SparkSession, layout: TableLayout, partition: PartitionKey) -> Any:
    """An Iceberg expression selecting exactly one partition, for identity and transform fields
    alike (day, hour, bucket, truncate, ...). It only prunes; membership is checked exactly."""
    expressions = jvm(spark).org.apache.iceberg.expressions.Expressions
    result = expressions.alwaysTrue()
    for term, value in zip(layout.partition, partition):
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
        elif term.source_type in ("binary",) or term.source_type.startswith("fixed"):
            continue  # no literal form for bytes; the exact check below still applies
        else:
            predicate = expressions.equal(java_term, value)
        result = getattr(expressions, "and")(result, predicate)
    return result


class PartitionCompaction:
    """One compaction of one partition of one table."""

    def __init__(self, spark: SparkSession, qualified_name: str, layout: TableLayout, partition: PartitionKey,
                 io_properties: Mapping[str, str], target_file_size: int) -> None:
        self._spark = spark
        self._jvm = jvm(spark)
        self._layout = layout
        self._partition = partition
        self._path = layout.partition_path(partition)
        self._io_properties = dict(io_properties)
        self._target = target_file_size
        self.table = load_table(spark, qualified_name)
        self._listing: _Listing | None = None

    def _in_partition(self, file: Any, spec: Any, java_path: str) -> bool:
        return file.specId() == self._layout.spec_id and spec.partitionToPath(file.partition()) == java_path

    def files(self) -> PartitionFiles | None:
        """The partition's live files at the table's current snapshot (None: empty table)."""
        self.table.refresh()
        snapshot = self.table.currentSnapshot()
        if snapshot is None:
            return None
        spec = self.table.specs().get(self._layout.spec_id)
        # Compared as Iceberg itself renders them, from the typed Java partition tuple.
        java_path = spec.partitionToPath(java_partition(self._spark, spec, self._layout, self._partition))
        expression = partition_filter(self._spark, self._layout, self._partition)
        listing = _Listing(snapshot, PartitionFiles((), ()))
        io = self.table.io()
        for manifest in iterate(snapshot.deleteManifests(io)):
            if manifest.partitionSpecId() != self._layout.spec_id:
                continue
            reader = self._jvm.org.apache.iceberg.ManifestFiles.readDeleteManifest(manifest, io, self.table.specs()).filterRows(expression)
            try:
                for delete in iterate(reader):
                    if self._in_partition(delete, spec, java_path):
                        listing.deletes[delete.location()] = delete.copy()
            finally:
                reader.close()
        deletes = tuple(
            DeleteFileFacts(path, "equality" if d.content().toString() == "EQUALITY_DELETES" else "position",
                            d.recordCount(), d.fileSizeInBytes(), d.dataSequenceNumber(), d.referencedDataFile())
            for path, d in listing.deletes.items()
        )
        # Which deletes apply to which file is computed from sequence numbers rather than read
        # from each scan task: one py4j call per file instead of one per (file, delete) pair.
        data: list[DataFileFacts] = []
        scan = self.table.newScan().useSnapshot(snapshot.snapshotId()).filter(expression).ignoreResiduals()
        tasks = scan.planFiles()
        try:
            for task in iterate(tasks):
                file = task.file()
                if not self._in_partition(file, spec, java_path):
                    continue
                path, sequence_number = file.location(), file.dataSequenceNumber()
                listing.tasks[path] = task
                equality, position = applying_deletes(path, sequence_number, deletes)
                data.append(DataFileFacts(path, file.fileSizeInBytes(), file.recordCount(), sequence_number, equality, position))
        finally:
            tasks.close()
        listing.files = PartitionFiles(tuple(data), deletes)
        self._listing = listing
        return listing.files

    @property
    def starting_snapshot(self) -> tuple[int, int]:
        """(snapshot id, sequence number) the last ``files()`` listed the partition at."""
        if self._listing is None:
            raise RuntimeError("files() must be called first")
        return self._listing.snapshot.snapshotId(), self._listing.snapshot.sequenceNumber()

    def run(self, plan: RewritePlan, summary: Mapping[str, str], commit: Committer = _commit_now) -> CompactionResult:
        """Execute a plan made from ``files()`` and commit it through ``commit``, which calls the
        attempt it is given when (and as often as) it sees fit: the coordinator's commit gate."""
        listing = self._listing
        if listing is None:
            raise RuntimeError("files() must be called before run()")
        snapshot = listing.snapshot
        result = CompactionResult(plan.work, snapshot.snapshotId(), snapshot.sequenceNumber())
        if plan.empty:
            return result
        written: list[str] = []
        try:
            new_data = self._rewrite(plan, listing) if plan.rewrite else []
            written += [f.location() for f in new_data]
            position_files = self._convert(plan, listing) if plan.convert else []
            written += [f.location() for f in position_files]
            failpoints.hit("compactor-before-commit")
            tags = {**summary, WORK_PROPERTY: plan.work.value, PARTITION_PROPERTY: self._path,
                    STARTING_SNAPSHOT_PROPERTY: str(snapshot.snapshotId())}

            def attempt() -> CommittedSnapshot:
                # A fresh update per attempt: a failed Iceberg update cannot be committed again.
                update = self.table.newRewrite().validateFromSnapshot(snapshot.snapshotId())
                if new_data:
                    update = update.dataSequenceNumber(snapshot.sequenceNumber())
                for path in plan.rewrite:
                    update = update.deleteFile(listing.tasks[path].file())
                for file in [*new_data, *position_files]:
                    update = update.addFile(file)
                for path in plan.remove_deletes:
                    update = update.deleteFile(listing.deletes[path])
                return commit_tagged(update, tags, self.table)

            committed = commit(attempt)
        except Exception as error:
            kind = java_exception_class(error)
            if kind != _UNKNOWN:
                self._delete_quietly(written)
            if kind in _CONFLICTS:
                raise CompactionConflict(str(error.java_exception.getMessage())) from None  # type: ignore[attr-defined]
            raise
        return CompactionResult(
            plan.work, snapshot.snapshotId(), snapshot.sequenceNumber(), committed,
            data_files_rewritten=len(plan.rewrite), data_files_added=len(new_data),
            bytes_rewritten=sum(listing.tasks[p].file().fileSizeInBytes() for p in plan.rewrite),
            bytes_added=sum(f.fileSizeInBytes() for f in new_data),
            delete_files_removed=len(plan.remove_deletes), position_delete_files_added=len(position_files),
        )

    def _rewrite(self, plan: RewritePlan, listing: _Listing) -> list[Any]:
        spark_pkg = self._jvm.org.apache.iceberg.spark
        read, write = spark_pkg.SparkReadOptions, spark_pkg.SparkWriteOptions
        group = f"icecdc-{uuid.uuid4().hex}"
        cache = static_call(self._spark, spark_pkg.SparkTableCache, "get")
        staged, coordinator = spark_pkg.ScanTaskSetManager.get(), spark_pkg.FileRewriteCoordinator.get()
        cache.add(group, self.table)
        staged.stageTasks(self.table, group, [listing.tasks[p] for p in plan.rewrite])
        activate_session(self._spark)
        try:
            frame = (self._spark.read.format("iceberg")
                     .option(read.SCAN_TASK_SET_ID, group)
                     .option(read.SPLIT_SIZE, str(self._target))
                     .option(read.FILE_OPEN_COST, "0")
                     .load(group))
            (frame.write.format("iceberg")
             .option(write.REWRITTEN_FILE_SCAN_TASK_SET_ID, group)
             .option(write.TARGET_FILE_SIZE_BYTES, str(self._target))
             .option(write.DISTRIBUTION_MODE, "none")
             .option(write.OUTPUT_SPEC_ID, str(self._layout.spec_id))
             .mode("append").save(group))
            return list(iterate(coordinator.fetchNewFiles(self.table, group)))
        finally:
            cache.remove(group)
            staged.removeTasks(self.table, group)
            coordinator.clearRewrite(self.table, group)

    def _convert(self, plan: RewritePlan, listing: _Listing) -> list[Any]:
        conversions = []
        for path in plan.convert:
            task = listing.tasks[path]
            facts = next(f for f in listing.files.data if f.path == path)
            equality = tuple(
                EqualityDeletes(p, tuple(int(i) for i in listing.deletes[p].equalityFieldIds())) for p in facts.equality_deletes
            )
            output = "/".join(x for x in (self._layout.data_location, self._path, f"{uuid.uuid4().hex}-position-deletes.parquet") if x)
            conversions.append((task, Conversion(path, equality, facts.position_deletes, output)))
        jobs = [c for _, c in conversions]
        converted = (self._spark.sparkContext.parallelize(jobs, len(jobs))
                     .mapPartitions(functools.partial(_convert_partition, self._io_properties)).collect())
        iceberg = self._jvm.org.apache.iceberg
        spec = self.table.specs().get(self._layout.spec_id)
        metrics_config = iceberg.MetricsConfig.forPositionDelete(self.table)
        by_data_file = {c.data_file: c for c in converted}
        files = []
        for task, conversion in conversions:
            done = by_data_file[conversion.data_file]
            if done.path is None:
                continue
            metrics = iceberg.parquet.ParquetUtil.fileMetrics(self.table.io().newInputFile(done.path), metrics_config)
            files.append(
                iceberg.FileMetadata.deleteFileBuilder(spec).ofPositionDeletes()
                .withPath(done.path).withFormat(iceberg.FileFormat.PARQUET).withFileSizeInBytes(done.size)
                .withPartition(task.file().partition()).withMetrics(metrics)
                .withReferencedDataFile(conversion.data_file).build()
            )
        return files

    def _delete_quietly(self, paths: list[str]) -> None:
        io = self.table.io()
        for path in paths:
            try:
                io.deleteFile(path)
            except Exception:  # noqa: BLE001 - left for orphan-file removal
                log.warning("could not delete uncommitted compaction output %s; orphan-file removal will", path)


def _convert_partition(io_properties: Mapping[str, str], jobs: Any) -> Any:
    return convert_all(list(jobs), io_properties)
