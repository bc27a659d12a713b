"""One Iceberg table through the Java API: its snapshots as plain values, and the commits icecdc
makes to it, each tagged and safe to retry.

Every commit carries a unique ``icecdc.commit-id`` in its summary. That is how a commit finds its
own snapshot when another writer committed right after it, and how a commit whose outcome was
unknown (the catalog failed mid-commit) is recognised on the next attempt instead of being made
twice: before committing again, the attempt looks for its id in the history since the first try.
Catalog calls go through the command's ``CatalogRetry``, so a catalog that does not answer for a
while delays a commit instead of failing it.
"""

from __future__ import annotations

import base64
import functools
import itertools
import logging
import operator
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from icecdc.domain import summary as summary_keys
from icecdc.domain.errors import CatalogUnavailable, CommitStateUnknown, MissingPartitionSpec, PartitionSpecChanged
from icecdc.domain.tableref import TableRef
from icecdc.jvm.bridge import JavaBridge, JavaObject, iterate, java_errors, string_map, translate
from icecdc.runtime.outages import CatalogRetry

log = logging.getLogger(__name__)
T = TypeVar("T")
# Iceberg's TableProperties.MANIFEST_MIN_MERGE_COUNT.
MANIFEST_MIN_MERGE_COUNT = "commit.manifest.min-count-to-merge"


def _canonical(value: Any) -> Any:
    """A value read through Spark in the ingester's canonical form, for the types that hold keys
    and unsent values (integers, text, binary)."""
    return base64.b64encode(bytes(value)).decode() if isinstance(value, (bytes, bytearray)) else value


@dataclass(frozen=True)
class Snapshot:
    snapshot_id: int
    parent_id: int | None
    sequence_number: int
    timestamp_ms: int
    operation: str
    summary: Mapping[str, str]

    @classmethod
    def of(cls, snapshot: JavaObject) -> Snapshot:
        parent = snapshot.parentId()
        return cls(
            int(snapshot.snapshotId()),
            None if parent is None else int(parent),
            int(snapshot.sequenceNumber()),
            int(snapshot.timestampMillis()),
            str(snapshot.operation()),
            string_map(snapshot.summary()),
        )


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


def write_local_files_in_process(bridge: JavaBridge) -> None:
    """Hadoop's local file system (the one a warehouse on a local path goes through), without
    Hadoop's native library (pyspark ships none), forks `chmod` for each file it creates, and
    writes each file's .crc beside it, forking again. An ingest commit writes four metadata
    files. Here the JVM's cached instance (Hadoop caches file systems by scheme) stops writing
    checksums (files are still read and their checksums verified where one exists; writing them
    was a large share of a metadata file's cost) and sets permissions with a system call in
    process (``java/IcecdcLocalFiles.java``)."""
    with java_errors():
        conf = bridge.spark._jsc.hadoopConfiguration()
        bridge.jvm.org.apache.hadoop.fs.FileSystem.getLocal(conf).setWriteChecksum(False)
        if bridge.local_files.install(conf):
            log.info("Hadoop's local file system sets permissions in process (no chmod process a file)")


class IcebergTable:
    """The live ``org.apache.iceberg.Table`` of one table, behind typed methods."""

    def __init__(self, bridge: JavaBridge, ref: TableRef, retry: CatalogRetry | None = None) -> None:
        self.bridge = bridge
        self.ref = ref
        self._retry = retry
        # The Java table, for the adapter's own modules (listing, rewrites, actions) only.
        self._java: JavaObject = self.call(f"loading {ref}", self._load)

    def _load(self) -> JavaObject:
        """The table from the Spark catalog's own Iceberg catalog (its cache included). Asked
        for by name (``lake.db.t``), Spark resolves a catalog that fails to initialize (the
        catalog database locked on first use) as no catalog at all, and the error becomes
        "spark_catalog requires a single-part namespace"; asked for directly, the catalog's
        own error surfaces and is translated (an unavailable catalog is retried)."""
        catalogs = self.bridge.java_spark_session.sessionState().catalogManager()
        plugin = catalogs.catalog(self.ref.catalog)
        identifier = self.bridge.iceberg.catalog.TableIdentifier.parse(self.ref.identifier)
        return plugin.icebergCatalog().loadTable(identifier)

    def call(self, what: str, function: Callable[[], T]) -> T:
        """A call that reaches the catalog or the table's storage: Java errors translated, and
        tried again while the catalog is unavailable (for the adapter's own modules)."""

        def attempt() -> T:
            with java_errors():
                return function()

        return self._retry.call(what, attempt) if self._retry is not None else attempt()

    # ---- reading ----

    def refresh(self) -> None:
        self.call(f"refreshing {self.ref}", self._java.refresh)

    def current_snapshot(self) -> Snapshot | None:
        """The head of the branch icecdc commits to (``ref.branch``) as of the last refresh: main's
        current snapshot, or the staging branch's head (main's current snapshot while the branch
        does not exist yet, which is where its first commit starts from)."""
        with java_errors():
            current = self.java_head()
            return None if current is None else Snapshot.of(current)

    def java_head(self) -> JavaObject | None:
        """The Java snapshot ``current_snapshot`` describes, for the adapter's own modules."""
        return self.bridge.iceberg.util.SnapshotUtil.latestSnapshot(self._java, self.ref.branch)

    def main_snapshot_id(self) -> int | None:
        """Main's current snapshot as of the last refresh: what readers read."""
        with java_errors():
            main = self._java.currentSnapshot()
            return None if main is None else int(main.snapshotId())

    def history(self) -> Iterator[Snapshot]:
        """The current snapshot (as of the last refresh) and its ancestors, newest first."""
        with java_errors():
            for snapshot in self._java_history():
                yield Snapshot.of(snapshot)

    def _java_history(self) -> Iterator[JavaObject]:
        snapshot = self.java_head()
        while snapshot is not None:
            yield snapshot
            parent = snapshot.parentId()
            snapshot = self._java.snapshot(parent) if parent is not None else None

    def summaries_back_to(self, key: str) -> list[dict[str, str]]:
        """Refresh, then the snapshot summaries of the current snapshot and its ancestors, newest
        first, down to the first that has ``key`` (all of them when none has): a batch's offsets
        read in one round trip a table (``IcecdcUpdates.refreshedSummariesBackTo``)."""
        found = self.call(
            f"reading {self.ref}'s snapshot summaries",
            lambda: self.bridge.updates.refreshedSummariesBackTo(self._java, self.ref.branch, key),
        )
        summaries: list[dict[str, str]] = orjson.loads(found)
        return summaries

    def snapshots(self) -> list[Snapshot]:
        """Every snapshot the metadata keeps, ancestors of the current one or not."""
        with java_errors():
            return [Snapshot.of(s) for s in iterate(self._java.snapshots())]

    def snapshot_times_ms(self) -> dict[int, int]:
        """snapshot id -> commit time of every snapshot the metadata keeps (two calls a snapshot:
        a table that commits every few seconds keeps thousands)."""
        with java_errors():
            return {int(s.snapshotId()): int(s.timestampMillis()) for s in iterate(self._java.snapshots())}

    def newest_recovery_snapshots(self) -> dict[str, Snapshot]:
        """writer -> the newest snapshot in the current history carrying that writer's
        exactly-once marker (``summary.recovery_marker``): one walk, one call a snapshot."""
        found: dict[str, Snapshot] = {}
        with java_errors():
            for java in self._java_history():
                # The key set as one string ("[k1, k2]"): summary keys hold no ", ".
                keys = str(java.summary().keySet().toString())[1:-1].split(", ")
                for writer in {w for key in keys if (w := summary_keys.recovery_marker(key)) is not None}:
                    found.setdefault(writer, Snapshot.of(java))
        return found

    def newest_snapshot_with(self, key: str) -> Snapshot | None:
        """The newest snapshot in the current history whose summary has ``key``."""
        with java_errors():
            found = next((s for s in self._java_history() if s.summary().get(key) is not None), None)
            return None if found is None else Snapshot.of(found)

    def key_rows(
        self,
        key_columns: Sequence[str],
        keys: Collection[tuple[Any, ...]],
        columns: Sequence[str],
        snapshot_id: int | None = None,
    ) -> dict[tuple[Any, ...], dict[str, Any]]:
        """key -> the values of ``columns`` (canonical: text as str, binary as base64) of the rows
        of ``keys`` in snapshot ``snapshot_id`` (none of them when the table no longer keeps it),
        or in the current snapshot; there a key it lacks is looked for in the snapshot before the
        last ingest commit, where a row a primary-key change moved away in the previous batch
        still is (the ingester's images of that change died with its restart). A Spark read
        filtered by key, so Iceberg prunes the files whose key bounds exclude them."""
        # The catalog's cached table, the one Spark's read resolves to (the cache may have loaded
        # a new one since this adapter's), refreshed: Spark then knows every snapshot it has.
        self._java = self.call(f"loading {self.ref}", self._load)
        self.refresh()
        if snapshot_id is not None:
            with java_errors():
                kept = self._java.snapshot(snapshot_id) is not None
            return self._rows_at(snapshot_id, key_columns, keys, columns) if kept else {}
        current = self.current_snapshot()
        if current is None:
            return {}
        found = self._rows_at(current.snapshot_id, key_columns, keys, columns)
        missing = [k for k in keys if k not in found]
        last_batch = self.newest_snapshot_with(summary_keys.OFFSETS) if missing else None
        if last_batch is not None and last_batch.parent_id is not None:
            found |= self._rows_at(last_batch.parent_id, key_columns, missing, columns)
        return found

    def _rows_at(
        self, snapshot_id: int, key_columns: Sequence[str], keys: Collection[tuple[Any, ...]], columns: Sequence[str]
    ) -> dict[tuple[Any, ...], dict[str, Any]]:
        from pyspark.sql import functions as F

        if len(key_columns) == 1:
            where = F.col(key_columns[0]).isin([k[0] for k in keys])
        else:
            where = functools.reduce(
                operator.or_,
                (functools.reduce(operator.and_, (F.col(c) == v for c, v in zip(key_columns, k, strict=True))) for k in keys),
            )
        frame = self.bridge.spark.read.format("iceberg").option("snapshot-id", snapshot_id).load(self.ref.qualified)
        rows = self.call(f"reading {len(keys)} keys of {self.ref}", frame.where(where).select(*key_columns, *columns).collect)
        return {tuple(_canonical(row[c]) for c in key_columns): {c: _canonical(row[c]) for c in columns} for row in rows}

    def move_main(self, expected: int | None, target: int) -> bool:
        """Main moved to snapshot ``target`` if it is still at ``expected`` (None: no snapshot),
        in one compare-and-set metadata commit (``IcecdcUpdates.moveMain``); False when it had
        moved or other commits kept landing meanwhile."""
        expected_id = -1 if expected is None else expected
        moved = self.call(
            f"moving main of {self.ref} to snapshot {target}",
            lambda: self.bridge.updates.moveMain(self._java, expected_id, target),
        )
        return bool(moved)

    def unpartitioned_spec_id(self) -> int | None:
        """The id of a partition spec of the table without fields (as of the last refresh)."""
        with java_errors():
            found = [int(spec.specId()) for spec in self._java.specs().values() if spec.isUnpartitioned()]
            return min(found) if found else None

    def ensure_unpartitioned_spec(self) -> int:
        """A spec without fields among the table's specs, added in one metadata commit if missing,
        the default spec unchanged (``UpdatePartitionSpec.addNonDefaultSpec``). Equality deletes
        registered under it apply to every partition (Iceberg's global deletes); registered under
        spec 0 of a table whose spec 0 is partitioned they would silently apply to nothing
        (apache/iceberg#14678). Idempotent: Iceberg reuses an equal spec's id."""
        self.refresh()
        existing = self.unpartitioned_spec_id()
        if existing is not None:
            return existing

        def add() -> None:
            update = self._java.updateSpec()
            for field in iterate(self._java.spec().fields()):
                update = update.removeField(field.name())
            update.addNonDefaultSpec().commit()

        self.call(f"adding an unpartitioned spec to {self.ref} for its global deletes", add)
        self.refresh()
        added = self.unpartitioned_spec_id()
        if added is None:
            raise RuntimeError(f"{self.ref} has no unpartitioned spec after adding one")
        log.info("%s: added unpartitioned partition spec %d for global equality deletes", self.ref, added)
        return added

    def column_types(self) -> dict[str, str]:
        """Top-level column -> Iceberg type, as of the last refresh."""
        with java_errors():
            return {str(f.name()): str(f.type()) for f in iterate(self._java.schema().columns())}

    def add_column(self, name: str, iceberg_type: str) -> bool:
        """Add an optional column, in one metadata commit; False when it is already there."""
        self.refresh()
        if name in self.column_types():
            return False
        types = self.bridge.iceberg.types.Types

        def add() -> None:
            self._java.updateSchema().addColumn(name, types.fromPrimitiveString(iceberg_type)).commit()

        self.call(f"adding column {name} {iceberg_type} to {self.ref}", add)
        return True

    def widen_column(self, name: str, iceberg_type: str) -> bool:
        """Change a column to a wider type Iceberg allows, in one metadata commit; False when it
        already has that type."""
        self.refresh()
        if self.column_types().get(name) == iceberg_type:
            return False
        types = self.bridge.iceberg.types.Types

        def widen() -> None:
            self._java.updateSchema().updateColumn(name, types.fromPrimitiveString(iceberg_type).asPrimitiveType()).commit()

        self.call(f"widening column {name} of {self.ref} to {iceberg_type}", widen)
        return True

    def properties(self) -> dict[str, str]:
        with java_errors():
            return string_map(self._java.properties())

    def delete_files(self, paths: Sequence[str]) -> list[str]:
        """Delete files this process wrote and nothing references; returns the ones it could
        not delete (left for orphan-file removal)."""
        left = []
        io = self._java.io()
        for path in paths:
            try:
                io.deleteFile(path)
            except Exception:  # noqa: BLE001 - orphan-file removal takes what is left
                left.append(path)
        return left

    # ---- committing ----

    def commit(
        self,
        what: str,
        build: Callable[[JavaObject], JavaObject],
        summary: Mapping[str, str],
        *,
        merge_manifests: bool = False,
    ) -> CommittedSnapshot:
        """Commit the snapshot-producing update ``build`` makes from the table (or transaction) it
        is given (a fresh one per attempt: a failed Iceberg update cannot be committed again),
        tagged with ``summary`` and a commit id. For the adapter's own modules; callers use the
        commit kinds (``commit_files`` here, ``rewrites.PartitionRewrite.commit``).

        ``merge_manifests``: the commit also merges the table's small manifests, data and delete
        ones alike, into one of each (see ``_manifest_merging``)."""
        commit_id = uuid.uuid4().hex
        tags = {**summary, summary_keys.COMMIT_ID: commit_id}
        first_before: list[int] = []  # the current snapshot's id (-1: none) as the first attempt began

        def attempt() -> CommittedSnapshot:
            before = int(self.bridge.updates.refreshedSnapshotId(self._java, self.ref.branch))
            if first_before:
                # An earlier attempt ended without an answer: it may have landed.
                landed = self._find(commit_id, stop_at=first_before[0])
                if landed is not None:
                    log.info("commit %s to %s had landed before the catalog failed", commit_id, self.ref)
                    return landed
            else:
                first_before.append(before)
            transaction, kept = self._manifest_merging() if merge_manifests else (None, None)
            update = self.bridge.updates.tagged(build(transaction or self._java), self.ref.branch, orjson.dumps(tags).decode())
            try:
                update.commit()  # in a transaction: staged in it, committed with it
                if transaction is not None:
                    self._commit_restoring(transaction, kept)
            except Exception as error:
                kind = translate(error)
                if isinstance(kind, CommitStateUnknown):
                    # Worth another attempt, which looks for this commit before making it again.
                    raise CatalogUnavailable(str(kind), kind.java_class) from None
                raise
            landed = self._find(commit_id, stop_at=before)
            if landed is None:
                raise RuntimeError(f"commit {commit_id} is not in the history of {self.ref}")
            return landed

        return self.call(what, attempt)

    def _manifest_merging(self) -> tuple[JavaObject, str | None]:
        """A transaction whose snapshot update merges the table's manifests as it commits: Iceberg
        merges a commit's new manifest with the small ones of its bin only once the bin holds
        ``commit.manifest.min-count-to-merge`` of them (8 on the tables icecdc creates, for the
        writer's sake: merging on every commit slows its batches, docs/BENCHMARKS.md, row
        "Manifest merging on the writer"), and that count is read from the table's
        properties when the update is made. So the transaction sets it to 2 before making the
        update and puts the table's own value back before committing (``_commit_restoring``): the
        committed metadata never shows 2, the writer keeps its cheap commits, and the sidecar's
        commits, one every batch or so on a hot table, bring the writer's manifests back to one
        data and one delete manifest a bin. Iceberg's own ``RewriteManifests`` cannot do this: it
        leaves delete manifests alone. What it does not guard against: a user changing the
        property while such a commit is retried has the change undone by it. Returns the
        transaction and the table's own value (None: not set)."""
        transaction = self._java.newTransaction()
        kept = transaction.table().properties().get(MANIFEST_MIN_MERGE_COUNT)
        transaction.updateProperties().set(MANIFEST_MIN_MERGE_COUNT, "2").commit()
        return transaction, None if kept is None else str(kept)

    @staticmethod
    def _commit_restoring(transaction: JavaObject, kept: str | None) -> None:
        """Put the table's own min-count-to-merge, ``kept``, back in ``transaction`` and commit it."""
        restore = transaction.updateProperties()
        (restore.set(MANIFEST_MIN_MERGE_COUNT, kept) if kept is not None else restore.remove(MANIFEST_MIN_MERGE_COUNT)).commit()
        transaction.commitTransaction()

    def _find(self, commit_id: str, stop_at: int) -> CommittedSnapshot | None:
        """Our snapshot in the history (as of the last refresh) since snapshot ``stop_at`` (-1:
        the whole history), with how many others landed after it started."""
        found = self.bridge.updates.findTagged(self._java, self.ref.branch, summary_keys.COMMIT_ID, commit_id, stop_at)
        if found is None:
            return None
        snapshot_id, parent, sequence_number, timestamp_ms, operation, interleaved = str(found).split(",")
        return CommittedSnapshot(
            int(snapshot_id),
            None if parent == "-1" else int(parent),
            int(sequence_number),
            int(timestamp_ms),
            operation,
            int(interleaved),
        )

    def _written_in_current_spec(self, data: Sequence[str]) -> None:
        """Raises ``PartitionSpecChanged`` when a data file (content-file JSON) names a spec other
        than the table's current one, as of the attempt's refresh."""
        current = int(self._java.spec().specId())
        written = {int(orjson.loads(description)["spec-id"]) for description in data} - {current}
        if written:
            raise PartitionSpecChanged(str(self.ref), min(written), current)

    def _content_files(self, *groups: Sequence[str]) -> list[str]:
        """Each group of content-file JSON descriptions as one JSON array, for ``IcecdcUpdates`` to
        parse in the JVM, each file under the partition spec it names (as of the last refresh;
        the table's specs are asked for once for all groups). Raises ``MissingPartitionSpec``
        when a named spec is gone."""
        known = {int(spec_id) for spec_id in str(self.bridge.updates.specIds(self._java)).split(",")}
        for description in itertools.chain.from_iterable(groups):
            spec_id = int(orjson.loads(description)["spec-id"])
            if spec_id not in known:
                raise MissingPartitionSpec(spec_id, str(self.ref))
        return [f"[{','.join(group)}]" for group in groups]

    def commit_files(
        self, what: str, data: Sequence[str], deletes: Sequence[str], summary: Mapping[str, str]
    ) -> CommittedSnapshot:
        """The ingester's commit: one ``RowDelta`` adding data and equality-delete files, each
        given as Iceberg's content-file JSON (made where it was written, so no footer is read
        again; it names its partition spec), validating nothing, as Flink's writer does: a
        concurrent compaction carries older sequence numbers, so these deletes still apply to
        what it rewrote, and Iceberg's own retry re-applies the delta on top of whatever
        committed meanwhile. Raises ``MissingPartitionSpec`` when a file's spec is gone, and
        ``PartitionSpecChanged`` when the data files' spec is no longer the table's current one."""

        def build(_: JavaObject) -> JavaObject:
            self._written_in_current_spec(data)
            # A batch's delta writes a manifest or two: its steps run on the committing thread,
            # not the shared pool (``caller_thread_executor`` says why).
            executor = self.bridge.caller_thread_executor
            data_files, delete_files = self._content_files(data, deletes)
            return self.bridge.updates.rowDelta(self._java, executor, data_files, delete_files)

        return self.commit(what, build, summary)

    def commit_truncate(self, what: str, data: Sequence[str], summary: Mapping[str, str]) -> CommittedSnapshot:
        """A truncate and what the batch wrote after it, in one commit: an ``OverwriteFiles``
        that removes every data and delete file of the table (a row filter that matches all) and
        adds the batch's data files, given as content-file JSON. Raises ``MissingPartitionSpec``
        when a file's spec is gone, and ``PartitionSpecChanged`` as ``commit_files`` does."""

        def build(_: JavaObject) -> JavaObject:
            self._written_in_current_spec(data)
            (data_files,) = self._content_files(data)
            return self.bridge.updates.overwriteAll(self._java, self.bridge.caller_thread_executor, data_files)

        return self.commit(what, build, summary)
