"""The events icecdc publishes on Kafka: the commit event (the ingester, after every Iceberg
commit; the compactor consumes it) and the compaction event (a compactor replica, for each
compaction it attempts, when it starts and when it ends) and the maintenance event (the replica that
maintains a table, likewise). schemas/ holds their contracts."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from icecdc.schemas import COMMIT_EVENT, COMPACTION_EVENT, MAINTENANCE_EVENT, validator

EVENT_VERSION = 1


def _encode(event: Any, schema: str) -> bytes:
    """JSON for an event dataclass, checked against its schema: nothing malformed is published."""
    document = asdict(event)
    validator(schema)(document)
    return orjson.dumps(document)


def _decode(data: bytes, schema: str) -> dict[str, Any]:
    document = orjson.loads(data)
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
    version: int = EVENT_VERSION

    def to_json(self) -> bytes:
        return _encode(self, COMMIT_EVENT)

    @classmethod
    def from_json(cls, data: bytes) -> CommitEvent:
        document = _decode(data, COMMIT_EVENT)
        partitions = [PartitionDelta(**p) for p in document.pop("partitions")]
        return cls(**document, partitions=partitions)


@dataclass(frozen=True)
class CompactionEvent:
    """What a compactor replica did to one partition (schemas/compaction-event.schema.json)."""

    table: str
    partition: dict[str, Any]
    partition_path: str
    kind: str
    outcome: str
    replica: str
    starting_snapshot_id: int | None
    started_ms: int
    finished_ms: int
    reason: str | None = None
    attempt: int = 1
    starting_sequence_number: int | None = None
    snapshot_id: int | None = None
    sequence_number: int | None = None
    data_files_rewritten: int = 0
    data_files_added: int = 0
    bytes_rewritten: int = 0
    bytes_added: int = 0
    delete_files_removed: int = 0
    position_delete_files_added: int = 0
    version: int = EVENT_VERSION

    def to_json(self) -> bytes:
        return _encode(self, COMPACTION_EVENT)

    @classmethod
    def from_json(cls, data: bytes) -> CompactionEvent:
        return cls(**_decode(data, COMPACTION_EVENT))


@dataclass(frozen=True)
class MaintenanceEvent:
    """One maintenance run on one table (schemas/maintenance-event.schema.json)."""

    table: str
    kind: str
    outcome: str
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

    def to_json(self) -> bytes:
        return _encode(self, MAINTENANCE_EVENT)

    @classmethod
    def from_json(cls, data: bytes) -> MaintenanceEvent:
        return cls(**_decode(data, MAINTENANCE_EVENT))
