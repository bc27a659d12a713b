"""The events icecdc publishes on Kafka: the commit event (the ingester, after every Iceberg
commit; the compactor consumes it) and the compaction event (a compactor replica, for each
compaction it attempts, when it starts and when it ends) and the maintenance event (the replica that
maintains a table, likewise). schemas/ holds their contracts."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Protocol

import orjson

from icecdc.schemas import COMMIT_EVENT, COMPACTION_EVENT, MAINTENANCE_EVENT, validator

EVENT_VERSION = 1

# A commit event larger than this lists no partitions, only how many it left out; consumers then
# read the table's metadata instead. A batch that touches ~10,000 partitions makes a 2 MB event,
# over Kafka's default 1 MB message.max.bytes (broker and librdkafka alike): the event could not be
# published after its commit, and the ingester stopped. Half the default leaves room for headers and
# for brokers configured a little lower, and costs nothing: such a commit is rare and a metadata read
# of its table is what the compactor does on every reconcile anyway.
COMMIT_EVENT_MAX_BYTES = 512 * 1024


class CompactionKind(str, enum.Enum):
    """What a compaction does (the compactor's ``Work``)."""

    MINOR = "minor"  # bin-pack small files (their deletes applied), new files at the starting sequence number
    DELETE_MERGE = "delete-merge"  # apply every delete: rewrite small and medium files, convert large ones
    CONVERT = "equality-to-position"  # equality deletes become position deletes; no data rewritten
    REMOVE_DANGLING_DELETES = "remove-dangling-deletes"
    # Global equality deletes (keys whose old partition was unknown) become position deletes on
    # the files they hit, in every partition, and are removed; no data rewritten.
    RESOLVE_GLOBAL_DELETES = "resolve-global-deletes"
    # A settled partition of an older partition spec: every live data file rewritten into the
    # current spec, its deletes applied, and every delete file of the partition removed.
    REWRITE_OLDER_SPEC = "rewrite-older-spec"


class CompactionOutcome(str, enum.Enum):
    """How a compaction attempt ended (``started`` is published when it begins)."""

    STARTED = "started"
    COMMITTED = "committed"
    CONFLICT = "conflict"  # lost to a concurrent change of its files, or every compare-and-set
    FENCED = "fenced"  # the partition's lease moved to another replica before it committed
    FAILED = "failed"  # any other error; retried with backoff
    SKIPPED = "skipped"  # nothing to rewrite at the starting snapshot
    ABANDONED = "abandoned"  # failed max_attempts times: given up until the partition is written again


class MaintenanceKind(str, enum.Enum):
    EXPIRE = "expire-snapshots"
    ORPHANS = "remove-orphans"
    MANIFESTS = "rewrite-manifests"

    @property
    def commits(self) -> bool:
        """Whether a run commits to the table. One that does not (orphan removal: it spares every
        file younger than ``orphan_age_seconds``, at least an hour, so the files of a batch or a
        compaction in flight) holds no compaction back and waits for no quiet window; the sidecar
        runs it beside its loop (docs/coordinator.md, "Maintenance")."""
        return self is not MaintenanceKind.ORPHANS


class MaintenanceOutcome(str, enum.Enum):
    STARTED = "started"
    COMMITTED = "committed"
    NOTHING_TO_DO = "nothing-to-do"
    FAILED = "failed"


def _encode(event: Any, schema: str) -> bytes:
    """JSON for an event dataclass, checked against its schema: nothing malformed is published."""
    document = asdict(event)
    validator(schema)(document)
    return orjson.dumps(document)


def _decode(data: bytes, schema: str) -> dict[str, Any]:
    document: dict[str, Any] = orjson.loads(data)
    validator(schema)(document)
    return document


@dataclass(frozen=True)
class PartitionDelta:
    partition: dict[str, Any]
    partition_path: str
    spec_id: int
    data_files: int = 0
    data_bytes: int = 0
    data_records: int = 0
    equality_delete_files: int = 0
    equality_delete_records: int = 0


@dataclass(frozen=True)
class CommitEvent:
    table: str
    snapshot_id: int
    parent_snapshot_id: int | None
    sequence_number: int
    commit_time_ms: int
    operation: str
    writer: str
    batch_id: str | None
    source_offsets: dict[str, dict[str, int]]
    partitions: list[PartitionDelta] = field(default_factory=list)
    # Equality deletes of keys whose old partition was unknown: they apply to every partition.
    global_delete_files: int = 0
    global_delete_records: int = 0
    # The commit emptied the table first (a truncate in the source): its earlier files are gone.
    truncated: bool = False
    # Source fields the table has no column for, with how many of the batch's records had them.
    unknown_columns: dict[str, int] = field(default_factory=dict)
    # Partitions the commit touched that ``partitions`` does not list (see COMMIT_EVENT_MAX_BYTES).
    partitions_omitted: int = 0
    version: int = EVENT_VERSION

    def to_json(self, max_bytes: int = COMMIT_EVENT_MAX_BYTES) -> bytes:
        encoded = _encode(self, COMMIT_EVENT)
        if len(encoded) <= max_bytes or not self.partitions:
            return encoded
        return _encode(
            replace(self, partitions=[], partitions_omitted=self.partitions_omitted + len(self.partitions)), COMMIT_EVENT
        )

    @classmethod
    def from_json(cls, data: bytes) -> CommitEvent:
        document = _decode(data, COMMIT_EVENT)
        partitions = [PartitionDelta(**p) for p in document.pop("partitions")]
        return cls(**document, partitions=partitions)


@dataclass(frozen=True)
class CompactionCounts:
    """What one compaction did to one partition: the snapshot it started from, the one it
    committed (None: it committed nothing), and the files and bytes it rewrote and wrote. The
    compactor's result carries it, its metrics count it, and its event's fields are these."""

    starting_snapshot_id: int | None = None
    starting_sequence_number: int | None = None
    snapshot_id: int | None = None
    sequence_number: int | None = None
    data_files_rewritten: int = 0
    data_files_added: int = 0
    bytes_rewritten: int = 0
    bytes_added: int = 0
    delete_files_removed: int = 0
    position_delete_files_added: int = 0


# The event's own fields follow the counts' (every one with a default), so they are keyword-only;
# the JSON is flat, one key a field, as the schema has it.
@dataclass(frozen=True, kw_only=True)
class CompactionEvent(CompactionCounts):
    """What a compactor replica did to one partition (schemas/compaction-event.schema.json)."""

    table: str
    partition: dict[str, Any]
    partition_path: str
    kind: CompactionKind
    outcome: CompactionOutcome
    replica: str
    started_ms: int
    finished_ms: int
    reason: str | None = None
    attempt: int = 1
    # The table's portability as the replica knew it when it made the event (after re-reading
    # the table, for an attempt's end): its oldest live equality-delete file's age (0: none), and
    # whether none is live (readers that cannot apply equality deletes can read it).
    oldest_equality_delete_age_seconds: float | None = None
    portable: bool | None = None
    version: int = EVENT_VERSION

    @classmethod
    def from_result(
        cls,
        *,
        table: str,
        partition: Mapping[str, Any],
        partition_path: str,
        kind: CompactionKind,
        outcome: CompactionOutcome,
        replica: str,
        reason: str | None,
        attempt: int,
        started: float,
        finished: float,
        counts: CompactionCounts | None,
        oldest_equality_delete_age_seconds: float | None = None,
        portable: bool | None = None,
    ) -> CompactionEvent:
        """The event of an attempt that started at ``started`` and ended (or, for ``started``,
        began) at ``finished`` (epoch seconds), with its counts when it has any."""
        counts = counts or CompactionCounts()
        return cls(
            **{f.name: getattr(counts, f.name) for f in fields(CompactionCounts)},
            table=table,
            partition=dict(partition),
            partition_path=partition_path,
            kind=kind,
            outcome=outcome,
            replica=replica,
            reason=reason,
            attempt=attempt,
            started_ms=int(started * 1000),
            finished_ms=int(finished * 1000),
            oldest_equality_delete_age_seconds=oldest_equality_delete_age_seconds,
            portable=portable,
        )

    def to_json(self) -> bytes:
        return _encode(self, COMPACTION_EVENT)

    @classmethod
    def from_json(cls, data: bytes) -> CompactionEvent:
        document = _decode(data, COMPACTION_EVENT)
        return cls(**{**document, "kind": CompactionKind(document["kind"]), "outcome": CompactionOutcome(document["outcome"])})


class MaintenanceCounts(Protocol):
    """What a maintenance run's result tells its event (the coordinator's ``MaintenanceResult``)."""

    @property
    def cutoff_ms(self) -> int | None: ...
    @property
    def protected_snapshot_ids(self) -> tuple[int, ...]: ...
    @property
    def snapshots_expired(self) -> int: ...
    @property
    def files_deleted(self) -> int: ...
    @property
    def manifests_rewritten(self) -> int: ...
    @property
    def manifests_added(self) -> int: ...


@dataclass(frozen=True)
class MaintenanceEvent:
    """One maintenance run on one table (schemas/maintenance-event.schema.json)."""

    table: str
    kind: MaintenanceKind
    outcome: MaintenanceOutcome
    replica: str
    started_ms: int
    finished_ms: int
    reason: str | None = None
    cutoff_ms: int | None = None
    protected_snapshot_ids: list[int] = field(default_factory=list)
    snapshots_expired: int = 0
    files_deleted: int = 0
    manifests_rewritten: int = 0
    manifests_added: int = 0
    version: int = EVENT_VERSION

    @classmethod
    def from_result(
        cls,
        *,
        table: str,
        kind: MaintenanceKind,
        outcome: MaintenanceOutcome,
        replica: str,
        started_ms: int,
        finished_ms: int,
        reason: str | None = None,
        result: MaintenanceCounts | None = None,
    ) -> MaintenanceEvent:
        if result is None:
            return cls(table, kind, outcome, replica, started_ms, finished_ms, reason)
        return cls(
            table,
            kind,
            outcome,
            replica,
            started_ms,
            finished_ms,
            reason,
            cutoff_ms=result.cutoff_ms,
            protected_snapshot_ids=list(result.protected_snapshot_ids),
            snapshots_expired=result.snapshots_expired,
            files_deleted=result.files_deleted,
            manifests_rewritten=result.manifests_rewritten,
            manifests_added=result.manifests_added,
        )

    def to_json(self) -> bytes:
        return _encode(self, MAINTENANCE_EVENT)

    @classmethod
    def from_json(cls, data: bytes) -> MaintenanceEvent:
        document = _decode(data, MAINTENANCE_EVENT)
        return cls(**{**document, "kind": MaintenanceKind(document["kind"]), "outcome": MaintenanceOutcome(document["outcome"])})
