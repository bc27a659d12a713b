"""The Java side of one compaction job, of one partition or of several of one table: rewriting
data files through Spark, registering the position-delete files written on executors, and the one
``RewriteFiles`` commit.

Iceberg's ``rewrite_data_files`` action cannot do what a delete merge needs in one commit
(rewrite small files, turn the equality deletes on large files into position deletes, drop the
deletes that then apply to nothing), so this drives the same machinery the action uses, through
its public classes: the chosen files' scan tasks (which carry their delete files) are staged in
``ScanTaskSetManager``, read through Spark, which applies the deletes, and written as target-sized
files collected by ``FileRewriteCoordinator``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import orjson

from icecdc.domain import summary as summary_keys
from icecdc.domain.files import LiveDeleteFile
from icecdc.jvm.bridge import JavaObject, iterate, java_errors
from icecdc.jvm.listing import PartitionListing, delete_facts
from icecdc.jvm.tables import CommittedSnapshot


@dataclass(frozen=True)
class NewFile:
    """A file a compaction wrote, not committed yet."""

    path: str
    size: int
    records: int
    partition: str = ""  # as Iceberg renders it (``PartitionListing.iceberg_path``)


@dataclass(frozen=True)
class PositionDeleteFile:
    """A position-delete file (Parquet) or a deletion vector (a Puffin blob) written on an
    executor for one data file."""

    data_file: str
    path: str
    size: int
    positions: int
    content_offset: int | None = None  # deletion vectors: the blob's place in the Puffin file
    content_size: int | None = None


@dataclass(frozen=True)
class WrittenDataFile:
    """A data file written on an executor, replacing data files of one partition."""

    path: str
    size: int
    replaces: str  # one of the data files it replaces: the new file takes its spec and partition


class PartitionRewrite:
    """What one compaction job adds to and removes from its partitions (listed at one snapshot),
    committed as one snapshot."""

    def __init__(self, listings: Sequence[PartitionListing], target_file_size: int, *, merge_manifests: bool = False) -> None:
        if len({listing.snapshot.snapshot_id for listing in listings}) != 1:
            raise ValueError("a rewrite's partitions must be listed at one snapshot")
        self._listings = tuple(listings)
        self._listing = listings[0]
        self._table = self._listing.table
        self._target = target_file_size
        self._merge_manifests = merge_manifests  # the commit merges the table's manifests too
        # Data file path -> its scan task, delete file path -> its handle, over every partition.
        self._tasks = {path: task for listing in listings for path, task in listing._tasks.items()}
        self._delete_handles = {path: handle for listing in listings for path, handle in listing._delete_handles.items()}
        self._added: dict[str, JavaObject] = {}
        self.new_data: list[NewFile] = []
        self.new_position_deletes: list[NewFile] = []

    @property
    def written(self) -> list[str]:
        return list(self._added)

    def rewrite_data(self, paths: Sequence[str]) -> list[NewFile]:
        """Rewrite the data files ``paths`` with their deletes applied, into target-sized files.

        One partition is read in target-sized splits, a task each. Several partitions are read
        as ONE task that writes each partition's rows to its own file (Iceberg's fanout writer):
        a job of several is only ever made of partitions that fit in one target file together
        (``turns.job_partitions``), and a partition split over two tasks would end as two files.

        A table with a sort order gets each task's rows sorted by it, transforms included: with
        no distribution asked for, Iceberg's write still sorts within each task by the table's
        order (``SparkWriteUtil.writeOrdering``), as its own bin-pack rewrite does, without a
        shuffle. So every output file is sorted (``tests/integration/test_sort_order.py``)."""
        bridge, table, listing = self._table.bridge, self._table._java, self._listing
        several = len(self._listings) > 1
        # An older spec's partition is written into the current spec, where it may span several
        # partitions: the fanout writer takes rows of any partition in any order.
        fanout = several or listing.layout.is_older_spec
        tasks = [self._tasks[p] for p in paths]
        split_size = max(self._target, sum(int(t.sizeBytes()) for t in tasks)) if several else self._target
        spark_pkg = bridge.iceberg.spark
        read, write = spark_pkg.SparkReadOptions, spark_pkg.SparkWriteOptions
        group = f"icecdc-{uuid.uuid4().hex}"
        with java_errors():
            cache = bridge.static_call(spark_pkg.SparkTableCache, "get")
            staged, coordinator = spark_pkg.ScanTaskSetManager.get(), spark_pkg.FileRewriteCoordinator.get()
            cache.add(group, table)
            staged.stageTasks(table, group, tasks)
            bridge.activate_session()
            try:
                frame = (
                    bridge.spark.read.format("iceberg")
                    .option(read.SCAN_TASK_SET_ID, group)
                    .option(read.SPLIT_SIZE, str(split_size))
                    .option(read.FILE_OPEN_COST, "0")
                    .load(group)
                )
                (
                    frame.write.format("iceberg")
                    .option(write.REWRITTEN_FILE_SCAN_TASK_SET_ID, group)
                    .option(write.TARGET_FILE_SIZE_BYTES, str(self._target))
                    .option(write.DISTRIBUTION_MODE, "none")
                    .option(write.OUTPUT_SPEC_ID, str(listing.layout.write_spec_id))
                    .option(write.FANOUT_ENABLED, str(fanout).lower())
                    .mode("append")
                    .save(group)
                )
                files = list(iterate(coordinator.fetchNewFiles(table, group)))
            finally:
                cache.remove(group)
                staged.removeTasks(table, group)
                coordinator.clearRewrite(table, group)
            spec = table.specs().get(listing.layout.write_spec_id)
            added = [
                NewFile(
                    str(f.location()), int(f.fileSizeInBytes()), int(f.recordCount()), str(spec.partitionToPath(f.partition()))
                )
                for f in files
            ]
        self._added.update(zip((f.path for f in added), files, strict=True))
        self.new_data += added
        return added

    def task_deletes(self, path: str) -> tuple[LiveDeleteFile, ...]:
        """The delete files Iceberg's scan planning attached to a data file's scan task: every
        delete that applies to it by the spec's rules, global ones included."""
        with java_errors():
            return tuple(delete_facts(d) for d in iterate(self._tasks[path].deletes()))

    def add_data_files(self, written: Sequence[WrittenDataFile]) -> list[NewFile]:
        """Register data files written on executors for the commit, each in the spec and
        partition of a file it replaces, with metrics read from its footer."""
        table = self._table._java
        iceberg = self._table.bridge.iceberg
        added = []
        with java_errors():
            specs, io = table.specs(), table.io()
            metrics_config = iceberg.MetricsConfig.forTable(table)
            for file in written:
                replaced = self._tasks[file.replaces].file()
                spec = specs.get(replaced.specId())
                metrics = iceberg.parquet.ParquetUtil.fileMetrics(io.newInputFile(file.path), metrics_config)
                data_file = (
                    iceberg.DataFiles.builder(spec)
                    .withPath(file.path)
                    .withFileSizeInBytes(file.size)
                    .withPartition(replaced.partition())
                    .withFormat(iceberg.FileFormat.PARQUET)
                    .withMetrics(metrics)
                    .build()
                )
                self._added[file.path] = data_file
                added.append(
                    NewFile(file.path, file.size, int(data_file.recordCount()), str(spec.partitionToPath(replaced.partition())))
                )
        self.new_data += added
        return added

    def add_position_deletes(self, written: Sequence[PositionDeleteFile]) -> list[NewFile]:
        """Register position-delete files (one per data file, naming it) for the commit."""
        iceberg, table = self._table.bridge.iceberg, self._table._java
        added = []
        with java_errors():
            specs = table.specs()
            metrics_config = iceberg.MetricsConfig.forPositionDelete(table)
            for file in written:
                data_file = self._tasks[file.data_file].file()
                # In the data file's own spec and partition: a global-delete resolution writes
                # them across partitions, of older specs too.
                builder = (
                    iceberg.FileMetadata.deleteFileBuilder(specs.get(data_file.specId()))
                    .ofPositionDeletes()
                    .withPath(file.path)
                    .withFileSizeInBytes(file.size)
                    .withPartition(data_file.partition())
                    .withReferencedDataFile(file.data_file)
                )
                if file.content_offset is not None:  # a deletion vector: a blob in a Puffin file
                    builder = (
                        builder.withFormat(iceberg.FileFormat.PUFFIN)
                        .withRecordCount(file.positions)
                        .withContentOffset(file.content_offset)
                        .withContentSizeInBytes(file.content_size)
                    )
                else:
                    metrics = iceberg.parquet.ParquetUtil.fileMetrics(table.io().newInputFile(file.path), metrics_config)
                    builder = builder.withFormat(iceberg.FileFormat.PARQUET).withMetrics(metrics)
                self._added[file.path] = builder.build()
                added.append(NewFile(file.path, file.size, file.positions))
        self.new_position_deletes += added
        return added

    def commit(
        self,
        rewritten: Sequence[str],
        removed_deletes: Sequence[str],
        summary: Mapping[str, str],
        checked_through: int | None = None,
    ) -> CommittedSnapshot:
        """One ``RewriteFiles``: remove the rewritten data files and the delete files nothing needs
        any more, add what this rewrite wrote, validate from the starting snapshot, and give new
        data files the starting snapshot's sequence number, so that equality deletes the writer
        commits meanwhile still apply to them (and Iceberg's validation ignores them).

        ``checked_through``: a later snapshot up to which the sidecar has checked that no writer
        commit touched these partitions (``watcher.guard``); Iceberg validates from it instead.
        Iceberg indexes every delete file added in the validated stretch, in any partition, and
        its index fails on format v3 when the writer replaced one file's deletion vector twice
        there ("Can't index multiple DVs", apache/iceberg#17764)."""
        table, start = self._table, self._listing.snapshot
        validate_from = start.snapshot_id if checked_through is None else checked_through

        def build(source: JavaObject) -> JavaObject:
            # Set even when nothing is written (every rewritten row was deleted): Iceberg's
            # validation ignores the writer's new equality deletes only when it is set, and would
            # otherwise fail the rewrite of fully deleted files on any batch that lands meanwhile.
            update = source.newRewrite().validateFromSnapshot(validate_from).dataSequenceNumber(start.sequence_number)
            for path in rewritten:
                update = update.deleteFile(self._tasks[path].file())
            for java in self._added.values():
                update = update.addFile(java)
            for path in removed_deletes:
                update = update.deleteFile(self._delete_handles[path])
            return update

        return table.commit(self._what("a compaction"), build, self._tags(summary), merge_manifests=self._merge_manifests)

    def commit_conversion(
        self, examined: Sequence[str], removed_deletes: Sequence[str], summary: Mapping[str, str]
    ) -> CommittedSnapshot:
        """One ``RowDelta`` for an equality-to-position conversion (of a partition's equality
        deletes, or of a table's global ones): add the new position deletes, remove the position
        deletes they replace and the equality deletes nothing needs any more. Validated from the
        starting snapshot: every data file examined must still exist (a compaction that rewrote
        one meanwhile would be carrying the removed equality deletes' rows) and every delete file
        removed must still be live. No "no conflicting data or delete
        files" validation: the writer adds both every batch, and a conversion waiting for a
        batch-free moment would never commit (Flink's ConvertEqualityDeletes committer says the
        same). The writer never fails because of it: its commits remove nothing."""
        table, start = self._table, self._listing.snapshot

        def build(source: JavaObject) -> JavaObject:
            delta = (
                source.newRowDelta()
                .validateFromSnapshot(start.snapshot_id)
                .validateDataFilesExist(list(examined))
                .validateDeletedFiles()
            )
            for java in self._added.values():
                delta = delta.addDeletes(java)
            for path in removed_deletes:
                delta = delta.removeDeletes(self._delete_handles[path])
            return delta

        return table.commit(self._what("a conversion"), build, self._tags(summary), merge_manifests=self._merge_manifests)

    def _tags(self, summary: Mapping[str, str]) -> dict[str, str]:
        """The snapshot summary of this compaction's commit: who, what, where, from which snapshot."""
        tags = {**summary, summary_keys.STARTING_SNAPSHOT: str(self._listing.snapshot.snapshot_id)}
        if len(self._listings) == 1:
            tags[summary_keys.PARTITION] = self._listing.partition_path
        else:
            tags[summary_keys.PARTITIONS] = orjson.dumps([listing.partition_path for listing in self._listings]).decode()
        return tags

    def _what(self, kind: str) -> str:
        paths = ", ".join(listing.partition_path or "(unpartitioned)" for listing in self._listings)
        return f"committing {kind} of {self._table.ref} {paths}"

    def discard(self) -> list[str]:
        """Delete what this rewrite wrote (it did not commit); returns what could not be deleted."""
        return self._table.delete_files(self.written)
